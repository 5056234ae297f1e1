"""Numba-jitted hot loops. The only module that imports numba.

Every kernel is ``nogil`` so the prefetching reader thread runs while a chunk is being centred, and
``cache=True`` so the compile cost (a few seconds) is paid once per machine, not once per run.
"""

import numba
import numpy as np

_JIT = dict(nogil=True, cache=True)


@numba.njit(**_JIT)
def column_sums(block):
    """Column sums of ``block`` in float64 and the index of its first non-finite row (-1 if none).

    Sums are accumulated per row group and then added, which keeps the rounding error of the
    mean small for long chunks whose mean is far from zero.
    """
    n_rows, n_cols = block.shape
    total = np.zeros(n_cols, dtype=np.float64)
    partial = np.zeros(n_cols, dtype=np.float64)
    for i in range(n_rows):
        for j in range(n_cols):
            value = np.float64(block[i, j])
            if not np.isfinite(value):
                return total, i
            partial[j] += value
        if (i & 255) == 255:
            for j in range(n_cols):
                total[j] += partial[j]
                partial[j] = 0.0
    for j in range(n_cols):
        total[j] += partial[j]
    return total, -1


@numba.njit(**_JIT)
def center_into(block, mean, out):
    """``out[:n] = block - mean`` with ``mean`` in float64, cast to ``out``'s dtype; returns ``out[:n]``."""
    n_rows, n_cols = block.shape
    for i in range(n_rows):
        for j in range(n_cols):
            out[i, j] = np.float64(block[i, j]) - mean[j]
    return out[:n_rows]


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
