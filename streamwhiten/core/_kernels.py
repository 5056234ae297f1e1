"""Numba-jitted hot loops. The only module that imports numba.

Every kernel is single-threaded and ``nogil``: parallelism comes from worker threads each working on
its own block (see ``engine._threads``), not from threads inside a kernel, which would compete with BLAS for
the cores. ``cache=True`` so the compile cost (a few seconds) is paid once per machine, not per run.
"""

import numba
import numpy as np

_JIT = dict(nogil=True, cache=True)
#: Row groups of the centring pass, each summed on its own before the groups are added in order: a
#: fixed partition, so the float64 sums (and every result) never depend on how the work is scheduled.
ROW_GROUPS = 16


@numba.njit(**_JIT)
def center_and_sum(block, shift, out):
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


@numba.njit(**_JIT)
def finite_row_mask(block):
    """True for each row whose every value is finite."""
    n_rows, n_cols = block.shape
    mask = np.ones(n_rows, dtype=np.bool_)
    for i in range(n_rows):
        for j in range(n_cols):
            if not np.isfinite(np.float64(block[i, j])):
                mask[i] = False
                break
    return mask


@numba.njit(**_JIT)
def merged_scatter(scatter_a, scatter_b, delta, weight):
    """``scatter_a + scatter_b + weight * outer(delta, delta)`` in one pass (Chan et al. merge)."""
    n_cols = delta.shape[0]
    out = np.empty((n_cols, n_cols), dtype=np.float64)
    for i in range(n_cols):
        scaled = weight * delta[i]
        for j in range(n_cols):
            out[i, j] = scatter_a[i, j] + scatter_b[i, j] + scaled * delta[j]
    return out


@numba.njit(**_JIT)
def lzf_decompress(data, out):
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
