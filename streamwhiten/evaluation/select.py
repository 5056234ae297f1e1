"""Choosing a setting that holds on queries it was not chosen on, and saying what it will score.

The best of many noisy scores is high by chance (the winner's curse: on 262 queries, the arg-max of 1,250
settings scored +0.6 nDCG@10 above raw float32 and 3.7 below it on other queries). So a tuning starts from
a **reference** (the raw vectors, in the most faithful storage the budget allows) and leaves it only for a
candidate whose advantage survives the number of candidates compared.

**The rule (max-t)** works on a table of per-unit scores (candidates x units: queries or pairs) and the
reference's row. With ``D = scores - reference``, ``m_c`` the mean of row ``c`` and ``s_c`` its standard
error, the paired bootstrap of the units (the resamples of `paired_bootstrap`) gives in each resample the
largest standardized deviation ``max_c (m*_c - m_c) / s_c``; with ``q`` its ``level`` quantile, ``m_c - q
s_c`` bounds every candidate's true advantage at once (99% by default). A candidate **beats the
reference** when its bound is above 0; the choice is the highest bound among those, else the reference.
With ``tolerance`` T > 0: the cheapest (fewest bytes, smallest k) of the reference and the candidates
whose bound is above ``-T``.

**The forecast**: K-fold cross-validation over the units (the rule run on K-1 folds, its choice scored on
the fold left out) estimates what the choice scores on unseen units, next to the reference, with 95%
paired bootstrap intervals (`FORECAST_LEVEL`).

Why 99%: with a thousand settings and the codes of a budget on 131 queries, the 95% rule moved in 4 of 12
cells (pooling x budget), in one of 100 half splits, to a setting that lost over a point of nDCG@10 on the
other half; at 99% in none of the 1,200, and it still found the real gains of the synthetic task and of
CLS pairs in all 20 splits (``benchmarks/tune_generalization.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import BadInputError

#: Selection rules: ``maxt`` (the default, see the module docstring) and ``argmax`` (the highest mean).
RULES = ("maxt", "argmax")
#: Folds of the cross-validated forecast.
FOLDS = 5
#: The level of the forecast's intervals (the rule's own simultaneous level is `Rule.level`).
FORECAST_LEVEL = 0.95


@dataclass(frozen=True)
class Pick:
    """What `select` chose: ``index`` (a row of the candidates, or None for the reference), each candidate's
    mean ``advantage`` over the reference and its simultaneous lower ``bound`` (x100; NaN under ``argmax``),
    and the critical value ``critical`` of the standardized maximum."""

    index: int | None
    advantage: np.ndarray
    bound: np.ndarray
    critical: float
    rule: str

    @property
    def n_beating(self) -> int:
        """Candidates whose advantage survives the comparison of all of them (bound above 0)."""
        return int(np.sum(self.bound > 0))


#: Resamples drawn and multiplied at a time: a block of counts takes ``BLOCK x units`` doubles.
BLOCK = 1000
#: Counts kept in memory for reuse when all of them take at most this many doubles (64 MiB); larger
#: tables are drawn again, block by block, for each pass.
KEEP = 1 << 23


def _counts(rng: np.random.Generator, rows: int, n_units: int) -> np.ndarray:
    index = rng.integers(0, n_units, size=(rows, n_units))
    flat = (np.arange(rows)[:, None] * n_units + index).ravel()
    return np.bincount(flat, minlength=rows * n_units).reshape(rows, n_units).astype(np.float64)


class Resamples:
    """The paired bootstrap's resamples of ``n_units`` units, ``samples`` of them from ``seed``, as blocks of
    counts (at most `BLOCK` resamples x units each) so that memory stays bounded whatever ``samples``.

    The generator draws ``(samples, n_units)`` indices in block order, which is the same stream as one
    draw of all of them. One object is shared by every use of the same resamples (the differences, the
    rule, the forecast's intervals); its counts are drawn once and kept when they fit in `KEEP`
    doubles, else drawn again for each pass.
    """

    def __init__(self, n_units: int, samples: int, seed: int, block: int | None = None):
        self.n_units, self.samples, self.seed = int(n_units), int(samples), int(seed)
        self.block = BLOCK if block is None else int(block)
        self._kept: list[np.ndarray] | None = None

    def are(self, n_units: int, samples: int, seed: int) -> bool:
        """Whether these are the resamples of ``n_units`` units, ``samples`` of them from ``seed``."""
        return (self.n_units, self.samples, self.seed) == (n_units, samples, seed)

    def __iter__(self):
        if self._kept is not None:
            yield from self._kept
            return
        rng = np.random.default_rng(self.seed)
        keep = self.samples * self.n_units <= KEEP
        kept = []
        for start in range(0, self.samples, self.block):
            counts = _counts(rng, min(self.block, self.samples - start), self.n_units)
            if keep:
                kept.append(counts)
            yield counts
        if keep:
            self._kept = kept

    def means(self, values: np.ndarray) -> np.ndarray:
        """The resampled means of each row of ``values`` (rows x units): rows x samples."""
        values = np.asarray(values, dtype=np.float64)
        if self.samples == 0:
            return np.zeros((values.shape[0], 0))
        return np.hstack([values @ counts.T for counts in self]) / self.n_units


@dataclass(frozen=True)
class Rule:
    """How `select` chooses, and `forecast` cross-validates the choice: one record of the rule's
    settings, shared by both.

    Parameters
    ----------
    name : {"maxt", "argmax"}
        ``argmax``: the highest mean, ties to the earlier row, the reference only when it is strictly
        better than all (the old choice, kept for comparison).
    cost, reference_cost
        With ``tolerance`` > 0: what is minimised (bytes per vector, k) among the rows within tolerance.
    tolerance : float
        Points (x100) the choice may be below the reference, surely, to be cheaper.
    samples, seed, level
        The paired bootstrap of the units: resamples, the generator's seed and the simultaneous level of
        the bounds.
    """

    name: str = "maxt"
    cost: tuple[float, ...] | None = None
    reference_cost: float = math.inf
    tolerance: float = 0.0
    samples: int = 1000
    seed: int = 0
    level: float = 0.99

    def __post_init__(self) -> None:
        if self.name not in RULES:
            raise BadInputError(f"the selection rule must be one of {', '.join(RULES)}, got {self.name!r}")
        check_tolerance(self.tolerance)
        if self.cost is not None:
            object.__setattr__(self, "cost", tuple(float(value) for value in self.cost))


@dataclass(frozen=True)
class Selection:
    """The record of a tuning's choice (``selection`` of ``tune --json`` and ``info["tuned"]``): the ``rule``,
    its ``tolerance``, the ``reference`` row (None under ``argmax``) and whether it was kept; under max-t also
    the settings compared, those beating the reference, the ``critical`` value at the simultaneous ``level``,
    the chosen row's lower ``bound`` (None: the reference kept) and the `forecast` (None: too few units)."""

    rule: str
    tolerance: float
    reference: dict | None = None
    kept_reference: bool | None = None
    n_compared: int = 0
    n_beating: int = 0
    critical: float = math.nan
    level: float = 0.95
    bound: float | None = None
    forecast: dict | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as plain JSON (``argmax``: only ``rule``, ``tolerance``, ``reference``, ``kept_reference``)."""
        out = asdict(self)
        return dict(list(out.items())[:4]) if self.rule == "argmax" else out

    @classmethod
    def from_json(cls, record: Mapping[str, Any] | None) -> Selection | None:
        """A record read back (None: none); records saved before ``tolerance`` and ``level`` were kept chose
        with no tolerance at 95%."""
        if not record:
            return None
        known = {key: record[key] for key in (item.name for item in fields(cls)) if key in record}
        return cls(**{**known, "tolerance": record.get("tolerance") or 0.0})


def rule_choice(
    units: np.ndarray, reference: int, others: list[int], rule: Rule, folds: int, resamples: Resamples, described: dict
) -> tuple[int, Selection]:
    """The row of ``units`` the rule chooses among ``others`` against ``reference`` (the reference where none
    beats it beyond the noise), and the `Selection` record of the choice (``described``: the reference), with
    the ``folds``-fold forecast (`forecast`) where there are enough units for it."""
    picked = select(units[others], units[reference], rule, resamples=resamples)
    index = reference if picked.index is None else others[picked.index]
    predicted = None
    if units.shape[1] >= 2 * folds:
        predicted = forecast(units[others], units[reference], rule, folds=folds, resamples=resamples)
    kept = index == reference
    bound = None if kept else float(picked.bound[others.index(index)])
    chose = (kept, len(others), picked.n_beating, picked.critical, rule.level, bound, predicted)
    return index, Selection(rule.name, float(rule.tolerance), described, *chose)


def check_tolerance(tolerance: object) -> float:
    """``tolerance`` as a float, checked to be a finite number >= 0 (the points a choice may give up)."""
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise BadInputError(f"tolerance must be a number >= 0, got {tolerance!r}")
    return float(tolerance)


def _check(scores: npt.ArrayLike, reference: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    scores = np.asarray(scores, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if scores.ndim != 2 or reference.ndim != 1 or scores.shape[1] != reference.shape[0]:
        raise BadInputError(
            f"expected a candidates x units table and the reference's units, got {scores.shape} and {reference.shape}"
        )
    if reference.shape[0] < 2:
        raise BadInputError(f"a selection needs at least 2 queries or pairs, got {reference.shape[0]}")
    return np.where(np.isnan(scores), -np.inf, scores), reference


def select(
    scores: npt.ArrayLike, reference: npt.ArrayLike, rule: Rule | None = None, *, resamples: Resamples | None = None
) -> Pick:
    """Choose a candidate row of ``scores`` or the ``reference`` (see the module docstring).

    Parameters
    ----------
    scores : array, candidates x units
        Each candidate's score on each unit (query or pair), as fractions (the results are x100).
    reference : array, units
        The reference's scores on the same units.
    rule : Rule, optional
        The rule and its settings (default: max-t, no tolerance, 1000 resamples, seed 0).
    resamples : Resamples, optional
        The resamples of these units already made (``rule.samples`` and ``rule.seed`` are then theirs).
    """
    rule = rule if rule is not None else Rule()
    samples, seed, level, tolerance = rule.samples, rule.seed, rule.level, rule.tolerance
    scores, reference = _check(scores, reference)
    n_candidates, n_units = scores.shape
    with np.errstate(invalid="ignore"):
        diffs = scores - reference
        advantage = 100.0 * diffs.mean(axis=1) if n_candidates else np.zeros(0)
    if rule.name == "argmax":
        bound = np.full(n_candidates, math.nan)
        if n_candidates == 0 or not np.any(advantage > 0):
            return Pick(None, advantage, bound, math.nan, rule.name)
        return Pick(int(np.argmax(advantage)), advantage, bound, math.nan, rule.name)
    if samples < 1:
        raise BadInputError("the max-t rule needs at least one bootstrap resample")
    finite = np.isfinite(advantage)
    diffs = np.where(finite[:, None], diffs, 0.0)
    error = 100.0 * diffs.std(axis=1, ddof=1) / math.sqrt(n_units)
    varies = finite & (error > 0)
    critical = 0.0
    if varies.any():
        if resamples is None or not resamples.are(n_units, samples, seed):
            resamples = Resamples(n_units, samples, seed)
        varying, centre, scale = diffs[varies], advantage[varies, None], error[varies, None]
        largest = [  # each resample's largest standardized deviation, a block of resamples at a time
            ((100.0 * (varying @ counts.T) / n_units - centre) / scale).max(axis=0) for counts in resamples
        ]
        critical = float(np.quantile(np.concatenate(largest), level))
    # a row equal to the reference plus a constant has no noise: its bound is its advantage
    bound = np.where(finite, advantage - critical * error, -math.inf)
    if tolerance > 0:
        costs = np.asarray(rule.cost if rule.cost is not None else np.zeros(n_candidates), dtype=np.float64)
        within = np.flatnonzero(bound > -tolerance)
        best_cost = min([rule.reference_cost, *costs[within]])
        if best_cost >= rule.reference_cost:
            return Pick(None, advantage, bound, critical, rule.name)
        cheapest = within[costs[within] == best_cost]
        return Pick(int(cheapest[np.argmax(bound[cheapest])]), advantage, bound, critical, rule.name)
    if n_candidates == 0 or not np.any(bound > 0):
        return Pick(None, advantage, bound, critical, rule.name)
    return Pick(int(np.argmax(bound)), advantage, bound, critical, rule.name)


def intervals(
    values: npt.ArrayLike, samples: int, seed: int, level: float = 0.95, resamples: Resamples | None = None
) -> list[tuple[float, float | None, float | None]]:
    """``(mean, low, high)`` x100 of each row of per-unit ``values`` (rows x units): the mean and its bootstrap
    percentile interval, all from the same resamples."""
    values = np.asarray(values, dtype=np.float64)
    means = 100.0 * values.mean(axis=1)
    if samples <= 0:
        return [(float(mean), None, None) for mean in means]
    if resamples is None or not resamples.are(values.shape[1], samples, seed):
        resamples = Resamples(values.shape[1], samples, seed)
    tails = np.percentile(100.0 * resamples.means(values), [50 * (1 - level), 50 * (1 + level)], axis=1)
    return [(float(mean), float(low), float(high)) for mean, low, high in zip(means, *tails, strict=True)]


def forecast(
    scores: npt.ArrayLike,
    reference: npt.ArrayLike,
    rule: Rule | None = None,
    *,
    folds: int = FOLDS,
    resamples: Resamples | None = None,
) -> dict:
    """The cross-validated estimate of what ``rule``'s choice scores on units it was not chosen on.

    The units are dealt at random (``rule.seed``) into ``folds`` folds; for each, `select` runs on the
    others and its choice (a candidate or the reference) is scored on that fold. Returns ``{"chosen": {score,
    low, high}, "reference": {...}, "difference": {...}, "folds", "kept_reference"}`` (x100; ``kept_reference``:
    the folds whose choice was the reference), the intervals by the paired bootstrap of the units
    (``resamples``, when given, are those of all the units).
    """
    rule = rule if rule is not None else Rule()
    samples, seed = rule.samples, rule.seed
    scores, reference = _check(scores, reference)
    n_units = reference.shape[0]
    folds = int(folds)
    if not 2 <= folds <= n_units // 2:
        raise BadInputError(f"a {folds}-fold forecast needs at least {2 * max(folds, 2)} queries or pairs")
    fold_of = np.random.default_rng(seed).permutation(n_units) % folds
    held_out = np.empty(n_units)
    kept = 0
    for fold in range(folds):
        train, test = fold_of != fold, fold_of == fold
        choice = select(scores[:, train], reference[train], rule).index
        kept += choice is None
        held_out[test] = reference[test] if choice is None else scores[choice, test]
    out: dict = {"folds": folds, "kept_reference": kept}
    names = ("chosen", "reference", "difference")
    rows = np.stack([held_out, reference, held_out - reference])
    for name, (score, low, high) in zip(names, intervals(rows, samples, seed, FORECAST_LEVEL, resamples), strict=True):
        out[name] = {"score": score, "low": low, "high": high}
    return out


def spearman_units(cosines: npt.ArrayLike, gold: npt.ArrayLike, ranks: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per-pair terms whose mean is each row's Spearman rho: ``z(rank cosine) * z(rank gold)``, ranks of all
    pairs standardized with the population deviation (a constant row gives zeros); ``ranks=False``: the
    values themselves, whose terms average to Pearson's r.

    This puts a pair tuning in the per-unit form `select` takes: the mean over all pairs is Spearman's
    rho exactly; over a subset it is the linear estimate of it with the ranks of all pairs.
    """
    from .evaluate import rankdata

    def standardized(values: np.ndarray):
        ranked = rankdata(values) if ranks else np.asarray(values, np.float64)
        spread = ranked.std()
        return (ranked - ranked.mean()) / spread if spread > 0 else np.zeros_like(ranked)

    gold_z = standardized(np.asarray(gold, np.float64))
    cosines = np.atleast_2d(np.asarray(cosines, np.float64))
    return np.stack([standardized(row) * gold_z for row in cosines]), gold_z


__all__ = [
    "check_tolerance",
    "rule_choice",
    "BLOCK",
    "FOLDS",
    "FORECAST_LEVEL",
    "RULES",
    "Pick",
    "Resamples",
    "Selection",
    "forecast",
    "intervals",
    "select",
    "spearman_units",
]
