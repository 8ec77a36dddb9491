"""``rr-with-prior``: randomized response with a prior from a first stage of reports (label
flip, pure eps-DP)."""

import warnings

import numpy as np
import pytest
from conftest import synthetic_gmm_data

import klrelease as kr
from klrelease.privacy.response import (
    prior_response_logpmf,
    prior_response_weights,
    prior_sets,
    respond_with_prior,
    response_probabilities,
)


def test_sets_grow_with_epsilon_and_with_doubt():
    prior = np.array([[0.97, 0.02, 0.01], [0.4, 0.35, 0.25], [1 / 3, 1 / 3, 1 / 3]])
    order, k = prior_sets(prior, 1.0)
    assert k.tolist() == [1, 3, 3] and order[0, 0] == 0
    assert prior_sets(prior, 0.1)[1].tolist() == [1, 1, 3]
    assert prior_sets(prior, 30.0)[1].tolist() == [3, 3, 3]


def test_every_output_ratio_is_at_most_e_eps_whatever_the_prior():
    """The exact privacy loss of the reports over every single-label change, with priors
    that put some labels outside their sets."""
    rng = np.random.default_rng(0)
    K, eps, N = 4, 0.9, 40
    codes = rng.integers(0, K, N)
    prior = rng.dirichlet(np.full(K, 0.3), size=N)
    order, k = prior_sets(prior, eps)
    assert len(set(k.tolist())) > 1  # several set sizes
    worst = 0.0
    for _ in range(150):
        z = respond_with_prior(codes, order, k, eps, rng)
        base = prior_response_logpmf(z, codes, order, k, eps)
        assert np.isfinite(base)
        n = int(rng.integers(N))
        for b in range(K):
            other = codes.copy()
            other[n] = b
            worst = max(worst, abs(base - prior_response_logpmf(z, other, order, k, eps)))
    assert worst <= eps + 1e-12
    assert worst > 0.5 * eps  # the bound is approached


def test_within_set_weights_are_unbiased_and_add_up_to_one():
    rng = np.random.default_rng(1)
    K, eps = 3, 1.0
    prior = np.array([[0.4, 0.35, 0.25]] * 3 + [[0.5, 0.3, 0.2]] * 2 + [[0.9, 0.05, 0.05]])
    order, k = prior_sets(prior, eps)
    assert k.tolist() == [3, 3, 3, 2, 2, 1]
    codes = np.array([0, 1, 2, 1, 0, 0])  # every label inside its set
    reps = 20000
    acc = np.zeros((codes.size, K))
    for _ in range(reps):
        W = prior_response_weights(respond_with_prior(codes, order, k, eps, rng), order, k,
                                   eps, K)
        np.testing.assert_allclose(W.sum(axis=1), 1.0, atol=1e-12)
        acc += W
    truth = np.eye(K)[codes]
    a, b = response_probabilities(eps, 3)
    assert np.max(np.abs(acc / reps - truth)) < 5 * np.sqrt(a * (1 - a) / reps) / (a - b)
    # a label outside its set counts toward the set's classes: the one bias of the estimate
    W = prior_response_weights(respond_with_prior(np.array([2]), order[3:4], k[3:4], eps, rng),
                               order[3:4], k[3:4], eps, K)
    assert W[0, 2] == 0.0 and W.sum() == pytest.approx(1.0)


def _data(seed=4, N=60):
    X, y = synthetic_gmm_data(N=N, K=3, d=2, seed=seed)
    return X, y, kr.as_labelled_data(X, y, classes=[0, 1, 2], min_class_size=0)


def test_the_whole_release_is_pure_eps_dp_over_label_flips():
    """The plan's exact log-probability of whole outputs (split, first-stage reports, second
    stage's reports under the prior those give) under every single-label change."""
    X, y, data = _data(N=30)
    eps = 1.2
    p = kr.plan(data, None, epsilon=eps, delta=1e-5, mechanism="rr-with-prior",
                stage_share=0.5)
    rng = np.random.default_rng(2)
    worst, sizes = 0.0, set()
    for _ in range(40):
        out = p.sample(rng)
        sizes.update(p.set_sizes(out).tolist())
        base = p.log_density(out)["weights"]
        n = int(rng.integers(y.size))
        for b in range(3):
            y2 = y.copy()
            y2[n] = b
            q = kr.plan(kr.as_labelled_data(X, y2, classes=[0, 1, 2], min_class_size=0), None,
                        epsilon=eps, delta=1e-5, mechanism="rr-with-prior", stage_share=0.5)
            worst = max(worst, abs(base - q.log_density(out)["weights"]))
    assert worst <= eps + 1e-9
    assert sizes - {3}, "the prior never shrank a set"


def test_release_is_certified_audited_and_refuses_what_it_cannot_do():
    X, y, data = _data()
    rel = kr.release(X, y, epsilon=1.0, delta=1e-5, classes=[0, 1, 2],
                     mechanism="rr-with-prior")
    assert rel.privacy.certified and rel.privacy.neighbouring.value == "label-flip"
    assert "prior" in rel.privacy.statement
    r = kr.audit("rr-with-prior", data, None, epsilon=1.0, delta=1e-5, n_samples=300,
                 max_pairs=4, seed=0)
    assert r.certified_claim and not r.violation, r.summary()
    with pytest.raises(ValueError, match="label-flip|adjacency|relation"):
        kr.plan(X, y, epsilon=1.0, delta=1e-5, classes=[0, 1, 2], mechanism="rr-with-prior",
                adjacency="replace-one")
    from klrelease.stream import ArraySource

    with pytest.raises(ValueError, match="in memory"):
        kr.plan(ArraySource(X, y, classes=[0, 1, 2]), None, epsilon=1.0, delta=1e-5,
                mechanism="rr-with-prior")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seeded = kr.release(X, y, epsilon=1.0, delta=1e-5, classes=[0, 1, 2],
                            mechanism="rr-with-prior", seed=3)
    assert not seeded.privacy.certified


def test_it_reaches_the_fit_as_epsilon_grows_and_is_invariant_to_units():
    iris = kr.load_dataset("iris")
    fit = kr.fit_gmm(iris.X, iris.codes)
    ref = kr.GMM(fit.weights, fit.means, fit.covariances, iris.classes)
    kls = []
    for eps in (1.0, 20.0):
        p = kr.plan(iris, None, epsilon=eps, delta=1e-5, mechanism="rr-with-prior")
        kls.append(kr.expected_kl(p, ref, n_draws=10, seed=0).mean)
    assert kls[1] < 1e-9 < kls[0]
    # the same draws with feature 0 in other units give the same KL
    X2 = iris.X * np.array([1e3, 1, 1, 1])
    fit2 = kr.fit_gmm(X2, iris.codes)
    ref2 = kr.GMM(fit2.weights, fit2.means, fit2.covariances, (0, 1, 2))
    d2 = kr.as_labelled_data(X2, iris.codes, classes=(0, 1, 2), min_class_size=0)
    a = kr.expected_kl(kr.plan(iris, None, epsilon=2.0, delta=1e-5,
                               mechanism="rr-with-prior"), ref, n_draws=5, seed=7).mean
    b = kr.expected_kl(kr.plan(d2, None, epsilon=2.0, delta=1e-5,
                               mechanism="rr-with-prior"), ref2, n_draws=5, seed=7).mean
    assert a == pytest.approx(b, rel=1e-6)
