"""The paper's synthetic data: a random ground-truth GMM and a labelled sample from it.

Section V-A: weights ~ Dirichlet(1, ..., 1), means ~ U[-10, 10]^d, covariances ~
Wishart(d + 1, I_d); N i.i.d. labelled points. A class with fewer than d + 2 points has no
invertible covariance once one of its points is flipped away, so every class is given a floor
of points (:class:`~klrelease.experiments.settings.SyntheticSetting`): the class sizes are
``m + Multinomial(N - K m, weights)``. The floor changes the class sizes only when a weight is
tiny (for K = 5, N = 1000, d = 3 it adds 25 of the 1000 labels); the points themselves are
always drawn from their class's component.

This is the one generator of the synthetic setting: the figure experiments, the test suite,
the benchmarks and the solver study all draw from :func:`draw_synthetic` (directly or through
:func:`synthetic_data`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .settings import SyntheticSetting

__all__ = ["SyntheticData", "draw_synthetic", "synthetic_data"]


@dataclass(frozen=True)
class SyntheticData:
    """One trial's dataset and the ground truth it was drawn from."""

    X: np.ndarray  # (N, d)
    y: np.ndarray  # (N,) class index 0..K-1
    weights: np.ndarray  # (K,) ground-truth mixture weights
    means: np.ndarray  # (K, d)
    covariances: np.ndarray  # (K, d, d)


def draw_synthetic(setting: SyntheticSetting, rng: np.random.Generator) -> SyntheticData:
    """Draw a ground-truth GMM and a labelled dataset from it.

    Parameters
    ----------
    setting : SyntheticSetting
        N, K, d, the range of the means and the per-class floor.
    rng : numpy.random.Generator
        The only source of randomness.

    Returns
    -------
    SyntheticData
        Rows shuffled; every class holds at least ``setting.class_floor`` rows.
    """
    N, K, d = setting.n_samples, setting.n_classes, setting.n_features
    weights = rng.dirichlet(np.ones(K))
    means, covs = draw_truth(K, d, setting.mean_range, rng)
    floor = setting.class_floor
    counts = floor + rng.multinomial(N - K * floor, weights)
    X, y = draw_rows(means, covs, counts, rng)
    return SyntheticData(X=X, y=y, weights=weights, means=means, covariances=covs)


def draw_truth(n_classes: int, n_features: int, mean_range: float,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The paper's ground truth (section V-A): means uniform in ``[-R, R]^d``, covariances
    Wishart(d + 1, I)."""
    from scipy.stats import wishart

    K, d = int(n_classes), int(n_features)
    means = rng.uniform(-mean_range, mean_range, size=(K, d))
    covs = np.asarray(
        wishart(df=d + 1, scale=np.eye(d)).rvs(size=K, random_state=rng), dtype=float
    ).reshape(K, d, d)
    return means, covs


def draw_rows(means: np.ndarray, covs: np.ndarray, counts,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``counts[k]`` rows of component ``k``, shuffled: ``(X, y)`` with codes ``0..K-1``."""
    y = rng.permutation(np.repeat(np.arange(len(counts)), counts))
    chol = np.linalg.cholesky(covs)
    z = rng.standard_normal((y.size, means.shape[1]))
    return means[y] + np.einsum("nij,nj->ni", chol[y], z), y


def synthetic_data(n_samples: int = 1000, n_classes: int = 5, n_features: int = 3, seed=42, *,
                   min_class_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` of :func:`draw_synthetic` for one setting and seed.

    Parameters
    ----------
    n_samples, n_classes, n_features : int
        N, K, d (the defaults are the paper's N = 1000, K = 5, d = 3).
    seed : int or numpy Generator
        The randomness (a fixed seed reproduces the data).
    min_class_size : int, optional
        Rows every class holds at least (default d + 2).
    """
    setting = SyntheticSetting(n_samples=n_samples, n_classes=n_classes,
                               n_features=n_features, min_class_size=min_class_size)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    data = draw_synthetic(setting, rng)
    return data.X, data.y
