"""What the backends share beneath the storage interface (``io.abc``): `StoreSource` and `StoreSink`
(remote retries, decoding in the caller's thread, durable progress and commit), and the helpers around
stores (array checks, removal, chunk sizing, identities, temporary names).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from abc import abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .. import _durable as durable
from .._buffers import ALIGNMENT
from .._paths import file_identity
from ..errors import BadInputError, CorruptStoreError, StoreIOError
from ..output_plan import COMPLETE_ATTR
from ..output_plan import OWNER_ATTR as OWNER_ATTR  # the mark of an output of ours, for the backends
from ..records import ResumeRecord
from . import remote
from ._messages import io_error
from .abc.store import Sink, SinkPlace, Source
from .codecs import DecodeError, Fetched, decode_rows

#: Default bytes per block read when the caller gives no ``block_rows``: big enough that BLAS runs at
#: full speed, small enough that a couple of blocks in flight stay well inside memory.
DEFAULT_BLOCK_BYTES = 64 << 20
#: Target bytes of one chunk of an output array.
OUTPUT_CHUNK_BYTES = 4 << 20
#: Rows hashed at each sampled position of a fingerprint.
FINGERPRINT_ROWS = 64


def remove(path: str) -> None:
    """Remove a file or a directory tree, if it exists."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


#: The dtypes of an output of codes (``apply --dtype int8``, ``binary``): opened for their attributes only.
CODE_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8))


