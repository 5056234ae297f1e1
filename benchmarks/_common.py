"""Shared pieces of the benchmarks: stores, timing, tables, JSON results, peak RSS of a child process.

Every benchmark measures its references in the same run and reports ratios: the machine is shared and
its absolute speed drifts, ratios much less.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
POOL_BLOCK = 8192


def machine() -> dict:
    """What the numbers were measured on."""
    info = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    try:
        with open("/proc/cpuinfo") as handle:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [
            {k: pool.get(k) for k in ("internal_api", "version", "num_threads")} for pool in threadpool_info()
        ]
    except ImportError:
        pass
    return info


def interleaved_times(functions: dict, rounds: int) -> dict:
    """Seconds of each run of each function, run in turn for ``rounds`` rounds (A B C, B C A, C A B, ...).

    Interleaving puts a reference and the thing compared with it under the same passing load, and
    rotating the order gives none of them a fixed place (what runs just after a multi-threaded BLAS call
    was measured to be slower on this machine). The fastest run of each, the least disturbed, is what
    ratios are taken from.
    """
    times = {name: [] for name in functions}
    names = list(functions)
    for round_index in range(max(1, rounds)):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            function = functions[name]
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    return times


def best_time(fn, repeats: int = 3) -> float:
    """Fastest of ``repeats`` runs of ``fn()``, in seconds (the least disturbed by other load)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def row_pool(n_features: int, seed: int = 0) -> np.ndarray:
    """A few blocks of realistic anisotropic rows, tiled to build large stores quickly."""
    from streamwhiten.synthetic import generate_rows

    return generate_rows(4 * POOL_BLOCK, n_features, seed=seed)


def write_tiled_store(
    path: str,
    n_rows: int,
    n_features: int,
    chunk_rows: int,
    compressor: str | None = None,
    seed: int = 0,
    codec: str | None = None,
    dtype="float32",
) -> str:
    """An ``n_rows x n_features`` store (HDF5 or Zarr by suffix) built from a tiled row pool.

    Each tile gets its own small offset so no two chunks are equal. Generation costs little more than
    the write, so stores larger than memory are practical. ``compressor`` is a blosc compressor name
    (Zarr); ``codec`` one of :data:`CODECS` (Zarr 3's default zstd, blosc-lz4 with byte shuffle, HDF5's
    gzip 4 with shuffle, the blosc and zstd HDF5 plugins, uncompressed); ``dtype`` float32 or float16.
    """
    import h5py
    import zarr

    pool = row_pool(n_features, seed)
    dtype = np.dtype(dtype)
    if path.endswith(".zarr"):
        options = {"compressors": None}
        if compressor:
            from zarr.codecs import BloscCodec

            options = {"compressors": [BloscCodec(cname=compressor, clevel=3, shuffle="shuffle")]}
        elif codec == "zstd":
            options = {}  # zarr 3's default: zstd level 0
        elif codec == "blosc-lz4":
            from zarr.codecs import BloscCodec

            options = {"compressors": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]}
        elif codec not in (None, "none"):
            raise ValueError(f"no Zarr codec {codec!r} here")
        array = zarr.create_array(
            store=path,
            shape=(n_rows, n_features),
            chunks=(chunk_rows, n_features),
            dtype=dtype,
            overwrite=True,
            **options,
        )
        handle, spec = None, path
    else:
        options = {}
        if codec == "gzip":
            options = {"compression": "gzip", "compression_opts": 4, "shuffle": True}
        elif codec in ("blosc-lz4", "zstd"):
            import hdf5plugin

            options = dict(
                hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE)
                if codec == "blosc-lz4"
                else hdf5plugin.Zstd()
            )
        elif codec not in (None, "none"):
            raise ValueError(f"no HDF5 codec {codec!r} here")
        handle = h5py.File(path, "w")
        array = handle.create_dataset(
            "embeddings", shape=(n_rows, n_features), dtype=dtype, chunks=(chunk_rows, n_features), **options
        )
        spec = f"{path}:/embeddings"
    try:
        step = chunk_rows * max(1, (256 << 20) // (chunk_rows * n_features * 4))
        block = np.empty((step, n_features), dtype=np.float32)
        for start in range(0, n_rows, step):
            stop = min(n_rows, start + step)
            for offset in range(0, stop - start, pool.shape[0]):
                rows = min(pool.shape[0], stop - start - offset)
                block[offset : offset + rows] = pool[:rows] + np.float32(1e-3 * ((start + offset) // pool.shape[0]))
            array[start:stop] = block[: stop - start].astype(dtype, copy=False)
    finally:
        if handle is not None:
            handle.close()
    return spec


def read_all(spec: str) -> np.ndarray:
    from streamwhiten.io import open_source

    with open_source(spec) as source:
        return source.read(0, source.n_rows)


def warm_page_cache(path: str) -> None:
    """Read every file of a store once so the timed read comes from the page cache."""
    paths = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for name in paths:
        with open(name, "rb") as handle:
            while handle.read(64 << 20):
                pass


def run_child(code: str, env: dict | None = None) -> dict:
    """Run Python ``code`` in a fresh interpreter; it must print one JSON object as its last line.

    ``peak_rss_mib`` (the child's own ru_maxrss) is added.
    """
    wrapped = (
        code
        + "\nimport resource, json as _j\nprint(_j.dumps(dict(RESULT, peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", wrapped],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})),
    )
    if result.returncode != 0:
        raise RuntimeError(f"child failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def print_table(title: str, rows: list[dict], columns: list[str]) -> None:
    print(f"\n{title}")
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(_fmt(row.get(c)).rjust(widths[c]) for c in columns))


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.2e}"
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"
    return str(value)


def save_results(name: str, payload: dict, results_dir: str | None = None) -> Path:
    """Write ``payload`` (plus date, machine and command line) to ``benchmarks/results/NAME-DATE.json``."""
    directory = Path(results_dir) if results_dir else RESULTS
    directory.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = directory / f"{name}-{stamp}.json"
    payload = dict(
        payload, date=stamp, machine=machine(), command=" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])
    )
    path.write_text(json.dumps(payload, indent=2, default=float))
    print(f"\nresults written to {path}")
    return path
