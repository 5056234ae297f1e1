"""Vector codes for a byte budget: the tool's own (eigen-allocated multi-bit codes, sign bits after a
random or ITQ rotation) and faiss's (PQ, OPQ + PQ, RaBitQ, SQ), behind one `Codec`
interface, trained from the exact statistics (mean, covariance) and, where a code learns from data,
a sample.

Names (`CODES`): ``eigen`` (bits weighted for queries like the vectors), ``eigen-iso`` (for
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

#: The codes `train_codec` trains.
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
#: The code families ``tune`` sweeps under a byte budget (``--max-bytes``; faiss's where faiss is
#: installed), by default; ``tune --help`` lists them from here.
TUNE_CODES: tuple[str, ...] = (
    "eigen",
    "eigen-iso",
    "eigen+f",
    "bits-random",
    "bits-random+f",
    "bits-itq",
    "faiss-pq",
    "faiss-opq",
    "faiss-rabitq1",
    "faiss-rabitq2",
    "faiss-rabitq4",
    "faiss-sq4",
    "faiss-sq8",
)


def code_size(name: str, n_features: int, budget: int) -> int | None:
    """The bytes a vector of the largest ``name`` code within ``budget`` bytes takes, for vectors of
    ``n_features`` values; None where even its smallest code does not fit.

    Each family's own size function gives it, the one its codec's ``bytes_per_vector`` comes from
    (`linear_bytes` of `eigen_bits` or `sign_bits`;
    faiss's reported code size, `faiss_bytes`, RaBitQ's per-vector factors
    included), and `train_codec` at that size trains exactly that code (an eigen code whose
    variance runs out before its bits may take fewer bytes, never more). faiss's sizes need faiss."""
    if name not in CODES:
        raise BadInputError(f"unknown code {name!r}: one of {', '.join(CODES)}")
    if name.startswith("faiss-"):
        from .faiss_codes import faiss_bytes

        faiss_bytes(name[len("faiss-") :], 1, 1)  # faiss missing is its own one-line error, not "does not fit"
    try:
        return _largest_size(name, int(n_features), int(budget))
    except BadInputError:  # below the smallest code
        return None


def _largest_size(name: str, n_features: int, budget: int) -> int:
    """`code_size`'s bytes, or `BadInputError` below the smallest code."""
    correction = name.endswith("+f")
    if name.startswith("eigen"):
        from .linear import eigen_bits, linear_bytes

        return linear_bytes(eigen_bits(n_features, budget, correction), correction)
    if name.startswith("bits-"):
        from .linear import CORRECTION_BYTES, linear_bytes, sign_bits

        whole = n_features // 8 + (CORRECTION_BYTES if correction else 0)  # one bit a feature, whole bytes
        return linear_bytes(sign_bits(n_features, min(budget, whole), correction), correction)
    from .faiss_codes import faiss_bytes, layout_for

    kind = name[len("faiss-") :]
    if kind in ("pq", "opq"):  # a byte a sub-space, at most a sub-space a feature
        budget = min(budget, n_features)
    return faiss_bytes(kind, *layout_for(kind, n_features, budget))


def fewest_sample_rows(name: str) -> int:
    """The fewest sample rows the code ``name`` trains on: 0 for those of statistics alone, PQ's and
    OPQ's 256 (a k-means centroid each), the others of `NEEDS_SAMPLE` 2."""
    if name not in NEEDS_SAMPLE:
        return 0
    if name.startswith("faiss-"):
        from .faiss_codes import fewest_rows

        return fewest_rows(name[len("faiss-") :])
    return 2


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
    """The code ``name`` (one of `CODES`) of at most ``budget`` bytes a vector, per-vector scalars
    included, for vectors of this mean and covariance; ``sample`` (rows of the vectors) for the codes
    of `NEEDS_SAMPLE`, ``seed`` for their random parts; ``faiss_options`` go to
    `train_faiss` (``iterations``, ``opq_iterations``). ``unit``: the vectors have
    unit length (the tool's outputs), so the tool's own codes estimate by the cosine with the decoded
    vector (`linear`) and faiss's rank by L2 distance (`train_faiss`). A budget below the code's smallest, or
    above what the vectors' width holds, is a one-line `BadInputError`."""
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
    """Refuse, as training would (`BadInputError`), a budget the code ``name`` of `NEEDS_SAMPLE`
    cannot take for vectors of ``n_features`` values: before its sample is read, not after."""
    if name.startswith("faiss-"):
        from .faiss_codes import layout_for

        layout_for(name[len("faiss-") :], int(n_features), int(budget))
    elif name.startswith("bits-"):
        from .linear import sign_bits

        sign_bits(int(n_features), int(budget), name.endswith("+f"), name.removesuffix("+f"))


def codec_from_bytes(data: bytes, n_features: int | None = None) -> Codec:
    """The codec `Codec.to_bytes` wrote; `ModelFileError` for damaged
    or altered bytes, `BadInputError` where ``n_features`` is given and the codec codes vectors
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


__all__ = [
    "CODES",
    "NEEDS_SAMPLE",
    "TUNE_CODES",
    "Codec",
    "check_budget",
    "code_size",
    "codec_from_bytes",
    "fewest_sample_rows",
    "train_codec",
]
