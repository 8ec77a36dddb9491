"""The Wishart scale update (22).

With the other variables fixed, gamma_k minimises d ln gamma + (d+1) tr(Sigma_k^{-1}) / gamma
(the objective (21) as printed swaps the roles; this is the form that (12) gives) under the
privacy cap gamma_k <= 2 N_k (eps - eps_0 - eps_k) / 3 of (9):

    gamma_k = min{ (d+1)/d tr(Sigma_k^{-1}),  2 N_k (eps - eps_0 - eps_k) / 3 }.

The interior optimum exists only because (12) replaces ln|Sigma + W| by ln|W|; the exact KL
decreases monotonically in gamma, so whenever the first term is the smaller one this adds more
Wishart noise than the budget requires. It is kept because it is what the paper specifies.
"""

from __future__ import annotations

import numpy as np

__all__ = ["wishart_scale", "wishart_cost"]


def wishart_scale(
    d: int, trace_inv_sigma: np.ndarray, counts: np.ndarray, budget: np.ndarray
) -> np.ndarray:
    """gamma_k of (22); ``budget`` is eps - eps_0 - eps_k (per class, > 0)."""
    return np.minimum((d + 1) / d * trace_inv_sigma, 2.0 * counts * budget / 3.0)


def wishart_cost(gamma: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The privacy cost 3 gamma_k / (2 N_k) that (9) charges for the Wishart step."""
    return 3.0 * gamma / (2.0 * counts)
