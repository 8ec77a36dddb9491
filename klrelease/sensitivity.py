"""Global sensitivities of the class statistics (weights, means, unbiased covariances).

Every bound here is a function of public quantities only: the number of records N, the number
of classes K, a public lower bound ``n`` on every class size, and the *spread* of the public
domain the rows are clipped to, i.e. ``D = sup ||x - x'||`` over two admissible rows (the
diameter, in the norm named by the function). For a box ``lower <= x <= upper`` with ranges
``r = upper - lower``: ``D_1 = sum r``, ``D_2 = ||r||_2``; for the ball ``||x||_2 <= B``:
``D_2 = 2B``, ``D_1 = 2B sqrt(d)``; for an L1 ball of radius R around a centre, ``D_1 = 2R``.

Notation for one class with n rows before the change: mean mu, unbiased covariance Sigma,
``w = x - mu`` for the row x that leaves or joins. Two facts bound everything:

(a) A mean lies in the convex hull of admissible rows, so ``||x - mu|| <= D`` for any
    admissible x, and ``||x - mu|| <= (n - 1) D / n`` when x is one of the n rows
    (``x - mu = (n-1)/n (x - mean of the others)``).
(b) ``tr Sigma = (1/(n-1)) sum_j ||x_j - mu||_2^2 = (1/(2n(n-1))) sum_{i,j} ||x_i - x_j||_2^2
    <= D_2^2 / 2``; and entrywise ``||Sigma||_1 <= (1/(n-1)) sum_j ||x_j - mu||_1^2
    <= (n-1) D_1^2 / n`` by (a).

Exact changes (closed forms, checked by brute force in the tests):

* row x leaves the class (removal): ``mu - mu' = w/(n-1)``;
  ``Sigma - Sigma' = (n/(n-1) w w^T - Sigma) / (n-2)``;
* row x joins the class (addition): ``mu - mu' = -w/(n+1)``;
  ``Sigma - Sigma' = Sigma/n - w w^T/(n+1)``.

Both covariance differences are differences of two positive semidefinite matrices A - B, so
``||A - B||_F <= sqrt(||A||_F^2 + ||B||_F^2)`` (as ``tr(AB) >= 0``) and
``||A - B||_1 <= ||A||_1 + ||B||_1``; with ``||w w^T||_F = ||w||_2^2``,
``||w w^T||_1 = ||w||_1^2`` and ``||Sigma||_F <= tr Sigma`` this gives the per-class bounds
below. All of them decrease in n, so a bound over every class of size at least ``n_min`` is the
bound at ``n = n_min``. Covariance noise is drawn on the upper triangle (diagonal included) and
mirrored; the norm of the upper-triangle vector is at most the norm of the full matrix, so the
full-matrix bounds are safe for it.

Neighbouring relations:

* label flip (features fixed): one row leaves class k and joins class k' != k. The two changes
  add: L1 bounds add, L2 bounds add in quadrature (the blocks of the two classes are
  disjoint coordinates).
* replace one record (N fixed, rows clipped to the public domain): either a label flip with a
  new feature vector (same bounds, since (a) only needs x to be admissible) or, within one
  class, a removal followed by an addition to the class of n-1 remaining rows (triangle
  inequality). The sensitivity is the larger of the two cases.

The functions taking ``n_min`` need ``n_min >= 3`` (a class keeps two rows after a removal, so
its unbiased covariance stays defined).
"""

from __future__ import annotations

import math

__all__ = [
    "weights_sensitivity",
    "mean_removal_bound",
    "mean_addition_bound",
    "covariance_removal_bound",
    "covariance_addition_bound",
    "means_sensitivity",
    "covariances_sensitivity",
    "covariance_trace_bound",
    "wu_sensitivities",
    "NORMS",
    "ADJACENCIES",
]

#: Norms the bounds are given in: entrywise L1, and L2 (Frobenius for matrices).
NORMS = ("l1", "l2")
#: Neighbouring relations the joint bounds cover.
ADJACENCIES = ("label-flip", "replace-one")


def _check_norm(norm: str) -> None:
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {norm!r}")


def _check_adjacency(adjacency: str) -> None:
    if adjacency not in ADJACENCIES:
        raise ValueError(f"adjacency must be one of {', '.join(ADJACENCIES)}, got {adjacency!r}")


def _check_n_min(n_min: int) -> None:
    if int(n_min) != n_min or n_min < 3:
        raise ValueError(f"the lower bound on class sizes must be an integer >= 3, got {n_min!r}")


def weights_sensitivity(n_samples: int, norm: str = "l2") -> float:
    """Exact sensitivity of the weight vector ``pi = counts / N`` to one label change.

    Two entries move by ``1/N`` in opposite directions: ``2/N`` in L1, ``sqrt(2)/N`` in L2.
    (Replacing one record changes the counts the same way, or not at all.)
    """
    _check_norm(norm)
    if n_samples < 1:
        raise ValueError("n_samples must be >= 1")
    return (2.0 if norm == "l1" else math.sqrt(2.0)) / n_samples


def mean_removal_bound(n: int, spread: float) -> float:
    """Bound on ``||mu - mu'||`` when one of the n rows leaves the class: ``D/n``.

    ``mu - mu' = (x - mu)/(n - 1)`` and ``||x - mu|| <= (n-1) D / n`` by fact (a). Attained
    when the other n-1 rows sit at distance D from x. Holds in any norm with its own spread.
    """
    return spread / n


