"""Jobs: a ``job.toml`` file and the ``streamwhiten run`` of it.

``file`` reads and checks a job file (its tables and keys come from `streamwhiten.params.PARAMS`)
into a `JobFile` of option objects; ``run`` runs it: fit or update,
finalize, apply, each step skipped when already up to date (its `RunReport` says what ran), under a lock so two runs of the same job
never overlap. A job with a ``[publish]`` table publishes its outputs in versions (``publish``: append
each night's rows, republish when the map is stale), resolved by readers through a manifest
(``publication``: [`published`][streamwhiten.job.publication.published]).
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
