"""The command line: every bad input from the engine issue gets one clear line and a non-zero exit."""

import json
import os

import h5py
import numpy as np
import pytest
import zarr
from conftest import anisotropic, run_command, write_h5, write_zarr

from streamwhiten.errors import EXIT_BAD_INPUT


@pytest.fixture
def store(tmp_path):
    return write_h5(tmp_path / "in.h5", anisotropic(600, 10, seed=3).astype(np.float32), chunk_rows=64)


@pytest.fixture
def model_path(tmp_path, store, run_cli):
    path = str(tmp_path / "model.npz")
    code, _, err = run_cli("fit", store, "-o", path, "-q")
    assert code == 0, err
    return path


def one_line_error(err: str, *fragments: str) -> None:
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1, err
    assert lines[0].startswith("streamwhiten: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], err


def test_fit_apply_info_happy_path(tmp_path, store, model_path, run_cli):
    code, out, _ = run_cli("info", model_path)
    assert code == 0 and "D_eff" in out and "600 rows" in out
    code, out, _ = run_cli("info", model_path, "--json")
    summary = json.loads(out)
    assert summary["n_rows"] == 600 and summary["n_features"] == 10 and summary["effective_dimension"] > 1
    code, out, err = run_cli(
        "apply", model_path, store, "-o", tmp_path / "out.zarr", "-k", "4", "--normalize", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["n_components"] == 4
    assert zarr.open_array(str(tmp_path / "out.zarr"), mode="r").shape == (600, 4)


def test_fit_with_variance_and_glob(tmp_path, run_cli):
    for day in range(3):
        write_h5(tmp_path / f"day-{day}.h5", anisotropic(100, 6, seed=day).astype(np.float32))
    code, out, err = run_cli("fit", str(tmp_path / "day-*.h5"), "-o", tmp_path / "m.npz", "--variance", "0.9", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["n_rows"] == 300 and summary["explained_variance"] >= 0.9


def test_missing_file_and_dataset(tmp_path, store, run_cli):
    code, _, err = run_cli("fit", tmp_path / "nope.h5", "-o", tmp_path / "m.npz")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "nope.h5", "no such file")
    code, _, err = run_cli("fit", store.replace(":/emb", ":/missing"), "-o", tmp_path / "m.npz")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "in.h5", "has no 2-D dataset /missing; its 2-D datasets: /emb")
    code, _, err = run_cli("fit", tmp_path / "nope.zarr", "-o", tmp_path / "m.npz")
    assert code == EXIT_BAD_INPUT
    assert not os.path.exists(tmp_path / "m.npz")


@pytest.mark.parametrize(
    "shape, dtype, fragment",
    [
        ((50,), "f4", "expected a 2-D array"),
        ((5, 4, 3), "f4", "3-D"),
        ((50, 4), "i4", "dtype int32"),
        ((50, 4), "S8", "dtype |S8"),
        ((0, 4), "f4", "has 0 row(s)"),
        ((1, 4), "f4", "has 1 row(s)"),
    ],
)
def test_unusable_arrays(tmp_path, run_cli, shape, dtype, fragment):
    with h5py.File(tmp_path / "bad.h5", "w") as handle:
        handle.create_dataset("x", shape=shape, dtype=dtype)
    code, _, err = run_cli("fit", f"{tmp_path}/bad.h5:/x", "-o", tmp_path / "m.npz")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "bad.h5:/x", fragment)
    assert not os.path.exists(tmp_path / "m.npz")


def test_unusable_zarr_array(tmp_path, run_cli):
    zarr.create_array(store=str(tmp_path / "ints.zarr"), shape=(10, 3), chunks=(5, 3), dtype="i8")
    code, _, err = run_cli("fit", tmp_path / "ints.zarr", "-o", tmp_path / "m.npz")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "ints.zarr", "dtype int64")


