"""The tool's own vector codes: quantise-and-pack, the table look-up scan, the decoded lengths."""

import numba
import numpy as np

from . import F32, F64, I64, U8


@numba.njit(nogil=True, cache=True)
def _layout(step: F64, bits: I64) -> tuple[np.ndarray, ...]:
    """`encode_levels`' tables per component: ``2^(b-1)``, the top level ``2^b - 1``, ``1 / step``, its
    first stream bit (and the total after the last), its bit offset inside its group of 8."""
    n_components = bits.shape[0]
    half = np.empty(n_components, dtype=np.float64)
    top = np.empty(n_components, dtype=np.float64)
    inverse = np.empty(n_components, dtype=np.float64)
    start = np.zeros(n_components + 1, dtype=np.int64)
    for j in range(n_components):
        half[j] = np.float64(1 << (bits[j] - 1))
        top[j] = np.float64((1 << bits[j]) - 1)
        inverse[j] = 1.0 / step[j]
        start[j + 1] = start[j] + bits[j]
    within_group = np.empty(n_components, dtype=np.uint64)
    for j in range(n_components):
        within_group[j] = np.uint64(start[j] - start[j - j % 8])
    return half, top, inverse, start, within_group


@numba.njit(nogil=True, cache=True)
def encode_levels(z: F32, shift: F32, step: F64, bits: I64, out: U8) -> int:
    """Centre ``z`` in place (``z -= shift``) and write into each row of ``out`` the level index
    ``clip(floor(z / step + 2^(b-1)), 0, 2^b - 1)`` of each component (``b = bits[j]``, 1 to 8), least
    significant bit first; stream bit ``t`` is bit ``t % 8`` of byte ``t // 8``. Returns the first row
    holding NaN or Inf after centring (rows before it written), or -1.

    It multiplies by ``1 / step``; a row with a value within ``1e-12 (|t| + 256)`` of an integer, where
    the floors could differ, is quantised again by the division, so the bytes are the division's.
    """
    n_rows, n_components = z.shape
    half, top, inverse, start, within_group = _layout(step, bits)
    code_bytes = (start[n_components] + 7) // 8
    words = np.empty((start[n_components] + 63) // 64 + 1, dtype=np.uint64)
    stream = words.view(np.uint8)
    level = np.empty(n_components, dtype=np.int32)
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
            words[(start[g] >> 6) + 1] |= (group >> np.uint64(1)) >> (np.uint64(63) - offset)  # 0 when offset is 0
        target = out[i]
        for p in range(code_bytes):
            target[p] = stream[p]
    return -1


#: Code bytes whose tables a pass of `lookup_scores` holds: two queries' tables of 16 bytes
#: (2 x 16 x 256 float32) stay in the L1 cache however long the codes are.
_LOOKUP_BYTES = 16


@numba.njit(nogil=True, cache=True)
def lookup_scores(tables: F32, codes: U8, scales: F32, row_scales: F32, bases: F32, offsets: F32, out: F32) -> None:
    """``out[i, r] = (bases[i] + scales[r] * (offsets[i] + sum_p tables[i, p, codes[r, p]])) *
    row_scales[r]``: one table look-up per code byte (as faiss scans 8-bit PQ codes).

    Two queries and four rows at a time (eight independent sums), over passes of `_LOOKUP_BYTES`
    whose tables stay in L1; each sum still adds its bytes in order, as the plain loop does.
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
def decoded_norms(codes: U8, bits: I64, step: F64, mean_along: F64, mean_norm2: float, scales: F32, out: F64) -> None:
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
