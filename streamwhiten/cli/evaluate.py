"""``streamwhiten eval``: score a model (or the raw vectors) on labelled pairs or on a retrieval task."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

import click

from ..errors import BadInputError
from ..options import Setting
from ._common import (
    Inputs,
    emit,
    fmt_interval,
    fmt_scores,
    fmt_setting,
    mode_of,
    named,
    noise,
    pair_options,
    progress_bar,
    retrieval_options,
    retrieval_options_of,
)
from ._options import block_rows_of, json_option, objects, param_options, quiet_option, setting_options
from ._warn import warn_self_matches
from .codes import StorageType

if TYPE_CHECKING:
    from ..core.model import WhiteningModel
    from ..evaluation.retrieval import Difference, RetrievalResult, RetrievalScores
    from ..storage import Storage

#: How the corpus is stored while searched, and the re-ranking (retrieval only).
STORAGE_OPTIONS = ("dtype", "rescore", "rescore_dtype", "int8_clip")
#: The options of a search (retrieval only): the storage and the bootstrap (the latter ride in RetrievalOptions).
SEARCH_OPTIONS = (*STORAGE_OPTIONS, "bootstrap", "seed")
#: ``--dtype`` takes a vector code too (``eigen:24``): its own option, not the registry's choice.
_DTYPE_HELP = (
    "Retrieval: how the corpus is stored while searched, raw and whitened alike: float32, float16, int8 (dot "
    "product with the dequantized vectors), binary (Hamming distance of sign bits), or a vector code NAME:BYTES "
    "(e.g. eigen:24, faiss-pq:24; the names: streamwhiten codes --help), searched by the code's estimate of the "
    "inner product for float32 queries; the whitened vectors by the model's code where it records that one, "
    "else one trained for this evaluation, the raw ones by the same code trained for them "
    "[default: the model's storage, else float32]."
)


@dataclass(frozen=True)
class SearchFlags:
    """The options of a search (retrieval only) that eval and tune share, as parsed (None: not given): how
    the corpus is re-ranked and its int8 span, the bootstrap, and the search's threads."""

    rescore: int | None
    rescore_dtype: str | None
    int8_clip: float | None
    bootstrap: int | None
    seed: int | None
    threads: int | None

    def given(self) -> tuple[str, ...]:
        """The names of the options given, a command's own before these: what labelled pairs refuse."""
        shared = [option.name for option in fields(SearchFlags)]
        names = [option.name for option in fields(self) if option.name not in shared] + shared
        return named(**{name: getattr(self, name) for name in names})


@dataclass(frozen=True)
class Search(SearchFlags):
    """eval's search options: how the corpus is stored while searched (``--dtype``), and the shared ones."""

    dtype: Storage | None


