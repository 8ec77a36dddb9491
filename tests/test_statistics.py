import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from klrelease.neighbours import Adjacency, class_neighbour_vectors, neighbour_counts
from klrelease.statistics import class_statistics, clip_to_norm


def _data(seed, N, K, d):
    rng = np.random.default_rng(seed)
    y = np.concatenate([np.repeat(np.arange(K), 3), rng.integers(0, K, N - 3 * K)])
    rng.shuffle(y)
    return rng.normal(size=(N, d)) * rng.uniform(0.1, 5, d), y


def test_statistics_match_numpy():
    X, y = _data(0, 200, 4, 3)
    st_ = class_statistics(X, y, 4)
    for k in range(4):
        Xk = X[y == k]
        assert st_.counts[k] == len(Xk)
        np.testing.assert_allclose(st_.means[k], Xk.mean(0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(st_.covariances[k], np.cov(Xk.T, ddof=1), rtol=1e-10)
    np.testing.assert_allclose(st_.weights.sum(), 1.0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), K=st.integers(2, 4), d=st.integers(1, 3),
       extra=st.integers(0, 12))
def test_neighbour_vectors_equal_brute_force(seed, K, d, extra):
    """Flip every label, recompute the class mean, compare with the closed forms (F1)."""
    N = 3 * K + extra
    X, y = _data(seed, N, K, d)
    base = class_statistics(X, y, K)
    for k in range(K):
        V = class_neighbour_vectors(X, y, k, base.means[k], int(base.counts[k]))
        closed = {tuple(np.round(v, 9)) for v in V} | {tuple(np.round(-v, 9)) for v in V}
        brute = set()
        for n in range(N):
            for kp in range(K):
                if kp == y[n]:
                    continue
                y2 = y.copy()
                y2[n] = kp
                if np.bincount(y2, minlength=K).min() < 1:
                    continue
                mu2 = X[y2 == k].mean(0)
                v = base.means[k] - mu2
                if np.allclose(v, 0, atol=1e-14):
                    continue
                brute.add(tuple(np.round(v, 9)))
                assert tuple(np.round(v, 9)) in closed
        # every closed-form vector (up to sign) is realised by some flip
        assert all(tuple(np.round(v, 9)) in brute or tuple(np.round(-v, 9)) in brute for v in V)


def test_remove_one_vectors_are_leavers_only():
    X, y = _data(1, 40, 3, 2)
    s = class_statistics(X, y, 3)
    V = class_neighbour_vectors(X, y, 1, s.means[1], int(s.counts[1]), joiners=False)
    assert V.shape[0] == s.counts[1]
    for x, v in zip(X[y == 1], V, strict=True):
        mu2 = (s.means[1] * s.counts[1] - x) / (s.counts[1] - 1)
        np.testing.assert_allclose(s.means[1] - mu2, v, atol=1e-12)


def test_neighbour_counts():
    c = np.array([5, 3, 2])
    flips = neighbour_counts(c, Adjacency.LABEL_FLIP)
    assert flips.shape == (6, 3)
    assert np.all(flips.sum(1) == 10)
    assert np.all(np.abs(flips - c).sum(1) == 2)
    assert len({tuple(r) for r in flips}) == 6
    assert neighbour_counts(c, Adjacency.REMOVE_ONE).shape == (3, 3)
    assert np.all(neighbour_counts(c, Adjacency.ADD_ONE).sum(1) == 11)
    assert neighbour_counts(c, Adjacency.CHANGE_ONE_RECORD).shape == (0, 3)


def test_clip_to_norm():
    X = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    Y = clip_to_norm(X, 1.0)
    np.testing.assert_allclose(np.linalg.norm(Y, axis=1), [1.0, 0.5, 0.0])
    np.testing.assert_allclose(Y[1], X[1])


def test_class_moments_keep_their_digits_far_from_the_origin():
    """A feature of 1e13 + N(0, 1): the plain sum of 20000 rows lost half a unit of the class
    means (0.47 against 1.006); the centred rows' sums correct the mean and scatter to their
    centred values."""
    from klrelease import fit_gmm

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 20000)
    Z = rng.standard_normal((20000, 2)) + y[:, None]
    g = fit_gmm(Z + np.array([1e13, 0.0]), y)
    for k in range(2):
        assert abs((g.means[k, 0] - 1e13) - Z[y == k, 0].mean()) < 0.01
        assert np.allclose(g.covariances[k], np.cov(Z[y == k].T), rtol=1e-3, atol=1e-3)
