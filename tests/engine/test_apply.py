"""The chunked applier: round trips between stores, attributes, completeness."""

import os

import numpy as np
import pytest
from conftest import anisotropic, write_h5, write_zarr

from streamwhiten import Whitener
from streamwhiten.engine.apply import ApplyPart, apply_model
from streamwhiten.errors import BadInputError, NonFiniteError, NothingToDoError, OutputExistsError
from streamwhiten.io import open_source, partial_path, read_attrs
from streamwhiten.options import ApplyOptions, ReadOptions
from streamwhiten.progress import Watch


@pytest.fixture
def rows():
    return anisotropic(1500, 16, seed=11).astype(np.float32)


@pytest.fixture
def model(rows):
    return Whitener(beta=1.0, gamma=1.0, n_components=6).fit(rows).model_


def read_all(spec):
    with open_source(spec) as source:
        return source.read(0, source.n_rows)


@pytest.mark.parametrize("normalize", [False, True])
def test_hdf5_to_zarr_and_zarr_to_hdf5_equal_in_memory_transform(tmp_path, rows, model, normalize):
    expected = model.transform(rows, normalize=normalize)
    h5_in = write_h5(tmp_path / "in.h5", rows, chunk_rows=200)
    zarr_in = write_zarr(tmp_path / "in.zarr", rows, chunk_rows=300)
    apply_model(
        model, h5_in, str(tmp_path / "out.zarr"), ApplyOptions(normalize=normalize), ReadOptions(block_rows=350)
    )
    apply_model(model, zarr_in, str(tmp_path / "out.h5:/vectors"), ApplyOptions(normalize=normalize))
    for out in (str(tmp_path / "out.zarr"), str(tmp_path / "out.h5:/vectors")):
        got = read_all(out)
        assert got.dtype == np.float32 and got.shape == (1500, 6)
        np.testing.assert_array_equal(got, expected)
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(expected, axis=1), 1.0, rtol=1e-5)


def test_attributes_float16_and_zarr_v2(tmp_path, rows, model):
    spec = write_h5(tmp_path / "in.h5", rows)
    out = str(tmp_path / "out.zarr")
    summary = apply_model(model, spec, out, ApplyOptions(dtype="float16", zarr_format=2))
    attrs = read_attrs(out)
    assert attrs["complete"] is True and attrs["n_components"] == 6 and attrs["beta"] == 1.0
    assert attrs["normalized"] is False and len(attrs["model_checksum"]) == 64
    got = read_all(out)
    assert got.dtype == np.float16 and summary.n_rows == 1500
    np.testing.assert_allclose(got, model.transform(rows), rtol=2e-3, atol=2e-3)


def test_refuses_to_overwrite_and_leaves_nothing_on_error(tmp_path, rows, model):
    spec = write_h5(tmp_path / "in.h5", rows)
    out = str(tmp_path / "out.h5")
    apply_model(model, spec, out)
    before = read_all(out)
    with pytest.raises(NothingToDoError, match="up to date"):  # the same model, settings and input
        apply_model(model, spec, out)
    with pytest.raises(OutputExistsError, match=r"overwrite=True"):  # another setting
        apply_model(model, spec, out, ApplyOptions(normalize=True))
    bad = rows.copy()
    bad[0] += 1.0  # other rows than the output's (an output that is up to date is kept, overwrite or not)
    bad[1234, 5] = np.nan
    bad_spec = write_h5(tmp_path / "bad.h5", bad, chunk_rows=100)
    with pytest.raises(NonFiniteError, match=r"bad.h5:/emb: row 1234 holds NaN or Inf"):
        apply_model(model, bad_spec, out, ApplyOptions(overwrite=True))
    np.testing.assert_array_equal(read_all(out), before)  # the old output survived
    assert not os.path.exists(partial_path(out))
    with pytest.raises(BadInputError, match="would overwrite the input"):
        apply_model(model, spec, str(tmp_path / "in.h5"), ApplyOptions(overwrite=True))
    os.link(tmp_path / "in.h5", tmp_path / "hardlink.h5")
    with pytest.raises(BadInputError, match="would overwrite the input"):
        apply_model(model, spec, str(tmp_path / "hardlink.h5"), ApplyOptions(overwrite=True))
    np.testing.assert_array_equal(read_all(spec), rows)


