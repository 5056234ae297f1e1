"""``streamwhiten run job.toml`` of a job without ``[publish]``: fit or update, finalize, apply, each step
skipped when up to date; every output is rewritten when the model changes (``job.publish`` versions them).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from ..errors import BadInputError
from ..progress import Watch
from .file import JobFile, read_job_file
from .report import JobUpToDateError, RunReport
from .steps import apply_unless_current, check_paths, fit_step, job_lock, model_rows, record_code, stored_bytes

log = logging.getLogger("streamwhiten")


def run_job_file(
    path: str,
    watch: Watch = Watch(),
    restart: bool = False,
    storage_options: Any = None,
    republish: bool = False,
    new_job: bool = False,
) -> RunReport:
    """Run the job file ``path`` (`run_job`); ``storage_options`` are used over its ``[storage]`` table."""
    return run_job(read_job_file(path, storage_options), watch, restart, republish, new_job)


def run_job(
    job: JobFile,
    watch: Watch = Watch(),
    restart: bool = False,
    republish: bool = False,
    new_job: bool = False,
) -> RunReport:
    """Run a job: fit or update, finalize, apply, each step skipped when up to date; ``watch``: progress and
    stop. A killed run is finished first (``restart`` discards it). A ``[publish]`` job publishes versions
    (`streamwhiten.job.publish.run_published`: a `PublishReport`; ``republish``: a new version whatever the
    staleness; ``new_job``: a copied folder becomes a job of its own). Returns the `RunReport`; raises
    `JobUpToDateError` (carrying it) when nothing ran.
    """
    if job.publish is not None:
        from .publish import run_published

        return run_published(job, watch, restart, republish, new_job)
    for name, given in (("republish", republish), ("new_job", new_job)):
        if given:
            raise BadInputError(
                f"{job.path}: {name} needs a [publish] table in the job file (versioned outputs)", param=name
            )
    began = time.perf_counter()
    os.makedirs(os.path.dirname(job.model_path), exist_ok=True)
    steps: list[str] = []
    written: list[str] = []
    with job_lock(job.lock_path):
        log.info("job %s: lock %s taken", job.name, job.lock_path)
        inputs, outputs = job.inputs_and_outputs()
        check_paths([job.path, *inputs], {**job.own_files, **{output: "[apply] output" for output in outputs.values()}})
        before = model_rows(job.model_path)
        model = fit_step(job.name, job.fitting, inputs, steps, watch, restart)
        if job.apply is not None:  # a job whose apply writes a vector code records it in its model
            model = record_code(job.name, model, job.writing, inputs, job.model_path, watch.progress)
        for input_spec, output in outputs.items():
            outcome = apply_unless_current(job.name, model, input_spec, output, job.writing, watch=watch)
            if outcome is not None:
                steps.append(f"apply {outcome.input} -> {output}")
                written.append(output)
    report = RunReport(
        job=job.name,
        model=job.model_path,
        steps=tuple(steps),
        rows_added=int(model.n_rows - before),
        outputs=tuple(outputs.values()),
        bytes_written=sum(stored_bytes(output, job.apply_read) for output in written),
        seconds=time.perf_counter() - began,
    )
    if not steps:
        raise JobUpToDateError(f"nothing to do: job {job.name} is up to date", report)
    return report


__all__ = ["job_lock", "run_job", "run_job_file"]
