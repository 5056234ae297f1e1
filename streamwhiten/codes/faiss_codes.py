"""faiss's codes as codecs, through faiss itself: PQ, OPQ + PQ, RaBitQ (1, 2 or 4 bits), SQ4, SQ8.

The vectors are centred on the exact mean and, where the code keeps fewer dimensions, projected on the
leading principal axes; faiss trains on a sample of those (size and seed recorded) and encodes with
``sa_encode``. The trained index travels as ``faiss.serialize_index`` bytes in the codec's checksummed
byte form; a search adds the code rows to a copy (``add_sa_codes``) and lets faiss scan them. faiss is
imported where it is used (``pip install faiss-cpu``).
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
from .base import UNIT_SLACK, Codec, field_error, flag, orthonormal_columns, real_array, whole
from .linear import principal_axes, sample_rows

#: The faiss codes: PQ and OPQ + PQ (8-bit codebooks), RaBitQ (1, 2 or 4 bits a dimension), SQ (4 or 8 bits).
KINDS = ("pq", "opq", "rabitq1", "rabitq2", "rabitq4", "sq4", "sq8")

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
    """faiss's OpenMP held to one thread for the duration, where codes train or search in threads of their own."""
    faiss = _faiss()
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


#: The largest magnitude a trained value of a code of unit vectors takes: an SQ range of coordinates in [-2, 2].
UNIT_EXTENT = 4.0

#: Bytes of the distance tables faiss's product quantizers make at once when encoding (its own batches
#: take 6 GiB at 24 bytes a code).
PQ_TABLE_BYTES = 16 << 20


@contextmanager
def pq_batches(max_bytes_per_code: int) -> Iterator[None]:
    """faiss's product quantizers encode in batches whose distance tables stay within `PQ_TABLE_BYTES` for
    codes of up to ``max_bytes_per_code`` bytes, for the duration; the batches bound memory, not the codes."""
    faiss = _faiss()
    before = int(faiss.cvar.product_quantizer_compute_codes_bs)
    rows = max(64, PQ_TABLE_BYTES // (256 * 4 * max(1, int(max_bytes_per_code))))
    faiss.cvar.product_quantizer_compute_codes_bs = min(before, rows)
    try:
        yield
    finally:
        faiss.cvar.product_quantizer_compute_codes_bs = before


def smallest_sample(kind: str) -> int:
    """The fewest sample rows a ``kind`` code trains on: a k-means centroid's worth for PQ and OPQ, else 2."""
    return PQ_CENTROIDS if kind in ("pq", "opq") else 2


def _index_for(kind: str, dim: int, n_bytes: int, l2: bool = False) -> Any:
    """An untrained ``kind`` index (inner product, or ``l2``) over ``dim`` values, ``n_bytes`` of PQ code."""
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
    """Bytes of a ``kind`` code row over ``dims`` values (``sub`` PQ sub-quantisers): faiss's ``sa_code_size``
    of the untrained index, per-vector factors included; the family's one size."""
    return int(_index_for(kind, int(dims), int(sub)).sa_code_size())


def layout_for(kind: str, n_features: int, budget: int) -> tuple[int, int]:
    """``(dimensions kept, PQ sub-quantisers)`` of the widest ``kind`` code within ``budget``; else `BadInputError`."""
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
        """`Codec.unit_scale_problem`, and trained values beyond the `UNIT_EXTENT` of centred unit vectors."""
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

    @property
    def unit(self) -> bool:
        """Whether the code is of unit vectors, searched by faiss's L2 distance (see `train_faiss`)."""
        return bool(self._index.metric_type == _faiss().METRIC_L2)

    def search(self, queries: npt.ArrayLike, codes: npt.ArrayLike, k: int) -> tuple[np.ndarray, np.ndarray]:
        """faiss's top ``k`` (estimates of ``<q, x>``, rows). A unit code's squared distance ``D`` becomes
        ``(||q||^2 + 1 - D - r) / 2``, ``r`` the query's centred part the projection drops."""
        q = self.check_rows(queries, "queries")
        faiss = _faiss()
        index = faiss.deserialize_index(self.index_bytes)
        mapped = self._mapped(q, centre=self.unit)
        if isinstance(index, faiss.IndexPreTransform):  # OPQ: its rotation (which keeps lengths), then its PQ
            outer = index
            index = faiss.downcast_index(outer.index)
            index.referenced_objects = [outer]  # the outer index owns it: kept alive while it is used
            mapped = faiss.downcast_VectorTransform(outer.chain.at(0)).apply(mapped)
        index.add_sa_codes(np.ascontiguousarray(self.check_codes(codes)))
        scores, rows = index.search(mapped, int(k))
        if not self.unit:
            return scores + (q @ self.mean).astype(np.float32)[:, None], rows.astype(np.int64)
        centred = q.astype(np.float64) - self.mean
        dropped = np.einsum("ij,ij->i", centred, centred) - np.einsum("ij,ij->i", mapped, mapped, dtype=np.float64)
        lengths = np.einsum("ij,ij->i", q, q, dtype=np.float64)
        scores = 0.5 * ((lengths + 1.0 - np.maximum(dropped, 0.0))[:, None] - scores)
        return np.where(rows >= 0, scores, -np.inf).astype(np.float32), rows.astype(np.int64)

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
        """The code the byte form describes, checked (`check_parts`, then `check_index`)."""
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
    """Refuse, naming the field (`field_error`), a faiss code's byte form no training could write: an
    unknown kind, a budget no code fits, arrays not finite, a basis not orthonormal or not of `layout_for`."""
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
    """The deserialized index is the one the record names (kind, width, trained, empty, inner product or L2,
    rows within the budget, trained values finite); `field_error` naming ``index`` otherwise."""
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
    other = faiss.IndexRaBitQ if kind.startswith("rabitq") else faiss.IndexScalarQuantizer
    if type(inner) is not (faiss.IndexPQ if kind in ("pq", "opq") else other):
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
    """How faiss trains a code (recorded in the codec): k-means ``seed``, the sample's ``sample_seed``,
    ``iterations`` per codebook, ``opq_iterations``, and ``opq_initial_iterations`` (None: faiss's 40)."""

    seed: int = 0
    sample_seed: int | None = None
    iterations: int = 25
    opq_iterations: int = 50
    opq_initial_iterations: int | None = None

    def configure(self, kind: str, index: Any, dims: int, sub: int) -> Any:
        """Set these on ``index``; returns OPQ's own PQ, kept alive while it trains (else None)."""
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
        """What the codec records of its training (the settings ``kind`` uses, faiss's version)."""
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
    """The faiss ``kind`` code of at most ``budget`` bytes a vector, trained on ``sample`` as ``training``
    says. ``unit``: unit vectors, ranked by L2 distance (as cosine), not by the inner product with the
    decoded vector, whose length errors swamp it."""
    centre = np.asarray(mean, dtype=np.float64).reshape(-1)
    d = centre.shape[0]
    dims, sub = layout_for(kind, d, budget)
    pq = kind in ("pq", "opq")
    why = f"its k-means trains {PQ_CENTROIDS} centroids a codebook" if pq else "it learns the spread of its values"
    rows = sample_rows(sample, d, "a faiss code trains on", (f"faiss-{kind}", smallest_sample(kind), why))
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
