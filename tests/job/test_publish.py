"""Versioned publish/append (issue #25): a job with a ``[publish]`` table appends each night's rows with the
published map while it is fresh, publishes a new version beside the current one when it is stale, and
readers resolve outputs through the manifest.

Every expected output is computed independently: the published model file's map applied in numpy
(float64) to the rows the part should hold."""

from __future__ import annotations

import json
import os
import shutil

import h5py
import numpy as np
import pytest
from conftest import append_rows, run_command

from streamwhiten.core.model import load_model
from streamwhiten.errors import EXIT_BAD_INPUT, EXIT_NOTHING_TO_DO, BadInputError, ModelFileError, NothingToDoError
from streamwhiten.io import open_output, open_source, read_attrs
from streamwhiten.job import published, run_job_file
from streamwhiten.job.manifest import manifest_path, version_model_path, versioned_output
from streamwhiten.progress import Watch

D = 16
MIXING = np.random.default_rng(0).standard_normal((D, D)) * (1.0 / (1.0 + np.arange(D)))[:, None]


def rows_of(n, seed, shift=0.0):
    """``n`` rows of one fixed anisotropic distribution (``shift``: its mean moved along every column)."""
    return (3.0 + shift + np.random.default_rng(seed).standard_normal((n, D)) @ MIXING).astype(np.float32)


def write_job(directory, output="out/{stem}.zarr", publish="", model="n_components = 8", apply=""):
    (directory / "shards").mkdir(exist_ok=True)
    job = directory / "job.toml"
    job.write_text(
        'name = "pub"\n[input]\npaths = ["shards/day-*.h5"]\n'
        f'[model]\npath = "models/m.npz"\n{model}\n'
        f'[apply]\noutput = "{output}"\nnormalize = true\n{apply}\n'
        f"[publish]\n{publish}\n"
    )
    return str(job)


def edit(path, old, new):
    with open(path) as handle:
        text = handle.read()
    assert old in text
    with open(path, "w") as handle:
        handle.write(text.replace(old, new))


def read_all(spec):
    with open_source(spec) as source:
        return source.read(0, source.n_rows)


def expected(model_file, data):
    """The transform of ``data`` by the published model file's map, normalised, in float64 numpy."""
    model = load_model(model_file)
    k = model.n_components
    weights = model.eigvecs[:, :k] * (model.eigvals[:k] + model.eps_value) ** (
        -model.gamma / 2
    )  # A = U_k (L + eps)^-g/2
    y = (data.astype(np.float64) - model.beta * model.mean) @ weights
    return y / np.linalg.norm(y, axis=1, keepdims=True)


def tree_bytes(path):
    """Every file under ``path`` (or the file itself) by relative name: its bytes."""
    if os.path.isfile(path):
        return {"": open(path, "rb").read()}
    found = {}
    for directory, _, files in os.walk(path):
        for name in files:
            full = os.path.join(directory, name)
            found[os.path.relpath(full, path)] = open(full, "rb").read()
    return found


@pytest.fixture
def night(tmp_path):
    """A job with one shard of 2,000 rows, published once (version 1)."""
    job = write_job(tmp_path)
    append_rows(tmp_path / "shards" / "day-1.h5", rows_of(2000, 1))
    report = run_job_file(job)
    assert report.action == "fit" and report.published_version == 1
    return tmp_path, job


def test_first_run_publishes_version_1_beside_the_statistics(night):
    directory, job = night
    model = str(directory / "models" / "m.npz")
    assert os.path.exists(version_model_path(model, 1)) and os.path.exists(manifest_path(model))
    publication = published(model)
    assert publication.version == 1 and publication.outputs == (str(directory / "out" / "day-1.v1.zarr"),)
    assert publication.n_rows == 2000 and publication.model_file == version_model_path(model, 1)
    got = publication.read(str(directory / "shards" / "day-1.h5"))
    np.testing.assert_allclose(got, expected(publication.model_file, rows_of(2000, 1)), rtol=2e-5, atol=2e-6)
    # the statistics and the published copy are the same model on the first night
    assert load_model(model).n_rows == load_model(publication.model_file).n_rows == 2000
    with pytest.raises(NothingToDoError) as nothing:
        run_job_file(job)
    assert nothing.value.report.action == "nothing" and nothing.value.report.bytes_written == 0


