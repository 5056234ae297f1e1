"""Vector codes as candidates of ``tune --max-bytes`` (evaluation.code_candidates, evaluation.sweep): each code's
score against plain numpy scoring of its codec's search, the candidates of a budget against what trains, a
budget under the smallest code, the chosen code recorded, and the sweep's budget pruning against the full grid."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
from conftest import write_h5

from streamwhiten.cli import main
from streamwhiten.codes import NEEDS_SAMPLE, Codec, train_codec
from streamwhiten.core import stats
from streamwhiten.core.model import finalize, load_model, save_model
from streamwhiten.errors import EXIT_BAD_INPUT, BadInputError
from streamwhiten.evaluation import code_candidates
from streamwhiten.evaluation.code_candidates import TUNE_CODES, code_budget, fitting_codes
from streamwhiten.evaluation.sweep import SweepGrid, sweep, tune_retrieval
from streamwhiten.options import RetrievalOptions

D = 32


def neighbours_task(tmp_path, n=1200, n_queries=80, seed=3):
    """A nearest-neighbour task (the relevant rows of a query are its exact top 10 by cosine) on anisotropic
    vectors, a few excluded pairs; written as HDF5 stores and BEIR files."""
    rng = np.random.default_rng(seed)
    scale = np.geomspace(3, 0.1, D)
    corpus = (rng.standard_normal((n, D)) * scale + 0.5).astype(np.float32)
    queries = corpus[rng.choice(n, n_queries, replace=False)] + 0.3 * rng.standard_normal((n_queries, D)) * scale
    queries = queries.astype(np.float32)
    excluded = sorted({(q, int(rng.integers(0, n))) for q in range(0, n_queries, 4)})
    scores = unit(queries) @ unit(corpus).T
    for q, c in excluded:
        scores[q, c] = -np.inf
    rows = np.arange(n)
    truth = [rows[np.lexsort((rows, -s))][:10] for s in scores]
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{c}\t1\n" for q, t in enumerate(truth) for c in t))
    exclude = tmp_path / "exclude.tsv"
    exclude.write_text("query-id\tcorpus-id\n" + "".join(f"{q}\t{c}\n" for q, c in excluded))
    return dict(
        corpus=corpus, queries=queries, truth=truth, excluded=excluded, qrels=str(qrels), exclude=str(exclude),
        spec_q=write_h5(tmp_path / "q.h5", queries, chunk_rows=16),
        spec_c=write_h5(tmp_path / "c.h5", corpus, chunk_rows=256),
    )  # fmt: skip


def unit(rows):
    rows = np.asarray(rows, dtype=np.float64)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def numpy_scores(codec: Codec, task) -> dict:
    """recall@10/@100 and nDCG@10 (x100) of a plain search by the codec's own inner-product estimates
    (numpy: encode, ``inner_products``, a full stable sort per query, excluded pairs dropped)."""
    estimates = np.asarray(
        codec.inner_products(unit(task["queries"]).astype(np.float32), codec.encode(unit(task["corpus"])))
    )
    estimates = estimates.astype(np.float64)
    for q, c in task["excluded"]:
        estimates[q, c] = -np.inf
    rows = np.arange(estimates.shape[1])
    out = {"recall@10": [], "recall@100": [], "ndcg@10": []}
    for q, values in enumerate(estimates):
        found = rows[np.lexsort((rows, -values))][:100]
        relevant = set(int(r) for r in task["truth"][q])
        out["recall@10"].append(len(relevant & set(found[:10].tolist())) / len(relevant))
        out["recall@100"].append(len(relevant & set(found.tolist())) / len(relevant))
        dcg = sum(1 / math.log2(i + 2) for i, r in enumerate(found[:10]) if int(r) in relevant)
        out["ndcg@10"].append(dcg / sum(1 / math.log2(i + 2) for i in range(min(10, len(relevant)))))
    return {name: 100 * float(np.mean(values)) for name, values in out.items()}


def model_of(task):
    return finalize(stats.block_moments(task["corpus"].astype(np.float64)))


CODES = ("eigen", "eigen+f", "bits-random", "bits-itq", "faiss-pq", "faiss-rabitq2", "faiss-sq4")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    pytest.importorskip("faiss")
    tmp_path = tmp_path_factory.mktemp("tune_codes")
    task = neighbours_task(tmp_path)
    grid = SweepGrid(
        betas=[0, 1], gammas=[0, 1], ks=[32, 16, 8], variances=[], dtypes=("int8", "binary", *CODES),
        max_bytes=8, metric="recall@10", code_sample=500, code_seed=4,
    )  # fmt: skip
    options = RetrievalOptions(exclude=task["exclude"], bootstrap=200, block_rows=300, threads=2)
    with pytest.MonkeyPatch.context() as patch:  # code rows searched in batches of two blocks of 300
        patch.setattr(code_candidates, "CODE_SEARCH_ROWS", 500)
        return task, sweep(model_of(task), task["spec_q"], task["spec_c"], task["qrels"], grid=grid, options=options)


def test_a_code_candidate_scores_as_plain_numpy_scoring_of_its_codec_search(swept):
    task, result = swept
    rows = [row for row in result.table if row.get("code")]
    assert rows
    for row in rows:
        codec = result.codec_for(row)
        assert isinstance(codec, Codec) and codec.bytes_per_vector == row["bytes_per_vector"] <= 8
        expected = numpy_scores(codec, task)
        for name, value in expected.items():
            assert row[name] == pytest.approx(value, abs=1e-9), (row["storage"], name)
    # trained from the exact statistics of the corpus rows scaled to unit length (and, for the codes that
    # learn from data, the seeded sample of them that the result records)
    x = unit(task["corpus"])
    mean, covariance = x.mean(axis=0), np.cov(x, rowvar=False, bias=True)
    for row in rows:
        name, codec = row["dtype"], result.codec_for(row)
        if name in NEEDS_SAMPLE:
            assert (row["code"]["sample_rows"], row["code"]["sample_seed"]) == (500, 4)
            continue
        again = train_codec(name, mean, covariance, row["bytes_per_vector"], seed=4, unit=True)
        assert np.allclose(again.decode(again.encode(x[:50])), codec.decode(codec.encode(x[:50])), atol=1e-5)
        assert row["code"]["sha256"] == hashlib.sha256(codec.to_bytes()).hexdigest()


def test_the_candidates_of_a_budget_are_exactly_the_codes_that_fit(swept):
    task, result = swept
    assert {row["dtype"] for row in result.table if row.get("code")} == set(fitting_codes(CODES, D, 8))
    pytest.importorskip("faiss")
    rng = np.random.default_rng(0)
    sample = rng.standard_normal((300, D)) * np.geomspace(2, 0.1, D)
    mean, covariance = sample.mean(axis=0), np.cov(sample, rowvar=False)
    for budget in (1, 2, 3, 6, 9, 40):
        fitting = fitting_codes(TUNE_CODES, D, budget)
        for name in TUNE_CODES:
            # the reference: the largest size up to the budget at which the code trains at all
            trained = None
            for size in range(budget, 0, -1):
                try:
                    trained = train_codec(name, mean, covariance, size, sample=sample, iterations=2, opq_iterations=1)
                except BadInputError:
                    continue
                break
            assert (name in fitting) == (trained is not None), (name, budget)
            if trained is not None:
                assert fitting[name] == code_budget(name, D, budget) and trained.bytes_per_vector <= budget


def test_a_budget_under_the_smallest_code_is_one_line(tmp_path, capsys):
    task = neighbours_task(tmp_path, n=300, n_queries=20)
    with pytest.raises(BadInputError, match="the smallest, eigen\\+f, takes 3"):
        sweep(model_of(task), task["spec_q"], task["spec_c"], task["qrels"],
              grid=SweepGrid(dtypes=("binary", "eigen+f"), max_bytes=2))  # fmt: skip
    save_model(model_of(task), str(tmp_path / "m.npz"))
    code = main([
        "tune", str(tmp_path / "m.npz"), "--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", task["qrels"],
        "--dtypes", "binary,eigen+f,bits-random+f", "--max-bytes", "2", "-q",
    ])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == EXIT_BAD_INPUT and len(err.splitlines()) == 1 and "takes 3; raise --max-bytes" in err


def test_the_chosen_code_is_recorded_in_the_result_the_model_and_the_json(tmp_path, capsys):
    task = neighbours_task(tmp_path, n=1500, n_queries=120)
    model = model_of(task)
    grid = SweepGrid(betas=[0], gammas=[0], ks=[32], variances=[], dtypes=("binary", "eigen"), max_bytes=16,
                     metric="recall@10")  # fmt: skip
    options = RetrievalOptions(exclude=task["exclude"], bootstrap=200)
    result = sweep(model, task["spec_q"], task["spec_c"], task["qrels"], grid=grid, options=options)
    # 16 bytes of eigen code against 32 sign bits (the reference): the code wins beyond the noise
    assert result.best["dtype"] == "eigen" and result.selection["kept_reference"] is False
    codec = result.chosen_codec()
    digest = hashlib.sha256(codec.to_bytes()).hexdigest()
    chosen, summary = tune_retrieval(model, task["spec_q"], task["spec_c"], task["qrels"], grid=grid, options=options)
    setting = chosen.info["tuned"]["setting"]
    assert (setting["dtype"], setting["bytes_per_vector"], setting["code"]["sha256"]) == ("eigen", 16, digest)
    assert summary["chosen"]["code"]["label"] == "eigen-16B"
    save_model(model, str(tmp_path / "m.npz"))
    code = main([
        "tune", str(tmp_path / "m.npz"), "--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", task["qrels"],
        "--exclude", task["exclude"], "--betas", "0", "--gammas", "0", "--ks", "32", "--variances", "",
        "--dtypes", "binary,eigen", "--max-bytes", "16", "--metric", "recall@10", "--bootstrap", "200", "--json", "-q",
        "-o", str(tmp_path / "tuned.npz"),
    ])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["chosen"]["code"]["sha256"] == digest and out["best"]["storage"] == "eigen-16B"
    tuned = load_model(str(tmp_path / "tuned.npz")).info["tuned"]
    assert tuned["setting"]["code"]["sha256"] == digest
    # the best of each family within the budget, as the table has it, and shown by the report
    best = {}
    for row in out["table"]:
        family = row["dtype"] if row.get("code") else row["storage"]
        best[family] = max(best.get(family, -1.0), row["recall@10"])
    assert {row["family"]: row["recall@10"] for row in tuned["families"]} == best
    assert [row["family"] for row in tuned["families"]][0] == "eigen"
    assert main(["report", str(tmp_path / "tuned.npz"), "-o", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "The best of each storage and code within the budget" in page
    assert all(f"<td>{row['storage']}</td><td>{row['bytes_per_vector']}</td><td>{row['recall@10']:.2f}</td>" in page
               for row in tuned["families"])  # fmt: skip


def test_a_budget_prunes_only_what_cannot_fit_it(swept, tmp_path):
    task, result = swept
    assert all(row["bytes_per_vector"] <= 8 for row in result.table)
    # the same grid with no budget, its rows within 8 bytes: the same rows, the same scores
    grid = SweepGrid(betas=[0, 1], gammas=[0, 1], ks=[32, 16, 8], variances=[], dtypes=("int8", "binary"),
                     metric="recall@10")  # fmt: skip
    options = RetrievalOptions(exclude=task["exclude"], bootstrap=200, block_rows=300, threads=2)
    full = sweep(model_of(task), task["spec_q"], task["spec_c"], task["qrels"], grid=grid, options=options)
    key = lambda row: (row["beta"], row["gamma"], row["k"], row["storage"])  # noqa: E731
    within = {key(row): row["recall@10"] for row in full.table if row["bytes_per_vector"] <= 8}
    pruned = {key(row): row["recall@10"] for row in result.table if not row.get("code")}
    assert len(full.table) > len(within) and pruned == within
