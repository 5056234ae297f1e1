"""``streamwhiten export``: every format reloaded with its own library's loader and compared with
``Whitener.transform`` on the same rows, for beta, gamma in {0, 0.5, 1}, k < d and k = d, with and without
L2 normalisation; and the bad inputs (wrong width, unknown format, existing output) as one-line exit-2 errors.

The rows have a moderate spectrum (1 to 1/16 in variance) and mean: a format that only has ``x A + b``
rounds ``x A`` in float32 before ``b`` is added, an error that grows with ``|mu A| / |y|``; here it stays
well below the 1e-6 (relative to the largest output, or absolute for unit vectors) asserted, so a
wrong map cannot pass as rounding.
"""

import json
import os

import numpy as np
import pytest
from conftest import map_checksum, write_h5

from streamwhiten import Whitener, serving
from streamwhiten.errors import EXIT_BAD_INPUT, EXIT_NOTHING_TO_DO

D, SMALL_K = 16, 6
SETTINGS = [
    (beta, gamma, k, normalize)
    for beta in (0.0, 0.5, 1.0)
    for gamma in (0.0, 0.5, 1.0)
    for k in (SMALL_K, D)
    for normalize in (False, True)
]


def gentle_rows(n_rows, n_features=D, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.standard_normal((n_features, n_features)))
    scales = np.linspace(1.0, 0.25, n_features)
    return (
        (rng.standard_normal((n_rows, n_features)) * scales) @ rotation.T + 0.5 * rng.standard_normal(n_features)
    ).astype(np.float32)


@pytest.fixture(scope="module")
def rows():
    return gentle_rows(600)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("export") / "model.npz"
    Whitener().fit(rows).save(path)
    return str(path)


def reference(model_path, rows, beta, gamma, k, normalize):
    return (
        Whitener.load(model_path)
        .set_params(beta=beta, gamma=gamma, n_components=k)
        .transform(rows, normalize=normalize)
    )


def expected_checksum(model_path, beta, gamma, k):
    """The map checksum (see conftest.map_checksum) of the model re-finalized at this setting."""
    from streamwhiten.core.model import load_model

    model = load_model(model_path).with_params(beta=beta, gamma=gamma, n_components=k)
    return map_checksum(model.projection()[0], model.mean, beta, gamma, model.eps, k)


def assert_close(got, want):
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == np.float32
    error = np.abs(got - want).max()
    assert error <= 1e-6 * max(1.0, np.abs(want).max()), error


def setting_args(beta, gamma, k, normalize):
    return ["--beta", beta, "--gamma", gamma, "-k", k] + (["--normalize"] if normalize else [])


