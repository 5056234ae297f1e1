"""The chunked applier: stream rows through a model and write the reduced vectors to a new store.

The output is written under a temporary name and renamed only once complete. Every few seconds (and
when stopped by a signal) the rows written so far are made durable and recorded in a progress file
beside the partial output, so an interrupted run (signal, crash, SIGKILL) resumes at the first
unrecorded block and produces exactly the output an uninterrupted run would have.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from .. import __version__, params
from .._buffers import BufferPool, PerThread, kept_for_next_run
from ..core.model import WhiteningModel, cast_checked, map_checksum, project_checked, raise_if_overflowed
from ..errors import (
    BadInputError,
    InterruptedRunError,
    NonFiniteError,
    NothingToDoError,
    OutputExistsError,
    ValuesTooLargeError,
)
from ..io import (
    Sampler,
    describe,
    fingerprint,
    open_output,
    open_source,
    refuse_input_overlap,
    remote,
    split_spec,
)
from ..options import ReadOptions
from ..records import ResumeRecord
from ._threads import ordered_map, resolve_threads, worker_blas_threads
from .fit import merge_read

#: Worker threads of :func:`apply_model` when none are given, for an input read as stored; an input
#: whose compressed chunks are decoded here gets one per core (at most four), so cores decode at once.
APPLY_DEFAULT_THREADS = 1


def default_threads(source) -> int:
    """:func:`apply_model`'s worker threads for ``source`` when none are given."""
    return resolve_threads(None) if source.decoder is not None else APPLY_DEFAULT_THREADS


def check_output(model: WhiteningModel, source, output_spec: str) -> None:
    """Refuse an input of the wrong width, or an output that would replace the input."""
    if source.n_features != model.n_features:
        raise BadInputError(
            f"{source.label}: has {source.n_features} columns but the model was fitted on {model.n_features}"
        )
    refuse_input_overlap({output_spec: "output"}, [source.path])


#: What an output written before an option existed was written with (missing from its attributes).
_OPTION_DEFAULTS = {"compressor": "none"}


def recorded_options(
    output_spec: str, skip_nonfinite: bool, fill_missing_chunks: bool, zarr_format: int, compressor: str = "none"
) -> dict:
    """The options an output records because they change what is written (or whether it can be)."""
    options = {"skip_nonfinite": bool(skip_nonfinite), "fill_missing_chunks": bool(fill_missing_chunks)}
    output = open_output(output_spec)
    if output.format_versions:
        options["zarr_format"] = int(zarr_format)
    if output.compressible:
        options["compressor"] = str(compressor)
    return options


def output_is_current(
    output_spec: str,
    checksum: str,
    source_sha256: str,
    normalize: bool,
    dtype,
    options: dict | None = None,
    keep_columns=None,
    *,
    read: ReadOptions | None = None,
) -> bool:
    """Whether ``output_spec`` is a complete output of the same map (``checksum``: ``AffineMap.checksum``),
    input rows (sampled fingerprint), normalisation, dtype, ``options`` (see :func:`recorded_options`)
    and kept columns: then writing it again changes nothing. A URL is reached with ``read``'s storage options."""
    output = open_output(output_spec, read)
    if not output.exists():
        return False
    try:
        attrs = output.attrs()
        with open_source(output_spec, read=output.read, min_rows=0) as existing:
            stored_dtype = existing.dtype
    except Exception:  # an unreadable old output is simply rewritten
        return False
    return (
        attrs.get("complete") in (True, 1)
        and attrs.get("model_checksum") == checksum
        and attrs.get("source_sha256") == source_sha256
        and bool(attrs.get("normalized")) == bool(normalize)
        and np.dtype(stored_dtype) == np.dtype(dtype)
        and all(attrs.get(key, _OPTION_DEFAULTS.get(key)) == value for key, value in (options or {}).items())
        and list(attrs.get("kept_columns") or []) == list(keep_columns or [])
    )


def output_attrs(
    model: WhiteningModel,
    source,
    normalize: bool,
    source_sha256: str | None = None,
    checksum: str | None = None,
    options: dict | None = None,
    keep_columns=None,
) -> dict:
    """The attributes recorded on an output array: where it came from, which transform made it, the
    ``options`` it was written with and the input columns it carries."""
    attrs = {
        "streamwhiten_version": __version__,
        "source": source.label,
        "model_checksum": checksum or map_checksum(model),
        "beta": model.beta,
        "gamma": model.gamma,
        "eps": model.eps,
        "eps_value": model.eps_value,
        "n_components": model.n_components,
        "normalized": bool(normalize),
    }
    if source_sha256 is not None:
        attrs["source_sha256"] = source_sha256
    attrs.update(options or {})
    if keep_columns:
        attrs["kept_columns"] = list(keep_columns)
    return attrs


