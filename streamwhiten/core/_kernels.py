"""Numba-jitted hot loops. The only module that imports numba.

Every kernel is single-threaded and ``nogil``: parallelism comes from worker threads each working on
its own block (see ``engine._threads``), not from threads inside a kernel, which would compete with BLAS for
the cores. ``cache=True`` so the compile cost (a few seconds) is paid once per machine, not per run.
"""

import math
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
def round_and_screen(
    near: npt.NDArray[np.float64],
    row_norms: npt.NDArray[np.float64],
    bound: npt.NDArray[np.float64],
    out: npt.NDArray[np.float32],
    undecided: npt.NDArray[np.bool_],
) -> int:
    """``core.product``'s screen in one pass: ``out = near`` rounded to float32, and ``undecided`` set
    (the count returned) where ``|near - out| + row_norms[i] bound[j]`` reaches half the gap to the nearer
    float32 neighbour (``product.half_spacing``'s formula), so that the exact sum could round otherwise."""
    n_rows, n_cols = near.shape
    bits = out.view(np.uint32)
    # half the float32 gap at each biased exponent e: 2^(max(e, 1) - 151); a power of two's is halved again
    halves = np.empty(256, dtype=np.float64)
    for exponent in range(256):
        halves[exponent] = math.ldexp(1.0, max(exponent, 1) - 151)
    count = 0
    for i in range(n_rows):
        norm = row_norms[i]
        for j in range(n_cols):
            value = near[i, j]
            rounded = np.float32(value)
            out[i, j] = rounded
            word = bits[i, j]
            half = halves[(word >> 23) & 0xFF]
            if (word & 0x7FFFFF) == 0:
                half *= 0.5
            # Inf and NaN are never undecided (NaN compares false; Inf's gap is taken as infinite)
            flag = abs(value - np.float64(rounded)) + norm * bound[j] >= half and (word >> 23) & 0xFF != 0xFF
            undecided[i, j] = flag
            count += flag
    return count


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
    uint64 words, zero-padded alike. ``top_distances``/``top_rows`` are as in `merge_top_scores`
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
def encode_levels(
    z: npt.NDArray[np.float32],
    shift: npt.NDArray[np.float32],
    step: npt.NDArray[np.float64],
    bits: npt.NDArray[np.int64],
    out: npt.NDArray[np.uint8],
) -> int:
    """Centre the components ``z`` in place (``z -= shift``, float32) and write into the first
    ``ceil(sum(bits) / 8)`` bytes of each row of ``out`` the level index ``clip(floor(z / step +
    2^(b-1)), 0, 2^b - 1)`` of each component ``j`` (``b = bits[j]``, 1 to 8), least significant bit
    first, components one after another; stream bit ``t`` is bit ``t % 8`` of byte ``t // 8``.
    Returns the first row holding a NaN or Inf after centring (rows before it are written), or -1.

    Per row, one branch-free pass quantises (so it vectorises), then groups of 8 components (at
    most 64 bits) are shifted together into a word and the word into the row's bit stream. The pass
    multiplies by ``1 / step`` rather than dividing: the product is within a few units in the last
    place of the quotient, so the two floors differ only when ``z / step + 2^(b-1)`` lies within
    ``1e-12 (|t| + 256)`` of an integer; such a row (a rare one) is quantised again by the division,
    so the bytes are those of the division everywhere. Little-endian: the stream's 64-bit words are
    written out as bytes through a view.
    """
    n_rows, n_components = z.shape
    half = np.empty(n_components, dtype=np.float64)
    top = np.empty(n_components, dtype=np.float64)
    inverse = np.empty(n_components, dtype=np.float64)
    start = np.zeros(n_components + 1, dtype=np.int64)  # first stream bit of each component
    for j in range(n_components):
        half[j] = np.float64(1 << (bits[j] - 1))
        top[j] = np.float64((1 << bits[j]) - 1)
        inverse[j] = 1.0 / step[j]
        start[j + 1] = start[j] + bits[j]
    code_bytes = (start[n_components] + 7) // 8
    words = np.empty((start[n_components] + 63) // 64 + 1, dtype=np.uint64)
    stream = words.view(np.uint8)
    within_group = np.empty(n_components, dtype=np.uint64)  # bit offset inside its group of 8
    for j in range(n_components):
        within_group[j] = np.uint64(start[j] - start[j - j % 8])
    level = np.empty(n_components, dtype=np.int32)
    one = np.uint64(1)
    for i in range(n_rows):
        row = z[i]
        bad = 0
        near = 0
        for j in range(n_components):
            value = row[j] - shift[j]
            row[j] = value
            bad |= np.int32(value - value != 0)  # NaN for NaN and +-Inf
            t = np.float64(value) * inverse[j] + half[j]
            index = np.floor(t)
            margin = 1e-12 * (np.abs(t) + 256.0)
            near |= np.int32(not (t - index > margin and t - index < 1.0 - margin))
            level[j] = np.int32(min(max(index, 0.0), top[j]))
        if bad:
            return i
        if near:
            for j in range(n_components):
                index = np.floor(np.float64(row[j]) / step[j] + half[j])
                level[j] = np.int32(min(max(index, 0.0), top[j]))
        words[:] = 0
        for g in range(0, n_components, 8):
            group = np.uint64(0)
            for j in range(g, min(g + 8, n_components)):
                group |= np.uint64(level[j]) << within_group[j]
            offset = np.uint64(start[g] & 63)
            words[start[g] >> 6] |= group << offset
            words[(start[g] >> 6) + 1] |= (group >> one) >> (np.uint64(63) - offset)  # 0 when offset is 0
        target = out[i]
        for p in range(code_bytes):
            target[p] = stream[p]
    return -1


#: Code bytes whose tables a pass of `lookup_scores` holds: two queries' tables of 16 bytes
#: (2 x 16 x 256 float32) stay in the L1 cache however long the codes are.
_LOOKUP_BYTES = 16


@numba.njit(nogil=True, cache=True)
def lookup_scores(
    tables: npt.NDArray[np.float32],
    codes: npt.NDArray[np.uint8],
    scales: npt.NDArray[np.float32],
    row_scales: npt.NDArray[np.float32],
    bases: npt.NDArray[np.float32],
    offsets: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32],
) -> None:
    """``out[i, r] = (bases[i] + scales[r] * (offsets[i] + sum_p tables[i, p, codes[r, p]])) *
    row_scales[r]`` for the queries ``i`` of ``tables`` (queries x code bytes x 256) and the code rows
    ``r`` (only their first ``tables.shape[1]`` bytes are read): the asymmetric estimate of a code whose
    value is linear in its bits, one table look-up per code byte (as faiss scans 8-bit PQ codes);
    ``row_scales`` are 1 but for a code of unit vectors (``1 / ||xhat||``).

    Two queries and four rows at a time, eight sums in registers (one chain of dependent additions
    would wait on each), over the code bytes in passes of `_LOOKUP_BYTES` whose tables stay in
    L1, the running sums kept in ``out`` between passes. Each sum still adds its bytes in order, so
    the result is that of the plain loop.
    """
    n_queries, n_bytes, _ = tables.shape
    n_rows = codes.shape[0]
    body = n_rows - n_rows % 4
    for p0 in range(0, n_bytes, _LOOKUP_BYTES):
        p1 = min(n_bytes, p0 + _LOOKUP_BYTES)
        first = p0 == 0
        for i in range(0, n_queries, 2):
            other = min(i + 1, n_queries - 1)  # an odd last query is summed twice, into its own line
            table_a, table_b = tables[i], tables[other]
            line_a, line_b = out[i], out[other]
            for r in range(0, body, 4):
                if first:
                    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = np.float32(0.0)
                else:
                    a0, a1, a2, a3 = line_a[r], line_a[r + 1], line_a[r + 2], line_a[r + 3]
                    b0, b1, b2, b3 = line_b[r], line_b[r + 1], line_b[r + 2], line_b[r + 3]
                for p in range(p0, p1):
                    c0, c1, c2, c3 = codes[r, p], codes[r + 1, p], codes[r + 2, p], codes[r + 3, p]
                    a0 += table_a[p, c0]
                    a1 += table_a[p, c1]
                    a2 += table_a[p, c2]
                    a3 += table_a[p, c3]
                    b0 += table_b[p, c0]
                    b1 += table_b[p, c1]
                    b2 += table_b[p, c2]
                    b3 += table_b[p, c3]
                line_b[r], line_b[r + 1], line_b[r + 2], line_b[r + 3] = b0, b1, b2, b3
                line_a[r], line_a[r + 1], line_a[r + 2], line_a[r + 3] = a0, a1, a2, a3
            for r in range(body, n_rows):
                for query in range(i, other + 1):  # once each, an odd last query too
                    total = np.float32(0.0) if first else out[query, r]
                    for p in range(p0, p1):
                        total += tables[query, p, codes[r, p]]
                    out[query, r] = total
    for i in range(n_queries):
        line = out[i]
        for r in range(n_rows):
            line[r] = (bases[i] + scales[r] * (offsets[i] + line[r])) * row_scales[r]


