"""A codec as a model's storage: trained for the unit-length outputs of the model's map, recorded in the
model (`CodecRecord`), read back; and `resolve`, which turns a model and a `streamwhiten.storage.Storage`
into what is stored (record, digest, encoder), once per model and storage.

Codes train from the exact moments of the unit outputs, ``mean_y = (1 - beta) mu A`` and
``cov_y = A^T Sigma A`` over ``E||y||^2 = tr(cov_y) + ||mean_y||^2`` (the mean over its root), or
(`NEEDS_SAMPLE`) from input rows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ..core.model import WhiteningModel, codec_setting, file_checksum, project
from ..core.quantize import Quantization
from ..errors import BadInputError
from ..output_plan import StoredAs, storage_record
from ..storage import CODE, CodecRecord, Storage
from . import NEEDS_SAMPLE, codec_from_bytes, codec_record_data, record_codec, train_codec
from .base import Codec


def unit_output_moments(
    model: WhiteningModel | None, raw: bool = False
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Mean and covariance of the model's unit-length outputs (``raw``: inputs), from its statistics."""
    if model is None:
        raise BadInputError("a code trains from a model's statistics: give a model")
    state = model.state
    sigma = np.asarray(state.scatter, dtype=np.float64) / float(state.n_rows)
    if raw:
        mean, cov = np.asarray(state.mean, dtype=np.float64), sigma
    else:
        weights, shift = model.projection(np.float64)
        mean = (state.mean - shift) @ weights
        cov = weights.T @ sigma @ weights
    energy = float(np.trace(cov) + mean @ mean)
    if not energy > 0:
        raise BadInputError("the model's outputs have no spread to code (every output is zero)")
    return mean / np.sqrt(energy), cov / energy


