"""The interface every backend implements: a :class:`Source` of rows and a :class:`Sink` for outputs.

A source is a read-only 2-D array of rows: its shape and dtype, its natural block layout (the store's
chunk rows), rows read into a caller's buffer, a cheap fingerprint, and its attributes. A sink is a new
2-D array written under a hidden temporary name and renamed into place only when complete, so an
interrupted or failed write never leaves something that looks finished, and nothing that existed is
touched before that rename. Backends subclass both; nothing here imports a storage library.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass, replace

import numpy as np

from .. import _durable as durable
from .. import params
from .._buffers import ALIGNMENT
from .._paths import file_identity
from ..errors import BadInputError, CorruptStoreError, InterruptedRunError, StoreIOError
from ..records import Fingerprint, ResumeRecord
from . import remote

#: Default bytes per block read when the caller gives no ``block_rows``: big enough that BLAS runs at
#: full speed, small enough that a couple of blocks in flight stay well inside memory.
DEFAULT_BLOCK_BYTES = 64 << 20
#: Target bytes of one chunk of an output array.
OUTPUT_CHUNK_BYTES = 4 << 20
#: Rows hashed at each sampled position of a fingerprint.
FINGERPRINT_ROWS = 64
#: The attribute every store output of streamwhiten carries (``create_sink`` sets it): how an existing
#: store is recognised as an output of ours, which ``--overwrite`` may replace.
OWNER_ATTR = "streamwhiten_version"
#: How to read past a hole, for the messages that refuse one.
FILL_HINT = " (pass --fill-missing-chunks, or fill_missing_chunks=True, to read unwritten chunks as the fill value)"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


def io_error(exc: BaseException) -> str:
    """An OS or storage-library error as a short one-line reason (without a second copy of the path).

    HDF5 reports a failed system call inside a long multi-line message; its ``error message = '...'``
    part is the reason (e.g. "No space left on device").
    """
    import re

    if getattr(exc, "strerror", None):
        return exc.strerror
    failed = re.search(r"error message = '([^']*)'", str(exc))
    return failed.group(1) if failed else first_line(exc)


def remove(path: str) -> None:
    """Remove a file or a directory tree, if it exists."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def check_array(label: str, shape, dtype, min_rows: int) -> None:
    """Refuse anything but a 2-D float16/32/64 array with at least ``min_rows`` rows."""
    if len(shape) != 2:
        raise BadInputError(f"{label}: expected a 2-D array (rows x features), got {len(shape)}-D shape {tuple(shape)}")
    if np.dtype(dtype).kind != "f" or np.dtype(dtype).itemsize not in (2, 4, 8):
        raise BadInputError(f"{label}: expected float16, float32 or float64 values, got dtype {np.dtype(dtype)}")
    if shape[1] < 1:
        raise BadInputError(f"{label}: has no columns")
    memory = _physical_memory()
    if memory and shape[1] * shape[1] * 8 > memory:
        raise BadInputError(
            f"{label}: has {shape[1]:,} columns, whose d x d statistics would take "
            f"{shape[1] * shape[1] * 8 / 2**30:,.0f} GiB, more than this machine's {memory / 2**30:,.0f} GiB of memory "
            "(is its metadata damaged?)"
        )
    if shape[0] < min_rows:
        raise BadInputError(f"{label}: has {shape[0]} row(s); at least {min_rows} are needed")


