"""``python -m streamwhiten`` and the ``streamwhiten`` command.

The signal handlers go in before the CLI and its libraries are imported, so a SIGINT/SIGTERM that
arrives while the program starts ends it cleanly (exit 130, one line) instead of half-way; and the CLI
ignores both once it has said how it ended (``_interrupt.finish``), so none can kill the process while
the interpreter shuts down.
"""

import sys


def main() -> int:
    from .cli import _interrupt

    _interrupt.install()
    from .cli.app import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