def unit_rows(model: WhiteningModel, rows: npt.ArrayLike, raw: bool = False) -> npt.NDArray[np.float64]:
    """Input rows as the storage holds them: the model's outputs (``raw``: the rows) at unit length."""
    x = np.asarray(rows, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != model.n_features:
        raise BadInputError(f"a code's sample must be rows of {model.n_features} values, got shape {x.shape}")
    if raw:
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        unit: npt.NDArray[np.float64] = np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
        return unit
    weights, shift = model.projection(np.float64)
    out: npt.NDArray[np.float64] = project(x, weights, shift, normalize=True)
    return out


def train_for(
    model: WhiteningModel,
    code: str,
    budget: int,
    *,
    sample: npt.ArrayLike | None = None,
    sample_seed: int = 0,
    seed: int = 0,
    raw: bool = False,
    **faiss_options: int,
) -> Codec:
    """The codec ``code`` of ``budget`` bytes for the model's unit outputs (``raw``: inputs), from its statistics."""
    mean, cov = unit_output_moments(model, raw)
    mapped = None
    if code in NEEDS_SAMPLE:
        if sample is None:
            raise BadInputError(f"the {code} code learns from a sample of the input rows: give one")
        mapped = unit_rows(model, sample, raw)
    return train_codec(
        code,
        mean,
        cov,
        budget,
        sample=mapped,
        seed=seed,
        sample_seed=sample_seed if mapped is not None else None,
        unit=True,  # the model's outputs scaled to unit length
        **faiss_options,
    )


def with_codec(
    model: WhiteningModel, codec: Codec, code: str, *, sample_rows: int = 0, sample_seed: int = 0
) -> WhiteningModel:
    """``model`` recording ``codec`` (trained for its outputs) as its storage."""
    if codec.n_features != model.n_components:
        raise BadInputError(
            f"the {codec.label} codec codes vectors of {codec.n_features} values, but the map gives k={model.n_components}"
        )
    record = CodecRecord(
        data=codec.to_bytes(),
        code=code,
        budget=int(getattr(codec, "budget", codec.bytes_per_vector)),
        label=codec.label,
        n_features=codec.n_features,
        bytes_per_vector=codec.bytes_per_vector,
        sample_rows=int(sample_rows),
        sample_seed=int(sample_seed),
        setting=codec_setting(model),
    )
    return replace(model, storage=Storage(CODE, codec=record))


def model_codec(model: WhiteningModel) -> Codec | None:
    """The codec a model records as its storage (every field checked: `record_codec`), None without one."""
    storage = model.storage
    if storage is None or storage.codec is None:
        return None
    return record_codec(storage.codec, model.n_components)


def codec_summary(codec: Codec) -> dict[str, Any]:
    """What a result reports of a codec: its label, bytes per vector and per-model bytes."""
    return {"code": codec.label, "bytes_per_vector": codec.bytes_per_vector, "model_bytes": codec.model_bytes}


class CodecEncoder:
    """Encodes unit rows as a vector code's rows (Numba) and decodes them, from the codec's checksummed bytes."""

    def __init__(self, data: bytes, codec: Codec | None = None) -> None:
        self.data = bytes(data)
        self._codec: Any = codec

    def __getstate__(self) -> dict[str, Any]:
        return {"data": self.data}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["data"])  # type: ignore[misc]

    @property
    def codec(self) -> Codec:
        """The codec, decoded from its bytes on first use."""
        if self._codec is None:
            self._codec = codec_from_bytes(self.data)
        codec: Codec = self._codec
        return codec

    def encode(self, rows: np.ndarray) -> np.ndarray:
        from .fast import encode

        return encode(self.codec, rows)

    def decode(self, codes: np.ndarray, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
        """The rows the codes stand for (unit-length vectors, approximately)."""
        return np.asarray(self.codec.decode(codes), dtype=dtype)


def codec_digest(attrs: Mapping[str, Any]) -> str:
    """The SHA-256 of the codec bytes a code output's record names (its ``codec`` entry)."""
    record = storage_record(attrs)
    if not isinstance(record, Mapping) or not isinstance(record.get("codec"), Mapping):
        raise ValueError("not a vector code's record")
    return str(record["codec"]["sha256"])


def _quantization_digest(attrs: Mapping[str, Any]) -> str:
    """The digest of the codes' record an output's attributes carry, read as a `Quantization`."""
    return Quantization.from_attrs(attrs).digest()


def _stored_code(model: WhiteningModel, storage: Storage) -> StoredAs:
    """What stores ``model``'s outputs as the code ``storage`` names: the codec it carries or the model records, else
    one trained from the statistics; the record carries the codec's bytes, so an output decodes from itself."""
    held = model.storage
    recorded = storage.codec or (held.codec if held is not None and storage.names(held) else None)
    if recorded is not None:
        record_codec(recorded, model.n_components)  # every field checked before anything is written
        data, label, width = recorded.data, recorded.label, recorded.bytes_per_vector
        sample = (recorded.sample_rows, recorded.sample_seed)
    elif storage.code in NEEDS_SAMPLE:
        raise BadInputError(
            f"the {storage.code} code learns from a sample of the input: record it in the model first (the codes "
            f"command, or streamwhiten.with_codes(model, {str(storage)!r}, sample=...)); the model records "
            + (f"the {held.codec.label} code" if held is not None and held.codec else "no code"),
            param="dtype",
        )
    else:
        codec = train_for(model, str(storage.code), int(storage.budget or 0))
        data, label, width, sample = codec.to_bytes(), codec.label, codec.bytes_per_vector, (0, 0)
    carried = codec_record_data(data)  # the codec's bytes, so the output decodes from itself
    record = {
        "codec": {
            "code": storage.code,
            "budget": int(storage.budget or 0),
            "label": label,
            "bytes_per_vector": int(width),
            "n_features": int(model.n_components),
            "sample_rows": int(sample[0]),
            "sample_seed": int(sample[1]),
            **carried,
        }
    }
    return StoredAs(
        label, int(width), "uint8", record, carried["sha256"], read_digest=codec_digest, encoder=CodecEncoder(data)
    )


def stored_as(quantization: Quantization | None) -> StoredAs | None:
    """What stores codes made with ``quantization`` (int8 codes, sign bits; None: floats)."""
    if quantization is None:
        return None
    return StoredAs(
        quantization.kind,
        quantization.width,
        quantization.dtype.name,
        quantization.to_dict(),
        quantization.digest(),
        read_digest=_quantization_digest,
        encoder=quantization,
    )


class _Memo:
    """The last few storages `resolve` resolved (``hits`` and ``misses`` counted), under a lock."""

    def __init__(self, size: int = 8) -> None:
        self.size, self.hits, self.misses = size, 0, 0
        self.entries: OrderedDict[tuple[Any, ...], StoredAs | None] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> tuple[bool, StoredAs | None]:
        with self.lock:
            found = key in self.entries
            self.hits, self.misses = self.hits + found, self.misses + (not found)
            if found:
                self.entries.move_to_end(key)
            return found, self.entries.get(key)

    def put(self, key: tuple[Any, ...], stored: StoredAs | None) -> None:
        with self.lock:
            self.entries[key] = stored
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)


_MEMO = _Memo()


def resolve(model: WhiteningModel, storage: Storage | None = None) -> StoredAs | None:
    """What is stored when ``model``'s outputs are stored as ``storage`` (None: the model's own): None for
    floats, else the record an output carries, its digest and the encoder, which also decodes. Memoised by
    the model's content checksum (`file_checksum`) and ``storage``: a code is trained once."""
    storage = storage or model.storage or Storage()
    key = (file_checksum(model), str(storage), storage.codec and storage.codec.sha256)
    found, stored = _MEMO.get(key)
    if not found:
        if storage.dtype == CODE:
            stored = _stored_code(model, storage)
        else:
            stored = stored_as(model.quantization(storage.dtype) if storage.coded else None)
        _MEMO.put(key, stored)
    return stored


def resolve_counts() -> tuple[int, int]:
    """``(hits, misses)`` of `resolve` so far (tests count them)."""
    return _MEMO.hits, _MEMO.misses


__all__ = [
    "CodecEncoder",
    "codec_digest",
    "codec_summary",
    "model_codec",
    "resolve",
    "resolve_counts",
    "stored_as",
    "train_for",
    "unit_output_moments",
    "unit_rows",
    "with_codec",
]
