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
from .errors import BadInputError, InterruptedRunError, OutputExistsError, StoreIOError

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
            raise StoreIOError(f"{self.label}: cannot read rows {start}..{stop - 1}: {exc}") from exc
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
        return LazyRows(os.path.abspath(self.path), self.dataset, self.shape, self.dtype, self.label)

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
        try:
            if stop > start:
                self._array.read_direct(out, np.s_[start:stop], np.s_[0 : stop - start])
        except (OSError, ValueError, RuntimeError) as exc:
            raise StoreIOError(f"{self.label}: cannot read rows {start}..{stop - 1}: {exc}") from exc
        return out[: stop - start]

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

    def _raw_chunk_root(self) -> str | None:
        return raw_chunk_root(self._array)

    def read_into(self, start, stop, out):
        view = out[: stop - start]
        if self._raw_root is None:
            try:  # zarr decodes straight into the caller's buffer
                self._array.get_basic_selection(np.s_[start:stop], out=_ND_BUFFER.from_numpy_array(view))
            except (OSError, ValueError, RuntimeError, KeyError, zarr.errors.BaseZarrError) as exc:
                raise StoreIOError(f"{self.label}: cannot read rows {start}..{stop - 1}: {exc}") from exc
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
                    handle.seek((lo - index * rows) * row_bytes)
                    _read_exactly(handle, memoryview(target).cast("B"), path)
            except FileNotFoundError:  # a chunk never written holds the fill value
                target[...] = self._array.metadata.fill_value or 0
            except OSError as exc:
                raise StoreIOError(f"{self.label}: cannot read rows {lo}..{hi - 1}: {exc}") from exc
        return view


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
            raise StoreIOError(f"{path}: chunk file is truncated ({done} of {len(buffer)} bytes)")
        done += count


class NpySource(Source):
    kind = "npy"

    def __init__(self, path, dataset):
        if dataset:
            raise BadInputError(f"{path}: a .npy file holds one array; drop the dataset name ':{dataset}'")
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise BadInputError(f"{path}: cannot read as .npy ({exc})") from exc
        if not isinstance(array, np.ndarray):
            raise BadInputError(f"{path}: is not a .npy array file (an .npz archive?)")
        super().__init__(path, None, array, None)


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

    ndim = 2

    def __getitem__(self, key) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        rows = key[0] if key else slice(None)
        columns = key[1] if len(key) > 1 else slice(None)
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise BadInputError(f"{self.label}: only contiguous row ranges can be read, got {rows!r}")
        start, stop, _ = rows.indices(self.shape[0])
        stop = max(start, stop)
        with open_source(self.path, self.dataset, min_rows=0) as source:
            if source.shape != self.shape:
                raise StoreIOError(
                    f"{self.label}: changed while being read (shape {source.shape}, was {self.shape})"
                )
            block = source.read(start, stop)
        return block if columns == slice(None) else np.ascontiguousarray(block[:, columns])


