"""Every parameter, declared once: its kind, default and allowed values, and the job-file tables that
take it.

The estimator ([`Whitener`][streamwhiten.whitener.Whitener]), the option objects of
`streamwhiten.options` (``FitOptions``, ``ApplyOptions``, ``ReadOptions``, ...), the command line (its
options are made from this registry: type, default; their flags and help are the CLI's own, in
`streamwhiten.cli._flags`) and job files (``[input]``, ``[model]``,
``[apply]``, ``[publish]``: the keys each table takes are listed here) all check a value against `PARAMS`, so a bad
one is refused in the same words wherever it is given, as one `BadInputError` (exit 2):

    beta must be a number in [0, 1], got 1.5                      (Python)
    Invalid value for '--beta': beta must be a number in [0, 1], got 1.5      (command line)
    job.toml: beta in [model] must be a number in [0, 1], got 1.5            (job file)

A renamed parameter keeps its old name as an alias (``chunk_rows`` for ``block_rows``), refused in its own
words. Rules between parameters are `check_model`'s. Standard library only: the command line checks its
options before numpy loads.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from numbers import Integral, Real
from typing import Any, TypeVar

from .errors import BadInputError

#: Default regulariser, relative to the largest eigenvalue: ``eps_ = eps * lambda_1`` is added to every
#: eigenvalue before the power ``-gamma/2``, so directions of zero variance are scaled by at most
#: ``(eps * lambda_1)^(-gamma/2)`` instead of dividing by zero.
DEFAULT_EPS = 1e-6

#: Default tolerance of [`streamwhiten.core.staleness.staleness`][streamwhiten.core.staleness.staleness]'s ``total``:
#: the published map is
#: kept while no direction's whitened variance (or the centre, in output standard deviations) is off by
#: more than this. ``benchmarks/staleness_quality.py`` chose it: on the real STS-B data every published
#: map within it lost less than 0.5 nDCG@10 and Spearman points against a refit (docs/nightly.md).
DEFAULT_MAX_STALENESS = 0.5

_T = TypeVar("_T")


@dataclass(frozen=True)
class Param:
    """One parameter: what kind of value it takes and which ones are allowed.

    ``kind`` is ``int``, ``float``, ``bool``, ``str``, ``dict`` (text keys) or ``tuple`` (names, or one
    comma-separated string); numbers are finite and in ``[low, high]`` (``closed``: which ends are in); a
    ``str`` is one of ``choices`` or matches ``pattern``; ``also``: other allowed values (-1, one per
    core); ``none`` allows None; ``text`` follows "must be". ``job``: the job-file tables that take it;
    ``aliases``: former names, still taken.
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
    job: tuple = ()
    aliases: tuple = ()
    alias_of: str | None = None  # set on an alias's own entry: the parameter it is a former name of
    pattern: str | None = None  # a str parameter: what it may be besides its choices (a regular expression)

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.none
        if self.kind is tuple:
            return isinstance(value, str) or (
                isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value)
            )
        if self.kind is bool:
            return isinstance(value, bool) or _is_numpy_bool(value)
        if self.kind is str:
            return isinstance(value, str) and (
                value in self.choices or (self.pattern is not None and re.fullmatch(self.pattern, value) is not None)
            )
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
        # typeshed's numbers.Real declares __lt__ and __le__ but not __gt__ (a Real compares either way)
        if self.high is not None and (value > self.high or (value == self.high and self.closed in ("left", "neither"))):  # type: ignore[operator]
            return False
        return True

    def check(self, value: _T, where: str | None = None) -> _T:
        """``value`` if allowed, else `BadInputError` ``"<where> must be <text>, got <value>"``."""
        if not self.accepts(value):
            raise BadInputError(f"{where or self.label or self.name} must be {self.text}, got {value!r}")
        return value


def _is_numpy_bool(value: object) -> bool:
    return type(value).__module__ == "numpy" and getattr(getattr(value, "dtype", None), "kind", None) == "b"


_COUNT = "a whole number of at least 1"
#: The most worker threads or processes taken: each holds a block in memory, so a value far beyond any
#: machine's cores is a mistake (``--threads 1000000`` would start a million threads), refused by name.
MAX_WORKERS = 1024
_PER_CORE = f"a whole number from 1 to {MAX_WORKERS} (or -1 for one per core)"
#: The most bootstrap resamples: beyond it the interval's ends no longer move, and tune draws them all at
#: once (resamples x queries indices).
MAX_BOOTSTRAP = 100_000


def _params(*items: Param) -> dict[str, Param]:
    """The registry by name, each alias beside its parameter (an entry of its own, checked and named as
    the alias, so ``chunk_rows=0`` is refused as "chunk_rows must be ...")."""
    table = {}
    for item in items:
        table[item.name] = item
        for alias in item.aliases:
            table[alias] = replace(item, name=alias, label=None, aliases=(), alias_of=item.name)
    return table


_MODEL, _APPLY, _INPUT = ("model",), ("apply",), ("input",)
_PRECISIONS, _COMPRESSORS = ("auto", "float32", "float64"), ("none", "zstd", "blosc", "gzip")

#: The values of ``dtype`` that store codes, not floats (int8 codes, packed sign bits): always of unit
#: vectors, never NaN, decoded with the record the output carries.
CODED_DTYPES = ("int8", "binary")
#: A vector code as a dtype: ``NAME:BYTES`` (``eigen:24``; the names are ``streamwhiten.storage.CODES``, which
#: `streamwhiten.storage.parse_storage` checks).
CODE_PATTERN = r"[a-z][a-z0-9+-]*:[0-9]+"


