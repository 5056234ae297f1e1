"""``run`` of a job with a ``[publish]`` table: versioned outputs that cost what the night added.

Version N (``job.manifest``) is written with the map of ``M.vN.npz``. Each run checks the manifest, fits
or updates the statistics, then publishes version 1 (``fit``) or a new version (``republish``: stale map,
``--republish`` or another setting), appends each input's new rows as parts of version N (``append``), or
has nothing to do (exit 3). Outputs are written beside the current version, then the manifest is switched
by one atomic rename; every part is a resumable apply of input rows, so a killed run run again ends with
the same bytes. A run deletes or replaces only files proving this job wrote them (``job.ownership``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from ..errors import BadInputError, InterruptedRunError, StoreIOError
from ..options import ReadOptions
from ..progress import Watch
from ..records import Manifest, Part, PublishedInput, Version
from .file import JobFile, Writing
from .manifest import manifest_path, read_manifest, version_model_path, versioned_output, write_manifest
from .ownership import (
    PUBLICATION_INFO,
    check_model_file,
    check_outputs,
    first_job_id,
    job_id_problem,
    model_owner_problem,
    output_owner_problem,
    part_attrs,
)
from .report import JobUpToDateError, PublishReport
from .steps import (
    apply_unless_current,
    check_paths,
    fit_step,
    job_lock,
    record_code,
    statistics_before,
    stored_bytes,
)

log = logging.getLogger("streamwhiten")


@dataclass
class _Night:
    """One run: how it reports its progress and is asked to stop, and what it did (for its report)."""

    watch: Watch = Watch()
    steps: list = field(default_factory=list)
    bytes_written: int = 0


@dataclass(frozen=True)
class _Publisher:
    """What a publication's steps use of the job: name, id, model file, reading, writing, template, versions."""

    name: str
    job_id: str
    model_path: str
    read: ReadOptions
    writing: Writing
    template: str
    keep_versions: int


def run_published(
    job: JobFile,
    watch: Watch = Watch(),
    restart: bool = False,
    republish: bool = False,
    new_job: bool = False,
) -> PublishReport:
    """Run ``job`` (with ``[publish]``): update the statistics, then publish, append or raise `JobUpToDateError`
    (carrying the report); a folder whose manifest it did not publish is refused unless ``new_job``."""
    assert job.publish is not None and job.apply is not None and job.output is not None
    began = time.perf_counter()
    os.makedirs(os.path.dirname(job.model_path), exist_ok=True)
    night = _Night(watch)
    with job_lock(job.lock_path):
        log.info("job %s: lock %s taken", job.name, job.lock_path)
        manifest = read_manifest(job.model_path)
        job_id = _identity(job.model_path, manifest, new_job)
        publisher = _Publisher(
            job.name, job_id, job.model_path, job.read, job.writing, job.output, job.publish.keep_versions
        )
        published, manifest = _check_claims(job, publisher, manifest, republish)
        inherited = manifest is not None and _inherited(manifest, job_id)
        inputs, outputs = job.inputs_and_outputs()
        check_paths([job.path, *inputs], {**job.own_files, **_versioned_files(job.model_path, outputs, manifest)})
        _check_owned(publisher, outputs, manifest)
        _follow_moved_inputs(publisher, manifest, copied=inherited)
        previous = statistics_before(job.model_path)
        model = fit_step(job.name, job.fitting, inputs, night.steps, watch, restart)
        model = record_code(job.name, model, job.writing, inputs, job.model_path, watch.progress)
        rows_added = model.n_rows - (previous.n_rows if previous is not None else 0)
        # the fit step checked these records against the inputs (unless it finished a killed run's checkpoint)
        checked = previous.sources if previous is not None and "resume" not in night.steps else ()
        action, reason, staleness = _decide(job, manifest, published, model, inherited, republish)
        if action in ("fit", "republish"):
            manifest = _publish(publisher, model, inputs, outputs, manifest, night)
            log.info("job %s: published version %s (%s)", job.name, manifest.version, reason)
        else:
            assert manifest is not None
            manifest = _append(publisher, model, published, inputs, outputs, manifest, night, checked)
            _abandon(publisher, manifest.version + 1, outputs)
            if not night.steps:  # every part written is a step too
                action = "nothing"
    report = _report(job, night, manifest, rows_added, began, (action, reason, staleness))
    if action == "nothing":
        raise JobUpToDateError(
            f"nothing to do: job {job.name} is up to date (published version {manifest.version})", report
        )
    return report


