"""SIGINT and SIGTERM for the command line: stop at a safe point, never half-way through a write.

The handlers are installed before anything heavy is imported (``__main__``): a signal while starting is
remembered. In ``work(stoppable=True)`` (a fit, an apply, a save) the first signal only sets `requested`,
checked at the next safe point; a second, or any signal in ``work(stoppable=False)`` or outside work,
raises ``KeyboardInterrupt`` at once. Once the work is complete a signal is only recorded (a note, not a
failure: ``cli.app._finish``), and `finish` ignores both so that shutdown cannot be killed.
``KeyboardInterrupt`` is raised once at most, and never inside an import (some C extensions turn it into
an ``ImportError`` or die): there it waits for the import's end (a short SIGALRM timer). The library sees
only a ``should_stop()`` callable.
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
    """SIGALRM: raise a signal that landed in an import once it is over, if still in the same mode."""
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
    _state.update(mode=_STARTUP, pending=None, raised=False)
    previous: dict[int, Any] = {sig: signal.signal(sig, _handler) for sig in _SIGNALS}
    _state["previous"] = previous
    if hasattr(signal, "SIGALRM"):
        previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, _retry)
    if not getattr(sys.unraisablehook, "_streamwhiten", False):
        sys.unraisablehook = _quiet_unraisable(sys.unraisablehook)
    return True


def _quiet_unraisable(previous: Callable[[Any], object]):
    """Drop an unraisable KeyboardInterrupt (a callback's, a destructor's), and, once a signal came, any
    destructor's error (a half-built object's): the stop was requested, the traceback would be noise."""

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
    """The work of a command: with ``stoppable`` the first signal only sets `requested` (yields
    ``should_stop``), else it raises at once (yields None); once the block ends cleanly, signals are only
    recorded (`hold`)."""
    before = _state["mode"]
    _state["mode"] = _DEFERRED if stoppable else _IMMEDIATE
    try:
        yield requested.is_set if stoppable else None
    except BaseException:
        _state["mode"] = before
        raise
    _state["mode"] = _STARTUP


def finish() -> bool:
    """Before exit (main thread only): ignore SIGINT and SIGTERM, which shutdown's default handlers would
    die of, and stop the retry timer; returns whether a signal was ever received."""
    _state.update(mode=_STARTUP, pending=None)
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
