"""Retrieval evaluation (evaluation.qrels, evaluation.retrieval): BEIR qrels, the metrics against hand-computed
cases and an independent numpy evaluation, the paired bootstrap, quantized storage, and one-line errors."""

import json
import math
import os
import re
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import REPO, write_h5, write_task

from streamwhiten.cli import main
from streamwhiten.core import stats
from streamwhiten.core.model import finalize, load_model, save_model
from streamwhiten.errors import EXIT_BAD_INPUT, BadInputError, NonFiniteError
from streamwhiten.evaluation.qrels import Ids, read_exclude, read_qrels
from streamwhiten.evaluation.retrieval import (
    METRICS,
    RetrievalScores,
    evaluate_retrieval,
    mean_metrics,
    paired_bootstrap,
    query_metrics,
    resolve_storage,
)
from streamwhiten.options import RetrievalOptions

RETRIEVAL_DEV = Path(os.environ.get("STREAMWHITEN_STSB", REPO.parent / "shared/data/stsb/stsb-dev-minilm.h5"))
RETRIEVAL_DEV = RETRIEVAL_DEV.parent / "retrieval-dev"


def write_qrels(path, triples, header="query-id\tcorpus-id\tscore") -> str:
    lines = [header] + ["\t".join(str(v) for v in triple) for triple in triples]
    Path(path).write_text("\n".join(lines) + "\n")
    return str(path)


def qrels_of(tmp_path, triples, n_queries=10, n_corpus=1000):
    path = write_qrels(tmp_path / "qrels.tsv", triples)
    return read_qrels(path, Ids("q", n_queries), Ids("c", n_corpus))


# ----------------------------------------------------------------------------- metrics, by hand


def test_one_relevant_document_at_rank_3(tmp_path):
    qrels = qrels_of(tmp_path, [(0, 7, 1)])
    top = np.array([[4, 5, 7, 8] + [-1] * 96])
    m = query_metrics(top, np.array([0]), qrels)
    assert m["ndcg@10"][0] == pytest.approx(1 / math.log2(4), abs=1e-15)  # DCG 1/log2(3 + 1), IDCG 1
    assert m["mrr@10"][0] == pytest.approx(1 / 3, abs=1e-15)
    assert (m["recall@1"][0], m["recall@10"][0], m["recall@100"][0]) == (0.0, 1.0, 1.0)


def test_graded_documents_in_the_wrong_order(tmp_path):
    """Grades 2 (row 1), 1 (row 2), 0 (row 3), retrieved 3, 2, 1: DCG = 0 + 1/log2(3) + 2/log2(4),
    IDCG = 2/log2(2) + 1/log2(3)."""
    qrels = qrels_of(tmp_path, [(0, 1, 2), (0, 2, 1), (0, 3, 0)])
    m = query_metrics(np.array([[3, 2, 1]]), np.array([0]), qrels)
    assert m["ndcg@10"][0] == pytest.approx((1 / math.log2(3) + 1) / (2 + 1 / math.log2(3)), abs=1e-15)
    assert m["mrr@10"][0] == 0.5  # rank 1 holds a document judged 0: not relevant
    assert (m["recall@1"][0], m["recall@10"][0]) == (0.0, 1.0)


def test_several_relevant_some_beyond_the_cutoffs(tmp_path):
    """Relevant rows 10..14: found at ranks 1, 12 and 101 (that one is not in the top 100), two never."""
    qrels = qrels_of(tmp_path, [(3, r, 1) for r in range(10, 15)], n_corpus=1000)
    top = np.arange(500, 600)[None, :].copy()
    top[0, 0], top[0, 11] = 10, 11
    m = query_metrics(top, np.array([3]), qrels)
    ideal = sum(1 / math.log2(i + 2) for i in range(5))
    assert m["ndcg@10"][0] == pytest.approx(1 / ideal, abs=1e-15)
    assert (m["recall@1"][0], m["recall@10"][0], m["recall@100"][0]) == (0.2, 0.2, 0.4)
    assert m["mrr@10"][0] == 1.0


def test_more_than_ten_relevant_cap_the_ideal_at_ten(tmp_path):
    qrels = qrels_of(tmp_path, [(0, r, 3 if r < 2 else 1) for r in range(12)])
    m = query_metrics(np.arange(12)[None, :], np.array([0]), qrels)
    assert m["ndcg@10"][0] == pytest.approx(1.0, abs=1e-15)
    assert m["recall@10"][0] == pytest.approx(10 / 12, abs=1e-15)


def test_a_tie_goes_to_the_lower_corpus_row(tmp_path):
    """Rows 2 and 5 hold the same vector; only row 5 is relevant: it ranks second, behind its twin."""
    corpus = np.array([[0.0, 1.0], [1.0, -1.0], [1.0, 0.1], [-1.0, 0.0], [0.0, -1.0], [1.0, 0.1]])
    queries = np.array([[1.0, 0.1]])
    path = write_qrels(tmp_path / "qrels.tsv", [(0, 5, 1)])
    result = evaluate_retrieval(queries, corpus, path, options=RetrievalOptions(bootstrap=0)).raw
    assert result.mrr_10 == 50.0 and result.recall_1 == 0.0
    assert result.ndcg_10 == pytest.approx(100 / math.log2(3), abs=1e-12)


