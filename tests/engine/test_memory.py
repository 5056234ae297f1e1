"""A fit streams: its peak memory does not grow with the number of rows."""

import tracemalloc

from streamwhiten import release_buffers
from streamwhiten.engine.fit import fit_sources
from streamwhiten.synthetic import write_store

CHUNK_ROWS, N_FEATURES, THREADS = 4096, 64, 2
CHUNK_BYTES = CHUNK_ROWS * N_FEATURES * 4


def peak_bytes_of_fit(spec):
    release_buffers()  # count the block buffers: new ones, not those a fit before this one kept
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = fit_sources(spec, block_rows=CHUNK_ROWS, threads=THREADS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


def test_peak_memory_is_bounded_and_independent_of_rows(tmp_path):
    """Plain stores (no checksums): each chunk is read straight into its block's buffer."""
    small = write_store(str(tmp_path / "small.h5"), 20 * CHUNK_ROWS, N_FEATURES, chunk_rows=CHUNK_ROWS, checksums=False)
    large = write_store(
        str(tmp_path / "large.zarr"), 80 * CHUNK_ROWS, N_FEATURES, chunk_rows=CHUNK_ROWS, checksums=False
    )
    fit_sources(small, block_rows=CHUNK_ROWS)  # compile kernels outside the measurement
    small_result, small_peak = peak_bytes_of_fit(small)
    large_result, large_peak = peak_bytes_of_fit(large)
    assert large_result.state.n_rows == 80 * CHUNK_ROWS  # every row was read
    store_bytes = 80 * CHUNK_BYTES
    # one block per worker thread + a few d x d float64 matrices per thread (results in flight) and for
    # the state, + 1 MiB of slack
    budget = THREADS * CHUNK_BYTES + (6 + 2 * THREADS) * N_FEATURES * N_FEATURES * 8 + (1 << 20)
    assert large_peak < budget, (large_peak, budget)
    assert large_peak < store_bytes / 10
    assert large_peak < 1.5 * small_peak + (1 << 20)


def test_peak_memory_with_checksums_is_bounded_and_independent_of_rows(tmp_path):
    """Stores with a checksum per chunk (as streamwhiten writes them by default): a chunk's stored bytes are
    read, verified and copied into the block, so each worker holds up to two more chunk-sized buffers; the
    peak is still flat in the rows."""
    small = write_store(str(tmp_path / "small.h5"), 20 * CHUNK_ROWS, N_FEATURES, chunk_rows=CHUNK_ROWS)
    large = write_store(str(tmp_path / "large.zarr"), 80 * CHUNK_ROWS, N_FEATURES, chunk_rows=CHUNK_ROWS)
    fit_sources(small, block_rows=CHUNK_ROWS)
    _, small_peak = peak_bytes_of_fit(small)
    large_result, large_peak = peak_bytes_of_fit(large)
    assert large_result.state.n_rows == 80 * CHUNK_ROWS
    budget = 3 * THREADS * CHUNK_BYTES + (6 + 2 * THREADS) * N_FEATURES * N_FEATURES * 8 + (1 << 20)
    assert large_peak < budget, (large_peak, budget)
    assert large_peak < 80 * CHUNK_BYTES / 10
    assert large_peak < 1.1 * small_peak + (1 << 20)
