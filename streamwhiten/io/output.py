"""Outputs: the one way to open a store for writing (`open_output`), and the rules for what is there.

An `Output` is a store named by a spec: whether something is there, whether it may be replaced
(`check_replaceable`: only an output of ours, of the same kind, with ``overwrite``), the lock of the run
writing it, and its sink: a new one (`create`) or an interrupted run's partial output (`resume`, when the
job's `ResumeRecord` matches the one beside it). What an output can take is asked of its sink class.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import time
from contextlib import AbstractContextManager
from dataclasses import replace
from functools import cached_property
from typing import Any

import numpy as np

from .. import _durable as durable
from ..errors import BadInputError, StoreIOError
from ..options import ReadOptions
from ..output_plan import OutputPlan
from ..records import ResumeRecord
from . import remote
from ._messages import first_line, io_error
from ._store import output_chunk_rows, partial_path, remove
from .abc.store import Sink, SinkPlace
from .codecs import COMPRESSORS
from .reading import read_attrs
from .registry import Backend, backend
from .spec import output_kind, split_spec

#: What an output array may hold: floats, int8 codes, or sign bits packed 8 per byte (uint8).
OUTPUT_DTYPES = tuple(np.dtype(name) for name in ("float16", "float32", "float64", "int8", "uint8"))


def _read_options(read: ReadOptions | None) -> ReadOptions:
    return read if read is not None else ReadOptions()


def output_exists(path: str, read: ReadOptions | None = None) -> bool:
    """Whether an output is at ``path``; one written in place on object storage that is not complete counts
    as absent."""
    path = remote.local_path(split_spec(path)[0])
    if not remote.is_url(path):
        return os.path.lexists(path)
    read = _read_options(read)
    if not remote.exists(path, read=read):
        return False
    sink = backend(output_kind(path)).sink_class(url=True)
    return sink is None or not sink.in_place or not sink.incomplete(path, read)


def foreign_output(path: str, kind: str | None = None, read: ReadOptions | None = None) -> str | None:
    """None when the store at ``path`` is an output of ours of ``kind`` (default: the one its name asks for),
    which ``overwrite`` may replace; else what it is instead ("a directory", ...), as its backend says."""
    path = remote.local_path(path)
    found_backend = backend(kind or output_kind(path))
    if not remote.is_url(path):
        found = durable.link_or_kind(path, directory=found_backend.directory)
        if found is not None:
            return found
    try:
        answer: str | None = found_backend.load().foreign_output(path, _read_options(read))
        return answer
    except (BadInputError, StoreIOError):
        raise
    except Exception as exc:  # noqa: BLE001 - unreadable: not known to be ours, so not replaced
        return f"it cannot be read as one: {first_line(exc)}"


def _check_parent(path: str) -> None:
    """Refuse a local output ``path`` whose directory does not exist."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(parent):
        raise BadInputError(f"{path}: directory {parent} does not exist")


def _read_record(raw: bytes | str) -> ResumeRecord | None:
    """The progress record in the JSON text ``raw``, or None where it holds none (damaged, another version's)."""
    try:
        return ResumeRecord.from_dict(json.loads(raw))
    except ValueError:
        return None


#: How long after its last change an output's stamp is trusted (`Output.stamp`): longer than any
#: file system's clock tick, so that a later change always shows in the times.
STAMP_SETTLED_S = 2.0


