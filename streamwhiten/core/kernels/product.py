"""The one-pass screen of ``core.product``'s float32 product."""

import math

import numba
import numpy as np

from . import F32, F64, Bool


@numba.njit(nogil=True, cache=True)
def round_and_screen(near: F64, row_norms: F64, bound: F64, out: F32, undecided: Bool) -> int:
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
