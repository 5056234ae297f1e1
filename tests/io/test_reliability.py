"""Nothing lost, nothing silently wrong: inputs are never written over, holes in a store are refused,
deleted shards are not kept silently, renames are durable, and leftovers of killed runs are cleaned up.

Fault injection (strace) lives in test_write_faults.py, damaged stores in test_damaged_chunks.py and
test_damaged_metadata.py."""

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr
from conftest import REPO, anisotropic, run_command, run_subprocess, write_h5, write_zarr

import streamwhiten._durable as durable
from streamwhiten.core.model import load_model
from streamwhiten.engine.engines import DaskEngine
from streamwhiten.engine.fit import remove_checkpoint
from streamwhiten.errors import MissingChunkError, StoreIOError
from streamwhiten.options import ApplyOptions, ReadOptions
from streamwhiten.output_plan import OutputPlan


def without_log(err: str) -> str:
    """stderr less the timestamped lines of `run`'s log."""
    return "\n".join(line for line in err.splitlines() if not re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", line))


def one_line(err: str, *fragments: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], err
    return lines[0]


@pytest.fixture
def rows():
    return anisotropic(1200, 8, seed=3).astype(np.float32)


def digest(path):
    if os.path.isdir(path):
        return sorted(
            (name, open(os.path.join(root, name), "rb").read()) for root, _, names in os.walk(path) for name in names
        )
    return open(path, "rb").read()


@pytest.mark.parametrize("kind", ["h5", "npy", "zarr"])
def test_fit_never_writes_its_model_over_an_input(tmp_path, rows, run_cli, kind):
    if kind == "h5":
        spec = write_h5(tmp_path / "x.h5", rows)
        target = tmp_path / "x.h5"
    elif kind == "npy":
        np.save(tmp_path / "x.npy", rows)
        spec = target = tmp_path / "x.npy"
    else:
        spec = target = write_zarr(tmp_path / "x.zarr", rows)
    before = digest(str(target))
    code, _, err = run_cli("fit", spec, "-o", target, "--overwrite")
    assert code == 2
    one_line(err, "would overwrite the input")
    link = tmp_path / f"link.{kind}"
    os.symlink(target, link)
    code, _, err = run_cli("fit", spec, "-o", link, "--overwrite")  # resolves to the input
    assert code == 2
    one_line(err, "would overwrite the input")
    if kind != "zarr":
        os.link(target, tmp_path / f"hard.{kind}")
        code, _, err = run_cli("fit", spec, "-o", tmp_path / f"hard.{kind}", "--overwrite")  # the same inode
        assert code == 2
        one_line(err, "would overwrite the input")
    else:
        code, _, err = run_cli("fit", spec, "-o", tmp_path / "x.zarr" / "model.npz")  # inside the input store
        assert code == 2
        one_line(err, "would overwrite the input")
    code, _, err = run_cli("fit", spec, "-o", tmp_path / "m.npz", "--checkpoint", target)
    assert code == 2
    one_line(err, "checkpoint would overwrite the input")
    assert digest(str(target)) == before
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".npz") or name.startswith(".")]


def test_apply_tune_report_and_run_never_write_over_an_input(tmp_path, rows, run_cli):
    spec = write_h5(tmp_path / "x.h5", rows)
    model = tmp_path / "m.npz"
    assert run_cli("fit", spec, "-o", model)[0] == 0
    before = {name: digest(str(tmp_path / name)) for name in ("x.h5", "m.npz")}
    code, _, err = run_cli("apply", model, spec, "-o", tmp_path / "x.h5:/y", "--overwrite")
    assert code == 2
    one_line(err, "output would overwrite the input")
    np.save(tmp_path / "a.npy", rows[:100])
    np.save(tmp_path / "b.npy", rows[100:200])
    np.save(tmp_path / "s.npy", np.arange(100, dtype=np.float64))
    pairs = ["--pairs-a", tmp_path / "a.npy", "--pairs-b", tmp_path / "b.npy", "--scores", tmp_path / "s.npy"]
    before.update({name: digest(str(tmp_path / name)) for name in ("a.npy", "b.npy", "s.npy")})
    code, _, err = run_cli("tune", model, *pairs, "-o", tmp_path / "s.npy", "--overwrite")
    assert code == 2
    one_line(err, "would overwrite the input")
    code, _, err = run_cli("tune", model, *pairs, "-o", model, "--overwrite")  # --in-place says so explicitly
    assert code == 2
    one_line(err, "would overwrite the input")
    code, _, err = run_cli("report", model, "-o", tmp_path / "m.npz", "--overwrite")
    assert code == 2
    job = tmp_path / "job.toml"
    job.write_text(
        textwrap.dedent(f"""
        [input]
        paths = ["{tmp_path / "x.h5"}"]
        [model]
        path = "{tmp_path / "j.npz"}"
        [apply]
        output = "{tmp_path}/{{stem}}.h5"
    """)
    )
    # `run` logs its progress on stderr with a timestamp (its record for cron): the failure is the one line
    # beside that log (it shows only where this test made the log's handler, so strip it either way)
    code, _, err = run_cli("run", job)
    assert code == 2
    one_line(without_log(err), "[apply] output would overwrite the input", "x.h5")
    code, _, err = run_cli("run", job, "--log-file", tmp_path / "x.h5")
    assert code == 2
    one_line(without_log(err), "log file would overwrite the input")
    assert {name: digest(str(tmp_path / name)) for name in before} == before
    assert not os.path.exists(tmp_path / "j.npz")


