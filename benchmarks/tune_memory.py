"""Peak memory of ``tune`` on a retrieval task against the bytes of its corpus, at 1x and 4x the corpus rows.

``tune`` runs in a fresh process (``python -m streamwhiten tune ... --json``) and its own peak RSS is read
from the kernel when it exits (``os.wait4``'s ``ru_maxrss``), with its wall and CPU time. The corpus is
retrieval-dev's (13,197 x 384 float32, 19 MiB; see its README.txt) at 1x; at 4x its rows stacked four times,
each copy after the first with small seeded noise (``--noise`` times each column's spread), so that the
qrels and the exclude file (rows of the first copy) still hold. The model is fitted on the 1x corpus and
serves every run (tune reads only its statistics). Each size runs with no byte budget (the default grid:
about 250 settings x 5 storages) and with ``--max-bytes 24`` (the settings that fit, and the vector codes,
trained on a sample of 6,000 rows). Printed: the peak RSS, the corpus bytes, their ratio, and from the
smallest to the largest corpus the growth of the peak over the growth of the corpus bytes (``growth``: at
most 1 when the peak grows no faster than the corpus), and ``floor``, the peak RSS of tune of one setting on
a 2,000-row task (the interpreter, the imports and the kernels, with next to no data).

Targets (issue 46): peak RSS <= 400 MiB at 1x and growth <= 1, for each budget; the run fails otherwise.
``--quick`` runs a small synthetic task and a tiny grid (a smoke run: no target, its corpus is too small
for the growth to mean anything).

    python benchmarks/tune_memory.py [--data DIR] [--multiples 1 4] [--budgets none 24]
    python benchmarks/tune_memory.py --repo ../old-checkout    # the same runs on another checkout's code
    python benchmarks/tune_memory.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import REPO, print_table, save_results

DEFAULT_DATA = Path(os.environ.get("STREAMWHITEN_STSB", REPO.parent / "shared/data/stsb/stsb-dev-minilm.h5"))
DEFAULT_DATA = DEFAULT_DATA.parent / "retrieval-dev"
TARGET_MIB, TARGET_GROWTH = 400.0, 1.0
MiB = 2**20


def run_measured(command: list[str], repo: Path, output: Path | None = None) -> dict:
    """Run ``command`` with ``repo``'s streamwhiten; its peak RSS (MiB), wall and CPU seconds, and exit status."""
    env = dict(os.environ, PYTHONPATH=str(repo))
    began = time.perf_counter()
    with open(output or os.devnull, "w") as stdout:
        child = subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE, env=env, text=True)
        assert child.stderr is not None  # piped
        errors = child.stderr.read()
        _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - began
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({child.returncode}):\n{errors[-3000:]}")
    return {
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }


def write_rows(path: Path, rows: np.ndarray, multiple: int, noise: float, seed: int) -> str:
    """An HDF5 store of ``rows`` stacked ``multiple`` times, copies after the first with seeded noise of
    ``noise`` times each column's spread; its spec."""
    import h5py

    spread = rows.std(axis=0).astype(np.float32)
    rng = np.random.default_rng(seed)
    n = rows.shape[0]
    with h5py.File(path, "w") as handle:
        data = handle.create_dataset("vectors", shape=(multiple * n, rows.shape[1]), dtype=np.float32)
        for copy in range(multiple):
            block = rows if copy == 0 else rows + noise * spread * rng.standard_normal(rows.shape, dtype=np.float32)
            data[copy * n : (copy + 1) * n] = block
    return f"{path}:/vectors"


