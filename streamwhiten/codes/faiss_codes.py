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

import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import BadInputError
from .base import UNIT_SLACK, Codec, field_error, flag, orthonormal_columns, real_array, sample_too_small, whole
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

#: Bits of a PQ sub-space's code, and its centroids.
PQ_BITS = 8
PQ_CENTROIDS = 2**PQ_BITS


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


#: The largest magnitude a trained value of a code of unit vectors takes: an SQ range of coordinates in [-2, 2].
UNIT_EXTENT = 4.0

#: Bytes of the distance tables faiss's product quantizers make at once when they encode rows (faiss's own
#: batches, 262,144 rows, take 6 GiB at 24 bytes a code: every row's table of 256 centroids per byte).
PQ_TABLE_BYTES = 16 << 20


@contextmanager
def pq_batches(max_bytes_per_code: int) -> Iterator[None]:
    """faiss's product quantizers encode rows (for OPQ's training too) in batches whose distance tables
    (rows x 256 x bytes per code, float32) stay within `PQ_TABLE_BYTES` for codes of up to
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


def smallest_sample(kind: str) -> int:
    """The fewest sample rows the faiss ``kind`` code trains on: one per k-means centroid for PQ and
    OPQ's PQ (`PQ_CENTROIDS`), else 2 (a mean and a spread)."""
    return PQ_CENTROIDS if kind in ("pq", "opq") else 2


def _index_for(kind: str, dim: int, n_bytes: int, l2: bool = False) -> Any:
    """An untrained faiss index (inner product, or ``l2`` distance) of ``kind`` over ``dim`` values,
    ``n_bytes`` of PQ code."""
    faiss = _faiss()
    metric = faiss.METRIC_L2 if l2 else faiss.METRIC_INNER_PRODUCT
    if kind == "pq":
        return faiss.IndexPQ(dim, n_bytes, PQ_BITS, metric)
    if kind == "opq":
        return faiss.IndexPreTransform(faiss.OPQMatrix(dim, n_bytes), faiss.IndexPQ(dim, n_bytes, PQ_BITS, metric))
    if kind.startswith("rabitq"):
        return faiss.IndexRaBitQ(dim, metric, int(kind[len("rabitq") :]))
    quantizer = faiss.ScalarQuantizer.QT_4bit if kind == "sq4" else faiss.ScalarQuantizer.QT_8bit
    return faiss.IndexScalarQuantizer(dim, quantizer, metric)


@functools.lru_cache(maxsize=4096)
def faiss_bytes(kind: str, dims: int, sub: int = 0) -> int:
    """Bytes of one ``kind`` code row over ``dims`` values (``sub`` PQ sub-quantisers), as faiss reports
    them: the ``sa_code_size`` of the index `train_faiss` builds, made untrained (faiss fixes a
    code's size when it makes the index), per-vector factors included (RaBitQ's). The family's one size:
    `FaissCode.bytes_per_vector` reads the same number off the trained index."""
    return int(_index_for(kind, int(dims), int(sub)).sa_code_size())


def layout_for(kind: str, n_features: int, budget: int) -> tuple[int, int]:
    """``(dimensions kept, PQ sub-quantisers)`` of the ``kind`` code that fits ``budget`` bytes, the most
    dimensions it can, its bytes (`faiss_bytes`) within the budget; `BadInputError` below
    the smallest such code."""
    if kind not in KINDS:
        raise BadInputError(f"a faiss code is one of {', '.join(KINDS)}, got {kind!r}")
    budget = int(budget)
    if kind in ("pq", "opq"):
        if budget < 1 or budget > n_features:
            raise BadInputError(f"a {kind} code of {n_features} features takes 1 to {n_features} bytes, not {budget}")
        return n_features - n_features % budget, budget
    smallest = faiss_bytes(kind, 1)
    if budget < smallest:
        raise BadInputError(f"a budget of {budget} bytes is below the smallest {kind} code ({smallest} bytes)")
    low, high = 1, int(n_features)  # the most dims whose code fits: faiss's size grows with the dims
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if faiss_bytes(kind, middle) <= budget else (low, middle - 1)
    return low, 0


