"""The one float32 product of the whitening, ``(x - shift) A``: the same bits for a row in any batch.

BLAS sums a dot product in an order that depends on the batch's shape and the machine, so a row alone
and in a block differed in their last bits. Here each value is *defined* as the float32 nearest (ties to
even) the exact dot product of the float32 centred row and weights; ``apply``, the estimator,
``Model.transform`` and `streamwhiten.serving` all call `rounded_product`. At about the price of one
float64 matrix product:

1. The product of two float32 numbers is exact in float64, so the float64 product ``C A`` (BLAS, any
   order) differs from the exact sums only by summation error, at most ``gamma_d sum_j |c_j a_j| <=
   gamma_d |c| |a|`` (``gamma_d = d u / (1 - d u)``, ``u = 2^-53``; Cauchy-Schwarz for the sum).
2. Rounded to float32 it is the correctly rounded value unless that bound reaches the midpoint between
   two float32 neighbours: about 1 value in 700 for whitened 384-d rows.
3. Those few are summed again in twice float64's precision (Ogita, Rump and Oishi's Sum2) and decided
   against a bound a million times smaller; any still undecided is summed exactly (``math.fsum``, then
   the sign of the remainder at a midpoint).

Only numpy and the standard library are used, so the serving path shares this module.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_U = 2.0**-53  # float64's unit roundoff
#: Rows multiplied at a time (bounds the float64 temporaries: two of rows x max(d, k) values).
CHUNK_ROWS = 2048
#: Fewer undecided values than this are summed exactly one by one; more go through Sum2 first.
_ONE_BY_ONE = 24


def _gamma(n: int) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: the relative error bound of a float64 sum of ``n + 1``
    terms in any order, with a 1 % margin for the float64 norms it multiplies."""
    return 1.01 * n * _U / (1.0 - n * _U)


@dataclass(frozen=True, eq=False)
class ProductWeights:
    """The float32 weights ``A`` (d x k) as `rounded_product` uses them: their float64 copy (exact),
    its transpose (for gathering columns) and each column's error bound ``gamma_d |a_j|``."""

    wide: np.ndarray
    wide_t: np.ndarray
    bound: np.ndarray

    @classmethod
    def of(cls, weights: np.ndarray) -> ProductWeights:
        """From float32 weights (d x k); other floats are rounded to float32 first."""
        wide = np.ascontiguousarray(np.asarray(weights, dtype=np.float32), dtype=np.float64)
        norms = np.sqrt(np.einsum("ij,ij->j", wide, wide))
        return cls(wide, np.ascontiguousarray(wide.T), _gamma(wide.shape[0]) * norms)


#: How `rounded_product` screens a block: ``screen(near, row_norms, bound, out, undecided) -> count``
#: rounds ``near`` into ``out`` and marks the values it cannot decide (`numpy_screen`; the engine passes
#: its Numba twin, ``core.kernels.product.round_and_screen``, which applies the same formula in one pass).
Screen = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], int]


def rounded_product(
    centred: np.ndarray,
    weights: np.ndarray | ProductWeights,
    out: np.ndarray | None = None,
    screen: Screen | None = None,
) -> np.ndarray:
    """``centred @ weights`` (float32) with each value the float32 nearest the exact dot product: the same
    bits for a row alone or in any batch, on any machine. ``out`` (C-contiguous) receives it when given;
    ``screen`` (default `numpy_screen`) changes only the speed. NaN or Inf rows give NaN or Inf values, and
    a value beyond float32's range is Inf."""
    w = weights if isinstance(weights, ProductWeights) else ProductWeights.of(weights)
    rows = np.asarray(centred)
    if rows.dtype != np.float32 or rows.ndim != 2 or rows.shape[1] != w.wide.shape[0]:
        raise ValueError(f"expected float32 rows of {w.wide.shape[0]} values, got {rows.dtype} {rows.shape}")
    if out is None:
        out = np.empty((rows.shape[0], w.wide.shape[1]), dtype=np.float32)
    undecided_rows, undecided_cols = [], []
    for start in range(0, rows.shape[0], CHUNK_ROWS):
        stop = min(rows.shape[0], start + CHUNK_ROWS)
        at_rows, at_cols = _rounded_block(rows[start:stop], w, out[start:stop], screen or numpy_screen)
        undecided_rows.append(at_rows + start)
        undecided_cols.append(at_cols)
    # decided together, so the compensated sums run once a call, not once a chunk
    at_rows, at_cols = np.concatenate(undecided_rows), np.concatenate(undecided_cols)
    if at_rows.size:
        finite = np.isfinite(out[at_rows, at_cols])  # NaN, or beyond float32's range: nothing to decide
        at_rows, at_cols = at_rows[finite], at_cols[finite]
        out[at_rows, at_cols] = exactly_rounded(rows[at_rows].astype(np.float64) * w.wide_t[at_cols])
    return out


