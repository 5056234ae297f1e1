"""Records: what streamwhiten writes down about a store it read and a run it may resume, as frozen dataclasses.

A record is a value: it is made whole, compared whole and changed only into a new record
(:func:`dataclasses.replace`). It becomes JSON only where it meets a file, through ``to_dict`` and
``from_dict``, which give and take exactly the objects the files have always held (the same keys, the
same values, a key left out where the record has no value for it), so model files, checkpoints, progress
records and output attributes written before these classes existed are read as they were written.

- :class:`Fingerprint`: which rows of which store a fit read (a model's ``sources``, a checkpoint's
  cursors, the input of an apply);
- :class:`ResumeRecord`: the progress record of an apply (``.NAME.partial.progress.json``): the job it
  belongs to and how far it got.

This module imports nothing but the standard library, below ``io`` and ``core``: both read and write them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar


@dataclass(frozen=True)
class Fingerprint:
    """What identifies the first ``n_rows`` rows of a store, cheap to take (``io.fingerprint``).

    Every field is None where the record holds no value for it (its key is absent from the JSON): a
    fingerprint taken before the pass hashed its rows has no ``sha256_sampled`` yet, and one a
    checkpoint wrote part-way has the partial-read pair instead (``sha256_read``, ``rows_read``: the hash
    of the sampled rows before ``rows_read``); a source recorded by a caller of ``finalize`` may hold
    less still (an update then refuses it).

    Attributes
    ----------
    path, dataset : str
        Where the array is (a real path, or a URL's normalised form without credentials; the dataset,
        "" where the store holds one array).
    n_rows, n_features, dtype, chunk_rows
        Its shape, element type and rows per store chunk (0: contiguous).
    layout_sha256 : str
        A digest of how those rows are stored, where the backend has one (a Parquet footer, Lance fragments).
    sha256_sampled : str
        The hash of sampled row ranges (start, quartiles, end) of the first ``n_rows`` rows.
    sha256_read, rows_read
        A part-way hash: of the sampled rows before ``rows_read`` only.
    size, etag, version
        The backends' extras: an object's (or a prefix's) bytes and ETag or digest, a Lance dataset's
        version. Not compared by an update: appends change them.
    other : mapping
        Keys of the JSON object that no field above names, kept as they were.
    """

    path: str | None = None
    dataset: str | None = None
    n_rows: int | None = None
    n_features: int | None = None
    dtype: str | None = None
    chunk_rows: int | None = None
    layout_sha256: str | None = None
    sha256_sampled: str | None = None
    sha256_read: str | None = None
    rows_read: int | None = None
    size: int | None = None
    etag: str | None = None
    version: int | None = None
    other: Mapping[str, Any] = field(default_factory=dict, hash=False)

    #: The keys of the JSON object that fields name.
    KEYS: ClassVar[tuple[str, ...]] = (
        "path",
        "dataset",
        "n_rows",
        "n_features",
        "dtype",
        "chunk_rows",
        "layout_sha256",
        "sha256_sampled",
        "sha256_read",
        "rows_read",
        "size",
        "etag",
        "version",
    )

    def __post_init__(self) -> None:
        clash = sorted(set(self.other) & set(self.KEYS))
        if clash:
            raise ValueError(f"a fingerprint's other keys may not name its fields: {clash}")
        object.__setattr__(self, "other", dict(self.other))

    @property
    def where(self) -> str:
        """``path`` and ``:/dataset`` where there is one, for messages."""
        return f"{self.path}:/{self.dataset}" if self.dataset else str(self.path)

    def missing(self, names: Iterable[str]) -> list[str]:
        """Those of the fields ``names`` that the record holds no value for."""
        return [name for name in names if getattr(self, name) is None]

    def read_to(self, rows_read: int, sha256_read: str) -> Fingerprint:
        """This fingerprint with the part-way hash of a source read up to row ``rows_read``."""
        return replace(self, rows_read=int(rows_read), sha256_read=sha256_read)

    def finished(self, sha256_sampled: str) -> Fingerprint:
        """This fingerprint of a source read to the end: the whole hash in place of a part-way one."""
        return replace(self, sha256_sampled=sha256_sampled, sha256_read=None, rows_read=None)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this fingerprint: the fields that hold a value and the other keys, sorted by key."""
        found = {name: getattr(self, name) for name in self.KEYS if getattr(self, name) is not None}
        found.update(self.other)
        return dict(sorted(found.items()))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        """The fingerprint recorded as the JSON object ``data`` (:class:`TypeError` if it is none)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"a fingerprint is a JSON object, got {type(data).__name__}")
        known = {key: data[key] for key in cls.KEYS if key in data and data[key] is not None}
        other = {key: value for key, value in data.items() if key not in cls.KEYS}
        return cls(**known, other=other)


def fingerprint_of(value: Fingerprint | Mapping[str, Any]) -> Fingerprint:
    """``value`` as a :class:`Fingerprint` (a JSON object is read with :meth:`Fingerprint.from_dict`)."""
    return value if isinstance(value, Fingerprint) else Fingerprint.from_dict(value)


@dataclass(frozen=True)
class ResumeRecord:
    """An apply's progress record: the job a partial output belongs to, and how far it got.

    The partial output of an interrupted run is continued only by a run of the same job (:meth:`same_job`:
    every field but the two counts equal, the input's whole fingerprint included); ``rows_done`` rows are
    then durable, ``n_nonfinite`` of them written as NaN.

    Attributes
    ----------
    model_checksum : str
        The checksum of the map written (``AffineMap.checksum``).
    source : Fingerprint
        The input's whole fingerprint.
    output : str
        The output's absolute path, or its URL normalised.
    normalize, dtype, zarr_format, block_rows, skip_nonfinite, threads
        How it is written (threads too: BLAS rounding can depend on its threads per call).
    compressor : str
        The output's compressor ("none": absent from the JSON).
    keep_columns : tuple of str
        Input columns carried into the output (none: absent from the JSON).
    rows : tuple of int, optional
        ``(start, stop)``: the input rows written, where an apply writes part of its input (absent from the
        JSON otherwise).
    rows_done, n_nonfinite : int
        Rows written and durable, and how many of them were non-finite input.
    """

    model_checksum: str
    source: Fingerprint
    output: str
    normalize: bool
    dtype: str
    zarr_format: int
    block_rows: int
    skip_nonfinite: bool
    threads: int
    compressor: str = "none"
    keep_columns: tuple[str, ...] = ()
    rows: tuple[int, int] | None = None
    rows_done: int = 0
    n_nonfinite: int = 0

    #: The keys every record holds (those of the job, and the counts); ``compressor`` and ``keep_columns``
    #: only where they are set.
    REQUIRED: ClassVar[tuple[str, ...]] = (
        "model_checksum",
        "source",
        "output",
        "normalize",
        "dtype",
        "zarr_format",
        "block_rows",
        "skip_nonfinite",
        "threads",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "keep_columns", tuple(self.keep_columns))
        if self.rows is not None:
            object.__setattr__(self, "rows", tuple(int(value) for value in self.rows))

    def at(self, rows_done: int, n_nonfinite: int = 0) -> ResumeRecord:
        """This job's record once ``rows_done`` rows are durable, ``n_nonfinite`` of them non-finite input."""
        return replace(self, rows_done=int(rows_done), n_nonfinite=int(n_nonfinite))

    def same_job(self, other: ResumeRecord) -> bool:
        """Whether ``other`` records the same job (whatever the counts of either)."""
        return self.at(0) == other.at(0)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this record, as apply has always written it."""
        data: dict[str, Any] = {name: getattr(self, name) for name in self.REQUIRED}
        data["source"] = self.source.to_dict()
        if self.compressor != "none":
            data["compressor"] = self.compressor
        if self.keep_columns:
            data["keep_columns"] = list(self.keep_columns)
        if self.rows is not None:
            data["rows"] = list(self.rows)
        data["rows_done"] = self.rows_done
        data["n_nonfinite"] = self.n_nonfinite
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResumeRecord:
        """The record written as the JSON object ``data``; :class:`ValueError` for one that holds other keys,
        lacks one or whose values are of the wrong kinds (a partial output it describes is not resumed)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a progress record is a JSON object, got {type(data).__name__}")
        names = {item.name for item in fields(cls)}
        unknown = sorted(set(data) - names)
        missing = [key for key in cls.REQUIRED if key not in data]
        if unknown or missing:
            raise ValueError(f"not a progress record of this version (other keys {unknown}, missing {missing})")
        values = dict(data)
        try:
            values["source"] = Fingerprint.from_dict(values["source"])
            values["keep_columns"] = tuple(values.get("keep_columns", ()))
            if values.get("rows") is not None:
                start, stop = values["rows"]
                values["rows"] = (int(start), int(stop))
            values["rows_done"] = int(values.get("rows_done", 0))
            values["n_nonfinite"] = int(values.get("n_nonfinite", 0))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"a progress record holds a value of the wrong kind ({exc})") from None
        return cls(**values)


__all__ = ["Fingerprint", "ResumeRecord", "fingerprint_of"]
