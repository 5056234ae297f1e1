"""The ``streamwhiten`` command line: the only place that prints, draws progress bars or exits.

Every library error is a :class:`~streamwhiten.errors.StreamwhitenError` carrying its exit code; it
is reported here as one line on stderr (``streamwhiten: error: ...``).
"""

from __future__ import annotations

import glob
import json
import math
import os
import sys
import time
from contextlib import contextmanager

import click

from . import __version__
from .errors import (
    EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_IO, BadInputError, OutputExistsError, StreamwhitenError,
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


def expand_inputs(inputs) -> list[str]:
    """Expand glob patterns (``'shards/day-*.h5'``) that name no file literally, sorted for a stable order."""
    expanded: list[str] = []
    for spec in inputs:
        path = spec.rpartition(":")[0] if ":" in spec and not os.path.exists(spec) else spec
        suffix = spec[len(path):] if path != spec else ""
        if any(ch in path for ch in "*?[") and not os.path.exists(path):
            matches = sorted(glob.glob(path))
            if not matches:
                raise BadInputError(f"{path}: the pattern matches no file")
            expanded.extend(match + suffix for match in matches)
        else:
            expanded.append(spec)
    return expanded


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


def engine_options(func):
    for option in reversed([
        click.option("--engine", type=click.Choice(["serial", "dask"]), default="serial", show_default=True,
                     help="serial: this process; dask: a Dask cluster (needs streamwhiten[dask]), see docs/dask.md."),
        click.option("--scheduler", default=None, metavar="ADDRESS",
                     help="With --engine dask: the scheduler to use, e.g. tcp://host:8786 (default: a local cluster)."),
        click.option("--workers", type=click.IntRange(min=1), default=None,
                     help="With --engine dask and no --scheduler: processes of the local cluster (default: one per core)."),
    ]):
        func = option(func)
    return func


def _check_engine(engine: str, scheduler, workers) -> None:
    if engine != "dask" and (scheduler or workers is not None):
        raise BadInputError("--scheduler and --workers need --engine dask")
    if scheduler and workers is not None:
        raise BadInputError("--workers sizes a local cluster; it cannot be combined with --scheduler")


# ------------------------------------------------------------------------------------------ commands


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="streamwhiten")
def cli():
    """Fit and apply whitening transforms to embedding stores larger than memory."""


@cli.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("-o", "--output", "model_path", required=True, help="Model file to write (.npz).")
@click.option("--dataset", default=None, help="Dataset/array inside each input (else file.h5:/dataset).")
@model_options
@click.option("--precision", type=PRECISION, default="auto", show_default=True, help="Arithmetic of the scatter product.")
@click.option("--chunk-rows", type=int, default=None, help="Rows per block read (default: whole store chunks, ~64 MiB).")
@click.option("--skip-nonfinite", is_flag=True, help="Skip and count rows holding NaN/Inf instead of failing.")
@click.option("--overwrite", is_flag=True, help="Replace an existing model file.")
@engine_options
@common_quiet
@common_json
def fit(inputs, model_path, dataset, beta, gamma, n_components, variance, eps, precision, chunk_rows,
        skip_nonfinite, overwrite, engine, scheduler, workers, quiet, as_json):
    """Fit a whitening model on one or more stores (HDF5, Zarr, .npy; globs allowed) in one pass."""
    from .fit import fit_sources
    from .model import check_params, finalize, save_model

    _check_engine(engine, scheduler, workers)
    params = _model_params(beta, gamma, n_components, variance, eps)
    check_params(**params)
    if os.path.exists(model_path) and not overwrite:
        raise OutputExistsError(f"{model_path}: already exists (pass --overwrite to replace it)")
    began = time.perf_counter()
    with progress_bar("fit", quiet or engine == "dask") as progress:
        if engine == "dask":
            from .distributed import fit_dask

            result = fit_dask(expand_inputs(inputs), dataset, precision, skip_nonfinite, chunk_rows,
                              scheduler=scheduler, n_workers=workers)
        else:
            result = fit_sources(expand_inputs(inputs), dataset, precision, skip_nonfinite, chunk_rows, progress)
    model = finalize(result.state, sources=result.sources, info={"n_skipped_nonfinite": result.n_skipped}, **params)
    checksum = save_model(model, model_path)
    seconds = time.perf_counter() - began
    summary = dict(model.summary(), model=model_path, checksum=checksum, seconds=seconds, engine=engine,
                   read_seconds=result.seconds, rows_per_second=result.rows_per_second)
    summary.pop("sources")
    _emit(as_json, summary, [
        f"fitted {model.n_rows:,} rows x {model.n_features} features from {len(result.sources)} source(s) "
        f"in {result.seconds:.2f} s ({_fmt_rate(model.n_rows, result.seconds)})"
        + (f"; skipped {result.n_skipped:,} non-finite rows" if result.n_skipped else ""),
        f"beta={model.beta:g} gamma={model.gamma:g} k={model.n_components} "
        f"(explained variance {summary['explained_variance']:.4f}), D_eff={model.effective_dimension:.1f}",
        f"wrote {model_path}",
    ])


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
@click.option("--overwrite", is_flag=True, help="Replace an existing output.")
@engine_options
@common_quiet
@common_json
def apply(model_path, input_spec, output_spec, dataset, beta, gamma, n_components, variance, eps, normalize, dtype,
          chunk_rows, zarr_format, skip_nonfinite, overwrite, engine, scheduler, workers, quiet, as_json):
    """Transform every row of INPUT_SPEC with MODEL_PATH and write the reduced vectors to a new store."""
    from .apply import apply_model
    from .model import load_model

    _check_engine(engine, scheduler, workers)
    model = load_model(model_path)
    params = _model_params(beta, gamma, n_components, variance, eps)
    if params:
        model = model.with_params(**params)
    with progress_bar("apply", quiet) as progress:
        if engine == "dask":
            from .distributed import apply_dask

            summary = apply_dask(model, input_spec, output_spec, dataset, normalize, dtype, chunk_rows, overwrite,
                                 skip_nonfinite, int(zarr_format), scheduler=scheduler, n_workers=workers,
                                 progress=progress)
        else:
            summary = apply_model(model, input_spec, output_spec, dataset, normalize, dtype, chunk_rows, overwrite,
                                  skip_nonfinite, int(zarr_format), progress)
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


# ------------------------------------------------------------------------------------------ entry point


def main(argv=None) -> int:
    """Run the CLI; map every failure to one line on stderr and an exit code."""
    debug = bool(os.environ.get("STREAMWHITEN_DEBUG"))
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
