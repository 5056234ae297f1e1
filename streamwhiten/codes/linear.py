"""The tool's own codes: a linear map of the centred vectors, per-component quantisers, an optional correction.

Every code is ``z = (x - mean) @ basis`` (orthonormal columns), then component ``j`` quantised to
``bits[j]`` bits, ``c = clip(floor(z / step + 2^(b-1)), 0, 2^b - 1)``, standing for the level
``(c + 1/2 - 2^(b-1)) * step`` (mid-rise uniform). The families differ in the basis and the bits:
``eigen`` (principal axes, bits by eigenvalue under the budget, `allocate_bits`, equal-bit components
turned by a seeded random rotation), ``bits-random`` (sign bits of the leading principal subspace turned
by a seeded rotation), ``bits-itq`` (turned by ITQ, Gong & Lazebnik, learnt on a sample) and ``bits-pca``
(sign bits of the principal components, as ``--dtype binary``).

The optional correction ``f = ||x - mean||^2 / <xhat, x - mean>`` (``xhat = basis @ levels``, stored as
float16 after the code bits) makes the decoded vector's error orthogonal to it (as RaBitQ does), so the
estimate ``<q, mean> + f <q @ basis, levels>`` of ``<q, x>`` does not shrink towards zero.

A code of **unit** vectors (``unit=True``: the tool's outputs) stands for ``xhat / ||xhat||``: the
quantiser's error along the vector, which a large common mean carries into every score, is dropped at no
cost in bytes (``benchmarks/codes_frontier.py`` measures both choices). Every level is linear in the
code's bits, so an estimate is a sum of one 256-entry table per code byte (`LinearCode.lookup_tables`).

Bit layout: component ``j`` takes bits ``offset[j] .. offset[j] + bits[j] - 1`` of the row's bit stream,
least significant first; bit ``t`` is bit ``t % 8`` of byte ``t // 8`` (numpy's ``bitorder="little"``).
"""

from __future__ import annotations

import copy
import functools
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from ..core.eigen import eigendecomposition
from ..core.finite import raise_if_nonfinite
from ..errors import BadInputError
from .base import (
    NOT_CODABLE,
    UNIT_SLACK,
    Codec,
    field_error,
    flag,
    orthonormal_columns,
    real_array,
    sample_too_small,
    whole,
)

#: The most bits a component gets.
MAX_BITS = 8
#: The fewest sample rows ITQ learns its rotation from.
ITQ_SMALLEST_SAMPLE = 2
#: Bytes of the per-vector correction (float16).
CORRECTION_BYTES = 2
#: The kinds of linear code and their rotations.
KINDS = ("eigen", "bits-random", "bits-itq", "bits-pca")
#: Component values projected per product (`LinearCode.project`): they stay in cache, and every encoder
#: cuts the rows alike, so a BLAS summing differently by product height never makes their bytes differ.
PROJECT_VALUES = 1 << 16
# The arrays of a linear code's byte form, in the constructor's order.
_ARRAYS = ("mean", "basis", "bits", "step")


@functools.cache
def gaussian_quantizer(bits: int) -> tuple[float, float]:
    """``(step, mse)`` of the ``2^bits``-level mid-rise uniform quantiser with the least mean squared error
    on a standard normal variable (golden-section search); ``mse``: the variance fraction left (0.363 at 1 bit)."""
    if bits == 0:
        return 0.0, 1.0
    grid = np.linspace(-9.0, 9.0, 36001)
    weight = np.exp(-0.5 * grid**2) * (grid[1] - grid[0]) / math.sqrt(2 * math.pi)
    levels = 2**bits

    def error(step: float) -> float:
        code = np.clip(np.floor(grid / step + levels / 2), 0, levels - 1)
        return float(np.sum((grid - (code + 0.5 - levels / 2) * step) ** 2 * weight))

    low, high = 1e-3, 4.0
    ratio = (math.sqrt(5) - 1) / 2
    a, b = high - ratio * (high - low), low + ratio * (high - low)
    fa, fb = error(a), error(b)
    for _ in range(80):
        if fa < fb:
            high, b, fb = b, a, fa
            a = high - ratio * (high - low)
            fa = error(a)
        else:
            low, a, fa = a, b, fb
            b = low + ratio * (high - low)
            fb = error(b)
    step = (low + high) / 2
    return step, error(step)


