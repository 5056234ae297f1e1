"""Reproduce the BERT-whitening table on STS-B dev: raw vs whitened cosine Spearman x100, per pooling.

For each pooling (mean, cls, firstlast) of ``stsb-dev-minilm.h5`` the whitening is fitted on the
pairs' own 3,000 vectors (A and B; no labels are used), then scored on the 1,500 labelled pairs:

    rows   beta=gamma=1 and beta=gamma=0
    cells  raw / whitened full d / whitened k=256 / k=128 / k=64

plus the tuned setting, chosen by ``streamwhiten tune``'s grid on the same pairs (in-sample, as in the
literature), and a held-out check: tuned on one half of the pairs, scored on the other (both ways).
The data is not in the repository (licence): give ``--data`` or put it in ``../shared/data/stsb/``
next to the repository root. Results are printed and written as JSON under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from streamwhiten.core.model import finalize  # noqa: E402
from streamwhiten.engine.fit import fit_sources  # noqa: E402
from streamwhiten.evaluation.evaluate import correlations, open_pairs, pair_cosines  # noqa: E402
from streamwhiten.evaluation.tune import PairGrid, grid_search  # noqa: E402

DEFAULT_DATA = os.environ.get(
    "STREAMWHITEN_STSB", os.path.normpath(os.path.join(REPO, "..", "shared", "data", "stsb", "stsb-dev-minilm.h5"))
)
POOLINGS = ("mean", "cls", "firstlast")
SEEDS = ((1.0, "beta=gamma=1"), (0.0, "beta=gamma=0"))
KS = (None, 256, 128, 64)  # None: full d


def seed_rows(data: str, pooling: str, state) -> list[dict]:
    """The two seed rows: raw and whitened at full d, 256, 128, 64 (ks above d are skipped)."""
    specs = (f"{data}:/{pooling}_a", f"{data}:/{pooling}_b", f"{data}:/score")
    rows = []
    with open_pairs(*specs) as pairs:
        d = pairs.n_features
        for beta, label in SEEDS:
            base = finalize(state, beta=beta, gamma=beta)
            models = {
                ("full" if k is None else f"k={k}"): base.with_params(n_components=k or d)
                for k in KS
                if k is None or k <= d
            }
            cosines = pair_cosines(pairs, models)
            cells = {name: correlations(values, pairs.scores)["spearman"] for name, values in cosines.items()}
            rows.append({"pooling": pooling, "setting": label, "beta": beta, "gamma": beta, **cells})
    return rows


def tuned_row(data: str, pooling: str, model) -> dict:
    """The grid's best on all pairs (in-sample) and a two-fold held-out check."""
    specs = (f"{data}:/{pooling}_a", f"{data}:/{pooling}_b", f"{data}:/score")
    with open_pairs(*specs) as pairs:
        result = grid_search(model, pairs, grid=PairGrid(select="argmax"))  # the literature's in-sample best
        a, b, scores = pairs.a.read(0, pairs.n_pairs), pairs.b.read(0, pairs.n_pairs), pairs.scores
    best = result.best
    row = {
        "pooling": pooling,
        "setting": "tuned",
        "raw": result.raw["spearman"],
        "beta": best.beta,
        "gamma": best.gamma,
        "k": best.k,
        "tuned": best.spearman,
        "grid_size": len(result.table),
    }
    folds = []
    with tempfile.TemporaryDirectory(prefix="stsb-halves-") as tmp:
        halves = {}
        for name, index in (("even", np.arange(0, scores.size, 2)), ("odd", np.arange(1, scores.size, 2))):
            paths = [os.path.join(tmp, f"{name}-{part}.npy") for part in ("a", "b", "s")]
            for path, values in zip(paths, (a[index], b[index], scores[index]), strict=False):
                np.save(path, values)
            halves[name] = paths
        for tune_on, test_on in (("even", "odd"), ("odd", "even")):
            with open_pairs(*halves[tune_on]) as tune_pairs, open_pairs(*halves[test_on]) as test_pairs:
                chosen = grid_search(model, tune_pairs, grid=PairGrid(select="argmax"))
                fixed = PairGrid((chosen.best.beta,), (chosen.best.gamma,), (chosen.best.k,), ())
                test = grid_search(model, test_pairs, fixed)
            folds.append(
                {
                    "tuned_on": tune_on,
                    "beta": chosen.best.beta,
                    "gamma": chosen.best.gamma,
                    "k": chosen.best.k,
                    "test_raw": test.raw["spearman"],
                    "test_tuned": test.table[0].spearman,
                }
            )
    row["held_out"] = folds
    row["held_out_delta"] = float(np.mean([f["test_tuned"] - f["test_raw"] for f in folds]))
    return row


