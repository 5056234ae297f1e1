"""The retrieval sweep's passes over the corpus: one rotation per beta shared by its settings, in slices.

A setting ``(beta, gamma, k)`` maps a row ``x`` to the first ``k`` columns of ``P = (x - beta mu) U`` scaled
by ``w = (Lambda_k + eps_)^(-gamma/2)``, then to unit length (the raw vectors: ``x`` at unit length). So
the settings of one beta share one product per slice of corpus rows (``n x d x d``), and each gamma and
k costs only a scaling and a truncation (``n x k``). A sign does not change with a positive scale: the
sign bits of a ``(beta, k)`` are those of ``P``'s first ``k`` columns, for every gamma.

A pass (`run_pass`) reads the corpus in blocks (`Reading.block_rows`; by default whole chunks, about
`SLICED_BLOCK_BYTES`) and works in float64 slices of about `SLICE_BYTES` (`corpus_slices`). **Memory:** the
pass's top lists and queries, two blocks and about four slices; nothing grows with the corpus's rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from .._buffers import trim_heap
from ..core.affine import scale_rows_to_unit
from ..core.model import WhiteningModel, project
from ..core.quantize import Quantization, raise_if_overflowed
from ..engine._threads import blas_threads, blas_threads_per_worker
from .retrieval import _finite
from .search import Reranking, SearchJob, SearchPass, corpus_slices

IDENTITY = ("identity",)


@dataclass(frozen=True)
class Reading:
    """How a pass reads the corpus: ``corpus`` (a Source or an array) and its ``label`` (for errors),
    ``block_rows`` per block read (None: about `SLICED_BLOCK_BYTES`, whole chunks),
    ``threads`` workers."""

    corpus: Any
    label: str
    block_rows: int | None
    threads: int


@dataclass(frozen=True)
class Rotation:
    """``P = (x - shift) @ basis`` in float64: what the settings of one beta share (``basis`` None: the
    rows as they are, in float64, for the raw vectors)."""

    basis: np.ndarray | None = None
    shift: np.ndarray | None = None

    def apply(self, rows: np.ndarray, _at: int = 0) -> np.ndarray:
        """The rotation of ``rows`` (the start row ``_at`` unused: the signature of a slice's function)."""
        if self.basis is None:
            return np.array(rows, dtype=np.float64)
        assert self.shift is not None  # made with the basis
        return project(rows, self.basis, self.shift)


def rotation_key(beta: float, identity: bool) -> tuple:
    """The key of a setting's rotation: its beta's, or `IDENTITY` for the raw vectors."""
    return IDENTITY if identity else ("eigen", float(beta))


def rotation_for(base: WhiteningModel | None) -> Rotation:
    """The rotation of the settings of ``base``'s beta (``base``: the model re-finalized at that beta;
    None: the identity)."""
    if base is None:
        return Rotation()
    return Rotation(np.ascontiguousarray(base.eigvecs, dtype=np.float64), base.beta * base.state.mean)


def scaling_for(base: WhiteningModel | None, gamma: float, k: int) -> np.ndarray | None:
    """The weights ``(Lambda_k + eps_)^(-gamma/2)`` of a setting of ``base``'s beta (None for the raw
    vectors, and where every weight is 1: gamma = 0)."""
    if base is None or gamma == 0.0:
        return None
    return np.asarray((base.eigvals[:k] + base.eps_value) ** (-gamma / 2.0), dtype=np.float64)


def unit_rows(product: np.ndarray, weights: np.ndarray | None, k: int) -> np.ndarray:
    """A setting's rows from its rotation's ``product``: the first ``k`` columns times ``weights`` (None:
    as they are), scaled to unit L2 length (zero rows stay zero); a row whose values overflow raises
    `ValuesTooLargeError`."""
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused just below
        out = np.array(product[:, :k]) if weights is None else product[:, :k] * weights
        norms = np.sqrt(np.einsum("ij,ij->i", out, out))
    if not np.all(np.isfinite(norms)):
        raise_if_overflowed(~np.isfinite(out).all(axis=1), out.dtype, "whitened")
    scale_rows_to_unit(out, norms)
    return out


def _unit_part(weights: np.ndarray | None, k: int, product: np.ndarray, _at: int) -> np.ndarray:
    return unit_rows(product, weights, k)


def stored(quantization: Quantization, unit: np.ndarray, _at: int = 0) -> np.ndarray:
    """``unit`` rows as a search sees them stored by ``quantization``: the bits, or the stored values
    decoded to float64."""
    codes = quantization.encode(unit)
    return codes if quantization.kind == "binary" else quantization.decode(codes, np.float64)


@dataclass
class Use:
    """What a pass does with one setting's unit rows (``k`` columns of the rotation ``rotation``, scaled
    by ``weights``): ``jobs``, searches whose ``prepare`` turns them into what is searched (see
    `stored`), and ``reranks``, ``(quantization, Reranking)`` pairs fed the rows they re-rank
    stored by the quantization."""

    rotation: tuple
    weights: np.ndarray | None
    k: int
    jobs: list[SearchJob] = field(default_factory=list)
    reranks: list[tuple[Quantization, Reranking]] = field(default_factory=list)


def run_pass(
    reading: Reading,
    rotations: dict[tuple, Rotation],
    uses: list[Use],
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """One pass over the corpus for every use of ``uses`` (their jobs' top lists and re-rankings are
    filled in place): per slice of rows, each rotation once, then each of its uses (see the module
    docstring). ``progress(rows_done, n_rows)`` after each slice."""
    by_rotation: dict[tuple, list[Use]] = {}
    for use in uses:
        by_rotation.setdefault(use.rotation, []).append(use)
    corpus = reading.corpus
    n_rows = int(corpus.shape[0]) if isinstance(corpus, np.ndarray) else int(corpus.n_rows)
    state = SearchPass([job for use in uses for job in use.jobs], reading.threads)
    try:
        with blas_threads(blas_threads_per_worker(state.threads)):
            for start, rows in corpus_slices(corpus, reading.block_rows):
                _finite(rows, start, reading.label)
                for key, group in by_rotation.items():
                    product = state.sliced(rotations[key].apply, rows, start)
                    for use in group:
                        _use_slice(state, use, product, start)
                    del product
                if progress is not None:
                    progress(start + rows.shape[0], n_rows)
    finally:
        state.close()
        trim_heap()  # the pass's slices and scores, freed in several threads' arenas


def _use_slice(state: SearchPass, use: Use, product: np.ndarray, start: int) -> None:
    """One use's work on a slice of rows (corpus rows ``start, start + 1, ...``) whose rotation is ``product``."""
    unit = state.sliced(partial(_unit_part, use.weights, use.k), product, start)
    for job in use.jobs:
        state.search_block(job, state.prepared(job, unit, start), start)
    for quantization, reranking in use.reranks:
        wanted = reranking.wanted(start, unit.shape[0])
        reranking.feed(start, stored(quantization, unit[wanted]))


def query_units(
    queries: np.ndarray, rotations: dict[tuple, Rotation]
) -> Callable[[tuple, np.ndarray | None, int], np.ndarray]:
    """``unit(rotation key, weights, k)``: the queries' unit rows of a setting, made as the corpus's are
    (`unit_rows` of the same rotation); each rotation of the queries is computed once."""
    products: dict[tuple, np.ndarray] = {}

    def unit(key: tuple, weights: np.ndarray | None, k: int) -> np.ndarray:
        if key not in products:
            products[key] = rotations[key].apply(queries)
        return unit_rows(products[key], weights, k)

    return unit


__all__ = [
    "IDENTITY",
    "Reading",
    "Rotation",
    "Use",
    "query_units",
    "rotation_for",
    "rotation_key",
    "run_pass",
    "scaling_for",
    "stored",
    "unit_rows",
]
