"""The one error for rows holding NaN or Inf that a caller cannot skip: it names the first such row."""

from __future__ import annotations

import numpy as np

from ..errors import NonFiniteError


def raise_if_nonfinite(values: np.ndarray, prefix: str = "", *, start: int = 0, suffix: str = "") -> None:
    """`NonFiniteError` ``"{prefix} row {row} holds NaN or Inf{suffix}"`` naming the first row
    of the 2-D ``values`` that holds NaN or Inf, counted from ``start`` (a block's first row), if any."""
    finite = np.isfinite(values).all(axis=1)
    if not finite.all():
        row = start + int(np.argmin(finite))
        lead = f"{prefix} " if prefix else ""
        raise NonFiniteError(f"{lead}row {row} holds NaN or Inf{suffix}", row=row)


__all__ = ["raise_if_nonfinite"]
