"""Finalizer, transform and model file against the formulas, numpy and scikit-learn."""

import os
import zipfile

import numpy as np
import pytest
from conftest import anisotropic

from streamwhiten.core import stats
from streamwhiten.core.model import (
    components_for_variance,
    effective_dimension,
    finalize,
    load_model,
    read_rows_and_sources,
    save_model,
)
from streamwhiten.errors import BadInputError, ModelFileError


def state_of(rows):
    return stats.block_moments(rows)


def cosines(rows):
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return unit @ unit.T


def test_full_whitening_gives_identity_covariance_and_zero_mean():
    rows = anisotropic(2000, 10, seed=1)
    model = finalize(state_of(rows), beta=1.0, gamma=1.0, eps=1e-12)
    out = model.transform(rows)
    np.testing.assert_allclose(out.mean(0), 0.0, atol=1e-10)
    np.testing.assert_allclose(np.cov(out, rowvar=False, bias=True), np.eye(10), atol=1e-8)


def test_formula_with_partial_beta_gamma_and_truncation():
    rows = anisotropic(500, 8, seed=2)
    beta, gamma, k, eps = 0.5, 0.75, 5, 1e-3
    model = finalize(state_of(rows), beta=beta, gamma=gamma, n_components=k, eps=eps)
    centred = rows - beta * rows.mean(0)
    eigvals, eigvecs = np.linalg.eigh(centred.T @ centred / rows.shape[0])
    order = np.argsort(eigvals)[::-1]
    eigvals, eigvecs = eigvals[order], eigvecs[:, order]
    expected = centred @ eigvecs[:, :k] * (eigvals[:k] + eps * eigvals[0]) ** (-gamma / 2)
    out = model.transform(rows)
    signs = np.sign((out * expected).sum(0))  # eigenvectors are defined up to sign
    np.testing.assert_allclose(out * signs, expected, rtol=1e-9, atol=1e-9)
    assert model.eps_value == pytest.approx(eps * eigvals[0])


def test_rotation_preserves_every_cosine():
    rows = anisotropic(300, 9, seed=3)
    model = finalize(state_of(rows), beta=0.0, gamma=0.0)
    np.testing.assert_allclose(cosines(model.transform(rows)), cosines(rows), atol=1e-12)


