"""Peak memory of a fit does not grow with the number of rows: stores of 1x, 4x, 16x the same size.

Each fit runs in a fresh process that reports its own peak RSS (``ru_maxrss``). The bound it must stay
under is: the interpreter with streamwhiten imported, its kernels loaded and a tiny fit done (measured
in the same run) + 16 MiB of allocator and thread warm-up + one block per worker thread (each reads a
block into its own buffer and reduces it there; two on this 2-core machine) + a few d x d float64
matrices per thread (the blocks' scatters in flight) and for the state.
Run once with a store larger than this machine's memory (``--size-gb 32``) for the out-of-core figure.

    python benchmarks/memory.py                    # 1x, 4x, 16x a 0.6 GB store (up to 9.7 GB), d = 768
    python benchmarks/memory.py --size-gb 32       # larger than RAM: rows/s and peak RSS
    python benchmarks/memory.py --quick            # a tiny smoke run
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from _common import print_table, run_child, save_results, write_tiled_store

D_BY_D_PER_THREAD = 2  # a block's scatter in flight, and its float32 product
D_BY_D_MATRICES = 6  # state scatter, merged scatter, one more result in flight, outer product, covariance, eigvecs
WARMUP_MIB = 16  # allocator arenas and thread stacks touched in the first blocks (flat afterwards)


def baseline_mib(directory: str, n_features: int) -> float:
    """Peak RSS of a fit over a one-chunk store of 64 rows: interpreter, imports, kernels, reader thread."""
    spec = write_tiled_store(os.path.join(directory, "baseline.h5"), 64, n_features, 64)
    code = (
        f"import numpy as np\nfrom streamwhiten.engine.fit import fit_sources\nfit_sources({spec!r})\nRESULT = {{}}\n"
    )
    return run_child(code)["peak_rss_mib"]


def fit_in_child(spec: str, block_rows: int | None) -> dict:
    code = (
        "import time, numpy as np\nfrom streamwhiten.core import stats\nfrom streamwhiten.engine.fit import fit_sources\n"
        "stats.block_moments(np.ones((4, 4), np.float32))\n"
        f"t = time.perf_counter(); result = fit_sources({spec!r}, block_rows={block_rows!r})\n"
        "seconds = time.perf_counter() - t\n"
        "RESULT = {'rows': result.state.n_rows, 'seconds': seconds, 'rows_s': result.state.n_rows / seconds}\n"
    )
    return run_child(code)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--base-gb", type=float, default=0.5, help="size of the smallest store (rounded up to whole chunks)"
    )
    parser.add_argument(
        "--multiples", type=int, nargs="+", default=[1, 4, 16], help="store sizes as multiples of the base"
    )
    parser.add_argument(
        "--size-gb",
        type=float,
        default=None,
        help="instead: one store of this size (e.g. 32, larger than this machine's memory)",
    )
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--chunk-rows", type=int, default=65536, help="rows per store chunk (and read block)")
    parser.add_argument("--workdir", default=None, help="where the stores go (needs the space; default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the generated stores")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--results", default=None, help="directory for the JSON result (default: benchmarks/results)")
    args = parser.parse_args(argv)
    if args.quick:
        args.base_gb, args.multiples, args.dim, args.chunk_rows = 0.002, [1, 4], 64, 1024
    directory = args.workdir or tempfile.mkdtemp(prefix="streamwhiten-mem-")
    os.makedirs(directory, exist_ok=True)
    row_bytes = args.dim * 4
    block_bytes = args.chunk_rows * row_bytes
    from streamwhiten.engine._threads import resolve_threads

    threads = resolve_threads(None)
    base = baseline_mib(directory, args.dim)
    matrices = D_BY_D_MATRICES + D_BY_D_PER_THREAD * threads
    bound = base + WARMUP_MIB + (threads * block_bytes + matrices * args.dim**2 * 8) / 2**20
    print(
        f"baseline (interpreter + imports + kernels + a tiny fit): {base:,.0f} MiB; bound = baseline + "
        f"{WARMUP_MIB} MiB warm-up + {threads} blocks of {block_bytes / 2**20:,.0f} MiB (one per worker thread) "
        f"+ {matrices} d x d float64 = {bound:,.0f} MiB"
    )
    rows_out = []
    try:
        chunks = -(-int((args.size_gb or args.base_gb) * 1e9 / row_bytes) // args.chunk_rows)  # rounded up
        multiples = [1] if args.size_gb else args.multiples
        for multiple in multiples:
            n_rows = chunks * multiple * args.chunk_rows
            path = os.path.join(directory, f"store-{multiple}x.h5")
            began = time.perf_counter()
            spec = write_tiled_store(path, n_rows, args.dim, args.chunk_rows)
            written = time.perf_counter() - began
            result = fit_in_child(spec, args.chunk_rows)
            rows_out.append(
                {
                    "multiple": multiple,
                    "size_gb": n_rows * row_bytes / 1e9,
                    "rows": n_rows,
                    "write_s": written,
                    "fit_s": result["seconds"],
                    "rows_s": result["rows_s"],
                    "peak_rss_mib": result["peak_rss_mib"],
                    "bound_mib": bound,
                    "within_bound": result["peak_rss_mib"] <= bound,
                }
            )
            print(
                f"  {rows_out[-1]['size_gb']:.2f} GB: {result['rows_s']:,.0f} rows/s, peak RSS {result['peak_rss_mib']:,.0f} MiB"
            )
            if not args.keep:
                os.remove(path)
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    print_table(
        f"fit peak RSS by store size (d = {args.dim}, blocks of {args.chunk_rows} rows)",
        rows_out,
        ["multiple", "size_gb", "rows", "write_s", "fit_s", "rows_s", "peak_rss_mib", "bound_mib", "within_bound"],
    )
    growth = rows_out[-1]["peak_rss_mib"] - rows_out[0]["peak_rss_mib"]
    print(
        f"peak RSS grew by {growth:,.0f} MiB from the smallest to the largest store "
        f"({rows_out[-1]['rows'] / rows_out[0]['rows']:.0f}x the rows)"
    )
    save_results(
        "memory",
        {"baseline_mib": base, "bound_mib": bound, "threads": threads, "rows": rows_out, "args": vars(args)},
        args.results,
    )


if __name__ == "__main__":
    main()
