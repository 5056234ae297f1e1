"""Fit throughput of the Dask engine against the serial engine, measured in one run on one store.

Writes a synthetic float32 store, then fits it with

- the serial engine (one process; its worker threads and BLAS threads as users get them),
- Dask with a LocalCluster of 1 worker process, of 2 worker processes, and of 1 process with 2 threads
  (each Dask worker thread runs BLAS on one thread, as Dask's worker processes do by default),

each after one untimed warm-up fit (worker start-up, imports, loading the cached numba kernels); then
the engines take turns for ``--repeats`` rounds, so a shifting load on a shared machine falls on all
alike. It reports rows/s of each engine's best fit (and the median time), the cluster start-up time
separately, and the largest relative difference of the statistics from the serial engine's. With ``--scheduler ADDRESS`` the Dask
runs use that cluster instead (put the store on storage all workers see with ``--dir``).

    python benchmarks/dask_scaling.py --quick
    python benchmarks/dask_scaling.py --rows 2000000 --dim 768
    python benchmarks/dask_scaling.py --scheduler tcp://head:8786 --dir /shared/scratch

The table goes to stdout, the JSON to benchmarks/results/ (or ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing

import numpy as np  # noqa: E402

from streamwhiten.engine import distributed as sd  # noqa: E402
from streamwhiten.engine.engines import DaskEngine  # noqa: E402
from streamwhiten.engine.fit import fit_sources  # noqa: E402
from streamwhiten.options import ReadOptions  # noqa: E402
from streamwhiten.synthetic import write_store  # noqa: E402

LOCAL_CONFIGS = [  # (name, processes, workers, threads per worker)
    ("dask 1 process", True, 1, 1),
    ("dask 2 processes", True, 2, 1),
    ("dask 2 threads", False, 1, 2),
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--quick", action="store_true", help="A few seconds: 20,000 x 32 rows, one timed fit each.")
    parser.add_argument("--rows", type=int, default=None, help="Rows of the store (default 1,000,000; quick 20,000).")
    parser.add_argument("--dim", type=int, default=None, help="Width d (default 256; quick 32).")
    parser.add_argument("--chunk-rows", type=int, default=None, help="Rows per store chunk (default 8192; quick 2000).")
    parser.add_argument(
        "--block-rows",
        type=int,
        default=None,
        help="Rows per block read, i.e. per Dask task (default: the engines' own, whole chunks of ~64 MiB; "
        "quick: one chunk).",
    )
    parser.add_argument("--format", choices=["zarr", "hdf5"], default="zarr", help="Store format (default zarr).")
    parser.add_argument(
        "--precision",
        choices=["auto", "float32", "float64"],
        default="auto",
        help="Arithmetic of the scatter product (default auto: float32 for this float32 store).",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="Timed fits per engine; the best counts (default 3; quick 1)."
    )
    parser.add_argument("--scheduler", default=None, help="Run the Dask fits on this cluster instead of local ones.")
    parser.add_argument(
        "--dir", default=None, help="Where to write the store (default: a temporary directory, removed)."
    )
    parser.add_argument(
        "--out", default=None, help="JSON report path (default benchmarks/results/dask_scaling-<time>.json)."
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.rows = args.rows or (20_000 if quick else 1_000_000)
    args.dim = args.dim or (32 if quick else 256)
    args.chunk_rows = args.chunk_rows or (2000 if quick else 8192)
    args.repeats = args.repeats or (1 if quick else 3)
    args.block_rows = args.block_rows or (args.chunk_rows if quick else None)
    return args


def rel_diff(state, reference) -> float:
    return max(
        float(np.max(np.abs(state.mean - reference.mean)) / np.max(np.abs(reference.mean))),
        float(np.max(np.abs(state.scatter - reference.scatter)) / np.max(np.abs(reference.scatter))),
    )


def run(args) -> dict:
    workdir = args.dir or tempfile.mkdtemp(prefix="streamwhiten-bench-")
    os.makedirs(workdir, exist_ok=True)
    suffix = ".zarr" if args.format == "zarr" else ".h5"
    path = os.path.join(workdir, f"dask-scaling-{args.rows}x{args.dim}{suffix}")
    try:
        began = time.perf_counter()
        spec = write_store(path, args.rows, args.dim, chunk_rows=args.chunk_rows)
        generate_seconds = time.perf_counter() - began
        load_before = os.getloadavg()
        engines = [
            dict(
                engine="serial",
                processes=1,
                threads=1,
                startup_seconds=0.0,
                limit=contextlib.nullcontext,
                fit=lambda: fit_sources(spec, precision=args.precision, block_rows=args.block_rows),
            )
        ]
        with contextlib.ExitStack() as clusters:
            configs = [(f"dask at {args.scheduler}", True, None, None)] if args.scheduler else LOCAL_CONFIGS
            for name, processes, workers, threads in configs:
                began = time.perf_counter()
                client = clusters.enter_context(
                    sd.dask_client(args.scheduler, workers, processes=processes, threads_per_worker=threads or 1)
                )
                nthreads = client.nthreads()  # {worker: threads}
                engines.append(
                    dict(
                        engine=name,
                        processes=len(nthreads) if processes else 1,
                        threads=sum(nthreads.values()),
                        startup_seconds=time.perf_counter() - began,
                        # Threads share this process's BLAS pool: one BLAS thread each, as in a worker process.
                        limit=contextlib.nullcontext if processes else _one_blas_thread,
                        fit=lambda client=client: sd.fit_dask(
                            spec,
                            precision=args.precision,
                            read=ReadOptions(block_rows=args.block_rows),
                            cluster=DaskEngine(client=client),
                        ),
                    )
                )
            # One untimed warm-up each (imports, cached kernels), then the engines take turns, so a change
            # in the load of a shared machine falls on all of them alike.
            for engine in engines:
                with engine["limit"]():
                    engine["result"] = engine["fit"]()
                engine["times"] = []
            for _ in range(args.repeats):
                for engine in engines:
                    with engine["limit"]():
                        began = time.perf_counter()
                        engine["result"] = engine["fit"]()
                        engine["times"].append(time.perf_counter() - began)
        serial = engines[0]["result"]
        runs = []
        for engine in engines:
            result, times = engine.pop("result"), engine.pop("times")
            del engine["fit"], engine["limit"]
            runs.append(
                dict(
                    engine,
                    seconds=min(times),
                    median_seconds=float(np.median(times)),
                    rows_per_second=args.rows / min(times),
                    blocks=result.n_blocks,
                    max_rel_diff_vs_serial=rel_diff(result.state, serial.state),
                )
            )
        for entry in runs:
            entry["speedup_vs_serial"] = entry["rows_per_second"] / runs[0]["rows_per_second"]
        return {
            "benchmark": "dask_scaling",
            "when": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": _machine(),
            "params": {
                key: getattr(args, key)
                for key in (
                    "rows",
                    "dim",
                    "chunk_rows",
                    "block_rows",
                    "format",
                    "precision",
                    "repeats",
                    "scheduler",
                    "quick",
                )
            },
            "store_bytes": args.rows * args.dim * 4,
            "generate_seconds": generate_seconds,
            "load_average_before": load_before,
            "runs": runs,
        }
    finally:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.remove(path)
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)


def _one_blas_thread():
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        return contextlib.nullcontext()
    return threadpool_limits(1)


def _machine() -> dict:
    import dask
    import distributed

    info = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
    }
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:  # pragma: no cover
        pass
    return info


COLUMNS = [  # (heading, width, format of the value)
    ("engine", -22, "{engine}"),
    ("processes", 10, "{processes}"),
    ("threads", 9, "{threads}"),
    ("start-up s", 12, "{startup_seconds:.2f}"),
    ("fit s", 9, "{seconds:.3f}"),
    ("median s", 10, "{median_seconds:.3f}"),
    ("rows/s", 14, "{rows_per_second:,.0f}"),
    ("x serial", 10, "{speedup_vs_serial:.2f}"),
    ("max rel diff", 14, "{max_rel_diff_vs_serial:.1e}"),
]


def table(report: dict) -> str:
    params = report["params"]
    lines = [
        f"fit of {params['rows']:,} x {params['dim']} float32 rows ({report['store_bytes'] / 2**20:,.0f} MiB, "
        f"{params['format']}, chunks of {params['chunk_rows']} rows, {report['runs'][0]['blocks']} blocks, "
        f"precision {params['precision']}) on {report['machine']['cpus']} cores "
        f"(load average before: {report['load_average_before'][0]:.1f}); "
        f"best of {params['repeats']} interleaved rounds after a warm-up",
        "".join(f"{heading:>{width}}" if width > 0 else f"{heading:<{-width}}" for heading, width, _ in COLUMNS),
    ]
    for entry in report["runs"]:
        cells = (fmt.format(**entry) for _, _, fmt in COLUMNS)
        lines.append(
            "".join(
                f"{cell:>{width}}" if width > 0 else f"{cell:<{-width}}"
                for cell, (_, width, _) in zip(cells, COLUMNS, strict=False)
            )
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    report = run(args)
    out = args.out or os.path.join(
        HERE, "results", f"dask_scaling-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    )
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as handle:
        json.dump(report, handle, indent=2)
    print(table(report))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
