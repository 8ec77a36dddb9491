"""The labelled Gaussian mixture p(y = k) = w_k, p(x | y = k) = N(mu_k, Sigma_k) (7)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from statistics import NormalDist

import numpy as np

from ._threads import blas_single_thread
from .rows import class_blocks

__all__ = ["GMM", "fit_gmm", "check_gmm", "definite_covariances", "SAMPLE_BLOCK"]

#: Rows per block of :meth:`GMM.sample_blocks` unless told otherwise.
SAMPLE_BLOCK = 1 << 16

#: :func:`definite_covariances`: the least eigenvalue, relative to the largest, of a repaired
#: correlation matrix (a condition number that a Cholesky factor in float64 holds whatever
#: the features' units).
DEFINITE_FLOOR = 1e-12


def normal_cuts(weights: np.ndarray) -> np.ndarray:
    """Cut points ``t`` (length K - 1, non-decreasing) with ``Phi(t_j) = w_0 + ... + w_j``:
    a standard normal ``z`` falls in component ``k = #{j : t_j < z}`` with probability
    ``w_k``. The mass below a cut is taken from the lower sum and the mass above from the
    upper sum, whichever is under a half, so that small weights in either tail keep their
    relative accuracy (a weight of 0 is never drawn: its cuts coincide)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    below = np.cumsum(w)[:-1]
    above = np.cumsum(w[::-1])[::-1][1:]
    inv = NormalDist().inv_cdf
    cuts = np.empty(below.shape[0])
    for j, (lo, up) in enumerate(zip(below, above, strict=True)):
        if lo <= 0.0:
            cuts[j] = -np.inf
        elif up <= 0.0:
            cuts[j] = np.inf
        elif lo <= 0.5:
            cuts[j] = inv(float(lo))
        else:
            cuts[j] = -inv(float(up))
    return np.maximum.accumulate(cuts) if cuts.size else cuts


