"""A fit: check the paths and the existing model, plan (or plan an update of a saved model), resume from
a matching checkpoint, run the plan on an engine (``engine.engines``), finalize, save, remove the checkpoint;
and the finishing of a killed fit from its checkpoint alone (a job's)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import params as _params
from ..errors import BadInputError, InterruptedRunError, NothingToDoError
from ..options import EngineOptions, FitOptions, ReadOptions, Setting
from ..progress import Watch
from ..storage import Storage

if TYPE_CHECKING:
    from ..core.model import WhiteningModel
    from ..engine.fit import FitPlan, FitResult

from .paths import check_fit_paths, check_writable_dir, default_checkpoint

log = logging.getLogger("streamwhiten")


@dataclass(frozen=True)
class FitOutcome:
    """What a fit did, whichever engine ran it: the finalized ``model`` (saved to ``model_path`` unless None,
    ``file_checksum`` the file's), this run's pass (``rows_read``, ``read_seconds``: an update reads only
    what was added) and ``seconds``, the whole call."""

    model: WhiteningModel
    model_path: str | None
    file_checksum: str | None
    rows_read: int
    read_seconds: float
    seconds: float
    n_skipped: int
    n_sources: int
    n_blocks: int
    resumed: bool
    updated: bool
    engine: str

    @property
    def rows_per_second(self) -> float | None:
        return self.rows_read / self.read_seconds if self.read_seconds > 0 else None

    def to_json(self) -> dict[str, Any]:
        """The outcome as plain JSON values (``fit --json``): the model's summary and the run's figures."""
        summary = dict(
            self.model.to_json(),
            model=self.model_path,
            file_checksum=self.file_checksum,
            seconds=self.seconds,
            rows_read=self.rows_read,
            resumed=self.resumed,
            updated=self.updated,
            engine=self.engine,
            rows_per_second=self.rows_per_second,
        )
        summary.pop("sources")
        return summary


@dataclass
class _Planned:
    """A fit ready to run: its plan, whether it resumes, the setting, an updated model's skipped rows."""

    plan: FitPlan
    resumed: bool
    params: dict
    skipped_before: int
    storage: Storage | None = None  # an updated model's recorded storage, kept


def fit(
    inputs: str | list[str],
    model_path: str | None = None,
    *,
    setting: Setting | None = None,
    options: FitOptions | None = None,
    read: ReadOptions | None = None,
    engine: Any = None,
    update: str | None = None,
    watch: Watch = Watch(),
) -> FitOutcome:
    """Fit a whitening on ``inputs`` (store specs, globs, Parquet directories) and save it to ``model_path``.

    Parameters
    ----------
    inputs : str or list of str
        The stores to read, in order.
    model_path : str, optional
        The model file to write (``.npz``); default with ``update``: that model. None: nothing is saved
        and no checkpoint is kept (what ``Whitener.fit`` does).
    setting : Setting, optional
        The whitening's parameters (default: beta = gamma = 1, all components; an update keeps the
        model's for those not given).
    options, read, engine : FitOptions, ReadOptions, EngineOptions or Engine, optional
        How the fit reduces and checkpoints, how the stores are read, which engine runs the blocks
        (default: the serial engine).
    update : str, optional
        A saved model whose statistics are extended with the rows appended since, and new inputs.
    watch : Watch, optional
        Its progress (``progress(rows_done, rows_total)``) and when to stop (``should_stop()``: it
        checkpoints and raises `InterruptedRunError`).

    Returns
    -------
    FitOutcome
        `NothingToDoError` is raised instead when ``model_path`` already holds what this fit would write
        (without ``options.overwrite``), or an update found no new rows.
    """
    from ..core.model import kept_storage
    from ..engine.engines import engine_for
    from ..engine.fit import Checkpoint, finalize_fit

    began = time.perf_counter()
    setting, options, read = setting or Setting(), options or FitOptions(), read or ReadOptions()
    runner = engine_for(engine)
    model_path = model_path if model_path is not None else update
    inputs = _expanded(inputs, read)
    params = setting.given()
    _refuse_early(params, update, options, runner.checkpoints)
    checkpoint = _prepare_model_path(inputs, model_path, params, options, read, update) if model_path else None
    planned = _plan(inputs, options, read, update, params, checkpoint, runner)
    every = Checkpoint(checkpoint, options.checkpoint_every, options.checkpoint_seconds) if checkpoint else None
    result = runner.fit(planned.plan, watch=watch, checkpoint=every if runner.checkpoints else None)
    # an update keeps the storage the model records, as it keeps its setting (a code only for its own map)
    model = kept_storage(finalize_fit(result, planned.params, planned.skipped_before), planned.storage)
    checksum = _save(model, planned.plan, model_path, checkpoint, runner, watch) if model_path else None
    return _outcome(result, planned.plan, (model, model_path, checksum), began, planned.resumed, runner.name)


def _save(
    model: WhiteningModel, plan: FitPlan, model_path: str, checkpoint: str | None, runner: Any, watch: Watch
) -> str:
    """Save the fitted model and remove its checkpoint (inside the watch's guard for an engine that cannot
    stop between blocks)."""
    saving = nullcontext(watch.should_stop) if runner.stops_between_blocks or watch.guard is None else watch.guard()
    with saving as stop:
        return save_fitted(model, plan, model_path, checkpoint if runner.checkpoints else None, stop)


def _refuse_early(params: dict, update: str | None, options: FitOptions, checkpoints: bool) -> None:
    """Refuse, before a row is read, a bad setting, an unreadable model to update, and an update or resume
    on an engine that keeps no checkpoint."""
    _params.check_model(**params)
    if update is not None:
        from .._npz import check_file

        check_file(update, "model file")
    if not checkpoints and (update or options.resume):
        raise BadInputError(
            "update and resume work with the serial engine only (a Dask fit is not checkpointed)",
            param=("update", "resume"),
        )


def finish_checkpoint(
    inputs: Any,
    model_path: str,
    *,
    setting: Setting | None = None,
    options: FitOptions | None = None,
    read: ReadOptions | None = None,
    engine: EngineOptions | None = None,
    watch: Watch = Watch(),
    label: str = "",
) -> FitOutcome | None:
    """Complete the fit or update a killed run left in its checkpoint (``options.checkpoint``, default
    beside ``model_path``) and save its model (a job's first step); None when there was nothing to finish.

    The checkpoint's inputs need only be a prefix of ``inputs`` (a job's inputs grow between runs). One
    that does not belong to the current model, or whose sources changed, is discarded (logged with
    ``label``); one whose model was saved before the kill is removed.
    """
    from ..core.model import kept_storage
    from ..engine.engines import SerialEngine
    from ..engine.fit import Checkpoint, finalize_fit

    began = time.perf_counter()
    setting, fit, read = setting or Setting(), options or FitOptions(), read or ReadOptions()
    checkpoint = fit.checkpoint or default_checkpoint(model_path)
    pending = _pending(checkpoint, inputs, model_path, fit, read, label)
    if pending is None:
        return None
    plan, previous = pending
    done = f"{plan.rows_done:,} of {plan.rows_total:,}"
    log.info("%sfinishing the interrupted run in %s (%s rows done)", label, checkpoint, done)
    runner = SerialEngine((engine or EngineOptions()).threads)  # a checkpoint is the serial engine's
    result = runner.fit(
        plan, watch=watch, checkpoint=Checkpoint(checkpoint, fit.checkpoint_every, fit.checkpoint_seconds)
    )
    skipped = int(previous.info.get("n_skipped_nonfinite", 0)) if previous is not None and plan.base_rows else 0
    model = finalize_fit(result, effective_params(setting.given(), previous), skipped)
    if previous is not None:  # an update keeps the recorded storage (a code only for its own map)
        model = kept_storage(model, previous.storage)
    checksum = save_fitted(model, plan, model_path, checkpoint, watch.should_stop)
    return _outcome(result, plan, (model, model_path, checksum), began, True, runner.name)


def _pending(
    checkpoint: str, inputs: Any, model_path: str, fit: FitOptions, read: ReadOptions, label: str
) -> tuple[FitPlan, WhiteningModel | None] | None:
    """The plan a killed run left in ``checkpoint`` and the model it updates (None: a first fit); None, the
    checkpoint removed, when its model was saved before the kill or it no longer matches."""
    from ..core.model import load_model
    from ..engine.fit import PassOptions, check_resumable, load_checkpoint, remove_checkpoint
    from ..errors import ModelFileError

    try:
        plan = load_checkpoint(checkpoint, read)
    except ModelFileError as exc:
        raise BadInputError(f"{exc}") from None  # the message says how to start over (run --restart)
    previous = load_model(model_path) if os.path.exists(model_path) else None
    model_rows = previous.n_rows if previous is not None else 0
    if plan.done and plan.state.n_rows == model_rows and plan.base_rows != model_rows:
        # killed after saving the model, before removing the checkpoint: the model already holds it
        remove_checkpoint(checkpoint)
        return None
    options = PassOptions(fit.precision, bool(fit.skip_nonfinite), read.fill_missing_chunks)
    try:
        check_resumable(plan, checkpoint, options, model_rows, inputs, exact=False)
    except BadInputError as exc:
        log.warning("%sdiscarding checkpoint %s: %s", label, checkpoint, exc)
        remove_checkpoint(checkpoint)
        return None
    return plan, previous


def _outcome(
    result: FitResult,
    plan: FitPlan,
    saved: tuple[WhiteningModel, str | None, str | None],
    began: float,
    resumed: bool,
    engine: str,
) -> FitOutcome:
    """The outcome of a fit that ran ``plan`` (``result``) since ``began``, ``saved``: (model, path, checksum)."""
    rows_read = result.rows_read if result.rows_read is not None else result.state.n_rows + result.n_skipped
    n_sources = len(plan.cursors) or len(result.sources)
    seconds = time.perf_counter() - began
    return FitOutcome(
        *saved, int(rows_read), result.seconds, seconds, int(result.n_skipped), n_sources, int(result.n_blocks),
        resumed, bool(plan.base_rows), engine,
    )  # fmt: skip


def _expanded(inputs: Any, read: ReadOptions) -> list:
    from ..io import expand_specs

    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    return expand_specs(list(inputs), read)


def _prepare_model_path(
    inputs: Any, model_path: str, params: dict, options: FitOptions, read: ReadOptions, update: str | None
) -> str:
    """Check the model file and checkpoint paths before anything is read or written; returns the checkpoint
    path. An existing model is refused (or nothing to do) unless ``options.overwrite``."""
    from .._durable import remove_stale_temps
    from ..core.model import check_model_name, check_model_output
    from ..engine.fit import check_checkpoint_output

    check_writable_dir(model_path, "model file")
    checkpoint = check_fit_paths(inputs, model_path, options.checkpoint, update)
    check_model_name(model_path)
    if not options.overwrite:
        _refuse_existing_model(inputs, model_path, update, params, options, read)
    check_model_output(model_path, overwrite=True)  # only a model file of ours is replaced (or updated)
    if options.checkpoint is not None:
        check_checkpoint_output(checkpoint)  # a file of the user's named by --checkpoint is never replaced
    for path in (model_path, checkpoint):
        remove_stale_temps(path)  # what killed runs of this fit left behind
    return checkpoint


def _plan(
    inputs: Any, options: FitOptions, read: ReadOptions, update: str | None, params: dict, checkpoint: Any, runner: Any
) -> _Planned:
    """The plan of a fit or an update, or the checkpointed one it resumes."""
    from ..core.model import load_model
    from ..engine.fit import plan_fit

    previous = None if update is None else load_model(update)
    params = effective_params(params, previous)
    planned = plan_fit(inputs, options.precision, options.skip_nonfinite, read.block_rows, read=read, update=previous)
    skipped_before = 0 if previous is None else int(previous.info.get("n_skipped_nonfinite", 0))
    storage = None if previous is None else previous.storage
    _params.check_model(n_features=planned.state.n_features, **params)  # k > d is caught before the pass
    if runner.checkpoints and checkpoint is not None:
        resumed = _resumed(planned, checkpoint, options, read, runner)
        if resumed is not None:
            return _Planned(resumed, True, params, skipped_before, storage)
    return _Planned(planned, False, params, skipped_before, storage)


def _resumed(planned: Any, checkpoint: str, options: FitOptions, read: ReadOptions, runner: Any):
    """The checkpointed plan to resume instead of ``planned``, or None (no checkpoint, or ``restart``)."""
    from ..engine.fit import check_resumable, load_checkpoint

    if options.restart or not os.path.exists(checkpoint):
        if options.resume:
            raise BadInputError(f"{checkpoint}: no checkpoint to resume from")
        return None
    plan = load_checkpoint(checkpoint, read)
    check_resumable(plan, checkpoint, planned.options, planned.base_rows, [c.spec for c in planned.cursors])
    same_bits = "so the result is the same bits"
    if read.block_rows is not None and int(read.block_rows) != plan.block_rows:
        log.info(
            "resuming with the checkpoint's %s rows per block (not %s), %s", plan.block_rows, read.block_rows, same_bits
        )
    threads = getattr(runner, "threads", None)
    if threads is not None and plan.threads and int(threads) != plan.threads:
        log.info("resuming with the checkpoint's %s threads (not %s), %s", plan.threads, threads, same_bits)
    log.info("resuming from %s: %s of %s rows already done", checkpoint, f"{plan.rows_done:,}", f"{plan.rows_total:,}")
    return plan


def _refuse_existing_model(
    inputs: Any, model_path: str, update: str | None, params: dict, options: FitOptions, read: ReadOptions
) -> None:
    """Refuse an existing model file (`NothingToDoError` when it holds what this fit would write)."""
    from ..errors import OutputExistsError
    from ..io import same_file

    if not os.path.exists(model_path) or (update and same_file(update, model_path)):
        return
    if update is None and model_is_current(model_path, inputs, params, options, read):
        raise NothingToDoError(f"nothing to do: {model_path} was fitted on these inputs with these settings")
    raise OutputExistsError.at(model_path)


def model_is_current(model_path: str, inputs: Any, params: dict, options: FitOptions, read: ReadOptions) -> bool:
    """Whether ``model_path`` holds what a fit of ``inputs`` with these options would write: the same source
    fingerprints, precision, NaN handling and parameters."""
    from ..core.model import DEFAULT_EPS, file_checksum, load_model
    from ..engine.fit import open_sources
    from ..errors import ModelFileError
    from ..io import fingerprint

    try:
        model = load_model(model_path)
    except ModelFileError:
        return False
    recorded = tuple(model.info.get(key) for key in ("precision", "skip_nonfinite", "fill_missing_chunks"))
    if recorded != (options.precision, bool(options.skip_nonfinite), bool(read.fill_missing_chunks)):
        return False
    sources = open_sources(inputs, read=read)
    try:
        if tuple(fingerprint(source) for source in sources) != model.sources:
            return False
    finally:
        for source in sources:
            source.close()
    # A fit writes the defaults for every parameter it is not given.
    defaults = {"beta": 1.0, "gamma": 1.0, "eps": DEFAULT_EPS, "n_components": None, "variance": None}
    wanted = model.with_params(**{**defaults, **params})
    return file_checksum(wanted) == file_checksum(model)


def save_fitted(
    model: Any, plan: Any, model_path: str, checkpoint: str | None, should_stop: Callable[[], bool] | None = None
) -> str:
    """Save the model of a finished fit, then remove its checkpoint; returns the file's checksum.

    When a stop was asked for, the finished plan is checkpointed instead and `InterruptedRunError` raised
    (the next run only saves); a fit without a checkpoint (Dask) is saved whatever ``should_stop`` says.
    """
    from ..core.model import save_model
    from ..engine.fit import remove_checkpoint, save_checkpoint

    if checkpoint is not None and should_stop is not None and should_stop():
        save_checkpoint(plan, checkpoint)
        raise InterruptedRunError(
            f"interrupted before the model was saved; the finished fit is in {checkpoint} "
            "(run the same command again to save it)"
        )
    checksum = save_model(model, model_path)
    remove_checkpoint(checkpoint)
    return checksum


def effective_params(params: dict, previous: Any) -> dict:
    """``params``, falling back to the saved model's setting for those not given (an update keeps it)."""
    params = dict(params)
    if previous is not None:
        for name in ("beta", "gamma", "eps"):
            params.setdefault(name, getattr(previous, name))
        if "n_components" not in params and "variance" not in params:
            if previous.variance is not None:
                params["variance"] = previous.variance
            else:
                params["n_components"] = previous.n_components
    return params
