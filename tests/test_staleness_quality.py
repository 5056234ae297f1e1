"""The staleness benchmark: a clear skip without the licensed data, and a --quick run on it (skipped when
absent) that reproduces README.txt's raw retrieval score and writes its JSON."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPT = REPO / "benchmarks" / "staleness_quality.py"
STSB = os.environ.get("STREAMWHITEN_STSB", str(REPO.parent / "shared" / "data" / "stsb" / "stsb-dev-minilm.h5"))
RETRIEVAL = os.path.join(os.path.dirname(STSB), "retrieval-dev")


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO / "benchmarks",
        timeout=600,
    )


def test_missing_data_is_a_clear_skip(tmp_path):
    result = run("--data", tmp_path / "absent.h5", "--results", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "staleness_quality: skipped: STS-B data not found at" in result.stderr
    assert str(tmp_path / "absent.h5") in result.stderr
    assert not list(tmp_path.iterdir())


def test_help():
    result = run("--help")
    assert result.returncode == 0 and "--quick" in result.stdout and "nDCG@10" in result.stdout


@pytest.mark.skipif(
    not (os.path.exists(STSB) and os.path.exists(os.path.join(RETRIEVAL, "corpus.h5"))),
    reason=f"STS-B data not found at {STSB} and {RETRIEVAL} (licence keeps it out of the repo)",
)
def test_quick_run_on_stsb(tmp_path):
    result = run("--quick", "--results", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank correlation" in result.stdout and "default max_staleness 0.5: holds" in result.stdout
    (path,) = tmp_path.glob("staleness_quality_quick-*.json")
    payload = json.loads(path.read_text())
    assert payload["raw"]["mean"]["ndcg"] == pytest.approx(88.90, abs=0.005)  # README.txt's reference
    assert payload["raw"]["mean"]["spearman"] == pytest.approx(86.72, abs=0.01)  # as benchmarks/stsb_table.py
    assert payload["problems"] == [] and payload["default"]["holds"]
    points = payload["points"]
    assert {p["scenario"] for p in points} == {"grow", "early", "shift", "distort"}
    for point in points:
        assert point["staleness"] == max(point["covariance"], point["shift"], point["dropped"])
        assert point["loss"] == max(point["ndcg_loss"], point["spearman_loss"])
        assert all(math.isfinite(point[key]) for key in ("staleness", "ndcg_kept", "spearman_refit"))
        if point["k"] == 384:
            assert point["angle"] == 0.0 and point["dropped"] == 0.0
    # a map published from 800 rows and kept for the whole corpus is far staler than one from the train
    # sentences kept while a quarter of the dev sentences arrived
    staleness = {(p["scenario"], p["size"], p["k"], p["beta_gamma"]): p["staleness"] for p in points}
    assert staleness[("early", 800, 384, 1.0)] > 5 * staleness[("grow", 0.25, 384, 1.0)]
