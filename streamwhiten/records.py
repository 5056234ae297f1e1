"""Records: what streamwhiten writes down about a store it read (`Fingerprint`), an apply it may resume
(`ResumeRecord`) and a job's publication (`Manifest`), as frozen dataclasses.

A record becomes JSON only where it meets a file, through ``to_dict`` and ``from_dict``, which give and take
exactly the objects the files have always held (a key left out where the record has no value), so files
written before these classes existed are read as they were written. Standard library only: ``io`` and
``core`` both use them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, ClassVar


@dataclass(frozen=True)
class Fingerprint:
    """What identifies the first ``n_rows`` rows of a store, cheap to take (``io.fingerprint``).

    A field is None where the record holds no value (its key is absent from the JSON): before the pass
    hashed the rows there is no ``sha256_sampled``; a checkpoint written part-way has the partial pair.

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
        The backends' extras (an object's bytes and ETag, a Lance version); an update ignores them.
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

    #: The keys of the JSON object that fields name (every field but ``other``; set below the class).
    KEYS: ClassVar[tuple[str, ...]]

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
        """The fingerprint recorded as the JSON object ``data`` (`TypeError` if it is none)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"a fingerprint is a JSON object, got {type(data).__name__}")
        known = {key: data[key] for key in cls.KEYS if key in data and data[key] is not None}
        other = {key: value for key, value in data.items() if key not in cls.KEYS}
        return cls(**known, other=other)


Fingerprint.KEYS = tuple(item.name for item in fields(Fingerprint) if item.name != "other")


def fingerprint_of(value: Fingerprint | Mapping[str, Any]) -> Fingerprint:
    """``value`` as a `Fingerprint` (a JSON object is read with `Fingerprint.from_dict`)."""
    return value if isinstance(value, Fingerprint) else Fingerprint.from_dict(value)


@dataclass(frozen=True)
class ResumeRecord:
    """An apply's progress record: the job a partial output belongs to, and how far it got; a partial output
    is continued only by a run of the same job (`same_job`: every field but the two counts equal).

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
    compressor, keep_columns, quantization, rows
        The compressor, the input columns carried, the digest of a codes' decode record, the input rows
        ``(start, stop)`` written: each absent from the JSON where not set ("none", (), None, None).
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
    quantization: str | None = None
    rows: tuple[int, int] | None = None
    rows_done: int = 0
    n_nonfinite: int = 0

    #: The keys every record holds besides the counts: the fields without a default (set below the class).
    REQUIRED: ClassVar[tuple[str, ...]]

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
        for name, unset in (("compressor", "none"), ("keep_columns", ()), ("quantization", None), ("rows", None)):
            value = getattr(self, name)
            if value != unset:
                data[name] = list(value) if isinstance(value, tuple) else value
        data["rows_done"] = self.rows_done
        data["n_nonfinite"] = self.n_nonfinite
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResumeRecord:
        """The record written as the JSON object ``data``; `ValueError` for one that holds other keys,
        lacks one or whose values are of the wrong kinds (a partial output it describes is not resumed)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a progress record is a JSON object, got {type(data).__name__}")
        names = {item.name for item in fields(cls)}
        unknown = sorted(set(data) - names)
        missing = [key for key in cls.REQUIRED if key not in data]
        if unknown or missing:
            raise ValueError(f"not a progress record of this version (other keys {unknown}, missing {missing})")
        refuse_nul(data, "the progress record's")
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


ResumeRecord.REQUIRED = tuple(item.name for item in fields(ResumeRecord) if item.default is MISSING)


def nul_field(data: Any, where: str = "") -> str | None:
    """The path (``inputs[0].parts[1].path``) of the first key or string in ``data`` holding a NUL byte, or
    None: no writer records one, so the reader names the field before it reaches ``os.stat``."""
    if isinstance(data, str):
        return (where or "a value") if "\x00" in data else None
    mapping = isinstance(data, Mapping)
    items = data.items() if mapping else enumerate(data) if isinstance(data, (list, tuple)) else ()
    for key, value in items:
        if mapping and isinstance(key, str) and "\x00" in key:
            return f"the key {key!r} of {where or 'the record'}"
        found = nul_field(value, (f"{where}.{key}" if where else str(key)) if mapping else f"{where}[{key}]")
        if found is not None:
            return found
    return None


def refuse_nul(data: Any, what: str) -> None:
    """`ValueError` naming the field of ``data`` that holds a NUL byte (`nul_field`), if one does."""
    found = nul_field(data)
    if found is not None:
        raise ValueError(f"{what} field {found} holds a NUL byte, which no path or name can hold")


def _count(value: Any, what: str, low: int = 0) -> int:
    """``value`` if it is a whole number (not a bool) of at least ``low``, else `ValueError`."""
    if type(value) is not int or value < low:
        raise ValueError(f"{what} must be a whole number of at least {low}, got {value!r}")
    return value


def _text(value: Any, what: str, plain: bool = False) -> str:
    """``value`` if it is a non-empty string without a NUL byte (``plain``: printable text only)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    if "\x00" in value or (plain and not value.isprintable()):
        raise ValueError(f"{what} holds {'a NUL byte' if chr(0) in value else 'a control character'}: {value!r}")
    return value


