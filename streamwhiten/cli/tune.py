"""``streamwhiten tune``: choose beta, gamma and k (and, for search, the storage) from the saved statistics."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from ..errors import BadInputError
from ._common import (
    PAIR_METRICS,
    PAIRS,
    RETRIEVAL_METRICS,
    Inputs,
    emit,
    fmt_interval,
    fmt_scores,
    fmt_setting,
    grid_of,
    grid_options,
    mode_of,
    noise,
    number_list,
    open_pairs_given,
    pair_options,
    progress_bar,
    retrieval_options,
    retrieval_options_of,
    selection_lines,
    stop_on_signals,
)
from ._options import block_rows_of, json_option, objects, param_options, quiet_option
from ._warn import warn_self_matches
from .evaluate import SearchFlags

if TYPE_CHECKING:
    from ..core.model import WhiteningModel


@dataclass(frozen=True)
class Sweep(SearchFlags):
    """The options of a retrieval sweep, as parsed (None: not given; refused with labelled pairs): the
    budget, the storages and codes swept, and the options of a search."""

    max_bytes: int | None
    dtypes: str | None


class GeneratedHelp(click.Command):
    """A command whose help is made by ``make_help()`` when first shown: it names what the library's registries
    hold (the storages a sweep takes, the code families a budget adds), not imported to start."""

    def __init__(self, *args: Any, make_help: Callable[[], str], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.make_help: Callable[[], str] | None = make_help

    def get_help(self, ctx: click.Context) -> str:
        if self.make_help is not None:
            self.help, self.make_help = self.make_help(), None
        return super().get_help(ctx)


def _help() -> str:
    """tune's ``--help``: the storages from `STORAGES`, the code families a budget adds from `TUNE_CODES`."""
    from ..codes import TUNE_CODES
    from ..evaluation.sweep import STORAGES

    return f"""Choose beta, gamma and k for MODEL_PATH by grid search, from its saved statistics (no pass over
    the fitting data); for search, also how the corpus is stored.

    Labelled pairs (--pairs-a/--pairs-b/--scores): prints the table and the choice; held-out pairs
    (--test-a/--test-b/--test-scores) score the choice once, on pairs it was not chosen on.

    A retrieval task (--queries/--corpus/--qrels): every setting is searched in every storage of --dtypes
    ({", ".join(STORAGES)}) in one pass over the corpus; prints the frontier of bytes per vector and
    --metric, each against the raw float32 vectors with a paired 95% interval. --max-bytes B chooses within
    B bytes per vector and adds the vector codes of the raw unit vectors that fit B: {", ".join(TUNE_CODES)}
    (faiss-*: with faiss installed; what each is: streamwhiten codes --help).

    The choice (--select maxt) is the reference (the raw vectors, in the most faithful storage that fits)
    unless a setting beats it beyond the noise of all compared; a --folds cross-validated forecast says what
    both score on unseen queries (pairs). -o or --in-place saves it for apply, export and eval.

    \b
    Examples:
      streamwhiten tune model.npz --pairs-a dev.h5:/a --pairs-b dev.h5:/b --scores dev.h5:/score \\
          --in-place
      streamwhiten tune model.npz --queries q.h5:/mean --corpus c.h5:/mean --qrels qrels.tsv \\
          --exclude exclude.tsv --max-bytes 32 -o tuned.npz
    """


