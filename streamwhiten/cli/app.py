"""The ``streamwhiten`` command line: the only place that prints, draws progress bars or exits.

Every library error is a :class:`~streamwhiten.errors.StreamwhitenError` carrying its exit code; it
is reported here as one line on stderr (``streamwhiten: error: ...``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import time
from contextlib import contextmanager

import click

from .. import __version__
from ..errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_IO,
    BadInputError,
    InterruptedRunError,
    NothingToDoError,
    StoreIOError,
    StreamwhitenError,
)
from ..params import PARAMS
from . import _interrupt


class SpecType(click.ParamType):
    """An option whose value is checked against :data:`streamwhiten.params.PARAMS`, as in Python and in
    job files: ``Invalid value for '--beta': beta must be a number in [0, 1], got 1.5`` (exit 2)."""

    def __init__(self, name: str):
        self.param = PARAMS[name]
        self.name = self.param.kind.__name__

    def convert(self, value, param, ctx):
        if isinstance(value, str) and self.param.kind in (int, float):
            try:
                value = self.param.kind(value)
            except ValueError:
                pass  # refused below, in the parameter's own words
        try:
            return self.param.check(value)
        except BadInputError as exc:
            self.fail(str(exc), param, ctx)


class SpecChoice(click.Choice):
    """A parameter with choices (listed in ``--help``), refused in the words of :data:`PARAMS`."""

    def __init__(self, name: str):
        self.param = PARAMS[name]
        super().__init__(list(self.param.choices))

    def convert(self, value, param, ctx):
        try:
            return self.param.check(value)
        except BadInputError as exc:
            self.fail(str(exc), param, ctx)


def spec_type(name: str) -> click.ParamType:
    """The click type of parameter ``name``, checked against :data:`PARAMS`."""
    return SpecChoice(name) if PARAMS[name].kind is str else SpecType(name)


PRECISION = spec_type("precision")


# ------------------------------------------------------------------------------------------- helpers


def _emit(ctx_json: bool, summary: dict, lines: list[str]) -> None:
    _interrupt.hold()  # the command's work is done: a signal now cannot undo it
    text = (
        json.dumps(_strict_json(summary), indent=2, sort_keys=True, allow_nan=False) if ctx_json else "\n".join(lines)
    )
    try:
        click.echo(text)
        sys.stdout.flush()
    except OSError as exc:
        raise StoreIOError(
            f"standard output: cannot write the summary: {exc.strerror or exc} (the command itself completed)"
        ) from exc


def _strict_json(value):
    """Plain JSON values: arrays become lists, and NaN/Infinity (not valid JSON) become null."""
    if isinstance(value, dict):
        return {str(k): _strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(v) for v in value]
    if hasattr(value, "tolist"):
        return _strict_json(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@contextmanager
def progress_bar(description: str, quiet: bool):
    """A ``progress(done, total)`` callback drawing a tqdm bar (rows/s, ETA) on stderr.

    Silent with ``--quiet`` or when stdout is not a terminal (cron, pipes, CI).
    """
    enabled = not quiet and sys.stdout.isatty() and sys.stderr.isatty()
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(desc=description, unit="rows", unit_scale=True, dynamic_ncols=True, leave=False, file=sys.stderr)

    def update(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        bar.close()


def _model_params(beta, gamma, n_components, variance, eps) -> dict:
    params = {}
    for name, value in (
        ("beta", beta),
        ("gamma", gamma),
        ("n_components", n_components),
        ("variance", variance),
        ("eps", eps),
    ):
        if value is not None:
            params[name] = value
    return params


def _fmt_rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds:,.0f} rows/s" if seconds > 0 else "-"


common_quiet = click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
common_json = click.option("--json", "as_json", is_flag=True, help="Print a machine-readable JSON summary.")


def model_options(func):
    for option in reversed(
        [
            click.option(
                "--beta",
                type=spec_type("beta"),
                default=None,
                help="Mean removal in [0, 1] (1: centre, 0: rotate about 0).",
            ),
            click.option(
                "--gamma",
                type=spec_type("gamma"),
                default=None,
                help="Whitening strength in [0, 1] (1: unit variance, 0: rotation).",
            ),
            click.option(
                "-k",
                "--n-components",
                type=spec_type("n_components"),
                default=None,
                help="Kept dimensions k (default: all).",
            ),
            click.option(
                "--variance",
                type=spec_type("variance"),
                default=None,
                help="Keep the fewest components explaining this fraction, e.g. 0.99.",
            ),
            click.option(
                "--eps",
                type=spec_type("eps"),
                default=None,
                help=f"Regulariser relative to the largest eigenvalue (default {PARAMS['eps'].default:g}).",
            ),
        ]
    ):
        func = option(func)
    return func


def engine_options(func):
    for option in reversed(
        [
            click.option(
                "--engine",
                type=click.Choice(["serial", "dask"]),
                default="serial",
                show_default=True,
                help="serial: this process; dask: a Dask cluster (needs streamwhiten[dask]), see docs/dask.md.",
            ),
            click.option(
                "--scheduler",
                default=None,
                metavar="ADDRESS",
                help="With --engine dask: the scheduler to use, e.g. tcp://host:8786 (default: a local cluster).",
            ),
            click.option(
                "--workers",
                type=spec_type("workers"),
                default=None,
                help="With --engine dask and no --scheduler: processes of the local cluster (default: one per core).",
            ),
            click.option(
                "--threads",
                type=spec_type("threads"),
                default=None,
                help="Serial engine: worker threads, each doing whole blocks (fit default: one per core, at most "
                "4; apply default: 1). Memory is about one block per thread.",
            ),
        ]
    ):
        func = option(func)
    return func


def _check_engine(engine: str, scheduler, workers, threads=None) -> None:
    if engine != "dask" and (scheduler or workers is not None):
        raise BadInputError("--scheduler and --workers need --engine dask")
    if engine == "dask" and threads is not None:
        raise BadInputError("--threads is for the serial engine; with --engine dask, use --workers")
    if scheduler and workers is not None:
        raise BadInputError("--workers sizes a local cluster; it cannot be combined with --scheduler")


# ------------------------------------------------------------------------------------------ commands


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="streamwhiten")
def cli():
    """Fit and apply whitening transforms to embedding stores larger than memory."""


def stop_on_signals():
    """The work of a command that can stop cleanly: the first SIGINT/SIGTERM asks the library to stop at
    its next safe point (between blocks, before a save), where it saves its progress and raises an
    interruption; a second one stops at once. Yields ``should_stop``. Once the block has ended, the work
    is complete: a signal is then only recorded (see ``_interrupt.work``)."""
    return _interrupt.work(stoppable=True)


def unstoppable_work():
    """The work of a command that cannot stop at a safe point (the Dask engine's tasks): a signal
    interrupts it at once; once the block has ended, the work is complete (see ``_interrupt.work``)."""
    return _interrupt.work(stoppable=False)


def _parse_storage_options(ctx, param, value):
    """``--storage-option KEY=VALUE`` given: the storage options (``remote.options_from``), whose secret
    values every message hides from now on."""
    if not value:
        return {}
    from ..io import remote

    options = remote.options_from(value)
    remote.remember_secrets(options)
    return options


def read_options(storage_options=None, remote_timeout=None):
    """The :class:`~streamwhiten.options.ReadOptions` of ``--storage-option`` and ``--remote-timeout``
    (the deadline: ``STREAMWHITEN_REMOTE_TIMEOUT``, else the default, where not given)."""
    from ..options import ReadOptions

    if remote_timeout is None:
        return ReadOptions(storage_options=storage_options or None)
    return ReadOptions(storage_options=storage_options or None, remote_timeout=remote_timeout)


storage_option = click.option(
    "--storage-option",
    "storage_options",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_parse_storage_options,
    help="An option of the file system of s3://, gs://, https:// ... inputs and outputs (repeatable), passed to "
    "fsspec, e.g. endpoint_url=http://127.0.0.1:9000 or anon=true; values are JSON where they parse. The "
    "standard environment (AWS_ENDPOINT_URL, AWS_PROFILE, ...) applies too. Never printed or recorded.",
)


remote_timeout_option = click.option(
    "--remote-timeout",
    type=spec_type("remote_timeout"),
    default=None,
    metavar="SECONDS",
    help="How long an s3://, gs://, https:// ... store may keep failing (refused connections, timeouts, 5xx "
    f"answers) before the command gives up, exit 74 [default: {PARAMS['remote_timeout'].default:g}; or "
    "STREAMWHITEN_REMOTE_TIMEOUT]. The retries of every layer (s3fs, botocore, zarr, Lance) fit in it.",
)


fill_missing_option = click.option(
    "--fill-missing-chunks",
    is_flag=True,
    help="Read chunks missing from an input store (Zarr) or never written (HDF5) as the array's fill value. "
    "Without it such a store is refused: a hole is usually a damaged or half-copied store.",
)


@cli.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option(
    "-o", "--output", "model_path", default=None, help="Model file to write (.npz); default with --update: that model."
)
@click.option(
    "--dataset",
    default=None,
    help="Dataset/array/column inside each input (else file.h5:/dataset, file.parquet:column).",
)
@model_options
@click.option(
    "--precision", type=PRECISION, default="auto", show_default=True, help="Arithmetic of the scatter product."
)
@click.option(
    "--chunk-rows",
    type=spec_type("chunk_rows"),
    default=None,
    help="Rows per block read (default: whole store chunks, ~64 MiB).",
)
@click.option("--skip-nonfinite", is_flag=True, help="Skip and count rows holding NaN/Inf instead of failing.")
@click.option(
    "--update",
    "update",
    default=None,
    metavar="MODEL",
    help="Fold only rows appended since MODEL was fitted (and new inputs) into its statistics.",
)
@click.option("--checkpoint", default=None, help="Checkpoint file (default: .MODEL.checkpoint beside the model).")
@click.option(
    "--checkpoint-every",
    type=spec_type("checkpoint_every"),
    default=PARAMS["checkpoint_every"].default,
    show_default=True,
    help="Checkpoint every N blocks.",
)
@click.option(
    "--checkpoint-seconds",
    type=spec_type("checkpoint_seconds"),
    default=PARAMS["checkpoint_seconds"].default,
    show_default=True,
    help="... or every T seconds.",
)
@click.option("--resume", is_flag=True, help="Require a checkpoint to resume from (a matching one is used anyway).")
@click.option("--restart", is_flag=True, help="Discard an existing checkpoint and start over.")
@click.option("--overwrite", is_flag=True, help="Replace an existing model file.")
@fill_missing_option
@storage_option
@remote_timeout_option
@engine_options
@common_quiet
@common_json
def fit(
    inputs,
    model_path,
    dataset,
    beta,
    gamma,
    n_components,
    variance,
    eps,
    precision,
    chunk_rows,
    skip_nonfinite,
    update,
    checkpoint,
    checkpoint_every,
    checkpoint_seconds,
    resume,
    restart,
    overwrite,
    fill_missing_chunks,
    storage_options,
    remote_timeout,
    engine,
    scheduler,
    workers,
    threads,
    quiet,
    as_json,
):
    """Fit a whitening model on one or more stores (HDF5, Zarr, .npy, Parquet, Lance; globs and directories
    of Parquet shards allowed) in one pass.

    Progress is checkpointed; a fit that was killed resumes where it stopped when run again.
    """
    from ..batch import fit_job, save_fitted
    from ..io import expand_specs

    _check_engine(engine, scheduler, workers, threads)
    if model_path is None:
        if update is None:
            raise BadInputError("give the model file to write with -o/--output")
        model_path = update
    params = _model_params(beta, gamma, n_components, variance, eps)
    began = time.perf_counter()
    # The serial engine stops at its next block on a signal (checkpointed); a Dask fit cannot, so a
    # signal stops it at once, and only its save lets a signal wait (the file is whole or absent).
    signals = stop_on_signals() if engine == "serial" else unstoppable_work()
    with progress_bar("fit", quiet) as progress, signals as should_stop:
        model, fitted, resumed, checkpoint = fit_job(
            expand_specs(inputs),
            model_path,
            dataset,
            params,
            precision,
            chunk_rows,
            skip_nonfinite,
            update,
            checkpoint,
            checkpoint_every,
            checkpoint_seconds,
            restart,
            resume,
            progress,
            should_stop,
            threads,
            fill_missing_chunks,
            engine=engine,
            scheduler=scheduler,
            workers=workers,
            overwrite=overwrite,
            read=read_options(storage_options, remote_timeout),
        )
        with contextlib.nullcontext(should_stop) if engine == "serial" else stop_on_signals() as saving:
            checksum = save_fitted(model, fitted, model_path, checkpoint, saving)
    result = fitted.result() if engine == "serial" else fitted
    n_sources = len(fitted.cursors) if engine == "serial" else len(result.sources)
    rows_read, read_seconds, n_skipped = result.rows_read, result.seconds, result.n_skipped
    seconds = time.perf_counter() - began
    summary = dict(
        model.summary(),
        model=model_path,
        file_checksum=checksum,
        seconds=seconds,
        rows_read=rows_read,
        resumed=resumed,
        updated=update is not None,
        engine=engine,
        rows_per_second=rows_read / read_seconds if read_seconds > 0 else None,
    )
    summary.pop("sources")
    what = f"updated {update} with {rows_read:,} new rows" if update else f"fitted {model.n_rows:,} rows"
    _emit(
        as_json,
        summary,
        [
            f"{what} x {model.n_features} features from {n_sources} source(s) "
            f"in {read_seconds:.2f} s ({_fmt_rate(rows_read, read_seconds)})"
            + (" (resumed)" if resumed else "")
            + (f"; skipped {n_skipped:,} non-finite rows" if n_skipped else ""),
            f"beta={model.beta:g} gamma={model.gamma:g} k={model.n_components} "
            f"(explained variance {summary['explained_variance']:.4f}), D_eff={model.effective_dimension:.1f}",
            f"wrote {model_path}",
        ],
    )


@cli.command()
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
@model_options
@click.option("--normalize", is_flag=True, help="Scale every output row to unit L2 norm.")
@click.option("--dtype", type=spec_type("dtype"), default=PARAMS["dtype"].default, show_default=True)
@click.option("--chunk-rows", type=spec_type("chunk_rows"), default=None, help="Rows per block read.")
@click.option(
    "--zarr-format",
    type=click.Choice([str(v) for v in PARAMS["zarr_format"].choices]),
    default=str(PARAMS["zarr_format"].default),
    show_default=True,
)
@click.option("--skip-nonfinite", is_flag=True, help="Write NaN for input rows holding NaN/Inf instead of failing.")
@click.option(
    "--restart", is_flag=True, help="Discard the partial output of an interrupted run instead of resuming it."
)
@click.option(
    "--checkpoint-seconds",
    type=spec_type("progress_seconds"),
    default=PARAMS["progress_seconds"].default,
    show_default=True,
    help="Make the rows written durable and record them for a resume every T seconds (0: every block).",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing output (one that is up to date is kept: exit 3).")
@fill_missing_option
@click.option(
    "--keep-columns",
    default=None,
    metavar="NAMES",
    help="Copy these comma-separated input columns (Parquet or Lance input) into the Parquet or Lance "
    "output, row for row beside the vectors, e.g. --keep-columns id,url.",
)
@click.option(
    "--compressor",
    type=click.Choice(["none", "zstd", "blosc", "gzip"]),
    default="none",
    show_default=True,
    help="Serial engine, HDF5 or Zarr output: compress each output chunk in the writer thread (zstd level 3, "
    "blosc lz4 level 5 with byte shuffle, or gzip level 4 with shuffle on HDF5), readable by plain zarr "
    "and h5py (HDF5 zstd and blosc: with hdf5plugin installed).",
)
@click.option(
    "--direct-io/--no-direct-io",
    default=None,
    help="Serial engine: write whole output chunks around the page cache (O_DIRECT, where the file system "
    "allows it; the default): no CPU spent copying, and the cached input is left alone. "
    "--no-direct-io leaves the output in the page cache, e.g. for a program that reads it right after.",
)
@storage_option
@remote_timeout_option
@engine_options
@common_quiet
@common_json
def apply(
    model_path,
    input_spec,
    output_spec,
    dataset,
    beta,
    gamma,
    n_components,
    variance,
    eps,
    normalize,
    dtype,
    chunk_rows,
    zarr_format,
    skip_nonfinite,
    restart,
    checkpoint_seconds,
    overwrite,
    fill_missing_chunks,
    keep_columns,
    compressor,
    direct_io,
    storage_options,
    remote_timeout,
    engine,
    scheduler,
    workers,
    threads,
    quiet,
    as_json,
):
    """Transform every row of INPUT_SPEC with MODEL_PATH and write the reduced vectors to a new store.

    An interrupted run leaves a hidden partial output that the same command resumes.
    """
    from ..core.model import load_model
    from ..engine.apply import apply_model
    from ..io import refuse_input_overlap

    _check_engine(engine, scheduler, workers, threads)
    refuse_input_overlap({output_spec: "output"}, [input_spec, model_path])
    if engine == "dask" and direct_io is not None:
        raise BadInputError("--direct-io/--no-direct-io is for the serial engine (Dask workers write through zarr)")
    if engine == "dask" and keep_columns:
        raise BadInputError("--keep-columns is for the serial engine (the Dask engine writes Zarr)")
    if engine == "dask" and compressor != "none":
        raise BadInputError("--compressor is for the serial engine (the Dask engine writes uncompressed Zarr)")
    model = load_model(model_path)
    params = _model_params(beta, gamma, n_components, variance, eps)
    if params:
        model = model.with_params(**params)
    # The Dask applier cannot stop its tasks at a block boundary: a signal interrupts it at once.
    signals = stop_on_signals() if engine != "dask" else unstoppable_work()
    with progress_bar("apply", quiet) as progress, signals as should_stop:
        # apply_dask is apply_model on a cluster: the options they share are passed once.
        shared = dict(
            dataset=dataset,
            normalize=normalize,
            dtype=dtype,
            block_rows=chunk_rows,
            overwrite=overwrite,
            skip_nonfinite=skip_nonfinite,
            zarr_format=int(zarr_format),
            progress=progress,
            fill_missing_chunks=fill_missing_chunks,
            read=read_options(storage_options, remote_timeout),
        )
        if engine == "dask":
            from ..engine.distributed import apply_dask

            summary = apply_dask(model, input_spec, output_spec, scheduler=scheduler, n_workers=workers, **shared)
        else:
            summary = apply_model(
                model,
                input_spec,
                output_spec,
                should_stop=should_stop,
                resume=not restart,
                progress_seconds=checkpoint_seconds,
                threads=threads,
                direct_io=direct_io is not False,
                keep_columns=keep_columns,
                compressor=compressor,
                **shared,
            )
    _emit(
        as_json,
        summary,
        [
            f"wrote {summary['n_rows']:,} x {summary['n_components']} {summary['dtype']} vectors"
            f"{' (L2-normalised)' if normalize else ''} to {summary['output']} in {summary['seconds']:.2f} s "
            f"({_fmt_rate(summary['n_rows'], summary['seconds'])})"
            + (
                f"; {summary['n_nonfinite_rows']:,} non-finite input rows written as NaN"
                if summary["n_nonfinite_rows"]
                else ""
            ),
        ],
    )


@cli.command()
@click.argument("model_path")
@common_json
def info(model_path, as_json):
    """Print a model's parameters, spectrum summary and effective dimension."""
    from ..core.model import file_checksum, load_model

    model = load_model(model_path)
    summary = dict(model.summary(), model=model_path, file_checksum=file_checksum(model))
    eigvals = model.eigvals
    top = ", ".join(f"{v:.4g}" for v in eigvals[:5])
    ladder = summary["components_for_variance"]
    lines = [
        f"model      {model_path} (streamwhiten model, d={model.n_features})",
        f"fitted on  {model.n_rows:,} rows"
        + (
            f" ({model.info['n_skipped_nonfinite']:,} non-finite skipped)"
            if model.info.get("n_skipped_nonfinite")
            else ""
        ),
        f"transform  beta={model.beta:g} gamma={model.gamma:g} k={model.n_components} eps={model.eps:g} "
        f"(absolute {model.eps_value:.3g})" + (f" variance>={model.variance:g}" if model.variance else ""),
        f"spectrum   largest {top}; smallest {eigvals[-1]:.4g}; condition number {summary['condition_number']:.4g}",
        f"explained  {summary['explained_variance']:.4f} of the variance by the k kept components",
        "k for      " + ", ".join(f"{float(v):.0%}: {k}" for v, k in ladder.items()),
        f"D_eff      {summary['effective_dimension']:.1f} (exp of the entropy of the normalised eigenvalues)",
        f"checksum   {summary['model_checksum']} (model_checksum: the map at this setting, as apply and export "
        "record it)",
    ]
    for source in model.sources:
        lines.append(f"source     {source.where} ({source.n_rows:,} x {source.n_features} {source.dtype})")
    _emit(as_json, summary, lines)


#: The formats of ``export`` (streamwhiten.export.FORMATS, not imported here to keep the CLI's start light).
EXPORT_FORMATS = ("npz", "safetensors", "sentence-transformers", "faiss", "onnx")


@cli.command(name="export")
@click.argument("model_path")
@click.option(
    "-o",
    "--output",
    "output_path",
    required=True,
    help="File to write (.npz, .safetensors, .onnx, .faiss), or a directory for sentence-transformers.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(EXPORT_FORMATS),
    default=None,
    help="Output format (default: from the extension of -o, else sentence-transformers with --append-to).",
)
@model_options
@click.option("--normalize", is_flag=True, help="Follow the map by L2 normalisation (as apply --normalize).")
@click.option(
    "--append-to",
    default=None,
    metavar="ST_MODEL_DIR",
    help="sentence-transformers: write a copy of this local model with the whitening modules appended.",
)
@click.option(
    "--index",
    "index_factory",
    default=None,
    metavar="FACTORY",
    help="faiss: write an empty IndexPreTransform around this index_factory index (e.g. Flat, HNSW32).",
)
@click.option(
    "--metric",
    type=click.Choice(["ip", "l2"]),
    default=None,
    help="faiss --index: its metric [default: ip with --normalize, else l2].",
)
@click.option(
    "--insert",
    type=click.Choice(["auto", "before-normalize", "end"]),
    default="auto",
    show_default=True,
    help="--append-to a model ending in Normalize: put the whitening instead of it (before-normalize: it "
    "takes the vectors before Normalize) or after it (end); auto tells from the norm of the rows the model "
    "was fitted on, and refuses when it cannot.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace an existing export of this format written by streamwhiten (one that is up to date is kept: exit 3).",
)
@common_json
def export_(
    model_path,
    output_path,
    fmt,
    beta,
    gamma,
    n_components,
    variance,
    eps,
    normalize,
    append_to,
    index_factory,
    metric,
    insert,
    overwrite,
    as_json,
):
    """Write MODEL_PATH's whitening, y = x A + b (+ L2 normalisation), where queries are embedded.

    Formats: npz (plain arrays A, b, mean; streamwhiten.serving or numpy alone), safetensors (an
    nn.Linear state dict), sentence-transformers (Dense + Normalize modules, or with --append-to a
    whitened copy of a local model), faiss (a LinearTransform, or with --index an empty index that
    whitens what it is given), onnx (MatMul + Add, dynamic batch). Queries whitened this way meet a
    corpus whitened by `apply` with the same model and settings. See docs/serving.md.
    """
    from dataclasses import replace

    from ..core.model import check_params, load_model
    from ..export import check_available, check_options, export, format_for
    from ..io import refuse_input_overlap
    from ..serving import file_checksum

    insert = None if insert == "auto" else insert
    fmt = format_for(output_path, fmt, append_to)
    check_options(fmt, normalize, append_to, index_factory, metric, insert)
    params = _model_params(beta, gamma, n_components, variance, eps)
    check_params(**params)
    refuse_input_overlap({output_path: "export"}, [model_path, append_to])
    check_available(fmt)
    model = load_model(model_path)
    affine = model.as_affine(normalize=normalize, **params)
    stored = file_checksum(model_path)
    if stored:  # the checksum in the file (the same unless another streamwhiten version wrote it)
        affine = replace(affine, file_checksum=stored)
    with stop_on_signals():  # a signal lets the export finish (it has no point to stop at before its rename)
        summary = export(
            affine,
            output_path,
            fmt,
            overwrite=overwrite,
            append_to=append_to,
            index=index_factory,
            metric=metric,
            insert=insert,
        )
    summary["model"] = model_path
    what = {
        "faiss": f"faiss {summary.get('faiss')}",
        "sentence-transformers": "sentence-transformers modules " + ", ".join(summary.get("modules") or []),
    }.get(fmt, fmt)
    where = {"end": " appended to ", "before-normalize": " inserted before the Normalize of "}
    lines = [
        f"wrote {output_path} ({what}{where[summary['insert']] + append_to if append_to else ''})",
        f"map   y = x A + b{' then L2 normalisation' if affine.normalize else ''}: {affine.n_features} -> "
        f"{affine.n_components} dimensions, beta={affine.beta:g} gamma={affine.gamma:g} eps={affine.eps:g}",
        f"from  {model_path} (model_checksum {affine.checksum[:16]}, the map's, as apply records it)",
    ]
    if summary.get("needs_training"):
        lines.append(
            f"note  the {index_factory} index needs training before add: index.train(vectors) whitens them first"
        )
    _emit(as_json, summary, lines)


@cli.command()
@click.option(
    "--rows", type=click.IntRange(min=2), default=100_000, show_default=True, help="Rows of the generated store."
)
@click.option(
    "--dim", type=click.IntRange(min=1), default=256, show_default=True, help="Width d of the generated store."
)
@click.option(
    "-k", "--n-components", type=spec_type("n_components"), default=64, show_default=True, help="Kept dimensions."
)
@click.option(
    "--chunk-rows",
    type=spec_type("chunk_rows"),
    default=8192,
    show_default=True,
    help="Chunk rows of the generated store.",
)
@click.option(
    "--dir", "workdir", default=None, help="Keep the files in this directory (default: a temporary one, removed)."
)
@click.option("--seed", type=int, default=0, show_default=True)
@common_quiet
@common_json
def demo(rows, dim, n_components, chunk_rows, workdir, seed, quiet, as_json):
    """Run the whole job on a built-in example: generate a store, fit, apply with k < d, check."""
    import tempfile

    from ..params import check_model
    from .demo import run_demo

    check_model(n_components=n_components, n_features=dim)
    if workdir is not None and os.path.exists(workdir) and not os.path.isdir(workdir):
        raise click.BadParameter(f"{workdir} is a file, not a directory", param_hint="'--dir'")
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="streamwhiten-demo-") as tmp:
            summary = _run_demo(run_demo, tmp, rows, dim, n_components, chunk_rows, seed, quiet)
    else:
        os.makedirs(workdir, exist_ok=True)
        summary = _run_demo(run_demo, workdir, rows, dim, n_components, chunk_rows, seed, quiet)
    t = summary["seconds"]
    _emit(
        as_json,
        summary,
        [
            f"0. numba kernels compiled (first run) or loaded from cache  [{t['compile']:.2f} s]",
            f"1. generated {summary['rows']:,} x {summary['dim']} float32 anisotropic embeddings "
            f"({summary['n_chunks']} chunks of {chunk_rows} rows) in {summary['input']}  [{t['generate']:.2f} s]",
            f"2. fitted in one streaming pass: {_fmt_rate(summary['rows'], t['fit'])}, "
            f"D_eff={summary['effective_dimension']:.1f}, k={summary['k']} keeps "
            f"{summary['explained_variance']:.1%} of the variance  [{t['fit']:.2f} s]",
            f"3. applied to {summary['output']}: {summary['rows']:,} x {summary['k']} L2-normalised float32 "
            f"({_fmt_rate(summary['rows'], t['apply'])})  [{t['apply']:.2f} s]",
            f"4. checked: mean cosine of random pairs {summary['mean_cosine_raw']:.3f} raw -> "
            f"{summary['mean_cosine_whitened']:.3f} whitened; output covariance (before normalising) is identity "
            f"to {summary['identity_error']:.1e}",
            f"done in {t['total']:.2f} s" + (f"; files kept in {workdir}" if workdir else ""),
        ],
    )


