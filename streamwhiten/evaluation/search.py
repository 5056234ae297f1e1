"""Exact nearest-neighbour search over a corpus in memory or streamed from a store.

Two metrics: ``"ip"``, the inner product of float vectors (larger is better; the cosine of unit vectors),
and ``"hamming"``, the Hamming distance of ``numpy.packbits`` rows (smaller is better). Each query keeps
its ``depth`` best corpus rows, best first, **ties to the lower corpus row** however the corpus is cut
into blocks; pairs named in an `Exclusions` are never candidates.

The corpus is read a block at a time (the next one while this one is searched), so it may be larger than
memory. A job's ``prepare`` turns a block into what is searched (on the worker threads, in row slices);
each worker then searches it for its share of the queries (BLAS tiles or a popcount kernel, merged by
``core.kernels.search``). Jobs can share a pass (`search`); `rescore_all` re-ranks candidate lists (each a
`RescoreJob`) with other vectors of the same rows, in one pass over the blocks that hold them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.exclusions import Exclusions
from ..core.kernels import search as kernels
from ..engine._threads import blas_threads, blas_threads_per_worker, limit_this_thread, resolve_threads
from ..errors import BadInputError
from ..io import Source

METRICS = ("ip", "hamming")
#: Bytes of corpus rows read per block from a store (in memory: per block handed to the workers).
SEARCH_BLOCK_BYTES = 32 << 20
#: Bytes of corpus rows (as stored) per block read by `corpus_slices` when no block size is given:
#: whole chunks of a store, about this many bytes (two blocks are held: the one worked on and the next).
SLICED_BLOCK_BYTES = 4 << 20
#: Bytes of float64 rows of the corpus's width that a pass works on at once (a slice of a block, see
#: `corpus_slices`): a store's block (whole chunks) may be much larger.
SLICE_BYTES = 4 << 20
#: Bytes of one tile of inner products (a worker's queries x rows): small enough to stay in cache
#: while the merge kernel reads it back.
SCORE_TILE_BYTES = 2 << 20
_EMPTY_DISTANCE = np.iinfo(np.int64).max
#: (query, candidate) pairs whose inner products are taken at once when rescoring (bounds the memory).
_RESCORE_PAIRS = 8192


@dataclass
class SearchResult:
    """The top lists: ``rows`` (queries x depth, int64, -1 past the last candidate) and ``values``
    (the scores, or the Hamming distances: the largest int64 past the last candidate), best first."""

    rows: np.ndarray
    values: np.ndarray
    metric: str


@dataclass
class SearchJob:
    """One search in a pass over the corpus.

    Attributes
    ----------
    queries : ndarray
        ``ip``: float32 or float64 rows (the scores are computed in their dtype); ``hamming``: uint8
        rows of packed bits.
    depth : int
        The length of each query's top list.
    metric : str
        ``"ip"`` or ``"hamming"``.
    prepare : callable, optional
        ``prepare(rows, start)`` turns corpus rows ``start, start + 1, ...`` as read into what is
        searched (float rows of the queries' width, or packed bits); default: the rows themselves.
    exclude : Exclusions, optional
    """

    queries: np.ndarray
    depth: int
    metric: str = "ip"
    prepare: Callable[[np.ndarray, int], np.ndarray] | None = None
    exclude: Exclusions | None = None
    _state: dict = field(default_factory=dict, repr=False)

    def check(self) -> None:
        if self.metric not in METRICS:
            raise BadInputError(f"metric must be one of {', '.join(METRICS)}, got {self.metric!r}")
        if isinstance(self.depth, bool) or not isinstance(self.depth, (int, np.integer)) or self.depth < 1:
            raise BadInputError(f"depth must be a whole number of at least 1, got {self.depth!r}")
        queries = np.asarray(self.queries)
        if queries.ndim != 2 or queries.shape[1] < 1:
            raise BadInputError(f"expected a 2-D array of queries, got shape {queries.shape}")
        if self.metric == "ip" and queries.dtype not in (np.float32, np.float64):
            raise BadInputError(f"ip search needs float32 or float64 queries, got {queries.dtype}")
        if self.metric == "hamming" and queries.dtype != np.uint8:
            raise BadInputError(f"hamming search needs uint8 rows of packed bits, got {queries.dtype}")
        self.queries = np.ascontiguousarray(queries)
        if self.exclude is None:
            self.exclude = Exclusions.none(queries.shape[0])
        elif self.exclude.n_queries != queries.shape[0]:
            raise BadInputError(f"exclusions for {self.exclude.n_queries} queries, but {queries.shape[0]} are searched")


def _words(bits: np.ndarray, n_words: int) -> np.ndarray:
    """Packed bit rows (uint8) as zero-padded uint64 words, rows x words."""
    padded = np.zeros((bits.shape[0], n_words * 8), dtype=np.uint8)
    padded[:, : bits.shape[1]] = bits
    return padded.view(np.uint64)


def _parts(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering ``0..n`` (fewer when ``n`` is smaller), sizes within one."""
    parts = max(1, min(parts, n))
    cuts = [n * i // parts for i in range(parts + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(parts) if cuts[i + 1] > cuts[i]]


class SearchPass:
    """The state of one pass over the corpus: its jobs' top lists and the worker threads.

    `search` drives one; a caller sharing work between jobs (the tuning sweep) drives its own: `prepared`
    turns a block into what a job searches (in row slices, on the workers), `search_block` merges it into
    the job's top lists, `results` gives them, `close` ends the workers."""

    def __init__(self, jobs: list[SearchJob], threads: int):
        self.jobs = jobs
        self.threads = threads
        self.pool = ThreadPoolExecutor(
            max_workers=threads,
            thread_name_prefix="streamwhiten-search",
            initializer=lambda: limit_this_thread(blas_threads_per_worker(threads)),
        )
        for job in jobs:
            job.check()
            n_queries = job.queries.shape[0]
            state = job._state
            state["parts"] = _parts(n_queries, threads)
            state["rows"] = np.full((n_queries, job.depth), -1, dtype=np.int64)
            if job.metric == "ip":
                state["values"] = np.full((n_queries, job.depth), -np.inf, dtype=job.queries.dtype)
            else:
                state["n_words"] = -(-job.queries.shape[1] // 8)
                state["words"] = np.ascontiguousarray(_words(job.queries, state["n_words"]))
                state["values"] = np.full((n_queries, job.depth), _EMPTY_DISTANCE, dtype=np.int64)

    def map(self, function: Callable[..., Any], items: Sequence[tuple[Any, ...]]) -> list:
        """``function(*item)`` of every item, on the workers; the results in order."""
        if self.threads <= 1 or len(items) <= 1:
            return [function(*item) for item in items]
        return list(self.pool.map(lambda item: function(*item), items))

    def prepared(self, job: SearchJob, rows: np.ndarray, start: int) -> np.ndarray:
        """The block as the job searches it: prepared in row slices by the workers."""
        out = np.asarray(rows if job.prepare is None else self.sliced(job.prepare, rows, start))
        width = job.queries.shape[1]
        if out.ndim != 2 or out.shape[0] != rows.shape[0] or out.shape[1] != width:
            raise BadInputError(
                f"corpus rows {start}..{start + rows.shape[0] - 1}: expected {rows.shape[0]} rows of {width} "
                f"values to search, got shape {out.shape}"
            )
        if job.metric == "hamming":
            if out.dtype != np.uint8:
                raise BadInputError(f"hamming search needs uint8 rows of packed bits, got {out.dtype}")
            return np.ascontiguousarray(_words(out, job._state["n_words"]).T)
        return out.astype(job.queries.dtype, copy=False)

    def search_block(self, job: SearchJob, block: np.ndarray, start: int) -> None:
        state = job._state
        exclude = job.exclude
        assert exclude is not None  # a job without exclusions holds an empty set (SearchJob.__post_init__)
        if job.metric == "hamming":
            words = state["words"]

            def run(q0: int, q1: int) -> None:
                kernels.merge_top_hamming(
                    words, block, start, q0, q1, state["values"], state["rows"], exclude.start, exclude.rows
                )

        else:
            queries = job.queries
            itemsize = queries.dtype.itemsize

            def run(q0: int, q1: int) -> None:
                tile = max(256, SCORE_TILE_BYTES // max(1, (q1 - q0) * itemsize))
                scores = np.empty((q1 - q0, min(tile, block.shape[0])), dtype=queries.dtype)
                for t0 in range(0, block.shape[0], tile):
                    t1 = min(block.shape[0], t0 + tile)
                    out = scores[:, : t1 - t0]
                    np.matmul(queries[q0:q1], block[t0:t1].T, out=out)
                    kernels.merge_top_scores(
                        out, start + t0, q0, state["values"], state["rows"], exclude.start, exclude.rows
                    )

        self.map(run, state["parts"])

    def sliced(self, function: Callable[[np.ndarray, int], np.ndarray], rows: np.ndarray, start: int) -> np.ndarray:
        """``function(rows[a:b], start + a)`` of the row slices of a block, on the workers, joined."""
        pieces = self.map(lambda a, b: function(rows[a:b], start + a), _parts(rows.shape[0], self.threads))
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def results(self) -> list[SearchResult]:
        return [SearchResult(job._state["rows"], job._state["values"], job.metric) for job in self.jobs]

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def corpus_blocks(
    corpus: Any, block_rows: int | None = None, rows: Any = None, block_bytes: int = SEARCH_BLOCK_BYTES
) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, rows)`` of an in-memory array or a `Source`, block by block in row order. ``rows`` (sorted), if
    given, keeps the blocks holding one of them. Without ``block_rows``, blocks of about ``block_bytes`` of rows
    as stored (a source's: whole chunks).

    A source is read into two buffers in turn, the next block (in another thread) while the caller
    works on this one: a block handed out is valid until the caller asks for the next one.
    """
    source = isinstance(corpus, Source)
    n_rows = corpus.n_rows if source else int(np.shape(corpus)[0])
    if block_rows is None:
        if source:
            block_rows = corpus.default_block_rows(block_bytes)
        else:
            row_bytes = max(1, int(np.prod(np.shape(corpus)[1:])) * np.dtype(corpus.dtype).itemsize)
            block_rows = max(256, block_bytes // row_bytes)
    ranges = [(a, min(n_rows, a + block_rows)) for a in range(0, n_rows, block_rows)]
    if rows is not None:
        firsts = np.searchsorted(rows, [a for a, _ in ranges])
        lasts = np.searchsorted(rows, [b for _, b in ranges])
        ranges = [r for r, f, last in zip(ranges, firsts, lasts, strict=True) if last > f]
    if not source or not ranges:
        yield from ((a, corpus[a:b]) for a, b in ranges)
        return
    width = max(b - a for a, b in ranges)
    buffers = [np.empty((width, corpus.n_features), dtype=corpus.read_dtype) for _ in range(min(2, len(ranges)))]

    def read(i: int):
        return corpus.read_into(*ranges[i], buffers[i % len(buffers)])

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamwhiten-read") as reader:
        pending: Future[np.ndarray] | None = reader.submit(read, 0)
        for i, (a, _) in enumerate(ranges):
            assert pending is not None  # submitted for each range
            block = pending.result()
            pending = reader.submit(read, i + 1) if i + 1 < len(ranges) else None
            yield a, block


def corpus_slices(
    corpus: Any, block_rows: int | None = None, block_bytes: int | None = None, slice_bytes: int | None = None
) -> Iterator[tuple[int, np.ndarray]]:
    """`corpus_blocks` (of about ``block_bytes`` without ``block_rows``; default `SLICED_BLOCK_BYTES`) cut into
    slices of about ``slice_bytes`` (default `SLICE_BYTES`) of float64 rows, 16 at least: ``(start, rows)`` in
    order, so float64 work on a slice stays small however large a store's chunks. Valid until the next."""
    n_features = corpus.n_features if isinstance(corpus, Source) else int(np.prod(np.shape(corpus)[1:]))
    step = max(16, int(SLICE_BYTES if slice_bytes is None else slice_bytes) // (8 * max(1, int(n_features))))
    block_bytes = SLICED_BLOCK_BYTES if block_bytes is None else block_bytes
    for start, block in corpus_blocks(corpus, block_rows, block_bytes=block_bytes):
        for offset in range(0, block.shape[0], step):
            yield start + offset, block[offset : offset + step]


def search(
    corpus: Any,
    jobs: list[SearchJob],
    *,
    block_rows: int | None = None,
    threads: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[SearchResult]:
    """Run every job of ``jobs`` in one pass over ``corpus`` (an array of rows, or a `Source`), in order.

    ``threads`` worker threads (default: one per core, at most 4) share each block, BLAS limited so
    that together they use every core once. ``progress(rows_done, n_rows)`` is called after each block.
    """
    threads = resolve_threads(threads)
    n_rows = corpus.n_rows if isinstance(corpus, Source) else int(np.shape(corpus)[0])
    state = SearchPass(list(jobs), threads)
    try:
        with blas_threads(blas_threads_per_worker(threads)):
            for start, rows in corpus_blocks(corpus, block_rows):
                for job in state.jobs:
                    state.search_block(job, state.prepared(job, rows, start), start)
                if progress is not None:
                    progress(start + rows.shape[0], n_rows)
    finally:
        state.close()
    return state.results()


def exact_search(
    queries: np.ndarray,
    corpus: Any,
    depth: int,
    *,
    metric: str = "ip",
    exclude: Exclusions | None = None,
    block_rows: int | None = None,
    threads: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """The ``depth`` best corpus rows of each query, best first, ties to the lower row (one `SearchJob`
    through `search`, which also takes a ``prepare`` of the rows read and several jobs in one pass).

    Parameters
    ----------
    queries : ndarray
        Float rows (``metric="ip"``: inner products in their dtype, float32 or float64) or uint8 rows of
        packed bits (``"hamming"``).
    corpus : ndarray or Source
        Rows as searched.
    exclude : Exclusions, optional
        Pairs never returned.

    Returns
    -------
    SearchResult
    """
    job = SearchJob(queries, depth, metric, exclude=exclude)
    return search(corpus, [job], block_rows=block_rows, threads=threads, progress=progress)[0]


@dataclass
class RescoreJob:
    """One re-ranking in a pass over the blocks holding candidates: ``queries`` (float rows), ``candidates``
    (queries x N corpus rows, -1: none; e.g. a Hamming search's), the top ``depth`` kept by the inner product
    with the rows as ``prepare(rows, start)`` makes them (best first, ties to the lower row)."""

    queries: np.ndarray
    candidates: np.ndarray
    depth: int
    prepare: Callable[[np.ndarray, int], np.ndarray] | None = None

    def check(self) -> None:
        self.queries = np.ascontiguousarray(self.queries)
        self.candidates = np.asarray(self.candidates, dtype=np.int64)
        if self.queries.ndim != 2 or self.queries.dtype not in (np.float32, np.float64):
            raise BadInputError(
                f"rescoring needs 2-D float32 or float64 queries, got {self.queries.dtype} {self.queries.shape}"
            )
        if self.candidates.ndim != 2 or self.candidates.shape[0] != self.queries.shape[0]:
            raise BadInputError(f"expected one list of candidates per query, got shape {self.candidates.shape}")


class Reranking:
    """The state of one re-ranking (a `RescoreJob`) fed block by block: which rows of a block it
    needs (`wanted`), their vectors (`feed`), and the re-ranked lists (`result`)."""

    def __init__(self, queries: np.ndarray, candidates: np.ndarray, depth: int):
        job = RescoreJob(queries, candidates, depth)
        job.check()
        self.queries, self.candidates, self.depth = job.queries, job.candidates, int(depth)
        self.values = np.full(self.candidates.shape, -np.inf, dtype=self.queries.dtype)
        flat = self.candidates.reshape(-1)
        valid = np.flatnonzero(flat >= 0)
        self._by_row = valid[np.argsort(flat[valid], kind="stable")]
        self.rows = flat[self._by_row]  # the candidates' corpus rows, sorted
        self._pending: tuple[int, int, int, np.ndarray] | None = None

    def wanted(self, start: int, n_rows: int) -> np.ndarray:
        """The rows ``start .. start + n_rows - 1`` it needs, as offsets from ``start`` (sorted, unique)."""
        lo, hi = np.searchsorted(self.rows, [start, start + n_rows])
        wanted, index = np.unique(self.rows[lo:hi] - start, return_inverse=True)
        self._pending = (start, lo, hi, index)
        return wanted

    def feed(self, start: int, vectors: np.ndarray) -> None:
        """The vectors of the rows `wanted` just named (in its order), as the re-ranking sees them."""
        assert self._pending is not None, "feed() follows wanted()"  # as every caller does
        begun, lo, hi, index = self._pending
        if begun != start:
            raise BadInputError("rescoring: fed another block than the one its rows were asked for")
        self._pending = None
        if hi <= lo:
            return
        vectors = np.asarray(vectors)
        if vectors.ndim != 2 or vectors.shape != (int(index.max()) + 1, self.queries.shape[1]):
            raise BadInputError(
                f"rescoring expected {int(index.max()) + 1} rows of {self.queries.shape[1]} values, "
                f"got shape {vectors.shape}"
            )
        vectors = vectors.astype(self.queries.dtype, copy=False)
        slots = self._by_row[lo:hi]
        n_candidates = self.candidates.shape[1]
        flat_values = self.values.reshape(-1)
        for a in range(0, slots.size, _RESCORE_PAIRS):
            b = min(slots.size, a + _RESCORE_PAIRS)
            flat_values[slots[a:b]] = np.einsum(
                "ij,ij->i", self.queries[slots[a:b] // n_candidates], vectors[index[a:b]]
            )

    def result(self) -> SearchResult:
        """Each query's candidates by value (best first, ties to the lower row), the best ``depth``."""
        candidates, values, depth = self.candidates, self.values, self.depth
        rows_key = np.where(candidates >= 0, candidates, np.iinfo(np.int64).max)
        order = np.lexsort((rows_key, -values), axis=-1)[:, :depth]
        top_rows = np.take_along_axis(candidates, order, axis=1)
        top_values = np.take_along_axis(values, order, axis=1)
        if top_rows.shape[1] < depth:
            pad = depth - top_rows.shape[1]
            top_rows = np.pad(top_rows, ((0, 0), (0, pad)), constant_values=-1)
            top_values = np.pad(top_values, ((0, 0), (0, pad)), constant_values=-np.inf)
        return SearchResult(top_rows, top_values, "ip")


def rescore_all(corpus: Any, jobs: list[RescoreJob], *, block_rows: int | None = None) -> list[SearchResult]:
    """Every re-ranking of ``jobs`` in one pass over the blocks that hold a candidate (each read once), in order."""
    states = [Reranking(job.queries, job.candidates, job.depth) for job in jobs]
    wanted_rows = np.unique(np.concatenate([state.rows for state in states])) if states else np.zeros(0, np.int64)
    for start, rows in corpus_blocks(corpus, block_rows, wanted_rows):
        for job, state in zip(jobs, states, strict=True):
            picked = np.ascontiguousarray(rows[state.wanted(start, rows.shape[0])])  # none: fed to close the block
            state.feed(start, picked if job.prepare is None or not picked.size else job.prepare(picked, start))
    return [state.result() for state in states]


__all__ = [
    "METRICS",
    "SLICED_BLOCK_BYTES",
    "SLICE_BYTES",
    "Exclusions",
    "RescoreJob",
    "Reranking",
    "SearchJob",
    "SearchPass",
    "SearchResult",
    "corpus_blocks",
    "corpus_slices",
    "exact_search",
    "rescore_all",
    "search",
]
