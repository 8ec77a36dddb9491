import itertools

import numpy as np
import pytest

import klrelease as kr
from klrelease.mechanisms.kl_paper.objective import (
    g_values,
    log_num_compositions,
    multivariate_digamma,
    uniform_expected_g,
)
from klrelease.mechanisms.kl_paper.weight_mapping import (
    WeightMapping,
    mapping_column,
    mapping_matrix,
)
from klrelease.mechanisms.kl_paper.wishart_scale import wishart_scale
from klrelease.neighbours import class_neighbour_vectors
from klrelease.statistics import class_statistics


def test_wishart_scale_hand_cases():
    # Sigma = diag(1, 4): tr(Sigma^{-1}) = 1.25, (d+1)/d * 1.25 = 1.875.
    tr = np.array([1.25, 1.25])
    counts = np.array([10.0, 1000.0])
    budget = np.array([0.1, 0.1])
    # cap 2 * 10 * 0.1 / 3 = 0.6667 binds for the small class; the interior optimum for the big.
    np.testing.assert_allclose(wishart_scale(2, tr, counts, budget), [2 / 3, 1.875])


def test_proposition_2_hand_case():
    # |S'| = 2, eps_0 = ln 2: entries 1/(1 + 2*2) = 0.2 (g >= 0) and 1/(1 + 2/2) = 0.5 (g < 0).
    g = np.array([1.0, -1.0, 2.0])
    col, printed = mapping_column(g, np.log(2.0), 2)
    assert printed == pytest.approx(0.9)
    np.testing.assert_allclose(col, [2 / 9, 5 / 9, 2 / 9])


@pytest.mark.parametrize("eps0", [0.1, 1 / 3, 1.0, 3.0])
def test_mapping_is_a_pmf_meeting_ratio_constraints(eps0):
    rng = np.random.default_rng(0)
    g = rng.normal(size=21)
    F = mapping_matrix(g, eps0, 20)
    assert F[:, 0].sum() == pytest.approx(1.0)
    assert np.all(F >= 0)
    # (17): e^{-eps0} F_ij <= F_ij* <= e^{eps0} F_ij for every j != j*
    for j in range(1, F.shape[1]):
        assert np.all(F[:, 0] <= np.exp(eps0) * F[:, j] * (1 + 1e-12))
        assert np.all(np.exp(-eps0) * F[:, j] <= F[:, 0] * (1 + 1e-12))


def test_printed_column_does_not_sum_to_one():
    # F6: K = 5, eps_0 = 1/3, all g >= 0: (|S'| + 1)/(1 + |S'| e^{eps_0}) = 21/(1 + 20 e^{1/3})
    _, printed = mapping_column(np.ones(21), 1 / 3, 20)
    assert printed == pytest.approx(21 / (1 + 20 * np.exp(1 / 3)))
    assert printed == pytest.approx(0.73, abs=0.005)


def test_uniform_expectation_against_enumeration():
    N, K = 9, 3
    pi = np.array([0.2, 0.3, 0.5])
    h = np.array([0.4, -0.2, 1.3])
    comps = np.array([c for c in itertools.product(range(1, N), repeat=K) if sum(c) == N])
    assert len(comps) == round(np.exp(log_num_compositions(N, K)))
    brute = g_values(comps / N, pi, h).mean()
    assert uniform_expected_g(N, pi, h) == pytest.approx(brute, rel=1e-12)


def test_multivariate_digamma():
    from scipy.special import digamma

    assert multivariate_digamma(2.0, 3) == pytest.approx(digamma(2) + digamma(1.5) + digamma(1))


def test_log_pmf_sums_to_one_over_small_S():
    N, K = 7, 3
    support = np.array([[3, 2, 2], [2, 3, 2], [4, 1, 2]])
    wm = WeightMapping(support=support, probs=np.array([0.5, 0.3, 0.2]), lam=0.1, total=N)
    comps = [c for c in itertools.product(range(1, N), repeat=K) if sum(c) == N]
    total = sum(np.exp(wm.log_pmf(np.array(c))) for c in comps)
    assert total == pytest.approx(1.0)


