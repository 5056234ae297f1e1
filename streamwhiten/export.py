"""Hand the whitening to the code that embeds queries: numpy, torch, sentence-transformers, faiss, ONNX.

Every export writes the same affine map ``y = x A + b`` (see `AffineMap`),
in float64 for ``npz`` and float32 elsewhere, optionally followed by L2 normalisation:

========================= ==================================================================================
``npz``                   plain arrays ``A`` (d x k), ``b``, ``mean`` and the parameters; read by
                          [`streamwhiten.serving.load`][streamwhiten.serving.load] or ``numpy.load`` alone
``safetensors``           ``weight`` (k x d) and ``bias`` (k): the state dict of ``torch.nn.Linear(d, k)``
``sentence-transformers`` a directory with a ``Dense`` module (identity activation) and ``Normalize`` when
                          asked; with ``append_to`` a copy of a local model with these modules appended
``faiss``                 a ``LinearTransform``; with ``index`` an empty ``IndexPreTransform`` (the transform,
                          ``NormalizationTransform`` when asked, then the index); for int8 storage the
                          transform, ``NormalizationTransform`` and an ``IndexScalarQuantizer`` (8 bits)
                          whose ranges are the map's int8 ranges; for binary storage an empty
                          ``IndexBinaryFlat`` for the packed sign bits, named ``*.binary.faiss``
                          ([`read_faiss_binary`][streamwhiten.export.read_faiss_binary]; the float files:
                          [`read_faiss_index`][streamwhiten.export.read_faiss_index])
``onnx``                  MatMul + Add (+ L2 normalisation), dynamic batch axis, opset 21
========================= ==================================================================================

The parameters, the source model's checksum and a storage's record (``dtype``, ``bytes_per_vector``, the
int8 ``quantization``) go into each format's metadata (npz arrays, safetensors header, ONNX
``metadata_props``, ``streamwhiten.json`` beside the Dense module); a faiss file has none.

faiss's 8-bit scalar quantizer with ``vmin = offset - 127.5 scale`` and ``vdiff = 255 scale`` decodes its
codes 0..254 to our codes -127..127, ``offset + code * scale``; it differs only at a code boundary (it rounds
halves up, in float32) and beyond the clip (code 255). Each target library is imported where it is needed
(missing: `BadInputError` naming the ``pip install``); outputs are written beside the target and renamed in.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._durable import check_replaceable, fsync_dir, link_or_kind, remove_stale_temps, temp_path, write_file_atomic
from ._npz import checksum, foreign_npz, read_npz, write_npz_atomic
from .core.affine import MAP_FORMAT, MAP_VERSION, AffineMap, setting_arrays
from .errors import BadInputError, ModelFileError, NothingToDoError, StoreIOError

FORMATS = ("npz", "safetensors", "sentence-transformers", "faiss", "onnx")
EXTENSIONS = {".npz": "npz", ".safetensors": "safetensors", ".onnx": "onnx", ".faiss": "faiss", ".index": "faiss"}
#: Where ``--append-to`` puts the whitening in a model ending in ``Normalize``: instead of it, or after it.
INSERTS = ("before-normalize", "end")
#: ``|E|x|^2 - 1|`` up to which fitted rows count as unit-length (float16-stored unit rows: about 1e-4).
UNIT_NORM_TOLERANCE = 1e-3
#: ... and beyond which they do not (pooled vectors are far off); in between ``--insert`` must say it.
NOT_UNIT_NORM = 0.1
#: The ONNX operator set written: recent, and run by onnxruntime 1.18+ and onnxruntime-web.
ONNX_OPSET = 21
#: What each format imports, and the extra that installs it.
REQUIREMENTS = {
    "npz": (),
    "safetensors": (("safetensors", "safetensors", "torch"),),
    "sentence-transformers": (
        ("sentence_transformers", "sentence-transformers", "sentence-transformers"),
        ("torch", "torch", "sentence-transformers"),
    ),
    "faiss": (("faiss", "faiss-cpu", "faiss"),),
    "onnx": (("onnx", "onnx", "onnx"),),
}


def _require(module: str, package: str, extra: str, purpose: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BadInputError(f"{purpose} needs {package}: pip install 'streamwhiten[{extra}]'") from exc


def check_available(fmt: str) -> None:
    """Raise the one-line `BadInputError` naming the ``pip install`` if ``fmt``'s library is missing."""
    for module, package, extra in REQUIREMENTS[fmt]:
        _require(module, package, extra, f"the {fmt} export")


def format_for(path: str, fmt: str | None = None, append_to: str | None = None) -> str:
    """The export format, told by ``path``'s extension (`EXTENSIONS`), or ``sentence-transformers`` for a
    directory (``fmt`` or ``append_to`` saying so); ``fmt`` must agree with the name (exit 2)."""
    extension = os.path.splitext(os.fspath(path).rstrip("/"))[1].lower()
    named = EXTENSIONS.get(extension)
    if fmt is not None:
        if fmt not in FORMATS:
            raise BadInputError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
        if fmt == "sentence-transformers" and named is not None:
            raise BadInputError(
                f"{path}: a sentence-transformers export is a directory, whose name must not end in "
                f"{extension} (the extension of the {named} format)"
            )
        if fmt != "sentence-transformers" and named != fmt:
            endings = " or ".join(ext for ext, kind in EXTENSIONS.items() if kind == fmt)
            raise BadInputError(f"{path}: the name of a {fmt} export must end in {endings}")
        return fmt
    if named is not None or append_to is not None:
        return named or "sentence-transformers"
    raise BadInputError(
        f"{path}: cannot tell the export format from the name; end it in "
        f"{', '.join(EXTENSIONS)}, or pass fmt='sentence-transformers' (or append_to) for a directory",
        param=("fmt", "append_to"),
    )


