"""``streamwhiten run``: a job file's fit or update, finalize and apply, for cron."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

import click

from ..errors import StoreIOError
from ._common import emit, progress_bar, stop_on_signals
from ._options import json_option, quiet_option, read_options, storage_options
from ._progress import LOG_DATE, LOG_FORMAT

if TYPE_CHECKING:
    from ..job import JobFile, RunReport


class _LogFileHandler(logging.FileHandler):
    """A log file whose write errors (disk full) stop the run with one line naming it, not a traceback."""

    def handleError(self, record: logging.LogRecord):
        exc = sys.exc_info()[1]
        raise StoreIOError(f"{self.baseFilename}: cannot write the log file: {getattr(exc, 'strerror', None) or exc}")


JOB_FORMAT = """\b
A job file (TOML; relative paths are taken from its directory):
  name = "nightly"                 # optional: the file's name without .toml
  [input]
  paths = ["shards/*.h5"]          # globs, Parquet directories and URLs allowed
  dataset = "/emb"                 # optional; fill_missing_chunks, remote_timeout
  [model]
  path = "models/nightly.npz"      # kept up to date
  n_components = 256               # beta, gamma, variance, eps, precision,
                                   # skip_nonfinite, block_rows, threads,
                                   # checkpoint_every, checkpoint_seconds
  [apply]                          # optional
  output = "reduced/{stem}.zarr"   # {stem}: the input's name, {name}: the job's
  normalize = true                 # dtype, zarr_format, compressor, keep_columns,
                                   # skip_nonfinite, block_rows, threads, direct_io,
                                   # progress_seconds
  [publish]                        # optional: versioned outputs; each night's rows
  max_staleness = 0.5              # appended, a new version when the map is stale;
  keep_versions = 2                # see docs/nightly.md
  [storage]                        # optional: options of s3://... file systems
  endpoint_url = "http://minio:9000"
"""


@click.command(epilog=JOB_FORMAT)
@click.argument("job_file")
@click.option("--log-file", default=None, help="Also append timestamped log lines to this file.")
@click.option("--restart", is_flag=True, help="Discard the checkpoint of an interrupted run instead of finishing it.")
@click.option(
    "--republish",
    is_flag=True,
    help="A job with [publish]: publish a new version from the current statistics, however stale the current one.",
)
@click.option(
    "--new-job",
    is_flag=True,
    help=(
        "A job with [publish] whose folder is a copy of another job's (or was moved to another file system): "
        "make it a job of its own, which publishes a new version and never deletes the other job's files. "
        "Without it such a folder is refused (docs/nightly.md)."
    ),
)
@storage_options
@quiet_option
@json_option
def run(
    job_file: str,
    log_file: str | None,
    restart: bool,
    republish: bool,
    new_job: bool,
    storage_options: tuple[str, ...],
    remote_timeout: float | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Run a batch job (job.toml): fit or update, finalize, apply; each step skipped when up to date.

    With a [publish] table the outputs are published in versions: each night's new rows are appended with
    the published map while its staleness is within max_staleness, and a new version is published (beside
    the current one, switched by its manifest) when it is not. --json prints one object (action, published
    version, staleness, manifest, outputs, rows_added, bytes_written, seconds), also when there was
    nothing to do.

    Exit codes: 0 done, 3 nothing to do, 2 bad input, 74 I/O error (disk full: the previous checkpoint,
    output or published version is kept), 75 another run holds the lock, 130 interrupted.

    \b
    Example (cron):
      streamwhiten run nightly.toml --log-file nightly.log
    """
    from dataclasses import replace

    from ..job import JobUpToDateError, read_job_file, run_job
    from ..progress import Watch

    given = remote_timeout is not None
    read = read_options(storage_options=storage_options, remote_timeout=remote_timeout)
    logging.getLogger("streamwhiten").setLevel(logging.INFO)
    job = read_job_file(job_file, read.storage_options)
    if given:  # the command line's deadline over the job's [input] remote_timeout
        job = replace(job, read=replace(job.read, remote_timeout=read.remote_timeout))
        job = replace(job, apply_read=replace(job.apply_read, remote_timeout=read.remote_timeout))
    handler = _log_to(log_file, job) if log_file else None
    try:
        with progress_bar("run", quiet) as progress, stop_on_signals() as should_stop:
            report = run_job(job, Watch(progress, should_stop), restart, republish, new_job)
    except JobUpToDateError as exc:
        if as_json:
            emit(True, exc.report.to_json(), [])  # the report for cron, then exit 3
        raise
    finally:  # the file's handler goes with the run (a program that calls the CLI again logs nothing there)
        if handler is not None:
            logging.getLogger("streamwhiten").removeHandler(handler)
            handler.close()
    emit(as_json, report.to_json(), _lines(report))


def _lines(report: RunReport) -> list[str]:
    """The text report of a run."""
    from ..job import PublishReport

    lines = [f"job {report.job}: " + "; ".join(report.steps)]
    if isinstance(report, PublishReport):
        measured = (
            f"staleness {report.staleness.total:.3g} (max_staleness {report.max_staleness:g})"
            if report.staleness is not None
            else report.reason or "first publication"
        )
        lines.append(
            f"{report.action}: published version {report.published_version} ({measured}); "
            f"{report.rows_added:,} rows added, {report.bytes_written:,} bytes written in "
            f"{report.seconds:.1f} s; manifest {report.manifest}"
        )
    return lines


def _log_to(log_file: str, job: JobFile) -> logging.Handler:
    """Also log to ``log_file``, which may not be any of the job's inputs or files: the handler added."""
    from ..io import expand_specs, refuse_input_overlap

    inputs = expand_specs(list(job.inputs), job.read)
    refuse_input_overlap({log_file: "log file"}, [job.path, *inputs])
    refuse_input_overlap({log_file: "log file"}, [job.model_path, job.checkpoint, job.lock_path], nested=False)
    try:
        handler = _LogFileHandler(log_file)
    except OSError as exc:
        raise StoreIOError(f"{log_file}: cannot open the log file: {exc.strerror or exc}") from exc
    handler.setFormatter(logging.Formatter(LOG_FORMAT, LOG_DATE))
    logging.getLogger("streamwhiten").addHandler(handler)
    return handler