def _run_demo(run_demo, directory, rows, dim, k, chunk_rows, seed, quiet):
    with progress_bar("demo", quiet) as progress:
        return run_demo(directory, rows, dim, k, chunk_rows, seed, progress)


@cli.command()
@click.argument("job_file")
@click.option("--log-file", default=None, help="Also append timestamped log lines to this file.")
@click.option("--restart", is_flag=True, help="Discard the checkpoint of an interrupted run instead of finishing it.")
@storage_option
@remote_timeout_option
@common_quiet
@common_json
def run(job_file, log_file, restart, storage_options, remote_timeout, quiet, as_json):
    """Run a batch job (job.toml): fit or update, finalize, apply; each step skipped when up to date.

    Exit codes: 0 done, 3 nothing to do, 2 bad input, 74 I/O error (disk full: the previous checkpoint or
    output is kept), 75 another run holds the lock, 130 interrupted.
    """
    from ..batch import default_checkpoint, job_read_options, read_job_file, run_job_file
    from ..io import expand_specs, refuse_input_overlap

    logging.getLogger("streamwhiten").setLevel(logging.INFO)
    read = read_options(storage_options, remote_timeout)
    if log_file:
        spec = read_job_file(job_file)
        inputs = expand_specs(spec.inputs, job_read_options(spec, read))
        refuse_input_overlap({log_file: "log file"}, [job_file, *inputs])
        refuse_input_overlap(
            {log_file: "log file"}, [spec.model_path, default_checkpoint(spec.model_path), spec.lock_path], nested=False
        )
        try:
            handler = _LogFileHandler(log_file)
        except OSError as exc:
            raise StoreIOError(f"{log_file}: cannot open the log file: {exc.strerror or exc}") from exc
        handler.setFormatter(logging.Formatter(LOG_FORMAT, LOG_DATE))
        logging.getLogger("streamwhiten").addHandler(handler)
    with progress_bar("run", quiet) as progress, stop_on_signals() as should_stop:
        summary = run_job_file(job_file, progress, should_stop, restart, read=read)
    _emit(as_json, summary, [f"job {summary['job']}: " + "; ".join(summary["steps"])])


