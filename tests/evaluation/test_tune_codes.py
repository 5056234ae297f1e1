"""Vector codes as candidates of ``tune --max-bytes`` (evaluation.code_candidates, evaluation.sweep): each code's
score against plain numpy scoring of its codec's search, the candidates of a budget against what trains, every
candidate of budgets 1-256 at seven widths against its real code size, a budget under the smallest code and the
other preconditions refused before any pass, the chosen code recorded, the sweep's budget pruning against the
full grid, and (slow) ``tune --max-bytes`` end to end at budgets that are not multiples of 4."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
from conftest import Phases, write_h5, write_task

from streamwhiten.cli import main
from streamwhiten.codes import CODES as ALL_CODES
from streamwhiten.codes import NEEDS_SAMPLE, TUNE_CODES, Codec, code_size, train_codec
from streamwhiten.codes.faiss_codes import layout_for
from streamwhiten.codes.linear import CORRECTION_BYTES, LinearCode
from streamwhiten.core import stats
from streamwhiten.core.model import finalize, load_model, save_model
from streamwhiten.errors import EXIT_BAD_INPUT, BadInputError
from streamwhiten.evaluation import code_candidates
from streamwhiten.evaluation.code_candidates import fitting_codes, train_codes
from streamwhiten.evaluation.sweep import SweepGrid, sweep
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
    rows = [row for row in result.table if row.code]
    assert rows
    for row in rows:
        codec = result.codec_for(row)
        assert isinstance(codec, Codec) and codec.bytes_per_vector == row.bytes_per_vector <= 8
        expected = numpy_scores(codec, task)
        for name, value in expected.items():
            assert row.scores[name] == pytest.approx(value, abs=1e-9), (row.storage, name)
    # trained from the exact statistics of the corpus rows scaled to unit length (and, for the codes that
    # learn from data, the seeded sample of them that the result records)
    x = unit(task["corpus"])
    mean, covariance = x.mean(axis=0), np.cov(x, rowvar=False, bias=True)
    for row in rows:
        name, codec = row.dtype, result.codec_for(row)
        if name in NEEDS_SAMPLE:
            assert (row.code["sample_rows"], row.code["sample_seed"]) == (500, 4)
            continue
        again = train_codec(name, mean, covariance, row.bytes_per_vector, seed=4, unit=True)
        assert np.allclose(again.decode(again.encode(x[:50])), codec.decode(codec.encode(x[:50])), atol=1e-5)
        assert row.code["sha256"] == hashlib.sha256(codec.to_bytes()).hexdigest()


def test_the_candidates_of_a_budget_are_exactly_the_codes_that_fit(swept):
    task, result = swept
    assert {row.dtype for row in result.table if row.code} == set(fitting_codes(CODES, D, 8))
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
                assert fitting[name] == code_size(name, D, budget) == trained.bytes_per_vector <= budget


def test_the_sweep_tells_its_progress_each_phase_codes_included(tmp_path):
    pytest.importorskip("faiss")
    task = neighbours_task(tmp_path, n=300, n_queries=20)
    grid = SweepGrid(betas=[0], gammas=[0], ks=[32, 8], variances=[], dtypes=("int8", "binary", "eigen", "faiss-pq"),
                     max_bytes=8, code_sample=260)  # fmt: skip
    told = Phases()
    options = RetrievalOptions(exclude=task["exclude"], bootstrap=100, block_rows=128)
    sweep(model_of(task), task["spec_q"], task["spec_c"], task["qrels"], grid=grid, options=options, progress=told)
    assert told.begun == told.ended
    assert told.ended[0].startswith("search ") and told.ended[0].endswith(" over 300 rows")
    assert told.ended[1:] == [
        "read the corpus's statistics and a sample for 2 codes",
        "train 2 codes on 260 rows",
        "search 2 codes over 300 rows",
        "score the settings and choose (maxt rule)",
    ]
    assert {(1, 2), (2, 2), (128, 300), (300, 300)} <= set(told.counts)


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
    assert result.best.dtype == "eigen" and result.selection.kept_reference is False
    codec = result.codec_for(result.best)
    digest = hashlib.sha256(codec.to_bytes()).hexdigest()
    chosen, summary = result.tuned()
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
    assert all(row.bytes_per_vector <= 8 for row in result.table)
    # the same grid with no budget, its rows within 8 bytes: the same rows, the same scores
    grid = SweepGrid(betas=[0, 1], gammas=[0, 1], ks=[32, 16, 8], variances=[], dtypes=("int8", "binary"),
                     metric="recall@10")  # fmt: skip
    options = RetrievalOptions(exclude=task["exclude"], bootstrap=200, block_rows=300, threads=2)
    full = sweep(model_of(task), task["spec_q"], task["spec_c"], task["qrels"], grid=grid, options=options)
    key = lambda row: (row.beta, row.gamma, row.k, row.storage)  # noqa: E731
    within = {key(row): row.scores["recall@10"] for row in full.table if row.bytes_per_vector <= 8}
    pruned = {key(row): row.scores["recall@10"] for row in result.table if not row.code}
    assert len(full.table) > len(within) and pruned == within


# ----------------------------------------------------------------------- every budget: sizes, before the work

WIDTHS = (8, 50, 100, 300, 384, 768, 1024)


def linear_width(n_bits: int, correction: bool) -> int:
    """The width of the rows a linear codec of ``n_bits`` code bits (8-bit components, the last one what
    is left) actually encodes: a codec built with those bits (nothing to train: the width follows from
    the bits) encoding one row."""
    bits = [8] * (n_bits // 8) + ([n_bits % 8] if n_bits % 8 else [])
    m = len(bits)
    codec = LinearCode("eigen", np.zeros(m), np.eye(m), bits, np.ones(m), correction=correction, budget=1)
    return codec.encode(np.ones((1, m))).shape[1]


def faiss_index(kind: str, dims: int, sub: int):
    """faiss's own index of a ``kind`` code over ``dims`` values (``sub`` PQ sub-quantisers), made with faiss
    directly; faiss fixes its code size when it makes it, so it needs no training to report it."""
    import faiss

    l2 = faiss.METRIC_L2
    if kind in ("pq", "opq"):
        index = faiss.IndexPQ(dims, sub, 8, l2)
        return faiss.IndexPreTransform(faiss.OPQMatrix(dims, sub), index) if kind == "opq" else index
    if kind.startswith("rabitq"):
        return faiss.IndexRaBitQ(dims, l2, int(kind[len("rabitq") :]))
    return faiss.IndexScalarQuantizer(dims, getattr(faiss.ScalarQuantizer, f"QT_{kind[2:]}bit"), l2)


def real_size(name: str, d: int, size: int, memo: dict) -> int:
    """The bytes a row of the code ``name`` trained at ``size`` bytes for ``d``-d vectors really takes: the
    linear codes' width for the bits the family's definition gives them (eigen: 8 a byte after the
    correction's, at most 8 a component; sign bits: 8 a byte, one a feature), faiss's code size of the
    index of the trainer's layout (:func:`layout_for`), faiss's per-vector factors included."""
    key = (name, d, size)
    if key not in memo:
        correction = name.endswith("+f")
        n_bits = 8 * (size - CORRECTION_BYTES * correction)
        if name.startswith("eigen"):
            memo[key] = linear_width(min(n_bits, 8 * d), correction)
        elif name.startswith("bits-"):
            assert 8 <= n_bits <= d
            memo[key] = linear_width(n_bits, correction)
        else:
            kind = name[len("faiss-") :]
            dims, sub = layout_for(kind, d, size)
            memo[key] = faiss_index(kind, dims, sub).sa_code_size()
            if kind in ("pq", "opq"):
                assert (dims, sub) == (d - d % size, size)
            elif dims < d:  # the most dimensions whose code fits: one more would not
                assert faiss_index(kind, dims + 1, 0).sa_code_size() > size
    return memo[key]


def test_every_candidate_of_budgets_1_to_256_takes_its_real_size_within_the_budget():
    pytest.importorskip("faiss")
    memo: dict = {}
    for d in WIDTHS:
        fewest = {}
        for budget in range(1, 257):
            fitting = fitting_codes(ALL_CODES, d, budget)
            for name, size in fitting.items():
                assert size == real_size(name, d, size, memo) <= budget, (name, d, budget, size)
                fewest.setdefault(name, size)
            # a family is a candidate from its smallest code on, at every larger budget
            assert all(name in fitting for name in fewest), (d, budget)
        # the smallest codes: a byte (eigen, sign bits, PQ, SQ), 3 with the correction, RaBitQ's factors
        assert fewest["eigen"] == fewest["faiss-pq"] == fewest["faiss-sq8"] == 1 and fewest["eigen+f"] == 3
        assert (fewest["faiss-rabitq1"], fewest["faiss-rabitq2"], fewest["faiss-rabitq4"]) == (9, 22, 22)


@pytest.mark.parametrize("d", [50, 100, 300, 384])
def test_faiss_codes_trained_at_the_odd_budgets_take_the_planned_bytes(d):
    """The budgets of the issue (25, 26, 31, 37 and 50, where RaBitQ's planned code was one byte over),
    through the codes' training as ``tune`` runs it, on 300 rows."""
    pytest.importorskip("faiss")
    rng = np.random.default_rng(d)
    rows = unit(rng.standard_normal((300, d)) * np.geomspace(2, 0.1, d) + 0.3)
    mean, covariance = rows.mean(axis=0), np.cov(rows, rowvar=False)
    names = ("faiss-rabitq1", "faiss-rabitq2", "faiss-rabitq4", "faiss-sq4", "faiss-sq8")
    for budget in (25, 26, 31, 37, 50):
        wanted = list(fitting_codes(names, d, budget).items())
        for (name, size), codec in zip(wanted, train_codes(wanted, mean, covariance, rows, 0), strict=True):
            assert codec.bytes_per_vector == size <= budget, (name, budget)
            assert codec.encode(rows[:3]).shape == (3, size)


def test_a_code_that_cannot_train_on_the_corpus_is_refused_or_left_out_before_any_pass(tmp_path):
    pytest.importorskip("faiss")
    task = neighbours_task(tmp_path, n=200, n_queries=20)  # PQ's k-means needs 256 rows
    calls = []
    grid = SweepGrid(dtypes=("binary", "eigen", "faiss-pq", "faiss-opq"), max_bytes=8, metric="recall@10")
    with pytest.raises(BadInputError) as caught:
        sweep(model_of(task), task["spec_q"], task["spec_c"], task["qrels"], grid=grid,
              progress=lambda *done: calls.append(done))  # fmt: skip
    message = str(caught.value)
    assert "\n" not in message and "256 sample rows" in message and "corpus has 200" in message and not calls
    assert "drop faiss-pq, faiss-opq" in message
    # the default codes: those that train on 200 rows, and nothing else left out
    grid = SweepGrid(betas=[0], gammas=[0], ks=[32], variances=[], max_bytes=8, metric="recall@10")
    result = sweep(model_of(task), task["spec_q"], task["spec_c"], task["qrels"], grid=grid)
    swept = {row.dtype for row in result.table if row.code}
    assert swept == set(fitting_codes(TUNE_CODES, D, 8)) - {"faiss-pq", "faiss-opq"}


def test_a_budget_without_a_reference_is_refused_before_any_pass(tmp_path, capsys):
    task = neighbours_task(tmp_path, n=300, n_queries=20)
    calls = []
    with pytest.raises(BadInputError, match="no raw setting .* in 25 bytes or fewer to be the reference"):
        sweep(model_of(task), task["spec_q"], task["spec_c"], task["qrels"],
              grid=SweepGrid(dtypes=("eigen", "int8"), ks=[32], variances=[], max_bytes=25),
              progress=lambda *done: calls.append(done))  # fmt: skip
    assert not calls
    with pytest.raises(BadInputError, match="codes are swept under a byte budget only"):
        sweep(model_of(task), task["spec_q"], task["spec_c"], task["qrels"], grid=SweepGrid(dtypes=("eigen",)))
    # argmax needs no reference: the same grid is scored
    result = sweep(model_of(task), task["spec_q"], task["spec_c"], task["qrels"],
                   grid=SweepGrid(dtypes=("eigen", "int8"), ks=[32], variances=[], max_bytes=25, select="argmax"))  # fmt: skip
    assert result.best.bytes_per_vector <= 25


@pytest.mark.slow
@pytest.mark.parametrize("d", [50, 384])
def test_tune_max_bytes_ends_within_every_budget(tmp_path, capsys, d):
    """``tune --max-bytes B`` end to end with every code family (faiss's included) on a small store: exit 0,
    the chosen storage (and every row scored) within B bytes."""
    pytest.importorskip("faiss")
    task = write_task(tmp_path, d=d, n=1500, n_queries=40)
    save_model(finalize(stats.block_moments(task["corpus"].astype(np.float64))), str(tmp_path / "m.npz"))
    for budget in (25, 50, 100):
        code = main([
            "tune", str(tmp_path / "m.npz"), "--queries", task["spec_q"], "--corpus", task["spec_c"],
            "--qrels", task["qrels"], "--exclude", task["exclude"], "--max-bytes", str(budget), "--json", "-q",
            "-o", str(tmp_path / f"tuned{budget}.npz"),
        ])  # fmt: skip
        out = json.loads(capsys.readouterr().out)
        assert code == 0 and out["chosen"]["bytes_per_vector"] <= budget, budget
        assert max(row["bytes_per_vector"] for row in out["table"]) <= budget
        faiss_rows = {row["dtype"] for row in out["table"] if row.get("code") and row["dtype"].startswith("faiss-")}
        assert faiss_rows == {name for name in fitting_codes(TUNE_CODES, d, budget) if name.startswith("faiss-")}
        assert load_model(str(tmp_path / f"tuned{budget}.npz")).info["tuned"]["setting"]["bytes_per_vector"] <= budget