def test_skip_nonfinite_writes_nan_rows(tmp_path, rows, model):
    bad = rows.copy()
    bad[[3, 700]] = np.inf
    summary = apply_model(
        model, write_h5(tmp_path / "bad.h5", bad), str(tmp_path / "o.zarr"), ApplyOptions(skip_nonfinite=True)
    )
    got = read_all(str(tmp_path / "o.zarr"))
    assert summary.n_nonfinite_rows == 2
    assert np.isnan(got[[3, 700]]).all() and np.isfinite(np.delete(got, [3, 700], axis=0)).all()


@pytest.mark.parametrize("skip_nonfinite", [False, True])
def test_values_that_overflow_when_centred_in_place_are_not_taken_for_nan(tmp_path, skip_nonfinite):
    """apply centres each block in place; a finite value that overflows there must be reported as too
    large (naming the file and row), never written as a NaN row."""
    from streamwhiten.core import stats
    from streamwhiten.core.model import finalize
    from streamwhiten.errors import ValuesTooLargeError

    state = stats.Moments(100, np.full(3, -2e38), np.diag([100.0, 50.0, 10.0]))
    model = finalize(state, beta=1.0, gamma=0.0)
    data = np.zeros((500, 3), dtype=np.float32)
    data[321, 1] = 2e38  # finite; 2e38 - (-2e38) is not
    data[400, 0] = np.nan
    spec = write_h5(tmp_path / "big.h5", data, chunk_rows=100)
    with pytest.raises(ValuesTooLargeError, match=r"big.h5:/emb: row 321: values too large for float32") as info:
        apply_model(
            model,
            spec,
            str(tmp_path / "o.h5"),
            ApplyOptions(skip_nonfinite=skip_nonfinite),
            ReadOptions(block_rows=200),
        )
    assert info.value.row == 321
    assert sorted(os.listdir(tmp_path)) == ["big.h5"]


def test_float16_output_refuses_values_that_do_not_fit(tmp_path, rows, model):
    from streamwhiten.errors import ValuesTooLargeError

    big = rows * np.float32(1e5)  # whitened values stay small: a rotation keeps the scale
    rotation = model.with_params(beta=0.0, gamma=0.0)
    spec = write_h5(tmp_path / "in.h5", big)
    with pytest.raises(ValuesTooLargeError, match=r"in.h5:/emb: row \d+: .*float16.*write float32"):
        apply_model(rotation, spec, str(tmp_path / "o.h5"), ApplyOptions(dtype="float16"))
    assert sorted(os.listdir(tmp_path)) == ["in.h5"]
    apply_model(rotation, spec, str(tmp_path / "o.h5"), ApplyOptions(dtype="float32"))


def test_width_mismatch(tmp_path, model):
    spec = write_h5(tmp_path / "narrow.h5", anisotropic(20, 5).astype(np.float32))
    with pytest.raises(BadInputError, match="narrow.h5:/emb: has 5 columns but the model was fitted on 16"):
        apply_model(model, spec, str(tmp_path / "o.h5"))
    assert os.listdir(tmp_path) == ["narrow.h5"]


@pytest.mark.parametrize("threads", [2, 3])
def test_worker_threads_write_every_block_in_order(tmp_path, rows, model, threads):
    spec = write_h5(tmp_path / "in.h5", rows, chunk_rows=100)
    expected = model.transform(rows, normalize=True)
    for out in (str(tmp_path / "out.zarr"), str(tmp_path / "out.h5")):
        summary = apply_model(
            model, spec, out, ApplyOptions(normalize=True), ReadOptions(block_rows=100), threads=threads
        )
        assert summary.n_rows == 1500
        np.testing.assert_allclose(read_all(out), expected, rtol=1e-5, atol=1e-6)


