"""Compressed chunks decoded by streamwhiten (``io.codecs``), and outputs compressed by it (issue #18).

Every chunk decoded here must equal what zarr or h5py return for the same store: each codec chain, each
dtype (float16/32/64, little- and big-endian), a partial last chunk, ranges cut inside chunks, Zarr v2
and v3; chains with no plan (sharding, bz2, no filter) are read by the library as before. A fit over a
compressed store gives the bits of a fit over the same rows uncompressed. ``apply --compressor`` writes
what plain zarr and h5py read back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import h5py
import numcodecs
import numpy as np
import pytest
import zarr
from conftest import anisotropic, run_command
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, GzipCodec, ZstdCodec

from streamwhiten.errors import BadInputError, MissingChunkError
from streamwhiten.io import open_source
from streamwhiten.io.codecs import DecodeError, hdf5_decoder, widen_in_place, zarr_decoder
from streamwhiten.options import ApplyOptions, ReadOptions
from streamwhiten.progress import Watch

ROWS, FEATURES, CHUNK = 1000, 24, 128  # the last chunk holds 104 rows
DTYPES = ["<f4", ">f4", "<f2", ">f2", "<f8"]

#: Zarr stores: name -> (create_array options, whether streamwhiten decodes its chunks)
ZARR_CHAINS = {
    "v3-zstd-default": ({"zarr_format": 3}, True),
    "v3-blosc-lz4": ({"zarr_format": 3, "compressors": [BloscCodec(cname="lz4", shuffle="shuffle")]}, True),
    "v3-blosc-zstd-bitshuffle": (
        {"zarr_format": 3, "compressors": [BloscCodec(cname="zstd", shuffle="bitshuffle")]},
        True,
    ),
    "v3-gzip-crc32c": ({"zarr_format": 3, "compressors": [GzipCodec(level=3), Crc32cCodec()]}, True),
    "v3-crc32c": ({"zarr_format": 3, "compressors": [Crc32cCodec()]}, True),
    "v3-zstd-checksum": ({"zarr_format": 3, "compressors": [ZstdCodec(level=5, checksum=True)]}, True),
    "v3-big-endian-zstd": ({"zarr_format": 3, "serializer": BytesCodec(endian="big")}, True),
    "v2-zstd-default": ({"zarr_format": 2}, True),
    "v2-blosc": ({"zarr_format": 2, "compressors": numcodecs.Blosc()}, True),
    "v2-zlib-shuffle": ({"zarr_format": 2, "compressors": numcodecs.Zlib(), "filters": "shuffle"}, True),
    "v2-gzip": ({"zarr_format": 2, "compressors": numcodecs.GZip()}, True),
    "v2-lz4": ({"zarr_format": 2, "compressors": numcodecs.LZ4()}, True),
    "v3-sharded": ({"zarr_format": 3, "shards": (2 * CHUNK, FEATURES)}, False),  # zarr reads it
    "v2-bz2": ({"zarr_format": 2, "compressors": numcodecs.BZ2()}, False),  # a codec we leave to zarr
}


def _hdf5_filters(name: str) -> dict:
    if name in ("blosc", "zstd"):
        hdf5plugin = pytest.importorskip("hdf5plugin")
        return dict(
            hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.SHUFFLE)
            if name == "blosc"
            else hdf5plugin.Zstd()
        )
    return {
        "gzip": {"compression": "gzip"},
        "gzip-shuffle": {"compression": "gzip", "shuffle": True},
        "gzip-shuffle-fletcher32": {"compression": "gzip", "compression_opts": 9, "shuffle": True, "fletcher32": True},
        "fletcher32": {"fletcher32": True},
        "shuffle": {"shuffle": True},
        "lzf": {"compression": "lzf"},
        "lzf-shuffle": {"compression": "lzf", "shuffle": True},
        "none": {},
    }[name]


#: HDF5 filter pipelines: name -> whether streamwhiten decodes its chunks
HDF5_FILTERS = {
    "gzip": True,
    "gzip-shuffle": True,
    "gzip-shuffle-fletcher32": True,
    "fletcher32": True,
    "shuffle": True,
    "blosc": True,
    "zstd": True,
    "lzf": True,
    "lzf-shuffle": True,
    "none": False,
}


def rows_of(dtype) -> np.ndarray:
    return anisotropic(ROWS, FEATURES, seed=18).astype(dtype)


def write_zarr_store(path, rows, chain: str) -> str:
    options = dict(ZARR_CHAINS[chain][0])
    if options.get("filters") == "shuffle":
        options["filters"] = [numcodecs.Shuffle(rows.dtype.itemsize)]
    zarr.create_array(store=str(path), shape=rows.shape, chunks=(CHUNK, FEATURES), dtype=rows.dtype, **options)[...] = (
        rows
    )
    return str(path)


def write_hdf5_store(path, rows, filters: str) -> str:
    with h5py.File(path, "w") as handle:
        handle.create_dataset("emb", data=rows, chunks=(CHUNK, FEATURES), **_hdf5_filters(filters))
    return f"{path}:/emb"


def check_reads_match(spec: str, reference: np.ndarray, decoded_here: bool) -> None:
    with open_source(spec) as source:
        assert (source.decoder is not None) == decoded_here, source.decoder and source.decoder.description
        assert source.dtype == reference.dtype.newbyteorder("=")
        np.testing.assert_array_equal(source.read(0, ROWS), reference)
        for start, stop in [
            (0, CHUNK),
            (130, 517),
            (900, ROWS),
            (999, ROWS),
            (256, 384),
        ]:  # cut inside chunks, the tail
            np.testing.assert_array_equal(source.read(start, stop), reference[start:stop])
        blocks = (
            [
                source.read_into(a, b, np.empty((b - a, FEATURES), source.dtype), fetched=source.fetch(a, b))
                for a, b in source.blocks(2 * CHUNK)
            ]
            if decoded_here
            else [source.read(0, ROWS)]
        )
        np.testing.assert_array_equal(np.vstack(blocks), reference)
        if source.dtype == np.float16:  # widened as decoded, into a float32 buffer
            widened = source.read_into(0, ROWS, np.full((ROWS, FEATURES), np.nan, np.float32))
            np.testing.assert_array_equal(widened, reference.astype(np.float32))
            part = source.read_into(130, 517, np.full((517 - 130, FEATURES), np.nan, np.float32))
            np.testing.assert_array_equal(part, reference[130:517].astype(np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chain", list(ZARR_CHAINS))
def test_zarr_chunks_decode_to_what_zarr_reads(tmp_path, chain, dtype):
    spec = write_zarr_store(tmp_path / "s.zarr", rows_of(dtype), chain)
    check_reads_match(spec, zarr.open_array(spec, mode="r")[...], ZARR_CHAINS[chain][1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("filters", list(HDF5_FILTERS))
def test_hdf5_chunks_decode_to_what_h5py_reads(tmp_path, filters, dtype):
    rows = rows_of(dtype)
    if filters.startswith("lzf"):  # LZF is optional in HDF5: rows it cannot shrink are stored raw
        rows = (np.round(rows.astype(np.float64) * 4) / 4).astype(dtype)
    spec = write_hdf5_store(tmp_path / "s.h5", rows, filters)
    with h5py.File(tmp_path / "s.h5", "r") as handle:
        reference = handle["emb"][...]
        if filters.startswith("lzf"):  # so that the kernel decodes every chunk
            info = [handle["emb"].id.get_chunk_info(i) for i in range(handle["emb"].id.get_num_chunks())]
            assert [chunk.filter_mask for chunk in info] == [0] * len(info)
    check_reads_match(spec, reference, HDF5_FILTERS[filters])


def test_hdf5_chunk_stored_raw_by_an_optional_filter_is_read(tmp_path):
    """HDF5 skips an optional filter that does not shrink a chunk (its filter mask says so): such a
    chunk is stored as it is and must not be run through the decoder."""
    hdf5plugin = pytest.importorskip("hdf5plugin")
    rows = np.random.default_rng(3).integers(0, 2**16, size=(ROWS, FEATURES), dtype=np.uint16).view(np.float16)
    rows = np.where(np.isfinite(rows), rows, np.float16(0))
    with h5py.File(tmp_path / "s.h5", "w") as handle:
        handle.create_dataset("emb", data=rows, chunks=(CHUNK, FEATURES), **hdf5plugin.Blosc(cname="lz4", shuffle=0))
    with h5py.File(tmp_path / "s.h5", "r") as handle:
        masks = {handle["emb"].id.get_chunk_info(i).filter_mask for i in range(handle["emb"].id.get_num_chunks())}
        reference = handle["emb"][...]
    assert 1 in masks, "the test needs a chunk the blosc filter skipped"
    check_reads_match(f"{tmp_path / 's.h5'}:/emb", reference, True)


def test_plans_name_their_steps(tmp_path):
    spec = write_zarr_store(tmp_path / "a.zarr", rows_of("<f4"), "v3-gzip-crc32c")
    assert zarr_decoder(zarr.open_array(spec, mode="r")).description == "crc32c -> gzip"
    write_hdf5_store(tmp_path / "b.h5", rows_of(">f4"), "gzip-shuffle-fletcher32")
    with h5py.File(tmp_path / "b.h5", "r") as handle:
        plan = hdf5_decoder(handle["emb"])
    assert plan.description == "fletcher32 -> deflate -> shuffle" and plan.dtype == np.dtype(">f4")
    assert plan.nbytes == CHUNK * FEATURES * 4


def test_widen_in_place_matches_astype():
    values = np.random.default_rng(0).standard_normal(300_001).astype(np.float16)  # several pieces and a tail
    region = np.zeros(4 * values.size, np.uint8)
    region[2 * values.size :] = values.view(np.uint8)
    widen_in_place(region, values.size)
    np.testing.assert_array_equal(region.view(np.float32), values.astype(np.float32))


def test_a_chunk_that_decodes_to_the_wrong_size_is_refused(tmp_path):
    """A valid zstd frame of another size in a chunk's place: refused, not read short or long."""
    spec = write_zarr_store(tmp_path / "s.zarr", rows_of("<f4"), "v3-zstd-default")
    with open(os.path.join(spec, "c", "1", "0"), "wb") as handle:
        handle.write(numcodecs.Zstd().encode(np.zeros(CHUNK * FEATURES * 4 - 8, np.uint8)))
    with (
        open_source(spec) as source,
        pytest.raises(BadInputError, match=r"c/1/0 \(rows 128\.\.255\).*zstd frame holds"),
    ):
        source.read(0, ROWS)
    with pytest.raises(DecodeError):
        zarr_decoder(zarr.open_array(spec, mode="r")).decode_into(
            b"\x00" * 64, np.empty(CHUNK * FEATURES * 4, np.uint8)
        )


