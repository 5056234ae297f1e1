"""Scores on labelled pairs: cosine similarity of aligned vectors against gold scores.

A `PairSet` is two aligned stores of vectors A and B (row ``i`` of A pairs with row ``i`` of B) and a 1-D
array of gold scores. The vectors are streamed in blocks; only the per-pair cosines (one float64 per pair
and setting) are held. Spearman's rho takes average ranks for ties; scores are reported x100.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ..core.finite import raise_if_nonfinite
from ..core.model import WhiteningModel, load_model, project
from ..errors import BadInputError
from ..io import Source, open_source, read_vector

#: Bytes of one block of pair vectors (A or B) read at a time.
PAIR_BLOCK_BYTES = 16 << 20
#: A correlation needs at least this many pairs.
MIN_PAIRS = 3
METRICS = ("spearman", "pearson")


# --------------------------------------------------------------------------------------- correlations


def rankdata(values: npt.ArrayLike) -> np.ndarray:
    """Ranks 1..n of ``values`` (float64), ties given the average of the ranks they span."""
    values = np.asarray(values)
    if values.ndim != 1:
        raise BadInputError(f"expected a 1-D array, got shape {values.shape}")
    n = values.shape[0]
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    # Start index of each run of equal values in sorted order.
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    ends = np.append(starts[1:], n)  # exclusive
    run_rank = (starts + ends + 1) / 2.0  # mean of the 1-based ranks starts+1 .. ends
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.repeat(run_rank, ends - starts)
    return ranks


def pearson(x: npt.ArrayLike, y: npt.ArrayLike) -> float:
    """Pearson's r of two equal-length 1-D arrays in float64; NaN when either is constant."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise BadInputError(f"expected two 1-D arrays of one length, got shapes {x.shape} and {y.shape}")
    if x.shape[0] < 2:
        return math.nan
    xc = x - x.mean()
    yc = y - y.mean()
    # Scale first so that sums of squares cannot overflow or underflow.
    xs, ys = np.abs(xc).max(), np.abs(yc).max()
    if xs == 0 or ys == 0:
        return math.nan
    xc, yc = xc / xs, yc / ys
    r = float(xc @ yc / math.sqrt(float(xc @ xc) * float(yc @ yc)))
    return max(-1.0, min(1.0, r))


def spearman(x: npt.ArrayLike, y: npt.ArrayLike) -> float:
    """Spearman's rho: Pearson's r of the average ranks; NaN when either input is constant."""
    return pearson(rankdata(x), rankdata(y))


def correlations(cosines: npt.ArrayLike, scores: npt.ArrayLike) -> dict:
    """``{"spearman": rho*100, "pearson": r*100}`` of cosines against gold scores."""
    return {"spearman": 100.0 * spearman(cosines, scores), "pearson": 100.0 * pearson(cosines, scores)}


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two equal-shape 2-D arrays in float64; 0 where either row is all zeros."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    dots = np.einsum("ij,ij->i", a, b)
    norms = np.sqrt(np.einsum("ij,ij->i", a, a) * np.einsum("ij,ij->i", b, b))
    return np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)


# ------------------------------------------------------------------------------------------ pair sets