class FaissCode(Codec):
    """A faiss code over the centred (and possibly projected) vectors; built by `train_faiss`."""

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
        self._index = _read_index(self.index_bytes)
        dim = self.n_features if self.basis is None else self.basis.shape[1]
        if self._index.d != dim or (self.basis is not None and self.basis.shape[0] != self.n_features):
            raise BadInputError(f"a faiss {kind} code whose index ({self._index.d} dims) does not fit its map")
        self._mean32 = self.mean.astype(np.float32)
        #: The largest magnitude of the index's trained values (set by `check_index`; 0 until checked).
        self.trained_extent = 0.0

    @property
    def n_features(self) -> int:
        return int(self.mean.shape[0])

    def unit_scale_problem(self) -> tuple[str, str] | None:
        """`Codec.unit_scale_problem`, and trained values (codebooks, ranges, centre, rotation) beyond
        what any training on centred unit vectors writes: each coordinate of such a vector, and so of a
        centroid, lies within 2, a range within 4 (`UNIT_EXTENT`)."""
        found = super().unit_scale_problem()
        if found is None and self.trained_extent > UNIT_EXTENT * (1.0 + UNIT_SLACK):
            found = (
                "index",
                f"holds a trained value of {self.trained_extent:.6g}, beyond the {UNIT_EXTENT} of unit vectors",
            )
        return found

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
        """Whether the code is of unit vectors, searched by faiss's L2 distance (see `train_faiss`)."""
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
        """The code the byte form describes, every field checked first (`check_parts`), its faiss
        index deserialized and checked to be the one the record names (`check_index`)."""
        check_parts(record, arrays)
        code = cls(
            str(record["kind"]),
            arrays["mean"],
            arrays.get("basis"),
            arrays["index"],
            budget=record["budget"],
            training=dict(record.get("training") or {}),
        )
        check_index(code)
        return code


