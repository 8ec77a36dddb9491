"""PGME-lite: the main private GMM learner of Kamath, Sheffet, Singhal & Ullman (KSSU Alg. 3-4)
with practical replacements (``kamath-pgme-lite``; the old name ``kamath-pgme`` still works and
warns).

Recursive private partitioning (RPGMP, Alg. 3): at a node with ``k_node >= 2`` components,
a noisy count and a bounding ball (BoundingBall-lite [PRACTICAL]), a terrific ball in the
original space (TerrificRadius [PAPER] + GoodCenter-lite [PRACTICAL] + Laplace check); if
none, private PCA ([PAPER], fix K7) and a terrific ball in the projected space; a found ball
splits the node into the points inside ``B_r'`` and outside ``B_5r'``, both recursing with
``k_node - 1``. A leaf that would inherit its parent's bounding ball (the side outside a found
ball, either side of a projected split) first gets a ball of its own: GoodCenter-lite
[PRACTICAL] at the public scale of one component, ``r~ = sigma_max sqrt(d)`` (a heavy cell of
side ``2 r~``, its clipped mean, then the clipped mean within ``1.5 r~`` of it), radius
``1.5 r~`` around that centre (without it the estimate carries noise of the size of the
parent's ball, several times the data's extent); the side inside a found terrific ball already
has one. Leaves are then estimated with PGE-lite
[PRACTICAL] (replaces the KLSU19 learner) in their ball, in two rounds when the first round's
covariance can inform the second's radius (public numbers), else in one.
The output keeps the leaves whose released count reaches ``n w_min / 4`` and, of those, the
``k`` largest (fix K11).

Privacy (``KAMATH.md``): every piece is calibrated to max(substitution, add/remove)
sensitivity; membership of a child depends only on released balls and the record itself, so
a substitution affects at most ``2k - 3`` node invocations and 2 leaves (Lemma P). The
worst-path ledger gives 0.6 of the budget to the nodes and 0.2 to each of two leaves (of a
leaf's share, half to its own ball and half to PGE-lite; a leaf with a ball of its own gives
PGE-lite all of it): of
(eps, delta) under the ``basic`` accountant, of rho under ``zcdp`` (``auto`` picks the one
with the larger per-piece budgets, from public inputs).
Utility is not covered by the paper's theorems in this regime (``KAMATH.md``, regimes).
"""

from __future__ import annotations

import math

import numpy as np

from ...privacy.ledger import ZCDP_DELTA_SHARE, Ledger, Spend, choose_accountant, zcdp_rho
from ...privacy.toolbox import gauss_sigma, laplace_count, stable_histogram_threshold
from ..result import LearnResult, register_alias, register_learner
from .blocks import (
    Ball,
    bounding_ball_lite,
    good_center_lite,
    pge_lite,
    private_pca,
    pterrific_ball,
    radius_slack,
    within,
)
from .common import fail, guarantee, structure_rng, structure_seed, success

__all__ = ["NAME", "OLD_NAME", "pgme_ledger", "node_budget", "leaf_budget", "learn_pgme"]

NAME = "kamath-pgme-lite"
#: The former name, kept as an alias that warns.
OLD_NAME = "kamath-pgme"
DOC = "klrelease/learners/kamath/KAMATH.md (PGME-lite)"

#: Share of the budget for the partition's nodes; each of the two leaves on the worst path
#: gets half the rest.
_PARTITION = 0.6
#: Shares of a leaf's budget (epsilon under basic, rho under zcdp): its own ball
#: (GoodCenter-lite: StableHist, the heavy cell's NoisySumCount, the NoisySumCount around its
#: mean), then PGE-lite. A leaf that has a ball of its own already (inside a found terrific
#: ball) gives PGE-lite all of it.
_LEAF_SHARES = {"hist": 0.2, "stage1": 0.1, "stage2": 0.2, "pge": 0.5}
#: GoodCenter-lite's averaging radius and PGE-lite's ball around the leaf's own centre, in
#: units of r~
_LEAF_RHO = 1.5
#: GoodCenter-lite's r~ for a leaf's own ball, in units of sigma_max sqrt(d)
_LEAF_SCALE = 1.0

