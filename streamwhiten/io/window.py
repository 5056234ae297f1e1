"""Rows ``[start, stop)`` of a source, as a source of their own: what an apply of part of an input reads.

A `RowRange`'s row 0 is row ``start`` of the store (`first_row`). It reads through the source it wraps,
with its capabilities; a fingerprint of it hashes rows sampled inside the range.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import BadInputError
from ._store import DEFAULT_BLOCK_BYTES, StoreSource
from .abc.store import Source
from .codecs import Fetched


def check_rows(rows: Any, n_rows: int, label: str) -> tuple[int, int]:
    """``rows`` as ``(start, stop)`` with ``0 <= start < stop <= n_rows``, else `BadInputError`."""
    try:
        start, stop = (int(value) for value in rows)
        exact = all(int(value) == value for value in rows)
    except (TypeError, ValueError):
        raise BadInputError(f"rows must be a pair (start, stop) of row numbers, got {rows!r}") from None
    if not exact or not 0 <= start < stop <= n_rows:
        raise BadInputError(
            f"{label}: rows {rows!r} are not a range of its rows (0 <= start < stop <= {n_rows:,} must hold)"
        )
    return start, stop


class RowRange(StoreSource):
    """Rows ``[start, stop)`` of ``base``; closing it closes ``base``."""

    def __init__(self, base: Source, start: int, stop: int) -> None:
        start, stop = check_rows((start, stop), base.n_rows, base.label)
        super().__init__(
            base.path, base.dataset, (stop - start, base.n_features), base.dtype, base.chunk_rows, base.read_options
        )
        self.base, self.start, self.stop = base, start, stop
        self.first_row = base.first_row + start
        self.kind = base.kind  # type: ignore[misc]
        self.tabular = base.tabular  # type: ignore[misc]
        self.widens_float16 = base.widens_float16  # type: ignore[misc]
        self.layout_change = base.layout_change  # type: ignore[misc]
        self.remote = base.remote
        self.decoder = base.decoder

    @property
    def label(self) -> str:
        return self.base.label

    @property
    def location(self) -> tuple[str, str]:
        return self.base.location

    def read_into(self, start: int, stop: int, out: np.ndarray, fetched: Fetched | None = None) -> np.ndarray:
        return self.base.read_into(start + self.start, stop + self.start, out, fetched)

    def _read_into(self, start: int, stop: int, out: np.ndarray, fetched: Fetched | None = None) -> np.ndarray:
        return self.read_into(start, stop, out, fetched)  # pragma: no cover - read_into does not call it

    def fetch(self, start: int, stop: int) -> Fetched | None:
        return self.base.fetch(start + self.start, stop + self.start)

    def attrs(self) -> dict[str, Any]:
        return self.base.attrs()

    def layout_digest(self, n_rows: int) -> str | None:
        """How the store's rows up to the end of the first ``n_rows`` of this range are stored."""
        return self.base.layout_digest(self.start + n_rows)

    def fingerprint_extra(self) -> dict[str, Any]:
        return self.base.fingerprint_extra()

    def column_schema(self, names: list[str]) -> Any:
        return self.base.column_schema(names)

    def read_columns(self, start: int, stop: int, names: list[str]) -> Any:
        return self.base.read_columns(start + self.start, stop + self.start, names)

    def default_block_rows(self, target_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
        return self.base.default_block_rows(target_bytes)

    def close(self) -> None:
        self.base.close()


__all__ = ["RowRange", "check_rows"]
