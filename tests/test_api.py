import json

import numpy as np
import pytest

import klrelease as kr


def test_public_names():
    assert "kl-paper" in kr.list_mechanisms()
    # the subpackage is not shadowed by a function of the same name
    import klrelease.mechanisms.kl_paper.alternating as alternating

    assert kr.mechanisms.kl_paper.alternating is alternating
    for name in ("fit_gmm", "release", "mechanisms", "kl_divergence", "GMM", "Release"):
        assert hasattr(kr, name)


def test_fit_gmm_matches_statistics(iris):
    g = kr.fit_gmm(iris.X, np.asarray(iris.classes)[iris.codes])
    assert g.classes == ("setosa", "versicolor", "virginica")
    np.testing.assert_allclose(g.weights, [1 / 3] * 3)
    np.testing.assert_allclose(g.means[0], iris.X[iris.codes == 0].mean(0))
    np.testing.assert_allclose(g.covariances[2], np.cov(iris.X[iris.codes == 2].T))


def test_release_is_a_valid_gmm_and_says_it_is_not_certified(synthetic):
    X, y = synthetic
    r = kr.release(X, y, epsilon=1.0, delta=1e-5, seed=0, mechanism="kl-paper")
    g = r.gmm
    assert g.weights.shape == (5,) and g.means.shape == (5, 3) and g.covariances.shape == (5, 3, 3)
    assert g.weights.sum() == pytest.approx(1.0)
    assert np.all(np.linalg.eigvalsh(g.covariances) > 0)
    assert r.privacy.certified is False
    assert r.privacy.neighbouring == "label-flip"
    assert "NOT certified" in r.privacy.statement
    assert r.randomness.secure is False and r.randomness.seed == 0
    assert r.solver is not None and r.solver.status.startswith("optimal")


def test_seed_determinism_and_secure_default(synthetic):
    X, y = synthetic
    a = kr.release(X, y, epsilon=1.0, delta=1e-5, seed=11, mechanism="kl-paper")
    b = kr.release(X, y, epsilon=1.0, delta=1e-5, seed=11, mechanism="kl-paper")
    c = kr.release(X, y, epsilon=1.0, delta=1e-5, seed=12, mechanism="kl-paper")
    np.testing.assert_array_equal(a.gmm.means, b.gmm.means)
    assert not np.allclose(a.gmm.means, c.gmm.means)
    u1 = kr.release(X, y, epsilon=1.0, delta=1e-5, mechanism="kl-paper")
    u2 = kr.release(X, y, epsilon=1.0, delta=1e-5, mechanism="kl-paper")
    assert u1.randomness.secure and u1.randomness.seed is None
    assert not np.allclose(u1.gmm.means, u2.gmm.means)


def test_artifact_round_trip_and_no_exact_statistics(synthetic):
    X, y = synthetic
    r = kr.release(X, y, epsilon=2.0, delta=1e-5, seed=3, mechanism="kl-paper")
    text = r.to_json()
    back = kr.Release.from_json(text)
    np.testing.assert_array_equal(back.gmm.means, r.gmm.means)
    np.testing.assert_array_equal(back.gmm.covariances, r.gmm.covariances)
    np.testing.assert_array_equal(back.gmm.weights, r.gmm.weights)
    assert back.privacy == r.privacy and back.mechanism == r.mechanism
    from klrelease.artifact import SCHEMA_VERSION

    assert back.schema_version == SCHEMA_VERSION
    # no exact class mean, covariance entry or count anywhere in the document
    exact = kr.fit_gmm(X, y)
    numbers = []

    def walk(o):
        if isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
        elif isinstance(o, (int, float)) and not isinstance(o, bool):
            numbers.append(float(o))

    walk(json.loads(text))
    numbers = np.array(numbers)
    secrets_ = np.concatenate([exact.means.ravel(), exact.covariances.ravel(),
                               np.bincount(y).astype(float)])
    for s in secrets_:
        assert not np.any(np.isclose(numbers, s, rtol=1e-9, atol=0)), s


def test_kl_falls_as_epsilon_grows(synthetic):
    X, y = synthetic
    ref = kr.fit_gmm(X, y)
    means = []
    for eps in (0.5, 1.0, 2.0, 4.0):
        p = kr.plan(X, y, epsilon=eps, delta=1e-5, mechanism="kl-paper")
        means.append(kr.expected_kl(p, ref, n_draws=100, seed=1).mean)
    assert all(a > b for a, b in zip(means[:-1], means[1:], strict=True)), means


