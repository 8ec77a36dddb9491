"""SA-lite: the sample-and-aggregate learner of Kamath et al. (KSSU Section 6), practical form.

A public random partition into ``m`` blocks; on each block a non-private spherical EM fit
(scikit-learn, public seed; a failed fit contributes nothing). Then ``k`` rounds over the
active block means, each with block-level mechanisms (one record changes one block, fix K14):
GoodRadius-lite at block level [PRACTICAL, replaces NSV16's radius], a block-level
GoodCenter-lite whose cell is chosen by StableSelect (Q = k keys per block) and two
NoisySumCounts of one representative mean per block [PRACTICAL], a weight chosen by the
exponential mechanism over public bins of width ``alpha/k``, and a variance by a NoisySumCount
of clipped log-variances ([PRACTICAL] extension; the paper outputs means and weights). The
released centre is output (fix K15), and means within ``3 r`` of it are removed.

Privacy (``KAMATH.md``): within a round every mechanism has block-level sensitivity as
calibrated; the active sets depend only on released centres and a block's own fit; the k
rounds compose (basic) at ``(eps/k, delta/k)`` each.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ..._threads import blas_single_thread
from ...privacy.ledger import Ledger, Spend, choose_accountant, zcdp_rho
from ...privacy.toolbox import (
    above_threshold,
    exponential_mechanism,
    noisy_sum_count,
    stable_select,
    stable_select_threshold,
)
from ..result import LearnResult, register_learner
from .blocks import _rotation, radius_grid, radius_slack
from .common import fail, guarantee, structure_rng, structure_seed, success
from .radius import counts_within

__all__ = ["NAME", "salite_ledger", "learn_salite", "block_radius_query"]

NAME = "kamath-sa-lite"
DOC = "klrelease/learners/kamath/KAMATH.md (SA-lite)"

_SHARES = {"radius": 0.30, "select": 0.30, "stage1": 0.10, "stage2": 0.10, "weight": 0.10,
           "variance": 0.10}


def _salite_ledger(k: int, epsilon: float, delta: float, accountant: str
                   ) -> tuple[Ledger, dict]:
    b: dict = {}
    if accountant == "basic":
        led = Ledger(epsilon, delta)
        e_r, d_r = epsilon / k, delta / k
        d_piece = d_r / 4.0
        e = {key: e_r * s for key, s in _SHARES.items()}
        b["radius"], b["weight"] = e["radius"], e["weight"]
        e_sel = e["select"]
        b["delta_tv"] = d_piece / (1.0 + math.exp(e_sel))
        for key in ("stage1", "stage2", "variance"):
            b[key] = Spend(e[key], d_piece)
        sel_delta = d_piece
        kinds = {"pure": "approx", "gaussian": "approx", "stable": "approx"}
    else:
        led = Ledger(epsilon, delta, accountant="zcdp")
        rho_r = zcdp_rho(epsilon, led.delta_z) / k
        rho = {key: rho_r * s for key, s in _SHARES.items()}
        b["radius"], b["weight"] = (math.sqrt(2 * rho[key]) for key in ("radius", "weight"))
        e_sel = math.sqrt(2 * rho["select"])
        b["delta_tv"] = (delta - led.delta_z) / (1.0 + math.exp(epsilon)) / k
        for key in ("stage1", "stage2", "variance"):
            b[key] = Spend(math.sqrt(2 * rho[key]), 0.0, rho[key])
        sel_delta = 0.0
        kinds = {"pure": "pure", "gaussian": "gaussian", "stable": "stable"}
    b["select_a"], b["select_b"] = e_sel / 3.0, 2.0 * e_sel / 3.0
    zc = accountant == "zcdp"
    led.add("round: block GoodRadius (AboveThreshold)", b["radius"], multiplicity=k,
            kind=kinds["pure"], sensitivity="2 (one block)")
    led.add("round: StableSelect of the cell", e_sel, sel_delta, multiplicity=k,
            kind=kinds["stable"], delta_tv=b["delta_tv"] if zc else 0.0,
            note="(eps_a + eps_b, (1 + e^{eps_a+eps_b}) delta_TV), eps_a:eps_b = 1:2")
    for key, label, sens in (("stage1", "stage-1 NoisySumCount", "2 rho_1"),
                             ("stage2", "stage-2 NoisySumCount", "2 rho_2"),
                             ("variance", "log-variance NoisySumCount", "2 rho_v")):
        sp = b[key]
        led.add(f"round: {label}", sp.epsilon, sp.delta, multiplicity=k,
                kind=kinds["gaussian"], zcdp=sp.zcdp, sensitivity=sens)
        if key == "variance":
            led.add("round: weight (exponential mechanism)", b["weight"], multiplicity=k,
                    kind=kinds["pure"], sensitivity="1 (one block)")
    return led, b


def salite_ledger(k: int, epsilon: float, delta: float,
                  accountant: str = "basic") -> tuple[Ledger, dict]:
    """Worst-path ledger of the k rounds (``basic``, ``zcdp`` or ``auto``), public inputs only.
    """
    _, (led, b) = choose_accountant(accountant,
                                    lambda a: _salite_ledger(k, epsilon, delta, a))
    return led.check(), b


def block_radius_query(points: np.ndarray, block_of: np.ndarray, radii: np.ndarray, t: int,
                       max_pairs: int = 10_000_000) -> np.ndarray:
    """Block-level ``L(r)``: mean of the top-t (over blocks) of the best candidate of a block.

    For a candidate ``x``, ``Q(x, r)`` = number of distinct blocks with an active mean within
    ``r`` of ``x`` (capped at t); a block's value is the max over its own candidates.
    Sensitivity 2 when one block's means change (``KAMATH.md``).
    """
    p = len(points)
    R = len(radii)
    if p == 0:
        return np.zeros(R)
    order = np.argsort(block_of, kind="stable")
    P, B = points[order], block_of[order]
    starts = np.flatnonzero(np.r_[True, B[1:] != B[:-1]])
    nb = len(starts)
    pn = np.einsum("ij,ij->i", P, P)
    sq = radii**2
    best = np.zeros((nb, R))
    cand_block = np.searchsorted(starts, np.arange(p), side="right") - 1
    step = max(1, min(p, max_pairs // max(p, 1)))
    for s in range(0, p, step):
        e = min(p, s + step)
        d2 = pn[s:e, None] + pn[None, :] - 2.0 * (P[s:e] @ P.T)
        dmin = np.minimum.reduceat(d2, starts, axis=1)  # (chunk, blocks)
        q = np.minimum(counts_within(dmin, sq), t)
        np.maximum.at(best, cand_block[s:e], q)
    if nb > t:
        best = -np.partition(-best, t - 1, axis=0)[:t]
    return best.sum(axis=0) / t


@blas_single_thread  # many small fits: threaded BLAS only adds synchronisation
def _fit_blocks(X, perm, m, n_b, k, master, n_init, R, reg, tick=None):
    """EM on every block; ``reg`` the variance floor of the fits (public: relative to
    ``sigma_min``, so that it moves with the units of the data)."""
    from sklearn.mixture import GaussianMixture

    d = X.shape[1]
    means = np.zeros((m, k, d))
    weights = np.zeros((m, k))
    variances = np.ones((m, k))
    ok = np.zeros((m, k), dtype=bool)
    for b in range(m):
        block = X[perm[b * n_b:(b + 1) * n_b]]
        seed = int(structure_rng(master, f"block{b}").integers(0, 2**31 - 1))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                gm = GaussianMixture(k, covariance_type="spherical", n_init=n_init,
                                     init_params="k-means++", random_state=seed,
                                     reg_covar=reg).fit(block)
            mu = gm.means_
            nrm = np.linalg.norm(mu, axis=1, keepdims=True)
            means[b] = mu * np.minimum(1.0, R / np.maximum(nrm, 1e-300))
            weights[b], variances[b] = gm.weights_, gm.covariances_
            ok[b] = np.all(np.isfinite(gm.means_), axis=1)
        except Exception:  # noqa: BLE001 - a failed fit contributes nothing (rule 5)
            ok[b] = False
        if tick is not None:
            tick(1)
    return means, weights, variances, ok


def learn_salite(X, n_components: int, *, epsilon: float, delta: float,
                 rng: np.random.Generator, R: float, sigma_min: float,
                 sigma_max: float, alpha: float = 0.1, beta: float = 0.05,
                 block_size: int | None = None, agree: float = 0.8, n_init: int = 3,
                 accountant: str = "basic", progress=None) -> LearnResult:
    """Kamath et al. sample-and-aggregate, practical (SA-lite).

    Parameters (all public)
    -----------------------
    R : bound on the mean norms, in the units of the data (required; block means are
        clipped to it).
    sigma_min, sigma_max : bounds on the component standard deviations, in the units of the
        data (required).
    alpha : weight-bin width times k.
    beta : failure probability (thresholds only).
    block_size : rows per block (default ``max(30, 10 k (d + 1))``).
    agree : the fraction of blocks the radius query targets (``t = ceil(agree m)``).
    n_init : EM restarts per block.
    accountant : ``basic`` (default), ``zcdp`` or ``auto`` (public inputs only).
    progress : when callable, called with 1 after each block's fit.
    """
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    k = int(n_components)
    led, b = salite_ledger(k, epsilon, delta, accountant)
    g = guarantee(led, "Kamath et al. sample-and-aggregate (SA-lite, practical)", DOC)
    master = structure_seed(rng)
    n_b = int(block_size) if block_size else max(30, 10 * k * (d + 1))
    m = n // n_b
    diag: dict = {"ledger": led.to_dict(), "n": n, "d": d, "k": k, "blocks": m,
                  "block_size": n_b, "rounds": []}
    if m < 2:
        return fail(NAME, g, "blocks", f"n={n} gives {m} blocks of size {n_b}; need >= 2",
                    diag)
    t = math.ceil(agree * m)
    radii = radius_grid(sigma_min / 100.0, 2.0 * R)
    gamma = radius_slack(b["radius"], len(radii), beta)
    tau_s = stable_select_threshold(b["select_a"], b["select_b"], b["delta_tv"], k)
    diag["preflight"] = {"radius_threshold": t - gamma, "select_threshold": tau_s}
    if t <= gamma or tau_s >= m:
        # public numbers only: the block-level thresholds exceed what m blocks can reach
        return fail(NAME, g, "preflight",
                    f"m={m} blocks (target t={t}) cannot pass the radius threshold t-Gamma="
                    f"{t - gamma:.4g} or the selection threshold {tau_s:.4g} (n={n}, d={d}, "
                    f"k={k}, eps={epsilon:g}); decided from public numbers only", diag)
    perm = structure_rng(master, "perm").permutation(n)
    M, W, Vv, active = _fit_blocks(X, perm, m, n_b, k, master, n_init, R, 1e-6 * sigma_min**2,
                                   progress if callable(progress) else None)
    block_ids = np.repeat(np.arange(m), k).reshape(m, k)
    out_means, out_w, out_v = [], [], []
    lv_lo, lv_hi = 2 * math.log(sigma_min), 2 * math.log(sigma_max)
    bins = np.arange(0.0, 1.0, alpha / k) + alpha / (2 * k)
    for i in range(k):
        struct = structure_rng(master, f"round{i}")
        rec: dict = {"round": i}
        diag["rounds"].append(rec)
        vals = block_radius_query(M[active], block_ids[active], radii, t)
        j = above_threshold(vals, t - gamma, 2.0, b["radius"], rng)
        if j is None:
            rec["outcome"] = "no radius"
            break
        r_t = float(radii[j])
        rec["radius"] = r_t
        s = 2.0 * r_t
        rot = _rotation(d, struct)
        u = struct.uniform(0.0, s, size=d)
        cells = np.floor((M @ rot.T + u) / s).astype(np.int64)  # (m, k, d)
        key_sets = [[tuple(cells[bb, jj]) for jj in range(k) if active[bb, jj]]
                    for bb in range(m)]
        kappa, info = stable_select(key_sets, b["select_a"], b["select_b"], b["delta_tv"], k,
                                    rng)
        rec["select"] = info
        if kappa is None:
            rec["outcome"] = "no cell"
            break
        gc = rot.T @ (s * (np.asarray(kappa, dtype=np.float64) + 0.5) - u)
        in_cell = active & np.all(cells == np.asarray(kappa), axis=2)
        dist = np.linalg.norm(M - gc, axis=2)
        reps = [M[bb, np.argmin(np.where(in_cell[bb], dist[bb], np.inf))]
                for bb in range(m) if in_cell[bb].any()]
        c1, n1 = noisy_sum_count(np.array(reps).reshape(-1, d), gc, s * math.sqrt(d) / 2,
                                 *b["stage1"], rng, zcdp=b["stage1"].zcdp)
        if n1 < 1:
            rec["outcome"] = "empty cell"
            break
        rho2 = 2.0 * r_t
        dist = np.where(active, np.linalg.norm(M - c1, axis=2), np.inf)
        near = dist.min(axis=1) <= rho2
        reps = M[np.arange(m), dist.argmin(axis=1)][near]
        mu, n2 = noisy_sum_count(reps, c1, rho2, *b["stage2"], rng, zcdp=b["stage2"].zcdp)
        mu = c1 if n2 < 1 else mu
        dist = np.where(active, np.linalg.norm(M - mu, axis=2), np.inf)
        near = dist.min(axis=1) <= 3.0 * r_t
        rep_j = dist.argmin(axis=1)
        w_rep = W[np.arange(m), rep_j][near]
        scores = np.histogram(np.clip(w_rep, 0, 1 - 1e-12), bins=len(bins), range=(0, 1))[0]
        w_hat = bins[exponential_mechanism(scores, 1.0, b["weight"], rng)]
        lv = np.clip(np.log(np.maximum(Vv[np.arange(m), rep_j][near], 1e-300)), lv_lo, lv_hi)
        centre_v = np.array([(lv_lo + lv_hi) / 2])
        lv_hat, _ = noisy_sum_count(lv.reshape(-1, 1), centre_v, (lv_hi - lv_lo) / 2 + 1e-12,
                                    *b["variance"], rng, zcdp=b["variance"].zcdp)
        var = float(np.exp(np.clip(lv_hat[0], lv_lo, lv_hi)))
        active &= ~(dist <= 3.0 * r_t)
        out_means.append(mu)
        out_w.append(w_hat)
        out_v.append(var)
        rec["outcome"] = "component"
    diag["components_found"] = len(out_means)
    if len(out_means) < k:
        last = diag["rounds"][-1]["outcome"] if diag["rounds"] else "none"
        return fail(NAME, g, f"round {len(out_means) + 1}: {last}",
                    f"{len(out_means)} of k={k} components released (n={n}, d={d}, "
                    f"eps={epsilon:g}, blocks m={m}, block radius target t={t}, "
                    f"radius threshold t-Gamma={t - gamma:.4g})", diag)
    return success(NAME, g, np.array(out_w), out_means,
                   [v * np.eye(d) for v in out_v], diag)


register_learner(NAME, learn_salite)
