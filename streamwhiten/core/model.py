"""Finalize streaming statistics into a whitening model, and the pickle-free model file.

``finalize`` eigendecomposes ``Sigma_beta = U Lambda U^T`` of a `Moments` state (deterministic signs) into
``y = (x - beta*mu) U_k (Lambda_k + eps)^(-gamma/2)``; the ``identity`` basis is ``y = x`` (``tune``'s map when
the raw vectors win). The model file: plain arrays in an ``.npz``, with a format version and a SHA-256 of
its contents, so a changed or truncated file is refused."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import __version__
from .._durable import check_replaceable
from .._npz import checksum, foreign_npz, read_npz, write_npz_atomic
from ..errors import BadInputError, NonFiniteError, ValuesTooLargeError
from ..params import DEFAULT_EPS, check_model
from ..records import Fingerprint, fingerprint_of
from ..storage import CODE, Storage
from .affine import AffineMap, float_dtype, mean_sq_norm, scale_rows_to_unit, setting_arrays
from .eigen import eigendecomposition
from .product import rounded_product
from .quantize import (
    DEFAULT_INT8_CLIP,
    Quantization,
    cast_checked,
    quantization_for,
    raise_if_overflowed,
    storage_quantizations,
)
from .stats import Moments, covariance
from .validate import components_for_variance, model_fields

FORMAT_NAME = "streamwhiten-model"
FORMAT_VERSION = 1
#: The identity map's file version: releases reading only version 1 refuse it (they know no ``basis``).
IDENTITY_FORMAT_VERSION = 2
#: The model file versions this release reads.
FORMAT_VERSIONS = (FORMAT_VERSION, IDENTITY_FORMAT_VERSION)
#: How a model file's name ends: the name tells what a file is, for every writer of one.
MODEL_SUFFIX = ".npz"
#: What a model's map is built on (`WhiteningModel.basis`).
BASES = ("eigen", "identity")


def effective_dimension(eigvals: np.ndarray) -> float:
    """``exp(entropy)`` of the normalised eigenvalues: how many directions carry the variance."""
    total = float(eigvals.sum())
    if total <= 0.0:
        return 0.0
    p = eigvals[eigvals > 0] / total
    return float(np.exp(-(p * np.log(p)).sum()))


@dataclass(frozen=True)
class WhiteningModel:
    """A finalized transform plus the statistics it came from (so it can be re-finalized).

    Examples
    --------
    The model a fit produces (``Whitener.model_``, or [`load_model`][streamwhiten.core.model.load_model] of a saved
    one):

    >>> import numpy as np
    >>> from streamwhiten import Whitener
    >>> rows = np.random.default_rng(0).standard_normal((2000, 6)) * [5, 4, 3, 2, 1, 0.5] + 7.0
    >>> model = Whitener(n_components=3).fit(rows).model_
    >>> model.n_rows, model.n_features, model.n_components
    (2000, 6, 3)
    >>> model.transform(rows[:4]).shape
    (4, 3)

    Another setting comes from the saved statistics, with no second pass over the rows:

    >>> rotation = model.with_params(beta=0.0, gamma=0.0, n_components=6)
    >>> y = rotation.transform(rows[:4])
    >>> bool(np.allclose(np.linalg.norm(y, axis=1), np.linalg.norm(rows[:4], axis=1)))  # a rotation
    True

    The same map as ``y = x A + b``, to hand to another system (see ``streamwhiten export``):

    >>> affine = model.as_affine()
    >>> bool(np.allclose(rows[:4] @ affine.A + affine.b, model.transform(rows[:4])))
    True
    """

    state: Moments
    beta: float
    gamma: float
    eps: float
    n_components: int
    variance: float | None
    eigvals: np.ndarray
    eigvecs: np.ndarray
    eps_value: float
    sources: tuple[Fingerprint, ...] = ()
    info: dict[str, Any] = field(default_factory=dict)
    storage: Storage | None = None
    #: ``"eigen"``: the map of the setting, ``x -> (x - beta mu) U_k (Lambda_k + eps_)^(-gamma/2)``;
    #: ``"identity"``: no transformation (``A = I``, ``b = 0``; beta = gamma = 0, k = d), the raw vectors.
    basis: str = "eigen"

    def __post_init__(self) -> None:
        if self.basis not in BASES:
            raise BadInputError(f"basis must be one of {', '.join(BASES)}, got {self.basis!r}")
        identity = (0.0, 0.0, self.n_features, None)
        if self.basis == "identity" and (self.beta, self.gamma, self.n_components, self.variance) != identity:
            raise BadInputError("the identity map has beta = gamma = 0 and all components (no variance fraction)")

    @property
    def n_features(self) -> int:
        return self.state.n_features

    @property
    def n_rows(self) -> int:
        return self.state.n_rows

    @property
    def mean(self) -> np.ndarray:
        return self.state.mean

    @property
    def covariance(self) -> np.ndarray:
        """``Sigma_beta`` at the model's ``beta``, from its statistics (d x d, float64)."""
        return covariance(self.state, self.beta)

    @property
    def explained_variance_ratio(self) -> np.ndarray:
        total = float(self.eigvals.sum())
        return self.eigvals / total if total > 0 else np.zeros_like(self.eigvals)

    @property
    def effective_dimension(self) -> float:
        return effective_dimension(self.eigvals)

    def scales(self) -> np.ndarray:
        """``(Lambda_k + eps_)^(-gamma/2)`` for the kept components."""
        return (self.eigvals[: self.n_components] + self.eps_value) ** (-self.gamma / 2.0)

    def projection(self, dtype: npt.DTypeLike = np.float64) -> tuple[np.ndarray, np.ndarray]:
        """``(W, shift)`` with ``y = (x - shift) @ W``: ``U_k diag(scales)`` and ``beta * mu`` (or ``I``, 0)."""
        if self.basis == "identity":
            return np.eye(self.n_features, dtype=dtype), np.zeros(self.n_features)
        weights = self.eigvecs[:, : self.n_components] * self.scales()
        return np.ascontiguousarray(weights, dtype=dtype), (self.beta * self.state.mean)

    @property
    def dtype(self) -> str:
        """How the outputs are stored: the recorded `storage`'s dtype, float32 when none is recorded."""
        return "float32" if self.storage is None else self.storage.dtype

    def quantization(self, dtype: str | None = None, normalize: bool = True) -> Quantization | None:
        """The record of this map's outputs stored as ``dtype`` (default: `dtype`), None for float32. int8
        and bits are of the unit vectors, as the search stores them; ``normalize`` says whether float16 is."""
        dtype = self.dtype if dtype is None else dtype
        if dtype in ("float32", CODE):  # a codec decodes its own rows (``streamwhiten.codes``)
            return None
        clip = DEFAULT_INT8_CLIP if self.storage is None else self.storage.int8_clip  # int8's only
        return quantization_for(dtype, self, normalize=normalize or dtype in ("int8", "binary"), clip=clip)

    def storage_records(self) -> tuple[Quantization | None, Quantization | None]:
        """The records (stored, re-ranking) of the recorded `storage` (`storage_quantizations`), or Nones."""
        if self.storage is None:
            return None, None
        weights, shift = self.projection(np.float64)
        return storage_quantizations(self.storage, self.n_rows, self.mean, self.state.scatter, weights, shift)

    def transform(
        self,
        rows: npt.ArrayLike,
        normalize: bool = False,
        dtype: npt.DTypeLike | None = None,
        skip_nonfinite: bool = False,
    ) -> np.ndarray:
        """Whiten ``rows`` (one vector or a 2-D array); float32/float16 input is computed in float32. NaN or
        Inf raises `NonFiniteError`, unless ``skip_nonfinite`` (a NaN row); overflow `ValuesTooLargeError`."""
        if type(rows).__module__.startswith("scipy.sparse"):
            raise BadInputError(
                f"expected a dense array of rows, got a scipy.sparse {type(rows).__name__} "
                "(sparse input is not supported; convert with .toarray())"
            )
        rows = np.asarray(rows)
        rows = rows.astype(float_dtype(rows.dtype), copy=False)  # native order, copied only to swap bytes
        single = rows.ndim == 1
        if single:
            rows = rows[None, :]
        if rows.ndim != 2:
            raise BadInputError(f"expected one vector or a 2-D array (rows x features), got shape {rows.shape}")
        if rows.shape[1] != self.n_features:
            raise BadInputError(f"the model expects {self.n_features} features, got {rows.shape[1]}")
        work = np.float64 if rows.dtype == np.float64 else np.float32
        weights, shift = self.projection(work)
        out, finite = project_checked(rows, weights, shift, normalize, dtype)
        if finite is not None:
            nonfinite = ~np.isfinite(rows).all(axis=1)
            # float16 rows are centred in place as float32, where an overflow looks like Inf
            raise_if_overflowed(~finite & ~nonfinite, work, "centred")
            if not skip_nonfinite:
                row = int(np.argmax(nonfinite))
                raise NonFiniteError(
                    f"row {row} holds NaN or Inf (use skip_nonfinite=True to write NaN rows for such input)",
                    row=row,
                    param="skip_nonfinite",
                )
        return out[0] if single else out

    def as_affine(
        self,
        beta: float | None = None,
        gamma: float | None = None,
        n_components: int | None = None,
        variance: float | None = None,
        eps: float | None = None,
        normalize: bool = False,
        dtype: str | None = None,
    ) -> AffineMap:
        """The transform as the affine map ``y = x A + b``, for serving and export.

        Parameters
        ----------
        beta, gamma, n_components, variance, eps : optional
            Another setting, re-finalized from the saved statistics (as `with_params`).
        normalize : bool
            Follow the map by L2 normalisation.
        dtype : str, optional
            How its outputs are stored (default: the model's `storage`, else float32): the record
            `AffineMap.encode` uses.

        Returns
        -------
        streamwhiten.core.affine.AffineMap
            ``A = U_k (Lambda_k + eps_)^(-gamma/2)`` (d x k), ``b = -(beta mu) A``: the vectors `transform`
            gives; its ``checksum`` is what outputs made with it record as ``model_checksum``.
        """
        given = dict(beta=beta, gamma=gamma, n_components=n_components, variance=variance, eps=eps)
        changes = {name: value for name, value in given.items() if value is not None}
        model = self.with_params(**changes) if changes else self
        norm = mean_sq_norm(model.n_rows, model.mean, model.state.scatter)
        extra: dict[str, Any] = dict(normalize=bool(normalize), file_checksum=file_checksum(self), mean_sq_norm=norm)
        quantization = model.quantization(dtype)  # stored vectors are unit-length, as the search stores them
        if model.basis == "identity":
            return AffineMap.identity(model.mean, model.eps, model.eps_value, quantization=quantization, **extra)
        setting = dict(gamma=model.gamma, eps=model.eps, eps_value=model.eps_value, variance=model.variance)
        weights = model.projection(np.float64)[0]
        return AffineMap.from_weights(weights, model.mean, model.beta, quantization=quantization, **setting, **extra)

    def with_params(self, **changes: Any) -> WhiteningModel:
        """Re-finalize with other ``beta``/``gamma``/``eps``/``n_components``/``variance``, without the data.

        ``basis``: ``"identity"`` (beta = gamma = 0, k = d) or ``"eigen"``; without it an identity model stays
        one unless another setting is asked for. Another map drops a recorded vector code (see ``with_codes``)."""
        basis = changes.pop("basis", None)
        if basis is not None and basis not in BASES:  # before the setting's checks and the eigendecomposition
            raise BadInputError(f"basis must be one of {', '.join(BASES)}, got {basis!r}")
        params: dict[str, Any] = dict(
            beta=self.beta, gamma=self.gamma, eps=self.eps, n_components=self.n_components, variance=self.variance
        )
        if changes.get("n_components") is not None:
            params["variance"] = None
        if changes.get("variance") is not None:
            params["n_components"] = None
        params.update(changes)
        if basis == "identity":
            params.update(beta=0.0, gamma=0.0, n_components=self.n_features, variance=None)
        elif basis is None and self.basis == "identity":
            same = (params["beta"], params["gamma"], params["variance"]) == (0.0, 0.0, None)
            basis = "identity" if same and params["n_components"] in (None, self.n_features) else "eigen"
        if params["beta"] == self.beta and params["eps"] == self.eps:  # Sigma_beta is unchanged: reuse its eigh
            eigvals, eigvecs = self.eigvals, self.eigvecs
        else:
            eigvals, eigvecs = _decompose(self.state, params)
        model = _select(self.state, params, eigvals, eigvecs, self.sources, self.info, basis or "eigen")
        return kept_storage(model, self.storage)

    def storage_summary(self) -> dict[str, Any] | None:
        """The recorded storage (dtype, rescore, bytes per vector, the int8 record), or None."""
        if self.storage is None:
            return None
        stored, again = self.storage_records()
        return dict(
            self.storage.to_dict(),
            bytes_per_vector=self.storage.bytes_per_vector(self.n_components),
            quantization=None if stored is None else stored.to_dict(),
            rescore_quantization=None if again is None else again.to_dict(),
        )

    def to_json(self) -> dict[str, Any]:
        """Parameters and spectrum summary as plain JSON values (what ``info --json`` prints)."""
        eigvals = self.eigvals
        names = ("n_rows", "n_features", "basis", "n_components", "beta", "gamma", "eps", "eps_value", "variance")
        return {name: getattr(self, name) for name in names} | {
            "explained_variance": float(self.explained_variance_ratio[: self.n_components].sum()),
            "effective_dimension": self.effective_dimension,
            "eigval_max": float(eigvals[0]),
            "eigval_min": float(eigvals[-1]),
            "condition_number": float(eigvals[0] / eigvals[-1]) if eigvals[-1] > 0 else math.inf,
            "model_checksum": map_checksum(self),
            "storage": self.storage_summary(),
            "components_for_variance": {str(v): components_for_variance(eigvals, v) for v in (0.5, 0.9, 0.95, 0.99)},
            "sources": [source.to_dict() for source in self.sources],
            "info": self.info,
        }


