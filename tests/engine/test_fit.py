"""The fit loop: worker threads, block order, reproducibility."""

import threading
from dataclasses import replace

import numpy as np
import pytest
from conftest import anisotropic, write_h5, write_zarr

from streamwhiten.engine.fit import Checkpoint, fit_sources, plan_fit, run_plan
from streamwhiten.errors import StoreIOError
from streamwhiten.progress import Watch


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


def _three_zarr_sources(tmp_path):
    data = anisotropic(900, 5, seed=4).astype(np.float32)
    return [
        _zstd_zarr(tmp_path / "a.zarr", data[:300], 100),
        _zstd_zarr(tmp_path / "b.zarr", data[300:800] * 2, 100),
        _zstd_zarr(tmp_path / "c.zarr", data[800:] - 1, 100),
    ]


def _stop_after(blocks: int):
    calls = []

    def should_stop():
        calls.append(1)
        return len(calls) == blocks

    return should_stop


def test_checkpoints_read_no_rows_of_their_own(tmp_path, monkeypatch):
    """A checkpoint records, for the source being read, the hash of its sampled rows read so far, and
    nothing for sources not reached: so checkpoints (every block here) cost no reads, and a fit of
    several compressed shards decodes each chunk once."""
    from streamwhiten.engine.fit import run_plan
    from streamwhiten.io import Source, fingerprint, open_source

    specs = _three_zarr_sources(tmp_path)
    expected = []
    for spec in specs:
        with open_source(spec) as source:
            expected.append(fingerprint(source))
    reads = []
    original = Source.read
    monkeypatch.setattr(Source, "read", lambda self, a, b: reads.append((self.label, a, b)) or original(self, a, b))
    done = run_plan(plan_fit(specs, block_rows=100), checkpoint=Checkpoint(str(tmp_path / "ck"), every_blocks=1))
    assert reads == []
    assert done.result().sources == expected


def test_a_resume_checks_the_rows_read_before_the_checkpoint_and_matches_an_uninterrupted_fit(tmp_path):
    """Stopped inside the second of three sources: the checkpoint holds the first source's whole
    fingerprint, the second's hash of sampled rows before the stop, nothing for the third. A resume
    gives the model of an uninterrupted fit; it refuses when a row read before the stop was changed,
    and reads a source not reached yet as it is now."""
    from streamwhiten.engine.fit import check_sources_unchanged, load_checkpoint, run_plan
    from streamwhiten.errors import BadInputError, InterruptedRunError
    from streamwhiten.io import Sampler, describe, fingerprint, open_source

    specs = _three_zarr_sources(tmp_path)
    checkpoint = str(tmp_path / "fit.ckpt")
    with pytest.raises(InterruptedRunError):
        run_plan(
            plan_fit(specs, block_rows=100),
            checkpoint=Checkpoint(checkpoint),
            watch=Watch(should_stop=_stop_after(5)),
            threads=2,
        )
    saved = load_checkpoint(checkpoint)
    assert saved.rows_done == 500 and [c.next_row for c in saved.cursors] == [300, 200, 0]
    with open_source(specs[0]) as first, open_source(specs[1]) as second, open_source(specs[2]) as third:
        assert saved.cursors[0].fingerprint == fingerprint(first)
        partial = replace(describe(second), rows_read=200, sha256_read=Sampler(second).hexdigest(second, below=200))
        assert saved.cursors[1].fingerprint == partial
        assert saved.cursors[2].fingerprint == describe(third)
    check_sources_unchanged(saved, checkpoint)
    resumed = run_plan(saved, threads=2).result()
    uninterrupted = fit_sources(specs, block_rows=100)
    assert resumed.sources == uninterrupted.sources
    np.testing.assert_array_equal(resumed.state.scatter, uninterrupted.state.scatter)

    import zarr

    third = zarr.open_array(specs[2], mode="r+")
    third[0] = third[0] + 1.0  # not read before the stop: the resume reads it as it is now
    check_sources_unchanged(load_checkpoint(checkpoint), checkpoint)
    second = zarr.open_array(specs[1], mode="r+")
    second[0] = second[0] + 1.0  # read before the stop (row 0 is sampled): refused
    with pytest.raises(BadInputError, match=r"b\.zarr: its first 200 rows differ .*sha256_read"):
        check_sources_unchanged(load_checkpoint(checkpoint), checkpoint)


def test_a_checkpointed_plan_with_an_empty_source_resumes(tmp_path):
    from streamwhiten.engine.fit import check_sources_unchanged, load_checkpoint, run_plan
    from streamwhiten.errors import InterruptedRunError

    data = anisotropic(400, 5, seed=6).astype(np.float32)
    specs = [_zstd_zarr(tmp_path / "a.zarr", data, 100), _zstd_zarr(tmp_path / "e.zarr", data[:0], 100)]
    checkpoint = str(tmp_path / "fit.ckpt")
    with pytest.raises(InterruptedRunError):
        run_plan(
            plan_fit(specs, block_rows=100),
            checkpoint=Checkpoint(checkpoint),
            watch=Watch(should_stop=_stop_after(2)),
            threads=1,
        )
    saved = load_checkpoint(checkpoint)
    check_sources_unchanged(saved, checkpoint)
    assert run_plan(saved, threads=1).result().sources == fit_sources(specs, block_rows=100).sources
