"""The scikit-learn-style estimator."""

import os

import numpy as np
import pytest

from streamwhiten import Whitener
from streamwhiten.errors import BadInputError, NonFiniteError, NotFittedError

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


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_byte_swapped_arrays_give_the_results_of_native_ones(dtype):
    rows = anisotropic(300, 6, seed=11).astype(dtype)
    swapped = rows.astype(rows.dtype.newbyteorder())
    assert not swapped.dtype.isnative and np.array_equal(swapped, rows)
    native, other = Whitener(n_components=4).fit(rows), Whitener(n_components=4).fit(swapped)
    for name in ("mean", "scatter"):
        assert getattr(other.state_, name).tobytes() == getattr(native.state_, name).tobytes()
    expected = native.transform(rows)
    np.testing.assert_array_equal(other.transform(swapped), expected)
    np.testing.assert_array_equal(Whitener(n_components=4).fit_transform(swapped), expected)
    np.testing.assert_array_equal(native.model_.transform(swapped[7]), native.model_.transform(rows[7]))
    batched = Whitener(n_components=4).partial_fit(swapped[:120]).partial_fit(swapped[120:])
    reference = Whitener(n_components=4).partial_fit(rows[:120]).partial_fit(rows[120:])
    assert batched.state_.scatter.tobytes() == reference.state_.scatter.tobytes()


@pytest.mark.parametrize("values", [
    np.arange(40).reshape(10, 4), np.arange(40, dtype=np.uint8).reshape(10, 4), np.ones((10, 4), dtype=bool),
    np.ones((10, 4), dtype=complex), np.ones((10, 4), dtype=object), np.arange(40).reshape(10, 4).astype(">i4"),
], ids=["int64", "uint8", "bool", "complex", "object", "big-endian-int"])
def test_only_float16_32_64_arrays_are_accepted(values):
    fitted = Whitener().fit(anisotropic(50, 4))
    before = fitted.state_
    message = (rf"^expected float16, float32 or float64 values, got dtype {np.dtype(values.dtype)} "
               r"\(convert with \.astype\(np\.float32\)\)$")
    for call in (Whitener().fit, Whitener().partial_fit, Whitener().fit_transform, fitted.transform,
                 fitted.model_.transform, fitted.partial_fit, lambda x: fitted.transform(x[0])):
        with pytest.raises(BadInputError, match=message):
            call(values)
    assert fitted.state_ is before  # a refused batch folds nothing
    with pytest.raises(BadInputError, match="got dtype int64"):
        Whitener().fit([[1, 2], [3, 4], [5, 7]])  # lists of Python ints too


def test_transform_raises_on_nan_or_inf_rows_unless_skip_nonfinite():
    rows = anisotropic(60, 4, seed=12)
    bad = rows.copy()
    bad[5, 1], bad[9, 0] = np.nan, -np.inf
    message = r"^row 5 holds NaN or Inf \(use skip_nonfinite=True to write NaN rows for such input\)$"
    strict = Whitener(n_components=3).fit(rows)
    for data in (bad, bad.astype(np.float32), bad.astype(np.float16)):
        for call in (strict.transform, lambda x: strict.transform(x, normalize=True), strict.model_.transform):
            with pytest.raises(NonFiniteError, match=message) as info:
                call(data)
            assert info.value.row == 5
    with pytest.raises(NonFiniteError, match="^row 0 holds NaN or Inf"):
        strict.transform(bad[9])  # a single vector
    with pytest.raises(NonFiniteError, match="^row 5 holds NaN or Inf"):
        Whitener().fit_transform(bad)  # refused by the fit already
    keep = np.setdiff1d(np.arange(60), [5, 9])
    lenient = Whitener(n_components=3, skip_nonfinite=True).fit(rows)
    for normalize in (False, True):
        out = lenient.transform(bad, normalize=normalize)
        assert np.isnan(out[[5, 9]]).all() and np.isfinite(out[keep]).all()
        np.testing.assert_allclose(out[keep], strict.transform(rows[keep], normalize=normalize), rtol=1e-12, atol=1e-12)
    assert np.isnan(lenient.transform(bad[5])).all()
    assert np.isnan(strict.model_.transform(bad, skip_nonfinite=True)[[5, 9]]).all()
    skipped = Whitener(skip_nonfinite=True).fit_transform(bad)  # rows 5 and 9 are skipped by the fit, NaN out
    assert np.isnan(skipped[[5, 9]]).all() and np.isfinite(skipped[keep]).all()
