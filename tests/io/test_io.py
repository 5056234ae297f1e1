"""Store specs, chunked reading, fingerprints and the temp-then-rename sink."""

import os

import h5py
import numpy as np
import pytest
import zarr
from conftest import anisotropic, write_h5, write_zarr

from streamwhiten.errors import BadInputError, CorruptStoreError, MissingChunkError, OutputExistsError
from streamwhiten.io import fingerprint, open_output, open_source, partial_path, split_spec
from streamwhiten.options import ReadOptions
from streamwhiten.output_plan import OutputPlan


def test_split_spec():
    assert split_spec("a.h5:/g/ds") == ("a.h5", "g/ds")
    assert split_spec("a.h5", "/x") == ("a.h5", "x")
    assert split_spec("dir.zarr") == ("dir.zarr", None)
    assert split_spec("dir.zarr:/arr") == ("dir.zarr", "arr")


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_zarr_v2_and_v3_read_in_store_chunks(tmp_path, zarr_format):
    rows = anisotropic(1000, 4).astype(np.float32)
    spec = write_zarr(tmp_path / "a.zarr", rows, chunk_rows=96, zarr_format=zarr_format)
    with open_source(spec) as source:
        assert source.chunk_rows == 96 and source.shape == (1000, 4)
        blocks = list(source.blocks())
        assert all(start % 96 == 0 for start, _ in blocks)
        assert blocks[-1][1] == 1000
        np.testing.assert_array_equal(np.vstack([source.read(a, b) for a, b in blocks]), rows)
        assert [b for b in source.blocks(100)][:2] == [(0, 100), (100, 200)]


def test_hdf5_group_paths_and_single_dataset_detection(tmp_path):
    rows = anisotropic(50, 3)
    with h5py.File(tmp_path / "g.h5", "w") as handle:
        handle.create_dataset("grp/emb", data=rows)
        handle.create_dataset("ids", data=np.arange(50))
    with open_source(f"{tmp_path}/g.h5") as source:  # the only 2-D dataset is found by itself
        assert source.dataset == "grp/emb"
    with open_source(f"{tmp_path}/g.h5:/grp/emb") as source:
        np.testing.assert_array_equal(source.read(10, 20), rows[10:20])
    with pytest.raises(BadInputError, match="/grp is a group, not a dataset; its 2-D datasets: /grp/emb"):
        open_source(f"{tmp_path}/g.h5:/grp")
    with pytest.raises(BadInputError, match="has no 2-D dataset /nope"):
        open_source(f"{tmp_path}/g.h5:/nope")


def test_zarr_group_array_paths(tmp_path):
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    group.create_array("vectors", shape=(20, 3), chunks=(8, 3), dtype="f4")[...] = np.ones((20, 3))
    for spec in (f"{tmp_path}/g.zarr", f"{tmp_path}/g.zarr:/vectors", f"{tmp_path}/g.zarr/vectors"):
        with open_source(spec) as source:
            assert source.shape == (20, 3)


def test_npy_source(tmp_path):
    rows = anisotropic(30, 3)
    np.save(tmp_path / "x.npy", rows)
    with open_source(str(tmp_path / "x.npy")) as source:
        np.testing.assert_array_equal(source.read(0, 30), rows)


def test_fingerprint_is_stable_for_an_appended_prefix(tmp_path):
    rows = anisotropic(500, 4)
    spec_old = write_h5(tmp_path / "a.h5", rows[:300])
    spec_new = write_h5(tmp_path / "b.h5", rows)
    with open_source(spec_old) as old, open_source(spec_new) as new:
        before = fingerprint(old)
        assert fingerprint(new, 300).sha256_sampled == before.sha256_sampled
        assert fingerprint(new).sha256_sampled != before.sha256_sampled
    changed = rows.copy()
    changed[299] += 1
    with open_source(write_h5(tmp_path / "c.h5", changed)) as edited:
        assert fingerprint(edited, 300).sha256_sampled != before.sha256_sampled


@pytest.mark.parametrize("name", ["out.h5", "out.zarr"])
def test_sink_appears_only_when_committed(tmp_path, name):
    target = str(tmp_path / name)
    sink = open_output(target).create(OutputPlan(10, 3, "float32"))
    sink.write(0, np.ones((10, 3), np.float32))
    assert not os.path.exists(target) and os.path.exists(partial_path(target))
    sink.commit()
    assert os.path.exists(target) and not os.path.exists(partial_path(target))
    with open_source(target) as source:
        np.testing.assert_array_equal(source.read(0, 10), np.ones((10, 3)))
    with pytest.raises(OutputExistsError):
        open_output(target).create(OutputPlan(10, 3))
    aborted = open_output(target).create(OutputPlan(10, 3), overwrite=True)
    aborted.abort()
    assert not os.path.exists(partial_path(target))
    with open_source(target) as source:  # the old output is untouched
        assert source.shape == (10, 3)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_raw_zarr_chunks_are_read_directly_and_match_zarr(tmp_path, zarr_format):
    rows = anisotropic(1000, 6).astype(np.float32)
    spec = write_zarr(tmp_path / "raw.zarr", rows, chunk_rows=96, zarr_format=zarr_format)
    with open_source(spec) as source:
        assert source.raw_root is not None  # the fast path is taken for uncompressed chunks
        buffer = np.empty((400, 6), np.float32)
        for start, stop in [(0, 1000), (5, 7), (90, 200), (950, 1000), (0, 96)]:
            out = np.empty((stop - start, 6), np.float32)
            np.testing.assert_array_equal(source.read_into(start, stop, out), rows[start:stop])
        np.testing.assert_array_equal(source.read_into(100, 500, buffer), rows[100:500])
    key = zarr.open_array(spec, mode="r").metadata.encode_chunk_key((3, 0))
    os.remove(os.path.join(spec, key))  # a hole in the store is refused, naming the rows it covers ...
    with open_source(spec) as source, pytest.raises(MissingChunkError, match=r"is missing") as caught:
        source.read(0, 1000)
    assert caught.value.rows == (288, 384) and "rows 288..383" in str(caught.value)
    with open_source(
        spec, read=ReadOptions(fill_missing_chunks=True)
    ) as source:  # ... or, when asked, read as zarr does
        np.testing.assert_array_equal(source.read(0, 1000), zarr.open_array(spec, mode="r")[:])
    chunk = os.path.join(spec, zarr.open_array(spec, mode="r").metadata.encode_chunk_key((1, 0)))
    with open(chunk, "r+b") as handle:
        handle.truncate(100)
    with open_source(spec) as source, pytest.raises(CorruptStoreError, match="truncated"):
        source.read(96, 192)


