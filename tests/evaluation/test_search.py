"""Exact search (evaluation.search): top lists equal a numpy sort with ties to the lower row, however the
corpus is cut into blocks and threads, for inner products and Hamming distances; equal to faiss where
faiss is exact; a streamed store gives what an array gives."""

import numpy as np
import pytest
from conftest import write_h5

from streamwhiten.core.kernels import search as kernels
from streamwhiten.errors import BadInputError
from streamwhiten.evaluation.search import Exclusions, RescoreJob, SearchJob, exact_search, rescore_all, search
from streamwhiten.io import open_source


def reference(values, depth, excluded=(), larger_is_better=True):
    """Per query: rows sorted by value (best first), ties to the lower row, excluded pairs dropped."""
    excluded = set(excluded)
    out = np.full((values.shape[0], depth), -1, np.int64)
    for q in range(values.shape[0]):
        rows = np.array([r for r in range(values.shape[1]) if (q, r) not in excluded], dtype=np.int64)
        key = -values[q, rows] if larger_is_better else values[q, rows]
        ranked = rows[np.lexsort((rows, key))][:depth]
        out[q, : ranked.size] = ranked
    return out


def hamming(a, b):
    return np.unpackbits(a[:, None, :] ^ b[None, :, :], axis=2).sum(axis=2)


@pytest.fixture
def tied():
    """Queries and corpus rows of small integers: inner products tie all over."""
    rng = np.random.default_rng(0)
    return rng.integers(-1, 2, (7, 5)).astype(np.float64), rng.integers(-1, 2, (301, 5)).astype(np.float64)


@pytest.mark.parametrize("block_rows", [1, 7, 64, 1000])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_inner_product_top_lists_break_ties_by_the_lower_row_across_blocks(tied, block_rows, threads):
    queries, corpus = tied
    pairs = [(0, 3), (0, 200), (4, 0), (6, 300)]
    exclude = Exclusions.from_pairs(7, [p[0] for p in pairs], [p[1] for p in pairs])
    result = exact_search(queries, corpus, 40, exclude=exclude, block_rows=block_rows, threads=threads)
    scores = queries @ corpus.T
    np.testing.assert_array_equal(result.rows, reference(scores, 40, pairs))
    np.testing.assert_array_equal(result.values, np.take_along_axis(scores, result.rows, axis=1))


@pytest.mark.parametrize("block_rows", [1, 13, 1000])
@pytest.mark.parametrize("n_bits", [5, 64, 72])
def test_hamming_top_lists_break_ties_by_the_lower_row_across_blocks(block_rows, n_bits):
    rng = np.random.default_rng(n_bits)
    corpus = np.packbits(rng.random((500, n_bits)) < 0.5, axis=1)
    corpus[400] = corpus[3]  # duplicates on both sides of block boundaries
    queries = np.packbits(rng.random((9, n_bits)) < 0.5, axis=1)
    queries[1] = corpus[3]
    pairs = [(1, 3), (2, 17)]
    exclude = Exclusions.from_pairs(9, [1, 2], [3, 17])
    result = exact_search(queries, corpus, 60, metric="hamming", exclude=exclude, block_rows=block_rows, threads=2)
    distances = hamming(queries, corpus)
    np.testing.assert_array_equal(result.rows, reference(distances, 60, pairs, larger_is_better=False))
    np.testing.assert_array_equal(result.values, np.take_along_axis(distances, result.rows, axis=1))
    if n_bits >= 64:  # no other row at distance 0: its own row excluded, the duplicate comes first
        assert result.rows[1, 0] == 400 and result.values[1, 0] == 0


def test_a_corpus_smaller_than_the_depth_pads_the_lists(tied):
    queries, corpus = tied
    exclude = Exclusions.from_pairs(7, [2], [1])
    result = exact_search(queries, corpus[:4], 6, exclude=exclude)
    assert (result.rows[:, 4:] == -1).all() and (result.rows[2, 3:] == -1).all()
    assert np.isneginf(result.values[:, 4:]).all()
    bits = exact_search(np.zeros((1, 1), np.uint8), np.zeros((2, 1), np.uint8), 3, metric="hamming")
    assert bits.rows.tolist() == [[0, 1, -1]] and bits.values[0, 2] == np.iinfo(np.int64).max


def test_a_streamed_store_gives_what_the_array_gives_and_prepare_sees_each_row_once(tmp_path):
    rng = np.random.default_rng(2)
    corpus = rng.standard_normal((1000, 8)).astype(np.float32)
    queries = rng.standard_normal((20, 8)).astype(np.float32)
    spec = write_h5(tmp_path / "c.h5", corpus, chunk_rows=128)
    starts = []

    def prepare(rows, start):
        starts.append((start, rows.shape[0]))
        return rows.astype(np.float64) * 2

    with open_source(spec) as source:
        job = SearchJob(queries.astype(np.float64), 30, "ip", prepare)
        streamed = search(source, [job], block_rows=256, threads=2)[0]
    in_memory = exact_search(queries.astype(np.float64), corpus.astype(np.float64) * 2, 30)
    np.testing.assert_array_equal(streamed.rows, in_memory.rows)
    np.testing.assert_array_equal(streamed.values, in_memory.values)
    covered = np.zeros(1000, int)
    for start, n in starts:
        covered[start : start + n] += 1
    assert (covered == 1).all()