def quantizer_errors(max_bits: int = MAX_BITS) -> npt.NDArray[np.float64]:
    """The error fraction of `gaussian_quantizer` at 0..``max_bits`` bits."""
    return np.array([gaussian_quantizer(b)[1] for b in range(max_bits + 1)])


def allocate_bits(importance: npt.ArrayLike, total_bits: int, max_bits: int = MAX_BITS) -> npt.NDArray[np.int64]:
    """Bits per component (0..``max_bits``, at most ``total_bits`` in all) minimising
    ``sum_j importance[j] * mse(bits[j])``: the errors are convex in the bits, so giving each bit to the
    component whose error drops most is optimal (marginal allocation, Fox 1966); ties go to the lower one."""
    weights = np.asarray(importance, dtype=np.float64)
    errors = quantizer_errors(max_bits)
    bits = np.zeros(weights.shape[0], dtype=np.int64)
    gain = weights * (errors[0] - errors[1])
    for _ in range(min(int(total_bits), max_bits * weights.shape[0])):
        j = int(np.argmax(gain))
        if not gain[j] > 0:
            break
        bits[j] += 1
        gain[j] = weights[j] * (errors[bits[j]] - errors[bits[j] + 1]) if bits[j] < max_bits else -np.inf
    return bits


def principal_axes(covariance: npt.ArrayLike) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Eigenvalues (descending, floored at 0) and eigenvectors of a covariance by the model's own
    `eigendecomposition`, so a code's axes are the model's basis on every machine."""
    sigma = np.asarray(covariance, dtype=np.float64)
    if sigma.ndim != 2 or sigma.shape[0] != sigma.shape[1] or not np.all(np.isfinite(sigma)):
        raise BadInputError(f"a codec trains from a finite square covariance, got shape {sigma.shape}")
    return eigendecomposition((sigma + sigma.T) / 2)


def random_rotation(size: int, seed: int) -> npt.NDArray[np.float64]:
    """A random orthogonal ``size x size`` matrix (Haar measure: QR of a Gaussian matrix, signs fixed)."""
    gaussian = np.random.default_rng(seed).standard_normal((size, size))
    q, r = np.linalg.qr(gaussian)
    return q * np.sign(np.diag(r))


def itq_rotation(projected: npt.NDArray[np.float64], seed: int, iterations: int = 50) -> npt.NDArray[np.float64]:
    """ITQ's rotation for the centred, projected rows: alternate ``B = sign(V R)`` and the Procrustes
    ``R = P Q^T`` of ``V^T B = P S Q^T``, from a seeded random rotation."""
    rotation = random_rotation(projected.shape[1], seed)
    for _ in range(iterations):
        signs = np.where(projected @ rotation >= 0, 1.0, -1.0)
        left, _, right = np.linalg.svd(projected.T @ signs)
        rotation = left @ right
    return rotation


def linear_bytes(n_bits: int, correction: bool) -> int:
    """Bytes of a row of ``n_bits`` code bits (8 a byte) and any correction: the family's one size."""
    return -(-int(n_bits) // 8) + (CORRECTION_BYTES if correction else 0)


def eigen_bits(n_features: int, budget: int, correction: bool, max_bits: int = MAX_BITS) -> int:
    """The code bits `train_eigen` shares out for ``budget`` bytes (8 a byte after the correction's, at
    most ``max_bits`` a component); `BadInputError` below the smallest code."""
    smallest = 1 + (CORRECTION_BYTES if correction else 0)
    if int(budget) < smallest:
        raise BadInputError(f"a budget of {budget} bytes is below the smallest eigen code ({smallest} bytes)")
    return min(8 * (int(budget) - smallest + 1), int(max_bits) * int(n_features))


def sign_bits(n_features: int, budget: int, correction: bool, kind: str = "bits") -> int:
    """The sign bits of a ``kind`` code of ``budget`` bytes; `BadInputError` below the smallest or past d bits."""
    spare = CORRECTION_BYTES if correction else 0
    n_bits = 8 * (int(budget) - spare)
    if n_bits < 8:
        raise BadInputError(f"a budget of {budget} bytes is below the smallest {kind} code ({1 + spare} bytes)")
    if n_bits > n_features:
        raise BadInputError(
            f"{n_features} features hold at most {n_features // 8 + spare} bytes of sign bits, not {budget} "
            "(take an eigen code)"
        )
    return n_bits


class LinearCode(Codec):
    """A linear map, uniform quantisers and an optional correction (module text); see `train_eigen`."""

    family = "linear"

    def __init__(
        self,
        kind: str,
        mean: npt.ArrayLike,
        basis: npt.ArrayLike,
        bits: npt.ArrayLike,
        step: npt.ArrayLike,
        *,
        correction: bool,
        budget: int,
        training: dict[str, Any] | None = None,
    ) -> None:
        if kind not in KINDS:
            raise BadInputError(f"a linear code's kind is one of {', '.join(KINDS)}, got {kind!r}")
        self.kind = kind
        self.mean = np.asarray(mean, dtype=np.float64).reshape(-1)
        self.basis = np.ascontiguousarray(basis, dtype=np.float32)
        self.bits = np.asarray(bits, dtype=np.int64).reshape(-1)
        self.step = np.asarray(step, dtype=np.float64).reshape(-1)
        self.correction = bool(correction)
        #: Whether the code is of unit vectors (set by `with_unit`; see the module's text).
        self.unit = False
        self.budget = int(budget)
        self.training = dict(training or {})
        m = self.bits.shape[0]
        if (
            self.basis.ndim != 2
            or self.basis.shape != (self.mean.shape[0], m)
            or self.step.shape != (m,)
            or m == 0
            or np.any((self.bits < 1) | (self.bits > MAX_BITS))
            or not np.all(self.step > 0)
            or not all(np.isfinite(values).all() for values in (self.step, self.basis, self.mean))
        ):
            raise BadInputError(f"an inconsistent {kind} code (basis, bits or steps do not agree)")
        #: Components kept (given at least one bit).
        self.n_components = m
        self.offsets = np.concatenate([[0], np.cumsum(self.bits)[:-1]]).astype(np.int64)
        self.total_bits = int(self.bits.sum())
        self.code_bytes = linear_bytes(self.total_bits, correction=False)
        self._half = 2.0 ** (self.bits - 1)
        self._component_of_bit = np.repeat(np.arange(m), self.bits)
        self._shift_of_bit = (np.arange(self.total_bits) - self.offsets[self._component_of_bit]).astype(np.uint8)
        #: ``mean @ basis``: the components' shift (float32, as encoded) and the mean's part of a length
        self._mean_along = self.mean @ self.basis.astype(np.float64)
        self._shift32 = self._mean_along.astype(np.float32)

    @property
    def n_features(self) -> int:
        return int(self.mean.shape[0])

    @property
    def bytes_per_vector(self) -> int:
        return linear_bytes(self.total_bits, correction=self.correction)

    @property
    def label(self) -> str:
        return f"{self.kind}{'+f' if self.correction else ''}-{self.bytes_per_vector}B"

    @property
    def block_rows(self) -> int:
        """Rows per product of `project` (`PROJECT_VALUES` components)."""
        return max(64, PROJECT_VALUES // self.n_components)

    def project_into(self, rows: np.ndarray, out: npt.NDArray[np.float32]) -> None:
        """``out = rows @ basis`` (float32, uncentred) for at most `block_rows` rows."""
        np.matmul(rows.astype(np.float32, copy=False), self.basis, out=out)

    def project(self, rows: np.ndarray) -> npt.NDArray[np.float32]:
        """The components ``z = x @ basis - mean @ basis`` (float32, a GEMM per `block_rows` rows);
        `NonFiniteError` naming a row that is not finite."""
        z: npt.NDArray[np.float32] = np.empty((rows.shape[0], self.n_components), dtype=np.float32)
        for r0 in range(0, rows.shape[0], self.block_rows):
            r1 = min(rows.shape[0], r0 + self.block_rows)
            self.project_into(rows[r0:r1], z[r0:r1])
        z -= self._shift32
        raise_if_nonfinite(z, "rows", suffix=NOT_CODABLE)
        return z

    def quantize(self, z: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
        """The level index of every component (n x components uint8)."""
        index = np.floor(z.astype(np.float64) / self.step + self._half)
        np.clip(index, 0, 2.0**self.bits - 1, out=index)
        return index.astype(np.uint8)

    def levels(self, index: npt.NDArray[np.uint8]) -> npt.NDArray[np.float64]:
        """The values the level indexes stand for."""
        return (index + (0.5 - self._half)) * self.step

    def encode(self, block: npt.ArrayLike) -> npt.NDArray[np.uint8]:
        rows = self.check_rows(block, finite=False)
        z = self.project(rows)
        index = self.quantize(z)
        stream = (index[:, self._component_of_bit] >> self._shift_of_bit) & 1
        packed = np.packbits(stream, axis=1, bitorder="little")
        if not self.correction:
            return packed
        out = np.empty((rows.shape[0], self.bytes_per_vector), dtype=np.uint8)
        out[:, : self.code_bytes] = packed
        out[:, self.code_bytes :] = self.corrections(rows, z, index).view(np.uint8)
        return out

    def corrections(
        self, rows: np.ndarray, z: npt.NDArray[np.float32], index: npt.NDArray[np.uint8]
    ) -> npt.NDArray[np.float16]:
        """``f = ||x - mean||^2 / <levels, z>`` per row as float16 (0 where the levels are blind to the row)."""
        centred = rows.astype(np.float64) - self.mean
        energy = np.einsum("ij,ij->i", centred, centred)
        along = np.einsum("ij,ij->i", self.levels(index), z, dtype=np.float64)
        scale = np.divide(energy, along, out=np.zeros_like(energy), where=along > 1e-30 * np.maximum(energy, 1e-300))
        stored: npt.NDArray[np.float16] = np.minimum(scale, float(np.finfo(np.float16).max)).astype(np.float16)
        return stored[:, None]

    def unpack(self, codes: npt.ArrayLike) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
        """The level indexes (n x components) and per-vector scales (ones without a correction) of code rows."""
        rows = self.check_codes(codes)
        stream = np.unpackbits(rows[:, : self.code_bytes], axis=1, count=self.total_bits, bitorder="little")
        weighted = stream.astype(np.int64) << self._shift_of_bit.astype(np.int64)
        return np.add.reduceat(weighted, self.offsets, axis=1).astype(np.uint8), self.scales(rows)

    def scales(self, rows: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        """The per-vector corrections of checked code rows (ones without a correction)."""
        if not self.correction:
            return np.ones(rows.shape[0], dtype=np.float32)
        return np.ascontiguousarray(rows[:, self.code_bytes :]).view(np.float16)[:, 0].astype(np.float32)

    def decode(self, codes: npt.ArrayLike) -> npt.NDArray[np.float32]:
        index, scales = self.unpack(codes)
        approx = (self.levels(index) * scales[:, None]) @ self.basis.T.astype(np.float64) + self.mean
        if self.unit:
            approx *= self._inverse(self._norms(index, scales))[:, None]
        out: npt.NDArray[np.float32] = approx.astype(np.float32)
        return out

    def inner_products(self, queries: npt.ArrayLike, codes: npt.ArrayLike) -> npt.NDArray[np.float32]:
        q = self.check_rows(queries, "queries").astype(np.float64)
        index, scales = self.unpack(codes)
        along = (q @ self.basis.astype(np.float64)) @ self.levels(index).T
        estimate = (q @ self.mean)[:, None] + along * scales[None, :]
        if self.unit:
            estimate *= self._inverse(self._norms(index, scales))[None, :]
        out: npt.NDArray[np.float32] = estimate.astype(np.float32)
        return out

    def _norms(self, index: npt.NDArray[np.uint8], scales: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
        """``||mean + f basis @ levels||`` of each unpacked code row (before a unit code scales it)."""
        levels = self.levels(index)
        along = levels @ self._mean_along
        squares = np.einsum("ij,ij->i", levels, levels)
        f = scales.astype(np.float64)
        out: npt.NDArray[np.float64] = np.sqrt(np.maximum(self.mean @ self.mean + 2 * f * along + f * f * squares, 0.0))
        return out

    def row_scales(self, norms: npt.NDArray[np.float64]) -> npt.NDArray[np.float32]:
        """Each row's estimate factor from its decoded length: ``1 / ||xhat||`` (0 for zero) for a unit code, else 1."""
        if not self.unit:
            return np.ones(norms.shape[0], dtype=np.float32)
        return self._inverse(norms).astype(np.float32)

    def unit_scale_problem(self) -> tuple[str, str] | None:
        """`Codec.unit_scale_problem`, and a step beyond its bits' Gaussian step (unit vectors spread at most 1)."""
        found = super().unit_scale_problem()
        if found is not None:
            return found
        widest = np.array([gaussian_quantizer(int(b))[0] for b in self.bits]) * (1.0 + UNIT_SLACK)
        beyond = np.flatnonzero(self.step > widest)
        if beyond.size:
            j = int(beyond[0])
            return "step", f"of component {j} is {self.step[j]:.6g}, beyond the {widest[j]:.6g} of any unit vectors"
        return None

    def with_unit(self, unit: bool = True) -> LinearCode:
        """This code, for unit vectors (or not): the same bytes, another estimate (see the module's text)."""
        code = copy.copy(self)
        code.unit = bool(unit)
        return code

    @staticmethod
    def _inverse(norms: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)

    def lookup_tables(
        self, queries: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """Per query: a 256-entry table per code byte, a base and an offset; the estimate of ``<q, x>`` is
        ``(base + f * (offset + sum_p tables[p, code[p]])) * g`` (``f``: correction, ``g``: `row_scales`),
        as bit ``i`` of component ``j`` adds ``(q @ basis)_j * step_j * 2^i``."""
        q = self.check_rows(queries, "queries").astype(np.float64)
        along = q @ self.basis.astype(np.float64)
        per_bit = np.zeros((q.shape[0], self.code_bytes * 8))
        per_bit[:, : self.total_bits] = (along * self.step)[:, self._component_of_bit] * (
            2.0 ** self._shift_of_bit.astype(np.float64)
        )
        byte_bits = (np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1
        tables = per_bit.reshape(q.shape[0], self.code_bytes, 8) @ byte_bits.T.astype(np.float64)
        offset = along @ ((0.5 - self._half) * self.step)
        return tables.astype(np.float32), (q @ self.mean).astype(np.float32), offset.astype(np.float32)

    def _parts(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        record = {"kind": self.kind, "correction": self.correction, "unit": self.unit, "budget": self.budget}
        arrays = (self.mean, self.basis, self.bits.astype(np.uint8), self.step)
        return {**record, "training": self.training}, dict(zip(_ARRAYS, arrays, strict=True))

    @classmethod
    def _from_parts(cls, record: dict[str, Any], arrays: dict[str, np.ndarray]) -> LinearCode:
        """The code the byte form describes, every field checked first (`check_parts`)."""
        check_parts(record, arrays)
        code = cls(
            str(record["kind"]),
            *(arrays[name] for name in _ARRAYS),
            correction=record["correction"],
            budget=record["budget"],
            training=dict(record.get("training") or {}),
        )
        return code.with_unit(flag(record, "unit", False))


def check_parts(record: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Refuse, naming the field (`field_error`), a linear code's byte form no training could write: an
    unknown kind, arrays not finite or not agreeing, a basis not orthonormal, bits outside 1..`MAX_BITS`
    (1 for sign bits), a step not positive or overflowing, a budget the code does not fit."""
    if record.get("kind") not in KINDS:
        raise field_error("kind", f"must be one of {', '.join(KINDS)}, got {record.get('kind')!r}")
    correction = flag(record, "correction")
    flag(record, "unit", False)
    budget = whole(record, "budget", 1)
    if not isinstance(record.get("training") or {}, dict):
        raise field_error("training", f"must be a JSON object, got {record.get('training')!r}")
    if set(arrays) != set(_ARRAYS):
        raise field_error("arrays", f"must be mean, basis, bits and step, got {sorted(arrays)}")
    mean = real_array(arrays, "mean", 1)
    basis = real_array(arrays, "basis", 2)
    bits = real_array(arrays, "bits", 1, kind="u")
    step = real_array(arrays, "step", 1)
    if basis.shape != (mean.shape[0], bits.shape[0]) or step.shape != bits.shape:
        raise field_error(
            "basis",
            f"has shape {basis.shape}, the mean {mean.shape[0]} values, bits and step {bits.shape[0]} and "
            f"{step.shape[0]}: they do not agree",
        )
    widest = 1 if record["kind"] != "eigen" else MAX_BITS
    if bits.min() < 1 or bits.max() > widest:
        raise field_error("bits", f"must be 1 to {widest} a component for a {record['kind']} code, got {bits.max()}")
    with np.errstate(over="ignore"):
        levels = step * 2.0 ** bits.astype(np.float64)
    if not np.all(step >= np.finfo(np.float64).tiny) or not np.all(np.isfinite(levels)):
        raise field_error("step", "must be positive and small enough that every level is a finite number")
    orthonormal_columns(basis)
    code_bytes = linear_bytes(int(bits.astype(np.int64).sum()), correction)
    if code_bytes > budget:
        raise field_error("budget", f"is {budget} bytes, but the code's rows take {code_bytes}")


def _moments(mean: npt.ArrayLike, covariance: npt.ArrayLike) -> tuple[npt.NDArray[np.float64], np.ndarray, np.ndarray]:
    """The mean, eigenvalues and eigenvectors a code trains from, checked to agree and be finite."""
    centre = np.asarray(mean, dtype=np.float64).reshape(-1)
    values, vectors = principal_axes(covariance)
    if values.shape[0] != centre.shape[0]:
        raise BadInputError(f"the mean has {centre.shape[0]} values but the covariance is {values.shape[0]} wide")
    if not np.all(np.isfinite(centre)):
        raise BadInputError("a codec trains from a finite mean")
    return centre, values, vectors


def train_eigen(
    mean: npt.ArrayLike,
    covariance: npt.ArrayLike,
    budget: int,
    *,
    correction: bool = False,
    queries: str = "data",
    rotate: bool = True,
    seed: int = 0,
    max_bits: int = MAX_BITS,
) -> LinearCode:
    """The eigen-allocated code of at most ``budget`` bytes a vector (correction included), from statistics alone.

    `allocate_bits` weighs component ``j``'s error ``lambda_j mse(b_j)`` by the query's expected ``q_j^2``:
    ``lambda_j + (mean . u_j)^2`` for ``queries="data"``, 1 for ``"isotropic"``. With ``rotate``, the
    components of equal bits are turned by a seeded random rotation (as SAQ does) to even their variances,
    except those whose weight comes mostly from the mean (``(mean . u_j)^2 > lambda_j``): turned, they would
    take on the others' error, which the mean multiplies into every estimate.
    """
    centre, values, vectors = _moments(mean, covariance)
    if queries not in ("data", "isotropic"):
        raise BadInputError(f"eigen code queries are 'data' or 'isotropic', got {queries!r}")
    total_bits = eigen_bits(centre.shape[0], budget, correction, max_bits)
    along_mean = (centre @ vectors) ** 2
    weight = values + along_mean if queries == "data" else np.ones_like(values)
    bits = allocate_bits(weight * values, total_bits, max_bits)
    keep = np.flatnonzero(bits)
    if keep.size == 0:
        raise BadInputError("the covariance has no variance to code (every eigenvalue is 0)")
    basis, kept_bits = vectors[:, keep].copy(), bits[keep]
    if rotate:
        led_by_mean = along_mean[keep] > values[keep] if queries == "data" else np.zeros(keep.size, dtype=bool)
        for width in np.unique(kept_bits):
            group = np.flatnonzero((kept_bits == width) & ~led_by_mean)
            if group.size > 1:
                basis[:, group] = basis[:, group] @ random_rotation(group.size, seed + int(width))
    steps = np.array([gaussian_quantizer(int(b))[0] for b in kept_bits]) * _spread(basis, values, vectors)
    training = {"queries": queries, "rotate": bool(rotate), "seed": int(seed)}
    return LinearCode(
        "eigen", centre, basis, kept_bits, steps, correction=correction, budget=int(budget), training=training
    )


def train_sign_bits(
    mean: npt.ArrayLike,
    covariance: npt.ArrayLike,
    budget: int,
    *,
    rotation: str = "random",
    sample: npt.ArrayLike | None = None,
    seed: int = 0,
    correction: bool = False,
    iterations: int = 50,
) -> LinearCode:
    """A sign bit per component of the leading principal subspace the budget holds, turned by ``rotation``:
    ``"random"`` (seeded), ``"itq"`` (learnt on ``sample``) or ``"pca"`` (none)."""
    centre, values, vectors = _moments(mean, covariance)
    kind = f"bits-{rotation}"
    if kind not in KINDS[1:]:
        raise BadInputError(f"a sign-bit rotation is random, itq or pca, got {rotation!r}")
    d = centre.shape[0]
    n_bits = sign_bits(d, budget, correction, kind)
    basis = vectors[:, :n_bits]
    training: dict[str, Any] = {}
    if rotation == "random":
        basis = basis @ random_rotation(n_bits, seed)
        training = {"seed": int(seed)}
    elif rotation == "itq":
        if sample is None:
            raise BadInputError("ITQ learns its rotation from a sample of the vectors: give one")
        why = "its rotation learns from their spread"
        rows = sample_rows(sample, d, "the ITQ sample must be", (kind, ITQ_SMALLEST_SAMPLE, why))
        basis = basis @ itq_rotation((rows - centre) @ basis, seed, iterations)
        training = {"seed": int(seed), "sample_rows": int(rows.shape[0]), "iterations": int(iterations)}
    steps = gaussian_quantizer(1)[0] * _spread(basis, values, vectors)
    bits = np.ones(n_bits, dtype=np.int64)
    return LinearCode(kind, centre, basis, bits, steps, correction=correction, budget=int(budget), training=training)


def sample_rows(sample: npt.ArrayLike, d: int, must: str, smallest: tuple[str, int, str]) -> np.ndarray:
    """``sample`` as float64 rows, finite and ``d`` wide, at least ``smallest`` ``(code, rows, why)`` of them."""
    rows = np.asarray(sample, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != d or not np.all(np.isfinite(rows)):
        raise BadInputError(f"{must} finite rows of {d} values, got shape {rows.shape}")
    if rows.shape[0] < smallest[1]:
        raise sample_too_small(smallest[0], smallest[1], rows.shape[0], smallest[2])
    return rows


def _spread(basis: np.ndarray, values: np.ndarray, vectors: np.ndarray) -> npt.NDArray[np.float64]:
    """Each ``basis`` component's standard deviation under this covariance (floored so no step is 0)."""
    variance = np.einsum("ij,ij->j", basis, (vectors * values) @ (vectors.T @ basis))
    spread: npt.NDArray[np.float64] = np.sqrt(np.maximum(variance, 1e-12 * max(float(values[0]), 1e-300)))
    return spread


__all__ = [
    "CORRECTION_BYTES",
    "ITQ_SMALLEST_SAMPLE",
    "KINDS",
    "MAX_BITS",
    "PROJECT_VALUES",
    "LinearCode",
    "allocate_bits",
    "check_parts",
    "eigen_bits",
    "gaussian_quantizer",
    "itq_rotation",
    "linear_bytes",
    "principal_axes",
    "quantizer_errors",
    "random_rotation",
    "sample_rows",
    "sign_bits",
    "train_eigen",
    "train_sign_bits",
]