def test_compressed_zarr_falls_back_to_zarr_decoding(tmp_path):
    from zarr.codecs import BloscCodec

    rows = anisotropic(500, 4).astype(np.float32)
    array = zarr.create_array(
        store=str(tmp_path / "c.zarr"),
        shape=rows.shape,
        chunks=(64, 4),
        dtype="f4",
        compressors=[BloscCodec(cname="zstd")],
    )
    array[...] = rows
    with open_source(str(tmp_path / "c.zarr")) as source:
        assert source.raw_root is None
        np.testing.assert_array_equal(source.read(10, 300), rows[10:300])


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_raw_zarr_sink_writes_what_zarr_reads(tmp_path, zarr_format):
    rows = anisotropic(1000, 5).astype(np.float32)
    target = str(tmp_path / "o.zarr")
    sink = open_output(target).create(OutputPlan(1000, 5, "float32", zarr_format=zarr_format, chunk_rows=96))
    sink.write(0, rows[:192])  # whole chunks: raw files
    sink.write(192, rows[192:250])  # a partial chunk: through zarr
    sink.write(250, rows[250:1000])  # starts mid-chunk, ends with the padded edge chunk
    sink.commit()
    np.testing.assert_array_equal(zarr.open_array(target, mode="r")[:], rows)


def test_one_zarr_array_spelled_two_ways_is_one_source(tmp_path):
    from streamwhiten.engine.fit import plan_fit

    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    group.create_array("emb", shape=(50, 3), chunks=(10, 3), dtype="f4")[...] = np.ones((50, 3))
    with pytest.raises(BadInputError, match="given twice"):
        plan_fit([f"{tmp_path}/s.zarr:/emb", f"{tmp_path}/s.zarr/emb"])
    with open_source(f"{tmp_path}/s.zarr:/emb") as a, open_source(f"{tmp_path}/s.zarr/emb") as b:
        assert fingerprint(a) == fingerprint(b)


def test_raw_zarr_reads_past_the_end_fail_like_zarr(tmp_path):
    from streamwhiten.errors import StoreIOError

    spec = write_zarr(tmp_path / "a.zarr", np.ones((10, 2), np.float32), chunk_rows=4)
    with open_source(spec) as source, pytest.raises(StoreIOError, match="outside its 10 rows"):
        source.read(8, 12)


@pytest.mark.parametrize("dtype,tolerance", [(">f8", 1e-12), (">f4", 1e-5)])
@pytest.mark.parametrize("kind", ["h5", "npy"])
def test_big_endian_stores_are_read_in_native_order(tmp_path, dtype, tolerance, kind):
    import h5py

    from streamwhiten.engine.fit import fit_sources

    rows = anisotropic(600, 5) + 3
    if kind == "h5":
        with h5py.File(tmp_path / "be.h5", "w") as handle:
            handle.create_dataset("x", data=rows.astype(dtype), chunks=(100, 5))
        spec = f"{tmp_path / 'be.h5'}:/x"
    else:
        np.save(tmp_path / "be.npy", rows.astype(dtype))
        spec = str(tmp_path / "be.npy")
    with open_source(spec) as source:
        assert source.dtype.isnative and source.dtype.itemsize == np.dtype(dtype).itemsize
        np.testing.assert_array_equal(source.read(10, 20), rows[10:20].astype(dtype))
    state = fit_sources(spec, block_rows=200).state  # big-endian float64 keeps float64 products
    reference = np.cov(rows.astype(dtype).astype(np.float64), rowvar=False, bias=True)
    np.testing.assert_allclose(state.scatter / state.n_rows, reference, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("kind", ["parquet", "lance"])
def test_a_numeric_column_of_a_table_is_read_whole_and_refused_when_unusable(tmp_path, kind):
    pa = pytest.importorskip("pyarrow")
    scores = np.random.default_rng(0).normal(size=300)
    table = pa.table(
        {
            "id": pa.array([f"r{i}" for i in range(300)]),
            "score": pa.array(scores),
            "hole": pa.array([1.0] * 150 + [None] + [2.0] * 149),
        }
    )
    path = str(tmp_path / f"t.{kind}")
    if kind == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path, row_group_size=64)
    else:
        lance = pytest.importorskip("lance")
        lance.write_dataset(table, path, max_rows_per_file=100)
    from streamwhiten.io import read_vector

    values, label = read_vector(f"{path}:score")
    assert label == f"{path}:score"
    np.testing.assert_array_equal(values, scores)
    with pytest.raises(BadInputError, match=r":id: holds string, not numbers"):
        read_vector(f"{path}:id")
    with pytest.raises(BadInputError, match=r":hole: row 150 is null"):
        read_vector(f"{path}:hole")
    with pytest.raises(BadInputError, match=r"no numeric column 'gold'.*score"):
        read_vector(f"{path}:gold")
