"""Exact search speed against faiss, and the peak memory of a search over a store larger than its budget.

1. In memory: 1k queries against the same 1M x 384 corpus of unit vectors, top 10 and top 100.
   Float: ``evaluation.search.exact_search`` (inner products, float32) against faiss ``IndexFlatIP``;
   bits: the same with ``metric="hamming"`` on the sign bits (``np.packbits(x > 0)``) against faiss
   ``IndexBinaryFlat``. Both use the same threads: ``--threads`` workers here (BLAS limited to match,
   through threadpoolctl), ``faiss.omp_set_num_threads(--threads)`` there. Runs are interleaved for
   ``--repeats`` rounds and the fastest of each is compared (target: ours >= 0.9x faiss). The bit
   results must equal faiss's exactly (integer distances; both break ties by the lower row); for floats
   the share of equal ids is reported (float32 products from two BLAS builds differ in the last bits).
2. From disk: the same search over an HDF5 store of ``--disk-rows`` x multiples rows, each in a fresh
   process reporting its peak RSS. The bound it must stay under: the interpreter with streamwhiten
   imported and a tiny search done (measured in the same run) + 16 MiB of allocator and thread warm-up
   + two blocks (the one searched and the one read ahead) + one score tile per worker + the queries and
   their top lists. Peak RSS is each process's own high-water mark (``VmHWM``). The stores are several times that bound, and the peak stays flat as they grow.

    python benchmarks/search_speed.py
    python benchmarks/search_speed.py --sections memory --rows 200000
    python benchmarks/search_speed.py --quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np
from _common import interleaved_times, print_table, run_child, save_results, write_tiled_store

TARGET = 0.9
WARMUP_MIB = 16


def unit_rows(rng, n_rows: int, n_features: int, chunk: int = 1 << 17) -> np.ndarray:
    """Anisotropic unit vectors in float32, built in chunks (a corpus of ~1.5 GB without a float64 copy)."""
    scales = np.geomspace(2.0, 0.2, n_features).astype(np.float32)
    mean = rng.standard_normal(n_features).astype(np.float32)
    out = np.empty((n_rows, n_features), dtype=np.float32)
    for start in range(0, n_rows, chunk):
        rows = out[start : start + chunk]
        rows[...] = rng.standard_normal(rows.shape, dtype=np.float32) * scales + mean
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return out


def memory_section(args) -> list[dict]:
    import faiss
    from threadpoolctl import threadpool_limits

    from streamwhiten.evaluation.search import exact_search

    rng = np.random.default_rng(0)
    corpus = unit_rows(rng, args.rows, args.dim)
    picks = rng.choice(args.rows, args.queries, replace=False)
    queries = corpus[picks] + 0.3 * unit_rows(rng, args.queries, args.dim)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    bits, query_bits = np.packbits(corpus > 0, axis=1), np.packbits(queries > 0, axis=1)
    faiss.omp_set_num_threads(args.threads)
    flat = faiss.IndexFlatIP(args.dim)
    flat.add(corpus)
    binary = faiss.IndexBinaryFlat(args.dim)
    binary.add(bits)
    exact_search(queries[:4], corpus[:5000], 10, threads=args.threads)  # kernels loaded
    exact_search(query_bits[:4], bits[:5000], 10, metric="hamming", threads=args.threads)
    rows_out = []
    for depth in args.depths:
        found = {}

        def ours_float():
            found["float"] = exact_search(queries, corpus, depth, threads=args.threads)

        def faiss_float():
            with threadpool_limits(args.threads):
                found["faiss_float"] = flat.search(queries, depth)

        def ours_bits():
            found["bits"] = exact_search(query_bits, bits, depth, metric="hamming", threads=args.threads)

        def faiss_bits():
            found["faiss_bits"] = binary.search(query_bits, depth)

        times = interleaved_times(
            {"ours_float": ours_float, "faiss_float": faiss_float, "ours_bits": ours_bits, "faiss_bits": faiss_bits},
            args.repeats,
        )
        best = {name: min(values) for name, values in times.items()}
        same_ids = float(np.mean(found["float"].rows == found["faiss_float"][1]))
        bits_equal = bool(
            np.array_equal(found["bits"].rows, found["faiss_bits"][1])
            and np.array_equal(found["bits"].values, found["faiss_bits"][0])
        )
        for kind in ("float", "bits"):
            ratio = best[f"faiss_{kind}"] / best[f"ours_{kind}"]
            rows_out.append(
                {
                    "search": "inner product (float32)" if kind == "float" else "hamming (sign bits)",
                    "corpus": args.rows,
                    "d": args.dim,
                    "queries": args.queries,
                    "depth": depth,
                    "threads": args.threads,
                    "ours_s": best[f"ours_{kind}"],
                    "faiss_s": best[f"faiss_{kind}"],
                    "ratio": ratio,
                    "meets_0.9": ratio >= TARGET,
                    "equal_to_faiss": same_ids if kind == "float" else bits_equal,
                    "times_s": {name: times[name] for name in (f"ours_{kind}", f"faiss_{kind}")},
                }
            )
    print_table(
        f"exact search in memory vs faiss flat indexes (same threads; target >= {TARGET}x faiss's speed)",
        rows_out,
        [
            "search",
            "corpus",
            "d",
            "queries",
            "depth",
            "threads",
            "ours_s",
            "faiss_s",
            "ratio",
            "meets_0.9",
            "equal_to_faiss",
        ],
    )
    print(
        f"(best of {args.repeats} interleaved rounds; ratio = faiss time / our time; equal_to_faiss: the share "
        "of equal ids for floats, exact equality of ids and distances for bits)"
    )
    return rows_out


def _search_child(spec: str, args, depth: int) -> dict:
    """The search of ``args.queries`` random queries over the store ``spec`` in a fresh process: seconds,
    and the process's own peak RSS (``VmHWM``; ``ru_maxrss`` would also count what this process held
    when it started the child)."""
    code = (
        "import time, numpy as np\n"
        "from streamwhiten.io import open_source\n"
        "from streamwhiten.evaluation.search import exact_search\n"
        f"rng = np.random.default_rng(1)\nqueries = rng.standard_normal(({args.queries}, {args.dim})).astype(np.float32)\n"
        f"with open_source({spec!r}) as source:\n"
        "    exact_search(queries[:2], source.read(0, min(64, source.n_rows)), 2)\n"
        "    t = time.perf_counter()\n"
        f"    exact_search(queries, source, {depth}, threads={args.threads})\n"
        "    RESULT = {'rows': source.n_rows, 'seconds': time.perf_counter() - t}\n"
        "with open('/proc/self/status') as status:\n"
        "    RESULT['vm_hwm_mib'] = next(int(line.split()[1]) for line in status if line.startswith('VmHWM')) / 1024\n"
    )
    result = run_child(code)
    result["peak_rss_mib"] = result.pop("vm_hwm_mib")
    return result


def disk_section(args, directory: str) -> list[dict]:
    from streamwhiten.evaluation.search import SCORE_TILE_BYTES, SEARCH_BLOCK_BYTES

    depth = max(args.depths)
    base = _search_child(write_tiled_store(os.path.join(directory, "tiny.h5"), 64, args.dim, 64), args, depth)
    block_rows = args.chunk_rows * max(1, SEARCH_BLOCK_BYTES // (args.chunk_rows * args.dim * 4))
    block_bytes = block_rows * args.dim * 4
    lists = args.queries * (depth * 16 + args.dim * 4)
    bound_mib = (
        base["peak_rss_mib"]
        + WARMUP_MIB
        + (2 * block_bytes + args.threads * max(SCORE_TILE_BYTES, args.queries * 256 * 4) + lists) / 2**20
    )
    print(
        f"\nbaseline (interpreter + imports + kernels + a tiny search): {base['peak_rss_mib']:,.0f} MiB; bound = "
        f"baseline + {WARMUP_MIB} MiB + 2 blocks of {block_bytes / 2**20:,.0f} MiB + {args.threads} score tiles "
        f"+ queries and top lists = {bound_mib:,.0f} MiB"
    )
    rows_out = []
    for multiple in args.multiples:
        n_rows = args.disk_rows * multiple
        path = os.path.join(directory, f"corpus-{multiple}x.h5")
        began = time.perf_counter()
        spec = write_tiled_store(path, n_rows, args.dim, args.chunk_rows)
        written = time.perf_counter() - began
        result = _search_child(spec, args, depth)
        size_mib = n_rows * args.dim * 4 / 2**20
        rows_out.append(
            {
                "multiple": multiple,
                "rows": n_rows,
                "store_mib": size_mib,
                "write_s": written,
                "search_s": result["seconds"],
                "rows_s": n_rows / result["seconds"],
                "peak_rss_mib": result["peak_rss_mib"],
                "bound_mib": bound_mib,
                "store_over_bound": size_mib / bound_mib,
                "within_bound": result["peak_rss_mib"] <= bound_mib,
            }
        )
        print(
            f"  {size_mib:,.0f} MiB store: {rows_out[-1]['rows_s']:,.0f} rows/s, peak RSS {result['peak_rss_mib']:,.0f} MiB"
        )
        os.remove(path)
    print_table(
        f"search of {args.queries} queries (top {depth}) over an HDF5 store read from disk, by store size",
        rows_out,
        [
            "multiple",
            "rows",
            "store_mib",
            "write_s",
            "search_s",
            "rows_s",
            "peak_rss_mib",
            "bound_mib",
            "store_over_bound",
            "within_bound",
        ],
    )
    return rows_out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="corpus rows in memory")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--depths", type=int, nargs="+", default=[10, 100], help="top-k list lengths")
    parser.add_argument("--threads", type=int, default=None, help="threads for both (default: one per core)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (the best of each is kept)")
    parser.add_argument("--disk-rows", type=int, default=1_000_000, help="rows of the smallest store on disk")
    parser.add_argument("--multiples", type=int, nargs="+", default=[1, 4], help="store sizes as multiples")
    parser.add_argument("--chunk-rows", type=int, default=16384, help="rows per HDF5 chunk of the stores")
    parser.add_argument("--sections", nargs="+", default=["memory", "disk"], choices=["memory", "disk"])
    parser.add_argument("--workdir", default=None, help="where the stores go (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--results", default=None, help="directory for the JSON result (default: benchmarks/results)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.dim, args.queries, args.repeats = 20000, 64, 50, 1
        args.disk_rows, args.multiples, args.chunk_rows = 4096, [1, 2], 1024
    from streamwhiten.engine._threads import available_cores

    args.threads = args.threads or available_cores()
    directory = args.workdir or tempfile.mkdtemp(prefix="streamwhiten-search-")
    os.makedirs(directory, exist_ok=True)
    payload = {"args": vars(args)}
    try:
        if "disk" in args.sections:
            payload["disk"] = disk_section(args, directory)
        if "memory" in args.sections:
            payload["memory"] = memory_section(args)
    finally:
        if args.workdir is None:
            shutil.rmtree(directory, ignore_errors=True)
    save_results("search_speed", payload, args.results)


if __name__ == "__main__":
    main()
