"""The benchmark scripts run end to end on tiny sizes (``--quick``); no timing is asserted here."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

SCRIPTS = [
    "fit_throughput.py",
    "apply_throughput.py",
    "memory.py",
    "fit_tables.py",
    "fit_remote.py",
    "search_speed.py",
    "retrieval_frontier.py",
    "tune_generalization.py",
    "checksum_cost.py",
    "codes_frontier.py",
    "codes_training.py",
    "tune_memory.py",
]
RETRIEVAL_DEV = Path(os.environ.get("STREAMWHITEN_STSB", REPO.parent / "shared/data/stsb/stsb-dev-minilm.h5"))
RETRIEVAL_DEV = RETRIEVAL_DEV.parent / "retrieval-dev"


@pytest.mark.slow  # a benchmark rerun (the quick tier checks each script's arguments: test_benchmark_help)
@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_quick_run_writes_json(tmp_path, script):
    if script == "fit_tables.py" and not all(importlib.util.find_spec(m) for m in ("pyarrow", "lance")):
        pytest.skip("fit_tables.py needs pyarrow and pylance (pip install 'streamwhiten[lance]')")
    if script == "fit_remote.py" and not all(importlib.util.find_spec(m) for m in ("moto", "s3fs", "dask")):
        pytest.skip("fit_remote.py needs moto[server], s3fs and dask (pip install -e '.[test]')")
    if script == "search_speed.py" and not importlib.util.find_spec("faiss"):
        pytest.skip("search_speed.py compares with faiss: pip install faiss-cpu")
    if script in ("codes_frontier.py", "codes_training.py") and not importlib.util.find_spec("faiss"):
        pytest.skip(f"{script} compares with faiss: pip install faiss-cpu")
    if script == "codes_frontier.py" and not (RETRIEVAL_DEV.parent / "neighbours-dev" / "qrels.tsv").exists():
        pytest.skip(
            f"the neighbours-dev task was not found beside {RETRIEVAL_DEV} (licensed data kept out of the repo)"
        )
    if script in ("retrieval_frontier.py", "tune_generalization.py") and not (RETRIEVAL_DEV / "qrels.tsv").exists():
        pytest.skip(f"the STS-B retrieval task was not found at {RETRIEVAL_DEV} (licensed data kept out of the repo)")
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--quick", "--results", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO / "benchmarks",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    payload = json.loads(files[0].read_text())
    assert payload["machine"]["cpus"] >= 1 and payload["command"].startswith(script)


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_help(script):
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), "--help"],
        capture_output=True,
        text=True,
        cwd=REPO / "benchmarks",
    )
    assert result.returncode == 0 and "--quick" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("script", ["fit_throughput.py", "apply_throughput.py"])
def test_benchmark_reruns_in_the_same_workdir(tmp_path, script):
    """What a run leaves in ``--workdir`` does not stop the next run there."""
    for _ in range(2):
        result = subprocess.run(
            [
                sys.executable,
                str(REPO / "benchmarks" / script),
                "--quick",
                "--workdir",
                str(tmp_path / "work"),
                "--results",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            cwd=REPO / "benchmarks",
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-3000:]


def test_fit_throughput_compressed_section_smoke(tmp_path):
    """The compressed-store section (issue #18) runs on tiny stores and records every store's limit,
    bare product, dask product, fit and apply; no timing is asserted."""
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "fit_throughput.py"),
            "--quick",
            "--sections",
            "compressed",
            "--results",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=REPO / "benchmarks",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    payload = json.loads(next(tmp_path.glob("*.json")).read_text())
    rows = payload["compressed"]
    assert [row["store"] for row in rows] == [
        "zarr-zstd",
        "zarr-blosc-lz4",
        "hdf5-gzip",
        "hdf5-raw",
        "zarr-zstd-f16",
        "hdf5-gzip-f16",
    ]
    for row in rows:
        for key in ("limit_rows_s", "bare_rows_s", "dask_rows_s", "fit_rows_s", "apply_rows_s", "apply_limit_rows_s"):
            assert row[key] > 0, (row["store"], key)
        assert isinstance(row["meets"], bool)
    assert "compressed stores" in result.stdout


def test_nightly_cost_quick_run_appends_and_republishes(tmp_path):
    """``nightly_cost.py --quick`` (issue #25) simulates nights at two corpus sizes: its JSON holds, per
    size, every night's action, staleness, seconds and bytes, the reference (apply of the new rows alone)
    beside each append, and the rewrite-all job's nights; the drift trips a republish. No timing is
    asserted."""
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "nightly_cost.py"), "--quick", "--results", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO / "benchmarks",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (file,) = tmp_path.glob("nightly_cost-*.json")
    payload = json.loads(file.read_text())
    assert payload["command"].startswith("nightly_cost.py") and payload["target"] == 1.5
    assert [run["n0"] for run in payload["runs"]] == [3000, 12000]
    for run in payload["runs"]:
        nights = run["nights"]
        assert [night["night"] for night in nights] == list(range(payload["nights"] + 1))
        actions = [night["action"] for night in nights]
        assert actions[0] == "fit" and "append" in actions and "republish" in actions, actions
        for night in nights:
            assert night["seconds"] > 0 and night["bytes_written"] > 0 and night["new_rows"] > 0
            assert ("ratio" in night) == (night["action"] == "append" and night["night"] > 0)
            assert night["rewrite_bytes_written"] >= night["bytes_written"] or night["action"] != "append"
        appended = [night for night in nights if night["action"] == "append"]
        # an appending night writes only its new rows; the rewrite-all job writes the whole corpus
        assert all(night["bytes_written"] < night["rewrite_bytes_written"] / 5 for night in appended)
        assert run["summary"]["appends"] == len(appended) and run["summary"]["republishes"] >= 1