def test_update_refuses_a_recorded_shard_that_was_deleted(tmp_path, rows, run_cli):
    shards = [write_h5(tmp_path / f"day-{i}.h5", rows[i * 400 : (i + 1) * 400]) for i in range(3)]
    model = tmp_path / "m.npz"
    assert run_cli("fit", str(tmp_path / "day-*.h5:/emb"), "-o", model)[0] == 0
    before = open(model, "rb").read()
    os.remove(tmp_path / "day-1.h5")
    code, _, err = run_cli("fit", str(tmp_path / "day-*.h5:/emb"), "--update", model)
    assert code == 2
    one_line(err, "day-1.h5", "deleted", "400 rows", "refit from scratch")
    assert open(model, "rb").read() == before
    # A shard that still exists but is not named this time is kept, as before.
    write_h5(tmp_path / "day-1.h5", rows[400:800])
    write_h5(tmp_path / "day-3.h5", anisotropic(100, 8, seed=9).astype(np.float32))
    code, _, err = run_cli("fit", shards[0], str(tmp_path / "day-3.h5:/emb"), "--update", model)
    assert code == 0, err
    assert load_model(str(model)).n_rows == 1300


def test_dask_engine_refuses_a_missing_chunk(tmp_path, rows):
    pytest.importorskip("distributed")
    from streamwhiten.engine.distributed import fit_dask

    spec = write_zarr(tmp_path / "z.zarr", rows, chunk_rows=100)
    os.remove(os.path.join(spec, zarr.open_array(spec, mode="r").metadata.encode_chunk_key((4, 0))))
    with pytest.raises(MissingChunkError, match=r"rows 400\.\.499"):
        fit_dask(spec, cluster=DaskEngine(workers=1), read=ReadOptions(block_rows=300))
    result = fit_dask(spec, cluster=DaskEngine(workers=1), read=ReadOptions(block_rows=300, fill_missing_chunks=True))
    assert result.state.n_rows == 1200


def test_renames_that_make_files_final_fsync_their_directory(tmp_path, rows, monkeypatch):
    """A rename is durable only once its directory is fsynced: model, checkpoint, progress record, output."""
    from streamwhiten.core.model import finalize, save_model
    from streamwhiten.engine.apply import apply_model
    from streamwhiten.engine.fit import plan_fit, run_plan, save_checkpoint

    events = []
    real_replace, real_rename, real_fsync_dir = os.replace, os.rename, durable.fsync_dir

    def renamed(real):
        def rename(a, b):
            if os.path.dirname(os.path.abspath(b)) == str(tmp_path):  # not Numba's cache, if a kernel compiles now
                events.append(("rename", os.path.basename(b)))
            return real(a, b)

        return rename

    monkeypatch.setattr(os, "replace", renamed(real_replace))
    monkeypatch.setattr(os, "rename", renamed(real_rename))

    def fsync_dir(path):
        events.append(("fsync_dir", os.path.abspath(path)))
        real_fsync_dir(path)

    monkeypatch.setattr(durable, "fsync_dir", fsync_dir)
    spec = write_h5(tmp_path / "x.h5", rows)
    job = run_plan(plan_fit(spec, block_rows=300))
    save_checkpoint(job, str(tmp_path / "c.ckpt"))
    save_model(finalize(job.state), str(tmp_path / "m.npz"))
    apply_model(
        finalize(job.state), spec, str(tmp_path / "o.h5"), ApplyOptions(progress_seconds=0), ReadOptions(block_rows=300)
    )
    renamed = [i for i, event in enumerate(events) if event[0] == "rename"]
    assert {events[i][1] for i in renamed} >= {"c.ckpt", "m.npz", ".o.h5.partial.progress.json", "o.h5"}
    for i in renamed:  # every rename is followed by an fsync of the directory it happened in
        assert events[i + 1] == ("fsync_dir", str(tmp_path)), events