def test_worker_threads_name_the_first_bad_row(tmp_path, rows, model):
    bad = rows.copy()
    bad[1234, 3] = np.inf
    bad[1400, 0] = np.nan
    spec = write_h5(tmp_path / "in.h5", bad, chunk_rows=100)
    with pytest.raises(NonFiniteError, match="row 1234"):
        apply_model(model, spec, str(tmp_path / "out.h5"), ApplyOptions(), ReadOptions(block_rows=100), threads=3)
    assert not os.path.exists(tmp_path / "out.h5") and not os.path.exists(partial_path(str(tmp_path / "out.h5")))
    summary = apply_model(
        model, spec, str(tmp_path / "out.h5"), ApplyOptions(skip_nonfinite=True), ReadOptions(block_rows=100), threads=3
    )
    got = read_all(str(tmp_path / "out.h5"))
    assert summary.n_nonfinite_rows == 2
    assert np.isnan(got[[1234, 1400]]).all() and np.isfinite(np.delete(got, [1234, 1400], axis=0)).all()


def test_bad_thread_count_is_refused_before_any_output(tmp_path, rows, model):
    spec = write_h5(tmp_path / "in.h5", rows)
    with pytest.raises(BadInputError, match="threads"):
        apply_model(model, spec, str(tmp_path / "out.h5"), threads=0)
    assert sorted(os.listdir(tmp_path)) == ["in.h5"]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_apply_records_the_fingerprint_of_a_separate_read_without_reading_samples_twice(
    tmp_path, monkeypatch, model, threads, dtype
):
    """The input's fingerprint is hashed from the blocks as they are read (issue #18: on a compressed
    input each separate sampled read decoded a whole chunk); the output records the fingerprint a
    separate read computes, a rerun finds it up to date, and a float16 input gives the rows its float32
    widening gives (widened as decoded, not in a copy)."""
    import zarr

    from streamwhiten.io import Source, fingerprint

    rows = anisotropic(700, 16, seed=5).astype(dtype)
    array = zarr.create_array(store=str(tmp_path / "in.zarr"), shape=rows.shape, chunks=(64, 16), dtype=dtype)
    array[:] = rows  # zarr 3's default bytes + zstd
    spec = str(tmp_path / "in.zarr")
    with open_source(spec) as source:
        expected = fingerprint(source).sha256_sampled
    reads = []
    original = Source.read
    monkeypatch.setattr(Source, "read", lambda self, a, b: reads.append((a, b)) or original(self, a, b))
    out = str(tmp_path / "out.h5") + ":/y"
    apply_model(model, spec, out, ApplyOptions(), ReadOptions(block_rows=100), threads=threads)
    assert reads == []
    with open_source(out) as written:
        assert written.attrs()["source_sha256"] == expected
        work = np.float64 if dtype == np.float64 else np.float32
        np.testing.assert_array_equal(written.read(0, 700), model.transform(rows.astype(work)).astype(np.float32))
    with pytest.raises(NothingToDoError):
        apply_model(model, spec, out, ApplyOptions(), ReadOptions(block_rows=100), threads=threads)


# ------------------------------------------------------------------------------ the storage of a model


