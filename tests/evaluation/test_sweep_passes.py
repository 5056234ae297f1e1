"""The sweep's passes (evaluation.sweep_passes): a setting's rows made from its beta's shared rotation equal its
own map computed from scratch in numpy (eigenvectors of Sigma_beta recomputed from the rows); a pass over a
store in many blocks and slices gives the top lists and re-rankings of one numpy sort of the whole corpus."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import write_h5

from streamwhiten.core import stats
from streamwhiten.core.exclusions import Exclusions
from streamwhiten.core.model import finalize
from streamwhiten.core.quantize import Quantization, quantization_for
from streamwhiten.errors import ValuesTooLargeError
from streamwhiten.evaluation import search as search_module
from streamwhiten.evaluation.search import Reranking, SearchJob, corpus_slices
from streamwhiten.evaluation.sweep_passes import (
    IDENTITY,
    Reading,
    Rotation,
    Use,
    query_units,
    rotation_for,
    rotation_key,
    run_pass,
    scaling_for,
    stored,
    unit_rows,
)
from streamwhiten.evaluation.tune import decompose
from streamwhiten.io import open_source

D = 10


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(3)
    rows = (rng.standard_normal((700, D)) * np.geomspace(4, 0.2, D) + 1.5).astype(np.float32)
    rows[5] = 0.0  # a zero row stays zero
    rows[300] = rows[17]  # a duplicate: its scores tie exactly, ties go to the lower row
    queries = (rows[[17, 40, 99, 420, 650]] + 0.3 * rng.standard_normal((5, D))).astype(np.float32)
    return rows, queries, finalize(stats.block_moments(rows.astype(np.float64)))


def numpy_map(rows, beta, gamma, k):
    """The setting's unit rows from scratch: eigenvectors of Sigma_beta = cov + (1 - beta)^2 mu mu^T, descending."""
    x = rows.astype(np.float64)
    mean = x.mean(axis=0)
    sigma = np.cov(x, rowvar=False, bias=True) + (1 - beta) ** 2 * np.outer(mean, mean)
    values, vectors = np.linalg.eigh(sigma)
    values, vectors = np.maximum(values[::-1], 0), vectors[:, ::-1]
    y = (x - beta * mean) @ (vectors[:, :k] * (values[:k] + 1e-6 * values[0]) ** (-gamma / 2))
    norms = np.linalg.norm(y, axis=1, keepdims=True)
    return np.divide(y, norms, out=np.zeros_like(y), where=norms > 0)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_every_gamma_and_k_of_a_beta_comes_from_its_one_rotation(fitted, beta):
    rows, _, model = fitted
    base = decompose(model, beta)
    product = rotation_for(base).apply(rows)
    for gamma in (0.0, 0.5, 1.0):
        for k in (D, 7, 3, 1):
            made = unit_rows(product, scaling_for(base, gamma, k), k)
            want = numpy_map(rows, beta, gamma, k)
            signs = np.sign(np.sum(made * want, axis=0))  # an eigenvector's sign is a convention
            np.testing.assert_allclose(made * signs, want, atol=1e-9)
            # a sign does not change with a positive scale: the bits of (beta, k) are those of every gamma
            bits = np.packbits(unit_rows(product, None, k) > 0, axis=1)
            np.testing.assert_array_equal(np.packbits(made > 0, axis=1), bits)
    if beta == 0.0:  # the zero row rotates to zero and stays zero
        assert not unit_rows(product, scaling_for(base, 1.0, D), D)[5].any()


def test_the_identity_is_the_rows_at_unit_length_and_an_overflow_is_refused(fitted):
    rows, _, _ = fitted
    raw = unit_rows(Rotation().apply(rows), None, D)
    norms = np.linalg.norm(rows.astype(np.float64), axis=1, keepdims=True)
    np.testing.assert_allclose(raw, np.divide(rows, norms, out=np.zeros_like(raw), where=norms > 0), atol=1e-12)
    assert rotation_key(0.0, True) == IDENTITY and rotation_key(1, False) == ("eigen", 1.0)
    huge = np.full((3, D), 1e300)
    huge[1] = 1.0
    with pytest.raises(ValuesTooLargeError, match="overflow when whitened") as caught:
        unit_rows(huge, np.full(D, 1e10), D)
    assert caught.value.row == 0


def ranked(scores, depth, excluded=()):
    """Per query: rows by score (best first; Hamming: smallest first via negated scores), ties to the lower row."""
    out = np.full((scores.shape[0], depth), -1, np.int64)
    for q in range(scores.shape[0]):
        s = scores[q].copy()
        s[[c for qq, c in excluded if qq == q]] = -np.inf
        order = np.lexsort((np.arange(s.size), -s))
        order = order[np.isfinite(s[order])][:depth]
        out[q, : order.size] = order
    return out


