"""What a night of a versioned job costs (issue #25): appending the night's rows vs rewriting everything.

A simulated job: night 0 writes N0 rows of ``--dim`` columns (a fixed anisotropic Gaussian) and every
later night adds 1 % or 2 % of the corpus (alternately): appended to the latest shard, or, every fifth
night, as a new shard. The rows of night t come from a distribution whose mean has moved ``t x
--mean-drift`` (in units of the top standard deviation, along one direction) and whose mixing matrix is
``M0 (I + t x --cov-drift x R)`` (R random symmetric, spectral norm 1), so the published map goes stale
and a republish is due once or twice in 30 nights. Two jobs read the same shards each night:

    versioned   a job with a [publish] table (max_staleness and keep_versions at their defaults): each
                night appends the new rows as new output parts with the published map, or republishes
    rewrite     the same job without [publish] (the behaviour before #25): every night the model
                changes, so every output is rewritten

Per night: the versioned job's action, staleness (of the published map against the statistics after
the night's update), wall time and bytes written; the rewrite job's wall time and bytes written (its
first ``--rewrite-nights`` nights: it costs O(corpus) a night); and, as the reference measured in the same
run on the same rows (each the fastest of three), ``pipeline.apply`` of the night's new rows alone (``rows=(start, stop)``) with the
published map. Target: an appending night (fit update of the new rows, staleness, the new part, the
manifest switch) costs at most 1.5x the reference, at both corpus sizes (4x apart): O(new rows). Beside
it, the floor: reading and reducing the same rows to moments alone (``update_new_rows_s``), and the
reduction alone on rows already in memory (``reduce_new_rows_s``), which any night that updates the
statistics adds to the apply, even one pass that reads the rows once for both and costs nothing else:
``floor_ratio`` = (apply + reduction) / apply. And the work every night does whatever its rows beyond
the apply (``fixed_s``: load the statistics, staleness, finalize, a durable save):
``floor_fixed_ratio`` = (apply + reduction + fixed) / apply, what a night costs with nothing else.

    python benchmarks/nightly_cost.py                         # N0 = 500k and 2M, 30 nights
    python benchmarks/nightly_cost.py --sizes 2000000 --nights 4 --rewrite-nights 0 --night-rows 80000
    python benchmarks/nightly_cost.py --quick                 # seconds
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import h5py
import numpy as np
from _common import print_table, save_results

TARGET = 1.5
#: Each reference is timed this many times and the fastest kept (the night itself runs once).
REPEATS = 3
#: Rows per block of the reference statistics update (a night of the default run is one or two blocks).
BLOCK_ROWS = 65536


class Corpus:
    """The simulated corpus: its shards, and the generator of each night's rows."""

    def __init__(self, directory: str, dim: int, mean_drift: float, cov_drift: float, seed: int = 0):
        rng = np.random.default_rng(seed)
        basis, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
        self.mixing = (basis * (1.0 / np.sqrt(1.0 + np.arange(dim)))).T  # rows are z @ mixing
        direction = rng.standard_normal(dim)
        self.direction = direction / np.linalg.norm(direction)
        turn = rng.standard_normal((dim, dim))
        turn = (turn + turn.T) / 2
        self.turn = turn / np.linalg.norm(turn, 2)
        self.dim, self.mean_drift, self.cov_drift = dim, mean_drift, cov_drift
        self.directory = directory
        self.shards: list[str] = []
        os.makedirs(directory, exist_ok=True)

    def rows(self, n: int, night: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        mixing = self.mixing @ (np.eye(self.dim) + night * self.cov_drift * self.turn)
        mean = 0.5 + night * self.mean_drift * self.direction
        out = np.empty((n, self.dim), dtype=np.float32)
        for start in range(0, n, 65536):
            stop = min(n, start + 65536)
            z = rng.standard_normal((stop - start, self.dim), dtype=np.float32)
            out[start:stop] = mean + z @ mixing.astype(np.float32)
        return out

    def add(self, n: int, night: int, new_shard: bool) -> tuple[str, int, int]:
        """Add ``n`` rows of night ``night``; returns (the shard's spec, first new row, stop)."""
        if new_shard or not self.shards:
            self.shards.append(os.path.join(self.directory, f"day-{night:03d}.h5"))
        path = self.shards[-1]
        with h5py.File(path, "a") as handle:
            if "emb" not in handle:
                handle.create_dataset(
                    "emb", shape=(0, self.dim), dtype="float32", chunks=(4096, self.dim), maxshape=(None, self.dim)
                )
            dataset = handle["emb"]
            start = dataset.shape[0]
            dataset.resize((start + n, self.dim))
            for offset in range(0, n, 262144):
                block = self.rows(min(262144, n - offset), night, seed=1000 * night + offset // 262144)
                dataset[start + offset : start + offset + len(block)] = block
        return f"{path}:/emb", start, start + n


def write_job(directory: str, shards: str, publish: bool) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "job.toml")
    with open(path, "w") as handle:
        handle.write(
            f'name = "nightly"\n[input]\npaths = ["{shards}/day-*.h5"]\n[model]\npath = "models/m.npz"\n'
            '[apply]\noutput = "out/{stem}.h5"\n' + ("[publish]\n" if publish else "")
        )
    return path


def run_night(job: str, **options) -> dict:
    from streamwhiten.job import JobUpToDateError, run_job_file

    began = time.perf_counter()
    try:
        report = run_job_file(job, **options).to_json()
    except JobUpToDateError as nothing:
        report = nothing.report.to_json()
    report["wall_s"] = time.perf_counter() - began
    return report


def reference_apply(model_file: str, spec: str, rows: tuple, directory: str) -> float:
    """Seconds of ``pipeline.apply`` of input rows ``rows`` alone with ``model_file``'s map."""
    from streamwhiten.pipeline import apply

    target = os.path.join(directory, "reference.h5")
    began = time.perf_counter()
    apply(model_file, spec, target, rows=rows)
    seconds = time.perf_counter() - began
    os.remove(target)
    return seconds


def reference_update(spec: str, rows: tuple, block_rows: int) -> tuple[float, float]:
    """Seconds to reduce input rows ``rows`` to moments (``block_moments`` per block of ``block_rows``,
    merged): with the read of the rows, and without it (the rows already in memory, as a pass that read
    them once for the apply and the update would have them). The arithmetic of the night's statistics
    update alone: no model loads, checks, finalize or save."""
    from streamwhiten.core.stats import Moments, block_moments, merge
    from streamwhiten.io import open_source

    began = time.perf_counter()
    blocks = []
    with open_source(spec) as source:
        for start in range(rows[0], rows[1], block_rows):
            blocks.append(source.read(start, min(rows[1], start + block_rows)))
    read = time.perf_counter() - began
    began = time.perf_counter()
    state = Moments.empty(blocks[0].shape[1])
    for block in blocks:
        state = merge(state, block_moments(block))
    reduce = time.perf_counter() - began
    return read + reduce, reduce


def reference_fixed(published_file: str, model_file: str, directory: str) -> float:
    """Seconds of the work every appending night does whatever its rows, beyond the apply (which loads
    the published model): load the statistics (the file checked), measure the staleness, finalize the
    statistics (one eigendecomposition) and save them durably. Not the checks of the inputs and parts,
    nor the manifest."""
    from streamwhiten.core.model import finalize, load_model, save_model
    from streamwhiten.core.staleness import staleness

    target = os.path.join(directory, "reference.npz")
    published_model = load_model(published_file)
    began = time.perf_counter()
    statistics = load_model(model_file)
    staleness(published_model, statistics.state)
    refit = finalize(
        statistics.state,
        statistics.beta,
        statistics.gamma,
        statistics.eps,
        None if statistics.variance is not None else statistics.n_components,
        statistics.variance,
        statistics.sources,
        statistics.info,
    )
    save_model(refit, target)
    seconds = time.perf_counter() - began
    os.remove(target)
    return seconds


def simulate(n0: int, args, directory: str) -> dict:
    from streamwhiten.job import published

    corpus = Corpus(os.path.join(directory, "shards"), args.dim, args.mean_drift, args.cov_drift)
    versioned = write_job(os.path.join(directory, "versioned"), corpus.directory, publish=True)
    rewrite = write_job(os.path.join(directory, "rewrite"), corpus.directory, publish=False)
    model = os.path.join(directory, "versioned", "models", "m.npz")
    began = time.perf_counter()
    corpus.add(n0, 0, new_shard=True)
    generated = time.perf_counter() - began
    nights = []
    total = n0
    for night in range(args.nights + 1):
        if night:
            n_new = args.night_rows or int(total * (0.01 if night % 2 else 0.02))
            spec, start, stop = corpus.add(n_new, night, new_shard=night % 5 == 0)
            total += n_new
        ours = run_night(versioned)
        row = {
            "night": night,
            "corpus_rows": total,
            "new_rows": ours["rows_added"],
            "action": ours["action"],
            "staleness": None if ours["staleness"] is None else ours["staleness"]["total"],
            "version": ours["published_version"],
            "seconds": ours["wall_s"],
            "bytes_written": ours["bytes_written"],
        }
        if night and ours["action"] == "append":
            published_file = published(model).model_file
            row["apply_new_rows_s"] = min(
                reference_apply(published_file, spec, (start, stop), directory) for _ in range(REPEATS)
            )
            row["ratio"] = row["seconds"] / row["apply_new_rows_s"]
            updates = [reference_update(spec, (start, stop), BLOCK_ROWS) for _ in range(REPEATS)]
            row["update_new_rows_s"] = min(update for update, _ in updates)
            row["reduce_new_rows_s"] = min(reduce for _, reduce in updates)
            row["floor_ratio"] = (row["apply_new_rows_s"] + row["reduce_new_rows_s"]) / row["apply_new_rows_s"]
            row["fixed_s"] = min(reference_fixed(published_file, model, directory) for _ in range(REPEATS))
            row["floor_fixed_ratio"] = row["floor_ratio"] + row["fixed_s"] / row["apply_new_rows_s"]
        if night <= args.rewrite_nights:
            theirs = run_night(rewrite)
            row["rewrite_seconds"], row["rewrite_bytes_written"] = theirs["wall_s"], theirs["bytes_written"]
        nights.append(row)
        print(
            f"  N0={n0:,} night {night:2d}: {row['action']:9s} staleness "
            f"{'-' if row['staleness'] is None else format(row['staleness'], '.3f')}  {row['seconds']:.2f} s"
            + (
                f"  (apply alone {row['apply_new_rows_s']:.3f} s, x{row['ratio']:.2f}; update alone "
                f"{row['update_new_rows_s']:.3f} s, its reduction {row['reduce_new_rows_s']:.3f} s; fixed "
                f"{row['fixed_s']:.3f} s)"
                if "ratio" in row
                else ""
            )
            + (f"  rewrite {row['rewrite_seconds']:.2f} s" if "rewrite_seconds" in row else ""),
            flush=True,
        )
    appends = [row for row in nights if "ratio" in row]
    rewrites = [row for row in nights if "rewrite_seconds" in row and row["night"]]
    ratios = [row["ratio"] for row in appends]
    return {
        "n0": n0,
        "final_rows": total,
        "generate_n0_s": generated,
        "nights": nights,
        "summary": {
            "n0": n0,
            "final_rows": total,
            "appends": len(appends),
            "republishes": sum(row["action"] == "republish" for row in nights),
            "append_s_median": float(np.median([row["seconds"] for row in appends])) if appends else None,
            "apply_new_s_median": float(np.median([row["apply_new_rows_s"] for row in appends])) if appends else None,
            "ratio_median": float(np.median(ratios)) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
            "update_new_s_median": (
                float(np.median([row["update_new_rows_s"] for row in appends])) if appends else None
            ),
            "reduce_new_s_median": (
                float(np.median([row["reduce_new_rows_s"] for row in appends])) if appends else None
            ),
            "floor_ratio_median": float(np.median([row["floor_ratio"] for row in appends])) if appends else None,
            "fixed_s_median": float(np.median([row["fixed_s"] for row in appends])) if appends else None,
            "floor_fixed_ratio_median": (
                float(np.median([row["floor_fixed_ratio"] for row in appends])) if appends else None
            ),
            "new_rows_median": float(np.median([row["new_rows"] for row in appends])) if appends else None,
            "append_mb_median": float(np.median([row["bytes_written"] for row in appends])) / 1e6 if appends else None,
            "rewrite_s_median": float(np.median([row["rewrite_seconds"] for row in rewrites])) if rewrites else None,
            "rewrite_mb_median": (
                float(np.median([row["rewrite_bytes_written"] for row in rewrites])) / 1e6 if rewrites else None
            ),
            "meets_1.5": bool(ratios) and float(np.median(ratios)) <= TARGET,
        },
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="500000,2000000", help="N0 of each simulation (comma-separated)")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument(
        "--rewrite-nights", type=int, default=10, help="nights the rewrite-all job runs (each O(corpus))"
    )
    parser.add_argument("--mean-drift", type=float, default=0.01, help="mean shift a night (top std units)")
    parser.add_argument("--cov-drift", type=float, default=0.01, help="mixing change a night (spectral norm)")
    parser.add_argument(
        "--night-rows", type=int, default=0, help="rows added each night (default 0: 1 %% and 2 %% of the corpus)"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--results", default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.dim, args.nights, args.rewrite_nights = "3000,12000", 16, 8, 8
        args.mean_drift, args.cov_drift = 0.3, 0.3
    sizes = [int(size) for size in args.sizes.split(",")]
    base = args.workdir or tempfile.mkdtemp(prefix="streamwhiten-nightly-")
    runs = []
    try:
        for n0 in sizes:
            directory = os.path.join(base, f"n0-{n0}")
            shutil.rmtree(directory, ignore_errors=True)
            runs.append(simulate(n0, args, directory))
            shutil.rmtree(directory, ignore_errors=True)  # the disk is shared
    finally:
        if args.workdir is None:
            shutil.rmtree(base, ignore_errors=True)
    for run in runs:
        print_table(
            f"N0 = {run['n0']:,} x {args.dim}: a night of the versioned job vs apply of its new rows alone "
            f"and vs rewriting everything",
            run["nights"],
            [
                "night",
                "corpus_rows",
                "new_rows",
                "action",
                "staleness",
                "version",
                "seconds",
                "bytes_written",
                "apply_new_rows_s",
                "ratio",
                "update_new_rows_s",
                "reduce_new_rows_s",
                "floor_ratio",
                "fixed_s",
                "floor_fixed_ratio",
                "rewrite_seconds",
                "rewrite_bytes_written",
            ],
        )
    summaries = [run["summary"] for run in runs]
    print_table(
        f"appending night / apply of the new rows alone (target <= {TARGET}x at every size)",
        summaries,
        list(summaries[0]),
    )
    payload = {
        "dim": args.dim,
        "nights": args.nights,
        "rewrite_nights": args.rewrite_nights,
        "mean_drift": args.mean_drift,
        "cov_drift": args.cov_drift,
        "night_rows": args.night_rows or "1-2 %",
        "target": TARGET,
        "summary": summaries,
        "runs": runs,
    }
    save_results("nightly_cost", payload, args.results)


if __name__ == "__main__":
    main()