def kept_storage(model: WhiteningModel, storage: Storage | None) -> WhiteningModel:
    """``model`` recording ``storage``, unless it is a vector code of another map (train one: ``with_codes``)."""
    if storage is None or (storage.codec is not None and codec_setting(model) != storage.codec.setting):
        return model
    return replace(model, storage=storage)


def codec_setting(model: WhiteningModel) -> dict[str, Any]:
    """The setting a codec records (``CodecRecord.setting``): that of the map whose outputs it codes."""
    return {"beta": model.beta, "gamma": model.gamma, "eps": model.eps, "k": model.n_components, "basis": model.basis}


def project(
    rows: npt.ArrayLike,
    weights: np.ndarray,
    shift: npt.ArrayLike,
    normalize: bool = False,
    dtype: npt.DTypeLike | None = None,
    overwrite_input: bool = False,
) -> np.ndarray:
    """``(rows - shift) @ weights`` in ``weights``' dtype, rows optionally scaled to unit L2 norm.

    Centring comes first (``rows @ W - shift @ W`` cancels for a large mean), in place with
    ``overwrite_input``; float32 values are rounded once from the exact dot product (`rounded_product`).
    """
    return project_checked(rows, weights, shift, normalize, dtype, overwrite_input)[0]


def project_checked(
    rows: npt.ArrayLike,
    weights: np.ndarray,
    shift: npt.ArrayLike,
    normalize: bool = False,
    dtype: npt.DTypeLike | None = None,
    overwrite_input: bool = False,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, npt.NDArray[np.bool_] | None]:
    """`project`, plus a mask of the rows taken as finite input, or None when every row is.

    Rows are scanned only when the centring pass's column sums are not finite. Rows centred in place are
    scanned after centring, where an overflow looks like Inf (``engine.apply`` tells them apart); else a
    finite row that overflows raises `ValuesTooLargeError`. ``out`` (C-contiguous, ``len(rows)`` rows or
    more) receives the product: the result is a view of it, unless ``dtype`` converts it.
    """
    from .kernels import statistics as kernels
    from .kernels.product import round_and_screen

    work = weights.dtype
    rows = np.ascontiguousarray(rows)
    if rows.dtype.kind in "iu" or rows.dtype == np.float16:
        rows, overwrite_input = rows.astype(work), True
    inplace = overwrite_input and rows.dtype == work and rows.flags.writeable
    centred = rows if inplace else np.empty(rows.shape, dtype=work)
    sums = kernels.center_and_sum(rows, np.asarray(shift, dtype=np.float64), centred)
    finite = None
    if not np.all(np.isfinite(sums)):
        finite = kernels.finite_row_mask(centred)
        if not inplace:
            raise_if_overflowed(~finite & kernels.finite_row_mask(rows), work, "centred")
        if finite.all():  # float64 input whose column sums overflowed
            raise ValuesTooLargeError(f"values too large for {np.dtype(work).name} arithmetic (their sums overflow)")
        centred[~finite] = 0  # keeps NaN out of the product; those output rows are set to NaN below
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked just below
        if work == np.float32:  # each value the float32 nearest its exact dot product: any batch, same bits
            into = None if out is None else out[: centred.shape[0]]
            out = rounded_product(centred, weights, into, screen=round_and_screen)
        elif out is None:
            out = centred @ weights
        else:
            out = np.matmul(centred, weights, out=out[: centred.shape[0]])
        # Row norms when normalising (needed anyway), else row sums: non-finite for any row that is.
        check = np.sqrt(np.einsum("ij,ij->i", out, out)) if normalize else out.sum(axis=1)
    if not np.all(np.isfinite(check)):  # rare: an output row overflowed (or only its norm or sum did)
        row_finite = np.isfinite(out).all(axis=1)
        raise_if_overflowed(~row_finite, work, "whitened")
    if normalize:  # finite rows whose float32 norm overflowed are normalised in float64
        scale_rows_to_unit(out, check)
    if finite is not None:
        out[~finite] = np.nan
    if dtype is not None and np.dtype(dtype) != out.dtype:
        out = cast_checked(out, dtype)
    return out, finite


