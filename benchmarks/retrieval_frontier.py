"""The retrieval frontier on the STS-B paraphrase task, by the tune sweep (``tune --queries ...``).

On ``retrieval-dev`` (262 queries, a 13,197-sentence corpus, all-MiniLM-L6-v2 mean and CLS vectors; see its
README.txt), for each pooling: a whitening fitted on the corpus, and :func:`streamwhiten.evaluation.sweep.sweep`
over a grid of beta, gamma and k (the raw vectors and plain centring added to it), each setting stored as
float32, float16, int8, sign bits, and sign bits whose top 100 are re-ranked with float32 vectors. Every
setting is searched exactly (cosine; ties to the lower corpus row; each query's own sentence excluded) and
scored: nDCG@10, recall@1/10/100, MRR@10 (x100), bytes per vector a search reads, retention and the paired
bootstrap 95% interval of the nDCG@10 difference from the raw vectors stored as float32. Printed: each
pooling's frontier (the best nDCG@10 at each size), the choice under a few byte budgets, and the sweep's
time.

Every number of every row is checked against an independent plain numpy evaluation of the same files (h5py
and the csv module to read them; each beta's eigendecomposition recomputed from the model's saved
statistics; full score matrices, a full sort per query, the metrics and the bootstrap written out in
loops): they must be equal to 1e-9, and raw float32 must give the README's reference numbers. The run
fails otherwise.

The int8 section measures the clipping rule: for c in ``--clips``, the nDCG@10 change from float32 and
the reconstruction error ``sum ||y - decode(encode(y))||^2 / sum ||y||^2`` of the unit corpus vectors,
and how well the statistics predict the spread of each unit-vector component (measured std / predicted).

    python benchmarks/retrieval_frontier.py [--data DIR]
    python benchmarks/retrieval_frontier.py --quick
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
from _common import REPO, print_table, save_results

DEFAULT_DATA = Path(os.environ.get("STREAMWHITEN_STSB", REPO.parent / "shared/data/stsb/stsb-dev-minilm.h5"))
DEFAULT_DATA = DEFAULT_DATA.parent / "retrieval-dev"
#: raw float32 nDCG@10, R@10, MRR@10 as the task's README.txt gives them
README_RAW = {"mean": (88.90, 98.28, 86.00), "cls": (87.52, 98.09, 84.39)}
METRICS = ("ndcg@10", "recall@1", "recall@10", "recall@100", "mrr@10")
TOLERANCE = 1e-9


# ------------------------------------------------------------------------------- the independent reference


def read_pairs(path: Path, header: list) -> list:
    with open(path, newline="") as handle:
        reader = csv.reader(handle, delimiter="\t")
        assert next(reader)[: len(header)] == header, path
        return [row for row in reader if row]


class Reference:
    """A plain numpy evaluation of the task's files: nothing from streamwhiten but the model's arrays."""

    def __init__(self, data: Path, pooling: str):
        import h5py

        with h5py.File(data / "queries.h5", "r") as handle:
            self.queries = handle[pooling][()].astype(np.float64)
        with h5py.File(data / "corpus.h5", "r") as handle:
            self.corpus = handle[pooling][()].astype(np.float64)
        self.grades: dict = {}
        for q, c, score in read_pairs(data / "qrels.tsv", ["query-id", "corpus-id", "score"]):
            self.grades.setdefault(int(q), {})[int(c)] = float(score)
        self.excluded = [(int(q), int(c)) for q, c, *_ in read_pairs(data / "exclude.tsv", ["query-id", "corpus-id"])]
        self.query_ids = sorted(q for q, judged in self.grades.items() if any(g > 0 for g in judged.values()))

    @staticmethod
    def unit(y):
        norms = np.sqrt((y * y).sum(axis=1, keepdims=True))
        return np.divide(y, norms, out=np.zeros_like(y), where=norms > 0)

    def weights(self, model, beta, gamma, k):
        """``(W, shift)`` of the map at ``(beta, gamma, k)``, from the model's saved statistics alone:
        ``Sigma_beta = scatter / n + (1 - beta)^2 mu mu^T``, its eigenvectors U (descending), and
        ``W = U_k (Lambda_k + eps lambda_1)^(-gamma/2)``, ``shift = beta mu``; None for the raw vectors."""
        if beta is None:
            return np.eye(model.n_features), np.zeros(model.n_features)
        mean = model.mean
        sigma = model.state.scatter / model.state.n_rows + (1 - beta) ** 2 * np.outer(mean, mean)
        values, vectors = np.linalg.eigh(sigma)
        values, vectors = np.maximum(values[::-1], 0.0), vectors[:, ::-1]
        return vectors[:, :k] * (values[:k] + model.eps * values[0]) ** (-gamma / 2.0), beta * mean

    def int8(self, yc, model, weights, shift, clip):
        """Codes decoded, from the statistics: mean and spread of each component of the unit vectors."""
        sigma = model.state.scatter / model.state.n_rows
        mean = (model.mean - shift) @ weights
        variance = np.maximum(np.einsum("ij,ij->j", weights, sigma @ weights), 0.0)
        energy = np.sum(variance + mean**2)
        std = np.sqrt(variance / energy)
        std = np.maximum(std, 1e-6 * std.max())
        scale, offset = clip * std / 127, mean / math.sqrt(energy)
        return np.clip(np.rint((yc - offset) / scale), -127, 127) * scale + offset

    def ranked(self, scores, depth=100):
        """Each evaluated query's rows by score (best first), ties to the lower row, excluded dropped."""
        scores = scores.copy()
        for q, c in self.excluded:
            scores[q, c] = -np.inf
        rows = np.arange(scores.shape[1])
        out = []
        for q in self.query_ids:
            keep = np.isfinite(scores[q])
            out.append(rows[keep][np.lexsort((rows[keep], -scores[q][keep]))][:depth])
        return out

    def run(self, model, beta, gamma, k, storage, rescore=0, rescore_storage="float32", clip=4.0):
        """Each query's top 100 for the map at ``(beta, gamma, k)`` (``beta`` None: the raw vectors)."""
        weights, shift = self.weights(model, beta, gamma, k)
        yq = self.unit((self.queries - shift) @ weights)
        yc = self.unit((self.corpus - shift) @ weights)

        def stored(kind):
            if kind == "float32":
                return yc.astype(np.float32).astype(np.float64)
            if kind == "float16":
                return yc.astype(np.float16).astype(np.float64)
            return self.int8(yc, model, weights, shift, clip)

        if storage != "binary":
            return self.ranked(yq @ stored(storage).T)
        sq, sc = np.where(yq > 0, 1.0, -1.0), np.where(yc > 0, 1.0, -1.0)
        hamming = (yq.shape[1] - sq @ sc.T) / 2  # ±1 vectors: differing bits
        lists = self.ranked(-hamming, depth=max(100, rescore))
        if not rescore:
            return [rows[:100] for rows in lists]
        again = stored(rescore_storage)
        out = []
        for q, rows in zip(self.query_ids, lists, strict=True):
            top = rows[:rescore]
            values = again[top] @ yq[q]
            out.append(np.concatenate([top[np.lexsort((top, -values))], rows[rescore:100]]))
        return out

    def metrics(self, lists) -> dict:
        out = {name: [] for name in METRICS}
        for q, rows in zip(self.query_ids, lists, strict=True):
            relevant = {c: g for c, g in self.grades[q].items() if g > 0}
            gains = [relevant.get(int(r), 0.0) for r in rows]
            dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains[:10]))
            ideal = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(relevant.values(), reverse=True)[:10]))
            out["ndcg@10"].append(dcg / ideal)
            for cut in (1, 10, 100):
                out[f"recall@{cut}"].append(sum(g > 0 for g in gains[:cut]) / len(relevant))
            first = next((i for i, g in enumerate(gains[:10]) if g > 0), None)
            out["mrr@10"].append(0.0 if first is None else 1.0 / (first + 1))
        return {name: np.array(values) for name, values in out.items()}

    @staticmethod
    def bootstrap(base, other, samples, seed=0):
        diffs = other - base
        rng = np.random.default_rng(seed)
        means = [diffs[rng.integers(0, diffs.size, size=diffs.size)].mean() for _ in range(samples)]
        low, high = np.percentile(means, [2.5, 97.5])
        return 100 * diffs.mean(), 100 * low, 100 * high


