"""Retrieval evaluation: exact cosine search of queries over a corpus, scored against relevance judgements.

For each setting (the raw vectors, or a whitening; stored as float32, float16, int8 or sign bits, optionally
re-ranked) the queries and every corpus row are transformed, scaled to unit length and stored as the setting
says; each query's 100 best corpus rows are found by exact search (ties to the lower corpus row, excluded
pairs never returned; see `search`), and scored:

- ``ndcg@10``: ``DCG / IDCG`` with ``DCG = sum_{i=1..10} gain_i / log2(i + 1)``, the gain of the
  document at rank ``i`` its qrels score when above 0 (else 0), and ``IDCG`` the DCG of the query's
  judged scores sorted best first (trec_eval's ``ndcg_cut_10``, as BEIR reports it);
- ``recall@k`` (k = 1, 10, 100): relevant documents in the top k over the query's relevant documents;
- ``mrr@10``: ``1 / rank`` of the first relevant document in the top 10, 0 if there is none.

Each is averaged over the queries with a relevant document (one judged only ``score <= 0`` is left out,
and counted) and reported x100. Whitened and raw are compared per query: the difference of the means, with
a paired bootstrap 95% interval (resamples of the queries, a fixed seed; `paired_bootstrap`).

The search is computed in float64 from what each storage (``dtype``) holds: float16 values, int8 codes
dequantized (``code * scale + offset``), sign bits compared by Hamming distance (the queries' bits too);
``rescore=N`` re-ranks the top N of a bit search by the float query's inner product with the corpus rows
stored as ``rescore_dtype`` (float32 or int8), read in one more pass over the blocks that hold them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import numpy as np

from ..core.affine import scale_rows_to_unit
from ..core.finite import raise_if_nonfinite
from ..core.model import WhiteningModel, load_model, project
from ..core.quantize import Quantization, quantization_for
from ..errors import BadInputError, NonFiniteError
from ..io import Source, open_source, read_ids, remote
from ..options import RetrievalOptions
from ..params import PARAMS, check
from ..progress import phase
from ..storage import CODE, Storage, parse_storage
from .qrels import Ids, Qrels, QrelsInfo, read_exclude, read_qrels
from .search import Exclusions, RescoreJob, SearchJob, SearchResult, corpus_blocks, rescore_all, search
from .self_matches import ROUNDOFF, SelfMatches, find_self_matches

if TYPE_CHECKING:
    from ..codes import Codec

T = TypeVar("T")
#: The metrics, in the order they are reported.
METRICS = ("ndcg@10", "recall@1", "recall@10", "recall@100", "mrr@10")
#: Corpus rows kept per query: what recall@100 needs.
DEPTH = 100
#: Paired bootstrap: resamples of the queries, the generator's seed, the interval's level.
BOOTSTRAP_SAMPLES: int = int(PARAMS["bootstrap"].default)  # type: ignore[call-overload]
BOOTSTRAP_SEED: int = int(PARAMS["seed"].default)  # type: ignore[call-overload]
BOOTSTRAP_LEVEL = 0.95


# --------------------------------------------------------------------------------------------- metrics


def query_metrics(top_rows: np.ndarray, query_rows: np.ndarray, qrels: Qrels) -> dict[str, np.ndarray]:
    """Each metric of `METRICS` per query, as a fraction in [0, 1].

    Parameters
    ----------
    top_rows : ndarray, int64, queries x depth
        Each query's corpus rows, best first (-1 past the last).
    query_rows : ndarray, int64
        The query row (as the qrels name it) of each line of ``top_rows``; each must have a relevant
        document.
    qrels : Qrels
    """
    top_rows = np.asarray(top_rows, dtype=np.int64)
    query_rows = np.asarray(query_rows, dtype=np.int64)
    n = query_rows.shape[0]
    if top_rows.ndim != 2 or top_rows.shape[0] != n:
        raise BadInputError(f"expected one top list per query ({n}), got shape {top_rows.shape}")
    if np.any(np.diff(query_rows) <= 0):
        raise BadInputError("the query rows must be distinct and ascending")
    relevant = qrels.relevant()
    # the relevant pairs of the queries evaluated, each query as its line in top_rows
    line = np.searchsorted(query_rows, relevant.queries)
    inside = line < n
    inside[inside] = query_rows[line[inside]] == relevant.queries[inside]
    line, rows, grades = line[inside], relevant.rows[inside], relevant.grades[inside]
    n_relevant = np.bincount(line, minlength=n).astype(np.float64)
    if np.any(n_relevant == 0):
        missing = query_rows[np.argmin(n_relevant)]
        raise BadInputError(f"{qrels.label}: query row {missing} has no relevant document to evaluate it by")
    if n == 0:
        return {name: np.zeros(0) for name in METRICS}
    # the gain of each retrieved row: its grade, looked up by the key (line, row) among the relevant pairs
    modulus = int(max(int(rows.max()), int(top_rows.max(initial=-1)))) + 2  # row -1 keys no pair
    keys = line * modulus + rows
    order = np.argsort(keys)
    keys, sorted_grades = keys[order], grades[order]
    wanted = np.arange(n, dtype=np.int64)[:, None] * modulus + top_rows
    found = np.minimum(np.searchsorted(keys, wanted), keys.size - 1)
    gain = np.where((top_rows >= 0) & (keys[found] == wanted), sorted_grades[found], 0.0)
    # the ideal DCG: each query's relevant grades best first, at ranks 1, 2, ...
    by_grade = np.lexsort((-grades, line))
    line, grades = line[by_grade], grades[by_grade]
    rank = np.arange(line.size) - np.searchsorted(line, line)
    cut = rank < 10
    ideal = np.bincount(line[cut], weights=grades[cut] / np.log2(rank[cut] + 2.0), minlength=n)
    width = min(10, gain.shape[1])
    dcg = (gain[:, :width] / np.log2(np.arange(width) + 2.0)).sum(axis=1)
    hits = gain > 0
    top = hits[:, :10]
    out = {"ndcg@10": dcg / ideal}
    out.update({f"recall@{k}": hits[:, :k].sum(axis=1) / n_relevant for k in (1, 10, 100)})
    out["mrr@10"] = np.where(top.any(axis=1), 1.0 / (np.argmax(top, axis=1) + 1.0), 0.0)
    return out


def mean_metrics(per_query: dict[str, np.ndarray]) -> dict[str, float]:
    """Each metric's mean over the queries, x100."""
    return {name: 100.0 * float(np.mean(values)) for name, values in per_query.items()}


