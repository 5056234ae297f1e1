"""Reading a job's published outputs through its manifest: one complete version, each part checked.

[`published`][streamwhiten.job.publication.published] reads the manifest once: a version's outputs are all
written before the manifest names them and deleted only after a newer one does (``keep_versions`` kept),
and each part is checked before it is read (complete, this version's map, the rows listed, this job's).

Examples
--------
>>> import streamwhiten
>>> publication = streamwhiten.published("models/nightly.npz")  # doctest: +SKIP
>>> publication.version, publication.outputs                    # doctest: +SKIP
(3, ('/data/out/day-1.v3.zarr', '/data/out/day-1.v3.part1.zarr', '/data/out/day-2.v3.zarr'))
>>> vectors = publication.read("/data/shards/day-1.h5:/emb")     # doctest: +SKIP
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import numpy.typing as npt

from ..errors import BadInputError
from ..options import ReadOptions
from ..records import Manifest, Part, PublishedInput
from .manifest import manifest_path, read_manifest
from .ownership import attrs_problem, check_model_file, unreadable

if TYPE_CHECKING:
    from ..codes.storage import CodecEncoder
    from ..core.model import WhiteningModel
    from ..core.quantize import Quantization


@dataclass(frozen=True)
class Publication:
    """A published version of a job's outputs, as [`published`][streamwhiten.job.publication.published] read
    it: that version whatever a run publishes meanwhile, each part checked before it is read."""

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
        """The parts of ``input_spec`` (or another path to its file) in row order, each input rows ``[start, stop)``."""
        return self._input(input_spec).parts

    def _input(self, input_spec: str) -> PublishedInput:
        """The published input ``input_spec`` names, as the manifest records it."""
        path, inner = _key(input_spec)
        for item in self.manifest.inputs:
            other_path, other_inner = _key(item.spec)
            if item.spec == input_spec or (
                path == other_path and (inner == other_inner or None in (inner, other_inner))
            ):
                return item
        raise BadInputError(
            f"{input_spec}: not an input of published version {self.version} ({self.path}); its inputs: "
            + ", ".join(self.inputs)
        )

    def read(self, input_spec: str, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
        """The whitened rows of ``input_spec`` in this version: its parts, each checked, concatenated; codes
        decoded to floats of ``dtype`` as ``streamwhiten.serving.decode`` decodes them."""
        blocks, record = self._read_parts(input_spec)
        if record is not None:
            return record.decode(blocks, dtype)
        return blocks

    def read_codes(self, input_spec: str) -> tuple[np.ndarray, Quantization | CodecEncoder]:
        """``(codes, decoder)``: the stored codes of ``input_spec`` in this version, checked as
        [`read`][streamwhiten.job.publication.Publication.read] checks them, and ``decoder.decode(codes)``'s
        decoder (a `Quantization`, or a vector code's ``codes.storage.CodecEncoder``); floats are refused."""
        blocks, record = self._read_parts(input_spec)
        if record is None:
            raise BadInputError(
                f"{self.path}: version {self.version} publishes float rows, not codes: read them with read()"
            )
        return blocks, record

    def _read_parts(self, input_spec: str) -> tuple[np.ndarray, Any]:
        """``input_spec``'s parts' stored rows, each checked, concatenated, and their one decoder (None: floats)."""
        from ..io import open_output, open_source

        blocks: list[np.ndarray] = []
        decoders: list[tuple[str | None, Any]] = []
        codecs: dict[str, CodecEncoder] = {}
        entry = self._input(input_spec)
        for part in entry.parts:
            # one open per part: its attributes are checked (as part_problem checks them), then its rows read
            try:
                source = open_source(part.path, read=self.read_options, codes=True)
            except Exception as exc:  # noqa: BLE001 - missing or unreadable: not what was published
                exists = open_output(part.path, self.read_options).exists()
                self._refuse(part, "missing" if not exists else unreadable(exc), exc)
            with source:
                attrs = source.attrs()
                problem = attrs_problem(part, attrs, self.manifest, entry.spec)
                if problem is not None:
                    self._refuse(part, problem)
                if source.n_rows != part.n_rows:
                    raise BadInputError(f"{part.path}: holds {source.n_rows} rows, not the {part.n_rows} published")
                decoders.append(self._decoder(part, attrs, codecs))
                blocks.append(source.read(0, source.n_rows))
        if len({digest for digest, _ in decoders}) > 1:
            raise BadInputError(f"{self.path}: the parts of {input_spec} hold differently encoded rows")
        rows = np.concatenate(blocks) if len(blocks) > 1 else blocks[0]
        return rows, decoders[0][1]

    def _decoder(self, part: Part, attrs: Any, codecs: dict[str, CodecEncoder]) -> tuple[str | None, Any]:
        """``(digest, decoder)`` of a part's rows: none for floats, the `Quantization` codes record, or the published
        model's resolved codec, which must be the part's (else, where the model has none, the part's own bytes)."""
        from ..codes import codec_from_record
        from ..codes.storage import CodecEncoder, codec_digest, resolve
        from ..core.quantize import Quantization
        from ..output_plan import STORAGE_ATTR, storage_record

        if STORAGE_ATTR not in attrs:
            return None, None
        try:
            sha: str | None = codec_digest(attrs)  # the digest resolve gives a vector code's output
        except Exception:  # noqa: BLE001 - not a vector code's record: read as Quantization's, which says what is wrong
            sha = None
        if sha is None:
            quantization = Quantization.from_attrs(attrs)
            return quantization.digest(), quantization
        if sha not in codecs:  # the model is loaded and checked once per codec, not once per part
            model = self.load_model()
            entry = storage_record(attrs)["codec"]
            if model.storage is not None and model.storage.codec is not None:
                stored = resolve(model)
                if stored is None or stored.digest != sha:
                    self._refuse(part, "coded by another codec than the published model records")
                codecs[sha] = stored.encoder
            elif "data" not in entry:
                self._refuse(part, "coded by another codec than the published model records")
            else:
                codec = codec_from_record(entry, part.path)  # its bytes checked against their SHA-256
                codecs[sha] = CodecEncoder(base64.b64decode(entry["data"]), codec)
        return sha, codecs[sha]

    def _refuse(self, part: Part, problem: str, cause: BaseException | None = None) -> NoReturn:
        """Refuse ``part`` in one sentence: the part, the version, what is wrong (and why, where it is missing)."""
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
    """The current publication of the job keeping ``model_path``: one manifest read, one consistent version
    (``read``: how URL outputs are reached). `BadInputError` when none was published; `ModelFileError` for a
    damaged manifest."""
    manifest = read_manifest(model_path)
    if manifest is None:
        raise BadInputError(
            f"{manifest_path(model_path)}: no publication beside {model_path} (a job with a [publish] table "
            "publishes one on its first run)"
        )
    return Publication(os.fspath(model_path), manifest, read if read is not None else ReadOptions())


__all__ = ["Publication", "published"]
