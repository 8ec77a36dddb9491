"""PEGME: the warm-up learner of Kamath et al. for spherical, uniform mixtures (KSSU Alg. 1).

Steps (``KAMATH.md`` section 2.4): a public random permutation splits the data into halves Y
and Z *before* the truncation to ``||x|| <= Lambda`` (fix K1); private PCA on Y (centred at
0, clipped to Lambda); on the projection of Z, k rounds of PLoc-lite [PRACTICAL, replaces
PGLOC] each removing the points of the found ball (disjoint sets, fix K3); PSGE ([PAPER]
Alg. 6 with fixes K4-K6) on the lifted, disjoint sets; weights ``1/k``. Fewer than k balls
gives FAIL (fix K2). Projection dimension ``l = min(d, k)`` [PRACTICAL]: Theorem 4.4 needs
``d >= l >= 512 ln(nk/beta)`` and does not apply in low dimension.

Privacy: Y and Z are disjoint and fixed by public randomness, so the cost is the larger of
the two sides: (eps, delta) for PCA on Y; on Z, the k location calls compose (the better of
basic and advanced composition within (eps/2, delta/2)) and at most 2 of the k disjoint PSGE
calls see a changed record, each at (eps/4, delta/4).
"""

from __future__ import annotations

import math

import numpy as np

from ...privacy.ledger import Ledger, Spend, choose_accountant, log_noise_scale, zcdp_rho
from ...privacy.toolbox import advanced_composition_epsilon
from ..result import LearnResult, register_learner
from .blocks import Ball, ploc_lite, private_pca, psge, within
from .common import fail, guarantee, structure_rng, structure_seed, success

__all__ = ["NAME", "pegme_ledger", "learn_pegme"]

NAME = "kamath-pegme"
DOC = "klrelease/learners/kamath/KAMATH.md (PEGME)"


def _pegme_ledger(k: int, epsilon: float, delta: float, accountant: str
                  ) -> tuple[Ledger, dict]:
    pca_note = "costs max(Y side, Z side); not added to the Z-side sum"
    if accountant == "zcdp":
        led = Ledger(epsilon, delta, accountant="zcdp")
        rho = zcdp_rho(epsilon, led.delta_z)
        r_call = rho / (2 * k)
        tv = (delta - led.delta_z) / (1.0 + math.exp(epsilon)) / k
        call = {"radius": math.sqrt(2 * 0.4 * r_call),
                "hist": Spend(math.sqrt(2 * 0.3 * r_call), 4.0 * tv),
                "stage1": Spend(math.sqrt(2 * 0.15 * r_call), 0.0, 0.15 * r_call),
                "stage2": Spend(math.sqrt(2 * 0.15 * r_call), 0.0, 0.15 * r_call)}
        led.add("locate: GoodRadius-lite", call["radius"], multiplicity=k, kind="pure")
        led.add("locate: StableHist", call["hist"].epsilon, multiplicity=k, kind="stable",
                delta_tv=tv)
        for key in ("stage1", "stage2"):
            led.add(f"locate: {key} NoisySumCount", call[key].epsilon, multiplicity=k,
                    kind="gaussian", zcdp=call[key].zcdp)
        led.add("PSGE", math.sqrt(2 * rho / 4), multiplicity=2, kind="gaussian",
                zcdp=rho / 4, sensitivity="count 1, centred sum 2r, clipped squared "
                "deviations 4r^2 (thirds of rho)")
        led.add("PCA on the half Y (disjoint from Z: parallel composition)",
                math.sqrt(2 * rho), multiplicity=0, kind="gaussian", zcdp=rho,
                sensitivity="Frobenius sqrt(2) Lambda^2", note=pca_note)
        return led, {"call": call, "composition": "zcdp", "k": k,
                     "pca": Spend(math.sqrt(2 * rho), 0.0, rho),
                     "psge": Spend(math.sqrt(2 * rho / 4), 0.0, rho / 4)}
    led = Ledger(epsilon, delta)
    basic = epsilon / (2 * k)
    adv = advanced_composition_epsilon(epsilon / 2, k, delta / 4) if k > 1 else basic
    if adv > basic:
        e_call, d_call, mode = adv, delta / (4 * k), "advanced"
        led.add("locate loop (advanced composition of k PLoc-lite calls)", epsilon / 2,
                delta / 2, note=f"k={k} calls at ({adv:.4g}, {delta / (4 * k):.3g}), "
                f"delta'={delta / 4:.3g}")
    else:
        e_call, d_call, mode = basic, delta / (2 * k), "basic"
        led.add("locate PLoc-lite call", basic, delta / (2 * k), multiplicity=k)
    led.add("PSGE", epsilon / 4, delta / 4, multiplicity=2,
            sensitivity="count 1, centred sum 2r, clipped squared deviations 4r^2")
    led.add("PCA on the half Y (disjoint from Z: parallel composition)", epsilon, delta,
            multiplicity=0, sensitivity="Frobenius sqrt(2) Lambda^2",
            note="costs max(Y side, Z side) = (eps, delta); not added to the Z-side sum")
    call = {"radius": 0.4 * e_call, "hist": Spend(0.3 * e_call, d_call / 3),
            "stage1": Spend(0.15 * e_call, d_call / 3),
            "stage2": Spend(0.15 * e_call, d_call / 3)}
    return led, {"call": call, "composition": mode, "k": k, "pca": Spend(epsilon, delta),
                 "psge": Spend(epsilon / 4, delta / 4)}