def synthetic_task(directory: Path, seed: int = 0) -> dict:
    """A small retrieval task (2,000 x 32 corpus, 40 queries near some of its rows) for ``--quick``."""
    import h5py

    rng = np.random.default_rng(seed)
    n, d, n_queries = 2000, 32, 40
    corpus = (rng.standard_normal((n, d)) @ (rng.standard_normal((d, d)) * np.geomspace(3, 0.1, d)[:, None])).astype(
        np.float32
    )
    picks = rng.choice(n, n_queries, replace=False)
    queries = (corpus[picks] + 1.5 * rng.standard_normal((n_queries, d))).astype(np.float32)
    for name, rows in (("corpus.h5", corpus), ("queries.h5", queries)):
        with h5py.File(directory / name, "w") as handle:
            handle["vectors"] = rows
    (directory / "qrels.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{c}\t1\n" for q, c in enumerate(picks))
    )
    (directory / "exclude.tsv").write_text("query-id\tcorpus-id\n")
    return {
        "corpus": f"{directory / 'corpus.h5'}:/vectors",
        "queries": f"{directory / 'queries.h5'}:/vectors",
        "qrels": str(directory / "qrels.tsv"),
        "exclude": str(directory / "exclude.tsv"),
    }


def floor_mib(directory: Path, repo: Path) -> float:
    """Peak RSS of tune of one setting (the raw vectors as float32) on the small synthetic task: the
    interpreter, the imports and the kernels, with next to no data."""
    small = directory / "floor"
    small.mkdir(exist_ok=True)
    task = synthetic_task(small)
    model = small / "model.npz"
    run_measured([sys.executable, "-m", "streamwhiten", "fit", task["corpus"], "-o", str(model), "-q"], repo)
    grid = ["--betas", "0", "--gammas", "0", "--ks", "32", "--variances", "", "--dtypes", "float32"]
    return run_measured(tune_command(model, task, task["corpus"], None, grid), repo)["peak_rss_mib"]


def retrieval_dev(data: Path, pooling: str) -> dict:
    if not (data / "qrels.tsv").exists():
        raise SystemExit(f"the retrieval-dev task was not found at {data} (give --data DIR, or --quick)")
    return {
        "corpus": f"{data / 'corpus.h5'}:/{pooling}",
        "queries": f"{data / 'queries.h5'}:/{pooling}",
        "qrels": str(data / "qrels.tsv"),
        "exclude": str(data / "exclude.tsv"),
    }


def read_rows(spec: str) -> np.ndarray:
    import h5py

    path, dataset = spec.rsplit(":", 1)
    with h5py.File(path, "r") as handle:
        return np.asarray(handle[dataset], dtype=np.float32)


def tune_command(model: Path, task: dict, corpus: str, budget: int | None, grid: list[str]) -> list[str]:
    command = [sys.executable, "-m", "streamwhiten", "tune", str(model), "--queries", task["queries"]]
    command += ["--corpus", corpus, "--qrels", task["qrels"], "--exclude", task["exclude"], "--json", "-q"]
    return command + (["--max-bytes", str(budget)] if budget is not None else []) + grid


def chosen_of(path: Path) -> dict:
    summary = json.loads(path.read_text())
    best = summary["best"]
    return {
        "chosen": f"{best['storage']} beta={best['beta']:g} gamma={best['gamma']:g} k={best['k']}",
        "ndcg@10": best["ndcg@10"],
        "table_rows": len(summary["table"]),
    }