def export_ok(run_cli, *args):
    code, out, err = run_cli("export", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def one_line_error(err, *fragments):
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("streamwhiten: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], err


def leftovers(directory):
    return sorted(name for name in os.listdir(directory) if name.startswith("."))


def normalized(y):
    norms = np.linalg.norm(y, axis=1, keepdims=True)
    return y / np.where(norms > 0, norms, 1)


def need(module, extra):
    """The module, or a skip naming the extra that installs it."""
    return pytest.importorskip(module, reason=f"{module} is not installed: pip install 'streamwhiten[{extra}]'")


def test_cli_and_library_list_the_same_formats():
    from streamwhiten.cli.app import EXPORT_FORMATS
    from streamwhiten.export import FORMATS

    assert EXPORT_FORMATS == FORMATS


# ------------------------------------------------------------------------------------------ each format


def test_npz_with_numpy_alone_and_the_serving_path(tmp_path, model_path, rows, run_cli):
    for i, (beta, gamma, k, normalize) in enumerate(SETTINGS):
        path = tmp_path / f"map{i}.npz"
        summary = export_ok(run_cli, model_path, "-o", path, *setting_args(beta, gamma, k, normalize))
        want = reference(model_path, rows, beta, gamma, k, normalize)
        with np.load(path, allow_pickle=False) as data:  # numpy alone
            A, b = data["A"], data["b"]
            assert A.shape == (D, k) and b.shape == (k,) and data["mean"].shape == (D,)
            assert (float(data["beta"]), float(data["gamma"]), int(data["n_components"]), bool(data["normalize"])) == (
                beta,
                gamma,
                k,
                normalize,
            )
            wanted = map_checksum(A, data["mean"], beta, gamma, float(data["eps"]), k)
            assert str(data["model_checksum"]) == summary["model_checksum"] == wanted
            assert str(data["model_file_checksum"]) == serving.file_checksum(model_path)
        y = rows @ A.astype(np.float32) + b.astype(np.float32)
        assert_close(normalized(y) if normalize else y, want)
        whiten = serving.load(path)  # the stored flag is the default
        assert whiten.normalize == normalize
        assert_close(whiten.transform(rows), want)
        assert_close(whiten.transform(rows[7]), want[7])


@pytest.mark.torch
def test_safetensors_into_torch_nn_linear(tmp_path, model_path, rows, run_cli):
    torch = need("torch", "torch")
    safetensors_torch = need("safetensors.torch", "torch")
    from safetensors import safe_open

    for i, (beta, gamma, k, normalize) in enumerate(SETTINGS):
        path = tmp_path / f"linear{i}.safetensors"
        export_ok(run_cli, model_path, "-o", path, *setting_args(beta, gamma, k, normalize))
        layer = torch.nn.Linear(D, k)
        layer.load_state_dict(safetensors_torch.load_file(str(path)), strict=True)
        with torch.no_grad():
            y = layer(torch.from_numpy(rows))
            if normalize:
                y = torch.nn.functional.normalize(y, dim=1)
        assert_close(y.numpy(), reference(model_path, rows, beta, gamma, k, normalize))
        with safe_open(str(path), framework="np") as handle:
            meta = handle.metadata()
        assert meta["model_checksum"] == expected_checksum(model_path, beta, gamma, k)
        assert meta["model_file_checksum"] == serving.file_checksum(model_path)
        assert (float(meta["beta"]), float(meta["gamma"]), int(meta["n_components"]), meta["normalize"]) == (
            beta,
            gamma,
            k,
            "true" if normalize else "false",
        )


def test_onnx_in_onnxruntime(tmp_path, model_path, rows, run_cli):
    onnx = need("onnx", "onnx")
    ort = need("onnxruntime", "onnx")
    for i, (beta, gamma, k, normalize) in enumerate(SETTINGS):
        path = tmp_path / f"whiten{i}.onnx"
        summary = export_ok(run_cli, model_path, "-o", path, *setting_args(beta, gamma, k, normalize))
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        want = reference(model_path, rows, beta, gamma, k, normalize)
        assert_close(session.run(["y"], {"x": rows})[0], want)
        assert_close(session.run(["y"], {"x": rows[4:5]})[0], want[4:5])  # the batch axis is dynamic
        model = onnx.load(str(path))
        assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [summary["opset"]] == [21]
        assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
        meta = {prop.key: prop.value for prop in model.metadata_props}
        assert meta["model_checksum"] == expected_checksum(model_path, beta, gamma, k) and float(meta["gamma"]) == gamma


def test_faiss_transform_and_index(tmp_path, model_path, rows, run_cli):
    faiss = need("faiss", "faiss")
    for i, (beta, gamma, k, normalize) in enumerate(SETTINGS):
        want = reference(model_path, rows, beta, gamma, k, normalize)
        if not normalize:
            path = tmp_path / f"transform{i}.faiss"
            export_ok(run_cli, model_path, "-o", path, *setting_args(beta, gamma, k, normalize))
            transform = faiss.read_VectorTransform(str(path))
            assert (transform.d_in, transform.d_out) == (D, k)
            assert_close(transform.apply(rows), want)
        path = tmp_path / f"index{i}.faiss"
        summary = export_ok(
            run_cli, model_path, "-o", path, "--index", "Flat", *setting_args(beta, gamma, k, normalize)
        )
        assert summary["metric"] == ("ip" if normalize else "l2") and not summary["needs_training"]
        index = faiss.read_index(str(path))
        assert index.d == D and index.ntotal == 0 and index.is_trained
        index.add(rows)
        _, found = index.search(rows, 1)
        assert np.array_equal(found[:, 0], np.arange(len(rows)))  # self-search: top-1 is the row itself
        stored = faiss.downcast_index(faiss.downcast_index(index).index).reconstruct_n(0, len(rows))
        assert_close(stored, want)


def test_faiss_hnsw_index_and_an_index_that_needs_training(tmp_path, model_path, rows, run_cli):
    faiss = need("faiss", "faiss")
    export_ok(run_cli, model_path, "-o", tmp_path / "hnsw.faiss", "--index", "HNSW16", "--normalize", "-k", SMALL_K)
    index = faiss.read_index(str(tmp_path / "hnsw.faiss"))
    index.add(rows)
    _, found = index.search(rows, 1)
    assert (found[:, 0] == np.arange(len(rows))).mean() > 0.99
    summary = export_ok(
        run_cli, model_path, "-o", tmp_path / "ivf.faiss", "--index", "IVF4,Flat", "--metric", "ip", "--normalize"
    )
    assert summary["needs_training"] and summary["metric"] == "ip"
    index = faiss.read_index(str(tmp_path / "ivf.faiss"))
    index.train(rows)  # trains the IVF on whitened vectors; the whitening itself is already trained
    index.add(rows)
    assert index.ntotal == len(rows)
    code, _, err = run_cli("export", model_path, "-o", tmp_path / "bad.faiss", "--index", "NoSuchIndex")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "--index NoSuchIndex")
    assert not os.path.exists(tmp_path / "bad.faiss") and leftovers(tmp_path) == []


@pytest.fixture(scope="module")
def st_model(tmp_path_factory):
    """A local sentence-transformers model built here, no network: a word-level tokenizer and a StaticEmbedding."""
    need("sentence_transformers", "sentence-transformers")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]"] + [f"w{i}" for i in range(60)]
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    embedding = StaticEmbedding(tokenizer, embedding_weights=gentle_rows(len(words), seed=5))
    directory = tmp_path_factory.mktemp("st") / "base-model"
    SentenceTransformer(modules=[embedding], device="cpu").save(str(directory))
    rng = np.random.default_rng(6)
    texts = [" ".join(f"w{j}" for j in rng.integers(0, 60, rng.integers(1, 8))) for _ in range(500)]
    model = SentenceTransformer(str(directory), device="cpu", local_files_only=True)
    vectors = model.encode(texts, convert_to_numpy=True)
    model_file = directory.parent / "st-model.npz"
    Whitener().fit(vectors).save(model_file)
    return str(directory), texts, vectors, str(model_file)


