"""NumPy ``.npy`` files, memory-mapped: a source of rows and 1-D arrays."""

from __future__ import annotations

import os

import numpy as np

from ..errors import BadInputError, CorruptStoreError, StoreIOError
from .base import Source, io_error


class NpySource(Source):
    kind = "npy"

    def __init__(self, path, dataset):
        if dataset:
            raise BadInputError(f"{path}: a .npy file holds one array; drop the dataset name ':{dataset}'")
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            if "mmap length is greater than file size" in str(exc):
                raise CorruptStoreError(f"{path}: the file is truncated (shorter than its header says)") from exc
            raise BadInputError(f"{path}: cannot read as .npy ({exc})") from exc
        if not isinstance(array, np.ndarray):
            raise BadInputError(f"{path}: is not a .npy array file (an .npz archive?)")
        self._array = array
        super().__init__(path, None, array.shape, array.dtype, None)
        self._file_bytes = int(getattr(array, "offset", 0)) + array.nbytes

    def read_into(self, start, stop, out):
        # Reading a memory map past the end of a file that shrank would kill the process (SIGBUS).
        try:
            size = os.stat(self.path).st_size
        except OSError as exc:
            raise StoreIOError(f"{self.label}: cannot read rows {start}..{stop - 1}: {io_error(exc)}") from exc
        if size < self._file_bytes:
            raise CorruptStoreError(f"{self.label}: the file shrank to {size} bytes while being read (its header says "
                                    f"{self._file_bytes}): it is being rewritten or was truncated")
        view = out[: stop - start]
        try:
            view[...] = self._array[start:stop]
        except (OSError, ValueError) as exc:
            raise StoreIOError(f"{self.label}: cannot read rows {start}..{stop - 1}: {io_error(exc)}") from exc
        return view


def read_vector(path: str, inner: str | None) -> tuple[np.ndarray, str]:
    """The whole array of a ``.npy`` file, and its label."""
    if inner:
        raise BadInputError(f"{path}: a .npy file holds one array; drop the dataset name ':{inner}'")
    return np.load(path, allow_pickle=False), path
