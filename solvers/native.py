"""Native solver: a primal-dual interior-point method on the smooth concave dual.

In canonical form (see :mod:`solvers.canonical`) the problem is
``min tr(H) s.t. H >= u_n u_n^T``. Its Lagrangian with multipliers ``w_n >= 0`` for the
constraints ``u_n^T H^{-1} u_n <= 1`` is minimised over ``H`` at ``H = M(w)^{1/2}``, with
``M(w) = sum_n w_n u_n u_n^T``, which gives the dual problem

.. math::

    \\max_{w \\ge 0} \\; \\phi(w) = 2 \\operatorname{tr} M(w)^{1/2} - \\mathbf 1^\\top w .

Maximising over the scale of ``w = t p`` (``p`` on the simplex) gives the equivalent form
``max_p h(p)^2`` with ``h(p) = tr M(p)^{1/2}``, the smooth concave dual of the mean-noise SDP
(in the original coordinates ``h = tr((A^{1/2} M A^{1/2})^{1/2})``). Strong duality holds
(``H = I`` scaled up is strictly feasible).

Certificate. For any ``w > 0`` with ``M(w)`` nonsingular write ``T = tr M^{1/2}``,
``S = 1^T w`` and ``g_n = u_n^T M^{-1/2} u_n``. Then ``T^2 / S`` is a lower bound on the
optimum (weak duality at the best scaling of ``w``), and ``H = rho (T / S) M^{1/2}`` with
``rho = S max_n g_n / T >= 1`` is feasible with objective ``rho T^2 / S``. The relative
duality gap is therefore exactly ``rho - 1``: the solver stops when it is below ``tol`` and
returns that feasible ``H``.

Derivatives. With ``M = Q diag(s^2) Q^T`` and ``B = U Q``: the gradient of
``f = -phi`` is ``1 - g`` and its Hessian is

.. math::

    \\nabla^2 f_{nm} = \\sum_{i, j} \\frac{B_{ni} B_{nj} B_{mi} B_{mj}}{s_i s_j (s_i + s_j)},

(the Frechet derivative of ``X -> X^{-1/2}`` in the eigenbasis), positive semidefinite as a
sum of rank-one terms with positive weights. Each Newton step costs ``O(m^2 r^2 + m^3)`` for
``m`` working rows in dimension ``r``; no cvxpy is involved.
"""

from __future__ import annotations

import functools
import time

import numpy as np
from scipy.linalg.lapack import dpotrf, dpotrs

from .problem import SolverFailed

__all__ = ["NativeSolution", "closed_form_1d", "dual_ipm", "MAX_ITER"]

NAME = "native"

#: Newton iterations allowed by default. On rows whose canonical coordinates span many
#: decades the iteration converges only linearly (breast cancer's 20 raw features under the
#: objective tr(G): singular values of the working rows 3.5 to 1.5e-6, the gap shrinking by
#: about 3% per iteration, certified after 231 iterations in 0.3 s); a solve that stops
#: progressing is cut short by the stall test long before this cap.
MAX_ITER = 1000


class NativeSolution:
    """Result of a native solve on a working set (canonical coordinates)."""

    __slots__ = ("H", "w", "lower_bound", "gap", "iterations")

    def __init__(self, H, w, lower_bound, gap, iterations):
        self.H = H
        self.w = w
        self.lower_bound = lower_bound
        self.gap = gap
        self.iterations = iterations


def closed_form_1d(U: np.ndarray) -> NativeSolution:
    """Exact solution for ``r = 1``: ``H = max_n u_n^2`` (a scalar constraint ``H >= u^2``)."""
    u2 = U[:, 0] ** 2
    h = float(u2.max()) if u2.size else 0.0
    w = np.zeros(U.shape[0])
    if u2.size:
        w[int(np.argmax(u2))] = h  # dual: phi(w) = 2 sqrt(w u^2) - w is maximal at w = u^2
    return NativeSolution(np.array([[h]]), w, h, 0.0, 0)


