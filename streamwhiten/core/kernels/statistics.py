"""The statistics' kernels: the centring pass with its float64 column sums, the row finiteness
mask, and the fused Chan et al. merge of two scatters."""

import numba
import numpy as np

from . import F64, Bool

#: Row groups of the centring pass, each summed on its own before the groups are added in order: a
#: fixed partition, so the float64 sums (and every result) never depend on how the work is scheduled.
ROW_GROUPS = 16


@numba.njit(nogil=True, cache=True)
def center_and_sum(block: np.ndarray, shift: F64, out: np.ndarray) -> F64:
    """``out[:n] = block - shift`` (in ``out``'s dtype; ``out`` may be ``block``) in one pass, and the float64
    column sums of the rounded values written, so ``C^T C - n cbar cbar^T`` is exact. No branch, so it
    vectorises (a NaN or Inf shows in its column sum); each row goes through a private buffer."""
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
def finite_row_mask(block: np.ndarray) -> Bool:
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
def merged_scatter(scatter_a: F64, scatter_b: F64, delta: F64, weight: float) -> F64:
    """``scatter_a + scatter_b + weight * outer(delta, delta)`` in one pass (Chan et al. merge)."""
    n_cols = delta.shape[0]
    out = np.empty((n_cols, n_cols), dtype=np.float64)
    for i in range(n_cols):
        scaled = weight * delta[i]
        for j in range(n_cols):
            out[i, j] = scatter_a[i, j] + scatter_b[i, j] + scaled * delta[j]
    return out
