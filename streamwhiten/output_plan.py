"""The output plan: everything an apply output is written with, in one frozen value.

An `OutputPlan` is made once by the engine (``engine.apply.plan_output``) and handed whole to every writer,
the progress record (`OutputPlan.resume_record`), the up-to-date check (`OutputPlan.matches`) and the
setting read back from an output (`OutputPlan.from_attrs`). It alone writes the output's attributes
(`OutputPlan.to_attrs`); readers use the names below. A foundation module (standard library and
``records`` only): ``io`` writes the plan, ``engine`` builds it, ``core`` names `STORAGE_ATTR`; it holds
values only, the stored codes described by a `StoredAs`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import __version__
from .records import Fingerprint, ResumeRecord

# -- the attribute names of an output (read elsewhere through these constants)
#: Every output of streamwhiten carries it: what ``overwrite`` may replace.
OWNER_ATTR = "streamwhiten_version"
#: False until the output is committed (until then it counts as absent).
COMPLETE_ATTR = "complete"
#: The checksum of the map that wrote the output (``AffineMap.checksum``).
CHECKSUM_ATTR = "model_checksum"
#: The hash of the sampled input rows it was written from.
SOURCE_SHA_ATTR = "source_sha256"
#: The input rows ``[start, stop)`` it holds, where it holds part of its input.
ROWS_ATTR = "rows"
#: The input columns carried beside the vectors (table outputs).
KEPT_ATTR = "kept_columns"
#: The compressor of its chunks (outputs that compress).
COMPRESSOR_ATTR = "compressor"
#: The record of how stored codes decode (int8 codes, sign bits; a codec's later).
STORAGE_ATTR = "quantization"
#: The input rows that held NaN or Inf (written as NaN rows).
NONFINITE_ATTR = "n_nonfinite_rows"

#: The model's parameters an output records beside its map's checksum, in this order.
MODEL_PARAMS = ("beta", "gamma", "eps", "eps_value", "n_components")
#: What an output written before an option existed was written with (missing from its attributes).
_OPTION_DEFAULTS = {COMPRESSOR_ATTR: "none"}
#: The input hash recorded until it is known at commit: of its size, so a resumed HDF5 output's layout is
#: that of an uninterrupted one.
PLACEHOLDER_SHA = "0" * 64


def record_digest(record: Mapping[str, Any]) -> str:
    """The SHA-256 of a JSON record as sorted, compact JSON: equal records, equal digests."""
    text = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def storage_record(attrs: Mapping[str, Any]) -> Any:
    """The storage record an output's attributes carry under `STORAGE_ATTR` (JSON, or its text as HDF5
    keeps it); None for floats."""
    record = attrs.get(STORAGE_ATTR) if hasattr(attrs, "get") else None
    if isinstance(record, bytes):
        record = record.decode()
    if isinstance(record, str):
        record = json.loads(record)
    return record


def recorded_rows(attrs: Mapping[str, Any]) -> tuple[int, int] | None:
    """The input rows ``(start, stop)`` an output holds (`ROWS_ATTR`; None: every row); `ValueError` for a
    value that is no pair."""
    value = attrs.get(ROWS_ATTR)
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        value = json.loads(value)
    start, stop = (int(item) for item in value)
    return start, stop


def is_complete(attrs: Mapping[str, Any]) -> bool:
    """Whether an output's attributes say it was committed."""
    return attrs.get(COMPLETE_ATTR) in (True, 1)


def is_incomplete_output(attrs: Any) -> bool:
    """Whether ``attrs`` are those of an output of ours not yet committed (taken for absent)."""
    return isinstance(attrs, Mapping) and COMPLETE_ATTR in attrs and CHECKSUM_ATTR in attrs and not attrs[COMPLETE_ATTR]


@dataclass(frozen=True)
class StoredAs:
    """How an output's vectors are stored when they are not floats: codes of a recorded kind.

    Attributes
    ----------
    kind : str
        What the output's ``dtype`` attribute says (``"int8"``, ``"binary"``; a codec's label).
    width, dtype
        Stored values per row and their dtype name (``"uint8"`` for bits or a codec's bytes per vector).
    record : mapping
        The JSON object recorded under `STORAGE_ATTR`: how the codes decode.
    digest : str
        What a resumed or up-to-date output must match: the record's digest (a codec's: of its bytes).
    read_digest : callable, optional
        The digest of the record an existing output carries (default: `record_digest` of the JSON).
    encoder : object, optional
        What encodes a block of floats into these codes (``encode(rows)``; None when read back).
    """

    kind: str
    width: int
    dtype: str
    record: Mapping[str, Any] = field(hash=False)
    digest: str
    read_digest: Callable[[Mapping[str, Any]], str] | None = field(default=None, compare=False, repr=False)
    encoder: Any = field(default=None, compare=False, repr=False)

    def digest_in(self, attrs: Mapping[str, Any]) -> str:
        """The digest of the record ``attrs`` carry (errors of a damaged one propagate)."""
        if self.read_digest is not None:
            return self.read_digest(attrs)
        return record_digest(storage_record(attrs))


