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

from ..errors import BadInputError, NothingToDoError
from .file import JobFile, read_job_file
from .steps import fit_step, inputs_and_outputs, job_lock, model_rows, stored_bytes

log = logging.getLogger("streamwhiten")


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
        inputs, outputs = inputs_and_outputs(job)
        _check_paths(job, inputs, outputs)
        before = model_rows(job.model_path)
        model = fit_step(job, inputs, steps, progress, should_stop, restart)
        for input_spec, output in outputs.items():
            if _apply_step(job, model, input_spec, output, steps, progress, should_stop):
                written.append(output)
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
        raise NothingToDoError(f"nothing to do: job {job.name} is up to date", summary)
    return summary


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


def _apply_step(job: JobFile, model, input_spec: str, output: str, steps: list, progress, should_stop) -> bool:
    """Apply ``model`` to one input, unless its output is already what this would write; True if it wrote."""
    from ..engine.apply import is_up_to_date
    from ..io import open_output, remote, split_spec
    from ..pipeline import apply

    options, read = job.apply, job.apply_read
    assert options is not None
    current = is_up_to_date(model, input_spec, output, options, read)
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
    steps.append(f"apply {outcome.input} -> {output}")
    resumed = f", resumed at row {outcome.resumed_at_row:,}" if outcome.resumed_at_row else ""
    log.info("job %s: wrote %s (%s rows%s)", job.name, outcome.output, f"{outcome.n_rows:,}", resumed)
    return True


__all__ = ["job_lock", "run_job", "run_job_file"]
