"""Randomized response on labels: the baseline ``randomized-response`` and kl-certified's
response design (label flip)."""

import warnings

import numpy as np
import pytest
from conftest import synthetic_gmm_data

import klrelease as kr
from klrelease.privacy.response import (
    ReportedMoments,
    debiased_moments,
    respond,
    response_dp_event,
    response_logpmf,
    response_probabilities,
)


def test_probabilities_sum_to_one_and_do_not_overflow():
    for eps in (1e-9, 0.5, 5.0, 50.0, 1e4):
        for K in (2, 3, 7):
            p, q = response_probabilities(eps, K)
            assert p + (K - 1) * q == pytest.approx(1.0)
            assert 0 <= q <= p <= 1
            from klrelease.privacy.response import EPS_MAX

            assert p / q == pytest.approx(np.exp(min(eps, EPS_MAX)), rel=1e-9)


def test_every_output_ratio_is_at_most_e_eps_over_label_flips():
    """The exact privacy loss of the reported labels over every single-label change."""
    rng = np.random.default_rng(0)
    K, eps = 4, 1.3
    codes = rng.integers(0, K, 12)
    worst = 0.0
    for _ in range(200):
        z = respond(codes, K, eps, rng)
        n = int(rng.integers(codes.size))
        for b in range(K):
            other = codes.copy()
            other[n] = b
            loss = response_logpmf(z, codes, K, eps) - response_logpmf(z, other, K, eps)
            worst = max(worst, abs(loss))
    assert worst <= eps + 1e-12
    assert worst == pytest.approx(eps)  # attained: the bound is tight


def test_debiased_moments_are_unbiased_and_add_up_to_the_public_totals():
    rng = np.random.default_rng(1)
    K, eps = 3, 1.0
    T = rng.normal(size=(300, 2)) + np.repeat(np.arange(3), 100)[:, None]
    codes = np.repeat(np.arange(3), 100)
    true_S1 = np.stack([T[codes == k].sum(0) for k in range(K)])
    acc = np.zeros_like(true_S1)
    reps = 3000
    for _ in range(reps):
        n, S1, S2, _ = debiased_moments(ReportedMoments.of(T, respond(codes, K, eps, rng), K),
                                        K, eps)
        np.testing.assert_allclose(S1.sum(0), T.sum(0), atol=1e-9)
        np.testing.assert_allclose(n.sum(), T.shape[0], atol=1e-9)
        acc += S1
    # the Monte Carlo mean is within 5 standard errors of the truth
    assert np.max(np.abs(acc / reps - true_S1)) < 5 * 60 / np.sqrt(reps)


def test_reported_moments_merge_by_addition_and_energy_matches_its_definition():
    rng = np.random.default_rng(2)
    T = rng.normal(size=(200, 3)) + 1
    z = rng.integers(0, 3, 200)
    whole = ReportedMoments.of(T, z, 3)
    parts = ReportedMoments.of(T[:70], z[:70], 3) + ReportedMoments.of(T[70:], z[70:], 3)
    for a in ReportedMoments.__slots__:
        np.testing.assert_allclose(getattr(whole, a), getattr(parts, a))
    c = rng.normal(size=(3, 3))
    p, q = response_probabilities(2.0, 3)
    energy = debiased_moments(whole, 3, 2.0)[3]
    for k in range(3):
        v = np.where(z == k, p * (1 - p), q * (1 - q)) / (p - q) ** 2
        r2 = np.sum((T - c[k]) ** 2, 1)
        assert energy(c)[k] == pytest.approx(np.sum(v * r2**2))
        assert energy(c, power=2)[k] == pytest.approx(np.sum(v * r2))


def test_sum_energy_is_the_variance_of_the_debiased_sums():
    """``energy(c, power=2)`` is the expected squared norm of the noise of ``S1_k - n_k c_k``
    (Monte Carlo over the reports, within 15%)."""
    rng = np.random.default_rng(4)
    K, eps = 3, 1.5
    codes = np.repeat(np.arange(K), [150, 120, 30])
    T = rng.normal(size=(300, 2)) + 2.0 * codes[:, None]
    c = np.stack([T[codes == k].mean(0) for k in range(K)])
    true = np.stack([T[codes == k].sum(0) for k in range(K)]) - np.bincount(codes)[:, None] * c
    sq, pred = np.zeros(K), np.zeros(K)
    reps = 1500
    for _ in range(reps):
        n, S1, _, energy = debiased_moments(ReportedMoments.of(T, respond(codes, K, eps, rng),
                                                               K), K, eps)
        sq += np.sum((S1 - n[:, None] * c - true) ** 2, axis=1)
        pred += energy(c, power=2)
    np.testing.assert_allclose(sq / reps, pred / reps, rtol=0.15)


