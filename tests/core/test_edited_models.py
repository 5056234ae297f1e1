"""Model files, checkpoints, stored codes and exported maps edited by hand (issue #23): a file whose
checksum holds but that no fit, tune or export could have written is refused in one line naming the
field, by the command line and by every loader; what the package writes passes the same checks."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from conftest import run_command, write_h5
from user_files import SMALL, run_checked, snapshot


def rewrite_npz(source, target, **changes) -> None:
    """``source`` with the arrays in ``changes`` replaced (a callable gets the old array), and its checksum
    recomputed as anyone can: a file whose checksum holds, but that no fit wrote."""
    from streamwhiten._npz import checksum

    with np.load(source, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files if key != "checksum"}
    for key, change in changes.items():
        arrays[key] = np.asarray(change(arrays[key]) if callable(change) else change)
    with open(target, "wb") as handle:  # a file object: np.savez would add ".npz" to a checkpoint's name
        np.savez(handle, **arrays, checksum=np.array(checksum(arrays)))


def _rotated(eigvecs):
    """Columns of unit length that are no longer orthogonal (the first two mixed)."""
    edited = eigvecs.copy()
    edited[:, 1] = (eigvecs[:, 0] + eigvecs[:, 1]) / np.sqrt(2)
    edited[:, 1] /= np.linalg.norm(edited[:, 1])
    return edited


def _asymmetric(scatter):
    edited = scatter.copy()
    edited[0, 1] += 0.5 * abs(scatter[0, 0])
    return edited


#: field -> (edit, what the one line says)
MODEL_EDITS = {
    "eigvals-nan": ({"eigvals": lambda v: np.where(np.arange(v.size) == 3, np.nan, v)}, r"'eigvals' holds NaN or Inf"),
    "gamma-7": ({"gamma": 7.0}, r"'gamma' must be a number in \[0, 1\], got 7\.0"),
    "beta-negative": ({"beta": -0.5}, r"'beta' must be a number in \[0, 1\]"),
    "eps-zero": ({"eps": 0.0}, r"'eps' must be a positive finite number"),
    "variance-2": ({"variance": 2.0}, r"'variance' must be a fraction in \(0, 1\]"),
    "k-0": ({"n_components": np.int64(0)}, r"'n_components' must be at least 1"),
    "k-above-d": ({"n_components": np.int64(9)}, r"'n_components' is 9, more than the model's 8 features"),
    "k-float": ({"n_components": 4.0}, r"'n_components' must be a whole number"),
    "n-rows-1": ({"n_rows": np.int64(1)}, r"'n_rows' must be at least 2"),
    "mean-shape": ({"mean": lambda v: v[:-1]}, r"'mean' has shape \(7,\)"),
    "mean-inf": ({"mean": lambda v: np.where(np.arange(v.size) == 0, np.inf, v)}, r"'mean' holds NaN or Inf"),
    "scatter-asymmetric": ({"scatter": _asymmetric}, r"'scatter' is not symmetric"),
    "scatter-negative": ({"scatter": lambda v: v - 2 * np.diag(np.diag(v))}, r"'scatter' has a negative diagonal"),
    "eigvals-ascending": ({"eigvals": lambda v: v[::-1].copy()}, r"'eigvals' is not in descending order"),
    "eigvals-negative": ({"eigvals": lambda v: v - v[1]}, r"'eigvals' holds a negative eigenvalue"),
    "eigvals-scaled": (
        {"eigvals": lambda v: 2 * v, "eps_value": lambda v: 2 * v},
        r"'eigvals' and eigvecs are not the eigendecomposition",
    ),
    "eigvecs-long": ({"eigvecs": lambda v: 2 * v}, r"'eigvecs' has a column that is not of unit length"),
    "eigvecs-skewed": ({"eigvecs": _rotated}, r"'eigvecs' is not orthonormal"),
    "eps-value": ({"eps_value": lambda v: 10 * v}, r"'eps_value' is .*, but eps \* the largest eigenvalue is"),
    "k-not-variance": ({"variance": 0.5, "n_components": np.int64(8)}, r"'n_components' is 8, but the variance 0\.5"),
    "sources-type": ({"sources_json": np.array('{"path": 1}')}, r"'sources_json' must be a JSON list"),
    "source-rows": (
        {"sources_json": np.array('[{"path": "x.h5", "n_rows": "many"}]')},
        r"'sources_json' source 0: n_rows must be a whole",
    ),
    "source-nul": (  # issue #45: it reached os.stat as "ValueError: embedded null byte" (fit --update)
        {"sources_json": np.array('[{"path": "x\\u0000.h5", "n_rows": 3}]')},
        r"'sources_json' source 0: path holds a NUL byte",
    ),
    "info-precision": ({"info_json": np.array('{"precision": "float128"}')}, r"'info_json' precision must be one of"),
    "format-missing": ({"n_features": np.array("8")}, r"'n_features' must be a whole number"),
}


@pytest.mark.parametrize("case", MODEL_EDITS)
def test_a_model_file_that_no_fit_could_have_written_is_refused(tmp_path, small_model, case, run_cli):
    from streamwhiten import serving
    from streamwhiten.core.model import load_model
    from streamwhiten.errors import ModelFileError

    edits, pattern = MODEL_EDITS[case]
    (tmp_path / "good.npz").write_bytes(small_model)
    rewrite_npz(tmp_path / "good.npz", tmp_path / "model.npz", **edits)
    write_h5(tmp_path / "g.h5", SMALL)
    line = rf"^streamwhiten: error: {re.escape(str(tmp_path / 'model.npz'))}: model file field {pattern}"
    before = snapshot(tmp_path)
    for args in (
        ["info", tmp_path / "model.npz"],
        ["apply", tmp_path / "model.npz", tmp_path / "g.h5", "-o", tmp_path / "out.zarr"],
        ["export", tmp_path / "model.npz", "-o", tmp_path / "map.npz"],
    ):
        code, _, err = run_cli(*args)
        assert code == 2 and len(err.splitlines()) == 1 and re.search(line, err), (args, code, err)
    assert snapshot(tmp_path) == before
    for load in (load_model, serving.load):
        with pytest.raises(ModelFileError, match=pattern):
            load(str(tmp_path / "model.npz"))


def test_an_edited_model_is_refused_by_the_command_line_in_one_line(tmp_path, small_model):
    (tmp_path / "good.npz").write_bytes(small_model)
    rewrite_npz(tmp_path / "good.npz", tmp_path / "model.npz", gamma=7.0)
    write_h5(tmp_path / "g.h5", SMALL)
    run_checked(tmp_path, ["apply", "model.npz", "g.h5", "-o", "o.zarr"], 2, r"model\.npz: model file field 'gamma'")
    run_checked(tmp_path, ["fit", "g.h5", "--update", "model.npz"], 2, r"model\.npz: model file field 'gamma'")


def test_the_models_the_package_writes_all_pass_the_checks(tmp_path, small_model):
    """The checks hold for what fits write: every setting of the same statistics, a constant column, a
    rank-deficient store, float64 rows, and the models of ``tune``'s grid."""
    from streamwhiten import Whitener
    from streamwhiten.core.model import load_model

    rank_deficient = np.hstack([SMALL[:, :4], SMALL[:, :4] * 2.0, np.full((len(SMALL), 2), 7.0)])
    for rows in (SMALL, rank_deficient, SMALL.astype(np.float64) * 1e6, SMALL[:2]):
        for params in ({}, {"beta": 0.0, "gamma": 0.0}, {"variance": 0.9}, {"n_components": 1, "eps": 1e-3}):
            Whitener(**params).fit(rows).save(str(tmp_path / "m.npz"))
            load_model(str(tmp_path / "m.npz"))


