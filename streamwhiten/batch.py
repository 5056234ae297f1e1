"""Deprecated: the names this module held moved (0.3).

A fit's pipeline is `streamwhiten.pipeline` (``streamwhiten.fit``), a job file and its run are
`streamwhiten.job`. The old names still work here, with a ``DeprecationWarning``:

========================= ========================================================================
old                       new
========================= ========================================================================
``fit_job(...)``          ``streamwhiten.fit(inputs, model_path, setting=, options=, read=, engine=)``
``save_fitted``           ``streamwhiten.pipeline.save_fitted``
``model_is_current``      ``streamwhiten.pipeline.model_is_current``
``check_fit_paths``,      ``streamwhiten.pipeline.check_fit_paths``, ``.check_writable_dir``
``check_writable_dir``
``default_checkpoint``    ``streamwhiten.job.default_checkpoint``
``read_job_file``         ``streamwhiten.job.read_job_file`` (a ``JobFile`` of option objects)
``run_job_file``          ``streamwhiten.job.run_job_file``
``job_lock``              ``streamwhiten.job.job_lock``
========================= ========================================================================
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

from .errors import BadInputError

_MOVED = {
    "save_fitted": "streamwhiten.pipeline",
    "model_is_current": "streamwhiten.pipeline",
    "check_fit_paths": "streamwhiten.pipeline",
    "check_writable_dir": "streamwhiten.pipeline",
    "default_checkpoint": "streamwhiten.job.file",
    "read_job_file": "streamwhiten.job.file",
    "run_job_file": "streamwhiten.job.run",
    "job_lock": "streamwhiten.job.run",
}


def __getattr__(name: str):
    if name == "fit_job":
        target, where = _fit_job, "streamwhiten.fit (with option objects)"
    elif name in _MOVED:
        target, where = getattr(importlib.import_module(_MOVED[name]), name), f"{_MOVED[name]}.{name}"
    else:
        raise AttributeError(f"module 'streamwhiten.batch' has no attribute {name!r}")
    warnings.warn(f"streamwhiten.batch.{name} moved: use {where}", DeprecationWarning, stacklevel=2)
    return target


def _fit_job(
    inputs: str | list[str],
    model_path: str,
    dataset: str | None = None,
    params: dict[str, Any] | None = None,
    precision: str = "auto",
    chunk_rows: int | None = None,
    skip_nonfinite: bool = False,
    update: str | None = None,
    checkpoint: str | None = None,
    checkpoint_every: int = 20,
    checkpoint_seconds: float = 60.0,
    restart: bool = False,
    resume: bool = False,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    threads: int | None = None,
    fill_missing_chunks: bool = False,
    *,
    engine: str = "serial",
    scheduler: str | None = None,
    workers: int | None = None,
    client: Any = None,
    overwrite: bool = True,
    read: Any = None,
):
    """The 0.2 ``fit_job``: plan, run and finalize a fit, without saving; returns ``(model, fitted,
    resumed, checkpoint)`` as it did (``fitted``: the finished plan, or the Dask engine's result; save it
    with ``save_fitted``). Built on [`streamwhiten.pipeline.fit`][streamwhiten.pipeline.fit]'s steps."""
    from dataclasses import replace

    from . import pipeline
    from .engine.engines import Checkpoint, engine_for
    from .engine.fit import finalize_fit, merge_read
    from .options import EngineOptions, FitOptions, Setting

    options = FitOptions(
        precision=precision,
        skip_nonfinite=skip_nonfinite,
        checkpoint=checkpoint,
        checkpoint_every=checkpoint_every,
        checkpoint_seconds=checkpoint_seconds,
        resume=resume,
        restart=restart,
        overwrite=overwrite,
    )
    read = merge_read(read, dataset, fill_missing_chunks)
    if chunk_rows is not None:
        read = replace(read, block_rows=chunk_rows)
    runner = engine_for(EngineOptions(name=engine, threads=threads, scheduler=scheduler, workers=workers), client)
    params = Setting(**(params or {})).given()
    if update is not None:
        from ._npz import check_file

        check_file(update, "model file")
    if not runner.checkpoints and (update or resume):
        raise BadInputError(
            "update and resume work with the serial engine only (a Dask fit is not checkpointed)",
            param=("update", "resume"),
        )
    inputs = pipeline._expanded(inputs, read)
    checkpoint = pipeline._prepare_model_path(inputs, model_path, params, options, read, update)
    planned = pipeline._plan(inputs, options, read, update, params, checkpoint, runner)
    every = Checkpoint(checkpoint, checkpoint_every, checkpoint_seconds) if runner.checkpoints else None
    result = runner.fit(planned.plan, progress=progress, should_stop=should_stop, checkpoint=every)
    model = finalize_fit(result, planned.params, planned.skipped_before)
    if runner.checkpoints:
        return model, planned.plan, planned.resumed, checkpoint
    return model, result, False, None
