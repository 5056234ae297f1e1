"""Checksummed ``.npz`` files written atomically: the container of model files and checkpoints.

Plain arrays only (``allow_pickle=False``), a SHA-256 over every array's name, dtype, shape and bytes
stored beside them, and write-to-temp + fsync + rename, so a reader sees the old file or the whole new
one, and a truncated or altered file is detected instead of used.
"""

from __future__ import annotations

import ast
import hashlib
import math
import os
import zipfile
from typing import Any

import numpy as np

from ._durable import link_or_kind, write_file_atomic
from ._paths import check_readable
from .errors import BadInputError, ModelFileError


def checksum(arrays: dict) -> str:
    """SHA-256 over the arrays in name order (names, dtypes, shapes and bytes)."""
    digest = hashlib.sha256()
    for key in sorted(arrays):
        value = np.ascontiguousarray(arrays[key])
        digest.update(key.encode())
        digest.update(str(value.dtype).encode() + str(value.shape).encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def write_npz_atomic(path: str, arrays: dict, what: str = "file") -> str:
    """Write ``arrays`` plus their checksum to ``path`` durably (`write_file_atomic`: on failure ``path`` is
    left as it was); returns the checksum."""
    digest = checksum(arrays)
    write_file_atomic(path, lambda handle: np.savez(handle, **arrays, checksum=np.array(digest)), what)
    return digest


def read_npy_header(handle: Any) -> tuple[tuple, bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` of the ``.npy`` header at ``handle``'s position, left just after it,
    for versions 1.0, 2.0 and 3.0 (UTF-8, which numpy has no public reader for: parsed as a literal, never
    evaluated); `ValueError` (or `EOFError`) for what is not such a header."""
    from numpy.lib import format as npy_format

    version = npy_format.read_magic(handle)
    if version == (1, 0):
        return npy_format.read_array_header_1_0(handle)
    if version == (2, 0):
        return npy_format.read_array_header_2_0(handle)
    if version != (3, 0):
        raise ValueError(f"its format version {version[0]}.{version[1]} is none numpy reads (1.0, 2.0, 3.0)")
    size = handle.read(4)
    if len(size) < 4:
        raise EOFError("the file ends inside its header")
    length = int.from_bytes(size, "little")
    if length > _MAX_HEADER_BYTES:
        raise ValueError(f"its header is {length:,} bytes long, more than any array needs")
    raw = handle.read(length)
    if len(raw) < length:
        raise EOFError("the file ends inside its header")
    try:
        header = ast.literal_eval(raw.decode("utf-8"))
    except (UnicodeDecodeError, SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ValueError(f"its header cannot be parsed ({exc.__class__.__name__})") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ValueError("its header is not a dictionary of descr, fortran_order and shape")
    shape, fortran = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
        raise ValueError(f"its header's shape is not valid: {shape!r}")
    if not isinstance(fortran, bool):
        raise ValueError(f"its header's fortran_order is not a bool: {fortran!r}")
    try:
        dtype = npy_format.descr_to_dtype(header["descr"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"its header's descr is not a dtype ({exc})") from None
    return shape, fortran, dtype


#: The longest header accepted (numpy's own default limit is 10,000 characters).
_MAX_HEADER_BYTES = 1 << 20


class NpyTooShort(ValueError):
    """A ``.npy`` header that declares more data than the file holds."""


def npy_header(handle: Any, size: int) -> tuple[tuple, np.dtype, bool, int]:
    """``(shape, dtype, fortran_order, offset of the data)`` of the ``.npy`` array of ``size`` bytes at
    ``handle``'s position, checked before anything is allocated: `ValueError` (or `EOFError`) for no header,
    negative dimensions or objects, `NpyTooShort` for more data declared than there is."""
    start = handle.tell()
    shape, fortran, dtype = read_npy_header(handle)
    if any(int(n) < 0 for n in shape):
        raise ValueError(f"its header declares negative dimensions {tuple(shape)}")
    if dtype.hasobject:
        raise ValueError("it holds Python objects, not numbers")
    offset = handle.tell() - start
    nbytes = math.prod(int(n) for n in shape) * dtype.itemsize
    if offset + nbytes > size:
        raise NpyTooShort(
            f"its header declares shape {tuple(int(n) for n in shape)} of {dtype} ({nbytes:,} bytes of data), "
            f"but it holds {max(0, size - offset):,}"
        )
    return tuple(int(n) for n in shape), dtype, bool(fortran), offset


def _check_members(data: Any, path: str, what: str) -> None:
    """Refuse an archive a member of which declares more data than the archive holds for it, before numpy
    allocates what the header says."""
    try:
        for info in data.zip.infolist():
            with data.zip.open(info) as member:
                try:
                    npy_header(member, info.file_size)
                except (ValueError, EOFError) as exc:
                    raise ModelFileError(
                        f"{path}: {what} is corrupt: its member {info.filename} cannot be read ({exc})"
                    ) from None
    except (zipfile.BadZipFile, OSError, EOFError, zipfile.LargeZipFile) as exc:
        raise ModelFileError(f"{path}: {what} is corrupt or truncated ({exc.__class__.__name__}: {exc})") from exc


#: What each ``format`` value is, for messages about a file given in the wrong place.
KNOWN_FORMATS = {
    "streamwhiten-model": "a streamwhiten model file",
    "streamwhiten-checkpoint": "a fit checkpoint",
    "streamwhiten-affine": "an exported affine map (streamwhiten export)",
}


def foreign_npz(path: str, expected_format: str) -> str | None:
    """None when ``path`` is a file of ``expected_format`` written by `write_npz_atomic`, else what it is
    instead: the ``foreign`` check of ``_durable.check_replaceable`` for model files, checkpoints and maps."""
    found = link_or_kind(path, directory=False)
    if found is not None:
        return found
    if not zipfile.is_zipfile(path):
        return "not an .npz archive"
    try:
        with np.load(path, allow_pickle=False) as data:
            kind = str(data["format"]) if "format" in data.files else ""
    except Exception:  # noqa: BLE001 - a damaged archive is not known to be ours
        return "an .npz archive that cannot be read"
    if kind == expected_format:
        return None
    return KNOWN_FORMATS.get(kind, "an .npz archive streamwhiten did not write")


def check_file(path: str, what: str) -> None:
    """Refuse a ``path`` that is missing or not a regular file (`ModelFileError`), or that may not be
    read (`StoreIOError`), before anything opens it (a FIFO would block)."""
    try:
        check_readable(path, what, directory=False)
    except ModelFileError:
        raise
    except BadInputError as exc:
        raise ModelFileError(str(exc)) from None


def read_npz(path: str, what: str, expected_format: str, version: int | tuple[int, ...]) -> dict:
    """All arrays of a file written by `write_npz_atomic`, or `ModelFileError`, checked in the order of the
    clearest message: readable, of the expected kind and version, then intact (checksum)."""
    path, expected = os.fspath(path), KNOWN_FORMATS.get(expected_format, what)
    check_file(path, what)
    try:
        data = np.load(path, allow_pickle=False)
    except ValueError:  # numpy's message talks about pickles; the point is that this is no .npz archive
        raise ModelFileError(f"{path}: is not {expected} (not an .npz archive)") from None
    except (zipfile.BadZipFile, OSError, EOFError, KeyError, zipfile.LargeZipFile) as exc:
        raise ModelFileError(f"{path}: {what} is corrupt or truncated ({exc.__class__.__name__}: {exc})") from exc
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ModelFileError(f"{path}: is a plain .npy array, not {expected}")
    try:
        with data:
            _check_members(data, path, what)
            arrays = {key: data[key] for key in data.files}
    except ModelFileError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError, zipfile.LargeZipFile) as exc:
        raise ModelFileError(f"{path}: {what} is corrupt or truncated ({exc.__class__.__name__}: {exc})") from exc
    found = str(arrays.get("format", ""))
    if found != expected_format:
        kind = KNOWN_FORMATS.get(found, "not written by streamwhiten")
        raise ModelFileError(f"{path}: expected {expected}, but this file is {kind}")
    try:
        found_version = int(arrays.get("format_version", -1))
    except (TypeError, ValueError):
        found_version = -1
    versions = (version,) if isinstance(version, int) else tuple(version)
    if found_version not in versions:
        readable = " and ".join(str(item) for item in versions)
        raise ModelFileError(
            f"{path}: {what} format version {found_version} is not supported (this streamwhiten reads version "
            f"{readable}); refit, or use the streamwhiten release that wrote it"
        )
    stored = arrays.pop("checksum", None)
    if stored is None or str(stored) != checksum(arrays):
        raise ModelFileError(f"{path}: {what} failed its checksum: it was changed or damaged after it was written")
    return arrays
