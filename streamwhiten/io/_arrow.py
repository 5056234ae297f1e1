"""What the Parquet and Lance backends share (imported only by them, once pyarrow is known to be there): the
vector column and its type, the checked copy of Arrow lists into a block, `TableSource` and `TableSink`."""

from __future__ import annotations

import base64
import bisect
import json
import os
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from .. import _durable as durable
from ..errors import BadInputError, CorruptStoreError, StoreIOError
from ..output_plan import OutputPlan
from . import remote
from ._messages import first_line, io_error, name_not_found
from ._store import StoreSink, StoreSource, remove
from .abc.store import SinkPlace

#: Key of the metadata (Parquet key-value, Lance schema) holding an output's attributes as JSON.
ATTRS_KEY = b"streamwhiten"
#: Column of an output when its spec names none.
DEFAULT_COLUMN = "embedding"

#: Arrow element types a vector column may hold, as numpy dtypes.
FLOAT_TYPES = {pa.from_numpy_dtype(dtype): dtype for dtype in map(np.dtype, ("float16", "float32", "float64"))}
#: Arrow element types of an output of codes: opened for its attributes, refused as input (``check_array``).
CODE_TYPES = {pa.from_numpy_dtype(dtype): dtype for dtype in map(np.dtype, ("int8", "uint8"))}
#: The column types a vector column may have, for messages.
VECTOR_TYPES = "list<float16|float32|float64>, large_list<...> or fixed_size_list<...>[d]"


def table_error(
    label: str, what: str, exc: BaseException, damage: str = "cannot be decoded, the file is damaged or truncated"
) -> StoreIOError | CorruptStoreError:
    """A pyarrow or pylance failure as ours: a failed system call is an I/O error, else damaged data (``damage``)."""
    if isinstance(exc, OSError) and getattr(exc, "errno", None):
        return StoreIOError(f"{label}: cannot read {what}: {io_error(exc)}")
    return CorruptStoreError(f"{label}: {what} {damage} ({exc.__class__.__name__}: {first_line(exc)})")


def storage_type(arrow_type: pa.DataType) -> pa.DataType:
    """The storage type of an extension type (a 1-D fixed-shape tensor, say), else the type itself."""
    if isinstance(arrow_type, pa.BaseExtensionType):
        if len(getattr(arrow_type, "shape", None) or [0]) != 1:
            return arrow_type  # a tensor of several dimensions per row is not a vector
        return arrow_type.storage_type
    return arrow_type


def is_list(arrow_type: pa.DataType) -> bool:
    arrow_type = storage_type(arrow_type)
    return bool(
        pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type)
    )


def describe_columns(schema: pa.Schema) -> str:
    return ", ".join(f"{field.name} ({field.type})" for field in schema) or "none"


def kept_columns(path: str, schema: pa.Schema, names: list[str]) -> pa.Schema:
    """The schema of the columns ``names`` of a table at ``path`` (``--keep-columns``), or a one-line refusal."""
    missing = [name for name in names if name not in schema.names]
    if missing:
        raise BadInputError(f"{path}: has no column {missing[0]!r} to keep; its columns are {describe_columns(schema)}")
    return pa.schema([schema.field(name) for name in names])


def choose_column(label: str, schema: pa.Schema, column: str | None, preferred: str | None = None) -> str:
    """The vector column: ``column``, else ``preferred`` (recorded by an output of ours), else the only list column."""
    if column is not None and column in schema.names:
        return column
    if column is None and preferred is not None and preferred in schema.names:
        return preferred
    lists: list[str] = [field.name for field in schema if is_list(field.type)]
    if column is None and len(lists) == 1:
        return lists[0]
    raise not_found(label, None if column is None else repr(column), "vector column", lists, schema)


def not_found(
    label: str, asked: str | None, what: str, found: list[str], schema: pa.Schema, option: bool = True
) -> BadInputError:
    """``_messages.name_not_found`` for a table: the columns it holds of the kind asked for, then the others."""
    rest = [field for field in schema if field.name not in found]
    other = f"; other columns: {', '.join(f'{f.name} ({f.type})' for f in rest)}" if rest else ""
    return name_not_found(label, asked, what, found, separator=":", option=option, other=other)


