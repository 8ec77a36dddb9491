"""Test problems shaped like the paper's synthetic experiments.

Labelled data from a Gaussian mixture with Dirichlet(1) class weights, means uniform on
``[-10, 10]^d`` and covariances drawn from ``Wishart(d + 1, I)``. For class ``k`` with mean
``mu_k``, unbiased covariance ``Sigma_k`` and size ``N_k``, the neighbour vectors of the
label-flip relation are ``(x_n - mu_k) / (N_k - 1)`` for the points of class ``k`` (flipped
out) and ``(x_n - mu_k) / (N_k + 1)`` for all other points (flipped in); every other flip
leaves ``mu_k`` unchanged. The SDP weight is ``A = Sigma_k^{-1}``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["class_problems", "gmm_data"]


def gmm_data(n: int, d: int, k: int, seed=None, *, min_class: int | None = None):
    """Draw ``n`` labelled points in ``d`` dimensions from a random ``k``-class mixture.

    The library's generator of the synthetic setting
    (:func:`klrelease.experiments.synthetic_data`), in this module's argument order.

    Parameters
    ----------
    n, d, k : int
        Points, dimension, classes.
    seed : int or numpy Generator, optional
        Randomness.
    min_class : int, optional
        Smallest class size (default ``d + 2``, so every class covariance is invertible).

    Returns
    -------
    X : ndarray of shape (n, d)
    y : ndarray of shape (n,)
        Labels in ``0..k-1``.
    """
    from ..experiments.synthetic import synthetic_data

    return synthetic_data(n, k, d, seed, min_class_size=min_class)


def class_problems(X: np.ndarray, y: np.ndarray):
    """Per-class ``(A, V)`` of the mean-noise SDP for the label-flip relation.

    Returns
    -------
    list of tuple (A, V)
        ``A = Sigma_k^{-1}`` (d, d) and ``V`` (n, d), one row per point of the data set.
    """
    out = []
    for c in np.unique(y):
        idx = y == c
        nk = int(idx.sum())
        mu = X[idx].mean(axis=0)
        sigma = np.cov(X[idx], rowvar=False).reshape(X.shape[1], X.shape[1])
        V = X - mu
        V[idx] /= nk - 1
        V[~idx] /= nk + 1
        A = np.linalg.inv(sigma)
        out.append((0.5 * (A + A.T), V))
    return out
