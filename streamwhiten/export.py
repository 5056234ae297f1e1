"""Hand the whitening to the code that embeds queries: numpy, torch, sentence-transformers, faiss, ONNX.

Every export writes the same affine map ``y = x A + b`` (see :class:`~streamwhiten.core.affine.AffineMap`),
in float64 for ``npz`` and float32 elsewhere, optionally followed by L2 normalisation:

========================= ==================================================================================
``npz``                   plain arrays ``A`` (d x k), ``b``, ``mean`` and the parameters; read by
                          :func:`streamwhiten.serving.load` or ``numpy.load`` alone
``safetensors``           ``weight`` (k x d) and ``bias`` (k): the state dict of ``torch.nn.Linear(d, k)``
``sentence-transformers`` a directory with a ``Dense`` module (identity activation) and ``Normalize`` when
                          asked; with ``append_to`` a copy of a local model with these modules appended
``faiss``                 a ``LinearTransform``; with ``index`` an empty ``IndexPreTransform`` (the transform,
                          ``NormalizationTransform`` when asked, then the index)
``onnx``                  MatMul + Add (+ L2 normalisation), dynamic batch axis, opset 21
========================= ==================================================================================

The parameters and the source model's checksum go into each format's own metadata where it has a place
(npz arrays, safetensors header, ONNX ``metadata_props``, a ``streamwhiten.json`` in the Dense module's
folder); a faiss file has none. The target library is imported only by the function that needs it; a
missing one raises :class:`BadInputError` naming the ``pip install``. Outputs are written under a temporary
name beside the target and renamed into place when complete.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil

import numpy as np

from ._durable import fsync_dir, remove_stale_temps, temp_path, write_file_atomic
from ._npz import write_npz_atomic
from .core.affine import MAP_FORMAT, MAP_VERSION, AffineMap
from .errors import BadInputError, OutputExistsError, StoreIOError

FORMATS = ("npz", "safetensors", "sentence-transformers", "faiss", "onnx")
EXTENSIONS = {".npz": "npz", ".safetensors": "safetensors", ".onnx": "onnx", ".faiss": "faiss", ".index": "faiss"}
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
    """Raise the one-line :class:`BadInputError` naming the ``pip install`` if ``fmt``'s library is missing."""
    for module, package, extra in REQUIREMENTS[fmt]:
        _require(module, package, extra, f"the {fmt} export")


