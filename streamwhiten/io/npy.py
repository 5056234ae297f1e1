"""NumPy ``.npy`` files, memory-mapped: a source of rows and 1-D arrays (one named by URL: by range requests)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .._npz import NpyTooShort, npy_header, read_npy_header
from ..errors import BadInputError, CorruptStoreError, StoreIOError
from ..options import ReadOptions
from . import remote
from ._messages import io_error
from ._store import StoreSource
from .codecs import Fetched

#: Bytes per range request of a remote block: a block of 64 MiB is fetched as 8 requests at once.
RANGE_BYTES = 8 << 20
#: Bytes read to find a remote file's header (longer headers are read in a second request).
HEADER_BYTES = 1 << 16


class NpySource(StoreSource):
    """A local ``.npy`` file, memory-mapped (one named by URL is a `RemoteNpySource`)."""

    kind = "npy"

    def __new__(cls, path: str, dataset: str | None, read: ReadOptions | None = None) -> NpySource:
        if dataset:
            raise _no_names(path, dataset)
        if cls is NpySource and remote.is_url(path):
            return super().__new__(RemoteNpySource)
        return super().__new__(cls)

    def __init__(self, path: str, dataset: str | None, read: ReadOptions | None = None) -> None:
        try:
            _check_header(path)
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except BadInputError:
            raise
        except (OSError, ValueError) as exc:
            if isinstance(exc, OSError) and exc.errno is not None:
                raise StoreIOError(f"{path}: cannot read: {io_error(exc)}") from exc
            if "mmap length is greater than file size" in str(exc):
                raise CorruptStoreError(f"{path}: the file is truncated (shorter than its header says)") from exc
            raise BadInputError(f"{path}: cannot read as .npy ({exc})") from exc
        if not isinstance(array, np.ndarray):
            raise BadInputError(f"{path}: is not a .npy array file (an .npz archive?)")
        self._array = array
        super().__init__(path, None, array.shape, array.dtype, None, read)
        self._file_bytes = int(getattr(array, "offset", 0)) + array.nbytes

    def _read_into(self, start: int, stop: int, out: np.ndarray, fetched: Fetched | None = None) -> np.ndarray:
        # Reading a memory map past the end of a file that shrank would kill the process (SIGBUS).
        try:
            size = os.stat(self.path).st_size
        except OSError as exc:
            raise StoreIOError(f"{self.label}: cannot read rows {start}..{stop - 1}: {io_error(exc)}") from exc
        if size < self._file_bytes:
            raise CorruptStoreError(
                f"{self.label}: the file shrank to {size} bytes while being read (its header says "
                f"{self._file_bytes}): it is being rewritten or was truncated"
            )
        view = out[: stop - start]
        try:
            view[...] = self._array[start:stop]
        except (OSError, ValueError) as exc:
            raise StoreIOError(f"{self.label}: cannot read rows {start}..{stop - 1}: {io_error(exc)}") from exc
        return view


def _no_names(path: str, name: str) -> BadInputError:
    """The error for a name given inside a ``.npy`` file, in the words of ``base.name_not_found``."""
    label = remote.redact(path)
    return BadInputError(
        f"{label}: has no array /{name}: a .npy file holds one array, with no name inside (name it as {label})"
    )


def _check_header(path: str) -> None:
    """Refuse a local ``.npy`` whose header is not one or claims more data than the file holds (before mapping it)."""
    with open(path, "rb") as handle:
        try:
            npy_header(handle, os.fstat(handle.fileno()).st_size)
        except NpyTooShort as exc:
            raise CorruptStoreError(f"{path}: the file is truncated or its header damaged: {exc}") from None
        except EOFError:
            raise BadInputError(f"{path}: cannot read as .npy (the file ends inside its header)") from None
        except ValueError as exc:
            raise BadInputError(f"{path}: cannot read as .npy ({exc})") from None


def _header(url: str, read: ReadOptions) -> tuple[tuple[int, ...], np.dtype[Any], int, int]:
    """``(shape, dtype, offset of the data, size of the object)`` of a remote ``.npy``."""
    import io

    where = remote.redact(url)
    size = remote.version(url, read=read)["size"]
    head = remote.cat(url, 0, min(size, HEADER_BYTES), read=read)
    try:
        handle = io.BytesIO(head)
        np.lib.format.read_magic(handle)  # the header's length follows the magic: 2 bytes in 1.0, else 4
        width = 2 if head[6:7] == b"\x01" else 4
        length = int.from_bytes(head[8 : 8 + width], "little") + 8 + width
        if length > HEADER_BYTES * 16:
            raise ValueError(f"its header claims {length:,} bytes, more than any array needs")
        if length > len(head):
            head = remote.cat(url, 0, length, read=read)
        handle = io.BytesIO(head)
        shape, fortran, dtype = read_npy_header(handle)
    except (ValueError, EOFError) as exc:
        raise BadInputError(f"{where}: cannot read as .npy ({exc})") from None
    if dtype.hasobject:
        raise BadInputError(f"{where}: holds Python objects, not numbers")
    if fortran and len(shape) > 1:
        raise BadInputError(
            f"{where}: is stored in Fortran (column) order; rows cannot be read in ranges (save it "
            "with np.ascontiguousarray)"
        )
    offset = handle.tell()
    if size < offset + int(np.prod(shape)) * dtype.itemsize:
        raise CorruptStoreError(f"{where}: the file is truncated (shorter than its header says)")
    return tuple(int(n) for n in shape), dtype, offset, size


class RemoteNpySource(NpySource):
    """A ``.npy`` object read by range requests, each block in `RANGE_BYTES` parts fetched at once."""

    remote = True

    def __init__(self, path: str, dataset: str | None, read: ReadOptions | None = None) -> None:
        read = read if read is not None else ReadOptions()
        shape, dtype, self._offset, self._size = _header(path, read)
        self._version = remote.version(path, read=read)
        StoreSource.__init__(self, path, None, shape, dtype, None, read)
        self._stored = dtype  # byte order as stored; rows are converted into the native ``dtype``

    def fingerprint_extra(self) -> dict[str, Any]:
        return dict(self._version)

    def _read_into(self, start: int, stop: int, out: np.ndarray, fetched: Fetched | None = None) -> np.ndarray:
        view = out[: stop - start]
        if stop <= start:
            return view
        if not 0 <= start <= stop <= self.n_rows:
            raise StoreIOError(f"{self.label}: rows {start}..{stop - 1} are outside its {self.n_rows} rows")
        row_bytes = self.n_features * self._stored.itemsize
        first, last = self._offset + start * row_bytes, self._offset + stop * row_bytes
        edges = list(range(first, last, RANGE_BYTES)) + [last]
        fs, key = remote.filesystem(self.path, self.read_options)
        what = f"read rows {start}..{stop - 1}"
        parts = fs.cat_ranges([key] * (len(edges) - 1), edges[:-1], edges[1:], on_error="raise")
        # the bytes go straight into ``view`` where stored as it is, else through a buffer of their own
        same = self._stored == self.dtype
        target = view.reshape(-1).view(np.uint8) if same else np.empty(last - first, np.uint8)
        for part, a, b in zip(parts, edges[:-1], edges[1:], strict=True):
            if isinstance(part, BaseException):
                raise remote.failure(self.path, what, part)
            if len(part) != b - a:
                raise CorruptStoreError(
                    f"{self.label}: the file shrank while being read (rows {start}..{stop - 1} "
                    "are past its end): it is being rewritten or was truncated"
                )
            target[a - first : b - first] = np.frombuffer(part, np.uint8)
        if not same:
            view[...] = target.view(self._stored).reshape(view.shape)
        return view


def read_vector(path: str, inner: str | None, read: ReadOptions) -> tuple[np.ndarray, str]:
    """The whole array of a ``.npy`` file, and its label."""
    if inner:
        raise _no_names(path, inner)
    if remote.is_url(path):
        shape, dtype, offset, _ = _header(path, read)
        raw = remote.cat(path, offset, offset + int(np.prod(shape)) * dtype.itemsize, read=read)
        return np.frombuffer(raw, dtype).reshape(shape).astype(dtype.newbyteorder("=")), remote.redact(path)
    try:
        _check_header(path)
    except OSError as exc:
        raise StoreIOError(f"{path}: cannot read: {io_error(exc)}") from exc
    return np.load(path, allow_pickle=False), path
