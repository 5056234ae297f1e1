"""Block-sized scratch buffers, kept between runs in this process.

Fresh buffers come back as pages the kernel must find and zero on first touch, which on a virtual machine
can cost as much as the block's product (``benchmarks/memory.py``). So a run hands its buffers back here
when it ends and the next run takes them again, as BLAS keeps its work areas; the cache never holds more
than the most any run had in use at once, and
[`release_buffers`][streamwhiten._buffers.release_buffers] returns them to the system. A buffer is handed
back only once nothing can touch it (`kept_for_next_run`), and results are always copied out of it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

#: Every buffer starts at a multiple of this many bytes, as direct (``O_DIRECT``) I/O needs.
ALIGNMENT = 4096


def _allocate(n_bytes: int) -> np.ndarray:
    """A new buffer: ``n_bytes`` plus room to start at an aligned address (see `_aligned`)."""
    return np.empty(n_bytes + ALIGNMENT, dtype=np.uint8)


def _capacity(owner: np.ndarray) -> int:
    return owner.nbytes - ALIGNMENT


def as_array(buffer: np.ndarray, shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
    """The first bytes of a byte ``buffer`` as an array of ``shape`` and ``dtype`` (a view, no copy)."""
    dtype = np.dtype(dtype)
    n_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return buffer[:n_bytes].view(dtype).reshape(shape)


def _aligned(owner: np.ndarray, shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
    """``owner``'s bytes from its first aligned address, as an array of ``shape`` and ``dtype``."""
    return as_array(owner[-owner.ctypes.data % ALIGNMENT :], shape, dtype)


class _Cache:
    """Free buffers, and the ones lent out (weakly: one never given back is simply collected), found again
    by a lent array's ``.base`` (numpy collapses chains of views)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: list[np.ndarray] = []
        self._lent: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()

    def take(self, shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
        n_bytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        with self._lock:
            fitting = [owner for owner in self._free if _capacity(owner) >= n_bytes]
            if fitting:
                owner = min(fitting, key=_capacity)
                self._free = [buffer for buffer in self._free if buffer is not owner]
            else:  # the free buffers are all too small for this run: let them go before allocating
                self._free, owner = [], None
        if owner is None:
            owner = _allocate(n_bytes)
        with self._lock:
            self._lent[id(owner)] = owner
        return _aligned(owner, shape, dtype)

    def give_back(self, array: np.ndarray) -> None:
        with self._lock:
            owner = self._lent.pop(id(array.base), None)  # alive, so its id is its own
            if owner is not None:
                self._free.append(owner)

    def release(self) -> int:
        with self._lock:
            n_bytes = sum(_capacity(owner) for owner in self._free)
            self._free = []
        return n_bytes

    def cached_bytes(self) -> int:
        with self._lock:
            return sum(_capacity(owner) for owner in self._free)


_CACHE = _Cache()


def take(shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
    """An aligned, uninitialised array of ``shape`` and ``dtype``: a cached buffer when one is big
    enough, else a new one. Hand it back with `give_back` once nothing uses it."""
    return _CACHE.take(shape, dtype)


def give_back(array: np.ndarray) -> None:
    """Keep ``array`` (from `take`) for a later run; anything else is ignored."""
    _CACHE.give_back(array)


def release_buffers() -> int:
    """Free the scratch buffers kept for later runs; returns their size in bytes."""
    return _CACHE.release()


def trim_heap() -> bool:
    """Hand the C heap's free pages back to the system (glibc's ``malloc_trim``); whether it could. A phase
    that allocated and freed much (a tuning pass) otherwise leaves that memory under the next one's peak."""
    trim = _malloc_trim()
    return bool(trim is not None and trim(0) >= 0)


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc: the process's own C library
    except (AttributeError, OSError, TypeError):  # not glibc (musl, macOS, Windows): nothing to do
        return None


def cached_bytes() -> int:
    """Size in bytes of the scratch buffers kept for later runs."""
    return _CACHE.cached_bytes()


@contextlib.contextmanager
def kept_for_next_run(*holders: PerThread | BufferPool | None) -> Iterator[None]:
    """Hand the buffers of ``holders`` back to the cache when the block ends normally or by an ordinary
    error (every thread that used them joined). After a KeyboardInterrupt or SystemExit a thread may still
    write them, so they are left to the garbage collector instead."""
    try:
        yield
    except Exception:
        _release(holders)
        raise
    else:
        _release(holders)


def _release(holders: tuple[PerThread | BufferPool | None, ...]) -> None:
    for holder in holders:
        if holder is not None:
            holder.release()


class PerThread:
    """One scratch buffer of ``shape`` and ``dtype`` per thread that asks, from the cache; `release` hands
    them all back once the workers stopped, after which `get` refuses."""

    def __init__(self, shape: tuple[int, ...], dtype: npt.DTypeLike) -> None:
        self._shape, self._dtype = tuple(shape), np.dtype(dtype)
        self._local = threading.local()
        self._taken: list[np.ndarray] = []
        self._lock = threading.Lock()
        self._released = False

    def get(self) -> np.ndarray:
        if self._released:
            raise RuntimeError("a block buffer was asked for after its run ended")
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            buffer = self._local.buffer = take(self._shape, self._dtype)
            with self._lock:
                self._taken.append(buffer)
        return buffer

    def release(self) -> None:
        with self._lock:
            taken, self._taken, self._released = self._taken, [], True
        for buffer in taken:
            give_back(buffer)


class BufferPool:
    """Scratch buffers of one shape and dtype handed from thread to thread (`take`, `give_back`); `release`
    hands the free ones back to the cache at the end of a run."""

    def __init__(self, shape: tuple[int, ...], dtype: npt.DTypeLike) -> None:
        self._shape, self._dtype = tuple(shape), np.dtype(dtype)
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self) -> np.ndarray:
        with self._lock:
            if self._free:
                return self._free.pop()
        return take(self._shape, self._dtype)

    def give_back(self, buffer: np.ndarray) -> None:
        with self._lock:
            self._free.append(buffer)

    def release(self) -> None:
        with self._lock:
            free, self._free = self._free, []
        for buffer in free:
            give_back(buffer)
