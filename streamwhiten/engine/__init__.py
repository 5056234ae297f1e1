"""The engines that move blocks through ``core``: plan, read, reduce, merge, apply.

``fit`` holds the block plan (``plan_blocks``, ``FitPlan``), the fit loop whose worker threads reduce
blocks read from ``io`` sources into ``core.stats`` states folded in block order, and its checkpoints
and resume; ``apply`` the chunked applier (blocks transformed in order, written by a writer thread, with
progress records for a resume); ``distributed`` the Dask engine, the same per-block step and merge as
a tree reduction (dask imported lazily); ``_threads`` the worker threads and BLAS threads per worker.
Scratch buffers come from ``streamwhiten._buffers``, below this package because ``io`` aligns its
reads with them too. This ``__init__`` imports nothing.
"""
