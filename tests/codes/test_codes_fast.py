"""The Numba paths of the tool's own codes (codes.fast, core.kernels.codes): the fused quantise-and-pack
encoder and the blocked table scan, each against a plain numpy reference, at the shapes where blocked
loops go wrong: one row, row counts that are not a multiple of the blocks, an odd number of queries,
codes longer than one pass of tables and not a multiple of it."""

from __future__ import annotations

import numpy as np
import pytest

from streamwhiten.codes import train_codec
from streamwhiten.codes.fast import encode, search
from streamwhiten.codes.linear import LinearCode
from streamwhiten.core.kernels.codes import _LOOKUP_BYTES, lookup_scores
from streamwhiten.errors import NonFiniteError

D = 64


@pytest.fixture(scope="module")
def data():
    """Anisotropic, off-centre rows, their exact moments and a few queries."""
    rng = np.random.default_rng(11)
    basis, _ = np.linalg.qr(rng.standard_normal((D, D)))
    rows = (rng.standard_normal((2500, D)) * np.geomspace(4.0, 0.05, D)) @ basis.T + rng.standard_normal(D)
    rows = rows.astype(np.float32)
    wide = rows.astype(np.float64)
    mean = wide.mean(axis=0)
    covariance = (wide - mean).T @ (wide - mean) / len(wide)
    queries = (rng.standard_normal((5, D)) * 2).astype(np.float32)
    return rows, mean, covariance, queries


def numpy_encode(codec: LinearCode, rows: np.ndarray) -> np.ndarray:
    """The documented code in numpy alone: float32 components, the floor quantiser in float64, each
    level's bits laid out least significant first in one stream packed by ``np.packbits``."""
    z = np.empty((len(rows), codec.n_components), dtype=np.float32)
    for r0 in range(0, len(rows), codec.block_rows):
        z[r0 : r0 + codec.block_rows] = rows[r0 : r0 + codec.block_rows].astype(np.float32) @ codec.basis
    z -= (codec.mean @ codec.basis.astype(np.float64)).astype(np.float32)
    half = 2.0 ** (codec.bits - 1)
    index = np.clip(np.floor(z.astype(np.float64) / codec.step + half), 0, 2.0**codec.bits - 1).astype(np.int64)
    stream = np.concatenate([(index[:, [j]] >> np.arange(b)) & 1 for j, b in enumerate(codec.bits)], axis=1)
    return np.packbits(stream.astype(np.uint8), axis=1, bitorder="little")


# eigen budgets give levels of 1 to 8 bits that straddle bytes; 37 bytes span two passes of tables and a tail
CASES = [("eigen", 5), ("eigen", 37), ("eigen+f", 21), ("bits-random", 8), ("bits-random+f", 3)]


@pytest.mark.parametrize(("name", "budget"), CASES)
@pytest.mark.parametrize("n_rows", [1, 3, 2500])
def test_fast_encode_is_the_numpy_code(data, name, budget, n_rows):
    rows, mean, covariance, _ = data
    codec = train_codec(name, mean, covariance, budget)
    assert isinstance(codec, LinearCode)
    some = rows[:n_rows]
    codes = encode(codec, some)
    assert codes.shape == (n_rows, codec.bytes_per_vector) and codes.dtype == np.uint8
    np.testing.assert_array_equal(codes[:, : codec.code_bytes], numpy_encode(codec, some))
    np.testing.assert_array_equal(codes, codec.encode(some))
    if name == "eigen" and budget == 37:
        assert codec.block_rows < 2500 and len(set(codec.bits.tolist())) > 3  # several blocks, many widths


def test_fast_encode_names_the_first_nonfinite_row_of_any_block(data):
    rows, mean, covariance, _ = data
    codec = train_codec("eigen", mean, covariance, 37)
    bad = rows.copy()
    bad[codec.block_rows + 7, 3] = np.inf
    bad[codec.block_rows + 9, 1] = np.nan
    with pytest.raises(NonFiniteError, match=rf"row {codec.block_rows + 7} holds NaN or Inf") as caught:
        encode(codec, bad)
    assert caught.value.row == codec.block_rows + 7


