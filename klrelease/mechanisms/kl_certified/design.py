"""Design of ``kl-certified`` from public inputs and released values only.

Nothing in this module receives the labels, or under replace-one the features: every function
takes a :class:`PublicInputs` (epsilon, delta, the relation, N, K, d, the public frame and
public constants) and values the mechanism has *already released* with noise. Whatever it
computes is post-processing of public or released values and costs no privacy (proof:
``kl_certified.md`` beside this module).

The release has three stages, each a Gaussian mechanism whose whitened sensitivity is a public
constant (:class:`Budget`):

A. the class counts and the class sums of the rows in the public frame, clipped to a ball of
   public radius ``R`` (:func:`centres`: rough class centres and their noise law);
B. under replace-one only, the pooled scatter of the rows about those released centres
   (under label flip the total scatter of the features is public and takes its place);
C. per class, the sums and second moments of the rows in a *class region*: an ellipsoid
   centred on the released centre and shaped by the released pooled covariance plus the
   centre's known noise, radius ``r`` (:func:`regions`), with the class's budget split between
   means and covariances by a KL surrogate (:func:`class_noise`).

:func:`estimate` forms the released GMM: precision-weighted means of stages A and C, each class
covariance shrunk toward the pooled covariance by the known noise level, eigenvalues adjusted
for the asymmetry of the KL divergence (an overestimated variance costs linearly, an
underestimated one logarithmically). All floors are relative to released or public scales, and
every function here is total: it returns finite values for every finite input, so a release
never fails after noise has been drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.stats import chi2

from ...linalg import vech
from ...privacy.calibration import gaussian_delta, gaussian_max_sensitivity
from ...privacy.projections import project_simplex
from ...statistics import affine_rows

__all__ = [
    "Budget",
    "Frame",
    "PublicInputs",
    "Regions",
    "ClassNoise",
    "SETTINGS",
    "allocate_pairwise",
    "centres",
    "pooled_covariance",
    "regions",
    "class_noise",
    "estimate",
    "eig_apply",
    "symmetric_gaussian",
]

#: Public constants of the design (the same for every dataset).
SETTINGS = {
    # label flip: share of mu^2 for counts, stage-A sums; replace-one adds the pooled scatter
    "label-flip": {"counts": 0.09, "sums": 0.21, "scatter": 0.0},
    "replace-one": {"counts": 0.10, "sums": 0.24, "scatter": 0.06},
    "radius_quantile": 0.9,  # label flip: stage-A radius = this quantile of the row-sample norms
    "box_radius": 0.6,  # replace-one: stage-A radius = this x sqrt(d) in the bound's frame
    "region_level": 0.95,  # stage-C radius^2 = chi2_d quantile at this level
    "count_floor": 2.0,  # released counts used as divisors are >= this x their noise sd
    "prior_divergence": 0.25,  # per dimension: expected ||Sigma_k - pooled||_F^2 / d in frame
    "eigen_margin": 1.0,  # pooled eigenvalues lowered by this x their noise scale
    "class_floor": 0.1,  # class eigenvalues >= this x the smallest target eigenvalue
    "pooled_floor": 1e-3,  # pooled eigenvalues >= this x the largest one
}

_MEAN_SHARES = np.array([0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 1.0])


def eig_apply(C: np.ndarray, fn) -> np.ndarray:
    """``V fn(w) V^T`` for the symmetric part of ``C`` (batched); ``fn`` maps eigenvalues."""
    C = 0.5 * (C + np.swapaxes(C, -1, -2))
    C = np.where(np.isfinite(C), C, 0.0)
    w, V = np.linalg.eigh(C)
    return (V * fn(w)[..., None, :]) @ np.swapaxes(V, -1, -2)


def symmetric_gaussian(rng: np.random.Generator, sigma: np.ndarray, d: int) -> np.ndarray:
    """Symmetric matrices with density proportional to ``exp(-||E||_F^2 / (2 sigma^2))``.

    Diagonal entries have variance sigma^2, off-diagonal ones sigma^2 / 2: in the coordinates
    ``(E_ii, sqrt(2) E_ij)`` this is N(0, sigma^2 I), so a change ``D`` of the released matrix
    has whitened norm ``||D||_F / sigma``.
    """
    sigma = np.asarray(sigma, dtype=float)
    Z = rng.standard_normal(sigma.shape + (d, d)) * sigma[..., None, None]
    return 0.5 * (Z + np.swapaxes(Z, -1, -2))


def symmetric_gaussian_logpdf(E: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Log-density of :func:`symmetric_gaussian` at ``E`` (batched over leading axes), with
    respect to Lebesgue measure on the entries ``E_ij``, ``i <= j``."""
    d = E.shape[-1]
    sigma = np.asarray(sigma, dtype=float)
    n_off = d * (d - 1) // 2
    quad = np.sum(vech(E, isometric=True) ** 2, -1) / (2 * sigma**2)
    norm = d * 0.5 * np.log(2 * np.pi * sigma**2) + n_off * 0.5 * np.log(np.pi * sigma**2)
    return -quad - norm


