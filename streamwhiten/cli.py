"""The ``streamwhiten`` command line: the only place that prints, draws progress bars or exits.

Every library error is a :class:`~streamwhiten.errors.StreamwhitenError` carrying its exit code; it
is reported here as one line on stderr (``streamwhiten: error: ...``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from contextlib import contextmanager

import click

from . import __version__
from .stores import expand_specs
from .errors import (
    EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_IO, BadInputError, NothingToDoError, OutputExistsError, StreamwhitenError,
)

PRECISION = click.Choice(["auto", "float32", "float64"])


# ------------------------------------------------------------------------------------------- helpers


def _emit(ctx_json: bool, summary: dict, lines: list[str]) -> None:
    if ctx_json:
        click.echo(json.dumps(summary, indent=2, sort_keys=True, default=_jsonable))
    else:
        for line in lines:
            click.echo(line)


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    raise TypeError(f"not JSON-serialisable: {type(value)}")


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
    for name, value in (("beta", beta), ("gamma", gamma), ("n_components", n_components), ("variance", variance), ("eps", eps)):
        if value is not None:
            params[name] = value
    return params


def _fmt_rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds:,.0f} rows/s" if seconds > 0 else "-"


common_quiet = click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
common_json = click.option("--json", "as_json", is_flag=True, help="Print a machine-readable JSON summary.")


def model_options(func):
    for option in reversed([
        click.option("--beta", type=float, default=None, help="Mean removal in [0, 1] (1: centre, 0: rotate about 0)."),
        click.option("--gamma", type=float, default=None, help="Whitening strength in [0, 1] (1: unit variance, 0: rotation)."),
        click.option("-k", "--n-components", type=int, default=None, help="Kept dimensions k (default: all)."),
        click.option("--variance", type=float, default=None, help="Keep the fewest components explaining this fraction, e.g. 0.99."),
        click.option("--eps", type=float, default=None, help="Regulariser relative to the largest eigenvalue (default 1e-6)."),
    ]):
        func = option(func)
    return func


# ------------------------------------------------------------------------------------------ commands


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="streamwhiten")
def cli():
    """Fit and apply whitening transforms to embedding stores larger than memory."""


@contextmanager
def stop_on_signals():
    """Turn the first SIGINT/SIGTERM into a request to stop at the next block boundary.

    The library then saves its progress (checkpoint or partial output) and raises an interruption; a
    second signal stops at once.
    """
    import signal
    import threading

    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested.is_set
        return

    def handler(signum, frame):
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()
        click.echo(f"streamwhiten: {signal.Signals(signum).name} received, saving progress before stopping", err=True)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield requested.is_set
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@cli.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("-o", "--output", "model_path", default=None, help="Model file to write (.npz); default with --update: that model.")
@click.option("--dataset", default=None, help="Dataset/array inside each input (else file.h5:/dataset).")
@model_options
@click.option("--precision", type=PRECISION, default="auto", show_default=True, help="Arithmetic of the scatter product.")
@click.option("--chunk-rows", type=int, default=None, help="Rows per block read (default: whole store chunks, ~64 MiB).")
@click.option("--skip-nonfinite", is_flag=True, help="Skip and count rows holding NaN/Inf instead of failing.")
@click.option("--update", "update", default=None, metavar="MODEL",
              help="Fold only rows appended since MODEL was fitted (and new inputs) into its statistics.")
@click.option("--checkpoint", default=None, help="Checkpoint file (default: .MODEL.checkpoint beside the model).")
@click.option("--checkpoint-every", type=int, default=20, show_default=True, help="Checkpoint every N blocks.")
@click.option("--checkpoint-seconds", type=float, default=60.0, show_default=True, help="... or every T seconds.")
@click.option("--resume", is_flag=True, help="Require a checkpoint to resume from (a matching one is used anyway).")
@click.option("--restart", is_flag=True, help="Discard an existing checkpoint and start over.")
@click.option("--overwrite", is_flag=True, help="Replace an existing model file.")
@common_quiet
@common_json
def fit(inputs, model_path, dataset, beta, gamma, n_components, variance, eps, precision, chunk_rows,
        skip_nonfinite, update, checkpoint, checkpoint_every, checkpoint_seconds, resume, restart, overwrite, quiet,
        as_json):
    """Fit a whitening model on one or more stores (HDF5, Zarr, .npy; globs allowed) in one pass.

    Progress is checkpointed; a fit that was killed resumes where it stopped when run again.
    """
    from .fit import remove_checkpoint
    from .jobs import fit_job
    from .model import check_params, save_model

    params = _model_params(beta, gamma, n_components, variance, eps)
    check_params(**params)
    if model_path is None:
        if update is None:
            raise BadInputError("give the model file to write with -o/--output")
        model_path = update
    elif os.path.exists(model_path) and not overwrite and not (update and same_path(update, model_path)):
        raise OutputExistsError(f"{model_path}: already exists (pass --overwrite to replace it)")
    began = time.perf_counter()
    with progress_bar("fit", quiet) as progress, stop_on_signals() as should_stop:
        model, job, resumed, checkpoint = fit_job(
            expand_specs(inputs), model_path, dataset, params, precision, chunk_rows, skip_nonfinite, update,
            checkpoint, checkpoint_every, checkpoint_seconds, restart, resume, progress, should_stop,
        )
    checksum = save_model(model, model_path)
    remove_checkpoint(checkpoint)
    seconds = time.perf_counter() - began
    rows_read = job.rows_done
    summary = dict(model.summary(), model=model_path, checksum=checksum, seconds=seconds, rows_read=rows_read,
                   resumed=resumed, updated=update is not None,
                   rows_per_second=rows_read / job.seconds if job.seconds > 0 else None)
    summary.pop("sources")
    what = f"updated {update} with {rows_read:,} new rows" if update else f"fitted {model.n_rows:,} rows"
    _emit(as_json, summary, [
        f"{what} x {model.n_features} features from {len(job.cursors)} source(s) "
        f"in {job.seconds:.2f} s ({_fmt_rate(rows_read, job.seconds)})"
        + (" (resumed)" if resumed else "")
        + (f"; skipped {job.n_skipped:,} non-finite rows" if job.n_skipped else ""),
        f"beta={model.beta:g} gamma={model.gamma:g} k={model.n_components} "
        f"(explained variance {summary['explained_variance']:.4f}), D_eff={model.effective_dimension:.1f}",
        f"wrote {model_path}",
    ])


def same_path(a: str, b: str) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


@cli.command()
@click.argument("model_path")
@click.argument("input_spec")
@click.option("-o", "--output", "output_spec", required=True, help="Output store: out.h5[:/dataset] or out.zarr[:/array].")
@click.option("--dataset", default=None, help="Dataset/array inside the input.")
@model_options
@click.option("--normalize", is_flag=True, help="Scale every output row to unit L2 norm.")
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True)
@click.option("--chunk-rows", type=int, default=None, help="Rows per block read.")
@click.option("--zarr-format", type=click.Choice(["2", "3"]), default="3", show_default=True)
@click.option("--skip-nonfinite", is_flag=True, help="Write NaN for input rows holding NaN/Inf instead of failing.")
@click.option("--restart", is_flag=True, help="Discard the partial output of an interrupted run instead of resuming it.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output.")
@common_quiet
@common_json
def apply(model_path, input_spec, output_spec, dataset, beta, gamma, n_components, variance, eps, normalize, dtype,
          chunk_rows, zarr_format, skip_nonfinite, restart, overwrite, quiet, as_json):
    """Transform every row of INPUT_SPEC with MODEL_PATH and write the reduced vectors to a new store.

    An interrupted run leaves a hidden partial output that the same command resumes.
    """
    from .apply import apply_model
    from .model import load_model

    model = load_model(model_path)
    params = _model_params(beta, gamma, n_components, variance, eps)
    if params:
        model = model.with_params(**params)
    with progress_bar("apply", quiet) as progress, stop_on_signals() as should_stop:
        summary = apply_model(model, input_spec, output_spec, dataset, normalize, dtype, chunk_rows, overwrite,
                              skip_nonfinite, int(zarr_format), progress, should_stop, resume=not restart)
    _emit(as_json, summary, [
        f"wrote {summary['n_rows']:,} x {summary['n_components']} {summary['dtype']} vectors"
        f"{' (L2-normalised)' if normalize else ''} to {summary['output']} in {summary['seconds']:.2f} s "
        f"({_fmt_rate(summary['n_rows'], summary['seconds'])})"
        + (f"; {summary['n_nonfinite_rows']:,} non-finite input rows written as NaN" if summary["n_nonfinite_rows"] else ""),
    ])


@cli.command()
@click.argument("model_path")
@common_json
def info(model_path, as_json):
    """Print a model's parameters, spectrum summary and effective dimension."""
    from .model import load_model

    model = load_model(model_path)
    summary = dict(model.summary(), model=model_path)
    eigvals = model.eigvals
    top = ", ".join(f"{v:.4g}" for v in eigvals[:5])
    ladder = summary["components_for_variance"]
    lines = [
        f"model      {model_path} (streamwhiten model, d={model.n_features})",
        f"fitted on  {model.n_rows:,} rows"
        + (f" ({model.info['n_skipped_nonfinite']:,} non-finite skipped)" if model.info.get("n_skipped_nonfinite") else ""),
        f"transform  beta={model.beta:g} gamma={model.gamma:g} k={model.n_components} eps={model.eps:g} "
        f"(absolute {model.eps_value:.3g})" + (f" variance>={model.variance:g}" if model.variance else ""),
        f"spectrum   largest {top}; smallest {eigvals[-1]:.4g}; condition number {summary['condition_number']:.4g}",
        f"explained  {summary['explained_variance']:.4f} of the variance by the k kept components",
        f"k for      " + ", ".join(f"{float(v):.0%}: {k}" for v, k in ladder.items()),
        f"D_eff      {summary['effective_dimension']:.1f} (exp of the entropy of the normalised eigenvalues)",
    ]
    for source in model.sources:
        lines.append(f"source     {source['path']}{':/' + source['dataset'] if source['dataset'] else ''} "
                     f"({source['n_rows']:,} x {source['n_features']} {source['dtype']})")
    _emit(as_json, summary, lines)