def check_options(
    fmt: str,
    normalize: bool = False,
    append_to: str | None = None,
    index: str | None = None,
    metric: str | None = None,
    insert: str | None = None,
    dtype: str | None = None,
) -> None:
    """Raise `BadInputError` for an option another format than ``fmt`` takes (``dtype``: the storage)."""
    if fmt == "faiss" and dtype in ("int8", "binary", "code") and index is not None:
        own = {"int8": "IndexScalarQuantizer", "binary": "IndexBinaryFlat", "code": "structure, its codec's"}[dtype]
        raise BadInputError(
            f"index is for float storage: {dtype} storage is written as its own faiss {own}; drop index",
            param="index",
        )
    if fmt == "faiss" and dtype == "binary" and metric is not None:
        raise BadInputError(
            "metric: a binary faiss index compares bits by Hamming distance; drop metric", param="metric"
        )
    if append_to is not None and fmt != "sentence-transformers":
        raise BadInputError("append_to is for the sentence-transformers format", param="append_to")
    if insert is not None and insert not in INSERTS:
        raise BadInputError(f"unknown insert {insert!r}; choose one of {', '.join(INSERTS)}", param="insert")
    if insert is not None and append_to is None:
        raise BadInputError(
            "insert says where append_to puts the whitening; give append_to too", param=("insert", "append_to")
        )
    if (index is not None or metric is not None) and fmt != "faiss":
        raise BadInputError("index and metric are for the faiss format", param=("index", "metric"))
    if metric is not None and index is None:
        raise BadInputError("metric chooses how index compares vectors; give index too", param=("metric", "index"))
    if fmt == "faiss" and normalize and index is None and dtype not in ("int8", "binary", "code"):
        raise BadInputError(
            "faiss keeps a LinearTransform followed by a NormalizationTransform only inside an index: "
            "add an index factory such as index='Flat' for an IndexPreTransform, or drop normalize=True",
            param=("index", "normalize"),
        )


@dataclass(frozen=True)
class ExportResult:
    """What [`export`][streamwhiten.export.export] wrote (``export --json`` prints `to_json`).

    Attributes
    ----------
    format : str
        One of `FORMATS`.
    output : str
        The file or directory written.
    params : mapping
        The map's setting and provenance (`AffineMap.params`), with a storage's ``dtype``,
        ``bytes_per_vector`` and ``quantization``.
    details : mapping
        The format's own entries: ``file_checksum`` (npz), ``opset`` (onnx), ``faiss``, ``index``, ``metric``,
        ``read_with``, ``needs_training`` (faiss), ``modules``, ``appended_to``, ``insert`` (sentence-transformers).
    model : str or None
        The model file the map came from, where the caller names it.
    """

    format: str
    output: str
    params: Mapping[str, Any] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)
    model: str | None = None

    def to_json(self) -> dict[str, Any]:
        """One flat object: the ``params``, ``format``, ``output``, the ``details`` and ``model``."""
        return {**self.params, "format": self.format, "output": self.output, **self.details, "model": self.model}


def export(
    affine: AffineMap,
    path: str,
    fmt: str | None = None,
    overwrite: bool = False,
    append_to: str | None = None,
    index: str | None = None,
    metric: str | None = None,
    insert: str | None = None,
    codec: Any = None,
) -> ExportResult:
    """Write ``affine`` to ``path`` in ``fmt`` (see the module docstring); returns what was written.

    Parameters
    ----------
    affine : AffineMap or WhiteningModel
        From ``WhiteningModel.as_affine`` or [`streamwhiten.serving.load`][streamwhiten.serving.load]; a model
        stands for its map at its saved setting.
    path, fmt : str
        The output file (a directory for ``sentence-transformers``); its name tells the format
        ([`format_for`][streamwhiten.export.format_for]), or ``fmt``, one of `FORMATS`, says it.
    overwrite : bool
        Replace an existing output that is a streamwhiten export of this format (`check_export_output`); else
        it is refused. One already holding what would be written is kept: `NothingToDoError` (exit 3).
    append_to, insert : str, optional
        ``sentence-transformers`` only: a local model directory whose copy gets the modules appended, and
        where in a model ending in ``Normalize`` (``"before-normalize"`` or ``"end"``; default: told from
        ``affine.mean_sq_norm``, `st_insertion`).
    index, metric : str, optional
        ``faiss`` only: a factory string (``"Flat"``, ``"HNSW32"``, ``"IVF1024,PQ32"``) for the index behind the
        transform, and its metric, ``"ip"`` or ``"l2"`` (default ``ip`` when normalising, else ``l2``).
    codec : streamwhiten.codes.Codec or bytes, optional
        ``faiss`` only: write the index that searches this faiss codec's rows (`faiss_codec_index`); default:
        a model's recorded codec. The tool's own codes (``eigen``, ``bits-*``) are refused.

    Returns
    -------
    ExportResult
        The format, the output, the map's parameters and the format's own entries.
    """
    path = os.fspath(path).rstrip("/") or os.fspath(path)
    fmt = format_for(path, fmt, append_to)
    affine, codec = _map_and_codec(affine, codec, fmt)
    dtype = "code" if codec is not None else affine.dtype
    check_options(fmt, affine.normalize, append_to, index, metric, insert, dtype)
    check_available(fmt)
    if fmt == "faiss":
        check_faiss_name(path, affine.dtype)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise BadInputError(f"{path}: directory {parent} does not exist")
    if fmt == "sentence-transformers":
        plan = plan_sentence_transformers(affine, path, append_to, insert)
        _check_target(path, fmt, overwrite, lambda: _st_is_current(path, plan["metadata"]))
        details = write_sentence_transformers(affine, path, append_to, overwrite, plan)
    else:
        payload, details = export_payload(affine, fmt, index, metric, codec)
        details = {**_write_file(path, fmt, overwrite, payload), **details}
    return ExportResult(fmt, path, affine.params(), details)


