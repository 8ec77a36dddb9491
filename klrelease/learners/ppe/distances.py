"""The semimetrics of PPE and PPME, all computed from one Cholesky factorisation per matrix.

For ``Sigma_1 = L_1 L_1^T`` let ``M = L_1^{-1} Sigma_2 L_1^{-T}`` (orthogonally similar to
``Sigma_1^{-1/2} Sigma_2 Sigma_1^{-1/2}``) and ``lam = eigvalsh(M)``. Then (``PPE.md``, section
"Distances")

* spectral:  ``max_i max(|lam_i - 1|, |1/lam_i - 1|)``            (z = 3/2, r_tri = 1, phi = 1)
* COV:       ``max(||lam - 1||_2, ||1/lam - 1||_2)``               (Frobenius)
* MEAN:      ``max(||L_1^{-1}(mu_1 - mu_2)||, ||L_2^{-1}(mu_1 - mu_2)||)``
* COMP:      ``max(|w_1 - w_2|, MEAN, COV)``                       (z = 3/2, r_tri = 1)
* PARAM:     ``min_pi max_i COMP(F_pi(i), F'_i)`` (K components; the threshold test
  ``PARAM <= tau`` is a perfect matching in the bipartite graph of close component pairs)
* aligned PARAM (labelled components): ``max_i COMP(F_i, F'_i)``
* l2 on vectors (z = 1), and the 0/inf distance on integers (equal or not).

An output whose covariance is not positive definite (Cholesky fails, or it is not finite) is
INVALID: its distance to everything, itself included, is +inf. Every decision is a
deterministic function of the block outputs (the privacy proofs need nothing else).

The ``close_matrix`` methods evaluate the whole t x t closeness graph with vectorised numpy:
block pairs ``i < j`` are processed one row at a time, with exact early exit (a component
pair is close only if its weights, then its means, then its covariances are close), and the
graph is mirrored so that it is exactly symmetric.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching
from scipy.spatial.distance import pdist, squareform

__all__ = [
    "Params",
    "factorise",
    "spectral_distance",
    "cov_distance",
    "mean_distance",
    "comp_distance",
    "param_distance",
    "ParamDistance",
    "SpectralDistance",
    "L2Distance",
    "DiscreteDistance",
]


@dataclass(frozen=True)
class Params:
    """A block output: K components ``(w, mu, Sigma)``; ``valid`` False marks INVALID."""

    weights: np.ndarray  # (K,)
    means: np.ndarray  # (K, d)
    covariances: np.ndarray  # (K, d, d)
    valid: bool = True

    @classmethod
    def invalid(cls, K: int, d: int) -> Params:
        nan = np.full
        return cls(nan(K, np.nan), nan((K, d), np.nan), nan((K, d, d), np.nan), False)


def factorise(S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse Cholesky factors of a stack of matrices and which of them are PD.

    Returns ``(Linv, ok)`` with ``Linv[..., :, :] = L^{-1}`` where ``S = L L^T``; entries that
    are not finite or not positive definite get ``ok = False`` (and an identity placeholder).
    """
    S = np.asarray(S, dtype=float)
    flat = S.reshape((-1,) + S.shape[-2:])
    d = flat.shape[-1]
    ok = np.all(np.isfinite(flat), axis=(1, 2))
    Linv = np.broadcast_to(np.eye(d), flat.shape).copy()
    idx = np.flatnonzero(ok)
    if idx.size:
        try:
            L = np.linalg.cholesky(flat[idx])
            Linv[idx] = np.linalg.inv(L)
        except np.linalg.LinAlgError:
            for i in idx:
                try:
                    Linv[i] = np.linalg.inv(np.linalg.cholesky(flat[i]))
                except np.linalg.LinAlgError:
                    ok[i] = False
    ok &= np.all(np.isfinite(Linv), axis=(1, 2))
    return Linv.reshape(S.shape), ok.reshape(S.shape[:-2])


def _gen_eigs(Linv1: np.ndarray, S2: np.ndarray) -> np.ndarray:
    M = Linv1 @ S2 @ np.swapaxes(Linv1, -1, -2)
    M = 0.5 * (M + np.swapaxes(M, -1, -2))
    return np.linalg.eigvalsh(M)


def _cov_from_eigs(lam: np.ndarray, kind: str) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / lam
        if kind == "spectral":
            out = np.maximum(np.abs(lam - 1).max(-1), np.abs(inv - 1).max(-1))
        else:
            out = np.maximum(np.linalg.norm(lam - 1, axis=-1), np.linalg.norm(inv - 1, axis=-1))
    return np.where(np.all(lam > 0, axis=-1) & np.isfinite(out), out, np.inf)


