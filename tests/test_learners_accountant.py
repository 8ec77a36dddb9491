"""The zCDP accountant of the learners (KAMATH_AFZALI.md section 1.9) against basic composition."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from conftest import learner_options
from dp_accounting.rdp import RdpAccountant

from klrelease.learners import learn
from klrelease.learners.afzali.aal_lite import aal_ledger
from klrelease.learners.kamath.pegme import pegme_ledger
from klrelease.learners.kamath.pgme import node_budget, pgme_ledger
from klrelease.learners.kamath.salite import salite_ledger
from klrelease.privacy.ledger import (
    BudgetExceeded,
    Ledger,
    check_accountant,
    zcdp_epsilon,
    zcdp_rho,
)
from klrelease.privacy.toolbox import gauss_sigma

NAMES = ("kamath-pgme-lite", "kamath-pegme", "kamath-sa-lite", "afzali-style-sample-aggregate")


def _ledgers(k, d, eps, delta, accountant):
    return [pgme_ledger(k, d, eps, delta, accountant)[0],
            pegme_ledger(k, eps, delta, accountant)[0],
            salite_ledger(k, eps, delta, accountant)[0],
            aal_ledger(eps, delta, accountant)[0],
            aal_ledger(eps, delta, accountant, refine=False)[0]]


@pytest.mark.parametrize("accountant", ["basic", "zcdp", "auto"])
@pytest.mark.parametrize("eps,delta", [(0.5, 1e-6), (1.0, 1e-5), (4.0, 1e-6), (8.0, 1e-8)])
def test_worst_path_total_within_request(accountant, eps, delta):
    for k in (1, 2, 3, 5, 10):
        for d in (2, 5, 10):
            for led in _ledgers(k, d, eps, delta, accountant):
                e, dl = led.total()
                assert e <= eps * (1 + 1e-9) and dl <= delta * (1 + 1e-9), (led.accountant, k)
                assert led.accountant in ("basic", "zcdp")
                if led.accountant == "zcdp":
                    # the TV terms and delta_z use the request, not less: nothing is lost
                    assert dl > 0.9 * delta


def test_zcdp_ledger_sums_rho_and_tv_terms():
    led = Ledger(1.0, 1e-6, accountant="zcdp")
    rho = zcdp_rho(1.0, led.delta_z)
    led.add("g", 0.0, kind="gaussian", zcdp=0.5 * rho)
    led.add("p", math.sqrt(2 * 0.25 * rho), kind="pure", multiplicity=1)
    led.add("s", math.sqrt(2 * 0.125 * rho), kind="stable", multiplicity=2, delta_tv=1e-8)
    assert led.total_rho() == pytest.approx(rho)
    e, dl = led.total()
    assert e <= 1.0 + 1e-9
    assert dl == pytest.approx(led.delta_z + (1 + math.exp(e)) * 2e-8)
    led.add("one more", 0.1, kind="pure")
    with pytest.raises(BudgetExceeded):
        led.check()
    with pytest.raises(ValueError):  # an (eps, delta) piece has no zCDP parameter
        _ = Ledger(1.0, 1e-6, accountant="zcdp").add("a", 0.1, 1e-7).rho
    with pytest.raises(ValueError):
        check_accountant("rdp")


@pytest.mark.parametrize("eps,delta_z", [(0.3, 1e-6), (1.0, 5e-7), (4.0, 1e-9)])
def test_rho_conversion_by_dp_accounting(eps, delta_z):
    rho = zcdp_rho(eps, delta_z)
    assert zcdp_epsilon(rho, delta_z) <= eps
    assert zcdp_epsilon(1.01 * rho, delta_z) > eps  # the largest such rho, up to bisection
    closed = (math.sqrt(math.log(1 / delta_z) + eps) - math.sqrt(math.log(1 / delta_z))) ** 2
    assert closed + 2 * math.sqrt(closed * math.log(1 / delta_z)) == pytest.approx(eps)
    assert rho >= closed  # the RDP conversion is at least as tight as Bun & Steinke Prop 1.3


def test_zcdp_gaussian_calibration_matches_a_gaussian_event():
    rho, sens = 0.07, 3.0
    sigma = gauss_sigma(sens, 1.0, 1e-6, zcdp=rho)
    assert sigma == pytest.approx(sens / math.sqrt(2 * rho))
    a, b = RdpAccountant(), RdpAccountant()
    a.compose(dp_accounting.GaussianDpEvent(sigma / sens))
    b.compose(dp_accounting.ZCDpEvent(rho))
    assert a.get_epsilon(1e-6) == pytest.approx(b.get_epsilon(1e-6), rel=1e-9)


@pytest.mark.parametrize("with_pca", [True, False])
def test_pgme_node_total_is_the_same_with_and_without_pca(with_pca):
    for acc in ("basic", "zcdp"):
        _, bud = pgme_ledger(3, 5, 1.0, 1e-6, acc)
        b = node_budget(bud["node"], with_pca)
        if acc == "basic":
            assert sum(s.epsilon for s in b.values()) == pytest.approx(bud["node"]["epsilon"])
            assert sum(s.delta for s in b.values()) == pytest.approx(bud["node"]["delta"])
        else:
            rho = sum(s.zcdp if s.zcdp is not None else s.epsilon**2 / 2 for s in b.values())
            assert rho == pytest.approx(bud["node"]["rho"])
            hist = [s for key, s in b.items() if key.endswith("hist")]
            assert sum(s.delta for s in hist) == pytest.approx(4 * bud["node"]["delta_tv"])


def test_auto_picks_zcdp_when_many_pieces_compose():
    # PGME-lite at k = 5 has 7 nodes and 2 leaves on the worst path: zCDP gives larger pieces
    assert pgme_ledger(5, 5, 1.0, 1e-6, "auto")[0].accountant == "zcdp"
    for k in (2, 3, 5):
        for d in (2, 10):
            led, _ = pgme_ledger(k, d, 1.0, 1e-6, "auto")
            other = "zcdp" if led.accountant == "basic" else "basic"
            assert led.noise_score() <= pgme_ledger(k, d, 1.0, 1e-6, other)[0].noise_score()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("accountant", ["zcdp", "auto"])
def test_zcdp_ledger_independent_of_data_and_recorded(name, accountant):
    rng = np.random.default_rng(21)
    X = np.array([[8.0, 0.0], [-8.0, 0.0]])[rng.integers(0, 2, 600)] + rng.normal(
        size=(600, 2))
    opts = {"r_init": 2, "n_init": 1, "accountant": accountant}
    opts = learner_options(name, **opts)
    a = learn(X, 2, epsilon=1.0, delta=1e-6, learner=name, seed=1, **opts)
    b = learn(np.zeros_like(X), 2, epsilon=1.0, delta=1e-6, learner=name, seed=1, **opts)
    assert a.diagnostics["ledger"] == b.diagnostics["ledger"]
    block = a.to_dict()["privacy"]
    assert block["accountant"] == a.diagnostics["ledger"]["accountant"]
    assert block["accountant"] in ("basic", "zcdp")
    assert block["accountant"] in block["accounting"]
    tot = a.diagnostics["ledger"]["worst_path_total"]
    assert tot["epsilon"] <= 1.0 + 1e-9 and tot["delta"] <= 1e-6 * (1 + 1e-9)


def test_pgme_recovers_under_zcdp():
    rng = np.random.default_rng(14)
    means = np.array([[25.0, 0.0], [-25.0, 0.0]])
    X = means[rng.integers(0, 2, 12000)] + rng.normal(size=(12000, 2))
    res = learn(X, 2, epsilon=4.0, delta=1e-6, learner="kamath-pgme-lite", seed=2, R=26.0,
                sigma_min=0.5, sigma_max=2.0, accountant="zcdp")
    assert res.diagnostics["ledger"]["accountant"] == "zcdp"
    assert res.ok, res.reason
    err = np.linalg.norm(res.gmm.means[:, None] - means[None], axis=2).min(axis=1)
    assert np.all(err < 1.5)


def test_unknown_accountant_is_rejected_before_the_data_is_read():
    X = np.zeros((100, 2))
    for name in NAMES:
        with pytest.raises(ValueError, match="accountant"):
            learn(X, 2, epsilon=1.0, delta=1e-6, learner=name, seed=0,
                  **learner_options(name, accountant="rdp"))


def test_learn_command_accountant_option(tmp_path):
    import json

    from klrelease.cli import main

    rng = np.random.default_rng(22)
    path = tmp_path / "u.csv"
    np.savetxt(path, rng.normal(size=(500, 2)), delimiter=",", header="a,b", comments="")
    out = tmp_path / "r.json"
    args = ["learn", "--csv", str(path), "--components", "2", "--epsilon", "1", "--delta",
            "1e-6", "--out", str(out), "--seed", "0", "--param", "R=10", "--param", "sigma_min=0.1",
            "--param", "sigma_max=3", "--learner", "kamath-pgme-lite"]
    assert main(args + ["--accountant", "zcdp"]) == 3  # FAIL at preflight: n is too small
    res = json.loads(out.read_text())
    assert res["privacy"]["accountant"] == "zcdp"
    assert res["diagnostics"]["ledger"]["accountant"] == "zcdp"
    assert main(args + ["--accountant", "rdp"]) == 2
    assert main(args[:-1] + ["ppe-gaussian-oneshot", "--accountant", "zcdp"]) == 2