def _map_and_codec(affine: Any, codec: Any, fmt: str) -> tuple[AffineMap, Any]:
    """The map (a model's at its setting, unit-length where coded) and the codec (``codec`` or the model's)."""
    if not isinstance(affine, AffineMap) and hasattr(affine, "as_affine"):
        recorded = getattr(getattr(affine, "storage", None), "codec", None)
        if codec is None and recorded is not None:
            from .codes import record_codec

            codec = record_codec(recorded, affine.n_components)  # every field checked
        affine = affine.as_affine(normalize=True) if codec is not None else affine.as_affine()
    if codec is not None and fmt != "faiss":
        raise BadInputError(
            f"a code is exported as a faiss index (.faiss); the {fmt} format holds the map alone: export it "
            "with dtype float32 (the codec stays in the model file: serving.codec reads it)"
        )
    return affine, codec


def _write_file(path: str, fmt: str, overwrite: bool, payload: Any) -> dict[str, Any]:
    """Write ``payload`` atomically unless the file holds it; returns an npz map's ``file_checksum``."""
    _check_target(path, fmt, overwrite, lambda: _file_is_current(path, fmt, payload))
    if fmt == "npz":
        return {"file_checksum": write_npz_atomic(path, payload, "whitening map")}
    write_file_atomic(path, lambda handle: handle.write(payload), f"{fmt} export")
    return {}


def _check_target(path: str, fmt: str, overwrite: bool, is_current: Callable[[], bool]) -> None:
    """`check_export_output`, but an output that ``is_current`` is kept: `NothingToDoError` (exit 3)."""
    if os.path.lexists(path):
        if overwrite:
            check_export_output(path, fmt, overwrite)  # only one of ours is looked into
        if is_current():
            raise NothingToDoError(
                f"nothing to do: {path} is up to date (the same map, written in the same format with the same "
                "options); overwrite=True replaces only an export that is not: delete it to write it again",
                param="overwrite",
            )
    check_export_output(path, fmt, overwrite)


def export_payload(
    affine: AffineMap, fmt: str, index: str | None = None, metric: str | None = None, codec: Any = None
) -> tuple[Any, dict]:
    """``(payload, summary entries)`` of a file format: an ``npz`` map's arrays, else the file's bytes."""
    if fmt == "npz":
        return npz_arrays(affine), {}
    if fmt == "safetensors":
        return safetensors_bytes(affine), {}
    if fmt == "onnx":
        return onnx_model(affine).SerializeToString(), {"opset": ONNX_OPSET}
    if fmt == "faiss":
        return faiss_bytes(affine, index, metric, codec)
    raise BadInputError(f"{fmt}: not a file format")


def check_export_output(path: str, fmt: str, overwrite: bool) -> None:
    """An export's output is absent, or ``overwrite`` and a streamwhiten export of ``fmt`` (`foreign_export`);
    else ``OutputExistsError`` (exit 2), nothing touched."""
    check_replaceable(path, overwrite, _EXPORT_NAMES[fmt], lambda found: foreign_export(found, fmt))


_EXPORT_NAMES = {fmt: f"a {fmt} export" for fmt in FORMATS} | {"npz": "an npz export", "onnx": "an ONNX export"}


def foreign_export(path: str, fmt: str) -> str | None:
    """None when ``path`` is a streamwhiten export of ``fmt`` (by metadata; faiss: structure), else what it is."""
    found = link_or_kind(path, directory=fmt == "sentence-transformers")
    if found is not None:
        return found
    if fmt == "npz":
        return foreign_npz(path, MAP_FORMAT)
    if fmt == "sentence-transformers":
        return None if _st_metadata(path) is not None else "a directory streamwhiten did not write"
    try:
        if fmt == "safetensors":
            header, _ = _safetensors_parts(open(path, "rb").read())
            ours = header.get("__metadata__", {}).get("format") == MAP_FORMAT
        elif fmt == "onnx":
            onnx = _require("onnx", "onnx", "onnx", "the onnx export")
            props = {prop.key: prop.value for prop in onnx.load(path, load_external_data=False).metadata_props}
            ours = props.get("format") == MAP_FORMAT
        else:
            ours = _is_whitening_faiss(path)
    except Exception:  # noqa: BLE001 - whatever the reader says, it is no export of ours
        return f"not a {fmt} file"
    return None if ours else f"a {fmt} file streamwhiten did not write"


def _file_is_current(path: str, fmt: str, payload: Any) -> bool:
    """Whether the file ``path`` holds exactly ``payload`` (an ``npz`` map: the same arrays)."""
    try:
        if fmt == "npz":
            arrays = read_npz(path, "whitening map", MAP_FORMAT, MAP_VERSION)
            return checksum(arrays) == checksum(payload)
        with open(path, "rb") as handle:
            existing = handle.read()
        if fmt == "safetensors":  # its header's metadata is written in no fixed order
            return _safetensors_parts(existing) == _safetensors_parts(payload)
        return existing == payload
    except (OSError, ValueError, ModelFileError):
        return False


def npz_arrays(affine: AffineMap) -> dict:
    """An ``.npz`` map's arrays: ``A``, ``b``, ``mean`` (float64), the parameters, a ``quantization_json``."""
    return {
        "format": np.array(MAP_FORMAT),
        "format_version": np.array(MAP_VERSION, dtype=np.int64),
        "package_version": np.array(affine.metadata()["package_version"]),
        "A": np.ascontiguousarray(affine.A, dtype=np.float64),
        "b": np.asarray(affine.b, dtype=np.float64),
        "mean": np.asarray(affine.mean, dtype=np.float64),
        **setting_arrays(affine),
        "normalize": np.array(affine.normalize),
        "model_checksum": np.array(affine.checksum),
        "model_file_checksum": np.array(affine.file_checksum),
        "mean_sq_norm": np.array(np.nan if affine.mean_sq_norm is None else affine.mean_sq_norm),
        **(
            {}
            if affine.quantization is None
            else {"quantization_json": np.array(json.dumps(affine.quantization.to_dict(), sort_keys=True))}
        ),
    }


