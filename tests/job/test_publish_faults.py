"""Versioned publish/append under faults (issue #25): a kill at every step of an append night and of a
republish night, then a plain rerun, ends byte-identical to an undisturbed night; a reader reading
through the manifest during a republish sees only complete versions; a full disk during a republish keeps
the current version intact (exit 74).

Steps are the durable state changes of a night: every ``rename`` (a checkpoint, the statistics, a
progress record, a finished output part, the published model file, the manifest switch) and every
``unlink`` (a removed checkpoint, progress record or lock, the deletion of a retired version) the run's
main thread makes. A clean run is traced once (strace, main thread only) to count them; then for each
one a run is killed by strace at that call (``-e inject=SYSCALL:signal=KILL:when=N``: the call does not
happen), a plain ``run`` follows, and the outputs are compared byte for byte with the clean run's. Of a
run of identical consecutive calls (a progress record renamed after every block) only the first and the
last are killed at (:func:`kill_points`), so the file stays within the slow tier's time. Disk full is
strace's ``-e inject=...:error=ENOSPC`` on every write to the new version's output, as
``tests/io/test_write_faults.py`` injects faults.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import REPO

from streamwhiten.core.model import file_checksum, load_model
from streamwhiten.errors import EXIT_IO, EXIT_NOTHING_TO_DO
from tests.job.test_publish import append_rows, expected, rows_of, tree_bytes, write_job

STRACE = shutil.which("strace")


def _strace_problem():
    if STRACE is None:
        return "strace is not installed (needed to kill runs at chosen system calls)"
    probe = subprocess.run([STRACE, "-o", os.devnull, "true"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return f"strace cannot trace here (ptrace not permitted?): {probe.stderr.strip()[:200]}"
    return None


PROBLEM = _strace_problem()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")]

CLI = [sys.executable, "-m", "streamwhiten"]


def env() -> dict:
    values = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    values["PYTHONDONTWRITEBYTECODE"] = "1"
    values.pop("STREAMWHITEN_DEBUG", None)
    return values


def run(work, *args, strace=None, timeout=300):
    command = [*CLI, "run", str(work / "job.toml"), "-q", *args]
    if strace is not None:
        command = [STRACE, "-qq", *strace, "--", *command]
    return subprocess.run(command, capture_output=True, text=True, env=env(), cwd=work, timeout=timeout)


def snapshot(work):
    """What a night leaves: every file's name (temporary files included), the outputs' bytes, the models'
    contents (a model file's zip bytes hold times) and the manifest without its times and its parts'
    file-system stamps (identities and times, as an undisturbed run's differ from run to run)."""
    names = sorted(
        os.path.relpath(os.path.join(directory, name), work)
        for directory, _, files in os.walk(work)
        for name in files
        if not name.endswith((".trace", ".stdout", ".stderr"))
    )
    outputs = tree_bytes(str(work / "out"))
    models = {
        name: file_checksum(load_model(str(work / "models" / name)))
        for name in os.listdir(work / "models")
        if name.endswith(".npz")
    }
    manifest = json.loads((work / "models" / "m.manifest.json").read_text())
    for key in ("published_at", "updated_at", "checksum"):
        manifest.pop(key, None)
    for item in manifest["inputs"]:
        for part in item["parts"]:
            part.pop("stamp", None)
    return {"files": names, "outputs": outputs, "models": models, "manifest": manifest}


def prepare_night(base, kind):
    """A job at ``base/work`` published once (version 1), with the night's new rows in place; returns a
    copy of it to :func:`restore` from (at the same path: the model and manifest record absolute paths)."""
    pristine = base / "work"
    pristine.mkdir()
    write_job(
        pristine,
        output="out/{stem}.h5",
        publish="keep_versions = 1",  # a republish night also deletes the old version
        model="n_components = 8\nchunk_rows = 500\ncheckpoint_every = 1",  # a checkpoint per block
        apply="chunk_rows = 256\nprogress_seconds = 0",  # a progress record per block
    )
    append_rows(pristine / "shards" / "day-1.h5", rows_of(3000, 1))
    append_rows(pristine / "shards" / "day-2.h5", rows_of(1000, 2))
    first = run(pristine)
    assert first.returncode == 0, first.stderr
    if kind == "append":
        append_rows(pristine / "shards" / "day-1.h5", rows_of(600, 3))
        append_rows(pristine / "shards" / "day-3.h5", rows_of(300, 4))
    else:
        append_rows(pristine / "shards" / "day-3.h5", rows_of(1500, 4, shift=2.0))
    shutil.copytree(pristine, base / "pristine", symlinks=True)
    return base / "pristine"


def restore(pristine, work):
    """The night's starting point at ``work`` (the same path every time: the manifest names absolute paths)."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(pristine, work, symlinks=True)


def kill_points(trace):
    """The (syscall, N) points to kill at, from a traced clean run (unlinkat kept apart from unlink: strace
    counts each call by its own name): every step, except that of a run of identical consecutive calls
    (a progress record renamed after each block of one output, a checkpoint after each block of the fit)
    only the first and the last are kept -- the ones between leave the same state as those two, and
    killing at each of them would make this test too slow for the slow tier. Deterministic."""
    counts = dict.fromkeys(("rename", "unlink", "unlinkat"), 0)
    calls = []  # (name, N, the call's text)
    for line in open(trace):
        name = line.split("(", 1)[0].strip()
        if name in counts:
            counts[name] += 1
            calls.append((name, counts[name], line.rsplit("=", 1)[0].strip()))
    points = []
    for index, (name, when, text) in enumerate(calls):
        first = index == 0 or calls[index - 1][2] != text
        last = index == len(calls) - 1 or calls[index + 1][2] != text
        if first or last:
            points.append((name, when))
    return points, len(calls)


@pytest.mark.parametrize("kind", ["append", "republish"])
def test_a_kill_at_every_step_of_a_night_then_a_rerun_is_byte_identical(tmp_path, kind):
    pristine = prepare_night(tmp_path, kind)
    work = tmp_path / "work"
    restore(pristine, work)
    trace = tmp_path / "clean.trace"
    clean = run(work, "--json", strace=["-o", str(trace), "-e", "trace=rename,unlink,unlinkat"])
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["action"] == kind
    reference = snapshot(work)
    points, steps = kill_points(trace)
    # checkpoints, progress records, parts, the model files, the manifest, the retired version's files
    assert len(points) >= (12 if kind == "append" else 20), (points, steps)
    failures = []
    for name, when in points:
        restore(pristine, work)
        killed = run(work, strace=["-e", f"trace={name}", "-e", f"inject={name}:signal=KILL:when={when}"])
        if killed.returncode == 0:
            failures.append(f"{name} #{when}: the run was not killed")
            continue
        rerun = run(work)
        if rerun.returncode not in (0, EXIT_NOTHING_TO_DO):
            failures.append(f"{name} #{when}: the rerun exited {rerun.returncode}: {rerun.stderr.strip()[-300:]}")
            continue
        found = snapshot(work)
        for key in reference:
            if found[key] != reference[key]:
                detail = (
                    f"{sorted(set(found[key]) ^ set(reference[key]))}"
                    if key in ("files", "outputs", "models")
                    else "the manifests differ"
                )
                failures.append(f"{name} #{when}: after the rerun, {key} differ from an undisturbed night: {detail}")
    assert not failures, f"{len(failures)} of {len(points)} kill points:\n" + "\n".join(failures)


def test_a_reader_during_a_republish_sees_only_complete_versions(tmp_path):
    from streamwhiten.job import published
    from streamwhiten.job.manifest import version_model_path

    write_job(tmp_path, apply="chunk_rows = 2048\nprogress_seconds = 0")  # slow enough to read through
    specs = []
    for day in range(1, 4):
        append_rows(tmp_path / "shards" / f"day-{day}.h5", rows_of(60_000, day))
        specs.append(str(tmp_path / "shards" / f"day-{day}.h5"))
    assert run(tmp_path).returncode == 0
    model = str(tmp_path / "models" / "m.npz")
    data = [rows_of(60_000, day) for day in range(1, 4)]
    process = subprocess.Popen(
        [*CLI, "run", str(tmp_path / "job.toml"), "-q", "--republish"],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        running = process.poll() is None
        publication = published(model)
        seen.append((publication.version, [publication.read(spec) for spec in specs]))
        if not running:
            break
    assert process.wait() == 0, process.stderr.read()
    versions = [version for version, _ in seen]
    assert versions == sorted(versions) and versions[-1] == 2, versions
    assert versions.count(1) >= 2, "the reader never read during the republish (make it slower)"
    references = {version: [expected(version_model_path(model, version), rows) for rows in data] for version in (1, 2)}
    for version, arrays in seen:
        for got, want in zip(arrays, references[version], strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_a_full_disk_during_a_republish_keeps_the_current_version_and_exits_74(tmp_path):
    write_job(tmp_path, output="out/{stem}.h5")
    append_rows(tmp_path / "shards" / "day-1.h5", rows_of(2000, 1))
    append_rows(tmp_path / "shards" / "day-2.h5", rows_of(2000, 2))
    assert run(tmp_path).returncode == 0
    append_rows(tmp_path / "shards" / "day-3.h5", rows_of(2000, 3, shift=2.0))  # stale: a republish is due
    before = {name: tree_bytes(str(tmp_path / name)) for name in ("out", "models/m.manifest.json", "models/m.v1.npz")}
    target = str(tmp_path / "out" / ".day-2.v2.h5.partial")  # the second output of the new version
    full = run(
        tmp_path,
        strace=[
            "-f",
            "-P",
            target,
            "-e",
            "trace=write,pwrite64,pwritev,pwritev2",
            "-e",
            "inject=write,pwrite64,pwritev,pwritev2:error=ENOSPC:when=1+",
        ],
    )
    assert full.returncode == EXIT_IO, full.stderr
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith("streamwhiten: error: ") and "No space left on device" in last and "day-2.v2.h5" in last
    assert "Traceback" not in full.stderr
    after = {name: tree_bytes(str(tmp_path / name)) for name in before}
    # the new version's first output, complete, stays for the rerun; the rest is untouched
    assert sorted(set(after["out"]) - set(before["out"])) == ["day-1.v2.h5"]
    after["out"] = {name: data for name, data in after["out"].items() if name in before["out"]}
    assert after == before  # the published version, its outputs and the manifest are untouched
    assert not os.path.exists(target) and not os.path.exists(tmp_path / "models" / "m.v2.npz")
    from streamwhiten.job import published

    assert published(str(tmp_path / "models" / "m.npz")).version == 1
    rerun = run(tmp_path, "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["action"] == "republish" and json.loads(rerun.stdout)["published_version"] == 2
