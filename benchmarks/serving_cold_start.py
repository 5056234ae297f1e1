"""Cold start of the serving path: import + load + first transform of one query, in a fresh process.

A query service (or a serverless function) pays this on every start. Each variant runs in a new
interpreter that times itself from before its first import to after its first transformed vector:

- ``serving (model file)``: ``from streamwhiten import serving; serving.load("model.npz").transform(q)``;
- ``serving (exported map)``: the same on ``streamwhiten export -o map.npz`` (only A, b and mean to read);
- ``full (Whitener)``: ``from streamwhiten import Whitener; Whitener.load("model.npz").transform(q.reshape(1, -1))``,
  which imports numba and loads the cached kernels;
- ``numpy alone``: ``import numpy``, the floor under anything numpy-based.

The variants run in turn for ``--repeats`` rounds (rotating the order); the fastest run of each is
reported, with the ratio full / serving. The numba kernels are compiled (or loaded into the cache) by a
warm-up run first, so the full path is timed as a service sees it after its first start on a machine.
Target: serving <= 0.15 s.

    python benchmarks/serving_cold_start.py
    python benchmarks/serving_cold_start.py --quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
from _common import print_table, run_child, save_results

TARGET_SECONDS = 0.15

SERVING = """
import time
_t0 = time.perf_counter()
import numpy as np
from streamwhiten import serving
_t1 = time.perf_counter()
whiten = serving.load({path!r})
_t2 = time.perf_counter()
query = np.load({query!r})
y = whiten.transform(query)
_t3 = time.perf_counter()
import sys
RESULT = {{"total": _t3 - _t0, "import": _t1 - _t0, "load": _t2 - _t1, "transform": _t3 - _t2, "k": int(y.shape[-1]),
          "numba_imported": "numba" in sys.modules, "h5py_imported": "h5py" in sys.modules,
          "zarr_imported": "zarr" in sys.modules}}
"""

FULL = """
import time
_t0 = time.perf_counter()
import numpy as np
from streamwhiten import Whitener
_t1 = time.perf_counter()
whitener = Whitener.load({path!r})
_t2 = time.perf_counter()
query = np.load({query!r})
y = whitener.transform(query.reshape(1, -1))  # scikit-learn: 2-D input
_t3 = time.perf_counter()
import sys
RESULT = {{"total": _t3 - _t0, "import": _t1 - _t0, "load": _t2 - _t1, "transform": _t3 - _t2, "k": int(y.shape[-1]),
          "numba_imported": "numba" in sys.modules, "h5py_imported": "h5py" in sys.modules,
          "zarr_imported": "zarr" in sys.modules}}
"""

NUMPY = """
import time
_t0 = time.perf_counter()
import numpy as np
_t1 = time.perf_counter()
RESULT = {"total": _t1 - _t0, "import": _t1 - _t0, "load": 0.0, "transform": 0.0}
"""


def build_files(directory: str, n_features: int, k: int, n_rows: int) -> dict:
    """A fitted model file (saved at k), the exported ``.npz`` map, and one float32 query vector."""
    from streamwhiten import Whitener
    from streamwhiten.core.model import load_model
    from streamwhiten.export import write_npz
    from streamwhiten.serving import file_checksum

    rng = np.random.default_rng(0)
    mixing = rng.standard_normal((n_features, n_features)) / np.sqrt(1.0 + np.arange(n_features))[:, None]
    rows = (rng.standard_normal((n_rows, n_features)) @ mixing + 0.3).astype(np.float32)
    model = os.path.join(directory, "model.npz")
    Whitener(n_components=k).fit(rows).save(model)
    affine = load_model(model).as_affine()
    exported = os.path.join(directory, "map.npz")
    from dataclasses import replace

    write_npz(replace(affine, file_checksum=file_checksum(model)), exported)
    query = os.path.join(directory, "query.npy")
    np.save(query, rows[0])
    return {
        "model": model,
        "map": exported,
        "query": query,
        "model_mib": os.path.getsize(model) / 2**20,
        "map_mib": os.path.getsize(exported) / 2**20,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("-k", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7, help="rounds; the fastest run of each variant is kept")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--results", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.dim, args.k, args.repeats = 32, 8, 1
    directory = args.workdir or tempfile.mkdtemp(prefix="streamwhiten-serving-")
    os.makedirs(directory, exist_ok=True)
    try:
        files = build_files(directory, args.dim, args.k, max(4 * args.dim, 2000))
        variants = {
            "serving (model file)": SERVING.format(path=files["model"], query=files["query"]),
            "serving (exported map)": SERVING.format(path=files["map"], query=files["query"]),
            "full (Whitener)": FULL.format(path=files["model"], query=files["query"]),
            "numpy alone": NUMPY,
        }
        for code in variants.values():  # warm-up: numba cache, .pyc files, page cache
            run_child(code)
        runs = {name: [] for name in variants}
        names = list(variants)
        for round_index in range(max(1, args.repeats)):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.perf_counter()
                result = run_child(variants[name])
                result["process"] = time.perf_counter() - started  # interpreter start and exit included
                runs[name].append(result)
    finally:
        if not args.workdir:
            shutil.rmtree(directory, ignore_errors=True)
    best = {name: min(results, key=lambda r: r["total"]) for name, results in runs.items()}
    full = best["full (Whitener)"]["total"]
    table = []
    for name, result in best.items():
        table.append(
            {
                "variant": name,
                "total_s": result["total"],
                "import_s": result["import"],
                "load_s": result["load"],
                "transform_s": result["transform"],
                "process_s": min(r["process"] for r in runs[name]),
                "median_total_s": float(np.median([r["total"] for r in runs[name]])),
                "full_over_this": full / result["total"] if result["total"] > 0 else None,
                "numba_imported": {True: "yes", False: "no"}.get(result.get("numba_imported"), "-"),
            }
        )
    print_table(
        f"cold start: import + load + first transform of one {args.dim}-d query to k = {args.k} "
        f"(best of {args.repeats} fresh processes; model file {files['model_mib']:.1f} MiB, "
        f"map {files['map_mib']:.1f} MiB)",
        table,
        [
            "variant",
            "total_s",
            "import_s",
            "load_s",
            "transform_s",
            "median_total_s",
            "process_s",
            "full_over_this",
            "numba_imported",
        ],
    )
    serving_best = best["serving (model file)"]["total"]
    print(
        f"\nserving from the model file: {serving_best:.3f} s (target {TARGET_SECONDS} s: "
        f"{'met' if serving_best <= TARGET_SECONDS else 'NOT met'}); full path {full:.3f} s, "
        f"{full / serving_best:.1f}x; numpy import alone {best['numpy alone']['total']:.3f} s"
    )
    save_results(
        "serving_cold_start",
        {
            "dim": args.dim,
            "k": args.k,
            "repeats": args.repeats,
            "target_s": TARGET_SECONDS,
            "files_mib": {"model": files["model_mib"], "map": files["map_mib"]},
            "table": table,
            "runs": runs,
            "python": sys.version.split()[0],
        },
        args.results,
    )


if __name__ == "__main__":
    main()
