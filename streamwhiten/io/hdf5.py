"""HDF5 through h5py: a source of rows, 1-D arrays (gold scores) and a sink. The only module that
imports h5py (besides ``spec.input_kind``'s signature check).

Chunks filtered as ``codecs`` knows are read through our own descriptor and decoded here, outside h5py's
global lock. A sink's rows are written in place, through our own descriptor, into chunks allocated up front,
so a failed write never leaves HDF5 holding a half-flushed file. A URL is read (never written) via fsspec.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import struct
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import replace
from typing import Any, BinaryIO, NoReturn, TypeVar

import h5py
import numpy as np

from .._buffers import ALIGNMENT
from ..errors import BadInputError, CorruptStoreError, MissingChunkError, StoreIOError
from ..options import ReadOptions
from ..output_plan import COMPRESSOR_ATTR, OutputPlan
from . import remote
from ._messages import FILL_HINT, first_line, io_error, name_not_found
from ._store import OWNER_ATTR, StoreSink, StoreSource
from .abc.store import SinkPlace
from .codecs import (
    H5Z_BLOSC,
    H5Z_ZSTD,
    Fetched,
    check_compressor,
    chunk_encoder,
    fetch_buffer,
    fletcher32_of,
    hdf5_decoder,
    widen_in_place,
)
from .direct import ChunkFile


def _unallocated(node: Any) -> bool:
    """Whether some of a dataset's data was never written (chunks or storage not allocated)."""
    if node.size == 0:
        return False
    if node.chunks is None:
        return node.id.get_storage_size() == 0 and node.id.get_offset() is None
    expected = math.prod(-(-n // c) for n, c in zip(node.shape, node.chunks, strict=True))
    return bool(node.id.get_num_chunks() < expected)


def _datasets(group: Any, ndim: int | None = None) -> list[str]:
    """Paths (``/a/b``) of the (``ndim``-D) datasets in ``group``, in the file's order."""
    found: list[str] = []
    prefix = group.name.rstrip("/")
    group.visititems(
        lambda name, obj: (
            found.append(f"{prefix}/{name}") if isinstance(obj, h5py.Dataset) and ndim in (None, obj.ndim) else None
        )
    )
    return found


def _find_dataset(handle: Any, label: str, inner: str | None, ndim: int, option: bool = True) -> str:
    """The dataset ``inner`` of the open file, or its only ``ndim``-D dataset when none is named."""
    what = f"{ndim}-D dataset"
    if inner is None:
        found = _datasets(handle, ndim)
        if len(found) == 1:
            return found[0].lstrip("/")
        raise name_not_found(label, None, what, found, option=option)
    node = handle.get(inner)
    if isinstance(node, h5py.Dataset):
        return inner
    group = isinstance(node, h5py.Group)  # the datasets inside it, if any, else the file's
    found = (_datasets(node, ndim) if group else []) or _datasets(handle, ndim)
    problem = f"/{inner} is a group, not a dataset" if group else None
    raise name_not_found(label, f"/{inner}", what, found, option=option, problem=problem)


#: Bytes per range request of a remote HDF5 file (read ahead: chunks are mostly read in order).
REMOTE_READ_BYTES = 4 << 20


def _errno(exc: BaseException) -> int:
    """The errno of a failed system call HDF5 reports inside ``exc``'s message (0: none)."""
    failed = re.search(r"errno = (\d+)", str(exc))
    return int(failed.group(1)) if failed else 0


def _open_file(path: str, read: ReadOptions) -> Any:
    """The file at ``path`` (local, or a URL through fsspec) open to read: an I/O error where the system
    refused (permissions, a failing disk), else a file HDF5 cannot open is not an HDF5 file (bad input)."""
    try:
        if not remote.is_url(path):
            return h5py.File(path, "r")
        fs, key = remote.filesystem(path, read)
        ahead = {"block_size": REMOTE_READ_BYTES, "cache_type": "readahead"}
        return h5py.File(remote.retrying(path, "open", fs.open, key, "rb", **ahead, read=read), "r")
    except StoreIOError:  # the network gave up (an OSError too): exit 74, not a file that is no HDF5
        raise
    except OSError as exc:
        if getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM, errno.EIO):
            raise StoreIOError(f"{remote.redact(path)}: cannot read: {io_error(exc)}") from exc
        raise BadInputError(f"{remote.redact(path)}: cannot open as HDF5 ({remote.scrub(first_line(exc))})") from exc


@contextmanager
def _walking(path: str) -> Iterator[None]:
    """HDF5's errors walking a file's metadata as ours: an I/O error where a system call failed (EMFILE,
    EIO...), else damaged metadata (``RuntimeError: Object visitation failed``...)."""
    try:
        yield
    except (BadInputError, StoreIOError):
        raise
    except (RuntimeError, KeyError, ValueError, OSError, TypeError) as exc:
        if _errno(exc) or getattr(exc, "errno", None):
            raise StoreIOError(f"{remote.redact(path)}: cannot read: {io_error(exc)}") from exc
        raise CorruptStoreError(
            f"{remote.redact(path)}: the HDF5 file's metadata is damaged ({remote.scrub(first_line(exc))})"
        ) from exc


class HDF5Source(StoreSource):
    """A 2-D dataset of an HDF5 file (local, or read through an fsspec file object)."""

    kind = "hdf5"
    #: a float16 store can be read into a float32 buffer, widened as it is decoded
    widens_float16 = True

    def __init__(self, path: str, dataset: str | None, read: ReadOptions | None = None) -> None:
        read = read if read is not None else ReadOptions()
        self.remote = remote.is_url(path)
        self._file = _open_file(path, read)
        try:
            with _walking(path):
                dataset = _find_dataset(self._file, remote.redact(path), dataset, 2)
                node = self._node = self._file[dataset]
                super().__init__(path, dataset, node.shape, node.dtype, node.chunks[0] if node.chunks else None, read)
                self._sparse = _unallocated(node)
                # compressed chunks are decoded here (a remote file's are read through its fsspec file object)
                self.decoder = None if self.remote else hdf5_decoder(node)
                #: our own descriptor for reading stored chunks (``get_chunk_info`` gives absolute offsets)
                self._fd = os.open(path, os.O_RDONLY) if self.decoder is not None else None
        except BaseException:
            self._file.close()
            raise

    def fingerprint_extra(self) -> dict[str, Any]:
        return remote.version(self.path, read=self.read_options) if self.remote else {}

    def fetch(self, start: int, stop: int) -> Fetched | None:
        """The stored bytes of the chunks rows ``[start, stop)`` touch, for `read_into` to decode (None where
        chunks are not decoded here): the I/O half of a read, which a caller may run ahead in another thread."""
        if self.decoder is None or stop <= start:
            return None
        if not 0 <= start <= stop <= self.n_rows:
            raise StoreIOError(f"{self.label}: rows {start}..{stop - 1} are outside its {self.n_rows} rows")
        if self._sparse and not self.fill_missing_chunks:
            self._refuse_unwritten(start, stop)
        rows = self.chunk_rows
        assert rows is not None
        assert self._fd is not None  # opened wherever there is a decoder
        found: list[tuple[int, Any]] = []
        for index in range(start // rows, (stop - 1) // rows + 1):
            try:
                info = self._node.id.get_chunk_info_by_coord((index * rows, 0))
            except (OSError, ValueError, RuntimeError) as exc:
                self._raise_read_error(exc, *self._chunk_span(index))
            found.append((index, None if info is None or info.byte_offset is None else info))
        buffer = fetch_buffer(
            sum(info.size for _, info in found if info is not None),
            (stop - start) * self.n_features * self.dtype.itemsize,
        )
        chunks: list[tuple[int, Any, int]] = []
        offset = 0
        for index, info in found:
            if info is None:  # unwritten, and filled (refused above otherwise)
                chunks.append((index, None, 0))
                continue
            view, (lo, hi) = buffer[offset : offset + info.size], self._chunk_span(index)
            try:  # through a descriptor of our own: h5py would hold the GIL for the whole copy
                done = 0
                while done < info.size:
                    # numpy's stubs give ndarray __buffer__ on Python 3.12+ only
                    count = os.preadv(self._fd, [view[done:]], info.byte_offset + done)  # type: ignore[list-item]
                    if count == 0:
                        raise CorruptStoreError(
                            f"{self.label}: rows {lo}..{hi - 1} cannot be read, the file is truncated (it ends inside "
                            "their chunk)"
                        )
                    done += count
            except OSError as exc:
                raise StoreIOError(f"{self.label}: cannot read rows {lo}..{hi - 1}: {io_error(exc)}") from exc
            chunks.append((index, view, info.filter_mask))
            offset += info.size
        return Fetched(chunks, buffer)

    def _read_into(self, start: int, stop: int, out: np.ndarray, fetched: Fetched | None = None) -> np.ndarray:
        view = out[: stop - start]
        if stop <= start:
            return view
        if self.decoder is not None:
            return self._decode_into(view, start, stop, fetched, self._node.fillvalue)
        if view.dtype != self.dtype:  # float16 rows into a float32 buffer: widened here
            region = view.reshape(-1).view(np.uint8)
            self.read_into(start, stop, region[region.size // 2 :].view(self.dtype).reshape(view.shape))
            widen_in_place(region, view.size)
            return view
        if self._sparse and not self.fill_missing_chunks:
            self._refuse_unwritten(start, stop)
        try:
            self._node.read_direct(out, np.s_[start:stop], np.s_[0 : stop - start])
        except (OSError, ValueError, RuntimeError) as exc:
            self._raise_read_error(exc, start, stop)
        return view

    def _raise_read_error(self, exc: BaseException, start: int, stop: int) -> NoReturn:
        # anything but a failed system call (a checksum or filter failure, an address past the end) is damage
        if _errno(exc):
            raise StoreIOError(f"{self.label}: cannot read rows {start}..{stop - 1}: {io_error(exc)}") from exc
        raise CorruptStoreError(
            f"{self.label}: rows {start}..{stop - 1} cannot be read, the file is damaged or "
            f"truncated ({first_line(exc)})"
        ) from exc

    def _describe(self, index: int) -> str:
        lo, hi = self._chunk_span(index)
        return f"the chunk of rows {lo}..{hi - 1} is damaged and cannot be decoded"

    def _refuse_unwritten(self, start: int, stop: int) -> None:
        """Refuse rows whose chunk was never written (HDF5 would read it as the fill value)."""
        node = self._node
        if node.chunks is None:
            raise MissingChunkError(
                f"{self.label}: its data was never written (no storage is allocated){FILL_HINT}",
                param="fill_missing_chunks",
            )
        rows, columns = node.chunks
        for index in range(start // rows, (stop - 1) // rows + 1):
            for column in range(0, self.n_features, columns):
                info = node.id.get_chunk_info_by_coord((index * rows, column))
                if info is None or info.byte_offset is None:
                    lo, hi = index * rows, min((index + 1) * rows, self.n_rows)
                    raise MissingChunkError(
                        f"{self.label}: rows {lo}..{hi - 1} were never written (their chunk is not in the file): the "
                        f"dataset is incomplete{FILL_HINT}",
                        rows=(lo, hi),
                        param="fill_missing_chunks",
                    )

    def attrs(self) -> dict[str, Any]:
        with _walking(self.path):
            return dict(self._node.attrs)

    def close(self) -> None:
        fd = getattr(self, "_fd", None)  # None too where __init__ failed before opening it
        if fd is not None:
            os.close(fd)
            self._fd = None
        if self._file.id.valid:
            self._file.close()


def read_vector(path: str, inner: str | None, read: ReadOptions) -> tuple[np.ndarray, str]:
    """The 1-D dataset ``inner`` (or the file's only one), whole, and its label."""
    with _open_file(path, read) as handle, _walking(path):
        inner = _find_dataset(handle, remote.redact(path), inner, 1, option=False)
        return handle[inner][()], f"{remote.redact(path)}:/{inner}"


def foreign_output(path: str, read: ReadOptions) -> str | None:
    """None when the HDF5 file ``path`` is an output of ours (every dataset carries `OWNER_ATTR`), else what it is."""
    if not h5py.is_hdf5(path):
        return "not an HDF5 file"
    try:
        with h5py.File(path, "r") as handle:
            datasets = _datasets(handle)
            theirs = [name for name in datasets if OWNER_ATTR not in handle[name].attrs]
    except (OSError, RuntimeError, KeyError) as exc:
        return f"an HDF5 file that cannot be read: {first_line(exc)}"
    if theirs:
        return f"an HDF5 file holding a dataset streamwhiten did not write: {theirs[0]}"
    return None if datasets else "an HDF5 file holding no dataset"


def _attr(value: Any) -> Any:
    """An attribute's value as the file holds it: None as "none", lists and mappings as JSON."""
    return "none" if value is None else json.dumps(value) if isinstance(value, (list, tuple, dict)) else value


def _set_attrs(array: Any, attrs: Mapping[str, Any]) -> None:
    """Set the final attributes in place, leaving one that holds its value already alone, so finishing an
    output again (killed between finishing and renaming it, resumed) writes the same bytes as once."""
    for key, value in attrs.items():
        value = _attr(value)
        if key in array.attrs:
            old = array.attrs[key]
            if np.asarray(old).dtype.kind == np.asarray(value).dtype.kind and np.array_equal(old, value):
                continue
        array.attrs.modify(key, value)


def _close_quietly(handle: Any) -> None:
    with suppress(Exception):
        if handle is not None and handle.id.valid:
            handle.close()


def _chunk_offsets(array: Any, chunk_rows: int) -> list[int]:
    """Byte offset in the file of each (row) chunk of a dataset whose chunks are all allocated."""
    offsets: list[Any] = [None] * -(-array.shape[0] // chunk_rows)
    for i in range(array.id.get_num_chunks()):
        info = array.id.get_chunk_info(i)
        if info.filter_mask == 0 and info.chunk_offset[0] % chunk_rows == 0:
            offsets[info.chunk_offset[0] // chunk_rows] = info.byte_offset
    if any(offset is None for offset in offsets):
        raise OSError(f"{offsets.count(None)} of its {len(offsets)} chunks are not allocated")
    return offsets


def _lay_out(place: SinkPlace, plan: OutputPlan, aligned: bool, **options: Any) -> SinkPlace:
    """Create the file ``place.partial`` holding the plan's dataset and attributes; returns the place, dataset named."""
    dataset, shape, chunk_rows = place.dataset or _HDF5File.default_dataset, plan.shape, int(plan.chunk_rows or 0)
    alignment = {"alignment_threshold": ALIGNMENT, "alignment_interval": ALIGNMENT} if aligned else {}
    handle = None
    try:
        handle = h5py.File(place.partial, "w", rdcc_nbytes=0, **alignment)
        array = handle.create_dataset(
            dataset,
            shape=shape,
            dtype=np.dtype(plan.dtype),
            chunks=(chunk_rows, shape[1]),
            fletcher32=bool(plan.checksums),
            **options,
        )
        # every attribute from the start (commit only changes values): a resumed output's metadata is laid out
        # as an uninterrupted run's, so the two files are the same bytes
        array.attrs.update({key: _attr(value) for key, value in plan.to_attrs().items()})
        handle.close()
    except (OSError, RuntimeError, ValueError) as exc:
        _close_quietly(handle)
        number = _errno(exc)  # h5py raises a ValueError when the disk fills as a dataset is created
        if isinstance(exc, OSError) or not number:
            raise
        raise OSError(number, os.strerror(number)) from exc
    return replace(place, dataset=dataset)


_Sink = TypeVar("_Sink", bound="_HDF5File")


class _HDF5File(StoreSink):
    """What both HDF5 outputs share: the kind, the layout read back from the file, finishing it in place."""

    kind = "hdf5"
    compressible = True
    named = True
    default_dataset = "embeddings"

    def __init__(
        self, place: SinkPlace, array: Any, direct_io: bool, rows_done: int = 0, compressor: str | None = None
    ) -> None:
        """The sink of the open dataset ``array``, ``rows_done`` rows durable (``compressor``: None, as recorded)."""
        super().__init__(place, array.shape, array.dtype, int(array.chunks[0]), direct_io)
        #: whether each chunk's stored bytes are followed by their fletcher32 checksum (after any compression)
        self.checksums = bool(array.fletcher32)

    @classmethod
    def _open(
        cls: type[_Sink], place: SinkPlace, direct_io: bool, rows_done: int, compressor: str | None = None
    ) -> _Sink:
        """The sink of the partial output at ``place`` (opened read-only, to find its layout)."""
        place = replace(place, dataset=place.dataset or cls.default_dataset)
        with h5py.File(place.partial, "r", rdcc_nbytes=0) as handle:
            return cls(place, handle[place.dataset], direct_io, rows_done, compressor)

    @classmethod
    def resume(cls, place: SinkPlace, plan: OutputPlan, rows_done: int) -> StoreSink:
        """Reopen the partial output of an interrupted run (compressed where its spool is there)."""
        spooled = os.path.exists(HDF5CompressedSink.spool_path(place.partial))
        return (HDF5CompressedSink if spooled else HDF5Sink)._open(place, plan.direct_io, rows_done)

    def _finish(self, attrs: dict[str, Any]) -> None:
        """Close what the sink writes through, reopen the file to `_fill` its dataset and set ``attrs``, durably."""
        self._sync()
        self._close()
        handle = h5py.File(self.partial, "r+", rdcc_nbytes=0)
        try:
            array = handle[self.dataset]
            self._fill(array)
            _set_attrs(array, attrs)
            handle.flush()
        except BaseException:
            _close_quietly(handle)
            raise
        handle.close()
        with open(self.partial, "rb+") as file:
            os.fsync(file.fileno())

    def _fill(self, array: Any) -> None:  # noqa: B027 - only a compressed output has chunks left to write
        """Write what the dataset still lacks, before its final attributes."""


class HDF5Sink(_HDF5File):
    """An HDF5 output: chunk data written in place through `chunk_file` at `offsets`."""

    def __init__(
        self, place: SinkPlace, array: Any, direct_io: bool, rows_done: int = 0, compressor: str | None = None
    ) -> None:
        if array.compression is not None or array.id.get_create_plist().get_nfilters() > int(bool(array.fletcher32)):
            # a compressed output whose spool was already copied in and removed (killed between its
            # finish and its rename): its chunks cannot be written in place; it is written again
            raise OSError(f"{place.partial}: a finished compressed output; not resumed")
        super().__init__(place, array, direct_io)
        #: byte offset of each chunk in the file
        self.offsets = _chunk_offsets(array, self.chunk_rows)
        #: our own descriptor for writing chunk data in place
        self.chunk_file: ChunkFile | None = ChunkFile(place.partial, direct=direct_io)

    @classmethod
    def create(cls, place: SinkPlace, plan: OutputPlan) -> StoreSink:
        """Lay out a new file at ``partial``, its chunks allocated (an `HDF5CompressedSink` with a ``compressor``)."""
        if check_compressor(plan.compressor) != "none":
            return HDF5CompressedSink.create(place, plan)
        layout = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        layout.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        return cls._open(_lay_out(place, plan, True, dcpl=layout, fill_time="never"), plan.direct_io, 0)

    def _write(self, start: int, block: np.ndarray, columns: Any = None) -> None:
        assert self.chunk_file is not None
        row_bytes = self.shape[1] * self.dtype.itemsize
        for index, lo, hi, a, b, data in self.covered(start, block):
            if self.checksums and (a, b) != (lo, hi):
                raise OSError(f"rows {a}..{b - 1} do not make up chunk {index} (a checksummed chunk is written whole)")
            if b == self.shape[0] and hi - lo < self.chunk_rows:  # the edge chunk is stored at full size
                padded = np.zeros((self.chunk_rows - (a - lo), self.shape[1]), self.dtype)
                padded[: b - a] = data
                data = padded
            offset = self.offsets[index] + (a - lo) * row_bytes
            self.chunk_file.write_at(offset, data)
            if self.checksums:  # HDF5's fletcher32 filter: the chunk's checksum right after its bytes
                self.chunk_file.write_at(offset + data.nbytes, fletcher32_of(data))

    def _sync(self) -> None:
        if self.chunk_file is not None:
            self.chunk_file.fsync()

    def _close(self) -> None:
        if self.chunk_file is not None:
            self.chunk_file.close()
            self.chunk_file = None


#: A chunk record in the spool: magic, chunk index, stored size, CRC-32 of the stored bytes.
_RECORD = struct.Struct("<4sIQI")
_RECORD_MAGIC = b"SWC1"


def _filters(compressor: str, dtype: Any, chunk_bytes: int) -> dict[str, Any]:
    """``create_dataset`` options declaring what `codecs.chunk_encoder` writes for HDF5."""
    if compressor == "gzip":
        return {"compression": "gzip", "compression_opts": 4, "shuffle": True}
    try:
        import hdf5plugin  # noqa: F401  (registers the blosc and zstd filters with HDF5)
    except ImportError:
        raise BadInputError(
            f"an HDF5 output compressed with {compressor} needs the hdf5plugin package (and so do its "
            "readers): pip install hdf5plugin, or use compressor='gzip'",
            param="compressor",
        ) from None
    if compressor == "zstd":
        return {"compression": H5Z_ZSTD, "compression_opts": (3,)}
    # blosc's filter parameters: filter and blosc versions, type size, chunk bytes, level, shuffle, lz4
    return {"compression": H5Z_BLOSC, "compression_opts": (2, 2, np.dtype(dtype).itemsize, chunk_bytes, 5, 1, 1)}


class HDF5CompressedSink(_HDF5File):
    """An HDF5 output compressed in the writer thread: chunks, sized only once written, are spooled beside the
    partial output with their index and a CRC-32 (fsynced before a progress record claims them), and `_finish`
    copies them in, in order, so a resumed run writes the same file."""

    def __init__(
        self, place: SinkPlace, array: Any, direct_io: bool, rows_done: int = 0, compressor: str | None = None
    ) -> None:
        super().__init__(place, array, direct_io)
        self.compressor = compressor or str(array.attrs.get(COMPRESSOR_ATTR, "gzip"))
        self._encode = chunk_encoder(self.compressor, self.dtype, "hdf5")
        #: chunks spooled so far (they are written in order: the next one's index)
        self.chunks = _keep_spooled(self.spool_path(place.partial), -(-int(rows_done) // self.chunk_rows))
        self._spool: BinaryIO | None = open(self.spool_path(place.partial), "ab", buffering=0)

    @staticmethod
    def spool_path(partial: str) -> str:
        return partial + ".chunks"

    @classmethod
    def create(cls, place: SinkPlace, plan: OutputPlan) -> HDF5CompressedSink:
        dtype, chunk_rows = np.dtype(plan.dtype), int(plan.chunk_rows or 0)
        options = _filters(plan.compressor, dtype, chunk_rows * plan.shape[1] * dtype.itemsize)
        return cls._open(_lay_out(place, plan, False, **options), plan.direct_io, 0, plan.compressor)

    def _write(self, start: int, block: np.ndarray, columns: Any = None) -> None:
        assert self._spool is not None
        assert self._encode is not None  # this sink writes compressed chunks only
        for index, lo, hi, a, b, data in self.covered(start, block):
            if (a, b) != (lo, hi) or index != self.chunks:
                raise OSError(
                    f"rows {a}..{b - 1} do not make up chunk {self.chunks} (compressed output chunks are "
                    "written whole and in order)"
                )
            if data.shape[0] < self.chunk_rows:  # the edge chunk is stored at full size
                data = np.concatenate([data, np.zeros((self.chunk_rows - data.shape[0], self.shape[1]), self.dtype)])
            stored = self._encode(np.ascontiguousarray(data))
            if self.checksums:
                stored += fletcher32_of(stored).tobytes()
            self._spool.write(_RECORD.pack(_RECORD_MAGIC, index, len(stored), zlib.crc32(stored)) + stored)
            self.chunks += 1

    def _sync(self) -> None:
        if self._spool is not None:
            os.fsync(self._spool.fileno())

    def _finish(self, attrs: dict[str, Any]) -> None:
        super()._finish(attrs)
        os.remove(self.spool_path(self.partial))

    def _fill(self, array: Any) -> None:
        """Write the spooled chunks into ``array``, checking they are all there."""
        spool = self.spool_path(self.partial)
        with open(spool, "rb") as chunks:
            count = 0
            for index, offset, size in _records(chunks):
                chunks.seek(offset)
                array.id.write_direct_chunk((index * self.chunk_rows, 0), chunks.read(size))
                count += 1
        expected = -(-self.shape[0] // self.chunk_rows)
        if count != expected:
            raise OSError(f"{spool}: holds {count} of the output's {expected} chunks")

    def _close(self) -> None:
        if self._spool is not None:
            self._spool.close()
            self._spool = None

    def abort(self) -> None:
        super().abort()
        with suppress(FileNotFoundError):
            os.remove(self.spool_path(self.partial))


def _keep_spooled(spool: str, done: int) -> int:
    """Keep the chunks of ``spool`` a progress record claims (the first ``done``), drop the rest (or make it empty)."""
    kept, end = 0, 0
    with open(spool, "ab+") as handle:
        handle.seek(0)
        for index, offset, size in _records(handle):
            if index != kept or kept == done:
                break
            kept, end = kept + 1, offset + size
    if kept != done:
        raise OSError(f"{spool}: holds {kept} intact chunks, its progress record claims {done}")
    os.truncate(spool, end)
    return kept


def _records(handle: BinaryIO) -> Iterator[tuple[int, int, int]]:
    """``(chunk index, offset of its bytes, size)`` of each whole, intact record of a spool, in order,
    stopping at the first torn or damaged one; ``handle`` is left after the last one yielded."""
    position = handle.tell()
    end = os.fstat(handle.fileno()).st_size
    while True:
        handle.seek(position)
        header = handle.read(_RECORD.size)
        if len(header) < _RECORD.size:
            return
        magic, index, size, crc = _RECORD.unpack(header)
        if magic != _RECORD_MAGIC or position + _RECORD.size + size > end:
            return
        data = handle.read(size)
        if len(data) < size or zlib.crc32(data) != crc:
            return
        yield index, position + _RECORD.size, size
        position += _RECORD.size + size
        handle.seek(position)