def test_encode_levels_floors_the_quotient_where_a_product_would_not():
    """The kernel multiplies by ``1 / step``; on a component that is an exact multiple of the step
    (``z / step + 2^(b-1)`` an integer) the product can fall one unit short and floor a level too low.
    Each row holds one such component, the others off the boundaries: the row must get the division's
    levels, as ``LinearCode.quantize`` gives them (a margin too small to catch the one component fails)."""
    rng = np.random.default_rng(5)
    n_components, n_rows = 24, 2000
    bits = rng.integers(3, 9, n_components)  # at 1 and 2 bits the product seldom errs inside the levels
    half = 2.0 ** (bits - 1)
    # steps of 12 significant bits: k * step is exact in float32 for |k| < 2^11, so z / step is exactly k
    mantissas = rng.integers(2**11, 2**12, size=(n_components, 1024))
    candidates = np.ldexp(mantissas.astype(np.float64), rng.integers(-20, -8, size=(n_components, 1)))
    k = np.arange(-128, 128, dtype=np.float64)
    inside = (k[None, :] > -half[:, None]) & (k[None, :] < half[:, None])  # levels that do not clip
    product = np.floor((k * candidates[..., None]) * (1.0 / candidates[..., None]) + half[:, None, None])
    wrong = (product != np.floor(k + half[:, None])[:, None, :]) & inside[:, None, :]
    pick = np.argmax(wrong.any(axis=2), axis=1)  # per component a step where the two disagree
    step = candidates[np.arange(n_components), pick]
    assert wrong[np.arange(n_components), pick].any(axis=1).all()
    off = rng.integers(-128, 128, size=(n_rows, n_components)) % (2 * half) - half + rng.uniform(0.1, 0.9, (n_rows, 1))
    z = (off * step).astype(np.float32)
    planted = np.arange(n_rows) % n_components
    levels = wrong[planted, pick[planted]]
    on = np.array([rng.choice(np.flatnonzero(row)) for row in levels]) - 128.0
    z[np.arange(n_rows), planted] = (on * step[planted]).astype(np.float32)
    wide = z.astype(np.float64)
    top = 2.0**bits - 1
    by_product = np.clip(np.floor(wide * (1.0 / step) + half), 0, top)
    by_quotient = np.clip(np.floor(wide / step + half), 0, top)
    assert (by_product != by_quotient).sum(axis=1).max() == 1  # one component a row: the others do not help
    assert (by_product != by_quotient).any(axis=1).mean() > 0.5

    codec = LinearCode(
        "eigen",
        np.zeros(n_components),
        np.eye(n_components),
        bits,
        step,
        correction=False,
        budget=int(bits.sum() + 7) // 8,
    )
    expected = codec.encode(z)
    index = by_quotient.astype(np.int64)
    stream = np.concatenate([(index[:, [j]] >> np.arange(b)) & 1 for j, b in enumerate(bits)], axis=1)
    np.testing.assert_array_equal(expected, np.packbits(stream.astype(np.uint8), axis=1, bitorder="little"))
    np.testing.assert_array_equal(encode(codec, z), expected)


@pytest.mark.parametrize("n_queries", [1, 2, 3])
@pytest.mark.parametrize("n_rows", [1, 2, 3, 4, 5, 11])
@pytest.mark.parametrize("n_bytes", [1, _LOOKUP_BYTES, _LOOKUP_BYTES + 1, 2 * _LOOKUP_BYTES + 7])
def test_lookup_scores_is_the_sum_of_table_entries(n_queries, n_rows, n_bytes):
    rng = np.random.default_rng(n_queries * 100 + n_rows * 10 + n_bytes)
    tables = rng.standard_normal((n_queries, n_bytes, 256)).astype(np.float32)
    codes = rng.integers(0, 256, size=(n_rows, n_bytes + 2), dtype=np.uint8)  # bytes past the tables are not read
    scales = rng.uniform(0.5, 2, n_rows).astype(np.float32)
    row_scales = rng.uniform(0.5, 2, n_rows).astype(np.float32)
    bases = rng.standard_normal(n_queries).astype(np.float32)
    offsets = rng.standard_normal(n_queries).astype(np.float32)
    out = np.full((n_queries, n_rows), np.nan, dtype=np.float32)
    lookup_scores(tables, codes, scales, row_scales, bases, offsets, out)
    picked = tables.astype(np.float64)[:, np.arange(n_bytes)[None, :], codes[:, :n_bytes]]  # queries x rows x bytes
    expected = (bases[:, None] + scales[None, :] * (offsets[:, None] + picked.sum(axis=2))) * row_scales[None, :]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("name", "budget"), CASES)
@pytest.mark.parametrize("n_rows", [1, 7, 2500])
@pytest.mark.parametrize("unit", [False, True])
def test_search_scores_are_the_numpy_estimates(data, name, budget, n_rows, unit):
    """Every row found (all of them: k = rows) scores as ``codec.inner_products`` (float64 numpy) and
    as the decoded vectors' inner products with the queries; one to five queries (an odd last one).
    A unit code's rows are scaled by the lengths the Numba pass reads from the codes."""
    rows, mean, covariance, queries = data
    codec = train_codec(name, mean, covariance, budget, unit=unit)
    codes = encode(codec, rows[:n_rows])
    estimate = codec.inner_products(queries, codes).astype(np.float64)
    decoded = queries.astype(np.float64) @ codec.decode(codes).astype(np.float64).T
    np.testing.assert_allclose(estimate, decoded, rtol=1e-4, atol=1e-3)
    k = min(n_rows, 50)
    scores, found = search(codec, queries, codes, k)
    assert np.all(found >= 0)
    for i in range(len(queries)):
        np.testing.assert_allclose(scores[i], estimate[i, found[i]], rtol=1e-4, atol=1e-4)
        # the k best by the estimate, up to float32 near-ties at the cut
        cut = np.sort(estimate[i])[::-1][k - 1]
        assert np.all(estimate[i, found[i]] >= cut - 1e-3 * max(1.0, abs(cut)))
        assert len(set(found[i].tolist())) == k