def check_keep_columns(keep_columns) -> list:
    """The names of ``keep_columns`` (a list, or one comma-separated string), each once."""
    if keep_columns is None:
        return []
    names = keep_columns.split(",") if isinstance(keep_columns, str) else list(keep_columns)
    names = [str(name).strip() for name in names if str(name).strip()]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise BadInputError(f"--keep-columns names {repeated[0]!r} twice")
    return names


def aligned_block_rows(block_rows: int | None, source, sink_chunk_rows: int) -> int:
    """Rows per block rounded to whole output chunks, so no output chunk is written by two blocks."""
    rows_per_block = block_rows or source.default_block_rows()
    return max(sink_chunk_rows, rows_per_block // sink_chunk_rows * sink_chunk_rows)


def transform_block(
    rows: np.ndarray,
    begin: int,
    weights,
    shift,
    normalize: bool,
    dtype,
    skip_nonfinite: bool,
    label: str,
    overwrite_input: bool = True,
    out: np.ndarray | None = None,
    reread: Callable[[], np.ndarray] | None = None,
    into: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """Whiten one block read at row ``begin``; returns the output rows and how many were non-finite.

    A row holding NaN or Inf raises :class:`NonFiniteError` naming ``label`` and the row, unless
    ``skip_nonfinite``: then its output row is NaN and it is counted. Finite values that overflow
    (when centred, whitened or cast to ``dtype``) raise :class:`ValuesTooLargeError` naming the row.
    With ``overwrite_input`` the block may be centred in place; ``reread()`` then returns the block as
    stored, read again only when some rows came out non-finite, to tell NaN/Inf input from overflow.
    ``out`` is an optional buffer for the product (see :func:`~streamwhiten.core.model.project_checked`),
    ``into`` one for the cast to ``dtype``.
    """
    try:
        out, finite = project_checked(rows, weights, shift, normalize, None, overwrite_input=overwrite_input, out=out)
        if finite is not None and overwrite_input and reread is not None:
            stored = np.asarray(reread())
            raise_if_overflowed(~finite & np.isfinite(stored).all(axis=1), weights.dtype, "centred")
        if dtype is not None and np.dtype(dtype) != out.dtype:
            out = cast_checked(out, dtype, into)
    except ValuesTooLargeError as exc:
        row = None if exc.row is None else begin + exc.row
        raise ValuesTooLargeError(exc.detail, row=row, label=label) from None
    if finite is None:
        return out, 0
    if not skip_nonfinite:
        bad = begin + int(np.argmin(finite))
        raise NonFiniteError(
            f"{label}: row {bad} holds NaN or Inf (pass --skip-nonfinite to write NaN rows for such input)", row=bad
        )
    return out, int(finite.size - np.count_nonzero(finite))


def _join(writer: ThreadPoolExecutor) -> None:
    """Wait for the writer thread to finish, even through another Ctrl-C (its writes take milliseconds)."""
    while True:
        try:
            writer.shutdown(wait=True)
            return
        except KeyboardInterrupt:
            continue


def summary(
    model: WhiteningModel, source, sink, normalize: bool, n_nonfinite: int, seconds: float, resumed_at_row: int = 0
) -> dict:
    """What an apply run reports."""
    return {
        "input": source.label,
        "output": sink.label,
        "n_rows": source.n_rows,
        "resumed_at_row": resumed_at_row,
        "n_components": model.n_components,
        "dtype": str(sink.dtype),
        "normalized": bool(normalize),
        "n_nonfinite_rows": n_nonfinite,
        "seconds": seconds,
        "rows_per_second": (source.n_rows - resumed_at_row) / seconds if seconds > 0 else None,
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
    should_stop: Callable[[], bool] | None = None,
    resume: bool = True,
    progress_seconds: float = 10.0,
    threads: int | None = None,
    direct_io: bool = True,
    fill_missing_chunks: bool = False,
    keep_columns=None,
    compressor: str = "none",
    *,
    read: ReadOptions | None = None,
) -> dict:
    """Write ``transform(rows)`` for every row of ``input_spec`` to ``output_spec``; returns a summary.

    ``read`` (a :class:`~streamwhiten.options.ReadOptions`) says how the input is read and URLs are
    reached (storage options, deadline), and gives the dataset, block size and missing-chunk rule where
    the arguments of the same meaning leave them out.

    ``compressor`` (``none``, ``zstd``, ``blosc`` or ``gzip``; HDF5 and Zarr outputs) compresses each
    output chunk in the writer thread, in a form plain zarr or h5py reads (HDF5 zstd and blosc: with the
    hdf5plugin filters); the output records it, so a rerun with another compressor writes it again.

    ``keep_columns`` (Parquet or Lance input and a Parquet output) names input columns copied into the
    output row for row, beside the vectors (ids, say).

    Rows holding NaN or Inf stop the run with an error naming the row, unless ``skip_nonfinite``: then
    their output rows are NaN (row alignment with the input is kept) and they are counted. With
    ``resume`` (the default) the partial output of an interrupted run of the same job is continued;
    otherwise it is discarded. The rows written are made durable and recorded for a resume every
    ``progress_seconds`` (0: after every block) and when stopped by ``should_stop``.

    ``threads`` worker threads each read and transform whole blocks, which a writer thread writes in
    row order while the next block is computed. The default, 1, computes in this thread with
    multi-threaded BLAS: concurrent blocks were measured to slow each other down on a 2-core machine
    (see docs/performance.md); more threads can pay on more cores. An input whose
    compressed chunks are decoded here defaults to one thread per core (at most four), decoding at
    once, with a reader thread fetching the stored bytes of the next blocks ahead. With ``direct_io``
    whole output chunks are written around the page cache (``O_DIRECT``), which uses no CPU and so
    overlaps with the computation; ``False`` leaves the output in the page cache instead.
    """
    began = time.perf_counter()
    if threads is not None:
        resolve_threads(threads)  # a bad value is refused before anything is opened
    keep_columns = check_keep_columns(keep_columns)
    read = merge_read(read, dataset, fill_missing_chunks)
    fill_missing_chunks = read.fill_missing_chunks
    block_rows = block_rows if block_rows is not None else read.block_rows
    output = open_output(output_spec, read)
    output.check_compressor(compressor)
    source = open_source(input_spec, read=read, min_rows=1)
    locked = contextlib.ExitStack()
    try:
        # A remote input is read by several threads at once (reads wait on the network); a compressed one
        # is decoded by one per core.
        threads = resolve_threads(remote.default_threads(threads, [source]), default=default_threads(source))
        check_output(model, source, output_spec)
        kept_schema = source.column_schema(keep_columns) if keep_columns else None
        # One run per output: a second one exits 75 rather than replace this one's partial output.
        locked.enter_context(output.lock())
        out_path, _ = split_spec(output_spec)
        checksum = map_checksum(model)
        options = recorded_options(output_spec, skip_nonfinite, fill_missing_chunks, zarr_format, compressor)
        exists = output.exists()
        if exists and overwrite:
            output.check_replaceable(overwrite)  # only an output of ours, of this kind, is replaced
        exists = exists and not overwrite
        sampler = None
        if exists or (resume and output.has_progress()):  # compared with what is recorded: hashed now
            source_print = fingerprint(source)
        else:  # hashed from the rows as they are read (on a compressed store a separate read decodes chunks)
            source_print, sampler = describe(source), Sampler(source)
        if exists:
            if output_is_current(
                output_spec, checksum, source_print.sha256_sampled, normalize, dtype, options, keep_columns, read=read
            ):
                raise NothingToDoError(
                    f"nothing to do: {out_path} is up to date (written by this model, with the same "
                    "settings, from the same input)"
                )
            raise OutputExistsError.at(out_path)
        work = np.float64 if source.dtype == np.float64 else np.float32
        weights, shift = model.projection(work)
        params.check("chunk_rows", block_rows)
        # The user's block size wins: output chunks no larger, so blocks stay aligned (with the input's
        # chunks too, usually); chunks that are not whole 4 KiB blocks are written buffered. A Parquet
        # output's row groups are the blocks.
        chunk_rows = output.chunk_rows(
            model.n_components, dtype, source.n_rows, block_rows, source.default_block_rows()
        )
        rows_per_block = aligned_block_rows(block_rows, source, chunk_rows)
        # What must match for a partial output to be continued rather than started over.
        job = ResumeRecord(
            model_checksum=checksum,
            source=source_print,
            output=remote.normalize(out_path) if remote.is_url(out_path) else os.path.abspath(out_path),
            normalize=bool(normalize),
            dtype=str(np.dtype(dtype)),
            zarr_format=int(zarr_format),
            block_rows=rows_per_block,
            skip_nonfinite=bool(skip_nonfinite),
            threads=threads,  # BLAS rounding can depend on its threads per call: a resume must match
            compressor=compressor,
            keep_columns=tuple(keep_columns),
        )
        resumed = output.resume(job, direct_io) if resume else None
        if resumed is not None:
            sink, start, n_nonfinite = resumed[0], resumed[1].rows_done, resumed[1].n_nonfinite
        else:
            # The input's hash is set at commit (it may be taken from the rows as they are read); a
            # placeholder of its size keeps every attribute in place from the start (see Output.create).
            unknown = "0" * 64
            attrs = output_attrs(model, source, normalize, unknown, checksum, options, keep_columns)
            start, n_nonfinite = 0, 0
            sink = output.create(
                source.n_rows,
                model.n_components,
                dtype,
                attrs,
                overwrite,
                zarr_format,
                chunk_rows,
                direct_io,
                kept_schema,
                compressor,
            )
        resumed_at = start
        last_record = time.perf_counter()
        block_shape = (min(rows_per_block, source.n_rows), source.n_features)
        # float16 is widened to float32 as it is decoded, where the backend can: no copy of its own
        inputs = PerThread(block_shape, source.read_dtype)
        # Output buffers go back to their pool once written; aligned, so whole chunks can be written directly.
        products = BufferPool((block_shape[0], model.n_components), work)
        converted = None if sink.dtype == work else BufferPool((block_shape[0], model.n_components), sink.dtype)

        def whiten(begin, end, fetched=None):  # in a worker thread: read into its buffer, centre there, project
            if fetched is None:
                rows = source.read_into(begin, end, inputs.get())
            else:  # decode the stored bytes fetched ahead
                rows = source.read_into(begin, end, inputs.get(), fetched=fetched.result())
            if sampler is not None:
                sampler.offer(begin, rows)  # before it is centred in place
            kept = source.read_columns(begin, end, keep_columns) if keep_columns else None
            product = products.take()
            buffer = None if converted is None else converted.take()
            out, nonfinite = transform_block(
                rows,
                begin,
                weights,
                shift,
                normalize,
                sink.dtype,
                skip_nonfinite,
                source.label,
                overwrite_input=True,
                out=product,
                reread=lambda: source.read(begin, end),
                into=buffer,
            )
            if buffer is None:
                return begin, end, out, nonfinite, kept, lambda: products.give_back(product)
            products.give_back(product)
            return begin, end, out, nonfinite, kept, lambda: converted.give_back(buffer)

        def write(begin, out, kept, release):  # in the writer thread
            if kept is None:
                sink.write(begin, out)
            else:
                sink.write(begin, out, kept)
            release()

        pending = deque()

        def complete_print() -> None:  # the hash of sampled rows, from those read so far and the others
            nonlocal job
            if job.source.sha256_sampled is None:
                job = replace(job, source=replace(job.source, sha256_sampled=sampler.hexdigest(source)))

        def finish_writes(keep: int = 0) -> None:  # until at most ``keep`` writes are unfinished; errors surface here
            while len(pending) > keep:
                pending.popleft().result()

        # Fewer blocks in the whole input than threads: fewer workers, each with more BLAS threads.
        workers = min(threads, max(1, source.n_blocks(rows_per_block)))
        # Stored (compressed) bytes of the next blocks are fetched ahead by a reader thread: at most the
        # ``workers + 1`` blocks ordered_map has in flight.
        reader = (
            ThreadPoolExecutor(1, thread_name_prefix="streamwhiten-read")
            if workers > 1 and source.decoder is not None
            else None
        )

        def tasks():
            for begin, end in source.blocks(rows_per_block, start):
                yield (begin, end) if reader is None else (begin, end, reader.submit(source.fetch, begin, end))

        with sink, kept_for_next_run(inputs, products, converted):  # after the writer and workers stopped
            writer = ThreadPoolExecutor(1, thread_name_prefix="streamwhiten-write")
            results = ordered_map(whiten, tasks(), workers, worker_blas_threads(workers))
            try:
                for begin, end, out, nonfinite, kept, release in results:  # written in row order by the writer
                    n_nonfinite += nonfinite
                    finish_writes(keep=1)  # the previous block may still be in writing while this one is queued
                    pending.append(writer.submit(write, begin, out, kept, release))
                    stopping = should_stop is not None and should_stop() and end < source.n_rows
                    if end < source.n_rows and (stopping or time.perf_counter() - last_record >= progress_seconds):
                        finish_writes()
                        complete_print()  # a resume compares the whole fingerprint
                        sink.save_progress(job.at(end, n_nonfinite))  # fsyncs what was written: costly, not every block
                        last_record = time.perf_counter()
                    if progress is not None:
                        progress(end, source.n_rows)
                    if stopping:
                        raise InterruptedRunError(
                            f"interrupted after {end:,} of {source.n_rows:,} rows; run the same apply again to resume"
                        )
                finish_writes()
            finally:
                results.close()
                if reader is not None:
                    reader.shutdown(wait=True, cancel_futures=True)
                _join(writer)  # no write may still be running when the sink is closed, committed or removed
            complete_print()
            sink.commit(overwrite, {"n_nonfinite_rows": n_nonfinite, "source_sha256": job.source.sha256_sampled})
        return summary(model, source, sink, normalize, n_nonfinite, time.perf_counter() - began, resumed_at)
    finally:
        source.close()
        locked.close()
