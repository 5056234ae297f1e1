"""The codec interface every vector code implements, and its checksummed byte form.

A codec turns float vectors into rows of ``bytes_per_vector`` uint8 (code and per-vector scalars, as
faiss's ``sa_encode`` writes them), decodes them, and estimates ``<q, x>`` of uncoded float queries with
coded vectors. Its per-model state travels as `Codec.to_bytes`: a header, named arrays and a SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from ..core.finite import raise_if_nonfinite
from ..errors import BadInputError, ModelFileError

#: The first bytes of every codec's byte form, and its format version.
MAGIC, FORMAT_VERSION = b"SWCODEC\x00", 1
_DIGEST = 32
#: The rounding allowed on the bounds of a code of unit vectors (`Codec.unit_scale_problem`).
UNIT_SLACK = 1e-6
#: The end of the error for a row holding NaN or Inf.
NOT_CODABLE = ", which a code cannot hold"


class Codec(ABC):
    """A trained vector code: encode, decode, estimate inner products, and its byte form (`_parts`)."""

    #: The family name recorded in the byte form (what `streamwhiten.codes.codec_from_bytes` dispatches on).
    family: ClassVar[str]

    @property
    @abstractmethod
    def n_features(self) -> int:
        """The width of the vectors the codec encodes."""

    @property
    @abstractmethod
    def bytes_per_vector(self) -> int:
        """Bytes of one code row, per-vector scalars included."""

    @property
    @abstractmethod
    def label(self) -> str:
        """A short name of the code and its setting (``eigen-24B``, ``faiss-pq-24B``)."""

    @abstractmethod
    def encode(self, block: npt.ArrayLike) -> npt.NDArray[np.uint8]:
        """Code rows (n x `bytes_per_vector` uint8) of the float rows ``block`` (n x `n_features`)."""

    @abstractmethod
    def decode(self, codes: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """The approximate vectors (n x `n_features` float32) the code rows stand for."""

    @abstractmethod
    def inner_products(self, queries: npt.ArrayLike, codes: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """The estimates of ``<q, x>`` (queries x rows float32) of float queries with coded vectors."""

    @abstractmethod
    def _parts(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The JSON-able record and the named arrays of the byte form."""

    @classmethod
    @abstractmethod
    def _from_parts(cls, record: dict[str, Any], arrays: dict[str, np.ndarray]) -> Codec:
        """The codec `_parts` described."""

    def unit_scale_problem(self) -> tuple[str, str] | None:
        """``(field, problem)`` where a field lies beyond what training on unit vectors writes (a model's
        code codes unit-length outputs), else None: a huge step or mean would code every row alike."""
        length = float(np.linalg.norm(np.asarray(getattr(self, "mean", np.zeros(1)), dtype=np.float64)))
        if length > 1.0 + UNIT_SLACK:
            return "mean", f"has length {length:.6g}, beyond the 1 of a mean of unit vectors"
        return None

    @property
    def model_bytes(self) -> int:
        """Bytes of the per-model part (the byte form): rotations, codebooks, steps."""
        return len(self.to_bytes())

    def to_bytes(self) -> bytes:
        """Magic, version, header length, JSON header (family, record, array layout), the arrays'
        little-endian bytes, and a SHA-256 of all before it."""
        record, arrays = self._parts()
        layout, payload = [], []
        for name, array in arrays.items():
            array = np.ascontiguousarray(array)
            little = array.astype(array.dtype.newbyteorder("<"), copy=False)
            layout.append({"name": name, "dtype": little.dtype.str, "shape": list(little.shape)})
            payload.append(little.tobytes())
        header = json.dumps(
            {"family": self.family, "record": record, "arrays": layout}, sort_keys=True, separators=(",", ":")
        ).encode()
        body = MAGIC + struct.pack("<II", FORMAT_VERSION, len(header)) + header + b"".join(payload)
        return body + hashlib.sha256(body).digest()

    def check_rows(self, block: npt.ArrayLike, what: str = "rows", finite: bool = True) -> np.ndarray:
        """``block`` as 2-D float rows of `n_features` values, finite unless ``finite`` is False;
        `BadInputError` (or `NonFiniteError` naming the row) otherwise."""
        rows = np.asarray(block)
        if rows.ndim == 1 and rows.shape[0] == self.n_features:
            rows = rows[None, :]
        if rows.ndim != 2 or rows.shape[1] != self.n_features:
            raise BadInputError(
                f"the {self.label} codec takes {what} of {self.n_features} values, got shape {tuple(rows.shape)}"
            )
        if not np.issubdtype(rows.dtype, np.floating):
            rows = rows.astype(np.float64)
        if finite:
            raise_if_nonfinite(rows, what, suffix=NOT_CODABLE)
        return rows

    def check_codes(self, codes: npt.ArrayLike) -> npt.NDArray[np.uint8]:
        """``codes`` as uint8 rows of `bytes_per_vector`; a one-line `BadInputError` otherwise."""
        rows = np.asarray(codes)
        if rows.ndim != 2 or rows.shape[1] != self.bytes_per_vector or rows.dtype != np.uint8:
            raise BadInputError(
                f"the {self.label} codec reads uint8 rows of {self.bytes_per_vector} bytes, "
                f"got shape {tuple(rows.shape)} of {rows.dtype}"
            )
        return rows


