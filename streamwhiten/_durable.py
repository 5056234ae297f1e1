"""Durable file replacement: write under a temporary name, fsync, rename, fsync the directory.

A rename is only durable once the directory holding it is fsynced, so every rename that makes
something final (a model file, a checkpoint, a progress record, an output) goes through here.
Temporary names carry the writer's PID (``.NAME.tmp-PID``), so the next writer of the same path can
tell the leftovers of a killed run (their process is gone) from a run still writing, and remove them.

It sits below every package (stdlib only): stores (``io``), model files and checkpoints (``_npz``) and
exports all write through it, and the serving path reads model files without importing ``io``.
"""

from __future__ import annotations

import os
import re
import shutil

from .errors import StoreIOError


def fsync_dir(path: str) -> None:
    """fsync a directory, so that renames and new entries in it survive a power loss.

    Ignored where the file system cannot fsync a directory (EINVAL): nothing more can be done there.
    """
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (22, 95):  # EINVAL, EOPNOTSUPP: the file system does not sync directories
            raise
    finally:
        os.close(fd)


def temp_path(path: str, kind: str = "tmp") -> str:
    """``.NAME.KIND-PID`` beside ``path``: where this process writes ``path`` before renaming it."""
    head, tail = os.path.split(os.path.abspath(os.fspath(path).rstrip("/")))
    return os.path.join(head, f".{tail}.{kind}-{os.getpid()}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_temps(path: str) -> list[str]:
    """Remove what killed runs writing ``path`` left beside it; returns the paths removed.

    That is ``.NAME.tmp-PID`` (and ``.NAME.old-PID``, an output moved aside while being replaced) of
    processes that no longer exist. An ``.old`` directory is put back when ``path`` itself is missing
    (the run died between moving it aside and renaming the new one in), so nothing is lost.
    """
    head, tail = os.path.split(os.path.abspath(os.fspath(path).rstrip("/")))
    pattern = re.compile(rf"^\.{re.escape(tail)}\.(tmp|old)-(\d+)$")
    removed = []
    try:
        names = os.listdir(head)
    except OSError:
        return removed
    for name in names:
        match = pattern.match(name)
        if not match or _alive(int(match.group(2))):
            continue
        leftover = os.path.join(head, name)
        try:
            if match.group(1) == "old" and not os.path.lexists(os.path.join(head, tail)):
                os.rename(leftover, os.path.join(head, tail))
                continue
            if os.path.isdir(leftover) and not os.path.islink(leftover):
                shutil.rmtree(leftover)
            else:
                os.remove(leftover)
            removed.append(leftover)
        except OSError:
            pass  # removed meanwhile, or not ours to remove: harmless either way
    return removed


def write_file_atomic(path: str, write, what: str) -> None:
    """Write ``path`` by calling ``write(handle)`` on a temporary file, fsync, rename, fsync the directory.

    A reader sees the old file or the whole new one. On failure the temporary file is removed, ``path``
    keeps its old content, and :class:`StoreIOError` names ``path`` and says whether an old file is kept.
    """
    path = os.fspath(path)
    remove_stale_temps(path)
    temp = temp_path(path)
    try:
        with open(temp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except OSError as exc:
        _remove_quietly(temp)
        kept = f"the previous {what} is kept" if os.path.exists(path) else "nothing was written"
        raise StoreIOError(f"{path}: cannot write {what}: {exc.strerror or exc}; {kept}") from exc
    except BaseException:
        _remove_quietly(temp)
        raise
    try:
        fsync_dir(os.path.dirname(os.path.abspath(path)))
    except OSError as exc:
        raise StoreIOError(
            f"{path}: {what} written, but its directory could not be synced ({exc.strerror or exc}): "
            "it may not survive a power loss"
        ) from exc


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
