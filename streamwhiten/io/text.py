"""Delimited text files (CSV, TSV): one numeric column as a vector, and the rows of small tables (qrels).

A column is named after the file: ``file.csv:NAME``, a field of the header (the first line), or
``file.csv:INDEX`` (digits), the 0-based column of a file whose every line is data (STS-B's gold score is
``sts-dev.csv:4``). The delimiter is a tab for ``.tsv`` or where the first line holds one, else a comma;
tab-separated lines are split on tabs alone (STS-B's sentences hold unbalanced quotes), comma-separated
ones follow CSV quoting. Blank lines are skipped but counted (from 1) in every message.
"""

from __future__ import annotations

import csv
import io

import numpy as np

from ..errors import BadInputError, StoreIOError
from ..options import ReadOptions
from . import remote
from ._messages import io_error
from .spec import TEXT_SUFFIXES


def is_text(path: str) -> bool:
    """Whether ``path`` names a delimited text file (by its suffix)."""
    return str(path).lower().rstrip("/").endswith(TEXT_SUFFIXES)


def read_text(path: str, read: ReadOptions | None = None) -> str:
    """The whole file at ``path`` (local or URL, reached with ``read``'s storage options) as UTF-8 text."""
    label = remote.redact(path)
    try:
        if remote.is_url(path):
            remote.check_url(path)
            raw = remote.cat(path, read=read if read is not None else ReadOptions())
        else:
            with open(path, "rb") as handle:
                raw = handle.read()
    except FileNotFoundError:
        raise BadInputError(f"{label}: no such file or directory") from None
    except IsADirectoryError:
        raise BadInputError(f"{label}: is a directory, not a text file") from None
    except OSError as exc:
        raise StoreIOError(f"{label}: cannot read: {io_error(exc)}") from exc
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise BadInputError(f"{label}: line {line}: not UTF-8 text") from None


def read_rows(path: str, read: ReadOptions | None = None) -> list[tuple[int, list[str]]]:
    """``(line number, fields)`` of every non-blank line of the delimited file at ``path``."""
    text = read_text(path, read)
    lines = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    first = next((line for line in lines if line.strip()), "")
    if str(path).lower().endswith(".tsv") or "\t" in first:
        return [(number, line.split("\t")) for number, line in enumerate(lines, 1) if line.strip()]
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=",", strict=True)
    rows, start = [], 1
    try:
        for fields in reader:
            if any(field.strip() for field in fields):
                rows.append((start, fields))
            start = reader.line_num + 1
    except csv.Error as exc:
        raise BadInputError(f"{remote.redact(path)}: line {reader.line_num}: {exc}") from None
    return rows


def _first_line(rows: list[tuple[int, list[str]]]) -> str:
    """What the first line of a table holds, for a message that says how to name a column."""
    if not rows:
        return "the file is empty"
    fields = [field.strip() for field in rows[0][1]]
    shown = ", ".join(repr(field) for field in fields[:10]) + (", ..." if len(fields) > 10 else "")
    return f"its first line has {len(fields)} field(s): {shown}"


def read_column(path: str, inner: str | None, read: ReadOptions | None = None) -> tuple[np.ndarray, str]:
    """The numeric column ``inner`` (a header name or a 0-based index) of the delimited file at ``path``
    as float64, and its label; a missing column or a value that is not a number names the line."""
    label = remote.redact(path)
    if inner is None or not inner.strip():
        raise BadInputError(
            f"{label}: no column named; {_first_line(read_rows(path, read))}: write {label}:NAME for a "
            f"header field, or {label}:INDEX for a 0-based column (every line data)"
        )
    inner = inner.strip()
    column: int | str = int(inner) if inner.isascii() and inner.isdigit() else inner  # "²".isdigit() too
    label = f"{label}:{inner}"
    rows = read_rows(path, read)
    if isinstance(column, str):
        if not rows:
            raise BadInputError(f"{label}: the file is empty: no header line to find column {column!r} in")
        number, header = rows[0]
        names = [name.strip() for name in header]
        if names.count(column) != 1:
            listing = ", ".join(repr(name) for name in names[:20])
            why = "more than one header field is" if names.count(column) > 1 else "no header field is"
            raise BadInputError(
                f"{label}: line {number}: {why} named {column!r}; the fields are {listing} "
                "(or give a 0-based index for a file without a header)"
            )
        index, rows = names.index(column), rows[1:]
    else:
        index = column
    values = np.empty(len(rows), dtype=np.float64)
    for i, (number, fields) in enumerate(rows):
        if index >= len(fields):
            raise BadInputError(f"{label}: line {number}: has {len(fields)} field(s), so no column {index} (0-based)")
        text = fields[index].strip()
        try:
            values[i] = float(text)
        except ValueError:
            first = isinstance(column, int) and i == 0
            hint = " (an index reads every line as data; name the column to skip a header line)" if first else ""
            raise BadInputError(f"{label}: line {number}: {text!r} is not a number{hint}") from None
    return values, label