@pytest.mark.torch
def test_sentence_transformers_append_to_a_local_model(tmp_path, st_model, run_cli):
    from sentence_transformers import SentenceTransformer

    base, texts, vectors, model_file = st_model
    before = {
        name: open(os.path.join(base, name), "rb").read()
        for name in os.listdir(base)
        if os.path.isfile(os.path.join(base, name))
    }
    for i, (beta, gamma, k, normalize) in enumerate(SETTINGS):
        path = tmp_path / f"whitened{i}"
        summary = export_ok(
            run_cli, model_file, "-o", path, "--append-to", base, *setting_args(beta, gamma, k, normalize)
        )
        assert summary["format"] == "sentence-transformers" and summary["modules"][0] == "1_Dense"
        model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
        assert model.get_embedding_dimension() == k
        got = model.encode(texts, convert_to_numpy=True)
        assert_close(got, reference(model_file, vectors, beta, gamma, k, normalize))
        meta = json.loads((path / "1_Dense" / "streamwhiten.json").read_text())
        assert meta["model_checksum"] == expected_checksum(model_file, beta, gamma, k) and meta["n_components"] == k
    after = {name: open(os.path.join(base, name), "rb").read() for name in before}
    assert after == before and leftovers(tmp_path) == []


@pytest.fixture(scope="module")
def st_normalized(tmp_path_factory):
    """A local model ending in Normalize (as all-MiniLM-L6-v2 does), and texts: a StaticEmbedding, then Normalize."""
    need("sentence_transformers", "sentence-transformers")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, StaticEmbedding
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]"] + [f"w{i}" for i in range(60)]
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    embedding = StaticEmbedding(tokenizer, embedding_weights=gentle_rows(len(words), seed=8))
    directory = tmp_path_factory.mktemp("st-normalize") / "base-normalize"
    SentenceTransformer(modules=[embedding, Normalize()], device="cpu").save(str(directory))
    rng = np.random.default_rng(9)
    texts = [" ".join(f"w{j}" for j in rng.integers(0, 60, rng.integers(1, 8))) for _ in range(400)]
    return str(directory), texts


