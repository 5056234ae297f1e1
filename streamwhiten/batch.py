"""A whole fit (the one entry point of every engine), and the batch run described by a ``job.toml``.

``fit_job`` plans a fit (or an incremental update of a saved model), resumes it from a matching
checkpoint, runs it on the serial or the Dask engine and finalizes. ``run_job_file`` runs a *job* (a
``job.toml``): fit/update, finalize and apply, skipping each step that is already up to date, under a
lock so two runs of the same job never overlap. Progress is reported through the ``streamwhiten``
logger; the CLI decides where it goes. (This module is the job.toml runner; the plan of a single fit
is ``engine.fit.FitPlan``.)
"""

from __future__ import annotations

import logging
import os
import string
import sys
from dataclasses import dataclass, field

from . import params as _params
from ._durable import exclusive_lock
from .errors import BadInputError, InterruptedRunError, NothingToDoError, StoreIOError

log = logging.getLogger("streamwhiten")


def check_writable_dir(path: str, what: str) -> None:
    """Fail before any work when the directory that will receive ``path`` does not exist."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise BadInputError(f"{path}: the directory {parent} for the {what} does not exist")


def default_checkpoint(model_path: str) -> str:
    """``.MODEL.checkpoint`` beside the model file."""
    head, tail = os.path.split(os.path.abspath(model_path))
    return os.path.join(head, f".{tail}.checkpoint")


def check_fit_paths(inputs, model_path: str, checkpoint: str | None = None, update: str | None = None) -> str:
    """Refuse a model file or checkpoint over an input, over each other, or a checkpoint over the model
    being updated, before anything is written; returns the checkpoint path (the default one if none)."""
    from .io import refuse_input_overlap, refuse_shared_outputs, remote

    for path, what in ((model_path, "model file"), (checkpoint, "checkpoint"), (update, "model to update")):
        if path is not None and remote.is_remote(os.fspath(path)):
            raise BadInputError(
                f"{remote.redact(path)}: the {what} is a local file (inputs and apply outputs may be "
                "URLs); give a local path"
            )
    checkpoint = checkpoint or default_checkpoint(model_path)
    refuse_input_overlap({model_path: "model file", checkpoint: "checkpoint"}, inputs)
    refuse_shared_outputs((model_path, "model file"), (checkpoint, "checkpoint"))
    refuse_input_overlap({checkpoint: "checkpoint"}, [update])
    return checkpoint


ENGINES = ("serial", "dask")


#: fit_job's checkpoint cadence defaults, as declared in ``params``.
_CHECKPOINT_EVERY = _params.default("checkpoint_every")
_CHECKPOINT_SECONDS = _params.default("checkpoint_seconds")


def fit_job(
    inputs,
    model_path,
    dataset=None,
    params=None,
    precision="auto",
    chunk_rows=None,
    skip_nonfinite=False,
    update=None,
    checkpoint=None,
    checkpoint_every=_CHECKPOINT_EVERY,
    checkpoint_seconds=_CHECKPOINT_SECONDS,
    restart=False,
    resume=False,
    progress=None,
    should_stop=None,
    threads=None,
    fill_missing_chunks=False,
    *,
    engine="serial",
    scheduler=None,
    workers=None,
    client=None,
    overwrite=True,
    read=None,
):
    """Plan (or update), resume from a matching checkpoint, run and finalize a fit: the one entry point
    of every engine.

    ``read`` (a :class:`~streamwhiten.options.ReadOptions`) says how the inputs are read: the storage
    options and deadline of URLs, and the dataset, block size and missing-chunk rule where the arguments
    of the same meaning leave them out.

    ``engine="serial"`` runs in this process, checkpointed and resumable; ``engine="dask"`` runs the
    same blocks (:func:`~streamwhiten.engine.fit.plan_blocks`) on a Dask cluster (``scheduler``, a local one of
    ``workers`` processes, or ``client``), not checkpointed, so without ``update`` or ``resume``. With
    ``overwrite=False`` an existing model file is refused (:class:`OutputExistsError`), or reported
    (:class:`NothingToDoError`) when it holds what this fit would write.

    Returns ``(model, fitted, resumed, checkpoint_path)``: ``fitted`` is the finished
    :class:`~streamwhiten.engine.fit.FitPlan` (serial) or :class:`~streamwhiten.engine.fit.FitResult` (Dask); the
    caller saves the model with :func:`save_fitted`, which also removes the checkpoint. ``update``
    names a saved model whose statistics are extended with appended rows only.
    """
    from ._durable import remove_stale_temps
    from .core.model import check_model_name, check_model_output, check_params, load_model
    from .engine.fit import (
        check_checkpoint_output,
        check_resumable,
        finalize_fit,
        load_checkpoint,
        merge_read,
        plan_fit,
        plan_update,
        run_plan,
    )

    read = merge_read(read, dataset, fill_missing_chunks)
    dataset, fill_missing_chunks = read.dataset, read.fill_missing_chunks
    chunk_rows = chunk_rows if chunk_rows is not None else read.block_rows

    _params.check("checkpoint_every", checkpoint_every)
    _params.check("checkpoint_seconds", checkpoint_seconds)
    if engine not in ENGINES:
        raise BadInputError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "dask" and (update or resume):
        raise BadInputError("--update and --resume work with the serial engine only (a Dask fit is not checkpointed)")
    params = dict(params or {})
    check_params(**params)
    if update is not None:  # the model to update is read first: a FIFO or an unreadable file is refused at once
        from ._npz import check_file

        check_file(update, "model file")
    check_writable_dir(model_path, "model file")
    given_checkpoint, checkpoint = checkpoint, check_fit_paths(inputs, model_path, checkpoint, update)
    check_model_name(model_path)
    if not overwrite:
        _refuse_existing_model(inputs, model_path, update, params, precision, skip_nonfinite, read)
    check_model_output(model_path, overwrite=True)  # now: only a model file of ours is replaced (or updated)
    if given_checkpoint is not None:
        check_checkpoint_output(checkpoint)  # a file of the user's named by --checkpoint is never replaced
    for path in (model_path, checkpoint):
        remove_stale_temps(path)  # what killed runs of this fit left behind

    if engine == "dask":
        from .engine.distributed import fit_dask

        result = fit_dask(
            inputs,
            dataset,
            precision,
            skip_nonfinite,
            chunk_rows,
            scheduler=scheduler,
            n_workers=workers,
            client=client,
            read=read,
        )
        return finalize_fit(result, params), result, False, None

    if update is not None:
        previous = load_model(update)
        params = _effective_params(params, previous)
        planned = plan_update(
            previous.state, previous.sources, inputs, None, precision, skip_nonfinite, chunk_rows, read=read
        )
        skipped_before = int(previous.info.get("n_skipped_nonfinite", 0))
    else:
        planned = plan_fit(inputs, None, precision, skip_nonfinite, chunk_rows, read=read)
        skipped_before = 0
    check_params(n_features=planned.state.n_features, **params)  # k > d is caught before the pass
    resumed = False
    if os.path.exists(checkpoint) and not restart:
        job = load_checkpoint(checkpoint, read)
        check_resumable(job, checkpoint, planned.options, planned.base_rows, [c.spec for c in planned.cursors])
        if chunk_rows is not None and int(chunk_rows) != job.block_rows:
            log.info(
                "resuming with the checkpoint's %s rows per block (not %s), so the result is the same bits",
                job.block_rows,
                chunk_rows,
            )
        if threads is not None and job.threads and int(threads) != job.threads:
            log.info(
                "resuming with the checkpoint's %s threads (not %s), so the result is the same bits",
                job.threads,
                threads,
            )
        resumed = True
        log.info(
            "resuming from %s: %s of %s rows already done", checkpoint, f"{job.rows_done:,}", f"{job.rows_total:,}"
        )
    elif resume:
        raise BadInputError(f"{checkpoint}: no checkpoint to resume from")
    else:
        job = planned
    job = run_plan(job, progress, checkpoint, checkpoint_every, checkpoint_seconds, should_stop, threads)
    return finalize_fit(job.result(), params, skipped_before), job, resumed, checkpoint


def _refuse_existing_model(inputs, model_path, update, params, precision, skip_nonfinite, read) -> None:
    """An existing model file is replaced only with ``overwrite`` (or updated in place); one that already
    holds what this fit would write is nothing to do."""
    from .errors import OutputExistsError
    from .io import same_file

    if not os.path.exists(model_path) or (update and same_file(update, model_path)):
        return
    if update is None and model_is_current(model_path, inputs, None, params, precision, skip_nonfinite, read=read):
        raise NothingToDoError(f"nothing to do: {model_path} was fitted on these inputs with these settings")
    raise OutputExistsError.at(model_path)


def model_is_current(
    model_path: str,
    inputs,
    dataset=None,
    params=None,
    precision="auto",
    skip_nonfinite=False,
    fill_missing_chunks=False,
    *,
    read=None,
) -> bool:
    """Whether ``model_path`` holds the model a fit of ``inputs`` with these options would write: the
    same sources (fingerprints), precision, NaN handling and parameters. Then there is nothing to do."""
    from .core.model import file_checksum, load_model
    from .engine.fit import merge_read, open_sources

    read = merge_read(read, dataset, fill_missing_chunks)
    fill_missing_chunks = read.fill_missing_chunks
    from .errors import ModelFileError
    from .io import fingerprint

    try:
        model = load_model(model_path)
    except ModelFileError:
        return False
    recorded = tuple(model.info.get(key) for key in ("precision", "skip_nonfinite", "fill_missing_chunks"))
    if recorded != (precision, bool(skip_nonfinite), bool(fill_missing_chunks)):
        return False
    sources = open_sources(inputs, read=read)
    try:
        if tuple(fingerprint(source) for source in sources) != model.sources:
            return False
    finally:
        for source in sources:
            source.close()
    # A fit writes the defaults for every parameter it is not given.
    from .core.model import DEFAULT_EPS

    wanted = model.with_params(
        **{"beta": 1.0, "gamma": 1.0, "eps": DEFAULT_EPS, "n_components": None, "variance": None, **(params or {})}
    )
    return file_checksum(wanted) == file_checksum(model)


def save_fitted(model, job, model_path: str, checkpoint: str | None, should_stop=None) -> str:
    """Save the model of a finished fit, then remove its checkpoint; returns the model's checksum.

    When a stop was asked for (a signal during the fit's last block or its finalize), the finished
    plan is checkpointed instead and :class:`InterruptedRunError` raised: the next run only finalizes
    and saves. A signal during the save itself lets the save finish (the file is whole or absent).
    A fit without a checkpoint (``checkpoint`` None: the Dask engine) is saved whatever ``should_stop`` says.
    """
    from .core.model import save_model
    from .engine.fit import remove_checkpoint, save_checkpoint

    if checkpoint is not None and should_stop is not None and should_stop():
        save_checkpoint(job, checkpoint)
        raise InterruptedRunError(
            f"interrupted before the model was saved; the finished fit is in {checkpoint} "
            "(run the same command again to save it)"
        )
    checksum = save_model(model, model_path)
    remove_checkpoint(checkpoint)
    return checksum


# ------------------------------------------------------------------------------------------- job files


def job_lock(path: str):
    """Hold the job's exclusive lock on ``path`` (released by the OS even if the process is killed; the
    file is removed when the run ends); a second run of the job exits with :class:`LockedError` (75).
    The same lock as an apply output's (``_durable.exclusive_lock``)."""
    return exclusive_lock(
        path,
        lambda holder: f"{path}: another run of this job is in progress (pid {holder}); not starting a second one",
        remove=True,
    )