@cli.command()
@click.option("--rows", type=int, default=100_000, show_default=True, help="Rows of the generated store.")
@click.option("--dim", type=int, default=256, show_default=True, help="Width d of the generated store.")
@click.option("-k", "--n-components", type=int, default=64, show_default=True, help="Kept dimensions.")
@click.option("--chunk-rows", type=int, default=8192, show_default=True, help="Chunk rows of the generated store.")
@click.option("--dir", "workdir", default=None, help="Keep the files in this directory (default: a temporary one, removed).")
@click.option("--seed", type=int, default=0, show_default=True)
@common_quiet
@common_json
def demo(rows, dim, n_components, chunk_rows, workdir, seed, quiet, as_json):
    """Run the whole job on a built-in example: generate a store, fit, apply with k < d, check."""
    import tempfile

    from .demo import run_demo

    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="streamwhiten-demo-") as tmp:
            summary = _run_demo(run_demo, tmp, rows, dim, n_components, chunk_rows, seed, quiet)
    else:
        os.makedirs(workdir, exist_ok=True)
        summary = _run_demo(run_demo, workdir, rows, dim, n_components, chunk_rows, seed, quiet)
    t = summary["seconds"]
    _emit(as_json, summary, [
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
    ])


def _run_demo(run_demo, directory, rows, dim, k, chunk_rows, seed, quiet):
    with progress_bar("demo", quiet) as progress:
        return run_demo(directory, rows, dim, k, chunk_rows, seed, progress)


