"""The steps every run of a job shares: each output's plan is built once a run, whether it is written,
rewritten or found up to date."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import append_rows

from streamwhiten.codes.storage import resolve_counts
from streamwhiten.io import open_source
from streamwhiten.job import JobUpToDateError, run_job_file

D = 10


def write_job(folder, normalize: bool) -> str:
    job = os.path.join(folder, "job.toml")
    with open(job, "w") as handle:
        handle.write(
            'name = "steps"\n[input]\npaths = ["shards/day-*.h5"]\n[model]\npath = "models/m.npz"\n'
            f'n_components = 4\n[apply]\noutput = "out/{{stem}}.h5"\nnormalize = {str(normalize).lower()}\n'
        )
    return job


def resolved() -> int:
    """How often an output's storage was resolved so far: once per `OutputPlan` built."""
    hits, misses = resolve_counts()
    return hits + misses


def test_each_output_is_planned_once_a_run_written_rewritten_or_up_to_date(tmp_path):
    rng = np.random.default_rng(3)
    for day in (1, 2):
        append_rows(tmp_path / "shards" / f"day-{day}.h5", rng.standard_normal((300, D)).astype(np.float32))
    outputs = [tmp_path / "out" / f"day-{day}.h5" for day in (1, 2)]
    before = resolved()
    run_job_file(write_job(tmp_path, normalize=False))
    assert resolved() - before == 2 and all(path.exists() for path in outputs)
    # another apply option: both outputs are not current and are rewritten, each planned once (not once
    # for an up-to-date check and again for the write)
    before = resolved()
    report = run_job_file(write_job(tmp_path, normalize=True))
    assert resolved() - before == 2
    assert sorted(os.path.basename(path) for path in report.outputs) == ["day-1.h5", "day-2.h5"]
    for path in outputs:
        with open_source(str(path)) as written:
            rows = written.read(0, written.n_rows)
        np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-5)
    # nothing changed: each output found up to date on its one plan, and kept
    stamps = [path.stat().st_mtime_ns for path in outputs]
    before = resolved()
    with pytest.raises(JobUpToDateError):
        run_job_file(write_job(tmp_path, normalize=True))
    assert resolved() - before == 2 and [path.stat().st_mtime_ns for path in outputs] == stamps