def spectral_distance(S1, S2) -> float:
    """``dist_spec`` of two covariance matrices (inf if either is not PD)."""
    L, ok = factorise(np.stack([S1, S2]))
    if not ok.all():
        return float("inf")
    return float(_cov_from_eigs(_gen_eigs(L[0], np.asarray(S2, float)), "spectral"))


def cov_distance(S1, S2) -> float:
    """``dist_COV`` (Frobenius) of two covariance matrices (inf if either is not PD)."""
    L, ok = factorise(np.stack([S1, S2]))
    if not ok.all():
        return float("inf")
    return float(_cov_from_eigs(_gen_eigs(L[0], np.asarray(S2, float)), "frobenius"))


def mean_distance(mu1, S1, mu2, S2) -> float:
    """``dist_MEAN``: the larger of the two Mahalanobis norms of ``mu1 - mu2``."""
    L, ok = factorise(np.stack([S1, S2]))
    if not ok.all():
        return float("inf")
    diff = np.asarray(mu1, float) - np.asarray(mu2, float)
    return float(max(np.linalg.norm(L[0] @ diff), np.linalg.norm(L[1] @ diff)))


def comp_distance(c1, c2, *, weights: bool = True) -> float:
    """``dist_COMP`` of two components ``(w, mu, Sigma)``."""
    (w1, m1, S1), (w2, m2, S2) = c1, c2
    parts = [mean_distance(m1, S1, m2, S2), cov_distance(S1, S2)]
    if weights:
        parts.append(abs(float(w1) - float(w2)))
    return float(max(parts))


def _comp_matrix(F: Params, G: Params, weights: bool) -> np.ndarray:
    K = F.weights.shape[0]
    return np.array([[comp_distance((F.weights[a], F.means[a], F.covariances[a]),
                                    (G.weights[b], G.means[b], G.covariances[b]),
                                    weights=weights) for b in range(K)] for a in range(K)])


def _perfect(E: np.ndarray) -> bool:
    if not (E.any(axis=1).all() and E.any(axis=0).all()):
        return False
    match = maximum_bipartite_matching(csr_matrix(E.astype(np.int8)), perm_type="column")
    return bool(np.all(match >= 0))


