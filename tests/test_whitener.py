"""The scikit-learn-style estimator."""

import os

import numpy as np
import pytest
from conftest import anisotropic, write_h5, write_zarr

from streamwhiten import ReadOptions, Whitener
from streamwhiten.errors import BadInputError, NonFiniteError, NotFittedError


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
        assert stored.sources_[0].n_rows == 700


def test_fit_several_sources_equals_concatenation(tmp_path):
    a, b = anisotropic(300, 5, seed=3), anisotropic(200, 5, seed=4, offset=-2.0)
    specs = [write_h5(tmp_path / "a.h5", a), write_zarr(tmp_path / "b.zarr", b)]
    model = Whitener().fit(specs)
    np.testing.assert_allclose(model.covariance_, np.cov(np.vstack([a, b]), rowvar=False, bias=True), rtol=1e-10)


def test_read_options_are_one_parameter_that_clones_pickles_and_hides_its_secrets(tmp_path):
    import pickle

    from sklearn.base import clone

    from streamwhiten.engine.fit import fit_sources

    rows = anisotropic(700, 6, seed=2)
    spec = write_h5(tmp_path / "a.h5", rows, dataset="x", chunk_rows=64)
    read = ReadOptions(dataset="x", block_rows=100, storage_options={"key": "id", "secret": "s3cr3t-value"})
    whitener = Whitener(n_components=3, read=read)
    assert clone(whitener).get_params()["read"] == read and whitener.set_params(read=read).read is read
    fitted = whitener.fit(str(tmp_path / "a.h5"))  # the dataset and the blocks are read's
    assert fitted.state_ == fit_sources(spec, block_rows=100).state != fit_sources(spec).state
    shown = [repr(fitted), fitted._repr_html_()]
    assert all("s3cr3t-value" not in text and "secret" in text for text in shown)
    again = pickle.loads(pickle.dumps(fitted))
    assert again.read == read and again.read.storage_options["secret"] == "s3cr3t-value"
    np.testing.assert_array_equal(again.transform(rows), fitted.transform(rows))
    filled = Whitener(read=ReadOptions(fill_missing_chunks=True)).fit(rows).model_.info["fill_missing_chunks"]
    assert filled is True and Whitener().fit(rows).model_.info["fill_missing_chunks"] is False
    with pytest.raises(BadInputError, match=r"^read must be a ReadOptions or None, got \{'block_rows': 5\}"):
        Whitener(read={"block_rows": 5}).fit(rows)


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


@pytest.mark.parametrize(
    "values",
    [
        np.arange(40).reshape(10, 4) * 3 % 7,
        (np.arange(40, dtype=np.uint8).reshape(10, 4) * 5) % 11,
        np.arange(40).reshape(10, 4) % 3 == 0,
        (np.arange(40).reshape(10, 4) * 3 % 7).astype(">i4"),
        (np.arange(40).reshape(10, 4) * 3 % 7).astype(np.int8),
        (np.arange(40).reshape(10, 4) * 3 % 7).astype(object),
    ],
    ids=["int64", "uint8", "bool", "big-endian-int", "int8", "numeric-object"],
)
def test_integer_bool_and_numeric_object_arrays_are_converted_to_float64(values):
    """scikit-learn's rule (PCA's): such input is used as float64, in fit, partial_fit and transform."""
    as_float = np.asarray(values, dtype=np.float64)
    reference = Whitener(n_components=3).fit(as_float)
    for fitted in (Whitener(n_components=3).fit(values), Whitener(n_components=3).partial_fit(values)):
        assert fitted.state_.scatter.tobytes() == reference.state_.scatter.tobytes()
        assert fitted.state_.mean.dtype == np.float64
        out = fitted.transform(values)
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, reference.transform(as_float))
    np.testing.assert_array_equal(Whitener(n_components=3).fit_transform(values), reference.transform(as_float))


@pytest.mark.parametrize(
    "values, message",
    [
        (np.ones((10, 4), dtype=complex), "^Complex data not supported"),
        (np.full((10, 4), "a", dtype=object), "could not convert string to float"),
    ],
    ids=["complex", "text-object"],
)
def test_complex_and_non_numeric_arrays_are_refused_with_scikit_learns_words(values, message):
    fitted = Whitener().fit(anisotropic(50, 4))
    before = fitted.state_
    for call in (
        Whitener().fit,
        Whitener().partial_fit,
        Whitener().fit_transform,
        fitted.transform,
        fitted.partial_fit,
    ):
        with pytest.raises(BadInputError, match=message):
            call(values)
    assert fitted.state_ is before  # a refused batch folds nothing


def test_the_model_itself_takes_floats_only():
    """``WhiteningModel.transform`` (core, as stores on the command line) keeps the floats-only rule."""
    fitted = Whitener().fit(anisotropic(50, 4))
    message = r"^expected float16, float32 or float64 values, got dtype int64 \(convert with \.astype\(np\.float32\)\)$"
    with pytest.raises(BadInputError, match=message):
        fitted.model_.transform(np.arange(40).reshape(10, 4))


