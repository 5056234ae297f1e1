"""apply writes vector codes through the OutputPlan: every output kind, the Dask engine, and a faiss code the
model records, each against the codec's own encode of the model's unit outputs (plain numpy map)."""

import json
from dataclasses import replace

import h5py
import numpy as np
import pytest
from conftest import write_h5

import streamwhiten
from streamwhiten import ApplyOptions, serving, with_codes
from streamwhiten.codes.storage import model_codec
from streamwhiten.engine.engines import DaskEngine
from streamwhiten.errors import BadInputError, NothingToDoError
from streamwhiten.io import open_source
from streamwhiten.output_plan import storage_record

N, D, K = 1800, 24, 16


@pytest.fixture
def fitted(tmp_path):
    rng = np.random.default_rng(4)
    rows = (rng.standard_normal((N, D)) * np.linspace(3, 0.2, D) + 0.5).astype(np.float32)
    store = write_h5(tmp_path / "in.h5", rows, chunk_rows=256)
    path = str(tmp_path / "m.npz")
    streamwhiten.fit(store, path, setting=streamwhiten.Setting(n_components=K))
    return store, path, rows


def unit_outputs(model, rows):
    """The model's outputs at unit length, by a plain float64 map."""
    weights, shift = model.projection(np.float64)
    y = (rows.astype(np.float64) - shift) @ weights
    return (y / np.linalg.norm(y, axis=1, keepdims=True)).astype(np.float32)


def read_codes(spec):
    with open_source(spec, codes=True) as source:
        return source.read(0, source.n_rows)


def same_rows(got, want):
    """Rows equal to the codec's codes (a float32 map and a float64 one may round a level apart at a rare
    boundary: at most 1% of the rows)."""
    return got.shape == want.shape and got.dtype == np.uint8 and np.mean(np.all(got == want, axis=1)) > 0.99


@pytest.mark.parametrize("suffix", [".h5", ".zarr", ".parquet"])
def test_apply_writes_the_models_code_in_every_output_kind(tmp_path, fitted, suffix):
    store, path, rows = fitted
    coded = with_codes(path, "eigen:6", output=str(tmp_path / "coded.npz"))
    outcome = streamwhiten.apply(str(tmp_path / "coded.npz"), store, str(tmp_path / f"out{suffix}"))
    assert outcome.dtype == "eigen-6B" and outcome.normalized
    codec = model_codec(coded)
    assert same_rows(read_codes(str(tmp_path / f"out{suffix}")), codec.encode(unit_outputs(coded, rows)))
    # the output is current for the same code, and the serving decoder names what decodes it
    with pytest.raises(streamwhiten.errors.NothingToDoError):
        streamwhiten.apply(str(tmp_path / "coded.npz"), store, str(tmp_path / f"out{suffix}"))


def test_a_code_given_as_dtype_is_trained_from_the_statistics_or_refused_when_it_needs_a_sample(tmp_path, fitted):
    store, path, rows = fitted
    model = streamwhiten.load_model(path)
    out = str(tmp_path / "bits.h5")
    streamwhiten.apply(path, store, f"{out}:/codes", options=ApplyOptions(dtype="bits-random:2"))
    from streamwhiten.codes.storage import train_for

    codec = train_for(model, "bits-random", 2)
    with h5py.File(out) as handle:
        assert same_rows(handle["codes"][:], codec.encode(unit_outputs(model, rows)))
        assert "bits-random-2B" in handle["codes"].attrs["quantization"]
    with pytest.raises(BadInputError, match="learns from a sample of the input: record it in the model first"):
        streamwhiten.apply(path, store, str(tmp_path / "pq.h5"), options=ApplyOptions(dtype="faiss-pq:4"))
    assert not (tmp_path / "pq.h5").exists()
    with pytest.raises(BadInputError, match="cannot hold the NaN rows"):
        ApplyOptions(dtype="eigen:4", skip_nonfinite=True)


def test_a_faiss_code_the_model_records_is_written_as_faiss_encodes(tmp_path, fitted):
    pytest.importorskip("faiss")
    store, path, rows = fitted
    coded = with_codes(path, "faiss-pq:4", sample=rows, sample_size=1500, output=str(tmp_path / "pq.npz"))
    streamwhiten.apply(str(tmp_path / "pq.npz"), store, str(tmp_path / "pq.zarr"))
    codec = serving.codec(str(tmp_path / "pq.npz"))
    got = read_codes(str(tmp_path / "pq.zarr"))
    assert same_rows(got, codec.encode(unit_outputs(coded, rows)))
    np.testing.assert_allclose(serving.decode(got, codec), codec.decode(got))


def test_the_dask_engine_writes_the_same_codes(tmp_path, fitted):
    pytest.importorskip("dask.distributed")
    from streamwhiten.engine.distributed import apply_dask, dask_client

    store, path, _ = fitted
    coded = with_codes(path, "eigen:6")
    serial = str(tmp_path / "serial.zarr")
    streamwhiten.apply(
        coded, store, serial, options=ApplyOptions(dtype=None), read=streamwhiten.ReadOptions(block_rows=256)
    )
    parallel = str(tmp_path / "dask.zarr")
    with dask_client(n_workers=2) as client:  # worker processes: the encoder travels as the codec's bytes
        apply_dask(
            coded,
            store,
            parallel,
            ApplyOptions(dtype="eigen:6"),
            cluster=DaskEngine(client=client),
            output_chunk_rows=256,
        )
    np.testing.assert_array_equal(read_codes(parallel), read_codes(serial))


