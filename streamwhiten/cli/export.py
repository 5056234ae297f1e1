"""``streamwhiten export``: write a model's map where queries are embedded."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..errors import BadInputError
from ..options import Setting
from ._common import emit, stop_on_signals
from ._options import json_option, objects, param_options, setting_options

if TYPE_CHECKING:
    from ..codes import Codec
    from ..core.model import WhiteningModel
    from ..serving import AffineMap

#: The formats of ``export`` (streamwhiten.export.FORMATS, not imported here to keep the CLI's start light).
EXPORT_FORMATS = ("npz", "safetensors", "sentence-transformers", "faiss", "onnx")


@click.command(name="export")
@click.argument("model_path")
@click.option(
    "-o",
    "--output",
    "output_path",
    required=True,
    help="File to write (.npz, .safetensors, .onnx, .faiss), or a directory for sentence-transformers.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(EXPORT_FORMATS),
    default=None,
    help="Output format (default: from the extension of -o, else sentence-transformers with --append-to).",
)
@setting_options("export")
@param_options(
    "normalize",
    "dtype",
    defaults={"dtype": None},
    helps={
        "normalize": "Follow the map by L2 normalisation (as apply --normalize).",
        "dtype": "How the outputs are stored, recorded in the export (int8: its ranges; faiss: an 8-bit scalar "
        "quantizer with them, or a binary index) [default: the model's storage, else float32].",
    },
)
@click.option(
    "--append-to",
    default=None,
    metavar="ST_MODEL_DIR",
    help="sentence-transformers: write a copy of this local model with the whitening modules appended.",
)
@click.option(
    "--index",
    "index_factory",
    default=None,
    metavar="FACTORY",
    help="faiss: write an empty IndexPreTransform around this index_factory index (e.g. Flat, HNSW32).",
)
@click.option(
    "--metric",
    type=click.Choice(["ip", "l2"]),
    default=None,
    help="faiss --index: its metric [default: ip with --normalize, else l2].",
)
@click.option(
    "--insert",
    type=click.Choice(["auto", "before-normalize", "end"]),
    default="auto",
    show_default=True,
    help="--append-to a model ending in Normalize: put the whitening instead of it (before-normalize: it "
    "takes the vectors before Normalize) or after it (end); auto tells from the norm of the rows the model "
    "was fitted on, and refuses when it cannot.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace an existing export of this format written by streamwhiten that is not up to date (one that is "
    "up to date is kept, with this flag too: exit 3, nothing to do; delete it to write it again).",
)
@json_option
@objects(setting=Setting)
def export_(
    model_path: str,
    output_path: str,
    fmt: str | None,
    setting: Setting,
    normalize: bool,
    dtype: str | None,
    append_to: str | None,
    index_factory: str | None,
    metric: str | None,
    insert: str,
    overwrite: bool,
    as_json: bool,
) -> None:
    """Write MODEL_PATH's whitening, y = x A + b (+ L2 normalisation), where queries are embedded.

    Formats: npz (plain arrays A, b, mean; streamwhiten.serving or numpy alone), safetensors (an
    nn.Linear state dict), sentence-transformers (Dense + Normalize modules, or with --append-to a
    whitened copy of a local model), faiss (a LinearTransform, or with --index an empty index that
    whitens what it is given), onnx (MatMul + Add, dynamic batch). Queries whitened this way meet a
    corpus whitened by `apply` with the same model and settings. The storage the model records (what
    `tune` chose), or --dtype, goes with it: every format records it, and faiss writes int8 storage as
    an 8-bit scalar quantizer with the model's ranges, binary storage as an IndexBinaryFlat. See
    docs/serving.md.

    \b
    Example:
      streamwhiten export model.npz -o whiten.onnx -k 256 --normalize
    """
    from dataclasses import replace

    from ..core.model import load_model
    from ..export import check_available, check_options, export, format_for
    from ..io import refuse_input_overlap

    where = None if insert == "auto" else insert
    chosen = format_for(output_path, fmt, append_to)
    check_options(chosen, normalize, append_to, index_factory, metric, where, dtype)
    refuse_input_overlap({output_path: "export"}, [model_path, append_to])
    model = load_model(model_path)
    if dtype is None:  # the model's storage: the options must fit it too
        check_options(chosen, normalize, append_to, index_factory, metric, where, model.dtype)
    check_available(chosen)
    affine, codec = _map(model, model_path, normalize, dtype, setting)
    with stop_on_signals():  # a signal lets the export finish (it has no point to stop at before its rename)
        result = export(
            affine,
            output_path,
            chosen,
            overwrite=overwrite,
            append_to=append_to,
            index=index_factory,
            metric=metric,
            insert=where,
            codec=codec,
        )
    summary = replace(result, model=model_path).to_json()
    emit(as_json, summary, _lines(summary, affine, output_path))


def _map(
    model: WhiteningModel, model_path: str, normalize: bool, dtype: str | None, setting: Setting
) -> tuple[AffineMap, Codec | None]:
    """The map to export and the model's recorded code that goes with it (unless --dtype replaces it)."""
    from dataclasses import replace

    from ..serving import file_checksum

    codec = None
    if dtype is None and model.storage is not None and model.storage.codec is not None:
        if setting.given():
            raise BadInputError(
                f"the model's code ({model.storage.codec.label}) is for its saved setting: drop the model options, "
                "or give --dtype float32 to export the map alone"
            )
        from ..codes import record_codec

        # a code is of the unit-length outputs; its bytes decoded, every field checked, before anything is written
        codec, normalize = record_codec(model.storage.codec, model.n_components), True
    affine = model.as_affine(normalize=normalize, dtype=dtype, **setting.given())
    stored = file_checksum(model_path)
    if stored:  # the checksum in the file (the same unless another streamwhiten version wrote it)
        affine = replace(affine, file_checksum=stored)
    return affine, codec


