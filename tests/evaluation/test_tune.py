"""The one-pass grid: closed-form Sigma_beta, agreement with direct scoring, known answers, CLI, bad input."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest
from conftest import REPO, Phases
from scipy import stats as sps

from streamwhiten.cli import main
from streamwhiten.core.model import finalize, load_model, save_model
from streamwhiten.engine.fit import fit_sources
from streamwhiten.errors import BadInputError
from streamwhiten.evaluation.evaluate import cosine_rows, open_pairs
from streamwhiten.evaluation.tune import PairGrid, PairRow, choose, decompose, default_ks, grid_search, make_grid, tune

STSB = os.environ.get("STREAMWHITEN_STSB", os.path.join(REPO, "..", "shared", "data", "stsb", "stsb-dev-minilm.h5"))


def geometry_pairs(n=600, d=6, seed=0):
    """Off-centre, anisotropic vectors whose gold score is their own raw cosine.

    Only a rotation about the origin (beta=0, gamma=0, all k) keeps every cosine, so only that
    setting keeps the ranking perfect: any centring, rescaling or truncation reorders some pairs.
    """
    rng = np.random.default_rng(seed)
    scales = np.geomspace(3.0, 0.2, d)
    a = 1.5 + rng.standard_normal((n, d)) * scales
    b = a + rng.standard_normal((n, d)) * scales * rng.uniform(0.2, 2.0, (n, 1))
    return a, b, cosine_rows(a, b)


def anisotropic_pairs(n=1200, d=16, seed=0):
    """Meaning in low-variance directions, under a large common mean and two loud nuisance directions.

    Raw cosine sees mostly the mean and the nuisance (Spearman near 0); centring and whitening
    (beta=gamma=1, all k: the nuisance is among the top components) recovers the signal.
    """
    rng = np.random.default_rng(seed)
    rho = rng.uniform(0, 1, n)
    za = rng.standard_normal((n, d - 2))
    zb = rho[:, None] * za + np.sqrt(1 - rho[:, None] ** 2) * rng.standard_normal((n, d - 2))

    def embed(z):
        return np.hstack([8.0 * rng.standard_normal((n, 2)), z]) + 4.0

    return embed(za), embed(zb), rho


def write_pairs(path, a, b, scores):
    with h5py.File(path, "w") as handle:
        handle["a"], handle["b"], handle["score"] = a, b, scores
    return f"{path}:/a", f"{path}:/b", f"{path}:/score"


def fitted(tmp_path, name, a, b, scores, **params):
    specs = write_pairs(str(tmp_path / f"{name}.h5"), a, b, scores)
    model = finalize(fit_sources([specs[0], specs[1]]).state, **params)
    path = str(tmp_path / f"{name}.npz")
    save_model(model, path)
    return specs, model, path


def direct_spearman(model, a, b, scores):
    """Independent reference: transform with the model, cosine, scipy's Spearman."""
    cos = cosine_rows(model.transform(np.asarray(a, np.float64)), model.transform(np.asarray(b, np.float64)))
    return 100 * sps.spearmanr(cos, scores).statistic


# ----------------------------------------------------------------------------- closed-form Sigma_beta


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.75, 1.0])
def test_closed_form_sigma_beta_equals_direct_recomputation(tmp_path, beta):
    a, b, scores = anisotropic_pairs(n=400, d=8)
    specs, model, path = fitted(tmp_path, "m", a, b, scores, beta=0.5)
    for source in ("m.h5",):  # the fitting data is gone: tune must live on the saved statistics
        os.remove(tmp_path / source)
    base = decompose(load_model(path), beta)
    x = np.vstack([a, b])
    shifted = x - beta * x.mean(axis=0)
    direct = shifted.T @ shifted / x.shape[0]
    reference = np.linalg.eigvalsh(direct)[::-1]
    np.testing.assert_allclose(base.eigvals, reference, rtol=1e-10, atol=1e-10 * reference[0])
    # Same eigenspaces: the reconstruction from the decomposition equals the direct matrix.
    rebuilt = (base.eigvecs * base.eigvals) @ base.eigvecs.T
    np.testing.assert_allclose(rebuilt, direct, rtol=0, atol=1e-9 * reference[0])