@click.command(name="eval")
@click.argument("model_path", required=False)
@pair_options(required=False)
@retrieval_options
@setting_options("eval")
@click.option("--dtype", "dtype", type=StorageType(), default=None, help=_DTYPE_HELP)
@param_options(
    *SEARCH_OPTIONS[1:],
    defaults={name: None for name in SEARCH_OPTIONS},
    helps={
        "rescore": "Retrieval, --dtype binary or a code: re-rank the top N of the search with --rescore-dtype "
        "vectors [default: the model's storage's, else 0].",
        "rescore_dtype": "The vectors --rescore re-ranks with: float32 or int8 [default: the model's storage's, "
        "else float32].",
        "int8_clip": "int8: the codes span each component's mean +- this many standard deviations [default: 4].",
        "bootstrap": "Retrieval: resamples of the queries for the paired 95% interval of each difference "
        "[default: 1000; 0: none].",
        "seed": "Retrieval: the bootstrap's seed [default: 0].",
    },
)
@param_options(
    "block_rows",
    "threads",
    defaults={"threads": None},
    helps={
        "block_rows": "Pairs (or corpus rows) per block read (default: about 16 MiB of pairs, 32 MiB of corpus).",
        "threads": "Retrieval: worker threads of the search (default: one per core, at most 4).",
    },
)
@quiet_option
@json_option
@objects(inputs=Inputs, search=Search, block_rows=block_rows_of, setting=Setting)
def eval_(
    model_path: str | None,
    inputs: Inputs,
    setting: Setting,
    search: Search,
    block_rows: int | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Score the raw vectors and, given MODEL_PATH, the whitened ones: on labelled pairs (Spearman and
    Pearson x100 of the cosines) or on a retrieval task (nDCG@10, recall@1/10/100, MRR@10 x100 of an
    exact cosine search).

    Give labelled pairs (--pairs-a, --pairs-b, --scores) or a retrieval task (--queries, --corpus,
    --qrels, optionally --exclude), not both. The model options override the model's own setting for this
    evaluation (the model file is not changed). For retrieval, every difference whitened minus raw comes
    with a paired bootstrap 95% interval (resamples of the queries, a fixed seed): an interval that holds 0
    is within noise.

    \b
    Examples:
      streamwhiten eval model.npz --pairs-a sts.h5:/a --pairs-b sts.h5:/b --scores sts-dev.csv:4
      streamwhiten eval model.npz --queries q.h5:/mean --corpus c.h5:/mean --qrels qrels.tsv \\
          --exclude exclude.tsv --dtype int8
    """
    from ..core.model import load_model

    mode = mode_of(inputs, search.given())
    changes = setting.given()
    if changes and model_path is None:
        raise BadInputError(f"--{next(iter(changes)).replace('_', '-')} and the other model options need a MODEL")
    model = load_model(model_path) if model_path else None
    if model is not None and changes:
        model = model.with_params(**changes)
    if mode == "pairs":
        emit(as_json, *_pairs(model, model_path, inputs, block_rows, quiet))
    else:
        emit(as_json, *_retrieval(model, model_path, inputs, search, block_rows, quiet))


def _pairs(
    model: WhiteningModel | None,
    model_path: str | None,
    inputs: Inputs,
    block_rows: int | None,
    quiet: bool,
) -> tuple[dict, list[str]]:
    """Score the pairs: the summary and its lines."""
    from ..evaluation.evaluate import evaluate_pairs, open_pairs

    assert inputs.pairs_a is not None and inputs.pairs_b is not None and inputs.scores is not None  # mode_of
    with open_pairs(inputs.pairs_a, inputs.pairs_b, inputs.scores) as pairs:
        with progress_bar("eval", quiet) as progress:
            result = evaluate_pairs(pairs, model, block_rows, progress)
    summary = replace(result, model=model_path).to_json()
    described, raw, white = result.pairs, result.raw, result.whitened
    lines = [
        f"pairs     {described.n_pairs:,} pairs of {described.n_features}-d vectors "
        f"(A {described.a}, B {described.b}, scores {described.scores})",
        f"raw       {fmt_scores(summary['raw'])}",
    ]
    if white is not None:
        shown = f"{fmt_scores(summary['whitened'])}   {fmt_setting(summary['whitened'])}"
        lines.append(f"whitened  {shown}  (Spearman {white.spearman - raw.spearman:+.2f} vs raw)")
        if white.code is not None:
            lines.append(
                f"code      whitened B stored as {white.code} ({white.bytes_per_vector:,} bytes per vector, "
                f"{white.model_bytes:,} per model): the cosine is the code's estimate, A float"
            )
    return summary, lines


def _retrieval(
    model: WhiteningModel | None,
    model_path: str | None,
    inputs: Inputs,
    search: Search,
    block_rows: int | None,
    quiet: bool,
) -> tuple[dict, list[str]]:
    """Score the retrieval task: the summary and its lines (a warning first where queries find themselves)."""
    from ..evaluation.retrieval import evaluate_retrieval, resolve_storage

    options = retrieval_options_of(inputs, block_rows, search.threads, search.bootstrap, search.seed)
    storage = resolve_storage(model, search.dtype, search.rescore, search.rescore_dtype, search.int8_clip)
    with progress_bar("eval", quiet) as progress:
        task = (inputs.queries, inputs.corpus, inputs.qrels)
        result = evaluate_retrieval(*task, model=model, storage=storage, options=options, progress=progress)
    result = replace(result, model=model_path)
    summary = result.to_json()
    warn_self_matches(summary["self_matches"], excluded=inputs.exclude is not None)
    return summary, retrieval_lines(result)


def retrieval_lines(result: RetrievalResult) -> list[str]:
    """The text of a retrieval evaluation: the task, the storage, each metric raw and whitened with the
    difference and its interval, and a plain verdict on nDCG@10."""
    from ..evaluation.retrieval import METRICS

    queries, corpus, qrels, exclude = result.queries, result.corpus, result.qrels, result.exclude
    raw, white, diff = result.raw, result.whitened, result.difference
    lines = [
        f"queries   {result.n_queries:,} with a relevant document (of {qrels.n_queries:,} judged) from {queries.label}",
        f"corpus    {corpus.n_rows:,} vectors of {corpus.n_features}-d from {corpus.label}",
        f"qrels     {qrels.qrels}: {qrels.n_pairs:,} judged pairs, {qrels.n_relevant:,} relevant"
        + (f"; exclude {exclude.exclude}: {exclude.n_pairs:,} pairs" if exclude else ""),
        f"storage   {_storage(raw)}: raw {raw.bytes_per_vector:,} bytes per vector"
        + (f", whitened {white.bytes_per_vector:,} (k={white.k})" if white else ""),
    ]
    if raw.model_bytes is not None:  # a code's rotations and codebooks: per model, not per vector
        own = ", the model's own codec)" if white and white.codec == "model" else ")"
        lines.append(
            f"codes     {raw.code}: per model {raw.model_bytes:,} bytes raw"
            + (f", {white.model_bytes:,} whitened ({white.code}{own}" if white else "")
            + (f"; trained on {raw.sample_rows:,} corpus rows (seed {raw.sample_seed})" if raw.sample_rows else "")
        )
    if white is None or diff is None:
        lines.append("metric        raw   (x100)")
        return lines + [f"{name:<10} {raw.metric(name):7.2f}" for name in METRICS]
    samples = result.bootstrap.samples
    lines.append(
        "metric        raw  whitened  whitened - raw"
        + (f" [95% interval, {samples:,} resamples of the queries]" if samples else " (no interval: --bootstrap 0)")
    )
    for name in METRICS:
        d = diff.metric(name)
        shown = fmt_interval(d.difference, d.low, d.high)
        lines.append(
            f"{name:<10} {raw.metric(name):7.2f}   {white.metric(name):7.2f}  {shown:<24} {noise(d.low, d.high)}"
        )
    lines.append(f"setting   {fmt_setting(white.to_json())}")
    return [*lines, "verdict   " + verdict(diff.ndcg_10, "nDCG@10")]


def verdict(d: Difference, name: str) -> str:
    """One sentence: whether whitening or raw wins on ``name``, or the difference is within noise."""
    shown = fmt_interval(d.difference, d.low, d.high)
    if d.low is None or d.high is None:
        return f"{name}: whitened {shown} vs raw; no interval to tell it from noise (--bootstrap 0)"
    if d.low > 0:
        return f"{name}: whitening wins, {shown}: the 95% interval is above 0"
    if d.high < 0:
        return f"{name}: raw wins, whitened {shown}: the 95% interval is below 0; keep the raw vectors"
    return f"{name}: within noise, {shown}: the 95% interval holds 0, so no difference was measured"


def _storage(scores: RetrievalScores) -> str:
    """How the corpus is stored, in words; the bytes of a re-ranking include the vectors it reads."""
    stored = f"code {scores.dtype}" if scores.code else "binary"
    if scores.rescore:
        return f"{stored}, the top {scores.rescore} re-ranked with {scores.rescore_dtype} vectors"
    return stored if scores.code else scores.dtype