def _storage(edit):
    """An edit of the ``storage_json`` of a model recording int8 storage: ``edit(record)`` changes the dict."""

    def change(value):
        record = json.loads(str(value))
        edit(record)
        return np.array(json.dumps(record))

    return {"storage_json": change}


def _scaled_int8(record):
    record["quantization"]["scale"][0] *= 1.01


#: storage edits of a model that records int8 storage (what ``tune --queries ...`` writes) -> the one line
STORAGE_EDITS = {
    "not-json": ({"storage_json": np.array("{int8")}, r"'storage_json' is not valid JSON"),
    "dtype": (_storage(lambda r: r.update(dtype="int4")), r"'storage_json' is no storage: dtype must be"),
    "rescore-float": (
        _storage(lambda r: r.update(rescore=10)),
        r"'storage_json' is no storage: rescore re-ranks a bit search",
    ),
    "clip": (_storage(lambda r: r.update(int8_clip=0.0)), r"'storage_json' is no storage: int8_clip must be a number"),
    "bytes": (_storage(lambda r: r.update(bytes_per_vector=3)), r"'storage_json' says 3 bytes per vector, but int8"),
    "ranges": (_storage(_scaled_int8), r"'storage_json' quantization is not the int8 record the saved statistics"),
    "no-record": (
        _storage(lambda r: r.update(quantization=None)),
        r"'storage_json' quantization: not a streamwhiten-quantization",
    ),
    "stray-record": (
        _storage(lambda r: r.update(rescore_quantization=r["quantization"])),
        r"'storage_json' holds a rescore_quantization record its storage has no use for",
    ),
}


@pytest.fixture(scope="module")
def int8_model(tmp_path_factory):
    from streamwhiten import Whitener

    path = tmp_path_factory.mktemp("int8-model") / "model.npz"
    Whitener(n_components=4, dtype="int8").fit(SMALL).save(str(path))
    return path.read_bytes()


