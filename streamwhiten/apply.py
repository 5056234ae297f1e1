"""The chunked applier: stream rows through a model and write the reduced vectors to a new store."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from . import _kernels
from .errors import BadInputError, NonFiniteError
from .fit import prefetch, read_blocks
from .model import WhiteningModel, model_checksum, project
from .stores import create_sink, open_source, same_file, split_spec
from . import __version__


def check_output(model: WhiteningModel, source, output_spec: str) -> None:
    """Refuse an input of the wrong width, or an output that would replace the input."""
    if source.n_features != model.n_features:
        raise BadInputError(
            f"{source.label}: has {source.n_features} columns but the model was fitted on {model.n_features}"
        )
    out_path, _ = split_spec(output_spec)
    if same_file(out_path, source.path):
        raise BadInputError(f"{out_path}: the output would replace the input; choose another path")


def output_attrs(model: WhiteningModel, source, normalize: bool) -> dict:
    """The attributes recorded on an output array: where it came from and which transform made it."""
    return {
        "streamwhiten_version": __version__,
        "source": source.label,
        "model_checksum": model_checksum(model),
        "beta": model.beta,
        "gamma": model.gamma,
        "eps": model.eps,
        "eps_value": model.eps_value,
        "n_components": model.n_components,
        "normalized": bool(normalize),
    }


def aligned_block_rows(block_rows: int | None, source, sink_chunk_rows: int) -> int:
    """Rows per block rounded to whole output chunks, so no output chunk is written by two blocks."""
    rows_per_block = block_rows or source.default_block_rows()
    return max(sink_chunk_rows, rows_per_block // sink_chunk_rows * sink_chunk_rows)


def transform_block(
    rows: np.ndarray, begin: int, weights, shift, normalize: bool, dtype, skip_nonfinite: bool, label: str,
    overwrite_input: bool = True,
) -> tuple[np.ndarray, int]:
    """Whiten one block read at row ``begin``; returns the output rows and how many were non-finite.

    A row holding NaN or Inf raises :class:`NonFiniteError` naming ``label`` and the row, unless
    ``skip_nonfinite``: then its output row is NaN and it is counted. With ``overwrite_input`` the
    block may be centred in place.
    """
    finite = _kernels.finite_row_mask(rows if rows.dtype != np.float16 else rows.astype(np.float32))
    n_nonfinite = int(finite.size - finite.sum())
    if n_nonfinite and not skip_nonfinite:
        bad = begin + int(np.argmin(finite))
        raise NonFiniteError(
            f"{label}: row {bad} holds NaN or Inf (pass --skip-nonfinite to write NaN rows for such input)",
            row=bad,
        )
    out = project(rows, weights, shift, normalize, dtype, overwrite_input=overwrite_input)
    if n_nonfinite:
        out[~finite] = np.nan
    return out, n_nonfinite


def summary(model: WhiteningModel, source, sink, normalize: bool, n_nonfinite: int, seconds: float) -> dict:
    """What an apply run reports."""
    return {
        "input": source.label,
        "output": sink.label,
        "n_rows": source.n_rows,
        "n_components": model.n_components,
        "dtype": str(sink.dtype),
        "normalized": bool(normalize),
        "n_nonfinite_rows": n_nonfinite,
        "seconds": seconds,
        "rows_per_second": source.n_rows / seconds if seconds > 0 else None,
    }


def apply_model(
    model: WhiteningModel,
    input_spec,
    output_spec: str,
    dataset: str | None = None,
    normalize: bool = False,
    dtype="float32",
    block_rows: int | None = None,
    overwrite: bool = False,
    skip_nonfinite: bool = False,
    zarr_format: int = 3,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Write ``transform(rows)`` for every row of ``input_spec`` to ``output_spec``; returns a summary.

    The output is written under a temporary name and renamed only once complete. Rows holding NaN or
    Inf stop the run with an error naming the row, unless ``skip_nonfinite``: then their output rows
    are NaN (row alignment with the input is kept) and they are counted.
    """
    began = time.perf_counter()
    source = open_source(input_spec, dataset, min_rows=1)
    try:
        check_output(model, source, output_spec)
        work = np.float64 if source.dtype == np.float64 else np.float32
        weights, shift = model.projection(work)
        attrs = output_attrs(model, source, normalize)
        sink = create_sink(output_spec, source.n_rows, model.n_components, dtype, attrs, overwrite, zarr_format)
        n_nonfinite = 0
        with sink:
            rows_per_block = aligned_block_rows(block_rows, source, sink.chunk_rows)
            for begin, rows in prefetch(read_blocks(source, rows_per_block)):
                out, dropped = transform_block(
                    rows, begin, weights, shift, normalize, sink.dtype, skip_nonfinite, source.label
                )
                n_nonfinite += dropped
                sink.write(begin, out)
                if progress is not None:
                    progress(begin + rows.shape[0], source.n_rows)
            sink._array.attrs["n_nonfinite_rows"] = n_nonfinite
            sink.commit(overwrite)
        return summary(model, source, sink, normalize, n_nonfinite, time.perf_counter() - began)
    finally:
        source.close()