def format_for(path: str, fmt: str | None = None, append_to: str | None = None) -> str:
    """The export format: ``fmt`` if given, else from the extension, else ``sentence-transformers`` with ``append_to``."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise BadInputError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
        return fmt
    extension = os.path.splitext(os.fspath(path).rstrip("/"))[1].lower()
    if extension in EXTENSIONS:
        return EXTENSIONS[extension]
    if append_to is not None:
        return "sentence-transformers"
    raise BadInputError(
        f"{path}: cannot tell the export format from the name; end it in "
        f"{', '.join(EXTENSIONS)} or pass --format ({', '.join(FORMATS)})"
    )


def check_options(
    fmt: str, normalize: bool = False, append_to: str | None = None, index: str | None = None, metric: str | None = None
) -> None:
    """Raise :class:`BadInputError` for an option another format than ``fmt`` takes."""
    if append_to is not None and fmt != "sentence-transformers":
        raise BadInputError("--append-to is for the sentence-transformers format")
    if (index is not None or metric is not None) and fmt != "faiss":
        raise BadInputError("--index and --metric are for the faiss format")
    if metric is not None and index is None:
        raise BadInputError("--metric chooses the metric of --index; give --index too")
    if fmt == "faiss" and normalize and index is None:
        raise BadInputError(
            "faiss keeps a LinearTransform followed by a NormalizationTransform only inside an index: "
            "add --index (e.g. --index Flat) for an IndexPreTransform, or drop --normalize"
        )


def export(
    affine: AffineMap,
    path: str,
    fmt: str | None = None,
    overwrite: bool = False,
    append_to: str | None = None,
    index: str | None = None,
    metric: str | None = None,
) -> dict:
    """Write ``affine`` to ``path`` in ``fmt`` (see the module docstring); returns a summary.

    Parameters
    ----------
    affine : AffineMap
        From ``WhiteningModel.as_affine`` or :func:`streamwhiten.serving.load`.
    path : str
        The output file, or directory for ``sentence-transformers``.
    fmt : str, optional
        One of :data:`FORMATS`; default from ``path``'s extension (else ``sentence-transformers`` with ``append_to``).
    overwrite : bool
        Replace an existing output (otherwise :class:`OutputExistsError`).
    append_to : str, optional
        ``sentence-transformers`` only: a local model directory whose copy gets the modules appended.
    index : str, optional
        ``faiss`` only: a factory string (``"Flat"``, ``"HNSW32"``, ``"IVF1024,PQ32"``) for the index behind the transform.
    metric : {"ip", "l2"}, optional
        ``faiss`` with ``index``: the index metric (default ``ip`` when normalising, else ``l2``).

    Returns
    -------
    dict
        ``format``, ``output``, ``n_features``, ``n_components``, the parameters, and format-specific entries.
    """
    path = os.fspath(path).rstrip("/") or os.fspath(path)
    fmt = format_for(path, fmt, append_to)
    check_options(fmt, affine.normalize, append_to, index, metric)
    check_available(fmt)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise BadInputError(f"{path}: directory {parent} does not exist")
    if os.path.lexists(path) and not overwrite:
        raise OutputExistsError.at(path)
    summary = dict(affine.params(), format=fmt, output=path)
    if fmt == "npz":
        summary["checksum"] = write_npz(affine, path)
    elif fmt == "safetensors":
        write_safetensors(affine, path)
    elif fmt == "onnx":
        write_onnx(affine, path)
        summary["opset"] = ONNX_OPSET
    elif fmt == "faiss":
        summary.update(write_faiss(affine, path, index, metric))
    else:
        summary.update(write_sentence_transformers(affine, path, append_to, overwrite))
    return summary


# ------------------------------------------------------------------------------------------ npz


def npz_arrays(affine: AffineMap) -> dict:
    """The arrays of an ``.npz`` map: ``A``, ``b``, ``mean`` (float64) and the parameters."""
    return {
        "format": np.array(MAP_FORMAT),
        "format_version": np.array(MAP_VERSION, dtype=np.int64),
        "package_version": np.array(affine.metadata()["package_version"]),
        "A": np.ascontiguousarray(affine.A, dtype=np.float64),
        "b": np.asarray(affine.b, dtype=np.float64),
        "mean": np.asarray(affine.mean, dtype=np.float64),
        "beta": np.array(affine.beta),
        "gamma": np.array(affine.gamma),
        "eps": np.array(affine.eps),
        "eps_value": np.array(affine.eps_value),
        "variance": np.array(np.nan if affine.variance is None else affine.variance),
        "n_components": np.array(affine.n_components, dtype=np.int64),
        "n_features": np.array(affine.n_features, dtype=np.int64),
        "normalize": np.array(affine.normalize),
        "model_checksum": np.array(affine.model_checksum),
    }


def write_npz(affine: AffineMap, path: str) -> str:
    """Write the ``.npz`` map (with its own checksum, as model files); returns that checksum."""
    return write_npz_atomic(path, npz_arrays(affine), "whitening map")


# ------------------------------------------------------------------------------------------ safetensors / torch


def safetensors_bytes(affine: AffineMap) -> bytes:
    """``weight`` (k x d) and ``bias`` (k) in float32, the parameters in the header metadata."""
    st_numpy = _require("safetensors.numpy", "safetensors", "torch", "the safetensors export")
    tensors = {
        "weight": np.ascontiguousarray(affine.A.T, dtype=np.float32),
        "bias": np.ascontiguousarray(affine.b, dtype=np.float32),
    }
    return st_numpy.save(tensors, metadata=dict(affine.metadata(), layout="y = x @ weight.T + bias (torch.nn.Linear)"))


def write_safetensors(affine: AffineMap, path: str) -> None:
    """Write the ``nn.Linear`` state dict (see :func:`safetensors_bytes`)."""
    payload = safetensors_bytes(affine)
    write_file_atomic(path, lambda handle: handle.write(payload), "safetensors export")


def torch_linear(affine: AffineMap, dtype=None, device=None):
    """A ``torch.nn.Linear(d, k)`` computing ``x A + b`` (float32 unless ``dtype``); without the normalisation."""
    torch = _require("torch", "torch", "torch", "a torch Linear")
    layer = torch.nn.Linear(affine.n_features, affine.n_components, bias=True)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(affine.A.T, dtype=np.float32)))
        layer.bias.copy_(torch.from_numpy(np.ascontiguousarray(affine.b, dtype=np.float32)))
    return layer.to(dtype=dtype or torch.float32, device=device)


# ------------------------------------------------------------------------------------------ onnx


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


def write_onnx(affine: AffineMap, path: str) -> None:
    """Write :func:`onnx_model` (weights inside the file)."""
    payload = onnx_model(affine).SerializeToString()
    write_file_atomic(path, lambda handle: handle.write(payload), "onnx export")


# ------------------------------------------------------------------------------------------ faiss


def faiss_transform(affine: AffineMap):
    """A trained ``faiss.LinearTransform`` computing ``x A + b`` in float32 (faiss stores ``A^T``)."""
    faiss = _require("faiss", "faiss-cpu", "faiss", "the faiss export")
    transform = faiss.LinearTransform(affine.n_features, affine.n_components, True)
    faiss.copy_array_to_vector(np.ascontiguousarray(affine.A.T, dtype=np.float32).ravel(), transform.A)
    faiss.copy_array_to_vector(np.ascontiguousarray(affine.b, dtype=np.float32), transform.b)
    transform.is_trained = True
    return transform


def faiss_index(affine: AffineMap, factory: str, metric: str | None = None):
    """An empty ``IndexPreTransform``: the map, ``NormalizationTransform`` when normalising, then ``factory``'s index."""
    faiss = _require("faiss", "faiss-cpu", "faiss", "the faiss export")
    metric = metric or ("ip" if affine.normalize else "l2")
    if metric not in ("ip", "l2"):
        raise BadInputError(f"unknown faiss metric {metric!r}; choose ip or l2")
    code = faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2
    try:
        inner = faiss.index_factory(affine.n_components, factory, code)
    except RuntimeError as exc:
        raise BadInputError(
            f"--index {factory!r}: faiss cannot build it for {affine.n_components}-d vectors "
            f"({' '.join(str(exc).split())[-200:]})"
        ) from exc
    if affine.normalize:
        index = faiss.IndexPreTransform(faiss.NormalizationTransform(affine.n_components, 2.0), inner)
        index.prepend_transform(faiss_transform(affine))
    else:
        index = faiss.IndexPreTransform(faiss_transform(affine), inner)
    return index, metric