# ---- evaluation and tuning (issue 5)


def _pair_options(required: bool, prefix: str = "pairs", scores: str = "scores", what: str = "labelled pairs"):
    """``--<prefix>-a/--<prefix>-b/--<scores>``: two aligned vector stores and their gold scores."""
    names = (f"{prefix}_a", f"{prefix}_b", scores.replace("-", "_"))

    def decorate(func):
        for flag, name, text in reversed(
            [
                (
                    f"--{prefix}-a",
                    names[0],
                    f"Vectors A of the {what} (file.h5:/dataset, dir.zarr, file.npy, "
                    "file.parquet:column, dir.lance:column).",
                ),
                (f"--{prefix}-b", names[1], f"Vectors B of the {what}, row-aligned with A."),
                (f"--{scores}", names[2], f"Gold score of each of the {what} (a 1-D dataset or .npy)."),
            ]
        ):
            func = click.option(flag, name, required=required, default=None, metavar="SPEC", help=text)(func)
        return func

    return decorate


def _open_pairs_given(a, b, scores, flags: str):
    """Open a pair set when all three specs are given; ``None`` when none is; an error when only some are."""
    from ..evaluation.evaluate import open_pairs

    given = [spec is not None for spec in (a, b, scores)]
    if not any(given):
        return None
    if not all(given):
        raise BadInputError(f"give all three of {flags}, or none")
    return open_pairs(a, b, scores)