def paired_bootstrap(
    first: dict[str, np.ndarray],
    second: dict[str, np.ndarray],
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = BOOTSTRAP_LEVEL,
) -> dict[str, Difference]:
    """The mean per-query difference ``second - first`` of each metric, x100, with a paired bootstrap
    interval.

    Resample ``i`` (``i < samples``) draws the queries ``rng.integers(0, n, size=n)`` from
    ``numpy.random.default_rng(seed)``, one resample after the other, the same queries for every
    metric; the interval is the ``(1 - level) / 2`` and ``(1 + level) / 2`` percentiles (numpy's
    linear interpolation) of the resampled mean differences. ``samples = 0`` gives no interval.
    """
    names = list(first)
    diffs = np.array([np.asarray(second[name], np.float64) - np.asarray(first[name], np.float64) for name in names])
    n = diffs.shape[1] if names else 0
    if samples <= 0 or n == 0:
        return {name: Difference(100.0 * float(diffs[i].mean()) if n else math.nan) for i, name in enumerate(names)}
    rng = np.random.default_rng(seed)
    means = np.empty((samples, len(names)))
    for i in range(samples):
        index = rng.integers(0, n, size=n)
        means[i] = [row[index].mean() for row in diffs]  # each a 1-D mean, as numpy sums it
    low, high = np.percentile(means, [100.0 * (1.0 - level) / 2.0, 100.0 * (1.0 + level) / 2.0], axis=0)
    return {
        name: Difference(100.0 * float(diffs[i].mean()), 100.0 * float(low[i]), 100.0 * float(high[i]))
        for i, name in enumerate(names)
    }


# -------------------------------------------------------------------------------------------- settings