def read_numeric_column(
    path: str, schema: pa.Schema, inner: str | None, read_column: Callable[[str, str], Any]
) -> tuple[np.ndarray, str]:
    """The numeric column ``inner`` of the table at ``path`` (or its only numeric column), whole, and its
    label; ``read_column(name, label)`` reads one column as the backend does (a ``pa.ChunkedArray``)."""
    kinds = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)
    numeric = [f.name for f in schema if any(kind(f.type) for kind in kinds)]
    if inner is None or inner not in schema.names:
        if inner is not None or len(numeric) != 1:
            asked = None if inner is None else repr(inner)
            raise not_found(path, asked, "numeric column", numeric, schema, option=False)
        inner = numeric[0]
    label = f"{path}:{inner}"
    if inner not in numeric:
        raise BadInputError(f"{label}: holds {schema.field(inner).type}, not numbers")
    column = read_column(inner, label)
    if column.null_count:
        raise BadInputError(f"{label}: row {_first(column.is_null()):,} is null")
    return column.to_numpy(), label


def vector_type(label: str, field: pa.Field) -> tuple[np.dtype[Any], int | None]:
    """``(element dtype, width of a fixed_size_list or None)`` of a vector column, or a one-line refusal."""
    arrow_type = storage_type(field.type)
    if not is_list(arrow_type):
        raise BadInputError(f"{label}: column {field.name!r} is {field.type}, not a vector column ({VECTOR_TYPES})")
    element = arrow_type.value_type
    width = arrow_type.list_size if pa.types.is_fixed_size_list(arrow_type) else None
    if element in CODE_TYPES:  # codes an apply wrote: refused as input by check_array, with its hint
        return CODE_TYPES[element], width
    if element not in FLOAT_TYPES:
        raise BadInputError(
            f"{label}: column {field.name!r} holds {element} values, not float16, float32 or float64 "
            f"({field.type}; cast it to a float type first)"
        )
    return FLOAT_TYPES[element], width


def _first(mask: Any) -> int:
    """The first position ``mask`` (an Arrow array or chunked array of booleans) holds True at."""
    return int(np.flatnonzero(np.asarray(mask.to_numpy(zero_copy_only=False)))[0])


def vector_length(array: pa.Array, where: str) -> int:
    """The length of the first vector of a list array; a null or empty one is refused, ``where`` naming it."""
    array = array.storage if isinstance(array, pa.ExtensionArray) else array
    if not array.is_valid().to_numpy(zero_copy_only=False)[0]:
        raise BadInputError(f"{where}: null vector")
    fixed = pa.types.is_fixed_size_list(array.type)
    length = int(array.type.list_size if fixed else array.offsets[1].as_py() - array.offsets[0].as_py())
    if length == 0:
        raise BadInputError(f"{where}: empty vector")
    return length


def row_names(prefix: str, first: int) -> Callable[[int], str]:
    """Names of the rows from ``first`` on for `copy_vectors`' messages: ``prefix`` then the row number."""
    return lambda i: f"{prefix}{first + i:,}"


def copy_vectors(array: pa.Array, target: np.ndarray, where: Callable[[int], str]) -> None:
    """Copy the list array ``array`` into ``target``, refusing nulls and rows of another length (``where(i)``: row)."""
    array = array.storage if isinstance(array, pa.ExtensionArray) else array
    n, d = target.shape
    if len(array) != n:
        raise AssertionError(f"{len(array)} vectors for {n} rows")
    if n == 0:
        return
    if array.null_count:
        raise BadInputError(f"{where(_first(array.is_null()))}: null vector")
    if pa.types.is_fixed_size_list(array.type):
        if array.type.list_size != d:
            raise BadInputError(f"{where(0)}: vectors of {array.type.list_size} values, not {d}")
        values = array.flatten()
    else:
        offsets = array.offsets.to_numpy()
        lengths = np.diff(offsets)
        if lengths.min() != d or lengths.max() != d:
            bad = int(np.flatnonzero(lengths != d)[0])
            raise BadInputError(
                f"{where(bad)}: has {int(lengths[bad])} values, not {d} as the vectors before it "
                "(every vector must have the same length)"
            )
        values = array.values.slice(int(offsets[0]), n * d)
    if values.null_count:
        position = _first(values.is_null())
        raise BadInputError(f"{where(position // d)}: value {position % d} of the vector is null")
    np.copyto(target, values.to_numpy(zero_copy_only=False).reshape(n, d), casting="no")


