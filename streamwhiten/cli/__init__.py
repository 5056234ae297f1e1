"""The ``streamwhiten`` command: the only code that prints, exits or reads the terminal; nothing imports it.

Light, so that ``__main__`` installs the signal handlers (``_interrupt``) before click and the libraries
are imported; ``main`` is loaded from ``app`` on first use.
"""

__all__ = ["main"]


def __getattr__(name: str):
    if name == "main":
        from .app import main

        return main
    raise AttributeError(f"module 'streamwhiten.cli' has no attribute {name!r}")
