"""The state and its maths: no files of data, no threads, no storage libraries.

``stats`` holds the state ``(n_rows, mean, scatter)`` and the pure functions over it (``block_moments``,
``merge``, ``update``, ``covariance``); ``kernels`` the Numba kernels by concern (the package's only importer
of numba); ``model`` finalize, the transform and the model file (written through ``streamwhiten._npz``);
``staleness`` how far a published model is from a refit on the current statistics.
Everything above (``engine``, ``evaluation``, the estimator, the CLI) feeds blocks in and takes models
out. This ``__init__`` imports nothing, so the numpy-only serving path can use parts of ``core``
without loading numba.
"""
