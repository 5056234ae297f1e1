"""Quantized storage (core.quantize): int8 scales from the statistics, round-trip bounds, the bit layout
of faiss/sentence-transformers, and the decode record."""

import json

import numpy as np
import pytest
from conftest import anisotropic

from streamwhiten.core import stats
from streamwhiten.core.model import finalize
from streamwhiten.core.quantize import (
    DEFAULT_INT8_CLIP,
    INT8_MAX,
    Quantization,
    int8_quantization,
    map_moments,
    normalized_moments,
    quantization_for,
)
from streamwhiten.errors import BadInputError, NonFiniteError, ValuesTooLargeError


@pytest.fixture
def rows():
    return anisotropic(3000, 10, seed=3, offset=2.0)


@pytest.mark.parametrize("beta, gamma, k", [(1.0, 1.0, 10), (0.5, 0.25, 6), (0.0, 0.0, 4)])
def test_map_moments_are_those_of_the_transformed_rows(rows, beta, gamma, k):
    """mean (1 - beta) mu A_j and variance A_j^T Sigma_1 A_j, from the statistics alone, equal numpy's
    float64 mean and (population) variance of y = (x - beta mu) A."""
    model = finalize(stats.block_moments(rows), beta=beta, gamma=gamma, n_components=k)
    weights, shift = model.projection(np.float64)
    y = (rows - shift) @ weights
    mean, variance = map_moments(model.n_rows, model.mean, model.state.scatter, weights, shift)
    np.testing.assert_allclose(mean, y.mean(axis=0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(variance, y.var(axis=0), rtol=1e-9)
    np.testing.assert_allclose(mean, (1 - beta) * model.mean @ weights, rtol=1e-12, atol=1e-12)
    raw_mean, raw_variance = map_moments(
        model.n_rows, model.mean, model.state.scatter
    )  # the identity map: the raw vectors
    np.testing.assert_allclose(raw_mean, rows.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(raw_variance, rows.var(axis=0), rtol=1e-9)


def test_normalized_moments_are_exact_when_every_row_has_the_same_norm():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((5000, 6)) * [3, 2, 1, 1, 0.5, 0.1] + [1, 0, 0, 2, 0, 0]
    rows *= 7.0 / np.linalg.norm(rows, axis=1, keepdims=True)  # norm 7 for all
    mean, variance = normalized_moments(rows.mean(axis=0), rows.var(axis=0))
    unit = rows / 7.0
    np.testing.assert_allclose(mean, unit.mean(axis=0), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(variance, unit.var(axis=0), rtol=1e-12)


def test_int8_codes_round_trip_within_half_a_step_and_clip_at_the_end_codes():
    rng = np.random.default_rng(1)
    mean, std = rng.standard_normal(8), rng.uniform(0.1, 3.0, 8)
    q = int8_quantization(mean, std**2, clip=3.0)
    np.testing.assert_allclose(q.scale, 3.0 * std / INT8_MAX, rtol=1e-15)
    y = mean + std * rng.standard_normal((20000, 8)) * 1.5
    codes = q.encode(y)
    assert codes.dtype == np.int8 and codes.min() >= -INT8_MAX and codes.max() <= INT8_MAX
    back = q.decode(codes, np.float64)
    np.testing.assert_array_equal(back, codes * q.scale + q.offset)
    inside = np.abs(y - mean) <= 3.0 * std
    assert inside.mean() > 0.9 and (~inside).any()
    error = np.abs(back - y)
    assert np.all(error[inside] <= (q.scale / 2 * (1 + 1e-12) * np.ones_like(y))[inside])
    outside = ~inside
    np.testing.assert_array_equal(np.abs(codes[outside]), INT8_MAX)  # clipped to the end codes
    np.testing.assert_array_equal(np.sign(codes[outside]), np.sign((y - mean)[outside]))
    np.testing.assert_array_equal(codes, np.clip(np.rint((y - q.offset) / q.scale), -127, 127))


def test_a_constant_component_gets_a_positive_scale_and_decodes_to_its_mean():
    q = int8_quantization(np.array([1.0, 5.0]), np.array([4.0, 0.0]))
    assert np.all(q.scale > 0)
    np.testing.assert_array_equal(q.decode(q.encode(np.array([[1.0, 5.0]])), np.float64), [[1.0, 5.0]])


@pytest.mark.parametrize("k", [1, 7, 8, 9, 16, 17, 384])
def test_bits_are_numpy_packbits_of_the_signs_in_ceil_k_over_8_bytes(k):
    rng = np.random.default_rng(k)
    y = rng.standard_normal((50, k))
    y[0, 0] = 0.0  # zero is not above 0: bit 0
    q = Quantization("binary", k)
    bits = q.encode(y)
    np.testing.assert_array_equal(bits, np.packbits(y > 0, axis=1))
    assert bits.dtype == np.uint8 and bits.shape == (50, -(-k // 8)) and q.bytes_per_vector == -(-k // 8)
    # big bit order: component 0 is the high bit of byte 0
    assert (bits[:, 0] >> 7 == (y[:, 0] > 0)).all()
    np.testing.assert_array_equal(q.decode(bits, np.float64), np.where(y > 0, 1.0, -1.0))


@pytest.mark.torch
def test_bits_match_sentence_transformers_ubinary():
    st = pytest.importorskip("sentence_transformers.quantization")
    y = np.random.default_rng(5).standard_normal((40, 20)).astype(np.float32)
    np.testing.assert_array_equal(Quantization("binary", 20).encode(y), st.quantize_embeddings(y, precision="ubinary"))


def test_the_decode_record_survives_json_bit_for_bit(rows):
    model = finalize(stats.block_moments(rows), n_components=7)
    for kind in ("float32", "float16", "int8", "binary"):
        q = quantization_for(kind, model, normalize=True)
        record = json.loads(json.dumps(q.to_dict()))
        again = Quantization.from_dict(record)
        assert (again.kind, again.n_components, again.normalized, again.clip) == (kind, 7, True, q.clip)
        assert again.to_dict() == q.to_dict()
        if kind == "int8":
            assert record["codes"] == [-127, 127] and q.clip == DEFAULT_INT8_CLIP
            np.testing.assert_array_equal(again.scale, q.scale)
            np.testing.assert_array_equal(again.offset, q.offset)
        y = model.transform(rows[:5], normalize=True)
        np.testing.assert_array_equal(again.decode(q.encode(y)), q.decode(q.encode(y)))


@pytest.mark.parametrize(
    "record, message",
    [
        ({"kind": "int8"}, "not a streamwhiten-quantization record"),
        ({"format": "streamwhiten-quantization", "format_version": 2, "kind": "int8"}, "version 2 is not supported"),
        ({"format": "streamwhiten-quantization", "format_version": 1, "kind": "int4", "n_components": 3}, "kind must"),
        ({"format": "streamwhiten-quantization", "format_version": 1, "kind": "int8", "n_components": 2}, "needs 2"),
        (
            {
                "format": "streamwhiten-quantization",
                "format_version": 1,
                "kind": "int8",
                "n_components": 2,
                "scale": [1.0, 0.0],
                "offset": [0, 0],
            },
            "scale values must be above 0",
        ),
        ({"format": "streamwhiten-quantization", "format_version": 1, "kind": "binary"}, "damaged"),
        (
            {
                "format": "streamwhiten-quantization",
                "format_version": 1,
                "kind": "binary",
                "n_components": 8,
                "bit_order": "little",
            },
            "big bit order",
        ),
    ],
)
def test_a_bad_record_is_refused(record, message):
    with pytest.raises(BadInputError, match=message):
        Quantization.from_dict(record)


def test_values_storage_cannot_hold_are_refused():
    with pytest.raises(ValuesTooLargeError):
        Quantization("float16", 2).encode(np.array([[1.0, 1e6]]))
    y = np.array([[0.0, 1.0], [np.nan, 0.0]])
    for kind in ("binary", "int8"):
        q = int8_quantization(np.zeros(2), np.ones(2)) if kind == "int8" else Quantization(kind, 2)
        with pytest.raises(NonFiniteError, match="^row 1 holds NaN or Inf"):
            q.encode(y)
    with pytest.raises(BadInputError, match="rows of 3 components"):
        Quantization("float32", 3).encode(np.zeros((2, 2)))
    with pytest.raises(BadInputError, match="int8 storage needs a fitted model"):
        quantization_for("int8", n_components=4)
    with pytest.raises(BadInputError, match="int8_clip must be"):
        int8_quantization(np.zeros(2), np.ones(2), clip=0)
