"""How good a whitening is on labelled pairs, and which setting is best.

``evaluate`` reads labelled sentence pairs (two embedding stores and a score column) and scores a model
on them (Spearman and Pearson of cosine similarities); ``tune`` searches the beta x gamma x k grid in one
pass over the pairs, from a model's saved statistics (no refit); ``report`` draws the spectrum and the
grid as one HTML page (matplotlib imported lazily). Above ``core``, ``io`` and ``engine``; this
``__init__`` imports nothing.
"""