@click.command(cls=GeneratedHelp, make_help=_help)
@click.argument("model_path")
@pair_options(required=False, what="validation pairs")
@pair_options(required=False, prefix="test", scores="test-scores", what="held-out test pairs", brief=True)
@retrieval_options
@grid_options("to try", retrieval=True)
@click.option(
    "--tolerance",
    type=float,
    default=0.0,
    show_default=True,
    help="Take the cheapest setting (the smallest k; for retrieval the fewest bytes) surely within this many "
    "points (x100) of the reference (--select argmax: of the best).",
)
@click.option(
    "--select",
    "select_rule",
    type=click.Choice(["maxt", "argmax"]),
    default="maxt",
    show_default=True,
    help="maxt: keep the reference unless a setting beats it beyond the noise of all compared (a paired "
    "bootstrap of the maximum). argmax: the highest score, optimistic (the winner's curse), no forecast.",
)
@click.option(
    "--folds",
    type=click.IntRange(min=2),
    default=5,
    show_default=True,
    help="Folds of the queries (or pairs) for the forecast of what the choice will score.",
)
@click.option(
    "--eps", type=float, default=None, help="Regulariser relative to the largest eigenvalue (default: the model's)."
)
@param_options(
    "max_bytes",
    "rescore",
    "rescore_dtype",
    "int8_clip",
    "bootstrap",
    "seed",
    "threads",
    defaults={name: None for name in ("max_bytes", "rescore", "rescore_dtype", "int8_clip", "bootstrap", "seed")},
    helps={
        "max_bytes": "Retrieval: choose within this many bytes per corpus vector (bits plus the vectors a "
        "rescoring reads); adds the codes that fit (above). Default: no budget.",
        "rescore": "Retrieval: binary+rescore re-ranks the top N of the bit search [default: 100].",
        "rescore_dtype": "Retrieval: the vectors binary+rescore re-ranks with (their bytes count) [default: float32].",
        "int8_clip": "int8: the codes span each component's mean +- this many standard deviations [default: 4].",
        "bootstrap": "Retrieval: resamples of the queries for each interval [default: 1000].",
        "seed": "Retrieval: the bootstrap's seed [default: 0].",
        "threads": "Retrieval: worker threads of the search (default: one per core, at most 4).",
    },
)
@click.option(
    "--dtypes",
    default=None,
    metavar="LIST",
    help="Retrieval: the storages and code families to sweep, comma-separated [default: the storages above; "
    "with --max-bytes also the codes above].",
)
@click.option("-o", "--output", "output_path", default=None, help="Write the tuned model to this new file.")
@click.option("--in-place", is_flag=True, help="Write the chosen setting into MODEL_PATH itself.")
@click.option("--overwrite", is_flag=True, help="Let -o replace an existing model file written by streamwhiten.")
@param_options(
    "block_rows", helps={"block_rows": "Pairs (or corpus rows) per block read (default: about 16 MiB, 32 MiB)."}
)
@quiet_option
@json_option
@objects(inputs=Inputs, sweep=Sweep, block_rows=block_rows_of)
def tune(
    model_path: str,
    inputs: Inputs,
    sweep: Sweep,
    test_a: str | None,
    test_b: str | None,
    test_scores: str | None,
    betas: str | None,
    gammas: str | None,
    ks: str | None,
    variances: str | None,
    metric: str | None,
    tolerance: float,
    select_rule: str,
    folds: int,
    eps: float | None,
    output_path: str | None,
    in_place: bool,
    overwrite: bool,
    block_rows: int | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """The ``tune`` command; its help is `_help`'s."""
    from ..core.model import load_model

    test = Inputs(pairs_a=test_a, pairs_b=test_b, scores=test_scores)
    mode = mode_of(inputs, sweep.given())
    target = _checked_target(mode, metric, inputs, test, model_path, output_path, in_place, overwrite)
    model = load_model(model_path)
    metric = metric or ("spearman" if mode == "pairs" else "ndcg@10")
    grid = dict(grid_of(betas, gammas, ks, variances, metric, model.n_features), tolerance=tolerance, eps=eps)
    grid.update(select=select_rule, folds=folds)
    if mode == "pairs":
        chosen, summary = _pairs(model, inputs, test, grid, block_rows, quiet)
    else:
        chosen, summary = _retrieval(model, inputs, sweep, grid, block_rows, quiet)
    _save(chosen, summary, model_path, target, bool(in_place or overwrite))
    lines = (_lines if mode == "pairs" else retrieval_lines)(summary, model, chosen, target)
    emit(as_json, summary, lines)


def _checked_target(
    mode: str,
    metric: str | None,
    inputs: Inputs,
    test: Inputs,
    model_path: str,
    output_path: str | None,
    in_place: bool,
    overwrite: bool,
) -> str | None:
    """The file the tuned model goes to (None: none), checked before anything is read; clashing options refused."""
    from ..core.model import check_model_output

    if mode == "pairs" and metric in RETRIEVAL_METRICS:
        raise BadInputError(f"--metric {metric} is a retrieval metric; for pairs: {', '.join(PAIR_METRICS)}")
    if mode == "retrieval" and metric in PAIR_METRICS:
        raise BadInputError(f"--metric {metric} is a pair metric; for retrieval: {', '.join(RETRIEVAL_METRICS)}")
    if mode == "retrieval" and test.given(PAIRS):
        raise BadInputError("--test-a/--test-b/--test-scores are held-out pairs: give them with labelled pairs")
    if output_path and in_place:
        raise BadInputError("give -o/--output or --in-place, not both")
    if output_path:
        from ..io import refuse_input_overlap

        pairs = [inputs.pairs_a, inputs.pairs_b, inputs.scores, test.pairs_a, test.pairs_b, test.scores]
        read = [model_path, *pairs, inputs.queries, inputs.corpus, inputs.qrels, inputs.exclude]
        refuse_input_overlap({output_path: "tuned model (use --in-place to update the model itself)"}, read)
    if output_path or in_place:  # before any work: a .npz name, replacing only a model file of ours
        check_model_output(output_path or model_path, overwrite=bool(in_place or overwrite))
    return model_path if in_place else output_path


def _save(chosen: WhiteningModel, summary: dict, model_path: str, target: str | None, overwrite: bool) -> None:
    """Write the chosen model to ``target`` (if any; a signal lets the save finish: the file is whole or
    absent), and record in ``summary`` the model read and the file written."""
    from ..core.model import save_model

    if target:
        with stop_on_signals():
            summary["file_checksum"] = save_model(chosen, target, overwrite=overwrite)
    summary.update(model=model_path, written=target)


def _pairs(
    model: WhiteningModel, inputs: Inputs, test: Inputs, grid: dict[str, Any], block_rows: int | None, quiet: bool
) -> tuple[WhiteningModel, dict]:
    from ..evaluation.evaluate import open_pairs
    from ..evaluation.tune import PairGrid
    from ..evaluation.tune import tune as run_tune

    assert inputs.pairs_a is not None and inputs.pairs_b is not None and inputs.scores is not None  # mode_of
    flags = "--test-a, --test-b and --test-scores"
    with (
        open_pairs(inputs.pairs_a, inputs.pairs_b, inputs.scores) as pairs,
        open_pairs_given(test.pairs_a, test.pairs_b, test.scores, flags) or nullcontext() as test_pairs,
        progress_bar("tune", quiet) as progress,
    ):
        return run_tune(model, pairs, test_pairs, grid=PairGrid(**grid), block_rows=block_rows, progress=progress)


def _retrieval(
    model: WhiteningModel, inputs: Inputs, sweep: Sweep, grid: dict[str, Any], block_rows: int | None, quiet: bool
) -> tuple[WhiteningModel, dict]:
    from ..evaluation.sweep import SweepGrid
    from ..evaluation.sweep import sweep as run_sweep

    shared = ("rescore", "rescore_dtype", "int8_clip")
    given = {name: getattr(sweep, name) for name in shared if getattr(sweep, name) is not None}
    dtypes = number_list(sweep.dtypes, "dtypes", str) if sweep.dtypes is not None else None
    swept = SweepGrid(dtypes=dtypes, max_bytes=sweep.max_bytes, **given, **grid)
    options = retrieval_options_of(inputs, block_rows, sweep.threads, sweep.bootstrap, sweep.seed)
    with progress_bar("tune", quiet) as progress:
        result = run_sweep(
            model, inputs.queries, inputs.corpus, inputs.qrels, grid=swept, options=options, progress=progress
        )
    chosen, summary = result.tuned()
    warn_self_matches(summary["self_matches"], excluded=inputs.exclude is not None)
    return chosen, summary


def _lines(summary: dict, model: WhiteningModel, chosen: WhiteningModel, target: str | None) -> list[str]:
    """The text of a tuning on pairs: the table, raw, the choice, the highest, the test scores, what was written."""
    metric, tolerance = summary["metric"], summary["tolerance"]
    best, raw, highest = summary["best"], summary["raw"], summary["highest"]
    name = metric.capitalize()
    argmax = (summary.get("selection") or {}).get("rule") == "argmax"
    also = best is highest  # one dict per row of the table (`json_rows`)
    within = f"within {tolerance:g} of the top score" if argmax else f"surely within {tolerance:g} of raw"
    lines = [
        f"validation {summary['pairs']['n_pairs']:,} pairs of {model.n_features}-d vectors; "
        f"{len(summary['table'])} settings from the saved statistics of {model.n_rows:,} rows (no pass over the "
        "fitting data)",
        *table_lines(summary),
        f"raw        {fmt_scores(raw)}",
        f"chosen     {fmt_scores(best)}   {fmt_setting(best)}  "
        f"(chosen by the rule{', and highest on these pairs' if also else ''}; "
        f"{name} {best[metric] - raw[metric]:+.2f} vs raw{f'; smallest k {within}' if tolerance else ''})",
    ]
    if not also:
        lines.append(
            f"highest    {fmt_scores(highest)}   {fmt_setting(highest)}  (highest on these pairs, not chosen by "
            f"the rule; {name} {highest[metric] - raw[metric]:+.2f} vs raw)"
        )
    lines += selection_lines(summary.get("selection"), metric, "pairs")
    if summary["test"] is not None:
        test = summary["test"]
        lines.append(
            f"test       {test['pairs']['n_pairs']:,} pairs: raw {name} x100 {test['raw'][metric]:.2f}, "
            f"chosen {test['chosen'][metric]:.2f} ({test['chosen'][metric] - test['raw'][metric]:+.2f})"
        )
    if target:
        lines.append(f"wrote      {target} ({_setting_text(chosen)}); `apply` now uses this setting")
    else:
        lines.append("model not changed (pass -o NEW or --in-place to save the chosen setting)")
    return lines


def table_lines(result: dict[str, Any], what: str = "pairs") -> list[str]:
    """The grid as one line per (beta, gamma) with one column per k choice: the cell the rule chose
    starred, the one highest on these ``what`` marked ``^`` where it is another."""
    table, best, metric = result["table"], result["best"], result["metric"]
    highest = result["highest"]
    apart = highest is not best
    labels = list(dict.fromkeys(row["k_label"] for row in table if row.get("vectors") != "raw"))
    fractions = [label for label in labels if label.endswith("%")]
    width = 7
    head = " beta gamma |" + "".join(f"{label:>{width + 1}}" for label in labels)
    lines = [
        f"{metric.capitalize()} x100 by setting (columns: k; a percentage is the fewest components "
        f"explaining that much variance; *: chosen by the rule"
        + (f"; ^: highest on these {what}" if apart else "")
        + "):",
        head,
        "-" * len(head),
    ]
    rows: dict = {}
    for row in table:
        if row.get("vectors") != "raw":  # the raw vectors (no map) have their own line
            rows.setdefault((row["beta"], row["gamma"]), {})[row["k_label"]] = row
    for (beta, gamma), cells in rows.items():
        text = f"{beta:5g} {gamma:5g} |"
        for label in labels:
            row = cells.get(label)
            mark = "*" if row is best else "^" if apart and row is highest else " "
            text += f"{row[metric]:{width}.2f}{mark}" if row is not None else " " * (width + 1)
        if fractions:
            text += "   k=" + "/".join(str(cells[label]["k"]) for label in fractions if label in cells)
        lines.append(text)
    return lines


def _setting_text(model: WhiteningModel) -> str:
    if model.basis == "identity":
        return f"the raw vectors: no transformation, k={model.n_components}"
    return f"beta={model.beta:g} gamma={model.gamma:g} k={model.n_components}"


#: How the kinds of vectors are named in the frontier.
_VECTORS = {"raw": "raw (no map)", "rotated": "rotation", "centred": "centring", "whitened": ""}


def _row_text(row: dict, metric: str) -> str:
    setting = f"beta={row['beta']:g} gamma={row['gamma']:g}"
    what = "raw, unit, coded" if row.get("code") else _VECTORS[row["vectors"]] or setting
    retention = "" if row["retention"] is None else f"{row['retention']:6.1f}%"
    interval = fmt_interval(row["difference"], row["low"], row["high"])
    return (
        f"{row['bytes_per_vector']:>7,}  {row['storage']:<22} {what:<22} {row['k']:>5}  {row[metric]:7.2f}  "
        f"{retention:>7}  {interval:<24} {noise(row['low'], row['high'])}"
    )


def retrieval_lines(summary: dict, model: WhiteningModel, chosen: WhiteningModel, target: str | None) -> list[str]:
    """The text of a retrieval sweep: the task, the frontier, the budget and the choice, and what was written."""
    metric, raw = summary["metric"], summary["raw"]
    storages = sorted({row["storage"] for row in summary["table"]})
    settings = len(summary["table"]) // max(1, len(storages))
    lines = [
        f"retrieval  {summary['n_queries']:,} queries over {summary['corpus']['n_rows']:,} corpus vectors of "
        f"{model.n_features}-d; {settings} settings from the saved statistics of {model.n_rows:,} rows x "
        f"{len(storages)} storages ({', '.join(storages)})",
        f"raw        float32, {raw['bytes_per_vector']:,} bytes per vector: {metric} x100 {raw[metric]:.2f} "
        "(the reference of retention and of each interval)",
        f"frontier   the highest {metric} x100 at each number of bytes per vector (no setting does better with "
        "fewer or as many bytes):",
        f"  bytes  storage                vectors                    k  {metric:>7}  retain   vs raw float32 [95%]",
        *(_row_text(row, metric) for row in summary["frontier"]),
        *_choice_lines(summary),
        *selection_lines(summary.get("selection"), metric, "queries"),
        *_verdict_lines(summary),
    ]
    if target:
        storage = chosen.storage
        assert storage is not None  # a retrieval tuning records the storage it chose
        lines.append(
            f"wrote      {target} ({_setting_text(chosen)}, storage "
            f"{storage.label}); `apply`, `export` and `eval` now use them"
        )
    else:
        lines.append("model not changed (pass -o NEW or --in-place to save the chosen setting and storage)")
    return lines


def _choice_lines(summary: dict) -> list[str]:
    """The budget, the rule's choice, the highest where it is another, and the reference it was measured against."""
    metric, best, budget, tolerance = summary["metric"], summary["best"], summary["max_bytes"], summary["tolerance"]
    within = f"within {budget:,} bytes per vector" if budget is not None else "with no byte budget"
    argmax = (summary.get("selection") or {}).get("rule") == "argmax"
    near = (
        f"within {tolerance:g} points of the best" if argmax else f"surely within {tolerance:g} points of the reference"
    )
    lines = [f"chosen     {within}{f' (the fewest bytes {near})' if tolerance else ''}:"]
    highest = summary.get("highest")
    apart = highest is not None and highest is not best
    lines.append(_row_text(best, metric) + "  (chosen by the rule" + ("" if apart else ", and highest") + ")")
    if apart and highest is not None:
        lines += [
            f"highest    on these queries {within}, not chosen by the rule:",
            _row_text(highest, metric) + "  (highest on these queries)",
        ]
    reference = (summary.get("selection") or {}).get("reference")
    if reference:
        lines.append(
            f"reference  the raw vectors as {reference['storage']} at k={reference['k']}, "
            f"{reference['bytes_per_vector']:,} bytes per vector: the most faithful raw storage within the budget"
            if reference.get("vectors", "raw") == "raw"
            else f"reference  the rotation's first {reference['k']} components as {reference['storage']}, "
            f"{reference['bytes_per_vector']:,} bytes per vector (the raw vectors' sign bits do not fit the budget)"
        )
    return lines


#: What the text says where the raw vectors or plain centring win.
_WON = {
    "raw": "the raw vectors win: no whitening beats them (the model written holds no transformation)",
    "centred": "plain centring wins (beta=1 gamma=0 k=d: the mean removed, nothing rescaled or dropped)",
}


def _verdict_lines(summary: dict) -> list[str]:
    """What won (a code, the raw vectors, plain centring) and how the choice stands against raw float32."""
    raw, best, budget, pad = summary["raw"], summary["best"], summary["max_bytes"], " " * 11
    lines = []
    if best.get("code"):
        article = "an" if best["dtype"][0] in "aeio" else "a"
        coded = f"{best['bytes_per_vector']:,} bytes (its codec: {best['code']['model_bytes']:,} bytes per model)"
        wins = f"{article} {best['dtype']} code wins"
        lines.append(f"{pad}{wins}: the raw vectors scaled to unit length, coded in {coded}")
    elif best["vectors"] in _WON:
        lines.append(pad + _WON[best["vectors"]])
    if best["low"] is not None and best["low"] <= 0 <= best["high"]:
        fewer = raw["bytes_per_vector"] / best["bytes_per_vector"]
        lines.append(
            f"{pad}against raw float32 the difference is within noise; it stores {fewer:.1f}x fewer bytes per vector"
        )
    elif best["high"] is not None and best["high"] < 0:
        over = budget is not None and raw["bytes_per_vector"] > budget
        takes = f"; raw float32 takes {raw['bytes_per_vector']:,} bytes per vector (more than the budget)"
        takes = takes if over else ""
        lines.append(f"{pad}it loses to raw float32 beyond noise{takes}")
    return lines