def sample_too_small(code: str, smallest: int, rows: int, why: str) -> BadInputError:
    """The error of a sample of ``rows`` rows, fewer than the ``smallest`` the code trains on (``why``)."""
    return BadInputError(f"the {code} code needs a sample of at least {smallest} rows ({why}), got {rows}")


def field_error(field: str, problem: str) -> ModelFileError:
    """The error of a codec field no training could write (`codec_from_bytes` prefixes the file)."""
    return ModelFileError(f"codec field {field!r} {problem}")


def real_array(arrays: dict[str, np.ndarray], name: str, ndim: int, kind: str = "f") -> np.ndarray:
    """The non-empty ``ndim``-d array ``name`` of dtype ``kind`` (``"f"``: finite floats, ``"u"``: unsigned)."""
    if name not in arrays:
        raise field_error(name, "is missing")
    value = arrays[name]
    if value.ndim != ndim or 0 in value.shape:
        raise field_error(name, f"must be a non-empty {ndim}-d array, got shape {tuple(value.shape)}")
    if value.dtype.kind != kind:
        raise field_error(name, f"must hold {'floating-point numbers' if kind == 'f' else 'bytes'}, got {value.dtype}")
    if kind == "f" and not np.all(np.isfinite(value)):
        raise field_error(name, "holds NaN or Inf")
    return value


def orthonormal_columns(basis: np.ndarray, name: str = "basis", tol: float = 1e-3) -> None:
    """Refuse a ``basis`` whose columns are not orthonormal (checked on two fixed random vectors, O(d m))."""
    d, m = basis.shape
    if m > d:
        raise field_error(name, f"has {m} columns, more than its {d} rows: they cannot be orthonormal")
    probes = np.random.default_rng(20230923).standard_normal((m, 2))
    wide = basis.astype(np.float64)
    if np.abs(wide.T @ (wide @ probes) - probes).max() > tol * np.abs(probes).max() * max(m, 1) ** 0.5:
        raise field_error(name, "does not have orthonormal columns")


def whole(record: dict[str, Any], name: str, low: int = 0) -> int:
    """The whole number ``record[name]`` (not a bool) of at least ``low``; `field_error` else."""
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise field_error(name, f"must be a whole number of at least {low}, got {value!r}")
    return value


def flag(record: dict[str, Any], name: str, default: bool | None = None) -> bool:
    """The true/false ``record[name]`` (``default`` where absent and one is given); `field_error` else."""
    value = record.get(name, default)
    if not isinstance(value, bool):
        raise field_error(name, f"must be true or false, got {value!r}")
    return value


def read_parts(data: bytes) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
    """A codec byte form's family, record and arrays; `ModelFileError` if it is not one or fails its checksum."""
    data = bytes(data)
    if len(data) < len(MAGIC) + 8 + _DIGEST or not data.startswith(MAGIC):
        raise ModelFileError("not a streamwhiten codec (its bytes do not start with the codec header)")
    body, digest = data[:-_DIGEST], data[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise ModelFileError("the codec's bytes do not match their checksum: damaged or altered, refusing them")
    version, header_length = struct.unpack_from("<II", body, len(MAGIC))
    if version != FORMAT_VERSION:
        raise ModelFileError(
            f"codec format version {version} is not supported (this streamwhiten reads {FORMAT_VERSION})"
        )
    start = len(MAGIC) + 8
    try:
        header = json.loads(body[start : start + header_length])
        offset = start + header_length
        arrays = {}
        for entry in header["arrays"]:
            dtype = np.dtype(entry["dtype"])
            if dtype.kind not in "fiub" or dtype.itemsize == 0:
                raise ValueError(f"array {entry['name']!r} of dtype {dtype}")
            shape = tuple(int(n) for n in entry["shape"])
            size = dtype.itemsize * math.prod(shape)  # Python's integers: a forged shape cannot wrap around
            if any(n < 0 for n in shape) or offset + size > len(body):
                raise ValueError(f"array {entry['name']!r} of shape {shape} does not fit the bytes")
            stored = np.frombuffer(body, dtype=dtype, count=math.prod(shape), offset=offset)
            arrays[entry["name"]] = stored.reshape(shape).astype(dtype.newbyteorder("="))
            offset += size
        if offset != len(body):
            raise ValueError("trailing bytes")
        if not isinstance(header["record"], dict) or not isinstance(header["family"], str):
            raise ValueError("a record that is no JSON object")
        return header["family"], dict(header["record"]), arrays
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelFileError(f"a damaged codec header ({exc})") from None


__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "NOT_CODABLE",
    "UNIT_SLACK",
    "Codec",
    "field_error",
    "flag",
    "orthonormal_columns",
    "read_parts",
    "real_array",
    "sample_too_small",
    "whole",
]
