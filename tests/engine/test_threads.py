"""The block-parallel executor: order, bounded memory, errors, and the engines built on it."""

import threading
import time

import numpy as np
import pytest

from streamwhiten import ReadOptions, Whitener
from streamwhiten.core import stats
from streamwhiten.engine._threads import blas_threads, ordered_map, resolve_threads
from streamwhiten.engine.fit import fit_sources, fold_array
from streamwhiten.errors import BadInputError


def test_ordered_map_keeps_item_order_whatever_finishes_first():
    def slow_for_even(i):
        time.sleep(0.02 if i % 2 == 0 else 0.0)
        return i * i

    assert list(ordered_map(slow_for_even, ((i,) for i in range(20)), 3)) == [i * i for i in range(20)]
    assert list(ordered_map(slow_for_even, ((i,) for i in range(5)), 1)) == [0, 1, 4, 9, 16]


def test_ordered_map_bounds_the_work_in_flight():
    started, consumed = [], []
    lock = threading.Lock()

    def work(i):
        with lock:
            started.append(i)
        return i

    for value in ordered_map(work, ((i,) for i in range(50)), 2):
        time.sleep(0.002)  # a slow consumer must not let the producers run ahead
        with lock:
            assert len(started) <= len(consumed) + 1 + 3  # threads + 1 in flight, plus the one being yielded
        consumed.append(value)
    assert consumed == list(range(50))


def test_ordered_map_reraises_a_worker_error_and_stops_early():
    ran = []

    def work(i):
        ran.append(i)
        if i == 3:
            raise ValueError("bad block 3")
        return i

    seen = []
    with pytest.raises(ValueError, match="bad block 3"):
        for value in ordered_map(work, ((i,) for i in range(1000)), 2):
            seen.append(value)
    assert seen == [0, 1, 2]
    assert len(ran) < 20  # nothing past the error's neighbourhood was started


def test_closing_the_consumer_early_stops_the_workers():
    ran = []
    results = ordered_map(lambda i: ran.append(i) or i, ((i,) for i in range(1000)), 2)
    assert next(results) == 0
    results.close()
    assert len(ran) < 10
    assert not [t for t in threading.enumerate() if t.name.startswith("streamwhiten-worker")]


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2", True])
def test_thread_counts_are_validated(bad):
    with pytest.raises(BadInputError, match="threads"):
        resolve_threads(bad)
    with pytest.raises(BadInputError, match="threads"):
        Whitener(n_jobs=bad).fit(np.ones((4, 2)))


def test_minus_one_means_one_thread_per_core():
    from streamwhiten.engine._threads import available_cores

    assert resolve_threads(-1) == available_cores() >= 1
    assert Whitener(n_jobs=-1).fit(np.random.default_rng(0).standard_normal((50, 3))).n_samples_seen_ == 50


def test_an_error_from_the_items_comes_after_the_results_before_it():
    def items():
        for i in range(10):
            if i == 6:
                raise OSError("cannot open item 6")
            yield (i,)

    seen = []
    with pytest.raises(OSError, match="item 6"):
        for value in ordered_map(lambda i: i, items(), 3):
            seen.append(value)
    assert seen == [0, 1, 2, 3, 4, 5]


def test_overlapping_blas_limits_restore_the_original_once():
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def counts():
        return [pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]

    before = counts()
    outer = blas_threads(1)
    outer.__enter__()
    inner = blas_threads(1)
    inner.__enter__()
    outer.__exit__(None, None, None)  # the first one out (another thread, say) must not restore yet
    assert set(counts()) <= {1}
    inner.__exit__(None, None, None)
    assert counts() == before


def test_workers_run_blas_with_the_limit_and_it_is_lifted_after():
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas_counts(_):
        return [pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]

    before = blas_counts(None)
    seen = list(ordered_map(blas_counts, ((i,) for i in range(6)), 2, 1))
    assert all(set(counts) <= {1} for counts in seen)
    assert blas_counts(None) == before


def test_blas_limit_is_restored():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    before = [pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]
    with blas_threads(1):
        inside = [pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]
    after = [pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]
    assert set(inside) <= {1} and after == before


@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 1e-6), (np.float64, 1e-12)])
def test_any_thread_count_gives_the_two_pass_statistics(dtype, tolerance):
    rows = (np.random.default_rng(3).standard_normal((5000, 24)) * 2 + 50).astype(dtype)
    reference = np.cov(rows.astype(np.float64), rowvar=False, bias=True)
    for threads in (1, 2, 3, 7):
        state, skipped = fold_array(stats.Moments.empty(24), rows, 512, threads=threads)
        assert skipped == 0 and state.n_rows == 5000
        np.testing.assert_allclose(state.mean, rows.astype(np.float64).mean(axis=0), rtol=tolerance)
        error = np.linalg.norm(stats.covariance(state) - reference) / np.linalg.norm(reference)
        assert error <= tolerance


def test_same_threads_same_bits_and_store_equals_memory(tmp_path):
    import h5py

    rows = np.random.default_rng(4).standard_normal((9000, 16)).astype(np.float32) + 3
    path = tmp_path / "rows.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("x", data=rows, chunks=(1000, 16))
    first = fit_sources(f"{path}:/x", block_rows=2000, threads=3).state
    again = fit_sources(f"{path}:/x", block_rows=2000, threads=3).state
    memory = Whitener(read=ReadOptions(block_rows=2000), n_jobs=3).fit(rows).state_
    assert first == again == memory


def test_a_nonfinite_row_is_reported_at_its_index_with_many_threads():
    rows = np.ones((10000, 4))
    rows[:, 0] = np.arange(10000)
    rows[7777, 2] = np.nan
    with pytest.raises(stats.NonFiniteError, match="row 7777"):
        fold_array(stats.Moments.empty(4), rows, 1000, threads=3)
    state, skipped = fold_array(stats.Moments.empty(4), rows, 1000, skip_nonfinite=True, threads=3)
    assert skipped == 1 and state.n_rows == 9999


def test_sources_of_different_dtypes_in_one_fit(tmp_path):
    import h5py

    rng = np.random.default_rng(5)
    parts = [rng.standard_normal((700, 6)).astype(dtype) + 2 for dtype in (np.float16, np.float64, np.float32)]
    specs = []
    for index, part in enumerate(parts):
        path = tmp_path / f"part{index}.h5"
        with h5py.File(path, "w") as handle:
            handle.create_dataset("x", data=part, chunks=(100, 6))
        specs.append(f"{path}:/x")
    state = fit_sources(specs, block_rows=200, threads=2).state
    rows = np.vstack([part.astype(np.float64) for part in parts])
    np.testing.assert_allclose(state.mean, rows.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(
        state.scatter / state.n_rows, np.cov(rows, rowvar=False, bias=True), rtol=1e-5, atol=1e-6
    )
