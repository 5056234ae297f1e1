"""The steps every run of a job shares, versioned or not: its lock, its inputs and outputs, and the
fit step that updates the statistics (finishing a killed run first); and the bytes an output takes.

:mod:`streamwhiten.job.run` (a job that rewrites its outputs) and :mod:`streamwhiten.job.publish` (a job
that publishes them in versions) both build on these; neither imports the other's internals.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace

from .._durable import exclusive_lock
from ..errors import BadInputError, NothingToDoError
from ..options import FitOptions, ReadOptions
from .file import JobFile, output_for

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


@dataclass(frozen=True)
class Before:
    """What the statistics file held before the fit step of a run: its rows and its source records."""

    n_rows: int
    sources: tuple


def statistics_before(model_path: str) -> Before | None:
    """The rows and source records of the statistics in ``model_path`` now, before the fit step (None
    when there is none yet, or none that can be read). Read without the checks of ``load_model``: the
    fit step loads the same file with every check, under the job's lock, before anything of this is
    used (a damaged file stops the run there)."""
    from ..core.model import read_rows_and_sources

    found = read_rows_and_sources(model_path)
    return Before(*found) if found is not None else None


def model_rows(model_path: str) -> int:
    """The rows of the statistics in ``model_path`` now (0 when there is none yet, or none it can read)."""
    before = statistics_before(model_path)
    return before.n_rows if before is not None else 0


def inputs_and_outputs(job: JobFile) -> tuple[list, dict]:
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


def fit_step(job: JobFile, inputs: list, steps: list, progress, should_stop, restart: bool):
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
    from ..engine.engines import Checkpoint, SerialEngine
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
        checkpoint=Checkpoint(checkpoint, fit.checkpoint_every, fit.checkpoint_seconds),
    )
    skipped = int(previous.info.get("n_skipped_nonfinite", 0)) if previous is not None and plan.base_rows else 0
    model = finalize_fit(result, effective_params(job.setting.given(), previous), skipped)
    if previous is not None and previous.storage is not None:  # an update keeps the recorded storage
        from dataclasses import replace

        model = replace(model, storage=previous.storage)
    save_fitted(model, plan, job.model_path, checkpoint, should_stop)
    return True


def stored_bytes(spec: str, read: ReadOptions | None = None) -> int:
    """The bytes an output takes in storage (a file, or every file of a directory or object prefix)."""
    from ..io import remote, split_spec

    path = split_spec(spec)[0]
    if remote.is_url(path):
        try:
            found = remote.find(path, detail=True, read=read if read is not None else ReadOptions())
        except Exception:  # noqa: BLE001 - a report figure, never a reason to fail
            return 0
        return int(sum(int(item.get("size") or 0) for item in found.values()))
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(directory, name))
            except OSError:
                pass
    return total


__all__ = ["Before", "fit_step", "inputs_and_outputs", "job_lock", "model_rows", "statistics_before", "stored_bytes"]
