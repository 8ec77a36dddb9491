import numpy as np
import pytest

import klrelease as kr
from klrelease.kl import gaussian_kl


def _two_models():
    rng = np.random.default_rng(7)
    K, d = 3, 2
    def cov():
        A = rng.normal(size=(d, d))
        return A @ A.T + 0.5 * np.eye(d)
    p = kr.GMM(np.array([0.2, 0.5, 0.3]), rng.normal(size=(K, d)),
               np.stack([cov() for _ in range(K)]))
    q = kr.GMM(np.array([0.3, 0.4, 0.3]), rng.normal(size=(K, d)),
               np.stack([cov() for _ in range(K)]))
    return p, q


def test_closed_form_against_monte_carlo():
    p, q = _two_models()
    X, y = p.sample(200_000, seed=0)
    mc = np.mean(p.log_prob(X, y) - q.log_prob(X, y))
    assert kr.kl_divergence(p, q) == pytest.approx(mc, abs=0.02)


def test_kl_basic_properties():
    p, q = _two_models()
    assert kr.kl_divergence(p, p) == pytest.approx(0.0, abs=1e-12)
    assert kr.kl_divergence(p, q) > 0
    # scalar gaussian case by hand: KL(N(0,1)||N(1,4)) = (1/4 + 1/4 - 1 + ln 4)/2
    val = gaussian_kl(np.zeros(1), np.eye(1), np.ones(1), 4 * np.eye(1))
    assert float(val) == pytest.approx(0.5 * (0.25 + 0.25 - 1 + np.log(4)))
