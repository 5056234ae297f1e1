"""The chunked applier: stream rows (all, or ``[start, stop)``) through a model into a new store, written
under a temporary name, resumable to the bytes of an uninterrupted run; codes by the resolved storage.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from .._buffers import BufferPool, PerThread, kept_for_next_run
from ..core.model import WhiteningModel, map_checksum, project_checked
from ..core.quantize import Quantization, cast_checked, raise_if_overflowed
from ..errors import (
    BadInputError,
    InterruptedRunError,
    NonFiniteError,
    NothingToDoError,
    OutputExistsError,
    ValuesTooLargeError,
)
from ..io import (
    Output,
    RowRange,
    Sampler,
    Sink,
    Source,
    describe,
    fingerprint,
    open_output,
    open_source,
    refuse_input_overlap,
    remote,
    split_spec,
)
from ..io.codecs import Fetched
from ..options import ApplyOptions, ReadOptions
from ..output_plan import MODEL_PARAMS, STORAGE_ATTR, OutputPlan
from ..progress import Watch
from ..records import ResumeRecord
from ._threads import ordered_map, resolve_threads, worker_blas_threads

#: Worker threads of `apply_model` when none are given, for an input read as stored; an input
#: whose compressed chunks are decoded here gets one per core (at most four), so cores decode at once.
APPLY_DEFAULT_THREADS = 1


def default_threads(source: Source) -> int:
    """`apply_model`'s worker threads for ``source`` when none are given."""
    return resolve_threads(None) if source.decoder is not None else APPLY_DEFAULT_THREADS


def check_output(model: WhiteningModel, source: Source, output_spec: str) -> None:
    """Refuse an input of the wrong width, or an output that would replace the input."""
    if source.n_features != model.n_features:
        raise BadInputError(
            f"{source.label}: has {source.n_features} columns but the model was fitted on {model.n_features}"
        )
    refuse_input_overlap({output_spec: "output"}, [source.path])


def encode_block(out: np.ndarray, quantization: Quantization | None) -> np.ndarray:
    """One transformed block as stored: ``out`` for floats, else its codes (its rows are finite)."""
    return out if quantization is None else quantization.encode(out)


def plan_output(
    model: WhiteningModel,
    source: Source,
    output: Output,
    options: ApplyOptions,
    read: ReadOptions,
    *,
    source_sha256: str | None = None,
    attrs: Mapping[str, Any] | None = None,
) -> OutputPlan:
    """The one `OutputPlan` of writing ``model``'s transform of ``source`` to ``output`` with ``options`` (what is
    stored: ``codes.storage.resolve``), in ``read``'s blocks, chunks no larger; ``source_sha256``: the sampled
    rows' hash where taken before writing; ``attrs``: recorded beside the plan's own."""
    from ..codes.storage import resolve

    storage = resolve(model, options.dtype)
    if storage is None:
        width, dtype = model.n_components, np.dtype(str(options.dtype or "float32")).name
    else:
        width, dtype = storage.width, storage.dtype
    chunk_rows = output.chunk_rows(width, dtype, source.n_rows, read.block_rows, source.default_block_rows())
    out_path = split_spec(output.spec)[0]
    return OutputPlan(
        n_rows=source.n_rows,
        width=width,
        dtype=dtype,
        storage=storage,
        chunk_rows=chunk_rows,
        block_rows=aligned_block_rows(read.block_rows, source, chunk_rows),
        compressor=options.compressor,
        zarr_format=int(options.zarr_format),
        records_compressor=output.compressible,
        records_format=bool(output.format_versions),
        direct_io=options.direct_io,
        checksums=options.checksums,
        kept_columns=tuple(options.keep_columns),
        kept_schema=source.column_schema(list(options.keep_columns)) if options.keep_columns else None,
        rows=(source.start, source.stop) if isinstance(source, RowRange) else None,
        normalize=bool(options.normalize),
        skip_nonfinite=bool(options.skip_nonfinite),
        fill_missing_chunks=bool(read.fill_missing_chunks),
        source=source.label,
        source_sha256=source_sha256,
        model_checksum=map_checksum(model),
        model_params=tuple((name, getattr(model, name)) for name in MODEL_PARAMS),
        output=remote.normalize(out_path) if remote.is_url(out_path) else os.path.abspath(out_path),
        caller_attrs=dict(attrs or {}),
    )


