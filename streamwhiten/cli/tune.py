"""``streamwhiten tune``: choose beta, gamma and k on labelled pairs, from the saved statistics."""

from __future__ import annotations

import click

from ..errors import BadInputError
from ._common import (
    emit,
    fmt_scores,
    fmt_setting,
    grid_of,
    grid_options,
    open_pairs_given,
    pair_options,
    progress_bar,
    stop_on_signals,
)
from ._options import json_option, param_options, pop_param, quiet_option


@click.command()
@click.argument("model_path")
@pair_options(required=True, what="validation pairs")
@pair_options(required=False, prefix="test", scores="test-scores", what="held-out test pairs")
@grid_options("to try")
@click.option(
    "--tolerance",
    type=float,
    default=0.0,
    show_default=True,
    help="Prefer the smallest k scoring within this many points (x100) of the best.",
)
@click.option(
    "--eps", type=float, default=None, help="Regulariser relative to the largest eigenvalue (default: the model's)."
)
@click.option("-o", "--output", "output_path", default=None, help="Write the tuned model to this new file.")
@click.option("--in-place", is_flag=True, help="Write the chosen setting into MODEL_PATH itself.")
@click.option("--overwrite", is_flag=True, help="Let -o replace an existing model file written by streamwhiten.")
@param_options("block_rows", helps={"block_rows": "Pairs per block read (default: about 16 MiB of vectors)."})
@quiet_option
@json_option
def tune(
    model_path,
    pairs_a,
    pairs_b,
    scores,
    test_a,
    test_b,
    test_scores,
    output_path,
    in_place,
    overwrite,
    quiet,
    as_json,
    **values,
):
    """Choose beta, gamma and k for MODEL_PATH on labelled validation pairs, by grid search.

    The model's saved statistics give Sigma_beta for every beta in closed form, so the fitting data is
    not read again: each beta costs one eigendecomposition, shared by all its gammas and ks, and the
    pairs are read once. Prints the whole table and the best setting; with -o or --in-place the chosen
    setting is saved so that `apply` uses it. Give --test-a/--test-b/--test-scores to score the choice
    once, after it is made, on pairs it was not chosen on (next to raw on the same pairs).

    \b
    Example:
      streamwhiten tune model.npz --pairs-a dev.h5:/a --pairs-b dev.h5:/b --scores dev.h5:/score --in-place
    """
    from ..core.model import check_model_output, load_model, save_model
    from ..evaluation.evaluate import open_pairs
    from ..evaluation.tune import tune as run_tune

    if output_path and in_place:
        raise BadInputError("give -o/--output or --in-place, not both")
    if output_path:
        from ..io import refuse_input_overlap

        refuse_input_overlap(
            {output_path: "tuned model (use --in-place to update the model itself)"},
            [model_path, pairs_a, pairs_b, scores, test_a, test_b, test_scores],
        )
    if output_path or in_place:  # before any work: a .npz name, replacing only a model file of ours
        check_model_output(output_path or model_path, overwrite=bool(in_place or overwrite))
    model = load_model(model_path)
    block_rows = pop_param(values, "block_rows")
    tolerance = values.pop("tolerance")
    grid = dict(grid_of(values, model.n_features), tolerance=tolerance, eps=values.pop("eps"))
    with open_pairs(pairs_a, pairs_b, scores) as pairs:
        test_pairs = open_pairs_given(test_a, test_b, test_scores, "--test-a, --test-b and --test-scores")
        try:
            with progress_bar("tune", quiet) as progress:
                chosen, summary = run_tune(model, pairs, test_pairs, block_rows, progress, **grid)
        finally:
            if test_pairs is not None:
                test_pairs.close()
    target = model_path if in_place else output_path
    if target:
        with stop_on_signals():  # a signal lets the save finish: the file is whole or absent
            summary["file_checksum"] = save_model(chosen, target, overwrite=bool(in_place or overwrite))
    summary["model"] = model_path
    summary["written"] = target
    emit(as_json, summary, _lines(summary, model, chosen, grid["metric"], tolerance, target))


def _lines(summary: dict, model, chosen, metric: str, tolerance: float, target) -> list[str]:
    best, raw = summary["best"], summary["raw"]
    name = metric.capitalize()
    lines = [
        f"validation {summary['pairs']['n_pairs']:,} pairs of {model.n_features}-d vectors; "
        f"{len(summary['table'])} settings from the saved statistics of {model.n_rows:,} rows (no pass over the "
        "fitting data)",
        *table_lines(summary),
        f"raw        {fmt_scores(raw)}",
        f"{'best' if not tolerance else 'chosen':<10} {fmt_scores(best)}   {fmt_setting(best)}  "
        f"({name} {best[metric] - raw[metric]:+.2f} vs raw"
        + (f"; smallest k within {tolerance:g} of the top score)" if tolerance else ")"),
    ]
    if summary["test"] is not None:
        test = summary["test"]
        lines.append(
            f"test       {test['pairs']['n_pairs']:,} pairs: raw {name} x100 {test['raw'][metric]:.2f}, "
            f"chosen {test['chosen'][metric]:.2f} ({test['chosen'][metric] - test['raw'][metric]:+.2f})"
        )
    if target:
        lines.append(
            f"wrote      {target} (beta={chosen.beta:g} gamma={chosen.gamma:g} k={chosen.n_components}); "
            f"`apply` now uses this setting"
        )
    else:
        lines.append("model not changed (pass -o NEW or --in-place to save the chosen setting)")
    return lines


def table_lines(result) -> list[str]:
    """The grid as one line per (beta, gamma) with one column per k choice; the best cell starred."""
    table, best, metric = result["table"], result["best"], result["metric"]
    labels = list(dict.fromkeys(row["k_label"] for row in table))
    fractions = [label for label in labels if label.endswith("%")]
    width = 7
    head = " beta gamma |" + "".join(f"{label:>{width + 1}}" for label in labels)
    lines = [
        f"{metric.capitalize()} x100 by setting (columns: k; a percentage is the fewest components "
        f"explaining that much variance):",
        head,
        "-" * len(head),
    ]
    rows: dict = {}
    for row in table:
        rows.setdefault((row["beta"], row["gamma"]), {})[row["k_label"]] = row
    for (beta, gamma), cells in rows.items():
        text = f"{beta:5g} {gamma:5g} |"
        for label in labels:
            row = cells.get(label)
            mark = "*" if row is best else " "
            text += f"{row[metric]:{width}.2f}{mark}" if row is not None else " " * (width + 1)
        if fractions:
            text += "   k=" + "/".join(str(cells[label]["k"]) for label in fractions if label in cells)
        lines.append(text)
    return lines
