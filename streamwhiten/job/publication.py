"""Published versions of a job's outputs: the files beside the model, the manifest, and reading through it.

A job with a ``[publish]`` table keeps, beside its model file ``M.npz`` (the statistics, updated every
night):

- ``M.vN.npz``: published version N, an immutable copy of the model finalized when N was published;
- ``M.manifest.json``: the current publication (a :class:`~streamwhiten.records.Manifest`): the version,
  its model file and map, and each input's output *parts* (``out/day-1.vN.zarr``, then
  ``out/day-1.vN.part1.zarr``, ... as nights append rows), replaced as a whole by one atomic rename.

Readers resolve outputs through the manifest (:func:`published`), so they see one complete version: a
new version's outputs are all written before the manifest names them, and older versions are deleted only
after it does (``keep_versions`` of them are kept, so a reader that resolved the previous version can
finish reading it). A damaged or hand-edited manifest is refused, never taken for another version.

Examples
--------
>>> import streamwhiten
>>> publication = streamwhiten.published("models/nightly.npz")  # doctest: +SKIP
>>> publication.version, publication.outputs                    # doctest: +SKIP
(3, ('/data/out/day-1.v3.zarr', '/data/out/day-1.v3.part1.zarr', '/data/out/day-2.v3.zarr'))
>>> vectors = publication.read("/data/shards/day-1.h5:/emb")     # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace

import numpy as np

from .. import _durable as durable
from ..errors import BadInputError, ModelFileError, StoreIOError
from ..options import ReadOptions
from ..records import Manifest, Part

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


# ------------------------------------------------------------------------------------------- the manifest


def read_manifest(model_path: str) -> Manifest | None:
    """The manifest beside ``model_path``, checked whole (format, its own checksum, every field), or None
    when there is none. A damaged, truncated or hand-edited one is a :class:`ModelFileError` (exit 2)
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
        return Manifest.from_dict(json.loads(raw.decode("utf-8")))
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
    data = (json.dumps(manifest.to_dict(), indent=2, sort_keys=True) + "\n").encode()
    durable.write_file_atomic(path, lambda handle: handle.write(data), "manifest")
    return path


def part_problem(part: Part, model_checksum: str, read: ReadOptions | None = None) -> str | None:
    """None when the output ``part.path`` is complete and holds the transform of the input rows
    ``[part.start, part.stop)`` by the map ``model_checksum``; else what is wrong with it."""
    from ..engine.apply import recorded_rows
    from ..io import open_output

    output = open_output(part.path, read)
    try:
        if not output.exists():
            return "missing"
        attrs = output.attrs()
        held = recorded_rows(attrs)
    except Exception as exc:  # noqa: BLE001 - unreadable: not what was published
        return f"unreadable: {' '.join(str(exc).split())[:200]}"
    if attrs.get("complete") not in (True, 1):
        return "not complete"
    if attrs.get("model_checksum") != model_checksum:
        return "written by another map"
    if held != (part.start, part.stop):
        return f"holds rows {held}, not [{part.start}, {part.stop})"
    return None


def check_model_file(model_path: str, manifest: Manifest):
    """The published model file the manifest names, loaded and checked against it (its file checksum and
    its map's); a missing or different one is a :class:`ModelFileError` naming it."""
    from ..core.model import file_checksum, load_model, map_checksum

    path = os.path.join(os.path.dirname(os.path.abspath(model_path)), manifest.model_file)
    if not os.path.lexists(path):
        raise ModelFileError(
            f"{path}: the model file of published version {manifest.version} is missing (deleted by hand?); "
            "run with --republish to publish a new version from the current statistics"
        )
    model = load_model(path)
    if file_checksum(model) != manifest.file_checksum or map_checksum(model) != manifest.model_checksum:
        raise ModelFileError(
            f"{path}: is not the model file {manifest_path(model_path)} published as version {manifest.version} "
            "(its checksum differs); run with --republish to publish a new version from the current statistics"
        )
    return model


def check_outputs(model_path: str, manifest: Manifest, read: ReadOptions | None = None) -> Manifest:
    """Refuse a publication whose output parts were deleted or changed by hand, naming each of them.

    A part whose file-system stamp is the one the manifest recorded is not opened (so a night does not
    cost more as parts accumulate); a part whose stamp changed, or that has none (written moments
    before, or on object storage: ``Output.stamp``), is checked in full (:func:`part_problem`). Returns
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
            problem = part_problem(part, manifest.model_checksum, read)
            if problem is not None:
                problems.append(f"{part.path} ({problem})")
            parts.append(part if stamp == part.stamp else replace(part, stamp=stamp))
        inputs.append(item if tuple(parts) == item.parts else replace(item, parts=tuple(parts)))
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise BadInputError(
            f"{manifest_path(model_path)}: outputs of published version {manifest.version} were deleted or "
            f"changed by hand: {shown}. Restore them, or run with --republish to publish a new version"
        )
    if all(new is old for new, old in zip(inputs, manifest.inputs, strict=True)):
        return manifest
    return replace(manifest, inputs=tuple(inputs))


# ------------------------------------------------------------------------------------------- the reader


@dataclass(frozen=True)
class Publication:
    """A published version of a job's outputs, as its manifest listed it when :func:`published` read it.

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

    def load_model(self):
        """The published model, checked against the manifest."""
        return check_model_file(self.model_path, self.manifest)

    def parts(self, input_spec: str) -> tuple[Part, ...]:
        """The output parts of ``input_spec`` (as the job names it, or another path to the same file, with
        or without the dataset a file of one dataset needs none for), in row order: part ``i`` holds the
        transform of input rows ``[start, stop)``."""
        path, inner = _key(input_spec)
        for item in self.manifest.inputs:
            other_path, other_inner = _key(item.spec)
            if (
                item.spec == input_spec
                or (path == other_path and None in (inner, other_inner))
                or ((path, inner) == (other_path, other_inner))
            ):
                return item.parts
        raise BadInputError(
            f"{input_spec}: not an input of published version {self.version} ({self.path}); its inputs: "
            + ", ".join(self.inputs)
        )

    def read(self, input_spec: str) -> np.ndarray:
        """The whitened rows of ``input_spec`` in this version: its parts, each checked, concatenated."""
        from ..io import open_source

        blocks = []
        for part in self.parts(input_spec):
            problem = part_problem(part, self.model_checksum, self.read_options)
            if problem is not None:
                raise BadInputError(
                    f"{part.path}: an output of published version {self.version} is {problem} (a newer version "
                    "was published and this one deleted? read the publication again)"
                )
            with open_source(part.path, read=self.read_options) as source:
                if source.n_rows != part.n_rows:
                    raise BadInputError(f"{part.path}: holds {source.n_rows} rows, not the {part.n_rows} published")
                blocks.append(source.read(0, source.n_rows))
        return np.concatenate(blocks) if len(blocks) > 1 else blocks[0]

    def to_dict(self) -> dict:
        """What ``info --json`` shows of it."""
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
    :class:`BadInputError` when nothing was published, and :class:`ModelFileError` for a damaged manifest.
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
    "Publication",
    "check_model_file",
    "check_outputs",
    "manifest_path",
    "part_problem",
    "published",
    "read_manifest",
    "version_model_path",
    "versioned_output",
    "write_manifest",
]
