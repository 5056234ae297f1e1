"""Block-parallel execution on one machine: worker threads, each with its own BLAS thread count.

Each of ``threads`` workers does whole blocks with BLAS limited to ``cores // threads`` threads, so the
memory-bound part of one block overlaps the product of another; results come back in submission order,
so the caller gets the same bits however the threads interleave.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from ..params import check

#: Default cap on worker threads: each holds one block buffer, so memory is about ``threads`` blocks.
MAX_DEFAULT_THREADS = 4

_T = TypeVar("_T")


def available_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup (container) CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as handle:  # cgroup v2: "QUOTA PERIOD" or "max PERIOD"
            quota, period = handle.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def resolve_threads(threads: int | None, default: int | None = None) -> int:
    """``threads`` (-1: one per core); None: ``default``, or one per core up to `MAX_DEFAULT_THREADS`."""
    if threads is None:
        return default or min(MAX_DEFAULT_THREADS, available_cores())
    check("threads", threads)
    return available_cores() if threads == -1 else int(threads)


def blas_threads_per_worker(threads: int) -> int:
    """BLAS threads per call so that ``threads`` workers together use every core once."""
    return max(1, available_cores() // max(1, threads))


def worker_blas_threads(workers: int) -> int | None:
    """The BLAS limit for ``workers`` worker threads: None (BLAS's own default) for a single one."""
    return blas_threads_per_worker(workers) if workers > 1 else None


_LIMIT_LOCK = threading.Lock()
_LIMIT: dict[str, Any] = {"depth": 0, "context": None}


@contextlib.contextmanager
def blas_threads(n_threads: int | None) -> Iterator[None]:
    """Limit BLAS to ``n_threads`` per call for the duration (None: left alone). A pthreads BLAS limit is
    process-wide: only the outermost of overlapping blocks sets and restores it."""
    if n_threads is None:
        yield
        return
    from threadpoolctl import threadpool_limits  # a dependency, imported when first needed

    with _LIMIT_LOCK:
        if _LIMIT["depth"] == 0:
            _LIMIT["context"] = threadpool_limits(limits=max(1, n_threads), user_api="blas")
        _LIMIT["depth"] += 1
    try:
        yield
    finally:
        with _LIMIT_LOCK:
            _LIMIT["depth"] -= 1
            if _LIMIT["depth"] == 0:
                _LIMIT["context"].restore_original_limits()
                _LIMIT["context"] = None


def limit_this_thread(n_threads: int) -> None:
    """Limit BLAS in the calling (worker) thread; needed where the limit is per thread (OpenMP)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=max(1, n_threads), user_api="blas")  # lasts as long as the worker thread


def ordered_map(
    function: Callable[..., _T], items: Iterable[Iterable[Any]], threads: int, blas_per_thread: int | None = None
) -> Generator[_T, None, None]:
    """``function(*item)`` for each item, computed by ``threads`` worker threads, yielded in item order.

    At most ``threads + 1`` items are in flight; one thread runs in the caller's. ``blas_per_thread``
    limits BLAS in every worker. Errors come in item order; closing early cancels what has not started.
    """
    if threads <= 1:
        with blas_threads(blas_per_thread):
            for item in items:
                yield function(*item)
        return
    items = iter(items)
    initializer = None if blas_per_thread is None else (lambda: limit_this_thread(blas_per_thread))
    pending: deque[Future[_T]] = deque()
    failure: list[Exception] = []

    def submit_next(pool: ThreadPoolExecutor) -> None:
        if failure:
            return
        try:
            item = next(items)
        except StopIteration:
            return
        except Exception as exc:  # raised once the results before it are out
            failure.append(exc)
            return
        pending.append(pool.submit(function, *item))

    with blas_threads(blas_per_thread):
        pool = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="streamwhiten-worker", initializer=initializer
        )
        try:
            for _ in range(threads + 1):
                submit_next(pool)
            while pending:
                result = pending.popleft().result()
                submit_next(pool)
                yield result
            if failure:
                raise failure[0]
        finally:
            for future in pending:
                future.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
