"""Step 2 of the pipeline: neighbouring datasets, as the constraints they put on the design.

The mean-noise constraint (10) needs, for each class k, the set of mean changes
``v = mu_k(D) - mu_k(D')`` over all neighbours D'. Under label flips there are N(K-1)
neighbours but only N distinct vectors per class (up to sign, which the constraint ignores):

* a point of class k flipped out:   v = (x_n - mu_k) / (N_k - 1)
* a point of class j != k flipped in: v = (mu_k - x_n) / (N_k + 1)
* every other flip leaves mu_k unchanged.

(``mu_k``, ``N_k`` are taken before the flip.) The paper's (10) lists only the first kind; the
second is needed too, since a flip into class k moves its mean. The constraint
``v^T Gamma v <= c`` is symmetric in v, so rows are returned as ``(x_n - mu_k) / s_n``.

The weight mapping needs the count vectors of the neighbours, ``S'(D)`` (14): one count moved
from class a to class b (K(K-1) vectors) under label flip, one count removed (K vectors) under
remove-one, one added under add-one (29).
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

__all__ = [
    "Adjacency",
    "ADJACENCY_DESCRIPTIONS",
    "class_neighbour_vectors",
    "neighbour_counts",
]


class Adjacency(StrEnum):
    """Neighbouring relations between datasets."""

    LABEL_FLIP = "label-flip"
    CHANGE_ONE_RECORD = "change-one-record"
    REMOVE_ONE = "remove-one"
    ADD_ONE = "add-one"
    REPLACE_ONE = "replace-one"


ADJACENCY_DESCRIPTIONS = {
    Adjacency.LABEL_FLIP: "datasets differ in the class label of one record; features are public",
    Adjacency.CHANGE_ONE_RECORD: (
        "datasets differ in the features of one record (labels fixed), rows clipped to "
        "||x|| <= B"
    ),
    Adjacency.REMOVE_ONE: (
        "one dataset is the other with one record removed, rows clipped to ||x|| <= B"
    ),
    Adjacency.ADD_ONE: "one dataset is the other with one record added, rows clipped to ||x|| <= B",
    Adjacency.REPLACE_ONE: (
        "datasets differ in one record (features and label), rows clipped to the public bound"
    ),
}


def class_neighbour_vectors(
    X: np.ndarray,
    codes: np.ndarray,
    k: int,
    mean_k: np.ndarray,
    count_k: int,
    *,
    leavers: bool = True,
    joiners: bool = True,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Distinct mean changes of class ``k`` over its neighbours (F1), as rows.

    Parameters
    ----------
    X, codes : the dataset.
    k : class index.
    mean_k, count_k : mean and size of class k in D.
    leavers : include points of class k leaving it (label flip, remove-one).
    joiners : include points of other classes joining it (label flip).
    out : optional (N, d) buffer reused for the result when both kinds are included
        (saves a large allocation per class on big datasets).

    Returns
    -------
    ndarray of shape (m, d)
        ``(x_n - mu_k)/(N_k - 1)`` for members and ``(x_n - mu_k)/(N_k + 1)`` for the others.
    """
    member = codes == k
    if leavers and joiners:
        scale = np.where(member, 1.0 / (count_k - 1), 1.0 / (count_k + 1))
        V = np.subtract(X, mean_k, out=out)
        V *= scale[:, None]
        return V
    if leavers:
        return (X[member] - mean_k) / (count_k - 1)
    if joiners:
        return (X[~member] - mean_k) / (count_k + 1)
    return np.empty((0, X.shape[1]))


def neighbour_counts(counts: np.ndarray, adjacency: Adjacency) -> np.ndarray:
    """Count vectors of the neighbours of a dataset with class counts ``counts`` (S'(D)).

    Returns an (m, K) integer array: K(K-1) rows for label flips (a count moved from class a
    to class b, only from classes with at least 2 rows so every class stays non-empty), K rows
    for remove-one / add-one, none for change-one-record (counts never change).
    """
    counts = np.asarray(counts, dtype=np.int64)
    K = counts.shape[0]
    eye = np.eye(K, dtype=np.int64)
    if adjacency == Adjacency.LABEL_FLIP:
        rows = [counts - eye[a] + eye[b] for a in range(K) for b in range(K) if a != b
                and counts[a] >= 2]
        return np.array(rows, dtype=np.int64).reshape(-1, K)
    if adjacency == Adjacency.REMOVE_ONE:
        return np.array([counts - eye[a] for a in range(K) if counts[a] >= 2]).reshape(-1, K)
    if adjacency == Adjacency.ADD_ONE:
        return counts + eye
    if adjacency == Adjacency.CHANGE_ONE_RECORD:
        return np.empty((0, K), dtype=np.int64)
    raise ValueError(f"no neighbour counts for adjacency {adjacency.value!r}")
