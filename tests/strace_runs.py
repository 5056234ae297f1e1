"""Commands run under strace with one system call made to fail, and what they leave behind.

What the fault tests share (``io/test_write_faults.py``, ``test_export_faults.py``, ``cli/test_sigterm.py``):
strace's probe, the CLI run in an environment of its own (``cli_env``: the repository first, no .pyc writes,
the numba cache the ``numba_cache`` fixture of conftest.py sets), the parser of ``strace -f -y`` traces, the
injection points a clean run's trace offers (``injection_points``, ``pick``), a run with one injected
failure (``run_traced``), what a model, HDF5 or Zarr output holds (``read_output``, ``differences``), and
the stderr contract (``stderr_problems``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr
from conftest import REPO

# ------------------------------------------------------------------------------------ strace available?

STRACE = shutil.which("strace")


def _probe_strace():
    """``(extra strace options, None)`` when strace can trace here, else ``(None, reason)``."""
    if STRACE is None:
        return None, "strace is not installed (needed to inject failing system calls)"
    try:
        probe = subprocess.run([STRACE, "-f", "-o", os.devnull, "true"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"strace cannot run here: {exc}"
    if probe.returncode != 0:
        return None, f"strace cannot trace here (ptrace not permitted?): {probe.stderr.strip()[:300]}"
    # Stop only on the traced calls (much faster than stopping on every call); older strace lacks it.
    fast = subprocess.run(
        [STRACE, "-f", "--seccomp-bpf", "-e", "trace=write", "-o", os.devnull, "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return (["--seccomp-bpf"] if fast.returncode == 0 else []), None


STRACE_OPTIONS, SKIP_REASON = _probe_strace()

#: The marks of a module whose tests inject faults with strace: slow, and skipped saying why where strace
#: is missing or may not trace (ptrace not permitted).
STRACE_MARKS = [pytest.mark.slow, pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")]

# ---------------------------------------------------------------------------------------- the commands

CLI = [sys.executable, "-m", "streamwhiten"]
TIMEOUT = 120  # seconds for one command (a clean one takes a few)
HUNG = -999  # the exit code run_cli reports for a command that did not finish in time

#: Syscall families: the calls of each that a run makes are the candidate injection points.
FAMILIES = {
    "write": ("write", "writev"),
    "pwrite": ("pwrite64", "pwritev", "pwritev2"),
    "fsync": ("fsync", "fdatasync"),
    "rename": ("rename", "renameat", "renameat2"),
    "creat": ("openat", "open", "creat"),  # only the calls that create a file (O_CREAT)
}
LABELS = {"write": "write", "pwrite": "pwrite64", "fsync": "fsync", "rename": "rename", "creat": "openat-creat"}


#: Set by the ``numba_cache`` fixture (conftest.py): a numba cache of the test module's own, so that no other process
#: (another test run, an edit of the kernels) makes a run compile while the one counting calls did not.
ENV_EXTRA: dict = {}


def cli_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no .pyc writes among the counted calls
    env.pop("STREAMWHITEN_DEBUG", None)
    env.update(ENV_EXTRA)
    return env


def run_cli(args, cwd, timeout=TIMEOUT):
    command = [*CLI, *map(str, args)]
    try:
        return subprocess.run(command, capture_output=True, text=True, env=cli_env(), cwd=cwd, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, HUNG, "", f"did not finish within {timeout} s")


# ------------------------------------------------------------------------------------- strace traces


@dataclass
class Call:
    order: int  # position in the trace (entry order)
    pid: int  # thread (tracee) id
    name: str
    text: str
    injected: bool = False

    def fd_paths(self) -> list:
        """``(fd, path)`` of every descriptor strace decoded (``-y``), AT_FDCWD left out."""
        return re.findall(r"(?<![A-Za-z_\d])(\d+)<([^<>]*)>", self.text)

    def paths(self) -> list:
        """Every file this call names: quoted absolute paths and decoded descriptors."""
        found = re.findall(r'"(/[^"]*)"', self.text) + [path for _, path in self.fd_paths()]
        return list(dict.fromkeys(p.removesuffix("(deleted)") for p in found))

    def creates(self) -> bool:
        return self.name == "creat" or (self.name in ("openat", "open") and "O_CREAT" in self.text)

    def short(self) -> str:
        return f"{self.name}({self.text}"


_START = re.compile(r"^(\d+)\s+(\w+)\((.*)$")
_RESUMED = re.compile(r"^(\d+)\s+<\.\.\. (\w+) resumed>(.*)$")


def parse_trace(path) -> list:
    calls, pending = [], {}
    try:
        handle = open(path, errors="replace")
    except FileNotFoundError:
        return calls
    with handle:
        for line in handle:
            line = line.rstrip("\n")
            resumed = _RESUMED.match(line)
            if resumed:
                call = pending.pop(int(resumed.group(1)), None)
                if call is not None:
                    call.text += resumed.group(3)
                    call.injected = "(INJECTED)" in call.text
                continue
            start = _START.match(line)
            if not start:
                continue
            call = Call(len(calls), int(start.group(1)), start.group(2), start.group(3))
            call.injected = "(INJECTED)" in call.text
            if call.text.endswith("<unfinished ...>"):
                pending[call.pid] = call
            calls.append(call)
    return calls


def under(path: str, work: str) -> bool:
    return path == work or path.startswith(work + "/")


@dataclass(frozen=True)
class Where:
    """Where a run writes: its work directory, the files its stdout and stderr go to, its PID."""

    work: str
    stdout: str
    stderr: str
    pid: int = 0

    def template(self, path: str) -> str | None:
        """``path`` as a template valid in any run (``{work}``, ``{stdout}``, ``{stderr}``, ``{pid}``), or
        None for a file another run cannot name in advance (a random name, or not the command's own)."""
        if path == self.stdout:
            return "{stdout}"
        if path == self.stderr:
            return "{stderr}"
        if not under(path, self.work) or re.search(r"[0-9a-f]{32}", path):
            return None
        return re.sub(rf"(?<!\d){self.pid}(?!\d)", "{pid}", "{work}" + path[len(self.work) :])

    def shell_word(self, template: str) -> str:
        """``template`` for ``sh -c``: quoted, with ``$$`` (the shell's PID, which the command keeps) for ``{pid}``."""
        text = template.replace("{work}", self.work).replace("{stdout}", self.stdout).replace("{stderr}", self.stderr)
        return "$$".join(shlex.quote(part) if part else "" for part in text.split("{pid}"))

    def short(self, text: str) -> str:
        return text.replace(self.stdout, "STDOUT").replace(self.stderr, "STDERR").replace(self.work, "WORK")


def kind_of(call: Call, where: Where) -> str:
    """The call's syscall and files, normalised (digits, PIDs and uuids), to tell phases apart."""
    parts = []
    for fd, path in call.fd_paths():
        if ":[" in path:  # pipe:[123], socket:[456]
            parts.append(f"fd{fd}:{path.split(':')[0]}")
    for path in call.paths():
        if ":[" not in path:
            parts.append(re.sub(r"\d+", "#", re.sub(r"[0-9a-f]{32}", "UUID", where.short(path))))
    return call.name + " " + " ".join(dict.fromkeys(parts))


@dataclass
class Point:
    """One injection point: fail the ``when``-th ``syscall`` touching ``path`` (a :meth:`Where.template`)
    made by a thread (``strace -P path -e inject=syscall:when=N``)."""

    syscall: str
    when: int
    path: str
    call: Call  # the call it aims at, in the counting run
    kind: str

    def describe(self, where: Where) -> str:
        return f"{self.syscall} call #{self.when} touching {self.path}: {where.short(self.call.short())}"


def injection_points(calls: list, family: str, where: Where) -> list:
    """Every call of ``family`` in a clean run's trace that one injection can aim at, in time order: the
    calls on a file whose name a later run can give to ``-P`` (its own files, named alike in every run,
    its stdout and stderr), when no other thread's call of the same number on that file comes first."""
    members = FAMILIES[family]
    by_thread: dict = {}
    for c in calls:
        if c.name in members:
            by_thread.setdefault((c.name, c.pid), []).append(c)
    points = []
    for call in calls:
        if call.name not in members or (family == "creat" and not call.creates()):
            continue
        named = [(path, where.template(path)) for path in call.paths() if where.template(path) is not None]
        if not named:
            continue  # a file with a random name (zarr's metadata temp files), or not the command's own
        path, template = named[0]
        touching = lambda lst: [c for c in lst if path in c.paths()]  # noqa: E731
        when = touching(by_thread[(call.name, call.pid)]).index(call) + 1
        others = [touching(lst) for (name, pid), lst in by_thread.items() if name == call.name and pid != call.pid]
        if any(len(lst) >= when and lst[when - 1].order < call.order for lst in others):
            continue  # another thread's call of the same number on that file comes first
        points.append(Point(call.name, when, template, call, kind_of(call, where)))
    return points


def pick(points: list, k: int) -> list:
    """Indices of up to ``k`` points: the first call of each kind (normalised file), the last and the first
    call, then an even spread."""
    if len(points) <= k:
        return list(range(len(points)))
    first = {}
    for i, point in enumerate(points):
        first.setdefault(point.kind, i)
    picks: list = []
    for i in [*first.values(), len(points) - 1, 0]:
        if len(picks) < k and i not in picks:
            picks.append(i)
    count = k
    while len(picks) < k:
        for x in np.linspace(0, len(points) - 1, count):
            if int(round(x)) not in picks:
                picks.append(int(round(x)))
                if len(picks) == k:
                    break
        count *= 2
    return sorted(picks)


def run_traced(args, cwd, where: Where, trace: Path, syscalls, inject: str | None = None, path: str | None = None):
    """Run the CLI under strace, with stdout and stderr going to the files ``where`` names.

    ``sh -c 'exec strace -D ...'``: with -D the traced command keeps the shell's PID, so file names that
    hold the PID can be given to ``-P`` as ``...$$``. Returns a CompletedProcess (stdout, stderr read
    back) and the shell command line.
    """
    words = [
        STRACE,
        "-D",
        "-f",
        "-qq",
        *STRACE_OPTIONS,
        "-y",
        "-s",
        "0",
        "-e",
        "signal=none",
        "-o",
        str(trace),
        "-e",
        "trace=" + ",".join(syscalls),
    ]
    if inject is not None:
        words += ["-e", f"inject={inject}"]
    script = "exec " + " ".join(map(shlex.quote, words))
    if path is not None:
        script += " -P " + where.shell_word(path)
    script += " -- " + " ".join(map(shlex.quote, [*CLI, *map(str, args)]))
    with open(where.stdout, "w") as out, open(where.stderr, "w") as err:
        try:
            code = subprocess.run(
                ["sh", "-c", script], stdout=out, stderr=err, env=cli_env(), cwd=cwd, timeout=TIMEOUT
            ).returncode
        except subprocess.TimeoutExpired:
            code = HUNG
    _wait_for_tracer(trace)
    result = subprocess.CompletedProcess(
        script, code, Path(where.stdout).read_text(errors="replace"), Path(where.stderr).read_text(errors="replace")
    )
    return result, script


def _wait_for_tracer(trace: Path, timeout: float = 30.0) -> None:
    """Wait until the detached strace writing ``trace`` has finished."""
    needle = str(trace).encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = False
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as handle:
                        if needle in handle.read():
                            busy = True
                            break
                except OSError:
                    continue
        if not busy:
            return
        time.sleep(0.005)


# ------------------------------------------------------------------------------ what the outputs hold


def read_output(path: Path, kind: str) -> dict:
    """What a final output holds, for comparisons; ``{"unreadable": message}`` when it cannot be read."""
    try:
        if kind == "model":
            with np.load(path, allow_pickle=False) as data:
                arrays = {key: (str(data[key].dtype), data[key].shape, data[key].tobytes()) for key in data.files}
            return {"arrays": arrays}
        if kind == "h5":
            with h5py.File(path, "r") as handle:
                dataset = handle["y"]
                values = dataset[...]
                attrs = {key: _plain(value) for key, value in dataset.attrs.items()}
            return {"values": (str(values.dtype), values.shape, values.tobytes()), "attrs": attrs}
        array = zarr.open_array(store=str(path), mode="r")
        values = array[...]
        return {
            "values": (str(values.dtype), values.shape, values.tobytes()),
            "attrs": dict(array.attrs),
            "files": sorted(file_tree(path)),
        }
    except Exception as exc:  # noqa: BLE001 -- anything unreadable is simply not a complete output
        return {"unreadable": f"{exc.__class__.__name__}: {exc}"[:200]}


def _plain(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def file_tree(path: Path) -> dict:
    """Relative path -> bytes of every file under a directory (a Zarr store)."""
    contents = {}
    for directory, _, files in os.walk(path):
        for name in files:
            full = os.path.join(directory, name)
            with open(full, "rb") as handle:
                contents[os.path.relpath(full, path)] = handle.read()
    return contents


def raw_contents(path: Path):
    if not os.path.lexists(path):
        return None
    if path.is_dir():
        return file_tree(path)
    return path.read_bytes()


def differences(found: dict, expected: dict, exact_files: bool) -> list:
    """Why ``found`` is not the complete, correct output ``expected`` (empty: it is)."""
    if "unreadable" in found:
        return [f"unreadable ({found['unreadable']})"]
    if "arrays" in expected:
        if found["arrays"].keys() != expected["arrays"].keys():
            return [f"arrays {sorted(found['arrays'])} instead of {sorted(expected['arrays'])}"]
        differ = [key for key in expected["arrays"] if found["arrays"][key] != expected["arrays"][key]]
        return [f"model arrays differ from the clean run's: {', '.join(differ)}"] if differ else []
    problems = []
    if found["attrs"].get("complete") is not True:
        problems.append(f"attribute complete = {found['attrs'].get('complete')!r}")
    if found["values"] != expected["values"]:
        problems.append(
            "values differ from the clean run's"
            if found["values"][:2] == expected["values"][:2]
            else f"shape/dtype {found['values'][:2]} instead of {expected['values'][:2]}"
        )
    changed = sorted(
        key
        for key in set(found["attrs"]) | set(expected["attrs"])
        if found["attrs"].get(key) != expected["attrs"].get(key) and key != "complete"
    )
    if changed:
        problems.append(f"attributes differ: {', '.join(changed)}")
    if exact_files and "files" in expected and found["files"] != expected["files"]:
        extra = sorted(set(found["files"]) - set(expected["files"]))
        missing = sorted(set(expected["files"]) - set(found["files"]))
        problems.append(f"store files differ (extra {extra}, missing {missing})")
    return problems


def listing(work: Path) -> list:
    return sorted(os.listdir(work))


# ---------------------------------------------------------------------------------------- stderr


LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\S+ streamwhiten: ")
CRASH_MARKERS = (
    "Traceback (most recent call last)",
    "internal error",
    "Exception ignored",
    "--- Logging error ---",
    "Fatal Python error",
    "Segmentation fault",
    "core dumped",
    "KeyboardInterrupt",
)
WARNING = re.compile(r"\b\w+Warning: ")


def stderr_problems(stderr: str, code: int, is_run: bool) -> list:
    """Contract item 2: one line ``streamwhiten: ...`` on failure (plus log lines for ``run``), nothing
    on success, never a traceback, crash or warning."""
    problems = []
    lines = stderr.splitlines()
    for marker in CRASH_MARKERS:
        if marker in stderr:
            problems.append(f"[stderr-crash] stderr contains {marker!r}")
    if WARNING.search(stderr):
        problems.append(f"[stderr-warning] stderr contains a warning: {WARNING.search(stderr).group(0)!r}")
    message = [line for line in lines if not (is_run and LOG_LINE.match(line))]
    if code == 0:
        if message:
            problems.append(f"[stderr-lines] exit 0 but stderr has {len(message)} other line(s): {message[:3]!r}")
    elif len(message) != 1 or not message[0].startswith("streamwhiten:"):
        problems.append(
            f"[stderr-lines] expected exactly one line starting with 'streamwhiten:', got "
            f"{len(message)}: {message[:4]!r}"
        )
    return problems
