"""``streamwhiten run job.toml``: fit or update, finalize, apply; each step skipped when up to date.

This is the run of a job without a ``[publish]`` table: every output is rewritten whenever the model
changes. A job with one publishes its outputs in versions and appends each night's rows
(:mod:`streamwhiten.job.publish`).

A run that was killed is finished first (from its checkpoint: it is self-contained, so it is finished as
planned, whatever inputs appeared since; those are picked up by the update that follows). Two runs of
jobs keeping the same model never overlap (:func:`job_lock`). Progress is reported through the
``streamwhiten`` logger; the command line decides where it goes.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace

from .._durable import exclusive_lock
from ..errors import BadInputError, NothingToDoError
from ..options import FitOptions
from .file import JobFile, output_for, read_job_file

log = logging.getLogger("streamwhiten")


def job_lock(path: str):
    """Hold the job's exclusive lock on ``path`` (released by the OS even if the process is killed; the
    file is removed when the run ends); a second run of the job exits with :class:`LockedError` (75).
    The same lock as an apply output's (``_durable.exclusive_lock``)."""
    return exclusive_lock(
        path,
        lambda holder: f"{path}: another run of this job is in progress (pid {holder}); not starting a second one",
        remove=True,
    )


def run_job_file(
    path: str, progress=None, should_stop=None, restart: bool = False, storage_options=None, republish: bool = False
) -> dict:
    """Run the job file ``path`` (see :func:`run_job`); ``storage_options`` (the command line's) are used
    over its ``[storage]`` table."""
    return run_job(read_job_file(path, storage_options), progress, should_stop, restart, republish)


def run_job(job: JobFile, progress=None, should_stop=None, restart: bool = False, republish: bool = False) -> dict:
    """Run a job: fit or update, finalize, apply; each step skipped when already up to date.

    A run that was killed is finished first (from its checkpoint); ``restart`` discards it instead. A
    job with a ``[publish]`` table publishes its outputs in versions instead of rewriting them
    (:func:`streamwhiten.job.publish.run_published`; ``republish`` publishes a new version whatever the
    staleness). Returns a summary with ``steps`` (what ran), ``rows_added`` (to the statistics),
    ``outputs``, ``bytes_written`` (by this run, outputs only) and ``seconds``. Raises
    :class:`NothingToDoError` when nothing ran (its ``summary`` is the report).
    """
    if job.publish is not None:
        from .publish import run_published

        return run_published(job, progress, should_stop, restart, republish)
    if republish:
        raise BadInputError(f"{job.path}: --republish needs a [publish] table in the job file (versioned outputs)")
    began = time.perf_counter()
    os.makedirs(os.path.dirname(job.model_path), exist_ok=True)
    steps: list[str] = []
    written: list[str] = []
    with job_lock(job.lock_path):
        log.info("job %s: lock %s taken", job.name, job.lock_path)
        inputs, outputs = _inputs_and_outputs(job)
        _check_paths(job, inputs, outputs)
        before = model_rows(job.model_path)
        model = _fit_step(job, inputs, steps, progress, should_stop, restart)
        for input_spec, output in outputs.items():
            if _apply_step(job, model, input_spec, output, steps, progress, should_stop):
                written.append(output)
    from .publish import stored_bytes

    summary = {
        "job": job.name,
        "model": job.model_path,
        "steps": steps,
        "rows_added": int(model.n_rows - before),
        "outputs": list(outputs.values()),
        "bytes_written": sum(stored_bytes(output, job.apply_read) for output in written),
        "seconds": time.perf_counter() - began,
    }
    if not steps:
        error = NothingToDoError(f"nothing to do: job {job.name} is up to date")
        error.summary = summary  # type: ignore[attr-defined]
        raise error
    return summary


def model_rows(model_path: str) -> int:
    """The rows of the statistics in ``model_path`` now (0 when there is none yet)."""
    from ..core.model import load_model

    return load_model(model_path).n_rows if os.path.exists(model_path) else 0


def _inputs_and_outputs(job: JobFile) -> tuple[list, dict]:
    """The job's inputs (globs expanded) and the output of each, refusing two inputs in one output."""
    from ..io import expand_specs, remote, split_spec

    inputs = expand_specs(list(job.inputs), job.read)
    outputs: dict = {}
    if job.apply is None or job.output is None:
        return inputs, outputs
    used: dict = {}
    for input_spec in inputs:
        output = output_for(job.output, input_spec, job.name, job.path)
        store = split_spec(output)[0]  # each output is a whole file or store
        store = remote.normalize(store) if remote.is_url(store) else os.path.realpath(store)
        if store in used:
            raise BadInputError(
                f"{job.path}: [apply] output '{job.output}' puts two inputs in "
                f"{store}; each input needs its own file or store (e.g. 'out/{{stem}}.zarr')"
            )
        used[store] = input_spec
        outputs[input_spec] = output
    return inputs, outputs


def _check_paths(job: JobFile, inputs: list, outputs: dict) -> None:
    """Refuse a model, checkpoint, lock or output over an input or over each other, before any work."""
    from ..io import refuse_input_overlap, refuse_shared_outputs

    written = {
        job.model_path: "model file",
        job.checkpoint: "checkpoint",
        job.lock_path: "lock file",
        **{output: "[apply] output" for output in outputs.values()},
    }
    refuse_input_overlap(written, [job.path, *inputs])
    refuse_shared_outputs(*((path, what) for path, what in written.items()))