def test_grid_scores_equal_direct_scoring_of_every_setting(tmp_path):
    a, b, scores = anisotropic_pairs(n=300, d=10)
    specs, model, _ = fitted(tmp_path, "m", a, b, scores)
    with open_pairs(*specs) as pairs:
        result = grid_search(
            model,
            pairs,
            grid=PairGrid(betas=[0, 0.5, 1], gammas=[0, 0.6, 1], ks=[10, 7, 2], variances=[0.8]),
            block_rows=64,
        )
    assert len(result.table) == 3 * 3 * 4 + 1  # and the raw vectors (no transformation), last
    raw_row = result.table[-1]
    assert raw_row.vectors == "raw" and (raw_row.beta, raw_row.gamma, raw_row.k) == (0.0, 0.0, 10)
    assert raw_row.spearman == pytest.approx(100 * sps.spearmanr(cosine_rows(a, b), scores).statistic)
    for row in result.table[:-1]:
        reference = finalize(
            model.state,
            beta=row.beta,
            gamma=row.gamma,
            n_components=None if row.variance else row.k,
            variance=row.variance,
        )
        assert reference.n_components == row.k
        assert row.spearman == pytest.approx(direct_spearman(reference, a, b, scores), abs=1e-8)
    assert result.raw["spearman"] == pytest.approx(100 * sps.spearmanr(cosine_rows(a, b), scores).statistic)


# ------------------------------------------------------------------------------------- known answers


def test_only_a_rotation_preserves_a_geometric_ranking(tmp_path):
    a, b, scores = geometry_pairs()
    specs, model, _ = fitted(tmp_path, "m", a, b, scores)
    with open_pairs(*specs) as pairs:
        result = grid_search(model, pairs)
    best = result.best
    assert (best.beta, best.gamma, best.k) == (0.0, 0.0, 6)
    assert best.spearman == pytest.approx(100.0, abs=1e-6)
    assert result.raw["spearman"] == pytest.approx(100.0, abs=1e-9)
    # Any centring or rescaling visibly loses; so does dropping even the quietest direction.
    assert max(row.spearman for row in result.table if (row.beta, row.gamma) != (0.0, 0.0)) < 99.5
    assert max(row.spearman for row in result.table if row.k < 6) < 100.0 - 1e-3


def test_whitening_wins_where_the_signal_is_quiet(tmp_path):
    a, b, scores = anisotropic_pairs()
    specs, model, path = fitted(tmp_path, "m", a, b, scores, beta=0.0, gamma=0.0)
    with open_pairs(*specs) as pairs:
        result = grid_search(model, pairs)
    assert (result.best.beta, result.best.gamma, result.best.k) == (1.0, 1.0, 16)
    assert result.raw["spearman"] < 15 and result.best.spearman > result.raw["spearman"] + 50
    # The choice is the grid's argmax by independent recomputation.
    chosen = result.chosen_model()
    reference = max(result.table, key=lambda row: direct_spearman(result.model_for(row), a, b, scores))
    assert (reference.beta, reference.gamma, reference.k) == (chosen.beta, chosen.gamma, chosen.n_components)


def row_of(k, spearman):
    return PairRow(0.5, 1.0, k, str(k), None, "whitened", spearman, 0.0)


def test_tolerance_prefers_fewer_dimensions():
    table = [row_of(64, 80.0), row_of(16, 79.7), row_of(8, 75.0), row_of(32, float("nan"))]
    assert choose(table) is table[0]
    assert choose(table, tolerance=0.5) is table[1]
    with pytest.raises(BadInputError, match="no setting of the grid gives a finite"):
        choose([row_of(1, float("nan"))])


