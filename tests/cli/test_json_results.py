"""``--json``: each command prints the ``to_json()`` of the typed result its library call returns, with the
keys docs/cli.md lists for it."""

import json
import re
from dataclasses import replace

import h5py
import numpy as np
import pytest
from conftest import REPO, anisotropic, write_h5

import streamwhiten
from streamwhiten import RetrievalOptions, export, load_model

DOCS = REPO / "docs" / "cli.md"
#: What changes from one run to the next: the time a run took, and where it wrote.
TIMING = {"seconds", "rows_per_second"}


def documented_keys() -> dict[str, set[str]]:
    """The keys docs/cli.md lists for each command's ``--json`` (its table, one row a command)."""
    rows = {}
    for line in DOCS.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and "to_json()" in cells[1]:
            rows[cells[0].replace("`", "")] = set(re.findall(r"`([a-z_]+)`", cells[2]))
    return rows


@pytest.fixture
def model_path(tmp_path):
    store = write_h5(tmp_path / "in.h5", anisotropic(600, 10, seed=3).astype(np.float32), chunk_rows=64)
    path = str(tmp_path / "model.npz")
    streamwhiten.fit(store, path, setting=streamwhiten.Setting(n_components=6))
    return path


@pytest.fixture
def pairs(tmp_path):
    rng = np.random.default_rng(0)
    a = anisotropic(80, 10, seed=5)
    b = a + rng.standard_normal(a.shape)
    with h5py.File(tmp_path / "pairs.h5", "w") as handle:
        handle["a"], handle["b"], handle["s"] = a, b, -np.linalg.norm(a - b, axis=1)
    where = str(tmp_path / "pairs.h5")
    return f"{where}:/a", f"{where}:/b", f"{where}:/s"


def printed(run_cli, *args) -> dict:
    quiet = ("-q",) if args[0] not in ("info", "export", "staleness") else ()
    code, out, err = run_cli(*args, "--json", *quiet)
    assert code == 0, err
    return json.loads(out)


def plain(value):
    """What a JSON round trip makes of ``value`` (tuples become lists)."""
    return json.loads(json.dumps(value))


def test_the_table_documents_every_command_with_json():
    documented = documented_keys()
    assert {"fit", "apply", "info", "eval (pairs)", "eval (retrieval)", "export", "staleness", "run"} <= set(documented)
    assert documented["eval (pairs)"] == {"pairs", "raw", "whitened", "model"}


def test_fit_and_apply_print_their_outcomes(tmp_path, model_path, run_cli):
    store = f"{tmp_path / 'in.h5'}:/emb"
    out = printed(run_cli, "fit", store, "-o", tmp_path / "cli.npz", "-k", "6")
    outcome = streamwhiten.fit(store, str(tmp_path / "lib.npz"), setting=streamwhiten.Setting(n_components=6))
    expected = plain(replace(outcome, model_path=str(tmp_path / "cli.npz")).to_json())
    assert {k: v for k, v in out.items() if k not in TIMING} == {k: v for k, v in expected.items() if k not in TIMING}
    assert set(out) == documented_keys()["fit"]

    out = printed(run_cli, "apply", model_path, store, "-o", tmp_path / "cli.zarr")
    outcome = streamwhiten.apply(model_path, store, str(tmp_path / "lib.zarr"))
    expected = plain(replace(outcome, output=out["output"]).to_json())
    assert {k: v for k, v in out.items() if k not in TIMING} == {k: v for k, v in expected.items() if k not in TIMING}
    assert set(out) == documented_keys()["apply"]


def test_info_prints_the_models_json(model_path, run_cli):
    out = printed(run_cli, "info", model_path)
    model = load_model(model_path)
    assert {k: out[k] for k in model.to_json()} == plain({k: v for k, v in model.to_json().items()})
    assert out["publication"] is None and set(out) == documented_keys()["info"]


def test_eval_on_pairs_prints_the_pairs_result(model_path, pairs, run_cli):
    out = printed(run_cli, "eval", model_path, "--pairs-a", pairs[0], "--pairs-b", pairs[1], "--scores", pairs[2])
    result = streamwhiten.evaluate(*pairs, model_path)
    assert isinstance(result, streamwhiten.PairsResult) and result.model == model_path
    assert out == plain(result.to_json())
    assert set(out) == documented_keys()["eval (pairs)"]
    assert set(out["whitened"]) == {"spearman", "pearson", "beta", "gamma", "k", "eps", "variance", "basis"}
    with pytest.raises(Exception):  # noqa: B017, PT011 - frozen: a result is not edited after the fact
        result.model = "other"  # type: ignore[misc]


def test_eval_on_a_retrieval_task_prints_the_retrieval_result(tmp_path, model_path, run_cli):
    corpus = anisotropic(200, 10, seed=7)
    queries = corpus[:20] + 0.1 * np.random.default_rng(1).standard_normal((20, 10))
    with h5py.File(tmp_path / "task.h5", "w") as handle:
        handle["q"], handle["c"] = queries, corpus
    qrels = tmp_path / "qrels.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{i}\t{i}\t1\n" for i in range(20)))
    task = (f"{tmp_path / 'task.h5'}:/q", f"{tmp_path / 'task.h5'}:/c", str(qrels))
    args = ("eval", model_path, "--queries", task[0], "--corpus", task[1], "--qrels", task[2], "--bootstrap", "50")
    out = printed(run_cli, *args)
    result = streamwhiten.evaluate_retrieval(*task, model=model_path, options=RetrievalOptions(bootstrap=50))
    assert isinstance(result, streamwhiten.RetrievalResult) and result.model == model_path
    assert out == plain(result.to_json())
    assert set(out) == documented_keys()["eval (retrieval)"]


@pytest.mark.parametrize("name", ["map.npz", "map.onnx"])
def test_export_prints_the_export_result(tmp_path, model_path, run_cli, name):
    if name.endswith(".onnx"):
        pytest.importorskip("onnx")
    out = printed(run_cli, "export", model_path, "-o", tmp_path / name)
    affine = streamwhiten.serving.load(model_path)  # the map with the model file's checksum, as the CLI takes it
    result = export.export(affine, str(tmp_path / f"lib-{name}"))
    assert isinstance(result, streamwhiten.ExportResult) and result.format == out["format"]
    expected = plain(replace(result, output=out["output"], model=model_path).to_json())
    if "file_checksum" in expected:  # npz: the file's own checksum, the same bytes written twice
        assert out["file_checksum"] == expected["file_checksum"]
    assert out == expected
    assert documented_keys()["export"] <= set(out)
    assert set(out) - documented_keys()["export"] <= {"file_checksum", "opset"}


def test_staleness_prints_the_staleness(model_path, run_cli):
    out = printed(run_cli, "staleness", model_path, "--published", model_path)
    model = load_model(model_path)
    expected = streamwhiten.staleness(model, model.state).to_json()
    assert {k: out[k] for k in expected} == plain(expected) and out["stale"] is False
    assert set(out) == documented_keys()["staleness"]


def test_tune_on_pairs_prints_its_documented_keys(model_path, pairs, run_cli):
    args = ("--pairs-a", pairs[0], "--pairs-b", pairs[1], "--scores", pairs[2], "--ks", "4,8", "--variances", "")
    out = printed(run_cli, "tune", model_path, *args)
    assert set(out) == documented_keys()["tune (pairs)"]