def open_source(spec: str, dataset: str | None = None, min_rows: int = 1) -> Source:
    """Open ``spec`` read-only and check it is a 2-D float array with at least ``min_rows`` rows."""
    if isinstance(spec, Source):
        return spec
    path, inner = split_spec(spec, dataset)
    if not os.path.exists(path):
        raise BadInputError(f"{path}: no such file or directory")
    kind = _store_kind(path)
    source = {"hdf5": HDF5Source, "zarr": ZarrSource, "npy": NpySource}[kind](path, inner)
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
        raise StoreIOError(f"{label}: cannot read: {exc}") from exc
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


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass
class Sink:
    """A new 2-D array being written under a temporary name; :meth:`commit` renames it into place."""

    path: str
    dataset: str | None
    kind: str
    partial: str
    shape: tuple
    dtype: np.dtype
    chunk_rows: int
    _array: object = None
    _file: object = None
    _unsynced: set = field(default_factory=set)  # Zarr chunk files written since they were last fsynced
    direct_io: bool = True  # whole chunks written around the page cache (see _direct_io)
    _chunk_file: ChunkFile | None = None  # HDF5: our own descriptor for writing chunk data in place

    @property
    def label(self) -> str:
        return f"{self.path}:/{self.dataset}" if self.dataset else self.path

    @property
    def progress_path(self) -> str:
        """Sidecar JSON beside the partial output: how many rows are safely written, and for which job."""
        return self.partial + ".progress.json"

    def _sync(self) -> None:
        """fsync what was written: the HDF5 file, or the Zarr chunk files written since the last sync."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.id.get_vfd_handle())
        root = raw_chunk_root(self._array) if self.kind == "zarr" else None
        if root is not None and self._unsynced:
            directories = set()
            for index in sorted(self._unsynced):
                path = os.path.join(root, self._array.metadata.encode_chunk_key((index, 0)))
                if os.path.exists(path):
                    with open(path, "rb") as handle:
                        os.fsync(handle.fileno())
                    directories.add(os.path.dirname(path))
            for directory in directories:
                _fsync_dir(directory)
            self._unsynced.clear()

    def save_progress(self, job: dict, rows_done: int, n_nonfinite: int = 0) -> None:
        """Make rows ``[0, rows_done)`` durable, then record that atomically (for a later resume)."""
        try:
            self._sync()
            temp = self.progress_path + ".tmp"
            with open(temp, "w") as handle:
                json.dump(dict(job, rows_done=int(rows_done), n_nonfinite=int(n_nonfinite)), handle, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, self.progress_path)
        except OSError as exc:
            raise StoreIOError(f"{self.path}: cannot record progress: {exc}") from exc

    def write(self, start: int, block: np.ndarray) -> None:
        """Write ``block`` at row ``start``. Every output chunk it covers whole is written as raw bytes
        (uncompressed, so the stored chunk is exactly the rows), directly where aligned; a partly
        covered or edge chunk goes through h5py or zarr."""
        stop = start + block.shape[0]
        try:
            root = raw_chunk_root(self._array) if self.kind == "zarr" else None
            if self.kind == "zarr" and root is None:
                self._array[start:stop] = block
                return
            if root is not None:
                self._unsynced.update(range(start // self.chunk_rows, (stop - 1) // self.chunk_rows + 1))
            rows = self.chunk_rows
            for index in range(start // rows, (stop - 1) // rows + 1):
                lo, hi = index * rows, min((index + 1) * rows, self.shape[0])
                a, b = max(lo, start), min(hi, stop)
                data = np.ascontiguousarray(block[a - start : b - start], dtype=self.dtype)
                if (a, b) != (lo, hi):
                    self._array[a:b] = data
                elif root is not None:
                    self._write_zarr_chunk(root, index, data)
                else:
                    self._write_hdf5_chunk(lo, data)
        except OSError as exc:
            raise StoreIOError(f"{self.label}: cannot write rows {start}..{stop - 1}: {exc}") from exc

    def _write_hdf5_chunk(self, lo: int, data: np.ndarray) -> None:
        info = self._array.id.get_chunk_info_by_coord((lo, 0)) if self._chunk_file is not None else None
        if info is None or info.byte_offset is None or info.filter_mask or info.size != data.nbytes:
            self._array[lo : lo + data.shape[0]] = data  # not allocated in place, or an edge chunk (stored full size)
        else:
            self._chunk_file.write_at(info.byte_offset, data)

    def _write_zarr_chunk(self, root: str, index: int, data: np.ndarray) -> None:
        path = os.path.join(root, self._array.metadata.encode_chunk_key((index, 0)))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with ChunkFile(path, create=True, direct=self.direct_io) as chunk_file:
            chunk_file.write_at(0, data)
            if data.shape[0] < self.chunk_rows:  # an edge chunk is stored at full size, padded with the fill value
                pad = np.full((self.chunk_rows - data.shape[0], self.shape[1]), self._array.metadata.fill_value or 0,
                              self.dtype)
                chunk_file.write_at(data.nbytes, pad)

    def region_writer(self) -> "ZarrRegionWriter":
        """A picklable writer of whole-chunk row ranges of this (Zarr) sink, for worker processes."""
        if self.kind != "zarr":
            raise BadInputError(f"{self.path}: only a Zarr output can be written by several processes at once")
        return ZarrRegionWriter(self.partial, self.dataset, self.shape, self.chunk_rows, self.label)

    def _open_chunk_file(self) -> None:
        """HDF5: a descriptor of our own for writing chunk data in place. The file's metadata has been
        flushed by then, which also extends the file to its allocated end, so a run killed before HDF5
        closes it still leaves a file HDF5 can open and resume."""
        self._chunk_file = ChunkFile(self.partial, direct=self.direct_io)

    def _close(self) -> None:
        if self._chunk_file is not None:
            self._chunk_file.close()
            self._chunk_file = None
        if self._file is not None and self._file.id.valid:
            self._file.flush()
            self._file.close()

    def commit(self, overwrite: bool = False) -> None:
        """Mark complete, flush, and rename into place (replacing an old output only if ``overwrite``)."""
        try:
            self._array.attrs["complete"] = True
            self._sync()
            self._close()
            if self.kind == "hdf5":
                with open(self.partial, "rb+") as handle:
                    os.fsync(handle.fileno())
            else:
                for directory, _, files in os.walk(self.partial):  # metadata files and every directory
                    for name in files:
                        if name.startswith("zarr.json") or name.startswith(".z"):
                            with open(os.path.join(directory, name), "rb") as handle:
                                os.fsync(handle.fileno())
                    _fsync_dir(directory)
            final = os.path.abspath(self.path.rstrip("/"))
            if os.path.lexists(final):
                if not overwrite:
                    raise OutputExistsError(f"{self.path}: already exists (pass --overwrite to replace it)")
                if os.path.isdir(final) and not os.path.islink(final):
                    # A directory cannot be replaced atomically: move the old one aside first.
                    old = final + f".old-{os.getpid()}"
                    os.rename(final, old)
                    os.rename(self.partial, final)
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    os.replace(self.partial, final)
            else:
                os.rename(self.partial, final)
            _fsync_dir(os.path.dirname(final))
            _remove(self.progress_path)
        except OSError as exc:
            raise StoreIOError(f"{self.path}: cannot finish writing: {exc}") from exc

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
            raise StoreIOError(f"{self.label}: cannot write rows {start}..{stop - 1}: {exc}") from exc


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
    _remove(partial)
    _remove(partial + ".progress.json")  # a record of an earlier partial must never describe this one
    needed, free = n_rows * n_features * dtype.itemsize, shutil.disk_usage(parent).free
    if needed > free:
        raise StoreIOError(f"{path}: the output needs about {needed / 1e6:,.1f} MB but only {free / 1e6:,.1f} MB are free in {parent}")
    # Every attribute exists from the start (commit only changes values), so a resumed HDF5 output's
    # metadata is laid out as an uninterrupted run's and the two files are byte for byte the same.
    attrs = dict(attrs or {}, complete=False, n_nonfinite_rows=0)
    try:
        if kind == "hdf5":
            dataset = dataset or "embeddings"
            # Chunks allocated up front (never filled), each at an aligned offset: their data can then
            # be written in place through our own descriptor.
            handle = h5py.File(partial, "w", rdcc_nbytes=0, alignment_threshold=ALIGNMENT, alignment_interval=ALIGNMENT)
            layout = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            layout.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
            array = handle.create_dataset(dataset, shape=(n_rows, n_features), dtype=dtype, chunks=(chunk_rows, n_features),
                                          dcpl=layout, fill_time="never")
            array.attrs.update({key: _hdf5_attr(value) for key, value in attrs.items()})
            handle.flush()
            sink = Sink(path, dataset, kind, partial, (n_rows, n_features), dtype, chunk_rows, array, handle, direct_io=direct_io)
            try:
                sink._open_chunk_file()
            except OSError:
                handle.close()
                raise
            return sink
        if dataset:
            root = zarr.open_group(store=partial, mode="w", zarr_format=zarr_format)
            array = root.create_array(dataset, shape=(n_rows, n_features), chunks=(chunk_rows, n_features), dtype=dtype, compressors=None)
        else:
            array = zarr.create_array(
                store=partial, shape=(n_rows, n_features), chunks=(chunk_rows, n_features), dtype=dtype,
                compressors=None, zarr_format=zarr_format,
            )
        array.attrs.update(attrs)
        return Sink(path, dataset, kind, partial, (n_rows, n_features), dtype, chunk_rows, array, None, direct_io=direct_io)
    except OSError as exc:
        _remove(partial)
        raise StoreIOError(f"{path}: cannot create output: {exc}") from exc


def resume_sink(spec: str, job: dict, direct_io: bool = True) -> tuple[Sink | None, int, int]:
    """Reopen the partial output of an interrupted run of the same ``job``; ``(sink, rows_done, n_nonfinite)``.

    Returns ``(None, 0, 0)`` when there is nothing to resume, or when the partial output belongs to another
    job or cannot be opened (then it is removed, so the caller starts over).
    """
    path, dataset = split_spec(spec)
    partial = partial_path(path)
    progress = partial + ".progress.json"
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
    handle = None
    try:
        if kind == "hdf5":
            handle = h5py.File(partial, "r+", rdcc_nbytes=0)
            array = handle[dataset or "embeddings"]
        else:
            handle = None
            array = zarr.open_array(store=partial, path=dataset or "", mode="r+")
        shape = tuple(int(n) for n in array.shape)
        sink = Sink(path, dataset or ("embeddings" if kind == "hdf5" else None), kind, partial, shape,
                    np.dtype(array.dtype), int(array.chunks[0]), array, handle, direct_io=direct_io)
        if kind == "hdf5":
            sink._open_chunk_file()
    except (OSError, KeyError, ValueError, zarr.errors.BaseZarrError):
        if handle is not None:
            handle.close()
        _remove(partial)
        _remove(progress)
        return None, 0, 0
    return sink, counts[0], counts[1]


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

