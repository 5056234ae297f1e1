"""What a command shows while it works (cli._progress): piped, one timestamped line per phase with its time,
in the form of ``run``'s log, for ``codes``, ``tune`` (pairs and retrieval, codes included) and ``report``;
nothing with ``--quiet``; a long phase announced when it began; on a terminal, a bar or spinner and the
same lines."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from conftest import write_h5, write_task

from streamwhiten.cli import _progress
from streamwhiten.core import stats
from streamwhiten.core.model import finalize, save_model

#: A phase's line: run's timestamp, the command, the phase and its time (or, for a phase still running after
#: a moment, `...`: its announcement).
LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} streamwhiten: (\w+): (.+)(: \d+\.\d s|: \d+ min \d+ s| \.\.\.)$"
)


def phases(err: str, command: str) -> list[str]:
    """The phases ``err`` reports as done, in order; every line of it must be a phase line of ``command``
    (an announcement of one still running only before its end)."""
    found, announced = [], []
    for line in err.splitlines():
        match = LINE.match(line)
        assert match is not None and match.group(1) == command, line
        if match.group(3) == " ...":
            announced.append(match.group(2))
        else:
            found.append(match.group(2))
    assert all(name in found for name in announced), (announced, found)
    return found


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("progress")
    made = write_task(tmp_path, n=800, d=16, n_queries=24, offset=1.0)
    model = tmp_path / "m.npz"
    save_model(finalize(stats.block_moments(made["corpus"].astype(np.float64)), n_components=12), str(model))
    rng = np.random.default_rng(1)
    a = rng.standard_normal((120, 16)).astype(np.float32)
    b = (a + rng.standard_normal((120, 16))).astype(np.float32)
    made.update(
        model=str(model),
        raw=str(tmp_path / "raw.npz"),
        pairs_a=write_h5(tmp_path / "a.h5", a),
        pairs_b=write_h5(tmp_path / "b.h5", b),
        scores=write_h5(tmp_path / "s.h5", np.einsum("ij,ij->i", a, b).astype(np.float32)),
    )
    save_model(finalize(stats.block_moments(made["corpus"].astype(np.float64))), made["raw"])
    return made


def test_codes_piped_says_each_phase_with_its_time_and_the_sample_size(tmp_path, task, run_cli):
    pytest.importorskip("faiss")
    args = ("codes", task["model"], "faiss-pq:4", "--sample", task["spec_c"], "--sample-size", 300)
    code, out, err = run_cli(*args, "-o", tmp_path / "coded.npz")
    assert code == 0 and "wrote" in out
    assert phases(err, "codes") == ["read the sample", "train faiss-pq:4 on 300 rows"]
    code, out, err = run_cli("codes", task["model"], "eigen:4", "-o", tmp_path / "eigen.npz")
    assert code == 0 and phases(err, "codes") == ["train eigen:4 from the statistics"]
    code, out, err = run_cli(*args, "-o", tmp_path / "quiet.npz", "--quiet")
    assert code == 0 and "wrote" in out and err == ""


def test_tune_over_a_budget_says_each_phase_codes_included_and_nothing_when_quiet(tmp_path, task, run_cli):
    pytest.importorskip("faiss")
    args = (
        "tune", task["raw"], "--queries", task["spec_q"], "--corpus", task["spec_c"], "--qrels", task["qrels"],
        "--exclude", task["exclude"], "--betas", "0,1", "--gammas", "0,1", "--ks", "8,16", "--variances", "",
        "--dtypes", "int8,binary,eigen,faiss-pq", "--max-bytes", "8", "--bootstrap", "100",
    )  # fmt: skip
    code, out, err = run_cli(*args, "-o", tmp_path / "tuned.npz")
    assert code == 0 and out
    said = phases(err, "tune")
    assert said[0].startswith("search ") and said[0].endswith(" over 800 rows")
    assert said[1:] == [
        "read the corpus's statistics and a sample for 2 codes",
        "train 2 codes on 800 rows",
        "search 2 codes over 800 rows",
        "score the settings and choose (maxt rule)",
    ]
    code, out, err = run_cli(*args, "-o", tmp_path / "quiet.npz", "-q")
    assert code == 0 and out and err == ""


def test_tune_and_report_on_pairs_say_each_phase(tmp_path, task, run_cli):
    pairs = ("--pairs-a", task["pairs_a"], "--pairs-b", task["pairs_b"], "--scores", task["scores"])
    grid = ("--betas", "0,1", "--gammas", "0,1", "--ks", "4,16", "--variances", "")
    code, out, err = run_cli("tune", task["raw"], *pairs, *grid, "-o", tmp_path / "tuned.npz")
    assert code == 0 and out
    assert phases(err, "tune") == ["score 9 settings on 120 pairs", "correlate and choose (maxt rule)"]
    pytest.importorskip("matplotlib")
    code, out, err = run_cli("report", task["raw"], *pairs, *grid, "-o", tmp_path / "report.html")
    said = phases(err, "report")
    assert code == 0 and said[:2] == ["score 9 settings on 120 pairs", "correlate and choose (maxt rule)"]
    assert said[-1] == "draw and write the report" and len(said) == 5  # the k curves' grid in between
    code, out, err = run_cli("report", task["raw"], *pairs, *grid, "-o", tmp_path / "quiet.html", "-q")
    assert code == 0 and err == ""


def test_a_long_phase_is_announced_when_piped_and_spun_on_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(_progress, "ANNOUNCE_AFTER", 0.05)
    monkeypatch.setattr(_progress, "TICK", 0.02)
    console = _progress.Console("codes", terminal=False)
    console.started("train faiss-opq:24 on 10,000 rows", None)
    time.sleep(0.3)
    console.finished("train faiss-opq:24 on 10,000 rows", 0.3)
    console.started("quick", "rows")
    console(5, 10)
    console.finished("quick", 0.01)
    console.close()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("streamwhiten: ", 1)[1] for line in lines] == [
        "codes: train faiss-opq:24 on 10,000 rows ...",
        "codes: train faiss-opq:24 on 10,000 rows: 0.3 s",
        "codes: quick: 0.0 s",
    ]
    terminal = _progress.Console("tune", terminal=True)
    terminal(3, 10)  # rows outside any phase: the command's own bar
    terminal.started("train 2 codes on 800 rows", None)
    time.sleep(0.1)  # the spinner turns
    terminal(1, 2)  # a spinner counts nothing
    terminal.finished("train 2 codes on 800 rows", 0.1)
    terminal.close()
    err = capsys.readouterr().err
    assert "train 2 codes on 800 rows" in err and err.rstrip().endswith("tune: train 2 codes on 800 rows: 0.1 s")
