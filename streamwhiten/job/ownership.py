"""What each published file records of the job that wrote it, and the checks that a file is what the
manifest claims (whose checksum proves integrity, not authorship): a run deletes or replaces only files
that prove it is theirs (`ownership_problem`); readers refuse a part of another input.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from typing import Any

from ..errors import BadInputError, ModelFileError, StoreIOError
from ..options import ReadOptions
from ..records import Manifest, Part
from .manifest import manifest_path, version_model_path

#: The attribute a published part records (JSON text): the job that wrote it, its version and its input.
PUBLICATION_ATTR = "publication"
#: The key of a published model file's ``info`` that records the job and version it was published as.
PUBLICATION_INFO = "publication"


def _folder_of(model_path: str) -> tuple[str, str]:
    """The real folder of the manifest beside ``model_path`` and the manifest's name."""
    where = os.path.realpath(manifest_path(model_path))
    return os.path.dirname(where), os.path.basename(where)


def _digest(text: str, size: int) -> str:
    """The first ``size`` hex digits of the SHA-256 of ``streamwhiten-job:`` and ``text``."""
    return hashlib.sha256(f"streamwhiten-job:{text}".encode()).hexdigest()[:size]


def _folder_digest(salt: str, model_path: str) -> str:
    """Binds an identity drawn with ``salt`` to the manifest's folder: its inode (kept by a move, a rename or a
    mount; new for a copy, which so never passes for the job) and the manifest's name."""
    folder, name = _folder_of(model_path)
    try:
        inode = os.stat(folder).st_ino
    except OSError as exc:
        raise StoreIOError(f"{folder}: cannot read the job's folder: {exc.strerror or exc}") from None
    return _digest(f"{salt}:{inode}:{name}", 32)


def _salt(model_path: str) -> str:
    """What a job identity starts with: a digest of the manifest's real path."""
    return _digest(os.path.join(*_folder_of(model_path)), 16)


def first_job_id(model_path: str) -> str:
    """A job's identity from its first publication on: ``SALT-DIGEST`` (`_salt`, `_folder_digest`)."""
    salt = _salt(model_path)
    return f"{salt}-{_folder_digest(salt, model_path)}"


def job_id_problem(model_path: str, job_id: str) -> str | None:
    """None when ``job_id`` (a manifest's) is the identity of the manifest's folder as it is now (moved, renamed,
    mounted or at its first place); else why not."""
    if "-" in job_id:
        salt, _, digest = job_id.partition("-")
        if salt == _salt(model_path) or digest == _folder_digest(salt, model_path):
            return None
    elif job_id == _digest(os.path.join(*_folder_of(model_path)), 32):
        return None
    return f"published by another folder (job {job_id}), not this one"


def input_identity(input_spec: str, part_spec: str, earlier: bool = False) -> str | None:
    """The input a part holds rows of, as it records it: the input's path relative to the part's folder (links
    unresolved: a folder moved with its inputs, or whose ``out/`` links to another disk, stays bound to them) or
    its URL, and the array; ``earlier``: as the previous release did (real paths; None: URL)."""
    from ..io import remote, split_spec

    path, inner = split_spec(input_spec)
    part = split_spec(part_spec)[0]
    if earlier and (remote.is_url(path) or remote.is_url(part)):
        return None
    if earlier:
        where = os.path.relpath(os.path.realpath(path), os.path.realpath(os.path.dirname(os.path.abspath(part))))
    elif remote.is_url(path):
        where = remote.normalize(path)
    elif remote.is_url(part):
        where = os.path.realpath(path)
    else:
        where = os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.abspath(part)))
    return f"{where}:{inner}" if inner else where


def part_attrs(job_id: str, version: int, input_spec: str, part_spec: str) -> dict:
    """The attributes a published part records beside an apply output's own (`PUBLICATION_ATTR`)."""
    record = {"job": job_id, "version": int(version), "input": input_identity(input_spec, part_spec)}
    return {PUBLICATION_ATTR: json.dumps(record, sort_keys=True)}


def publication_record(attrs: dict) -> dict | None:
    """What an output's attributes say of the publication that wrote it, or None (not a published part)."""
    value = attrs.get(PUBLICATION_ATTR)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    try:
        record = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def ownership_problem(
    attrs: dict, job_id: str, version: int, input_spec: str | None = None, part_spec: str | None = None
) -> str | None:
    """None when ``attrs`` prove job ``job_id`` wrote the output as version ``version``'s part; else why not."""
    record = publication_record(attrs)
    if record is None:
        return "not written by a published job (a plain apply's output, or another program's file)"
    if record.get("job") != job_id:
        return "written by another job (another model file's publication)"
    if record.get("version") != version:
        return f"written as a part of version {record.get('version')}, not {version}"
    if input_spec is not None and part_spec is not None:
        wanted = input_identity(input_spec, part_spec)
        accepted = {wanted, input_identity(input_spec, part_spec, earlier=True)} - {None}
        if record.get("input") not in accepted:
            return f"holds the rows of another input ({record.get('input')}, not {wanted})"
    return None


def output_owner_problem(
    spec: str,
    read: ReadOptions | None,
    job_id: str,
    version: int,
    input_spec: str | None = None,
    model_checksum: str | None = None,
):
    """`ownership_problem` of the output ``spec`` now (and, given ``model_checksum``, written by that map)."""
    from ..output_plan import CHECKSUM_ATTR

    attrs = _attrs(spec, read)
    if not isinstance(attrs, dict):
        return attrs  # nothing there (None), or unreadable: nothing proves it is ours
    problem = ownership_problem(attrs, job_id, version, input_spec, spec if input_spec is not None else None)
    if problem is None and model_checksum is not None and attrs.get(CHECKSUM_ATTR) != model_checksum:
        return f"written by another map than version {version}'s"
    return problem


