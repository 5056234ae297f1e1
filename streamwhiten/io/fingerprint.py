"""Fingerprints: what identifies the first rows of a source, cheaply (a `Fingerprint`).

Where the array is, its shape, dtype and chunking, a digest of how its rows are stored where the backend
has one (``layout_sha256``), the backend's extras (size, ETag, version) and the hash of a few sampled row
ranges (``sha256_sampled``: start, quartiles, end), so an append-only store still matches the fingerprint
of its earlier prefix. `describe` reads only metadata; a pass hashes the sampled rows with a `Sampler`.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import replace

import numpy as np

from ..records import Fingerprint
from .abc.store import Source


def fingerprint(source: Source, n_rows: int | None = None) -> Fingerprint:
    """Identity of the first ``n_rows`` rows of ``source`` (all by default), cheap to compute: `describe`
    and the hash of the sampled rows, read now (a pass that reads the rows anyway uses a `Sampler`)."""
    result = describe(source, n_rows)
    assert result.n_rows is not None
    return replace(result, sha256_sampled=Sampler(source, result.n_rows).hexdigest(source))


def describe(source: Source, n_rows: int | None = None) -> Fingerprint:
    """A `fingerprint` without its hash of sampled rows (``sha256_sampled``): only what the metadata says."""
    n_rows = source.n_rows if n_rows is None else int(n_rows)
    path, dataset = source.location
    return Fingerprint(
        path=path,
        dataset=dataset,
        n_rows=n_rows,
        n_features=source.n_features,
        dtype=str(source.dtype),
        chunk_rows=source.chunk_rows or 0,
        layout_sha256=source.layout_digest(n_rows),
        **source.fingerprint_extra(),
    )


class Sampler:
    """The rows a fingerprint of the first ``n_rows`` rows of ``source`` hashes, copied out of blocks as a
    pass reads them (`offer`), so the pass needs no reads of its own. Thread-safe."""

    def __init__(self, source: Source, n_rows: int | None = None) -> None:
        n_rows = source.n_rows if n_rows is None else int(n_rows)
        self.ranges = source.sample_ranges(n_rows)
        self.rows = [np.empty((stop - start, source.n_features), source.dtype) for start, stop in self.ranges]
        self.seen = [np.zeros(stop - start, bool) for start, stop in self.ranges]
        self._lock = threading.Lock()

    def offer(self, start: int, rows: np.ndarray) -> None:
        """Keep the sampled rows among ``rows`` (from row ``start``; widened from float16 is fine: exact),
        before they are changed in place (centred)."""
        stop = start + len(rows)
        with self._lock:
            for (first, last), kept, seen in zip(self.ranges, self.rows, self.seen, strict=True):
                low, high = max(first, start), min(last, stop)
                if low < high:
                    kept[low - first : high - first] = rows[low - start : high - start]
                    seen[low - first : high - first] = True

    def hexdigest(self, source: Source, below: int | None = None) -> str:
        """The hash of the sampled rows (``sha256_sampled``), reading from ``source`` those not offered; with
        ``below``, of the sampled rows before row ``below`` only (a checkpoint of a source read that far)."""
        with self._lock:
            clipped = [
                (index, first, last if below is None else min(last, below))
                for index, (first, last) in enumerate(self.ranges)
                if below is None or first < below
            ]
            missing = [
                (index, first, last) for index, first, last in clipped if not self.seen[index][: last - first].all()
            ]
            reads = _read_ranges(source, [(first, last) for _, first, last in missing])
            for (index, first, last), rows in zip(missing, reads, strict=True):
                self.rows[index][: last - first] = rows
                self.seen[index][: last - first] = True
            digest = hashlib.sha256()
            for index, first, last in clipped:
                digest.update(np.ascontiguousarray(self.rows[index][: last - first]).tobytes())
            return digest.hexdigest()


def _read_ranges(source: Source, ranges: list[tuple[int, int]]) -> list[np.ndarray]:
    """Rows of each of ``ranges``, read in parallel where the store's compressed chunks are decoded here."""
    if source.decoder is None or len(ranges) < 2:
        return [source.read(start, stop) for start, stop in ranges]
    from concurrent.futures import ThreadPoolExecutor

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    with ThreadPoolExecutor(max(1, min(4, cores, len(ranges))), thread_name_prefix="streamwhiten-sample") as pool:
        return list(pool.map(lambda rows: source.read(*rows), ranges))


__all__ = ["Sampler", "describe", "fingerprint"]