# ------------------------------------------------------------------------------ public inputs


@dataclass(frozen=True)
class Frame:
    """A public affine frame: ``t = (x - centre) @ W``, ``x = centre + t @ W_inv``.

    Under label flip it whitens the (public) features: centre = their mean, ``W`` the inverse
    symmetric square root of their covariance, so the frame is affine-equivariant. Under
    replace-one it comes from the public bound: a box maps to ``[-1, 1]^d``, a ball of radius
    ``B`` to the ball of radius ``sqrt(d)``.
    """

    centre: np.ndarray
    W: np.ndarray
    W_inv: np.ndarray

    def to_frame(self, X: np.ndarray) -> np.ndarray:
        return affine_rows(X, self.centre, self.W)

    def mean_to_raw(self, m: np.ndarray) -> np.ndarray:
        return self.centre + m @ self.W_inv

    def cov_to_raw(self, C: np.ndarray) -> np.ndarray:
        return self.W_inv.T @ C @ self.W_inv


@dataclass(frozen=True)
class Budget:
    """The privacy budget: one Gaussian mechanism of total whitened sensitivity ``mu``.

    Stage ``i`` may move its released values by at most ``s_i`` in whitened norm, whatever was
    released before; ``mu^2 = s_counts^2 + s_sums^2 + s_scatter^2 + s_classes^2``. The release
    is then ``mu``-GDP, i.e. (eps, delta(eps))-DP with ``delta`` the Gaussian curve.
    """

    epsilon: float
    delta: float
    mu: float
    counts: float
    sums: float
    scatter: float
    classes: float

    @classmethod
    def split(cls, epsilon: float, delta: float, shares: dict) -> Budget:
        mu = gaussian_max_sensitivity(epsilon, delta)
        # the calibration is exact to ~1e-12; a relative margin keeps delta(eps) <= delta
        mu *= 1.0 - 1e-9
        f = {k: float(shares[k]) for k in ("counts", "sums", "scatter")}
        rest = 1.0 - sum(f.values())
        return cls(epsilon, delta, mu, mu * np.sqrt(f["counts"]), mu * np.sqrt(f["sums"]),
                   mu * np.sqrt(f["scatter"]), mu * np.sqrt(rest))

    @property
    def total(self) -> float:
        """sqrt of the sum of the stage sensitivities squared (equals ``mu``)."""
        return float(np.sqrt(self.counts**2 + self.sums**2 + self.scatter**2 + self.classes**2))

    def delta_at(self, epsilon: float) -> float:
        """delta(eps) of this release (the Gaussian curve with shift ``mu``)."""
        return gaussian_delta(1.0, float(epsilon), self.mu)

    def pld_delta(self, epsilon: float | None = None) -> float:
        """delta(eps) from ``dp_accounting``'s PLD accountant (an independent computation)."""
        from dp_accounting.pld import privacy_loss_distribution as pld

        dist = pld.from_gaussian_mechanism(1.0 / self.mu, sensitivity=1.0,
                                           value_discretization_interval=1e-4)
        return float(dist.get_delta_for_epsilon(self.epsilon if epsilon is None else epsilon))

    def dp_event(self):
        """The ``dp_accounting`` event of this release (a Gaussian mechanism)."""
        import dp_accounting

        return dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / self.mu)

    def describe(self) -> str:
        return (f"one Gaussian mechanism of total whitened sensitivity mu = {self.mu:.6g} "
                f"(counts {self.counts:.4g}, sums {self.sums:.4g}"
                + (f", pooled scatter {self.scatter:.4g}" if self.scatter > 0 else "")
                + f", class stage {self.classes:.4g}); delta({self.epsilon:g}) = "
                f"{self.delta_at(self.epsilon):.4g} <= {self.delta:g}")