def st_encode(directory, texts, before_last=False):
    """The vectors a local model gives (``before_last``: those its last module, Normalize, is given)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(directory, device="cpu", local_files_only=True)
    if before_last:
        model = SentenceTransformer(modules=list(model)[:-1], device="cpu")
    return model.encode(texts, convert_to_numpy=True, batch_size=64)


@pytest.mark.parametrize("stored", ["pooled", "unit"])
def test_append_to_a_model_ending_in_normalize_meets_the_applied_corpus(tmp_path, st_normalized, run_cli, stored):
    """The whitening goes where the fitted vectors came from: a corpus stored before the model's Normalize
    (pooled: mean squared norm far from 1) gets it in place of Normalize; a corpus of the model's unit-length
    output gets it after. Either way the exported pipeline gives the vectors `apply` wrote for the corpus,
    and putting it on the other side would not (by far more than rounding)."""
    import h5py

    base, texts = st_normalized
    vectors = st_encode(base, texts, before_last=stored == "pooled")
    norms = (vectors.astype(np.float64) ** 2).sum(axis=1).mean()
    assert (abs(norms - 1) > 0.5) if stored == "pooled" else (abs(norms - 1) < 1e-5)
    corpus = write_h5(tmp_path / "corpus.h5", vectors, chunk_rows=100)
    model = tmp_path / "model.npz"
    assert run_cli("fit", corpus, "-o", model, "-q")[0] == 0
    for k, normalize in [(D, False), (SMALL_K, True)]:
        args = ["-k", k] + (["--normalize"] if normalize else [])
        applied = tmp_path / f"applied-{k}.h5"
        code, _, err = run_cli("apply", model, corpus, "-o", f"{applied}:/v", *args, "-q")
        assert code == 0, err
        with h5py.File(applied, "r") as handle:
            want, recorded = handle["v"][...], handle["v"].attrs["model_checksum"]
        out = tmp_path / f"whitened-{k}"
        summary = export_ok(run_cli, model, "-o", out, "--append-to", base, *args)
        assert summary["insert"] == ("before-normalize" if stored == "pooled" else "end")
        assert summary["model_checksum"] == recorded  # the same map as the corpus's
        assert_close(st_encode(str(out), texts), want)
        other = "end" if stored == "pooled" else "before-normalize"
        wrong = tmp_path / f"wrong-{k}"
        export_ok(run_cli, model, "-o", wrong, "--append-to", base, "--insert", other, *args)
        assert np.abs(st_encode(str(wrong), texts) - want).max() > 0.05 * np.abs(want).max()
    assert leftovers(tmp_path) == []


@pytest.mark.torch
def test_append_to_refuses_when_the_side_of_normalize_cannot_be_told(tmp_path, st_model, st_normalized, run_cli):
    """Rows nearly but not exactly unit-length, unit-length rows for a model without Normalize, and
    --insert before-normalize for a model without one: exit 2, one line saying how to choose, nothing written."""
    base, texts = st_normalized
    unit = st_encode(base, texts)
    nearly = tmp_path / "nearly.npz"
    Whitener().fit(unit * 1.03).save(nearly)  # mean squared norm 1.06: neither unit nor clearly not
    code, _, err = run_cli("export", nearly, "-o", tmp_path / "out", "--append-to", base)
    assert code == EXIT_BAD_INPUT
    one_line_error(err, base, "ends in a Normalize module", "nearly but not exactly", "--insert before-normalize")
    code, _, err = run_cli("export", nearly, "-o", tmp_path / "out", "--append-to", base, "--insert", "end")
    assert code == 0, err
    plain_base = st_model[0]  # no Normalize at its end
    unit_model = tmp_path / "unit.npz"
    Whitener().fit(unit).save(unit_model)
    code, _, err = run_cli("export", unit_model, "-o", tmp_path / "out2", "--append-to", plain_base)
    assert code == EXIT_BAD_INPUT
    one_line_error(err, plain_base, "unit-length rows", "does not end in a Normalize module", "--insert end")
    code, _, err = run_cli(
        "export", unit_model, "-o", tmp_path / "out2", "--append-to", plain_base, "--insert", "before-normalize"
    )
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "--insert before-normalize", "does not end in a Normalize module")
    code, _, err = run_cli("export", unit_model, "-o", tmp_path / "m.npz", "--insert", "end")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "--insert", "--append-to")
    assert sorted(os.listdir(tmp_path)) == ["nearly.npz", "out", "unit.npz"] and leftovers(tmp_path) == []


@pytest.mark.torch
def test_sentence_transformers_modules_alone(tmp_path, model_path, rows, run_cli):
    need("sentence_transformers", "sentence-transformers")
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense

    for beta, gamma, k, normalize in [(1.0, 1.0, SMALL_K, True), (0.5, 0.0, D, False)]:
        path = tmp_path / f"modules-{k}-{normalize}"
        export_ok(
            run_cli,
            model_path,
            "-o",
            path,
            "--format",
            "sentence-transformers",
            *setting_args(beta, gamma, k, normalize),
        )
        want = reference(model_path, rows, beta, gamma, k, normalize)
        pipeline = SentenceTransformer(str(path), device="cpu", local_files_only=True)  # Dense (+ Normalize) only
        with torch.no_grad():
            got = pipeline.forward({"sentence_embedding": torch.from_numpy(rows)})["sentence_embedding"]
        assert_close(got.numpy(), want)
        dense = Dense.load(str(path / "0_Dense"))
        with torch.no_grad():
            got = dense({"sentence_embedding": torch.from_numpy(rows)})["sentence_embedding"]
        assert_close(got.numpy(), reference(model_path, rows, beta, gamma, k, False))


@pytest.mark.torch
def test_torch_linear_helper(model_path, rows):
    torch = need("torch", "torch")
    from streamwhiten.core.model import load_model
    from streamwhiten.export import torch_linear

    layer = torch_linear(load_model(model_path).as_affine(n_components=SMALL_K))
    with torch.no_grad():
        assert_close(layer(torch.from_numpy(rows)).numpy(), reference(model_path, rows, 1.0, 1.0, SMALL_K, False))


# ------------------------------------------------------------------------------------------ corpus meets queries


def test_a_corpus_applied_offline_meets_queries_whitened_online(tmp_path, model_path, rows, run_cli):
    """`apply` on the corpus and the exported maps on the same rows as queries give the same vectors."""
    ort = need("onnxruntime", "onnx")
    corpus = write_h5(tmp_path / "corpus.h5", rows, chunk_rows=128)
    code, _, err = run_cli(
        "apply", model_path, corpus, "-o", f"{tmp_path / 'white.h5'}:/vectors", "-k", SMALL_K, "--normalize", "-q"
    )
    assert code == 0, err
    import h5py

    with h5py.File(tmp_path / "white.h5", "r") as handle:
        applied = handle["vectors"][...]
    export_ok(run_cli, model_path, "-o", tmp_path / "q.onnx", "-k", SMALL_K, "--normalize")
    export_ok(run_cli, model_path, "-o", tmp_path / "q.npz", "-k", SMALL_K, "--normalize")
    queries = rows[::7]
    via_onnx = ort.InferenceSession(str(tmp_path / "q.onnx")).run(["y"], {"x": queries})[0]
    via_numpy = serving.load(tmp_path / "q.npz").transform(queries)
    assert_close(via_onnx, applied[::7])
    assert_close(via_numpy, applied[::7])
    best = np.argmax(via_numpy @ applied.T, axis=1)  # each query finds itself in the corpus
    assert np.array_equal(best, np.arange(0, len(rows), 7))


def test_one_model_checksum_everywhere(tmp_path, model_path, rows, run_cli):
    """model_checksum is the checksum of the map actually used: apply -k K stamps the one export -k K
    records in every format, serving's loaded map has, and info shows for a model saved at that setting;
    another setting has another one; the model file's own checksum is apart (file_checksum)."""
    onnx = need("onnx", "onnx")
    import h5py
    from safetensors import safe_open

    corpus = write_h5(tmp_path / "corpus.h5", rows, chunk_rows=128)
    stamps = {}
    for k in (SMALL_K, D):
        code, _, err = run_cli("apply", model_path, corpus, "-o", f"{tmp_path / f'white{k}.h5'}:/v", "-k", k, "-q")
        assert code == 0, err
        with h5py.File(tmp_path / f"white{k}.h5", "r") as handle:
            stamps[k] = handle["v"].attrs["model_checksum"]
        assert stamps[k] == expected_checksum(model_path, 1.0, 1.0, k)
        summary = export_ok(run_cli, model_path, "-o", tmp_path / f"q{k}.npz", "-k", k)
        assert summary["model_checksum"] == stamps[k] and summary["model_file_checksum"] == serving.file_checksum(
            model_path
        )
        assert serving.load(tmp_path / f"q{k}.npz").checksum == stamps[k]
        export_ok(run_cli, model_path, "-o", tmp_path / f"q{k}.onnx", "-k", k)
        props = {p.key: p.value for p in onnx.load(str(tmp_path / f"q{k}.onnx")).metadata_props}
        assert props["model_checksum"] == stamps[k]
        need("safetensors", "torch")
        export_ok(run_cli, model_path, "-o", tmp_path / f"q{k}.safetensors", "-k", k)
        with safe_open(str(tmp_path / f"q{k}.safetensors"), framework="np") as handle:
            assert handle.metadata()["model_checksum"] == stamps[k]
    assert stamps[SMALL_K] != stamps[D]
    code, out, _ = run_cli("info", model_path, "--json")  # the model's own setting: k = d
    assert code == 0 and json.loads(out)["model_checksum"] == stamps[D] == serving.load(model_path).checksum
    assert json.loads(out)["file_checksum"] == serving.file_checksum(model_path) != stamps[D]
    code, out, _ = run_cli("info", model_path)
    assert f"checksum   {stamps[D]}" in out


