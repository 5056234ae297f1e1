"""The abstract store: what every backend implements (`Source`, `Sink`), apart from any backend.

As zarr 3 cuts it (``zarr.abc.store``): the interface and its capability attributes here, one module per
backend beside it (``streamwhiten.io.hdf5``, ``zarr``, ``npy``, ``parquet``, ``lance``), registered once
each in ``streamwhiten.io.registry``.
"""

from __future__ import annotations

from .store import Sink, Source

__all__ = ["Sink", "Source"]