# ------------------------------------------------------------------- against an independent numpy evaluation


def numpy_evaluation(queries, corpus, triples, excluded=(), transform=None):
    """Plain numpy: unit vectors in float64 and every score (see :func:`scored`)."""

    def unit(x):
        x = np.asarray(x, np.float64) if transform is None else transform(x)
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)

    return scored(unit(queries) @ unit(corpus).T, triples, excluded)


def scored(scores, triples, excluded=()):
    """The metrics (x100) of a full score matrix (queries x corpus): a full sort per query (ties to the
    lower row, excluded pairs dropped), the metrics by their definitions in loops; and per query."""
    scores = np.array(scores, dtype=np.float64)
    grades = {}
    for q, c, g in triples:
        grades.setdefault(q, {})[c] = g
    for q, c in excluded:
        scores[q, c] = -np.inf
    out = {name: [] for name in METRICS}
    for q in sorted(grades):
        relevant = {c: g for c, g in grades[q].items() if g > 0}
        if not relevant:
            continue
        rows = np.arange(scores.shape[1])
        keep = np.isfinite(scores[q])
        ranked = rows[keep][np.lexsort((rows[keep], -scores[q][keep]))][:100]
        gains = [relevant.get(int(r), 0) for r in ranked]
        dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains[:10]))
        ideal = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(relevant.values(), reverse=True)[:10]))
        out["ndcg@10"].append(dcg / ideal)
        for k in (1, 10, 100):
            out[f"recall@{k}"].append(sum(1 for g in gains[:k] if g > 0) / len(relevant))
        first = next((i for i, g in enumerate(gains[:10]) if g > 0), None)
        out["mrr@10"].append(0.0 if first is None else 1 / (first + 1))
    return {name: 100 * float(np.mean(values)) for name, values in out.items()}, out


@pytest.fixture
def task(tmp_path):
    """40 queries over 2,000 anisotropic corpus rows (as HDF5 stores), graded qrels, excluded pairs."""
    rng = np.random.default_rng(7)
    basis = rng.standard_normal((24, 24)) * np.geomspace(3, 0.1, 24)[:, None]
    corpus = (rng.standard_normal((2000, 24)) @ basis + 4.0).astype(np.float32)
    picks = rng.choice(2000, 40, replace=False)
    queries = (corpus[picks] + 0.6 * rng.standard_normal((40, 24)) @ basis).astype(np.float32)
    triples = [(q, int(picks[q]), int(rng.integers(1, 4))) for q in range(40)]
    triples += [(q, int(rng.integers(0, 2000)), int(rng.integers(0, 3))) for q in range(0, 40, 3)]
    triples = list({(q, c): (q, c, g) for q, c, g in triples}.values())
    triples.append((40, 5, 0))  # a query judged only "not relevant": left out
    excluded = [(q, int(rng.integers(0, 2000))) for q in range(0, 40, 2)]
    relevant = {(q, c) for q, c, g in triples if g > 0}
    excluded = [pair for pair in excluded if pair not in relevant]
    spec_q = write_h5(tmp_path / "q.h5", np.vstack([queries, queries[:1]]), chunk_rows=16)
    spec_c = write_h5(tmp_path / "c.h5", corpus, chunk_rows=128)
    qrels = write_qrels(tmp_path / "qrels.tsv", triples)
    exclude = tmp_path / "exclude.tsv"
    exclude.write_text("query-id\tcorpus-id\n" + "".join(f"{q}\t{c}\n" for q, c in excluded))
    return dict(
        queries=queries, corpus=corpus, triples=triples, excluded=excluded, spec_q=spec_q, spec_c=spec_c,
        qrels=qrels, exclude=str(exclude),
    )  # fmt: skip


