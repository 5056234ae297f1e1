"""streamwhiten: streaming BERT-whitening for embedding collections larger than memory.

``import streamwhiten`` stays light: the estimator (which pulls in numba) is imported on first use.
"""

__version__ = "0.2.0"

__all__ = ["Whitener", "release_buffers", "__version__"]


def __getattr__(name):
    if name == "Whitener":
        from .whitener import Whitener

        return Whitener
    if name == "release_buffers":
        from ._buffers import release_buffers

        return release_buffers
    raise AttributeError(f"module 'streamwhiten' has no attribute {name!r}")
