"""The whitening as an affine map ``y = x A + b``, with numpy alone (torch tensors too, on their device).

`AffineMap.transform` centres before the product and rounds each float32 value once from the exact dot
product, as the engine does (the same bytes); ``x A + b`` formats (nn.Linear, faiss, ONNX) agree to rounding.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar, cast

import numpy as np
import numpy.typing as npt

from .. import __version__
from ..errors import BadInputError, NonFiniteError, ValuesTooLargeError
from .product import ProductWeights, rounded_product
from .quantize import Quantization

#: The ``.npz`` affine map written by ``streamwhiten export -o map.npz``.
MAP_FORMAT, MAP_VERSION = "streamwhiten-affine", 1
#: Rows centred at a time in float64 before the float32 product (bounds the temporary memory).
_BLOCK_ROWS = 16384

if TYPE_CHECKING:
    import torch


class _Rows(Protocol):
    """What `AffineMap._check_shape` reads of a batch: an ndarray or a torch tensor."""

    @property
    def ndim(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...


_R = TypeVar("_R", bound=_Rows)


@dataclass(frozen=True, eq=False)
class AffineMap:
    """The whitening as ``y = x A + b`` (float64 ``A``, ``b``, fitted ``mean`` and the setting), then L2
    normalisation if ``normalize`` (`transform`'s default).

    ``file_checksum``: the source model file's (provenance only, "" if unknown; `checksum` names the map).
    ``mean_sq_norm``: the fitted rows' mean squared norm (None if unknown), which places the map before or
    after a ``Normalize`` in ``export --append-to``. ``quantization``: how `encode` stores (None: float32).
    """

    A: np.ndarray
    b: np.ndarray
    mean: np.ndarray
    beta: float
    gamma: float
    eps: float
    eps_value: float
    variance: float | None = None
    normalize: bool = False
    file_checksum: str = ""
    mean_sq_norm: float | None = None
    quantization: Quantization | None = None
    _cache: dict[object, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        q = self.quantization
        if q is not None and q.n_components != self.A.shape[1]:
            raise BadInputError(
                f"a {q.kind} record of {q.n_components} components does not fit a map to {self.A.shape[1]}"
            )

    @classmethod
    def from_weights(cls, A: np.ndarray, mean: npt.ArrayLike, beta: float, **fields: Any) -> AffineMap:
        """The map ``x -> (x - beta mean) A``; ``fields``: the other attributes by name."""
        A = np.ascontiguousarray(A, dtype=np.float64)
        mean = np.asarray(mean, dtype=np.float64)
        return cls(A=A, b=-((float(beta) * mean) @ A), mean=mean, beta=float(beta), **fields)

    @classmethod
    def identity(
        cls,
        mean: npt.ArrayLike,
        eps: float,
        eps_value: float,
        normalize: bool = False,
        file_checksum: str = "",
        mean_sq_norm: float | None = None,
        quantization: Quantization | None = None,
    ) -> AffineMap:
        """No transformation: ``A = I``, ``b = 0`` (beta = gamma = 0, k = d), ``y = x`` exactly (then
        normalised if asked); ``mean`` enters `checksum`, not the outputs."""
        mean = np.asarray(mean, dtype=np.float64)
        d = mean.shape[0]
        return cls(
            A=np.eye(d),
            b=np.zeros(d),
            mean=mean,
            beta=0.0,
            gamma=0.0,
            eps=float(eps),
            eps_value=float(eps_value),
            normalize=bool(normalize),
            file_checksum=str(file_checksum),
            mean_sq_norm=None if mean_sq_norm is None else float(mean_sq_norm),
            quantization=quantization,
        )

    @property
    def n_features(self) -> int:
        """Input width d."""
        return int(self.A.shape[0])

    @property
    def n_components(self) -> int:
        """Output width k."""
        return int(self.A.shape[1])

    @property
    def checksum(self) -> str:
        """The map's SHA-256 (every output's ``model_checksum``): of ``mean`` and ``A`` (float64, with shapes),
        beta, gamma, eps and k; not ``b``, which follows from them (its last bits depend on the BLAS)."""
        if "checksum" not in self._cache:
            digest = hashlib.sha256(b"streamwhiten affine map 1")
            for name, array in (("mean", self.mean), ("A", self.A)):
                values = np.ascontiguousarray(array, dtype="<f8")
                digest.update(f"{name}{values.shape}".encode())
                digest.update(values.tobytes())
            digest.update(struct.pack("<dddq", self.beta, self.gamma, self.eps, self.n_components))
            self._cache["checksum"] = digest.hexdigest()
        return cast(str, self._cache["checksum"])

    @property
    def shift(self) -> np.ndarray:
        """``beta * mean``: what `transform` subtracts before the product."""
        return self.beta * self.mean

    @property
    def dtype(self) -> str:
        """How the outputs are stored: the `quantization`'s kind, float32 without one."""
        return "float32" if self.quantization is None else self.quantization.kind

    def params(self) -> dict[str, Any]:
        """The setting, `checksum` (``model_checksum``), `file_checksum` and any `quantization` as JSON values."""
        names = ("beta", "gamma", "eps", "eps_value", "variance", "n_components", "n_features", "normalize")
        values: dict[str, Any] = {name: getattr(self, name) for name in names}
        values.update(model_checksum=self.checksum, model_file_checksum=self.file_checksum)
        if self.quantization is not None:
            values.update(
                dtype=self.quantization.kind,
                bytes_per_vector=self.quantization.bytes_per_vector,
                quantization=self.quantization.to_dict(),
            )
        return values

    def metadata(self) -> dict[str, str]:
        """`params` as strings (exact float reprs, records as JSON), for str -> str metadata."""
        values = dict(self.params(), format=MAP_FORMAT, format_version=MAP_VERSION, package_version=__version__)
        return {key: _text(value) for key, value in sorted(values.items())}

    def encode(self, x: Any) -> np.ndarray:
        """The stored form of numpy rows: `transform` (unit length as the record says), then the record's
        encoding, exactly as ``apply`` writes them; float32 values without a `quantization`."""
        q = self.quantization
        if _is_torch_tensor(x):
            raise BadInputError("encode takes numpy rows (the codes are numpy arrays); convert with .numpy()")
        normalize = self.normalize if q is None else q.normalized
        rows = np.asarray(x)
        single = rows.ndim == 1
        y = self.transform(rows[None, :] if single else rows, normalize=normalize)
        out = y.astype(np.float32, copy=False) if q is None else q.encode(y)
        return out[0] if single else out

    def transform(self, x: Any, normalize: bool | None = None) -> Any:
        """Whiten one vector or a batch of rows.

        Parameters
        ----------
        x : array_like or torch.Tensor
            ``(d,)`` or ``(n, d)`` floats. numpy float64 is computed in float64, other floats in float32
            (`rounded_product`: the same bits for a row alone or in any batch); a tensor by torch.
        normalize : bool, optional
            Scale rows to unit L2 norm (zero rows stay zero); default: the map's ``normalize``.

        Returns
        -------
        ndarray or torch.Tensor
            ``(k,)`` or ``(n, k)``, of the working dtype (numpy) or of the input's dtype and device (torch).

        Raises
        ------
        BadInputError
            Wrong width, rank or dtype; `NonFiniteError` for a row holding NaN or Inf.
        """
        normalize = self.normalize if normalize is None else bool(normalize)
        if _is_torch_tensor(x):
            return self._transform_torch(x, normalize)
        rows = np.asarray(x)
        float_dtype(rows.dtype)
        single = rows.ndim == 1
        rows = self._check_shape(rows[None, :] if single else rows)
        work = np.float64 if rows.dtype == np.float64 else np.float32
        A = self._weights(work)
        shift = self.shift
        out = np.empty((rows.shape[0], self.n_components), dtype=work)
        with np.errstate(over="ignore", invalid="ignore"):  # non-finite rows are reported just below
            for start in range(0, rows.shape[0], _BLOCK_ROWS):
                block = rows[start : start + _BLOCK_ROWS]
                # centred in float64, then rounded to the working dtype, as the engine's centring kernel does
                centred = np.subtract(block, shift, dtype=np.float64).astype(work, copy=False)
                into = out[start : start + block.shape[0]]
                if work == np.float32:  # the engine's product: each value rounded once from the exact sum
                    rounded_product(centred, A, into)
                else:
                    np.matmul(centred, A, out=into)
            check = np.sqrt(np.einsum("ij,ij->i", out, out)) if normalize else out.sum(axis=1)
        if not np.all(np.isfinite(check)):  # rare: a non-finite row, or only its norm or sum overflowed
            finite_out = np.isfinite(out).all(axis=1)
            if not finite_out.all():
                _raise_nonfinite(np.isfinite(rows).all(axis=1), finite_out, work)
        if normalize:
            scale_rows_to_unit(out, check)
        return out[0] if single else out

    __call__ = transform

    def _check_shape(self, rows: _R) -> _R:
        if rows.ndim != 2:
            raise BadInputError(f"expected one vector or a 2-D array (rows x features), got shape {tuple(rows.shape)}")
        if rows.shape[1] != self.n_features:
            raise BadInputError(f"the whitening expects {self.n_features} features, got {rows.shape[1]}")
        return rows

    def _weights(self, dtype: npt.DTypeLike) -> Any:
        """``A`` in float64, or as `rounded_product` takes its float32 rounding (cached)."""
        key = np.dtype(dtype).name
        if key not in self._cache:
            weights = np.ascontiguousarray(self.A, dtype=dtype)
            self._cache[key] = ProductWeights.of(weights) if weights.dtype == np.float32 else weights
        return self._cache[key]

    def _transform_torch(self, x: torch.Tensor, normalize: bool) -> torch.Tensor:
        import torch

        if not torch.is_floating_point(x):
            raise BadInputError(f"expected a floating-point tensor, got dtype {x.dtype} (convert with .float())")
        single = x.dim() == 1
        rows = self._check_shape(x.unsqueeze(0) if single else x)
        key = ("torch", rows.dtype, rows.device)
        if key not in self._cache:
            self._cache[key] = (
                torch.as_tensor(self.A, dtype=rows.dtype, device=rows.device),
                torch.as_tensor(self.beta * self.mean, dtype=rows.dtype, device=rows.device),
            )
        A, shift = cast("tuple[torch.Tensor, torch.Tensor]", self._cache[key])
        out = (rows - shift) @ A
        if normalize:
            norms = torch.linalg.vector_norm(out, dim=1, keepdim=True)
            out = out / torch.where(norms > 0, norms, torch.ones_like(norms))
        finite_out = torch.isfinite(out).all(dim=1)
        if not bool(finite_out.all()):
            _raise_nonfinite(torch.isfinite(rows).all(dim=1).cpu().numpy(), finite_out.cpu().numpy(), rows.dtype)
        return out[0] if single else out


