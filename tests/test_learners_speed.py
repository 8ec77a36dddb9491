"""The KD-tree path of the radius queries counts exactly what the pairwise path counts."""

from __future__ import annotations

import numpy as np
import pytest

from klrelease.learners import learn
from klrelease.learners.kamath import radius as radius_mod
from klrelease.learners.kamath.blocks import good_radius_lite, terrific_query, terrific_radius
from klrelease.learners.kamath.radius import (
    _pairwise_counts,
    ball_counts,
    ball_counts_tree,
    radius_counter,
    use_tree,
)
from klrelease.privacy.toolbox import above_threshold, above_threshold_lazy


def test_tree_counts_are_exact_on_ties():
    # integer lattice: many pairs at exactly the grid radii 1, 2, sqrt(2), ...
    g = np.arange(12.0)
    X = np.stack(np.meshgrid(g, g), axis=-1).reshape(-1, 2)
    radii = np.array([0.5, 1.0, np.sqrt(2.0), 2.0, 3.0, 5.0, 20.0])
    tree = ball_counts_tree(X, X, radii)
    brute = np.stack([_pairwise_counts(X, X, r) for r in radii], axis=1)
    assert np.array_equal(tree, brute)
    assert tree[0, 1] == 3 and tree[0, 0] == 1  # corner: itself and two neighbours at 1


def test_tree_counts_match_the_chunked_path_on_continuous_data():
    rng = np.random.default_rng(31)
    X = np.vstack([rng.normal(size=(3000, 2)), 30 + rng.normal(size=(2000, 2))])
    radii = np.array([0.1, 0.4, 1.6, 6.4, 25.6, 102.4])
    assert np.array_equal(ball_counts_tree(X, X, radii), ball_counts(X, X, radii))
    counter = radius_counter(X[:50], X)
    assert np.array_equal(counter(1.6), ball_counts(X[:50], X, [1.6])[:, 0])


def test_lazy_above_threshold_is_the_same_mechanism():
    vals = [0.0, 1.0, 5.0, 9.0, 12.0]
    calls = []

    def query(i):
        calls.append(i)
        return vals[i]

    for seed in range(20):
        a = above_threshold(vals, 6.0, 1.0, 1.0, np.random.default_rng(seed))
        calls.clear()
        b = above_threshold_lazy(query, len(vals), 6.0, 1.0, 1.0, np.random.default_rng(seed))
        assert a == b
        assert calls == list(range(len(vals) if b is None else b + 1))


@pytest.mark.parametrize("largest", [False, True])
def test_radius_searches_agree_between_paths(monkeypatch, largest):
    rng = np.random.default_rng(32)
    X = np.vstack([rng.normal(size=(1500, 2)), [40.0, 0.0] + rng.normal(size=(1500, 2))])
    assert use_tree(2)
    kw = dict(t=700, c=5.0, largest=largest, epsilon=2.0, upper=200.0, lower=0.25, beta=0.05)
    tree = [terrific_radius(X, rng=np.random.default_rng(s), **kw) for s in range(5)]
    tree_g = [good_radius_lite(X, 700, 2.0, 200.0, 0.25, 0.05, np.random.default_rng(s))
              for s in range(5)]
    tq = terrific_query(X, np.array([0.5, 2.0, 8.0]), 5.0, 700)
    monkeypatch.setattr(radius_mod, "TREE_MAX_DIM", 0)
    assert not use_tree(2)
    dense = [terrific_radius(X, rng=np.random.default_rng(s), **kw) for s in range(5)]
    dense_g = [good_radius_lite(X, 700, 2.0, 200.0, 0.25, 0.05, np.random.default_rng(s))
               for s in range(5)]
    assert tree == dense and tree_g == dense_g
    assert np.array_equal(tq, terrific_query(X, np.array([0.5, 2.0, 8.0]), 5.0, 700))
    assert any(r is not None for r in tree)


def test_pgme_same_release_on_both_paths(monkeypatch):
    rng = np.random.default_rng(33)
    means = np.array([[25.0, 0.0], [-25.0, 0.0]])
    X = means[rng.integers(0, 2, 6000)] + rng.normal(size=(6000, 2))
    opts = dict(epsilon=4.0, delta=1e-6, learner="kamath-pgme-lite", seed=3, R=26.0,
                sigma_min=0.5, sigma_max=2.0)
    a = learn(X, 2, **opts)
    monkeypatch.setattr(radius_mod, "TREE_MAX_DIM", 0)
    b = learn(X, 2, **opts)
    assert a.to_json() == b.to_json()
    assert a.ok, a.reason
