"""Reading and writing embedding stores: specs, one module per backend, outputs written durably.

Cut as zarr 3 cuts it (see docs/architecture.md): the interface ``abc.store`` and what the backends
share beneath it (``_store``), one module per backend found through ``registry``, ``codecs``, ``spec``,
``reading``, ``output``, ``window``, ``fingerprint``, ``lazy``, ``text`` and ``remote`` (URLs through
fsspec, with the [`ReadOptions`][streamwhiten.options.ReadOptions] each call is given). The names here
are what the rest of the package uses.
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