@dataclass
class SearchSetting:
    """How vectors become what is searched: an optional whitening ``y = (x - shift) @ weights``, L2
    normalisation, a storage, and for bits an optional re-ranking of the top ``rescore``.

    Build one with `make` or `make_code` (not [`streamwhiten.options.Setting`][streamwhiten.options.Setting], the
    whitening's parameters: a search setting is those as a map, plus how it is stored); ``params`` are the
    storage and setting fields of its `RetrievalScores`.
    """

    name: str
    quantization: Quantization
    weights: np.ndarray | None = None
    shift: np.ndarray | None = None
    rescore: int = 0
    rescore_quantization: Quantization | None = None
    params: dict = field(default_factory=dict)
    #: A vector code (``streamwhiten.codes.Codec``) the corpus is stored as: searched by its estimate of
    #: ``<q, x>`` for the float32 queries (asymmetric), with ``codes.fast``.
    codec: Codec | None = None

    @classmethod
    def make(
        cls,
        name: str,
        model: WhiteningModel | None = None,
        *,
        raw: bool = False,
        storage: Storage | None = None,
        n_features: int | None = None,
    ) -> SearchSetting:
        """The raw vectors (``raw``, or no ``model``) or ``model``'s whitening, stored as ``storage`` (a plain
        one; default float32), its top ``storage.rescore`` re-ranked with ``storage.rescore_dtype`` vectors.

        int8 storage (and int8 rescoring) takes its scale and offset from ``model``'s statistics, so
        it needs a model for raw vectors too; ``n_features`` is the width when there is no model.
        """
        storage = Storage() if storage is None else storage
        if storage.code is not None:
            raise BadInputError(f"the {storage} code is searched by its codec: make_code")
        raw, width = raw or model is None, None if model is not None else n_features
        quantization = quantization_for(
            storage.dtype, model, raw=raw, normalize=True, clip=storage.int8_clip, n_components=width
        )
        params: dict = {"dtype": storage.dtype, "bytes_per_vector": storage.bytes_per_vector(quantization.n_components)}
        if storage.dtype == "int8":
            params["int8_clip"] = float(storage.int8_clip)
        again, weights, shift = _rescoring_and_map(model, storage, raw, params, width)
        return cls(name, quantization, weights, shift, int(storage.rescore), again, params)

    @classmethod
    def make_code(
        cls,
        name: str,
        model: WhiteningModel,
        codec: Codec,
        search: Storage,
        *,
        raw: bool = False,
        training: dict | None = None,
    ) -> SearchSetting:
        """The raw vectors (``raw``) or ``model``'s whitening at unit length, stored as ``codec``'s code
        rows (``search``: the code's name, ``eigen:24``, and its re-ranking: the top ``rescore`` re-ranked
        with ``rescore_dtype`` vectors). Bytes per vector count the code row (per-vector scalars included)
        and the re-ranking vectors; the codec's per-model bytes are reported apart (``model_bytes``)."""
        width = model.n_features if raw else model.n_components
        if codec.n_features != width:
            raise BadInputError(f"the {codec.label} codec codes vectors of {codec.n_features} values, not {width}")
        params: dict = dict(training or {}, dtype=str(search), code=codec.label, model_bytes=codec.model_bytes)
        again, weights, shift = _rescoring_and_map(model, search, raw, params)
        params["bytes_per_vector"] = codec.bytes_per_vector + (again.bytes_per_vector if again is not None else 0)
        floats = Quantization("float32", width, normalized=True)
        return cls(name, floats, weights, shift, int(search.rescore), again, params, codec)

    @property
    def n_features(self) -> int | None:
        return None if self.weights is None else int(self.weights.shape[0])

    def unit(self, rows: np.ndarray) -> np.ndarray:
        """The rows transformed (in float64) and scaled to unit L2 norm; zero rows stay zero."""
        if self.weights is None:
            out = np.array(rows, dtype=np.float64)
            scale_rows_to_unit(out, np.sqrt(np.einsum("ij,ij->i", out, out)))
            return out
        assert self.shift is not None  # made with the weights
        return project(rows, self.weights, self.shift, normalize=True)

    def searched(self, rows: np.ndarray) -> np.ndarray:
        """Corpus rows as the search sees them: the stored values decoded to float64, or the bits."""
        codes = self.quantization.encode(self.unit(rows))
        return codes if self.quantization.kind == "binary" else self.quantization.decode(codes, np.float64)

    def rescored(self, rows: np.ndarray) -> np.ndarray:
        """Corpus rows as the re-ranking sees them (float64)."""
        again = self.rescore_quantization
        assert again is not None  # made with the rescoring
        return again.decode(again.encode(self.unit(rows)), np.float64)

    def query_vectors(self, rows: np.ndarray) -> np.ndarray:
        """Queries as searched: float64 unit vectors, or their sign bits for a bit search."""
        unit = self.unit(rows)
        return np.packbits(unit > 0, axis=1) if self.quantization.kind == "binary" else unit


def _rescoring_and_map(
    model: WhiteningModel | None, storage: Storage, raw: bool, params: dict, width: int | None = None
) -> tuple[Quantization | None, np.ndarray | None, np.ndarray | None]:
    """The re-ranking's quantization (None: none) and the whitening's weights and shift (None: the raw
    vectors), their fields added to a search setting's ``params``."""
    again = weights = shift = None
    if storage.rescore:
        dtype, clip = storage.rescore_dtype, storage.int8_clip
        again = quantization_for(dtype, model, raw=raw, normalize=True, clip=clip, n_components=width)
        params.update(rescore=int(storage.rescore), rescore_dtype=dtype)
        if dtype == "int8":
            params["int8_clip"] = float(clip)
    if not raw:
        assert model is not None  # raw without one
        weights, shift = model.projection(np.float64)
        params.update(beta=model.beta, gamma=model.gamma, k=model.n_components)
    return again, weights, shift


def _finite(rows: np.ndarray, start: int, label: str) -> np.ndarray:
    raise_if_nonfinite(rows, f"{label}:", start=start)
    return rows


def search_settings(
    queries: np.ndarray,
    corpus: Any,
    settings: list[SearchSetting],
    *,
    exclude: Exclusions | None = None,
    depth: int = DEPTH,
    corpus_label: str = "corpus",
    options: RetrievalOptions | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, SearchResult]:
    """Each setting's top ``depth`` corpus rows and their scores for every query row of ``queries``, in one
    pass over ``corpus`` (an array or a Source; plus one more pass over the blocks holding the candidates of
    the settings that re-rank bits, for all of them), read in ``options.block_rows`` blocks by
    ``options.threads`` threads (default: ``RetrievalOptions()``'s): ``{setting name: SearchResult}`` of its top
    ``depth`` (``rows``: int64, -1 past the last candidate; ``values``: the inner products, or the Hamming
    distances of a bit search; a re-ranked bit search's are its re-ranked inner products, -inf past them)."""
    names = [setting.name for setting in settings]
    if len(set(names)) != len(names):
        raise BadInputError(f"settings need distinct names, got {names}")
    # A re-ranking deeper than the corpus re-ranks all of it: its top lists are never longer (each holds
    # queries x depth rows, so --rescore 10**9 would otherwise ask for hundreds of GiB).
    n_corpus = int(corpus.shape[0] if isinstance(corpus, np.ndarray) else corpus.n_rows)
    reranked = {setting.name: min(setting.rescore, n_corpus) for setting in settings}
    wanted = {name: max(depth, deeper) for name, deeper in reranked.items()}
    block_rows, threads = (options or RetrievalOptions()).block_rows, (options or RetrievalOptions()).threads
    jobs = _search_jobs(queries, settings, wanted, exclude, corpus_label)
    coded = [setting for setting in settings if setting.codec is not None]
    found = iter(search(corpus, jobs, block_rows=block_rows, threads=threads, progress=progress) if jobs else [])
    code_found = iter(_search_codes(queries, corpus, coded, wanted, exclude, corpus_label, block_rows, progress))
    results = [next(code_found) if setting.codec is not None else next(found) for setting in settings]
    again = [
        RescoreJob(
            setting.unit(queries),
            result.rows[:, : reranked[setting.name]],
            reranked[setting.name],
            lambda block, start, setting=setting: setting.rescored(block),  # type: ignore[misc]  # mypy cannot infer a lambda whose default binds the loop variable (python/mypy#15459)
        )
        for setting, result in zip(settings, results, strict=True)
        if setting.rescore
    ]
    rescored = iter(rescore_all(corpus, again, block_rows=block_rows))
    return {
        setting.name: _top(result, next(rescored) if setting.rescore else None, reranked[setting.name], depth)
        for setting, result in zip(settings, results, strict=True)
    }