@pytest.mark.parametrize("threads, block_rows", [(1, None), (2, 300)])
def test_raw_and_whitened_metrics_equal_a_numpy_evaluation(task, threads, block_rows):
    model = finalize(stats.block_moments(task["corpus"].astype(np.float64)), n_components=16)
    result = evaluate_retrieval(
        task["spec_q"],
        task["spec_c"],
        task["qrels"],
        model=model,
        options=RetrievalOptions(exclude=task["exclude"], threads=threads, block_rows=block_rows),
    )
    weights, shift = model.projection(np.float64)
    raw, raw_each = numpy_evaluation(task["queries"], task["corpus"], task["triples"], task["excluded"])
    white, white_each = numpy_evaluation(
        task["queries"], task["corpus"], task["triples"], task["excluded"],
        transform=lambda x: (np.asarray(x, np.float64) - shift) @ weights,
    )  # fmt: skip
    assert result.n_queries == 40 and result.qrels.n_queries == 41
    for name in METRICS:
        assert result.raw.metric(name) == pytest.approx(raw[name], abs=1e-9)
        assert result.whitened.metric(name) == pytest.approx(white[name], abs=1e-9)
        diff = result.difference.metric(name)
        assert diff.difference == pytest.approx(white[name] - raw[name], abs=1e-9)
        assert diff.low <= diff.difference <= diff.high
    assert (result.whitened.k, result.raw.dtype, result.raw.bytes_per_vector) == (16, "float32", 96)
    assert result.raw.beta is None and "beta" not in result.raw.to_json()  # what does not apply is left out
    # the bootstrap, recomputed as documented
    rng = np.random.default_rng(0)
    diffs = np.array(white_each["ndcg@10"]) - np.array(raw_each["ndcg@10"])
    means = [diffs[rng.integers(0, 40, size=40)].mean() for _ in range(1000)]
    low, high = np.percentile(means, [2.5, 97.5])
    assert result.difference.ndcg_10.low == pytest.approx(100 * low, abs=1e-9)
    assert result.difference.ndcg_10.high == pytest.approx(100 * high, abs=1e-9)


@pytest.mark.parametrize("storage", ["float16", "int8", "binary"])
def test_quantized_storage_equals_a_numpy_evaluation_of_the_decoded_vectors(task, storage):
    model = finalize(stats.block_moments(task["corpus"].astype(np.float64)), beta=1.0, gamma=1.0, n_components=20)
    queries = np.vstack([task["queries"], task["queries"][:1]])  # query 40 is judged, not relevant
    result = evaluate_retrieval(
        queries,
        task["corpus"],
        task["qrels"],
        model=model,
        storage=storage,
        options=RetrievalOptions(exclude=task["exclude"], bootstrap=0),
    )
    weights, shift = model.projection(np.float64)

    def unit(x, whiten):
        y = (np.asarray(x, np.float64) - shift) @ weights if whiten else np.asarray(x, np.float64)
        return y / np.linalg.norm(y, axis=1, keepdims=True)

    for name, whiten in (("raw", False), ("whitened", True)):
        yq, yc = unit(task["queries"], whiten), unit(task["corpus"], whiten)
        if storage == "float16":
            stored = yc.astype(np.float16).astype(np.float64)
        elif storage == "int8":  # the documented rule, from the statistics: mean, spread of the unit vectors
            mu, cov = model.mean, model.state.scatter / model.n_rows
            w = np.eye(yc.shape[1]) if not whiten else weights
            mean = (mu - (0 if not whiten else shift)) @ w
            var = np.einsum("ij,ij->j", w, cov @ w)
            energy = np.sum(var + mean**2)
            scale, offset = 4.0 * np.sqrt(var / energy) / 127, mean / np.sqrt(energy)
            codes = np.clip(np.rint((yc - offset) / scale), -127, 127)
            stored = codes * scale + offset
        else:
            stored = None
        if storage == "binary":  # Hamming distance of sign bits, ties to the lower row
            bq, bc = (yq > 0).astype(np.int64), (yc > 0).astype(np.int64)
            scores = -(bq @ (1 - bc).T + (1 - bq) @ bc.T).astype(np.float64)
        else:
            scores = yq @ stored.T
        expected, _ = scored(scores, task["triples"], task["excluded"])
        for metric in METRICS:
            assert getattr(result, name).metric(metric) == pytest.approx(expected[metric], abs=1e-9), (name, metric)


def test_bits_rescored_over_the_whole_corpus_rank_as_the_float_search(task):
    model = finalize(stats.block_moments(task["corpus"].astype(np.float64)), n_components=16)
    args = (task["spec_q"], task["spec_c"], task["qrels"])
    floats = evaluate_retrieval(*args, model=model, options=RetrievalOptions(exclude=task["exclude"], bootstrap=0))
    rescored = evaluate_retrieval(
        *args,
        model=model,
        storage=resolve_storage(model, dtype="binary", rescore=2000),
        options=RetrievalOptions(exclude=task["exclude"], block_rows=500, bootstrap=0),
    )
    bits = evaluate_retrieval(
        *args, model=model, storage="binary", options=RetrievalOptions(exclude=task["exclude"], bootstrap=0)
    )
    # issue #36: a re-ranking deeper than the corpus re-ranks all of it (10**9 asked for 447 GiB of top lists)
    deepest = evaluate_retrieval(
        *args,
        model=model,
        storage=resolve_storage(model, dtype="binary", rescore=10**9),
        options=RetrievalOptions(exclude=task["exclude"], bootstrap=0),
    )
    for name in ("raw", "whitened"):
        expected = [getattr(floats, name).metric(m) for m in METRICS]
        assert [getattr(rescored, name).metric(m) for m in METRICS] == expected
        assert [getattr(deepest, name).metric(m) for m in METRICS] == expected
    assert bits.whitened.ndcg_10 != floats.whitened.ndcg_10
    # bytes per vector: the bits and the float32 vectors the re-ranking reads from disk
    assert rescored.whitened.bytes_per_vector == 2 + 16 * 4 and rescored.whitened.rescore == 2000
    assert bits.whitened.bytes_per_vector == 2