def test_leftovers_of_killed_writers_are_removed_by_the_next_one(tmp_path, rows, run_cli):
    spec = write_h5(tmp_path / "x.h5", rows)
    dead = 2**22 + 12345  # above pid_max's default: no such process
    while True:
        try:
            os.kill(dead, 0)
            dead += 1
        except ProcessLookupError:
            break
        except PermissionError:
            dead += 1
    stale = [
        tmp_path / f".m.npz.tmp-{dead}",
        tmp_path / f"..m.npz.checkpoint.tmp-{dead}",
        tmp_path / f"..o.zarr.partial.progress.json.tmp-{dead}",
    ]
    for path in stale:
        path.write_bytes(b"x" * 1000)
    alive = tmp_path / f".m.npz.tmp-{os.getppid()}"  # a writer still running: left alone
    alive.write_bytes(b"y")
    assert run_cli("fit", spec, "-o", tmp_path / "m.npz", "--chunk-rows", "300", "--checkpoint-every", "1")[0] == 0
    assert run_cli("apply", tmp_path / "m.npz", spec, "-o", tmp_path / "o.zarr")[0] == 0
    assert not any(path.exists() for path in stale)
    assert alive.exists()


def test_a_directory_output_moved_aside_by_a_killed_run_is_put_back(tmp_path, rows):
    out = tmp_path / "o.zarr"
    write_zarr(out, rows)
    aside = tmp_path / ".o.zarr.old-999999999"
    os.rename(out, aside)  # killed between moving the old output aside and renaming the new one in
    durable.remove_stale_temps(str(out))
    assert out.exists() and not aside.exists()
    np.testing.assert_array_equal(zarr.open_array(str(out), mode="r")[:], rows)


def test_lock_and_log_file_errors_name_the_file(tmp_path, rows):
    write_h5(tmp_path / "x.h5", rows)
    job = tmp_path / "job.toml"
    job.write_text(f'[input]\npaths = ["{tmp_path / "x.h5"}"]\n[model]\npath = "{tmp_path / "m" / "m.npz"}"\n')
    (tmp_path / "m").mkdir()
    os.mkdir(tmp_path / "m" / ".m.npz.lock")  # a lock path that cannot be opened as a file
    result = run_command("run", job)
    assert result.returncode == 74
    one_line(result.stderr, ".m.npz.lock", "lock file")
    shutil.rmtree(tmp_path / "m" / ".m.npz.lock")
    result = run_command("run", job, "--log-file", tmp_path / "no-such-dir" / "log.txt")
    assert result.returncode == 74
    one_line(result.stderr, "log.txt", "cannot open the log file")


def test_a_run_log_file_is_written_for_that_run_only(tmp_path, rows):
    """``run --log-file`` logs that run to the file and takes its handler away after it: a program (or a test)
    that calls the CLI again in the same process writes nothing more there."""
    import logging

    write_h5(tmp_path / "x.h5", rows)
    job = tmp_path / "job.toml"
    job.write_text(f'[input]\npaths = ["{tmp_path / "x.h5"}"]\n[model]\npath = "{tmp_path / "m.npz"}"\n')
    log = tmp_path / "run.log"
    assert run_command("run", job, "--log-file", log).returncode == 0
    written = log.read_text()
    assert "streamwhiten" in written
    assert not [h for h in logging.getLogger("streamwhiten").handlers if getattr(h, "baseFilename", None)]
    assert run_command("run", job).returncode == 3  # nothing to do, logged on stderr only
    assert log.read_text() == written


def test_remove_checkpoint_failure_names_it(tmp_path):
    path = tmp_path / "c.ckpt"
    path.mkdir()  # os.remove cannot remove a directory
    with pytest.raises(StoreIOError, match="c.ckpt: cannot remove the checkpoint"):
        remove_checkpoint(str(path))


def _flip_a_byte_in_the_middle(path, offset_fraction=0.5):
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.seek(int(size * offset_fraction))
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0x10]))


def test_checksum_codecs_turn_finite_garbage_into_a_clear_error(tmp_path, rows, run_cli):
    """What the README recommends for uncompressed stores: HDF5 fletcher32 and Zarr crc32c are verified
    on read, and a mismatch is damaged data (exit 2), not rows used silently."""
    import h5py
    from zarr.codecs import Crc32cCodec

    with h5py.File(tmp_path / "f.h5", "w") as handle:
        handle.create_dataset("emb", data=rows, chunks=(200, 8), fletcher32=True)
        offset = handle["emb"].id.get_chunk_info(3).byte_offset
    with open(tmp_path / "f.h5", "r+b") as handle:
        handle.seek(offset + 100)
        handle.write(b"\x00\x01\x02\x03")  # finite bytes: undetectable without the checksum
    code, _, err = run_cli("fit", tmp_path / "f.h5:/emb", "-o", tmp_path / "m1.npz")
    assert code == 2
    one_line(err, "f.h5:/emb", "damaged")
    array = zarr.create_array(
        store=str(tmp_path / "c.zarr"), shape=rows.shape, chunks=(200, 8), dtype=rows.dtype, compressors=[Crc32cCodec()]
    )  # uncompressed bytes plus a checksum
    array[...] = rows
    chunk = tmp_path / "c.zarr" / "c" / "3" / "0"
    _flip_a_byte_in_the_middle(chunk)
    code, _, err = run_cli("fit", tmp_path / "c.zarr", "-o", tmp_path / "m2.npz")
    assert code == 2
    one_line(err, "c.zarr", "damaged")
    assert not (tmp_path / "m1.npz").exists() and not (tmp_path / "m2.npz").exists()


