"""Jobs: a ``job.toml`` file and the ``streamwhiten run`` of it.

``file`` reads and checks a job file into a `JobFile`; ``run`` runs it (fit or update, finalize, apply,
each step skipped when up to date) under a lock. A ``[publish]`` job publishes versions (``publish``),
read through a manifest (``publication``: [`published`][streamwhiten.job.publication.published]).
"""

from .file import JobFile, default_checkpoint, read_job_file
from .publication import Publication, published
from .report import JobUpToDateError, PublishReport, RunReport
from .run import job_lock, run_job, run_job_file

__all__ = [
    "JobFile",
    "JobUpToDateError",
    "Publication",
    "PublishReport",
    "RunReport",
    "default_checkpoint",
    "job_lock",
    "published",
    "read_job_file",
    "run_job",
    "run_job_file",
]
