"""``streamwhiten eval``: score a model (or the raw vectors) on labelled pairs."""

from __future__ import annotations

import click

from ..errors import BadInputError
from ._common import emit, fmt_scores, fmt_setting, pair_options, progress_bar
from ._options import json_option, param_options, pop_param, quiet_option, setting_options, take


@click.command(name="eval")
@click.argument("model_path", required=False)
@pair_options(required=True)
@setting_options("eval")
@param_options("block_rows", helps={"block_rows": "Pairs per block read (default: about 16 MiB of vectors)."})
@quiet_option
@json_option
def eval_(model_path, pairs_a, pairs_b, scores, quiet, as_json, **values):
    """Score cosine similarity of labelled pairs: Spearman and Pearson (x100), raw and whitened by MODEL_PATH.

    Without MODEL_PATH only the raw vectors are scored. The model options override the model's own
    setting for this evaluation (the model file is not changed).

    \b
    Example:
      streamwhiten eval model.npz --pairs-a sts.h5:/a --pairs-b sts.h5:/b --scores sts-dev.csv:4
    """
    from ..core.model import load_model
    from ..evaluation.evaluate import evaluate_pairs, open_pairs
    from ..options import Setting

    block_rows = pop_param(values, "block_rows")
    changes = take(Setting, values).given()
    if changes and model_path is None:
        raise BadInputError(f"--{next(iter(changes)).replace('_', '-')} and the other model options need a MODEL")
    model = load_model(model_path) if model_path else None
    if model is not None and changes:
        model = model.with_params(**changes)
    with open_pairs(pairs_a, pairs_b, scores) as pairs:
        with progress_bar("eval", quiet) as progress:
            result = evaluate_pairs(pairs, model, block_rows, progress)
    summary = dict(result, model=model_path)
    described = result["pairs"]
    lines = [
        f"pairs     {described['n_pairs']:,} pairs of {described['n_features']}-d vectors "
        f"(A {described['a']}, B {described['b']}, scores {described['scores']})",
        f"raw       {fmt_scores(result['raw'])}",
    ]
    if result["whitened"] is not None:
        white = result["whitened"]
        delta = white["spearman"] - result["raw"]["spearman"]
        lines.append(f"whitened  {fmt_scores(white)}   {fmt_setting(white)}  (Spearman {delta:+.2f} vs raw)")
    emit(as_json, summary, lines)