def read_attrs(metadata: Mapping[bytes, bytes] | None) -> dict[str, Any]:
    """The attributes a streamwhiten output recorded in ``metadata`` (a dict of bytes), else ``{}``."""
    raw = (metadata or {}).get(ATTRS_KEY)
    try:
        attrs = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}
    return attrs if isinstance(attrs, dict) else {}


_SINK_FILE = "sink.json"


class TableSource(StoreSource):
    """What the sources of a table's list column share: the column, and the rows of its pieces (groups, fragments)."""

    tabular = True
    dataset: str  # the vector column, chosen when the table is opened
    #: the first row of each piece, then the end of the last
    _starts: list[int]

    def _choose(
        self, path: str, schema: pa.Schema, dataset: str | None, metadata: Mapping[bytes, bytes] | None
    ) -> tuple[str, np.dtype[Any], int | None]:
        """The vector column (as `choose_column` finds it), its element dtype, and its width where its type says it."""
        self._attrs = read_attrs(metadata)
        column = choose_column(path, schema, dataset, self._attrs.get("column"))
        self._column_label, self._schema = f"{path}:{column}", schema
        dtype, width = vector_type(self._column_label, schema.field(column))
        return column, dtype, width

    def _first_width(self, head: Callable[[int], Any], name: Callable[[int], str], hint: str = "") -> int:
        """The length of the first vector: ``head(piece)`` reads a piece's first row, ``name(piece)`` names it."""
        for piece in range(len(self._starts) - 1):
            if self._starts[piece + 1] > self._starts[piece]:
                where = f"{self._column_label}: {name(piece)}, row {self._starts[piece]:,}"
                return vector_length(head(piece), where)
        raise BadInputError(
            f"{self._column_label}: has no rows, so the length of the vectors of its list column is unknown{hint}"
        )

    def _pieces(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """``(piece, a, b)``: the rows ``[a, b)`` of the table in each piece ``[start, stop)`` touches."""
        piece = bisect.bisect_right(self._starts, start) - 1
        while start < stop:
            while self._starts[piece + 1] <= start:  # empty pieces
                piece += 1
            end = min(stop, self._starts[piece + 1])
            yield piece, start, end
            start, piece = end, piece + 1

    @property
    def label(self) -> str:
        return self._column_label

    def attrs(self) -> dict[str, Any]:
        return dict(self._attrs)

    def column_schema(self, names: list[str]) -> pa.Schema:
        return kept_columns(self.path, self._schema, names)


class TableSink(StoreSink):
    """A table output: the vectors as a ``fixed_size_list`` column after any columns kept from the input, written
    block by block as part files in a hidden directory (beside ``sink.json``, which describes the output),
    joined into the final store at `commit`. Backends implement `_write_part`, `_read_part` and `_join`."""

    tabular = True
    part_suffix = ".part"

    def __init__(
        self,
        place: SinkPlace,
        shape: tuple[int, ...],
        dtype: Any,
        chunk_rows: int,
        attrs: Mapping[str, Any],
        columns: pa.Schema,
    ) -> None:
        super().__init__(
            replace(place, dataset=place.dataset or DEFAULT_COLUMN), shape, dtype, chunk_rows, direct_io=False
        )
        #: attributes recorded in the output's metadata at commit
        self.attrs = dict(attrs)
        #: the columns carried from the input, before the vectors
        self.columns = columns
        # floats, int8 codes, or sign bits packed 8 per byte (uint8)
        vectors = pa.field(self.dataset, pa.list_(pa.from_numpy_dtype(self.dtype), self.shape[1]))
        self.schema = pa.schema(list(columns) + [vectors])
        self._unsynced: list[str] = []

    @property
    def label(self) -> str:
        return f"{self.path}:{self.dataset}"

    @classmethod
    def create(cls, place: SinkPlace, plan: OutputPlan) -> TableSink:
        path, dataset, partial, read, attrs = place.path, place.dataset, place.partial, place.read, plan.to_attrs()
        shape, dtype, chunk_rows = plan.shape, np.dtype(plan.dtype), int(plan.chunk_rows or 0)
        columns = plan.kept_schema if plan.kept_schema is not None else pa.schema([])
        column = dataset or DEFAULT_COLUMN
        if column in columns.names:
            raise BadInputError(
                f"{path}: a kept column is named {column!r}, as the vector column is; name the "
                f"output's vector column (e.g. {path}:vectors)"
            )
        record = {
            "shape": list(shape),
            "dtype": str(np.dtype(dtype)),
            "chunk_rows": int(chunk_rows),
            "column": column,
            "attrs": attrs,
            "columns": base64.b64encode(columns.serialize().to_pybytes()).decode(),
        }
        data = json.dumps(record, sort_keys=True).encode()
        if remote.is_url(partial):  # parts are objects under the partial prefix (any machine can resume them)
            remote.put_bytes(remote.join(partial, _SINK_FILE), data, read=read)
        else:
            os.mkdir(partial)
            where = os.path.join(partial, _SINK_FILE)
            durable.write_file_atomic(where, lambda handle: handle.write(data), "output description")
        return cls(replace(place, dataset=column), shape, dtype, chunk_rows, attrs, columns)

    @classmethod
    def resume(cls, place: SinkPlace, plan: OutputPlan, rows_done: int) -> TableSink:
        dataset, partial, read = place.dataset, place.partial, place.read
        if remote.is_url(partial):
            record = json.loads(remote.cat(remote.join(partial, _SINK_FILE), read=read))
        else:
            with open(os.path.join(partial, _SINK_FILE)) as handle:
                record = json.load(handle)
        if dataset is not None and dataset != record["column"]:
            raise ValueError("the partial output has another column")
        for name in [] if remote.is_url(partial) else os.listdir(partial):  # parts a killed run was writing
            if name.endswith(".tmp"):
                os.remove(os.path.join(partial, name))
        columns = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(record["columns"])))
        shape, dtype, chunk_rows, attrs = record["shape"], record["dtype"], record["chunk_rows"], record["attrs"]
        return cls(replace(place, dataset=record["column"]), shape, dtype, chunk_rows, attrs, columns)

    def _part_path(self, start: int) -> str:
        name = f"part-{start:015d}{self.part_suffix}"
        return remote.join(self.partial, name) if self.remote else os.path.join(self.partial, name)

    def _write(self, start: int, block: np.ndarray, columns: Any = None) -> None:
        if (columns is None) != (len(self.columns) == 0):
            raise AssertionError("the columns to keep must come with every block")
        block = np.ascontiguousarray(block, dtype=self.dtype)
        vectors = pa.FixedSizeListArray.from_arrays(pa.array(block.reshape(-1)), self.shape[1])
        arrays = [columns.column(name) for name in self.columns.names] if columns is not None else []
        table = pa.Table.from_arrays(arrays + [vectors], schema=self.schema)
        name = self._part_path(start)
        if self.remote:  # one PUT: the part is there whole or not at all
            buffer = pa.BufferOutputStream()
            self._write_part(table, buffer)
            remote.put_bytes(name, buffer.getvalue().to_pybytes(), read=self.read_options)
            return
        self._write_part(table, name + ".tmp")
        os.replace(name + ".tmp", name)
        self._unsynced.append(name)

    def _sync(self) -> None:
        if self.remote:
            return  # an object is durable once its PUT is acknowledged
        for name in self._unsynced:
            with open(name, "rb") as handle:
                os.fsync(handle.fileno())
        if self._unsynced:
            durable.fsync_dir(self.partial)
        self._unsynced.clear()

    def _finish(self, attrs: dict[str, Any]) -> None:
        raise NotImplementedError  # a table output is joined from its parts at commit (see commit)

    def _tables(self) -> Iterator[pa.Table]:
        """The parts' tables in row order, checking that they cover every row exactly once."""
        listed = remote.find(self.partial, read=self.read_options) if self.remote else os.listdir(self.partial)
        parts = sorted(
            (int(name[5:20]), self._part_path(int(name[5:20])))
            for name in map(remote.basename, listed)
            if name.startswith("part-") and name.endswith(self.part_suffix)
        )
        expected = 0
        for start, part in parts:
            table = self._read_part(pa.BufferReader(remote.cat(part, read=self.read_options)) if self.remote else part)
            if start != expected or not table.schema.equals(self.schema, check_metadata=False):
                raise StoreIOError(
                    f"{self.path}: the partial output {self.partial} is damaged (part {part} starts at "
                    f"row {start}, expected {expected}); run again with restart=True",
                    param="restart",
                )
            yield table
            expected += table.num_rows
        if expected != self.shape[0]:
            raise StoreIOError(
                f"{self.path}: the partial output {self.partial} holds {expected} of {self.shape[0]} "
                "rows; run again with restart=True",
                param="restart",
            )

    def commit(self, overwrite: bool = False, attrs: Mapping[str, Any] | None = None) -> None:
        """Join the parts into the final store under a temporary name, durably, and rename it into place."""
        record = dict(self.attrs, **(attrs or {}), complete=True, column=self.dataset)
        schema = self.schema.with_metadata({ATTRS_KEY: json.dumps(record, sort_keys=True, default=str).encode()})
        if self.remote:  # one object, which appears only when its multipart upload completes
            self._check_replaceable(overwrite)
            remote.retrying(self.path, "upload the output", self._upload, schema, read=self.read_options)
            remote.remove(self.partial, recursive=True, read=self.read_options)
            remote.remove(self.progress_path, read=self.read_options)
            return
        final = os.path.abspath(self.path.rstrip("/"))
        temp = durable.temp_path(final)
        try:
            self._check_replaceable(overwrite)  # again: it may have changed since the run began
            self._join(temp, schema, self._tables())
            if os.path.isdir(final) and not os.path.islink(final):  # cannot be replaced atomically: move aside
                old = durable.temp_path(final, "old")
                os.rename(final, old)
                os.rename(temp, final)
                remove(old)
            else:
                os.replace(temp, final)
            durable.fsync_dir(os.path.dirname(final))
            remove(self.partial)
            remove(self.progress_path)
        except BaseException as exc:
            remove(temp)
            if isinstance(exc, StoreIOError) or not isinstance(exc, (OSError, RuntimeError, pa.ArrowException)):
                raise
            raise StoreIOError(f"{self.path}: cannot finish writing: {io_error(exc)}") from exc

    def _upload(self, schema: pa.Schema) -> None:
        """Join the parts into one upload, aborted (nothing becomes visible) on failure."""
        fs, key = remote.filesystem(self.path, self.read_options)
        handle = fs.open(key, "wb", block_size=64 << 20)
        try:
            self._join(handle, schema, self._tables())
        except BaseException:
            discard = getattr(handle, "discard", None)  # abort the multipart upload: nothing becomes visible
            with suppress(Exception):
                discard() if discard is not None else None
            raise
        handle.close()  # completes the upload: the object appears whole

    def abort(self) -> None:
        if not self.remote:
            return super().abort()
        with suppress(Exception):  # parts under a hidden prefix never look like an output
            remote.remove(self.partial, recursive=True, read=self.read_options)
            remote.remove(self.progress_path, read=self.read_options)

    @abstractmethod
    def _write_part(self, table: pa.Table, path: Any) -> None:
        """Write ``table`` as one part at ``path`` (a file name, or a buffer for a remote part)."""

    @abstractmethod
    def _read_part(self, path: Any) -> pa.Table:
        """The table of the part at ``path`` (a file name, or a buffer of a remote part's bytes)."""

    @abstractmethod
    def _join(self, temp: Any, schema: pa.Schema, tables: Iterator[pa.Table]) -> None:
        """Write the final store at ``temp`` (a path, or a remote file object) from ``tables``, durably."""