def test_the_estimator_transforms_to_a_code_as_apply_writes_it(fitted):
    from streamwhiten import Whitener
    from streamwhiten.codes.storage import train_for

    _, _, rows = fitted
    whitener = Whitener(n_components=K, dtype="eigen:3").fit(rows)
    codes = whitener.transform(rows)
    codec = train_for(whitener.model_, "eigen", 3)
    assert same_rows(codes, codec.encode(unit_outputs(whitener.model_, rows)))
    with pytest.raises(BadInputError, match="cannot hold the NaN rows"):
        Whitener(n_components=K, dtype="eigen:3", skip_nonfinite=True).fit(rows).transform(rows)


def test_an_update_at_another_setting_drops_the_code_and_the_file_stays_loadable(tmp_path, fitted):
    store, path, rows = fitted
    with_codes(path, "eigen:6", output=path, overwrite=True)
    more = write_h5(tmp_path / "more.h5", rows[:200], chunk_rows=64)
    streamwhiten.fit([store, more], path, setting=streamwhiten.Setting(n_components=K), update=path)
    assert streamwhiten.load_model(path).storage.label == "eigen-6B"  # the same setting keeps its code
    again = write_h5(tmp_path / "again.h5", rows[200:400], chunk_rows=64)
    setting = streamwhiten.Setting(n_components=K, gamma=0.5)
    streamwhiten.fit([store, more, again], path, setting=setting, update=path)
    assert streamwhiten.load_model(path).storage is None  # a code of another map is not kept


def test_apply_at_another_setting_than_the_codes_is_refused_not_recoded(tmp_path, fitted):
    store, path, _ = fitted
    with_codes(path, "eigen:6", output=path, overwrite=True)
    with pytest.raises(BadInputError, match="code is for its saved setting"):
        streamwhiten.apply(path, store, str(tmp_path / "o.h5"), setting=streamwhiten.Setting(gamma=0.5))
    assert not (tmp_path / "o.h5").exists()


def test_the_estimator_records_its_code_and_saves_it(tmp_path, fitted):
    from streamwhiten import Whitener

    _, _, rows = fitted
    whitener = Whitener(n_components=K, dtype="eigen:3").fit(rows)
    assert whitener.model_.storage.label == "eigen-3B" and whitener.quantization_ is None
    whitener.save(tmp_path / "w.npz")
    loaded = Whitener.load(tmp_path / "w.npz")  # the code is the model's storage (for search); transform: floats
    assert loaded.model_.storage.label == "eigen-3B"
    np.testing.assert_array_equal(loaded.set_params(dtype="eigen:3").transform(rows), whitener.transform(rows))


def decoded_like_the_reference(decoded, codes, codec, model, rows):
    """``decoded`` is the reference codec's decode of ``codes`` (the codec trained from, or recorded in, the
    model: not read from the output), and those vectors point where the model's exact unit outputs do."""
    np.testing.assert_array_equal(decoded, codec.decode(codes).astype(np.float32))
    unit = unit_outputs(model, rows)
    cosines = np.sum(decoded * unit, axis=1) / np.linalg.norm(decoded, axis=1)
    assert np.median(cosines) > 0.8


@pytest.mark.parametrize("suffix", [".h5", ".zarr", ".parquet"])
@pytest.mark.parametrize("recorded", [True, False], ids=["model-records-the-code", "trained-by-apply"])
def test_code_outputs_decode_from_their_own_attributes(tmp_path, fitted, suffix, recorded):
    from streamwhiten.codes.storage import train_for
    from streamwhiten.io import read_attrs

    store, path, rows = fitted
    model = streamwhiten.load_model(path)
    if recorded:
        path = str(tmp_path / "coded.npz")
        model = with_codes(model, "eigen:6", output=path)
        reference = model_codec(model)
    else:
        reference = train_for(model, "eigen", 6)
    out = str(tmp_path / f"out{suffix}")
    streamwhiten.apply(path, store, out, options=ApplyOptions(dtype="eigen:6"))
    codes, attrs = read_codes(out), read_attrs(out)
    assert "serving.decode(rows, attrs)" in storage_record(attrs)["codec"]["decode"]
    decoded_like_the_reference(serving.decode(codes, attrs), codes, reference, model, rows)
    assert serving.codec(attrs).to_bytes() == reference.to_bytes()
    assert serving.codec(storage_record(attrs)).label == "eigen-6B"  # the record alone
    if suffix == ".h5":  # a plain reader's attributes do as well
        with h5py.File(out, "r") as handle:
            (name,) = list(handle)
            plain = dict(handle[name].attrs)
        np.testing.assert_array_equal(serving.decode(codes, plain), reference.decode(codes))