def write_npz(affine: AffineMap, path: str) -> str:
    """Write the ``.npz`` map (with its own checksum, as model files); returns that checksum."""
    return write_npz_atomic(path, npz_arrays(affine), "whitening map")


def safetensors_bytes(affine: AffineMap) -> bytes:
    """``weight`` (k x d) and ``bias`` (k) in float32, the parameters in the header metadata."""
    st_numpy = _require("safetensors.numpy", "safetensors", "torch", "the safetensors export")
    tensors = {
        "weight": np.ascontiguousarray(affine.A.T, dtype=np.float32),
        "bias": np.ascontiguousarray(affine.b, dtype=np.float32),
    }
    return st_numpy.save(tensors, metadata=dict(affine.metadata(), layout="y = x @ weight.T + bias (torch.nn.Linear)"))


def _safetensors_parts(payload: bytes) -> tuple[dict, bytes]:
    """A safetensors file as ``(header, data)``: the JSON header parsed, the tensor bytes after it."""
    length = int.from_bytes(payload[:8], "little")
    if len(payload) < 8 + length:
        raise ValueError("truncated safetensors file")
    header = json.loads(payload[8 : 8 + length])
    if not isinstance(header, dict):
        raise ValueError("not a safetensors header")
    return header, payload[8 + length :]


def torch_linear(affine: AffineMap, dtype: Any = None, device: Any = None):
    """A ``torch.nn.Linear(d, k)`` computing ``x A + b`` (float32 unless ``dtype``); without the normalisation."""
    torch = _require("torch", "torch", "torch", "a torch Linear")
    layer = torch.nn.Linear(affine.n_features, affine.n_components, bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(affine.A.T, dtype=np.float32)))
        layer.bias.copy_(torch.from_numpy(np.ascontiguousarray(affine.b, dtype=np.float32)))
    return layer.to(dtype=dtype or torch.float32, device=device)


def onnx_model(affine: AffineMap):
    """The map as an ONNX model: input ``x`` (batch x d, float32), output ``y`` (batch x k)."""
    onnx = _require("onnx", "onnx", "onnx", "the onnx export")
    from onnx import TensorProto, helper, numpy_helper

    d, k = affine.n_features, affine.n_components
    initializers = [
        numpy_helper.from_array(np.ascontiguousarray(affine.A, dtype=np.float32), "A"),
        numpy_helper.from_array(np.ascontiguousarray(affine.b, dtype=np.float32), "b"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "A"], ["xA"], name="matmul"),
        helper.make_node("Add", ["xA", "b"], ["affine" if affine.normalize else "y"], name="add"),
    ]
    if affine.normalize:  # y / ||y||, zero rows kept zero (as the engine does)
        initializers += [
            numpy_helper.from_array(np.array([-1], dtype=np.int64), "last_axis"),
            numpy_helper.from_array(np.array(0, dtype=np.float32), "zero"),
            numpy_helper.from_array(np.array(1, dtype=np.float32), "one"),
        ]
        nodes += [
            helper.make_node("ReduceL2", ["affine", "last_axis"], ["norm"], keepdims=1, name="norm"),
            helper.make_node("Greater", ["norm", "zero"], ["positive"], name="positive"),
            helper.make_node("Where", ["positive", "norm", "one"], ["divisor"], name="divisor"),
            helper.make_node("Div", ["affine", "divisor"], ["y"], name="normalize"),
        ]
    graph = helper.make_graph(
        nodes,
        "streamwhiten_whitening",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", k])],
        initializer=initializers,
    )
    opset = [helper.make_opsetid("", ONNX_OPSET)]
    model = helper.make_model(
        graph,
        opset_imports=opset,
        producer_name="streamwhiten",
        producer_version=affine.metadata()["package_version"],
        doc_string="BERT-whitening y = x A + b" + (", L2-normalised" if affine.normalize else ""),
    )
    model.ir_version = helper.find_min_ir_version_for(opset)
    helper.set_model_props(model, affine.metadata())
    onnx.checker.check_model(model, full_check=True)
    return model


def faiss_transform(affine: AffineMap):
    """A trained ``faiss.LinearTransform`` computing ``x A + b`` in float32 (faiss stores ``A^T``)."""
    faiss = _require("faiss", "faiss-cpu", "faiss", "the faiss export")
    transform = faiss.LinearTransform(affine.n_features, affine.n_components, True)
    faiss.copy_array_to_vector(np.ascontiguousarray(affine.A.T, dtype=np.float32).ravel(), transform.A)
    faiss.copy_array_to_vector(np.ascontiguousarray(affine.b, dtype=np.float32), transform.b)
    transform.is_trained = True
    return transform


def faiss_index(affine: AffineMap, factory: str, metric: str | None = None):
    """An empty ``IndexPreTransform``: the map, ``NormalizationTransform`` if normalising, the ``factory`` index."""
    faiss = _require("faiss", "faiss-cpu", "faiss", "the faiss export")
    metric = metric or ("ip" if affine.normalize else "l2")
    try:
        inner = faiss.index_factory(affine.n_components, factory, _faiss_metric(faiss, metric))
    except RuntimeError as exc:
        raise BadInputError(
            f"index={factory!r}: faiss cannot build it for {affine.n_components}-d vectors "
            f"({' '.join(str(exc).split())[-200:]})",
            param="index",
        ) from exc
    if affine.normalize:
        index = faiss.IndexPreTransform(faiss.NormalizationTransform(affine.n_components, 2.0), inner)
        index.prepend_transform(faiss_transform(affine))
    else:
        index = faiss.IndexPreTransform(faiss_transform(affine), inner)
    return index, metric


