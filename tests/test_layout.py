"""The package's import rules (docs/architecture.md): folders show the data flow, arrows point down.

Every module under ``streamwhiten/`` is parsed with ``ast`` (nothing is imported), its imports are
resolved to absolute names, those inside functions included, and checked against the layers:

    foundation (errors, params, options, records, progress, output_plan, storage, _buffers, _durable, _npz, _paths)  <  core  <  codes, io
    <  engine  <  evaluation, pipeline  <  job  <  serving, export, synthetic, whitener  <  cli

(``io`` takes only the LZF decoder from ``core``: it is a Numba kernel, and numba stays in one package,
``core.kernels``.)

A module may import its own layer and the ones listed for it in ``MAY_IMPORT``; nothing imports
``cli`` (but the ``__main__`` entry point); numba, the storage libraries and the optional extras each
have the one place that imports them. A new module has to be given a layer here.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "streamwhiten"

FOUNDATION = {
    "errors",
    "params",
    "options",
    "records",
    "output_plan",
    "_buffers",
    "_durable",
    "_npz",
    "_paths",
    "progress",
    "storage",
}

#: The layers (packages, or single top-level modules) each layer may import besides itself, or single
#: modules or packages of a layer (``core.kernels.lzf``). The root package (``streamwhiten``, for ``__version__``) is
#: importable from everywhere: it imports nothing at load.
MAY_IMPORT = {
    "foundation": set(),
    "core": {"foundation"},
    # vector codes: trained from the statistics, searched by core's Numba kernels (codes.fast only)
    "codes": {"foundation", "core"},
    "io": {"foundation", "core.kernels.lzf"},  # the LZF decoder is a Numba kernel
    "engine": {"foundation", "core", "io", "codes"},
    "evaluation": {"foundation", "core", "io", "engine", "codes"},
    "serving": {"foundation", "core", "codes"},
    "export": {"foundation", "core", "codes"},
    "synthetic": {"foundation", "io"},
    # the fit and apply pipeline (what the CLI, run and the estimator call), jobs above it
    "pipeline": {"foundation", "core", "io", "engine", "codes"},
    "job": {"foundation", "core", "io", "engine", "pipeline", "codes"},
    "whitener": {"foundation", "core", "io", "engine", "pipeline", "codes"},
    "cli": {
        "foundation",
        "core",
        "codes",
        "io",
        "engine",
        "evaluation",
        "serving",
        "export",
        "synthetic",
        "pipeline",
        "job",
    },
    "__main__": {"cli"},
    "root": {"whitener", "foundation"},  # lazily, on first use of Whitener / release_buffers
}

#: The io backends: one module per storage format, none importing another (``_arrow`` is what the
#: Parquet and Lance backends share, ``codecs``/``direct`` what the HDF5 and Zarr ones share).
BACKENDS = {"hdf5", "zarr", "npy", "parquet", "lance"}
STORAGE = {"h5py", "zarr", "numcodecs", "google_crc32c", "hdf5plugin", "pyarrow", "lance", "fsspec", "s3fs"}
#: Third-party modules and the only layers (or modules) that may import them.
ONLY_IN = {
    "numba": {"core.kernels"},
    **{name: {"io"} for name in STORAGE},
    "click": {"cli"},
    "tqdm": {"cli"},
    "sklearn": {"whitener"},
    "threadpoolctl": {"engine"},
    "dask": {"engine.distributed"},
    "distributed": {"engine.distributed"},
    "matplotlib": {"evaluation.report"},
    # the affine map transforms torch tensors on their own device; export writes torch, ONNX, ... files
    "torch": {"core.affine", "export"},
    "onnx": {"export"},
    "onnxruntime": {"export"},
    "faiss": {"export", "codes.faiss_codes"},
    "safetensors": {"export"},
    "sentence_transformers": {"export"},
}
#: Optional extras: imported inside the function that needs them, never when a module loads, so a
#: missing one costs nothing until used (the io backends that need them are themselves loaded lazily).
OPTIONAL = {"dask", "distributed", "matplotlib", "torch", "onnx", "onnxruntime", "faiss", "safetensors"}
OPTIONAL |= {"sentence_transformers", "fsspec", "s3fs", "hdf5plugin"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> str:
    """``streamwhiten.engine.fit`` -> ``engine``; ``streamwhiten._npz`` -> ``foundation``."""
    parts = module.split(".")[1:]
    if not parts:
        return "root"
    return "foundation" if parts[0] in FOUNDATION else parts[0]


def in_place(module: str, places: set) -> bool:
    """Whether ``module`` is one of ``places``: layers (``io``), modules (``engine.distributed``), packages
    (``core.kernels``, with the modules under it) or full names."""
    short = module.removeprefix("streamwhiten.")
    return layer(module) in places or any(name in places for name in (short, module, short.rpartition(".")[0]))


def imports(module: str, source: str | None = None) -> list[tuple[str, int, bool]]:
    """``(imported module, line, inside a function)`` for every import of ``module`` (or of ``source``
    as if it were that module's text): streamwhiten modules by their full name (``from . import x`` of
    a submodule names the submodule), others by their top-level name."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []

    class Visitor(ast.NodeVisitor):
        depth = 0

        def visit_FunctionDef(self, node):
            self.depth += 1
            self.generic_visit(node)
            self.depth -= 1

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_Import(self, node):
            for alias in node.names:
                name = alias.name if alias.name.startswith("streamwhiten") else alias.name.split(".")[0]
                found.append((name, node.lineno, self.depth > 0))

        def visit_ImportFrom(self, node):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            if not source.startswith("streamwhiten"):
                found.append((source.split(".")[0], node.lineno, self.depth > 0))
                return
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.append((sub if sub in MODULES else source, node.lineno, self.depth > 0))

    Visitor().visit(ast.parse(path.read_text() if source is None else source, str(path)))
    return found


