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


def test_kl_accepts_every_covariance_a_release_accepts():
    """A covariance with a Cholesky factor (what ``check_gmm`` and an artifact require) whose
    LU determinant has the wrong sign, near singular as a release of collinear features (shares
    that sum to one) can be: the KL divergence takes its log-determinant from the factor."""
    from scipy.stats import ortho_group

    d = 6
    V = ortho_group.rvs(d, random_state=13)
    S = (V * np.r_[2.6e5, 1e3, 10, 1, 3e-3, 3e-12]) @ V.T
    S = 0.5 * (S + S.T)
    np.linalg.cholesky(S)  # a release would accept it
    assert np.linalg.slogdet(S)[0] <= 0  # the LU sign is wrong for it
    val = gaussian_kl(np.zeros(d), S, np.zeros(d), S + np.eye(d))
    assert np.isfinite(val) and val > 0
    with pytest.raises(ValueError, match="positive definite"):
        gaussian_kl(np.zeros(d), -np.eye(d), np.zeros(d), np.eye(d))
    # a singular reference (a fit whose class holds a constant feature): a clear error, not
    # numpy's LinAlgError
    X = np.random.default_rng(0).normal(size=(60, 3))
    y = np.repeat([0, 1], 30)
    X[y == 1, 2] = 0.0
    fit = kr.fit_gmm(X, y)
    with pytest.raises(ValueError, match="reference.*positive definite"):
        kr.kl_divergence(fit, fit)
    with pytest.raises(ValueError, match="reference.*positive definite"):
        gaussian_kl(np.zeros(2), np.eye(2), np.zeros(2), np.full((2, 2), np.nan))


def _textbook_kl(m0, S0, m1, S1):
    """The formula as printed: traces and log-determinants."""
    d = m0.shape[-1]
    P1 = np.linalg.inv(S1)
    diff = m1 - m0
    return 0.5 * (np.trace(P1 @ S0) + diff @ P1 @ diff - d
                  + np.linalg.slogdet(S1)[1] - np.linalg.slogdet(S0)[1])


@pytest.mark.parametrize("d", [1, 4, 30])
def test_gaussian_kl_equals_the_textbook_formula(d):
    rng = np.random.default_rng(d)
    for _ in range(5):
        A, B = rng.normal(size=(2, d, d))
        S0, S1 = A @ A.T + 0.2 * np.eye(d), B @ B.T + 0.2 * np.eye(d)
        m0, m1 = rng.normal(size=(2, d))
        np.testing.assert_allclose(gaussian_kl(m0, S0, m1, S1), _textbook_kl(m0, S0, m1, S1),
                                   rtol=1e-10)


def test_gaussian_kl_is_not_negative_at_an_ill_conditioned_reference():
    """A release within rounding of an ill-conditioned reference (eigenvalues over twelve
    decades, as near-collinear real features give) has a divergence of about zero, never
    below it: the traces-and-determinants formula gives +-4e-6 there."""
    rng = np.random.default_rng(0)
    d = 30
    U = np.linalg.qr(rng.normal(size=(d, d)))[0]
    S = (U * np.logspace(-9, 3, d)) @ U.T
    S = 0.5 * (S + S.T)
    m = rng.normal(size=d)
    for S0 in (S, S * (1 + 1e-13)):
        kl = float(gaussian_kl(m, S0, m, S))
        assert 0.0 <= kl < 1e-9
    # and a genuine difference along the thinnest direction is seen
    S0 = S + 1e-9 * np.outer(U[:, 0], U[:, 0])
    assert float(gaussian_kl(m, S0, m, S)) == pytest.approx(0.5 * (1 - np.log(2)), rel=1e-3)


def test_kl_divergence_of_weights_within_rounding_is_not_negative():
    """The weights' term summed as w ln(w / v) - w + v per class: a model whose weights differ
    from the reference's by rounding (a debiased release at a large budget) is at zero, not
    below it, and a class with no weight in the released model counts as the formula says."""
    p, _ = _two_models()
    rng = np.random.default_rng(3)
    for _ in range(200):
        w = p.weights * (1 + 1e-15 * rng.normal(size=3))
        w = w / w.sum()
        q = kr.GMM(w, p.means, p.covariances)
        assert kr.kl_divergence(q, p) >= 0.0
        assert kr.kl_divergence(q, p) < 1e-14
    q = kr.GMM(np.array([0.0, 0.6, 0.4]), p.means, p.covariances)
    want = 0.6 * np.log(0.6 / 0.5) + 0.4 * np.log(0.4 / 0.3)
    assert kr.kl_divergence(q, p) == pytest.approx(want, rel=1e-12)


def test_gaussian_kl_far_from_the_reference_is_accurate_and_quiet():
    """A released covariance far thinner than the reference along one direction (a - 1
    rounds to -1 below a = 1e-16) or far wider (its square overflows): the textbook value, or
    inf, with no warning; never NaN."""
    import warnings

    S1 = np.array([[2.0, 0.9, 0.3], [0.9, 1.5, 0.2], [0.3, 0.2, 1.0]])
    z = np.zeros(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in (1e-12, 1e-16, 5e-17, 1e-20, 1e-60, 1e-300):
            S0 = np.diag([1.0, 1.0, t])
            assert float(gaussian_kl(z, S0, z, S1)) == pytest.approx(
                _textbook_kl(z, S0, z, S1), rel=1e-12)
        assert float(gaussian_kl(z[:2], 1e160 * np.eye(2), z[:2], 1e-160 * np.eye(2))) == np.inf
        # a singular value that is itself inf, and means a float range apart
        d = 8
        S0 = 1.7e308 * (0.999 * np.ones((d, d)) + 0.001 * np.eye(d))
        assert float(gaussian_kl(np.zeros(d), S0, np.zeros(d), 2.3e-308 * np.eye(d))) == np.inf
        assert float(gaussian_kl(z[:2], np.eye(2), np.full(2, 1e200), np.eye(2))) == np.inf