def _faiss_metric(faiss: Any, metric: str) -> int:
    """faiss's constant for ``metric`` (``"ip"`` or ``"l2"``; anything else is refused)."""
    if metric not in ("ip", "l2"):
        raise BadInputError(f"unknown faiss metric {metric!r}; choose ip or l2")
    return int(faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2)


def faiss_int8_index(affine: AffineMap, metric: str | None = None):
    """An empty ``IndexPreTransform``: the map, ``NormalizationTransform``, an 8-bit SQ on the int8 ranges."""
    faiss = _require("faiss", "faiss-cpu", "faiss", "the faiss export")
    metric = metric or "ip"
    k = affine.n_components
    inner = faiss.IndexScalarQuantizer(k, faiss.ScalarQuantizer.QT_8bit, _faiss_metric(faiss, metric))
    q: Any = affine.quantization  # vmin and vdiff: its codes decode to ours (module docstring)
    vmin_vdiff = np.concatenate([q.offset - 127.5 * q.scale, 255.0 * q.scale])
    faiss.copy_array_to_vector(vmin_vdiff.astype(np.float32), inner.sq.trained)
    inner.is_trained = True
    index = faiss.IndexPreTransform(faiss.NormalizationTransform(k, 2.0), inner)
    index.prepend_transform(faiss_transform(affine))
    return index, metric


def faiss_codec_index(affine: AffineMap, codec: Any) -> Any:
    """An empty ``IndexPreTransform`` searching a faiss ``codec``'s rows: the map, ``NormalizationTransform``,
    the codec's centring and projection, its OPQ rotation if any, then its trained index. Add the encoded
    rows with ``index.index.add_sa_codes(rows)``; ``index.search(x)`` of raw queries ranks as the codec does."""
    faiss = _require("faiss", "faiss-cpu", "faiss", "the faiss export")
    from .codes import Codec, codec_from_bytes
    from .codes.faiss_codes import FaissCode

    if not isinstance(codec, Codec):
        codec = codec_from_bytes(bytes(codec))
    if not isinstance(codec, FaissCode):
        raise BadInputError(
            f"faiss cannot scan the tool's own {codec.label} codes: search them with streamwhiten.codes.fast.search "
            "(or eval with the code as dtype), or decode them (serving.decode(rows, serving.codec(MODEL or the output's "
            "attributes))) into a float index; dtype float32 writes the map alone",
            param="dtype",
        )
    if codec.n_features != affine.n_components:
        raise BadInputError(
            f"the {codec.label} codec codes vectors of {codec.n_features} values, but the map gives {affine.n_components}"
        )
    k = affine.n_components
    basis = np.eye(k, dtype=np.float32) if codec.basis is None else codec.basis
    centring = faiss.LinearTransform(k, int(basis.shape[1]), True)
    faiss.copy_array_to_vector(np.ascontiguousarray(basis.T, dtype=np.float32).ravel(), centring.A)
    shift = -(codec.mean.astype(np.float32) @ basis.astype(np.float32))
    faiss.copy_array_to_vector(np.ascontiguousarray(shift, dtype=np.float32), centring.b)
    centring.is_trained = True
    inner = faiss.deserialize_index(codec.index_bytes)
    if isinstance(inner, faiss.IndexPreTransform):  # OPQ: its rotation, then the PQ index
        # a new chain that does not own them (``inner`` does, kept alive by the new index): prepending to
        # ``inner`` itself would make it free the transforms Python owns
        index = faiss.IndexPreTransform(faiss.downcast_index(inner.index))
        index.prepend_transform(faiss.downcast_VectorTransform(inner.chain.at(0)))
        index.referenced_objects.append(inner)
        index.prepend_transform(centring)
    else:
        index = faiss.IndexPreTransform(centring, inner)
    index.prepend_transform(faiss.NormalizationTransform(k, 2.0))
    index.prepend_transform(faiss_transform(affine))
    return index, codec


def _is_whitening_faiss(path: str) -> bool:
    """Whether the faiss file ``path`` is what `export` writes (what is read outlives its downcast views)."""
    faiss = _require("faiss", "faiss-cpu", "faiss", "the faiss export")
    try:
        transform = faiss.read_VectorTransform(path)
    except RuntimeError:  # not a transform: an index?
        transform = None
    if transform is not None:
        return type(faiss.downcast_VectorTransform(transform)) is faiss.LinearTransform
    try:
        read = faiss.read_index(path)
    except RuntimeError:  # not a float index: the empty binary index of binary storage?
        binary = faiss.read_index_binary(path)
        return type(faiss.downcast_IndexBinary(binary)) is faiss.IndexBinaryFlat and binary.ntotal == 0
    index = faiss.downcast_index(read)
    if not isinstance(index, faiss.IndexPreTransform) or index.ntotal != 0 or index.chain.size() < 1:
        return False
    return type(faiss.downcast_VectorTransform(index.chain.at(0))) is faiss.LinearTransform


