"""Local paths a command reads: the one check that each can be read, and what makes two paths one file.

Every local path read goes through `check_readable` before it is opened: a missing path is bad input
(exit 2, saying how to name something inside a store), anything but a regular file or directory is
refused at once (a FIFO would block), a path that may not be read is an I/O error (exit 74). A file's
identity is its ``(device, inode)`` (`file_identity`). Standard library only: the serving path uses it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from .errors import PATH_ERRNOS, BadInputError, StoreIOError

#: What a path is when it is neither a regular file nor a directory, for messages.
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def split_above(path: str, found: Callable[[str], bool]) -> tuple[str, str] | None:
    """``(the nearest path above path that found() accepts, the rest of path below it)``, or None."""
    head = path.rstrip("/")
    rest: list[str] = []
    while head and head not in ("/", "."):
        head, tail = os.path.split(head)
        rest.insert(0, tail)
        if head and found(head):
            return head, "/".join(rest)
    return None


def _inside_a_file(path: str) -> str:
    """For a missing ``path`` that runs through a file (``store.h5/name``), how to name what is inside it."""
    if (above := split_above(path, os.path.isfile)) is None:
        return ""
    head, inner = above
    return f"; {head} is a file: to name {inner!r} inside it, write {head}:/{inner}"


def check_readable(path: str | os.PathLike[str], what: str = "", directory: bool = True) -> os.stat_result:
    """The status of the local ``path`` to be read (``what`` names it in messages; ``directory``: whether a
    directory is acceptable), else `BadInputError` (missing, not a file) or `StoreIOError` (may not be read)."""
    path = os.fspath(path)
    named = f"{path}: {what}" if what else f"{path}:"
    try:
        status = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        if os.path.islink(path):
            raise BadInputError(f"{named} is a broken symbolic link (to {os.readlink(path)})") from None
        raise BadInputError(
            f"{named} {'not found' if what else 'no such file or directory'}{_inside_a_file(path)}"
        ) from None
    except PermissionError:
        raise StoreIOError(f"{named} cannot be read: permission denied") from None
    except OSError as exc:
        if exc.errno in PATH_ERRNOS:  # the name itself is wrong, not the disk
            raise BadInputError(f"{named} cannot be opened: {exc.strerror or exc}") from None
        raise StoreIOError(f"{named} cannot be read: {exc.strerror or exc}") from None
    mode = status.st_mode
    if stat.S_ISDIR(mode):
        if not directory:
            raise BadInputError(f"{named} is a directory, not a file")
        if not os.access(path, os.R_OK | os.X_OK):
            raise StoreIOError(f"{named} cannot be read: permission denied (directory)")
        return status
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        wanted = "a regular file or directory" if directory else "a regular file"
        raise BadInputError(f"{named} is {kind}, not {wanted}; give the file itself")
    if not os.access(path, os.R_OK):
        raise StoreIOError(f"{named} cannot be read: permission denied")
    return status


def read_file(path: str, what: str) -> bytes:
    """The bytes of the small local file ``path`` (a job file, a manifest), checked by `check_readable` first;
    a failed read is a `StoreIOError` naming ``what``."""
    check_readable(path, what, directory=False)
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise StoreIOError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None


def file_identity(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """``(device, inode)`` of the file or directory at ``path`` (symlinks followed), or None if it has none."""
    try:
        status = os.stat(path)
    except (OSError, ValueError):
        return None
    return status.st_dev, status.st_ino
