"""The one float32 product (``core.product``): each value the float32 nearest the exact dot product,
checked against exact rational arithmetic (``fractions``), whatever the batch."""

from fractions import Fraction

import numpy as np
import pytest

from streamwhiten.core.product import CHUNK_ROWS, ProductWeights, exactly_rounded, half_spacing, rounded_product


def nearest_float32(exact: Fraction) -> np.float32:
    """The float32 nearest ``exact`` (ties to the even significand), by exact comparison with its neighbours."""
    guess = np.float32(float(exact))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    return min(candidates, key=lambda v: (abs(Fraction(float(v)) - exact), int(np.array(v).view(np.uint32)) & 1))


def exact_dot(row: np.ndarray, column: np.ndarray) -> Fraction:
    return sum((Fraction(float(a)) * Fraction(float(b)) for a, b in zip(row, column, strict=True)), Fraction(0))


def test_half_spacing_is_at_most_half_the_nearer_gap_and_at_least_a_quarter():
    values = np.random.default_rng(0).standard_normal(5000).astype(np.float32) * np.float32(1e3)
    special = [0.0, 1.0, -2.0, 0.5, 1e-40, -1e-45, 1.1754944e-38, 3.4028235e38, -3.4028235e38]
    values = np.concatenate([values, np.float32(special)])
    with np.errstate(over="ignore"):  # the neighbours of float32's largest values are Inf
        up = np.abs(np.nextafter(values, np.float32(np.inf)).astype(np.float64) - values)
        down = np.abs(values.astype(np.float64) - np.nextafter(values, np.float32(-np.inf)))
    gap = np.minimum(up, down)
    got = half_spacing(values)
    assert np.all(got <= gap / 2) and np.all(got >= gap / 4)


def test_sums_on_a_float32_midpoint_round_by_the_exact_remainder_one_by_one_and_in_bulk():
    rng = np.random.default_rng(1)
    rows = []
    for i in range(60):  # a float32 midpoint plus terms far below float64's precision of it
        v = np.float32(rng.standard_normal())
        mid = (float(v) + float(np.nextafter(v, np.float32(np.inf)))) / 2
        tiny = [1e-30 * (i % 3 - 1), -1e-30 * (i % 3 - 1) * (i % 2), 2.0**-80 * (i % 5 - 2)]
        rows.append([mid, *tiny, 0.0])
    products = np.array(rows)
    want = np.array([nearest_float32(sum(map(Fraction, row), Fraction(0))) for row in products], dtype=np.float32)
    in_bulk = exactly_rounded(products)  # Sum2 first, then the exact sum where still undecided
    one_by_one = np.concatenate([exactly_rounded(products[i : i + 1]) for i in range(len(products))])
    assert np.array_equal(in_bulk.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(one_by_one.view(np.uint32), want.view(np.uint32))
    # both directions and true ties occur: the float64 sum alone would round some of them the wrong way
    assert np.count_nonzero(np.float32(products.sum(axis=1)) != want) > 0


@pytest.mark.parametrize("d,k", [(384, 384), (37, 11)])
def test_every_value_is_the_float32_nearest_the_exact_dot_product_in_any_batch(d, k):
    rng = np.random.default_rng(d)
    # whitening-like: a wide spread of column scales and much cancellation in each sum
    weights = (rng.standard_normal((d, k)) * np.logspace(0, 3, k)).astype(np.float32)
    centred = (rng.standard_normal((CHUNK_ROWS + 300, d)) * 0.1).astype(np.float32)
    centred[5] = 0
    whole = rounded_product(centred, weights)
    prepared = ProductWeights.of(weights)
    alone = np.concatenate([rounded_product(centred[i : i + 1], prepared) for i in range(0, len(centred), 97)])
    assert np.array_equal(alone.view(np.uint32), whole[::97].view(np.uint32))
    odd = np.concatenate([rounded_product(centred[i : i + 333], prepared) for i in range(0, len(centred), 333)])
    assert np.array_equal(odd.view(np.uint32), whole.view(np.uint32))
    picks = rng.integers(0, len(centred), 60), rng.integers(0, k, 60)
    for i, j in zip(*picks, strict=True):
        assert whole[i, j] == nearest_float32(exact_dot(centred[i], weights[:, j])), (i, j)
    assert not whole[5].any()
    # BLAS's own float32 product differs from it in many last bits: this is what the kernel removes
    assert np.count_nonzero((centred @ weights) != whole) > 0


def test_values_beyond_float32_are_inf_and_nan_rows_stay_nan():
    weights = np.eye(3, dtype=np.float32) * np.float32(3e38)
    centred = np.array([[2.0, 0.0, 0.0], [np.nan, 1.0, 0.0], [1e-3, 0, 0]], dtype=np.float32)
    out = rounded_product(centred, weights)
    assert (
        out[0, 0] == np.inf
        and np.isnan(out[1, 0])
        and out[2, 0] == np.float32(float(np.float32(1e-3)) * float(np.float32(3e38)))
    )


def test_rows_of_another_dtype_or_width_are_refused():
    with pytest.raises(ValueError, match="float32 rows of 3"):
        rounded_product(np.ones((2, 3)), np.ones((3, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="float32 rows of 3"):
        rounded_product(np.ones((2, 4), dtype=np.float32), np.ones((3, 2), dtype=np.float32))


def test_the_numba_screen_rounds_and_marks_exactly_as_the_numpy_one():
    from streamwhiten.core.kernels.product import round_and_screen
    from streamwhiten.core.product import numpy_screen

    rng = np.random.default_rng(5)
    near = rng.standard_normal((300, 40)) * np.logspace(-30, 30, 40)
    near[0, :4] = [0.0, np.inf, np.nan, 1e39]
    near[1] = np.float32(near[1]).astype(np.float64) + np.spacing(np.float32(near[1])) / 2  # on midpoints
    norms, bound = np.abs(rng.standard_normal(300)) * 1e3, np.abs(rng.standard_normal(40)) * 1e-13
    outs, marks = [np.empty(near.shape, np.float32) for _ in range(2)], [np.empty(near.shape, bool) for _ in range(2)]
    with np.errstate(over="ignore", invalid="ignore"):
        screens = (numpy_screen, round_and_screen)
        counts = [f(near, norms, bound, o, m) for f, o, m in zip(screens, outs, marks, strict=True)]
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))
    finite = np.isfinite(outs[0])
    assert np.array_equal(marks[0] & finite, marks[1] & finite) and marks[1][1].all()
    assert counts[1] == np.count_nonzero(marks[1]) and counts[1] > 0
