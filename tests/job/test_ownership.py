"""What a published job may delete (issue #45): its identity is its folder, not a value copied with it.

Each test is one rule of docs/nightly.md ("What a run may delete"), tried the way a user meets it: a copied
job folder, a manifest that takes another job's identity, an output template that names a dataset or a
column, a folder moved with its ``out/`` a link to another disk. Every check is on the files themselves
(their bytes, what is left on disk) and on the rows read back against the published map in numpy."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from conftest import append_rows

from streamwhiten.core.model import load_model
from streamwhiten.errors import EXIT_BAD_INPUT, BadInputError
from streamwhiten.job import published, run_job_file
from streamwhiten.job.manifest import manifest_path, version_model_path
from streamwhiten.progress import Watch

D = 12
MIXING = np.random.default_rng(0).standard_normal((D, D)) * (1.0 / (1.0 + np.arange(D)))[:, None]


def rows_of(n, seed):
    return (3.0 + np.random.default_rng(seed).standard_normal((n, D)) @ MIXING).astype(np.float32)


def write_job(folder, inputs="shards/day-*.h5", output="out/{stem}.h5", model="n_components = 6", publish=""):
    os.makedirs(folder, exist_ok=True)
    job = os.path.join(folder, "job.toml")
    with open(job, "w") as handle:
        handle.write(
            f'name = "own"\n[input]\npaths = ["{inputs}"]\n[model]\npath = "models/m.npz"\n{model}\n'
            f'[apply]\noutput = "{output}"\n[publish]\n{publish}\n'
        )
    return job


def expected(model_file, data):
    """The transform of ``data`` by the published model file's map, in float64 numpy."""
    model = load_model(model_file)
    k = model.n_components
    weights = model.eigvecs[:, :k] * (model.eigvals[:k] + model.eps_value) ** (-model.gamma / 2)
    return (data.astype(np.float64) - model.beta * model.mean) @ weights


def tree_bytes(path):
    """Every file under ``path`` by relative name: its bytes (the lock file left out)."""
    found = {}
    for directory, _, files in os.walk(path):
        for name in files:
            if not name.endswith(".lock"):
                full = os.path.join(directory, name)
                found[os.path.relpath(full, path)] = open(full, "rb").read()
    return found


def check_rows(model, shard, rows):
    """The publication of ``model`` reads ``shard`` back as ``rows`` transformed by its published map."""
    publication = published(model)
    got = publication.read(shard)
    np.testing.assert_allclose(got, expected(publication.model_file, rows), rtol=2e-5, atol=2e-5)


def last_line(text):
    return text.strip().splitlines()[-1]


# ------------------------------------------------------------------------- a copy is not the job it copies


def test_a_copied_job_sharing_inputs_and_outputs_never_deletes_the_originals_parts(tmp_path, run_cli):
    """Finding 1: a copy of a job whose inputs and outputs sit outside its folder keeps the original's
    manifest; run twice with --republish it used to retire and delete the original's current parts."""
    shard = str(tmp_path / "shards" / "day-1.h5")
    append_rows(shard, rows_of(1500, 1))
    original = write_job(tmp_path / "a", inputs="../shards/*.h5", output="../out/{stem}.h5")
    run_job_file(original)
    model_a = str(tmp_path / "a" / "models" / "m.npz")
    copy = tmp_path / "c"
    shutil.copytree(tmp_path / "a", copy)
    job_c = str(copy / "job.toml")
    with open(job_c) as handle:
        text = handle.read()
    with open(job_c, "w") as handle:
        handle.write(text.replace("n_components = 6", "n_components = 5"))
    before = tree_bytes(tmp_path / "out")
    for _ in range(2):  # refused, before anything is written: the copy is not the job that published
        code, _, err = run_cli("run", job_c, "--republish")
        assert code == EXIT_BAD_INPUT, err
        line = last_line(err)
        assert (
            "published by another folder" in line
            and "--new-job" in line
            and manifest_path(str(copy / "models" / "m.npz")) in line
        )
        assert tree_bytes(tmp_path / "out") == before
    check_rows(model_a, shard, rows_of(1500, 1))
    # the original goes on as before: its next night appends
    append_rows(shard, rows_of(60, 2))
    report = run_job_file(original)
    assert report.action == "append", report.reason
    check_rows(model_a, shard, np.concatenate([rows_of(1500, 1), rows_of(60, 2)]))


