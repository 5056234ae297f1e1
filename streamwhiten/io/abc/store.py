"""The interface every backend implements: a :class:`Source` of rows and a :class:`Sink` for outputs.

A source is a read-only 2-D array of rows: its shape and dtype, its natural block layout (the store's
chunk rows), rows read into a caller's buffer, what a fingerprint records of it, and its attributes. A
sink is a new 2-D array written under a hidden temporary name and renamed into place only when
complete, so an interrupted or failed write never leaves something that looks finished, and nothing
that existed is touched before that rename.

What a backend can do is said by capability attributes, which the engine and the command line ask
instead of comparing kind names: a source's :attr:`~Source.remote`, :attr:`~Source.widens_float16`,
:attr:`~Source.decoder` and :attr:`~Source.tabular`; a sink class's :attr:`~Sink.tabular`,
:attr:`~Sink.compressible`, :attr:`~Sink.parallel_writes`, :attr:`~Sink.format_versions`,
:attr:`~Sink.named` and :attr:`~Sink.in_place`. Nothing here imports a storage library.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, ClassVar

import numpy as np

from ... import _durable as durable
from ... import params
from ..._buffers import ALIGNMENT
from ..._paths import file_identity
from ...errors import BadInputError, CorruptStoreError, InterruptedRunError, StoreIOError
from ...options import ReadOptions
from ...records import ResumeRecord
from .. import remote
from .._messages import io_error
from ..codecs import DecodeError, Decoder, Fetched, decode_rows

#: Default bytes per block read when the caller gives no ``block_rows``: big enough that BLAS runs at
#: full speed, small enough that a couple of blocks in flight stay well inside memory.
DEFAULT_BLOCK_BYTES = 64 << 20
#: Target bytes of one chunk of an output array.
OUTPUT_CHUNK_BYTES = 4 << 20
#: Rows hashed at each sampled position of a fingerprint.
FINGERPRINT_ROWS = 64
#: The attribute every store output of streamwhiten carries (``Output.create`` sets it): how an existing
#: store is recognised as an output of ours, which ``--overwrite`` may replace.
OWNER_ATTR = "streamwhiten_version"


def remove(path: str) -> None:
    """Remove a file or a directory tree, if it exists."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


#: The dtypes of an output of codes (``apply --dtype int8``, ``binary``): not input, but opened for their
#: attributes.
CODE_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8))


def check_array(label: str, shape: tuple[int, ...], dtype: Any, min_rows: int, codes: bool = False) -> None:
    """Refuse anything but a 2-D float16/32/64 array with at least ``min_rows`` rows (with ``codes``,
    int8 codes and uint8 bytes of sign bits too)."""
    if len(shape) != 2:
        raise BadInputError(f"{label}: expected a 2-D array (rows x features), got {len(shape)}-D shape {tuple(shape)}")
    dtype = np.dtype(dtype)
    if dtype in CODE_DTYPES and not codes:
        raise BadInputError(
            f"{label}: expected float16, float32 or float64 values, got dtype {dtype} (codes written by "
            "apply --dtype int8 or binary: decode them with streamwhiten.serving.decode first)"
        )
    if (dtype.kind != "f" or dtype.itemsize not in (2, 4, 8)) and not (codes and dtype in CODE_DTYPES):
        raise BadInputError(f"{label}: expected float16, float32 or float64 values, got dtype {dtype}")
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


