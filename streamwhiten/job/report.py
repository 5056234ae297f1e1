"""What a ``run`` of a job did: `RunReport` (a job that rewrites its outputs) or
`PublishReport` (one that publishes them in versions). ``run --json`` prints its ``to_json()``;
a run with nothing to do raises `JobUpToDateError`, which carries the report all the same."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..core.staleness import Staleness
from ..errors import NothingToDoError


@dataclass(frozen=True)
class RunReport:
    """One run of a job: its ``steps``, ``rows_added``, ``outputs``, ``bytes_written`` and ``seconds``."""

    job: str
    model: str
    steps: tuple[str, ...]
    rows_added: int
    outputs: tuple[str, ...]
    bytes_written: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON values (what ``run --json`` prints): its fields, in order."""
        return {item.name: _plain(getattr(self, item.name)) for item in fields(self)}


@dataclass(frozen=True)
class PublishReport(RunReport):
    """A ``[publish]`` run: its ``action`` and why, the ``published_version``, its map's ``staleness`` (None on a
    first publication), the ``manifest`` and the input rows published."""

    action: str
    reason: str | None
    published_version: int
    staleness: Staleness | None
    max_staleness: float
    manifest: str
    rows_published: int


def _plain(value: Any) -> Any:
    """A report field as a plain JSON value: a tuple as a list, a `Staleness` as its ``to_json()``."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Staleness):
        return value.to_json()
    return value.item() if isinstance(value, np.generic) else value


class JobUpToDateError(NothingToDoError):
    """Nothing to do: the job is up to date (exit 3); ``report`` is the run's report all the same."""

    report: RunReport

    def __init__(self, message: str, report: RunReport) -> None:
        super().__init__(message, report)


__all__ = ["JobUpToDateError", "PublishReport", "RunReport"]