def test_the_bootstrap_is_paired_seeded_and_optional():
    rng = np.random.default_rng(1)
    first = {"a": rng.random(300), "b": rng.random(300)}
    second = {"a": first["a"] + 0.01, "b": first["b"] + rng.normal(0, 0.1, 300)}
    out = paired_bootstrap(first, second, samples=500, seed=3)
    assert out == paired_bootstrap(first, second, samples=500, seed=3)
    assert out["a"].low == pytest.approx(1.0) and out["a"].high == pytest.approx(1.0)  # paired: no noise
    assert out["b"].low < out["b"].difference < out["b"].high
    assert paired_bootstrap(first, second, samples=0)["b"].low is None
    assert mean_metrics({"a": np.array([0.5, 1.0])}) == {"a": 75.0}


def test_scores_print_their_fields_in_the_order_the_search_settings_record_them():
    """`RetrievalScores.to_json`: the metrics, then what applies (None left out), a code's int8 span after its
    re-ranking (as ``make_code`` records it), a plain storage's before (as ``make`` does)."""
    metrics = dict.fromkeys(METRICS, 50.0)
    bits = RetrievalScores.of(
        metrics, dtype="binary", bytes_per_vector=18, int8_clip=4.0, rescore=20, rescore_dtype="int8"
    )
    code = RetrievalScores.of(
        metrics, dtype="eigen:8", code="eigen-8B", bytes_per_vector=24, int8_clip=4.0, rescore=20,
        rescore_dtype="int8", model_bytes=1671, beta=1.0, gamma=1.0, k=16,
    )  # fmt: skip
    assert list(bits.to_json()) == [*METRICS, "dtype", "bytes_per_vector", "int8_clip", "rescore", "rescore_dtype"]
    assert list(code.to_json()) == [
        *METRICS, "dtype", "code", "bytes_per_vector", "rescore", "rescore_dtype", "int8_clip", "model_bytes",
        "beta", "gamma", "k",
    ]  # fmt: skip
    assert bits.metric("recall@10") == bits.recall_10 == 50.0 and bits.to_json()["int8_clip"] == 4.0


def test_options_are_one_checked_object(task):
    model = finalize(stats.block_moments(task["corpus"].astype(np.float64)), n_components=8)
    args = (task["spec_q"], task["spec_c"], task["qrels"])
    options = RetrievalOptions(exclude=task["exclude"], bootstrap=150, seed=3, block_rows=300, threads=2)
    result = evaluate_retrieval(*args, model=model, options=options, storage="int8")
    assert result.exclude.n_pairs == len(task["excluded"]) and result.bootstrap.samples == 150
    assert result == evaluate_retrieval(*args, model=model, options=options, storage=resolve_storage(model, "int8"))
    with pytest.raises(BadInputError, match=r"^options must be a RetrievalOptions, got dict$"):
        evaluate_retrieval(*args, options={"bootstrap": 10})  # type: ignore[arg-type]
    with pytest.raises(BadInputError, match=r"^seed must be a whole number, 0 or more, got -1$"):
        RetrievalOptions(seed=-1)


def test_ids_from_parquet_id_columns_give_what_rows_give(tmp_path, task):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    def table(vectors, prefix):
        ids = [f"{prefix}-{i:05d}" for i in range(len(vectors))]
        column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])
        return pa.table({"id": ids, "embedding": column})

    pq.write_table(table(task["queries"], "q"), tmp_path / "q.parquet")
    pq.write_table(table(task["corpus"], "doc"), tmp_path / "c.parquet", row_group_size=500)
    write_qrels(tmp_path / "qrels-ids.tsv", [(f"q-{q:05d}", f"doc-{c:05d}", g) for q, c, g in task["triples"][:-1]])
    (tmp_path / "exclude-ids.tsv").write_text(
        "query-id\tcorpus-id\n" + "".join(f"q-{q:05d}\tdoc-{c:05d}\n" for q, c in task["excluded"])
    )
    by_id = evaluate_retrieval(
        f"{tmp_path}/q.parquet:embedding",
        f"{tmp_path}/c.parquet:embedding",
        tmp_path / "qrels-ids.tsv",
        options=RetrievalOptions(
            exclude=tmp_path / "exclude-ids.tsv", query_id_column="id", corpus_id_column="id", bootstrap=0
        ),
    )
    by_row = evaluate_retrieval(
        task["spec_q"], task["spec_c"], task["qrels"], options=RetrievalOptions(exclude=task["exclude"], bootstrap=0)
    )
    assert by_id.raw == by_row.raw
    with pytest.raises(BadInputError, match=r"q\.parquet:embedding: has no column 'key' to read ids from$"):
        evaluate_retrieval(
            f"{tmp_path}/q.parquet:embedding",
            f"{tmp_path}/c.parquet:embedding",
            tmp_path / "qrels-ids.tsv",
            options=RetrievalOptions(query_id_column="key"),
        )
    write_qrels(tmp_path / "qrels-ids.tsv", [("q-00000", "doc-00001", 1), ("q-00001", "doc-99999", 1)])
    with pytest.raises(
        BadInputError, match=r"qrels-ids\.tsv: line 3: corpus-id 'doc-99999' is not an id in column 'id' "
    ):
        evaluate_retrieval(
            f"{tmp_path}/q.parquet:embedding",
            f"{tmp_path}/c.parquet:embedding",
            tmp_path / "qrels-ids.tsv",
            options=RetrievalOptions(query_id_column="id", corpus_id_column="id"),
        )


