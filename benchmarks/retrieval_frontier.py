"""Retrieval with whitening, truncation and quantization on the STS-B paraphrase task (a first version).

On ``retrieval-dev`` (262 queries, a 13,197-sentence corpus, all-MiniLM-L6-v2 mean and CLS vectors; see its
README.txt), for each pooling: the raw vectors and a whitening (beta = gamma = 1) fitted on the corpus at
a few k, each stored as float32, float16, int8, sign bits, and sign bits whose top 100 are re-ranked
with float32 or int8 vectors. Every setting is searched exactly (cosine; ties to the lower corpus row;
each query's own sentence excluded) in one pass over the corpus, and scored: nDCG@10, recall@1/10/100,
MRR@10 (x100), bytes per vector searched, and the paired bootstrap 95% interval of the nDCG@10
difference from raw float32.

Every number is checked against an independent plain numpy evaluation of the same files (h5py and the
csv module to read them, the affine map built from the model's eigenvectors, full score matrices, a
full sort per query, the metrics and the bootstrap written out in loops): they must be equal to 1e-9,
and raw float32 must give the README's reference numbers. The run fails otherwise.

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
from pathlib import Path

import numpy as np
from _common import REPO, print_table, save_results

DEFAULT_DATA = Path(os.environ.get("STREAMWHITEN_STSB", REPO.parent / "shared/data/stsb/stsb-dev-minilm.h5"))
DEFAULT_DATA = DEFAULT_DATA.parent / "retrieval-dev"
#: raw float32 nDCG@10, R@10, MRR@10 as the task's README.txt gives them
README_RAW = {"mean": (88.90, 98.28, 86.00), "cls": (87.52, 98.09, 84.39)}
METRICS = ("ndcg@10", "recall@1", "recall@10", "recall@100", "mrr@10")
TOLERANCE = 1e-9


def storages(rescore: int) -> list[tuple[str, str, int, str]]:
    """``(label, storage, rescore, rescore_storage)`` of each storage compared."""
    return [
        ("float32", "float32", 0, "float32"),
        ("float16", "float16", 0, "float32"),
        ("int8", "int8", 0, "float32"),
        ("binary", "binary", 0, "float32"),
        (f"binary+rescore{rescore}", "binary", rescore, "float32"),
        (f"binary+rescore{rescore}-int8", "binary", rescore, "int8"),
    ]


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

    def mapped(self, x, model, k):
        """``(x - beta mu) U_k (Lambda_k + eps)^(-gamma/2)``, or the raw ``x`` for ``k`` None."""
        if k is None:
            return x
        scales = (model.eigvals[:k] + model.eps_value) ** (-model.gamma / 2.0)
        return (x - model.beta * model.mean) @ (model.eigvecs[:, :k] * scales)

    def int8(self, yc, model, k, clip):
        """Codes decoded, from the statistics: mean and spread of each component of the unit vectors."""
        sigma = model.state.scatter / model.state.n_rows
        if k is None:
            weights, shift = np.eye(model.n_features), np.zeros(model.n_features)
        else:
            weights = model.eigvecs[:, :k] * (model.eigvals[:k] + model.eps_value) ** (-model.gamma / 2.0)
            shift = model.beta * model.mean
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

    def run(self, model, k, storage, rescore, rescore_storage, clip):
        yq = self.unit(self.mapped(self.queries, model, k))
        yc = self.unit(self.mapped(self.corpus, model, k))

        def stored(kind):
            if kind == "float32":
                return yc.astype(np.float32).astype(np.float64)
            if kind == "float16":
                return yc.astype(np.float16).astype(np.float64)
            return self.int8(yc, model, k, clip)

        if storage != "binary":
            return self.ranked(yq @ stored(storage).T)
        sq, sc = np.where(yq > 0, 1.0, -1.0), np.where(yc > 0, 1.0, -1.0)
        hamming = (yq.shape[1] - sq @ sc.T) / 2  # ±1 vectors: differing bits
        lists = self.ranked(-hamming, depth=max(100, rescore))
        if not rescore:
            return lists
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
    from streamwhiten.evaluation.qrels import Ids, read_exclude, read_qrels
    from streamwhiten.evaluation.retrieval import SearchSetting as Setting
    from streamwhiten.evaluation.retrieval import mean_metrics, paired_bootstrap, query_metrics, run_settings
    from streamwhiten.evaluation.search import Exclusions
    from streamwhiten.io import open_source

    corpus_spec, queries_spec = f"{data}/corpus.h5:/{pooling}", f"{data}/queries.h5:/{pooling}"
    model = finalize(fit_sources(corpus_spec).state, beta=1.0, gamma=1.0)
    with open_source(queries_spec) as queries, open_source(corpus_spec) as corpus:
        query_ids, corpus_ids = Ids(queries.label, queries.n_rows), Ids(corpus.label, corpus.n_rows)
        qrels = read_qrels(str(data / "qrels.tsv"), query_ids, corpus_ids)
        query_rows = qrels.query_rows()
        ex_q, ex_c = read_exclude(str(data / "exclude.tsv"), query_ids, corpus_ids, qrels)
        exclude = Exclusions.from_pairs(query_rows.size, np.searchsorted(query_rows, ex_q), ex_c)
        vectors = queries.read(0, queries.n_rows)[query_rows]
        plan, settings = [], []
        for k in [None] + args.ks:
            variant = model if k is None else model.with_params(n_components=k)
            for label, storage, rescore, rescore_storage in storages(args.rescore):
                name = f"{'raw' if k is None else f'k={k}'} {label}"
                settings.append(
                    Setting.make(
                        name, variant, raw=k is None, dtype=storage, rescore=rescore, rescore_dtype=rescore_storage
                    )
                )
                plan.append((name, k, label, storage, rescore, rescore_storage))
        rows = run_settings(vectors, corpus, settings, exclude=exclude, corpus_label=corpus.label)
    reference = Reference(data, pooling)
    assert reference.query_ids == query_rows.tolist()
    per_query = {name: query_metrics(top, query_rows, qrels) for name, top in rows.items()}
    base = per_query["raw float32"]
    reference_base = reference.metrics(reference.run(None, None, "float32", 0, "float32", 4.0))
    table = []
    for (name, k, label, storage, rescore, rescore_storage), setting in zip(plan, settings, strict=True):
        means = mean_metrics(per_query[name])
        diff = paired_bootstrap(base, per_query[name], args.bootstrap, 0)["ndcg@10"]
        expected_each = reference.metrics(reference.run(model, k, storage, rescore, rescore_storage, 4.0))
        expected = {metric: 100 * float(np.mean(values)) for metric, values in expected_each.items()}
        expected_diff = reference.bootstrap(reference_base["ndcg@10"], expected_each["ndcg@10"], args.bootstrap)
        got = [means[m] for m in METRICS] + [diff["difference"], diff["low"], diff["high"]]
        want = [expected[m] for m in METRICS] + list(expected_diff)
        gap = max(abs(a - b) for a, b in zip(got, want, strict=True))
        check.append(gap)
        row = {
            "pooling": pooling,
            "vectors": "raw" if k is None else f"whitened k={k}",
            "storage": label,
            "bytes": setting.quantization.bytes_per_vector,
            "rescore_bytes": setting.rescore_quantization.bytes_per_vector if rescore else None,
            **{m: means[m] for m in METRICS},
            "d_ndcg": diff["difference"],
            "low": diff["low"],
            "high": diff["high"],
            "max_gap_to_numpy": gap,
        }
        table.append(row)
    raw = next(r for r in table if r["vectors"] == "raw" and r["storage"] == "float32")
    readme = tuple(round(raw[m], 2) for m in ("ndcg@10", "recall@10", "mrr@10"))
    return table, {"model": model, "readme_match": readme == README_RAW[pooling], "readme_got": readme}


def int8_sweep(data: Path, pooling: str, model, args) -> list[dict]:
    import h5py

    from streamwhiten.evaluation.qrels import Ids, read_exclude, read_qrels
    from streamwhiten.evaluation.retrieval import SearchSetting as Setting
    from streamwhiten.evaluation.retrieval import mean_metrics, query_metrics, run_settings
    from streamwhiten.evaluation.search import Exclusions

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
        settings = [Setting.make("float32", variant, raw=k is None)] + [
            Setting.make(f"c={c}", variant, raw=k is None, dtype="int8", int8_clip=c) for c in args.clips
        ]
        rows = run_settings(queries[query_rows], corpus, settings, exclude=exclude)
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
    parser.add_argument("--ks", type=int, nargs="+", default=[384, 256, 128, 64])
    parser.add_argument("--rescore", type=int, default=100, help="bits: re-rank the top N")
    parser.add_argument("--bootstrap", type=int, default=1000, help="resamples of the queries")
    parser.add_argument("--clips", type=float, nargs="+", default=[2, 2.5, 3, 3.5, 4, 5, 6, 8])
    parser.add_argument("--quick", action="store_true", help="two ks, fewer resamples and clips: a smoke run")
    parser.add_argument("--results", default=None, help="directory for the JSON result (default: benchmarks/results)")
    args = parser.parse_args(argv)
    if args.quick:
        args.ks, args.bootstrap, args.clips = [384, 64], 200, [3, 4]
    if not (args.data / "qrels.tsv").exists():
        sys.exit(f"the STS-B retrieval task was not found at {args.data} (pass --data DIR)")
    check: list = []
    payload: dict = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    tables, sweeps, readme = [], [], {}
    for pooling in args.poolings:
        table, info = frontier(args.data, pooling, args, check)
        tables += table
        readme[pooling] = {"match": info["readme_match"], "got": info["readme_got"], "readme": README_RAW[pooling]}
        sweeps += int8_sweep(args.data, pooling, info["model"], args)
    columns = ["pooling", "vectors", "storage", "bytes", "rescore_bytes", *METRICS, "d_ndcg", "low", "high"]
    print_table(
        "retrieval on STS-B dev paraphrases (x100; d_ndcg: nDCG@10 minus raw float32, [low, high]: paired "
        f"bootstrap 95%, {args.bootstrap} resamples)",
        [
            shown(row, {**dict.fromkeys(METRICS, ".2f"), "d_ndcg": "+.2f", "low": "+.2f", "high": "+.2f"})
            for row in tables
        ],
        columns,
    )
    clip_columns = [f"d_ndcg c={c}" for c in args.clips] + [f"error c={c}" for c in args.clips]
    formats = {
        **{c: "+.2f" for c in clip_columns if c.startswith("d_")},
        **{c: ".1e" for c in clip_columns if c.startswith("e")},
    }
    print_table(
        "int8 clipping: nDCG@10 change from float32, relative reconstruction error, measured/predicted std",
        [
            shown(row, {**formats, **dict.fromkeys(("std_ratio_p5", "std_ratio_median", "std_ratio_p95"), ".3f")})
            for row in sweeps
        ],
        ["pooling", "vectors", "std_ratio_p5", "std_ratio_median", "std_ratio_p95", *clip_columns],
    )
    worst = max(check)
    ok = worst <= TOLERANCE and all(entry["match"] for entry in readme.values())
    print(
        f"\nchecked against a plain numpy evaluation of the same files: largest difference {worst:.2e} "
        f"({'within' if worst <= TOLERANCE else 'OVER'} {TOLERANCE:g}); raw float32 vs the README: "
        + ", ".join(f"{p} {e['got']} {'==' if e['match'] else '!='} {e['readme']}" for p, e in readme.items())
    )
    payload.update(frontier=tables, int8=sweeps, readme=readme, max_gap_to_numpy=worst, checked=ok)
    save_results("retrieval_frontier", payload, args.results)
    if not ok:
        sys.exit("the numbers do not match the independent evaluation")


if __name__ == "__main__":
    main()