@dataclass(frozen=True)
class PublicInputs:
    """Everything public a release is designed from.

    ``total_scatter`` and ``total_sums`` are the scatter of the rows and the sum of the
    stage-A clipped rows in the frame, public under label flip (the features are) and ``None``
    under replace-one.
    """

    relation: str
    n_samples: int
    n_classes: int
    n_features: int
    frame: Frame
    budget: Budget
    radius: float  # stage A (and the global fallback region of stage C)
    region_radius: float  # stage C, in class-frame units
    total_scatter: np.ndarray | None = None
    total_sums: np.ndarray | None = None
    settings: dict = field(default_factory=lambda: dict(SETTINGS))

    @property
    def label_flip(self) -> bool:
        return self.relation == "label-flip"

    @property
    def sums_factor(self) -> float:
        """Whitened sensitivity of a class sum per unit radius: a label flip moves two sums by
        one clipped row each (sqrt 2); replace-one may move one sum by a difference of two
        (2)."""
        return float(np.sqrt(2.0)) if self.label_flip else 2.0

    @property
    def count_sd(self) -> float:
        return float(np.sqrt(2.0) / self.budget.counts)

    @property
    def sums_sd(self) -> float:
        return float(self.sums_factor * self.radius / self.budget.sums)

    @property
    def scatter_sd(self) -> float:
        if self.budget.scatter <= 0:
            return float("inf")
        return float(np.sqrt(2.0) * self.radius**2 / self.budget.scatter)


def region_radius(d: int, level: float) -> float:
    return float(np.sqrt(chi2.ppf(level, d)))


# ------------------------------------------------------------------------- stage A: centres


def _outer(a: np.ndarray) -> np.ndarray:
    return np.einsum("...i,...j->...ij", a, a)


def robust_counts(pub: PublicInputs, counts: np.ndarray) -> np.ndarray:
    """Released counts as divisors: projected onto sum N (label flip; N is public under both
    relations), then at least ``count_floor`` noise sd and 2 (a tiny or negative noisy count
    would blow a class estimate up)."""
    n = np.asarray(counts, dtype=float)
    n = n - (n.sum() - pub.n_samples) / pub.n_classes
    return np.maximum(np.maximum(n, pub.settings["count_floor"] * pub.count_sd), 2.0)


def centres(pub: PublicInputs, counts: np.ndarray, sums: np.ndarray):
    """Rough class centres from stage A and the covariance of their noise (frame units).

    Under label flip the sums are projected onto their public total. Returns ``(n, m, C)``:
    divisors, centres ``S/n`` and ``C_k = (s_A^2 I + s_n^2 m_k m_k^T) / n_k^2``, the noise of
    the sum and of the count carried into the centre.
    """
    K, d = pub.n_classes, pub.n_features
    S = np.asarray(sums, dtype=float)
    if pub.label_flip and pub.total_sums is not None:
        S = S - (S.sum(axis=0) - pub.total_sums) / K
    n = robust_counts(pub, counts)
    m = S / n[:, None]
    cov = (pub.sums_sd**2 * np.eye(d)[None] + pub.count_sd**2 * _outer(m)) / n[:, None, None] ** 2
    return n, m, cov


