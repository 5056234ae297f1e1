"""Every field of a model file, a fit checkpoint and an exported map, checked when it is loaded.

A checksum has no key: anyone can edit a field and recompute it. So every loader reads its fields here,
and a file no fit could have written is refused (`ModelFileError`, exit 2) in one line naming the file
and the field. numpy and the foundation only (no numba): the serving path uses it."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from numbers import Integral
from typing import Any, TypeGuard

import numpy as np

from .. import params
from ..errors import BadInputError, ModelFileError
from ..records import nul_field
from ..storage import Storage
from .quantize import Quantization, storage_quantizations

#: Relative tolerances of the checks that compare computed values (far above float64 rounding).
SYMMETRY_RTOL = 1e-9
ORTHONORMAL_TOL = 1e-6
EIGEN_RTOL = 1e-6
EPS_RTOL = 1e-9


def components_for_variance(eigvals: np.ndarray, variance: float) -> int:
    """Smallest k whose leading eigenvalues explain at least ``variance`` of the total."""
    total = float(eigvals.sum())
    if total <= 0.0:
        return int(eigvals.size)
    cumulative = np.cumsum(eigvals) / total
    return int(min(eigvals.size, np.searchsorted(cumulative, variance - 1e-12) + 1))


class Fields:
    """The arrays of one file, read field by field; `fail` is the one-line error naming a field."""

    def __init__(self, arrays: Mapping[str, Any], path: str, what: str):
        self.arrays, self.path, self.what = arrays, path, what

    def fail(self, field: str, problem: str) -> ModelFileError:
        return ModelFileError(
            f"{self.path}: {self.what} field {field!r} {problem}; the file was edited or damaged, not written by a fit"
        )

    def get(self, field: str) -> np.ndarray:
        if field not in self.arrays:
            raise ModelFileError(f"{self.path}: {self.what} is incomplete (it has no field {field!r})")
        return np.asarray(self.arrays[field])

    def scalar(self, field: str, kinds: str, what: str) -> np.ndarray:
        """The 0-d field, if its dtype is of ``kinds`` (numpy kind codes); else it must be ``what``."""
        value = self.get(field)
        if value.shape != () or value.dtype.kind not in kinds:
            raise self.fail(field, f"must be {what}, got {_show(value)}")
        return value

    def integer(self, field: str, low: int = 0) -> int:
        value = int(self.scalar(field, "iu", "a whole number"))
        if value < low:
            raise self.fail(field, f"must be at least {low}, got {value}")
        return value

    def number(self, field: str) -> float:
        return float(self.scalar(field, "fiu", "a number"))

    def flag(self, field: str) -> bool:
        return bool(self.scalar(field, "b", "true or false"))

    def text(self, field: str) -> str:
        return str(self.scalar(field, "U", "text"))

    def array(self, field: str, shape: tuple[int, ...]) -> np.ndarray:
        """A finite float array of ``shape``, as float64."""
        value = self.get(field)
        if value.dtype.kind != "f":
            raise self.fail(field, f"must hold floating-point numbers, got dtype {value.dtype}")
        if value.shape != shape:
            raise self.fail(field, f"has shape {value.shape}, but the file's other fields need {shape}")
        if not np.all(np.isfinite(value)):
            raise self.fail(field, "holds NaN or Inf")
        return np.ascontiguousarray(value, dtype=np.float64)

    def param(self, field: str, name: str | None = None, value: Any = None) -> Any:
        """``value`` (default: the field as a number) through the check of parameter ``name`` in ``params``."""
        value = self.number(field) if value is None else value
        try:
            return params.check(name or field, value)
        except BadInputError as exc:
            problem = str(exc).split(" must be ", 1)[-1]
            raise self.fail(field, f"must be {problem}") from None

    def variance(self) -> float | None:
        """The ``variance`` field: None where it is NaN (k was not chosen by explained variance)."""
        raw = self.number("variance")
        return None if math.isnan(raw) else self.param("variance", value=raw)

    def json(self, field: str, kind: type) -> Any:
        try:
            value = json.loads(self.text(field))
        except ValueError as exc:
            raise self.fail(field, f"is not valid JSON ({exc})") from None
        if not isinstance(value, kind):
            raise self.fail(field, f"must be a JSON {'list' if kind is list else 'object'}, got {type(value).__name__}")
        return value


def _show(value: np.ndarray) -> str:
    text = repr(value.tolist()) if value.size <= 4 else f"an array of shape {value.shape}"
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, Integral) and not isinstance(value, bool)


def check_scatter(fields: Fields, scatter: np.ndarray, n_rows: int, mean: np.ndarray, field: str = "scatter") -> None:
    """A scatter: symmetric, a diagonal not negative, no entry above its diagonal's bound (to rounding)."""
    diagonal = np.diag(scatter)
    scale = float(np.abs(diagonal).max(initial=0.0))
    slack = SYMMETRY_RTOL * scale + 1e-12 * n_rows * float(np.square(mean).max(initial=0.0))
    if float(diagonal.min(initial=0.0)) < -slack:
        raise fields.fail(field, f"has a negative diagonal entry ({float(diagonal.min()):.6g}): it is no scatter")
    if float(np.abs(scatter - scatter.T).max(initial=0.0)) > slack:
        raise fields.fail(field, "is not symmetric: it is no scatter")
    positive = np.maximum(diagonal, 0.0)
    if np.any(np.abs(scatter) > np.sqrt(np.outer(positive, positive)) * (1 + 1e-5) + slack):
        raise fields.fail(
            field, "has an entry larger than its diagonal allows (|S_ij| <= sqrt(S_ii S_jj)): it is no scatter"
        )


