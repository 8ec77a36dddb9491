"""Randomized response on class labels, and the class moments it releases unbiasedly.

Under label-flip adjacency the features are public and only the labels are private. K-ary
randomized response keeps each label with probability ``p = e^eps / (e^eps + K - 1)`` and
otherwise reports one of the other ``K - 1`` classes uniformly at random (each with
``q = 1 / (e^eps + K - 1)``); each row is randomised independently. Two datasets that differ in
one label give output distributions whose ratio is at most ``p / q = e^eps`` on every output,
so the release is pure eps-DP for label flips (Warner 1965; the label-DP form of Ghazi et al.
2021). Its ``dp_accounting`` event is ``RandomizedResponseDpEvent(K q, K)`` (with probability
``K q`` the reported label is drawn uniformly from all K classes).

The reported labels ``z`` and the public features give, for any per-row map ``f``, the
reported class sums ``C_j = sum_{z_n = j} f(x_n)``. Their expectation is ``T S`` with ``S_k``
the true class sums and ``T = (p - q) I + q 1 1^T``, whose inverse is
``(I - q 1 1^T) / (p - q)`` (as ``p + (K - 1) q = 1``), so

    S_k = (C_k - q sum_j C_j) / (p - q)

is unbiased, and the estimated class sums add up to the public total exactly. Everything
computed from ``z`` and the public features is post-processing.
"""

from __future__ import annotations

import numpy as np

__all__ = ["EPS_MAX", "response_probabilities", "respond", "response_logpmf", "debiased_sums",
           "response_dp_event", "row_variances"]


#: The largest epsilon randomized response is run at. Beyond it the chance of changing a label
#: (about (K - 1) e^-eps) is near the resolution of a double, where a sampler's rounding would
#: change the ratio it guarantees; a release at a larger epsilon is run at this one, which is
#: more private (an (EPS_MAX, 0)-DP release is (eps, 0)-DP for every eps >= EPS_MAX) and
#: changes a label with probability about 1e-13.
EPS_MAX = 30.0


def response_probabilities(epsilon: float, n_classes: int) -> tuple[float, float]:
    """``(p, q)``: the probability of keeping a label and of reporting one given other class,
    at ``min(epsilon, EPS_MAX)``."""
    K = int(n_classes)
    if K < 2:
        raise ValueError("randomized response needs at least two classes")
    t = float(np.exp(-min(float(epsilon), EPS_MAX)))  # e^-eps
    q = t / (1.0 + (K - 1) * t)
    return 1.0 - (K - 1) * q, q


def respond(codes: np.ndarray, n_classes: int, epsilon: float,
            rng: np.random.Generator) -> np.ndarray:
    """Reported labels: each code changed with probability ``(K - 1) q`` into one of the other
    classes uniformly at random (at ``min(epsilon, EPS_MAX)``)."""
    codes = np.asarray(codes, dtype=np.int64)
    K = int(n_classes)
    _, q = response_probabilities(epsilon, K)
    # the chance of a change, (K - 1) q, computed directly (not as 1 - p, which rounds to 0)
    flip = rng.random(codes.shape[0]) < (K - 1) * q
    other = (codes + rng.integers(1, K, size=codes.shape[0])) % K
    return np.where(flip, other, codes)


def response_logpmf(reported: np.ndarray, codes: np.ndarray, n_classes: int,
                    epsilon: float) -> float:
    """Log-probability of the reported labels given the true ones."""
    p, q = response_probabilities(epsilon, n_classes)
    same = np.asarray(reported) == np.asarray(codes)
    k = int(np.count_nonzero(same))
    m = same.size - k
    return float(k * np.log(p) + (m * np.log(q) if m else 0.0))


def debiased_sums(U: np.ndarray, reported: np.ndarray, n_classes: int,
                  epsilon: float) -> np.ndarray:
    """Unbiased class sums ``(K, ...)`` of the per-row values ``U`` (shape (N, ...)) from the
    reported labels: ``(C_k - q C) / (p - q)``."""
    p, q = response_probabilities(epsilon, n_classes)
    U = np.asarray(U, dtype=float)
    C = np.zeros((int(n_classes),) + U.shape[1:])
    np.add.at(C, np.asarray(reported, dtype=np.int64), U)
    return (C - q * C.sum(axis=0)) / (p - q)


def row_variances(reported: np.ndarray, n_classes: int, epsilon: float) -> np.ndarray:
    """Per row and class, the variance of the unbiased indicator ``(1[z_n = k] - q)/(p - q)``,
    estimated from the reported label (``(N, K)``): ``p (1 - p)`` for a row reported in ``k``
    (most likely its class), ``q (1 - q)`` otherwise, over ``(p - q)^2``."""
    p, q = response_probabilities(epsilon, n_classes)
    z = np.asarray(reported, dtype=np.int64)
    own = np.arange(int(n_classes))[None, :] == z[:, None]
    return np.where(own, p * (1 - p), q * (1 - q)) / (p - q) ** 2