def test_response_design_shrinks_the_noisy_mean_of_a_small_class(monkeypatch):
    """A class of 15 rows among 2000: the rows the others report into it make its debiased
    mean noisy far beyond its spread; the release shrinks it toward the public mean by its
    known noise, and its error falls (the large classes' means barely move)."""
    from klrelease.mechanisms.kl_certified import design

    rng = np.random.default_rng(7)
    sizes = [992, 993, 15]
    codes = np.repeat(np.arange(3), sizes)
    centres = rng.normal(0, 3, (3, 4))
    X = centres[codes] + rng.standard_t(3, size=(2000, 4))
    data = kr.as_labelled_data(X, codes, classes=[0, 1, 2], min_class_size=0)
    p = kr.plan(data, None, epsilon=2.0, delta=1e-5, design="response")
    fit = np.stack([X[codes == k].mean(0) for k in range(3)])
    err = {}
    for shrink in (True, False):
        with monkeypatch.context() as mp:
            if not shrink:
                mp.setattr(design, "shrunk_means", lambda mu, *a: mu)
            rng = np.random.default_rng(0)
            err[shrink] = np.mean([np.linalg.norm(p.draw(rng).means - fit, axis=1)
                                   for _ in range(8)], axis=0)
    assert err[True][2] < 0.5 * err[False][2], err
    assert np.all(err[True][:2] < 1.2 * err[False][:2] + 0.05), err
    m = np.array([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0]])
    s = design.SETTINGS
    out = design.shrunk_means(m, np.zeros(3), np.array([1e9, 0.0]), s)
    np.testing.assert_array_equal(out, [[0.0, 0.0, 0.0], [10.0, 0.0, 0.0]])
    out = design.shrunk_means(m, np.ones(3), np.array([1e9, 0.0]), s)
    np.testing.assert_allclose(out[0], 1.0)  # all noise: the centre
    np.testing.assert_array_equal(out[1], m[1])  # no noise: unchanged
    out = design.shrunk_means(m, np.ones(3), np.array([np.inf, np.nan]), s)
    np.testing.assert_allclose(out, [[1.0, 1.0, 1.0], m[1]])  # total: infinite or NaN energy