#: A job-file key whose value is checked against :data:`streamwhiten.params.PARAMS`.
_PARAM = "parameter"
#: Keys a job file may hold: the type each value must have, or :data:`_PARAM`.
_KEYS = {
    "": {"name": str, "input": dict, "model": dict, "apply": dict, "storage": dict},
    "input": {"paths": (list, str), "dataset": str, "fill_missing_chunks": _PARAM},
    "model": {
        "path": str,
        **{
            name: _PARAM
            for name in (
                "beta",
                "gamma",
                "n_components",
                "variance",
                "eps",
                "precision",
                "chunk_rows",
                "skip_nonfinite",
                "checkpoint_every",
                "checkpoint_seconds",
                "threads",
            )
        },
    },
    "apply": {
        "output": str,
        "keep_columns": (list, str),
        **{
            name: _PARAM
            for name in (
                "normalize",
                "dtype",
                "zarr_format",
                "chunk_rows",
                "skip_nonfinite",
                "threads",
                "direct_io",
                "compressor",
            )
        },
    },
}


@dataclass
class JobSpec:
    """A parsed ``job.toml``; relative paths are taken from the job file's directory."""

    path: str
    name: str
    inputs: list
    dataset: str | None
    model_path: str
    model: dict = field(default_factory=dict)
    apply: dict | None = None
    fill_missing_chunks: bool = False
    #: storage options for the job's URLs (the ``[storage]`` table), never logged
    storage: dict = field(default_factory=dict)

    @property
    def lock_path(self) -> str:
        """One lock per model file: two job files keeping the same model never run at once."""
        head, tail = os.path.split(self.model_path)
        return os.path.join(head, f".{tail}.lock")