def _lines(summary: dict, affine: AffineMap, output_path: str) -> list[str]:
    """What was written, the map, where it came from, its storage (``summary``: the ``--json`` object)."""
    fmt, model_path, append_to = summary["format"], summary["model"], summary.get("appended_to")
    what = {
        "faiss": f"faiss {summary.get('faiss')}",
        "sentence-transformers": "sentence-transformers modules " + ", ".join(summary.get("modules") or []),
    }.get(fmt, fmt)
    where = {"end": " appended to ", "before-normalize": " inserted before the Normalize of "}
    lines = [
        f"wrote {output_path} ({what}{where[summary['insert']] + append_to if append_to else ''})",
        f"map   y = x A + b{' then L2 normalisation' if affine.normalize else ''}: {affine.n_features} -> "
        f"{affine.n_components} dimensions, beta={affine.beta:g} gamma={affine.gamma:g} eps={affine.eps:g}",
        f"from  {model_path} (model_checksum {affine.checksum[:16]}, the map's, as apply records it)",
    ]
    if affine.quantization is not None:
        q = affine.quantization
        lines.append(
            f"store {q.kind}, {q.bytes_per_vector} bytes per vector"
            + (", ranges from the statistics (recorded in the export)" if q.kind == "int8" else "")
            + (
                "; the index holds no map: add and search the bits serving.load(...).encode(x) gives"
                if fmt == "faiss" and q.kind == "binary"
                else ""
            )
        )
    if summary.get("code"):
        lines.append(
            f"store {summary['code']}, {summary['bytes_per_vector']} bytes per vector (per-vector scalars included), "
            f"{summary['model_bytes']:,} bytes per model; add the rows the codec encoded with "
            "index.index.add_sa_codes, search raw query vectors"
        )
    if summary.get("needs_training"):
        lines.append(
            f"note  the {summary['index']} index needs training before add: index.train(vectors) whitens them first"
        )
    return lines
