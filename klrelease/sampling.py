"""Step 4 of the pipeline: the noise laws of a release, each with a sampler and its exact
log-density (the audit compares these densities between neighbouring datasets).

* :class:`GaussianNoise`  w ~ N(0, C), C PSD and possibly singular (colored mean noise (5));
* :class:`WishartNoise`   W ~ Wishart_d(I / gamma, d + 1), always positive definite (6);
* :func:`uniform_composition`  a uniform composition of N into K positive parts (the smoothing
  part of the weight mapping (15)), drawn by stars and bars without enumerating the set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import multigammaln

__all__ = ["GaussianNoise", "WishartNoise", "uniform_composition", "psd_sqrt"]


def psd_sqrt(C: np.ndarray, *, rtol: float = 1e-12) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eigen-factorisation of a PSD matrix: (square root, eigenvalues kept, eigenvectors kept).

    Eigenvalues below ``rtol * max eigenvalue`` are treated as zero (the noise has no component
    there); the square root is never built from an inverse.
    """
    C = 0.5 * (C + C.T)
    vals, vecs = np.linalg.eigh(C)
    top = max(float(vals.max()), 0.0)
    keep = vals > rtol * top if top > 0 else np.zeros_like(vals, dtype=bool)
    vals_k = vals[keep]
    vecs_k = vecs[:, keep]
    root = vecs_k * np.sqrt(vals_k)
    return root, vals_k, vecs_k


@dataclass(frozen=True)
class GaussianNoise:
    """Zero-mean Gaussian noise with covariance ``cov`` (PSD; singular allowed)."""

    cov: np.ndarray

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        root, _, _ = psd_sqrt(self.cov)
        return root @ rng.standard_normal(root.shape[1])

    def logpdf(self, w: np.ndarray) -> float:
        """Log-density of ``w`` with respect to Lebesgue measure on the range of ``cov``.

        Returns ``-inf`` if ``w`` has a component outside that range (probability zero).
        """
        _, vals, vecs = psd_sqrt(self.cov)
        w = np.asarray(w, dtype=float)
        z = vecs.T @ w
        resid = w - vecs @ z
        scale = max(np.linalg.norm(w), 1e-300)
        if np.linalg.norm(resid) > 1e-9 * scale and np.linalg.norm(resid) > 1e-12:
            return -np.inf
        r = vals.shape[0]
        return float(-0.5 * (np.sum(z**2 / vals) + np.sum(np.log(vals)) + r * np.log(2 * np.pi)))

    def sample_many(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw ``n`` independent noise vectors, shape (n, d)."""
        root, _, _ = psd_sqrt(self.cov)
        return (root @ rng.standard_normal((root.shape[1], n))).T

    def logpdf_many(self, w: np.ndarray) -> np.ndarray:
        """:meth:`logpdf` of every row of ``w`` (shape (n, d)), vectorised."""
        _, vals, vecs = psd_sqrt(self.cov)
        w = np.asarray(w, dtype=float)
        z = w @ vecs
        resid = np.linalg.norm(w - z @ vecs.T, axis=1)
        scale = np.maximum(np.linalg.norm(w, axis=1), 1e-300)
        off = (resid > 1e-9 * scale) & (resid > 1e-12)
        r = vals.shape[0]
        out = -0.5 * (np.sum(z**2 / vals, axis=1) + np.sum(np.log(vals)) + r * np.log(2 * np.pi))
        return np.where(off, -np.inf, out)


@dataclass(frozen=True)
class WishartNoise:
    """W ~ Wishart_d(I / gamma, d + 1): W = Z Z^T with Z of shape (d, d+1), i.i.d. N(0, 1/gamma).

    E[W] = (d + 1)/gamma I. With d + 1 degrees of freedom the density on the PD cone is
    p(W) = exp(-gamma tr(W) / 2) gamma^{d(d+1)/2} / (2^{d(d+1)/2} Gamma_d((d+1)/2)).
    """

    d: int
    gamma: float

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        Z = rng.standard_normal((self.d, self.d + 1)) / np.sqrt(self.gamma)
        return Z @ Z.T

    def logpdf(self, W: np.ndarray) -> float:
        """Exact log-density; ``-inf`` off the positive-definite cone."""
        W = 0.5 * (W + W.T)
        d = self.d
        if np.linalg.eigvalsh(W)[0] <= 0:
            return -np.inf
        n = d + 1
        return float(
            -0.5 * self.gamma * np.trace(W)
            + 0.5 * n * d * np.log(self.gamma)
            - 0.5 * n * d * np.log(2.0)
            - multigammaln(n / 2.0, d)
        )

    def sample_many(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Draw ``n`` independent matrices, shape (n, d, d)."""
        Z = rng.standard_normal((n, self.d, self.d + 1)) / np.sqrt(self.gamma)
        return Z @ np.swapaxes(Z, 1, 2)

    def logpdf_many(self, W: np.ndarray) -> np.ndarray:
        """:meth:`logpdf` of every matrix of ``W`` (shape (n, d, d)), vectorised."""
        W = 0.5 * (W + np.swapaxes(W, 1, 2))
        d, n = self.d, self.d + 1
        const = (0.5 * n * d * np.log(self.gamma) - 0.5 * n * d * np.log(2.0)
                 - multigammaln(n / 2.0, d))
        out = -0.5 * self.gamma * np.einsum("nii->n", W) + const
        return np.where(np.linalg.eigvalsh(W)[:, 0] <= 0, -np.inf, out)


def uniform_composition(rng: np.random.Generator, N: int, K: int) -> np.ndarray:
    """A composition of N into K positive integer parts, uniform over all C(N-1, K-1).

    Stars and bars: choose K-1 distinct cut points among the N-1 gaps, uniformly.
    """
    if K == 1:
        return np.array([N], dtype=np.int64)
    cuts = np.sort(rng.choice(N - 1, size=K - 1, replace=False) + 1)
    return np.diff(np.concatenate([[0], cuts, [N]])).astype(np.int64)