def output_is_current(output: Output, plan: OutputPlan) -> bool:
    """Whether ``output`` is a complete output of what ``plan`` writes (`OutputPlan.matches`)."""
    if not output.exists():
        return False
    try:
        attrs = output.attrs()
        dtype = None
        if plan.storage is None and STORAGE_ATTR not in attrs:
            with open_source(output.spec, read=output.read, min_rows=0) as existing:
                dtype = np.dtype(existing.dtype).name
    except Exception:  # an unreadable old output is simply rewritten
        return False
    return plan.matches(attrs, dtype)


def aligned_block_rows(block_rows: int | None, source: Source, sink_chunk_rows: int) -> int:
    """Rows per block rounded to whole output chunks, so no output chunk is written by two blocks."""
    rows_per_block = block_rows or source.default_block_rows()
    return max(sink_chunk_rows, rows_per_block // sink_chunk_rows * sink_chunk_rows)


@dataclass(frozen=True, eq=False)
class BlockTransform:
    """What every block of one apply is whitened with, cast to, and labelled with."""

    weights: np.ndarray
    shift: npt.ArrayLike
    normalize: bool
    dtype: npt.DTypeLike | None
    skip_nonfinite: bool
    label: str


def transform_block(
    rows: np.ndarray,
    begin: int,
    how: BlockTransform,
    overwrite_input: bool = True,
    out: np.ndarray | None = None,
    reread: Callable[[], np.ndarray] | None = None,
    into: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """Whiten one block read at row ``begin`` as ``how`` says: ``(rows out, non-finite rows)``. A NaN or Inf
    row raises `NonFiniteError` unless ``how.skip_nonfinite`` (a NaN row, counted); overflow raises
    `ValuesTooLargeError`, both naming the row. With ``overwrite_input`` the block may be centred in place
    (``reread()`` gives it as stored, to tell NaN input from overflow); ``out``, ``into``: buffers."""
    weights, shift, normalize, dtype, label = how.weights, how.shift, how.normalize, how.dtype, how.label
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
    if not how.skip_nonfinite:
        bad = begin + int(np.argmin(finite))
        raise NonFiniteError(
            f"{label}: row {bad} holds NaN or Inf (pass skip_nonfinite=True to write NaN rows for such input)",
            row=bad,
            param="skip_nonfinite",
        )
    return out, int(finite.size - np.count_nonzero(finite))


def _join(writer: ThreadPoolExecutor) -> None:
    """Wait for the writer thread to finish, even through another Ctrl-C (its writes take milliseconds)."""
    while True:
        with contextlib.suppress(KeyboardInterrupt):
            writer.shutdown(wait=True)
            return


@dataclass(frozen=True)
class ApplyOutcome:
    """What an apply did, whichever engine ran it (see ``engine.engines``)."""

    input: str
    output: str
    n_rows: int
    n_components: int
    dtype: str
    normalized: bool
    n_nonfinite_rows: int
    seconds: float
    resumed_at_row: int = 0
    rows: tuple[int, int] | None = None

    @property
    def rows_per_second(self) -> float | None:
        """Rows written by this run per second."""
        return (self.n_rows - self.resumed_at_row) / self.seconds if self.seconds > 0 else None

    def to_json(self) -> dict[str, Any]:
        """The outcome as plain JSON values (``apply --json``)."""
        return dict(asdict(self), rows_per_second=self.rows_per_second)


def summary(plan: OutputPlan, sink: Sink, n_nonfinite: int, seconds: float, resumed_at_row: int = 0) -> ApplyOutcome:
    """What an apply run of ``plan`` reports (``dtype``: the storage's kind)."""
    return ApplyOutcome(
        input=plan.source,
        output=sink.label,
        n_rows=plan.n_rows,
        n_components=int(dict(plan.model_params)["n_components"]),
        dtype=plan.kind,
        normalized=bool(plan.normalize),
        n_nonfinite_rows=n_nonfinite,
        seconds=seconds,
        resumed_at_row=resumed_at_row,
        rows=plan.rows,
    )


@dataclass(frozen=True)
class ApplyPart:
    """What of the input an apply writes (rows ``(start, stop)``; None: all, recorded in its ``rows`` attribute),
    and ``attrs`` recorded beside the output's own (how ``run`` marks a published part)."""

    rows: tuple[int, int] | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)


def apply_model(
    model: WhiteningModel,
    input_spec: str | Source,
    output_spec: str,
    options: ApplyOptions | None = None,
    read: ReadOptions | None = None,
    *,
    part: ApplyPart | None = None,
    watch: Watch = Watch(),
    threads: int | None = None,
) -> ApplyOutcome:
    """Write ``model``'s transform of every row of ``input_spec`` (or of the rows ``part`` names) to the new
    store ``output_spec``, as ``options`` say, reading as ``read`` says; ``watch`` is told the rows written
    and asked whether to stop.

    Unless ``restart``, an interrupted run's partial output is continued. ``threads`` workers transform
    whole blocks, written in row order by a writer thread; the default, 1, computes here with multi-threaded
    BLAS (concurrent blocks slowed each other on 2 cores: docs/performance.md); a compressed input decoded
    here gets one per core (at most four).
    """
    began = time.perf_counter()
    options, read, part = options or ApplyOptions(), read or ReadOptions(), part or ApplyPart()
    options = options.storing(model.storage)
    if threads is not None:
        resolve_threads(threads)  # a bad value is refused before anything is opened
    output = open_output(output_spec, read)
    output.check_compressor(options.compressor)
    with contextlib.ExitStack() as stack:
        source = stack.enter_context(open_source(input_spec, read=read, min_rows=1))
        if part.rows is not None:
            source = RowRange(source, *_pair(part.rows))
        # a remote input is read by several threads at once; a compressed one is decoded by one per core
        threads = resolve_threads(remote.default_threads(threads, [source]), default=default_threads(source))
        check_output(model, source, output_spec)
        plan = plan_output(model, source, output, options, read, attrs=part.attrs)
        # One run per output: a second one exits 75 rather than replace this one's partial output.
        stack.enter_context(output.lock())
        writing = _prepare_writing(source, output, plan, options, threads)
        sink, start, n_nonfinite = _open_sink(output, writing, options)
        with sink:
            run = _BlockRun(model, source, sink, writing, options, threads, watch)
            n_nonfinite = run.write_all(start, n_nonfinite)
            sink.commit(options.overwrite, plan.commit_attrs(n_nonfinite, run.source_sha256()))
        return summary(plan, sink, n_nonfinite, time.perf_counter() - began, start)


def _pair(rows: Any) -> tuple[int, int]:
    """``rows`` as two numbers (checked against the input by ``RowRange``)."""
    try:
        start, stop = rows
    except (TypeError, ValueError):
        raise BadInputError(f"rows must be a pair (start, stop) of row numbers, got {rows!r}") from None
    return start, stop


@dataclass
class _Writing:
    """How one apply writes: its plan, the resume record, and the sampler hashing rows as read."""

    plan: OutputPlan
    record: ResumeRecord
    sampler: Sampler | None

    @property
    def rows_per_block(self) -> int:
        return self.plan.block_rows


def up_to_date_error(out_path: str) -> NothingToDoError:
    """The one "nothing to do" of an apply whose output is up to date, ``overwrite`` or not (exit 3)."""
    return NothingToDoError(
        f"nothing to do: {out_path} is up to date (written by this model, with the same settings, from the "
        "same input); overwrite=True replaces only an output that is not: delete it to write it again",
        param="overwrite",
    )


def refuse_current(output: Output, plan: OutputPlan, overwrite: bool) -> None:
    """`up_to_date_error` where ``output`` holds what ``plan`` writes (with ``overwrite``: ours checked first)."""
    if not output.exists():
        return
    if overwrite:
        output.check_replaceable(overwrite)  # only an output of ours, of this kind, is looked into
    if output_is_current(output, plan):
        raise up_to_date_error(split_spec(output.spec)[0])


def _prepare_writing(source: Source, output: Output, plan: OutputPlan, options: ApplyOptions, threads: int) -> _Writing:
    """Check an existing output (current, ours, ``overwrite``) and make the record a resume must match."""
    out_path, _ = split_spec(output.spec)
    exists = output.exists()
    if exists and options.overwrite:
        output.check_replaceable(options.overwrite)  # only an output of ours, of this kind, is looked into
    sampler = None
    if exists or (not options.restart and output.has_progress()):  # compared with what is recorded: hashed now
        source_print = fingerprint(source)
    else:  # hashed from the rows as they are read (on a compressed store a separate read decodes chunks)
        source_print, sampler = describe(source), Sampler(source)
    if exists:
        sha = source_print.sha256_sampled
        assert sha is not None  # fingerprint() hashes the sampled rows
        if output_is_current(output, replace(plan, source_sha256=sha)):
            raise up_to_date_error(out_path)
        if not options.overwrite:
            raise OutputExistsError.at(out_path)
    return _Writing(plan, plan.resume_record(source_print, threads), sampler)


def _open_sink(output: Output, writing: _Writing, options: ApplyOptions) -> tuple[Sink, int, int]:
    """``(sink, first row to write, non-finite rows so far)``: a partial output resumed, or a new one."""
    resumed = None if options.restart else output.resume(writing.plan, writing.record)
    if resumed is not None:
        return resumed[0], resumed[1].rows_done, resumed[1].n_nonfinite
    return output.create(writing.plan, options.overwrite), 0, 0


#: A block whitened by a worker: ``(begin, end, rows out, non-finite rows, kept columns, release)``,
#: ``release()`` giving its buffer back once written.
_Whitened = tuple[int, int, np.ndarray, int, Any, Callable[[], None]]


class _BlockRun:
    """The blocks of one apply: projected by workers, written in row order by a writer thread, resumable."""

    def __init__(
        self,
        model: WhiteningModel,
        source: Source,
        sink: Sink,
        writing: _Writing,
        options: ApplyOptions,
        threads: int,
        watch: Watch,
    ) -> None:
        self.source, self.sink, self.writing, self.options, self.watch = source, sink, writing, options, watch
        self.record = writing.record
        self.work = np.float64 if source.dtype == np.float64 else np.float32
        weights, shift = model.projection(self.work)
        rows = min(writing.rows_per_block, source.n_rows)
        # float16 is widened to float32 as it is decoded, where the backend can: no copy of its own
        self.inputs = PerThread((rows, source.n_features), source.read_dtype)
        # Output buffers go back to their pool once written; aligned, so whole chunks can be written directly.
        self.products = BufferPool((rows, model.n_components), self.work)
        storage = writing.plan.storage
        self.quantization: Quantization | None = None if storage is None else storage.encoder  # None: floats
        stored = None if self.quantization is not None else sink.dtype
        self.how = BlockTransform(weights, shift, options.normalize, stored, options.skip_nonfinite, source.label)
        # a float output of another dtype is cast into pooled buffers; codes are new (small) arrays
        wanted = self.work if self.quantization is not None else sink.dtype
        self.converted = None if wanted == self.work else BufferPool((rows, model.n_components), wanted)
        # Fewer blocks in the whole input than threads: fewer workers, each with more BLAS threads.
        self.workers = min(threads, max(1, source.n_blocks(writing.rows_per_block)))
        self.pending: deque[Future[None]] = deque()

    def whiten(self, begin: int, end: int, fetched: Future[Fetched | None] | None = None) -> _Whitened:
        """In a worker thread: read the block into this thread's buffer, centre it there, project it."""
        source, options = self.source, self.options
        buffer_in = self.inputs.get()
        if fetched is None:
            rows = source.read_into(begin, end, buffer_in)
        else:  # decode the stored bytes fetched ahead
            rows = source.read_into(begin, end, buffer_in, fetched=fetched.result())
        if self.writing.sampler is not None:
            self.writing.sampler.offer(begin, rows)  # before it is centred in place
        keep = list(options.keep_columns)
        kept = source.read_columns(begin, end, keep) if keep else None
        product = self.products.take()
        buffer = None if self.converted is None else self.converted.take()
        out, nonfinite = transform_block(
            rows,
            begin + source.first_row,  # messages name the input's row
            self.how,
            overwrite_input=True,
            out=product,
            reread=lambda: source.read(begin, end),
            into=buffer,
        )
        if self.quantization is not None:  # the encode step: codes of the block, its float buffer given back
            codes = encode_block(out, self.quantization)
            self.products.give_back(product)
            return begin, end, codes, nonfinite, kept, lambda: None
        if buffer is None:
            return begin, end, out, nonfinite, kept, lambda: self.products.give_back(product)
        self.products.give_back(product)
        converted = self.converted
        assert converted is not None  # it gave the buffer
        return begin, end, out, nonfinite, kept, lambda: converted.give_back(buffer)

    def write(self, begin: int, out: np.ndarray, kept: Any, release: Callable[[], None]) -> None:
        """In the writer thread: write one block, then give its buffer back."""
        if kept is None:
            self.sink.write(begin, out)
        else:
            self.sink.write(begin, out, kept)
        release()

    def finish_writes(self, keep: int = 0) -> None:
        """Wait until at most ``keep`` writes are unfinished; a write's error surfaces here."""
        while len(self.pending) > keep:
            self.pending.popleft().result()

    def source_sha256(self) -> str | None:
        """The hash of the input's sampled rows, from those read so far and the others (read now)."""
        if self.record.source.sha256_sampled is None:
            assert self.writing.sampler is not None  # hashed up front otherwise
            digest = self.writing.sampler.hexdigest(self.source)
            self.record = replace(self.record, source=replace(self.record.source, sha256_sampled=digest))
        return self.record.source.sha256_sampled

    def write_all(self, start: int, n_nonfinite: int) -> int:
        """Write every block from row ``start``; returns the non-finite rows counted in all."""
        source = self.source
        # a reader thread fetches the stored bytes of the ``workers + 1`` blocks ordered_map has in flight
        reader = None
        if self.workers > 1 and source.decoder is not None:
            reader = ThreadPoolExecutor(1, thread_name_prefix="streamwhiten-read")

        def tasks() -> Iterator[tuple[Any, ...]]:
            for begin, end in source.blocks(self.writing.rows_per_block, start):
                yield (begin, end) if reader is None else (begin, end, reader.submit(source.fetch, begin, end))

        with kept_for_next_run(self.inputs, self.products, self.converted):  # after the writer and workers stopped
            writer = ThreadPoolExecutor(1, thread_name_prefix="streamwhiten-write")
            results = ordered_map(self.whiten, tasks(), self.workers, worker_blas_threads(self.workers))
            try:
                n_nonfinite = self._fold(results, writer, n_nonfinite)
            finally:
                results.close()
                if reader is not None:
                    reader.shutdown(wait=True, cancel_futures=True)
                _join(writer)  # no write may still be running when the sink is closed, committed or removed
        return n_nonfinite

    def _fold(self, results: Iterable[_Whitened], writer: ThreadPoolExecutor, n_nonfinite: int) -> int:
        """Queue each block's write in row order, saving progress; a stop saves it and raises."""
        n_rows, last_record = self.source.n_rows, time.perf_counter()
        for begin, end, out, nonfinite, kept, release in results:  # written in row order by the writer
            n_nonfinite += nonfinite
            self.finish_writes(keep=1)  # the previous block may still be in writing while this one is queued
            self.pending.append(writer.submit(self.write, begin, out, kept, release))
            stopping = self.watch.stop_asked() and end < n_rows
            due = time.perf_counter() - last_record >= self.options.progress_seconds
            if end < n_rows and (stopping or due):
                self.finish_writes()
                self.source_sha256()  # a resume compares the whole fingerprint
                self.sink.save_progress(self.record.at(end, n_nonfinite))  # fsyncs what was written: not every block
                last_record = time.perf_counter()
            self.watch.report(end, n_rows)
            if stopping:
                raise InterruptedRunError(
                    f"interrupted after {end:,} of {n_rows:,} rows; run the same apply again to resume"
                )
        self.finish_writes()
        return n_nonfinite
