"""Old module paths of 0.2.0, still reachable as attributes with a ``DeprecationWarning`` naming the new one.

Modules moved in 0.3 (``streamwhiten.stats`` is ``streamwhiten.core.stats``, ...). The packages' module
``__getattr__`` asks `moved` for a name they lack, so ``streamwhiten.stats`` and ``from streamwhiten
import stats`` give the module at its new path (the same object) and warn once. Nothing is installed on
``sys.meta_path``: a dotted import of an old path (``import streamwhiten.stats``, ``from
streamwhiten.model import load_model``) is not found; import the new path. These names go in 0.4.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType

#: Old module path -> new module path.
MOVED = {
    "streamwhiten.stats": "streamwhiten.core.stats",
    "streamwhiten.model": "streamwhiten.core.model",
    "streamwhiten._kernels": "streamwhiten.core._kernels",
    "streamwhiten.distributed": "streamwhiten.engine.distributed",
    "streamwhiten._threads": "streamwhiten.engine._threads",
    "streamwhiten.tune": "streamwhiten.evaluation.tune",
    "streamwhiten.report": "streamwhiten.evaluation.report",
    "streamwhiten.jobs": "streamwhiten.job",
    "streamwhiten._interrupt": "streamwhiten.cli._interrupt",
    "streamwhiten.demo": "streamwhiten.cli.demo",
    "streamwhiten.io.durable": "streamwhiten._durable",
}


def moved(package: str, name: str) -> ModuleType:
    """The module that ``package.name`` was, with a ``DeprecationWarning``; AttributeError where it was none."""
    old = f"{package}.{name}"
    if old not in MOVED:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    warnings.warn(f"{old} moved to {MOVED[old]}", DeprecationWarning, stacklevel=3)
    module = importlib.import_module(MOVED[old])
    setattr(sys.modules[package], name, module)  # found at once from now on: it warns once
    return module