class Output:
    """An output store named by ``spec`` (``out.zarr``, ``out.h5:/emb``, ``s3://b/out.parquet:vectors``):
    what is there now, and the one way to start or continue writing it (its URLs reached with ``read``)."""

    def __init__(self, spec: str, read: ReadOptions | None = None) -> None:
        path, dataset = split_spec(os.fspath(spec))
        self.spec = os.fspath(spec)
        #: the output's path or URL, and the array inside it (None: the backend's default)
        self.path: str = remote.local_path(path)
        self.dataset = dataset
        #: how its URLs are reached (an input's dataset or missing-chunk rule is not the output's)
        self.read = replace(_read_options(read), dataset=None, fill_missing_chunks=False)
        #: whether it is named by URL (written to object storage)
        self.url = remote.is_url(self.path)

    def __repr__(self) -> str:
        return f"Output({remote.redact(self.spec)!r})"

    @cached_property
    def backend(self) -> Backend:
        """The backend that writes it, from its name (refused only when first asked, so that other mistakes
        of a command are reported in their usual order)."""
        return backend(output_kind(self.path))

    @property
    def kind(self) -> str:
        return self.backend.kind

    @property
    def sink_class(self) -> type[Sink]:
        """The class that writes it (local or remote); a kind that cannot be written there is refused."""
        found = self.backend.sink_class(self.url)
        if found is None:
            if self.url:
                raise BadInputError(
                    f"{remote.redact(self.path)}: {self.kind} outputs cannot be written to object storage; "
                    "write .zarr or .parquet"
                )
            raise BadInputError(
                f"{self.path}: writing {self.kind} outputs is not supported; write .parquet, .zarr or .h5"
            )
        return found

    @property
    def _capabilities(self) -> type[Sink]:
        """The local sink class (a remote one may take less), or the abstract `Sink` for a kind never written."""
        return self.backend.sink_class(url=False) or Sink

    @property
    def tabular(self) -> bool:
        """Whether it carries other columns beside the vectors (``--keep-columns``); its row groups are blocks."""
        return self._capabilities.tabular

    @property
    def compressible(self) -> bool:
        """Whether its chunks can be compressed (``--compressor``), written locally."""
        return self._capabilities.compressible

    @property
    def parallel_writes(self) -> bool:
        """Whether several processes may write its whole-chunk row ranges at once (the Dask engine)."""
        return self._capabilities.parallel_writes

    @property
    def format_versions(self) -> tuple[int, ...]:
        """The format versions it may be written in (``zarr_format``); none where there is no choice."""
        return self._capabilities.format_versions

    @property
    def named(self) -> bool:
        """Whether its array always lives under a name inside the store (an HDF5 dataset)."""
        return self._capabilities.named

    @property
    def partial(self) -> str:
        """The hidden temporary name it is written under (``.NAME.partial``)."""
        return partial_path(self.path)

    @property
    def progress_path(self) -> str:
        """The progress record of an interrupted run, beside the partial output."""
        return self.partial + ".progress.json"

    def exists(self) -> bool:
        """Whether an output is there (a remote one written in place counts only once complete)."""
        return output_exists(self.path, self.read)

    def attrs(self) -> dict[str, Any]:
        """The attributes of the array there (an output's record of the model that wrote it)."""
        return read_attrs(self.spec, self.read)

    def stamp(self) -> str | None:
        """A digest of the identity, size and times of the output's file, or of the entries of its directory,
        of each directory on the way to its array and of a Lance ``_versions``: it changes when the output or
        its records change, so a run can skip checking an output not touched since. None for object
        storage, nothing there, or a change less than `STAMP_SETTLED_S` ago (within a clock tick)."""
        if self.url:
            return None
        try:
            entries = [("", os.stat(self.path))]
            if stat.S_ISDIR(entries[0][1].st_mode):
                inner = [part for part in (self.dataset or "").split("/") if part]
                folders = ["", *("/".join(inner[: depth + 1]) for depth in range(len(inner))), "_versions"]
                for folder in folders:
                    where = os.path.join(self.path, folder) if folder else self.path
                    if folder and not os.path.isdir(where):
                        continue
                    with os.scandir(where) as found:
                        entries += sorted(
                            (f"{folder}/{entry.name}", entry.stat(follow_symlinks=False)) for entry in found
                        )
        except OSError:
            return None
        newest = max(max(info.st_mtime_ns, info.st_ctime_ns) for _, info in entries)
        if time.time_ns() - newest < STAMP_SETTLED_S * 1e9:
            return None
        text = ";".join(
            f"{name}:{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}"
            for name, info in entries
        )
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def check_replaceable(self, overwrite: bool) -> None:
        """The one rule for an output that may exist already: nothing there, or ``overwrite`` and an output
        of ours of the same kind (`foreign_output`); else `OutputExistsError` or `ForeignOutputError` (exit 2)."""
        kind, read = self.kind, self.read
        durable.check_replaceable(
            self.path,
            overwrite,
            self.backend.output_name,
            lambda found: foreign_output(found, kind, read),
            exists=lambda found: output_exists(found, read),
            label=remote.redact(self.path),
        )

    def lock(self) -> AbstractContextManager[Any]:
        """A context holding the lock ``.NAME.lock`` beside it for a whole run writing it, so a second run
        exits 75 (`LockedError`); the lock file is removed on release. Object storage has no lock."""
        if self.url:
            return contextlib.nullcontext()
        _check_parent(self.path)
        head, tail = os.path.split(os.path.abspath(self.path.rstrip("/")))
        lock: AbstractContextManager[Any] = durable.exclusive_lock(
            os.path.join(head, f".{tail}.lock"),
            lambda holder: f"{self.path}: another run is writing this output (pid {holder}); not starting a second one",
            remove=True,
        )
        return lock

    def has_progress(self) -> bool:
        """Whether an interrupted run left a progress record beside it (which `resume` compares with the job)."""
        if self.url:
            return remote.exists(self.progress_path, read=self.read)
        return os.path.exists(self.progress_path)

    def tidy(self) -> None:
        """Remove the progress record (when no partial output is being written) and lock file that a run killed
        right after its final rename left behind (the lock is taken here: a run writing it now holds it)."""
        if self.url:
            if not remote.exists(self.partial, read=self.read) and remote.exists(self.progress_path, read=self.read):
                remote.remove(self.progress_path, read=self.read)
            return
        with self.lock():
            if not os.path.lexists(self.partial):
                remove(self.progress_path)
                durable.remove_stale_temps(self.progress_path)

    def check_compressor(self, compressor: str) -> None:
        """Refuse a ``compressor`` not in ``codecs.COMPRESSORS``, or any for an output not `compressible`."""
        if compressor not in COMPRESSORS:
            raise BadInputError(f"compressor must be one of {', '.join(COMPRESSORS)}, got {compressor!r}")
        if compressor != "none" and not self.compressible:
            path = split_spec(self.spec)[0]
            raise BadInputError(
                f"{path}: compressor is for HDF5 and Zarr outputs; a {self.kind} output is written uncompressed",
                param="compressor",
            )

    def chunk_rows(
        self, n_features: int, dtype: Any, n_rows: int, block_rows: int | None, source_block_rows: int
    ) -> int:
        """Rows per output chunk: a table's row groups are the blocks (``block_rows``, else the input's
        ``source_block_rows``); other chunks about ``OUTPUT_CHUNK_BYTES``, at most the user's block."""
        if self.tabular:
            return int(block_rows or source_block_rows)
        rows = output_chunk_rows(n_features, dtype, n_rows)
        return min(rows, int(block_rows)) if block_rows else rows

    def create(self, plan: OutputPlan, overwrite: bool = False) -> Sink:
        """Start writing a new array as ``plan`` (`OutputPlan`) says, under a temporary name (a URL: in
        place, Zarr with ``complete`` set last, Parquet as parts joined when the upload completes). Chunk rows
        default to about ``OUTPUT_CHUNK_BYTES``; an existing output is replaced only with ``overwrite``
        (`check_replaceable`); kept columns need a table output; a compressor an HDF5 or Zarr one.
        """
        path = self.path
        if self._capabilities is Sink:
            raise BadInputError(f"{path}: writing {self.kind} outputs is not supported; write .parquet, .zarr or .h5")
        columns = plan.kept_schema
        if columns is not None and len(columns) and not self.tabular:
            raise BadInputError(
                f"{path}: keep_columns needs a Parquet or Lance output (.parquet, .lance), not {self.kind}",
                param="keep_columns",
            )
        self.check_compressor(plan.compressor)
        if self.url:
            self._check_remote(overwrite, plan.compressor)
        else:
            self.check_replaceable(overwrite)
            _check_parent(self.path)
        sink_class = self.sink_class
        dtype = np.dtype(plan.dtype)
        if dtype not in OUTPUT_DTYPES:  # floats, int8 codes or packed sign bits (uint8)
            raise BadInputError(f"output dtype must be float16, float32, float64, int8 or uint8, got {dtype}")
        chunk_rows = int(plan.chunk_rows or output_chunk_rows(plan.width, dtype, plan.n_rows))
        plan = replace(plan, chunk_rows=chunk_rows, direct_io=plan.direct_io and not self.url)
        partial = self.partial
        if self.url:
            remote.remove(partial, recursive=True, read=self.read)
            remote.remove(self.progress_path, read=self.read)
        else:
            self._clear_local_partial(plan.n_rows * plan.width * dtype.itemsize)
        try:
            sink = sink_class.create(self._place, plan)
        except Exception as exc:
            if self.url:
                if isinstance(exc, (BadInputError, StoreIOError)):
                    raise
                raise remote.failure(path, "create the output", exc) from None
            remove(partial)
            if isinstance(exc, (OSError, RuntimeError)) or exc.__class__.__module__.startswith(("zarr", "pyarrow")):
                raise StoreIOError(f"{path}: cannot create output: {io_error(exc)}") from exc
            raise
        return self._bind(sink)

    def resume(self, plan: OutputPlan, job: ResumeRecord) -> tuple[Sink, ResumeRecord] | None:
        """The partial output of an interrupted run of the same ``job`` (`ResumeRecord.same_job`) and its
        progress record (how many rows are durable); None, having removed it, when there is none, it belongs
        to another job or cannot be opened. On object storage the record is an object beside the output."""
        if self.url:
            return self._resume_remote(replace(plan, direct_io=False), job)
        partial, progress = self.partial, self.progress_path
        durable.remove_stale_temps(self.path)
        durable.remove_stale_temps(progress)
        try:
            with open(progress, "rb") as handle:
                recorded = _read_record(handle.read())
        except OSError:
            recorded = None
        if recorded is None or not recorded.same_job(job) or not os.path.exists(partial):
            self._discard_local()
            return None
        try:
            sink = self.sink_class.resume(self._place, plan, recorded.rows_done)
        except Exception:  # unreadable: start over (it was only ever a temporary file)
            self._discard_local()
            return None
        return self._bind(sink), recorded

    @property
    def _place(self) -> SinkPlace:
        """Where its sink writes: the path, array, temporary name, and how URLs are reached."""
        return SinkPlace(self.path, self.dataset, self.partial, self.read)

    def _bind(self, sink: Sink) -> Sink:
        """``sink``, knowing how its URLs are reached and what its commit may replace."""
        sink.read_options = self.read
        sink.replace_check = self.check_replaceable
        return sink

    def _check_remote(self, overwrite: bool, compressor: str) -> None:
        """Refuse an output URL of a kind object storage cannot take, one that exists (unless ``overwrite``
        and it is ours: `check_replaceable`), or one in a bucket that does not."""
        path = self.path
        if compressor != "none":
            raise BadInputError(
                f"{remote.redact(path)}: compressor is not supported for object-storage outputs "
                "yet; write it uncompressed, or to a local path",
                param="compressor",
            )
        remote.check_url(path)
        self.sink_class  # noqa: B018 - refuses a kind object storage cannot take
        self.check_replaceable(overwrite)
        root = remote.bucket(path)
        if not remote.exists(root, read=self.read):
            raise BadInputError(f"{remote.redact(root)}: no such bucket or container for the output")

    def _clear_local_partial(self, needed: int) -> None:
        """Remove what earlier runs left of the partial output, then refuse to start when the disk has less
        than ``needed`` bytes free."""
        path, partial = self.path, self.partial
        try:
            durable.remove_stale_temps(path)
            self._discard_local()  # a record of an earlier partial must never describe this one
            durable.remove_stale_temps(self.progress_path)
        except OSError as exc:
            raise StoreIOError(
                f"{partial}: cannot remove the partial output of an earlier run: {io_error(exc)}"
            ) from exc
        parent = os.path.dirname(os.path.abspath(path)) or "."
        free = shutil.disk_usage(parent).free
        if needed > free:
            raise StoreIOError(
                f"{path}: the output needs about {needed / 1e6:,.1f} MB but only {free / 1e6:,.1f} MB are free "
                f"in {parent}"
            )

    def _discard_local(self) -> None:
        remove(self.partial)
        remove(self.progress_path)
        remove(self.partial + ".chunks")  # a compressed HDF5 output's spool

    def _discard_remote(self) -> None:
        remote.remove(self.progress_path, read=self.read)
        remote.remove(self.partial, recursive=True, read=self.read)

    def _resume_remote(self, plan: OutputPlan, job: ResumeRecord) -> tuple[Sink, ResumeRecord] | None:
        sink_class = self.backend.sink_class(url=True)
        if sink_class is None:
            return None
        progress = self.progress_path
        try:
            raw: bytes | None = remote.cat(progress, read=self.read)
        except BadInputError:
            raw = None
        recorded = None if raw is None else _read_record(raw)
        data = self.path if sink_class.in_place else self.partial
        if (
            recorded is None
            or not recorded.same_job(job)
            or not remote.exists(data, read=self.read)
            or (sink_class.in_place and not sink_class.incomplete(self.path, self.read))
        ):
            if raw is not None:
                remote.remove(progress, read=self.read)
            remote.remove(self.partial, recursive=True, read=self.read)
            return None
        try:
            sink = sink_class.resume(self._place, plan, recorded.rows_done)
        except StoreIOError:
            raise
        except Exception:  # unreadable: start over (it was never complete)
            self._discard_remote()
            return None
        return self._bind(sink), recorded


def open_output(spec: str, read: ReadOptions | None = None) -> Output:
    """The output named by ``spec``, its URLs reached with ``read``'s storage options; a name no backend
    writes (it must end in .zarr, .parquet, .lance or an HDF5 suffix) is refused as soon as what it is
    matters (`Output.backend`)."""
    return Output(spec, read)


__all__ = ["Output", "foreign_output", "open_output", "output_exists"]
