"""The Dask engine: the serial engine's per-block step and merge, run as a tree reduction on a cluster.

One `reduce_block` task per block, then groups of ``split_every`` states merged left to right, level by
level: the tree depends only on the block layout, so any workers give the same bits. Workers read stores
by path (`LazyRows`) and write whole Zarr chunks under the temporary name. dask and distributed are
optional (``pip install 'streamwhiten[dask]'``), imported only in functions.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from .. import params
from ..core import stats
from ..core.model import WhiteningModel, float_dtype
from ..core.quantize import Quantization
from ..errors import BadInputError, ClusterError, NonFiniteError, ValuesTooLargeError
from ..io import LazyRows, Sink, Source, fingerprint, lazy_rows, open_output, open_source, split_spec
from ..options import ApplyOptions, ReadOptions
from ..output_plan import OutputPlan
from ..progress import Watch
from .apply import (
    ApplyOutcome,
    BlockTransform,
    aligned_block_rows,
    check_output,
    encode_block,
    plan_output,
    refuse_current,
    summary,
    transform_block,
)
from .fit import FitResult, Specs, check_enough_rows, open_sources, plan_blocks, reduce_block

#: States merged by one task of the reduction tree (dask's ``split_every``).
SPLIT_EVERY = 8
#: Seconds to wait for a scheduler given by address before giving up.
CONNECT_TIMEOUT = 30
#: Seconds to wait, after a failed transform, for its still-running write tasks before cleaning up.
CANCEL_TIMEOUT = 60

_INSTALL_HINT = "the dask engine needs the optional extra: pip install 'streamwhiten[dask]'"
#: What writes a block's rows from its first row: a sink's region writer, shipped to the workers.
_Writer = Callable[[int, np.ndarray], object]


class Cluster(Protocol):
    """Where the Dask engine runs (a ``DaskEngine``): a ``scheduler`` address, a new local cluster of
    ``workers`` processes, or a ``client``; and the states one task merges (``split_every``)."""

    scheduler: str | None
    workers: int | None
    client: Any
    split_every: int


def _require(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BadInputError(f"{_INSTALL_HINT} ({exc})") from exc


@contextlib.contextmanager
def dask_client(
    scheduler: str | None = None,
    n_workers: int | None = None,
    processes: bool = True,
    threads_per_worker: int = 1,
    client: Any = None,
) -> Iterator[Any]:
    """A ``distributed.Client``: ``client`` itself, one connected to ``scheduler`` (an address such as
    ``tcp://host:8786``), or one on a new ``LocalCluster`` of ``n_workers`` (default: one per core)
    processes (or threads with ``processes=False``), closed on exit."""
    if client is not None:
        yield client
        return
    distributed = _require("distributed")
    if scheduler:
        try:
            connected = distributed.Client(scheduler, timeout=CONNECT_TIMEOUT, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            raise ClusterError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from exc
        with connected:
            yield connected
        return
    n_workers = (os.cpu_count() or 1) if n_workers is None else n_workers
    params.check("workers", n_workers)
    with (
        distributed.LocalCluster(
            n_workers=n_workers,
            threads_per_worker=threads_per_worker,
            processes=processes,
            dashboard_address=":0",
            silence_logs=logging.CRITICAL,  # task errors reach the caller as exceptions
        ) as cluster,
        distributed.Client(cluster, set_as_default=False) as local,
    ):
        yield local


@contextlib.contextmanager
def _cluster_errors(what: str) -> Iterator[None]:
    """A worker that kept dying while running a task (past dask's retries) becomes a `ClusterError`."""
    try:
        killed = _require("distributed").KilledWorker
    except BadInputError:  # plain dask schedulers cannot lose a worker
        killed = ()
    try:
        yield
    except killed as exc:
        raise ClusterError(
            f"{what} was abandoned: workers running task {exc.task!r} died {exc.allowed_failures + 1} time(s), "
            f"the last {exc.last_worker.address}; check the Dask workers' memory limits and logs"
        ) from None


def _rows_array(array: Any) -> Any:
    """``array`` as a 2-D dask array of native-order floats whose every block spans all columns; another
    dtype raises `BadInputError` before any task runs."""
    import dask.array as da

    array = da.asarray(array)
    native = float_dtype(array.dtype)
    if array.dtype != native:
        array = array.astype(native)
    if array.ndim != 2:
        raise BadInputError(f"expected a 2-D dask array (rows x features), got shape {array.shape}")
    if any(np.isnan(size) for size in array.chunks[0]):
        raise BadInputError("the dask array has unknown chunk sizes: call array.compute_chunk_sizes() first")
    if array.numblocks[1] > 1:
        array = array.rechunk({1: -1})
    return array


def _block_tasks(array: Any, label: str, precision: str, skip_nonfinite: bool) -> list[Any]:
    """The *chunk* step: one delayed ``reduce_block`` per row block of ``array``, in row order (never
    centred in place: a block may be the caller's data, or data dask keeps)."""
    import dask

    task = dask.delayed(reduce_block, pure=True)
    offsets = np.concatenate([[0], np.cumsum(array.chunks[0])]).astype(np.int64)
    blocks = array.to_delayed().ravel()
    return [
        task(block, int(begin), label, precision, skip_nonfinite)
        for begin, block in zip(offsets[:-1], blocks, strict=True)
    ]


def _read_block_moments(
    rows: LazyRows, begin: int, stop: int, precision: str, skip_nonfinite: bool
) -> tuple[stats.Moments, int]:
    """The *chunk* step for a store: read rows ``[begin, stop)`` in the task and fold them (in place)."""
    return reduce_block(rows[begin:stop], begin, rows.label, precision, skip_nonfinite, overwrite_input=True)


def _store_tasks(source: Source, block_rows: int, precision: str, skip_nonfinite: bool) -> list[Any]:
    """One delayed read-and-fold per block of ``source``, cut as the serial engine cuts them."""
    import dask

    task = dask.delayed(_read_block_moments, pure=False)
    rows = dask.delayed(lazy_rows(source), pure=True)  # shipped once per worker, not once per task
    return [task(rows, begin, stop, precision, skip_nonfinite) for begin, stop in source.blocks(block_rows)]


def _merge_parts(*parts: tuple[stats.Moments, int]) -> tuple[stats.Moments, int]:
    """The *combine* step: ``(state, n_skipped)`` pairs merged left to right with `stats.merge`."""
    state, n_skipped = parts[0]
    for other, skipped in parts[1:]:
        state = stats.merge(state, other)
        n_skipped += skipped
    return state, n_skipped


def _reduce(parts: list[Any], n_rows: int, client: Any, split_every: int) -> tuple[stats.Moments, int]:
    """The reduction tree over ``parts`` (its shape set by their number and ``split_every`` alone), computed
    on ``client`` (None: dask's current scheduler), its rows checked."""
    import dask

    params.check("split_every", split_every)
    task = dask.delayed(_merge_parts, pure=True)
    while len(parts) > 1:
        parts = [task(*parts[i : i + split_every]) for i in range(0, len(parts), split_every)]
    with _cluster_errors("the fit"):
        state, n_skipped = client.compute(parts[0]).result() if client is not None else dask.compute(parts[0])[0]
    if state.n_rows + n_skipped != n_rows:  # a lost or repeated block would show here
        raise ClusterError(
            f"the fit counted {state.n_rows + n_skipped} rows of {n_rows}; the statistics were discarded"
        )
    return state, n_skipped


def fit_dask_array(
    array: Any,
    precision: str = "auto",
    skip_nonfinite: bool = False,
    client: Any = None,
    split_every: int = SPLIT_EVERY,
    label: str = "dask array",
) -> FitResult:
    """Statistics of every row of a dask array, on ``client`` or dask's current scheduler."""
    _require("dask.array")
    params.check("precision", precision)
    array = _rows_array(array)
    parts = _block_tasks(array, label, precision, skip_nonfinite)
    began = time.perf_counter()
    state, n_skipped = _reduce(parts, int(array.shape[0]), client, split_every)
    seconds = time.perf_counter() - began
    return FitResult(
        state, n_skipped, [], len(parts), seconds, precision=precision, skip_nonfinite=bool(skip_nonfinite)
    )


def fit_dask(
    specs: Specs,
    precision: str = "auto",
    skip_nonfinite: bool = False,
    *,
    read: ReadOptions | None = None,
    cluster: Cluster | None = None,
) -> FitResult:
    """`fit_sources` on a Dask ``cluster`` (default: a local one): stores are fingerprinted here, read and
    reduced on the workers (which must see the same paths), in the serial engine's blocks (`plan_blocks`),
    so the per-block states are bit-for-bit its own; only the order of the float64 merges differs."""
    _require("dask.array")
    params.check("precision", precision)
    read = read or ReadOptions()
    sources = open_sources(specs, read=read)
    try:
        fingerprints = [fingerprint(source) for source in sources]
        block_rows = plan_blocks(sources, read.block_rows)
        parts = [task for source in sources for task in _store_tasks(source, block_rows, precision, skip_nonfinite)]
        n_rows = sum(source.n_rows for source in sources)
    finally:
        for source in sources:
            source.close()
    with _connect(cluster) as active:
        began = time.perf_counter()
        state, n_skipped = _reduce(parts, n_rows, active, SPLIT_EVERY if cluster is None else cluster.split_every)
        seconds = time.perf_counter() - began
    check_enough_rows(state, sources)
    options = (precision, bool(skip_nonfinite), bool(read.fill_missing_chunks))
    return FitResult(state, n_skipped, fingerprints, len(parts), seconds, n_rows, *options)


def _connect(cluster: Cluster | None) -> contextlib.AbstractContextManager[Any]:
    """A client of ``cluster`` (None: a new local cluster), closed on exit unless it is the cluster's own."""
    if cluster is None:
        return dask_client()
    return dask_client(cluster.scheduler, cluster.workers, client=cluster.client)


def _transform_and_write(
    rows: LazyRows, begin: int, stop: int, how: BlockTransform, writer: _Writer, encoder: Quantization | None = None
) -> tuple[int, int, int]:
    """Read rows ``[begin, stop)``, whiten them in place as ``how`` says, encode and write them."""
    out, n_nonfinite = transform_block(rows[begin:stop], begin, how, reread=lambda: rows[begin:stop])
    writer(begin, encode_block(out, encoder))
    return begin, out.shape[0], n_nonfinite


def _running_keys(dask_worker: Any) -> list[str]:
    """Keys of the tasks whose code is still running on this worker (even if no longer wanted)."""
    running = ("executing", "long-running", "cancelled", "resumed")
    return [str(key) for key, task in dask_worker.state.tasks.items() if task.state in running]


def _stop_tasks(client: Any, futures: list[Any], timeout: float) -> None:
    """Cancel ``futures`` and wait (up to ``timeout`` s) until none of them is still running."""
    keys = {str(future.key) for future in futures}
    try:
        client.cancel(futures)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not keys & set().union(*client.run(_running_keys).values()):
                return
            time.sleep(0.1)
    except Exception:  # the cluster is gone, so nothing of it can still be writing
        return


def apply_dask(
    model: WhiteningModel,
    input_spec: str | Source,
    output_spec: str,
    options: ApplyOptions | None = None,
    read: ReadOptions | None = None,
    *,
    cluster: Cluster | None = None,
    watch: Watch = Watch(),
    output_chunk_rows: int | None = None,
) -> ApplyOutcome:
    """`apply_model` on a Dask ``cluster`` (default: a local one), writing a Zarr store.

    Workers write whole output chunks under the temporary name, renamed only once every block is written;
    on a failure the running tasks are waited for, then the temporary store removed. ``watch`` is told
    rows as blocks finish. ``output_chunk_rows``: rows per output chunk (default: about 4 MiB a chunk).
    """
    _require("dask")  # a missing extra is said first, before the output is checked or a code trained
    _require("distributed")
    options, read = options or ApplyOptions(), read or ReadOptions()
    options = options.storing(model.storage)
    # what the Dask engine writes whatever was asked (DaskEngine.check_apply refuses other values)
    options = replace(options, compressor="none", direct_io=True, checksums=True, keep_columns=())
    out_path, _ = split_spec(output_spec)
    output = open_output(output_spec, read)
    if not output.parallel_writes:
        raise BadInputError(
            f"{out_path}: the dask engine writes Zarr only (an output ending in .zarr); "
            "HDF5 cannot take writes from several processes"
        )
    params.check("output_chunk_rows", output_chunk_rows)
    began = time.perf_counter()
    with open_source(input_spec, read=read, min_rows=1) as source:
        check_output(model, source, output_spec)
        plan = plan_output(model, source, output, options, read, source_sha256=fingerprint(source).sha256_sampled)
        plan = replace(plan, chunk_rows=output_chunk_rows)  # sized here (default: about 4 MiB a chunk)
        with output.lock():
            # up to date: kept (exit 3) before any cluster is reached, so a job's current outputs cost none
            refuse_current(output, plan, options.overwrite)
            with _connect(cluster) as active, output.create(plan, options.overwrite) as sink:
                futures = _submit_blocks(active, model, source, sink, plan, read)
                n_nonfinite = _gather(active, futures, source.n_rows, watch)
                sink.commit(options.overwrite, plan.commit_attrs(n_nonfinite))
    return summary(plan, sink, n_nonfinite, time.perf_counter() - began)


def _submit_blocks(
    active: Any, model: WhiteningModel, source: Source, sink: Sink, plan: OutputPlan, read: ReadOptions
) -> list[Any]:
    """Start one read-whiten-encode-write task per block of ``source`` on ``active``; their futures."""
    dask = _require("dask")
    rows_per_block = aligned_block_rows(read.block_rows, source, sink.chunk_rows)
    lazy = lazy_rows(source)
    rows = dask.delayed(lazy, pure=True)
    weights, shift = model.projection(np.float64 if source.dtype == np.float64 else np.float32)
    quantization: Quantization | None = None if plan.storage is None else plan.storage.encoder
    stored = None if quantization is not None else sink.dtype
    how = dask.delayed(
        BlockTransform(weights, shift, plan.normalize, stored, plan.skip_nonfinite, lazy.label), pure=True
    )
    writer = dask.delayed(sink.region_writer(), pure=True)
    encoder = None if quantization is None else dask.delayed(quantization, pure=True)  # once per worker
    task = dask.delayed(_transform_and_write, pure=False)
    return list(
        active.compute([task(rows, begin, stop, how, writer, encoder) for begin, stop in source.blocks(rows_per_block)])
    )


def _gather(active: Any, futures: list[Any], n_rows: int, watch: Watch) -> int:
    """Wait for the block tasks, telling ``watch``; a failure waits for the running ones first."""
    distributed = _require("distributed")
    written, n_written, n_nonfinite = set(), 0, 0
    try:
        with _cluster_errors("the transform"):
            for _, (begin, rows, nonfinite) in distributed.as_completed(futures, loop=active.loop, with_results=True):
                written.add(begin)
                n_written += rows
                n_nonfinite += nonfinite
                watch.report(n_written, n_rows)
    except BaseException:
        _stop_tasks(active, futures, CANCEL_TIMEOUT)
        raise
    if n_written != n_rows or len(written) != len(futures):
        raise ClusterError(f"the transform wrote {n_written} rows of {n_rows}; output discarded")
    return n_nonfinite


def transform_dask(model: WhiteningModel, array: Any, normalize: bool = False, skip_nonfinite: bool = False) -> Any:
    """A lazy dask array of ``model.transform`` of ``array``'s blocks (NaN or Inf: `NonFiniteError` naming
    the row in ``array``, unless ``skip_nonfinite`` writes a NaN row)."""
    _require("dask.array")
    array = _rows_array(array)
    if array.shape[1] != model.n_features:
        raise BadInputError(f"the model expects {model.n_features} features, got {array.shape[1]}")
    work = np.float64 if array.dtype == np.float64 else np.float32

    def whiten(rows: np.ndarray, block_info: dict[Any, Any] | None = None) -> np.ndarray:
        begin = block_info[0]["array-location"][0][0] if block_info else 0
        try:
            return model.transform(rows, normalize=normalize, skip_nonfinite=skip_nonfinite)
        except NonFiniteError as exc:  # name the row in the whole array, not in the block
            assert exc.row is not None  # transform names the row
            row = begin + exc.row
            raise NonFiniteError(
                f"row {row} holds NaN or Inf (use skip_nonfinite=True to write NaN rows for such input)",
                row=row,
                param="skip_nonfinite",
            ) from None
        except ValuesTooLargeError as exc:
            raise ValuesTooLargeError(exc.detail, row=None if exc.row is None else begin + exc.row) from None

    return array.map_blocks(
        whiten, dtype=work, chunks=(array.chunks[0], (model.n_components,)), meta=np.empty((0, 0), dtype=work)
    )