def test_a_copy_told_it_is_a_new_job_publishes_its_own_and_deletes_only_its_own(tmp_path, run_cli):
    """A copy (or a folder moved to another file system) run with new_job=True takes the identity of its
    own folder: it publishes a version of its own and never deletes a file of the job it came from, even
    when its versions retire."""
    shard = str(tmp_path / "shards" / "day-1.h5")
    append_rows(shard, rows_of(1500, 1))
    original = write_job(tmp_path / "a", inputs="../shards/*.h5", output="../out/{stem}.h5")
    run_job_file(original)
    copy = tmp_path / "c"
    shutil.copytree(tmp_path / "a", copy)
    job_c = str(copy / "job.toml")
    with open(job_c) as handle:  # its own outputs: the original's stay the original's
        text = handle.read()
    with open(job_c, "w") as handle:
        handle.write(text.replace("../out/", "../out-c/").replace("n_components = 6", "n_components = 5"))
    model_a, model_c = (str(tmp_path / name / "models" / "m.npz") for name in ("a", "c"))
    originals = tree_bytes(tmp_path / "out")
    report = run_job_file(job_c, new_job=True)
    assert report.action == "republish" and report.published_version == 2 and "new job" in report.reason
    for _ in range(3):  # versions 3, 4, 5: each retires one of the copy's own, never the original's
        run_job_file(job_c, republish=True)
    assert sorted(os.listdir(tmp_path / "out-c")) == ["day-1.v4.h5", "day-1.v5.h5"]
    assert tree_bytes(tmp_path / "out") == originals  # the original's version 1, untouched
    assert os.path.exists(version_model_path(model_c, 1))  # the copy of the original's model file: left alone
    check_rows(model_c, shard, rows_of(1500, 1))
    check_rows(model_a, shard, rows_of(1500, 1))
    assert published(model_c).manifest.job_id != published(model_a).manifest.job_id
    # the copy is now a job of its own: it is not refused, and new_job=True is not taken again
    code, _, err = run_cli("run", job_c)
    assert code == 3, err
    with pytest.raises(BadInputError, match="already the job"):
        run_job_file(job_c, new_job=True)


# ------------------------------------------------------------------- a manifest cannot take another identity


def retag(model_file, job_id):
    """Rewrite the published model file's record of its job, checksums recomputed (as anyone can)."""
    from streamwhiten.core.model import save_model
    from streamwhiten.job.ownership import PUBLICATION_INFO

    model = load_model(model_file)
    info = dict(model.info)
    info[PUBLICATION_INFO] = dict(info[PUBLICATION_INFO], job=job_id)
    from dataclasses import replace

    save_model(replace(model, info=info), model_file)


def forge(model, change):
    """Rewrite the manifest beside ``model`` with ``change(data)`` applied, its checksum recomputed."""
    from streamwhiten.records import json_checksum

    path = manifest_path(model)
    data = json.loads(open(path).read())
    change(data)
    data.pop("checksum")
    data["checksum"] = json_checksum(data)
    open(path, "w").write(json.dumps(data))


