"""``dp-em`` (klrelease/learners/dpem/DPEM.md): the sensitivity of every stage, the exact
histogram sampler, the GDP ledger, and what the learner releases."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from klrelease.learners import learn
from klrelease.learners.dpem.design import (
    Model,
    clip_correction,
    iteration_noise,
    make_design,
    regions,
)
from klrelease.learners.dpem.learner import em_statistics, noisy_grid_histogram
from klrelease.privacy.guarantee import BudgetAccountant

BOUNDS = {"R": 30.0, "sigma_max": 2.0, "sigma_min": 0.5}


def _design(n=20000, d=3, k=3, eps=1.0, delta=1e-6, T=8):
    return make_design(n, d, k, eps, delta, R=30.0, sigma_max=2.0, sigma_min=0.5,
                       iterations=T)


# ------------------------------------------------------------------------------ the ledger


@pytest.mark.parametrize("k,d,T", [(1, 1, 1), (2, 2, 8), (3, 5, 8), (5, 10, 20)])
@pytest.mark.parametrize("eps,delta", [(0.1, 1e-6), (1.0, 1e-6), (4.0, 1e-8), (10.0, 1e-5)])
def test_gdp_ledger_spends_the_request_and_matches_dp_accounting(k, d, T, eps, delta):
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    des = _design(d=d, k=k, eps=eps, delta=delta, T=T)
    led = des.ledger()
    stages = [des.pca_s, des.init_s, *des.iteration_s]
    assert math.isclose(math.sqrt(sum(s * s for s in stages)), des.mu, rel_tol=1e-12)
    assert math.isclose(led.gdp_mu(), des.mu, rel_tol=1e-12)
    e, dl = led.total()
    assert e == eps and dl <= delta
    assert dl >= 0.999 * delta  # the whole budget is used, not a fraction of it
    acct = PLDAccountant(value_discretization_interval=1e-4)
    acct.compose(dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / des.mu))
    assert acct.get_delta(eps) <= delta * 1.01  # PLD is an upper bound (discretisation)


def test_gdp_ledger_refuses_a_non_gaussian_piece():
    from klrelease.privacy.ledger import Ledger

    led = Ledger(1.0, 1e-6, accountant="gdp")
    with pytest.raises(ValueError, match="Gaussian pieces"):
        led.add("laplace count", 0.5, kind="pure")


# ------------------------------------------------------------------------- sensitivities


def _separated_model(des, spread=100.0):
    k, d = des.k, des.d
    means = np.zeros((k, d))
    means[:, 0] = spread * np.arange(k)
    eye = np.repeat(np.eye(d)[None], k, axis=0)
    return Model(np.full(k, 1.0 / k), means, eye, 1e-6 * eye)


def _whitened_sq(des, model, noise, t, t2):
    reg = regions(des, model)
    r = des.region_radius
    a = em_statistics(t[None], model.weights, reg, r)
    b = em_statistics(t2[None], model.weights, reg, r)
    out = np.sum((a[0] - b[0]) ** 2) / noise.count_sd**2
    out += np.sum((a[1] - b[1]) ** 2) / noise.mean_sd**2
    if np.isfinite(noise.cov_sd):
        out += np.sum((a[2] - b[2]) ** 2) / noise.cov_sd**2
    return out


@pytest.mark.parametrize("d,k,n", [(2, 2, 20000), (5, 3, 20000), (3, 4, 300)])
def test_iteration_sensitivity_is_the_design_s_and_is_reached(d, k, n):
    """Any two rows move one iteration's release by at most ``s`` in whitened norm; a row
    moving from the edge of one component's region to the edge of another's reaches it."""
    des = _design(n=n, d=d, k=k)
    rng = np.random.default_rng(d + k)
    for s, final in ((des.iteration_s[0], False), (des.iteration_s[-1], True)):
        noise = iteration_noise(des, s, final)
        model = _separated_model(des)
        worst = 0.0
        for _ in range(300):  # random rows, near and far, and random overlapping models
            m2 = Model(rng.dirichlet(np.ones(k)), rng.normal(size=(k, d)) * 3,
                       model.covs * rng.uniform(0.1, 1.0, size=(k, 1, 1)), model.centre_cov)
            t, t2 = rng.normal(size=(2, d)) * rng.choice([1.0, 5.0, 1e3], size=(2, 1))
            worst = max(worst, _whitened_sq(des, m2, noise, t, t2))
        e = np.eye(d)
        between = _whitened_sq(des, model, noise, model.means[0] + 10 * e[0],
                               model.means[1] + 10 * e[-1])
        assert worst <= s * s * (1 + 1e-9)
        assert between <= s * s * (1 + 1e-9)
        assert between >= 0.99 * s * s  # the bound is attained: a looser design would fail


def test_count_noise_rides_on_the_between_component_slack():
    """With a smaller count noise than ``mean_sd / r`` the between-component case would
    exceed the budget: the check above can fail."""
    from dataclasses import replace

    des = _design(d=3, k=2)
    noise = iteration_noise(des, des.iteration_s[-1])
    tight = replace(noise, count_sd=0.5 * noise.count_sd)
    model = _separated_model(des)
    e = np.eye(3)
    val = _whitened_sq(des, model, tight, model.means[0] + 10 * e[0],
                       model.means[1] + 10 * e[2])
    assert val > 1.1 * des.iteration_s[-1] ** 2  # s^2 (1 + 1.5 f), f the means' share


def test_pca_sensitivity():
    des = _design(d=6, k=2)
    sd_s, sd_m = des.pca_sd
    b = des.ball
    rng = np.random.default_rng(3)

    def change(t, t2):
        return (np.sum((t - t2) ** 2) / sd_s**2
                + np.sum((np.outer(t, t) - np.outer(t2, t2)) ** 2) / sd_m**2)

    worst = 0.0
    for _ in range(500):
        t, t2 = rng.normal(size=(2, 6))
        t *= b * rng.uniform() / np.linalg.norm(t)
        t2 *= b * rng.uniform() / np.linalg.norm(t2)
        worst = max(worst, change(t, t2))
    e = np.eye(6) * b
    assert worst <= des.pca_s**2 * (1 + 1e-9)
    assert change(e[0], e[1]) <= des.pca_s**2 * (1 + 1e-9)
    assert change(e[0], e[1]) >= 0.85 * des.pca_s**2


# ------------------------------------------------------------------ the histogram sampler


def test_exact_histogram_sampler_has_the_law_of_the_full_histogram():
    """Kept cells and values of the Gaussian mechanism on every cell, against the sampler
    that never visits the empty cells (20000 draws each)."""
    n_cells, sd, tau = 40, 1.0, 1.0
    keys = np.array([3] * 2 + [7] * 1 + [11] * 5)
    full_rng, fast_rng = np.random.default_rng(1), np.random.default_rng(2)
    draws = 20000
    freq_full, freq_fast = np.zeros(n_cells), np.zeros(n_cells)
    kept_full, kept_fast = [], []
    val_full, val_fast = [], []
    counts = np.bincount(keys, minlength=n_cells)
    for _ in range(draws):
        noisy = counts + full_rng.normal(0.0, sd, size=n_cells)
        cells = np.flatnonzero(noisy >= tau)
        freq_full[cells] += 1
        kept_full.append(len(cells))
        val_full += list(noisy[cells[counts[cells] == 0]])
        cells2, vals2 = noisy_grid_histogram(keys, n_cells, sd, tau, fast_rng)
        freq_fast[cells2] += 1
        kept_fast.append(len(cells2))
        val_fast += list(vals2[counts[cells2] == 0])
    p = freq_full / draws
    se = np.sqrt(np.maximum(p * (1 - p), 1e-4) / draws) * math.sqrt(2)
    assert np.all(np.abs(freq_fast / draws - p) < 5 * se)
    assert abs(np.mean(kept_full) - np.mean(kept_fast)) < 0.05
    assert abs(np.var(kept_full) - np.var(kept_fast)) < 0.15 * np.var(kept_full)
    assert abs(np.mean(val_full) - np.mean(val_fast)) < 0.01  # the tail above tau


# --------------------------------------------------------------------- the learner


def _mixture(n, means, rng, scale=1.0):
    z = rng.integers(0, len(means), n)
    return means[z] + scale * rng.normal(size=(n, means.shape[1])), z


def test_recovers_a_separated_mixture_at_1e4_eps_1():
    rng = np.random.default_rng(40)
    means = np.zeros((3, 5))
    means[:, 0] = [-40.0, 0.0, 40.0]
    X, _ = _mixture(10000, means, rng)
    res = learn(X, 3, epsilon=1.0, delta=1e-6, learner="dp-em", seed=1, R=48.0,
                sigma_max=2.0)
    assert res.ok
    err = np.linalg.norm(res.gmm.means[:, None] - means[None], axis=2).min(axis=1)
    assert np.all(err < 0.5)  # measured 0.03-0.2 sigma
    assert np.allclose(np.sort(res.gmm.weights), 1 / 3, atol=0.03)
    ev = np.linalg.eigvalsh(res.gmm.covariances)
    assert np.all((ev > 0.5) & (ev < 2.0))  # true covariance I


def test_beats_the_published_recipe_on_the_same_budget():
    from klrelease.experiments.learners_regimes import _matched_kl
    from klrelease.gmm import fit_gmm

    rng = np.random.default_rng(41)
    means = np.array([[-30.0, 0.0], [30.0, 0.0]])
    X, z = _mixture(10000, means, rng)
    ref = fit_gmm(X, z)
    ours = learn(X, 2, epsilon=1.0, delta=1e-6, learner="dp-em", seed=2, R=36.0,
                 sigma_max=2.0)
    park = learn(X, 2, epsilon=1.0, delta=1e-6, learner="park-dp-em", seed=2, R=36.0,
                 sigma_max=2.0)
    assert _matched_kl(ours.gmm, ref) < 0.01 * _matched_kl(park.gmm, ref)


def test_overlapping_components_beat_the_kmeans_plus_plus_start():
    from sklearn.cluster import kmeans_plusplus

    from klrelease.experiments.learners_regimes import _matched_kl
    from klrelease.gmm import GMM, fit_gmm

    rng = np.random.default_rng(42)
    means = np.array([[-1.5, 0.0], [1.5, 0.0]])
    X, z = _mixture(20000, means, rng)
    ref = fit_gmm(X, z)
    res = learn(X, 2, epsilon=1.0, delta=1e-6, learner="dp-em", seed=3, R=2.0, sigma_max=2.0,
                sigma_min=0.5)
    c, _ = kmeans_plusplus(X, 2, random_state=0)
    lab = np.argmin(((X[:, None] - c[None]) ** 2).sum(-1), axis=1)
    start = GMM(np.bincount(lab) / len(X), np.array([X[lab == j].mean(0) for j in (0, 1)]),
                np.array([np.cov(X[lab == j].T) for j in (0, 1)]))
    assert _matched_kl(res.gmm, ref) < 0.5 * _matched_kl(start, ref)


def test_extrapolation_takes_overlapping_components_to_em_s_fixed_point(monkeypatch):
    """With the noise negligible (eps = 1e5) the release tends to what non-private EM
    converges to; without the extrapolation a fixed iteration count stops short of it on
    overlapping components (measured: KL to EM's fit 2.5e-5 on average without, 1.1e-6
    with, over the three seeds)."""
    from klrelease.experiments.learners_regimes import _em_fit, _matched_kl
    from klrelease.gmm import fit_gmm
    from klrelease.learners.dpem import design as dpem_design

    rng = np.random.default_rng(44)
    means = np.array([[-1.5, 0.0], [1.5, 0.0]])
    X, z = _mixture(20000, means, rng)
    ref = fit_gmm(X, z)
    em = _em_fit(X, 2, ref.weights, ref.means, ref.covariances)[0]

    def mean_kl(window):
        monkeypatch.setitem(dpem_design.SETTINGS, "extrapolate_window", window)
        runs = [learn(X, 2, epsilon=1e5, delta=1e-6, learner="dp-em", seed=s, R=2.0,
                      sigma_max=2.0, sigma_min=0.5) for s in range(3)]
        assert all(len(r.diagnostics["extrapolations"]) == 0 for r in runs) == (window == 0)
        return float(np.mean([_matched_kl(r.gmm, em) for r in runs]))

    with_jumps, without = mean_kl(3), mean_kl(0)
    assert with_jumps < 5e-6
    assert with_jumps < 0.2 * without


def test_clip_correction_is_total_where_the_clipped_share_is_below_rounding():
    # the values a released second moment gave at k = 5, d = 5, eps = 4, N = 1e3 (separated
    # components): the clipped share's terms round h(m) just above m, and the bracket of the
    # root search was empty (an exception after noise was drawn)
    m, d, r = 0.17411962703186867, 5, 3.884105105347819
    assert clip_correction(m, d, r) == 1.0
    rng = np.random.default_rng(5)
    for _ in range(2000):
        d = int(rng.integers(1, 60))
        m = float(np.exp(rng.uniform(-12, 12)))
        r = float(np.sqrt(m * d * np.exp(rng.uniform(-3, 7))))
        f = clip_correction(m, d, r)
        assert np.isfinite(f) and f >= 1.0


def test_a_bound_far_wider_than_sigma_max_keeps_the_start_definite():
    # R / sigma_max = 3.5e8 (a tight cluster far from the origin): the starting centres'
    # noise covariance, cell + complement * (I - V V^T), took the rounding of I - V V^T times
    # 1.4e16 and was indefinite (diagonal -5.2); two of eight means became NaN after noise
    # was drawn (seeds 1 and 5 of 20)
    X = np.array([0.466, -3.69]) + 1.5e-8 * np.random.default_rng(0).normal(size=(55, 2))
    for s in (1, 5):
        res = learn(X, 8, epsilon=1000.0, delta=1e-10, learner="dp-em", seed=s, R=14.0,
                    sigma_max=4e-8)
        g = res.gmm
        assert res.ok and "fallback" not in res.diagnostics
        assert np.all(np.isfinite(g.means)) and np.all(np.isfinite(g.covariances))
        for C in g.covariances:
            np.linalg.cholesky(C)
    d = make_design(1000, 6, 3, 1.0, 1e-6, R=1e9, sigma_max=1.0, sigma_min=0.5)
    from klrelease.learners.dpem.design import init_model

    V = np.linalg.qr(np.random.default_rng(1).normal(size=(6, d.p)))[0]
    m = init_model(d, np.zeros((1, d.p)), np.array([10.0]), V, np.random.default_rng(2))
    for C in m.centre_cov:
        assert np.linalg.eigvalsh(C).min() > 0


def test_an_invalid_final_model_releases_the_last_valid_one(monkeypatch):
    # a defect after noise was drawn must not raise (the budget is spent): the release is the
    # last valid iteration's model, and the diagnostics say so
    from dataclasses import replace

    import klrelease.learners.dpem.learner as dpem_learner

    real, calls = dpem_learner.update, [0]

    def broken(*args, **kwargs):
        calls[0] += 1
        model = real(*args, **kwargs)
        return replace(model, means=model.means * np.nan) if calls[0] > 3 else model

    monkeypatch.setattr(dpem_learner, "update", broken)
    X = np.random.default_rng(0).normal(size=(500, 2))
    res = learn(X, 2, epsilon=1.0, delta=1e-6, learner="dp-em", seed=0, R=5.0, sigma_max=2.0)
    assert res.ok and np.all(np.isfinite(res.gmm.means))
    assert res.diagnostics["fallback"] == "the last valid model of the run was released"
    monkeypatch.undo()
    res = learn(X, 2, epsilon=1.0, delta=1e-6, learner="dp-em", seed=0, R=5.0, sigma_max=2.0)
    assert "fallback" not in res.diagnostics


@pytest.mark.parametrize("eps,delta", [(1e-3, 1e-6), (1.0, 1e-12), (1e3, 1e-6)])
def test_never_fails_and_releases_a_valid_mixture(eps, delta):
    rng = np.random.default_rng(43)
    cases = [np.zeros((50, 2)), np.ones((3, 3)), rng.normal(size=(2, 2)) * 1e6,
             np.vstack([np.zeros((200, 2)), np.full((1, 2), 1e9)]), rng.normal(size=(300, 1)),
             np.vstack([rng.normal(size=(100, 3)), np.full((1, 3), 1.5e308)])]
    with warnings.catch_warnings():  # nothing escapes as a warning either
        warnings.simplefilter("error")
        for X in cases:
            for k in (1, 3):
                res = learn(X, k, epsilon=eps, delta=delta, learner="dp-em", seed=0, R=10.0,
                            sigma_max=3.0)
                g = res.gmm
                assert res.ok and g.n_components == k
                assert np.all(np.isfinite(g.means)) and np.isclose(g.weights.sum(), 1.0)
                assert np.all(np.linalg.eigvalsh(g.covariances) > 0)


def test_unseeded_is_certified_with_its_curve_and_seeded_is_an_experiment():
    rng = np.random.default_rng(44)
    X = rng.normal(size=(2000, 2))
    res = learn(X, 2, epsilon=1.0, delta=1e-6, learner="dp-em", R=5.0, sigma_max=2.0)
    g = res.guarantee
    assert res.secure and g.certified and g.neighbouring == "replace-one"
    assert "gdp" in g.accounting and g.curve is not None
    assert g.curve.delta_at(1.0) <= 1e-6 and g.curve.delta_at(2.0) < g.curve.delta_at(1.0)
    acc = BudgetAccountant(2.0, 1e-5)
    acc.spend(g)
    acc.spend(g)  # two releases compose through their Gaussian curves
    seeded = learn(X, 2, epsilon=1.0, delta=1e-6, learner="dp-em", seed=5, R=5.0,
                   sigma_max=2.0)
    assert not seeded.secure and not seeded.guarantee.certified


def test_public_options_are_checked_before_the_data():
    X = np.zeros((10, 2))
    with pytest.raises(ValueError, match="needs the public parameters R, sigma_max"):
        learn(X, 2, epsilon=1.0, delta=1e-6, learner="dp-em", seed=0)
    for bad in (0, 2.5, -1):
        with pytest.raises(ValueError, match="iterations"):
            learn(X, 2, epsilon=1.0, delta=1e-6, learner="dp-em", seed=0, R=1.0,
                  sigma_max=1.0, iterations=bad)
    with pytest.raises(ValueError, match="sigma_min must not exceed sigma_max"):
        learn(X, 2, epsilon=1.0, delta=1e-6, learner="dp-em", seed=0, R=1.0, sigma_max=1.0,
              sigma_min=2.0)


def test_a_bound_beyond_the_arithmetic_is_refused_before_any_noise(monkeypatch):
    # R / sigma_max of 1e19 overflowed the histogram's int64 cell index after the private
    # PCA's noise was drawn (d >= 3), and 1e160 the PCA's ball^2: both now refused first
    import klrelease.learners.dpem.learner as dpem_learner

    def drawn(*args, **kwargs):
        raise AssertionError("noise drawn before the public inputs were checked")

    monkeypatch.setattr(dpem_learner, "private_pca", drawn)
    monkeypatch.setattr(dpem_learner, "noisy_cell_histogram", drawn)
    X = np.random.default_rng(0).normal(size=(200, 3))
    for d, R in ((3, 1e19), (3, 1e160), (2, 1e19), (2, 1.7e308)):
        with pytest.raises(ValueError, match="too large for dp-em's arithmetic"):
            learn(X[:, :d], 3, epsilon=1.0, delta=1e-6, learner="dp-em", seed=1, R=R,
                  sigma_max=1.0)
    monkeypatch.undo()
    res = learn(X, 3, epsilon=1.0, delta=1e-6, learner="dp-em", seed=1, R=1e15, sigma_max=1.0)
    assert res.ok and np.all(np.isfinite(res.gmm.means))


def test_diagnostics_hold_only_public_or_released_values():
    rng = np.random.default_rng(45)
    X, _ = _mixture(3000, np.array([[-10.0, 0.0], [10.0, 0.0]]), rng)
    res = learn(X, 2, epsilon=1.0, delta=1e-6, learner="dp-em", seed=0, R=12.0, sigma_max=2.0)
    # extrapolations: where the released models' drift was extrapolated (post-processing)
    assert set(res.diagnostics) == {"ledger", "design", "iterations", "released_cells",
                                    "combined_iterations", "extrapolations"}
    zeros = learn(np.zeros_like(X), 2, epsilon=1.0, delta=1e-6, learner="dp-em", seed=0,
                  R=12.0, sigma_max=2.0)
    # the ledger, the design and the noise scales are the same for any data of this shape
    for key in ("ledger", "design", "iterations"):
        assert res.diagnostics[key] == zeros.diagnostics[key]
