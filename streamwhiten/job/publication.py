"""Published versions of a job's outputs: the files beside the model, the manifest, and reading through it.

A job with a ``[publish]`` table keeps, beside its model file ``M.npz`` (the statistics, updated every
night):

- ``M.vN.npz``: published version N, an immutable copy of the model finalized when N was published;
- ``M.manifest.json``: the current publication (a `Manifest`): the version,
  its model file and map, and each input's output *parts* (``out/day-1.vN.zarr``, then
  ``out/day-1.vN.part1.zarr``, ... as nights append rows), replaced as a whole by one atomic rename.

Readers resolve outputs through the manifest ([`published`][streamwhiten.job.publication.published]), so they see one
complete version: a
new version's outputs are all written before the manifest names them, and older versions are deleted only
after it does (``keep_versions`` of them are kept, so a reader that resolved the previous version can
finish reading it). A damaged or hand-edited manifest is refused, never taken for another version.

The manifest's checksum has no key, so it proves integrity, not authorship: the files vouch for
themselves. Each part records the job that wrote it (``job_id``), its version and its input
(`PUBLICATION_ATTR`, `part_attrs`), each published model file its job and version (its
``info``); a run deletes or replaces only files that prove it (`ownership_problem`), and readers
refuse a part bound to another input. Local paths are relative to the manifest in the file, so a job's
folder can be moved, copied or mounted elsewhere.

Examples
--------
>>> import streamwhiten
>>> publication = streamwhiten.published("models/nightly.npz")  # doctest: +SKIP
>>> publication.version, publication.outputs                    # doctest: +SKIP
(3, ('/data/out/day-1.v3.zarr', '/data/out/day-1.v3.part1.zarr', '/data/out/day-2.v3.zarr'))
>>> vectors = publication.read("/data/shards/day-1.h5:/emb")     # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import numpy.typing as npt

from .. import _durable as durable
from ..errors import BadInputError, ModelFileError, StoreIOError
from ..options import ReadOptions
from ..records import Manifest, Part, Version

if TYPE_CHECKING:
    from ..core.model import WhiteningModel
    from ..core.quantize import Quantization

#: The name of a job's manifest, beside its model file: ``M.manifest.json`` for ``M.npz``.
MANIFEST_SUFFIX = ".manifest.json"


def _root(model_path: str) -> str:
    """``M`` of the model file ``M.npz``."""
    path = os.fspath(model_path)
    return path[: -len(".npz")] if path.lower().endswith(".npz") else path


def manifest_path(model_path: str) -> str:
    """``M.manifest.json`` beside the model file ``M.npz``."""
    return _root(model_path) + MANIFEST_SUFFIX


def version_model_path(model_path: str, version: int) -> str:
    """``M.vN.npz``: the published model file of version ``version`` beside ``M.npz``."""
    return f"{_root(model_path)}.v{int(version)}.npz"


def versioned_output(output_spec: str, version: int, part: int = 0) -> str:
    """The path of part ``part`` of version ``version`` of the output ``output_spec``: ``out/day-1.v3.zarr``
    for part 0, ``out/day-1.v3.part1.zarr`` for part 1, ... (a dataset or column named in the spec is kept:
    ``out/day-1.v3.h5:/vectors``)."""
    from ..io import split_spec

    path, inner = split_spec(output_spec)
    bare = path.rstrip("/")
    head, tail = os.path.split(bare) if "://" not in bare else bare.rsplit("/", 1)
    stem, extension = os.path.splitext(tail)
    name = f"{stem}.v{int(version)}{f'.part{int(part)}' if part else ''}{extension}"
    named = f"{head}/{name}" if head else name
    if inner is None:
        return named
    return f"{named}:{output_spec.rpartition(':')[2]}"


# ------------------------------------------------------------------------------------------- ownership

#: The attribute a published part records (JSON text): the job that wrote it, its version and its input.
PUBLICATION_ATTR = "publication"
#: The key of a published model file's ``info`` that records the job and version it was published as.
PUBLICATION_INFO = "publication"


def _folder_of(model_path: str) -> tuple[str, str]:
    """The real folder of the manifest beside ``model_path`` and the manifest's name."""
    where = os.path.realpath(manifest_path(model_path))
    return os.path.dirname(where), os.path.basename(where)


