"""The scikit-learn transformer: ``Whitener().fit(store).transform(rows)``.

A real scikit-learn estimator: every check of ``sklearn.utils.estimator_checks`` passes. Its parameters
are checked against `streamwhiten.params.PARAMS` when it fits, as the command line and job files check theirs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.exceptions import NotFittedError as _SklearnNotFittedError
from sklearn.utils.validation import validate_data

from . import errors, params
from .core import stats
from .core.model import WhiteningModel, load_model, save_model
from .errors import BadInputError
from .options import ReadOptions
from .progress import Watch
from .storage import Storage, parse_storage

if TYPE_CHECKING:
    from .records import Fingerprint

#: Rows per block when an in-memory array is fitted (bounds the float32 workspace).
IN_MEMORY_CHUNK_ROWS = 65536

#: The declared defaults, by parameter: those of the estimator below.
_D: dict[str, Any] = {name: item.default for name, item in params.PARAMS.items()}


class NotFittedError(errors.NotFittedError, _SklearnNotFittedError):
    """Raised by an unfitted Whitener: caught as streamwhiten's or as scikit-learn's ``NotFittedError``."""


def _is_store_spec(data: object) -> bool:
    if isinstance(data, (str, os.PathLike)):
        return True
    if isinstance(data, (list, tuple)) and data and all(isinstance(item, (str, os.PathLike)) for item in data):
        return True
    from .io import Source

    return isinstance(data, Source)


def _as_float_rows(X: Any) -> np.ndarray:
    """``X`` as 2-D float rows in native byte order, by scikit-learn's input rules (see the class Notes);
    NaN and Inf are left in place: the fit and the transform name the first such row."""
    from sklearn.utils.validation import check_array

    if type(X).__module__.startswith("scipy.sparse"):
        raise BadInputError(
            f"expected a dense array of rows, got a scipy.sparse {type(X).__name__} "
            "(sparse input is not supported; convert with .toarray())"
        )
    rows = X if hasattr(X, "dtype") and not hasattr(X, "columns") else None
    if rows is not None and getattr(rows.dtype, "kind", None) == "f" and rows.dtype.itemsize in (2, 4, 8):
        rows = np.asarray(rows)
        if not rows.dtype.isnative:  # swapped as it is, not widened: the same bits as native input
            rows = rows.astype(rows.dtype.newbyteorder("="))
    else:
        rows = X
    try:
        return check_array(
            rows, dtype=(np.float64, np.float32, np.float16), ensure_all_finite=False, ensure_min_samples=1
        )
    except ValueError as exc:
        raise BadInputError(str(exc)) from None


def _is_dask_array(data: object) -> bool:
    return type(data).__module__.startswith("dask") and hasattr(data, "chunks") and hasattr(data, "dask")


class Whitener(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Streaming BERT-whitening: ``y = (x - beta*mu) U_k (Lambda_k + eps_)^(-gamma/2)``.

    Parameters
    ----------
    beta : float in [0, 1]
        How much of the mean is removed; 1 centres, 0 rotates about the origin.
    gamma : float in [0, 1]
        Whitening strength; 1 scales every kept direction to unit variance, 0 only rotates.
    n_components : int, optional
        Kept dimensions k (default: all d). Mutually exclusive with ``variance``.
    variance : float in (0, 1], optional
        Keep the fewest leading components explaining at least this fraction of the variance.
    eps : float > 0
        Regulariser relative to the largest eigenvalue (``eps_ = eps * lambda_1`` is added to every
        eigenvalue), so rank-deficient data never yields NaN or Inf.
    normalize : bool
        ``transform`` scales every output row to unit L2 norm (``transform(X, normalize=...)`` overrides it).
    precision : {"auto", "float32", "float64"}
        Arithmetic of the scatter product: "auto" is float64 for float64 input, float32 otherwise
        (about 1e-7 relative error, twice as fast). Means and merges are always float64.
    skip_nonfinite : bool
        ``fit`` skips (and counts) rows with NaN/Inf and ``transform`` returns NaN rows for them,
        instead of raising `NonFiniteError`. The ``allow_nan`` tag follows it.
    n_jobs : int, optional
        Worker threads, each reducing whole blocks (default: one per core, at most four; -1: one per
        core). Memory is about one block per thread, kept until ``streamwhiten.release_buffers()``; the
        same ``n_jobs`` and ``block_rows`` on the same machine give the same bits.
    dtype : {"float32", "float16", "int8", "binary"} or a vector code "NAME:BYTES", optional
        How ``transform`` returns the vectors: None (the default) the floats it computes in (float64 for
        float64 input, float32 otherwise); ``"float32"``/``"float16"`` those values cast; ``"int8"``
        codes of the unit-length vectors (a scale and offset per component, from the statistics);
        ``"binary"`` their sign bits packed 8 per byte (``ceil(k / 8)`` uint8 per row); ``quantization_``
        decodes them. `load` takes the storage a model records, [`save`][streamwhiten.whitener.Whitener.save]
        records this one.
    read : ReadOptions, optional
        How stores are read, as ``streamwhiten.fit`` takes it (default ``ReadOptions()``): ``block_rows``
        (rows per block; an in-memory array's default is 65536), ``fill_missing_chunks``,
        ``storage_options`` (the file systems' keyword arguments of URL stores: never shown by ``repr``,
        never recorded), ``dataset`` (the ``dataset`` of `fit` wins over it), ``remote_timeout``.

    Notes
    -----
    Parameters are keyword-only. Arrays follow scikit-learn's input rules: 2-D, float16, float32 and
    float64 rows are used as they are, integer, bool and numeric object arrays are converted to float64
    (as ``PCA`` does); complex, non-numeric, sparse and 1-D input is refused with scikit-learn's message,
    as `BadInputError` (a ``ValueError``). Stores given by spec must hold floats, as on the command line.
    Changing ``beta``, ``gamma``, ``n_components``, ``variance`` or ``eps`` after fitting (``set_params``)
    re-finalizes from the saved statistics without another pass over the data.

    Examples
    --------
    >>> import numpy as np
    >>> from streamwhiten import Whitener
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((5000, 8)) @ rng.standard_normal((8, 8)) + 3.0   # anisotropic, off-centre
    >>> w = Whitener(n_components=4).fit(X)        # or .fit("corpus.h5:/embeddings"), a list of stores
    >>> Y = w.transform(X)
    >>> Y.shape
    (5000, 4)
    >>> bool(np.allclose(np.cov(Y, rowvar=False, bias=True), np.eye(4), atol=1e-3))   # whitened
    True
    >>> w.get_feature_names_out().tolist()
    ['whitener0', 'whitener1', 'whitener2', 'whitener3']
    >>> w.set_params(n_components=2).transform(X).shape   # re-finalized, no second pass
    (5000, 2)
    """

    # Set by a fit, absent before (scikit-learn's fitted attributes): declared for type checkers only.
    state_: stats.Moments
    n_skipped_: int
    sources_: Sequence[Fingerprint]

    def __init__(
        self,
        *,
        beta: float = _D["beta"],
        gamma: float = _D["gamma"],
        n_components: int | None = _D["n_components"],
        variance: float | None = _D["variance"],
        eps: float = _D["eps"],
        normalize: bool = _D["normalize"],
        precision: str = _D["precision"],
        skip_nonfinite: bool = _D["skip_nonfinite"],
        n_jobs: int | None = _D["n_jobs"],
        dtype: str | None = None,
        read: ReadOptions | None = None,
    ):
        self.beta = beta
        self.gamma = gamma
        self.n_components = n_components
        self.variance = variance
        self.eps = eps
        self.normalize = normalize
        self.precision = precision
        self.skip_nonfinite = skip_nonfinite
        self.n_jobs = n_jobs
        self.dtype = dtype
        self.read = read  # its storage options show their names only (`StorageOptions`): repr hides the secrets

    # -- scikit-learn protocol ------------------------------------------------------------------------
    def set_params(self, **params: Any) -> Whitener:
        valid = self.get_params(deep=False)
        for name in params:
            if name not in valid:
                raise BadInputError(f"unknown parameter {name!r} for Whitener; valid: {', '.join(valid)}")
        return super().set_params(**params)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = bool(self.skip_nonfinite)
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]  # float16 is computed in float32
        return tags

    def __sklearn_is_fitted__(self) -> bool:
        return "state_" in self.__dict__

    @property
    def _n_features_out(self) -> int:  # for get_feature_names_out: whitener0, whitener1, ...
        return self.n_components_

    def _check_params(self, n_features: int | None = None):
        """Check every parameter against `streamwhiten.params.PARAMS` (done when fitting, not in
        ``__init__`` or ``set_params``, as scikit-learn expects)."""
        for name, value in self.get_params(deep=False).items():
            if name != "read":
                params.check(name, value)
        if self.read is not None and not isinstance(self.read, ReadOptions):
            raise BadInputError(f"read must be a ReadOptions or None, got {self.read!r}")
        params.check_model(self.beta, self.gamma, self.eps, self.n_components, self.variance, n_features)

    def _rows(self, X: Any, reset: bool) -> np.ndarray:
        """``X`` as 2-D float rows by scikit-learn's input rules (see `_as_float_rows`); records
        (``reset``) or checks the feature count and names."""
        rows = _as_float_rows(X)
        if rows.shape[1] == 0:
            raise BadInputError(f"0 feature(s) (shape={rows.shape}) while a minimum of 1 is required (no columns)")
        validate_data(self, X, reset=reset, skip_check_array=True)  # n_features_in_, feature_names_in_
        return rows

    # -- fitting -------------------------------------------------------------------------------------
    def _reset(self):
        for name in ("state_", "sources_", "n_skipped_", "n_features_in_", "feature_names_in_", "_model"):
            self.__dict__.pop(name, None)

    def partial_fit(self, X: Any, y: object = None) -> Whitener:
        """Fold one in-memory batch of rows (float16, float32 or float64) into the statistics."""
        self._check_params()
        first = "state_" not in self.__dict__
        rows = self._rows(X, reset=first)
        state = stats.Moments.empty(rows.shape[1]) if first else self.state_
        from .engine.fit import fold_array

        try:
            state, n_skipped = fold_array(
                state,
                rows,
                int(self.read and self.read.block_rows or IN_MEMORY_CHUNK_ROWS),
                self.precision,
                self.skip_nonfinite,
                self.n_jobs,
            )
        except BaseException:
            if first:  # a refused first batch leaves the estimator as unfitted as it was
                self._reset()
            raise
        self.n_skipped_ = n_skipped + (0 if first else self.n_skipped_)
        self.state_ = state
        self.sources_ = [] if first else self.sources_
        self.__dict__.pop("_model", None)
        return self

    def fit(
        self, X: Any, y: object = None, dataset: str | None = None, progress: Callable[[int, int], None] | None = None
    ) -> Whitener:
        """Fit on an in-memory array (or DataFrame), a store spec (``"file.h5:/ds"``, ``"dir.zarr"``), a
        list of specs, or a dask array. Statistics are exact whatever the chunking."""
        self._check_params()
        self._reset()
        if _is_store_spec(X):
            self._fit_stores(X, dataset, progress)
        elif _is_dask_array(X):
            from .engine.distributed import fit_dask_array

            result = fit_dask_array(X, precision=self.precision, skip_nonfinite=self.skip_nonfinite)
            self.state_, self.n_skipped_, self.sources_ = result.state, result.n_skipped, result.sources
            self.n_features_in_ = result.state.n_features
        else:
            self.partial_fit(X)
        try:
            self._finalized()  # validates (at least 2 rows, k <= d) and caches the model
        except BaseException:
            self._reset()  # a fit that failed leaves the estimator unfitted
            raise
        return self

    def _fit_stores(self, specs: list[str], dataset: str | None, progress: Callable[[int, int], None] | None) -> None:
        """Fit on stores by the one pipeline of the command line (``streamwhiten.fit``), saving nothing."""
        from .options import EngineOptions, FitOptions, Setting
        from .pipeline import fit

        setting = Setting(
            beta=self.beta, gamma=self.gamma, n_components=self.n_components, variance=self.variance, eps=self.eps
        )
        read = self.read or ReadOptions()
        if dataset is not None:
            read = replace(read, dataset=dataset)
        outcome = fit(
            specs,
            setting=setting,
            options=FitOptions(precision=self.precision, skip_nonfinite=self.skip_nonfinite),
            read=read,
            engine=EngineOptions(threads=self.n_jobs),
            watch=Watch(progress),
        )
        model = outcome.model
        self.state_, self.n_skipped_, self.sources_ = model.state, outcome.n_skipped, model.sources
        self.n_features_in_ = model.n_features
        self._model = (self._key(), self._with_storage(model))

    def fit_transform(self, X: Any, y: object = None, normalize: bool | None = None, **fit_params: Any) -> np.ndarray:
        """``fit(X).transform(X)``; for a store spec, use ``fit`` and then transform arrays."""
        return self.fit(X, y, **fit_params).transform(X, normalize=normalize)

    # -- the finalized model -------------------------------------------------------------------------
    def _key(self) -> tuple:
        """What the cached model was finalized with: the setting and ``dtype``."""
        return (self.beta, self.gamma, self.eps, self.n_components, self.variance, self.dtype)

    def _finalized(self) -> WhiteningModel:
        if "state_" not in self.__dict__:
            raise NotFittedError("this Whitener is not fitted yet: call fit or partial_fit first")
        key = self._key()
        cached = self.__dict__.get("_model")
        if cached is not None and cached[0] == key and cached[1].state is self.state_:
            return cached[1]
        self._check_params(self.state_.n_features)
        model_params = dict(
            beta=self.beta, gamma=self.gamma, eps=self.eps, n_components=self.n_components, variance=self.variance
        )
        if cached is not None and cached[1].state is self.state_:
            model = cached[1].with_params(**model_params)
        else:
            from .engine.fit import FitResult, finalize_fit

            model = finalize_fit(
                FitResult(
                    self.state_,
                    int(self.n_skipped_),
                    self.sources_,
                    precision=self.precision,
                    skip_nonfinite=bool(self.skip_nonfinite),
                    fill_missing_chunks=bool(self.read and self.read.fill_missing_chunks),
                ),
                model_params,
            )
        model = self._with_storage(model)
        self._model = (key, model)
        return model

    def _with_storage(self, model: WhiteningModel) -> WhiteningModel:
        """``model`` recording this estimator's ``dtype`` as its storage (kept as it is when it already does)."""
        from dataclasses import replace

        from .core.quantize import DEFAULT_INT8_CLIP

        wanted = self._storage()
        if wanted is None or wanted.names(model.storage or Storage()):
            return model
        if wanted.code is not None:  # the code, recorded as the model's storage (its codec's bytes)
            from .codes import NEEDS_SAMPLE
            from .pipeline import with_codes

            if wanted.code in NEEDS_SAMPLE:
                return model  # a code that learns from a sample is recorded by with_codes, with its sample
            return with_codes(model, wanted)
        clip = model.storage.int8_clip if model.storage is not None else DEFAULT_INT8_CLIP
        return replace(model, storage=Storage(wanted.dtype, int8_clip=clip))

    def _storage(self) -> Storage | None:
        """The ``dtype`` parameter as a `Storage` (None: the floats computed in), parsed where the estimator
        uses it: a scikit-learn parameter is kept as it was given."""
        return None if self.dtype is None else parse_storage(self.dtype)

    @property
    def model_(self) -> WhiteningModel:
        return self._finalized()

    @property
    def n_samples_seen_(self) -> int:
        return self._finalized().n_rows

    @property
    def mean_(self) -> np.ndarray:
        return self._finalized().mean

    @property
    def covariance_(self) -> np.ndarray:
        """``Sigma_beta`` at the current ``beta``."""
        return stats.covariance(self._finalized().state, self.beta)

    @property
    def eigvals_(self) -> np.ndarray:
        """All d eigenvalues of ``Sigma_beta``, descending."""
        return self._finalized().eigvals

    @property
    def components_(self) -> np.ndarray:
        """The k kept eigenvectors as rows, shape (k, d), like scikit-learn's PCA."""
        model = self._finalized()
        return model.eigvecs[:, : model.n_components].T

    @property
    def n_components_(self) -> int:
        return self._finalized().n_components

    @property
    def eps_(self) -> float:
        """The absolute regulariser added to the eigenvalues."""
        return self._finalized().eps_value

    @property
    def explained_variance_ratio_(self) -> np.ndarray:
        model = self._finalized()
        return model.explained_variance_ratio[: model.n_components]

    @property
    def effective_dimension_(self) -> float:
        return self._finalized().effective_dimension

    @property
    def quantization_(self):
        """The record of how ``transform`` stores its output (`Quantization`:
        kind, scale and offset of int8 codes, ...), None when ``dtype`` is None."""
        wanted = self._storage()
        if wanted is None or wanted.code is not None:  # a vector code: its codec is the model's (model_.storage)
            self._finalized()
            return None
        return self._finalized().quantization(wanted.dtype, normalize=bool(self.normalize))

    # -- using it ------------------------------------------------------------------------------------
    def transform(self, X: Any, normalize: bool | None = None) -> np.ndarray:
        """Whiten rows (a 2-D array or DataFrame, or a single vector); output float64 for float64
        input, float32 otherwise. ``normalize`` (default: the ``normalize`` parameter) scales each
        output row to unit L2 norm.

        A row holding NaN or Inf raises `NonFiniteError`, unless
        ``skip_nonfinite``: its output row is then NaN. A dask array gives a lazy dask array,
        transformed block by block when computed. As every scikit-learn transformer, it takes 2-D input
        only: one vector is ``X.reshape(1, -1)`` (``model_.transform`` and the serving path take one
        vector as it is)."""
        model = self._finalized()
        normalize = params.check("normalize", self.normalize if normalize is None else normalize)
        if _is_dask_array(X):
            from .engine.distributed import transform_dask

            return transform_dask(model, X, normalize=normalize, skip_nonfinite=self.skip_nonfinite)
        rows = self._rows(X, reset=False)  # width and feature names as fitted
        wanted = self._storage()
        if wanted is None:
            return model.transform(rows, normalize=normalize, skip_nonfinite=self.skip_nonfinite)
        if wanted.coded and self.skip_nonfinite:
            raise BadInputError(
                f"dtype {str(wanted)!r} cannot hold the NaN rows skip_nonfinite writes: use a float dtype"
            )
        if wanted.code is not None:  # a vector code of the unit outputs: the model's, else trained here
            from .codes.storage import resolve

            stored = resolve(model, wanted)
            assert stored is not None  # a code is always stored coded
            unit = model.transform(rows, normalize=True).astype(np.float32, copy=False)
            return np.asarray(stored.encoder.encode(unit))
        record = model.quantization(wanted.dtype, normalize=normalize)
        values = model.transform(
            rows, normalize=record.normalized if record else normalize, skip_nonfinite=self.skip_nonfinite
        )
        return values.astype(np.float32) if record is None else record.encode(values)

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the model file (pickle-free ``.npz``; the name must end in ``.npz``, and an existing file is
        replaced only if it is a model file: ``core.model.check_model_output``); returns its content checksum."""
        return save_model(self._finalized(), os.fspath(path))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Whitener:
        return cls.from_model(load_model(os.fspath(path)))

    @classmethod
    def from_model(cls, model: WhiteningModel) -> Whitener:
        n_components = None if model.variance is not None else model.n_components
        whitener = cls(
            beta=model.beta,
            gamma=model.gamma,
            n_components=n_components,
            variance=model.variance,
            eps=model.eps,
            # a vector code is the model's storage for search, not what transform returns: floats
            dtype=None if model.storage is None or model.storage.codec is not None else model.storage.dtype,
        )
        whitener.state_ = model.state
        whitener.sources_ = model.sources
        whitener.n_skipped_ = int(model.info.get("n_skipped_nonfinite", 0))
        whitener.n_features_in_ = model.n_features
        whitener._model = (whitener._key(), model)
        return whitener
