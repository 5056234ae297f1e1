"""Old module paths, still importable with a ``DeprecationWarning`` naming the new one.

Modules moved in 0.3 (``streamwhiten.stats`` is ``streamwhiten.core.stats``, ...). An import of an old
path gives the module at its new one (the same object), and warns once. Three old paths cannot be kept:
``streamwhiten.fit``, ``streamwhiten.apply`` and ``streamwhiten.evaluate`` are now the public
functions of those names; importing them as modules says where the module went.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

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
#: Old module paths whose names are now functions: where the module went.
NOW_FUNCTIONS = {
    "streamwhiten.fit": "streamwhiten.engine.fit",
    "streamwhiten.apply": "streamwhiten.engine.apply",
    "streamwhiten.evaluate": "streamwhiten.evaluation.evaluate",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of moved modules, and loads each as the module at its new path."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in NOW_FUNCTIONS:
            raise ModuleNotFoundError(
                f"{fullname} is a function since streamwhiten 0.3; the module it was is {NOW_FUNCTIONS[fullname]}",
                name=fullname,
            )
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {MOVED[spec.name]}", DeprecationWarning, stacklevel=3)
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        pass  # the module at its new path is already loaded


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
