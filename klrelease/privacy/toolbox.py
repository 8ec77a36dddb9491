"""Differential-privacy primitives shared by the unlabelled-data learners.

Every function here takes its noise from the ``rng`` it is given (the release's CSPRNG for an
unseeded run) and never raises on the data: empty inputs give the mechanism's "no output"
(``None``), which is itself a DP output. Budgets, thresholds and sensitivities are arguments
fixed from public inputs by the caller. Privacy statements and proof sketches are in
``toolbox.md`` beside this module; in short, with neighbours differing in one record (a
substitution, or, for a mechanism run on a data-dependent subset, an addition or removal):

* :func:`laplace_count` -- a count plus ``Lap(1/eps)``: eps-DP (sensitivity 1).
* :func:`above_threshold` -- AboveThreshold (sparse vector, Dwork & Roth Alg. 1 / Thm 3.23):
  eps-DP for any number of queries of sensitivity ``Delta``.
* :func:`exponential_mechanism` -- eps-DP over a finite, data-independent set (Gumbel-max).
* :func:`stable_histogram` -- stability-based histogram over an unbounded set of cells, one
  cell per record: (eps, delta)-DP.
* :func:`stable_select` -- one record contributes a set of at most Q keys; selection by a
  noisy stability test and the exponential mechanism on the keys present:
  (eps_a + eps_b, (1 + e^{eps_a + eps_b}) delta_TV)-DP.
* :func:`noisy_sum_count` -- clipped sum with the count folded into one Gaussian vector,
  L2 sensitivity ``2 rho``: (eps, delta)-DP with the analytic calibration.
* :func:`symmetric_gaussian` -- symmetric matrix noise for a Frobenius-sensitivity statistic.

Every output passes through :func:`klrelease.privacy.tape.released` (the identity outside a
release tape): a test replays a learner's released values on a neighbouring dataset and checks
that its control flow depends on them only.

Floating-point caveat: Laplace and Gaussian noise are drawn as IEEE doubles (idealised real
arithmetic, Mironov 2012), as everywhere else in the library.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence

import numpy as np

from .calibration import analytic_gaussian_sigma
from .tape import released

__all__ = [
    "gauss_sigma",
    "laplace_count",
    "above_threshold",
    "above_threshold_lazy",
    "above_threshold_gamma",
    "exponential_mechanism",
    "stable_histogram_threshold",
    "stable_histogram",
    "stable_select_threshold",
    "stable_select",
    "clipped_sum_count",
    "noisy_sum_count",
    "clip_rows",
    "symmetric_gaussian",
    "advanced_composition_epsilon",
]


def gauss_sigma(sensitivity: float, epsilon: float, delta: float, *,
                zcdp: float | None = None) -> float:
    """Gaussian-mechanism sigma for L2 sensitivity ``Delta``.

    (eps, delta): the analytic calibration (Balle & Wang 2018; the library's calibration).
    With ``zcdp = rho``: ``sigma = Delta / sqrt(2 rho)``, which is rho-zCDP (Bun & Steinke 2016,
    Prop. 1.6); epsilon and delta are then not used.
    """
    if zcdp is not None:
        if not zcdp > 0:
            raise ValueError("a zCDP budget must be > 0")
        return float(sensitivity) / math.sqrt(2.0 * zcdp)
    return analytic_gaussian_sigma(epsilon, delta, sensitivity)


def laplace_count(count: float, epsilon: float, rng: np.random.Generator,
                  sensitivity: float = 1.0) -> float:
    """``count + Lap(sensitivity / epsilon)``: epsilon-DP."""
    return released("laplace count",
                    float(count) + float(rng.laplace(0.0, sensitivity / epsilon)),
                    epsilon=epsilon, sensitivity=sensitivity)


def above_threshold(values: Sequence[float], threshold: float, sensitivity: float,
                    epsilon: float, rng: np.random.Generator) -> int | None:
    """AboveThreshold: index of the first query whose noisy value reaches the noisy threshold.

    ``values`` are the query answers in the (public) query order; each query has sensitivity
    at most ``sensitivity`` under the neighbouring relation. Threshold noise
    ``Lap(2 Delta/eps)``, query noise ``Lap(4 Delta/eps)``; epsilon-DP whatever the number of
    queries. Returns ``None`` (bottom) when no query passes. Answers after the halting index
    are never looked at, so computing all answers beforehand releases nothing more.
    """
    values = list(values)
    return above_threshold_lazy(values.__getitem__, len(values), threshold, sensitivity,
                                epsilon, rng)


def above_threshold_lazy(query, n_queries: int, threshold: float, sensitivity: float,
                         epsilon: float, rng: np.random.Generator) -> int | None:
    """:func:`above_threshold` with the answers computed on demand: ``query(i)`` is called
    for ``i = 0, 1, ...`` up to the halting index only.

    The same mechanism (same noise draws in the same order, same output) as computing every
    answer first; it only saves the work of the answers AboveThreshold never looks at.
    """
    public = {"threshold": threshold, "sensitivity": sensitivity, "epsilon": epsilon,
              "n_queries": int(n_queries)}
    tau_hat = float(threshold) + float(rng.laplace(0.0, 2.0 * sensitivity / epsilon))
    for i in range(int(n_queries)):
        if float(query(i)) + float(rng.laplace(0.0, 4.0 * sensitivity / epsilon)) >= tau_hat:
            return released("above threshold", i, **public)
    return released("above threshold", None, **public)


def above_threshold_gamma(n_queries: int, sensitivity: float, epsilon: float,
                          beta: float) -> float:
    """Accuracy slack ``8 Delta (ln q + ln(2/beta)) / eps`` of AboveThreshold (utility only)."""
    q = max(int(n_queries), 1)
    return 8.0 * sensitivity * (math.log(q) + math.log(2.0 / beta)) / epsilon


def exponential_mechanism(scores: Sequence[float], sensitivity: float, epsilon: float,
                          rng: np.random.Generator) -> int:
    """Index drawn with probability proportional to ``exp(eps * score / (2 Delta))``.

    The candidate set (the positions of ``scores``) must be finite and data-independent.
    Implemented with the Gumbel-max trick. epsilon-DP.
    """
    s = np.asarray(scores, dtype=np.float64)
    return released("exponential mechanism", _gumbel_argmax(s, sensitivity, epsilon, rng),
                    sensitivity=sensitivity, epsilon=epsilon, n_candidates=len(s))


def _gumbel_argmax(s: np.ndarray, sensitivity: float, epsilon: float,
                   rng: np.random.Generator) -> int:
    g = rng.gumbel(size=s.shape)
    return int(np.argmax(epsilon * s / (2.0 * sensitivity) + g))


def stable_histogram_threshold(epsilon: float, delta: float) -> float:
    """Release threshold ``1 + (2/eps) ln(2/delta)`` of :func:`stable_histogram`."""
    return 1.0 + 2.0 / epsilon * math.log(2.0 / delta)


def stable_histogram(keys: Iterable[Hashable], epsilon: float, delta: float,
                     rng: np.random.Generator) -> tuple[Hashable | None, float | None]:
    """Stability-based histogram; returns the released cell with the largest noisy count.

    ``keys`` gives one cell per record (a data-independent function of the record). Every
    non-empty cell gets ``Lap(2/eps)`` noise; cells whose noisy count reaches
    ``1 + (2/eps) ln(2/delta)`` are released and the arg-max among them is returned with its
    noisy count (post-processing). ``(None, None)`` when no cell passes. (eps, delta)-DP.
    """
    out = _stable_histogram(Counter(keys), epsilon, delta, rng)
    return released("stable histogram", out, epsilon=epsilon, delta=delta)


def _stable_histogram(counts: Counter, epsilon: float, delta: float,
                      rng: np.random.Generator) -> tuple[Hashable | None, float | None]:
    if not counts:
        return None, None
    tau = stable_histogram_threshold(epsilon, delta)
    cells = list(counts)
    noisy = np.array([counts[c] for c in cells], dtype=np.float64) + rng.laplace(
        0.0, 2.0 / epsilon, size=len(cells))
    best = int(np.argmax(noisy))
    if noisy[best] < tau:
        return None, None
    return cells[best], float(noisy[best])


def stable_select_threshold(epsilon_a: float, epsilon_b: float, delta_tv: float,
                            max_keys: int) -> float:
    """Stability threshold ``1 + ln(Q/delta_TV) / min(eps_a, eps_b/2)`` of stable_select."""
    return 1.0 + math.log(max_keys / delta_tv) / min(epsilon_a, epsilon_b / 2.0)


def stable_select(key_sets: Sequence[Iterable[Hashable]], epsilon_a: float, epsilon_b: float,
                  delta_tv: float, max_keys: int, rng: np.random.Generator
                  ) -> tuple[Hashable | None, dict]:
    """Select a key that many records vote for, over an unbounded key universe.

    Each record contributes a set of keys (deduplicated; more than ``max_keys`` = Q are
    truncated deterministically, keeping the first Q in that record's own order). Score of a
    key = number of records containing it. The maximum score plus ``Lap(1/eps_a)`` must reach
    the threshold of :func:`stable_select_threshold`; then a key present is drawn by the
    exponential mechanism with ``exp(eps_b * score / 2)``.
    (eps_a + eps_b, (1 + e^{eps_a + eps_b}) delta_TV)-DP when one record's key set is replaced,
    added or removed (proof in ``toolbox.md``). Returns ``(key or None, public info)``.
    """
    scores: Counter = Counter()
    for ks in key_sets:
        seen: list = []
        for key in ks:
            if key not in seen:
                seen.append(key)
            if len(seen) == max_keys:
                break
        scores.update(seen)
    tau = stable_select_threshold(epsilon_a, epsilon_b, delta_tv, max_keys)
    public = {"epsilon_a": epsilon_a, "epsilon_b": epsilon_b, "delta_tv": delta_tv,
              "max_keys": max_keys}
    info = {"threshold": tau}
    opt = max(scores.values()) if scores else 0
    noisy_opt = opt + float(rng.laplace(0.0, 1.0 / epsilon_a))
    info["noisy_max_score"] = noisy_opt
    if not scores or noisy_opt < tau:
        return released("stable select", (None, info), **public)
    keys = list(scores)
    s = np.array([scores[k] for k in keys], dtype=np.float64)
    idx = _gumbel_argmax(s, 1.0, epsilon_b, rng)
    return released("stable select", (keys[idx], info), **public)


def clip_rows(Y: np.ndarray, centre: np.ndarray, rho: float) -> np.ndarray:
    """``(y - centre) * min(1, rho / ||y - centre||)`` for every row (explicit clipping)."""
    centre = np.asarray(centre, dtype=np.float64)
    diff = np.asarray(Y, dtype=np.float64).reshape(-1, centre.shape[0]) - centre
    if len(diff) == 0:
        return diff
    norms = np.sqrt(np.sum(diff * diff, axis=1))
    return diff * np.minimum(1.0, rho / np.maximum(norms, 1e-300))[:, None]


def clipped_sum_count(Y: np.ndarray, centre: np.ndarray, rho: float) -> np.ndarray:
    """The statistic of :func:`noisy_sum_count`: ``(sum of clipped rows, rho * |Y|)``.

    L2 sensitivity ``2 rho`` under substitution, ``sqrt(2) rho`` under addition/removal.
    """
    C = clip_rows(Y, centre, rho)
    return np.concatenate([C.sum(axis=0), [rho * len(C)]])


def noisy_sum_count(Y: np.ndarray, centre: np.ndarray, rho: float, epsilon: float,
                    delta: float, rng: np.random.Generator, *,
                    zcdp: float | None = None) -> tuple[np.ndarray, float]:
    """Clipped noisy mean with its count folded into the same Gaussian vector.

    Rows are centred at the (public or released) ``centre``, clipped to norm ``rho``, summed,
    and released together with ``rho * |Y|`` plus ``N(0, sigma^2 I)``, ``sigma`` calibrated to
    L2 sensitivity ``2 rho`` (substitution; addition/removal moves it by ``sqrt(2) rho``):
    (eps, delta)-DP, or ``zcdp``-zCDP when that budget is given.
    Returns ``(mean, noisy count)``; the mean divides by ``max(count, 1)``.
    """
    centre = np.asarray(centre, dtype=np.float64)
    m = centre.shape[0]
    sigma = gauss_sigma(2.0 * rho, epsilon, delta, zcdp=zcdp)
    v = clipped_sum_count(Y, centre, rho) + rng.normal(0.0, sigma, size=m + 1)
    cnt = float(v[m] / rho)
    return released("noisy sum and count", (centre + v[:m] / max(cnt, 1.0), cnt),
                    centre=centre, rho=rho, epsilon=epsilon, delta=delta, sigma=sigma)


def symmetric_gaussian(m: int, sigma: float, rng: np.random.Generator, *,
                       isometric: bool = False) -> np.ndarray:
    """Symmetric ``m x m`` matrix with i.i.d. ``N(0, sigma^2)`` entries on and above the diagonal.

    Adding it to a symmetric statistic of Frobenius sensitivity ``Delta_F`` is the Gaussian
    mechanism on the upper triangle, whose L2 sensitivity is at most ``Delta_F``.
    With ``isometric=True`` the entries above the diagonal have variance ``sigma^2 / 2``: in the
    coordinates ``(E_ii, sqrt(2) E_ij)``, ``i < j``, the noise is ``N(0, sigma^2 I)``, so a
    change ``D`` of the statistic has whitened norm exactly ``||D||_F / sigma`` (the same
    guarantee with half the off-diagonal variance).
    """
    E = rng.normal(0.0, sigma, size=(m, m))
    U = np.triu(E)
    if isometric:
        U = np.diag(np.diag(U)) + np.triu(U, 1) / math.sqrt(2.0)
    return U + np.triu(U, 1).T


def advanced_composition_epsilon(epsilon_total: float, n_mechanisms: int,
                                 delta_prime: float) -> float:
    """Largest per-mechanism eps_0 whose T-fold advanced composition stays within eps_total.

    Solves ``eps_0 sqrt(2 T ln(1/delta')) + T eps_0 (e^{eps_0} - 1) = eps_total`` (Dwork,
    Rothblum & Vadhan 2010) by bisection.
    """
    T = int(n_mechanisms)
    c = math.sqrt(2.0 * T * math.log(1.0 / delta_prime))

    def total(e0):
        return e0 * c + T * e0 * math.expm1(e0)

    lo, hi = 0.0, epsilon_total
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if total(mid) <= epsilon_total:
            lo = mid
        else:
            hi = mid
    return lo
