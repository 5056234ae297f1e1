"""SIGINT and SIGTERM for the command line: stop at a safe point, never half-way through a write.

The handlers are installed before anything heavy is imported (see ``__main__``), so a signal that
arrives while the program starts is remembered rather than killing it with a traceback or leaving
files behind. Then, per phase:

- ``deferred()``: work that can stop cleanly (a fit between blocks, an apply, saving a model). The
  first signal only sets :data:`requested`; the work checks it at its next safe point, saves its
  progress and stops. A second signal raises ``KeyboardInterrupt`` at once.
- otherwise: ``KeyboardInterrupt`` at once (a report, an evaluation: nothing to save).

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
_state = {"mode": _STARTUP, "previous": None}
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _handler(signum, frame):
    first = not requested.is_set()
    if first:
        received.append(signal.Signals(signum).name)
        requested.set()
    mode = _state["mode"]
    if mode == _IMMEDIATE or (mode == _DEFERRED and not first):
        raise KeyboardInterrupt


def install() -> bool:
    """Install the handlers (main thread only), in start-up mode; True if this call installed them."""
    if _state["previous"] is not None or threading.current_thread() is not threading.main_thread():
        return False
    requested.clear()
    received.clear()
    _state["mode"] = _STARTUP
    _state["previous"] = {sig: signal.signal(sig, _handler) for sig in _SIGNALS}
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
    if previous is not None and threading.current_thread() is threading.main_thread():
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
