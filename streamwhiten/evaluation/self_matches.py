"""Queries that are rows of the corpus: a common mistake of a retrieval task (each query's own text
embedded into the corpus too, with no exclude file), which puts that row first in the query's results
and scores recall@1 near 0.

They are found from what the search of the raw vectors keeps anyway, with no pass of their own: each
query's nearest corpus row and its cosine (the top of its list). A cosine of 1 within float rounding is
the query itself: for unit vectors ``1 - cos(q, x)`` is second order in the rounding of either, so what
is left is the storage's own rounding of the searched rows (first order, at most its unit roundoff) and
the queries' and corpus's float32 rounding; `tolerance` allows twice each. Two different texts
are never that close. A query whose copy is judged relevant to it is not counted (the judgement says so).

The library only reports them (`SelfMatches`, in ``RetrievalResult.self_matches`` and
``tune``'s summary); the command line warns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: The unit roundoff of the float storages a search holds its corpus rows in.
ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "float64": 2.0**-53}


def tolerance(dtype: str) -> float:
    """How far below 1 the cosine of a query and a corpus row searched as ``dtype`` may be and the row
    still be the query itself (within float32 rounding of both, and the storage's rounding)."""
    return 4 * ROUNDOFF["float32"] + 2 * ROUNDOFF[dtype]


@dataclass(frozen=True)
class SelfMatches:
    """Queries whose nearest corpus row is the query itself (cosine 1 within `tolerance`) and not
    judged relevant to it.

    Attributes
    ----------
    pairs : tuple of (str, str)
        ``(query id, corpus id)`` of each, as the qrels and exclude files write them (0-based rows, or the
        values of the id columns): the lines of an exclude file that drops them.
    n_queries : int
        The queries searched.
    tolerance : float
        The cosine's distance from 1 taken as equal.
    """

    pairs: tuple[tuple[str, str], ...]
    n_queries: int
    tolerance: float

    @property
    def count(self) -> int:
        return len(self.pairs)

    def to_json(self) -> dict[str, Any]:
        """``{"count", "n_queries", "tolerance", "pairs"}`` (pairs as ``[query id, corpus id]`` lists)."""
        return {
            "count": self.count,
            "n_queries": int(self.n_queries),
            "tolerance": float(self.tolerance),
            "pairs": [list(pair) for pair in self.pairs],
        }


def find_self_matches(task: Any, rows: np.ndarray, scores: np.ndarray, dtype: str) -> SelfMatches:
    """The `SelfMatches` of ``task`` (an open `RetrievalTask`) from the top of
    each query's list of the raw vectors' search: ``rows`` and ``scores`` (the cosines) of each query's
    nearest corpus rows, best first, the corpus searched as ``dtype`` (``float32``, ``float16``)."""
    allowed = tolerance(dtype)
    top_rows = np.asarray(rows)[:, 0]
    top = np.asarray(scores, dtype=np.float64)[:, 0]
    lines = np.flatnonzero((top_rows >= 0) & (top >= 1.0 - allowed))
    relevant = task.qrels.relevant()
    judged = set(zip(relevant.queries.tolist(), relevant.rows.tolist(), strict=True))
    query_ids, corpus_ids = task.ids
    pairs = []
    for line in lines.tolist():
        query, row = int(task.query_rows[line]), int(top_rows[line])
        if (query, row) not in judged:
            pairs.append((query_ids.name(query), corpus_ids.name(row)))
    return SelfMatches(tuple(pairs), int(top_rows.shape[0]), allowed)


__all__ = ["ROUNDOFF", "SelfMatches", "find_self_matches", "tolerance"]