def _fmt_scores(scores: dict) -> str:
    return f"Spearman x100 {scores['spearman']:6.2f}   Pearson x100 {scores['pearson']:6.2f}"


def _fmt_setting(row: dict) -> str:
    text = f"beta={row['beta']:g} gamma={row['gamma']:g} k={row['k']}"
    if row.get("variance") is not None:
        text += f" ({row['variance']:.0%} variance)"
    return text


@cli.command(name="eval")
@click.argument("model_path", required=False)
@_pair_options(required=True)
@model_options
@click.option(
    "--chunk-rows",
    type=spec_type("chunk_rows"),
    default=None,
    help="Pairs per block read (default: about 16 MiB of vectors).",
)
@common_quiet
@common_json
def eval_(model_path, pairs_a, pairs_b, scores, beta, gamma, n_components, variance, eps, chunk_rows, quiet, as_json):
    """Score cosine similarity of labelled pairs: Spearman and Pearson (x100), raw and whitened by MODEL_PATH.

    Without MODEL_PATH only the raw vectors are scored. The model options override the model's own
    setting for this evaluation (the model file is not changed).
    """
    from ..core.model import load_model
    from ..evaluation.evaluate import evaluate_pairs, open_pairs

    params = _model_params(beta, gamma, n_components, variance, eps)
    if params and model_path is None:
        raise BadInputError(f"--{next(iter(params)).replace('_', '-')} and the other model options need a MODEL")
    model = load_model(model_path) if model_path else None
    if model is not None and params:
        model = model.with_params(**params)
    with open_pairs(pairs_a, pairs_b, scores) as pairs:
        with progress_bar("eval", quiet) as progress:
            result = evaluate_pairs(pairs, model, chunk_rows, progress)
    summary = dict(result, model=model_path)
    described = result["pairs"]
    lines = [
        f"pairs     {described['n_pairs']:,} pairs of {described['n_features']}-d vectors "
        f"(A {described['a']}, B {described['b']}, scores {described['scores']})",
        f"raw       {_fmt_scores(result['raw'])}",
    ]
    if result["whitened"] is not None:
        white = result["whitened"]
        delta = white["spearman"] - result["raw"]["spearman"]
        lines.append(f"whitened  {_fmt_scores(white)}   {_fmt_setting(white)}  (Spearman {delta:+.2f} vs raw)")
    _emit(as_json, summary, lines)