def test_several_jobs_share_one_pass():
    rng = np.random.default_rng(3)
    corpus = rng.standard_normal((300, 16))
    queries = rng.standard_normal((5, 16))
    bits = lambda rows, start: np.packbits(rows > 0, axis=1)  # noqa: E731
    jobs = [SearchJob(queries, 10), SearchJob(np.packbits(queries > 0, axis=1), 12, "hamming", bits)]
    float_result, bit_result = search(corpus, jobs, block_rows=64, threads=2)
    np.testing.assert_array_equal(float_result.rows, exact_search(queries, corpus, 10).rows)
    np.testing.assert_array_equal(
        bit_result.rows, exact_search(jobs[1].queries, np.packbits(corpus > 0, axis=1), 12, metric="hamming").rows
    )


def test_rescore_ranks_the_candidates_by_inner_product_ties_to_the_lower_row(tmp_path):
    rng = np.random.default_rng(4)
    corpus = rng.integers(-2, 3, (400, 6)).astype(np.float32)
    queries = rng.integers(-2, 3, (5, 6)).astype(np.float64)
    candidates = np.stack([rng.choice(400, 30, replace=False) for _ in range(5)])
    candidates[0, 25:] = -1
    spec = write_h5(tmp_path / "c.h5", corpus, chunk_rows=50)
    with open_source(spec) as source:
        result = rescore_all(source, [RescoreJob(queries, candidates, 20)], block_rows=64)[0]
    scores = queries @ corpus.T.astype(np.float64)
    for q in range(5):
        rows = candidates[q][candidates[q] >= 0]
        expected = rows[np.lexsort((rows, -scores[q, rows]))][:20]
        np.testing.assert_array_equal(result.rows[q], expected)
        np.testing.assert_array_equal(result.values[q], scores[q, expected])
    assert rescore_all(corpus, [RescoreJob(queries, candidates[:, :3], 5)])[0].rows[:, 3:].tolist() == [[-1, -1]] * 5


def test_equal_to_faiss_flat_indexes():
    faiss = pytest.importorskip("faiss")
    rng = np.random.default_rng(5)
    corpus = rng.standard_normal((3000, 32)).astype(np.float32)
    queries = rng.standard_normal((40, 32)).astype(np.float32)
    index = faiss.IndexFlatIP(32)
    index.add(corpus)
    distances, ids = index.search(queries, 50)
    ours = exact_search(queries, corpus, 50, block_rows=700, threads=2)
    # float32 products from two BLAS builds may differ in the last bits: compare where no near-tie is
    exact = queries.astype(np.float64) @ corpus.T.astype(np.float64)
    ranked = np.sort(exact, axis=1)[:, ::-1][:, :51]
    clear = np.min(np.abs(np.diff(ranked, axis=1)), axis=1) > 1e-4
    assert clear.sum() > 30
    np.testing.assert_array_equal(ours.rows[clear], ids[clear])
    np.testing.assert_allclose(ours.values, distances, rtol=0, atol=1e-4)
    # bits: integer distances, so faiss is exact; its ties go to the lower id too
    bits, query_bits = np.packbits(corpus > 0, axis=1), np.packbits(queries > 0, axis=1)
    binary = faiss.IndexBinaryFlat(32)
    binary.add(bits)
    distances, ids = binary.search(query_bits, 50)
    ours = exact_search(query_bits, bits, 50, metric="hamming", block_rows=700, threads=2)
    np.testing.assert_array_equal(ours.rows, ids)
    np.testing.assert_array_equal(ours.values, distances)


def test_the_hamming_kernel_counts_bits_with_popcnt():
    with open("/proc/cpuinfo") as handle:
        if " popcnt" not in handle.read():
            pytest.skip("this CPU has no popcnt instruction")
    import numba

    kernel = numba.njit(nogil=True)(kernels.merge_top_hamming.py_func)  # uncached: its assembly can be read
    words = np.zeros((1, 1), np.uint64)
    top = np.zeros((1, 1), np.int64)
    kernel(words, words, 0, 0, 1, top, top.copy(), np.zeros(2, np.int64), np.zeros(0, np.int64))
    assembly = "\n".join(kernel.inspect_asm().values())
    assert "popcnt" in assembly  # popcnt, or vpopcntq where the loop is vectorised


def test_bad_searches_are_refused():
    with pytest.raises(BadInputError, match="float32 or float64 queries"):
        exact_search(np.zeros((2, 3), np.int32), np.zeros((4, 3)), 2)
    with pytest.raises(BadInputError, match="uint8 rows of packed bits"):
        exact_search(np.zeros((2, 3)), np.zeros((4, 3)), 2, metric="hamming")
    with pytest.raises(BadInputError, match="expected 4 rows of 3 values"):
        exact_search(np.zeros((2, 3)), np.zeros((4, 5)), 2)
    with pytest.raises(BadInputError, match="metric must be one of"):
        exact_search(np.zeros((2, 3)), np.zeros((4, 3)), 2, metric="l2")
    with pytest.raises(BadInputError, match="depth must be"):
        exact_search(np.zeros((2, 3)), np.zeros((4, 3)), 0)
    with pytest.raises(BadInputError, match="names a query outside"):
        Exclusions.from_pairs(2, [2], [0])
