"""``streamwhiten apply``: parse, make the option objects, run the apply pipeline, print what it did."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import click

from ..options import ApplyOptions
from ._common import emit, fmt_rate, progress_bar, work
from ._options import given_names, param_options, pipeline_options, setting_options
from .codes import StorageType, code_names

if TYPE_CHECKING:
    from ..options import EngineOptions, ReadOptions, Setting

#: Apply options an engine may not take: refused when given on the command line (see ``Engine.check_apply``).
ENGINE_SPECIFIC = ("direct_io", "keep_columns", "compressor", "checksums")


@click.command()
@click.argument("model_path")
@click.argument("input_spec")
@click.option(
    "-o",
    "--output",
    "output_spec",
    required=True,
    help="Output store: out.h5[:/dataset], out.zarr[:/array], out.parquet[:column] or out.lance[:column].",
)
@click.option("--dataset", default=None, help="Dataset/array inside the input.")
@setting_options("apply")
@param_options("normalize")
@click.option(
    "--dtype",
    "dtype",
    type=StorageType(),
    default=None,
    help="The output values: float32 or float16; int8 codes of the unit vectors (a scale and offset per "
    "component, from the statistics) or binary sign bits (8 per byte), both normalized; or a vector code "
    f"NAME:BYTES of the unit vectors, NAME one of {code_names()} (e.g. eigen:24: the model's own code, "
    "else one trained from its statistics; streamwhiten codes --help). Each records how to decode it "
    "[default: the model's storage, else float32].",
)
@param_options(
    "block_rows",
    "zarr_format",
    "skip_nonfinite",
    helps={"skip_nonfinite": "Write NaN for input rows holding NaN/Inf instead of failing."},
)
@click.option(
    "--restart", is_flag=True, help="Discard the partial output of an interrupted run instead of resuming it."
)
@param_options("progress_seconds")
@click.option(
    "--checkpoint-seconds",
    "checkpoint_seconds",
    type=click.FLOAT,
    default=None,
    hidden=True,
    help="The former name of --progress-seconds.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace an existing output written by streamwhiten that is not up to date (one that is up to date "
    "is kept, with this flag too: exit 3, nothing to do; delete it to write it again).",
)
@param_options("fill_missing_chunks", "keep_columns", "compressor", "direct_io", "checksums")
@pipeline_options(ApplyOptions)
@click.pass_context
def apply(
    ctx: click.Context,
    model_path: str,
    input_spec: str,
    output_spec: str,
    checkpoint_seconds: float | None,
    read: ReadOptions,
    setting: Setting,
    options: ApplyOptions,
    engine: EngineOptions,
    quiet: bool,
    as_json: bool,
) -> None:
    """Transform every row of INPUT_SPEC with MODEL_PATH and write the reduced vectors to a new store.

    The model's saved setting (beta, gamma, k) is used unless changed here (re-finalized from its
    statistics, no pass over the data). An interrupted run leaves a hidden partial output that the
    same command resumes.

    \b
    Example:
      streamwhiten apply model.npz corpus.h5:/emb -o reduced.zarr -k 256 --normalize
    """
    from ..engine.engines import engine_for
    from ..pipeline import apply as run_apply
    from ..progress import Watch

    if checkpoint_seconds is not None and not given_names(ctx, ["progress_seconds"]):
        options = replace(options, progress_seconds=_checked_seconds(checkpoint_seconds, ctx))
    runner = engine_for(engine)
    # The Dask applier cannot stop its tasks at a block boundary: a signal interrupts it at once.
    with progress_bar("apply", quiet) as progress, work(stoppable=runner.stops_between_blocks) as should_stop:
        outcome = run_apply(
            model_path,
            input_spec,
            output_spec,
            setting=setting,
            options=options,
            read=read,
            engine=runner,
            given=given_names(ctx, ENGINE_SPECIFIC),
            watch=Watch(progress, should_stop),
        )
    normalised = " (L2-normalised)" if outcome.normalized else ""
    nonfinite = (
        f"; {outcome.n_nonfinite_rows:,} non-finite input rows written as NaN" if outcome.n_nonfinite_rows else ""
    )
    emit(
        as_json,
        outcome.to_json(),
        [
            f"wrote {outcome.n_rows:,} x {outcome.n_components} {outcome.dtype} vectors{normalised} to "
            f"{outcome.output} in {outcome.seconds:.2f} s ({fmt_rate(outcome.n_rows, outcome.seconds)}){nonfinite}"
        ],
    )


def _checked_seconds(value: float, ctx: click.Context) -> float:
    """``--checkpoint-seconds`` (the former name of ``--progress-seconds``), checked as that parameter."""
    from ..errors import BadInputError
    from ..params import check

    try:
        return float(check("progress_seconds", value))
    except BadInputError as exc:
        raise click.BadParameter(str(exc), ctx, param_hint="'--checkpoint-seconds'") from None