# ---------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "text, message",
    [
        ("0\t1\t1\n", "line 1: expected the header 'query-id<TAB>corpus-id<TAB>score', got '0<TAB>1<TAB>1'"),
        ("query-id\tcorpus-id\n0\t1\n", "line 1: expected the header 'query-id<TAB>corpus-id<TAB>score'"),
        ("", "the file is empty (expected the header 'query-id<TAB>corpus-id<TAB>score')"),
        ("query-id\tcorpus-id\tscore\n", "holds no judged pair (only the header)"),
        ("query-id\tcorpus-id\tscore\n0\t1\t0\n1\t2\t-1\n", "holds no relevant pair (score > 0)"),
        ("query-id\tcorpus-id\tscore\n0\t1\t1\n0\t9\thigh\n", "line 3: score 'high' is not a number"),
        ("query-id\tcorpus-id\tscore\n0\t1\tnan\n", "line 2: score 'nan' is not a finite number"),
        (
            "query-id\tcorpus-id\tscore\n0\t1\t1\n\n1\t2000\t1\n",
            "line 4: corpus-id '2000' is not a row of c.h5:/emb (2,000 rows, counted from 0)",
        ),
        ("query-id\tcorpus-id\tscore\n41\t1\t1\n", "line 2: query-id '41' is not a row of q.h5:/emb (41 rows"),
        ("query-id\tcorpus-id\tscore\n-1\t1\t1\n", "line 2: query-id '-1' is not a row of"),
        ("query-id\tcorpus-id\tscore\n0\t1\t1\t\n", "line 2: has 4 field(s), the header 3"),
        (
            "query-id\tcorpus-id\tscore\n0\t1\t1\n2\t3\t1\n0\t1\t2\n",
            "line 4: the pair of query row 0 and corpus row 1 was already judged on line 2",
        ),
    ],
)
def test_bad_qrels_are_one_line_naming_file_and_line(tmp_path, task, text, message):
    (tmp_path / "bad.tsv").write_text(text)
    with pytest.raises(BadInputError) as caught:
        evaluate_retrieval(task["spec_q"], task["spec_c"], tmp_path / "bad.tsv")
    text = str(caught.value)
    assert "\n" not in text and text.startswith(f"{tmp_path}/bad.tsv: ") and message in text.replace(f"{tmp_path}/", "")


def test_bad_exclude_files_and_stores(tmp_path, task):
    (tmp_path / "ex.tsv").write_text(f"query-id\tcorpus-id\n3\t{task['triples'][3][1]}\n")
    with pytest.raises(BadInputError, match=r"ex\.tsv: line 2: excludes the pair of query row 3 and corpus row \d+, "):
        evaluate_retrieval(
            task["spec_q"], task["spec_c"], task["qrels"], options=RetrievalOptions(exclude=tmp_path / "ex.tsv")
        )
    (tmp_path / "ex.tsv").write_text("query\tcorpus\n3\t1\n")
    with pytest.raises(BadInputError, match=r"ex\.tsv: line 1: expected the header 'query-id<TAB>corpus-id'"):
        evaluate_retrieval(
            task["spec_q"], task["spec_c"], task["qrels"], options=RetrievalOptions(exclude=tmp_path / "ex.tsv")
        )
    narrow = write_h5(tmp_path / "narrow.h5", task["corpus"][:, :20])
    with pytest.raises(BadInputError, match=r"^queries and corpus differ in width: .*q\.h5:/emb has 24 columns but "):
        evaluate_retrieval(task["spec_q"], narrow, task["qrels"])
    model = finalize(stats.block_moments(task["corpus"][:, :20].astype(np.float64)))
    with pytest.raises(BadInputError, match=r"the model expects 20 features but .*c\.h5:/emb has 24"):
        evaluate_retrieval(task["spec_q"], task["spec_c"], task["qrels"], model=model)
    with pytest.raises(BadInputError, match="int8 storage needs a fitted model"):
        evaluate_retrieval(task["spec_q"], task["spec_c"], task["qrels"], storage="int8")
    with pytest.raises(BadInputError, match="rescore re-ranks a bit search"):
        resolve_storage(None, rescore=10)
    for storage, message in (
        ({"dtype": "int4"}, 'dtype must be "float32", "float16", "int8", "binary" or a vector code NAME:BYTES'),
        ({"dtype": "binary", "rescore": 5, "rescore_dtype": "binary"}, "rescore_dtype must be"),
        ({"rescore": -1}, "rescore must be a whole number, 0 or more, got -1"),
        ({"dtype": "int8", "int8_clip": 0.0}, "int8_clip must be a number of standard deviations"),
    ):
        with pytest.raises(BadInputError, match=f"^{re.escape(message)}"):
            resolve_storage(model, **storage)  # checked before anything is read
    with pytest.raises(BadInputError, match="^bootstrap must be a whole number of resamples"):
        RetrievalOptions(bootstrap=1.5)
    with pytest.raises(BadInputError, match=r"an id column needs a Parquet or Lance store; the ids of a hdf5 store"):
        evaluate_retrieval(
            task["spec_q"], task["spec_c"], task["qrels"], options=RetrievalOptions(corpus_id_column="id")
        )
    corpus = task["corpus"].copy()
    corpus[1234, 5] = np.nan
    bad = write_h5(tmp_path / "nan.h5", corpus, chunk_rows=100)
    with pytest.raises(NonFiniteError, match=r"nan\.h5:/emb: row 1234 holds NaN or Inf$"):
        evaluate_retrieval(task["spec_q"], bad, task["qrels"], options=RetrievalOptions(block_rows=500))


