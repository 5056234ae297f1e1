"""Whole jobs: a resumable fit or update, and the nightly batch run described by a ``job.toml``.

``fit_job`` plans a fit (or an incremental update of a saved model), resumes it from a matching
checkpoint, runs it and finalizes. ``run_job_file`` chains fit/update, finalize and apply, skipping
each step that is already up to date, under a lock so two runs of the same job never overlap.
Progress is reported through the ``streamwhiten`` logger; the CLI decides where it goes.
"""

from __future__ import annotations

import fcntl
import logging
import os
import string
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from .errors import BadInputError, InterruptedRunError, LockedError, NothingToDoError, StoreIOError

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


def _check_checkpoint_options(checkpoint_every, checkpoint_seconds) -> None:
    """Raise :class:`BadInputError` for a checkpoint interval that makes no sense (``chunk_rows`` is
    checked where the blocks are planned)."""
    every, seconds = checkpoint_every, checkpoint_seconds
    if isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1:
        raise BadInputError(f"checkpoint_every must be a whole number of at least 1, got {every!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float, np.integer, np.floating)) or not seconds > 0:
        raise BadInputError(f"checkpoint_seconds must be a number of seconds above 0, got {seconds!r}")


def check_fit_paths(inputs, model_path: str, checkpoint: str | None = None, update: str | None = None) -> str:
    """Refuse a model file or checkpoint over an input, over each other, or a checkpoint over the model
    being updated, before anything is written; returns the checkpoint path (the default one if none)."""
    from .io import refuse_input_overlap, refuse_shared_outputs

    checkpoint = checkpoint or default_checkpoint(model_path)
    refuse_input_overlap({model_path: "model file", checkpoint: "checkpoint"}, inputs)
    refuse_shared_outputs((model_path, "model file"), (checkpoint, "checkpoint"))
    refuse_input_overlap({checkpoint: "checkpoint"}, [update])
    return checkpoint


def fit_job(inputs, model_path, dataset=None, params=None, precision="auto", chunk_rows=None, skip_nonfinite=False,
            update=None, checkpoint=None, checkpoint_every=20, checkpoint_seconds=60.0, restart=False,
            resume=False, progress=None, should_stop=None, threads=None, fill_missing_chunks=False):
    """Plan (or update), resume from a matching checkpoint, run and finalize a fit.

    Returns ``(model, job, resumed, checkpoint_path)``; the caller saves the model and then removes the
    checkpoint. ``update`` names a saved model whose statistics are extended with appended rows only.
    """
    from .fit import check_resumable, load_checkpoint, plan_fit, plan_update, run_job
    from .model import check_params, finalize, load_model
    from .io.durable import remove_stale_temps

    _check_checkpoint_options(checkpoint_every, checkpoint_seconds)
    check_writable_dir(model_path, "model file")
    checkpoint = check_fit_paths(inputs, model_path, checkpoint, update)
    for path in (model_path, checkpoint):
        remove_stale_temps(path)  # what killed runs of this fit left behind

    params = dict(params or {})
    if update is not None:
        previous = load_model(update)
        params = _effective_params(params, previous)
        planned = plan_update(previous.state, previous.sources, inputs, dataset, precision, skip_nonfinite, chunk_rows,
                              fill_missing_chunks)
        skipped_before = int(previous.info.get("n_skipped_nonfinite", 0))
    else:
        planned = plan_fit(inputs, dataset, precision, skip_nonfinite, chunk_rows, fill_missing_chunks)
        skipped_before = 0
    check_params(n_features=planned.state.n_features, **params)  # k > d is caught before the pass
    checkpoint = checkpoint or default_checkpoint(model_path)
    resumed = False
    if os.path.exists(checkpoint) and not restart:
        job = load_checkpoint(checkpoint)
        check_resumable(job, planned, checkpoint)
        if chunk_rows is not None and int(chunk_rows) != job.block_rows:
            log.info("resuming with the checkpoint's %s rows per block (not %s), so the result is the same bits",
                     job.block_rows, chunk_rows)
        if threads is not None and job.threads and int(threads) != job.threads:
            log.info("resuming with the checkpoint's %s threads (not %s), so the result is the same bits",
                     job.threads, threads)
        if job.base_rows != planned.base_rows:
            raise BadInputError(f"{checkpoint}: checkpoint is for another starting model; pass --restart to start over")
        resumed = True
        log.info("resuming from %s: %s of %s rows already done", checkpoint, f"{job.rows_done:,}", f"{job.rows_total:,}")
    elif resume:
        raise BadInputError(f"{checkpoint}: no checkpoint to resume from")
    else:
        job = planned
    job = run_job(job, progress, checkpoint, checkpoint_every, checkpoint_seconds, should_stop, threads)
    info = fit_info(job, skipped_before + job.n_skipped)
    model = finalize(job.state, sources=job.sources + job.kept_sources, info=info, **params)
    return model, job, resumed, checkpoint


def fit_info(job, n_skipped: int) -> dict:
    """What a model records of the fit that made it, besides its sources: enough to tell whether a
    later fit of the same inputs with the same options would give the same model."""
    return {"n_skipped_nonfinite": int(n_skipped), "precision": job.precision,
            "skip_nonfinite": bool(job.skip_nonfinite), "fill_missing_chunks": bool(job.fill_missing_chunks)}


def model_is_current(model_path: str, inputs, dataset=None, params=None, precision="auto", skip_nonfinite=False,
                     fill_missing_chunks=False) -> bool:
    """Whether ``model_path`` holds the model a fit of ``inputs`` with these options would write: the
    same sources (fingerprints), precision, NaN handling and parameters. Then there is nothing to do."""
    from .errors import ModelFileError
    from .fit import open_sources
    from .io import fingerprint
    from .model import load_model, model_checksum

    try:
        model = load_model(model_path)
    except ModelFileError:
        return False
    recorded = tuple(model.info.get(key) for key in ("precision", "skip_nonfinite", "fill_missing_chunks"))
    if recorded != (precision, bool(skip_nonfinite), bool(fill_missing_chunks)):
        return False
    sources = open_sources(inputs, dataset, fill_missing_chunks)
    try:
        if [fingerprint(source) for source in sources] != model.sources:
            return False
    finally:
        for source in sources:
            source.close()
    # A fit writes the defaults for every parameter it is not given.
    from .model import DEFAULT_EPS

    wanted = model.with_params(**{"beta": 1.0, "gamma": 1.0, "eps": DEFAULT_EPS, "n_components": None,
                                  "variance": None, **(params or {})})
    return model_checksum(wanted) == model_checksum(model)


def save_fitted(model, job, model_path: str, checkpoint: str, should_stop=None) -> str:
    """Save the model of a finished fit, then remove its checkpoint; returns the model's checksum.

    When a stop was asked for (a signal during the fit's last block or its finalize), the finished
    job is checkpointed instead and :class:`InterruptedRunError` raised: the next run only finalizes
    and saves. A signal during the save itself lets the save finish (the file is whole or absent).
    """
    from .fit import remove_checkpoint, save_checkpoint
    from .model import save_model

    if should_stop is not None and should_stop():
        save_checkpoint(job, checkpoint)
        raise InterruptedRunError(f"interrupted before the model was saved; the finished fit is in {checkpoint} "
                                  "(run the same command again to save it)")
    checksum = save_model(model, model_path)
    remove_checkpoint(checkpoint)
    return checksum


# ------------------------------------------------------------------------------------------- job files


@contextmanager
def job_lock(path: str):
    """Hold an exclusive lock on ``path`` (released by the OS even if the process is killed)."""
    try:
        handle = open(path, "a+")
    except OSError as exc:
        raise StoreIOError(f"{path}: cannot open the lock file: {exc.strerror or exc}") from exc
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise LockedError(f"{path}: another run of this job is in progress (pid {holder}); not starting a second one") from None
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(str(os.getpid()))
            handle.flush()
        except OSError as exc:
            raise StoreIOError(f"{path}: cannot write the lock file: {exc.strerror or exc}") from exc
        yield
    finally:
        try:
            handle.close()
        except OSError:
            pass  # the pid written into it is informative only; the lock goes with the descriptor


#: Keys a job file may hold, with the type each value must have.
_KEYS = {
    "": {"name": str, "input": dict, "model": dict, "apply": dict},
    "input": {"paths": (list, str), "dataset": str, "fill_missing_chunks": bool},
    "model": {"path": str, "beta": (int, float), "gamma": (int, float), "n_components": int, "variance": (int, float),
              "eps": (int, float), "precision": str, "chunk_rows": int, "skip_nonfinite": bool,
              "checkpoint_every": int, "checkpoint_seconds": (int, float), "threads": int},
    "apply": {"output": str, "normalize": bool, "dtype": str, "zarr_format": int, "chunk_rows": int,
              "skip_nonfinite": bool, "threads": int, "direct_io": bool, "keep_columns": (list, str),
              "compressor": str},
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
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise BadInputError(f"{path}: job file not found") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BadInputError(f"{path}: not a valid TOML job file ({exc})") from None
    for section, allowed in _KEYS.items():
        table = data if section == "" else data.get(section, {})
        where = f"[{section}]" if section else "the top level"
        unknown = set(table) - set(allowed)
        if unknown:
            raise BadInputError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} in {where}")
        for key, kind in allowed.items():
            value = table.get(key)
            wrong_bool = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
            if value is not None and (wrong_bool or not isinstance(value, kind)):
                names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
                raise BadInputError(f"{path}: {key} in {where} must be of type {names}, got {value!r}")
        for key in ("threads", "chunk_rows", "checkpoint_every"):
            if table.get(key) is not None and table[key] < 1:
                raise BadInputError(f"{path}: {key} in {where} must be a whole number of at least 1, got {table[key]}")
        if table.get("checkpoint_seconds") is not None and not table["checkpoint_seconds"] > 0:
            raise BadInputError(f"{path}: checkpoint_seconds in {where} must be a number of seconds above 0, "
                                f"got {table['checkpoint_seconds']}")
    base = os.path.dirname(os.path.abspath(path))
    absolute = lambda p: p if os.path.isabs(p) else os.path.join(base, p)  # noqa: E731
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
        if apply.get("dtype", "float32") not in ("float32", "float16"):
            raise BadInputError(f"{path}: dtype in [apply] must be \"float32\" or \"float16\", got {apply['dtype']!r}")
        if apply.get("compressor", "none") not in ("none", "zstd", "blosc", "gzip"):
            raise BadInputError(f"{path}: compressor in [apply] must be \"none\", \"zstd\", \"blosc\" or \"gzip\", "
                                f"got {apply['compressor']!r}")
        apply = dict(apply, output=absolute(apply["output"]))
    name = str(data.get("name") or os.path.splitext(os.path.basename(path))[0])
    return JobSpec(path, name, [absolute(p) for p in inputs], data.get("input", {}).get("dataset"),
                   absolute(model.pop("path")), model, apply, bool(data.get("input", {}).get("fill_missing_chunks")))


#: The fields an ``[apply] output`` template may use.
OUTPUT_FIELDS = "{stem} (the input's file name without extension) and {name} (the job's name)"


def _check_output_template(path: str, template: str) -> None:
    """Refuse an ``[apply] output`` template that :func:`_output_for` could not fill, naming the bad field."""
    where = f"{path}: output in [apply] ({template!r})"

    def fields(text):
        for _, name, spec, _ in string.Formatter().parse(text):
            if name is not None:
                yield name
                yield from fields(spec)  # a field nested in a format spec, as in {stem:{width}}

    try:
        names = list(fields(template))
    except ValueError as exc:  # unbalanced braces
        raise BadInputError(f"{where}: not a valid template ({exc}; write a literal brace as {{{{ or }}}}); "
                            f"the fields are {OUTPUT_FIELDS}") from None
    for name in names:
        if name == "" or name.isdigit():
            raise BadInputError(f"{where}: positional field {{{name}}} is not allowed; the fields are {OUTPUT_FIELDS}")
        if name not in ("stem", "name"):
            raise BadInputError(f"{where}: unknown field {{{name}}}; the fields are {OUTPUT_FIELDS}")
    try:
        template.format(stem="stem", name="name")
    except ValueError as exc:  # a format spec or conversion that does not apply to a string
        raise BadInputError(f"{where}: cannot be filled in ({exc}); the fields are {OUTPUT_FIELDS}") from None


def _output_for(template: str, input_spec: str, job_name: str) -> str:
    from .io import split_spec

    path, _ = split_spec(input_spec)
    stem = os.path.splitext(os.path.basename(path.rstrip("/")))[0]
    return template.format(stem=stem, name=job_name)


def _finish_pending(spec: JobSpec, inputs: list, checkpoint: str, params: dict, progress, should_stop) -> bool:
    """Complete a fit or update a killed run left in ``checkpoint`` and save the model; True if it did.

    A checkpoint is self-contained (its state and the rows each source still owes), so it is finished
    as it was planned, whatever inputs appeared since; those are picked up by the next update. A
    checkpoint that does not belong to the current model (or whose sources changed) is discarded.
    """
    from .errors import ModelFileError
    from .fit import check_sources_unchanged, load_checkpoint, remove_checkpoint, run_job
    from .model import finalize, load_model

    try:
        job = load_checkpoint(checkpoint)
    except ModelFileError as exc:
        raise BadInputError(f"{exc}") from None  # the message says how to start over (run --restart)
    previous = load_model(spec.model_path) if os.path.exists(spec.model_path) else None
    model_rows = previous.n_rows if previous is not None else 0
    if job.done and job.state.n_rows == model_rows and job.base_rows != model_rows:
        # killed after saving the model, before removing the checkpoint: the model already holds it
        remove_checkpoint(checkpoint)
        return False
    try:
        if job.base_rows != model_rows:
            raise BadInputError("it was made for another version of the model")
        wanted = {_identity(spec_) for spec_ in inputs}
        if any(_identity(cursor.spec) not in wanted for cursor in job.cursors):
            raise BadInputError("it reads inputs this job no longer lists")
        options = (spec.model.get("precision", "auto"), bool(spec.model.get("skip_nonfinite", False)),
                   spec.fill_missing_chunks)
        if (job.precision, job.skip_nonfinite, job.fill_missing_chunks) != options:
            raise BadInputError("it was made with other options (precision, skip_nonfinite, fill_missing_chunks)")
        check_sources_unchanged(job, checkpoint)
    except BadInputError as exc:
        log.warning("job %s: discarding checkpoint %s: %s", spec.name, checkpoint, exc)
        remove_checkpoint(checkpoint)
        return False
    log.info("job %s: finishing the interrupted run in %s (%s of %s rows done)", spec.name, checkpoint,
             f"{job.rows_done:,}", f"{job.rows_total:,}")
    fit_options = {k: spec.model[k] for k in ("checkpoint_every", "checkpoint_seconds") if k in spec.model}
    job = run_job(job, progress, checkpoint, fit_options.get("checkpoint_every", 20),
                  fit_options.get("checkpoint_seconds", 60.0), should_stop, spec.model.get("threads"))
    params = _effective_params(params, previous)
    skipped = (int(previous.info.get("n_skipped_nonfinite", 0)) if previous is not None and job.base_rows else 0)
    model = finalize(job.state, sources=job.sources + job.kept_sources,
                     info=fit_info(job, skipped + job.n_skipped), **params)
    save_fitted(model, job, spec.model_path, checkpoint, should_stop)
    return True


def _identity(spec: str) -> tuple:
    from .io import open_source

    with open_source(spec, min_rows=0) as source:
        return source.identity


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


def run_job_file(path: str, progress=None, should_stop=None, restart: bool = False) -> dict:
    """Run a job file: fit or update, finalize, apply; each step skipped when already up to date.

    A run that was killed is finished first (from its checkpoint); ``restart`` discards it instead.
    Returns a summary with ``steps`` (what ran). Raises :class:`NothingToDoError` when nothing ran.
    """
    from .apply import apply_model, check_keep_columns, output_is_current, recorded_options
    from .fit import remove_checkpoint
    from .model import check_params, load_model, model_checksum, save_model
    from .io import expand_specs, fingerprint, open_source, refuse_input_overlap, refuse_shared_outputs, split_spec

    spec = read_job_file(path)
    fit_options = {key: spec.model[key] for key in ("precision", "chunk_rows", "skip_nonfinite",
                                                    "checkpoint_every", "checkpoint_seconds", "threads")
                   if key in spec.model}
    params = {key: spec.model[key] for key in ("beta", "gamma", "n_components", "variance", "eps") if key in spec.model}
    check_params(**params)
    os.makedirs(os.path.dirname(spec.model_path), exist_ok=True)
    steps = []
    with job_lock(spec.lock_path):
        log.info("job %s: lock %s taken", spec.name, spec.lock_path)
        inputs = expand_specs(spec.inputs)
        outputs, stores_used = {}, {}
        if spec.apply is not None:
            for input_spec in inputs:
                output = _output_for(spec.apply["output"], input_spec, spec.name)
                store = os.path.realpath(split_spec(output)[0])  # each output is a whole file or store
                if store in stores_used:
                    raise BadInputError(f"{spec.path}: [apply] output '{spec.apply['output']}' puts two inputs in "
                                        f"{store}; each input needs its own file or store (e.g. 'out/{{stem}}.zarr')")
                stores_used[store] = input_spec
                outputs[input_spec] = output
        checkpoint = default_checkpoint(spec.model_path)
        refuse_input_overlap({spec.model_path: "model file", checkpoint: "checkpoint", spec.lock_path: "lock file",
                              **{output: "[apply] output" for output in outputs.values()}}, [spec.path, *inputs])
        refuse_shared_outputs((spec.model_path, "model file"), (checkpoint, "checkpoint"), (spec.lock_path, "lock file"),
                              *((output, "[apply] output") for output in outputs.values()))
        if restart:
            remove_checkpoint(checkpoint)
        elif os.path.exists(checkpoint) and _finish_pending(spec, inputs, checkpoint, params, progress, should_stop):
            steps.append("resume")
        exists = os.path.exists(spec.model_path)
        try:
            model, job, resumed, checkpoint = fit_job(
                inputs, spec.model_path, spec.dataset, params, update=spec.model_path if exists else None,
                progress=progress, should_stop=should_stop, fill_missing_chunks=spec.fill_missing_chunks,
                **fit_options)
            save_fitted(model, job, spec.model_path, checkpoint, should_stop)
            steps.append("update" if exists else "fit")
            log.info("job %s: %s %s with %s rows", spec.name, "updated" if exists else "fitted", spec.model_path,
                     f"{job.rows_done:,}")
        except NothingToDoError:
            model = load_model(spec.model_path)
            log.info("job %s: model %s is up to date with its inputs", spec.name, spec.model_path)
            wanted = model.with_params(**params) if params else model
            if model_checksum(wanted) != model_checksum(model):
                save_model(wanted, spec.model_path)
                steps.append("finalize")
                log.info("job %s: re-finalized %s with the job's parameters", spec.name, spec.model_path)
            model = wanted
        if spec.apply is not None:
            checksum = model_checksum(model)
            options = {key: spec.apply[key] for key in ("normalize", "dtype", "zarr_format", "skip_nonfinite", "threads",
                                                        "direct_io", "keep_columns", "compressor") if key in spec.apply}
            if "chunk_rows" in spec.apply:
                options["block_rows"] = spec.apply["chunk_rows"]
            for input_spec, output in outputs.items():
                with open_source(input_spec, spec.dataset, fill_missing_chunks=spec.fill_missing_chunks) as source:
                    source_sha = fingerprint(source)["sha256_sampled"]
                    label = source.label
                recorded = recorded_options(output, options.get("skip_nonfinite", False), spec.fill_missing_chunks,
                                            options.get("zarr_format", 3), options.get("compressor", "none"))
                if output_is_current(output, checksum, source_sha, options.get("normalize", False),
                                     options.get("dtype", "float32"), recorded,
                                     check_keep_columns(options.get("keep_columns"))):
                    log.info("job %s: %s is up to date", spec.name, output)
                    continue
                os.makedirs(os.path.dirname(os.path.abspath(split_spec(output)[0])), exist_ok=True)
                summary = apply_model(model, input_spec, output, spec.dataset, overwrite=True, progress=progress,
                                      should_stop=should_stop, fill_missing_chunks=spec.fill_missing_chunks, **options)
                steps.append(f"apply {label} -> {output}")
                log.info("job %s: wrote %s (%s rows%s)", spec.name, summary["output"], f"{summary['n_rows']:,}",
                         f", resumed at row {summary['resumed_at_row']:,}" if summary["resumed_at_row"] else "")
    if not steps:
        raise NothingToDoError(f"nothing to do: job {spec.name} is up to date")
    return {"job": spec.name, "model": spec.model_path, "steps": steps}
