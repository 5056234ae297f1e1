"""``streamwhiten info``: what a model file holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ._common import emit
from ._options import json_option

if TYPE_CHECKING:
    from ..core.model import WhiteningModel
    from ..job.publication import Publication


@click.command()
@click.argument("model_path")
@json_option
def info(model_path: str, as_json: bool):
    """Print a model's parameters, spectrum summary and effective dimension, and (a job with [publish])
    the published version: its model file, the rows it was finalized from, when.

    \b
    Example:
      streamwhiten info model.npz --json
    """
    from ..core.model import file_checksum, load_model
    from ..job.manifest import read_manifest
    from ..job.publication import Publication

    model = load_model(model_path)
    if model.storage is not None and model.storage.codec is not None:
        from ..codes import record_codec

        record_codec(model.storage.codec, model.n_components)  # a forged codec is refused, not described
    summary = dict(model.to_json(), model=model_path, file_checksum=file_checksum(model))
    manifest = read_manifest(model_path)  # a job with [publish]: the version its outputs hold
    publication = None if manifest is None else Publication(model_path, manifest)
    summary["publication"] = None if publication is None else publication.to_json()
    lines = _lines(model, model_path, summary, published=publication is not None)
    if publication is not None:
        lines += _publication_lines(publication)
    emit(as_json, summary, lines)


def _publication_lines(publication: Publication) -> list[str]:
    """What a manifest beside the model says: the published version, what it was finalized from, when."""
    import os

    manifest = publication.manifest
    parts = sum(len(item.parts) for item in manifest.inputs)
    appended = f", last appended to {manifest.updated_at}" if manifest.updated_at else ""
    lines = [
        f"published  version {manifest.version} ({os.path.basename(publication.model_file)}), finalized from "
        f"{manifest.n_rows:,} rows at {manifest.published_at}{appended}",
        f"outputs    {len(manifest.inputs)} input(s), {parts} part(s), "
        f"{sum(item.stop for item in manifest.inputs):,} rows; manifest {publication.path}",
        f"checksum   {publication.model_checksum} (published map, version {manifest.version}: the model_checksum "
        "its outputs carry; give queries this map)",
    ]
    if manifest.kept:
        lines.append("kept       version(s) " + ", ".join(str(item.version) for item in manifest.kept))
    return lines


def _lines(model: WhiteningModel, model_path: str, summary: dict, published: bool = False) -> list[str]:
    eigvals = model.eigvals
    top = ", ".join(f"{v:.4g}" for v in eigvals[:5])
    ladder = summary["components_for_variance"]
    skipped = model.info.get("n_skipped_nonfinite")
    lines = [
        f"model      {model_path} (streamwhiten model, d={model.n_features})",
        f"fitted on  {model.n_rows:,} rows" + (f" ({skipped:,} non-finite skipped)" if skipped else ""),
        (
            f"transform  none: the identity map (y = x, the raw vectors; k={model.n_components}, as tune chose it)"
            if model.basis == "identity"
            else f"transform  beta={model.beta:g} gamma={model.gamma:g} k={model.n_components} eps={model.eps:g} "
            f"(absolute {model.eps_value:.3g})" + (f" variance>={model.variance:g}" if model.variance else "")
        ),
        f"spectrum   largest {top}; smallest {eigvals[-1]:.4g}; condition number {summary['condition_number']:.4g}",
        f"explained  {summary['explained_variance']:.4f} of the variance by the k kept components",
        "k for      " + ", ".join(f"{float(v):.0%}: {k}" for v, k in ladder.items()),
        f"D_eff      {summary['effective_dimension']:.1f} (exp of the entropy of the normalised eigenvalues)",
        f"checksum   {summary['model_checksum']} "
        + (
            "(statistics: the map a refit on them would give now, not the published one below)"
            if published
            else "(model_checksum: the map at this setting, as apply and export record it)"
        ),
    ]
    storage = summary.get("storage")
    if storage is not None and storage.get("codec") is not None:
        codec = storage["codec"]
        trained = (
            f"a sample of {codec['sample_rows']:,} input rows (seed {codec['sample_seed']})"
            if codec["sample_rows"]
            else "the statistics"
        )
        what = f"code {codec['label']}, trained from {trained}"
        if storage["rescore"]:
            what += f", the top {storage['rescore']} re-ranked with {storage['rescore_dtype']} vectors"
        lines.append(
            f"storage    {what} ({storage['bytes_per_vector']:,} bytes per vector, per-vector scalars included; "
            f"{codec['model_bytes']:,} bytes per model: rotations, codebooks)"
        )
    elif storage is not None:
        what = storage["dtype"]
        if storage["rescore"]:
            what += f", the top {storage['rescore']} re-ranked with {storage['rescore_dtype']} vectors"
        if "int8" in (storage["dtype"], storage["rescore_dtype"] if storage["rescore"] else None):
            what += f"; int8 ranges: mean +- {storage['int8_clip']:g} std, from the statistics"
        lines.append(f"storage    {what} ({storage['bytes_per_vector']:,} bytes per vector; as tune chose it)")
    for source in model.sources:
        lines.append(f"source     {source.where} ({source.n_rows:,} x {source.n_features} {source.dtype})")
    return lines