@pytest.mark.parametrize("block_rows,slice_bytes", [(None, None), (37, 8 * D * 16), (700, 8 * D * 50)])
def test_a_pass_in_blocks_and_slices_gives_the_lists_of_one_numpy_sort(
    tmp_path, fitted, monkeypatch, block_rows, slice_bytes
):
    rows, queries, model = fitted
    if slice_bytes is not None:  # slices of 16 or 50 rows inside blocks of 37 or 700
        monkeypatch.setattr(search_module, "SLICE_BYTES", slice_bytes)
    excluded = [(0, 17), (2, 99)]
    exclude = Exclusions.from_pairs(5, [q for q, _ in excluded], [c for _, c in excluded])
    base = decompose(model, 0.5)
    rotations = {IDENTITY: Rotation(), rotation_key(0.5, False): rotation_for(base)}
    unit = query_units(queries, rotations)
    key = rotation_key(0.5, False)
    weights = scaling_for(base, 1.0, 6)
    int8 = quantization_for("int8", base.with_params(gamma=1.0, n_components=6), normalize=True)
    bits = Quantization("binary", 4, normalized=True)
    float32 = Quantization("float32", D, normalized=True)
    floats = Use(
        IDENTITY, None, D, [SearchJob(unit(IDENTITY, None, D), 20, "ip", lambda u, _a: stored(float32, u), exclude)]
    )
    coded = Use(key, weights, 6, [SearchJob(unit(key, weights, 6), 20, "ip", lambda u, _a: stored(int8, u), exclude)])
    signs = Use(key, None, 4)
    signs.jobs.append(
        SearchJob(np.packbits(unit(key, None, 4) > 0, axis=1), 30, "hamming", lambda u, _a: stored(bits, u), exclude)
    )
    candidates = np.tile(np.array([699, 3, 300, 17, 0, 650]), (5, 1))
    reranking = Reranking(unit(key, weights, 6), candidates, 6)
    coded.reranks.append((Quantization("float32", 6, normalized=True), reranking))
    seen = []
    with open_source(write_h5(tmp_path / "c.h5", rows, chunk_rows=64)) as source:
        uses = [floats, coded, signs]
        run_pass(Reading(source, "c.h5", block_rows, 2), rotations, uses, lambda done, n: seen.append((done, n)))
    assert seen[-1] == (700, 700) and [done for done, _ in seen] == sorted(done for done, _ in seen)
    # the whole corpus at once, sorted by numpy
    x, q = rows.astype(np.float64), queries.astype(np.float64)
    raw_q, raw_c = (
        q / np.linalg.norm(q, axis=1, keepdims=True),
        x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300),
    )
    raw_scores = raw_q @ raw_c.astype(np.float32).astype(np.float64).T
    np.testing.assert_array_equal(floats.jobs[0]._state["rows"], ranked(raw_scores, 20, excluded))
    corpus6 = unit_rows(rotation_for(base).apply(rows), weights, 6)
    codes = int8.decode(int8.encode(corpus6), np.float64)
    np.testing.assert_array_equal(coded.jobs[0]._state["rows"], ranked(unit(key, weights, 6) @ codes.T, 20, excluded))
    q_bits, c_bits = unit(key, None, 4) > 0, unit_rows(rotation_for(base).apply(rows), None, 4) > 0
    distance = (q_bits[:, None, :] != c_bits[None, :, :]).sum(axis=2)
    np.testing.assert_array_equal(signs.jobs[0]._state["rows"], ranked(-distance.astype(float), 30, excluded))
    # the re-ranking: the candidates by their float32 vectors' scores, ties to the lower row
    rescored = unit(key, weights, 6) @ corpus6.astype(np.float32).astype(np.float64)[candidates[0]].T
    want = [candidates[0][np.lexsort((candidates[0], -scores))] for scores in rescored]
    np.testing.assert_array_equal(reranking.result().rows, want)


def test_slices_cover_the_corpus_in_order_within_their_size(tmp_path, monkeypatch):
    rows = np.arange(1000 * 4, dtype=np.float32).reshape(1000, 4)
    monkeypatch.setattr(search_module, "SLICE_BYTES", 8 * 4 * 70)  # 70 rows of 4 float64 values
    for corpus in (rows, open_source(write_h5(tmp_path / "s.h5", rows, chunk_rows=128))):
        for block_rows in (None, 128, 300):
            pieces = [
                (start, piece.copy()) for start, piece in corpus_slices(corpus, block_rows)
            ]  # valid until the next
            assert all(piece.shape[0] <= 70 for _, piece in pieces)
            assert [start for start, _ in pieces] == list(np.cumsum([0] + [p.shape[0] for _, p in pieces[:-1]]))
            np.testing.assert_array_equal(np.concatenate([piece for _, piece in pieces]), rows)
            if block_rows:  # no slice straddles two blocks
                assert all((start // block_rows) == ((start + p.shape[0] - 1) // block_rows) for start, p in pieces)