_NODE_EPS = {
    "count": 0.04, "bb_centre": 0.06, "bb_radius": 0.10,
    "s3_radius": 0.16, "s3_hist": 0.07, "s3_stage1": 0.035, "s3_stage2": 0.035,
    "s3_check": 0.02, "pca": 0.16,
    "s6_radius": 0.16, "s6_hist": 0.07, "s6_stage1": 0.035, "s6_stage2": 0.035,
    "s6_check": 0.02,
}
_NODE_DELTA_PIECES = ("bb_centre", "s3_hist", "s3_stage1", "s3_stage2", "pca",
                      "s6_hist", "s6_stage1", "s6_stage2")


def n_affected_nodes(k: int) -> int:
    """Worst-path number of node invocations a substitution can affect: ``2k - 3``."""
    return max(2 * k - 3, 0)


_KIND = {"count": "pure", "bb_centre": "gaussian", "bb_radius": "pure", "radius": "pure",
         "hist": "stable", "stage1": "gaussian", "stage2": "gaussian", "check": "pure",
         "pca": "gaussian"}


def _kind(piece: str) -> str:
    return _KIND[piece[3:] if piece.startswith(("s3_", "s6_")) else piece]


def node_budget(node: dict, with_pca: bool) -> dict[str, Spend]:
    """Per-piece budgets of one node; without PCA the remaining shares are renormalised.

    ``node`` is the node total of :func:`pgme_ledger`: ``{"accountant": "basic", "epsilon",
    "delta"}`` or ``{"accountant": "zcdp", "rho", "delta_tv"}``. Either way the total of a
    node is the same with or without PCA (the choice depends on public ``k_node`` and ``d``).
    """
    keys = list(_NODE_EPS) if with_pca else [k for k in _NODE_EPS
                                              if not k.startswith(("s6", "pca"))]
    tot = sum(_NODE_EPS[k] for k in keys)
    if node["accountant"] == "basic":
        dkeys = [k for k in _NODE_DELTA_PIECES if k in keys]
        return {k: Spend(node["epsilon"] * _NODE_EPS[k] / tot,
                         node["delta"] / len(dkeys) if k in dkeys else 0.0) for k in keys}
    hist = [k for k in keys if _kind(k) == "stable"]
    out = {}
    for k in keys:
        rho_k = node["rho"] * _NODE_EPS[k] / tot
        kind = _kind(k)
        if kind == "gaussian":
            out[k] = Spend(math.sqrt(2.0 * rho_k), 0.0, rho_k)
        elif kind == "stable":  # StableHist's release parameter is 4 delta_TV (toolbox.md)
            out[k] = Spend(math.sqrt(2.0 * rho_k), 4.0 * node["delta_tv"] / len(hist))
        else:
            out[k] = Spend(math.sqrt(2.0 * rho_k))
    return out


def leaf_budget(leaf: dict) -> dict[str, Spend]:
    """Per-piece budgets of one leaf from its total (``{"accountant": "basic", "epsilon",
    "delta"}`` or ``{"accountant": "zcdp", "rho", "delta_tv"}``): the pieces of the leaf's own
    ball and PGE-lite after it, or (``"full"``) PGE-lite alone with the whole leaf. Basic:
    half of delta to PGE-lite, the other half in equal parts to the ball's pieces; zcdp: the
    StableHist's release parameter is 4 delta_TV."""
    sh = _LEAF_SHARES
    ball = [key for key in sh if key != "pge"]
    if leaf["accountant"] == "basic":
        e, dl = leaf["epsilon"], leaf["delta"]
        out = {key: Spend(sh[key] * e, dl / (2 * len(ball))) for key in ball}
        out["pge"] = Spend(sh["pge"] * e, dl / 2)
        out["full"] = Spend(e, dl)
        return out
    rho = leaf["rho"]
    out = {"hist": Spend(math.sqrt(2.0 * sh["hist"] * rho), 4.0 * leaf["delta_tv"]),
           "full": Spend(math.sqrt(2.0 * rho), 0.0, rho)}
    for key in sh:
        if key != "hist":
            out[key] = Spend(math.sqrt(2.0 * sh[key] * rho), 0.0, sh[key] * rho)
    return out


