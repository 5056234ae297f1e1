"""``streamwhiten staleness``: how far the published map is from a refit on a model's statistics."""

from __future__ import annotations

import os

import click

from ._common import emit
from ._options import json_option, param_options


@click.command()
@click.argument("model_path")
@click.option(
    "--published",
    "published_path",
    default=None,
    help="The published model file to measure (default: the version the manifest beside MODEL_PATH names).",
)
@param_options(
    "max_staleness",
    helps={
        "max_staleness": "Tolerance of the total: above it, the published map is stale (a job's [publish] "
        "max_staleness decides what run does); inf: never stale."
    },
)
@json_option
def staleness(model_path: str, published_path: str, max_staleness: float, as_json: bool):
    """Measure the published map's staleness against MODEL_PATH's statistics, from the statistics alone.

    Prints each part (covariance, shift, dropped, angle; see docs/nightly.md), the total = max(covariance,
    shift, dropped), the tolerance and the verdict. The published map is the version in MODEL.manifest.json
    beside MODEL_PATH (a job with [publish]), or --published FILE. Exit 0 either way.

    \b
    Example:
      streamwhiten staleness models/nightly.npz --json
    """
    from ..core.model import load_model
    from ..core.staleness import staleness as measure
    from ..errors import BadInputError
    from ..job.manifest import manifest_path, read_manifest
    from ..job.ownership import check_model_file

    version = None
    if published_path is None:
        manifest = read_manifest(model_path)
        if manifest is None:
            raise BadInputError(
                f"{model_path}: nothing is published beside it ({manifest_path(model_path)} is missing); give the "
                "published model file with --published FILE"
            )
        published = check_model_file(model_path, manifest)
        version = manifest.version
        published_path = os.path.join(os.path.dirname(os.path.abspath(model_path)), manifest.model_file)
    else:
        published = load_model(published_path)
    current = load_model(model_path)
    result = measure(published, current.state)
    stale = result.exceeds(max_staleness)
    report = dict(
        result.to_json(),
        model=model_path,
        published=published_path,
        published_version=version,
        max_staleness=float(max_staleness),
        stale=stale,
    )
    verdict = "stale: publish a new version" if stale else "within tolerance: keep the published map"
    lines = [
        f"published  {published_path}"
        + (f" (version {version})" if version is not None else "")
        + f", finalized from {result.n_rows_published:,} rows; statistics now {result.n_rows:,} rows",
        f"covariance {result.covariance:.4g}   (whitened variance off by this fraction along a kept direction)",
        f"shift      {result.shift:.4g}   (the centre moved, in output standard deviations)",
        f"dropped    {result.dropped:.4g}   (a dropped direction's variance above the weakest kept one)",
        f"angle      {result.angle:.4g} rad   (reported, not counted)",
        f"total      {result.total:.4g}   (max_staleness {max_staleness:g}): {verdict}",
    ]
    emit(as_json, report, lines)