def response_dp_event(epsilon: float, n_classes: int):
    """The ``dp_accounting`` event of K-ary randomized response at ``epsilon``."""
    import dp_accounting

    p, q = response_probabilities(epsilon, n_classes)
    return dp_accounting.RandomizedResponseDpEvent(noise_parameter=float(n_classes * q),
                                                   num_buckets=int(n_classes))


class ReportedMoments:
    """Per reported class: count, sum, scatter and the power sums that bound the noise of the
    debiased moments, of rows ``t`` in a public frame. Accumulated chunk by chunk (merge by
    addition), a function of the reported labels and the public features only."""

    __slots__ = ("counts", "sums", "scatter", "sq", "sq_sums", "quart")

    def __init__(self, counts, sums, scatter, sq, sq_sums, quart):
        self.counts, self.sums, self.scatter = counts, sums, scatter
        self.sq, self.sq_sums, self.quart = sq, sq_sums, quart

    @classmethod
    def of(cls, T: np.ndarray, reported: np.ndarray, n_classes: int) -> ReportedMoments:
        T = np.asarray(T, dtype=float)
        z = np.asarray(reported, dtype=np.int64)
        K, d = int(n_classes), T.shape[1]
        r2 = np.einsum("ij,ij->i", T, T)
        counts = np.bincount(z, minlength=K).astype(float)
        sums, scatter = np.zeros((K, d)), np.zeros((K, d, d))
        sq, sq_sums, quart = np.zeros(K), np.zeros((K, d)), np.zeros(K)
        for k in range(K):
            idx = np.flatnonzero(z == k)
            if idx.size:
                U = T[idx]
                sums[k], scatter[k] = U.sum(axis=0), U.T @ U
                sq[k] = r2[idx].sum()
                sq_sums[k] = r2[idx] @ U
                quart[k] = r2[idx] @ r2[idx]
        return cls(counts, sums, scatter, sq, sq_sums, quart)

    def __add__(self, other: ReportedMoments) -> ReportedMoments:
        return ReportedMoments(*(getattr(self, a) + getattr(other, a) for a in self.__slots__))


def debiased_moments(m: ReportedMoments, n_classes: int, epsilon: float):
    """Unbiased class counts ``(K,)``, sums ``(K, d)`` and scatters ``(K, d, d)`` from the
    reported moments, and for every class the expected squared norm of the noise of its
    second moments about ``centres`` (a function returned as ``energy(centres)``, ``(K,)``;
    ``energy(centres, power=2)``: of its sum less ``n_k c_k``), from the per-row variances of
    :func:`row_variances` (post-processing). The variances are taken at the reported labels
    in place of the true ones: an estimate that overstates the expected energy a little (by
    5-11% in the cases measured), which errs toward more shrinkage."""
    K = int(n_classes)
    p, q = response_probabilities(epsilon, K)

    def debias(C):
        # (C - q sum_j C_j) / (p - q), one class at a time (no stack of temporaries)
        C = np.asarray(C, dtype=float)
        qs = q * C.sum(axis=0)
        out = np.empty(C.shape)
        for k in range(C.shape[0]):
            o = out[k, ...]
            np.subtract(C[k, ...], qs, out=o)
            o /= p - q
        return out

    n, S1, S2 = debias(m.counts), debias(m.sums), debias(m.scatter)
    own = p * (1 - p) / (p - q) ** 2
    other = q * (1 - q) / (p - q) ** 2

    def quartic(j: int, c: np.ndarray) -> float:
        """Sum over the rows reported in ``j`` of ``||t - c||^4``."""
        cc = float(c @ c)
        return float(m.quart[j] - 4 * m.sq_sums[j] @ c + 2 * m.sq[j] * cc
                     + 4 * c @ m.scatter[j] @ c - 4 * cc * (m.sums[j] @ c)
                     + m.counts[j] * cc * cc)

    def square(j: int, c: np.ndarray) -> float:
        """Sum over the rows reported in ``j`` of ``||t - c||^2``."""
        return float(m.sq[j] - 2 * m.sums[j] @ c + m.counts[j] * (c @ c))

    def energy(centres: np.ndarray, power: int = 4) -> np.ndarray:
        # sum over rows of v_nk ||t_n - c_k||^power, split by whether the row was reported in k
        if power not in (2, 4):
            raise ValueError(f"power must be 2 or 4, not {power!r}")
        moment = quartic if power == 4 else square
        out = np.empty(K)
        for k in range(K):
            c = np.asarray(centres[k], dtype=float)
            tot = sum(moment(j, c) for j in range(K))
            mine = moment(k, c)
            out[k] = own * mine + other * (tot - mine)
        return np.maximum(out, 0.0)

    return n, S1, S2, energy
