"""The ``streamwhiten`` command group (a module per command), and the entry point that maps every way out
to one line on stderr and an exit code (a `StreamwhitenError` carries its own). Shell completion is click's.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

import click

from .. import __version__
from ..errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_IO,
    PATH_ERRNOS,
    InterruptedRunError,
    NothingToDoError,
    StreamwhitenError,
)
from . import _interrupt
from ._flags import cli_message
from .apply import apply
from .codes import codes
from .demo import demo
from .evaluate import eval_
from .export import EXPORT_FORMATS, export_
from .fit import fit
from .info import info
from .report import report
from .run import LOG_DATE, LOG_FORMAT, run
from .staleness import staleness
from .tune import tune

#: The environment variable click's shell completion reads (``_STREAMWHITEN_COMPLETE=bash_source``).
COMPLETE_VAR = "_STREAMWHITEN_COMPLETE"


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="streamwhiten")
def cli():
    """Fit and apply whitening transforms to embedding stores larger than memory.

    \b
    A first run:
      streamwhiten demo                                       # the whole job on a built-in example
      streamwhiten fit corpus.h5:/emb -o model.npz            # one streaming pass
      streamwhiten apply model.npz corpus.h5:/emb -o out.zarr -k 256 --normalize
    For search: eval and tune take --queries/--corpus/--qrels (tune --max-bytes chooses the storage).
    Shell completion (bash; zsh_source and fish_source for those shells):
      eval "$(_STREAMWHITEN_COMPLETE=bash_source streamwhiten)"
    """


#: Each command's line in the bare command's list: whole, and within an 80-column line.
SUMMARIES = {
    "fit": "Fit a whitening model on stores, in one streaming pass.",
    "apply": "Transform a store with a model; write the vectors or codes.",
    "info": "Print a model's setting, spectrum and published version.",
    "export": "Write a model's map for numpy, torch, faiss, ONNX or ST.",
    "demo": "Run the whole job on a built-in example.",
    "run": "Run a batch job (job.toml): fit or update, apply, publish.",
    "staleness": "Measure how far the published map is from the statistics.",
    "eval": "Score raw and whitened vectors on pairs or a retrieval task.",
    "tune": "Choose beta, gamma, k and, for search, a storage or code.",
    "report": "Draw the spectrum, tuning maps and retrieval frontier.",
    "codes": "Train a vector code (eigen:24, ...) as a model's storage.",
}

for _command in (fit, apply, info, export_, demo, run, staleness, eval_, tune, report, codes):
    _command.short_help = SUMMARIES[_command.name or ""]
    cli.add_command(_command)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is when a record is logged (in-process runs redirect it)."""

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:  # StreamHandler.__init__ assigns it
        pass


def _configure_logging() -> None:
    logger = logging.getLogger("streamwhiten")
    if not any(getattr(h, "_streamwhiten", False) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT, LOG_DATE))
        handler._streamwhiten = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    # progress notes are for `run`'s log; other commands print a summary and, on stderr, only failures
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    logging.raiseExceptions = False  # stderr that cannot be written: no traceback about it on stderr
    # zarr's pending reads after a failed decode are reported as destroyed at exit: noise
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; map every failure to one line on stderr and an exit code."""
    installed = _interrupt.install()  # already done by the entry point, except when called in-process
    try:
        return _main(argv)
    finally:
        if installed:
            _interrupt.uninstall()


def _complete() -> int:
    """Shell completion, as click's own entry point does it (``_STREAMWHITEN_COMPLETE=bash_source``)."""
    from click.shell_completion import shell_complete

    return shell_complete(cli, {}, "streamwhiten", COMPLETE_VAR, os.environ[COMPLETE_VAR])


def _main(argv: Sequence[str] | None) -> int:
    debug = bool(os.environ.get("STREAMWHITEN_DEBUG"))
    args = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get(COMPLETE_VAR):
        return _complete()
    try:
        try:
            _configure_logging()
            if _interrupt.requested.is_set():  # a signal while the program was starting
                raise KeyboardInterrupt
            _interrupt.start_immediate()
            if not args:  # bare `streamwhiten`: the help, not a usage error
                args = ["--help"]
            # cli.main() would print an empty line on stderr before turning an interruption into Abort.
            with cli.make_context("streamwhiten", args) as ctx:
                cli.invoke(ctx)
            _interrupt.hold()
            code = 0
        except BaseException as exc:  # noqa: B036 - every way out is one line and an exit code
            _interrupt.hold()  # a further signal must not interrupt the report
            code = _report(exc, debug)
    except KeyboardInterrupt as late:  # a signal in the instant before hold(): report what was being reported
        _interrupt.hold()
        code = _report(late.__context__ if late.__context__ is not None else late, debug)
    return _finish(code)


def _finish(code: int) -> int:
    """No signal can kill the process from here (``_interrupt.finish``); one after the work only adds a note."""
    if _interrupt.finish() and code == 0:
        click.echo(
            f"streamwhiten: {_interrupt.signal_name()} received too late to stop the command: its work is complete",
            err=True,
        )
    return code


def _one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line, without secrets, parameters written as flags (`cli_message`)."""
    text = " ".join(cli_message(exc).split())
    remote = sys.modules.get("streamwhiten.io.remote")  # loaded when a URL or storage option was used
    return remote.scrub(text) if remote is not None else text


def _report(exc: BaseException, debug: bool) -> int:
    """The one line on stderr for ``exc``, and its exit code."""
    if isinstance(exc, click.exceptions.Exit):
        return exc.exit_code
    if isinstance(exc, click.ClickException):
        hint = " (see --help)" if isinstance(exc, click.UsageError) else ""
        click.echo(f"streamwhiten: error: {exc.format_message()}{hint}", err=True)
        return exc.exit_code
    if isinstance(exc, (click.exceptions.Abort, KeyboardInterrupt)):
        click.echo(f"streamwhiten: interrupted by {_interrupt.signal_name()}", err=True)
        return EXIT_INTERRUPTED
    if isinstance(exc, NothingToDoError):
        late = (
            f" ({_interrupt.signal_name()} received too late to stop the command)"
            if _interrupt.requested.is_set()
            else ""
        )
        click.echo(f"streamwhiten: {_one_line(exc)}{late}", err=True)
        return exc.exit_code
    if isinstance(exc, InterruptedRunError):
        click.echo(f"streamwhiten: stopped by {_interrupt.signal_name()}: {_one_line(exc)}", err=True)
        return exc.exit_code
    if debug and isinstance(exc, Exception):
        raise exc
    if isinstance(exc, StreamwhitenError):
        click.echo(f"streamwhiten: error: {_one_line(exc)}", err=True)
        return exc.exit_code
    if isinstance(exc, OSError):
        click.echo(f"streamwhiten: error: {_one_line(exc)}", err=True)
        return EXIT_BAD_INPUT if exc.errno in PATH_ERRNOS else EXIT_IO
    if isinstance(exc, Exception):  # a bug: still one line, with a hint how to see more
        click.echo(
            f"streamwhiten: internal error: {exc.__class__.__name__}: {_one_line(exc)} "
            f"(set STREAMWHITEN_DEBUG=1 for the traceback)",
            err=True,
        )
        return EXIT_INTERNAL
    raise exc  # SystemExit and the like


__all__ = ["COMPLETE_VAR", "EXPORT_FORMATS", "cli", "main"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
