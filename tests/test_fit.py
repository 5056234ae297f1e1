"""The fit loop: worker threads, block order, reproducibility."""

import threading

import numpy as np
import pytest
from conftest import anisotropic, write_h5, write_zarr

from streamwhiten.engine.fit import fit_sources, plan_fit, run_plan
from streamwhiten.errors import StoreIOError


def test_worker_threads_reuse_one_buffer_each_and_cover_every_row(tmp_path, monkeypatch):
    from streamwhiten.io.hdf5 import HDF5Source
    from streamwhiten.io.zarr import ZarrSource

    rows = anisotropic(1000, 5).astype(np.float32)
    buffers, ranges = set(), []
    for cls in (HDF5Source, ZarrSource):
        real = cls.read_into

        def recording(self, start, stop, out, real=real):
            if out.base is not None:  # a view of a worker's buffer (fingerprints read into fresh arrays)
                buffers.add(out.__array_interface__["data"][0])
                ranges.append((start, stop))
            return real(self, start, stop, out)

        monkeypatch.setattr(cls, "read_into", recording)
    for spec in (write_h5(tmp_path / "a.h5", rows, chunk_rows=64), write_zarr(tmp_path / "a.zarr", rows, 64)):
        buffers.clear(), ranges.clear()
        result = fit_sources(spec, block_rows=128, threads=3)
        assert sorted(ranges) == [(b, min(b + 128, 1000)) for b in range(0, 1000, 128)]
        assert len(buffers) <= 3
        np.testing.assert_allclose(result.state.mean, rows.astype(np.float64).mean(axis=0), rtol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_failing_read_stops_the_fit_and_leaves_no_worker_behind(tmp_path, monkeypatch, threads):
    from streamwhiten.io.hdf5 import HDF5Source

    spec = write_h5(tmp_path / "a.h5", anisotropic(2000, 4).astype(np.float32), chunk_rows=50)
    calls = {"n": 0}
    real = HDF5Source.read_into

    def failing(self, start, stop, out):
        calls["n"] += 1
        if calls["n"] == 5:
            raise StoreIOError("simulated read failure")
        return real(self, start, stop, out)

    monkeypatch.setattr(HDF5Source, "read_into", failing)
    with pytest.raises(StoreIOError, match="simulated"):
        fit_sources(spec, block_rows=50, threads=threads)
    assert calls["n"] < 10
    assert not any(t.name.startswith("streamwhiten-worker") and t.is_alive() for t in threading.enumerate())


def test_fit_is_bit_reproducible_and_independent_of_block_alignment_up_to_rounding(tmp_path):
    rows = anisotropic(5000, 7).astype(np.float32)
    spec = write_h5(tmp_path / "a.h5", rows, chunk_rows=100)
    first, second = fit_sources(spec, block_rows=300), fit_sources(spec, block_rows=300)
    assert first.state == second.state  # bit for bit
    other = fit_sources(spec, block_rows=700)
    np.testing.assert_allclose(other.state.scatter, first.state.scatter, rtol=1e-6)  # float32 products
    job = plan_fit(spec, block_rows=300)
    job.cursors[0].stop = 1200  # a partial job continued later gives the same bits
    run_plan(job)
    job.cursors[0].stop = 5000
    assert run_plan(job).state == first.state


def _zstd_zarr(path, data, chunk_rows) -> str:
    import zarr

    array = zarr.create_array(store=str(path), shape=data.shape, chunks=(chunk_rows, data.shape[1]), dtype=data.dtype)
    array[:] = data  # zarr 3's default codecs: bytes + zstd
    return str(path)


@pytest.mark.parametrize("kind", ["zarr-zstd", "zarr-zstd-f16", "hdf5-gzip", "hdf5"])
@pytest.mark.parametrize("block_rows, threads", [(None, 1), (50, 2), (97, 2), (1, 1)])
def test_a_pass_records_the_fingerprint_of_a_separate_read_without_reading_samples_twice(
    tmp_path, monkeypatch, kind, block_rows, threads
):
    """The pass hashes the sampled rows as it reads them (issue #18: on a compressed store each separate
    sampled read decoded a whole chunk): the fingerprint is the one :func:`fingerprint` computes, whatever
    the blocks (ranges cut across blocks, one-row blocks), and the pass reads no rows but its blocks."""
    import h5py

    from streamwhiten.io import Source, fingerprint, open_source

    data = anisotropic(1003, 6, seed=3).astype(np.float16 if kind.endswith("f16") else np.float32)
    if kind.startswith("zarr"):
        spec = _zstd_zarr(tmp_path / "x.zarr", data, 128)
    else:
        with h5py.File(tmp_path / "x.h5", "w") as handle:
            handle.create_dataset("emb", data=data, chunks=(128, 6), compression="gzip" if "gzip" in kind else None)
        spec = f"{tmp_path / 'x.h5'}:/emb"
    with open_source(spec) as source:
        expected = fingerprint(source)
    reads = []
    original = Source.read
    monkeypatch.setattr(
        Source, "read", lambda self, start, stop: reads.append((start, stop)) or original(self, start, stop)
    )
    result = fit_sources(spec, block_rows=block_rows, threads=threads)
    assert result.sources == [expected]
    assert reads == []


def test_a_checkpoint_records_whole_fingerprints_and_the_resumed_model_matches(tmp_path):
    """A checkpoint written part-way holds each fingerprint whole (the rows sampled so far plus the
    others, read then), so a resume checks the source; the finished model records the same fingerprints
    as an uninterrupted fit."""
    from streamwhiten.engine.fit import load_checkpoint, run_plan
    from streamwhiten.io import fingerprint, open_source

    data = anisotropic(900, 5, seed=4).astype(np.float32)
    first, second = _zstd_zarr(tmp_path / "a.zarr", data, 100), _zstd_zarr(tmp_path / "b.zarr", data[:300] * 2, 100)
    checkpoint = str(tmp_path / "fit.ckpt")
    calls = []

    def stop_after_three():
        calls.append(1)
        return len(calls) == 3

    plan = plan_fit([first, second], block_rows=100)
    with pytest.raises(Exception, match="interrupted"):
        run_plan(plan, checkpoint_path=checkpoint, should_stop=stop_after_three, threads=1)
    saved = load_checkpoint(checkpoint)
    expected = []
    for spec in (first, second):
        with open_source(spec) as source:
            expected.append(fingerprint(source))
    assert [cursor.fingerprint for cursor in saved.cursors] == expected
    assert saved.rows_done == 300
    resumed = run_plan(saved, threads=1).result()
    assert resumed.sources == expected == fit_sources([first, second], block_rows=100).sources