# ------------------------------------------------------------------------------------------ bad input


@pytest.mark.torch
def test_append_to_a_model_of_another_width_is_refused(tmp_path, st_model, run_cli):
    base = st_model[0]
    other = tmp_path / "other.npz"
    Whitener().fit(gentle_rows(200, n_features=12)).save(other)
    code, _, err = run_cli("export", other, "-o", tmp_path / "out", "--append-to", base)
    assert code == EXIT_BAD_INPUT
    one_line_error(err, base, "16-d vectors", "12-d")
    assert not os.path.exists(tmp_path / "out") and leftovers(tmp_path) == []


def test_unknown_format_is_refused(tmp_path, model_path, run_cli):
    code, _, err = run_cli("export", model_path, "-o", tmp_path / "map.bin")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "map.bin", "cannot tell the export format", "--format")
    code, _, err = run_cli("export", model_path, "-o", tmp_path / "map.npz", "--format", "tflite")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "tflite")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "name,extra",
    [
        ("map.npz", []),
        ("map.onnx", []),
        ("map.safetensors", []),
        ("map.faiss", []),
        ("index.faiss", ["--index", "Flat"]),
        pytest.param("modules", ["--format", "sentence-transformers"], marks=pytest.mark.torch),
    ],
)
def test_existing_output_rules(tmp_path, model_path, run_cli, name, extra):
    """An existing output: the same export again is nothing to do (exit 3); another one needs --overwrite
    (exit 2), which replaces only an export of this format written by streamwhiten: a user's file or
    directory at that path is refused (exit 2) and left byte for byte as it was."""
    need(
        *{
            "map.onnx": ("onnx", "onnx"),
            "map.safetensors": ("safetensors", "torch"),
            "map.faiss": ("faiss", "faiss"),
            "index.faiss": ("faiss", "faiss"),
            "modules": ("sentence_transformers", "sentence-transformers"),
        }.get(name, ("numpy", ""))
    )
    users = tmp_path / "users" / name
    users.parent.mkdir()
    if name == "modules":
        users.mkdir()
        (users / "keep.txt").write_text("old")
    else:
        users.write_text("old")
    before = tree(users)
    code, _, err = run_cli("export", model_path, "-o", users, *extra)
    assert code == EXIT_BAD_INPUT
    one_line_error(err, str(users), "already exists (pass --overwrite to replace it)")
    code, _, err = run_cli("export", model_path, "-o", users, *extra, "--overwrite")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, str(users), "exists and is not", "written by streamwhiten", "move it away")
    assert tree(users) == before and leftovers(users.parent) == []

    target = tmp_path / name
    export_ok(run_cli, model_path, "-o", target, *extra)
    written = tree(target)
    code, _, err = run_cli("export", model_path, "-o", target, *extra)  # the same again: up to date
    assert code == 3 and err.count("\n") == 1 and "nothing to do" in err and "up to date" in err, err
    assert tree(target) == written
    code, _, err = run_cli("export", model_path, "-o", target, *extra, "-k", SMALL_K)  # another map
    assert code == EXIT_BAD_INPUT
    one_line_error(err, str(target), "already exists (pass --overwrite to replace it)")
    assert tree(target) == written
    summary = export_ok(run_cli, model_path, "-o", target, *extra, "-k", SMALL_K, "--overwrite")
    assert summary["n_components"] == SMALL_K and tree(target) != written
    assert leftovers(tmp_path) == []


