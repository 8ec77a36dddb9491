"""Tests of the certified mechanism ``kl-certified`` and its accounting."""

import warnings

import numpy as np
import pytest
from conftest import synthetic_gmm_data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import dlaplace

import klrelease as kr
from klrelease.design.certified import (
    PublicBound,
    PublicInputs,
    choose_budget,
    covariance_noise_scales,
    mean_noise_precisions,
    mean_sensitivity_of,
    upper_triangle,
)
from klrelease.privacy.accounting import exact_delta, pld_delta
from klrelease.privacy.discrete import DiscreteLaplace
from klrelease.warnings_ import PrivacyLeakWarning

BOX = (-15 * np.ones(3), 15 * np.ones(3))


# ------------------------------------------------------------------------------- accounting


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    eps=st.floats(0.1, 8.0),
    log_delta=st.floats(-9.0, -2.0),
    K=st.integers(2, 6),
    d=st.integers(1, 5),
    replace=st.booleans(),
)
def test_budget_never_exceeds_the_requested_delta(eps, log_delta, K, d, replace):
    delta = 10.0**log_delta
    pub = PublicInputs(eps, delta, "replace-one" if replace else "label-flip", 100 * K, K, d,
                       PublicBound(np.zeros(d), half_widths=np.linspace(1, 3, d)), 1e-3)
    b = choose_budget(pub)
    # recomputed independently of the values stored in the budget
    assert pld_delta(eps, b.count_parameter, b.gaussian_sensitivity) <= delta
    assert exact_delta(eps, b.count_parameter, b.gaussian_sensitivity) <= delta
    assert 0 < b.covariance_share < 1 and b.gaussian_sensitivity > 0


def test_closed_form_matches_the_pld_accountant():
    for eps, a, s in [(0.5, 0.05, 0.1), (1.0, 0.2, 0.3), (5.0, 1.0, 1.0)]:
        exact, pld = exact_delta(eps, a, s), pld_delta(eps, a, s)
        assert pld >= exact * (1 - 1e-6)  # pessimistic
        assert pld == pytest.approx(exact, rel=1e-3)


def test_closed_form_against_monte_carlo_privacy_loss():
    eps, a, s = 1.0, 0.3, 0.8
    rng = np.random.default_rng(3)
    n = 400_000
    q = 1 / (1 + np.exp(-a))
    loss = a * (2 * rng.binomial(2, q, n) - 2) + rng.normal(s * s / 2, s, n)
    mc = np.mean(np.maximum(0.0, 1 - np.exp(eps - loss)))
    assert mc == pytest.approx(exact_delta(eps, a, s), rel=0.05)


def test_discrete_laplace_log_pmf_against_brute_force_and_scipy():
    dl = DiscreteLaplace(0.7)
    z = np.arange(-60, 61)
    pmf = np.exp(dl.log_pmf(z))
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(pmf, dlaplace(0.7).pmf(z), rtol=1e-12)
    np.testing.assert_allclose(np.diff(dl.log_pmf(z[z >= 0])), -0.7)
    assert dl.log_pmf(0.5) == -np.inf
    x = dl.sample(np.random.default_rng(0), 200_000)
    freq = np.array([(x == k).mean() for k in range(-3, 4)])
    np.testing.assert_allclose(freq, pmf[57:64], atol=3e-3)
    assert x.var() == pytest.approx(dl.variance, rel=0.03)


# ------------------------------------------------------------------------------- mechanism


@pytest.fixture(scope="module")
def syn():
    return synthetic_gmm_data(N=300, K=3, d=2, seed=5)


def test_release_is_certified_and_valid(iris):
    rel = kr.release(iris, None, epsilon=1.0, delta=1e-5, mechanism="kl-certified", seed=1)
    assert rel.privacy.certified and rel.privacy.neighbouring == "label-flip"
    g = rel.gmm
    assert g.weights.sum() == pytest.approx(1.0) and np.all(g.weights > 0)
    assert np.all(np.linalg.eigvalsh(g.covariances) > 0)
    assert "budget" in rel.options and rel.solver.solver == "clarabel"
    back = kr.Release.from_json(rel.to_json())
    np.testing.assert_allclose(back.gmm.means, g.means)


def test_replace_one_needs_bounds(syn):
    X, y = syn
    with pytest.raises(ValueError, match="public bound"):
        kr.plan(X, y, epsilon=1, delta=1e-5, mechanism="kl-certified", adjacency="replace-one")
    p = kr.plan(X, y, epsilon=1, delta=1e-5, mechanism="kl-certified", adjacency="replace-one",
                bounds=(-20, 20))
    assert p.guarantee.certified and p.guarantee.neighbouring == "replace-one"


