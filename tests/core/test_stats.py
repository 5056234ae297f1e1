"""Streaming moments against numpy float64 two-pass statistics; merge exactness and order independence."""

import numpy as np
import pytest
from conftest import anisotropic
from hypothesis import given, settings
from hypothesis import strategies as st

from streamwhiten.core import stats
from streamwhiten.errors import BadInputError, NonFiniteError


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def fold(rows, chunk_rows, precision="auto"):
    state = stats.Moments.empty(rows.shape[1])
    for start in range(0, rows.shape[0], chunk_rows):
        state = stats.update(state, rows[start : start + chunk_rows], precision)
    return state


@pytest.mark.parametrize("offset", [0.0, 3.0, 1e4])
def test_float64_matches_two_pass_reference(offset):
    rows = anisotropic(3000, 20, seed=2, offset=0.0) + offset  # mean up to 1e4 x the spread
    state = fold(rows, 257)
    assert state.n_rows == 3000
    assert rel(state.mean, rows.mean(0)) <= 1e-12
    assert rel(stats.covariance(state, 1.0), np.cov(rows, rowvar=False, bias=True)) <= 1e-10


def test_float32_matches_float64_reference():
    rows = anisotropic(20000, 24, seed=3).astype(np.float32)
    exact = rows.astype(np.float64)
    state = fold(rows, 4096)
    assert rel(stats.covariance(state), np.cov(exact, rowvar=False, bias=True)) <= 1e-6
    state64 = fold(rows, 4096, precision="float64")
    assert rel(stats.covariance(state64), np.cov(exact, rowvar=False, bias=True)) <= 1e-12


def test_float16_input_is_accepted():
    rows = anisotropic(500, 8, seed=4).astype(np.float16)
    state = fold(rows, 100)
    exact = rows.astype(np.float64)
    assert rel(stats.covariance(state), np.cov(exact, rowvar=False, bias=True)) <= 1e-6


def test_never_uses_raw_second_moment():
    # E[xx^T] - mu mu^T in float64 loses everything here (variance 1e-6 under a mean of 1e6).
    rng = np.random.default_rng(5)
    rows = 1e6 + 1e-3 * rng.standard_normal((4000, 3))
    state = fold(rows, 999)
    assert rel(stats.covariance(state), np.cov(rows, rowvar=False, bias=True)) <= 1e-8


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
def test_covariance_beta_closed_form(beta):
    rows = anisotropic(400, 6, seed=6)
    centred = rows - beta * rows.mean(0)
    direct = centred.T @ centred / rows.shape[0]
    assert rel(stats.covariance(fold(rows, 64), beta), direct) <= 1e-12


def test_single_row_and_tail_chunks():
    rows = anisotropic(37, 5, seed=7)
    for chunk_rows in (1, 2, 36, 37, 100):
        state = fold(rows, chunk_rows)
        assert rel(stats.covariance(state), np.cov(rows, rowvar=False, bias=True)) <= 1e-12


def test_merge_with_empty_is_identity_and_checks_width():
    state = fold(anisotropic(50, 4, seed=8), 10)
    assert stats.merge(state, stats.Moments.empty(4)) == state
    assert stats.merge(stats.Moments.empty(4), state) == state
    with pytest.raises(BadInputError, match="width 4 and 5"):
        stats.merge(state, stats.Moments.empty(5))


def test_nonfinite_row_is_named():
    rows = anisotropic(30, 4, seed=9)
    rows[17, 2] = np.nan
    with pytest.raises(NonFiniteError) as info:
        stats.block_moments(rows)
    assert info.value.row == 17
    kept, dropped = stats.drop_nonfinite(rows)
    assert dropped == 1 and kept.shape == (29, 4)


def test_bad_shapes_and_dtypes():
    with pytest.raises(BadInputError, match="2-D"):
        stats.block_moments(np.zeros(5))
    with pytest.raises(BadInputError, match="floating-point"):
        stats.block_moments(np.zeros((5, 2), dtype=np.int32))
    with pytest.raises(BadInputError, match="precision"):
        stats.working_dtype(np.float32, "float16")


@settings(max_examples=40, deadline=None)
@given(
    n_rows=st.integers(2, 120),
    n_features=st.integers(1, 6),
    cuts=st.lists(st.floats(0, 1), max_size=8),
    order_seed=st.integers(0, 2**32 - 1),
    seed=st.integers(0, 1000),
)
def test_any_chunking_in_any_order_gives_the_same_state(n_rows, n_features, cuts, order_seed, seed):
    rows = anisotropic(n_rows, n_features, seed=seed, offset=50.0)
    bounds = sorted({0, n_rows, *(int(c * n_rows) for c in cuts)})
    pieces = [stats.block_moments(rows[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=False)]
    np.random.default_rng(order_seed).shuffle(pieces)
    # merge in the shuffled order, and also as a tree, like a distributed reduction would
    serial = stats.Moments.empty(n_features)
    for piece in pieces:
        serial = stats.merge(serial, piece)
    tree = list(pieces)
    while len(tree) > 1:
        tree = [stats.merge(*tree[i : i + 2]) if i + 1 < len(tree) else tree[i] for i in range(0, len(tree), 2)]
    reference = np.cov(rows, rowvar=False, bias=True).reshape(n_features, n_features)
    for state in (serial, tree[0]):
        assert state.n_rows == n_rows
        np.testing.assert_allclose(state.mean, rows.mean(0), rtol=1e-12, atol=1e-12 * 50)
        np.testing.assert_allclose(stats.covariance(state), reference, rtol=1e-9, atol=1e-11 * np.abs(reference).max())


def test_overflow_is_reported_as_such_not_as_nan():
    huge = np.array([[3e38], [-3e38], [-3e38], [3e38]], dtype=np.float32)
    with pytest.raises(BadInputError, match="too large") as info:
        stats.block_moments(huge)
    assert not isinstance(info.value, NonFiniteError) and "precision='float64'" in str(info.value)
    assert info.value.param == "precision"  # the CLI says --precision float64 (tests/test_cli_flags.py)
    rows = np.array([[1.5e308, 0.0], [-1.5e308, 1.0], [1.5e308, 2.0]])
    with pytest.raises(BadInputError, match="too large"):
        stats.block_moments(rows)
