"""The scikit-learn-style estimator: ``Whitener().fit(store).transform(rows)``."""

from __future__ import annotations

import os

import numpy as np

from . import stats
from ._threads import resolve_threads
from .errors import BadInputError, NotFittedError
from .model import DEFAULT_EPS, WhiteningModel, check_params, finalize, float_rows, load_model, save_model

#: Rows per chunk when an in-memory array is fitted (bounds the float32 workspace).
IN_MEMORY_CHUNK_ROWS = 65536


def _is_store_spec(data) -> bool:
    if isinstance(data, (str, os.PathLike)):
        return True
    if isinstance(data, (list, tuple)) and data and all(isinstance(item, (str, os.PathLike)) for item in data):
        return True
    from .io import Source

    return isinstance(data, Source)


def _is_dask_array(data) -> bool:
    return type(data).__module__.startswith("dask") and hasattr(data, "chunks") and hasattr(data, "dask")


class Whitener:
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
    precision : {"auto", "float32", "float64"}
        Arithmetic of the scatter product: "auto" is float64 for float64 input, float32 otherwise
        (about 1e-7 relative error, twice as fast). Means and merges are always float64.
    skip_nonfinite : bool
        ``fit`` skips (and counts) rows with NaN/Inf and ``transform`` returns NaN rows for them,
        instead of raising :class:`~streamwhiten.errors.NonFiniteError`.
    chunk_rows : int, optional
        Rows per block read from a store (default: whole store chunks, about 64 MiB) or taken from an
        in-memory array (default 65536).
    n_jobs : int, optional
        Worker threads, each reducing whole blocks (default: one per core, at most four; -1: one per
        core). Memory is about one block per thread, kept for the next fit in the process until
        ``streamwhiten.release_buffers()``; the same ``n_jobs`` and ``chunk_rows`` on the same
        machine give the same bits (float32 BLAS rounding can depend on its threads per call).
    fill_missing_chunks : bool
        Read chunks missing from a Zarr store (or never written in an HDF5 dataset) as the array's
        fill value. By default such a store is refused with an error naming the rows: a hole in an
        embedding store is almost always damage, not data.

    Changing ``beta``, ``gamma``, ``n_components``, ``variance`` or ``eps`` after fitting (``set_params``)
    re-finalizes from the saved statistics without another pass over the data.
    """

    _param_names = ("beta", "gamma", "n_components", "variance", "eps", "precision", "skip_nonfinite", "chunk_rows",
                    "n_jobs", "fill_missing_chunks")

    def __init__(
        self, beta=1.0, gamma=1.0, n_components=None, variance=None, eps=DEFAULT_EPS,
        precision="auto", skip_nonfinite=False, chunk_rows=None, n_jobs=None, fill_missing_chunks=False,
    ):
        self.beta = beta
        self.gamma = gamma
        self.n_components = n_components
        self.variance = variance
        self.eps = eps
        self.precision = precision
        self.skip_nonfinite = skip_nonfinite
        self.chunk_rows = chunk_rows
        self.n_jobs = n_jobs
        self.fill_missing_chunks = fill_missing_chunks

    # -- scikit-learn protocol ------------------------------------------------------------------------
    def get_params(self, deep=True) -> dict:
        return {name: getattr(self, name) for name in self._param_names}

    def set_params(self, **params) -> "Whitener":
        for name, value in params.items():
            if name not in self._param_names:
                raise BadInputError(f"unknown parameter {name!r}; valid: {', '.join(self._param_names)}")
            setattr(self, name, value)
        return self

    def __repr__(self):
        changed = {k: v for k, v in self.get_params().items() if v != Whitener().get_params()[k]}
        return f"Whitener({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    def _check_params(self, n_features=None):
        check_params(self.beta, self.gamma, self.eps, self.n_components, self.variance, n_features)
        stats.working_dtype(np.float32, self.precision)
        resolve_threads(self.n_jobs)
        if self.chunk_rows is not None and (isinstance(self.chunk_rows, bool) or int(self.chunk_rows) < 1):
            raise BadInputError(f"chunk_rows must be at least 1, got {self.chunk_rows!r}")

    # -- fitting -------------------------------------------------------------------------------------
    def _reset(self):
        for name in ("state_", "sources_", "n_skipped_", "_model"):
            self.__dict__.pop(name, None)

    def partial_fit(self, X, y=None) -> "Whitener":
        """Fold one in-memory batch of rows (float16, float32 or float64) into the statistics."""
        self._check_params()
        rows = float_rows(X)
        if rows.ndim != 2:
            raise BadInputError(f"expected a 2-D array (rows x features), got shape {rows.shape}")
        state = getattr(self, "state_", None) or stats.Moments.empty(rows.shape[1])
        if rows.shape[1] != state.n_features:
            raise BadInputError(f"expected {state.n_features} features as in earlier batches, got {rows.shape[1]}")
        from .fit import fold_array

        state, n_skipped = fold_array(state, rows, int(self.chunk_rows or IN_MEMORY_CHUNK_ROWS), self.precision,
                                      self.skip_nonfinite, self.n_jobs)
        n_skipped += getattr(self, "n_skipped_", 0)
        self.state_ = state
        self.n_skipped_ = n_skipped
        self.sources_ = getattr(self, "sources_", [])
        self.__dict__.pop("_model", None)
        return self

    def fit(self, X, y=None, dataset=None, progress=None) -> "Whitener":
        """Fit on an in-memory array, a store spec (``"file.h5:/ds"``, ``"dir.zarr"``), a list of specs,
        or a dask array. Statistics are exact whatever the chunking."""
        self._check_params()
        self._reset()
        if _is_store_spec(X):
            from .fit import fit_sources

            result = fit_sources(
                X, dataset=dataset, precision=self.precision, skip_nonfinite=self.skip_nonfinite,
                block_rows=self.chunk_rows, progress=progress, threads=self.n_jobs,
                fill_missing_chunks=self.fill_missing_chunks,
            )
            self.state_, self.n_skipped_, self.sources_ = result.state, result.n_skipped, result.sources
        elif _is_dask_array(X):
            from .distributed import fit_dask_array

            result = fit_dask_array(X, precision=self.precision, skip_nonfinite=self.skip_nonfinite)
            self.state_, self.n_skipped_, self.sources_ = result.state, result.n_skipped, []
        else:
            self.partial_fit(X)
        self._finalized()  # validates (at least 2 rows, k <= d) and caches the model
        return self

    def fit_transform(self, X, y=None, normalize=False):
        return self.fit(X).transform(X, normalize=normalize)

    # -- the finalized model -------------------------------------------------------------------------
    def _finalized(self) -> WhiteningModel:
        if "state_" not in self.__dict__:
            raise NotFittedError("this Whitener is not fitted yet: call fit or partial_fit first")
        key = (self.beta, self.gamma, self.eps, self.n_components, self.variance)
        cached = self.__dict__.get("_model")
        if cached is not None and cached[0] == key and cached[1].state is self.state_:
            return cached[1]
        self._check_params(self.state_.n_features)
        params = dict(beta=self.beta, gamma=self.gamma, eps=self.eps, n_components=self.n_components, variance=self.variance)
        if cached is not None and cached[1].state is self.state_:
            model = cached[1].with_params(**params)
        else:
            info = {"n_skipped_nonfinite": int(self.n_skipped_)}
            model = finalize(self.state_, sources=self.sources_, info=info, **params)
        self._model = (key, model)
        return model

    @property
    def model_(self) -> WhiteningModel:
        return self._finalized()

    @property
    def n_samples_seen_(self) -> int:
        return self._finalized().n_rows

    @property
    def n_features_in_(self) -> int:
        return self._finalized().n_features

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

    # -- using it ------------------------------------------------------------------------------------
    def transform(self, X, normalize: bool = False) -> np.ndarray:
        """Whiten rows (or a single vector); output float64 for float64 input, float32 otherwise.

        A row holding NaN or Inf raises :class:`~streamwhiten.errors.NonFiniteError`, unless
        ``skip_nonfinite``: its output row is then NaN. A dask array gives a lazy dask array,
        transformed block by block when computed."""
        if _is_dask_array(X):
            from .distributed import transform_dask

            return transform_dask(self._finalized(), X, normalize=normalize, skip_nonfinite=self.skip_nonfinite)
        return self._finalized().transform(X, normalize=normalize, skip_nonfinite=self.skip_nonfinite)

    def save(self, path) -> str:
        """Write the model file (pickle-free ``.npz``); returns its content checksum."""
        return save_model(self._finalized(), os.fspath(path))

    @classmethod
    def load(cls, path) -> "Whitener":
        model = load_model(os.fspath(path))
        return cls.from_model(model)

    @classmethod
    def from_model(cls, model: WhiteningModel) -> "Whitener":
        n_components = None if model.variance is not None else model.n_components
        whitener = cls(beta=model.beta, gamma=model.gamma, n_components=n_components, variance=model.variance, eps=model.eps)
        whitener.state_ = model.state
        whitener.sources_ = model.sources
        whitener.n_skipped_ = int(model.info.get("n_skipped_nonfinite", 0))
        key = (whitener.beta, whitener.gamma, whitener.eps, whitener.n_components, whitener.variance)
        whitener._model = (key, model)
        return whitener
