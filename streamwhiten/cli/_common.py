"""What commands share: the summary (text or ``--json``), progress, signals, options and formats."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from ..errors import BadInputError, StoreIOError
from . import _interrupt

if TYPE_CHECKING:
    from ..options import RetrievalOptions


def emit(as_json: bool, summary: dict, lines: list[str]) -> None:
    """Print the command's summary: ``lines`` of text, or ``summary`` as JSON with ``--json``."""
    _interrupt.hold()  # the command's work is done: a signal now cannot undo it
    text = json.dumps(strict_json(summary), indent=2, sort_keys=True, allow_nan=False) if as_json else "\n".join(lines)
    try:
        click.echo(text)
        sys.stdout.flush()
    except OSError as exc:
        raise StoreIOError(
            f"standard output: cannot write the summary: {exc.strerror or exc} (the command itself completed)"
        ) from exc


def strict_json(value: object):
    """Plain JSON values: arrays become lists, and NaN/Infinity (not valid JSON) become null."""
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if hasattr(value, "tolist"):
        return strict_json(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@contextmanager
def progress_bar(description: str, quiet: bool):
    """The progress reporter (`Console`): bars on a terminal, else a timed line per phase; None with ``--quiet``."""
    if quiet:
        yield None
        return
    from ._progress import Console

    console = Console(description, terminal=sys.stdout.isatty() and sys.stderr.isatty())
    try:
        yield console
    finally:
        console.close()


#: The work of a command, as signals meet it (`_interrupt.work`).
work = _interrupt.work


def stop_on_signals():
    """`work` that stops at its next safe point; also what lets a save finish before a signal acts."""
    return work(stoppable=True)


def fmt_rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds:,.0f} rows/s" if seconds > 0 else "-"


def fmt_scores(scores: dict) -> str:
    return f"Spearman x100 {scores['spearman']:6.2f}   Pearson x100 {scores['pearson']:6.2f}"


def fmt_setting(row: dict) -> str:
    text = f"beta={row['beta']:g} gamma={row['gamma']:g} k={row['k']}"
    if row.get("vectors") == "raw":
        text = f"the raw vectors (no transformation), k={row['k']}"
    if row.get("variance") is not None:
        text += f" ({row['variance']:.0%} variance)"
    return text


def pair_options(
    required: bool, prefix: str = "pairs", scores: str = "scores", what: str = "labelled pairs", brief: bool = False
):
    """``--<prefix>-a/--<prefix>-b/--<scores>``: aligned stores and gold scores (``brief``: shorter help)."""
    names = (f"{prefix}_a", f"{prefix}_b", scores.replace("-", "_"))
    formats = (
        ("", " (as --scores)")
        if brief
        else (
            " (file.h5:/dataset, dir.zarr, file.npy, file.parquet:column, dir.lance:column)",
            " (a 1-D dataset, .npy, or a column of a CSV or TSV file: file.csv:NAME by its header, "
            "file.tsv:INDEX counted from 0, every line data)",
        )
    )

    def decorate(func: Callable[..., Any]):
        for flag, name, text in reversed(
            [
                (f"--{prefix}-a", names[0], f"Vectors A of the {what}{formats[0]}."),
                (f"--{prefix}-b", names[1], f"Vectors B of the {what}, row-aligned with A."),
                (f"--{scores}", names[2], f"Gold score of each of the {what}{formats[1]}."),
            ]
        ):
            func = click.option(flag, name, required=required, default=None, metavar="SPEC", help=text)(func)
        return func

    return decorate


#: The options of a retrieval task, by parameter name.
RETRIEVAL = ("queries", "corpus", "qrels", "exclude", "query_ids", "corpus_ids")
PAIRS = ("pairs_a", "pairs_b", "scores")


def retrieval_options(func: Callable[..., Any]):
    """``--queries/--corpus/--qrels/--exclude/--query-ids/--corpus-ids``: a retrieval task."""
    for flag, name, metavar, text in reversed(
        [
            ("--queries", "queries", "SPEC", "Query vectors (a store spec, as fit takes them), read whole."),
            ("--corpus", "corpus", "SPEC", "Corpus vectors, streamed in blocks (a store spec)."),
            (
                "--qrels",
                "qrels",
                "FILE",
                "Relevance judgements: BEIR's qrels TSV, header query-id<TAB>corpus-id<TAB>score (or the same "
                "columns comma-separated in a .csv); ids are 0-based rows, or values of --query-ids/--corpus-ids.",
            ),
            (
                "--exclude",
                "exclude",
                "FILE",
                "Pairs never returned, a TSV or CSV file with the header query-id, corpus-id (e.g. each query's own "
                "text in the corpus).",
            ),
            ("--query-ids", "query_ids", "COLUMN", "Parquet/Lance queries: the column holding the ids the qrels use."),
            ("--corpus-ids", "corpus_ids", "COLUMN", "Parquet/Lance corpus: the column holding the ids the qrels use."),
        ]
    ):
        func = click.option(flag, name, default=None, metavar=metavar, help=text)(func)
    return func