def _report(
    job: JobFile, night: _Night, manifest: Manifest, rows_added: int, began: float, decision: tuple
) -> PublishReport:
    """What the run did: ``decision`` is `_decide`'s ``(action, reason, staleness)``, the action as done."""
    assert job.publish is not None
    action, reason, staleness = decision
    return PublishReport(
        job=job.name,
        model=job.model_path,
        steps=tuple(night.steps),
        rows_added=int(rows_added),
        outputs=tuple(manifest.outputs),
        bytes_written=int(night.bytes_written),
        seconds=time.perf_counter() - began,
        action=action,
        reason=reason,
        published_version=manifest.version,
        staleness=staleness,
        max_staleness=job.publish.max_staleness,
        manifest=manifest_path(job.model_path),
        rows_published=sum(item.stop for item in manifest.inputs),
    )


def _decide(
    job: JobFile, manifest: Manifest | None, published: Any, model: Any, inherited: bool, republish: bool
) -> tuple[str, str | None, Any]:
    """``(action, reason, staleness)``: ``fit``, ``republish`` or ``append`` (`_why_republish` says why)."""
    if manifest is None:
        return "fit", "first publication", None
    if inherited:
        return "republish", "a new job: published under this folder's own identity", None
    from ..core.staleness import staleness as measure

    assert job.publish is not None and job.output is not None
    # the updated statistics' eigenvectors are the refit's where the angle needs them: no second eigh
    staleness = measure(published, model)
    wanted = setting_of(model, job.writing, job.output)
    reason = _why_republish(manifest, wanted, staleness, job.publish.max_staleness, republish)
    return ("republish" if reason else "append"), reason, staleness


def _identity(model_path: str, manifest: Manifest | None, new_job: bool) -> str:
    """The identity this run writes and deletes by: the manifest's, checked against this folder; else this
    folder's own (first publication, earlier format, ``new_job``); a folder not the publisher is refused."""
    if manifest is None or manifest.legacy:
        return first_job_id(model_path)
    assert manifest.job_id is not None
    problem = job_id_problem(model_path, manifest.job_id)
    if problem is None and new_job:
        raise BadInputError(
            f"{manifest_path(model_path)}: this folder is already the job that published version "
            f"{manifest.version}; new_job=True is for a copy of a job's folder, or one moved to another file system",
            param="new_job",
        )
    if problem is None:
        return manifest.job_id
    if not new_job:
        raise BadInputError(
            f"{manifest_path(model_path)}: {problem}: a copy of a job's folder, a folder moved to another file "
            "system or restored from a backup elsewhere, or a manifest edited by hand; nothing was changed. If "
            "this folder is a job of its own, run it once with new_job=True: it publishes a new version as this "
            "folder's job and never deletes a file of the other",
            param="new_job",
        )
    return first_job_id(model_path)


def _check_claims(
    job: JobFile, publisher: _Publisher, manifest: Manifest | None, republish: bool
) -> tuple[Any, Manifest | None]:
    """The manifest's claims, checked before anything is written (model file, parts unless ``republish``, what it
    retires); returns the published model and the manifest (an inherited one unchecked: none of it is ours)."""
    if manifest is None:
        return None, None
    if _inherited(manifest, publisher.job_id):
        directory = os.path.dirname(os.path.abspath(job.model_path))
        older = (manifest.as_version, *manifest.kept)
        log.warning(
            "job %s: a new job: the files of version %s and earlier, which this folder's manifest names, "
            "belong to the job it was copied from and are never deleted by this one: %s",
            job.name,
            manifest.version,
            ", ".join(path for item in older for path in (*item.outputs, os.path.join(directory, item.model_file))),
        )
        _warn_shared(job, manifest)
        return None, manifest
    published = check_model_file(job.model_path, manifest)
    if not republish:
        manifest = check_outputs(job.model_path, manifest, job.apply_read)
    if not manifest.legacy:
        _delete_retired(manifest.retired, publisher, check_first=True)
    return published, manifest


def _inherited(manifest: Manifest, job_id: str) -> bool:
    """Whether ``manifest`` is that of the job this folder was copied from: its files are never this job's."""
    return not manifest.legacy and manifest.job_id != job_id


