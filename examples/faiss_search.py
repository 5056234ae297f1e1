"""Search a whitened corpus with faiss: fit once, export the map into an index, query with raw vectors.

    python examples/faiss_search.py                   # a synthetic 20,000 x 384 corpus
    python examples/faiss_search.py --rows 200000 -k 128

Needs ``pip install 'streamwhiten[faiss]'``. Steps, as a retrieval service would run them:

1. ``streamwhiten fit`` over the corpus store (one streaming pass, bounded memory);
2. ``streamwhiten export --index Flat`` writes an empty faiss index whose first stage is the whitening
   (an ``IndexPreTransform``: the ``LinearTransform`` ``y = x A + b``, then L2 normalisation), so the
   corpus and every query go through the same map without the serving code knowing about it;
3. the raw corpus vectors are added, and raw queries searched, by inner product (cosine after whitening).

The script checks the neighbours faiss returns against the same search done in numpy with
the model's own affine map and prints the overlap, which should be 1.0 (ties apart).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np


def streamwhiten(*args: str) -> None:
    """Run the command line as a batch job would (``python -m streamwhiten`` is the same program)."""
    subprocess.run([sys.executable, "-m", "streamwhiten", *args], check=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="corpus rows (synthetic, anisotropic)")
    parser.add_argument("--dim", type=int, default=384, help="embedding width")
    parser.add_argument("-k", type=int, default=64, help="whitened dimensions kept")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--workdir", help="where the store, model and index go (default: a temporary directory)")
    args = parser.parse_args(argv)

    import faiss

    from streamwhiten import load_model
    from streamwhiten.synthetic import generate_rows, write_store

    with tempfile.TemporaryDirectory() as scratch:
        work = args.workdir or scratch
        os.makedirs(work, exist_ok=True)
        corpus_spec = write_store(os.path.join(work, "corpus.h5"), args.rows, args.dim, seed=0)
        model = os.path.join(work, "model.npz")
        index_path = os.path.join(work, "corpus.faiss")
        streamwhiten("fit", corpus_spec, "-o", model, "--overwrite", "--quiet")
        streamwhiten(
            "export", model, "-o", index_path, "-k", str(args.k), "--normalize", "--index", "Flat", "--overwrite"
        )

        index = faiss.read_index(index_path)  # IndexPreTransform(whitening, IndexFlatIP)
        corpus = generate_rows(args.rows, args.dim, seed=0)
        index.add(corpus)  # raw vectors in: the index whitens them
        queries = generate_rows(args.queries, args.dim, seed=1)
        _, found = index.search(queries, 10)

        # The same search in numpy, through the same map (the model's, at the exported setting).
        whiten = load_model(model).as_affine(n_components=args.k, normalize=True)
        scores = whiten.transform(queries) @ whiten.transform(corpus).T
        expected = np.argsort(-scores, axis=1, kind="stable")[:, :10]
        overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, expected, strict=False)])
        print(
            f"{index.ntotal} vectors of {args.dim} dims indexed as {args.k}-dim whitened unit vectors; "
            f"top-10 overlap with the numpy search: {overlap:.3f}"
        )
    return 0 if overlap >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
