"""Jobs: a ``job.toml`` file (``file``: a `JobFile`) and its ``streamwhiten run`` (``run``; a ``[publish]``
job: ``publish``), read back through a manifest ([`published`][streamwhiten.job.publication.published]).
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