def check_array(label: str, shape: tuple[int, ...], dtype: Any, min_rows: int, codes: bool = False) -> None:
    """Refuse anything but a 2-D float16/32/64 array with at least ``min_rows`` rows (with ``codes``,
    int8 codes and uint8 bytes of sign bits too)."""
    if len(shape) != 2:
        raise BadInputError(f"{label}: expected a 2-D array (rows x features), got {len(shape)}-D shape {tuple(shape)}")
    dtype = np.dtype(dtype)
    if dtype in CODE_DTYPES and not codes:
        raise BadInputError(
            f"{label}: expected float16, float32 or float64 values, got dtype {dtype} (int8 codes, sign bits "
            "or a vector code written by apply: decode them with streamwhiten.serving.decode first)"
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
    """Ranges in ``[start, stop)`` when cut at multiples of ``block_rows`` (as `Source.blocks` does)."""
    return max(0, (stop - 1) // block_rows - start // block_rows + 1) if stop > start else 0


def identity_of(path: str, dataset: str | None = "") -> tuple[tuple[Any, ...], str]:
    """The identity of the array ``dataset`` at ``path``, taken now: its file's ``(device, inode)``, so a link
    of a file is that file (a URL, or a path that no longer exists: the normalised path)."""
    if remote.is_url(path):
        return ("url", remote.normalize(path)), dataset or ""
    found = file_identity(path)
    return (("inode", *found) if found is not None else ("path", os.path.realpath(path))), dataset or ""


def partial_path(path: str) -> str:
    """The hidden temporary name a sink is written under before it is renamed to ``path``."""
    if remote.is_url(path):
        return remote.join(remote.parent(path), f".{remote.basename(path)}.partial")
    head, tail = os.path.split(os.path.abspath(path.rstrip("/")))
    return os.path.join(head, f".{tail}.partial")


def aligned_chunk_rows(rows: int, n_features: int, dtype: Any) -> int:
    """``rows`` rounded down so that a chunk is a whole number of `ALIGNMENT` blocks (which
    can be written directly), unless that would leave none."""
    step = ALIGNMENT // math.gcd(ALIGNMENT, n_features * np.dtype(dtype).itemsize)
    return int(rows - rows % step if rows >= step else rows)


def output_chunk_rows(n_features: int, dtype: Any, n_rows: int) -> int:
    """Rows per output chunk: about `OUTPUT_CHUNK_BYTES`, and whole `ALIGNMENT` blocks
    where possible (all rows in one chunk when they fit)."""
    rows = max(1, min(n_rows, OUTPUT_CHUNK_BYTES // (n_features * np.dtype(dtype).itemsize)))
    return rows if rows == n_rows else aligned_chunk_rows(rows, n_features, dtype)


def _label(path: str, dataset: str | None) -> str:
    """A store and its array, for messages (a URL without credentials)."""
    path = remote.redact(path)
    return f"{path}:/{dataset}" if dataset else path


class StoreSource(Source):
    """What every backend's `Source` does alike (label, identity, remote retries, decoding here, block size,
    fingerprint sample); backends implement `_read_into` (and `fetch`, `attrs`, `close` where needed)."""

    @property
    def label(self) -> str:
        return _label(self.path, self.dataset)

    @property
    def location(self) -> tuple[str, str]:
        path = remote.normalize(self.path) if remote.is_url(self.path) else os.path.realpath(self.path)
        return path, self.dataset or ""

    @property
    def identity(self) -> tuple[tuple[Any, ...], str]:
        """Which array this is, however it was named: see `identity_of` of its `location`."""
        return identity_of(*self.location)

    def read_into(self, start: int, stop: int, out: np.ndarray, fetched: Fetched | None = None) -> np.ndarray:
        """`Source.read_into`, retried on transient failures for a remote store (``remote.retrying``)."""
        if not self.remote:
            return self._read_into(start, stop, out, fetched)
        what = f"read rows {start}..{stop - 1}"
        rows: np.ndarray = remote.retrying(
            self.path, what, self._read_into, start, stop, out, fetched, read=self.read_options
        )
        return rows

    @abstractmethod
    def _read_into(self, start: int, stop: int, out: np.ndarray, fetched: Fetched | None = None) -> np.ndarray:
        """`read_into`, once (the base class retries it for a remote store)."""

    def _decode_into(
        self, view: np.ndarray, start: int, stop: int, fetched: Fetched | None, fill_value: Any
    ) -> np.ndarray:
        """Rows ``[start, stop)`` decoded here (by `decoder`) into ``view``, from ``fetched`` or from
        stored bytes fetched now; a chunk that does not decode is a `CorruptStoreError`."""
        assert self.decoder is not None and self.chunk_rows is not None
        chunks = fetched if fetched is not None else self.fetch(start, stop)
        assert chunks is not None
        try:
            return decode_rows(self.decoder, chunks, start, stop, view, self.chunk_rows, fill_value, self._describe)
        except DecodeError as exc:
            raise CorruptStoreError(f"{self.label}: {exc}") from None
        finally:
            chunks.release()

    def _chunk_span(self, index: int) -> tuple[int, int]:
        """The rows ``[lo, hi)`` of (row) chunk ``index``, for messages."""
        assert self.chunk_rows is not None
        return index * self.chunk_rows, min(self.n_rows, (index + 1) * self.chunk_rows)

    def _describe(self, index: int) -> str:
        """What is wrong with chunk ``index`` that does not decode, for the message (backends with a decoder)."""
        return f"chunk {index} is damaged and cannot be decoded"

    def sample_ranges(self, n_rows: int) -> list[tuple[int, int]]:
        """Row ranges of the first ``n_rows`` whose contents a fingerprint hashes: the first and last
        `FINGERPRINT_ROWS` rows and three ranges between (start, quartiles, end)."""
        width = min(FINGERPRINT_ROWS, n_rows)
        starts = sorted({0, n_rows // 4, n_rows // 2, (3 * n_rows) // 4, max(0, n_rows - width)})
        return [(start, min(n_rows, start + width)) for start in starts]

    def default_block_rows(self, target_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
        """Rows per block: a whole number of store chunks, about ``target_bytes`` in all."""
        row_bytes = max(1, self.n_features * self.dtype.itemsize)
        base = self.chunk_rows or 1
        return base * max(1, target_bytes // (base * row_bytes))


class StoreSink(Sink):
    """What every backend's `Sink` does alike (write under the temporary name, durable progress, commit by
    rename, abort, suspend); backends implement `create`, `resume`, `_write`, `_sync`, `_finish`, `_close`."""

    def __init__(
        self, place: SinkPlace, shape: tuple[int, ...], dtype: Any, chunk_rows: int, direct_io: bool = True
    ) -> None:
        self.path, self.dataset, self.partial = place.path, place.dataset, place.partial
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.chunk_rows = int(chunk_rows)
        self.direct_io = direct_io
        #: the partial output this sink writes: another run that replaced it must not be committed by this one
        self.partial_inode = file_identity(self.partial)
        self.read_options = place.read
        self.replace_check = None

    @property
    def remote(self) -> bool:
        return remote.is_url(self.partial)

    @property
    def label(self) -> str:
        return _label(self.path, self.dataset)

    @property
    def progress_path(self) -> str:
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
        """`Sink.write`: `_write`, its OS errors as a `StoreIOError` naming the rows."""
        try:
            self._write(start, block, columns)
        except StoreIOError:  # ours already (a remote write that gave up): it names the store and rows
            raise
        except OSError as exc:
            stop = start + block.shape[0]
            raise StoreIOError(f"{self.label}: cannot write rows {start}..{stop - 1}: {io_error(exc)}") from exc

    def save_progress(self, record: ResumeRecord) -> None:
        try:
            self._sync()
        except OSError as exc:
            raise StoreIOError(f"{self.path}: cannot make the rows written durable: {io_error(exc)}") from exc
        data = json.dumps(record.to_dict(), sort_keys=True).encode()
        if remote.is_url(self.progress_path):  # one PUT: the old record or the new one, never a part
            remote.put_bytes(self.progress_path, data, read=self.read_options)
            return
        durable.write_file_atomic(self.progress_path, lambda handle: handle.write(data), "progress record")

    def _check_replaceable(self, overwrite: bool) -> None:
        """Refuse to replace what is at `path` now (see `replace_check`)."""
        if self.replace_check is None:
            raise RuntimeError(f"{self.label}: a sink is opened by io.open_output, which knows what it may replace")
        self.replace_check(overwrite)

    def commit(self, overwrite: bool = False, attrs: Mapping[str, Any] | None = None) -> None:
        try:
            if file_identity(self.partial) != self.partial_inode:
                raise OSError(
                    f"{self.partial} was replaced by another run writing the same output; this one is not committed"
                )
            self._finish({**(attrs or {}), COMPLETE_ATTR: True})
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
        with contextlib.suppress(Exception):
            self._close()
        remove(self.partial)
        remove(self.progress_path)

    def suspend(self) -> None:
        self._close()

    @abstractmethod
    def _write(self, start: int, block: np.ndarray, columns: Any = None) -> None:
        """Write ``block`` (and, for a tabular sink, ``columns``) at row ``start``."""

    @abstractmethod
    def _sync(self) -> None:
        """Make every write so far durable."""

    @abstractmethod
    def _finish(self, attrs: dict[str, Any]) -> None:
        """Set the final attributes and make the whole store durable (before `commit` renames it)."""

    def _close(self) -> None:  # noqa: B027 - closing is optional: some sinks hold nothing open
        """Release what the sink holds open, keeping what it wrote."""
