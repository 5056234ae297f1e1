"""What a ``run`` of a job did: `RunReport` (a job that rewrites its outputs) or
`PublishReport` (one that publishes them in versions). ``run --json`` prints its ``to_json()``;
a run with nothing to do raises `JobUpToDateError`, which carries the report all the same."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.staleness import Staleness
from ..errors import NothingToDoError


@dataclass(frozen=True)
class RunReport:
    """One run of a job: the ``steps`` that ran, the ``rows_added`` to its statistics, its ``outputs``,
    the ``bytes_written`` by this run (outputs only) and the ``seconds`` it took."""

    job: str
    model: str
    steps: tuple[str, ...]
    rows_added: int
    outputs: tuple[str, ...]
    bytes_written: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON values (what ``run --json`` prints)."""
        return {
            "job": self.job,
            "model": self.model,
            "steps": list(self.steps),
            "rows_added": int(self.rows_added),
            "outputs": list(self.outputs),
            "bytes_written": int(self.bytes_written),
            "seconds": float(self.seconds),
        }


@dataclass(frozen=True)
class PublishReport(RunReport):
    """One run of a job with a ``[publish]`` table: its ``action`` (``fit``, ``republish``, ``append`` or
    ``nothing``) and why, the ``published_version`` it leaves, the ``staleness`` of that version's map
    against the statistics (None on the first publication, and on the first of a new job), its
    ``manifest`` and the input rows published."""

    action: str
    reason: str | None
    published_version: int
    staleness: Staleness | None
    max_staleness: float
    manifest: str
    rows_published: int

    def to_json(self) -> dict[str, Any]:
        return {
            **super().to_json(),
            "action": self.action,
            "reason": self.reason,
            "published_version": int(self.published_version),
            "staleness": None if self.staleness is None else self.staleness.to_json(),
            "max_staleness": float(self.max_staleness),
            "manifest": self.manifest,
            "rows_published": int(self.rows_published),
        }


class JobUpToDateError(NothingToDoError):
    """Nothing to do: the job is up to date (exit 3). ``report`` is the run's report all the same (cron's
    ``run --json`` prints it)."""

    report: RunReport

    def __init__(self, message: str, report: RunReport) -> None:
        super().__init__(message, report)


__all__ = ["JobUpToDateError", "PublishReport", "RunReport"]
