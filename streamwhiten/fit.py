"""The fit loop: stream row blocks from one or more sources into a :class:`~streamwhiten.stats.Moments`.

A reader thread fetches the next block while the current one is centred and multiplied (numba
kernels and BLAS release the GIL), so reading hides behind the arithmetic. Blocks are folded in a
fixed order (source by source, block by block), so the same inputs and block size always give the
same bits.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import numpy as np

from . import stats
from .errors import BadInputError, NonFiniteError
from .stores import Source, fingerprint, open_source

#: ``progress(rows_done, rows_total)``, called after every block.
ProgressCallback = Callable[[int, int], None]

_DONE = object()


def prefetch(items: Iterable, depth: int = 1) -> Iterator:
    """Yield ``items`` while a background thread produces up to ``depth`` ahead; re-raises its errors."""
    slots: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def produce():
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        slots.put(("item", item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put(("done", _DONE))
        except BaseException as exc:  # handed to the consumer, raised there
            slots.put(("error", exc))

    thread = threading.Thread(target=produce, name="streamwhiten-reader", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = slots.get()
            if kind == "done":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            try:
                slots.get_nowait()
            except queue.Empty:
                thread.join(timeout=0.05)


def read_blocks(source: Source, block_rows: int | None = None, start: int = 0, stop: int | None = None) -> Iterator:
    """``(start, rows)`` for consecutive blocks of ``source``."""
    for begin, end in source.blocks(block_rows, start, stop):
        yield begin, source.read(begin, end)


@dataclass
class FitResult:
    """What a fit produced: the state plus what it read."""

    state: stats.Moments
    n_skipped: int = 0
    sources: list = field(default_factory=list)
    n_blocks: int = 0
    seconds: float = 0.0

    @property
    def rows_per_second(self) -> float:
        return self.state.n_rows / self.seconds if self.seconds > 0 else float("nan")


def open_sources(specs, dataset: str | None = None) -> list[Source]:
    """Open every spec and check they share one width; a single source needs at least 2 rows."""
    if isinstance(specs, (str, Source)) or hasattr(specs, "__fspath__"):
        specs = [specs]
    specs = list(specs)
    if not specs:
        raise BadInputError("no input given")
    min_rows = 2 if len(specs) == 1 else 1
    sources: list[Source] = []
    try:
        for spec in specs:
            sources.append(open_source(spec, dataset, min_rows=min_rows))
            if sources[-1].n_features != sources[0].n_features:
                raise BadInputError(
                    f"{sources[-1].label}: has {sources[-1].n_features} columns but "
                    f"{sources[0].label} has {sources[0].n_features}"
                )
    except BaseException:
        for source in sources:
            source.close()
        raise
    return sources


def block_moments(
    rows: np.ndarray, begin: int, label: str, precision: str = "auto", skip_nonfinite: bool = False,
    overwrite_input: bool = False,
) -> tuple[stats.Moments, int]:
    """Moments of one block read at row ``begin`` of ``label``, and how many of its rows were skipped.

    The per-block step of every engine. A row holding NaN or Inf raises :class:`NonFiniteError`
    naming ``label`` and the row, unless ``skip_nonfinite`` (then it is dropped and counted).
    """
    n_skipped = 0
    if skip_nonfinite:
        rows, n_skipped = stats.drop_nonfinite(rows)
    try:
        return stats.chunk_moments(rows, precision, overwrite_input=overwrite_input), n_skipped
    except NonFiniteError as exc:
        raise NonFiniteError(
            f"{label}: row {begin + exc.row} holds NaN or Inf (skip such rows with --skip-nonfinite)",
            row=begin + exc.row,
        ) from None


def accumulate_source(
    state: stats.Moments,
    source: Source,
    precision: str = "auto",
    skip_nonfinite: bool = False,
    block_rows: int | None = None,
    start: int = 0,
    stop: int | None = None,
    on_block: Callable[[stats.Moments, int, int], None] | None = None,
) -> tuple[stats.Moments, int]:
    """Fold rows ``[start, stop)`` of ``source`` into ``state``; returns the new state and rows skipped.

    ``on_block(state, block_stop, n_skipped)`` is called after each block (progress, checkpoints).
    """
    n_skipped = 0
    for begin, rows in prefetch(read_blocks(source, block_rows, start, stop)):
        end = begin + rows.shape[0]
        chunk, skipped = block_moments(rows, begin, source.label, precision, skip_nonfinite, overwrite_input=True)
        state = stats.merge(state, chunk)
        n_skipped += skipped
        if on_block is not None:
            on_block(state, end, n_skipped)
    return state, n_skipped


def check_enough_rows(state: stats.Moments, sources) -> None:
    """A fit needs at least two finite rows in all."""
    if state.n_rows < 2:
        raise BadInputError(
            f"only {state.n_rows} finite row(s) in {', '.join(s.label for s in sources)}; at least 2 are needed"
        )


def fit_sources(
    specs,
    dataset: str | None = None,
    precision: str = "auto",
    skip_nonfinite: bool = False,
    block_rows: int | None = None,
    progress: ProgressCallback | None = None,
) -> FitResult:
    """One pass over every source, in order; returns the merged statistics."""
    stats.working_dtype(np.float32, precision)  # validate before any reading
    sources = open_sources(specs, dataset)
    try:
        total = sum(source.n_rows for source in sources)
        state = stats.Moments.empty(sources[0].n_features)
        n_skipped, n_blocks, done = 0, 0, 0
        began = time.perf_counter()
        fingerprints = []
        for source in sources:
            fingerprints.append(fingerprint(source))
            offset = done

            def on_block(_state, block_stop, _skipped, offset=offset):
                nonlocal n_blocks
                n_blocks += 1
                if progress is not None:
                    progress(offset + block_stop, total)

            state, skipped = accumulate_source(state, source, precision, skip_nonfinite, block_rows, on_block=on_block)
            n_skipped += skipped
            done += source.n_rows
        check_enough_rows(state, sources)
        return FitResult(state, n_skipped, fingerprints, n_blocks, time.perf_counter() - began)
    finally:
        for source in sources:
            source.close()
