"""A storage as one value: what a user names and what a model records.

A `Storage` is how vectors are stored for search: ``float32``, ``float16``, ``int8`` codes, ``binary``
sign bits, or a vector code ``NAME:BYTES`` (``eigen:24``), with its ``rescore`` and int8 clip. A user's
spelling is parsed once where it comes in (`parse_storage`); ``str(storage)`` spells it back for messages
and JSON. A model records the same value, a code's with its trained codec (`CodecRecord`). Standard
library and ``params`` only, so option objects hold one and ``core`` records one.

>>> storage = parse_storage("eigen:24", rescore=100)
>>> str(storage), storage.code, storage.budget, storage.rescore
('eigen:24', 'eigen', 24, 100)
>>> parse_storage(str(storage), rescore=100) == storage
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from numbers import Integral
from typing import Any

from .errors import BadInputError
from .params import CODED_DTYPES, PARAMS, check

#: The vector codes by name (``streamwhiten.codes`` trains them): a storage ``NAME:BYTES`` names one.
CODES: tuple[str, ...] = (
    "eigen",
    "eigen-iso",
    "eigen+f",
    "bits-random",
    "bits-random+f",
    "bits-itq",
    "bits-itq+f",
    "bits-pca",
    "bits-pca+f",
    "faiss-pq",
    "faiss-opq",
    "faiss-rabitq1",
    "faiss-rabitq2",
    "faiss-rabitq4",
    "faiss-sq4",
    "faiss-sq8",
)
#: How a code is named where a storage is: ``NAME:BYTES``.
SPEC_HELP = "NAME:BYTES, NAME one of " + ", ".join(CODES)
#: The ``dtype`` of a storage whose vectors are a vector code's rows.
CODE = "code"
#: The int8 clip when none is given (standard deviations about each component's mean).
DEFAULT_INT8_CLIP: float = float(PARAMS["int8_clip"].default)  # type: ignore[arg-type]
#: Bytes of one stored component, by dtype (bits: an eighth).
_ITEMSIZE = {"float32": 4, "float16": 2, "int8": 1}


@dataclass(frozen=True, eq=False)
class CodecRecord:
    """A vector code a model records as its storage: the codec's checksummed byte form (``data``, what
    ``Codec.to_bytes`` wrote; opaque here) and what is known of it without decoding it: its ``code`` name
    and byte ``budget``, ``label`` (``eigen-24B``), ``n_features`` (the map's k), ``bytes_per_vector`` (a
    code row, per-vector scalars included), the seeded input sample it learned from (``sample_rows``,
    ``sample_seed``; 0 for codes of the statistics alone) and the ``setting`` of the map it codes.
    """

    data: bytes
    code: str
    budget: int
    label: str
    n_features: int
    bytes_per_vector: int
    sample_rows: int = 0
    sample_seed: int = 0
    setting: Mapping[str, Any] | None = None
    #: Where the record was read from, for messages (None: made in memory); not compared, not written.
    origin: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.data, (bytes, bytearray)) or len(self.data) < 33:
            raise BadInputError("a codec record holds the codec's bytes")
        object.__setattr__(self, "data", bytes(self.data))
        for name in ("budget", "n_features", "bytes_per_vector", "sample_rows", "sample_seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
                raise BadInputError(f"a codec record's {name} is a whole number, got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.n_features < 1 or self.bytes_per_vector < 1:
            raise BadInputError("a codec record codes vectors of at least 1 value into at least 1 byte")
        object.__setattr__(self, "setting", dict(self.setting or {}))

    @property
    def model_bytes(self) -> int:
        """Bytes of the per-model part (the byte form), reported apart from the bytes per vector."""
        return len(self.data)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """What a model file's ``storage_json`` records of the codec (its bytes are a member of their own)."""
        return {
            "code": self.code,
            "budget": self.budget,
            "label": self.label,
            "n_features": self.n_features,
            "bytes_per_vector": self.bytes_per_vector,
            "model_bytes": self.model_bytes,
            "sample_rows": self.sample_rows,
            "sample_seed": self.sample_seed,
            "setting": dict(self.setting or {}),
            "sha256": self.sha256,
        }

    @classmethod
    def from_dict(cls, record: Mapping[str, Any], data: bytes) -> CodecRecord:
        """The record `to_dict` wrote, with the codec's bytes; `BadInputError` if the bytes
        are not those it names (their SHA-256) or a field is missing."""
        if not isinstance(record, Mapping):
            raise BadInputError("a codec record is a JSON object")
        if hashlib.sha256(bytes(data)).hexdigest() != record.get("sha256"):
            raise BadInputError("the codec's bytes are not those its record names (their SHA-256 differs)")
        try:
            return cls(
                data=bytes(data),
                code=str(record["code"]),
                budget=record["budget"],
                label=str(record["label"]),
                n_features=record["n_features"],
                bytes_per_vector=record["bytes_per_vector"],
                sample_rows=record.get("sample_rows", 0),
                sample_seed=record.get("sample_seed", 0),
                setting=record.get("setting") or {},
            )
        except (KeyError, TypeError) as exc:
            raise BadInputError(f"a codec record without {exc}") from None


