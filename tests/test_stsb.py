"""The real check on all-MiniLM-L6-v2 STS-B dev embeddings (licensed data, read from ../shared)."""

import numpy as np
import pytest

from streamwhiten import Whitener


def spearman_x100(a, b, score):
    from scipy.stats import spearmanr

    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return 100 * spearmanr(cos, score).statistic


def test_stsb_mean_pooling(stsb_path):
    import h5py

    with h5py.File(stsb_path, "r") as handle:
        a, b, score = handle["mean_a"][:], handle["mean_b"][:], handle["score"][:]
    raw = spearman_x100(a, b, score)
    assert raw == pytest.approx(86.72, abs=0.005)
    both = np.vstack([a, b])
    rotation = Whitener(beta=0.0, gamma=0.0, n_components=256).fit(both)
    assert abs(spearman_x100(rotation.transform(a), rotation.transform(b), score) - raw) <= 0.2
    full = Whitener(beta=1.0, gamma=1.0).fit(both)
    whitened = spearman_x100(full.transform(a), full.transform(b), score)
    assert np.isfinite(whitened)


def test_stsb_fit_from_the_file_equals_in_memory(stsb_path, tmp_path):
    import h5py

    with h5py.File(stsb_path, "r") as handle:
        a = handle["mean_a"][:]
    from_file = Whitener().fit(f"{stsb_path}:/mean_a")
    in_memory = Whitener().fit(a)
    np.testing.assert_allclose(from_file.covariance_, in_memory.covariance_, rtol=1e-12)