def test_an_export_of_another_format_is_not_replaced(tmp_path, model_path, run_cli):
    """--overwrite replaces an export of the same format only: a model file, or an npz of another kind
    at an .npz export's path, is refused."""
    other = tmp_path / "model-copy.npz"
    other.write_bytes(open(model_path, "rb").read())
    code, _, err = run_cli("export", model_path, "-o", other, "--overwrite")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, str(other), "is not an npz export written by streamwhiten (a streamwhiten model file)")
    assert other.read_bytes() == open(model_path, "rb").read()


def tree(path):
    """Every file under ``path`` (or the file itself) with its bytes."""
    if path.is_dir():
        return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    return path.read_bytes()


def test_output_over_the_model_is_refused(model_path, run_cli):
    before = open(model_path, "rb").read()
    code, _, err = run_cli("export", model_path, "-o", model_path, "--overwrite")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "would overwrite the input")
    assert open(model_path, "rb").read() == before


@pytest.mark.torch
def test_output_inside_the_model_appended_to_is_refused(st_model, run_cli):
    base, _, _, model_file = st_model
    code, _, err = run_cli("export", model_file, "-o", os.path.join(base, "inner"), "--append-to", base)
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "would overwrite the input")
    assert not os.path.exists(os.path.join(base, "inner"))


def test_options_of_other_formats_are_refused(tmp_path, model_path, run_cli):
    for args, fragment in [
        (["-o", tmp_path / "m.npz", "--index", "Flat"], "--index and --metric are for the faiss format"),
        (["-o", tmp_path / "m.onnx", "--append-to", tmp_path], "--append-to is for the sentence-transformers format"),
        (
            ["-o", tmp_path / "m.faiss", "--normalize"],
            "such as --index Flat for an IndexPreTransform, or drop --normalize",
        ),
        (["-o", tmp_path / "m.npz", "-k", "17"], "exceeds the data width d = 16"),
        (["-o", tmp_path / "m.npz", "--gamma", "2"], "gamma must be a number in [0, 1]"),
    ]:
        code, _, err = run_cli("export", model_path, *args)
        assert code == EXIT_BAD_INPUT, args
        one_line_error(err, fragment)
    assert os.listdir(tmp_path) == []


def test_missing_library_names_the_pip_install(tmp_path, model_path, run_cli, monkeypatch):
    for module, extra, name in [
        ("onnx", "onnx", "m.onnx"),
        ("faiss", "faiss", "m.faiss"),
        ("safetensors.numpy", "torch", "m.safetensors"),
    ]:
        monkeypatch.setitem(__import__("sys").modules, module, None)  # `import module` now raises ImportError
        code, _, err = run_cli("export", model_path, "-o", tmp_path / name)
        assert code == EXIT_BAD_INPUT
        one_line_error(err, f"pip install 'streamwhiten[{extra}]'")
    monkeypatch.setitem(__import__("sys").modules, "sentence_transformers", None)
    code, _, err = run_cli("export", model_path, "-o", tmp_path / "st", "--format", "sentence-transformers")
    one_line_error(err, "needs sentence-transformers: pip install 'streamwhiten[sentence-transformers]'")
    assert code == EXIT_BAD_INPUT and os.listdir(tmp_path) == []


def test_damaged_model_is_refused(tmp_path, model_path, run_cli):
    raw = open(model_path, "rb").read()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) // 3])
    code, _, err = run_cli("export", tmp_path / "cut.npz", "-o", tmp_path / "map.npz")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "cut.npz")
    assert not os.path.exists(tmp_path / "map.npz")


@pytest.mark.torch
def test_a_failure_while_copying_leaves_nothing(tmp_path, st_model, run_cli):
    """A file of the model that cannot be copied (a dangling link) fails the export after the temporary
    directory was started: exit 74, one line, no output and no temporary directory left."""
    base, _, _, model_file = st_model
    damaged = tmp_path / "damaged-model"
    import shutil

    shutil.copytree(base, damaged)
    os.symlink(tmp_path / "nowhere", damaged / "broken-link")
    out = tmp_path / "out"
    code, _, err = run_cli("export", model_file, "-o", out, "--append-to", damaged)
    assert code == 74
    one_line_error(err, str(out), "broken-link", "nothing was written")
    assert not os.path.exists(out) and leftovers(tmp_path) == []


# ------------------------------------------------------------------------ quantized storage (issue #26)


def search_codes(model, rows, dtype):
    """The corpus rows as the retrieval search stores them, and the record (evaluation.retrieval)."""
    from streamwhiten.core.quantize import Storage
    from streamwhiten.evaluation.retrieval import SearchSetting

    setting = SearchSetting.make("s", model, storage=Storage(dtype))
    return setting.quantization.encode(setting.unit(rows)), setting.quantization


