"""Numba-jitted hot loops by concern (``statistics``, ``product``, ``lzf``, ``search``, ``codes``): the
only package that imports numba. Every kernel is single-threaded and ``nogil`` (the parallelism is the
worker threads'); ``cache=True``, and numba checks only a kernel's own file, so callers share a module.
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