def pooled_covariance(pub: PublicInputs, n: np.ndarray, means: np.ndarray,
                      means_cov: np.ndarray, scatter: np.ndarray | None = None,
                      scatter_centres: np.ndarray | None = None) -> np.ndarray:
    """The pooled within-class covariance (frame units) from public and released values.

    Label flip: ``(T - sum_k n_k (m_k m_k^T - C_k)) / (N - K)`` with ``T`` the public total
    scatter, ``m_k`` released means and ``C_k`` their noise covariance (its expected
    contribution removed). Replace-one: the released scatter about the released stage-A
    centres, corrected for the distance between those centres and ``means``.
    Eigenvalues are lowered by their noise scale (the KL divergence punishes an overestimated
    variance more than an underestimated one) and floored relative to the largest.
    """
    N, K = pub.n_samples, pub.n_classes
    dof = max(N - K, 1)
    if pub.label_flip:
        between = np.einsum("k,kij->ij", n, _outer(means) - means_cov)
        P = (pub.total_scatter - between) / dof
        quad = np.einsum("ki,kij,kj->k", means, means_cov, means)
        err = np.sqrt(np.sum(n**2 * (4 * quad + np.trace(means_cov, axis1=1, axis2=2) ** 2)))
        err /= dof
    else:
        shift = means - scatter_centres
        P = (scatter - np.einsum("k,kij->ij", n, _outer(shift) - means_cov)) / dof
        # the spectral norm of the symmetric Gaussian noise: about sigma sqrt(2 d)
        err = pub.scatter_sd * np.sqrt(2.0 * pub.n_features) / dof
    P = 0.5 * (P + P.T)
    P = np.where(np.isfinite(P), P, 0.0)
    top = float(np.max(np.linalg.eigvalsh(P)))
    scale = top if np.isfinite(top) and top > 0 else 1.0
    floor = pub.settings["pooled_floor"] * scale
    margin = pub.settings["eigen_margin"] * (err if np.isfinite(err) else 0.0)
    return eig_apply(P, lambda w: np.maximum(w - margin, floor))


# ------------------------------------------------------------------- stage C: class regions


@dataclass(frozen=True)
class Regions:
    """Per class: ``u = (t - centre_k) @ W_k`` clipped to ``||u|| <= r`` (frame ``t``)."""

    centres: np.ndarray  # (K, d)
    W: np.ndarray  # (K, d, d) symmetric
    W_inv: np.ndarray  # (K, d, d) = shape^(1/2)
    shape: np.ndarray  # (K, d, d) = W_inv^2, the region's covariance-like shape
    is_global: np.ndarray  # (K,) bool: the stage-A ball was cheaper for this class


def regions(pub: PublicInputs, centre: np.ndarray, centre_cov: np.ndarray,
            pooled: np.ndarray) -> Regions:
    """Class regions from released values: centre ``m_k``, shape ``pooled + C_k``.

    The shape covers the class's rows (spread about ``pooled``) around a centre known up to
    its noise ``C_k``. A class whose region would cost more mean noise (``tr(P^{-1} shape)
    r^2``) than the stage-A ball (``tr(P^{-1}) R^2``) uses that ball instead.
    """
    K, d = pub.n_classes, pub.n_features
    r, R = pub.region_radius, pub.radius
    shape = pooled[None] + centre_cov
    Pinv = np.linalg.inv(pooled)
    cost = r**2 * np.einsum("ij,kji->k", Pinv, shape)
    glob = ~(cost < R**2 * np.trace(Pinv))  # NaN-safe: non-finite cost -> global
    shape = np.where(glob[:, None, None], (R / r) ** 2 * np.eye(d)[None], shape)
    ctr = np.where(glob[:, None], 0.0, centre)
    top = np.linalg.eigvalsh(shape)[:, -1]
    floor = 1e-12 * np.where(np.isfinite(top) & (top > 0), top, 1.0)
    W = np.stack([eig_apply(shape[k], lambda w, f=floor[k]: 1 / np.sqrt(np.maximum(w, f)))
                  for k in range(K)])
    W_inv = np.stack([eig_apply(shape[k], lambda w, f=floor[k]: np.sqrt(np.maximum(w, f)))
                      for k in range(K)])
    return Regions(ctr, W, W_inv, W_inv @ W_inv, glob)


