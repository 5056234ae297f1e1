"""The pipeline of a fit and of an apply: the one path the command line, ``run`` and ``Whitener`` take.

Modules: ``fitting`` (a fit; finishing a killed one), ``applying``, ``coding`` (a vector code), ``paths``.
A fit checks its paths, plans (or plans an update), resumes a matching checkpoint, runs on an engine,
finalizes and saves; an apply checks the engine can write it and runs it. Each takes option objects and
returns one outcome type whichever engine ran ([`FitOutcome`][streamwhiten.pipeline.FitOutcome],
[`ApplyOutcome`][streamwhiten.engine.apply.ApplyOutcome]); it raises and logs, never prints.

Examples
--------
>>> import numpy as np, tempfile, os
>>> import streamwhiten
>>> from streamwhiten.options import Setting
>>> directory = tempfile.mkdtemp()
>>> rows = np.random.default_rng(0).standard_normal((1000, 8)).astype(np.float32)
>>> np.save(os.path.join(directory, "x.npy"), rows)
>>> outcome = streamwhiten.fit(os.path.join(directory, "x.npy"), os.path.join(directory, "m.npz"),
...                            setting=Setting(n_components=4))
>>> outcome.model.n_rows, outcome.model.n_components
(1000, 4)
"""

from .applying import apply
from .coding import DEFAULT_CODE_SAMPLE_ROWS, with_codes
from .fitting import FitOutcome, finish_checkpoint, fit, model_is_current
from .paths import check_fit_paths, check_writable_dir, default_checkpoint

__all__ = [
    "DEFAULT_CODE_SAMPLE_ROWS",
    "FitOutcome",
    "apply",
    "check_fit_paths",
    "check_writable_dir",
    "default_checkpoint",
    "finish_checkpoint",
    "fit",
    "model_is_current",
    "with_codes",
]