def _pgme_ledger(k: int, epsilon: float, delta: float, accountant: str
                 ) -> tuple[Ledger, dict]:
    n_aff = n_affected_nodes(k)
    leaf_note = "2r mean, sqrt(2)(2r)^2 covariance"
    if accountant == "basic":
        led = Ledger(epsilon, delta)
        if k == 1:
            led.add("leaf PGE-lite", epsilon, delta, sensitivity=leaf_note)
            return led, {"node": None, "leaf": Spend(epsilon, delta), "n_aff": 0}
        node = {"accountant": "basic", "epsilon": _PARTITION * epsilon / n_aff,
                "delta": _PARTITION * delta / n_aff}
        half = (1.0 - _PARTITION) / 2.0
        leaf = {"accountant": "basic", "epsilon": half * epsilon, "delta": half * delta}
    else:
        delta_z = delta if k == 1 else ZCDP_DELTA_SHARE * delta
        led = Ledger(epsilon, delta, accountant="zcdp", delta_z=delta_z)
        rho = zcdp_rho(epsilon, delta_z)
        if k == 1:
            led.add("leaf PGE-lite", math.sqrt(2 * rho), kind="gaussian", zcdp=rho,
                    sensitivity=leaf_note)
            return led, {"node": None, "leaf": Spend(math.sqrt(2 * rho), 0.0, rho),
                         "n_aff": 0}
        tv = (delta - delta_z) / (1.0 + math.exp(epsilon))
        node = {"accountant": "zcdp", "rho": _PARTITION * rho / n_aff,
                "delta_tv": _PARTITION * tv / n_aff}
        half = (1.0 - _PARTITION) / 2.0
        leaf = {"accountant": "zcdp", "rho": half * rho, "delta_tv": half * tv}
    full = node_budget(node, True)
    n_hist = sum(_kind(p) == "stable" for p in full)
    for piece, sp in full.items():
        kind = _kind(piece)
        led.add(f"node {piece}", sp.epsilon, 0.0 if accountant == "zcdp" else sp.delta,
                multiplicity=n_aff, kind=kind if accountant == "zcdp" else "approx",
                zcdp=sp.zcdp,
                delta_tv=node.get("delta_tv", 0.0) / n_hist if kind == "stable" else 0.0,
                note="without PCA (k_node >= d) the S2-S3 shares are renormalised to the "
                     "same node total")
    lb = leaf_budget(leaf)
    zc = accountant == "zcdp"
    labels = {"hist": ("leaf ball: StableHist", "one cell per record"),
              "stage1": ("leaf ball: heavy-cell NoisySumCount", "2 rho_1"),
              "stage2": ("leaf ball: NoisySumCount around the heavy-cell mean", "2 rho_f r~"),
              "pge": ("leaf PGE-lite", leaf_note)}
    for piece in _LEAF_SHARES:
        label, sens = labels[piece]
        sp = lb[piece]
        kind = ("stable" if piece == "hist" else "gaussian") if zc else "approx"
        led.add(label, sp.epsilon, 0.0 if zc else sp.delta, multiplicity=2, kind=kind,
                zcdp=sp.zcdp, delta_tv=leaf["delta_tv"] if zc and piece == "hist" else 0.0,
                sensitivity=sens, note="a leaf inside a found terrific ball has no ball step "
                                       "and gives PGE-lite the whole leaf budget")
    return led, {"node": node, "leaf": lb, "n_aff": n_aff}


def pgme_ledger(k: int, d: int, epsilon: float, delta: float,
                accountant: str = "basic") -> tuple[Ledger, dict]:
    """Worst-path ledger from public inputs only; returns it with the node and leaf budgets.

    ``accountant``: ``basic`` (default), ``zcdp`` or ``auto`` (the one with the larger
    per-piece budgets, :func:`klrelease.privacy.ledger.choose_accountant`). The chosen name is
    ``ledger.accountant``.
    """
    _, (led, bud) = choose_accountant(
        accountant, lambda a: _pgme_ledger(k, epsilon, delta, a))
    return led.check(), bud


def _budget_piece(b: dict, prefix: str) -> dict:
    return {
        "radius": b[f"{prefix}_radius"][0], "hist": b[f"{prefix}_hist"],
        "stage1": b[f"{prefix}_stage1"], "stage2": b[f"{prefix}_stage2"],
        "check": b[f"{prefix}_check"][0],
    }