def _number_list(text, name: str, cast=float, n_features: int | None = None):
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


def _tune_table_lines(result) -> list[str]:
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


def grid_options(purpose: str):
    """``--betas/--gammas/--ks/--variances/--metric``: the (beta, gamma, k) grid shared by tune and report."""

    def decorate(func):
        for option in reversed(
            [
                click.option(
                    "--betas",
                    default=None,
                    metavar="LIST",
                    help=f"Betas {purpose}, comma-separated [default: 0,0.25,0.5,0.75,1].",
                ),
                click.option(
                    "--gammas", default=None, metavar="LIST", help=f"Gammas {purpose} [default: 0,0.25,0.5,0.75,1]."
                ),
                click.option(
                    "--ks",
                    default=None,
                    metavar="LIST",
                    help=f"Component counts k {purpose}; 'd' is the full width "
                    "[default: d and the powers of two from 8 below it].",
                ),
                click.option(
                    "--variances",
                    default=None,
                    metavar="LIST",
                    help=f"Explained-variance fractions {purpose}, each as a k [default: 0.9,0.95,0.99; '' for none].",
                ),
                click.option(
                    "--metric", type=click.Choice(["spearman", "pearson"]), default="spearman", show_default=True
                ),
            ]
        ):
            func = option(func)
        return func

    return decorate