def _set(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` less its None values: a record leaves out the keys it has no value for."""
    return {key: value for key, value in data.items() if value is not None}


def _keys(data: Any, what: str, required: Iterable[str], optional: Iterable[str] = ()) -> Mapping[str, Any]:
    """``data`` if it is a JSON object with every key of ``required`` and no other than ``optional``."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be a JSON object, got {type(data).__name__}")
    required = tuple(required)
    missing = [key for key in required if key not in data]
    unknown = sorted(set(data) - set(required) - set(optional))
    if missing or unknown:
        raise ValueError(f"{what} lacks {missing} or holds unknown keys {unknown}")
    return data


@dataclass(frozen=True)
class Part:
    """One output part of a published input: the output ``path`` (a store spec) holding the transform of
    the input rows ``[start, stop)``; ``stamp``: its file-system stamp when last checked (None: none), which
    spares opening an unchanged part again."""

    path: str
    start: int
    stop: int
    stamp: str | None = None

    @property
    def n_rows(self) -> int:
        return self.stop - self.start

    def to_dict(self) -> dict[str, Any]:
        return _set({"path": self.path, "start": self.start, "stop": self.stop, "stamp": self.stamp})

    @classmethod
    def from_dict(cls, data: Any, what: str = "part") -> Part:
        data = _keys(data, what, ("path", "start", "stop"), ("stamp",))
        start, stop = _count(data["start"], f"{what} start"), _count(data["stop"], f"{what} stop")
        if stop <= start:
            raise ValueError(f"{what} holds no rows (start {start}, stop {stop})")
        stamp = None if data.get("stamp") is None else _text(data["stamp"], f"{what} stamp", plain=True)
        return cls(_text(data["path"], f"{what} path"), start, stop, stamp)


#: The fields of a fingerprint that are whole numbers (the others are text).
_FINGERPRINT_COUNTS = ("n_rows", "n_features", "chunk_rows", "rows_read", "size", "version")


def _check_fingerprint(source: Fingerprint) -> None:
    """`ValueError` naming a recorded fingerprint's field that is not a whole number >= 0 or text."""
    for name in Fingerprint.KEYS:
        value = getattr(source, name)
        if value is None:
            continue
        if name in _FINGERPRINT_COUNTS:
            _count(value, name)
        elif not isinstance(value, str) or (name == "path" and not value):  # "" is a dataset or ETag of none
            raise ValueError(f"{name} must be text, got {value!r}")


@dataclass(frozen=True)
class PublishedInput:
    """An input of a publication: its ``spec``, the ``output`` its version-named parts are based on, the
    `Fingerprint` of its rows ``[0, stop)`` (what the next night appends to) and its ``parts`` in row order."""

    spec: str
    output: str
    source: Fingerprint
    parts: tuple[Part, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", tuple(self.parts))

    @property
    def stop(self) -> int:
        """The input rows published: ``[0, stop)``."""
        return self.parts[-1].stop if self.parts else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "output": self.output,
            "source": self.source.to_dict(),
            "parts": [part.to_dict() for part in self.parts],
        }

    @classmethod
    def from_dict(cls, data: Any, what: str = "input") -> PublishedInput:
        data = _keys(data, what, ("spec", "output", "source", "parts"))
        spec = _text(data["spec"], f"{what} spec")
        if not isinstance(data["parts"], list) or not data["parts"]:
            raise ValueError(f"{what} ({spec}) must list its output parts")
        parts = tuple(Part.from_dict(item, f"{what} ({spec}) part {i}") for i, item in enumerate(data["parts"]))
        expected = 0
        for i, part in enumerate(parts):
            if part.start != expected:
                raise ValueError(f"{what} ({spec}) part {i} starts at row {part.start}, not {expected}")
            expected = part.stop
        try:
            source = Fingerprint.from_dict(data["source"])
            _check_fingerprint(source)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{what} ({spec}) source: {exc}") from None
        if source.n_rows != expected:
            raise ValueError(f"{what} ({spec}) source records {source.n_rows} rows, its parts {expected}")
        return cls(spec, _text(data["output"], f"{what} ({spec}) output"), source, parts)


@dataclass(frozen=True)
class Version:
    """A published version still on disk, or being deleted: its number, model file and output parts, and
    the map they were written with (``model_checksum``; None in a manifest of format 1)."""

    version: int
    model_file: str
    outputs: tuple[str, ...]
    model_checksum: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", tuple(self.outputs))

    def to_dict(self) -> dict[str, Any]:
        data = {"version": self.version, "model_file": self.model_file, "outputs": list(self.outputs)}
        return _set({**data, "model_checksum": self.model_checksum})

    @classmethod
    def from_dict(cls, data: Any, what: str = "version") -> Version:
        data = _keys(data, what, ("version", "model_file", "outputs"), ("model_checksum",))
        if not isinstance(data["outputs"], list):
            raise ValueError(f"{what} outputs must be a list")
        checksum = data.get("model_checksum")
        return cls(
            _count(data["version"], f"{what} number", 1),
            _file_name(data["model_file"], f"{what} model_file"),
            tuple(_text(item, f"{what} output") for item in data["outputs"]),
            None if checksum is None else _digest(checksum, f"{what} model_checksum"),
        )


def _file_name(value: Any, what: str) -> str:
    """A file name beside the manifest: no directory part."""
    value = _text(value, what)
    if "/" in value or "\\" in value or value in (".", ".."):
        raise ValueError(f"{what} must be a file name beside the manifest, got {value!r}")
    return value


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _digest(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _SHA256.match(value):
        raise ValueError(f"{what} must be a SHA-256 in hex, got {value!r}")
    return value


#: The largest version number a manifest may hold (a run publishes at most one a night).
MAX_VERSION = 10**9


def json_checksum(body: Mapping[str, Any]) -> str:
    """SHA-256 of ``body`` as canonical JSON (sorted keys, no spaces, ASCII): a manifest's own checksum."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Manifest:
    """The current publication of a job's outputs: what ``MODEL.manifest.json`` holds, replaced whole by one
    atomic rename; its ``checksum`` (of the rest, as canonical JSON) refuses a damaged or edited manifest.

    Attributes
    ----------
    version : int
        The published version (1, 2, ...).
    model_file, file_checksum : str
        The published model file beside the manifest (``MODEL.vN.npz``) and its content checksum.
    model_checksum : str
        The map the outputs were written with (``AffineMap.checksum``).
    published_at, updated_at : str
        When the version was published, and parts last appended (UTC, ISO 8601).
    n_rows : int
        The rows of the statistics the version was finalized from.
    setting : mapping
        The whitening's parameters and the ``[apply]`` options the outputs were written with.
    inputs : tuple of PublishedInput
        Each input and its output parts.
    kept, retired : tuple of Version
        Earlier versions still on disk, newest first; versions whose files are deleted once this is in place.
    job_id : str
        The job's identity, recorded by every file a publication writes: a run deletes or replaces only
        those. None in a manifest of format 1, whose files record none.

    Local paths are relative to the manifest's folder in the file and absolute in the record
    (``streamwhiten.job.manifest`` converts them; format 1 holds absolute paths).
    """

    version: int
    model_file: str
    file_checksum: str
    model_checksum: str
    published_at: str
    n_rows: int
    setting: Mapping[str, Any]
    inputs: tuple[PublishedInput, ...]
    updated_at: str | None = None
    kept: tuple[Version, ...] = ()
    retired: tuple[Version, ...] = ()
    job_id: str | None = None

    FORMAT: ClassVar[str] = "streamwhiten-manifest"
    FORMAT_VERSION: ClassVar[int] = 2
    #: The format versions read (1: absolute paths, no job identity: see ``job.manifest``).
    FORMAT_VERSIONS: ClassVar[tuple[int, ...]] = (1, 2)
    #: The keys every manifest holds: the format's, the fields but the two optional ones, the checksum.
    _KEYS: ClassVar[tuple[str, ...]]

    def __post_init__(self) -> None:
        object.__setattr__(self, "setting", dict(self.setting))
        for name in ("inputs", "kept", "retired"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def legacy(self) -> bool:
        """Whether this is a manifest of format 1 (an earlier release): its files record no job."""
        return self.job_id is None

    def input(self, spec: str) -> PublishedInput | None:
        """The published input ``spec`` (as the job names it), or None."""
        return next((item for item in self.inputs if item.spec == spec), None)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Every output part of this version, input by input, in row order."""
        return tuple(part.path for item in self.inputs for part in item.parts)

    @property
    def as_version(self) -> Version:
        """This version as a `Version` (what a later manifest keeps of it)."""
        return Version(self.version, self.model_file, self.outputs, self.model_checksum)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the manifest, its checksum included."""
        body: dict[str, Any] = {
            "format": self.FORMAT,
            "format_version": 1 if self.legacy else self.FORMAT_VERSION,
            "version": self.version,
            "model_file": self.model_file,
            "file_checksum": self.file_checksum,
            "model_checksum": self.model_checksum,
            "published_at": self.published_at,
            "n_rows": self.n_rows,
            "setting": dict(self.setting),
            "inputs": [item.to_dict() for item in self.inputs],
            "kept": [item.to_dict() for item in self.kept],
            "retired": [item.to_dict() for item in self.retired],
            "updated_at": self.updated_at,
            "job_id": self.job_id,
        }
        body = _set(body)
        body["checksum"] = json_checksum(body)
        return body

    @classmethod
    def _verified(cls, data: Any) -> dict[str, Any]:
        """``data`` with the manifest's keys, format and version, and the checksum of its content."""
        data = _keys(data, "the manifest", cls._KEYS, _OPTIONAL)
        if data["format"] != cls.FORMAT:
            raise ValueError(f"format is {data['format']!r}, not {cls.FORMAT!r}")
        if data["format_version"] not in cls.FORMAT_VERSIONS or type(data["format_version"]) is not int:
            raise ValueError(
                f"format_version {data['format_version']!r} is not one of {cls.FORMAT_VERSIONS} (another release?)"
            )
        if (data["format_version"] == 1) == ("job_id" in data):
            raise ValueError("format_version 2 needs a job_id, and 1 has none")
        body = {key: value for key, value in data.items() if key != "checksum"}
        refuse_nul(body, "the manifest's")  # before any path reaches the file system
        try:
            expected = json_checksum(body)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"it holds values that are not plain JSON ({exc})") from None
        if data["checksum"] != expected:
            raise ValueError("its checksum does not match its content (damaged, or edited by hand)")
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Manifest:
        """The manifest written as the JSON object ``data``; `ValueError` saying what is wrong for one
        that is damaged, edited by hand (its checksum no longer matches) or of another format version."""
        data = cls._verified(data)
        legacy = data["format_version"] == 1
        version = _count(data["version"], "version", 1)
        if version > MAX_VERSION:
            raise ValueError(f"version {version} is more than any run publishes (at most {MAX_VERSION})")
        if not isinstance(data["setting"], Mapping):
            raise ValueError("setting must be a JSON object")
        for key in ("inputs", "kept", "retired"):
            if not isinstance(data[key], list):
                raise ValueError(f"{key} must be a list")
        inputs = tuple(PublishedInput.from_dict(item, f"input {i}") for i, item in enumerate(data["inputs"]))
        specs = [item.spec for item in inputs]
        if len(set(specs)) != len(specs):
            raise ValueError("an input is listed twice")
        kept, retired = _history(data, version, legacy)
        job_id = None if legacy else _text(data["job_id"], "job_id", plain=True)
        updated_at = data.get("updated_at")
        return cls(
            version=version,
            model_file=_file_name(data["model_file"], "model_file"),
            file_checksum=_digest(data["file_checksum"], "file_checksum"),
            model_checksum=_digest(data["model_checksum"], "model_checksum"),
            published_at=_text(data["published_at"], "published_at", plain=True),
            n_rows=_count(data["n_rows"], "n_rows", 1),
            setting=dict(data["setting"]),
            inputs=inputs,
            updated_at=None if updated_at is None else _text(updated_at, "updated_at", plain=True),
            kept=kept,
            retired=retired,
            job_id=job_id,
        )


_OPTIONAL = ("updated_at", "job_id")
Manifest._KEYS = (
    "format",
    "format_version",
    *(f.name for f in fields(Manifest) if f.name not in _OPTIONAL),
    "checksum",
)


def _history(data: dict[str, Any], version: int, legacy: bool) -> tuple[tuple[Version, ...], tuple[Version, ...]]:
    """The manifest's ``(kept, retired)`` versions, checked: those just before ``version``, and older ones."""
    kept = tuple(Version.from_dict(item, f"kept version {i}") for i, item in enumerate(data["kept"]))
    retired = tuple(Version.from_dict(item, f"retired version {i}") for i, item in enumerate(data["retired"]))
    if any(item.version >= version for item in kept + retired):
        raise ValueError(f"a kept or retired version is not older than version {version}")
    if [item.version for item in kept] != list(range(version - 1, version - 1 - len(kept), -1)):
        raise ValueError(f"the kept versions {[item.version for item in kept]} are not those before {version}")
    numbers = [item.version for item in retired]
    if len(set(numbers)) != len(numbers) or any(number >= version - len(kept) for number in numbers):
        raise ValueError(f"the retired versions {numbers} are not distinct versions older than the kept ones")
    if not legacy and any(item.model_checksum is None for item in kept + retired):
        raise ValueError("a kept or retired version lacks its model_checksum")
    return kept, retired


__all__ = [
    "Fingerprint",
    "Manifest",
    "Part",
    "PublishedInput",
    "ResumeRecord",
    "Version",
    "fingerprint_of",
    "json_checksum",
    "nul_field",
    "refuse_nul",
]
