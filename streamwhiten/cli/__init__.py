"""The ``streamwhiten`` command: the only code that prints, exits or reads the terminal.

``app`` holds the click commands (arguments checked against ``streamwhiten.params``, progress bars,
logging, ``--json``, one-line errors and exit codes); ``_interrupt`` turns SIGINT/SIGTERM into a clean
stop from the first line of start-up; ``_progress`` shows the phases the library reports (a bar or spinner
on a terminal, one timed line each when piped); ``demo`` is ``streamwhiten demo``. Everything else in the package
is library code that raises and reports progress through callbacks; nothing imports this package.

This ``__init__`` stays light so that ``__main__`` can install the signal handlers (``_interrupt``)
before click and the libraries are imported; ``main`` is loaded from ``app`` on first use.
"""

__all__ = ["main"]


def __getattr__(name: str):
    if name == "main":
        from .app import main

        return main
    raise AttributeError(f"module 'streamwhiten.cli' has no attribute {name!r}")
