"""The identity map (``basis="identity"``: no transformation, what tune writes when the raw vectors win)
against plain numpy, through every door: the model and its file, apply, the Dask engine, serving and each
export format."""

import json
from dataclasses import replace

import h5py
import numpy as np
import pytest
from conftest import write_h5

from streamwhiten import serving
from streamwhiten._npz import write_npz_atomic
from streamwhiten.core import stats
from streamwhiten.core.model import _arrays, file_checksum, finalize, load_model, map_checksum, save_model
from streamwhiten.engine.apply import apply_model
from streamwhiten.engine.engines import DaskEngine
from streamwhiten.errors import BadInputError, ModelFileError
from streamwhiten.io import open_source, read_attrs
from streamwhiten.options import ApplyOptions
from streamwhiten.storage import Storage

D = 12


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(3)
    return (rng.standard_normal((400, D)) * np.linspace(3, 0.2, D) + 1.5).astype(np.float32)


@pytest.fixture(scope="module")
def fitted(rows):
    return finalize(stats.block_moments(rows.astype(np.float64)))


@pytest.fixture(scope="module")
def identity_path(tmp_path_factory, fitted):
    path = str(tmp_path_factory.mktemp("identity") / "raw.npz")
    save_model(fitted.with_params(basis="identity"), path)
    return path


def unit(x):
    return x / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)


def test_the_identity_map_gives_the_rows_back(fitted, rows):
    raw = fitted.with_params(basis="identity")
    assert (raw.basis, raw.beta, raw.gamma, raw.n_components, raw.variance) == ("identity", 0.0, 0.0, D, None)
    assert np.array_equal(raw.transform(rows), rows) and raw.transform(rows).dtype == np.float32
    assert np.array_equal(raw.transform(rows.astype(np.float64)), rows.astype(np.float64))
    np.testing.assert_allclose(raw.transform(rows, normalize=True), unit(rows), rtol=2e-7)
    affine = raw.as_affine()
    assert np.array_equal(affine.A, np.eye(D)) and np.array_equal(affine.b, np.zeros(D))
    assert np.array_equal(affine.transform(rows), rows)
    # its sign bits are those of the raw rows (the rotation's are not)
    bits = raw.as_affine(dtype="binary").encode(rows)
    assert np.array_equal(bits, np.packbits(rows > 0, axis=1))
    rotation = fitted.with_params(beta=0.0, gamma=0.0, n_components=D)
    assert not np.array_equal(rotation.as_affine(dtype="binary").encode(rows), bits)
    # its checksum is the map's: not the rotation's of the same setting
    assert map_checksum(raw) != map_checksum(rotation)


def test_with_params_keeps_the_identity_only_for_its_own_setting(fitted):
    raw = fitted.with_params(basis="identity")
    assert raw.with_params(eps=1e-3).basis == "identity"
    moved = raw.with_params(beta=0.5)
    assert (moved.basis, moved.beta, moved.gamma) == ("eigen", 0.5, 0.0)
    assert raw.with_params(basis="eigen").basis == "eigen"
    assert raw.with_params(n_components=4).basis == "eigen"
    with pytest.raises(BadInputError, match="basis must be one of eigen, identity"):
        fitted.with_params(basis="pca")
    # the basis is checked first: a bad basis is the error named, before the setting or any eigendecomposition
    with pytest.raises(BadInputError, match="basis must be one of eigen, identity"):
        fitted.with_params(basis="pca", beta=5.0)


def test_the_model_file_records_the_basis_under_its_checksum(tmp_path, fitted, identity_path):
    loaded = load_model(identity_path)
    assert loaded.basis == "identity" and map_checksum(loaded) == map_checksum(fitted.with_params(basis="identity"))
    assert loaded.to_json()["basis"] == "identity"
    # an eigen model's file holds no basis member, as every file written before bases: it loads as "eigen"
    eigen = str(tmp_path / "eigen.npz")
    save_model(fitted, eigen)
    with np.load(eigen) as arrays:
        assert "basis" not in arrays.files
    assert load_model(eigen).basis == "eigen" and load_model(eigen).to_json()["basis"] == "eigen"
    # the basis is in the file's checksum: the same statistics as the rotation make another file
    rotation = fitted.with_params(beta=0.0, gamma=0.0, n_components=D)
    assert file_checksum(loaded) != file_checksum(rotation)
    # an edit with its checksum recomputed is refused: identity with a setting that is not the identity's
    arrays = _arrays(fitted)  # beta = gamma = 1
    arrays["basis"] = np.array("identity")
    edited = str(tmp_path / "edited.npz")
    write_npz_atomic(edited, arrays, "model file")
    with pytest.raises(ModelFileError, match="'basis' is 'identity', but the setting is not the identity's"):
        load_model(edited)
    arrays = _arrays(fitted.with_params(basis="identity"))
    arrays["basis"] = np.array("pca")
    write_npz_atomic(edited, arrays, "model file")
    with pytest.raises(ModelFileError, match="'basis' must be 'eigen' or 'identity'"):
        load_model(edited)


def test_info_shows_no_transformation(identity_path, run_cli):
    code, out, _ = run_cli("info", identity_path, "--json")
    assert code == 0 and json.loads(out)["basis"] == "identity"
    code, out, _ = run_cli("info", identity_path)
    assert code == 0 and "transform  none: the identity map" in out


def test_serving_loads_the_identity_map_and_its_storage(tmp_path, fitted, rows, identity_path):
    whiten = serving.load(identity_path)
    assert np.array_equal(whiten.transform(rows), rows)
    np.testing.assert_allclose(whiten.transform(rows, normalize=True), unit(rows), rtol=2e-7)
    assert whiten.checksum == map_checksum(load_model(identity_path))
    coded = str(tmp_path / "bits.npz")
    save_model(replace(fitted.with_params(basis="identity"), storage=Storage("binary")), coded)
    assert np.array_equal(serving.load(coded).encode(rows), np.packbits(rows > 0, axis=1))


