"""Zarr (v2 and v3) through zarr-python 3: a source of rows, a sink, 1-D arrays, and the writer Dask
workers use. The only module that imports zarr.

A local store's chunk files are read and written by us (raw ones straight into the caller's buffer, those
of a codec chain ``codecs`` knows decoded here); sharded and remote stores go through zarr. A remote output
is written in place, ``complete = false`` until its last chunk is written: readers here take it for absent.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NoReturn

import numpy as np
import zarr
from zarr.buffer import default_buffer_prototype
from zarr.codecs import BytesCodec, Crc32cCodec
from zarr.storage import LocalStore

from .. import _durable as durable
from ..errors import BadInputError, CorruptStoreError, MissingChunkError, StoreIOError
from ..options import ReadOptions
from ..output_plan import COMPRESSOR_ATTR, OutputPlan, is_incomplete_output
from . import remote
from ._messages import first_line, io_error, name_not_found
from ._store import OWNER_ATTR, StoreSink, StoreSource
from .abc.store import SinkPlace
from .codecs import (
    Fetched,
    check_compressor,
    chunk_encoder,
    crc32c_of,
    fetch_buffer,
    numcodecs_codec,
    widen_in_place,
    zarr_decoder,
)
from .direct import ChunkFile

_ND_BUFFER = default_buffer_prototype().nd_buffer


def raw_chunk_root(array: Any) -> str | None:
    """The directory of a Zarr array's chunk files when each one holds its rows as raw native-endian
    C-order bytes (an uncompressed, unsharded local 2-D array with whole rows per chunk), else None."""
    if not isinstance(array.store, LocalStore) or array.ndim != 2 or array.chunks[1] != array.shape[1]:
        return None
    metadata = array.metadata
    if metadata.zarr_format == 3:
        codecs = metadata.codecs
        if len(codecs) != 1 or not isinstance(codecs[0], BytesCodec):
            return None
        endian = codecs[0].endian
        if endian is not None and endian.value != sys.byteorder:
            return None
    elif (
        metadata.compressor is not None
        or metadata.filters
        or metadata.order != "C"
        or not np.dtype(array.dtype).isnative
    ):
        return None
    return os.path.join(str(array.store.root), array.path)


def _read_exactly(handle: io.FileIO, array: np.ndarray, path: str) -> None:
    """Fill ``array`` from ``handle``; a file that ends first is damaged."""
    # numpy's stubs give ndarray __buffer__ on Python 3.12+ only
    buffer = memoryview(array).cast("B")  # type: ignore[arg-type]
    done = 0
    while done < len(buffer):
        count = handle.readinto(buffer[done:])
        if not count:
            raise CorruptStoreError(f"{path}: chunk file is truncated ({done} of {len(buffer)} bytes)")
        done += count


def _open_path(path: str, inner: str, read: ReadOptions) -> Any:
    """The node (array or group) at ``inner`` of the store at ``path``, as zarr opens it."""
    if remote.is_url(path):
        store = remote.zarr_store(path, read_only=True, read=read)
        return remote.retrying(path, "open", zarr.open, store=store, mode="r", path=inner, read=read)
    return zarr.open(store=path, mode="r", path=inner)


def _arrays(group: Any, ndim: int, prefix: str = "") -> list[str]:
    """Paths (``/a/b``) of the ``ndim``-D arrays in ``group``, sorted."""
    return sorted(
        f"{prefix}/{name}"
        for name, member in group.members(max_depth=None)
        if isinstance(member, zarr.Array) and member.ndim == ndim
    )


def _open_node(
    path: str, inner: str | None, ndim: int, read: ReadOptions, option: bool = True
) -> tuple[Any, str | None]:
    """The array ``inner`` of the store at ``path`` (or its only ``ndim``-D array), and its path in the store."""
    label, what = remote.redact(path), f"{ndim}-D array"
    try:
        node = _open_path(path, inner or "", read)
    except PermissionError as exc:
        raise StoreIOError(f"{label}: cannot read: {io_error(exc)}") from exc
    except FileNotFoundError:  # zarr's NodeNotFoundError too: nothing at that path
        raise _not_there(path, label, inner, ndim, option, read) from None
    except (KeyError, ValueError, TypeError) as exc:  # metadata that does not parse or validate
        where = f"{label}:/{inner}" if inner else label
        raise CorruptStoreError(
            f"{where}: its Zarr metadata cannot be read, the store is damaged ({exc.__class__.__name__}: "
            f"{first_line(exc)})"
        ) from exc
    if isinstance(node, zarr.Group):
        prefix = f"/{inner}" if inner else ""
        arrays = _arrays(node, ndim, prefix)
        if len(arrays) != 1:
            problem = f"/{inner} is a group, not an array" if inner else None
            raise name_not_found(label, prefix or None, what, arrays, option=option, problem=problem)
        inner = arrays[0].strip("/")
        node = node[arrays[0][len(prefix) + 1 :]]
    _check_grid(node, f"{label}:/{inner}" if inner else label)
    return node, inner


def _not_there(path: str, label: str, inner: str | None, ndim: int, option: bool, read: ReadOptions) -> BadInputError:
    """The error for a name (or a whole store) zarr finds nothing at: what the store holds instead."""
    try:
        root = _open_path(path, "", read) if inner else None
    except (OSError, KeyError, ValueError, TypeError):
        root = None
    if root is None:
        if inner:
            return BadInputError(f"{label}: has no Zarr array /{inner} (and no Zarr metadata at its top)")
        return BadInputError(
            f"{label}: not a Zarr store (it holds no zarr.json, .zarray or .zgroup), Lance dataset or directory "
            "of Parquet files"
        )
    if isinstance(root, zarr.Array):
        return BadInputError(f"{label}: is itself a Zarr array, with no array /{inner} inside it (name it as {label})")
    return name_not_found(label, f"/{inner}", f"{ndim}-D array", _arrays(root, ndim), option=option)


def _check_grid(node: Any, label: str) -> None:
    """Refuse an array whose metadata declares a chunk (or shard) length below 1: reading it would divide by 0."""
    grids = [("chunk", tuple(node.chunks))]
    if getattr(node, "shards", None):
        grids.append(("shard", tuple(node.shards)))
    for what, grid in grids:
        if len(grid) != len(node.shape) or any(int(n) < 1 for n in grid):
            raise CorruptStoreError(
                f"{label}: its metadata declares a {what} shape of {grid} for an array of shape {tuple(node.shape)}; "
                f"every {what} length must be at least 1: the metadata is damaged"
            )


class ZarrSource(StoreSource):
    """An array of a Zarr store (v2 or v3; local, or through zarr's ``FsspecStore``)."""

    kind = "zarr"
    #: a float16 store can be read into a float32 buffer, widened as it is decoded
    widens_float16 = True

    def __init__(self, path: str, dataset: str | None, read: ReadOptions | None = None) -> None:
        read = read if read is not None else ReadOptions()
        node, dataset = _open_node(path, dataset, 2, read)
        self._node = node
        self.remote = remote.is_url(path)
        self._listing: dict[str, Any] | None = None  # {key in the array: object details} of a remote store
        self._listable = self.remote and remote.protocol(path) not in ("http", "https")
        chunk_rows = int(node.chunks[0]) if node.ndim >= 1 else None
        super().__init__(path, dataset, node.shape, node.dtype, chunk_rows, read)
        #: where uncompressed chunk files are read straight from (None: through zarr)
        self.raw_root = raw_chunk_root(node)
        # how compressed chunk files are decoded here (None: raw, or through zarr)
        if self.raw_root is None and isinstance(node.store, LocalStore) and not getattr(node, "shards", None):
            self.decoder = zarr_decoder(node)
        self._chunk_root = os.path.join(str(node.store.root), node.path) if self.decoder is not None else None
        # The grid chunk keys are made on: shards where the array is sharded, else its chunks.
        self._grid = tuple(int(n) for n in (getattr(node, "shards", None) or node.chunks))

    @property
    def location(self) -> tuple[str, str]:
        # dir.zarr:/a and dir.zarr/a are the same array directory
        if self.remote:
            return remote.normalize(remote.join(self.path, self.dataset or "")), ""
        return os.path.realpath(os.path.join(self.path, self.dataset or "")), ""

    def attrs(self) -> dict[str, Any]:
        return dict(self._node.attrs)

    def _array_url(self) -> str:
        return remote.join(self.path, self.dataset or "")

    def _objects(self) -> dict[str, Any]:
        """``{key under the array: details}`` of a remote store's objects (one listing, then kept)."""
        if self._listing is None:
            base = remote.normalize(self._array_url())
            found = remote.find(self._array_url(), detail=True, read=self.read_options)
            self._listing = {remote.normalize(url)[len(base) + 1 :]: item for url, item in found.items()}
        return self._listing

    def fingerprint_extra(self) -> dict[str, Any]:
        """A remote store's total size and a digest of every object's key, size and ETag (appends change it)."""
        if not self.remote:
            return {}
        url, read = self._array_url(), self.read_options
        if not self._listable:  # http(s): no listing; the metadata object's version
            return remote.version(
                remote.join(url, "zarr.json" if self._node.metadata.zarr_format == 3 else ".zarray"), read=read
            )
        return remote.prefix_version(
            url, {remote.join(url, key): item for key, item in self._objects().items()}, read=read
        )

    def fetch(self, start: int, stop: int) -> Fetched | None:
        """The stored bytes of the chunks rows ``[start, stop)`` touch, for `read_into` to decode (None where
        chunks are not decoded here): the I/O half of a read, which a caller may run ahead in another thread."""
        if self.decoder is None or stop <= start:
            return None
        assert self._chunk_root is not None and self.chunk_rows is not None
        self._check_range(start, stop)
        # (chunk index, its open file, or None where missing and read as the fill value)
        handles: list[tuple[int, Any]] = []
        index = start // self.chunk_rows
        try:
            for index in range(start // self.chunk_rows, (stop - 1) // self.chunk_rows + 1):
                try:
                    handle = self._open_chunk(os.path.join(self._chunk_root, self._chunk_key(index)), index)
                except FileNotFoundError:
                    if not self.fill_missing_chunks:
                        self._raise_missing(index)
                    handle = None
                handles.append((index, handle))
            sizes = [0 if handle is None else os.fstat(handle.fileno()).st_size for _, handle in handles]
            buffer = fetch_buffer(sum(sizes), (stop - start) * self.n_features * self.dtype.itemsize)
            chunks: list[tuple[int, Any, int]] = []
            offset = 0
            for (index, handle), size in zip(handles, sizes, strict=True):
                view = None
                if handle is not None:
                    view = buffer[offset : offset + size]
                    _read_exactly(handle, view, handle.name)
                chunks.append((index, view, 0))
                offset += size
        except OSError as exc:
            lo, hi = self._chunk_span(index)
            raise StoreIOError(f"{self.label}: cannot read rows {lo}..{hi - 1}: {io_error(exc)}") from exc
        finally:
            for _, handle in handles:
                if handle is not None:
                    handle.close()
        return Fetched(chunks, buffer)

    def _read_into(self, start: int, stop: int, out: np.ndarray, fetched: Fetched | None = None) -> np.ndarray:
        view = out[: stop - start]
        if self.decoder is not None and stop > start:
            return self._decode_into(view, start, stop, fetched, self._node.metadata.fill_value)
        if view.dtype != self.dtype:  # float16 rows into a float32 buffer
            if self.raw_root is None:
                view[...] = self.read(start, stop)
                return view
            region = view.reshape(-1).view(np.uint8)
            self.read_into(start, stop, region[region.size // 2 :].view(self.dtype).reshape(view.shape))
            widen_in_place(region, view.size)
            return view
        if self.raw_root is None:
            return self._read_by_zarr(start, stop, view)
        # raw chunks are the rows' bytes: one copy from the page cache (zarr's pipeline copies several times)
        self._check_range(start, stop)
        assert self.chunk_rows is not None
        rows, row_bytes = self.chunk_rows, self.n_features * self.dtype.itemsize
        for index in range(start // rows, (stop - 1) // rows + 1):
            lo, hi = max(start, index * rows), min(stop, (index + 1) * rows)
            target = view[lo - start : hi - start]
            path = os.path.join(self.raw_root, self._chunk_key(index))
            try:
                with self._open_chunk(path, index) as handle:
                    size = os.fstat(handle.fileno()).st_size
                    if size != rows * row_bytes:
                        first, end = self._chunk_span(index)
                        raise CorruptStoreError(
                            f"{self.label}: chunk {self._chunk_key(index)} (rows {first}..{end - 1}) has {size} bytes, "
                            f"not {rows * row_bytes}: it is truncated or damaged"
                        )
                    handle.seek((lo - index * rows) * row_bytes)
                    _read_exactly(handle, target, path)
            except FileNotFoundError:
                if not self.fill_missing_chunks:
                    self._raise_missing(index)
                target[...] = self._node.metadata.fill_value or 0
            except OSError as exc:
                raise StoreIOError(f"{self.label}: cannot read rows {lo}..{hi - 1}: {io_error(exc)}") from exc
        return view

    def _read_by_zarr(self, start: int, stop: int, view: np.ndarray) -> np.ndarray:
        """Rows ``[start, stop)`` into ``view``, decoded by zarr straight into it."""
        if not self.fill_missing_chunks and stop > start:
            self._refuse_missing(start, stop)
        try:
            with np.errstate(all="ignore"):
                self._node.get_basic_selection(np.s_[start:stop], out=_ND_BUFFER.from_numpy_array(view))
        except Exception as exc:
            # a failed system call is an I/O error (but a chunk that is a directory is damage, and an OSError
            # without an errno is a codec's, gzip's); a codec failing on the bytes it was given: damage
            if isinstance(exc, OSError) and exc.errno is not None and not isinstance(exc, IsADirectoryError):
                raise StoreIOError(f"{self.label}: cannot read rows {start}..{stop - 1}: {io_error(exc)}") from exc
            raise CorruptStoreError(
                f"{self.label}: rows {start}..{stop - 1} cannot be decoded, a chunk is damaged "
                f"({exc.__class__.__name__}: {first_line(exc)})"
            ) from exc
        return view

    def _open_chunk(self, path: str, index: int) -> io.FileIO:
        """The chunk file of chunk ``index`` opened for reading; one that is not a regular file (a directory,
        a FIFO: opened without blocking) is damaged data, not an I/O error."""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                lo, hi = self._chunk_span(index)
                what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
                raise CorruptStoreError(
                    f"{self.label}: chunk {self._chunk_key(index)} (rows {lo}..{hi - 1}) is {what}, not a chunk "
                    "file: the store is damaged"
                )
            return os.fdopen(fd, "rb", buffering=0)
        except BaseException:
            os.close(fd)
            raise

    def _check_range(self, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= self.n_rows:
            raise StoreIOError(f"{self.label}: rows {start}..{stop - 1} are outside its {self.n_rows} rows")

    def _describe(self, index: int) -> str:
        lo, hi = self._chunk_span(index)
        return f"chunk {self._chunk_key(index)} (rows {lo}..{hi - 1}) is damaged and cannot be decoded"

    def _chunk_key(self, index: int, column: int = 0) -> str:
        return str(self._node.metadata.encode_chunk_key((index, column)))

    def _raise_missing(self, index: int, column: int = 0) -> NoReturn:
        rows = self._grid[0]
        lo, hi = index * rows, min((index + 1) * rows, self.n_rows)
        fill = self._node.metadata.fill_value
        raise MissingChunkError(
            f"{self.label}: chunk {self._chunk_key(index, column)} (rows {lo}..{hi - 1}) is missing: the store is "
            f"incomplete or damaged (if it was written leaving out chunks that hold only the fill value {fill}, pass "
            "fill_missing_chunks=True to read them as that value)",
            rows=(lo, hi),
            param="fill_missing_chunks",
        )

    def _refuse_missing(self, start: int, stop: int) -> None:
        """Refuse rows whose chunk (or shard) is not in the store (zarr would read it as the fill value)."""
        rows, columns = self._grid
        for index in range(start // rows, (stop - 1) // rows + 1):
            for column in range(-(-self.n_features // columns)):
                if not self._chunk_exists(self._chunk_key(index, column)):
                    self._raise_missing(index, column)

    def _chunk_exists(self, key: str) -> bool:
        store = self._node.store
        if isinstance(store, LocalStore):
            return os.path.exists(os.path.join(str(store.root), self._node.path, key))
        if self._listable:
            return key in self._objects()
        from zarr.core.sync import sync

        return bool(sync(store.exists(f"{self._node.path}/{key}".lstrip("/"))))


def read_vector(path: str, inner: str | None, read: ReadOptions) -> tuple[np.ndarray, str]:
    """The 1-D array ``inner`` (or the store's only one), whole, and its label."""
    node, inner = _open_node(path, inner, 1, read, option=False)
    label = remote.redact(path)
    values = remote.retrying(path, "read", node.__getitem__, Ellipsis, read=read) if remote.is_url(path) else node[...]
    return values, (f"{label}:/{inner}" if inner else label)


def _compressors(name: str, dtype: Any, zarr_format: int, checksums: bool = False) -> Any:
    """What zarr is told ``--compressor name`` wrote (encoded here), then the crc32c with ``checksums`` (Zarr 3)."""
    if zarr_format == 2:
        return None if name == "none" else numcodecs_codec(name, dtype)
    crc = [Crc32cCodec()] if checksums else []
    if name == "none":
        return crc or None
    from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

    makers: dict[str, Callable[[], Any]] = {
        "zstd": lambda: ZstdCodec(level=3),
        "gzip": lambda: GzipCodec(level=4),
        "blosc": lambda: BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", typesize=np.dtype(dtype).itemsize),
    }
    return [makers[name](), *crc]


#: Files of a Zarr store besides chunks: its metadata (v3, v2, consolidated).
_METADATA_FILES = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"}
#: A chunk key under its array (v3 ``c/0/0``, v2 ``0.0`` or ``0/0``).
_CHUNK_KEY = re.compile(r"^(c/)?\d+([./]\d+)*$")


def foreign_output(path: str, read: ReadOptions) -> str | None:
    """None when the Zarr store ``path`` is an output of streamwhiten (every array carries `OWNER_ATTR`, and
    nothing but their metadata and chunks is there; remote: or chunks only, what is left of one), else what
    it is, for the message that refuses to replace it."""
    try:
        url = remote.is_url(path)
        store = remote.zarr_store(path, read_only=True, read=read) if url else LocalStore(path, read_only=True)
        node = zarr.open(store=store, mode="r")
    except (BadInputError, StoreIOError):
        raise
    except Exception:  # noqa: BLE001 - whatever zarr says, it is no store of ours
        return None if remote.is_url(path) and _only_chunks(path, read) else "not a Zarr store"
    members = [("", node)] if isinstance(node, zarr.Array) else node.members(max_depth=None)
    arrays = {name: member for name, member in members if isinstance(member, zarr.Array)}
    if not arrays:
        return "a Zarr group holding no array"
    for name, array in arrays.items():
        if OWNER_ATTR not in array.attrs:
            return f"a Zarr store holding an array streamwhiten did not write: /{name}"
    if url:
        return None
    for root, _, files in os.walk(path):
        for name in files:
            relative = os.path.relpath(os.path.join(root, name), path).replace(os.sep, "/")
            if name in _METADATA_FILES:
                continue
            owners = [a for a in arrays if a == "" or relative.startswith(a + "/")]
            key = relative[len(max(owners, key=len)) :].lstrip("/") if owners else relative
            if not owners or not _CHUNK_KEY.match(key):
                return f"a Zarr store holding a file streamwhiten did not write: {relative}"
    return None


def _only_chunks(url: str, read: ReadOptions) -> bool:
    """Whether the prefix ``url`` holds only Zarr chunks: what is left of a remote output whose metadata is gone."""
    base = remote.normalize(url).rstrip("/")
    keys = [remote.normalize(found)[len(base) + 1 :] for found in remote.find(url, read=read)]
    return bool(keys) and all(_CHUNK_TAIL.search(key) for key in keys)


#: A chunk key at the end of an object's key under a store (``.../c/0/0``, ``.../0.0``).
_CHUNK_TAIL = re.compile(r"(^|/)(c/)?\d+([./]\d+)*$")


def _new_array(
    store: Any, dataset: str | None, plan: OutputPlan, compressor: str, overwrite: bool = False, **options: Any
) -> Any:
    """A new array in ``store`` (named ``dataset`` in a new group, if named) laid out as ``plan`` says, its
    chunks declared as ``compressor`` wrote them; ``options`` go to ``create_array``."""
    shape, dtype = plan.shape, np.dtype(plan.dtype)
    zarr_format: Literal[2, 3] = 2 if int(plan.zarr_format) == 2 else 3  # checked to be 2 or 3 by the plan's options
    compressors = _compressors(compressor, dtype, zarr_format, plan.checksums)
    layout = {"shape": shape, "chunks": (int(plan.chunk_rows or 0), shape[1]), "dtype": dtype, **options}
    if dataset:
        root = zarr.open_group(store=store, mode="w", zarr_format=zarr_format)
        return root.create_array(dataset, compressors=compressors, **layout)
    return zarr.create_array(
        store=store, compressors=compressors, zarr_format=zarr_format, overwrite=overwrite, **layout
    )


class ZarrSink(StoreSink):
    """A Zarr output: whole chunks written as chunk files by us, raw or compressed here; zarr writes the rest."""

    kind = "zarr"
    compressible = True
    parallel_writes = True
    format_versions = (2, 3)

    def __init__(self, place: SinkPlace, array: Any, direct_io: bool = True, compressor: str = "none") -> None:
        super().__init__(place, array.shape, array.dtype, int(array.chunks[0]), direct_io)
        #: the array being written (under its temporary name)
        self.array = array
        #: ``--compressor``: whole chunks are encoded in the writer thread (None: written raw)
        self.compressor = check_compressor(compressor)
        self._encode = chunk_encoder(compressor, array.dtype, "zarr")
        #: whether each chunk ends in its crc32c (Zarr 3's codec, last in the chain), appended here
        self.checksums = array.metadata.zarr_format == 3 and isinstance(array.metadata.codecs[-1], Crc32cCodec)
        #: the chunk files' directory where we write them (raw or encoded here), else None
        self._root = raw_chunk_root(array)
        if (self._encode is not None or self.checksums) and isinstance(array.store, LocalStore):
            self._root = os.path.join(str(array.store.root), array.path)
        self._unsynced: set[int] = set()  # chunk files written since they were last fsynced

    @classmethod
    def create(cls, place: SinkPlace, plan: OutputPlan) -> ZarrSink:
        array = _new_array(place.partial, place.dataset, plan, check_compressor(plan.compressor))
        array.attrs.update(plan.to_attrs())
        return cls(place, array, plan.direct_io, plan.compressor)

    @classmethod
    def resume(cls, place: SinkPlace, plan: OutputPlan, rows_done: int) -> ZarrSink:
        array = zarr.open_array(store=place.partial, path=place.dataset or "", mode="r+")
        return cls(place, array, plan.direct_io, str(array.attrs.get(COMPRESSOR_ATTR, "none")))

    def _write(self, start: int, block: np.ndarray, columns: Any = None) -> None:
        root = self._root
        if root is None:
            self.array[start : start + block.shape[0]] = block
            return
        for index, lo, hi, a, b, data in self.covered(start, block):
            if (a, b) != (lo, hi):
                self.array[a:b] = data
                continue
            self._unsynced.add(index)
            path = os.path.join(root, self.array.metadata.encode_chunk_key((index, 0)))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if data.shape[0] < self.chunk_rows:  # an edge chunk is stored at full size, padded with the fill value
                fill = self.array.metadata.fill_value or 0
                data = np.concatenate(
                    [data, np.full((self.chunk_rows - data.shape[0], self.shape[1]), fill, self.dtype)]
                )
            stored = data if self._encode is None else np.frombuffer(self._encode(data), np.uint8)
            with ChunkFile(path, create=True, direct=self.direct_io and self._encode is None) as chunk_file:
                chunk_file.write_at(0, stored)
                if self.checksums:  # the crc32c of the whole stored chunk after it
                    chunk_file.write_at(stored.nbytes, crc32c_of(stored))

    def _sync(self) -> None:
        """fsync the chunk files written since the last sync, and their directories."""
        root = self._root
        if root is None or not self._unsynced:
            return
        directories = set()
        top = os.path.abspath(self.partial)
        for index in sorted(self._unsynced):
            path = os.path.join(root, self.array.metadata.encode_chunk_key((index, 0)))
            if os.path.exists(path):
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
                directory = os.path.dirname(os.path.abspath(path))
                while directory.startswith(top):  # new entries all the way up (c/, c/3/, ...)
                    directories.add(directory)
                    directory = os.path.dirname(directory)
        for directory in sorted(directories, reverse=True):
            durable.fsync_dir(directory)
        self._unsynced.clear()

    def _finish(self, attrs: dict[str, Any]) -> None:
        self.array.attrs.update(attrs)
        # every file and directory: chunks written through zarr or by other processes were not tracked
        for directory, _, files in os.walk(self.partial, topdown=False):
            for name in files:
                with open(os.path.join(directory, name), "rb") as handle:
                    os.fsync(handle.fileno())
            durable.fsync_dir(directory)

    def region_writer(self) -> ZarrRegionWriter:
        """A picklable writer of whole-chunk row ranges of this sink, for worker processes."""
        read = self.read_options if remote.is_url(self.partial) else None
        return ZarrRegionWriter(self.partial, self.dataset, self.shape, self.chunk_rows, self.label, read)


@dataclass(frozen=True)
class ZarrRegionWriter:
    """Writes row ranges of whole output chunks into a Zarr sink still under its temporary name, from any
    process: no chunk file is written by two tasks, so concurrent writers need no lock."""

    partial: str
    dataset: str | None
    shape: tuple[int, ...]
    chunk_rows: int
    label: str
    #: how a remote output is reached (its storage options travel in memory and in the task graph only)
    read: ReadOptions | None = field(default=None, repr=False)

    def __repr__(self) -> str:  # never show the storage options
        return f"ZarrRegionWriter({self.label!r})"

    def __call__(self, start: int, block: np.ndarray) -> None:
        stop = start + block.shape[0]
        if start % self.chunk_rows or (stop % self.chunk_rows and stop != self.shape[0]) or stop > self.shape[0]:
            raise BadInputError(
                f"{self.label}: rows {start}..{stop - 1} are not aligned to output chunks of {self.chunk_rows} rows"
            )
        if remote.is_url(self.partial):
            read = self.read if self.read is not None else ReadOptions()
            array = _open_remote_array(self.partial, self.dataset, read)
            what = f"write rows {start}..{stop - 1}"
            remote.retrying(self.partial, what, array.__setitem__, slice(start, stop), block, read=read)
            return
        try:
            array = zarr.open_array(store=self.partial, path=self.dataset or "", mode="r+")
            array[start:stop] = block
        except (OSError, zarr.errors.BaseZarrError) as exc:
            raise StoreIOError(f"{self.label}: cannot write rows {start}..{stop - 1}: {io_error(exc)}") from exc


def _open_remote_array(url: str, dataset: str | None, read: ReadOptions) -> Any:
    store = remote.zarr_store(url, read_only=False, read=read)
    return remote.retrying(
        url, "open the output", zarr.open_array, store=store, path=dataset or "", mode="r+", read=read
    )


class RemoteZarrSink(ZarrSink):
    """A Zarr output on object storage, written in place (a prefix cannot be renamed): the metadata with
    ``complete = false``, the chunks (each one PUT, retried), then ``complete = true``. A killed run leaves
    its progress record as an object beside the output, so any machine resumes it."""

    compressible = False
    in_place = True

    def __init__(self, place: SinkPlace, array: Any) -> None:
        super().__init__(replace(place, partial=place.path), array, direct_io=False)  # written in place

    @classmethod
    def create(cls, place: SinkPlace, plan: OutputPlan) -> RemoteZarrSink:
        # the compressor is never other than "none": refused for object storage (Output.create)
        path, read, attrs = place.path, place.read, dict(plan.to_attrs())
        remote.remove(path, recursive=True, read=read)  # an earlier run's leftovers (never complete), or the old output
        store = remote.zarr_store(path, read_only=False, read=read)
        array = remote.retrying(
            path, "create the output", _new_array, store, place.dataset, plan, "none", True, attributes=attrs, read=read
        )
        return cls(place, array)

    @classmethod
    def resume(cls, place: SinkPlace, plan: OutputPlan, rows_done: int) -> RemoteZarrSink:
        return cls(place, _open_remote_array(place.path, place.dataset, place.read))

    @classmethod
    def incomplete(cls, path: str, read: ReadOptions) -> bool:
        """Whether the remote Zarr store at ``path`` is an output of ours that is not complete."""
        for name in ("zarr.json", ".zattrs"):
            try:
                raw = remote.cat(remote.join(path, name), read=read)
            except BadInputError:
                continue
            try:
                attrs = json.loads(raw)
            except ValueError:
                return False
            attrs = attrs.get("attributes", attrs) if name == "zarr.json" else attrs
            return isinstance(attrs, dict) and is_incomplete_output(attrs)
        return False

    def _write(self, start: int, block: np.ndarray, columns: Any = None) -> None:
        stop, data = start + block.shape[0], np.ascontiguousarray(block, dtype=self.dtype)
        what = f"write rows {start}..{stop - 1}"
        remote.retrying(self.path, what, self.array.__setitem__, slice(start, stop), data, read=self.read_options)

    def _sync(self) -> None:
        pass  # an object is durable once its PUT is acknowledged

    def _finish(self, attrs: dict[str, Any]) -> None:
        remote.retrying(self.path, "write its metadata", self.array.attrs.update, attrs, read=self.read_options)

    def commit(self, overwrite: bool = False, attrs: Mapping[str, Any] | None = None) -> None:
        """Set ``attrs`` and, in the same write of the metadata, ``complete = true``; then drop the record."""
        self._finish(dict(attrs or {}, complete=True))
        remote.remove(self.progress_path, read=self.read_options)

    def abort(self) -> None:
        with suppress(Exception):  # the network is failing: what is left says complete = false, so it is absent
            remote.remove(self.path, recursive=True, read=self.read_options)
            remote.remove(self.progress_path, read=self.read_options)
