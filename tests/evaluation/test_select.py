"""The selection rule (evaluation.select): max-t against a plain numpy reimplementation written out in loops,
the reference kept when every candidate is the reference plus noise, a real winner found, the forecast."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from streamwhiten.errors import BadInputError
from streamwhiten.evaluation.select import Rule, Selection, forecast, intervals, select, spearman_units


def numpy_maxt(scores, reference, samples, seed, level):
    """The rule as the docs state it, one candidate and one resample at a time."""
    n = reference.shape[0]
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(samples, n))
    means, errors = [], []
    for row in scores:
        diff = row - reference
        means.append(100 * diff.mean())
        errors.append(100 * math.sqrt(((diff - diff.mean()) ** 2).sum() / (n - 1)) / math.sqrt(n))
    maxima = []
    for draw in draws:
        biggest = -math.inf
        for row, mean, error in zip(scores, means, errors, strict=True):
            if error > 0:
                biggest = max(biggest, (100 * (row[draw] - reference[draw]).mean() - mean) / error)
        maxima.append(biggest)
    critical = float(np.quantile(maxima, level))
    bounds = [mean - critical * error for mean, error in zip(means, errors, strict=True)]
    best = max(range(len(bounds)), key=lambda i: bounds[i])
    return (best if bounds[best] > 0 else None), critical, bounds


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_maxt_equals_a_plain_numpy_reimplementation(seed):
    rng = np.random.default_rng(seed)
    reference = rng.uniform(0, 1, 60)
    gains = np.array([0.0, 0.02, -0.05, 0.08, 0.01])[:, None]
    scores = np.clip(reference + gains + rng.normal(0, 0.1, (5, 60)), 0, 1)
    got = select(scores, reference, Rule(samples=300, seed=seed))
    index, critical, bounds = numpy_maxt(scores, reference, 300, seed, Rule().level)  # the default level, 0.99
    assert got.index == index
    assert got.critical == pytest.approx(critical, abs=1e-9)
    np.testing.assert_allclose(got.bound, bounds, atol=1e-9)
    np.testing.assert_allclose(got.advantage, 100 * (scores - reference).mean(axis=1), atol=1e-12)


def test_candidates_equal_to_the_reference_plus_noise_keep_the_reference():
    rng = np.random.default_rng(5)
    reference = rng.uniform(0, 1, 131)
    kept = 0
    for trial in range(20):
        scores = reference + rng.normal(0, 0.15, (300, 131))  # 300 settings, none truly better
        assert select(scores, reference, Rule("argmax")).index is not None  # the arg-max always moves
        kept += select(scores, reference, Rule(samples=400, seed=trial)).index is None
    assert kept >= 18


def test_one_real_winner_is_chosen():
    rng = np.random.default_rng(7)
    reference = rng.uniform(0, 1, 131)
    scores = reference + rng.normal(0, 0.15, (300, 131))
    scores[123] = reference + 0.1 + rng.normal(0, 0.1, 131)  # ten points better, per query noise as wide
    chosen = select(scores, reference, Rule(samples=400))
    assert chosen.index == 123 and chosen.n_beating == 1
    assert chosen.bound[123] > 0 and chosen.advantage[123] == pytest.approx(100 * (scores[123] - reference).mean())


def test_a_row_equal_to_the_reference_is_not_a_winner_and_nan_is_worst():
    reference = np.linspace(0, 1, 40)
    scores = np.stack([reference, np.full(40, np.nan), reference + 0.01 * np.sin(np.arange(40))])
    chosen = select(scores, reference, Rule(samples=200))
    assert chosen.index is None and chosen.bound[0] == 0 and chosen.bound[1] == -math.inf


def test_tolerance_takes_the_cheapest_surely_within_it():
    rng = np.random.default_rng(3)
    reference = rng.uniform(0, 1, 200)
    scores = np.stack([reference - 0.005 + rng.normal(0, 0.01, 200), reference - 0.2 + rng.normal(0, 0.01, 200)])
    cost = [48, 8]
    assert select(scores, reference, Rule(cost=cost, reference_cost=1536, tolerance=2.0)).index == 0
    assert select(scores, reference, Rule(cost=cost, reference_cost=1536, tolerance=30.0)).index == 1
    assert select(scores, reference, Rule(cost=cost, reference_cost=4, tolerance=30.0)).index is None


def test_the_forecast_scores_each_fold_on_a_choice_made_without_it():
    rng = np.random.default_rng(11)
    reference = rng.uniform(0, 1, 100)
    scores = reference + rng.normal(0, 0.15, (50, 100))
    scores[7] = reference + 0.2 + rng.normal(0, 0.05, 100)
    out = forecast(scores, reference, Rule(samples=200, seed=2), folds=4)
    # each fold chooses row 7 on the other three, so the held-out scores are row 7's
    assert out["kept_reference"] == 0
    assert out["chosen"]["score"] == pytest.approx(100 * scores[7].mean())
    assert out["reference"]["score"] == pytest.approx(100 * reference.mean())
    assert out["difference"]["low"] > 0
    # the forecast's intervals are 95% ones, whatever the rule's simultaneous level (99% by default)
    _, low, high = intervals(scores[7][None], 200, 2, level=0.95)[0]
    assert (out["chosen"]["low"], out["chosen"]["high"]) == pytest.approx((low, high))
    strict = forecast(scores, reference, Rule(samples=200, seed=2, level=0.999), folds=4)
    assert (strict["chosen"]["low"], strict["chosen"]["high"]) == pytest.approx((low, high))
    noise = reference + rng.normal(0, 0.15, (50, 100))
    kept = forecast(noise, reference, Rule(samples=200, seed=2), folds=4)
    assert kept["kept_reference"] == 4 and kept["difference"]["score"] == 0


def test_spearman_units_average_to_spearman():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    gold = rng.integers(0, 6, 80).astype(float)  # ties
    cosines = np.stack([gold + rng.normal(0, 2, 80), rng.normal(0, 1, 80), np.ones(80)])
    units, _ = spearman_units(cosines, gold)
    assert units[0].mean() == pytest.approx(spearmanr(cosines[0], gold).statistic, abs=1e-12)
    assert units[1].mean() == pytest.approx(spearmanr(cosines[1], gold).statistic, abs=1e-12)
    assert np.all(units[2] == 0)


def test_bad_tables_are_refused():
    with pytest.raises(BadInputError, match="candidates x units"):
        select(np.zeros(3), np.zeros(3))
    with pytest.raises(BadInputError, match="rule"):
        select(np.zeros((1, 3)), np.zeros(3), Rule("best"))
    with pytest.raises(BadInputError, match="fold"):
        forecast(np.zeros((1, 5)), np.zeros(5), folds=5)


def test_the_sweep_grid_checks_the_rule_and_the_folds():
    from streamwhiten.evaluation.sweep import SweepGrid

    assert (SweepGrid().select, SweepGrid().folds) == ("maxt", 5)
    with pytest.raises(BadInputError, match="^select must be one of maxt, argmax"):
        SweepGrid(select="best")
    with pytest.raises(BadInputError, match="^folds must be an integer of at least 2"):
        SweepGrid(folds=1)


def plain_counts(n, samples, seed):
    """How often each unit is drawn in each resample, from one draw of all the indices, counted in loops."""
    draws = np.random.default_rng(seed).integers(0, n, size=(samples, n))
    counts = np.zeros((samples, n))
    for row, draw in enumerate(draws):
        for unit in draw:
            counts[row, unit] += 1
    return counts


@pytest.mark.parametrize("keep", [True, False])
def test_resamples_in_blocks_give_the_results_of_one_draw_of_all(monkeypatch, keep):
    # the previous implementation drew (samples, n) at once for each use; blocks of 7 resamples (and, with
    # keep=False, a new draw for each pass) must give the same counts and the same results
    from streamwhiten.evaluation import select as select_module

    monkeypatch.setattr(select_module, "KEEP", 1 << 30 if keep else 0)
    rng = np.random.default_rng(11)
    n, samples, seed = 40, 53, 4
    reference = rng.uniform(0, 1, n)
    scores = np.clip(reference + np.array([0.0, 0.03, 0.1])[:, None] + rng.normal(0, 0.1, (3, n)), 0, 1)
    counts = plain_counts(n, samples, seed)
    resamples = select_module.Resamples(n, samples, seed, block=7)
    for _ in range(2):  # a second pass reads the kept counts or draws them again, alike
        np.testing.assert_array_equal(np.vstack(list(resamples)), counts)
    # the rule: the critical value of the plain loops, with the blocks given or made
    _, critical, bounds = numpy_maxt(scores, reference, samples, seed, Rule().level)
    for given in (resamples, None):
        got = select(scores, reference, Rule(samples=samples, seed=seed), resamples=given)
        assert got.critical == pytest.approx(critical, rel=1e-12)
        np.testing.assert_allclose(got.bound, bounds, rtol=1e-12)
    # the intervals: percentiles of the resampled means, as the previous implementation took them
    for values in (reference, scores[1] - reference):
        means = 100.0 * (counts @ values) / n
        low, high = np.percentile(means, [2.5, 97.5])
        assert select_module.intervals(values[None], samples, seed, resamples=resamples)[0] == pytest.approx(
            (100.0 * values.mean(), low, high), rel=1e-12
        )
    # the forecast's three intervals come from the same resamples whether shared or made inside
    shared = forecast(scores, reference, Rule(samples=samples, seed=seed), folds=4, resamples=resamples)
    alone = forecast(scores, reference, Rule(samples=samples, seed=seed), folds=4)
    assert shared == alone
    means = 100.0 * (counts @ reference) / n
    assert (alone["reference"]["low"], alone["reference"]["high"]) == pytest.approx(
        tuple(np.percentile(means, [2.5, 97.5])), rel=1e-12
    )


def test_the_rule_is_one_frozen_record_shared_by_select_and_forecast():
    """``select`` and ``forecast`` take the same :class:`Rule`: a forecast's folds choose by it exactly as
    ``select`` does on all the units."""
    import dataclasses

    rule = Rule(cost=[3, 1], reference_cost=4, tolerance=1.0, samples=50)
    assert rule.cost == (3.0, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.seed = 1  # type: ignore[misc]
    with pytest.raises(BadInputError, match="tolerance must be a number >= 0"):
        Rule(tolerance=-1)
    rng = np.random.default_rng(0)
    reference = rng.normal(0.5, 0.1, 40)
    scores = np.stack([reference + 0.2, reference - 0.3])  # the first beats the reference on every unit
    assert select(scores, reference, Rule(samples=50)).index == 0
    assert forecast(scores, reference, Rule(samples=50), folds=4)["kept_reference"] == 0
    assert select(scores, reference, Rule("argmax")).rule == "argmax"


def test_a_selection_record_keeps_its_json_and_reads_back_older_files_with_their_defaults():
    maxt = Selection("maxt", 0.5, {"k": 4}, False, 9, 2, 2.7, 0.99, 1.25, {"folds": 5})
    assert list(maxt.to_json()) == [
        *("rule", "tolerance", "reference", "kept_reference", "n_compared", "n_beating"),
        *("critical", "level", "bound", "forecast"),
    ]
    assert Selection.from_json(maxt.to_json()) == maxt
    argmax = Selection("argmax", 1.0)
    assert argmax.to_json() == {"rule": "argmax", "tolerance": 1.0, "reference": None, "kept_reference": None}
    assert Selection.from_json(argmax.to_json()) == argmax
    # a record saved before the tolerance and the level were kept: no tolerance, chosen at 95%
    older = {key: value for key, value in maxt.to_json().items() if key not in ("tolerance", "level")}
    assert Selection.from_json(older) == replace(maxt, tolerance=0.0, level=0.95)
    assert Selection.from_json(None) is None and Selection.from_json({}) is None
