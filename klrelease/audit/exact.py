"""Exact hockey-stick values for output components whose law is finite.

The weights of ``kl-paper`` are drawn from the smoothed mapping PMF (paper (15))

    f(. | pi(D)) = (1 - lambda) f'(. | pi(D)) + lambda / |S_N|,

with f' supported on a set T(D) of K(K-1) + 1 count vectors and the uniform floor spread over
all |S_N| = C(N-1, K-1) compositions of N into K positive parts. For a neighbour D' every
composition outside T(D) U T(D') has probability lambda / |S_N| under D and
lambda' / |S_N'| under D', so

    delta(eps) = sum_{o in T(D) U T(D')} (f_D(o) - e^eps f_D'(o))_+
               + (number of other compositions of N) * (lambda/|S_N| - e^eps lambda'/|S_N'|)_+

where the second term vanishes when N' = N and lambda' = lambda (label flips) and the uniform
part of D' is not supported on compositions of N otherwise. The probabilities of the points of
T(D) U T(D') are taken from the plans' own ``log_density``, so the figure checks the released
law, not a re-derivation of it.
"""

from __future__ import annotations

import numpy as np

from ..mechanisms import Plan
from ..mechanisms.kl_paper.objective import log_num_compositions
from ..mechanisms.kl_paper.weight_mapping import WeightMapping

__all__ = ["finite_weight_law", "exact_weights_delta"]


def finite_weight_law(plan: Plan) -> WeightMapping | None:
    """The weight-mapping PMF of a plan, if its weights are drawn from one (else None)."""
    design = getattr(plan, "design", None)
    mapping = getattr(design, "mapping", None)
    return mapping if isinstance(mapping, WeightMapping) else None


def _weights_log_pmf(plan: Plan, counts: np.ndarray, filler: dict) -> float:
    out = dict(filler)
    out["weights"] = counts
    return float(plan.log_density(out)["weights"])


def exact_weights_delta(
    plan_p: Plan, plan_q: Plan, epsilon: float, filler: dict
) -> tuple[float, float] | None:
    """Exact delta(eps) of the weights component of ``plan_p`` against ``plan_q``.

    Parameters
    ----------
    plan_p, plan_q : Plan
        Plans on D and D' whose weights follow a :class:`WeightMapping`.
    epsilon : float
    filler : dict
        A complete output of ``plan_p`` (its means and covariances are only used to call
        ``log_density``; the weights entry is replaced).

    Returns
    -------
    (delta, mismatch) or None
        ``mismatch`` is the probability under D of weights impossible under D'. None when
        either plan's weights are not a finite mapping.
    """
    law_p, law_q = finite_weight_law(plan_p), finite_weight_law(plan_q)
    if law_p is None or law_q is None:
        return None
    cands = np.unique(np.vstack([law_p.support, law_q.support]), axis=0)
    lp = np.array([_weights_log_pmf(plan_p, c, filler) for c in cands])
    lq = np.array([_weights_log_pmf(plan_q, c, filler) for c in cands])
    with np.errstate(divide="ignore"):
        p, q = np.exp(lp), np.exp(lq)
    total = float(np.sum(np.maximum(p - np.exp(epsilon) * q, 0.0)))
    mismatch = float(np.sum(p[np.isneginf(lq)]))
    if law_p.lam > 0:
        K = law_p.n_classes
        in_s = int(np.sum((cands.sum(axis=1) == law_p.total) & np.all(cands >= 1, axis=1)))
        log_s = log_num_compositions(law_p.total, K)
        # probability under D of all compositions of N outside the candidates
        rest = law_p.lam * max(0.0, 1.0 - in_s * np.exp(-log_s))
        p_each = law_p.lam * np.exp(-log_s)
        same_floor = law_q.total == law_p.total and law_q.n_classes == K
        q_each = law_q.lam * np.exp(-log_s) if same_floor else 0.0
        if p_each > 0:
            total += rest * max(0.0, 1.0 - np.exp(epsilon) * q_each / p_each)
            if q_each == 0.0:
                mismatch += rest
    return min(total, 1.0), min(mismatch, 1.0)