def test_missing_chunks_keep_todays_behaviour(tmp_path):
    """A compressed store with a hole is refused naming the rows, or read as the fill value when asked."""
    rows = rows_of("<f4")
    spec = write_zarr_store(tmp_path / "s.zarr", rows, "v3-zstd-default")
    os.remove(os.path.join(spec, "c", "3", "0"))
    with open_source(spec) as source, pytest.raises(MissingChunkError, match=r"rows 384\.\.511"):
        source.read(0, ROWS)
    with open_source(spec, read=ReadOptions(fill_missing_chunks=True)) as source:
        expected = rows.copy()
        expected[384:512] = 0
        np.testing.assert_array_equal(source.read(0, ROWS), expected)
    with h5py.File(tmp_path / "h.h5", "w") as handle:
        dataset = handle.create_dataset(
            "emb", shape=rows.shape, dtype=rows.dtype, chunks=(CHUNK, FEATURES), compression="gzip", fillvalue=7.0
        )
        dataset[:CHUNK] = rows[:CHUNK]
        dataset[2 * CHUNK :] = rows[2 * CHUNK :]
    with open_source(f"{tmp_path / 'h.h5'}:/emb") as source, pytest.raises(MissingChunkError, match=r"rows 128\.\.255"):
        source.read(0, ROWS)
    with open_source(f"{tmp_path / 'h.h5'}:/emb", read=ReadOptions(fill_missing_chunks=True)) as source:
        expected = rows.copy()
        expected[CHUNK : 2 * CHUNK] = 7.0
        np.testing.assert_array_equal(source.read(0, ROWS), expected)


