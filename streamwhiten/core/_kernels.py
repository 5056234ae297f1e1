"""Numba-jitted hot loops. The only module that imports numba.

Every kernel is single-threaded and ``nogil``: parallelism comes from worker threads each working on
its own block (see ``engine._threads``), not from threads inside a kernel, which would compete with BLAS for
the cores. ``cache=True`` so the compile cost (a few seconds) is paid once per machine, not per run.
"""

from collections.abc import Callable
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
from numba import extending, types

#: Row groups of the centring pass, each summed on its own before the groups are added in order: a
#: fixed partition, so the float64 sums (and every result) never depend on how the work is scheduled.
ROW_GROUPS = 16


@numba.njit(nogil=True, cache=True)
def center_and_sum(block: np.ndarray, shift: npt.NDArray[np.float64], out: np.ndarray) -> npt.NDArray[np.float64]:
    """``out[:n] = block - shift`` (cast to ``out``'s dtype) in one pass, and the float64 column sums
    of the values written.

    The sums are of the rounded values actually stored in ``out``, so ``sum (c - cbar)(c - cbar)^T =
    C^T C - n cbar cbar^T`` holds exactly for the centred rows ``c``; with ``shift`` near the mean,
    ``cbar`` is small and the correction cancels nothing. ``out`` may be ``block`` itself.

    The loop has no branch, so it vectorises: a NaN or Inf anywhere makes its column sum non-finite
    (finite float16/32 values cannot overflow a float64 sum), which the caller checks once. Each row is
    centred into a small private buffer first: with ``out`` the same array as ``block`` the compiler
    could not vectorise a loop that reads and writes it (3x slower), and the extra copy costs little.
    """
    n_rows, n_cols = block.shape
    partial = np.zeros((ROW_GROUPS, n_cols), dtype=np.float64)
    row = np.empty(n_cols, dtype=out.dtype)
    per_group = (n_rows + ROW_GROUPS - 1) // ROW_GROUPS
    for group in range(ROW_GROUPS):
        lo = group * per_group
        hi = min(n_rows, lo + per_group)
        sums = partial[group]
        for i in range(lo, hi):
            source = block[i]
            for j in range(n_cols):
                row[j] = out.dtype.type(np.float64(source[j]) - shift[j])
            target = out[i]
            for j in range(n_cols):
                target[j] = row[j]
                sums[j] += np.float64(row[j])
    total = np.zeros(n_cols, dtype=np.float64)
    for group in range(ROW_GROUPS):
        total += partial[group]
    return total


@numba.njit(nogil=True, cache=True)
def finite_row_mask(block: np.ndarray) -> npt.NDArray[np.bool_]:
    """True for each row whose every value is finite."""
    n_rows, n_cols = block.shape
    mask = np.ones(n_rows, dtype=np.bool_)
    for i in range(n_rows):
        for j in range(n_cols):
            if not np.isfinite(np.float64(block[i, j])):
                mask[i] = False
                break
    return mask


@numba.njit(nogil=True, cache=True)
def merged_scatter(
    scatter_a: npt.NDArray[np.float64],
    scatter_b: npt.NDArray[np.float64],
    delta: npt.NDArray[np.float64],
    weight: float,
) -> npt.NDArray[np.float64]:
    """``scatter_a + scatter_b + weight * outer(delta, delta)`` in one pass (Chan et al. merge)."""
    n_cols = delta.shape[0]
    out = np.empty((n_cols, n_cols), dtype=np.float64)
    for i in range(n_cols):
        scaled = weight * delta[i]
        for j in range(n_cols):
            out[i, j] = scatter_a[i, j] + scatter_b[i, j] + scaled * delta[j]
    return out


@numba.njit(nogil=True, cache=True)
def lzf_decompress(data: npt.NDArray[np.uint8], out: npt.NDArray[np.uint8]) -> int:
    """Inflate the raw LZF stream ``data`` (uint8, as h5py's LZF filter stores a chunk) into ``out``
    (uint8); returns the bytes written, or -1 where the stream is damaged: a literal run or back
    reference past the end of either buffer, or a reference before the start of the output.

    The format (liblzf): a control byte below 32 starts a run of ``ctrl + 1`` literal bytes; any other
    is a back reference of ``(ctrl >> 5) + 2`` bytes (plus a length byte when that field is 7) to
    ``1 + ((ctrl & 31) << 8) + next byte`` bytes before the output position, copied byte by byte since
    source and destination may overlap.
    """
    n_in, n_out = data.size, out.size
    ip = 0
    op = 0
    while ip < n_in:
        ctrl = np.int64(data[ip])
        ip += 1
        if ctrl < 32:
            run = ctrl + 1
            if ip + run > n_in or op + run > n_out:
                return -1
            for i in range(run):
                out[op + i] = data[ip + i]
            ip += run
            op += run
        else:
            length = ctrl >> 5
            if length == 7:
                if ip >= n_in:
                    return -1
                length += np.int64(data[ip])
                ip += 1
            if ip >= n_in:
                return -1
            ref = op - ((ctrl & 31) << 8) - 1 - np.int64(data[ip])
            ip += 1
            length += 2
            if ref < 0 or op + length > n_out:
                return -1
            for i in range(length):
                out[op + i] = out[ref + i]
            op += length
    return op


