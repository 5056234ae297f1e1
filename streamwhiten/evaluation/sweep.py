"""The retrieval sweep: beta, gamma, k and the storage for search, chosen under a byte budget.

Every setting ``(beta, gamma, k)`` of the grid (from the saved statistics, as ``tune`` makes them) is
stored each way asked for (float32, float16, int8, sign bits, sign bits re-ranked), searched exactly
(`retrieval`: cosine, ties to the lower corpus row, excluded pairs dropped) and scored on the qrels.
Three maps are always in the grid: the **raw** vectors (the identity map ``y = x``), the **rotation**
``y = x U`` (beta = gamma = 0, k = d: the raw cosines, other sign bits and int8 ranges) and **plain
centring** (beta = 1, gamma = 0, k = d). Each row's difference from raw float32 gets a paired bootstrap
interval, and its retention is its score over raw float32's.

**Bytes per vector** are what a search reads for each corpus vector: ``4k``, ``2k``, ``k``, ``ceil(k / 8)``,
and for bits re-ranked the bits plus the vectors re-ranked (``+ 4k`` or ``+ k``). The **frontier** is the
rows no other beats at fewer or equal bytes; ``argmax`` takes the best score within ``max_bytes``
(``tolerance`` > 0: the fewest bytes within that many points of it), ties to fewer bytes, the smaller k,
the grid's order; the default rule starts from the reference (`reference_index`, see `select`).

**Cost.** One pass over the corpus for the raw reference and the bits, then passes for the rest
(`sweep_passes`), as many as it takes to hold at most `TOP_LIST_BYTES` of top lists and queries: about
``n x (b x d^2 + s x m x q x k)`` multiply-adds for ``b`` betas, ``s`` settings and ``m`` stored forms (the
bits of a ``(beta, k)`` once for every gamma, by popcount). **Memory** does not grow with the corpus rows.

**Under a budget** a setting is searched only in the storages that fit it, and every code family of
`streamwhiten.codes` that fits is a candidate too (`code_candidates`, two more passes), its row named by
the code (``storage`` ``eigen-24B``, ``dtype`` ``eigen``, ``code`` its record). A code is never the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any

import numpy as np

from .. import params
from ..codes import TUNE_CODES, smallest_sample
from ..core.model import WhiteningModel
from ..core.quantize import DEFAULT_INT8_CLIP, Quantization
from ..engine._threads import resolve_threads
from ..errors import BadInputError
from ..options import RetrievalOptions
from ..params import check
from ..progress import phase
from ..storage import Storage
from .code_candidates import (
    SAMPLE_ROWS,
    SAMPLE_SEED,
    code_record,
    fitting_codes,
    search_codes,
    smallest_bytes,
    split_families,
    train_codes,
    unit_statistics,
)
from .retrieval import (
    BOOTSTRAP_LEVEL,
    BOOTSTRAP_SAMPLES,
    BOOTSTRAP_SEED,
    DEPTH,
    METRICS,
    BootstrapInfo,
    RetrievalTask,
    SearchSetting,
    TaskInfo,
    mean_metrics,
    open_task,
    plain,
    query_metrics,
    retrieval_options,
)
from .search import Reranking, SearchJob, SearchResult
from .select import FOLDS, RULES, Resamples, Rule, Selection, check_tolerance, rule_choice
from .self_matches import SelfMatches, find_self_matches
from .sweep_passes import (
    IDENTITY,
    Reading,
    Rotation,
    Use,
    query_units,
    rotation_for,
    rotation_key,
    run_pass,
    scaling_for,
    stored,
)
from .tune import KChoice, decompose, describe_stored, json_rows, make_grid, vectors_of

#: Resampled means held at once by `bootstrap_differences` (512 MiB of doubles).
RESAMPLED_VALUES = 1 << 26

#: The storages swept by default (``binary+rescore``: bits whose top ``rescore`` are re-ranked).
STORAGES = ("float32", "float16", "int8", "binary", "binary+rescore")
#: The candidates a bit search re-ranks by default: as many as the evaluation keeps.
DEFAULT_RESCORE = DEPTH
#: Bytes of top lists (rows and scores of every query) and of the queries they are for that one pass over
#: the corpus holds: the settings are cut into passes that fit.
TOP_LIST_BYTES = 48 << 20
#: The metric chosen by, by default.
DEFAULT_METRIC = "ndcg@10"


@dataclass(frozen=True)
class Candidate:
    """One map of the grid: ``(beta, gamma, k)`` (``k_label``: as the grid named k) and its ``vectors``: ``raw``
    (the identity map, ``basis`` ``"identity"``), ``rotated``, ``centred`` or ``whitened`` (`vectors_of`)."""

    beta: float
    gamma: float
    k: int
    k_label: str
    vectors: str
    basis: str = "eigen"

    @property
    def bits_key(self) -> tuple:
        """What its sign bits depend on (not gamma: a sign does not change with the scaling)."""
        return (self.beta, self.k, self.basis)


@dataclass(frozen=True)
class SweepRow:
    """One map stored one way, or a code of the raw unit vectors (``code``: `code_record`), and its scores (x100,
    each of `METRICS`): a row of `RetrievalTuneResult`'s table. ``retention``: the chosen metric over raw float32's
    (%, None where raw scores 0); ``difference``, ``low``, ``high``: against raw float32, the paired interval."""

    beta: float
    gamma: float
    k: int
    k_label: str
    vectors: str
    storage: str
    dtype: str
    rescore: int
    rescore_dtype: str | None
    bytes_per_vector: int
    scores: dict[str, float]
    retention: float | None
    difference: float
    low: float | None
    high: float | None
    code: dict[str, Any] | None = None

    def score(self, metric: str) -> float:
        """The score of ``metric``, a missing or NaN one as the worst (-inf)."""
        value = self.scores[metric]
        return -math.inf if value is None or math.isnan(value) else float(value)

    def to_json(self) -> dict[str, Any]:
        """The row as plain JSON: the setting, storage, the code's record if any, scores, retention, interval."""
        out = {item.name: getattr(self, item.name) for item in fields(self)[:10]}  # up to bytes_per_vector
        out.update({} if self.code is None else {"code": self.code}, **self.scores)
        return dict(out, retention=self.retention, difference=self.difference, low=self.low, high=self.high)