def _fit_step(job: JobFile, inputs: list, steps: list, progress, should_stop, restart: bool):
    """Finish an interrupted run, then fit (no model yet) or update; re-finalize when only the job's
    setting changed. Returns the model to apply."""
    from ..core.model import file_checksum, load_model, save_model
    from ..engine.fit import remove_checkpoint
    from ..pipeline import fit

    if restart:
        remove_checkpoint(job.checkpoint)
    elif os.path.exists(job.checkpoint) and _finish_pending(job, inputs, progress, should_stop):
        steps.append("resume")
    exists = os.path.exists(job.model_path)
    params = job.setting.given()
    try:
        outcome = fit(
            inputs,
            job.model_path,
            setting=job.setting,
            options=replace(job.fit, overwrite=True),
            read=job.read,
            engine=job.fit_engine,
            update=job.model_path if exists else None,
            progress=progress,
            should_stop=should_stop,
        )
    except NothingToDoError:
        model = load_model(job.model_path)
        log.info("job %s: model %s is up to date with its inputs", job.name, job.model_path)
        wanted = model.with_params(**params) if params else model
        if file_checksum(wanted) != file_checksum(model):
            save_model(wanted, job.model_path)
            steps.append("finalize")
            log.info("job %s: re-finalized %s with the job's parameters", job.name, job.model_path)
        return wanted
    steps.append("update" if exists else "fit")
    log.info(
        "job %s: %s %s with %s rows",
        job.name,
        "updated" if exists else "fitted",
        job.model_path,
        f"{outcome.rows_read:,}",
    )
    return outcome.model


def _finish_pending(job: JobFile, inputs: list, progress, should_stop) -> bool:
    """Complete a fit or update a killed run left in the job's checkpoint and save the model; True if it
    did. A checkpoint that does not belong to the current model (or whose sources changed) is discarded."""
    from ..core.model import load_model
    from ..engine.engines import SerialEngine
    from ..engine.fit import PassOptions, check_resumable, finalize_fit, load_checkpoint, remove_checkpoint
    from ..errors import ModelFileError
    from ..pipeline import effective_params, save_fitted

    checkpoint = job.checkpoint
    try:
        plan = load_checkpoint(checkpoint, job.read)
    except ModelFileError as exc:
        raise BadInputError(f"{exc}") from None  # the message says how to start over (run --restart)
    previous = load_model(job.model_path) if os.path.exists(job.model_path) else None
    model_rows = previous.n_rows if previous is not None else 0
    if plan.done and plan.state.n_rows == model_rows and plan.base_rows != model_rows:
        # killed after saving the model, before removing the checkpoint: the model already holds it
        remove_checkpoint(checkpoint)
        return False
    options = PassOptions(job.fit.precision, bool(job.fit.skip_nonfinite), job.read.fill_missing_chunks)
    try:
        check_resumable(plan, checkpoint, options, model_rows, inputs, exact=False)
    except BadInputError as exc:
        log.warning("job %s: discarding checkpoint %s: %s", job.name, checkpoint, exc)
        remove_checkpoint(checkpoint)
        return False
    log.info(
        "job %s: finishing the interrupted run in %s (%s of %s rows done)",
        job.name,
        checkpoint,
        f"{plan.rows_done:,}",
        f"{plan.rows_total:,}",
    )
    fit: FitOptions = job.fit
    result = SerialEngine(job.fit_engine.threads).fit(
        plan,
        progress=progress,
        should_stop=should_stop,
        checkpoint=(checkpoint, fit.checkpoint_every, fit.checkpoint_seconds),
    )
    skipped = int(previous.info.get("n_skipped_nonfinite", 0)) if previous is not None and plan.base_rows else 0
    model = finalize_fit(result, effective_params(job.setting.given(), previous), skipped)
    if previous is not None and previous.storage is not None:  # an update keeps the recorded storage
        from dataclasses import replace

        model = replace(model, storage=previous.storage)
    save_fitted(model, plan, job.model_path, checkpoint, should_stop)
    return True


def _apply_step(job: JobFile, model, input_spec: str, output: str, steps: list, progress, should_stop) -> bool:
    """Apply ``model`` to one input, unless its output is already what this would write; True if it wrote."""
    from ..core.model import map_checksum
    from ..engine.apply import output_is_current, output_quantization, recorded_options
    from ..io import fingerprint, open_output, open_source, remote, split_spec
    from ..pipeline import apply, output_dtype

    options, read = job.apply, job.apply_read
    assert options is not None
    with open_source(input_spec, read=read) as source:
        source_sha = fingerprint(source).sha256_sampled
        assert source_sha is not None  # fingerprint() hashes the sampled rows
        label = source.label
    recorded = recorded_options(
        output, options.skip_nonfinite, read.fill_missing_chunks, options.zarr_format, options.compressor
    )
    keep = list(options.keep_columns)
    checksum = map_checksum(model)
    dtype = options.dtype or output_dtype(model)
    quantization = output_quantization(model, dtype)
    normalize = options.normalize or quantization is not None  # codes and bits are of unit vectors
    current = output_is_current(
        output, checksum, source_sha, normalize, dtype, recorded, keep, read=read, quantization=quantization
    )
    if current:
        log.info("job %s: %s is up to date", job.name, output)
        open_output(output, read).tidy()  # a run killed right after writing it may have left its records
        return False
    if not remote.is_url(output):
        os.makedirs(os.path.dirname(os.path.abspath(split_spec(output)[0])), exist_ok=True)
    outcome = apply(
        model,
        input_spec,
        output,
        options=options,
        read=read,
        engine=job.apply_engine,
        progress=progress,
        should_stop=should_stop,
    )
    steps.append(f"apply {label} -> {output}")
    resumed = f", resumed at row {outcome.resumed_at_row:,}" if outcome.resumed_at_row else ""
    log.info("job %s: wrote %s (%s rows%s)", job.name, outcome.output, f"{outcome.n_rows:,}", resumed)
    return True


__all__ = ["job_lock", "run_job", "run_job_file"]
