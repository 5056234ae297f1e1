"""Staleness of a published map against independent numpy references, hand-computed cases and edge cases.

The references never call the module under test: they eigendecompose the published rows' second moment
with numpy, whiten the current rows with that map, and measure what came out (np.cov, principal angles
from scipy), or use data built with an exactly known covariance so each part has a closed form.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from conftest import anisotropic
from scipy.linalg import subspace_angles

from streamwhiten.core import stats
from streamwhiten.core.model import finalize
from streamwhiten.core.staleness import COUNTED, PARTS, Staleness, staleness
from streamwhiten.errors import BadInputError
from streamwhiten.params import DEFAULT_MAX_STALENESS, PARAMS

SETTINGS = [(1.0, 1.0, None), (1.0, 1.0, 4), (0.5, 0.5, 6), (0.0, 0.0, 3), (1.0, 0.25, 8), (0.3, 1.0, 5)]


def second_moment(rows: np.ndarray, centre: np.ndarray) -> np.ndarray:
    centred = rows - centre
    return centred.T @ centred / len(rows)


def reference_map(published: np.ndarray, beta: float, gamma: float, eps: float, k: int):
    """``(U_k, lambda_k, eps_, W)`` of the published rows, by numpy alone."""
    sigma = second_moment(published, beta * published.mean(axis=0))
    eigvals, eigvecs = np.linalg.eigh(sigma)
    eigvals, eigvecs = np.maximum(eigvals[::-1], 0.0), eigvecs[:, ::-1]
    eps_value = eps * eigvals[0]
    basis, lam = eigvecs[:, :k], eigvals[:k]
    return basis, lam, eps_value, basis * (lam + eps_value) ** (-gamma / 2)


def exact_rows(n_rows: int, variances, mean=None, seed: int = 0) -> np.ndarray:
    """Rows whose mean and (population) covariance are exactly ``mean`` and ``diag(variances)``."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n_rows, len(variances)))
    z -= z.mean(axis=0)
    z = z @ np.linalg.inv(np.linalg.cholesky(z.T @ z / n_rows)).T
    return z * np.sqrt(np.asarray(variances, dtype=float)) + (0.0 if mean is None else np.asarray(mean))


def drifted_pair(seed: int = 3, d: int = 8):
    """Published rows and current rows (the published ones plus new rows of another mean and shape)."""
    published = anisotropic(1500, d, seed=seed)
    rng = np.random.default_rng(seed + 1)
    mix = np.eye(d) + 0.3 * rng.standard_normal((d, d)) / np.sqrt(d)
    new = (anisotropic(700, d, seed=seed + 2) - 3.0) @ mix + 3.0 + 0.2 * rng.standard_normal(d)
    return published, np.vstack([published, new])


# ----------------------------------------------------------------------------- nothing changed: zero


@pytest.mark.parametrize("beta, gamma, k", SETTINGS)
def test_unchanged_and_doubled_statistics_are_exactly_fresh(beta, gamma, k):
    state = stats.block_moments(anisotropic(800, 8, seed=1))
    model = finalize(state, beta=beta, gamma=gamma, n_components=k)
    for current in (state, stats.merge(state, state)):  # the same rows appended again: same moments
        result = staleness(model, current)
        assert (result.covariance, result.shift, result.dropped, result.total) == (0.0,) * 4
        assert result.angle < 1e-12  # the orthogonality of the same eigenvectors, to rounding
        assert not result.exceeds(0.0)


@pytest.mark.parametrize("beta, gamma, k", SETTINGS)
def test_rows_of_the_same_moments_give_zero_to_rounding(beta, gamma, k):
    rows = anisotropic(900, 8, seed=2)
    model = finalize(stats.block_moments(rows), beta=beta, gamma=gamma, n_components=k)
    mirrored = 2 * rows.mean(axis=0) - rows  # other rows, the same mean and covariance
    reordered = stats.merge(stats.block_moments(rows[::-1][:333]), stats.block_moments(rows[::-1][333:]))
    for current in (
        stats.merge(model.state, stats.block_moments(mirrored)),
        stats.block_moments(np.vstack([mirrored, rows])),  # ... reduced as one block
        reordered,
    ):
        result = staleness(model, current)
        assert result.total < 1e-9 and result.dropped < 1e-9, result
        assert result.angle < 1e-6  # the spectrum has no ties: the eigenspaces are well defined


