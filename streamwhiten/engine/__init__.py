"""The engines that move blocks through ``core``: plan, read, reduce, merge, apply.

``fit`` (the block plan, the fit loop, checkpoints and resume), ``apply`` (the chunked applier),
``distributed`` (the Dask engine), ``_threads`` (worker threads, BLAS threads per worker), ``engines``
(one interface over them). This ``__init__`` imports nothing.
"""