# ------------------------------------------------------------------------------------------ exact search
#
# A top list holds a query's best candidates so far, best first: by score descending (inner products) or
# by distance ascending (Hamming), equal values by row ascending, so ties go to the lower corpus row
# whatever the order the rows arrive in. An empty slot holds row -1 and the worst value (-inf, or the
# largest int64). Every comparison takes the row into account, so the lists are the same however the
# corpus is cut into blocks and tiles.


@numba.njit(nogil=True, cache=True, inline="always")
def _place_score(scores: np.ndarray, rows: npt.NDArray[np.int64], value: float, row: int) -> None:
    """Insert ``(value, row)`` into the full top list ``scores``/``rows`` (best first), dropping the last."""
    j = scores.shape[0] - 1
    while j > 0:
        above, above_row = scores[j - 1], rows[j - 1]
        if above > value or (above == value and above_row < row):
            break
        scores[j] = above
        rows[j] = above_row
        j -= 1
    scores[j] = value
    rows[j] = row


@numba.njit(nogil=True, cache=True, inline="always")
def _place_distance(distances: npt.NDArray[np.int64], rows: npt.NDArray[np.int64], value: int, row: int) -> None:
    """Insert ``(value, row)`` into the full top list ``distances``/``rows`` (smallest first)."""
    j = distances.shape[0] - 1
    while j > 0:
        above, above_row = distances[j - 1], rows[j - 1]
        if above < value or (above == value and above_row < row):
            break
        distances[j] = above
        rows[j] = above_row
        j -= 1
    distances[j] = value
    rows[j] = row


#: Candidates checked against a query's threshold at once: one vectorised comparison decides whether
#: any of them can enter its top list (almost never, once the list has filled).
_SCAN = 16


@numba.njit(nogil=True, cache=True)
def merge_top_scores(
    scores: np.ndarray,
    first_row: int,
    first_query: int,
    top_scores: np.ndarray,
    top_rows: npt.NDArray[np.int64],
    exclude_start: npt.NDArray[np.int64],
    exclude_rows: npt.NDArray[np.int64],
) -> None:
    """Merge a tile of inner products into running top lists (larger is better).

    ``scores[i, j]`` is the score of query ``first_query + i`` against corpus row ``first_row + j``;
    ``top_scores``/``top_rows`` (queries x depth, of all queries) hold each query's best so far, best
    first, ties to the lower row. The corpus rows ``exclude_rows[exclude_start[q]:exclude_start[q + 1]]``
    (sorted) are never candidates of query ``q``; the tile's entries for them are set to -inf here. A
    -inf or NaN score never enters a list.
    """
    n_queries, n_rows = scores.shape
    depth = top_scores.shape[1]
    last_row = first_row + n_rows
    for i in range(n_queries):
        query = first_query + i
        line = scores[i]
        for e in range(exclude_start[query], exclude_start[query + 1]):
            row = exclude_rows[e]
            if first_row <= row < last_row:
                line[row - first_row] = -np.inf
        best = top_scores[query]
        rows = top_rows[query]
        threshold = best[depth - 1]
        for j0 in range(0, n_rows, _SCAN):
            j1 = min(n_rows, j0 + _SCAN)
            hit = False
            for j in range(j0, j1):
                hit |= line[j] >= threshold
            if not hit:
                continue
            for j in range(j0, j1):
                value = line[j]
                row = first_row + j
                if value > threshold or (value == threshold and value > -np.inf and row < rows[depth - 1]):
                    _place_score(best, rows, value, row)
                    threshold = best[depth - 1]


@extending.intrinsic
def _popcount(typingctx: Any, word: Any) -> tuple[Any, Callable[..., Any]]:
    """The number of set bits of a uint64, as LLVM's ``ctpop`` (one ``popcnt``, or ``vpopcntq`` on a
    vector of words, where the CPU has them)."""
    signature = types.uint64(types.uint64)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.ctpop(args[0])

    return signature, codegen