def test_read_exclude_keeps_pairs_of_queries_without_judgements(tmp_path):
    path = tmp_path / "ex.tsv"
    path.write_text("query-id\tcorpus-id\tscore\n2\t5\t1\n2\t5\t1\n0\t1\t0\n")
    queries, rows = read_exclude(str(path), Ids("q", 3), Ids("c", 10))
    assert queries.tolist() == [0, 2] and rows.tolist() == [1, 5]


# ------------------------------------------------------------------------------------ the real task


@pytest.mark.parametrize("pooling, expected", [("mean", (88.90, 98.28, 86.00)), ("cls", (87.52, 98.09, 84.39))])
def test_stsb_retrieval_dev_raw_numbers_match_its_readme(pooling, expected):
    if not (RETRIEVAL_DEV / "qrels.tsv").exists():
        pytest.skip(f"the STS-B retrieval task was not found at {RETRIEVAL_DEV} (licensed data kept out of the repo)")
    result = evaluate_retrieval(
        f"{RETRIEVAL_DEV}/queries.h5:/{pooling}",
        f"{RETRIEVAL_DEV}/corpus.h5:/{pooling}",
        RETRIEVAL_DEV / "qrels.tsv",
        options=RetrievalOptions(exclude=RETRIEVAL_DEV / "exclude.tsv", bootstrap=0),
    ).raw
    got = tuple(round(result.metric(name), 2) for name in ("ndcg@10", "recall@10", "mrr@10"))
    assert got == expected


# ---------------------------------------------------------------------------------- the command line


def eval_args(task, *extra):
    return ["eval", *extra, "--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", task["qrels"]]


def saved_model(tmp_path, corpus, **params) -> str:
    path = str(tmp_path / "model.npz")
    save_model(finalize(stats.block_moments(corpus.astype(np.float64)), **params), path)
    return path