ALL_IMPORTS = {module: imports(module) for module in MODULES}


def own(module: str) -> list[tuple[str, int, bool]]:
    return [entry for entry in ALL_IMPORTS[module] if entry[0].startswith("streamwhiten")]


def foreign(module: str) -> list[tuple[str, int, bool]]:
    return [entry for entry in ALL_IMPORTS[module] if not entry[0].startswith("streamwhiten")]


def where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def test_every_module_has_a_layer():
    unknown = sorted({layer(module) for module in MODULES} - set(MAY_IMPORT))
    assert not unknown, f"give these a layer in MAY_IMPORT (and the table of docs/architecture.md): {unknown}"


def test_every_import_of_the_package_resolves():
    """An import of a module that moved (after a merge, say) names a module that no longer exists."""
    wrong = [
        f"{where(module, line)}: imports {target}, which is no module of the package"
        for module in MODULES
        for target, line, _ in own(module)
        if target != "streamwhiten" and target not in MODULES
    ]
    assert not wrong, "\n".join(wrong)


def test_arrows_point_down():
    wrong = []
    for module in MODULES:
        allowed = MAY_IMPORT[layer(module)] | {layer(module)}
        for target, line, _ in own(module):
            if target != "streamwhiten" and not in_place(target, allowed):
                wrong.append(f"{where(module, line)}: {layer(module)} imports {target} ({layer(target)})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_nothing_imports_the_cli():
    wrong = [
        f"{where(module, line)}: imports {target}"
        for module in MODULES
        if layer(module) not in ("cli", "__main__")
        for target, line, _ in own(module)
        if layer(target) == "cli"
    ]
    assert not wrong, "\n".join(wrong)


def test_core_is_numpy_and_numba_only():
    """core: numpy, numba (``kernels`` only), the standard library but threads and processes (those are
    the engine's), and the foundation below it (checked by the arrows). torch only as ONLY_IN allows."""
    allowed = {"__future__", "numpy", "numba", "torch"}
    engine_only = {"threading", "concurrent", "multiprocessing", "subprocess"}
    wrong = [
        f"{where(module, line)}: imports {target}"
        for module in MODULES
        if layer(module) == "core"
        for target, line, _ in foreign(module)
        if target in engine_only or (target not in sys.stdlib_module_names and target not in allowed)
    ]
    assert not wrong, "\n".join(wrong)


def test_third_party_libraries_have_one_place():
    wrong = [
        f"{where(module, line)}: imports {target}, which belongs to {sorted(ONLY_IN[target])} only"
        for module in MODULES
        for target, line, _ in foreign(module)
        if target in ONLY_IN and not in_place(module, ONLY_IN[target])
    ]
    assert not wrong, "\n".join(wrong)


def test_optional_extras_are_imported_where_they_are_used():
    """An optional extra is imported inside the function that needs it, or under ``if TYPE_CHECKING:``
    (read by type checkers only), never when the module loads."""
    wrong = [
        f"{where(module, line)}: imports {target} when the module loads"
        for module in MODULES
        if layer(module) != "io"  # pyarrow/lance backends load only when a store of theirs is opened
        for target, line, lazy in runtime_imports(module)
        if target in OPTIONAL and not lazy
    ]
    assert not wrong, "\n".join(wrong)


def test_io_backends_never_import_each_other():
    wrong = [
        f"{where(module, line)}: the {module.rsplit('.', 1)[1]} backend imports {target}"
        for module in MODULES
        if layer(module) == "io" and module.rsplit(".", 1)[1] in BACKENDS
        for target, line, _ in own(module)
        if target.startswith("streamwhiten.io.") and target.rsplit(".", 1)[1] in BACKENDS
    ]
    assert not wrong, "\n".join(wrong)


def test_the_storage_interface_is_only_an_interface():
    """``io/abc/`` holds the interface alone, as zarr 3's ``zarr.abc.store`` does: abstract classes (or
    protocols) with their capability attributes and properties, and small frozen dataclasses; no free
    function, no module constant, and no import of the rest of io (backends, ``remote``, ``codecs``,
    ``_store``) or of ``_durable`` when it loads (names used only in annotations, under
    ``if TYPE_CHECKING:``, load nothing). What the backends share beneath it lives in ``io._store``."""
    abc_modules = [module for module in MODULES if module.startswith("streamwhiten.io.abc")]
    assert abc_modules
    wrong = []
    for module in abc_modules:
        for target, line, _ in runtime_imports(module):
            if target == "streamwhiten._durable" or (
                target.startswith("streamwhiten.io") and not target.startswith("streamwhiten.io.abc")
            ):
                wrong.append(f"{where(module, line)}: the interface imports {target}")
        tree = ast.parse(PATCHED_SOURCE.get(module, MODULES[module].read_text()))
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_docstring(node) or _is_type_checking(node):
                continue
            if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
                continue
            if isinstance(node, ast.ClassDef) and (_is_abstract(node) or _is_frozen_dataclass(node)):
                continue
            what = f"class {node.name}" if isinstance(node, ast.ClassDef) else ast.unparse(node).split("\n")[0]
            wrong.append(f"{where(module, node.lineno)}: {what} is not an abstract class or a frozen record")
    assert not wrong, "\n".join(wrong)


#: What a test of the rules substitutes for a module's text (the interface rule reads definitions).
PATCHED_SOURCE: dict = {}


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _is_abstract(node: ast.ClassDef) -> bool:
    """An ``ABC`` or ``Protocol`` subclass (or one of another class of the interface)."""
    return any(
        ast.unparse(base).split(".")[-1].split("[")[0] in {"ABC", "Protocol", "Source", "Sink"} for base in node.bases
    )


def _is_frozen_dataclass(node: ast.ClassDef) -> bool:
    return any(
        isinstance(d, ast.Call)
        and ast.unparse(d.func).endswith("dataclass")
        and any(k.arg == "frozen" and ast.unparse(k.value) == "True" for k in d.keywords)
        for d in node.decorator_list
    )


def runtime_imports(module: str) -> list[tuple[str, int, bool]]:
    """:func:`imports` of ``module`` but those under ``if TYPE_CHECKING:`` (read by type checkers only)."""
    return PATCHED[module] if module in PATCHED else _runtime_imports_of_file(module)


@functools.cache
def _runtime_imports_of_file(module: str) -> list[tuple[str, int, bool]]:
    """:func:`runtime_imports` of the module's file as it is (parsed once a run: the rules' tests ask often)."""
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = [ast.Pass()]
    return imports(module, ast.unparse(tree))


#: What a test of the rules substitutes for a module's runtime imports.
PATCHED: dict = {}


def find_cycle(edges: dict) -> list | None:
    """The first import cycle in ``edges`` (module -> the modules it imports) as the path that closes it
    (``[a, b, a]``), or None: a depth-first walk that visits each module once."""
    done: set = set()

    def visit(module: str, path: list) -> list | None:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        for target in sorted(edges[module]):
            found = visit(target, path + [module])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(edges):
        cycle = visit(module, [])
        if cycle is not None:
            return cycle
    return None


def test_io_has_no_import_cycle():
    """io/ is layered within too (``abc.store`` < ``_messages`` < ``codecs`` < ``_store`` < ``fingerprint``, backends <
    ``reading``, ``output`` < the package's face): no module of io reaches itself through the imports of
    io, at load or inside a function. Decoding is apart from reading: ``codecs`` imports no store. (The
    backends themselves are loaded by name, by ``registry.Backend.load``, when a store of theirs is opened.)"""
    io_modules = [module for module in MODULES if layer(module) == "io"]
    edges = {
        module: {target for target, _, _ in runtime_imports(module) if target in io_modules and target != module}
        for module in io_modules
    }
    cycle = find_cycle(edges)
    assert cycle is None, "an import cycle in io: " + " -> ".join(cycle)


def test_the_package_has_no_import_cycle():
    """No module reaches itself through the package's imports, those under ``if TYPE_CHECKING:`` and inside
    functions included (a cycle there still ties the modules together for a reader), the root package
    aside (it names its public objects by string and imports nothing at load)."""
    modules = [module for module in MODULES if module != "streamwhiten"]
    edges = {
        module: {target for target, _, _ in own(module) if target in modules and target != module} for module in modules
    }
    cycle = find_cycle(edges)
    assert cycle is None, "an import cycle: " + " -> ".join(cycle)


def test_the_serving_path_needs_neither_numba_nor_storage_libraries():
    """Everything streamwhiten.serving can reach, its functions' imports included, is numba- and storage-free
    (the root package counts as a leaf: it imports nothing until Whitener is asked for)."""
    reached, todo = set(), ["streamwhiten.serving"]
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        todo += [target for target, _, _ in own(module) if target != "streamwhiten"]
    wrong = [
        f"{where(module, line)}: imports {target} (reached from streamwhiten.serving)"
        for module in sorted(reached)
        for target, line, _ in foreign(module)
        if target == "numba" or target in STORAGE
    ]
    assert not wrong, "\n".join(wrong)
    assert "streamwhiten.core.model" not in reached and "streamwhiten.io" not in reached


def test_package_inits_import_nothing_heavy():
    """``import streamwhiten`` and every package ``__init__`` stay light (numba, storage, click, sklearn:
    none of them), so the serving path and ``python -m streamwhiten``'s signal handlers come first."""
    code = (
        "import sys, streamwhiten, streamwhiten.core, streamwhiten.engine, streamwhiten.evaluation, "
        "streamwhiten.cli, streamwhiten.cli._interrupt\n"
        "heavy = ('numba', 'h5py', 'zarr', 'pyarrow', 'click', 'sklearn', 'tqdm', 'dask')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_import_streamwhiten_loads_nothing_else_and_installs_no_import_hook():
    """``import streamwhiten`` puts nothing on ``sys.meta_path`` and loads no other module; a name the package
    does not have (the module paths of 0.2.0 were removed in 0.3, CHANGELOG) is a plain AttributeError."""
    code = (
        "import sys\n"
        "before = set(sys.modules), list(sys.meta_path)\n"
        "import streamwhiten\n"
        "print(sorted(set(sys.modules) - before[0]), sys.meta_path == before[1])\n"
        "import streamwhiten.io\n"
        "for name in ('streamwhiten.stats', 'streamwhiten.io.durable', 'streamwhiten.nothing'):\n"
        "    try:\n"
        "        eval(name)\n"
        "    except AttributeError as exc:\n"
        "        print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "['streamwhiten'] True",
        "module 'streamwhiten' has no attribute 'stats'",
        "module 'streamwhiten.io' has no attribute 'durable'",
        "module 'streamwhiten' has no attribute 'nothing'",
    ]


def test_every_package_is_shipped_and_checked():
    """A wheel holds only the packages pyproject lists: every folder of the layout must be there; mypy's
    paths must exist and hold every module, and its strict sections must name packages that exist (a
    moved module or package would drop out of them silently)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {module for module, path in MODULES.items() if path.name == "__init__.py"}
    assert set(config["tool"]["setuptools"]["packages"]) == packages
    mypy = config["tool"]["mypy"]
    checked = [ROOT / path for path in mypy["files"]]
    assert [path for path in checked if not path.exists()] == []
    unchecked = [module for module, path in MODULES.items() if not any(c == path or c in path.parents for c in checked)]
    assert unchecked == []
    strict = [
        name for section in mypy["overrides"] if section.get("disallow_untyped_defs") for name in section["module"]
    ]
    assert strict, "no package is checked strictly"
    assert [name for name in strict if name.removesuffix(".*") not in packages] == []


#: Test files at the top of tests/ that test no one package: the docs, this layout, the benchmark and example
#: scripts, the real-data check. Tests of a top-level module sit there too, named after it (``test_export.py``,
#: ``test_export_faults.py`` for ``export.py``); the tests of a package sit in ``tests/<package>/``.
CROSS_CUTTING_TESTS = {
    "test_benchmarks.py",  # benchmarks/*.py end to end, --quick
    "test_docs_examples.py",  # every python and shell block of README.md and docs/*.md, and the API docstrings
    "test_doctests.py",  # the Examples of the public docstrings, every layer
    "test_examples.py",  # examples/*.py
    "test_layout.py",  # this file
    "test_staleness_quality.py",  # benchmarks/staleness_quality.py
    "test_stsb.py",  # the real STS-B check through the public API
    "test_stsb_table.py",  # benchmarks/stsb_table.py
}


def misplaced_tests(tests: Path, paths) -> list:
    """The folders and test files under ``tests`` that do not follow the package: a folder that is no
    package of streamwhiten (``tests/io/`` for ``streamwhiten/io/``), or a top-level test file that is
    neither cross-cutting nor named after a top-level module (``test_<module>.py``, ``test_<module>_*.py``)."""
    modules = {path.stem.lstrip("_") for path in PACKAGE.glob("*.py") if not path.stem.startswith("__")}
    found = []
    for path in paths:
        relative = path.relative_to(tests)
        if path.is_dir():
            if not (PACKAGE / relative / "__init__.py").is_file():
                found.append(f"tests/{relative.as_posix()}/: streamwhiten/{relative.as_posix()}/ is no package")
        elif len(relative.parts) == 1 and relative.name not in CROSS_CUTTING_TESTS:
            if not any(path.stem == f"test_{m}" or path.stem.startswith(f"test_{m}_") for m in modules):
                found.append(f"tests/{relative}: move it to tests/<package>/ of what it tests")
    return found


def test_tests_follow_the_package():
    """Every folder under tests/ mirrors a package, and no test file is left at the top of tests/ but
    the cross-cutting ones and those of top-level modules (a new file there: move it to its package)."""
    tests = ROOT / "tests"
    folders = [path for path in tests.rglob("*") if path.is_dir() and "__pycache__" not in path.parts]
    assert misplaced_tests(tests, sorted(folders) + sorted(tests.rglob("test_*.py"))) == []


def test_the_test_placement_rule_catches_a_stale_folder_and_a_stray_file(tmp_path):
    for folder in ("io/abc", "flow", "plan"):
        (tmp_path / folder).mkdir(parents=True)
    paths = [tmp_path / name for name in ("io", "io/abc", "flow", "plan")]
    paths += [tmp_path / name for name in ("test_export_faults.py", "test_buffers.py", "test_odds_and_ends.py")]
    assert misplaced_tests(tmp_path, paths) == [
        "tests/flow/: streamwhiten/flow/ is no package",
        "tests/plan/: streamwhiten/plan/ is no package",
        "tests/test_odds_and_ends.py: move it to tests/<package>/ of what it tests",
    ]


@pytest.mark.parametrize(
    "module,statement,rule",
    [
        ("streamwhiten.serving", "import numba", "test_third_party_libraries_have_one_place"),
        (
            "streamwhiten.serving",
            "from .core import model",
            "test_the_serving_path_needs_neither_numba_nor_storage_libraries",
        ),
        ("streamwhiten.core.stats", "from ..io import open_source", "test_arrows_point_down"),
        ("streamwhiten.core.model", "from ..engine import fit", "test_arrows_point_down"),
        ("streamwhiten._npz", "from .io import open_source", "test_arrows_point_down"),
        ("streamwhiten.io.abc.store", "from ...core.stats import Moments", "test_arrows_point_down"),
        ("streamwhiten.engine.fit", "from ..cli import app", "test_nothing_imports_the_cli"),
        ("streamwhiten.whitener", "import streamwhiten.cli", "test_nothing_imports_the_cli"),
        ("streamwhiten.io.hdf5", "from . import zarr", "test_io_backends_never_import_each_other"),
        ("streamwhiten.io.parquet", "from .lance import LanceSource", "test_io_backends_never_import_each_other"),
        ("streamwhiten.engine.apply", "import h5py", "test_third_party_libraries_have_one_place"),
        ("streamwhiten.core.model", "import numba", "test_third_party_libraries_have_one_place"),
        ("streamwhiten.io.codecs", "from ..core.kernels import codes", "test_arrows_point_down"),
        ("streamwhiten.whitener", "import dask", "test_optional_extras_are_imported_where_they_are_used"),
        ("streamwhiten.core.affine", "import threading", "test_core_is_numpy_and_numba_only"),
        ("streamwhiten.core.stats", "import scipy", "test_core_is_numpy_and_numba_only"),
        (
            "streamwhiten.io.codecs",
            "from .._kernels import center_and_sum",
            "test_every_import_of_the_package_resolves",
        ),
        ("streamwhiten.io.codecs", "from ._store import StoreSource", "test_io_has_no_import_cycle"),
        ("streamwhiten.io.abc.store", "from .. import remote", "test_the_storage_interface_is_only_an_interface"),
        (
            "streamwhiten.io.abc.store",
            "from ..codecs import Fetched",
            "test_the_storage_interface_is_only_an_interface",
        ),
        ("streamwhiten.io.abc.store", "from ... import _durable", "test_the_storage_interface_is_only_an_interface"),
        (
            "streamwhiten.io.abc.store",
            "from ..hdf5 import HDF5Source",
            "test_the_storage_interface_is_only_an_interface",
        ),
        ("streamwhiten.io.abc.store", "BLOCK_BYTES = 64 << 20", "test_the_storage_interface_is_only_an_interface"),
        ("streamwhiten.io.abc.store", "from ..output import open_output", "test_io_has_no_import_cycle"),
        ("streamwhiten.io.spec", "from . import open_source", "test_io_has_no_import_cycle"),
        ("streamwhiten.records", "from .io import Source", "test_arrows_point_down"),
        (
            "streamwhiten.job.steps",
            "from ..engine.engines import SerialEngine",
            "test_jobs_fit_and_apply_through_the_pipeline",
        ),
        (
            "streamwhiten.job.run",
            "from ..engine.fit import finalize_fit",
            "test_jobs_fit_and_apply_through_the_pipeline",
        ),
    ],
)
@pytest.mark.parametrize("inside_a_function", [False, True])
def test_the_rules_catch_a_forbidden_import(monkeypatch, module, statement, rule, inside_a_function):
    """Each rule fails once such an import is added to the module, at the top or inside a function;
    only an optional extra is fine inside a function (that is where it belongs)."""
    added = f"\n\ndef _added():\n    {statement}\n" if inside_a_function else f"\n{statement}\n"
    monkeypatch.setitem(ALL_IMPORTS, module, imports(module, MODULES[module].read_text() + added))
    monkeypatch.setitem(PATCHED, module, imports(module, MODULES[module].read_text() + added))
    monkeypatch.setitem(PATCHED_SOURCE, module, MODULES[module].read_text() + added)
    if inside_a_function and rule == "test_optional_extras_are_imported_where_they_are_used":
        globals()[rule]()
        return
    with pytest.raises(AssertionError):
        globals()[rule]()


# ------------------------------------------------------------------------ public calls return typed results

#: What a public call may return besides a frozen dataclass with ``to_json()``: documented plain types.
PLAIN_RETURNS = {"ndarray", "str", "int", "float", "bool", "bytes", "NoneType", "Whitener"}
#: The functions of the modules in ``streamwhiten.__all__`` that users call (the rest of their names are
#: the pieces these are made of, shared with the tests).
MODULE_ENTRY_POINTS = {
    "export": ("export", "format_for"),
    "serving": ("load", "decode", "file_checksum"),
    "synthetic": ("generate_rows", "write_store"),
}
#: Methods of the public classes that may return a dict, and why; ``to_json`` and ``to_dict`` (the
#: result, or a record, as plain JSON values) always may.
DICT_RETURNS = {
    ("Setting", "given"): "the parameters given, as keyword arguments: model.with_params(**setting.given())",
    ("AffineMap", "params"): "the map's parameters as JSON values, what every export records in its metadata",
    ("AffineMap", "metadata"): "params() as str -> str, for formats whose metadata holds only strings",
    ("WhiteningModel", "storage_summary"): "the storage record of the model file, as to_json() holds it",
}
#: Methods whose return cannot be annotated more closely, and what they return.
ANY_RETURNS = {
    ("AffineMap", "transform"): "an array: numpy in, numpy out; a torch tensor in, a tensor out (torch is optional)",
}


def _public_calls():
    """``(name, function, owner class or None)`` of every public call: the functions of ``__all__``, the
    entry points of its modules, and the public methods (defined in the package) of its classes and of the
    classes those return."""
    import dataclasses
    import inspect
    import types

    import streamwhiten

    calls, classes = [], {}
    for name in streamwhiten.__all__:
        if name == "__version__":
            continue
        value = getattr(streamwhiten, name)
        if isinstance(value, types.ModuleType):
            for entry in MODULE_ENTRY_POINTS[name]:
                calls.append((f"{name}.{entry}", getattr(value, entry), None))
            for member in getattr(value, "__all__", ()):
                if inspect.isclass(getattr(value, member)):
                    classes[member] = getattr(value, member)
        elif inspect.isclass(value):
            classes[value.__name__] = value
        else:
            calls.append((name, value, None))
    for cls in classes.values():
        for attribute, member in vars(cls).items():
            function = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
            if attribute.startswith("_") or not inspect.isfunction(function):
                continue
            if not function.__module__.startswith("streamwhiten"):
                continue
            calls.append((f"{cls.__name__}.{attribute}", function, cls))
    assert dataclasses.is_dataclass(classes["WhiteningModel"]) and len(calls) > 30
    return calls


def _type_names():
    """Every class of the package by name, to resolve annotations imported only under TYPE_CHECKING."""
    import importlib
    import inspect
    import pkgutil
    import warnings

    import numpy as np

    import streamwhiten

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # a library the package imports may warn
        for found in pkgutil.walk_packages(streamwhiten.__path__, "streamwhiten."):
            if not found.name.endswith("__main__"):
                importlib.import_module(found.name)
    names = {"np": np}
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("streamwhiten") and module is not None:
            names.update({n: v for n, v in vars(module).items() if inspect.isclass(v) and n[:1] != "_"})
    return names


def _return_kinds(annotation) -> list:
    """The types a return annotation allows (the members of a union, an optional's None included)."""
    import types
    import typing

    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [kind for member in typing.get_args(annotation) for kind in _return_kinds(member)]
    return [annotation]


def test_public_calls_return_dataclasses_or_plain_types():
    """Every public call says what it returns, and it is a frozen dataclass with ``to_json()`` (a result),
    another public class, or a documented plain type (an array, a path, a count): never a dict or Any."""
    import dataclasses
    import typing

    import streamwhiten

    names = _type_names()
    public = {getattr(streamwhiten, name) for name in streamwhiten.__all__ if name != "__version__"}
    problems = []
    for name, function, owner in _public_calls():
        try:
            hints = typing.get_type_hints(function, localns=names)
        except Exception as exc:  # noqa: BLE001 - an annotation that does not resolve is a problem too
            problems.append(f"{name}: its annotations do not resolve ({exc})")
            continue
        if "return" not in hints:
            problems.append(f"{name}: no return annotation")
            continue
        key = (owner.__name__ if owner is not None else "", name.rsplit(".", 1)[-1])
        for kind in _return_kinds(hints["return"]):
            bare = typing.get_origin(kind) or kind
            if kind is typing.Any:
                if key not in ANY_RETURNS:
                    problems.append(f"{name}: returns Any")
            elif bare in (dict, typing.Mapping) or (isinstance(bare, type) and issubclass(bare, dict)):
                if key[1] not in ("to_json", "to_dict") and key not in DICT_RETURNS:
                    problems.append(f"{name}: returns a dict ({kind}); return a frozen dataclass with to_json()")
            elif bare is tuple:
                inner = [member for member in typing.get_args(kind) if member is not Ellipsis]
                bad = [member for member in inner if typing.get_origin(member) is dict or member is dict]
                if bad:
                    problems.append(f"{name}: returns a tuple holding a dict")
            elif dataclasses.is_dataclass(bare):
                params = getattr(bare, "__dataclass_params__", None)
                is_result = hasattr(bare, "to_json")
                if bare not in public and not is_result and bare.__name__ not in ("AffineMap", "Quantization", "Part"):
                    problems.append(f"{name}: returns {bare.__name__}, neither public nor a result with to_json()")
                if is_result and not (params is not None and params.frozen):
                    problems.append(f"{name}: returns {bare.__name__}, a result that is not frozen")
            elif getattr(bare, "__name__", str(bare)) not in PLAIN_RETURNS and bare not in public:
                problems.append(f"{name}: returns {kind}, not a dataclass nor a documented plain type")
    assert not problems, "\n".join(problems)


def test_every_result_of_the_public_api_is_exported_frozen_and_turns_into_json():
    """The results the public calls return are in ``__all__`` (the API reference documents them), frozen,
    and give plain JSON values."""
    import dataclasses
    import typing

    import streamwhiten

    names = _type_names()
    results = set()
    for _, function, _ in _public_calls():
        hints = typing.get_type_hints(function, localns=names)
        for kind in _return_kinds(hints.get("return")):
            if dataclasses.is_dataclass(kind) and hasattr(kind, "to_json"):
                results.add(kind)
    assert {"PairsResult", "RetrievalResult", "ExportResult", "FitOutcome", "ApplyOutcome", "Staleness"} <= {
        kind.__name__ for kind in results
    }
    exported = {getattr(streamwhiten, name) for name in streamwhiten.__all__ if name != "__version__"}
    missing = sorted(kind.__name__ for kind in results if kind not in exported)
    assert not missing, f"results returned by public calls but not in streamwhiten.__all__: {missing}"
    assert all(kind.__dataclass_params__.frozen for kind in results)


#: What runs a fit or an apply below ``pipeline``: a job calls ``pipeline`` for them, never these.
ENGINE_RUNNERS = {
    "streamwhiten.engine.engines": None,  # every name: the engines and their checkpoints
    "streamwhiten.engine.fit": {"run_plan", "fit_sources", "finalize_fit", "plan_fit", "plan_update"},
    "streamwhiten.engine.apply": {"apply_model", "is_up_to_date"},
}


def test_jobs_fit_and_apply_through_the_pipeline():
    """``job/`` runs every fit and apply through ``pipeline`` (as the command line and the estimator do):
    it imports no engine and none of the engine's fit or apply runners."""
    problems = []
    for module, path in MODULES.items():
        if layer(module) != "job":
            continue
        package = module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(PATCHED_SOURCE.get(module, path.read_text()))):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
            if source not in ENGINE_RUNNERS:
                continue
            names = {alias.name for alias in node.names}
            banned = names if ENGINE_RUNNERS[source] is None else names & ENGINE_RUNNERS[source]
            if banned:
                problems.append(f"{where(module, node.lineno)}: imports {sorted(banned)} from {source}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------- narrow calls

#: The most parameters a function takes (``self`` and ``cls`` not counted; ``*args`` and ``**kwargs``
#: counted): more travel together as one object (an option object, the ``OutputPlan``, a record).
MAX_PARAMETERS = 8
#: Where this does not hold: the command line (its flags are parameters) and the scikit-learn estimator
#: (its hyper-parameters are, by scikit-learn's rule).
WIDE_PLACES = ("streamwhiten.cli", "streamwhiten.whitener")
#: Wider functions elsewhere, each with why (none may be added without one; one that became narrow
#: must leave this list).
WIDE = {
    "pipeline.applying:apply": "a public call's keyword arguments (streamwhiten.apply): narrowing them breaks callers",
    "core.kernels.search:merge_top_hamming": "a Numba kernel: arrays and scalars only, no records",
    "codes:train_codec": "a public call: every family's keyword options (faiss's passed on as they are)",
    "export:export": "a public call's keyword arguments (streamwhiten.export.export)",
    "pipeline.coding:with_codes": "a public call's keyword arguments (streamwhiten.with_codes)",
}


def parameter_counts(source: str) -> dict[str, int]:
    """``{qualified name: parameters}`` of every function in ``source`` (``Class.method``)."""
    counts = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = child.args
                names = [arg.arg for arg in args.posonlyargs + args.args + args.kwonlyargs]
                if names and names[0] in ("self", "cls"):
                    names = names[1:]
                counts[f"{prefix}{child.name}"] = len(names) + (args.vararg is not None) + (args.kwarg is not None)
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(source), "")
    return counts


def wide_functions() -> dict[str, int]:
    found = {}
    for module, path in MODULES.items():
        if module.startswith(WIDE_PLACES):
            continue
        for name, count in parameter_counts(path.read_text()).items():
            if count > MAX_PARAMETERS:
                found[f"{module.removeprefix('streamwhiten.')}:{name}"] = count
    return found


def test_no_function_takes_more_than_eight_parameters():
    found = wide_functions()
    unexplained = [f"{name} takes {count} parameters" for name, count in sorted(found.items()) if name not in WIDE]
    assert not unexplained, f"more than {MAX_PARAMETERS} parameters (pass an object):\n" + "\n".join(unexplained)
    narrow = sorted(set(WIDE) - set(found))
    assert not narrow, f"no longer wider than {MAX_PARAMETERS} parameters: take them off WIDE: {narrow}"


def test_the_parameter_rule_counts_what_a_caller_passes():
    counts = parameter_counts(
        "class A:\n    def m(self, a, b, *c, d, **e): ...\n    @classmethod\n    def k(cls, a): ...\ndef f(a, /, b=1): ...\n"
    )
    assert counts == {"A.m": 5, "A.k": 1, "f": 2}


# ------------------------------------------------------------------------- the output's attributes

#: The module that alone writes the names of an output's attributes (readers use its constants).
OUTPUT_PLAN = "streamwhiten.output_plan"
#: The attribute names of an apply output (the plan's constants, and the options it records).
OUTPUT_ATTRS = {
    "streamwhiten_version",
    "complete",
    "model_checksum",
    "source_sha256",
    "rows",
    "kept_columns",
    "compressor",
    "zarr_format",
    "normalized",
    "skip_nonfinite",
    "fill_missing_chunks",
    "quantization",
    "n_nonfinite_rows",
}


def _holder(node) -> str:
    """The last name of what ``node`` is (``output.attrs()`` -> ``attrs``; ``array.attrs`` -> ``attrs``)."""
    while isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def attribute_names_written(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` of every output attribute named by a string in ``source``: a key of something
    called ``*attrs*`` (``attrs["x"]``, ``attrs.get("x")``, ``"x" in attrs``) or of a dict literal made
    into one (assigned to such a name, passed as ``attrs=``, to ``update``, ``commit`` or ``create``)."""
    found = []

    def named(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in OUTPUT_ATTRS:
            found.append((node.lineno, node.value))

    def literal(node):
        if isinstance(node, ast.Dict):
            for key in node.keys:
                if key is not None:
                    named(key)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and "attrs" in _holder(node.value):
            named(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method, holder = node.func.attr, _holder(node.func.value)
            if method in ("get", "pop", "setdefault") and "attrs" in holder and node.args:
                named(node.args[0])
            if method in ("update", "commit", "create") and ("attrs" in holder or method != "update"):
                for arg in node.args:
                    literal(arg)
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg is not None and "attrs" in keyword.arg:
                    literal(keyword.value)
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            if any("attrs" in _holder(right) for right in node.comparators):
                named(node.left)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any("attrs" in _holder(target) for target in targets):
                literal(node.value)
    return found


def test_the_output_attributes_are_named_in_one_module():
    """Only the output plan writes an output's attribute names; everything else reads them through its
    constants, so no reader can drift from the writer."""
    wrong = [
        f"{where(module, line)}: names the output attribute {name!r} (use streamwhiten.output_plan's constants)"
        for module, path in MODULES.items()
        if module != OUTPUT_PLAN
        for line, name in attribute_names_written(path.read_text())
    ]
    assert not wrong, "\n".join(wrong)


def test_the_attribute_rule_catches_each_way_of_naming_one():
    source = (
        "attrs['rows']\nx = output.attrs().get('complete')\nif 'compressor' in array.attrs: pass\n"
        "final_attrs = {'source_sha256': 1}\nsink.commit(True, {'n_nonfinite_rows': 0})\n"
        "apply(attrs={'kept_columns': []})\nrecord['rows']\nother = {'rows': 1}\n"
    )
    assert sorted(attribute_names_written(source)) == [
        (1, "rows"),
        (2, "complete"),
        (3, "compressor"),
        (4, "source_sha256"),
        (5, "n_nonfinite_rows"),
        (6, "kept_columns"),
    ]


# ---------------------------------------------------------------------- the CLI's words and annotations


def _docstring_ids(tree: ast.AST) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and _is_docstring(node.body[0])
    }


def cli_flags() -> set[str]:
    """Every long flag of every command (``--keep-columns``, ``--no-direct-io``)."""
    import click

    from streamwhiten.cli.app import cli

    return {
        opt
        for command in cli.commands.values()
        for param in command.params
        if isinstance(param, click.Option)
        for opt in (*param.opts, *param.secondary_opts)
        if opt.startswith("--")
    }


def test_the_library_names_parameters_not_flags():
    """A library message names a parameter (``keep_columns``), never a command-line flag: the CLI maps
    the one to the other (``streamwhiten.cli._flags``). Docstrings may tell how the CLI spells it."""
    import re

    flags = cli_flags()
    assert {"--keep-columns", "--compressor", "--max-bytes", "--no-direct-io"} <= flags
    pattern = re.compile(
        r"(?<![\w-])(" + "|".join(sorted(map(re.escape, flags), key=len, reverse=True)) + r")(?![\w-])"
    )
    found = []
    for module, path in MODULES.items():
        if layer(module) == "cli" or module == "streamwhiten.__main__":
            continue
        tree = ast.parse(path.read_text())
        skip = _docstring_ids(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                match = pattern.search(node.value)
                if match:
                    found.append(f"{where(module, node.lineno)}: {match.group(0)}")
    assert not found, "library strings naming a CLI flag:\n" + "\n".join(found)


def unannotated(tree: ast.AST) -> list[tuple[int, str, str]]:
    """``(line, function, parameter)`` of every parameter without an annotation (``self``/``cls`` excepted)."""
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            named = [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, (args.vararg, args.kwarg))]
            for index, arg in enumerate(named):
                if arg.annotation is None and not (index == 0 and arg.arg in ("self", "cls", "mcs")):
                    missing.append((node.lineno, node.name, arg.arg))
    return missing


def test_every_parameter_is_annotated():
    """Every function parameter in the package carries a type (``self`` and ``cls`` excepted)."""
    found = [
        f"{where(module, line)}: {function}({name})"
        for module, path in MODULES.items()
        for line, function, name in unannotated(ast.parse(path.read_text()))
    ]
    assert not found, f"{len(found)} parameters without an annotation:\n" + "\n".join(found)
