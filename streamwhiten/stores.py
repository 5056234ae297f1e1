"""Embedding stores: open a source from a spec, read row blocks, fingerprint; write a sink safely.

The only module that imports h5py and zarr. A *spec* names a 2-D array of rows:

- ``file.h5:/group/dataset`` or ``file.h5`` with ``dataset="/group/dataset"`` (HDF5),
- ``dir.zarr`` (an array at the root), ``dir.zarr:/group/array`` or ``dir.zarr/group/array`` (Zarr v2 or v3),
- ``file.npy`` (a NumPy array, memory-mapped).

A file with exactly one 2-D dataset needs no dataset name. ``read_vector`` reads a small 1-D array
(gold scores of labelled pairs) whole, from the same kinds of spec. Sinks are written under a hidden temporary
name beside the target and renamed into place only when complete, so an interrupted or failed write
never leaves something that looks finished, and nothing that existed is touched before that rename.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import re
import shutil
import sys
from dataclasses import dataclass, field

import h5py
import numpy as np
import zarr
from zarr.core.buffer import default_buffer_prototype

_ND_BUFFER = default_buffer_prototype().nd_buffer

from ._buffers import ALIGNMENT
from ._direct_io import ChunkFile
from ._durable import fsync_dir, remove_stale_temps, temp_path, write_file_atomic
from .errors import (
    BadInputError, CorruptStoreError, InterruptedRunError, MissingChunkError, OutputExistsError, StoreIOError,
)

HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")
# HDF5 outputs are opened without a chunk cache (rdcc_nbytes=0): every write is whole chunks, and
# with no dirty chunks held in memory a file whose write failed (disk full) can still be closed.
ZARR_SUFFIX = ".zarr"
#: Default bytes per block read when the caller gives no ``block_rows``: big enough that BLAS runs at
#: full speed, small enough that a couple of blocks in flight stay well inside memory.
DEFAULT_BLOCK_BYTES = 64 << 20
#: Target bytes of one chunk of an output array.
OUTPUT_CHUNK_BYTES = 4 << 20
#: Rows hashed at each sampled position of a fingerprint.
FINGERPRINT_ROWS = 64


def split_spec(spec: str, dataset: str | None = None) -> tuple[str, str | None]:
    """Split ``path:inner`` into ``(path, inner)``; an explicit ``dataset`` wins over the suffix."""
    spec = os.fspath(spec)
    path, inner = spec, None
    if not os.path.exists(spec) and ":" in spec:
        head, _, tail = spec.rpartition(":")
        # ``a:b`` names an array inside a store only when that is unambiguous: the inner part starts
        # with "/", or the head is an existing path or has a store suffix; otherwise ':' is part of a
        # file name (e.g. a timestamp).
        suffixes = HDF5_SUFFIXES + (ZARR_SUFFIX, ".npy")
        if head and (tail.startswith("/") or os.path.exists(head) or head.rstrip("/").lower().endswith(suffixes)):
            path, inner = head, tail
    if dataset is not None:
        inner = dataset
    if inner is not None:
        inner = inner.strip("/") or None
    return path, inner


def expand_specs(specs) -> list[str]:
    """Expand glob patterns (``'shards/day-*.h5:/emb'``) that name no file literally, sorted for a stable order."""
    expanded: list[str] = []
    for spec in specs:
        path, inner = split_spec(spec)
        if any(ch in path for ch in "*?[") and not os.path.exists(path):
            matches = sorted(glob.glob(path))
            if not matches:
                raise BadInputError(f"{path}: the pattern matches no file")
            expanded.extend(match + (f":/{inner}" if inner else "") for match in matches)
        else:
            expanded.append(spec)
    return expanded


def _store_kind(path: str) -> str:
    if os.path.isdir(path):
        return "zarr"
    if path.endswith(".npy"):
        return "npy"
    if path.lower().endswith(HDF5_SUFFIXES) or h5py.is_hdf5(path):
        return "hdf5"
    raise BadInputError(f"{path}: not an HDF5 file, a Zarr store or a .npy file")


def _check_array(label: str, shape, dtype, min_rows: int) -> None:
    if len(shape) != 2:
        raise BadInputError(f"{label}: expected a 2-D array (rows x features), got {len(shape)}-D shape {tuple(shape)}")
    if np.dtype(dtype).kind != "f" or np.dtype(dtype).itemsize not in (2, 4, 8):
        raise BadInputError(f"{label}: expected float16, float32 or float64 values, got dtype {np.dtype(dtype)}")
    if shape[1] < 1:
        raise BadInputError(f"{label}: has no columns")
    if shape[0] < min_rows:
        raise BadInputError(f"{label}: has {shape[0]} row(s); at least {min_rows} are needed")


_FILL_HINT = (" (pass --fill-missing-chunks, or fill_missing_chunks=True, to read unwritten chunks as the fill value)")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


def _hdf5_unallocated(node) -> bool:
    """Whether some of an HDF5 dataset's data was never written (chunks or storage not allocated)."""
    if node.size == 0:
        return False
    if node.chunks is None:
        return node.id.get_storage_size() == 0 and node.id.get_offset() is None
    expected = math.prod(-(-n // c) for n, c in zip(node.shape, node.chunks))
    return node.id.get_num_chunks() < expected


def count_blocks(start: int, stop: int, block_rows: int) -> int:
    """Ranges in ``[start, stop)`` when cut at multiples of ``block_rows`` (as :meth:`Source.blocks` does)."""
    return max(0, (stop - 1) // block_rows - start // block_rows + 1) if stop > start else 0


class Source:
    """A read-only 2-D array of rows in a store; iterate it with :meth:`blocks` and :meth:`read`."""

    kind = "?"

    def __init__(self, path: str, dataset: str | None, array, chunk_rows: int | None):
        self.path = path
        self.dataset = dataset
        self._array = array
        #: read chunks missing from the store as the array's fill value instead of refusing them
        self.fill_missing_chunks = False
        self.shape = tuple(int(s) for s in array.shape)
        # Rows are read in native byte order (h5py, zarr and numpy convert a big-endian store as they
        # read), which is what the kernels and BLAS work on.
        self.dtype = np.dtype(array.dtype).newbyteorder("=")
        #: rows per chunk of the store itself (None for a contiguous layout)
        self.chunk_rows = chunk_rows

    @property
    def label(self) -> str:
        return f"{self.path}:/{self.dataset}" if self.dataset else self.path

    @property
    def identity(self) -> tuple[str, str]:
        """``(real path, dataset)`` naming the array the same way however the spec spelled it."""
        if self.kind == "zarr":  # dir.zarr:/a and dir.zarr/a are the same array directory
            return os.path.realpath(os.path.join(self.path, self.dataset or "")), ""
        return os.path.realpath(self.path), self.dataset or ""

    @property
    def n_rows(self) -> int:
        return self.shape[0]

    @property
    def n_features(self) -> int:
        return self.shape[1]

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a new C-contiguous array in the store's dtype."""
        return self.read_into(start, stop, np.empty((max(0, stop - start), self.n_features), dtype=self.dtype))

    def read_into(self, start: int, stop: int, out: np.ndarray) -> np.ndarray:
        """Rows ``[start, stop)`` into the preallocated ``out`` (C-contiguous); returns ``out[:stop - start]``."""
        view = out[: stop - start]
        try:
            view[...] = self._array[start:stop]
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            raise StoreIOError(f"{self.label}: cannot read rows {start}..{stop - 1}: {_io_error(exc)}") from exc
        return view

    def default_block_rows(self, target_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
        """Rows per block: a whole number of store chunks, about ``target_bytes`` in all."""
        row_bytes = max(1, self.n_features * self.dtype.itemsize)
        base = self.chunk_rows or 1
        return base * max(1, target_bytes // (base * row_bytes))

    def blocks(self, block_rows: int | None = None, start: int = 0, stop: int | None = None):
        """``(start, stop)`` row ranges covering ``[start, stop)``, aligned to multiples of ``block_rows``."""
        block_rows = int(self.default_block_rows() if block_rows is None else block_rows)
        if block_rows < 1:
            raise BadInputError(f"chunk rows must be at least 1, got {block_rows}")
        stop = self.n_rows if stop is None else stop
        while start < stop:
            end = min(stop, (start // block_rows + 1) * block_rows)
            yield start, end
            start = end

    def n_blocks(self, block_rows: int, start: int = 0, stop: int | None = None) -> int:
        """How many ranges :meth:`blocks` yields for the same arguments."""
        return count_blocks(start, self.n_rows if stop is None else stop, block_rows)

    def lazy(self) -> "LazyRows":
        """A picklable reader of this source's rows for other processes (see :class:`LazyRows`)."""
        return LazyRows(os.path.abspath(self.path), self.dataset, self.shape, self.dtype, self.label,
                        self.fill_missing_chunks)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class HDF5Source(Source):
    kind = "hdf5"

    def __init__(self, path, dataset):
        try:
            self._file = h5py.File(path, "r")
        except OSError as exc:
            raise BadInputError(f"{path}: cannot open as HDF5 ({exc})") from exc
        try:
            dataset = dataset or self._only_dataset(path)
            node = self._file.get(dataset)
            if not isinstance(node, h5py.Dataset):
                what = "is a group, not a dataset" if node is not None else "does not exist"
                raise BadInputError(f"{path}: dataset /{dataset} {what}")
            chunks = node.chunks
            super().__init__(path, dataset, node, chunks[0] if chunks else None)
            self._sparse = _hdf5_unallocated(node)
        except BaseException:
            self._file.close()
            raise

    def _only_dataset(self, path):
        found = []
        self._file.visititems(lambda name, obj: found.append(name) if isinstance(obj, h5py.Dataset) and obj.ndim == 2 else None)
        if len(found) == 1:
            return found[0]
        listing = ", ".join("/" + name for name in found[:10]) or "none"
        raise BadInputError(f"{path}: name a dataset (file.h5:/dataset or --dataset); 2-D datasets found: {listing}")

    def read_into(self, start, stop, out):
        if self._sparse and not self.fill_missing_chunks and stop > start:
            self._refuse_unwritten(start, stop)
        try:
            if stop > start:
                self._array.read_direct(out, np.s_[start:stop], np.s_[0 : stop - start])
        except (OSError, ValueError, RuntimeError) as exc:
            # HDF5 reports a failed system call with its errno; anything else (a checksum or filter
            # failure, an address past the end of a truncated file) is damaged data.
            failed = re.search(r"errno = (\d+)", str(exc))
            if failed and int(failed.group(1)):
                raise StoreIOError(f"{self.label}: cannot read rows {start}..{stop - 1}: {_io_error(exc)}") from exc
            raise CorruptStoreError(f"{self.label}: rows {start}..{stop - 1} cannot be read, the file is damaged or "
                                    f"truncated ({_first_line(exc)})") from exc
        return out[: stop - start]

    def _refuse_unwritten(self, start, stop):
        """Refuse rows whose chunk was never written (HDF5 would read it as the fill value)."""
        node = self._array
        if node.chunks is None:
            raise MissingChunkError(f"{self.label}: its data was never written (no storage is allocated){_FILL_HINT}")
        rows, columns = node.chunks
        for index in range(start // rows, (stop - 1) // rows + 1):
            for column in range(0, self.n_features, columns):
                info = node.id.get_chunk_info_by_coord((index * rows, column))
                if info is None or info.byte_offset is None:
                    lo, hi = index * rows, min((index + 1) * rows, self.n_rows)
                    raise MissingChunkError(
                        f"{self.label}: rows {lo}..{hi - 1} were never written (their chunk is not in the file): the "
                        f"dataset is incomplete{_FILL_HINT}", rows=(lo, hi))

    def close(self):
        if self._file.id.valid:
            self._file.close()


class ZarrSource(Source):
    kind = "zarr"

    def __init__(self, path, dataset):
        try:
            node = zarr.open(store=path, mode="r", path=dataset or "")
        except (FileNotFoundError, KeyError, ValueError, zarr.errors.BaseZarrError) as exc:
            where = f"array /{dataset}" if dataset else "array"
            raise BadInputError(f"{path}: no Zarr {where} found ({exc.__class__.__name__})") from exc
        if isinstance(node, zarr.Group):
            arrays = sorted(name for name, member in node.members(max_depth=None)
                            if isinstance(member, zarr.Array) and member.ndim == 2)
            if len(arrays) != 1:
                listing = ", ".join("/" + name for name in arrays[:10]) or "none"
                raise BadInputError(f"{path}: name an array (dir.zarr:/array or --dataset); 2-D arrays found: {listing}")
            dataset = ((dataset or "") + "/" + arrays[0]).strip("/")
            node = node[arrays[0]]
        super().__init__(path, dataset, node, int(node.chunks[0]) if node.ndim >= 1 else None)
        self._raw_root = self._raw_chunk_root()
        # The grid chunk keys are made on: shards where the array is sharded, else its chunks.
        self._grid = tuple(int(n) for n in (getattr(node, "shards", None) or node.chunks))

    def _raw_chunk_root(self) -> str | None:
        return raw_chunk_root(self._array)

    def read_into(self, start, stop, out):
        view = out[: stop - start]
        if self._raw_root is None:
            if not self.fill_missing_chunks and stop > start:
                self._refuse_missing(start, stop)
            try:  # zarr decodes straight into the caller's buffer
                with np.errstate(all="ignore"):
                    self._array.get_basic_selection(np.s_[start:stop], out=_ND_BUFFER.from_numpy_array(view))
            except OSError as exc:
                raise StoreIOError(f"{self.label}: cannot read rows {start}..{stop - 1}: {_io_error(exc)}") from exc
            except Exception as exc:  # a codec failing on the bytes it was given: the chunk is damaged
                raise CorruptStoreError(f"{self.label}: rows {start}..{stop - 1} cannot be decoded, a chunk is damaged "
                                        f"({exc.__class__.__name__}: {_first_line(exc)})") from exc
            return view
        # Uncompressed chunks are the rows' bytes: read them from the chunk files into the buffer, one
        # copy from the page cache, as h5py's read_direct does (zarr's own pipeline copies several times).
        if not 0 <= start <= stop <= self.n_rows:
            raise StoreIOError(f"{self.label}: rows {start}..{stop - 1} are outside its {self.n_rows} rows")
        rows, row_bytes = self.chunk_rows, self.n_features * self.dtype.itemsize
        for index in range(start // rows, (stop - 1) // rows + 1):
            lo, hi = max(start, index * rows), min(stop, (index + 1) * rows)
            target = view[lo - start : hi - start]
            path = os.path.join(self._raw_root, self._array.metadata.encode_chunk_key((index, 0)))
            try:
                with open(path, "rb", buffering=0) as handle:
                    size = os.fstat(handle.fileno()).st_size
                    if size != rows * row_bytes:
                        raise CorruptStoreError(
                            f"{self.label}: chunk {self._chunk_key(index)} (rows {index * rows}..{min(self.n_rows, (index + 1) * rows) - 1}) "
                            f"has {size} bytes, not {rows * row_bytes}: it is truncated or damaged")
                    handle.seek((lo - index * rows) * row_bytes)
                    _read_exactly(handle, memoryview(target).cast("B"), path)
            except FileNotFoundError:
                if not self.fill_missing_chunks:
                    self._raise_missing(index)
                target[...] = self._array.metadata.fill_value or 0
            except OSError as exc:
                raise StoreIOError(f"{self.label}: cannot read rows {lo}..{hi - 1}: {_io_error(exc)}") from exc
        return view

    def _chunk_key(self, index: int, column: int = 0) -> str:
        return self._array.metadata.encode_chunk_key((index, column))

    def _raise_missing(self, index: int, column: int = 0):
        rows = self._grid[0]
        lo, hi = index * rows, min((index + 1) * rows, self.n_rows)
        fill = self._array.metadata.fill_value
        raise MissingChunkError(
            f"{self.label}: chunk {self._chunk_key(index, column)} (rows {lo}..{hi - 1}) is missing: the store is "
            f"incomplete or damaged (if it was written leaving out chunks that hold only the fill value {fill}, pass "
            "--fill-missing-chunks, or fill_missing_chunks=True, to read them as that value)", rows=(lo, hi))

    def _refuse_missing(self, start, stop):
        """Refuse rows whose chunk (or shard) is not in the store (zarr would read it as the fill value)."""
        rows, columns = self._grid
        for index in range(start // rows, (stop - 1) // rows + 1):
            for column in range(-(-self.n_features // columns)):
                if not self._chunk_exists(self._chunk_key(index, column)):
                    self._raise_missing(index, column)

    def _chunk_exists(self, key: str) -> bool:
        store = self._array.store
        if isinstance(store, zarr.storage.LocalStore):
            return os.path.exists(os.path.join(str(store.root), self._array.path, key))
        from zarr.core.sync import sync

        return bool(sync(store.exists(f"{self._array.path}/{key}".lstrip("/"))))


def raw_chunk_root(array) -> str | None:
    """The directory of a Zarr array's chunk files when each one holds its rows as raw native-endian
    C-order bytes (an uncompressed, unsharded local 2-D array with whole rows per chunk), else None."""
    if type(array.store).__name__ != "LocalStore" or array.ndim != 2 or array.chunks[1] != array.shape[1]:
        return None
    metadata = array.metadata
    if metadata.zarr_format == 3:
        codecs = metadata.codecs
        if len(codecs) != 1 or type(codecs[0]).__name__ != "BytesCodec":
            return None
        endian = getattr(codecs[0], "endian", None)
        if endian is not None and getattr(endian, "value", endian) != sys.byteorder:
            return None
    elif metadata.compressor is not None or metadata.filters or metadata.order != "C" or not np.dtype(array.dtype).isnative:
        return None
    return os.path.join(str(array.store.root), array.path)


def _read_exactly(handle, buffer: memoryview, path: str) -> None:
    done = 0
    while done < len(buffer):
        count = handle.readinto(buffer[done:])
        if not count:
            raise CorruptStoreError(f"{path}: chunk file is truncated ({done} of {len(buffer)} bytes)")
        done += count


class NpySource(Source):
    kind = "npy"

    def __init__(self, path, dataset):
        if dataset:
            raise BadInputError(f"{path}: a .npy file holds one array; drop the dataset name ':{dataset}'")
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            if "mmap length is greater than file size" in str(exc):
                raise CorruptStoreError(f"{path}: the file is truncated (shorter than its header says)") from exc
            raise BadInputError(f"{path}: cannot read as .npy ({exc})") from exc
        if not isinstance(array, np.ndarray):
            raise BadInputError(f"{path}: is not a .npy array file (an .npz archive?)")
        super().__init__(path, None, array, None)
        self._file_bytes = int(getattr(array, "offset", 0)) + array.nbytes

    def read_into(self, start, stop, out):
        # Reading a memory map past the end of a file that shrank would kill the process (SIGBUS).
        try:
            size = os.stat(self.path).st_size
        except OSError as exc:
            raise StoreIOError(f"{self.label}: cannot read rows {start}..{stop - 1}: {_io_error(exc)}") from exc
        if size < self._file_bytes:
            raise CorruptStoreError(f"{self.label}: the file shrank to {size} bytes while being read (its header says "
                                    f"{self._file_bytes}): it is being rewritten or was truncated")
        return super().read_into(start, stop, out)


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

    ndim = 2

    def __getitem__(self, key) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        rows = key[0] if key else slice(None)
        columns = key[1] if len(key) > 1 else slice(None)
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise BadInputError(f"{self.label}: only contiguous row ranges can be read, got {rows!r}")
        start, stop, _ = rows.indices(self.shape[0])
        stop = max(start, stop)
        with open_source(self.path, self.dataset, min_rows=0, fill_missing_chunks=self.fill_missing_chunks) as source:
            if source.shape != self.shape:
                raise StoreIOError(
                    f"{self.label}: changed while being read (shape {source.shape}, was {self.shape})"
                )
            block = source.read(start, stop)
        return block if columns == slice(None) else np.ascontiguousarray(block[:, columns])


def open_source(spec: str, dataset: str | None = None, min_rows: int = 1, fill_missing_chunks: bool = False) -> Source:
    """Open ``spec`` read-only and check it is a 2-D float array with at least ``min_rows`` rows.

    A chunk missing from the store (Zarr) or never written (HDF5) is refused when read, naming the
    rows it covers, unless ``fill_missing_chunks``: then it reads as the array's fill value.
    """
    if isinstance(spec, Source):
        return spec
    path, inner = split_spec(spec, dataset)
    if not os.path.exists(path):
        raise BadInputError(f"{path}: no such file or directory")
    kind = _store_kind(path)
    source = {"hdf5": HDF5Source, "zarr": ZarrSource, "npy": NpySource}[kind](path, inner)
    source.fill_missing_chunks = bool(fill_missing_chunks)
    try:
        _check_array(source.label, source.shape, source.dtype, min_rows)
    except BaseException:
        source.close()
        raise
    return source


def read_vector(spec: str, dataset: str | None = None, min_length: int = 1) -> tuple[np.ndarray, str]:
    """A whole 1-D numeric array (e.g. gold scores) as float64, and its label.

    ``spec`` is ``file.h5:/dataset``, ``dir.zarr[:/array]`` or ``file.npy``; a file holding exactly one
    1-D array needs no name. An ``(n, 1)`` column is accepted and flattened.
    """
    path, inner = split_spec(spec, dataset)
    if not os.path.exists(path):
        raise BadInputError(f"{path}: no such file or directory")
    kind = _store_kind(path)
    label = f"{path}:/{inner}" if inner else path
    try:
        if kind == "npy":
            values = np.load(path, allow_pickle=False)
        elif kind == "hdf5":
            try:
                handle = h5py.File(path, "r")
            except OSError as exc:
                raise BadInputError(f"{path}: cannot open as HDF5 ({exc})") from exc
            with handle:
                if inner is None:
                    found = []
                    handle.visititems(lambda name, obj: found.append(name) if isinstance(obj, h5py.Dataset) and obj.ndim == 1 else None)
                    if len(found) != 1:
                        listing = ", ".join("/" + name for name in found[:10]) or "none"
                        raise BadInputError(f"{path}: name a dataset (file.h5:/dataset); 1-D datasets found: {listing}")
                    inner, label = found[0], f"{path}:/{found[0]}"
                node = handle.get(inner)
                if not isinstance(node, h5py.Dataset):
                    what = "is a group, not a dataset" if node is not None else "does not exist"
                    raise BadInputError(f"{path}: dataset /{inner} {what}")
                values = node[()]
        else:
            try:
                node = zarr.open(store=path, mode="r", path=inner or "")
            except (FileNotFoundError, KeyError, ValueError, zarr.errors.BaseZarrError) as exc:
                raise BadInputError(f"{label}: no Zarr array found ({exc.__class__.__name__})") from exc
            if isinstance(node, zarr.Group):
                arrays = [name for name, arr in node.arrays() if arr.ndim == 1]
                if len(arrays) != 1:
                    listing = ", ".join("/" + name for name in arrays[:10]) or "none"
                    raise BadInputError(f"{path}: name an array (dir.zarr:/array); 1-D arrays found: {listing}")
                inner = ((inner or "") + "/" + arrays[0]).strip("/")
                label, node = f"{path}:/{inner}", node[arrays[0]]
            values = node[...]
    except (OSError, RuntimeError) as exc:
        raise StoreIOError(f"{label}: cannot read: {_io_error(exc)}") from exc
    except ValueError as exc:
        raise BadInputError(f"{label}: cannot read ({exc})") from exc
    values = np.asarray(values)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1:
        raise BadInputError(f"{label}: expected a 1-D array, got shape {values.shape}")
    if values.dtype.kind not in "fiub":
        raise BadInputError(f"{label}: expected numbers, got dtype {values.dtype}")
    if values.shape[0] < min_length:
        raise BadInputError(f"{label}: has {values.shape[0]} value(s); at least {min_length} are needed")
    return values.astype(np.float64), label


def fingerprint(source: Source, n_rows: int | None = None) -> dict:
    """Identity of the first ``n_rows`` rows of ``source`` (all by default), cheap to compute.

    Hashes a few sampled row ranges (start, quartiles, end) rather than the whole store, so an
    append-only store still matches the fingerprint of its earlier prefix.
    """
    n_rows = source.n_rows if n_rows is None else int(n_rows)
    digest = hashlib.sha256()
    width = min(FINGERPRINT_ROWS, n_rows)
    starts = sorted({0, n_rows // 4, n_rows // 2, (3 * n_rows) // 4, max(0, n_rows - width)})
    for start in starts:
        stop = min(n_rows, start + width)
        digest.update(np.ascontiguousarray(source.read(start, stop)).tobytes())
    path, dataset = source.identity
    return {
        "path": path,
        "dataset": dataset,
        "n_rows": n_rows,
        "n_features": source.n_features,
        "dtype": str(source.dtype),
        "chunk_rows": source.chunk_rows or 0,
        "sha256_sampled": digest.hexdigest(),
    }


# ----------------------------------------------------------------------------------------------- sinks


def output_kind(path: str) -> str:
    if path.rstrip("/").endswith(ZARR_SUFFIX):
        return "zarr"
    if path.lower().endswith(HDF5_SUFFIXES):
        return "hdf5"
    raise BadInputError(f"{path}: output must end in .zarr or one of {', '.join(HDF5_SUFFIXES)}")


def partial_path(path: str) -> str:
    """The hidden temporary name a sink is written under before it is renamed to ``path``."""
    head, tail = os.path.split(os.path.abspath(path.rstrip("/")))
    return os.path.join(head, f".{tail}.partial")


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


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def _io_error(exc: BaseException) -> str:
    """An OS or HDF5 error as a short one-line reason (without a second copy of the path).

    HDF5 reports a failed system call inside a long multi-line message; its ``error message = '...'``
    part is the reason (e.g. "No space left on device").
    """
    if getattr(exc, "strerror", None):
        return exc.strerror
    failed = re.search(r"error message = '([^']*)'", str(exc))
    return failed.group(1) if failed else _first_line(exc)


@dataclass
class Sink:
    """A new 2-D array being written under a temporary name; :meth:`commit` renames it into place.

    Chunk data is written as raw bytes through a descriptor of our own (Zarr: one chunk file per
    chunk; HDF5: chunks allocated up front, written in place). HDF5's library is used only to lay out
    the file before any data is written and to set the attributes at the end, each time on a handle
    that is closed right after, so a failed data write (disk full) never leaves the library holding a
    half-written file it would flush or crash on later.
    """

    path: str
    dataset: str | None
    kind: str
    partial: str
    shape: tuple
    dtype: np.dtype
    chunk_rows: int
    _array: object = None  # Zarr: the array being written
    _unsynced: set = field(default_factory=set)  # Zarr chunk files written since they were last fsynced
    direct_io: bool = True  # whole chunks written around the page cache (see _direct_io)
    _chunk_file: ChunkFile | None = None  # HDF5: our own descriptor for writing chunk data in place
    _offsets: list | None = None  # HDF5: byte offset of each chunk in the file

    @property
    def label(self) -> str:
        return f"{self.path}:/{self.dataset}" if self.dataset else self.path

    @property
    def progress_path(self) -> str:
        """Sidecar JSON beside the partial output: how many rows are safely written, and for which job."""
        return self.partial + ".progress.json"

    def _sync(self) -> None:
        """fsync what was written: the HDF5 file, or the Zarr chunk files written since the last sync."""
        if self.kind == "hdf5":
            if self._chunk_file is not None:
                self._chunk_file.fsync()
            return
        root = raw_chunk_root(self._array)
        if root is not None and self._unsynced:
            directories = set()
            for index in sorted(self._unsynced):
                path = os.path.join(root, self._array.metadata.encode_chunk_key((index, 0)))
                if os.path.exists(path):
                    with open(path, "rb") as handle:
                        os.fsync(handle.fileno())
                    directories.add(os.path.dirname(path))
            for directory in directories:
                fsync_dir(directory)
            self._unsynced.clear()

    def save_progress(self, job: dict, rows_done: int, n_nonfinite: int = 0) -> None:
        """Make rows ``[0, rows_done)`` durable, then record that atomically (for a later resume)."""
        try:
            self._sync()
        except OSError as exc:
            raise StoreIOError(f"{self.path}: cannot make the rows written durable: {_io_error(exc)}") from exc
        record = dict(job, rows_done=int(rows_done), n_nonfinite=int(n_nonfinite))
        write_file_atomic(self.progress_path, lambda handle: handle.write(json.dumps(record, sort_keys=True).encode()),
                          "progress record")

    def write(self, start: int, block: np.ndarray) -> None:
        """Write ``block`` at row ``start``. Every output chunk it covers whole is written as raw bytes
        (uncompressed, so the stored chunk is exactly the rows), directly where aligned."""
        stop = start + block.shape[0]
        try:
            if self.kind == "hdf5":
                self._write_hdf5(start, block)
            else:
                self._write_zarr(start, block)
        except OSError as exc:
            raise StoreIOError(f"{self.label}: cannot write rows {start}..{stop - 1}: {_io_error(exc)}") from exc

    def _covered(self, start: int, block: np.ndarray):
        """``(chunk index, first row of the chunk, rows a..b it gets, their data)`` for each chunk ``block`` touches."""
        stop, rows = start + block.shape[0], self.chunk_rows
        for index in range(start // rows, (stop - 1) // rows + 1):
            lo, hi = index * rows, min((index + 1) * rows, self.shape[0])
            a, b = max(lo, start), min(hi, stop)
            yield index, lo, hi, a, b, np.ascontiguousarray(block[a - start : b - start], dtype=self.dtype)

    def _write_hdf5(self, start: int, block: np.ndarray) -> None:
        row_bytes = self.shape[1] * self.dtype.itemsize
        for index, lo, hi, a, b, data in self._covered(start, block):
            if b == self.shape[0] and hi - lo < self.chunk_rows:  # the edge chunk is stored at full size
                padded = np.zeros((self.chunk_rows - (a - lo), self.shape[1]), self.dtype)
                padded[: b - a] = data
                data = padded
            self._chunk_file.write_at(self._offsets[index] + (a - lo) * row_bytes, data)

    def _write_zarr(self, start: int, block: np.ndarray) -> None:
        root = raw_chunk_root(self._array)
        if root is None:
            self._array[start : start + block.shape[0]] = block
            return
        for index, lo, hi, a, b, data in self._covered(start, block):
            if (a, b) != (lo, hi):
                self._array[a:b] = data
                continue
            self._unsynced.add(index)
            path = os.path.join(root, self._array.metadata.encode_chunk_key((index, 0)))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with ChunkFile(path, create=True, direct=self.direct_io) as chunk_file:
                chunk_file.write_at(0, data)
                if data.shape[0] < self.chunk_rows:  # an edge chunk is stored at full size, padded with the fill value
                    pad = np.full((self.chunk_rows - data.shape[0], self.shape[1]),
                                  self._array.metadata.fill_value or 0, self.dtype)
                    chunk_file.write_at(data.nbytes, pad)

    def region_writer(self) -> "ZarrRegionWriter":
        """A picklable writer of whole-chunk row ranges of this (Zarr) sink, for worker processes."""
        if self.kind != "zarr":
            raise BadInputError(f"{self.path}: only a Zarr output can be written by several processes at once")
        return ZarrRegionWriter(self.partial, self.dataset, self.shape, self.chunk_rows, self.label)

    def _close(self) -> None:
        if self._chunk_file is not None:
            self._chunk_file.close()
            self._chunk_file = None

    def commit(self, overwrite: bool = False, attrs: dict | None = None) -> None:
        """Set ``attrs`` and ``complete = True``, make everything durable, and rename into place
        (replacing an old output only if ``overwrite``)."""
        attrs = dict(attrs or {}, complete=True)
        try:
            if self.kind == "hdf5":
                self._sync()
                self._close()
                _set_hdf5_attrs(self.partial, self.dataset, attrs)
                with open(self.partial, "rb+") as handle:
                    os.fsync(handle.fileno())
            else:
                self._array.attrs.update(attrs)
                self._sync()
                for directory, _, files in os.walk(self.partial):  # metadata files and every directory
                    for name in files:
                        if name.startswith("zarr.json") or name.startswith(".z"):
                            with open(os.path.join(directory, name), "rb") as handle:
                                os.fsync(handle.fileno())
                    fsync_dir(directory)
            final = os.path.abspath(self.path.rstrip("/"))
            if os.path.lexists(final):
                if not overwrite:
                    raise OutputExistsError(f"{self.path}: already exists (pass --overwrite to replace it)")
                if os.path.isdir(final) and not os.path.islink(final):
                    # A directory cannot be replaced atomically: move the old one aside first (a later
                    # run puts it back if this one dies before the new one is in place).
                    old = temp_path(final, "old")
                    os.rename(final, old)
                    os.rename(self.partial, final)
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    os.replace(self.partial, final)
            else:
                os.rename(self.partial, final)
            fsync_dir(os.path.dirname(final))
            _remove(self.progress_path)
        except (OSError, RuntimeError) as exc:
            raise StoreIOError(f"{self.path}: cannot finish writing: {_io_error(exc)}") from exc

    def abort(self) -> None:
        """Remove the temporary output; the target path is left as it was."""
        try:
            self._close()
        except Exception:
            pass
        _remove(self.partial)
        _remove(self.progress_path)

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


def _close_quietly(handle) -> None:
    try:
        if handle is not None and handle.id.valid:
            handle.close()
    except Exception:
        pass


def _set_hdf5_attrs(path: str, dataset: str, attrs: dict) -> None:
    handle = h5py.File(path, "r+", rdcc_nbytes=0)
    try:
        handle[dataset].attrs.update({key: _hdf5_attr(value) for key, value in attrs.items()})
        handle.flush()
    except BaseException:
        _close_quietly(handle)
        raise
    handle.close()


def _hdf5_chunk_offsets(array, chunk_rows: int) -> list:
    """Byte offset in the file of each (row) chunk of an HDF5 dataset whose chunks are all allocated."""
    offsets = [None] * -(-array.shape[0] // chunk_rows)
    for i in range(array.id.get_num_chunks()):
        info = array.id.get_chunk_info(i)
        if info.filter_mask == 0 and info.chunk_offset[0] % chunk_rows == 0:
            offsets[info.chunk_offset[0] // chunk_rows] = info.byte_offset
    if any(offset is None for offset in offsets):
        raise OSError(f"{offsets.count(None)} of its {len(offsets)} chunks are not allocated")
    return offsets


@dataclass(frozen=True)
class ZarrRegionWriter:
    """Writes row ranges into a Zarr sink still under its temporary name, from any process.

    Every range must cover whole output chunks (the last one may end at the last row), so no chunk
    file is ever written by two tasks and concurrent writers need no lock.
    """

    partial: str
    dataset: str | None
    shape: tuple
    chunk_rows: int
    label: str

    def __call__(self, start: int, block: np.ndarray) -> None:
        stop = start + block.shape[0]
        if start % self.chunk_rows or (stop % self.chunk_rows and stop != self.shape[0]) or stop > self.shape[0]:
            raise BadInputError(
                f"{self.label}: rows {start}..{stop - 1} are not aligned to output chunks of {self.chunk_rows} rows"
            )
        try:
            array = zarr.open_array(store=self.partial, path=self.dataset or "", mode="r+")
            array[start:stop] = block
        except (OSError, zarr.errors.BaseZarrError) as exc:
            raise StoreIOError(f"{self.label}: cannot write rows {start}..{stop - 1}: {_io_error(exc)}") from exc


def create_sink(
    spec: str,
    n_rows: int,
    n_features: int,
    dtype="float32",
    attrs: dict | None = None,
    overwrite: bool = False,
    zarr_format: int = 3,
    chunk_rows: int | None = None,
    direct_io: bool = True,
) -> Sink:
    """Start writing a new ``n_rows x n_features`` array at ``spec`` under a temporary name.

    With ``direct_io``, whole aligned chunks are written around the page cache (see ``_direct_io``).
    """
    path, dataset = split_spec(spec)
    kind = output_kind(path)
    if os.path.lexists(path) and not overwrite:
        raise OutputExistsError(f"{path}: already exists (pass --overwrite to replace it)")
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(parent):
        raise BadInputError(f"{path}: directory {parent} does not exist")
    dtype = np.dtype(dtype)
    if dtype not in (np.float16, np.float32, np.float64):
        raise BadInputError(f"output dtype must be float16, float32 or float64, got {dtype}")
    chunk_rows = int(chunk_rows or output_chunk_rows(n_features, dtype, n_rows))
    partial = partial_path(path)
    try:
        remove_stale_temps(path)
        _remove(partial)
        _remove(partial + ".progress.json")  # a record of an earlier partial must never describe this one
        remove_stale_temps(partial + ".progress.json")
    except OSError as exc:
        raise StoreIOError(f"{partial}: cannot remove the partial output of an earlier run: {_io_error(exc)}") from exc
    needed, free = n_rows * n_features * dtype.itemsize, shutil.disk_usage(parent).free
    if needed > free:
        raise StoreIOError(f"{path}: the output needs about {needed / 1e6:,.1f} MB but only {free / 1e6:,.1f} MB are free in {parent}")
    # Every attribute exists from the start (commit only changes values), so a resumed HDF5 output's
    # metadata is laid out as an uninterrupted run's and the two files are byte for byte the same.
    attrs = dict(attrs or {}, complete=False, n_nonfinite_rows=0)
    shape = (n_rows, n_features)
    handle = None
    try:
        if kind == "hdf5":
            dataset = dataset or "embeddings"
            # Chunks allocated up front (never filled), each at an aligned offset: their data is then
            # written in place through our own descriptor, and the library's handle is closed first.
            handle = h5py.File(partial, "w", rdcc_nbytes=0, alignment_threshold=ALIGNMENT, alignment_interval=ALIGNMENT)
            layout = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            layout.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
            array = handle.create_dataset(dataset, shape=shape, dtype=dtype, chunks=(chunk_rows, n_features),
                                          dcpl=layout, fill_time="never")
            array.attrs.update({key: _hdf5_attr(value) for key, value in attrs.items()})
            handle.flush()
            offsets = _hdf5_chunk_offsets(array, chunk_rows)
            handle.close()
            handle = None
            return Sink(path, dataset, kind, partial, shape, dtype, chunk_rows, direct_io=direct_io,
                        _chunk_file=ChunkFile(partial, direct=direct_io), _offsets=offsets)
        if dataset:
            root = zarr.open_group(store=partial, mode="w", zarr_format=zarr_format)
            array = root.create_array(dataset, shape=shape, chunks=(chunk_rows, n_features), dtype=dtype, compressors=None)
        else:
            array = zarr.create_array(store=partial, shape=shape, chunks=(chunk_rows, n_features), dtype=dtype,
                                      compressors=None, zarr_format=zarr_format)
        array.attrs.update(attrs)
        return Sink(path, dataset, kind, partial, shape, dtype, chunk_rows, array, direct_io=direct_io)
    except (OSError, RuntimeError, zarr.errors.BaseZarrError) as exc:
        _close_quietly(handle)
        _remove(partial)
        raise StoreIOError(f"{path}: cannot create output: {_io_error(exc)}") from exc


def resume_sink(spec: str, job: dict, direct_io: bool = True) -> tuple[Sink | None, int, int]:
    """Reopen the partial output of an interrupted run of the same ``job``; ``(sink, rows_done, n_nonfinite)``.

    Returns ``(None, 0, 0)`` when there is nothing to resume, or when the partial output belongs to another
    job or cannot be opened (then it is removed, so the caller starts over).
    """
    path, dataset = split_spec(spec)
    partial = partial_path(path)
    progress = partial + ".progress.json"
    remove_stale_temps(path)
    remove_stale_temps(progress)
    try:
        with open(progress) as handle:
            recorded = json.load(handle)
    except (OSError, ValueError):
        recorded = None
    counts = [int(recorded.pop(key, 0)) for key in ("rows_done", "n_nonfinite")] if isinstance(recorded, dict) else [0, 0]
    if recorded != job or not os.path.exists(partial):
        _remove(partial)
        _remove(progress)
        return None, 0, 0
    kind = output_kind(path)
    try:
        if kind == "hdf5":
            dataset = dataset or "embeddings"
            with h5py.File(partial, "r", rdcc_nbytes=0) as handle:
                array = handle[dataset]
                shape, dtype, chunk_rows = tuple(int(n) for n in array.shape), np.dtype(array.dtype), int(array.chunks[0])
                offsets = _hdf5_chunk_offsets(array, chunk_rows)
            return Sink(path, dataset, kind, partial, shape, dtype, chunk_rows, direct_io=direct_io,
                        _chunk_file=ChunkFile(partial, direct=direct_io), _offsets=offsets), counts[0], counts[1]
        array = zarr.open_array(store=partial, path=dataset or "", mode="r+")
        shape = tuple(int(n) for n in array.shape)
        return (Sink(path, dataset, kind, partial, shape, np.dtype(array.dtype), int(array.chunks[0]), array,
                     direct_io=direct_io), counts[0], counts[1])
    except (OSError, KeyError, ValueError, TypeError, RuntimeError, zarr.errors.BaseZarrError):
        _remove(partial)
        _remove(progress)
        return None, 0, 0


def _hdf5_attr(value):
    if value is None:
        return "none"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return value


def read_attrs(spec: str) -> dict:
    """The attributes of the array named by ``spec`` (for tests and ``info``)."""
    source = open_source(spec, min_rows=0)
    try:
        return dict(source._array.attrs)
    finally:
        source.close()


def same_file(a: str, b: str) -> bool:
    """True when two paths name the same file or directory (or one lies inside the other)."""
    a, b = os.path.realpath(a.rstrip("/")), os.path.realpath(b.rstrip("/"))
    return a == b or a.startswith(b + os.sep) or b.startswith(a + os.sep)



def _same_inode(a: str, b: str) -> bool:
    try:
        first, second = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def refuse_input_overlap(outputs: dict, inputs, nested: bool = True) -> None:
    """Refuse, before anything is written, an output that would replace or write into an input.

    ``outputs`` maps each output path (or spec) to what it is ("model file", ...); ``inputs`` are the
    specs or paths read. An output is refused when it is an input, resolves to one (symlinks), lies
    inside one or holds one (directory stores, unless ``nested`` is false: an output directory that
    only receives new files), or is a hard link of one, whatever ``overwrite`` says.
    """
    input_paths = [split_spec(os.fspath(spec))[0] for spec in inputs if spec is not None]
    for output, what in outputs.items():
        if output is None:
            continue
        out_path = split_spec(os.fspath(output))[0]
        for in_path in input_paths:
            same = same_file(out_path, in_path) if nested else os.path.realpath(out_path) == os.path.realpath(in_path)
            if same or _same_inode(out_path, in_path):
                raise BadInputError(f"{out_path}: the {what} would overwrite the input {in_path}; choose another path")
