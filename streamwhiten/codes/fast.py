"""The Numba paths of the codes: encoding the tool's own codes in one pass (`LinearCode.encode`'s bytes),
and top-k search over code rows (a table scan; faiss's by faiss). Apart, so decoding never needs numba.
"""

from __future__ import annotations

import sys

import numpy as np
import numpy.typing as npt

from ..core.exclusions import Exclusions
from ..core.finite import raise_if_nonfinite
from ..core.kernels.codes import decoded_norms, encode_levels, lookup_scores
from ..core.kernels.search import merge_top_scores
from ..errors import BadInputError
from .base import NOT_CODABLE, Codec
from .faiss_codes import FaissCode
from .linear import LinearCode

#: Bytes of code rows scored per tile: they stay in the L2 cache while a chunk of queries passes.
TILE_BYTES = 1 << 18
#: Queries per chunk: their tables (chunk x code bytes x 256 float32) are built once per chunk.
TILE_QUERIES = 32


def encode(codec: Codec, block: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """``codec.encode(block)``, byte for byte; the tool's own codes by one Numba pass per block of rows."""
    if not isinstance(codec, LinearCode) or sys.byteorder != "little":  # the kernel writes words as bytes
        return codec.encode(block)
    rows = codec.check_rows(block, finite=False)
    n_rows = rows.shape[0]
    out = np.empty((n_rows, codec.bytes_per_vector), dtype=np.uint8)
    step = codec.block_rows  # the products of codec.project, so the bytes are its bytes on any BLAS
    z = np.empty((min(step, n_rows), codec.n_components), dtype=np.float32)
    for r0 in range(0, n_rows, step):
        r1 = min(n_rows, r0 + step)
        part = z[: r1 - r0]
        codec.project_into(rows[r0:r1], part)
        if encode_levels(part, codec._shift32, codec.step, codec.bits, out[r0:r1]) >= 0:
            raise_if_nonfinite(part, "rows", start=r0, suffix=NOT_CODABLE)
        if codec.correction:
            out[r0:r1, codec.code_bytes :] = codec.corrections(rows[r0:r1], part, codec.quantize(part)).view(np.uint8)
    return out


def search(
    codec: Codec,
    queries: npt.ArrayLike,
    codes: npt.ArrayLike,
    k: int,
    *,
    exclude: Exclusions | None = None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """The ``k`` best corpus rows per query by the codec's estimate of ``<q, x>`` (best first, ties to the
    lower row, unfilled: row -1, score -inf), never an excluded pair."""
    q = codec.check_rows(queries, "queries").astype(np.float32)
    rows = codec.check_codes(codes)
    k = int(k)
    if k < 1:
        raise BadInputError(f"search depth k must be at least 1, got {k}")
    exclude = exclude if exclude is not None else Exclusions.none(q.shape[0])
    start, excluded = exclude.start, exclude.rows
    if start.shape[0] != q.shape[0] + 1:
        raise BadInputError(f"the exclusions are for {start.shape[0] - 1} queries, not {q.shape[0]}")
    if isinstance(codec, FaissCode):
        return _faiss_search(codec, q, rows, k, start, excluded)
    if not isinstance(codec, LinearCode):
        raise BadInputError(f"no search for {type(codec).__name__} codes")
    top_scores, top_rows = _empty_top(q.shape[0], k)
    merge_block(codec, q, rows, 0, top_scores, top_rows, start, excluded)
    return top_scores, top_rows


def merge_block(
    codec: LinearCode,
    queries: npt.NDArray[np.float32],
    codes: npt.NDArray[np.uint8],
    first_row: int,
    top_scores: npt.NDArray[np.float32],
    top_rows: npt.NDArray[np.int64],
    start: npt.NDArray[np.int64],
    excluded: npt.NDArray[np.int64],
) -> None:
    """Merge ``codes`` (corpus rows from ``first_row``) into the queries' top lists by the table scan, never
    an excluded pair (`Exclusions` arrays): block by block gives one search's lists."""
    scales = codec.scales(codes)
    row_scales = _row_scales(codec, codes, scales)
    tile_rows = max(64, TILE_BYTES // codec.bytes_per_vector)
    tile = np.empty((TILE_QUERIES, tile_rows), dtype=np.float32)
    for q0 in range(0, queries.shape[0], TILE_QUERIES):
        q1 = min(queries.shape[0], q0 + TILE_QUERIES)
        tables, bases, offsets = codec.lookup_tables(queries[q0:q1])
        for r0 in range(0, codes.shape[0], tile_rows):
            r1 = min(codes.shape[0], r0 + tile_rows)
            out = tile[: q1 - q0, : r1 - r0]
            lookup_scores(tables, codes[r0:r1], scales[r0:r1], row_scales[r0:r1], bases, offsets, out)
            merge_top_scores(out, first_row + r0, q0, top_scores, top_rows, start, excluded)


def _empty_top(n_queries: int, k: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """Top lists with every slot unfilled (score -inf, row -1)."""
    return np.full((n_queries, k), -np.inf, dtype=np.float32), np.full((n_queries, k), -1, dtype=np.int64)


def _row_scales(codec: LinearCode, rows: np.ndarray, scales: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """`LinearCode.row_scales` of the code rows, their lengths by one Numba pass (a unit code only)."""
    if not codec.unit:
        return np.ones(rows.shape[0], dtype=np.float32)
    norms = np.empty(rows.shape[0], dtype=np.float64)
    decoded_norms(rows, codec.bits, codec.step, codec._mean_along, float(codec.mean @ codec.mean), scales, norms)
    return codec.row_scales(norms)


def _faiss_search(
    codec: FaissCode, q: np.ndarray, rows: np.ndarray, k: int, start: np.ndarray, excluded: np.ndarray
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """faiss's top ``k`` plus as many as a query has exclusions, the excluded pairs dropped."""
    extra = int(np.diff(start).max()) if start.shape[0] > 1 else 0
    scores, found = codec.search(q, rows, min(rows.shape[0], k + extra))
    top_scores, top_rows = _empty_top(q.shape[0], k)
    for i in range(q.shape[0]):
        keep = found[i] >= 0
        if start[i + 1] > start[i]:
            keep &= ~np.isin(found[i], excluded[start[i] : start[i + 1]])
        chosen = np.flatnonzero(keep)[:k]
        top_scores[i, : chosen.size] = scores[i, chosen]
        top_rows[i, : chosen.size] = found[i, chosen]
    return top_scores, top_rows


__all__ = ["TILE_BYTES", "TILE_QUERIES", "encode", "merge_block", "search"]
