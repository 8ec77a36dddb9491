"""Building blocks of Kamath, Sheffet, Singhal & Ullman (KSSU), with practical replacements.

Each block is a DP mechanism (or a composition of the toolbox's mechanisms) whose budget is an
argument fixed from public inputs. Blocks that run on a data-dependent subset are calibrated
to the larger of the substitution and the addition/removal sensitivity (rule S of
``KAMATH.md``). No block raises on the data: an empty subset or a failed search returns
``None`` (bottom), which is a DP output. Labels:

* [PAPER]: :func:`terrific_radius` (KSSU Alg. 2), :func:`private_pca` (Alg. 3 step 5, with the
  centring fix K7), :func:`psge` (Alg. 6, with fixes K4-K6).
* [PRACTICAL] replacements for black boxes the paper only cites: :func:`good_radius_lite`
  (for NS18 GoodRadius), :func:`good_center_lite` (for NS18 GoodCenter),
  :func:`ploc_lite` (for PGLOC), :func:`bounding_ball_lite` (for Alg. 3 step 2),
  :func:`pge_lite` (for the KLSU19 Gaussian learner PGE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...privacy.tape import released
from ...privacy.toolbox import (
    above_threshold,
    above_threshold_lazy,
    clip_rows,
    gauss_sigma,
    laplace_count,
    noisy_sum_count,
    stable_histogram,
    symmetric_gaussian,
)
from .common import progress_bar
from .radius import ball_counts, ball_counts_tree, capped_top_mean, radius_counter, use_tree

__all__ = [
    "Ball",
    "radius_grid",
    "terrific_query",
    "terrific_radius",
    "good_radius_lite",
    "good_center_lite",
    "pterrific_ball",
    "ploc_lite",
    "bounding_ball_lite",
    "private_pca",
    "psge",
    "pge_lite",
    "within",
    "clipped_scatter",
]


@dataclass(frozen=True)
class Ball:
    """A released (or public) ball."""

    centre: np.ndarray
    radius: float


def within(X: np.ndarray, centre: np.ndarray, radius: float) -> np.ndarray:
    """Boolean mask of the rows of ``X`` in the closed ball (each row decides for itself)."""
    if len(X) == 0:
        return np.zeros(0, dtype=bool)
    d2 = np.sum((X - centre) ** 2, axis=1)
    return d2 <= radius * radius


def radius_grid(lower: float, upper: float) -> np.ndarray:
    """Radii ``min(2^i L, U)``, ``i = 0..ceil(log2(U/L))`` (a public grid)."""
    T = max(0, math.ceil(math.log2(max(upper / lower, 1.0))))
    return np.minimum(lower * 2.0 ** np.arange(T + 1), max(upper, lower))


def _terrific_values(q_inside: np.ndarray, q_inside_c: np.ndarray, n: int, t: int):
    """Capped ``Q_X`` of every candidate from its counts in ``B_r`` and ``B_cr``."""
    q = np.minimum.reduce([
        np.minimum(q_inside, t),
        np.minimum(n - q_inside_c, t),
        t - np.minimum(q_inside_c - q_inside, t),
    ])
    return capped_top_mean(q.reshape(len(q_inside), -1), t)


def terrific_query(X: np.ndarray, radii: np.ndarray, c: float, t: int, *,
                   progress: bool = False) -> np.ndarray:
    """``L_X(r)`` of KSSU eq. (5) for every radius: mean of the top-t capped ``Q_X(x, r)``.

    ``Q_X(p, r) = min(#^t in B_r(p), #^t outside B_cr(p), t - #^t in the annulus)``;
    sensitivity of ``L_X`` is 2 under substitution and addition/removal (KSSU Claim 5.4).
    """
    n = len(X)
    R = len(radii)
    if n == 0:
        return np.zeros(R)
    both = np.concatenate([radii, c * radii])
    order = np.argsort(both, kind="stable")
    cnt = np.empty((n, 2 * R), dtype=np.int64)
    counter = ball_counts_tree if use_tree(X.shape[1]) else ball_counts
    cnt[:, order] = counter(X, X, both[order], progress=progress, label="terrific radius")
    return _terrific_values(cnt[:, :R], cnt[:, R:], n, t)


def radius_slack(epsilon: float, n_radii: int, beta: float) -> float:
    """``Gamma = 16 / eps (ln |radii| + ln(2 / beta))``: the AboveThreshold slack of a radius
    search over ``n_radii`` grid radii (public)."""
    return 16.0 / epsilon * (math.log(n_radii) + math.log(2.0 / beta))


def _halting_radius(X: np.ndarray, radii: np.ndarray, order: np.ndarray, value_all, value_one,
                    t: int, epsilon: float, beta: float, rng: np.random.Generator,
                    progress: bool, label: str) -> float | None:
    """AboveThreshold (threshold ``t - Gamma``, sensitivity 2) over ``radii`` in ``order``:
    the first radius whose value passes, or ``None``. Values are computed lazily
    (:func:`klrelease.privacy.toolbox.above_threshold_lazy`): all radii at once on the chunked
    path, one radius at a time (only those AboveThreshold asks for) on the KD-tree path."""
    gamma = radius_slack(epsilon, len(radii), beta)
    bar = None
    if len(X) == 0 or not use_tree(X.shape[1]):
        values = value_all() if len(X) else np.zeros(len(radii))

        def query(j):
            return values[order[j]]
    else:
        count = radius_counter(X, X)
        bar = progress_bar(progress, label, len(radii))

        def query(j):
            v = value_one(count, float(radii[order[j]]))
            if bar is not None:
                bar[0].update(bar[1], advance=1)
            return v
    try:
        i = above_threshold_lazy(query, len(radii), t - gamma, 2.0, epsilon, rng)
    finally:
        if bar is not None:
            bar[0].stop()
    return None if i is None else float(radii[order[i]])


def terrific_radius(X: np.ndarray, t: int, c: float, largest: bool, epsilon: float,
                    upper: float, lower: float, beta: float, rng: np.random.Generator, *,
                    progress: bool = False) -> float | None:
    """TerrificRadius ([PAPER] KSSU Alg. 2): AboveThreshold over the radius grid. eps-DP.

    The answers are computed lazily (:func:`klrelease.privacy.toolbox.above_threshold_lazy`):
    the same mechanism, without the work on radii after the halting one.
    """
    radii = radius_grid(lower, upper)
    order = np.arange(len(radii))[::-1] if largest else np.arange(len(radii))
    n = len(X)
    return _halting_radius(
        X, radii, order, lambda: terrific_query(X, radii, c, t, progress=progress),
        lambda count, r: float(_terrific_values(count(r), count(c * r), n, t)[0]),
        t, epsilon, beta, rng, progress, "terrific radius")


def good_radius_lite(X: np.ndarray, t: int, epsilon: float, upper: float, lower: float,
                     beta: float, rng: np.random.Generator, *,
                     progress: bool = False) -> float | None:
    """[PRACTICAL] GoodRadius: smallest grid radius whose top-t capped ball count reaches t.

    Query ``L(r)`` = mean of the t largest ``#^t{y in B_r(x)}``; sensitivity 2; eps-DP by
    AboveThreshold (answers computed lazily). Replaces NS18's recursive GoodRadius (KSSU
    Section 5.1).
    """
    radii = radius_grid(lower, upper)
    return _halting_radius(
        X, radii, np.arange(len(radii)),
        lambda: capped_top_mean(np.minimum(
            ball_counts(X, X, radii, progress=progress, label="good radius"), t), t),
        lambda count, r: float(capped_top_mean(np.minimum(count(r), t)[:, None], t)[0]),
        t, epsilon, beta, rng, progress, "good radius")


def _rotation(m: int, rng: np.random.Generator) -> np.ndarray:
    Q, R = np.linalg.qr(rng.normal(size=(m, m)))
    return Q * np.sign(np.diag(R))


def good_center_lite(X: np.ndarray, r_tilde: float, budget: dict, rho_f: float,
                     structure: np.random.Generator, rng: np.random.Generator,
                     gamma_s: float = 2.0) -> np.ndarray | None:
    """[PRACTICAL] GoodCenter: heavy cell of a random shifted grid, then two clipped means.

    StableHist on the cells of a randomly rotated and shifted grid of side ``gamma_s r_tilde``
    (structural randomness), NoisySumCount of the heavy cell around its centre, then
    NoisySumCount of the points within ``rho_f r_tilde`` of that mean. Budget keys ``hist``,
    ``stage1``, ``stage2`` each ``(eps, delta)``; basic composition. Replaces NS18 GoodCenter.
    Without ``stage2`` in the budget the stage-1 mean is returned (the caller averages next).
    """
    m = X.shape[1]
    s = gamma_s * r_tilde
    rot = _rotation(m, structure)
    u = structure.uniform(0.0, s, size=m)
    keys = np.floor((X @ rot.T + u) / s).astype(np.int64) if len(X) else np.zeros((0, m), int)
    cell, _ = stable_histogram(map(tuple, keys), *budget["hist"], rng)
    if cell is None:
        return None
    kappa = np.asarray(cell, dtype=np.float64)
    g = rot.T @ (s * (kappa + 0.5) - u)
    S1 = X[np.all(keys == np.asarray(cell), axis=1)] if len(X) else X
    rho1 = s * math.sqrt(m) / 2.0
    c1, n1 = noisy_sum_count(S1, g, rho1, *budget["stage1"], rng, zcdp=_rho(budget["stage1"]))
    if n1 < 1:
        return None
    if "stage2" not in budget:
        return c1
    rho2 = rho_f * r_tilde
    S2 = X[within(X, c1, rho2)]
    p, n2 = noisy_sum_count(S2, c1, rho2, *budget["stage2"], rng, zcdp=_rho(budget["stage2"]))
    return c1 if n2 < 1 else p


def pterrific_ball(X: np.ndarray, t: int, c: float, largest: bool, budget: dict, upper: float,
                   lower: float, beta: float, structure: np.random.Generator,
                   rng: np.random.Generator, *, progress: bool = False) -> Ball | None:
    """PTerrificBall ([PAPER] KSSU Lemma 5.7 structure, centre step [PRACTICAL]).

    TerrificRadius, GoodCenter-lite (``rho_f = 3``), then a Laplace test of query (4) at
    radius ``(1 + c/10) r_tilde`` (sensitivity 1). Budget keys ``radius`` (eps), ``hist``,
    ``stage1``, ``stage2`` (eps, delta) and ``check`` (eps).
    """
    r_t = terrific_radius(X, t, c, largest, budget["radius"], upper, lower, beta, rng,
                          progress=progress)
    if r_t is None:
        return None
    p = good_center_lite(X, r_t, budget, 3.0, structure, rng)
    if p is None:
        return None
    r_f = (1.0 + c / 10.0) * r_t
    d2 = np.sum((X - p) ** 2, axis=1) if len(X) else np.zeros(0)
    n_in = int(np.sum(d2 <= r_f * r_f))
    n_inc = int(np.sum(d2 <= (c * r_f) ** 2))
    q = min(n_in, len(X) - n_inc, t - (n_inc - n_in))
    eps = budget["check"]
    if laplace_count(q, eps, rng) >= t - math.log(1.0 / (2.0 * beta)) / eps:
        return Ball(p, r_f)
    return None


def ploc_lite(X: np.ndarray, t: int, budget: dict, upper: float, lower: float, beta: float,
              structure: np.random.Generator, rng: np.random.Generator, *,
              progress: bool = False) -> Ball | None:
    """[PRACTICAL] PLoc-lite: GoodRadius-lite then GoodCenter-lite (``rho_f = 2``).

    Replaces PGLOC (KSSU Alg. 5 / Thm 4.11). Budget keys ``radius``, ``hist``, ``stage1``,
    ``stage2``.
    """
    r_t = good_radius_lite(X, t, budget["radius"], upper, lower, beta, rng, progress=progress)
    if r_t is None:
        return None
    p = good_center_lite(X, r_t, budget, 2.0, structure, rng)
    return None if p is None else Ball(p, 2.0 * r_t)


def bounding_ball_lite(X: np.ndarray, n_target: float, ball_in: Ball, budget: dict,
                       lower: float, mult: float, rng: np.random.Generator) -> Ball:
    """[PRACTICAL] BoundingBall-lite: a small ball around most of ``X`` (KSSU Alg. 3 step 2).

    NoisySumCount around the enclosing ball's centre, then AboveThreshold over doubling radii
    of the count ``#(X in B_r(p))`` (sensitivity 1) against the released target; the radius is
    multiplied by the public ``mult`` (paper: 12; default here 3). Budget keys ``centre``
    (eps, delta) and ``radius`` (eps).
    """
    p, cnt = noisy_sum_count(X, ball_in.centre, ball_in.radius, *budget["centre"], rng,
                             zcdp=_rho(budget["centre"]))
    if cnt < 1:
        p = ball_in.centre
    radii = radius_grid(lower, 2.0 * ball_in.radius)
    d2 = np.sort(np.sum((X - p) ** 2, axis=1)) if len(X) else np.zeros(0)
    counts = np.searchsorted(d2, radii**2, side="right")
    i = above_threshold(counts, n_target, 1.0, budget["radius"], rng)
    r2 = float(radii[i]) if i is not None else 2.0 * ball_in.radius
    return Ball(np.asarray(p, dtype=np.float64), mult * r2)


def _rho(budget) -> float | None:
    """The zCDP budget of a Gaussian piece (``None`` for an (epsilon, delta) tuple)."""
    return getattr(budget, "zcdp", None)


def clipped_scatter(X: np.ndarray, centre: np.ndarray, radius: float) -> np.ndarray:
    """``Y^T Y`` with ``Y = clip(X - centre, radius)``: Frobenius sensitivity ``sqrt(2) r^2``."""
    Y = clip_rows(X, centre, radius)
    return Y.T @ Y


def private_pca(X: np.ndarray, centre: np.ndarray, radius: float, k: int, epsilon: float,
                delta: float, rng: np.random.Generator, *,
                zcdp: float | None = None) -> np.ndarray:
    """Private PCA ([PAPER] KSSU Alg. 3 step 5, [FIX] K7: centred and explicitly clipped).

    ``Y = clip(X - centre, radius)``, release ``Y^T Y + E`` with symmetric Gaussian ``E``
    calibrated to Frobenius sensitivity ``sqrt(2) radius^2`` ((eps, delta), or rho = ``zcdp``);
    returns the top-``k`` eigenvectors as columns (post-processing).
    """
    m = X.shape[1]
    M = clipped_scatter(X, centre, radius)
    sigma = gauss_sigma(math.sqrt(2.0) * radius**2, epsilon, delta, zcdp=zcdp)
    noisy = released("private PCA scatter", M + symmetric_gaussian(m, sigma, rng),
                     centre=centre, radius=radius, epsilon=epsilon, delta=delta, sigma=sigma)
    _, vecs = np.linalg.eigh(noisy)
    return vecs[:, ::-1][:, :k]


def psge(X: np.ndarray, ball: Ball, epsilon: float, delta: float, sigma_floor: float,
         rng: np.random.Generator, *,
         zcdp: float | None = None) -> tuple[np.ndarray, float, float]:
    """Private spherical Gaussian estimator ([PAPER] KSSU Alg. 6 with fixes K4, K5, K6(a)).

    Thirds of epsilon: the count ``|X'| + Lap(3/eps)``; the mean as the centre plus the noisy
    centred sum (Gaussian, L2 sensitivity ``2r``, all of delta); the variance around the
    released mean with ``||x - mu|| <= 2r`` clipped and ``Lap(12 r^2 / eps)`` (sensitivity
    ``4 r^2``). With ``zcdp = rho`` the thirds are of rho: the two Laplace pieces at
    ``eps = sqrt(2 rho / 3)``, the mean at ``sigma = 2r / sqrt(2 rho / 3)``.
    Returns ``(mean, variance, noisy count)``.
    """
    c, r = ball.centre, ball.radius
    ell = c.shape[0]
    Xp = X[within(X, c, r)]
    if zcdp is not None:
        epsilon = 3.0 * math.sqrt(2.0 * zcdp / 3.0)  # each third: eps^2/2 = rho/3
    m_x = laplace_count(len(Xp), epsilon / 3.0, rng)
    s_mu = gauss_sigma(2.0 * r, epsilon / 3.0, delta,
                       zcdp=None if zcdp is None else zcdp / 3.0)
    total = (Xp - c).sum(axis=0) if len(Xp) else np.zeros(ell)
    mu = released("PSGE mean", c + (total + rng.normal(0.0, s_mu, size=ell)) / max(m_x, 1.0),
                  centre=c, radius=r, epsilon=epsilon / 3.0, delta=delta, sigma=s_mu)
    dev = Xp - mu
    sq = np.minimum(np.sum(dev * dev, axis=1), 4.0 * r * r) if len(Xp) else np.zeros(0)
    var = released("PSGE variance", (float(sq.sum()) + float(
        rng.laplace(0.0, 12.0 * r * r / epsilon))) / (max(m_x, 1.0) * ell),
        radius=r, epsilon=epsilon / 3.0, scale=12.0 * r * r / epsilon)
    return mu, max(var, sigma_floor**2), m_x


def _psd_clip(S: np.ndarray, lo: float, hi: float) -> np.ndarray:
    S = 0.5 * (S + S.T)
    w, V = np.linalg.eigh(S)
    return (V * np.clip(w, lo, hi)) @ V.T


def pge_lite(C: np.ndarray, ball: Ball, epsilon: float, delta: float, rounds: int,
             beta: float, lambda_floor: float, lambda_cap: float,
             rng: np.random.Generator, *,
             zcdp: float | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """[PRACTICAL] PGE-lite: clipped noisy mean and covariance in a released ball.

    Replaces the KLSU19 learner PGE (KSSU Thm 5.19-5.20). Per round: NoisySumCount (0.4 of
    the round's epsilon, half its delta), then the covariance of the points clipped to
    ``r_S`` around that mean plus symmetric Gaussian noise (Frobenius sensitivity
    ``sqrt(2) r_S^2``; 0.6 of epsilon, half of delta), ``r_S = 2r`` in round 1 and the released
    re-centred radius in round 2. With two rounds (1/3 then 2/3 of the
    budget) the second re-centres at the first mean with a radius computed from released
    values only (CoinPress style). Eigenvalues are clipped to ``[lambda_floor, lambda_cap]``
    (post-processing). With ``zcdp = rho`` the same shares split rho instead of
    (epsilon, delta) and every Gaussian has ``sigma = Delta / sqrt(2 rho_i)``.
    Returns ``(mean, covariance, noisy count)``.
    """
    d = C.shape[1]
    shares = (1.0,) if rounds == 1 else (1.0 / 3.0, 2.0 / 3.0)
    centre, r = ball.centre, ball.radius
    mu, cnt, Sigma = centre, 0.0, np.eye(d) * lambda_floor
    for j, share in enumerate(shares):
        e, dl = epsilon * share, delta * share
        z_mu, z_cov = (None, None) if zcdp is None else (0.4 * share * zcdp, 0.6 * share * zcdp)
        sigma_mu = gauss_sigma(2.0 * r, 0.4 * e, 0.5 * dl, zcdp=z_mu)
        mu, cnt = noisy_sum_count(C, centre, r, 0.4 * e, 0.5 * dl, rng, zcdp=z_mu)
        r_s = 2.0 * r if j == 0 else r  # round 2: r already contains the points around mu
        M = clipped_scatter(C, mu, r_s)
        sig = gauss_sigma(math.sqrt(2.0) * r_s**2, 0.6 * e, 0.5 * dl, zcdp=z_cov)
        Sigma = released("PGE-lite scatter", (M + symmetric_gaussian(d, sig, rng))
                         / max(cnt, 1.0), centre=mu, radius=r_s, epsilon=0.6 * e,
                         delta=0.5 * dl, sigma=sig)
        Sigma = _psd_clip(Sigma, lambda_floor, lambda_cap)
        if j + 1 < len(shares):
            n_eff = max(cnt, 1.0)
            lam = float(np.linalg.eigvalsh(Sigma)[-1])
            e1 = sigma_mu * (math.sqrt(d) + math.sqrt(2 * math.log(1 / beta))) / n_eff
            r2 = math.sqrt(lam) * (math.sqrt(d) + math.sqrt(2 * math.log(max(n_eff, 2) / beta)))
            centre, r = mu, min(r2 + e1, r)
    return np.asarray(mu, dtype=np.float64), Sigma, cnt
