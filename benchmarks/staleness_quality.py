"""Staleness of a published whitening against the real quality lost by keeping it instead of refitting.

A map is published from some statistics; the data then grows or drifts. For each step this prints
``streamwhiten.core.staleness`` (its parts and total, from the statistics alone) next to what keeping
the published map really costs against a refit on the current statistics, on real data
(all-MiniLM-L6-v2 vectors of STS-B, mean and cls poolings):

    Spearman x100   cosine of the 1,500 dev pairs of stsb-dev-minilm.h5 against the gold scores
    nDCG@10 x100    retrieval-dev/: 262 queries against 13,197 corpus rows, exact cosine search in numpy
                    (exclude.tsv pairs dropped, ties to the lower corpus row, BEIR's nDCG@10 with linear
                    gain); the raw vectors must give README.txt's 88.90 (mean) and 87.52 (cls)

loss = refit score - kept score (points). Scenarios (corpus rows 0..2909 are the dev sentences, 2910..
the train-only ones):

    grow      published from the train sentences, then the dev sentences arrive (10 % .. 100 % of them)
    reverse   published from the dev sentences, then the train sentences arrive (25 %, 100 %)
    early     published from the first 400 .. 6,400 rows of a shuffled corpus, then all of it
    shift     grow (100 %), the new rows moved t published standard deviations along a random direction
    distort   grow (100 %), the new rows stretched and squeezed in the published whitened space by
              expm(t R) (R random symmetric, spectral norm 1)

Drifted rows are evaluated as drifted (the queries and pairs are dev sentences, so they move too).
Every step is scored for beta = gamma = 1 and 0.5 and k = 384, 256, 128. The summary gives the rank
correlation (Spearman) of each part, of the total and of other ways to combine the parts with the loss,
and for tolerances from 0.1 to 2 the largest loss of the steps within them; the run fails (exit 1) if a
step within the default tolerance (``max_staleness``) loses 0.5 points or more, or if the raw scores do
not reproduce README.txt. The data is not in the repository (licence): ``--data`` or
``../shared/data/stsb/`` beside the repository root, with ``retrieval-dev/`` next to the .h5 file.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
from _common import print_table, read_all, save_results

from streamwhiten.core.model import finalize
from streamwhiten.core.staleness import COUNTED, PARTS, staleness
from streamwhiten.core.stats import block_moments, merge
from streamwhiten.evaluation.evaluate import spearman
from streamwhiten.params import DEFAULT_MAX_STALENESS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.environ.get(
    "STREAMWHITEN_STSB", os.path.normpath(os.path.join(REPO, "..", "shared", "data", "stsb", "stsb-dev-minilm.h5"))
)
#: README.txt of retrieval-dev: raw cosine nDCG@10 x100.
RAW_NDCG = {"mean": 88.90, "cls": 87.52}
N_DEV = 2910  # corpus rows 0..2909: the unique dev sentences
SETTINGS = [(1.0, 384), (1.0, 256), (1.0, 128), (0.5, 384), (0.5, 256), (0.5, 128)]
QUICK_SETTINGS = [(1.0, 384), (1.0, 128), (0.5, 256)]
SCENARIOS = {
    "grow": (0.1, 0.25, 0.5, 1.0),
    "reverse": (0.25, 1.0),
    "early": (400, 800, 1600, 3200, 6400),
    "shift": (0.5, 1.0, 2.0, 4.0),
    "distort": (0.25, 0.5, 1.0, 2.0),
}
QUICK_SCENARIOS = {"grow": (0.25, 1.0), "early": (800,), "shift": (2.0,), "distort": (1.0,)}
TOLERANCES = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
LOSS_LIMIT = 0.5
#: Other ways to combine the parts, compared with the chosen one (``total``).
COMBINATIONS = {
    "total = max(covariance, shift, dropped)": lambda p: p["staleness"],
    "max of all four (angle too)": lambda p: max(p[part] for part in PARTS),
    "sum of the counted parts": lambda p: sum(p[part] for part in COUNTED),
    "covariance alone": lambda p: p["covariance"],
}


class Retrieval:
    """The retrieval-dev task: queries, qrels and exclusions, scored by exact cosine search."""

    def __init__(self, directory: str):
        qrels = np.loadtxt(os.path.join(directory, "qrels.tsv"), skiprows=1, dtype=np.int64, ndmin=2)
        exclude = np.loadtxt(os.path.join(directory, "exclude.tsv"), skiprows=1, dtype=np.int64, ndmin=2)
        self.directory = directory
        self.n_queries = int(exclude[:, 0].max()) + 1
        self.exclude = exclude[:, :2]
        self.relevant = [set() for _ in range(self.n_queries)]
        for query, row in qrels[:, :2]:
            self.relevant[query].add(int(row))
        discount = 1.0 / np.log2(np.arange(2, 12))
        self.discount = discount
        self.ideal = np.array([discount[: min(len(rows), 10)].sum() for rows in self.relevant])

    def ndcg10(self, queries: np.ndarray, corpus: np.ndarray) -> float:
        """BEIR nDCG@10 x100 (linear gain), averaged over the queries."""
        scores = unit(queries) @ unit(corpus).T
        scores[self.exclude[:, 0], self.exclude[:, 1]] = -np.inf
        tenth = -np.partition(-scores, 9, axis=1)[:, 9]
        total = 0.0
        for query in range(len(scores)):
            candidates = np.flatnonzero(scores[query] >= tenth[query])  # every row tied with the 10th too
            top = candidates[np.lexsort((candidates, -scores[query, candidates]))][:10]  # ties: lower row
            gains = np.array([row in self.relevant[query] for row in top], dtype=float)
            total += float(gains @ self.discount[: len(top)]) / self.ideal[query]
        return 100.0 * total / len(scores)


def unit(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms > 0, norms, 1.0)


def read_scores(path: str) -> np.ndarray:
    import h5py

    with h5py.File(path, "r") as handle:
        return np.asarray(handle["score"], dtype=np.float64)


def pair_spearman(a: np.ndarray, b: np.ndarray, scores: np.ndarray) -> float:
    return 100.0 * spearman(np.einsum("ij,ij->i", unit(a), unit(b)), scores)


class World:
    """One pooling's vectors, as they are evaluated (drifted ones included)."""

    def __init__(self, corpus, queries, a, b, scores):
        self.corpus, self.queries, self.a, self.b, self.scores = corpus, queries, a, b, scores

    def drifted(self, drift) -> World:
        """The new rows (the dev sentences: corpus rows 0..2909, the queries and the pairs) drifted."""
        corpus = self.corpus.copy()
        corpus[:N_DEV] = drift(corpus[:N_DEV])
        return World(corpus, drift(self.queries), drift(self.a), drift(self.b), self.scores)

    def quality(self, model, retrieval: Retrieval) -> tuple[float, float]:
        """(nDCG@10, Spearman) x100 of the vectors whitened by ``model`` (raw vectors for None)."""
        whiten = (lambda rows: rows) if model is None else model.transform
        ndcg = retrieval.ndcg10(whiten(self.queries), whiten(self.corpus))
        return ndcg, pair_spearman(whiten(self.a), whiten(self.b), self.scores)


