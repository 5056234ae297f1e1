"""The scikit-learn-style estimator."""

import os

import numpy as np
import pytest

from streamwhiten import Whitener
from streamwhiten.errors import BadInputError, NotFittedError

from conftest import anisotropic, write_h5, write_zarr


def test_partial_fit_in_batches_equals_fit():
    rows = anisotropic(1000, 8, seed=1)
    whole = Whitener().fit(rows)
    batched = Whitener()
    for start in range(0, 1000, 133):
        batched.partial_fit(rows[start : start + 133])
    assert batched.n_samples_seen_ == whole.n_samples_seen_ == 1000
    np.testing.assert_allclose(batched.mean_, rows.mean(0), rtol=1e-12)
    np.testing.assert_allclose(batched.covariance_, np.cov(rows, rowvar=False, bias=True), rtol=1e-10)
    np.testing.assert_allclose(batched.transform(rows), whole.transform(rows), atol=1e-9)


def test_fit_from_hdf5_and_zarr_equals_in_memory(tmp_path):
    rows = anisotropic(700, 6, seed=2)
    memory = Whitener(n_components=4).fit(rows)
    for spec in (write_h5(tmp_path / "a.h5", rows, chunk_rows=64), write_zarr(tmp_path / "a.zarr", rows, 50)):
        stored = Whitener(n_components=4).fit(spec)
        np.testing.assert_allclose(stored.covariance_, memory.covariance_, rtol=1e-11)
        np.testing.assert_allclose(stored.transform(rows), memory.transform(rows), atol=1e-9)
        assert stored.sources_[0]["n_rows"] == 700


def test_fit_several_sources_equals_concatenation(tmp_path):
    a, b = anisotropic(300, 5, seed=3), anisotropic(200, 5, seed=4, offset=-2.0)
    specs = [write_h5(tmp_path / "a.h5", a), write_zarr(tmp_path / "b.zarr", b)]
    model = Whitener().fit(specs)
    np.testing.assert_allclose(model.covariance_, np.cov(np.vstack([a, b]), rowvar=False, bias=True), rtol=1e-10)


def test_changing_parameters_needs_no_new_pass(tmp_path):
    rows = anisotropic(500, 10, seed=5)
    spec = write_h5(tmp_path / "x.h5", rows)
    whitener = Whitener().fit(spec)
    os.remove(tmp_path / "x.h5")  # the data is gone: re-finalizing must use the saved statistics only
    whitener.set_params(beta=0.0, gamma=0.0, n_components=4)
    reference = Whitener(beta=0.0, gamma=0.0, n_components=4).fit(rows)
    assert whitener.components_.shape == (4, 10)
    np.testing.assert_allclose(whitener.transform(rows), reference.transform(rows), atol=1e-9)
    whitener.set_params(n_components=None, variance=0.95)
    assert whitener.n_components_ == Whitener(beta=0.0, gamma=0.0, variance=0.95).fit(rows).n_components_


def test_save_and_load(tmp_path):
    rows = anisotropic(300, 6, seed=6)
    whitener = Whitener(beta=0.5, gamma=0.5, n_components=3).fit(rows)
    whitener.save(tmp_path / "m.npz")
    loaded = Whitener.load(tmp_path / "m.npz")
    assert loaded.get_params()["n_components"] == 3 and loaded.beta == 0.5
    np.testing.assert_array_equal(loaded.transform(rows), whitener.transform(rows))
    loaded.set_params(n_components=5)
    assert loaded.transform(rows).shape == (300, 5)


def test_fitted_attributes_and_errors():
    with pytest.raises(NotFittedError):
        Whitener().transform(np.zeros((2, 3)))
    with pytest.raises(BadInputError, match="unknown parameter"):
        Whitener().set_params(alpha=1)
    with pytest.raises(BadInputError, match="beta"):
        Whitener(beta=2).fit(anisotropic(10, 2))
    with pytest.raises(BadInputError, match="at least 2 rows"):
        Whitener().fit(np.zeros((1, 3)))
    whitener = Whitener(skip_nonfinite=True)
    rows = anisotropic(50, 3)
    rows[[3, 9]] = np.inf
    whitener.fit(rows)
    assert whitener.n_samples_seen_ == 48 and whitener.n_skipped_ == 2
    with pytest.raises(BadInputError, match="row 3 holds NaN or Inf"):
        Whitener().fit(rows)
    fitted = Whitener(n_components=2).fit(anisotropic(50, 3))
    assert fitted.eigvals_.shape == (3,) and fitted.components_.shape == (2, 3)
    assert fitted.explained_variance_ratio_.shape == (2,) and fitted.eps_ > 0
    assert fitted.n_features_in_ == 3 and fitted.effective_dimension_ > 1
