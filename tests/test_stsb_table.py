"""The STS-B benchmark script runs end to end with --quick (skipped when the licensed data is absent)."""

from __future__ import annotations

import importlib.util
import json
import math
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STSB = os.environ.get("STREAMWHITEN_STSB", os.path.join(REPO, "..", "shared", "data", "stsb", "stsb-dev-minilm.h5"))


def load_script():
    spec = importlib.util.spec_from_file_location("stsb_table", os.path.join(REPO, "benchmarks", "stsb_table.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_missing_data_is_a_clear_skip(tmp_path, capsys):
    assert load_script().main(["--data", str(tmp_path / "absent.h5"), "--results", str(tmp_path)]) == 0
    assert "skipped: STS-B embeddings not found" in capsys.readouterr().err
    assert not os.listdir(tmp_path)


@pytest.mark.skipif(
    not os.path.exists(STSB), reason=f"STS-B embeddings not found at {STSB} (licence keeps them out of the repo)"
)
def test_quick_table_on_stsb(tmp_path, capsys):
    assert load_script().main(["--quick", "--data", STSB, "--results", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "beta=gamma=1" in printed and "k=256" in printed
    result = json.loads((tmp_path / "stsb_table_quick.json").read_text())
    rows = {row["setting"]: row for row in result["rows"]}
    assert rows["beta=gamma=1"]["raw"] == pytest.approx(86.72, abs=0.01)
    assert rows["beta=gamma=0"]["k=256"] == pytest.approx(86.68, abs=0.05)
    assert math.isfinite(rows["beta=gamma=1"]["full"]) and result["nonfinite"] == []  # eps keeps full d finite
    (tuned,) = result["tuned"]
    assert tuned["tuned"] >= tuned["raw"]