def test_nonfinite_rows(tmp_path, run_cli):
    rows = anisotropic(300, 5).astype(np.float32)
    rows[[123, 200]] = [np.nan] * 5
    rows[250, 1] = np.inf
    spec = write_h5(tmp_path / "nan.h5", rows, chunk_rows=50)
    code, _, err = run_cli("fit", spec, "-o", tmp_path / "m.npz")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "nan.h5:/emb", "row 123 holds NaN or Inf", "--skip-nonfinite")
    assert not os.path.exists(tmp_path / "m.npz")
    code, out, err = run_cli("fit", spec, "-o", tmp_path / "m.npz", "--skip-nonfinite", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["n_rows"] == 297 and summary["info"]["n_skipped_nonfinite"] == 3


def test_apply_to_data_of_another_width(tmp_path, model_path, run_cli):
    narrow = write_zarr(tmp_path / "narrow.zarr", anisotropic(40, 7).astype(np.float32))
    code, _, err = run_cli("apply", model_path, narrow, "-o", tmp_path / "o.h5")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "narrow.zarr", "7 columns", "fitted on 10")
    assert not os.path.exists(tmp_path / "o.h5")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["-k", "11"], "exceeds the data width d = 10"),
        (["-k", "0"], "n_components (k) must be a whole number of at least 1, got 0"),
        (["--beta", "1.5"], "beta must be a number in [0, 1]"),
        (["--gamma", "-0.5"], "gamma must be a number in [0, 1]"),
        (["--variance", "0"], "variance must be a fraction"),
        (["--precision", "float16"], "Invalid value for '--precision'"),
    ],
)
def test_bad_parameters(tmp_path, store, run_cli, args, fragment):
    code, _, err = run_cli("fit", store, "-o", tmp_path / "m.npz", *args)
    assert code == EXIT_BAD_INPUT
    assert fragment in err
    assert not os.path.exists(tmp_path / "m.npz")


def test_bad_parameters_on_apply(tmp_path, store, model_path, run_cli):
    code, _, err = run_cli("apply", model_path, store, "-o", tmp_path / "o.h5", "-k", "20")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "exceeds the data width d = 10")
    assert not os.path.exists(tmp_path / "o.h5")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["fit", "{store}"], "give the model file to write with -o/--output"),
        (
            ["fit", "{store}", "-o", "{npz}", "-k", "3", "--variance", "0.9"],
            "give n_components (k) or variance, not both",
        ),
        (["fit", "{store}", "-o", "{npz}", "--scheduler", "tcp://h:1"], "--scheduler and --workers need --engine dask"),
        (["apply", "{model}", "{store}", "-o", "{h5}", "--dtype", "int8", "--skip-nonfinite"], "cannot hold the NaN"),
        (["eval", "--pairs-a", "{store}", "--pairs-b", "{store}", "--scores", "{store}", "-k", "3"], "need a MODEL"),
        (["export", "{model}", "-o", "{npz}", "-k", "3", "--variance", "0.5"], "give n_components (k) or variance"),
    ],
)
def test_options_refused_as_they_become_the_librarys_objects(tmp_path, store, model_path, run_cli, args, fragment):
    """The option groups a command is handed as objects (a setting, an engine, the fit or apply options)
    refuse what does not go together in one line, exit 2, before anything is read or written."""
    paths = {"store": store, "model": model_path, "npz": tmp_path / "o.npz", "h5": tmp_path / "o.h5"}
    code, out, err = run_cli(*(arg.format(**paths) for arg in args))
    assert code == EXIT_BAD_INPUT and out == ""
    one_line_error(err, fragment)
    assert not (tmp_path / "o.npz").exists() and not (tmp_path / "o.h5").exists()


