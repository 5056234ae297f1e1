"""One exception family for streamwhiten; each kind carries the exit code the CLI uses.

Only the CLI turns them into a one-line message and an exit code. A message names the library's parameters
(``keep_columns``, ``overwrite=True``), which the error carries (`StreamwhitenError.params`) for the CLI
to write as flags (``--keep-columns``).
"""

import errno
from typing import Any, Protocol

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_NOTHING_TO_DO = 3
EXIT_UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE: the Dask cluster cannot be reached or lost its workers
EXIT_IO = 74  # sysexits EX_IOERR: disk full, unwritable output
EXIT_LOCKED = 75  # sysexits EX_TEMPFAIL: another run of the same job, or writing the same output, holds the lock
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell convention

#: The errno values that say the path given is wrong (a link loop, a name too long), not the disk: bad input.
PATH_ERRNOS = (errno.ELOOP, errno.ENAMETOOLONG)


class StreamwhitenError(Exception):
    """Base class: a failure the user can act on, reported as one line; ``params``: the parameters the
    message names, as written in it (``overwrite=True``)."""

    exit_code = EXIT_INTERNAL

    def __init__(self, *args: object, param: str | tuple[str, ...] | None = None) -> None:
        super().__init__(*args)
        self.params: tuple[str, ...] = (param,) if isinstance(param, str) else tuple(param or ())

    @property
    def param(self) -> str | None:
        """The first parameter the message names, None where it names none."""
        return self.params[0] if self.params else None


class BadInputError(StreamwhitenError, ValueError):
    """The data, a parameter or a path given by the user is unusable."""

    exit_code = EXIT_BAD_INPUT


class NonFiniteError(BadInputError):
    """A row holds NaN or Inf; ``row`` is its index where known."""

    def __init__(self, message: str, row: int | None = None, param: str | tuple[str, ...] | None = None) -> None:
        super().__init__(message, param=param)
        self.row = row


class ValuesTooLargeError(BadInputError):
    """Finite values overflow the arithmetic (when centred, whitened or cast); ``row`` is the first
    such row where known, ``detail`` the message without the row."""

    def __init__(self, detail: str, row: int | None = None, label: str | None = None) -> None:
        where = f"row {row}: " if row is not None else ""
        super().__init__(f"{label}: {where}{detail}" if label else f"{where}{detail}")
        self.detail, self.row = detail, row


class CorruptStoreError(BadInputError):
    """A store's data is damaged: a chunk that cannot be decoded, a truncated chunk or file."""


class MissingChunkError(CorruptStoreError):
    """A chunk of a store is missing (a store with a hole); ``rows`` is the range it covers where known."""

    def __init__(
        self, message: str, rows: tuple[int, int] | None = None, param: str | tuple[str, ...] | None = None
    ) -> None:
        super().__init__(message, param=param)
        self.rows = rows


class ModelFileError(BadInputError):
    """A model or checkpoint file is missing, corrupt, truncated or of an incompatible version."""


class OutputExistsError(BadInputError):
    """The output path exists and ``overwrite`` was not given."""

    @classmethod
    def at(cls, path: object) -> "OutputExistsError":
        """The error for the existing output ``path``: the one place that says how to replace it."""
        return cls(f"{path}: already exists (pass overwrite=True to replace it)", param="overwrite")


class ForeignOutputError(OutputExistsError):
    """The output path holds something this tool did not write (a user's file or directory, or an output
    of another kind): ``overwrite`` replaces only an output of the same kind that streamwhiten wrote."""


class NotFittedError(StreamwhitenError, AttributeError):
    """The estimator was used before it saw any data."""

    exit_code = EXIT_BAD_INPUT


class Report(Protocol):
    """A typed result that turns itself into plain JSON values (what ``--json`` prints)."""

    def to_json(self) -> dict[str, Any]: ...


class NothingToDoError(StreamwhitenError):
    """Everything is already up to date; ``report``: the typed report of the run that found so (None: none)."""

    exit_code = EXIT_NOTHING_TO_DO

    def __init__(self, message: str, report: Report | None = None, param: str | tuple[str, ...] | None = None) -> None:
        super().__init__(message, param=param)
        self.report = report


class LockedError(StreamwhitenError):
    """Another run of the same job, or another run writing the same output, is in progress."""

    exit_code = EXIT_LOCKED


class StoreIOError(StreamwhitenError, OSError):
    """Reading or writing a store failed (disk full, permission, I/O error)."""

    exit_code = EXIT_IO


class InterruptedRunError(StreamwhitenError):
    """The run was stopped by a signal after saving what it had."""

    exit_code = EXIT_INTERRUPTED


class ClusterError(StreamwhitenError):
    """The Dask scheduler cannot be reached, or its workers kept dying: no result was produced."""

    exit_code = EXIT_UNAVAILABLE