def _search_jobs(
    queries: np.ndarray,
    settings: list[SearchSetting],
    wanted: dict[str, int],
    exclude: Exclusions | None,
    corpus_label: str,
) -> list[SearchJob]:
    """The search of each setting stored as floats, int8 or bits (not a code): its queries, its ``wanted``
    depth, and how a block of corpus rows read becomes what it searches (checked for NaN/Inf)."""
    jobs = []
    for setting in settings:
        if setting.n_features is not None and setting.n_features != queries.shape[1]:
            raise BadInputError(
                f"setting {setting.name!r} expects {setting.n_features} features, the vectors have {queries.shape[1]}"
            )
        if setting.codec is not None:
            continue
        metric = "hamming" if setting.quantization.kind == "binary" else "ip"

        def prepare(rows: np.ndarray, start: int, setting: Any = setting):
            return setting.searched(_finite(rows, start, corpus_label))

        jobs.append(SearchJob(setting.query_vectors(queries), wanted[setting.name], metric, prepare, exclude))
    return jobs


def _top(result: SearchResult, ranked: SearchResult | None, reranked: int, depth: int) -> SearchResult:
    """The top ``depth`` of a search, its first ``reranked`` rows replaced by their re-ranking ``ranked``
    (then scored by inner products, -inf past them) where it re-ranks."""
    rows, values = result.rows, result.values
    if ranked is not None:
        rows = np.concatenate([ranked.rows, rows[:, reranked:]], axis=1)
        values = np.full(rows.shape, -np.inf, dtype=ranked.values.dtype)
        values[:, : ranked.values.shape[1]] = ranked.values
    metric = "ip" if ranked is not None else result.metric
    return SearchResult(np.ascontiguousarray(rows[:, :depth]), np.ascontiguousarray(values[:, :depth]), metric)


def _search_codes(
    queries: np.ndarray,
    corpus: Any,
    settings: list[SearchSetting],
    wanted: dict[str, int],
    exclude: Exclusions | None,
    corpus_label: str,
    block_rows: int | None,
    progress: Callable[[int, int], None] | None,
) -> list[SearchResult]:
    """The top lists of the settings stored as codes: one pass over ``corpus`` encodes every block for
    each (``codes.fast.encode``; the code rows, a few bytes each, are what is held), then each setting's
    float32 unit queries search its codes by the codec's inner-product estimate (``codes.fast.search``)
    for its ``wanted`` rows (by setting name)."""
    if not settings:
        return []
    from ..codes.fast import encode
    from ..codes.fast import search as search_codes

    n_rows = int(corpus.shape[0] if isinstance(corpus, np.ndarray) else corpus.n_rows)
    pieces: dict[str, list[np.ndarray]] = {setting.name: [] for setting in settings}
    for start, rows in corpus_blocks(corpus, block_rows):
        rows = _finite(rows, start, corpus_label)
        for setting in settings:
            assert setting.codec is not None  # chosen so
            pieces[setting.name].append(encode(setting.codec, setting.unit(rows)))
        if progress is not None:
            progress(start + rows.shape[0], n_rows)
    out = []
    for setting in settings:
        assert setting.codec is not None  # chosen so
        width = setting.codec.bytes_per_vector
        codes = np.concatenate(pieces.pop(setting.name)) if n_rows else np.zeros((0, width), np.uint8)
        scores, rows_found = search_codes(
            setting.codec, setting.unit(queries).astype(np.float32), codes, wanted[setting.name], exclude=exclude
        )
        out.append(SearchResult(rows_found, scores, "ip"))
    return out


# ------------------------------------------------------------------------------------------ evaluation


def _open(spec: Any, what: str, column: str | None, opened: list) -> tuple[Source | np.ndarray, StoreInfo]:
    """A Source or array for ``spec`` (a spec string, opened here and added to ``opened``; a Source or an
    array as it is) and what the result records of it."""
    if isinstance(spec, np.ndarray):
        if spec.ndim != 2 or spec.dtype.kind != "f":
            raise BadInputError(f"expected a 2-D array of float vectors, got {spec.dtype} of shape {spec.shape}")
        return spec, StoreInfo(f"the {what} array", int(spec.shape[0]), int(spec.shape[1]), column)
    if not isinstance(spec, Source):
        spec = open_source(spec)
        opened.append(spec)
    return spec, StoreInfo(spec.label, int(spec.n_rows), int(spec.n_features), column)


