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


def check_budget(name: str, n_features: int, budget: int) -> None:
    """Refuse, as training would (:class:`BadInputError`), a budget the code ``name`` of :data:`NEEDS_SAMPLE`
    cannot take for vectors of ``n_features`` values: before its sample is read, not after."""
    if name.startswith("faiss-"):
        from .faiss_codes import layout_for

        layout_for(name[len("faiss-") :], int(n_features), int(budget))
    elif name.startswith("bits-"):
        from .linear import sign_bit_count

        sign_bit_count(name.removesuffix("+f"), int(n_features), int(budget), correction=name.endswith("+f"))


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


__all__ = ["CODES", "NEEDS_SAMPLE", "Codec", "check_budget", "codec_from_bytes", "train_codec"]
