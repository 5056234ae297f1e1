"""Does the tuned setting hold on queries it was not chosen on? The arg-max against the max-t rule.

On ``retrieval-dev`` (262 queries; see its README.txt) a whitening is fitted on the corpus and the sweep of
``tune --queries ...`` scores its default grid (5 betas x 5 gammas x 10 ks, with the raw vectors (no
transformation), the rotation and centring maps and the rotation's bits truncated to the budgets too small
for the raw sign bits: about 250 settings x 5 storages, and under each budget every vector code family of
``tune --max-bytes`` that fits it: ``codes compared``) ONCE, keeping
each setting's nDCG@10 per query. Then, ``--splits`` times, the queries are cut at random into two halves:
each rule chooses on one half, for each byte budget (none, 12, 24, 48, 96, 384), and its choice is scored on
the other half against the reference of that budget (the raw vectors in the storage with the most bytes that
fits: raw sign bits at 48 and 96 B for 384-d; below that the rotation's sign bits truncated;
:func:`streamwhiten.evaluation.sweep.reference_index`). Printed per budget: the mean and the worst gap
(x100) of the choice against the reference on the unseen half, before (``argmax``: the best score on the
chosen half, the old rule) and after (``maxt``, the default), how often the new rule keeps the reference,
and how its cross-validated forecast (made on the chosen half) compares with what the choice then scores on
the unseen half: ``forecast error``, the mean absolute difference between the forecast gap to the reference
and the gap measured; ``forecast covers``, how often the forecast's 95% interval of the choice's score holds
the score measured. The max-t rule over a coarser grid (beta and gamma in {0, 0.5, 1}, no variance
fractions: about a quarter of the settings) is scored the same way, to see whether fewer candidates buy
power.

The same for labelled pairs (``tune --pairs-a ...``): the STS-B dev pairs (``stsb-dev-minilm.h5``), whitening
fitted on the pairs' own vectors, Spearman x100 recomputed on the unseen half, for the mean and CLS poolings
(CLS is where whitening truly gains: the rule must find it).

And a synthetic task built so that centring truly gains (a common offset and queries at another scale than
their documents: cosine of the centred vectors recovers the direction, raw cosine does not): the same
splits; the new rule must choose a centring setting (beta > 0) in at least 80% of them.

Targets: mean gap >= -0.2 and worst gap >= -1.0 (nDCG@10 x100) at every budget; the synthetic gain found
in >= 80% of the splits. The run fails otherwise.

    python benchmarks/tune_generalization.py [--data DIR] [--splits 20]
    python benchmarks/tune_generalization.py --quick
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import REPO, print_table, save_results

DEFAULT_DATA = Path(os.environ.get("STREAMWHITEN_STSB", REPO.parent / "shared/data/stsb/stsb-dev-minilm.h5"))
BUDGETS = [None, 12, 24, 48, 96, 384]
COARSE = (0.0, 0.5, 1.0)
TARGET_MEAN, TARGET_WORST, TARGET_FOUND = -0.2, -1.0, 0.8


def argmax_row(table: list, means: np.ndarray, eligible: list) -> int:
    """The old choice: the best mean, ties to fewer bytes, then the smaller k, then the grid's order."""
    return min(eligible, key=lambda i: (-means[i], table[i].bytes_per_vector, table[i].k, i))


