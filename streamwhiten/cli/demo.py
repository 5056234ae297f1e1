"""The built-in example behind ``streamwhiten demo``: generate, fit, apply, check, and time each step."""

from __future__ import annotations

import os
import time

import numpy as np

from ..core.model import finalize, save_model
from ..core.stats import Moments, block_moments, covariance, update
from ..engine.apply import apply_model
from ..engine.fit import fit_sources
from ..io import open_source
from ..synthetic import write_store


def _mean_pair_cosine(rows: np.ndarray, seed: int = 0, n_pairs: int = 2000) -> float:
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, rows.shape[0], size=(2, n_pairs))
    a, b = rows[i].astype(np.float64), rows[j].astype(np.float64)
    return float(np.mean((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def run_demo(directory, rows=100_000, dim=256, k=64, chunk_rows=8192, seed=0, progress=None) -> dict:
    """Generate a store in ``directory``, fit beta=gamma=1, apply with ``k`` dims; returns a summary."""
    timings = {}
    began = time.perf_counter()
    input_path = os.path.join(directory, "demo-embeddings.h5")
    output_path = os.path.join(directory, "demo-whitened.zarr")
    model_path = os.path.join(directory, "demo-model.npz")

    def stage(offset):
        return None if progress is None else (lambda done, total: progress(offset * rows + done, 3 * rows))

    start = time.perf_counter()
    block_moments(np.ones((4, 4), np.float32))  # compile the kernels (or load them from cache) once
    timings["compile"] = time.perf_counter() - start

    start = time.perf_counter()
    spec = write_store(input_path, rows, dim, seed=seed, chunk_rows=chunk_rows, progress=stage(0))
    timings["generate"] = time.perf_counter() - start

    start = time.perf_counter()
    result = fit_sources(spec, progress=stage(1))
    model = finalize(result.state, beta=1.0, gamma=1.0, n_components=k, sources=result.sources)
    save_model(model, model_path)
    timings["fit"] = time.perf_counter() - start

    start = time.perf_counter()
    apply_model(model, spec, output_path, normalize=True, overwrite=True, progress=stage(2))
    timings["apply"] = time.perf_counter() - start

    # Check the transform the way a user would: stream the input through it again and measure the
    # covariance of the (unnormalised) output, which whitening should have made the identity.
    check = Moments.empty(k)
    with open_source(spec) as source:
        sample = source.read(0, min(rows, 20_000))
        for begin, stop in source.blocks():
            check = update(check, model.transform(source.read(begin, stop)).astype(np.float64))
    with open_source(output_path) as sink:
        whitened_sample = sink.read(0, min(rows, 20_000))
    identity_error = float(np.abs(covariance(check) - np.eye(k)).max())
    timings["total"] = time.perf_counter() - began
    return {
        "input": spec,
        "output": output_path,
        "model": model_path,
        "rows": rows,
        "dim": dim,
        "k": k,
        "n_chunks": -(-rows // chunk_rows),
        "effective_dimension": model.effective_dimension,
        "explained_variance": float(model.explained_variance_ratio[:k].sum()),
        "mean_cosine_raw": _mean_pair_cosine(sample, seed),
        "mean_cosine_whitened": _mean_pair_cosine(whitened_sample, seed),
        "identity_error": identity_error,
        "seconds": timings,
    }