#: Bytes of corpus words a Hamming tile spans: with the query's words and the distances, it stays in L1.
_HAMMING_TILE_BYTES = 32768


@numba.njit(nogil=True, cache=True)
def merge_top_hamming(
    query_words: npt.NDArray[np.uint64],
    corpus_words: npt.NDArray[np.uint64],
    first_row: int,
    first_query: int,
    stop_query: int,
    top_distances: npt.NDArray[np.int64],
    top_rows: npt.NDArray[np.int64],
    exclude_start: npt.NDArray[np.int64],
    exclude_rows: npt.NDArray[np.int64],
) -> None:
    """Hamming distances of queries ``first_query..stop_query - 1`` to a block of corpus rows, merged
    into their running top lists (smaller is better, ties to the lower row).

    ``query_words`` (all queries x words) and ``corpus_words`` (words x rows of the block: transposed, so
    that one word of many rows is XORed and counted in one vector instruction) are bit vectors as
    uint64 words, zero-padded alike. ``top_distances``/``top_rows`` are as in :func:`merge_top_scores`
    (an empty slot: the largest int64 and row -1), and so are the excluded rows. The block is worked
    through in tiles that stay in the L1 cache while every query passes over them.
    """
    n_words, n_rows = corpus_words.shape
    depth = top_distances.shape[1]
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
            for e in range(exclude_start[query], exclude_start[query + 1]):
                row = exclude_rows[e]
                if tile_first <= row < tile_first + width:
                    distance[row - tile_first] = empty
            best = top_distances[query]
            rows = top_rows[query]
            threshold = best[depth - 1]
            for j0 in range(0, width, _SCAN):
                j1 = min(width, j0 + _SCAN)
                hit = False
                for j in range(j0, j1):
                    hit |= distance[j] <= threshold
                if not hit:
                    continue
                for j in range(j0, j1):
                    value = distance[j]
                    row = tile_first + j
                    if value < threshold or (value == threshold and value < empty and row < rows[depth - 1]):
                        _place_distance(best, rows, value, row)
                        threshold = best[depth - 1]


# ------------------------------------------------------------------------------------------ code scans


@numba.njit(nogil=True, cache=True)
def pack_levels(
    z: npt.NDArray[np.float32],
    step: npt.NDArray[np.float64],
    offsets: npt.NDArray[np.int64],
    bits: npt.NDArray[np.int64],
    out: npt.NDArray[np.uint8],
) -> None:
    """OR into the zeroed rows ``out`` the level index ``clip(floor(z / step + 2^(b-1)), 0, 2^b - 1)``
    of each component ``j`` (``b = bits[j]``, at most 8), least significant bit first from stream bit
    ``offsets[j]``; stream bit ``t`` is bit ``t % 8`` of byte ``t // 8``. ``z`` must be finite."""
    n_rows, n_components = z.shape
    for i in range(n_rows):
        row = out[i]
        for j in range(n_components):
            width = bits[j]
            half = np.float64(1 << (width - 1))
            value = np.floor(np.float64(z[i, j]) / step[j] + half)
            top = np.float64((1 << width) - 1)
            if value < 0.0:
                value = 0.0
            elif value > top:
                value = top
            word = np.int64(value) << (offsets[j] & 7)
            byte = offsets[j] >> 3
            row[byte] |= np.uint8(word & 255)
            if word > 255:
                row[byte + 1] |= np.uint8(word >> 8)


@numba.njit(nogil=True, cache=True)
def lookup_scores(
    tables: npt.NDArray[np.float32],
    codes: npt.NDArray[np.uint8],
    scales: npt.NDArray[np.float32],
    bases: npt.NDArray[np.float32],
    offsets: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32],
) -> None:
    """``out[i, r] = bases[i] + scales[r] * (offsets[i] + sum_p tables[i, p, codes[r, p]])`` for the
    queries ``i`` of ``tables`` (queries x code bytes x 256) and the code rows ``r`` (only their first
    ``tables.shape[1]`` bytes are read): the asymmetric estimate of a code whose value is linear in
    its bits, one table look-up per code byte (as faiss scans 8-bit PQ codes)."""
    n_queries, n_bytes, _ = tables.shape
    n_rows = codes.shape[0]
    for i in range(n_queries):
        table = tables[i]
        base = bases[i]
        offset = offsets[i]
        line = out[i]
        for r in range(n_rows):
            row = codes[r]
            total = np.float32(0.0)
            for p in range(n_bytes):
                total += table[p, row[p]]
            line[r] = base + scales[r] * (offset + total)