@dataclass(frozen=True)
class OutputPlan:
    """What one output is written with; without ``model_checksum``, a plain store (the example data).

    Attributes
    ----------
    n_rows, width, dtype
        The array: rows, values per row, the stored dtype name (``"float32"``, ``"float16"``, ``"int8"``,
        ``"uint8"``).
    storage : StoredAs, optional
        Codes: their kind and record (None: floats).
    chunk_rows, block_rows
        Rows per output chunk (None: the backend's default size) and per block written.
    compressor, zarr_format, direct_io, checksums
        How the chunks are written (the first two recorded where the kind offers the choice: ``records_*``).
    kept_columns, kept_schema
        Input columns carried beside the vectors, and their types (the backend library's schema).
    rows
        The input rows ``(start, stop)`` written, where an apply writes part of its input.
    normalize, skip_nonfinite, fill_missing_chunks
        What changes the values written (recorded, compared by `matches`).
    source, source_sha256
        The input's label, and the hash of its sampled rows where known before writing.
    model_checksum, model_params
        The map that writes it, and the model's parameters recorded beside it (``beta``, ``gamma``, ...).
    output
        The output's absolute path or normalised URL (what a progress record names).
    caller_attrs
        Attributes the caller records beside the plan's own (``run``: the job, version and input).
    """

    n_rows: int
    width: int
    dtype: str = "float32"
    storage: StoredAs | None = None
    chunk_rows: int | None = None
    block_rows: int = 0
    compressor: str = "none"
    zarr_format: int = 3
    records_compressor: bool = False
    records_format: bool = False
    direct_io: bool = True
    checksums: bool = True
    kept_columns: tuple[str, ...] = ()
    kept_schema: Any = field(default=None, compare=False, repr=False)
    rows: tuple[int, int] | None = None
    normalize: bool = False
    skip_nonfinite: bool = False
    fill_missing_chunks: bool = False
    source: str = ""
    source_sha256: str | None = None
    model_checksum: str | None = None
    model_params: tuple[tuple[str, Any], ...] = ()
    output: str = ""
    caller_attrs: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kept_columns", tuple(self.kept_columns))
        if self.rows is not None:
            object.__setattr__(self, "rows", (int(self.rows[0]), int(self.rows[1])))

    @property
    def shape(self) -> tuple[int, int]:
        return self.n_rows, self.width

    @property
    def kind(self) -> str:
        """The storage an outcome reports: the codes' kind, else the float dtype."""
        return self.dtype if self.storage is None else self.storage.kind

    # -- the attributes
    def recorded_options(self) -> dict[str, Any]:
        """The options the output records because they change what is written (or whether it can be)."""
        options: dict[str, Any] = {
            "skip_nonfinite": bool(self.skip_nonfinite),
            "fill_missing_chunks": bool(self.fill_missing_chunks),
        }
        if self.records_format:
            options["zarr_format"] = int(self.zarr_format)
        if self.records_compressor:
            options[COMPRESSOR_ATTR] = str(self.compressor)
        return options

    def to_attrs(self) -> dict[str, Any]:
        """The attributes the output is created with: its source and rows, map, options, kept columns,
        codes' kind and record, the caller's, and the marks of an output not yet complete (the input hash
        is `PLACEHOLDER_SHA` until `commit_attrs` sets it)."""
        if self.model_checksum is None:  # a plain store
            return {**self.caller_attrs, COMPLETE_ATTR: False, NONFINITE_ATTR: 0, OWNER_ATTR: __version__}
        attrs: dict[str, Any] = {
            OWNER_ATTR: __version__,
            "source": self.source,
            CHECKSUM_ATTR: self.model_checksum,
            **dict(self.model_params),
            "normalized": bool(self.normalize),
            SOURCE_SHA_ATTR: self.source_sha256 or PLACEHOLDER_SHA,
        }
        attrs.update(self.recorded_options())
        if self.kept_columns:
            attrs[KEPT_ATTR] = list(self.kept_columns)
        if self.storage is not None:
            attrs["dtype"] = self.storage.kind
            attrs[STORAGE_ATTR] = dict(self.storage.record)
        if self.rows is not None:
            attrs[ROWS_ATTR] = [int(self.rows[0]), int(self.rows[1])]
        attrs.update(self.caller_attrs)
        attrs.update({COMPLETE_ATTR: False, NONFINITE_ATTR: 0})
        return attrs

    def commit_attrs(self, n_nonfinite_rows: int, source_sha256: str | None = None) -> dict[str, Any]:
        """The attributes set at commit: the caller's again, the non-finite rows, the input hash if taken."""
        attrs = {**self.caller_attrs, NONFINITE_ATTR: n_nonfinite_rows}
        if source_sha256 is not None:
            attrs[SOURCE_SHA_ATTR] = source_sha256
        return attrs

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], dtype: str | None = None) -> OutputPlan:
        """The setting an existing output was written with, as its attributes record it (``dtype``: its
        array's); what is not recorded keeps its default. `ValueError` for a damaged rows or storage record."""
        record = storage_record(attrs)
        storage = None
        if record is not None:  # codes: the record says their kind, width and dtype
            kind = str(attrs.get("dtype", record.get("kind")))
            width = int(record.get("bytes_per_vector") or 0)
            storage = StoredAs(kind, width, str(record.get("dtype", "uint8")), record, record_digest(record))
        params = tuple((key, attrs[key]) for key in MODEL_PARAMS if key in attrs)
        width = storage.width if storage is not None else int(attrs.get("n_components") or 0)
        return cls(
            n_rows=0,
            width=width,
            dtype=storage.dtype if storage is not None else (dtype or "float32"),
            storage=storage,
            compressor=str(attrs.get(COMPRESSOR_ATTR, _OPTION_DEFAULTS[COMPRESSOR_ATTR])),
            zarr_format=int(attrs.get("zarr_format", 3)),
            records_compressor=COMPRESSOR_ATTR in attrs,
            records_format="zarr_format" in attrs,
            kept_columns=tuple(attrs.get(KEPT_ATTR) or ()),
            rows=recorded_rows(attrs),
            normalize=bool(attrs.get("normalized")),
            skip_nonfinite=bool(attrs.get("skip_nonfinite")),
            fill_missing_chunks=bool(attrs.get("fill_missing_chunks")),
            source=str(attrs.get("source", "")),
            source_sha256=attrs.get(SOURCE_SHA_ATTR),
            model_checksum=attrs.get(CHECKSUM_ATTR),
            model_params=params,
        )

    def matches(self, attrs: Mapping[str, Any], dtype: str | None = None) -> bool:
        """Whether an output whose attributes are ``attrs`` (its array of ``dtype``) is complete and holds what
        this plan writes: map, input rows, normalisation, stored values, recorded options, kept columns."""
        try:
            if self.storage is None:
                same_values = dtype is not None and str(dtype) == self.dtype and STORAGE_ATTR not in attrs
            else:
                same_values = self.storage.digest_in(attrs) == self.storage.digest
            held = recorded_rows(attrs)
        except Exception:  # noqa: BLE001 - an unreadable old output is simply rewritten
            return False
        return (
            is_complete(attrs)
            and attrs.get(CHECKSUM_ATTR) == self.model_checksum
            and attrs.get(SOURCE_SHA_ATTR) == self.source_sha256
            and bool(attrs.get("normalized")) == bool(self.normalize)
            and same_values
            and all(
                attrs.get(key, _OPTION_DEFAULTS.get(key)) == value for key, value in self.recorded_options().items()
            )
            and list(attrs.get(KEPT_ATTR) or []) == list(self.kept_columns)
            and held == self.rows
        )

    # -- the progress record
    def resume_record(self, source: Fingerprint, threads: int) -> ResumeRecord:
        """What must match for a partial output to be continued: this plan, the input's whole fingerprint and
        the worker ``threads`` (BLAS rounding can depend on them)."""
        assert self.model_checksum is not None, "a plain store is not resumed"
        return ResumeRecord(
            model_checksum=self.model_checksum,
            source=source,
            output=self.output,
            normalize=bool(self.normalize),
            dtype=self.kind,
            zarr_format=int(self.zarr_format),
            block_rows=self.block_rows,
            skip_nonfinite=bool(self.skip_nonfinite),
            threads=threads,
            compressor=self.compressor,
            keep_columns=self.kept_columns,
            quantization=None if self.storage is None else self.storage.digest,
            rows=self.rows,
        )


__all__ = [
    "CHECKSUM_ATTR",
    "COMPLETE_ATTR",
    "COMPRESSOR_ATTR",
    "KEPT_ATTR",
    "MODEL_PARAMS",
    "NONFINITE_ATTR",
    "OWNER_ATTR",
    "PLACEHOLDER_SHA",
    "ROWS_ATTR",
    "SOURCE_SHA_ATTR",
    "STORAGE_ATTR",
    "OutputPlan",
    "StoredAs",
    "is_complete",
    "is_incomplete_output",
    "record_digest",
    "recorded_rows",
    "storage_record",
]