@dataclass(frozen=True)
class SweepGrid:
    """What a retrieval sweep tries and how it chooses, checked when made (see the module docstring).

    Parameters
    ----------
    betas, gammas, ks, variances : sequence, optional
        The grid, as ``tune``'s (None: its default; empty: none). The sweep refuses a k above the width.
    eps : float, optional
        The regulariser of every setting (default: the model's).
    dtypes : sequence of str, or str, optional
        Names of `STORAGES` and code families of `CODES`, or one comma-separated string (default: every
        storage, and under a budget each code of `TUNE_CODES` that trains on the corpus's sample, faiss's
        where faiss is installed).
    rescore, rescore_dtype, int8_clip
        ``binary+rescore`` re-ranks its top ``rescore`` (default 100) with ``rescore_dtype`` vectors; the
        int8 codes' span in standard deviations.
    metric : str
        One of `METRICS`: what the choice maximises.
    max_bytes : int, optional
        The budget of bytes per corpus vector (None: none).
    tolerance : float
        Choose the fewest bytes surely within this many points (x100) of the reference (``argmax``: of the best).
    select : str
        One of `RULES`: ``maxt`` (default, see `select`) or ``argmax`` (the best score: the winner's curse).
    folds : int
        Folds of the queries for the cross-validated forecast of the choice.
    code_sample, code_seed : int
        Corpus rows (at most) the codes that learn from data train on, and the seed that draws them.
    """

    betas: tuple[float, ...] | None = None
    gammas: tuple[float, ...] | None = None
    ks: tuple[int, ...] | None = None
    variances: tuple[float, ...] | None = None
    eps: float | None = None
    dtypes: tuple[str, ...] | None = None
    rescore: int = DEFAULT_RESCORE
    rescore_dtype: str = params.default("rescore_dtype")
    int8_clip: float = params.default("int8_clip")
    metric: str = DEFAULT_METRIC
    max_bytes: int | None = params.default("max_bytes")
    tolerance: float = 0.0
    select: str = "maxt"
    folds: int = FOLDS
    code_sample: int = SAMPLE_ROWS
    code_seed: int = SAMPLE_SEED

    def __post_init__(self):
        for name in ("betas", "gammas", "ks", "variances", "dtypes"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = value.split(",") if name == "dtypes" else [value]
            if value is not None:
                object.__setattr__(self, name, tuple(value))
        if self.metric not in METRICS:
            raise BadInputError(f"metric must be one of {', '.join(METRICS)} for retrieval, got {self.metric!r}")
        check("max_bytes", self.max_bytes)
        object.__setattr__(self, "tolerance", check_tolerance(self.tolerance))
        if self.select not in RULES:
            raise BadInputError(f"select must be one of {', '.join(RULES)}, got {self.select!r}", param="select")
        if isinstance(self.folds, bool) or not isinstance(self.folds, int) or self.folds < 2:
            raise BadInputError(f"folds must be an integer of at least 2, got {self.folds!r}", param="folds")
        for name, values in (
            ("beta", self.betas),
            ("gamma", self.gammas),
            ("n_components", self.ks),
            ("variance", self.variances),
        ):
            for value in values or ():
                check(name, value)
        if self.eps is not None:
            check("eps", self.eps)
        for name, least in (("code_sample", 1), ("code_seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise BadInputError(f"{name} must be a whole number of at least {least}, got {value!r}")
        self.storages()  # checks the names, rescore, rescore_dtype and int8_clip

    def storages(self) -> list[Storage]:
        """The `STORAGES` named in ``dtypes`` (default: all) as `Storage` records; none where only codes are named."""
        named = self._named()
        if named is not None and named[1] and not named[0]:
            return []
        names = list(STORAGES if named is None else named[0])
        if not names:
            raise BadInputError(f"give at least one storage to sweep: {', '.join(STORAGES)}")
        clip = DEFAULT_INT8_CLIP if self.int8_clip is None else self.int8_clip
        check("int8_clip", clip)
        check("rescore_dtype", self.rescore_dtype)
        out = []
        for name in names:
            if name not in STORAGES:
                raise BadInputError(f"dtypes: {name!r} is not one of {', '.join(STORAGES)} or a code", param="dtypes")
            if name == "binary+rescore":
                check("rescore", self.rescore)
                if not self.rescore:
                    raise BadInputError(
                        "binary+rescore needs rescore=N of at least 1 (the candidates re-ranked)", param="rescore"
                    )
                out.append(Storage("binary", self.rescore, self.rescore_dtype, clip))
            else:
                out.append(Storage(name, int8_clip=clip))
        return out

    def _named(self) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """The plain storages and the code families ``dtypes`` names (None: the defaults)."""
        return None if self.dtypes is None else split_families(self.dtypes)

    def codes(self) -> tuple[str, ...]:
        """The code families swept under a budget: ``dtypes``' or every `TUNE_CODES` (faiss's where installed)."""
        named = self._named()
        if named is not None:
            return named[1]
        from ..codes.faiss_codes import faiss_available

        return TUNE_CODES if faiss_available() else tuple(name for name in TUNE_CODES if not name.startswith("faiss-"))


def retrieval_grid(model: WhiteningModel, grid: SweepGrid, raw_ks: Sequence[int] = ()) -> tuple[list[Candidate], dict]:
    """``(candidates, bases)``: the maps of ``grid`` (as ``tune``'s, each ``(beta, gamma, k)`` once) with the
    raw (identity), rotation and centring maps, and the model re-finalized at each beta (with ``grid.eps``);
    with the rotation truncated to each k of ``raw_ks`` (the reference of a budget too small for raw bits)."""
    d = model.n_features
    betas, gammas, choices = make_grid(d, grid.betas, grid.gammas, grid.ks, grid.variances)
    wanted = [(beta, gamma, choice) for beta in betas for gamma in gammas for choice in choices]
    bases: dict = {}
    out: dict = {}
    added = [(0.0, 0.0, None), (1.0, 0.0, None)] + [(0.0, 0.0, KChoice(n_components=int(k))) for k in raw_ks]
    for beta, gamma, choice in wanted + added:
        if beta not in bases:
            bases[beta] = decompose(model, beta, grid.eps)
        k = d if choice is None else choice.resolve(bases[beta].eigvals)
        if (beta, gamma, k) not in out:
            label = str(k) if choice is None else choice.label
            out[(beta, gamma, k)] = Candidate(beta, gamma, k, label, vectors_of(beta, gamma, k, d))
    out[("identity",)] = Candidate(0.0, 0.0, d, str(d), "raw", "identity")
    return list(out.values()), bases


def _map_model(bases: dict, identity: bool, beta: float, gamma: float, k: int) -> WhiteningModel:
    """The map of a setting (re-finalized from its beta's eigendecomposition), or the identity."""
    return (
        bases[0.0].with_params(basis="identity") if identity else bases[beta].with_params(gamma=gamma, n_components=k)
    )


def _groups(items: list, cost: Callable, budget: int) -> list[list]:
    """``items`` cut in order into groups whose summed ``cost`` stays within ``budget`` (one at least)."""
    groups: list[list] = [[]]
    used = 0
    for item in items:
        size = cost(item)
        if groups[-1] and used + size > budget:
            groups.append([])
            used = 0
        groups[-1].append(item)
        used += size
    return [group for group in groups if group]


def sweep_rows(
    task: RetrievalTask,
    candidates: list[Candidate],
    bases: dict,
    storages: list[Storage],
    *,
    options: RetrievalOptions | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_bytes: int | None = None,
    keep: Callable[[np.ndarray], Any] | None = None,
) -> tuple[SearchResult, dict]:
    """The raw float32 reference's top lists (`DEPTH` rows and cosines a query) and ``keep(top rows)`` of every
    ``(candidate, storage)`` within ``max_bytes``, keyed by it; ``keep`` (default: the rows) is called as a
    pass makes them, so only one pass's lists are held. The passes and their cost: see the module docstring."""
    options = options or RetrievalOptions()
    keep = keep or (lambda top: top)
    reading = Reading(task.corpus, task.corpus_label, options.block_rows, resolve_threads(options.threads))

    def fits(candidate: Candidate, storage: Storage) -> bool:
        return max_bytes is None or storage.bytes_per_vector(candidate.k) <= max_bytes

    candidates = [c for c in candidates if any(fits(c, storage) for storage in storages)]
    plan = _Plan(task, bases, fits, DEPTH, storages)
    first, later = _passes(plan, candidates, storages)
    n_rows = task.n_corpus
    done, total = [0], n_rows * (len(first) + len(later))

    def step(rows_done: int, _: int):
        if progress is not None:
            progress(done[0] + rows_done, total)

    reference, bits = None, {}
    for group in first:  # the raw reference and the bits of each (beta, k), for every gamma
        found = _search_first(plan, group, reading, step)
        reference = found.pop(None, reference)
        bits.update(found)
        done[0] += n_rows
    out: dict = {}
    for group in later:
        out.update(_search_group(plan, group, bits, reading, step, keep))
        done[0] += n_rows
    for candidate in candidates:
        for storage in storages:
            if storage.dtype == "binary" and not storage.rescore and fits(candidate, storage):
                out[(candidate, storage)] = keep(np.ascontiguousarray(bits[candidate.bits_key][:, :DEPTH]))
    assert reference is not None  # the first pass always searches it
    return reference, out


class _Plan:
    """What the passes of `sweep_rows` share: the task, the maps' bases, the rotations (one per beta, and the
    identity's), the queries as each setting sees them, the budget's test, the depth and the storages searched."""

    def __init__(self, task: Any, bases: dict, fits: Callable[[Any, Any], bool], depth: int, storages: list[Storage]):
        self.task, self.bases, self.fits, self.depth = task, bases, fits, depth
        self.floats = [storage for storage in storages if storage.dtype != "binary"]
        self.reranks = [storage for storage in storages if storage.rescore]
        self.rotations: dict[tuple, Rotation] = {IDENTITY: Rotation()}
        for beta, base in bases.items():
            self.rotations[rotation_key(beta, False)] = rotation_for(base)
        self.queries = query_units(task.vectors, self.rotations)

    def use(self, candidate: Candidate) -> Use:
        """An empty use of ``candidate``'s unit rows (its rotation, scaling and k)."""
        identity = candidate.basis == "identity"
        base = None if identity else self.bases[candidate.beta]
        return Use(rotation_key(candidate.beta, identity), scaling_for(base, candidate.gamma, candidate.k), candidate.k)

    def reference(self) -> Use:
        """The raw vectors stored as float32: the reference's search."""
        n_features = self.task.n_features
        quantization = SearchSetting.make("raw", None, raw=True, n_features=n_features).quantization
        use = Use(IDENTITY, None, n_features)
        unit = self.queries(IDENTITY, None, n_features)
        use.jobs.append(SearchJob(unit, self.depth, "ip", partial(stored, quantization), self.task.excluded))
        return use

    def bits(self, key: tuple, depth: int) -> Use:
        """The sign bits of the settings of ``key`` (`Candidate.bits_key`), searched to ``depth``."""
        beta, k, basis = key
        use = Use(rotation_key(beta, basis == "identity"), None, k)
        quantization = Quantization("binary", k, normalized=True)
        queries = np.packbits(self.queries(use.rotation, None, k) > 0, axis=1)
        use.jobs.append(SearchJob(queries, depth, "hamming", partial(stored, quantization), self.task.excluded))
        return use


def _passes(plan: _Plan, candidates: list[Candidate], storages: list[Storage]) -> tuple[list[list], list[list]]:
    """The passes of `sweep_rows`, each holding at most `TOP_LIST_BYTES` of top lists and queries: the first
    ones search the raw reference (key None) and the bits of each `Candidate.bits_key`, each with its depth;
    the later ones the float, float16 and int8 searches and the re-rankings of the bits that fit."""
    task, depth, fits, floats, reranks = plan.task, plan.depth, plan.fits, plan.floats, plan.reranks
    bit_depth = max([depth] + [storage.rescore for storage in storages])
    first: list[tuple[Any, int]] = [(None, depth)]
    if any(storage.dtype == "binary" for storage in storages):
        wanted = [c for c in candidates if any(fits(c, s) for s in storages if s.dtype == "binary")]
        first += [(key, bit_depth) for key in dict.fromkeys(c.bits_key for c in wanted)]
    query_cost = task.vectors.shape[0] * 8
    list_bytes = task.vectors.shape[0] * 16  # a top list's rows (int64) and scores (float64 or int64), per slot
    first_groups = _groups(first, lambda item: list_bytes * item[1] + query_cost * task.n_features, TOP_LIST_BYTES)
    floated = [c for c in candidates if any(fits(c, storage) for storage in floats + reranks)]
    later = _groups(
        floated,
        lambda c: (
            query_cost * c.k
            + list_bytes * depth * sum(fits(c, s) for s in floats)
            + 2 * list_bytes * sum(s.rescore for s in reranks if fits(c, s))
        ),
        TOP_LIST_BYTES,
    )
    return first_groups, later


def _search_first(plan: _Plan, group: list[tuple[Any, int]], reading: Reading, progress: Callable) -> dict:
    """One first pass (see `_passes`): ``{None: the raw reference's SearchResult, bits key: its top rows}``."""
    uses = [plan.reference() if key is None else plan.bits(key, searched) for key, searched in group]
    run_pass(reading, plan.rotations, uses, progress)
    jobs = {key: use.jobs[0] for (key, _), use in zip(group, uses, strict=True)}
    out: dict = {key: job._state["rows"] for key, job in jobs.items()}
    if None in jobs:  # the raw reference: its cosines show the queries that are corpus rows
        rows, values = (np.ascontiguousarray(jobs[None]._state[name][:, : plan.depth]) for name in ("rows", "values"))
        out[None] = SearchResult(rows, values, jobs[None].metric)
    return out  # the pass's scores and queries go with its uses: only the top rows are kept


def _search_group(
    plan: _Plan, group: list[Candidate], bits: dict, reading: Reading, progress: Callable, keep: Callable
) -> dict:
    """One pass for the float, float16 and int8 searches and the re-rankings of ``group`` that fit; the kept lists."""
    depth, fits = plan.depth, plan.fits
    made = []
    for candidate in group:
        use = plan.use(candidate)
        unit_queries = plan.queries(use.rotation, use.weights, use.k)
        model = _map_model(plan.bases, candidate.basis == "identity", candidate.beta, candidate.gamma, candidate.k)
        searched = [storage for storage in plan.floats if fits(candidate, storage)]
        for storage in searched:
            quantization = SearchSetting.make("s", model, storage=storage).quantization
            use.jobs.append(SearchJob(unit_queries, depth, "ip", partial(stored, quantization), plan.task.excluded))
        again = [storage for storage in plan.reranks if fits(candidate, storage)]
        for storage in again:
            rescored = SearchSetting.make("r", model, storage=storage).rescore_quantization
            assert rescored is not None  # made with the storage's rescoring
            top = bits[candidate.bits_key][:, : storage.rescore]
            use.reranks.append((rescored, Reranking(unit_queries, top, storage.rescore)))
        made.append((candidate, use, searched, again))
    run_pass(reading, plan.rotations, [use for _, use, _, _ in made], progress)
    out = {}
    for candidate, use, searched, again in made:
        for storage, job in zip(searched, use.jobs, strict=True):
            out[(candidate, storage)] = keep(np.ascontiguousarray(job._state["rows"][:, :depth]))
        for storage, (_, reranking) in zip(again, use.reranks, strict=True):
            top = bits[candidate.bits_key]
            rows = np.concatenate([reranking.result().rows, top[:, storage.rescore :]], axis=1)
            out[(candidate, storage)] = keep(np.ascontiguousarray(rows[:, :depth]))
    return out


# ------------------------------------------------------------------------------------- scores and choice


def bootstrap_differences(
    reference: np.ndarray,
    others: list,
    samples: int,
    seed: int,
    level: float = BOOTSTRAP_LEVEL,
    resamples: Resamples | None = None,
):
    """``(difference, low, high)`` x100 of each of ``others`` (per-query scores) minus ``reference``: the paired
    bootstrap of `paired_bootstrap` (the same resamples, ``resamples`` when given), a block of rows at a time."""
    reference = np.asarray(reference, np.float64)
    n = reference.shape[0]
    diffs = np.asarray(others, np.float64).reshape(len(others), n) - reference
    differences = 100.0 * diffs.mean(axis=1) if n else np.full(len(others), math.nan)
    if samples <= 0 or not n or not len(others):
        return [(float(difference), None, None) for difference in differences]
    if resamples is None or not resamples.are(n, samples, seed):
        resamples = Resamples(n, samples, seed)
    tails = [100.0 * (1.0 - level) / 2.0, 100.0 * (1.0 + level) / 2.0]
    rows = max(1, RESAMPLED_VALUES // samples)  # rows x resamples of means held at once
    low, high = np.empty(len(others)), np.empty(len(others))
    for start in range(0, len(others), rows):
        means = resamples.means(diffs[start : start + rows])
        low[start : start + rows], high[start : start + rows] = 100.0 * np.percentile(means, tails, axis=1)
    return [(float(d), float(lo), float(hi)) for d, lo, hi in zip(differences, low, high, strict=True)]


def family_of(row: SweepRow) -> str:
    """The storage family of a row: its code (``eigen``, ``faiss-pq``, ...) or storage (``binary+rescore100``)."""
    return row.dtype if row.code else row.storage


def best_per_family(table: list[SweepRow], metric: str, max_bytes: int | None = None) -> list[SweepRow]:
    """The best row of each storage family (`family_of`) within ``max_bytes`` (ties to fewer bytes), best first."""
    within = [row for row in table if max_bytes is None or row.bytes_per_vector <= max_bytes]
    best: dict = {}
    for row in sorted(within, key=lambda row: (-row.score(metric), row.bytes_per_vector)):  # stable: ties in order
        best.setdefault(family_of(row), row)
    return list(best.values())


def frontier(table: list[SweepRow], metric: str) -> list[SweepRow]:
    """The rows no other row beats at fewer or equal bytes, by bytes ascending (each better than the last)."""
    out, best = [], -math.inf
    for row in sorted(table, key=lambda row: (row.bytes_per_vector, -row.score(metric), row.k)):  # ties in order
        if row.score(metric) > best:
            out.append(row)
            best = row.score(metric)
    return out


def choose_within(table: list[SweepRow], metric: str, max_bytes: int | None = None, tolerance: float = 0.0) -> SweepRow:
    """The best row within ``max_bytes`` bytes per vector (see the module docstring)."""
    eligible = [table[i] for i in _within(table, max_bytes)]
    top = max(row.score(metric) for row in eligible)
    if top == -math.inf:
        raise BadInputError(f"no setting within the budget gives a finite {metric}")
    near = [row for row in eligible if row.score(metric) >= top - tolerance]
    return min(near, key=lambda row: (row.bytes_per_vector, -row.score(metric), row.k))  # ties: the first


def reference_k(n_features: int, max_bytes: int | None) -> int | None:
    """The k of the rotation's sign bits that fill ``max_bytes`` when all ``d`` bits do not fit, else None."""
    if max_bytes is None or max_bytes >= -(-n_features // 8):
        return None
    return max(1, min(n_features, 8 * int(max_bytes)))


def reference_index(table: list[SweepRow], n_features: int, max_bytes: int | None = None) -> int:
    """The row of the reference within ``max_bytes``: the raw vectors (``vectors`` "raw", not re-ranked) in the
    storage with the most bytes that fits (float32, float16, int8, then sign bits, ``ceil(d / 8)`` bytes); when
    not even those fit, the rotation ``y = x U`` (beta = gamma = 0) truncated to the k that fits."""
    fits = [
        i
        for i, row in enumerate(table)
        if not row.rescore and not row.code and (max_bytes is None or row.bytes_per_vector <= max_bytes)
    ]
    raw = [i for i in fits if table[i].vectors == "raw"]  # all at k = d
    rotated = [i for i in fits if table[i].beta == 0 and table[i].gamma == 0]
    if not raw and not rotated:
        raise _no_reference(max_bytes)
    return min(raw or rotated, key=lambda i: (-table[i].bytes_per_vector, -table[i].k, i))


def _within(table: list[SweepRow], max_bytes: int | None) -> list[int]:
    eligible = [i for i, row in enumerate(table) if max_bytes is None or row.bytes_per_vector <= max_bytes]
    if not eligible:
        smallest = min(table, key=lambda row: row.bytes_per_vector)
        raise _nothing_fits(max_bytes, smallest.bytes_per_vector, smallest.k, smallest.storage)
    return eligible


def choose_generalising(
    table: list[SweepRow],
    per_query: np.ndarray,
    metric: str,
    n_features: int,
    grid: SweepGrid,
    *,
    resamples: Resamples | None = None,
) -> tuple[int, Selection]:
    """``(row, record)``: the row ``grid.select`` chooses within ``grid.max_bytes`` against the reference
    (`reference_index`) from the per-query scores of ``metric`` (a row of ``per_query`` per row of ``table``),
    and the record: the reference, how many beat it, the ``grid.folds``-fold forecast (see `select`).
    ``argmax``: `choose_within`'s row, no reference, no forecast. ``resamples``: the queries' resamples if made."""
    max_bytes, tolerance, rule, folds = grid.max_bytes, grid.tolerance, grid.select, grid.folds
    samples, seed = (BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED) if resamples is None else (resamples.samples, resamples.seed)
    eligible = _within(table, max_bytes)
    if rule == "argmax":  # the old choice exactly (ties to fewer bytes, the tolerance from the best): no reference
        chosen = choose_within([table[i] for i in eligible], metric, None, tolerance)
        index = next(i for i in eligible if table[i] is chosen)
        return index, Selection("argmax", tolerance)
    reference = reference_index(table, n_features, max_bytes)
    others = [i for i in eligible if i != reference]
    per_query = np.asarray(per_query, dtype=np.float64)
    if resamples is None or not resamples.are(per_query.shape[1], samples, seed):
        resamples = Resamples(per_query.shape[1], samples, seed)
    costs, reference_cost = tuple(table[i].bytes_per_vector for i in others), table[reference].bytes_per_vector
    chooser = Rule(cost=costs, reference_cost=reference_cost, tolerance=tolerance, samples=samples, seed=seed)
    described = _pick(table[reference].to_json(), ("beta", "gamma", "k", "vectors", "storage", "bytes_per_vector"))
    return rule_choice(per_query, reference, others, chooser, folds, resamples, described)


@dataclass
class RetrievalTuneResult:
    """The scored sweep: ``table`` (every setting and storage), the raw float32 reference (``raw``), the
    ``frontier``, the row the rule chose (``best``; the highest score is `highest`) and what it was chosen by."""

    table: list[SweepRow]
    best: SweepRow
    raw: dict
    frontier: list[SweepRow]
    metric: str
    max_bytes: int | None
    tolerance: float
    task: TaskInfo
    bootstrap: BootstrapInfo
    bases: dict = field(repr=False)
    storages: dict = field(repr=False)
    selection: Selection | None = None
    per_query: np.ndarray | None = field(default=None, repr=False)
    codecs: dict = field(default_factory=dict, repr=False)
    #: The queries whose nearest corpus row is the query itself, not judged relevant (`self_matches`).
    self_matches: SelfMatches | None = None

    def model_for(self, row: SweepRow) -> WhiteningModel:
        """The model of one row: its map (sharing its beta's eigendecomposition; raw: the identity) and storage;
        a code's row: the identity map with its codec (`codec_for`, of the raw unit vectors) as its storage."""
        model = _map_model(self.bases, row.vectors == "raw" or bool(row.code), row.beta, row.gamma, row.k)
        if row.code:
            from ..codes.storage import with_codec  # the raw unit vectors coded: the codec is the storage

            rows, seed = int(row.code.get("sample_rows", 0)), int(row.code.get("sample_seed", 0))
            return with_codec(model, self.codec_for(row), row.code["family"], sample_rows=rows, sample_seed=seed)
        return replace(model, storage=self.storages[row.storage])

    def codec_for(self, row: SweepRow):
        """The trained `Codec` of a code's row (None for another row)."""
        return self.codecs.get(row.storage) if row.code else None

    def chosen_model(self) -> WhiteningModel:
        return self.model_for(self.best)

    @property
    def highest(self) -> SweepRow:
        """The row scoring highest on these queries within the budget (ties to fewer bytes), else `best`."""
        top = choose_within(self.table, self.metric, self.max_bytes)
        return self.best if not top.score(self.metric) > self.best.score(self.metric) else top  # a tie: the choice

    def tuned(self) -> tuple[WhiteningModel, dict]:
        """The chosen model (its record in ``info["tuned"]``) and ``tune``'s summary (``chosen``: its setting)."""
        chosen, best = self.chosen_model(), self.best
        described = dict(describe_stored(chosen), rescore=best.rescore, rescore_dtype=best.rescore_dtype)
        if best.code:  # the raw vectors coded: what is stored is the code, not the map's floats
            described.update(dtype=best.dtype, bytes_per_vector=best.bytes_per_vector, code=best.code)
        summary = dict(self.to_json(), chosen=described, test=None)
        return replace(chosen, info=dict(chosen.info, tuned=self._record(described))), summary

    def _record(self, described: dict) -> dict:
        """The record a tuned model keeps: the setting, validation, choice, frontier and each family's best."""
        keep = ("beta", "gamma", "k", "storage", "bytes_per_vector", self.metric, *_VERSUS_RAW)
        task, best = self.task, self.best.to_json()
        return {
            "mode": "retrieval",
            "metric": self.metric,
            "max_bytes": self.max_bytes,
            "tolerance": self.tolerance,
            "setting": described,
            "validation": {
                **{key: plain(getattr(task, key)) for key in ("queries", "corpus", "qrels", "n_queries")},
                "raw": {key: self.raw[key] for key in (*METRICS, "bytes_per_vector")},
                "chosen": _pick(best, (*METRICS, *_VERSUS_RAW)),
            },
            "selection": plain(self.selection),
            "frontier": [_pick(row.to_json(), keep) for row in self.frontier],
            "families": [
                dict(_pick(row.to_json(), keep), family=family_of(row))
                for row in best_per_family(self.table, self.metric, self.max_bytes)
            ],
            "grid_size": len(self.table),
        }

    def to_json(self) -> dict[str, Any]:
        """The sweep as plain JSON (``tune --json``'s core): ``best`` is the rule's row, ``highest`` the top score's."""
        as_json = json_rows(self.table)
        return dict(
            plain(self.task),
            mode="retrieval",
            metric=self.metric,
            max_bytes=self.max_bytes,
            tolerance=self.tolerance,
            raw=self.raw,
            best=as_json(self.best),
            highest=as_json(self.highest),
            frontier=[as_json(row) for row in self.frontier],
            table=[as_json(row) for row in self.table],
            bootstrap=plain(self.bootstrap),
            selection=plain(self.selection),
            self_matches=None if self.self_matches is None else self.self_matches.to_json(),
        )


#: What a row says of itself against raw float32: its retention and the interval of its difference.
_VERSUS_RAW = ("retention", "difference", "low", "high")


def _pick(row: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    return {key: row[key] for key in keys}


def sweep(
    model: WhiteningModel,
    queries: Any,
    corpus: Any,
    qrels: Any,
    *,
    grid: SweepGrid | None = None,
    options: RetrievalOptions | None = None,
    progress: Callable[[int, int], None] | None = None,
    budgets: Any = None,
) -> RetrievalTuneResult:
    """Score every setting of the grid in every storage of ``grid.dtypes`` on the retrieval task, and choose.

    Parameters
    ----------
    model : WhiteningModel
        Only its saved statistics are used for the settings, never the fitting data.
    queries, corpus, qrels
        The retrieval task, as [`evaluate_retrieval`][streamwhiten.evaluation.retrieval.evaluate_retrieval] takes it.
    grid : SweepGrid, optional
        What is tried (settings and storages) and how the choice is made (default: `SweepGrid`'s).
    options : RetrievalOptions, optional
        The exclude file, id columns, bootstrap, blocks and threads, as an evaluation takes them.
    progress : callable, optional
        ``progress(rows_done, n_rows)`` over all the passes.
    budgets : sequence of int or None, optional
        Budgets whose references the grid must hold (default: ``grid.max_bytes``), to choose under each later.
    """
    grid = SweepGrid() if grid is None else grid
    if not isinstance(grid, SweepGrid):
        raise BadInputError(f"grid must be a SweepGrid, got {type(grid).__name__}")
    options = retrieval_options(options)
    plan = _sweep_plan(model, grid, budgets)
    with open_task(queries, corpus, qrels, model=model, options=options) as task:
        plan = replace(plan, code_sizes=_trainable(plan.code_sizes, grid, task.n_corpus))
        keep = partial(query_metrics, query_rows=task.query_rows, qrels=task.qrels)
        maps = (plan.candidates, plan.bases, plan.storages)
        searched = f"search up to {len(plan.candidates)} maps in {len(plan.storages)} storages"
        with phase(progress, f"{searched} over {task.n_corpus:,} rows"):
            reference, rows = sweep_rows(
                task, *maps, options=options, progress=progress, max_bytes=plan.limit, keep=keep
            )
        codecs = _sweep_codes(task, grid, plan.code_sizes, options, progress)
    with phase(progress, f"score the settings and choose ({grid.select} rule)", None):
        return _scored(task, plan, grid, options, reference, rows, codecs)


@dataclass(frozen=True)
class _SweepPlan:
    """What a sweep searches: maps, bases, storages, ``{code: [bytes]}``, the largest budget (``limit``)."""

    candidates: list[Candidate]
    bases: dict
    storages: list[Storage]
    code_sizes: dict[str, list[int]]
    limit: int | None
    n_features: int


def _sweep_plan(model: WhiteningModel, grid: SweepGrid, budgets: Any) -> _SweepPlan:
    """The maps (with the references of ``budgets``, default ``grid.max_bytes``), storages and codes, checked."""
    storages = grid.storages()
    wanted = [grid.max_bytes] if budgets is None else list(budgets)
    raw_ks = [k for k in (reference_k(model.n_features, budget) for budget in wanted) if k is not None]
    needs_reference = budgets is not None or grid.select != "argmax"  # argmax alone: the grid of before the rule
    if not needs_reference or not any(storage.dtype == "binary" and not storage.rescore for storage in storages):
        raw_ks = []  # a truncated rotation's bits are the reference of a small budget only when bits are swept
    candidates, bases = retrieval_grid(model, grid, raw_ks=tuple(dict.fromkeys(raw_ks)))
    limit = None if None in wanted else max(budget for budget in wanted if budget is not None)
    code_sizes = _checked_first(grid, model.n_features, candidates, storages, wanted, needs_reference)
    return _SweepPlan(candidates, bases, storages, code_sizes, limit, model.n_features)


def _sweep_codes(
    task: RetrievalTask,
    grid: SweepGrid,
    code_sizes: dict[str, list[int]],
    options: RetrievalOptions,
    progress: Callable[[int, int], None] | None,
) -> dict[str, tuple[str, Any, np.ndarray]]:
    """``{label: (family, codec, top rows)}``: the codes trained on the unit rows (one pass), then searched (one)."""
    if not code_sizes:
        return {}
    to_train = [(name, size) for name, sizes in code_sizes.items() for size in sizes]
    with phase(progress, f"read the corpus's statistics and a sample for {len(to_train)} codes"):
        mean, covariance, sample = unit_statistics(task, grid.code_sample, grid.code_seed, options.block_rows, progress)
    threads = resolve_threads(options.threads)
    with phase(progress, f"train {len(to_train)} codes on {sample.shape[0]:,} rows", "codes"):
        trained = train_codes(to_train, mean, covariance, sample, grid.code_seed, threads, progress=progress)
    codecs = {
        f"{name}-{codec.bytes_per_vector}B": (name, codec) for (name, _), codec in zip(to_train, trained, strict=True)
    }
    told = None if progress is None else lambda done: progress(done, task.n_corpus)
    with phase(progress, f"search {len(codecs)} codes over {task.n_corpus:,} rows"):
        searched = {label: codec for label, (_, codec) in codecs.items()}
        tops = search_codes(task, searched, DEPTH, options.block_rows, progress=told, threads=threads)
    return {label: (name, codec, tops[label]) for label, (name, codec) in codecs.items()}


#: The `SweepRow` fields up to ``bytes_per_vector``: the setting and how it is stored.
_Head = tuple[float, float, int, str, str, str, str, int, str | None, int]


def _head(candidate: Candidate, storage: Storage) -> _Head:
    """The `SweepRow` fields up to ``bytes_per_vector`` of a map stored one way."""
    c, rescore_dtype = candidate, storage.rescore_dtype if storage.rescore else None
    setting = (c.beta, c.gamma, c.k, c.k_label, c.vectors)
    return (*setting, storage.label, storage.dtype, storage.rescore, rescore_dtype, storage.bytes_per_vector(c.k))


def _scored(
    task: RetrievalTask,
    plan: _SweepPlan,
    grid: SweepGrid,
    options: RetrievalOptions,
    reference: SearchResult,
    rows: dict,
    codecs: dict[str, tuple[str, Any, np.ndarray]],
) -> RetrievalTuneResult:
    """The table of every map, storage and code against raw float32 (paired intervals), and the rule's choice."""
    metric, d = grid.metric, plan.n_features
    raw_each = query_metrics(reference.rows, task.query_rows, task.qrels)
    raw: dict[str, Any] = dict(mean_metrics(raw_each), dtype="float32", bytes_per_vector=4 * d)
    searched = [(c, s) for c in plan.candidates for s in plan.storages if (c, s) in rows]  # the rest: over the budget
    made: list[tuple[_Head, dict, dict | None]] = [(_head(c, s), rows[(c, s)], None) for c, s in searched]
    sample_rows = min(grid.code_sample, task.n_corpus)
    for label, (name, codec, top) in codecs.items():  # (head, per-query metrics, code record)
        coded: _Head = (0.0, 0.0, d, str(d), "raw", label, name, 0, None, int(codec.bytes_per_vector))
        record = code_record(codec, name, sample_rows, grid.code_seed)
        made.append((coded, query_metrics(top, task.query_rows, task.qrels), record))
    each = [per_query[metric] for _, per_query, _ in made]
    # one set of resamples of the queries for the intervals, the rule and its forecast
    resamples = Resamples(len(raw_each[metric]), options.bootstrap or BOOTSTRAP_SAMPLES, options.seed)
    differences = bootstrap_differences(raw_each[metric], each, options.bootstrap, options.seed, resamples=resamples)
    table = []
    for (head, per_query, code), (difference, low, high) in zip(made, differences, strict=True):
        scores = mean_metrics(per_query)
        retention = 100.0 * scores[metric] / raw[metric] if raw[metric] > 0 else None
        table.append(SweepRow(*head, scores, retention, difference, low, high, code))
    each_query = np.stack(each)
    index, selection = choose_generalising(table, each_query, metric, d, grid, resamples=resamples)
    return RetrievalTuneResult(
        table,
        table[index],
        raw,
        frontier(table, metric),
        metric,
        grid.max_bytes,
        grid.tolerance,
        task.describe(),
        BootstrapInfo(options.bootstrap, options.seed),
        plan.bases,
        {storage.label: storage for storage in plan.storages},
        selection,
        each_query,
        {label: codec for label, (_, codec, _) in codecs.items()},
        find_self_matches(task, reference.rows, reference.values, "float32"),
    )


def _nothing_fits(max_bytes: int | None, size: int, k: int, storage: str) -> BadInputError:
    """The error of a budget no setting fits, naming the smallest: its bytes, k and storage."""
    return BadInputError(
        f"no setting stores a vector in {max_bytes} bytes or fewer: the smallest takes {size} ({storage} at "
        f"k={k}); raise max_bytes or add smaller k to ks",
        param=("max_bytes", "ks"),
    )


def _checked_first(
    grid: SweepGrid,
    n_features: int,
    candidates: list[Candidate],
    storages: list[Storage],
    wanted: list,
    needs_reference: bool,
) -> dict[str, list[int]]:
    """``{code: [bytes to train at]}`` (`_code_sizes`) after the checks that need no pass: codes against the
    budgets, a budget nothing fits, codes with no budget, the reference within each budget (``needs_reference``)."""
    code_sizes = _code_sizes(grid, n_features, [budget for budget in wanted if budget is not None])
    pairs = [(storage.bytes_per_vector(c.k), c.k, storage.label) for c in candidates for storage in storages]
    if wanted and None not in wanted and not code_sizes and pairs and min(pairs)[0] > max(wanted):
        raise _nothing_fits(max(wanted), *min(pairs))
    if not storages and not code_sizes:
        raise BadInputError(
            "codes are swept under a byte budget only: give max_bytes, or a storage in dtypes",
            param=("max_bytes", "dtypes"),
        )
    for budget in wanted if needs_reference else ():  # a reference (`reference_index`) within each budget
        if not any(
            not storage.rescore
            and (budget is None or storage.bytes_per_vector(candidate.k) <= budget)
            and (candidate.vectors == "raw" or (candidate.beta == 0 and candidate.gamma == 0))
            for candidate in candidates
            for storage in storages
        ):
            raise _no_reference(budget)
    return code_sizes


def _no_reference(max_bytes: int | None) -> BadInputError:
    """The error of a budget under which no raw setting is swept to be the reference."""
    return BadInputError(
        f"no raw setting (the raw vectors, or beta=0, gamma=0) stores a vector in {max_bytes} bytes or fewer "
        "to be the reference: sweep binary (dtypes) or raise max_bytes",
        param=("dtypes", "max_bytes"),
    )


def _trainable(code_sizes: dict[str, list[int]], grid: SweepGrid, n_corpus: int) -> dict[str, list[int]]:
    """Those of ``code_sizes`` that train on the sample (`smallest_sample`): the others dropped, or refused if named."""
    sample_rows = min(grid.code_sample, n_corpus)
    short = [name for name in code_sizes if sample_rows < smallest_sample(name)]
    if short and grid.dtypes is not None:
        why = f"the corpus has {n_corpus}" if n_corpus < grid.code_sample else f"code_sample is {grid.code_sample}"
        raise BadInputError(
            f"the {short[0]} code trains on {smallest_sample(short[0])} sample rows or more, but {why}: "
            f"drop {', '.join(short)} from dtypes",
            param="dtypes",
        )
    return {name: sizes for name, sizes in code_sizes.items() if name not in short}


def _code_sizes(grid: SweepGrid, n_features: int, budgets: list[int]) -> dict[str, list[int]]:
    """``{code: [bytes]}``: each of ``grid.codes()`` at each budget it fits; an error where named ones fit none."""
    names = grid.codes()
    if not names or not budgets:
        return {}
    out: dict[str, list[int]] = {}
    for budget in sorted(set(budgets)):
        for name, size in fitting_codes(names, n_features, budget).items():
            if size not in out.setdefault(name, []):
                out[name].append(size)
    if grid.dtypes is not None and not any(out.values()):
        smallest = {name: smallest_bytes(name, n_features) for name in names}
        name = min(names, key=lambda n: (smallest[n] is None, smallest[n] or 0))
        raise BadInputError(
            f"no code of {', '.join(names)} stores a {n_features}-d vector in {min(budgets)} bytes or fewer: "
            f"the smallest, {name}, takes {smallest[name]}; raise max_bytes",
            param="max_bytes",
        )
    return {name: sizes for name, sizes in out.items() if sizes}


__all__ = [
    "DEFAULT_METRIC",
    "DEFAULT_RESCORE",
    "STORAGES",
    "TOP_LIST_BYTES",
    "Candidate",
    "RetrievalTuneResult",
    "SweepGrid",
    "SweepRow",
    "best_per_family",
    "bootstrap_differences",
    "choose_generalising",
    "choose_within",
    "reference_index",
    "reference_k",
    "family_of",
    "frontier",
    "retrieval_grid",
    "sweep",
    "sweep_rows",
]