def test_a_rows_json_is_its_fields_in_order_and_the_choice_is_its_rows_dict(tmp_path):
    assert list(row_of(8, 75.0).to_json().items()) == [
        ("beta", 0.5), ("gamma", 1.0), ("k", 8), ("k_label", "8"), ("variance", None), ("vectors", "whitened"),
        ("spearman", 75.0), ("pearson", 0.0),
    ]  # fmt: skip
    a, b, scores = geometry_pairs()
    specs, model, _ = fitted(tmp_path, "m", a, b, scores)
    with open_pairs(*specs) as pairs:
        result = grid_search(model, pairs, PairGrid(betas=[0, 1], gammas=[0, 1], ks=[6, 3], variances=[]))
    summary = result.to_json()
    assert summary["table"] == [row.to_json() for row in result.table]
    assert summary["best"] is summary["table"][result.table.index(result.best)]


def test_default_k_ladder():
    assert default_ks(384) == [384, 256, 128, 64, 32, 16, 8]
    assert default_ks(768) == [768, 512, 256, 128, 64, 32, 16, 8]
    assert default_ks(6) == [6, 4, 2, 1]


@pytest.mark.parametrize(
    "grid, message",
    [
        (dict(betas=[]), "the grid is empty: give at least one beta"),
        (dict(gammas=[]), "the grid is empty: give at least one gamma"),
        (dict(ks=[], variances=[]), "the grid is empty: give at least one k"),
        (dict(betas=[1.5]), r"beta must be a number in \[0, 1\], got 1.5"),
        (dict(ks=[9]), r"n_components \(k\) = 9 exceeds the data width d = 8"),
        (dict(variances=[0]), r"variance must be a fraction in \(0, 1\]"),
    ],
)
def test_bad_grid_is_one_clear_error(grid, message):
    with pytest.raises(BadInputError, match=message):
        make_grid(8, **grid)


