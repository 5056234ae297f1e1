"""SIGINT and SIGTERM for the command line: stop at a safe point, never half-way through a write.

The handlers are installed before anything heavy is imported (see ``__main__``), so a signal that
arrives while the program starts is remembered rather than killing it with a traceback or leaving
files behind. Then, per phase:

- ``work(stoppable=True)``: work that can stop cleanly (a fit between blocks, an apply, saving a model).
  The first signal only sets `requested`; the work checks it at its next safe point, saves its
  progress and stops. A second signal raises ``KeyboardInterrupt`` at once.
- ``work(stoppable=False)``, and outside any work: ``KeyboardInterrupt`` at once (a report, an
  evaluation, the Dask engine: nothing to save).
- once the work of the command is complete (its block ended without an exception) and while the
  program reports how it ended, a signal is only recorded: the exit code says the work is done, and a
  note says the signal came after it (``cli.app._finish``).
- at the very end, `finish` ignores both signals: at interpreter shutdown Python puts back the
  default handlers (which kill the process: exit -15 or -2) for every signal it had a handler for, but
  leaves an ignored one ignored, so nothing can kill the process between its last word and its exit.

``KeyboardInterrupt`` is raised once at most: a further signal, arriving while the program unwinds or
reports the first, is only recorded, so cleanup code and the report are never cut short.

Never inside an import: an exception raised while a module (a C extension above all) is being
initialised is turned by some libraries into an ``ImportError`` with a traceback, or leaves the
interpreter to die by SIGINT on exit. A signal that lands in an import is raised as soon as the
import is over (polled with a short SIGALRM timer where the platform has one).

Only this module and ``cli`` touch signal handlers; the library sees a ``should_stop()`` callable.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from types import FrameType
from typing import Any

#: Set by the first SIGINT/SIGTERM; the library polls it through ``should_stop``.
requested = threading.Event()
#: Name of the first signal received (e.g. ``"SIGTERM"``), or None.
received: list = []

_STARTUP, _DEFERRED, _IMMEDIATE = "startup", "deferred", "immediate"
_state: dict[str, Any] = {"mode": _STARTUP, "previous": None, "pending": None, "raised": False}
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


#: How often a signal that landed in an import looks again whether the import is over (seconds).
_RETRY_S = 0.02


def _handler(signum: int, frame: FrameType | None):
    first = not requested.is_set()
    if first:
        received.append(signal.Signals(signum).name)
        requested.set()
    mode = _state["mode"]
    if mode == _IMMEDIATE or (mode == _DEFERRED and not first):
        _raise_outside_import(frame)


def _raise_outside_import(frame: FrameType | None):
    if _state["raised"]:  # once: the first is being handled (cleanup, the report)
        return
    if _in_import(frame) and hasattr(signal, "setitimer"):
        _state["pending"] = _state["mode"]
        signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
        return
    _state["pending"] = None
    _state["raised"] = True
    raise KeyboardInterrupt


def _retry(signum: int, frame: FrameType | None):
    """SIGALRM: raise the signal that landed in an import once the import is over, if the program is
    still where it would have raised (a stoppable `work` entered since then stops at its next safe point)."""
    pending, _state["pending"] = _state["pending"], None
    if pending is not None and pending == _state["mode"]:
        _raise_outside_import(frame)


def _in_import(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def install() -> bool:
    """Install the handlers (main thread only), in start-up mode; True if this call installed them."""
    if _state["previous"] is not None or threading.current_thread() is not threading.main_thread():
        return False
    requested.clear()
    received.clear()
    _state["mode"] = _STARTUP
    _state["pending"] = None
    _state["raised"] = False
    previous: dict[int, Any] = {sig: signal.signal(sig, _handler) for sig in _SIGNALS}
    _state["previous"] = previous
    if hasattr(signal, "SIGALRM"):
        previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, _retry)
    if not getattr(sys.unraisablehook, "_streamwhiten", False):
        sys.unraisablehook = _quiet_unraisable(sys.unraisablehook)
    return True


def _quiet_unraisable(previous: Callable[[Any], object]):
    """A signal's KeyboardInterrupt that lands in a callback Python cannot raise from (a weakref's, a
    destructor's) is only recorded: the stop was already requested, and the traceback would be noise. So
    is, once a signal was received, any error of a destructor: a KeyboardInterrupt raised inside a
    library's constructor leaves a half-built object whose destructor then fails (zipfile's, for one)."""

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) or requested.is_set():
            return
        previous(unraisable)

    hook._streamwhiten = True  # type: ignore[attr-defined]
    return hook


def uninstall() -> None:
    """Put back the handlers that were there before `install`."""
    previous = _state["previous"]
    _state["pending"] = None
    if previous is not None and threading.current_thread() is threading.main_thread():
        if hasattr(signal, "setitimer"):
            signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, old in previous.items():
            signal.signal(sig, old)
    _state["previous"] = None


def hold() -> None:
    """From now on a signal is only recorded (while the program starts, and while it reports how it ended)."""
    _state["mode"] = _STARTUP


def start_immediate() -> None:
    """From now on (outside a stoppable `work`), a signal raises ``KeyboardInterrupt`` at once."""
    _state["mode"] = _IMMEDIATE


@contextmanager
def work(stoppable: bool = True):
    """The work of a command: with ``stoppable``, the first signal only sets `requested`, which asks it to
    stop at its next safe point (yields ``should_stop``); otherwise a signal raises ``KeyboardInterrupt`` at
    once (yields None).
    When the block ends without an exception, the work is complete: from then on a signal is only
    recorded (`hold`), so it cannot turn finished work into an interruption."""
    before = _state["mode"]
    _state["mode"] = _DEFERRED if stoppable else _IMMEDIATE
    try:
        yield requested.is_set if stoppable else None
    except BaseException:
        _state["mode"] = before
        raise
    _state["mode"] = _STARTUP


def finish() -> bool:
    """The program is about to exit: ignore SIGINT and SIGTERM from now on (Python's shutdown would put the
    default handlers back, and a signal then would kill the process), and stop the retry timer. Returns
    whether a signal was received at any time. In the main thread only (elsewhere: does nothing)."""
    _state["mode"] = _STARTUP
    _state["pending"] = None
    if threading.current_thread() is threading.main_thread() and _state["previous"] is not None:
        for sig in _SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        if hasattr(signal, "setitimer"):
            signal.setitimer(signal.ITIMER_REAL, 0)
        if hasattr(signal, "SIGALRM"):
            signal.signal(signal.SIGALRM, signal.SIG_IGN)
    return requested.is_set()


def signal_name() -> str:
    return received[0] if received else "a signal"