@pytest.mark.parametrize("case", STORAGE_EDITS)
def test_a_storage_that_no_tune_could_have_written_is_refused(tmp_path, int8_model, case, run_cli):
    from streamwhiten import serving
    from streamwhiten.core.model import load_model
    from streamwhiten.errors import ModelFileError

    (tmp_path / "good.npz").write_bytes(int8_model)
    assert load_model(str(tmp_path / "good.npz")).storage.dtype == "int8"  # what is written passes
    edits, pattern = STORAGE_EDITS[case]
    rewrite_npz(tmp_path / "good.npz", tmp_path / "model.npz", **edits)
    code, _, err = run_cli("info", tmp_path / "model.npz")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert re.search(rf"model\.npz: model file field {pattern}", err), err
    for load in (load_model, serving.load):
        with pytest.raises(ModelFileError, match=pattern):
            load(str(tmp_path / "model.npz"))


def test_a_model_file_without_a_storage_is_float32_and_reads_as_before(tmp_path, small_model):
    from streamwhiten import serving
    from streamwhiten.core.model import file_checksum, load_model

    (tmp_path / "model.npz").write_bytes(small_model)
    with np.load(tmp_path / "model.npz") as arrays:
        assert "storage_json" not in arrays.files  # a model that records none is written as before
    model = load_model(str(tmp_path / "model.npz"))
    assert (model.storage, model.dtype, serving.load(tmp_path / "model.npz").quantization) == (None, "float32", None)
    with np.load(tmp_path / "model.npz") as arrays:
        assert str(arrays["checksum"]) == file_checksum(model)


CHECKPOINT_EDITS = {
    "n-rows": ({"n_rows": lambda v: v + 5}, r"checkpoint field 'n_rows' is \d+, but the rows recorded as read"),
    "scatter-nan": ({"scatter": lambda v: v * np.nan}, r"checkpoint field 'scatter' holds NaN or Inf"),
    "cursor": (
        {"meta_json": lambda v: np.array(str(v).replace('"next_row": ', '"next_row": -'))},
        r"checkpoint field 'meta_json' cursor 0: start <= next_row <= stop",
    ),
    "spec-nul": (  # issue #45: a NUL byte in a path reaches os.stat as a bare ValueError
        {"meta_json": lambda v: np.array(str(v).replace('"spec": "', '"spec": "\\u0000'))},
        r"checkpoint field 'meta_json' cursors\[0\]\.spec holds a NUL byte",
    ),
    "precision": (
        {"meta_json": lambda v: np.array(str(v).replace('"auto"', '"float128"'))},
        r"checkpoint field 'meta_json' precision must be one of",
    ),
}


@pytest.mark.parametrize("case", CHECKPOINT_EDITS)
def test_a_checkpoint_that_no_fit_could_have_written_is_refused(tmp_path, case):
    from streamwhiten.engine.fit import plan_fit, run_plan, save_checkpoint

    write_h5(tmp_path / "g.h5", SMALL, chunk_rows=100)
    job = plan_fit(str(tmp_path / "g.h5"), block_rows=100)
    run_plan(job)
    job.cursors[0].next_row = 200  # as if stopped after two blocks (the state is of all rows: not checked here)
    save_checkpoint(job, str(tmp_path / "good.checkpoint"))
    edits, pattern = CHECKPOINT_EDITS[case]
    if case != "n-rows":
        edits = dict(edits, n_rows=np.int64(200))
    rewrite_npz(tmp_path / "good.checkpoint", tmp_path / ".m.npz.checkpoint", **edits)
    os.remove(tmp_path / "good.checkpoint")
    run_checked(
        tmp_path,
        ["fit", "g.h5", "-o", "m.npz", "--chunk-rows", "100"],
        2,
        rf"\.m\.npz\.checkpoint: {pattern}.*--restart",
    )


MAP_EDITS = {
    "A-nan": ({"A": lambda v: v * np.nan}, r"'A' holds NaN or Inf"),
    "gamma-7": ({"gamma": 7.0}, r"'gamma' must be a number in \[0, 1\]"),
    "b": ({"b": lambda v: v + 1.0}, r"'b' is not -\(beta mean\) A"),
    "normalize": ({"normalize": np.array("yes")}, r"'normalize' must be true or false"),
}


@pytest.mark.parametrize("case", MAP_EDITS)
def test_an_exported_map_that_no_export_could_have_written_is_refused(tmp_path, small_model, case):
    from streamwhiten import serving
    from streamwhiten.errors import ModelFileError

    (tmp_path / "model.npz").write_bytes(small_model)
    assert run_command("export", tmp_path / "model.npz", "-o", tmp_path / "good.npz").returncode == 0
    serving.load(tmp_path / "good.npz")  # what export writes passes
    edits, pattern = MAP_EDITS[case]
    rewrite_npz(tmp_path / "good.npz", tmp_path / "map.npz", **edits)
    with pytest.raises(ModelFileError, match=rf"map\.npz: whitening map field {pattern}"):
        serving.load(tmp_path / "map.npz")