def test_corrupt_truncated_and_foreign_model_files(tmp_path, store, model_path, run_cli):
    raw = open(model_path, "rb").read()
    cases = {
        "truncated.npz": raw[: len(raw) // 2],
        "flipped.npz": raw[:1000] + bytes([raw[1000] ^ 0xFF]) + raw[1001:],
        "empty.npz": b"",
        "text.npz": b"not a model",
    }
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        for command in (["info", tmp_path / name], ["apply", tmp_path / name, store, "-o", tmp_path / "o.h5"]):
            code, _, err = run_cli(*command)
            assert code == EXIT_BAD_INPUT, (name, err)
            one_line_error(err, name)
    code, _, err = run_cli("info", tmp_path / "absent.npz")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "absent.npz", "not found")
    assert not os.path.exists(tmp_path / "o.h5")


def test_existing_outputs_are_never_replaced_without_overwrite(tmp_path, store, model_path, run_cli):
    before = open(model_path, "rb").read()
    code, _, err = run_cli("fit", store, "-o", model_path, "--beta", "0")
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "model.npz", "already exists", "--overwrite")
    assert open(model_path, "rb").read() == before
    out = tmp_path / "o.h5"
    assert run_cli("apply", model_path, store, "-o", out)[0] == 0
    stamp = os.stat(out).st_mtime_ns
    code, _, err = run_cli("apply", model_path, store, "-o", out, "-k", "4")  # another setting: not replaced
    assert code == EXIT_BAD_INPUT
    one_line_error(err, "o.h5", "already exists")
    assert os.stat(out).st_mtime_ns == stamp
    code, _, err = run_cli("apply", model_path, store, "-o", out)  # the same command again: up to date
    assert code == 3 and err.count("\n") == 1 and "up to date" in err
    assert os.stat(out).st_mtime_ns == stamp
    assert run_cli("apply", model_path, store, "-o", out, "--overwrite", "-k", "3")[0] == 0
    with h5py.File(out) as handle:
        assert handle["embeddings"].shape == (600, 3)


def test_usage_errors_exit_non_zero(run_cli):
    code, _, err = run_cli("fit")
    assert code == 2 and "Missing argument" in err
    code, _, err = run_cli("bogus")
    assert code == 2


def test_real_process_exit_codes(tmp_path, store):
    ok = run_command("fit", store, "-o", tmp_path / "m.npz")
    assert ok.returncode == 0, ok.stderr
    assert "fitted 600 rows" in ok.stdout and ok.stderr == ""  # no progress bar off a terminal
    bad = run_command("fit", tmp_path / "missing.h5", "-o", tmp_path / "m2.npz")
    assert bad.returncode == EXIT_BAD_INPUT
    assert bad.stderr.strip().count("\n") == 0 and "missing.h5" in bad.stderr