@dataclass(frozen=True)
class Storage:
    """How vectors are stored for search: what a user names (`parse_storage`) and a model file records.

    Attributes
    ----------
    dtype : str
        ``"float32"``, ``"float16"``, ``"int8"``, ``"binary"``, or ``"code"`` (a vector code: ``code``,
        ``budget``).
    rescore : int
        ``binary`` and ``code`` only: the top ``rescore`` of the search are re-ranked with ``rescore_dtype``
        vectors (0: none).
    rescore_dtype : str
        ``"float32"`` or ``"int8"``.
    int8_clip : float
        int8 codes (stored or re-ranked with) span each component's mean +- this many standard deviations.
    codec : CodecRecord, optional
        ``code`` only, in a model: the trained codec (a storage a user names has none).
    code, budget : str and int, optional
        ``code`` only: the code's name (`CODES`) and byte budget (default: the codec's).

    The stored vectors are the map's outputs scaled to unit length (search is by cosine).
    """

    dtype: str = "float32"
    rescore: int = 0
    rescore_dtype: str = "float32"
    int8_clip: float = DEFAULT_INT8_CLIP
    codec: CodecRecord | None = None
    code: str | None = None
    budget: int | None = None

    def __post_init__(self) -> None:
        if self.dtype is None:
            raise BadInputError("a storage needs a dtype")
        if self.codec is not None:
            if self.dtype != CODE:
                raise BadInputError("a storage of dtype 'code' needs a codec, and only it has one")
            for name in ("code", "budget"):
                if getattr(self, name) is None:
                    object.__setattr__(self, name, getattr(self.codec, name))
        if self.dtype == CODE:
            _check_code(self.code, self.budget, f"{self.code}:{self.budget}")
            object.__setattr__(self, "budget", int(self.budget))  # type: ignore[arg-type]
        elif self.code is not None or self.budget is not None:
            raise BadInputError(f"a code and budget name a storage of dtype 'code', not {self.dtype!r}")
        elif self.dtype not in PARAMS["dtype"].choices:
            raise BadInputError(f"dtype must be {PARAMS['dtype'].text}, got {self.dtype!r}")
        for name in ("rescore", "rescore_dtype", "int8_clip"):
            check(name, getattr(self, name))
        object.__setattr__(self, "rescore", int(self.rescore))
        object.__setattr__(self, "int8_clip", float(self.int8_clip))
        if self.rescore and self.dtype not in ("binary", CODE):
            raise BadInputError(f"rescore re-ranks a bit search: it needs dtype 'binary', not {self.dtype!r}")

    def __str__(self) -> str:
        """The spelling a user gives: ``"int8"``, ``"binary"``, ``"eigen:24"``."""
        return f"{self.code}:{self.budget}" if self.dtype == CODE else self.dtype

    @property
    def coded(self) -> bool:
        """Whether the stored vectors are codes of the unit-length outputs (int8, bits, a vector code):
        they set ``normalize`` and hold no NaN rows."""
        return self.dtype in CODED_DTYPES or self.dtype == CODE

    def names(self, other: Storage | None) -> bool:
        """Whether ``other`` is stored as this names: the same dtype (a code: the same name and budget),
        its re-ranking, clip and trained codec aside."""
        return other is not None and str(other) == str(self)

    def bytes_per_vector(self, n_components: int) -> int:
        """Bytes a search reads per corpus vector of ``n_components`` components: the stored values (bits, a
        code row), plus the vector a rescoring re-ranks with (a codec's own bytes: ``codec.model_bytes``)."""
        k = int(n_components)
        if self.dtype == CODE:
            if self.codec is None:
                raise BadInputError(f"the {self} code's bytes per vector are known once it is trained")
            stored = self.codec.bytes_per_vector
        elif self.dtype == "binary":
            stored = -(-k // 8)
        else:
            stored = k * _ITEMSIZE[self.dtype]
        if self.rescore:
            stored += k * _ITEMSIZE[self.rescore_dtype]
        return int(stored)

    @property
    def label(self) -> str:
        """``"int8"``, ``"binary+rescore100"``, ``"binary+rescore100(int8)"``, ``"eigen-24B+rescore100"`` (a
        trained code's label) or ``"eigen:24"`` (a code named, not yet trained)."""
        if self.codec is not None:
            base = self.codec.label
        else:
            base = str(self) if self.dtype == CODE else self.dtype
        if not self.rescore:
            return base
        return f"{base}+rescore{self.rescore}" + ("" if self.rescore_dtype == "float32" else f"({self.rescore_dtype})")

    def to_dict(self) -> dict[str, Any]:
        record = {
            "dtype": self.dtype,
            "rescore": self.rescore,
            "rescore_dtype": self.rescore_dtype,
            "int8_clip": self.int8_clip,
        }
        if self.codec is not None:
            record["codec"] = self.codec.to_dict()
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any], codec_data: bytes | None = None) -> Storage:
        """The storage `to_dict` wrote (other keys are ignored), with the codec's bytes where it
        records a codec; `BadInputError` if it is none."""
        if not isinstance(record, dict) or not isinstance(record.get("dtype"), str):
            raise BadInputError("a storage record needs a dtype")
        codec = None
        if record.get("codec") is not None:
            if codec_data is None:
                raise BadInputError("a storage record of a codec needs the codec's bytes")
            codec = CodecRecord.from_dict(record["codec"], codec_data)
        if record["dtype"] == CODE and codec is None:
            raise BadInputError("a storage of dtype 'code' needs a codec, and only it has one")
        return cls(
            dtype=record["dtype"],
            rescore=record.get("rescore", 0),
            rescore_dtype=record.get("rescore_dtype", "float32"),
            int8_clip=record.get("int8_clip", DEFAULT_INT8_CLIP),
            codec=codec,
        )