def param_distance(F: Params, G: Params, *, aligned: bool = False,
                   weights: bool = True) -> float:
    """Exact ``dist_PARAM`` (bottleneck matching over the K x K COMP distances).

    With ``aligned`` the components are matched by index (labelled components).
    """
    if not (F.valid and G.valid):
        return float("inf")
    D = _comp_matrix(F, G, weights)
    if aligned:
        return float(np.max(np.diag(D)))
    vals = np.unique(D[np.isfinite(D)])
    if vals.size == 0 or not _perfect(D <= vals[-1]):
        return float("inf")
    lo, hi = 0, vals.size - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _perfect(D <= vals[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(vals[lo])


class ParamDistance:
    """``dist_PARAM`` on lists of :class:`Params` (z = 3/2, restriction radius 1).

    Parameters
    ----------
    aligned : bool
        Components are labelled (matched by index) instead of matched by permutation.
    weights : bool
        Include ``|w - w'|`` (False for a single Gaussian).
    """

    z = 1.5
    r_tri = 1.0

    def __init__(self, *, aligned: bool = False, weights: bool = True):
        self.aligned = aligned
        self.weights = weights

    def __call__(self, F: Params, G: Params) -> float:
        return param_distance(F, G, aligned=self.aligned, weights=self.weights)

    def close_matrix(self, Ys: list[Params], tau: float, progress=None) -> np.ndarray:
        """Boolean t x t matrix ``C[i, j] = dist(Y_i, Y_j) <= tau`` (``C[i, i]`` = valid)."""
        t = len(Ys)
        valid = np.array([Y.valid for Y in Ys], dtype=bool)
        C = np.zeros((t, t), dtype=bool)
        if not valid.any():
            return C
        K, d = next(Y for Y in Ys if Y.valid).means.shape
        W = np.stack([Y.weights for Y in Ys])
        MU = np.stack([Y.means for Y in Ys])
        S = np.stack([Y.covariances for Y in Ys])
        Linv, ok = factorise(S)
        valid &= ok.all(axis=1)
        if self.aligned:
            ia = ib = np.arange(K)
        else:
            ia, ib = (g.ravel() for g in np.meshgrid(np.arange(K), np.arange(K), indexing="ij"))
        idx = np.flatnonzero(valid)
        for n, i in enumerate(idx):
            C[i, i] = True
            js = idx[n + 1:]
            if js.size:
                close = self._close_to(i, js, W, MU, S, Linv, ia, ib, tau)
                if self.aligned:
                    row = close.all(axis=1)
                else:
                    row = self._matched(close.reshape(js.size, K, K))
                C[i, js[row]] = True
                C[js[row], i] = True
            if progress is not None:
                progress(1)
        return C

    def _close_to(self, i, js, W, MU, S, Linv, ia, ib, tau) -> np.ndarray:
        """``close[m, p]``: component ia[p] of block i is within tau of ib[p] of block js[m]."""
        m, P = js.size, ia.size
        cand = np.ones((m, P), dtype=bool)
        if self.weights:
            cand &= np.abs(W[i, ia][None, :] - W[js][:, ib]) <= tau
        rows, cols = np.nonzero(cand)
        if rows.size:
            a, b, jj = ia[cols], ib[cols], js[rows]
            diff = MU[i, a] - MU[jj, b]
            n1 = np.linalg.norm(np.einsum("nkl,nl->nk", Linv[i, a], diff), axis=1)
            n2 = np.linalg.norm(np.einsum("nkl,nl->nk", Linv[jj, b], diff), axis=1)
            keep = np.maximum(n1, n2) <= tau
            rows, cols, a, b, jj = rows[keep], cols[keep], a[keep], b[keep], jj[keep]
            cand[:] = False
            if rows.size:
                dcov = _cov_from_eigs(_gen_eigs(Linv[i, a], S[jj, b]), "frobenius")
                good = dcov <= tau
                cand[rows[good], cols[good]] = True
        return cand

    @staticmethod
    def _matched(E: np.ndarray) -> np.ndarray:
        rows_ok = E.any(axis=2).all(axis=1) & E.any(axis=1).all(axis=1)
        out = np.zeros(E.shape[0], dtype=bool)
        for m in np.flatnonzero(rows_ok):
            out[m] = _perfect(E[m])
        return out


class SpectralDistance:
    """``dist_spec`` on covariance matrices (z = 3/2, r_tri = 1, phi = 1)."""

    z = 1.5
    r_tri = 1.0
    phi = 1.0

    def __call__(self, S1, S2) -> float:
        return spectral_distance(S1, S2)

    def close_matrix(self, Ys, tau: float, progress=None) -> np.ndarray:
        S = np.stack([np.asarray(Y, float) for Y in Ys])
        Linv, valid = factorise(S)
        t = S.shape[0]
        C = np.zeros((t, t), dtype=bool)
        idx = np.flatnonzero(valid)
        for n, i in enumerate(idx):
            C[i, i] = True
            js = idx[n + 1:]
            if js.size:
                dist = _cov_from_eigs(_gen_eigs(Linv[i][None], S[js]), "spectral")
                close = js[dist <= tau]
                C[i, close] = True
                C[close, i] = True
            if progress is not None:
                progress(1)
        return C

    @staticmethod
    def average(Ys, w) -> np.ndarray:
        w = np.asarray(w, float)
        return np.einsum("i,ikl->kl", w / w.sum(), np.stack(Ys))


class L2Distance:
    """Euclidean distance on vectors (a metric: z = 1, r_tri = inf, phi = 0)."""

    z = 1.0
    r_tri = float("inf")
    phi = 0.0

    def __call__(self, a, b) -> float:
        return float(np.linalg.norm(np.asarray(a, float) - np.asarray(b, float)))

    def close_matrix(self, Ys, tau: float, progress=None) -> np.ndarray:
        Y = np.stack([np.asarray(y, float) for y in Ys])
        valid = np.all(np.isfinite(Y), axis=1)
        C = np.zeros((Y.shape[0],) * 2, dtype=bool)
        if valid.sum() > 0:
            v = np.flatnonzero(valid)
            C[np.ix_(v, v)] = squareform(pdist(Y[v])) <= tau
        C = C & C.T & valid[:, None] & valid[None, :]
        if progress is not None:
            progress(len(Ys))
        return C

    @staticmethod
    def average(Ys, w) -> np.ndarray:
        w = np.asarray(w, float)
        return (w / w.sum()) @ np.stack(Ys)


class DiscreteDistance:
    """0 between equal integers, inf otherwise (z = 1; any mask radius; identity mask)."""

    z = 1.0
    r_tri = float("inf")
    phi = 0.0

    def __call__(self, a, b) -> float:
        return 0.0 if (a is not None and a == b) else float("inf")

    def close_matrix(self, Ys, tau: float, progress=None) -> np.ndarray:
        v = np.array([-1 if y is None else int(y) for y in Ys])
        C = (v[:, None] == v[None, :]) & (v[:, None] >= 0)
        if progress is not None:
            progress(len(Ys))
        return C

    @staticmethod
    def average(Ys, w) -> int:
        """The weighted average of integers that are all equal (as they are among popular
        blocks, by the popularity argument): returned exactly, as the value of largest total
        weight, so that no floating-point rounding enters the release."""
        vals = np.array(Ys, dtype=np.int64)
        w = np.asarray(w, float)
        uniq = np.unique(vals)
        return int(uniq[np.argmax([w[vals == u].sum() for u in uniq])])
