"""Reading and writing embedding stores: specs, one module per backend, outputs written durably.

The layout, as zarr 3 cuts it:

- ``abc.store``: the interface, `Source` and `Sink`, with their capability attributes
  (what a backend can do is asked of them, never of its kind's name); no storage library, no helper;
  ``_store``: what every backend shares beneath it (``StoreSource``, ``StoreSink``: retries, decoding,
  durable commits) and the helpers around stores (array checks, chunk sizing, removal, temporary names);
- ``hdf5``, ``zarr``, ``npy``, ``parquet``, ``lance``: the backends, each the only importer of its library
  (pyarrow and pylance are optional extras; ``_arrow`` holds what the last two share, ``direct`` what
  makes writes fast), registered once each in ``registry`` and imported only when a store of its kind
  is opened;
- ``codecs``: decoding compressed chunks apart from reading them (a `Decoder`), below
  every store module;
- ``spec``: what the user names (paths, ``file.h5:/dataset``, globs, URLs) and which backend it is;
- ``reading`` (`open_source`, `read_vector`, `read_ids`), ``output`` (`open_output`:
  the one way to write), ``window`` (`RowRange`: rows ``[start, stop)`` of a source),
  ``fingerprint``, ``lazy`` (rows for other processes), ``text`` (CSV/TSV columns);
- ``remote``: object storage and other URLs through fsspec, every call with the storage options it is
  given (a [`ReadOptions`][streamwhiten.options.ReadOptions]), never a process-wide setting.

``streamwhiten._durable`` (below this package: model files and checkpoints need it too) makes writes
safe. The names here are what the rest of the package uses.
"""

from __future__ import annotations

from . import remote, text
from ._store import (
    DEFAULT_BLOCK_BYTES,
    FINGERPRINT_ROWS,
    OUTPUT_CHUNK_BYTES,
    OWNER_ATTR,
    aligned_chunk_rows,
    count_blocks,
    identity_of,
    output_chunk_rows,
    partial_path,
    remove,
)
from .abc.store import Sink, Source
from .fingerprint import Sampler, describe, fingerprint
from .lazy import LazyRows, lazy_rows
from .output import Output, open_output
from .reading import exists, open_source, read_attrs, read_ids, read_vector
from .registry import backend
from .spec import expand_specs, input_kind, refuse_input_overlap, refuse_shared_outputs, same_file, split_spec
from .window import RowRange

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "FINGERPRINT_ROWS",
    "OUTPUT_CHUNK_BYTES",
    "OWNER_ATTR",
    "LazyRows",
    "Output",
    "RowRange",
    "Sampler",
    "Sink",
    "Source",
    "aligned_chunk_rows",
    "backend",
    "count_blocks",
    "describe",
    "exists",
    "expand_specs",
    "fingerprint",
    "identity_of",
    "input_kind",
    "lazy_rows",
    "open_output",
    "open_source",
    "output_chunk_rows",
    "partial_path",
    "read_attrs",
    "read_ids",
    "read_vector",
    "refuse_input_overlap",
    "refuse_shared_outputs",
    "remote",
    "remove",
    "same_file",
    "split_spec",
    "text",
]
