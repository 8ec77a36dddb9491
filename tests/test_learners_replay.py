"""Control flow of the Kamath et al. and Afzali-style learners depends on released values only.

Each learner runs on D with a release tape, then on a neighbour D' (one record substituted),
with the same structural seed and noise stream, replaying D's released values. The labels of
the releases, every public quantity that shaped their noise, and the final result must agree
(KAMATH_AFZALI.md section 5, item 3).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from klrelease.learners import learn
from klrelease.privacy.tape import TapeDiverged, recording, released
from klrelease.privacy.toolbox import laplace_count, noisy_sum_count

# (learner, k, n, d, separation, options): released models, and one FAIL after a split
# (PGME, k = 3)
CASES = [
    ("kamath-pgme-lite", 2, 6000, 2, 25.0, {"R": 26.0, "sigma_min": 0.5, "sigma_max": 2.0}),
    ("kamath-pgme-lite", 3, 8000, 3, 25.0, {"R": 26.0, "sigma_min": 0.5, "sigma_max": 2.0}),
    ("kamath-pegme", 2, 8000, 2, 8.0, {"sigma_min": 1.0, "kappa": 2.0, "inflate": 1.5}),
    ("kamath-pegme", 2, 6000, 3, 8.0, {"sigma_min": 1.0, "kappa": 2.0, "inflate": 1.5}),
    ("kamath-sa-lite", 2, 30000, 2, 6.0, {"R": 7.0, "sigma_min": 0.5, "sigma_max": 2.0,
                                          "n_init": 1, "agree": 0.6}),
    ("afzali-style-sample-aggregate", 2, 12000, 2, 6.0, {"sigma_max": 3.0, "w_mu": 2.0,
                                                         "r_init": 1}),
    # the zCDP accountant changes the budgets only, not the hygiene
    ("kamath-pgme-lite", 3, 8000, 3, 25.0, {"R": 26.0, "sigma_min": 0.5, "sigma_max": 2.0,
                                       "accountant": "zcdp"}),
    ("afzali-style-sample-aggregate", 2, 60000, 2, 6.0, {"sigma_max": 3.0, "w_mu": 2.0,
                                                         "r_init": 1, "accountant": "zcdp"}),
    # dp-em: in d = 2 (histogram in a public rotation) and d = 5 (private PCA first)
    ("dp-em", 2, 6000, 2, 25.0, {"R": 26.0, "sigma_max": 2.0}),
    ("dp-em", 3, 8000, 5, 4.0, {"R": 5.0, "sigma_max": 2.0, "sigma_min": 0.5}),
    ("park-dp-em", 2, 6000, 3, 8.0, {"R": 9.0, "sigma_max": 2.0}),
]


def _data(n, k, d, sep, seed):
    rng = np.random.default_rng(seed)
    means = np.zeros((k, d))
    means[:, 0] = sep * (np.arange(k) - (k - 1) / 2)
    return means[rng.integers(0, k, n)] + rng.normal(size=(n, d))


def _neighbours(X, seed):
    """Substitutions of one record: a far outlier, and a point of another cluster."""
    rng = np.random.default_rng(seed)
    n, d = X.shape
    out = []
    for new in (np.full(d, 1e4), -X[int(rng.integers(n))]):
        Xs = X.copy()
        Xs[int(rng.integers(n))] = new
        out.append(Xs)
    return out


def _run(X, name, k, options, replay=None):
    with recording(replay) as tape:
        res = learn(X, k, epsilon=4.0, delta=1e-6, learner=name, seed=7, **options)
    return tape, res


@pytest.mark.parametrize(("name", "k", "n", "d", "sep", "options"), CASES,
                         ids=[f"{c[0]}-d{c[3]}-{c[5].get('accountant', 'basic')}"
                              for c in CASES])
def test_replay_on_a_neighbour_takes_the_same_path(name, k, n, d, sep, options):
    X = _data(n, k, d, sep, seed=n + d)
    tape, res = _run(X, name, k, options)
    labels = [label for label, _ in tape.trace()]
    # the run reached several released stages (Afzali-style: selection, then refinement)
    assert len(labels) >= (2 if name.startswith("afzali") else 8), labels
    # the same run without a tape gives the same result: the hook changes nothing
    plain = learn(X, k, epsilon=4.0, delta=1e-6, learner=name, seed=7, **options)
    assert plain.to_json() == res.to_json()
    for Xs in _neighbours(X, seed=d):
        tape_s, res_s = _run(Xs, name, k, options, replay=tape)
        assert tape_s.trace() == tape.trace()
        assert json.loads(res_s.to_json()) == json.loads(res.to_json())


def test_replay_detects_a_branch_on_private_data():
    """The check can fail: a toy learner that branches on an unreleased statistic."""

    def leaky(X):
        c = laplace_count(len(X), 1.0, np.random.default_rng(0))
        if np.sum(X[:, 0] > 0) > len(X) / 2:  # private: not a released value
            return noisy_sum_count(X, np.zeros(2), 1.0, 1.0, 1e-6, np.random.default_rng(1))
        return released("other", c + 1.0, epsilon=1.0)

    X = np.ones((11, 2))
    with recording() as tape:
        leaky(X)
    Xs = X.copy()
    Xs[:6] = -1.0
    with pytest.raises(TapeDiverged), recording(replay=tape):
        leaky(Xs)


def test_replay_detects_noise_shaped_by_private_data():
    """The check can fail: a public quantity (the clipping radius) computed from the data."""

    def leaky(X):
        rho = float(np.abs(X).max())  # private
        return noisy_sum_count(X, np.zeros(2), rho, 1.0, 1e-6, np.random.default_rng(1))

    X = np.ones((5, 2))
    with recording() as tape:
        leaky(X)
    Xs = X.copy()
    Xs[0] = 3.0
    with recording(replay=tape) as tape_s:
        leaky(Xs)
    assert tape_s.trace() != tape.trace()


def test_a_seeded_learner_run_is_never_certified_and_cannot_be_spent_as_one():
    from klrelease.learners import learn
    from klrelease.privacy.guarantee import BudgetAccountant

    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(300, 2)), rng.normal(size=(300, 2)) + 40.0])
    res = learn(X, 2, epsilon=1.0, delta=1e-6, learner="afzali-style-sample-aggregate", seed=1,
                sigma_max=3.0)
    assert not res.secure and not res.guarantee.certified
    assert res.to_dict()["privacy"]["certified"] is False
    acc = BudgetAccountant(1.0, 1e-6)
    with pytest.raises(ValueError):
        acc.spend(res.guarantee)