def test_the_cli_apply_of_a_code_the_model_lacks_writes_codes_that_decode(tmp_path, fitted, run_cli):
    """The issue's steps (there eigen:24 at k = 384): apply a code to a model recording none, decode the output."""
    from streamwhiten.codes.storage import train_for
    from streamwhiten.io import read_attrs

    store, path, rows = fitted
    out = str(tmp_path / "codes.h5")
    code, _, err = run_cli("apply", path, store, "-o", out, "--dtype", "eigen:4")
    assert code == 0, err
    model = streamwhiten.load_model(path)
    assert model.storage is None or model.storage.codec is None
    codes = read_codes(out)
    decoded_like_the_reference(serving.decode(codes, read_attrs(out)), codes, train_for(model, "eigen", 4), model, rows)


def test_a_damaged_or_old_code_record_is_refused_naming_the_field(tmp_path, fitted):
    from streamwhiten.errors import ModelFileError
    from streamwhiten.io import read_attrs

    store, path, _ = fitted
    out = str(tmp_path / "codes.zarr")
    streamwhiten.apply(path, store, out, options=ApplyOptions(dtype="eigen:4"))
    record = storage_record(read_attrs(out))
    codes = read_codes(out)
    altered = json.loads(json.dumps(record))
    text = altered["codec"]["data"]
    altered["codec"]["data"] = text[:100] + ("A" if text[100] != "A" else "B") + text[101:]
    with pytest.raises(ModelFileError, match="codec.data does not match its sha256"):
        serving.decode(codes, {"quantization": json.dumps(altered)})
    for width, said in (("abc", "is 'abc', not a width"), (0, "is 0, not a width"), (K + 1, f"says {K + 1} values")):
        edited = json.loads(json.dumps(record))
        edited["codec"]["n_features"] = width  # a damaged record's width: one line naming the field
        with pytest.raises(ModelFileError, match=f"field quantization.codec.n_features {said}"):
            serving.codec(edited)
    altered["codec"]["data"] = "not base64!"
    with pytest.raises(ModelFileError, match="codec.data is not base64"):
        serving.codec(altered)
    del altered["codec"]["data"]  # as outputs of earlier versions were written
    with pytest.raises(
        BadInputError,
        match=f"serving.codec\\(MODEL\\)\\), MODEL the model file whose codec's SHA-256 is {record['codec']['sha256']}",
    ):
        serving.decode(codes, altered)
    with pytest.raises(BadInputError, match="record no vector code"):
        serving.codec({"quantization": json.dumps({"kind": "int8"})})


def test_the_estimators_codes_decode_by_the_model_file_it_saves(tmp_path, fitted):
    from streamwhiten import Whitener
    from streamwhiten.codes.storage import train_for

    _, _, rows = fitted
    whitener = Whitener(n_components=K, dtype="eigen:3").fit(rows)
    codes = whitener.transform(rows)
    path = tmp_path / "w.npz"
    whitener.save(path)  # the code is the saved model's storage: its codec's bytes
    reference = train_for(streamwhiten.load_model(str(path)), "eigen", 3)
    decoded_like_the_reference(serving.decode(codes, serving.codec(path)), codes, reference, whitener.model_, rows)


def test_an_outputs_storage_is_resolved_once_per_apply_and_the_check_before_a_rerun_reuses_it(tmp_path, fitted):
    from streamwhiten.codes.storage import resolve_counts

    store, path, rows = fitted
    model = streamwhiten.load_model(path).with_params(beta=0.937)  # a map no other test resolves
    out, options = str(tmp_path / "out.h5"), ApplyOptions(dtype="eigen:6")
    hits, misses = resolve_counts()
    streamwhiten.apply(model, store, out, options=options)
    after = resolve_counts()
    assert (after[0] - hits, after[1] - misses) == (0, 1)  # resolved (the code trained) once, not once a layer
    with pytest.raises(NothingToDoError):  # a rerun (a job's): found up to date on its one plan
        streamwhiten.apply(model, store, out, options=replace(options, overwrite=True))
    assert resolve_counts() == (after[0] + 1, after[1])  # the same storage: remembered, not trained again
    codec = model_codec(streamwhiten.with_codes(model, "eigen:6"))
    assert same_rows(read_codes(out), codec.encode(unit_outputs(model, rows)))


def test_the_cli_says_an_output_of_the_models_code_is_unit_length(tmp_path, fitted, run_cli):
    """A model that records a code writes unit-length rows coded (``normalized`` in its attributes) without
    --normalize: the summary says so, as it does for --normalize (it read the options, not the output)."""
    store, path, _ = fitted
    with_codes(path, "eigen:6", output=str(tmp_path / "coded.npz"))
    code, out, err = run_cli("apply", tmp_path / "coded.npz", store, "-o", tmp_path / "o.h5")
    assert code == 0 and "eigen-6B vectors (L2-normalised) to" in out, (out, err)
    code, out, err = run_cli("apply", path, store, "-o", tmp_path / "f.h5")
    assert code == 0 and "float32 vectors to" in out and "normalised" not in out, (out, err)
