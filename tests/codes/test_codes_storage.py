"""A vector code as a model's storage (codes.storage, pipeline.with_codes, ``streamwhiten codes``): the model
file's record of the codec (checksummed bytes), ``eval --dtype NAME:BYTES`` against a plain numpy search of the
codec's estimates, the re-ranking, ``serving.codec``/``serving.decode`` against the codec, the faiss export
loaded with faiss itself, the bytes accounting, and bad input."""

from __future__ import annotations

import json
import zipfile

import h5py
import numpy as np
import pytest
from conftest import Phases, run_command, write_h5, write_task

from streamwhiten import serving, with_codes
from streamwhiten._npz import read_npz, write_npz_atomic
from streamwhiten.codes import codec_from_bytes
from streamwhiten.codes.storage import model_codec, unit_output_moments
from streamwhiten.core import stats
from streamwhiten.core.model import finalize, load_model, save_model
from streamwhiten.errors import BadInputError, ModelFileError
from streamwhiten.evaluation.retrieval import evaluate_retrieval
from streamwhiten.options import RetrievalOptions


@pytest.fixture
def task(tmp_path):
    return write_task(tmp_path, n=1500, d=16, n_queries=40, offset=2.0)


@pytest.fixture
def model(task):
    return finalize(stats.block_moments(task["corpus"].astype(np.float64)), beta=1.0, gamma=0.5, n_components=12)


def unit_outputs(model, rows):
    weights, shift = model.projection(np.float64)
    y = (np.asarray(rows, np.float64) - shift) @ weights
    return y / np.linalg.norm(y, axis=1, keepdims=True)


def faiss_or_skip():
    return pytest.importorskip("faiss", reason="faiss is not installed: pip install faiss-cpu")


# ------------------------------------------------------------------------------------------- training


def test_codes_train_from_the_exact_moments_of_the_unit_outputs(model, task):
    mean, cov = unit_output_moments(model)
    y = (task["corpus"].astype(np.float64) - model.beta * model.mean) @ model.projection(np.float64)[0]
    energy = np.mean(np.sum(y * y, axis=1))  # E||y||^2 of the fitted rows: the unit scaling of the module's text
    np.testing.assert_allclose(mean * np.sqrt(energy), y.mean(0), atol=1e-9)
    np.testing.assert_allclose(cov * energy, np.cov(y.T, bias=True), rtol=1e-7, atol=1e-9)


def test_a_statistics_code_needs_no_sample_and_a_sample_code_records_its_size_and_seed(model, task):
    eigen = with_codes(model, "eigen:4")
    assert eigen.storage.codec.sample_rows == 0 and eigen.storage.label == "eigen-4B"
    faiss_or_skip()
    pq = with_codes(model, "faiss-pq", 6, sample=task["corpus"], sample_size=600, seed=3)
    assert (pq.storage.codec.sample_rows, pq.storage.codec.sample_seed) == (600, 3)
    again = with_codes(model, "faiss-pq:6", sample=task["corpus"], sample_size=600, seed=3)
    assert again.storage.codec.data == pq.storage.codec.data  # seeded: the same sample, the same codec
    with pytest.raises(BadInputError, match="learns from a sample"):
        with_codes(model, "faiss-pq:6")


# ------------------------------------------------------------------------------------------ model file


def test_with_codes_tells_its_progress_each_phase_with_the_sample_size(model, task):
    faiss_or_skip()
    told = Phases()
    coded = with_codes(model, "faiss-pq:6", sample=task["spec_c"], sample_size=600, seed=3, progress=told)
    assert told.begun == told.ended == ["read the sample", "train faiss-pq:6 on 600 rows"]
    assert coded.storage.codec.sample_rows == 600
    assert told.counts[-1] == (1500, 1500) and [done for done, _ in told.counts] == sorted(d for d, _ in told.counts)
    told = Phases()
    with_codes(model, "eigen:4", progress=told)
    assert told.ended == ["train eigen:4 from the statistics"] and told.counts == []


def test_eval_over_a_code_tells_each_training_and_the_search(model, task):
    faiss_or_skip()
    told = Phases()
    evaluate_retrieval(
        task["spec_q"],
        task["spec_c"],
        task["qrels"],
        model=model,
        progress=told,
        storage="faiss-pq:6",
        options=RetrievalOptions(bootstrap=0),
    )
    assert told.ended == [
        "read a sample of the corpus",
        "train faiss-pq:6 for the raw vectors on 1,500 rows",
        "train faiss-pq:6 for the whitened vectors on 1,500 rows",
        "search 2 settings over 1,500 rows",
    ]
    assert told.counts[-1] == (1500, 1500)


