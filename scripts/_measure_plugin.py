"""pytest plugin for ``scripts/measure_tests.py``: per-test wall time and what each test starts.

Loaded with ``-p _measure_plugin`` when ``SW_MEASURE_REPORT`` names the JSON file to write (one per xdist
worker: the worker's id is added to the name). Records, per test: seconds (setup + call + teardown), the
processes started through ``subprocess.Popen`` by kind and through ``multiprocessing`` (Dask's workers);
for the run: Numba compilations in this process, collection seconds and the heavy libraries that
collection imported.
"""

from __future__ import annotations

import json
import multiprocessing.process
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("faiss", "pyarrow", "lance", "dask", "distributed", "torch", "matplotlib", "sklearn", "onnxruntime",
         "s3fs", "moto", "scipy", "pandas")  # fmt: skip

_state: dict = {"tests": {}, "numba_compiles": 0, "current": None, "start": time.perf_counter()}


def _kind(argv) -> str:
    words = [str(word) for word in ([argv] if isinstance(argv, (str, bytes)) else argv)]
    text = " ".join(words)
    if "strace" in words[0]:
        return "strace"
    if "moto" in text:
        return "moto"
    if "streamwhiten" in text and ("-m streamwhiten" in text or words[0].endswith("streamwhiten")):
        return "streamwhiten"
    if "python" in Path(words[0]).name:
        return "python"
    return Path(words[0]).name or "other"


def _count(kind: str) -> None:
    name = _state["current"]
    if name is not None:
        started = _state["tests"].setdefault(name, {"seconds": 0.0, "started": {}})["started"]
        started[kind] = started.get(kind, 0) + 1


_popen_init = subprocess.Popen.__init__


def _counting_popen_init(self, args, *rest, **kwargs):
    _count(_kind(args))
    return _popen_init(self, args, *rest, **kwargs)


_process_start = multiprocessing.process.BaseProcess.start


def _counting_start(self):
    _count("multiprocessing")
    return _process_start(self)


def pytest_configure(config):
    if not os.environ.get("SW_MEASURE_REPORT"):
        return
    subprocess.Popen.__init__ = _counting_popen_init
    multiprocessing.process.BaseProcess.start = _counting_start
    try:
        from numba.core import event

        class _Compiles(event.Listener):
            def on_start(self, event_):
                _state["numba_compiles"] += 1

            def on_end(self, event_):
                pass

        event.register("numba:compile", _Compiles())
    except ImportError:  # pragma: no cover - numba is a dependency
        pass


def pytest_collection_finish(session):
    _state["collection_s"] = time.perf_counter() - _state["start"]
    _state["heavy_at_collection"] = sorted(name for name in HEAVY if name in sys.modules)


import pytest  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """The test now running (in an xdist worker too, where the log hooks run in the controller)."""
    _state["current"] = item.nodeid
    _state["tests"].setdefault(item.nodeid, {"seconds": 0.0, "started": {}})


def pytest_runtest_logreport(report):
    record = _state["tests"].setdefault(report.nodeid, {"seconds": 0.0, "started": {}})
    record["seconds"] += report.duration
    if report.when == "call":
        record["outcome"] = report.outcome
    elif report.outcome != "passed":
        record["outcome"] = report.outcome


def pytest_sessionfinish(session, exitstatus):
    target = os.environ.get("SW_MEASURE_REPORT")
    if not target:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    path = Path(target) if worker is None else Path(target).with_name(f"{Path(target).stem}-{worker}.json")
    data = {key: value for key, value in _state.items() if key not in ("current", "start")}
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    data["cpu_s"] = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime  # this process's tree
    data["worker"] = worker
    path.write_text(json.dumps(data))