def _ids(store: Any, info: StoreInfo, what: str) -> Ids:
    if info.id_column is None:
        return Ids(info.label, info.n_rows)
    if not isinstance(store, Source):
        raise BadInputError(f"an id column needs a Parquet or Lance store; the {what} are an array")
    return Ids(info.label, info.n_rows, read_ids(store, info.id_column), info.id_column)


@dataclass(frozen=True)
class StoreInfo:
    """A store of a retrieval task: its label, rows and width, and the id column that names its rows (None:
    their numbers)."""

    label: str
    n_rows: int
    n_features: int
    id_column: str | None


@dataclass(frozen=True)
class ExcludeInfo:
    """The exclude file of a retrieval task (redacted), its pairs, and those of the evaluated queries."""

    exclude: str
    n_pairs: int
    n_pairs_used: int


@dataclass(frozen=True)
class BootstrapInfo:
    """The paired bootstrap of the intervals: resamples of the queries, the generator's seed, the level."""

    samples: int
    seed: int
    level: float = BOOTSTRAP_LEVEL


#: Corpus rows drawn (seeded) to train a code that learns from data when ``eval`` trains one.
CODE_SAMPLE_ROWS = 10_000
CODE_SAMPLE_SEED = 0


def _code_settings(
    task: RetrievalTask, model: WhiteningModel, code: Storage, progress: Callable[[int, int], None] | None = None
) -> list[SearchSetting]:
    """The raw and whitened settings of a code search: the whitened vectors by the model's codec where it
    records this code, else one trained here; the raw vectors by the same code trained for them (from the
    statistics and, for a code that learns from data, a seeded sample of the corpus). ``progress`` is told
    each phase (reading the sample, each training)."""
    from ..codes import NEEDS_SAMPLE, check_budget, record_codec
    from ..codes.storage import train_for
    from ..io.sample import sample_rows

    sample = None
    training: dict = {}
    name, budget = str(code.code), int(code.budget or 0)
    if name in NEEDS_SAMPLE:
        for width in {model.n_features, model.n_components}:  # the raw vectors' code and the whitened's
            check_budget(name, width, budget)  # before the sample is read
        with phase(progress, "read a sample of the corpus") as told:
            sample = sample_rows(task.corpus, CODE_SAMPLE_ROWS, CODE_SAMPLE_SEED, told)
        training = {"sample_rows": int(sample.shape[0]), "sample_seed": CODE_SAMPLE_SEED}
    source = "from the statistics" if sample is None else f"on {sample.shape[0]:,} rows"
    with phase(progress, f"train {code} for the raw vectors {source}", None):
        raw_codec = train_for(model, name, budget, sample=sample, sample_seed=CODE_SAMPLE_SEED, raw=True)
    settings = [SearchSetting.make_code("raw", model, raw_codec, code, raw=True, training=training)]
    record = model.storage.codec if model.storage is not None else None
    if record is not None and code.names(model.storage):
        white = record_codec(record, model.n_components)
        mine = {"sample_rows": record.sample_rows, "sample_seed": record.sample_seed} if record.sample_rows else {}
        settings.append(SearchSetting.make_code("whitened", model, white, code, training=dict(mine, codec="model")))
    else:
        with phase(progress, f"train {code} for the whitened vectors {source}", None):
            white = train_for(model, name, budget, sample=sample, sample_seed=CODE_SAMPLE_SEED)
        settings.append(SearchSetting.make_code("whitened", model, white, code, training=training))
    return settings


def _search_raw_and_whitened(
    task: RetrievalTask,
    model: WhiteningModel | None,
    storage: Storage,
    options: RetrievalOptions,
    progress: Callable[[int, int], None] | None,
) -> tuple[list[SearchSetting], dict[str, dict[str, np.ndarray]], SelfMatches | None]:
    """Search the task's corpus for the raw vectors and (given a model) the whitened ones, stored as
    ``storage`` says, in one pass; each setting's metrics per query, and the queries that are corpus rows
    where the raw vectors are searched as floats (None: int8, bits and codes are not checked)."""
    if storage.code is not None:
        assert model is not None  # resolve_storage refuses a code without one
        settings = _code_settings(task, model, storage, progress)
    else:
        settings = [SearchSetting.make("raw", model, raw=True, storage=storage, n_features=task.n_features)]
        if model is not None:
            settings.append(SearchSetting.make("whitened", model, storage=storage))
    with phase(progress, f"search {len(settings)} settings over {task.n_corpus:,} rows"):
        found = search_settings(
            task.vectors,
            task.corpus,
            settings,
            exclude=task.excluded,
            corpus_label=task.corpus_label,
            options=options,
            progress=progress,
        )
    raw, matches = settings[0], None
    if raw.codec is None and raw.quantization.kind in ROUNDOFF:  # the raw cosines, as floats: checked
        matches = find_self_matches(task, found["raw"].rows, found["raw"].values, raw.quantization.kind)
    metrics = {name: query_metrics(top.rows, task.query_rows, task.qrels) for name, top in found.items()}
    return settings, metrics, matches