def test_apply_writes_the_models_storage_unless_told_otherwise(tmp_path, rows, model):
    """A model recording a storage (what tune chose) is applied as it says, codes included; an explicit
    dtype wins; a model recording none writes float32, as before."""
    from dataclasses import replace

    from conftest import run_command

    import streamwhiten
    from streamwhiten.core.model import save_model
    from streamwhiten.storage import Storage

    spec = write_h5(tmp_path / "in.h5", rows, chunk_rows=500)
    for dtype, written in (("float16", np.float16), ("int8", np.int8), ("binary", np.uint8), (None, np.float32)):
        path = str(tmp_path / f"m-{dtype}.npz")
        save_model(model if dtype is None else replace(model, storage=Storage(dtype)), path)
        out = str(tmp_path / f"out-{dtype}.zarr")
        outcome = streamwhiten.apply(path, spec, out)
        assert stored(out).dtype == written and outcome.dtype == (dtype or "float32")
        done = run_command("apply", path, spec, "-o", tmp_path / f"cli-{dtype}.h5:/v", "--json")
        assert done.returncode == 0 and stored(str(tmp_path / f"cli-{dtype}.h5:/v")).dtype == written
    path = str(tmp_path / "m-int8.npz")
    streamwhiten.apply(path, spec, str(tmp_path / "explicit.zarr"), options=ApplyOptions(dtype="float32"))
    assert stored(str(tmp_path / "explicit.zarr")).dtype == np.float32
    # dtype None at the engine's own entry point is the model's storage too (not the input's dtype), and so
    # in its up-to-date check
    coded, unset = replace(model, storage=Storage("int8")), ApplyOptions(dtype=None)
    for name, fitted, written in (("plain.h5", model, np.float32), ("coded.h5", coded, np.int8)):
        out = str(tmp_path / name)
        assert apply_model(fitted, spec, out, unset).dtype == np.dtype(written).name
        assert stored(out).dtype == written
        with pytest.raises(NothingToDoError, match="is up to date"):
            apply_model(fitted, spec, out, replace(unset, overwrite=True))
    rewritten = apply_model(model, spec, str(tmp_path / "coded.h5"), replace(unset, overwrite=True))
    assert rewritten.dtype == "float32" and stored(str(tmp_path / "coded.h5")).dtype == np.float32


# ------------------------------------------------------------------- int8 codes and sign bits (issue #26)


def stored(spec):
    """The array an apply wrote, read with its storage library alone (codes are no input of ours)."""
    import h5py
    import pyarrow.parquet as pq
    import zarr

    path, _, inner = str(spec).partition(":")
    if path.endswith(".h5"):
        with h5py.File(path, "r") as handle:
            return handle[inner or "embeddings"][...]
    if path.endswith(".zarr"):
        return zarr.open_array(path, mode="r")[...]
    if path.endswith(".parquet"):
        table = pq.read_table(path)
    else:
        import lance

        table = lance.dataset(path).to_table()
    column = table.column(inner or "embedding").combine_chunks()
    values = column.values.to_numpy(zero_copy_only=False)
    return values.reshape(len(column), column.type.list_size)


OUTPUTS = ("out.h5:/v", "out.zarr", "out.parquet", "out.lance")


@pytest.mark.parametrize("dtype", ["int8", "binary"])
@pytest.mark.parametrize("output", OUTPUTS)
def test_quantized_outputs_are_the_codes_of_the_unit_transform_with_their_decode_record(
    tmp_path, rows, model, dtype, output
):
    import streamwhiten
    from streamwhiten import serving
    from streamwhiten.core.quantize import Quantization

    spec = write_h5(tmp_path / "in.h5", rows, chunk_rows=200)
    out = str(tmp_path / output)
    outcome = streamwhiten.apply(model, spec, out, options=ApplyOptions(dtype=dtype), read=ReadOptions(block_rows=300))
    y = model.transform(rows, normalize=True)  # codes and bits are of the unit vectors, as the search stores them
    got = stored(out)
    if dtype == "int8":  # the record every other path uses (tune, eval, serving, export), from the statistics
        expected = model.quantization("int8").encode(y)
        assert got.dtype == np.int8 and got.shape == (1500, 6)
    else:  # numpy's packbits order; a component exactly 0 is a 0 bit (y > 0)
        expected = np.packbits(y > 0, axis=1)
        assert got.dtype == np.uint8 and got.shape == (1500, 1)
    np.testing.assert_array_equal(got, expected)
    assert (outcome.dtype, outcome.n_components, outcome.normalized) == (dtype, 6, True)
    attrs = read_attrs(out)
    assert attrs["dtype"] == dtype and attrs["normalized"] == True and attrs["complete"] == True  # noqa: E712 (HDF5: numpy bools)
    record = Quantization.from_attrs(attrs)  # a dict, or its JSON where the store keeps text (HDF5)
    assert (record.kind, record.n_components, record.normalized) == (dtype, 6, True)
    decoded = serving.decode(got, attrs, np.float64)
    if dtype == "int8":  # scale and offset recorded exactly; the codes decode to within half a step
        reference = model.quantization("int8")
        np.testing.assert_array_equal(record.scale, reference.scale)
        np.testing.assert_array_equal(record.offset, reference.offset)
        inside = np.abs(y - record.offset) <= 127 * record.scale
        assert inside.mean() > 0.99
        error = np.abs(decoded - y.astype(np.float64))
        assert np.all((error <= record.scale / 2 * (1 + 1e-9))[inside])
    else:
        np.testing.assert_array_equal(decoded, np.where(y > 0, 1.0, -1.0))


