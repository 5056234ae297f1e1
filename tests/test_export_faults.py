"""Exports under faults (issues #23, #36): a failed directory fsync after the final rename, a full disk
as the summary is printed, and every export target written on a full disk (strace injects the failures;
the module is skipped when strace is missing or may not trace here)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import numpy as np
import pytest
from conftest import anisotropic
from strace_runs import CLI, STRACE_MARKS, TIMEOUT, Where, cli_env, file_tree, listing, run_cli, run_traced

pytestmark = STRACE_MARKS

# ------------------------------------------------------------------------ exports finished, then a fault


@pytest.mark.parametrize("name", ["map.npz", "map.onnx", pytest.param("st-modules", marks=pytest.mark.torch)])
def test_export_rerun_after_a_fault_past_its_final_rename(tmp_path, numba_cache, name):
    """Issue #23: when the directory fsync after an export's final rename fails (EIO), or the disk is full
    when its summary is printed, the export exits 74 with its file complete; a plain rerun then finds it
    up to date (exit 3, one line) and leaves it byte for byte as it was."""
    if name == "map.onnx":
        pytest.importorskip("onnx")
    if name == "st-modules":
        pytest.importorskip("sentence_transformers")
    work = tmp_path / "work"
    work.mkdir()
    np.save(work / "x.npy", anisotropic(400, 6, seed=2).astype(np.float32))
    assert run_cli(["fit", "x.npy", "-o", "model.npz", "-q"], work).returncode == 0
    extra = ["--format", "sentence-transformers"] if name == "st-modules" else []
    where = Where(str(work), str(tmp_path / "out.txt"), str(tmp_path / "err.txt"))
    trace = tmp_path / "trace.txt"
    # -P the directory: its first fsync is the one after the rename (a file's fsync names the file)
    result, script = run_traced(
        ["export", "model.npz", "-o", name, *extra], work, where, trace, ["fsync"], "fsync:error=EIO:when=1", str(work)
    )
    assert "(INJECTED)" in trace.read_text(), script
    assert result.returncode == 74, (script, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "written, but its directory could not be synced" in lines[0], result.stderr
    written = file_tree(work / name) if (work / name).is_dir() else (work / name).read_bytes()
    rerun = run_cli(["export", "model.npz", "-o", name, *extra], work)
    assert rerun.returncode == 3, rerun.stderr
    assert rerun.stderr.count("\n") == 1 and "nothing to do" in rerun.stderr and "up to date" in rerun.stderr
    assert (file_tree(work / name) if (work / name).is_dir() else (work / name).read_bytes()) == written
    os.remove(work / name) if (work / name).is_file() else shutil.rmtree(work / name)
    if not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)):
        pytest.skip("/dev/full is not the full-disk device on this machine (a regular file or missing)")
    with open("/dev/full", "w") as full:  # the disk fills as the summary is printed
        done = subprocess.run(
            [*CLI, "export", "model.npz", "-o", name, *extra],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
            cwd=work,
            timeout=TIMEOUT,
        )
    assert done.returncode == 74 and done.stderr.count("\n") == 1, done.stderr
    assert "cannot write the summary" in done.stderr and "the command itself completed" in done.stderr
    rerun = run_cli(["export", "model.npz", "-o", name, *extra], work)
    assert rerun.returncode == 3 and "up to date" in rerun.stderr, rerun.stderr
    assert sorted(os.listdir(work)) == sorted(["x.npy", "model.npz", name])


# ------------------------------------------------------------------ every export target, on a full disk


@pytest.mark.parametrize("name", ["map.npz", "map.safetensors", "map.onnx", "map.faiss", "st-modules"])
def test_every_export_target_on_a_full_disk_exits_74_and_leaves_nothing(tmp_path, numba_cache, name):
    """Issue #36: a write of an export that fails for want of space is an I/O error (exit 74, one line
    naming the output) whatever library writes it -- safetensors raised its own ``SafetensorError`` for
    the sentence-transformers modules (exit 1) -- and nothing is left behind. The file exports are written
    by us (the temporary file's first write fails); the modules' weights by safetensors (its first
    ``ftruncate``, the call that sizes the file it then fills, fails)."""
    if name in ("map.onnx", "map.safetensors"):
        pytest.importorskip("onnx" if name == "map.onnx" else "safetensors")
    if name == "map.faiss":
        pytest.importorskip("faiss")
    extra = []
    if name == "st-modules":
        pytest.importorskip("sentence_transformers")
        extra = ["--format", "sentence-transformers"]
    work = tmp_path / "work"
    work.mkdir()
    np.save(work / "x.npy", anisotropic(400, 6, seed=2).astype(np.float32))
    assert run_cli(["fit", "x.npy", "-o", "model.npz", "-q"], work).returncode == 0
    where = Where(str(work), str(tmp_path / "out.txt"), str(tmp_path / "err.txt"))
    trace = tmp_path / "trace.txt"
    if name == "st-modules":
        calls, inject, path = ["ftruncate"], "ftruncate:error=ENOSPC:when=1", None
    else:
        calls, inject, path = ["write", "writev"], "write:error=ENOSPC:when=1", f"{{work}}/.{name}.tmp-{{pid}}"
    result, script = run_traced(["export", "model.npz", "-o", name, *extra], work, where, trace, calls, inject, path)
    assert "(INJECTED)" in trace.read_text(), script
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 74, (script, result.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"streamwhiten: error: {name}: cannot write"), result.stderr
    assert "No space left on device" in lines[0], lines
    assert listing(work) == ["model.npz", "x.npy"]
    rerun = run_cli(["export", "model.npz", "-o", name, *extra], work)
    assert rerun.returncode == 0, rerun.stderr