def test_a_manifest_that_takes_another_jobs_identity_deletes_nothing_of_it(tmp_path, run_cli):
    """Finding 2: job A's manifest forged to take job B's job_id (A's model file re-tagged, checksums
    recomputed) and to retire B's current parts used to make A's run delete them."""
    from streamwhiten.core.model import file_checksum

    shard_b = str(tmp_path / "b" / "shards" / "day-1.h5")
    append_rows(shard_b, rows_of(1500, 1))
    append_rows(str(tmp_path / "a" / "shards" / "day-1.h5"), rows_of(1500, 3))
    job_a, job_b = write_job(tmp_path / "a", publish="keep_versions = 1"), write_job(tmp_path / "b")
    run_job_file(job_a)
    run_job_file(job_a, republish=True)  # A is at version 2; its version 1 is gone
    run_job_file(job_b)
    model_a, model_b = (str(tmp_path / name / "models" / "m.npz") for name in ("a", "b"))
    b = published(model_b).manifest
    retag(version_model_path(model_a, 2), b.job_id)

    def take_b(data):  # B's identity, and B's current version 1 as A's retired version 1
        data.update(job_id=b.job_id, file_checksum=file_checksum(load_model(version_model_path(model_a, 2))))
        outputs = [os.path.relpath(path, os.path.dirname(model_a)) for path in b.outputs]
        data["retired"] = [
            {"version": 1, "model_file": "m.v1.npz", "outputs": outputs, "model_checksum": b.model_checksum}
        ]

    forge(model_a, take_b)
    before = tree_bytes(tmp_path / "b")
    for args in ((), ("--republish",)):
        code, _, err = run_cli("run", job_a, *args)
        assert code == EXIT_BAD_INPUT, err
        assert "published by another folder" in last_line(err), err
        assert tree_bytes(tmp_path / "b") == before
    check_rows(model_b, shard_b, rows_of(1500, 1))
    append_rows(shard_b, rows_of(40, 2))
    assert run_job_file(job_b).action == "append"


# ------------------------------------------------------------- retiring removes what a version published


@pytest.mark.parametrize("output", ["out/{stem}.h5:/vectors", "out/{stem}.parquet:vec", "out/{stem}.zarr"])
def test_a_retired_version_leaves_the_disk_whatever_the_output_templates_form(tmp_path, output):
    """Finding 3: with a dataset or column in the output template, a republish beyond keep_versions
    deleted the old model file and logged "deleted version N", but left every output part."""
    shard = str(tmp_path / "shards" / "day-1.h5")
    append_rows(shard, rows_of(1500, 1))
    job = write_job(tmp_path, output=output, publish="keep_versions = 1")
    run_job_file(job)
    append_rows(shard, rows_of(50, 2))
    assert run_job_file(job).action == "append"  # version 1 has two parts
    run_job_file(job, republish=True)
    extension = output.split(":")[0].rsplit(".", 1)[1]
    assert sorted(os.listdir(tmp_path / "out")) == [f"day-1.v2.{extension}"]
    assert sorted(os.listdir(tmp_path / "models")) == ["m.manifest.json", "m.npz", "m.v2.npz"]
    run_job_file(job, republish=True)
    assert sorted(os.listdir(tmp_path / "out")) == [f"day-1.v3.{extension}"]
    check_rows(str(tmp_path / "models" / "m.npz"), shard, np.concatenate([rows_of(1500, 1), rows_of(50, 2)]))


# --------------------------------------------------------------------------- a moved folder keeps working


def test_a_moved_job_whose_out_is_a_link_to_another_disk_keeps_working(tmp_path, run_cli):
    """Finding 4: a job folder moved (renamed) with ``out/`` a symbolic link to a folder elsewhere was
    refused on its next night as "swapped, copied or linked", and so was published().read."""
    disk = tmp_path / "disk2" / "out"
    disk.mkdir(parents=True)
    folder = tmp_path / "jobs" / "a"
    job = write_job(folder)
    os.symlink(disk, folder / "out")
    append_rows(str(folder / "shards" / "day-1.h5"), rows_of(1500, 1))
    run_job_file(job)
    moved = tmp_path / "elsewhere" / "b"
    moved.parent.mkdir()
    os.rename(folder, moved)
    model, shard = str(moved / "models" / "m.npz"), str(moved / "shards" / "day-1.h5")
    check_rows(model, shard, rows_of(1500, 1))
    code, _, err = run_cli("run", moved / "job.toml")
    assert code == 3, err  # nothing new: not refused
    os.symlink(moved, tmp_path / "mounted")  # the same folder reached by another path
    code, _, err = run_cli("run", tmp_path / "mounted" / "job.toml")
    assert code == 3, err
    append_rows(shard, rows_of(70, 2))
    assert run_job_file(str(moved / "job.toml")).action == "append"
    rows = np.concatenate([rows_of(1500, 1), rows_of(70, 2)])
    check_rows(model, shard, rows)
    report = run_job_file(str(moved / "job.toml"), republish=True)
    assert report.published_version == 2
    check_rows(model, shard, rows)
    assert sorted(os.listdir(disk)) == ["day-1.v1.h5", "day-1.v1.part1.h5", "day-1.v2.h5"]