def test_apply_k_10_binary_gives_two_bytes_a_row_on_the_command_line(tmp_path, rows, model):
    import json

    from conftest import run_command

    from streamwhiten.core.model import save_model

    save_model(model.with_params(n_components=12), str(tmp_path / "m.npz"))
    spec = write_h5(tmp_path / "in.h5", rows)
    out = tmp_path / "bits.h5"
    done = run_command("apply", tmp_path / "m.npz", spec, "-o", out, "-k", 10, "--dtype", "binary", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["dtype"], report["n_components"], report["normalized"]) == ("binary", 10, True)
    bits = stored(str(out))
    assert bits.shape == (1500, 2) and bits.dtype == np.uint8
    y = model.with_params(n_components=10).transform(rows, normalize=True)
    np.testing.assert_array_equal(bits, np.packbits(y > 0, axis=1))
    assert not np.any(bits[:, 1] & 0b0011_1111)  # the last byte's 6 unused bits are zero
    # the same again: nothing to do (exit 3); another dtype over it: refused, or replaced with --overwrite
    again = run_command("apply", tmp_path / "m.npz", spec, "-o", out, "-k", 10, "--dtype", "binary")
    assert again.returncode == 3 and "is up to date" in again.stderr
    other = run_command("apply", tmp_path / "m.npz", spec, "-o", out, "-k", 10, "--dtype", "int8")
    assert other.returncode == 2 and "exists" in other.stderr
    other = run_command("apply", tmp_path / "m.npz", spec, "-o", out, "-k", 10, "--dtype", "int8", "--overwrite")
    assert other.returncode == 0 and stored(str(out)).shape == (1500, 10)
    # codes are no input: read as one, a one-line exit 2 that says how to decode them
    refused = run_command("fit", out, "-o", tmp_path / "again.npz")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "got dtype int8 (int8 codes, sign bits or a vector code written by apply: decode them with" in refused.stderr


def test_quantized_outputs_refuse_nan_rows_in_one_line_before_reading(tmp_path, rows, model):
    from conftest import run_command

    from streamwhiten.core.model import save_model

    save_model(model, str(tmp_path / "m.npz"))
    spec = write_h5(tmp_path / "in.h5", rows)
    for dtype in ("int8", "binary"):
        done = run_command(
            "apply", tmp_path / "m.npz", spec, "-o", tmp_path / "q.zarr", "--dtype", dtype, "--skip-nonfinite"
        )
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert f"dtype {dtype!r} cannot hold the NaN rows skip_nonfinite writes" in done.stderr
        assert not os.path.exists(tmp_path / "q.zarr")
    bad = rows.copy()
    bad[700, 2] = np.nan
    spec = write_h5(tmp_path / "bad.h5", bad)
    with pytest.raises(NonFiniteError, match="row 700 holds NaN or Inf"):
        apply_model(model, spec, str(tmp_path / "q.h5"), ApplyOptions(dtype="int8"))
    assert not os.path.exists(tmp_path / "q.h5")