def _warn_shared(job: JobFile, manifest: Manifest) -> None:
    """Warn a new job whose output template is its original's, outside its folder: both write the same files."""
    from ..io import remote

    template = job.output or ""
    if remote.is_url(template) or manifest.setting.get("output") != template:
        return
    folder = os.path.realpath(os.path.dirname(os.path.abspath(job.path)))
    if os.path.commonpath([folder, os.path.realpath(os.path.dirname(template))]) != folder:
        log.warning(
            "job %s: its [apply] output %s is outside its folder and the same as the job it was copied from: "
            "both write the same files; give this job its own output template",
            job.name,
            template,
        )


def setting_of(model: Any, writing: Writing, template: str) -> dict:
    """What a job's outputs are written with, as a manifest records it (another publishes a new version): the
    whitening's parameters as given, the ``[apply]`` options that change what is written, the ``template``."""
    options = writing.options
    return {
        "beta": float(model.beta),
        "gamma": float(model.gamma),
        "eps": float(model.eps),
        "variance": None if model.variance is None else float(model.variance),
        "n_components": None if model.variance is not None else int(model.n_components),
        "normalize": bool(options.normalize),
        "dtype": str(options.dtype),
        "zarr_format": int(options.zarr_format),
        "compressor": str(options.compressor),
        "keep_columns": list(options.keep_columns),
        "skip_nonfinite": bool(options.skip_nonfinite),
        "fill_missing_chunks": bool(writing.read.fill_missing_chunks),
        "output": template,
    }


def _why_republish(
    manifest: Manifest, wanted: dict, staleness: Any, max_staleness: float, requested: bool
) -> str | None:
    """Why a new version is due (None: it is not): ``wanted`` is the job's setting now (`setting_of`)."""
    if requested:
        return "republish requested"
    if manifest.legacy:
        return "the manifest was written by an earlier release (format 1): its files record no job"
    changed = sorted(key for key in set(manifest.setting) | set(wanted) if manifest.setting.get(key) != wanted.get(key))
    if changed:
        return f"the job's setting changed ({', '.join(changed)})"
    if staleness.exceeds(max_staleness):
        return f"staleness {staleness.total:.3g} > max_staleness {max_staleness:g}"
    return None


@dataclass(frozen=True)
class _Input:
    """An input of the job now: its spec, output, the rows the statistics hold and their fingerprint."""

    spec: str
    output: str
    stop: int
    source: object  # Fingerprint of rows [0, stop)


def _current_inputs(
    read: ReadOptions,
    model: Any,
    inputs: list,
    outputs: dict,
    manifest: Manifest | None = None,
    checked: Sequence[Any] = (),
) -> list:
    """Each input with the rows the statistics hold of it (what a version publishes); one ``manifest`` lists
    must still start with its published rows, unless this run's fit step checked them (``checked``)."""
    from ..engine.fit import check_prefix
    from ..io import describe, fingerprint, identity_of, open_source

    found = []
    for spec in inputs:
        with open_source(spec, read=read, min_rows=0) as source:
            recorded, prior = (
                next((item for item in records if identity_of(item.path, item.dataset or "") == source.identity), None)
                for records in (model.sources, checked)
            )
            stop = int(recorded.n_rows) if recorded is not None and recorded.n_rows else 0
            entry = manifest.input(spec) if manifest is not None else None
            if entry is not None:
                if entry.source != prior:  # else the fit step checked these very rows
                    check_prefix(source, entry.source)
                if stop < entry.stop:
                    raise BadInputError(
                        f"{source.label}: the statistics hold {stop:,} of its rows but {entry.stop:,} were "
                        "published; run with republish=True to publish a new version from them",
                        param="republish",
                    )
            if stop > source.n_rows:
                raise BadInputError(
                    f"{source.label}: has {source.n_rows} rows but the statistics hold {stop} of it; the input "
                    "was changed, not appended to"
                )
            # the recorded fingerprint where it still describes the rows as stored now
            if stop and recorded is not None and replace(recorded, sha256_sampled=None) != describe(source, stop):
                recorded = fingerprint(source, stop)
            found.append(_Input(spec, outputs[spec], stop, recorded if stop else None))
    return found