def allocate_pairwise(costs: np.ndarray, total: float, label_flip: bool) -> np.ndarray:
    """Per-class shares ``t_k`` of the squared sensitivity ``total``.

    Label flip changes two classes, so ``t_a + t_b <= total`` for all ``a != b``;
    minimising ``sum c_k / t_k`` gives every class ``total/2`` except possibly the costliest,
    which gets ``(total/2)(1 + x)`` and the others ``(total/2)(1 - x)``, ``x = (q-1)/(q+1)``,
    ``q = sqrt(c_max / sum of the others)`` (when q > 1). Replace-one may change one class
    by a difference of two rows, which the per-class sensitivities already double, so
    ``2 t_k <= total``: every class gets ``total / 2``.
    """
    K = costs.shape[0]
    t = np.full(K, total / 2.0)
    if not label_flip or K < 2:
        return t
    c = np.where(np.isfinite(costs) & (costs > 0), costs, 0.0)
    j = int(np.argmax(c))
    rest = c.sum() - c[j]
    if rest > 0 and c[j] > rest:
        q = np.sqrt(c[j] / rest)
        x = (q - 1.0) / (q + 1.0)
        t[:] = total / 2.0 * (1.0 - x)
        t[j] = total / 2.0 * (1.0 + x)
    return t


@dataclass(frozen=True)
class ClassNoise:
    """Noise of stage C per class: sums N(0, mean_sd^2 I), second moments symmetric Gaussian
    of scale ``cov_sd`` (``inf``: the class's second moments are not released)."""

    mean_sd: np.ndarray  # (K,)
    cov_sd: np.ndarray  # (K,)
    shares: np.ndarray  # (K,) t_k

    def sensitivity_sq(self, pub: PublicInputs) -> np.ndarray:
        """Per class: ``t_k = f r^2 / mean_sd^2 + r^4 / cov_sd^2`` with ``f`` 1 (label flip)
        or 2 (replace-one: a within-class replacement moves the sum by up to ``2r``)."""
        r = pub.region_radius
        f = 1.0 if pub.label_flip else 2.0
        cov = np.where(np.isfinite(self.cov_sd), r**4 / self.cov_sd**2, 0.0)
        return f * r**2 / self.mean_sd**2 + cov


def class_noise(pub: PublicInputs, n: np.ndarray) -> ClassNoise:
    """Stage-C noise from the released counts: shares between classes, then per class the
    split between means and second moments minimising a KL surrogate.

    Surrogate of class k (class-frame units, released n): means ``d sigma_m^2 / (2 n^2)``;
    covariances ``nu D / (4 (nu + D))`` with ``nu = sigma_c^2 d(d+1) / (2 (n-1)^2)`` the noise
    energy and ``D = prior_divergence * d`` (shrinkage toward the pooled covariance caps the
    loss at the prior divergence). Depends on public values and released counts only.
    """
    K, d = pub.n_classes, pub.n_features
    r = pub.region_radius
    f_sum = 1.0 if pub.label_flip else 2.0
    w = n / n.sum()
    # costs at unit share for the pairwise allocation (mean part dominates small classes)
    t = allocate_pairwise(w * d * f_sum * r**2 / (2 * n**2), pub.budget.classes**2,
                          pub.label_flip)
    D = pub.settings["prior_divergence"] * d
    mean_sd = np.empty(K)
    cov_sd = np.empty(K)
    for k in range(K):
        best = None
        for fm in _MEAN_SHARES:
            sm2 = f_sum * r**2 / (fm * t[k])
            cost = d * sm2 / (2 * n[k] ** 2)
            sc2 = np.inf if fm >= 1.0 else r**4 / ((1.0 - fm) * t[k])
            if np.isfinite(sc2):
                nu = sc2 * d * (d + 1) / (2 * max(n[k] - 1.0, 1.0) ** 2)
                cost += nu * D / (4 * (nu + D))
            else:
                cost += D / 4
            if best is None or cost < best[0]:
                best = (cost, sm2, sc2)
        mean_sd[k], cov_sd[k] = np.sqrt(best[1]), np.sqrt(best[2])
    return ClassNoise(mean_sd, cov_sd, t)


# ------------------------------------------------------------------------- post-processing


def _combine(m1, C1, m2, C2):
    """Precision-weighted combination of two independent estimates (batched)."""
    A1 = np.linalg.pinv(C1, hermitian=True)
    A2 = np.linalg.pinv(C2, hermitian=True)
    C = np.linalg.pinv(A1 + A2, hermitian=True)
    m = np.einsum("kij,kj->ki", C, np.einsum("kij,kj->ki", A1, m1)
                  + np.einsum("kij,kj->ki", A2, m2))
    return m, 0.5 * (C + np.swapaxes(C, -1, -2))