def drifts(train: np.ndarray, seed: int = 0):
    """The two synthetic drifts, defined in the published (train) whitened space, inside the data's span."""
    mean = train.mean(axis=0)
    eigvals, eigvecs = np.linalg.eigh(np.cov(train, rowvar=False, bias=True))
    keep = eigvals > 1e-10 * eigvals.max()
    basis, root = eigvecs[:, keep], np.sqrt(eigvals[keep])
    rng = np.random.default_rng(seed)
    direction = rng.standard_normal(basis.shape[1])
    direction = (direction / np.linalg.norm(direction) * root) @ basis.T  # one whitened std, in raw units
    sym = rng.standard_normal((basis.shape[1],) * 2)
    sym = (sym + sym.T) / 2
    sym /= np.linalg.norm(sym, ord=2)
    values, vectors = np.linalg.eigh(sym)

    def shift(t):
        return lambda rows: rows + t * direction

    def distort(t):
        inner = (vectors * np.exp(t * values)) @ vectors.T  # expm(t R)
        matrix = (basis / root) @ inner @ (basis * root).T
        return lambda rows: mean + (rows - mean) @ matrix

    return {"shift": shift, "distort": distort}


def steps(corpus: np.ndarray, scenarios: dict, seed: int = 1):
    """``(scenario, size, published statistics, current statistics, drift or None)`` for every step."""
    train, dev = corpus[N_DEV:], corpus[:N_DEV]
    train_state, dev_state = block_moments(train), block_moments(dev)
    drift_of = drifts(train)
    for size in scenarios.get("grow", ()):
        yield "grow", size, train_state, merge(train_state, block_moments(dev[: int(size * len(dev))])), None
    for size in scenarios.get("reverse", ()):
        yield "reverse", size, dev_state, merge(dev_state, block_moments(train[: int(size * len(train))])), None
    if scenarios.get("early"):
        order = np.random.default_rng(seed).permutation(len(corpus))
        everything = block_moments(corpus)
        for size in scenarios["early"]:
            yield "early", size, block_moments(corpus[order[:size]]), everything, None
    for kind in ("shift", "distort"):
        for size in scenarios.get(kind, ()):
            drift = drift_of[kind](size)
            yield kind, size, train_state, merge(train_state, block_moments(drift(dev))), drift


