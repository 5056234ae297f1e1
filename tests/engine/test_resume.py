"""Resumable fits and applies: real SIGKILLs, damaged checkpoints, changed and appended sources,
locks, and a full disk."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import numpy as np
import pytest
from conftest import REPO, run_command, write_h5

from streamwhiten.core.model import load_model
from streamwhiten.engine.apply import apply_model
from streamwhiten.engine.fit import Checkpoint, load_checkpoint, plan_fit, run_plan, save_checkpoint
from streamwhiten.errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_IO,
    EXIT_LOCKED,
    EXIT_NOTHING_TO_DO,
    BadInputError,
    InterruptedRunError,
    StoreIOError,
)
from streamwhiten.io import open_source, partial_path
from streamwhiten.job import default_checkpoint
from streamwhiten.options import ApplyOptions, ReadOptions
from streamwhiten.output_plan import OutputPlan
from streamwhiten.progress import Watch
from streamwhiten.synthetic import write_store

N_ROWS, N_FEATURES, BLOCK = 60_000, 48, 300


def spawn(*args):
    """Start the CLI in a process of lower priority than the test's, so that on a busy machine the test still
    sees its progress before it has finished (and can kill it mid-run)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-m", "streamwhiten", *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.nice(10),
    )


def rerun_code(killed):
    """What running the same command again returns: a killed run resumes (0); one that finished before the
    test could kill it left an up-to-date output, so the rerun has nothing to do."""
    return 0 if killed else EXIT_NOTHING_TO_DO


def statistics(path):
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key].tobytes() for key in ("n_rows", "mean", "scatter", "eigvals", "eigvecs", "sources_json")}


def rows_done_of_checkpoint(path):
    try:
        return load_checkpoint(path).rows_done
    except Exception:
        return -1


def rows_done_of_partial(output):
    import json

    try:
        with open(partial_path(output) + ".progress.json") as handle:
            return json.load(handle)["rows_done"]
    except Exception:
        return -1