def released_weights(counts, N: int, K: int) -> np.ndarray:
    """Mixture weights from released counts: projected onto the simplex with every weight at
    least ``1 / (2 max(N, K))`` (a public floor below ``1 / K``, so the projection exists for
    every N and K)."""
    counts = np.nan_to_num(np.asarray(counts, dtype=float))
    return project_simplex(counts / N, floor=0.5 / max(N, K))


def estimate(pub: PublicInputs, output: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights, means and covariances (raw units) from the released values (post-processing).

    ``output`` holds the raw released arrays: ``counts``, ``sums`` (stage A), ``scatter``
    (stage B, replace-one), ``class_sums`` and ``class_scatter`` (stage C, in the class
    regions' coordinates). The design is recomputed from them exactly as :meth:`sample` did.
    """
    K, d, N = pub.n_classes, pub.n_features, pub.n_samples
    design = stage_c_design(pub, output)
    n, m1, C1, reg, noise = (design[k] for k in ("n", "m1", "C1", "regions", "noise"))
    S1 = np.asarray(output["class_sums"], dtype=float)
    S2 = np.asarray(output["class_scatter"], dtype=float)
    m2 = reg.centres + np.einsum("kji,kj->ki", reg.W_inv, S1 / n[:, None])
    C2 = (noise.mean_sd**2 / n**2)[:, None, None] * reg.shape
    means, Cm = _combine(m1, C1, m2, C2)
    if pub.label_flip:
        P = pooled_covariance(pub, n, means, Cm)
    else:
        P = pooled_covariance(pub, n, means, Cm, np.asarray(output["scatter"], dtype=float), m1)
    target = reg.W @ P[None] @ reg.W
    covs = np.empty((K, d, d))
    for k in range(K):
        T = target[k]
        tmin = float(np.linalg.eigvalsh(T)[0])
        if np.isfinite(noise.cov_sd[k]):
            dof = max(n[k] - 1.0, 1.0)
            u = S1[k] / n[k]
            Ck = (S2[k] - n[k] * np.outer(u, u)) / dof
            nu = noise.cov_sd[k] ** 2 * d * (d + 1) / (2 * dof**2)
            dist = float(np.sum((Ck - T) ** 2))
            a = min(1.0, nu / dist) if dist > 0 and np.isfinite(dist) else 1.0
            Ck = (1 - a) * Ck + a * T
        else:
            Ck = T
        floor = pub.settings["class_floor"] * (tmin if np.isfinite(tmin) and tmin > 0 else 1.0)
        Ck = eig_apply(Ck, lambda w, f=floor: np.maximum(w, f))
        covs[k] = reg.W_inv[k] @ Ck @ reg.W_inv[k]
    weights = released_weights(output["counts"], N, K)
    fr = pub.frame
    raw_means = fr.mean_to_raw(means)
    raw_covs = fr.cov_to_raw(covs)
    # positive definite by construction (floored in the class frame, mapped by congruence)
    raw_covs = 0.5 * (raw_covs + np.swapaxes(raw_covs, -1, -2))
    return weights, raw_means, raw_covs


def stage_c_design(pub: PublicInputs, output: dict) -> dict:
    """Recompute the design of stage C from the released values of stages A and B."""
    n, m1, C1 = centres(pub, output["counts"], output["sums"])
    if pub.label_flip:
        P = pooled_covariance(pub, n, m1, C1)
    else:
        P = pooled_covariance(pub, n, m1, C1, np.asarray(output["scatter"], dtype=float), m1)
    reg = regions(pub, m1, C1, P)
    return {"n": n, "m1": m1, "C1": C1, "pooled": P, "regions": reg,
            "noise": class_noise(pub, n)}


def gaussian_logpdf(x: np.ndarray, sd) -> float:
    """Sum of log N(x; 0, sd^2) over all entries (``sd`` broadcast)."""
    sd = np.broadcast_to(np.asarray(sd, dtype=float), np.shape(x))
    return float(np.sum(-0.5 * (x / sd) ** 2 - np.log(sd) - 0.5 * np.log(2 * np.pi)))