def measure(pooling, world, retrieval, scenarios, settings, progress) -> list[dict]:
    points = []
    for scenario, size, published_state, current_state, drift in steps(world.corpus, scenarios):
        seen = world if drift is None else world.drifted(drift)
        for beta_gamma in sorted({bg for bg, _ in settings}, reverse=True):
            published_full = finalize(published_state, beta=beta_gamma, gamma=beta_gamma)
            refit_full = finalize(current_state, beta=beta_gamma, gamma=beta_gamma)
            for k in [k for bg, k in settings if bg == beta_gamma]:
                published = published_full.with_params(n_components=k)
                refit = refit_full.with_params(n_components=k)
                result = staleness(published, current_state)
                kept_ndcg, kept_spearman = seen.quality(published, retrieval)
                refit_ndcg, refit_spearman = seen.quality(refit, retrieval)
                point = {
                    "pooling": pooling,
                    "scenario": scenario,
                    "size": size,
                    "beta_gamma": beta_gamma,
                    "k": k,
                    **{part: getattr(result, part) for part in PARTS},
                    "staleness": result.total,
                    "ndcg_kept": kept_ndcg,
                    "ndcg_refit": refit_ndcg,
                    "ndcg_loss": refit_ndcg - kept_ndcg,
                    "spearman_kept": kept_spearman,
                    "spearman_refit": refit_spearman,
                    "spearman_loss": refit_spearman - kept_spearman,
                }
                point["loss"] = max(point["ndcg_loss"], point["spearman_loss"])
                points.append(point)
                progress(point)
    return points


def rank_correlation(values, losses) -> float:
    values, losses = np.asarray(values, float), np.asarray(losses, float)
    if values.size < 3 or np.ptp(values) == 0 or np.ptp(losses) == 0:
        return math.nan
    return float(spearman(values, losses))


