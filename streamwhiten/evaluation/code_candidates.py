"""Vector codes as candidates of the retrieval sweep: each family of `streamwhiten.codes` at a byte budget.

A code candidate stores the raw vectors scaled to unit length (the raw reference's cosine geometry; the
identity map) as the family's largest code within the budget (`fitting_codes`), searched by the codec's
estimate of ``<q, x>`` with float32 unit queries. Codes that need only statistics (``eigen``,
``bits-random``) train from the exact mean and covariance of the unit corpus rows; those that learn
from data (`NEEDS_SAMPLE`) from a seeded sample of them, recorded (`code_record`).

**Cost.** Two passes in slices (`corpus_slices`): the statistics (``n x d x d``) and the sample, then
each slice encoded by every code and merged, `CODE_SEARCH_ROWS` code rows at a time, into each code's
top lists (the tool's codes by the Numba table scan, faiss's by faiss). Memory (the queries, the sample,
top lists, a batch of code rows, a slice, training in bounded batches: `pq_batches`) does not grow with
the corpus rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np

from .._buffers import trim_heap
from ..codes import CODES, NEEDS_SAMPLE, Codec, code_size, train_codec
from ..engine._threads import blas_threads
from ..errors import StreamwhitenError
from ..progress import steps
from .retrieval import RetrievalTask, _finite
from .search import corpus_slices

#: Code rows searched at once by `search_codes` (each search sets up faiss's index or the tool's tables
#: once): a few bytes a row, so a batch costs little memory.
CODE_SEARCH_ROWS = 1 << 15
#: Corpus rows the sample-trained codes learn from (all of them when the corpus is smaller), and its seed.
SAMPLE_ROWS, SAMPLE_SEED = 6000, 0
#: k-means iterations of faiss's PQ codebooks (and of OPQ's first PQ) and OPQ's rotation updates while
#: tuning (fewer than faiss's defaults, 25 (40) and 50, to keep a tune short; recorded in the codec).
KMEANS_ITERATIONS, OPQ_ITERATIONS = 10, 4


def split_families(names: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``names`` (``tune``'s ``dtypes``) apart, each once in its order: the plain storages and the code
    families (of `CODES`)."""
    unique = tuple(dict.fromkeys(names))
    return tuple(name for name in unique if name not in CODES), tuple(name for name in unique if name in CODES)


def smallest_bytes(name: str, n_features: int, limit: int = 64) -> int | None:
    """The fewest bytes a vector of the code ``name`` takes (None: none up to ``limit``)."""
    return next((b for b in range(1, limit + 1) if code_size(name, n_features, b) is not None), None)


def fitting_codes(names: Iterable[str], n_features: int, budget: int) -> dict[str, int]:
    """``{name: bytes}`` of the codes of ``names`` that fit ``budget``, in their order: the bytes a vector
    of the largest code of each within the budget takes (`code_size`, the
    family's own size, faiss's as faiss reports it), which is what it trains at. Each is checked
    against the budget here, before any work."""
    out = {}
    for name in names:
        size = code_size(name, n_features, budget)
        if size is None:
            continue
        if not 1 <= size <= budget:  # the size functions keep within it: a bug, caught before any training
            raise StreamwhitenError(f"the {name} code planned for a budget of {budget} bytes takes {size}")
        out[name] = size
    return out