def test_a_folder_copied_with_its_inputs_becomes_a_job_of_its_own(tmp_path, run_cli):
    """A copy whose inputs and outputs are inside it: refused, then with --new-job its statistics follow
    its own copies of the inputs (the originals are still there), it publishes version 2 in its own
    folder, and the copied version 1 is left for the user (a warning names it), never deleted."""
    job_a = write_job(tmp_path / "a")
    append_rows(str(tmp_path / "a" / "shards" / "day-1.h5"), rows_of(1500, 1))
    run_job_file(job_a)
    copy = tmp_path / "c"
    shutil.copytree(tmp_path / "a", copy)
    model_c, shard_c = str(copy / "models" / "m.npz"), str(copy / "shards" / "day-1.h5")
    code, _, err = run_cli("run", copy / "job.toml")
    assert code == EXIT_BAD_INPUT and "published by another folder" in last_line(err), err
    code, _, err = run_cli("run", copy / "job.toml", "--new-job")
    assert code == 0, err
    assert "never deleted by this one" in err and str(copy / "out" / "day-1.v1.h5") in err  # the CLI's warning
    assert "same files" not in err  # its outputs are its own
    assert sorted(os.listdir(copy / "out")) == ["day-1.v1.h5", "day-1.v2.h5"]
    assert load_model(model_c).sources[0].path == shard_c
    append_rows(shard_c, rows_of(50, 2))
    report = run_job_file(str(copy / "job.toml"))
    assert report.action == "append" and report.rows_added == 50
    check_rows(model_c, shard_c, np.concatenate([rows_of(1500, 1), rows_of(50, 2)]))
    for _ in range(2):  # its own versions retire; the copied version 1 stays
        run_job_file(str(copy / "job.toml"), republish=True)
    assert sorted(os.listdir(copy / "out")) == ["day-1.v1.h5", "day-1.v3.h5", "day-1.v4.h5"]
    check_rows(str(tmp_path / "a" / "models" / "m.npz"), str(tmp_path / "a" / "shards" / "day-1.h5"), rows_of(1500, 1))


def test_a_new_job_that_keeps_the_originals_outside_outputs_is_warned_and_never_takes_its_files(tmp_path, run_cli):
    """A copy made a new job with the original's template outside its folder writes where the original
    writes: it is warned; the version numbers it takes are its own, and the original, reaching one, is
    refused naming the file, with nothing deleted."""
    shard = str(tmp_path / "shards" / "day-1.h5")
    append_rows(shard, rows_of(1500, 1))
    original = write_job(tmp_path / "a", inputs="../shards/*.h5", output="../out/{stem}.h5")
    run_job_file(original)
    shutil.copytree(tmp_path / "a", tmp_path / "c")
    code, _, err = run_cli("run", tmp_path / "c" / "job.toml", "--new-job")
    assert code == 0 and "same files" in err, err
    before = tree_bytes(tmp_path / "out")
    code, _, err = run_cli("run", original, "--republish")  # its version 2 is the copy's file
    assert code == EXIT_BAD_INPUT and "written by another job" in last_line(err) and "day-1.v2.h5" in last_line(err)
    assert tree_bytes(tmp_path / "out") == before
    check_rows(str(tmp_path / "a" / "models" / "m.npz"), shard, rows_of(1500, 1))
    check_rows(str(tmp_path / "c" / "models" / "m.npz"), shard, rows_of(1500, 1))