def _probes(d: int) -> np.ndarray:
    """Two fixed random vectors (columns) that the O(d^2) checks multiply by."""
    return np.random.default_rng(20230923).standard_normal((d, 2))


def model_fields(arrays: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The fields of a model file, every one checked; ``{name: value}`` ready for ``WhiteningModel``."""
    f = Fields(arrays, path, "model file")
    d = f.integer("n_features", 1)
    n_rows = f.integer("n_rows", 2)
    mean = f.array("mean", (d,))
    scatter = f.array("scatter", (d, d))
    check_scatter(f, scatter, n_rows, mean)
    eigvals, eigvecs = _eigen_fields(f, d)
    setting = _setting_fields(f, d, eigvals)
    # Sigma_beta = scatter / n + (1 - beta)^2 mean mean^T must be U diag(eigvals) U^T
    probes = _probes(d)
    sigma_probes = scatter @ probes / n_rows + (1.0 - setting["beta"]) ** 2 * np.outer(mean, mean @ probes)
    rebuilt = eigvecs @ (eigvals[:, None] * (eigvecs.T @ probes))
    if np.abs(sigma_probes - rebuilt).max() > EIGEN_RTOL * float(eigvals[0]) * np.abs(probes).sum(axis=0).max():
        raise f.fail("eigvals", "and eigvecs are not the eigendecomposition of the saved statistics")
    sources = f.json("sources_json", list)
    for index, source in enumerate(sources):
        _check_source(f, index, source, d)
    info = f.json("info_json", dict)
    _check_info(f, info)
    basis = f.text("basis") if "basis" in arrays else "eigen"  # files of eigen maps hold none
    if basis not in ("eigen", "identity"):
        raise f.fail("basis", f"must be 'eigen' or 'identity', got {basis!r}")
    identity = {"beta": 0.0, "gamma": 0.0, "n_components": d, "variance": None}
    if basis == "identity" and any(setting[key] != value for key, value in identity.items()):
        raise f.fail("basis", "is 'identity', but the setting is not the identity's (beta = gamma = 0, k = d)")
    fields = dict(setting, n_rows=n_rows, mean=mean, scatter=scatter, eigvals=eigvals, eigvecs=eigvecs, basis=basis)
    return dict(fields, sources=sources, info=info, storage=_storage_field(f, fields))


def _eigen_fields(f: Fields, d: int) -> tuple[np.ndarray, np.ndarray]:
    """``(eigvals, eigvecs)``: eigenvalues descending and not negative, eigenvectors orthonormal."""
    eigvals = f.array("eigvals", (d,))
    eigvecs = f.array("eigvecs", (d, d))
    if float(eigvals.min()) < 0:
        raise f.fail("eigvals", f"holds a negative eigenvalue ({float(eigvals.min()):.6g})")
    if np.any(np.diff(eigvals) > 0):
        raise f.fail("eigvals", "is not in descending order")
    norms = np.sqrt(np.einsum("ij,ij->j", eigvecs, eigvecs))
    if np.any(np.abs(norms - 1) > ORTHONORMAL_TOL):
        raise f.fail("eigvecs", "has a column that is not of unit length")
    probes = _probes(d)
    if np.abs(eigvecs.T @ (eigvecs @ probes) - probes).max() > ORTHONORMAL_TOL * np.abs(probes).max() * d:
        raise f.fail("eigvecs", "is not orthonormal")
    return eigvals, eigvecs


def _setting_fields(f: Fields, d: int, eigvals: np.ndarray) -> dict[str, Any]:
    """The setting, each through its parameter's check, and the rules between them and the eigenvalues."""
    beta, gamma, eps, variance = f.param("beta"), f.param("gamma"), f.param("eps"), f.variance()
    k = f.integer("n_components", 1)
    if k > d:
        raise f.fail("n_components", f"is {k}, more than the model's {d} features")
    chosen = k if variance is None else components_for_variance(eigvals, variance)
    if k != chosen:
        raise f.fail("n_components", f"is {k}, but the variance {variance:g} it was chosen by gives {chosen}")
    eps_value = f.number("eps_value")
    expected = eps * float(eigvals[0]) if eigvals[0] > 0 else eps
    if not math.isfinite(eps_value) or abs(eps_value - expected) > EPS_RTOL * abs(expected):
        raise f.fail("eps_value", f"is {eps_value!r}, but eps * the largest eigenvalue is {expected!r}")
    return dict(beta=beta, gamma=gamma, eps=eps, variance=variance, n_components=k, eps_value=eps_value)


def _storage_field(f: Fields, m: dict[str, Any]) -> Storage | None:
    """The recorded storage of the model file whose other fields are ``m``, checked (None without one)."""
    record = f.json("storage_json", dict) if "storage_json" in f.arrays else None
    if (record or {}).get("codec") is None and "storage_codec" in f.arrays:
        raise f.fail("storage_codec", "is a codec that no storage record names")
    if record is None:
        return None
    weights = map_weights(m["eigvals"], m["eigvecs"], m["eps_value"], m["gamma"], m["n_components"], m["basis"])
    storage = _check_storage(f, record, m["n_rows"], m["mean"], m["scatter"], weights, m["beta"] * m["mean"])
    if storage.codec is None:
        return storage
    setting = {key: m[key] for key in ("beta", "gamma", "eps")}
    _check_codec(f, storage, dict(setting, k=m["n_components"], basis=m["basis"]))
    origin = f"{f.path}: model file field 'storage_codec'"
    return replace(storage, codec=replace(storage.codec, origin=origin))


def map_weights(
    eigvals: np.ndarray, eigvecs: np.ndarray, eps_value: float, gamma: float, k: int, basis: str = "eigen"
) -> np.ndarray:
    """``A`` of a model file's map: ``U_k (Lambda_k + eps_)^(-gamma/2)``, or ``I`` for the identity basis."""
    if basis == "identity":
        return np.eye(eigvecs.shape[0])
    return eigvecs[:, :k] * ((eigvals[:k] + eps_value) ** (-gamma / 2.0))


#: Relative tolerance of recorded int8 ranges against those the statistics give (another BLAS's rounding).
RANGES_RTOL = 1e-9


def _check_storage(
    f: Fields,
    record: dict[str, Any],
    n_rows: int,
    mean: np.ndarray,
    scatter: np.ndarray,
    weights: np.ndarray,
    shift: np.ndarray,
) -> Storage:
    """The storage a model file records, checked: its parameters, bytes per vector and records."""
    codec_data = None
    if record.get("codec") is not None:
        raw = f.arrays.get("storage_codec")
        if raw is None:
            raise f.fail("storage_json", "records a codec, but the file holds no storage_codec")
        raw = np.asarray(raw)
        if raw.dtype != np.uint8 or raw.ndim != 1:
            raise f.fail("storage_codec", f"must be 1-D uint8 bytes, got {raw.dtype} of shape {raw.shape}")
        codec_data = raw.tobytes()
    try:
        storage = Storage.from_dict(record, codec_data)
    except BadInputError as exc:
        raise f.fail("storage_json", f"is no storage: {exc}") from None
    k = int(weights.shape[1])
    if record.get("bytes_per_vector") != storage.bytes_per_vector(k):
        raise f.fail(
            "storage_json",
            f"says {record.get('bytes_per_vector')!r} bytes per vector, but {storage.label} of {k} components "
            f"takes {storage.bytes_per_vector(k)}",
        )
    records = storage_quantizations(storage, n_rows, mean, scatter, weights, shift)
    for key, expected in zip(("quantization", "rescore_quantization"), records, strict=True):
        _check_record(f, key, record.get(key), expected)
    return storage


def _check_codec(f: Fields, storage: Storage, setting: dict[str, Any]) -> None:
    """A recorded codec codes the saved setting's outputs (width k); ``streamwhiten.codes`` checks its bytes."""
    codec = storage.codec
    assert codec is not None  # checked by the caller
    if codec.n_features != setting["k"]:
        raise f.fail(
            "storage_json",
            f"records a {codec.label} codec of {codec.n_features}-d vectors, but the map gives k={setting['k']}",
        )
    if not codec.bytes_per_vector <= codec.budget:
        raise f.fail(
            "storage_json", f"records a codec of {codec.bytes_per_vector} bytes a row, above its budget {codec.budget}"
        )
    if dict(codec.setting or {}) != setting:
        raise f.fail(
            "storage_json", f"records a codec trained for the setting {codec.setting}, not the saved {setting}"
        )


def _check_record(f: Fields, key: str, recorded: Any, expected: Quantization | None) -> None:
    if expected is None:
        if recorded is not None:
            raise f.fail("storage_json", f"holds a {key} record its storage has no use for")
        return
    try:
        found = Quantization.from_dict(recorded)
    except BadInputError as exc:
        raise f.fail("storage_json", f"{key}: {exc}") from None
    same = all(getattr(found, name) == getattr(expected, name) for name in ("kind", "n_components", "normalized"))
    if same and expected.kind == "int8":
        same = found.clip == expected.clip and all(
            np.allclose(getattr(found, name), getattr(expected, name), rtol=RANGES_RTOL, atol=0)
            for name in ("scale", "offset")
        )
    if not same:
        raise f.fail(
            "storage_json", f"{key} is not the {expected.kind} record the saved statistics give at the saved setting"
        )


#: The fields of a recorded source (a fingerprint) and their JSON types, where present.
_SOURCE_FIELDS = {"path": str, "dataset": str, "n_rows": int, "n_features": int, "dtype": str}


def _check_source(f: Fields, index: int, source: object, d: int, field: str = "sources_json") -> None:
    where = f"source {index}"
    if not isinstance(source, dict):
        raise f.fail(field, f"{where} must be a JSON object, got {type(source).__name__}")
    for key, kind in _SOURCE_FIELDS.items():
        if key not in source:  # a source recorded by a caller of finalize may hold less (an update then refuses it)
            continue
        value = source[key]
        if not (_is_int(value) if kind is int else isinstance(value, kind)):
            raise f.fail(field, f"{where}: {key} must be {'a whole number' if kind is int else 'text'}, got {value!r}")
    found = nul_field(source)
    if found is not None:  # no path or name holds one: it would reach os.stat as a bare ValueError
        raise f.fail(field, f"{where}: {found} holds a NUL byte")
    if source.get("n_rows", 0) < 0:
        raise f.fail(field, f"{where}: n_rows must be at least 0, got {source['n_rows']}")
    if source.get("n_features", d) != d:
        raise f.fail(field, f"{where}: n_features is {source['n_features']}, but the model has {d} features")


#: The fields of a model's info and their JSON types (``precision``: one of the parameter's choices).
_INFO_FIELDS = {"n_skipped_nonfinite": int, "skip_nonfinite": bool, "fill_missing_chunks": bool, "tuned": dict}


def _check_info(f: Fields, info: dict[str, Any]) -> None:
    for key, kind in _INFO_FIELDS.items():
        if key not in info:
            continue
        value = info[key]
        if not (_is_count(value) if kind is int else isinstance(value, kind)):
            raise f.fail("info_json", f"{key} must be {kind.__name__}{' >= 0' if kind is int else ''}, got {value!r}")
    if "precision" in info and not params.PARAMS["precision"].accepts(info["precision"]):
        raise f.fail("info_json", f"precision must be {params.PARAMS['precision'].text}, got {info['precision']!r}")


def _is_count(value: object) -> bool:
    return _is_int(value) and value >= 0


#: A checkpoint's ``meta_json`` entries, in checking order: (key, required, test, what it must be).
_META_FIELDS: tuple[tuple[str, bool, Callable[[Any], object], str], ...] = (
    ("block_rows", True, params.PARAMS["chunk_rows"].accepts, params.PARAMS["chunk_rows"].text),
    ("precision", True, params.PARAMS["precision"].accepts, params.PARAMS["precision"].text),
    ("skip_nonfinite", True, lambda v: isinstance(v, bool), "true or false"),
    ("base_rows", True, _is_count, "a whole number of at least 0"),
    ("threads", False, _is_count, "a whole number of at least 0"),
    ("fill_missing_chunks", False, lambda v: isinstance(v, bool), "true or false"),
    ("kept_sources", True, lambda v: isinstance(v, list), "a list"),
    ("cursors", True, lambda v: isinstance(v, list) and v, "a list of the sources being read"),
)
#: The entries of a checkpoint's source cursor.
_CURSOR_KEYS = ("spec", "fingerprint", "start", "stop", "next_row", "n_skipped")


def checkpoint_fields(arrays: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The fields of a fit checkpoint, every one checked: ``{n_rows, mean, scatter, meta}``."""
    f = Fields(arrays, path, "checkpoint")
    n_rows = f.integer("n_rows", 0)
    mean = f.get("mean")
    if mean.ndim != 1 or mean.shape[0] < 1:
        raise f.fail("mean", f"must be a vector, got shape {mean.shape}")
    d = mean.shape[0]
    mean = f.array("mean", (d,))
    scatter = f.array("scatter", (d, d))
    check_scatter(f, scatter, n_rows, mean)
    meta = f.json("meta_json", dict)
    found = nul_field(meta)
    if found is not None:  # no spec or path holds one: it would reach os.stat as a bare ValueError
        raise f.fail("meta_json", f"{found} holds a NUL byte")
    for key, required, test, text in _META_FIELDS:
        if (required or key in meta) and (key not in meta or not test(meta[key])):
            raise f.fail("meta_json", f"{key} must be {text}, got {meta.get(key)!r}")
    for index, source in enumerate(meta["kept_sources"]):
        _check_source(f, index, source, d, "meta_json")
    rows_read = sum(_cursor_rows(f, index, cursor, d) for index, cursor in enumerate(meta["cursors"]))
    base_rows = meta["base_rows"]
    if n_rows != base_rows + rows_read:
        raise f.fail(
            "n_rows",
            f"is {n_rows}, but the rows recorded as read ({rows_read}) and the model's ({base_rows}) make "
            f"{base_rows + rows_read}",
        )
    return dict(n_rows=n_rows, mean=mean, scatter=scatter, meta=meta)


def _cursor_rows(f: Fields, index: int, cursor: object, d: int) -> int:
    """The rows a checkpoint's cursor ``index`` records as read (its entries checked)."""
    where = f"cursor {index}"
    if not isinstance(cursor, dict) or set(cursor) - set(_CURSOR_KEYS):
        raise f.fail("meta_json", f"{where} must be an object of {', '.join(_CURSOR_KEYS)}")
    counts: list[Any] = [cursor.get(key) for key in ("start", "next_row", "stop")]
    if not isinstance(cursor.get("spec"), str) or not all(_is_int(v) for v in counts):
        raise f.fail("meta_json", f"{where} needs a spec (text) and start, next_row, stop (whole numbers)")
    if not 0 <= counts[0] <= counts[1] <= counts[2]:
        raise f.fail("meta_json", f"{where}: start <= next_row <= stop does not hold ({counts})")
    skipped = cursor.get("n_skipped", 0)
    if not _is_count(skipped):
        raise f.fail("meta_json", f"{where}: n_skipped must be a whole number of at least 0, got {skipped!r}")
    _check_source(f, index, cursor.get("fingerprint"), d, "meta_json")
    return int(counts[1] - counts[0] - skipped)


def map_fields(arrays: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The fields of an exported affine map (``streamwhiten export -o map.npz``), every one checked."""
    f = Fields(arrays, path, "whitening map")
    A = f.get("A")
    if A.ndim != 2 or min(A.shape) < 1 or A.shape[1] > A.shape[0]:
        raise f.fail("A", f"must be a d x k matrix with 1 <= k <= d, got shape {A.shape}")
    d, k = A.shape
    A = f.array("A", (d, k))
    b = f.array("b", (k,))
    mean = f.array("mean", (d,))
    beta, gamma, eps, variance = f.param("beta"), f.param("gamma"), f.param("eps"), f.variance()
    eps_value = f.number("eps_value")
    if not math.isfinite(eps_value) or eps_value <= 0:
        raise f.fail("eps_value", f"must be a positive finite number, got {eps_value!r}")
    normalize = f.flag("normalize")
    # the source model file's checksum (provenance only; a 0.2.0 map held it as model_checksum: not kept)
    file_checksum = f.text("model_file_checksum") if "model_file_checksum" in arrays else ""
    fitted_norm = f.number("mean_sq_norm") if "mean_sq_norm" in arrays else math.nan
    if not (math.isnan(fitted_norm) or (math.isfinite(fitted_norm) and fitted_norm >= 0)):
        raise f.fail("mean_sq_norm", f"must be a finite number, 0 or more, got {fitted_norm!r}")
    expected = -((beta * mean) @ A)
    if np.abs(b - expected).max() > 1e-9 * max(1.0, float(np.abs(expected).max())):
        raise f.fail("b", "is not -(beta mean) A of the map's own fields")
    quantization = None
    if "quantization_json" in arrays:  # how the map's outputs are stored (export --dtype, or the model's storage)
        try:
            quantization = Quantization.from_dict(f.json("quantization_json", dict))
        except BadInputError as exc:
            raise f.fail("quantization_json", f"is no quantization record: {exc}") from None
        if quantization.n_components != k:
            raise f.fail("quantization_json", f"is a record of {quantization.n_components} components, the map has {k}")
    return dict(
        A=A,
        b=b,
        mean=mean,
        beta=beta,
        gamma=gamma,
        eps=eps,
        eps_value=eps_value,
        variance=variance,
        normalize=normalize,
        file_checksum=file_checksum,
        mean_sq_norm=None if math.isnan(fitted_norm) else fitted_norm,
        quantization=quantization,
    )


__all__ = [
    "Fields",
    "check_scatter",
    "checkpoint_fields",
    "components_for_variance",
    "map_fields",
    "map_weights",
    "model_fields",
]