def test_response_floor_follows_the_reports_noise_and_vanishes_with_it(monkeypatch):
    """A class whose covariance is thin along one feature: the reported labels' noise (a few
    rows of the wide class reported into it) hides that direction, and the release's floor
    there is a fraction (``response_noise_floor``) of the noise's spectral scale: ten times
    lower at 0.1 than at 1 on the same reports, and closer to the class's own variance; as
    epsilon grows the floor vanishes and the released variance is the class's."""
    from klrelease.mechanisms.kl_certified import design

    rng = np.random.default_rng(11)
    n = 3000
    codes = np.repeat([0, 1], n // 2)
    X = rng.normal(size=(n, 3)) * np.where(codes[:, None] == 0, [1.0, 1.0, 30.0],
                                           [1.0, 1.0, 0.01])
    data = kr.as_labelled_data(X, codes, classes=[0, 1])
    true = np.var(X[codes == 1, 2], ddof=1)

    def thin(epsilon, floor):
        with monkeypatch.context() as mp:
            mp.setitem(design.SETTINGS, "response_noise_floor", floor)
            p = kr.plan(data, None, epsilon=epsilon, delta=1e-5, design="response")
            out = p.sample(np.random.default_rng(2))
            return float(p.finalize(out).covariances[1][2, 2])

    hi, lo = thin(5.0, 1.0), thin(5.0, 0.1)
    assert lo < 0.2 * hi, (lo, hi)
    assert abs(np.log(lo / true)) < abs(np.log(hi / true)), (lo, hi, true)
    assert thin(60.0, 0.1) == pytest.approx(true, rel=0.05)


def test_dp_event_is_pure_epsilon_in_dp_accounting():
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    acc = PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(response_dp_event(1.5, 3))
    assert acc.get_delta(1.5) <= 1e-12
    assert acc.get_delta(1.0) > 0


@pytest.mark.parametrize("mechanism,options", [("randomized-response", {}),
                                               ("public-total", {}),
                                               ("kl-certified", {"design": "response"})])
def test_response_releases_are_certified_and_audited(mechanism, options):
    X, y = synthetic_gmm_data(N=60, K=3, d=2, seed=4)
    rel = kr.release(X, y, epsilon=1.0, delta=1e-5, classes=[0, 1, 2], mechanism=mechanism,
                     **options)
    assert rel.privacy.certified and rel.privacy.neighbouring.value == "label-flip"
    assert "randomized response" in rel.privacy.statement
    data = kr.as_labelled_data(X, y, classes=[0, 1, 2], min_class_size=0)
    r = kr.audit(mechanism, data, None, epsilon=1.0, delta=1e-5, n_samples=400, max_pairs=4,
                 seed=0, **options)
    assert r.certified_claim and not r.violation, r.summary()


def test_response_design_refuses_replace_one():
    X, y = synthetic_gmm_data(N=60, K=3, d=2, seed=4)
    with pytest.raises(ValueError, match="label-flip"):
        kr.plan(X, y, epsilon=1, delta=1e-5, classes=[0, 1, 2], design="response",
                adjacency="replace-one", bounds=(-20, 20))


def test_undeclared_classes_warn_and_are_not_certified():
    X, y = synthetic_gmm_data(N=60, K=3, d=2, seed=4)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        rel = kr.release(X, y, epsilon=1.0, delta=1e-5, mechanism="randomized-response",
                         seed=0)
    assert not rel.privacy.certified


def test_streamed_response_matches_the_law_in_memory():
    """From a chunked source the reported moments have the in-memory law (same means over
    many draws) and the release is a valid model."""
    from klrelease.stream import ArraySource

    X, y = synthetic_gmm_data(N=400, K=3, d=2, seed=6)
    src = ArraySource(X, y, classes=[0, 1, 2], chunk_rows=97)
    p = kr.plan(src, None, epsilon=2.0, delta=1e-5, mechanism="randomized-response")
    q = kr.plan(X, y, epsilon=2.0, delta=1e-5, classes=[0, 1, 2],
                mechanism="randomized-response")
    rng = np.random.default_rng(0)
    a = np.mean([p.moments(p.sample(rng)).counts for _ in range(200)], axis=0)
    b = np.mean([q.moments(q.sample(rng)).counts for _ in range(200)], axis=0)
    np.testing.assert_allclose(a, b, atol=3.0)
    g = p.draw(rng)
    assert np.all(np.linalg.eigvalsh(g.covariances) > 0)


def test_response_design_beats_plain_response_with_common_noise():
    """The same reported labels, post-processed by kl-certified's estimate and by the plain
    baseline: the design's shrinkage lowers the mean KL (iris, eps = 2)."""
    iris = kr.load_dataset("iris")
    fit = kr.fit_gmm(iris.X, iris.codes)
    ref = kr.GMM(fit.weights, fit.means, fit.covariances, iris.classes)
    p = kr.plan(iris, None, epsilon=2.0, delta=1e-5, design="response")
    q = kr.plan(iris, None, epsilon=2.0, delta=1e-5, mechanism="randomized-response")
    rng = np.random.default_rng(3)
    outs = [p.sample(rng) for _ in range(60)]
    a = np.mean([kr.kl_divergence(p.finalize(o), ref) for o in outs])
    b = np.mean([kr.kl_divergence(q.finalize(o), ref) for o in outs])
    assert a < 0.7 * b, (a, b)


def test_budget_accountant_composes_response_and_gaussian_exactly():
    """Randomized-response and Gaussian claims compose by their exact privacy-loss
    distributions; the delta equals dp_accounting's PLD (REPLACE_ONE: one label changed, a
    Gaussian of whitened sensitivity mu is GaussianDpEvent(2 / mu) there)."""
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    from klrelease.privacy.guarantee import (
        BudgetAccountant,
        GaussianCurve,
        Guarantee,
        PureCurve,
        _composed_delta,
    )

    def rr(eps, K):
        return Guarantee(eps, 0.0, "label-flip", True, "", curve=PureCurve(
            eps, response_dp_event(eps, K)))

    gauss = Guarantee(1.0, 1e-5, "label-flip", True, "", curve=GaussianCurve(0.8))
    pld = PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
                        value_discretization_interval=1e-5)
    pld.compose(response_dp_event(1.0, 3))
    pld.compose(response_dp_event(2.0, 2))
    pld.compose(dp_accounting.GaussianDpEvent(2 / 0.8))
    exact = _composed_delta([rr(1.0, 3), rr(2.0, 2), gauss], 3.5)
    assert exact == pytest.approx(pld.get_delta(3.5), rel=1e-4)
    # two releases at eps 1 (pure) fit a budget of (2, 0); a third does not
    acc = BudgetAccountant(2.0, 0.0)
    acc.spend(rr(1.0, 3))
    acc.spend(rr(1.0, 3))
    with pytest.raises(kr.BudgetExceeded):
        acc.spend(rr(1.0, 3))