# ------------------------------------------------------------------------ each part against numpy


@pytest.mark.parametrize("beta, gamma, k", SETTINGS)
def test_covariance_part_is_the_whitened_covariance_against_its_target(beta, gamma, k):
    """Whiten the current rows with the published map (centred as a refit centres them), measure the
    outputs' second moment, and compare it with ``T = diag(lambda / (lambda + eps_)^gamma)`` in the
    target's metric ``T' = diag((lambda + eps_)^(1 - gamma))``: the spectral norm of the difference."""
    published, current = drifted_pair()
    eps = 1e-3
    model = finalize(stats.block_moments(published), beta=beta, gamma=gamma, eps=eps, n_components=k)
    basis, lam, eps_value, weights = reference_map(published, beta, gamma, eps, model.n_components)
    outputs = (current - beta * current.mean(axis=0)) @ weights
    produced = outputs.T @ outputs / len(outputs)
    if beta == 1.0:  # centred on the current mean: the covariance itself
        np.testing.assert_allclose(produced, np.cov(outputs, rowvar=False, bias=True), rtol=1e-9, atol=1e-12)
    target = np.diag(lam / (lam + eps_value) ** gamma)
    metric = (lam + eps_value) ** ((1 - gamma) / 2)
    expected = np.linalg.norm((produced - target) / np.outer(metric, metric), ord=2)
    result = staleness(model, stats.block_moments(current))
    assert result.covariance == pytest.approx(expected, rel=1e-8)
    assert result.covariance > 0.05  # the drift is visible


@pytest.mark.parametrize("beta, gamma, k", SETTINGS)
def test_shift_part_is_the_refits_move_of_the_centre_in_output_standard_deviations(beta, gamma, k):
    published, current = drifted_pair(seed=5)
    model = finalize(stats.block_moments(published), beta=beta, gamma=gamma, n_components=k)
    _, lam, eps_value, weights = reference_map(published, beta, gamma, model.eps, model.n_components)
    by_published = (current - beta * published.mean(axis=0)) @ weights
    by_refit_centre = (current - beta * current.mean(axis=0)) @ weights
    move = (by_published - by_refit_centre).mean(axis=0)
    # in the target's metric: the published outputs' intended deviations, regularised (lambda -> lambda + eps_)
    output_std = (lam + eps_value) ** ((1 - gamma) / 2)
    expected = np.linalg.norm(move / output_std)
    result = staleness(model, stats.block_moments(current))
    assert result.shift == pytest.approx(expected, rel=1e-6)
    assert (result.shift == 0.0) if beta == 0.0 else (result.shift > 0.01)


