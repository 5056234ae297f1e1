"""Specs: the strings that name an array in a store, globs of them, and the paths outputs may take.

A *spec* is ``file.h5:/group/dataset``, ``dir.zarr[:/group/array]`` or ``dir.zarr/group/array``,
``file.npy``, ``file.parquet:column`` (a directory of shards expands into its files, as a glob does) or
``dir.lance:column``, local or a URL (``s3://...``; ``file://`` is local). Which backend reads it is
decided here, from its name, what a directory or prefix holds, or its first bytes.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from typing import Any

from .._paths import split_above
from ..errors import BadInputError
from ..options import ReadOptions
from . import remote
from ._store import partial_path as partial_path  # a sink's temporary name; callers take it from here
from .registry import BACKENDS, writable

HDF5_SUFFIXES = BACKENDS["hdf5"].suffixes
ZARR_SUFFIX = BACKENDS["zarr"].suffixes[0]
NPY_SUFFIX = BACKENDS["npy"].suffixes[0]
PARQUET_SUFFIX = BACKENDS["parquet"].suffixes[0]
LANCE_SUFFIX = BACKENDS["lance"].suffixes[0]
#: Delimited text (a column of numbers: gold scores, qrels); read by ``text``, never as a store of rows.
TEXT_SUFFIXES = (".csv", ".tsv")
#: Files whose presence marks a directory as a Zarr store (v3, v2 array, v2 group).
ZARR_MARKERS = ("zarr.json", ".zarray", ".zgroup")
#: The endings of store names, and of the files a spec may name something inside (text files too).
_STORE_SUFFIXES = HDF5_SUFFIXES + (ZARR_SUFFIX, NPY_SUFFIX, PARQUET_SUFFIX, LANCE_SUFFIX)
_SPEC_SUFFIXES = _STORE_SUFFIXES + TEXT_SUFFIXES


def split_spec(spec: str, dataset: str | None = None) -> tuple[str, str | None]:
    """Split ``path:inner`` into ``(path, inner)``; an explicit ``dataset`` wins over the suffix. A spec
    holding a NUL byte names no file (a one-line `BadInputError`, not ``os.stat``'s ``ValueError``)."""
    spec = remote.local_path(os.fspath(spec))
    if "\x00" in spec or (dataset is not None and "\x00" in dataset):
        shown = repr(spec if dataset is None else f"{spec}:{dataset}")
        raise BadInputError(f"{shown}: holds a NUL byte, which no path can hold")
    path, inner = spec, None
    if remote.is_url(spec):
        scheme, rest = remote.split_url(spec)
        if ":" in rest:
            head, _, tail = rest.rpartition(":")
            if head and "/" in head and (tail.startswith("/") or head.rstrip("/").lower().endswith(_SPEC_SUFFIXES)):
                path, inner = scheme + head, tail
    elif not os.path.exists(spec) and ":" in spec:
        head, _, tail = spec.rpartition(":")
        # ``a:b`` names an array inside a store only when unambiguous; else ':' is part of a file name
        if head and (tail.startswith("/") or os.path.exists(head) or head.rstrip("/").lower().endswith(_SPEC_SUFFIXES)):
            path, inner = head, tail
    if dataset is not None:
        inner = dataset
    if inner is not None:
        inner = inner.strip("/") or None
    return path, inner


def expand_specs(specs: Iterable[Any], read: ReadOptions | None = None) -> list[Any]:
    """Expand glob patterns (``'shards/day-*.h5:/emb'``) that name no file literally, and directories of
    Parquet shards, into their files, sorted for a stable order."""
    read = read if read is not None else ReadOptions()
    expanded: list[Any] = []
    for spec in specs:
        if not isinstance(spec, (str, os.PathLike)):  # an open source, say: nothing to expand
            expanded.append(spec)
            continue
        spec = remote.local_path(os.fspath(spec))
        path, inner = split_spec(spec)
        suffix = f":/{inner}" if inner else ""
        if remote.is_url(path):
            expanded.extend(_expand_url(path, suffix, spec, read))
            continue
        matches = None
        if any(ch in path for ch in "*?[") and not os.path.exists(path):
            matches = sorted(glob.glob(path))
            if not matches:
                raise BadInputError(f"{path}: the pattern matches no file")
        for match in matches if matches is not None else [path]:
            if os.path.isdir(match) and input_kind(match, read) == "parquet":
                expanded.extend(name + suffix for name in parquet_files(match, read))
            elif matches is not None:
                expanded.append(match + suffix)
            else:
                expanded.append(spec)
    return expanded


def _expand_url(path: str, suffix: str, spec: str, read: ReadOptions) -> list[str]:
    """A URL spec expanded as a local one is: a glob over an object prefix, and a prefix of Parquet shards."""
    if any(ch in remote.split_url(path)[1] for ch in "*?["):
        matches = remote.glob(path, read=read)
        # a glob matches objects: one whose name marks a store (dir.zarr/zarr.json) stands for the store
        stores = sorted({_store_root(m) for m in matches})
        if not stores:
            raise BadInputError(f"{remote.redact(path)}: the pattern matches no object")
        return [found for match in stores for found in _expand_url(match, suffix, match + suffix, read)]
    if (
        not path.rstrip("/").lower().endswith(_STORE_SUFFIXES)
        and remote.isdir(path, read=read)
        and input_kind(path, read) == "parquet"
    ):
        return [name + suffix for name in parquet_files(path, read)]
    return [spec]


def _store_root(url: str) -> str:
    """A matched object's store: the ``.zarr`` or ``.lance`` prefix it lies in, else the object itself."""
    head, rest = remote.split_url(url)
    parts = rest.split("/")
    for i, part in enumerate(parts):
        if part.endswith((ZARR_SUFFIX, LANCE_SUFFIX)):
            return head + "/".join(parts[: i + 1])
    return url


def parquet_files(directory: str, read: ReadOptions | None = None) -> list[str]:
    """The ``*.parquet`` files under ``directory`` (recursively, sorted by path), leaving out hidden and
    ``_``-prefixed entries (``_SUCCESS``, ``_metadata``, partial outputs)."""
    if remote.is_url(directory):
        base = directory.rstrip("/")
        return sorted(
            url
            for url in remote.find(base, read=read if read is not None else ReadOptions())
            if url.endswith(PARQUET_SUFFIX)
            and not any(part.startswith((".", "_")) for part in url[len(base) + 1 :].split("/"))
        )
    found: list[str] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        found.extend(
            os.path.join(root, name)
            for name in files
            if name.endswith(PARQUET_SUFFIX) and not name.startswith((".", "_"))
        )
    return sorted(found)


def _is_lance(path: str) -> bool:
    return path.rstrip("/").endswith(LANCE_SUFFIX) or os.path.isdir(os.path.join(path, "_versions"))


def _is_zarr(path: str) -> bool:
    if any(os.path.exists(os.path.join(path, marker)) for marker in ZARR_MARKERS):
        return True
    return any(part.endswith(ZARR_SUFFIX) for part in os.path.abspath(path).split(os.sep))


def zarr_store_above(path: str) -> tuple[str, str] | None:
    """For a local ``dir.zarr/name`` that does not exist: ``(dir.zarr, name)``, the Zarr store it runs
    through and the name inside it (whose reader then says what the store holds); else None."""
    return split_above(path, lambda head: os.path.isdir(head) and _is_zarr(head))


def input_kind(path: str, read: ReadOptions | None = None) -> str:
    """The backend that reads the existing ``path``: ``"hdf5"``, ``"zarr"``, ``"npy"``, ``"parquet"`` or
    ``"lance"``. A directory is Lance (``.lance``, ``_versions``), Zarr (its metadata, ``.zarr`` in its path),
    Parquet shards, or else taken for Zarr (whose reader then says what is missing)."""
    if remote.is_url(path):
        return _remote_kind(path, read if read is not None else ReadOptions())
    if os.path.isdir(path):
        if _is_lance(path):
            return "lance"
        if _is_zarr(path):
            return "zarr"
        if parquet_files(path):
            return "parquet"
        return "zarr"
    if path.endswith(NPY_SUFFIX):
        return "npy"
    if path.lower().endswith(PARQUET_SUFFIX):
        return "parquet"
    if path.lower().endswith(HDF5_SUFFIXES):
        return "hdf5"
    import h5py

    if h5py.is_hdf5(path):
        return "hdf5"
    try:
        with open(path, "rb") as handle:
            if handle.read(4) == b"PAR1":
                return "parquet"
    except OSError:
        pass
    raise BadInputError(f"{path}: not an HDF5, Parquet or .npy file, nor a Zarr store or Lance dataset")


def _remote_kind(url: str, read: ReadOptions) -> str:
    """`input_kind` of a URL: from its name, else the objects under it, else its first bytes."""
    name = url.rstrip("/")
    lowered = name.lower()
    if lowered.endswith(LANCE_SUFFIX):
        return "lance"
    if lowered.endswith(NPY_SUFFIX):
        return "npy"
    if lowered.endswith(PARQUET_SUFFIX):
        return "parquet"
    if lowered.endswith(HDF5_SUFFIXES):
        return "hdf5"
    if any(part.endswith(ZARR_SUFFIX) for part in remote.split_url(name)[1].split("/")):
        return "zarr"
    if remote.isdir(name, read=read):
        if any(remote.exists(remote.join(name, marker), read=read) for marker in ZARR_MARKERS):
            return "zarr"
        if remote.exists(remote.join(name, "_versions"), read=read):
            return "lance"
        if parquet_files(name, read):
            return "parquet"
        return "zarr"
    head = remote.cat(name, 0, 8, read=read)
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "hdf5"
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    raise BadInputError(f"{remote.redact(name)}: not an HDF5, Parquet or .npy file, nor a Zarr store or Lance dataset")


def output_kind(path: str) -> str:
    """The backend that writes an output at ``path``, from its name (`registry.writable`'s suffixes;
    a directory store's name may end in ``/``)."""
    for backend in writable():
        name = path.rstrip("/") if backend.directory else path.lower()
        if name.endswith(backend.suffixes):
            return backend.kind
    raise BadInputError(f"{path}: output must end in .zarr, .parquet, .lance or one of {', '.join(HDF5_SUFFIXES)}")


def same_file(a: str, b: str) -> bool:
    """True when two paths name the same file or directory (or one lies inside the other)."""
    a, b = remote.local_path(a), remote.local_path(b)
    if remote.is_url(a) or remote.is_url(b):
        return remote.is_url(a) and remote.is_url(b) and (remote.contains(a, b) or remote.contains(b, a))
    a, b = os.path.realpath(a.rstrip("/")), os.path.realpath(b.rstrip("/"))
    return a == b or a.startswith(b + os.sep) or b.startswith(a + os.sep)


class _Place:
    """Where a path points, resolved once: the URL (normalized) of an object, or a local path's real
    path and its file's (device, inode) when it exists."""

    def __init__(self, path: str) -> None:
        self.path = path
        local = remote.local_path(path)
        self.url = remote.normalize(local) if remote.is_url(local) else None
        self.real = "" if self.url else os.path.realpath(local.rstrip("/") or local)
        try:
            found = None if self.url else os.stat(local)
        except OSError:
            found = None
        self.inode = None if found is None else (found.st_dev, found.st_ino)

    def ancestors(self) -> list[str]:
        """Its real path and every directory above it."""
        found, current = [self.real], self.real
        while os.path.dirname(current) != current:
            current = os.path.dirname(current)
            found.append(current)
        return found


def refuse_shared_outputs(*outputs: tuple[Any, str]) -> None:
    """Refuse two outputs of one command, given as ``(path, what)`` pairs, that are the same file."""
    seen: dict[Any, tuple[str, str]] = {}
    for path, what in outputs:
        if path is None:
            continue
        place = _Place(split_spec(os.fspath(path))[0])
        keys: list[Any] = [("url", place.url)] if place.url else [("path", place.real)]
        if place.inode is not None:
            keys.append(("inode", place.inode))
        clash = next((seen[key] for key in keys if key in seen), None)
        if clash is not None:
            raise BadInputError(f"{clash[0]}: given as both the {clash[1]} and the {what}; choose another path")
        seen.update(dict.fromkeys(keys, (place.path, what)))


def refuse_input_overlap(outputs: dict[Any, str], inputs: Iterable[Any], nested: bool = True) -> None:
    """Refuse, before anything is written, an output (``outputs``: path -> what it is, "model file", ...)
    that is one of ``inputs`` or a link of one, or (``nested``) lies inside one or holds one."""
    places = [_Place(split_spec(os.fspath(spec))[0]) for spec in inputs if spec is not None]
    urls = [(place.url, place.path) for place in places if place.url]
    exact: dict[Any, str] = {}  # an input's real path or (device, inode) -> the input
    holding: dict[str, str] = {}  # a directory holding an input, or the input itself -> the input
    for place in places:
        if place.url:
            continue
        exact.setdefault(place.real, place.path)
        if place.inode is not None:
            exact.setdefault(place.inode, place.path)
        for ancestor in place.ancestors():
            holding.setdefault(ancestor, place.path)
    for output, what in outputs.items():
        if output is None:
            continue
        out = _Place(split_spec(os.fspath(output))[0])
        if out.url:
            inside = remote.contains if nested else str.__eq__  # one under the other, or the same location
            found = next((path for url, path in urls if inside(out.url, url) or inside(url, out.url)), None)
        else:
            found = exact.get(out.real) or (exact.get(out.inode) if out.inode is not None else None)
            if found is None and nested:  # the output holds an input, or lies inside one
                found = holding.get(out.real) or next(
                    (exact[ancestor] for ancestor in out.ancestors()[1:] if ancestor in exact), None
                )
        if found is not None:
            raise BadInputError(
                f"{remote.redact(out.path)}: the {what} would overwrite the input {remote.redact(found)}; "
                "choose another path"
            )