def pegme_ledger(k: int, epsilon: float, delta: float,
                 accountant: str = "basic") -> tuple[Ledger, dict]:
    """Worst-path ledger (the Z side; the Y side is PCA at the whole budget, in parallel).

    ``basic``: the better of basic and advanced composition for the k location calls;
    ``zcdp``: rho split as the basic shares; ``auto``: the larger per-piece budgets.
    """
    _, (led, bud) = choose_accountant(accountant,
                                      lambda a: _pegme_ledger(k, epsilon, delta, a), _score)
    return led.check(), bud


def _score(built: tuple) -> float:
    """Noise score of the per-call pieces (k calls), the two PSGE calls and the PCA."""
    c = built[1]["call"]
    call = (log_noise_scale(Spend(c["radius"]), False) + log_noise_scale(c["hist"], False)
            + log_noise_scale(c["stage1"], True) + log_noise_scale(c["stage2"], True))
    return (built[1]["k"] * call + 2 * log_noise_scale(built[1]["psge"], True)
            + log_noise_scale(built[1]["pca"], True))


def learn_pegme(X, n_components: int, *, epsilon: float, delta: float,
                rng: np.random.Generator, sigma_min: float, kappa: float = 4.0,
                beta: float = 0.05, inflate: float = 4.0 * math.sqrt(3.0),
                accountant: str = "basic",
                progress: bool = False) -> LearnResult:
    """Kamath et al. warm-up PEGME (spherical components of equal weight).

    The model places the means within ``Lambda = 2 k sqrt(d) kappa sigma_min`` of the origin.

    Parameters (all public)
    -----------------------
    sigma_min : smallest component standard deviation, in the units of the data (required).
    kappa : bound on the ratio of the components' variances.
    beta : failure probability (thresholds only).
    inflate : factor from the located radius to the removal radius (paper ``4 sqrt(3)``;
        privacy neutral, K19).
    accountant : ``basic`` (default), ``zcdp`` or ``auto`` (public inputs only).
    progress : a progress bar over the ball counts.
    """
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    k = int(n_components)
    led, bud = pegme_ledger(k, epsilon, delta, accountant)
    g = guarantee(led, "Kamath et al. PEGME warm-up (practical)", DOC)
    master = structure_seed(rng)
    struct = structure_rng(master, "split")
    ell = min(d, k)
    lam = 2.0 * k * math.sqrt(d) * kappa * sigma_min
    half = n // 2
    t = max(1, int(half / (2 * k)))
    perm = struct.permutation(n)
    Y, Z = X[perm[:half]], X[perm[half:2 * half]]
    Y = Y[within(Y, np.zeros(d), lam)]
    Z = Z[within(Z, np.zeros(d), lam)]
    diag: dict = {"ledger": led.to_dict(), "n": n, "d": d, "k": k, "t": t, "ell": ell,
                  "truncation_radius": lam, "locate_composition": bud["composition"]}
    if ell < d:
        V = private_pca(Y, np.zeros(d), lam, ell, *bud["pca"], rng, zcdp=bud["pca"].zcdp)
    else:
        V = np.eye(d)
    Zl = Z @ V
    remaining = np.ones(len(Z), dtype=bool)
    balls: list[tuple[Ball, np.ndarray]] = []
    for i in range(k):
        S = Zl[remaining]
        ball = ploc_lite(S, t, bud["call"], 2.0 * lam, math.sqrt(ell) * sigma_min / 4.0, beta,
                         structure_rng(master, f"locate{i}"), rng, progress=progress)
        if ball is None:
            break
        r_i = inflate * ball.radius
        members = remaining & within(Zl, ball.centre, r_i)
        remaining &= ~members
        balls.append((Ball(ball.centre, r_i), members))
    diag["balls_found"] = len(balls)
    if len(balls) < k:
        return fail(NAME, g, "locate",
                    f"{len(balls)} of k={k} balls found by PLoc-lite (n={n}, d={d}, "
                    f"eps={epsilon:g}, target size t={t})", diag)
    means, covs = [], []
    for ball, members in balls:
        c_hat = V @ ball.centre
        r_hat = ball.radius + 10.0 * math.sqrt(ell) * kappa * sigma_min + 2.0 * ball.radius * (
            math.sqrt(3.0 * d / ell))
        S_hat = Z[members & within(Z, c_hat, r_hat)]
        mu, var, _ = psge(S_hat, Ball(c_hat, r_hat), *bud["psge"], sigma_min, rng,
                          zcdp=bud["psge"].zcdp)
        means.append(mu)
        covs.append(var * np.eye(d))
    return success(NAME, g, np.full(k, 1.0 / k), means, covs, diag)


register_learner(NAME, learn_pegme)
