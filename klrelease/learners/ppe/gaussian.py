"""``ppme-gaussian``: one unbounded Gaussian by the staged pipeline of Ashtiani & Liaw (2022).

Stages (``PPE.md`` beside this module, section "Application A"), each on its own disjoint part of
a data-independent random permutation of the rows, each with its own share of the budget:

1. **rank** -- PPME with the 0/inf distance on the numerical rank of centred blocks of
   ``d + 1`` rows and the identity mask (``t1 = max(140, t_min)`` blocks). A released rank
   below d ends the run (FAIL "degenerate": exact subspace release is not implemented).
2. **preconditioner** -- PPME with the spectral distance (r = 1, phi = 1, z = 3/2) on block
   covariances of ``s_pre`` rows, masked by ``R_COV`` at the radius ``800 / t`` that PPME's proof
   needs; the noise scale eta is the smallest meeting the budget at that radius. When no eta
   does (the radius exceeds the noise-free ceiling) the configuration is infeasible and the
   learner returns FAIL before reading any row. Option ``preconditioner="identity"`` uses the
   public identity instead (private trivially, but accurate only for well-conditioned data).
3. **fine covariance** -- paired differences whitened by the preconditioner, clipped to a
   public radius, averaged outer products plus symmetric Gaussian noise (Frobenius
   sensitivity ``4 R^2 / n``; exact Gaussian calibration, :mod:`klrelease.privacy.calibration`),
   projected onto the PD cone.
4. **mean** -- rows whitened by the fine covariance; a coarse PPE over block means (l2, z = 1)
   masked by a Gaussian calibrated exactly to its radius; then the rows projected onto a public
   ball around the coarse mean, averaged, plus Gaussian noise (sensitivity ``2 R / n``).

Privacy: every stage is (eps_i, delta_i)-DP under replacement of one record (PPE/PPME:
(2 eps', 4 e^eps' delta') with eps', delta' from :func:`split_budget`); the stages compose
adaptively, with the budget split equally over the mechanisms (basic composition), so the
whole learner is (eps, delta)-DP, FAIL outcomes included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...gmm import GMM
from ...privacy.calibration import analytic_gaussian_sigma
from ..result import LearnResult
from .distances import DiscreteDistance, L2Distance, SpectralDistance
from .framework import ppe, ppme, split_budget
from .learners import ppe_guarantee
from .masking import cov_eta_for_radius, cov_masking_radius, mask_covariance
from .tlap import t_min

__all__ = ["GaussianPipelineConfig", "configure_gaussian_pipeline", "ppme_gaussian",
           "block_rank", "DEFAULT_S_PRE"]

#: Block sizes at which two block covariances are within spectral distance 2/3 with
#: probability 0.9 (Monte Carlo, PPE.md section 8.1); other d interpolate linearly.
DEFAULT_S_PRE = {2: 81, 5: 202, 10: 358}


def _default_s_pre(d: int) -> int:
    ks = sorted(DEFAULT_S_PRE)
    return int(math.ceil(np.interp(d, ks, [DEFAULT_S_PRE[k] for k in ks],
                                   left=DEFAULT_S_PRE[2], right=None) if d <= 10
                         else DEFAULT_S_PRE[10] * d / 10))


@dataclass(frozen=True)
class GaussianPipelineConfig:
    """Public configuration of the staged learner (from N, d, the budget and the options)."""

    n_samples: int
    d: int
    mechanisms: int
    epsilon_each: float
    delta_each: float
    parts: dict
    t_rank: int
    t_pre: int | None
    s_pre: int | None
    eta_pre: float | None
    t_mean: int
    preconditioner: str
    feasible: bool
    stage: str
    reason: str
    beta: float
    a_pre: float

    def public(self) -> dict:
        return {k: getattr(self, k) for k in (
            "n_samples", "d", "mechanisms", "epsilon_each", "delta_each", "parts", "t_rank",
            "t_pre", "s_pre", "eta_pre", "t_mean", "preconditioner", "beta", "a_pre")}


def configure_gaussian_pipeline(N: int, d: int, epsilon: float, delta: float, *,
                                preconditioner: str = "ppme", beta: float = 0.1,
                                a_pre: float = 0.25, s_pre: int | None = None
                                ) -> GaussianPipelineConfig:
    """Fix the stages from public numbers; ``feasible`` False names the stage and why."""
    if preconditioner not in ("ppme", "identity"):
        raise ValueError("preconditioner must be 'ppme' or 'identity'")
    nm = 5 if preconditioner == "ppme" else 4
    ee, de = epsilon / nm, delta / nm
    pe, pd = split_budget(ee, de)
    t1 = max(140, t_min(pe, pd))
    n1 = t1 * (d + 1)
    rest = N - n1
    fail = dict(feasible=False)
    base = dict(n_samples=N, d=d, mechanisms=nm, epsilon_each=ee, delta_each=de, t_rank=t1,
                t_mean=t_min(pe, pd), preconditioner=preconditioner, beta=beta, a_pre=a_pre)
    if rest <= 0:
        return GaussianPipelineConfig(
            **base, parts={"rank": n1}, t_pre=None, s_pre=None, eta_pre=None, **fail,
            stage="configuration",
            reason=f"the rank stage alone needs t*(d+1) = {n1} rows (t={t1}); N={N}")
    if preconditioner == "ppme":
        fr = (0.60, 0.25, 0.15)
    else:
        fr = (0.0, 0.625, 0.375)
    n2a = int(rest * fr[0])
    n2b = int(rest * fr[1]) // 2 * 2
    n3 = rest - n2a - n2b
    parts = {"rank": n1, "preconditioner": n2a, "covariance": n2b, "mean": n3}
    t_pre = s = eta = None
    if preconditioner == "ppme":
        s = int(s_pre) if s_pre is not None else _default_s_pre(d)
        t_pre = n2a // s
        need_t = max(140, t_min(pe, pd))
        ceiling = cov_masking_radius(d, pe, pd, math.inf)
        t_ceiling = math.ceil(800.0 / ceiling)
        if t_pre < need_t:
            return GaussianPipelineConfig(
                **base, parts=parts, t_pre=t_pre, s_pre=s, eta_pre=None, **fail,
                stage="configuration",
                reason=f"preconditioner stage: {n2a} rows give t={t_pre} blocks of {s}; PPME "
                       f"needs t >= {need_t}, and a masking radius 800/t below the noise-free "
                       f"ceiling {ceiling:.3g} of R_COV, i.e. t >= {t_ceiling} blocks and N >= "
                       f"{n1 + t_ceiling * s / fr[0]:.2g}")
        gamma_req = 800.0 / t_pre
        eta = cov_eta_for_radius(gamma_req, d, pe, pd)
        if eta is None:
            return GaussianPipelineConfig(
                **base, parts=parts, t_pre=t_pre, s_pre=s, eta_pre=None, **fail,
                stage="configuration",
                reason=f"preconditioner stage cannot be configured: PPME needs masking radius "
                       f"800/t = {gamma_req:.3g} with t={t_pre} blocks, but the largest radius "
                       f"R_COV can mask at this budget is {ceiling:.3g} (even without noise); "
                       f"that needs t >= {t_ceiling} blocks, i.e. N >= "
                       f"{n1 + t_ceiling * s / fr[0]:.2g}")
    if t_min(pe, pd) > n3 or n2b < 2:
        return GaussianPipelineConfig(
            **base, parts=parts, t_pre=t_pre, s_pre=s, eta_pre=eta, **fail,
            stage="configuration",
            reason=f"the mean stage needs at least t={t_min(pe, pd)} rows, has {n3}")
    return GaussianPipelineConfig(**base, parts=parts, t_pre=t_pre, s_pre=s, eta_pre=eta,
                                  feasible=True, stage="", reason="")


def block_rank(rows: np.ndarray, seed=None) -> int:
    """Numerical rank of the centred block (deterministic tolerance)."""
    Z = rows - rows.mean(axis=0)
    sv = np.linalg.svd(Z, compute_uv=False)
    if sv.size == 0 or not np.all(np.isfinite(sv)) or sv[0] == 0:
        return 0
    tol = sv[0] * max(rows.shape) * 10 * np.finfo(float).eps
    return int(np.sum(sv > tol))


def _block_cov(rows: np.ndarray, seed=None) -> np.ndarray:
    return np.atleast_2d(np.cov(rows, rowvar=False))


def _block_mean(rows: np.ndarray, seed=None) -> np.ndarray:
    return rows.mean(axis=0)


def ppme_gaussian(X: np.ndarray, n_components: int, *, epsilon: float, delta: float,
                  rng: np.random.Generator, preconditioner: str = "ppme", beta: float = 0.1,
                  a_pre: float = 0.25, s_pre: int | None = None, progress=None) -> LearnResult:
    """Private unbounded Gaussian by the staged PPME pipeline (see the module docstring).

    Parameters (all public)
    -----------------------
    preconditioner : ``ppme`` (a PPME covariance preconditioner) or ``identity``.
    beta : failure probability of the clipping radii.
    a_pre : the preconditioner's accuracy parameter.
    s_pre : rows per block of the preconditioner (default from the budget).
    progress : when callable, called with 1 after each block.
    """
    if n_components != 1:
        raise ValueError("ppme-gaussian learns one Gaussian: n_components must be 1")
    N, d = X.shape
    cfg = configure_gaussian_pipeline(N, d, epsilon, delta, preconditioner=preconditioner,
                                      beta=beta, a_pre=a_pre, s_pre=s_pre)
    g = ppe_guarantee(
        epsilon, delta, "staged learner of one Gaussian (rank, preconditioner, covariance, mean)",
        f"{cfg.mechanisms} mechanisms on disjoint parts, each ({cfg.epsilon_each:.4g}, "
        f"{cfg.delta_each:.3g})-DP, basic composition")
    diag = cfg.public()

    def fail(stage: str, reason: str) -> LearnResult:
        return LearnResult("ppme-gaussian", None, g, failed=True, stage=stage, reason=reason,
                           diagnostics=diag)

    if not cfg.feasible:
        return fail(cfg.stage, cfg.reason)
    pe, pd = split_budget(cfg.epsilon_each, cfg.delta_each)
    perm = rng.permutation(N)
    cuts = np.cumsum([cfg.parts[k] for k in ("rank", "preconditioner", "covariance", "mean")])
    P1, P2a, P2b, P3 = (X[perm[a:b]] for a, b in zip(np.r_[0, cuts[:-1]], cuts, strict=True))

    # 1. rank
    out = ppme(P1, block_rank, DiscreteDistance(), lambda y, _g: y, epsilon=pe, delta=pd,
               r=1.0, t=cfg.t_rank, rng=rng, progress=progress)
    if not out.passed:
        return fail("rank", f"the rank test failed (t={cfg.t_rank} blocks of d+1 rows)")
    rank = int(round(out.output))
    diag["released_rank"] = rank
    if rank < d:
        return fail("rank", f"released rank {rank} < d={d}: degenerate distribution (subspace "
                            "release is not implemented)")
    # 2a. preconditioner
    if cfg.preconditioner == "ppme":
        eta = cfg.eta_pre
        out = ppme(P2a, _block_cov, SpectralDistance(),
                   lambda S, g_: mask_covariance(S, eta, g_), epsilon=pe, delta=pd, r=1.0,
                   t=cfg.t_pre, rng=rng, progress=progress)
        if not out.passed:
            return fail("preconditioner", f"the PPME popularity test failed (t={cfg.t_pre} "
                                          f"blocks of {cfg.s_pre} rows, threshold 2/3)")
        S_pre = out.output
    else:
        S_pre = np.eye(d)
    L_pre = np.linalg.cholesky(S_pre)
    # 2b. fine covariance: clip + Gaussian mechanism on whitened paired differences
    n = P2b.shape[0]
    Z = np.linalg.solve(L_pre, ((P2b[0::2] - P2b[1::2]) / math.sqrt(2.0)).T).T
    lg = math.log(n / beta)
    R2 = (1 + cfg.a_pre) * (d + 2 * math.sqrt(d * lg) + 2 * lg)
    nz = np.linalg.norm(Z, axis=1)
    Z = Z * np.minimum(1.0, math.sqrt(R2) / np.maximum(nz, 1e-300))[:, None]
    M = 2.0 / n * Z.T @ Z
    sigma = analytic_gaussian_sigma(cfg.epsilon_each, cfg.delta_each, 4.0 * R2 / n)
    E = np.triu(rng.normal(0.0, sigma, (d, d)))
    M = M + E + np.triu(E, 1).T
    vals, vecs = np.linalg.eigh(M)
    M = (vecs * np.maximum(vals, 1e-6)) @ vecs.T
    S_hat = L_pre @ M @ L_pre.T
    S_hat = 0.5 * (S_hat + S_hat.T)
    L_hat = np.linalg.cholesky(S_hat)
    # 3. mean: coarse PPE on whitened block means, then clipped average + Gaussian
    Y = np.linalg.solve(L_hat, P3.T).T
    n3 = Y.shape[0]
    t3 = cfg.t_mean
    s3 = n3 // t3
    tau_c = 2 * math.sqrt(1.5) * (math.sqrt(d) + math.sqrt(2 * math.log(2 * t3 / beta))) \
        / math.sqrt(s3)
    r = 2.0 * tau_c
    eta_c = analytic_gaussian_sigma(pe, pd, r)
    out = ppe(Y, _block_mean, L2Distance(),
              lambda y, g_: y + eta_c * g_.standard_normal(y.shape), epsilon=pe, delta=pd,
              radius=r, t=t3, rng=rng, progress=progress)
    if not out.passed:
        return fail("mean", f"the coarse PPE test on block means failed (t={t3} blocks of {s3} "
                            f"rows, threshold {tau_c:.3g})")
    nu_c = out.output
    R = tau_c / 2 + eta_c * (math.sqrt(d) + math.sqrt(2 * math.log(2 / beta))) \
        + math.sqrt(1.5) * (math.sqrt(d) + math.sqrt(2 * math.log(2 * n3 / beta)))
    D = Y - nu_c
    nd = np.linalg.norm(D, axis=1)
    Yc = nu_c + D * np.minimum(1.0, R / np.maximum(nd, 1e-300))[:, None]
    sig_m = analytic_gaussian_sigma(cfg.epsilon_each, cfg.delta_each, 2.0 * R / n3)
    nu = Yc.mean(axis=0) + rng.normal(0.0, sig_m, d)
    mu = L_hat @ nu
    return LearnResult("ppme-gaussian", GMM(np.ones(1), mu[None], S_hat[None]), g,
                       diagnostics=diag)
