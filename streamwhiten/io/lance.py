"""Lance datasets through pylance: a source of vectors held in a list column, other columns of the same
rows, 1-D columns, and a sink. The only module that imports lance.

A source reads one version of the dataset through each thread's own handle. Appends add fragments after
the old ones, so a fingerprint holds a digest of the fragments an earlier fit read: an update refuses
changed ones. A dataset named by URL is read (never written) through pylance's own object store.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from .. import _durable as durable
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
from ._store import OWNER_ATTR
from .codecs import Fetched

#: What a pylance failure other than a system call's says of the dataset (see ``_arrow.table_error``).
_DAMAGED = "cannot be read, the dataset is damaged or incomplete"


def _open(path: str, read: ReadOptions, version: int | None = None) -> Any:
    url = remote.is_url(path)
    options = remote.lance_options(path, read) if url else None
    try:
        if url:
            return remote.retrying(
                path, "open", lance.dataset, path, version=version, storage_options=options, read=read
            )
        return lance.dataset(path, version=version)
    except StoreIOError:
        raise
    except (OSError, ValueError, RuntimeError) as exc:
        if not url and isinstance(exc, OSError) and getattr(exc, "errno", None):
            raise StoreIOError(f"{path}: cannot read: {io_error(exc)}") from exc
        reason = remote.scrub(first_line(exc)) if url else first_line(exc)
        error = BadInputError(f"{remote.redact(path)}: cannot open as a Lance dataset ({reason})")
        raise error from (None if url else exc)  # a remote one's cause may name a secret


def foreign_output(path: str, read: ReadOptions) -> str | None:
    """None when the Lance dataset ``path`` is an output of ours (its schema records `OWNER_ATTR`), else what it is."""
    try:
        schema = _open(path, read).schema
    except BadInputError:
        return "not a Lance dataset"
    return None if OWNER_ATTR in read_attrs(schema.metadata) else "a Lance dataset streamwhiten did not write"


class LanceSource(TableSource):
    """The vectors of a list column of one version of a Lance dataset."""

    kind = "lance"
    layout_change = "fragments holding them were changed: rows deleted or updated, or the dataset compacted"

    def __init__(self, path: str, dataset: str | None, read: ReadOptions | None = None) -> None:
        read = read if read is not None else ReadOptions()
        handle = _open(path, read)
        schema = handle.schema
        column, dtype, width = self._choose(path, schema, dataset, schema.metadata)
        self.version = handle.version
        self.remote = remote.is_url(path)
        try:
            fragments = handle.get_fragments()
            self._fragment_ids = [fragment.fragment_id for fragment in fragments]
            self._fragment_meta = [fragment.metadata.to_json() for fragment in fragments]
            counts = [fragment.count_rows() for fragment in fragments]
        except (OSError, ValueError, RuntimeError) as exc:
            raise table_error(self._column_label, "the fragment list", exc, _DAMAGED) from exc
        self._starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).tolist()
        self._local = threading.local()
        self._local.handle = handle
        if width is None:
            width = self._first_width(
                lambda index: self._fragment_table(index, [column], 0, 1).column(0).combine_chunks(),
                lambda index: f"fragment {self._fragment_ids[index]}",
            )
        super().__init__(path, column, (self._starts[-1], width), dtype, None, read)

    def layout_digest(self, n_rows: int) -> str:
        count = bisect.bisect_left(self._starts, n_rows)  # fragments holding rows [0, n_rows)
        described = [self._fragment_meta[i] for i in range(min(count, len(self._fragment_meta)))]
        return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()

    def fingerprint_extra(self) -> dict[str, Any]:
        return {"version": int(self.version)}

    def _dataset(self) -> Any:
        """This thread's own handle on the version opened at the start."""
        handle = getattr(self._local, "handle", None)
        if handle is None:
            handle = self._local.handle = _open(self.path, self.read_options, self.version)
        return handle

    def _fragment_table(self, index: int, columns: list[str], offset: int, limit: int) -> pa.Table:
        fragment_id = self._fragment_ids[index]
        try:
            fragment = self._dataset().get_fragment(fragment_id)
            if fragment is None:
                raise CorruptStoreError(f"{self.path}: fragment {fragment_id} is missing from version {self.version}")
            return fragment.to_table(columns=columns, offset=offset, limit=limit)
        except (OSError, ValueError, RuntimeError) as exc:
            if isinstance(exc, (BadInputError, StoreIOError)):
                raise
            raise table_error(self.label, f"fragment {fragment_id}", exc, _DAMAGED) from exc

    def _read_into(self, start: int, stop: int, out: np.ndarray, fetched: Fetched | None = None) -> np.ndarray:
        view = out[: stop - start]
        if not 0 <= start <= stop <= self.n_rows:
            raise StoreIOError(f"{self.label}: rows {start}..{stop - 1} are outside its {self.n_rows} rows")
        for index, a, b in self._pieces(start, stop):
            table = self._fragment_table(index, [self.dataset], a - self._starts[index], b - a)
            done, fragment_id = 0, self._fragment_ids[index]
            for array in table.column(0).chunks:
                where = row_names(f"{self.label}: fragment {fragment_id}, row ", a + done)
                copy_vectors(array, view[a - start + done :][: len(array)], where)
                done += len(array)
            if done != b - a:
                raise CorruptStoreError(
                    f"{self.label}: fragment {fragment_id} gave {done} of the {b - a} rows asked "
                    f"for from row {a:,}: the dataset is damaged"
                )
        return view

    def read_columns(self, start: int, stop: int, names: list[str]) -> pa.Table:
        schema = self.column_schema(names)
        tables = [
            self._fragment_table(index, list(names), a - self._starts[index], b - a).cast(schema)
            for index, a, b in self._pieces(start, stop)
        ]
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def close(self) -> None:
        self._local = threading.local()


def read_vector(path: str, inner: str | None, read: ReadOptions) -> tuple[np.ndarray, str]:
    """The numeric column ``inner`` (or the dataset's only numeric column), whole, and its label."""
    handle = _open(path, read)

    def read_column(name: str, label: str) -> pa.ChunkedArray:
        try:
            return handle.to_table(columns=[name]).column(0)
        except (OSError, ValueError, RuntimeError) as exc:
            raise table_error(label, "the column", exc, _DAMAGED) from exc

    return read_numeric_column(path, handle.schema, inner, read_column)


class LanceSink(TableSink):
    """A Lance output: Arrow IPC parts joined at `commit` into a new dataset, fsynced and renamed into place; a
    rerun writes the same rows, not the same bytes (Lance names its data files at random)."""

    kind = "lance"
    part_suffix = ".arrow"

    def _write_part(self, table: pa.Table, path: Any) -> None:
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)

    def _read_part(self, path: Any) -> pa.Table:
        with pa.memory_map(path) as source:
            return pa.ipc.open_file(source).read_all()

    def _join(self, temp: Any, schema: pa.Schema, tables: Iterator[pa.Table]) -> None:
        batches = (batch for table in tables for batch in table.replace_schema_metadata(schema.metadata).to_batches())
        reader = pa.RecordBatchReader.from_batches(schema, batches)
        try:
            lance.write_dataset(reader, temp, schema=schema, mode="create")
        except (ValueError, RuntimeError) as exc:
            raise OSError(first_line(exc)) from exc
        for directory, _, files in os.walk(temp):
            for name in files:
                with open(os.path.join(directory, name), "rb") as handle:
                    os.fsync(handle.fileno())
            durable.fsync_dir(directory)