@pytest.mark.parametrize("dtype", ["<f4", "<f2", ">f2"])
@pytest.mark.parametrize("threads", [1, 2])
def test_fit_on_compressed_stores_is_bit_identical(tmp_path, dtype, threads):
    """The same rows stored raw and compressed (Zarr and HDF5) give the very same statistics."""
    from streamwhiten.engine.fit import fit_sources

    rows = rows_of(dtype)
    raw = write_hdf5_store(tmp_path / "raw.h5", rows, "none")
    expected = fit_sources(raw, threads=threads, block_rows=2 * CHUNK).state
    for spec in (
        write_zarr_store(tmp_path / "z.zarr", rows, "v3-zstd-default"),
        write_zarr_store(tmp_path / "b.zarr", rows, "v2-blosc"),
        write_hdf5_store(tmp_path / "g.h5", rows, "gzip-shuffle-fletcher32"),
    ):
        assert fit_sources(spec, threads=threads, block_rows=2 * CHUNK).state == expected, spec


# ---------------------------------------------------------------------------------------- apply outputs


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    """An input (gzip HDF5, 1000 rows), a model, and its uncompressed output to compare with."""
    from streamwhiten import Whitener
    from streamwhiten.core.model import load_model
    from streamwhiten.engine.apply import apply_model

    directory = tmp_path_factory.mktemp("apply")
    spec = write_hdf5_store(directory / "in.h5", rows_of("<f4"), "gzip-shuffle")
    Whitener(n_components=8).fit(rows_of("<f4")).save(str(directory / "m.npz"))
    model = load_model(str(directory / "m.npz"))
    apply_model(model, spec, str(directory / "ref.zarr"), ApplyOptions(), ReadOptions(block_rows=256))
    return directory, spec, model, zarr.open_array(str(directory / "ref.zarr"), mode="r")[...]