@cli.command()
@click.argument("model_path")
@_pair_options(required=True, what="validation pairs")
@_pair_options(required=False, prefix="test", scores="test-scores", what="held-out test pairs")
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
@click.option("--overwrite", is_flag=True, help="Let -o replace an existing file.")
@click.option("--chunk-rows", type=spec_type("chunk_rows"), default=None, help="Pairs per block read.")
@common_quiet
@common_json
def tune(
    model_path,
    pairs_a,
    pairs_b,
    scores,
    test_a,
    test_b,
    test_scores,
    betas,
    gammas,
    ks,
    variances,
    metric,
    tolerance,
    eps,
    output_path,
    in_place,
    overwrite,
    chunk_rows,
    quiet,
    as_json,
):
    """Choose beta, gamma and k for MODEL_PATH on labelled validation pairs, by grid search.

    The model's saved statistics give Sigma_beta for every beta in closed form, so the fitting data is
    not read again: each beta costs one eigendecomposition, shared by all its gammas and ks, and the
    pairs are read once. Prints the whole table and the best setting; with -o or --in-place the chosen
    setting is saved so that `apply` uses it. Give --test-a/--test-b/--test-scores to score the choice
    once, after it is made, on pairs it was not chosen on (next to raw on the same pairs).
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
    d = model.n_features
    grid = dict(
        betas=_number_list(betas, "betas"),
        gammas=_number_list(gammas, "gammas"),
        ks=_number_list(ks, "ks", int, d),
        variances=_number_list(variances, "variances"),
        metric=metric,
        tolerance=tolerance,
        eps=eps,
    )
    with open_pairs(pairs_a, pairs_b, scores) as pairs:
        test_pairs = _open_pairs_given(test_a, test_b, test_scores, "--test-a, --test-b and --test-scores")
        try:
            with progress_bar("tune", quiet) as progress:
                chosen, summary = run_tune(model, pairs, test_pairs, chunk_rows, progress, **grid)
        finally:
            if test_pairs is not None:
                test_pairs.close()
    target = model_path if in_place else output_path
    if target:
        with stop_on_signals():  # a signal lets the save finish: the file is whole or absent
            summary["file_checksum"] = save_model(chosen, target, overwrite=bool(in_place or overwrite))
    summary["model"] = model_path
    summary["written"] = target
    best, raw = summary["best"], summary["raw"]
    name = metric.capitalize()
    lines = [
        f"validation {summary['pairs']['n_pairs']:,} pairs of {d}-d vectors; {len(summary['table'])} settings "
        f"from the saved statistics of {model.n_rows:,} rows (no pass over the fitting data)",
        *_tune_table_lines(summary),
        f"raw        {_fmt_scores(raw)}",
        f"{'best' if not tolerance else 'chosen':<10} {_fmt_scores(best)}   {_fmt_setting(best)}  "
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
    _emit(as_json, summary, lines)


@cli.command()
@click.argument("model_path")
@_pair_options(required=False, what="labelled pairs (optional: adds the heat maps and k curves)")
@click.option(
    "-o",
    "--output",
    "output_path",
    required=True,
    help="report.html (one page), report.png (one image) or a directory (one PNG per figure).",
)
@grid_options("of the heat maps")
@click.option("--title", default=None, help="Title of the HTML page.")
@click.option("--overwrite", is_flag=True, help="Replace existing report files.")
@click.option("--chunk-rows", type=spec_type("chunk_rows"), default=None, help="Pairs per block read.")
@common_quiet
@common_json
def report(
    model_path,
    pairs_a,
    pairs_b,
    scores,
    output_path,
    betas,
    gammas,
    ks,
    variances,
    metric,
    title,
    overwrite,
    chunk_rows,
    quiet,
    as_json,
):
    """Draw MODEL_PATH's eigenvalue spectrum and explained variance; with pairs, how the score depends on beta, gamma, k.

    Needs matplotlib (pip install 'streamwhiten[report]'); renders without a display.
    """
    from ..core.model import load_model
    from ..evaluation.report import check_output, collect, write_report
    from ..io import refuse_input_overlap

    refuse_input_overlap({output_path: "report"}, [model_path, pairs_a, pairs_b, scores], nested=False)
    with_pairs = any(spec is not None for spec in (pairs_a, pairs_b, scores))
    check_output(output_path, with_pairs, overwrite)
    model = load_model(model_path)
    d = model.n_features
    grid = dict(
        betas=_number_list(betas, "betas"),
        gammas=_number_list(gammas, "gammas"),
        ks=_number_list(ks, "ks", int, d),
        variances=_number_list(variances, "variances"),
        metric=metric,
    )
    pairs = _open_pairs_given(pairs_a, pairs_b, scores, "--pairs-a, --pairs-b and --scores")
    try:
        with progress_bar("report", quiet) as progress:
            data = collect(model, pairs, block_rows=chunk_rows, progress=progress, **grid)
    finally:
        if pairs is not None:
            pairs.close()
    with stop_on_signals():  # a signal lets the files be finished
        written = write_report(data, output_path, overwrite, title)
    summary = {
        "model": model_path,
        "files": written,
        "effective_dimension": model.effective_dimension,
        "raw": None,
        "best": None,
    }
    lines = [f"D_eff      {model.effective_dimension:.1f} of d={d}"]
    if data.grid is not None:
        summary["raw"], summary["best"] = data.grid.raw, data.grid.best
        best = data.grid.best
        lines.append(f"raw        {_fmt_scores(data.grid.raw)}")
        lines.append(f"best       {_fmt_scores(best)}   {_fmt_setting(best)}")
    lines += [f"wrote      {path}" for path in written]
    _emit(as_json, summary, lines)


# ------------------------------------------------------------------------------------------ entry point


class _LogFileHandler(logging.FileHandler):
    """A log file whose write errors (disk full) stop the run with one line naming the file, rather
    than logging's traceback on stderr."""

    def handleError(self, record):
        exc = sys.exc_info()[1]
        raise StoreIOError(f"{self.baseFilename}: cannot write the log file: {getattr(exc, 'strerror', None) or exc}")


