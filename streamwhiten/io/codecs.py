"""Decoders: a compressed chunk's stored bytes turned into its rows here, not by zarr or HDF5.

zarr decodes on its own event loop and h5py under its global lock, so worker threads would wait for each
other. A `Decoder`, read once from a Zarr codec chain (`zarr_decoder`) or an HDF5 filter pipeline
(`hdf5_decoder`), decodes a chunk straight into a caller's buffer in the calling thread, with codecs that
release the GIL. Every step checks sizes, checksums and the decoded length (a `DecodeError`); a chain
with any other codec has no decoder (None) and is read through its library. `chunk_encoder` compresses outputs.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .. import _buffers
from ._messages import first_line

#: ``--compressor`` names, and what each writes (numcodecs settings; Zarr 3's defaults for zstd).
COMPRESSORS = ("none", "zstd", "blosc", "gzip")

# HDF5 filter ids (H5Zpublic.h and the registered plugin list).
H5Z_DEFLATE, H5Z_SHUFFLE, H5Z_FLETCHER32, H5Z_LZF, H5Z_BLOSC, H5Z_ZSTD = 1, 2, 3, 32000, 32001, 32015

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class DecodeError(ValueError):
    """A chunk's stored bytes do not decode to the chunk: its message says why, without the store."""


def _target(out: np.ndarray | None, nbytes: int) -> np.ndarray:
    """``out``, or a new buffer of ``nbytes`` bytes where there is none."""
    return out if out is not None else np.empty(nbytes, np.uint8)


def _u8(buffer: Any) -> np.ndarray:
    if isinstance(buffer, np.ndarray):
        return buffer.reshape(-1).view(np.uint8)
    return np.frombuffer(buffer, dtype=np.uint8)


def _zstd_content_size(data: np.ndarray) -> int | None:
    """The decoded size a zstd frame header declares (None where the writer left it out)."""
    if data.size < 6 or data[:4].tobytes() != _ZSTD_MAGIC:
        raise DecodeError("not a zstd frame (bad magic number)")
    descriptor = int(data[4])
    single_segment = (descriptor >> 5) & 1
    position = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    size = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
    if size == 0:
        return None
    if data.size < position + size:
        raise DecodeError("zstd frame header is truncated")
    value = int.from_bytes(data[position : position + size].tobytes(), "little")
    return value + 256 if size == 2 else value


class _Step:
    """One codec of a chain, decoding bytes to bytes; ``into`` says whether it can write the caller's
    buffer itself, ``bit`` is its place in an HDF5 pipeline (a chunk's filter mask may skip it)."""

    name = "?"
    into = False

    def __init__(self, bit: int | None = None):
        self.bit = bit

    def __call__(self, data: np.ndarray, out: np.ndarray | None, nbytes: int) -> np.ndarray:
        raise NotImplementedError

    def _into(self, codec: Any, data: np.ndarray, out: np.ndarray | None, nbytes: int, size: int) -> np.ndarray:
        """``data`` decoded by ``codec`` into ``out`` once its header's ``size`` is the chunk's ``nbytes``."""
        if size != nbytes:
            raise DecodeError(f"{self.name} frame holds {size} bytes, the chunk has {nbytes}")
        return _u8(codec.decode(data, out=_target(out, nbytes)))


class _Zstd(_Step):
    name, into = "zstd", True

    def __call__(self, data: np.ndarray, out: np.ndarray | None, nbytes: int) -> np.ndarray:
        from numcodecs import Zstd

        size = _zstd_content_size(data)
        if size is None:  # no size in the header: let zstd allocate, then check what came out
            return _u8(Zstd().decode(data))
        return self._into(Zstd(), data, out, nbytes, size)


class _Blosc(_Step):
    name, into = "blosc", True

    def __call__(self, data: np.ndarray, out: np.ndarray | None, nbytes: int) -> np.ndarray:
        from numcodecs import Blosc

        if data.size < 16:
            raise DecodeError(f"blosc frame of {data.size} bytes is shorter than its header")
        size, _, stored = (int(v) for v in data[4:16].view("<u4"))
        if stored != data.size:  # blosc itself would read past the end of a truncated frame
            raise DecodeError(f"blosc frame says {stored} bytes, {data.size} are stored")
        return self._into(Blosc(), data, out, nbytes, size)