def model_owner_problem(path: str, job_id: str, version: int, model: Any = None) -> str | None:
    """None when the model file ``path`` records job ``job_id``'s version ``version`` (or is absent); else why."""
    from .._npz import foreign_npz
    from ..core.model import FORMAT_NAME, load_model

    if model is None:
        if not os.path.lexists(path):
            return None
        if foreign_npz(path, FORMAT_NAME) is not None:
            return "not a model file"
        try:
            model = load_model(path)
        except Exception as exc:  # noqa: BLE001 - damaged: nothing proves it is ours
            return unreadable(exc)
    record = model.info.get(PUBLICATION_INFO)
    if not isinstance(record, dict) or record.get("job") != job_id:
        return "not a model file this job published (a fit's model, the statistics, or another job's)"
    if record.get("version") != version:
        return f"published as version {record.get('version')}, not {version}"
    return None


def part_problem(part: Part, manifest: Manifest, input_spec: str, read: ReadOptions | None = None) -> str | None:
    """None when ``part.path`` is complete, holds input rows ``[start, stop)`` by ``manifest``'s map and records
    its job, version and input; else what is wrong with it."""
    attrs = _attrs(part.path, read)
    if not isinstance(attrs, dict):
        return "missing" if attrs is None else attrs  # unreadable: not what was published
    return attrs_problem(part, attrs, manifest, input_spec)


def _attrs(spec: str, read: ReadOptions | None) -> dict | str | None:
    """The output's attributes: None when nothing is there, `unreadable`'s phrase when they cannot be read."""
    from ..io import open_output

    output = open_output(spec, read)
    try:
        return output.attrs() if output.exists() else None
    except Exception as exc:  # noqa: BLE001 - unreadable: what it holds is unknown
        return unreadable(exc)


def unreadable(exc: BaseException) -> str:
    """What a file that cannot be read is: nothing proves it is what was published, or ours."""
    return f"unreadable ({' '.join(str(exc).split())[:200]})"


def attrs_problem(part: Part, attrs: dict[str, Any], manifest: Manifest, input_spec: str) -> str | None:
    """`part_problem` of a part whose attributes ``attrs`` were read already."""
    from ..output_plan import CHECKSUM_ATTR, is_complete, recorded_rows

    try:
        held = recorded_rows(attrs)
    except Exception as exc:  # noqa: BLE001 - unreadable: not what was published
        return unreadable(exc)
    if not is_complete(attrs):
        return "not complete"
    if attrs.get(CHECKSUM_ATTR) != manifest.model_checksum:
        return "written by another map"
    if held != (part.start, part.stop):
        return f"holds rows {held}, not [{part.start}, {part.stop})"
    if manifest.job_id is not None:
        return ownership_problem(attrs, manifest.job_id, manifest.version, input_spec, part.path)
    return None


def check_model_file(model_path: str, manifest: Manifest):
    """The published model file the manifest names, loaded and checked against it; `ModelFileError`."""
    from ..core.model import file_checksum, load_model, map_checksum

    path = os.path.join(os.path.dirname(os.path.abspath(model_path)), manifest.model_file)
    if manifest.model_file != os.path.basename(version_model_path(model_path, manifest.version)):
        raise ModelFileError(  # read_manifest refuses it too; a manifest made in memory is checked here
            f"{manifest_path(model_path)}: names {manifest.model_file} as the model file of version "
            f"{manifest.version}; nothing was changed"
        )
    if not os.path.lexists(path):
        raise ModelFileError(
            f"{path}: the model file of published version {manifest.version} is missing (deleted by hand?); "
            "run with republish=True to publish a new version from the current statistics",
            param="republish",
        )
    model = load_model(path)
    if file_checksum(model) != manifest.file_checksum or map_checksum(model) != manifest.model_checksum:
        raise ModelFileError(
            f"{path}: is not the model file {manifest_path(model_path)} published as version {manifest.version} "
            "(its checksum differs); run with republish=True to publish a new version from the current statistics",
            param="republish",
        )
    if not manifest.legacy:
        assert manifest.job_id is not None
        problem = model_owner_problem(path, manifest.job_id, manifest.version, model)
        if problem is not None:
            raise ModelFileError(
                f"{path}: {problem}: not the model file {manifest_path(model_path)} published as version "
                f"{manifest.version}; nothing was changed"
            )
    return model


def check_outputs(model_path: str, manifest: Manifest, read: ReadOptions | None = None) -> Manifest:
    """Refuse a publication whose parts were deleted or changed by hand, naming them; a part whose stamp is
    the recorded one is not opened. Returns ``manifest`` with the stamps of those checked brought up to date."""
    from ..io import open_output

    problems = []
    inputs = []
    for item in manifest.inputs:
        parts = []
        for part in item.parts:
            stamp = open_output(part.path, read).stamp()
            if part.stamp is not None and stamp == part.stamp:
                parts.append(part)
                continue
            problem = part_problem(part, manifest, item.spec, read)
            if problem is not None:
                problems.append(f"{part.path} ({problem})")
            parts.append(part if stamp == part.stamp else replace(part, stamp=stamp))
        inputs.append(item if tuple(parts) == item.parts else replace(item, parts=tuple(parts)))
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise BadInputError(
            f"{manifest_path(model_path)}: outputs of published version {manifest.version} were deleted or "
            f"changed by hand: {shown}. Restore them, or run with republish=True to publish a new version",
            param="republish",
        )
    if all(new is old for new, old in zip(inputs, manifest.inputs, strict=True)):
        return manifest
    return replace(manifest, inputs=tuple(inputs))
