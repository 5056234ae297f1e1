"""Numba-jitted hot loops, by concern: ``statistics`` (the centring pass, finite rows, the fused merge),
``product`` (the float32 product's screen), ``lzf`` (HDF5's LZF filter), ``search`` (exact top lists),
``codes`` (the tool's vector codes). The only package that imports numba.

Every kernel is single-threaded and ``nogil``: parallelism comes from worker threads each working on
its own block (see ``engine._threads``), not from threads inside a kernel, which would compete with BLAS for
the cores. ``cache=True`` so the compile cost (a few seconds) is paid once per machine, not per run; numba
checks only a kernel's own file for changes, so kernels that call each other share a module.
"""

from typing import TypeAlias

import numpy as np
import numpy.typing as npt

#: The array types of the kernels' signatures.
F32: TypeAlias = npt.NDArray[np.float32]
F64: TypeAlias = npt.NDArray[np.float64]
I64: TypeAlias = npt.NDArray[np.int64]
U8: TypeAlias = npt.NDArray[np.uint8]
U64: TypeAlias = npt.NDArray[np.uint64]
Bool: TypeAlias = npt.NDArray[np.bool_]
