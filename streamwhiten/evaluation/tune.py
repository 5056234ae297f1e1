"""The one-pass grid: choose beta, gamma and k for a fitted model from labelled pairs.

The model keeps ``(n, mu, M)``, so ``Sigma_beta = M/n + (1-beta)^2 mu mu^T`` exists for every beta without
reading the fitting data again. Each beta costs one eigendecomposition ``U Lambda U^T``; gamma and k only
reweight and truncate the rotated pairs ``y = (x - beta*mu) U``: with ``w = (Lambda + eps_)^(-gamma)``,

    cos = sum_{j<k} ya_j yb_j w_j / sqrt(sum_{j<k} ya_j^2 w_j * sum_{j<k} yb_j^2 w_j),

three small products per block of pairs give every (gamma, k) of a beta, in one read of the pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ..core.model import WhiteningModel, components_for_variance
from ..errors import BadInputError
from ..params import check
from ..params import check_model as check_params
from ..progress import phase
from .evaluate import METRICS, PairSet, PairsInfo, correlations, cosine_rows, describe_model, evaluate_pairs
from .select import FOLDS, RULES, Resamples, Rule, Selection, check_tolerance, rule_choice, spearman_units

DEFAULT_BETAS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_GAMMAS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_VARIANCES = (0.9, 0.95, 0.99)


def default_ks(n_features: int) -> list[int]:
    """``d`` and the powers of two below it, descending (from 8 up when d > 16, else from 1)."""
    low = 8 if n_features > 16 else 1
    powers = {low << i for i in range(n_features.bit_length()) if low << i < n_features}
    return sorted(powers | {n_features}, reverse=True)


@dataclass(frozen=True)
class KChoice:
    """One k of the grid: a fixed number of components, or a fraction of explained variance."""

    n_components: int | None = None
    variance: float | None = None

    @property
    def label(self) -> str:
        return f"{self.n_components}" if self.variance is None else f"{self.variance:.0%}"

    def resolve(self, eigvals: np.ndarray) -> int:
        if self.variance is None:
            assert self.n_components is not None  # one of the two is set
            return int(self.n_components)
        return components_for_variance(eigvals, self.variance)


def make_grid(
    n_features: int,
    betas: Sequence[float] | None = None,
    gammas: Sequence[float] | None = None,
    ks: Sequence[int] | None = None,
    variances: Sequence[float] | None = None,
) -> tuple[list, list, list]:
    """Checked ``(betas, gammas, k_choices)``; ``None`` means the default, an empty list means none."""
    betas = list(DEFAULT_BETAS if betas is None else betas)
    gammas = list(DEFAULT_GAMMAS if gammas is None else gammas)
    ks = list(default_ks(n_features) if ks is None else ks)
    variances = list(DEFAULT_VARIANCES if variances is None else variances)
    if not betas:
        raise BadInputError("the grid is empty: give at least one beta")
    if not gammas:
        raise BadInputError("the grid is empty: give at least one gamma")
    if not ks and not variances:
        raise BadInputError("the grid is empty: give at least one k or explained-variance fraction")
    for name, values in (("beta", betas), ("gamma", gammas)):
        for value in values:
            check(name, value)
    for k in ks:
        check_params(n_components=k, n_features=n_features)
    for variance in variances:
        check("variance", variance)
    unique = lambda values: list(dict.fromkeys(values))  # noqa: E731 - keep the order given
    choices = [KChoice(n_components=int(k)) for k in unique(ks)]
    choices += [KChoice(variance=float(v)) for v in unique(variances)]
    return [float(b) for b in unique(betas)], [float(g) for g in unique(gammas)], choices


def vectors_of(beta: float, gamma: float, k: int, n_features: int) -> str:
    """What a setting's vectors are: ``rotated`` (beta = gamma = 0, all k: the raw cosines), ``centred``
    (beta = 1, gamma = 0, all k) or ``whitened``."""
    if gamma == 0.0 and k == n_features and beta in (0.0, 1.0):
        return "rotated" if beta == 0.0 else "centred"
    return "whitened"


def decompose(model: WhiteningModel, beta: float, eps: float | None = None) -> WhiteningModel:
    """``model`` re-finalized at ``beta`` (gamma 1, all components) from its saved statistics."""
    eps = model.eps if eps is None else eps
    return model.with_params(beta=beta, gamma=1.0, eps=eps, n_components=model.n_features)


@dataclass(frozen=True)
class PairRow:
    """One setting of the pairs grid and its scores (x100): a row of `TuneResult`'s table. ``k_label``: k as
    the grid named it (a count or a variance fraction); ``vectors``: ``raw`` (identity) or as `vectors_of`."""

    beta: float
    gamma: float
    k: int
    k_label: str
    variance: float | None
    vectors: str
    spearman: float
    pearson: float

    def score(self, metric: str) -> float:
        """The score of ``metric`` (one of `METRICS`)."""
        return float(getattr(self, metric))

    def to_json(self) -> dict[str, Any]:
        """The row as plain JSON values, the fields in order."""
        return asdict(self)


def json_rows(table: Sequence[Any]) -> Callable[[Any], dict[str, Any]]:
    """``as_json(row)``: one ``to_json()`` dict per row of ``table``, so that ``best`` is the very dict of its row."""
    made = {id(row): row.to_json() for row in table}
    return lambda row: made[id(row)]


@dataclass(frozen=True)
class TuneResult:
    """The scored grid: ``table`` in grid order, the ``best`` row (the rule's choice, see `highest`) and raw."""

    table: list[PairRow]
    best: PairRow
    raw: dict
    metric: str
    pairs: PairsInfo
    bases: dict = field(repr=False)
    tolerance: float = 0.0
    selection: Selection | None = None
    per_pair: np.ndarray | None = field(default=None, repr=False)
    cosines: np.ndarray | None = field(default=None, repr=False)

    def model_for(self, row: PairRow) -> WhiteningModel:
        """The model of one table row (sharing its beta's eigendecomposition; the raw row's: the identity map)."""
        if row.vectors == "raw":
            return self.bases[0.0].with_params(basis="identity")
        base = self.bases[row.beta]
        if row.variance is not None:
            return base.with_params(gamma=row.gamma, variance=row.variance)
        return base.with_params(gamma=row.gamma, n_components=row.k)

    def chosen_model(self) -> WhiteningModel:
        return self.model_for(self.best)

    @property
    def highest(self) -> PairRow:
        """The row scoring highest on these pairs (ties to the smaller k) where it scores above `best` (which it
        did not beat beyond the noise of all compared, or a tolerance's cheaper setting won), else `best`."""
        top = choose(self.table, self.metric)
        return self.best if not top.score(self.metric) > self.best.score(self.metric) else top  # a tie: the choice

    def to_json(self) -> dict[str, Any]:
        """The grid as plain JSON (``tune --json``'s core): ``best`` is the rule's row, ``highest`` the top score's."""
        as_json = json_rows(self.table)
        return {
            "metric": self.metric,
            "tolerance": self.tolerance,
            "raw": self.raw,
            "best": as_json(self.best),
            "highest": as_json(self.highest),
            "table": [as_json(row) for row in self.table],
            "pairs": self.pairs.to_json(),
            "selection": None if self.selection is None else self.selection.to_json(),
        }


@dataclass(frozen=True)
class PairGrid:
    """What a tuning on labelled pairs tries and how it chooses, checked when made (see `grid_search`).

    Parameters
    ----------
    betas, gammas, ks, variances : sequence, optional
        The grid (None: the defaults; empty: none), checked against the data width by `make_grid`.
    metric : str
        One of `METRICS`: what the choice maximises.
    tolerance : float
        The cheapest setting (the smallest k) surely within this many points of raw (``argmax``: of the top).
    eps : float, optional
        The regulariser of every setting (default: the model's).
    select, folds, samples, seed
        The rule (one of `RULES`), its forecast's folds, the paired bootstrap's resamples and seed.
    """

    betas: tuple[float, ...] | None = None
    gammas: tuple[float, ...] | None = None
    ks: tuple[int, ...] | None = None
    variances: tuple[float, ...] | None = None
    metric: str = "spearman"
    tolerance: float = 0.0
    eps: float | None = None
    select: str = "maxt"
    folds: int = FOLDS
    samples: int = 1000
    seed: int = 0

    def __post_init__(self):
        for name in ("betas", "gammas", "ks", "variances"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.metric not in METRICS:
            raise BadInputError(f"metric must be one of {METRICS}, got {self.metric!r}")
        object.__setattr__(self, "tolerance", check_tolerance(self.tolerance))
        if self.eps is not None:
            check_params(eps=self.eps)
        if self.select not in RULES:
            raise BadInputError(f"select must be one of {', '.join(RULES)}, got {self.select!r}")


def _plans(model: WhiteningModel, grid: PairGrid) -> tuple[dict, list, list]:
    """``(bases, plans, settings)``: each beta's eigendecomposition; its shift, rotation and weight column per
    (gamma, k), what scoring a block needs; the settings (`PairRow` fields but the scores) in column order."""
    d = model.n_features
    betas, gammas, choices = make_grid(d, grid.betas, grid.gammas, grid.ks, grid.variances)
    bases: dict = {}
    plans, settings = [], []
    for beta in betas:
        base = bases[beta] = decompose(model, beta, grid.eps)
        resolved = [(choice, choice.resolve(base.eigvals)) for choice in choices]
        columns = []
        for gamma in gammas:
            weights = (base.eigvals + base.eps_value) ** (-gamma)
            for choice, k in resolved:
                column = np.zeros(d)
                column[:k] = weights[:k]
                columns.append(column)
                settings.append((beta, gamma, k, choice.label, choice.variance, vectors_of(beta, gamma, k, d)))
        plans.append((beta * base.mean, base.eigvecs, np.stack(columns, axis=1)))
    return bases, plans, settings


def _pair_cosines(
    pairs: PairSet, plans: list, block_rows: int | None, progress: Callable[[int, int], None] | None
) -> np.ndarray:
    """The cosine of every pair under every setting of ``plans`` (a row each) and, last, raw's, in one pass."""
    n_pairs = pairs.n_pairs
    n_settings = sum(stacked.shape[1] for _, _, stacked in plans) + 1
    cosines = np.empty((n_settings, n_pairs))
    with phase(progress, f"score {n_settings} settings on {n_pairs:,} pairs", "pairs"):
        for start, a, b in pairs.blocks(block_rows):
            stop = start + a.shape[0]
            cosines[-1, start:stop] = cosine_rows(a, b)
            row = 0
            for shift, eigvecs, stacked in plans:
                ya, yb = (a - shift) @ eigvecs, (b - shift) @ eigvecs
                dots = (ya * yb) @ stacked
                norms = np.sqrt(((ya * ya) @ stacked) * ((yb * yb) @ stacked))
                block = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
                cosines[row : row + stacked.shape[1], start:stop] = block.T
                row += stacked.shape[1]
            if progress is not None:
                progress(stop, n_pairs)
    return cosines


def grid_search(
    model: WhiteningModel,
    pairs: PairSet,
    grid: PairGrid | None = None,
    *,
    block_rows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> TuneResult:
    """Score every (beta, gamma, k) of ``grid`` on ``pairs`` and choose one by ``grid.metric``, from the saved
    statistics of ``model`` only. The raw vectors (the identity map) are the table's last row.

    ``select="maxt"`` (default): the raw vectors unless a setting beats them beyond the noise of all compared
    (the paired bootstrap of the per-pair terms, `spearman_units`); with ``tolerance`` > 0, the smallest k
    surely within ``tolerance`` points of raw; forecast by ``folds``-fold cross-validation (see `select`).
    ``select="argmax"``: the highest score (with ``tolerance``, the smallest k within it of the top; ties to
    the smaller k, then the earlier row), optimistic by the winner's curse.
    """
    grid = PairGrid() if grid is None else grid
    if not isinstance(grid, PairGrid):
        raise BadInputError(f"grid must be a PairGrid, got {type(grid).__name__}")
    pairs.check_width(model.n_features)
    d, metric, tolerance = model.n_features, grid.metric, float(grid.tolerance)
    bases, plans, settings = _plans(model, grid)
    cosines = _pair_cosines(pairs, plans, block_rows, progress)
    with phase(progress, f"correlate and choose ({grid.select} rule)", None):
        table = [
            PairRow(*setting, **correlations(values, pairs.scores))
            for setting, values in zip(settings, cosines[:-1], strict=True)
        ]
        raw_scores = correlations(cosines[-1], pairs.scores)
        # the raw vectors (the identity map): the last row, the reference
        bases.setdefault(0.0, decompose(model, 0.0, grid.eps))
        table.append(PairRow(0.0, 0.0, d, str(d), None, "raw", **raw_scores))
        units, _ = spearman_units(cosines, pairs.scores, ranks=metric == "spearman")
        if grid.select == "argmax":
            best = choose(table, metric, tolerance)
            selection = Selection("argmax", tolerance)
        else:  # max-t against the raw row (the last); one set of resamples for the rule and the forecast
            costs = tuple(row.k for row in table[:-1])
            rule = Rule(cost=costs, reference_cost=d, tolerance=tolerance, samples=grid.samples, seed=grid.seed)
            resamples = Resamples(units.shape[1], grid.samples, grid.seed)
            described = {"beta": 0.0, "gamma": 0.0, "k": d, "vectors": "raw"}
            others = list(range(len(table) - 1))
            index, selection = rule_choice(units, len(table) - 1, others, rule, grid.folds, resamples, described)
            best = table[index]
    return TuneResult(table, best, raw_scores, metric, pairs.describe(), bases, tolerance, selection, units, cosines)


def choose(table: list[PairRow], metric: str = "spearman", tolerance: float = 0.0) -> PairRow:
    """The best row of ``table`` by ``metric`` (NaN counts as worst); see `grid_search`."""
    scores = np.array([row.score(metric) for row in table], dtype=np.float64)
    scores = np.where(np.isnan(scores), -np.inf, scores)
    if not np.isfinite(scores).any():
        raise BadInputError(f"no setting of the grid gives a finite {metric} score (are all cosines equal?)")
    top = scores.max()
    eligible = [i for i in range(len(table)) if scores[i] >= top - tolerance]
    best = min(eligible, key=lambda i: (table[i].k, -scores[i], i))
    return table[best]


def tune(
    model: WhiteningModel,
    pairs: PairSet,
    test_pairs: PairSet | None = None,
    *,
    grid: PairGrid | None = None,
    block_rows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[WhiteningModel, dict]:
    """Run `grid_search` and return the chosen model (with a record in ``info["tuned"]``) and a summary.

    With ``test_pairs`` the chosen setting is also scored on that separate set, next to raw, so the
    choice is not judged on the pairs that made it.
    """
    result = grid_search(model, pairs, grid, block_rows=block_rows, progress=progress)
    chosen = result.chosen_model()
    summary = dict(result.to_json(), test=None)
    if test_pairs is not None:
        with phase(progress, f"score the choice on {test_pairs.n_pairs:,} test pairs", "pairs") as told:
            scored = evaluate_pairs(test_pairs, chosen, block_rows, told)
        test = scored.to_json()
        summary["test"] = {"pairs": test["pairs"], "raw": test["raw"], "chosen": test["whitened"]}
    record = {
        "metric": result.metric,
        "tolerance": result.tolerance,
        "setting": describe_model(chosen),
        "validation": {
            "pairs": result.pairs.to_json(),
            "raw": result.raw,
            "chosen": {"spearman": result.best.spearman, "pearson": result.best.pearson},
        },
        "test": summary["test"],
        "selection": summary["selection"],
        "grid_size": len(result.table),
    }
    chosen = replace(chosen, info=dict(chosen.info, tuned=record))
    summary["chosen"] = describe_stored(chosen)
    return chosen, summary


def describe_stored(model: WhiteningModel) -> dict:
    """`describe_model` with the outputs' storage (float32 without one) and its bytes per vector."""
    storage = model.storage
    return dict(
        describe_model(model),
        dtype=model.dtype,
        bytes_per_vector=(storage.bytes_per_vector(model.n_components) if storage else 4 * model.n_components),
    )


__all__ = [
    "describe_stored",
    "grid_search",
    "PairGrid",
    "PairRow",
    "tune",
    "choose",
    "decompose",
    "make_grid",
    "default_ks",
    "TuneResult",
    "KChoice",
    "DEFAULT_BETAS",
    "DEFAULT_GAMMAS",
    "DEFAULT_VARIANCES",
]
