"""Scratch buffers: alignment, reuse within a run and across runs, and release."""

import gc
import os

import h5py
import numpy as np
import pytest

from streamwhiten import _buffers
from streamwhiten._buffers import ALIGNMENT, BufferPool, PerThread
from streamwhiten.options import ApplyOptions, ReadOptions


def count_allocations(monkeypatch) -> list:
    """Sizes of the new buffers allocated from now on."""
    allocations, allocate = [], _buffers._allocate

    def counting(n_bytes):
        allocations.append(n_bytes)
        return allocate(n_bytes)

    monkeypatch.setattr(_buffers, "_allocate", counting)
    return allocations


@pytest.fixture(autouse=True)
def empty_cache():
    _buffers.release_buffers()
    yield
    _buffers.release_buffers()


@pytest.mark.parametrize(
    "shape,dtype",
    [
        ((3, 5), np.float32),
        ((1000, 7), np.float16),
        ((4, 4096), np.float64),
        ((0, 3), np.float32),
        ((1 << 20,), np.uint8),
    ],
)
def test_taken_buffers_are_aligned_and_usable(shape, dtype):
    array = _buffers.take(shape, dtype)
    assert array.shape == shape and array.dtype == dtype and array.flags.c_contiguous and array.flags.writeable
    assert array.size == 0 or array.ctypes.data % ALIGNMENT == 0
    array[...] = 1
    assert (array == 1).all()


def test_a_buffer_given_back_serves_the_next_request_that_fits():
    first = _buffers.take((100, 8), np.float32)
    _buffers.give_back(first)
    assert _buffers.cached_bytes() == 3200
    smaller = _buffers.take((10, 8), np.float64)  # 640 bytes fit in 3,200: the same memory
    assert smaller.base is first.base and _buffers.cached_bytes() == 0
    _buffers.give_back(smaller)
    larger = _buffers.take((200, 8), np.float32)  # too small: dropped, a new one allocated
    assert larger.base is not first.base and _buffers.cached_bytes() == 0


def test_the_smallest_fitting_buffer_is_taken():
    big, small = _buffers.take((1000,), np.float64), _buffers.take((100,), np.float64)
    _buffers.give_back(big)
    _buffers.give_back(small)
    assert _buffers.take((50,), np.float64).base is small.base
    assert _buffers.take((50,), np.float64).base is big.base


def test_release_frees_what_is_kept_and_foreign_arrays_are_ignored():
    buffer = _buffers.take((256,), np.float32)
    _buffers.give_back(buffer)
    _buffers.give_back(buffer)  # twice: kept once
    _buffers.give_back(np.empty(10))  # not from the cache
    assert _buffers.cached_bytes() == 1024
    assert _buffers.release_buffers() == 1024 and _buffers.cached_bytes() == 0


def test_a_buffer_never_given_back_is_collected():
    import weakref

    buffer = _buffers.take((1000,), np.float32)
    owner = weakref.ref(buffer.base)
    del buffer
    gc.collect()
    assert owner() is None and _buffers.cached_bytes() == 0


def test_per_thread_buffers_are_one_per_thread_and_released_together():
    import threading

    buffers = PerThread((4, 3), np.float32)
    mine = buffers.get()
    assert buffers.get() is mine and mine.shape == (4, 3)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(buffers.get()))
    worker.start()
    worker.join()
    assert seen[0].base is not mine.base
    buffers.release()
    assert _buffers.cached_bytes() == 2 * 48
    with pytest.raises(RuntimeError, match="after its run ended"):
        buffers.get()  # the buffer now belongs to the cache


def test_buffer_pool_reuses_what_is_given_back_and_keeps_only_free_ones():
    pool = BufferPool((4, 3), np.float32)
    first, second = pool.take(), pool.take()
    assert first is not second and first.shape == (4, 3) and first.dtype == np.float32
    pool.give_back(first)
    assert pool.take() is first
    pool.give_back(first)
    pool.release()  # ``second`` is still out: not kept
    assert _buffers.cached_bytes() == 48