def test_matches_sklearn_pca_whiten():
    sklearn = pytest.importorskip("sklearn.decomposition")
    rows = anisotropic(800, 7, seed=4)
    n = rows.shape[0]
    pca = sklearn.PCA(whiten=True, svd_solver="full").fit(rows)
    model = finalize(state_of(rows), beta=1.0, gamma=1.0, eps=1e-14)
    ours = model.transform(rows)
    theirs = pca.transform(rows) * np.sqrt(n / (n - 1))  # sklearn divides by n - 1
    signs = np.sign((ours * theirs).sum(0))
    np.testing.assert_allclose(ours * signs, theirs, rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(model.eigvals, pca.explained_variance_ * (n - 1) / n, rtol=1e-10)


def test_eigvals_descending_and_signs_deterministic():
    rows = anisotropic(400, 6, seed=5)
    model = finalize(state_of(rows))
    assert np.all(np.diff(model.eigvals) <= 0)
    pivots = np.argmax(np.abs(model.eigvecs), axis=0)
    assert np.all(model.eigvecs[pivots, np.arange(6)] > 0)
    again = finalize(state_of(rows[::-1].copy()))
    np.testing.assert_allclose(again.eigvecs, model.eigvecs, atol=1e-10)


def test_rank_deficient_and_constant_data_never_give_nan():
    rng = np.random.default_rng(6)
    low_rank = rng.standard_normal((200, 2)) @ rng.standard_normal((2, 8))
    low_rank[:, 3] = 5.0  # a constant column
    for rows in (low_rank, np.ones((10, 4))):
        for gamma in (0.5, 1.0):
            model = finalize(state_of(rows), beta=1.0, gamma=gamma)
            out = model.transform(rows)
            assert np.all(np.isfinite(out)) and np.all(np.isfinite(model.scales()))


def test_variance_threshold_and_effective_dimension():
    eigvals = np.array([4.0, 3.0, 2.0, 1.0])
    assert components_for_variance(eigvals, 0.4) == 1
    assert components_for_variance(eigvals, 0.7) == 2
    assert components_for_variance(eigvals, 0.71) == 3
    assert components_for_variance(eigvals, 1.0) == 4
    assert effective_dimension(np.ones(5)) == pytest.approx(5.0)
    assert effective_dimension(np.array([1.0, 0, 0])) == pytest.approx(1.0)
    rows = anisotropic(500, 10, seed=7)
    model = finalize(state_of(rows), variance=0.9)
    ratio = np.cumsum(model.eigvals) / model.eigvals.sum()
    assert ratio[model.n_components - 1] >= 0.9 > ratio[model.n_components - 2]


def test_with_params_equals_fresh_finalize():
    rows = anisotropic(300, 6, seed=8)
    state = state_of(rows)
    base = finalize(state, beta=1.0, gamma=1.0)
    for change in (dict(gamma=0.3, n_components=3), dict(beta=0.2), dict(variance=0.8)):
        fresh = finalize(state, **dict(dict(beta=1.0, gamma=1.0), **change))
        np.testing.assert_allclose(base.with_params(**change).transform(rows), fresh.transform(rows), atol=1e-12)


@pytest.mark.parametrize(
    "params, message",
    [
        (dict(beta=1.5), "beta must be"),
        (dict(gamma=-0.1), "gamma must be"),
        (dict(n_components=0), "k"),
        (dict(n_components=7), "exceeds the data width"),
        (dict(eps=0.0), "eps must be"),
        (dict(variance=1.2), "variance"),
        (dict(n_components=2, variance=0.5), "not both"),
    ],
)
def test_bad_parameters(params, message):
    with pytest.raises(BadInputError, match=message):
        finalize(state_of(anisotropic(50, 6)), **params)


def test_transform_single_vector_and_width_check():
    rows = anisotropic(100, 5, seed=9)
    model = finalize(state_of(rows), n_components=3)
    np.testing.assert_allclose(model.transform(rows[7]), model.transform(rows)[7], atol=1e-12)
    with pytest.raises(BadInputError, match="expects 5 features"):
        model.transform(np.zeros((2, 4)))


@pytest.mark.parametrize("normalize", [False, True])
def test_project_checked_marks_nonfinite_rows_and_leaves_the_others_exact(normalize):
    from streamwhiten.core.model import project_checked

    rows = anisotropic(50, 6, seed=9).astype(np.float32) + 4
    model = finalize(state_of(rows.astype(np.float64)), n_components=4)
    weights, shift = model.projection(np.float32)
    bad = rows.copy()
    bad[3, 2], bad[7, 0], bad[8, 5], bad[8, 1] = np.nan, np.inf, np.inf, -np.inf
    with np.errstate(all="raise"):  # no warning escapes for non-finite input
        out, finite = project_checked(bad, weights, shift, normalize=normalize)
    expected = (rows.astype(np.float64) - shift) @ weights.astype(np.float64)
    if normalize:
        expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    assert np.flatnonzero(~finite).tolist() == [3, 7, 8]
    assert np.isnan(out[[3, 7, 8]]).all()
    keep = np.setdiff1d(np.arange(50), [3, 7, 8])
    np.testing.assert_allclose(out[keep], expected[keep], rtol=1e-4, atol=1e-5)
    clean, none = project_checked(rows, weights, shift, normalize=normalize)
    assert none is None and np.isfinite(clean).all()


@pytest.mark.parametrize("normalize", [False, True])
def test_float32_transform_of_rows_with_a_large_mean_keeps_float32_accuracy(normalize):
    """Centring before the product must not lose the low-variance directions when the mean is large
    against the spread (the anisotropy whitening exists for)."""
    rng = np.random.default_rng(12)
    rows = (100.0 + 0.01 * rng.standard_normal((400, 8)) * np.linspace(0.2, 2, 8)).astype(np.float32)
    model = finalize(state_of(rows.astype(np.float64)), n_components=6)
    expected = model.transform(rows.astype(np.float64), normalize=normalize)
    for overwrite in (False, True):
        weights, shift = model.projection(np.float32)
        from streamwhiten.core.model import project

        got = project(rows.copy(), weights, shift, normalize=normalize, overwrite_input=overwrite)
        scale = np.abs(expected).max()
        assert np.abs(got - expected).max() <= 2e-5 * scale


def test_project_overflow_is_reported_as_such_with_its_row():
    from streamwhiten.errors import ValuesTooLargeError

    rows = anisotropic(40, 3, seed=10)
    model = finalize(state_of(rows), gamma=0.0)
    huge = np.zeros((4, 3), dtype=np.float32)
    huge[2] = [3e38, -3e38, 3e38]  # finite, but centring or the product overflows
    with pytest.raises(ValuesTooLargeError, match="row 2: values too large") as info:
        model.transform(huge)
    assert info.value.row == 2
    rotation = finalize(state_of(rows), beta=0.0, gamma=0.0)
    wide = np.zeros((3, 3), dtype=np.float32)
    wide[1] = 1.5e38 * rotation.eigvecs.sum(axis=1)  # rotates to 1.5e38 three times: fits, its row sum does not
    np.testing.assert_allclose(rotation.transform(wide)[1], wide[1].astype(np.float64) @ rotation.eigvecs, rtol=1e-5)


def test_transform_tells_overflow_from_nan_input_even_with_skip_nonfinite():
    """float16 rows are centred in place in float32, where an overflow looks like Inf: it must still
    raise ValuesTooLargeError, not NonFiniteError or a silent NaN row."""
    from streamwhiten.errors import NonFiniteError, ValuesTooLargeError

    rows = 1e39 + 1e37 * anisotropic(40, 3, seed=10)  # a mean beyond float32
    model = finalize(state_of(rows))
    data = np.ones((4, 3), dtype=np.float16)
    data[1, 2] = np.nan
    for skip in (False, True):
        with pytest.raises(ValuesTooLargeError, match="row 0: values too large for float32 .*centred"):
            model.transform(data, skip_nonfinite=skip)
    with pytest.raises(NonFiniteError, match="row 1 holds NaN or Inf"):
        model.transform(data.astype(np.float64))


def test_normalising_rows_whose_float32_norm_overflows():
    rows = anisotropic(40, 3, seed=10)
    rotation = finalize(state_of(rows), beta=0.0, gamma=0.0)
    big = np.array([[1e20, 2e20, -1e20], [1.0, 2.0, 3.0]], dtype=np.float32)  # squares overflow float32
    out = rotation.transform(big, normalize=True)
    expected = big.astype(np.float64) @ rotation.eigvecs
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_casting_to_float16_refuses_values_that_do_not_fit():
    from streamwhiten.errors import ValuesTooLargeError

    rows = anisotropic(40, 3, seed=10)
    rotation = finalize(state_of(rows), beta=0.0, gamma=0.0)
    data = np.zeros((5, 3), dtype=np.float32)
    data[3] = [1e5, 0, 0]
    with pytest.raises(ValuesTooLargeError, match="row 3: .*float16.*write float32"):
        rotation.transform(data, dtype=np.float16)
    assert rotation.transform(data[:3], dtype=np.float16).dtype == np.float16


def test_model_file_round_trip(tmp_path):
    rows = anisotropic(200, 6, seed=10)
    model = finalize(state_of(rows), beta=0.5, gamma=0.5, n_components=4, sources=[{"path": "x"}], info={"a": 1})
    path = str(tmp_path / "m.npz")
    save_model(model, path)
    loaded = load_model(path)
    assert loaded.state == model.state
    assert (loaded.beta, loaded.gamma, loaded.n_components, loaded.eps) == (0.5, 0.5, 4, model.eps)
    assert [source.to_dict() for source in loaded.sources] == [{"path": "x"}] and loaded.info == {"a": 1}
    np.testing.assert_array_equal(loaded.transform(rows), model.transform(rows))
    # readable with numpy alone, no pickle
    with np.load(path, allow_pickle=False) as data:
        assert {
            "mean",
            "scatter",
            "eigvals",
            "eigvecs",
            "beta",
            "gamma",
            "eps",
            "n_components",
            "format_version",
        } <= set(data.files)


def test_rows_and_sources_read_alone_are_those_load_model_gives(tmp_path):
    rows = anisotropic(300, 5, seed=11)
    sources = [{"path": "a.h5", "dataset": "emb", "n_rows": 200}, {"path": "b.h5", "n_rows": 100}]
    path = str(tmp_path / "m.npz")
    save_model(finalize(state_of(rows), sources=sources), path)
    loaded = load_model(path)
    assert read_rows_and_sources(path) == (loaded.n_rows, loaded.sources) == (300, loaded.sources)
    assert [source.to_dict() for source in loaded.sources] == sources
    # no file, or not a model file: None (the caller's checked load says how)
    assert read_rows_and_sources(str(tmp_path / "missing.npz")) is None
    (tmp_path / "text.npz").write_text("not a zip")
    assert read_rows_and_sources(str(tmp_path / "text.npz")) is None
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    assert read_rows_and_sources(str(tmp_path / "other.npz")) is None


def _rewrite(path, **changes):
    with np.load(path, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files}
    arrays.update(changes)
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)