@dataclass(frozen=True)
class PairsInfo:
    """What a pair result records of the pairs scored: the labels of stores ``a`` and ``b`` and of the gold
    ``scores``, ``n_pairs`` and ``n_features``."""

    a: str
    b: str
    scores: str
    n_pairs: int
    n_features: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PairSet:
    """Two aligned vector stores and their gold scores, opened and checked; close when done."""

    a: Source
    b: Source
    scores: np.ndarray
    scores_label: str

    @property
    def n_pairs(self) -> int:
        return self.a.n_rows

    @property
    def n_features(self) -> int:
        return self.a.n_features

    def describe(self) -> PairsInfo:
        return PairsInfo(self.a.label, self.b.label, self.scores_label, self.n_pairs, self.n_features)

    def check_width(self, n_features: int, what: str = "the model") -> None:
        if self.n_features != n_features:
            raise BadInputError(
                f"{self.a.label}: pair vectors have {self.n_features} columns but {what} expects {n_features}"
            )

    def default_block_rows(self) -> int:
        itemsize = max(self.a.dtype.itemsize, 8)  # blocks are worked on in float64
        return max(1, PAIR_BLOCK_BYTES // (self.n_features * itemsize))

    def blocks(self, block_rows: int | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(start, a_rows, b_rows)`` in float64, block by block; raises on a row holding NaN or Inf."""
        block_rows = int(block_rows or self.default_block_rows())
        for start, stop in self.a.blocks(block_rows):
            rows = [source.read(start, stop).astype(np.float64) for source in (self.a, self.b)]
            for source, block in zip((self.a, self.b), rows, strict=True):
                raise_if_nonfinite(block, f"{source.label}:", start=start)
            yield start, rows[0], rows[1]

    def close(self) -> None:
        self.a.close()
        self.b.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object):
        self.close()


def open_pairs(a_spec: str, b_spec: str, scores_spec: str) -> PairSet:
    """Open and check labelled pairs: A and B of one shape, finite scores of the same length."""
    scores, scores_label = read_vector(scores_spec)
    bad = np.flatnonzero(~np.isfinite(scores))
    if bad.size:
        what = "NaN" if np.isnan(scores[bad[0]]) else "infinite"
        raise BadInputError(f"{scores_label}: score {bad[0]} is {what} ({bad.size} non-finite score(s) in all)")
    opened: list[Source] = []
    try:
        a = open_source(a_spec, min_rows=MIN_PAIRS)
        opened.append(a)
        b = open_source(b_spec, min_rows=MIN_PAIRS)
        opened.append(b)
        if a.n_rows != b.n_rows:
            raise BadInputError(
                f"pair stores differ in length: {a.label} has {a.n_rows} rows but {b.label} has {b.n_rows}"
            )
        if a.n_features != b.n_features:
            raise BadInputError(
                f"pair stores differ in width: {a.label} has {a.n_features} columns but {b.label} has {b.n_features}"
            )
        if scores.shape[0] != a.n_rows:
            raise BadInputError(f"{scores_label}: has {scores.shape[0]} scores but there are {a.n_rows} pairs")
        if np.all(scores == scores[0]):
            raise BadInputError(f"{scores_label}: every score is {scores[0]:g}; a correlation needs them to vary")
    except BaseException:
        for source in opened:
            source.close()
        raise
    return PairSet(a, b, scores, scores_label)


# ---------------------------------------------------------------------------------------- evaluation


def pair_cosines(
    pairs: PairSet,
    models: dict | None = None,
    block_rows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    codecs: dict | None = None,
) -> dict:
    """Cosines of every pair, raw (key ``"raw"``) and under each ``models`` entry, in one pass over the pairs.

    ``models`` maps a name to a [`WhiteningModel`][streamwhiten.core.model.WhiteningModel]; the transform is
    computed in float64. ``codecs`` maps a name of ``models`` to a vector code (``streamwhiten.codes.Codec``)
    of its unit outputs: that entry's cosine is then the codec's estimate of ``<a, b>``, A float and B coded
    (as a query meets a stored vector).
    """
    for model in (models or {}).values():
        pairs.check_width(model.n_features)
    projections = {name: model.projection(np.float64) for name, model in (models or {}).items()}
    codecs = {name: codec for name, codec in (codecs or {}).items() if codec is not None}
    out = {name: np.empty(pairs.n_pairs) for name in ["raw", *projections]}
    for start, a, b in pairs.blocks(block_rows):
        stop = start + a.shape[0]
        out["raw"][start:stop] = cosine_rows(a, b)
        for name, (weights, shift) in projections.items():
            if name in codecs:  # A float, B as its code: the codec's estimate of <a, b> of the unit vectors
                unit_a, unit_b = (project(rows, weights, shift, normalize=True) for rows in (a, b))
                out[name][start:stop] = pair_estimates(codecs[name], unit_a, unit_b)
            else:
                out[name][start:stop] = cosine_rows(project(a, weights, shift), project(b, weights, shift))
        if progress is not None:
            progress(stop, pairs.n_pairs)
    return out


#: Pairs whose estimates are taken at once (a block of queries against a block of codes, its diagonal kept).
_PAIR_TILE = 256


def pair_estimates(codec: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The codec's estimate of ``<a_i, b_i>`` for each pair, ``b_i`` coded and ``a_i`` as it is (float64)."""
    codes = codec.encode(b)
    out = np.empty(a.shape[0])
    for t0 in range(0, a.shape[0], _PAIR_TILE):
        t1 = min(a.shape[0], t0 + _PAIR_TILE)
        out[t0:t1] = np.diagonal(codec.inner_products(a[t0:t1], codes[t0:t1]))
    return out


def describe_model(model: WhiteningModel) -> dict:
    """The transform parameters of ``model`` as plain values."""
    return {
        "beta": model.beta,
        "gamma": model.gamma,
        "k": model.n_components,
        "eps": model.eps,
        "variance": model.variance,
        "basis": model.basis,
    }


@dataclass(frozen=True)
class PairScores:
    """Spearman's rho and Pearson's r (x100) of the cosines against the gold scores."""

    spearman: float
    pearson: float


@dataclass(frozen=True)
class WhitenedPairScores(PairScores):
    """The scores of the whitened cosines with the model's setting (`describe_model`) and, where the model
    records a vector code (B scored as its code), the ``code``, its ``bytes_per_vector`` and ``model_bytes``
    (None without one, and left out of `to_json`)."""

    beta: float
    gamma: float
    k: int
    eps: float
    variance: float | None
    basis: str
    code: str | None = None
    bytes_per_vector: int | None = None
    model_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.code is None:  # no vector code recorded: its fields left out
            del out["code"], out["bytes_per_vector"], out["model_bytes"]
        return out


@dataclass(frozen=True)
class PairsResult:
    """The scores of a whitening on labelled pairs (what [`evaluate`][streamwhiten.evaluation.evaluate.evaluate]
    returns, ``eval --json`` prints).

    Attributes
    ----------
    pairs : PairsInfo
        What was scored: ``a``, ``b`` and ``scores`` (the stores' labels), ``n_pairs``, ``n_features``.
    raw : PairScores
        ``spearman`` and ``pearson`` (x100) of the raw cosines.
    whitened : WhitenedPairScores or None
        The same of the whitened cosines, with the setting (``beta``, ``gamma``, ``k``, ``eps``, ``variance``,
        ``basis``) and any vector code the model records; None without a model.
    model : str or None
        The model file scored, where it was given as one.
    """

    pairs: PairsInfo
    raw: PairScores
    whitened: WhitenedPairScores | None
    model: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The result as plain JSON values: ``{"pairs", "raw", "whitened", "model"}``."""
        return {
            "pairs": self.pairs.to_json(),
            "raw": asdict(self.raw),
            "whitened": None if self.whitened is None else self.whitened.to_json(),
            "model": self.model,
        }


def evaluate_pairs(
    pairs: PairSet,
    model: WhiteningModel | None = None,
    block_rows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PairsResult:
    """Spearman and Pearson (x100) of raw cosines and, given a model, of whitened cosines.

    A model that records a vector code as its storage scores its pairs by the codec's estimate of the
    cosine, B coded (`pair_cosines`); ``whitened`` then names the code, its bytes per vector and
    per model.
    """
    codec = None
    if model is not None and model.storage is not None and model.storage.codec is not None:
        from ..codes.storage import codec_summary, model_codec

        codec = model_codec(model)
    cosines = pair_cosines(
        pairs, {"whitened": model} if model is not None else None, block_rows, progress, {"whitened": codec}
    )
    whitened = None
    if model is not None:
        coded = {} if codec is None else codec_summary(codec)
        whitened = WhitenedPairScores(
            **correlations(cosines["whitened"], pairs.scores), **describe_model(model), **coded
        )
    return PairsResult(pairs.describe(), PairScores(**correlations(cosines["raw"], pairs.scores)), whitened)


def evaluate(
    pairs_a: Any,
    pairs_b: Any,
    scores: Any,
    model: Any = None,
    *,
    setting: Any = None,
    block_rows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PairsResult:
    """Score a whitening on labelled pairs: Spearman and Pearson (x100) of the cosines of the raw pairs and,
    given ``model`` (a [`WhiteningModel`][streamwhiten.core.model.WhiteningModel] or its file), of the whitened ones.

    ``pairs_a`` and ``pairs_b`` are row-aligned stores (specs as ``fit`` takes them), ``scores`` their gold
    scores (a 1-D store, ``.npy``, or a CSV/TSV column: ``sts-dev.csv:4``); ``setting`` (an
    ``options.Setting``) evaluates another setting than the model's saved one, re-finalized from its
    statistics. Returns a [`PairsResult`][streamwhiten.evaluation.evaluate.PairsResult].
    """
    model_file = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
    model = load_model(model_file) if model_file is not None else model
    changes = setting.given() if setting is not None else {}
    if changes:
        if model is None:
            raise BadInputError("a setting needs a model to evaluate it with")
        model = model.with_params(**changes)
    with open_pairs(pairs_a, pairs_b, scores) as pairs:
        return replace(evaluate_pairs(pairs, model, block_rows, progress), model=model_file)


__all__ = [
    "PairSet",
    "PairsInfo",
    "PairScores",
    "PairsResult",
    "WhitenedPairScores",
    "evaluate",
    "open_pairs",
    "rankdata",
    "pearson",
    "spearman",
    "correlations",
    "cosine_rows",
    "pair_cosines",
    "pair_estimates",
    "evaluate_pairs",
    "METRICS",
]