def _rounds(radius: float, pge: Spend, n_low: float, d: int, sigma_min: float) -> int:
    """PGE-lite in two rounds only when the first round's covariance, for a leaf of at least
    ``n_low`` rows (public), has per-entry noise below ``sigma_min^2 / 4``, so that it can
    shorten the second round's radius; otherwise one round at the whole budget. Public and
    released numbers only (the ball's radius is released or public)."""
    share = 1.0 / 3.0
    r_s = 2.0 * radius
    sd = gauss_sigma(math.sqrt(2.0) * r_s**2, 0.6 * share * pge.epsilon,
                     0.5 * share * pge.delta if pge.delta > 0 else 1e-12,
                     zcdp=None if pge.zcdp is None else 0.6 * share * pge.zcdp)
    return 2 if sd / max(n_low, 1.0) <= 0.25 * sigma_min**2 else 1


def learn_pgme(X, n_components: int, *, epsilon: float, delta: float,
               rng: np.random.Generator, R: float, sigma_min: float,
               sigma_max: float, w_min: float | None = None, beta: float = 0.05,
               c: float = 5.0, mult: float = 3.0, accountant: str = "basic",
               progress: bool = False) -> LearnResult:
    """Kamath et al. PGME-lite: PGME with the practical replacements of ``KAMATH.md``.

    ``R``, ``sigma_min`` and ``sigma_max`` are in the units of the data and have no default,
    so that changing the units of the features and of these bounds together keeps the
    release's quality.

    Parameters (all public)
    -----------------------
    R : bound on the norm of every component mean (required).
    sigma_min, sigma_max : bounds on the component standard deviations (required).
    w_min : lower bound on the mixing weights (default ``1/(2k)``).
    beta : failure probability (thresholds only).
    c : terrific-ball factor (paper 5).
    mult : bounding-ball multiplier ([PRACTICAL] 3, paper 12).
    accountant : ``basic`` (default), ``zcdp`` or ``auto`` (chosen from public inputs before
        the data is read; recorded in the ledger and the privacy block).
    progress : a progress bar over the ball counts.
    """
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    k = int(n_components)
    w_min = 1.0 / (2 * k) if w_min is None else float(w_min)
    ledger, bud = pgme_ledger(k, d, epsilon, delta, accountant)
    g = guarantee(ledger, "Kamath et al. PGME-lite (practical)", DOC)
    master = structure_seed(rng)
    lam = R + sigma_max * (math.sqrt(d) + math.sqrt(2.0 * math.log(n / beta)))
    t = max(1, int(n * w_min / 2))
    diag: dict = {"ledger": ledger.to_dict(), "n": n, "d": d, "k": k, "t": t,
                  "truncation_radius": lam, "nodes": [], "leaves": []}
    if k > 1:
        # Public preflight (n, k, d, eps, beta only): with t <= Gamma the terrific-radius
        # threshold is vacuous even on the shortest grid, and a heavy cell can never reach the
        # stable-histogram threshold when it exceeds n; the run then cannot split.
        b0 = node_budget(bud["node"], k < d)
        gamma_min = radius_slack(b0["s3_radius"][0], 1, beta)  # the shortest grid
        tau_h = stable_histogram_threshold(*b0["s3_hist"])
        diag["preflight"] = {"gamma_min": gamma_min, "stable_hist_threshold": tau_h}
        if t <= gamma_min or tau_h >= n:
            return fail(NAME, g, "preflight",
                        f"target size t = n*w_min/2 = {t} must exceed the terrific-radius "
                        f"slack Gamma >= {gamma_min:.4g} and n={n} the stable-histogram "
                        f"threshold {tau_h:.4g} (k={k}, d={d}, eps={epsilon:g}); decided "
                        "from public numbers only", diag)
    Xt = X[within(X, np.zeros(d), lam)]
    L_orig = math.sqrt(d) * sigma_min / 2.0
    leaves: list[tuple[np.ndarray, Ball]] = []

    r_comp = _LEAF_SCALE * sigma_max * math.sqrt(d)  # public: the scale of one component

    def own_ball(S: np.ndarray, inherited: Ball, path: str) -> Ball:
        """A ball of the leaf's own: GoodCenter-lite at the scale of one component, radius
        ``_LEAF_RHO r~``; the inherited ball when it releases bottom."""
        lb = bud["leaf"]
        p = good_center_lite(S, r_comp, {key: lb[key] for key in ("hist", "stage1", "stage2")
                                         if key in lb}, _LEAF_RHO,
                             structure_rng(master, path + "/leaf"), rng)
        diag["leaves"].append({"path": path, "own_ball": p is not None})
        return inherited if p is None else Ball(np.asarray(p, dtype=np.float64),
                                                _LEAF_RHO * r_comp)

    def rpgmp(S: np.ndarray, k_node: int, ball: Ball, path: str, own: bool = False) -> None:
        if k_node == 1:
            leaves.append((S, ball, "full") if own else (S, own_ball(S, ball, path), "pge"))
            return
        with_pca = k_node < d
        b = node_budget(bud["node"], with_pca)
        struct = structure_rng(master, path)
        n_prime = laplace_count(len(S), b["count"][0], rng) - n * w_min / 20.0
        bb = bounding_ball_lite(S, n_prime, ball, {"centre": b["bb_centre"],
                                "radius": b["bb_radius"][0]}, L_orig, mult, rng)
        S = S[within(S, bb.centre, bb.radius)]
        rec = {"path": path, "k_node": k_node, "bounding_radius": bb.radius}
        found = pterrific_ball(S, t, c, False, _budget_piece(b, "s3"), bb.radius, L_orig, beta,
                               struct, rng, progress=progress)
        if found is not None:
            rec.update(outcome="split (original space)", ball_radius=found.radius)
            diag["nodes"].append(rec)
            dist2 = np.sum((S - found.centre) ** 2, axis=1) if len(S) else np.zeros(0)
            A = S[dist2 <= found.radius**2]
            B = S[dist2 > (c * found.radius) ** 2]
            rpgmp(A, k_node - 1, found, path + "A", own=True)
            rpgmp(B, k_node - 1, bb, path + "B")
            return
        if with_pca:
            pe, pd = b["pca"]
            V = private_pca(S, bb.centre, bb.radius, k_node, pe, pd, rng, zcdp=b["pca"].zcdp)
            Z = (S - bb.centre) @ V
            L_proj = math.sqrt(k_node) * sigma_min / 2.0
            found = pterrific_ball(Z, t, c, True, _budget_piece(b, "s6"), bb.radius, L_proj,
                                   beta, struct, rng, progress=progress)
            if found is not None:
                rec.update(outcome="split (projected space)", ball_radius=found.radius)
                diag["nodes"].append(rec)
                dist2 = np.sum((Z - found.centre) ** 2, axis=1) if len(Z) else np.zeros(0)
                rpgmp(S[dist2 <= found.radius**2], k_node - 1, bb, path + "A")
                rpgmp(S[dist2 > (c * found.radius) ** 2], k_node - 1, bb, path + "B")
                return
        rec["outcome"] = "leaf (no terrific ball)"
        diag["nodes"].append(rec)
        leaves.append((S, bb, "full"))  # a node's own bounding ball

    try:
        rpgmp(Xt, k, Ball(np.zeros(d), lam), "root", own=True)
        est = []
        for C, ball, share in leaves:
            pge = bud["leaf"] if k == 1 else bud["leaf"][share]
            mu, Sig, cnt = pge_lite(C, ball, *pge, _rounds(ball.radius, pge, n * w_min, d,
                                                           sigma_min), beta, sigma_min**2,
                                    4.0 * sigma_max**2, rng, zcdp=pge.zcdp)
            est.append((cnt, mu, Sig))
    except np.linalg.LinAlgError:
        # LAPACK's eigensolver not converging on a released matrix: post-processing of released
        # values (KAMATH.md); any other exception is a defect and raises
        return fail(NAME, g, "numerics", "a numerical step failed; no output is released",
                    {"ledger": ledger.to_dict(), "n": n, "d": d, "k": k})
    counts = [float(e[0]) for e in est]
    diag["leaf_noisy_counts"] = counts
    floor = n * w_min / 4.0
    keep = sorted([e for e in est if e[0] >= floor], key=lambda e: -e[0])[:k]
    diag["components_found"] = len(keep)
    if len(keep) < k:
        return fail(
            NAME, g, "partition",
            f"{len(keep)} of k={k} leaves have a released count >= n*w_min/4 = {floor:.4g} "
            f"(n={n}, d={d}, eps={epsilon:g}, leaves={len(leaves)}, "
            f"noisy leaf counts {[round(x, 1) for x in counts]})",
            diag,
        )
    w = np.array([e[0] for e in keep])
    return success(NAME, g, w / w.sum(), [e[1] for e in keep], [e[2] for e in keep], diag)


register_learner(NAME, learn_pgme)
register_alias(OLD_NAME, NAME)