READ_BACK = {
    "zarr": "import zarr, numpy; numpy.save(OUT, zarr.open_array(PATH, mode='r')[...])",
    "h5": "import h5py, numpy\nwith h5py.File(PATH, 'r') as f: numpy.save(OUT, f['embeddings'][...])",
    "h5-plugin": "import hdf5plugin, h5py, numpy\nwith h5py.File(PATH, 'r') as f: numpy.save(OUT, f['embeddings'][...])",
}


@pytest.mark.parametrize("compressor", ["zstd", "blosc", "gzip"])
@pytest.mark.parametrize("output", ["out.zarr", "out-v2.zarr", "out.h5"])
def test_apply_compressed_outputs_read_back_with_plain_libraries(tmp_path, applied, compressor, output):
    from streamwhiten.engine.apply import apply_model

    directory, spec, model, reference = applied
    if output == "out.h5" and compressor != "gzip":
        pytest.importorskip("hdf5plugin")
    target = str(tmp_path / output)
    apply_model(
        model,
        spec,
        target,
        ApplyOptions(compressor=compressor, zarr_format=2 if "v2" in output else 3),
        ReadOptions(block_rows=256),
    )
    reader = "zarr" if output.endswith(".zarr") else ("h5" if compressor == "gzip" else "h5-plugin")
    code = READ_BACK[reader].replace("PATH", repr(target)).replace("OUT", repr(str(tmp_path / "back.npy")))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)  # no streamwhiten loaded
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "back.npy"), reference)
    if output.endswith(".zarr"):
        array = zarr.open_array(target, mode="r")
        stored = array.metadata.codecs if array.metadata.zarr_format == 3 else [array.metadata.compressor]
        assert compressor in repr(stored).lower()
        assert array.attrs["compressor"] == compressor
    else:
        with h5py.File(target, "r") as handle:
            assert handle["embeddings"].attrs["compressor"] == compressor
            assert handle["embeddings"].id.get_create_plist().get_nfilters() >= 1
            if compressor == "gzip":
                assert handle["embeddings"].compression == "gzip" and handle["embeddings"].shuffle
    assert sorted(os.listdir(tmp_path)) == sorted({output, "back.npy"})  # no partial, spool or record left


def test_apply_compressor_is_recorded_and_checked(tmp_path, applied):
    directory, spec, model, _ = applied
    model_path = str(directory / "m.npz")
    out = str(tmp_path / "out.zarr")
    assert run_command("apply", model_path, spec, "-o", out, "-q", "--compressor", "zstd").returncode == 0
    again = run_command("apply", model_path, spec, "-o", out, "-q", "--compressor", "zstd")
    assert again.returncode == 3, again.stderr  # up to date
    other = run_command("apply", model_path, spec, "-o", out, "-q", "--compressor", "gzip")
    assert other.returncode == 2 and "already exists" in other.stderr  # not current: another compressor
    plain = run_command("apply", model_path, spec, "-o", out, "-q")
    assert plain.returncode == 2 and "already exists" in plain.stderr
    assert (
        run_command("apply", model_path, spec, "-o", out, "-q", "--compressor", "gzip", "--overwrite").returncode == 0
    )
    assert zarr.open_array(out, mode="r").attrs["compressor"] == "gzip"
    bad = run_command("apply", model_path, spec, "-o", str(tmp_path / "o.parquet"), "-q", "--compressor", "zstd")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and "HDF5 and Zarr outputs" in bad.stderr
    unknown = run_command("apply", model_path, spec, "-o", str(tmp_path / "o.zarr"), "-q", "--compressor", "lzma")
    assert unknown.returncode == 2