@numba.njit(nogil=True, cache=True)
def decoded_norms(
    codes: npt.NDArray[np.uint8],
    bits: npt.NDArray[np.int64],
    step: npt.NDArray[np.float64],
    mean_along: npt.NDArray[np.float64],
    mean_norm2: float,
    scales: npt.NDArray[np.float32],
    out: npt.NDArray[np.float64],
) -> None:
    """``out[r]``: the length of the vector code row ``r`` stands for, ``||mean + f B l||`` with ``l`` its
    levels (component ``j``: ``(c + 1/2 - 2^(b-1)) * step[j]``, ``c`` its ``bits[j]`` bits, least
    significant first, components one after another), ``f = scales[r]``, ``mean_along = mean @ B`` and
    ``mean_norm2 = ||mean||^2``: ``||mean||^2 + 2 f <mean B, l> + f^2 ||l||^2`` (``B``'s columns orthonormal).
    One pass over each row's bytes, the reverse of `encode_levels`' packing."""
    n_rows = codes.shape[0]
    n_components = bits.shape[0]
    for r in range(n_rows):
        row = codes[r]
        word = np.uint64(0)
        filled = 0
        p = 0
        squares = 0.0
        along = 0.0
        for j in range(n_components):
            width = bits[j]
            while filled < width:
                word |= np.uint64(row[p]) << np.uint64(filled)
                filled += 8
                p += 1
            code = word & np.uint64((1 << width) - 1)
            word >>= np.uint64(width)
            filled -= width
            level = (np.float64(code) + 0.5 - np.float64(1 << (width - 1))) * step[j]
            squares += level * level
            along += level * mean_along[j]
        f = np.float64(scales[r])
        out[r] = np.sqrt(max(mean_norm2 + 2.0 * f * along + f * f * squares, 0.0))
