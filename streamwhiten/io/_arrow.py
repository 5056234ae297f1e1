"""Arrow helpers shared by the Parquet and Lance backends (both hand out Arrow arrays): which column
holds the vectors, its element type and width, and the checked copy of Arrow list arrays into a block.

Imported only by ``parquet`` and ``lance``, after pyarrow is known to be installed.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..errors import BadInputError

#: Arrow element types a vector column may hold, as numpy dtypes.
FLOAT_TYPES = {pa.float16(): np.dtype(np.float16), pa.float32(): np.dtype(np.float32),
               pa.float64(): np.dtype(np.float64)}
#: The column types a vector column may have, for messages.
VECTOR_TYPES = "list<float16|float32|float64>, large_list<...> or fixed_size_list<...>[d]"


def storage_type(arrow_type):
    """The storage type of an extension type (a fixed-shape tensor, say), else the type itself."""
    return arrow_type.storage_type if isinstance(arrow_type, pa.ExtensionType) else arrow_type


def is_list(arrow_type) -> bool:
    arrow_type = storage_type(arrow_type)
    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type)


def describe_columns(schema) -> str:
    return ", ".join(f"{field.name} ({field.type})" for field in schema) or "none"


def choose_column(label: str, schema, column: str | None, preferred: str | None = None, how: str = "") -> str:
    """The vector column: ``column`` if given (it must exist), else ``preferred`` (the column a
    streamwhiten output recorded), else the only list column of ``schema``."""
    names = list(schema.names)
    if column is not None:
        if column not in names:
            raise BadInputError(f"{label}: has no column {column!r}; its columns are {describe_columns(schema)}")
        return column
    if preferred is not None and preferred in names:
        return preferred
    lists = [field.name for field in schema if is_list(field.type)]
    if len(lists) == 1:
        return lists[0]
    what = "list columns: " + ", ".join(lists) if lists else f"no list column among {describe_columns(schema)}"
    raise BadInputError(f"{label}: name the column holding the vectors ({how} or --dataset COLUMN); {what}")


def vector_type(label: str, field) -> tuple[np.dtype, int | None]:
    """``(element dtype, width of a fixed_size_list or None)`` of a vector column, or a one-line refusal."""
    arrow_type = storage_type(field.type)
    if not is_list(arrow_type):
        raise BadInputError(f"{label}: column {field.name!r} is {field.type}, not a vector column ({VECTOR_TYPES})")
    element = arrow_type.value_type
    if element not in FLOAT_TYPES:
        raise BadInputError(f"{label}: column {field.name!r} holds {element} values, not float16, float32 or float64 "
                            f"({field.type}; cast it to a float type first)")
    width = arrow_type.list_size if pa.types.is_fixed_size_list(arrow_type) else None
    return FLOAT_TYPES[element], width


def _first(mask) -> int:
    return int(np.flatnonzero(np.asarray(mask.to_numpy(zero_copy_only=False)))[0])


def list_length(array, index: int = 0) -> int | None:
    """Values in entry ``index`` of a list array (None where it is null)."""
    array = array.storage if isinstance(array, pa.ExtensionArray) else array
    if not array.is_valid().to_numpy(zero_copy_only=False)[index]:
        return None
    if pa.types.is_fixed_size_list(array.type):
        return array.type.list_size
    offsets = array.offsets
    return int(offsets[index + 1].as_py() - offsets[index].as_py())


def copy_vectors(array, target: np.ndarray, where) -> None:
    """Copy the list array ``array`` (one vector per entry) into ``target`` (``len(array) x d``),
    refusing null vectors, null values and rows of another length; ``where(i)`` names entry ``i`` for
    the message (file, row group and row)."""
    array = array.storage if isinstance(array, pa.ExtensionArray) else array
    n, d = target.shape
    if len(array) != n:
        raise AssertionError(f"{len(array)} vectors for {n} rows")
    if n == 0:
        return
    if array.null_count:
        raise BadInputError(f"{where(_first(array.is_null()))}: null vector")
    if pa.types.is_fixed_size_list(array.type):
        if array.type.list_size != d:
            raise BadInputError(f"{where(0)}: vectors of {array.type.list_size} values, not {d}")
        values = array.flatten()
    else:
        offsets = array.offsets.to_numpy()
        lengths = np.diff(offsets)
        if lengths.min() != d or lengths.max() != d:
            bad = int(np.flatnonzero(lengths != d)[0])
            raise BadInputError(f"{where(bad)}: has {int(lengths[bad])} values, not {d} as the vectors before it "
                                "(every vector must have the same length)")
        values = array.values.slice(int(offsets[0]), n * d)
    if values.null_count:
        position = _first(values.is_null())
        raise BadInputError(f"{where(position // d)}: value {position % d} of the vector is null")
    flat = values.to_numpy(zero_copy_only=False)
    np.copyto(target, flat.reshape(n, d), casting="no")