def fmt(value) -> str:
    return "   nan" if value is None or not math.isfinite(value) else f"{value:6.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--data", default=DEFAULT_DATA, help=f"stsb-dev-minilm.h5 (default: {DEFAULT_DATA})")
    parser.add_argument("--quick", action="store_true", help="mean pooling only")
    parser.add_argument(
        "--results",
        default=os.path.join(REPO, "benchmarks", "results"),
        help="directory for the JSON results (default: benchmarks/results)",
    )
    args = parser.parse_args(argv)
    if not os.path.exists(args.data):
        print(
            f"stsb_table: skipped: STS-B embeddings not found at {args.data} "
            f"(not in the repository for licence reasons; pass --data PATH)",
            file=sys.stderr,
        )
        return 0
    began = time.perf_counter()
    poolings = POOLINGS[:1] if args.quick else POOLINGS
    rows, tuned = [], []
    for pooling in poolings:
        fit = fit_sources([f"{args.data}:/{pooling}_a", f"{args.data}:/{pooling}_b"])
        rows += seed_rows(args.data, pooling, fit.state)
        tuned.append(tuned_row(args.data, pooling, finalize(fit.state)))

    print(f"STS-B dev ({args.data}): cosine Spearman x100 on 1,500 pairs; whitening fitted on the pairs' own vectors")
    header = f"{'pooling':<10} {'setting':<14} {'raw':>6}   {'full d':>6}  {'k=256':>6}  {'k=128':>6}  {'k=64':>6}"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['pooling']:<10} {row['setting']:<14} {fmt(row['raw'])}   {fmt(row.get('full'))}  "
            f"{fmt(row.get('k=256'))}  {fmt(row.get('k=128'))}  {fmt(row.get('k=64'))}"
        )
    print()
    for row in tuned:
        folds = ", ".join(
            f"tuned on {f['tuned_on']} half -> beta={f['beta']:g} gamma={f['gamma']:g} k={f['k']}: "
            f"{f['test_raw']:.2f} raw -> {f['test_tuned']:.2f}"
            for f in row["held_out"]
        )
        print(
            f"{row['pooling']:<10} tuned: beta={row['beta']:g} gamma={row['gamma']:g} k={row['k']} "
            f"{row['raw']:.2f} raw -> {row['tuned']:.2f} (in-sample, {row['grid_size']} settings)"
        )
        print(f"{'':<10} held out: {folds}; mean change {row['held_out_delta']:+.2f}")
    bad = [
        f"{row['pooling']} {row['setting']} {key}"
        for row in rows
        for key, value in row.items()
        if isinstance(value, float) and not math.isfinite(value)
    ]
    os.makedirs(args.results, exist_ok=True)
    out = os.path.join(args.results, "stsb_table_quick.json" if args.quick else "stsb_table.json")
    with open(out, "w") as handle:
        json.dump(
            {
                "data": os.path.abspath(args.data),
                "rows": rows,
                "tuned": tuned,
                "nonfinite": bad,
                "seconds": time.perf_counter() - began,
            },
            handle,
            indent=2,
        )
    print(f"\nwrote {out} in {time.perf_counter() - began:.1f} s")
    if bad:
        print(f"stsb_table: error: non-finite scores: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
