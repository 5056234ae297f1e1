"""What a command shows while it works (`Console`, the command line's `Reporter`): a bar (or a spinner,
for a phase that counts nothing) per phase on a terminal, then the phase's timed line in the form of
``run``'s log; piped, only those lines, a phase still running after `ANNOUNCE_AFTER` seconds announced so
that a long opaque step is never silent; nothing with ``--quiet``.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import click

from ..progress import Reporter

#: The lines of ``run``'s log (and of every command's phases): a timestamp, then the message.
LOG_FORMAT = "%(asctime)s streamwhiten: %(message)s"
LOG_DATE = "%Y-%m-%dT%H:%M:%S%z"
#: Seconds a phase runs, piped, before its start is announced.
ANNOUNCE_AFTER = 2.0
#: Seconds between the spinner's frames (and the checks for a phase to announce).
TICK = 0.25
SPINNER = "|/-\\"


def fmt_seconds(seconds: float) -> str:
    """``0.4 s``, ``38.6 s``, ``6 min 12 s``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


class Console(Reporter):
    """The command ``command``'s progress on stderr (rows outside a phase draw the command's own bar)."""

    def __init__(self, command: str, terminal: bool) -> None:
        self.command, self.terminal = command, terminal
        self._lock = threading.Lock()
        self._bar: Any = None
        self._phase: tuple[str, str | None, float] | None = None
        self._announced = False
        self._closed = threading.Event()
        self._ticker: threading.Thread | None = None

    def __call__(self, done: int, total: int) -> None:
        if not self.terminal:
            return
        with self._lock:
            if self._phase is not None and self._phase[1] is None:
                return  # a spinner: the phase said it counts nothing
            if self._bar is None:
                self._bar = self._new_bar(self.command if self._phase is None else self._phase[0], "rows")
            if self._bar.total != total:
                self._bar.total = total
            self._bar.update(done - self._bar.n)

    def started(self, name: str, unit: str | None) -> None:
        with self._lock:
            self._close_bar()
            self._phase, self._announced = (name, unit, time.perf_counter()), False
            if self.terminal:
                self._bar = self._new_bar(name, unit)
            if self._ticker is None:
                self._ticker = threading.Thread(target=self._tick, name="streamwhiten-progress", daemon=True)
                self._ticker.start()

    def finished(self, name: str, seconds: float) -> None:
        with self._lock:
            self._close_bar()
            self._phase = None
            self._line(f"{name}: {fmt_seconds(seconds)}")

    def close(self) -> None:
        """Stop the ticker and take the bar off the screen (a phase cut short says nothing more)."""
        self._closed.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            self._close_bar()
            self._phase = None

    def _tick(self) -> None:
        frame = 0
        while not self._closed.wait(TICK):
            with self._lock:
                if self._phase is None:
                    continue
                name, unit, start = self._phase
                if self.terminal and self._bar is not None and unit is None:
                    frame += 1
                    self._bar.set_description_str(f"{name} {SPINNER[frame % len(SPINNER)]}", refresh=True)
                elif not self.terminal and not self._announced and time.perf_counter() - start >= ANNOUNCE_AFTER:
                    self._announced = True
                    self._line(f"{name} ...")

    def _new_bar(self, name: str, unit: str | None) -> Any:
        from tqdm import tqdm

        if unit is None:  # nothing to count: the phase's name, a spinner and the time so far
            return tqdm(desc=name, bar_format="{desc} {elapsed}", leave=False, file=sys.stderr)
        return tqdm(desc=name, unit=unit, unit_scale=True, dynamic_ncols=True, leave=False, file=sys.stderr)

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _line(self, text: str) -> None:
        stamp = time.strftime(LOG_DATE, time.localtime())
        try:
            click.echo(f"{stamp} streamwhiten: {self.command}: {text}", err=True)
        except OSError:  # stderr that cannot be written: the work goes on, its summary says how it went
            pass


__all__ = ["ANNOUNCE_AFTER", "LOG_DATE", "LOG_FORMAT", "Console", "fmt_seconds"]