def mean_addition_bound(n: int, spread: float) -> float:
    """Bound on ``||mu - mu'||`` when a row joins a class of n rows: ``D/(n+1)``.

    ``mu - mu' = (mu - x)/(n + 1)`` and ``||x - mu|| <= D`` by fact (a). Attained when the n
    rows sit at distance D from x.
    """
    return spread / (n + 1)


def covariance_trace_bound(spread_l2: float) -> float:
    """Bound on ``tr Sigma`` (hence on every eigenvalue) of an unbiased class covariance.

    ``tr Sigma <= D_2^2 / 2`` (fact (b)); public, so usable as a ceiling when projecting.
    """
    return spread_l2**2 / 2.0


def covariance_removal_bound(n: int, spread: float, norm: str = "l2") -> float:
    """Bound on ``||Sigma - Sigma'||`` when one of the n rows leaves the class (needs n >= 3).

    ``Sigma - Sigma' = (A - Sigma)/(n - 2)`` with ``A = n/(n-1) w w^T``, and
    ``||A|| <= n/(n-1) ((n-1)/n)^2 D^2 = (n-1) D^2 / n`` by (a). Then

    * Frobenius: ``sqrt(((n-1)/n)^2 + 1/4) D_2^2 / (n-2)`` (``||Sigma||_F <= D_2^2/2``);
    * entrywise L1: ``2 (n-1) D_1^2 / (n (n-2))`` (``||Sigma||_1 <= (n-1) D_1^2 / n``).
    """
    _check_norm(norm)
    if n < 3:
        raise ValueError("a removal needs a class of at least 3 rows")
    if norm == "l2":
        return math.sqrt(((n - 1) / n) ** 2 + 0.25) * spread**2 / (n - 2)
    return 2.0 * (n - 1) * spread**2 / (n * (n - 2))


def covariance_addition_bound(n: int, spread: float, norm: str = "l2") -> float:
    """Bound on ``||Sigma - Sigma'||`` when a row joins a class of n rows (n >= 2).

    ``Sigma - Sigma' = Sigma/n - w w^T/(n+1)`` with ``||w|| <= D``. Then

    * Frobenius: ``D_2^2 sqrt(1/(2n)^2 + 1/(n+1)^2)``;
    * entrywise L1: ``D_1^2 ((n-1)/n^2 + 1/(n+1))``.
    """
    _check_norm(norm)
    if n < 2:
        raise ValueError("an addition needs a class of at least 2 rows")
    if norm == "l2":
        return spread**2 * math.sqrt(1.0 / (2 * n) ** 2 + 1.0 / (n + 1) ** 2)
    return spread**2 * ((n - 1) / n**2 + 1.0 / (n + 1))


def _combine(a: float, b: float, norm: str) -> float:
    return a + b if norm == "l1" else math.hypot(a, b)


def means_sensitivity(
    n_min: int, spread: float, norm: str = "l2", adjacency: str = "label-flip"
) -> float:
    """Sensitivity of the stacked class means (all K blocks jointly).

    Label flip: one class loses a row and another gains it, so the bound is
    ``D/n + D/(n+1)`` (L1) or ``D sqrt(1/n^2 + 1/(n+1)^2)`` (L2) at ``n = n_min``. This is
    exact: it is attained by a dataset whose two classes have ``n_min`` rows, all at distance
    D from the flipped row except the row itself. Replace one record adds the within-class
    case ``||x - x'||/n <= D/n``, which is smaller.
    """
    _check_norm(norm)
    _check_adjacency(adjacency)
    _check_n_min(n_min)
    return _combine(mean_removal_bound(n_min, spread), mean_addition_bound(n_min, spread), norm)


def covariances_sensitivity(
    n_min: int, spread: float, norm: str = "l2", adjacency: str = "label-flip"
) -> float:
    """Sensitivity of the stacked class covariances (all K blocks jointly); a safe bound.

    Label flip: removal from one class and addition to another, combined as L1 sum or L2
    root-sum-square, at ``n = n_min``. Replace one record: the larger of that and the
    within-class replacement, bounded by ``removal(n_min) + addition(n_min - 1)``.
    """
    _check_norm(norm)
    _check_adjacency(adjacency)
    _check_n_min(n_min)
    rem = covariance_removal_bound(n_min, spread, norm)
    flip = _combine(rem, covariance_addition_bound(n_min, spread, norm), norm)
    if adjacency == "label-flip":
        return flip
    return max(flip, rem + covariance_addition_bound(n_min - 1, spread, norm))


def wu_sensitivities(
    n_samples: int, n_classes: int, radius_l1: float
) -> tuple[float, float, float]:
    """The L1 sensitivities of Wu et al. (2016) for one EM iteration, as published.

    ``S(pi) = K/N``, ``S(mu_k) = 4 R K / N``, ``S(Sigma_k) = (12 N K R^2 + 8 K^2 R^2) / N^2``
    with ``||x - c||_1 <= R`` around a public centre c. They were derived for record-level
    neighbours and the biased EM covariance under the assumption that every component holds at
    least ``N/(2K)`` points; they are not a proven bound for label flips and the unbiased
    covariance (the per-class covariance bound of this module is larger).

    Returns
    -------
    (S_pi, S_mu_k, S_Sigma_k) : tuple of float
        Per-class values for the means and covariances.
    """
    N, K, R = n_samples, n_classes, radius_l1
    return K / N, 4.0 * R * K / N, (12.0 * N * K * R**2 + 8.0 * K**2 * R**2) / N**2
