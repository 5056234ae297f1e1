"""Parquet through pyarrow: a source of vectors held in a list column, other columns of the same rows,
1-D columns (gold scores), and a sink. The only module that imports ``pyarrow.parquet``.

One file is one source. A whole row group is decoded through the worker thread's own ``ParquetFile``;
parts of one come from a stream the threads share, so each is decoded about once. Files are never
appended to: a fingerprint holds a digest of the footer, so an update refuses a rewritten file.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import BadInputError, CorruptStoreError, StoreIOError
from ..options import ReadOptions
from . import remote
from ._arrow import (
    TableSink,
    TableSource,
    copy_vectors,
    read_attrs,
    read_numeric_column,
    row_names,
    table_error,
)
from ._messages import first_line, io_error
from ._store import DEFAULT_BLOCK_BYTES, FINGERPRINT_ROWS, OWNER_ATTR
from .codecs import Fetched
from .spec import parquet_files

#: A row group up to this size is read whole as one block; larger ones in parts, through a shared stream.
MAX_GROUP_BLOCK_BYTES = 256 << 20
#: Bytes per batch a row group is decoded in: small batches reuse warm memory (benchmarks/fit_tables.py).
BATCH_BYTES = 2 << 20
#: Streams kept open per source (the least recently used is dropped beyond this).
MAX_STREAMS = 8
#: Bytes pyarrow reads at a time from a column chunk (not the whole chunk at once).
STREAM_BUFFER_BYTES = 1 << 20
#: Bytes per range request of a remote file (read ahead as pyarrow goes through a column chunk).
REMOTE_READ_BYTES = 8 << 20


def _opened(path: str, read: ReadOptions) -> Any:
    """``path`` for pyarrow to open: a local path itself, a URL as a read-only fsspec file object."""
    if not remote.is_url(path):
        return path
    fs, key = remote.filesystem(path, read)
    return remote.retrying(
        path, "open", fs.open, key, "rb", block_size=REMOTE_READ_BYTES, cache_type="readahead", read=read
    )


@contextmanager
def _reading(path: str, read: ReadOptions) -> Iterator[Any]:
    """`_opened` for one read of pyarrow's, a remote file closed after it: pyarrow never closes a file object
    it is given, and an fsspec file (its read-ahead buffer) stays open in a reference cycle until collected."""
    opened = _opened(path, read)
    try:
        yield opened
    finally:
        if opened is not path:
            opened.close()


def _parquet_file(path: str, read: ReadOptions, metadata: Any = None) -> Any:
    """A ``ParquetFile`` on ``path`` reading `STREAM_BUFFER_BYTES` at a time, checking page checksums."""
    return pq.ParquetFile(
        _opened(path, read),
        metadata=metadata,
        pre_buffer=False,
        buffer_size=STREAM_BUFFER_BYTES,
        page_checksum_verification=True,
    )


def _single_file(path: str, read: ReadOptions) -> str:
    """``path`` itself, or the only Parquet file in the directory ``path``."""
    if remote.is_url(path):
        if path.rstrip("/").lower().endswith(".parquet") or not remote.isdir(path, read=read):
            return path
    elif not os.path.isdir(path):
        return path
    files = parquet_files(path, read)
    if len(files) == 1:
        return files[0]
    raise BadInputError(
        f"{path}: a directory of {len(files)} Parquet files; fit and run read each file as a source "
        f"(this command needs one, e.g. {files[0] if files else 'file.parquet'})"
    )


def _footer(path: str, read: ReadOptions) -> tuple[bytes, Any]:
    """The raw footer of a Parquet file, its magic checked, and the file's stat (a remote one's ``{size, etag}``)."""
    if remote.is_url(path):
        version = remote.version(path, read=read)
        return _check_footer(
            remote.redact(path), version["size"], lambda a, b: remote.cat(path, a, b, read=read)
        ), version
    with open(path, "rb") as handle:
        stat = os.fstat(handle.fileno())
        return _check_footer(path, stat.st_size, lambda a, b: os.pread(handle.fileno(), b - a, a)), stat


def _check_footer(where: str, size: int, cat: Callable[[int, int], bytes]) -> bytes:
    """The footer of a file of ``size`` bytes whose bytes ``[a, b)`` are ``cat(a, b)``."""
    if size < 12:
        raise CorruptStoreError(f"{where}: not a Parquet file, or truncated ({size} bytes)")
    tail = cat(size - 8, size)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or length + 12 > size:
        raise CorruptStoreError(f"{where}: not a Parquet file, or truncated (no valid footer at its end)")
    return cat(size - 8 - length, size - 8)


class _Stream:
    """Batches of one column of one row group, decoded in order; shared by the threads reading that
    row group in parts (one at a time, under `lock`). It owns its file handle."""

    def __init__(self, open_file: Callable[[], Any], group: int, column: str, batch_rows: int) -> None:
        self.lock = threading.Lock()
        self._open_file, self.group, self.column, self.batch_rows = open_file, group, column, batch_rows
        self._handle: Any = None
        self._batches: Any = None
        self.position = 0  # row (in the group) after the last batch taken
        self.pending: tuple[int, Any] | None = None  # (first row in the group, array) of the batch being consumed

    def restart(self) -> None:
        self.close()
        self._handle = self._open_file()
        self._batches = self._handle.iter_batches(
            batch_size=self.batch_rows, row_groups=[self.group], columns=[self.column], use_threads=False
        )
        self.position, self.pending = 0, None

    def first_available(self) -> int:
        """The first row (in the group) this stream can still give without starting over; -1 if none."""
        if self._batches is None:
            return -1
        return self.pending[0] if self.pending is not None else self.position

    def next_batch(self) -> None:
        batch = next(self._batches)
        self.pending = (self.position, batch.column(0))
        self.position += batch.num_rows

    def close(self) -> None:
        handle, self._handle, self._batches, self.pending = self._handle, None, None, None
        if handle is not None:
            with suppress(Exception):
                handle.close()


def _head(handle: Any, label: str, group: int, column: str, rows: int) -> Any:
    """The first ``rows`` rows of ``column`` of row group ``group`` (one batch)."""
    try:
        batches = handle.iter_batches(batch_size=rows, row_groups=[group], columns=[column], use_threads=False)
        return next(batches).column(0)
    except (OSError, pa.ArrowException, StopIteration) as exc:
        raise table_error(label, f"row group {group}", exc) from exc


class ParquetSource(TableSource):
    """The vectors of a list column of one Parquet file."""

    kind = "parquet"
    layout_change = "the Parquet file was rewritten (Parquet files are never appended to: put new rows in new files)"

    def __init__(self, path: str, dataset: str | None, read: ReadOptions | None = None) -> None:
        read = read if read is not None else ReadOptions()
        path = _single_file(path, read)
        self.remote = remote.is_url(path)
        try:
            footer, stat = _footer(path, read)
            handle = _parquet_file(path, read)
        except (BadInputError, FileNotFoundError, PermissionError):
            raise
        except (OSError, pa.ArrowException, ValueError) as exc:
            if isinstance(exc, OSError) and getattr(exc, "errno", None):
                raise StoreIOError(f"{path}: cannot read: {io_error(exc)}") from exc
            raise CorruptStoreError(f"{path}: not a readable Parquet file ({first_line(exc)})") from exc
        try:
            metadata = handle.metadata
            column, dtype, width = self._choose(path, handle.schema_arrow, dataset, metadata.metadata)
            self._metadata, self._footer_sha = metadata, hashlib.sha256(footer).hexdigest()
            self._stat = stat if self.remote else (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
            self._group_rows = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
            self._starts = np.concatenate([[0], np.cumsum(self._group_rows, dtype=np.int64)]).tolist()
            if width is None:
                width = self._first_width(
                    lambda group: _head(handle, self._column_label, group, column, 1),
                    lambda group: f"row group {group}",
                    " (leave empty files out)",
                )
            chunk_rows = self._group_rows[0] if self._group_rows and self._group_rows[0] > 0 else None
        finally:
            handle.close()
        super().__init__(path, column, (self._starts[-1], width), dtype, chunk_rows, read)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._streams: OrderedDict[int, _Stream] = OrderedDict()
        self._closed = False

    def default_block_rows(self, target_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
        """Whole row groups (as many as make about ``target_bytes``) when a row group is at most
        `MAX_GROUP_BLOCK_BYTES`; else blocks of about ``target_bytes``, parts of a row group."""
        row_bytes = max(1, self.n_features * self.dtype.itemsize)
        if self.chunk_rows and self.chunk_rows * row_bytes <= MAX_GROUP_BLOCK_BYTES:
            return super().default_block_rows(target_bytes)
        return max(1, target_bytes // row_bytes)

    # -- fingerprint: the footer, and rows sampled at the start of row groups (the cheapest to decode)
    def layout_digest(self, n_rows: int) -> str:
        return self._footer_sha

    def fingerprint_extra(self) -> dict[str, Any]:
        return dict(self._stat) if self.remote else {}

    def sample_ranges(self, n_rows: int) -> list[tuple[int, int]]:
        groups = [g for g, rows in enumerate(self._group_rows) if rows and self._starts[g] < n_rows]
        if not groups:
            return []
        count = len(groups)
        picks = sorted({groups[0], groups[count // 4], groups[count // 2], groups[(3 * count) // 4], groups[-1]})
        return [(self._starts[g], min(self._starts[g] + FINGERPRINT_ROWS, self._starts[g + 1], n_rows)) for g in picks]

    def _check_unchanged(self) -> None:
        if self.remote:
            if remote.version(self.path, read=self.read_options) != self._stat:
                raise CorruptStoreError(f"{self.label}: the object changed while being read (it was replaced)")
            return
        try:
            stat = os.stat(self.path)
        except OSError as exc:
            raise StoreIOError(f"{self.label}: cannot read: {io_error(exc)}") from exc
        if (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns) != self._stat:
            raise CorruptStoreError(f"{self.label}: the file changed while being read (it was replaced or rewritten)")

    def _new_file(self, keep: bool = True) -> Any:
        """A new ``ParquetFile`` on the file opened at the start (closed with the source if ``keep``)."""
        if self._closed:
            raise StoreIOError(f"{self.label}: read after the source was closed")
        self._check_unchanged()
        try:
            handle = _parquet_file(self.path, self.read_options, self._metadata)
        except (OSError, pa.ArrowException) as exc:
            raise table_error(self.label, "the file", exc) from exc
        if keep:
            with self._lock:
                self._handles.append(handle)
        return handle

    def _file(self) -> Any:
        """This thread's own ``ParquetFile`` (one object is not to be used by several threads at once)."""
        handle = getattr(self._local, "handle", None)
        if handle is None:
            handle = self._local.handle = self._new_file()
        return handle

    def _copy(self, array: Any, group: int, first_row: int, target: np.ndarray) -> None:
        """Check and copy the rows of ``array`` (from ``first_row`` on) into ``target``, which it must fill."""
        done = min(len(array), target.shape[0])
        rows = array.slice(0, done) if done < len(array) else array
        copy_vectors(rows, target[:done], row_names(f"{self.label}: row group {group}, row ", first_row))
        if done != target.shape[0]:
            raise CorruptStoreError(
                f"{self.label}: row group {group} holds fewer rows than its metadata says "
                f"({done} of {target.shape[0]} read from row {first_row:,}): the file is damaged"
            )

    def _read_into(self, start: int, stop: int, out: np.ndarray, fetched: Fetched | None = None) -> np.ndarray:
        view = out[: stop - start]
        if not 0 <= start <= stop <= self.n_rows:
            raise StoreIOError(f"{self.label}: rows {start}..{stop - 1} are outside its {self.n_rows} rows")
        for group, a, b in self._pieces(start, stop):
            target = view[a - start : b - start]
            g_lo, g_hi = self._starts[group], self._starts[group + 1]
            if (a, b) == (g_lo, g_hi):
                self._read_group(group, target)
            elif a == g_lo and (b - a) * self.n_features * self.dtype.itemsize <= STREAM_BUFFER_BYTES:
                self._read_head(group, b - a, target)  # a few rows at its start (a fingerprint's sample)
            else:
                self._read_part(group, a - g_lo, b - g_lo, target)
        return view

    def _batch_rows(self) -> int:
        return max(1, BATCH_BYTES // (self.n_features * self.dtype.itemsize))

    def _read_group(self, group: int, target: np.ndarray) -> None:
        """A whole row group, in batches of about `BATCH_BYTES` copied into place: pyarrow's buffers stay hot."""
        first_row, done = self._starts[group], 0
        try:
            batches = self._file().iter_batches(
                batch_size=self._batch_rows(), row_groups=[group], columns=[self.dataset], use_threads=False
            )
            for batch in batches:
                n = min(batch.num_rows, target.shape[0] - done)
                self._copy(batch.column(0), group, first_row + done, target[done : done + n])
                done += n
        except (OSError, pa.ArrowException) as exc:
            raise table_error(self.label, f"row group {group}", exc) from exc
        if done != target.shape[0]:
            raise CorruptStoreError(
                f"{self.label}: row group {group} holds fewer rows than its metadata says "
                f"({done:,} of {target.shape[0]:,}): the file is damaged"
            )

    def _read_head(self, group: int, rows: int, target: np.ndarray) -> None:
        array = _head(self._file(), self.label, group, self.dataset, rows)
        self._copy(array, group, self._starts[group], target)

    def _stream(self, group: int) -> _Stream:
        with self._lock:
            stream = self._streams.get(group)
            if stream is None:
                stream = _Stream(lambda: self._new_file(False), group, self.dataset, self._batch_rows())
                self._streams[group] = stream
                while len(self._streams) > MAX_STREAMS:
                    _, evicted = self._streams.popitem(last=False)
                    if evicted.lock.acquire(blocking=False):  # else a thread still reads it; it goes with it
                        evicted.close()  # (it raises nothing)
                        evicted.lock.release()
            self._streams.move_to_end(group)
            return stream

    def _read_part(self, group: int, lo: int, hi: int, target: np.ndarray) -> None:
        """Rows ``[lo, hi)`` of row group ``group`` (counted in the group) from its shared stream."""
        stream = self._stream(group)
        first_row = self._starts[group]
        with stream.lock:
            try:
                if not 0 <= stream.first_available() <= lo:
                    stream.restart()
                filled = lo
                while filled < hi:
                    if stream.pending is None:
                        stream.next_batch()
                    assert stream.pending is not None  # next_batch sets it (or raises)
                    p0, array = stream.pending
                    p1 = p0 + len(array)
                    b = min(hi, p1)
                    if b > filled:  # else the batch ends before the rows asked for
                        rows = array.slice(filled - p0, b - filled)
                        self._copy(rows, group, first_row + filled, target[filled - lo : b - lo])
                        filled = b
                    if b == p1:
                        stream.pending = None
            except StopIteration:
                raise CorruptStoreError(
                    f"{self.label}: row group {group} holds fewer rows than its metadata says "
                    f"({stream.position:,} of {self._group_rows[group]:,}): the file is damaged"
                ) from None
            except (OSError, pa.ArrowException) as exc:
                raise table_error(self.label, f"row group {group}", exc) from exc
            if stream.pending is None and stream.position >= self._group_rows[group]:
                stream.close()  # read to its end: nothing more to share
                with self._lock:
                    if self._streams.get(group) is stream:
                        del self._streams[group]

    def read_columns(self, start: int, stop: int, names: list[str]) -> pa.Table:
        if not self.remote:
            return self._read_columns(start, stop, names)
        what = f"read rows {start}..{stop - 1}"
        return remote.retrying(self.path, what, self._read_columns, start, stop, names, read=self.read_options)

    def _read_columns(self, start: int, stop: int, names: list[str]) -> pa.Table:
        schema = self.column_schema(names)
        tables = []
        for group, a, b in self._pieces(start, stop):
            try:
                table = self._file().read_row_group(group, columns=list(names), use_threads=False)
            except (OSError, pa.ArrowException) as exc:
                raise table_error(self.path, f"row group {group}", exc) from exc
            tables.append(table.slice(a - self._starts[group], b - a))
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            handles, self._handles = self._handles, []
            streams, self._streams = list(self._streams.values()), OrderedDict()
        for stream in streams:
            with stream.lock:
                stream.close()
        for handle in handles:
            with suppress(Exception):
                handle.close()


def read_vector(path: str, inner: str | None, read: ReadOptions) -> tuple[np.ndarray, str]:
    """The numeric column ``inner`` (or the file's only numeric column), whole, and its label."""
    path = _single_file(path, read)
    try:
        with _reading(path, read) as where:
            schema = pq.read_schema(where)
    except (OSError, pa.ArrowException) as exc:
        raise table_error(path, "the file", exc) from exc

    def read_column(name: str, label: str) -> pa.ChunkedArray:
        try:
            with _reading(path, read) as where:
                return pq.read_table(where, columns=[name]).column(0)
        except (OSError, pa.ArrowException) as exc:
            raise table_error(label, "the column", exc) from exc

    return read_numeric_column(path, schema, inner, read_column)


#: How parts and the final file are written: floats do not compress; fixed, so a rerun writes the same bytes.
WRITE_OPTIONS = dict(
    compression="none", use_dictionary=False, write_statistics=True, version="2.6", write_page_checksum=True
)


def foreign_output(path: str, read: ReadOptions) -> str | None:
    """None when the Parquet file ``path`` is an output of ours (its metadata records `OWNER_ATTR`), else what it is."""
    try:
        with _reading(path, read) as where:
            metadata = pq.read_metadata(where).metadata
    except StoreIOError:
        raise
    except (OSError, ValueError, pa.ArrowException):
        return "not a Parquet file"
    return None if OWNER_ATTR in read_attrs(metadata) else "a Parquet file streamwhiten did not write"


class ParquetSink(TableSink):
    """A Parquet output: one row group per block, written as parts and joined into one file by `commit`."""

    kind = "parquet"
    part_suffix = ".parquet"

    def _write_part(self, table: pa.Table, path: Any) -> None:
        try:
            pq.write_table(table, path, row_group_size=max(1, table.num_rows), **WRITE_OPTIONS)
        except pa.ArrowException as exc:
            raise OSError(first_line(exc)) from exc

    def _read_part(self, path: Any) -> pa.Table:
        return pq.read_table(path)

    def _join(self, temp: Any, schema: pa.Schema, tables: Iterator[pa.Table]) -> None:
        """Stream the parts into one file at ``temp``: a path (fsynced) or a remote file object the caller completes."""
        with pq.ParquetWriter(temp, schema, **WRITE_OPTIONS) as writer:
            for table in tables:
                writer.write_table(table, row_group_size=max(1, table.num_rows))
        if isinstance(temp, str):
            with open(temp, "rb") as handle:
                os.fsync(handle.fileno())