class _LZ4(_Step):
    name, into = "lz4", True

    def __call__(self, data: np.ndarray, out: np.ndarray | None, nbytes: int) -> np.ndarray:
        from numcodecs import LZ4

        if data.size < 4 or int(data[:4].view("<u4")[0]) != nbytes:
            raise DecodeError(f"lz4 frame does not hold the chunk's {nbytes} bytes")
        return self._into(LZ4(), data, out, nbytes, nbytes)


#: Compressed bytes inflated per call: each call's output is a new bytes object, small enough to come
#: from memory the allocator reuses (a chunk-sized one would be fresh pages, slow to touch, every time).
_INFLATE_PIECE = 1 << 20


class _Zlib(_Step):
    """deflate in a zlib (HDF5 ``gzip``, numcodecs ``zlib``) or gzip (Zarr ``gzip``) wrapper, inflated
    piece by piece into the buffer it is given."""

    into = True

    def __init__(self, wbits: int, name: str, bit: int | None = None) -> None:
        super().__init__(bit)
        self.wbits, self.name = wbits, name

    def __call__(self, data: np.ndarray, out: np.ndarray | None, nbytes: int) -> np.ndarray:
        target = _target(out, nbytes)
        inflater = zlib.decompressobj(self.wbits)
        source = memoryview(data)  # type: ignore[arg-type]  # numpy's stubs give ndarray __buffer__ on Python 3.12+ only
        done = 0
        try:
            for start in range(0, len(source), _INFLATE_PIECE):
                piece = inflater.decompress(source[start : start + _INFLATE_PIECE])
                if done + len(piece) > nbytes or inflater.unused_data:
                    raise DecodeError(f"{self.name} stream holds more than the chunk's {nbytes} bytes")
                target[done : done + len(piece)] = np.frombuffer(piece, np.uint8)
                done += len(piece)
        except zlib.error as exc:
            raise DecodeError(f"{self.name}: {exc}") from None
        if not inflater.eof or done != nbytes:
            raise DecodeError(f"{self.name} stream is truncated ({done} of the chunk's {nbytes} bytes)")
        return target


class _Lzf(_Step):
    """h5py's LZF filter: a raw LZF stream, inflated straight into the buffer it is given by a Numba
    kernel that holds no lock (h5py would decode it under its global lock)."""

    name = "lzf"
    into = True

    def __call__(self, data: np.ndarray, out: np.ndarray | None, nbytes: int) -> np.ndarray:
        from ..core.kernels.lzf import lzf_decompress  # numba is loaded only for a store that needs it

        target = _target(out, nbytes)
        done = lzf_decompress(_u8(data), _u8(target)[:nbytes])
        if done != nbytes:
            why = "is damaged" if done < 0 else f"holds {done} bytes"
            raise DecodeError(f"lzf stream {why}, not the chunk's {nbytes} bytes")
        return target


def unshuffle(data: np.ndarray, out: np.ndarray, itemsize: int) -> None:
    """Undo a byte shuffle: ``data`` holds byte ``k`` of every element in its ``k``-th plane; ``out`` gets
    the elements. numpy's shifts and ors in cache-sized pieces release the GIL, numcodecs' loop does not."""
    count = data.size // itemsize
    planes = data[: count * itemsize].reshape(itemsize, count)
    wide = out.reshape(-1)[: count * itemsize].view(f"<u{itemsize}")
    step = 1 << 17
    for start in range(0, count, step):
        stop = min(count, start + step)
        element = wide[start:stop]
        np.copyto(element, planes[itemsize - 1, start:stop], casting="unsafe")
        for plane in range(itemsize - 2, -1, -1):
            np.left_shift(element, 8, out=element)
            np.bitwise_or(element, planes[plane, start:stop], out=element, casting="unsafe")


class _Shuffle(_Step):
    name, into = "shuffle", True

    def __init__(self, itemsize: int, bit: int | None = None) -> None:
        super().__init__(bit)
        self.itemsize = itemsize

    def __call__(self, data: np.ndarray, out: np.ndarray | None, nbytes: int) -> np.ndarray:
        if data.size != nbytes:
            raise DecodeError(f"{data.size} bytes to unshuffle, the chunk has {nbytes}")
        if self.itemsize <= 1:
            return data
        if nbytes % self.itemsize or self.itemsize not in (2, 4, 8):
            from numcodecs import Shuffle

            return _u8(Shuffle(self.itemsize).decode(data, out=_target(out, nbytes)))
        target = _target(out, nbytes)
        unshuffle(data, target, self.itemsize)
        return target


