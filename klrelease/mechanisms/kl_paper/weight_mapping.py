"""The weight-mapping PMF of Proposition 2, (25)-(27), and its smoothing (15).

Support T(D) = {pi(D)} U S'(D) (S'(D) the weights one neighbour away, (14)). Proposition 2
gives the column of F' for the input pi(D):

    F'_{i,j*} = 1 / (1 + |S'| e^{eps_0})   if g_i >= 0
              = 1 / (1 + |S'| e^{-eps_0})  otherwise                               (26)

The paper derives it under row sums F' 1 = 1, but its own definition makes a *column* the
conditional PMF f'(. | pi(D)); the printed column sums to (|S'| + 1) / (1 + |S'| e^{eps_0}),
not 1 (0.73 for K = 5, eps_0 = 1/3). This implementation uses (26) and normalises the column,
which keeps the ratios between entries that (27) prescribes but makes f' a distribution.

The released PMF is f = (1 - lambda) f' + lambda / |S| (15); sampling its uniform part draws a
uniform composition of N into K positive parts (stars and bars), never enumerating S.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

from ...sampling import uniform_composition
from .objective import log_num_compositions

__all__ = ["mapping_column", "mapping_matrix", "WeightMapping"]


def mapping_column(g: np.ndarray, eps0: float, n_neighbours: int) -> tuple[np.ndarray, float]:
    """The column (26) for the input pi(D), normalised; also returns the printed column sum.

    Parameters
    ----------
    g : (m,) values g_i of the support points (row 0 is pi(D) itself).
    eps0 : the weights' budget eps_0 of (25).
    n_neighbours : |S'(D)|.
    """
    g = np.asarray(g, dtype=float)
    # in log space: 1 / (1 + n e^{+-eps0}) neither overflows nor vanishes for large eps0
    log_n = np.log(n_neighbours)
    log_high = -np.logaddexp(0.0, log_n + eps0)
    log_low = -np.logaddexp(0.0, log_n - eps0)
    log_col = np.where(g >= 0, log_high, log_low)
    log_total = float(logsumexp(log_col))
    return np.exp(log_col - log_total), float(np.exp(log_total))


def mapping_matrix(g: np.ndarray, eps0: float, n_neighbours: int) -> np.ndarray:
    """The matrix F' on T(D): column 0 (the input pi(D)) normalised, the others by (27).

    Column j != j* is e^{eps_0} F'_{., j*} where g_i >= 0 and e^{-eps_0} F'_{., j*} elsewhere, so
    the ratio constraints (17) hold with equality. Those columns are what (27) prescribes
    relative to the released column; they do not sum to one, and they are not the designs the
    mechanism would compute on the neighbouring datasets (which centre on pi(D')).
    """
    col, _ = mapping_column(g, eps0, n_neighbours)
    factor = np.where(np.asarray(g) >= 0, np.exp(eps0), np.exp(-eps0))
    F = np.tile((col * factor)[:, None], (1, col.shape[0]))
    F[:, 0] = col
    return F


@dataclass(frozen=True)
class WeightMapping:
    """The smoothed mapping PMF f(. | pi(D)) over count vectors.

    Attributes
    ----------
    support : (m, K) int count vectors of T(D) (row 0 is the input's counts).
    probs : (m,) f' on the support (sums to one).
    lam : smoothing weight lambda in [0, 1).
    total : N, the number of records the uniform part spreads over.
    """

    support: np.ndarray
    probs: np.ndarray
    lam: float
    total: int

    @property
    def n_classes(self) -> int:
        return self.support.shape[1]

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """Draw released counts: uniform composition w.p. lambda, else from f'."""
        if self.lam > 0 and rng.random() < self.lam:
            return uniform_composition(rng, self.total, self.n_classes)
        i = rng.choice(self.probs.shape[0], p=self.probs)
        return self.support[i].copy()

    def log_pmf(self, counts: np.ndarray) -> float:
        """ln f(counts | pi(D)), exact (including the lambda / |S| floor)."""
        counts = np.asarray(counts, dtype=np.int64)
        hit = np.all(self.support == counts, axis=1)
        p_main = float(self.probs[hit].sum())
        log_main = np.log((1.0 - self.lam) * p_main) if p_main > 0 else -np.inf
        log_unif = -np.inf
        if self.lam > 0 and counts.sum() == self.total and np.all(counts >= 1):
            log_unif = np.log(self.lam) - log_num_compositions(self.total, self.n_classes)
        return float(np.logaddexp(log_main, log_unif))

    def log_pmf_many(self, counts: np.ndarray) -> np.ndarray:
        """:meth:`log_pmf` of every row of ``counts`` (shape (n, K)), vectorised."""
        counts = np.asarray(counts, dtype=np.int64)
        hit = np.all(counts[:, None, :] == self.support[None, :, :], axis=2)  # (n, m)
        p_main = hit.astype(float) @ self.probs
        with np.errstate(divide="ignore"):
            log_main = np.log((1.0 - self.lam) * p_main)
        log_unif = np.full(counts.shape[0], -np.inf)
        if self.lam > 0:
            ok = (counts.sum(axis=1) == self.total) & np.all(counts >= 1, axis=1)
            log_unif[ok] = np.log(self.lam) - log_num_compositions(self.total, self.n_classes)
        return np.logaddexp(log_main, log_unif)
