"""The fit loop: stream row blocks from one or more sources into a `Moments`.

A `FitPlan` is a starting state (empty, or a model's for an update) and one cursor per source. Blocks
(`plan_blocks`) are reduced by worker threads (``_threads``) into reused buffers (``_buffers``) and folded
in a fixed order, so a plan resumed from a checkpoint gives exactly the bits of one that never stopped.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import astuple, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import params
from .._buffers import PerThread, as_array, kept_for_next_run
from .._durable import check_replaceable
from .._npz import foreign_npz, read_npz, write_npz_atomic
from ..core import stats
from ..core.validate import checkpoint_fields
from ..errors import (
    BadInputError,
    InterruptedRunError,
    ModelFileError,
    NonFiniteError,
    NothingToDoError,
    StoreIOError,
)
from ..io import (
    Sampler,
    Source,
    count_blocks,
    describe,
    exists,
    expand_specs,
    fingerprint,
    identity_of,
    open_source,
    remote,
)
from ..io.codecs import Fetched
from ..options import ReadOptions
from ..progress import Watch
from ..records import Fingerprint
from ._threads import ordered_map, resolve_threads, worker_blas_threads

if TYPE_CHECKING:
    from ..core.model import WhiteningModel

#: A fit's inputs: a spec (a path, URL or glob; or an open source), or several.
Specs = str | os.PathLike[str] | Source | Iterable[str | os.PathLike[str] | Source]

CHECKPOINT_FORMAT = "streamwhiten-checkpoint"
CHECKPOINT_VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    """Where a fit saves its state, every ``every_blocks`` blocks or ``every_seconds`` (first to come)."""

    path: str
    every_blocks: int | None = None
    every_seconds: float | None = None


@dataclass
class Cursor:
    """One source's part of a fit: rows ``[start, stop)``, done up to ``next_row``."""

    spec: str
    fingerprint: Fingerprint
    start: int
    stop: int
    next_row: int
    n_skipped: int = 0

    @property
    def done(self) -> bool:
        return self.next_row >= self.stop

    def to_dict(self) -> dict[str, Any]:
        """The JSON object a checkpoint records of this cursor."""
        return dict(vars(self), fingerprint=self.fingerprint.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Cursor:
        """The cursor a checkpoint recorded as ``data`` (checked by ``core.validate.checkpoint_fields``)."""
        return cls(**dict(data, fingerprint=Fingerprint.from_dict(data["fingerprint"])))


@dataclass(frozen=True)
class PassOptions:
    """What changes a pass's statistics besides its rows: a checkpoint resumes only the same."""

    precision: str = "auto"
    skip_nonfinite: bool = False
    fill_missing_chunks: bool = False


@dataclass
class FitPlan:
    """A fit planned or in progress: the state so far and where each source stands."""

    state: stats.Moments
    cursors: list[Cursor]
    block_rows: int
    precision: str = "auto"
    skip_nonfinite: bool = False
    base_rows: int = 0  # rows already in the state when the fit was planned (an update's model)
    kept_sources: list[Fingerprint] = field(default_factory=list)  # sources in an updated model not read again
    seconds: float = 0.0
    n_blocks: int = 0
    threads: int = 0  # worker threads, fixed when the plan first runs (0: not yet)
    #: how its sources are opened (a checkpoint records only ``fill_missing_chunks``: storage is the caller's)
    read: ReadOptions = field(default_factory=ReadOptions, compare=False)

    @property
    def fill_missing_chunks(self) -> bool:
        return self.read.fill_missing_chunks

    @property
    def n_skipped(self) -> int:
        return sum(cursor.n_skipped for cursor in self.cursors)

    @property
    def rows_total(self) -> int:
        return sum(cursor.stop - cursor.start for cursor in self.cursors)

    @property
    def rows_done(self) -> int:
        return sum(cursor.next_row - cursor.start for cursor in self.cursors)

    @property
    def done(self) -> bool:
        return all(cursor.done for cursor in self.cursors)

    @property
    def options(self) -> PassOptions:
        """What changes the statistics besides the rows."""
        return PassOptions(self.precision, self.skip_nonfinite, self.fill_missing_chunks)

    def result(self) -> FitResult:
        """What the finished plan produced (sources: those read, then those an update kept)."""
        sources = [cursor.fingerprint for cursor in self.cursors] + self.kept_sources
        return FitResult(
            self.state, self.n_skipped, sources, self.n_blocks, self.seconds, self.rows_done, *astuple(self.options)
        )


@dataclass
class FitResult:
    """What a fit produced: the state plus what it read, and the options that shaped the state."""

    state: stats.Moments
    n_skipped: int = 0
    sources: Sequence[Fingerprint] = field(default_factory=list)
    n_blocks: int = 0
    seconds: float = 0.0
    rows_read: int | None = None  # default: every row counted or skipped
    precision: str = "auto"
    skip_nonfinite: bool = False
    fill_missing_chunks: bool = False

    @property
    def rows_per_second(self) -> float:
        rows = self.state.n_rows + self.n_skipped if self.rows_read is None else self.rows_read
        return rows / self.seconds if self.seconds > 0 else float("nan")


def open_sources(specs: Specs, *, read: ReadOptions | None = None) -> list[Source]:
    """Open every spec (globs and Parquet shard directories expanded) as ``read`` says, all of one width:
    one source needs 2 rows; among several, an empty one (a shard not yet written) is read once it grows."""
    read = read or ReadOptions()
    specs = expand_specs([specs] if isinstance(specs, (str, os.PathLike, Source)) else list(specs), read)
    if not specs:
        raise BadInputError("no input given")
    min_rows = 2 if len(specs) == 1 else 0
    sources: list[Source] = []
    seen: dict[tuple[tuple[Any, ...], str], int] = {}
    try:
        for spec in specs:
            source = open_source(spec, read=read, min_rows=min_rows)
            sources.append(source)
            first = sources[seen.setdefault(source.identity, len(sources) - 1)]  # the same file given before
            if first is not source:
                how = "" if source.location == first.location else ", the same file by another path"
                raise BadInputError(
                    f"{source.label}: given twice (also as {first.label}{how}); each input is read once"
                )
            if source.n_features != sources[0].n_features:
                raise BadInputError(
                    f"{source.label}: has {source.n_features} columns but "
                    f"{sources[0].label} has {sources[0].n_features}"
                )
    except BaseException:
        for source in sources:
            source.close()
        raise
    return sources


def reduce_block(
    rows: np.ndarray,
    begin: int,
    label: str | None,
    precision: str = "auto",
    skip_nonfinite: bool = False,
    overwrite_input: bool = False,
    workspace: np.ndarray | None = None,
) -> tuple[stats.Moments, int]:
    """Every engine's per-block step: the moments of a block read at row ``begin`` of ``label`` (None: an
    array), and the rows skipped. NaN or Inf: `NonFiniteError` naming the row, unless ``skip_nonfinite``."""
    n_skipped = 0
    if skip_nonfinite:
        rows, n_skipped = stats.drop_nonfinite(rows)
    try:
        return stats.block_moments(rows, precision, workspace, overwrite_input), n_skipped
    except NonFiniteError as exc:
        assert exc.row is not None  # block_moments names the row
        row = begin + exc.row
        if label is None:
            message = f"row {row} holds NaN or Inf (use skip_nonfinite=True to skip such rows)"
        else:
            message = f"{label}: row {row} holds NaN or Inf (skip such rows with skip_nonfinite=True)"
        raise NonFiniteError(message, row=row, param="skip_nonfinite") from None


def fold_array(
    state: stats.Moments,
    rows: np.ndarray,
    block_rows: int,
    precision: str = "auto",
    skip_nonfinite: bool = False,
    threads: int | None = None,
) -> tuple[stats.Moments, int]:
    """Fold an in-memory array into ``state`` as a store is folded; the state and the rows skipped."""
    threads = min(resolve_threads(threads), max(1, -(-rows.shape[0] // block_rows)))
    dtype = stats.working_dtype(rows.dtype, precision)
    workspaces = PerThread((min(block_rows, rows.shape[0]), rows.shape[1]), dtype)

    def moments(begin: int) -> tuple[stats.Moments, int]:
        return reduce_block(
            rows[begin : begin + block_rows], begin, None, precision, skip_nonfinite, workspace=workspaces.get()
        )

    n_skipped = 0
    with kept_for_next_run(workspaces):
        results = ordered_map(
            moments, ((begin,) for begin in range(0, rows.shape[0], block_rows)), threads, worker_blas_threads(threads)
        )
        try:
            for block_state, skipped in results:
                state = stats.merge(state, block_state)
                n_skipped += skipped
        finally:
            results.close()
    return state, n_skipped


def check_enough_rows(state: stats.Moments, sources: Iterable[object]) -> None:
    """A fit needs at least two finite rows in all; ``sources`` are anything with a ``label`` or ``spec``."""
    if state.n_rows < 2:
        names = ", ".join(str(getattr(s, "label", None) or getattr(s, "spec", "?")) for s in sources)
        raise BadInputError(f"only {state.n_rows} finite row(s) in {names}; at least 2 are needed")


def plan_blocks(sources: list[Source], block_rows: int | None = None) -> int:
    """``block_rows`` if given, else the largest natural block of ``sources`` (whole chunks or row groups,
    about 64 MiB): every engine reduces the same blocks, so only the order of the merges can differ."""
    if block_rows is not None:
        return int(params.check("chunk_rows", block_rows))
    return max(source.default_block_rows() for source in sources)


def plan_fit(
    specs: Specs,
    precision: str = "auto",
    skip_nonfinite: bool = False,
    block_rows: int | None = None,
    *,
    read: ReadOptions | None = None,
    update: WhiteningModel | None = None,
) -> FitPlan:
    """A plan reading every row of every source from an empty state; or, with ``update`` (a model fitted
    from stores), only the rows appended since, folded into its state (a new source is read whole;
    `NothingToDoError` when nothing is new). ``block_rows`` given wins over ``read``'s."""
    params.check("precision", precision)  # before any reading
    recorded = [] if update is None else _updatable(update.sources)
    read = read or ReadOptions()
    block_rows = block_rows if block_rows is not None else read.block_rows
    sources = open_sources(specs, read=read)
    try:
        state = stats.Moments.empty(sources[0].n_features) if update is None else update.state
        if sources[0].n_features != state.n_features:
            raise BadInputError(
                f"{sources[0].label}: has {sources[0].n_features} columns but the model has {state.n_features}"
            )
        cursors = [_update_cursor(source, recorded, sources) for source in sources]
        kept = [r for r in recorded if not any(_same_source(r, source) for source in sources)]
        _refuse_deleted(kept, read)
        blocks = plan_blocks(sources, block_rows)
        plan_read = replace(read, dataset=None)  # each cursor's spec names its array
        plan = FitPlan(state, cursors, blocks, precision, bool(skip_nonfinite), state.n_rows, kept, read=plan_read)
    finally:
        for source in sources:
            source.close()
    if update is not None and plan.rows_total == 0:
        raise NothingToDoError("nothing to do: no rows were added since the model was fitted")
    return plan


def _same_source(recorded: Fingerprint, source: Source) -> bool:
    """Whether the recorded fingerprint is ``source``: the same file (device and inode) and dataset."""
    assert recorded.path is not None  # _updatable refuses a record without one
    return identity_of(recorded.path, recorded.dataset or "") == source.identity


def check_prefix(source: Source, recorded: Fingerprint) -> Fingerprint | None:
    """Refuse a source whose first ``recorded.n_rows`` rows are not those recorded; their fingerprint now (None
    without a hash). A checkpoint's record is hashed below ``rows_read`` (being read) or not at all (not yet)."""
    n_rows = recorded.n_rows
    assert n_rows is not None  # checked by _updatable (a model's record), always there (a checkpoint's)
    if source.n_rows < n_rows:
        raise BadInputError(
            f"{source.label}: has {source.n_rows} rows but {n_rows} were recorded; the source was "
            "changed, not appended to (start over with a full fit)"
        )
    now = describe(source, n_rows)
    if now.layout_sha256 != recorded.layout_sha256:
        raise BadInputError(
            f"{source.label}: its first {n_rows} rows are no longer stored as recorded "
            f"({source.layout_change}); only appended rows can be added (start over with a full fit)"
        )
    for key in ("n_features", "dtype"):
        if getattr(now, key) != getattr(recorded, key):
            raise _changed(source, n_rows, key)
    if recorded.sha256_sampled is not None:
        now = replace(now, sha256_sampled=Sampler(source, n_rows).hexdigest(source))
        if now.sha256_sampled != recorded.sha256_sampled:
            raise _changed(source, n_rows, "sha256_sampled")
        return now
    if recorded.sha256_read is not None:
        rows_read = recorded.rows_read
        assert rows_read is not None  # recorded with sha256_read
        if Sampler(source, n_rows).hexdigest(source, below=rows_read) != recorded.sha256_read:
            raise _changed(source, rows_read, "sha256_read")
    return None


def _changed(source: Source, n_rows: int, key: str) -> BadInputError:
    return BadInputError(
        f"{source.label}: its first {n_rows} rows differ from the recorded ones ({key} changed); "
        "only appended rows can be added (start over with a full fit)"
    )


def _refuse_if_moved(source: Source, recorded_sources: list[Fingerprint], sources: list[Source]) -> None:
    """Refuse a 'new' source holding a recorded source's rows (moved or copied): they would count twice."""
    given = {s.identity for s in sources}
    for recorded in recorded_sources:
        assert recorded.path is not None and recorded.n_rows is not None  # _updatable refuses records without
        given_again = identity_of(recorded.path, recorded.dataset or "") in given
        alike = recorded.n_features == source.n_features and recorded.dtype == str(source.dtype)
        if given_again or not alike or not 0 < recorded.n_rows <= source.n_rows:  # empty: a prefix of everything
            continue
        if fingerprint(source, recorded.n_rows).sha256_sampled == recorded.sha256_sampled:
            raise BadInputError(
                f"{source.label}: starts with the same rows as {recorded.path}, which the model has already "
                "read; it looks moved or copied, and reading it again would count those rows twice "
                "(give the original path, or refit from scratch)"
            )


def _updatable(recorded_sources: Iterable[Fingerprint]) -> list[Fingerprint]:
    """A model's source records, refused unless each says enough to be updated (a fit from stores)."""
    recorded_sources = list(recorded_sources)
    for index, record in enumerate(recorded_sources):
        missing = record.missing(("path", "n_rows", "n_features", "dtype", "sha256_sampled"))
        if missing:
            raise BadInputError(
                f"the model's record of its source {index} has no {', '.join(missing)}: it was not fitted from "
                "stores, so it cannot be updated (refit without update)",
                param="update",
            )
    return recorded_sources


def _update_cursor(source: Source, recorded_sources: list[Fingerprint], sources: list[Source]) -> Cursor:
    """The cursor of ``source``: the rows appended since its record, or every row of a new source."""
    current = describe(source)  # its sampled rows are hashed as the pass reads them
    recorded = next((r for r in recorded_sources if _same_source(r, source)), None)
    if recorded is None:
        _refuse_if_moved(source, recorded_sources, sources)
        return Cursor(source.label, current, 0, source.n_rows, 0)
    prefix = check_prefix(source, recorded)
    assert recorded.n_rows is not None  # every record has one (refused by _updatable otherwise)
    if prefix is not None and source.n_rows == recorded.n_rows:  # nothing appended: the whole source
        current = prefix
    return Cursor(source.label, current, recorded.n_rows, source.n_rows, recorded.n_rows)


def _refuse_deleted(kept: list[Fingerprint], read: ReadOptions) -> None:
    """Refuse an update whose recorded sources not given again (``kept``) were deleted."""
    for recorded in kept:
        assert recorded.path is not None  # every record has one (refused by _updatable otherwise)
        if not exists(recorded.path, read):
            raise BadInputError(
                f"{recorded.where}: recorded in the model ({recorded.n_rows:,} rows) but deleted since; an update "
                "cannot take rows out of the statistics (restore it, or refit from scratch without update)",
                param="update",
            )


def save_checkpoint(plan: FitPlan, path: str) -> None:
    """Write the plan's state and cursors atomically (temp file, fsync, rename) with a checksum."""
    names = ("block_rows", "precision", "skip_nonfinite", "base_rows", "threads", "fill_missing_chunks")
    meta = {name: getattr(plan, name) for name in names}
    meta.update(cursors=[c.to_dict() for c in plan.cursors], kept_sources=[s.to_dict() for s in plan.kept_sources])
    arrays = {
        "format": np.array(CHECKPOINT_FORMAT),
        "format_version": np.array(CHECKPOINT_VERSION, dtype=np.int64),
        "n_rows": np.array(plan.state.n_rows, dtype=np.int64),
        "mean": plan.state.mean,
        "scatter": plan.state.scatter,
        "meta_json": np.array(json.dumps(meta, sort_keys=True)),
    }
    write_npz_atomic(path, arrays, "checkpoint")


def check_checkpoint_output(path: str) -> None:
    """Refuse a checkpoint path holding anything but a fit checkpoint, which a fit replaces and removes."""
    check_replaceable(path, True, "a fit checkpoint", lambda found: foreign_npz(found, CHECKPOINT_FORMAT))


def load_checkpoint(path: str, read: ReadOptions | None = None) -> FitPlan:
    """Read a checkpoint (`ModelFileError` if damaged); its sources open with ``read``'s storage options."""
    hint = "; delete it or pass restart=True to start the fit over"
    try:
        arrays = read_npz(path, "checkpoint", CHECKPOINT_FORMAT, CHECKPOINT_VERSION)
        fields = checkpoint_fields(arrays, path)
    except ModelFileError as exc:
        raise ModelFileError(f"{exc}{hint}", param="restart") from None
    meta = fields["meta"]
    state = stats.Moments(fields["n_rows"], fields["mean"], fields["scatter"])
    cursors = [Cursor.from_dict(cursor) for cursor in meta["cursors"]]
    kept = [Fingerprint.from_dict(source) for source in meta["kept_sources"]]
    options = (int(meta["block_rows"]), meta["precision"], bool(meta["skip_nonfinite"]), int(meta["base_rows"]))
    fill = bool(meta.get("fill_missing_chunks", False))
    read = replace(read or ReadOptions(), dataset=None, fill_missing_chunks=fill)
    return FitPlan(state, cursors, *options, kept, threads=int(meta.get("threads", 0)), read=read)


def check_resumable(
    plan: FitPlan, checkpoint_path: str, options: PassOptions, base_rows: int, inputs: Sequence[str], exact: bool = True
) -> None:
    """Refuse to resume ``plan`` for other inputs, options (`PassOptions`) or starting model (``base_rows``:
    0 for a fresh fit), or when its sources changed. ``exact``: ``inputs`` must be the checkpoint's, in
    order; otherwise it may read only inputs among them (a ``job.toml`` run)."""
    hint = f"; pass restart=True to discard {checkpoint_path} and start over"
    if exact:
        other = [c.spec for c in plan.cursors] != list(inputs)
    else:
        wanted = {_identity(spec, plan.read) for spec in inputs}
        other = any(_identity(cursor.spec, plan.read) not in wanted for cursor in plan.cursors)
    if other:
        raise BadInputError(
            f"{checkpoint_path}: checkpoint is for other inputs ({', '.join(c.spec for c in plan.cursors)}){hint}",
            param="restart",
        )
    if plan.options != options:
        raise BadInputError(
            f"{checkpoint_path}: checkpoint was made with other options (precision, skip_nonfinite, "
            f"fill_missing_chunks){hint}",
            param=("restart", "precision", "skip_nonfinite", "fill_missing_chunks"),
        )
    if plan.base_rows != base_rows:
        raise BadInputError(f"{checkpoint_path}: checkpoint is for another starting model{hint}", param="restart")
    check_sources_unchanged(plan, checkpoint_path)


def _identity(spec: str, read: ReadOptions) -> tuple[tuple[Any, ...], str]:
    with open_source(spec, read=replace(read, fill_missing_chunks=False), min_rows=0) as source:
        return source.identity


def check_sources_unchanged(plan: FitPlan, checkpoint_path: str) -> None:
    """Refuse a checkpointed plan whose sources no longer start with the rows it recorded."""
    for cursor in plan.cursors:
        with open_source(cursor.spec, read=plan.read, min_rows=0) as source:
            try:
                check_prefix(source, cursor.fingerprint)
            except BadInputError as exc:
                raise BadInputError(f"{exc} (refusing to resume from {checkpoint_path})") from None


def _block_buffers(plan: FitPlan) -> tuple[PerThread, PerThread]:
    """Two reused byte buffers per worker: one for a block of the widest read dtype of the sources left,
    one for a float64 block where rows are centred into another dtype than read (``precision='float64'``)."""
    remaining = [cursor for cursor in plan.cursors if not cursor.done] or plan.cursors
    itemsize = max(4, *(np.dtype(c.fingerprint.dtype).itemsize for c in remaining))  # float16 is read as float32
    rows = max(1, min(plan.block_rows, plan.rows_total - plan.rows_done))
    n_features = remaining[0].fingerprint.n_features
    assert n_features is not None  # a cursor's fingerprint is a whole description (io.describe)
    return PerThread((rows * n_features * itemsize,), np.uint8), PerThread((rows * n_features * 8,), np.uint8)


#: The arguments of `_read_block_moments` for one block.
_BlockTask = tuple[
    int, int, int, Source, "tuple[PerThread, PerThread]", "FitPlan", "Future[Fetched | None] | None", "Sampler | None"
]


def _block_tasks(
    plan: FitPlan,
    opened: list[Source],
    buffers: tuple[PerThread, PerThread],
    samplers: dict[int, tuple[Sampler, Source]],
    reader: ThreadPoolExecutor | None = None,
) -> Iterator[_BlockTask]:
    """One task per remaining block, opening each source as reached (into ``opened``); an unhashed source
    gets a `Sampler` (``samplers[cursor index]``); a ``reader`` thread fetches ahead the bytes to decode."""
    for index, cursor in enumerate(plan.cursors):
        if cursor.done:
            continue
        source = open_source(cursor.spec, read=plan.read)
        opened.append(source)
        sampler = None
        if cursor.fingerprint.sha256_sampled is None:
            sampler = Sampler(source, cursor.fingerprint.n_rows)
            samplers[index] = sampler, source
        ahead = reader if reader is not None and source.decoder is not None else None
        for begin, end in source.blocks(plan.block_rows, cursor.next_row, cursor.stop):
            fetched = ahead.submit(source.fetch, begin, end) if ahead is not None else None
            yield index, begin, end, source, buffers, plan, fetched, sampler


def _read_block_moments(
    index: int,
    begin: int,
    end: int,
    source: Source,
    buffers: tuple[PerThread, PerThread],
    plan: FitPlan,
    fetched: Future[Fetched | None] | None = None,
    sampler: Sampler | None = None,
) -> tuple[int, int, int, stats.Moments, int, Source]:
    """One block in a worker thread: read it into this thread's buffer (decoding bytes ``fetched`` ahead),
    offer it to ``sampler``, then its moments (centred in that buffer, or the second one for another dtype)."""
    reads, workspaces = buffers
    shape = (end - begin, source.n_features)
    into = as_array(reads.get(), shape, source.read_dtype)
    if fetched is not None:
        rows = source.read_into(begin, end, into, fetched=fetched.result())
    else:
        rows = source.read_into(begin, end, into)
    if sampler is not None:
        sampler.offer(begin, rows)
    work = stats.working_dtype(rows.dtype, plan.precision)
    workspace = None
    if work != rows.dtype and rows.dtype != np.float16:  # float16 is widened in a copy of its own
        workspace = as_array(workspaces.get(), shape, work)
    moments, skipped = reduce_block(rows, begin, source.label, plan.precision, plan.skip_nonfinite, True, workspace)
    return index, begin, end, moments, skipped, source


def run_plan(
    plan: FitPlan, watch: Watch = Watch(), checkpoint: Checkpoint | None = None, threads: int | None = None
) -> FitPlan:
    """Fold every remaining block of ``plan`` into its state; returns it, finished.

    ``watch`` is told the rows done; when it asks to stop, a last checkpoint is written and
    `InterruptedRunError` raised. ``threads`` workers (default: one per core, at most four; a resumed plan
    keeps its own). Memory: at most ``2 x workers + 1`` blocks and ``workers`` chunks, kept for the next run."""
    began = time.perf_counter()
    # kept across resumes (BLAS rounding can depend on its threads); more for remote sources (network waits)
    plan.threads = plan.threads or resolve_threads(remote.default_threads(threads, [c.spec for c in plan.cursors]))
    blocks = sum(count_blocks(c.start, c.stop, plan.block_rows) for c in plan.cursors)  # done or not
    workers = min(plan.threads, max(1, blocks))  # fewer blocks: fewer workers, more BLAS threads
    run = _PlanRun(plan, watch, checkpoint)
    buffers = _block_buffers(plan)
    reader = ThreadPoolExecutor(1, thread_name_prefix="streamwhiten-read") if workers > 1 else None
    with kept_for_next_run(*buffers):  # once the workers have stopped
        tasks = _block_tasks(plan, run.opened, buffers, run.samplers, reader)
        results = ordered_map(_read_block_moments, tasks, workers, worker_blas_threads(workers))
        try:
            for result in results:
                run.fold(*result)
            for cursor in plan.cursors:  # hash the sources the pass read no rows of (an empty one, say)
                if cursor.fingerprint.sha256_sampled is None:
                    with open_source(cursor.spec, read=plan.read, min_rows=0) as source:
                        cursor.fingerprint = cursor.fingerprint.finished(
                            Sampler(source, cursor.fingerprint.n_rows).hexdigest(source)
                        )
        finally:
            results.close()  # stops the workers before their sources are closed
            if reader is not None:
                reader.shutdown(wait=True, cancel_futures=True)
            for source in run.opened:
                source.close()
    plan.seconds += time.perf_counter() - began
    check_enough_rows(plan.state, plan.cursors)
    return plan


class _PlanRun:
    """One run of a plan: its open sources, the samplers hashing them, and when it last checkpointed."""

    def __init__(self, plan: FitPlan, watch: Watch, checkpoint: Checkpoint | None) -> None:
        self.plan, self.watch, self.checkpoint = plan, watch, checkpoint
        self.opened: list[Source] = []
        self.samplers: dict[int, tuple[Sampler, Source]] = {}
        self.last_saved, self.blocks_since = time.perf_counter(), 0

    def due(self, every: Checkpoint) -> bool:
        """Whether a checkpoint is due: ``every_blocks`` blocks or ``every_seconds`` since the last one."""
        if every.every_blocks and self.blocks_since >= every.every_blocks:
            return True
        seconds = every.every_seconds
        return seconds is not None and seconds > 0 and time.perf_counter() - self.last_saved >= seconds

    def fold(self, index: int, _begin: int, end: int, moments: stats.Moments, skipped: int, source: Source) -> None:
        """Fold one block of cursor ``index``, report it, checkpoint when due or asked to stop (then raise)."""
        plan, cursor = self.plan, self.plan.cursors[index]
        plan.state = stats.merge(plan.state, moments)
        cursor.n_skipped += skipped
        cursor.next_row = end
        if end == cursor.stop:
            if index in self.samplers:  # the whole hash of its sampled rows: those offered, any others read
                cursor.fingerprint = cursor.fingerprint.finished(self.samplers.pop(index)[0].hexdigest(source))
            source.close()
            self.opened.remove(source)
        plan.n_blocks += 1
        self.blocks_since += 1
        self.watch.report(plan.rows_done, plan.rows_total)
        stopping = self.watch.stop_asked() and not plan.done
        if self.checkpoint is not None and (stopping or self.due(self.checkpoint)):
            for reading, (sampler, opened) in self.samplers.items():  # a resume checks the rows read so far
                at = plan.cursors[reading]
                at.fingerprint = at.fingerprint.read_to(at.next_row, sampler.hexdigest(opened, below=at.next_row))
            save_checkpoint(plan, self.checkpoint.path)
            self.last_saved, self.blocks_since = time.perf_counter(), 0
        if stopping:
            where = f"; progress saved to {self.checkpoint.path}" if self.checkpoint is not None else ""
            raise InterruptedRunError(f"interrupted after {plan.rows_done:,} of {plan.rows_total:,} rows{where}")


def fit_sources(
    specs: Specs,
    precision: str = "auto",
    skip_nonfinite: bool = False,
    block_rows: int | None = None,
    watch: Watch = Watch(),
    threads: int | None = None,
    *,
    read: ReadOptions | None = None,
) -> FitResult:
    """One pass over every source, in order, without a checkpoint (`plan_fit`, `run_plan`)."""
    plan = plan_fit(specs, precision, skip_nonfinite, block_rows, read=read)
    return run_plan(plan, watch, threads=threads).result()


def finalize_fit(
    result: FitResult, model_params: Mapping[str, Any] | None = None, skipped_before: int = 0
) -> WhiteningModel:
    """The model of a finished fit, recording its sources and pass options (`finalize`)."""
    from ..core.model import finalize

    info = {
        "n_skipped_nonfinite": int(skipped_before + result.n_skipped),
        "precision": result.precision,
        "skip_nonfinite": bool(result.skip_nonfinite),
        "fill_missing_chunks": bool(result.fill_missing_chunks),
    }
    return finalize(result.state, sources=result.sources, info=info, **(model_params or {}))


def remove_checkpoint(path: str | None) -> None:
    """Remove a checkpoint once its model is saved (or to start over)."""
    if path and os.path.exists(path):
        try:
            os.remove(path)
        except OSError as exc:
            raise StoreIOError(f"{path}: cannot remove the checkpoint: {exc.strerror or exc}") from exc
