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
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

from .errors import BadInputError, LockedError, NothingToDoError

log = logging.getLogger("streamwhiten")


def default_checkpoint(model_path: str) -> str:
    """``.MODEL.checkpoint`` beside the model file."""
    head, tail = os.path.split(os.path.abspath(model_path))
    return os.path.join(head, f".{tail}.checkpoint")


def fit_job(inputs, model_path, dataset=None, params=None, precision="auto", chunk_rows=None, skip_nonfinite=False,
            update=None, checkpoint=None, checkpoint_every=20, checkpoint_seconds=60.0, restart=False,
            resume=False, progress=None, should_stop=None):
    """Plan (or update), resume from a matching checkpoint, run and finalize a fit.

    Returns ``(model, job, resumed, checkpoint_path)``; the caller saves the model and then removes the
    checkpoint. ``update`` names a saved model whose statistics are extended with appended rows only.
    """
    from .fit import check_resumable, load_checkpoint, plan_fit, plan_update, run_job
    from .model import finalize, load_model

    params = dict(params or {})
    if update is not None:
        previous = load_model(update)
        for name in ("beta", "gamma", "eps"):
            params.setdefault(name, getattr(previous, name))
        if "n_components" not in params and "variance" not in params:
            if previous.variance is not None:
                params["variance"] = previous.variance
            else:
                params["n_components"] = previous.n_components
        planned = plan_update(previous.state, previous.sources, inputs, dataset, precision, skip_nonfinite, chunk_rows)
        skipped_before = int(previous.info.get("n_skipped_nonfinite", 0))
    else:
        planned = plan_fit(inputs, dataset, precision, skip_nonfinite, chunk_rows)
        skipped_before = 0
    checkpoint = checkpoint or default_checkpoint(model_path)
    resumed = False
    if os.path.exists(checkpoint) and not restart:
        job = load_checkpoint(checkpoint)
        check_resumable(job, planned, checkpoint)
        if job.base_rows != planned.base_rows:
            raise BadInputError(f"{checkpoint}: checkpoint is for another starting model; pass --restart to start over")
        resumed = True
        log.info("resuming from %s: %s of %s rows already done", checkpoint, f"{job.rows_done:,}", f"{job.rows_total:,}")
    elif resume:
        raise BadInputError(f"{checkpoint}: no checkpoint to resume from")
    else:
        job = planned
    job = run_job(job, progress, checkpoint, checkpoint_every, checkpoint_seconds, should_stop)
    info = {"n_skipped_nonfinite": skipped_before + job.n_skipped}
    model = finalize(job.state, sources=job.sources + job.kept_sources, info=info, **params)
    return model, job, resumed, checkpoint


# ------------------------------------------------------------------------------------------- job files


@contextmanager
def job_lock(path: str):
    """Hold an exclusive lock on ``path`` (released by the OS even if the process is killed)."""
    handle = open(path, "a+")
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise LockedError(f"{path}: another run of this job is in progress (pid {holder}); not starting a second one") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()


_KNOWN = {
    "": {"name", "input", "model", "apply"},
    "input": {"paths", "dataset"},
    "model": {"path", "beta", "gamma", "n_components", "variance", "eps", "precision", "chunk_rows", "skip_nonfinite",
              "checkpoint_every", "checkpoint_seconds"},
    "apply": {"output", "normalize", "dtype", "zarr_format", "chunk_rows", "skip_nonfinite"},
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

    @property
    def lock_path(self) -> str:
        return os.path.join(os.path.dirname(self.model_path), f".{self.name}.lock")


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
    for section, allowed in _KNOWN.items():
        table = data if section == "" else data.get(section, {})
        if not isinstance(table, dict):
            raise BadInputError(f"{path}: [{section}] must be a table")
        unknown = set(table) - allowed
        if unknown:
            where = f"[{section}]" if section else "the top level"
            raise BadInputError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} in {where}")
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
        apply = dict(apply, output=absolute(apply["output"]))
    name = str(data.get("name") or os.path.splitext(os.path.basename(path))[0])
    return JobSpec(path, name, [absolute(p) for p in inputs], data.get("input", {}).get("dataset"),
                   absolute(model.pop("path")), model, apply)


def _output_for(template: str, input_spec: str, job_name: str) -> str:
    from .stores import split_spec

    path, _ = split_spec(input_spec)
    stem = os.path.splitext(os.path.basename(path.rstrip("/")))[0]
    return template.format(stem=stem, name=job_name)


def run_job_file(path: str, progress=None, should_stop=None) -> dict:
    """Run a job file: fit or update, finalize, apply; each step skipped when already up to date.

    Returns a summary with ``steps`` (what ran). Raises :class:`NothingToDoError` when nothing ran.
    """
    from .apply import apply_model
    from .fit import remove_checkpoint
    from .model import check_params, load_model, model_checksum, save_model
    from .stores import expand_specs, fingerprint, open_source, read_attrs, split_spec

    spec = read_job_file(path)
    fit_options = {key: spec.model[key] for key in ("precision", "chunk_rows", "skip_nonfinite",
                                                    "checkpoint_every", "checkpoint_seconds") if key in spec.model}
    params = {key: spec.model[key] for key in ("beta", "gamma", "n_components", "variance", "eps") if key in spec.model}
    check_params(**params)
    steps = []
    with job_lock(spec.lock_path):
        log.info("job %s: lock %s taken", spec.name, spec.lock_path)
        inputs = expand_specs(spec.inputs)
        exists = os.path.exists(spec.model_path)
        try:
            model, job, resumed, checkpoint = fit_job(
                inputs, spec.model_path, spec.dataset, params, update=spec.model_path if exists else None,
                progress=progress, should_stop=should_stop, **fit_options)
            save_model(model, spec.model_path)
            remove_checkpoint(checkpoint)
            steps.append("update" if exists else "fit")
            log.info("job %s: %s %s with %s rows%s", spec.name, "updated" if exists else "fitted", spec.model_path,
                     f"{job.rows_done:,}", " (resumed)" if resumed else "")
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
            options = {key: spec.apply[key] for key in ("normalize", "dtype", "zarr_format", "skip_nonfinite") if key in spec.apply}
            if "chunk_rows" in spec.apply:
                options["block_rows"] = spec.apply["chunk_rows"]
            for input_spec in inputs:
                output = _output_for(spec.apply["output"], input_spec, spec.name)
                with open_source(input_spec, spec.dataset) as source:
                    source_sha = fingerprint(source)["sha256_sampled"]
                    label = source.label
                if os.path.exists(split_spec(output)[0]):
                    try:
                        attrs = read_attrs(output)
                    except Exception:  # an unreadable old output is simply rewritten
                        attrs = {}
                    if attrs.get("model_checksum") == checksum and attrs.get("source_sha256") == source_sha:
                        log.info("job %s: %s is up to date", spec.name, output)
                        continue
                summary = apply_model(model, input_spec, output, spec.dataset, overwrite=True, progress=progress,
                                      should_stop=should_stop, **options)
                steps.append(f"apply {label} -> {output}")
                log.info("job %s: wrote %s (%s rows%s)", spec.name, summary["output"], f"{summary['n_rows']:,}",
                         f", resumed at row {summary['resumed_at_row']:,}" if summary["resumed_at_row"] else "")
    if not steps:
        raise NothingToDoError(f"nothing to do: job {spec.name} is up to date")
    return {"job": spec.name, "model": spec.model_path, "steps": steps}