def write_faiss(affine: AffineMap, path: str, factory: str | None = None, metric: str | None = None) -> dict:
    """Write the ``LinearTransform`` (or, with ``factory``, the empty index) with faiss's own writer."""
    faiss = _require("faiss", "faiss-cpu", "faiss", "the faiss export")
    if factory is None:
        writer = faiss.VectorIOWriter()
        faiss.write_VectorTransform(faiss_transform(affine), writer)
        payload = faiss.vector_to_array(writer.data).tobytes()
        info = {"faiss": "LinearTransform", "read_with": "faiss.read_VectorTransform"}
    else:
        index, metric = faiss_index(affine, factory, metric)
        payload = faiss.serialize_index(index).tobytes()
        info = {
            "faiss": "IndexPreTransform",
            "index": factory,
            "metric": metric,
            "read_with": "faiss.read_index",
            "needs_training": not bool(index.is_trained),
        }
    write_file_atomic(path, lambda handle: handle.write(payload), "faiss export")
    return info


# ------------------------------------------------------------------------------------------ sentence-transformers


def _st_modules():
    _require("torch", "torch", "sentence-transformers", "the sentence-transformers export")
    _require(
        "sentence_transformers", "sentence-transformers", "sentence-transformers", "the sentence-transformers export"
    )
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


