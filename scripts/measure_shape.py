"""Measure the package's shape: lines, long and wide functions, and where a storage is parsed.

The figures issue #44 sets its targets in, read from the source alone (nothing is imported or run):
package lines, functions over 60 and over 100 lines, functions outside ``cli/`` with more than 8
parameters (``self`` and ``cls`` not counted; ``*args`` counts as one), and the call sites of the
functions that parse or test a storage's spelling (``STORAGE_PARSERS``). Prints them and, with
``--json``, writes them.

Usage::

    python scripts/measure_shape.py
    python scripts/measure_shape.py --json shape.json
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Functions that turn a storage's spelling into meaning: their calls should stand only at the edges.
STORAGE_PARSERS = frozenset(
    {"parse_code", "is_code", "is_code_dtype", "recorded_code", "parse_storage", "split_families"}
)


def function_rows(path: Path) -> tuple[list[dict], Counter]:
    """One row per function of ``path`` (name, first line, lines, parameters), and its storage-parser calls."""
    tree = ast.parse(path.read_text())
    rows, parses = [], Counter()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
            count = len(names) + (args.vararg is not None)
            rows.append(
                {
                    "name": node.name,
                    "line": node.lineno,
                    "lines": node.end_lineno - node.lineno + 1,
                    "parameters": count,
                }
            )
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in STORAGE_PARSERS:
                parses[name] += 1
    return rows, parses


def measure(package: Path) -> dict:
    """The shape figures of every module under ``package``."""
    lines, long60, long100, wide, parse_sites = 0, [], [], [], {}
    for path in sorted(package.rglob("*.py")):
        where = str(path.relative_to(REPO))
        lines += path.read_text().count("\n")
        rows, parses = function_rows(path)
        for row in rows:
            place = f"{where}:{row['line']} {row['name']}"
            if row["lines"] > 60:
                long60.append((row["lines"], place))
            if row["lines"] > 100:
                long100.append((row["lines"], place))
            if row["parameters"] > 8 and "/cli/" not in where:
                wide.append((row["parameters"], place))
        if parses:
            parse_sites[where] = sum(parses.values())
    return {
        "package_lines": lines,
        "functions_over_100_lines": sorted(long100, reverse=True),
        "functions_over_60_lines": sorted(long60, reverse=True),
        "functions_over_8_parameters_outside_cli": sorted(wide, reverse=True),
        "storage_parse_sites": dict(sorted(parse_sites.items(), key=lambda item: -item[1])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    shape = measure(REPO / "streamwhiten")
    print(f"package lines: {shape['package_lines']:,}")
    for key in ("functions_over_100_lines", "functions_over_60_lines", "functions_over_8_parameters_outside_cli"):
        print(f"{key.replace('_', ' ')}: {len(shape[key])}")
        for size, place in shape[key]:
            print(f"  {size:4d}  {place}")
    sites = shape["storage_parse_sites"]
    print(f"storage parse call sites: {sum(sites.values())} in {len(sites)} files")
    for where, count in sites.items():
        print(f"  {count:4d}  {where}")
    if args.json:
        Path(args.json).write_text(json.dumps(shape, indent=2) + "\n")


if __name__ == "__main__":
    main()
