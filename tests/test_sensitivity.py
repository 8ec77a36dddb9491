"""The sensitivity bounds against brute force over every neighbouring dataset."""

import itertools

import numpy as np
import pytest

from klrelease.sensitivity import (
    covariance_addition_bound,
    covariance_removal_bound,
    covariance_trace_bound,
    covariances_sensitivity,
    mean_addition_bound,
    mean_removal_bound,
    means_sensitivity,
    weights_sensitivity,
    wu_sensitivities,
)
from klrelease.statistics import class_statistics


def _stats(X, codes, K):
    s = class_statistics(X, codes, K)
    return s.counts / s.counts.sum(), s.means, s.covariances


def _norm(a, norm):
    a = np.ravel(a)
    return float(np.abs(a).sum() if norm == "l1" else np.linalg.norm(a))


def _max_changes(X, codes, K, neighbours):
    """Max over neighbours of the change of (weights, stacked means, stacked covariances)."""
    base = _stats(X, codes, K)
    worst = {(b, n): 0.0 for b in range(3) for n in ("l1", "l2")}
    for X2, c2 in neighbours:
        other = _stats(X2, c2, K)
        for b in range(3):
            for n in ("l1", "l2"):
                worst[b, n] = max(worst[b, n], _norm(base[b] - other[b], n))
    return worst


def _flips(X, codes, K):
    for i in range(len(codes)):
        for k in range(K):
            if k != codes[i]:
                c2 = codes.copy()
                c2[i] = k
                yield X, c2


def _replacements(X, codes, K, lower, upper):
    vertices = np.array(list(itertools.product(*zip(lower, upper, strict=True))))
    for i in range(len(codes)):
        for v in vertices:
            for k in range(K):
                X2 = X.copy()
                X2[i] = v
                c2 = codes.copy()
                c2[i] = k
                yield X2, c2


def _dataset(seed, N=13, K=3, d=2, corners=False):
    rng = np.random.default_rng(seed)
    lower, upper = np.array([-1.0, 0.0, 2.0][:d]), np.array([2.0, 0.5, 5.0][:d])
    if corners:  # rows at box vertices: the extreme cases
        X = np.where(rng.random((N, d)) < 0.5, lower, upper)
    else:
        X = rng.uniform(lower, upper, (N, d))
    codes = np.concatenate([np.arange(K).repeat(3), rng.integers(0, K, N - 3 * K)])
    rng.shuffle(codes)
    return X, codes, lower, upper


def test_removal_and_addition_closed_forms():
    rng = np.random.default_rng(0)
    for n in (3, 4, 9):
        X = rng.normal(size=(n, 3))
        mu, S = X.mean(0), np.cov(X.T)
        w = X[0] - mu
        removed = np.cov(X[1:].T)
        assert np.allclose(S - removed, (n / (n - 1) * np.outer(w, w) - S) / (n - 2))
        assert np.allclose(mu - X[1:].mean(0), w / (n - 1))
        x = rng.normal(size=3)
        w = x - mu
        added = np.cov(np.vstack([X, x]).T)
        assert np.allclose(S - added, S / n - np.outer(w, w) / (n + 1))


@pytest.mark.parametrize("seed,corners", [(0, False), (1, True), (2, True), (3, False)])
def test_label_flip_bounds_cover_brute_force(seed, corners):
    K = 3
    X, codes, lower, upper = _dataset(seed, corners=corners)
    n_min = int(np.bincount(codes, minlength=K).min())
    spread = {"l1": float((upper - lower).sum()), "l2": float(np.linalg.norm(upper - lower))}
    worst = _max_changes(X, codes, K, _flips(X, codes, K))
    N = len(codes)
    for norm in ("l1", "l2"):
        # weights: exact
        assert worst[0, norm] == pytest.approx(weights_sensitivity(N, norm), rel=1e-12)
        assert worst[1, norm] <= means_sensitivity(n_min, spread[norm], norm) * (1 + 1e-12)
        assert worst[2, norm] <= covariances_sensitivity(n_min, spread[norm], norm) * (1 + 1e-12)


