"""Whiten queries where they are embedded: the affine map ``y = x A + b`` with numpy alone.

The queries searched against a corpus whitened offline must go through the same map. This module loads it
from a model file (at its saved setting) or an exported ``.npz`` map and applies it to numpy arrays or
torch tensors. It never imports numba, h5py, zarr or `streamwhiten.core.model`, so a service starts fast::

    from streamwhiten import serving
    whiten = serving.load("model.npz")          # or an exported map.npz
    y = whiten.transform(query_vector)          # same vectors as Whitener.transform / apply
    codes = whiten.encode(query_vector)         # stored as the model's storage: int8 codes, sign bits
    vectors = serving.decode(codes_read, attrs)  # codes an apply wrote, by the attributes they carry
    rows = serving.decode(code_rows, serving.codec("model.npz"))  # a vector code the model records

The map is ``A = U_k (Lambda_k + eps_)^(-gamma/2)`` and ``b = -(beta mu) A``, optionally L2-normalised
(`streamwhiten.core.affine`); a model's recorded storage travels with it (`AffineMap.encode`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._npz import check_file, read_npz
from .core.affine import MAP_FORMAT, MAP_VERSION, AffineMap, mean_sq_norm
from .core.quantize import Quantization, storage_quantizations
from .core.quantize import decode as decode_record
from .core.validate import map_fields, map_weights, model_fields
from .errors import BadInputError
from .storage import CODE, Storage

#: The model file this module reads (``core.model.FORMAT_NAME``/``FORMAT_VERSION``, not importable without numba).
MODEL_FORMAT, MODEL_VERSION = "streamwhiten-model", (1, 2)


def load(path: str | os.PathLike[str], normalize: bool | None = None, dtype: str | Storage | None = None) -> AffineMap:
    """Load the affine map of a model file (at its saved setting) or of an exported ``.npz`` map.

    Parameters
    ----------
    path : str or os.PathLike
        A model file or a map written by ``streamwhiten export -o map.npz``, checked against its SHA-256.
    normalize : bool, optional
        Default of `AffineMap.transform`; default: the exported map's flag, False for a model file.
    dtype : {"float32", "float16", "int8", "binary"} or Storage, optional
        How `AffineMap.encode` stores vectors (a name keeps the model's int8 clip); default: the model's
        storage (or the map's record), else float32. int8 needs a model file or a map exported with int8.

    Returns
    -------
    AffineMap

    Raises
    ------
    ModelFileError
        Missing, foreign, truncated or altered file, or one of another format version.
    """
    path = os.fspath(path)
    check_file(path, "model file or map")
    kind, stored_checksum = _peek(path)
    if kind == MAP_FORMAT:
        return _load_map(path, normalize, dtype)
    return _load_model(path, normalize, stored_checksum, dtype)


def codec(source: str | os.PathLike[str] | Mapping[str, Any]) -> Any:
    """The vector code (``streamwhiten.codes.Codec``) a model file records, or that coded an output: ``source``
    the model file's path, or the output's attributes or ``quantization`` record (which carry the codec's
    bytes, checked against their SHA-256); `BadInputError` when it records none. It codes the unit-length
    outputs: ``codec(path).encode(load(path, normalize=True).transform(x))``."""
    from .codes import codec_from_record, record_codec

    if isinstance(source, Mapping):
        entry = _codec_entry(source)
        if entry is None:
            raise BadInputError("these attributes record no vector code (an output of floats, int8 codes or bits?)")
        return codec_from_record(entry, "the output's attributes")
    path = os.fspath(source)
    check_file(path, "model file")
    f = model_fields(read_npz(path, "model file", MODEL_FORMAT, MODEL_VERSION), path)
    storage = f["storage"]
    if storage is None or storage.codec is None:
        raise BadInputError(f"{path}: the model records no vector code as its storage (add one: streamwhiten codes)")
    return record_codec(storage.codec, f["n_components"])


def decode(codes: Any, record: Any, dtype: Any = np.float32) -> np.ndarray:
    """Floats from stored ``codes``, by ``record``: a vector code's codec (a ``Codec`` as `codec` gives it, its
    bytes, a model's `Storage` of a code), an int8 or bits record (a `Quantization` or its dict), an output's
    attributes (which carry either), or what ``codes.storage.resolve`` gives (a ``StoredAs`` or its encoder).

    >>> import numpy as np
    >>> decode(np.array([[156, 128]], dtype=np.uint8), {"quantization": Quantization("binary", 10).to_dict()})
    array([[ 1., -1., -1.,  1.,  1.,  1., -1., -1.,  1., -1.]], dtype=float32)
    """
    from .codes import Codec, codec_from_bytes, record_codec
    from .output_plan import StoredAs

    if isinstance(record, StoredAs):
        record = record.encoder
    if isinstance(record, Storage):
        if record.codec is None:
            raise BadInputError(
                f"a {record} storage decodes by the ranges its output records: give the output's attributes"
            )
        record = record_codec(record.codec)
    if isinstance(record, (bytes, bytearray, memoryview)):
        record = codec_from_bytes(bytes(record))
    if isinstance(getattr(record, "codec", None), Codec):  # a resolved code's encoder
        record = record.codec
    if isinstance(record, Codec):
        return np.asarray(record.decode(codes), dtype=dtype)
    if isinstance(record, Mapping) and _codec_entry(record) is not None:  # a vector code's output: its codec
        return np.asarray(codec(record).decode(codes), dtype=dtype)
    return decode_record(codes, record, dtype)


def _storage(dtype: str | Storage | None, held: Storage) -> Storage:
    """What `load` encodes with: ``dtype`` (a name keeps ``held``'s int8 clip) or, by default, ``held``."""
    if dtype is None:
        return held
    wanted = dtype if isinstance(dtype, Storage) else Storage(dtype, int8_clip=held.int8_clip)  # which checks it
    if wanted.dtype == CODE:
        raise BadInputError(
            f"load encodes as float32, float16, int8 or binary, not the {wanted} code: its rows are "
            "serving.codec(path).encode(load(path, normalize=True).transform(x))",
            param="dtype",
        )
    return held if wanted.names(held) else wanted


def _codec_entry(attrs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``codec`` entry of a vector-code output's record (``attrs`` or the record itself), else None."""
    from .output_plan import STORAGE_ATTR, storage_record

    held = storage_record(attrs) if STORAGE_ATTR in attrs else attrs
    entry = held.get("codec") if isinstance(held, Mapping) else None
    return entry if isinstance(entry, Mapping) else None


def file_checksum(path: str | os.PathLike[str]) -> str:
    """The SHA-256 checksum stored in a model file or map (not verified: `load` verifies it)."""
    return _peek(os.fspath(path))[1]


def _peek(path: str) -> tuple[str | None, str]:
    """The ``format`` and ``checksum`` entries of an ``.npz``, or ``(None, "")``; the full checks come after."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return str(data["format"]), str(data["checksum"])
    except Exception:  # noqa: BLE001 - read_npz reports what is wrong with the file
        return None, ""


def _load_model(path: str, normalize: bool | None, stored_checksum: str, dtype: str | Storage | None) -> AffineMap:
    f = model_fields(read_npz(path, "model file", MODEL_FORMAT, MODEL_VERSION), path)
    fitted_norm = mean_sq_norm(f["n_rows"], f["mean"], f["scatter"])
    storage = _storage(dtype, f["storage"] or Storage())
    weights = map_weights(f["eigvals"], f["eigvecs"], f["eps_value"], f["gamma"], f["n_components"], f["basis"])
    quantization, _ = storage_quantizations(
        storage, f["n_rows"], f["mean"], f["scatter"], weights, f["beta"] * f["mean"]
    )
    if f["basis"] == "identity":
        return AffineMap.identity(
            f["mean"], f["eps"], f["eps_value"], bool(normalize), stored_checksum, fitted_norm, quantization
        )
    return AffineMap.from_weights(
        weights,
        f["mean"],
        f["beta"],
        gamma=f["gamma"],
        eps=f["eps"],
        eps_value=f["eps_value"],
        variance=f["variance"],
        normalize=bool(normalize),
        file_checksum=stored_checksum,
        mean_sq_norm=fitted_norm,
        quantization=quantization,
    )


def _load_map(path: str, normalize: bool | None, dtype: str | Storage | None) -> AffineMap:
    fields = map_fields(read_npz(path, "whitening map", MAP_FORMAT, MAP_VERSION), path)
    stored = fields.pop("normalize")
    recorded = fields.pop("quantization")
    kind = recorded.kind if recorded is not None else "float32"
    wanted = _storage(dtype, Storage(kind)).dtype
    if wanted != kind:
        if wanted == "int8":
            raise BadInputError(
                f"{path}: int8 storage needs ranges from the fitted statistics, which a map holds only when it "
                "was exported with them (export with dtype='int8'); load the model file instead",
                param="dtype",
            )
        k = int(fields["A"].shape[1])
        recorded = None if wanted == "float32" else Quantization(wanted, k, normalized=True)
    return AffineMap(normalize=stored if normalize is None else bool(normalize), quantization=recorded, **fields)


__all__ = [
    "AffineMap",
    "Quantization",
    "codec",
    "decode",
    "load",
    "file_checksum",
    "MAP_FORMAT",
    "MAP_VERSION",
]
