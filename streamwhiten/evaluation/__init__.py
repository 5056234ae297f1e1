"""How good a whitening is, on labelled pairs or for search, and which setting (and storage) is best.

``evaluate`` reads labelled sentence pairs (two embedding stores and a score column) and scores a model
on them (Spearman and Pearson of cosine similarities); ``tune`` searches the beta x gamma x k grid in one
pass over the pairs, from a model's saved statistics (no refit); ``report`` draws the spectrum, the grid
and a retrieval frontier as one HTML page (matplotlib imported lazily). For search: ``qrels`` reads the
relevance judgements, ``search`` is the exact search (float and bits, streamed), ``retrieval`` scores it
(``evaluate_retrieval``; ``self_matches`` finds the queries that are corpus rows) and ``sweep`` tunes the
setting and the storage under a byte budget. Above
``core``, ``io`` and ``engine``; this ``__init__`` imports nothing.
"""
