"""``python -m streamwhiten`` and the ``streamwhiten`` command: the signal handlers go in before the CLI and
its libraries are imported, so a signal while starting ends it cleanly (exit 130, one line).
"""

import sys


def main() -> int:
    from .cli import _interrupt

    _interrupt.install()
    from .cli.app import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