def resolve_storage(
    model: WhiteningModel | None = None,
    dtype: str | Storage | None = None,
    rescore: int | None = None,
    rescore_dtype: str | None = None,
    int8_clip: float | None = None,
) -> Storage:
    """How a search stores the corpus, checked: ``dtype`` (a name, parsed here, or a `Storage`: its dtype or
    code), else the model's recorded storage (what ``tune`` chose, or its code), else float32; ``rescore``,
    ``rescore_dtype``, ``int8_clip`` as given, else the model's storage's (a code: where the model records that
    code). A plain ``dtype`` given without ``rescore`` inherits the model's re-ranking only as ``binary``.

    ``int8`` needs the model (its statistics set the scales, raw ones included); so does a vector code
    (``eigen:24``, ``faiss-pq:16``; ``streamwhiten.codes.CODES``), searched by the codec's estimate of
    ``<q, x>`` for float32 queries: the whitened vectors by the model's codec where it records that code, else
    one trained from the statistics (``faiss-*``, ``bits-itq``: and a seeded sample of 10,000 corpus rows), the
    raw vectors by the same code trained for them. ``rescore`` re-ranks the top N of bits or a code with
    ``rescore_dtype`` (float32 or int8) vectors; ``int8_clip``: the standard deviations the int8 codes span
    about each component's mean (default 4).
    """
    wanted = None if dtype is None else parse_storage(dtype)  # before anything is read
    for name, value in (("rescore", rescore), ("rescore_dtype", rescore_dtype), ("int8_clip", int8_clip)):
        if value is not None:
            check(name, value)
    base = recorded = getattr(model, "storage", None) or Storage()
    wanted = wanted or recorded
    if wanted.code is not None:
        if model is None:
            raise BadInputError(f"the {wanted} code trains from a model's statistics: give a model")
        base = recorded if wanted.names(recorded) else Storage()
    if rescore is None:  # a plain dtype given inherits the re-ranking only as binary
        rescore = base.rescore if wanted.dtype in ("binary", CODE) else 0
    rescore_dtype = base.rescore_dtype if rescore_dtype is None else rescore_dtype
    clip = base.int8_clip if int8_clip is None else int8_clip
    return Storage(wanted.dtype, rescore, rescore_dtype, clip, code=wanted.code, budget=wanted.budget)


