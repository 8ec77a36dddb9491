"""The four baseline mechanisms: valid output, stated guarantees, calibration, DP smoke test."""

import itertools
import warnings

import numpy as np
import pytest

import klrelease
from klrelease.gmm import GMM
from klrelease.mechanisms import get_mechanism
from klrelease.mechanisms.baselines.colored_gaussian import public_mean_noise_cov
from klrelease.mechanisms.baselines.gaussian_iid import joint_gaussian_sigmas, joint_sensitivity
from klrelease.privacy.calibration import gaussian_delta, gaussian_max_sensitivity
from klrelease.warnings_ import PrivacyLeakWarning

BASELINES = [
    ("laplace-iid", {"variant": "paper"}),
    ("laplace-iid", {"variant": "label-flip"}),
    ("gaussian-iid", {}),
    ("colored-gaussian", {"design": "data"}),
    ("colored-gaussian", {"design": "public"}),
    ("r1smg", {}),
]
CERTIFIED = {"laplace-iid/label-flip", "gaussian-iid", "colored-gaussian/public"}


def _key(name, opts):
    return "/".join([name, *map(str, opts.values())])


def _plan(X, y, name, opts, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        return klrelease.plan(X, y, mechanism=name, **{**kw, **opts})


def _check_gmm(g: GMM, N: int, K: int, d: int, floor: float, grid: bool = False):
    assert isinstance(g, GMM)
    assert g.weights.shape == (K,) and g.means.shape == (K, d)
    assert abs(g.weights.sum() - 1) < 1e-12
    assert np.all(g.weights >= 1.0 / N - 1e-12)
    if grid:
        assert np.allclose(g.weights * N, np.round(g.weights * N), atol=1e-9)
    assert np.allclose(g.covariances, np.swapaxes(g.covariances, 1, 2))
    assert np.all(np.linalg.eigvalsh(g.covariances) >= floor * (1 - 1e-9))


@pytest.mark.parametrize("name,opts", BASELINES, ids=[_key(*b) for b in BASELINES])
def test_valid_gmm_and_stated_guarantee_on_synthetic(synthetic, name, opts):
    X, y = synthetic
    p = _plan(X, y, name, opts, epsilon=1.0, delta=1e-5, bounds="features")
    g = p.guarantee
    assert g.certified == (_key(name, opts) in CERTIFIED)
    assert g.neighbouring == "label-flip"
    assert g.statement and (g.certified or g.reasons)
    rng = np.random.default_rng(0)
    floor = p.cov_floor
    for _ in range(20):
        _check_gmm(p.draw(rng), len(y), 5, 3, floor)
    out = p.sample(rng)
    dens = p.log_density(out)
    assert set(dens) == {"weights", "means", "covariances"}
    assert all(np.isfinite(v) for v in dens.values())


@pytest.mark.parametrize("name,opts", BASELINES, ids=[_key(*b) for b in BASELINES])
def test_valid_gmm_on_iris_with_public_bounds(iris, name, opts):
    p = _plan(iris, None, name, opts, epsilon=0.5, delta=1e-6, grid_weights=True)
    assert p.public_options["domain"] == "public bounds"
    rng = np.random.default_rng(1)
    for _ in range(10):
        _check_gmm(p.draw(rng), 150, 3, 4, p.cov_floor, grid=True)


def test_projection_of_extreme_raw_outputs(synthetic):
    X, y = synthetic
    p = _plan(X, y, "gaussian-iid", {}, epsilon=1.0, delta=1e-5, bounds="features")
    raw = {
        "weights": np.array([-3.0, 0.2, 5.0, -0.1, 0.0]),
        "means": np.full((5, 3), 1e6),
        "covariances": np.tile(-np.eye(3) * 1e5, (5, 1, 1)) + np.diag([0, 0, 2e6]),
    }
    g = p.finalize(raw)
    _check_gmm(g, len(y), 5, 3, p.cov_floor)
    assert np.all(g.means <= X.max(axis=0) + 1e-12)  # projected onto the features' box
    top = np.linalg.eigvalsh(g.covariances).max()
    assert top <= 0.5 * np.sum((X.max(0) - X.min(0)) ** 2) * (1 + 1e-12)


def test_release_artifact_states_certified_guarantee(iris):
    rel = klrelease.release(iris, None, epsilon=1.0, delta=1e-5, mechanism="gaussian-iid")
    assert rel.privacy.certified and rel.privacy.neighbouring == "label-flip"
    assert "differentially private" in rel.privacy.statement
    assert klrelease.Release.from_json(rel.to_json()).privacy.certified


def test_joint_calibration_is_exact():
    sens = (0.01, 2.0, 30.0)
    for eps, delta in ((0.1, 1e-5), (1.0, 1e-5), (8.0, 1e-3)):
        sig = joint_gaussian_sigmas(sens, (1, 2, 7), eps, delta)
        s = joint_sensitivity(sens, sig)
        assert s == pytest.approx(gaussian_max_sensitivity(eps, delta), rel=1e-10)
        assert gaussian_delta(1.0, eps, s) == pytest.approx(delta, rel=1e-6)
        # 1% less noise on any block breaks the target delta
        for b in range(3):
            smaller = list(sig)
            smaller[b] *= 0.99
            assert gaussian_delta(1.0, eps, joint_sensitivity(sens, smaller)) > delta


def test_gaussian_iid_plan_meets_delta_exactly(synthetic):
    X, y = synthetic
    from klrelease.mechanisms.baselines.common import resolve_common
    from klrelease.mechanisms.baselines.gaussian_iid import block_sensitivities

    p = _plan(X, y, "gaussian-iid", {}, epsilon=2.0, delta=1e-6, bounds="features")
    mech = get_mechanism("gaussian-iid")
    data = klrelease.as_labelled_data(X, y)
    common = resolve_common(data, {**mech.options, "bounds": "features"}, "gaussian-iid")
    sens = block_sensitivities(common)
    sig = (p.weight_noise.scale, p.mean_noise.scale, p.cov_noise.scale)
    assert gaussian_delta(1.0, 2.0, joint_sensitivity(sens, sig)) == pytest.approx(1e-6, rel=1e-6)


def test_colored_public_design_matches_the_sdp_over_box_vertices(iris):
    from klrelease import solvers
    from klrelease.mechanisms.baselines.common import resolve_common

    mech = get_mechanism("colored-gaussian")
    common = resolve_common(iris, {**mech.options, "min_class_size": 10}, mech.name)
    C = public_mean_noise_cov(common, 1.0)
    a = common.domain.ranges / 10
    V = np.array([a * np.array(s) for s in itertools.product([-1, 1], repeat=4)])
    res = solvers.mean_noise_sdp(np.eye(4), V)
    assert np.trace(C) == pytest.approx(res.objective, rel=1e-4)
    assert solvers.max_violation(C, V) <= 1e-9  # the closed form is feasible


def test_colored_data_design_meets_its_constraints(synthetic):
    from klrelease import solvers
    from klrelease.neighbours import class_neighbour_vectors
    from klrelease.statistics import class_statistics

    X, y = synthetic
    p = _plan(X, y, "colored-gaussian", {"design": "data"}, epsilon=1.0, delta=1e-5,
              bounds="features")
    assert p.solver is not None and "optimal" in p.solver.status
    level = p.public_options["budget_shares"][1] * gaussian_max_sensitivity(1.0, 1e-5) ** 2 / 2
    st = class_statistics(X, y, 5)
    for k, C in enumerate(p.mean_noise.covs):
        V = class_neighbour_vectors(X, y, k, st.means[k], int(st.counts[k]))
        assert solvers.max_violation(C * level, V) <= 1e-6


def test_r1smg_warns_every_time_and_needs_three_features(synthetic, iris):
    X, y = synthetic
    for _ in range(2):
        with pytest.warns(PrivacyLeakWarning, match="dimension >= 4"):
            p = klrelease.plan(X, y, epsilon=1.0, delta=1e-5, mechanism="r1smg",
                               bounds="features")
    assert not p.guarantee.certified
    with pytest.raises(ValueError, match="at least 3 features"):
        klrelease.plan(X[:, :2], y, epsilon=1.0, delta=1e-5, mechanism="r1smg",
                       bounds="features")


def test_r1smg_sigma_and_density(synthetic):
    from scipy.integrate import quad

    from klrelease.mechanisms.baselines.r1smg import RankOneNoise, r1smg_sigma2

    ref = {3: 4.935e10, 4: 4.000e5, 5: 7.630e3, 12: 26.47, 50: 3.537}
    for M, val in ref.items():
        assert r1smg_sigma2(1.0, 1e-5, 1.0, M) == pytest.approx(val, rel=1e-3)
    # the density integrates to one: radial integral of p(r u) r^{M-1} |S^{M-1}|
    law = RankOneNoise(2.0, 1, 3)
    area = 4 * np.pi

    def radial(r):
        return np.exp(law.logpdf(np.array([[r, 0.0, 0.0]]))) * r**2 * area

    assert quad(radial, 0, np.inf)[0] == pytest.approx(1.0, rel=1e-6)


def test_refusals_do_not_reveal_counts(synthetic):
    X, y = synthetic
    counts = np.bincount(y)
    with pytest.raises(ValueError, match="min_class_size") as err:
        klrelease.plan(X, y, epsilon=1.0, delta=1e-5, mechanism="gaussian-iid",
                       bounds="features", min_class_size=int(counts.min()) + 1)
    assert not any(str(c) in str(err.value) for c in counts if c > 20)
    with pytest.raises(ValueError, match="label-flip"):
        klrelease.plan(X, y, epsilon=1.0, delta=1e-5, mechanism="gaussian-iid",
                       bounds="features", adjacency="replace-one")
    with pytest.raises(ValueError, match="public bounds"):
        klrelease.plan(X, y, epsilon=1.0, delta=1e-5, mechanism="laplace-iid")
    with pytest.raises(ValueError, match="variant"):
        klrelease.plan(X, y, epsilon=1.0, delta=1e-5, mechanism="laplace-iid",
                       bounds="features", variant="nope")


def test_replace_one_with_public_box_is_certified(iris):
    p = _plan(iris, None, "gaussian-iid", {"adjacency": "replace-one"}, epsilon=1.0,
              delta=1e-5)
    assert p.guarantee.certified and p.guarantee.neighbouring == "replace-one"
    q = _plan(iris, None, "gaussian-iid", {}, epsilon=1.0, delta=1e-5)
    assert p.cov_noise.scale >= q.cov_noise.scale  # the within-class case costs more


def _corner_pair(n=6):
    """Three classes of n rows, all at one corner except row 0 at the opposite corner."""
    lower, upper = np.array([0.0, 0.0]), np.array([1.0, 2.0])
    X = np.vstack([lower, np.tile(upper, (3 * n - 1, 1))])
    y = np.repeat(np.arange(3), n)
    y2 = y.copy()
    y2[0] = 1
    return X, y, y2, (lower, upper)


def test_gaussian_iid_dp_smoke_on_a_neighbouring_pair():
    """Privacy loss between a neighbouring pair (both with classes of >= min_class_size rows),
    sampled through the plans' exact log-densities. Its hockey-stick divergence must match the
    exact value of a Gaussian mechanism at the pair's actual whitened distance, which must be
    within the target delta; and the event {loss > eps} must obey the DP inequality."""
    from klrelease.linalg import vech

    eps, delta, n_draws = 1.0, 0.05, 4000
    X, y, y2, bounds = _corner_pair()
    opts = dict(epsilon=eps, delta=delta, mechanism="gaussian-iid", bounds=bounds,
                min_class_size=5, budget_shares=(0.001, 0.998, 0.001))
    p, q = klrelease.plan(X, y, **opts), klrelease.plan(X, y2, **opts)
    assert p.guarantee.certified
    s_act = np.sqrt(
        np.sum((p.stats.weights - q.stats.weights) ** 2) / p.weight_noise.scale**2
        + np.sum((p.stats.means - q.stats.means) ** 2) / p.mean_noise.scale**2
        + np.sum(vech(p.stats.covariances - q.stats.covariances) ** 2) / p.cov_noise.scale**2
    )
    exact = gaussian_delta(1.0, eps, s_act)
    assert exact <= delta
    assert exact >= 0.2 * delta  # a near-worst pair: the calibration is not grossly loose
    rng = np.random.default_rng(11)

    def losses(a, b):
        out = np.empty(n_draws)
        for i in range(n_draws):
            o = a.sample(rng)
            out[i] = sum(a.log_density(o).values()) - sum(b.log_density(o).values())
        return out

    L_pq, L_qp = losses(p, q), losses(q, p)
    for L in (L_pq, L_qp):
        assert L.mean() == pytest.approx(s_act**2 / 2, rel=0.1)
        terms = np.maximum(0.0, 1.0 - np.exp(eps - L))
        est, se = terms.mean(), terms.std(ddof=1) / np.sqrt(n_draws)
        assert abs(est - exact) <= 4 * se
        assert est <= delta + 4 * se
    # diffprivlib-style event check on S = {loss > eps}
    p_s = np.mean(L_pq > eps)
    q_s = np.mean(-L_qp > eps)  # the same event, drawn under the neighbour
    assert p_s <= np.exp(eps) * q_s + delta + 4 * np.sqrt(p_s / n_draws)