def _spectral(U: np.ndarray, w: np.ndarray):
    """Eigen-data of ``M(w)``: ``(s, B, g, T, Q)`` with ``M = Q diag(s^2) Q^T``, ``B = U Q``,
    ``g_n = u_n^T M^{-1/2} u_n`` and ``T = tr M^{1/2}``; ``None`` if ``M`` is singular.

    ``s`` are the singular values of ``diag(sqrt(w)) U``, computed directly rather than as
    square roots of the eigenvalues of ``M``: the small ones keep their accuracy (relative
    error about ``eps s_max / s_min`` instead of ``eps (s_max / s_min)^2``), which is what lets
    the certificate reach small gaps for strongly anisotropic rows.
    """
    _, s, Vt = np.linalg.svd(U * np.sqrt(w)[:, None], full_matrices=False)
    if s.shape[0] < U.shape[1] or not s[-1] > 1e-150 or s[-1] <= 1e-13 * s[0]:
        return None
    Q = Vt.T
    B = U @ Q
    g = (B * B) @ (1.0 / s)
    return s, B, g, float(s.sum()), Q


@functools.lru_cache(maxsize=64)
def _pairs(r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pairs ``i <= j`` of ``r`` indices (``np.triu_indices`` order) and their multiplicity
    in a symmetric sum (1 on the diagonal, 2 off it)."""
    iu = np.triu_indices(r)
    return iu[0], iu[1], np.where(iu[0] == iu[1], 1.0, 2.0)


def _hessian(B: np.ndarray, s: np.ndarray) -> np.ndarray:
    i, j, mult = _pairs(B.shape[1])
    Gam = 1.0 / (np.outer(s, s) * (s[:, None] + s[None, :]))
    weights = Gam[i, j] * mult
    C = B[:, i] * B[:, j]  # (m, r(r+1)/2): products B_ni B_nj, i <= j
    return (C * weights) @ C.T


def _cho_factor(K: np.ndarray):
    """The upper Cholesky factor of ``K`` (LAPACK ``potrf``, as ``scipy.linalg.cho_factor``
    computes it, without its checks)."""
    c, info = dpotrf(K, lower=False, overwrite_a=False, clean=False)
    if info != 0:
        raise np.linalg.LinAlgError("the matrix is not positive definite")
    return c


def dual_ipm(
    U: np.ndarray,
    *,
    tol: float = 1e-7,
    max_iter: int = MAX_ITER,
    w0: np.ndarray | None = None,
    deadline: float | None = None,
    accept_tol: float | None = None,
) -> NativeSolution:
    """Solve ``min tr(H) s.t. H >= u_n u_n^T`` by a primal-dual interior-point method on the dual.

    Minimises ``f(w) = 1^T w - 2 tr M(w)^{1/2}`` over ``w >= 0`` with dual slacks ``z``
    (``z = grad f = 1 - g`` at the optimum: the primal slacks ``1 - u^T H^{-1} u``). Newton
    steps on the perturbed KKT system ``grad f - z = 0, w z = sigma mu`` with a
    fraction-to-the-boundary rule and a backtracking line search on the KKT residual.

    Parameters
    ----------
    U : ndarray of shape (m, r)
        Working rows in canonical coordinates; they must span ``R^r``.
    tol : float
        Target relative duality gap (see the module docstring for the certificate).
    max_iter : int
        Maximum number of Newton iterations.
    w0 : ndarray of shape (m,), optional
        Starting multipliers (positive); a scaled uniform vector by default.
    deadline : float, optional
        ``time.perf_counter()`` value after which the solve fails with status
        ``"time limit"``.
    accept_tol : float, optional
        When the iteration stops short of ``tol`` (it stalls at the limits of floating point
        on very ill-conditioned rows), the best certified point is still returned if its gap
        is at most ``accept_tol`` (default: ``tol``).

    Returns
    -------
    NativeSolution
        ``H`` feasible for every row of ``U``, the multipliers ``w``, the lower bound
        ``T^2 / S`` and the certified relative gap.

    Raises
    ------
    SolverFailed
        When the gap is not certified within ``max_iter`` iterations or the deadline.
    """
    m, r = U.shape
    if r == 1:
        return closed_form_1d(U)
    # Scale-aware start: the best multiple of the uniform vector.
    ones = np.ones(m)
    if w0 is None:
        sv = np.linalg.svd(U, compute_uv=False)
        if sv.shape[0] < r or not sv[-1] > 1e-13 * sv[0]:
            raise SolverFailed(NAME, "singular working set", "working rows do not span R^r")
        T1 = float(sv.sum())  # tr (U^T U)^{1/2}
        w = ones * (T1 / m) ** 2
    else:
        w = np.asarray(w0, dtype=float).copy()
    spec = _spectral(U, w)
    if spec is None:
        raise SolverFailed(NAME, "singular working set", "working rows do not span R^r")
    s, B, g, T, Q = spec
    z = np.maximum(1.0 - g, 0.0) + 0.1
    best = None
    best_at = {}
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 - reported after the loop
        S = float(w.sum())
        rho = S * float(g.max()) / T
        gap = rho - 1.0
        if best is None or gap < best[0]:
            best = (gap, w.copy(), s.copy(), Q.copy(), T, S, rho)
        best_at[it] = best[0]
        if gap <= tol:
            break
        if it > 60 and gap > 0.9 * best_at[it - 30]:
            break  # stalled: the polish below takes over
        if deadline is not None and time.perf_counter() > deadline:
            raise SolverFailed(NAME, "time limit", "the time limit was reached")
        mu = float(w @ z) / m
        grad = 1.0 - g
        Hs = _hessian(B, s)
        rd = grad - z
        # Predictor (affine) and corrector with Mehrotra's centring heuristic.
        K = Hs
        K[np.diag_indices(m)] += z / w
        try:
            cf = _cho_factor(K)
        except np.linalg.LinAlgError:
            K[np.diag_indices(m)] += 1e-12 * np.abs(np.diag(K)).max()
            cf = _cho_factor(K)

        dw_a, dz_a = _direction(cf, grad, w, z, np.zeros(m))
        a_w = min(1.0, _max_step(w, dw_a))
        a_z = min(1.0, _max_step(z, dz_a))
        mu_aff = float((w + a_w * dw_a) @ (z + a_z * dz_a)) / m
        sigma = min(1.0, max((mu_aff / mu) ** 3, 1e-3))
        target = sigma * mu
        res0 = _residual(rd, w, z, target)
        accepted = False
        # Mehrotra's corrected direction first; the plain Newton direction (a descent direction
        # of the residual norm) if the corrected one does not decrease it.
        for correction in (dw_a * dz_a, 0.0):
            dw, dz = _direction(cf, grad, w, z, target - correction)
            alpha = min(1.0, 0.995 * _max_step(w, dw), 0.995 * _max_step(z, dz))
            for _ in range(40):
                w_new = w + alpha * dw
                z_new = z + alpha * dz
                spec_new = _spectral(U, w_new)
                if spec_new is not None:
                    rd_new = 1.0 - spec_new[2] - z_new
                    if _residual(rd_new, w_new, z_new, target) <= (1 - 1e-4 * alpha) * res0:
                        accepted = True
                        break
                alpha *= 0.5
            if accepted:
                break
        if not accepted:
            break
        w, z = w_new, z_new
        s, B, g, T, Q = spec_new
    gap, w, s, Q, T, S, rho = best
    if not gap <= tol:
        polished = _polish(U, w, z, tol, deadline)
        if polished is not None and polished[0] < gap:
            gap, w, s, Q, T, S, rho = polished
    limit = tol if accept_tol is None else max(tol, accept_tol)
    if not gap <= limit:
        raise SolverFailed(
            NAME,
            "not converged",
            f"relative duality gap {gap:.2e} above tolerance {limit:.1e} after {it} iterations",
        )
    H = (Q * (rho * (T / S) * s)) @ Q.T  # rho (T/S) M^{1/2}
    H = 0.5 * (H + H.T)
    return NativeSolution(H, w, T * T / S, gap, it)


def _polish(U, w, z, tol, deadline, max_iter=50):
    """Newton's method on the optimality conditions restricted to the estimated support.

    When the optimal multipliers span many orders of magnitude (strongly anisotropic rows),
    the central path needs ``mu`` below the smallest active multiplier and the interior-point
    iteration stalls. On the estimated support ``S`` (the rows with the largest ``w_n / z_n``)
    the conditions are the square system ``g_n(w) = 1, n in S``; it is solved with steps
    ``w <- w exp(dw / w)`` (Newton in ``log w``, so tiny multipliers move at their own scale),
    dropping rows whose multiplier vanishes. The result is certified like any other point.
    """
    ratio = w / z
    idx = np.flatnonzero(ratio > 1e-6 * ratio.max())
    if idx.shape[0] < U.shape[1]:
        idx = np.argsort(-ratio)[: U.shape[1]]
    wS = w[idx].copy()
    best = None
    for _ in range(max_iter):
        if deadline is not None and time.perf_counter() > deadline:
            break
        spec = _spectral(U[idx], wS)
        if spec is None:
            break
        s, B, gS, T, Q = spec
        g_all = _spectral_scores(U, s, Q)
        S = float(wS.sum())
        rho = S * float(g_all.max()) / T
        if best is None or rho - 1.0 < best[0]:
            w_full = np.zeros(U.shape[0])
            w_full[idx] = wS
            best = (rho - 1.0, w_full, s.copy(), Q.copy(), T, S, rho)
        if rho - 1.0 <= tol:
            break
        Hs = _hessian(B, s)
        Hs[np.diag_indices_from(Hs)] += 1e-14 * np.abs(np.diag(Hs)).max()
        try:
            dw = np.linalg.solve(Hs, gS - 1.0)
        except np.linalg.LinAlgError:
            break
        dtheta = np.clip(dw / wS, -5.0, 5.0)
        res0 = float(np.abs(gS - 1.0).max())
        step = 1.0
        for _ in range(30):
            w_try = wS * np.exp(step * dtheta)
            spec_try = _spectral(U[idx], w_try)
            if spec_try is not None and float(np.abs(spec_try[2] - 1.0).max()) < res0:
                break
            step *= 0.5
        else:
            break
        wS = w_try
        keep = wS > 1e-14 * wS.max()
        if not keep.all() and keep.sum() >= U.shape[1]:
            idx, wS = idx[keep], wS[keep]
    return best


def _spectral_scores(U, s, Q):
    """``u_n^T M^{-1/2} u_n`` for all rows of ``U`` given ``M = Q diag(s^2) Q^T``."""
    B = U @ Q
    return (B * B) @ (1.0 / s)


def _direction(cf, grad, w, z, target):
    """Newton step of ``grad f - z = 0, w z = target``: ``(H + Z/W) dw = -grad + target / w``,
    ``dz = (target - w z - z dw) / w``."""
    dw, info = dpotrs(cf, -grad + target / w, lower=False)
    if info != 0:
        raise ValueError(f"illegal value in argument {-info} of potrs")
    dz = (target - w * z - z * dw) / w
    return dw, dz


def _max_step(x: np.ndarray, dx: np.ndarray) -> float:
    """``min(-x / dx)`` over the entries with ``dx < 0`` (``inf`` when there is none)."""
    q = np.divide(x, dx, out=np.full(x.shape, -np.inf), where=dx < 0)
    return -float(q.max())


def _residual(rd, w, z, target) -> float:
    rc = w * z - target
    return float(np.sqrt(rd @ rd + rc @ rc))