def _versioned_files(model_path: str, outputs: dict, manifest: Manifest | None) -> dict[str, str]:
    """The files this night may write (manifest, model files, next parts), each with what it is."""
    version = 1 if manifest is None else manifest.version
    written = {
        manifest_path(model_path): "manifest",
        version_model_path(model_path, version): "published model file",
        version_model_path(model_path, version + 1): "published model file",
    }
    for spec, output in outputs.items():
        item = manifest.input(spec) if manifest is not None else None
        written[versioned_output(output, version + 1, 0)] = "[apply] output"
        written[versioned_output(output, version, len(item.parts) if item else 0)] = "[apply] output"
    return written


def _check_owned(publisher: _Publisher, outputs: dict, manifest: Manifest | None) -> None:
    """Refuse, before any work, a file where this night may write that is not this job's of that version."""
    version = 1 if manifest is None else manifest.version
    publishing = version + (manifest is not None)  # the version a republish (or the first run) writes
    model_file = version_model_path(publisher.model_path, publishing)
    candidates: list[tuple[str, str | None, int]] = [(model_file, None, publishing)]
    appending = manifest is None or manifest.job_id == publisher.job_id  # else this night republishes
    for spec, output in outputs.items():
        item = manifest.input(spec) if manifest is not None else None
        if manifest is not None:
            candidates.append((versioned_output(output, publishing, 0), spec, publishing))
        if appending:
            candidates.append((versioned_output(output, version, len(item.parts) if item else 0), spec, version))
    for path, spec, number in candidates:
        if spec is None:
            problem = model_owner_problem(path, publisher.job_id, number)
        else:
            problem = output_owner_problem(path, publisher.writing.read, publisher.job_id, number, spec)
        if problem is not None:
            raise BadInputError(
                f"{path}: {problem}; this job writes version {number} there and replaces only its own files: "
                "move it away, or give the job another [apply] output template"
            )


def _follow_moved_inputs(publisher: _Publisher, manifest: Manifest | None, copied: bool = False) -> None:
    """Point the statistics' records of moved inputs at those the manifest names now: only an input of the same
    name, array, width and type holding the very rows recorded (``copied``: a new job follows its copies)."""
    from ..core.model import load_model, save_model
    from ..io import fingerprint, open_source, remote

    before = statistics_before(publisher.model_path)
    if before is None or manifest is None or manifest.legacy:
        return
    recorded = {source.path for source in before.sources}
    moved: dict = {}
    for record in before.sources:
        if record.path is None or remote.is_url(record.path) or (os.path.lexists(record.path) and not copied):
            continue
        for item in manifest.inputs:
            new = item.source.path
            if new is None or remote.is_url(new) or new in recorded or new in moved.values():
                continue
            same = (item.source.dataset, item.source.n_features, item.source.dtype)
            if same != (record.dataset, record.n_features, record.dtype):
                continue
            if os.path.basename(new) != os.path.basename(record.path) or not os.path.exists(new):
                continue
            spec = f"{new}:{record.dataset}" if record.dataset else new
            with open_source(spec, read=publisher.read, min_rows=0) as source:
                short = record.n_rows is None or source.n_rows < record.n_rows
                if short or fingerprint(source, record.n_rows).sha256_sampled != record.sha256_sampled:
                    continue
            moved[record.path] = new
            break
    if not moved:
        return
    model = load_model(publisher.model_path)
    sources = tuple(replace(item, path=moved.get(item.path, item.path)) for item in model.sources)
    save_model(replace(model, sources=sources), publisher.model_path)
    for old, new in moved.items():
        log.info(
            "job %s: input %s was moved to %s with the job's folder; the statistics follow it", publisher.name, old, new
        )


def _write_part(
    publisher: _Publisher, model: Any, spec: str, part: str, rows: tuple, night: _Night, version: int
) -> Part:
    """Write input rows ``rows`` of ``spec`` as the part ``part`` of ``version`` unless it is there already (a
    file there not this job's is refused); returns the manifest's record of the part, with its stamp."""
    from ..io import open_output

    read = publisher.writing.read
    output = open_output(part, read)
    stamp = output.stamp()  # before the check: a change after it shows as another stamp
    problem = output_owner_problem(part, read, publisher.job_id, version, spec)
    if problem is not None:
        raise BadInputError(f"{part}: {problem}; this job replaces only its own files: move it away")
    outcome = apply_unless_current(
        publisher.name,
        model,
        spec,
        part,
        publisher.writing,
        rows=rows,
        attrs=part_attrs(publisher.job_id, version, spec, part),
        watch=night.watch,
    )
    if outcome is None:
        return Part(part, rows[0], rows[1], stamp)
    night.bytes_written += stored_bytes(part, read)
    night.steps.append(f"apply {outcome.input} rows {rows[0]}..{rows[1] - 1} -> {part}")
    return Part(part, rows[0], rows[1], output.stamp())


