"""A seeded sample of a store's rows: what a vector code that learns from data trains on."""

from __future__ import annotations

import os

import numpy as np
import numpy.typing as npt

from ..errors import BadInputError
from ..progress import Progress
from .abc import Source
from .reading import open_source


def sample_rows(source: object, n_rows: int, seed: int, progress: Progress | None = None) -> npt.NDArray[np.float64]:
    """``n_rows`` rows of ``source`` (an array, a spec or a Source; all of them when it has fewer) as
    float64, drawn without replacement by ``numpy.random.default_rng(seed)`` and read in row order, block
    by block (only the blocks that hold one); a drawn row holding NaN or Inf is refused, naming it.
    ``progress(rows_passed, n_rows_of_the_store)`` is called after each block read."""
    if not isinstance(source, (str, os.PathLike, Source)):
        rows = np.asarray(source)
        if rows.ndim != 2 or rows.dtype.kind != "f":
            raise BadInputError(f"a sample is drawn from a 2-D array of float rows, got {rows.dtype} {rows.shape}")
        chosen = np.sort(np.random.default_rng(seed).choice(rows.shape[0], min(n_rows, rows.shape[0]), replace=False))
        out: npt.NDArray[np.float64] = rows[chosen].astype(np.float64)
        label = "the sample array"
    else:
        store = open_source(source if isinstance(source, Source) else os.fspath(source))
        try:
            total = store.n_rows
            chosen = np.sort(np.random.default_rng(seed).choice(total, min(n_rows, total), replace=False))
            block = max(1, store.default_block_rows())
            out = np.empty((chosen.size, store.n_features), dtype=np.float64)
            done = 0
            for start in range(0, total, block):
                stop = min(total, start + block)
                last = int(np.searchsorted(chosen, stop))
                if last > done:
                    out[done:last] = store.read(start, stop)[chosen[done:last] - start]
                    done = last
                    if progress is not None:
                        progress(stop, total)
            label = store.label
        finally:
            if not isinstance(source, Source):
                store.close()
    finite = np.isfinite(out).all(axis=1)
    if not finite.all():
        raise BadInputError(f"{label}: row {int(chosen[np.argmin(finite)])} of the sample holds NaN or Inf")
    return out


__all__ = ["sample_rows"]