def _folder_digest(salt: str, model_path: str) -> str:
    """The digest that binds a job identity drawn with ``salt`` to the folder instance holding the manifest
    beside ``model_path``: that folder's inode on its file system (kept by a move or a rename within the
    file system, and by a mount elsewhere; new for a copy) and the manifest's name in it."""
    folder, name = _folder_of(model_path)
    try:
        inode = os.stat(folder).st_ino
    except OSError as exc:
        raise StoreIOError(f"{folder}: cannot read the job's folder: {exc.strerror or exc}") from None
    return hashlib.sha256(f"streamwhiten-job:{salt}:{inode}:{name}".encode()).hexdigest()[:32]


def _salt(model_path: str) -> str:
    """What a job identity drawn for the manifest beside ``model_path`` starts with: a digest of where the
    manifest is (its real path)."""
    where = os.path.join(*_folder_of(model_path))
    return hashlib.sha256(f"streamwhiten-job:{where}".encode()).hexdigest()[:16]


def first_job_id(model_path: str) -> str:
    """The identity a job takes at its first publication (kept by every later one, in the manifest):
    ``SALT-DIGEST``, where SALT is a digest of where its manifest is then and DIGEST binds it to the folder
    instance holding the manifest (`job_id_problem`). A first night cut short and run again takes the
    same one, so it finds its own parts; another model file, or a copy of the folder, never does."""
    salt = _salt(model_path)
    return f"{salt}-{_folder_digest(salt, model_path)}"


def job_id_problem(model_path: str, job_id: str) -> str | None:
    """None when ``job_id`` (a manifest's) is the identity of the job folder holding the manifest beside
    ``model_path``, as that folder is now; else why not. It is checked against the folder itself, not taken
    from the manifest: the identity holds in the same folder (its inode: moved or renamed within its file
    system, or reached through a link or a mount) and in a folder at the very place it was first published
    (a folder restored from a backup); not in a copy elsewhere, nor in a manifest that took another job's
    identity. An identity of the previous format (a digest of the manifest's real path) is this job's only
    where the manifest still is."""
    if "-" in job_id:
        salt, _, digest = job_id.partition("-")
        if salt == _salt(model_path) or digest == _folder_digest(salt, model_path):
            return None
    else:
        where = os.path.join(*_folder_of(model_path))
        if job_id == hashlib.sha256(f"streamwhiten-job:{where}".encode()).hexdigest()[:32]:
            return None
    return f"published by another folder (job {job_id}), not this one"


def input_identity(input_spec: str, part_spec: str) -> str:
    """The input a part holds rows of, as the part records it: the input's path relative to the part's own
    folder, both as the job names them (not resolving links, so a folder moved with its inputs, or whose
    ``out/`` is a link to another disk, stays bound to them), or its URL; and the array named in the spec."""
    from ..io import remote, split_spec

    path, inner = split_spec(input_spec)
    part = split_spec(part_spec)[0]
    if remote.is_url(path):
        where = remote.normalize(path)
    elif remote.is_url(part):
        where = os.path.realpath(path)
    else:
        where = os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.abspath(part)))
    return f"{where}:{inner}" if inner else where


