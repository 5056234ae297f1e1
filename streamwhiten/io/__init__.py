"""Reading and writing embedding stores: specs, one module per backend, durable writes.

``spec`` parses what the user names and decides which backend reads or writes it; ``base`` defines the
interface every backend implements (a :class:`Source` of rows, a :class:`Sink` for outputs, the
fingerprint); ``hdf5``, ``zarr``, ``npy``, ``parquet`` and ``lance`` are the backends, each the only
importer of its library, imported only when a store of its kind is opened (pyarrow and pylance are
optional extras; ``_arrow`` holds what the last two share); ``direct`` makes writes fast, and
``streamwhiten._durable`` (below this package: model files and checkpoints need it too) makes them safe;
``remote`` reaches object storage and other URLs through fsspec (an optional extra too).
The functions here are what the rest of the package uses.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil

import numpy as np

from .. import __version__
from .. import _durable as durable
from .._durable import remove_stale_temps
from .._paths import check_readable
from ..errors import BadInputError, StoreIOError, StreamwhitenError
from ..records import ResumeRecord
from . import remote, text
from .base import (
    DEFAULT_BLOCK_BYTES,
    FINGERPRINT_ROWS,
    OUTPUT_CHUNK_BYTES,
    OWNER_ATTR,
    LazyRows,
    Sampler,
    Sink,
    Source,
    aligned_chunk_rows,
    check_array,
    count_blocks,
    describe,
    fingerprint,
    first_line,
    identity_of,
    io_error,
    output_chunk_rows,
    remove,
)
from .spec import (
    HDF5_SUFFIXES,
    ZARR_SUFFIX,
    expand_specs,
    input_kind,
    output_kind,
    partial_path,
    refuse_input_overlap,
    refuse_shared_outputs,
    same_file,
    split_spec,
    zarr_store_above,
)

_SOURCES = {
    "hdf5": ("hdf5", "HDF5Source"),
    "zarr": ("zarr", "ZarrSource"),
    "npy": ("npy", "NpySource"),
    "parquet": ("parquet", "ParquetSource"),
    "lance": ("lance", "LanceSource"),
}
_SINKS = {
    "hdf5": ("hdf5", "HDF5Sink"),
    "zarr": ("zarr", "ZarrSink"),
    "parquet": ("parquet", "ParquetSink"),
    "lance": ("lance", "LanceSink"),
}
#: Backends that need an optional extra: (the library, what it is for, the extra that installs it).
_EXTRAS = {"parquet": ("pyarrow", "Parquet", "parquet"), "lance": ("pylance", "Lance datasets", "lance")}
#: What each kind of output is called in the message that refuses to replace something else.
_OUTPUT_NAMES = {
    "hdf5": "an HDF5 output",
    "zarr": "a Zarr output",
    "parquet": "a Parquet output",
    "lance": "a Lance output",
}
#: Outputs whose blocks are written as row groups or fragments (any size), carrying other columns.
_TABULAR = ("parquet", "lance")
#: Backends that read URLs, and those that write them.
_REMOTE_SOURCES = ("zarr", "npy", "parquet", "hdf5", "lance")
_REMOTE_SINKS = {"zarr": ("zarr", "RemoteZarrSink"), "parquet": ("parquet", "ParquetSink")}


def exists(path: str) -> bool:
    """Whether a local path or a URL exists (a file, directory, object or prefix)."""
    path = remote.local_path(path)
    return remote.exists(path) if remote.is_url(path) else os.path.lexists(path)


def output_exists(spec: str) -> bool:
    """Whether an output is at ``spec``. A remote Zarr output written in place that is not complete (its
    ``complete`` attribute false: a run still writing it, or killed) counts as absent, as everywhere here."""
    path = remote.local_path(split_spec(spec)[0])
    if not remote.is_url(path):
        return os.path.lexists(path)
    if not remote.exists(path):
        return False
    if output_kind(path) != "zarr":
        return True
    return not _incomplete_zarr(path)


def foreign_output(path: str, kind: str | None = None) -> str | None:
    """None when the store at ``path`` is an output streamwhiten wrote, of ``kind`` (default: the kind
    its name asks for), which ``--overwrite`` may replace; else what it is instead ("a directory", "an
    HDF5 file holding a dataset streamwhiten did not write: /x", ...). Each backend recognises its own
    outputs by the attributes every one of them records (:data:`~streamwhiten.io.base.OWNER_ATTR`)."""
    path = remote.local_path(path)
    kind = kind or output_kind(path)
    if not remote.is_url(path):
        found = durable.link_or_kind(path, directory=kind in ("zarr", "lance"))
        if found is not None:
            return found
    try:
        return backend(kind).foreign_output(path)
    except (BadInputError, StoreIOError):
        raise
    except Exception as exc:  # noqa: BLE001 - unreadable: not known to be ours, so not replaced
        return f"it cannot be read as one: {first_line(exc)}"


def check_replaceable(spec: str, overwrite: bool) -> None:
    """The one rule for a store output that may exist already (apply, run, the Dask engine, the demo's
    data, local or remote; checked again at the final rename): nothing there, or ``overwrite`` and an
    output of ours of the same kind (:func:`foreign_output`); else :class:`OutputExistsError` or
    :class:`~streamwhiten.errors.ForeignOutputError` (both exit 2), and nothing is touched."""
    path = remote.local_path(split_spec(spec)[0])
    kind = output_kind(path)
    durable.check_replaceable(
        path,
        overwrite,
        _OUTPUT_NAMES.get(kind, f"a {kind} output"),
        lambda found: foreign_output(found, kind),
        exists=output_exists,
        label=remote.redact(path),
    )


def lock_path(path: str) -> str:
    """``.NAME.lock`` beside the output ``path``: the lock of the run writing it."""
    head, tail = os.path.split(os.path.abspath(path.rstrip("/")))
    return os.path.join(head, f".{tail}.lock")


def output_lock(spec: str):
    """A context holding the output's lock (:func:`lock_path`) for a whole run writing it, so a second
    run of the same output exits 75 (:class:`~streamwhiten.errors.LockedError`) instead of replacing
    the first one's partial output; the lock file is removed on release. Object storage has no lock
    (a prefix cannot be locked): there, two runs of one output must not be started at once."""
    path = remote.local_path(split_spec(spec)[0])
    if remote.is_url(path):
        return contextlib.nullcontext()
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(parent):
        raise BadInputError(f"{path}: directory {parent} does not exist")
    return durable.exclusive_lock(
        lock_path(path),
        lambda holder: f"{path}: another run is writing this output (pid {holder}); not starting a second one",
        remove=True,
    )


def _incomplete_zarr(url: str) -> bool:
    """Whether the remote Zarr store at ``url`` is an output of ours that is not complete."""
    import json

    for name in ("zarr.json", ".zattrs"):
        try:
            raw = remote.cat(remote.join(url, name))
        except BadInputError:
            continue
        try:
            attrs = json.loads(raw)
        except ValueError:
            return False
        attrs = attrs.get("attributes", attrs) if name == "zarr.json" else attrs
        return isinstance(attrs, dict) and "complete" in attrs and "model_checksum" in attrs and not attrs["complete"]
    return False


def _missing_bucket(url: str) -> str:
    head, rest = remote.split_url(url)
    root = head + rest.split("/", 1)[0]
    try:
        return "" if remote.exists(root) else f" (the bucket {remote.redact(root)} does not exist)"
    except Exception:
        return ""


def _refuse_incomplete(source: Source) -> None:
    """An output of ours whose ``complete`` attribute is false is not there yet: refuse to read it."""
    attrs = source.attrs()
    if "complete" in attrs and "model_checksum" in attrs and not attrs["complete"]:
        raise BadInputError(
            f"{source.label}: an output that is not complete (complete = false): it is being written, "
            "or the run writing it was stopped; run that apply again to finish it"
        )


def backend(kind: str):
    """The module of a backend, imported on first use (so ``import streamwhiten`` stays light); a missing
    optional extra is one line saying which ``pip install`` brings it."""
    try:
        return importlib.import_module(f"{__name__}.{kind}")
    except ImportError as exc:
        if kind not in _EXTRAS or (exc.name or "").split(".")[0] not in ("pyarrow", "lance"):
            raise
        library, what, extra = _EXTRAS[kind]
        raise BadInputError(
            f"reading or writing {what} needs {library}, which is not installed: pip install 'streamwhiten[{extra}]'"
        ) from None


def _backend_class(table: dict, kind: str):
    module, name = table[kind]
    return getattr(backend(module), name)


def open_source(spec: str, dataset: str | None = None, min_rows: int = 1, fill_missing_chunks: bool = False) -> Source:
    """Open ``spec`` read-only and check it is a 2-D float array with at least ``min_rows`` rows.

    A chunk missing from the store (Zarr) or never written (HDF5) is refused when read, naming the
    rows it covers, unless ``fill_missing_chunks``: then it reads as the array's fill value.
    """
    if isinstance(spec, Source):
        return spec
    path, inner = split_spec(spec, dataset)
    if remote.is_url(path):
        remote.check_url(path)
        if not remote.exists(path):
            raise BadInputError(f"{remote.redact(path)}: no such object or prefix{_missing_bucket(path)}")
    elif not os.path.lexists(path) and zarr_store_above(path) is not None:
        path, name = zarr_store_above(path)  # dir.zarr/array where no such array is: the store says what it holds
        inner = f"{name}/{inner}" if inner else name
        check_readable(path)
    else:
        check_readable(path)
    source = _backend_class(_SOURCES, input_kind(path))(path, inner)
    source.fill_missing_chunks = bool(fill_missing_chunks)
    try:
        check_array(source.label, source.shape, source.dtype, min_rows)
        _refuse_incomplete(source)
    except BaseException:
        source.close()
        raise
    return source


def read_vector(spec: str, dataset: str | None = None, min_length: int = 1) -> tuple[np.ndarray, str]:
    """A whole 1-D numeric array (e.g. gold scores) as float64, and its label.

    ``spec`` is ``file.h5:/dataset``, ``dir.zarr[:/array]``, ``file.npy``, ``file.parquet:column``, or a
    column of a delimited text file: ``file.csv:NAME`` (a header field) or ``file.tsv:INDEX`` (0-based,
    every line data; see :mod:`streamwhiten.io.text`). A store holding exactly one 1-D array needs no
    name. An ``(n, 1)`` column is accepted and flattened.
    """
    path, inner = split_spec(spec, dataset)
    if remote.is_url(path):
        if not exists(path):
            raise BadInputError(f"{remote.redact(path)}: no such object or prefix{_missing_bucket(path)}")
    else:
        check_readable(path)
    label = f"{path}:/{inner}" if inner else path
    try:
        if text.is_text(path):
            values, label = text.read_column(path, inner)
        else:
            values, label = backend(input_kind(path)).read_vector(path, inner)
    except StreamwhitenError:
        raise
    except (OSError, RuntimeError) as exc:
        raise StoreIOError(f"{label}: cannot read: {io_error(exc)}") from exc
    except ValueError as exc:
        raise BadInputError(f"{label}: cannot read ({exc})") from exc
    values = np.asarray(values)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1:
        raise BadInputError(f"{label}: expected a 1-D array, got shape {values.shape}")
    if values.dtype.kind not in "fiub":
        raise BadInputError(f"{label}: expected numbers, got dtype {values.dtype}")
    if values.shape[0] < min_length:
        raise BadInputError(f"{label}: has {values.shape[0]} value(s); at least {min_length} are needed")
    return values.astype(np.float64), label


def read_ids(source: Source, column: str) -> list[str]:
    """The values of ``column`` of a Parquet or Lance store, row by row, as strings: the ids of its rows.

    A store of another kind has no id column (its ids are its 0-based rows); a missing column, a null
    id or an id given to two rows is a :class:`BadInputError` naming the store (and the rows).
    """
    if source.kind not in _TABULAR:
        raise BadInputError(
            f"{source.label}: an id column needs a Parquet or Lance store; the ids of a {source.kind} store "
            "are its 0-based rows"
        )
    try:
        source.column_schema([column])
    except BadInputError:
        raise BadInputError(f"{source.label}: has no column {column!r} to read ids from") from None
    ids: list[str] = []
    seen: dict[str, int] = {}
    for start, stop in source.blocks(source.default_block_rows()):
        for offset, value in enumerate(source.read_columns(start, stop, [column]).column(0).to_pylist()):
            row = start + offset
            if value is None:
                raise BadInputError(f"{source.label}: row {row}: the id column {column!r} is null")
            key = value.decode() if isinstance(value, bytes) else str(value)
            if key in seen:
                raise BadInputError(f"{source.label}: rows {seen[key]} and {row} have the same id {key!r}")
            seen[key] = row
            ids.append(key)
    return ids


def read_attrs(spec: str) -> dict:
    """The attributes of the array named by ``spec`` (for tests and ``info``)."""
    with open_source(spec, min_rows=0) as source:
        return source.attrs()


def create_sink(
    spec: str,
    n_rows: int,
    n_features: int,
    dtype="float32",
    attrs: dict | None = None,
    overwrite: bool = False,
    zarr_format: int = 3,
    chunk_rows: int | None = None,
    direct_io: bool = True,
    columns=None,
    compressor: str = "none",
) -> Sink:
    """Start writing a new ``n_rows x n_features`` array at ``spec`` under a temporary name.

    With ``direct_io``, whole aligned chunks are written around the page cache (see ``direct``).
    Every attribute exists from the start (commit only changes values), so a resumed HDF5 output's
    metadata is laid out as an uninterrupted run's and the two files are byte for byte the same.
    ``columns`` (a schema from :meth:`Source.column_schema`) are input columns a Parquet output carries
    row for row beside the vectors. ``compressor`` (``codecs.COMPRESSORS``; HDF5 and Zarr outputs)
    compresses each output chunk in the writer thread. A URL is written in place instead: Zarr with
    its ``complete`` attribute set last, Parquet as part objects beside it, joined into one object that
    appears only when its upload completes.
    """
    path, dataset = split_spec(spec)
    kind = output_kind(path)
    if kind not in _SINKS:
        raise BadInputError(f"{path}: writing {kind} outputs is not supported; write .parquet, .zarr or .h5")
    if columns is not None and len(columns) and kind not in _TABULAR:
        raise BadInputError(f"{path}: --keep-columns needs a Parquet or Lance output (.parquet, .lance), not {kind}")
    check_output_compressor(spec, compressor)
    url = remote.is_url(path)
    if url:
        _check_remote_output(path, kind, overwrite, compressor)
    else:
        _check_local_output(path, overwrite)
    dtype = np.dtype(dtype)
    if dtype not in (np.float16, np.float32, np.float64):
        raise BadInputError(f"output dtype must be float16, float32 or float64, got {dtype}")
    chunk_rows = int(chunk_rows or output_chunk_rows(n_features, dtype, n_rows))
    partial = partial_path(path)
    if url:
        remote.remove(partial, recursive=True)
        remote.remove(partial + ".progress.json")
    else:
        _clear_local_partial(path, partial, n_rows * n_features * dtype.itemsize)
    attrs = dict(attrs or {}, complete=False, n_nonfinite_rows=0)
    attrs.setdefault(OWNER_ATTR, __version__)  # what marks it as ours (see foreign_output)
    sink_class = _backend_class(_REMOTE_SINKS if url else _SINKS, kind)
    options = {"columns": columns} if kind in _TABULAR else {"compressor": compressor}
    try:
        return sink_class.create(
            path,
            dataset,
            partial,
            (n_rows, n_features),
            dtype,
            chunk_rows,
            attrs,
            direct_io=False if url else direct_io,
            zarr_format=zarr_format,
            **options,
        )
    except Exception as exc:
        if url:
            if isinstance(exc, (BadInputError, StoreIOError)):
                raise
            raise remote.failure(path, "create the output", exc) from None
        remove(partial)
        if isinstance(exc, (OSError, RuntimeError)) or exc.__class__.__module__.startswith(("zarr", "pyarrow")):
            raise StoreIOError(f"{path}: cannot create output: {io_error(exc)}") from exc
        raise


def _check_local_output(path: str, overwrite: bool) -> None:
    """Refuse a local output that exists (unless ``overwrite`` and it is ours: :func:`check_replaceable`)
    or whose directory does not."""
    check_replaceable(path, overwrite)
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(parent):
        raise BadInputError(f"{path}: directory {parent} does not exist")


def _check_remote_output(path: str, kind: str, overwrite: bool, compressor: str) -> None:
    """Refuse an output URL of a kind object storage cannot take, one that exists (unless ``overwrite``
    and it is ours: :func:`check_replaceable`), or one in a bucket that does not."""
    if compressor != "none":
        raise BadInputError(
            f"{remote.redact(path)}: --compressor is not supported for object-storage outputs "
            "yet; write it uncompressed, or to a local path"
        )
    remote.check_url(path)
    if kind not in _REMOTE_SINKS:
        raise BadInputError(
            f"{remote.redact(path)}: {kind} outputs cannot be written to object storage; write .zarr or .parquet"
        )
    check_replaceable(path, overwrite)
    head, rest = remote.split_url(path)
    root = head + rest.split("/", 1)[0]
    if not remote.exists(root):
        raise BadInputError(f"{remote.redact(root)}: no such bucket or container for the output")


def _clear_local_partial(path: str, partial: str, needed: int) -> None:
    """Remove what earlier runs left of ``path``'s partial output, then refuse to start when the disk
    has less than ``needed`` bytes free."""
    try:
        remove_stale_temps(path)
        remove(partial)
        remove(partial + ".progress.json")  # a record of an earlier partial must never describe this one
        remove(partial + ".chunks")  # an earlier compressed HDF5 output's spool
        remove_stale_temps(partial + ".progress.json")
    except OSError as exc:
        raise StoreIOError(f"{partial}: cannot remove the partial output of an earlier run: {io_error(exc)}") from exc
    parent = os.path.dirname(os.path.abspath(path)) or "."
    free = shutil.disk_usage(parent).free
    if needed > free:
        raise StoreIOError(
            f"{path}: the output needs about {needed / 1e6:,.1f} MB but only {free / 1e6:,.1f} MB are free in {parent}"
        )


def check_output_compressor(spec: str, compressor: str) -> None:
    """Refuse a ``compressor`` that is not one of ``codecs.COMPRESSORS``, or one for an output that is
    not HDF5 or Zarr."""
    from .codecs import COMPRESSORS

    if compressor not in COMPRESSORS:
        raise BadInputError(f"compressor must be one of {', '.join(COMPRESSORS)}, got {compressor!r}")
    path = split_spec(spec)[0]
    if compressor != "none" and output_kind(path) not in ("hdf5", "zarr"):
        raise BadInputError(
            f"{path}: --compressor is for HDF5 and Zarr outputs; a {output_kind(path)} output is written uncompressed"
        )


def sink_chunk_rows(
    spec: str, n_features: int, dtype, n_rows: int, block_rows: int | None, source_block_rows: int
) -> int:
    """Rows per output chunk for an output at ``spec`` whose input is read in blocks of ``block_rows``
    (the user's) or else ``source_block_rows`` (the input's natural blocks).

    HDF5 and Zarr chunks are about :data:`OUTPUT_CHUNK_BYTES` (whole 4 KiB blocks, to be written
    directly), no larger than the user's block; a Parquet output's row groups are the blocks themselves.
    """
    if output_kind(split_spec(spec)[0]) in _TABULAR:
        return int(block_rows or source_block_rows)
    rows = output_chunk_rows(n_features, dtype, n_rows)
    return min(rows, int(block_rows)) if block_rows else rows


def has_progress(spec: str) -> bool:
    """Whether an interrupted run left a progress record beside the output ``spec`` (which
    :func:`resume_sink` compares with the job, its input's whole fingerprint included)."""
    path, _ = split_spec(spec)
    progress = partial_path(path) + ".progress.json"
    return remote.exists(progress) if remote.is_url(path) else os.path.exists(progress)


def _read_record(raw) -> ResumeRecord | None:
    """The progress record in the JSON text ``raw``, or None where it holds none (damaged, another version's)."""
    import json

    try:
        return ResumeRecord.from_dict(json.loads(raw))
    except ValueError:
        return None


def resume_sink(spec: str, job: ResumeRecord, direct_io: bool = True) -> tuple[Sink | None, int, int]:
    """Reopen the partial output of an interrupted run of the same ``job``; ``(sink, rows_done, n_nonfinite)``.

    Returns ``(None, 0, 0)`` when there is nothing to resume, or when the partial output belongs to another
    job or cannot be opened (then it is removed, so the caller starts over).
    """
    path, dataset = split_spec(spec)
    partial = partial_path(path)
    progress = partial + ".progress.json"
    if remote.is_url(path):
        return _resume_remote_sink(path, dataset, partial, progress, job)
    remove_stale_temps(path)
    remove_stale_temps(progress)
    try:
        with open(progress, "rb") as handle:
            recorded = _read_record(handle.read())
    except OSError:
        recorded = None
    if recorded is None or not recorded.same_job(job) or not os.path.exists(partial):
        remove(partial)
        remove(progress)
        remove(partial + ".chunks")
        return None, 0, 0
    try:
        sink = _backend_class(_SINKS, output_kind(path)).resume(
            path, dataset, partial, direct_io=direct_io, rows_done=recorded.rows_done
        )
    except Exception:  # unreadable: start over (it was only ever a temporary file)
        remove(partial)
        remove(progress)
        remove(partial + ".chunks")
        return None, 0, 0
    return sink, recorded.rows_done, recorded.n_nonfinite


def _resume_remote_sink(path, dataset, partial, progress, job) -> tuple[Sink | None, int, int]:
    """:func:`resume_sink` for a URL. The progress record is an object beside the output (written whole by
    one PUT), so a killed run is resumed from any machine, a Dask driver's included."""
    kind = output_kind(path)
    if kind not in _REMOTE_SINKS:
        return None, 0, 0
    try:
        raw = remote.cat(progress)
    except BadInputError:
        raw = None
    recorded = None if raw is None else _read_record(raw)
    data = path if kind == "zarr" else partial
    if (
        recorded is None
        or not recorded.same_job(job)
        or not remote.exists(data)
        or (kind == "zarr" and not _incomplete_zarr(path))
    ):
        if raw is not None:
            remote.remove(progress)
        remote.remove(partial, recursive=True)
        return None, 0, 0
    try:
        sink = _backend_class(_REMOTE_SINKS, kind).resume(
            path, dataset, partial, direct_io=False, rows_done=recorded.rows_done
        )
    except StoreIOError:
        raise
    except Exception:  # unreadable: start over (it was never complete)
        remote.remove(progress)
        remote.remove(partial, recursive=True)
        return None, 0, 0
    return sink, recorded.rows_done, recorded.n_nonfinite


__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "FINGERPRINT_ROWS",
    "HDF5_SUFFIXES",
    "OUTPUT_CHUNK_BYTES",
    "OWNER_ATTR",
    "ZARR_SUFFIX",
    "LazyRows",
    "Sampler",
    "Sink",
    "Source",
    "aligned_chunk_rows",
    "backend",
    "check_output_compressor",
    "check_replaceable",
    "count_blocks",
    "create_sink",
    "describe",
    "expand_specs",
    "fingerprint",
    "foreign_output",
    "has_progress",
    "lock_path",
    "identity_of",
    "open_source",
    "output_chunk_rows",
    "output_kind",
    "output_lock",
    "partial_path",
    "read_attrs",
    "read_ids",
    "read_vector",
    "refuse_input_overlap",
    "refuse_shared_outputs",
    "resume_sink",
    "same_file",
    "sink_chunk_rows",
    "split_spec",
]