def faiss_bytes(
    affine: AffineMap, factory: str | None = None, metric: str | None = None, codec: Any = None
) -> tuple[bytes, dict]:
    """faiss's bytes for the ``LinearTransform`` (with ``factory`` the empty index; for int8 or binary storage
    its index; with ``codec`` `faiss_codec_index`) and the summary entries. A binary index holds no map: add
    and search the packed bits ``AffineMap.encode`` gives."""
    faiss = _require("faiss", "faiss-cpu", "faiss", "the faiss export")
    if codec is not None:
        if factory is not None or metric not in (None, "ip"):
            raise BadInputError(
                "index and metric are for float storage: a code is written as its own faiss structure",
                param=("index", "metric"),
            )
        index, codec = faiss_codec_index(affine, codec)
        described = f"{codec.label} (the model's codec: add its rows with index.index.add_sa_codes)"
        info = dict(
            _index_info(described, "l2" if codec.unit else "ip"),
            code=codec.label,
            bytes_per_vector=codec.bytes_per_vector,
            model_bytes=codec.model_bytes,
        )
    elif affine.dtype == "int8":
        index, metric = faiss_int8_index(affine, metric)
        info = _index_info("SQ8 (ranges: the map's int8 record)", metric)
    elif affine.dtype == "binary":
        bits = 8 * -(-affine.n_components // 8)
        payload = faiss.serialize_index_binary(faiss.IndexBinaryFlat(bits)).tobytes()
        described = f"{bits} bits (numpy.packbits of the signs, last byte zero-padded)"
        return payload, dict(
            _index_info(described, "hamming"), faiss="IndexBinaryFlat", read_with="faiss.read_index_binary"
        )
    elif factory is None:
        writer = faiss.VectorIOWriter()
        faiss.write_VectorTransform(faiss_transform(affine), writer)
        return faiss.vector_to_array(writer.data).tobytes(), {
            "faiss": "LinearTransform",
            "read_with": "faiss.read_VectorTransform",
        }
    else:
        index, metric = faiss_index(affine, factory, metric)
        info = _index_info(factory, metric, needs_training=not bool(index.is_trained))
    return faiss.serialize_index(index).tobytes(), info


def _index_info(index: str, metric: str, needs_training: bool = False) -> dict[str, Any]:
    """The summary entries of a faiss index export (read with ``faiss.read_index``)."""
    return {
        "faiss": "IndexPreTransform",
        "index": index,
        "metric": metric,
        "read_with": "faiss.read_index",
        "needs_training": needs_training,
    }


BINARY_FAISS_SUFFIX = ".binary.faiss"


def check_faiss_name(path: str, dtype: str | None) -> None:
    """A binary index (read with ``faiss.read_index_binary``) is named ``*.binary.faiss``, nothing else is."""
    binary_name = path.lower().endswith(BINARY_FAISS_SUFFIX)
    if dtype == "binary" and not binary_name:
        raise BadInputError(
            f"{path}: a binary faiss index (sign bits) is named *{BINARY_FAISS_SUFFIX}, as it is read with "
            "faiss.read_index_binary (or streamwhiten.export.read_faiss_binary): name it so"
        )
    if dtype != "binary" and binary_name:
        raise BadInputError(
            f"{path}: *{BINARY_FAISS_SUFFIX} names a binary index, but this export is a float faiss file "
            f"(read with faiss.read_index or faiss.read_VectorTransform): name it *.faiss"
        )


def read_faiss_index(path: str):
    """Read a float faiss export (an index: ``IndexPreTransform``, or an int8 ``IndexScalarQuantizer``
    behind one) with ``faiss.read_index``; a binary index is refused in one line naming its loader."""
    faiss = _require("faiss", "faiss-cpu", "faiss", "reading a faiss export")
    binary = (
        "a binary faiss index (sign bits): read it with faiss.read_index_binary (streamwhiten.export.read_faiss_binary)"
    )
    transform = "a faiss LinearTransform, not an index: read it with faiss.read_VectorTransform"
    others = {faiss.read_index_binary: binary, faiss.read_VectorTransform: transform}
    return _read_faiss(path, faiss.read_index, "a faiss index", others)


def read_faiss_binary(path: str):
    """Read a binary faiss export (``*.binary.faiss``, an ``IndexBinaryFlat`` of packed sign bits) with
    ``faiss.read_index_binary``; a float index is refused in one line naming its loader."""
    faiss = _require("faiss", "faiss-cpu", "faiss", "reading a faiss export")
    floats = (
        "a float faiss file, not a binary index: read it with faiss.read_index (streamwhiten.export.read_faiss_index)"
    )
    others = {faiss.read_index: floats, faiss.read_VectorTransform: floats}
    return _read_faiss(path, faiss.read_index_binary, "a binary faiss index", others)


def _read_faiss(path: str, reader: Callable[[str], Any], what: str, others: dict) -> Any:
    """``reader(path)``, else `BadInputError`: the message of the first of ``others`` that reads it, or not ``what``."""
    try:
        return reader(os.fspath(path))
    except RuntimeError as error:
        last = str(error).strip().splitlines()[-1]
    for other, message in others.items():
        try:
            other(os.fspath(path))
        except RuntimeError:
            continue
        raise BadInputError(f"{path}: {message}")
    raise BadInputError(f"{path}: not {what}: {last}")


def _st_modules():
    check_available("sentence-transformers")
    try:
        from sentence_transformers.sentence_transformer.modules import Dense, Normalize
    except ImportError:  # releases before 6
        from sentence_transformers.models import Dense, Normalize
    return Dense, Normalize


def st_output_dimension(model_dir: str) -> int:
    """The width of the vectors a local sentence-transformers model gives (loaded offline, on the CPU)."""
    _st_modules()
    from sentence_transformers import SentenceTransformer

    if not os.path.isfile(os.path.join(model_dir, "modules.json")):
        raise BadInputError(f"{model_dir}: not a local sentence-transformers model (no modules.json)")
    try:
        model = SentenceTransformer(model_dir, device="cpu", local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever the loader raises, it is this directory's fault
        raise BadInputError(
            f"{model_dir}: sentence-transformers cannot load it "
            f"({exc.__class__.__name__}: {' '.join(str(exc).split())[:200]})"
        ) from exc
    getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    width = getter()
    if width is None:  # a module that does not say: measure it
        width = int(np.asarray(model.encode(["streamwhiten"], convert_to_numpy=True)).shape[-1])
    return int(width)


def st_insertion(modules: list, mean_sq_norm: float | None, insert: str | None, base: str) -> str:
    """Where ``--append-to`` puts the whitening in ``base``'s ``modules``: ``"before-normalize"`` or ``"end"``.

    ``insert`` chooses; else the fitted rows' mean squared norm tells: unit-length (within
    `UNIT_NORM_TOLERANCE`) came from after a ``Normalize``, clearly not (beyond `NOT_UNIT_NORM`) from
    before it. What cannot be told is refused, saying how to choose (exit 2).
    """
    normalizes = bool(modules) and str(modules[-1].get("type", "")).rsplit(".", 1)[-1] == "Normalize"
    if insert == "before-normalize" and not normalizes:
        raise BadInputError(
            f"{base}: insert='before-normalize': the model does not end in a Normalize module; use insert='end'",
            param="insert",
        )
    if insert in INSERTS:
        return insert
    choose = (
        "pass insert='before-normalize' if they are the model's vectors before its Normalize (e.g. embeddings "
        "stored without normalize_embeddings), or insert='end' if they are its unit-length output"
    )
    if mean_sq_norm is None:
        if not normalizes:
            return "end"
        raise BadInputError(
            f"{base}: ends in a Normalize module, and the map does not record the norm of the rows it was "
            f"fitted on; {choose}",
            param="insert",
        )
    deviation = abs(float(mean_sq_norm) - 1.0)
    if normalizes and deviation <= UNIT_NORM_TOLERANCE:
        return "end"
    if deviation > NOT_UNIT_NORM:
        return "before-normalize" if normalizes else "end"
    if normalizes:
        raise BadInputError(
            f"{base}: ends in a Normalize module, and the rows the whitening was fitted on are nearly but not "
            f"exactly unit-length (mean squared norm {mean_sq_norm:.6g}); {choose}",
            param="insert",
        )
    what = "unit-length" if deviation <= UNIT_NORM_TOLERANCE else "nearly unit-length"
    raise BadInputError(
        f"{base}: the whitening was fitted on {what} rows (mean squared norm {mean_sq_norm:.6g}), but the model "
        "does not end in a Normalize module, so its vectors are not: pass insert='end' if they are "
        "anyway, or append to the model that embedded the rows",
        param="insert",
    )


def plan_sentence_transformers(
    affine: AffineMap, path: str, append_to: str | None = None, insert: str | None = None
) -> dict:
    """What `write_sentence_transformers` writes to ``path``: the base model's ``modules``, the ``insert``
    (`st_insertion`) and the ``metadata`` of ``streamwhiten.json``; the base must give the map's width."""
    _st_modules()
    modules, where, base_digest = [], None, None
    if append_to is not None:
        width = st_output_dimension(append_to)
        if width != affine.n_features:
            raise BadInputError(
                f"{append_to}: the sentence-transformers model gives {width}-d vectors, but the "
                f"whitening was fitted on {affine.n_features}-d vectors"
            )
        with open(os.path.join(append_to, "modules.json"), encoding="utf8") as handle:
            modules = json.load(handle)
        where = st_insertion(modules, affine.mean_sq_norm, insert, append_to)
        base_digest = _tree_sha256(append_to, path)
    metadata = dict(
        affine.params(),
        format=MAP_FORMAT,
        format_version=MAP_VERSION,
        package_version=affine.metadata()["package_version"],
        appended_to=append_to,
        insert=where,
        base_sha256=base_digest,
        layout="Dense: y = x @ linear.weight.T + linear.bias",
    )
    return {"modules": modules, "insert": where, "metadata": json.loads(json.dumps(metadata))}


def write_sentence_transformers(
    affine: AffineMap, path: str, append_to: str | None = None, overwrite: bool = False, plan: dict | None = None
) -> dict:
    """Write the Dense (+ Normalize) modules, alone or in a copy of ``append_to``, in a temporary directory
    renamed into place; ``plan``: `plan_sentence_transformers`'s (made here when not given)."""
    _st_modules()
    plan = plan if plan is not None else plan_sentence_transformers(affine, path, append_to)
    remove_stale_temps(path)
    temp = temp_path(path)
    try:
        paths = _build_st_tree(affine, temp, plan, append_to)
        # what makes a rerun find it up to date: the same metadata, and the files as they were written
        metadata = dict(plan["metadata"], tree_sha256=_tree_sha256(temp, path))
        with open(os.path.join(temp, paths[0], ST_METADATA), "w", encoding="utf8") as handle:
            json.dump(metadata, handle, indent=2, sort_keys=True)
        _fsync_tree(temp)
        _rename_dir_into_place(temp, path, overwrite)
    except BaseException as exc:
        shutil.rmtree(temp, ignore_errors=True)
        failed = isinstance(exc, Exception) and not isinstance(exc, StoreIOError)
        reason = write_failure(exc) if failed else None
        if reason is None:
            raise
        raise StoreIOError(
            f"{path}: cannot write the sentence-transformers export: {reason}; nothing was written"
        ) from exc
    return {"modules": paths, "appended_to": append_to, "insert": plan["insert"]}


def _build_st_tree(affine: AffineMap, temp: str, plan: dict, append_to: str | None) -> list[str]:
    """Build the export in ``temp`` (a copy of ``append_to``, less a replaced ``Normalize``, then the
    modules and ``modules.json``); returns the folders of the modules added."""
    import torch

    Dense, Normalize = _st_modules()
    modules = [dict(entry) for entry in plan["modules"]]
    if append_to is not None:
        shutil.copytree(append_to, temp, symlinks=False)
        if plan["insert"] == "before-normalize":  # the whitening takes its place
            folder = str(modules.pop().get("path") or "")
            if folder.strip("./"):
                _remove_tree(os.path.join(temp, folder))
    else:
        os.makedirs(temp)
    dense = Dense(
        affine.n_features,
        affine.n_components,
        bias=True,
        activation_function=torch.nn.Identity(),
        init_weight=torch.from_numpy(np.ascontiguousarray(affine.A.T, dtype=np.float32)),
        init_bias=torch.from_numpy(np.ascontiguousarray(affine.b, dtype=np.float32)),
    )
    paths = []
    for module in [dense] + ([Normalize()] if affine.normalize else []):
        entry = _module_entry(temp, modules, module)
        os.makedirs(os.path.join(temp, entry["path"]))
        module.save(os.path.join(temp, entry["path"]))
        modules.append(entry)
        paths.append(entry["path"])
    with open(os.path.join(temp, "modules.json"), "w", encoding="utf8") as handle:
        json.dump(modules, handle, indent=2)
    return paths


#: The file in the whitening's Dense folder recording the parameters and what the export was made from.
ST_METADATA = "streamwhiten.json"


def _st_metadata(path: str) -> tuple[str, dict] | None:
    """``(relative path, contents)`` of our `ST_METADATA` in the export at ``path``, or None."""
    try:
        with open(os.path.join(path, "modules.json"), encoding="utf8") as handle:
            modules = json.load(handle)
        for entry in modules:
            relative = os.path.join(str(entry.get("path") or ""), ST_METADATA)
            if os.path.isfile(os.path.join(path, relative)):
                with open(os.path.join(path, relative), encoding="utf8") as handle:
                    metadata = json.load(handle)
                if isinstance(metadata, dict) and metadata.get("format") == MAP_FORMAT:
                    return relative, metadata
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return None


def _st_is_current(path: str, metadata: dict) -> bool:
    """Whether the export at ``path`` records ``metadata`` and its files are as they were written."""
    found = _st_metadata(path)
    if found is None:
        return False
    relative, recorded = found
    tree = recorded.pop("tree_sha256", None)
    try:
        return recorded == metadata and tree == _tree_sha256(path, path, skip=relative)
    except StoreIOError:
        return False


def _tree_sha256(root: str, output: str, skip: str | None = None) -> str:
    """A SHA-256 of the names and contents under ``root`` but ``skip``; `StoreIOError` naming ``output``."""
    digest = hashlib.sha256()
    walk = os.walk(root, followlinks=True)
    names = sorted(os.path.relpath(os.path.join(folder, name), root) for folder, _, files in walk for name in files)
    for relative in [name for name in names if name != skip]:
        try:
            with open(os.path.join(root, relative), "rb") as handle:
                digest.update(relative.encode() + b"\0")
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
                digest.update(b"\0")
        except OSError as exc:
            raise StoreIOError(
                f"{output}: cannot write the sentence-transformers export: reading {os.path.join(root, relative)}: "
                f"{exc.strerror or exc}; nothing was written"
            ) from exc
    return digest.hexdigest()


def _remove_tree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


#: A Rust ``std::io::Error`` in a message (safetensors: ``(os error 28)`` or ``Os { code: 28, ...``).
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+)")
#: What torch's file writer says when a write fails (a ``RuntimeError``, its errno lost).
_TORCH_WRITE_FAILED = ("file write failed", "failed writing file", "unexpected pos")


def write_failure(exc: BaseException) -> str | None:
    """What went wrong, short, when ``exc`` is a failed write (an `OSError`, or safetensors' or torch's
    report of one), so that it becomes a `StoreIOError` (exit 74); else None (a bug, raised as it is)."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        source, _, reason = exc.args[0][0]  # copytree's list of (source, target, reason)
        more = len(exc.args[0]) - 1
        return f"copying {source}: {reason}" + (f" (and {more} more)" if more else "")
    if isinstance(exc, OSError):
        return str(exc.strerror or exc)
    text = str(exc)
    found = _RUST_OS_ERROR.search(text)
    if found:
        return os.strerror(int(found.group(1) or found.group(2)))
    safetensors = type(exc).__name__ == "SafetensorError" and ("IoError" in text or "I/O error" in text)
    torch = isinstance(exc, RuntimeError) and any(words in text.lower() for words in _TORCH_WRITE_FAILED)
    return " ".join(text.split())[:200] if safetensors or torch else None


def _module_entry(root: str, modules: list, module: Any) -> dict:
    """The ``modules.json`` entry of ``module`` appended after ``modules`` (a fresh name and folder)."""
    idx = len(modules)
    names = {str(entry.get("name")) for entry in modules}
    folders = {str(entry.get("path")) for entry in modules}
    kind = type(module).__name__
    name, folder, suffix = str(idx), f"{idx}_{kind}", 0
    while name in names or folder in folders or os.path.lexists(os.path.join(root, folder)):
        suffix += 1
        name, folder = f"{idx}_{suffix}", f"{idx}_{kind}_{suffix}"
    return {"idx": idx, "name": name, "path": folder, "type": f"{type(module).__module__}.{kind}"}


def _fsync_tree(root: str) -> None:
    for directory, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(directory, name), "rb") as handle:
                os.fsync(handle.fileno())
        fsync_dir(directory)


def _rename_dir_into_place(temp: str, path: str, overwrite: bool) -> None:
    final = os.path.abspath(path)
    if os.path.lexists(final):
        check_export_output(path, "sentence-transformers", overwrite)  # again: it may have changed meanwhile
        # no atomic replace for a directory: the old one is moved aside first (a later run restores it)
        old = temp_path(final, "old")
        os.rename(final, old)
        os.rename(temp, final)
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.remove(old)
    else:
        os.rename(temp, final)
    try:
        fsync_dir(os.path.dirname(final))
    except OSError as exc:  # in place and complete: say so (a rerun finds it up to date)
        raise StoreIOError(
            f"{path}: sentence-transformers export written, but its directory could not be synced "
            f"({exc.strerror or exc}): it may not survive a power loss"
        ) from exc


__all__ = [
    "FORMATS",
    "INSERTS",
    "ExportResult",
    "export",
    "export_payload",
    "check_export_output",
    "foreign_export",
    "st_insertion",
    "plan_sentence_transformers",
    "faiss_bytes",
    "faiss_int8_index",
    "format_for",
    "check_options",
    "check_available",
    "npz_arrays",
    "write_npz",
    "safetensors_bytes",
    "torch_linear",
    "onnx_model",
    "faiss_transform",
    "faiss_index",
    "st_output_dimension",
    "write_sentence_transformers",
]
