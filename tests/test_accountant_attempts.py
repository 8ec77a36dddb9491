"""A BudgetAccountant is charged before any noise is drawn, and only for attempts that drew
some: an attempt that fails before the generator moves released nothing."""

import numpy as np
import pytest

import klrelease as kr
from klrelease.mechanisms.kl_certified.mechanism import KLCertifiedPlan


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(60, 2)), np.repeat([0, 1, 2], 20)


@pytest.mark.parametrize("error", [OSError("disk gone"), KeyboardInterrupt()])
def test_an_attempt_failing_before_noise_is_not_charged(monkeypatch, error):
    X, y = _data()
    acc = kr.BudgetAccountant(10.0, 1e-4)

    def fails_before_noise(self, rng):
        assert acc.spent  # charged before the mechanism runs
        raise error

    monkeypatch.setattr(KLCertifiedPlan, "draw", fails_before_noise)
    with pytest.raises(type(error)):
        kr.release(X, y, classes=[0, 1, 2], epsilon=1.0, delta=1e-5, accountant=acc)
    assert acc.spent == []


def test_an_attempt_failing_after_noise_stays_charged(monkeypatch):
    X, y = _data()
    acc = kr.BudgetAccountant(10.0, 1e-4)

    def fails_after_noise(self, rng):
        rng.standard_normal(3)
        raise ValueError("after noise")

    monkeypatch.setattr(KLCertifiedPlan, "draw", fails_after_noise)
    with pytest.raises(ValueError, match="after noise"):
        kr.release(X, y, classes=[0, 1, 2], epsilon=1.0, delta=1e-5, accountant=acc)
    assert len(acc.spent) == 1


def test_a_refused_release_charges_nothing_and_a_good_one_once():
    X, y = _data()
    acc = kr.BudgetAccountant(1.0, 1e-5)
    kr.release(X, y, classes=[0, 1, 2], epsilon=1.0, delta=1e-5, accountant=acc)
    with pytest.raises(kr.BudgetExceeded):
        kr.release(X, y, classes=[0, 1, 2], epsilon=1.0, delta=1e-5, accountant=acc)
    assert len(acc.spent) == 1


def test_cancel_removes_only_the_given_charge():
    X, y = _data()
    acc = kr.BudgetAccountant(10.0, 1e-4)
    g = kr.plan(X, y, classes=[0, 1, 2], epsilon=1.0, delta=1e-5).guarantee
    acc.spend(g)
    with pytest.raises(ValueError, match="not spent"):
        acc.cancel(kr.plan(X, y, classes=[0, 1, 2], epsilon=1.0, delta=1e-5).guarantee)
    acc.cancel(g)
    assert acc.spent == []
