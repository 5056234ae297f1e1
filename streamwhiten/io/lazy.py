"""Rows for other processes: a picklable stand-in for a source that opens its store only when read.

Open file handles cannot travel to another process (h5py's cannot be pickled at all), so the Dask engine
hands workers a `LazyRows` (`lazy_rows`) instead of the source.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import BadInputError, StoreIOError
from ..options import ReadOptions
from . import remote
from .abc.store import Source
from .reading import open_source


@dataclass(frozen=True)
class LazyRows:
    """A picklable stand-in for a source's rows: each read opens the store by path (with its ``read``
    options), checks its shape is still the one planned, reads and closes; an array for ``dask.array``."""

    path: str
    dataset: str | None
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    label: str
    #: how the store is opened (``dataset`` above wins over its ``dataset``)
    read: ReadOptions = field(default_factory=ReadOptions, repr=False)

    ndim = 2

    def __repr__(self) -> str:  # never show the storage options
        return f"LazyRows({self.label!r}, shape={self.shape})"

    def __getitem__(self, key: Any) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        rows = key[0] if key else slice(None)
        columns = key[1] if len(key) > 1 else slice(None)
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise BadInputError(f"{self.label}: only contiguous row ranges can be read, got {rows!r}")
        start, stop, _ = rows.indices(self.shape[0])
        stop = max(start, stop)
        with open_source(self.path, read=replace(self.read, dataset=self.dataset), min_rows=0) as source:
            if source.shape != self.shape:
                raise StoreIOError(f"{self.label}: changed while being read (shape {source.shape}, was {self.shape})")
            block = source.read(start, stop)
        return block if columns == slice(None) else np.ascontiguousarray(block[:, columns])


def lazy_rows(source: Source) -> LazyRows:
    """A picklable reader of ``source``'s rows for other processes (see `LazyRows`)."""
    path = source.path if remote.is_url(source.path) else os.path.abspath(source.path)
    return LazyRows(path, source.dataset, source.shape, source.dtype, source.label, source.read_options)


__all__ = ["LazyRows", "lazy_rows"]
