"""The records (streamwhiten.records): JSON only at the file boundary, and exactly the JSON files have always held.

Model files, checkpoints and progress records written before the records were dataclasses hold plain JSON
objects; these tests write that form by hand (keys and values as the earlier code wrote them, the sampled
hash computed here from the rows with numpy) and check that it is read as the same record, and that what
is written now is that form.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np
import pytest
from conftest import anisotropic, write_h5

from streamwhiten.engine.fit import Checkpoint
from streamwhiten.options import ApplyOptions, ReadOptions
from streamwhiten.progress import Watch
from streamwhiten.records import Fingerprint, ResumeRecord


def sampled_sha256(rows: np.ndarray) -> str:
    """A fingerprint's hash of sampled rows, from its definition: the first and last 64 rows and the rows
    from each quartile on, in the store's bytes."""
    n = rows.shape[0]
    width = min(64, n)
    starts = sorted({0, n // 4, n // 2, (3 * n) // 4, max(0, n - width)})
    digest = hashlib.sha256()
    for start in starts:
        digest.update(np.ascontiguousarray(rows[start : min(n, start + width)]).tobytes())
    return digest.hexdigest()


def old_fingerprint(path, rows: np.ndarray, chunk_rows: int) -> dict:
    """The JSON object an earlier streamwhiten recorded for the HDF5 dataset /emb holding ``rows``."""
    return {
        "path": os.path.realpath(path),
        "dataset": "emb",
        "n_rows": int(rows.shape[0]),
        "n_features": int(rows.shape[1]),
        "dtype": str(rows.dtype),
        "chunk_rows": chunk_rows,
        "sha256_sampled": sampled_sha256(rows),
    }


# --------------------------------------------------------------------------------------------- units


@pytest.mark.parametrize(
    "data",
    [
        {"path": "/d/a.h5", "dataset": "emb", "n_rows": 7, "n_features": 3, "dtype": "float32", "chunk_rows": 0},
        {"path": "s3://b/c.zarr", "dataset": "", "n_rows": 9, "n_features": 2, "dtype": "float16", "chunk_rows": 4,
         "size": 1234, "etag": "abc", "sha256_sampled": "f" * 64},
        {"path": "/d/v.lance", "dataset": "vector", "n_rows": 5, "n_features": 2, "dtype": "float32", "chunk_rows": 0,
         "layout_sha256": "0" * 64, "version": 3, "rows_read": 2, "sha256_read": "1" * 64},
        {"path": "x"},
        {"path": "x", "a_key_of_another_version": [1, {"b": None}]},
    ],
)  # fmt: skip
def test_a_fingerprint_gives_and_takes_exactly_its_json(data):
    record = Fingerprint.from_dict(data)
    assert record.to_dict() == data and list(record.to_dict()) == sorted(data)
    assert json.dumps(record.to_dict(), sort_keys=True) == json.dumps(data, sort_keys=True)
    assert Fingerprint.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.n_rows = 1  # type: ignore[misc]


def test_a_fingerprint_read_part_way_then_finished():
    taken = Fingerprint(path="/a.h5", dataset="emb", n_rows=10, n_features=2, dtype="float32", chunk_rows=5)
    part = taken.read_to(4, "1" * 64)
    assert part.to_dict() == dict(taken.to_dict(), rows_read=4, sha256_read="1" * 64)
    done = part.finished("2" * 64)
    assert done.to_dict() == dict(taken.to_dict(), sha256_sampled="2" * 64)
    assert taken.missing(["path", "sha256_sampled", "layout_sha256"]) == ["sha256_sampled", "layout_sha256"]
    assert taken.where == "/a.h5:/emb" and Fingerprint(path="/a.npy", dataset="").where == "/a.npy"
    with pytest.raises(TypeError):
        Fingerprint.from_dict(["path", "x"])  # type: ignore[arg-type]


def _record() -> dict:
    return {
        "model_checksum": "a" * 64,
        "source": {"path": "/d/in.h5", "dataset": "emb", "n_rows": 10, "n_features": 4, "dtype": "float32",
                   "chunk_rows": 5, "sha256_sampled": "b" * 64},
        "output": "/d/out.zarr",
        "normalize": False,
        "dtype": "float16",
        "zarr_format": 3,
        "block_rows": 5,
        "skip_nonfinite": True,
        "threads": 2,
        "rows_done": 5,
        "n_nonfinite": 1,
    }  # fmt: skip


def test_a_resume_record_gives_and_takes_exactly_its_json():
    plain = _record()
    record = ResumeRecord.from_dict(plain)
    assert record.to_dict() == plain and record.compressor == "none" and record.keep_columns == ()
    full = dict(plain, compressor="zstd", keep_columns=["id", "text"])
    assert ResumeRecord.from_dict(full).to_dict() == full
    assert record.same_job(record.at(0)) and record.at(9, 2).to_dict() == dict(plain, rows_done=9, n_nonfinite=2)
    assert not record.same_job(ResumeRecord.from_dict(dict(plain, threads=1)))
    assert not record.same_job(ResumeRecord.from_dict(full))
    for other in (dict(plain, job=1), {k: v for k, v in plain.items() if k != "threads"}, dict(plain, source=3), []):
        with pytest.raises(ValueError):
            ResumeRecord.from_dict(other)  # type: ignore[arg-type]


# ------------------------------------------------------------------------ files written before records


def test_a_model_written_with_sources_as_plain_json_is_recognised(tmp_path, run_cli):
    """A model file whose sources are the JSON objects an earlier version wrote (built here by hand): a
    fit of the same unchanged input has nothing to do (exit 3), with or without --update."""
    from streamwhiten import Whitener
    from streamwhiten._npz import write_npz_atomic
    from streamwhiten.core.model import FORMAT_NAME, _arrays, load_model
    from streamwhiten.errors import EXIT_NOTHING_TO_DO

    rows = anisotropic(700, 6, seed=3).astype(np.float32)
    spec = write_h5(tmp_path / "in.h5", rows, chunk_rows=64)
    source = old_fingerprint(tmp_path / "in.h5", rows, 64)
    fitted = Whitener().fit(rows.astype(np.float64)).model_
    info = {"n_skipped_nonfinite": 0, "precision": "auto", "skip_nonfinite": False, "fill_missing_chunks": False}
    arrays = _arrays(dataclasses.replace(fitted, info=info))
    arrays["sources_json"] = np.array(json.dumps([source], sort_keys=True))
    model = tmp_path / "m.npz"
    write_npz_atomic(str(model), arrays, "model file")
    assert arrays["format"] == FORMAT_NAME
    loaded = load_model(str(model))
    assert loaded.sources == (Fingerprint.from_dict(source),) and loaded.sources[0].to_dict() == source
    code, _, err = run_cli("fit", spec, "-o", model)
    assert code == EXIT_NOTHING_TO_DO, err
    assert "nothing to do" in err
    code, _, err = run_cli("fit", spec, "--update", model)
    assert code == EXIT_NOTHING_TO_DO and "no rows were added" in err, err


def test_checkpoints_hold_cursors_and_fingerprints_as_plain_json(tmp_path):
    """What a checkpoint records of its cursors is the earlier JSON, and a checkpoint of that form (written
    here by hand) is resumed to the statistics of an uninterrupted fit."""
    from streamwhiten._npz import read_npz, write_npz_atomic
    from streamwhiten.engine.fit import (
        CHECKPOINT_FORMAT,
        CHECKPOINT_VERSION,
        fit_sources,
        load_checkpoint,
        plan_fit,
        run_plan,
    )
    from streamwhiten.errors import InterruptedRunError

    rows = anisotropic(700, 6, seed=4).astype(np.float32)
    spec = write_h5(tmp_path / "in.h5", rows, chunk_rows=100)
    checkpoint = str(tmp_path / "ck.npz")
    calls = iter(range(100))
    with pytest.raises(InterruptedRunError):
        run_plan(
            plan_fit(spec, block_rows=100), Watch(should_stop=lambda: next(calls) >= 2), Checkpoint(checkpoint, 1), 1
        )
    arrays = read_npz(checkpoint, "checkpoint", CHECKPOINT_FORMAT, CHECKPOINT_VERSION)
    meta = json.loads(str(arrays["meta_json"]))
    taken = old_fingerprint(tmp_path / "in.h5", rows, 100)
    del taken["sha256_sampled"]  # the pass hashes the sampled rows as it reads them: part-way so far
    (cursor,) = meta["cursors"]
    sha_read = cursor["fingerprint"]["sha256_read"]
    assert cursor == {
        "spec": spec,
        "fingerprint": dict(taken, rows_read=300, sha256_read=sha_read),
        "start": 0,
        "stop": 700,
        "next_row": 300,
        "n_skipped": 0,
    }
    assert meta["kept_sources"] == []
    # the same checkpoint, its JSON written by hand as before
    meta["cursors"] = [dict(cursor, fingerprint=dict(taken, rows_read=300, sha256_read=sha_read))]
    arrays = {key: arrays[key] for key in arrays if key != "checksum"}
    arrays["meta_json"] = np.array(json.dumps(meta, sort_keys=True))
    write_npz_atomic(checkpoint, arrays, "checkpoint")
    done = run_plan(load_checkpoint(checkpoint), threads=1)
    whole = fit_sources(spec, block_rows=100, threads=1)
    assert done.state.n_rows == 700 and done.result().sources == whole.sources
    assert done.result().sources[0].to_dict() == old_fingerprint(tmp_path / "in.h5", rows, 100)
    np.testing.assert_array_equal(done.state.scatter, whole.state.scatter)


def test_an_apply_progress_record_is_the_plain_json_and_one_written_by_hand_is_resumed(tmp_path):
    from streamwhiten.core.model import map_checksum
    from streamwhiten.engine.apply import apply_model
    from streamwhiten.errors import InterruptedRunError
    from streamwhiten.io import open_source

    rows = anisotropic(400, 6, seed=5).astype(np.float32)
    spec = write_h5(tmp_path / "in.h5", rows, chunk_rows=100)
    from streamwhiten import Whitener

    model = Whitener(n_components=3).fit(spec).model_
    out = str(tmp_path / "out.zarr")
    calls = iter(range(100))
    with pytest.raises(InterruptedRunError):
        apply_model(
            model,
            spec,
            out,
            ApplyOptions(progress_seconds=0),
            ReadOptions(block_rows=100),
            watch=Watch(should_stop=lambda: next(calls) >= 1),
        )
    progress = tmp_path / ".out.zarr.partial.progress.json"
    written = json.loads(progress.read_text())
    expected = {
        "model_checksum": map_checksum(model),
        "source": old_fingerprint(tmp_path / "in.h5", rows, 100),
        "output": os.path.abspath(out),
        "normalize": False,
        "dtype": "float32",
        "zarr_format": 3,
        "block_rows": 100,
        "skip_nonfinite": False,
        "threads": 1,
        "rows_done": 200,
        "n_nonfinite": 0,
    }
    assert written == expected
    progress.write_text(json.dumps(dict(expected, rows_done=100)))  # by hand: the earlier form, one block less
    summary = apply_model(model, spec, out, ApplyOptions(progress_seconds=0), ReadOptions(block_rows=100))
    assert summary.resumed_at_row == 100
    with open_source(out) as done:
        np.testing.assert_allclose(done.read(0, 400), model.transform(rows).astype(np.float32), rtol=1e-5, atol=1e-5)


def _manifest_json() -> dict:
    """The JSON of a manifest as a run writes it (paths relative to its folder, one input of two parts, a
    kept version), checksum included."""
    from streamwhiten.records import Manifest, Part, PublishedInput, Version

    source = Fingerprint(path="../shards/a.h5", dataset="emb", n_rows=30, n_features=4, dtype="float32", chunk_rows=0)
    parts = (Part("../out/a.v2.zarr", 0, 20, stamp="1700000000.0:123"), Part("../out/a.v2.1.zarr", 20, 30))
    manifest = Manifest(
        version=2,
        model_file="m.v2.npz",
        file_checksum="a" * 64,
        model_checksum="b" * 64,
        published_at="2026-01-01T00:00:00+00:00",
        n_rows=30,
        setting={"beta": 1.0, "output": "../out/{stem}.zarr"},
        inputs=(PublishedInput("../shards/a.h5", "../out/a.zarr", source, parts),),
        kept=(Version(1, "m.v1.npz", ("../out/a.v1.zarr",), "c" * 64),),
        job_id="0123abcd",
    )
    return manifest.to_dict()


def _with(data: dict, where: str, value) -> dict:
    """``data`` with the field at ``where`` (``inputs.0.parts.1.path``) set to ``value`` and the checksum
    recomputed, as anyone can."""
    from streamwhiten.records import json_checksum

    data = json.loads(json.dumps(data))
    *path, last = [int(key) if key.isdigit() else key for key in where.split(".")]
    target = data
    for key in path:
        target = target[key]
    target[last] = value(target[last]) if callable(value) else value
    data.pop("checksum")
    data["checksum"] = json_checksum(data)
    return data


#: every text field of a manifest (paths, names, identities, times) -> how its reader names it
MANIFEST_TEXT_FIELDS = {
    "inputs.0.parts.0.path": r"inputs\[0\]\.parts\[0\]\.path",
    "inputs.0.parts.1.path": r"inputs\[0\]\.parts\[1\]\.path",
    "inputs.0.parts.0.stamp": r"inputs\[0\]\.parts\[0\]\.stamp",
    "inputs.0.spec": r"inputs\[0\]\.spec",
    "inputs.0.output": r"inputs\[0\]\.output",
    "inputs.0.source.path": r"inputs\[0\]\.source\.path",
    "inputs.0.source.dataset": r"inputs\[0\]\.source\.dataset",
    "kept.0.outputs.0": r"kept\[0\]\.outputs\[0\]",
    "kept.0.model_file": r"kept\[0\]\.model_file",
    "model_file": r"model_file",
    "setting.output": r"setting\.output",
    "job_id": r"job_id",
    "published_at": r"published_at",
}


@pytest.mark.parametrize("where", MANIFEST_TEXT_FIELDS)
def test_a_manifest_field_holding_a_nul_byte_is_refused_naming_the_field(where):
    """Issue #45: a part path holding a NUL byte reached ``os.stat`` and ended in ``ValueError: embedded null
    byte`` (exit 1). No writer records one in any field: the reader names the field."""
    from streamwhiten.records import Manifest

    good = _manifest_json()
    assert Manifest.from_dict(good).to_dict() == good  # what a run writes is read back whole
    with pytest.raises(ValueError, match=rf"^the manifest's field {MANIFEST_TEXT_FIELDS[where]} holds a NUL byte"):
        Manifest.from_dict(_with(good, where, lambda text: text + "\x00x"))


@pytest.mark.parametrize(
    "where, value, message",
    [
        ("job_id", "ab\ncd", "job_id holds a control character"),
        ("inputs.0.parts.0.stamp", "1\t2", "stamp holds a control character"),
        ("published_at", "2026\r", "published_at holds a control character"),
        ("inputs.0.source.n_rows", 30.0, "n_rows must be a whole number"),
        ("inputs.0.source.chunk_rows", -1, "chunk_rows must be a whole number of at least 0"),
        ("inputs.0.source.dtype", 4, "dtype must be text"),
        ("inputs.0.parts.0.path", "", "path must be a non-empty string"),
    ],
)
def test_a_manifest_field_no_run_writes_is_refused(where, value, message):
    from streamwhiten.records import Manifest

    with pytest.raises(ValueError, match=message):
        Manifest.from_dict(_with(_manifest_json(), where, value))


def test_a_progress_record_holding_a_nul_byte_is_refused():
    record = ResumeRecord(
        "a" * 64, Fingerprint(path="/x/a.h5", n_rows=3), "/x/out.zarr", True, "float32", 3, 100, False, 1
    ).to_dict()
    assert ResumeRecord.from_dict(record).to_dict() == record
    with pytest.raises(ValueError, match=r"progress record's field output holds a NUL byte"):
        ResumeRecord.from_dict(dict(record, output="/x/out\x00.zarr"))
    with pytest.raises(ValueError, match=r"progress record's field source\.path holds a NUL byte"):
        ResumeRecord.from_dict(dict(record, source=dict(record["source"], path="/x/\x00")))