@pytest.mark.parametrize("seed", [4, 5])
def test_replace_one_bounds_cover_brute_force(seed):
    K = 2
    X, codes, lower, upper = _dataset(seed, N=9, K=K, corners=seed == 5)
    n_min = int(np.bincount(codes, minlength=K).min())
    spread = {"l1": float((upper - lower).sum()), "l2": float(np.linalg.norm(upper - lower))}
    worst = _max_changes(X, codes, K, _replacements(X, codes, K, lower, upper))
    N = len(codes)
    for norm in ("l1", "l2"):
        assert worst[0, norm] == pytest.approx(weights_sensitivity(N, norm), rel=1e-12)
        b_mu = means_sensitivity(n_min, spread[norm], norm, "replace-one")
        b_S = covariances_sensitivity(n_min, spread[norm], norm, "replace-one")
        assert worst[1, norm] <= b_mu * (1 + 1e-12)
        assert worst[2, norm] <= b_S * (1 + 1e-12)
    # the within-class case makes replace-one at least as large as a flip
    assert covariances_sensitivity(3, 1.0, "l2", "replace-one") >= covariances_sensitivity(3, 1.0)


@pytest.mark.parametrize("n", [3, 5, 20])
def test_means_bound_is_attained(n):
    """Two classes of n rows at one corner except the flipped row at the opposite corner."""
    lower, upper = np.array([0.0, -1.0, 3.0]), np.array([2.0, 1.0, 3.5])
    X = np.vstack([lower, np.tile(upper, (3 * n - 1, 1))])
    codes = np.repeat(np.arange(3), n)  # row 0 (at `lower`) belongs to class 0
    for norm, D in (("l1", (upper - lower).sum()), ("l2", np.linalg.norm(upper - lower))):
        c2 = codes.copy()
        c2[0] = 1
        change = _norm(_stats(X, codes, 3)[1] - _stats(X, c2, 3)[1], norm)
        assert change == pytest.approx(means_sensitivity(n, D, norm), rel=1e-12)
        assert change == pytest.approx(
            mean_removal_bound(n, D) + mean_addition_bound(n, D) if norm == "l1"
            else np.hypot(mean_removal_bound(n, D), mean_addition_bound(n, D)), rel=1e-12)


@pytest.mark.parametrize("n", [3, 4])
def test_covariance_bounds_over_all_vertex_configurations(n):
    """Every class of n (removal) or n + 1 (addition) rows at vertices of the unit square: the
    bounds hold and are within a factor 4 of the worst case (they are safe, not tight)."""
    V = np.array(list(itertools.product([0.0, 1.0], repeat=2)))
    spread = {"l1": 2.0, "l2": np.sqrt(2.0)}
    worst = {(kind, norm): 0.0 for kind in ("rem", "add") for norm in ("l1", "l2")}
    for idx in itertools.product(range(4), repeat=n + 1):
        X = V[list(idx)]
        S = np.cov(X[:n].T)
        for kind, diff in (("rem", S - np.cov(X[1:n].T)), ("add", S - np.cov(X.T))):
            for norm in ("l1", "l2"):
                worst[kind, norm] = max(worst[kind, norm], _norm(diff, norm))
    for norm in ("l1", "l2"):
        for kind, bound in (("rem", covariance_removal_bound), ("add", covariance_addition_bound)):
            b = bound(n, spread[norm], norm)
            assert worst[kind, norm] <= b * (1 + 1e-12)
            assert worst[kind, norm] >= 0.25 * b * (1 - 1e-12)


def test_trace_bound_on_extreme_data():
    rng = np.random.default_rng(7)
    for _ in range(50):
        X = np.where(rng.random((int(rng.integers(2, 12)), 3)) < 0.5, 0.0, 1.0)
        assert np.trace(np.atleast_2d(np.cov(X.T))) <= covariance_trace_bound(np.sqrt(3)) + 1e-12


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_per_class_bounds_decrease_in_class_size(norm):
    ns = np.arange(3, 400)
    rem = np.array([covariance_removal_bound(int(n), 1.0, norm) for n in ns])
    add = np.array([covariance_addition_bound(int(n), 1.0, norm) for n in ns])
    assert np.all(np.diff(rem) < 0) and np.all(np.diff(add) < 0)


def test_wu_constants_as_published():
    N, K, R = 1000, 5, 2.0
    s_pi, s_mu, s_S = wu_sensitivities(N, K, R)
    m = N / (2 * K)
    assert s_pi == pytest.approx(K / N)
    assert s_mu == pytest.approx(2 * R / m)
    assert s_S == pytest.approx(6 * R**2 / m + 2 * R**2 / m**2)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="norm"):
        weights_sensitivity(10, "linf")
    with pytest.raises(ValueError, match=">= 3"):
        means_sensitivity(2, 1.0)
    with pytest.raises(ValueError, match="adjacency"):
        covariances_sensitivity(5, 1.0, "l2", "add-one")
