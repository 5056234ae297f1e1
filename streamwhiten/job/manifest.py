"""The files of a job's published versions: ``M.vN.npz`` (version N's model) and ``M.manifest.json`` (a
`Manifest`), replaced whole by one atomic rename, refused when damaged; its local paths are relative to it,
so a job's folder can be moved, copied or mounted elsewhere.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

from .. import _durable as durable
from ..errors import ModelFileError
from ..records import Manifest, Version

#: The name of a job's manifest, beside its model file: ``M.manifest.json`` for ``M.npz``.
MANIFEST_SUFFIX = ".manifest.json"


def _root(model_path: str) -> str:
    """``M`` of the model file ``M.npz``."""
    path = os.fspath(model_path)
    return path[: -len(".npz")] if path.lower().endswith(".npz") else path


def manifest_path(model_path: str) -> str:
    """``M.manifest.json`` beside the model file ``M.npz``."""
    return _root(model_path) + MANIFEST_SUFFIX


def version_model_path(model_path: str, version: int) -> str:
    """``M.vN.npz``: the published model file of version ``version`` beside ``M.npz``."""
    return f"{_root(model_path)}.v{int(version)}.npz"


def versioned_output(output_spec: str, version: int, part: int = 0) -> str:
    """Part ``part`` of version ``version`` of ``output_spec``: ``out/day-1.v3.zarr``, ``out/day-1.v3.part1.zarr``."""
    from ..io import split_spec

    path, inner = split_spec(output_spec)
    bare = path.rstrip("/")
    head, tail = os.path.split(bare) if "://" not in bare else bare.rsplit("/", 1)
    stem, extension = os.path.splitext(tail)
    name = f"{stem}.v{int(version)}{f'.part{int(part)}' if part else ''}{extension}"
    named = f"{head}/{name}" if head else name
    if inner is None:
        return named
    return f"{named}:{output_spec.rpartition(':')[2]}"


def read_manifest(model_path: str) -> Manifest | None:
    """The manifest beside ``model_path``, checked whole (a `ModelFileError` when damaged), or None."""
    from .._paths import read_file

    path = manifest_path(model_path)
    if not os.path.lexists(path):
        return None
    raw = read_file(path, "manifest")
    try:
        manifest = Manifest.from_dict(json.loads(raw.decode("utf-8")))
        expected = os.path.basename(version_model_path(model_path, manifest.version))
        if manifest.model_file != expected:
            raise ValueError(
                f"it names {manifest.model_file!r} as the model file of version {manifest.version}, not {expected!r}"
            )
        for item in (*manifest.kept, *manifest.retired):
            if item.model_file != os.path.basename(version_model_path(model_path, item.version)):
                raise ValueError(f"it names {item.model_file!r} as the model file of version {item.version}")
        return manifest if manifest.legacy else _paths(manifest, _base(path), absolute=True)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        detail = f"not JSON: {exc}"
    except ValueError as exc:
        detail = str(exc)
    raise ModelFileError(
        f"{path}: not a manifest streamwhiten could have written ({detail}); nothing was changed. Restore it, "
        "or move it away: the next run then publishes version 1 from the current statistics"
    )


def write_manifest(model_path: str, manifest: Manifest) -> str:
    """Replace the manifest beside ``model_path`` by ``manifest`` in one atomic rename; returns its path."""
    path = manifest_path(model_path)
    stored = manifest if manifest.legacy else _paths(manifest, _base(path), absolute=False)
    data = (json.dumps(stored.to_dict(), indent=2, sort_keys=True) + "\n").encode()
    durable.write_file_atomic(path, lambda handle: handle.write(data), "manifest")
    return path


def _base(path: str) -> str:
    """The folder of the manifest ``path``: what the paths it holds are relative to."""
    return os.path.dirname(os.path.abspath(path))


def _moved(spec: str, base: str, absolute: bool, real: bool = False) -> str:
    """The local ``spec`` made absolute from, or relative to, ``base`` (``real``: real paths); a URL as it is."""
    from ..io import remote, split_spec

    path = split_spec(spec)[0]
    if remote.is_url(path):
        return spec
    rest = spec[len(path) :] if spec.startswith(path) else ""
    if absolute:
        joined = os.path.join(base, path)
        moved = os.path.realpath(joined) if real else os.path.normpath(joined)
    else:
        moved = os.path.relpath(path, os.path.realpath(base) if real else base)
    return moved + rest


def _paths(manifest: Manifest, base: str, absolute: bool) -> Manifest:
    """``manifest`` with every local path absolute, or relative to its folder ``base`` (as the file holds them)."""

    def move(spec: str) -> str:
        return _moved(spec, base, absolute)

    def version(item: Version) -> Version:
        return replace(item, outputs=tuple(move(output) for output in item.outputs))

    inputs = []
    for item in manifest.inputs:
        source = item.source
        if source.path is not None:
            source = replace(source, path=_moved(source.path, base, absolute, real=True))
        parts = tuple(replace(part, path=move(part.path)) for part in item.parts)
        inputs.append(replace(item, spec=move(item.spec), output=move(item.output), source=source, parts=parts))
    setting = dict(manifest.setting)
    if isinstance(setting.get("output"), str):  # the output template, a path too
        setting["output"] = move(setting["output"])
    return replace(
        manifest,
        setting=setting,
        inputs=tuple(inputs),
        kept=tuple(version(item) for item in manifest.kept),
        retired=tuple(version(item) for item in manifest.retired),
    )