def test_bounds_from_data_warns_every_call_and_is_not_certified(syn):
    X, y = syn
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            p = kr.plan(X, y, epsilon=1, delta=1e-5, mechanism="kl-certified",
                        adjacency="replace-one", bounds_from_data=True)
        assert any(issubclass(w.category, PrivacyLeakWarning) for w in caught)
        assert not p.guarantee.certified
    # under label flip a bound from the (public) features keeps the guarantee, silently
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyLeakWarning)
        p = kr.plan(X, y, epsilon=1, delta=1e-5, mechanism="kl-certified")
    assert p.guarantee.certified
    assert p.public_options["bound"] == {"kind": "box", "from_data": True}


def test_design_receives_no_private_input(syn):
    """Neighbouring datasets fed the same released values give the same design."""
    X, y = syn
    y2 = y.copy()
    y2[0] = (y[0] + 1) % 3  # a label flip
    X3 = X.copy()
    X3[1] = [19.0, -19.0]  # a replaced record (features far away)
    kw = dict(epsilon=1.0, delta=1e-5, mechanism="kl-certified", bounds=(-20, 20))
    flip_pair = (kr.plan(X, y, **kw), kr.plan(X, y2, **kw))
    replace_pair = (kr.plan(X, y, adjacency="replace-one", **kw),
                    kr.plan(X3, y, adjacency="replace-one", **kw))
    for a, b in (flip_pair, replace_pair):
        assert repr(a.public) == repr(b.public) and a.budget == b.budget
        assert not np.array_equal(a.second, b.second) or not np.array_equal(a.counts, b.counts)
        out = a.sample(np.random.default_rng(7))
        np.testing.assert_array_equal(
            covariance_noise_scales(a.public, a.budget, out["weights"]),
            covariance_noise_scales(b.public, b.budget, out["weights"]))
        da = a.mean_design(out["weights"], out["covariances"])
        # solved afresh (not from the shared memo) from b's public inputs
        db = mean_noise_precisions(b.public, b.budget, out["weights"], out["covariances"])
        np.testing.assert_array_equal(da.precisions, db.precisions)
        # and both densities are finite: same support
        assert all(np.isfinite(v) for v in b.log_density(out).values())


def test_sensitivities_hold_for_every_label_flip(iris):
    """Brute force over all flips: the whitened changes stay within the budget."""
    p = kr.plan(iris, None, epsilon=1.0, delta=1e-5, mechanism="kl-certified")
    out = p.sample(np.random.default_rng(0))
    design = p.mean_design(out["weights"], out["covariances"])
    sig = covariance_noise_scales(p.public, p.budget, out["weights"])
    T = p.public.bound.clip(iris.X) - p.public.bound.centre
    worst_m = worst_c = 0.0
    for n, a in enumerate(iris.codes):
        t = T[n]
        u = upper_triangle(np.outer(t, t))
        for b in range(3):
            if b == a:
                continue
            m2 = t @ design.precisions[a] @ t + t @ design.precisions[b] @ t
            c2 = (u @ u) * (1 / sig[a] ** 2 + 1 / sig[b] ** 2)
            worst_m, worst_c = max(worst_m, m2), max(worst_c, c2)
    assert np.sqrt(worst_m) <= p.budget.mean_sensitivity * (1 + 1e-9)
    assert np.sqrt(worst_c) <= p.budget.covariance_sensitivity * (1 + 1e-9)
    assert mean_sensitivity_of(p.public, design.precisions) <= p.budget.mean_sensitivity * (
        1 + 1e-12)
    # the box constraint is active: the SDP spends the budget it is given
    assert mean_sensitivity_of(p.public, design.precisions) > 0.99 * p.budget.mean_sensitivity


def test_unseeded_release_uses_the_csprng(iris, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("numpy's default generator must not be used by a release")

    monkeypatch.setattr(np.random, "default_rng", forbidden)
    rel = kr.release(iris, None, epsilon=1.0, delta=1e-5, mechanism="kl-certified")
    assert rel.randomness.secure and rel.randomness.seed is None
    assert rel.privacy.certified


def test_kl_falls_as_epsilon_grows():
    X, y = synthetic_gmm_data()
    ref = kr.fit_gmm(X, y)
    kl = []
    for eps in (0.5, 5.0):
        p = kr.plan(X, y, epsilon=eps, delta=1e-5, mechanism="kl-certified", bounds=BOX)
        kl.append(kr.expected_kl(p, ref, n_draws=12, seed=2).mean)
    assert kl[1] < 0.5 * kl[0]