def write_sentence_transformers(
    affine: AffineMap, path: str, append_to: str | None = None, overwrite: bool = False
) -> dict:
    """Write the Dense (+ Normalize) modules, alone or appended to a copy of ``append_to``; see :func:`export`.

    The directory is built under a hidden temporary name beside ``path`` and renamed into place when
    complete; an existing one is replaced only with ``overwrite``.
    """
    import torch

    Dense, Normalize = _st_modules()
    if append_to is not None:
        width = st_output_dimension(append_to)
        if width != affine.n_features:
            raise BadInputError(
                f"{append_to}: the sentence-transformers model gives {width}-d vectors, but the "
                f"whitening was fitted on {affine.n_features}-d vectors"
            )
    remove_stale_temps(path)
    temp = temp_path(path)
    try:
        if append_to is not None:
            shutil.copytree(append_to, temp, symlinks=False)
            with open(os.path.join(temp, "modules.json"), encoding="utf8") as handle:
                modules = json.load(handle)
        else:
            os.makedirs(temp)
            modules = []
        dense = Dense(
            affine.n_features,
            affine.n_components,
            bias=True,
            activation_function=torch.nn.Identity(),
            init_weight=torch.from_numpy(np.ascontiguousarray(affine.A.T, dtype=np.float32)),
            init_bias=torch.from_numpy(np.ascontiguousarray(affine.b, dtype=np.float32)),
        )
        added = [dense] + ([Normalize()] if affine.normalize else [])
        paths = []
        for module in added:
            entry = _module_entry(temp, modules, module)
            os.makedirs(os.path.join(temp, entry["path"]))
            module.save(os.path.join(temp, entry["path"]))
            modules.append(entry)
            paths.append(entry["path"])
        metadata = dict(
            affine.params(),
            format=MAP_FORMAT,
            format_version=MAP_VERSION,
            package_version=affine.metadata()["package_version"],
            appended_to=append_to,
            layout="Dense: y = x @ linear.weight.T + linear.bias",
        )
        with open(os.path.join(temp, paths[0], "streamwhiten.json"), "w", encoding="utf8") as handle:
            json.dump(metadata, handle, indent=2, sort_keys=True)
        with open(os.path.join(temp, "modules.json"), "w", encoding="utf8") as handle:
            json.dump(modules, handle, indent=2)
        _fsync_tree(temp)
        _rename_dir_into_place(temp, path, overwrite)
    except OSError as exc:
        shutil.rmtree(temp, ignore_errors=True)
        raise StoreIOError(
            f"{path}: cannot write the sentence-transformers export: {_os_error(exc)}; nothing was written"
        ) from exc
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return {"modules": paths, "appended_to": append_to}


def _os_error(exc: OSError) -> str:
    """What went wrong, short: copytree's ``shutil.Error`` holds a list of (source, target, reason)."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        source, _, reason = exc.args[0][0]
        more = len(exc.args[0]) - 1
        return f"copying {source}: {reason}" + (f" (and {more} more)" if more else "")
    return str(exc.strerror or exc)


def _module_entry(root: str, modules: list, module) -> dict:
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
        if not overwrite:
            raise OutputExistsError.at(path)
        # a directory cannot replace anything atomically: move the old output aside first (a later run
        # puts it back if this one dies before the new one is in place)
        old = temp_path(final, "old")
        os.rename(final, old)
        os.rename(temp, final)
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.remove(old)
    else:
        os.rename(temp, final)
    fsync_dir(os.path.dirname(final))


__all__ = [
    "FORMATS",
    "export",
    "format_for",
    "check_options",
    "check_available",
    "npz_arrays",
    "write_npz",
    "safetensors_bytes",
    "write_safetensors",
    "torch_linear",
    "onnx_model",
    "write_onnx",
    "faiss_transform",
    "faiss_index",
    "write_faiss",
    "st_output_dimension",
    "write_sentence_transformers",
]
