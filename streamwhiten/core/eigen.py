"""The eigendecomposition of a covariance with the signs fixed, so the same matrix gives the same basis
on every machine (LAPACK may return either sign). numpy only: the codes take their axes here too.
"""

from __future__ import annotations

import numpy as np

from ..errors import StreamwhitenError


def eigendecomposition(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (descending, clipped at 0) and eigenvectors (columns, deterministic signs)."""
    try:
        eigvals, eigvecs = np.linalg.eigh(matrix)
    except np.linalg.LinAlgError as exc:
        raise StreamwhitenError(f"the eigensolver failed on the covariance matrix: {exc}") from exc
    eigvals = np.maximum(eigvals[::-1], 0.0)
    eigvecs = np.ascontiguousarray(eigvecs[:, ::-1])
    pivots = np.argmax(np.abs(eigvecs), axis=0)
    signs = np.sign(eigvecs[pivots, np.arange(eigvecs.shape[1])])
    signs[signs == 0] = 1.0
    eigvecs *= signs
    return eigvals, eigvecs


__all__ = ["eigendecomposition"]
