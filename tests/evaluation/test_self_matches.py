"""Queries that are corpus rows (evaluation.self_matches): found from the raw search's top scores, reported
as data by the library, one warning from ``eval`` and ``tune`` when no ``--exclude`` is given (issue #46)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import write_h5, write_task

from streamwhiten.core import stats
from streamwhiten.core.model import finalize, save_model
from streamwhiten.evaluation.retrieval import evaluate_retrieval
from streamwhiten.options import RetrievalOptions

N_QUERIES, N_COPIED = 40, 30


def self_matched_task(tmp_path):
    """A task whose corpus holds a copy of 30 of its 40 queries (15 exact, 15 one float32 step off in every
    value), at rows after the documents; each query's relevant document is the document it was drawn
    near, never its copy."""
    rng = np.random.default_rng(5)
    n, d = 600, 16
    documents = (rng.standard_normal((n, d)) * np.geomspace(3, 0.1, d)).astype(np.float32)
    picks = rng.choice(n, N_QUERIES, replace=False)
    queries = (documents[picks] + 0.3 * rng.standard_normal((N_QUERIES, d))).astype(np.float32)
    copies = queries[:N_COPIED].copy()
    copies[N_COPIED // 2 :] = np.nextafter(copies[N_COPIED // 2 :], np.float32(np.inf))  # float rounding
    corpus = np.vstack([documents, copies])
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{c}\t1\n" for q, c in enumerate(picks)))
    return dict(
        queries=queries,
        corpus=corpus,
        qrels=str(qrels),
        spec_q=write_h5(tmp_path / "q.h5", queries, chunk_rows=16),
        spec_c=write_h5(tmp_path / "c.h5", corpus, chunk_rows=128),
        copies=[(str(q), str(n + q)) for q in range(N_COPIED)],
        relevant={(q, int(c)) for q, c in enumerate(picks)},
    )


def numpy_self_matches(queries, corpus, relevant) -> list[tuple[str, str]]:
    """Independent reference: the full cosine matrix in float64; a query's pair is its nearest row where
    that row's cosine is 1 to 1e-6 and the pair is not relevant."""
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    c = corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
    cosines = q.astype(np.float64) @ c.astype(np.float64).T
    top = cosines.argmax(axis=1)
    return [(str(i), str(j)) for i, j in enumerate(top) if cosines[i, j] > 1 - 1e-6 and (i, int(j)) not in relevant]


def model_of(tmp_path, corpus) -> str:
    path = str(tmp_path / "model.npz")
    save_model(finalize(stats.block_moments(corpus.astype(np.float64))), path)
    return path


def task_args(task):
    return ["--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", task["qrels"]]


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("streamwhiten: warning: ")]


def test_the_library_reports_the_queries_that_are_corpus_rows_and_prints_nothing(tmp_path, capsys):
    task = self_matched_task(tmp_path)
    result = evaluate_retrieval(task["spec_q"], task["spec_c"], task["qrels"], options=RetrievalOptions(bootstrap=0))
    assert capsys.readouterr() == ("", "")  # data, never a print
    found = result.self_matches
    reference = numpy_self_matches(task["queries"], task["corpus"], task["relevant"])
    assert list(found.pairs) == task["copies"] == reference
    assert (found.count, found.n_queries) == (N_COPIED, N_QUERIES)
    assert found.tolerance == pytest.approx(6 * 2.0**-24)
    assert result.raw.recall_1 < 100 * (N_QUERIES - N_COPIED) / N_QUERIES + 1e-9  # the copies come first
    assert result.to_json()["self_matches"]["pairs"][0] == ["0", str(task["corpus"].shape[0] - N_COPIED)]
    # float16 storage rounds the searched rows: its own tolerance still finds them all
    assert (
        evaluate_retrieval(
            task["spec_q"], task["spec_c"], task["qrels"], storage="float16", options=RetrievalOptions(bootstrap=0)
        ).self_matches.count
        == N_COPIED
    )


def test_a_copy_judged_relevant_is_no_self_match(tmp_path):
    task = write_task(tmp_path, seed=1, noise=0.0)  # each query is its relevant document, exactly
    result = evaluate_retrieval(task["spec_q"], task["spec_c"], task["qrels"], options=RetrievalOptions(bootstrap=0))
    assert result.self_matches.count == 0 and result.raw.recall_1 == 100.0


def test_eval_warns_once_with_the_count_and_the_fix_and_not_with_exclude(tmp_path, run_cli):
    task = self_matched_task(tmp_path)
    model = model_of(tmp_path, task["corpus"])
    code, out, err = run_cli("eval", model, *task_args(task), "--bootstrap", "0", "--json")
    assert code == 0
    (warning,) = warnings_in(err)
    assert _not_progress(err) == [warning]  # one line besides the timed phase lines
    assert "30 of 40 queries equal a corpus row not judged relevant to them" in warning
    assert "--exclude FILE, a TSV with the header query-id<TAB>corpus-id and one line per such pair" in warning
    pairs = json.loads(out)["self_matches"]["pairs"]
    assert pairs == [list(pair) for pair in task["copies"]]
    before = json.loads(out)["raw"]["recall@1"]
    # the fix the warning names: an exclude file of those pairs
    exclude = tmp_path / "exclude.tsv"
    exclude.write_text("query-id\tcorpus-id\n" + "".join(f"{q}\t{c}\n" for q, c in pairs))
    code, out, err = run_cli("eval", model, *task_args(task), "--exclude", exclude, "--bootstrap", "0", "--json")
    assert code == 0 and warnings_in(err) == []
    after = json.loads(out)
    assert after["self_matches"]["count"] == 0 and after["raw"]["recall@1"] > before + 50
    # int8 storage searches no float cosines: not checked, no warning
    code, out, err = run_cli("eval", model, *task_args(task), "--dtype", "int8", "--bootstrap", "0", "--json")
    assert code == 0 and warnings_in(err) == [] and json.loads(out)["self_matches"] is None


def test_eval_without_self_matches_does_not_warn(tmp_path, run_cli):
    task = write_task(tmp_path, seed=0, noise=1.0)
    code, out, err = run_cli("eval", *task_args(task), "--bootstrap", "0", "--json")
    assert code == 0 and _not_progress(err) == [] and json.loads(out)["self_matches"]["count"] == 0


def test_tune_warns_once_and_not_with_exclude(tmp_path, run_cli):
    task = self_matched_task(tmp_path)
    model = model_of(tmp_path, task["corpus"])
    grid = ["--betas", "0,1", "--gammas", "0,1", "--ks", "16", "--variances", "", "--bootstrap", "50"]
    code, out, err = run_cli("tune", model, *task_args(task), *grid, "--dtypes", "float32", "--json")
    assert code == 0
    (warning,) = warnings_in(err)
    assert _not_progress(err) == [warning] and "30 of 40 queries equal a corpus row" in warning
    assert json.loads(out)["self_matches"]["pairs"] == [list(pair) for pair in task["copies"]]
    exclude = tmp_path / "exclude.tsv"
    exclude.write_text("query-id\tcorpus-id\n" + "".join(f"{q}\t{c}\n" for q, c in task["copies"]))
    code, out, err = run_cli("tune", model, *task_args(task), *grid, "--dtypes", "float32", "--exclude", exclude)
    assert code == 0 and warnings_in(err) == []


def _not_progress(err: str) -> list[str]:
    """The lines of ``err`` but the timed phase lines a piped command logs (``... streamwhiten: eval: ...``)."""
    return [line for line in err.splitlines() if not re.match(r"\d{4}-\d\d-\d\dT\S+ streamwhiten: \w+: ", line)]