@cli.command()
@click.argument("job_file")
@click.option("--log-file", default=None, help="Also append timestamped log lines to this file.")
@common_quiet
@common_json
def run(job_file, log_file, quiet, as_json):
    """Run a batch job (job.toml): fit or update, finalize, apply; each step skipped when up to date.

    Exit codes: 0 done, 3 nothing to do, 2 bad input, 75 another run holds the lock, 130 interrupted.
    """
    from .jobs import run_job_file

    if log_file:
        handler = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, LOG_DATE))
        logging.getLogger("streamwhiten").addHandler(handler)
    with progress_bar("run", quiet) as progress, stop_on_signals() as should_stop:
        summary = run_job_file(job_file, progress, should_stop)
    _emit(as_json, summary, [f"job {summary['job']}: " + "; ".join(summary["steps"])])


# ------------------------------------------------------------------------------------------ entry point

LOG_FORMAT = "%(asctime)s streamwhiten: %(message)s"
LOG_DATE = "%Y-%m-%dT%H:%M:%S%z"


def _configure_logging() -> None:
    logger = logging.getLogger("streamwhiten")
    if not any(getattr(h, "_streamwhiten", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, LOG_DATE))
        handler._streamwhiten = True
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def main(argv=None) -> int:
    """Run the CLI; map every failure to one line on stderr and an exit code."""
    debug = bool(os.environ.get("STREAMWHITEN_DEBUG"))
    _configure_logging()
    try:
        cli.main(args=argv, prog_name="streamwhiten", standalone_mode=False)
        return 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("streamwhiten: interrupted", err=True)
        return EXIT_INTERRUPTED
    except NothingToDoError as exc:
        click.echo(f"streamwhiten: {exc}", err=True)
        return exc.exit_code
    except StreamwhitenError as exc:
        if debug:
            raise
        click.echo(f"streamwhiten: error: {exc}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("streamwhiten: interrupted", err=True)
        return EXIT_INTERRUPTED
    except OSError as exc:
        if debug:
            raise
        click.echo(f"streamwhiten: error: {exc}", err=True)
        return EXIT_IO
    except Exception as exc:  # a bug: still one line, with a hint how to see more
        if debug:
            raise
        click.echo(f"streamwhiten: internal error: {exc.__class__.__name__}: {exc} "
                   f"(set STREAMWHITEN_DEBUG=1 for the traceback)", err=True)
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