def test_cli_eval_json_keeps_the_library_shape_with_intervals(tmp_path, capsys):
    task = write_task(tmp_path, seed=3, graded=True)
    model_path = saved_model(tmp_path, task["corpus"], n_components=8)
    args = eval_args(task, model_path, "--exclude", task["exclude"], "--dtype", "int8", "--bootstrap", "300")
    assert main([*args, "--seed", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = evaluate_retrieval(
        task["spec_q"],
        task["spec_c"],
        task["qrels"],
        model=load_model(model_path),
        storage="int8",
        options=RetrievalOptions(exclude=task["exclude"], bootstrap=300, seed=4),
    )
    assert out == json.loads(json.dumps(replace(expected, model=model_path).to_json()))
    for name in ("raw", "whitened"):
        assert {"ndcg@10", "recall@1", "recall@10", "recall@100", "mrr@10", "dtype", "bytes_per_vector"} <= set(
            out[name]
        )
    assert (out["raw"]["bytes_per_vector"], out["whitened"]["bytes_per_vector"], out["whitened"]["k"]) == (16, 8, 8)
    for name in METRICS:
        d = out["difference"][name]
        assert d["difference"] == pytest.approx(out["whitened"][name] - out["raw"][name], abs=1e-9)
        assert d["low"] <= d["difference"] <= d["high"]
    assert out["bootstrap"] == {"samples": 300, "seed": 4, "level": 0.95}
    assert main(eval_args(task, "--json")) == 0  # without a model: the raw vectors alone
    alone = json.loads(capsys.readouterr().out)
    assert alone["whitened"] is None and alone["difference"] is None and alone["model"] is None


@pytest.mark.parametrize(
    "params, noise, loud, verdict, per_metric",
    [
        ({"beta": 1.0, "gamma": 1.0}, 1.0, 0.0, "nDCG@10: raw wins, whitened -", "worse, beyond noise"),
        ({"beta": 0.0, "gamma": 0.0}, 1.0, 0.0, "nDCG@10: within noise, +0.00", "within noise"),
        ({"beta": 1.0, "gamma": 1.0}, 0.01, 6.0, "nDCG@10: whitening wins, +", "better, beyond noise"),
    ],
)
def test_cli_eval_text_shows_the_interval_and_says_who_wins(tmp_path, capsys, params, noise, loud, verdict, per_metric):
    # isotropic query noise: full whitening amplifies it in the quiet directions (raw wins); a rotation ranks
    # as raw (no difference); noise along the loudest direction is what whitening quiets (whitening wins)
    task = write_task(tmp_path, seed=0, noise=noise, loud=loud)
    model_path = saved_model(tmp_path, task["corpus"], **params)
    assert main(eval_args(task, model_path)) == 0
    text = capsys.readouterr().out
    assert "difference" not in text or "[95% interval, 1,000 resamples of the queries]" in text
    line = next(line for line in text.splitlines() if line.startswith("ndcg@10"))
    assert re.search(r"[+-]\d+\.\d\d \[[+-]\d+\.\d\d, [+-]\d+\.\d\d\]", line) and line.endswith(per_metric)
    assert f"verdict   {verdict}" in text
    assert "storage   float32: raw 64 bytes per vector, whitened 64 (k=16)" in text


def test_cli_eval_dtype_binary_and_rescore(tmp_path, capsys):
    task = write_task(tmp_path, seed=2)
    model_path = saved_model(tmp_path, task["corpus"], n_components=16)
    assert main([*eval_args(task, model_path, "--dtype", "binary", "--rescore", "1500"), "--json"]) == 0
    rescored = json.loads(capsys.readouterr().out)
    assert main([*eval_args(task, model_path), "--json"]) == 0
    floats = json.loads(capsys.readouterr().out)
    for name in ("raw", "whitened"):  # every candidate re-ranked: the float ranking back, at the bytes of both
        assert {m: rescored[name][m] for m in METRICS} == {m: floats[name][m] for m in METRICS}
        assert rescored[name]["bytes_per_vector"] == 2 + 64
    assert main(eval_args(task, model_path, "--dtype", "binary", "--rescore", "50", "--rescore-dtype", "int8")) == 0
    assert "binary, the top 50 re-ranked with int8 vectors: raw 18 bytes per vector" in capsys.readouterr().out


def test_cli_eval_bad_input_is_one_line_naming_file_and_line(tmp_path, capsys):
    task = write_task(tmp_path, seed=1, n=300, n_queries=10)
    qrels = tmp_path / "qrels.tsv"
    cases = [
        ("query-id\tcorpus-id\tscore\n0\t1\t1\n1\t300\t1\n", "qrels.tsv: line 3: corpus-id '300' is not a row of "),
        ("query-id\tcorpus-id\tscore\n0\t1\t1\n10\t2\t1\n", "qrels.tsv: line 3: query-id '10' is not a row of "),
        ("query-id\tcorpus-id\tscore\n", "qrels.tsv: holds no judged pair (only the header)"),
        ("", "qrels.tsv: the file is empty (expected the header 'query-id<TAB>corpus-id<TAB>score')"),
        ("query-id\tcorpus-id\tscore\n0\t1\t1\n1\t2\tgood\n", "qrels.tsv: line 3: score 'good' is not a number"),
        ("0\t1\t1\n", "qrels.tsv: line 1: expected the header 'query-id<TAB>corpus-id<TAB>score', got '0<TAB>1<TAB>1'"),
    ]
    for text, message in cases:
        qrels.write_text(text)
        assert main(eval_args(task)) == EXIT_BAD_INPUT, text
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("streamwhiten: error: ") and message in err, (text, err)
    # the same columns comma-separated in a .csv are read alike, and so are its mistakes
    (tmp_path / "qrels.csv").write_text("query-id,corpus-id,score\n0,1,1\n1,2,x\n")
    assert (
        main(["eval", "--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", tmp_path / "qrels.csv"]) == 2
    )
    assert "qrels.csv: line 3: score 'x' is not a number" in capsys.readouterr().err
    qrels.write_text("query-id\tcorpus-id\tscore\n0\t1\t1\n")
    narrow = write_h5(tmp_path / "narrow.h5", task["corpus"][:, :10])
    assert main(["eval", "--queries", task["spec_q"], "--corpus", narrow, "--qrels", qrels]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "queries and corpus differ in width: " in err and "has 16 columns but " in err
    # a FIFO is refused at once, never opened (the read would block)
    fifo = tmp_path / "fifo.tsv"
    os.mkfifo(fifo)
    assert main(["eval", "--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", fifo]) == EXIT_BAD_INPUT
    assert f"{fifo}: is a FIFO (named pipe), not a regular file" in capsys.readouterr().err
    assert main(["eval", "--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", tmp_path / "no.tsv"]) == 2
    assert "no.tsv: no such file or directory" in capsys.readouterr().err


def test_cli_eval_ids_that_name_no_row_of_an_id_column(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    task = write_task(tmp_path, seed=1, n=300, n_queries=10)
    for name, vectors in (("q", task["queries"]), ("c", task["corpus"])):
        column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), vectors.shape[1])
        pq.write_table(
            pa.table({"id": [f"{name}{i}" for i in range(len(vectors))], "v": column}), tmp_path / f"{name}.pq"
        )
    (tmp_path / "ids.tsv").write_text("query-id\tcorpus-id\tscore\nq0\tc1\t1\nq1\tdoc-7\t1\n")
    args = [
        "eval",
        "--queries",
        f"{tmp_path}/q.pq:v",
        "--corpus",
        f"{tmp_path}/c.pq:v",
        "--qrels",
        tmp_path / "ids.tsv",
    ]
    assert main([*args, "--query-ids", "id", "--corpus-ids", "id"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ids.tsv: line 3: corpus-id 'doc-7' is not an id in column 'id' of " in err


def test_cli_eval_modes_are_exclusive(tmp_path, capsys):
    task = write_task(tmp_path, seed=1, n=300, n_queries=10)
    pairs = ["--pairs-a", task["spec_q"], "--pairs-b", task["spec_q"], "--scores", task["qrels"]]
    for args, message in (
        ([*eval_args(task), *pairs], "give labelled pairs (--pairs-a, --pairs-b, --scores) or a retrieval task"),
        (["eval"], "give labelled pairs (--pairs-a, --pairs-b, --scores) or a retrieval task"),
        (["eval", "--queries", task["spec_q"], "--qrels", task["qrels"]], "needs --queries, --corpus and --qrels"),
        (["eval", *pairs, "--dtype", "int8"], "--dtype is for a retrieval task"),
        ([*eval_args(task), "--dtype", "int8"], "int8 storage needs a fitted model"),
    ):
        assert main(args) == EXIT_BAD_INPUT, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (args, err)


def test_apply_outputs_search_as_eval_searches(tmp_path, capsys):
    """What apply writes is what eval searches: its float output is a store eval reads like any other (the
    raw vectors of a search, float32 or bits), and its int8 codes, decoded, rank as eval's int8 search."""
    from streamwhiten import serving
    from streamwhiten.io import read_attrs

    task = write_task(tmp_path, seed=5, n=1200, d=16, n_queries=30)
    model_path = saved_model(tmp_path, task["corpus"], n_components=8)
    outputs = {}
    for name, spec in (("q", task["spec_q"]), ("c", task["spec_c"])):
        outputs[name] = str(tmp_path / f"{name}-whitened.zarr")
        assert main(["apply", model_path, spec, "-o", outputs[name], "--normalize", "-q"]) == 0
    capsys.readouterr()
    for dtype in ("float32", "binary"):
        assert main([*eval_args(task, model_path, "--dtype", dtype), "--json"]) == 0
        on_raw = json.loads(capsys.readouterr().out)["whitened"]
        args = ["eval", "--queries", outputs["q"], "--corpus", outputs["c"], "--qrels", task["qrels"], "--json"]
        assert main([*args, "--dtype", dtype]) == 0
        on_output = json.loads(capsys.readouterr().out)["raw"]
        for metric in METRICS:
            assert on_output[metric] == pytest.approx(on_raw[metric], abs=1e-9), (dtype, metric)
    codes = str(tmp_path / "c-int8.h5")
    assert main(["apply", model_path, task["spec_c"], "-o", codes, "--dtype", "int8", "-q"]) == 0
    capsys.readouterr()
    with h5py.File(codes, "r") as handle:
        stored = handle["embeddings"][...]
    decoded = serving.decode(stored, read_attrs(codes), np.float64)
    model = load_model(model_path)
    yq = model.transform(task["queries"].astype(np.float64), normalize=True)
    expected, _ = scored(yq @ decoded.T, task["triples"])
    assert main([*eval_args(task, model_path, "--dtype", "int8"), "--json"]) == 0
    searched = json.loads(capsys.readouterr().out)["whitened"]
    for metric in METRICS:
        assert searched[metric] == pytest.approx(expected[metric], abs=1e-9), metric
    # codes are no input: eval refuses them in one line, saying how to decode them
    assert main(["eval", "--queries", outputs["q"], "--corpus", codes, "--qrels", task["qrels"]]) == EXIT_BAD_INPUT
    assert "int8 codes, sign bits or a vector code written by apply: decode them" in capsys.readouterr().err