@pytest.fixture(scope="module")
def stored_models(tmp_path_factory, model_path):
    """The export model recording int8 storage at k = SMALL_K, and binary storage at k = 13 (not 8n)."""
    from dataclasses import replace

    from streamwhiten.core.model import load_model, save_model
    from streamwhiten.core.quantize import Storage

    folder = tmp_path_factory.mktemp("stored")
    paths = {}
    for dtype, k in (("int8", SMALL_K), ("binary", 13)):
        model = replace(load_model(model_path).with_params(beta=1.0, gamma=0.5, n_components=k), storage=Storage(dtype))
        paths[dtype] = str(folder / f"{dtype}.npz")
        save_model(model, paths[dtype])
    return paths


def test_serving_and_whitener_encode_as_the_search_stores(stored_models, rows):
    from streamwhiten import serving
    from streamwhiten.core.model import load_model

    queries = rows[:50].astype(np.float64)
    for dtype, path in stored_models.items():
        model = load_model(path)
        codes, record = search_codes(model, queries, dtype)
        served = serving.load(path)
        assert served.dtype == dtype and served.quantization.to_dict() == record.to_dict()
        np.testing.assert_array_equal(served.encode(queries), codes)
        np.testing.assert_array_equal(served.encode(queries[0]), codes[0])  # one vector
        estimator = Whitener.load(path)
        assert estimator.dtype == dtype and estimator.quantization_.to_dict() == record.to_dict()
        np.testing.assert_array_equal(estimator.transform(queries), codes)
    # float32 input is whitened in float32 (as apply does): the same codes but for the rare value at a boundary
    ours, _ = search_codes(load_model(stored_models["int8"]), rows, "int8")
    assert (serving.load(stored_models["int8"]).encode(rows) == ours).mean() > 0.999


def test_npz_safetensors_and_onnx_carry_the_quantization_record(tmp_path, stored_models, rows, run_cli):
    from streamwhiten import serving
    from streamwhiten.core.model import load_model

    record = load_model(stored_models["int8"]).storage_records()[0].to_dict()
    summary = export_ok(run_cli, stored_models["int8"], "-o", tmp_path / "map.npz")
    assert (summary["dtype"], summary["bytes_per_vector"], summary["quantization"]) == ("int8", SMALL_K, record)
    exported = serving.load(tmp_path / "map.npz")
    assert exported.quantization.to_dict() == record
    np.testing.assert_array_equal(exported.encode(rows), serving.load(stored_models["int8"]).encode(rows))
    decoded = exported.quantization.decode(exported.encode(rows), np.float64)  # readable without the model
    assert np.abs(decoded - normalized(exported.transform(rows).astype(np.float64))).max() < 0.05
    # --dtype overrides the model's storage; float32 drops the record
    assert "quantization" not in export_ok(
        run_cli, stored_models["int8"], "-o", tmp_path / "f.npz", "--dtype", "float32"
    )
    with np.load(tmp_path / "f.npz") as arrays:
        assert "quantization_json" not in arrays.files
    bits = export_ok(run_cli, stored_models["int8"], "-o", tmp_path / "bits.npz", "--dtype", "binary")
    assert bits["dtype"] == "binary" and bits["bytes_per_vector"] == 1
    need("safetensors", "torch")
    from safetensors import safe_open

    export_ok(run_cli, stored_models["int8"], "-o", tmp_path / "map.safetensors")
    with safe_open(str(tmp_path / "map.safetensors"), "np") as handle:
        metadata = handle.metadata()
        assert set(handle.keys()) == {"weight", "bias"}  # still an nn.Linear state dict
    assert metadata["dtype"] == "int8" and json.loads(metadata["quantization"]) == record
    onnx = need("onnx", "onnx")
    export_ok(run_cli, stored_models["int8"], "-o", tmp_path / "map.onnx")
    props = {prop.key: prop.value for prop in onnx.load(str(tmp_path / "map.onnx")).metadata_props}
    assert json.loads(props["quantization"]) == record


def test_faiss_int8_is_a_scalar_quantizer_whose_codes_and_search_are_ours(tmp_path, stored_models, rows, run_cli):
    faiss = need("faiss", "faiss")
    from streamwhiten import serving
    from streamwhiten.core.model import load_model

    summary = export_ok(run_cli, stored_models["int8"], "-o", tmp_path / "int8.faiss")
    assert summary["faiss"] == "IndexPreTransform" and summary["metric"] == "ip" and not summary["needs_training"]
    index = faiss.read_index(str(tmp_path / "int8.faiss"))
    inner = faiss.downcast_index(faiss.downcast_index(index).index)
    assert isinstance(inner, faiss.IndexScalarQuantizer) and inner.sq.qtype == faiss.ScalarQuantizer.QT_8bit
    corpus, queries = rows[100:], rows[:40] + 0.05
    # faiss code c is our code c - 127 (module docstring of streamwhiten.export), but at a rounding boundary
    ours = serving.load(stored_models["int8"]).encode(corpus).astype(np.int64)
    theirs = index.sa_encode(corpus).astype(np.int64) - 127
    assert np.abs(theirs - ours).max() <= 1 and (theirs == ours).mean() > 0.999
    index.add(corpus)
    distances, found = index.search(queries, 10)
    # our int8 search: the float unit query against the decoded codes
    model = load_model(stored_models["int8"])
    codes, record = search_codes(model, corpus, "int8")
    from streamwhiten.evaluation.retrieval import SearchSetting

    unit = SearchSetting.make("q", model).unit(queries)
    scores = unit @ record.decode(codes, np.float64).T
    expected = np.argsort(-scores, axis=1, kind="stable")[:, :10]
    assert (found == expected).mean() > 0.99  # the same rows, but where float32 rounding swaps a near tie
    np.testing.assert_allclose(distances, np.take_along_axis(scores, found, axis=1), atol=1e-5)