def _rounded_block(
    rows: np.ndarray, w: ProductWeights, out: np.ndarray, screen: Screen
) -> tuple[np.ndarray, np.ndarray]:
    """``out`` = the float64 product of ``rows`` rounded to float32; returns where it is undecided."""
    wide = rows.astype(np.float64)
    near = wide @ w.wide  # within gamma_d |c| |a| of the exact sums
    norms = np.sqrt(np.einsum("ij,ij->i", wide, wide))
    undecided = np.empty(near.shape, dtype=np.bool_)
    with np.errstate(over="ignore", invalid="ignore"):  # beyond float32's range: Inf, as the product would be
        # the Numba screen views ``out``'s bits, which needs contiguous rows
        chosen = screen if out.flags.c_contiguous else numpy_screen
        count = chosen(near, norms, w.bound, out, undecided)
    if not count:
        empty = np.empty(0, dtype=np.intp)
        return empty, empty
    at_rows, at_cols = np.nonzero(undecided)
    return at_rows, at_cols


def numpy_screen(near: np.ndarray, norms: np.ndarray, bound: np.ndarray, out: np.ndarray, undecided: np.ndarray) -> int:
    """``out = near`` rounded to float32, and ``undecided`` marked where ``|near - out| + norms[i]
    bound[j]`` reaches `half_spacing` of ``out`` (the exact sum might round to another float32)."""
    out[...] = near
    slack = np.abs(near - out)
    slack += np.multiply.outer(norms, bound)
    np.greater_equal(slack, half_spacing(out), out=undecided)
    return int(np.count_nonzero(undecided))


def half_spacing(values: np.ndarray) -> np.ndarray:
    """Half the gap from each float32 value to its nearer neighbour, as float64: a float64 number within
    less than it of the value rounds to the value. (Exact; a quarter of the upper gap at a power of two,
    whose lower gap is half its upper one; ``2^-151`` at zero, also less than the truth.)"""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.int64)
    at_power = (bits & 0x7FFFFF) == 0
    # 2^(e - 151) (2^(e - 152) at a power of two): half the float32 gap at biased exponent e, built as float64 bits
    biased = np.maximum(exponent, 1) + (1023 - 151) - at_power
    half: np.ndarray = (biased << 52).view(np.float64)
    return half


def exactly_rounded(products: np.ndarray) -> np.ndarray:
    """The float32 nearest (ties to even) the exact sum of each row of ``products`` (float64, each exact)."""
    if products.shape[0] < _ONE_BY_ONE:
        return np.array([_fsum_rounded(row) for row in products], dtype=np.float32)
    total, error, magnitude = _sum2(products)
    near = total + error
    out: np.ndarray = near.astype(np.float32)
    n = products.shape[1]
    # Sum2's bound: u |s| + gamma_{n-1}^2 sum |p| (Ogita, Rump, Oishi 2005, Prop. 4.5), taken twice
    bound = 2 * _U * np.abs(near) + 2 * _gamma(n) ** 2 * magnitude
    for i in np.flatnonzero(np.abs(near - out) + bound >= half_spacing(out)):
        out[i] = _fsum_rounded(products[i])
    return out


def _sum2(products: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ogita, Rump and Oishi's Sum2 of each row: the sum, its correction and the sum of magnitudes."""
    columns = np.asfortranarray(products)
    total = columns[:, 0].copy()
    error = np.zeros_like(total)
    magnitude = np.abs(columns).sum(axis=1) * (1 + _gamma(products.shape[1]))
    for j in range(1, columns.shape[1]):
        term = columns[:, j]
        new = total + term
        virtual = new - total
        error += (total - (new - virtual)) + (term - virtual)
        total = new
    return total, error, magnitude


def _fsum_rounded(row: np.ndarray) -> float:
    """The float32 nearest (ties to even) to the exact sum of ``row``: ``math.fsum`` rounds it to float64
    correctly, and only where that lands on a float32 midpoint does the remainder's sign decide."""
    terms = row.tolist()
    total = math.fsum(terms)
    rounded = np.float32(total)
    value = float(rounded)  # a float32 value, exactly
    if math.isinf(total) or not math.isfinite(value) or value == total:
        return value
    other = float(np.nextafter(rounded, np.float32(math.inf if total > value else -math.inf)))
    if (value + other) / 2 != total:  # not a midpoint: the float64 sum rounds as the exact one does
        return value
    rest = math.fsum([*terms, -total])  # the sign of exact - total
    if rest == 0:
        return value  # a true tie: to even, as the cast did
    return max(value, other) if rest > 0 else min(value, other)


__all__ = [
    "CHUNK_ROWS",
    "ProductWeights",
    "Screen",
    "exactly_rounded",
    "half_spacing",
    "numpy_screen",
    "rounded_product",
]
