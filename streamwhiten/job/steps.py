"""The steps every run of a job shares (`streamwhiten.job.run`, `streamwhiten.job.publish`): its lock, the
paths it writes, the fit step, an apply unless its output is up to date, the bytes an output takes.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .._durable import exclusive_lock
from ..errors import InterruptedRunError, NothingToDoError
from ..options import ReadOptions
from ..progress import Progress, Watch
from .file import Fitting, Writing

if TYPE_CHECKING:
    from ..core.model import WhiteningModel
    from ..engine.apply import ApplyOutcome

log = logging.getLogger("streamwhiten")


def job_lock(path: str):
    """Hold the job's exclusive lock on ``path``; a second run of the job exits with `LockedError` (75)."""
    return exclusive_lock(
        path,
        lambda holder: f"{path}: another run of this job is in progress (pid {holder}); not starting a second one",
        remove=True,
    )


@dataclass(frozen=True)
class Before:
    """What the statistics file held before the fit step of a run: its rows and its source records."""

    n_rows: int
    sources: tuple


def statistics_before(model_path: str) -> Before | None:
    """The rows and source records in ``model_path`` before the fit step (unchecked; None without any)."""
    from ..core.model import read_rows_and_sources

    found = read_rows_and_sources(model_path)
    return Before(*found) if found is not None else None


def model_rows(model_path: str) -> int:
    """The rows of the statistics in ``model_path`` now (0 when there is none yet, or none it can read)."""
    before = statistics_before(model_path)
    return before.n_rows if before is not None else 0


def fit_step(
    name: str,
    fitting: Fitting,
    inputs: list,
    steps: list,
    watch: Watch,
    restart: bool,
):
    """Finish a killed run, then fit or update (re-finalize a changed setting); returns the model to apply."""
    from ..core.model import file_checksum, load_model, save_model
    from ..engine.fit import remove_checkpoint
    from ..pipeline import fit

    model_path = fitting.model_path
    if restart:
        remove_checkpoint(fitting.checkpoint)
    elif os.path.exists(fitting.checkpoint) and _finish_pending(name, fitting, inputs, watch):
        steps.append("resume")
    exists = os.path.exists(model_path)
    params = fitting.setting.given()
    try:
        outcome = fit(
            inputs,
            model_path,
            setting=fitting.setting,
            options=replace(fitting.options, overwrite=True),
            read=fitting.read,
            engine=fitting.engine,
            update=model_path if exists else None,
            watch=watch,
        )
    except NothingToDoError:
        model = load_model(model_path)
        log.info("job %s: model %s is up to date with its inputs", name, model_path)
        wanted = model.with_params(**params) if params else model
        if file_checksum(wanted) != file_checksum(model):
            save_model(wanted, model_path)
            steps.append("finalize")
            log.info("job %s: re-finalized %s with the job's parameters", name, model_path)
        return wanted
    steps.append("update" if exists else "fit")
    log.info(
        "job %s: %s %s with %s rows",
        name,
        "updated" if exists else "fitted",
        model_path,
        f"{outcome.rows_read:,}",
    )
    return outcome.model


def _finish_pending(
    name: str,
    fitting: Fitting,
    inputs: list,
    watch: Watch,
) -> bool:
    """Complete the fit a killed run left in the job's checkpoint; True if it did."""
    from ..pipeline import finish_checkpoint

    outcome = finish_checkpoint(
        inputs,
        fitting.model_path,
        setting=fitting.setting,
        options=fitting.options,
        read=fitting.read,
        engine=fitting.engine,
        watch=watch,
        label=f"job {name}: ",
    )
    return outcome is not None


def record_code(
    name: str,
    model: WhiteningModel,
    writing: Writing,
    inputs: list,
    model_path: str,
    progress: Progress | None = None,
) -> WhiteningModel:
    """``model`` recording the vector code the job's apply writes (trained once; a sample of the first input for a
    code that learns from data), saved to ``model_path``: every reader decodes with the model's codec."""
    from ..codes import NEEDS_SAMPLE
    from ..pipeline import with_codes

    dtype = writing.options.dtype
    if dtype is None or dtype.code is None or dtype.names(model.storage):
        return model  # no code, or the model records it already
    sample = inputs[0] if dtype.code in NEEDS_SAMPLE else None
    coded = with_codes(model, dtype, sample=sample, output=model_path, overwrite=True, progress=progress)
    log.info("job %s: recorded the %s code in %s", name, dtype, model_path)
    return coded


def check_paths(sources: list, written: dict[str, str]) -> None:
    """Refuse, before any work, a file the run writes (``written``) over one it reads or over another."""
    from ..io import refuse_input_overlap, refuse_shared_outputs

    refuse_input_overlap(written, sources)
    refuse_shared_outputs(*written.items())


def apply_unless_current(
    name: str,
    model: WhiteningModel,
    input_spec: str,
    output: str,
    writing: Writing,
    *,
    rows: tuple[int, int] | None = None,
    attrs: dict | None = None,
    watch: Watch = Watch(),
) -> ApplyOutcome | None:
    """Write ``input_spec`` (its rows ``rows``) to ``output`` as job ``name`` does, unless it holds that already
    (apply's own check on its one plan): then it is kept, tidied, and None returned; else the `ApplyOutcome`."""
    from ..io import open_output, remote, split_spec
    from ..pipeline import apply

    if watch.stop_asked():
        raise InterruptedRunError(f"interrupted before writing {output}; run the same command again to finish")
    if not remote.is_url(output):
        os.makedirs(os.path.dirname(os.path.abspath(split_spec(output)[0])), exist_ok=True)
    try:
        outcome = apply(
            model,
            input_spec,
            output,
            options=writing.options,
            read=writing.read,
            engine=writing.engine,
            rows=rows,
            watch=watch,
            attrs=attrs,
        )
    except NothingToDoError:
        log.info("job %s: %s is up to date", name, output)
        open_output(output, writing.read).tidy()  # a run killed right after writing it may have left its records
        return None
    resumed = f", resumed at row {outcome.resumed_at_row:,}" if outcome.resumed_at_row else ""
    log.info("job %s: wrote %s (%s rows%s)", name, output, f"{outcome.n_rows:,}", resumed)
    return outcome


def stored_bytes(spec: str, read: ReadOptions | None = None) -> int:
    """The bytes an output takes in storage (a file, or every file of a directory or object prefix)."""
    from ..io import remote, split_spec

    path = split_spec(spec)[0]
    if remote.is_url(path):
        try:
            found = remote.find(path, detail=True, read=read if read is not None else ReadOptions())
        except Exception:  # noqa: BLE001 - a report figure, never a reason to fail
            return 0
        return int(sum(int(item.get("size") or 0) for item in found.values()))
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(directory, name))
            except OSError:
                pass
    return total


__all__ = [
    "Before",
    "apply_unless_current",
    "check_paths",
    "fit_step",
    "job_lock",
    "model_rows",
    "statistics_before",
    "stored_bytes",
]