def not_a_code(value: object) -> BadInputError:
    """The error of ``value`` given where a vector code ``NAME:BYTES`` is wanted: it names the codes."""
    return BadInputError(f"a code is {SPEC_HELP} (e.g. eigen:24), got {value!r}")


def _check_code(name: object, budget: object, spelling: str) -> None:
    """`BadInputError` unless ``name`` is a code of `CODES` and ``budget`` a whole number of bytes >= 1."""
    if name not in CODES or isinstance(budget, bool) or not isinstance(budget, Integral) or budget < 1:
        raise not_a_code(spelling)


def parse_storage(value: str | Storage, **settings: Any) -> Storage:
    """The storage ``value`` names (a dtype or ``"NAME:BYTES"``; a `Storage` as it is) with ``settings``
    (``rescore``, ``rescore_dtype``, ``int8_clip``) where given; `BadInputError` naming a bad value."""
    if isinstance(value, Storage):
        return replace(value, **settings) if settings else value
    if isinstance(value, str) and ":" in value:
        name, _, budget = value.partition(":")
        if not (budget.isascii() and budget.isdigit()):
            _check_code(None, None, value)
        _check_code(name, int(budget), value)
        return Storage(CODE, code=name, budget=int(budget), **settings)
    if value not in PARAMS["dtype"].choices:
        raise BadInputError(f"dtype must be {PARAMS['dtype'].text}, got {value!r}")
    return Storage(str(value), **settings)


__all__ = ["CODE", "CODES", "CodecRecord", "DEFAULT_INT8_CLIP", "SPEC_HELP", "Storage", "not_a_code", "parse_storage"]
