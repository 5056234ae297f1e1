"""How long ``tune --metric recall@10 --max-bytes 24`` takes on ``neighbours-dev`` with every code family in
the grid, against the sweep as it was before (no budget pruning, no codes: every setting in every storage,
the choice then made within the budget), measured in the same run, on the same queries.

Both run the default grid (5 betas x 5 gammas x 10 k) with two worker threads; "before" is
``sweep(..., budgets=[None, 24])`` with the plain storages (a budget of None turns the pruning off), "now"
is ``sweep`` with ``max_bytes=24`` and the default storages and codes. Printed: wall and CPU seconds,
the rows scored, the choice and the load average around each run (the machine may be shared). Target:
"now" within 3 minutes of wall time on 2 cores.

    python benchmarks/tune_codes_speed.py [--every N] [--budget 24] [--skip-before] [--data DIR]

``--every N`` keeps every N-th query (a shorter run; the speed-up is the same order).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
from _common import REPO, machine, print_table, save_results

DEFAULT_DATA = Path(os.environ.get("STREAMWHITEN_STSB", REPO.parent / "shared/data/stsb/stsb-dev-minilm.h5")).parent


def subset(data: Path, every: int, folder: Path) -> tuple[str, str, str]:
    """The queries, qrels and exclude files of every ``every``-th query of neighbours-dev (ids renumbered)."""
    import h5py

    task = data / "neighbours-dev"
    if every == 1:
        return f"{task / 'queries.h5'}:/mean", str(task / "qrels.tsv"), str(task / "exclude.tsv")
    folder.mkdir(parents=True, exist_ok=True)
    with h5py.File(task / "queries.h5", "r") as handle:
        queries = handle["mean"][:]
    keep = np.arange(0, queries.shape[0], every)
    with h5py.File(folder / "queries.h5", "w") as handle:
        handle["mean"] = queries[keep]
    renumber = {int(old): new for new, old in enumerate(keep)}
    for name in ("qrels.tsv", "exclude.tsv"):
        lines = (task / name).read_text().splitlines()
        kept = [lines[0]]
        for line in lines[1:]:
            fields = line.split("\t")
            if int(fields[0]) in renumber:
                kept.append("\t".join([str(renumber[int(fields[0])]), *fields[1:]]))
        (folder / name).write_text("\n".join(kept) + "\n")
    return f"{folder / 'queries.h5'}:/mean", str(folder / "qrels.tsv"), str(folder / "exclude.tsv")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--budget", type=int, default=24)
    parser.add_argument("--skip-before", action="store_true", help="time only the sweep as it is now")
    parser.add_argument("--results", default=None)
    args = parser.parse_args(argv)
    if not (args.data / "neighbours-dev" / "qrels.tsv").exists():
        print(f"no neighbours-dev task under {args.data}: skipped")
        return 0
    import h5py

    from streamwhiten.core.model import finalize
    from streamwhiten.core.stats import block_moments
    from streamwhiten.evaluation.sweep import STORAGES, SweepGrid, sweep
    from streamwhiten.options import RetrievalOptions

    corpus = f"{args.data / 'retrieval-dev' / 'corpus.h5'}:/mean"
    with h5py.File(args.data / "retrieval-dev" / "corpus.h5", "r") as handle:
        model = finalize(block_moments(handle["mean"][:].astype(np.float64)))
    queries, qrels, exclude = subset(args.data, args.every, REPO / "benchmarks" / "results" / "tune_codes_task")
    options = RetrievalOptions(exclude=exclude, threads=2)
    runs = {"now": (SweepGrid(max_bytes=args.budget, metric="recall@10"), None)}
    if not args.skip_before:
        runs["before"] = (SweepGrid(dtypes=STORAGES, max_bytes=args.budget, metric="recall@10"), [None, args.budget])
    rows = []
    for name, (grid, budgets) in runs.items():
        load = os.getloadavg()
        wall, cpu = time.perf_counter(), time.process_time()
        result = sweep(model, queries, corpus, qrels, grid=grid, options=options, budgets=budgets)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        rows.append(
            {
                "sweep": name,
                "queries": int(result.task.n_queries),
                "rows": len(result.table),
                "wall_s": round(wall, 1),
                "cpu_s": round(cpu, 1),
                "load_before": round(load[0], 1),
                "load_after": round(os.getloadavg()[0], 1),
                "chosen": result.best.storage,
                "recall@10": round(result.best.scores["recall@10"], 2),
            }
        )
        print(rows[-1], flush=True)
    if len(rows) == 2:
        rows[0]["speedup_wall"] = round(rows[1]["wall_s"] / rows[0]["wall_s"], 2)
        rows[0]["speedup_cpu"] = round(rows[1]["cpu_s"] / rows[0]["cpu_s"], 2)
    print_table(f"tune --max-bytes {args.budget} on neighbours-dev (every {args.every} queries)", rows, list(rows[0]))
    save_results("tune_codes_speed", {"machine": machine(), "every": args.every, "rows": rows}, args.results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
