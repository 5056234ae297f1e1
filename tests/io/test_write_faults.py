"""Failed writes of fit, apply and run (issue #14, "nothing lost, nothing silently wrong").

Each ``test_fault`` case runs one small real command under strace and makes one system call fail with
ENOSPC or EIO (``strace -e inject=SYSCALL:error=ERRNO:when=N``):

- ``fit IN.h5:/emb -o model.npz`` (6 blocks, a checkpoint after each), and the same with ``--overwrite``
  over an existing model;
- ``apply model.npz IN -o out.h5:/y`` and ``-o out.zarr`` (12 blocks, a progress record after each), and
  both with ``--overwrite`` over an existing output;
- ``run job.toml`` for a job that fits and applies.

It then checks the contract of the README ("Outputs are complete or absent", "Errors and exit codes",
"Nightly batch runs"):

1. the exit code is 2, 74 or 130 -- or 0, but only where the failed call was harmless: the outputs are
   then complete and correct, nothing is left behind, and the failed call was no fsync of the command's
   own files (ignoring a failed fsync reports a durability that does not hold);
2. stderr is exactly one line, starting with ``streamwhiten:`` (for ``run``: its timestamped log lines
   and that one line), with no traceback, "internal error", warning or crash;
3. a final output path (model, apply output) holds nothing, or the complete and correct output, or --
   with ``--overwrite`` -- the previous file untouched;
4. after a failure, a plain rerun of the same command exits 0 (or 3: nothing left to do), and what is
   then in place is exactly what a clean run writes (model arrays bit for bit, an HDF5 output byte for byte, a Zarr output's values,
   attributes and files), and leaves no temporary file (the directory lists what a clean run leaves).

Injection points. A clean run of each command is traced first (``-y``: file names of descriptors), and
every call of the syscall family it makes is a candidate: write, pwrite64, fsync (+fdatasync),
rename (+renameat, renameat2), and openat with O_CREAT (calls of other threads or processes on files
outside the command's directory, e.g. a helper's pipe, are left out). strace counts ``when=N`` per
syscall and *per thread*, so a call is aimed at precisely: with ``-P FILE`` (only calls touching that file
are traced and counted) when its file name is the same in every run, else by its number in its own
thread, used only when no other thread's call of the same number comes first. The cases of one command
and family take the first call of each kind (each file, normalised) touching the command's files, the
first of each other kind in the main thread (stdout, stderr), the last and the first call, then an even
spread; the test id ``fit-write-EIO-p3`` is the 3rd of those picks (the message names the exact call and
gives the strace command line that reproduces it). The trace of each faulted run shows which calls
failed (``(INJECTED)``); a case is tried again, and after three tries skipped saying why, when its number
hit another kind of call than the counting run predicted, or when the same number also failed a write
to a pipe in another thread (the error report on stderr: a pipe cannot be full, so that is no single
fault; zarr writes its metadata from a pool of threads, so which thread writes what varies). The
commands use a numba cache of their own, filled before the counting runs, so no run compiles kernels
(and imports more) where the counting run did not.

The faulted runs (and their reruns) are started in the background as soon as the module begins, on
three worker threads per core (they mostly wait on fsync; ``STREAMWHITEN_FAULT_JOBS`` overrides),
so each test mostly waits for its own result; this keeps the module at a few minutes on 2 cores.

The module is skipped when strace is missing or may not trace here (ptrace not permitted); the strace
machinery is in ``strace_runs.py``, the SIGTERM cases in ``cli/test_sigterm.py``, the exports' faults in
``test_export_faults.py``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from conftest import anisotropic, write_h5
from strace_runs import (
    CRASH_MARKERS,
    FAMILIES,
    HUNG,
    LABELS,
    STRACE_MARKS,
    TIMEOUT,
    Where,
    differences,
    injection_points,
    kind_of,
    listing,
    parse_trace,
    pick,
    raw_contents,
    read_output,
    run_cli,
    run_traced,
    stderr_problems,
    under,
)

pytestmark = STRACE_MARKS

ERRNOS = ("ENOSPC", "EIO")
ALLOWED_FAILURE_CODES = (2, 74, 130)

#: How many injection points each command gets per family (times two errnos).
PLAN = {
    "fit": {"write": 4, "fsync": 3, "rename": 2, "creat": 2},
    "fit-overwrite": {"write": 1, "fsync": 2, "rename": 2},
    "apply-h5": {"write": 2, "pwrite": 4, "fsync": 3, "rename": 2, "creat": 2},
    "apply-h5-overwrite": {"pwrite": 1, "fsync": 2, "rename": 2},
    "apply-zarr": {"write": 3, "pwrite": 3, "fsync": 3, "rename": 3, "creat": 3},
    "apply-zarr-overwrite": {"fsync": 2, "rename": 4},
    "run": {"write": 4, "pwrite": 2, "fsync": 3, "rename": 2, "creat": 2},
}

#: Commands run at once. They wait on fsync more than they compute: three per core keep the CPUs busy.
WORKERS = max(1, int(os.environ.get("STREAMWHITEN_FAULT_JOBS", 0)) or min(8, 3 * (os.cpu_count() or 1)))

N_ROWS, N_FEATURES, STORE_CHUNK = 3000, 16, 500
APPLY_BLOCK = 256  # 256 x 16 float32 = 16 KiB: whole output chunks, written around the page cache


@dataclass
class Scenario:
    name: str
    finals: dict  # file name in the work directory -> "model" | "h5" | "zarr"
    preexisting: str | None = None  # a final output that exists before the command (--overwrite)
    is_run: bool = False

    def args(self, world: World, work: Path) -> list:
        if self.name.startswith("fit"):
            args = [
                "fit",
                world.input,
                "-o",
                work / "model.npz",
                "--chunk-rows",
                STORE_CHUNK,
                "--checkpoint-every",
                1,
                "-q",
            ]
        elif self.name.startswith("apply"):
            target = f"{work / 'out.h5'}:/y" if "h5" in self.name else str(work / "out.zarr")
            args = [
                "apply",
                world.model,
                world.input,
                "-o",
                target,
                "--chunk-rows",
                APPLY_BLOCK,
                "--checkpoint-seconds",
                0,
                "-q",
            ]
        else:
            args = ["run", work / "job.toml", "-q"]
        if self.name.endswith("-overwrite"):
            args.append("--overwrite")
        return [str(a) for a in args]

    def prepare(self, world: World, work: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        if self.is_run:
            (work / "job.toml").write_text(
                'name = "faults"\n'
                f'[input]\npaths = ["{world.input_path}"]\ndataset = "/emb"\n'
                f'[model]\npath = "model.npz"\nn_components = 8\nchunk_rows = {STORE_CHUNK}\ncheckpoint_every = 1\n'
                f'[apply]\noutput = "out-{{stem}}.zarr"\nnormalize = true\nchunk_rows = {APPLY_BLOCK}\n'
            )
        if self.preexisting is not None:
            source = world.old[self.preexisting]
            if source.is_dir():
                shutil.copytree(source, work / self.preexisting)
            else:
                shutil.copyfile(source, work / self.preexisting)

    #: A plain rerun after a failure: 0, or 3 when it finds nothing left to do (the outputs are checked anyway).
    rerun_codes = (0, 3)


SCENARIOS = {
    "fit": Scenario("fit", {"model.npz": "model"}),
    "fit-overwrite": Scenario("fit-overwrite", {"model.npz": "model"}, preexisting="model.npz"),
    "apply-h5": Scenario("apply-h5", {"out.h5": "h5"}),
    "apply-h5-overwrite": Scenario("apply-h5-overwrite", {"out.h5": "h5"}, preexisting="out.h5"),
    "apply-zarr": Scenario("apply-zarr", {"out.zarr": "zarr"}),
    "apply-zarr-overwrite": Scenario("apply-zarr-overwrite", {"out.zarr": "zarr"}, preexisting="out.zarr"),
    "run": Scenario("run", {"model.npz": "model", "out-in.zarr": "zarr"}, is_run=True),
}
# ------------------------------------------------------------------------------------------ the world


@dataclass
class ScenarioInfo:
    reference: dict  # final name -> read_output of a clean run
    reference_bytes: dict  # final name -> raw contents of a clean run
    reference_listing: list
    points: dict  # family -> [Point]
    where: Where  # of the counting run


class World:
    """Shared inputs, and per command: a clean reference run and a traced run counting its calls."""

    def __init__(self, base: Path):
        self.base = base
        self.shared = base / "shared"
        self.shared.mkdir()
        data = anisotropic(N_ROWS, N_FEATURES, seed=14).astype(np.float32)
        self.input = write_h5(self.shared / "in.h5", data, chunk_rows=STORE_CHUNK)
        self.input_path = str(self.shared / "in.h5")
        self.model = str(self.shared / "model.npz")
        # Previous outputs for --overwrite: another model (k=4) and what it wrote.
        old_model = self.shared / "old-model.npz"
        self.old = {"model.npz": old_model, "out.h5": self.shared / "old.h5", "out.zarr": self.shared / "old.zarr"}
        # One after the other: the first fit and the first apply fill the numba cache.
        for args in (
            ["fit", self.input, "-o", self.model, "-q"],
            ["fit", self.input, "-o", old_model, "-k", 4, "-q"],
            ["apply", old_model, self.input, "-o", f"{self.old['out.h5']}:/y", "-q"],
            ["apply", old_model, self.input, "-o", self.old["out.zarr"], "-q"],
        ):
            self.check(run_cli(args, self.shared))
        self._locks = {name: threading.Lock() for name in SCENARIOS}
        self._info: dict = {}

    @staticmethod
    def check(result):
        assert result.returncode == 0, f"setting up the fault tests failed: {result.args}\n{result.stderr}"

    def info(self, name: str) -> ScenarioInfo:
        with self._locks[name]:
            if name not in self._info:
                try:
                    self._info[name] = self._prepare(SCENARIOS[name])
                except BaseException as exc:  # every case of this command reports it
                    self._info[name] = exc
            found = self._info[name]
        if isinstance(found, BaseException):
            raise found
        return found

    def _prepare(self, scenario: Scenario) -> ScenarioInfo:
        reference_dir = self.base / "reference" / scenario.name
        scenario.prepare(self, reference_dir)
        clean = run_cli(scenario.args(self, reference_dir), self.shared)
        assert clean.returncode == 0, (
            f"the clean run of {scenario.name} failed (exit {clean.returncode}):\n{clean.stderr}"
        )
        reference = {name: read_output(reference_dir / name, kind) for name, kind in scenario.finals.items()}
        for name, found in reference.items():
            assert "unreadable" not in found, f"clean run of {scenario.name}: {name} {found['unreadable']}"
        count_dir = self.base / "count" / scenario.name
        scenario.prepare(self, count_dir)
        where = Where(str(count_dir), f"{count_dir}.stdout", f"{count_dir}.stderr")
        syscalls = sorted({s for members in FAMILIES.values() for s in members})
        trace = Path(f"{count_dir}.trace")
        counted, _ = run_traced(scenario.args(self, count_dir), self.shared, where, trace, syscalls)
        assert counted.returncode == 0, f"the traced clean run of {scenario.name} failed:\n{counted.stderr}"
        for name, kind in scenario.finals.items():  # strace itself changes nothing
            assert not differences(read_output(count_dir / name, kind), reference[name], True), (
                f"{scenario.name}: the traced clean run wrote another {name} than the clean run (not deterministic?)"
            )
        calls = parse_trace(trace)
        where = Where(where.work, where.stdout, where.stderr, pid=calls[0].pid)  # strace -D: the shell's PID
        points = {family: injection_points(calls, family, where) for family in FAMILIES}
        return ScenarioInfo(
            reference,
            {name: raw_contents(reference_dir / name) for name in scenario.finals},
            listing(reference_dir),
            points,
            where,
        )


# ------------------------------------------------------------------------------------- one faulted run


@dataclass(frozen=True)
class Case:
    scenario: str
    family: str
    errno: str
    slot: int  # index into the picks of this command and family
    slots: int

    @property
    def id(self) -> str:
        return f"{self.scenario}-{LABELS[self.family]}-{self.errno}-p{self.slot + 1}"


CASES = [
    Case(scenario, family, errno, slot, slots)
    for scenario, families in PLAN.items()
    for family, slots in families.items()
    for slot in range(slots)
    for errno in ERRNOS
]


@dataclass
class Outcome:
    case: Case
    skip: str | None = None
    violations: list = field(default_factory=list)
    context: list = field(default_factory=list)

    def report(self) -> str:
        return "\n".join(
            [
                f"{self.case.id}: the contract of issue #14 is broken",
                *self.context,
                "violations:",
                *(f"  - {v}" for v in self.violations),
            ]
        )


def run_case(world: World, case: Case) -> Outcome:
    outcome = Outcome(case)
    scenario = SCENARIOS[case.scenario]
    info = world.info(case.scenario)
    points = info.points[case.family]
    picks = pick(points, case.slots)
    if case.slot >= len(picks):
        outcome.skip = (
            f"{case.scenario} makes only {len(points)} {LABELS[case.family]} call(s) that can be aimed "
            f"at (the plan asks for {case.slots})"
        )
        return outcome
    point = points[picks[case.slot]]
    work = world.base / "cases" / case.id
    wk = str(work)
    where = Where(wk, f"{work}.stdout", f"{work}.stderr")
    trace = Path(f"{work}.trace")
    args = scenario.args(world, work)
    for _attempt in range(3):  # should the run not repeat the counting run's calls (not expected): try again
        shutil.rmtree(work, ignore_errors=True)
        scenario.prepare(world, work)
        previous = raw_contents(work / scenario.preexisting) if scenario.preexisting else None
        faulted, script = run_traced(
            args,
            world.shared,
            where,
            trace,
            [point.syscall],
            f"{point.syscall}:error={case.errno}:when={point.when}",
            point.path,
        )
        code, stderr = faulted.returncode, faulted.stderr
        injected = [call for call in parse_trace(trace) if call.injected]
        if not injected or kind_of(injected[0], where) == point.kind:
            break
    outcome.context += [
        f"WORK = {wk}",
        f"aimed at: {point.describe(info.where)}",
        "injected: "
        + ("; ".join(where.short(c.short()) for c in injected) if injected else "nothing (the call did not happen)"),
        f"exit code {code}; stderr: {stderr.strip()[-600:]!r}",
        "reproduce: PYTHONPATH=. sh -c "
        + shlex.quote(where.short(script.replace(str(trace), "/dev/null")))
        + " >STDOUT 2>STDERR  (STDOUT, STDERR: absolute paths of two files)",
    ]
    if injected and kind_of(injected[0], where) != point.kind:
        outcome.skip = (
            f"in 3 tries the injection hit another call than the counting run predicted (the run is "
            f"not deterministic here): aimed at {point.kind!r}, hit {kind_of(injected[0], where)!r}"
        )
        return outcome
    v = outcome.violations

    # 1. exit code
    if code == HUNG:
        v.append(f"[hang] the command did not finish within {TIMEOUT} s")
    elif code not in (0, *ALLOWED_FAILURE_CODES):
        what = "killed by a signal" if code < 0 or code >= 128 and code != 130 else "not an allowed code"
        v.append(f"[exit] exit code {code} ({what}; allowed: 2, 74, 130, or 0 when the failure was harmless)")
    if code == 0:
        swallowed = [c for c in injected if c.name in FAMILIES["fsync"] and any(under(p, wk) for p in c.paths())]
        if swallowed:
            v.append(
                f"[fsync-ignored] exit 0 although {where.short(swallowed[0].short())} failed: what it should have made "
                f"durable may not be on disk"
            )

    # 2. stderr
    v.extend(stderr_problems(stderr, code, scenario.is_run))

    # 3. final outputs right after the faulted run
    for name, kind in scenario.finals.items():
        path = work / name
        if not os.path.lexists(path):
            if name == scenario.preexisting:
                v.append(f"[previous-lost] the existing {name} is gone after the failed --overwrite run")
            elif code == 0:
                v.append(f"[output-missing] exit 0 but {name} was not written")
            continue
        problems = differences(read_output(path, kind), info.reference[name], exact_files=False)
        if not problems:
            continue
        if name == scenario.preexisting and raw_contents(path) == previous:
            if code == 0:
                v.append(f"[output-stale] exit 0 but {name} still holds the previous output")
            continue
        v.append(
            f"[output-bad] {name} exists after the faulted run (exit {code}) but is not the complete, "
            f"correct output: {'; '.join(problems)}"
        )

    # 4. a plain rerun finishes the job exactly as a clean run, leaving nothing behind
    if code != 0 or scenario.is_run:
        rerun = run_cli(args, world.shared)
        outcome.context.append(f"rerun: exit {rerun.returncode}; stderr: {rerun.stderr.strip()[-300:]!r}")
        if rerun.returncode not in scenario.rerun_codes:
            v.append(
                f"[rerun-exit] the plain rerun exited {rerun.returncode} (expected "
                f"{' or '.join(map(str, scenario.rerun_codes))}): {rerun.stderr.strip()[-300:]!r}"
            )
        for marker in CRASH_MARKERS:
            if marker in rerun.stderr:
                v.append(f"[rerun-crash] the rerun's stderr contains {marker!r}")
    for name, kind in scenario.finals.items():
        path = work / name
        if not os.path.lexists(path):
            if code != 0 or scenario.is_run:
                v.append(f"[rerun-output] {name} is missing after the rerun")
            continue
        problems = differences(read_output(path, kind), info.reference[name], exact_files=True)
        if (
            kind == "h5"
            and not problems
            and (code != 0 or scenario.is_run)
            and raw_contents(path) != info.reference_bytes[name]
        ):
            problems = ["the HDF5 file's bytes differ from the clean run's"]
        if problems and (code != 0 or scenario.is_run):
            v.append(f"[rerun-output] {name} after the rerun differs from a clean run's: {'; '.join(problems)}")
        elif problems and not any(p.startswith("[output") for p in v):
            v.append(f"[output-bad] exit 0 but {name} differs from a clean run's: {'; '.join(problems)}")
    left = listing(work)
    if left != info.reference_listing:
        extra = sorted(set(left) - set(info.reference_listing))
        missing = sorted(set(info.reference_listing) - set(left))
        when = "after the rerun" if code != 0 or scenario.is_run else "after the run (exit 0)"
        v.append(
            f"[leftover] {when} the directory holds {left}; a clean run leaves {info.reference_listing} "
            f"(extra: {extra}, missing: {missing})"
        )
    return outcome


# -------------------------------------------------------------------------- faulted runs in background


@pytest.fixture(scope="module")
def fault_outcomes(request, tmp_path_factory, numba_cache):
    """Start every selected case at once on a pool of worker threads; each test waits for its own."""
    world = World(tmp_path_factory.mktemp("faults").resolve())  # strace -P and -y see resolved paths
    (world.base / "cases").mkdir()
    selected = [
        item.callspec.params["case"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec") and "case" in item.callspec.params
    ]
    pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="fault")
    for name in dict.fromkeys(case.scenario for case in selected):  # clean and counting runs first
        pool.submit(_prepare_quietly, world, name)
    futures = {case: pool.submit(run_case, world, case) for case in selected}
    try:
        yield futures
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _prepare_quietly(world: World, name: str) -> None:
    try:
        world.info(name)
    except BaseException:  # noqa: BLE001 -- kept by World.info and raised in every case of this command
        pass


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_fault(case, fault_outcomes):
    outcome = fault_outcomes[case].result()
    if outcome.skip:
        pytest.skip(outcome.skip)
    assert not outcome.violations, outcome.report()


def test_fault_plan_injects_at_least_100_faults():
    assert len(CASES) >= 100
    assert {case.errno for case in CASES} == set(ERRNOS)