class _Crc32c(_Step):
    """Zarr 3's ``crc32c``: a little-endian CRC-32C of the bytes before it, appended."""

    name = "crc32c"

    def __call__(self, data: np.ndarray, out: np.ndarray | None, nbytes: int) -> np.ndarray:
        import google_crc32c

        if data.size < 4:
            raise DecodeError("chunk is shorter than its crc32c checksum")
        stored = int(data[-4:].view("<u4")[0])
        if google_crc32c.value(data[:-4]) != stored:
            raise DecodeError("crc32c checksum mismatch")
        return data[:-4]


class _Fletcher32(_Step):
    """HDF5's fletcher32 filter (numcodecs implements the same checksum)."""

    name = "fletcher32"

    def __call__(self, data: np.ndarray, out: np.ndarray | None, nbytes: int) -> np.ndarray:
        from numcodecs.fletcher32 import Fletcher32

        if data.size < 4:
            raise DecodeError("chunk is shorter than its fletcher32 checksum")
        try:
            return _u8(Fletcher32().decode(data))
        except Exception:
            raise DecodeError("fletcher32 checksum mismatch") from None


def fetch_buffer(nbytes: int, block_bytes: int) -> np.ndarray:
    """A reused byte buffer for ``nbytes`` of stored chunk bytes, at least ``block_bytes`` so that every fetch
    of a run asks for the same size (fresh memory is slow to touch); handed back by `Fetched.release`."""
    size = max(int(nbytes), int(block_bytes))
    return _buffers.take((size,), np.uint8)


class Fetched(list[tuple[int, Any, int]]):
    """The stored bytes of a row range's chunks, ``[(chunk index, bytes or None where missing, HDF5 filter
    mask)]``, in one buffer from `fetch_buffer` that `release` hands back once decoded."""

    def __init__(self, chunks: Iterable[tuple[int, Any, int]], buffer: np.ndarray | None = None) -> None:
        super().__init__(chunks)
        self._buffer = buffer

    def release(self) -> None:
        if self._buffer is not None:
            _buffers.give_back(self._buffer)
        self._buffer = None


class Decoder:
    """How one chunk's stored bytes become its ``nbytes`` bytes of rows: ``steps`` run in order (the
    reverse of the writer's), then a byte swap where the store is not native-endian."""

    def __init__(self, steps: list[_Step], nbytes: int, dtype: Any) -> None:
        self.steps = steps
        self.nbytes = int(nbytes)
        #: the stored element type (its byte order included)
        self.dtype = np.dtype(dtype)

    @property
    def description(self) -> str:
        return " -> ".join(step.name for step in self.steps) or "raw"

    def decode_into(self, stored: Any, out: np.ndarray, filter_mask: int = 0) -> np.ndarray:
        """Decode ``stored`` (one chunk's bytes) into ``out`` (a C-contiguous buffer of `nbytes`
        bytes, any dtype), native-endian; ``filter_mask`` bit ``i`` set: HDF5 skipped filter ``i``."""
        target = out.reshape(-1).view(np.uint8)
        data = _u8(stored)
        steps = [s for s in self.steps if s.bit is None or not (filter_mask >> s.bit) & 1]
        borrowed = []  # chunk-sized buffers between two steps, reused from run to run (see ``_buffers``)
        try:
            for position, step in enumerate(steps):  # only the last step writes the caller's buffer
                into = None
                if step.into:
                    into = target if position == len(steps) - 1 else _buffers.take((self.nbytes,), np.uint8)
                    if into is not target:
                        borrowed.append(into)
                data = step(data, into, self.nbytes)
            if data.size != self.nbytes:
                raise DecodeError(f"decoded to {data.size} bytes, the chunk has {self.nbytes}")
            if not np.shares_memory(data, target):
                target[...] = data
        finally:
            for buffer in borrowed:
                _buffers.give_back(buffer)
        if not self.dtype.isnative and self.dtype.itemsize > 1:
            swapped = target.view(f"u{self.dtype.itemsize}")
            swapped.byteswap(inplace=True)
        return out


def _name_config(codec: Any) -> tuple[str, dict[str, Any]]:
    spec = codec.to_dict() if hasattr(codec, "to_dict") else {}
    return str(spec.get("name", "")), dict(spec.get("configuration") or {})