@dataclass(frozen=True)
class Inputs:
    """The specs a command scores or tunes on (None: not given): labelled pairs or a retrieval task."""

    pairs_a: str | None = None
    pairs_b: str | None = None
    scores: str | None = None
    queries: str | None = None
    corpus: str | None = None
    qrels: str | None = None
    exclude: str | None = None
    query_ids: str | None = None
    corpus_ids: str | None = None

    def given(self, names: tuple[str, ...]) -> list[str]:
        """Those of the options ``names`` that were given."""
        return [name for name in names if getattr(self, name) is not None]


def named(**values: object) -> tuple[str, ...]:
    """The names of the options among ``values`` that were given (not None)."""
    return tuple(name for name, value in values.items() if value is not None)


def retrieval_options_of(
    inputs: Inputs, block_rows: int | None, threads: int | None, bootstrap: int | None, seed: int | None
) -> RetrievalOptions:
    """The retrieval task's options as a `RetrievalOptions` (one not given keeps its default)."""
    from ..options import RetrievalOptions

    return RetrievalOptions(
        exclude=inputs.exclude,
        query_id_column=inputs.query_ids,
        corpus_id_column=inputs.corpus_ids,
        block_rows=block_rows,
        threads=threads,
        **{name: value for name, value in (("bootstrap", bootstrap), ("seed", seed)) if value is not None},
    )


def mode_of(inputs: Inputs, search_given: tuple[str, ...] = ()) -> str:
    """``"pairs"`` or ``"retrieval"``, whichever was given whole (``search_given`` are refused with pairs)."""
    pairs = inputs.given(PAIRS)
    task = inputs.given(RETRIEVAL)
    if pairs and task:
        raise BadInputError(
            "give labelled pairs (--pairs-a, --pairs-b, --scores) or a retrieval task (--queries, --corpus, "
            f"--qrels), not both (got {_flags(pairs[:1] + task[:1])})"
        )
    if not pairs and not task:
        raise BadInputError(
            "give labelled pairs (--pairs-a, --pairs-b, --scores) or a retrieval task (--queries, --corpus, --qrels)"
        )
    if pairs:
        if len(pairs) < 3:
            raise BadInputError("give all three of --pairs-a, --pairs-b and --scores")
        if search_given:
            raise BadInputError(
                f"{_flags(search_given[:1])} is for a retrieval task (--queries, --corpus, --qrels): labelled pairs "
                "choose the map, a stored corpus's storage and codes are chosen by searching it"
            )
        return "pairs"
    missing = [name for name in ("queries", "corpus", "qrels") if getattr(inputs, name) is None]
    if missing:
        raise BadInputError(f"a retrieval task needs --queries, --corpus and --qrels (missing {_flags(missing)})")
    return "retrieval"


def _flags(names: Iterable[str]) -> str:
    return ", ".join("--" + name.replace("_", "-") for name in names)


def noise(low: float | None, high: float | None) -> str:
    """What a paired interval of a difference says: better, worse, or within noise (it holds 0)."""
    if low is None or high is None:
        return "no interval (--bootstrap 0)"
    if low > 0:
        return "better, beyond noise"
    if high < 0:
        return "worse, beyond noise"
    return "within noise"


def fmt_interval(value: float, low: float | None, high: float | None, sign: str = "+") -> str:
    if low is None or high is None:
        return f"{value:{sign}.2f}"
    return f"{value:{sign}.2f} [{low:{sign}.2f}, {high:{sign}.2f}]"


def open_pairs_given(a: str | None, b: str | None, scores: str | None, flags: str):
    """Open a pair set when all three specs are given; ``None`` when none is; an error when only some are."""
    from ..evaluation.evaluate import open_pairs

    if a is None and b is None and scores is None:
        return None
    if a is None or b is None or scores is None:
        raise BadInputError(f"give all three of {flags}, or none")
    return open_pairs(a, b, scores)


