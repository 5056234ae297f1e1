"""The state and its maths: no files of data, no threads, no storage libraries.

``stats`` (the state and ``block_moments``, ``merge``, ``update``, ``covariance``), ``kernels`` (the only
importer of numba), ``model`` (finalize, the transform, the model file), ``staleness``. This ``__init__``
imports nothing, so the numpy-only serving path can use parts of ``core`` without loading numba.
"""
