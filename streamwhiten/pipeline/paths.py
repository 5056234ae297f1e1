"""The paths a fit writes, checked before it starts: the model file, its checkpoint, their folder."""

from __future__ import annotations

import os
from typing import Any

from ..errors import BadInputError


def check_writable_dir(path: str, what: str) -> None:
    """Fail before any work when the directory that will receive ``path`` does not exist."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise BadInputError(f"{path}: the directory {parent} for the {what} does not exist")


def default_checkpoint(model_path: str) -> str:
    """``.MODEL.checkpoint`` beside the model file."""
    head, tail = os.path.split(os.path.abspath(model_path))
    return os.path.join(head, f".{tail}.checkpoint")


def check_fit_paths(inputs: Any, model_path: str, checkpoint: str | None = None, update: str | None = None) -> str:
    """Refuse a model file or checkpoint over an input or each other; returns the checkpoint path."""
    from ..io import refuse_input_overlap, refuse_shared_outputs, remote

    for path, what in ((model_path, "model file"), (checkpoint, "checkpoint"), (update, "model to update")):
        if path is not None and remote.is_remote(os.fspath(path)):
            raise BadInputError(
                f"{remote.redact(path)}: the {what} is a local file (inputs and apply outputs may be "
                "URLs); give a local path"
            )
    checkpoint = checkpoint or default_checkpoint(model_path)
    refuse_input_overlap({model_path: "model file", checkpoint: "checkpoint"}, inputs)
    refuse_shared_outputs((model_path, "model file"), (checkpoint, "checkpoint"))
    refuse_input_overlap({checkpoint: "checkpoint"}, [update])
    return checkpoint