def _now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _publish(publisher: _Publisher, model: Any, inputs: list, outputs: dict, manifest: Any, night: _Night) -> Manifest:
    """Publish version N+1: every part 0 and the model file, the manifest switch, then retire old versions."""
    from ..core.model import file_checksum, load_model, map_checksum, save_model

    version = 1 if manifest is None else manifest.version + 1
    kept, retired = (), ()
    if manifest is not None and manifest.legacy:
        log.warning(
            "job %s: the files of version %s (published by an earlier release) record no job and are not "
            "deleted: remove them by hand once no reader needs them",
            publisher.name,
            manifest.version,
        )
    elif manifest is not None and not _inherited(manifest, publisher.job_id):
        older = (manifest.as_version, *manifest.kept)
        kept = older[: publisher.keep_versions - 1]
        retired = (*older[publisher.keep_versions - 1 :], *_still_there(manifest.retired, publisher))
        _delete_retired(retired, publisher, check_only=True)  # before writing: refuse, not skip
    published = []
    for item in _current_inputs(publisher.read, model, inputs, outputs):
        if item.stop == 0:
            continue  # nothing of it in the statistics yet
        part = versioned_output(item.output, version, 0)
        written = _write_part(publisher, model, item.spec, part, (0, item.stop), night, version)
        published.append(PublishedInput(item.spec, item.output, item.source, (written,)))
    if night.watch.stop_asked():
        raise InterruptedRunError(
            f"interrupted before publishing version {version}; run the same command again to finish"
        )
    model_file = version_model_path(publisher.model_path, version)
    # the published copy records its job and version: what lets a later run delete it, and no other file
    tagged = replace(model, info={**model.info, PUBLICATION_INFO: {"job": publisher.job_id, "version": version}})
    problem = model_owner_problem(model_file, publisher.job_id, version)
    if problem is not None:
        raise BadInputError(f"{model_file}: {problem}; this job replaces only its own files: move it away")
    if not (os.path.exists(model_file) and file_checksum(load_model(model_file)) == file_checksum(tagged)):
        save_model(tagged, model_file)  # a leftover of a run cut short, of other statistics, is replaced
    new = Manifest(
        version=version,
        model_file=os.path.basename(model_file),
        file_checksum=file_checksum(tagged),
        model_checksum=map_checksum(model),
        published_at=_now(),
        n_rows=model.n_rows,
        setting=setting_of(model, publisher.writing, publisher.template),
        inputs=tuple(published),
        kept=kept,
        retired=retired,
        job_id=publisher.job_id,
    )
    write_manifest(publisher.model_path, new)
    night.steps.append(f"publish version {version}")
    _delete_retired(new.retired, publisher)
    return new


def _append(
    publisher: _Publisher,
    model: Any,
    published_model: Any,
    inputs: list,
    outputs: dict,
    manifest: Manifest,
    night: _Night,
    checked: Sequence[Any] = (),
) -> Manifest:
    """Append each input's new rows as parts of the current version (``published_model``'s map), then switch."""
    updated = {item.spec: item for item in manifest.inputs}  # in the manifest's order, a new input last
    for item in _current_inputs(publisher.read, model, inputs, outputs, manifest, checked):
        earlier = updated[item.spec].parts if item.spec in updated else ()
        start = earlier[-1].stop if earlier else 0
        if item.stop <= start:
            continue
        part = versioned_output(item.output, manifest.version, len(earlier))
        written = _write_part(publisher, published_model, item.spec, part, (start, item.stop), night, manifest.version)
        updated[item.spec] = PublishedInput(item.spec, item.output, item.source, (*earlier, written))
    if all(entry is manifest.input(spec) for spec, entry in updated.items()):
        # nothing new: the manifest stays as it is (retired versions deleted since are dropped at the next switch)
        return manifest
    retired = _still_there(manifest.retired, publisher)
    if night.watch.stop_asked():
        raise InterruptedRunError("interrupted before the manifest was updated; run the same command again to finish")
    new = replace(manifest, inputs=tuple(updated.values()), updated_at=_now(), retired=retired)
    write_manifest(publisher.model_path, new)
    night.steps.append(f"append to version {manifest.version}")
    return new


