"""The scripts under examples/ run end to end, small, and check their own results (exit 0 only if so)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_example(path: str, *args: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / path), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )


def test_faiss_search_finds_the_numpy_neighbours(tmp_path):
    pytest.importorskip("faiss")
    done = run_example(
        "faiss_search.py",
        "--rows",
        "3000",
        "--dim",
        "64",
        "-k",
        "16",
        "--queries",
        "20",
        "--workdir",
        str(tmp_path),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "top-10 overlap with the numpy search: 1.000" in done.stdout
    assert (tmp_path / "corpus.faiss").is_file()


@pytest.mark.slow
def test_nightly_simulation_updates_to_the_fit_at_once(tmp_path):
    done = run_example(
        "nightly/simulate_nights.py",
        "--nights",
        "3",
        "--rows",
        "2000",
        "--dim",
        "96",
        "--workdir",
        str(tmp_path),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("second run the same night exit 3") == 3
    assert "max |covariance gap| 0.00e+00" in done.stdout
    assert sorted(os.listdir(tmp_path / "reduced")) == ["day-1.zarr", "day-2.zarr", "day-3.zarr"]


def test_sklearn_pipeline_whitening_beats_raw_vectors(tmp_path):
    pytest.importorskip("pandas")
    done = run_example("sklearn_pipeline.py", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "'whiten__gamma': 1.0" in done.stdout and "index kept: True" in done.stdout