def number_list(text: str | None, name: str, cast: Callable[[str], Any] = float, n_features: int | None = None):
    """``None`` for an option not given; else the comma-separated numbers (``d`` = the data width for k)."""
    if text is None:
        return None
    values = []
    for item in text.replace(" ", ",").split(","):
        if not item:
            continue
        if cast is int and item == "d" and n_features is not None:
            values.append(n_features)
            continue
        try:
            values.append(cast(item))
        except ValueError:
            raise BadInputError(f"--{name}: {item!r} is not {'an integer' if cast is int else 'a number'}") from None
    return values


#: The metrics of labelled pairs, and of retrieval.
PAIR_METRICS = ("spearman", "pearson")
RETRIEVAL_METRICS = ("ndcg@10", "recall@1", "recall@10", "recall@100", "mrr@10")


def grid_options(purpose: str, retrieval: bool = False):
    """``--betas/--gammas/--ks/--variances/--metric``: tune's and report's grid (``retrieval``: its metrics too)."""
    metric = (
        click.option(
            "--metric",
            type=click.Choice(PAIR_METRICS + RETRIEVAL_METRICS),
            default=None,
            help="What the choice maximises [default: spearman for pairs, ndcg@10 for retrieval].",
        )
        if retrieval
        else click.option("--metric", type=click.Choice(list(PAIR_METRICS)), default="spearman", show_default=True)
    )

    lists = [
        ("--betas", f"Betas {purpose}, comma-separated [default: 0,0.25,0.5,0.75,1]."),
        ("--gammas", f"Gammas {purpose} [default: 0,0.25,0.5,0.75,1]."),
        (
            "--ks",
            f"Component counts k {purpose}; 'd' is the full width [default: d and the powers of two from 8 below it].",
        ),
        ("--variances", f"Explained-variance fractions {purpose}, each as a k [default: 0.9,0.95,0.99; '' for none]."),
    ]

    def decorate(func: Callable[..., Any]):
        func = metric(func)
        for flag, text in reversed(lists):
            func = click.option(flag, default=None, metavar="LIST", help=text)(func)
        return func

    return decorate


def grid_of(
    betas: str | None,
    gammas: str | None,
    ks: str | None,
    variances: str | None,
    metric: str | None,
    n_features: int,
) -> dict[str, Any]:
    """The grid options parsed as the keyword arguments of the tuning grid."""
    return dict(
        betas=number_list(betas, "betas"),
        gammas=number_list(gammas, "gammas"),
        ks=number_list(ks, "ks", int, n_features),
        variances=number_list(variances, "variances"),
        metric=metric,
    )


def selection_lines(record: dict | None, metric: str, what: str) -> list[str]:
    """How the choice was made (``record``: a `Selection`'s JSON) and the forecast of its score on unseen ``what``."""
    from ..evaluation.select import Selection

    selection = Selection.from_json(record)
    if selection is None:
        return []
    lines = []
    tolerance, level = selection.tolerance, f"{100 * selection.level:g}%"
    if selection.rule == "maxt":
        if not tolerance:
            verdict = (
                "nothing beats the reference beyond noise: the reference is kept"
                if selection.kept_reference
                else f"chosen: the highest simultaneous {level} lower bound of the advantage, {selection.bound:+.2f}"
            )
        else:
            verdict = (
                f"nothing cheaper is surely within {tolerance:g} points of it: the reference is kept"
                if selection.kept_reference
                else f"chosen: the cheapest setting surely within {tolerance:g} points of it (simultaneous {level} "
                f"lower bound of the advantage {selection.bound:+.2f})"
            )
        lines.append(
            f"rule       max-t: {selection.n_beating} of {selection.n_compared} settings beat the reference "
            f"beyond the noise of all {selection.n_compared} compared; {verdict}"
        )
    elif tolerance:
        lines.append(
            f"rule       argmax: the cheapest setting within {tolerance:g} points of the best score of all "
            "(optimistic: the best of many noisy scores); no forecast"
        )
    else:
        lines.append(
            "rule       argmax: the best score of all (optimistic: the best of many noisy scores); no forecast"
        )
    predicted = selection.forecast
    if predicted:
        difference = predicted["difference"]
        change = fmt_interval(difference["score"], difference["low"], difference["high"])
        chosen, reference = (
            fmt_interval(p["score"], p["low"], p["high"], "") for p in (predicted["chosen"], predicted["reference"])
        )
        lines.append(
            f"forecast   {metric} x100 on {what} not chosen on ({predicted['folds']}-fold cross-validation of the "
            f"rule): chosen {chosen}, reference {reference}, "
            f"difference {change}; the reference kept in {predicted['kept_reference']} of {predicted['folds']} folds"
        )
    return lines
