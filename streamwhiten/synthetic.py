"""Deterministic anisotropic embeddings, generated block by block, for the demo, tests and benchmarks.

Rows look like sentence embeddings from a BERT-like model: a large common mean, a few dominant
directions and a long tail of small ones (``x = mu + z diag(s) R`` with a decaying spectrum ``s`` and a
random rotation ``R``). Rows are generated in fixed blocks of ``GENERATOR_BLOCK`` rows, each seeded from
``(seed, block index)``, so any reader or writer chunking sees the same values.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

GENERATOR_BLOCK = 8192


def _basis(n_features: int, seed: int):
    rng = np.random.default_rng([seed, 0])
    rotation, _ = np.linalg.qr(rng.standard_normal((n_features, n_features)))
    spectrum = 1.0 / (1.0 + np.arange(n_features)) ** 0.8
    mean = rng.standard_normal(n_features) * 2.0
    return mean, spectrum[:, None] * rotation.T


def generate_rows(
    n_rows: int,
    n_features: int,
    seed: int = 0,
    dtype: npt.DTypeLike = "float32",
    start: int = 0,
    stop: int | None = None,
) -> np.ndarray:
    """Rows ``[start, stop)`` of the deterministic data set ``(n_rows, n_features, seed)``."""
    stop = n_rows if stop is None else min(stop, n_rows)
    mean, mixing = _basis(n_features, seed)
    out = np.empty((max(0, stop - start), n_features), dtype=dtype)
    first = start // GENERATOR_BLOCK
    for block in range(first, (stop - 1) // GENERATOR_BLOCK + 1 if stop > start else first):
        lo = block * GENERATOR_BLOCK
        rows = min(GENERATOR_BLOCK, n_rows - lo)
        z = np.random.default_rng([seed, 1, block]).standard_normal((rows, n_features))
        values = mean + z @ mixing
        a, b = max(start, lo), min(stop, lo + rows)
        out[a - start : b - start] = values[a - lo : b - lo]
    return out


def write_store(
    path: str,
    n_rows: int,
    n_features: int,
    seed: int = 0,
    dtype: npt.DTypeLike = "float32",
    chunk_rows: int = 8192,
    progress: Callable[[int, int], None] | None = None,
    checksums: bool = True,
) -> str:
    """Write the data set to an HDF5 file (``.h5``, as its dataset ``embeddings``) or a Zarr store (``.zarr``,
    format 3), replacing an old one written by streamwhiten (anything else at ``path`` is refused, as by every
    writer); returns its spec. Written like every streamwhiten output: under a temporary name, renamed when
    complete, with a checksum per chunk unless ``checksums`` is False (a plain store, read without a
    verify-and-copy step).
    """
    from .io import open_output
    from .output_plan import OutputPlan

    chunk_rows = min(chunk_rows, n_rows)
    spec = f"{path}:/embeddings" if open_output(path).named else path
    plan = OutputPlan(n_rows, n_features, np.dtype(dtype).name, chunk_rows=chunk_rows, checksums=checksums)
    sink = open_output(spec).create(plan, overwrite=True)
    with sink:
        step = max(chunk_rows, (64 << 20) // (n_features * np.dtype(dtype).itemsize) // chunk_rows * chunk_rows)
        for start in range(0, n_rows, step):
            stop = min(n_rows, start + step)
            sink.write(start, generate_rows(n_rows, n_features, seed, dtype, start, stop))
            if progress is not None:
                progress(stop, n_rows)
        sink.commit(overwrite=True)
    return spec