@pytest.mark.parametrize("dtype", ["float32", "binary"])
def test_apply_writes_the_rows_or_their_sign_bits(tmp_path, rows, identity_path, dtype):
    source = write_h5(str(tmp_path / "in.h5"), rows, chunk_rows=64)
    out = str(tmp_path / "out.h5")
    apply_model(load_model(identity_path), source, out, ApplyOptions(dtype=dtype))
    with h5py.File(out, "r") as handle:
        got = handle["embeddings"][...]
    want = rows if dtype == "float32" else np.packbits(rows > 0, axis=1)
    assert np.array_equal(got, want)
    assert read_attrs(out)["model_checksum"] == map_checksum(load_model(identity_path))


def test_the_dask_engine_writes_the_rows(tmp_path, rows, identity_path):
    pytest.importorskip("dask.array")
    pytest.importorskip("distributed")
    from streamwhiten.engine import distributed as sd

    source = write_h5(str(tmp_path / "in.h5"), rows, chunk_rows=64)
    out = str(tmp_path / "out.zarr")
    with sd.dask_client(n_workers=1) as client:
        sd.apply_dask(
            load_model(identity_path), source, out, ApplyOptions(normalize=True), cluster=DaskEngine(client=client)
        )
    with open_source(out) as written:
        got = written.read(0, written.n_rows)
    np.testing.assert_allclose(got, unit(rows), rtol=2e-7)


def export(run_cli, model_path, target, *extra):
    code, out, err = run_cli("export", model_path, "-o", target, *extra, "--json")
    assert code == 0, err
    return json.loads(out)


def test_exports_are_the_identity(tmp_path, rows, identity_path, run_cli):
    # numpy alone
    summary = export(run_cli, identity_path, tmp_path / "map.npz")
    with np.load(tmp_path / "map.npz", allow_pickle=False) as data:
        assert np.array_equal(data["A"], np.eye(D)) and np.array_equal(data["b"], np.zeros(D))
        assert np.array_equal(rows @ data["A"].astype(np.float32) + data["b"].astype(np.float32), rows)
    assert summary["model_checksum"] == map_checksum(load_model(identity_path))
    assert np.array_equal(serving.load(tmp_path / "map.npz").transform(rows), rows)


def test_onnx_export_is_the_identity(tmp_path, rows, identity_path, run_cli):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    export(run_cli, identity_path, tmp_path / "raw.onnx")
    session = ort.InferenceSession(str(tmp_path / "raw.onnx"), providers=["CPUExecutionProvider"])
    assert np.array_equal(session.run(["y"], {"x": rows})[0], rows)
    export(run_cli, identity_path, tmp_path / "unit.onnx", "--normalize")
    session = ort.InferenceSession(str(tmp_path / "unit.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(["y"], {"x": rows})[0], unit(rows), rtol=2e-7)


def test_faiss_export_is_the_identity(tmp_path, rows, identity_path, run_cli):
    faiss = pytest.importorskip("faiss")
    export(run_cli, identity_path, tmp_path / "raw.faiss")
    assert np.array_equal(faiss.read_VectorTransform(str(tmp_path / "raw.faiss")).apply(rows), rows)


@pytest.mark.torch
def test_torch_and_sentence_transformers_exports_are_the_identity(tmp_path, rows, identity_path, run_cli):
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    export(run_cli, identity_path, tmp_path / "linear.safetensors")
    layer = torch.nn.Linear(D, D)
    layer.load_state_dict(safetensors_torch.load_file(str(tmp_path / "linear.safetensors")), strict=True)
    with torch.no_grad():
        assert np.array_equal(layer(torch.from_numpy(rows)).numpy(), rows)
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    path = tmp_path / "modules"
    export(run_cli, identity_path, path, "--format", "sentence-transformers")
    pipeline = SentenceTransformer(str(path), device="cpu", local_files_only=True)
    with torch.no_grad():
        got = pipeline.forward({"sentence_embedding": torch.from_numpy(rows)})["sentence_embedding"]
    assert np.array_equal(got.numpy(), rows)


def test_whitener_load_keeps_the_identity_until_another_setting_is_asked_for(rows, identity_path):
    from streamwhiten import Whitener

    whitener = Whitener.load(identity_path)
    assert np.array_equal(whitener.transform(rows), rows)
    assert np.array_equal(whitener.set_params(dtype="float32").transform(rows), rows)
    whitened = whitener.set_params(beta=1.0, gamma=1.0).transform(rows)
    assert np.allclose(whitened.mean(axis=0), 0, atol=1e-4)  # now the whitening of that setting


def test_an_identity_file_is_refused_by_a_reader_of_version_1_only(tmp_path, fitted, identity_path):
    """A release that knows no ``basis`` reads version 1 only: an identity file is version 2, so it is
    refused there instead of being read as the rotation of its eigenbasis; an eigen file stays version 1."""
    from streamwhiten._npz import read_npz
    from streamwhiten.core.model import FORMAT_NAME

    with np.load(identity_path) as arrays:
        assert int(arrays["format_version"]) == 2
    with pytest.raises(ModelFileError, match="format version 2 is not supported"):
        read_npz(identity_path, "model file", FORMAT_NAME, 1)
    eigen = str(tmp_path / "eigen.npz")
    save_model(fitted, eigen)
    assert int(read_npz(eigen, "model file", FORMAT_NAME, 1)["format_version"]) == 1
