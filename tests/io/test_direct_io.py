"""Writes around the page cache: alignment, the buffered fallbacks, and outputs written that way."""

import errno
import os

import h5py
import numpy as np
import pytest
from conftest import anisotropic, write_h5, write_zarr

from streamwhiten import Whitener
from streamwhiten._buffers import ALIGNMENT
from streamwhiten._buffers import take as aligned_empty
from streamwhiten.engine.apply import apply_model
from streamwhiten.io import OUTPUT_CHUNK_BYTES, aligned_chunk_rows, open_source, output_chunk_rows, read_attrs
from streamwhiten.io import direct as _direct_io
from streamwhiten.io.direct import ChunkFile, direct_writable
from streamwhiten.options import ApplyOptions, ReadOptions

needs_o_direct = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="this platform has no O_DIRECT")


def skip_unless_o_direct(directory):
    """Skip when the file system of ``directory`` refuses O_DIRECT (then only buffered writes exist)."""
    probe = os.path.join(directory, "probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
    except OSError:
        pytest.skip(f"the file system of {directory} refuses O_DIRECT")
    os.close(fd)
    os.remove(probe)


@pytest.fixture
def record_writes(monkeypatch):
    """Every positional write as ``(direct, offset, n_bytes)``, direct when its descriptor has O_DIRECT."""
    import fcntl

    writes = []
    real = _direct_io._pwrite_all

    def writing(fd, view, offset):
        direct = bool(getattr(os, "O_DIRECT", 0) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        writes.append((direct, offset, view.nbytes))
        real(fd, view, offset)

    monkeypatch.setattr(_direct_io, "_pwrite_all", writing)
    return writes


def test_direct_writable_needs_address_offset_and_length_aligned():
    block = aligned_empty((2, 1024), np.float32)  # 8 KiB
    assert direct_writable(0, block) == hasattr(os, "O_DIRECT")
    assert not direct_writable(512, block)
    assert not direct_writable(0, block[:, :1000])  # not contiguous
    assert not direct_writable(0, block.reshape(-1)[1:1025])  # address off by 4 bytes
    assert not direct_writable(0, block.reshape(-1)[:1000])  # length not a multiple


@needs_o_direct
def test_chunk_file_writes_aligned_data_directly_and_the_rest_buffered(tmp_path, record_writes):
    path = str(tmp_path / "f.bin")
    aligned = aligned_empty((ALIGNMENT // 4,), np.float32)
    aligned[:] = np.arange(aligned.size)
    odd = np.arange(10, dtype=np.float32)
    skip_unless_o_direct(tmp_path)
    with ChunkFile(path, create=True) as handle:
        assert handle.direct
        handle.write_at(2 * ALIGNMENT, aligned)
        handle.write_at(100, odd)
    assert record_writes == [(True, 2 * ALIGNMENT, ALIGNMENT), (False, 100, 40)]
    data = np.fromfile(path, dtype=np.uint8)
    assert data.size == 3 * ALIGNMENT
    np.testing.assert_array_equal(data[2 * ALIGNMENT :].view(np.float32), aligned)
    np.testing.assert_array_equal(data[100:140].view(np.float32), odd)
    assert not data[:100].any() and not data[140 : 2 * ALIGNMENT].any()


def test_file_system_refusing_o_direct_gets_buffered_writes(tmp_path, monkeypatch):
    real_open = os.open

    def refusing(path, flags, *args):
        if getattr(os, "O_DIRECT", 0) and flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(_direct_io.os, "open", refusing)
    block = aligned_empty((ALIGNMENT // 4,), np.float32)
    block[:] = 3.5
    with ChunkFile(str(tmp_path / "f.bin"), create=True) as handle:
        assert not handle.direct
        handle.write_at(0, block)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "f.bin", dtype=np.float32), block)


@needs_o_direct
def test_direct_write_refused_at_write_time_falls_back_for_good(tmp_path, monkeypatch):
    real = _direct_io._pwrite_all
    calls = []

    def refusing(fd, view, offset):
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EINVAL, "Invalid argument")
        real(fd, view, offset)

    monkeypatch.setattr(_direct_io, "_pwrite_all", refusing)
    block = aligned_empty((2, ALIGNMENT // 4), np.float32)
    block[:] = np.arange(block.size).reshape(block.shape)
    skip_unless_o_direct(tmp_path)
    with ChunkFile(str(tmp_path / "f.bin"), create=True) as handle:
        assert handle.direct
        handle.write_at(0, block[0])
        assert not handle.direct  # later writes go buffered without trying again
        handle.write_at(ALIGNMENT, block[1])
    assert len(calls) == 3 and calls[1] == calls[2]
    np.testing.assert_array_equal(np.fromfile(tmp_path / "f.bin", dtype=np.float32), block.reshape(-1))


def test_other_write_errors_are_not_swallowed(tmp_path, monkeypatch):
    def full(fd, view, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_direct_io, "_pwrite_all", full)
    with ChunkFile(str(tmp_path / "f.bin"), create=True) as handle, pytest.raises(OSError, match="No space"):
        handle.write_at(0, aligned_empty((ALIGNMENT,), np.uint8))


@pytest.mark.parametrize("n_features", [1, 3, 16, 100, 256, 384, 1000, 4096])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_output_chunks_are_whole_alignment_blocks_when_possible(n_features, dtype):
    row_bytes = n_features * np.dtype(dtype).itemsize
    for n_rows in (1, 5, 10_000, 10_000_000):
        rows = output_chunk_rows(n_features, dtype, n_rows)
        assert 1 <= rows <= n_rows
        assert rows * row_bytes <= max(OUTPUT_CHUNK_BYTES, row_bytes)
        if rows < n_rows:
            assert rows * row_bytes % ALIGNMENT == 0 or rows * row_bytes < ALIGNMENT
            assert rows * row_bytes > OUTPUT_CHUNK_BYTES // 2 or rows * row_bytes < ALIGNMENT


@pytest.fixture
def rows():
    return anisotropic(5000, 32, seed=21).astype(np.float32)


@needs_o_direct
@pytest.mark.parametrize("suffix", [".h5", ".zarr"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_outputs_written_directly_equal_buffered_ones_and_the_transform(tmp_path, rows, suffix, dtype, record_writes):
    skip_unless_o_direct(tmp_path)
    model = Whitener(n_components=16).fit(rows).model_
    source = write_h5(tmp_path / "in.h5", rows, chunk_rows=1000)
    direct, buffered = str(tmp_path / f"direct{suffix}"), str(tmp_path / f"buffered{suffix}")
    apply_model(
        model, source, direct, ApplyOptions(normalize=True, dtype=dtype), ReadOptions(block_rows=1024)
    )  # 4 whole chunks and an edge
    direct_writes = [write for write in record_writes if write[0]]
    chunk_bytes = 1024 * 16 * np.dtype(dtype).itemsize
    assert len(direct_writes) == 4 and all(n_bytes == chunk_bytes for _, _, n_bytes in direct_writes)
    record_writes.clear()
    apply_model(
        model,
        source,
        buffered,
        ApplyOptions(normalize=True, dtype=dtype, direct_io=False),
        ReadOptions(block_rows=1024),
    )
    assert not any(write[0] for write in record_writes)
    with open_source(direct) as got, open_source(buffered) as want:
        assert got.dtype == np.dtype(dtype) and got.n_rows == 5000
        written = got.read(0, 5000)
        np.testing.assert_array_equal(written, want.read(0, 5000))
    expected = model.transform(rows.astype(np.float64), normalize=True)
    np.testing.assert_allclose(
        written, expected, rtol=2e-3 if dtype == "float16" else 1e-4, atol=1e-3 if dtype == "float16" else 1e-5
    )
    assert read_attrs(direct)["complete"]


def test_hdf5_output_written_in_place_is_a_valid_file_readable_by_h5py(tmp_path, rows):
    model = Whitener(n_components=16).fit(rows).model_
    source = write_zarr(tmp_path / "in.zarr", rows, chunk_rows=2048)
    output = tmp_path / "out.h5"
    apply_model(model, source, f"{output}:/group/vectors", ApplyOptions(), ReadOptions(block_rows=2048))
    with h5py.File(output, "r") as handle:
        vectors = handle["group/vectors"]
        assert vectors.shape == (5000, 16) and vectors.chunks == (2048, 16)
        np.testing.assert_allclose(vectors[:], model.transform(rows.astype(np.float64)), rtol=1e-4, atol=1e-5)
        assert vectors.attrs["complete"]


def test_chunk_rows_are_rounded_to_whole_alignment_blocks_when_possible():
    assert aligned_chunk_rows(1000, 16, np.float32) == 960  # 64-byte rows: multiples of 64 rows
    assert aligned_chunk_rows(300, 16, np.float32) == 256
    assert aligned_chunk_rows(40, 16, np.float32) == 40  # fewer than one alignment block: kept
    assert aligned_chunk_rows(1000, 100, np.float32) == 768  # 400-byte rows: multiples of 256 rows
    assert aligned_chunk_rows(4096, 256, np.float32) == 4096