def _affine(Z: np.ndarray, lower: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """The rows ``mean + lower @ z`` of the rows ``z`` of ``Z``, for a lower-triangular
    ``lower``, one product of a column by a number at a time: each entry is summed in the same
    order whatever the number of rows (a BLAS product changes its kernel, and the last bit of
    its sums, with the shape). Works on the transpose, whose columns are contiguous."""
    ZT = np.ascontiguousarray(Z.T)
    XT = np.empty_like(ZT)
    term = np.empty(ZT.shape[1])
    for i in range(ZT.shape[0]):
        XT[i] = mean[i]
        for j in range(i + 1):
            np.multiply(ZT[j], lower[i, j], out=term)
            XT[i] += term
    return XT.T


@dataclass(frozen=True, eq=False)
class GMM:
    """A labelled Gaussian mixture.

    Attributes
    ----------
    weights : ndarray of shape (K,)
        Class probabilities, on the simplex.
    means : ndarray of shape (K, d)
    covariances : ndarray of shape (K, d, d)
        Symmetric positive definite.
    classes : tuple
        Label of each component (defaults to 0..K-1).
    """

    weights: np.ndarray
    means: np.ndarray
    covariances: np.ndarray
    classes: tuple = field(default=())

    def __post_init__(self):
        w = np.asarray(self.weights, dtype=np.float64)
        m = np.asarray(self.means, dtype=np.float64)
        c = np.asarray(self.covariances, dtype=np.float64)
        if w.ndim != 1 or m.ndim != 2 or c.ndim != 3:
            raise ValueError("weights, means, covariances must have shapes (K,), (K, d), (K, d, d)")
        K, d = m.shape
        if w.shape[0] != K or c.shape != (K, d, d):
            raise ValueError(
                f"inconsistent shapes: weights {w.shape}, means {m.shape}, covariances {c.shape}"
            )
        if not (np.all(np.isfinite(w)) and np.all(np.isfinite(m)) and np.all(np.isfinite(c))):
            raise ValueError("GMM parameters must be finite")
        if np.any(w < 0) or abs(w.sum() - 1.0) > 1e-9:
            raise ValueError("weights must be non-negative and sum to one")
        for arr in (w, m, c):
            arr.setflags(write=False)
        object.__setattr__(self, "weights", w)
        object.__setattr__(self, "means", m)
        object.__setattr__(self, "covariances", c)
        classes = tuple(self.classes) if self.classes else tuple(range(K))
        if len(classes) != K:
            raise ValueError("classes must have one label per component")
        object.__setattr__(self, "classes", classes)

    @property
    def n_components(self) -> int:
        return self.means.shape[0]

    @property
    def n_features(self) -> int:
        return self.means.shape[1]

    def to_sklearn(self):
        """A fitted :class:`sklearn.mixture.GaussianMixture` with these parameters.

        ``sample``, ``score_samples`` and ``predict`` then work as usual (``predict`` returns
        component indices; ``classes[i]`` is the label of component i).
        """
        from sklearn.mixture import GaussianMixture

        gm = GaussianMixture(n_components=self.n_components, covariance_type="full")
        gm.weights_ = np.array(self.weights)
        gm.means_ = np.array(self.means)
        gm.covariances_ = np.array(self.covariances)
        chol = np.linalg.cholesky(gm.covariances_)
        eye = np.eye(self.n_features)
        gm.precisions_cholesky_ = np.stack(
            [np.linalg.solve(L, eye).T for L in chol]
        )
        gm.precisions_ = np.einsum("kij,klj->kil", gm.precisions_cholesky_,
                                   gm.precisions_cholesky_)
        gm.converged_ = True
        gm.n_iter_ = 0
        gm.lower_bound_ = -np.inf
        gm.n_features_in_ = self.n_features
        return gm

    def _labels_of(self, comp: np.ndarray) -> np.ndarray:
        labels = np.asarray(self.classes, dtype=object)[comp]
        try:
            labels = labels.astype(type(self.classes[0]))
        except (TypeError, ValueError):
            pass
        return labels

    def class_counts(self, n: int, per_class="weights") -> np.ndarray:
        """How many of ``n`` rows each class gets in :meth:`sample` with ``per_class``.

        ``"weights"``: ``n * weights`` rounded by largest remainders (ties to the lower class
        index), so the counts sum to ``n`` and follow the released weights as closely as
        integers can. A sequence of K counts, or a mapping from class label to count (absent
        classes get 0): those counts, which must sum to ``n``.
        """
        if isinstance(n, bool) or int(n) != n or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        n, K = int(n), self.n_components
        if isinstance(per_class, str):
            if per_class != "weights":
                raise ValueError(f"per_class must be 'weights', counts or a mapping, got "
                                 f"{per_class!r}")
            exact = n * self.weights
            counts = np.floor(exact).astype(np.int64)
            rest = n - int(counts.sum())
            if rest:
                order = np.lexsort((np.arange(K), -(exact - counts)))
                counts[order[:rest]] += 1
            return counts
        if isinstance(per_class, dict):
            index = {c: i for i, c in enumerate(self.classes)}
            unknown = [c for c in per_class if c not in index]
            if unknown:
                raise ValueError(f"per_class names a label that is not a class: {unknown[0]!r}")
            raw = np.zeros(K)
            for c, v in per_class.items():
                raw[index[c]] = v
        else:
            try:
                raw = np.asarray(per_class, dtype=float).reshape(-1)
            except (TypeError, ValueError):
                raise ValueError("per_class must be 'weights', counts or a mapping") from None
            if raw.size != K:
                raise ValueError(f"per_class must hold one count per class ({K}), got "
                                 f"{raw.size}")
        if not np.all(np.isfinite(raw)) or np.any(raw < 0) or np.any(raw != np.round(raw)):
            raise ValueError("per_class counts must be non-negative integers")
        counts = raw.astype(np.int64)
        if int(counts.sum()) != n:
            raise ValueError(f"per_class counts sum to {int(counts.sum())}, not n = {n}")
        return counts

    @cached_property
    def _cholesky(self) -> np.ndarray:
        """The lower Cholesky factor of every covariance, shape (K, d, d)."""
        return np.linalg.cholesky(self.covariances)

    @cached_property
    def _cuts(self) -> np.ndarray:
        return normal_cuts(self.weights)

    def sample_blocks(self, n: int, seed: int | np.random.Generator | None = None, *,
                      block: int = SAMPLE_BLOCK) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Draw ``n`` rows in blocks of at most ``block``: yields ``(X, comp)`` per block, with
        ``comp`` the component index of each row (``classes[comp]`` its label).

        Row ``i`` takes the next ``d + 1`` standard normals of the stream: the first chooses
        its component (``k`` with probability ``w_k``, by the cut points of
        :func:`normal_cuts`), the other ``d``, ``z``, its point ``mu_k + L_k z`` (``L_k`` the
        Cholesky factor of ``Sigma_k``). The rows are therefore the same whatever the block
        size, and memory stays of the order of ``block * d``.
        """
        if isinstance(n, bool) or int(n) != n or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        if isinstance(block, bool) or int(block) != block or block < 1:
            raise ValueError(f"block must be a positive integer, got {block!r}")
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        n, block = int(n), int(block)
        K, d = self.n_components, self.n_features
        cuts, chol = self._cuts, self._cholesky
        for start in range(0, n, block):
            m = min(block, n - start)
            Z = rng.standard_normal((m, d + 1))
            comp = np.searchsorted(cuts, Z[:, 0], side="left")
            order, bounds = class_blocks(comp, K)
            X = np.empty((m, d))
            for k in range(K):
                rows = order[bounds[k]:bounds[k + 1]]
                if rows.size:
                    X[rows] = _affine(Z[rows, 1:], chol[k], self.means[k])
            yield X, comp

    def sample(self, n: int, seed: int | np.random.Generator | None = None, *,
               per_class=None):
        """Draw ``n`` labelled points; returns ``(X, y)`` with ``y`` holding class labels.

        Parameters
        ----------
        n : int
            Number of rows.
        seed : int, Generator or None
            Randomness of the draw.
        per_class : None, "weights", sequence or mapping, optional
            None (default): each row's class is drawn from the weights (multinomial class
            histogram), as in :meth:`sample_blocks` (the same rows, in one block). Otherwise
            the class histogram is fixed exactly by :meth:`class_counts` (``"weights"``: ``n``
            apportioned by the weights; or explicit counts per class) and the rows are returned
            in random order. Sampling from a release is post-processing; passing the exact
            class counts of private data would publish them, so a data owner uses
            ``"weights"`` (the released weights).
        """
        if int(n) != n or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        n = int(n)
        if per_class is None:
            if n == 0:
                return np.empty((0, self.n_features)), self._labels_of(np.empty(0, np.intp))
            ((X, comp),) = self.sample_blocks(n, rng, block=n)
            return X, self._labels_of(comp)
        counts = self.class_counts(n, per_class)
        comp = rng.permutation(np.repeat(np.arange(self.n_components), counts))
        counts = np.bincount(comp, minlength=self.n_components)
        X = np.empty((n, self.n_features))
        for k in range(self.n_components):
            idx = np.flatnonzero(comp == k)
            if counts[k]:
                X[idx] = rng.multivariate_normal(self.means[k], self.covariances[k],
                                                 size=counts[k], method="cholesky")
        return X, self._labels_of(comp)

    def _component_log_prob(self, X: np.ndarray) -> np.ndarray:
        """log w_k + log N(x; mu_k, Sigma_k) of validated rows, shape (n, K), by a Cholesky
        factor of every covariance (any positive definite covariance, whatever the units of
        the features; scipy's ``multivariate_normal`` refuses condition numbers above ~1e9)."""
        from scipy.linalg import solve_triangular

        d = self.n_features
        out = np.empty((X.shape[0], self.n_components))
        for k in range(self.n_components):
            L = np.linalg.cholesky(self.covariances[k])
            z = solve_triangular(L, (X - self.means[k]).T, lower=True)
            logdet = 2.0 * np.sum(np.log(np.diag(L)))
            out[:, k] = -0.5 * (np.sum(z * z, axis=0) + logdet + d * np.log(2 * np.pi))
        return out + np.log(np.maximum(self.weights, 1e-300))

    def _joint_log_prob(self, X) -> np.ndarray:
        """log w_k + log N(x; mu_k, Sigma_k), shape (n, K)."""
        try:
            X = np.asarray(X, dtype=float)
        except (TypeError, ValueError):
            raise ValueError("X must be a numeric array of shape (n, d)") from None
        if X.ndim == 1:  # one row, or (d = 1) one value per row
            X = X.reshape(-1, 1) if self.n_features == 1 else X.reshape(1, -1)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"X must have shape (n, {self.n_features}), got {X.shape}")
        if not np.all(np.isfinite(X)):
            raise ValueError("X contains NaN or infinite values")
        return self._component_log_prob(X)

    def predict_proba(self, X) -> np.ndarray:
        """Posterior class probabilities p(y = k | x), shape (n, K), columns in ``classes`` order.

        Bayes' rule with the weights as priors and the class Gaussians as likelihoods.
        """
        from scipy.special import softmax

        return softmax(self._joint_log_prob(X), axis=1)

    def predict(self, X) -> np.ndarray:
        """The most probable class of every row (maximum of w_k N(x; mu_k, Sigma_k)), as labels."""
        return self._labels_of(np.argmax(self._joint_log_prob(X), axis=1))

    def log_prob(self, X: np.ndarray, y=None) -> np.ndarray:
        """log p(x) (marginal) or, with labels ``y``, the joint log p(x, y)."""
        comp_lp = self._component_log_prob(np.atleast_2d(np.asarray(X, dtype=float)))
        if y is None:
            from scipy.special import logsumexp
            return logsumexp(comp_lp, axis=1)
        idx = {c: i for i, c in enumerate(self.classes)}
        k = np.array([idx[v.item() if hasattr(v, "item") else v] for v in np.asarray(y)])
        return comp_lp[np.arange(X.shape[0]), k]


