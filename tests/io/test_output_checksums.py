"""Outputs carry checksums, verified when read (issue #36): HDF5 fletcher32, Zarr 3 crc32c and Parquet page
CRCs refuse a flipped bit in an output or a published part, naming the file and rows; ``--no-checksums``
writes the same rows without them."""

from __future__ import annotations

import os
import re

import h5py
import numpy as np
import pytest
import zarr
from conftest import anisotropic, run_command, write_h5
from user_files import SMALL, run_checked

#: output name -> the apply options that write it
CHECKSUMMED_OUTPUTS = {
    "out.h5": [],
    "gzip.h5": ["--compressor", "gzip"],
    "out.zarr": [],
    "zstd.zarr": ["--compressor", "zstd"],
    "out.parquet": [],
}


def _flip(path, offset, mask=0x10):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ mask]))


def _data_byte(path):
    """A byte inside the stored data of the output's third chunk (HDF5, Zarr) or first data page (Parquet)."""
    if path.suffix == ".h5":
        with h5py.File(path, "r") as handle:
            return path, handle["embeddings"].id.get_chunk_info(2).byte_offset + 37
    if path.suffix == ".zarr":
        return path / "c" / "2" / "0", 37
    import pyarrow.parquet as pq

    column = pq.ParquetFile(path).metadata.row_group(0).column(0)
    return path, column.data_page_offset + column.total_compressed_size // 2


@pytest.mark.parametrize("name", sorted(CHECKSUMMED_OUTPUTS))
def test_flipped_data_bytes_in_an_output_are_refused_when_read(tmp_path, small_model, name):
    """An output's chunks carry checksums (HDF5 fletcher32, Zarr 3 crc32c, Parquet page CRCs): one bit
    flipped inside its stored data is refused by every reader of ours, naming the file and rows -- never
    returned as values (issue #36: a published part with flipped bytes read back as 6e23)."""
    from streamwhiten.errors import CorruptStoreError
    from streamwhiten.io import open_source

    (tmp_path / "m.npz").write_bytes(small_model)
    write_h5(tmp_path / "in.h5", SMALL)
    args = ["apply", "m.npz", "in.h5", "-o", name, "--chunk-rows", "100", "-q", *CHECKSUMMED_OUTPUTS[name]]
    assert run_command(*args, cwd=tmp_path).returncode == 0
    with open_source(str(tmp_path / name)) as source:
        written = source.read(0, source.n_rows).copy()
    file, offset = _data_byte(tmp_path / name)
    _flip(file, offset)
    with pytest.raises(CorruptStoreError, match=rf"{re.escape(name)}\b.*(checksum|CRC)"):
        with open_source(str(tmp_path / name)) as source:
            source.read(0, source.n_rows)
    run_checked(tmp_path, ["fit", name, "-o", "refit.npz"], 2, rf"{re.escape(name)}.*(checksum|CRC)")
    _flip(file, offset)  # flipped back: read as written
    with open_source(str(tmp_path / name)) as source:
        np.testing.assert_array_equal(source.read(0, source.n_rows), written)


