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


def test_the_sampler_draws_the_law_the_log_density_states():
    """Empirical frequencies of every report against ``exp(prior_response_logpmf)``, for
    labels inside and outside their sets and set sizes 1, 2 and 4: a sampler that reported
    anything else (say the prior's top class for every label outside its set) would fail."""
    rng = np.random.default_rng(5)
    K, eps, reps = 4, 0.8, 40000
    priors = {1: [0.97, 0.01, 0.01, 0.01], 2: [0.55, 0.4, 0.03, 0.02], 4: [0.25] * 4}
    for size, prior in priors.items():
        order, k = prior_sets(np.array([prior]), eps)
        assert k[0] == size
        for label in range(K):
            codes = np.full(reps, label)
            z = respond_with_prior(codes, np.repeat(order, reps, axis=0), np.repeat(k, reps),
                                   eps, rng)
            for c in range(K):
                p = np.exp(prior_response_logpmf(np.array([c]), np.array([label]), order, k,
                                                 eps))
                seen = np.mean(z == c)
                assert abs(seen - p) <= 5 * np.sqrt(max(p * (1 - p), 1e-12) / reps) + 1e-12, \
                    (size, label, c, seen, p)


def test_a_prior_that_is_not_a_distribution_reports_over_all_classes():
    prior = np.array([[np.nan, 0.5, 0.5], [np.inf, 0.0, 0.0], [0.9, 0.05, 0.05]])
    _, k = prior_sets(prior, 1.0)
    assert k.tolist()[:2] == [3, 3]


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
        assert np.isfinite(base)
        n = int(rng.integers(y.size))
        for b in range(3):
            y2 = y.copy()
            y2[n] = b
            q = kr.plan(kr.as_labelled_data(X, y2, classes=[0, 1, 2], min_class_size=0), None,
                        epsilon=eps, delta=1e-5, mechanism="rr-with-prior", stage_share=0.5)
            other = q.log_density(out)["weights"]
            assert np.isfinite(other)
            worst = max(worst, abs(base - other))
    assert worst <= eps + 1e-9
    assert sizes - {3}, "the prior never shrank a set"


def test_the_prior_reads_no_second_stage_label():
    """The prior, and so every second-stage set, is the same whatever the second stage's
    labels and reports are; it changes with the first stage's reports."""
    X, y, data = _data(N=80)
    p = kr.plan(data, None, epsilon=2.0, delta=1e-5, mechanism="rr-with-prior",
                stage_share=0.5)
    rng = np.random.default_rng(4)
    out = p.sample(rng)
    first = out["stage"].astype(bool)
    z = out["reported"]
    prior = p.prior(first, z)
    flipped = z.copy()
    flipped[~first] = (flipped[~first] + 1) % 3
    y2 = y.copy()
    y2[~first] = (y2[~first] + 2) % 3
    q = kr.plan(kr.as_labelled_data(X, y2, classes=[0, 1, 2], min_class_size=0), None,
                epsilon=2.0, delta=1e-5, mechanism="rr-with-prior", stage_share=0.5)
    np.testing.assert_array_equal(q.prior(first, flipped), prior)
    moved = z.copy()
    moved[first] = (moved[first] + 1) % 3
    assert not np.array_equal(q.prior(first, moved), prior)
    # every second-stage report lies in the set the output's own prior gives
    order, k = prior_sets(prior, 2.0)
    rank = np.argmax(order == z[~first][:, None], axis=1)
    assert np.all(rank < k)


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
