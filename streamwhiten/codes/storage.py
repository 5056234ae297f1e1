"""A codec as a model's storage: trained for the unit-length outputs of the model's map, recorded in the
model (`CodecRecord`: the codec's checksummed bytes), and read back.

The codec works on the vectors the search stores: ``y = x A + b`` scaled to unit length. The codes
that need only statistics train from the exact moments of those outputs, from the model's state with
no pass over data: ``mean_y = (1 - beta) mu A`` and ``cov_y = A^T Sigma A``, both divided by
``E||y||^2 = tr(cov_y) + ||mean_y||^2`` (the mean by its square root) for the unit length, as the int8
ranges are (`normalized_moments`). The codes that learn from data
(`NEEDS_SAMPLE`) take rows of the input, mapped by the model; how many and
the seed they were drawn with are recorded.

Code names on the command line and in ``eval``'s ``dtype``: ``NAME:BYTES`` (``eigen:24``,
``faiss-pq:16``; `parse_code`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeGuard

import numpy as np
import numpy.typing as npt

from ..core.model import WhiteningModel, codec_setting, project
from ..core.quantize import CODE, CodecRecord, Storage
from ..errors import BadInputError
from . import CODES, NEEDS_SAMPLE, record_codec, train_codec
from .base import Codec

#: How a code is named where a storage is: ``NAME:BYTES``.
SPEC_HELP = "NAME:BYTES, NAME one of " + ", ".join(CODES)


def is_code(spec: object) -> TypeGuard[str]:
    """Whether ``spec`` names a code (``NAME:BYTES``) rather than a plain storage dtype."""
    return isinstance(spec, str) and ":" in spec


def parse_code(spec: str) -> tuple[str, int]:
    """``("eigen", 24)`` of ``"eigen:24"``; `BadInputError` for anything else."""
    name, _, budget = str(spec).partition(":")
    if name not in CODES or not budget.isascii() or not budget.isdigit() or int(budget) < 1:
        raise BadInputError(f"a code is {SPEC_HELP} (e.g. eigen:24), got {spec!r}")
    return name, int(budget)


def unit_output_moments(
    model: WhiteningModel | None, raw: bool = False
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Mean and covariance of the model's unit-length outputs (``raw``: of the unit-length input
    vectors), from its statistics alone (see the module's text)."""
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
    """Input rows mapped as the storage holds them: the model's outputs (``raw``: the rows) at unit length."""
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
    """The codec ``code`` of at most ``budget`` bytes a vector for the model's unit-length outputs
    (``raw``: the unit-length input vectors): from the statistics, and for the codes of
    `NEEDS_SAMPLE` from ``sample`` (rows of the input, mapped here)."""
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


def recorded_code(model: WhiteningModel, spec: str) -> CodecRecord | None:
    """The codec record ``model`` keeps as its storage when it is the code ``spec`` (``NAME:BYTES``) names,
    else None: where apply, a job and the estimator ask whether the model already holds the code wanted."""
    code, budget = parse_code(spec)
    recorded = model.storage.codec if model.storage is not None else None
    return recorded if recorded is not None and (recorded.code, recorded.budget) == (code, budget) else None


def model_codec(model: WhiteningModel) -> Codec | None:
    """The codec a model records as its storage (decoded, every field checked: `record_codec`),
    None without one."""
    storage = model.storage
    if storage is None or storage.codec is None:
        return None
    return record_codec(storage.codec, model.n_components)


def codec_summary(codec: Codec) -> dict[str, Any]:
    """What a result reports of a codec: its label, bytes per vector (per-vector scalars included) and
    its per-model bytes (rotations, codebooks), apart."""
    return {"code": codec.label, "bytes_per_vector": codec.bytes_per_vector, "model_bytes": codec.model_bytes}


__all__ = [
    "SPEC_HELP",
    "codec_summary",
    "is_code",
    "model_codec",
    "parse_code",
    "recorded_code",
    "train_for",
    "unit_output_moments",
    "unit_rows",
    "with_codec",
]