def test_rerunning_a_finished_fit_is_nothing_to_do(tmp_path, rows, run_cli):
    """A fit whose model was saved (then, say, its summary could not be printed, or a signal came as
    it finished) is done: the same command again exits 3; other inputs or settings still need --overwrite."""
    spec = write_h5(tmp_path / "x.h5", rows)
    model = tmp_path / "m.npz"
    assert run_cli("fit", spec, "-o", model, "-k", "4")[0] == 0
    before = open(model, "rb").read()
    code, _, err = run_cli("fit", spec, "-o", model, "-k", "4")
    assert code == 3
    one_line(err, "nothing to do", "m.npz")
    for other in (["-k", "5"], ["-k", "4", "--precision", "float64"], ["-k", "4", "--skip-nonfinite"]):
        code, _, err = run_cli("fit", spec, "-o", model, *other)
        assert code == 2
        one_line(err, "already exists")
    write_h5(tmp_path / "y.h5", rows[::-1].copy())
    code, _, err = run_cli("fit", str(tmp_path / "y.h5:/emb"), "-o", model, "-k", "4")
    assert code == 2
    assert open(model, "rb").read() == before


def test_a_fit_without_parameters_is_not_current_for_a_model_fitted_with_them(tmp_path, rows, run_cli):
    spec = write_h5(tmp_path / "x.h5", rows)
    model = tmp_path / "m.npz"
    assert run_cli("fit", spec, "-o", model, "-k", "4")[0] == 0
    code, _, err = run_cli("fit", spec, "-o", model)  # would write all 8 components: not the same model
    assert code == 2
    one_line(err, "already exists")


def test_a_checkpoint_path_that_is_the_model_or_the_updated_model_is_refused(tmp_path, rows, run_cli):
    spec = write_h5(tmp_path / "x.h5", rows)
    model = tmp_path / "m.npz"
    code, _, err = run_cli("fit", spec, "-o", model, "--checkpoint", model)
    assert code == 2
    one_line(err, "both the model file and the checkpoint")
    assert not model.exists()
    assert run_cli("fit", spec, "-o", model)[0] == 0
    before = open(model, "rb").read()
    code, _, err = run_cli("fit", spec, "--update", model, "-o", tmp_path / "n.npz", "--checkpoint", model)
    assert code == 2
    one_line(err, "checkpoint would overwrite the input")
    assert open(model, "rb").read() == before


def test_apply_options_that_change_the_output_make_it_not_current(tmp_path, rows, run_cli):
    bad = rows.copy()
    bad[5] = np.nan
    spec = write_h5(tmp_path / "x.h5", bad)
    model = tmp_path / "m.npz"
    assert run_cli("fit", spec, "-o", model, "--skip-nonfinite")[0] == 0
    assert run_cli("apply", model, spec, "-o", tmp_path / "o.zarr", "--skip-nonfinite")[0] == 0
    assert run_cli("apply", model, spec, "-o", tmp_path / "o.zarr", "--skip-nonfinite")[0] == 3
    code, _, err = run_cli("apply", model, spec, "-o", tmp_path / "o.zarr")  # would refuse the NaN row
    assert code == 2
    code, _, err = run_cli("apply", model, spec, "-o", tmp_path / "o.zarr", "--skip-nonfinite", "--zarr-format", "2")
    assert code == 2
    one_line(err, "already exists")


def test_a_damaged_gzip_zarr_chunk_is_bad_input_not_an_io_error(tmp_path, rows, run_cli):
    from zarr.codecs import GzipCodec

    array = zarr.create_array(
        store=str(tmp_path / "g.zarr"), shape=rows.shape, chunks=(200, 8), dtype=rows.dtype, compressors=[GzipCodec()]
    )
    array[...] = rows
    with open(tmp_path / "g.zarr" / "c" / "1" / "0", "r+b") as handle:
        handle.write(b"garbage!")
    code, _, err = run_cli("fit", tmp_path / "g.zarr", "-o", tmp_path / "m.npz")
    assert code == 2
    one_line(err, "g.zarr", "damaged")


def test_a_sink_whose_partial_output_was_replaced_by_another_run_does_not_commit(tmp_path):
    from streamwhiten.io import open_output

    target = str(tmp_path / "o.h5")
    first = open_output(target).create(OutputPlan(100, 4, chunk_rows=50))
    first.write(0, np.ones((100, 4), np.float32))
    second = open_output(target).create(
        OutputPlan(100, 4, chunk_rows=50), overwrite=True
    )  # a second run of the same output
    second.write(0, np.ones((50, 4), np.float32))
    with pytest.raises(StoreIOError, match="replaced by another run"):
        first.commit()
    assert not os.path.exists(target)
    second.write(50, np.ones((50, 4), np.float32))
    second.commit()
    assert os.path.exists(target)