def _earlier_input_identity(input_spec: str, part_spec: str) -> str | None:
    """What a part written by the previous release records of its input (real paths), or None for a URL."""
    from ..io import remote, split_spec

    path, inner = split_spec(input_spec)
    part = split_spec(part_spec)[0]
    if remote.is_url(path) or remote.is_url(part):
        return None
    where = os.path.relpath(os.path.realpath(path), os.path.realpath(os.path.dirname(os.path.abspath(part))))
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
    """None when the attributes ``attrs`` of an output prove that job ``job_id`` wrote it as a part of
    version ``version`` (of the input ``input_spec``, where given, seen from ``part_spec``); else why not."""
    record = publication_record(attrs)
    if record is None:
        return "not written by a published job (a plain apply's output, or another program's file)"
    if record.get("job") != job_id:
        return "written by another job (another model file's publication)"
    if record.get("version") != version:
        return f"written as a part of version {record.get('version')}, not {version}"
    if input_spec is not None and part_spec is not None:
        wanted = input_identity(input_spec, part_spec)
        accepted = {wanted, _earlier_input_identity(input_spec, part_spec)} - {None}
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
    """`ownership_problem` of the output ``spec`` as it is now (None also when nothing is there); with
    ``model_checksum``, also that the output was written by that map (read from the same attributes)."""
    from ..io import open_output
    from ..output_plan import CHECKSUM_ATTR

    output = open_output(spec, read)
    try:
        if not output.exists():
            return None
        attrs = output.attrs()
    except Exception as exc:  # noqa: BLE001 - unreadable: nothing proves it is ours
        return f"unreadable ({' '.join(str(exc).split())[:200]})"
    problem = ownership_problem(attrs, job_id, version, input_spec, spec if input_spec is not None else None)
    if problem is None and model_checksum is not None and attrs.get(CHECKSUM_ATTR) != model_checksum:
        return f"written by another map than version {version}'s"
    return problem


def model_owner_problem(path: str, job_id: str, version: int, model: Any = None) -> str | None:
    """None when the model file ``path`` (``model``: loaded from it already) records that job ``job_id``
    published it as version ``version`` (or nothing is there); else why not."""
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
            return f"unreadable ({' '.join(str(exc).split())[:200]})"
    record = model.info.get(PUBLICATION_INFO)
    if not isinstance(record, dict) or record.get("job") != job_id:
        return "not a model file this job published (a fit's model, the statistics, or another job's)"
    if record.get("version") != version:
        return f"published as version {record.get('version')}, not {version}"
    return None


# ------------------------------------------------------------------------------------------- the manifest


def read_manifest(model_path: str) -> Manifest | None:
    """The manifest beside ``model_path``, checked whole (format, its own checksum, every field), or None
    when there is none. A damaged, truncated or hand-edited one is a `ModelFileError` (exit 2)
    naming it: it is never taken for another version."""
    from .._paths import check_readable

    path = manifest_path(model_path)
    if not os.path.lexists(path):
        return None
    check_readable(path, "manifest", directory=False)
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise StoreIOError(f"{path}: cannot read the manifest: {exc.strerror or exc}") from None
    try:
        manifest = Manifest.from_dict(json.loads(raw.decode("utf-8")))
        expected = os.path.basename(version_model_path(model_path, manifest.version))
        if manifest.model_file != expected:
            raise ValueError(
                f"it names {manifest.model_file!r} as the model file of version {manifest.version}, not {expected!r}"
            )
        for item in (*manifest.kept, *manifest.retired):
            if item.model_file != os.path.basename(version_model_path(model_path, item.version)):
                raise ValueError(f"it names {item.model_file!r} as the model file of version {item.version}")
        return manifest if manifest.legacy else _paths(manifest, _base(path), absolute=True)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        detail = f"not JSON: {exc}"
    except ValueError as exc:
        detail = str(exc)
    raise ModelFileError(
        f"{path}: not a manifest streamwhiten could have written ({detail}); nothing was changed. Restore it, "
        "or move it away: the next run then publishes version 1 from the current statistics"
    )


def write_manifest(model_path: str, manifest: Manifest) -> str:
    """Replace the manifest beside ``model_path`` by ``manifest`` in one atomic rename (temp file, fsync,
    rename, directory fsync); returns its path."""
    path = manifest_path(model_path)
    stored = manifest if manifest.legacy else _paths(manifest, _base(path), absolute=False)
    data = (json.dumps(stored.to_dict(), indent=2, sort_keys=True) + "\n").encode()
    durable.write_file_atomic(path, lambda handle: handle.write(data), "manifest")
    return path