def test_test_set_scores_the_choice_next_to_raw(tmp_path):
    a, b, scores = anisotropic_pairs(seed=1)
    ta, tb, tscores = anisotropic_pairs(n=500, seed=2)
    specs, model, _ = fitted(tmp_path, "m", a, b, scores)
    test_specs = write_pairs(str(tmp_path / "test.h5"), ta, tb, tscores)
    told = Phases()
    with open_pairs(*specs) as pairs, open_pairs(*test_specs) as test_pairs:
        chosen, summary = tune(
            model,
            pairs,
            test_pairs,
            grid=PairGrid(betas=[0, 1], gammas=[0, 1], ks=[4, 16], variances=[]),
            progress=told,
        )
    assert (
        told.begun
        == told.ended
        == [
            "score 9 settings on 1,200 pairs",  # 2 betas x 2 gammas x 2 ks, and the raw vectors
            "correlate and choose (maxt rule)",
            "score the choice on 500 test pairs",
        ]
    )
    assert told.counts[-1] == (500, 500) and (1200, 1200) in told.counts
    test = summary["test"]
    assert test["raw"]["spearman"] == pytest.approx(100 * sps.spearmanr(cosine_rows(ta, tb), tscores).statistic)
    assert test["chosen"]["spearman"] == pytest.approx(direct_spearman(chosen, ta, tb, tscores), abs=1e-6)
    assert chosen.info["tuned"]["test"]["chosen"]["spearman"] == test["chosen"]["spearman"]


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_tune_writes_the_choice_so_apply_uses_it(tmp_path, capsys):
    a, b, scores = anisotropic_pairs(n=600)
    specs, model, path = fitted(tmp_path, "m", a, b, scores, beta=0.0, gamma=0.0, n_components=4)
    pair_args = ["--pairs-a", specs[0], "--pairs-b", specs[1], "--scores", specs[2]]
    out_path = str(tmp_path / "tuned.npz")
    before = open(path, "rb").read()

    assert (
        main(
            [
                "tune",
                path,
                *pair_args,
                "--betas",
                "0,1",
                "--gammas",
                "0 1",
                "--ks",
                "d,8",
                "--variances",
                "",
                "-o",
                out_path,
                "--json",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert len(summary["table"]) == 2 * 2 * 2 + 1 and summary["written"] == out_path  # + the raw vectors
    tuned = load_model(out_path)
    assert (
        (tuned.beta, tuned.gamma, tuned.n_components)
        == (summary["best"]["beta"], summary["best"]["gamma"], summary["best"]["k"])
        == (1.0, 1.0, 16)
    )
    assert tuned.info["tuned"]["validation"]["chosen"]["spearman"] == pytest.approx(summary["best"]["spearman"])
    assert open(path, "rb").read() == before  # -o leaves the original alone

    # -o onto an existing file needs --overwrite, and nothing is computed first.
    assert main(["tune", path, *pair_args, "-o", out_path]) == 2
    assert "already exists (pass --overwrite" in capsys.readouterr().err

    # apply picks the tuned setting up from the file.
    out_store = str(tmp_path / "out.h5")
    assert main(["apply", out_path, specs[0], "-o", out_store, "-q"]) == 0
    with h5py.File(out_store) as handle:
        assert handle["embeddings"].shape == (600, 16)

    # --in-place rewrites the model itself; the text output shows the table and the best row.
    assert (
        main(
            [
                "tune",
                path,
                *pair_args,
                "--betas",
                "1",
                "--gammas",
                "1",
                "--ks",
                "16,4",
                "--variances",
                "0.9",
                "--in-place",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "chosen" in text and "beta=1 gamma=1 k=16" in text and "*" in text and "90%" in text
    assert "max-t: " in text and "forecast   spearman x100 on pairs not chosen on" in text
    assert load_model(path).n_components == 16


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--betas", ""], "the grid is empty: give at least one beta"),
        (["--ks", "4,x"], "--ks: 'x' is not an integer"),
        (["--test-a", "{a}"], "give all three of --test-a, --test-b and --test-scores, or none"),
        (["-o", "{o}", "--in-place"], "give -o/--output or --in-place, not both"),
    ],
)
def test_cli_tune_bad_input(tmp_path, capsys, extra, message):
    a, b, scores = anisotropic_pairs(n=100, d=6)
    specs, _, path = fitted(tmp_path, "m", a, b, scores)
    extra = [item.format(a=specs[0], o=str(tmp_path / "o.npz")) for item in extra]
    assert main(["tune", path, "--pairs-a", specs[0], "--pairs-b", specs[1], "--scores", specs[2], *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


# -------------------------------------------------------------------------------------- real data


@pytest.mark.skipif(
    not os.path.exists(STSB), reason=f"STS-B embeddings not found at {STSB} (licence keeps them out of the repo)"
)
def test_stsb_tuned_setting_is_never_worse_than_raw(tmp_path, capsys):
    model_path = str(tmp_path / "stsb.npz")
    assert main(["fit", f"{STSB}:/mean_a", f"{STSB}:/mean_b", "-o", model_path, "-q"]) == 0
    capsys.readouterr()
    args = [
        "tune",
        model_path,
        "--pairs-a",
        f"{STSB}:/mean_a",
        "--pairs-b",
        f"{STSB}:/mean_b",
        "--scores",
        f"{STSB}:/score",
        "--json",
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["raw"]["spearman"] == pytest.approx(86.72, abs=0.01)
    assert summary["best"]["spearman"] >= summary["raw"]["spearman"]
    for row in summary["table"]:
        assert np.isfinite(row["spearman"]), row  # beta=gamma=1 at full d included: eps keeps it finite


def test_the_default_rule_keeps_raw_when_no_setting_beats_it_beyond_noise(tmp_path):
    # gold scores are the raw cosine plus heavy noise: every setting is raw plus noise, none truly better
    rng = np.random.default_rng(3)
    a, b, _ = geometry_pairs(n=400, d=6, seed=3)
    gold = cosine_rows(a, b) + rng.normal(0, 0.3, 400)
    specs, model, _ = fitted(tmp_path, "m", a, b, gold)
    with open_pairs(*specs) as pairs:
        kept = grid_search(model, pairs, grid=PairGrid(betas=[0.25, 0.5, 1], variances=[]))  # no raw row: it is added
        old = grid_search(model, pairs, grid=PairGrid(betas=[0.25, 0.5, 1], variances=[], select="argmax"))
    assert (kept.best.beta, kept.best.gamma, kept.best.k) == (0.0, 0.0, 6)
    assert kept.best.spearman == pytest.approx(kept.raw["spearman"], abs=1e-9)
    assert kept.chosen_model().beta == 0.0 and kept.selection.kept_reference
    assert kept.selection.n_beating == 0 and kept.selection.n_compared == len(kept.table) - 1
    assert old.best.spearman == max(row.spearman for row in old.table)  # the old rule: the best of the grid
    predicted = kept.selection.forecast
    assert predicted["kept_reference"] == 5 and predicted["difference"]["score"] == 0
    # the per-pair terms average to each row's Spearman
    np.testing.assert_allclose(kept.per_pair.mean(axis=1) * 100, [row.spearman for row in kept.table], atol=1e-9)


def test_when_the_raw_vectors_are_kept_the_model_written_holds_no_transformation(tmp_path):
    a, b, scores = geometry_pairs()  # the gold score is the raw cosine: nothing beats the raw vectors
    specs, model, _ = fitted(tmp_path, "m", a, b, scores)
    with open_pairs(*specs) as pairs:
        chosen, summary = tune(model, pairs, grid=PairGrid(betas=[0, 1], gammas=[0, 1], ks=[6, 3], variances=[]))
    assert summary["selection"]["kept_reference"] and summary["best"]["vectors"] == "raw"
    assert summary["best"] is summary["table"][-1] and summary["best"]["spearman"] == summary["raw"]["spearman"]
    assert chosen.basis == "identity" and chosen.info["tuned"]["setting"]["basis"] == "identity"
    assert np.array_equal(chosen.transform(a), a)  # y = x, not the rotation x U
    path = str(tmp_path / "tuned.npz")
    save_model(chosen, path)
    assert load_model(path).basis == "identity"


def test_tune_names_the_rules_choice_and_the_highest_score_apart(tmp_path, capsys):
    """Issue #46: where the rule keeps the raw vectors and a setting scores higher on these pairs by chance,
    the text and JSON show both, each labelled (and the table marks both cells)."""
    rng = np.random.default_rng(2)
    n, d = 200, 8
    a = rng.standard_normal((n, d)) * np.geomspace(3, 0.3, d) + 2
    b = a + rng.standard_normal((n, d)) * rng.uniform(0.2, 2, (n, 1))
    score = -np.linalg.norm(a - b, axis=1) + rng.standard_normal(n) * 0.5
    specs, _, path = fitted(tmp_path, "noisy", a.astype(np.float32), b.astype(np.float32), score)
    args = ["tune", path, "--pairs-a", specs[0], "--pairs-b", specs[1], "--scores", specs[2], "--betas", "0,1"]
    args += ["--gammas", "0,0.5,1", "--ks", "8,4", "--variances", ""]
    assert main([*args, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    best, highest = summary["best"], summary["highest"]
    assert best["vectors"] == "raw" and summary["selection"]["kept_reference"]
    assert highest["spearman"] == max(row["spearman"] for row in summary["table"]) > best["spearman"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    chosen = next(line for line in lines if line.startswith("chosen "))
    assert "the raw vectors (no transformation), k=8  (chosen by the rule; Spearman +0.00 vs raw)" in chosen
    line = next(line for line in lines if line.startswith("highest "))
    assert f"Spearman x100 {highest['spearman']:6.2f}" in line and "beta=0 gamma=0.5 k=8" in line
    assert "(highest on these pairs, not chosen by the rule; Spearman +0.83 vs raw)" in line
    assert any("*: chosen by the rule; ^: highest on these pairs" in line for line in lines)
    row = next(line for line in lines if line.startswith("    0   0.5 |"))
    assert f"{highest['spearman']:7.2f}^" in row
    # where nothing scores above the choice, one line says both
    assert main([*args, "--select", "argmax"]) == 0
    text = capsys.readouterr().out
    assert "(chosen by the rule, and highest on these pairs;" in text and "\nhighest " not in text