def test_a_fresh_night_appends_new_rows_and_shards_as_parts_and_never_rewrites_old_rows(night):
    directory, job = night
    model = str(directory / "models" / "m.npz")
    first = str(directory / "out" / "day-1.v1.zarr")
    before = tree_bytes(first)
    append_rows(directory / "shards" / "day-1.h5", rows_of(100, 2))
    append_rows(directory / "shards" / "day-2.h5", rows_of(60, 3))
    report = run_job_file(job)
    assert report.action == "append", report
    assert report.published_version == 1 and report.rows_added == 160
    assert 0 < report.staleness.total <= report.max_staleness == 0.5
    part1 = str(directory / "out" / "day-1.v1.part1.zarr")
    day2 = str(directory / "out" / "day-2.v1.zarr")
    assert report.outputs == (first, part1, day2)
    assert tree_bytes(first) == before  # old rows are never rewritten while the version stands
    assert report.bytes_written == sum(len(b) for p in (part1, day2) for b in tree_bytes(p).values())
    v1 = version_model_path(model, 1)
    # the new rows went through the published map, not the updated statistics' one
    np.testing.assert_allclose(read_all(part1), expected(v1, rows_of(100, 2)), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(read_all(day2), expected(v1, rows_of(60, 3)), rtol=2e-5, atol=2e-6)
    assert read_attrs(part1)["rows"] == [2000, 2100] and read_attrs(day2)["rows"] == [0, 60]
    assert load_model(model).n_rows == 2160 and load_model(v1).n_rows == 2000
    publication = published(model)
    assert [(p.start, p.stop) for p in publication.parts(str(directory / "shards" / "day-1.h5"))] == [
        (0, 2000),
        (2000, 2100),
    ]
    everything = np.concatenate([rows_of(2000, 1), rows_of(100, 2)])
    np.testing.assert_allclose(
        publication.read(str(directory / "shards" / "day-1.h5:/emb")), expected(v1, everything), rtol=2e-5, atol=2e-6
    )
    with pytest.raises(NothingToDoError):
        run_job_file(job)


def test_a_stale_map_is_republished_as_a_new_version_beside_the_current_one(night):
    directory, job = night
    model = str(directory / "models" / "m.npz")
    append_rows(directory / "shards" / "day-2.h5", rows_of(1500, 4, shift=2.0))
    report = run_job_file(job)
    assert report.action == "republish" and report.published_version == 2, report
    assert report.staleness.total > 0.5 and "staleness" in report.reason
    v2 = version_model_path(model, 2)
    assert load_model(v2).n_rows == 3500
    np.testing.assert_allclose(
        read_all(str(directory / "out" / "day-1.v2.zarr")), expected(v2, rows_of(2000, 1)), rtol=2e-5, atol=2e-6
    )
    np.testing.assert_allclose(
        read_all(str(directory / "out" / "day-2.v2.zarr")),
        expected(v2, rows_of(1500, 4, shift=2.0)),
        rtol=2e-5,
        atol=2e-6,
    )
    # version 1 is kept (keep_versions = 2): a reader that resolved it can finish
    assert os.path.exists(directory / "out" / "day-1.v1.zarr") and os.path.exists(version_model_path(model, 1))
    manifest = published(model).manifest
    assert [v.version for v in manifest.kept] == [1] and manifest.retired == ()
    # a third version retires the first: its files are deleted after the switch
    report = run_job_file(job, republish=True)
    assert report.action == "republish" and report.published_version == 3 and report.reason == "republish requested"
    assert not os.path.exists(directory / "out" / "day-1.v1.zarr") and not os.path.exists(version_model_path(model, 1))
    assert os.path.exists(directory / "out" / "day-1.v2.zarr") and os.path.exists(version_model_path(model, 2))
    assert sorted(os.listdir(directory / "out")) == ["day-1.v2.zarr", "day-1.v3.zarr", "day-2.v2.zarr", "day-2.v3.zarr"]
    # the same statistics give the same map: version 3's outputs are version 2's, value for value
    np.testing.assert_array_equal(
        read_all(str(directory / "out" / "day-2.v3.zarr")), read_all(str(directory / "out" / "day-2.v2.zarr"))
    )


def test_a_changed_setting_is_republished_and_keep_versions_1_deletes_the_old_one_at_once(tmp_path):
    job = write_job(tmp_path, publish="keep_versions = 1")
    append_rows(tmp_path / "shards" / "day-1.h5", rows_of(800, 1))
    run_job_file(job)
    edit(job, "n_components = 8", "n_components = 5")
    report = run_job_file(job)
    assert report.action == "republish" and "n_components" in report.reason, report
    assert read_all(str(tmp_path / "out" / "day-1.v2.zarr")).shape == (800, 5)
    assert sorted(os.listdir(tmp_path / "out")) == ["day-1.v2.zarr"]
    assert not os.path.exists(version_model_path(str(tmp_path / "models" / "m.npz"), 1))
    edit(job, "normalize = true", "normalize = false")
    assert run_job_file(job).action == "republish"


def test_run_json_reports_for_cron_and_nothing_to_do_is_exit_3_with_the_report(night):
    directory, job = night
    append_rows(directory / "shards" / "day-1.h5", rows_of(50, 7))
    done = run_command("run", job, "--json", "-q")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for key in (
        "action",
        "published_version",
        "staleness",
        "manifest",
        "outputs",
        "rows_added",
        "bytes_written",
        "seconds",
    ):
        assert key in report
    assert report["action"] == "append" and report["rows_added"] == 50
    assert set(report["staleness"]) >= {"covariance", "shift", "dropped", "angle", "total"}
    again = run_command("run", job, "--json", "-q")
    assert again.returncode == EXIT_NOTHING_TO_DO
    assert json.loads(again.stdout)["action"] == "nothing" and "nothing to do" in again.stderr
    text = run_command("run", job, "--republish", "-q")
    assert text.returncode == 0 and "republish: published version 2" in text.stdout, text.stdout


# --------------------------------------------------------------------------------- what is refused


def test_a_damaged_or_hand_edited_manifest_is_refused_and_nothing_changes(night):
    directory, job = night
    path = manifest_path(str(directory / "models" / "m.npz"))
    good = open(path).read()
    append_rows(directory / "shards" / "day-1.h5", rows_of(50, 7))
    data = json.loads(good)
    cases = {
        "edited": good.replace('"version": 1', '"version": 2'),  # the checksum no longer matches
        "truncated": good[: len(good) // 2],
        "not json": "\x00\x01garbage",
        "empty": "",
    }
    # hand-edited with the checksum recomputed, but no writer makes it: parts with a gap
    from streamwhiten.records import json_checksum

    forged = dict(data)
    forged["inputs"] = [dict(data["inputs"][0], parts=[dict(data["inputs"][0]["parts"][0], start=5)])]
    forged.pop("checksum")
    forged["checksum"] = json_checksum(forged)
    cases["forged"] = json.dumps(forged)
    for name, text in cases.items():
        open(path, "w").write(text)
        snapshot = {p: tree_bytes(str(directory / p)) for p in ("out", "models")}
        result = run_command("run", job)
        assert result.returncode == EXIT_BAD_INPUT, (name, result.stderr)
        line = result.stderr.strip().splitlines()[-1]
        assert f"{path}: not a manifest streamwhiten could have written" in line, (name, line)
        assert {p: tree_bytes(str(directory / p)) for p in ("out", "models")} == snapshot, name
        with pytest.raises(ModelFileError):
            published(str(directory / "models" / "m.npz"))
    open(path, "w").write(good)
    assert run_job_file(job).action == "append"


def test_outputs_or_model_file_deleted_by_hand_are_named_and_republish_recovers(night):
    directory, job = night
    model = str(directory / "models" / "m.npz")
    shutil.rmtree(directory / "out" / "day-1.v1.zarr")
    result = run_command("run", job)
    assert result.returncode == EXIT_BAD_INPUT
    assert "outputs of published version 1 were deleted or changed by hand" in result.stderr
    assert f"{directory / 'out' / 'day-1.v1.zarr'} (missing)" in result.stderr and "--republish" in result.stderr
    with pytest.raises(BadInputError, match="missing"):
        published(model).read(str(directory / "shards" / "day-1.h5"))
    report = run_job_file(job, republish=True)
    assert report.published_version == 2 and os.path.exists(directory / "out" / "day-1.v2.zarr")
    os.remove(version_model_path(model, 2))
    result = run_command("run", job)
    assert (
        result.returncode == EXIT_BAD_INPUT
        and "m.v2.npz: the model file of published version 2 is missing" in result.stderr
    )


class _Clock:
    """``time`` for ``streamwhiten.io.output`` with the clock moved ``offset`` seconds ahead: outputs
    written moments before look settled without waiting."""

    offset = 0.0

    @classmethod
    def time_ns(cls):
        import time

        return time.time_ns() + int(cls.offset * 1e9)


def test_an_outputs_stamp_changes_with_its_records_and_is_withheld_while_fresh(tmp_path, monkeypatch):
    import zarr

    from streamwhiten.io import output as module

    monkeypatch.setattr(module, "time", _Clock)
    monkeypatch.setattr(_Clock, "offset", 0.0)
    h5 = tmp_path / "part.h5"
    with h5py.File(h5, "w") as handle:
        handle.create_dataset("emb", data=np.zeros((4, 2), np.float32)).attrs["model_checksum"] = "a" * 64
    nested = (
        zarr.open_group(str(tmp_path / "part.zarr"), mode="w")
        .create_group("a")
        .create_array("b", shape=(4, 2), dtype="float32")
    )
    nested.attrs["model_checksum"] = "a" * 64
    specs = [f"{h5}:/emb", f"{tmp_path / 'part.zarr'}:/a/b"]
    assert [open_output(spec).stamp() for spec in specs] == [None, None]  # just written
    _Clock.offset = 2 * module.STAMP_SETTLED_S
    before = [open_output(spec).stamp() for spec in specs]
    assert all(before) and before == [open_output(spec).stamp() for spec in specs]
    with h5py.File(h5, "r+") as handle:
        handle["emb"].attrs["model_checksum"] = "b" * 64
    zarr.open_array(str(tmp_path / "part.zarr"), path="a/b", mode="r+").attrs["model_checksum"] = "b" * 64
    _Clock.offset += 2 * module.STAMP_SETTLED_S
    after = [open_output(spec).stamp() for spec in specs]
    assert all(after) and all(a != b for a, b in zip(after, before, strict=True))
    # a record rewritten in place (not by rename), two levels down, shows as well
    metadata = tmp_path / "part.zarr" / "a" / "b" / "zarr.json"
    text = metadata.read_text()
    with open(metadata, "r+") as handle:
        handle.write(text.replace("b" * 64, "c" * 64))
    _Clock.offset += 2 * module.STAMP_SETTLED_S
    assert open_output(specs[1]).stamp() not in (None, after[1])
    assert open_output(str(tmp_path / "absent.h5")).stamp() is None


def test_a_night_opens_only_the_parts_touched_since_and_still_catches_one_changed_by_hand(night, monkeypatch):
    # an appending night must not cost more as parts accumulate: a part whose file-system stamp is the
    # one the manifest recorded is not opened again; one without a settled stamp is checked in full
    import zarr

    from streamwhiten.io import output as output_module
    from streamwhiten.job import ownership as module

    monkeypatch.setattr(output_module, "time", _Clock)
    monkeypatch.setattr(_Clock, "offset", 0.0)
    directory, job = night
    shard = str(directory / "shards" / "day-1.h5")
    for seed in (2, 3):
        append_rows(shard, rows_of(50, seed))
        assert run_job_file(job).action == "append"
    _Clock.offset = 2 * output_module.STAMP_SETTLED_S  # the parts so far have settled
    append_rows(shard, rows_of(50, 4))
    assert run_job_file(job).action == "append"  # checks them in full once and stamps them
    parts = published(str(directory / "models" / "m.npz")).parts(shard)
    assert len(parts) == 4 and all(part.stamp for part in parts[:-1])
    checked = []
    real = module.part_problem
    monkeypatch.setattr(module, "part_problem", lambda part, *a, **k: checked.append(part.path) or real(part, *a, **k))
    append_rows(shard, rows_of(50, 5))
    assert run_job_file(job).action == "append"
    assert set(checked) <= {parts[-1].path}  # only the part written last (if its stamp had not settled)
    # a part edited in place (its record of the map) is caught although it is not the last one
    backup = str(directory / "backup.zarr")
    shutil.copytree(parts[1].path, backup)
    zarr.open(parts[1].path, mode="r+").attrs["model_checksum"] = "0" * 64
    result = run_command("run", job)
    assert result.returncode == EXIT_BAD_INPUT and f"{parts[1].path} (written by another map)" in result.stderr
    # another part copied in its place: a new stamp, so checked in full, and refused
    shutil.rmtree(parts[1].path)
    shutil.copytree(parts[2].path, parts[1].path)
    result = run_command("run", job)
    assert result.returncode == EXIT_BAD_INPUT and "holds rows (2050, 2100), not [2000, 2050)" in result.stderr
    # restored from its copy: checked in full, accepted, and the next manifest records its new stamp
    shutil.rmtree(parts[1].path)
    shutil.copytree(backup, parts[1].path)
    _Clock.offset += 2 * output_module.STAMP_SETTLED_S
    append_rows(shard, rows_of(50, 7))
    assert run_job_file(job).action == "append"
    restored = published(str(directory / "models" / "m.npz")).parts(shard)[1]
    assert restored.stamp == open_output(parts[1].path).stamp() != parts[1].stamp


def test_an_input_rewritten_since_it_was_published_is_refused(night):
    directory, job = night
    with h5py.File(directory / "shards" / "day-1.h5", "a") as handle:
        handle["emb"][0] = 0.0
    result = run_command("run", job)
    assert result.returncode == EXIT_BAD_INPUT and "differ from the recorded ones" in result.stderr


def test_an_appending_night_records_each_inputs_fingerprint_as_taken_afresh(night):
    # the run takes the fingerprint of an input's published rows from the statistics' record of it (the
    # fit step read or checked those rows): it must be the fingerprint an independent look at them gives
    from streamwhiten.io import fingerprint

    directory, job = night
    append_rows(directory / "shards" / "day-1.h5", rows_of(100, 2))
    append_rows(directory / "shards" / "day-2.h5", rows_of(60, 3))
    assert run_job_file(job).action == "append"
    manifest = published(str(directory / "models" / "m.npz")).manifest  # its paths made absolute
    for item in manifest.inputs:
        with open_source(item.spec) as source:
            assert item.source == fingerprint(source, item.stop)
            assert item.source.n_rows == source.n_rows


def test_published_rows_the_statistics_update_did_not_sample_are_still_checked(night):
    # statistics updated outside the job (2,100 rows) while 2,000 are published: the fit step checks the
    # model's fingerprint of 2,100 rows, whose samples miss row 510; the run must still check the published
    # rows' own fingerprint (samples at 500..563) and refuse the rewritten row
    from streamwhiten.options import FitOptions
    from streamwhiten.pipeline import fit

    directory, job = night
    model, shard = str(directory / "models" / "m.npz"), directory / "shards" / "day-1.h5"
    append_rows(shard, rows_of(100, 2))
    fit([str(shard)], model, update=model, options=FitOptions(overwrite=True))
    with h5py.File(shard, "a") as handle:
        handle["emb"][510] = 0.0
    append_rows(shard, rows_of(50, 3))
    with pytest.raises(BadInputError, match="its first 2000 rows differ from the recorded ones"):
        run_job_file(job)


@pytest.mark.parametrize(
    "table, fragment",
    [
        ("[publish]\nmax_staleness = -1\n", "max_staleness in [publish] must be a number, 0 or more, got -1"),
        ("[publish]\nkeep_versions = 0\n", "keep_versions in [publish] must be a whole number of at least 1"),
        ("[publish]\nkeep = 2\n", "unknown key(s) keep in [publish]"),
    ],
)
def test_publish_table_values_are_checked_in_the_words_of_params(tmp_path, table, fragment):
    job = tmp_path / "job.toml"
    job.write_text(f'[input]\npaths = ["x.h5"]\n[model]\npath = "m.npz"\n[apply]\noutput = "o/{{stem}}.zarr"\n{table}')
    result = run_command("run", job)
    assert result.returncode == EXIT_BAD_INPUT and fragment in result.stderr, result.stderr


def test_publish_needs_apply_and_republish_needs_publish(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('[input]\npaths = ["x.h5"]\n[model]\npath = "m.npz"\n[publish]\n')
    result = run_command("run", job)
    assert result.returncode == EXIT_BAD_INPUT and "[publish] publishes the outputs of [apply]" in result.stderr
    append_rows(tmp_path / "x.h5", rows_of(300, 1))
    job.write_text('[input]\npaths = ["x.h5"]\n[model]\npath = "m.npz"\n')
    result = run_command("run", job, "--republish")
    assert result.returncode == EXIT_BAD_INPUT and "--republish needs a [publish] table" in result.stderr


def test_a_job_without_publish_rewrites_every_output_and_reports_what_it_wrote(tmp_path):
    (tmp_path / "shards").mkdir()
    job = tmp_path / "job.toml"
    job.write_text(
        '[input]\npaths = ["shards/day-*.h5"]\n[model]\npath = "m.npz"\nn_components = 8\n'
        '[apply]\noutput = "out/{stem}.zarr"\n'
    )
    append_rows(tmp_path / "shards" / "day-1.h5", rows_of(1000, 1))
    first = run_job_file(str(job))
    assert first.rows_added == 1000 and first.bytes_written > 0 and "action" not in first.to_json()
    append_rows(tmp_path / "shards" / "day-2.h5", rows_of(50, 2))
    second = run_job_file(str(job))
    out = tmp_path / "out"
    assert second.rows_added == 50 and sorted(os.listdir(out)) == ["day-1.zarr", "day-2.zarr"]
    assert second.bytes_written == sum(len(b) for p in os.listdir(out) for b in tree_bytes(str(out / p)).values())


def test_versioned_names_keep_the_dataset_and_the_extension():
    assert versioned_output("/a/out/day-1.zarr", 3) == "/a/out/day-1.v3.zarr"
    assert versioned_output("/a/out/day-1.zarr", 3, 2) == "/a/out/day-1.v3.part2.zarr"
    assert versioned_output("/a/o.h5:/vectors", 1, 1) == "/a/o.v1.part1.h5:/vectors"
    assert versioned_output("s3://b/w/d.parquet:emb", 2) == "s3://b/w/d.v2.parquet:emb"
    assert version_model_path("/m/model.npz", 4) == "/m/model.v4.npz"
    assert manifest_path("/m/model.npz") == "/m/model.manifest.json"


# --------------------------------------------------------------------------------- the commands


def test_staleness_command_prints_each_part_the_total_and_the_verdict(night):
    directory, job = night
    model = str(directory / "models" / "m.npz")
    fresh = run_command("staleness", model, "--json")
    assert fresh.returncode == 0, fresh.stderr
    report = json.loads(fresh.stdout)
    assert report["total"] == 0.0 and report["stale"] is False and report["published_version"] == 1
    assert report["max_staleness"] == 0.5 and report["published"] == version_model_path(model, 1)
    append_rows(directory / "shards" / "day-2.h5", rows_of(1500, 4, shift=2.0))
    shutil.copy(model, directory / "before.npz")
    assert run_command("fit", str(directory / "shards" / "day-2.h5"), "--update", model, "-q").returncode == 0
    text = run_command("staleness", model)
    assert text.returncode == 0, text.stderr
    for word in (
        "covariance",
        "shift",
        "dropped",
        "angle",
        "total",
        "max_staleness 0.5",
        "stale: publish a new version",
    ):
        assert word in text.stdout, text.stdout
    from streamwhiten.core.staleness import staleness

    by_hand = staleness(load_model(version_model_path(model, 1)), load_model(model).state)
    report = json.loads(run_command("staleness", model, "--json", "--max-staleness", "100").stdout)
    assert report["total"] == pytest.approx(by_hand.total, rel=1e-12) and report["stale"] is False
    report = json.loads(run_command("staleness", model, "--published", directory / "before.npz", "--json").stdout)
    assert report["total"] == pytest.approx(by_hand.total, rel=1e-12) and report["published_version"] is None
    nothing = run_command("staleness", directory / "before.npz")
    assert nothing.returncode == EXIT_BAD_INPUT and "--published" in nothing.stderr


def test_info_shows_the_statistics_and_the_publication(night):
    directory, job = night
    model = str(directory / "models" / "m.npz")
    append_rows(directory / "shards" / "day-1.h5", rows_of(40, 9))
    run_job_file(job)
    text = run_command("info", model)
    assert text.returncode == 0 and "fitted on  2,040 rows" in text.stdout
    assert "published  version 1 (m.v1.npz), finalized from 2,000 rows" in text.stdout, text.stdout
    report = json.loads(run_command("info", model, "--json").stdout)
    assert report["n_rows"] == 2040 and report["publication"]["version"] == 1
    assert report["publication"]["n_rows"] == 2000 and report["publication"]["inputs"][0]["rows"] == 2040
    # two checksums, each named: the statistics' map (moved on with the appended rows) and the published
    # map, which is the one the outputs carry (read from the output store itself)
    import zarr

    stamped = zarr.open_array(str(directory / "out" / "day-1.v1.zarr"), mode="r").attrs["model_checksum"]
    statistics = report["model_checksum"]
    assert stamped != statistics
    assert f"checksum   {statistics} (statistics:" in text.stdout, text.stdout
    assert f"checksum   {stamped} (published map, version 1:" in text.stdout, text.stdout


@pytest.mark.parametrize("suffix", ["zarr", "parquet"])
def test_outputs_on_object_storage_are_appended_republished_and_deleted_there(tmp_path, s3_bucket, s3_server, suffix):
    from conftest import s3fs_client

    job = write_job(tmp_path, output=f"{s3_bucket}/out/{{stem}}.{suffix}", publish="keep_versions = 1")
    append_rows(tmp_path / "shards" / "day-1.h5", rows_of(900, 1))
    assert run_job_file(job).action == "fit"
    append_rows(tmp_path / "shards" / "day-1.h5", rows_of(40, 2))
    report = run_job_file(job)
    assert report.action == "append" and report.outputs[-1] == f"{s3_bucket}/out/day-1.v1.part1.{suffix}"
    assert report.bytes_written > 0
    model = str(tmp_path / "models" / "m.npz")
    both = np.concatenate([rows_of(900, 1), rows_of(40, 2)])
    v1 = version_model_path(model, 1)
    got = published(model).read(str(tmp_path / "shards" / "day-1.h5"))
    np.testing.assert_allclose(got, expected(v1, both), rtol=2e-5, atol=2e-6)
    report = run_job_file(job, republish=True)
    assert report.published_version == 2
    fs = s3fs_client(s3_server)
    assert sorted(name.rsplit("/", 1)[1] for name in fs.ls(f"{s3_bucket[5:]}/out")) == [f"day-1.v2.{suffix}"]
    np.testing.assert_allclose(
        read_all(f"{s3_bucket}/out/day-1.v2.{suffix}"),
        expected(version_model_path(model, 2), both),
        rtol=2e-5,
        atol=2e-6,
    )


def test_a_republish_cut_short_then_not_needed_leaves_nothing_behind(tmp_path):
    from streamwhiten.errors import InterruptedRunError

    job = write_job(tmp_path, output="out/{stem}.h5", apply="chunk_rows = 128\nprogress_seconds = 0")
    append_rows(tmp_path / "shards" / "day-1.h5", rows_of(1000, 1))
    append_rows(tmp_path / "shards" / "day-2.h5", rows_of(1000, 2))
    run_job_file(job)
    calls = {"n": 0}

    def stop_soon():  # asked after each block: day-1's part is written, day-2's is cut short
        calls["n"] += 1
        return calls["n"] > 10

    with pytest.raises(InterruptedRunError):
        run_job_file(job, watch=Watch(should_stop=stop_soon), republish=True)
    assert os.path.exists(tmp_path / "out" / "day-1.v2.h5") and os.path.exists(
        tmp_path / "out" / ".day-2.v2.h5.partial"
    )
    assert published(str(tmp_path / "models" / "m.npz")).version == 1  # nothing switched
    append_rows(tmp_path / "shards" / "day-2.h5", rows_of(30, 3))
    assert run_job_file(job).action == "append"
    assert sorted(os.listdir(tmp_path / "out")) == ["day-1.v1.h5", "day-2.v1.h5", "day-2.v1.part1.h5"]
    assert sorted(os.listdir(tmp_path / "models")) == ["m.manifest.json", "m.npz", "m.v1.npz"]


# ------------------------------------------------------------- ownership, binding, claims, portability (#36)


def forge(model, change):
    """Rewrite the manifest beside ``model`` with ``change(data)`` applied to its JSON and its checksum
    recomputed: what anyone can do (the checksum has no key), so it proves integrity, not authorship."""
    from streamwhiten.records import json_checksum

    path = manifest_path(model)
    data = json.loads(open(path).read())
    change(data)
    data.pop("checksum")
    data["checksum"] = json_checksum(data)
    open(path, "w").write(json.dumps(data))


def everything(directory):
    """Every file under ``directory`` but the manifest and the lock: its bytes (what a refused run keeps)."""
    found = tree_bytes(str(directory))
    return {name: data for name, data in found.items() if not name.endswith(("manifest.json", ".lock"))}


def user_files(directory):
    """A user's own files beside a job: a plain apply output (HDF5 and Zarr) and a model file of a fit."""
    import streamwhiten

    (directory / "user").mkdir()
    model = str(directory / "models" / "m.npz")
    shard = str(directory / "shards" / "day-1.h5")
    streamwhiten.apply(model, shard, str(directory / "user" / "precious.h5"))
    streamwhiten.apply(model, shard, str(directory / "user" / "store.zarr"))
    shutil.copy(model, directory / "models" / "mine.npz")
    return ["user/precious.h5", "user/store.zarr", "models/mine.npz", "models/m.npz"]


def last_line(result):
    return result.stderr.strip().splitlines()[-1]


def test_a_forged_retired_list_deletes_nothing_the_job_did_not_write(tmp_path):
    job = write_job(tmp_path, output="out/{stem}.h5", publish="keep_versions = 1")
    append_rows(tmp_path / "shards" / "day-1.h5", rows_of(2000, 1))
    run_job_file(job)
    run_job_file(job, republish=True)  # version 2; version 1 deleted at once (keep_versions = 1)
    model = str(tmp_path / "models" / "m.npz")
    assert sorted(os.listdir(tmp_path / "out")) == ["day-1.v2.h5"]
    for target in [*user_files(tmp_path), "out/day-1.v2.h5"]:  # the last: the current version's own part
        forge(
            model,
            lambda data, target=target: data.update(
                retired=[
                    {"version": 1, "model_file": "m.v1.npz", "outputs": [f"../{target}"], "model_checksum": "0" * 64}
                ]
            ),
        )
        before = everything(tmp_path)
        result = run_command("run", job)
        assert result.returncode == EXIT_BAD_INPUT, (target, result.stderr)
        line = last_line(result)
        assert "retires version 1" in line and target in line and "nothing was deleted" in line, line
        assert everything(tmp_path) == before, target
    # a retired model file must be the version's own name: the statistics or a user's model are refused
    for name in ("m.npz", "mine.npz"):
        forge(model, lambda data, name=name: data.update(retired=[dict(data["retired"][0], model_file=name)]))
        result = run_command("run", job)
        assert result.returncode == EXIT_BAD_INPUT and "not a manifest streamwhiten could have written" in result.stderr
        assert os.path.exists(tmp_path / "models" / name)


def test_a_forged_kept_list_is_refused_when_its_version_retires(night):
    directory, job = night
    model = str(directory / "models" / "m.npz")
    run_job_file(job, republish=True)  # version 2 keeps version 1 (keep_versions = 2)
    targets = user_files(directory)
    forge(model, lambda data: data["kept"][0].update(outputs=[f"../{item}" for item in targets[:2]]))
    before = everything(directory)
    result = run_command("run", job, "--republish")  # version 3 would retire version 1
    assert result.returncode == EXIT_BAD_INPUT and "retires version 1" in last_line(result), result.stderr
    assert everything(directory) == before and published(model).version == 2


def test_files_at_version_paths_the_job_never_wrote_are_neither_deleted_nor_replaced(night):
    import streamwhiten

    directory, job = night
    model = str(directory / "models" / "m.npz")
    shard = str(directory / "shards" / "day-1.h5")
    streamwhiten.apply(model, shard, str(directory / "out" / "day-1.v2.zarr"))  # a user's, at version 2's path
    shutil.copy(model, version_model_path(model, 2))  # a user's model file, at version 2's
    append_rows(directory / "shards" / "day-1.h5", rows_of(50, 9))
    before = everything(directory)
    for args in ((), ("--republish",)):  # an append night would clean up an abandoned version 2
        result = run_command("run", job, *args)
        assert result.returncode == EXIT_BAD_INPUT, result.stderr
        assert "replaces only its own files" in last_line(result) and "v2." in last_line(result)
        assert everything(directory) == before
    os.remove(version_model_path(model, 2))
    shutil.rmtree(directory / "out" / "day-1.v2.zarr")
    assert run_job_file(job).action == "append"


def test_a_second_job_with_the_same_output_template_is_refused(tmp_path):
    first = write_job(tmp_path, output="out/{stem}.h5")
    append_rows(tmp_path / "shards" / "day-1.h5", rows_of(2000, 1))
    run_job_file(first)
    second = tmp_path / "second.toml"
    second.write_text(open(first).read().replace("models/m.npz", "models/other.npz").replace("= 8", "= 6"))
    before = everything(tmp_path / "out")
    result = run_command("run", second)
    assert result.returncode == EXIT_BAD_INPUT and len(result.stderr.strip().splitlines()) <= 2, result.stderr
    assert "written by another job" in last_line(result) and "day-1.v1.h5" in last_line(result)
    assert everything(tmp_path / "out") == before
    publication = published(str(tmp_path / "models" / "m.npz"))
    np.testing.assert_allclose(
        publication.read(str(tmp_path / "shards" / "day-1.h5")),
        expected(publication.model_file, rows_of(2000, 1)),
        rtol=2e-5,
        atol=2e-6,
    )


@pytest.mark.parametrize("how", ["copy", "symlink"])
def test_a_part_swapped_for_another_inputs_part_is_refused_naming_it(tmp_path, how):
    job = write_job(tmp_path, output="out/{stem}.h5")
    append_rows(tmp_path / "shards" / "day-1.h5", rows_of(2000, 1))
    append_rows(tmp_path / "shards" / "day-2.h5", rows_of(2000, 2))  # the same rows count: only the input differs
    run_job_file(job)
    model = str(tmp_path / "models" / "m.npz")
    part, other = tmp_path / "out" / "day-1.v1.h5", tmp_path / "out" / "day-2.v1.h5"
    os.remove(part)
    if how == "copy":
        shutil.copy(other, part)
    else:
        os.symlink(other, part)
    result = run_command("run", job)  # a quiet night: still checked, not "up to date"
    assert result.returncode == EXIT_BAD_INPUT, result.stderr
    assert f"{part} (holds the rows of another input" in last_line(result)
    with pytest.raises(BadInputError, match=f"{part}: .*another input"):
        published(model).read(str(tmp_path / "shards" / "day-1.h5"))
    # the untouched input still reads, and is its own rows
    got = published(model).read(str(tmp_path / "shards" / "day-2.h5"))
    np.testing.assert_allclose(got, expected(version_model_path(model, 1), rows_of(2000, 2)), rtol=2e-5, atol=2e-6)


def test_forged_version_claims_are_refused_on_a_quiet_night(night):
    directory, job = night
    model = str(directory / "models" / "m.npz")
    path = manifest_path(model)
    good = open(path).read()
    v1 = version_model_path(model, 1)
    shutil.copy(v1, version_model_path(model, 5))  # version 1's file at version 5's name: it records version 1
    cases = {
        "version 5, no such model file": lambda data: data.update(version=5, model_file="m.v5.npz"),
        "version 5, version 1's model file": lambda data: data.update(version=5),
        "version 10**30": lambda data: data.update(version=10**30),
        "the statistics as the model": lambda data: data.update(model_file="m.npz"),
        "version 6 whose file is version 1's copy": lambda data: data.update(version=6, model_file="m.v6.npz"),
    }
    shutil.copy(v1, version_model_path(model, 6))
    for name, change in cases.items():
        open(path, "w").write(good)
        if "statistics" in name:
            from streamwhiten.core.model import file_checksum

            forge(model, lambda data: data.update(file_checksum=file_checksum(load_model(model))))
        forge(model, change)
        result = run_command("run", job)  # nothing new: it must not say "nothing to do"
        assert result.returncode == EXIT_BAD_INPUT, (name, result.returncode, result.stderr)
        assert result.returncode != EXIT_NOTHING_TO_DO
        with pytest.raises((ModelFileError, BadInputError)):
            published(model).load_model()
        staleness = run_command("staleness", model)
        assert staleness.returncode == EXIT_BAD_INPUT, (name, staleness.stderr)
    # versions that are not consecutive
    open(path, "w").write(good)
    run_job_file(job, republish=True)
    forge(model, lambda data: data["kept"][0].update(version=1) or data.update(version=3, model_file="m.v3.npz"))
    result = run_command("run", job)
    assert result.returncode == EXIT_BAD_INPUT and "kept versions" in last_line(result), result.stderr


def test_a_moved_or_copied_job_folder_reads_its_own_parts(tmp_path):
    base = tmp_path / "a"
    base.mkdir()
    job = write_job(base, output="out/{stem}.h5")
    append_rows(base / "shards" / "day-1.h5", rows_of(2000, 1))
    run_job_file(job)
    append_rows(base / "shards" / "day-1.h5", rows_of(100, 2))
    assert run_job_file(job).action == "append"
    want = published(str(base / "models" / "m.npz")).read(str(base / "shards" / "day-1.h5"))
    # the manifest holds paths relative to itself
    text = open(manifest_path(str(base / "models" / "m.npz"))).read()
    assert str(tmp_path) not in text
    # moved (or mounted elsewhere): the same rows, from the new place
    moved = tmp_path / "b"
    shutil.move(str(base), str(moved))
    publication = published(str(moved / "models" / "m.npz"))
    assert publication.model_file == version_model_path(str(moved / "models" / "m.npz"), 1)
    assert all(path.startswith(str(moved)) for path in publication.outputs)
    np.testing.assert_array_equal(publication.read(str(moved / "shards" / "day-1.h5")), want)
    # a night of the moved job: nothing new, then new rows appended, then a republish
    result = run_command("run", moved / "job.toml")
    assert result.returncode == EXIT_NOTHING_TO_DO, result.stderr
    append_rows(moved / "shards" / "day-1.h5", rows_of(50, 3))
    report = run_job_file(str(moved / "job.toml"))
    assert report.action == "append" and report.rows_added == 50, report
    assert report.outputs[-1] == str(moved / "out" / "day-1.v1.part2.h5")
    rows = np.concatenate([rows_of(2000, 1), rows_of(100, 2), rows_of(50, 3)])
    got = published(str(moved / "models" / "m.npz")).read(str(moved / "shards" / "day-1.h5"))
    np.testing.assert_allclose(got, expected(publication.model_file, rows), rtol=2e-5, atol=2e-6)
    report = run_job_file(str(moved / "job.toml"), republish=True)
    assert report.published_version == 2 and report.rows_added == 0
    assert load_model(str(moved / "models" / "m.npz")).sources[0].path == str(moved / "shards" / "day-1.h5")
    # copied: the copy names its own inputs and parts, never the original's
    copy = tmp_path / "c"
    shutil.copytree(moved, copy)
    copied = published(str(copy / "models" / "m.npz"))
    assert copied.inputs == (str(copy / "shards" / "day-1.h5"),)
    assert all(path.startswith(str(copy)) for path in (*copied.outputs, copied.model_file))
    np.testing.assert_allclose(
        copied.read(str(copy / "shards" / "day-1.h5")),
        expected(copied.model_file, rows),
        rtol=2e-5,
        atol=2e-6,
    )
    with pytest.raises(BadInputError, match="not an input of published version 2"):
        copied.read(str(moved / "shards" / "day-1.h5"))


@pytest.mark.parametrize("dtype", ["int8", "binary", "eigen:4"])
def test_a_publication_of_codes_reads_back_decoded_and_as_codes(tmp_path, dtype):
    from streamwhiten import serving

    job = write_job(tmp_path, output="out/{stem}.h5", apply=f'dtype = "{dtype}"')
    append_rows(tmp_path / "shards" / "day-1.h5", rows_of(2000, 1))
    run_job_file(job)
    append_rows(tmp_path / "shards" / "day-1.h5", rows_of(100, 2))
    assert run_job_file(job).action == "append"
    model = str(tmp_path / "models" / "m.npz")
    shard = str(tmp_path / "shards" / "day-1.h5")
    publication = published(model)
    codes, quantization = publication.read_codes(shard)
    assert codes.dtype == (np.int8 if dtype == "int8" else np.uint8) and len(codes) == 2100
    raw = np.concatenate([read_all_codes(path) for path in publication.outputs])
    np.testing.assert_array_equal(codes, raw)
    decoded = publication.read(shard)
    assert decoded.dtype == np.float32 and decoded.shape == (2100, 8)
    # the decoder read_codes gives (a Quantization, or the published codec's resolved encoder) decodes them
    # as read() does, alone and through serving.decode
    np.testing.assert_array_equal(quantization.decode(codes), decoded)
    np.testing.assert_array_equal(serving.decode(codes, quantization), decoded)
    # every part decodes from itself: its attributes carry its record (a vector code's: the codec's bytes)
    on_their_own = [serving.decode(read_all_codes(path), read_attrs(path)) for path in publication.outputs]
    np.testing.assert_array_equal(np.concatenate(on_their_own), decoded)
    want = expected(publication.model_file, np.concatenate([rows_of(2000, 1), rows_of(100, 2)]))
    if dtype == "binary":
        np.testing.assert_array_equal(decoded, np.where(want > 0, 1.0, -1.0))
    elif dtype == "eigen:4":  # the published model's codec: its codes of the exact unit vectors, decoded
        codec = serving.codec(publication.model_file)
        unit = want / np.linalg.norm(want, axis=1, keepdims=True)
        assert np.mean(np.all(raw == codec.encode(unit.astype(np.float32)), axis=1)) > 0.99
        np.testing.assert_allclose(decoded, codec.decode(raw), rtol=1e-6)
        assert publication.load_model().storage.codec.label == codec.label == "eigen-4B"
    else:  # int8: within half a quantization step of the exact value (or clipped at the range's end)
        step = np.asarray(quantization.scale)
        assert np.mean(np.abs(decoded - want) <= step / 2 + 1e-6) > 0.99


def test_a_part_coded_by_another_codec_than_the_published_model_records_is_refused(tmp_path):
    from streamwhiten.codes import codec_record_data
    from streamwhiten.codes.storage import train_for
    from streamwhiten.output_plan import storage_record

    job = write_job(tmp_path, output="out/{stem}.h5", apply='dtype = "eigen:4"')
    append_rows(tmp_path / "shards" / "day-1.h5", rows_of(1500, 1))
    run_job_file(job)
    publication = published(str(tmp_path / "models" / "m.npz"))
    shard, (part,) = str(tmp_path / "shards" / "day-1.h5"), publication.outputs
    assert publication.read(shard).shape == (1500, 8)
    # the part's record names another codec, of the same kind and size, with its own (genuine) bytes
    other = train_for(load_model(publication.model_file).with_params(beta=0.5), "eigen", 4)
    record = storage_record(read_attrs(part))
    record["codec"].update(codec_record_data(other.to_bytes()))
    with h5py.File(part.partition(":")[0], "a") as handle:
        (name,) = list(handle)
        handle[name].attrs["quantization"] = json.dumps(record)
    for read in (publication.read, publication.read_codes):
        with pytest.raises(BadInputError, match="coded by another codec than the published model records"):
            read(shard)


def test_a_publication_of_floats_is_read_as_floats_and_has_no_codes(night):
    directory, _ = night
    publication = published(str(directory / "models" / "m.npz"))
    with pytest.raises(BadInputError, match="float rows, not codes"):
        publication.read_codes(str(directory / "shards" / "day-1.h5"))


def read_all_codes(spec):
    with open_source(spec, codes=True) as source:
        return source.read(0, source.n_rows)


def test_a_manifest_of_the_earlier_format_is_read_and_the_next_night_publishes_in_the_new_one(night):
    from dataclasses import replace

    from streamwhiten.job.manifest import read_manifest, write_manifest

    directory, job = night
    model = str(directory / "models" / "m.npz")
    shard = str(directory / "shards" / "day-1.h5")
    write_manifest(model, replace(read_manifest(model), job_id=None))  # format 1: absolute paths, no job
    data = json.loads(open(manifest_path(model)).read())
    assert data["format_version"] == 1 and "job_id" not in data
    assert data["inputs"][0]["parts"][0]["path"] == str(directory / "out" / "day-1.v1.zarr")
    np.testing.assert_allclose(
        published(model).read(shard), expected(version_model_path(model, 1), rows_of(2000, 1)), rtol=2e-5, atol=2e-6
    )
    report = run_job_file(job)  # no new rows: still a new version, whose files record the job
    assert report.action == "republish" and "earlier release" in report.reason, report
    data = json.loads(open(manifest_path(model)).read())
    assert data["format_version"] == 2 and data["kept"] == [] and data["inputs"][0]["parts"][0]["path"].startswith("..")
    assert os.path.exists(directory / "out" / "day-1.v1.zarr")  # the old files prove no job: left for the user
    np.testing.assert_allclose(
        published(model).read(shard), expected(version_model_path(model, 2), rows_of(2000, 1)), rtol=2e-5, atol=2e-6
    )


def test_a_first_night_cut_short_finds_its_own_parts_when_run_again(tmp_path):
    from streamwhiten.errors import InterruptedRunError

    job = write_job(tmp_path, output="out/{stem}.h5", apply="chunk_rows = 128\nprogress_seconds = 0")
    append_rows(tmp_path / "shards" / "day-1.h5", rows_of(1000, 1))
    append_rows(tmp_path / "shards" / "day-2.h5", rows_of(1000, 2))
    calls = {"n": 0}

    def stop_soon():  # day-1's part is written, day-2's is cut short: no manifest yet, so no job identity
        calls["n"] += 1
        return calls["n"] > 12

    with pytest.raises(InterruptedRunError):
        run_job_file(job, watch=Watch(should_stop=stop_soon))
    assert os.path.exists(tmp_path / "out" / "day-1.v1.h5") and not os.path.exists(
        manifest_path(str(tmp_path / "models" / "m.npz"))
    )
    written = tree_bytes(str(tmp_path / "out" / "day-1.v1.h5"))
    report = run_job_file(job)
    assert report.action == "fit" and report.published_version == 1
    assert tree_bytes(str(tmp_path / "out" / "day-1.v1.h5")) == written  # its own part, kept as it was


def test_an_output_of_this_job_and_version_but_another_map_is_not_ours_to_delete(tmp_path):
    """output_owner_problem checks the map from the attributes it read for ownership (one open): a part that
    records this job and version but another map's checksum is refused, naming the version."""
    from streamwhiten import Whitener, apply
    from streamwhiten.job.ownership import PUBLICATION_ATTR, output_owner_problem

    rows = np.random.default_rng(0).standard_normal((200, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", rows)
    Whitener().fit(rows).save(str(tmp_path / "m.npz"))
    record = json.dumps({"job": "j1", "version": 2})
    apply(str(tmp_path / "m.npz"), str(tmp_path / "x.npy"), str(tmp_path / "out.h5"), attrs={PUBLICATION_ATTR: record})
    written = read_attrs(str(tmp_path / "out.h5"))["model_checksum"]
    spec = str(tmp_path / "out.h5")
    assert output_owner_problem(spec, None, "j1", 2) is None
    assert output_owner_problem(spec, None, "j1", 2, model_checksum=written) is None
    assert (
        output_owner_problem(spec, None, "j1", 2, model_checksum="0" * 64) == "written by another map than version 2's"
    )
    assert output_owner_problem(spec, None, "j2", 2, model_checksum=written).startswith("written by another job")


def test_reading_a_publication_opens_each_part_once(night, monkeypatch):
    """``read`` checks a part from the attributes of the source that reads its rows: one open per part (a
    round trip fewer per part on object storage), and the rows are those of the parts in order."""
    import streamwhiten.io as io_module

    directory, job = night
    shard = str(directory / "shards" / "day-1.h5")
    append_rows(shard, rows_of(50, 2))
    assert run_job_file(job).action == "append"
    publication = published(str(directory / "models" / "m.npz"))
    parts = publication.parts(shard)
    assert len(parts) == 2
    opened = []
    for name in ("open_source", "open_output"):
        real = getattr(io_module, name)
        monkeypatch.setattr(
            io_module, name, lambda spec, *a, real=real, **k: opened.append(str(spec)) or real(spec, *a, **k)
        )
    got = publication.read(shard)
    assert sorted(opened) == sorted(part.path for part in parts)
    wanted = np.concatenate([open_source(part.path).read(0, part.n_rows) for part in parts])
    np.testing.assert_array_equal(got, wanted)
