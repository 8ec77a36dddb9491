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

from ...privacy.ledger import Ledger
from ...privacy.toolbox import advanced_composition_epsilon
from ..result import LearnResult, register_learner
from .blocks import Ball, ploc_lite, private_pca, psge, within
from .common import fail, guarantee, structure_rng, structure_seed, success

__all__ = ["NAME", "pegme_ledger", "learn_pegme"]

NAME = "kamath-pegme"
DOC = "klrelease/learners/kamath/KAMATH.md (PEGME)"


def pegme_ledger(k: int, epsilon: float, delta: float) -> tuple[Ledger, dict]:
    """Worst-path ledger (the Z side; the Y side is PCA at (eps, delta), in parallel)."""
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
    led.check()
    call = {"radius": 0.4 * e_call, "hist": (0.3 * e_call, d_call / 3),
            "stage1": (0.15 * e_call, d_call / 3), "stage2": (0.15 * e_call, d_call / 3)}
    return led, {"call": call, "composition": mode, "pca": (epsilon, delta),
                 "psge": (epsilon / 4, delta / 4)}


def learn_pegme(X, n_components: int, *, epsilon: float, delta: float,
                rng: np.random.Generator, sigma_min: float = 0.5, kappa: float = 4.0,
                beta: float = 0.05, inflate: float = 4.0 * math.sqrt(3.0),
                seed: int | None = None, progress: bool = False, **_ignored) -> LearnResult:
    """Kamath et al. warm-up PEGME (spherical components of equal weight).

    Parameters (all public): ``sigma_min`` smallest component standard deviation, ``kappa``
    bound on the variance ratio, ``beta`` failure probability (thresholds only), ``inflate``
    the factor from the located radius to the removal radius (paper ``4 sqrt(3)``; privacy
    neutral, K19). The model
    places the means within ``Lambda = 2 k sqrt(d) kappa sigma_min`` of the origin.
    """
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    k = int(n_components)
    led, bud = pegme_ledger(k, epsilon, delta)
    g = guarantee(led, "Kamath et al. PEGME warm-up (practical)", DOC)
    master = structure_seed(rng, seed)
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
        V = private_pca(Y, np.zeros(d), lam, ell, *bud["pca"], rng)
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
        mu, var, _ = psge(S_hat, Ball(c_hat, r_hat), *bud["psge"], sigma_min, rng)
        means.append(mu)
        covs.append(var * np.eye(d))
    return success(NAME, g, np.full(k, 1.0 / k), means, covs, diag)


register_learner(NAME, learn_pegme)
