"""The decoder of HDF5's LZF filter, run in the worker threads outside the global lock."""

import numba
import numpy as np

from . import U8


@numba.njit(nogil=True, cache=True)
def lzf_decompress(data: U8, out: U8) -> int:
    """Inflate the raw LZF stream ``data`` into ``out``; returns the bytes written, or -1 for a damaged
    stream. liblzf's format: a control byte below 32 starts ``ctrl + 1`` literal bytes; any other is a
    back reference of ``(ctrl >> 5) + 2`` bytes (plus a length byte when that field is 7), ``1 + ((ctrl &
    31) << 8) + next byte`` back, copied byte by byte (they may overlap)."""
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