@pytest.mark.parametrize("mechanism,options", [("kl-certified", {"design": "response"}),
                                               ("randomized-response", {}),
                                               ("public-total", {})])
def test_a_source_failing_while_the_labels_are_drawn_still_releases(mechanism, options):
    """A response release reads a chunked source in one pass while it draws the labels: if
    the source fails in that pass the release does not fail (a re-run would spend the budget
    again); it is the model of the public features alone, and says so."""
    from klrelease.stream import ArraySource

    X, y = synthetic_gmm_data(N=600, K=3, d=2, seed=6)

    class Flaky(ArraySource):
        passes = 0

        def chunks(self):
            type(self).passes += 1
            for i, chunk in enumerate(super().chunks()):
                if type(self).passes > 1 and i == 2:
                    raise OSError("disk gone")
                yield chunk

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = kr.release(Flaky(X, y, classes=[0, 1, 2], chunk_rows=100), None, epsilon=5.0,
                       delta=1e-6, mechanism=mechanism, seed=2, **options)
    assert "public features alone" in r.options["fallback"]
    assert r.gmm.weights.shape == (3,) and np.all(np.isfinite(r.gmm.means))


def test_large_epsilon_still_randomises_and_never_rounds_the_ratio_up():
    """Above EPS_MAX the labels are randomised at EPS_MAX (more private, so the claim holds);
    the chance of a change is computed directly, not as 1 - p (which rounds to 0 past eps of
    about 37), and the sampler rounds it up."""
    from klrelease.privacy.response import EPS_MAX

    p, q = response_probabilities(1000.0, 3)
    assert q > 0 and (p, q) == response_probabilities(EPS_MAX, 3)
    rng = np.random.default_rng(0)
    codes = np.zeros(2_000_000, dtype=np.int64)
    changed = np.count_nonzero(respond(codes, 3, 8.0, rng))
    expected = codes.size * 2 * response_probabilities(8.0, 3)[1]
    assert abs(changed - expected) < 5 * np.sqrt(expected)


def test_a_streamed_label_outside_the_classes_fails_before_any_noise():
    from klrelease.privacy.guarantee import BudgetAccountant
    from klrelease.stream import ArraySource

    X, y = synthetic_gmm_data(N=100, K=2, d=2, seed=1)
    y = y.copy()
    y[5] = 7
    for mech, opts in (("kl-certified", {"design": "response"}), ("randomized-response", {})):
        acc = BudgetAccountant(10.0, 0.5)
        with pytest.raises(ValueError, match="declared classes"):
            kr.release(ArraySource(X, y, classes=[0, 1], chunk_rows=30), None, epsilon=2.0,
                       delta=1e-5, mechanism=mech, accountant=acc, **opts)
        assert len(acc.spent) == 0


def test_randomized_response_keeps_each_features_units():
    """A feature in units of 1e-9 beside one in 1e9: each keeps its own scale (its floor
    was 1e-12 of the largest feature's, and the small one's released variance 1.7e-12
    against its 1e-18: KL 8.6e5 at eps = 100); the release's KL is the same as in units of
    1, draw for draw."""
    import klrelease as kr

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 800)
    X = rng.normal(size=(800, 4)) + y[:, None]
    scaled = X * np.array([1e-9, 1e9, 1.0, 1.0])
    kls = []
    for Z in (X, scaled):
        fit = kr.fit_gmm(Z, y, classes=[0, 1, 2])
        p = kr.plan(Z, y, epsilon=100, delta=1e-5, classes=[0, 1, 2],
                    mechanism="randomized-response")
        g = np.random.default_rng(1)
        kls.append([kr.kl_divergence(p.draw(g), fit) for _ in range(4)])
    np.testing.assert_allclose(kls[1], kls[0], rtol=1e-6, atol=1e-12)
    assert max(kls[1]) < 1e-6