def evaluate_retrieval(
    queries: Any,
    corpus: Any,
    qrels: Any,
    *,
    model: WhiteningModel | str | os.PathLike | None = None,
    storage: str | Storage | None = None,
    options: RetrievalOptions | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RetrievalResult:
    """Retrieval metrics (x100) of the raw vectors and, given a model, of its whitening, on the same
    queries, with a paired bootstrap interval of each difference (a `RetrievalResult`).

    Parameters
    ----------
    queries, corpus : str, Source or ndarray
        Store specs (as ``fit`` takes them), open sources or arrays of vectors of one width. The
        queries are read whole; the corpus is streamed in blocks.
    qrels : str or Qrels
        A BEIR qrels file (see `qrels`) whose ids are rows of the stores, or values of their id
        columns (``options.query_id_column``, ``options.corpus_id_column``: Parquet or Lance stores).
    model : WhiteningModel or str, optional
        Its setting (beta, gamma, k) is evaluated as ``whitened``; without it only ``raw`` is. A path
        is loaded.
    storage : str or Storage, optional
        How the corpus is stored while searched, raw and whitened alike: a name (``float32``, ``float16``,
        ``int8``, ``binary`` or a vector code ``NAME:BYTES``) with the re-ranking and int8 span of the
        model's storage, or a `Storage` as it is (what `resolve_storage` makes of each setting, see there);
        default: the model's storage (what ``tune`` chose, or its code), float32 without one.
    options : RetrievalOptions, optional
        The exclude file (``(query, corpus)`` pairs dropped from that query's candidates), the id columns,
        ``bootstrap`` and ``seed`` (resamples of the queries for the intervals, 0: none, and the generator's
        seed), ``block_rows`` and ``threads``, as one [`RetrievalOptions`][streamwhiten.options.RetrievalOptions].
    progress : callable, optional
        ``progress(rows_done, n_rows)``.
    """
    options = retrieval_options(options)
    model_file = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
    model = load_model(model_file) if model_file is not None else cast("WhiteningModel | None", model)
    given = (storage.rescore, storage.rescore_dtype, storage.int8_clip) if isinstance(storage, Storage) else ()
    storage = resolve_storage(model, storage, *given)  # a Storage as it is (a code: checked to have a model)
    with open_task(queries, corpus, qrels, model=model, options=options) as task:
        settings, per_query, matches = _search_raw_and_whitened(task, model, storage, options, progress)
    scores = [RetrievalScores.of(mean_metrics(per_query[each.name]), **each.params) for each in settings]
    bootstrap, difference = BootstrapInfo(options.bootstrap, options.seed), None
    if model is not None:
        differences = paired_bootstrap(per_query["raw"], per_query["whitened"], bootstrap.samples, bootstrap.seed)
        difference = RetrievalDifference.of(differences)
    return RetrievalResult(
        **vars(task.describe()),
        raw=scores[0],
        whitened=scores[1] if model is not None else None,
        difference=difference,
        bootstrap=bootstrap,
        model=model_file,
        self_matches=matches,
    )


@dataclass(frozen=True, kw_only=True)
class ByMetric(Generic[T]):
    """One value per metric of `METRICS`, ``ndcg@10`` as the field ``ndcg_10``."""

    ndcg_10: T
    recall_1: T
    recall_10: T
    recall_100: T
    mrr_10: T

    @classmethod
    def of(cls: type[M], values: Mapping[str, Any], **more: Any) -> M:
        """From ``{metric name: value}`` and the fields ``more``."""
        return cls(**{name.replace("@", "_"): value for name, value in values.items()}, **more)

    def metric(self, name: str) -> T:
        """The value of the metric ``name``."""
        return getattr(self, name.replace("@", "_"))

    def to_json(self) -> dict[str, Any]:
        """Each metric by its name in `METRICS`, then the other fields that are not None."""
        out = {name: plain(self.metric(name)) for name in METRICS}
        out.update((key, getattr(self, key)) for key in self._keys() if getattr(self, key) is not None)
        return out

    def _keys(self) -> list[str]:
        return [item.name for item in fields(self)[len(METRICS) :]]


M = TypeVar("M", bound=ByMetric)


@dataclass(frozen=True, kw_only=True)
class RetrievalScores(ByMetric[float]):
    """One setting's scores: each of `METRICS` (the mean over the queries, x100), how the corpus was stored
    (``dtype``: a storage or a code ``NAME:BYTES``; the ``code``'s label, its ``model_bytes``, training sample
    and ``codec`` "model" where it is the model's own; ``int8_clip``; the re-ranking) and, whitened, the
    setting (``beta``, ``gamma``, ``k``). None: does not apply, and left out of `to_json`."""

    dtype: str
    code: str | None = None
    bytes_per_vector: int
    int8_clip: float | None = None
    rescore: int | None = None
    rescore_dtype: str | None = None
    model_bytes: int | None = None
    sample_rows: int | None = None
    sample_seed: int | None = None
    codec: str | None = None
    beta: float | None = None
    gamma: float | None = None
    k: int | None = None

    def _keys(self) -> list[str]:
        keys = super()._keys()
        if self.code is not None:  # a code records its int8 span after its re-ranking (as make_code did)
            keys.remove("int8_clip")
            keys.insert(keys.index("model_bytes"), "int8_clip")
        return keys


@dataclass(frozen=True)
class Difference:
    """Whitened minus raw of one metric (x100) with its paired bootstrap interval (None bounds: no resamples)."""

    difference: float
    low: float | None = None
    high: float | None = None


class RetrievalDifference(ByMetric[Difference]):
    """The `Difference` of each of `METRICS`."""


@dataclass(frozen=True)
class TaskInfo:
    """What was searched: the ``queries`` and ``corpus`` stores (`StoreInfo`), the judgements read (`QrelsInfo`),
    the exclude file, its pairs and those used (None without one) and ``n_queries``, the queries evaluated (those
    with a relevant document)."""

    queries: StoreInfo
    corpus: StoreInfo
    qrels: QrelsInfo
    exclude: ExcludeInfo | None
    n_queries: int

    def to_json(self) -> dict[str, Any]:
        """The fields as plain JSON values, in field order."""
        return {item.name: plain(getattr(self, item.name)) for item in fields(self)}


@dataclass(frozen=True)
class RetrievalResult(TaskInfo):
    """The retrieval metrics of the raw vectors and a whitening on one task (what
    [`evaluate_retrieval`][streamwhiten.evaluation.retrieval.evaluate_retrieval] returns, ``eval --json`` prints:
    `to_json`, the fields below in order).

    Attributes
    ----------
    queries, corpus, qrels, exclude, n_queries
        The task (`TaskInfo`): each store's ``label``, ``n_rows``, ``n_features`` and ``id_column``; the judgements
        read; the exclude file (None without one); the queries evaluated (those with a relevant document).
    raw, whitened : RetrievalScores
        Each of `METRICS` (mean x100, ``ndcg@10`` as ``ndcg_10``) with the storage (``dtype``,
        ``bytes_per_vector``, a re-ranking, a code's fields) and, whitened, the setting (``beta``, ``gamma``,
        ``k``); ``whitened`` is None without a model.
    difference : RetrievalDifference or None
        Each metric's ``Difference`` (``difference``, ``low``, ``high``): whitened minus raw (x100) with its
        paired bootstrap interval (None bounds with no resamples); None without a model.
    bootstrap : BootstrapInfo
        ``samples``, ``seed`` and ``level`` of the intervals.
    model : str or None
        The model file evaluated, where it was given as one.
    self_matches : SelfMatches or None
        The queries whose nearest corpus row is the query itself and not judged relevant
        (`self_matches`; an exclude file drops them); None where the raw vectors were not searched
        as floats (int8, bits, codes: not checked).
    """

    raw: RetrievalScores
    whitened: RetrievalScores | None
    difference: RetrievalDifference | None
    bootstrap: BootstrapInfo
    model: str | None = None
    self_matches: SelfMatches | None = None


def plain(value: Any) -> Any:
    """A record (its ``to_json()``, else a dataclass's fields), a mapping and what they hold as plain JSON
    values (dicts in field order); anything else as it is."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    return {key: plain(item) for key, item in value.items()} if isinstance(value, Mapping) else value


def retrieval_options(options: RetrievalOptions | None) -> RetrievalOptions:
    """``options`` (checked to be a [`RetrievalOptions`][streamwhiten.options.RetrievalOptions]), else the defaults."""
    if options is None:
        return RetrievalOptions()
    if not isinstance(options, RetrievalOptions):
        raise BadInputError(f"options must be a RetrievalOptions, got {type(options).__name__}")
    return options


@dataclass
class RetrievalTask:
    """Queries, corpus, judgements and excluded pairs, opened and checked (see `open_task`).

    ``vectors`` are the query rows evaluated (``query_rows``: those with a relevant document), read whole;
    ``corpus`` is streamed by the searches; ``excluded`` are the exclusions as the searches take them;
    ``stores`` what the result records of the queries and the corpus, ``ids`` how the qrels name their rows.
    """

    queries: Source | np.ndarray
    corpus: Source | np.ndarray
    qrels: Qrels
    query_rows: np.ndarray
    vectors: np.ndarray
    excluded: Exclusions
    exclude_info: ExcludeInfo | None
    stores: tuple[StoreInfo, StoreInfo]
    ids: tuple[Ids, Ids]
    opened: list = field(default_factory=list, repr=False)

    @property
    def n_features(self) -> int:
        return int(self.vectors.shape[1])

    @property
    def corpus_label(self) -> str:
        return self.stores[1].label

    @property
    def n_corpus(self) -> int:
        return self.stores[1].n_rows

    def describe(self) -> TaskInfo:
        return TaskInfo(*self.stores, self.qrels.describe(), self.exclude_info, int(self.query_rows.size))

    def close(self) -> None:
        for store in self.opened:
            store.close()
        self.opened = []

    def __enter__(self):
        return self

    def __exit__(self, *exc: object):
        self.close()


def open_task(
    queries: Any, corpus: Any, qrels: Any, *, model: Any = None, options: RetrievalOptions | None = None
) -> RetrievalTask:
    """Open and check a retrieval task (see [`evaluate_retrieval`][streamwhiten.evaluation.retrieval.evaluate_retrieval]
    for the arguments; ``options``: its exclude file and id columns): queries and corpus of one width (and the
    model's), the qrels and exclude files read against their ids, the evaluated queries read and checked for
    NaN/Inf. Close it when done (a context manager)."""
    options = retrieval_options(options)
    opened: list = []
    try:
        query_store, query_info = _open(queries, "queries", options.query_id_column, opened)
        corpus_store, corpus_info = _open(corpus, "corpus", options.corpus_id_column, opened)
        _check_widths(query_info, corpus_info, model)
        ids = (_ids(query_store, query_info, "queries"), _ids(corpus_store, corpus_info, "corpus"))
        judged = qrels if isinstance(qrels, Qrels) else read_qrels(qrels, *ids)
        query_rows = judged.query_rows()
        excluded, exclude_info = _exclusions(options.exclude, ids, judged, query_rows)
        vectors = _query_vectors(query_store, query_rows, query_info.label)
    except BaseException:
        for store in opened:
            store.close()
        raise
    stores = (query_info, corpus_info)
    return RetrievalTask(
        query_store, corpus_store, judged, query_rows, vectors, excluded, exclude_info, stores, ids, opened
    )


def _check_widths(queries: StoreInfo, corpus: StoreInfo, model: Any) -> None:
    """Queries and corpus of one width, the model's."""
    if queries.n_features != corpus.n_features:
        raise BadInputError(
            f"queries and corpus differ in width: {queries.label} has {queries.n_features} columns "
            f"but {corpus.label} has {corpus.n_features}"
        )
    if model is not None and model.n_features != queries.n_features:
        raise BadInputError(
            f"the model expects {model.n_features} features but {corpus.label} has {queries.n_features}"
        )


def _exclusions(
    exclude: Any, ids: tuple[Ids, Ids], judged: Qrels, query_rows: np.ndarray
) -> tuple[Exclusions, ExcludeInfo | None]:
    """The excluded pairs of the evaluated queries as the searches take them, and what the result records
    of the exclude file (None without one)."""
    if exclude is None:
        return Exclusions.none(query_rows.size), None
    ex_queries, ex_rows = read_exclude(os.fspath(exclude), *ids, judged)
    position = np.searchsorted(query_rows, ex_queries)
    keep = (position < query_rows.size) & (query_rows[np.minimum(position, query_rows.size - 1)] == ex_queries)
    excluded = Exclusions.from_pairs(query_rows.size, position[keep], ex_rows[keep])
    return excluded, ExcludeInfo(remote.redact(str(exclude)), int(ex_queries.size), int(keep.sum()))


def _query_vectors(store: Source | np.ndarray, query_rows: np.ndarray, label: str) -> np.ndarray:
    """The evaluated queries' vectors, read whole, checked for NaN/Inf."""
    vectors = (store.read(0, store.n_rows) if isinstance(store, Source) else np.asarray(store))[query_rows]
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        row = int(query_rows[np.argmin(finite)])
        raise NonFiniteError(f"{label}: row {row} holds NaN or Inf", row=row)
    return vectors


__all__ = [
    "DEPTH",
    "METRICS",
    "BootstrapInfo",
    "Difference",
    "ExcludeInfo",
    "QrelsInfo",
    "StoreInfo",
    "TaskInfo",
    "plain",
    "RetrievalDifference",
    "RetrievalResult",
    "RetrievalScores",
    "RetrievalTask",
    "SearchSetting",
    "evaluate_retrieval",
    "mean_metrics",
    "open_task",
    "paired_bootstrap",
    "query_metrics",
    "resolve_storage",
    "retrieval_options",
    "search_settings",
]