def test_to_sklearn_and_sample(iris):
    r = kr.release(iris, None, epsilon=2.0, delta=1e-5, seed=0, mechanism="kl-paper")
    sk = r.gmm.to_sklearn()
    Xs, comp = sk.sample(50)
    assert Xs.shape == (50, 4)
    np.testing.assert_allclose(sk.score_samples(Xs), r.gmm.log_prob(Xs), rtol=1e-8)
    X, y = r.gmm.sample(100, seed=1)
    assert X.shape == (100, 4) and set(y) <= set(r.gmm.classes)
    assert r.feature_names == ["sepal_length", "sepal_width", "petal_length", "petal_width"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(epsilon=0.0), "epsilon"),
        (dict(epsilon=-1.0), "epsilon"),
        (dict(delta=0.0), "delta"),
        (dict(delta=1.0), "delta"),
        (dict(mechanism="nope"), "unknown mechanism"),
        (dict(solver="gurobi"), "unknown solver"),
        (dict(adjacency="sideways"), "unknown adjacency"),
        (dict(bogus=1), "unknown option"),
        (dict(lam=1.5), "lam"),
    ],
)
def test_api_validation(kwargs, match):
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(30, 2)), np.repeat([0, 1, 2], 10)
    args = dict(epsilon=1.0, delta=1e-5, mechanism="kl-paper") | kwargs
    with pytest.raises(ValueError, match=match):
        kr.release(X, y, **args)


def test_data_validation_messages_do_not_leak_counts():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 3))
    y = np.array([0] * 9 + [1] * 3)
    with pytest.raises(ValueError, match="at least 4 rows") as exc:
        kr.release(X, y, epsilon=1.0, delta=1e-5, mechanism="kl-paper")
    assert "3 rows" not in str(exc.value) and "9" not in str(exc.value)
    X2 = X.copy()
    X2[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        kr.release(X2, np.repeat([0, 1], 6), epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="same number of rows"):
        kr.release(X, np.repeat([0, 1], 5), epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="not one of the declared classes"):
        kr.release(X, np.repeat([0, 1], 6), classes=[0, 2], epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="non-integer"):
        kr.release(X, np.repeat([0.5, 1.0], 6), epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="two-dimensional"):
        kr.release(X[:, 0], np.repeat([0, 1], 6), epsilon=1.0, delta=1e-5)


def test_log_density_is_consistent_with_sampling(iris):
    """The plan's log-density integrates the noise it draws (checked on the weights' PMF)."""
    p = kr.plan(iris, None, epsilon=2.0, delta=1e-5, mechanism="kl-paper")
    rng = np.random.default_rng(5)
    out = p.sample(rng)
    ld = p.log_density(out)
    assert set(ld) == {"weights", "means", "covariances"}
    assert all(np.isfinite(v) for v in ld.values())
    probs = p.design.mapping.probs
    total = sum(np.exp(p.design.mapping.log_pmf(c)) for c in p.design.mapping.support)
    assert total == pytest.approx((1 - 1e-3) * probs.sum(), rel=1e-6, abs=1e-6)


def test_certified_default_never_refuses_on_private_class_sizes():
    """Refusing a dataset because a class is small would itself reveal labels."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = np.array([0] * 37 + [1] * 2 + [2] * 1)
    r = kr.release(X, y, epsilon=1.0, delta=1e-5, classes=[0, 1, 2, 3])
    assert r.mechanism == "kl-certified" and r.privacy.certified
    assert r.gmm.weights.shape == (4,)
    with pytest.raises(ValueError, match="every class needs"):
        kr.release(X, y, epsilon=1.0, delta=1e-5, mechanism="kl-paper")


def test_privacy_warnings_point_at_the_caller():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kr.release(np.random.default_rng(0).normal(size=(60, 2)), np.arange(60) % 2,
                   epsilon=1.0, delta=1e-5)
    from klrelease.warnings_ import PrivacyLeakWarning

    leaks = [w for w in caught if issubclass(w.category, PrivacyLeakWarning)]
    assert leaks and all(w.filename == __file__ for w in leaks)