# ----------------------------------------------------------------------------------------------- the run


def frontier(data: Path, pooling: str, args, check: list) -> tuple[list, dict]:
    from streamwhiten.core.model import finalize
    from streamwhiten.engine.fit import fit_sources
    from streamwhiten.evaluation.sweep import SweepGrid, choose_within, sweep
    from streamwhiten.evaluation.tune import json_rows
    from streamwhiten.options import RetrievalOptions

    corpus_spec, queries_spec = f"{data}/corpus.h5:/{pooling}", f"{data}/queries.h5:/{pooling}"
    model = finalize(fit_sources(corpus_spec).state, beta=1.0, gamma=1.0)
    began = time.perf_counter()
    result = sweep(
        model, queries_spec, corpus_spec, str(data / "qrels.tsv"),
        grid=SweepGrid(betas=args.betas, gammas=args.gammas, ks=args.ks, variances=[], rescore=args.rescore),
        options=RetrievalOptions(exclude=str(data / "exclude.tsv"), bootstrap=args.bootstrap),
    )  # fmt: skip
    seconds = time.perf_counter() - began
    reference = Reference(data, pooling)
    raw_each = reference.metrics(reference.run(model, None, None, None, "float32"))
    got = [result.raw[m] for m in METRICS]
    check.append(max(abs(a - 100 * float(np.mean(raw_each[m]))) for a, m in zip(got, METRICS, strict=True)))
    as_json = json_rows(result.table)  # the rows as JSON, a frontier row the very dict of its table row
    table, front = [as_json(row) for row in result.table], [as_json(row) for row in result.frontier]
    for row in table:
        beta = None if row.get("vectors") == "raw" else row["beta"]  # the raw vectors: no transformation at all
        each = reference.metrics(
            reference.run(model, beta, row["gamma"], row["k"], row["dtype"], row["rescore"], "float32")
        )
        want = [100 * float(np.mean(each[m])) for m in METRICS]
        want += list(reference.bootstrap(raw_each["ndcg@10"], each["ndcg@10"], args.bootstrap))
        k = row["k"]
        nbytes = {"float32": 4 * k, "float16": 2 * k, "int8": k, "binary": -(-k // 8)}[row["dtype"]]
        nbytes += 4 * k if row["rescore"] else 0
        have = [row[m] for m in METRICS] + [row["difference"], row["low"], row["high"]]
        gap = max(abs(a - b) for a, b in zip(have, want, strict=True))
        check.append(gap if row["bytes_per_vector"] == nbytes else math.inf)
        row.update(pooling=pooling, max_gap_to_numpy=gap)
    readme = tuple(round(result.raw[m], 2) for m in ("ndcg@10", "recall@10", "mrr@10"))
    budgets = []
    for budget in [None, *args.budgets]:
        try:
            chosen = choose_within(result.table, "ndcg@10", budget)
        except Exception as exc:  # noqa: BLE001 - a budget nothing fits is reported as such
            budgets.append({"pooling": pooling, "max_bytes": budget, "chosen": str(exc)})
            continue
        budgets.append(dict(as_json(chosen), pooling=pooling, max_bytes=budget))
    for row in front:
        row["pooling"] = pooling
    info = {
        "model": model,
        "readme_match": readme == README_RAW[pooling],
        "readme_got": readme,
        "raw": result.raw,
        "table": table,
        "budgets": budgets,
        "seconds": seconds,
        "settings": len(result.table),
    }
    return front, info


def int8_sweep(data: Path, pooling: str, model, args) -> list[dict]:
    import h5py

    from streamwhiten.evaluation.qrels import Ids, read_exclude, read_qrels
    from streamwhiten.evaluation.retrieval import SearchSetting, mean_metrics, query_metrics, search_settings
    from streamwhiten.evaluation.search import Exclusions
    from streamwhiten.storage import parse_storage

    with h5py.File(data / "corpus.h5", "r") as handle:
        corpus = handle[pooling][()]
    with h5py.File(data / "queries.h5", "r") as handle:
        queries = handle[pooling][()]
    query_ids, corpus_ids = Ids("queries", len(queries)), Ids("corpus", len(corpus))
    qrels = read_qrels(str(data / "qrels.tsv"), query_ids, corpus_ids)
    query_rows = qrels.query_rows()
    ex_q, ex_c = read_exclude(str(data / "exclude.tsv"), query_ids, corpus_ids, qrels)
    exclude = Exclusions.from_pairs(query_rows.size, np.searchsorted(query_rows, ex_q), ex_c)
    out = []
    for k in [None] + args.ks:
        variant = model if k is None else model.with_params(n_components=k)
        settings = [SearchSetting.make("float32", variant, raw=k is None)] + [
            SearchSetting.make(f"c={c}", variant, raw=k is None, storage=parse_storage("int8", int8_clip=c))
            for c in args.clips
        ]
        found = search_settings(queries[query_rows], corpus, settings, exclude=exclude)
        rows = {name: result.rows for name, result in found.items()}
        base = mean_metrics(query_metrics(rows["float32"], query_rows, qrels))["ndcg@10"]
        unit = settings[0].unit(corpus)
        first = settings[1].quantization
        ratio = unit.std(axis=0) / (first.scale * 127 / first.clip)  # measured std / predicted std
        row = {
            "pooling": pooling,
            "vectors": "raw" if k is None else f"whitened k={k}",
            "std_ratio_p5": float(np.percentile(ratio, 5)),
            "std_ratio_median": float(np.median(ratio)),
            "std_ratio_p95": float(np.percentile(ratio, 95)),
        }
        for setting, c in zip(settings[1:], args.clips, strict=True):
            decoded = setting.quantization.decode(setting.quantization.encode(unit), np.float64)
            row[f"d_ndcg c={c}"] = mean_metrics(query_metrics(rows[setting.name], query_rows, qrels))["ndcg@10"] - base
            row[f"error c={c}"] = float(((unit - decoded) ** 2).sum() / (unit**2).sum())
        out.append(row)
    return out


def shown(row: dict, formats: dict) -> dict:
    """``row`` with the values named in ``formats`` as text in those formats, for a table."""
    return {
        key: format(value, formats[key]) if key in formats and value is not None else value
        for key, value in row.items()
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the retrieval-dev directory")
    parser.add_argument("--poolings", nargs="+", default=["mean", "cls"])
    parser.add_argument("--betas", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    parser.add_argument("--gammas", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    parser.add_argument("--ks", type=int, nargs="+", default=[384, 256, 128, 64, 32])
    parser.add_argument("--budgets", type=int, nargs="+", default=[1536, 384, 128, 48, 16], help="bytes per vector")
    parser.add_argument("--rescore", type=int, default=100, help="bits: re-rank the top N")
    parser.add_argument("--bootstrap", type=int, default=1000, help="resamples of the queries")
    parser.add_argument("--clips", type=float, nargs="+", default=[2, 2.5, 3, 3.5, 4, 5, 6, 8])
    parser.add_argument("--quick", action="store_true", help="a small grid, fewer resamples and clips: a smoke run")
    parser.add_argument("--results", default=None, help="directory for the JSON result (default: benchmarks/results)")
    args = parser.parse_args(argv)
    if args.quick:
        args.betas, args.gammas, args.ks, args.bootstrap, args.clips = [0.0, 1.0], [1.0], [384, 64], 200, [3, 4]
    if not (args.data / "qrels.tsv").exists():
        sys.exit(f"the STS-B retrieval task was not found at {args.data} (pass --data DIR)")
    check: list = []
    payload: dict = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    fronts, budgets, best, sweeps, readme, costs = [], [], [], [], {}, {}
    for pooling in args.poolings:
        front, info = frontier(args.data, pooling, args, check)
        fronts += front
        budgets += info["budgets"]
        for storage in dict.fromkeys(row["storage"] for row in info["table"]):
            rows = [row for row in info["table"] if row["storage"] == storage]
            best.append(max(rows, key=lambda row: (row["ndcg@10"], -row["bytes_per_vector"])))
        readme[pooling] = {"match": info["readme_match"], "got": info["readme_got"], "readme": README_RAW[pooling]}
        n_storages = len({row["storage"] for row in info["table"]})
        costs[pooling] = {
            "settings": info["settings"] // n_storages,
            "storages": n_storages,
            "seconds": info["seconds"],
        }
        payload.setdefault("tables", {})[pooling] = info["table"]
        sweeps += int8_sweep(args.data, pooling, info["model"], args)
    formats = {**dict.fromkeys(METRICS, ".2f"), "retention": ".1f", "difference": "+.2f", "low": "+.2f", "high": "+.2f"}
    columns = ["pooling", "bytes_per_vector", "storage", "vectors", "beta", "gamma", "k"]
    columns += ["ndcg@10", "recall@10", "mrr@10", "retention", "difference", "low", "high"]
    print_table(
        "the frontier: the best nDCG@10 x100 at each number of bytes per vector (retention and difference: against "
        f"the raw vectors stored as float32; [low, high]: paired bootstrap 95%, {args.bootstrap} resamples)",
        [shown(row, formats) for row in fronts],
        columns,
    )
    print_table(
        "the choice within a byte budget (max_bytes; none: the best of all)",
        [shown(row, formats) for row in budgets],
        ["pooling", "max_bytes", *columns[1:]],
    )
    print_table("the best setting of each storage", [shown(row, formats) for row in best], columns)
    clip_columns = [f"d_ndcg c={c}" for c in args.clips] + [f"error c={c}" for c in args.clips]
    clip_formats = {
        **{c: "+.2f" for c in clip_columns if c.startswith("d_")},
        **{c: ".1e" for c in clip_columns if c.startswith("e")},
    }
    print_table(
        "int8 clipping: nDCG@10 change from float32, relative reconstruction error, measured/predicted std",
        [
            shown(row, {**clip_formats, **dict.fromkeys(("std_ratio_p5", "std_ratio_median", "std_ratio_p95"), ".3f")})
            for row in sweeps
        ],
        ["pooling", "vectors", "std_ratio_p5", "std_ratio_median", "std_ratio_p95", *clip_columns],
    )
    for pooling, cost in costs.items():
        print(
            f"\nsweep of {pooling}: {cost['settings']} settings x {cost['storages']} storages in {cost['seconds']:.1f} s "
            "(the fit not included)"
        )
    worst = max(check)
    ok = worst <= TOLERANCE and all(entry["match"] for entry in readme.values())
    print(
        f"\nchecked against a plain numpy evaluation of the same files: largest difference {worst:.2e} "
        f"({'within' if worst <= TOLERANCE else 'OVER'} {TOLERANCE:g}); raw float32 vs the README: "
        + ", ".join(f"{p} {e['got']} {'==' if e['match'] else '!='} {e['readme']}" for p, e in readme.items())
    )
    payload.update(
        frontier=fronts, budgets=budgets, best=best, int8=sweeps, readme=readme, cost=costs, max_gap_to_numpy=worst,
        checked=ok,
    )  # fmt: skip
    save_results("retrieval_frontier", payload, args.results)
    if not ok:
        sys.exit("the numbers do not match the independent evaluation")


if __name__ == "__main__":
    main()
