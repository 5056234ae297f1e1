"""An apply: check the engine can write it, run it (an output that already holds what it would write is kept:
``NothingToDoError``)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..errors import BadInputError
from ..options import ApplyOptions, ReadOptions, Setting
from ..progress import Watch

if TYPE_CHECKING:
    from ..core.model import WhiteningModel
    from ..engine.apply import ApplyOutcome


def apply(
    model: Any,
    input_spec: Any,
    output_spec: str,
    *,
    setting: Setting | None = None,
    options: ApplyOptions | None = None,
    read: ReadOptions | None = None,
    engine: Any = None,
    given: tuple[str, ...] = (),
    rows: tuple[int, int] | None = None,
    watch: Watch = Watch(),
    attrs: dict | None = None,
) -> ApplyOutcome:
    """Write the whitened rows of ``input_spec`` to the new store ``output_spec``.

    Parameters
    ----------
    model : WhiteningModel or str
        The model, or its file.
    input_spec, output_spec : str
        The input store, and the output (``out.h5[:/dataset]``, ``out.zarr``, ``out.parquet[:column]``, ...).
    setting : Setting, optional
        Another setting than the model's saved one (re-finalized from its statistics, no pass over data).
    options, read, engine : ApplyOptions, ReadOptions, EngineOptions or Engine, optional
        What is written (``options.dtype`` None, the default: the model's storage); how the input is read;
        the engine that runs the blocks (default: serial).
    given : tuple of str
        Apply options set explicitly (the command line's): an engine refuses those it does not take.
    rows, attrs : (int, int), dict, optional
        Serial engine: write the input rows ``[start, stop)`` only (recorded in the output's ``rows``
        attribute); attributes the output records beside its own (how ``run`` marks a published part).
    watch : Watch, optional
        Its progress, and when to stop (at its next block, its progress saved for a resume; serial engine).

    Returns
    -------
    ApplyOutcome

    Raises
    ------
    NothingToDoError
        ``output_spec`` already holds what this would write (it is kept, ``overwrite`` or not).
    """
    from ..core.model import load_model
    from ..engine.apply import ApplyPart
    from ..engine.engines import engine_for
    from ..io import refuse_input_overlap

    options, read = options or ApplyOptions(dtype=None), read or ReadOptions()
    runner = engine_for(engine)
    runner.check_apply(options, given)
    refuse_input_overlap({output_spec: "output"}, [input_spec] + ([model] if isinstance(model, str) else []))
    if isinstance(model, (str, os.PathLike)):
        model = load_model(os.fspath(model))
    options = options.storing(model.storage)  # before re-finalizing: a bad combination is refused first
    model = _at_setting(model, (setting or Setting()).given(), options)
    return runner.apply(
        model, input_spec, output_spec, options, read, part=ApplyPart(rows, dict(attrs or {})), watch=watch
    )


def _at_setting(model: WhiteningModel, changes: dict, options: ApplyOptions) -> WhiteningModel:
    """``model`` re-finalized at ``changes``; refused where the code it writes is for its saved setting."""
    if not changes:
        return model
    held = model.storage if options.dtype is not None and options.dtype.names(model.storage) else None
    recorded = held.codec if held is not None else None
    model = model.with_params(**changes)
    if recorded is not None and model.storage is None:
        raise BadInputError(
            f"the model's {recorded.label} code is for its saved setting, not {changes}: apply at the saved "
            "setting, or record a code for this one first (with_codes), or give a float dtype",
            param="dtype",
        )
    return model
