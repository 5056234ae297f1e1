"""Streaming first and second moments: the state ``(n_rows, mean, scatter)`` (float64, ``scatter =
sum_i (x_i - mean)^T (x_i - mean)``) and three pure functions: ``block_moments`` of one block (centred on
its own mean, never ``E[xx^T] - mu mu^T``), ``merge`` of two states (Chan, Golub & LeVeque) and
``covariance`` (``Sigma_beta`` in closed form).

Examples
--------
Two blocks reduced apart and merged give the statistics of all the rows (as the engines do, on
threads, files or workers):

>>> import numpy as np
>>> from streamwhiten.core import stats
>>> rows = np.random.default_rng(0).standard_normal((500, 3)) + 10.0
>>> merged = stats.merge(stats.block_moments(rows[:200]), stats.block_moments(rows[200:]))
>>> merged.n_rows
500
>>> bool(np.allclose(merged.mean, rows.mean(axis=0)))
True
>>> bool(np.allclose(stats.covariance(merged), np.cov(rows, rowvar=False, bias=True)))
True

``Sigma_beta`` for any ``beta`` follows from the same state, without the rows:

>>> second_moment = rows.T @ rows / len(rows)
>>> bool(np.allclose(stats.covariance(merged, beta=0.0), second_moment))
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import BadInputError, NonFiniteError
from ..params import check
from .kernels import statistics as kernels

#: Rows per float32 BLAS call, each added into a float64 total: bounds the rounding error (about 2e-7
#: relative) however long the chunk is.
GEMM_ROWS = 65536


@dataclass(frozen=True)
class Moments:
    """Count, mean and centred scatter of the rows seen so far (float64)."""

    n_rows: int
    mean: np.ndarray
    scatter: np.ndarray

    @property
    def n_features(self) -> int:
        return int(self.mean.shape[0])

    @classmethod
    def empty(cls, n_features: int) -> Moments:
        return cls(0, np.zeros(n_features), np.zeros((n_features, n_features)))

    def __eq__(self, other: object) -> bool:  # exact, bit-for-bit equality
        if not isinstance(other, Moments):
            return NotImplemented
        return (
            self.n_rows == other.n_rows
            and np.array_equal(self.mean, other.mean)
            and np.array_equal(self.scatter, other.scatter)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable arrays inside: unhashable, like ndarray


def working_dtype(input_dtype: npt.DTypeLike, precision: str = "auto") -> np.dtype:
    """The dtype the scatter product runs in: float64 input or ``precision='float64'`` give float64."""
    check("precision", precision)
    if precision == "float64" or (precision == "auto" and np.dtype(input_dtype) == np.float64):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _as_kernel_input(chunk: npt.ArrayLike) -> np.ndarray:
    chunk = np.asarray(chunk)
    if chunk.ndim != 2:
        raise BadInputError(f"expected a 2-D array of rows, got {chunk.ndim}-D with shape {chunk.shape}")
    if chunk.dtype.kind != "f":
        raise BadInputError(f"expected floating-point rows, got dtype {chunk.dtype}")
    if chunk.dtype == np.float16:  # numba has no float16 arithmetic
        chunk = chunk.astype(np.float32)
    return np.ascontiguousarray(chunk)


def drop_nonfinite(chunk: npt.ArrayLike) -> tuple[np.ndarray, int]:
    """``chunk`` without its rows holding NaN or Inf, and how many were dropped."""
    chunk = _as_kernel_input(chunk)
    mask = kernels.finite_row_mask(chunk)
    n_dropped = int(mask.size - np.count_nonzero(mask))
    return (chunk if n_dropped == 0 else chunk[mask]), n_dropped


#: Rows sampled (evenly spaced) to estimate a chunk's mean before centring it.
SHIFT_SAMPLE_ROWS = 256


def block_moments(
    chunk: npt.ArrayLike, precision: str = "auto", workspace: np.ndarray | None = None, overwrite_input: bool = False
) -> Moments:
    """Moments of one chunk of rows, in one pass over the data plus the scatter product.

    Rows are centred on a float64 estimate of the mean with exact float64 sums, so ``C^T C - n cbar
    cbar^T`` cancels nothing. NaN or Inf raises `NonFiniteError` (``.row`` in the chunk). The centred
    rows go into ``workspace`` (reused if it fits), or the chunk itself with ``overwrite_input``.
    """
    chunk = _as_kernel_input(chunk)
    n_rows, n_features = chunk.shape
    if n_rows == 0:
        return Moments.empty(n_features)
    dtype = working_dtype(chunk.dtype, precision)
    sample = chunk[:: max(1, n_rows // SHIFT_SAMPLE_ROWS)].astype(np.float64)
    shift = sample.mean(axis=0)
    if not np.all(np.isfinite(shift)):
        shift = np.zeros(n_features)  # the pass below finds and reports the bad row
    if overwrite_input and chunk.dtype == dtype and chunk.flags.writeable:
        workspace = chunk
    elif (
        workspace is None or workspace.dtype != dtype or workspace.shape[0] < n_rows or workspace.shape[1] != n_features
    ):
        workspace = np.empty((n_rows, n_features), dtype=dtype)
    sums = kernels.center_and_sum(chunk, shift, workspace)
    if not np.all(np.isfinite(sums)):  # rare: a NaN/Inf row (they survive the centring), or overflow
        finite = kernels.finite_row_mask(chunk)  # centred in place or not, NaN/Inf rows stay non-finite
        if finite.all():
            raise _overflow(dtype, "their sums or centred values")
        bad_row = int(np.argmin(finite))
        raise NonFiniteError(f"row {bad_row} holds NaN or Inf", row=bad_row)
    centred = workspace[:n_rows]
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked just below
        if dtype == np.float64:
            scatter = centred.T @ centred
        else:
            scatter = np.zeros((n_features, n_features))
            for start in range(0, n_rows, GEMM_ROWS):
                block = centred[start : start + GEMM_ROWS]
                scatter += block.T @ block
    if not np.all(np.isfinite(np.diagonal(scatter))):  # any overflow reaches the diagonal (sums of squares)
        raise _overflow(dtype, "their products")
    offset = sums / n_rows  # mean of the centred rows: small
    scatter -= n_rows * np.outer(offset, offset)
    return Moments(n_rows, shift + offset, scatter)


def _overflow(dtype: np.dtype, what: str) -> BadInputError:
    hint = "; fit with precision='float64'" if dtype == np.float32 else ""
    return BadInputError(f"values too large for the arithmetic ({what} overflow){hint}", param="precision")


def merge(a: Moments, b: Moments) -> Moments:
    """Exact pairwise merge of two states (Chan et al.); order-independent up to rounding."""
    if a.n_features != b.n_features:
        raise BadInputError(f"cannot merge statistics of width {a.n_features} and {b.n_features}")
    if b.n_rows == 0:
        return a
    if a.n_rows == 0:
        return b
    n_rows = a.n_rows + b.n_rows
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.n_rows / n_rows)
    weight = a.n_rows * b.n_rows / n_rows
    scatter = kernels.merged_scatter(a.scatter, b.scatter, delta, weight)
    return Moments(n_rows, mean, scatter)


def update(state: Moments, chunk: npt.ArrayLike, precision: str = "auto", **options: Any) -> Moments:
    """``merge(state, block_moments(block))``: fold one more block of rows into the state."""
    return merge(state, block_moments(chunk, precision, **options))


def covariance(state: Moments, beta: float = 1.0) -> np.ndarray:
    """``Sigma_beta = scatter / n + (1 - beta)^2 mean^T mean``: the second moment about ``beta * mean``."""
    if state.n_rows < 1:
        raise BadInputError("no rows were seen: cannot form a covariance")
    shift = (1.0 - beta) ** 2
    return state.scatter / state.n_rows + shift * np.outer(state.mean, state.mean)
