"""Exact search: tiles of inner products, or Hamming distances, merged into running top lists.

A top list holds a query's best so far, best first, ties to the lower corpus row (an empty slot: row -1
and the worst value), so the lists are the same however the corpus is cut into blocks and tiles.
"""

from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import extending, types

from . import I64, U64


@numba.njit(nogil=True, cache=True, inline="always")
def _place(values: np.ndarray, rows: I64, value: Any, row: int, smallest_first: bool) -> None:
    """Insert ``(value, row)`` into a full top list (best first), dropping the last."""
    j = values.shape[0] - 1
    while j > 0:
        above, above_row = values[j - 1], rows[j - 1]
        if (above < value if smallest_first else above > value) or (above == value and above_row < row):
            break
        values[j] = above
        rows[j] = above_row
        j -= 1
    values[j] = value
    rows[j] = row


#: Candidates checked against a query's threshold at once: one vectorised comparison decides whether
#: any of them can enter its top list (almost never, once the list has filled).
_SCAN = 16


@numba.njit(nogil=True, cache=True, inline="always")
def _merge_line(
    line: np.ndarray, first_row: int, best: np.ndarray, rows: I64, excluded: I64, empty: Any, smallest_first: bool
) -> None:
    """Merge the values ``line`` of corpus rows ``first_row, ...`` into one query's top list ``best``/``rows``
    (see `_place`), its ``excluded`` corpus rows first set to the worst value ``empty``, which never enters."""
    n_rows = line.shape[0]
    for row in excluded:
        if first_row <= row < first_row + n_rows:
            line[row - first_row] = empty
    depth = best.shape[0]
    threshold = best[depth - 1]
    for j0 in range(0, n_rows, _SCAN):
        j1 = min(n_rows, j0 + _SCAN)
        hit = False
        for j in range(j0, j1):
            hit |= line[j] <= threshold if smallest_first else line[j] >= threshold
        if not hit:
            continue
        for j in range(j0, j1):
            value = line[j]
            row = first_row + j
            better = value < threshold if smallest_first else value > threshold
            if better or (value == threshold and value != empty and row < rows[depth - 1]):
                _place(best, rows, value, row, smallest_first)
                threshold = best[depth - 1]


@numba.njit(nogil=True, cache=True)
def merge_top_scores(
    scores: np.ndarray,
    first_row: int,
    first_query: int,
    top_scores: np.ndarray,
    top_rows: I64,
    exclude_start: I64,
    exclude_rows: I64,
) -> None:
    """Merge a tile of inner products (``scores[i, j]``: query ``first_query + i``, corpus row
    ``first_row + j``) into the running top lists of all queries (larger is better). The rows
    ``exclude_rows[exclude_start[q]:exclude_start[q + 1]]`` are set to -inf; -inf or NaN never enters.
    """
    for i in range(scores.shape[0]):
        query = first_query + i
        excluded = exclude_rows[exclude_start[query] : exclude_start[query + 1]]
        _merge_line(scores[i], first_row, top_scores[query], top_rows[query], excluded, -np.inf, False)


@extending.intrinsic
def _popcount(typingctx: Any, word: Any) -> tuple[Any, Callable[..., Any]]:
    """The set bits of a uint64, as LLVM's ``ctpop`` (``popcnt``, or ``vpopcntq`` on vectors)."""
    signature = types.uint64(types.uint64)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.ctpop(args[0])

    return signature, codegen


#: Bytes of corpus words a Hamming tile spans: with the query's words and the distances, it stays in L1.
_HAMMING_TILE_BYTES = 32768


@numba.njit(nogil=True, cache=True)
def merge_top_hamming(
    query_words: U64,
    corpus_words: U64,
    first_row: int,
    first_query: int,
    stop_query: int,
    top_distances: I64,
    top_rows: I64,
    exclude_start: I64,
    exclude_rows: I64,
) -> None:
    """Hamming distances of queries ``first_query..stop_query - 1`` to a block of corpus rows (``corpus_words``
    transposed: words x rows, for vector XOR), merged into top lists as in `merge_top_scores`, in L1 tiles."""
    n_words, n_rows = corpus_words.shape
    empty = np.iinfo(np.int64).max
    tile = max(_SCAN, (_HAMMING_TILE_BYTES // (8 * n_words)) // _SCAN * _SCAN)
    distance = np.empty(tile, dtype=np.int64)
    for t0 in range(0, n_rows, tile):
        t1 = min(n_rows, t0 + tile)
        width = t1 - t0
        tile_first = first_row + t0
        for query in range(first_query, stop_query):
            distance[:width] = 0
            for w in range(n_words):
                word = query_words[query, w]
                column = corpus_words[w, t0:t1]
                for j in range(width):
                    # numba's stubs type an intrinsic's call with its typing context, which numba supplies
                    distance[j] += np.int64(_popcount(word ^ column[j]))  # type: ignore[call-arg]
            excluded = exclude_rows[exclude_start[query] : exclude_start[query + 1]]
            _merge_line(distance[:width], tile_first, top_distances[query], top_rows[query], excluded, empty, True)
