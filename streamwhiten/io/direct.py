"""Positional file writes that bypass the page cache (``O_DIRECT``), for the chunk data of outputs.

A buffered write copies every byte into fresh page-cache pages (slow to touch on virtual machines), which
was measured to cost more than computing the rows. With ``O_DIRECT`` the device reads the caller's buffer,
so a writer thread overlaps the write with the next product, and the cached input is left alone. It needs
the address, offset and length to be multiples of `ALIGNMENT`; anything else, or a platform or file system
without it, gets an ordinary buffered write: same bytes, same file.
"""

from __future__ import annotations

import errno
import os

import numpy as np

from .._buffers import ALIGNMENT

_O_DIRECT = getattr(os, "O_DIRECT", 0)


def direct_writable(offset: int, data: np.ndarray) -> bool:
    """True when ``data`` written at ``offset`` meets the alignment a direct write needs."""
    return bool(
        _O_DIRECT
        and data.flags.c_contiguous
        and offset % ALIGNMENT == 0
        and data.nbytes % ALIGNMENT == 0
        and data.ctypes.data % ALIGNMENT == 0
    )


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view.nbytes:
        written = os.pwrite(fd, view, offset)
        if written <= 0:
            raise OSError(errno.EIO, "the write made no progress")
        view, offset = view[written:], offset + written


class ChunkFile:
    """One file written at byte offsets: directly where aligned and allowed (``direct``), buffered otherwise.
    ``create`` makes (or truncates) the file; otherwise it must exist."""

    def __init__(self, path: str, create: bool = False, direct: bool = True):
        self._fd: int | None = os.open(path, os.O_WRONLY | ((os.O_CREAT | os.O_TRUNC) if create else 0), 0o666)
        self._direct_fd: int | None = None
        if direct and _O_DIRECT:
            try:
                self._direct_fd = os.open(path, os.O_WRONLY | _O_DIRECT)
            except OSError:  # a file system without O_DIRECT (older tmpfs, some FUSE mounts)
                self._direct_fd = None

    @property
    def direct(self) -> bool:
        """Whether aligned writes still go around the page cache."""
        return self._direct_fd is not None

    def write_at(self, offset: int, data: np.ndarray) -> None:
        """Write the bytes of the C-contiguous array ``data`` at byte ``offset``."""
        view = memoryview(data).cast("B")  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ on Python 3.12+ only
        if self._direct_fd is not None and direct_writable(offset, data):
            try:
                _pwrite_all(self._direct_fd, view, offset)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self._close_direct()  # refused after all (an unusual block size): buffered from now on
        assert self._fd is not None, "write to a closed ChunkFile"
        _pwrite_all(self._fd, view, offset)

    def fsync(self) -> None:
        """Make every write so far durable (both descriptors name the same inode)."""
        assert self._fd is not None, "fsync of a closed ChunkFile"
        os.fsync(self._fd)

    def _close_direct(self) -> None:
        if self._direct_fd is not None:
            os.close(self._direct_fd)
            self._direct_fd = None

    def close(self) -> None:
        self._close_direct()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ChunkFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
