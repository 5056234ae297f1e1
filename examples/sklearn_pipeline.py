"""Whitening inside a scikit-learn Pipeline, tuned by GridSearchCV, with pandas output.

    python examples/sklearn_pipeline.py

Anisotropic embeddings hide small, useful directions under a few large ones. Here two classes differ
only along a direction of little variance; a linear classifier on the raw vectors is dominated by the
large directions' scale, and whitening puts every direction on the same footing. ``GridSearchCV``
picks beta, gamma and k like any other hyper-parameters (every candidate is a real refit; from the
command line, ``streamwhiten tune`` scores every setting from one pass instead).
"""

from __future__ import annotations

import sys

import numpy as np


def make_embeddings(n_rows: int = 3000, dim: int = 32, seed: int = 0):
    """Vectors in a narrow cone (a large common mean, a few dominant directions) whose labels live in a
    low-variance direction."""
    rng = np.random.default_rng(seed)
    scales = np.geomspace(20.0, 0.2, dim)
    basis, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    latent = rng.standard_normal((n_rows, dim)) * scales
    labels = (latent[:, -3] > 0).astype(int)  # the signal sits in a quiet direction
    rows = latent @ basis.T + 50.0 * rng.standard_normal(dim)  # rotated, far from the origin
    return rows.astype(np.float32), labels


def main() -> int:
    import pandas as pd
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV, train_test_split
    from sklearn.pipeline import Pipeline

    from streamwhiten import Whitener

    rows, labels = make_embeddings()
    columns = [f"emb{i}" for i in range(rows.shape[1])]
    X = pd.DataFrame(rows, columns=columns)
    X_train, X_test, y_train, y_test = train_test_split(X, labels, test_size=0.3, random_state=0)

    raw = LogisticRegression(C=0.01, max_iter=2000).fit(X_train, y_train)
    pipeline = Pipeline([("whiten", Whitener()), ("classify", LogisticRegression(C=0.01, max_iter=2000))])
    pipeline.set_output(transform="pandas")
    search = GridSearchCV(pipeline, {"whiten__gamma": [0.0, 0.5, 1.0], "whiten__n_components": [8, 32]}, cv=3)
    search.fit(X_train, y_train)

    whitened = search.best_estimator_[:-1].transform(X_test.head(3))
    print(f"raw vectors:       test accuracy {raw.score(X_test, y_test):.3f}")
    print(f"whitened pipeline: test accuracy {search.score(X_test, y_test):.3f} with {search.best_params_}")
    print(
        f"whitened columns:  {list(whitened.columns[:4])} ... ({whitened.shape[1]} in all), index kept: "
        f"{list(whitened.index) == list(X_test.head(3).index)}"
    )
    return 0 if search.score(X_test, y_test) > raw.score(X_test, y_test) + 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
