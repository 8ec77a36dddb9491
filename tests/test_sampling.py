import numpy as np
import pytest
from scipy import stats

from klrelease.sampling import GaussianNoise, WishartNoise, uniform_composition


def test_wishart_mean():
    rng = np.random.default_rng(0)
    d, gamma = 3, 2.5
    w = WishartNoise(d, gamma)
    draws = np.stack([w.sample(rng) for _ in range(20000)])
    np.testing.assert_allclose(draws.mean(0), (d + 1) / gamma * np.eye(d), atol=0.05)


def test_wishart_logpdf_matches_scipy():
    rng = np.random.default_rng(1)
    d, gamma = 4, 0.7
    w = WishartNoise(d, gamma)
    ref = stats.wishart(df=d + 1, scale=np.eye(d) / gamma)
    for _ in range(5):
        W = w.sample(rng)
        assert w.logpdf(W) == pytest.approx(ref.logpdf(W), rel=1e-10)
    assert w.logpdf(-np.eye(d)) == -np.inf


def test_gaussian_logpdf_matches_scipy_and_handles_singular():
    rng = np.random.default_rng(2)
    A = rng.normal(size=(3, 3))
    C = A @ A.T + 0.1 * np.eye(3)
    g = GaussianNoise(C)
    x = g.sample(rng)
    assert g.logpdf(x) == pytest.approx(stats.multivariate_normal(np.zeros(3), C).logpdf(x))
    # rank-one covariance: density on the line, -inf off it
    v = np.array([1.0, 2.0, -1.0])
    s = GaussianNoise(np.outer(v, v))
    on = s.sample(rng)
    assert np.isfinite(s.logpdf(on))
    assert s.logpdf(on + np.array([0.0, 0.0, 1e-3])) == -np.inf


def test_uniform_composition_is_uniform():
    """Chi-square test over all C(7, 2) = 21 compositions of N = 8 into K = 3 parts."""
    rng = np.random.default_rng(3)
    N, K, n = 8, 3, 42000
    draws = [tuple(uniform_composition(rng, N, K)) for _ in range(n)]
    assert all(sum(c) == N and min(c) >= 1 for c in draws)
    keys, counts = np.unique(np.array(draws), axis=0, return_counts=True)
    assert len(keys) == 21
    res = stats.chisquare(counts)
    assert res.pvalue > 1e-3


def test_uniform_composition_large_N_is_cheap():
    rng = np.random.default_rng(4)
    c = uniform_composition(rng, 10**9, 10)
    assert c.sum() == 10**9 and c.min() >= 1
