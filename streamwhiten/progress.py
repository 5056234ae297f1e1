"""How a long call reports its progress: rows (or steps) done, and the phases it goes through.

Every long call takes ``progress``: a plain ``progress(done, total)`` callable, called as blocks finish,
or a `Reporter`, also told when each phase starts (its name and unit, None for one opaque step) and ends
(its seconds). The library never prints: the command line's reporter draws the bars.

Examples
--------
>>> from streamwhiten.progress import Reporter, phase
>>> class Told(Reporter):
...     def __init__(self):
...         self.said = []
...     def started(self, name, unit):
...         self.said.append(("started", name, unit))
...     def finished(self, name, seconds):
...         self.said.append(("finished", name))
>>> told = Told()
>>> with phase(told, "train eigen:4", None):
...     pass
>>> told.said
[('started', 'train eigen:4', None), ('finished', 'train eigen:4')]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

#: ``progress(done, total)``: a plain callback, or a `Reporter`
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Watch:
    """How a long call reports its progress and is asked to stop, passed unchanged to every engine call.

    ``progress(done, total)`` (a callback or a `Reporter`) is told as blocks finish; ``should_stop()`` turns
    true when a signal asks the work to stop at its next safe point (it saves what it did and raises
    ``InterruptedRunError``); ``guard()`` makes a context in which a signal waits (the save of an engine that
    cannot stop between blocks). None: not at all.
    """

    progress: Progress | None = None
    should_stop: Callable[[], bool] | None = None
    guard: Callable[[], AbstractContextManager] | None = None

    def stop_asked(self) -> bool:
        """Whether a stop was asked for (never, without ``should_stop``)."""
        return self.should_stop is not None and bool(self.should_stop())

    def report(self, done: int, total: int) -> None:
        """Tell ``progress`` that ``done`` of ``total`` are done (nothing without one)."""
        if self.progress is not None:
            self.progress(done, total)


class Reporter:
    """A progress callback that is also told each phase of the work (`started`, `finished`; phases do not
    nest); the base class ignores all of it."""

    def __call__(self, done: int, total: int) -> None:
        """``done`` of ``total`` of the current phase."""

    def started(self, name: str, unit: str | None) -> None:
        """The phase ``name`` began; ``unit``: what its ``done``/``total`` count (None: it reports none)."""

    def finished(self, name: str, seconds: float) -> None:
        """The phase ``name`` ended, after ``seconds`` (not called when it raised)."""


def begin(progress: Progress | None, name: str, unit: str | None = "rows") -> Callable[[], None]:
    """Start the phase ``name`` (only a `Reporter` is told); returns the ``finish()`` that ends it with its
    seconds, to call once its work is done (a phase that raises is never finished)."""
    if not isinstance(progress, Reporter):
        return _nothing
    progress.started(name, unit)
    start = time.perf_counter()

    def finish() -> None:
        progress.finished(name, time.perf_counter() - start)

    return finish


def _nothing() -> None:
    """The ``finish`` of a phase nobody is told of."""


@contextmanager
def phase(progress: Progress | None, name: str, unit: str | None = "rows") -> Iterator[Progress | None]:
    """Run the block as the phase ``name`` (`begin`, then ``finish`` unless it raises); yields ``progress``."""
    finish = begin(progress, name, unit)
    yield progress
    finish()


def steps(progress: Progress | None, total: int) -> Callable[[], None]:
    """A thread-safe ``step()`` that reports one more of ``total`` steps done to ``progress``."""
    import threading

    lock = threading.Lock()
    done = [0]

    def step() -> None:
        with lock:  # the count and its report together: the counts arrive in order
            done[0] += 1
            if progress is not None:
                progress(done[0], total)

    return step


__all__ = ["Progress", "Reporter", "Watch", "begin", "phase", "steps"]