def test_a_model_with_a_codec_round_trips_and_plain_files_load_as_before(tmp_path, model):
    plain = tmp_path / "plain.npz"
    save_model(model, str(plain))
    assert load_model(str(plain)).storage is None
    coded = with_codes(model, "eigen+f:5")
    path = tmp_path / "coded.npz"
    save_model(coded, str(path))
    loaded = load_model(str(path))
    assert loaded.storage.codec.data == coded.storage.codec.data
    assert loaded.storage.to_dict() == coded.storage.to_dict()
    with np.load(path, allow_pickle=False) as arrays:  # the codec's own bytes, no pickle
        assert arrays["storage_codec"].dtype == np.uint8
    rows = unit_outputs(model, np.random.default_rng(1).standard_normal((30, 16)) + 2.0)
    codec = model_codec(loaded)
    np.testing.assert_array_equal(codec.encode(rows), model_codec(coded).encode(rows))
    summary = loaded.to_json()["storage"]
    assert summary["bytes_per_vector"] == 5 and summary["codec"]["model_bytes"] == len(codec.to_bytes())


def test_a_flipped_byte_of_the_codec_is_refused_in_one_line(tmp_path, model):
    path = tmp_path / "coded.npz"
    save_model(with_codes(model, "eigen:4"), str(path))
    arrays = read_npz(str(path), "model file", "streamwhiten-model", 1)
    arrays = {name: np.asarray(value) for name, value in arrays.items() if name != "checksum"}
    flipped = arrays["storage_codec"].copy()
    flipped[len(flipped) // 2] ^= 1
    # an edit with the file's checksum recomputed: the record names the codec's SHA-256
    edited = tmp_path / "edited.npz"
    write_npz_atomic(str(edited), dict(arrays, storage_codec=flipped), "model file")
    with pytest.raises(ModelFileError) as caught:
        load_model(str(edited))
    assert "storage_json" in str(caught.value) and "\n" not in str(caught.value)
    # ... and with the record's SHA-256 recomputed too: the codec's own checksum refuses it where it is used
    record = json.loads(str(arrays["storage_json"]))
    import hashlib

    record["codec"]["sha256"] = hashlib.sha256(flipped.tobytes()).hexdigest()
    forged = tmp_path / "forged.npz"
    write_npz_atomic(
        str(forged), dict(arrays, storage_codec=flipped, storage_json=np.array(json.dumps(record))), "model file"
    )
    with pytest.raises(ModelFileError, match="checksum") as caught:
        serving.codec(str(forged))
    assert "\n" not in str(caught.value)
    # a byte flipped in the file itself: its checksum
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("storage_codec.npy")
    raw[info.header_offset + 200] ^= 1
    damaged = tmp_path / "damaged.npz"
    damaged.write_bytes(bytes(raw))
    with pytest.raises(ModelFileError):
        load_model(str(damaged))


def test_a_codec_of_another_dimension_is_refused_in_one_line(tmp_path, model):
    coded = with_codes(model, "eigen:4")
    with pytest.raises(BadInputError, match="codes vectors of 12 values, not 8"):
        codec_from_bytes(coded.storage.codec.data, 8)
    narrower = model.with_params(n_components=8)
    from streamwhiten.codes.storage import with_codec

    with pytest.raises(BadInputError, match="map gives k=8"):
        with_codec(narrower, model_codec(coded), "eigen")
    # a model file whose k no longer is the codec's
    path = tmp_path / "coded.npz"
    save_model(coded, str(path))
    arrays = {n: np.asarray(v) for n, v in read_npz(str(path), "model file", "streamwhiten-model", 1).items()}
    arrays.pop("checksum", None)
    edited = tmp_path / "edited.npz"
    write_npz_atomic(str(edited), dict(arrays, n_components=np.array(8, dtype=np.int64)), "model file")
    with pytest.raises(ModelFileError, match="12-d vectors, but the map gives k=8") as caught:
        load_model(str(edited))
    assert "\n" not in str(caught.value)
    # another setting of the model records no codec: the codec is for its outputs alone
    assert coded.with_params(gamma=1.0).storage is None and coded.with_params(gamma=0.5).storage is not None


@pytest.mark.parametrize("spec", ["eigen:0", "eigen:x", "nope:8", "eigen:-3"])
def test_a_bad_code_name_is_refused(model, spec):
    with pytest.raises(BadInputError, match="NAME:BYTES"):
        with_codes(model, spec)
    with pytest.raises(BadInputError, match="byte budget"):
        with_codes(model, "eigen")


def test_a_budget_below_the_smallest_code_is_refused_by_the_cli_and_writes_nothing(tmp_path, model, task):
    faiss_or_skip()
    path = tmp_path / "m.npz"
    save_model(model, str(path))
    out = tmp_path / "coded.npz"
    done = run_command("codes", path, "faiss-rabitq1:4", "--sample", task["spec_c"], "-o", out)
    assert done.returncode == 2 and "below the smallest rabitq1 code" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not out.exists()
    done = run_command("codes", path, "faiss-pq:6", "-o", out)
    assert done.returncode == 2 and "--sample" in done.stderr and not out.exists()


# ----------------------------------------------------------------------------------------------- eval


def reference_top(codec, queries, codes, excluded, depth):
    """Each query's best ``depth`` estimates (numpy: the codec's inner products), excluded pairs dropped."""
    scores = codec.inner_products(queries, codes).astype(np.float64)
    for q, c in excluded:
        scores[q, c] = -np.inf
    return -np.sort(-scores, axis=1)[:, :depth], scores


@pytest.mark.parametrize("spec", ["eigen:5", "bits-random+f:3", "faiss-pq:6"])
def test_eval_over_codes_equals_a_numpy_search_of_the_codec(tmp_path, model, task, spec):
    from streamwhiten.evaluation.retrieval import SearchSetting, search_settings
    from streamwhiten.evaluation.search import Exclusions
    from streamwhiten.storage import parse_storage

    if spec.startswith("faiss"):
        faiss_or_skip()
    coded = with_codes(model, spec, sample=task["corpus"], sample_size=1000)
    codec = model_codec(coded)
    setting = SearchSetting.make_code("whitened", coded, codec, parse_storage(spec))
    pairs = np.array(task["excluded"]).reshape(-1, 2)
    exclude = Exclusions.from_pairs(40, pairs[:, 0], pairs[:, 1])
    top = search_settings(
        task["queries"], task["corpus"], [setting], exclude=exclude, depth=20, options=RetrievalOptions(block_rows=400)
    )
    found = top["whitened"].rows
    codes = codec.encode(unit_outputs(model, task["corpus"]))
    expected, scores = reference_top(codec, unit_outputs(model, task["queries"]), codes, task["excluded"], 20)
    got = np.take_along_axis(scores, found, axis=1)  # the reference's estimate of each row found, in its order
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert not any((q, int(c)) in set(map(tuple, task["excluded"])) for q in range(40) for c in found[q])
    # the library call: the model's own codec for the whitened vectors, the same code trained for the raw ones
    result = evaluate_retrieval(
        task["spec_q"],
        task["spec_c"],
        task["qrels"],
        model=coded,
        options=RetrievalOptions(exclude=task["exclude"], bootstrap=0),
    )
    white, raw = result.whitened, result.raw
    assert (white.dtype, white.code, white.codec) == (spec, codec.label, "model")
    assert white.bytes_per_vector == codec.bytes_per_vector and white.model_bytes == codec.model_bytes
    assert raw.code.split("-")[0] == codec.label.split("-")[0] and raw.bytes_per_vector <= int(spec.split(":")[1])


def test_rescore_re_ranks_the_top_n_of_the_codes_by_float32(model, task):
    from streamwhiten.evaluation.retrieval import SearchSetting, search_settings
    from streamwhiten.storage import parse_storage

    coded = with_codes(model, "eigen:3")
    codec = model_codec(coded)
    setting = SearchSetting.make_code("whitened", coded, codec, parse_storage("eigen:3", rescore=30))
    found = search_settings(task["queries"], task["corpus"], [setting], depth=10)["whitened"].rows
    unit_q, unit_c = unit_outputs(model, task["queries"]), unit_outputs(model, task["corpus"])
    codes = codec.encode(unit_c)
    _, scores = reference_top(codec, unit_q, codes, [], 30)
    for i in range(40):
        candidates = np.argsort(-scores[i], kind="stable")[:30]
        exact = unit_c[candidates].astype(np.float32).astype(np.float64) @ unit_q[i]
        np.testing.assert_array_equal(found[i], candidates[np.argsort(-exact, kind="stable")][:10])
    assert setting.params["bytes_per_vector"] == 3 + 4 * 12 and setting.params["model_bytes"] == codec.model_bytes


def test_eval_cli_takes_a_code_and_refuses_a_bad_one(tmp_path, model, task, run_cli):
    path = tmp_path / "m.npz"
    save_model(model, str(path))
    args = ["eval", path, "--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", task["qrels"]]
    code, out, _ = run_cli(*args, "--dtype", "eigen:4", "--bootstrap", "0", "--json", "-q")
    assert code == 0
    result = json.loads(out)
    assert result["whitened"]["code"] == "eigen-4B" and result["whitened"]["bytes_per_vector"] == 4
    assert result["whitened"]["model_bytes"] > 0 and "codec" not in result["whitened"]  # trained for this eval
    code, out, _ = run_cli(*args, "--dtype", "eigen:4", "--bootstrap", "0", "-q")
    assert "per model" in out and "code eigen:4" in out
    code, _, err = run_cli(*args, "--dtype", "eigen")
    assert code == 2 and "NAME:BYTES" in err
    code, _, err = run_cli("eval", "--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", task["qrels"],
                           "--dtype", "eigen:4")  # fmt: skip
    assert code == 2 and "give a model" in err


def test_labelled_pairs_score_by_the_codecs_estimate(tmp_path, model, task, run_cli):
    from scipy.stats import spearmanr

    rng = np.random.default_rng(5)
    a = task["corpus"][:300]
    b = (a + 0.8 * rng.standard_normal(a.shape)).astype(np.float32)
    gold = -np.linalg.norm(a - b, axis=1)
    np.save(tmp_path / "gold.npy", gold)
    coded = with_codes(model, "eigen:4")
    path = tmp_path / "coded.npz"
    save_model(coded, str(path))
    code, out, _ = run_cli("eval", path, "--pairs-a", write_h5(tmp_path / "a.h5", a), "--pairs-b",
                           write_h5(tmp_path / "b.h5", b), "--scores", tmp_path / "gold.npy", "--json", "-q")  # fmt: skip
    assert code == 0
    white = json.loads(out)["whitened"]
    codec = model_codec(coded)
    estimates = np.diagonal(codec.inner_products(unit_outputs(model, a), codec.encode(unit_outputs(model, b))))
    assert white["spearman"] == pytest.approx(100 * spearmanr(estimates, gold).statistic, abs=1e-6)
    assert (white["code"], white["bytes_per_vector"]) == ("eigen-4B", 4)


# ------------------------------------------------------------------------------------- serving, export


def test_serving_decodes_what_the_codec_decodes_without_numba(tmp_path, model, task):
    coded = with_codes(model, "eigen+f:6")
    path = tmp_path / "coded.npz"
    save_model(coded, str(path))
    codec = model_codec(coded)
    rows = codec.encode(unit_outputs(model, task["corpus"][:50]))
    np.testing.assert_array_equal(serving.decode(rows, serving.codec(str(path))), codec.decode(rows))
    np.testing.assert_array_equal(serving.decode(rows, codec.to_bytes()), codec.decode(rows))
    # the storage value a model records, and what codes.storage.resolve resolves (or its encoder), decode alike
    from streamwhiten.codes.storage import resolve
    from streamwhiten.storage import Storage

    for record in (coded.storage, resolve(coded), resolve(coded).encoder):
        np.testing.assert_array_equal(serving.decode(rows, record), codec.decode(rows))
    with pytest.raises(BadInputError, match="int8 storage decodes by the ranges its output records"):
        serving.decode(rows, Storage("int8"))
    np.save(tmp_path / "rows.npy", rows)
    script = (
        "import sys, numpy as np; from streamwhiten import serving; "
        f"c = serving.codec({str(path)!r}); m = serving.load({str(path)!r}, normalize=True); "
        f"x = np.asarray({task['corpus'][:50].tolist()!r}); "
        f"assert (c.encode(m.transform(x)) == np.load({str(tmp_path / 'rows.npy')!r})).all(); "
        "assert 'numba' not in sys.modules, 'numba'; print('ok')"
    )
    import subprocess
    import sys

    from conftest import REPO

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    with pytest.raises(BadInputError, match="records no vector code"):
        plain = tmp_path / "plain.npz"
        save_model(model, str(plain))
        serving.codec(str(plain))


@pytest.mark.parametrize("spec", ["faiss-pq:6", "faiss-opq:4", "faiss-rabitq1:12", "faiss-sq8:8"])
def test_the_faiss_export_searches_the_codes_as_the_codec_does(tmp_path, model, task, spec):
    faiss = faiss_or_skip()
    from streamwhiten import export
    from streamwhiten.codes.fast import search

    coded = with_codes(model, spec, sample=task["corpus"], sample_size=1500)
    codec = model_codec(coded)
    path = tmp_path / "codes.faiss"
    summary = export.export(coded, str(path)).to_json()
    assert summary["code"] == codec.label and summary["bytes_per_vector"] == codec.bytes_per_vector
    index = faiss.read_index(str(path))
    codes = codec.encode(unit_outputs(model, task["corpus"]))
    faiss.downcast_index(index.index).add_sa_codes(codes)
    scores, rows = index.search(task["queries"].astype(np.float32), 10)  # raw queries: the map is in the index
    unit_q = unit_outputs(model, task["queries"]).astype(np.float32)
    want_scores, want_rows = search(codec, unit_q, codes, 10)
    np.testing.assert_array_equal(rows, want_rows)
    # the tool's faiss codes are of unit vectors: faiss's L2 distances of the centred, projected queries
    assert codec.unit and faiss.downcast_index(index.index).metric_type == faiss.METRIC_L2
    centred = unit_q.astype(np.float64) - codec.mean
    mapped = centred if codec.basis is None else centred @ codec.basis.astype(np.float64)
    dropped = np.sum(centred**2, axis=1) - np.sum(mapped**2, axis=1)
    lengths = np.sum(unit_q.astype(np.float64) ** 2, axis=1)
    estimate = 0.5 * ((lengths + 1.0 - np.maximum(dropped, 0.0))[:, None] - scores)
    np.testing.assert_allclose(estimate, want_scores, rtol=1e-4, atol=1e-4)
    assert summary["metric"] == "l2"


def test_export_refuses_the_tools_own_codes_naming_what_searches_them(tmp_path, model):
    faiss_or_skip()
    from streamwhiten import export

    coded = with_codes(model, "eigen:4")
    with pytest.raises(BadInputError, match="codes.fast.search"):
        export.export(coded, str(tmp_path / "codes.faiss"))
    with pytest.raises(BadInputError, match="faiss index"):
        export.export(coded, str(tmp_path / "map.npz"))
    assert not (tmp_path / "codes.faiss").exists() and not (tmp_path / "map.npz").exists()


def test_info_reports_per_vector_and_per_model_bytes_apart(tmp_path, model, run_cli):
    path = tmp_path / "coded.npz"
    save_model(with_codes(model, "eigen:4"), str(path))
    code, out, _ = run_cli("info", path)
    assert code == 0 and "code eigen-4B" in out and "4 bytes per vector" in out and "bytes per model" in out
    code, out, _ = run_cli("info", path, "--json")
    storage = json.loads(out)["storage"]
    assert storage["bytes_per_vector"] == 4 and storage["codec"]["model_bytes"] > 4


def test_the_codes_command_writes_a_model_that_eval_searches(tmp_path, model, task, run_cli):
    path, out = tmp_path / "m.npz", tmp_path / "coded.npz"
    save_model(model, str(path))
    code, text, _ = run_cli("codes", path, "eigen:5", "-o", out)
    assert code == 0 and "eigen-5B" in text and load_model(str(out)).storage.codec.budget == 5
    assert load_model(str(path)).storage is None  # the input model is left as it was
    code, text, _ = run_cli("eval", out, "--queries", task["spec_q"], "--corpus", task["spec_c"],
                            "--qrels", task["qrels"], "--bootstrap", "0", "--json", "-q")  # fmt: skip
    assert code == 0 and json.loads(text)["whitened"]["codec"] == "model"
    spec = write_h5(tmp_path / "s.h5", task["corpus"])
    assert spec


def test_whitener_and_apply_take_a_model_with_a_code(tmp_path, model, task, run_cli):
    from streamwhiten import Whitener

    path = tmp_path / "coded.npz"
    save_model(with_codes(model, "eigen:4"), str(path))
    whitener = Whitener.load(str(path))  # transform gives floats; the code stays the model's storage
    np.testing.assert_allclose(whitener.transform(task["corpus"][:5]), model.transform(task["corpus"][:5]), rtol=1e-5)
    whitener.save(str(tmp_path / "again.npz"))
    assert load_model(str(tmp_path / "again.npz")).storage.label == "eigen-4B"
    out = tmp_path / "out.h5"
    code, _, err = run_cli("apply", path, task["spec_c"], "-o", out, "-q")  # the model's storage: its code
    assert code == 0, err
    codec = model_codec(load_model(str(path)))
    with h5py.File(out) as handle:
        (name,) = list(handle)
        stored = handle[name][:]
    want = codec.encode(unit_outputs(model, task["corpus"]).astype(np.float32))
    assert stored.shape == want.shape and np.mean(np.all(stored == want, axis=1)) > 0.99  # float32 vs float64 map
    floats = tmp_path / "floats.h5"
    code, _, _ = run_cli("apply", path, task["spec_c"], "-o", floats, "--dtype", "float32", "-q")
    assert code == 0 and floats.exists()


def test_the_codes_help_names_every_code_and_gives_examples(run_cli):
    code, out, _ = run_cli("codes", "--help")
    text = " ".join(out.split())
    assert code == 0 and "Examples:" in text and "--sample" in text and "--sample-size" in text
    families = ("eigen, eigen-iso, eigen+f", "bits-random[+f]", "bits-pca[+f]", "bits-itq[+f]", "faiss-pq")
    for name in (*families, "faiss-opq", "faiss-rabitq1/2/4", "faiss-sq4", "faiss-sq8"):
        assert name in text, name
    code, out, _ = run_cli("eval", "--help")
    assert "NAME:BYTES" in out and "eigen:24" in " ".join(out.split())


def test_resolve_gives_what_is_stored_and_remembers_it_per_model_and_storage(model, task):
    from streamwhiten.codes.storage import resolve, resolve_counts
    from streamwhiten.storage import parse_storage

    mine = model.with_params(gamma=0.4321)  # a map no other test resolves
    assert resolve(mine, parse_storage("float32")) is None and resolve(mine) is None  # floats: nothing coded
    int8 = resolve(mine, parse_storage("int8"))
    assert int8.kind == "int8" and int8.record == mine.quantization("int8").to_dict()
    hits, misses = resolve_counts()
    stored = resolve(mine, parse_storage("eigen:5"))
    assert resolve(mine, parse_storage("eigen:5")) is stored and resolve_counts() == (hits + 1, misses + 1)
    codec = model_codec(with_codes(mine, "eigen:5"))  # the same code, trained from the same statistics
    assert stored.kind == codec.label and stored.width == codec.bytes_per_vector
    assert stored.record["codec"]["sha256"] == stored.digest == stored.digest_in({"quantization": stored.record})
    unit = unit_outputs(mine, task["corpus"][:50]).astype(np.float32)
    rows = stored.encoder.encode(unit)
    np.testing.assert_array_equal(rows, codec.encode(unit))
    np.testing.assert_array_equal(stored.encoder.decode(rows), codec.decode(rows).astype(np.float32))
    coded = with_codes(mine, "eigen:5")  # a model recording the code: its own codec, whatever is asked
    assert resolve(coded).digest == coded.storage.codec.sha256 == resolve(coded, parse_storage("eigen:5")).digest
    with pytest.raises(BadInputError, match="learns from a sample of the input: record it in the model first"):
        resolve(mine, parse_storage("faiss-pq:4"))


def test_models_that_share_a_map_but_not_their_statistics_resolve_to_their_own_records():
    """At beta = gamma = 0 the map is the eigenvectors alone (no mean, no eigenvalue), so two data sets with the
    same axes give one map checksum; their int8 ranges and codes come from their own statistics."""
    import hashlib
    import itertools

    from streamwhiten.codes.storage import resolve, train_for
    from streamwhiten.core.model import map_checksum
    from streamwhiten.storage import parse_storage

    def fitted(scale):
        rows = np.array([[a * scale, b * 2.0, c * 1.0] for a, b, c in itertools.product([1, -1], repeat=3)])
        return finalize(stats.block_moments(rows), beta=0.0, gamma=0.0)

    small, large = fitted(3.0), fitted(10.0)
    assert map_checksum(small) == map_checksum(large)
    for model in (small, large):  # each resolved after the other: a memo keyed by the map alone gave the first's
        assert resolve(model, parse_storage("int8")).digest == model.quantization("int8").digest()
    for model in (small, large):  # the code each model's own statistics train, not the other's
        trained = hashlib.sha256(train_for(model, "eigen", 2).to_bytes()).hexdigest()
        assert resolve(model, parse_storage("eigen:2")).digest == trained
