"""Whiten queries where they are embedded: the affine map ``y = x A + b`` with numpy alone.

A corpus whitened offline and the queries searched against it must go through the same map. This
module loads that map from a model file (at the setting saved in it) or from an ``.npz`` map written by
``streamwhiten export``, and applies it to one vector or a batch, from numpy or from torch tensors (on
their own device and dtype). It imports numpy and streamwhiten's small numpy-only modules (the map
itself is :class:`streamwhiten.core.affine.AffineMap`, also reachable here), never numba, h5py, zarr
or :mod:`streamwhiten.core.model`, so a query service starts fast::

    from streamwhiten import serving
    whiten = serving.load("model.npz")          # or an exported map.npz
    y = whiten.transform(query_vector)          # same vectors as Whitener.transform / apply

The map is ``A = U_k (Lambda_k + eps_)^(-gamma/2)`` (d x k) and ``b = -(beta mu) A``, optionally followed by
L2 normalisation (see :mod:`streamwhiten.core.affine`).
"""

from __future__ import annotations

import os

import numpy as np

from ._npz import check_file, read_npz
from .core.affine import MAP_FORMAT, MAP_VERSION, AffineMap, mean_sq_norm
from .core.validate import map_fields, model_fields

#: The model file this module reads (the same values as ``streamwhiten.core.model.FORMAT_NAME``/``FORMAT_VERSION``,
#: which cannot be imported here without numba).
MODEL_FORMAT, MODEL_VERSION = "streamwhiten-model", 1


def load(path, normalize: bool | None = None) -> AffineMap:
    """Load the affine map of a model file (at its saved setting) or of an exported ``.npz`` map.

    Parameters
    ----------
    path : str or os.PathLike
        A model file (``streamwhiten fit -o``) or a map written by ``streamwhiten export -o map.npz``.
        Either is checked against its SHA-256 checksum before use.
    normalize : bool, optional
        Default of :meth:`AffineMap.transform`; default: the exported map's flag, False for a model file.

    Returns
    -------
    AffineMap

    Raises
    ------
    ModelFileError
        Missing, foreign, truncated or altered file, or one of another format version.
    """
    path = os.fspath(path)
    check_file(path, "model file or map")
    kind, stored_checksum = _peek(path)
    if kind == MAP_FORMAT:
        return _load_map(path, normalize)
    return _load_model(path, normalize, stored_checksum)


def file_checksum(path) -> str:
    """The SHA-256 checksum stored in a model file or map (not verified here; :func:`load` verifies it)."""
    return _peek(os.fspath(path))[1]


def _peek(path: str) -> tuple[str | None, str]:
    """The ``format`` and ``checksum`` entries of an ``.npz``, or ``(None, "")``; the full checks come after."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return str(data["format"]), str(data["checksum"])
    except Exception:  # noqa: BLE001 - read_npz reports what is wrong with the file
        return None, ""


def _load_model(path: str, normalize, stored_checksum: str) -> AffineMap:
    f = model_fields(read_npz(path, "model file", MODEL_FORMAT, MODEL_VERSION), path)
    fitted_norm = mean_sq_norm(f["n_rows"], f["mean"], f["scatter"])
    return AffineMap.from_eigh(
        f["eigvals"],
        f["eigvecs"],
        f["mean"],
        f["beta"],
        f["gamma"],
        f["eps"],
        f["eps_value"],
        f["n_components"],
        f["variance"],
        bool(normalize),
        stored_checksum,
        fitted_norm,
    )


def _load_map(path: str, normalize) -> AffineMap:
    fields = map_fields(read_npz(path, "whitening map", MAP_FORMAT, MAP_VERSION), path)
    stored = fields.pop("normalize")
    return AffineMap(normalize=stored if normalize is None else bool(normalize), **fields)


__all__ = ["AffineMap", "load", "file_checksum", "MAP_FORMAT", "MAP_VERSION"]
