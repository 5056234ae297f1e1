"""Specs: the strings that name an array in a store, globs of them, and the paths outputs may take.

A *spec* is ``file.h5:/group/dataset`` (or ``file.h5`` with a separate dataset name), ``dir.zarr``,
``dir.zarr:/group/array`` or ``dir.zarr/group/array``, or ``file.npy``. Which backend reads a path is
decided here from its name (and, for a file of unknown extension, its HDF5 signature), never by the
backends themselves.
"""

from __future__ import annotations

import glob
import os

from ..errors import BadInputError

HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")
ZARR_SUFFIX = ".zarr"
NPY_SUFFIX = ".npy"


def split_spec(spec: str, dataset: str | None = None) -> tuple[str, str | None]:
    """Split ``path:inner`` into ``(path, inner)``; an explicit ``dataset`` wins over the suffix."""
    spec = os.fspath(spec)
    path, inner = spec, None
    if not os.path.exists(spec) and ":" in spec:
        head, _, tail = spec.rpartition(":")
        # ``a:b`` names an array inside a store only when that is unambiguous: the inner part starts
        # with "/", or the head is an existing path or has a store suffix; otherwise ':' is part of a
        # file name (e.g. a timestamp).
        suffixes = HDF5_SUFFIXES + (ZARR_SUFFIX, NPY_SUFFIX)
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


def input_kind(path: str) -> str:
    """The backend that reads the existing ``path``: ``"hdf5"``, ``"zarr"`` or ``"npy"``."""
    if os.path.isdir(path):
        return "zarr"
    if path.endswith(NPY_SUFFIX):
        return "npy"
    if path.lower().endswith(HDF5_SUFFIXES):
        return "hdf5"
    import h5py

    if h5py.is_hdf5(path):
        return "hdf5"
    raise BadInputError(f"{path}: not an HDF5 file, a Zarr store or a .npy file")


def output_kind(path: str) -> str:
    """The backend that writes an output at ``path``, from its name."""
    if path.rstrip("/").endswith(ZARR_SUFFIX):
        return "zarr"
    if path.lower().endswith(HDF5_SUFFIXES):
        return "hdf5"
    raise BadInputError(f"{path}: output must end in .zarr or one of {', '.join(HDF5_SUFFIXES)}")


def partial_path(path: str) -> str:
    """The hidden temporary name a sink is written under before it is renamed to ``path``."""
    head, tail = os.path.split(os.path.abspath(path.rstrip("/")))
    return os.path.join(head, f".{tail}.partial")


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


def refuse_shared_outputs(*outputs: tuple) -> None:
    """Refuse two outputs of one command, given as ``(path, what)`` pairs, that are the same file (one
    would overwrite or delete the other)."""
    named = [(split_spec(os.fspath(path))[0], what) for path, what in outputs if path is not None]
    for i, (first, first_what) in enumerate(named):
        for second, second_what in named[i + 1:]:
            if os.path.realpath(first) == os.path.realpath(second) or _same_inode(first, second):
                raise BadInputError(f"{first}: given as both the {first_what} and the {second_what}; choose another path")


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