def test_transform_of_a_1d_array_asks_to_reshape_as_scikit_learn_does():
    fitted = Whitener(n_components=3).fit(anisotropic(50, 4))
    vector = anisotropic(50, 4)[3]
    with pytest.raises(BadInputError, match="(?s)^Expected 2D array, got 1D array instead.*Reshape your data"):
        fitted.transform(vector)
    np.testing.assert_array_equal(fitted.transform(vector.reshape(1, -1))[0], fitted.model_.transform(vector))


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
        strict.transform(bad[9:10])  # a single row
    with pytest.raises(NonFiniteError, match="^row 5 holds NaN or Inf"):
        Whitener().fit_transform(bad)  # refused by the fit already
    keep = np.setdiff1d(np.arange(60), [5, 9])
    lenient = Whitener(n_components=3, skip_nonfinite=True).fit(rows)
    for normalize in (False, True):
        out = lenient.transform(bad, normalize=normalize)
        assert np.isnan(out[[5, 9]]).all() and np.isfinite(out[keep]).all()
        np.testing.assert_allclose(out[keep], strict.transform(rows[keep], normalize=normalize), rtol=1e-12, atol=1e-12)
    assert np.isnan(lenient.transform(bad[5:6])).all()
    assert np.isnan(strict.model_.transform(bad, skip_nonfinite=True)[[5, 9]]).all()
    skipped = Whitener(skip_nonfinite=True).fit_transform(bad)  # rows 5 and 9 are skipped by the fit, NaN out
    assert np.isnan(skipped[[5, 9]]).all() and np.isfinite(skipped[keep]).all()


# ----------------------------------------------------------------------------------- scikit-learn

from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402


@parametrize_with_checks([Whitener(), Whitener(skip_nonfinite=True)])
def test_scikit_learn_common_checks(estimator, check):
    """Every common check passes: none is expected to fail."""
    check(estimator)


def _whiten_reference(X, k):
    """Whitening with numpy alone: eigh of the float64 covariance, signs as the model's (each
    eigenvector's largest-magnitude entry positive), y = (x - mu) U_k (Lambda_k + eps*lambda_1)^(-1/2)."""
    X = np.asarray(X, dtype=np.float64)
    mu = X.mean(axis=0)
    values, vectors = np.linalg.eigh(np.cov(X, rowvar=False, bias=True))
    values, vectors = values[::-1], vectors[:, ::-1]
    vectors = vectors * np.sign(vectors[np.argmax(np.abs(vectors), axis=0), np.arange(vectors.shape[1])])
    return (X - mu) @ vectors[:, :k] / np.sqrt(values[:k] + 1e-6 * values[0])


def test_grid_search_over_a_pipeline_with_pandas_output():
    pd = pytest.importorskip("pandas")
    from sklearn.base import clone
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV, StratifiedKFold, cross_val_score
    from sklearn.pipeline import Pipeline

    rng = np.random.default_rng(19)
    n, d = 600, 6
    latent = rng.standard_normal((n, d)) * np.array([8.0, 5.0, 3.0, 2.0, 1.0, 0.05])
    y = (latent[:, -1] > 0).astype(int)  # the class lives in the direction of least variance
    X = pd.DataFrame(
        latent @ np.linalg.qr(rng.standard_normal((d, d)))[0].T + 4.0,
        columns=[f"e{i}" for i in range(d)],
        index=pd.RangeIndex(1000, 1000 + n),
    )
    pipe = Pipeline([("whiten", Whitener()), ("clf", LogisticRegression())]).set_output(transform="pandas")
    cv = StratifiedKFold(3, shuffle=True, random_state=0)
    search = GridSearchCV(pipe, {"whiten__n_components": [1, 3, d], "whiten__gamma": [0.0, 1.0]}, cv=cv)
    search.fit(X, y)
    # Only k = d keeps the class's direction; gamma = 1 puts it on the scale of the others.
    assert search.best_params_ == {"whiten__gamma": 1.0, "whiten__n_components": d}
    scores = dict(zip(map(str, search.cv_results_["params"]), search.cv_results_["mean_test_score"], strict=False))
    assert search.best_score_ > 0.95 and scores[str({"whiten__gamma": 1.0, "whiten__n_components": 1})] < 0.7
    # The search's scores are those of scikit-learn's own cross-validation of the same pipeline.
    by_hand = cross_val_score(clone(pipe).set_params(whiten__n_components=d, whiten__gamma=1.0), X, y, cv=cv)
    np.testing.assert_allclose(search.best_score_, by_hand.mean(), rtol=1e-12)

    whitener = search.best_estimator_.named_steps["whiten"]
    assert list(whitener.feature_names_in_) == list(X.columns) and whitener.n_features_in_ == d
    out = search.best_estimator_[:-1].transform(X)
    assert isinstance(out, pd.DataFrame)
    assert list(out.columns) == [f"whitener{i}" for i in range(d)] == list(whitener.get_feature_names_out())
    assert out.index.equals(X.index)
    np.testing.assert_allclose(out.to_numpy(), _whiten_reference(X, d), rtol=1e-8, atol=1e-8)
    with pytest.raises(ValueError, match="feature names should match"):
        whitener.transform(X.rename(columns={"e0": "other"}))


