"""Durable file replacement: write under a temporary name, fsync, rename, fsync the directory.

Every rename that makes something final goes through here (a rename is durable only once its directory
is fsynced). Temporary names carry the writer's PID (``.NAME.tmp-PID``), so the next writer can tell a
killed run's leftovers from a live one's. Also the two rules every writer shares: `check_replaceable` and
`exclusive_lock`. Standard library only: it sits below every package.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from .errors import ForeignOutputError, LockedError, OutputExistsError, StoreIOError


def fsync_dir(path: str) -> None:
    """fsync a directory, so that renames and new entries in it survive a power loss (where it can)."""
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
    """Remove the ``.NAME.tmp-PID`` and ``.NAME.old-PID`` that dead processes writing ``path`` left beside it;
    returns the paths removed. An ``.old`` one is put back where ``path`` itself is missing."""
    head, tail = os.path.split(os.path.abspath(os.fspath(path).rstrip("/")))
    pattern = re.compile(rf"^\.{re.escape(tail)}\.(tmp|old)-(\d+)$")
    removed: list[str] = []
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


def write_file_atomic(path: str, write: Callable[[Any], object], what: str) -> None:
    """Write ``path`` by calling ``write(handle)`` on a temporary file, fsync, rename, fsync the directory:
    a reader sees the old file or the whole new one. A failure is a `StoreIOError`, ``path`` left as it was."""
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
    with contextlib.suppress(OSError):
        os.remove(path)


def check_replaceable(
    path: str,
    overwrite: bool,
    what: str,
    foreign: Callable[[str], str | None],
    exists: Callable[[str], bool] = os.path.lexists,
    label: str | None = None,
) -> None:
    """The one rule for an output that may exist already: nothing at ``path`` (named ``label`` in messages), or
    ``overwrite`` and ``foreign(path)`` None (it is ``what`` as we write it); else `OutputExistsError`, or
    `ForeignOutputError` naming what ``foreign`` says it is, so a user's file is never replaced."""
    if not exists(path):
        return
    label = label or os.fspath(path)
    if not overwrite:
        raise OutputExistsError.at(label)
    found = foreign(path)
    if found is not None:
        raise ForeignOutputError(
            f"{label}: exists and is not {what} written by streamwhiten ({found}), so it is not replaced, "
            "overwrite or not: move it away or choose another path",
            param="overwrite",
        )


def link_or_kind(path: str, directory: bool) -> str | None:
    """What a ``foreign`` check of `check_replaceable` says first ("a symbolic link", "a directory" where a
    file is written, ...); None when ``path`` is of the right sort and its content is to be looked at."""
    import stat

    if os.path.islink(path):
        return "a symbolic link"
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # gone meanwhile: nothing there to replace
    if stat.S_ISDIR(mode) != directory:
        return "a directory" if stat.S_ISDIR(mode) else "a file"
    if not directory and not stat.S_ISREG(mode):  # never opened: a FIFO would block
        return "not a regular file (a FIFO, a device or a socket)"
    return None


@contextmanager
def exclusive_lock(path: str, busy: Callable[[str], str], remove: bool = False):
    """Hold an exclusive ``flock`` on the file ``path`` (created if needed; released by the OS if the process
    dies) for the ``with`` block; a second holder gets `LockedError` (exit 75) saying ``busy(pid)``. With
    ``remove`` the file is deleted before release (a lock on a file deleted meanwhile is taken on the new one).
    Another user's lock file is locked read-only; where none can be made, nothing can be written, so no lock."""
    while True:
        writable = True
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise StoreIOError(f"{path}: cannot open the lock file: {exc.strerror or exc}") from exc
            try:  # another user's lock file, or a read-only directory: flock needs no write access
                fd, writable = os.open(path, os.O_RDONLY | os.O_CLOEXEC), False
            except OSError:
                yield  # no lock file and none can be made: nothing can be written here either
                return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            except OSError:
                holder = "unknown"
            os.close(fd)
            raise LockedError(busy(holder)) from None
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        if current is not None and os.path.samestat(current, os.fstat(fd)):
            break
        os.close(fd)  # the holder before removed the file after we opened it: lock the new one
    try:
        try:
            if writable:
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError as exc:
            raise StoreIOError(f"{path}: cannot write the lock file: {exc.strerror or exc}") from exc
        yield
    finally:
        if remove:
            _remove_quietly(path)
        os.close(fd)