def test_an_identity_is_checked_against_the_folder_not_taken_from_the_manifest(tmp_path):
    """job_id_problem: a folder's identity survives a rename and a path through a link, not a copy; the
    identity of the previous release (a digest of the manifest's real path) holds where the manifest is."""
    import hashlib

    from streamwhiten.job.ownership import first_job_id, job_id_problem

    (tmp_path / "a" / "models").mkdir(parents=True)
    model = str(tmp_path / "a" / "models" / "m.npz")
    job_id = first_job_id(model)
    assert job_id_problem(model, job_id) is None
    assert first_job_id(str(tmp_path / "a" / "models" / "other.npz")) != job_id  # another model file, another job
    old = hashlib.sha256(f"streamwhiten-job:{os.path.realpath(manifest_path(model))}".encode()).hexdigest()[:32]
    assert job_id_problem(model, old) is None
    os.symlink(tmp_path / "a", tmp_path / "link")
    assert job_id_problem(str(tmp_path / "link" / "models" / "m.npz"), job_id) is None
    shutil.copytree(tmp_path / "a" / "models", tmp_path / "copy" / "models")
    copied = str(tmp_path / "copy" / "models" / "m.npz")
    assert "published by another folder" in job_id_problem(copied, job_id)
    os.rename(tmp_path / "a", tmp_path / "b")
    moved = str(tmp_path / "b" / "models" / "m.npz")
    assert job_id_problem(moved, job_id) is None
    assert job_id_problem(moved, old) is not None  # bound to the path it was drawn at
    salt, _, digest = job_id.partition("-")
    assert job_id_problem(moved, f"{'0' * 16}-{digest}") is not None  # the salt is part of what is checked
    # restored from a backup where it was first published: a new folder, at the job's own place
    shutil.copytree(tmp_path / "b", tmp_path / "a")
    assert job_id_problem(model, job_id) is None
    assert job_id_problem(model, f"{salt}-{'0' * 32}") is None  # the place alone vouches, for this place only
    assert job_id_problem(copied, f"{salt}-{'0' * 32}") is not None


@pytest.mark.parametrize("output", ["out/{stem}.h5:/vectors", "out/{stem}.parquet:vec"])
def test_a_version_cut_short_and_not_published_leaves_nothing_whatever_the_templates_form(tmp_path, output):
    """What a republish cut short had begun is removed once a night decides to append instead, with a
    dataset or a column in the output template too."""
    from streamwhiten.errors import InterruptedRunError

    shard = str(tmp_path / "shards" / "day-1.h5")
    other = str(tmp_path / "shards" / "day-2.h5")
    append_rows(shard, rows_of(800, 1))
    append_rows(other, rows_of(800, 2))
    job = write_job(tmp_path, output=output, publish="")
    text = open(job).read().replace("[apply]\n", "[apply]\nchunk_rows = 128\nprogress_seconds = 0\n")
    open(job, "w").write(text)
    run_job_file(job)
    calls = {"n": 0}

    def stop_soon():
        calls["n"] += 1
        return calls["n"] > 9

    with pytest.raises(InterruptedRunError):
        run_job_file(job, watch=Watch(should_stop=stop_soon), republish=True)
    extension = output.split(":")[0].rsplit(".", 1)[1]
    assert f"day-1.v2.{extension}" in os.listdir(tmp_path / "out")
    append_rows(other, rows_of(30, 3))
    assert run_job_file(job).action == "append"
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        [f"day-1.v1.{extension}", f"day-2.v1.{extension}", f"day-2.v1.part1.{extension}"]
    )
    assert sorted(os.listdir(tmp_path / "models")) == ["m.manifest.json", "m.npz", "m.v1.npz"]


def test_new_job_needs_a_publish_table(tmp_path, run_cli):
    folder = tmp_path / "plain"
    (folder / "shards").mkdir(parents=True)
    append_rows(str(folder / "shards" / "day-1.h5"), rows_of(300, 1))
    job = folder / "job.toml"
    job.write_text('[input]\npaths = ["shards/*.h5"]\n[model]\npath = "m.npz"\nn_components = 4\n')
    code, _, err = run_cli("run", job, "--new-job")
    assert code == EXIT_BAD_INPUT and "--new-job needs a [publish] table" in last_line(err), err
    assert not os.path.exists(folder / "m.npz")