def _physical_memory() -> int:
    """Bytes of memory of this machine, or 0 where unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return 0


def name_not_found(
    label: str,
    asked: str | None,
    what: str,
    found: list,
    separator: str = ":/",
    option: bool = True,
    other: str = "",
    problem: str | None = None,
) -> BadInputError:
    """The one way every backend says that a name is not in a store, or that a store holding several
    candidates needs one: what was asked, what the store holds, and how to name one.

    ``asked`` is the name given (None: none was, and the store holds no single candidate); ``what`` the
    kind of thing looked for ("2-D dataset", "vector column"); ``found`` the names of those the store
    holds; ``separator`` what joins the store and a name in a spec (``:/`` or ``:``); ``option``: whether
    ``--dataset`` may name it too; ``other``: more about what the store holds (its other columns);
    ``problem``: what is wrong with ``asked``, if not that it is missing ("/grp is a group, not a dataset").

    ``in.h5: has no 2-D dataset /embeddings; its 2-D datasets: /emb (name it as in.h5:/emb, or with --dataset)``
    """
    shown = ", ".join(found[:10]) + (f" and {len(found) - 10} more" if len(found) > 10 else "")
    if asked is None:
        head = f"{label}: name the {what} to read" if found else f"{label}: holds no {what}"
    else:
        head = f"{label}: {problem or f'has no {what} {asked}'}"
    if found:
        holds = f"; its {what}s: {shown}"
    else:
        holds = f"; it holds no {what}" if asked is not None else ""
    if found:
        first = found[0].lstrip("/")
        how = f" (name {'it' if len(found) == 1 else 'one'} as {label}{separator}{first}"
        how += ", or with --dataset)" if option else ")"
    else:
        how = ""
    return BadInputError(f"{head}{holds}{other}{how}")


def count_blocks(start: int, stop: int, block_rows: int) -> int:
    """Ranges in ``[start, stop)`` when cut at multiples of ``block_rows`` (as :meth:`Source.blocks` does)."""
    return max(0, (stop - 1) // block_rows - start // block_rows + 1) if stop > start else 0


# --------------------------------------------------------------------------------------------- sources


class Source:
    """A read-only 2-D array of rows in a store; iterate it with :meth:`blocks` and :meth:`read_into`.

    Backends set ``path``, ``dataset``, ``shape``, ``dtype`` (native byte order: the storage library
    converts a big-endian store as it reads) and ``chunk_rows`` (rows per store chunk, None for a
    contiguous layout), and implement :meth:`read_into`, :meth:`attrs` and :meth:`close`.
    """

    kind = "?"
    #: the store is read over the network (a URL): blocks are read by more threads, and never by the raw
    #: local-chunk fast path
    remote = False
    #: :meth:`read_into` takes a float32 ``out`` for a float16 store (widening as it reads)
    widens_float16 = False
    #: how this backend decodes compressed chunks itself (``codecs.DecodePlan``); None: it does not
    plan = None

    def __init__(self, path: str, dataset: str | None, shape, dtype, chunk_rows: int | None):
        self.path = path
        self.dataset = dataset
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype).newbyteorder("=")
        self.chunk_rows = chunk_rows
        #: read chunks missing from the store as the array's fill value instead of refusing them
        self.fill_missing_chunks = False

    @property
    def label(self) -> str:
        path = remote.redact(self.path)
        return f"{path}:/{self.dataset}" if self.dataset else path

    @property
    def location(self) -> tuple[str, str]:
        """``(real path, dataset)``: where the array is, as a fingerprint records it (a URL: its normalised
        form, without credentials)."""
        if remote.is_url(self.path):
            return remote.normalize(self.path), self.dataset or ""
        return os.path.realpath(self.path), self.dataset or ""

    @property
    def identity(self) -> tuple:
        """Which array this is, however it was named: see :func:`identity_of` of its :attr:`location`."""
        return identity_of(*self.location)

    @property
    def n_rows(self) -> int:
        return self.shape[0]

    @property
    def n_features(self) -> int:
        return self.shape[1]

    @property
    def read_dtype(self) -> np.dtype:
        """The dtype of the buffer a block is best read into: float32 for a float16 store whose backend
        widens as it reads (:attr:`widens_float16`), the store's own dtype otherwise."""
        dtype = np.dtype(self.dtype)
        return np.dtype(np.float32) if self.widens_float16 and dtype == np.float16 else dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a new C-contiguous array in the store's dtype."""
        return self.read_into(start, stop, np.empty((max(0, stop - start), self.n_features), dtype=self.dtype))

    def read_into(self, start: int, stop: int, out: np.ndarray, fetched=None) -> np.ndarray:
        """Rows ``[start, stop)`` into the preallocated ``out`` (C-contiguous); returns ``out[:stop - start]``.

        ``fetched`` is what :meth:`fetch` returned for the same rows, if it was called ahead. A remote
        store's read is retried on transient failures (``remote.retrying``). Backends implement
        :meth:`_read_into`, or override this where they read otherwise."""
        if self.remote:
            return remote.retrying(
                self.path, f"read rows {start}..{stop - 1}", self._read_into, start, stop, out, fetched
            )
        return self._read_into(start, stop, out, fetched)

    def _read_into(self, start: int, stop: int, out: np.ndarray, fetched=None) -> np.ndarray:
        raise NotImplementedError

    def _decode_into(self, view: np.ndarray, start: int, stop: int, fetched, fill_value) -> np.ndarray:
        """Rows ``[start, stop)`` decoded here (by ``self.plan``) into ``view``, from ``fetched`` or from
        stored bytes fetched now; a chunk that does not decode is a :class:`CorruptStoreError`."""
        from .codecs import DecodeError, decode_rows

        chunks = fetched if fetched is not None else self.fetch(start, stop)
        try:
            return decode_rows(self.plan, chunks, start, stop, view, self.chunk_rows, fill_value, self._describe)
        except DecodeError as exc:
            raise CorruptStoreError(f"{self.label}: {exc}") from None
        finally:
            chunks.release()

    def fetch(self, start: int, stop: int):
        """The stored (compressed) bytes behind rows ``[start, stop)``, read ahead of :meth:`read_into`
        (in another thread, say), or None where the backend has no such split (the default)."""
        return None

    def attrs(self) -> dict:
        """The array's attributes (an output's record of the model that wrote it, for instance)."""
        return {}

    # -- what a fingerprint records (see :func:`fingerprint`); backends refine these
    #: why a source whose layout digest changed is refused, for the message
    layout_change = "the store was rewritten"

    def sample_ranges(self, n_rows: int) -> list:
        """Row ranges of the first ``n_rows`` whose contents a fingerprint hashes: the first and last
        :data:`FINGERPRINT_ROWS` rows and three ranges between (start, quartiles, end)."""
        width = min(FINGERPRINT_ROWS, n_rows)
        starts = sorted({0, n_rows // 4, n_rows // 2, (3 * n_rows) // 4, max(0, n_rows - width)})
        return [(start, min(n_rows, start + width)) for start in starts]

    def layout_digest(self, n_rows: int) -> str | None:
        """A digest of how the first ``n_rows`` rows are stored (a Parquet footer, Lance fragments), for
        stores whose structure says whether they changed; None where there is none (HDF5, Zarr, npy)."""
        return None

    def fingerprint_extra(self) -> dict:
        """More fields a fingerprint records, not compared by an update (a Lance dataset's version)."""
        return {}

    # -- other columns of the same rows (tabular stores only)
    def column_schema(self, names: list):
        """The types of the columns ``names`` (to carry them into an output), checking they exist."""
        raise BadInputError(
            f"{self.label}: --keep-columns needs a Parquet or Lance input (a table with other "
            f"columns); this is a {self.kind} store"
        )

    def read_columns(self, start: int, stop: int, names: list):
        """Rows ``[start, stop)`` of the columns ``names``, as a table of the backend's library."""
        self.column_schema(names)
        raise NotImplementedError

    def default_block_rows(self, target_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
        """Rows per block: a whole number of store chunks, about ``target_bytes`` in all."""
        row_bytes = max(1, self.n_features * self.dtype.itemsize)
        base = self.chunk_rows or 1
        return base * max(1, target_bytes // (base * row_bytes))

    def blocks(self, block_rows: int | None = None, start: int = 0, stop: int | None = None):
        """``(start, stop)`` row ranges covering ``[start, stop)``, aligned to multiples of ``block_rows``."""
        block_rows = int(self.default_block_rows() if block_rows is None else params.check("chunk_rows", block_rows))
        stop = self.n_rows if stop is None else stop
        while start < stop:
            end = min(stop, (start // block_rows + 1) * block_rows)
            yield start, end
            start = end

    def n_blocks(self, block_rows: int, start: int = 0, stop: int | None = None) -> int:
        """How many ranges :meth:`blocks` yields for the same arguments."""
        return count_blocks(start, self.n_rows if stop is None else stop, block_rows)

    def lazy(self) -> LazyRows:
        """A picklable reader of this source's rows for other processes (see :class:`LazyRows`)."""
        path = self.path if remote.is_url(self.path) else os.path.abspath(self.path)
        options = remote.storage_options() if remote.is_url(self.path) else None
        return LazyRows(path, self.dataset, self.shape, self.dtype, self.label, self.fill_missing_chunks, options)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def identity_of(path: str, dataset: str | None = "") -> tuple:
    """The identity of the array ``dataset`` of the file or directory at ``path`` (a source's, or one a
    model recorded), taken now: the ``(device, inode)`` of the file, so a symlink or a hard link of a file
    is that file whatever its path (a URL, or a path that no longer exists: the normalised path)."""
    if remote.is_url(path):
        return ("url", remote.normalize(path)), dataset or ""
    found = file_identity(path)
    return (("inode", *found) if found is not None else ("path", os.path.realpath(path))), dataset or ""


@dataclass(frozen=True)
class LazyRows:
    """A picklable stand-in for a source's rows that opens the store only when a slice is read.

    Open file handles cannot travel to another process (h5py's cannot be pickled at all), so the
    Dask engine hands workers this object instead: each read opens the store by path, checks it
    still has the shape seen when the job was planned, reads and closes. It also has the ``shape``,
    ``dtype``, ``ndim`` and ``__getitem__`` of an array, so ``dask.array.from_array`` can wrap it.
    """

    path: str
    dataset: str | None
    shape: tuple
    dtype: np.dtype
    label: str
    fill_missing_chunks: bool = False
    #: the storage options of a URL, for the worker's process (held in memory and in the task graph only)
    storage_options: dict | None = None

    ndim = 2

    def __repr__(self) -> str:  # never show the storage options
        return f"LazyRows({self.label!r}, shape={self.shape})"

    def __getitem__(self, key) -> np.ndarray:
        from . import open_source

        key = key if isinstance(key, tuple) else (key,)
        rows = key[0] if key else slice(None)
        columns = key[1] if len(key) > 1 else slice(None)
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise BadInputError(f"{self.label}: only contiguous row ranges can be read, got {rows!r}")
        start, stop, _ = rows.indices(self.shape[0])
        stop = max(start, stop)
        options = remote.using(self.storage_options) if self.storage_options is not None else _nothing()
        with (
            options,
            open_source(self.path, self.dataset, min_rows=0, fill_missing_chunks=self.fill_missing_chunks) as source,
        ):
            if source.shape != self.shape:
                raise StoreIOError(f"{self.label}: changed while being read (shape {source.shape}, was {self.shape})")
            block = source.read(start, stop)
        return block if columns == slice(None) else np.ascontiguousarray(block[:, columns])


def _nothing():
    import contextlib

    return contextlib.nullcontext()


def fingerprint(source: Source, n_rows: int | None = None) -> Fingerprint:
    """Identity of the first ``n_rows`` rows of ``source`` (all by default), cheap to compute.

    Hashes a few sampled row ranges (:meth:`Source.sample_ranges`: start, quartiles, end) rather than the
    whole store, so an append-only store still matches the fingerprint of its earlier prefix; where the
    backend has one, adds a digest of how those rows are stored (``layout_sha256``), which an update
    compares too. The sampled rows are read in parallel where the store's compressed chunks are decoded
    here (a chunk each, decoded whole); a pass that reads the rows anyway hashes them with a
    :class:`Sampler` instead.
    """
    result = describe(source, n_rows)
    return replace(result, sha256_sampled=Sampler(source, result.n_rows).hexdigest(source))


def describe(source: Source, n_rows: int | None = None) -> Fingerprint:
    """A :func:`fingerprint` without its hash of sampled rows (``sha256_sampled``): only what the
    store's metadata says, so nothing is decoded. A pass fills in the hash from the rows it reads
    (:class:`Sampler`)."""
    n_rows = source.n_rows if n_rows is None else int(n_rows)
    path, dataset = source.location
    return Fingerprint(
        path=path,
        dataset=dataset,
        n_rows=n_rows,
        n_features=source.n_features,
        dtype=str(source.dtype),
        chunk_rows=source.chunk_rows or 0,
        layout_sha256=source.layout_digest(n_rows),
        **source.fingerprint_extra(),
    )


class Sampler:
    """The rows a fingerprint of the first ``n_rows`` rows of ``source`` hashes, copied out of blocks as a
    pass reads them (:meth:`offer`), so that the pass needs no reads of its own for the fingerprint: on
    a compressed store each sampled range costs a whole chunk's decode.

    Thread-safe: worker threads offer their blocks while another thread may take the digest.
    """

    def __init__(self, source: Source, n_rows: int | None = None):
        import threading

        n_rows = source.n_rows if n_rows is None else int(n_rows)
        self.ranges = source.sample_ranges(n_rows)
        self.rows = [np.empty((stop - start, source.n_features), source.dtype) for start, stop in self.ranges]
        self.seen = [np.zeros(stop - start, bool) for start, stop in self.ranges]
        self._lock = threading.Lock()

    def offer(self, start: int, rows: np.ndarray) -> None:
        """Keep the sampled rows among ``rows`` (rows ``start, start + len(rows)`` of the source, in its
        dtype or widened from float16: the widening is exact, so narrowing back gives the stored bytes).
        Call it before the rows are changed in place (centred)."""
        stop = start + len(rows)
        with self._lock:
            for (first, last), kept, seen in zip(self.ranges, self.rows, self.seen, strict=True):
                low, high = max(first, start), min(last, stop)
                if low < high:
                    kept[low - first : high - first] = rows[low - start : high - start]
                    seen[low - first : high - first] = True

    def hexdigest(self, source: Source, below: int | None = None) -> str:
        """The hash of the sampled rows (a fingerprint's ``sha256_sampled``), reading from ``source``
        those not offered; with ``below``, of the sampled rows before row ``below`` only (what a
        checkpoint records of a source read that far: no reads are needed once the pass is there)."""
        with self._lock:
            clipped = [
                (index, first, last if below is None else min(last, below))
                for index, (first, last) in enumerate(self.ranges)
                if below is None or first < below
            ]
            missing = [
                (index, first, last) for index, first, last in clipped if not self.seen[index][: last - first].all()
            ]
            reads = _read_ranges(source, [(first, last) for _, first, last in missing])
            for (index, first, last), rows in zip(missing, reads, strict=True):
                self.rows[index][: last - first] = rows
                self.seen[index][: last - first] = True
            digest = hashlib.sha256()
            for index, first, last in clipped:
                digest.update(np.ascontiguousarray(self.rows[index][: last - first]).tobytes())
            return digest.hexdigest()


def _read_ranges(source: Source, ranges: list) -> list:
    """Rows of each of ``ranges``, read in parallel where the store's compressed chunks are decoded here."""
    if source.plan is None or len(ranges) < 2:
        return [source.read(start, stop) for start, stop in ranges]
    from concurrent.futures import ThreadPoolExecutor

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    with ThreadPoolExecutor(max(1, min(4, cores, len(ranges))), thread_name_prefix="streamwhiten-sample") as pool:
        return list(pool.map(lambda rows: source.read(*rows), ranges))


# ----------------------------------------------------------------------------------------------- sinks


def aligned_chunk_rows(rows: int, n_features: int, dtype) -> int:
    """``rows`` rounded down so that a chunk is a whole number of :data:`ALIGNMENT` blocks (which
    can be written directly), unless that would leave none."""
    step = ALIGNMENT // math.gcd(ALIGNMENT, n_features * np.dtype(dtype).itemsize)
    return int(rows - rows % step if rows >= step else rows)


def output_chunk_rows(n_features: int, dtype, n_rows: int) -> int:
    """Rows per output chunk: about :data:`OUTPUT_CHUNK_BYTES`, and whole :data:`ALIGNMENT` blocks
    where possible (all rows in one chunk when they fit)."""
    rows = max(1, min(n_rows, OUTPUT_CHUNK_BYTES // (n_features * np.dtype(dtype).itemsize)))
    return rows if rows == n_rows else aligned_chunk_rows(rows, n_features, dtype)


def _inode(path: str):
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


class Sink:
    """A new 2-D array being written under the temporary name ``partial``; :meth:`commit` renames it
    to ``path`` once complete.

    Every backend writes chunk data as raw bytes through a descriptor of its own (see ``direct``);
    subclasses implement :meth:`_write`, :meth:`_sync` (make every write so far durable), :meth:`_finish`
    (set the final attributes and make the whole store durable) and :meth:`_close`.
    """

    kind = "?"

    def __init__(
        self, path: str, dataset: str | None, partial: str, shape, dtype, chunk_rows: int, direct_io: bool = True
    ):
        self.path = path
        self.dataset = dataset
        self.partial = partial
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.chunk_rows = int(chunk_rows)
        #: whole chunks are written around the page cache (see ``direct``)
        self.direct_io = direct_io
        #: the partial output this sink writes: another run that replaced it must not be committed by this one
        self.partial_inode = _inode(partial)

    @property
    def label(self) -> str:  # a URL without credentials
        path = remote.redact(self.path)
        return f"{path}:/{self.dataset}" if self.dataset else path

    @property
    def progress_path(self) -> str:
        """Sidecar JSON beside the partial output: how many rows are safely written, and for which job."""
        from .spec import partial_path

        return partial_path(self.path) + ".progress.json"

    def covered(self, start: int, block: np.ndarray):
        """``(chunk index, first row of the chunk, its end, rows a..b it gets, their data)`` for each
        chunk ``block`` (written at row ``start``) touches."""
        stop, rows = start + block.shape[0], self.chunk_rows
        for index in range(start // rows, (stop - 1) // rows + 1):
            lo, hi = index * rows, min((index + 1) * rows, self.shape[0])
            a, b = max(lo, start), min(hi, stop)
            yield index, lo, hi, a, b, np.ascontiguousarray(block[a - start : b - start], dtype=self.dtype)

    def write(self, start: int, block: np.ndarray, columns=None) -> None:
        """Write ``block`` at row ``start``: every output chunk it covers whole as raw bytes (uncompressed,
        so the stored chunk is exactly the rows), directly where aligned. ``columns`` (tabular sinks
        only) are other columns of the same rows, carried from the input."""
        try:
            if columns is None:
                self._write(start, block)
            else:
                self._write(start, block, columns)
        except OSError as exc:
            stop = start + block.shape[0]
            raise StoreIOError(f"{self.label}: cannot write rows {start}..{stop - 1}: {io_error(exc)}") from exc

    def save_progress(self, record: ResumeRecord) -> None:
        """Make rows ``[0, record.rows_done)`` durable, then write ``record`` atomically (for a later resume)."""
        try:
            self._sync()
        except OSError as exc:
            raise StoreIOError(f"{self.path}: cannot make the rows written durable: {io_error(exc)}") from exc
        data = json.dumps(record.to_dict(), sort_keys=True).encode()
        if remote.is_url(self.progress_path):  # one PUT: the old record or the new one, never a part
            remote.put_bytes(self.progress_path, data)
            return
        durable.write_file_atomic(self.progress_path, lambda handle: handle.write(data), "progress record")

    def region_writer(self):
        """A picklable writer of whole-chunk row ranges, for worker processes (Zarr only)."""
        raise BadInputError(f"{self.path}: only a Zarr output can be written by several processes at once")

    def commit(self, overwrite: bool = False, attrs: dict | None = None) -> None:
        """Set ``attrs`` and ``complete = True``, make everything durable, and rename into place
        (replacing an old output only if ``overwrite`` and it is an output of ours: ``io.check_replaceable``)."""
        try:
            if _inode(self.partial) != self.partial_inode:
                raise OSError(
                    f"{self.partial} was replaced by another run writing the same output; this one is not committed"
                )
            self._finish(dict(attrs or {}, complete=True))
            final = os.path.abspath(self.path.rstrip("/"))
            if os.path.lexists(final):
                from . import check_replaceable

                check_replaceable(self.path, overwrite)  # again: it may have changed since the run began
                if os.path.isdir(final) and not os.path.islink(final):
                    # A directory cannot be replaced atomically: move the old one aside first (a later
                    # run puts it back if this one dies before the new one is in place).
                    old = durable.temp_path(final, "old")
                    os.rename(final, old)
                    try:
                        os.rename(self.partial, final)
                    except BaseException:
                        os.rename(old, final)  # the old output stays where it was
                        raise
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    os.replace(self.partial, final)
            else:
                os.rename(self.partial, final)
            durable.fsync_dir(os.path.dirname(final))
            remove(self.progress_path)
        except (OSError, RuntimeError) as exc:
            raise StoreIOError(f"{self.path}: cannot finish writing: {io_error(exc)}") from exc

    def abort(self) -> None:
        """Remove the temporary output; the target path is left as it was."""
        try:
            self._close()
        except Exception:
            pass
        remove(self.partial)
        remove(self.progress_path)

    def suspend(self) -> None:
        """Close, keeping the partial output and its progress record for a later resume."""
        self._close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            return
        if issubclass(exc_type, (KeyboardInterrupt, InterruptedRunError)):
            self.suspend()
        else:
            self.abort()

    # -- what each backend does
    def _write(self, start: int, block: np.ndarray) -> None:
        raise NotImplementedError

    def _sync(self) -> None:
        raise NotImplementedError

    def _finish(self, attrs: dict) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        pass