def test_a_signal_during_an_import_is_raised_after_the_import(tmp_path):
    """A KeyboardInterrupt raised inside an import breaks the module being imported (numba turned it
    into an ImportError with a traceback; at other moments the process died by SIGINT, exit -2)."""
    (tmp_path / "slow_module.py").write_text(
        textwrap.dedent("""
        import os, signal, time
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:  # Python code runs, so a handler would run here
            pass
        COMPLETE = True
    """)
    )
    script = textwrap.dedent("""
        import sys
        from streamwhiten.cli import _interrupt
        _interrupt.install()
        _interrupt.start_immediate()
        try:
            import slow_module
            import time
            time.sleep(5)
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted after the import:", getattr(sys.modules.get("slow_module"), "COMPLETE", False))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "interrupted after the import: True", (done.stdout, done.stderr)


# ------------------------------------------------------ issue #23: outputs never take a user's files


def users_things(directory: Path) -> dict:
    """Files and directories of a user's, at paths the commands below are pointed at as outputs."""
    (directory / "out.h5").mkdir()  # the attack of the issue: a directory where an HDF5 output goes
    (directory / "out.h5" / "thesis.txt").write_text("years of work")
    (directory / "out.zarr").mkdir()
    (directory / "out.zarr" / "notes.md").write_text("mine")
    with h5py.File(directory / "theirs.h5", "w") as handle:  # an HDF5 file of theirs, other datasets
        handle["results"] = np.arange(10.0)
    (directory / "table.parquet").write_bytes(b"PAR1 not really\n")
    (directory / "model.txt").write_text("not a model")
    (directory / "old.npz").write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip archive: an npz of nobody's
    (directory / "page.html").write_text("<html>my own page</html>")
    (directory / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(40))
    return {name: digest(str(directory / name)) for name in os.listdir(directory)}


@pytest.fixture
def fitted(tmp_path, rows, run_cli):
    """An input, a model fitted on it and a user's things beside them (with their digests)."""
    spec = write_h5(tmp_path / "in.h5", rows)
    assert run_cli("fit", spec, "-o", tmp_path / "m.npz", "-q")[0] == 0
    users = tmp_path / "users"
    users.mkdir()
    return spec, tmp_path / "m.npz", users, users_things(users)


def test_overwrite_never_replaces_a_users_file_or_directory(fitted, run_cli):
    """Every writer that takes --overwrite refuses to replace what it did not write (exit 2, one line
    naming the path and what is there), and leaves it byte for byte as it was."""
    spec, model, users, before = fitted
    np.save(users.parent / "a.npy", np.ones((20, 8), np.float32))
    np.save(users.parent / "s.npy", np.arange(20.0))
    pairs = [
        "--pairs-a",
        users.parent / "a.npy",
        "--pairs-b",
        users.parent / "a.npy",
        "--scores",
        users.parent / "s.npy",
    ]
    cases = [
        (["apply", model, spec, "-o", users / "out.h5"], "out.h5", "an HDF5 output", "(a directory)"),
        (["apply", model, spec, "-o", f"{users / 'out.h5'}:/emb"], "out.h5", "an HDF5 output", "(a directory)"),
        (["apply", model, spec, "-o", users / "out.zarr"], "out.zarr", "a Zarr output", "not a Zarr store"),
        (
            ["apply", model, spec, "-o", f"{users / 'theirs.h5'}:/emb"],
            "theirs.h5",
            "an HDF5 output",
            "did not write: /results",
        ),
        (["apply", model, spec, "-o", users / "table.parquet"], "table.parquet", "a Parquet output", "not a Parquet"),
        (["fit", spec, "-o", users / "old.npz"], "old.npz", "a model file", "an .npz archive"),
        (["fit", spec, "-o", users / "out.h5" / "m.npz"], None, None, None),  # a new file inside: fine
        (["tune", model, *pairs, "-o", users / "old.npz"], "old.npz", "a model file", "an .npz archive"),
        (["export", model, "-o", users / "old.npz"], "old.npz", "an npz export", "an .npz archive"),
        (["report", model, "-o", users / "page.html"], "page.html", "a report", "did not write"),
        (["report", model, "-o", users / "picture.png"], "picture.png", "a report", "a PNG image"),
    ]
    for args, name, what, found in cases:
        code, _, err = run_cli(*args, "--overwrite", "-q" if args[0] != "export" else "--json")
        if name is None:
            assert code == 0, err
            os.remove(users / "out.h5" / "m.npz")
            continue
        assert code == 2, (args, err)
        line = one_line(err, name, "exists and is not", "written by streamwhiten", "move it away")
        assert what in line and found in line, line
    assert {name: digest(str(users / name)) for name in os.listdir(users)} == before
    assert not [name for name in os.listdir(users) if name.startswith(".")]


def test_run_never_replaces_a_users_file_at_its_output_or_model_path(fitted):
    spec, _, users, before = fitted
    job = users.parent / "job.toml"
    job.write_text(f'[input]\npaths = ["{spec}"]\n[model]\npath = "{users / "old.npz"}"\n')
    result = run_command("run", job)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and "old.npz: exists and is not a model file written by streamwhiten" in lines[0]
    job.write_text(
        f'[input]\npaths = ["{spec}"]\n[model]\npath = "{users.parent / "j.npz"}"\n[apply]\noutput = "{users}/out.h5"\n'
    )
    result = run_command("run", job)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and "out.h5: exists and is not an HDF5 output" in lines[0], result.stderr
    assert {name: digest(str(users / name)) for name in os.listdir(users)} == before


def test_overwrite_replaces_an_output_of_ours_of_the_same_kind_only(tmp_path, rows, run_cli):
    """The positive side: each writer replaces its own earlier output with --overwrite; an output of
    another kind at the same path (a Zarr output where an HDF5 goes, a map where a model goes) is refused."""
    spec = write_h5(tmp_path / "in.h5", rows)
    model = tmp_path / "m.npz"
    assert run_cli("fit", spec, "-o", model, "-q")[0] == 0
    assert run_cli("fit", spec, "-o", model, "-q", "--overwrite", "-k", "3")[0] == 0
    for out in ("o.h5", "o.zarr", "o.parquet"):
        assert run_cli("apply", model, spec, "-o", tmp_path / out, "-q")[0] == 0
        code, _, err = run_cli("apply", model, spec, "-o", tmp_path / out, "-q", "--overwrite", "-k", "2")
        assert code == 0, err
        with open_source_of(tmp_path / out) as source:
            assert source.n_features == 2
    assert run_cli("export", model, "-o", tmp_path / "map.npz")[0] == 0
    code, _, err = run_cli("fit", spec, "-o", tmp_path / "map.npz", "--overwrite", "-q")
    assert code == 2
    one_line(err, "map.npz", "is not a model file", "an exported affine map")
    os.rename(tmp_path / "o.zarr", tmp_path / "z.h5")  # a Zarr output of ours, named like an HDF5 one
    code, _, err = run_cli("apply", model, spec, "-o", tmp_path / "z.h5", "--overwrite", "-q")
    assert code == 2
    one_line(err, "z.h5", "is not an HDF5 output", "(a directory)")
    leftover = [name for name in os.listdir(tmp_path) if name.startswith(".")]
    assert leftover == [], leftover


def open_source_of(path):
    from streamwhiten.io import open_source

    return open_source(str(path))


def test_two_applies_of_one_output_the_second_exits_75(tmp_path, rows):
    """Two applies of one output started a second apart: the second exits 75 (one line, naming the output
    and the first one's pid) and touches nothing; the first finishes; the lock file goes with it."""
    spec = write_h5(tmp_path / "in.h5", np.tile(rows, (20, 1)))
    model = tmp_path / "m.npz"
    assert run_command("fit", spec, "-o", model, "-q").returncode == 0
    out = tmp_path / "out.h5"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    first = subprocess.Popen(
        [sys.executable, "-m", "streamwhiten", "apply", model, spec, "-o", out, "-q", "--chunk-rows", "1200"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lock = tmp_path / ".out.h5.lock"
    deadline = time.monotonic() + 60
    while not (lock.exists() and lock.read_text().strip() == str(first.pid)):
        assert time.monotonic() < deadline and first.poll() is None, "the first apply never took the lock"
        time.sleep(0.005)
    os.kill(first.pid, signal.SIGSTOP)  # hold the first one inside its locked section
    try:
        second = run_command("apply", model, spec, "-o", out, "-q")
        also = run_command("apply", model, spec, "-o", f"{out}:/other", "-q", "--overwrite")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    _, first_err = first.communicate(timeout=120)
    assert first.returncode == 0, first_err
    for result in (second, also):
        assert result.returncode == 75, result.stderr
        one_line(result.stderr, "out.h5", "another run is writing this output", str(first.pid))
    with h5py.File(out, "r") as handle:
        assert handle["embeddings"].shape == (len(rows) * 20, 8) and handle["embeddings"].attrs["complete"]
    assert sorted(os.listdir(tmp_path)) == ["in.h5", "m.npz", "out.h5"]
    assert run_command("apply", model, spec, "-o", out, "-q").returncode == 3


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", "."])
def test_a_job_name_cannot_take_outputs_out_of_their_folder(tmp_path, rows, name):
    spec = write_h5(tmp_path / "in.h5", rows)
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    job = work / "job.toml"
    job.write_text(
        f'name = "{name}"\n[input]\npaths = ["{spec}"]\n[model]\npath = "m.npz"\n[apply]\noutput = "out/{{name}}.h5"\n'
    )
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    result = run_command("run", job)
    assert result.returncode == 2, result.stderr
    one_line(result.stderr, "job.toml", "{name}", repr(name), "path separator", "stay in its folder")
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    job.write_text(
        f'name = "{name}"\n[input]\npaths = ["{spec}"]\n[model]\npath = "m.npz"\n[apply]\noutput = "out/{{stem}}.h5"\n'
    )
    assert run_command("run", job).returncode == 0  # a name that no output uses is only a name


def test_each_writer_tells_the_kind_of_its_output_from_its_name(tmp_path, rows, run_cli):
    """Model files end in .npz, exports in their format's extensions, apply outputs in a store's: a name
    that tells none is refused (exit 2, one line listing what is accepted) before anything is written."""
    spec = write_h5(tmp_path / "in.h5", rows)
    model = tmp_path / "m.npz"
    assert run_cli("fit", spec, "-o", model, "-q")[0] == 0
    np.save(tmp_path / "a.npy", rows[:50])
    np.save(tmp_path / "s.npy", np.arange(50.0))
    pairs = ["--pairs-a", tmp_path / "a.npy", "--pairs-b", tmp_path / "a.npy", "--scores", tmp_path / "s.npy"]
    before = sorted(os.listdir(tmp_path))
    for args, fragments in [
        (["fit", spec, "-o", tmp_path / "out.txt"], ["out.txt", "a model file's name must end in .npz"]),
        (["fit", spec, "-o", tmp_path / "model"], ["model", "must end in .npz"]),
        (["tune", model, *pairs, "-o", tmp_path / "tuned.txt"], ["tuned.txt", "must end in .npz"]),
        (["apply", model, spec, "-o", tmp_path / "x.npy"], ["x.npy", "output must end in .zarr, .parquet, .lance"]),
        (["export", model, "-o", tmp_path / "x.txt"], ["x.txt", "cannot tell the export format", ".npz"]),
        (["export", model, "-o", tmp_path / "x.txt", "--format", "npz"], ["x.txt", "npz export must end in .npz"]),
        (["export", model, "-o", tmp_path / "x.npz", "--format", "onnx"], ["x.npz", "must end in .onnx"]),
        (
            ["export", model, "-o", tmp_path / "x.onnx", "--format", "sentence-transformers"],
            ["x.onnx", "a directory, whose name must not end in .onnx"],
        ),
        (["report", model, "-o", tmp_path / "r.pdf"], ["r.pdf", "a report is .html, .png or a directory"]),
    ]:
        code, _, err = run_cli(*args, "-q") if args[0] != "export" else run_cli(*args)
        assert code == 2, (args, err)
        one_line(err, *fragments)
    assert sorted(os.listdir(tmp_path)) == before


def test_a_stem_cannot_take_an_output_out_of_its_folder():
    """{stem} is a file name without its extension, so it holds no separator; '..' (an input named
    'dir/..') and '.' are refused all the same, naming the input."""
    from streamwhiten.errors import BadInputError
    from streamwhiten.job.file import output_for as _output_for

    assert _output_for("out/{stem}.h5", "data/day-1.h5:/emb", "job") == "out/day-1.h5"
    for spec in ("data/..", "data/."):
        with pytest.raises(BadInputError, match=r"\{stem\} in the \[apply\] output would be '\.\.?', from the input"):
            _output_for("out/{stem}.h5", spec, "job", "job.toml")


# ------------------------------------------------------------------- signals as a command finishes


def _disposition(pid: int, signum: int) -> str:
    """``"caught"``, ``"ignored"`` or ``"default"`` for ``signum`` in process ``pid`` (from /proc), or
    ``"gone"``."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            fields = dict(line.split(":", 1) for line in handle if ":" in line)
    except OSError:
        return "gone"
    bit = 1 << (signum - 1)
    if int(fields["SigCgt"].strip(), 16) & bit:
        return "caught"
    if int(fields["SigIgn"].strip(), 16) & bit:
        return "ignored"
    return "default"


@pytest.fixture(scope="module")
def finishing(tmp_path_factory):
    """An input, the model and the apply output of clean runs, and the seconds each command takes."""
    import time

    base = tmp_path_factory.mktemp("finishing")
    spec = write_h5(base / "in.h5", anisotropic(20_000, 48, seed=8).astype(np.float32), chunk_rows=2_000)
    commands = {
        "fit": lambda d: ["fit", spec, "-o", d / "model.npz", "--threads", "2", "-q"],
        "apply": lambda d: ["apply", base / "model.npz", spec, "-o", d / "out.zarr", "-k", "16", "-q"],
        "export": lambda d: ["export", base / "model.npz", "-o", d / "map.npz", "-k", "16"],
    }
    assert run_command(*commands["fit"](base)).returncode == 0  # the model apply and export read
    seconds = {}
    for attempt in ("warm", "ref"):  # the second, timed, run finds the caches (numba's, the page cache) warm
        (base / attempt).mkdir()
        for name, args in commands.items():
            began = time.monotonic()
            done = run_subprocess(*args(base / attempt))  # a process: the moments are times of a process
            seconds[name] = time.monotonic() - began
            assert done.returncode == 0, done.stderr
    return base, commands, seconds


OUTPUT = {"fit": "model.npz", "apply": "out.zarr", "export": "map.npz"}


def _same_output(name: str, path: Path, reference: Path) -> bool:
    if name == "apply":
        ours, theirs = zarr.open_array(str(path), mode="r"), zarr.open_array(str(reference), mode="r")
        return np.array_equal(ours[...], theirs[...]) and dict(ours.attrs) == dict(theirs.attrs)
    with np.load(path) as ours, np.load(reference) as theirs:
        return sorted(ours.files) == sorted(theirs.files) and all(
            ours[key].dtype == theirs[key].dtype and ours[key].tobytes() == theirs[key].tobytes() for key in ours.files
        )


@pytest.mark.slow
@pytest.mark.parametrize("command", ["fit", "apply", "export"])
def test_a_signal_near_the_end_never_kills_and_the_exit_code_says_what_is_on_disk(finishing, command):
    """SIGTERM or SIGINT at random moments around the end of a short command (from 60% of its clean run's
    time to past its end): once the handlers are installed the process is never killed by the signal;
    exit 0 means the output is complete and the same as a clean run's (and stderr is empty or one note
    that the signal came too late), exit 130 means it is absent (one line) and a rerun makes it."""
    import random
    import signal
    import time

    base, commands, seconds = finishing
    rng = random.Random(f"finishing-{command}")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    seen, problems = {}, []
    # The clean run's time was measured once; on a loaded machine a later run can be much faster or
    # slower, so the moments follow what the trials see: a process already gone brings them earlier, one
    # without its handlers yet later, until enough signals have been sent (or the trials run out).
    scale, sent, trial = seconds[command], 0, 0
    while sent < 8 and trial < 40:
        trial += 1
        work = base / f"{command}-{trial}"
        work.mkdir()
        signum = rng.choice([signal.SIGTERM, signal.SIGINT])
        when = scale * rng.uniform(0.6, 1.15)
        process = subprocess.Popen(
            [sys.executable, "-m", "streamwhiten", *map(str, commands[command](work))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        began, installed = time.monotonic(), False
        while time.monotonic() - began < when and process.poll() is None:
            installed = installed or _disposition(process.pid, signum) == "caught"
            time.sleep(0.002)
        state = _disposition(process.pid, signum) if process.poll() is None else "gone"
        if installed and state == "default":
            state = "default again"  # the handler was there, and was taken away: a signal now kills
        if state in ("caught", "ignored", "default again"):
            process.send_signal(signum)
            sent += 1
        elif state == "gone":
            scale *= 0.8
        elif not installed:
            scale *= 1.25
        _, err = process.communicate(timeout=120)
        code, lines = process.returncode, err.splitlines()
        seen[(state, code)] = seen.get((state, code), 0) + 1
        what = f"trial {trial}: {signal.Signals(signum).name} at {when:.2f} s ({state}): exit {code}, stderr {lines!r}"
        output, reference = work / OUTPUT[command], base / "ref" / OUTPUT[command]
        if state not in ("caught", "ignored", "default again"):
            continue  # not sent: before the handlers were installed, or after the exit
        if code < 0:
            problems.append(f"{what}: killed by the signal")
        elif code == 0:
            if not (output.exists() and _same_output(command, output, reference)):
                problems.append(f"{what}: exit 0 but the output is not a clean run's")
            if lines and (len(lines) != 1 or "too late to stop the command" not in lines[0]):
                problems.append(f"{what}: exit 0 with stderr other than one note")
        elif code == 130:
            if output.exists():
                problems.append(f"{what}: exit 130 but the output is there")
            if len(lines) != 1 or not lines[0].startswith("streamwhiten:"):
                problems.append(f"{what}: exit 130 without exactly one line")
            rerun = run_command(*commands[command](work))
            if rerun.returncode not in (0, 3) or not _same_output(command, output, reference):
                problems.append(f"{what}: the rerun exited {rerun.returncode} ({rerun.stderr.strip()!r})")
        else:
            problems.append(f"{what}: exit {code} is neither done (0) nor interrupted (130)")
        if "Traceback" in err:
            problems.append(f"{what}: a traceback")
    assert not problems, "\n".join(problems) + f"\n(disposition, exit code) counts: {seen}"
    assert sent >= 4, f"too few signals sent (the timings of the clean runs: {seconds}): {seen}"


def test_after_a_signal_a_failing_destructor_adds_no_traceback(tmp_path):
    """A KeyboardInterrupt raised inside a library's constructor (zipfile's, while a model loads) leaves a
    half-built object whose destructor fails later: after a signal that is noise beside the one line."""
    script = textwrap.dedent("""
        import gc
        from streamwhiten.cli import _interrupt

        class HalfBuilt:
            def __del__(self):
                raise AttributeError("'HalfBuilt' object has no attribute '_writing'")

        _interrupt.install()
        HalfBuilt()  # no signal yet: Python reports it, as always
        gc.collect()
        _interrupt.requested.set()
        HalfBuilt()
        gc.collect()
        print("done")
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    assert done.stderr.count("Exception ignored") == 1, done.stderr
