"""Relevance judgements (qrels) and excluded pairs for retrieval evaluation, read from BEIR's TSV files.

A qrels file is BEIR's ``qrels/*.tsv``: the header ``query-id<TAB>corpus-id<TAB>score`` and one judged pair
a line, relevant when ``score > 0`` (the score its grade, nDCG's gain). An exclude file has the header
``query-id<TAB>corpus-id`` (a third column is ignored) and lists pairs to drop from that query's candidates
(its own text, say). Ids are the 0-based rows of the query and corpus stores, or the values of a store's id
column (Parquet, Lance). The delimiter is found as `streamwhiten.io.text` says (a tab, for these files).

Every problem is one line naming the file and line: a missing header, a line of the wrong length, an id
that names no row, a score that is not a finite number, a pair given twice, no relevant pair at all, a
relevant pair that is also excluded. A local file first goes through the checks of every file read
(`streamwhiten._paths.check_readable`): a missing one, a directory, a FIFO or a device is bad input (exit 2,
never opened), one that may not be read an I/O error (exit 74).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .._paths import check_readable
from ..errors import BadInputError
from ..io import remote
from ..io.text import read_rows

QRELS_HEADER = ("query-id", "corpus-id", "score")
EXCLUDE_HEADER = ("query-id", "corpus-id")


@dataclass(frozen=True)
class Ids:
    """How the ids of one store's rows are written in a qrels file: its 0-based rows (``ids`` None) or
    the values of its id column (``ids[row]``)."""

    label: str
    n_rows: int
    ids: Sequence[str] | None = None
    column: str | None = None

    @cached_property
    def lookup(self) -> dict | None:
        return None if self.ids is None else {value: row for row, value in enumerate(self.ids)}

    def row(self, value: str, where: str, what: str) -> int:
        """The row ``value`` names, else one line naming the file and line (``where``) and the column (``what``)."""
        if self.lookup is not None:
            row = self.lookup.get(value)
        else:  # "²".isdigit() too
            row = int(value) if value.isascii() and value.isdigit() and int(value) < self.n_rows else None
        if row is None:
            raise BadInputError(f"{where}: {what} {value!r} is not {self.describe()}")
        return row

    def name(self, row: int) -> str:
        """Row ``row`` as a qrels file names it: its id, else its number."""
        return str(row if self.ids is None else self.ids[row])

    def describe(self) -> str:
        if self.ids is None:
            return f"a row of {self.label} ({self.n_rows:,} rows, counted from 0)"
        return f"an id in column {self.column!r} of {self.label}"


@dataclass(frozen=True)
class Qrels:
    """Judged pairs as row numbers, sorted by query row, then corpus row.

    Attributes
    ----------
    label : str
        The file they came from.
    queries, rows : ndarray, int64
        The query row and corpus row of each judged pair.
    grades : ndarray, float64
        Each pair's score as given (relevant when above 0).
    lines : ndarray, int64
        Each pair's line in the file, for messages.
    """

    label: str
    queries: np.ndarray
    rows: np.ndarray
    grades: np.ndarray
    lines: np.ndarray

    @property
    def n_pairs(self) -> int:
        return int(self.queries.shape[0])

    def relevant(self) -> Qrels:
        """Only the relevant pairs (score > 0)."""
        keep = self.grades > 0
        return Qrels(self.label, self.queries[keep], self.rows[keep], self.grades[keep], self.lines[keep])

    def query_rows(self) -> np.ndarray:
        """The query rows with at least one relevant pair, ascending: the queries evaluated."""
        return np.unique(self.queries[self.grades > 0])

    def describe(self) -> QrelsInfo:
        relevant = self.grades > 0
        return QrelsInfo(
            self.label,
            self.n_pairs,
            int(relevant.sum()),
            int(np.unique(self.queries).size),
            int(np.unique(self.queries[relevant]).size),
            bool(np.any(self.grades[relevant] != 1)),
        )


@dataclass(frozen=True)
class QrelsInfo:
    """What a result records of the judgements read: the file, its judged pairs, the relevant ones, the queries
    judged, those with a relevant document, and whether the grades differ from 1."""

    qrels: str
    n_pairs: int
    n_relevant: int
    n_queries: int
    n_queries_with_relevant: int
    graded: bool


def _table(path: str, header: tuple, columns: tuple) -> tuple[str, list]:
    """The data lines of the file at ``path``, after checking its header starts with ``header``."""
    label = remote.redact(str(path))
    if not remote.is_url(str(path)):  # as every file read: a FIFO or device refused at once, never opened
        check_readable(str(path), directory=False)
    rows = read_rows(str(path))
    if not rows:
        raise BadInputError(f"{label}: the file is empty (expected the header {_tabbed(header)})")
    number, fields = rows[0]
    names = tuple(field.strip() for field in fields)
    if names[: len(header)] != header or len(names) not in columns:
        raise BadInputError(f"{label}: line {number}: expected the header {_tabbed(header)}, got {_tabbed(names)}")
    for number, fields in rows[1:]:
        if len(fields) != len(names):
            raise BadInputError(f"{label}: line {number}: has {len(fields)} field(s), the header {len(names)}")
    return label, rows[1:]


def _tabbed(fields: Sequence[str]) -> str:
    return "'" + "<TAB>".join(fields) + "'"


def read_qrels(path: str, queries: Ids, corpus: Ids) -> Qrels:
    """Read a BEIR qrels file whose ids name rows of the ``queries`` and ``corpus`` stores.

    Raises
    ------
    BadInputError
        One line naming the file and line: see the module docstring.
    """
    label, lines = _table(path, QRELS_HEADER, (3,))
    n = len(lines)
    q_rows, c_rows = np.empty(n, np.int64), np.empty(n, np.int64)
    grades, numbers = np.empty(n, np.float64), np.empty(n, np.int64)
    for i, (number, fields) in enumerate(lines):
        query_id, corpus_id, score = (field.strip() for field in fields)
        q_rows[i] = queries.row(query_id, f"{label}: line {number}", "query-id")
        c_rows[i] = corpus.row(corpus_id, f"{label}: line {number}", "corpus-id")
        try:
            grades[i] = float(score)
        except ValueError:
            raise BadInputError(f"{label}: line {number}: score {score!r} is not a number") from None
        if not math.isfinite(grades[i]):
            raise BadInputError(f"{label}: line {number}: score {score!r} is not a finite number")
        numbers[i] = number
    if n == 0:
        raise BadInputError(f"{label}: holds no judged pair (only the header)")
    order = np.lexsort((numbers, c_rows, q_rows))
    q_rows, c_rows, grades, numbers = q_rows[order], c_rows[order], grades[order], numbers[order]
    same = np.flatnonzero((q_rows[1:] == q_rows[:-1]) & (c_rows[1:] == c_rows[:-1]))
    if same.size:
        first = same[np.argmin(numbers[same + 1])]
        raise BadInputError(
            f"{label}: line {numbers[first + 1]}: the pair of query row {q_rows[first]} and corpus row "
            f"{c_rows[first]} was already judged on line {numbers[first]}"
        )
    if not np.any(grades > 0):
        raise BadInputError(f"{label}: holds no relevant pair (score > 0)")
    return Qrels(label, q_rows, c_rows, grades, numbers)


def read_exclude(path: str, queries: Ids, corpus: Ids, qrels: Qrels | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(query rows, corpus rows)`` of the pairs an exclude file lists (duplicates dropped), sorted.

    With ``qrels``, a listed pair that ``qrels`` calls relevant is refused (it could never be found).
    """
    label, lines = _table(path, EXCLUDE_HEADER, (2, 3))
    pairs: dict[tuple[int, int], int] = {}
    for number, fields in lines:
        q = queries.row(fields[0].strip(), f"{label}: line {number}", "query-id")
        pairs.setdefault((q, corpus.row(fields[1].strip(), f"{label}: line {number}", "corpus-id")), number)
    if qrels is not None and pairs:
        relevant = qrels.relevant()
        for q, c, line in zip(relevant.queries, relevant.rows, relevant.lines, strict=True):
            number = pairs.get((int(q), int(c)))
            if number is not None:
                raise BadInputError(
                    f"{label}: line {number}: excludes the pair of query row {q} and corpus row {c}, "
                    f"which {qrels.label} line {line} calls relevant"
                )
    q_rows, c_rows = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2).T.copy()
    return q_rows, c_rows


__all__ = ["EXCLUDE_HEADER", "QRELS_HEADER", "Ids", "Qrels", "QrelsInfo", "read_exclude", "read_qrels"]