#: Every parameter, by name (aliases included: see `NAMES` for the parameters alone).
PARAMS: dict[str, Param] = _params(
    # the whitening (changeable after a fit without another pass over the data)
    Param("beta", float, 1.0, "a number in [0, 1]", 0.0, 1.0, job=_MODEL),
    Param("gamma", float, 1.0, "a number in [0, 1]", 0.0, 1.0, job=_MODEL),
    Param("n_components", int, None, _COUNT, 1, none=True, label="n_components (k)", job=_MODEL),
    Param("variance", float, None, "a fraction in (0, 1]", 0.0, 1.0, closed="right", none=True, job=_MODEL),
    Param("eps", float, DEFAULT_EPS, "a positive finite number", 0.0, None, closed="right", job=_MODEL),
    Param("normalize", bool, False, "true or false", job=_APPLY),
    # how the data is read and reduced
    Param("precision", str, "auto", "one of 'auto', 'float32', 'float64'", choices=_PRECISIONS, job=_MODEL),
    Param("skip_nonfinite", bool, False, "true or false", job=("model", "apply")),
    Param("fill_missing_chunks", bool, False, "true or false", job=_INPUT),
    Param("block_rows", int, None, _COUNT, 1, none=True, job=("model", "apply"), aliases=("chunk_rows",)),
    Param("n_jobs", int, None, _PER_CORE, 1, MAX_WORKERS, also=(-1,), none=True, label="n_jobs (worker threads)"),
    Param("threads", int, None, _PER_CORE, 1, MAX_WORKERS, also=(-1,), none=True, job=("model", "apply")),
    # a fit's checkpoints
    Param("checkpoint_every", int, 20, _COUNT, 1, job=_MODEL),
    Param("checkpoint_seconds", float, 60.0, "a number of seconds above 0", 0.0, None, closed="right", job=_MODEL),
    # apply
    Param("progress_seconds", float, 10.0, "a number of seconds, 0 or more", 0.0, None, job=_APPLY),
    Param(
        "dtype",
        str,
        "float32",
        '"float32", "float16", "int8", "binary" or a vector code NAME:BYTES ("eigen:24")',
        choices=("float32", "float16", "int8", "binary"),
        none=True,
        job=_APPLY,
        pattern=CODE_PATTERN,
    ),
    Param("zarr_format", int, 3, "2 or 3", choices=(2, 3), job=_APPLY),
    Param("direct_io", bool, True, "true or false", job=_APPLY),
    Param("compressor", str, "none", '"none", "zstd", "blosc" or "gzip"', choices=_COMPRESSORS, job=_APPLY),
    Param("checksums", bool, True, "true or false", job=_APPLY),
    Param("keep_columns", tuple, (), "a list of column names", job=_APPLY),
    Param("output_chunk_rows", int, None, _COUNT, 1, none=True),
    # object storage: how long a remote store may keep failing before a command gives up (seconds), and
    # the keyword arguments of the file systems of URLs (ReadOptions, which Whitener(read=...) takes)
    Param("remote_timeout", float, 10.0, "a number of seconds above 0", 0.0, None, closed="right", job=_INPUT),
    Param("storage_options", dict, None, "a mapping of option names (text) to values", none=True),
    # the Dask engine
    Param("workers", int, None, f"a whole number from 1 to {MAX_WORKERS}", 1, MAX_WORKERS, none=True),
    Param("split_every", int, 8, "a whole number of at least 2", 2),
    # publishing (a job's [publish] table, docs/nightly.md): how stale the published map may get before
    # run publishes a new version, and how many versions are kept on disk
    Param(
        "max_staleness",
        float,
        DEFAULT_MAX_STALENESS,
        "a number, 0 or more",
        0.0,
        None,
        also=(math.inf,),
        job=("publish",),
    ),
    Param("keep_versions", int, 2, _COUNT, 1, job=("publish",)),
    # retrieval evaluation: how the corpus is stored while searched (``dtype`` above), the re-ranking of a
    # bit search, the bootstrap, and the byte budget of tune
    Param("int8_clip", float, 4.0, "a number of standard deviations above 0", 0.0, None, closed="right"),
    Param("rescore", int, 0, "a whole number, 0 or more", 0),
    Param("rescore_dtype", str, "float32", '"float32" or "int8"', choices=("float32", "int8")),
    Param("bootstrap", int, 1000, f"a whole number of resamples from 0 to {MAX_BOOTSTRAP:,}", 0, MAX_BOOTSTRAP),
    Param("seed", int, 0, "a whole number, 0 or more", 0),
    Param("max_bytes", int, None, "a whole number of bytes of at least 1", 1, none=True),
)

#: The parameters alone (no aliases), in declaration order.
NAMES = tuple(name for name, item in PARAMS.items() if item.alias_of is None)


def job_keys(table: str) -> tuple:
    """The parameters a job file's ``[table]`` takes as keys (aliases included), in declaration order."""
    return tuple(name for name, item in PARAMS.items() if table in item.job)


#: The parameters of the whitening itself, as `finalize` takes them.
MODEL_PARAMS = ("beta", "gamma", "n_components", "variance", "eps")


def check(name: str, value: _T, where: str | None = None) -> _T:
    """``value`` if it is allowed for parameter ``name``, else `BadInputError`."""
    return PARAMS[name].check(value, where)


def default(name: str) -> Any:
    return PARAMS[name].default


def check_model(
    beta: float = 1.0,
    gamma: float = 1.0,
    eps: float = DEFAULT_EPS,
    n_components: int | None = None,
    variance: float | None = None,
    n_features: int | None = None,
) -> None:
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


__all__ = [
    "CODED_DTYPES",
    "Param",
    "PARAMS",
    "NAMES",
    "MODEL_PARAMS",
    "DEFAULT_EPS",
    "DEFAULT_MAX_STALENESS",
    "check",
    "check_model",
    "default",
    "job_keys",
]