def _base(path: str) -> str:
    """The folder of the manifest ``path``: what the paths it holds are relative to."""
    return os.path.dirname(os.path.abspath(path))


def _moved(spec: str, base: str, absolute: bool, real: bool = False) -> str:
    """The local ``spec`` (a path, with the array it names) made absolute from, or relative to, ``base``
    (``real``: as real paths, as a fingerprint records them); a URL as it is."""
    from ..io import remote, split_spec

    path = split_spec(spec)[0]
    if remote.is_url(path):
        return spec
    rest = spec[len(path) :] if spec.startswith(path) else ""
    if absolute:
        joined = os.path.join(base, path)
        moved = os.path.realpath(joined) if real else os.path.normpath(joined)
    else:
        moved = os.path.relpath(path, os.path.realpath(base) if real else base)
    return moved + rest


def _paths(manifest: Manifest, base: str, absolute: bool) -> Manifest:
    """``manifest`` with every local path (inputs, their fingerprints, outputs, parts, versions kept or
    retired) absolute (as runs and readers use them) or relative to the manifest's folder ``base`` (as
    the file holds them, so that the job's folder can be moved, copied or mounted elsewhere)."""

    def move(spec: str) -> str:
        return _moved(spec, base, absolute)

    def version(item: Version) -> Version:
        return replace(item, outputs=tuple(move(output) for output in item.outputs))

    inputs = []
    for item in manifest.inputs:
        source = item.source
        if source.path is not None:
            source = replace(source, path=_moved(source.path, base, absolute, real=True))
        parts = tuple(replace(part, path=move(part.path)) for part in item.parts)
        inputs.append(replace(item, spec=move(item.spec), output=move(item.output), source=source, parts=parts))
    setting = dict(manifest.setting)
    if isinstance(setting.get("output"), str):  # the output template, a path too
        setting["output"] = move(setting["output"])
    return replace(
        manifest,
        setting=setting,
        inputs=tuple(inputs),
        kept=tuple(version(item) for item in manifest.kept),
        retired=tuple(version(item) for item in manifest.retired),
    )


def part_problem(
    part: Part,
    model_checksum: str,
    read: ReadOptions | None = None,
    job_id: str | None = None,
    version: int | None = None,
    input_spec: str | None = None,
) -> str | None:
    """None when the output ``part.path`` is complete and holds the transform of the input rows
    ``[part.start, part.stop)`` by the map ``model_checksum`` (and, with ``job_id``, records that this
    job wrote it for version ``version`` from the input ``input_spec``); else what is wrong with it."""
    from ..io import open_output

    output = open_output(part.path, read)
    try:
        if not output.exists():
            return "missing"
        attrs = output.attrs()
    except Exception as exc:  # noqa: BLE001 - unreadable: not what was published
        return _unreadable(exc)
    return attrs_problem(part, attrs, model_checksum, job_id, version, input_spec)


def _unreadable(exc: BaseException) -> str:
    return f"unreadable ({' '.join(str(exc).split())[:200]})"


def attrs_problem(
    part: Part,
    attrs: dict[str, Any],
    model_checksum: str,
    job_id: str | None = None,
    version: int | None = None,
    input_spec: str | None = None,
) -> str | None:
    """`part_problem` of a part whose output attributes ``attrs`` were read already (by a reader
    that opened it to read its rows too)."""
    from ..output_plan import CHECKSUM_ATTR, is_complete, recorded_rows

    try:
        held = recorded_rows(attrs)
    except Exception as exc:  # noqa: BLE001 - unreadable: not what was published
        return _unreadable(exc)
    if not is_complete(attrs):
        return "not complete"
    if attrs.get(CHECKSUM_ATTR) != model_checksum:
        return "written by another map"
    if held != (part.start, part.stop):
        return f"holds rows {held}, not [{part.start}, {part.stop})"
    if job_id is not None and version is not None:
        return ownership_problem(attrs, job_id, version, input_spec, part.path)
    return None