def _select(
    state: Moments,
    params: dict[str, Any],
    eigvals: np.ndarray,
    eigvecs: np.ndarray,
    sources: Iterable[Fingerprint | Mapping[str, Any]] | None,
    info: Mapping[str, Any] | None,
    basis: str = "eigen",
) -> WhiteningModel:
    check_model(n_features=state.n_features, **params)
    variance = None if params["variance"] is None else float(params["variance"])
    k = int(params["n_components"] or state.n_features)
    if variance is not None:  # k chosen by the variance explained
        k = components_for_variance(eigvals, variance)
    beta, gamma, eps = (float(params[name]) for name in ("beta", "gamma", "eps"))
    eps_value = eps * float(eigvals[0]) if eigvals.size and eigvals[0] > 0 else eps
    recorded = tuple(fingerprint_of(source) for source in sources or ())
    return WhiteningModel(
        state, beta, gamma, eps, k, variance, eigvals, eigvecs, eps_value, recorded, dict(info or {}), None, basis
    )


def finalize(
    state: Moments,
    beta: float = 1.0,
    gamma: float = 1.0,
    eps: float = DEFAULT_EPS,
    n_components: int | None = None,
    variance: float | None = None,
    sources: Iterable[Fingerprint | Mapping[str, Any]] | None = None,
    info: Mapping[str, Any] | None = None,
) -> WhiteningModel:
    """Eigendecompose ``Sigma_beta`` of ``state`` and choose k (see the module docstring)."""
    params: dict[str, Any] = dict(beta=beta, gamma=gamma, eps=eps, n_components=n_components, variance=variance)
    return _select(state, params, *_decompose(state, params), sources, info)


