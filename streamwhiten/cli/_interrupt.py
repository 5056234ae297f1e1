"""SIGINT and SIGTERM for the command line: stop at a safe point, never half-way through a write.

The handlers are installed before anything heavy is imported (see ``__main__``), so a signal that
arrives while the program starts is remembered rather than killing it with a traceback or leaving
files behind. Then, per phase:

- ``deferred()``: work that can stop cleanly (a fit between blocks, an apply, saving a model). The
  first signal only sets :data:`requested`; the work checks it at its next safe point, saves its
  progress and stops. A second signal raises ``KeyboardInterrupt`` at once.
- otherwise: ``KeyboardInterrupt`` at once (a report, an evaluation: nothing to save).

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
from contextlib import contextmanager

#: Set by the first SIGINT/SIGTERM; the library polls it through ``should_stop``.
requested = threading.Event()
#: Name of the first signal received (e.g. ``"SIGTERM"``), or None.
received: list = []

_STARTUP, _DEFERRED, _IMMEDIATE = "startup", "deferred", "immediate"
_state = {"mode": _STARTUP, "previous": None, "pending": None}
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


#: How often a signal that landed in an import looks again whether the import is over (seconds).
_RETRY_S = 0.02


def _handler(signum, frame):
    first = not requested.is_set()
    if first:
        received.append(signal.Signals(signum).name)
        requested.set()
    mode = _state["mode"]
    if mode == _IMMEDIATE or (mode == _DEFERRED and not first):
        _raise_outside_import(frame)


def _raise_outside_import(frame):
    if _in_import(frame) and hasattr(signal, "setitimer"):
        _state["pending"] = _state["mode"]
        signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
        return
    _state["pending"] = None
    raise KeyboardInterrupt


def _retry(signum, frame):
    """SIGALRM: raise the signal that landed in an import once the import is over, if the program is
    still where it would have raised (a deferred block entered since then stops at its next safe point)."""
    pending, _state["pending"] = _state["pending"], None
    if pending is not None and pending == _state["mode"]:
        _raise_outside_import(frame)


def _in_import(frame) -> bool:
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
    _state["previous"] = {sig: signal.signal(sig, _handler) for sig in _SIGNALS}
    if hasattr(signal, "SIGALRM"):
        _state["previous"][signal.SIGALRM] = signal.signal(signal.SIGALRM, _retry)
    if not getattr(sys.unraisablehook, "_streamwhiten", False):
        sys.unraisablehook = _quiet_unraisable(sys.unraisablehook)
    return True


def _quiet_unraisable(previous):
    """A signal's KeyboardInterrupt that lands in a callback Python cannot raise from (a weakref's, a
    destructor's) is only recorded: the stop was already requested, and the traceback would be noise."""

    def hook(unraisable):
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            return
        previous(unraisable)

    hook._streamwhiten = True
    return hook


def uninstall() -> None:
    """Put back the handlers that were there before :func:`install`."""
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
    """From now on (outside :func:`deferred`), a signal raises ``KeyboardInterrupt`` at once."""
    _state["mode"] = _IMMEDIATE


@contextmanager
def deferred():
    """Within this block the first signal only sets :data:`requested`; yields ``requested.is_set``."""
    before = _state["mode"]
    _state["mode"] = _DEFERRED
    try:
        yield requested.is_set
    finally:
        _state["mode"] = before


def signal_name() -> str:
    return received[0] if received else "a signal"