def test_demo_runs(run_cli, tmp_path):
    code, out, err = run_cli("demo", "--rows", "30000", "--dim", "32", "-k", "8", "--dir", tmp_path, "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["n_chunks"] > 1
    assert summary["identity_error"] < 1e-2  # the whitened output has identity covariance
    assert abs(summary["mean_cosine_whitened"]) < 0.1 < summary["mean_cosine_raw"]
    assert sorted(os.listdir(tmp_path)) == ["demo-embeddings.h5", "demo-model.npz", "demo-whitened.zarr"]


def test_json_is_strict_and_foreign_files_are_named(tmp_path, run_cli):
    rows = np.full((20, 5), 3.0)  # identical rows: every eigenvalue is 0, the condition number infinite
    model = tmp_path / "const.npz"
    assert run_cli("fit", write_h5(tmp_path / "c.h5", rows), "-o", model, "-q")[0] == 0
    code, out, _ = run_cli("info", model, "--json")
    assert code == 0 and "Infinity" not in out and json.loads(out)["condition_number"] is None
    np.save(tmp_path / "plain.npy", np.zeros(3))
    np.savez(tmp_path / "foreign.npz", a=np.zeros(3))
    for name, fragment in (("plain.npy", "plain .npy array"), ("foreign.npz", "not written by streamwhiten")):
        code, _, err = run_cli("info", tmp_path / name)
        assert code == EXIT_BAD_INPUT
        one_line_error(err, name, fragment)


def test_colons_in_file_names_are_not_dataset_separators(tmp_path, store, model_path, run_cli):
    out = tmp_path / "run-2024-01-01T00:00.h5"
    code, _, err = run_cli("apply", model_path, store, "-o", out)
    assert code == 0, err
    assert out.exists()


def test_usage_errors_are_one_line(run_cli):
    code, _, err = run_cli("fit")
    assert code == 2
    one_line_error(err, "Missing argument", "--help")


@pytest.mark.parametrize("flag,direct", [([], True), (["--no-direct-io"], False)])
def test_direct_io_option_reaches_the_output_writer(tmp_path, store, run_cli, monkeypatch, flag, direct):
    import streamwhiten.io.hdf5
    import streamwhiten.io.zarr

    asked = []
    for backend in (streamwhiten.io.hdf5, streamwhiten.io.zarr):  # every writer of output chunks
        real = backend.ChunkFile
        monkeypatch.setattr(
            backend, "ChunkFile", lambda *a, real=real, **k: asked.append(k.get("direct")) or real(*a, **k)
        )
    model = tmp_path / "m.npz"
    assert run_cli("fit", store, "-o", model, "-k", 4, "-q")[0] == 0
    for output in ("out.h5", "out.zarr"):
        code, _, err = run_cli("apply", model, store, "-o", tmp_path / output, "-q", *flag)
        assert code == 0, err
    assert len(asked) >= 2 and set(asked) == {direct}
    code, _, err = run_cli(
        "apply", model, store, "-o", tmp_path / "d.zarr", "--engine", "dask", *(flag or ["--direct-io"])
    )
    assert code == 2 and "--direct-io/--no-direct-io is for the serial engine" in err


def test_threads_option(tmp_path, store, run_cli):
    from streamwhiten.core.model import load_model

    models = {}
    for threads in (1, 3):
        path = str(tmp_path / f"model{threads}.npz")
        code, _, err = run_cli("fit", store, "-o", path, "--chunk-rows", "64", "--threads", threads, "-q")
        assert code == 0, err
        models[threads] = load_model(path)
        code, _, err = run_cli("apply", path, store, "-o", tmp_path / f"out{threads}.h5", "--threads", threads, "-q")
        assert code == 0, err
    np.testing.assert_allclose(models[3].state.scatter, models[1].state.scatter, rtol=1e-6, atol=1e-9)
    with h5py.File(tmp_path / "out1.h5") as one, h5py.File(tmp_path / "out3.h5") as three:
        np.testing.assert_allclose(three["embeddings"][:], one["embeddings"][:], rtol=1e-4, atol=1e-5)
    code, _, err = run_cli("fit", store, "-o", tmp_path / "m.npz", "--threads", "0")
    assert code == EXIT_BAD_INPUT and "--threads" in err
    code, _, err = run_cli("fit", store, "-o", tmp_path / "m.npz", "--threads", "2", "--engine", "dask")
    one_line_error(err, "--threads is for the serial engine")
    assert code == EXIT_BAD_INPUT


@pytest.mark.parametrize(
    "args, fragment",
    [
        # the words of streamwhiten.params, as in Python and in job files
        (
            ["--checkpoint-every", "0"],
            "Invalid value for '--checkpoint-every': checkpoint_every must be a whole number of at least 1, got 0",
        ),
        (
            ["--checkpoint-every", "-3"],
            "Invalid value for '--checkpoint-every': checkpoint_every must be a whole number of at least 1, got -3",
        ),
        (
            ["--checkpoint-seconds", "0"],
            "Invalid value for '--checkpoint-seconds': checkpoint_seconds must be a number of seconds above 0, got 0.0",
        ),
        (
            ["--checkpoint-seconds", "-1"],
            "Invalid value for '--checkpoint-seconds': checkpoint_seconds must be a number of seconds above 0, got -1.0",
        ),
    ],
)
def test_fit_refuses_checkpoint_intervals_below_one(tmp_path, store, args, fragment):
    result = run_command("fit", store, "-o", tmp_path / "m.npz", *args)
    assert result.returncode == EXIT_BAD_INPUT
    one_line_error(result.stderr, fragment, "(see --help)")
    assert not os.path.exists(tmp_path / "m.npz")


def test_checkpoint_interval_limits_that_stay_allowed(tmp_path, store, model_path, run_cli):
    code, _, err = run_cli(
        "fit", store, "-o", tmp_path / "m.npz", "--checkpoint-every", "1", "--checkpoint-seconds", "0.001", "-q"
    )
    assert code == 0, err
    # apply: 0 seconds means a progress record after every block
    code, _, err = run_cli("apply", model_path, store, "-o", tmp_path / "o.zarr", "--checkpoint-seconds", "0", "-q")
    assert code == 0, err


@pytest.mark.parametrize(
    "command, args, fragment",
    [
        # issue #36: numeric options are checked against real limits, by name
        ("apply", ["--threads", "100000"], "threads must be a whole number from 1 to 1024 (or -1 for one per core)"),
        ("fit", ["--threads", "-2"], "threads must be a whole number from 1 to 1024 (or -1 for one per core)"),
        ("eval", ["--bootstrap", "-1"], "bootstrap must be a whole number of resamples from 0 to 100,000, got -1"),
        ("eval", ["--bootstrap", "1000001"], "bootstrap must be a whole number of resamples from 0 to 100,000"),
        ("tune", ["--bootstrap", "-1"], "bootstrap must be a whole number of resamples from 0 to 100,000, got -1"),
        ("fit", ["--engine", "dask", "--workers", "5000"], "workers must be a whole number from 1 to 1024"),
    ],
)
def test_numeric_options_beyond_their_limits_are_refused_by_name(tmp_path, store, model_path, command, args, fragment):
    lead = {"apply": [model_path, store, "-o", tmp_path / "o.zarr"], "fit": [store, "-o", tmp_path / "m.npz"]}
    lead.update(eval=[model_path, "--queries", store, "--corpus", store, "--qrels", tmp_path / "q.tsv"])
    lead.update(tune=[model_path, "--queries", store, "--corpus", store, "--qrels", tmp_path / "q.tsv"])
    before = sorted(os.listdir(tmp_path))
    result = run_command(command, *lead[command], *args)
    assert result.returncode == EXIT_BAD_INPUT, result.stderr
    one_line_error(result.stderr, fragment)
    assert sorted(os.listdir(tmp_path)) == before


def test_numeric_options_at_their_documented_ends_are_taken(tmp_path, store, model_path, run_cli):
    """``--threads -1`` is one per core and a block larger than the input reads it as one block, as the
    help says (issue #36); the output equals the default run's."""
    assert run_cli("apply", model_path, store, "-o", tmp_path / "a.h5", "-q")[0] == 0
    code, _, err = run_cli(
        "apply", model_path, store, "-o", tmp_path / "b.h5", "--threads", "-1", "--chunk-rows", 10**12, "-q"
    )
    assert code == 0, err
    with h5py.File(tmp_path / "a.h5") as one, h5py.File(tmp_path / "b.h5") as two:
        np.testing.assert_allclose(two["embeddings"][:], one["embeddings"][:], rtol=1e-5, atol=1e-6)
    code, text, _ = run_cli("apply", "--help")
    assert "-1: one per core" in " ".join(text.split()) and "reads it as one block" in " ".join(text.split())


def test_fit_refuses_nonsense_checkpoint_intervals_from_python(tmp_path, store):
    import streamwhiten
    from streamwhiten.errors import BadInputError
    from streamwhiten.options import FitOptions

    for kwargs, fragment in [
        ({"checkpoint_every": 0}, "checkpoint_every must be a whole number of at least 1"),
        ({"checkpoint_every": 2.5}, "checkpoint_every must be a whole number of at least 1"),
        ({"checkpoint_every": True}, "checkpoint_every must be a whole number of at least 1"),
        ({"checkpoint_seconds": 0}, "checkpoint_seconds must be a number of seconds above 0"),
        ({"checkpoint_seconds": -1.0}, "checkpoint_seconds must be a number of seconds above 0"),
        ({"checkpoint_seconds": float("nan")}, "checkpoint_seconds must be a number of seconds"),
        ({"checkpoint_seconds": "60"}, "checkpoint_seconds must be a number of seconds above 0"),
    ]:
        with pytest.raises(BadInputError, match=fragment):
            streamwhiten.fit([store], str(tmp_path / "m.npz"), options=FitOptions(**kwargs))
    assert os.listdir(tmp_path) == ["in.h5"]  # refused before any checkpoint or model was written


def test_run_help_lists_every_exit_code_of_run(run_cli):
    code, out, _ = run_cli("run", "--help")
    assert code == 0
    text = " ".join(out.split())
    for fragment in (
        "0 done",
        "3 nothing to do",
        "2 bad input",
        "74 I/O error",
        "75 another run holds the lock",
        "130 interrupted",
    ):
        assert fragment in text


#: The keys ``run --json`` printed before its report was a dataclass (0.2.0): a job without ``[publish]``, and
#: the keys a job with one adds.
RUN_KEYS = {"job", "model", "steps", "rows_added", "outputs", "bytes_written", "seconds"}
PUBLISH_KEYS = {"action", "reason", "published_version", "staleness", "max_staleness", "manifest", "rows_published"}


def _bytes_under(path) -> int:
    return sum(os.path.getsize(os.path.join(d, name)) for d, _, names in os.walk(path) for name in names)


@pytest.mark.parametrize("publish", [False, True])
def test_run_json_keeps_the_keys_it_always_printed_also_when_there_is_nothing_to_do(tmp_path, store, run_cli, publish):
    from streamwhiten.errors import EXIT_NOTHING_TO_DO
    from streamwhiten.job import JobUpToDateError, run_job_file

    job = tmp_path / "job.toml"
    table = "[publish]\nmax_staleness = 0.5\n" if publish else ""
    job.write_text(
        f'[input]\npaths = ["{store.split(":")[0]}"]\ndataset = "/emb"\n[model]\npath = "m.npz"\n'
        f'n_components = 4\n[apply]\noutput = "out/{{stem}}.zarr"\n{table}'
    )
    code, out, err = run_cli("run", job, "--json", "-q")
    assert code == 0, err
    report = json.loads(out)
    assert set(report) == RUN_KEYS | (PUBLISH_KEYS if publish else set())
    written = str(tmp_path / "out" / ("in.v1.zarr" if publish else "in.zarr"))
    assert report["outputs"] == [written] and report["rows_added"] == 600
    assert report["steps"][0] == "fit" and report["bytes_written"] == _bytes_under(written)
    if publish:
        assert (report["action"], report["published_version"], report["staleness"]) == ("fit", 1, None)
        assert report["rows_published"] == 600 and report["max_staleness"] == 0.5
    code, out, err = run_cli("run", job, "--json", "-q")
    assert code == EXIT_NOTHING_TO_DO and "nothing to do" in err
    again = json.loads(out)
    assert set(again) == set(report) and again["steps"] == [] and again["bytes_written"] == 0
    with pytest.raises(JobUpToDateError) as nothing:  # the library's report is what --json printed
        run_job_file(str(job))
    printed = {key: value for key, value in again.items() if key != "seconds"}
    assert {key: value for key, value in nothing.value.report.to_json().items() if key != "seconds"} == printed


# ------------------------------------------------------------------ the command line as people expect it


def test_bare_command_prints_the_help_and_exits_0():
    done = run_command()
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("Usage: streamwhiten [OPTIONS] COMMAND") and "Commands:" in done.stdout
    assert "streamwhiten demo" in done.stdout and "_STREAMWHITEN_COMPLETE=bash_source" in done.stdout


def test_shell_completion_goes_through_clicks_entry_point():
    import subprocess
    import sys

    from conftest import REPO

    def complete(**variables):
        env = dict(os.environ, PYTHONPATH=str(REPO), **variables)
        return subprocess.run([sys.executable, "-m", "streamwhiten"], capture_output=True, text=True, env=env)

    script = complete(_STREAMWHITEN_COMPLETE="bash_source")
    assert script.returncode == 0 and "_streamwhiten_completion()" in script.stdout and script.stderr == ""
    choices = complete(_STREAMWHITEN_COMPLETE="bash_complete", COMP_WORDS="streamwhiten apply --dtype ", COMP_CWORD="3")
    assert choices.returncode == 0  # the parameter's choices (int8 and binary are refused by apply, for now)
    assert choices.stdout.split() == ["plain,float32", "plain,float16", "plain,int8", "plain,binary"]
    commands = complete(_STREAMWHITEN_COMPLETE="bash_complete", COMP_WORDS="streamwhiten fi", COMP_CWORD="1")
    assert commands.stdout.split() == ["plain,fit"]


@pytest.mark.parametrize(
    "command, fragments",
    [
        ("fit", ["[default: 1]", "[default: 1e-06]", "[default: auto]", "[default: 20]", "Example:", "--block-rows"]),
        (
            "apply",
            [
                "[default: the model's]",
                "[default: the model's storage, else float32]",
                "[default: 10.0]",
                "Example:",
                "--progress-seconds",
            ],
        ),
        ("export", ["[default: the model's]", "[default: the model's storage, else float32]", "Example:"]),
        (
            "run",
            ["[input]", "[model]", "[apply]", "[publish]", "[storage]", 'output = "reduced/{stem}.zarr"', "Example"],
        ),
        ("staleness", ["[default: 0.5]", "--published", "Example:"]),
        ("eval", ["Examples:", "--queries", "--dtype", "--rescore"]),
        ("tune", ["Examples:", "--queries", "--max-bytes", "--dtypes"]),
        ("report", ["Example:"]),
        ("info", ["Example:"]),
        ("demo", ["Example:", "[default: 100000;"]),
    ],
)
def test_each_commands_help_gives_its_defaults_and_an_example(run_cli, command, fragments):
    code, out, _ = run_cli(command, "--help")
    text = " ".join(out.split())
    assert code == 0
    for fragment in fragments:
        assert " ".join(fragment.split()) in text, (command, fragment)
    if command not in ("demo", "fit"):  # demo's --chunk-rows is the generated store's chunk: the right word
        assert "--chunk-rows" not in out and "--checkpoint-seconds" not in out


def test_quiet_says_what_it_hides(run_cli):
    _, out, _ = run_cli("fit", "--help")
    text = " ".join(out.split())
    assert "no bar on a terminal, no timed line per phase on stderr when piped" in text
    assert "summary is still printed" in text


def test_former_flags_still_work_and_are_checked_in_their_own_words(tmp_path, store, run_cli):
    model = tmp_path / "m.npz"
    assert run_cli("fit", store, "-o", model, "--chunk-rows", "64", "-q")[0] == 0
    code, _, err = run_cli("fit", store, "-o", tmp_path / "n.npz", "--chunk-rows", "0")
    assert code == 2 and "Invalid value for '--chunk-rows': chunk_rows must be a whole number of at least 1" in err
    code, _, err = run_cli("fit", store, "-o", tmp_path / "n.npz", "--block-rows", "0")
    assert code == 2 and "Invalid value for '--block-rows': block_rows must be a whole number of at least 1" in err
    code, _, err = run_cli("apply", model, store, "-o", tmp_path / "o.zarr", "--checkpoint-seconds", "-1")
    assert code == 2 and "'--checkpoint-seconds': progress_seconds must be a number of seconds, 0 or more" in err
    assert not (tmp_path / "o.zarr").exists()