def summarise(points: list[dict]) -> dict:
    """Rank correlations, the tolerance table and the verdict on the default tolerance."""
    losses = {name: [p[name] for p in points] for name in ("loss", "ndcg_loss", "spearman_loss")}
    correlations = []
    for name in [*PARTS, *COMBINATIONS]:
        score = (lambda p, part=name: p[part]) if name in PARTS else COMBINATIONS[name]
        values = [score(p) for p in points]
        over = [v for v, p in zip(values, points, strict=True) if p["loss"] >= LOSS_LIMIT]
        correlations.append(
            {
                "measure": name,
                **{f"rho_{loss}": rank_correlation(values, series) for loss, series in losses.items()},
                "safe_below": min(over) if over else math.inf,  # every step below this lost < the limit
            }
        )
    tolerances = []
    for tolerance in sorted({*TOLERANCES, DEFAULT_MAX_STALENESS}):
        within = [p for p in points if p["staleness"] <= tolerance]
        tolerances.append(
            {
                "tolerance": tolerance,
                "steps_within": len(within),
                "of": len(points),
                "max_ndcg_loss": max((p["ndcg_loss"] for p in within), default=math.nan),
                "max_spearman_loss": max((p["spearman_loss"] for p in within), default=math.nan),
                "holds": all(p["loss"] < LOSS_LIMIT for p in within),
            }
        )
    default = next(row for row in tolerances if row["tolerance"] == DEFAULT_MAX_STALENESS)
    return {"correlations": correlations, "tolerances": tolerances, "default": default}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--data", default=DEFAULT_DATA, help=f"stsb-dev-minilm.h5 (default: {DEFAULT_DATA})")
    parser.add_argument("--retrieval", help="the retrieval-dev directory (default: retrieval-dev/ beside --data)")
    parser.add_argument("--quick", action="store_true", help="mean pooling, 3 settings, 5 steps")
    parser.add_argument(
        "--results",
        default=os.path.join(REPO, "benchmarks", "results"),
        help="directory for the JSON results (default: benchmarks/results)",
    )
    args = parser.parse_args(argv)
    retrieval_dir = args.retrieval or os.path.join(os.path.dirname(args.data), "retrieval-dev")
    missing = [path for path in (args.data, os.path.join(retrieval_dir, "corpus.h5")) if not os.path.exists(path)]
    if missing:
        print(
            f"staleness_quality: skipped: STS-B data not found at {', '.join(missing)} "
            "(not in the repository for licence reasons; pass --data PATH and --retrieval DIR)",
            file=sys.stderr,
        )
        return 0
    began = time.perf_counter()
    retrieval = Retrieval(retrieval_dir)
    poolings = ("mean",) if args.quick else ("mean", "cls")
    settings = QUICK_SETTINGS if args.quick else SETTINGS
    scenarios = QUICK_SCENARIOS if args.quick else SCENARIOS

    def progress(p):
        print(
            f"  {p['pooling']:<4} {p['scenario']:<7} {p['size']:>6g} b=g={p['beta_gamma']:g} k={p['k']:<3} "
            f"staleness {p['staleness']:7.3f}  loss nDCG {p['ndcg_loss']:+.2f} Spearman {p['spearman_loss']:+.2f}",
            file=sys.stderr,
            flush=True,
        )

    points, raw, problems = [], {}, []
    for pooling in poolings:
        world = World(
            read_all(f"{retrieval_dir}/corpus.h5:/{pooling}").astype(np.float64),
            read_all(f"{retrieval_dir}/queries.h5:/{pooling}").astype(np.float64),
            read_all(f"{args.data}:/{pooling}_a").astype(np.float64),
            read_all(f"{args.data}:/{pooling}_b").astype(np.float64),
            read_scores(args.data),
        )
        ndcg, spearman_raw = world.quality(None, retrieval)
        raw[pooling] = {"ndcg": ndcg, "spearman": spearman_raw, "ndcg_readme": RAW_NDCG[pooling]}
        if abs(ndcg - RAW_NDCG[pooling]) > 0.005:
            problems.append(f"raw {pooling} nDCG@10 is {ndcg:.2f}, README.txt says {RAW_NDCG[pooling]:.2f}")
        points += measure(pooling, world, retrieval, scenarios, settings, progress)

    summary = summarise(points)
    print(
        "\nraw vectors (exact cosine search): "
        + ", ".join(
            f"{pooling} nDCG@10 {r['ndcg']:.2f} (README.txt {r['ndcg_readme']:.2f}), Spearman {r['spearman']:.2f}"
            for pooling, r in raw.items()
        )
    )
    print_table(
        "staleness of the published map and the points lost by keeping it (refit - kept; x100)",
        points,
        ["pooling", "scenario", "size", "beta_gamma", "k", *PARTS, "staleness", "ndcg_loss", "spearman_loss"],
    )
    print_table(
        f"rank correlation (Spearman) with the loss, over {len(points)} steps; loss = the larger of the two",
        summary["correlations"],
        ["measure", "rho_loss", "rho_ndcg_loss", "rho_spearman_loss", "safe_below"],
    )
    print_table(
        f"largest loss of the steps within each tolerance (default {DEFAULT_MAX_STALENESS:g})",
        summary["tolerances"],
        ["tolerance", "steps_within", "of", "max_ndcg_loss", "max_spearman_loss", "holds"],
    )
    default = summary["default"]
    if not default["holds"]:
        problems.append(
            f"a step within the default tolerance {DEFAULT_MAX_STALENESS:g} loses {LOSS_LIMIT} points or more"
        )
    verdict = "holds" if default["holds"] else "FAILS"
    print(
        f"\ndefault max_staleness {DEFAULT_MAX_STALENESS:g}: {verdict} ({default['steps_within']} of "
        f"{default['of']} steps within it, largest loss nDCG {default['max_ndcg_loss']:+.2f}, "
        f"Spearman {default['max_spearman_loss']:+.2f}); {time.perf_counter() - began:.0f} s"
    )
    save_results(
        "staleness_quality_quick" if args.quick else "staleness_quality",
        {
            "data": os.path.abspath(args.data),
            "retrieval": os.path.abspath(retrieval_dir),
            "raw": raw,
            "loss_limit": LOSS_LIMIT,
            "default_max_staleness": DEFAULT_MAX_STALENESS,
            "points": points,
            **summary,
            "problems": problems,
            "seconds": time.perf_counter() - began,
        },
        args.results,
    )
    for problem in problems:
        print(f"staleness_quality: error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