def test_an_interrupted_quantized_apply_resumes_only_with_the_same_codes(tmp_path, rows, model):
    """Stopped after its first blocks, the same apply continues to the bytes of an uninterrupted run; a run
    writing other codes (bits, or int8 of other ranges) starts over."""
    from dataclasses import replace

    from streamwhiten.errors import InterruptedRunError
    from streamwhiten.storage import Storage

    spec = write_h5(tmp_path / "in.h5", rows, chunk_rows=100)
    read = ReadOptions(block_rows=100)
    options = ApplyOptions(dtype="int8", progress_seconds=0)
    reference = str(tmp_path / "reference.h5")
    apply_model(model, spec, reference, options, read)

    def stopped(path, model=model, options=options):
        calls = iter(range(10**6))
        with pytest.raises(InterruptedRunError):
            apply_model(model, spec, path, options, read, watch=Watch(should_stop=lambda: next(calls) >= 3))
        assert os.path.exists(partial_path(path)) and not os.path.exists(path)

    out = str(tmp_path / "out.h5")
    stopped(out)
    outcome = apply_model(model, spec, out, options, read)
    assert outcome.resumed_at_row == 400
    with open(out, "rb") as a, open(reference, "rb") as b:
        assert a.read() == b.read()  # every byte, the decode record included
    for name, other_model, other in (
        ("bits.h5", model, replace(options, dtype="binary")),
        ("clip.h5", replace(model, storage=Storage("int8", int8_clip=3.0)), options),
    ):
        path = str(tmp_path / name)
        stopped(path)  # int8 codes of the default ranges
        outcome = apply_model(other_model, spec, path, other, read)
        assert outcome.resumed_at_row == 0
        np.testing.assert_array_equal(
            stored(path), other_model.quantization(str(other.dtype)).encode(model.transform(rows, normalize=True))
        )


def test_job_file_dtype_int8_writes_codes_and_is_up_to_date_after(tmp_path, rows):
    from conftest import run_command

    from streamwhiten.core.model import load_model

    write_h5(tmp_path / "in.h5", rows)
    job = tmp_path / "job.toml"
    job.write_text(
        f'[input]\npaths = ["{tmp_path / "in.h5"}"]\n[model]\npath = "m.npz"\nn_components = 5\n'
        '[apply]\noutput = "out/{stem}.zarr"\ndtype = "int8"\n'
    )
    done = run_command("run", job)
    assert done.returncode == 0, done.stderr
    model = load_model(str(tmp_path / "m.npz"))
    codes = stored(str(tmp_path / "out/in.zarr"))
    np.testing.assert_array_equal(codes, model.quantization("int8").encode(model.transform(rows, normalize=True)))
    assert read_attrs(str(tmp_path / "out/in.zarr"))["quantization"]["kind"] == "int8"
    again = run_command("run", job)
    assert again.returncode == 3, again.stderr  # the codes are what this job writes: nothing to do
    job.write_text(job.read_text() + "skip_nonfinite = true\n")
    refused = run_command("run", job)
    assert refused.returncode == 2 and "[apply] dtype 'int8' cannot hold the NaN rows" in refused.stderr


# ------------------------------------------------------------------------- an apply of part of the rows


@pytest.mark.parametrize("kind", ["h5", "zarr", "parquet"])
@pytest.mark.parametrize("window", [(0, 1500), (0, 1), (700, 1500), (333, 1111), (1499, 1500)])
def test_rows_writes_the_transform_of_that_range_and_records_it(tmp_path, rows, model, kind, window):
    """``rows=(start, stop)`` writes the transform of input rows [start, stop) only, blocks cut from the
    range's own first row (at 100-row blocks, a range starting at 333 straddles the store's chunks)."""
    start, stop = window
    spec = write_zarr(tmp_path / "in.zarr", rows, chunk_rows=250)
    out = str(tmp_path / f"part.{kind}")
    outcome = apply_model(
        model, spec, out, ApplyOptions(normalize=True), ReadOptions(block_rows=100), part=ApplyPart(window)
    )
    got = read_all(out)
    assert got.shape == (stop - start, 6) and outcome.n_rows == stop - start and outcome.rows == window
    # the reference transforms the same rows alone: a one-row product takes BLAS's matrix-vector path, whose
    # sums run in another order than a matrix product's (about 1e-7 apart), so equality is exact only like for like
    np.testing.assert_array_equal(got, model.transform(rows[start:stop], normalize=True))
    from streamwhiten.output_plan import recorded_rows

    attrs = read_attrs(out)
    assert recorded_rows(attrs) == (start, stop) and attrs["complete"] in (True, 1)
    # its input fingerprint is of the range's rows: another range of the same input is another output
    with pytest.raises(NothingToDoError):
        apply_model(model, spec, out, ApplyOptions(normalize=True), ReadOptions(block_rows=100), part=ApplyPart(window))
    with pytest.raises(OutputExistsError):
        apply_model(
            model,
            spec,
            out,
            ApplyOptions(normalize=True),
            part=ApplyPart((start, stop - 1) if stop - start > 1 else None),
        )


