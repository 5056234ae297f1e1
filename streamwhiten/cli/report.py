"""``streamwhiten report``: the spectrum, and with pairs how the score depends on beta, gamma and k."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..progress import phase
from ._common import (
    emit,
    fmt_scores,
    fmt_setting,
    grid_of,
    grid_options,
    open_pairs_given,
    pair_options,
    progress_bar,
    selection_lines,
    stop_on_signals,
)
from ._options import block_rows_of, json_option, objects, param_options, quiet_option

if TYPE_CHECKING:
    from ..evaluation.report import ReportData


@click.command()
@click.argument("model_path")
@pair_options(required=False, what="labelled pairs (optional: adds the heat maps and k curves)")
@click.option(
    "-o",
    "--output",
    "output_path",
    required=True,
    help="report.html (one page), report.png (one image) or a directory (one PNG per figure).",
)
@grid_options("of the heat maps")
@click.option("--title", default=None, help="Title of the HTML page.")
@click.option("--overwrite", is_flag=True, help="Replace existing report files written by streamwhiten.")
@param_options("block_rows", helps={"block_rows": "Pairs per block read (default: about 16 MiB of vectors)."})
@quiet_option
@json_option
@objects(block_rows=block_rows_of)
def report(
    model_path: str,
    pairs_a: str | None,
    pairs_b: str | None,
    scores: str | None,
    output_path: str,
    betas: str | None,
    gammas: str | None,
    ks: str | None,
    variances: str | None,
    metric: str,
    title: str | None,
    overwrite: bool,
    block_rows: int | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Draw MODEL_PATH's eigenvalue spectrum and explained variance; with pairs, how the score depends on beta, gamma, k;
    for a model tuned for retrieval (tune --queries ...), the frontier of bytes per vector and score it was chosen from.

    Needs matplotlib (pip install 'streamwhiten[report]'); renders without a display.

    \b
    Example:
      streamwhiten report model.npz -o report.html \\
          --pairs-a dev.h5:/a --pairs-b dev.h5:/b --scores dev.h5:/score
    """
    from ..core.model import load_model
    from ..evaluation.report import check_output, collect, retrieval_record, write_report
    from ..evaluation.tune import PairGrid
    from ..io import refuse_input_overlap

    refuse_input_overlap({output_path: "report"}, [model_path, pairs_a, pairs_b, scores], nested=False)
    with_pairs = any(spec is not None for spec in (pairs_a, pairs_b, scores))
    model = load_model(model_path)
    check_output(output_path, with_pairs, overwrite, retrieval_record(model) is not None)
    grid = PairGrid(**grid_of(betas, gammas, ks, variances, metric, model.n_features))
    pairs = open_pairs_given(pairs_a, pairs_b, scores, "--pairs-a, --pairs-b and --scores")
    with progress_bar("report", quiet) as progress:
        try:
            data = collect(model, pairs, grid, block_rows=block_rows, progress=progress)
        finally:
            if pairs is not None:
                pairs.close()
        with stop_on_signals(), phase(progress, "draw and write the report", None):  # a signal lets it finish
            written = write_report(data, output_path, overwrite, title)
    emit(as_json, *_summary(model_path, data, written))


def _summary(model_path: str, data: ReportData, written: list[str]) -> tuple[dict, list[str]]:
    """The report's summary (``--json``) and its lines: the effective dimension, the choice on the pairs
    and on the retrieval tuning the model records, and the files written."""
    model = data.model
    summary = {"model": model_path, "files": written, "effective_dimension": model.effective_dimension}
    lines = [f"D_eff      {model.effective_dimension:.1f} of d={model.n_features}"]
    raw = best = highest = None
    if data.grid is not None:
        raw, best = data.grid.raw, data.grid.best.to_json()
        highest = best if data.grid.highest is data.grid.best else data.grid.highest.to_json()
        lines += _grid_lines(raw, best, highest)
    tuned = data.tuned or {}
    summary.update(raw=raw, best=best, highest=highest)
    summary.update(frontier=tuned.get("frontier"), selection=tuned.get("selection"))
    lines += _retrieval_choice(tuned) if tuned else []
    lines += [f"wrote      {path}" for path in written]
    return summary, lines


def _grid_lines(raw: dict, best: dict, highest: dict) -> list[str]:
    """Raw, the rule's choice and the setting highest on the pairs where it is another."""
    lines = [
        f"raw        {fmt_scores(raw)}",
        f"chosen     {fmt_scores(best)}   {fmt_setting(best)}  (chosen by the rule"
        + (", and highest on these pairs)" if highest is best else ")"),
    ]
    if highest is not best:
        lines.append(f"highest    {fmt_scores(highest)}   {fmt_setting(highest)}  (highest on these pairs)")
    return lines


def _retrieval_choice(record: dict) -> list[str]:
    """The retrieval tuning the model records: its frontier, its choice, the setting highest on its queries
    where that is another, and the rule's record."""
    from ..evaluation.report import highest_apart

    metric, setting = record["metric"], record["setting"]
    score = record["validation"]["chosen"][metric]
    highest = highest_apart(record)
    lines = [
        f"frontier   {len(record['frontier'])} settings, from the retrieval tuning the model records",
        f"chosen     {setting['dtype']} beta={setting['beta']:g} gamma={setting['gamma']:g} k={setting['k']}, "
        f"{setting['bytes_per_vector']:,} bytes per vector: {metric} x100 {score:.2f} (chosen by the rule"
        + (")" if highest else ", and highest on these queries)"),
    ]
    if highest is not None:
        lines.append(
            f"highest    {highest['storage']} beta={highest['beta']:g} gamma={highest['gamma']:g} k={highest['k']}, "
            f"{highest['bytes_per_vector']:,} bytes per vector: {metric} x100 {highest[metric]:.2f} "
            "(highest on these queries)"
        )
    return lines + selection_lines(record.get("selection"), metric, "queries")
