"""Count annotated function parameters per package of streamwhiten (self/cls excepted), and the lines outside
``cli/`` whose string literals name a command-line flag: ``python scripts/annotations.py [ROOT]``."""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from pathlib import Path

#: A command-line flag inside a string: ``--keep-columns``, ``--no-direct-io``.
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    """The parameters of ``function`` that should carry an annotation (not ``self``/``cls``)."""
    args = function.args
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    named += [arg for arg in (args.vararg, args.kwarg) if arg is not None]
    return [arg for arg in named if arg.arg not in ("self", "cls", "mcs")]


def package_of(path: Path, root: Path) -> str:
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else "(top)"


def annotation_counts(root: Path) -> tuple[Counter, Counter, list[str]]:
    """Per package: parameters, annotated ones, and where the others are."""
    total, annotated, missing = Counter(), Counter(), []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        package = package_of(path, root)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                if isinstance(node, ast.Lambda):
                    continue  # a lambda cannot be annotated
                for arg in parameters(node):
                    total[package] += 1
                    if arg.annotation is not None:
                        annotated[package] += 1
                    else:
                        missing.append(f"{path}:{node.lineno} {node.name}({arg.arg})")
    return total, annotated, missing


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, class or function."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def flag_lines(root: Path) -> list[str]:
    """Lines outside ``cli/`` whose string literals (not docstrings) name a flag."""
    lines = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "cli":
            continue
        tree = ast.parse(path.read_text(), str(path))
        skip = docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                if FLAG.search(node.value):
                    lines.append(f"{path}:{node.lineno}: {FLAG.findall(node.value)}")
    return sorted(set(lines))


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".") / "streamwhiten"
    total, annotated, missing = annotation_counts(root)
    print(f"{'package':<12} {'params':>7} {'annotated':>10} {'share':>7}")
    for package in sorted(total):
        print(f"{package:<12} {total[package]:>7} {annotated[package]:>10} {annotated[package] / total[package]:>7.0%}")
    everything = sum(total.values())
    print(f"{'all':<12} {everything:>7} {sum(annotated.values()):>10} {sum(annotated.values()) / everything:>7.0%}")
    flags = flag_lines(root)
    files = {line.split(":")[0] for line in flags}
    print(f"string literals naming a flag outside cli/ (docstrings excepted): {len(flags)} lines in {len(files)} files")
    if "-v" in sys.argv:
        print("\n".join(missing + flags))


if __name__ == "__main__":
    main()
