"""A scikit-learn estimator around :func:`klrelease.release` (in the spirit of diffprivlib).

``GMMReleaser(epsilon, delta).fit(X, y)`` releases a labelled GMM of ``(X, y)`` and keeps the
artifact as ``release_``; prediction, scoring and sampling use only the released model
(post-processing, no further privacy cost). ``random_state`` is the release's seed: a seeded
release is an experiment and is never certified (it warns with
:class:`~klrelease.warnings_.PrivacyLeakWarning`).
"""

from __future__ import annotations

import re

import numpy as np
from scipy.special import logsumexp
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from .release import release

__all__ = ["GMMReleaser"]


class GMMReleaser(ClassifierMixin, BaseEstimator):
    """Differentially private labelled GMM, released on ``fit``; a Gaussian classifier.

    Parameters
    ----------
    epsilon, delta : float
        The privacy parameters of the release (epsilon > 0, 0 < delta < 1).
    mechanism : str
        A registered mechanism (:func:`klrelease.mechanisms`).
    classes : sequence, optional
        The public set of classes (default: the labels present in ``y``, which the claim then
        does not protect).
    bounds : (lower, upper) or str, optional
        Public bounds on the features (see :func:`klrelease.release`).
    norm_bound : float, optional
        Public bound on ``||x||_2``.
    options : dict, optional
        Mechanism options (``klrelease mechanisms NAME`` lists them).
    random_state : int, numpy RandomState or Generator, or None
        Seed of the release noise, in scikit-learn's forms; ``None`` (default) uses the
        library's CSPRNG. A seeded release is not certified.
    accountant : BudgetAccountant, optional
        Refuses a release that would exceed the data owner's total budget.

    Attributes
    ----------
    release_ : Release
        The artifact (privacy claim, options, released GMM).
    weights_, means_, covariances_ : ndarray
        The released mixture.
    classes_ : ndarray
        Class labels, in the order of the components.
    n_features_in_ : int
        Number of features seen in ``fit``.
    """

    def __init__(self, epsilon=1.0, delta=1e-5, *, mechanism="kl-certified", classes=None,
                 bounds=None, norm_bound=None, options=None, random_state=None,
                 accountant=None):
        self.epsilon = epsilon
        self.delta = delta
        self.mechanism = mechanism
        self.classes = classes
        self.bounds = bounds
        self.norm_bound = norm_bound
        self.options = options
        self.random_state = random_state
        self.accountant = accountant

    def fit(self, X, y):
        """Release a GMM of ``(X, y)``."""
        X, y = _validated(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        if X.shape[0] < 2:
            raise ValueError(f"n_samples={X.shape[0]}: a release needs at least two rows")
        rel = release(X, y, epsilon=self.epsilon, delta=self.delta, mechanism=self.mechanism,
                      seed=self.random_state, classes=self.classes, bounds=self.bounds,
                      norm_bound=self.norm_bound, accountant=self.accountant,
                      **dict(self.options or {}))
        g = rel.gmm
        self.release_ = rel
        self.weights_ = np.asarray(g.weights)
        self.means_ = np.asarray(g.means)
        self.covariances_ = np.asarray(g.covariances)
        self.classes_ = np.asarray(g.classes)
        if len(self.classes_) and np.asarray(y).dtype.kind != "O":
            self.classes_ = self.classes_.astype(np.asarray(y).dtype)
        return self

    def _joint_log_likelihood(self, X) -> np.ndarray:
        check_is_fitted(self)
        X = _validated(self, X, reset=False, dtype=np.float64)
        return self.release_.gmm._joint_log_prob(X)

    def predict_log_proba(self, X) -> np.ndarray:
        """log p(class | x) under the released GMM."""
        jll = self._joint_log_likelihood(X)
        return jll - logsumexp(jll, axis=1, keepdims=True)

    def predict_proba(self, X) -> np.ndarray:
        """p(class | x) under the released GMM."""
        return np.exp(self.predict_log_proba(X))

    def predict(self, X) -> np.ndarray:
        """The most probable class of each row under the released GMM."""
        jll = self._joint_log_likelihood(X)
        return self.classes_[np.argmax(jll, axis=1)]

    def sample(self, n_samples: int = 1, random_state=None):
        """``n_samples`` synthetic labelled rows ``(X, y)`` from the released GMM."""
        check_is_fitted(self)
        return self.release_.gmm.sample(n_samples, seed=random_state)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = self.random_state is None
        return tags


def _validated(estimator, *args, **kwargs):
    """scikit-learn's ``validate_data``, its errors without the data: its message for a 1-d
    array quotes the array's values (``array=[5.1 4.9 ...]``), and the rows are private."""
    try:
        return validate_data(estimator, *args, **kwargs)
    except ValueError as exc:
        message = str(exc)
        cleaned = re.sub(r"\narray=\[.*?\]\.?(\n|$)", "\n", message, flags=re.DOTALL)
        if cleaned == message:
            raise
        raise ValueError(cleaned) from None