def zarr_decoder(array: Any) -> Decoder | None:
    """The decoder of a Zarr array's chunks (whole rows, C order, no sharding), or None to let zarr decode."""
    metadata = array.metadata
    dtype = np.dtype(array.dtype)
    if array.ndim != 2 or array.chunks[1] != array.shape[1] or dtype.kind != "f":
        return None
    nbytes = int(np.prod(array.chunks)) * dtype.itemsize
    if metadata.zarr_format == 3:
        codecs = list(metadata.codecs)
        name, config = _name_config(codecs[0]) if codecs else ("", {})
        if name != "bytes":
            return None  # sharding, transpose, ...
        endian = config.get("endian", sys.byteorder)
        dtype = dtype.newbyteorder("<" if endian == "little" else ">")
        found = [_zarr3_step(*_name_config(codec)) for codec in reversed(codecs[1:])]
    elif metadata.order != "C":
        return None
    else:
        chain = [metadata.compressor] if metadata.compressor is not None else []
        chain += reversed(metadata.filters or [])
        found = [_numcodecs_step(getattr(c, "codec_id", None), getattr(c, "elementsize", 0)) for c in chain]
    steps = [step for step in found if step is not None]
    return Decoder(steps, nbytes, dtype) if len(steps) == len(found) else None


def _zarr3_step(name: str, config: dict[str, Any]) -> _Step | None:
    """The step decoding the Zarr 3 codec ``name`` (with ``config``), None for one we leave to zarr."""
    name = name.removeprefix("numcodecs.")
    return _Crc32c() if name == "crc32c" else _numcodecs_step(name, int(config.get("elementsize", 4)))


def _numcodecs_step(name: str | None, elementsize: int) -> _Step | None:
    """The step decoding the numcodecs codec ``name`` (a Zarr 2 codec id, or a Zarr 3 codec name), None
    for one we leave to zarr."""
    if name == "shuffle":
        return _Shuffle(int(elementsize))
    if name in ("gzip", "zlib"):
        return _Zlib(31 if name == "gzip" else 15, name)
    step = {"zstd": _Zstd, "blosc": _Blosc, "lz4": _LZ4}.get(name or "")
    return step() if step is not None else None


#: The HDF5 filters decoded by a step made from the filter's place alone.
_HDF5_STEPS: dict[int, type[_Step]] = {H5Z_FLETCHER32: _Fletcher32, H5Z_LZF: _Lzf, H5Z_BLOSC: _Blosc, H5Z_ZSTD: _Zstd}


def hdf5_decoder(dataset: Any) -> Decoder | None:
    """The decoder of an h5py dataset's chunks (whole rows, filters we know), or None to let HDF5 decode
    (an unfiltered dataset too: HDF5 reads it straight into the caller's buffer)."""
    dtype = np.dtype(dataset.dtype)
    if dataset.chunks is None or dataset.ndim != 2 or dataset.chunks[1] != dataset.shape[1] or dtype.kind != "f":
        return None
    plist = dataset.id.get_create_plist()
    count = plist.get_nfilters()
    if count == 0:
        return None
    steps: list[_Step] = []
    for index in range(count):
        code, _, values, _ = plist.get_filter(index)
        if code == H5Z_DEFLATE:
            steps.append(_Zlib(15, "deflate", index))
        elif code == H5Z_SHUFFLE:
            steps.append(_Shuffle(int(values[0]) if values else dtype.itemsize, index))
        elif code in _HDF5_STEPS:
            steps.append(_HDF5_STEPS[code](index))
        else:
            return None  # szip, scaleoffset, nbit, other plugins: HDF5 decodes them
    steps.reverse()
    return Decoder(steps, int(np.prod(dataset.chunks)) * dtype.itemsize, dtype)


def widen_in_place(region: np.ndarray, n_values: int) -> None:
    """Widen the ``n_values`` float16 values in ``region``'s second half (bytes ``2n..4n``) to float32 over
    all of it, in place, piece by piece from the front: a piece's float32 bytes end at ``4b``, before the
    float16 bytes of every later piece start (``2n + 2b``), so nothing is overwritten before it is read."""
    source = region[2 * n_values : 4 * n_values].view(np.float16)
    target = region[: 4 * n_values].view(np.float32)
    step = 1 << 16
    for start in range(0, n_values, step):
        np.copyto(target[start : start + step], source[start : start + step])


