"""The (query, corpus row) pairs a search never returns, as sorted rows per query (numpy only)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..errors import BadInputError


@dataclass(frozen=True)
class Exclusions:
    """Corpus rows never candidates of a query ``q``: ``rows[start[q]:start[q + 1]]``, sorted."""

    start: np.ndarray
    rows: np.ndarray

    @classmethod
    def none(cls, n_queries: int) -> Exclusions:
        return cls(np.zeros(n_queries + 1, np.int64), np.zeros(0, np.int64))

    @classmethod
    def from_pairs(cls, n_queries: int, query_rows: npt.ArrayLike, corpus_rows: npt.ArrayLike) -> Exclusions:
        """From ``(query, corpus row)`` pairs, queries counted as the search's query rows (0-based)."""
        query_rows = np.asarray(query_rows, dtype=np.int64).reshape(-1)
        corpus_rows = np.asarray(corpus_rows, dtype=np.int64).reshape(-1)
        if query_rows.shape != corpus_rows.shape:
            raise BadInputError("excluded pairs need as many query rows as corpus rows")
        if query_rows.size and (query_rows.min() < 0 or query_rows.max() >= n_queries):
            raise BadInputError(f"an excluded pair names a query outside 0..{n_queries - 1}")
        order = np.lexsort((corpus_rows, query_rows))
        start = np.zeros(n_queries + 1, np.int64)
        np.cumsum(np.bincount(query_rows, minlength=n_queries), out=start[1:])
        return cls(start, np.ascontiguousarray(corpus_rows[order]))

    @property
    def n_queries(self) -> int:
        return int(self.start.shape[0] - 1)


__all__ = ["Exclusions"]
