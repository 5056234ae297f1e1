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
        if source.n_features != model.n_features:
            raise BadInputError(
                f"{source.label}: has {source.n_features} columns but the model was fitted on {model.n_features}"
            )
        out_path, _ = split_spec(output_spec)
        if same_file(out_path, source.path):
            raise BadInputError(f"{out_path}: the output would replace the input; choose another path")
        work = np.float64 if source.dtype == np.float64 else np.float32
        weights, shift = model.projection(work)
        attrs = {
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
        sink = create_sink(output_spec, source.n_rows, model.n_components, dtype, attrs, overwrite, zarr_format)
        n_nonfinite = 0
        with sink:
            rows_per_block = block_rows or source.default_block_rows()
            # Whole output chunks per block, so no output chunk is written twice.
            rows_per_block = max(sink.chunk_rows, rows_per_block // sink.chunk_rows * sink.chunk_rows)
            for begin, rows in prefetch(read_blocks(source, rows_per_block)):
                finite = _kernels.finite_row_mask(rows if rows.dtype != np.float16 else rows.astype(np.float32))
                if not finite.all():
                    if not skip_nonfinite:
                        bad = begin + int(np.argmin(finite))
                        raise NonFiniteError(
                            f"{source.label}: row {bad} holds NaN or Inf (pass --skip-nonfinite to write NaN rows for such input)",
                            row=bad,
                        )
                    n_nonfinite += int(finite.size - finite.sum())
                    rows = rows.copy() if not rows.flags.writeable else rows
                    rows[~finite] = 0  # keeps NaN out of the product; those output rows become NaN below
                out = project(rows, weights, shift, normalize, sink.dtype, overwrite_input=True)
                if not finite.all():
                    out[~finite] = np.nan
                sink.write(begin, out)
                if progress is not None:
                    progress(begin + rows.shape[0], source.n_rows)
            sink._array.attrs["n_nonfinite_rows"] = n_nonfinite
            sink.commit(overwrite)
        seconds = time.perf_counter() - began
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
    finally:
        source.close()
