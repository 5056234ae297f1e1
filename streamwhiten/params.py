"""Every parameter's default and allowed values, stated once.

The estimator (:class:`~streamwhiten.whitener.Whitener`), the library functions (``finalize``,
``fit_job``, ``apply_model``, the Dask engine), the command line (its option types and defaults) and
job files (``[input]``, ``[model]``, ``[apply]``) all check a value against :data:`PARAMS`, so a bad
one is refused in the same words wherever it is given, as one :class:`BadInputError` (exit 2):

    beta must be a number in [0, 1], got 1.5                      (Python)
    Invalid value for '--beta': beta must be a number in [0, 1], got 1.5      (command line)
    job.toml: beta in [model] must be a number in [0, 1], got 1.5            (job file)

Rules between parameters (``n_components`` or ``variance``, ``k <= d``) are :func:`check_model`'s.
This module imports nothing but the standard library: the command line checks its options before
numpy or numba are loaded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral, Real

from .errors import BadInputError

#: Default regulariser, relative to the largest eigenvalue: ``eps_ = eps * lambda_1`` is added to every
#: eigenvalue before the power ``-gamma/2``, so directions of zero variance are scaled by at most
#: ``(eps * lambda_1)^(-gamma/2)`` instead of dividing by zero.
DEFAULT_EPS = 1e-6

#: Default tolerance of :func:`streamwhiten.core.staleness.staleness`'s ``total``: the published map is
#: kept while no direction's whitened variance (or the centre, in output standard deviations) is off by
#: more than this. ``benchmarks/staleness_quality.py`` chose it: on the real STS-B data every published
#: map within it lost less than 0.5 nDCG@10 and Spearman points against a refit (docs/nightly.md).
DEFAULT_MAX_STALENESS = 0.5


@dataclass(frozen=True)
class Param:
    """One parameter: what kind of value it takes and which ones are allowed.

    ``kind`` is ``int``, ``float``, ``bool``, ``str`` (a value of the command line or a job file is
    read as that kind) or ``dict`` (a mapping with names, text, for keys); numbers must be finite and lie in ``[low, high]``, with only the ends named in
    ``closed`` ("both", "left", "right", "neither") included; a ``str`` must be one of ``choices``;
    ``also`` lists other allowed values (-1 for "one per core"); ``none`` allows None (automatic).
    ``text`` says what the value must be, after "must be".
    """

    name: str
    kind: type
    default: object
    text: str
    low: float | None = None
    high: float | None = None
    closed: str = "both"
    choices: tuple = ()
    also: tuple = ()
    none: bool = False
    label: str | None = None  # the name in messages, if not ``name``

    def accepts(self, value) -> bool:
        if value is None:
            return self.none
        if self.kind is bool:
            return isinstance(value, bool) or _is_numpy_bool(value)
        if self.kind is str:
            return isinstance(value, str) and value in self.choices
        if self.kind is dict:
            return isinstance(value, Mapping) and all(isinstance(key, str) for key in value)
        if isinstance(value, bool) or _is_numpy_bool(value) or not isinstance(value, Real):
            return False
        if self.kind is int and not isinstance(value, Integral):
            return False
        if self.kind is int and self.choices:
            return value in self.choices
        if value in self.also:
            return True
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (value == self.low and self.closed in ("right", "neither"))):
            return False
        if self.high is not None and (value > self.high or (value == self.high and self.closed in ("left", "neither"))):
            return False
        return True

    def check(self, value, where: str | None = None):
        """``value`` if allowed, else :class:`BadInputError` ``"<where> must be <text>, got <value>"``."""
        if not self.accepts(value):
            raise BadInputError(f"{where or self.label or self.name} must be {self.text}, got {value!r}")
        return value


def _is_numpy_bool(value) -> bool:
    return type(value).__module__ == "numpy" and getattr(getattr(value, "dtype", None), "kind", None) == "b"


_COUNT = "a whole number of at least 1"
_PER_CORE = f"{_COUNT} (or -1 for one per core)"


def _params(*items: Param) -> dict:
    return {item.name: item for item in items}


#: Every parameter, by name.
PARAMS: dict[str, Param] = _params(
    # the whitening (changeable after a fit without another pass over the data)
    Param("beta", float, 1.0, "a number in [0, 1]", 0.0, 1.0),
    Param("gamma", float, 1.0, "a number in [0, 1]", 0.0, 1.0),
    Param("n_components", int, None, _COUNT, 1, none=True, label="n_components (k)"),
    Param("variance", float, None, "a fraction in (0, 1]", 0.0, 1.0, closed="right", none=True),
    Param("eps", float, DEFAULT_EPS, "a positive finite number", 0.0, None, closed="right"),
    Param("normalize", bool, False, "true or false"),
    # how the data is read and reduced
    Param("precision", str, "auto", "one of 'auto', 'float32', 'float64'", choices=("auto", "float32", "float64")),
    Param("skip_nonfinite", bool, False, "true or false"),
    Param("fill_missing_chunks", bool, False, "true or false"),
    Param("chunk_rows", int, None, _COUNT, 1, none=True),
    Param("n_jobs", int, None, _PER_CORE, 1, also=(-1,), none=True, label="n_jobs (worker threads)"),
    Param("threads", int, None, _PER_CORE, 1, also=(-1,), none=True),
    # a fit's checkpoints
    Param("checkpoint_every", int, 20, _COUNT, 1),
    Param("checkpoint_seconds", float, 60.0, "a number of seconds above 0", 0.0, None, closed="right"),
    # apply
    Param("progress_seconds", float, 10.0, "a number of seconds, 0 or more", 0.0, None),
    Param("dtype", str, "float32", '"float32" or "float16"', choices=("float32", "float16")),
    Param("zarr_format", int, 3, "2 or 3", choices=(2, 3)),
    Param("direct_io", bool, True, "true or false"),
    Param("compressor", str, "none", '"none", "zstd", "blosc" or "gzip"', choices=("none", "zstd", "blosc", "gzip")),
    Param("output_chunk_rows", int, None, _COUNT, 1, none=True),
    # object storage: how long a remote store may keep failing before a command gives up (seconds), and
    # the keyword arguments of the file systems of URLs (Whitener(storage_options=...), ReadOptions)
    Param("remote_timeout", float, 10.0, "a number of seconds above 0", 0.0, None, closed="right"),
    Param("storage_options", dict, None, "a mapping of option names (text) to values", none=True),
    # the Dask engine
    Param("workers", int, None, _COUNT, 1, none=True),
    Param("split_every", int, 8, "a whole number of at least 2", 2),
    # publishing: how stale the published map may get before a new version is published, and how many
    # versions are kept (nothing reads them yet; later [publish] in a job file, see docs/nightly.md)
    Param("max_staleness", float, DEFAULT_MAX_STALENESS, "a number, 0 or more", 0.0, None),
    Param("keep_versions", int, 2, _COUNT, 1),
    # retrieval evaluation: how the corpus is stored while searched, and the bootstrap
    Param(
        "storage",
        str,
        "float32",
        '"float32", "float16", "int8" or "binary"',
        choices=("float32", "float16", "int8", "binary"),
    ),
    Param("int8_clip", float, 4.0, "a number of standard deviations above 0", 0.0, None, closed="right"),
    Param("rescore", int, 0, "a whole number, 0 or more", 0),
    Param("rescore_storage", str, "float32", '"float32" or "int8"', choices=("float32", "int8")),
    Param("bootstrap", int, 1000, "a whole number of resamples, 0 or more", 0),
    Param("seed", int, 0, "a whole number, 0 or more", 0),
)

#: The parameters of the whitening itself, as :func:`~streamwhiten.core.model.finalize` takes them.
MODEL_PARAMS = ("beta", "gamma", "n_components", "variance", "eps")


def check(name: str, value, where: str | None = None):
    """``value`` if it is allowed for parameter ``name``, else :class:`BadInputError`."""
    return PARAMS[name].check(value, where)


def default(name: str):
    return PARAMS[name].default


def check_model(beta=1.0, gamma=1.0, eps=DEFAULT_EPS, n_components=None, variance=None, n_features=None) -> None:
    """Check the whitening's parameters, each and together (``n_features``: the data width, if known)."""
    for name, value in (
        ("beta", beta),
        ("gamma", gamma),
        ("eps", eps),
        ("n_components", n_components),
        ("variance", variance),
    ):
        check(name, value)
    if n_components is not None and variance is not None:
        raise BadInputError("give n_components (k) or variance, not both")
    if n_components is not None and n_features is not None and n_components > n_features:
        raise BadInputError(f"n_components (k) = {n_components} exceeds the data width d = {n_features}")


__all__ = ["Param", "PARAMS", "MODEL_PARAMS", "DEFAULT_EPS", "DEFAULT_MAX_STALENESS", "check", "check_model", "default"]