def count_blocks(start: int, stop: int, block_rows: int) -> int:
    """Ranges in ``[start, stop)`` when cut at multiples of ``block_rows`` (as :meth:`Source.blocks` does)."""
    return max(0, (stop - 1) // block_rows - start // block_rows + 1) if stop > start else 0


def identity_of(path: str, dataset: str | None = "") -> tuple[tuple[Any, ...], str]:
    """The identity of the array ``dataset`` of the file or directory at ``path`` (a source's, or one a
    model recorded), taken now: the ``(device, inode)`` of the file, so a symlink or a hard link of a file
    is that file whatever its path (a URL, or a path that no longer exists: the normalised path)."""
    if remote.is_url(path):
        return ("url", remote.normalize(path)), dataset or ""
    found = file_identity(path)
    return (("inode", *found) if found is not None else ("path", os.path.realpath(path))), dataset or ""


# --------------------------------------------------------------------------------------------- sources


def partial_path(path: str) -> str:
    """The hidden temporary name a sink is written under before it is renamed to ``path``."""
    if remote.is_url(path):
        return remote.join(remote.parent(path), f".{remote.basename(path)}.partial")
    head, tail = os.path.split(os.path.abspath(path.rstrip("/")))
    return os.path.join(head, f".{tail}.partial")


class Source(ABC):
    """A read-only 2-D array of rows in a store; iterate it with :meth:`blocks` and :meth:`read_into`.

    Backends set ``path``, ``dataset``, ``shape``, ``dtype`` (native byte order: the storage library
    converts a big-endian store as it reads) and ``chunk_rows`` (rows per store chunk, None for a
    contiguous layout) through :meth:`__init__`, and implement :meth:`_read_into`; :meth:`attrs`,
    :meth:`fetch` and :meth:`close` where they have more to say than nothing.
    """

    #: the store kind, for messages (``registry.Backend.kind``)
    kind: ClassVar[str] = "?"
    #: the store holds other columns of the same rows (a table): ``--keep-columns``, id columns
    tabular: ClassVar[bool] = False
    #: :meth:`read_into` takes a float32 ``out`` for a float16 store (widening as it reads)
    widens_float16: ClassVar[bool] = False
    #: why a source whose layout digest changed is refused, for the message
    layout_change: ClassVar[str] = "the store was rewritten"
    #: the store is read over the network (a URL): blocks are read by more threads, retried when the
    #: network fails, and never by the raw local-chunk fast path
    remote: bool = False
    #: how this source's compressed chunks are decoded here, in the caller's thread (None: its library
    #: decodes them, or they are not compressed); :meth:`fetch` reads their stored bytes ahead
    decoder: Decoder | None = None
    #: the row of the store that is this source's row 0 (a range of a store's rows, ``io.window``), for
    #: messages naming a row
    first_row: int = 0

    def __init__(
        self,
        path: str,
        dataset: str | None,
        shape: tuple[int, ...],
        dtype: Any,
        chunk_rows: int | None,
        read: ReadOptions | None = None,
    ) -> None:
        self.path = path
        self.dataset = dataset
        self.shape = tuple(int(s) for s in shape)
        self.dtype: np.dtype[Any] = np.dtype(dtype).newbyteorder("=")
        self.chunk_rows = chunk_rows
        #: how it was opened (read chunks missing from the store as the fill value, reach URLs with
        #: these storage options)
        self.read_options = read if read is not None else ReadOptions()

    @property
    def fill_missing_chunks(self) -> bool:
        """Read chunks missing from the store as the array's fill value instead of refusing them."""
        return self.read_options.fill_missing_chunks

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
    def identity(self) -> tuple[tuple[Any, ...], str]:
        """Which array this is, however it was named: see :func:`identity_of` of its :attr:`location`."""
        return identity_of(*self.location)

    @property
    def n_rows(self) -> int:
        return self.shape[0]

    @property
    def n_features(self) -> int:
        return self.shape[1]

    @property
    def read_dtype(self) -> np.dtype[Any]:
        """The dtype of the buffer a block is best read into: float32 for a float16 store whose backend
        widens as it reads (:attr:`widens_float16`), the store's own dtype otherwise."""
        dtype = np.dtype(self.dtype)
        return np.dtype(np.float32) if self.widens_float16 and dtype == np.float16 else dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a new C-contiguous array in the store's dtype."""
        return self.read_into(start, stop, np.empty((max(0, stop - start), self.n_features), dtype=self.dtype))

    def read_into(self, start: int, stop: int, out: np.ndarray, fetched: Fetched | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` into the preallocated ``out`` (C-contiguous); returns ``out[:stop - start]``.

        ``fetched`` is what :meth:`fetch` returned for the same rows, if it was called ahead. A remote
        store's read is retried on transient failures (``remote.retrying``)."""
        if self.remote:
            rows: np.ndarray = remote.retrying(
                self.path,
                f"read rows {start}..{stop - 1}",
                self._read_into,
                start,
                stop,
                out,
                fetched,
                read=self.read_options,
            )
            return rows
        return self._read_into(start, stop, out, fetched)

    @abstractmethod
    def _read_into(self, start: int, stop: int, out: np.ndarray, fetched: Fetched | None = None) -> np.ndarray:
        """:meth:`read_into`, once (the base class retries it for a remote store)."""

    def _decode_into(
        self, view: np.ndarray, start: int, stop: int, fetched: Fetched | None, fill_value: Any
    ) -> np.ndarray:
        """Rows ``[start, stop)`` decoded here (by :attr:`decoder`) into ``view``, from ``fetched`` or from
        stored bytes fetched now; a chunk that does not decode is a :class:`CorruptStoreError`."""
        assert self.decoder is not None and self.chunk_rows is not None
        chunks = fetched if fetched is not None else self.fetch(start, stop)
        assert chunks is not None
        try:
            return decode_rows(self.decoder, chunks, start, stop, view, self.chunk_rows, fill_value, self._describe)
        except DecodeError as exc:
            raise CorruptStoreError(f"{self.label}: {exc}") from None
        finally:
            chunks.release()

    def _describe(self, index: int) -> str:
        """What is wrong with chunk ``index`` that does not decode, for the message (backends with a decoder)."""
        return f"chunk {index} is damaged and cannot be decoded"

    def fetch(self, start: int, stop: int) -> Fetched | None:
        """The stored (compressed) bytes behind rows ``[start, stop)``, read ahead of :meth:`read_into`
        (in another thread, say), or None where the backend has no such split (the default)."""
        return None

    def attrs(self) -> dict[str, Any]:
        """The array's attributes (an output's record of the model that wrote it, for instance)."""
        return {}

    # -- what a fingerprint records (see ``io.fingerprint``); backends refine these
    def sample_ranges(self, n_rows: int) -> list[tuple[int, int]]:
        """Row ranges of the first ``n_rows`` whose contents a fingerprint hashes: the first and last
        :data:`FINGERPRINT_ROWS` rows and three ranges between (start, quartiles, end)."""
        width = min(FINGERPRINT_ROWS, n_rows)
        starts = sorted({0, n_rows // 4, n_rows // 2, (3 * n_rows) // 4, max(0, n_rows - width)})
        return [(start, min(n_rows, start + width)) for start in starts]

    def layout_digest(self, n_rows: int) -> str | None:
        """A digest of how the first ``n_rows`` rows are stored (a Parquet footer, Lance fragments), for
        stores whose structure says whether they changed; None where there is none (HDF5, Zarr, npy)."""
        return None

    def fingerprint_extra(self) -> dict[str, Any]:
        """More fields a fingerprint records, not compared by an update (``size``, ``etag``, ``version``)."""
        return {}

    # -- other columns of the same rows (tabular stores only)
    def column_schema(self, names: list[str]) -> Any:
        """The types of the columns ``names`` (to carry them into an output), checking they exist."""
        raise BadInputError(
            f"{self.label}: --keep-columns needs a Parquet or Lance input (a table with other "
            f"columns); this is a {self.kind} store"
        )

    def read_columns(self, start: int, stop: int, names: list[str]) -> Any:
        """Rows ``[start, stop)`` of the columns ``names``, as a table of the backend's library."""
        self.column_schema(names)
        raise NotImplementedError

    def default_block_rows(self, target_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
        """Rows per block: a whole number of store chunks, about ``target_bytes`` in all."""
        row_bytes = max(1, self.n_features * self.dtype.itemsize)
        base = self.chunk_rows or 1
        return base * max(1, target_bytes // (base * row_bytes))

    def blocks(
        self, block_rows: int | None = None, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[int, int]]:
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

    def close(self) -> None:  # noqa: B027 - closing is optional: many stores hold nothing open
        """Release what the source holds open."""

    def __enter__(self) -> Source:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# ----------------------------------------------------------------------------------------------- sinks


def aligned_chunk_rows(rows: int, n_features: int, dtype: Any) -> int:
    """``rows`` rounded down so that a chunk is a whole number of :data:`ALIGNMENT` blocks (which
    can be written directly), unless that would leave none."""
    step = ALIGNMENT // math.gcd(ALIGNMENT, n_features * np.dtype(dtype).itemsize)
    return int(rows - rows % step if rows >= step else rows)


def output_chunk_rows(n_features: int, dtype: Any, n_rows: int) -> int:
    """Rows per output chunk: about :data:`OUTPUT_CHUNK_BYTES`, and whole :data:`ALIGNMENT` blocks
    where possible (all rows in one chunk when they fit)."""
    rows = max(1, min(n_rows, OUTPUT_CHUNK_BYTES // (n_features * np.dtype(dtype).itemsize)))
    return rows if rows == n_rows else aligned_chunk_rows(rows, n_features, dtype)


def _inode(path: str) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


class Sink(ABC):
    """A new 2-D array being written under the temporary name ``partial``; :meth:`commit` renames it
    to ``path`` once complete.

    Sinks are made by ``io.open_output`` (:meth:`create` for a new output, :meth:`resume` for an
    interrupted run's). Backends implement those two, :meth:`_write`, :meth:`_sync` (make every write so
    far durable), :meth:`_finish` (set the final attributes and make the whole store durable) and
    :meth:`_close`; the class attributes say what the backend can do.
    """

    #: the store kind, for messages (``registry.Backend.kind``)
    kind: ClassVar[str] = "?"
    #: carries other columns of the same rows beside the vectors (``--keep-columns``); its blocks are
    #: written as row groups or fragments of any size
    tabular: ClassVar[bool] = False
    #: compresses its chunks (``--compressor``)
    compressible: ClassVar[bool] = False
    #: whole-chunk row ranges may be written by several processes at once (:meth:`region_writer`)
    parallel_writes: ClassVar[bool] = False
    #: the format versions a caller may choose among (``zarr_format``); empty where there is no choice
    format_versions: ClassVar[tuple[int, ...]] = ()
    #: its array always lives under a name inside the store (an HDF5 dataset): specs of it name one
    named: ClassVar[bool] = False
    #: written where it stays (object storage cannot rename a prefix): it says ``complete = false`` until
    #: committed, and is taken for absent until then (:meth:`incomplete`)
    in_place: ClassVar[bool] = False

    def __init__(
        self,
        path: str,
        dataset: str | None,
        partial: str,
        shape: tuple[int, ...],
        dtype: Any,
        chunk_rows: int,
        direct_io: bool = True,
    ) -> None:
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
        #: how the URLs of this output are reached (set by ``io.open_output``)
        self.read_options = ReadOptions()
        #: refuses to replace what is at :attr:`path` unless ``overwrite`` and it is an output of ours of this
        #: kind (set by ``io.open_output``: the rule is ``io.check_replaceable``)
        self.replace_check: Callable[[bool], None] | None = None

    # -- how a sink is made (by ``io.open_output``)
    @classmethod
    @abstractmethod
    def create(
        cls,
        path: str,
        dataset: str | None,
        partial: str,
        shape: tuple[int, ...],
        dtype: Any,
        chunk_rows: int,
        attrs: Mapping[str, Any],
        **options: Any,
    ) -> Sink:
        """A new output of ``shape`` and ``dtype`` under the temporary name ``partial``, its attributes
        ``attrs`` set from the start. ``options``: ``direct_io``, ``zarr_format``, ``compressor``,
        ``columns`` (those that apply to the backend), ``read`` (how its URLs are reached)."""

    @classmethod
    @abstractmethod
    def resume(
        cls, path: str, dataset: str | None, partial: str, direct_io: bool = True, rows_done: int = 0, **options: Any
    ) -> Sink:
        """The partial output of an interrupted run, of which ``rows_done`` rows are durable."""

    @classmethod
    def incomplete(cls, path: str, read: ReadOptions) -> bool:
        """Whether an output written in place (:attr:`in_place`) at ``path`` is one of ours not yet complete."""
        return False

    @property
    def remote(self) -> bool:
        """Whether it is written to object storage (or another URL)."""
        return remote.is_url(self.partial)

    @property
    def label(self) -> str:  # a URL without credentials
        path = remote.redact(self.path)
        return f"{path}:/{self.dataset}" if self.dataset else path

    @property
    def progress_path(self) -> str:
        """Sidecar JSON beside the partial output: how many rows are safely written, and for which job."""
        return partial_path(self.path) + ".progress.json"

    def covered(self, start: int, block: np.ndarray) -> Iterator[tuple[int, int, int, int, int, np.ndarray]]:
        """``(chunk index, first row of the chunk, its end, rows a..b it gets, their data)`` for each
        chunk ``block`` (written at row ``start``) touches."""
        stop, rows = start + block.shape[0], self.chunk_rows
        for index in range(start // rows, (stop - 1) // rows + 1):
            lo, hi = index * rows, min((index + 1) * rows, self.shape[0])
            a, b = max(lo, start), min(hi, stop)
            yield index, lo, hi, a, b, np.ascontiguousarray(block[a - start : b - start], dtype=self.dtype)

    def write(self, start: int, block: np.ndarray, columns: Any = None) -> None:
        """Write ``block`` at row ``start``: every output chunk it covers whole as raw bytes (uncompressed,
        so the stored chunk is exactly the rows), directly where aligned. ``columns`` (tabular sinks
        only) are other columns of the same rows, carried from the input."""
        try:
            if columns is None:
                self._write(start, block)
            else:
                self._write(start, block, columns)
        except StoreIOError:  # ours already (a remote write that gave up): it names the store and rows
            raise
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
            remote.put_bytes(self.progress_path, data, read=self.read_options)
            return
        durable.write_file_atomic(self.progress_path, lambda handle: handle.write(data), "progress record")

    def region_writer(self) -> Callable[[int, np.ndarray], None]:
        """A picklable writer of whole-chunk row ranges, for worker processes (:attr:`parallel_writes`)."""
        raise BadInputError(f"{self.path}: only a Zarr output can be written by several processes at once")

    def _check_replaceable(self, overwrite: bool) -> None:
        """Refuse to replace what is at :attr:`path` now (see :attr:`replace_check`)."""
        if self.replace_check is None:
            raise RuntimeError(f"{self.label}: a sink is opened by io.open_output, which knows what it may replace")
        self.replace_check(overwrite)

    def commit(self, overwrite: bool = False, attrs: Mapping[str, Any] | None = None) -> None:
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
                self._check_replaceable(overwrite)  # again: it may have changed since the run began
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

    def __enter__(self) -> Sink:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            return
        if issubclass(exc_type, (KeyboardInterrupt, InterruptedRunError)):
            self.suspend()
        else:
            self.abort()

    # -- what each backend does
    @abstractmethod
    def _write(self, start: int, block: np.ndarray, columns: Any = None) -> None:
        """Write ``block`` (and, for a tabular sink, ``columns``) at row ``start``."""

    @abstractmethod
    def _sync(self) -> None:
        """Make every write so far durable."""

    @abstractmethod
    def _finish(self, attrs: dict[str, Any]) -> None:
        """Set the final attributes and make the whole store durable (before :meth:`commit` renames it)."""

    def _close(self) -> None:  # noqa: B027 - closing is optional: some sinks hold nothing open
        """Release what the sink holds open, keeping what it wrote."""