def fit_gmm(X, y, *, classes=None) -> GMM:
    """The non-private labelled GMM of (2): class frequencies, means, unbiased covariances."""
    from .data import as_labelled_data
    from .statistics import class_statistics

    data = as_labelled_data(X, y, classes=classes)
    st = class_statistics(data.X, data.codes, data.n_classes)
    return GMM(st.weights, st.means, st.covariances, data.classes)


def definite_covariances(covs: np.ndarray) -> np.ndarray:
    """``covs`` (K, d, d) with each covariance whose correlation matrix is singular to float64
    made definite: where its diagonal is finite and positive and it has no Cholesky factor,
    its correlation matrix's eigenvalues below ``DEFINITE_FLOOR`` times the largest are raised
    to it (correlations rebuilt from the eigendecomposition, the diagonal's scales kept). The
    others are returned as they are (the same array when none needs it); a covariance with a
    diagonal entry that is not positive, or not finite, is left to the caller (it has no scale
    of its own).

    A covariance estimated in a frame whitened along an exact linear dependency of the
    features (a duplicated column, a column that is the sum of others) has an eigenvalue of
    about 1e-17 of its largest there once mapped back to the features' units, which rounding
    leaves at zero or below. The repair reads the correlations only, so a change of a
    feature's units changes nothing but that feature's scale in a repaired covariance. Whether
    a covariance singular to within rounding has a factor can depend on the units; either way
    the result has one (the artifact's requirement), and only the floor of its near-zero
    eigenvalue differs."""
    covs = np.asarray(covs, dtype=float)
    out = covs
    for k in range(covs.shape[0]):
        C = covs[k]
        diag = np.diagonal(C)
        if not (np.all(np.isfinite(C)) and np.all(diag > 0)):
            continue
        # (a covariance with a Cholesky factor is left as it is, however ill conditioned: a
        # release that matches a singular fit, a set of shares that sum to one, is not moved
        # away from it; and what the artifact requires is this factor)
        try:
            np.linalg.cholesky(C)
            continue
        except np.linalg.LinAlgError:
            pass
        sd = np.sqrt(diag)
        R = C / np.outer(sd, sd)
        R = 0.5 * (R + R.T)
        w, V = np.linalg.eigh(R)  # one decomposition: floored and rebuilt from it
        w = np.maximum(w, DEFINITE_FLOOR * max(float(w[-1]), 1e-300))
        R = (V * w) @ V.T
        R = 0.5 * (R + R.T)
        if out is covs:
            out = covs.copy()
        out[k] = R * np.outer(sd, sd)
    return out


def _gmm_width(g) -> int | None:
    return np.shape(g.covariances)[-1] if np.ndim(g.covariances) else None


@blas_single_thread(width=_gmm_width)  # one Cholesky factor per class
def check_gmm(g: GMM) -> GMM:
    """``g`` itself if its covariances are symmetric positive definite and its class labels
    distinct (what an artifact requires); ``ValueError`` otherwise."""
    c = g.covariances
    if c.size == 0:
        raise ValueError("a GMM needs at least one class and one feature")
    # one matrix at a time: no stack of temporaries
    scale = max(max(float(np.max(np.abs(ck))) for ck in c), 1.0)
    asym = max(float(np.max(np.abs(ck - ck.T))) for ck in c)
    if asym > 1e-9 * scale:
        raise ValueError("covariances must be symmetric")
    try:
        for ck in c:
            np.linalg.cholesky(ck)
    except np.linalg.LinAlgError:
        raise ValueError("covariances must be positive definite") from None
    if len(set(map(str, g.classes))) != len(g.classes):
        raise ValueError("class labels must be distinct")
    return g