LOG_FORMAT = "%(asctime)s streamwhiten: %(message)s"
LOG_DATE = "%Y-%m-%dT%H:%M:%S%z"


def _configure_logging() -> None:
    logger = logging.getLogger("streamwhiten")
    if not any(getattr(h, "_streamwhiten", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, LOG_DATE))
        handler._streamwhiten = True
        logger.addHandler(handler)
    # Progress notes are for `run`, whose timestamped log is its record; other commands print a summary
    # on stdout, so their stderr holds nothing but a failure.
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    logging.raiseExceptions = False  # stderr that cannot be written: no traceback about it on stderr
    # After a store failed to decode, zarr's pending read tasks are reported as destroyed when the
    # process exits: noise after the one line that said what went wrong.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)


def main(argv=None) -> int:
    """Run the CLI; map every failure to one line on stderr and an exit code."""
    installed = _interrupt.install()  # already done by the entry point, except when called in-process
    try:
        return _main(argv)
    finally:
        if installed:
            _interrupt.uninstall()


def _main(argv) -> int:
    debug = bool(os.environ.get("STREAMWHITEN_DEBUG"))
    try:
        try:
            _configure_logging()
            if _interrupt.requested.is_set():  # a signal while the program was starting
                raise KeyboardInterrupt
            _interrupt.start_immediate()
            # cli.main() would print an empty line on stderr before turning an interruption into Abort.
            with cli.make_context("streamwhiten", list(sys.argv[1:] if argv is None else argv)) as ctx:
                cli.invoke(ctx)
            _interrupt.hold()
            code = 0
        except BaseException as exc:  # noqa: B036 - every way out is one line and an exit code
            _interrupt.hold()  # a further signal must not interrupt the report
            code = _report(exc, debug)
    except KeyboardInterrupt as late:  # a signal in the instant before hold(): report what was being reported
        _interrupt.hold()
        code = _report(late.__context__ if late.__context__ is not None else late, debug)
    return _finish(code)


