"""faiss's codes as codecs, through faiss itself: PQ, OPQ + PQ, RaBitQ (1, 2 or 4 bits), SQ4, SQ8.

The vectors are centred on the exact mean and, where the code keeps fewer dimensions than the vectors
have (RaBitQ and SQ at small budgets, PQ where the sub-quantisers do not divide the width), projected
on the leading principal axes of the exact covariance; faiss trains its quantiser on a sample of those
(its size and seed are recorded) and encodes with ``sa_encode``. The trained faiss index is kept as
``faiss.serialize_index`` bytes inside the codec's checksummed byte form (never a pickle). A search
hands the code rows to a copy of that index (``add_sa_codes``) and lets faiss scan them.

faiss is imported inside the functions that use it (``pip install faiss-cpu``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import BadInputError
from .base import Codec
from .linear import principal_axes

#: The faiss codes and what they are.
KINDS = {
    "pq": "product quantisation, 8-bit codebooks, one byte per sub-vector",
    "opq": "OPQ rotation, then PQ with 8-bit codebooks",
    "rabitq1": "RaBitQ, 1 bit a dimension (+ its per-vector factors)",
    "rabitq2": "RaBitQ, 2 bits a dimension (+ its per-vector factors)",
    "rabitq4": "RaBitQ, 4 bits a dimension (+ its per-vector factors)",
    "sq4": "4-bit scalar quantisation",
    "sq8": "8-bit scalar quantisation",
}


def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise BadInputError("faiss codes need faiss: pip install faiss-cpu") from None
    return faiss


def faiss_available() -> bool:
    """Whether faiss can be imported (its codes are offered only then)."""
    try:
        import faiss  # noqa: F401 - only whether it is there
    except ImportError:
        return False
    return True


@contextmanager
def one_omp_thread() -> Iterator[None]:
    """faiss's OpenMP held to one thread for the duration (restored after), where several codes train or
    search side by side in threads of their own."""
    faiss = _faiss()
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


#: Bytes of the distance tables faiss's product quantizers make at once when they encode rows (faiss's own
#: batches, 262,144 rows, take 6 GiB at 24 bytes a code: every row's table of 256 centroids per byte).
PQ_TABLE_BYTES = 16 << 20


@contextmanager
def pq_batches(max_bytes_per_code: int) -> Iterator[None]:
    """faiss's product quantizers encode rows (for OPQ's training too) in batches whose distance tables
    (rows x 256 x bytes per code, float32) stay within :data:`PQ_TABLE_BYTES` for codes of up to
    ``max_bytes_per_code`` bytes, for the duration (faiss's global batch size restored after). A row's code
    depends on its own table only: the batches bound the memory, not the codes (the same, byte for byte,
    for retrieval-dev's PQ and OPQ codes at 24 bytes)."""
    faiss = _faiss()
    before = int(faiss.cvar.product_quantizer_compute_codes_bs)
    rows = max(64, PQ_TABLE_BYTES // (256 * 4 * max(1, int(max_bytes_per_code))))
    faiss.cvar.product_quantizer_compute_codes_bs = min(before, rows)
    try:
        yield
    finally:
        faiss.cvar.product_quantizer_compute_codes_bs = before


def _index_for(kind: str, dim: int, n_bytes: int, l2: bool = False) -> Any:
    """An untrained faiss index (inner product, or ``l2`` distance) of ``kind`` over ``dim`` values,
    ``n_bytes`` of PQ code."""
    faiss = _faiss()
    metric = faiss.METRIC_L2 if l2 else faiss.METRIC_INNER_PRODUCT
    if kind == "pq":
        return faiss.IndexPQ(dim, n_bytes, 8, metric)
    if kind == "opq":
        return faiss.IndexPreTransform(faiss.OPQMatrix(dim, n_bytes), faiss.IndexPQ(dim, n_bytes, 8, metric))
    if kind.startswith("rabitq"):
        return faiss.IndexRaBitQ(dim, metric, int(kind[len("rabitq") :]))
    quantizer = faiss.ScalarQuantizer.QT_4bit if kind == "sq4" else faiss.ScalarQuantizer.QT_8bit
    return faiss.IndexScalarQuantizer(dim, quantizer, metric)


def layout_for(kind: str, n_features: int, budget: int) -> tuple[int, int]:
    """``(dimensions kept, PQ sub-quantisers)`` of the ``kind`` code that fits ``budget`` bytes, the most
    dimensions it can; :class:`BadInputError` below the smallest such code."""
    if kind not in KINDS:
        raise BadInputError(f"a faiss code is one of {', '.join(KINDS)}, got {kind!r}")
    budget = int(budget)
    if kind in ("pq", "opq"):
        if budget < 1 or budget > n_features:
            raise BadInputError(f"a {kind} code of {n_features} features takes 1 to {n_features} bytes, not {budget}")
        return n_features - n_features % budget, budget
    if kind in ("sq4", "sq8"):
        per_byte = 2 if kind == "sq4" else 1
        if budget < 1:
            raise BadInputError(f"a budget of {budget} bytes is below the smallest {kind} code (1 byte)")
        return min(n_features, per_byte * budget), 0
    bits = int(kind[len("rabitq") :])
    fixed = _index_for(kind, 8, 0).code_size - bits  # the per-vector factors, besides 8 dims' bits
    dims = min(n_features, ((budget - fixed) * 8) // bits)
    if dims < 1:
        raise BadInputError(f"a budget of {budget} bytes is below the smallest {kind} code ({fixed + 1} bytes)")
    return dims, 0


class FaissCode(Codec):
    """A faiss code over the centred (and possibly projected) vectors; built by :func:`train_faiss`."""

    family = "faiss"

    def __init__(
        self,
        kind: str,
        mean: npt.ArrayLike,
        basis: npt.ArrayLike | None,
        index_bytes: npt.ArrayLike,
        *,
        budget: int,
        training: dict[str, Any],
    ) -> None:
        if kind not in KINDS:
            raise BadInputError(f"a faiss code is one of {', '.join(KINDS)}, got {kind!r}")
        self.kind = kind
        self.mean = np.asarray(mean, dtype=np.float64).reshape(-1)
        self.basis = None if basis is None else np.ascontiguousarray(basis, dtype=np.float32)
        self.index_bytes = np.ascontiguousarray(index_bytes, dtype=np.uint8).reshape(-1)
        self.budget = int(budget)
        self.training = dict(training)
        self._index = _faiss().deserialize_index(self.index_bytes)
        dim = self.n_features if self.basis is None else self.basis.shape[1]
        if self._index.d != dim or (self.basis is not None and self.basis.shape[0] != self.n_features):
            raise BadInputError(f"a faiss {kind} code whose index ({self._index.d} dims) does not fit its map")
        self._mean32 = self.mean.astype(np.float32)

    @property
    def n_features(self) -> int:
        return int(self.mean.shape[0])

    @property
    def bytes_per_vector(self) -> int:
        return int(self._index.sa_code_size())

    @property
    def label(self) -> str:
        return f"faiss-{self.kind}-{self.bytes_per_vector}B"

    def _mapped(self, rows: np.ndarray, centre: bool = True) -> npt.NDArray[np.float32]:
        shifted = np.subtract(rows, self._mean32, dtype=np.float32) if centre else rows.astype(np.float32)
        return np.ascontiguousarray(shifted if self.basis is None else shifted @ self.basis)

    def encode(self, block: npt.ArrayLike) -> npt.NDArray[np.uint8]:
        codes: npt.NDArray[np.uint8] = self._index.sa_encode(self._mapped(self.check_rows(block)))
        return codes

    def decode(self, codes: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """The vectors the code rows stand for (for a code of unit vectors, scaled to unit length)."""
        approx = self._index.sa_decode(np.ascontiguousarray(self.check_codes(codes)))
        back = approx if self.basis is None else approx @ self.basis.T
        out: npt.NDArray[np.float32] = (back + self._mean32).astype(np.float32)
        if self.unit:
            norms = np.linalg.norm(out, axis=1, keepdims=True)
            np.divide(out, norms, out=out, where=norms > 0)
        return out

    def searcher(self, codes: npt.ArrayLike) -> tuple[Any, Any]:
        """A faiss index holding the code rows, and the transform (or None) queries go through first."""
        faiss = _faiss()
        index = faiss.deserialize_index(self.index_bytes)
        transform = None
        if isinstance(index, faiss.IndexPreTransform):
            outer = index
            transform = faiss.downcast_VectorTransform(outer.chain.at(0))
            index = faiss.downcast_index(outer.index)
            # the outer index owns both: keep it alive while they are used
            index.referenced_objects = [outer]
            transform.referenced_objects = [outer]
        index.add_sa_codes(np.ascontiguousarray(self.check_codes(codes)))
        return index, transform

    @property
    def unit(self) -> bool:
        """Whether the code is of unit vectors, searched by faiss's L2 distance (see :func:`train_faiss`)."""
        return bool(self._index.metric_type == _faiss().METRIC_L2)

    def search(self, queries: npt.ArrayLike, codes: npt.ArrayLike, k: int) -> tuple[np.ndarray, np.ndarray]:
        """faiss's top ``k`` (estimates of ``<q, x>``, rows) of the queries over the code rows.

        For a code of unit vectors faiss ranks by the squared distance ``D`` of the centred, mapped query
        to the decoded row, and ``||q - x||^2 = ||q||^2 + 1 - 2 <q, x>`` turns it into the estimate
        ``(||q||^2 + 1 - D - r) / 2``, ``r`` the query's centred part the projection drops (0 where all
        dimensions are kept; the rows' own dropped part is taken as 0)."""
        q = self.check_rows(queries, "queries")
        index, transform = self.searcher(codes)
        if self.unit:
            centred = q.astype(np.float64) - self.mean
            mapped = self._mapped(q)
            if transform is not None:  # OPQ's rotation keeps lengths
                mapped = transform.apply(mapped)
            distances, rows = index.search(mapped, int(k))
            dropped = np.einsum("ij,ij->i", centred, centred) - np.einsum("ij,ij->i", mapped, mapped, dtype=np.float64)
            lengths = np.einsum("ij,ij->i", q, q, dtype=np.float64)
            scores = 0.5 * ((lengths + 1.0 - np.maximum(dropped, 0.0))[:, None] - distances)
            return np.where(rows >= 0, scores, -np.inf).astype(np.float32), rows.astype(np.int64)
        mapped = self._mapped(q, centre=False)
        if transform is not None:
            mapped = transform.apply(mapped)
        scores, rows = index.search(mapped, int(k))
        return scores + (q @ self.mean).astype(np.float32)[:, None], rows.astype(np.int64)

    def inner_products(self, queries: npt.ArrayLike, codes: npt.ArrayLike) -> npt.NDArray[np.float32]:
        n = self.check_codes(codes).shape[0]
        scores, rows = self.search(queries, codes, n)
        out = np.full((scores.shape[0], n), np.nan, dtype=np.float32)
        np.put_along_axis(out, np.where(rows < 0, 0, rows), scores, axis=1)
        return out

    def _parts(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        record: dict[str, Any] = {
            "kind": self.kind,
            "budget": self.budget,
            "training": self.training,
            "projected": self.basis is not None,
        }
        arrays: dict[str, np.ndarray] = {"mean": self.mean, "index": self.index_bytes}
        if self.basis is not None:
            arrays["basis"] = self.basis
        return record, arrays

    @classmethod
    def _from_parts(cls, record: dict[str, Any], arrays: dict[str, np.ndarray]) -> FaissCode:
        return cls(
            str(record["kind"]),
            arrays["mean"],
            arrays.get("basis"),
            arrays["index"],
            budget=int(record["budget"]),
            training=dict(record.get("training") or {}),
        )


def train_faiss(
    kind: str,
    mean: npt.ArrayLike,
    covariance: npt.ArrayLike,
    budget: int,
    sample: npt.ArrayLike,
    *,
    seed: int = 0,
    sample_seed: int | None = None,
    iterations: int = 25,
    opq_iterations: int = 50,
    opq_initial_iterations: int | None = None,
    unit: bool = False,
) -> FaissCode:
    """The faiss ``kind`` code of at most ``budget`` bytes a vector, trained on ``sample`` (rows of the
    vectors) after centring on ``mean`` and, where it keeps fewer dimensions, projecting on the leading
    principal axes of ``covariance``. ``seed`` seeds faiss's k-means; ``sample_seed`` (recorded) is the
    seed the sample was drawn with, where the caller drew it; ``iterations`` of k-means per codebook and
    ``opq_iterations`` of OPQ (faiss's defaults), both recorded; ``opq_initial_iterations``: k-means
    iterations of OPQ's first PQ (None: faiss's 40), recorded when given. ``unit``: the vectors have unit
    length, so the index ranks by L2 distance (which for them ranks as cosine, as faiss's own indexes of
    unit vectors do), not by the inner product with the decoded vector, whose length errors swamp it."""
    centre = np.asarray(mean, dtype=np.float64).reshape(-1)
    d = centre.shape[0]
    dims, sub = layout_for(kind, d, budget)
    rows = np.asarray(sample, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != d or rows.shape[0] < 2 or not np.all(np.isfinite(rows)):
        raise BadInputError(f"a faiss code trains on finite rows of {d} values, got shape {rows.shape}")
    basis = None
    if dims < d or kind.startswith("rabitq") or kind.startswith("sq"):
        _, vectors = principal_axes(covariance)
        basis = vectors[:, :dims]
    index = _index_for(kind, dims, sub, l2=unit)
    inner = index.index if kind == "opq" else index
    if kind in ("pq", "opq"):
        clustering = _faiss().downcast_index(inner).pq.cp
        clustering.seed, clustering.niter = int(seed), int(iterations)
        clustering.min_points_per_centroid = 1  # faiss warns below 39 a centroid; the result is the same
    opq_pq = None
    if kind == "opq":
        rotation = _faiss().downcast_VectorTransform(index.chain.at(0))
        rotation.niter = int(opq_iterations)
        if opq_initial_iterations is not None:
            rotation.niter_pq_0 = int(opq_initial_iterations)
        # OPQ's own PQ as faiss makes it (seed and all), only without the warning; kept alive while it trains
        opq_pq = _faiss().ProductQuantizer(dims, sub, 8)
        opq_pq.cp.min_points_per_centroid = 1
        rotation.pq = opq_pq
    centred = (rows - centre).astype(np.float32)
    index.train(np.ascontiguousarray(centred if basis is None else centred @ basis.astype(np.float32)))
    if opq_pq is not None:
        _faiss().downcast_VectorTransform(index.chain.at(0)).pq = None  # it does not outlive this call
    training: dict[str, Any] = {
        "sample_rows": int(rows.shape[0]),
        "seed": int(seed),
        "faiss": str(_faiss().__version__),
    }
    if kind in ("pq", "opq"):
        training["kmeans_iterations"] = int(iterations)
    if kind == "opq":
        training["opq_iterations"] = int(opq_iterations)
        if opq_initial_iterations is not None:
            training["opq_initial_iterations"] = int(opq_initial_iterations)
    if sample_seed is not None:
        training["sample_seed"] = int(sample_seed)
    blob = _faiss().serialize_index(index)
    code = FaissCode(kind, centre, basis, blob, budget=int(budget), training=training)
    if code.bytes_per_vector > int(budget):
        raise BadInputError(f"a faiss {kind} code of {code.bytes_per_vector} bytes exceeds the budget of {budget}")
    return code


__all__ = [
    "KINDS",
    "PQ_TABLE_BYTES",
    "FaissCode",
    "faiss_available",
    "layout_for",
    "one_omp_thread",
    "pq_batches",
    "train_faiss",
]