def test_faiss_binary_is_an_index_binary_flat_of_our_packed_bits(tmp_path, stored_models, rows, run_cli):
    faiss = need("faiss", "faiss")
    from streamwhiten import serving

    summary = export_ok(run_cli, stored_models["binary"], "-o", tmp_path / "bits.binary.faiss")
    assert summary["faiss"] == "IndexBinaryFlat" and summary["metric"] == "hamming"
    index = faiss.read_index_binary(str(tmp_path / "bits.binary.faiss"))
    assert isinstance(index, faiss.IndexBinaryFlat) and index.d == 16 and index.ntotal == 0  # 13 bits, padded
    encode = serving.load(stored_models["binary"]).encode
    corpus, queries = encode(rows[100:]), encode(rows[:40] + 0.05)
    assert corpus.shape == (500, 2) and corpus.dtype == np.uint8
    index.add(corpus)
    distances, found = index.search(queries, 20)
    bits = lambda codes: np.unpackbits(codes, axis=1)[:, :13].astype(np.int64)  # noqa: E731
    hamming = bits(queries) @ (1 - bits(corpus)).T + (1 - bits(queries)) @ bits(corpus).T
    np.testing.assert_array_equal(distances, np.sort(hamming, axis=1)[:, :20])
    np.testing.assert_array_equal(np.take_along_axis(hamming, found, axis=1), distances)
    # an index holds no map: it is refused with --index, and recognised as ours on --overwrite
    code, _, err = run_cli("export", stored_models["binary"], "-o", tmp_path / "x.faiss", "--index", "Flat")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "--index is for float storage: binary storage is written as its own faiss IndexBinaryFlat")
    # recognised as ours (not refused as another program's file), and up to date: kept, exit 3
    code, _, err = run_cli("export", stored_models["binary"], "-o", tmp_path / "bits.binary.faiss", "--overwrite")
    assert code == EXIT_NOTHING_TO_DO and "is up to date" in err, err


def test_faiss_float_and_binary_exports_have_their_own_names_and_loaders(tmp_path, stored_models, run_cli):
    """A binary index is named *.binary.faiss and read with faiss.read_index_binary; a float file under that
    name is refused, and so is a binary index under a plain name; each of
    export's two loaders refuses the other kind in one line naming the right loader."""
    faiss = need("faiss", "faiss")
    from streamwhiten import export
    from streamwhiten.errors import BadInputError

    code, _, err = run_cli("export", stored_models["int8"], "-o", tmp_path / "int8.binary.faiss")
    assert code == EXIT_BAD_INPUT and not os.path.exists(tmp_path / "int8.binary.faiss")
    one_line_error(err, "names a binary index, but this export is a float faiss file", "name it *.faiss")
    export_ok(run_cli, stored_models["int8"], "-o", tmp_path / "int8.faiss")
    # a binary export under a float file's name (the former rule, removed in 0.3): refused, naming the loader
    code, _, err = run_cli("export", stored_models["binary"], "-o", tmp_path / "old.faiss")
    assert code == EXIT_BAD_INPUT and not os.path.exists(tmp_path / "old.faiss")
    one_line_error(err, "a binary faiss index (sign bits) is named *.binary.faiss", "faiss.read_index_binary")
    from streamwhiten import load_model

    with pytest.raises(BadInputError, match=r"named \*\.binary\.faiss"):
        export.export(load_model(stored_models["binary"]), str(tmp_path / "lib.faiss"))
    export_ok(run_cli, stored_models["binary"], "-o", tmp_path / "bits.binary.faiss")
    binary = export.read_faiss_binary(str(tmp_path / "bits.binary.faiss"))
    assert isinstance(faiss.downcast_IndexBinary(binary), faiss.IndexBinaryFlat)
    index = export.read_faiss_index(str(tmp_path / "int8.faiss"))
    assert isinstance(faiss.downcast_index(index), faiss.IndexPreTransform)
    with pytest.raises(BadInputError, match=r"bits\.binary\.faiss: a binary faiss index .*read_index_binary"):
        export.read_faiss_index(str(tmp_path / "bits.binary.faiss"))
    with pytest.raises(BadInputError, match=r"int8\.faiss: a float faiss file, not a binary index: .*read_index\b"):
        export.read_faiss_binary(str(tmp_path / "int8.faiss"))