def test_rows_outside_the_input_or_empty_are_refused_before_anything_is_written(tmp_path, rows, model):
    spec = write_h5(tmp_path / "in.h5", rows)
    for bad in [(5, 5), (-1, 3), (0, 1501), (10, 2), (0.5, 3), "ab", (1,), 7]:
        with pytest.raises(BadInputError, match="rows"):
            apply_model(model, spec, str(tmp_path / "out.h5"), part=ApplyPart(bad))
    assert sorted(os.listdir(tmp_path)) == ["in.h5"]


def test_rows_messages_name_the_input_row_and_nan_rows_keep_their_place(tmp_path, rows, model):
    bad = rows.copy()
    bad[1234, 3] = np.nan
    spec = write_h5(tmp_path / "in.h5", bad, chunk_rows=100)
    with pytest.raises(NonFiniteError, match="row 1234 "):
        apply_model(model, spec, str(tmp_path / "out.h5"), part=ApplyPart((1000, 1500)))
    apply_model(model, spec, str(tmp_path / "out.h5"), ApplyOptions(skip_nonfinite=True), part=ApplyPart((1000, 1500)))
    got = read_all(str(tmp_path / "out.h5"))
    assert np.isnan(got[234]).all() and np.isfinite(np.delete(got, 234, axis=0)).all()


def test_an_interrupted_apply_of_a_range_resumes_to_the_same_bytes(tmp_path, rows, model):
    from streamwhiten.errors import InterruptedRunError

    spec = write_h5(tmp_path / "in.h5", rows, chunk_rows=100)
    options, read = ApplyOptions(progress_seconds=0), ReadOptions(block_rows=128)
    reference = str(tmp_path / "reference.h5")
    apply_model(model, spec, reference, options, read, part=ApplyPart((300, 1400)))
    out = str(tmp_path / "out.h5")
    calls = {"n": 0}

    def stop_after_three_blocks():
        calls["n"] += 1
        return calls["n"] >= 3

    with pytest.raises(InterruptedRunError):
        apply_model(
            model,
            spec,
            out,
            options,
            read,
            part=ApplyPart((300, 1400)),
            watch=Watch(should_stop=stop_after_three_blocks),
        )
    assert not os.path.exists(out) and os.path.exists(partial_path(out))
    # another range does not continue the partial output of this one
    resumed = apply_model(model, spec, out, options, read, part=ApplyPart((300, 1400)))
    assert resumed.resumed_at_row == 384
    with open(out, "rb") as a, open(reference, "rb") as b:
        assert a.read() == b.read()


def test_rows_carry_the_kept_columns_of_the_range(tmp_path, rows, model):
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from tests.io.test_parquet import write_parquet

    spec = write_parquet(tmp_path / "in.parquet", rows, row_group_size=400)
    out = str(tmp_path / "out.parquet")
    apply_model(model, spec, out, ApplyOptions(keep_columns=("id",)), part=ApplyPart((450, 1300)))
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == list(range(450, 1300))
    np.testing.assert_array_equal(read_all(out), model.transform(rows)[450:1300])


def test_the_dask_engine_refuses_rows(tmp_path, rows, model):
    from streamwhiten.engine.engines import DaskEngine

    spec = write_zarr(tmp_path / "in.zarr", rows)
    with pytest.raises(BadInputError, match="serial engine"):
        DaskEngine().apply(
            model, spec, str(tmp_path / "o.zarr"), ApplyOptions(), ReadOptions(), part=ApplyPart((0, 10))
        )
