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
           "response_dp_event", "row_variances", "prior_sets", "respond_with_prior",
           "prior_response_logpmf", "prior_response_weights"]


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


# Randomized response with a prior (Ghazi et al. 2021, "Deep learning with label differential
# privacy", RRWithPrior). Every row has a public prior over the K classes; the row reports
# within the set of its k most likely classes, the k that maximises the chance of reporting
# the true label when it is drawn from the prior, ``a_k * (mass of the top k)`` with
# ``a_k = e^eps / (e^eps + k - 1)``. A label inside the set is kept with probability ``a_k``
# and otherwise replaced by one of the set's other k - 1 classes uniformly (k-ary randomized
# response within the set); a label outside it is replaced by a class of the set uniformly.
# Every output has probability ``a_k``, ``b_k = 1 / (e^eps + k - 1)`` or ``1 / k`` under any
# label, and the ratio of any two of these is at most e^eps (``a_k / b_k = e^eps``,
# ``a_k k <= e^eps`` and ``1 / (k b_k) <= e^eps`` as ``k <= e^eps + k - 1``): pure eps-DP for
# the row's label whatever its prior, as long as the prior does not depend on that label.


def prior_sets(prior: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """``(order, k)``: every row's classes from most to least likely under ``prior`` (N, K)
    (ties broken by class index) and the size of its reporting set (at ``min(eps,
    EPS_MAX)``); a row with a non-finite or negative entry is taken as uniform (all K
    classes). ``prior`` must not depend on the row's own label."""
    P = np.array(prior, dtype=float)
    N, K = P.shape
    bad = ~np.all(np.isfinite(P) & (P >= 0), axis=1)
    P[bad] = 1.0 / K  # a row whose prior is not a distribution reports like plain K-ary
    order = np.argsort(-P, axis=1, kind="stable")
    mass = np.cumsum(np.take_along_axis(P, order, axis=1), axis=1)
    keep = np.array([1.0] + [response_probabilities(epsilon, k)[0] for k in range(2, K + 1)])
    score = np.where(np.isfinite(mass), mass, 0.0) * keep[None, :]
    return order, np.argmax(score, axis=1) + 1


def _ranks(codes: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Each row's rank of its code in ``order`` (0 = the prior's most likely class)."""
    return np.argmax(order == np.asarray(codes, dtype=np.int64)[:, None], axis=1)


def respond_with_prior(codes: np.ndarray, order: np.ndarray, k: np.ndarray, epsilon: float,
                       rng: np.random.Generator) -> np.ndarray:
    """Reported labels of randomized response with a prior (``order`` and ``k`` from
    :func:`prior_sets`): within each row's set k-ary :func:`respond` on the label's rank,
    a uniform class of the set for a label outside it."""
    codes = np.asarray(codes, dtype=np.int64)
    k = np.asarray(k, dtype=np.int64)
    rank = _ranks(codes, order)
    out_rank = np.zeros(codes.shape[0], dtype=np.int64)
    for size in np.unique(k):
        rows = np.flatnonzero(k == size)
        if size == 1:
            continue  # the set is the prior's top class: it is reported whatever the label
        inside = rank[rows] < size
        # both draws for every row of the group, so the randomness used (and its time)
        # does not depend on how many labels lie in their sets
        kept = respond(np.where(inside, rank[rows], 0), int(size), epsilon, rng)
        uniform = rng.integers(0, size, size=rows.size)
        out_rank[rows] = np.where(inside, kept, uniform)
    return np.take_along_axis(order, out_rank[:, None], axis=1)[:, 0]


def prior_response_logpmf(reported: np.ndarray, codes: np.ndarray, order: np.ndarray,
                          k: np.ndarray, epsilon: float) -> float:
    """Log-probability of the reported labels given the true ones, the orders and set sizes
    (``-inf`` if a label was reported outside its set)."""
    reported = np.asarray(reported, dtype=np.int64)
    k = np.asarray(k, dtype=np.int64)
    rank_z, rank_y = _ranks(reported, order), _ranks(codes, order)
    if np.any(rank_z >= k):
        return float("-inf")
    total = 0.0
    for size in np.unique(k):
        rows = k == size
        if size == 1:
            continue
        p, q = response_probabilities(epsilon, int(size))
        inside = rows & (rank_y < size)
        same = inside & (rank_z == rank_y)
        total += (np.count_nonzero(same) * np.log(p)
                  + np.count_nonzero(inside & ~same) * np.log(q)
                  + np.count_nonzero(rows & ~inside) * -np.log(size))
    return float(total)


def prior_response_weights(reported: np.ndarray, order: np.ndarray, k: np.ndarray,
                           epsilon: float, n_classes: int) -> np.ndarray:
    """Per row and class (N, K), the indicator of the class debiased within the row's set:
    ``(1[z = c] - b_k) / (a_k - b_k)`` for c in the set, 0 outside; 1 on the reported class
    where ``k = 1``. Unbiased for ``1[y = c]`` when the label lies in its set; every row's
    weights add up to 1 (post-processing)."""
    reported = np.asarray(reported, dtype=np.int64)
    k = np.asarray(k, dtype=np.int64)
    N, K = reported.shape[0], int(n_classes)
    rank_of = np.empty_like(order)
    np.put_along_axis(rank_of, order, np.broadcast_to(np.arange(K), (N, K)), axis=1)
    a = np.ones(N)
    b = np.zeros(N)
    for size in np.unique(k):
        if size > 1:
            a[k == size], b[k == size] = response_probabilities(epsilon, int(size))
    hit = np.arange(K)[None, :] == reported[:, None]
    return np.where(rank_of < k[:, None], (hit - b[:, None]) / (a - b)[:, None], 0.0)