def test_damaged_model_files_are_refused(tmp_path):
    model = finalize(state_of(anisotropic(100, 4)))
    path = str(tmp_path / "m.npz")
    save_model(model, path)
    raw = open(path, "rb").read()

    open(path, "wb").write(raw[: len(raw) // 2])
    with pytest.raises(ModelFileError, match="corrupt or truncated"):
        load_model(path)

    flipped = bytearray(raw)
    flipped[len(raw) // 3] ^= 0xFF
    open(path, "wb").write(bytes(flipped))
    with pytest.raises(ModelFileError):
        load_model(path)

    open(path, "wb").write(raw)
    _rewrite(path, beta=np.array(0.25))  # changed after writing: the checksum no longer matches
    with pytest.raises(ModelFileError, match="checksum"):
        load_model(path)

    with pytest.raises(ModelFileError, match="not found"):
        load_model(str(tmp_path / "missing.npz"))


def test_incompatible_version_is_refused(tmp_path):
    from streamwhiten._npz import checksum

    path = str(tmp_path / "m.npz")
    save_model(finalize(state_of(anisotropic(100, 4))), path)
    with np.load(path, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files if key != "checksum"}
    arrays["format_version"] = np.array(99, dtype=np.int64)
    arrays["checksum"] = np.array(checksum(arrays))
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
    with pytest.raises(ModelFileError, match="version 99"):
        load_model(path)


def test_save_is_atomic_and_keeps_old_file_on_failure(tmp_path, monkeypatch):
    path = str(tmp_path / "m.npz")
    model = finalize(state_of(anisotropic(100, 4)))
    save_model(model, path)
    before = open(path, "rb").read()

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(OSError):
        save_model(finalize(state_of(anisotropic(100, 4, seed=3))), path)
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["m.npz"]
    assert zipfile.is_zipfile(path)


def test_malformed_version_fields_are_model_file_errors(tmp_path):
    from streamwhiten._npz import checksum

    path = str(tmp_path / "m.npz")
    save_model(finalize(state_of(anisotropic(50, 3))), path)
    with np.load(path, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files if key != "checksum"}
    arrays["format_version"] = np.array("v2")
    arrays["checksum"] = np.array(checksum(arrays))
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
    with pytest.raises(ModelFileError, match="version -1 is not supported"):
        load_model(path)
    open(path, "wb").write(b"plain text, not a model")
    with pytest.raises(ModelFileError, match="not an .npz archive"):
        load_model(path)


def test_a_recorded_storage_survives_saving_resetting_and_updating(tmp_path):
    """What tune chose is kept: saved and loaded, through another setting (its int8 ranges recomputed from
    the statistics at that setting) and through an update with new rows (``fit --update``)."""
    from dataclasses import replace

    from conftest import write_h5

    import streamwhiten
    from streamwhiten.core.quantize import quantization_for
    from streamwhiten.storage import Storage

    rows = anisotropic(400, 6, seed=4)
    store = write_h5(tmp_path / "x.h5", rows[:300])
    model = finalize(state_of(rows[:300]), n_components=4)
    model = replace(model, storage=Storage("binary", rescore=20, rescore_dtype="int8", int8_clip=3.0))
    path = str(tmp_path / "m.npz")
    save_model(model, path)
    loaded = load_model(path)
    assert loaded.storage == model.storage and loaded.dtype == "binary"
    stored, again = loaded.storage_records()
    assert stored.kind == "binary" and again.kind == "int8" and again.clip == 3.0
    expected = quantization_for("int8", loaded, normalize=True, clip=3.0)  # the documented rule, at this setting
    np.testing.assert_array_equal(again.scale, expected.scale)
    assert loaded.storage_summary()["bytes_per_vector"] == 1 + 4  # the bits and the int8 vectors re-ranked with
    other = loaded.with_params(beta=0.5, n_components=6)
    assert other.storage == model.storage
    moved = other.storage_records()[1]
    np.testing.assert_array_equal(moved.offset, quantization_for("int8", other, normalize=True, clip=3.0).offset)
    assert moved.scale.shape == (6,) and not np.allclose(moved.offset[:4], again.offset)
    # an update extends the statistics (the new store's rows) and keeps the setting and the storage
    streamwhiten.fit(
        store, path, setting=streamwhiten.Setting(n_components=4), options=streamwhiten.FitOptions(overwrite=True)
    )
    save_model(replace(load_model(path), storage=model.storage), path)  # as tune writes it
    outcome = streamwhiten.fit([store, write_h5(tmp_path / "y.h5", rows[300:])], update=path)
    updated = load_model(path)
    assert outcome.updated and updated.n_rows == 400 and updated.storage == model.storage
    assert updated.n_components == 4