def growth_rows(rows: list[dict]) -> list[dict]:
    """Per budget: the peak's growth over the corpus bytes' growth, from the smallest corpus to the largest."""
    out = []
    for budget in dict.fromkeys(row["budget"] for row in rows):
        mine = sorted((row for row in rows if row["budget"] == budget), key=lambda row: row["multiple"])
        if len(mine) < 2:
            continue
        first, last = mine[0], mine[-1]
        grown = last["peak_rss_mib"] - first["peak_rss_mib"]
        corpus = last["corpus_mib"] - first["corpus_mib"]
        out.append(
            {
                "budget": budget,
                "from": f"{first['multiple']}x",
                "to": f"{last['multiple']}x",
                "peak_growth_mib": grown,
                "corpus_growth_mib": corpus,
                "growth": grown / corpus,
                "meets": grown / corpus <= TARGET_GROWTH,
            }
        )
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the retrieval-dev directory")
    parser.add_argument("--pooling", default="mean", help="the vectors of retrieval-dev: mean or cls")
    parser.add_argument("--multiples", type=int, nargs="+", default=[1, 4], help="corpus sizes, in copies of it")
    parser.add_argument("--budgets", nargs="+", default=["none", "24"], help="--max-bytes of each run (none: none)")
    parser.add_argument("--noise", type=float, default=1e-3, help="noise of the stacked copies, x each column's spread")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose streamwhiten runs (default: this)")
    parser.add_argument("--workdir", default=None, help="where the stacked corpora go (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="a small synthetic task and a tiny grid: a smoke run")
    parser.add_argument("--results", default=None, help="directory for the JSON result (default: benchmarks/results)")
    args = parser.parse_args(argv)
    budgets = [None if budget == "none" else int(budget) for budget in args.budgets]
    directory = Path(args.workdir or tempfile.mkdtemp(prefix="streamwhiten-tune-mem-"))
    directory.mkdir(parents=True, exist_ok=True)
    grid: list[str] = []
    try:
        if args.quick:
            task = synthetic_task(directory)
            grid = ["--betas", "0,1", "--gammas", "0,1", "--ks", "32,8", "--variances", "", "--dtypes"]
            grid.append("float32,int8,binary,binary+rescore,eigen,bits-random")
            budgets = [None if budget is None else min(budget, 4) for budget in budgets]
        else:
            task = retrieval_dev(args.data, args.pooling)
        rows = read_rows(task["corpus"])
        model = directory / "model.npz"
        fit = [sys.executable, "-m", "streamwhiten", "fit", task["corpus"], "-o", str(model), "--overwrite", "-q"]
        run_measured(fit, args.repo)
        floor = floor_mib(directory, args.repo)
        print(f"floor (tune of one setting on a 2,000-row task): {floor:,.0f} MiB; repo {args.repo}")
        measured = []
        for multiple in args.multiples:
            if multiple == 1:
                corpus = task["corpus"]
            else:
                corpus = write_rows(directory / f"corpus-{multiple}x.h5", rows, multiple, args.noise, seed=multiple)
            corpus_mib = multiple * rows.nbytes / MiB
            for budget in budgets:
                output = directory / f"tune-{multiple}x-{budget}.json"
                result = run_measured(tune_command(model, task, corpus, budget, grid), args.repo, output)
                row = {
                    "multiple": multiple,
                    "budget": "none" if budget is None else budget,
                    "rows": multiple * rows.shape[0],
                    "corpus_mib": corpus_mib,
                    **result,
                    "ratio": result["peak_rss_mib"] / corpus_mib,
                    **chosen_of(output),
                }
                row["meets"] = None if args.quick or multiple != 1 else row["peak_rss_mib"] <= TARGET_MIB
                measured.append(row)
                print(
                    f"  {multiple}x, budget {row['budget']}: peak RSS {row['peak_rss_mib']:,.0f} MiB for a "
                    f"{corpus_mib:,.1f} MiB corpus ({row['ratio']:.1f}x), {row['wall_s']:.1f} s",
                    flush=True,
                )
    finally:
        if args.workdir is None:
            shutil.rmtree(directory, ignore_errors=True)
    columns = ["multiple", "budget", "rows", "corpus_mib", "peak_rss_mib", "ratio", "wall_s", "cpu_s", "chosen"]
    print_table("tune's peak RSS against its corpus", measured, columns + ["ndcg@10", "meets"])
    growth = growth_rows(measured)
    if growth:
        print_table(
            "growth of the peak over the growth of the corpus bytes (<= 1: no faster than the corpus)",
            growth,
            ["budget", "from", "to", "peak_growth_mib", "corpus_growth_mib", "growth", "meets"],
        )
    save_results(
        "tune_memory",
        {
            "floor_mib": floor,
            "runs": measured,
            "growth": growth,
            "args": {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        },
        args.results,
    )
    failed = [row for row in measured if row["meets"] is False]
    if not args.quick:
        failed += [row for row in growth if not row["meets"]]
    if failed:
        raise SystemExit(f"targets missed (peak <= {TARGET_MIB:.0f} MiB at 1x, growth <= {TARGET_GROWTH:g}): {failed}")


if __name__ == "__main__":
    main()