def _still_there(retired: Any, publisher: _Publisher) -> tuple:
    """The retired versions some of whose files (an output's store, the model file) are still there."""
    from ..io import exists, split_spec

    directory = os.path.dirname(os.path.abspath(publisher.model_path))

    def files(version: Version) -> list[str]:
        return [*(split_spec(spec)[0] for spec in version.outputs), os.path.join(directory, version.model_file)]

    return tuple(version for version in retired if any(exists(path, publisher.writing.read) for path in files(version)))


def _remove(spec: str, read: ReadOptions) -> None:
    """Remove an output (its ownership proven by the caller)."""
    from ..io import remote, remove, split_spec

    path = split_spec(spec)[0]
    if remote.is_url(path):
        remote.remove(path, recursive=True, read=read)
    else:
        remove(path)


def _delete_retired(retired: Any, publisher: _Publisher, check_first: bool = False, check_only: bool = False) -> None:
    """Delete retired versions' files, each only if it records this job, version and map; ``check_first`` or
    ``check_only``: one that does not is refused, nothing deleted (else left with a warning)."""
    from ..io import exists, split_spec

    found = []
    directory = os.path.dirname(os.path.abspath(publisher.model_path))
    for version in retired:
        files = []
        for spec in version.outputs:
            if not exists(split_spec(spec)[0], publisher.writing.read):  # whatever dataset or column it names
                continue
            problem = output_owner_problem(
                spec, publisher.writing.read, publisher.job_id, version.version, model_checksum=version.model_checksum
            )
            files.append((spec, problem, False))
        model_file = os.path.join(directory, version.model_file)
        if os.path.lexists(model_file):
            files.append((model_file, model_owner_problem(model_file, publisher.job_id, version.version), True))
        found.append((version, files))
    refused = [
        (version, path, problem) for version, files in found for path, problem, _ in files if problem is not None
    ]
    if (check_first or check_only) and refused:
        version, path, problem = refused[0]
        raise BadInputError(
            f"{manifest_path(publisher.model_path)}: retires version {version.version}, which lists {path}: "
            f"{problem}; nothing was deleted (a run deletes only its own files)"
        )
    if check_only:
        return
    for version, files in found:
        try:
            for path, problem, is_model in files:
                if problem is not None:
                    log.warning("job %s: %s not deleted: %s", publisher.name, path, problem)
                elif is_model:
                    os.remove(path)
                else:
                    _remove(path, publisher.writing.read)
        except (OSError, StoreIOError, BadInputError) as exc:
            log.warning("job %s: could not delete version %s yet: %s", publisher.name, version.version, exc)
            continue
        log.info("job %s: deleted version %s", publisher.name, version.version)


def _abandon(publisher: _Publisher, version: int, outputs: dict) -> None:
    """Remove the parts, partial outputs and model file a cut-short, unpublished ``version`` left (if ours)."""
    from ..io import exists, open_output, remote, remove

    read = publisher.writing.read
    found = False
    for spec, output in outputs.items():
        part = versioned_output(output, version, 0)
        written = open_output(part, read)
        if exists(written.path, read):
            problem = output_owner_problem(part, read, publisher.job_id, version, spec)
            if problem is None:
                _remove(part, read)
                found = True
            else:
                log.warning("job %s: %s left alone: %s", publisher.name, part, problem)
        elif not remote.is_url(part) and os.path.lexists(written.partial):
            # the partial output of an apply cut short (and its progress record): it will not be written
            for path in (written.partial, written.progress_path, written.partial + ".chunks"):
                remove(path)
            found = True
    model_file = version_model_path(publisher.model_path, version)
    if os.path.exists(model_file):
        problem = model_owner_problem(model_file, publisher.job_id, version)
        if problem is None:
            os.remove(model_file)
            found = True
        else:
            log.warning("job %s: %s left alone: %s", publisher.name, model_file, problem)
    if found:
        log.info("job %s: removed what an unpublished version %s, cut short, had begun", publisher.name, version)


__all__ = ["run_published", "setting_of"]
