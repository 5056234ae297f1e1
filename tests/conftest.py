"""Shared fixtures: small stores on disk, the CLI runner, and the path to the real STS-B data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr

REPO = Path(__file__).resolve().parents[1]
STSB_DEFAULT = REPO.parent / "shared" / "data" / "stsb" / "stsb-dev-minilm.h5"


def anisotropic(n_rows: int, n_features: int, seed: int = 0, offset: float = 3.0) -> np.ndarray:
    """Rows with a common offset and a decaying spectrum, float64."""
    rng = np.random.default_rng(seed)
    mixing = rng.standard_normal((n_features, n_features)) * (1.0 / (1.0 + np.arange(n_features)))[:, None]
    return offset + rng.standard_normal((n_rows, n_features)) @ mixing


def write_h5(path, data, dataset="emb", chunk_rows=None) -> str:
    with h5py.File(path, "w") as handle:
        chunks = None if chunk_rows is None else (min(chunk_rows, max(1, data.shape[0])),) + tuple(data.shape[1:])
        handle.create_dataset(dataset, data=data, chunks=chunks)
    return f"{path}:/{dataset}"


def write_zarr(path, data, chunk_rows=100, zarr_format=3) -> str:
    array = zarr.create_array(
        store=str(path), shape=data.shape, chunks=(min(chunk_rows, max(1, data.shape[0])),) + data.shape[1:],
        dtype=data.dtype, zarr_format=zarr_format, compressors=None,
    )
    array[...] = data
    return str(path)


@pytest.fixture
def data64():
    return anisotropic(1000, 12, seed=1)


@pytest.fixture
def h5_store(tmp_path, data64):
    return write_h5(tmp_path / "in.h5", data64.astype(np.float32), chunk_rows=128)


@pytest.fixture
def stsb_path():
    path = Path(os.environ.get("STREAMWHITEN_STSB", STSB_DEFAULT))
    if not path.exists():
        pytest.skip(f"real STS-B embeddings not found at {path} (licensed data kept out of the repo; "
                    "set STREAMWHITEN_STSB to its path)")
    return path


@pytest.fixture
def run_cli(capsys):
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    from streamwhiten.cli import main

    def run(*args):
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def run_subprocess(*args, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "streamwhiten", *map(str, args)], capture_output=True, text=True,
                          env=env, **kwargs)