def kill_when(process, progress, target, timeout=60.0):
    """SIGKILL ``process`` once ``progress()`` reaches ``target`` (or it exits by itself); True if killed.

    The process runs in short slices and is stopped (SIGSTOP) while its progress is read, so a busy machine
    that delays the test cannot let it run from before ``target`` to its end unseen."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            process.send_signal(signal.SIGCONT)
            time.sleep(0.002)
            process.send_signal(signal.SIGSTOP)
            if process.poll() is not None:
                return False
            if progress() >= target:
                process.send_signal(signal.SIGKILL)
                process.wait()
                return True
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)
    process.kill()
    raise AssertionError("the process made no progress")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    directory = tmp_path_factory.mktemp("resume")
    return write_store(str(directory / "big.h5"), N_ROWS, N_FEATURES, seed=5, chunk_rows=BLOCK)


@pytest.mark.slow
def test_fit_killed_anywhere_resumes_to_identical_statistics(tmp_path, store):
    fit_args = ["--chunk-rows", BLOCK, "--checkpoint-every", 1, "-q"]
    reference = tmp_path / "reference.npz"
    assert run_command("fit", store, "-o", reference, *fit_args).returncode == 0
    expected = statistics(reference)
    rng = np.random.default_rng(2026)
    killed_mid_run = 0
    for target in sorted(rng.integers(BLOCK, N_ROWS - BLOCK, size=5)):
        model = tmp_path / f"model-{target}.npz"
        checkpoint = default_checkpoint(str(model))
        process = spawn("fit", store, "-o", model, *fit_args)
        killed = kill_when(process, lambda: rows_done_of_checkpoint(checkpoint), target)
        if killed:
            killed_mid_run += 1
            assert not model.exists() and os.path.exists(checkpoint)
        resumed = run_command("fit", store, "-o", model, *fit_args)
        assert resumed.returncode == rerun_code(killed), resumed.stderr
        assert statistics(model) == expected, f"resumed after a kill at row {target} differs"
        assert not os.path.exists(checkpoint)
    assert killed_mid_run >= 3


@pytest.mark.slow
def test_apply_killed_anywhere_resumes_to_identical_output(tmp_path, store):
    model = tmp_path / "m.npz"
    assert run_command("fit", store, "-o", model, "-k", 16, "-q").returncode == 0
    # 256 rows of 16 float32 are 16 KiB: whole chunks are written around the page cache (O_DIRECT)
    apply_args = ["--chunk-rows", 256, "--normalize", "--checkpoint-seconds", 0, "-q"]
    for name in ("reference.zarr", "reference.h5"):
        assert run_command("apply", model, store, "-o", tmp_path / name, *apply_args).returncode == 0
    rng = np.random.default_rng(7)
    killed_mid_run = 0
    for i, target in enumerate(sorted(rng.integers(256, N_ROWS - 256, size=5))):
        suffix = ".zarr" if i % 2 == 0 else ".h5"
        output = str(tmp_path / f"out-{target}{suffix}")
        process = spawn("apply", model, store, "-o", output, *apply_args)
        killed = kill_when(process, lambda: rows_done_of_partial(output), target)
        if killed:
            killed_mid_run += 1
            assert not os.path.exists(output)  # nothing that looks finished
        resumed = run_command("apply", model, store, "-o", output, *apply_args, "--json")
        assert resumed.returncode == rerun_code(killed), resumed.stderr
        if killed:  # continued from its progress record, not started over
            assert json.loads(resumed.stdout)["resumed_at_row"] >= target
        assert store_bytes(output) == store_bytes(str(tmp_path / f"reference{suffix}"))  # every byte, metadata too
        assert not os.path.exists(partial_path(output))
    assert killed_mid_run >= 3


@pytest.mark.parametrize(
    ("suffix", "dtype"), [(".h5", "int8"), (".zarr", "int8"), (".h5", "eigen:6"), (".zarr", "eigen:6")]
)
def test_a_killed_coded_apply_resumes_to_the_bytes_of_an_uninterrupted_run(tmp_path, store, suffix, dtype):
    """apply --dtype int8 (or a vector code) killed with SIGKILL mid-run, then run again: continued from its
    progress record, to every byte of an uninterrupted run (codes and their decode record)."""
    model = tmp_path / "m.npz"
    assert run_command("fit", store, "-o", model, "-k", 16, "-q").returncode == 0
    apply_args = ["--block-rows", 256, "--dtype", dtype, "--progress-seconds", 0, "-q"]
    reference = str(tmp_path / f"reference{suffix}")
    assert run_command("apply", model, store, "-o", reference, *apply_args).returncode == 0
    killed = 0
    for target in (N_ROWS // 3, N_ROWS // 2, 2 * N_ROWS // 3):
        output = str(tmp_path / f"out-{target}{suffix}")
        process = spawn("apply", model, store, "-o", output, *apply_args)
        was_killed = kill_when(process, lambda: rows_done_of_partial(output), target)
        if was_killed:
            killed += 1
            assert not os.path.exists(output)
        resumed = run_command("apply", model, store, "-o", output, *apply_args, "--json")
        assert resumed.returncode == rerun_code(was_killed), resumed.stderr
        if was_killed:
            assert json.loads(resumed.stdout)["resumed_at_row"] >= target
        assert store_bytes(output) == store_bytes(reference)
        if killed:
            break
    assert killed == 1


def store_bytes(path):
    """The contents of an HDF5 file, or of every file of a Zarr store by relative path."""
    if os.path.isfile(path):
        with open(path, "rb") as handle:
            return handle.read()
    contents = {}
    for directory, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(directory, name), "rb") as handle:
                contents[os.path.relpath(os.path.join(directory, name), path)] = handle.read()
    return contents


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_write_a_final_checkpoint(tmp_path, store, signum):
    model = tmp_path / "m.npz"
    checkpoint = default_checkpoint(str(model))
    process = spawn("fit", store, "-o", model, "--chunk-rows", BLOCK, "--checkpoint-every", 20)
    deadline = time.monotonic() + 60
    while rows_done_of_checkpoint(checkpoint) <= 0:  # the handlers are installed before the first block
        assert process.poll() is None and time.monotonic() < deadline, "the fit never started"
        time.sleep(0.002)
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    if process.returncode == 0:
        pytest.skip("the fit finished before the signal arrived")
    assert process.returncode == EXIT_INTERRUPTED, err
    assert err.count("\n") == 1 and "stopped by SIG" in err and "progress saved to" in err  # one line
    saved = load_checkpoint(checkpoint).rows_done
    assert 0 < saved < N_ROWS and saved % BLOCK == 0
    assert run_command("fit", store, "-o", model, "--chunk-rows", BLOCK).returncode == 0
    assert load_model(str(model)).n_rows == N_ROWS


def test_damaged_checkpoints_are_refused(tmp_path, store):
    model = str(tmp_path / "m.npz")
    checkpoint = default_checkpoint(model)
    job = plan_fit(store, block_rows=BLOCK)
    job.cursors[0].stop = 3 * BLOCK  # run three blocks only, then checkpoint
    run_plan(job)
    job.cursors[0].stop = N_ROWS
    save_checkpoint(job, checkpoint)
    raw = open(checkpoint, "rb").read()
    for damaged in (raw[: len(raw) - 100], raw[:2000] + bytes([raw[2000] ^ 0x01]) + raw[2001:]):
        open(checkpoint, "wb").write(damaged)
        result = run_command("fit", store, "-o", model)
        assert result.returncode == EXIT_BAD_INPUT
        assert "checkpoint" in result.stderr and "--restart" in result.stderr
        assert not os.path.exists(model)
        assert open(checkpoint, "rb").read() == damaged  # never silently replaced or used
    fresh = run_command("fit", store, "-o", model, "--restart")
    assert fresh.returncode == 0, fresh.stderr
    assert not os.path.exists(checkpoint) and load_model(model).n_rows == N_ROWS


def test_resume_against_a_modified_source_is_refused(tmp_path):
    rows = np.random.default_rng(1).standard_normal((3000, 6)).astype(np.float32)
    spec = write_h5(tmp_path / "s.h5", rows, chunk_rows=100)
    model = str(tmp_path / "m.npz")
    job = plan_fit(spec, block_rows=100)
    job.cursors[0].stop = 1000
    run_plan(job)
    job.cursors[0].stop = 3000
    save_checkpoint(job, default_checkpoint(model))
    rows[500] += 1.0  # an already-read row changes (in a sampled position: the middle of the prefix)
    rows[0] += 1.0
    write_h5(tmp_path / "s.h5", rows, chunk_rows=100)
    result = run_command("fit", spec, "-o", model)
    assert result.returncode == EXIT_BAD_INPUT
    assert "s.h5:/emb" in result.stderr and "refusing to resume" in result.stderr


def test_update_with_appended_rows_equals_full_refit(tmp_path, run_cli):
    rng = np.random.default_rng(3)
    rows = 5.0 + rng.standard_normal((5000, 8)) @ rng.standard_normal((8, 8))
    first = write_h5(tmp_path / "grow.h5", rows[:3000], chunk_rows=128)
    other = write_h5(tmp_path / "other.h5", rows[:700] * 0.5, chunk_rows=128)
    model = tmp_path / "m.npz"
    assert run_cli("fit", first, other, "-o", model, "-k", 4, "-q")[0] == 0
    # the store grows (same earlier rows), and a brand-new shard appears
    write_h5(tmp_path / "grow.h5", rows, chunk_rows=128)
    new = write_h5(tmp_path / "new.h5", rows[:400] - 1.0, chunk_rows=128)
    code, out, err = run_cli("fit", first, other, new, "--update", model, "--json", "-q")
    assert code == 0, err
    assert '"rows_read": 2400' in out  # 2000 appended + 400 new; nothing re-read
    full = tmp_path / "full.npz"
    assert run_cli("fit", first, other, new, "-o", full, "-k", 4, "-q")[0] == 0
    updated, refit = load_model(str(model)), load_model(str(full))
    assert updated.n_rows == refit.n_rows == 5000 + 700 + 400 and updated.n_components == 4
    rel = np.linalg.norm(updated.state.scatter - refit.state.scatter) / np.linalg.norm(refit.state.scatter)
    assert rel <= 1e-12
    np.testing.assert_allclose(updated.state.mean, refit.state.mean, rtol=1e-12)
    # nothing new: a distinct exit code, the model untouched
    before = open(model, "rb").read()
    code, _, err = run_cli("fit", first, other, new, "--update", model)
    assert code == EXIT_NOTHING_TO_DO and "nothing to do" in err
    assert open(model, "rb").read() == before
    # an edited (not appended) source is refused
    edited = rows.copy()
    edited[0] += 1
    write_h5(tmp_path / "grow.h5", edited, chunk_rows=128)
    code, _, err = run_cli("fit", first, "--update", model)
    assert code == EXIT_BAD_INPUT and "grow.h5:/emb" in err and "differ from the recorded" in err


@pytest.mark.parametrize("precision, bound", [("auto", 1e-6), ("float64", 1e-14)])
def test_update_of_a_float32_store_matches_a_full_refit_to_the_documented_tolerance(
    tmp_path, run_cli, precision, bound
):
    """README: 1e-16 to 3e-15 with float64 products, 4e-8 to 2.5e-7 with the default float32 ones."""
    rng = np.random.default_rng(11)
    rows = 3.0 + rng.standard_normal((30_000, 64)) @ (rng.standard_normal((64, 64)) / np.arange(1, 65)[:, None])
    rows = rows.astype(np.float32)
    store = write_h5(tmp_path / "s.h5", rows[:18_000], chunk_rows=1000)
    model, full = tmp_path / "m.npz", tmp_path / "full.npz"
    assert run_cli("fit", store, "-o", model, "--precision", precision, "-q")[0] == 0
    write_h5(tmp_path / "s.h5", rows, chunk_rows=1000)
    assert run_cli("fit", store, "--update", model, "--precision", precision, "-q")[0] == 0
    assert run_cli("fit", store, "-o", full, "--precision", precision, "-q")[0] == 0
    updated, refit = load_model(str(model)), load_model(str(full))
    assert updated.n_rows == refit.n_rows == 30_000
    rel = np.linalg.norm(updated.state.scatter - refit.state.scatter) / np.linalg.norm(refit.state.scatter)
    assert rel <= bound
    exact = np.cov(rows.astype(np.float64), rowvar=False, bias=True) * 30_000
    refit_error = np.linalg.norm(refit.state.scatter - exact) / np.linalg.norm(exact)
    assert rel <= 10 * max(refit_error, 1e-16)  # no further from the refit than rounding puts the refit from exact


def write_job(directory, store, apply=True):
    job = directory / "job.toml"
    text = f'name = "nightly"\n[input]\npaths = ["{store}"]\n[model]\npath = "model.npz"\nn_components = 8\n'
    if apply:
        text += '[apply]\noutput = "out-{stem}.zarr"\nnormalize = true\n'
    job.write_text(text)
    return job


def test_run_job_steps_and_exit_codes(tmp_path, store):
    job = write_job(tmp_path, store)
    first = run_command("run", job)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "model.npz").exists() and (tmp_path / "out-big.zarr").exists()
    assert "T" in first.stderr.splitlines()[0][:20]  # timestamped log lines
    again = run_command("run", job)
    assert again.returncode == EXIT_NOTHING_TO_DO, again.stderr
    (tmp_path / "job.toml").write_text(job.read_text().replace("n_components = 8", "n_components = 6"))
    refinalized = run_command("run", job, "--json")
    assert refinalized.returncode == 0 and '"finalize"' in refinalized.stdout
    with open_source(str(tmp_path / "out-big.zarr")) as out:
        assert out.n_features == 6
    (tmp_path / "job.toml").write_text("[input]\npaths = []\n")
    bad = run_command("run", job)
    assert bad.returncode == EXIT_BAD_INPUT and "job.toml" in bad.stderr


def test_two_concurrent_runs_one_waits_out(tmp_path, store):
    job = write_job(tmp_path, store)
    first = spawn("run", job)
    lock = tmp_path / ".model.npz.lock"  # one lock per model file
    deadline = time.monotonic() + 30
    while not (lock.exists() and lock.read_text().strip() == str(first.pid)):
        assert time.monotonic() < deadline and first.poll() is None, "the first run never took the lock"
        time.sleep(0.005)
    os.kill(first.pid, signal.SIGSTOP)  # hold the first run inside its locked section
    try:
        second = run_command("run", job)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    _, first_err = first.communicate(timeout=120)
    assert second.returncode == EXIT_LOCKED
    assert "another run of this job is in progress" in second.stderr and str(first.pid) in second.stderr
    assert first.returncode == 0, first_err


@contextmanager
def tiny_filesystem(path, size_kb):
    path.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a small tmpfs here (needs root); the patched-writer test covers this case")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_full_disk_during_checkpoint_keeps_the_previous_one(tmp_path, store):
    with tiny_filesystem(tmp_path / "small", 128) as small:
        model = small / "m.npz"
        checkpoint = default_checkpoint(str(model))
        # room for one checkpoint (~19 KiB), not for a second one written beside it before the rename
        (small / "filler").write_bytes(b"\0" * (128 - 40) * 1024)
        result = run_command("fit", store, "-o", model, "--chunk-rows", BLOCK, "--checkpoint-every", 1)
        assert result.returncode == EXIT_IO, result.stderr
        assert "cannot write checkpoint" in result.stderr and "previous checkpoint is kept" in result.stderr
        assert 0 < load_checkpoint(checkpoint).rows_done < N_ROWS  # still valid, still usable
        assert not model.exists()
        assert sorted(os.listdir(small)) == sorted(["filler", os.path.basename(checkpoint)])


def test_full_disk_during_output_leaves_old_output_and_no_partial(tmp_path, store):
    with tiny_filesystem(tmp_path / "small", 1024) as small:
        model = tmp_path / "m.npz"
        assert run_command("fit", store, "-o", model, "-k", 2).returncode == 0
        output = small / "out.h5"
        small_input = write_h5(tmp_path / "small-in.h5", np.ones((10, N_FEATURES), np.float32))
        assert run_command("apply", model, small_input, "-o", output).returncode == 0
        before = output.read_bytes()
        result = run_command("apply", model, store, "-o", output, "--overwrite", "-k", 40)
        assert result.returncode == EXIT_IO, result.stderr
        assert output.read_bytes() == before
        assert os.listdir(small) == ["out.h5"]


def test_output_write_failure_midway_removes_the_partial_output(tmp_path, store, monkeypatch, run_cli):
    from streamwhiten.io._store import StoreSink as Sink  # what every backend's sink writes through

    model = tmp_path / "m.npz"
    assert run_cli("fit", store, "-o", model, "-k", 4, "-q")[0] == 0
    real = Sink.write
    calls = {"n": 0}

    def failing(self, start, block):
        calls["n"] += 1
        if calls["n"] == 3:
            raise StoreIOError(f"{self.label}: cannot write rows {start}..: [Errno 28] No space left on device")
        return real(self, start, block)

    monkeypatch.setattr(Sink, "write", failing)
    for name in ("out.h5", "out.zarr"):
        calls["n"] = 0
        code, _, err = run_cli("apply", model, store, "-o", tmp_path / name, "--chunk-rows", BLOCK)
        assert code == EXIT_IO and "No space left on device" in err
        assert not os.path.exists(tmp_path / name) and not os.path.exists(partial_path(str(tmp_path / name)))


def test_checkpoint_write_failure_is_reported_and_old_checkpoint_kept(tmp_path, store, monkeypatch):
    from streamwhiten import _npz

    checkpoint = str(tmp_path / "c.ckpt")
    calls = {"n": 0}
    real = _npz.np.savez

    def failing(handle, **arrays):
        calls["n"] += 1
        if calls["n"] >= 3:
            raise OSError(28, "No space left on device")
        return real(handle, **arrays)

    monkeypatch.setattr(_npz.np, "savez", failing)
    with pytest.raises(StoreIOError, match="previous checkpoint is kept"):
        run_plan(plan_fit(store, block_rows=BLOCK), checkpoint=Checkpoint(checkpoint, every_blocks=1))
    assert load_checkpoint(checkpoint).rows_done == 2 * BLOCK
    assert os.listdir(tmp_path) == ["c.ckpt"]


def test_nightly_script_runs_the_job_and_treats_nothing_to_do_as_success(tmp_path, store):
    job = write_job(tmp_path, store, apply=False)
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "streamwhiten").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m streamwhiten "$@"\n')
    (shim / "streamwhiten").chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{shim}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(REPO),
        STREAMWHITEN_VENV=str(tmp_path / "no-venv"),
    )
    script = str(REPO / "scripts" / "nightly.sh")
    first = subprocess.run(["bash", script, str(job)], capture_output=True, text=True, env=env)
    assert first.returncode == 0 and "nightly: done" in first.stdout, first.stderr
    second = subprocess.run(["bash", script, str(job)], capture_output=True, text=True, env=env)
    assert second.returncode == 0 and "nothing new to do" in second.stdout
    assert "model.npz is up to date" in (tmp_path / "nightly.log").read_text()


# ---- regressions from review: each reproduces a reported failure


def test_restart_interrupted_before_its_first_block_is_not_resumed_with_the_old_record(tmp_path, run_cli):
    from streamwhiten.engine.apply import apply_model
    from streamwhiten.errors import InterruptedRunError
    from streamwhiten.io import open_output

    rows = np.random.default_rng(4).standard_normal((4000, 8)).astype(np.float32)
    spec = write_h5(tmp_path / "in.h5", rows, chunk_rows=500)
    model_path = tmp_path / "m.npz"
    assert run_cli("fit", spec, "-o", model_path, "-q")[0] == 0
    model = load_model(str(model_path))
    output = str(tmp_path / "out.h5")
    with pytest.raises(InterruptedRunError):
        apply_model(
            model,
            spec,
            output,
            ApplyOptions(progress_seconds=0),
            ReadOptions(block_rows=500),
            watch=Watch(should_stop=lambda: True),
        )
    assert rows_done_of_partial(output) == 500
    # `apply --restart` killed inside its first block: a fresh partial exists, nothing written yet
    open_output(output).create(OutputPlan(4000, model.n_components, chunk_rows=500)).suspend()
    summary = apply_model(model, spec, output, ApplyOptions(), ReadOptions(block_rows=500))
    assert summary.resumed_at_row == 0
    with open_source(output) as out:  # every row written by this run, none left as fill value
        np.testing.assert_allclose(out.read(0, 4000), model.transform(rows), rtol=1e-5, atol=1e-6)


def test_the_same_rows_are_never_counted_twice(tmp_path, run_cli):
    rows = np.random.default_rng(5).standard_normal((500, 4))
    data = tmp_path / "data"
    data.mkdir()
    spec = write_h5(data / "f.h5", rows)
    os.symlink(data, tmp_path / "link")
    code, _, err = run_cli("fit", spec, spec, "-o", tmp_path / "twice.npz")
    assert code == EXIT_BAD_INPUT and "given twice" in err
    code, _, err = run_cli("fit", str(data / "*.h5:/emb"), f"{tmp_path}/link/f.h5:/emb", "-o", tmp_path / "t.npz")
    assert code == EXIT_BAD_INPUT and "given twice" in err
    model = tmp_path / "m.npz"
    assert run_cli("fit", f"{tmp_path}/link/f.h5:/emb", "-o", model)[0] == 0
    code, _, err = run_cli("fit", spec, "--update", model)  # the same file by its real path: nothing new
    assert code == EXIT_NOTHING_TO_DO, err
    moved = tmp_path / "moved.h5"
    os.rename(data / "f.h5", moved)
    code, _, err = run_cli("fit", f"{moved}:/emb", "--update", model)
    assert code == EXIT_BAD_INPUT and "moved or copied" in err
    assert load_model(str(model)).n_rows == 500


def test_run_finishes_an_interrupted_update_even_after_new_shards_appear(tmp_path):
    from streamwhiten.job import run_job_file

    rng = np.random.default_rng(6)
    shards = tmp_path / "shards"
    shards.mkdir()
    parts = [rng.standard_normal((3000, 6)) + i for i in range(3)]
    write_h5(shards / "day-0.h5", parts[0], chunk_rows=100)
    job = tmp_path / "job.toml"
    job.write_text(
        f'[input]\npaths = ["{shards}/day-*.h5"]\n[model]\npath = "model.npz"\nchunk_rows = 100\ncheckpoint_every = 1\n'
    )
    run_job_file(str(job))
    write_h5(shards / "day-1.h5", parts[1], chunk_rows=100)
    calls = {"n": 0}

    def stop_soon():
        calls["n"] += 1
        return calls["n"] >= 5

    from streamwhiten.errors import InterruptedRunError

    with pytest.raises(InterruptedRunError):
        run_job_file(str(job), watch=Watch(should_stop=stop_soon))
    write_h5(shards / "day-2.h5", parts[2], chunk_rows=100)  # a new shard arrives before the next run
    summary = run_job_file(str(job))
    assert summary.steps[:2] == ("resume", "update")
    model = load_model(str(tmp_path / "model.npz"))
    everything = np.vstack(parts)
    assert model.n_rows == 9000
    np.testing.assert_allclose(
        model.state.scatter / model.n_rows, np.cov(everything, rowvar=False, bias=True), rtol=1e-10
    )
    assert not os.path.exists(default_checkpoint(str(tmp_path / "model.npz")))


def test_run_rewrites_outputs_when_apply_options_change_and_refuses_colliding_outputs(tmp_path, store):
    from streamwhiten.errors import BadInputError
    from streamwhiten.job import run_job_file

    job = write_job(tmp_path, store)
    run_job_file(str(job))
    job.write_text(job.read_text().replace("normalize = true", 'normalize = false\ndtype = "float16"'))
    summary = run_job_file(str(job))
    assert any(step.startswith("apply") for step in summary.steps)
    with open_source(str(tmp_path / "out-big.zarr")) as out:
        assert out.dtype == np.float16
    other = tmp_path / "other"
    other.mkdir()
    write_h5(other / "big.h5", np.ones((10, N_FEATURES), np.float32))
    job.write_text(job.read_text().replace(f'paths = ["{store}"]', f'paths = ["{store}", "{other}/big.h5"]'))
    with pytest.raises(BadInputError, match="puts two inputs in"):
        run_job_file(str(job))


@pytest.mark.parametrize(
    "line, fragment",
    [
        # checked against streamwhiten.params, in the words Python and the command line use
        ('chunk_rows = "big"', "chunk_rows in [model] must be a whole number of at least 1, got 'big'"),
        ('skip_nonfinite = "no"', "skip_nonfinite in [model] must be true or false, got 'no'"),
        ("checkpoint_every = 1.5", "checkpoint_every in [model] must be a whole number of at least 1, got 1.5"),
        ("n_components = true", "n_components in [model] must be a whole number of at least 1, got True"),
        ('precision = "half"', "precision in [model] must be one of 'auto', 'float32', 'float64', got 'half'"),
        ("threads = 0", "threads in [model] must be a whole number from 1 to 1024 (or -1 for one per core), got 0"),
        ("checkpoint_every = 0", "checkpoint_every in [model] must be a whole number of at least 1, got 0"),
        ("checkpoint_seconds = 0", "checkpoint_seconds in [model] must be a number of seconds above 0, got 0"),
        ("checkpoint_seconds = -1.5", "checkpoint_seconds in [model] must be a number of seconds above 0, got -1.5"),
        ("checkpoint_seconds = nan", "checkpoint_seconds in [model] must be a number of seconds above 0, got nan"),
        ("chunk_rows = 0", "chunk_rows in [model] must be a whole number of at least 1, got 0"),
    ],
)
def test_job_file_values_are_type_checked(tmp_path, line, fragment):
    job = tmp_path / "job.toml"
    job.write_text(f'[input]\npaths = ["x.h5"]\n[model]\npath = "m.npz"\n{line}\n')
    result = run_command("run", job)
    assert result.returncode == EXIT_BAD_INPUT and fragment in result.stderr


def test_an_empty_shard_among_several_is_recorded_and_read_once_it_grows(tmp_path, run_cli):
    rng = np.random.default_rng(8)
    full, later = rng.standard_normal((400, 5)), rng.standard_normal((300, 5)) + 2
    a = write_h5(tmp_path / "a.h5", full)
    b = write_h5(tmp_path / "b.h5", np.empty((0, 5)))
    model = tmp_path / "m.npz"
    code, out, err = run_cli("fit", a, b, "-o", model, "--json", "-q")
    assert code == 0, err
    assert load_model(str(model)).n_rows == 400
    write_h5(tmp_path / "b.h5", later)
    assert run_cli("fit", a, b, "--update", model, "-q")[0] == 0
    updated = load_model(str(model))
    assert updated.n_rows == 700
    np.testing.assert_allclose(
        updated.state.scatter / 700, np.cov(np.vstack([full, later]), rowvar=False, bias=True), rtol=1e-10
    )
    alone = write_h5(tmp_path / "e.h5", np.empty((0, 5)))  # on its own, an empty store is still refused
    code, _, err = run_cli("fit", alone, "-o", tmp_path / "e.npz")
    assert code == EXIT_BAD_INPUT and "has 0 row(s)" in err


# ---- regressions from the second review


def test_run_refuses_outputs_sharing_a_store_and_bad_dtypes_and_makes_no_stray_directories(tmp_path):
    from streamwhiten.errors import BadInputError
    from streamwhiten.job import run_job_file

    rng = np.random.default_rng(9)
    for name in ("a", "b"):
        write_h5(tmp_path / f"{name}.h5", rng.standard_normal((200, 4)))
    job = tmp_path / "job.toml"
    base = f'[input]\npaths = ["{tmp_path}/*.h5"]\n[model]\npath = "m.npz"\n[apply]\n'
    job.write_text(base + 'output = "out/all.zarr:/{stem}"\n')
    with pytest.raises(BadInputError, match="puts two inputs in"):
        run_job_file(str(job))
    job.write_text(base + 'output = "out/{stem}.h5:/emb"\ndtype = "f4"\n')
    with pytest.raises(
        BadInputError,
        match='dtype in \\[apply\\] must be "float32", "float16", "int8", "binary" or a vector code NAME:BYTES',
    ):
        run_job_file(str(job))
    job.write_text(base + 'output = "out/{stem}.h5:/emb"\n')
    run_job_file(str(job))
    assert sorted(os.listdir(tmp_path / "out")) == ["a.h5", "b.h5"]


def test_a_pending_checkpoint_for_inputs_the_job_dropped_is_discarded(tmp_path):
    from streamwhiten.errors import InterruptedRunError
    from streamwhiten.job import run_job_file

    rng = np.random.default_rng(10)
    a = write_h5(tmp_path / "a.h5", rng.standard_normal((3000, 4)), chunk_rows=100)
    b = write_h5(tmp_path / "b.h5", rng.standard_normal((3000, 4)) + 1, chunk_rows=100)
    job = tmp_path / "job.toml"
    text = '[input]\npaths = [{}]\n[model]\npath = "m.npz"\nchunk_rows = 100\ncheckpoint_every = 1\n'
    job.write_text(text.format(f'"{a.split(":")[0]}", "{b.split(":")[0]}"'))
    calls = {"n": 0}
    with pytest.raises(InterruptedRunError):
        run_job_file(
            str(job), watch=Watch(should_stop=lambda: calls.__setitem__("n", calls["n"] + 1) or calls["n"] >= 3)
        )
    job.write_text(text.format(f'"{b.split(":")[0]}"'))  # the job now reads b only
    summary = run_job_file(str(job))
    assert summary.steps == ("fit",)
    model = load_model(str(tmp_path / "m.npz"))
    assert model.n_rows == 3000 and [s.path for s in model.sources] == [os.path.realpath(b.split(":")[0])]


def test_zarr_outputs_are_fsynced_before_progress_is_recorded_and_at_commit(tmp_path, monkeypatch):
    from streamwhiten.io import open_output
    from streamwhiten.records import Fingerprint, ResumeRecord

    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    target = str(tmp_path / "o.zarr")
    sink = open_output(target).create(OutputPlan(300, 4, chunk_rows=100))
    sink.write(0, np.ones((200, 4), np.float32))
    job = ResumeRecord("0" * 64, Fingerprint(path="in.h5"), target, False, "float32", 3, 100, False, 1)
    sink.save_progress(job.at(200))
    chunk_files = [path for path in synced if re.search(r"/c/\d+/0$", path)]
    assert len(chunk_files) == 2 and all(".o.zarr.partial" in path for path in chunk_files)
    synced.clear()
    sink.write(200, np.ones((100, 4), np.float32))
    sink.commit()
    assert any(path.endswith("/c/2/0") for path in synced) and any(path.endswith("zarr.json") for path in synced)


def test_an_empty_recorded_shard_does_not_make_new_shards_look_moved(tmp_path, run_cli):
    rng = np.random.default_rng(11)
    a = write_h5(tmp_path / "a.h5", rng.standard_normal((40, 3)))
    e = write_h5(tmp_path / "e.h5", np.empty((0, 3)))
    model = tmp_path / "m.npz"
    assert run_cli("fit", a, e, "-o", model, "-q")[0] == 0
    b = write_h5(tmp_path / "b.h5", rng.standard_normal((30, 3)))
    code, _, err = run_cli("fit", a, b, "--update", model, "-q")
    assert code == 0, err
    assert load_model(str(model)).n_rows == 70


def test_job_file_threads_are_used_for_fit_and_apply(tmp_path, store, monkeypatch):
    import streamwhiten.engine.apply
    import streamwhiten.engine.fit
    from streamwhiten.job import run_job_file

    asked = []
    for module in (streamwhiten.engine.fit, streamwhiten.engine.apply):
        real = module.resolve_threads
        monkeypatch.setattr(
            module,
            "resolve_threads",
            lambda n, *a, real=real, name=module.__name__, **k: asked.append((name, n)) or real(n, *a, **k),
        )
    job = write_job(tmp_path, store)
    job.write_text(job.read_text().replace("n_components = 8\n", "n_components = 8\nthreads = 3\n") + "threads = 2\n")
    summary = run_job_file(str(job))
    assert "apply" in " ".join(summary.steps)
    assert ("streamwhiten.engine.fit", 3) in asked and ("streamwhiten.engine.apply", 2) in asked
    with open_source(str(tmp_path / "out-big.zarr")) as out:
        assert out.n_features == 8 and out.n_rows > 0


def test_job_file_direct_io_reaches_the_output_writer(tmp_path, store, monkeypatch):
    import streamwhiten.io.hdf5
    import streamwhiten.io.zarr
    from streamwhiten.job import run_job_file

    asked = []
    for backend in (streamwhiten.io.hdf5, streamwhiten.io.zarr):  # every writer of output chunks
        real = backend.ChunkFile
        monkeypatch.setattr(
            backend, "ChunkFile", lambda *a, real=real, **k: asked.append(k.get("direct")) or real(*a, **k)
        )
    job = write_job(tmp_path, store)
    job.write_text(job.read_text() + "direct_io = false\n")
    run_job_file(str(job))
    assert asked and set(asked) == {False}
    job.write_text(job.read_text().replace("direct_io = false", 'direct_io = "no"'))
    with pytest.raises(BadInputError, match="direct_io"):
        run_job_file(str(job))


def test_resumes_with_few_blocks_left_keep_the_bits_of_an_uninterrupted_run(tmp_path):
    """Blocks big enough for BLAS to use several threads: a resume with fewer blocks left than worker
    threads must still run them as the uninterrupted run did (same workers, same BLAS threads)."""
    from streamwhiten.core.model import finalize

    rows = (np.random.default_rng(21).standard_normal((20000, 64)) * 3 + 7).astype(np.float32)
    spec = write_h5(tmp_path / "big.h5", rows, chunk_rows=5000)
    whole = run_plan(plan_fit(spec, block_rows=5000), threads=2).state
    checkpoint = str(tmp_path / "fit.checkpoint")
    calls = {"n": 0}

    def stop_after_three():
        calls["n"] += 1
        return calls["n"] >= 3

    with pytest.raises(InterruptedRunError):
        run_plan(
            plan_fit(spec, block_rows=5000),
            checkpoint=Checkpoint(checkpoint),
            watch=Watch(should_stop=stop_after_three),
            threads=2,
        )
    job = load_checkpoint(checkpoint)
    assert job.threads == 2 and job.rows_done == 15000
    assert run_plan(job, threads=1).state == whole  # the checkpoint's thread count wins

    model = finalize(whole, n_components=32)
    output = str(tmp_path / "out.h5")
    reference = str(tmp_path / "reference.h5")
    apply_model(model, spec, reference, ApplyOptions(), ReadOptions(block_rows=5000), threads=2)
    calls["n"] = 0
    with pytest.raises(InterruptedRunError):
        apply_model(
            model,
            spec,
            output,
            ApplyOptions(progress_seconds=0),
            ReadOptions(block_rows=5000),
            threads=2,
            watch=Watch(should_stop=stop_after_three),
        )
    summary = apply_model(model, spec, output, ApplyOptions(), ReadOptions(block_rows=5000), threads=2)
    assert summary.resumed_at_row == 15000
    with open_source(output) as got, open_source(reference) as expected:
        np.testing.assert_array_equal(got.read(0, 20000), expected.read(0, 20000))


def test_job_file_apply_chunk_rows_below_one_is_refused(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(
        '[input]\npaths = ["x.h5"]\n[model]\npath = "m.npz"\n[apply]\noutput = "o/{stem}.zarr"\nchunk_rows = -2\n'
    )
    result = run_command("run", job)
    assert result.returncode == EXIT_BAD_INPUT, result.stderr
    assert result.stderr.count("\n") == 1
    assert "job.toml: chunk_rows in [apply] must be a whole number of at least 1, got -2" in result.stderr


FIELDS = "the fields are {stem} (the input's file name without extension) and {name} (the job's name)"


@pytest.mark.parametrize(
    "template, fragment",
    [
        ("o/{foo}.zarr", "unknown field {foo}"),
        ("o/{}.zarr", "positional field {} is not allowed"),
        ("o/{0}.zarr", "positional field {0} is not allowed"),
        ("o/{stem.upper}.zarr", "unknown field {stem.upper}"),
        ("o/{stem:{width}}.zarr", "unknown field {width}"),
        ("o/{stem:x}.zarr", "cannot be filled in (Unknown format code 'x' for object of type 'str')"),
        ("o/{stem!z}.zarr", "cannot be filled in (Unknown conversion specifier z)"),
        ("o/{stem.zarr", "not a valid template (expected '}' before end of string; write a literal brace as {{ or }})"),
        ("o/stem}.zarr", "not a valid template (Single '}' encountered in format string;"),
    ],
)
def test_job_file_output_templates_with_unusable_fields_are_refused(tmp_path, store, template, fragment):
    job = tmp_path / "job.toml"
    job.write_text(f'[input]\npaths = ["{store}"]\n[model]\npath = "m.npz"\n[apply]\noutput = "{template}"\n')
    result = run_command("run", job)
    assert result.returncode == EXIT_BAD_INPUT, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamwhiten: error: "), result.stderr
    assert f"{job}: output in [apply] ({template!r}): {fragment}" in lines[0] and FIELDS in lines[0]
    assert not (tmp_path / "m.npz").exists() and not (tmp_path / "o").exists()  # refused before any work


def test_job_file_output_template_with_both_fields_and_literal_braces(tmp_path, store):
    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "nightly"\n[input]\npaths = ["{store}"]\n[model]\npath = "m.npz"\nn_components = 4\n'
        '[apply]\noutput = "o/{name}-{{x}}-{stem}.zarr"\n'
    )
    result = run_command("run", job)
    assert result.returncode == 0, result.stderr
    assert os.listdir(tmp_path / "o") == ["nightly-{x}-big.zarr"]
