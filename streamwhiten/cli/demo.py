"""``streamwhiten demo``: the whole job on a built-in example (generate, fit, apply, check), each step timed.

The example runs through the public pipeline (``streamwhiten.fit`` and ``streamwhiten.apply``), as a
user's code would.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from ._common import emit, fmt_rate, progress_bar
from ._options import json_option, quiet_option, spec_type

if TYPE_CHECKING:
    from ..core.model import WhiteningModel


def _mean_pair_cosine(rows: np.ndarray, seed: int = 0, n_pairs: int = 2000) -> float:
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, rows.shape[0], size=(2, n_pairs))
    a, b = rows[i].astype(np.float64), rows[j].astype(np.float64)
    return float(np.mean((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))))


def run_demo(
    directory: str,
    rows: int = 100_000,
    dim: int = 256,
    k: int = 64,
    chunk_rows: int = 8192,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Generate a store in ``directory``, fit beta=gamma=1, apply with ``k`` dims; returns a summary."""
    from ..core.stats import block_moments
    from ..options import ApplyOptions, FitOptions, Setting
    from ..pipeline import apply, fit
    from ..progress import Watch
    from ..synthetic import write_store

    timings = {}
    began = time.perf_counter()
    input_path = os.path.join(directory, "demo-embeddings.h5")
    output_path = os.path.join(directory, "demo-whitened.zarr")
    model_path = os.path.join(directory, "demo-model.npz")

    def stage(offset: int):
        return None if progress is None else (lambda done, total: progress(offset * rows + done, 3 * rows))

    def timed(name: str, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = step(*args, **kwargs)
        timings[name] = time.perf_counter() - start
        return result

    timed("compile", block_moments, np.ones((4, 4), np.float32))  # compile the kernels (or load them from cache) once
    spec = timed("generate", write_store, input_path, rows, dim, seed=seed, chunk_rows=chunk_rows, progress=stage(0))
    setting, options = Setting(n_components=k), FitOptions(overwrite=True)
    model = timed("fit", fit, spec, model_path, setting=setting, options=options, watch=Watch(stage(1))).model
    applied = ApplyOptions(normalize=True, overwrite=True)
    timed("apply", apply, model, spec, output_path, options=applied, watch=Watch(stage(2)))
    checked = _check(model, spec, output_path, seed)
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
        **checked,
        "seconds": timings,
    }


def _check(model: WhiteningModel, spec: str, output_path: str, seed: int) -> dict[str, float]:
    """Check as a user would: the covariance of the output before normalising (the identity, if whitened)
    and the mean cosine of random pairs, raw and in the output written."""
    from ..core.stats import Moments, covariance, update
    from ..io import open_source

    check = Moments.empty(model.n_components)
    with open_source(spec) as source:
        sample = source.read(0, min(source.n_rows, 20_000))
        for begin, stop in source.blocks():
            check = update(check, model.transform(source.read(begin, stop)).astype(np.float64))
    with open_source(output_path) as sink:
        whitened_sample = sink.read(0, min(sink.n_rows, 20_000))
    return {
        "mean_cosine_raw": _mean_pair_cosine(sample, seed),
        "mean_cosine_whitened": _mean_pair_cosine(whitened_sample, seed),
        "identity_error": float(np.abs(covariance(check) - np.eye(model.n_components)).max()),
    }


@click.command()
@click.option(
    "--rows", type=click.IntRange(min=2), default=100_000, show_default=True, help="Rows of the generated store."
)
@click.option(
    "--dim", type=click.IntRange(min=1), default=256, show_default=True, help="Width d of the generated store."
)
@click.option(
    "-k", "--n-components", type=spec_type("n_components"), default=64, show_default=True, help="Kept dimensions."
)
@click.option(
    "--chunk-rows",
    type=spec_type("chunk_rows"),
    default=8192,
    show_default=True,
    help="Chunk rows of the generated store.",
)
@click.option(
    "--dir", "workdir", default=None, help="Keep the files in this directory (default: a temporary one, removed)."
)
@click.option("--seed", type=int, default=0, show_default=True)
@quiet_option
@json_option
def demo(
    rows: int, dim: int, n_components: int, chunk_rows: int, workdir: str | None, seed: int, quiet: bool, as_json: bool
):
    """Run the whole job on a built-in example: generate a store, fit, apply with k < d, check.

    \b
    Example:
      streamwhiten demo --rows 20000 --dim 128 -k 32 --dir demo-files
    """
    import tempfile

    from ..params import check_model

    check_model(n_components=n_components, n_features=dim)
    if workdir is not None and os.path.exists(workdir) and not os.path.isdir(workdir):
        raise click.BadParameter(f"{workdir} is a file, not a directory", param_hint="'--dir'")
    with progress_bar("demo", quiet) as progress:
        if workdir is None:
            with tempfile.TemporaryDirectory(prefix="streamwhiten-demo-") as tmp:
                summary = run_demo(tmp, rows, dim, n_components, chunk_rows, seed, progress)
        else:
            os.makedirs(workdir, exist_ok=True)
            summary = run_demo(workdir, rows, dim, n_components, chunk_rows, seed, progress)
    emit(as_json, summary, _lines(summary, chunk_rows, workdir))


def _lines(summary: dict, chunk_rows: int, workdir: str | None) -> list[str]:
    t = summary["seconds"]
    return [
        f"0. numba kernels compiled (first run) or loaded from cache  [{t['compile']:.2f} s]",
        f"1. generated {summary['rows']:,} x {summary['dim']} float32 anisotropic embeddings "
        f"({summary['n_chunks']} chunks of {chunk_rows} rows) in {summary['input']}  [{t['generate']:.2f} s]",
        f"2. fitted in one streaming pass: {fmt_rate(summary['rows'], t['fit'])}, "
        f"D_eff={summary['effective_dimension']:.1f}, k={summary['k']} keeps "
        f"{summary['explained_variance']:.1%} of the variance  [{t['fit']:.2f} s]",
        f"3. applied to {summary['output']}: {summary['rows']:,} x {summary['k']} L2-normalised float32 "
        f"({fmt_rate(summary['rows'], t['apply'])})  [{t['apply']:.2f} s]",
        f"4. checked: mean cosine of random pairs {summary['mean_cosine_raw']:.3f} raw -> "
        f"{summary['mean_cosine_whitened']:.3f} whitened; output covariance (before normalising) is identity "
        f"to {summary['identity_error']:.1e}",
        f"done in {t['total']:.2f} s" + (f"; files kept in {workdir}" if workdir else ""),
    ]
