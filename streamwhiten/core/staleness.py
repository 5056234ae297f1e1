"""How far a published whitening is from the one a refit would give, from the statistics alone.

The published map was finalized from the statistics ``(n_p, mu_p, S_p)`` of its day:
``y = (x - beta mu_p) W`` with ``W = U_k diag((lambda + eps_)^(-gamma/2))``, where ``lambda_j, u_j`` are
the top ``k`` eigenpairs of ``Sigma_p = Sigma_beta`` of those statistics. On its own data it gives the
outputs the second moment ``W^T Sigma_p W = T = diag(lambda / (lambda + eps_)^gamma)`` (the identity
for ``gamma = 1`` up to eps). The statistics keep growing, to ``(n, mu, S)`` with ``Sigma = Sigma_beta``
of those; [`staleness`][streamwhiten.core.staleness.staleness] measures how far the published map is from what a refit
on them would give,
with no pass over the data (a few ``d x d`` products, O(d^3); for k < d also the eigendecomposition
of the current statistics, which the model a fit returns already holds).

Every part is measured in the published map's own whitened units: with
``G = diag((lambda + eps~)^(-1/2))`` (the ``k`` published eigenvalues; ``eps~`` = the model's
``eps_value``, or `ROUNDING_FLOOR` ``* lambda_1`` where that is larger)

- ``covariance = || G U_k^T (Sigma - Sigma_p) U_k G ||_2``: the whitened second moment of the current
  data, centred as a refit would centre it, against the one the map was meant to produce, in the
  metric of that target (``T'^(-1/2) (W^T Sigma W - T) T'^(-1/2)`` with ``T' = diag((lambda +
  eps~)^(1-gamma))``; gamma and eps cancel). 0.1: along some direction the map keeps, the current
  data has 10 % more or less variance than the map was built for (for ``gamma = 1``, the outputs along
  it have variance 1.1 or 0.9 instead of 1). The target metric keeps small-variance directions from
  vanishing: whitening scales them up to the size of every other one.
- ``shift = || G U_k^T beta (mu - mu_p) ||``: how far a refit would move the centre, in published
  standard deviations (a Mahalanobis length within the kept directions). 0.1: the outputs' centre is
  off by a tenth of one output standard deviation. 0 for ``beta = 0``, whose map does not centre (a
  moved mean shows in ``covariance`` then, as ``Sigma_0`` is the second moment about 0).
- ``dropped`` (k < d): ``max(0, nu_out - nu_in) / (nu_in + eps~)`` with ``nu_in`` the least current
  variance along a direction the map keeps (``lambda_min(U_k^T Sigma U_k)``) and ``nu_out`` the most
  along one it drops: 0.1: a dropped direction now carries 10 % more variance than the weakest kept
  one. 0 while the published directions still span a top-k subspace of the current data.
- ``angle`` (k < d, radians): the largest principal angle between the published top-k eigenspace and
  the current one. Reported, not counted: near-ties at the k-th eigenvalue make it large on tiny
  changes that leave every output as good as before (see docs/nightly.md).

``total = max(covariance, shift, dropped)``: 0 when a refit would give the same map (up to rotations
inside ties of the spectrum), and in "relative variance" units throughout, so a tolerance reads the
same on every part. ``benchmarks/staleness_quality.py`` relates it to the real change of retrieval and
STS scores and chooses the default tolerance (``max_staleness`` in `streamwhiten.params`).
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

#: The parts of a [`Staleness`][streamwhiten.core.staleness.Staleness], in the order they are reported; only ``total``'s
#: are counted.
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


#: Variances below this fraction of the largest eigenvalue are taken as rounding of the statistics: the
#: parts are never measured in smaller units than that, whatever eps.
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
        The statistics now, usually the published ones with new rows merged in; or a model finalized
        from them (the one a fit or update returns). Only the ``angle`` (k < d) needs the refit's
        eigenvectors: they are those of a model finalized with the published beta, which is then not
        eigendecomposed again; at k = d no eigendecomposition of the current statistics is made.

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
    return Staleness(
        covariance=covariance_part,
        shift=shift,
        dropped=dropped,
        angle=angle,
        total=total,
        n_components=k,
        n_rows_published=model.n_rows,
        n_rows=current.n_rows,
    )


def _dropped_and_angle(
    model: WhiteningModel, state: Moments, sigma: np.ndarray, refit: WhiteningModel | None, regulariser: float
) -> tuple[float, float]:
    """The ``dropped`` and ``angle`` parts (k < d) of ``model`` against the statistics ``state`` (``sigma``:
    their ``Sigma_beta``); ``refit``: a model finalized from them, whose eigenvectors are used when it has
    the published beta."""
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