def unit_rows(rows: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm in float64 (zero rows stay zero)."""
    out = np.array(rows, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", out, out))
    np.divide(out, norms[:, None], out=out, where=norms[:, None] > 0)
    return out


def unit_statistics(
    task: RetrievalTask,
    sample_rows: int,
    seed: int,
    block_rows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, covariance, sample)`` of the corpus rows scaled to unit length, in one pass: the exact
    float64 moments of all of them, and the rows ``numpy.random.default_rng(seed).choice(n, size)``
    (sorted, without replacement) of at most ``sample_rows``; ``progress(rows_done, n_rows)`` after each
    block."""
    n, d = task.n_corpus, task.n_features
    picked = np.sort(np.random.default_rng(seed).choice(n, min(int(sample_rows), n), replace=False))
    sample = np.empty((picked.size, d))
    total, scatter = np.zeros(d), np.zeros((d, d))
    for start, rows in corpus_slices(task.corpus, block_rows):
        unit = unit_rows(_finite(rows, start, task.corpus_label))
        total += unit.sum(axis=0)
        scatter += unit.T @ unit
        lo, hi = np.searchsorted(picked, [start, start + rows.shape[0]])
        sample[lo:hi] = unit[picked[lo:hi] - start]
        if progress is not None:
            progress(start + rows.shape[0], n)
    trim_heap()  # before the codes train: what the pass freed is not under their peak
    mean = total / n
    return mean, scatter / n - np.outer(mean, mean), sample


def train_codes(
    wanted: list[tuple[str, int]],
    mean: np.ndarray,
    covariance: np.ndarray,
    sample: np.ndarray,
    sample_seed: int,
    threads: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> list[Codec]:
    """The codec of each ``(name, bytes)``, trained from the statistics (and ``sample`` where it learns
    from data; faiss's k-means seeded by ``sample_seed``), ``threads`` codes at a time, each on one core
    (faiss's and BLAS's own threads held to one: the codes, not their inner loops, run side by side);
    ``progress(codes_done, n_codes)`` as each is trained."""
    step = steps(progress, len(wanted))
    faiss_options = dict(
        iterations=KMEANS_ITERATIONS, opq_iterations=OPQ_ITERATIONS, opq_initial_iterations=KMEANS_ITERATIONS
    )

    def one(name: str, size: int) -> Codec:
        learns = name in NEEDS_SAMPLE  # the raw rows scaled to unit length (unit=True)
        extra = faiss_options if name.startswith("faiss-") else {}
        picked, seed = (sample, sample_seed) if learns else (None, None)
        codec = train_codec(
            name, mean, covariance, size, sample=picked, seed=sample_seed, sample_seed=seed, unit=True, **extra
        )
        step()
        return codec

    # the slowest first (OPQ, then PQ), so that the others fill the other threads meanwhile
    order = sorted(
        range(len(wanted)), key=lambda i: (not wanted[i][0].endswith("opq"), not wanted[i][0].endswith("pq"))
    )
    with _one_thread_each(
        any(name.startswith("faiss-") for name, _ in wanted), max([0] + [size for _, size in wanted])
    ):
        if threads <= 1 or len(wanted) <= 1:
            done = {i: one(*wanted[i]) for i in order}
        else:
            with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="streamwhiten-codes") as pool:
                futures = {i: pool.submit(one, *wanted[i]) for i in order}
                done = {i: future.result() for i, future in futures.items()}
    trim_heap()  # faiss's and the threads' training memory, freed
    return [done[i] for i in range(len(wanted))]


@contextmanager
def _one_thread_each(uses_faiss: bool, max_bytes: int = 0) -> Iterator[None]:
    """BLAS (and faiss's OpenMP, where faiss is used) held to one thread, restored after; faiss's product
    quantizers encoding in batches of bounded memory for codes of up to ``max_bytes`` bytes."""
    with blas_threads(1):
        if not uses_faiss:
            yield
            return
        from ..codes.faiss_codes import one_omp_thread, pq_batches

        with one_omp_thread(), pq_batches(max_bytes):
            yield


def _merge_found(
    top_scores: np.ndarray, top_rows: np.ndarray, scores: np.ndarray, found: np.ndarray, start: int, exclude: Any
) -> None:
    """Merge faiss's block results (block rows ``found``, -1 for none) into the top lists, excluded
    pairs dropped, best first, ties to the lower row."""
    rows = np.where(found >= 0, found + start, -1)
    scores = np.where(found >= 0, scores, -np.inf).astype(np.float32)
    for query in np.flatnonzero(np.diff(exclude.start)):
        dropped = np.isin(rows[query], exclude.rows[exclude.start[query] : exclude.start[query + 1]])
        scores[query, dropped] = -np.inf
    all_scores = np.concatenate([top_scores, scores], axis=1)
    all_rows = np.concatenate([top_rows, rows], axis=1)
    all_rows = np.where(np.isfinite(all_scores), all_rows, -1)
    order = np.lexsort((np.where(all_rows < 0, np.iinfo(np.int64).max, all_rows), -all_scores), axis=1)
    depth = top_scores.shape[1]
    top_scores[:] = np.take_along_axis(all_scores, order, axis=1)[:, :depth]
    top_rows[:] = np.take_along_axis(all_rows, order, axis=1)[:, :depth]


def search_codes(
    task: RetrievalTask,
    codecs: dict[str, Codec],
    depth: int,
    block_rows: int | None = None,
    progress: Callable[[int], None] | None = None,
    threads: int = 1,
) -> dict[str, np.ndarray]:
    """The top ``depth`` corpus rows (queries x depth, best first, -1 past the last) of every codec's
    search, in one pass over the corpus (see the module docstring); ``threads`` codes at a time."""
    from ..codes.faiss_codes import FaissCode
    from ..codes.fast import encode, merge_block

    queries = unit_rows(task.vectors).astype(np.float32)
    n_queries = queries.shape[0]
    exclude = task.excluded
    extra = int(np.diff(exclude.start).max()) if n_queries else 0
    tops = {
        name: (np.full((n_queries, depth), -np.inf, np.float32), np.full((n_queries, depth), -1, np.int64))
        for name in codecs
    }

    pending: dict[str, list[np.ndarray]] = {name: [] for name in codecs}  # code rows not yet searched

    def search(name: str, start: int) -> None:
        codec, codes = codecs[name], np.concatenate(pending[name])
        pending[name] = []
        top_scores, top_rows = tops[name]
        if isinstance(codec, FaissCode):
            scores, found = codec.search(queries, codes, min(codes.shape[0], depth + extra))
            _merge_found(top_scores, top_rows, scores, found, start, exclude)
        else:
            merge_block(codec, queries, codes, start, top_scores, top_rows, exclude.start, exclude.rows)  # type: ignore[arg-type]  # a LinearCode: the only other family

    def run(function: Callable[[str], None]) -> None:
        for future in [pool.submit(function, name) for name in codecs]:
            future.result()

    uses_faiss = any(isinstance(codec, FaissCode) for codec in codecs.values())
    widest = max([0] + [int(codec.bytes_per_vector) for codec in codecs.values()])
    first = held = 0  # the first corpus row of the code rows held, and how many
    with _one_thread_each(uses_faiss, widest), ThreadPoolExecutor(max(1, threads), "streamwhiten-codes") as pool:
        for start, rows in corpus_slices(task.corpus, block_rows):
            unit = unit_rows(_finite(rows, start, task.corpus_label))
            run(lambda name, unit=unit: pending[name].append(encode(codecs[name], unit)))  # type: ignore[misc]  # mypy cannot infer a lambda whose default binds the loop variable (python/mypy#15459)
            first, held = (first if held else start), held + rows.shape[0]
            if held >= CODE_SEARCH_ROWS:  # a search per batch of code rows: each costs its set-up once
                run(lambda name, at=first: search(name, at))  # type: ignore[misc]  # as above
                held = 0
            if progress is not None:
                progress(start + rows.shape[0])
        if held:
            run(lambda name: search(name, first))
    return {name: rows for name, (_scores, rows) in tops.items()}


def code_record(codec: Codec, name: str, sample_rows: int, sample_seed: int) -> dict[str, Any]:
    """What a tune result records of a code candidate: its family, bytes, per-model bytes, the SHA-256
    of its byte form, and what it was trained from."""
    data = codec.to_bytes()
    record: dict[str, Any] = {
        "family": name,
        "label": codec.label,
        "bytes_per_vector": int(codec.bytes_per_vector),
        "model_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "vectors": "raw, scaled to unit length",
        "statistics": "exact mean and covariance of the corpus rows scaled to unit length",
    }
    if name in NEEDS_SAMPLE:
        record.update(sample_rows=int(sample_rows), sample_seed=int(sample_seed))
    return record


__all__ = [
    "CODE_SEARCH_ROWS",
    "KMEANS_ITERATIONS",
    "OPQ_ITERATIONS",
    "SAMPLE_ROWS",
    "SAMPLE_SEED",
    "code_record",
    "fitting_codes",
    "search_codes",
    "smallest_bytes",
    "split_families",
    "train_codes",
    "unit_rows",
    "unit_statistics",
]
