"""Pair scoring: correlations against scipy.stats, streamed cosines against direct recomputation, bad input."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
import zarr
from conftest import REPO
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from streamwhiten.cli import main
from streamwhiten.core.model import finalize, save_model
from streamwhiten.engine.fit import fit_sources
from streamwhiten.errors import BadInputError, NonFiniteError
from streamwhiten.evaluation.evaluate import (
    cosine_rows,
    evaluate_pairs,
    open_pairs,
    pair_cosines,
    pearson,
    rankdata,
    spearman,
)
from streamwhiten.io import read_vector

STSB = os.environ.get("STREAMWHITEN_STSB", os.path.join(REPO, "..", "shared", "data", "stsb", "stsb-dev-minilm.h5"))


def write_pairs(path, a, b, scores):
    with h5py.File(path, "w") as handle:
        handle.create_dataset("a", data=a, chunks=(min(7, a.shape[0]), a.shape[1]))
        handle.create_dataset("b", data=b)
        handle.create_dataset("score", data=scores)
    return f"{path}:/a", f"{path}:/b", f"{path}:/score"


def random_pairs(n=300, d=12, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, d)) + 3.0
    b = a + rng.standard_normal((n, d)) * rng.uniform(0.1, 3.0, size=(n, 1))
    scores = np.round(-np.linalg.norm(a - b, axis=1) + rng.standard_normal(n) * 0.3, 1)  # ties on purpose
    return a.astype(np.float32), b.astype(np.float32), scores


# ------------------------------------------------------------------------------------- correlations


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-5, 5), min_size=1, max_size=40))
def test_rankdata_matches_scipy_average_ranks(values):
    values = np.array(values, dtype=np.float64)
    np.testing.assert_allclose(rankdata(values), sps.rankdata(values, method="average"))


@settings(max_examples=60, deadline=None)
@given(st.integers(3, 200), st.integers(0, 2**31 - 1), st.booleans())
def test_spearman_and_pearson_match_scipy(n, seed, with_ties):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    y = 0.5 * x + rng.standard_normal(n)
    if with_ties:
        x, y = np.round(x), np.round(y * 2) / 2
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        assert np.isnan(spearman(x, y)) and np.isnan(pearson(x, y))
        return
    assert spearman(x, y) == pytest.approx(sps.spearmanr(x, y).statistic, abs=1e-12)
    assert pearson(x, y) == pytest.approx(sps.pearsonr(x, y).statistic, abs=1e-12)


def test_pearson_survives_huge_and_tiny_scales():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(50), rng.standard_normal(50)
    expected = sps.pearsonr(x, y).statistic
    assert pearson(x * 1e200, y * 1e-200) == pytest.approx(expected, abs=1e-12)


def test_constant_input_gives_nan():
    assert np.isnan(spearman(np.ones(5), np.arange(5.0)))
    assert np.isnan(pearson(np.arange(5.0), np.full(5, 2.0)))


def test_cosine_rows_against_direct_formula_and_zero_rows():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((20, 5)), rng.standard_normal((20, 5))
    a[3] = 0.0
    expected = [
        x @ y / (np.linalg.norm(x) * np.linalg.norm(y)) if np.linalg.norm(x) else 0.0
        for x, y in zip(a, b, strict=False)
    ]
    np.testing.assert_allclose(cosine_rows(a, b), expected, atol=1e-14)


# ---------------------------------------------------------------------------------------- pair sets


def test_streamed_scores_match_direct_recomputation(tmp_path):
    a, b, scores = random_pairs()
    specs = write_pairs(str(tmp_path / "pairs.h5"), a, b, scores)
    state = fit_sources([specs[0], specs[1]]).state
    model = finalize(state, beta=1.0, gamma=1.0, n_components=7)
    with open_pairs(*specs) as pairs:
        result = evaluate_pairs(pairs, model, block_rows=11)  # many blocks, a short tail
    raw_cos = cosine_rows(a, b)
    white_cos = cosine_rows(model.transform(a.astype(np.float64)), model.transform(b.astype(np.float64)))
    assert result.raw.spearman == pytest.approx(100 * sps.spearmanr(raw_cos, scores).statistic, abs=1e-9)
    assert result.raw.pearson == pytest.approx(100 * sps.pearsonr(raw_cos, scores).statistic, abs=1e-9)
    assert result.whitened.spearman == pytest.approx(100 * sps.spearmanr(white_cos, scores).statistic, abs=1e-6)
    assert result.whitened.pearson == pytest.approx(100 * sps.pearsonr(white_cos, scores).statistic, abs=1e-6)
    assert result.whitened.k == 7 and result.pairs.n_pairs == a.shape[0]
    assert result.whitened.code is None and "code" not in result.whitened.to_json()  # no vector code recorded


def test_block_size_does_not_change_cosines(tmp_path):
    a, b, scores = random_pairs(n=50)
    specs = write_pairs(str(tmp_path / "pairs.h5"), a, b, scores)
    model = finalize(fit_sources([specs[0]]).state, beta=0.5, gamma=0.5)
    with open_pairs(*specs) as pairs:
        one = pair_cosines(pairs, {"m": model}, block_rows=1)
        whole = pair_cosines(pairs, {"m": model}, block_rows=10_000)
    for key in ("raw", "m"):
        np.testing.assert_allclose(one[key], whole[key], rtol=0, atol=1e-13)


def test_pairs_from_npy_and_zarr(tmp_path):
    a, b, scores = random_pairs(n=40)
    np.save(tmp_path / "a.npy", a)
    zarr.create_array(store=str(tmp_path / "b.zarr"), data=b, chunks=(16, b.shape[1]))
    np.save(tmp_path / "s.npy", scores[:, None])  # an (n, 1) column is accepted
    with open_pairs(str(tmp_path / "a.npy"), str(tmp_path / "b.zarr"), str(tmp_path / "s.npy")) as pairs:
        result = evaluate_pairs(pairs)
    assert result.raw.spearman == pytest.approx(100 * sps.spearmanr(cosine_rows(a, b), scores).statistic)


def test_read_vector_finds_the_only_1d_dataset_and_names_choices(tmp_path):
    path = str(tmp_path / "s.h5")
    with h5py.File(path, "w") as handle:
        handle["x"] = np.arange(4.0)
        handle["m"] = np.zeros((4, 2))
    values, label = read_vector(path)
    np.testing.assert_array_equal(values, np.arange(4.0))
    assert label.endswith(":/x")
    with h5py.File(path, "a") as handle:
        handle["y"] = np.arange(4)
    with pytest.raises(BadInputError, match="name the 1-D dataset to read; its 1-D datasets: /x, /y"):
        read_vector(path)
    with pytest.raises(BadInputError, match=r"expected a 1-D array, got shape \(4, 2\)"):
        read_vector(path + ":/m")


def test_read_vector_from_zarr_group_and_integer_scores(tmp_path):
    store = str(tmp_path / "s.zarr")
    group = zarr.open_group(store=store, mode="w")
    group.create_array("gold", data=np.array([3, 1, 2], dtype=np.int16))
    group.create_array("vectors", data=np.zeros((3, 2), dtype=np.float32))
    values, label = read_vector(store)  # the group's only 1-D array is found
    assert values.dtype == np.float64 and values.tolist() == [3.0, 1.0, 2.0] and label.endswith(":/gold")
    with pytest.raises(BadInputError, match="has no 1-D dataset /nope"):
        read_vector(_h5_with_vector(tmp_path) + ":/nope")


def _h5_with_vector(tmp_path):
    path = str(tmp_path / "v.h5")
    with h5py.File(path, "w") as handle:
        handle["v"] = np.arange(3.0)
    return path


@pytest.mark.parametrize(
    "case, message",
    [
        ("length", r"pair stores differ in length: .*:/a has 30 rows but .*:/b has 29"),
        ("width", r"pair stores differ in width: .*:/a has 6 columns but .*:/b has 5"),
        ("scores_length", r":/score: has 31 scores but there are 30 pairs"),
        ("nan_score", r":/score: score 4 is NaN \(2 non-finite score\(s\) in all\)"),
        ("constant_scores", r"every score is 1"),
        ("too_few", r"has 2 row\(s\); at least 3 are needed"),
    ],
)
def test_bad_pairs_are_one_clear_error(tmp_path, case, message):
    rng = np.random.default_rng(3)
    n = 2 if case == "too_few" else 30
    a, b = rng.standard_normal((n, 6)), rng.standard_normal((n, 6))
    scores = rng.standard_normal(n)
    if case == "length":
        b = b[:-1]
    elif case == "width":
        b = b[:, :5]
    elif case == "scores_length":
        scores = rng.standard_normal(n + 1)
    elif case == "nan_score":
        scores[[4, 9]] = np.nan
    elif case == "constant_scores":
        scores[:] = 1.0
    specs = write_pairs(str(tmp_path / "p.h5"), a, b, scores)
    with pytest.raises(BadInputError, match=message):
        open_pairs(*specs)


def test_nonfinite_vector_names_store_and_row(tmp_path):
    a, b, scores = random_pairs(n=30)
    b[17, 2] = np.inf
    specs = write_pairs(str(tmp_path / "p.h5"), a, b, scores)
    with open_pairs(*specs) as pairs, pytest.raises(NonFiniteError, match=r":/b: row 17 holds NaN or Inf"):
        evaluate_pairs(pairs, block_rows=8)


def test_model_width_mismatch(tmp_path):
    a, b, scores = random_pairs(n=30, d=6)
    specs = write_pairs(str(tmp_path / "p.h5"), a, b, scores)
    model = finalize(fit_sources([write_pairs(str(tmp_path / "q.h5"), *random_pairs(n=30, d=5))[0]]).state)
    with open_pairs(*specs) as pairs, pytest.raises(BadInputError, match="6 columns but the model expects 5"):
        evaluate_pairs(pairs, model)


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_eval_raw_and_model(tmp_path, capsys):
    a, b, scores = random_pairs()
    specs = write_pairs(str(tmp_path / "pairs.h5"), a, b, scores)
    model_path = str(tmp_path / "m.npz")
    model = finalize(fit_sources([specs[0], specs[1]]).state, beta=1.0, gamma=1.0)
    save_model(model, model_path)
    pair_args = ["--pairs-a", specs[0], "--pairs-b", specs[1], "--scores", specs[2]]

    assert main(["eval", *pair_args, "--json"]) == 0
    raw_only = json.loads(capsys.readouterr().out)
    assert raw_only["whitened"] is None
    expected_raw = 100 * sps.spearmanr(cosine_rows(a, b), scores).statistic
    assert raw_only["raw"]["spearman"] == pytest.approx(expected_raw)

    assert main(["eval", model_path, *pair_args, "-k", "5", "--gamma", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    tuned = model.with_params(n_components=5, gamma=0.5)
    cos = cosine_rows(tuned.transform(a.astype(np.float64)), tuned.transform(b.astype(np.float64)))
    assert out["whitened"]["spearman"] == pytest.approx(100 * sps.spearmanr(cos, scores).statistic, abs=1e-6)
    assert (out["whitened"]["k"], out["whitened"]["gamma"]) == (5, 0.5)

    assert main(["eval", model_path, *pair_args]) == 0
    text = capsys.readouterr().out
    assert "raw" in text and "Spearman" in text and "beta=1 gamma=1 k=12" in text


def test_cli_eval_errors_are_one_line(tmp_path, capsys):
    a, b, scores = random_pairs(n=30)
    specs = write_pairs(str(tmp_path / "p.h5"), a, b[:-1], scores)
    assert main(["eval", "--pairs-a", specs[0], "--pairs-b", specs[1], "--scores", specs[2]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "differ in length" in err
    specs = write_pairs(str(tmp_path / "q.h5"), a, b, scores)
    assert main(["eval", "--pairs-a", specs[0], "--pairs-b", specs[1], "--scores", specs[2], "-k", "3"]) == 2
    assert "need a MODEL" in capsys.readouterr().err


# -------------------------------------------------------------------------------------- real data


@pytest.mark.skipif(
    not os.path.exists(STSB), reason=f"STS-B embeddings not found at {STSB} (licence keeps them out of the repo)"
)
def test_stsb_raw_mean_pooling_is_the_published_86_72(capsys):
    args = [
        "eval",
        "--pairs-a",
        f"{STSB}:/mean_a",
        "--pairs-b",
        f"{STSB}:/mean_b",
        "--scores",
        f"{STSB}:/score",
        "--json",
    ]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["raw"]["spearman"] == pytest.approx(86.72, abs=0.01)