def read_job_file(path: str) -> JobSpec:
    """Parse and check a job file; every mistake is one :class:`BadInputError` naming the file and key."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    from ._paths import check_readable

    check_readable(path, "job file", directory=False)
    try:
        with open(path, "rb") as handle:
            text = handle.read()
    except OSError as exc:
        raise StoreIOError(f"{path}: cannot read the job file: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadInputError(
            f"{path}: not a valid TOML job file (TOML is UTF-8 text; byte {text[exc.start]:#04x} at offset "
            f"{exc.start} is not UTF-8)"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise BadInputError(f"{path}: not a valid TOML job file ({exc})") from None
    for section, allowed in _KEYS.items():
        if section == "storage":
            continue  # free-form: the keyword arguments of the file system
        table = data if section == "" else data.get(section, {})
        where = f"[{section}]" if section else "the top level"
        unknown = set(table) - set(allowed)
        if unknown:
            raise BadInputError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} in {where}")
        for key, kind in allowed.items():
            value = table.get(key)
            if value is None:
                continue
            if kind is _PARAM:
                _params.check(key, value, f"{path}: {key} in {where}")
                continue
            wrong_bool = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
            if wrong_bool or not isinstance(value, kind):
                names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
                raise BadInputError(f"{path}: {key} in {where} must be of type {names}, got {value!r}")
    from .io import remote

    base = os.path.dirname(os.path.abspath(path))
    absolute = lambda p: remote.local_path(p) if os.path.isabs(p) or remote.is_url(p) else os.path.join(base, p)  # noqa: E731
    inputs = data.get("input", {}).get("paths")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not inputs or not all(isinstance(p, str) for p in inputs):
        raise BadInputError(f"{path}: [input] paths must list at least one input store (globs allowed)")
    model = dict(data.get("model", {}))
    if "path" not in model:
        raise BadInputError(f"{path}: [model] path (the model file to keep up to date) is required")
    apply = data.get("apply")
    if apply is not None:
        if "output" not in apply:
            raise BadInputError(f"{path}: [apply] output is required, e.g. 'reduced/{{stem}}.zarr'")
        _check_output_template(path, apply["output"])
        apply = dict(apply, output=absolute(apply["output"]))
    name = str(data.get("name") or os.path.splitext(os.path.basename(path))[0])
    if apply is not None and "name" in _template_fields(apply["output"]):
        _check_field(path, "name", name, f"the job's name ({name!r}, the name key or the job file's)")
    storage = remote.options_from(data.get("storage") or {})
    model_path = absolute(model.pop("path"))
    if remote.is_url(model_path):
        raise BadInputError(f"{path}: [model] path must be a local file (inputs and [apply] outputs may be URLs)")
    return JobSpec(
        path,
        name,
        [absolute(p) for p in inputs],
        data.get("input", {}).get("dataset"),
        model_path,
        model,
        apply,
        bool(data.get("input", {}).get("fill_missing_chunks")),
        storage,
    )


#: The fields an ``[apply] output`` template may use.
OUTPUT_FIELDS = "{stem} (the input's file name without extension) and {name} (the job's name)"


def _template_fields(text: str):
    """The names of the fields of the template ``text`` (``ValueError`` for unbalanced braces)."""
    for _, name, spec, _ in string.Formatter().parse(text):
        if name is not None:
            yield name
            yield from _template_fields(spec)  # a field nested in a format spec, as in {stem:{width}}


def _check_output_template(path: str, template: str) -> None:
    """Refuse an ``[apply] output`` template that :func:`_output_for` could not fill, naming the bad field."""
    where = f"{path}: output in [apply] ({template!r})"
    try:
        names = list(_template_fields(template))
    except ValueError as exc:  # unbalanced braces
        raise BadInputError(
            f"{where}: not a valid template ({exc}; write a literal brace as {{{{ or }}}}); "
            f"the fields are {OUTPUT_FIELDS}"
        ) from None
    for name in names:
        if name == "" or name.isdigit():
            raise BadInputError(f"{where}: positional field {{{name}}} is not allowed; the fields are {OUTPUT_FIELDS}")
        if name not in ("stem", "name"):
            raise BadInputError(f"{where}: unknown field {{{name}}}; the fields are {OUTPUT_FIELDS}")
    try:
        template.format(stem="stem", name="name")
    except ValueError as exc:  # a format spec or conversion that does not apply to a string
        raise BadInputError(f"{where}: cannot be filled in ({exc}); the fields are {OUTPUT_FIELDS}") from None


def _check_field(path: str, field: str, value: str, what: str) -> None:
    """Refuse a value for the ``{field}`` of an output template that would leave the output's folder or
    name none: a path separator, ``..``, ``.`` or nothing (exit 2)."""
    if value in ("", ".", "..") or any(sep in value for sep in ("/", "\\", os.sep, os.altsep or "/", "\0")):
        raise BadInputError(
            f"{path}: {{{field}}} in the [apply] output would be {what}, which holds a path separator or is "
            f"'.' or '..': an output must stay in its folder; rename it, or leave {{{field}}} out"
        )


def _output_for(template: str, input_spec: str, job_name: str, job_path: str = "job file") -> str:
    from .io import split_spec

    path, _ = split_spec(input_spec)
    stem = os.path.splitext(os.path.basename(path.rstrip("/")))[0]
    fields = set(_template_fields(template))
    if "stem" in fields:
        _check_field(job_path, "stem", stem, f"{stem!r}, from the input {path}")
    if "name" in fields:
        _check_field(job_path, "name", job_name, f"the job's name ({job_name!r})")
    return template.format(stem=stem, name=job_name)


def _finish_pending(
    spec: JobSpec, inputs: list, checkpoint: str, params: dict, progress, should_stop, read=None
) -> bool:
    """Complete a fit or update a killed run left in ``checkpoint`` and save the model; True if it did.

    A checkpoint is self-contained (its state and the rows each source still owes), so it is finished
    as it was planned, whatever inputs appeared since; those are picked up by the next update. A
    checkpoint that does not belong to the current model (or whose sources changed) is discarded.
    """
    from .core.model import load_model
    from .engine.fit import PassOptions, check_resumable, finalize_fit, load_checkpoint, remove_checkpoint, run_plan
    from .errors import ModelFileError

    try:
        job = load_checkpoint(checkpoint, read)
    except ModelFileError as exc:
        raise BadInputError(f"{exc}") from None  # the message says how to start over (run --restart)
    previous = load_model(spec.model_path) if os.path.exists(spec.model_path) else None
    model_rows = previous.n_rows if previous is not None else 0
    if job.done and job.state.n_rows == model_rows and job.base_rows != model_rows:
        # killed after saving the model, before removing the checkpoint: the model already holds it
        remove_checkpoint(checkpoint)
        return False
    options = PassOptions(
        spec.model.get("precision", _params.default("precision")),
        bool(spec.model.get("skip_nonfinite", False)),
        spec.fill_missing_chunks,
    )
    try:
        check_resumable(job, checkpoint, options, model_rows, inputs, exact=False)
    except BadInputError as exc:
        log.warning("job %s: discarding checkpoint %s: %s", spec.name, checkpoint, exc)
        remove_checkpoint(checkpoint)
        return False
    log.info(
        "job %s: finishing the interrupted run in %s (%s of %s rows done)",
        spec.name,
        checkpoint,
        f"{job.rows_done:,}",
        f"{job.rows_total:,}",
    )
    job = run_plan(
        job,
        progress,
        checkpoint,
        spec.model.get("checkpoint_every", _params.default("checkpoint_every")),
        spec.model.get("checkpoint_seconds", _params.default("checkpoint_seconds")),
        should_stop,
        spec.model.get("threads"),
    )
    skipped = int(previous.info.get("n_skipped_nonfinite", 0)) if previous is not None and job.base_rows else 0
    model = finalize_fit(job.result(), _effective_params(params, previous), skipped)
    save_fitted(model, job, spec.model_path, checkpoint, should_stop)
    return True


def _effective_params(params: dict, previous) -> dict:
    """The job's parameters, falling back to the saved model's for those the job leaves out."""
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


def job_read_options(spec: JobSpec, read=None):
    """How a job reads: its ``[input]`` dataset and missing-chunk rule, and its ``[storage]`` table with the
    storage options of ``read`` (the command line's) over it; ``read``'s deadline."""
    from .options import ReadOptions

    read = read if read is not None else ReadOptions()
    return ReadOptions(
        dataset=spec.dataset,
        fill_missing_chunks=spec.fill_missing_chunks,
        storage_options={**spec.storage, **(read.storage_options.to_dict() if read.storage_options else {})},
        remote_timeout=read.remote_timeout,
    )


def run_job_file(path: str, progress=None, should_stop=None, restart: bool = False, *, read=None) -> dict:
    """Run a job file: fit or update, finalize, apply; each step skipped when already up to date.

    A run that was killed is finished first (from its checkpoint); ``restart`` discards it instead.
    ``read`` (a :class:`~streamwhiten.options.ReadOptions`) gives storage options laid over the job's
    ``[storage]`` table, and the deadline of its URLs (:func:`job_read_options`). Returns a summary with
    ``steps`` (what ran). Raises :class:`NothingToDoError` when nothing ran.
    """
    spec = read_job_file(path)
    return _run_job(spec, progress, should_stop, restart, job_read_options(spec, read))


def _run_job(spec: JobSpec, progress, should_stop, restart: bool, read) -> dict:
    from .core.model import check_params, file_checksum, load_model, map_checksum, save_model
    from .engine.apply import apply_model, check_keep_columns, output_is_current, recorded_options
    from .engine.fit import remove_checkpoint
    from .io import (
        expand_specs,
        fingerprint,
        open_source,
        refuse_input_overlap,
        refuse_shared_outputs,
        remote,
        split_spec,
    )

    fit_options = {
        key: spec.model[key]
        for key in ("precision", "chunk_rows", "skip_nonfinite", "checkpoint_every", "checkpoint_seconds", "threads")
        if key in spec.model
    }
    params = {key: spec.model[key] for key in ("beta", "gamma", "n_components", "variance", "eps") if key in spec.model}
    check_params(**params)
    os.makedirs(os.path.dirname(spec.model_path), exist_ok=True)
    steps = []
    with job_lock(spec.lock_path):
        log.info("job %s: lock %s taken", spec.name, spec.lock_path)
        inputs = expand_specs(spec.inputs, read)
        outputs, stores_used = {}, {}
        if spec.apply is not None:
            for input_spec in inputs:
                output = _output_for(spec.apply["output"], input_spec, spec.name, spec.path)
                store = split_spec(output)[0]  # each output is a whole file or store
                store = remote.normalize(store) if remote.is_url(store) else os.path.realpath(store)
                if store in stores_used:
                    raise BadInputError(
                        f"{spec.path}: [apply] output '{spec.apply['output']}' puts two inputs in "
                        f"{store}; each input needs its own file or store (e.g. 'out/{{stem}}.zarr')"
                    )
                stores_used[store] = input_spec
                outputs[input_spec] = output
        checkpoint = default_checkpoint(spec.model_path)
        refuse_input_overlap(
            {
                spec.model_path: "model file",
                checkpoint: "checkpoint",
                spec.lock_path: "lock file",
                **{output: "[apply] output" for output in outputs.values()},
            },
            [spec.path, *inputs],
        )
        refuse_shared_outputs(
            (spec.model_path, "model file"),
            (checkpoint, "checkpoint"),
            (spec.lock_path, "lock file"),
            *((output, "[apply] output") for output in outputs.values()),
        )
        if restart:
            remove_checkpoint(checkpoint)
        elif os.path.exists(checkpoint) and _finish_pending(
            spec, inputs, checkpoint, params, progress, should_stop, read
        ):
            steps.append("resume")
        exists = os.path.exists(spec.model_path)
        try:
            model, job, resumed, checkpoint = fit_job(
                inputs,
                spec.model_path,
                spec.dataset,
                params,
                update=spec.model_path if exists else None,
                progress=progress,
                should_stop=should_stop,
                fill_missing_chunks=spec.fill_missing_chunks,
                read=read,
                **fit_options,
            )
            save_fitted(model, job, spec.model_path, checkpoint, should_stop)
            steps.append("update" if exists else "fit")
            log.info(
                "job %s: %s %s with %s rows",
                spec.name,
                "updated" if exists else "fitted",
                spec.model_path,
                f"{job.rows_done:,}",
            )
        except NothingToDoError:
            model = load_model(spec.model_path)
            log.info("job %s: model %s is up to date with its inputs", spec.name, spec.model_path)
            wanted = model.with_params(**params) if params else model
            if file_checksum(wanted) != file_checksum(model):
                save_model(wanted, spec.model_path)
                steps.append("finalize")
                log.info("job %s: re-finalized %s with the job's parameters", spec.name, spec.model_path)
            model = wanted
        if spec.apply is not None:
            checksum = map_checksum(model)
            options = {
                key: spec.apply[key]
                for key in (
                    "normalize",
                    "dtype",
                    "zarr_format",
                    "skip_nonfinite",
                    "threads",
                    "direct_io",
                    "keep_columns",
                    "compressor",
                )
                if key in spec.apply
            }
            if "chunk_rows" in spec.apply:
                options["block_rows"] = spec.apply["chunk_rows"]
            for input_spec, output in outputs.items():
                with open_source(input_spec, read=read) as source:
                    source_sha = fingerprint(source).sha256_sampled
                    label = source.label
                recorded = recorded_options(
                    output,
                    options.get("skip_nonfinite", False),
                    spec.fill_missing_chunks,
                    options.get("zarr_format", 3),
                    options.get("compressor", "none"),
                )
                if output_is_current(
                    output,
                    checksum,
                    source_sha,
                    options.get("normalize", False),
                    options.get("dtype", "float32"),
                    recorded,
                    check_keep_columns(options.get("keep_columns")),
                    read=read,
                ):
                    log.info("job %s: %s is up to date", spec.name, output)
                    continue
                if not remote.is_url(output):
                    os.makedirs(os.path.dirname(os.path.abspath(split_spec(output)[0])), exist_ok=True)
                summary = apply_model(
                    model,
                    input_spec,
                    output,
                    spec.dataset,
                    overwrite=True,
                    progress=progress,
                    should_stop=should_stop,
                    fill_missing_chunks=spec.fill_missing_chunks,
                    read=read,
                    **options,
                )
                steps.append(f"apply {label} -> {output}")
                log.info(
                    "job %s: wrote %s (%s rows%s)",
                    spec.name,
                    summary["output"],
                    f"{summary['n_rows']:,}",
                    f", resumed at row {summary['resumed_at_row']:,}" if summary["resumed_at_row"] else "",
                )
    if not steps:
        raise NothingToDoError(f"nothing to do: job {spec.name} is up to date")
    return {"job": spec.name, "model": spec.model_path, "steps": steps}