def check_parts(record: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Refuse a faiss code's byte form that no training could have written, naming the field
    (`field_error`): a kind not in `KINDS`, a budget no code of its width fits, a mean
    or basis that is not finite, a basis without orthonormal columns or not of the layout the kind and
    budget give (`layout_for`), or index bytes that faiss cannot read."""
    kind = record.get("kind")
    if kind not in KINDS:
        raise field_error("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    budget = whole(record, "budget", 1)
    projected = flag(record, "projected")
    if not isinstance(record.get("training") or {}, dict):
        raise field_error("training", f"must be a JSON object, got {record.get('training')!r}")
    if set(arrays) != {"mean", "index"} | ({"basis"} if projected else set()):
        raise field_error("arrays", f"must be mean, index{', basis' if projected else ''}, got {sorted(arrays)}")
    mean = real_array(arrays, "mean", 1)
    real_array(arrays, "index", 1, kind="u")
    try:
        dims, _ = layout_for(kind, mean.shape[0], budget)
    except BadInputError as exc:
        raise field_error("budget", f"fits no {kind} code of {mean.shape[0]} values ({exc})") from None
    wanted = dims < mean.shape[0] or kind.startswith(("rabitq", "sq"))  # as train_faiss projects
    if projected != wanted:
        raise field_error("projected", f"is {projected}, but a {kind} code of {budget} bytes is {wanted}")
    if projected:
        basis = real_array(arrays, "basis", 2)
        if basis.shape != (mean.shape[0], dims):
            raise field_error("basis", f"has shape {basis.shape}, but a {kind} code of {budget} bytes keeps {dims}")
        orthonormal_columns(basis)


def _read_index(blob: np.ndarray) -> Any:
    """faiss's index of the serialized ``blob``; `field_error` for bytes faiss cannot read."""
    faiss = _faiss()
    try:
        return faiss.deserialize_index(blob)
    except (RuntimeError, MemoryError, ValueError, TypeError) as exc:
        detail = re.sub(r"^Error in .*? at \S+:\d+: ", "", " ".join(str(exc).split()))  # faiss's own words
        raise field_error("index", f"holds bytes faiss cannot read as an index ({detail[:120]})") from None


def check_index(code: FaissCode) -> None:
    """The deserialized index is the one the code's record names: its kind (PQ of the budget's
    sub-quantisers and 8-bit codebooks, OPQ before it, RaBitQ of the kind's bits, SQ of its width), its
    width, trained, empty, ranking by inner product or L2, code rows within the budget, and every trained
    value finite; `field_error` naming ``index`` otherwise."""
    faiss = _faiss()
    index, kind = code._index, code.kind
    dims, sub = layout_for(kind, code.n_features, code.budget)
    trained: list[np.ndarray] = []  # every trained value: finite, and their extent kept (unit_scale_problem)
    inner = index
    if kind == "opq":
        if not isinstance(index, faiss.IndexPreTransform) or index.chain.size() != 1:
            raise field_error("index", "is not the OPQ rotation and PQ index an opq code holds")
        rotation = faiss.downcast_VectorTransform(index.chain.at(0))
        if not isinstance(rotation, faiss.LinearTransform) or (rotation.d_in, rotation.d_out) != (dims, dims):
            raise field_error("index", f"holds no {dims} x {dims} rotation before its PQ")
        matrix = _finite(faiss.vector_to_array(rotation.A), "its rotation").reshape(dims, dims)
        if np.abs(matrix @ matrix.T - np.eye(dims)).max() > 1e-3:  # OPQ learns a rotation
            raise field_error("index", "holds an OPQ matrix that is no rotation (its rows are not orthonormal)")
        trained.append(matrix)
        inner = faiss.downcast_index(index.index)
    expected = {"pq": faiss.IndexPQ, "opq": faiss.IndexPQ, "sq4": faiss.IndexScalarQuantizer}
    expected.update(sq8=faiss.IndexScalarQuantizer, rabitq1=faiss.IndexRaBitQ)
    expected.update(rabitq2=faiss.IndexRaBitQ, rabitq4=faiss.IndexRaBitQ)
    if type(inner) is not expected[kind]:
        raise field_error("index", f"is a faiss {type(inner).__name__}, not the index of a {kind} code")
    if index.d != dims or not index.is_trained or index.ntotal != 0:
        raise field_error(
            "index",
            f"is of {index.d} dims (trained {index.is_trained}, {index.ntotal} rows), not a trained, "
            f"empty index of the {dims} dims a {kind} code of {code.budget} bytes keeps",
        )
    if index.metric_type not in (faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2):
        raise field_error("index", f"ranks by faiss metric {index.metric_type}, neither inner product nor L2")
    if isinstance(inner, faiss.IndexPQ):
        if (inner.pq.M, inner.pq.nbits) != (sub, 8):
            raise field_error("index", f"holds {inner.pq.M} sub-quantisers of {inner.pq.nbits} bits, not {sub} of 8")
        trained.append(_finite(faiss.vector_to_array(inner.pq.centroids), "its codebooks"))
    elif isinstance(inner, faiss.IndexRaBitQ):
        if inner.rabitq.nb_bits != int(kind[len("rabitq") :]):
            raise field_error("index", f"codes {inner.rabitq.nb_bits} bits a dimension, not a {kind} code's")
        trained.append(_finite(faiss.vector_to_array(inner.center), "its centre"))
    else:
        wanted = faiss.ScalarQuantizer.QT_4bit if kind == "sq4" else faiss.ScalarQuantizer.QT_8bit
        if inner.sq.qtype != wanted:
            raise field_error("index", f"is a scalar quantiser of another width than a {kind} code's")
        trained.append(_finite(faiss.vector_to_array(inner.sq.trained), "its ranges"))
    code.trained_extent = max(float(np.abs(values).max(initial=0.0)) for values in trained)
    if not 0 < code.bytes_per_vector <= code.budget:
        raise field_error("index", f"writes rows of {code.bytes_per_vector} bytes, beyond the budget of {code.budget}")


def _finite(values: np.ndarray, what: str) -> np.ndarray:
    if not np.all(np.isfinite(values)):
        raise field_error("index", f"holds NaN or Inf in {what}")
    return values


@dataclass(frozen=True)
class FaissTraining:
    """How faiss trains a code, all recorded in the codec: ``seed`` seeds faiss's k-means; ``sample_seed``
    is the seed the sample was drawn with, where the caller drew it; ``iterations`` of k-means per codebook
    and ``opq_iterations`` of OPQ (faiss's defaults); ``opq_initial_iterations``: k-means iterations of
    OPQ's first PQ (None: faiss's 40)."""

    seed: int = 0
    sample_seed: int | None = None
    iterations: int = 25
    opq_iterations: int = 50
    opq_initial_iterations: int | None = None

    def configure(self, kind: str, index: Any, dims: int, sub: int) -> Any:
        """Set these iterations and seed on ``index`` (a ``kind`` index of ``dims`` dimensions in ``sub``
        sub-spaces); returns OPQ's own PQ, to be kept alive while it trains (else None)."""
        inner = index.index if kind == "opq" else index
        if kind in ("pq", "opq"):
            clustering = _faiss().downcast_index(inner).pq.cp
            clustering.seed, clustering.niter = int(self.seed), int(self.iterations)
            clustering.min_points_per_centroid = 1  # faiss warns below 39 a centroid; the result is the same
        if kind != "opq":
            return None
        rotation = _faiss().downcast_VectorTransform(index.chain.at(0))
        rotation.niter = int(self.opq_iterations)
        if self.opq_initial_iterations is not None:
            rotation.niter_pq_0 = int(self.opq_initial_iterations)
        # OPQ's own PQ as faiss makes it (seed and all), only without the warning
        opq_pq = _faiss().ProductQuantizer(dims, sub, PQ_BITS)
        opq_pq.cp.min_points_per_centroid = 1
        rotation.pq = opq_pq
        return opq_pq

    def record(self, kind: str, sample_rows: int) -> dict[str, Any]:
        """What the codec records of its training (the settings ``kind`` uses, and faiss's version)."""
        training: dict[str, Any] = {
            "sample_rows": sample_rows,
            "seed": int(self.seed),
            "faiss": str(_faiss().__version__),
        }
        if kind in ("pq", "opq"):
            training["kmeans_iterations"] = int(self.iterations)
        if kind == "opq":
            training["opq_iterations"] = int(self.opq_iterations)
            if self.opq_initial_iterations is not None:
                training["opq_initial_iterations"] = int(self.opq_initial_iterations)
        if self.sample_seed is not None:
            training["sample_seed"] = int(self.sample_seed)
        return training


def train_faiss(
    kind: str,
    mean: npt.ArrayLike,
    covariance: npt.ArrayLike,
    budget: int,
    sample: npt.ArrayLike,
    training: FaissTraining = FaissTraining(),
    unit: bool = False,
) -> FaissCode:
    """The faiss ``kind`` code of at most ``budget`` bytes a vector, trained on ``sample`` (rows of the
    vectors) as ``training`` says, after centring on ``mean`` and, where it keeps fewer dimensions,
    projecting on the leading principal axes of ``covariance``. ``unit``: the vectors have unit length,
    so the index ranks by L2 distance (which for them ranks as cosine, as faiss's own indexes of unit
    vectors do), not by the inner product with the decoded vector, whose length errors swamp it."""
    centre = np.asarray(mean, dtype=np.float64).reshape(-1)
    d = centre.shape[0]
    dims, sub = layout_for(kind, d, budget)
    rows = _training_rows(kind, sample, d)
    basis = None
    if dims < d or kind.startswith("rabitq") or kind.startswith("sq"):
        _, vectors = principal_axes(covariance)
        basis = vectors[:, :dims]
    index = _index_for(kind, dims, sub, l2=unit)
    if index.sa_code_size() > int(budget):  # before the training: layout_for keeps within faiss_bytes
        raise BadInputError(f"a faiss {kind} code of {index.sa_code_size()} bytes exceeds the budget of {budget}")
    opq_pq = training.configure(kind, index, dims, sub)
    centred = (rows - centre).astype(np.float32)
    try:
        index.train(np.ascontiguousarray(centred if basis is None else centred @ basis.astype(np.float32)))
    except RuntimeError as exc:  # faiss refuses its training data: the sample, not a bug of ours
        detail = re.sub(r"^Error in .*? at \S+:\d+: ", "", " ".join(str(exc).split()))
        raise BadInputError(
            f"faiss cannot train the faiss-{kind} code on this sample of {rows.shape[0]} rows ({detail})"
        ) from None
    if opq_pq is not None:
        _faiss().downcast_VectorTransform(index.chain.at(0)).pq = None  # it does not outlive this call
    blob = _faiss().serialize_index(index)
    record = training.record(kind, int(rows.shape[0]))
    return FaissCode(kind, centre, basis, blob, budget=int(budget), training=record)


def _training_rows(kind: str, sample: npt.ArrayLike, d: int) -> np.ndarray:
    """``sample`` as float64 rows, refused unless finite, ``d`` wide and as many as ``kind`` trains on."""
    rows = np.asarray(sample, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != d or not np.all(np.isfinite(rows)):
        raise BadInputError(f"a faiss code trains on finite rows of {d} values, got shape {rows.shape}")
    if rows.shape[0] < smallest_sample(kind):
        why = (
            f"its k-means trains {PQ_CENTROIDS} centroids a codebook"
            if kind in ("pq", "opq")
            else "it learns the spread of its values"
        )
        raise sample_too_small(f"faiss-{kind}", smallest_sample(kind), rows.shape[0], why)
    return rows


__all__ = [
    "KINDS",
    "PQ_BITS",
    "PQ_CENTROIDS",
    "PQ_TABLE_BYTES",
    "UNIT_EXTENT",
    "FaissCode",
    "FaissTraining",
    "check_index",
    "check_parts",
    "faiss_available",
    "faiss_bytes",
    "layout_for",
    "one_omp_thread",
    "pq_batches",
    "smallest_sample",
    "train_faiss",
]
