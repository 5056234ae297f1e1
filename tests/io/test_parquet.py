"""Parquet inputs and outputs, written with pyarrow: fits equal in-memory statistics, apply equals
``transform`` (ids carried with --keep-columns), kill -9 resumes are bit- and byte-identical, updates pick
up new files and refuse rewritten ones, and every malformed file is a one-line exit-2 error."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import REPO, needs, optional_module, run_command, write_h5  # noqa: E402

pytestmark = needs("pyarrow", reason="Parquet support needs pyarrow (pip install 'streamwhiten[parquet]')")
pa = optional_module("pyarrow")
pq = optional_module("pyarrow.parquet")

from streamwhiten import ReadOptions, Whitener  # noqa: E402
from streamwhiten.core.model import load_model  # noqa: E402
from streamwhiten.engine.engines import DaskEngine  # noqa: E402
from streamwhiten.errors import EXIT_BAD_INPUT, EXIT_NOTHING_TO_DO, BadInputError  # noqa: E402
from streamwhiten.io import expand_specs, fingerprint, input_kind, open_source, read_attrs  # noqa: E402
from streamwhiten.job import default_checkpoint  # noqa: E402
from streamwhiten.synthetic import generate_rows  # noqa: E402
from tests.engine.test_resume import (  # noqa: E402
    kill_when,
    rerun_code,
    rows_done_of_checkpoint,
    rows_done_of_partial,
    spawn,
    statistics,
)


def vectors(rows: np.ndarray, kind: str = "fixed"):
    """``rows`` as an Arrow list array: fixed_size_list, list or large_list."""
    d = rows.shape[1]
    flat = pa.array(np.ascontiguousarray(rows).ravel())
    if kind == "fixed":
        return pa.FixedSizeListArray.from_arrays(flat, d)
    offsets = np.arange(0, rows.size + 1, d, dtype=np.int32 if kind == "list" else np.int64)
    return (pa.ListArray if kind == "list" else pa.LargeListArray).from_arrays(pa.array(offsets), flat)


def write_parquet(
    path,
    rows,
    kind="fixed",
    row_group_size=None,
    column="embedding",
    first_id=0,
    compression="snappy",
    groups=None,
    **options,
) -> str:
    """A Parquet file with ``id``, ``url`` and the vectors; ``groups`` gives uneven row-group sizes."""
    n = rows.shape[0]
    table = pa.table(
        {
            "id": np.arange(first_id, first_id + n, dtype=np.int64),
            "url": [f"https://example.org/{i}" for i in range(first_id, first_id + n)],
            column: vectors(rows, kind),
        }
    )
    if groups is None:
        pq.write_table(table, str(path), row_group_size=row_group_size, compression=compression, **options)
    else:
        with pq.ParquetWriter(str(path), table.schema, compression=compression) as writer:
            start = 0
            for size in groups:
                writer.write_table(table.slice(start, size), row_group_size=size)
                start += size
            assert start == n
    return f"{path}:{column}"


def two_pass(rows):
    x = rows.astype(np.float64)
    mean = x.mean(axis=0)
    centred = x - mean
    return mean, centred.T @ centred / x.shape[0]


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def rows():
    return generate_rows(9000, 24, seed=3)


@pytest.fixture
def shards(tmp_path, rows):
    """A Hugging Face-style directory: data/train-0000N-of-00003.parquet, one of each list type."""
    data = tmp_path / "data"
    data.mkdir()
    for i, kind in enumerate(("fixed", "list", "large_list")):
        write_parquet(
            data / f"train-{i:05d}-of-00003.parquet",
            rows[i * 3000 : (i + 1) * 3000],
            kind,
            row_group_size=700,
            first_id=i * 3000,
        )
    (data / "README.md").write_text("not a shard")
    return data


# ------------------------------------------------------------------------------------------ reading


def test_specs_directories_and_globs(shards, tmp_path):
    files = sorted(str(p) for p in shards.glob("*.parquet"))
    assert input_kind(str(shards)) == "parquet" and input_kind(files[0]) == "parquet"
    assert expand_specs([str(shards)]) == files
    assert expand_specs([f"{shards}:embedding"]) == [f + ":/embedding" for f in files]
    assert expand_specs([f"{shards}/train-*.parquet:embedding"]) == [f + ":/embedding" for f in files]
    with open_source(files[1]) as source:  # the only list column needs no name
        assert source.dataset == "embedding" and source.shape == (3000, 24) and source.chunk_rows == 700
        assert source.label == f"{files[1]}:embedding"
    with pytest.raises(BadInputError, match="directory of 3 Parquet files"):
        open_source(str(shards))


@pytest.mark.parametrize("kind", ["fixed", "list", "large_list"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_reads_every_list_type_and_float_width(tmp_path, rows, kind, dtype):
    data = rows[:1000].astype(dtype)
    spec = write_parquet(tmp_path / "a.parquet", data, kind, row_group_size=300)
    with open_source(spec) as source:
        assert source.dtype == np.dtype(dtype) and source.shape == (1000, 24)
        np.testing.assert_array_equal(source.read(0, 1000), data)
        np.testing.assert_array_equal(source.read(250, 651), data[250:651])  # parts of three row groups


def test_one_dimensional_fixed_shape_tensors_are_vectors(tmp_path, rows):
    data = rows[:500]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"t": pa.FixedShapeTensorArray.from_numpy_ndarray(data)}), path, row_group_size=200)
    with open_source(str(path)) as source:
        assert source.shape == (500, 24)
        np.testing.assert_array_equal(source.read(150, 450), data[150:450])
    pq.write_table(pa.table({"t": pa.FixedShapeTensorArray.from_numpy_ndarray(data.reshape(500, 4, 6))}), path)
    with pytest.raises(BadInputError, match="not a vector column"):
        open_source(f"{path}:t")


@pytest.mark.parametrize("layout", ["uniform", "uneven", "streamed"])
def test_concurrent_reads_of_one_source_from_many_threads(tmp_path, rows, layout, monkeypatch):
    """fit reads one Source from several threads at once; any block layout against any row groups."""
    from streamwhiten.io import parquet

    data = rows[:6000]
    if layout == "uneven":
        spec = write_parquet(tmp_path / "a.parquet", data, "list", groups=[1000, 333, 2000, 1, 1666, 1000])
    else:
        spec = write_parquet(tmp_path / "a.parquet", data, "fixed", row_group_size=2000)
    if layout == "streamed":  # row groups larger than a block: parts of them come from shared streams
        monkeypatch.setattr(parquet, "MAX_GROUP_BLOCK_BYTES", 1000)
        monkeypatch.setattr(parquet, "BATCH_BYTES", 4096)
    ranges = [(a, min(6000, a + size)) for a in range(0, 6000, 257) for size in (257, 1100)]
    with open_source(spec) as source:
        if layout == "streamed":
            assert source.default_block_rows(4096) < 2000 and source.default_block_rows(4096) % 2000
        with ThreadPoolExecutor(4) as pool:
            blocks = list(pool.map(lambda r: source.read(*r), ranges))
    for (a, b), block in zip(ranges, blocks, strict=False):
        np.testing.assert_array_equal(block, data[a:b])


# ------------------------------------------------------------------------------------------ fitting


@pytest.mark.parametrize("precision, bound", [("auto", 1e-6), ("float64", 1e-12)])
def test_fit_equals_two_pass_statistics(shards, rows, precision, bound):
    mean, cov = two_pass(rows)
    for spec in (f"{shards}/train-*.parquet:embedding", str(shards)):
        w = Whitener(precision=precision).fit(spec)
        assert w.n_samples_seen_ == 9000 and len(w.sources_) == 3
        assert rel(w.mean_, mean) <= bound and rel(w.covariance_, cov) <= bound
    w = Whitener(precision=precision, read=ReadOptions(block_rows=512)).fit(str(shards))  # blocks that cut row groups
    assert rel(w.covariance_, cov) <= bound


def test_fit_of_float64_and_snappy_and_uncompressed_files(tmp_path, rows):
    data = rows.astype(np.float64) * 10 + 3
    for i, compression in enumerate(("snappy", "none", "zstd")):
        write_parquet(
            tmp_path / f"s{i}.parquet", data[i * 3000 : (i + 1) * 3000], "list", 1000, compression=compression
        )
    mean, cov = two_pass(data)
    w = Whitener().fit(sorted(str(p) for p in tmp_path.glob("*.parquet")))
    assert rel(w.mean_, mean) <= 1e-12 and rel(w.covariance_, cov) <= 1e-12


def test_cli_fit_apply_keep_columns_and_up_to_date(shards, rows, tmp_path, run_cli):
    model_path = tmp_path / "m.npz"
    assert run_cli("fit", shards, "-o", model_path, "-k", 8, "-q")[0] == 0
    model = load_model(str(model_path))
    assert model.n_rows == 9000
    source = shards / "train-00001-of-00003.parquet"
    out = tmp_path / "out.parquet"
    code, stdout, err = run_cli(
        "apply",
        model_path,
        f"{source}:embedding",
        "-o",
        out,
        "--keep-columns",
        "id,url",
        "--chunk-rows",
        1000,
        "--json",
    )
    assert code == 0, err
    table = pq.read_table(out)
    assert table.column_names == ["id", "url", "embedding"]
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 8)
    np.testing.assert_array_equal(table.column("id").to_numpy(), np.arange(3000, 6000))
    assert table.column("url").to_pylist()[:2] == ["https://example.org/3000", "https://example.org/3001"]
    got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    # like for like: the transform of the same 1,000-row blocks (OpenBLAS's matrix product rounds a row
    # differently with the number of rows it is given, by an ulp)
    blocks = [model.transform(rows[start : start + 1000]) for start in range(3000, 6000, 1000)]
    np.testing.assert_array_equal(got, np.concatenate(blocks))
    assert pq.ParquetFile(out).metadata.num_row_groups == 3  # one row group per block
    attrs = read_attrs(str(out))
    assert attrs["complete"] is True and attrs["kept_columns"] == ["id", "url"] and attrs["n_components"] == 8
    assert len(attrs["model_checksum"]) == 64 and json.loads(stdout)["output"] == f"{out}:embedding"
    before = out.read_bytes()
    code, _, err = run_cli(
        "apply", model_path, f"{source}:embedding", "-o", out, "--keep-columns", "id,url", "--chunk-rows", 1000
    )
    assert code == EXIT_NOTHING_TO_DO and "up to date" in err
    # another run writes the same bytes (no timestamps in the file)
    again = tmp_path / "again.parquet"
    assert (
        run_cli(
            "apply", model_path, f"{source}:embedding", "-o", again, "--keep-columns", "id,url", "--chunk-rows", 1000
        )[0]
        == 0
    )
    assert again.read_bytes() == before
    # float16 output, normalised, no kept columns, the input's row groups as blocks
    half = tmp_path / "half.parquet:vec"
    assert run_cli("apply", model_path, source, "-o", half, "--dtype", "float16", "--normalize", "-q")[0] == 0
    table = pq.read_table(tmp_path / "half.parquet")
    assert table.column_names == ["vec"] and table.schema.field("vec").type == pa.list_(pa.float16(), 8)
    assert pq.ParquetFile(tmp_path / "half.parquet").metadata.num_row_groups == 1
    with open_source(str(tmp_path / "half.parquet")) as written:  # found by the column it records
        assert written.dtype == np.float16
        np.testing.assert_allclose(
            written.read(0, 3000), model.transform(rows[3000:6000], normalize=True), rtol=2e-3, atol=2e-3
        )


def test_keep_columns_errors(shards, rows, tmp_path, run_cli):
    model_path = tmp_path / "m.npz"
    assert run_cli("fit", shards, "-o", model_path, "-q")[0] == 0
    source = shards / "train-00000-of-00003.parquet"
    code, _, err = run_cli("apply", model_path, source, "-o", tmp_path / "o.parquet", "--keep-columns", "id,nope")
    assert code == EXIT_BAD_INPUT and "no column 'nope'" in err and "id (int64)" in err and err.count("\n") == 1
    code, _, err = run_cli("apply", model_path, source, "-o", tmp_path / "o.h5", "--keep-columns", "id")
    assert code == EXIT_BAD_INPUT and "needs a Parquet or Lance output" in err
    h5 = write_h5(tmp_path / "in.h5", rows[:100].astype(np.float32))
    code, _, err = run_cli("apply", model_path, h5, "-o", tmp_path / "p.parquet", "--keep-columns", "id")
    assert code == EXIT_BAD_INPUT and "needs a Parquet or Lance input" in err
    code, _, err = run_cli("apply", model_path, source, "-o", tmp_path / "q.parquet:id", "--keep-columns", "id")
    assert code == EXIT_BAD_INPUT and "name the output's vector column" in err
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no partial outputs left
    # an HDF5 input to a Parquet output works without kept columns
    assert run_cli("apply", model_path, h5, "-o", tmp_path / "p.parquet", "-q")[0] == 0


def test_update_picks_up_new_files_and_refuses_rewritten_ones(shards, rows, tmp_path, run_cli):
    files = sorted(shards.glob("*.parquet"))
    extra = tmp_path / "more"
    extra.mkdir()
    for f in files[:2]:
        os.rename(f, extra / f.name)
    model, full = tmp_path / "m.npz", tmp_path / "full.npz"
    assert run_cli("fit", extra, "-o", model, "--precision", "float64", "-q")[0] == 0
    os.rename(files[2], extra / files[2].name)  # a new shard appears
    code, out, err = run_cli("fit", extra, "--update", model, "--precision", "float64", "--json")
    assert code == 0, err
    assert json.loads(out)["rows_read"] == 3000
    assert run_cli("fit", extra, "-o", full, "--precision", "float64", "-q")[0] == 0
    updated, refit = load_model(str(model)), load_model(str(full))
    assert updated.n_rows == refit.n_rows == 9000
    assert rel(updated.state.scatter, refit.state.scatter) <= 1e-12
    assert rel(updated.state.mean, refit.state.mean) <= 1e-12
    assert run_cli("fit", extra, "--update", model)[0] == EXIT_NOTHING_TO_DO
    # a shard rewritten with the same rows and more after them: Parquet files are not appended to
    write_parquet(extra / files[0].name, np.vstack([rows[:3000], rows[:10]]), "fixed", row_group_size=700)
    code, _, err = run_cli("fit", extra, "--update", model)
    assert code == EXIT_BAD_INPUT and files[0].name in err and "rewritten" in err and err.count("\n") == 1


def test_run_job_over_a_shard_directory(shards, rows, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(
        f'[input]\npaths = ["{shards}"]\n[model]\npath = "model.npz"\nn_components = 6\n'
        '[apply]\noutput = "out/{stem}.parquet"\nkeep_columns = ["id"]\n'
    )
    done = run_command("run", job, "-q")
    assert done.returncode == 0, done.stderr
    model = load_model(str(tmp_path / "model.npz"))
    for i in range(3):
        table = pq.read_table(tmp_path / "out" / f"train-{i:05d}-of-00003.parquet")
        np.testing.assert_array_equal(table.column("id").to_numpy(), np.arange(i * 3000, (i + 1) * 3000))
        np.testing.assert_array_equal(
            np.stack(table.column("embedding").to_numpy(zero_copy_only=False)),
            model.transform(rows[i * 3000 : (i + 1) * 3000]),
        )
    assert run_command("run", job, "-q").returncode == EXIT_NOTHING_TO_DO


def test_eval_pairs_and_gold_scores_from_parquet(tmp_path, rows):
    a, b = rows[:500], rows[500:1000] + 0.1 * rows[:500]
    scores = np.linalg.norm(a - b, axis=1)
    write_parquet(tmp_path / "a.parquet", a)
    write_parquet(tmp_path / "b.parquet", b, "list")
    pq.write_table(pa.table({"score": scores, "label": ["x"] * 500}), tmp_path / "s.parquet")
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    np.save(tmp_path / "s.npy", scores)
    from_parquet = run_command(
        "eval",
        "--pairs-a",
        tmp_path / "a.parquet",
        "--pairs-b",
        tmp_path / "b.parquet",
        "--scores",
        tmp_path / "s.parquet",
        "--json",
    )
    from_npy = run_command(
        "eval",
        "--pairs-a",
        tmp_path / "a.npy",
        "--pairs-b",
        tmp_path / "b.npy",
        "--scores",
        tmp_path / "s.npy",
        "--json",
    )
    assert from_parquet.returncode == 0, from_parquet.stderr
    assert json.loads(from_parquet.stdout)["raw"] == json.loads(from_npy.stdout)["raw"]


def test_dask_engine_reads_parquet(shards, rows):
    pytest.importorskip("distributed")
    from streamwhiten.engine import distributed as sd

    specs = expand_specs([str(shards)])
    with sd.dask_client(n_workers=1) as client:
        result = sd.fit_dask(specs, precision="float64", cluster=DaskEngine(client=client))
    mean, cov = two_pass(rows)
    assert result.state.n_rows == 9000
    assert rel(result.state.scatter / 9000, cov) <= 1e-12 and rel(result.state.mean, mean) <= 1e-12


# ------------------------------------------------------------------------------------- kill -9 resumes


@pytest.mark.slow
def test_fit_and_apply_killed_resume_bit_identical(tmp_path):
    data = generate_rows(48_000, 32, seed=9)
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(3):
        write_parquet(
            shards / f"part-{i}.parquet",
            data[i * 16_000 : (i + 1) * 16_000],
            "list" if i else "fixed",
            row_group_size=400,
        )
    fit_args = ["--chunk-rows", 400, "--checkpoint-every", 1, "-q"]
    reference = tmp_path / "reference.npz"
    assert run_command("fit", shards, "-o", reference, *fit_args).returncode == 0
    expected = statistics(reference)
    rng = np.random.default_rng(2027)
    killed = 0
    for target in sorted(rng.integers(800, 46_000, size=3)):
        model = tmp_path / f"m-{target}.npz"
        checkpoint = default_checkpoint(str(model))
        process = spawn("fit", shards, "-o", model, *fit_args)
        was_killed = kill_when(process, lambda: rows_done_of_checkpoint(checkpoint), target)
        if was_killed:
            killed += 1
            assert not model.exists() and os.path.exists(checkpoint)
        assert run_command("fit", shards, "-o", model, *fit_args).returncode == rerun_code(was_killed)
        assert statistics(model) == expected
    assert killed >= 2

    source = shards / "part-1.parquet"
    apply_args = ["--chunk-rows", 400, "--checkpoint-seconds", 0, "--keep-columns", "id", "-q"]
    good = tmp_path / "reference.parquet"
    assert run_command("apply", reference, source, "-o", good, *apply_args).returncode == 0
    killed = 0
    for target in sorted(rng.integers(800, 15_000, size=3)):
        output = str(tmp_path / f"out-{target}.parquet")
        process = spawn("apply", reference, source, "-o", output, *apply_args)
        was_killed = kill_when(process, lambda: rows_done_of_partial(output), target)
        if was_killed:
            killed += 1
            assert not os.path.exists(output)
        resumed = run_command("apply", reference, source, "-o", output, *apply_args, "--json")
        assert resumed.returncode == rerun_code(was_killed), resumed.stderr
        if was_killed:  # continued from its progress record, not started over
            assert json.loads(resumed.stdout)["resumed_at_row"] >= target
        with open(output, "rb") as a, open(good, "rb") as b:
            assert a.read() == b.read()
    assert killed >= 2


# ------------------------------------------------------------------------------------- malformed files


def one_line_exit_2(*args):
    done = run_command(*args)
    assert done.returncode == EXIT_BAD_INPUT, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def test_malformed_files_are_one_line_exit_2_naming_file_row_group_and_row(tmp_path, rows):
    data = rows[:2000].astype(np.float32)
    model = tmp_path / "m.npz"

    def with_list(name, values, value_type=pa.float32(), list_type=pa.list_):
        path = tmp_path / name
        pq.write_table(
            pa.table({"id": np.arange(len(values)), "emb": pa.array(values, list_type(value_type))}),
            path,
            row_group_size=500,
        )
        return path

    as_lists = [list(map(float, row)) for row in data]
    null_vector = with_list("null_vector.parquet", as_lists[:1234] + [None] + as_lists[1235:])
    err = one_line_exit_2("fit", null_vector, "-o", model)
    assert "null_vector.parquet:emb: row group 2, row 1,234: null vector" in err
    null_value = with_list("null_value.parquet", as_lists[:777] + [[None] + as_lists[777][1:]] + as_lists[778:])
    err = one_line_exit_2("fit", null_value, "-o", model)
    assert "null_value.parquet:emb: row group 1, row 777: value 0 of the vector is null" in err
    ragged = with_list("ragged.parquet", as_lists[:1999] + [as_lists[1999][:-1]], list_type=pa.large_list)
    err = one_line_exit_2("fit", ragged, "-o", model)
    assert "ragged.parquet:emb: row group 3, row 1,999: has 23 values, not 24" in err
    integers = with_list("ints.parquet", [[1, 2, 3]] * 10, pa.int32())
    err = one_line_exit_2("fit", integers, "-o", model)
    assert "ints.parquet" in err and "int32 values, not float16, float32 or float64" in err
    strings = with_list("strings.parquet", [["a", "b"]] * 10, pa.string())
    assert "strings.parquet" in one_line_exit_2("fit", strings, "-o", model)
    # a list column of another width in a second file
    good = write_parquet(tmp_path / "good.parquet", data, "list")
    wide = write_parquet(tmp_path / "wide.parquet", np.hstack([data, data[:, :1]]), "list")
    err = one_line_exit_2("fit", good, wide, "-o", model)
    assert "wide.parquet:embedding: has 25 columns but" in err and "good.parquet:embedding has 24" in err
    # no name when there are several list columns, a missing column, a column that is not a list
    two = tmp_path / "two.parquet"
    pq.write_table(pa.table({"a": vectors(data), "b": vectors(data, "list")}), two)
    assert "name the vector column to read; its vector columns: a, b" in one_line_exit_2("fit", two, "-o", model)
    assert "has no vector column 'c'" in one_line_exit_2("fit", f"{two}:c", "-o", model)
    assert "not a vector column" in one_line_exit_2("fit", good.replace("embedding", "id"), "-o", model)
    # damaged files: truncated, not Parquet at all, a corrupted page
    raw = (tmp_path / "good.parquet").read_bytes()
    (tmp_path / "truncated.parquet").write_bytes(raw[: len(raw) // 2])
    assert "truncated.parquet" in one_line_exit_2("fit", tmp_path / "truncated.parquet", "-o", model)
    (tmp_path / "text.parquet").write_text("id,embedding\n1,2\n")
    assert "text.parquet" in one_line_exit_2("fit", tmp_path / "text.parquet", "-o", model)
    # finite garbage in a page is seen only through page checksums (as written here), which are verified
    checked = write_parquet(tmp_path / "crc.parquet", data, "fixed", 500, compression="none", write_page_checksum=True)
    raw = bytearray((tmp_path / "crc.parquet").read_bytes())
    chunk = pq.ParquetFile(tmp_path / "crc.parquet").metadata.row_group(2).column(2)  # row group 2's vectors
    middle = (chunk.dictionary_page_offset or chunk.data_page_offset) + chunk.total_compressed_size // 2
    raw[middle : middle + 64] = bytes(64)
    (tmp_path / "crc.parquet").write_bytes(bytes(raw))
    err = one_line_exit_2("fit", checked, "-o", model)
    assert "crc.parquet:embedding: row group" in err and "damaged" in err
    assert not model.exists()


def test_missing_pyarrow_is_one_line_naming_the_extra(tmp_path, rows):
    path = tmp_path / "a.parquet"
    write_parquet(path, rows[:100])
    code = f"""
