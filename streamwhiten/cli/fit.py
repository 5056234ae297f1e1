"""``streamwhiten fit``: parse, make the option objects, run the fit pipeline, print what it did."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..errors import BadInputError
from ..options import FitOptions
from ._common import emit, fmt_rate, progress_bar, stop_on_signals, work
from ._options import param_options, pipeline_options, setting_options

if TYPE_CHECKING:
    from ..options import EngineOptions, ReadOptions, Setting
    from ..pipeline import FitOutcome


@click.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option(
    "-o", "--output", "model_path", default=None, help="Model file to write (.npz); default with --update: that model."
)
@click.option(
    "--dataset",
    default=None,
    help="Dataset/array/column inside each input (else file.h5:/dataset, file.parquet:column).",
)
@setting_options("fit")
@param_options("precision", "block_rows", "skip_nonfinite")
@click.option(
    "--update",
    "update",
    default=None,
    metavar="MODEL",
    help="Fold only rows appended since MODEL was fitted (and new inputs) into its statistics.",
)
@click.option("--checkpoint", default=None, help="Checkpoint file (default: .MODEL.checkpoint beside the model).")
@param_options("checkpoint_every", "checkpoint_seconds")
@click.option("--resume", is_flag=True, help="Require a checkpoint to resume from (a matching one is used anyway).")
@click.option("--restart", is_flag=True, help="Discard an existing checkpoint and start over.")
@click.option("--overwrite", is_flag=True, help="Replace an existing model file (one written by streamwhiten).")
@param_options("fill_missing_chunks")
@pipeline_options(FitOptions)
def fit(
    inputs: tuple[str, ...],
    model_path: str | None,
    update: str | None,
    read: ReadOptions,
    setting: Setting,
    options: FitOptions,
    engine: EngineOptions,
    quiet: bool,
    as_json: bool,
) -> None:
    """Fit a whitening model on one or more stores (HDF5, Zarr, .npy, Parquet, Lance; globs and directories
    of Parquet shards allowed) in one pass.

    Progress is checkpointed; a fit that was killed resumes where it stopped when run again.

    \b
    Example:
      streamwhiten fit 'shards/day-*.h5:/emb' -o model.npz -k 256
      streamwhiten fit 'shards/day-*.h5:/emb' --update model.npz
    """
    from ..engine.engines import engine_for
    from ..pipeline import fit as run_fit
    from ..progress import Watch

    if model_path is None and update is None:
        raise BadInputError("give the model file to write with -o/--output")
    runner = engine_for(engine)
    # The serial engine stops at its next block on a signal (checkpointed); a Dask fit cannot, so a
    # signal stops it at once, and only its save lets a signal wait (the file is whole or absent).
    with progress_bar("fit", quiet) as progress, work(stoppable=runner.stops_between_blocks) as should_stop:
        outcome = run_fit(
            list(inputs),
            model_path,
            setting=setting,
            options=options,
            read=read,
            engine=runner,
            update=update,
            watch=Watch(progress, should_stop, stop_on_signals),
        )
    summary = outcome.to_json()
    emit(as_json, summary, _lines(outcome, summary, update))


def _lines(outcome: FitOutcome, summary: dict, update: str | None) -> list[str]:
    """What a fit read, the setting it finalized and the file it wrote."""
    model = outcome.model
    done = f"updated {update} with {outcome.rows_read:,} new rows" if update else f"fitted {model.n_rows:,} rows"
    rate = fmt_rate(outcome.rows_read, outcome.read_seconds)
    return [
        f"{done} x {model.n_features} features from {outcome.n_sources} source(s) "
        f"in {outcome.read_seconds:.2f} s ({rate})"
        + (" (resumed)" if outcome.resumed else "")
        + (f"; skipped {outcome.n_skipped:,} non-finite rows" if outcome.n_skipped else ""),
        f"beta={model.beta:g} gamma={model.gamma:g} k={model.n_components} "
        f"(explained variance {summary['explained_variance']:.4f}), D_eff={model.effective_dimension:.1f}",
        f"wrote {outcome.model_path}",
    ]