def check_model_file(model_path: str, manifest: Manifest):
    """The published model file the manifest names, loaded and checked against it (its file checksum and
    its map's); a missing or different one is a `ModelFileError` naming it."""
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
    """Refuse a publication whose output parts were deleted or changed by hand, naming each of them.

    A part whose file-system stamp is the one the manifest recorded is not opened (so a night does not
    cost more as parts accumulate); a part whose stamp changed, or that has none (written moments
    before, or on object storage: ``Output.stamp``), is checked in full (`part_problem`). Returns
    ``manifest`` with the stamps of the parts checked in full brought up to date (the same object when
    none changed)."""
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
            problem = part_problem(part, manifest.model_checksum, read, manifest.job_id, manifest.version, item.spec)
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


# ------------------------------------------------------------------------------------------- the reader


def _codec_sha(attrs: Any) -> str | None:
    """The SHA-256 of the codec a vector-code output names (its record's ``codec`` entry), else None."""
    from ..output_plan import storage_record

    try:
        record = storage_record(attrs)
    except Exception:  # noqa: BLE001 - not a record of ours: read as Quantization's, which says what is wrong
        return None
    codec = record.get("codec") if isinstance(record, dict) else None
    return str(codec["sha256"]) if isinstance(codec, dict) and "sha256" in codec else None