def test_an_uncompressed_output_from_before_the_option_stays_current(tmp_path, applied):
    """Outputs written before --compressor existed carry no such attribute: they were uncompressed."""
    from dataclasses import replace

    from streamwhiten.engine.apply import output_is_current
    from streamwhiten.io import open_output
    from streamwhiten.output_plan import OutputPlan

    directory, spec, model, _ = applied
    attrs = dict(zarr.open_array(str(directory / "ref.zarr"), mode="r").attrs)
    assert attrs["compressor"] == "none"
    copy = str(tmp_path / "old.zarr")
    import shutil

    shutil.copytree(str(directory / "ref.zarr"), copy)
    array = zarr.open_array(copy, mode="r+")
    array.attrs.put({key: value for key, value in attrs.items() if key != "compressor"})
    plan = OutputPlan.from_attrs(attrs, "float32")  # what the output was written with: uncompressed
    assert plan.compressor == "none" and plan.records_compressor
    assert output_is_current(open_output(copy), plan)
    assert not output_is_current(open_output(copy), replace(plan, compressor="zstd"))


@pytest.mark.parametrize("output", ["out.h5", "out.zarr"])
def test_interrupted_compressed_apply_resumes_to_the_same_output(tmp_path, applied, output):
    from streamwhiten.engine.apply import apply_model
    from streamwhiten.errors import InterruptedRunError

    directory, spec, model, reference = applied
    whole = str(tmp_path / ("whole-" + output))
    apply_model(model, spec, whole, ApplyOptions(compressor="gzip"), ReadOptions(block_rows=256))
    target = str(tmp_path / output)
    calls = []

    def stop_after_two_blocks():
        calls.append(1)
        return len(calls) >= 2

    with pytest.raises(InterruptedRunError):
        apply_model(
            model,
            spec,
            target,
            ApplyOptions(compressor="gzip", progress_seconds=0),
            ReadOptions(block_rows=256),
            watch=Watch(should_stop=stop_after_two_blocks),
        )
    assert not os.path.exists(target)
    partial = tmp_path / f".{output}.partial"
    record = json.loads((tmp_path / f".{output}.partial.progress.json").read_text())
    assert record["rows_done"] == 512 and record["compressor"] == "gzip"
    if output.endswith(".h5"):  # a torn record after the claimed ones (a write cut short) is dropped on resume
        with open(str(partial) + ".chunks", "ab") as spool:
            spool.write(b"SWC1\x02\x00\x00\x00" + b"\xff" * 40)
    summary = apply_model(model, spec, target, ApplyOptions(compressor="gzip"), ReadOptions(block_rows=256))
    assert summary.resumed_at_row == 512
    if output.endswith(".h5"):
        with h5py.File(target, "r") as handle:
            np.testing.assert_array_equal(handle["embeddings"][...], reference)
        assert open(target, "rb").read() == open(whole, "rb").read()  # byte for byte the uninterrupted run's file
    else:
        np.testing.assert_array_equal(zarr.open_array(target, mode="r")[...], reference)
    assert sorted(os.listdir(tmp_path)) == sorted({output, "whole-" + output})


def test_job_file_compressor(tmp_path, applied):
    from streamwhiten.job import read_job_file as load_job

    directory, spec, _, _ = applied
    job = tmp_path / "job.toml"
    job.write_text(
        f'[input]\npaths = ["{directory / "in.h5"}"]\ndataset = "/emb"\n[model]\npath = "m.npz"\n'
        f'n_components = 4\n[apply]\noutput = "out/{{stem}}.zarr"\ncompressor = "zstd"\n'
    )
    assert load_job(str(job)).apply.compressor == "zstd"
    result = run_command("run", job, "-q")
    assert result.returncode == 0, result.stderr
    array = zarr.open_array(str(tmp_path / "out" / "in.zarr"), mode="r")
    assert array.attrs["compressor"] == "zstd" and "zstd" in repr(array.metadata.codecs).lower()
    assert run_command("run", job, "-q").returncode == 3  # up to date
    job.write_text(job.read_text().replace('"zstd"', '"lzma"'))
    with pytest.raises(BadInputError, match="compressor in \\[apply\\]"):
        load_job(str(job))


def test_hdf5_chunks_are_found_past_a_user_block(tmp_path):
    """Stored chunks are read through our own descriptor at the offsets HDF5 reports: a file with a user
    block (its data shifted by it) must read the same."""
    rows = rows_of("<f4")
    with h5py.File(tmp_path / "u.h5", "w", userblock_size=4096) as handle:
        handle.create_dataset("emb", data=rows, chunks=(CHUNK, FEATURES), compression="gzip", shuffle=True)
    check_reads_match(f"{tmp_path / 'u.h5'}:/emb", rows, True)
