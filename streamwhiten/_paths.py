"""Local paths a command reads: the one check that each can be read, and what makes two paths one file.

Every local path read (an input store, a vector of scores, a model file, a checkpoint, an exported map,
a job file) goes through `check_readable` before it is opened, so that:

- a missing path is bad input (exit 2), and a path like ``file.h5/name`` that runs through a file says how
  to name something inside a store (``file.h5:/name``);
- anything but a regular file or a directory (a FIFO, a device, a socket) is refused at once, instead of
  blocking on the open or reading without end;
- a path that may not be read (permissions) is an I/O error (exit 74), as any other failed read; a path that
  cannot name a file (a symbolic link loop, a name too long: ``errors.PATH_ERRNOS``) is bad input.

A file's identity is its ``(device, inode)`` (`file_identity`): a symlink and a hard link of one
file are that file, however the path is spelled. Standard library only: the serving path uses it too.
"""

from __future__ import annotations

import os
import stat

from .errors import PATH_ERRNOS, BadInputError, StoreIOError

#: What a path is when it is neither a regular file nor a directory, for messages.
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _inside_a_file(path: str) -> str:
    """For a missing ``path`` that runs through a file (``store.h5/name``), how to name what is inside it."""
    head = path.rstrip("/")
    rest: list[str] = []
    while head and head not in ("/", "."):
        head, tail = os.path.split(head)
        rest.insert(0, tail)
        if head and os.path.isfile(head):
            inner = "/".join(rest)
            return f"; {head} is a file: to name {inner!r} inside it, write {head}:/{inner}"
    return ""


def check_readable(path: str | os.PathLike[str], what: str = "", directory: bool = True) -> os.stat_result:
    """The status of the local ``path`` to be read, or the error that says why it cannot be.

    ``what`` names the path in messages ("model file", ...; nothing for an input store); ``directory``:
    whether a directory is acceptable (a store) or only a regular file (a model file, a job file).
    Raises `BadInputError` for a missing path, or one that is not a regular file (or directory),
    and `StoreIOError` (exit 74) for one that may not be read.
    """
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
