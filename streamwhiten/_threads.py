"""Block-parallel execution on one machine: worker threads, each with its own BLAS thread count.

A fit is one BLAS product per block plus a little memory-bound work (read, centre). Running that work
between multi-threaded BLAS calls leaves cores idle, and running it beside them makes two thread pools
fight over the cores. Instead, each of ``threads`` worker threads does whole blocks (read, centre,
product) with BLAS limited to ``cores // threads`` threads per call, so the memory-bound part of one
block overlaps the product of another. Numba kernels and BLAS release the GIL. Results come back in
submission order, so the caller folds them in the same order, and gets the same bits, however the
threads interleave.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator

import numpy as np

from .errors import BadInputError

#: Default cap on worker threads: each holds one block buffer, so memory is about ``threads`` blocks.
MAX_DEFAULT_THREADS = 4


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform reports it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads: int | None, default: int | None = None) -> int:
    """Worker threads to use: ``threads``; if None, ``default``, or else one per core up to
    :data:`MAX_DEFAULT_THREADS`."""
    if threads is None:
        return default or min(MAX_DEFAULT_THREADS, available_cores())
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise BadInputError(f"threads must be a whole number of at least 1, got {threads!r}")
    return int(threads)


def blas_threads_per_worker(threads: int) -> int:
    """BLAS threads per call so that ``threads`` workers together use every core once."""
    return max(1, available_cores() // max(1, threads))


@contextlib.contextmanager
def blas_threads(n_threads: int | None):
    """Limit BLAS (OpenBLAS, MKL, BLIS) to ``n_threads`` per call for the duration; None, or no
    threadpoolctl, leaves it alone. The limit is process-wide, so it is set only around the work."""
    if n_threads is None:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is a dependency
        yield
        return
    with threadpool_limits(limits=max(1, n_threads), user_api="blas"):
        yield


def ordered_map(function: Callable, items: Iterable, threads: int) -> Iterator:
    """``function(*item)`` for each item, computed by ``threads`` worker threads, yielded in item order.

    At most ``threads + 1`` items are in flight, so memory stays bounded however many items there are.
    With one thread everything runs in the calling thread. Closing the generator early (an error or
    an interruption in the consumer) cancels what has not started and waits for what has.
    """
    if threads <= 1:
        for item in items:
            yield function(*item)
        return
    items = iter(items)
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="streamwhiten-worker")
    pending: deque = deque()
    try:
        for item in items:
            pending.append(pool.submit(function, *item))
            if len(pending) > threads:
                break
        while pending:
            result = pending.popleft().result()
            for item in items:
                pending.append(pool.submit(function, *item))
                break
            yield result
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


class PerThread:
    """A lazily created object per worker thread (a reusable block buffer, say)."""

    def __init__(self, factory: Callable[[], object]):
        self._factory = factory
        self._local = threading.local()

    def get(self):
        value = getattr(self._local, "value", None)
        if value is None:
            value = self._local.value = self._factory()
        return value


class BufferPool:
    """Reusable arrays of one shape and dtype, handed from thread to thread: ``take`` one (a new one
    only when none is free), ``give_back`` it when done. Holds at most as many as were in use at once."""

    def __init__(self, shape, dtype):
        self._shape, self._dtype = tuple(shape), np.dtype(dtype)
        self._free: deque = deque()
        self._lock = threading.Lock()

    def take(self) -> np.ndarray:
        with self._lock:
            if self._free:
                return self._free.pop()
        return np.empty(self._shape, dtype=self._dtype)

    def give_back(self, buffer: np.ndarray) -> None:
        with self._lock:
            self._free.append(buffer)
