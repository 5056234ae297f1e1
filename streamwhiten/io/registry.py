"""The backends, registered once each: the store kinds, the module and classes that read and write each,
the names that mark its files, and the optional extra that installs its library.

A backend's module is imported only when a store of its kind is opened (`Backend.load`), so
``import streamwhiten`` stays light and a missing optional library is one line naming the ``pip install``.
Adding a backend: write its module (a ``Source`` subclass, and a ``Sink`` where it writes) and add its
record to `BACKENDS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from ..errors import BadInputError
from ..options import ReadOptions

if TYPE_CHECKING:  # type names only: the store classes are below this module's users, not below it
    from .abc.store import Sink, Source

    #: A backend's source class, as ``io.open_source`` calls it: ``(path, dataset, read) -> Source``.
    SourceOpener = Callable[[str, str | None, ReadOptions], Source]


@dataclass(frozen=True)
class Extra:
    """The optional extra a backend's library comes with (``pip install 'streamwhiten[NAME]'``): its ``name``,
    the ``library`` pip installs, ``what`` it reads (for the message) and the top-level ``modules`` it brings."""

    name: str
    library: str
    what: str
    modules: tuple[str, ...]


@dataclass(frozen=True)
class Backend:
    """One store kind (``kind``, as specs name it; ``name`` in messages): where its code is and what names it."""

    kind: str
    name: str
    #: the class of its sources, in the module ``streamwhiten.io.KIND`` (the only importer of its library)
    source: str
    #: the class of its local outputs (None: it is never written)
    sink: str | None = None
    #: the class of its outputs named by URL (None: it cannot be written to object storage)
    remote_sink: str | None = None
    #: the endings of the names of its files or directories (lower case; the first is its usual one)
    suffixes: tuple[str, ...] = ()
    #: the optional extra that installs its library (None: a core dependency)
    extra: Extra | None = None
    #: whether a store of this kind is a directory (a directory output is replaced otherwise than a file)
    directory: bool = False
    #: the article of `name` ("an HDF5 output")
    article: str = "a"

    @property
    def output_name(self) -> str:
        """What an output of this kind is called ("an HDF5 output"), for the message refusing to replace one."""
        return f"{self.article} {self.name} output"

    def load(self) -> ModuleType:
        """The backend's module, imported on first use; a missing optional extra is one line saying which
        ``pip install`` brings it (`BadInputError`)."""
        try:
            return importlib.import_module(f"{__package__}.{self.kind}")
        except ImportError as exc:
            extra = self.extra
            if extra is None or (exc.name or "").split(".")[0] not in extra.modules:
                raise
            raise BadInputError(
                f"reading or writing {extra.what} needs {extra.library}, which is not installed: "
                f"pip install 'streamwhiten[{extra.name}]'"
            ) from None

    def source_class(self) -> SourceOpener:
        """The class that reads stores of this kind, called as ``(path, dataset, read)``."""
        found: SourceOpener = getattr(self.load(), self.source)
        return found

    def sink_class(self, url: bool = False) -> type[Sink] | None:
        """The class that writes outputs of this kind, to a local path or (``url``) to a URL; None where
        this kind is not written there."""
        name = self.remote_sink if url else self.sink
        if name is None:
            return None
        found: type[Sink] = getattr(self.load(), name)
        return found


#: Every backend, by kind.
BACKENDS: dict[str, Backend] = {
    backend.kind: backend
    for backend in (
        Backend("hdf5", "HDF5", "HDF5Source", sink="HDF5Sink", suffixes=(".h5", ".hdf5", ".hdf", ".he5"), article="an"),
        Backend(
            "zarr",
            "Zarr",
            "ZarrSource",
            sink="ZarrSink",
            remote_sink="RemoteZarrSink",
            suffixes=(".zarr",),
            directory=True,
        ),
        Backend("npy", "NumPy", "NpySource", suffixes=(".npy",)),
        Backend(
            "parquet",
            "Parquet",
            "ParquetSource",
            sink="ParquetSink",
            remote_sink="ParquetSink",
            suffixes=(".parquet",),
            extra=Extra("parquet", "pyarrow", "Parquet", ("pyarrow",)),
        ),
        Backend(
            "lance",
            "Lance",
            "LanceSource",
            sink="LanceSink",
            suffixes=(".lance",),
            extra=Extra("lance", "pylance", "Lance datasets", ("pyarrow", "lance")),
            directory=True,
        ),
    )
}


def backend(kind: str) -> Backend:
    """The backend of the store kind ``kind``."""
    return BACKENDS[kind]


def writable() -> list[Backend]:
    """The backends that write outputs, in registration order."""
    return [item for item in BACKENDS.values() if item.sink is not None]


__all__ = ["BACKENDS", "Backend", "Extra", "backend", "writable"]
