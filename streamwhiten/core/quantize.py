"""Quantized storage of transformed vectors, and the record that says how to decode it.

- ``float32``, ``float16``: the values, cast (float16 refuses a finite value it cannot hold);
- ``int8``: ``code = clip(rint((y - offset) / scale), -127, 127)``, decoded as ``code * scale + offset``;
  ``offset`` is the component's mean and ``scale = c * std / 127`` (`DEFAULT_INT8_CLIP`, measured in
  ``docs/evaluation.md``), both from the fitted statistics (`map_moments`), not a second pass;
- ``binary``: the sign bits ``y > 0`` in ``numpy.packbits`` order (component 0 the high bit of byte 0),
  as faiss ``IndexBinaryFlat`` and sentence-transformers' ``ubinary``; decoded as ``+1``/``-1``.

A `Quantization` travels with every output as a JSON-able dict, so a reader can decode the vectors
without streamwhiten; a model's recorded int8 ranges are recomputed from its statistics
(`storage_quantizations`), never stale. numpy only: the serving path uses it.

Examples
--------
Sign bits, 8 to a byte, the first component in the high bit:

>>> import numpy as np
>>> from streamwhiten.core.quantize import Quantization, int8_quantization
>>> Quantization("binary", 10).encode(np.array([[1.0, -2, 0, 3, 1, 1, -1, -1, 5, -5]]))
array([[156, 128]], dtype=uint8)

int8 codes spanning the mean +- 4 standard deviations (here 0 and 1), and their decoding:

>>> q = int8_quantization(np.zeros(2), np.ones(2), clip=4.0)
>>> codes = q.encode(np.array([[0.5, -10.0]]))
>>> codes
array([[  16, -127]], dtype=int8)
>>> q.decode(codes, np.float64).round(4)
array([[ 0.5039, -4.    ]])
>>> Quantization.from_dict(q.to_dict()).decode(codes, np.float64).round(4)
array([[ 0.5039, -4.    ]])
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt

from ..errors import BadInputError, NonFiniteError, ValuesTooLargeError
from ..output_plan import STORAGE_ATTR
from ..params import PARAMS, check
from ..storage import CODE, DEFAULT_INT8_CLIP, Storage

#: The storage kinds (the values of the ``dtype`` parameter).
KINDS: tuple[str, ...] = PARAMS["dtype"].choices
#: The int8 codes used: -127..127 (symmetric; -128 is never written).
INT8_MAX = 127
#: The decode record's format name and version, written into every record.
RECORD_FORMAT, RECORD_VERSION = "streamwhiten-quantization", 1
#: A standard deviation's floor, as a fraction of the largest: a constant component still gets a scale.
_STD_FLOOR = 1e-6

_STORAGE_DTYPES = {"float32": np.float32, "float16": np.float16, "int8": np.int8, "binary": np.uint8}


class _Statistics(Protocol):
    """What `quantization_for` reads of fitted statistics (a `Moments`, whose module brings numba)."""

    @property
    def n_rows(self) -> int: ...
    @property
    def mean(self) -> np.ndarray: ...
    @property
    def scatter(self) -> np.ndarray: ...


class _Fitted(Protocol):
    """What `quantization_for` reads of a model (a ``WhiteningModel``: this module stays below it)."""

    @property
    def state(self) -> _Statistics: ...
    @property
    def n_features(self) -> int: ...
    @property
    def n_components(self) -> int: ...
    def projection(self, dtype: npt.DTypeLike = np.float64) -> tuple[np.ndarray, np.ndarray]: ...


def raise_if_overflowed(overflowed: np.ndarray, dtype: npt.DTypeLike, when: str, hint: str = "") -> None:
    """Raise `ValuesTooLargeError` for the first row marked in ``overflowed``, if any."""
    if np.any(overflowed):
        raise ValuesTooLargeError(
            f"values too large for {np.dtype(dtype).name} (they overflow when {when}){hint}",
            row=int(np.argmax(overflowed)),
        )


def cast_checked(values: np.ndarray, dtype: npt.DTypeLike, into: np.ndarray | None = None) -> np.ndarray:
    """``values`` cast to ``dtype`` (into ``into``); `ValuesTooLargeError` for finite values that overflow."""
    target = np.empty(values.shape, dtype) if into is None else into[: values.shape[0]]
    with np.errstate(over="ignore"):
        np.copyto(target, values, casting="same_kind")
    if np.dtype(dtype).itemsize < values.dtype.itemsize:
        with np.errstate(over="ignore", invalid="ignore"):
            sums = target.sum(axis=1, dtype=np.float32)
        if not np.all(np.isfinite(sums)):
            lost = ~np.isfinite(target).all(axis=1) & np.isfinite(values).all(axis=1)
            hint = f"; the largest {np.dtype(dtype).name} is {float(np.finfo(dtype).max):g}, write float32"
            raise_if_overflowed(lost, dtype, "cast", hint)
    return target


@dataclass(frozen=True, eq=False)
class Quantization:
    """How vectors of ``n_components`` values are stored as ``kind`` (unit length first if ``normalized``) and
    decoded; int8: ``value = code * scale + offset``, the codes spanning ``offset +- clip`` standard deviations."""

    kind: str
    n_components: int
    normalized: bool = False
    scale: np.ndarray | None = None
    offset: np.ndarray | None = None
    clip: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise BadInputError(f"quantization kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if isinstance(self.n_components, bool) or int(self.n_components) != self.n_components:
            raise BadInputError(f"quantization n_components must be a whole number, got {self.n_components!r}")
        if self.n_components < 1:
            raise BadInputError(f"quantization n_components must be at least 1, got {self.n_components}")
        if self.kind == "int8":
            for name in ("scale", "offset"):
                values = getattr(self, name)
                if values is None or np.shape(values) != (self.n_components,):
                    raise BadInputError(f"an int8 quantization needs {self.n_components} {name} values")
                values = np.asarray(values, dtype=np.float64)
                if not np.all(np.isfinite(values)):
                    raise BadInputError(f"an int8 quantization's {name} values must be finite")
                object.__setattr__(self, name, values)
            if not np.all(cast(np.ndarray, self.scale) > 0):  # set just above
                raise BadInputError("an int8 quantization's scale values must be above 0")
        elif self.scale is not None or self.offset is not None:
            raise BadInputError(f"a {self.kind} quantization has no scale or offset")

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the stored values (uint8 bytes of packed bits for ``binary``)."""
        return np.dtype(_STORAGE_DTYPES[self.kind])

    @property
    def width(self) -> int:
        """Stored values per vector: k, or ``ceil(k / 8)`` bytes for ``binary``."""
        return -(-self.n_components // 8) if self.kind == "binary" else int(self.n_components)

    @property
    def bytes_per_vector(self) -> int:
        return self.width * self.dtype.itemsize

    def encode(self, y: npt.ArrayLike) -> np.ndarray:
        """The stored form of the rows ``y`` (n x k floats): `BadInputError` for the wrong width,
        `NonFiniteError` for NaN or Inf in int8 or bits, `ValuesTooLargeError` for float16 overflow."""
        y = np.asarray(y)
        if y.ndim != 2 or y.shape[1] != self.n_components:
            raise BadInputError(f"expected rows of {self.n_components} components, got shape {y.shape}")
        if self.kind in ("float32", "float16"):
            return cast_checked(y, self.dtype)
        finite = np.isfinite(y).all(axis=1)
        if not finite.all():
            row = int(np.argmin(finite))
            raise NonFiniteError(f"row {row} holds NaN or Inf, which {self.kind} storage cannot hold", row=row)
        if self.kind == "binary":
            return np.packbits(y > 0, axis=1)
        scale, offset = self._scale_offset()
        codes: np.ndarray = np.rint((y.astype(np.float64, copy=False) - offset) / scale)
        np.clip(codes, -INT8_MAX, INT8_MAX, out=codes)
        return codes.astype(np.int8)

    def decode(self, codes: npt.ArrayLike, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
        """The rows as floats of ``dtype``: the values, ``code * scale + offset``, or the bits' signs +1/-1."""
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[1] != self.width or codes.dtype != self.dtype:
            raise BadInputError(
                f"expected {self.kind} rows of {self.width} {self.dtype.name} values, "
                f"got shape {codes.shape} of {codes.dtype}"
            )
        if self.kind == "int8":
            scale, offset = self._scale_offset()
            values: np.ndarray = (codes * scale + offset).astype(dtype, copy=False)
            return values
        if self.kind == "binary":
            bits = np.unpackbits(codes, axis=1, count=self.n_components)
            return (2 * bits.astype(np.int8) - 1).astype(dtype)
        return codes.astype(dtype)

    def _scale_offset(self) -> tuple[np.ndarray, np.ndarray]:
        """An int8 record's ``scale`` and ``offset`` (``__post_init__`` refuses one without them)."""
        return cast(np.ndarray, self.scale), cast(np.ndarray, self.offset)

    def to_dict(self) -> dict[str, Any]:
        """The record as plain JSON-able values (floats written exactly, as Python floats)."""
        record: dict[str, Any] = {
            "format": RECORD_FORMAT,
            "format_version": RECORD_VERSION,
            "kind": self.kind,
            "n_components": int(self.n_components),
            "normalized": bool(self.normalized),
            "dtype": self.dtype.name,
            "bytes_per_vector": self.bytes_per_vector,
        }
        if self.kind == "int8" and self.scale is not None and self.offset is not None:
            record.update(
                scale=[float(v) for v in self.scale],
                offset=[float(v) for v in self.offset],
                clip=None if self.clip is None else float(self.clip),
                codes=[-INT8_MAX, INT8_MAX],
                decode="value = code * scale + offset",
            )
        elif self.kind == "binary":
            record.update(bit_order="big", decode="bit i of the vector is bit 7 - i % 8 of byte i // 8; 1: y > 0")
        return record

    def digest(self) -> str:
        """The SHA-256 of `to_dict` as sorted JSON (what a resumed apply output must match)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> Quantization:
        """The record in an apply output's attributes (a dict, or its JSON); `BadInputError` if none."""
        record = attrs.get(STORAGE_ATTR) if hasattr(attrs, "get") else None
        if isinstance(record, bytes):
            record = record.decode()
        if isinstance(record, str):
            try:
                record = json.loads(record)
            except ValueError:
                raise BadInputError(f"the {STORAGE_ATTR!r} attribute is not JSON") from None
        if record is None:
            raise BadInputError(f"no {STORAGE_ATTR!r} attribute: these vectors are stored as floats, not codes")
        return cls.from_dict(record)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Quantization:
        """The record `to_dict` wrote; `BadInputError` for one that is not such a record."""
        if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
            raise BadInputError(f"not a {RECORD_FORMAT} record")
        if record.get("format_version") != RECORD_VERSION:
            raise BadInputError(
                f"{RECORD_FORMAT} record version {record.get('format_version')!r} is not supported "
                f"(this streamwhiten reads version {RECORD_VERSION})"
            )
        if record.get("kind") == "binary" and record.get("bit_order", "big") != "big":
            raise BadInputError(f"binary records use the big bit order, got {record.get('bit_order')!r}")
        try:
            return cls(
                kind=record["kind"],
                n_components=record["n_components"],
                normalized=bool(record.get("normalized", False)),
                scale=None if record.get("scale") is None else np.asarray(record["scale"], dtype=np.float64),
                offset=None if record.get("offset") is None else np.asarray(record["offset"], dtype=np.float64),
                clip=record.get("clip"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, BadInputError):
                raise
            raise BadInputError(f"a damaged {RECORD_FORMAT} record ({exc!r})") from None


def decode(
    codes: npt.ArrayLike, record: Quantization | Mapping[str, Any], dtype: npt.DTypeLike = np.float32
) -> np.ndarray:
    """Floats from stored ``codes``; ``record`` is a `Quantization`, its dict, or the attributes of the
    output they were read from (``streamwhiten.io.read_attrs``).

    >>> import numpy as np
    >>> decode(np.array([[156, 128]], dtype=np.uint8), {"quantization": Quantization("binary", 10).to_dict()})
    array([[ 1., -1., -1.,  1.,  1.,  1., -1., -1.,  1., -1.]], dtype=float32)
    """
    if not isinstance(record, Quantization):
        if isinstance(record, Mapping) and record.get("format") == RECORD_FORMAT:
            record = Quantization.from_dict(dict(record))
        else:
            record = Quantization.from_attrs(record if isinstance(record, Mapping) else {})
    return record.decode(codes, dtype)


def map_moments(
    n_rows: int,
    mean: npt.ArrayLike,
    scatter: npt.ArrayLike,
    weights: npt.ArrayLike | None = None,
    shift: npt.ArrayLike | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of each component of ``y = (x - shift) @ weights`` from the fitted statistics:
    ``(mu - shift) @ w_j`` and ``w_j^T (scatter / n) w_j``; no ``weights``: the identity map."""
    sigma = np.asarray(scatter, dtype=np.float64) / float(n_rows)
    centre = np.asarray(mean, dtype=np.float64) - (0.0 if shift is None else np.asarray(shift, dtype=np.float64))
    if weights is None:
        return centre, np.clip(np.diag(sigma).copy(), 0.0, None)
    weights = np.asarray(weights, dtype=np.float64)
    variance = np.einsum("ij,ij->j", weights, sigma @ weights)
    return centre @ weights, np.clip(variance, 0.0, None)


def normalized_moments(mean: npt.ArrayLike, variance: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """The approximate mean and variance of each component of ``y / ||y||``: divided by ``E||y||^2`` (the
    mean by its square root); exact when every row has the same norm (see ``docs/evaluation.md``)."""
    mean = np.asarray(mean, dtype=np.float64)
    variance = np.asarray(variance, dtype=np.float64)
    energy = float(np.sum(variance + mean**2))
    if not energy > 0:
        return mean, variance
    return mean / math.sqrt(energy), variance / energy


def int8_quantization(
    mean: npt.ArrayLike, variance: npt.ArrayLike, clip: float = DEFAULT_INT8_CLIP, normalized: bool = False
) -> Quantization:
    """The int8 record whose codes span ``mean +- clip * sqrt(variance)`` per component (a standard
    deviation is floored at ``1e-6`` of the largest: a constant component still decodes to its mean)."""
    check("int8_clip", clip)
    std = np.sqrt(np.asarray(variance, dtype=np.float64))
    top = float(std.max()) if std.size else 0.0
    std = np.maximum(std, _STD_FLOOR * top) if top > 0 else np.ones_like(std)
    return Quantization(
        "int8",
        int(std.shape[0]),
        normalized=bool(normalized),
        scale=float(clip) * std / INT8_MAX,
        offset=np.asarray(mean, dtype=np.float64).copy(),
        clip=float(clip),
    )


def quantization_for(
    kind: str,
    model: _Fitted | None = None,
    *,
    raw: bool = False,
    normalize: bool = False,
    clip: float = DEFAULT_INT8_CLIP,
    n_components: int | None = None,
) -> Quantization:
    """The record storing ``model``'s outputs (``raw``: its inputs) as ``kind``, unit length with ``normalize``;
    int8 needs the model's statistics, other kinds the width (the model's or ``n_components``)."""
    if kind is None:
        raise BadInputError("give a storage kind (dtype) to quantize for")
    check("dtype", kind)
    if model is not None:
        n_components = model.n_features if raw else model.n_components
    if n_components is None:
        raise BadInputError("give a model or n_components to quantize for")
    if kind != "int8":
        return Quantization(kind, int(n_components), normalized=bool(normalize))
    if model is None:
        raise BadInputError("int8 storage needs a fitted model: its scale and offset come from the statistics")
    state = model.state
    weights, shift = (None, None) if raw else model.projection(np.float64)
    return int8_for_map(state.n_rows, state.mean, state.scatter, weights, shift, normalize=normalize, clip=clip)


def int8_for_map(
    n_rows: int,
    mean: npt.ArrayLike,
    scatter: npt.ArrayLike,
    weights: npt.ArrayLike | None = None,
    shift: npt.ArrayLike | None = None,
    *,
    normalize: bool = True,
    clip: float = DEFAULT_INT8_CLIP,
) -> Quantization:
    """The int8 record of ``y = (x - shift) @ weights`` (unit length with ``normalize``) from the statistics."""
    out_mean, variance = map_moments(n_rows, mean, scatter, weights, shift)
    if normalize:
        out_mean, variance = normalized_moments(out_mean, variance)
    return int8_quantization(out_mean, variance, clip=clip, normalized=normalize)


def storage_quantizations(
    storage: Storage,
    n_rows: int,
    mean: npt.ArrayLike,
    scatter: npt.ArrayLike,
    weights: npt.ArrayLike,
    shift: npt.ArrayLike | None,
) -> tuple[Quantization | None, Quantization | None]:
    """The records of ``storage`` for the unit-length outputs of ``y = (x - shift) @ weights``: the stored
    vectors' (None for float32) and the re-ranking vectors' (None without a rescoring)."""
    k = int(np.shape(weights)[1])

    def record(kind: str) -> Quantization | None:
        if kind in ("float32", CODE):  # a codec's rows are decoded by the codec, not by a record
            return None
        if kind == "int8":
            return int8_for_map(n_rows, mean, scatter, weights, shift, normalize=True, clip=storage.int8_clip)
        return Quantization(kind, k, normalized=True)

    again = (record(storage.rescore_dtype) or Quantization("float32", k, normalized=True)) if storage.rescore else None
    return record(storage.dtype), again


__all__ = [
    "DEFAULT_INT8_CLIP",
    "INT8_MAX",
    "KINDS",
    "Quantization",
    "cast_checked",
    "decode",
    "int8_for_map",
    "int8_quantization",
    "map_moments",
    "normalized_moments",
    "quantization_for",
    "raise_if_overflowed",
    "storage_quantizations",
]
