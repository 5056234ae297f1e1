"""Option objects: what a read, a fit, an apply, an engine, a publication and a retrieval evaluation take, each
a frozen dataclass, checked when made against `streamwhiten.params.PARAMS` (the command line's and job files'
words: `BadInputError`). Pass them whole (``fit(..., read=ReadOptions(block_rows=65536))``); change one with
`dataclasses.replace`, which checks again. Standard library only, so the CLI builds them before numpy loads.

Examples
--------
>>> from streamwhiten.options import ApplyOptions, ReadOptions
>>> ReadOptions(block_rows=65536).block_rows
65536
>>> str(ApplyOptions(dtype="eigen:24").dtype)  # parsed once into a Storage; str() spells it
'eigen:24'
>>> ApplyOptions(dtype="int4")
Traceback (most recent call last):
...
streamwhiten.errors.BadInputError: dtype must be "float32", "float16", "int8", "binary" or a vector code NAME:BYTES ("eigen:24"), got 'int4'
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from . import params
from .errors import BadInputError
from .storage import Storage, parse_storage


class StorageOptions(Mapping):
    """Keyword arguments for the file systems of URLs (``endpoint_url``, ``key``, ``anon``, ...): a read-only
    mapping whose ``repr`` lists the keys only (values are often secrets); it pickles and compares by value."""

    __slots__ = ("_items",)
    _items: dict[str, Any]

    def __init__(self, items: Mapping[str, Any] | None = None):
        object.__setattr__(self, "_items", _plain(dict(items or {})))
        for key in self._items:
            if not isinstance(key, str):
                raise BadInputError(f"storage option names must be strings, got {key!r}")

    def __getitem__(self, key: str) -> Any:
        value = self._items[key]
        return StorageOptions(value) if isinstance(value, dict) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __setattr__(self, name: str, value: object):
        raise AttributeError("StorageOptions cannot be changed")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and self.to_dict() == _plain(other)

    def __hash__(self) -> int:
        return hash(json.dumps(self._items, sort_keys=True, default=repr))

    def __repr__(self) -> str:
        return f"StorageOptions(keys={sorted(self._items)})"

    def __reduce__(self):
        return StorageOptions, (self._items,)

    def to_dict(self) -> dict:
        """A deep copy as plain dicts (for the file system's keyword arguments)."""
        return _plain(self._items)


def _plain(mapping: Mapping) -> dict:
    """A deep copy as plain dicts."""
    return {key: _plain(value) if isinstance(value, Mapping) else value for key, value in mapping.items()}


def _check_fields(options: Any) -> None:
    """Check every field that is a parameter against `params.PARAMS`."""
    for item in fields(options):
        if item.name in params.PARAMS and not isinstance(getattr(options, item.name), Storage):
            params.check(item.name, getattr(options, item.name))


@dataclass(frozen=True)
class ReadOptions:
    """How input stores are found and read.

    Parameters
    ----------
    dataset : str, optional
        The dataset, array or column inside each input whose spec does not name one.
    block_rows : int, optional
        Rows per block the engine reads, reduces and merges (default: whole store chunks or row groups,
        about 64 MiB). Not the store's *chunk*, which is how it was written.
    fill_missing_chunks : bool
        Read chunks missing from a store (Zarr) or never written (HDF5) as the fill value, instead of
        refusing the store.
    storage_options : mapping, optional
        Keyword arguments of the file systems of URL inputs and outputs (`StorageOptions`; None: the
        environment's configuration alone).
    remote_timeout : float
        Seconds a remote store may keep failing before the read or write gives up (default:
        ``STREAMWHITEN_REMOTE_TIMEOUT``, else the parameter's default).
    """

    dataset: str | None = None
    block_rows: int | None = params.default("block_rows")
    fill_missing_chunks: bool = params.default("fill_missing_chunks")
    storage_options: StorageOptions | None = params.default("storage_options")
    remote_timeout: float = field(default_factory=lambda: default_remote_timeout())

    def __post_init__(self):
        if self.dataset is not None and not isinstance(self.dataset, str):
            raise BadInputError(f"dataset must be a name (a string), got {self.dataset!r}")
        _check_fields(self)
        object.__setattr__(self, "remote_timeout", float(self.remote_timeout))
        if self.storage_options is not None and not isinstance(self.storage_options, StorageOptions):
            object.__setattr__(self, "storage_options", StorageOptions(self.storage_options))


#: The environment variable that sets `ReadOptions.remote_timeout` where it is not given.
REMOTE_TIMEOUT_VARIABLE = "STREAMWHITEN_REMOTE_TIMEOUT"


def default_remote_timeout() -> float:
    """``STREAMWHITEN_REMOTE_TIMEOUT`` (checked as parameter ``remote_timeout``), else the parameter's default."""
    text = os.environ.get(REMOTE_TIMEOUT_VARIABLE)
    if not text:
        return float(params.default("remote_timeout"))
    try:
        value: float | str = float(text)
    except ValueError:
        value = text
    return float(params.check("remote_timeout", value, f"{REMOTE_TIMEOUT_VARIABLE}={text}: remote_timeout"))


@dataclass(frozen=True)
class Setting:
    """The whitening's parameters (``beta``, ``gamma``, ``n_components`` or ``variance``, ``eps``); one left
    None is not set: a fit takes its default, an apply, export or evaluation the model's saved setting."""

    beta: float | None = None
    gamma: float | None = None
    n_components: int | None = None
    variance: float | None = None
    eps: float | None = None

    def __post_init__(self):
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None:
                params.check(item.name, value)
        if self.n_components is not None and self.variance is not None:
            raise BadInputError("give n_components (k) or variance, not both")

    def given(self) -> dict:
        """The parameters set here, by name."""
        return {item.name: getattr(self, item.name) for item in fields(self) if getattr(self, item.name) is not None}


@dataclass(frozen=True)
class FitOptions:
    """How a fit reduces its rows and keeps its progress.

    Parameters
    ----------
    precision : {"auto", "float32", "float64"}
        Arithmetic of the scatter product ("auto": float64 for float64 stores, float32 otherwise).
    skip_nonfinite : bool
        Skip and count rows holding NaN or Inf instead of refusing them.
    checkpoint : str, optional
        The checkpoint file (default: ``.MODEL.checkpoint`` beside the model).
    checkpoint_every, checkpoint_seconds
        Checkpoint every this many blocks, or seconds, whichever comes first.
    resume : bool
        Require a checkpoint to resume from (a matching one is used anyway).
    restart : bool
        Discard a checkpoint and start over.
    overwrite : bool
        Replace an existing model file.
    """

    precision: str = params.default("precision")
    skip_nonfinite: bool = params.default("skip_nonfinite")
    checkpoint: str | None = None
    checkpoint_every: int = params.default("checkpoint_every")
    checkpoint_seconds: float = params.default("checkpoint_seconds")
    resume: bool = False
    restart: bool = False
    overwrite: bool = False

    def __post_init__(self):
        _check_fields(self)
        if self.resume and self.restart:
            raise BadInputError("give resume or restart, not both")


@dataclass(frozen=True)
class ApplyOptions:
    """What an apply writes and how.

    Parameters
    ----------
    normalize : bool
        Scale every output row to unit L2 norm (always, for int8 and binary: see ``dtype``).
    dtype : Storage, {"float32", "float16", "int8", "binary"}, a vector code "NAME:BYTES", or None
        The output values, parsed into a `Storage` (``str(options.dtype)`` spells it); None: the model's
        storage (what ``tune`` chose; float32 when it records none). ``int8`` codes (a scale and offset per
        component, from the statistics), ``binary`` sign bits (``ceil(k / 8)`` uint8 per row) and vector
        codes are of the unit vectors, so they set ``normalize``; the output records how to decode them.
    skip_nonfinite : bool
        Write NaN rows for input rows holding NaN or Inf instead of refusing them (float outputs only).
    zarr_format : {2, 3}
        The format of a Zarr output.
    compressor : {"none", "zstd", "blosc", "gzip"}
        Compression of each output chunk (HDF5 and Zarr outputs).
    direct_io : bool
        Write whole output chunks around the page cache where the file system allows it.
    checksums : bool
        Store a checksum with every output chunk, verified when read (HDF5's fletcher32, Zarr 3's crc32c;
        Parquet pages always carry theirs, Zarr 2 and Lance outputs have none).
    keep_columns : tuple of str
        Input columns (Parquet or Lance input) copied row for row into a Parquet or Lance output.
    progress_seconds : float
        Make the rows written durable and record them for a resume every this many seconds (0: every block).
    restart : bool
        Discard the partial output of an interrupted run instead of resuming it.
    overwrite : bool
        Replace an existing output written by streamwhiten that is not up to date (an up-to-date one is
        kept: `NothingToDoError`).
    """

    normalize: bool = params.default("normalize")
    dtype: Storage | None = params.default("dtype")  # type: ignore[assignment]  # parsed in __post_init__
    skip_nonfinite: bool = params.default("skip_nonfinite")
    zarr_format: int = params.default("zarr_format")
    compressor: str = params.default("compressor")
    direct_io: bool = params.default("direct_io")
    checksums: bool = params.default("checksums")
    keep_columns: tuple[str, ...] = ()
    progress_seconds: float = params.default("progress_seconds")
    restart: bool = False
    overwrite: bool = False

    def __post_init__(self):
        if self.dtype is not None:
            object.__setattr__(self, "dtype", parse_storage(self.dtype))
        _check_fields(self)
        object.__setattr__(self, "keep_columns", column_names(self.keep_columns))
        if self.dtype is not None and self.dtype.coded:  # codes and bits are of the unit vectors, as searched
            if self.skip_nonfinite:
                raise BadInputError(
                    f"dtype {str(self.dtype)!r} cannot hold the NaN rows skip_nonfinite writes; write float32 or float16"
                )
            object.__setattr__(self, "normalize", True)

    def storing(self, default: Storage | None) -> ApplyOptions:
        """These options with ``dtype`` None made ``default`` (a model's storage; float32 when None)."""
        return self if self.dtype is not None else replace(self, dtype=default or Storage())


@dataclass(frozen=True)
class PublishOptions:
    """How ``run`` keeps a published version of a job's outputs (a job's ``[publish]`` table).

    Parameters
    ----------
    max_staleness : float
        Tolerance of the published map's staleness total: within it, new rows are appended with the
        published map; above it, a new version is published.
    keep_versions : int
        Published versions kept on disk, the current one included.
    """

    max_staleness: float = params.default("max_staleness")
    keep_versions: int = params.default("keep_versions")

    def __post_init__(self):
        _check_fields(self)
        object.__setattr__(self, "max_staleness", float(self.max_staleness))


@dataclass(frozen=True)
class RetrievalOptions:
    """What a retrieval evaluation reads besides its queries, corpus and qrels, and how
    ([`evaluate_retrieval`][streamwhiten.evaluation.retrieval.evaluate_retrieval] and the sweep of ``tune``).

    Parameters
    ----------
    exclude : str or path, optional
        A file of ``(query, corpus)`` pairs dropped from that query's candidates.
    query_id_column, corpus_id_column : str, optional
        Parquet or Lance stores: the columns of the ids the qrels and exclude file use (None: 0-based rows).
    bootstrap : int
        Resamples of the queries for each paired 95% interval (0: none).
    seed : int
        The seed of the bootstrap's resampling.
    block_rows : int, optional
        Corpus rows per block read (default: whole store chunks of a few tens of MiB).
    threads : int, optional
        Worker threads of the search (-1: one per core; default: one per core, at most four).
    """

    exclude: str | os.PathLike | None = None
    query_id_column: str | None = None
    corpus_id_column: str | None = None
    bootstrap: int = params.default("bootstrap")
    seed: int = params.default("seed")
    block_rows: int | None = params.default("block_rows")
    threads: int | None = params.default("threads")

    def __post_init__(self):
        if self.exclude is not None and not isinstance(self.exclude, (str, os.PathLike)):
            raise BadInputError(f"exclude must be a file (a path), got {self.exclude!r}")
        for name in ("query_id_column", "corpus_id_column"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise BadInputError(f"{name} must be a column name (a string), got {getattr(self, name)!r}")
        _check_fields(self)


def column_names(names: str | Iterable[object] | None) -> tuple[str, ...]:
    """``names`` (a sequence, or one comma-separated string) as a tuple of names, each once."""
    if names is None:
        return ()
    items = names.split(",") if isinstance(names, str) else list(names)
    result = tuple(str(name).strip() for name in items if str(name).strip())
    repeated = sorted({name for name in result if result.count(name) > 1})
    if repeated:
        raise BadInputError(f"keep_columns names {repeated[0]!r} twice", param="keep_columns")
    return result


#: The engines, by name.
ENGINES = ("serial", "dask")


@dataclass(frozen=True)
class EngineOptions:
    """Which engine runs the blocks, and with what.

    Parameters
    ----------
    name : {"serial", "dask"}
        ``serial``: worker threads in this process; ``dask``: a Dask cluster.
    threads : int, optional
        Serial engine: worker threads (-1: one per core; default: a fit one per core, at most four).
    scheduler : str, optional
        Dask: the scheduler's address (default: a local cluster).
    workers : int, optional
        Dask without a scheduler: processes of the local cluster.
    split_every : int
        Dask: states merged by one task of the reduction tree.
    """

    name: str = "serial"
    threads: int | None = params.default("threads")
    scheduler: str | None = None
    workers: int | None = params.default("workers")
    split_every: int = params.default("split_every")

    def __post_init__(self):
        if self.name not in ENGINES:
            raise BadInputError(f"engine must be one of {', '.join(ENGINES)}, got {self.name!r}")
        _check_fields(self)
        if self.name != "dask" and (self.scheduler or self.workers is not None):
            raise BadInputError("scheduler and workers need engine='dask'", param=("scheduler", "workers", "engine"))
        if self.name == "dask" and self.threads is not None:
            raise BadInputError(
                "threads is for the serial engine; with engine='dask', use workers",
                param=("threads", "engine", "workers"),
            )
        if self.scheduler and self.workers is not None:
            raise BadInputError(
                "workers sizes a local cluster; it cannot be combined with scheduler", param=("workers", "scheduler")
            )


__all__ = [
    "ENGINES",
    "ApplyOptions",
    "EngineOptions",
    "FitOptions",
    "PublishOptions",
    "ReadOptions",
    "RetrievalOptions",
    "Setting",
    "StorageOptions",
    "column_names",
    "default_remote_timeout",
]
