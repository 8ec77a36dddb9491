"""The two generic frameworks: PPE (Arbas, Ashtiani & Liaw 2023, Alg. 1) and PPME (Ashtiani &
Liaw 2022, Alg. 1), over any non-private learner, distance and masking mechanism.

Both split the rows into ``t`` disjoint blocks of ``s = floor(N / t)`` rows (after a uniformly
random permutation drawn from the mechanism's generator, independent of the data; the
``N - t s`` left-over rows are dropped), run the learner on each block with a fresh seed drawn
from the same generator, and count for every block the blocks within the closeness threshold
(``q_i``). The mean count ``Q`` is tested with truncated Laplace noise of sensitivity ``2 / t``:
``Q + Z < 0.8 + A`` returns FAIL. Otherwise PPE releases the mask of the first block with
``5 count_i > 3 t`` (``q_i > 0.6``); PPME releases the mask of the weighted average of the
block outputs with weights ``min(1, 10 max(0, q_i - 0.6))``. Nothing else leaves these
functions in a released result: ``Q``, the ``q_i``, the chosen block and the block outputs stay
inside :class:`PopulousOutcome` fields marked private (``_private``), for tests on synthetic
data only. There is no retry.

Privacy (``PPE.md``, section "Frameworks"). PPE: with a z-approximate r-restricted triangle
inequality, threshold ``gamma / (2 z)`` with ``gamma <= r`` and a (gamma, eps, delta)-masking
mechanism, ``t >= 5`` blocks: (2 eps, 4 e^eps delta)-DP under replacement of one record.
PPME: threshold ``r / z``, a ``(400 (r + phi) / t)``-masking mechanism and ``t >= 140``:
(2 eps, 4 e^eps delta)-DP. The FAIL outcome is part of the output and is covered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..._threads import single_threaded_blas
from .tlap import sample_tlap, tlap_bound

__all__ = ["PopulousOutcome", "split_budget", "ppe", "ppme", "run_blocks"]


def split_budget(epsilon_total: float, delta_total: float) -> tuple[float, float]:
    """Per-primitive (eps, delta) so that one PPE/PPME call is (eps_total, delta_total)-DP."""
    eps = epsilon_total / 2.0
    return eps, delta_total / (4.0 * np.exp(eps))


@dataclass
class PopulousOutcome:
    """The result of one PPE/PPME call: the masked output, or FAIL.

    ``public`` holds only numbers fixed before the data is read (t, s, thresholds). Fields whose
    names start with ``_private`` are data-dependent and are never released.
    """

    passed: bool
    output: Any
    public: dict = field(default_factory=dict)
    _private_Q: float | None = None
    _private_counts: np.ndarray | None = None
    _private_outputs: list | None = None
    _private_index: int | None = None


def run_blocks(X: np.ndarray, learner: Callable, t: int, rng: np.random.Generator,
               progress: Callable | None = None) -> list:
    """Learner outputs on ``t`` disjoint blocks of a data-independent random permutation."""
    N = X.shape[0]
    s = N // t
    perm = rng.permutation(N)
    seeds = np.random.SeedSequence(int(rng.integers(2**63))).spawn(t)
    out = []
    with single_threaded_blas():  # many tiny fits: threaded BLAS only adds synchronisation
        for i in range(t):
            out.append(learner(X[perm[i * s:(i + 1) * s]], seeds[i]))
            if progress is not None:
                progress(1)
    return out


def _test(C: np.ndarray, epsilon: float, delta: float, rng: np.random.Generator):
    t = C.shape[0]
    counts = C.sum(axis=1)
    Q = counts.sum() / float(t * t)
    z, A = sample_tlap(2.0 / t, epsilon, delta, rng)
    # Q + Z >= 0.8 + A with |Z| <= A implies Q >= 0.8; the integer check only guards the
    # floating-point rounding of that implication (it never changes the exact mechanism)
    passed = bool(Q + z >= 0.8 + A) and 5 * int(counts.sum()) >= 4 * t * t
    return counts, Q, passed, A


def _public(t: int, s: int, epsilon: float, delta: float, tau: float) -> dict:
    A = tlap_bound(2.0 / t, epsilon, delta)
    return {"blocks": t, "block_size": s, "epsilon": epsilon, "delta": delta,
            "closeness_threshold": tau, "tlap_bound": A, "pass_threshold": 0.8 + A}


def ppe(X: np.ndarray, learner: Callable, distance, mask: Callable, *, epsilon: float,
        delta: float, radius: float, t: int, rng: np.random.Generator,
        outputs: list | None = None, progress: Callable | None = None) -> PopulousOutcome:
    """Private Populous Estimator.

    Parameters
    ----------
    X : ndarray of shape (N, d)
    learner : callable
        ``learner(block_rows, seed_sequence) -> Y`` (non-private, stateless across blocks).
    distance : object
        ``z``, ``r_tri`` and ``close_matrix(outputs, tau) -> bool (t, t)``.
    mask : callable
        ``mask(Y, rng) -> released Y``; must be (radius, eps, delta)-masking.
    epsilon, delta : float
        Per-primitive budget (the call is (2 eps, 4 e^eps delta)-DP).
    radius : float
        The masking radius gamma (``<= distance.r_tri``); threshold ``gamma / (2 z)``.
    t : int
        Number of blocks (``>= 5``).
    outputs : list, optional
        Precomputed block outputs (a simulator); then ``X`` is ignored.
    """
    if t < 5:
        raise ValueError("PPE needs t >= 5 blocks")
    if not 0 < radius <= distance.r_tri:
        raise ValueError("the masking radius must lie in (0, r_tri]")
    tau = radius / (2.0 * distance.z)
    s = X.shape[0] // t if outputs is None else None
    Ys = outputs if outputs is not None else run_blocks(X, learner, t, rng, progress)
    C = distance.close_matrix(Ys, tau, progress=progress)
    counts, Q, passed, _ = _test(C, epsilon, delta, rng)
    pub = _public(t, s, epsilon, delta, tau)
    if not passed:
        return PopulousOutcome(False, None, pub, Q, counts, Ys)
    j = int(np.flatnonzero(5 * counts > 3 * t)[0])  # exists: Q >= 0.8 whenever the test passes
    return PopulousOutcome(True, mask(Ys[j], rng), pub, Q, counts, Ys, j)


def ppme(X: np.ndarray, learner: Callable, distance, mask: Callable, *, epsilon: float,
         delta: float, r: float, t: int, rng: np.random.Generator,
         outputs: list | None = None, progress: Callable | None = None) -> PopulousOutcome:
    """Private Populous Mean Estimator.

    ``mask`` must be ``(400 (r + phi) / t, eps, delta)``-masking; ``distance`` also provides
    ``phi`` and ``average(outputs, weights)``. Threshold ``r / z``; ``t >= 140``.
    """
    if t < 140:
        raise ValueError("PPME needs t >= 140 blocks")
    if not 0 < r <= distance.r_tri:
        raise ValueError("r must lie in (0, r_tri]")
    tau = r / distance.z
    s = X.shape[0] // t if outputs is None else None
    Ys = outputs if outputs is not None else run_blocks(X, learner, t, rng, progress)
    C = distance.close_matrix(Ys, tau, progress=progress)
    counts, Q, passed, _ = _test(C, epsilon, delta, rng)
    pub = _public(t, s, epsilon, delta, tau)
    pub["masking_radius"] = 400.0 * (r + distance.phi) / t
    if not passed:
        return PopulousOutcome(False, None, pub, Q, counts, Ys)
    q = counts / t
    w = np.minimum(1.0, 10.0 * np.maximum(0.0, q - 0.6))
    keep = np.flatnonzero(w > 0)  # W >= t/3 > 0 whenever the test passes
    mu = distance.average([Ys[i] for i in keep], w[keep])
    return PopulousOutcome(True, mask(mu, rng), pub, Q, counts, Ys)