def _decompose(state: Moments, params: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(eigvals, eigvecs)`` of ``Sigma_beta``, the setting ``params`` checked first."""
    check_model(n_features=state.n_features, **params)
    return eigendecomposition(checked_covariance(state, float(params["beta"])))


def checked_covariance(state: Moments, beta: float) -> np.ndarray:
    """``Sigma_beta`` of ``state``; `BadInputError` for fewer than 2 rows or a covariance that overflowed."""
    if state.n_rows < 2:
        raise BadInputError(f"at least 2 rows are needed to fit, got n_samples = {state.n_rows}")
    sigma = covariance(state, beta)
    if not np.all(np.isfinite(sigma)):
        raise BadInputError(
            "the covariance overflowed (values too large for float32 products); fit again with precision='float64'",
            param="precision",
        )
    return sigma


def _arrays(model: WhiteningModel) -> dict[str, np.ndarray]:
    """The model file's arrays (``storage_json`` only when a storage is recorded)."""
    arrays = {
        "format": np.array(FORMAT_NAME),
        "format_version": np.array(
            IDENTITY_FORMAT_VERSION if model.basis == "identity" else FORMAT_VERSION, dtype=np.int64
        ),
        "package_version": np.array(__version__),
        "n_rows": np.array(model.n_rows, dtype=np.int64),
        "mean": model.state.mean,
        "scatter": model.state.scatter,
        **setting_arrays(model),
        "eigvals": model.eigvals,
        "eigvecs": model.eigvecs,
        "sources_json": np.array(json.dumps([source.to_dict() for source in model.sources], sort_keys=True)),
        "info_json": np.array(json.dumps(model.info, sort_keys=True)),
    }
    if model.basis != "eigen":  # absent in the files of eigen maps, as in every file written before bases
        arrays["basis"] = np.array(model.basis)
    if model.storage is not None:
        arrays["storage_json"] = np.array(json.dumps(model.storage_summary(), sort_keys=True))
        if model.storage.codec is not None:  # the codec's own checksummed bytes, never a pickle
            arrays["storage_codec"] = np.frombuffer(model.storage.codec.data, dtype=np.uint8)
    return arrays


def file_checksum(model: WhiteningModel) -> str:
    """The content checksum of ``model``'s file (stored by `save_model`); not the map's (`map_checksum`)."""
    return checksum(_arrays(model))


def map_checksum(model: WhiteningModel) -> str:
    """The checksum of ``model``'s map (``AffineMap.checksum``): what outputs record as ``model_checksum``."""
    return model.as_affine().checksum


def check_model_name(path: str) -> None:
    """Refuse a model file name that does not end in ``.npz`` (exit 2): the name tells what a file is."""
    if not os.fspath(path).lower().endswith(MODEL_SUFFIX):
        raise BadInputError(f"{path}: a model file's name must end in {MODEL_SUFFIX}")


def check_model_output(path: str, overwrite: bool) -> None:
    """Refuse a name not ending in ``.npz``, and an existing file unless ``overwrite`` and it is a model file."""
    check_model_name(path)
    check_replaceable(os.fspath(path), overwrite, "a model file", lambda found: foreign_npz(found, FORMAT_NAME))


def save_model(model: WhiteningModel, path: str, overwrite: bool = True) -> str:
    """Save ``model`` to ``path`` (`check_model_output`); returns the file's content checksum."""
    check_model_output(path, overwrite)
    return write_npz_atomic(path, _arrays(model), "model file")


def load_model(path: str) -> WhiteningModel:
    """Load a model file written by `save_model`, every field checked (``core.validate``)."""
    fields = model_fields(read_npz(path, "model file", FORMAT_NAME, FORMAT_VERSIONS), path)
    state = Moments(fields.pop("n_rows"), fields.pop("mean"), fields.pop("scatter"))
    sources = tuple(Fingerprint.from_dict(source) for source in fields.pop("sources"))  # JSON only in the file
    return WhiteningModel(state=state, sources=sources, **fields)


def read_rows_and_sources(path: str) -> tuple[int, tuple[Fingerprint, ...]] | None:
    """The rows and source records of a model file, read without `load_model`'s checks (None: unreadable)."""
    if not os.path.isfile(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as arrays:
            n_rows = int(arrays["n_rows"])
            sources = tuple(Fingerprint.from_dict(item) for item in json.loads(str(arrays["sources_json"])))
    except Exception:  # noqa: BLE001 - not a model file of ours, or damaged: load_model says how
        return None
    return n_rows, sources


__all__ = [
    "WhiteningModel",
    "finalize",
    "project",
    "project_checked",
    "save_model",
    "check_model_output",
    "check_model_name",
    "load_model",
    "read_rows_and_sources",
    "components_for_variance",
    "effective_dimension",
    "file_checksum",
    "map_checksum",
    "codec_setting",
    "float_dtype",
    "DEFAULT_EPS",
]