def test_the_estimator_protocol():
    from sklearn.base import clone
    from sklearn.exceptions import NotFittedError as SklearnNotFitted
    from sklearn.utils import get_tags
    from sklearn.utils.validation import check_is_fitted

    with pytest.raises(TypeError):
        Whitener(1.0)  # keyword-only parameters
    with pytest.raises(SklearnNotFitted):
        check_is_fitted(Whitener())
    for call in (Whitener().get_feature_names_out, lambda: Whitener().transform(np.ones((2, 2)))):
        with pytest.raises(SklearnNotFitted):
            call()
    with pytest.raises(NotFittedError):  # streamwhiten's, too
        Whitener().transform(np.ones((2, 2)))
    assert get_tags(Whitener()).input_tags.allow_nan is False
    assert get_tags(Whitener(skip_nonfinite=True)).input_tags.allow_nan is True
    rows = anisotropic(200, 5, seed=3)
    fitted = Whitener(n_components=3, normalize=True).fit(rows)
    check_is_fitted(fitted)
    assert list(fitted.get_feature_names_out()) == ["whitener0", "whitener1", "whitener2"]
    copy = clone(fitted)
    assert copy.get_params() == fitted.get_params() and not hasattr(copy, "state_")
    assert repr(Whitener(beta=0.5, n_components=3)) == "Whitener(beta=0.5, n_components=3)"
    assert "Whitener" in fitted._repr_html_()
    out = fitted.transform(rows)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-12)  # normalize, as a parameter
    reference = _whiten_reference(rows, 3)
    np.testing.assert_allclose(fitted.transform(rows, normalize=False), reference, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(out, reference / np.linalg.norm(reference, axis=1, keepdims=True), rtol=1e-8)
    with pytest.raises(BadInputError, match="0 feature"):
        Whitener().fit(np.zeros((5, 0)))
    with pytest.raises(BadInputError, match="sparse"):
        Whitener().fit(pytest.importorskip("scipy.sparse").csr_matrix(rows))
    with pytest.raises(ValueError, match="X has 4 features, but Whitener is expecting 5 features"):
        fitted.transform(rows[:, :4])


def test_a_refused_batch_leaves_no_fitted_attribute_behind():
    bad = anisotropic(30, 3)
    bad[4, 1] = np.nan
    whitener = Whitener()
    with pytest.raises(NonFiniteError, match="^row 4 holds NaN or Inf"):
        whitener.partial_fit(bad)
    assert not any(name.endswith("_") for name in vars(whitener))
    with pytest.raises(BadInputError, match="at least 2 rows"):
        whitener.fit(bad[:1])
    assert not any(name.endswith("_") for name in vars(whitener))


def test_dtype_returns_int8_codes_or_packed_bits_with_the_record_as_an_attribute(tmp_path):
    from sklearn.base import clone

    from streamwhiten.core.quantize import int8_for_map

    rows = anisotropic(800, 10, seed=7)
    plain = Whitener(n_components=6).fit(rows)
    unit = plain.transform(rows, normalize=True)
    assert plain.dtype is None and plain.quantization_ is None
    for dtype in ("float32", "float16"):
        estimator = clone(plain).set_params(dtype=dtype).fit(rows)
        got = estimator.transform(rows)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, plain.transform(rows).astype(dtype))
    int8 = Whitener(n_components=6, dtype="int8").fit(rows)
    codes = int8.transform(rows)
    record = int8.quantization_
    assert codes.dtype == np.int8 and codes.shape == (800, 6) and record.kind == "int8" and record.normalized
    model = int8.model_
    weights, shift = model.projection()
    expected = int8_for_map(model.n_rows, model.mean, model.state.scatter, weights, shift, normalize=True)
    np.testing.assert_array_equal(record.scale, expected.scale)  # from the statistics, for the unit vectors
    np.testing.assert_array_equal(codes, np.clip(np.rint((unit - record.offset) / record.scale), -127, 127))
    bits = Whitener(n_components=6, dtype="binary").fit(rows).transform(rows)
    assert bits.dtype == np.uint8 and bits.shape == (800, 1)
    np.testing.assert_array_equal(bits, np.packbits(unit > 0, axis=1))
    # saved, the dtype is the model's storage; loaded, it is the estimator's dtype again
    int8.save(tmp_path / "m.npz")
    loaded = Whitener.load(tmp_path / "m.npz")
    assert loaded.dtype == "int8" and loaded.model_.storage.dtype == "int8"
    np.testing.assert_array_equal(loaded.transform(rows), codes)
    with pytest.raises(
        BadInputError, match=r"^dtype must be \"float32\", \"float16\", \"int8\", \"binary\" or a vector code"
    ):
        Whitener(dtype="int4").fit(rows)
    with pytest.raises(BadInputError, match="cannot hold the NaN rows skip_nonfinite writes"):
        Whitener(dtype="int8", skip_nonfinite=True).fit(rows).transform(rows)