import sys
sys.modules.update(pyarrow=None)
from streamwhiten.cli import main
sys.exit(main(['fit', {str(path)!r}, '-o', {str(tmp_path / "m.npz")!r}]))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_BAD_INPUT
    assert done.stderr.count("\n") == 1 and "pip install 'streamwhiten[parquet]'" in done.stderr


def test_import_streamwhiten_does_not_import_pyarrow():
    code = (
        "import sys, streamwhiten, streamwhiten.io, streamwhiten.cli.app, streamwhiten.engine.fit, streamwhiten.engine.apply\n"
        "assert not [m for m in sys.modules if m.startswith(('pyarrow', 'lance'))], 'imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_fingerprint_samples_row_group_starts_and_records_the_footer(tmp_path, rows):
    spec = write_parquet(tmp_path / "a.parquet", rows[:5000], row_group_size=1000)
    with open_source(spec) as source:
        assert source.sample_ranges(5000) == [(0, 64), (1000, 1064), (2000, 2064), (3000, 3064), (4000, 4064)]
        first = fingerprint(source)
    assert len(first.layout_sha256) == 64
    write_parquet(tmp_path / "a.parquet", rows[:5000], row_group_size=1000, compression="zstd")
    with open_source(spec) as source:  # the same rows, stored otherwise: another footer
        second = fingerprint(source)
    assert second.sha256_sampled == first.sha256_sampled and second.layout_sha256 != first.layout_sha256