@pytest.mark.parametrize("beta, k", [(1.0, 2), (1.0, 5), (0.5, 7), (0.0, 1)])
def test_angle_is_the_largest_principal_angle_between_the_eigenspaces(beta, k):
    published, current = drifted_pair(seed=7)
    model = finalize(stats.block_moments(published), beta=beta, gamma=beta, n_components=k)
    published_basis = reference_map(published, beta, beta, model.eps, k)[0]
    current_basis = reference_map(current, beta, beta, model.eps, k)[0]
    expected = float(np.max(subspace_angles(published_basis, current_basis)))
    assert staleness(model, stats.block_moments(current)).angle == pytest.approx(expected, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("beta, k", [(1.0, 2), (1.0, 5), (0.5, 3)])
def test_dropped_part_against_projectors(beta, k):
    """The most variance along a direction outside the kept subspace against the least inside it,
    from the eigenvalues of the current second moment squeezed onto each subspace by projectors."""
    published, current = drifted_pair(seed=11)
    model = finalize(stats.block_moments(published), beta=beta, gamma=1.0, n_components=k)
    basis, _, _, _ = reference_map(published, beta, 1.0, model.eps, k)
    sigma = second_moment(current, beta * current.mean(axis=0))
    inside = basis @ basis.T
    outside = np.eye(len(sigma)) - inside
    least_kept = np.sort(np.linalg.eigvalsh(inside @ sigma @ inside))[-k:].min()
    most_dropped = np.linalg.eigvalsh(outside @ sigma @ outside).max()
    expected = max(0.0, most_dropped - least_kept) / (least_kept + model.eps_value)
    assert staleness(model, stats.block_moments(current)).dropped == pytest.approx(expected, rel=1e-8, abs=1e-12)


def test_each_part_by_hand_on_data_of_known_covariance():
    """Axis-aligned data of exactly known moments: every part has a closed form."""
    variances = np.array([25.0, 16.0, 9.0, 4.0, 1.0])
    mean = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    published = stats.block_moments(exact_rows(5000, variances, mean))
    eps = 1e-9
    model = finalize(published, eps=eps, n_components=2)  # keeps e1 (25) and e2 (16)
    regulariser = eps * 25.0

    # e2's variance grows by 21 % and the mean moves 0.4 standard deviations along it
    moved = mean + np.array([0.0, 0.4 * 4.0, 0.0, 0.0, 0.0])
    now = staleness(model, stats.block_moments(exact_rows(5000, [25.0, 16.0 * 1.21, 9.0, 4.0, 1.0], moved, 1)))
    assert now.covariance == pytest.approx(16.0 * 0.21 / (16.0 + regulariser), rel=1e-9)
    assert now.shift == pytest.approx(1.6 / math.sqrt(16.0 + regulariser), rel=1e-9)
    assert now.dropped == 0.0 and now.angle < 1e-9
    assert now.total == now.shift  # the largest counted part

    # e3, which the map drops, rises from 9 to 20, above e2 (16): a refit swaps it in
    now = staleness(model, stats.block_moments(exact_rows(5000, [25.0, 16.0, 20.0, 4.0, 1.0], mean, 2)))
    assert now.dropped == pytest.approx((20.0 - 16.0) / (16.0 + regulariser), rel=1e-9)
    assert now.angle == pytest.approx(math.pi / 2, abs=1e-9)
    assert now.covariance < 1e-12 and now.shift < 1e-12
    assert now.total == now.dropped


# ----------------------------------------------------------------------------------- monotone drift


@pytest.mark.parametrize("beta, gamma, k", [(1.0, 1.0, None), (0.5, 0.5, 4), (1.0, 1.0, 2)])
def test_staleness_grows_with_the_size_of_a_drift(beta, gamma, k):
    """New rows that move further and stretch more each night: every counted part and the total grow."""
    rows = anisotropic(6000, 6, seed=4)  # published: the first 4000; new rows of the same kind: the rest
    model = finalize(stats.block_moments(rows[:4000]), beta=beta, gamma=gamma, n_components=k)
    rng = np.random.default_rng(9)
    direction = rng.standard_normal(6)
    stretch = np.linalg.qr(rng.standard_normal((6, 6)))[0][:, 0]
    new = rows[4000:]
    results = []
    for size in (0.0, 0.1, 0.2, 0.4, 0.8, 1.6):
        centred = new - new.mean(axis=0)
        drifted = new + size * np.outer(centred @ stretch, stretch) + size * direction
        results.append(staleness(model, stats.merge(model.state, stats.block_moments(drifted))))
    totals = [r.total for r in results]
    assert all(a < b for a, b in zip(totals, totals[1:], strict=False)), totals
    for part in ("covariance", "shift") if beta else ("covariance",):
        values = [getattr(r, part) for r in results]
        assert all(a < b for a, b in zip(values[1:], values[2:], strict=False)), (part, values)
    assert totals[-1] > 0.5 > totals[0]


# ----------------------------------------------------------------------------------------- edge cases


def test_k_equal_to_d_has_no_angle_and_drops_nothing():
    published, current = drifted_pair(seed=13)
    result = staleness(finalize(stats.block_moments(published)), stats.block_moments(current))
    assert result.n_components == 8 and result.angle == 0.0 and result.dropped == 0.0
    assert result.total == max(result.covariance, result.shift) > 0


def test_gamma_zero_measures_in_the_same_whitened_units():
    """The parts are gamma-free (the metric of the target cancels gamma): a rotation (gamma = 0) and a
    full whitening of the same statistics read the same."""
    published, current = drifted_pair(seed=17)
    state, now = stats.block_moments(published), stats.block_moments(current)
    rotation = staleness(finalize(state, gamma=0.0, n_components=5), now)
    whitening = staleness(finalize(state, gamma=1.0, n_components=5), now)
    for part in PARTS:
        assert getattr(rotation, part) == pytest.approx(getattr(whitening, part), rel=1e-12)
    assert all(math.isfinite(getattr(rotation, part)) for part in PARTS)


def test_beta_zero_sees_a_moved_mean_in_the_second_moment_not_as_a_shift():
    rows = anisotropic(2000, 6, seed=6)
    moved = rows + 0.5 * rows.std(axis=0)
    state = stats.block_moments(rows)
    grown = stats.merge(state, stats.block_moments(moved))
    uncentred = staleness(finalize(state, beta=0.0, gamma=1.0), grown)
    assert uncentred.shift == 0.0 and uncentred.covariance > 0.01
    centred = staleness(finalize(state, beta=1.0, gamma=1.0), grown)
    assert centred.shift > 0.1


@pytest.mark.parametrize("eps", [1e-6, 1e-300])
@pytest.mark.parametrize("k", [None, 5, 3])
def test_rank_deficient_statistics_stay_finite(eps, k):
    """A duplicated and a constant column (rank 4 of 6): unchanged moments read as fresh, also with a
    tiny eps (the regulariser never falls below the float64 rounding of the covariance), and new
    variance in a direction the data never had is very stale when the map keeps (and amplifies) it."""
    base = anisotropic(1200, 4, seed=8)
    rows = np.column_stack([base, base[:, 0], np.full(len(base), 7.0)])
    state = stats.block_moments(rows)
    model = finalize(state, eps=eps, n_components=k)
    mirrored = 2 * rows.mean(axis=0) - rows
    same = staleness(model, stats.block_moments(np.vstack([mirrored, rows])))
    assert all(math.isfinite(v) for v in same.to_json().values())
    assert same.total < 1e-6, same
    noisy = rows + np.column_stack(
        [np.zeros((len(rows), 4)), 0.1 * np.random.default_rng(0).standard_normal(len(rows)), np.zeros(len(rows))]
    )
    new = staleness(model, stats.merge(state, stats.block_moments(noisy)))
    assert all(math.isfinite(v) for v in new.to_json().values())
    if k is None:  # the map keeps the null directions, scaled by eps_^(-1/2)
        assert new.covariance > 100


# --------------------------------------------------------------------------- errors and the record


def test_statistics_of_another_width_or_too_few_rows_are_refused():
    model = finalize(stats.block_moments(anisotropic(100, 4)))
    with pytest.raises(BadInputError, match="the statistics have 5 features, the published model 4"):
        staleness(model, stats.block_moments(anisotropic(100, 5)))
    with pytest.raises(BadInputError, match="at least 2 rows"):
        staleness(model, stats.block_moments(anisotropic(1, 4)))


def test_the_result_is_a_frozen_record_with_a_plain_dict():
    published, current = drifted_pair()
    result = staleness(finalize(stats.block_moments(published), n_components=3), stats.block_moments(current))
    assert isinstance(result, Staleness)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.total = 0.0
    record = json.loads(json.dumps(result.to_json()))
    assert set(record) == {*PARTS, "total", "n_components", "n_rows_published", "n_rows"}
    assert record["n_rows_published"] == 1500 and record["n_rows"] == 2200 and record["n_components"] == 3
    assert record["total"] == max(record[part] for part in COUNTED)
    assert result.exceeds(result.total / 2) and not result.exceeds(result.total)
    assert result.exceeds() == (result.total > DEFAULT_MAX_STALENESS)
    with pytest.raises(BadInputError, match="max_staleness must be a number, 0 or more, got -1"):
        result.exceeds(-1)
    assert not result.exceeds(math.inf)  # inf: never stale (issue #36)


def test_publishing_parameters_are_declared_once():
    assert PARAMS["max_staleness"].default == DEFAULT_MAX_STALENESS
    assert PARAMS["keep_versions"].default == 2
    for name, bad in (
        ("max_staleness", -0.5),
        ("max_staleness", -math.inf),
        ("max_staleness", math.nan),
        ("keep_versions", 0),
        ("keep_versions", 1.5),
    ):
        with pytest.raises(BadInputError, match=f"^{name} must be"):
            PARAMS[name].check(bad)
    assert PARAMS["max_staleness"].check(0.0) == 0.0 and PARAMS["keep_versions"].check(1) == 1
    assert PARAMS["max_staleness"].check(math.inf) == math.inf  # the natural "never republish by staleness"


def test_max_staleness_inf_is_taken_by_a_job_file_and_the_staleness_command(tmp_path):
    """``max_staleness = inf`` in ``[publish]`` and ``staleness --max-staleness inf``: never stale (issue #36:
    both were refused)."""
    from conftest import run_command

    from streamwhiten.core.model import save_model
    from streamwhiten.job.file import read_job_file

    job = tmp_path / "job.toml"
    job.write_text(
        '[input]\npaths = ["x.h5"]\n[model]\npath = "m.npz"\n[apply]\noutput = "o/{stem}.zarr"\n'
        "[publish]\nmax_staleness = inf\n"
    )
    assert read_job_file(str(job)).publish.max_staleness == math.inf
    published, current = drifted_pair()
    save_model(finalize(stats.block_moments(published), n_components=3), str(tmp_path / "published.npz"))
    save_model(finalize(stats.block_moments(current), n_components=3), str(tmp_path / "now.npz"))
    args = ("staleness", tmp_path / "now.npz", "--published", tmp_path / "published.npz", "--json")
    strict = json.loads(run_command(*args, "--max-staleness", "0").stdout)
    never = run_command(*args, "--max-staleness", "inf")
    assert never.returncode == 0, never.stderr
    report = json.loads(never.stdout)
    assert strict["stale"] and strict["total"] > 0 and not report["stale"] and report["max_staleness"] is None


@pytest.mark.parametrize("beta, gamma, k", SETTINGS)
def test_a_model_of_the_current_statistics_gives_the_same_values_as_its_statistics(beta, gamma, k):
    # what a nightly run passes: the updated model (any gamma, eps and k; its eigenvectors are the refit's
    # when its beta is the published one), instead of its statistics: the same values, to the bit
    published, current = drifted_pair()
    model = finalize(stats.block_moments(published), beta=beta, gamma=gamma, n_components=k)
    state = stats.block_moments(current)
    expected = staleness(model, state).to_json()
    assert staleness(model, finalize(state, beta=beta, gamma=0.5, eps=1e-3, n_components=2)).to_json() == expected
    # another beta's eigenvectors are not the refit's: they are not taken
    other = finalize(state, beta=1.0 - beta if beta != 0.5 else 0.0, gamma=gamma)
    assert staleness(model, other).to_json() == expected
    if model.n_components < model.n_features:
        assert expected["angle"] > 0.01  # the eigenvectors matter here: a test that can fail
