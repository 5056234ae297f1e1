"""The user's files around a refused command: a snapshot of everything under a directory, a run that checks
the exit code, the one line on stderr and that no file of the user's changed, and the small rows those
tests use (the ``small_model`` fixture of conftest.py is fitted on them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
from conftest import REPO, anisotropic, run_command

SMALL = anisotropic(400, 8, seed=23).astype(np.float32)


def snapshot(directory) -> dict:
    """``{relative path: (kind, size, sha256 or None)}`` of everything under ``directory``, without opening
    anything but regular files (and those only when readable)."""
    import hashlib
    import stat

    found = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            status = os.lstat(path)
            digest = None
            if stat.S_ISREG(status.st_mode) and os.access(path, os.R_OK):
                with open(path, "rb") as handle:
                    digest = hashlib.sha256(handle.read()).hexdigest()
            found[os.path.relpath(path, directory)] = (
                stat.S_IFMT(status.st_mode),
                status.st_size if stat.S_ISREG(status.st_mode) else 0,
                stat.S_IMODE(status.st_mode),
                digest,
            )
    return found


def run_checked(tmp_path, args, code, pattern, prefix=(), outputs=()):
    """Run ``streamwhiten ARGS`` in ``tmp_path``; assert exit ``code``, one stderr line matching
    ``pattern``, and every file as it was (``outputs``: names the command may add)."""

    def mine(found):
        return {name: entry for name, entry in found.items() if name.split(os.sep)[0] not in outputs}

    before = mine(snapshot(tmp_path))
    if prefix:  # another user (setpriv ...): a process of its own
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        command = [*prefix, sys.executable, "-m", "streamwhiten", *map(str, args)]
        result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    else:
        result = run_command(*args, cwd=tmp_path)
    lines = result.stderr.splitlines()
    problems = []
    if result.returncode != code:
        problems.append(f"exit code {result.returncode}, expected {code}")
    if len(lines) != 1 or not lines[0].startswith("streamwhiten:"):
        problems.append(f"stderr should be one line 'streamwhiten: ...', got {lines!r}")
    elif not re.search(pattern, lines[0]):
        problems.append(f"the line does not match {pattern!r}")
    after = mine(snapshot(tmp_path))
    if after != before:
        changed = sorted(set(after.items()) ^ set(before.items()))
        problems.append(f"the user's files changed: {changed[:6]}")
    assert not problems, f"streamwhiten {' '.join(map(str, args))}: " + "; ".join(problems) + f"\n{result.stderr!r}"
    return result
