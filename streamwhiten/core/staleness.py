"""How far a published whitening is from the one a refit would give, from the statistics alone.

The published map ``y = (x - beta mu_p) W``, ``W = U_k diag((lambda + eps_)^(-gamma/2))``, came from the
statistics ``(n_p, mu_p, S_p)`` of its day; they grow to ``(n, mu, S)``. With no pass over the data (a
few ``d x d`` products), each part is measured in the published map's whitened units, with
``G = diag((lambda + eps~)^(-1/2))`` (``eps~``: ``eps_value``, at least `ROUNDING_FLOOR` ``* lambda_1``):

- ``covariance = || G U_k^T (Sigma - Sigma_p) U_k G ||_2``: the relative change of variance along a kept
  direction (0.1: 10 % more or less than the map was built for);
- ``shift = || G U_k^T beta (mu - mu_p) ||``: how far a refit moves the centre, in output standard deviations;
- ``dropped`` (k < d): how much more variance a dropped direction now carries than the weakest kept one;
- ``angle`` (k < d): the largest principal angle between the published and current top-k eigenspaces
  (reported, not counted: near-ties make it large on harmless changes).

``total = max(covariance, shift, dropped)``: 0 when a refit gives the same map. docs/nightly.md derives
each part and the default tolerance (``max_staleness`` in `streamwhiten.params`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import BadInputError
from ..params import DEFAULT_MAX_STALENESS, check
from .model import WhiteningModel, checked_covariance, finalize
from .stats import Moments, covariance

#: The parts of a `Staleness`, in the order they are reported; only ``total``'s are counted.
PARTS = ("covariance", "shift", "dropped", "angle")
COUNTED = ("covariance", "shift", "dropped")


@dataclass(frozen=True)
class Staleness:
    """How far a published map is from a refit on the current statistics (see the module docstring).

    Examples
    --------
    >>> import numpy as np
    >>> from streamwhiten.core import stats
    >>> from streamwhiten.core.model import finalize
    >>> rows = np.random.default_rng(0).standard_normal((4000, 5)) * [3, 2, 1, 1, 0.5]
    >>> published = finalize(stats.block_moments(rows[:2000]))
    >>> same = staleness(published, stats.merge(published.state, published.state))
    >>> same.total
    0.0
    >>> grown = staleness(published, stats.block_moments(rows))
    >>> 0 < grown.total < 0.2, sorted(grown.to_json())[:3]
    (True, ['angle', 'covariance', 'dropped'])
    """

    covariance: float
    shift: float
    dropped: float
    angle: float
    total: float
    n_components: int
    n_rows_published: int
    n_rows: int

    def exceeds(self, tolerance: float | None = None) -> bool:
        """Whether a refit is due: ``total > tolerance`` (default ``max_staleness``'s default)."""
        limit = DEFAULT_MAX_STALENESS if tolerance is None else float(check("max_staleness", tolerance))
        return self.total > limit

    def to_json(self) -> dict[str, Any]:
        """The parts, the total and the row counts as plain JSON numbers (``staleness --json``)."""
        return asdict(self)


#: Variances below this fraction of the largest eigenvalue are rounding: no part is measured in smaller units.
ROUNDING_FLOOR = 1e-10


def _regulariser(eps_value: float, top: float) -> float:
    """``eps_``, or `ROUNDING_FLOOR` times the largest eigenvalue where that is larger."""
    return max(float(eps_value), ROUNDING_FLOOR * max(top, 0.0))


def staleness(model: WhiteningModel, current: Moments | WhiteningModel) -> Staleness:
    """How far ``model`` (the published map) is from a refit on ``current`` (the statistics now).

    Parameters
    ----------
    model : WhiteningModel
        The published model; it holds the statistics it was finalized from and its setting (beta,
        gamma, eps, k), which the refit keeps (k included, also when the model chose k by variance).
    current : Moments or WhiteningModel
        The statistics now (usually the published ones with new rows merged in), or a model finalized
        from them: its eigenvectors serve the ``angle`` (k < d) when it has the published beta.

    Returns
    -------
    Staleness
        The parts and ``total = max(covariance, shift, dropped)``; 0 when a refit gives the same map.

    Raises
    ------
    BadInputError
        When the statistics have another width than the model, fewer than 2 rows, or a covariance that
        overflowed.
    """
    refit = current if isinstance(current, WhiteningModel) else None
    state = current.state if isinstance(current, WhiteningModel) else current
    d, k = model.n_features, model.n_components
    if state.n_features != d:
        raise BadInputError(f"the statistics have {state.n_features} features, the published model {d}")
    beta = model.beta
    sigma = checked_covariance(state, beta)
    regulariser = _regulariser(model.eps_value, float(model.eigvals[0]))
    scale = 1.0 / np.sqrt(model.eigvals[:k] + regulariser)
    kept = model.eigvecs[:, :k]
    change = kept.T @ (sigma - covariance(model.state, beta)) @ kept
    deviation = change * scale[:, None] * scale[None, :]
    covariance_part = float(np.max(np.abs(np.linalg.eigvalsh(deviation))))
    offset = beta * (state.mean - model.state.mean)
    shift = float(np.linalg.norm((offset @ kept) * scale))
    dropped, angle = _dropped_and_angle(model, state, sigma, refit, regulariser) if k < d else (0.0, 0.0)
    total = max(covariance_part, shift, dropped)
    return Staleness(covariance_part, shift, dropped, angle, total, k, model.n_rows, current.n_rows)


def _dropped_and_angle(
    model: WhiteningModel, state: Moments, sigma: np.ndarray, refit: WhiteningModel | None, regulariser: float
) -> tuple[float, float]:
    """The ``dropped`` and ``angle`` parts (k < d) of ``model`` against ``state`` (``sigma``: its ``Sigma_beta``)."""
    k = model.n_components
    kept, others = model.eigvecs[:, :k], model.eigvecs[:, k:]
    least_kept = float(np.linalg.eigvalsh(kept.T @ sigma @ kept)[0])
    most_dropped = float(np.linalg.eigvalsh(others.T @ sigma @ others)[-1])
    dropped = max(0.0, most_dropped - least_kept) / (max(least_kept, 0.0) + regulariser)
    # the refit's eigenvectors: those of Sigma_beta of the current statistics (any k, gamma, eps)
    if refit is None or refit.beta != model.beta or not (refit.state is state or refit.state == state):
        refit = finalize(state, beta=model.beta, gamma=model.gamma, eps=model.eps, n_components=k)
    # the largest principal angle: its sine is the largest singular value of (refit's dropped)^T kept,
    # its cosine the smallest of (refit's kept)^T kept (both, so that it is accurate near 0 and pi/2)
    sine = float(np.linalg.norm(refit.eigvecs[:, k:].T @ kept, ord=2))
    cosine = float(np.linalg.svd(refit.eigvecs[:, :k].T @ kept, compute_uv=False)[-1])
    return dropped, math.atan2(sine, cosine)


__all__ = ["Staleness", "staleness", "PARTS", "COUNTED"]
