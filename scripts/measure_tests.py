"""Measure where a test tier's time goes: CPU seconds, wall time, the slowest tests, what it starts.

Runs pytest once (the quick tier unless told otherwise) in a child process with a fresh Numba cache
directory and a small plugin (``scripts/_measure_plugin.py``) that records, per test, the wall time and
every process the test starts (a ``streamwhiten`` command, a moto server, strace, another Python), the
Numba compilations in the test process, and the heavy optional libraries imported by collection. Prints a
summary and writes it as JSON.

Usage::

    python scripts/measure_tests.py                      # the quick tier
    python scripts/measure_tests.py --json out.json -- -m slow -n 0
    python scripts/measure_tests.py --collect-only       # only time collection

The CPU seconds are user + system of pytest and every process it waited for (``RUSAGE_CHILDREN``), the
figure issue #43 sets its target in; the machine is shared, so compare CPU seconds, not wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_pytest(pytest_args: list[str], report: Path, cache_dir: str) -> tuple[int, float, float]:
    """Run pytest in a child; return (exit code, wall seconds, CPU seconds of the child's whole tree)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, SW_MEASURE_REPORT=str(report))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "scripts"), env.get("PYTHONPATH", "")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    code = subprocess.call([sys.executable, "-m", "pytest", "-p", "_measure_plugin", *pytest_args], cwd=REPO, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return code, wall, cpu


def merge_reports(paths: list[Path]) -> dict:
    """One report from the plugin's files (one per xdist worker, or the one of a plain run)."""
    data: dict = {"tests": {}, "numba_compiles": 0, "collection_s": 0.0, "heavy_at_collection": [], "worker_cpu_s": {}}
    for path in paths:
        part = json.loads(path.read_text())
        data["tests"].update(part["tests"])
        data["numba_compiles"] += part.get("numba_compiles", 0)
        if part.get("worker"):  # an xdist worker: its own tree's CPU (the controller may not count it)
            data["worker_cpu_s"][part["worker"]] = part.get("cpu_s", 0.0)
        data["collection_s"] = max(data["collection_s"], part.get("collection_s", 0.0))
        data["heavy_at_collection"] = sorted(
            set(data["heavy_at_collection"]) | set(part.get("heavy_at_collection", []))
        )
    return data


def summarise(data: dict, top: int) -> list[str]:
    """Readable lines: totals, then the slowest tests with what each started."""
    tests = sorted(data["tests"].items(), key=lambda item: -item[1]["seconds"])
    starts: dict[str, int] = {}
    for record in data["tests"].values():
        for kind, count in record["started"].items():
            starts[kind] = starts.get(kind, 0) + count
    lines = [
        f"exit {data['exit']}; wall {data['wall_s']:.0f} s; CPU {data['cpu_s']:.0f} s (user + system, whole tree)",
        f"tests: {len(tests)}; collection {data.get('collection_s', 0):.1f} s; "
        f"heavy modules imported by collection: {', '.join(data.get('heavy_at_collection', [])) or 'none'}",
        "processes started: " + (", ".join(f"{kind} {count}" for kind, count in sorted(starts.items())) or "none"),
        f"numba compilations in the test processes: {data.get('numba_compiles', 0)}; "
        f"cache files written: {data.get('numba_cache_files', 0)}",
        f"slowest {top}:",
    ]
    for name, record in tests[:top]:
        started = ", ".join(f"{kind} {count}" for kind, count in sorted(record["started"].items()))
        lines.append(f"  {record['seconds']:7.2f} s  {name}" + (f"  [{started}]" if started else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON (default: print only)")
    parser.add_argument("--top", type=int, default=25, help="how many of the slowest tests to list")
    parser.add_argument("--collect-only", action="store_true", help="time `pytest --collect-only -q` alone")
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --)")
    args = parser.parse_args(argv)
    pytest_args = (["--collect-only", "-q"] if args.collect_only else ["-q"]) + args.pytest_args
    with tempfile.TemporaryDirectory(prefix="sw-measure-") as folder:
        report = Path(folder) / "report.json"
        cache_dir = str(Path(folder) / "numba-cache")
        code, wall, cpu = run_pytest(pytest_args, report, cache_dir)
        # the controller's file first: under xdist its records lack what the workers' files hold
        data = merge_reports(sorted(Path(folder).glob("report*.json"), key=lambda path: (path != report, path.name)))
        data["numba_cache_files"] = sum(1 for path in Path(cache_dir).rglob("*.nbc")) if Path(cache_dir).exists() else 0
    workers = sum(data["worker_cpu_s"].values())
    data.update(exit=code, wall_s=wall, pytest_args=pytest_args, controller_cpu_s=cpu)
    data["cpu_s"] = cpu if cpu >= workers else cpu + workers  # the workers' trees where the controller missed them
    print("\n".join(summarise(data, args.top)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1, sort_keys=True))
        print(f"written: {args.json}")
    return code


if __name__ == "__main__":
    sys.exit(main())
