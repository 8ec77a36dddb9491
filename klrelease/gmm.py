"""The labelled Gaussian mixture p(y = k) = w_k, p(x | y = k) = N(mu_k, Sigma_k) (7)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["GMM", "fit_gmm"]


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

    def sample(self, n: int, seed: int | np.random.Generator | None = None):
        """Draw ``n`` labelled points; returns ``(X, y)`` with ``y`` holding class labels."""
        if int(n) != n or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        n = int(n)
        comp = rng.choice(self.n_components, size=n, p=self.weights)
        counts = np.bincount(comp, minlength=self.n_components)
        X = np.empty((n, self.n_features))
        for k in range(self.n_components):
            idx = np.flatnonzero(comp == k)
            if counts[k]:
                X[idx] = rng.multivariate_normal(self.means[k], self.covariances[k],
                                                 size=counts[k], method="cholesky")
        labels = np.asarray(self.classes, dtype=object)[comp]
        try:
            labels = labels.astype(type(self.classes[0]))
        except (TypeError, ValueError):
            pass
        return X, labels

    def log_prob(self, X: np.ndarray, y=None) -> np.ndarray:
        """log p(x) (marginal) or, with labels ``y``, the joint log p(x, y)."""
        from scipy.stats import multivariate_normal

        X = np.atleast_2d(np.asarray(X, dtype=float))
        comp_lp = np.stack([
            multivariate_normal(self.means[k], self.covariances[k]).logpdf(X).reshape(-1)
            for k in range(self.n_components)
        ], axis=1) + np.log(np.maximum(self.weights, 1e-300))
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
