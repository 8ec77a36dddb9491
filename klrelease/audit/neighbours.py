"""Which neighbouring datasets an audit examines.

For a dataset D and a neighbouring relation, :func:`select_neighbours` returns datasets D'.
When D has at most ``max_pairs`` neighbours of the relation (label flips of a small dataset,
or removals) all of them are returned. Otherwise a search starts from the most extreme
neighbours, because those are where a mechanism calibrated on the data leaks most:

* label flips (n, k -> k'): the score adds how atypical x_n is for its own class k and for the
  class k' it joins, each as a Mahalanobis distance divided by the class size (the change of
  the class mean in the class's own metric, F1), so small classes and outliers come first;
  every ordered pair of classes (k, k') keeps at least a few flips, since the law of the
  released weights depends on which two counts move;
* record-level relations (replace-one, change-one-record, add-one, remove-one): the records
  that can be added or swapped in are public extreme points, the vertices of the public box
  (or the points ``+-B e_j`` and ``+-B mu_k/||mu_k||`` of the public ball); rows are removed or
  replaced starting from the most atypical rows of the smallest classes.

A neighbour is described by row index, class labels and public points only, never by feature
values of the data.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..data import LabelledData
from ..neighbours import Adjacency

__all__ = ["Neighbour", "select_neighbours", "count_neighbours", "public_extreme_points"]

#: at most this many box vertices are tried (all of them when 2^d is smaller)
MAX_VERTICES = 64


@dataclass(frozen=True)
class Neighbour:
    """One neighbouring dataset D' of D.

    Attributes
    ----------
    data : LabelledData
        D'.
    relation : str
        The :class:`~klrelease.neighbours.Adjacency` value.
    row : int or None
        Index (in D) of the row that changes, if any.
    description : str
        Row index, label change and public point involved; no private values.
    score : float
        The search's extremeness score; neighbours are returned with the largest first, so an
        audit cut short by its time limit has examined the most extreme ones.
    """

    data: LabelledData
    relation: str
    row: int | None
    description: str
    score: float


def _class_geometry(data: LabelledData):
    """Class sizes, means and inverse covariances (ridged) used only to rank neighbours."""
    K, d = data.n_classes, data.n_features
    counts = np.bincount(data.codes, minlength=K)
    scale = np.var(data.X, axis=0).mean() + 1e-12
    means = np.zeros((K, d))
    precs = np.zeros((K, d, d))
    for k in range(K):
        Xk = data.X[data.codes == k]
        means[k] = Xk.mean(axis=0) if len(Xk) else data.X.mean(axis=0)
        S = np.cov(Xk, rowvar=False).reshape(d, d) if len(Xk) > 1 else np.zeros((d, d))
        precs[k] = np.linalg.inv(S + 1e-6 * scale * np.eye(d))
    return counts, means, precs


def _mahalanobis(points: np.ndarray, means: np.ndarray, precs: np.ndarray) -> np.ndarray:
    """(n, K) Mahalanobis distances of every point to every class."""
    diff = points[:, None, :] - means[None, :, :]
    return np.sqrt(np.maximum(np.einsum("nki,kij,nkj->nk", diff, precs, diff), 0.0))


def _label(data: LabelledData, k: int) -> str:
    return repr(data.classes[k])


def public_extreme_points(data: LabelledData, rng: np.random.Generator):
    """Public records to add or swap in: box vertices, or extreme points of the public ball.

    Returns ``(points, names)``; raises ``ValueError`` when the data carry no public bound.
    """
    d = data.n_features
    if data.bounds is not None:
        lower, upper = data.bounds
        if 2**d <= MAX_VERTICES:
            signs = np.array(list(itertools.product([0, 1], repeat=d)), dtype=bool)
        else:
            _, means, _ = _class_geometry(data)
            mid = 0.5 * (lower + upper)
            far = means > mid[None, :]  # the vertex farthest from each class mean
            signs = np.vstack([~far, far, rng.random((MAX_VERTICES - 2 * len(far), d)) < 0.5])
            signs = np.unique(signs, axis=0)
        points = np.where(signs, upper[None, :], lower[None, :])
        names = ["box vertex (" + ",".join("u" if s else "l" for s in row) + ")"
                 for row in signs]
        return points, names
    if data.norm_bound is not None:
        B = float(data.norm_bound)
        eye = np.eye(d)
        pts = [B * eye[j] * s for j in range(d) for s in (1.0, -1.0)]
        names = [f"{'+' if s > 0 else '-'}B e_{j}" for j in range(d) for s in (1.0, -1.0)]
        _, means, _ = _class_geometry(data)
        for k in range(data.n_classes):
            nrm = np.linalg.norm(means[k])
            if nrm > 0:
                for s in (1.0, -1.0):
                    pts.append(s * B * means[k] / nrm)
                    names.append(f"{'+' if s > 0 else '-'}B along class {_label(data, k)}")
        return np.array(pts), names
    raise ValueError(
        "a record-level audit needs a public bound on the records: pass bounds=(lower, upper) "
        "or norm_bound=B"
    )


def count_neighbours(data: LabelledData, relation: Adjacency) -> int | None:
    """Number of neighbours of D under ``relation`` (None when there are infinitely many)."""
    if relation == Adjacency.LABEL_FLIP:
        return data.n_samples * (data.n_classes - 1)
    if relation == Adjacency.REMOVE_ONE:
        return data.n_samples
    return None


def _pick(scores: np.ndarray, groups: np.ndarray, max_pairs: int, per_group: int) -> np.ndarray:
    """Indices of the top-scoring items, keeping ``per_group`` of every group first.

    Returns at most ``max_pairs`` indices, ordered by decreasing score (all of them when there
    are no more than ``max_pairs`` items).
    """
    order = np.argsort(-scores, kind="stable")
    chosen: list[int] = []
    seen = set()
    for g in np.unique(groups):
        top = order[groups[order] == g][:per_group]
        chosen.extend(int(i) for i in top)
    seen = set(chosen)
    for i in order:
        if len(chosen) >= max_pairs:
            break
        if int(i) not in seen:
            chosen.append(int(i))
            seen.add(int(i))
    chosen = sorted(chosen[:max_pairs], key=lambda i: -scores[i])
    return np.array(chosen, dtype=np.int64)


def _label_flips(data: LabelledData, max_pairs: int) -> list[Neighbour]:
    N, K = data.n_samples, data.n_classes
    rows = np.repeat(np.arange(N), K - 1)
    new = np.array([k for n in range(N) for k in range(K) if k != data.codes[n]], dtype=np.int64)
    old = data.codes[rows]
    counts, means, precs = _class_geometry(data)
    maha = _mahalanobis(data.X, means, precs)
    leave = maha[rows, old] / np.maximum(counts[old] - 1, 1)
    join = maha[rows, new] / (counts[new] + 1)
    scores = leave + join
    per_group = max(1, max_pairs // (4 * K * (K - 1)))
    idx = _pick(scores, old * K + new, max_pairs, per_group)
    out = []
    for i in idx:
        n, a, b = int(rows[i]), int(old[i]), int(new[i])
        codes = data.codes.copy()
        codes[n] = b
        out.append(Neighbour(
            data.with_labels(codes), Adjacency.LABEL_FLIP.value, n,
            f"row {n}: label {_label(data, a)} -> {_label(data, b)}", float(scores[i]),
        ))
    return out


def _with_rows(data: LabelledData, X: np.ndarray, codes: np.ndarray) -> LabelledData:
    return LabelledData(np.asarray(X, dtype=np.float64), np.asarray(codes, dtype=np.int64),
                        data.classes, data.domain, data.feature_names)


def _record_level(data: LabelledData, relation: Adjacency, max_pairs: int,
                  rng: np.random.Generator) -> list[Neighbour]:
    N, K = data.n_samples, data.n_classes
    counts, means, precs = _class_geometry(data)
    maha_rows = _mahalanobis(data.X, means, precs)
    leave = maha_rows[np.arange(N), data.codes] / np.maximum(counts[data.codes] - 1, 1)

    if relation == Adjacency.REMOVE_ONE:
        idx = _pick(leave, data.codes, max_pairs, max(1, max_pairs // (4 * K)))
        out = []
        for n in idx:
            keep = np.arange(N) != n
            out.append(Neighbour(
                _with_rows(data, data.X[keep], data.codes[keep]), relation.value, int(n),
                f"row {int(n)} (label {_label(data, int(data.codes[n]))}) removed",
                float(leave[n]),
            ))
        return out

    points, names = public_extreme_points(data, rng)
    maha_pts = _mahalanobis(points, means, precs)  # (P, K)
    P = points.shape[0]
    if relation == Adjacency.ADD_ONE:
        cand = [(None, p, c) for p in range(P) for c in range(K)]
        scores = np.array([maha_pts[p, c] / (counts[c] + 1) for _, p, c in cand])
        groups = np.array([c for _, _, c in cand])
    else:
        n_rows = min(N, max(4 * K, max_pairs // max(P, 1) + 1))
        rows = _pick(leave, data.codes, n_rows, max(1, n_rows // (2 * K)))
        labels = range(K)
        cand = []
        for n in rows:
            targets = [int(data.codes[n])] if relation == Adjacency.CHANGE_ONE_RECORD else labels
            cand.extend((int(n), p, c) for p in range(P) for c in targets)
        scores = np.array([leave[n] + maha_pts[p, c] / max(counts[c], 1) for n, p, c in cand])
        groups = np.array([int(data.codes[n]) * K + c for n, _, c in cand])
    per_group = max(1, max_pairs // (4 * len(np.unique(groups))))
    idx = _pick(scores, groups, max_pairs, per_group)
    out = []
    for i in idx:
        n, p, c = cand[i]
        if n is None:
            X = np.vstack([data.X, points[p]])
            codes = np.append(data.codes, c)
            text = f"{names[p]} added with label {_label(data, c)}"
        else:
            X = data.X.copy()
            X[n] = points[p]
            codes = data.codes.copy()
            codes[n] = c
            text = (f"row {n} (label {_label(data, int(data.codes[n]))}) replaced by "
                    f"{names[p]} with label {_label(data, c)}")
        out.append(Neighbour(_with_rows(data, X, codes), relation.value, n, text,
                             float(scores[i])))
    return out


def select_neighbours(
    data: LabelledData,
    relation: Adjacency | str,
    max_pairs: int,
    rng: np.random.Generator | None = None,
) -> list[Neighbour]:
    """Neighbouring datasets of ``data`` to examine, most extreme first (at most ``max_pairs``).

    Parameters
    ----------
    data : LabelledData
        D.
    relation : Adjacency or str
        The neighbouring relation of the claim being audited.
    max_pairs : int
        Largest number of neighbours returned.
    rng : numpy Generator, optional
        Used only to pick box vertices when there are too many to try them all.
    """
    relation = Adjacency(relation)
    if max_pairs < 1:
        raise ValueError(f"max_pairs must be >= 1, got {max_pairs!r}")
    rng = np.random.default_rng(0) if rng is None else rng
    if relation == Adjacency.LABEL_FLIP:
        return _label_flips(data, max_pairs)
    return _record_level(data, relation, max_pairs, rng)
