"""Tests of the mean-noise SDP solvers (package ``solvers``).

The reference for objective values is an independent cvxpy + Clarabel model written here in
the original coordinates (no whitening, no reduction, tight tolerances), not the package's
own cvxpy backend.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from klrelease import solvers
from klrelease.solvers import (
    SDPResult,
    SolverFailed,
    SolverUnavailable,
    available_solvers,
    max_violation,
    mean_noise_sdp,
)
from klrelease.solvers.backends import BACKENDS
from klrelease.solvers.backends import mosek as mosek_backend
from klrelease.solvers.synthetic import class_problems, gmm_data

REL = 1e-6  # agreement asked of every backend (objective, relative)
EXACT_BACKENDS = ["native", "clarabel", "scs", "mosek"]


# --------------------------------------------------------------------------- references


def reference_objective(A, V, *, whiten=False):
    """Independent solution: cvxpy, every non-zero row, tight tolerances, no reduction.

    Clarabel on the Schur-complement LMIs ``[[1, v^T], [v, G]] >= 0`` in the original
    coordinates; SCS on ``G - v v^T >= 0`` for ``d >= 10`` (Clarabel's dense cone Hessians
    take seconds there). With ``whiten=True`` the rows are first mapped by the symmetric square
    root of ``A`` (for an ill-conditioned ``A`` shaped like the rows, where the original
    coordinates leave the solver a badly conditioned ``G``). Returns the objective, ``G`` and
    the constraints (whose duals give the multipliers of the concave dual).
    """
    import cvxpy as cp

    d = A.shape[0]
    rows = V[np.any(V != 0, axis=1)]
    if rows.shape[0] == 0:
        return 0.0, np.zeros((d, d)), []
    lam, Q = np.linalg.eigh(A)
    T = (Q * np.sqrt(lam)) @ Q.T if whiten else np.eye(d)  # u = T v, G = T^-1 H T^-1
    W = rows @ T
    C = np.linalg.inv(T) @ A @ np.linalg.inv(T)
    C = 0.5 * (C + C.T)
    H = cp.Variable((d, d), symmetric=True)
    if d >= 10:
        cons = [H - np.outer(u, u) >> 0 for u in W]
        attempts = [("SCS", dict(eps_abs=1e-10, eps_rel=1e-10, max_iters=200_000))]
    else:
        cons = [cp.bmat([[np.ones((1, 1)), u[None, :]], [u[:, None], H]]) >> 0 for u in W]
        attempts = [
            ("CLARABEL", dict(tol_gap_abs=t, tol_gap_rel=t, tol_feas=t)) for t in (1e-10, 1e-9)
        ]
    prob = cp.Problem(cp.Minimize(cp.trace(C @ H)), cons)
    for name, opts in attempts:
        prob.solve(solver=name, **opts)
        if prob.status == "optimal":
            break
    assert prob.status == "optimal"
    Ti = np.linalg.inv(T)
    return float(prob.value), Ti @ H.value @ Ti, cons


def pinv_violation(G, V):
    """``max v^T G^+ v - 1`` by a plain pseudo-inverse (independent of the package)."""
    P = np.linalg.pinv(G, rcond=1e-12, hermitian=True)
    return float(np.max(np.einsum("ij,jk,ik->i", V, P, V))) - 1.0


def random_spd(rng, d, cond=10.0):
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return Q @ np.diag(np.logspace(0, np.log10(cond), d)) @ Q.T


def _suite():
    rng = np.random.default_rng(20240601)
    cases = {}
    cases["random d=3"] = (random_spd(rng, 3), rng.standard_normal((150, 3)))
    cases["d=1"] = (np.array([[2.5]]), rng.standard_normal((40, 1)))
    v = rng.standard_normal(4)
    cases["collinear"] = (random_spd(rng, 4), np.outer(rng.standard_normal(25), v))
    base = rng.standard_normal((15, 3))
    cases["duplicated"] = (random_spd(rng, 3), np.vstack([base, base, -base, base[:4]]))
    # N_k = d + 2: the smallest class size with an invertible covariance.
    d = 4
    X, y = gmm_data(400, d, 4, seed=3)
    small = np.flatnonzero(y == 0)[: d + 2]
    Xs = np.vstack([X[small], X[y != 0][:60]])
    ys = np.concatenate([np.zeros(d + 2, int), np.ones(60, int)])
    cases["N_k = d + 2"] = class_problems(Xs, ys)[0]
    # Ill-conditioned Sigma, neighbour vectors drawn from it (the mechanism's situation).
    S = random_spd(rng, 3, cond=1e6)
    Xi = rng.multivariate_normal(np.zeros(3), S, size=120)
    cases["ill-conditioned Sigma"] = (np.linalg.inv(S), (Xi - Xi.mean(0)) / 119)
    # Ill-conditioned A unrelated to the rows.
    cases["ill-conditioned A"] = (random_spd(rng, 5, cond=1e6), rng.standard_normal((120, 5)))
    cases["d=20"] = (random_spd(rng, 20, cond=100), rng.standard_normal((22, 20)))
    cases["subspace"] = (
        random_spd(rng, 4),
        rng.standard_normal((50, 2)) @ rng.standard_normal((2, 4)),
    )
    cases["one row"] = (random_spd(rng, 3), rng.standard_normal((1, 3)))
    cases["zero rows"] = (
        random_spd(rng, 3),
        np.vstack([rng.standard_normal((30, 3)), np.zeros((9, 3))]),
    )
    return cases


SUITE = _suite()


WHITEN = {"ill-conditioned Sigma"}


@pytest.fixture(scope="module")
def references():
    refs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (A, V) in SUITE.items():
            value, G, _ = reference_objective(A, V, whiten=name in WHITEN)
            # The reference must itself be feasible to be a reference.
            assert value == 0 or max_violation(G, V) <= 1e-6, name
            refs[name] = value
    return refs


def _require(name):
    if name not in available_solvers():
        pytest.skip(f"backend {name!r} is not usable here")


def check_result(res: SDPResult, A, V):
    """Properties every returned result must have."""
    G = res.G
    d = A.shape[0]
    assert G.shape == (d, d)
    assert np.allclose(G, G.T, rtol=0, atol=1e-12 * max(1.0, np.abs(G).max()))
    lam = np.linalg.eigvalsh(G)
    assert lam[0] >= -1e-10 * max(lam[-1], 1e-300)
    assert res.status == "optimal"
    assert res.objective == pytest.approx(float(np.sum(A * G)), rel=1e-9, abs=1e-300)
    assert res.max_violation <= 1e-6
    # Recomputing the check reproduces the reported value up to its own rounding (which grows
    # with the condition number of G).
    assert res.max_violation == pytest.approx(max_violation(G, V), abs=1e-9)
    assert res.time > 0
    assert res.reduction in ("none", "hull", "active-set")
    assert not G.flags.writeable


# --------------------------------------------------------------------------- agreement


@pytest.mark.parametrize("backend", EXACT_BACKENDS)
@pytest.mark.parametrize("case", list(SUITE))
def test_backends_agree_with_reference(backend, case, references):
    _require(backend)
    A, V = SUITE[case]
    res = mean_noise_sdp(A, V, solver=backend)
    check_result(res, A, V)
    assert res.solver == backend or (res.solver == "closed-form" and references[case] == 0)
    assert res.objective == pytest.approx(references[case], rel=REL)
    if np.linalg.matrix_rank(V) == V.shape[1]:
        # Full-rank rows: G is invertible and the plain inverse agrees with the check.
        assert pinv_violation(res.G, V) <= 1e-6


def test_auto_picks_native_and_records_it():
    A, V = SUITE["random d=3"]
    res = mean_noise_sdp(A, V)
    assert res.solver == "native"
    assert res.fallbacks == ()
    assert np.isfinite(res.gap) and 0 <= res.gap <= 1e-7


@pytest.mark.parametrize(
    "case, backend",
    [
        (case, backend)
        for case in ["random d=3", "duplicated", "d=20", "subspace", "N_k = d + 2"]
        for backend in ["native", "clarabel"]
        if not (case == "d=20" and backend == "clarabel")  # seconds per solve at d = 20
    ],
)
def test_reductions_agree_with_unreduced(case, backend):
    A, V = SUITE[case]
    results = {
        r: mean_noise_sdp(A, V, solver=backend, reduce=r) for r in solvers.dispatch.REDUCTIONS
    }
    full = results["none"]
    assert full.reduction == "none"
    assert full.n_constraints == int(np.any(V != 0, axis=1).sum())
    for red, res in results.items():
        check_result(res, A, V)
        assert res.objective == pytest.approx(full.objective, rel=REL), red


def test_reduction_shrinks_the_paper_problem():
    X, y = gmm_data(1000, 3, 5, seed=0)
    A, V = class_problems(X, y)[0]
    full = mean_noise_sdp(A, V, solver="clarabel", reduce="none")
    for red in ("hull", "active-set"):
        res = mean_noise_sdp(A, V, solver="native", reduce=red)
        assert res.reduction == red
        assert res.n_constraints < 100 < V.shape[0]
        assert res.objective == pytest.approx(full.objective, rel=REL)


def test_active_set_large_dimension_matches_other_backend():
    rng = np.random.default_rng(7)
    A = random_spd(rng, 8, cond=30)
    V = rng.standard_normal((3000, 8)) * rng.uniform(0.2, 2.0, size=8)
    res = mean_noise_sdp(A, V, solver="native", reduce="active-set")
    assert res.reduction == "active-set" and res.rounds > 1 and res.n_constraints < 500
    check_result(res, A, V)
    assert 0 <= res.gap <= 1e-7
    other = mean_noise_sdp(A, V, solver="clarabel", reduce="active-set")
    assert other.objective == pytest.approx(res.objective, rel=REL)


# --------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("backend", EXACT_BACKENDS)
def test_one_dimension_closed_form(backend):
    _require(backend)
    rng = np.random.default_rng(1)
    V = rng.standard_normal((57, 1)) * 3.0
    res = mean_noise_sdp(np.array([[0.7]]), V, solver=backend)
    expected = float(np.max(V[:, 0] ** 2))
    assert res.G[0, 0] == pytest.approx(expected, rel=REL)
    assert res.objective == pytest.approx(0.7 * expected, rel=REL)


@pytest.mark.parametrize("backend", EXACT_BACKENDS)
def test_single_row_gives_rank_one(backend):
    _require(backend)
    rng = np.random.default_rng(2)
    A = random_spd(rng, 4)
    v = rng.standard_normal(4)
    res = mean_noise_sdp(A, v[None, :], solver=backend)
    assert res.rank == 1
    np.testing.assert_allclose(res.G, np.outer(v, v), rtol=0, atol=1e-6 * float(v @ v))
    assert res.objective == pytest.approx(float(v @ A @ v), rel=REL)


def test_all_zero_rows_give_zero():
    A = np.eye(3)
    for V in (np.zeros((5, 3)), np.zeros((0, 3))):
        res = mean_noise_sdp(A, V)
        assert np.array_equal(res.G, np.zeros((3, 3)))
        assert res.objective == 0.0 and res.n_constraints == 0 and res.rank == 0


def test_subspace_gives_singular_psd_solution():
    A, V = SUITE["subspace"]
    res = mean_noise_sdp(A, V)
    lam = np.linalg.eigvalsh(res.G)
    assert res.rank == 2
    assert abs(lam[0]) <= 1e-10 * lam[-1] and abs(lam[1]) <= 1e-10 * lam[-1]
    assert lam[2] > 1e-6 * lam[-1]
    # Every row lies in the range of G and satisfies the pseudo-inverse constraint.
    assert pinv_violation(res.G, V) <= 1e-6


def test_zero_rows_are_ignored():
    A, V = SUITE["random d=3"]
    padded = np.vstack([np.zeros((4, 3)), V, np.zeros((3, 3))])
    a = mean_noise_sdp(A, V)
    b = mean_noise_sdp(A, padded)
    assert b.objective == pytest.approx(a.objective, rel=1e-9)
    assert b.n_constraints == a.n_constraints


# --------------------------------------------------------------------------- the concave dual


def test_dual_formula_matches_clarabel():
    """F4: optimum = max_w h(w)^2, h = tr((A^1/2 M A^1/2)^1/2), G = h A^-1/2 (.)^1/2 A^-1/2."""
    from scipy.linalg import sqrtm

    rng = np.random.default_rng(11)
    A = random_spd(rng, 3, cond=20)
    V = rng.standard_normal((80, 3)) @ rng.standard_normal((3, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt, G_ref, cons = reference_objective(A, V)
    # Multipliers of the constraints v^T G^{-1} v <= 1 from the LMI duals.
    w = np.array([float(c.dual_value[0, 0]) for c in cons])
    w = np.maximum(w, 0) / np.maximum(w, 0).sum()
    Ah = np.real(sqrtm(A))
    Aih = np.linalg.inv(Ah)

    def h(p):
        M = (V.T * p) @ V
        return float(np.trace(np.real(sqrtm(Ah @ M @ Ah)))), M

    hv, M = h(w)
    assert hv**2 == pytest.approx(opt, rel=1e-6)
    G_dual = hv * Aih @ np.real(sqrtm(Ah @ M @ Ah)) @ Aih
    np.testing.assert_allclose(G_dual, G_ref, rtol=0, atol=1e-4 * np.abs(G_ref).max())
    # Weak duality: no point of the simplex exceeds the optimum.
    for _ in range(20):
        p = rng.dirichlet(np.ones(V.shape[0]) * 0.3)
        assert h(p)[0] ** 2 <= opt * (1 + 1e-9)
    native = mean_noise_sdp(A, V, solver="native")
    assert native.objective == pytest.approx(opt, rel=1e-7)


# --------------------------------------------------------------------------- properties


@st.composite
def problems(draw):
    d = draw(st.integers(1, 4))
    n = draw(st.integers(1, 25))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    A = random_spd(rng, d, cond=draw(st.sampled_from([1.0, 10.0, 1e3])))
    V = rng.standard_normal((n, d)) * draw(st.sampled_from([1e-3, 1.0, 1e3]))
    return A, V, rng


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.floats(0.1, 10.0))
def test_invariances(problem, t):
    """Row order, row signs and duplicates do not matter; G scales with t^2 when V scales with
    t (homogeneity) and is unchanged when A scales."""
    A, V, rng = problem
    base = mean_noise_sdp(A, V)
    check_result(base, A, V)
    perm = rng.permutation(V.shape[0])
    signs = rng.choice([-1.0, 1.0], size=(V.shape[0], 1))
    shuffled = mean_noise_sdp(A, np.vstack([(V * signs)[perm], V[:2]]))
    assert shuffled.objective == pytest.approx(base.objective, rel=REL)
    scaled = mean_noise_sdp(A, t * V)
    assert scaled.objective == pytest.approx(t * t * base.objective, rel=REL)
    reweighted = mean_noise_sdp(3.0 * A, V)
    assert reweighted.objective == pytest.approx(3.0 * base.objective, rel=REL)
    tol = 1e-5 * np.abs(base.G).max()
    np.testing.assert_allclose(reweighted.G, base.G, rtol=0, atol=tol)


# --------------------------------------------------------------------------- failures


def test_mosek_without_licence_is_unavailable(monkeypatch):
    """A licence failure at the probe solve makes MOSEK unavailable, with a clear message."""

    def no_licence():
        raise RuntimeError("rescode.err_missing_license_file(1008): License cannot be located.")

    monkeypatch.setattr(mosek_backend.MosekBackend, "is_installed", lambda self: True)
    monkeypatch.setattr(mosek_backend, "_probe_solve", no_licence)
    mosek_backend.probe.cache_clear()
    try:
        assert "mosek" not in available_solvers()
        A, V = SUITE["random d=3"]
        with pytest.raises(SolverUnavailable) as err:
            mean_noise_sdp(A, V, solver="mosek")
        msg = str(err.value)
        assert "klrelease[mosek]" in msg and "MOSEKLM_LICENSE_FILE" in msg
        assert "err_missing_license_file" in msg
        assert isinstance(err.value, RuntimeError)
        assert mean_noise_sdp(A, V).solver != "mosek"
    finally:
        mosek_backend.probe.cache_clear()


def test_mosek_not_installed_message(monkeypatch):
    monkeypatch.setattr(mosek_backend.MosekBackend, "is_installed", lambda self: False)
    mosek_backend.probe.cache_clear()
    try:
        with pytest.raises(SolverUnavailable, match="not installed.*klrelease\\[mosek\\]"):
            mean_noise_sdp(np.eye(2), np.ones((3, 2)), solver="mosek")
    finally:
        mosek_backend.probe.cache_clear()


def test_probe_is_cached(monkeypatch):
    calls = []
    monkeypatch.setattr(mosek_backend.MosekBackend, "is_installed", lambda self: True)
    monkeypatch.setattr(mosek_backend, "_probe_solve", lambda: calls.append(1))
    mosek_backend.probe.cache_clear()
    try:
        assert "mosek" in available_solvers()
        available_solvers()
        assert calls == [1]
    finally:
        mosek_backend.probe.cache_clear()


def test_real_mosek_probe_without_licence(monkeypatch):
    """With the real module and no licence file, the probe fails and the call says why."""
    pytest.importorskip("mosek")
    monkeypatch.setenv("MOSEKLM_LICENSE_FILE", "/nonexistent/mosek.lic")
    mosek_backend.probe.cache_clear()
    try:
        if mosek_backend.probe()[0]:
            pytest.skip("a MOSEK licence is available here")
        with pytest.raises(SolverUnavailable, match="MOSEKLM_LICENSE_FILE") as info:
            mean_noise_sdp(np.eye(2), np.ones((3, 2)), solver="mosek")
        assert "klrelease[mosek]" in str(info.value)
        # "auto" never picks the unusable MOSEK, although cvxpy itself would prefer it.
        assert "mosek" not in available_solvers()
        res = mean_noise_sdp(np.eye(2), np.ones((3, 2)))
        assert res.solver == "native" and res.fallbacks == ()
    finally:
        mosek_backend.probe.cache_clear()


def test_infeasible_backend_answer_raises(monkeypatch):
    backend = BACKENDS["clarabel"]
    original = type(backend).solve

    def shrunk(self, *args, **kwargs):
        sol = original(self, *args, **kwargs)
        sol.H = 0.5 * sol.H
        return sol

    monkeypatch.setattr(type(backend), "solve", shrunk)
    A, V = SUITE["random d=3"]
    with pytest.raises(SolverFailed) as err:
        mean_noise_sdp(A, V, solver="clarabel", reduce="none")
    assert err.value.solver == "clarabel" and err.value.status == "infeasible result"


def test_auto_falls_back_and_records(monkeypatch):
    def broken(self, *args, **kwargs):
        raise SolverFailed("native", "not converged", "simulated")

    monkeypatch.setattr(type(BACKENDS["native"]), "solve", broken)
    A, V = SUITE["random d=3"]
    res = mean_noise_sdp(A, V)
    assert res.solver in ("mosek", "clarabel")
    assert len(res.fallbacks) == 1 and "native" in res.fallbacks[0]
    with pytest.raises(SolverFailed):
        mean_noise_sdp(A, V, solver="native")


def test_non_optimal_status_raises():
    A, V = SUITE["random d=3"]
    with pytest.raises(SolverFailed) as err:
        mean_noise_sdp(A, V, solver="clarabel", reduce="none", max_iters=2)
    assert err.value.status != "optimal"


def test_time_limit_is_enforced():
    A, V = SUITE["d=20"]
    with pytest.raises(SolverFailed, match="time limit"):
        mean_noise_sdp(A, V, solver="native", time_limit=1e-9)


# --------------------------------------------------------------------------- validation

SECRET = 987654.321


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(solver="cvxopt"), "solver must be one of"),
        (dict(reduce="qhull"), "reduce must be one of"),
        (dict(tol=0.0), "tol"),
        (dict(tol=float("nan")), "tol"),
        (dict(time_limit=-1.0), "time_limit"),
        (dict(max_iters=0), "max_iters"),
    ],
)
def test_invalid_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mean_noise_sdp(np.eye(2), np.ones((3, 2)), **kwargs)


def test_solver_error_names_allowed_values():
    with pytest.raises(ValueError) as err:
        mean_noise_sdp(np.eye(2), np.ones((3, 2)), solver="cvxopt")
    for name in ("auto", "native", "clarabel", "scs", "mosek"):
        assert repr(name) in str(err.value)


@pytest.mark.parametrize(
    "A, V, match",
    [
        (np.eye(3)[:2], np.ones((4, 3)), "A must be a non-empty square"),
        (np.array([[SECRET, 1.0], [0.0, 1.0]]), np.ones((4, 2)), "A must be symmetric"),
        (np.array([[SECRET, 0.0], [0.0, -1.0]]), np.ones((4, 2)), "A must be positive definite"),
        (np.array([[np.nan, 0.0], [0.0, SECRET]]), np.ones((4, 2)), "A must contain only finite"),
        (np.eye(2), np.array([[SECRET, np.inf]]), "V must contain only finite"),
        (np.eye(2), np.full((4, 3), SECRET), "V must have as many columns"),
        (np.eye(2), np.full(2, SECRET), "V must be a 2-D array"),
        (np.eye(2), np.array([["a", "b"]]), "V must be a real numeric array"),
        (np.eye(2), np.full((2, 2), 1 + 1j), "V must be a real numeric array"),
    ],
)
def test_invalid_inputs_name_the_argument_not_the_data(A, V, match):
    with pytest.raises(ValueError, match=match) as err:
        mean_noise_sdp(A, V)
    assert "987654" not in str(err.value) and "nan" not in str(err.value).lower()


def test_public_names():
    assert set(solvers.__all__) >= {
        "mean_noise_sdp",
        "SDPResult",
        "SolverFailed",
        "SolverUnavailable",
        "available_solvers",
    }
    assert issubclass(SolverUnavailable, RuntimeError)
    assert issubclass(SolverFailed, RuntimeError)
    assert available_solvers()[0] == "native"


# --------------------------------------------------------------------------- hard inputs


def test_many_duplicated_rows_keep_the_working_set_small():
    """1e5 rows drawn from 30 distinct points in d = 20: the active set holds distinct rows
    only (the initial set spans R^20 by pivoted QR) and the optimum is that of the 30 points."""
    rng = np.random.default_rng(11)
    points = rng.normal(size=(30, 20))
    V = points[rng.integers(0, 30, 100_000)]
    res = mean_noise_sdp(np.eye(20), V, solver="native")
    check_result(res, np.eye(20), V)
    assert res.reduction == "active-set" and res.n_constraints <= 30
    direct = mean_noise_sdp(np.eye(20), points, solver="native", reduce="none")
    assert res.objective == pytest.approx(direct.objective, rel=REL)


def test_native_accepts_a_certified_gap_within_the_tolerance_on_extreme_conditioning():
    """cond(A) = 1e16 in d = 20: the dual iteration stalls between half the tolerance (its
    target) and the tolerance; the certified point is returned with its gap."""
    rng = np.random.default_rng(5)
    V = rng.normal(size=(22, 20))
    A = np.diag(np.logspace(-8, 8, 20))
    res = mean_noise_sdp(A, V, solver="native")
    check_result(res, A, V)
    assert res.gap <= 1e-7


def test_auto_falls_back_when_the_native_solver_stalls():
    """A badly conditioned cost (cond 1e10, d = 3) on which the native solver cannot certify
    its gap: "auto" records that failure and returns Clarabel's optimum."""
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    A = (Q * np.logspace(0, 10, 3)) @ Q.T
    V = rng.normal(size=(100, 3))
    with pytest.raises(SolverFailed, match="not converged"):
        mean_noise_sdp(A, V, solver="native")
    res = mean_noise_sdp(A, V)
    check_result(res, A, V)
    assert res.solver != "native" and "native" in res.fallbacks[0]
    # The cvxpy reference stalls here too; SCS certifies its own answer through its duals.
    _require("scs")
    other = mean_noise_sdp(A, V, solver="scs")
    assert other.gap < 1e-8
    assert res.objective == pytest.approx(other.objective, rel=REL)
