"""A sample-and-aggregate GMM learner following the privacy architecture of Afzali et al.

``AALStyleSampleAggregateGMM`` (registered as ``afzali-style-sample-aggregate``) follows the
*privacy architecture* of Afzali, Ashtiani & Liaw (disjoint blocks -> per-block candidate
lists -> private common-member selection) but **does not have their guarantees**: the paper
gives no finite-time algorithm (its list decoder and locally small cover cannot be built), so
EM restarts stand in for the list decoder, a held-out log-likelihood filter for the minimum
distance filter, a data-independent random grid on a parameter embedding for the locally
small cover, and StableSelect for GAP-MAX. It is [PRACTICAL] throughout (``AFZALI.md``).

Steps: public permutation into T blocks (fit part and holdout); per block, ``R_init`` EM fits
(full covariance, public seeds; failures contribute nothing); keep candidates within
``tau_LL`` nats/point of the block's best held-out log-likelihood, at most Q distinct keys;
key of a candidate = (k, sorted cells of its components' ``(mu / w_mu, l / w_l)`` on a
randomly shifted grid), ``l`` the log geometric-mean standard deviation; StableSelect over the
blocks' key sets; refinement by a NoisySumCount of a bounded unit-free parameter vector of
each agreeing block's representative.

Privacy (``AFZALI.md``): one record lies in one block, so a substitution changes one key set
and one refinement vector; StableSelect is (eps_s, (1 + e^{eps_s}) delta_TV)-DP for that
change, the refinement NoisySumCount (L2 sensitivity 2B) is (eps_r, delta_r)-DP; basic
composition gives (eps, delta) with n public (substitution).
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ..._threads import blas_single_thread
from ...linalg import unvech, vech
from ...privacy.ledger import Ledger, Spend, choose_accountant, zcdp_rho
from ...privacy.toolbox import noisy_sum_count, stable_select, stable_select_threshold
from ..kamath.common import fail, guarantee, structure_rng, structure_seed, success
from ..result import LearnResult, register_learner

__all__ = ["NAME", "aal_ledger", "theta_bound", "encode_theta", "decode_theta",
           "AALStyleSampleAggregateGMM"]

NAME = "afzali-style-sample-aggregate"
DOC = "klrelease/learners/afzali/AFZALI.md"


def _aal_ledger(epsilon: float, delta: float, accountant: str, refine: bool
                ) -> tuple[Ledger, dict]:
    sel_share = 0.6 if refine else 1.0
    if accountant == "basic":
        led = Ledger(epsilon, delta)
        e_s, e_r = sel_share * epsilon, (1.0 - sel_share) * epsilon
        d_sel = 0.5 * delta if refine else delta
        d_tv = d_sel / (1.0 + math.exp(e_s))
        led.add("StableSelect over block key sets", e_s, (1.0 + math.exp(e_s)) * d_tv,
                sensitivity="one block's key set (<= Q keys)")
        refine_spend = Spend(e_r, 0.5 * delta)
    else:
        led = Ledger(epsilon, delta, accountant="zcdp")
        rho = zcdp_rho(epsilon, led.delta_z)
        e_s = math.sqrt(2.0 * sel_share * rho)
        d_tv = (delta - led.delta_z) / (1.0 + math.exp(epsilon))
        led.add("StableSelect over block key sets", e_s, kind="stable", delta_tv=d_tv,
                sensitivity="one block's key set (<= Q keys)")
        rho_r = (1.0 - sel_share) * rho
        refine_spend = Spend(math.sqrt(2.0 * rho_r), 0.0, rho_r) if refine else None
    bud = {"select": (e_s / 3.0, 2.0 * e_s / 3.0, d_tv)}
    if refine:
        led.add("refinement NoisySumCount", refine_spend.epsilon, refine_spend.delta,
                kind="approx" if accountant == "basic" else "gaussian",
                zcdp=refine_spend.zcdp, sensitivity="L2 2B")
        bud["refine"] = refine_spend
    return led, bud


def aal_ledger(epsilon: float, delta: float, accountant: str = "basic",
               refine: bool = True) -> tuple[Ledger, dict]:
    """Selection 0.6 (refinement 0.4) of the budget: of epsilon under ``basic`` (delta half
    and half), of rho under ``zcdp``; ``auto`` picks the larger per-piece budget. Without
    refinement the selection gets everything."""
    _, (led, bud) = choose_accountant(accountant,
                                      lambda a: _aal_ledger(epsilon, delta, a, refine))
    return led.check(), bud


def theta_bound(k: int, d: int) -> float:
    """``B = sqrt(k (d/4 + 1/4 + 1) + 1)``: bound on the norm of a refinement vector."""
    return math.sqrt(k * (d / 4.0 + 0.25 + 1.0) + 1.0)


def _sym_fn(S: np.ndarray, fn) -> np.ndarray:
    w, V = np.linalg.eigh(0.5 * (S + S.T))
    return (V * fn(w)) @ V.T


def _component_phi(mu, Sigma, w_mu, w_l, ell0=0.0):
    """Grid coordinates of a component and its log scale ``ell`` (the log geometric-mean
    standard deviation) measured from ``ell0`` (the learner's ``log sigma_max``: the grid then
    moves with the units of the data)."""
    d = len(mu)
    ell = np.linalg.slogdet(Sigma)[1] / (2 * d) - ell0
    return np.concatenate([mu / w_mu, [ell / w_l]]), ell


def candidate_key(gm: tuple, u: np.ndarray, v: np.ndarray, w_mu: float, w_l: float,
                  ell0: float = 0.0):
    """Permutation-invariant key of a candidate mixture and its component order."""
    _, means, covs = gm
    keys, ties = [], []
    for mu, S in zip(means, covs, strict=True):
        phi, _ = _component_phi(mu, S, w_mu, w_l, ell0)
        keys.append(tuple(np.floor(phi + u).astype(np.int64).tolist()))
        ties.append(float(v @ mu))
    order = sorted(range(len(keys)), key=lambda j: (keys[j], ties[j]))
    return (len(keys), tuple(keys[j] for j in order)), order


def encode_theta(gm: tuple, key, order, u, w_mu, w_l, L_F, ell0: float = 0.0) -> np.ndarray:
    """Unit-free bounded vector of an aligned candidate (clipped so that its norm <= B)."""
    weights, means, covs = gm
    d = means.shape[1]
    parts = []
    for j_key, j in enumerate(order):
        cell = np.asarray(key[1][j_key], dtype=np.float64)
        mu, S = means[j], covs[j]
        _, ell = _component_phi(mu, S, w_mu, w_l, ell0)
        g_mu = w_mu * (cell[:d] - u[:d] + 0.5)
        g_l = w_l * (cell[d] - u[d] + 0.5)
        A = _sym_fn(S, np.log) - 2.0 * (ell + ell0) * np.eye(d)
        fn = np.linalg.norm(A)
        if fn > L_F:
            A = A * (L_F / fn)
        parts += [np.clip((mu - g_mu) / w_mu, -0.5, 0.5),
                  [np.clip((ell - g_l) / w_l, -0.5, 0.5)], vech(A, isometric=True) / L_F]
    parts.append(np.clip(weights[list(order)], 0.0, 1.0))
    return np.concatenate([np.ravel(p) for p in parts])


def decode_theta(theta: np.ndarray, key, k: int, d: int, u, w_mu, w_l, L_F,
                 ell0: float = 0.0):
    """Mixture from a released vector (post-processing); covariances are always PD."""
    p = d * (d + 1) // 2
    step = d + 1 + p
    means, covs = [], []
    for j in range(k):
        blk = theta[j * step:(j + 1) * step]
        cell = np.asarray(key[1][j], dtype=np.float64)
        mu = w_mu * (cell[:d] - u[:d] + 0.5) + w_mu * blk[:d]
        ell = w_l * (cell[d] - u[d] + 0.5) + w_l * blk[d] + ell0
        A = L_F * unvech(blk[d + 1:], d, isometric=True)
        A = A - np.trace(A) / d * np.eye(d)
        covs.append(math.exp(2.0 * ell) * _sym_fn(A, np.exp))
        means.append(mu)
    w = np.maximum(theta[k * step:k * step + k], 1e-3)
    return w / w.sum(), np.array(means), np.array(covs)


@blas_single_thread  # many small fits: threaded BLAS only adds synchronisation
def _block_candidates(F, H, k, seeds, tau_ll, reg):
    from sklearn.mixture import GaussianMixture

    cands = []
    for s in seeds:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                gm = GaussianMixture(k, covariance_type="full", n_init=1, random_state=int(s),
                                     init_params="k-means++",
                                     reg_covar=reg).fit(F)
            ll = float(gm.score(H))
            if np.isfinite(ll) and np.all(np.isfinite(gm.covariances_)):
                cands.append((ll, (gm.weights_, gm.means_, gm.covariances_)))
        except Exception:  # noqa: BLE001 - a failed fit contributes nothing (rule 5)
            continue
    if not cands:
        return []
    best = max(c[0] for c in cands)
    return sorted([c for c in cands if c[0] >= best - tau_ll], key=lambda c: -c[0])


def learn_aal_style(X, n_components: int, *, epsilon: float, delta: float,
                    rng: np.random.Generator, sigma_max: float, w_mu: float | None = None,
                    w_l: float = 0.5, L_F: float = 2.0, Q: int = 4, r_init: int = 10,
                    holdout: float = 0.3, tau_ll: float = 0.05, blocks: int | None = None,
                    refine: bool = True, accountant: str = "basic",
                    progress=None) -> LearnResult:
    """Sample-and-aggregate following Afzali et al.'s privacy architecture (no utility claim).

    Parameters (all public)
    -----------------------
    sigma_max : largest component standard deviation, in the units of the data (required).
    w_mu : mean-cell width (default ``3 sigma_max``).
    w_l : log-scale cell width.
    L_F : shape clip.
    Q : keys per block.
    r_init : EM restarts per block.
    holdout : fraction of a block held out for the likelihood filter.
    tau_ll : likelihood filter (nats per point).
    blocks : number of blocks T (default ``min(n // max(100, 15 P), 1000)``, P the number of
        free parameters).
    refine : refine the selected candidate with a noisy average (else selection only).
    accountant : ``basic`` (default), ``zcdp`` or ``auto`` (public inputs only).
    progress : when callable, called with 1 after each block's fits.
    """
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    k = int(n_components)
    led, bud = aal_ledger(epsilon, delta, accountant, refine)
    g = guarantee(led, "sample-and-aggregate after Afzali et al. (architecture only)", DOC)
    master = structure_seed(rng)
    struct = structure_rng(master, "public")
    w_mu = 3.0 * sigma_max if w_mu is None else float(w_mu)
    ell0 = math.log(sigma_max)  # the log-scale grid is measured from the public sigma_max
    P = k * (1 + d + d * (d + 1) // 2) - 1
    n_b = max(100, 15 * P)
    T = int(blocks) if blocks else min(n // n_b, 1000)
    diag: dict = {"ledger": led.to_dict(), "n": n, "d": d, "k": k, "blocks": T}
    if T < 1:
        return fail(NAME, g, "blocks", f"n={n} gives no block of size {n_b}", diag)
    e_a, e_b, d_tv = bud["select"]
    tau = stable_select_threshold(e_a, e_b, d_tv, Q)
    diag["preflight"] = {"select_threshold": tau}
    if tau >= T:
        return fail(NAME, g, "preflight",
                    f"T={T} blocks cannot reach the selection threshold {tau:.4g} (n={n}, "
                    f"d={d}, k={k}, eps={epsilon:g}); decided from public numbers only", diag)
    m_b = n // T
    perm = struct.permutation(n)
    u = struct.uniform(size=d + 1)
    v = struct.normal(size=d)
    v /= np.linalg.norm(v)
    seeds = struct.integers(0, 2**31 - 1, size=(T, r_init))
    n_fit = int(round((1 - holdout) * m_b))
    key_sets, reps = [], []
    for i in range(T):
        blk = X[perm[i * m_b:(i + 1) * m_b]]
        cands = _block_candidates(blk[:n_fit], blk[n_fit:], k, seeds[i], tau_ll,
                                  1e-4 * w_mu**2)
        ks, rep = [], {}
        for _, gm in cands:
            key, order = candidate_key(gm, u, v, w_mu, w_l, ell0)
            if key not in rep:
                rep[key] = (gm, order)
                ks.append(key)
            if len(ks) == Q:
                break
        key_sets.append(ks)
        reps.append(rep)
        if callable(progress):
            progress(1)
    kappa, info = stable_select(key_sets, e_a, e_b, d_tv, Q, rng)
    diag["select"] = info
    if kappa is None:
        return fail(NAME, g, "common-member selection",
                    f"no key passed the stability threshold {info['threshold']:.4g} "
                    f"(noisy top vote count {info['noisy_max_score']:.4g} of T={T} blocks; "
                    f"n={n}, d={d}, k={k}, eps={epsilon:g})", diag)
    if not refine:
        means = np.array([w_mu * (np.asarray(c[:d]) - u[:d] + 0.5) for c in kappa[1]])
        covs = np.array([math.exp(2 * (w_l * (c[d] - u[d] + 0.5) + ell0)) * np.eye(d)
                         for c in kappa[1]])
        return success(NAME, g, np.full(k, 1.0 / k), means, covs, diag)
    thetas = [encode_theta(rep[kappa][0], kappa, rep[kappa][1], u, w_mu, w_l, L_F, ell0)
              for rep in reps if kappa in rep]
    dim = k * (d + 1 + d * (d + 1) // 2) + k
    B = theta_bound(k, d)
    theta, cnt = noisy_sum_count(np.array(thetas).reshape(-1, dim), np.zeros(dim), B,
                                 *bud["refine"], rng, zcdp=bud["refine"].zcdp)
    diag["refine_noisy_count"] = cnt
    w, means, covs = decode_theta(theta, kappa, k, d, u, w_mu, w_l, L_F, ell0)
    return success(NAME, g, w, means, covs, diag)


#: The registered learner under an honest name: it approximates the architecture only.
AALStyleSampleAggregateGMM = learn_aal_style

register_learner(NAME, learn_aal_style)