def test_fits_and_applies_reuse_the_buffers_of_the_run_before(tmp_path, monkeypatch):
    from conftest import anisotropic, write_h5

    from streamwhiten import Whitener
    from streamwhiten.engine.apply import apply_model
    from streamwhiten.engine.fit import fit_sources

    rows = anisotropic(3000, 16).astype(np.float32)
    spec = write_h5(tmp_path / "x.h5", rows, chunk_rows=500)
    model = Whitener(n_components=8).fit(rows).model_
    expected = model.transform(rows)
    _buffers.release_buffers()
    block = 1000 * 16 * 4
    first = fit_sources(spec, block_rows=1000, threads=2).state
    assert block <= _buffers.cached_bytes() <= 2 * block  # a block buffer per worker that ran, kept
    allocations = count_allocations(monkeypatch)
    for _ in range(3):  # reused, not added to: the cache never holds more than one run had in use
        assert fit_sources(spec, block_rows=1000, threads=2).state == first  # same bits from reused memory
        assert block <= _buffers.cached_bytes() <= 2 * block
    assert len(allocations) <= 1  # at most a second worker's buffer, if only one worker ran the first time
    apply_model(model, spec, str(tmp_path / "y.h5:/y"), ApplyOptions(), ReadOptions(block_rows=1000), threads=2)
    with h5py.File(tmp_path / "y.h5") as handle:
        np.testing.assert_allclose(handle["y"][:], expected, rtol=1e-5, atol=1e-6)
    # input blocks (one per worker) and output blocks (1000 x 8 float32, in flight between threads)
    assert block <= _buffers.cached_bytes() <= 2 * block + 6 * 32000


def test_an_error_mid_run_keeps_the_buffers_and_an_interrupt_drops_them(tmp_path, monkeypatch):
    from conftest import anisotropic, write_h5

    from streamwhiten.engine.fit import fit_sources
    from streamwhiten.errors import NonFiniteError
    from streamwhiten.io.hdf5 import HDF5Source

    rows = anisotropic(4000, 8).astype(np.float32)
    clean = write_h5(tmp_path / "clean.h5", rows, chunk_rows=500)
    bad_rows = rows.copy()
    bad_rows[2500, 3] = np.nan
    bad = write_h5(tmp_path / "bad.h5", bad_rows, chunk_rows=500)
    reference = fit_sources(clean, block_rows=1000, threads=2).state
    _buffers.release_buffers()
    with pytest.raises(NonFiniteError, match="row 2500"):  # an ordinary error: the workers were joined
        fit_sources(bad, block_rows=1000, threads=2)
    assert _buffers.cached_bytes() > 0
    assert fit_sources(clean, block_rows=1000, threads=2).state == reference

    read_into = HDF5Source.read_into

    def interrupted(self, start, stop, out):
        if start >= 2000:
            raise KeyboardInterrupt  # as a Ctrl-C that cut short the wait for the workers would
        return read_into(self, start, stop, out)

    _buffers.release_buffers()
    monkeypatch.setattr(HDF5Source, "read_into", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fit_sources(clean, block_rows=1000, threads=1)
    assert _buffers.cached_bytes() == 0  # something might still write them: not kept
    monkeypatch.setattr(HDF5Source, "read_into", read_into)
    assert fit_sources(clean, block_rows=1000, threads=2).state == reference


def resident_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096


def test_trim_heap_hands_the_freed_heap_back_to_the_system():
    """Memory freed in the middle of the C heap stays resident until trimmed (glibc's ``malloc_trim``)."""
    if _buffers._malloc_trim() is None:
        assert _buffers.trim_heap() is False  # not glibc: nothing to do, and it says so
        return
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("no /proc to read the resident size from")
    _buffers.trim_heap()
    pieces = [np.ones(8000) for _ in range(8000)]  # 64 KB each: from the heap, not mapped one by one
    pinned = np.ones(8000)  # allocated after them, at the heap's top: free() alone trims nothing below it
    del pieces[:]
    gc.collect()
    before = resident_bytes()
    assert _buffers.trim_heap() is True
    assert before - resident_bytes() > 256 << 20  # most of the 512 MB freed goes back
    assert pinned.sum() == 8000