@dataclass(frozen=True)
class CodeDecoder:
    """How a publication's vector-code rows decode: the published model's codec (``decode``), named by the
    SHA-256 of its bytes (``digest``: the same in every part)."""

    codec: Any
    sha256: str

    def decode(self, codes: np.ndarray, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
        """The rows the codes stand for (the codec's decode: unit-length vectors, approximately)."""
        return np.asarray(self.codec.decode(codes), dtype=dtype)

    def digest(self) -> str:
        return self.sha256


@dataclass(frozen=True)
class Publication:
    """A published version of a job's outputs, as its manifest listed it when
    [`published`][streamwhiten.job.publication.published] read it.

    Everything here stays that version, whatever a run publishes meanwhile: ``parts`` and ``read`` use
    the outputs this manifest names, each checked (complete, written by this version's map, holding the
    rows listed) before it is read. The version read stays on disk while a newer one is published
    (``keep_versions``, at least 2 by default), so a reader can finish it.
    """

    model_path: str
    manifest: Manifest
    read_options: ReadOptions = field(default_factory=ReadOptions)

    @property
    def path(self) -> str:
        """The manifest file."""
        return manifest_path(self.model_path)

    @property
    def version(self) -> int:
        return self.manifest.version

    @property
    def model_file(self) -> str:
        """The published model file (``M.vN.npz``), to whiten queries with the map the outputs hold."""
        return os.path.join(os.path.dirname(os.path.abspath(self.model_path)), self.manifest.model_file)

    @property
    def model_checksum(self) -> str:
        """The map the outputs were written with (``AffineMap.checksum``; ``serving.load(...).checksum``)."""
        return self.manifest.model_checksum

    @property
    def published_at(self) -> str:
        return self.manifest.published_at

    @property
    def n_rows(self) -> int:
        """The rows of the statistics the version was finalized from."""
        return self.manifest.n_rows

    @property
    def inputs(self) -> tuple[str, ...]:
        """The published inputs, as the job names them."""
        return tuple(item.spec for item in self.manifest.inputs)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Every output part of the version, input by input, in row order."""
        return self.manifest.outputs

    def load_model(self) -> WhiteningModel:
        """The published model, checked against the manifest."""
        return check_model_file(self.model_path, self.manifest)

    def parts(self, input_spec: str) -> tuple[Part, ...]:
        """The output parts of ``input_spec`` (as the job names it, or another path to the same file, with
        or without the dataset a file of one dataset needs none for), in row order: part ``i`` holds the
        transform of input rows ``[start, stop)``."""
        return self._input(input_spec).parts

    def _spec(self, input_spec: str) -> str:
        """The published input ``input_spec`` names, as the manifest names it."""
        return self._input(input_spec).spec

    def _input(self, input_spec: str):
        path, inner = _key(input_spec)
        for item in self.manifest.inputs:
            other_path, other_inner = _key(item.spec)
            if (
                item.spec == input_spec
                or (path == other_path and None in (inner, other_inner))
                or ((path, inner) == (other_path, other_inner))
            ):
                return item
        raise BadInputError(
            f"{input_spec}: not an input of published version {self.version} ({self.path}); its inputs: "
            + ", ".join(self.inputs)
        )

    def read(self, input_spec: str, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
        """The whitened rows of ``input_spec`` in this version: its parts, each checked (complete, this
        version's map, the rows listed, written by this job from this input), concatenated. Float
        outputs as they are stored; int8 codes and bits decoded to floats of ``dtype`` (``code * scale +
        offset``; the signs +1/-1 of the bits), as ``streamwhiten.serving.decode`` does (for the codes
        themselves: [`read_codes`][streamwhiten.job.publication.Publication.read_codes])."""
        blocks, record = self._read_parts(input_spec)
        if record is not None:
            return record.decode(blocks, dtype)
        return blocks

    def read_codes(self, input_spec: str) -> tuple[np.ndarray, Quantization | CodeDecoder]:
        """``(codes, quantization)``: the stored int8 codes or bytes of sign bits of ``input_spec`` in this
        version (checked as [`read`][streamwhiten.job.publication.Publication.read] checks them), and their decoder
        (`Quantization`: ``quantization.decode(codes)``). A publication of
        float outputs is refused: [`read`][streamwhiten.job.publication.Publication.read] returns its rows."""
        blocks, record = self._read_parts(input_spec)
        if record is None:
            raise BadInputError(
                f"{self.path}: version {self.version} publishes float rows, not codes: read them with read()"
            )
        return blocks, record

    def _read_parts(self, input_spec: str):
        """The stored rows of ``input_spec``'s parts, each checked, concatenated; and the codes' record
        (None for float outputs), the same in every part."""
        from ..core.quantize import Quantization
        from ..io import open_output, open_source
        from ..output_plan import STORAGE_ATTR

        blocks: list[np.ndarray] = []
        records: list[Any] = []
        decoders: dict[str, CodeDecoder] = {}
        manifest = self.manifest
        spec = self._spec(input_spec)
        for part in self.parts(input_spec):
            # one open per part: its attributes are checked (as part_problem checks them), then its rows read
            try:
                source = open_source(part.path, read=self.read_options, codes=True)
            except Exception as exc:  # noqa: BLE001 - missing or unreadable: not what was published
                exists = open_output(part.path, self.read_options).exists()
                self._refuse(part, "missing" if not exists else _unreadable(exc), exc)
            with source:
                attrs = source.attrs()
                problem = attrs_problem(part, attrs, self.model_checksum, manifest.job_id, manifest.version, spec)
                if problem is not None:
                    self._refuse(part, problem)
                if source.n_rows != part.n_rows:
                    raise BadInputError(f"{part.path}: holds {source.n_rows} rows, not the {part.n_rows} published")
                sha = _codec_sha(attrs) if STORAGE_ATTR in attrs else None
                if STORAGE_ATTR not in attrs:
                    records.append(None)
                elif sha is not None:  # the model is loaded and checked once per codec, not once per part
                    if sha not in decoders:
                        decoders[sha] = self._code_decoder(part, sha, attrs)
                    records.append(decoders[sha])
                else:
                    records.append(Quantization.from_attrs(attrs))
                blocks.append(source.read(0, source.n_rows))
        digests = {None if record is None else record.digest() for record in records}
        if len(digests) > 1:
            raise BadInputError(f"{self.path}: the parts of {input_spec} hold differently encoded rows")
        rows = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
        return rows, records[0]

    def _code_decoder(self, part: Part, sha256: str, attrs: Any) -> CodeDecoder:
        """The decoder of a part stored as a vector code: the codec whose bytes the part carries (checked
        against their SHA-256), or, for a part written before parts carried it, the published model's. A
        published model that records a codec must record that one."""
        import hashlib

        from ..codes import codec_from_record
        from ..codes.storage import model_codec
        from ..output_plan import storage_record

        model = self.load_model()
        recorded = model.storage.codec if model.storage is not None else None
        if recorded is not None and hashlib.sha256(recorded.data).hexdigest() == sha256:
            return CodeDecoder(model_codec(model), sha256)
        entry = storage_record(attrs)["codec"]
        if recorded is not None or "data" not in entry:
            self._refuse(part, "coded by another codec than the published model records")
        return CodeDecoder(codec_from_record(entry, part.path), sha256)

    def _refuse(self, part: Part, problem: str, cause: BaseException | None = None) -> NoReturn:
        """Refuse the part ``part`` in one plain sentence: the part, the version, what is wrong with it
        (`attrs_problem`'s phrase, a verb put before it where it has none), and only for a missing
        part the one cause a reader can act on (a newer version published since, which deleted it)."""
        verbs = ("holds ", "was ")
        clause = problem if problem.startswith(verbs) else f"is {problem}"
        hint = (
            "; if a newer version was published since this publication was read, read the publication again"
            if problem == "missing"
            else ""
        )
        raise BadInputError(
            f"{part.path}: this part of published version {self.version} {clause}, so it is not read{hint}"
        ) from cause

    def to_json(self) -> dict[str, Any]:
        """What ``info --json`` shows of it, as plain JSON values."""
        manifest = self.manifest
        return {
            "manifest": self.path,
            "version": manifest.version,
            "model_file": self.model_file,
            "model_checksum": manifest.model_checksum,
            "published_at": manifest.published_at,
            "updated_at": manifest.updated_at,
            "n_rows": manifest.n_rows,
            "inputs": [
                {"spec": item.spec, "rows": item.stop, "parts": [part.to_dict() for part in item.parts]}
                for item in manifest.inputs
            ],
            "kept_versions": [item.version for item in manifest.kept],
            "job_id": manifest.job_id,
        }


def _key(spec: str) -> tuple[str, str | None]:
    """A spec as the file it names (real path, or the URL) and the array inside it."""
    from ..io import remote, split_spec

    path, inner = split_spec(spec)
    return (path if remote.is_url(path) else os.path.realpath(path)), inner


def published(model_path: str, read: ReadOptions | None = None) -> Publication:
    """The current publication of the job keeping ``model_path``: one call, one consistent version.

    Reads ``M.manifest.json`` beside ``model_path`` once (it is replaced atomically, so this is one
    whole version) and checks it; ``read`` says how URL outputs are reached. Raises
    `BadInputError` when nothing was published, and `ModelFileError` for a damaged manifest.
    """
    manifest = read_manifest(model_path)
    if manifest is None:
        raise BadInputError(
            f"{manifest_path(model_path)}: no publication beside {model_path} (a job with a [publish] table "
            "publishes one on its first run)"
        )
    return Publication(os.fspath(model_path), manifest, read if read is not None else ReadOptions())


__all__ = [
    "MANIFEST_SUFFIX",
    "PUBLICATION_ATTR",
    "PUBLICATION_INFO",
    "Publication",
    "check_model_file",
    "check_outputs",
    "first_job_id",
    "input_identity",
    "job_id_problem",
    "manifest_path",
    "model_owner_problem",
    "output_owner_problem",
    "ownership_problem",
    "part_attrs",
    "part_problem",
    "published",
    "read_manifest",
    "version_model_path",
    "versioned_output",
    "write_manifest",
]
