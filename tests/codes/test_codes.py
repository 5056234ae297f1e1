"""Vector codes (streamwhiten.codes): each against an independent plain-numpy reference, the bit
allocation against brute force, the faiss codes against faiss itself, the byte form and bad input."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from streamwhiten.codes import CODES, codec_from_bytes, train_codec
from streamwhiten.codes.fast import encode, search
from streamwhiten.codes.linear import LinearCode, allocate_bits, gaussian_quantizer, principal_axes, quantizer_errors
from streamwhiten.core.exclusions import Exclusions
from streamwhiten.errors import BadInputError, ModelFileError, NonFiniteError

D = 24
LINEAR = [name for name in CODES if not name.startswith("faiss-")]


@pytest.fixture(scope="module")
def data():
    """Anisotropic rows (a decaying spectrum in a random basis, off-centre), their exact moments, queries."""
    rng = np.random.default_rng(3)
    basis, _ = np.linalg.qr(rng.standard_normal((D, D)))
    rows = (rng.standard_normal((3000, D)) * np.geomspace(3.0, 0.2, D)) @ basis.T + rng.standard_normal(D)
    rows = rows.astype(np.float32)
    wide = rows.astype(np.float64)
    mean = wide.mean(axis=0)
    covariance = (wide - mean).T @ (wide - mean) / len(wide)
    queries = (rng.standard_normal((40, D)) * 2).astype(np.float32)
    return rows, mean, covariance, queries


def budget_for(name: str) -> int:
    return 2 if name.startswith("bits-") and not name.endswith("+f") else 3 if name.startswith("bits-") else 7


# ------------------------------------------------------------------------------------------- allocation


def test_gaussian_quantizer_has_the_known_one_bit_optimum():
    """1 bit: levels +-E|z| = +-sqrt(2/pi), error 1 - 2/pi (closed form)."""
    step, error = gaussian_quantizer(1)
    assert step / 2 == pytest.approx(math.sqrt(2 / math.pi), rel=1e-3)
    assert error == pytest.approx(1 - 2 / math.pi, rel=1e-3)
    errors = quantizer_errors()
    assert errors[0] == 1 and np.all(np.diff(errors) < 0) and np.all(np.diff(errors, 2) > 0)


@pytest.mark.parametrize("seed", range(4))
def test_allocation_is_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    importance = rng.gamma(0.7, size=4) * np.array([10.0, 3.0, 1.0, 0.2])
    errors = quantizer_errors(4)
    for total in range(0, 17):
        bits = allocate_bits(importance, total, max_bits=4)
        assert bits.sum() <= total and bits.min() >= 0 and bits.max() <= 4
        best = min(
            float(np.sum(importance * errors[list(choice)]))
            for choice in itertools.product(range(5), repeat=4)
            if sum(choice) <= total
        )
        assert float(np.sum(importance * errors[bits])) == pytest.approx(best, rel=1e-12)


# ---------------------------------------------------------------------------------------- linear codes


def reference_encode(codec: LinearCode, rows: np.ndarray) -> np.ndarray:
    """The documented layout written out in loops: floor quantiser, bits least significant first, bit t
    of the stream in bit t % 8 of byte t // 8, then the float16 correction."""
    out = np.zeros((len(rows), codec.bytes_per_vector), dtype=np.uint8)
    z = (rows.astype(np.float32) - codec.mean.astype(np.float32)) @ codec.basis
    for i in range(len(rows)):
        position = 0
        levels = []
        for j, width in enumerate(codec.bits):
            code = int(np.clip(np.floor(float(z[i, j]) / codec.step[j] + 2.0 ** (width - 1)), 0, 2**width - 1))
            levels.append((code + 0.5 - 2.0 ** (width - 1)) * codec.step[j])
            for b in range(width):
                if (code >> b) & 1:
                    out[i, position // 8] |= 1 << (position % 8)
                position += 1
        if codec.correction:
            centred = rows[i].astype(np.float32) - codec.mean.astype(np.float32)
            energy = float(np.dot(centred.astype(np.float64), centred))
            scale = energy / float(np.dot(levels, z[i].astype(np.float64)))
            out[i, codec.code_bytes :] = np.array([scale], dtype=np.float16).view(np.uint8)
    return out


def reference_decode(codec: LinearCode, codes: np.ndarray) -> np.ndarray:
    out = np.zeros((len(codes), codec.n_features))
    for i, row in enumerate(codes):
        bits = [(int(row[t // 8]) >> (t % 8)) & 1 for t in range(codec.code_bytes * 8)]
        position, levels = 0, []
        for j, width in enumerate(codec.bits):
            code = sum(bits[position + b] << b for b in range(width))
            levels.append((code + 0.5 - 2.0 ** (width - 1)) * codec.step[j])
            position += width
        scale = float(row[codec.code_bytes :].view(np.float16)[0]) if codec.correction else 1.0
        out[i] = codec.mean + scale * (codec.basis.astype(np.float64) @ np.array(levels))
    return out


@pytest.mark.parametrize("name", LINEAR)
def test_linear_codes_match_a_plain_numpy_reference(data, name):
    rows, mean, covariance, queries = data
    codec = train_codec(name, mean, covariance, budget_for(name), sample=rows[:1500], seed=5)
    assert codec.bytes_per_vector <= budget_for(name)
    some = rows[:60]
    codes = codec.encode(some)
    assert codes.dtype == np.uint8 and codes.shape == (60, codec.bytes_per_vector)
    np.testing.assert_array_equal(codes, reference_encode(codec, some))
    np.testing.assert_array_equal(encode(codec, rows), codec.encode(rows))  # the Numba path, byte for byte
    decoded = reference_decode(codec, codes)
    np.testing.assert_allclose(codec.decode(codes), decoded, rtol=1e-5, atol=1e-5)
    # the asymmetric estimate is the inner product with the decoded vector, in float64
    np.testing.assert_allclose(
        codec.inner_products(queries, codes), queries.astype(np.float64) @ decoded.T, rtol=1e-4, atol=1e-4
    )


def test_axes_are_the_models_eigenvectors(data):
    """The codes take the principal axes as the model does (signs fixed, not LAPACK's choice), so the
    sign bits of ``bits-pca`` are those of the model's own components."""
    from streamwhiten import Whitener

    rows = data[0]
    model = Whitener(beta=1.0, gamma=0.0).fit(rows).model_
    codec = train_codec("bits-pca", model.state.mean, model.covariance, 2)
    np.testing.assert_array_equal(codec.basis, model.eigvecs[:, :16].astype(codec.basis.dtype))
    values, vectors = principal_axes(model.covariance)
    np.testing.assert_array_equal(values, model.eigvals)
    np.testing.assert_array_equal(vectors, model.eigvecs)


def test_codes_learn_the_vectors(data):
    """More bytes, less error; every code beats a code of zeros (the mean) by far."""
    rows, mean, covariance, queries = data
    true = queries.astype(np.float64) @ rows[:500].T.astype(np.float64)
    baseline = np.mean((queries.astype(np.float64) @ mean[:, None] - true) ** 2)
    errors = []
    for budget in (3, 6, 12, 24):
        codec = train_codec("eigen", mean, covariance, budget)
        errors.append(np.mean((codec.inner_products(queries, codec.encode(rows[:500])) - true) ** 2))
    assert errors[0] < 0.5 * baseline and all(b < a for a, b in itertools.pairwise(errors))


@pytest.mark.parametrize("budget", [8, 16])
def test_rotation_never_spreads_the_means_weight(budget):
    """Unit rows with a large common part (every row near the mean's direction): the rotation among
    equal-bit components must not raise the inner-product error for queries like the rows (a rotation
    that mixed the directions led by the mean into the others tripled it, and lost most neighbours)."""
    from streamwhiten.codes.linear import train_eigen
    from streamwhiten.synthetic import generate_rows

    rows = generate_rows(4000, 64, seed=11).astype(np.float64)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    corpus, queries = rows[:3000], rows[3000:3200]
    mean = corpus.mean(axis=0)
    covariance = (corpus - mean).T @ (corpus - mean) / len(corpus)
    true = queries @ corpus.T
    error = {}
    for rotate in (True, False):
        codec = train_eigen(mean, covariance, budget, rotate=rotate)
        error[rotate] = np.mean((codec.inner_products(queries, codec.encode(corpus)) - true) ** 2)
    assert error[True] < 1.1 * error[False]


@pytest.mark.parametrize("name", ["eigen", "eigen+f", "bits-random"])
def test_unit_codes_estimate_the_cosine_with_the_decoded_vector(data, name):
    """A code of unit vectors stands for its decoded vector scaled to unit length (the independent
    reference decode, normalised); its byte form keeps that, and bytes without the entry (written
    before it existed) read as a plain code."""

    from streamwhiten.codes.base import read_parts

    rows, mean, covariance, queries = data
    codec = train_codec(name, mean, covariance, budget_for(name), seed=5, unit=True)
    codes = codec.encode(rows[:80])
    decoded = reference_decode(codec, codes)
    unit = decoded / np.linalg.norm(decoded, axis=1, keepdims=True)
    np.testing.assert_allclose(codec.decode(codes), unit, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        codec.inner_products(queries, codes), queries.astype(np.float64) @ unit.T, rtol=1e-4, atol=1e-4
    )
    again = codec_from_bytes(codec.to_bytes())
    assert again.unit and again.to_bytes() == codec.to_bytes()
    plain = codec.with_unit(False)
    assert read_parts(plain.to_bytes())[1]["unit"] is False
    np.testing.assert_array_equal(plain.encode(rows[:80]), codes)  # the same bytes, another estimate

    class Older(LinearCode):  # writes its record as releases before the entry did
        def _parts(self):
            record, arrays = super()._parts()
            return {key: value for key, value in record.items() if key != "unit"}, arrays

    older = Older._from_parts(*codec._parts()).to_bytes()
    assert "unit" not in read_parts(older)[1]
    assert codec_from_bytes(older).unit is False


def test_unit_estimate_finds_more_neighbours_of_unit_rows():
    """Unit rows sharing a large mean (as sentence embeddings do, more so): the plain estimate carries
    the quantiser's error along each vector into every score, weighted by the query's part along the
    mean; the cosine with the decoded vector drops it and finds more of the true top 10."""
    from streamwhiten.synthetic import generate_rows

    rows = generate_rows(20_200, 128, seed=11).astype(np.float64)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    corpus, queries = rows[:20_000], rows[20_000:]
    mean = corpus.mean(axis=0)
    covariance = (corpus - mean).T @ (corpus - mean) / len(corpus)
    true = np.argsort(-(queries @ corpus.T), axis=1)[:, :10]
    found = {}
    for unit in (False, True):
        codec = train_codec("eigen", mean, covariance, 12, unit=unit)
        _, top = search(codec, queries.astype(np.float32), encode(codec, corpus.astype(np.float32)), 10)
        found[unit] = np.mean([len(set(top[i]) & set(true[i])) for i in range(len(true))])
    assert found[True] > found[False] + 1.0  # of 10


def test_corrected_estimate_is_unbiased(data):
    """Over random pairs (isotropic queries), the corrected estimate's error has mean ~0 and does not
    grow with the true inner product; without the correction the estimate shrinks towards the mean."""
    rows, mean, covariance, _ = data
    rng = np.random.default_rng(11)
    queries = rng.standard_normal((400, D))
    centred_true = queries @ (rows[:1000].astype(np.float64) - mean).T
    for name, expect_unbiased in (("eigen+f", True), ("eigen", False)):
        codec = train_codec(name, mean, covariance, 5)
        estimate = codec.inner_products(queries, codec.encode(rows[:1000])).astype(np.float64)
        error = (estimate - queries @ mean[:, None]) - centred_true
        slope = np.sum(error * centred_true) / np.sum(centred_true**2)
        spread = error.std() / math.sqrt(error.size)
        if expect_unbiased:
            assert abs(error.mean()) < 4 * spread * 10  # pairs share rows: a generous bound on the mean
            assert abs(slope) < 0.02
        else:
            assert slope < -0.05


@pytest.mark.parametrize("name", ["eigen", "eigen+f", "bits-itq"])
def test_search_is_the_exact_top_k_of_the_estimates(data, name):
    rows, mean, covariance, queries = data
    codec = train_codec(name, mean, covariance, budget_for(name), sample=rows[:1500])
    codes = codec.encode(rows)
    excluded = Exclusions.from_pairs(len(queries), np.arange(len(queries)), np.arange(len(queries)) * 3)
    scores, found = search(codec, queries, codes, 7, exclude=excluded)
    estimate = codec.inner_products(queries, codes).astype(np.float64)
    for i in range(len(queries)):
        estimate[i, 3 * i] = -np.inf
        expected = np.lexsort((np.arange(len(rows)), -estimate[i]))[:7]
        # float32 table sums may swap near-ties: the sets agree and the scores match the estimates
        assert len(set(found[i]) & set(expected)) >= 6
        assert 3 * i not in found[i]
        np.testing.assert_allclose(scores[i], estimate[i, found[i]], rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------ faiss codes


@pytest.fixture(scope="module")
def faiss():
    faiss = pytest.importorskip("faiss")
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield faiss
    faiss.omp_set_num_threads(threads)


@pytest.mark.parametrize(
    "name,budget", [("faiss-pq", 6), ("faiss-opq", 4), ("faiss-rabitq1", 10), ("faiss-rabitq2", 24), ("faiss-sq4", 6)]
)
def test_faiss_codes_load_and_search_as_faiss_does(faiss, data, name, budget):
    rows, mean, covariance, queries = data
    codec = train_codec(name, mean, covariance, budget, sample=rows, seed=2, iterations=4, opq_iterations=2)
    assert codec.bytes_per_vector <= budget
    loaded = codec_from_bytes(codec.to_bytes(), n_features=D)
    codes = loaded.encode(rows)
    np.testing.assert_array_equal(codes, codec.encode(rows))
    # faiss alone: the trained index encodes the mapped rows itself and searches them
    index = faiss.deserialize_index(codec.index_bytes)
    mapped = (rows - mean.astype(np.float32)).astype(np.float32)
    if codec.basis is not None:
        mapped = mapped @ codec.basis
    index.add(np.ascontiguousarray(mapped))
    query_mapped = queries if codec.basis is None else queries @ codec.basis
    want_scores, want_rows = index.search(np.ascontiguousarray(query_mapped, dtype=np.float32), 10)
    scores, found = search(loaded, queries, codes, 10)
    np.testing.assert_array_equal(found, want_rows)
    np.testing.assert_allclose(scores, want_scores + (queries @ mean)[:, None], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(loaded.decode(codes[:5]), codec.decode(codes[:5]), rtol=1e-6)
    assert loaded.training["sample_rows"] == len(rows) and loaded.training["seed"] == 2


@pytest.mark.parametrize("name,budget", [("faiss-pq", 6), ("faiss-opq", 4), ("faiss-sq4", 6), ("faiss-rabitq1", 10)])
def test_faiss_codes_of_unit_vectors_rank_by_l2(faiss, data, name, budget):
    """A faiss code of unit vectors ranks as faiss's L2 search of the centred (projected) rows does, and
    (but RaBitQ, whose distance is its own estimate) scores the cosine estimate ``(||q||^2 + 1 - D - r) / 2``
    (``D``: the squared distance of the centred, projected query to the decoded row; ``r``: the query's
    centred part the projection drops; numpy). Decoding gives unit vectors."""
    rows, mean, covariance, queries = data
    rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    mean, covariance = rows.mean(axis=0, dtype=np.float64), np.cov(rows.T.astype(np.float64), bias=True)
    codec = train_codec(name, mean, covariance, budget, sample=rows, seed=2, iterations=4, opq_iterations=2, unit=True)
    assert codec.unit and codec_from_bytes(codec.to_bytes()).unit
    codes = codec.encode(rows)
    index = faiss.deserialize_index(codec.index_bytes)
    assert index.metric_type == faiss.METRIC_L2
    shift = mean.astype(np.float32)
    mapped = rows - shift if codec.basis is None else (rows - shift) @ codec.basis
    index.add(np.ascontiguousarray(mapped, dtype=np.float32))
    query_mapped = queries - shift if codec.basis is None else (queries - shift) @ codec.basis
    _, want_rows = index.search(np.ascontiguousarray(query_mapped, dtype=np.float32), 10)
    scores, found = search(codec, queries, codes, 10)
    np.testing.assert_array_equal(found, want_rows)
    np.testing.assert_allclose(np.linalg.norm(codec.decode(codes), axis=1), 1.0, rtol=1e-5)
    if name.startswith("faiss-rabitq"):
        return  # RaBitQ's distance is its own unbiased estimate, not the decoded vector's distance
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexPreTransform) else index
    decoded = index.sa_decode(np.ascontiguousarray(codes)).astype(np.float64)  # centred, projected rows
    if isinstance(index, faiss.IndexPreTransform):  # OPQ: distances in the rotated space, lengths kept
        rotation = faiss.downcast_VectorTransform(index.chain.at(0))
        decoded = rotation.apply(np.ascontiguousarray(decoded, dtype=np.float32)).astype(np.float64)
        q = rotation.apply(np.ascontiguousarray(query_mapped, dtype=np.float32)).astype(np.float64)
    else:
        q = query_mapped.astype(np.float64)
    assert inner.metric_type == faiss.METRIC_L2
    distance = np.sum((q[:, None, :] - decoded[None, :, :]) ** 2, axis=2)
    centred = queries.astype(np.float64) - mean
    dropped = np.sum(centred**2, axis=1) - np.sum(q**2, axis=1)
    lengths = np.sum(queries.astype(np.float64) ** 2, axis=1)
    expected = 0.5 * ((lengths + 1.0 - np.maximum(dropped, 0.0))[:, None] - distance)
    np.testing.assert_allclose(scores, np.take_along_axis(expected, found, axis=1), rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------------------------- byte form and bad input


def test_byte_form_round_trips_and_refuses_damage(data):
    rows, mean, covariance, _ = data
    codec = train_codec("bits-itq+f", mean, covariance, 3, sample=rows[:500], seed=4)
    data_bytes = codec.to_bytes()
    again = codec_from_bytes(data_bytes)
    assert again.to_bytes() == data_bytes and again.label == codec.label
    np.testing.assert_array_equal(again.encode(rows[:50]), codec.encode(rows[:50]))
    damaged = bytearray(data_bytes)
    damaged[len(damaged) // 2] ^= 1
    for bad in (bytes(damaged), data_bytes[:-1], b"not a codec at all, not at all", data_bytes[:20]):
        with pytest.raises(ModelFileError) as caught:
            codec_from_bytes(bad)
        assert "\n" not in str(caught.value)


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message and message
    return message


def test_bad_input_is_a_one_line_error(data):
    rows, mean, covariance, _ = data
    with pytest.raises(BadInputError) as caught:
        train_codec("eigen", mean, covariance, 0)
    assert "below the smallest eigen code" in one_line(caught)
    with pytest.raises(BadInputError) as caught:
        train_codec("bits-random+f", mean, covariance, 2)
    assert "below the smallest" in one_line(caught)
    with pytest.raises(BadInputError) as caught:
        train_codec("bits-pca", mean, covariance, 4)  # 32 sign bits of 24 features
    assert "at most 3 bytes" in one_line(caught)
    with pytest.raises(BadInputError) as caught:
        train_codec("bits-itq", mean, covariance, 2)
    assert "sample" in one_line(caught)
    codec = train_codec("eigen", mean, covariance, 8)
    with pytest.raises(BadInputError) as caught:
        codec_from_bytes(codec.to_bytes(), n_features=D + 1)
    assert f"vectors of {D} values, not {D + 1}" in one_line(caught)
    with pytest.raises(BadInputError) as caught:
        codec.encode(rows[:, :-1])
    assert f"of {D} values" in one_line(caught)
    bad = rows[:5].copy()
    for value in (np.nan, np.inf):
        bad[3, 2] = value
        for encoder in (codec.encode, lambda block: encode(codec, block)):
            with pytest.raises(NonFiniteError) as caught:
                encoder(bad)
            assert caught.value.row == 3 and "row 3" in one_line(caught)
    with pytest.raises(BadInputError) as caught:
        codec.decode(np.zeros((2, codec.bytes_per_vector + 1), dtype=np.uint8))
    assert "rows of 8 bytes" in one_line(caught)


@pytest.mark.parametrize("name", ["faiss-pq", "faiss-opq"])
def test_faiss_encodes_in_bounded_batches_to_the_same_codes(faiss, data, monkeypatch, name):
    """Within ``pq_batches`` faiss's product quantizers (16 values a sub-space: faiss's BLAS path, whose
    distance tables it makes for a whole batch of rows at once) train and encode in batches of 64 rows: the
    same codec bytes and the same codes as in faiss's own batches; faiss's batch size is restored after."""
    from streamwhiten.codes import faiss_codes

    rows = np.hstack([data[0], data[0][:, :8] * 0.5]).astype(np.float32)  # 32 values: 2 bytes of 16 each
    wide = rows.astype(np.float64)
    mean, covariance = wide.mean(axis=0), np.cov(wide, rowvar=False, bias=True)
    options = dict(sample=rows[:1000], seed=1, iterations=3, opq_iterations=2)
    plain = train_codec(name, mean, covariance, 2, **options)
    before = faiss.cvar.product_quantizer_compute_codes_bs
    monkeypatch.setattr(faiss_codes, "PQ_TABLE_BYTES", 64 * 256 * 4 * 2)  # 64 rows of 2 bytes' tables
    with faiss_codes.pq_batches(2):
        assert faiss.cvar.product_quantizer_compute_codes_bs == 64
        batched = train_codec(name, mean, covariance, 2, **options)
        codes = batched.encode(rows)
    assert faiss.cvar.product_quantizer_compute_codes_bs == before
    assert batched.to_bytes() == plain.to_bytes()
    np.testing.assert_array_equal(codes, plain.encode(rows))
    with pytest.raises(RuntimeError), faiss_codes.pq_batches(2):
        raise RuntimeError("an error inside")
    assert faiss.cvar.product_quantizer_compute_codes_bs == before


def test_faiss_budget_below_the_smallest_code(faiss, data):
    rows, mean, covariance, _ = data
    with pytest.raises(BadInputError) as caught:
        train_codec("faiss-rabitq1", mean, covariance, 8, sample=rows)
    assert "below the smallest rabitq1 code (9 bytes)" in one_line(caught)
    with pytest.raises(BadInputError) as caught:
        train_codec("faiss-pq", mean, covariance, D + 1, sample=rows)
    assert "takes 1 to" in one_line(caught)


@pytest.mark.parametrize(
    "name, budget, message, fits",
    [
        ("bits-itq", 5, "32 features hold at most 4 bytes of sign bits, not 5", 4),
        ("bits-itq+f", 2, "below the smallest bits-itq code \\(3 bytes\\)", 6),
        ("faiss-pq", 33, "takes 1 to 32 bytes, not 33", 4),
        ("faiss-rabitq1", 4, "below the smallest rabitq1 code", 12),
    ],
)
def test_a_budget_a_sampled_code_cannot_take_is_refused_before_the_sample_as_training_refuses_it(
    name, budget, message, fits
):
    """``check_budget`` (what ``with_codes`` asks before reading a sample) refuses what training refuses,
    in the same words."""
    from streamwhiten.codes import check_budget

    if name.startswith("faiss"):
        pytest.importorskip("faiss")
    rows = np.random.default_rng(0).standard_normal((300, 32))
    with pytest.raises(BadInputError, match=message):
        check_budget(name, 32, budget)
    with pytest.raises(BadInputError, match=message):
        train_codec(name, rows.mean(0), np.cov(rows.T), budget, sample=rows)
    check_budget(name, 32, fits)  # one that fits: no error
