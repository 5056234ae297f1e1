"""Opening what is read: a store's rows as a `Source`, a whole 1-D array (gold scores), the ids of a
table's rows, an array's attributes; each with the [`ReadOptions`][streamwhiten.options.ReadOptions] it
reads with (``read=``). The store's kind is decided by ``spec``, its backend imported from the ``registry``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .._paths import check_readable
from ..errors import BadInputError, StoreIOError, StreamwhitenError
from ..options import ReadOptions
from ..output_plan import is_incomplete_output
from . import remote, text
from ._messages import io_error
from ._store import check_array
from .abc.store import Source
from .registry import backend
from .spec import input_kind, split_spec, zarr_store_above


def exists(path: str, read: ReadOptions | None = None) -> bool:
    """Whether a local path or a URL exists (a file, directory, object or prefix)."""
    path = remote.local_path(path)
    if remote.is_url(path):
        return remote.exists(path, read=read if read is not None else ReadOptions())
    return os.path.lexists(path)


def _missing_bucket(url: str, read: ReadOptions) -> str:
    root = remote.bucket(url)
    try:
        return "" if remote.exists(root, read=read) else f" (the bucket {remote.redact(root)} does not exist)"
    except Exception:
        return ""


def _refuse_incomplete(source: Source) -> None:
    """An output of ours whose ``complete`` attribute is false is not there yet: refuse to read it."""
    attrs = source.attrs()
    if is_incomplete_output(attrs):
        raise BadInputError(
            f"{source.label}: an output that is not complete (complete = false): it is being written, "
            "or the run writing it was stopped; run that apply again to finish it"
        )


def open_source(
    spec: str | Source, *, read: ReadOptions | None = None, min_rows: int = 1, codes: bool = False
) -> Source:
    """Open ``spec`` (an open source: as it is) read-only and check it is a 2-D float array of at least
    ``min_rows`` rows (with ``codes``, int8 codes or sign bits too, for their attributes). ``read`` gives the
    ``dataset`` of a spec naming none, ``fill_missing_chunks`` and how URLs are reached."""
    if isinstance(spec, Source):
        return spec
    read = read if read is not None else ReadOptions()
    path, inner = split_spec(spec, read.dataset)
    if remote.is_url(path):
        remote.check_url(path)
        if not remote.exists(path, read=read):
            raise BadInputError(f"{remote.redact(path)}: no such object or prefix{_missing_bucket(path, read)}")
    elif not os.path.lexists(path) and (above := zarr_store_above(path)) is not None:
        path, name = above  # dir.zarr/array where no such array is: the store says what it holds
        inner = f"{name}/{inner}" if inner else name
        check_readable(path)
    else:
        check_readable(path)
    source = backend(input_kind(path, read)).source_class()(path, inner, read)
    try:
        check_array(source.label, source.shape, source.dtype, min_rows, codes)
        _refuse_incomplete(source)
    except BaseException:
        source.close()
        raise
    return source


def read_vector(spec: str, *, read: ReadOptions | None = None) -> tuple[np.ndarray, str]:
    """A whole 1-D numeric array (e.g. gold scores) as float64, and its label: ``file.h5:/dataset``,
    ``dir.zarr[:/array]``, ``file.npy``, ``file.parquet:column``, ``file.csv:NAME`` or ``file.tsv:INDEX``
    (see `streamwhiten.io.text`); a store holding one 1-D array needs no name; ``(n, 1)`` is flattened.
    """
    read = read if read is not None else ReadOptions()
    path, inner = split_spec(spec)
    if remote.is_url(path):
        if not exists(path, read):
            raise BadInputError(f"{remote.redact(path)}: no such object or prefix{_missing_bucket(path, read)}")
    else:
        check_readable(path)
    label = f"{path}:/{inner}" if inner else path
    try:
        if text.is_text(path):
            values, label = text.read_column(path, inner, read)
        else:
            values, label = backend(input_kind(path, read)).load().read_vector(path, inner, read)
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
    if values.shape[0] < 1:
        raise BadInputError(f"{label}: has {values.shape[0]} value(s); at least 1 are needed")
    return values.astype(np.float64), label


def read_ids(source: Source, column: str) -> list[str]:
    """The values of ``column`` of a table store (`Source.tabular`), row by row, as strings: its rows' ids.
    Another kind of store, a missing column, a null id or one id for two rows is a `BadInputError`."""
    if not source.tabular:
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
            try:
                key = value.decode() if isinstance(value, bytes) else str(value)
            except UnicodeDecodeError:
                raise BadInputError(
                    f"{source.label}: row {row}: the id in column {column!r} is not valid UTF-8 text ({value[:32]!r})"
                ) from None
            if key in seen:
                raise BadInputError(f"{source.label}: rows {seen[key]} and {row} have the same id {key!r}")
            seen[key] = row
            ids.append(key)
    return ids


def read_attrs(spec: str, read: ReadOptions | None = None) -> dict[str, Any]:
    """The attributes of the array named by ``spec`` (for tests and ``info``; codes an apply wrote too)."""
    with open_source(spec, read=read, min_rows=0, codes=True) as source:
        return source.attrs()


__all__ = ["exists", "open_source", "read_attrs", "read_ids", "read_vector"]