def decode_rows(
    decoder: Decoder,
    chunks: Iterable[tuple[int, Any, int]],
    start: int,
    stop: int,
    out: np.ndarray,
    chunk_rows: int,
    fill_value: Any,
    describe: Callable[[int], str],
) -> np.ndarray:
    """Rows ``[start, stop)`` into ``out`` (C-contiguous; float32 for a float16 store) from ``chunks``
    (`Fetched`): a whole chunk straight into ``out``, a partial one through a chunk-sized buffer. A chunk
    that does not decode raises `DecodeError` prefixed with ``describe(index)``."""
    view = out[: stop - start]
    n_features = view.shape[1]
    stored = decoder.dtype.newbyteorder("=")
    widen = view.dtype != stored
    for index, data, mask in chunks:
        first = index * chunk_rows
        lo, hi = max(start, first), min(stop, first + chunk_rows)
        target = view[lo - start : hi - start]
        if data is None:
            target[...] = fill_value or 0
            continue
        whole = (lo, hi) == (first, first + chunk_rows)
        try:
            if whole and not widen:
                decoder.decode_into(data, target, mask)
            elif whole:  # decode into the second half of the rows' float32 bytes, then widen in place
                region = target.reshape(-1).view(np.uint8)
                decoder.decode_into(data, region[decoder.nbytes :], mask)
                widen_in_place(region, decoder.nbytes // 2)
            else:
                chunk = _buffers.take((chunk_rows, n_features), stored)  # reused: fresh memory is slow to touch
                try:
                    decoder.decode_into(data, chunk, mask)
                    target[...] = chunk[lo - first : hi - first]
                finally:
                    _buffers.give_back(chunk)
        except DecodeError as exc:
            raise DecodeError(f"{describe(index)}: {exc}") from None
        except Exception as exc:  # a codec library failing on the bytes it was given
            raise DecodeError(f"{describe(index)}: {exc.__class__.__name__}: {first_line(exc)}") from None
    return view


def check_compressor(name: str) -> str:
    """``name`` if it is one of `COMPRESSORS`, else a `ValueError` listing them."""
    if name not in COMPRESSORS:
        raise ValueError(f"compressor must be one of {', '.join(COMPRESSORS)}, got {name!r}")
    return name


def numcodecs_codec(name: str, dtype: Any) -> Any:
    """The numcodecs codec of ``--compressor name`` (None for ``none``): zstd level 3 (what Zarr 3's level 0
    means), blosc lz4 level 5 with byte shuffle, gzip level 4."""
    from numcodecs import Blosc, GZip, Zstd

    check_compressor(name)
    if name == "zstd":
        return Zstd(level=3)
    if name == "blosc":
        return Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE, typesize=np.dtype(dtype).itemsize)
    if name == "gzip":
        return GZip(level=4)
    return None


def fletcher32_of(data: Any) -> np.ndarray:
    """The 4 bytes HDF5's fletcher32 filter stores after a chunk's ``data`` (checked by `_Fletcher32`)."""
    from numcodecs.fletcher32 import Fletcher32

    stored: np.ndarray = np.frombuffer(Fletcher32().encode(_u8(data)), np.uint8)[-4:].copy()
    return stored


def crc32c_of(*parts: Any) -> np.ndarray:
    """The 4 bytes Zarr 3's ``crc32c`` codec stores after a chunk made of ``parts`` (checked by `_Crc32c`)."""
    import google_crc32c

    value = 0
    for part in parts:
        value = google_crc32c.extend(value, _u8(part) if not isinstance(part, bytes) else part)
    stored: np.ndarray = np.frombuffer(int(value).to_bytes(4, "little"), np.uint8).copy()
    return stored


def chunk_encoder(name: str, dtype: Any, layout: str) -> Callable[[np.ndarray], bytes] | None:
    """``encode(chunk) -> bytes`` for ``--compressor name`` (None for ``none``), as the ``layout`` ("zarr" or
    "hdf5") stores a whole chunk; HDF5's gzip is deflate after byte shuffle, as h5py writes it."""
    codec = numcodecs_codec(name, dtype)
    if codec is None:
        return None
    if layout == "hdf5" and name == "gzip":
        from numcodecs import Shuffle

        shuffle = Shuffle(np.dtype(dtype).itemsize)
        return lambda chunk: zlib.compress(shuffle.encode(chunk.reshape(-1).view(np.uint8)), 4)
    return lambda chunk: bytes(codec.encode(chunk.reshape(-1).view(np.uint8)))
