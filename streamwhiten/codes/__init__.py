"""Vector codes for a byte budget: the tool's own (eigen-allocated multi-bit codes, sign bits after a
random or ITQ rotation) and faiss's (PQ, OPQ + PQ, RaBitQ, SQ), behind one :class:`~.base.Codec`
interface, trained from the exact statistics (mean, covariance) and, where a code learns from data,
a sample.

Names (:data:`CODES`): ``eigen`` (bits weighted for queries like the vectors), ``eigen-iso`` (for
isotropic queries), ``bits-random``, ``bits-itq``, ``bits-pca`` (each ``+f`` with the per-vector
correction, ``eigen+f`` too), and ``faiss-pq``, ``faiss-opq``, ``faiss-rabitq1``,
``faiss-rabitq2``, ``faiss-rabitq4``, ``faiss-sq4``, ``faiss-sq8``.

Examples
--------
>>> import numpy as np
>>> from streamwhiten.codes import train_codec, codec_from_bytes
>>> rng = np.random.default_rng(0)
>>> x = rng.standard_normal((1000, 16)) * np.linspace(3, 0.1, 16)
>>> codec = train_codec("eigen", x.mean(0), np.cov(x.T), 6)
>>> codec.bytes_per_vector, codec.encode(x[:3]).shape
(6, (3, 6))
>>> codec_from_bytes(codec.to_bytes()).label
'eigen-6B'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy.typing as npt

from ..errors import BadInputError, ModelFileError
from .base import Codec, read_parts

#: The codes :func:`train_codec` trains.
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
#: The codes that learn from a sample of the vectors (the others need only the statistics).
NEEDS_SAMPLE: tuple[str, ...] = tuple(name for name in CODES if name.startswith(("faiss-", "bits-itq")))


def train_codec(
    name: str,
    mean: npt.ArrayLike,
    covariance: npt.ArrayLike,
    budget: int,
    *,
    sample: npt.ArrayLike | None = None,
    seed: int = 0,
    sample_seed: int | None = None,
    unit: bool = False,
    **faiss_options: int,
) -> Codec:
    """The code ``name`` (one of :data:`CODES`) of at most ``budget`` bytes a vector, per-vector scalars
    included, for vectors of this mean and covariance; ``sample`` (rows of the vectors) for the codes
    of :data:`NEEDS_SAMPLE`, ``seed`` for their random parts; ``faiss_options`` go to
    :func:`~.faiss_codes.train_faiss` (``iterations``, ``opq_iterations``). ``unit``: the vectors have
    unit length (the tool's outputs), so the tool's own codes estimate by the cosine with the decoded
    vector (:mod:`.linear`) and faiss's rank by L2 distance (:func:`~.faiss_codes.train_faiss`). A budget below the code's smallest, or
    above what the vectors' width holds, is a one-line :class:`BadInputError`."""
    if name not in CODES:
        raise BadInputError(f"unknown code {name!r}: one of {', '.join(CODES)}")
    if isinstance(budget, bool) or int(budget) != budget:
        raise BadInputError(f"a byte budget is a whole number, got {budget!r}")
    if name in NEEDS_SAMPLE and sample is None:
        raise BadInputError(f"the {name} code learns from a sample of the vectors: give one")
    if name.startswith("eigen"):
        from .linear import train_eigen

        queries = "isotropic" if name == "eigen-iso" else "data"
        return train_eigen(
            mean, covariance, int(budget), correction=name == "eigen+f", queries=queries, seed=seed
        ).with_unit(unit)
    if name.startswith("bits-"):
        from .linear import train_sign_bits

        rotation = name[len("bits-") :].removesuffix("+f")
        return train_sign_bits(
            mean, covariance, int(budget), rotation=rotation, sample=sample, seed=seed, correction=name.endswith("+f")
        ).with_unit(unit)
    from .faiss_codes import train_faiss

    assert sample is not None  # checked above
    return train_faiss(
        name[len("faiss-") :],
        mean,
        covariance,
        int(budget),
        sample,
        seed=seed,
        sample_seed=sample_seed,
        unit=unit,
        **faiss_options,
    )


def codec_from_bytes(data: bytes, n_features: int | None = None) -> Codec:
    """The codec :meth:`Codec.to_bytes` wrote; :class:`~streamwhiten.errors.ModelFileError` for damaged
    or altered bytes, :class:`BadInputError` where ``n_features`` is given and the codec codes vectors
    of another width."""
    family, record, arrays = read_parts(data)
    if family == "linear":
        from .linear import LinearCode

        codec: Codec = LinearCode._from_parts(record, arrays)
    elif family == "faiss":
        from .faiss_codes import FaissCode

        codec = FaissCode._from_parts(record, arrays)
    else:
        raise ModelFileError(f"unknown codec family {family!r} (a newer streamwhiten wrote it?)")
    if n_features is not None and codec.n_features != int(n_features):
        raise BadInputError(
            f"the {codec.label} codec codes vectors of {codec.n_features} values, not {int(n_features)}"
        )
    return codec


#: What a vector-code output's record says of how its rows decode (``apply``, a job's parts).
DECODE_HINT = (
    "serving.decode(rows, attrs) or serving.codec(attrs), attrs the output's attributes: this record holds the "
    "codec (data: its bytes in base64; sha256: their SHA-256)"
)


def codec_record_data(data: bytes) -> dict[str, str]:
    """The entries a vector-code output's record (its ``codec`` entry) carries so it decodes from itself:
    the codec's bytes (base64), their SHA-256 and how to decode."""
    import base64
    import hashlib

    return {
        "data": base64.b64encode(data).decode("ascii"),
        "sha256": hashlib.sha256(data).hexdigest(),
        "decode": DECODE_HINT,
    }


def codec_from_record(entry: Mapping[str, Any], where: str = "the output") -> Codec:
    """The codec a vector-code output's record carries (its ``codec`` entry: ``data``, the codec's bytes in
    base64, checked against ``sha256``); :class:`~streamwhiten.errors.ModelFileError` naming ``where`` and
    the field for damaged or altered bytes. An output written before outputs carried their codec (no
    ``data``) is a :class:`BadInputError` saying which model file's codec decodes it."""
    import base64
    import binascii
    import hashlib

    label, sha = entry.get("label", "vector-code"), str(entry.get("sha256", ""))
    text = entry.get("data")
    if text is None:
        raise BadInputError(
            f"{where}: its {label} codes were written before outputs carried their codec: decode them with "
            f"serving.decode(rows, serving.codec(MODEL)), MODEL the model file whose codec's SHA-256 is {sha}"
        )
    try:
        data = base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError):
        raise ModelFileError(f"{where}: field quantization.codec.data is not base64 (damaged or edited)") from None
    if hashlib.sha256(data).hexdigest() != sha:
        raise ModelFileError(f"{where}: field quantization.codec.data does not match its sha256 (damaged or edited)")
    n_features = entry.get("n_features")
    return codec_from_bytes(data, None if n_features is None else int(n_features))


__all__ = [
    "CODES",
    "DECODE_HINT",
    "NEEDS_SAMPLE",
    "Codec",
    "codec_from_bytes",
    "codec_from_record",
    "codec_record_data",
    "train_codec",
]
