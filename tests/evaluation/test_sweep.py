"""The retrieval sweep (evaluation.sweep, ``tune --queries ...``): every setting in every storage against an
independent numpy evaluation, the frontier and the choice under a byte budget, the raw vectors and plain
centring as candidates, the choice written into the model and used by eval and export."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest
from conftest import write_h5, write_task

from streamwhiten.cli import main
from streamwhiten.core import stats
from streamwhiten.core.model import finalize, load_model, save_model
from streamwhiten.errors import EXIT_BAD_INPUT, BadInputError
from streamwhiten.evaluation import sweep as sweep_module
from streamwhiten.evaluation.retrieval import METRICS
from streamwhiten.evaluation.sweep import SweepGrid, SweepRow, choose_within, frontier, sweep
from streamwhiten.options import RetrievalOptions

RESCORE = 15


# ---------------------------------------------------------------------------- an independent evaluation


class Reference:
    """Plain numpy: the statistics and eigendecomposition recomputed from the rows, full score matrices, a
    full sort per query, the metrics and the bootstrap written out in loops."""

    def __init__(self, task):
        self.x = task["corpus"].astype(np.float64)
        self.q = task["queries"].astype(np.float64)
        self.mean = self.x.mean(axis=0)
        self.cov = np.cov(self.x, rowvar=False, bias=True)
        self.relevant: dict = {}
        for q, c, g in task["triples"]:
            self.relevant.setdefault(q, {})[c] = float(g)
        self.excluded = task["excluded"]

    def weights(self, beta, gamma, k):
        sigma = self.cov + (1 - beta) ** 2 * np.outer(self.mean, self.mean)
        values, vectors = np.linalg.eigh(sigma)
        values, vectors = np.maximum(values[::-1], 0), vectors[:, ::-1]
        return vectors[:, :k] * (values[:k] + 1e-6 * values[0]) ** (-gamma / 2), beta * self.mean

    @staticmethod
    def unit(y):
        return y / np.linalg.norm(y, axis=1, keepdims=True)

    def int8(self, y, weights, shift, clip=4.0):
        mean = (self.mean - shift) @ weights
        var = np.einsum("ij,ij->j", weights, self.cov @ weights)
        energy = np.sum(var + mean**2)
        std = np.sqrt(var / energy)
        scale, offset = clip * np.maximum(std, 1e-6 * std.max()) / 127, mean / math.sqrt(energy)
        return np.clip(np.rint((y - offset) / scale), -127, 127) * scale + offset

    def ranked(self, scores, depth=100):
        scores = scores.copy()
        for q, c in self.excluded:
            scores[q, c] = -np.inf
        rows = np.arange(scores.shape[1])
        return [rows[np.lexsort((rows, -s))][:depth] for s in scores]

    def lists(self, beta, gamma, k, storage, rescore=0):
        if beta is None:  # the raw vectors
            weights, shift = np.eye(self.x.shape[1]), np.zeros(self.x.shape[1])
        else:
            weights, shift = self.weights(beta, gamma, k)
        yq, yc = self.unit((self.q - shift) @ weights), self.unit((self.x - shift) @ weights)
        stored = {
            "float32": lambda: yc.astype(np.float32).astype(np.float64),
            "float16": lambda: yc.astype(np.float16).astype(np.float64),
            "int8": lambda: self.int8(yc, weights, shift),
        }
        if storage != "binary":
            return self.ranked(yq @ stored[storage]().T)
        bq, bc = (yq > 0).astype(np.float64), (yc > 0).astype(np.float64)
        hamming = bq @ (1 - bc).T + (1 - bq) @ bc.T
        lists = self.ranked(-hamming, depth=max(100, rescore))
        if not rescore:
            return [rows[:100] for rows in lists]
        again = stored["float32"]()
        out = []
        for q, rows in enumerate(lists):
            top = rows[:rescore]
            values = again[top] @ yq[q]
            out.append(np.concatenate([top[np.lexsort((top, -values))], rows[rescore:100]]))
        return out

    def metrics(self, lists) -> dict:
        out = {name: [] for name in METRICS}
        for q, rows in enumerate(lists):
            relevant = self.relevant[q]
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


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("sweep")
    task = write_task(tmp_path, seed=5, noise=0.8, d=12, graded=True, offset=1.5)
    model = finalize(stats.block_moments(task["corpus"].astype(np.float64)))
    result = sweep(
        model, task["spec_q"], task["spec_c"], task["qrels"],
        grid=SweepGrid(betas=[0, 0.5], gammas=[0.5, 1], ks=[12, 5], variances=[], rescore=RESCORE),
        options=RetrievalOptions(exclude=task["exclude"], bootstrap=200, block_rows=300, threads=2),
    )  # fmt: skip
    return task, model, result


def test_every_setting_in_every_storage_equals_a_numpy_evaluation(swept):
    task, model, result = swept
    reference = Reference(task)
    raw_each = reference.metrics(reference.lists(None, None, None, "float32"))
    for name in METRICS:
        assert result.raw[name] == pytest.approx(100 * raw_each[name].mean(), abs=1e-9)
    settings = {(row.beta, row.gamma, row.k) for row in result.table if row.vectors != "raw"}
    # the grid, and the rotation and plain centring added to it; and the raw vectors (no transformation)
    assert settings == {(b, g, k) for b in (0, 0.5) for g in (0.5, 1) for k in (12, 5)} | {(0, 0, 12), (1, 0, 12)}
    raw_rows = [row for row in result.table if row.vectors == "raw"]
    assert {row.storage for row in raw_rows} == {row.storage for row in result.table}
    assert all((row.beta, row.gamma, row.k) == (0, 0, 12) for row in raw_rows)
    assert {row.storage for row in result.table} == {
        "float32", "float16", "int8", "binary", f"binary+rescore{RESCORE}",
    }  # fmt: skip
    kinds = {(row.beta, row.gamma, row.k): row.vectors for row in result.table if row.vectors != "raw"}
    assert kinds[(0, 0, 12)] == "rotated" and kinds[(1, 0, 12)] == "centred" and kinds[(0.5, 1, 5)] == "whitened"
    for row in result.table:
        storage, rescore = row.dtype, row.rescore
        setting = (None, None, None) if row.vectors == "raw" else (row.beta, row.gamma, row.k)
        each = reference.metrics(reference.lists(*setting, storage, rescore))
        for name in METRICS:
            assert row.scores[name] == pytest.approx(100 * each[name].mean(), abs=1e-9), (row, name)
        k = row.k
        expected_bytes = {"float32": 4 * k, "float16": 2 * k, "int8": k, "binary": -(-k // 8)}[storage]
        assert row.bytes_per_vector == expected_bytes + (4 * k if rescore else 0)
        difference, low, high = reference.bootstrap(raw_each["ndcg@10"], each["ndcg@10"], 200)
        assert (row.difference, row.low, row.high) == pytest.approx((difference, low, high), abs=1e-9)
        assert row.retention == pytest.approx(100 * row.scores["ndcg@10"] / result.raw["ndcg@10"])


def test_bits_re_ranked_without_any_float_storage_are_swept_as_numpy_ranks_them(tmp_path):
    """``binary+rescore`` among the storages with no float one (or under a budget no float storage meets):
    its rows are searched, re-ranked and scored, not dropped (they were, while only the settings of a float
    storage took the later pass that re-ranks)."""
    task = write_task(tmp_path, seed=5, noise=0.8, d=12, graded=True, offset=1.5)
    model = finalize(stats.block_moments(task["corpus"].astype(np.float64)))
    result = sweep(
        model, task["spec_q"], task["spec_c"], task["qrels"],
        grid=SweepGrid(betas=[0], gammas=[0], ks=[12], variances=[], dtypes=["binary", "binary+rescore"],
                       rescore=RESCORE, select="argmax"),
        options=RetrievalOptions(exclude=task["exclude"], bootstrap=0, block_rows=300, threads=2),
    )  # fmt: skip
    assert {row.storage for row in result.table} == {"binary", f"binary+rescore{RESCORE}"}
    reference = Reference(task)
    for row in result.table:
        setting = (None, None, None) if row.vectors == "raw" else (row.beta, row.gamma, row.k)
        each = reference.metrics(reference.lists(*setting, row.dtype, row.rescore))
        for name in METRICS:
            assert row.scores[name] == pytest.approx(100 * each[name].mean(), abs=1e-9), (row, name)


def test_the_frontier_and_the_choice_under_a_budget(swept):
    _, _, result = swept
    table, front = result.table, result.frontier
    assert front == frontier(table, "ndcg@10")
    sizes = [row.bytes_per_vector for row in front]
    scores = [row.scores["ndcg@10"] for row in front]
    assert sizes == sorted(set(sizes)) and scores == sorted(set(scores))  # each better than the last, for more bytes
    for row in table:  # no setting beats the frontier at its size
        assert any(
            f.bytes_per_vector <= row.bytes_per_vector and f.scores["ndcg@10"] >= row.scores["ndcg@10"] for f in front
        )
    for budget in (1, 2, 6, 12, 30, 48, 1000):
        within = [row for row in table if row.bytes_per_vector <= budget]
        if not within:
            with pytest.raises(BadInputError, match=f"^no setting stores a vector in {budget} bytes or fewer"):
                choose_within(table, "ndcg@10", budget)
            continue
        chosen = choose_within(table, "ndcg@10", budget)
        top = max(row.scores["ndcg@10"] for row in within)
        assert chosen.bytes_per_vector <= budget and chosen.scores["ndcg@10"] == top
        assert chosen.bytes_per_vector == min(r.bytes_per_vector for r in within if r.scores["ndcg@10"] == top)
        assert chosen in front  # the best within a budget is on the frontier
    # a tolerance trades points for bytes: the fewest bytes within 5 points of the best
    relaxed = choose_within(table, "recall@10", None, tolerance=5.0)
    top = max(row.scores["recall@10"] for row in table)
    assert relaxed.bytes_per_vector == min(r.bytes_per_vector for r in table if r.scores["recall@10"] >= top - 5.0)
    chosen_model = result.model_for(result.best)
    assert (chosen_model.beta, chosen_model.gamma, chosen_model.n_components) == (
        result.best.beta, result.best.gamma, result.best.k,
    )  # fmt: skip
    assert chosen_model.storage.label == result.best.storage


def test_one_pass_for_every_float_setting_and_more_only_when_the_lists_do_not_fit(tmp_path, monkeypatch):
    task = write_task(tmp_path, seed=2, d=8, n=600, n_queries=20)
    model = finalize(stats.block_moments(task["corpus"].astype(np.float64)))
    totals = []
    options = dict(
        grid=SweepGrid(betas=[0, 1], gammas=[0, 1], ks=[8, 4], variances=[], dtypes=["float32", "int8"]),
        options=RetrievalOptions(bootstrap=0),
    )
    sweep(
        model,
        task["queries"],
        task["corpus"],
        task["qrels"],
        progress=lambda done, total: totals.append(total),
        **options,
    )
    assert set(totals) == {2 * 600}  # the raw reference's pass, and one for the 9 settings x 2 storages
    one_setting = 20 * 16 * 2 * 100 + 20 * 8 * 8  # the top lists of one setting in two storages and its queries
    monkeypatch.setattr(sweep_module, "TOP_LIST_BYTES", 2 * one_setting)
    totals.clear()
    again = sweep(
        model, task["queries"], task["corpus"], task["qrels"], progress=lambda done, total: totals.append(total), **options
    )  # fmt: skip
    assert set(totals) == {(1 + 5) * 600}  # 8 settings and the raw vectors (no map), two per pass
    monkeypatch.undo()
    assert again.table == sweep(model, task["queries"], task["corpus"], task["qrels"], **options).table


def test_in_many_passes_and_slices_tune_scores_and_chooses_as_numpy(tmp_path, monkeypatch, capsys):
    """``tune --json`` with a pass per setting or two, slices of 24 rows in blocks of 100: every row's metrics
    are numpy's (whole score matrices, a full sort per query), the argmax rule picks numpy's best row within
    the budget (ties to fewer bytes, then smaller k, then the table's order), and the default rule chooses
    what it chooses with one pass for everything."""
    from streamwhiten.evaluation import search as search_module

    task = write_task(tmp_path, seed=4, noise=0.9, n=900, d=12, n_queries=30, graded=True, offset=1.0)
    model_path = fitted(tmp_path, task)
    args = ["tune", model_path, "--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", task["qrels"]]
    args += ["--exclude", task["exclude"], "--betas", "0,1", "--gammas", "0,1", "--ks", "12,5", "--variances", ""]
    args += ["--dtypes", "float32,int8,binary,binary+rescore", "--rescore", "15", "--max-bytes", "24"]
    args += ["--bootstrap", "100", "--block-rows", "100", "--json"]
    passes = []
    run_pass = sweep_module.run_pass
    monkeypatch.setattr(sweep_module, "run_pass", lambda *a: passes.append(a[2]) or run_pass(*a))
    assert main(args) == 0
    once = json.loads(capsys.readouterr().out)
    assert len(passes) == 2  # the raw reference and the bits, then the rest
    monkeypatch.setattr(sweep_module, "TOP_LIST_BYTES", 30 * 16 * 100 * 2 + 30 * 8 * 12)  # one setting, two lists
    monkeypatch.setattr(search_module, "SLICE_BYTES", 8 * 12 * 24)  # 24 rows of 12 float64 values
    passes.clear()
    assert main(args) == 0
    sliced = json.loads(capsys.readouterr().out)
    assert len(passes) > 8 and max(len(uses) for uses in passes) <= 2
    assert sliced["table"] == once["table"] and sliced["best"] == once["best"]
    assert sliced["selection"] == once["selection"]
    assert main([*args, "--select", "argmax"]) == 0
    summary = json.loads(capsys.readouterr().out)
    table, argmax = summary["table"], summary["best"]
    reference = Reference(task)
    scores = []
    for row in table:
        setting = (None, None, None) if row["vectors"] == "raw" else (row["beta"], row["gamma"], row["k"])
        each = reference.metrics(reference.lists(*setting, row["dtype"], row["rescore"]))
        for name in METRICS:
            assert row[name] == pytest.approx(100 * each[name].mean(), abs=1e-9), (row, name)
        scores.append(100 * each["ndcg@10"].mean())
    within = [i for i, row in enumerate(table) if row["bytes_per_vector"] <= 24]
    best = min(within, key=lambda i: (-round(scores[i], 9), table[i]["bytes_per_vector"], table[i]["k"], i))
    assert {key: argmax[key] for key in ("beta", "gamma", "k", "storage")} == {
        key: table[best][key] for key in ("beta", "gamma", "k", "storage")
    }


def test_the_grid_is_checked_when_made_in_the_words_of_the_command_line(tmp_path):
    grid = SweepGrid(betas=[0, 1], ks=[8], dtypes="float32,int8")
    assert (grid.betas, grid.ks, grid.dtypes, grid.gammas) == ((0, 1), (8,), ("float32", "int8"), None)
    assert [storage.label for storage in grid.storages()] == ["float32", "int8"]
    assert (grid.rescore, grid.rescore_dtype, grid.int8_clip, grid.metric) == (100, "float32", 4.0, "ndcg@10")
    with pytest.raises(dataclasses.FrozenInstanceError):
        grid.max_bytes = 8  # type: ignore[misc]
    for given, message in (
        ({"betas": [0, 1.5]}, "beta must be a number in [0, 1], got 1.5"),
        ({"ks": [0]}, "n_components (k) must be a whole number of at least 1, got 0"),
        ({"variances": [0.0]}, "variance must be a fraction in (0, 1], got 0.0"),
        ({"eps": 0.0}, "eps must be a positive finite number, got 0.0"),
        ({"dtypes": ["int4"]}, "dtypes: 'int4' is not one of float32, float16, int8, binary, binary+rescore"),
        ({"rescore": 0}, "binary+rescore needs rescore=N of at least 1"),
        ({"rescore_dtype": "float16"}, 'rescore_dtype must be "float32" or "int8", got \'float16\''),
        ({"int8_clip": 0.0}, "int8_clip must be a number of standard deviations above 0, got 0.0"),
        ({"metric": "spearman"}, "metric must be one of ndcg@10, recall@1, recall@10, recall@100, mrr@10"),
        ({"max_bytes": 0}, "max_bytes must be a whole number of bytes of at least 1, got 0"),
        ({"tolerance": -1.0}, "tolerance must be a number >= 0, got -1.0"),
    ):
        with pytest.raises(BadInputError, match=f"^{re.escape(message)}"):
            SweepGrid(**given)
    task = write_task(tmp_path, seed=2, d=8, n=100, n_queries=5)
    model = finalize(stats.block_moments(task["corpus"].astype(np.float64)))
    with pytest.raises(BadInputError, match=r"^n_components \(k\) = 9 exceeds the data width d = 8$"):
        sweep(model, task["queries"], task["corpus"], task["qrels"], grid=SweepGrid(ks=[9]))
    with pytest.raises(BadInputError, match=r"^grid must be a SweepGrid, got dict$"):
        sweep(model, task["queries"], task["corpus"], task["qrels"], grid={"ks": [4]})  # type: ignore[arg-type]


# --------------------------------------------------------------------------------- the command line


def tune_args(task, model_path, *extra):
    return [
        "tune", model_path, "--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", task["qrels"],
        "--betas", "0,1", "--gammas", "0,0.5,1", "--ks", "16", "--variances", "", "--bootstrap", "100", *extra,
    ]  # fmt: skip


def fitted(tmp_path, task) -> str:
    path = str(tmp_path / "model.npz")
    save_model(finalize(stats.block_moments(task["corpus"].astype(np.float64))), path)
    return path


def test_raw_vectors_can_win_and_the_text_says_so(tmp_path, capsys):
    task = write_task(tmp_path, seed=0, noise=1.0)  # isotropic query noise: whitening amplifies it
    model_path = fitted(tmp_path, task)
    assert main(tune_args(task, model_path, "--dtypes", "float32,int8", "--json")) == 0
    summary = json.loads(capsys.readouterr().out)
    best = summary["best"]
    assert (best["vectors"], best["beta"], best["gamma"], best["k"], best["storage"]) == ("raw", 0, 0, 16, "float32")
    assert best["ndcg@10"] == pytest.approx(summary["raw"]["ndcg@10"], abs=1e-9)  # the rotation ranks as raw
    whitened = [row for row in summary["table"] if row["gamma"] == 1]
    assert all(row["high"] < 0 for row in whitened)  # full whitening loses beyond noise here
    assert main(tune_args(task, model_path, "--dtypes", "float32,int8")) == 0
    text = capsys.readouterr().out
    assert "the raw vectors win" in text and "within noise" in text and "model not changed" in text


def test_the_budget_is_respected_and_the_choice_written_is_used_by_eval_and_export(tmp_path, capsys):
    task = write_task(tmp_path, seed=2, noise=1.0)
    model_path = fitted(tmp_path, task)
    tuned = str(tmp_path / "tuned.npz")
    # --select argmax: the old choice, the best score within the budget (the default keeps raw int8 here)
    extra = ("--dtypes", "float32,int8", "--max-bytes", "16", "--select", "argmax", "-o", tuned, "--json")
    code = main(tune_args(task, model_path, *extra))
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    best, chosen = summary["best"], summary["chosen"]
    within = [row for row in summary["table"] if row["bytes_per_vector"] <= 16]
    assert best["bytes_per_vector"] <= 16 and best["ndcg@10"] == max(row["ndcg@10"] for row in within)
    assert (best["vectors"], best["storage"]) == ("centred", "int8")  # raw int8 loses to centred int8 here
    raw_int8 = next(row for row in within if row["vectors"] == "raw")  # the reference the default keeps
    assert raw_int8["storage"] == "int8" and best["ndcg@10"] > raw_int8["ndcg@10"]
    # tune --json keeps its shape; chosen also says how the vectors are stored
    assert {
        "metric",
        "tolerance",
        "raw",
        "best",
        "table",
        "test",
        "chosen",
        "model",
        "written",
        "file_checksum",
    } <= set(summary)
    assert {"beta", "gamma", "k", "eps", "variance", "dtype", "bytes_per_vector"} <= set(chosen)
    assert (chosen["dtype"], chosen["bytes_per_vector"], summary["written"], summary["max_bytes"]) == (
        "int8", 16, tuned, 16,
    )  # fmt: skip
    model = load_model(tuned)
    assert (model.beta, model.gamma, model.n_components, model.storage.dtype) == (1.0, 0.0, 16, "int8")
    assert model.info["tuned"]["frontier"] and model.info["tuned"]["max_bytes"] == 16
    # eval takes the model's storage: the whitened rows are searched as int8, as tune scored them
    args = ["--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", task["qrels"], "--json"]
    assert main(["eval", tuned, *args]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert (scored["whitened"]["dtype"], scored["whitened"]["bytes_per_vector"]) == ("int8", 16)
    assert scored["whitened"]["ndcg@10"] == pytest.approx(best["ndcg@10"], abs=1e-9)
    # export records the int8 ranges of the model's statistics, and faiss gets a scalar quantizer with them
    assert main(["export", tuned, "-o", str(tmp_path / "map.npz"), "--json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    record = model.storage_records()[0].to_dict()
    assert exported["dtype"] == "int8" and exported["quantization"] == record
    with np.load(tmp_path / "map.npz") as arrays:
        assert json.loads(str(arrays["quantization_json"])) == record
    pytest.importorskip("faiss")
    assert main(["export", tuned, "-o", str(tmp_path / "index.faiss"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["index"].startswith("SQ8")


def test_a_budget_nothing_fits_and_other_mistakes_are_one_line(tmp_path, capsys):
    task = write_task(tmp_path, seed=1, n=300, n_queries=10)
    model_path = fitted(tmp_path, task)
    cases = [
        (["--dtypes", "float32", "--max-bytes", "16"], "no setting stores a vector in 16 bytes or fewer"),
        (["--dtypes", "int4"], "--dtypes: 'int4' is not one of float32, float16, int8, binary, binary+rescore"),
        (["--metric", "spearman"], "--metric spearman is a pair metric"),
        (["--max-bytes", "0"], "max_bytes must be a whole number of bytes of at least 1, got 0"),
        (["--pairs-a", task["spec_q"]], "give labelled pairs (--pairs-a, --pairs-b, --scores) or a retrieval task"),
        (["--test-a", task["spec_q"]], "--test-a/--test-b/--test-scores are held-out pairs"),
    ]
    for extra, message in cases:
        code = main(tune_args(task, model_path, *extra))
        err = capsys.readouterr().err
        assert code == EXIT_BAD_INPUT, (extra, err)
        assert err.count("\n") == 1 and message in err, (extra, err)
    args = ["tune", model_path, "--pairs-a", task["spec_q"], "--pairs-b", task["spec_q"], "--scores", task["qrels"]]
    assert main([*args, "--max-bytes", "10"]) == EXIT_BAD_INPUT
    assert "--max-bytes is for a retrieval task" in capsys.readouterr().err
    # a command's own search option is named before those eval and tune share, whatever their order
    assert main([*args, "--seed", "3", "--dtypes", "int8"]) == EXIT_BAD_INPUT
    assert "--dtypes is for a retrieval task" in capsys.readouterr().err
    assert main(["eval", model_path, *args[2:], "--threads", "2", "--dtype", "int8"]) == EXIT_BAD_INPUT
    assert "--dtype is for a retrieval task" in capsys.readouterr().err


def test_pair_tuning_keeps_its_shape_and_says_how_the_vectors_are_stored(tmp_path, capsys):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 6)) * [4, 3, 2, 1, 1, 0.5]
    b = a + 0.5 * rng.standard_normal((300, 6))
    scores = -np.linalg.norm(a - b, axis=1)
    with_pairs = tmp_path / "pairs.h5"
    write_h5(with_pairs, a, "a")
    import h5py

    with h5py.File(with_pairs, "a") as handle:
        handle["b"], handle["s"] = b, scores
    model_path = str(tmp_path / "m.npz")
    save_model(finalize(stats.block_moments(np.vstack([a, b]))), model_path)
    args = ["tune", model_path, "--pairs-a", f"{with_pairs}:/a", "--pairs-b", f"{with_pairs}:/b"]
    assert main([*args, "--scores", f"{with_pairs}:/s", "--ks", "6,3", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert {"metric", "raw", "best", "table", "pairs", "test", "chosen"} <= set(summary)
    chosen = summary["chosen"]
    assert (chosen["dtype"], chosen["bytes_per_vector"]) == ("float32", 4 * chosen["k"])


def test_the_default_rule_keeps_the_reference_within_noise_and_forecasts_both(tmp_path, capsys):
    task = write_task(tmp_path, seed=2, noise=1.0)  # centred int8 scores best within 16 bytes, within noise
    model_path = fitted(tmp_path, task)
    tuned = str(tmp_path / "tuned.npz")
    assert (
        main(tune_args(task, model_path, "--dtypes", "float32,int8", "--max-bytes", "16", "-o", tuned, "--json")) == 0
    )
    summary = json.loads(capsys.readouterr().out)
    best, selection = summary["best"], summary["selection"]
    within = [row for row in summary["table"] if row["bytes_per_vector"] <= 16]
    assert best["ndcg@10"] < max(row["ndcg@10"] for row in within)  # not the arg-max
    # the reference of 16 bytes: the raw vectors (no transformation) in int8, the most bytes that fit
    assert (best["vectors"], best["storage"], best["k"]) == ("raw", "int8", 16)
    # the model written holds no transformation and that storage; eval scores it as tune did
    written = load_model(tuned)
    assert (written.basis, written.storage.dtype, written.n_components) == ("identity", "int8", 16)
    args = ["--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", task["qrels"], "--json"]
    assert main(["eval", tuned, *args]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["whitened"]["dtype"] == "int8" and scored["whitened"]["ndcg@10"] == pytest.approx(
        best["ndcg@10"], abs=1e-9
    )
    assert selection["rule"] == "maxt" and selection["kept_reference"] and selection["n_beating"] == 0
    assert selection["reference"]["storage"] == "int8" and selection["n_compared"] == len(within) - 1
    predicted = selection["forecast"]
    assert predicted["folds"] == 5 and predicted["kept_reference"] == 5
    assert predicted["chosen"]["score"] == pytest.approx(best["ndcg@10"])  # the reference in every fold
    assert predicted["reference"]["low"] <= predicted["reference"]["score"] <= predicted["reference"]["high"]
    assert load_model(tuned).info["tuned"]["selection"] == selection
    assert main(tune_args(task, model_path, "--dtypes", "float32,int8", "--max-bytes", "16")) == 0
    text = capsys.readouterr().out
    assert "nothing beats the reference beyond noise" in text and "forecast" in text and "5-fold" in text


def sweep_row(beta, gamma, k, dtype, vectors, rescore=0, score=0.0):
    """A table row of ``k`` components stored as ``dtype`` (its bytes as a sweep counts them)."""
    size = {"float32": 4 * k, "float16": 2 * k, "int8": k, "binary": -(-k // 8)}[dtype] + 4 * k * bool(rescore)
    scores = {"ndcg@10": score}
    return SweepRow(beta, gamma, k, str(k), vectors, dtype, dtype, rescore, None, size, scores, None, 0.0, None, None)


def test_the_reference_is_the_raw_vectors_in_the_most_bytes_within_the_budget():
    from streamwhiten.evaluation.sweep import reference_index, reference_k

    table = [
        sweep_row(b, 0.0, k, s, "rotated" if b == 0 and k == 384 else "centred" if k == 384 else "whitened")
        for b in (0.0, 1.0)
        for k in (384, 192, 96, 64)
        for s in ("float32", "float16", "int8", "binary")
    ]
    raw = [sweep_row(0.0, 0.0, 384, s, "raw") for s in ("float32", "float16", "int8", "binary")]
    table += [sweep_row(0.0, 0.0, 384, "binary", "raw", rescore=100), *raw]
    # the raw vectors (no transformation) in the storage with the most bytes that fits; below their sign
    # bits, the rotation's bits truncated
    expected = {None: ("raw", "float32", 384), 1600: ("raw", "float32", 384), 800: ("raw", "float16", 384),
                384: ("raw", "int8", 384), 96: ("raw", "binary", 384), 48: ("raw", "binary", 384),
                24: ("whitened", "binary", 192), 12: ("whitened", "binary", 96), 8: ("whitened", "binary", 64)}  # fmt: skip
    for budget, (vectors, dtype, k) in expected.items():
        chosen = table[reference_index(table, 384, budget)]
        assert (chosen.beta, chosen.gamma, chosen.vectors, chosen.dtype, chosen.k, chosen.rescore) == (
            0.0, 0.0, vectors, dtype, k, 0,
        ), budget  # fmt: skip
    assert [reference_k(384, b) for b in (None, 48, 24, 12)] == [None, None, 192, 96]
    with pytest.raises(BadInputError, match="reference"):
        reference_index(table, 384, 4)


def test_bootstrap_differences_in_blocks_equal_the_indexed_resamples(monkeypatch):
    # the previous implementation indexed each row's differences with all (samples, n) draws at once; the
    # counts, a block of 6 resamples and 2 rows at a time, must give the same intervals
    from streamwhiten.evaluation import select as select_module

    monkeypatch.setattr(sweep_module, "RESAMPLED_VALUES", 2 * 31)
    monkeypatch.setattr(select_module, "BLOCK", 6)
    rng = np.random.default_rng(8)
    reference = rng.uniform(0, 1, 25)
    others = [np.clip(reference + rng.normal(shift, 0.2, 25), 0, 1) for shift in (0.0, 0.05, -0.1, 0.2, 0.01)]
    got = sweep_module.bootstrap_differences(reference, others, 31, 3)
    index = np.random.default_rng(3).integers(0, 25, size=(31, 25))
    for (difference, low, high), values in zip(got, others, strict=True):
        diffs = values - reference
        want_low, want_high = np.percentile(diffs[index].mean(axis=1), [2.5, 97.5])
        assert (difference, low, high) == pytest.approx((100 * diffs.mean(), 100 * want_low, 100 * want_high))
    unsampled = sweep_module.bootstrap_differences(reference, others, 0, 3)  # no resamples: no intervals
    assert unsampled == [(pytest.approx(100 * (values - reference).mean()), None, None) for values in others]


def test_argmax_needs_no_reference_and_forecasts_nothing():
    # no raw row (beta = gamma = 0) fits 8 bytes: the default rule has no reference, argmax chooses as before
    table = [
        sweep_row(1.0, 0.0, 4, "int8", "centred", score=0.5),
        sweep_row(1.0, 1.0, 8, "int8", "whitened", score=0.6),
        sweep_row(0.0, 0.0, 8, "float32", "raw", score=0.9),
    ]
    per_query = np.array([[0.5, 0.4, 0.6, 0.5] * 3, [0.6, 0.7, 0.5, 0.6] * 3, [0.9] * 12])
    args = (table, per_query, "ndcg@10", 8)
    index, record = sweep_module.choose_generalising(*args, SweepGrid(max_bytes=8, select="argmax", tolerance=0.2))
    assert table[index] is choose_within(table, "ndcg@10", 8, tolerance=0.2) and index == 0
    assert record.reference is None and "forecast" not in record.to_json() and record.tolerance == 0.2
    index, _ = sweep_module.choose_generalising(*args, SweepGrid(max_bytes=8, select="argmax"))
    assert index == 1
    with pytest.raises(BadInputError, match="no raw setting"):
        sweep_module.choose_generalising(*args, SweepGrid(max_bytes=8))


def test_the_tolerance_is_worded_by_the_rule(tmp_path, capsys):
    from streamwhiten.cli._common import selection_lines

    task = write_task(tmp_path, seed=1, noise=1.0)
    model_path = fitted(tmp_path, task)
    extra = ("--dtypes", "float32,int8", "--max-bytes", "64", "--tolerance", "30")
    assert main(tune_args(task, model_path, *extra)) == 0
    text = capsys.readouterr().out
    assert "(the fewest bytes surely within 30 points of the reference):" in text and "of the best" not in text
    assert "chosen: the cheapest setting surely within 30 points" in text
    assert main(tune_args(task, model_path, *extra, "--select", "argmax")) == 0
    text = capsys.readouterr().out
    assert "(the fewest bytes within 30 points of the best):" in text and "forecast   " not in text
    kept = {"rule": "maxt", "tolerance": 2.0, "kept_reference": True, "n_beating": 0, "n_compared": 4}
    assert (
        "nothing cheaper is surely within 2 points of it: the reference is kept"
        in selection_lines(kept, "ndcg@10", "queries")[0]
    )
    old = dict(kept, tolerance=None, kept_reference=False, bound=1.5)  # a record saved before tolerance was kept
    assert "the highest simultaneous 95% lower bound of the advantage, +1.50" in selection_lines(old, "m", "q")[0]
    new = dict(old, level=0.99)  # the level the rule chose at is kept with it
    assert "the highest simultaneous 99% lower bound of the advantage, +1.50" in selection_lines(new, "m", "q")[0]


def test_within_the_raw_sign_bits_budget_the_reference_is_those_bits_and_the_model_written_reproduces_it(
    tmp_path, capsys
):
    # 16-d: the raw vectors' sign bits take 2 bytes (384-d: 48); nothing of more bytes fits
    task = write_task(tmp_path, seed=3, noise=1.0)
    model_path = fitted(tmp_path, task)
    tuned = str(tmp_path / "tuned.npz")
    extra = ("--dtypes", "float32,int8,binary", "--max-bytes", "2", "-o", tuned, "--json")
    assert main(tune_args(task, model_path, *extra)) == 0
    summary = json.loads(capsys.readouterr().out)
    reference = summary["selection"]["reference"]
    assert (reference["vectors"], reference["storage"], reference["k"], reference["bytes_per_vector"]) == (
        "raw", "binary", 16, 2,
    )  # fmt: skip
    raw_bits = next(r for r in summary["table"] if r["vectors"] == "raw" and r["storage"] == "binary")
    # the sign bits of the untransformed rows, searched by Hamming distance in plain numpy
    expected = Reference(task).metrics(Reference(task).lists(None, None, None, "binary"))["ndcg@10"]
    assert raw_bits["ndcg@10"] == pytest.approx(100 * expected.mean(), abs=1e-9)
    rotated_bits = next(r for r in summary["table"] if r["vectors"] == "rotated" and r["storage"] == "binary")
    assert rotated_bits["ndcg@10"] != raw_bits["ndcg@10"]  # the rotation's bits are other bits
    assert summary["selection"]["kept_reference"] and summary["best"] == raw_bits
    written = load_model(tuned)
    assert (written.basis, written.storage.dtype, written.n_components) == ("identity", "binary", 16)
    assert main(["eval", tuned, "--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", task["qrels"],
                 "--json"]) == 0  # fmt: skip
    scored = json.loads(capsys.readouterr().out)["whitened"]
    assert (scored["dtype"], scored["bytes_per_vector"]) == ("binary", 2)
    assert scored["ndcg@10"] == pytest.approx(raw_bits["ndcg@10"], abs=1e-9)


def test_tune_names_the_rules_choice_and_the_highest_score_apart_for_retrieval(tmp_path, capsys):
    """Issue #46: under a budget the rule keeps raw int8 while centred int8 scores higher on these queries:
    the text, the JSON and the report of the model written show both, each labelled."""
    from streamwhiten.evaluation.report import collect, figures

    task = write_task(tmp_path, seed=2, noise=1.0)
    model_path = fitted(tmp_path, task)
    tuned = str(tmp_path / "tuned.npz")
    args = tune_args(task, model_path, "--dtypes", "float32,int8", "--max-bytes", "16")
    assert main([*args, "--json", "-o", tuned]) == 0
    summary = json.loads(capsys.readouterr().out)
    best, highest = summary["best"], summary["highest"]
    within = [row for row in summary["table"] if row["bytes_per_vector"] <= 16]
    assert (best["vectors"], best["storage"]) == ("raw", "int8")  # the rule keeps the reference
    assert (highest["vectors"], highest["storage"]) == ("centred", "int8")
    assert highest["ndcg@10"] == max(row["ndcg@10"] for row in within) > best["ndcg@10"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("highest    on these queries within 16 bytes per vector, not chosen by the rule:")
    assert lines[at - 1].endswith("(chosen by the rule)") and "int8" in lines[at - 1]
    assert lines[at + 1].endswith("(highest on these queries)") and f"{highest['ndcg@10']:7.2f}" in lines[at + 1]
    legend = [t.get_text() for t in figures(collect(load_model(tuned)))["frontier"].axes[0].get_legend().get_texts()]
    assert any(text.startswith("chosen by the rule: int8 beta=0 gamma=0 k=16") for text in legend)
    assert f"highest on these queries: int8 beta=1 gamma=0 k=16: {highest['ndcg@10']:.2f}" in legend
    assert main(["report", tuned, "-o", str(tmp_path / "r.html"), "-q"]) == 0
    out = capsys.readouterr().out
    assert "(chosen by the rule)" in out and f"ndcg@10 x100 {highest['ndcg@10']:.2f} (highest on these queries)" in out
    page = (tmp_path / "r.html").read_text()
    assert "<th>highest on these queries</th><td>int8 beta=1 gamma=0 k=16" in page


def test_a_rows_json_has_the_keys_of_tune_json_in_their_order():
    from dataclasses import replace

    row = sweep_row(0.5, 1.0, 8, "int8", "whitened", score=40.0)
    head = [
        "beta",
        "gamma",
        "k",
        "k_label",
        "vectors",
        "storage",
        "dtype",
        "rescore",
        "rescore_dtype",
        "bytes_per_vector",
    ]
    tail = ["retention", "difference", "low", "high"]
    assert list(row.to_json()) == [*head, "ndcg@10", *tail] and row.to_json()["ndcg@10"] == 40.0
    coded = replace(row, code={"family": "eigen"})  # a code's record comes before the scores
    assert list(coded.to_json()) == [*head, "code", "ndcg@10", *tail] and coded.to_json()["code"] == {"family": "eigen"}