def splits_of(n_units: int, n_splits: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(n_splits):
        order = rng.permutation(n_units)
        yield np.sort(order[: n_units // 2]), np.sort(order[n_units // 2 :])


def retrieval_splits(name: str, table: list, per_query: np.ndarray, n_features: int, args, budgets) -> list[dict]:
    """Per budget: both rules chosen on one half, scored on the other, over the splits."""
    from streamwhiten.evaluation.select import Rule, forecast, select
    from streamwhiten.evaluation.sweep import reference_index

    bytes_of = np.array([row.bytes_per_vector for row in table])
    rows = []
    for budget in budgets:
        eligible = [i for i in range(len(table)) if budget is None or bytes_of[i] <= budget]
        reference = reference_index(table, n_features, budget)
        others = [i for i in eligible if i != reference]
        gaps: dict = {"argmax": [], "maxt": [], "coarse": []}
        kept, errors, covered, moved_to = 0, [], 0, []
        # the max-t rule over a coarser grid: beta and gamma in {0, 0.5, 1}, no variance fractions
        coarse = [
            i
            for i in others
            if table[i].beta in COARSE and table[i].gamma in COARSE and not table[i].k_label.endswith("%")
        ]
        kept_coarse, argmax_codes = 0, 0
        for chosen_on, unseen in splits_of(per_query.shape[1], args.splits, args.seed):
            means = per_query[:, chosen_on].mean(axis=1)
            picked = select(per_query[others][:, chosen_on], per_query[reference, chosen_on], Rule(seed=args.seed))
            new = reference if picked.index is None else others[picked.index]
            kept += new == reference
            if new != reference:
                moved_to.append(table[new])
            few = select(per_query[coarse][:, chosen_on], per_query[reference, chosen_on], Rule(seed=args.seed))
            few_row = reference if few.index is None else coarse[few.index]
            kept_coarse += few_row == reference
            gaps["coarse"].append(100 * float((per_query[few_row, unseen] - per_query[reference, unseen]).mean()))
            argmax_choice = argmax_row(table, means, eligible)
            argmax_codes += bool(table[argmax_choice].code)
            for rule, row in (("argmax", argmax_choice), ("maxt", new)):
                gaps[rule].append(100 * float((per_query[row, unseen] - per_query[reference, unseen]).mean()))
            if args.forecast:
                predicted = forecast(
                    per_query[others][:, chosen_on], per_query[reference, chosen_on], Rule(seed=args.seed)
                )
                realised = gaps["maxt"][-1]
                errors.append(predicted["difference"]["score"] - realised)
                low, high = predicted["chosen"]["low"], predicted["chosen"]["high"]
                covered += low <= 100 * float(per_query[new, unseen].mean()) <= high
        ref = table[reference]
        rows.append(
            {
                "task": name,
                "budget": "none" if budget is None else budget,
                "reference": f"{ref.vectors} {ref.storage} k={ref.k} ({ref.bytes_per_vector} B)",
                "compared": len(others),
                "codes compared": sum(bool(table[i].code) for i in others),
                "argmax chose a code": f"{argmax_codes}/{args.splits}",
                "argmax mean": float(np.mean(gaps["argmax"])),
                "argmax worst": float(np.min(gaps["argmax"])),
                "maxt mean": float(np.mean(gaps["maxt"])),
                "maxt worst": float(np.min(gaps["maxt"])),
                "kept reference": f"{kept}/{args.splits}",
                "coarse compared": len(coarse),
                "coarse mean": float(np.mean(gaps["coarse"])),
                "coarse worst": float(np.min(gaps["coarse"])),
                "coarse kept": f"{kept_coarse}/{args.splits}",
                "forecast error": float(np.mean(np.abs(errors))) if errors else None,
                "forecast covers": f"{covered}/{args.splits}" if errors else None,
                "moved to": sorted({f"{r.storage} b={r.beta:g} g={r.gamma:g} k={r.k}" for r in moved_to})[:3],
                "_gaps": gaps,
                "_kept": kept,
            }
        )
    return rows


def retrieval(args) -> tuple[list, dict]:
    from streamwhiten.core.model import finalize
    from streamwhiten.engine.fit import fit_sources
    from streamwhiten.evaluation.sweep import SweepGrid, sweep
    from streamwhiten.options import RetrievalOptions

    data = args.data.parent / "retrieval-dev"
    if not (data / "qrels.tsv").exists():
        sys.exit(f"the STS-B retrieval task was not found at {data} (pass --data PATH/stsb-dev-minilm.h5)")
    out, info = [], {}
    for pooling in args.poolings:
        corpus, queries = f"{data}/corpus.h5:/{pooling}", f"{data}/queries.h5:/{pooling}"
        model = finalize(fit_sources(corpus).state, beta=1.0, gamma=1.0)
        began = time.perf_counter()
        result = sweep(
            model, queries, corpus, str(data / "qrels.tsv"),
            grid=SweepGrid(**args.grid),
            options=RetrievalOptions(exclude=str(data / "exclude.tsv"), bootstrap=args.bootstrap),
            budgets=BUDGETS,
        )  # fmt: skip
        seconds = time.perf_counter() - began
        assert result.per_query is not None
        out += retrieval_splits(f"retrieval {pooling}", result.table, result.per_query, model.n_features, args, BUDGETS)
        info[pooling] = {
            "settings x storages": len(result.table),
            "sweep_seconds": seconds,
            "selection": None if result.selection is None else result.selection.to_json(),
        }
    return out, info


def synthetic(args) -> tuple[list, dict]:
    """A task where centring truly gains: a common offset, queries at another scale than their documents."""
    from streamwhiten.core import stats
    from streamwhiten.core.model import finalize
    from streamwhiten.evaluation.sweep import SweepGrid, sweep
    from streamwhiten.options import RetrievalOptions

    rng = np.random.default_rng(args.seed)
    d, n, n_queries = 48, 6000, args.synthetic_queries
    spread = np.exp(0.6 * rng.standard_normal((n, 1)))
    z = rng.standard_normal((n, d)) * spread
    offset = rng.standard_normal(d)
    offset *= args.offset / np.linalg.norm(offset)
    corpus = z + offset
    picks = rng.choice(n, n_queries, replace=False)
    noise = 1.4 * rng.standard_normal((n_queries, d)) * np.linalg.norm(z[picks], axis=1, keepdims=True) / np.sqrt(d)
    queries = offset + np.exp(0.6 * rng.standard_normal((n_queries, 1))) * (z[picks] + noise)
    model = finalize(stats.block_moments(corpus), beta=1.0, gamma=1.0)
    with tempfile.TemporaryDirectory() as tmp:
        qrels = Path(tmp) / "qrels.tsv"
        qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{c}\t1\n" for q, c in enumerate(picks)))
        result = sweep(
            model, queries, corpus, str(qrels), grid=SweepGrid(**args.grid), options=RetrievalOptions(bootstrap=0)
        )
    assert result.per_query is not None
    table = result.table
    rows = retrieval_splits("synthetic", table, result.per_query, d, args, [None])
    centred = next(i for i, r in enumerate(table) if r.vectors == "centred" and r.storage == "float32")
    raw = next(i for i, r in enumerate(table) if r.vectors == "raw" and r.storage == "float32")
    gain = 100 * float((result.per_query[centred] - result.per_query[raw]).mean())
    found = 0
    from streamwhiten.evaluation.select import Rule, select

    for chosen_on, _unseen in splits_of(result.per_query.shape[1], args.splits, args.seed):
        others = [i for i in range(len(table)) if i != raw]
        picked = select(result.per_query[others][:, chosen_on], result.per_query[raw, chosen_on], Rule(seed=args.seed))
        found += picked.index is not None and table[others[picked.index]].beta > 0
    rows[0]["centring gain"] = gain
    rows[0]["found"] = f"{found}/{args.splits}"
    return rows, {"centring_gain_all_queries": gain, "found": found, "splits": args.splits}


def pairs(args) -> list[dict]:
    """The pairs tune: each rule chooses on half the pairs, Spearman recomputed on the other half."""
    from streamwhiten.core import stats
    from streamwhiten.core.model import finalize
    from streamwhiten.evaluation.evaluate import open_pairs, spearman
    from streamwhiten.evaluation.select import Rule, select, spearman_units
    from streamwhiten.evaluation.tune import PairGrid, grid_search

    out = []
    for pooling in args.poolings:
        specs = [f"{args.data}:/{pooling}_a", f"{args.data}:/{pooling}_b", f"{args.data}:/score"]
        with open_pairs(*specs) as opened:
            a, b = opened.a.read(0, opened.n_pairs), opened.b.read(0, opened.n_pairs)
            model = finalize(stats.block_moments(np.vstack([a, b]).astype(np.float64)))
            result = grid_search(model, opened, grid=PairGrid(**{k: v for k, v in args.grid.items() if k != "dtypes"}))
            gold = np.asarray(opened.scores, np.float64)
        cosines, table, d = result.cosines, result.table, model.n_features
        assert cosines is not None
        reference = next(i for i, r in enumerate(table) if r.vectors == "raw")  # the identity map
        others = [i for i in range(len(table)) if i != reference]
        gaps: dict = {"argmax": [], "maxt": []}
        kept = 0
        for chosen_on, unseen in splits_of(gold.size, args.splits, args.seed):
            units, _ = spearman_units(cosines[:, chosen_on], gold[chosen_on])
            means = units.mean(axis=1)
            best = min(range(len(table)), key=lambda i: (-means[i], table[i].k, i))
            picked = select(units[others], units[reference], Rule(seed=args.seed))
            new = reference if picked.index is None else others[picked.index]
            kept += new == reference
            base = spearman(cosines[reference, unseen], gold[unseen])
            for rule, row in (("argmax", best), ("maxt", new)):
                gaps[rule].append(100 * (spearman(cosines[row, unseen], gold[unseen]) - base))
        out.append(
            {
                "task": f"pairs {pooling}",
                "budget": "-",
                "reference": f"raw k={d}",
                "compared": len(others),
                "argmax mean": float(np.mean(gaps["argmax"])),
                "argmax worst": float(np.min(gaps["argmax"])),
                "maxt mean": float(np.mean(gaps["maxt"])),
                "maxt worst": float(np.min(gaps["maxt"])),
                "kept reference": f"{kept}/{args.splits}",
                "_gaps": gaps,
                "_kept": kept,
            }
        )
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="stsb-dev-minilm.h5 (retrieval-dev beside it)")
    parser.add_argument("--poolings", nargs="+", default=["mean", "cls"])
    parser.add_argument("--splits", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--offset", type=float, default=3.5, help="the synthetic task's common offset")
    parser.add_argument("--synthetic-queries", type=int, default=1000, help="the synthetic task's queries")
    parser.add_argument("--no-forecast", dest="forecast", action="store_false", help="skip the forecast check")
    parser.add_argument("--quick", action="store_true", help="a small grid, one pooling, 5 splits: a smoke run")
    parser.add_argument("--results", default=None)
    args = parser.parse_args(argv)
    args.grid = {}
    if args.quick:
        args.grid = dict(betas=[0, 1], gammas=[0, 1], ks=[384, 128, 32], variances=[])
        args.poolings, args.splits, args.bootstrap, args.synthetic_queries = ["mean"], 5, 200, 300
    if not args.data.exists():
        sys.exit(f"the STS-B data was not found at {args.data} (pass --data PATH/stsb-dev-minilm.h5)")
    began = time.perf_counter()
    rows, info = retrieval(args)
    synthetic_rows, synthetic_info = synthetic(
        argparse.Namespace(**{**vars(args), "grid": {**args.grid, "ks": None} if args.grid else {}})
    )
    pair_rows = pairs(args)
    formats = ["argmax mean", "argmax worst", "maxt mean", "maxt worst", "forecast error", "centring gain"]
    formats += ["coarse mean", "coarse worst"]
    shown = [
        {key: (f"{value:+.2f}" if key in formats and value is not None else value) for key, value in row.items()}
        for row in rows + synthetic_rows + pair_rows
    ]
    columns = ["task", "budget", "reference", "compared", "codes compared", *formats[:4], "kept reference"]
    columns += ["argmax chose a code", "forecast error"]
    columns.append("forecast covers")
    print_table(
        f"gap of the choice to the reference on the unseen half (x100; nDCG@10, pairs: Spearman), {args.splits} "
        "random half splits: chosen on one half, scored on the other",
        shown,
        columns,
    )
    print_table(
        "the max-t rule over a coarser grid (beta, gamma in {0, 0.5, 1}; no variance fractions)",
        shown[: len(rows) + 1],
        ["task", "budget", "coarse compared", "coarse mean", "coarse worst", "coarse kept"],
    )
    print_table(
        "synthetic task (centring truly gains)", shown[len(rows) : len(rows) + 1], [*columns, "centring gain", "found"]
    )
    checked = [row for row in rows if row["task"].startswith("retrieval")]
    ok_gaps = all(row["maxt mean"] >= TARGET_MEAN and row["maxt worst"] >= TARGET_WORST for row in checked)
    found = synthetic_info["found"] / synthetic_info["splits"]
    ok = ok_gaps and found >= TARGET_FOUND and synthetic_info["centring_gain_all_queries"] >= 3
    print(
        f"\ntargets: every retrieval budget mean gap >= {TARGET_MEAN} and worst >= {TARGET_WORST}: "
        f"{'met' if ok_gaps else 'NOT MET'}; the synthetic centring gain ({synthetic_info['centring_gain_all_queries']:+.2f}) "
        f"found in {found:.0%} of splits (>= {TARGET_FOUND:.0%}): {'met' if found >= TARGET_FOUND else 'NOT MET'}; "
        f"{time.perf_counter() - began:.0f} s in all"
    )
    clean = [
        {k: v for k, v in row.items() if not k.startswith("_")} | {"gaps": row["_gaps"]}
        for row in rows + synthetic_rows + pair_rows
    ]
    save_results(
        "tune_generalization", {"rows": clean, "retrieval": info, "synthetic": synthetic_info, "ok": ok}, args.results
    )
    if not ok and not args.quick:  # a smoke run is too small for the targets
        sys.exit("a target was not met")


if __name__ == "__main__":
    main()