def float_dtype(dtype: npt.DTypeLike) -> np.dtype:
    """``dtype`` in native byte order; `BadInputError` unless it is float16, float32 or float64."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f" or dtype.itemsize not in (2, 4, 8):
        raise BadInputError(
            f"expected float16, float32 or float64 values, got dtype {dtype} (convert with .astype(np.float32))"
        )
    return cast(np.dtype, dtype.newbyteorder("="))


def setting_arrays(owner: AffineMap | Any) -> dict[str, np.ndarray]:
    """The setting of a map or a model as the 0-d arrays of its ``.npz`` (``variance`` NaN when unused)."""
    arrays = {name: np.array(getattr(owner, name)) for name in ("beta", "gamma", "eps", "eps_value")}
    arrays["variance"] = np.array(np.nan if owner.variance is None else owner.variance)
    return arrays | {name: np.array(getattr(owner, name), dtype=np.int64) for name in ("n_components", "n_features")}


def mean_sq_norm(n_rows: int, mean: npt.ArrayLike, scatter: npt.ArrayLike) -> float:
    """``E|x|^2 = trace(scatter) / n + |mean|^2`` of ``n_rows`` rows (1 for unit-length rows)."""
    mean = np.asarray(mean, dtype=np.float64)
    return float(np.trace(np.asarray(scatter, dtype=np.float64)) / max(1, int(n_rows)) + mean @ mean)


def scale_rows_to_unit(out: np.ndarray, norms: np.ndarray) -> None:
    """Divide each row by its L2 norm in place (zero rows stay zero; overflowed norms in float64)."""
    redo = ~np.isfinite(norms)
    if redo.any():
        wide = out[redo].astype(np.float64)
        out[redo] = wide / np.linalg.norm(wide, axis=1, keepdims=True)
        norms[redo] = 1
    out /= np.where(norms > 0, norms, 1)[:, None]


def _raise_nonfinite(finite_in: npt.ArrayLike, finite_out: npt.ArrayLike, dtype: object) -> NoReturn:
    bad_in = ~np.asarray(finite_in, dtype=bool)
    if bad_in.any():
        row = int(np.argmax(bad_in))
        raise NonFiniteError(f"row {row} holds NaN or Inf", row=row)
    bad_out = ~np.asarray(finite_out, dtype=bool)
    name = getattr(dtype, "name", None) or str(dtype)
    raise ValuesTooLargeError(f"values too large for {name} (they overflow when whitened)", row=int(np.argmax(bad_out)))


def _is_torch_tensor(x: object) -> bool:
    # no import of torch: a tensor can only exist once the caller has imported it
    return type(x).__module__.startswith("torch") and hasattr(x, "dim") and hasattr(x, "device")


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, bool)):  # JSON: true / false for a flag
        return json.dumps(value, sort_keys=True)
    return repr(value) if isinstance(value, float) else str(value)