def _one_dim_data(seed=3):
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1, 2], [30, 45, 25])
    X = (rng.normal(size=100) + 3 * y)[:, None]
    return X, y


def test_d1_closed_form():
    """For d = 1 the SDP has the closed form G = max_n v_n^2 / c."""
    X, y = _one_dim_data()
    p = kr.plan(X, y, epsilon=1.0, delta=1e-5, mechanism="kl-paper")
    s = class_statistics(X, y, 3)
    c = p.design.eps_k**2 / (2 * np.log(2 / 1e-5))
    for k in range(3):
        V = class_neighbour_vectors(X, y, k, s.means[k], int(s.counts[k]))
        expected = np.max(V[:, 0] ** 2) / c[k]
        assert p.design.mean_cov[k, 0, 0] == pytest.approx(expected, rel=1e-5)


def test_design_meets_its_constraints_and_paper_accounting(synthetic):
    X, y = synthetic
    eps, delta = 1.0, 1e-5
    p = kr.plan(X, y, epsilon=eps, delta=delta, mechanism="kl-paper")
    d = p.design
    # the paper's accounting (9) is met with equality
    assert d.budget_used == pytest.approx(eps)
    assert d.eps0 > 0 and np.all(d.eps_k > 0)
    # every neighbour vector satisfies (10): v^T Gamma v <= eps_k^2 / (2 ln(2/delta))
    s = p.stats
    for k in range(s.n_classes):
        V = class_neighbour_vectors(X, y, k, s.means[k], int(s.counts[k]))
        Gamma = np.linalg.pinv(d.mean_cov[k])
        q = np.einsum("ni,ij,nj->n", V, Gamma, V)
        c = d.eps_k[k] ** 2 / (2 * np.log(2 / delta))
        assert q.max() <= c * (1 + 1e-5)
    # the objective sequence does not increase and the loop stopped by its rule or the cap
    tr = np.array(d.objective_trace)
    assert np.all(np.diff(tr) <= 1e-9)
    assert d.iterations <= 20


def test_objective_overstates_exact_expected_kl(synthetic):
    """(12) replaces ln|Sigma + W| by ln|W| <= ln|Sigma + W|, so it exceeds the exact E[KL]."""
    X, y = synthetic
    p = kr.plan(X, y, epsilon=2.0, delta=1e-5, mechanism="kl-paper")
    est = kr.expected_kl(p, kr.fit_gmm(X, y), n_draws=200, seed=0)
    assert est.ci_high < p.design.objective


def test_record_level_variants(synthetic):
    X, y = synthetic
    B = 15.0
    change = kr.plan(X, y, epsilon=1.0, delta=1e-5, adjacency="change-one-record",
                     norm_bound=B, mechanism="kl-paper")
    assert change.design.mapping is None and change.design.eps0 == 0
    # (32) with B squared: G = 4 B^2 ln(2/delta) ... = (2B/N_k)^2 / c_k I
    c = change.design.eps_k**2 / (2 * np.log(2 / 1e-5))
    for k in range(5):
        r2 = (2 * B / change.stats.counts[k]) ** 2
        np.testing.assert_allclose(change.design.mean_cov[k], r2 / c[k] * np.eye(3))
    paper = dict(epsilon=1.0, delta=1e-5, norm_bound=B, mechanism="kl-paper")
    rem = kr.plan(X, y, adjacency="remove-one", **paper)
    assert rem.design.mapping.support.shape == (6, 5)  # pi(D) and K neighbours (29)
    add = kr.plan(X, y, adjacency="add-one", **paper)
    assert np.all(add.design.mapping.support[1:].sum(1) == len(y) + 1)
    with pytest.raises(ValueError, match="norm_bound"):
        kr.plan(X, y, epsilon=1.0, delta=1e-5, adjacency="remove-one", mechanism="kl-paper")
    # smaller B -> more noise
    tight = kr.plan(X, y, epsilon=1.0, delta=1e-5, adjacency="change-one-record",
                    norm_bound=5.0, mechanism="kl-paper")
    assert np.all(np.trace(tight.design.mean_cov, axis1=1, axis2=2)
                  < np.trace(change.design.mean_cov, axis1=1, axis2=2))