def _finish(code: int) -> int:
    """From here to the exit no signal can kill the process (``_interrupt.finish``). One received after
    the work was complete changes nothing on disk: the exit code stays that of the work, with a note."""
    if _interrupt.finish() and code == 0:
        click.echo(
            f"streamwhiten: {_interrupt.signal_name()} received too late to stop the command: its work is complete",
            err=True,
        )
    return code


def _one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (some libraries' messages span several), without secrets."""
    text = " ".join(str(exc).split())
    remote = sys.modules.get("streamwhiten.io.remote")  # loaded when a URL or storage option was used
    return remote.scrub(text) if remote is not None else text


def _report(exc: BaseException, debug: bool) -> int:
    """The one line on stderr for ``exc``, and its exit code."""
    if isinstance(exc, click.exceptions.Exit):
        return exc.exit_code
    if isinstance(exc, click.ClickException):
        hint = " (see --help)" if isinstance(exc, click.UsageError) else ""
        click.echo(f"streamwhiten: error: {exc.format_message()}{hint}", err=True)
        return exc.exit_code
    if isinstance(exc, (click.exceptions.Abort, KeyboardInterrupt)):
        click.echo(f"streamwhiten: interrupted by {_interrupt.signal_name()}", err=True)
        return EXIT_INTERRUPTED
    if isinstance(exc, NothingToDoError):
        late = (
            f" ({_interrupt.signal_name()} received too late to stop the command)"
            if _interrupt.requested.is_set()
            else ""
        )
        click.echo(f"streamwhiten: {_one_line(exc)}{late}", err=True)
        return exc.exit_code
    if isinstance(exc, InterruptedRunError):
        click.echo(f"streamwhiten: stopped by {_interrupt.signal_name()}: {_one_line(exc)}", err=True)
        return exc.exit_code
    if debug and isinstance(exc, Exception):
        raise exc
    if isinstance(exc, StreamwhitenError):
        click.echo(f"streamwhiten: error: {_one_line(exc)}", err=True)
        return exc.exit_code
    if isinstance(exc, OSError):
        click.echo(f"streamwhiten: error: {_one_line(exc)}", err=True)
        return EXIT_IO
    if isinstance(exc, Exception):  # a bug: still one line, with a hint how to see more
        click.echo(
            f"streamwhiten: internal error: {exc.__class__.__name__}: {_one_line(exc)} "
            f"(set STREAMWHITEN_DEBUG=1 for the traceback)",
            err=True,
        )
        return EXIT_INTERNAL
    raise exc  # SystemExit and the like


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