def test_outputs_without_checksums_hold_the_same_rows_and_plain_readers_verify_them(tmp_path, small_model):
    """``--no-checksums`` writes the same rows without the filter or codec; with checksums, h5py and zarr
    themselves read the outputs (and verify them), as any reader of the format does."""
    (tmp_path / "m.npz").write_bytes(small_model)
    write_h5(tmp_path / "in.h5", SMALL)
    for name, extra in (("a.h5", []), ("b.h5", ["--no-checksums"]), ("a.zarr", []), ("b.zarr", ["--no-checksums"])):
        result = run_command("apply", "m.npz", "in.h5", "-o", name, "--chunk-rows", "100", "-q", *extra, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    with h5py.File(tmp_path / "a.h5") as one, h5py.File(tmp_path / "b.h5") as two:
        assert one["embeddings"].fletcher32 and not two["embeddings"].fletcher32
        np.testing.assert_array_equal(one["embeddings"][:], two["embeddings"][:])
        rows = one["embeddings"][:]
    checked, plain = zarr.open_array(tmp_path / "a.zarr", mode="r"), zarr.open_array(tmp_path / "b.zarr", mode="r")
    assert [type(codec).__name__ for codec in checked.metadata.codecs] == ["BytesCodec", "Crc32cCodec"]
    assert [type(codec).__name__ for codec in plain.metadata.codecs] == ["BytesCodec"]
    np.testing.assert_array_equal(checked[:], rows)
    np.testing.assert_array_equal(plain[:], rows)


@pytest.mark.parametrize("suffix", ["h5", "zarr"])
def test_a_published_part_with_flipped_data_bytes_is_refused_when_read(tmp_path, suffix):
    """Issue #36: bytes flipped inside a published part, its times restored, were read back by
    ``published().read`` as values (6e23); the part's checksums refuse it, naming the part."""
    from streamwhiten.errors import CorruptStoreError
    from streamwhiten.job import published, run_job_file

    write_h5(tmp_path / "day-1.h5", anisotropic(1200, 8, seed=9).astype(np.float32), chunk_rows=100)
    job = tmp_path / "job.toml"
    job.write_text(
        f'[input]\npaths = ["day-*.h5"]\n[model]\npath = "m.npz"\n'
        f'[apply]\noutput = "out-{{stem}}.{suffix}"\nchunk_rows = 100\n[publish]\n'
    )
    run_job_file(str(job))
    publication = published(str(tmp_path / "m.npz"))
    rows = publication.read(str(tmp_path / "day-1.h5"))
    part = tmp_path / publication.outputs[0]
    file, offset = _data_byte(part)
    times = os.stat(file)
    _flip(file, offset, mask=0x40)  # an exponent bit of a float32 value
    os.utime(file, ns=(times.st_atime_ns, times.st_mtime_ns))
    with pytest.raises(CorruptStoreError, match=rf"{re.escape(part.name)}.*rows 200\.\.299.*checksum mismatch"):
        published(str(tmp_path / "m.npz")).read(str(tmp_path / "day-1.h5"))
    _flip(file, offset, mask=0x40)
    np.testing.assert_array_equal(published(str(tmp_path / "m.npz")).read(str(tmp_path / "day-1.h5")), rows)


def test_pyarrow_verifies_a_parquet_outputs_page_crcs_only_when_asked(tmp_path, small_model):
    """Issue #45: the docs said any reader of the format verifies the checksums; a plain
    ``pyarrow.parquet.read_table`` returns a flipped data page as data. With ``page_checksum_verification=True``
    pyarrow refuses it, as the tool's own reader always does; the docs name that flag."""
    pq = pytest.importorskip("pyarrow.parquet")
    from conftest import REPO

    from streamwhiten.errors import CorruptStoreError
    from streamwhiten.io import open_source

    (tmp_path / "m.npz").write_bytes(small_model)
    write_h5(tmp_path / "in.h5", SMALL)
    assert run_command("apply", "m.npz", "in.h5", "-o", "out.parquet", "-q", cwd=tmp_path).returncode == 0
    path = tmp_path / "out.parquet"
    written = pq.read_table(path, page_checksum_verification=True)
    _flip(*_data_byte(path), mask=0x40)
    plain = pq.read_table(path)  # no error: the damaged page is returned as values
    assert plain.num_rows == written.num_rows and not plain.equals(written)
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        pq.read_table(path, page_checksum_verification=True)
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        pq.ParquetFile(path, page_checksum_verification=True).read()
    with pytest.raises(CorruptStoreError, match=r"out\.parquet\b.*(checksum|CRC)"):  # the tool's own reader
        with open_source(str(path)) as source:
            source.read(0, source.n_rows)
    for doc in ("nightly.md", "reliability.md", "performance.md"):
        text = (REPO / "docs" / doc).read_text()
        assert "any reader of the format" not in text and "page_checksum_verification=True" in text, doc
