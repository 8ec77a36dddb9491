"""``klrelease experiment learners-regimes``: the learners for unlabelled data side by side.

Learners: ``dp-em`` (the certified EM of ``klrelease/learners/dpem``), ``park-dp-em`` (the
published DP-EM recipe of Park et al. 2017, its comparison point), ``kamath-pgme-lite``,
``kamath-sa-lite`` and the Afzali-style learner, on synthetic mixtures of k spherical unit
Gaussians with equal weights:

* **separated**: means on a circle (first two coordinates) with minimum pairwise distance
  ``25 (1 + sqrt(d))`` standard deviations (the terrific-ball tests of PGME need tens of sigma
  in low dimension);
* **overlapping**: the same layout with minimum distance 3 standard deviations;

it records FAIL (with its stage), the parameter error of a returned model (components matched
to the true ones by the Hungarian algorithm on mean distances; largest mean error in units of
sigma, largest weight error) and the KL divergence of the returned model to the non-private
labelled fit: learned components are matched to classes by the Hungarian algorithm on the
matrix of component KL divergences ``KL(N_learned_j || N_class_i)``, then the labelled
``KL(learned || reference)`` of :func:`klrelease.kl.kl_divergence` is computed. Beside it, on
the same data: ``E[KL]`` of the labelled mechanisms (which see the labels; 10 draws), and on
the overlapping mixtures the KL of the non-private k-means++ start alone (scikit-learn's
``kmeans_plusplus`` seeds, every row assigned to its nearest seed, weights, means and
covariances of those groups: what ``GaussianMixture(init_params="k-means++")`` starts from).
The expected start of the Kamath and Afzali learners (design tables of section 2.8 and 3.8 at
eps = 1, scaled by 1/eps) is a column of the CSV. The public a-priori bounds given to the
learners are those the design prescribes for synthetic benchmarks: ``R = 1.2 max ||mu||``,
``sigma_min = 0.5``, ``sigma_max = 2``. Runs are seeded: experiments, not certified releases.

The Kamath and Afzali learners run with ``accountant="auto"`` (basic or zCDP, whichever gives
the larger per-piece budgets; the choice is a column of the CSV); ``dp-em`` is composed in
GDP, ``park-dp-em`` in zCDP (its recipe). The labelled mechanisms run under the learners'
neighbouring relation, replace-one (``adjacency="replace-one"`` with the public norm bound
``R + 2 (sqrt(d) + 3)``); their default, label flip, treats the features as public and is not
comparable. Seeds are functions of the cell (setting, k, d, eps, N), so a cell gives the same
data and the same result whatever else the grid holds.

Grid (``_grid``), in the order it runs: N = 1e3 and 1e4 for every k in {2, 3, 5}, d in
{2, 5, 10}, eps in {1, 4}, separated and overlapping, every learner; N = 1e5 for the same 36
cells without PGME-lite; N = 1e6 for the 18 separated cells and one overlapping cell
(k = d = 2, eps = 4) without PGME-lite; then PGME-lite at N = 1e5 on the cells of ``PGME_1E5``.
PGME-lite's radius queries are O(N^2) (a KD-tree in d <= 2 does not change the order): a k = 3
cell at 1e5 takes 4-6 min, so it runs at 1e5 only where it answers the question of where it
starts to work, and not at 1e6 (``PGME_1E6_REASON``, measured). One trial per cell. A wall
budget stops the run between cells; every cell or learner not run is listed with its reason in
the JSON (``not_run``). The warm-up PEGME is left out (its model, means within
``2 k sqrt(d) kappa sigma_min`` of the origin, does not match these mixtures).

Then, PGME-lite in its paper's separation regime (``run_pgme_regime``): k = 2 components
``100 (sigma_1 + sigma_2) (sqrt(k ln N) + 2 sqrt(k))`` apart (KSSU eq. 6 with w = 1/2),
N = 2e4, eps = 1, d in {2, 5, 10}, five seeds each; the largest matched mean error per run.
The target checks (``targets``) are computed from the rows and written to the JSON and to
``learners_regimes_tables.md`` with the per-cell tables.

``klrelease experiment information-limit`` (:func:`run_information_limit`) then measures, on the
overlapping cells at N >= 1e5, how far non-private maximum-likelihood EM on the same rows is
from the labelled fit: what a learner that converges to the maximum-likelihood fit loses to a
labelled release at any budget.
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["run_learners_regimes", "run_information_limit", "expected_start", "GRID_LEARNERS"]

PGME = "kamath-pgme-lite"
GRID_LEARNERS = ("dp-em", "park-dp-em", PGME, "kamath-sa-lite", "afzali-style-sample-aggregate")
COMPARE_MECHANISMS = ("gaussian-iid", "kl-certified")
#: The non-private k-means++ start (overlapping cells): a row of the CSV, kind "non-private".
KMEANS_START = "k-means++ start (non-private)"
BLOCK_LEARNERS = tuple(n for n in GRID_LEARNERS if n != PGME)

#: PGME cells at N = 1e5 (setting, k, d, eps): every separated cell in d = 2 (exact KD-tree
#: counts, about a minute each) and one overlapping; in d = 5, 10 (chunked pairs, 3-6 min
#: each) the cells where the design table puts its start near 1e5 at eps = 1.
PGME_1E5 = (("separated", 5, 2, 4.0), ("separated", 3, 2, 1.0), ("separated", 2, 10, 1.0),
            ("separated", 5, 2, 1.0), ("separated", 2, 2, 1.0), ("separated", 2, 2, 4.0),
            ("separated", 3, 2, 4.0), ("overlapping", 2, 2, 4.0), ("separated", 3, 5, 1.0))

#: Why PGME-lite is not run at N = 1e6 (measured on this machine, shared, nice 10).
PGME_1E6_REASON = (
    "PGME's radius queries count, for every point, the points within each grid radius: "
    "O(N^2) pairs. Measured at N = 1e5 (k = 3, separated): one terrific-radius query over all "
    "radii by the chunked pairs 188-339 s (d = 10 / 5), extrapolated x100 to 5-9 h at 1e6; "
    "by the KD-tree (d = 2, one count per radius) the same query extrapolated from 5000 of "
    "1e6 candidates takes 1494 s at 1e6, x2 for the exact two-sided check, and a k = 3 run "
    "makes at least three such queries: hours, not minutes. Not run at 1e6."
)

#: Default wall budget of the full grid (seconds): cells after it are not run (listed).
WALL_BUDGET = 4500.0

# Design tables (eps = 1, delta = 1e-6): smallest N where the learner can start to work.
_PGME = {(2, 2): 1.1e4, (2, 5): 2.1e4, (2, 10): 2.1e4, (3, 2): 4.9e4, (3, 5): 9.4e4,
         (3, 10): 9.4e4, (5, 2): 1.9e5, (5, 5): 1.9e5, (5, 10): 3.6e5}
_SA = {(2, 2): 1.3e5, (2, 5): 2.7e5, (2, 10): 4.9e5, (3, 2): 3.0e5, (3, 5): 6e5,
       (3, 10): 1.1e6, (5, 2): 8e5, (5, 5): 1.7e6, (5, 10): 3e6}
_AAL = {(2, 2): 2e4, (3, 2): 3e4, (5, 2): 5e4, (2, 5): 8e4, (3, 5): 1.1e5, (2, 10): 2.4e5}


#: the target of the labelled comparison: dp-em within this factor of labelled kl-certified
LABELLED_FACTOR = 3.0


def expected_start(learner: str, k: int, d: int, eps: float) -> float | None:
    """Design-table N at which ``learner`` can start to work (None: not tabulated)."""
    table = {PGME: _PGME, "kamath-sa-lite": _SA,
             "afzali-style-sample-aggregate": _AAL}.get(learner)
    if table is None:
        return None
    v = table.get((k, d))
    return None if v is None else v / eps


@dataclass(frozen=True)
class Cell:
    setting: str
    k: int
    d: int
    eps: float
    n: int
    learners: tuple = GRID_LEARNERS

    @property
    def key(self) -> tuple:
        return (self.setting, self.k, self.d, self.eps, self.n)

    def seed(self, trial: int) -> list[int]:
        """Seed of the cell's data and runs: a function of the cell only."""
        return [20261122, ("separated", "overlapping").index(self.setting), self.k, self.d,
                int(round(self.eps * 1000)), self.n, trial]


def _grid(quick: bool) -> list[Cell]:
    if quick:
        return [Cell("separated", 2, 2, 4.0, 2000), Cell("overlapping", 2, 2, 4.0, 2000)]
    kde = [(k, d, e) for k in (2, 3, 5) for d in (2, 5, 10) for e in (1.0, 4.0)]
    cells = [Cell(s, k, d, e, n) for n in (1000, 10000) for s in ("separated", "overlapping")
             for k, d, e in kde]
    cells += [Cell(s, k, d, e, 100000, BLOCK_LEARNERS)
              for s in ("separated", "overlapping") for k, d, e in kde]
    big = [("separated", k, d, e) for e in (1.0, 4.0) for k in (2, 3, 5) for d in (2, 5, 10)]
    big += [("overlapping", 2, 2, 4.0)]
    cells += [Cell(s, k, d, e, 1_000_000, BLOCK_LEARNERS) for s, k, d, e in big]
    cells += [Cell(s, k, d, e, 100000, (PGME,)) for s, k, d, e in PGME_1E5]
    return cells


def _not_run(cells: list[Cell]) -> list[dict]:
    """The learners the grid does not run on its cells, with the reason (public)."""
    out = []
    pgme_cells = {c.key for c in cells if PGME in c.learners}
    for c in cells:
        if c.n == 1_000_000 and PGME not in c.learners:
            out.append({"cell": list(c.key), "learner": PGME, "reason": PGME_1E6_REASON})
        elif c.n == 100000 and c.key not in pgme_cells:
            out.append({"cell": list(c.key), "learner": PGME,
                        "reason": "wall budget: PGME-lite runs at 1e5 only on the cells of "
                                  "PGME_1E5 (3-6 min each in d = 5, 10)"})
    return out


def _means(setting: str, k: int, d: int) -> np.ndarray:
    sep = 25.0 * (1.0 + math.sqrt(d)) if setting == "separated" else 3.0
    radius = sep / (2.0 * math.sin(math.pi / k))
    ang = 2.0 * math.pi * np.arange(k) / k
    M = np.zeros((k, d))
    M[:, 0], M[:, 1] = radius * np.cos(ang), radius * np.sin(ang)
    return M


def cell_data(cell: Cell, trial: int):
    """A cell's data, a function of the cell and the trial only: ``(rng, means, weights, z, X,
    R)``, ``rng`` the cell's generator after drawing them (the learners' seeds come next), ``z``
    the true components (every component holds at least ``d + 2`` rows), ``R`` the public
    radius given to the learners."""
    rng = np.random.default_rng(cell.seed(trial))
    means = _means(cell.setting, cell.k, cell.d)
    weights = np.full(cell.k, 1.0 / cell.k)
    z = rng.integers(0, cell.k, cell.n)
    z[: cell.k * (cell.d + 2)] = np.repeat(np.arange(cell.k), cell.d + 2)
    X = means[z] + rng.normal(size=(cell.n, cell.d))
    R = 1.2 * float(np.linalg.norm(means, axis=1).max())
    return rng, means, weights, z, X, R


def _options(learner: str, R: float, quick: bool) -> dict:
    if learner == "dp-em":
        return {"R": R, "sigma_min": 0.5, "sigma_max": 2.0}
    if learner == "park-dp-em":
        return {"R": R, "sigma_max": 2.0}
    base = {PGME: {"R": R, "sigma_min": 0.5, "sigma_max": 2.0},
            "kamath-sa-lite": {"R": R, "sigma_min": 0.5, "sigma_max": 2.0, "n_init": 1},
            "afzali-style-sample-aggregate": {"sigma_max": 2.0, "r_init": 3}}
    return {**base[learner], "accountant": "auto"}


def kmeans_start(X, k: int, seed: int):
    """The non-private k-means++ start: scikit-learn's seeds, every row to its nearest seed,
    the groups' weights, means and covariances (a group with fewer than d + 1 rows: its seed
    and the identity)."""
    from sklearn.cluster import kmeans_plusplus

    from ..gmm import GMM

    n, d = X.shape
    from sklearn.metrics import pairwise_distances_argmin

    seeds, _ = kmeans_plusplus(X, k, random_state=seed)
    lab = pairwise_distances_argmin(X, seeds)
    w = np.bincount(lab, minlength=k) / n
    means = np.array([X[lab == j].mean(0) if np.any(lab == j) else seeds[j] for j in range(k)])
    covs = np.array([np.cov(X[lab == j].T).reshape(d, d) + 1e-9 * np.eye(d)
                     if np.sum(lab == j) > d else np.eye(d) for j in range(k)])
    w = np.maximum(w, 1e-12)
    return GMM(w / w.sum(), means, covs)


def _match_error(gmm, means, weights):
    from scipy.optimize import linear_sum_assignment

    cost = np.linalg.norm(gmm.means[:, None] - means[None], axis=2)
    r, c = linear_sum_assignment(cost)
    return float(cost[r, c].max()), float(np.abs(gmm.weights[r] - weights[c]).max())


def _matched_kl(gmm, reference):
    from scipy.optimize import linear_sum_assignment

    from ..gmm import GMM
    from ..kl import gaussian_kl, kl_divergence

    k = reference.n_components
    cost = np.array([[gaussian_kl(gmm.means[j], gmm.covariances[j], reference.means[i],
                                  reference.covariances[i]) for i in range(k)]
                     for j in range(k)])
    rows, cols = linear_sum_assignment(cost)
    order = rows[np.argsort(cols)]
    matched = GMM(gmm.weights[order], gmm.means[order], gmm.covariances[order],
                  classes=reference.classes)
    return kl_divergence(matched, reference)


def _compare(X, z, cell, reference, R, rng):
    from ..kl import kl_divergence
    from ..release import plan as make_plan

    out = {}
    bound = R + 2.0 * (math.sqrt(cell.d) + 3.0)
    for mech in COMPARE_MECHANISMS:
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # the learners' relation (replace-one, n public): the norm bound is public
                p = make_plan(X, z, epsilon=cell.eps, delta=1e-6, mechanism=mech,
                              norm_bound=bound, adjacency="replace-one")
                kls = [kl_divergence(p.draw(rng), reference) for _ in range(10)]
            out[mech] = {"status": "ok", "kl": float(np.mean(kls)),
                         "seconds": time.perf_counter() - t0}
        except Exception as exc:  # recorded, never dropped
            out[mech] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:200],
                         "seconds": time.perf_counter() - t0}
    return out


def run_learners_regimes(out: Path = Path("experiments"), *, quick: bool = False,
                         trials: int | None = None, progress: bool = True,
                         wall_budget: float | None = None) -> dict:
    """Run the grid; write CSV, PNG and JSON to ``out/learners_regimes``; return the summary.

    ``wall_budget`` (seconds; default ``WALL_BUDGET`` for the full grid, none for ``quick``):
    no cell starts after it; the cells not run are listed in the JSON.
    """
    from ..gmm import fit_gmm
    from ..learners import learn

    trials = trials or 1
    folder = Path(out) / "learners_regimes"
    folder.mkdir(parents=True, exist_ok=True)
    cells = _grid(quick)
    budget = wall_budget if wall_budget is not None else (None if quick else WALL_BUDGET)
    rows: list[dict] = []
    not_run = _not_run(cells)
    compared: set = set()
    t_start = time.perf_counter()
    cpu_start = time.process_time()
    for ci, cell in enumerate(cells):
        if budget is not None and time.perf_counter() - t_start > budget:
            not_run += [{"cell": list(cell.key), "learner": name,
                         "reason": f"wall budget of {budget:g} s reached before this cell"}
                        for name in cell.learners]
            continue
        for trial in range(trials):
            rng, means, weights, z, X, R = cell_data(cell, trial)
            reference = fit_gmm(X, z)
            common = {"setting": cell.setting, "k": cell.k, "d": cell.d, "epsilon": cell.eps,
                      "delta": 1e-6, "n": cell.n, "trial": trial}
            seeds = {name: int(rng.integers(2**31)) for name in GRID_LEARNERS}
            ran = []
            for name in cell.learners:
                t0 = time.perf_counter()
                res = learn(X, cell.k, epsilon=cell.eps, delta=1e-6, learner=name,
                            seed=seeds[name], **_options(name, R, quick))
                row = {**common, "learner": name, "kind": "unlabelled learner",
                       "accountant": res.diagnostics.get("ledger", {}).get("accountant", ""),
                       "status": "FAIL" if res.failed else "ok", "stage": res.stage or "",
                       "seconds": round(time.perf_counter() - t0, 3),
                       "expected_start_n": expected_start(name, cell.k, cell.d, cell.eps),
                       "mean_error_sigma": None, "weight_error": None, "kl": None}
                if res.ok:
                    row["mean_error_sigma"], row["weight_error"] = _match_error(
                        res.gmm, means, weights)
                    try:
                        row["kl"] = _matched_kl(res.gmm, reference)
                    except (ValueError, np.linalg.LinAlgError):
                        row["kl"] = None
                rows.append(row)
                ran.append(row)
                if progress:
                    print(f"[{ci + 1}/{len(cells)}] {cell.key} {name}: {row['status']} "
                          f"{row['stage']} {row['seconds']:.1f}s", file=sys.stderr, flush=True)
            if cell.setting == "overlapping" and "dp-em" in cell.learners:
                t0 = time.perf_counter()
                start = kmeans_start(X, cell.k, int(rng.integers(2**31)))
                rows.append({**common, "learner": KMEANS_START, "kind": "non-private",
                             "accountant": "", "status": "ok", "stage": "",
                             "seconds": round(time.perf_counter() - t0, 3),
                             "expected_start_n": None, **dict(zip(
                                 ("mean_error_sigma", "weight_error"),
                                 _match_error(start, means, weights), strict=True)),
                             "kl": _matched_kl(start, reference)})
            if any(r["status"] == "ok" for r in ran) and (cell.key, trial) not in compared:
                compared.add((cell.key, trial))
                cmp_rng = np.random.default_rng(cell.seed(trial) + [1])
                for mech, rec in _compare(X, z, cell, reference, R, cmp_rng).items():
                    rows.append({**common, "learner": mech, "kind": "labelled mechanism",
                                 "accountant": "",
                                 "status": rec["status"], "stage": rec.get("error", ""),
                                 "seconds": round(rec["seconds"], 3), "expected_start_n": None,
                                 "mean_error_sigma": None, "weight_error": None,
                                 "kl": rec.get("kl")})
    regime = [] if quick else run_pgme_regime(progress=progress)
    wall = time.perf_counter() - t_start
    cpu = time.process_time() - cpu_start
    summary = _summarise(rows)
    checks = targets(rows, regime)
    _write(folder, rows, summary, cells, trials, quick, wall, cpu, not_run, budget, regime,
           checks)
    return summary


def run_pgme_regime(*, n: int = 20000, eps: float = 1.0, dims=(2, 5, 10), seeds: int = 5,
                    progress: bool = True) -> list[dict]:
    """PGME-lite in its paper's separation regime (KSSU eq. 6 with k = 2, w = 1/2):
    ``100 (1 + 1) (sqrt(2 ln N) + 2 sqrt(2))`` standard deviations apart, N = 2e4, eps = 1."""
    from ..learners import learn

    k = 2
    sep = 100.0 * 2.0 * (math.sqrt(k * math.log(n)) + 2.0 * math.sqrt(k))
    out = []
    for d in dims:
        for seed in range(seeds):
            rng = np.random.default_rng([20261123, d, seed])
            means = np.zeros((k, d))
            means[:, 0] = [-sep / 2.0, sep / 2.0]
            X = means[rng.integers(0, k, n)] + rng.normal(size=(n, d))
            t0 = time.perf_counter()
            res = learn(X, k, epsilon=eps, delta=1e-6, learner=PGME, seed=seed,
                        R=1.2 * sep / 2.0, sigma_min=0.5, sigma_max=2.0)
            rec = {"d": d, "seed": seed, "n": n, "epsilon": eps, "separation_sigma": sep,
                   "status": "FAIL" if res.failed else "ok", "stage": res.stage or "",
                   "seconds": round(time.perf_counter() - t0, 2), "max_mean_error_sigma": None,
                   "mean_errors_sigma": None}
            if res.ok:
                cost = np.linalg.norm(res.gmm.means[:, None] - means[None], axis=2)
                from scipy.optimize import linear_sum_assignment

                r, c = linear_sum_assignment(cost)
                rec["mean_errors_sigma"] = [float(x) for x in cost[r, c]]
                rec["max_mean_error_sigma"] = float(cost[r, c].max())
            out.append(rec)
            if progress:
                print(f"PGME-lite regime d={d} seed={seed}: {rec['status']} "
                      f"{rec['max_mean_error_sigma']}", file=sys.stderr, flush=True)
    return out


#: The cells of the separated-mixture target (k = 2, 3; d = 2, 5, 10; eps = 1, 4).
TARGET_K, TARGET_N = (2, 3), (10000, 100000, 1000000)


def targets(rows: list[dict], regime: list[dict]) -> dict:
    """The targets measured from the rows: dp-em's model rate at N >= 1e4; its KL against
    every other learner's on the separated cells (k = 2, 3), against the k-means++ start on the
    overlapping cells and against kl-certified (labelled, replace-one) at N >= 1e5; PGME-lite's
    matched mean errors in its regime."""
    by_cell: dict = {}
    for r in rows:
        key = (r["setting"], r["k"], r["d"], r["epsilon"], r["n"], r["trial"])
        by_cell.setdefault(key, {})[r["learner"]] = r
    dp = [r for r in rows if r["learner"] == "dp-em" and r["n"] >= 10000]
    sep, ovl, lab = [], [], []
    for key, cell in sorted(by_cell.items()):
        me = cell.get("dp-em")
        if me is None or me["kl"] is None:
            continue
        setting, k, d, eps, n, _ = key
        if setting == "separated" and k in TARGET_K and n in TARGET_N:
            others = {name: r["kl"] for name, r in cell.items()
                      if r["kind"] == "unlabelled learner" and name != "dp-em"}
            returned = {a: b for a, b in others.items() if b is not None}
            best = min(returned.values()) if returned else None
            sep.append({"k": k, "d": d, "epsilon": eps, "n": n, "dp_em_kl": me["kl"],
                        "best_other": min(returned, key=returned.get) if returned else None,
                        "best_other_kl": best, "others_failed": sorted(set(others) -
                                                                        set(returned)),
                        "ratio": None if best is None else best / me["kl"],
                        "met": best is None or best >= 2.0 * me["kl"]})
        if setting == "overlapping" and KMEANS_START in cell:
            kk = cell[KMEANS_START]["kl"]
            ovl.append({"k": k, "d": d, "epsilon": eps, "n": n, "dp_em_kl": me["kl"],
                        "kmeans_start_kl": kk, "met": me["kl"] < kk})
        kc = cell.get("kl-certified")
        if n >= 100000 and kc is not None and kc.get("kl") is not None:
            lab.append({"setting": setting, "k": k, "d": d, "epsilon": eps, "n": n,
                        "trial": key[5],
                        "dp_em_kl": me["kl"], "kl_certified_kl": kc["kl"],
                        "ratio": me["kl"] / kc["kl"],
                        "met": me["kl"] <= LABELLED_FACTOR * kc["kl"]})
    ok_regime = [r for r in regime if r["status"] == "ok"]
    return {
        "dp_em_model_rate_n_ge_1e4": {"runs": len(dp),
                                      "models": sum(r["status"] == "ok" for r in dp)},
        "separated_2x_below_every_other_learner": {
            "cells": len(sep), "met": sum(c["met"] for c in sep), "detail": sep},
        "overlapping_below_kmeans_start": {
            "cells": len(ovl), "met": sum(c["met"] for c in ovl), "detail": ovl},
        "within_3x_of_kl_certified_n_ge_1e5": {
            "cells": len(lab), "met": sum(c["met"] for c in lab), "detail": lab},
        "pgme_lite_regime_within_1_sigma": {
            "runs": len(regime), "models": len(ok_regime),
            "met": sum(r["max_mean_error_sigma"] < 1.0 for r in ok_regime),
            "largest_error_sigma": max((r["max_mean_error_sigma"] for r in ok_regime),
                                       default=None), "detail": regime},
    }


def _summarise(rows):
    groups: dict = {}
    for r in rows:
        if r["kind"] != "unlabelled learner":
            continue
        key = (r["learner"], r["setting"], r["epsilon"], r["n"])
        groups.setdefault(key, []).append(r)
    out = []
    for (name, setting, eps, n), rs in sorted(groups.items()):
        ok = [r for r in rs if r["status"] == "ok"]
        exp_ok = [r for r in rs if r["expected_start_n"] is not None
                  and r["n"] >= r["expected_start_n"]]
        out.append({
            "learner": name, "setting": setting, "epsilon": eps, "n": n, "runs": len(rs),
            "fail_rate": 1 - len(ok) / len(rs),
            "median_mean_error_sigma": (float(np.median([r["mean_error_sigma"] for r in ok]))
                                        if ok else None),
            "runs_where_table_expects_success": len(exp_ok),
            "successes_where_table_expects_success": sum(r["status"] == "ok" for r in exp_ok),
            "successes_where_table_expects_failure": sum(
                r["status"] == "ok" for r in rs if r not in exp_ok),
        })
    return out


def plot_summary(summary: list[dict], path: Path) -> None:
    """FAIL rate and median matched mean error against N (one colour per learner)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = dict(zip(GRID_LEARNERS, ("tab:red", "tab:purple", "tab:blue", "tab:orange",
                                       "tab:green"), strict=True))
    fig, axes = plt.subplots(2, 2, figsize=(11, 9))
    for j, setting in enumerate(("separated", "overlapping")):
        for name in GRID_LEARNERS:
            for eps, style in ((1.0, "-"), (4.0, "--")):
                pts = sorted((s["n"], s["fail_rate"], s["median_mean_error_sigma"])
                             for s in summary if s["learner"] == name
                             and s["setting"] == setting and s["epsilon"] == eps)
                if not pts:
                    continue
                kw = {"color": colours[name], "linestyle": style, "marker": "o",
                      "label": f"{name}, eps={eps:g}"}
                axes[0, j].plot([p[0] for p in pts], [p[1] for p in pts], **kw)
                err = [(p[0], p[2]) for p in pts if p[2] is not None]
                if err:
                    axes[1, j].plot([e[0] for e in err], [e[1] for e in err], **kw)
        axes[0, j].set(xscale="log", xlabel="N", ylabel="FAIL rate", ylim=(-0.05, 1.05),
                       title=f"{setting}: FAIL rate over the (k, d) cells run at each N")
        axes[1, j].set(xscale="log", yscale="log", title=f"{setting}: median mean error",
                       xlabel="N", ylabel="max matched mean error / sigma")
    handles, labels = [], []
    for ax in axes.ravel():  # one legend below the panels: it covers no curve
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=7, frameon=False,
               bbox_to_anchor=(0.5, 0.025))
    fig.text(0.5, 0.005, "PGME-lite at N = 1e5 on the cells of PGME_1E5 only, not at 1e6; "
             "N = 1e6: all separated cells and one overlapping cell (k = d = 2, eps = 4)",
             ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write(folder, rows, summary, cells, trials, quick, wall, cpu, not_run=(), budget=None,
           regime=(), checks=None):
    import csv

    keys = list(rows[0])
    with open(folder / "learners_regimes.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys})
    plot_summary(summary, folder / "learners_regimes.png")
    info = {
        "experiment": "learners-regimes",
        "command": "klrelease experiment learners-regimes" + (" --quick" if quick else "")
        + (f" --trials {trials}" if trials != 1 else ""),
        "description": __doc__,
        "learners": list(GRID_LEARNERS), "compared_mechanisms": list(COMPARE_MECHANISMS),
        "cells": len(cells), "trials": trials, "wall_seconds": round(wall, 1),
        "wall_budget_seconds": budget, "not_run": list(not_run),
        "labelled_relation": "replace-one (norm_bound = R + 2 (sqrt(d) + 3))",
        "learner_accountant": "auto",
        "cpu_seconds": round(cpu, 1), "python": platform.python_version(),
        "seeded": True, "certified": False,
        "summary": summary, "targets": checks,
    }
    (folder / "learners_regimes.json").write_text(json.dumps(info, indent=2))
    (folder / "learners_regimes_tables.md").write_text(tables(rows, checks or {}, regime))


def _short(name: str) -> str:
    return {"kamath-pgme-lite": "PGME-lite", "kamath-sa-lite": "SA-lite",
            "afzali-style-sample-aggregate": "Afzali-style", "park-dp-em": "Park DP-EM",
            KMEANS_START: "k-means++ start"}.get(name, name)


def _fmt(x) -> str:
    return "–" if x is None else f"{x:.2g}"


def tables(rows: list[dict], checks: dict, regime=()) -> str:
    """The per-cell tables and the target checks as markdown (written beside the CSV)."""
    ns = sorted({r["n"] for r in rows})
    cell_of: dict = {}
    for r in rows:
        cell_of[(r["learner"], r["setting"], r["k"], r["d"], r["epsilon"], r["n"])] = r
    names = [*GRID_LEARNERS, KMEANS_START, "kl-certified"]
    out = ["# learners-regimes: KL to the labelled non-private fit, per cell",
           "",
           "Generated by `klrelease experiment learners-regimes` from `learners_regimes.csv`. "
           "A number is the KL divergence of the returned model to the labelled non-private "
           "fit (components matched to classes); F(stage) = FAIL; – = not run. kl-certified "
           "and k-means++ start: see the module docstring (labelled, 10 draws; non-private).",
           ""]
    for setting in ("separated", "overlapping"):
        for eps in sorted({r["epsilon"] for r in rows}):
            out += [f"## {setting}, eps = {eps:g}", "",
                    "| learner | k | d | " + " | ".join(f"N = {n:.0e}" for n in ns) + " |",
                    "|---|---|---|" + "---|" * len(ns)]
            for name in names:
                for k in (2, 3, 5):
                    for d in (2, 5, 10):
                        cells = [cell_of.get((name, setting, k, d, eps, n)) for n in ns]
                        if not any(cells):
                            continue
                        txt = []
                        for c in cells:
                            if c is None:
                                txt.append("–")
                            elif c["status"] != "ok":
                                txt.append(f"F({c['stage'][:12]})")
                            else:
                                txt.append(_fmt(c["kl"]))
                        out.append(f"| {_short(name)} | {k} | {d} | " + " | ".join(txt) + " |")
            out.append("")
    if checks:
        out += ["## Targets", ""]
        mr = checks["dp_em_model_rate_n_ge_1e4"]
        out.append(f"* dp-em returned a model in {mr['models']} of {mr['runs']} runs at "
                   "N >= 1e4.")
        for key, words in (("separated_2x_below_every_other_learner",
                            "separated cells (k = 2, 3; N = 1e4..1e6): KL at least 2x below "
                            "every other learner's"),
                           ("overlapping_below_kmeans_start",
                            "overlapping cells: KL below the k-means++ start's"),
                           ("within_3x_of_kl_certified_n_ge_1e5",
                            f"N >= 1e5: KL within {LABELLED_FACTOR:g}x of labelled "
                            "kl-certified's")):
            c = checks[key]
            out.append(f"* {words}: {c['met']} of {c['cells']} cells.")
        out += ["", "| cell (k, d, eps, N) | dp-em KL | best other learner | its KL | ratio |",
                "|---|---|---|---|---|"]
        for c in checks["separated_2x_below_every_other_learner"]["detail"]:
            out.append(f"| {c['k']}, {c['d']}, {c['epsilon']:g}, {c['n']:.0e} | "
                       f"{_fmt(c['dp_em_kl'])} | {_short(c['best_other'] or 'all FAIL')} | "
                       f"{_fmt(c['best_other_kl'])} | {_fmt(c['ratio'])} |")
        out += ["", "| overlapping cell (k, d, eps, N) | dp-em KL | k-means++ start KL |",
                "|---|---|---|"]
        for c in checks["overlapping_below_kmeans_start"]["detail"]:
            out.append(f"| {c['k']}, {c['d']}, {c['epsilon']:g}, {c['n']:.0e} | "
                       f"{_fmt(c['dp_em_kl'])} | {_fmt(c['kmeans_start_kl'])} |")
        out += ["", "| cell (setting, k, d, eps, N) | dp-em KL | kl-certified E[KL] | "
                    "ratio |", "|---|---|---|---|"]
        for c in checks["within_3x_of_kl_certified_n_ge_1e5"]["detail"]:
            out.append(f"| {c['setting']}, {c['k']}, {c['d']}, {c['epsilon']:g}, "
                       f"{c['n']:.0e} | {_fmt(c['dp_em_kl'])} | {_fmt(c['kl_certified_kl'])} "
                       f"| {_fmt(c['ratio'])} |")
    if regime:
        out += ["", "## PGME-lite in its separation regime (k = 2, N = 2e4, eps = 1)", "",
                "| d | seed | status | largest matched mean error (sigma) |", "|---|---|---|---|"]
        for r in regime:
            out.append(f"| {r['d']} | {r['seed']} | {r['status']} {r['stage']} | "
                       f"{_fmt(r['max_mean_error_sigma'])} |")
    return "\n".join(out) + "\n"


def run_speed_check(out: Path = Path("experiments"), *, learner: str = "dp-em",
                    n: int = 1_000_000, d: int = 10, k: int = 5, eps: float = 1.0) -> dict:
    """Time one learner at ``n`` rows in ``d`` dimensions on the separated mixture (seeded);
    peak memory from rusage. Writes ``speed.json`` beside the regimes results
    (``klrelease experiment learners-speed``)."""
    import os
    import resource

    from ..learners import learn

    rng = np.random.default_rng([20261122, n, d])
    means = _means("separated", k, d)
    X = means[rng.integers(0, k, n)] + rng.normal(size=(n, d))
    R = 1.2 * float(np.linalg.norm(means, axis=1).max())
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    c0 = time.process_time()
    res = learn(X, k, epsilon=eps, delta=1e-6, learner=learner, seed=1,
                **_options(learner, R, False))
    info = {
        "learner": learner, "n": n, "d": d, "k": k, "epsilon": eps,
        "status": "FAIL" if res.failed else "ok", "stage": res.stage,
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "cpu_seconds": round(time.process_time() - c0, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "load_average_before": round(load, 2), "cores": os.cpu_count(),
        "mean_error_sigma": _match_error(res.gmm, means, np.full(k, 1 / k))[0] if res.ok
        else None,
    }
    folder = Path(out) / "learners_regimes"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "speed.json").write_text(json.dumps(info, indent=2))
    return info


# ------------------------------------------------------------- the cost of the missing labels


def _em_fit(X: np.ndarray, k: int, weights, means, covariances):
    """Non-private maximum-likelihood EM (scikit-learn's ``GaussianMixture``, full
    covariances) started at the given parameters and run to convergence: the estimate an
    unlabelled learner without noise aims at."""
    from sklearn.mixture import GaussianMixture

    from ..gmm import GMM

    precisions = np.linalg.inv(np.asarray(covariances, dtype=float))
    em = GaussianMixture(k, covariance_type="full", tol=1e-10, max_iter=5000, reg_covar=1e-9,
                         weights_init=np.asarray(weights, dtype=float) / np.sum(weights),
                         means_init=np.asarray(means, dtype=float),
                         precisions_init=precisions)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        em.fit(X)
    return (GMM(em.weights_, em.means_, em.covariances_), int(em.n_iter_),
            bool(em.converged_), float(em.score(X)))


def run_information_limit(out: Path = Path("experiments"), *, quick: bool = False,
                          progress: bool = True) -> Path:
    """What the labels are worth on the overlapping cells at N >= 1e5: on each cell's data
    (:func:`cell_data`, trial 0: the grid's own rows), non-private EM started at the true
    parameters and at the labelled fit itself, the start of higher likelihood kept (what a
    learner without labels could choose), its KL to the labelled fit (the grid's matched KL),
    beside the grid's dp-em and labelled kl-certified figures (read from the targets of
    ``learners_regimes.json`` in the same folder: run ``learners-regimes`` first).

    An unlabelled learner sees the rows, not which component drew them; where components
    overlap, the maximum-likelihood fit of the rows differs from the labelled fit by an amount
    no budget removes. Where that gap alone is more than ``LABELLED_FACTOR`` times labelled
    kl-certified's E[KL], a learner that converges to the maximum-likelihood fit misses the
    factor however large its budget; a learner that shrinks its estimates may still meet it.
    Writes ``information_limit.md`` and ``.json``; returns the markdown's path. ``quick``: the
    first two cells."""
    from ..gmm import fit_gmm

    folder = Path(out) / "learners_regimes"
    grid_json = folder / "learners_regimes.json"
    if not grid_json.exists():
        raise FileNotFoundError(f"{grid_json} not found: run `klrelease experiment "
                                f"learners-regimes --out {out}` first (this study reads its "
                                "dp-em and kl-certified figures)")
    detail = json.loads(grid_json.read_text())["targets"][
        "within_3x_of_kl_certified_n_ge_1e5"]["detail"]
    # trial 0: the rows cell_data(cell, 0) gives (a grid of one trial lists no trial)
    grid = {(r["k"], r["d"], float(r["epsilon"]), r["n"]): r for r in detail
            if r["setting"] == "overlapping" and r.get("trial", 0) == 0}
    cells = [c for c in _grid(False) if c.setting == "overlapping" and c.n >= 100000
             and "dp-em" in c.learners]
    if quick:
        cells = cells[:2]
    rows = []
    for i, cell in enumerate(cells):
        t0 = time.perf_counter()
        _, means, weights, z, X, _ = cell_data(cell, 0)
        reference = fit_gmm(X, z)
        fits = {"truth": _em_fit(X, cell.k, weights, means,
                                 np.broadcast_to(np.eye(cell.d), (cell.k, cell.d, cell.d))),
                "labelled_fit": _em_fit(X, cell.k, reference.weights, reference.means,
                                        reference.covariances)}
        fig = grid.get((cell.k, cell.d, cell.eps, cell.n), {})
        row = {"k": cell.k, "d": cell.d, "epsilon": cell.eps, "n": cell.n,
               "kl_certified_kl": fig.get("kl_certified_kl"), "dp_em_kl": fig.get("dp_em_kl")}
        for start, (gmm, iterations, converged, loglik) in fits.items():
            row.update({f"em_from_{start}_kl": _matched_kl(gmm, reference),
                        f"em_from_{start}_iterations": iterations,
                        f"em_from_{start}_converged": converged,
                        f"em_from_{start}_loglik": loglik})
        best = max(fits, key=lambda s: fits[s][3])  # by likelihood: no labels needed
        row["em_kl"] = row[f"em_from_{best}_kl"]
        row["loglik_gap"] = abs(fits["truth"][3] - fits["labelled_fit"][3])
        kc = row["kl_certified_kl"]
        row["em_over_kl_certified"] = None if kc is None else row["em_kl"] / kc
        row["em_misses"] = None if kc is None else row["em_kl"] > LABELLED_FACTOR * kc
        row["seconds"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
        if progress:
            print(f"[{i + 1}/{len(cells)}] k={cell.k} d={cell.d} eps={cell.eps:g} "
                  f"N={cell.n}: EM {row['em_kl']:.3g}, kl-certified {kc}", file=sys.stderr,
                  flush=True)
    (folder / "information_limit.json").write_text(json.dumps(
        {"command": "klrelease experiment information-limit --out " + str(out),
         "factor": LABELLED_FACTOR, "rows": rows}, indent=2))
    path = folder / "information_limit.md"
    path.write_text(_information_markdown(rows, out))
    return path


def _information_markdown(rows: list[dict], out) -> str:
    compared = [r for r in rows if r["kl_certified_kl"] is not None]
    missed = [r for r in compared if r["em_misses"]]

    def dp_within(rs):
        return [r for r in rs if r["dp_em_kl"] is not None
                and r["dp_em_kl"] <= LABELLED_FACTOR * r["kl_certified_kl"]]

    gap = max((r["loglik_gap"] for r in rows), default=0.0)
    lines = [
        "# The cost of the missing labels (overlapping cells, N >= 1e5)", "",
        f"Command: `klrelease experiment information-limit --out {out}` (reads the dp-em and "
        "kl-certified figures of `learners_regimes.json`; the data of each cell are the "
        "grid's own, trial 0). EM: non-private maximum-likelihood EM (scikit-learn, full "
        "covariances, run to convergence) started at the true parameters and at the labelled "
        "fit itself; its column (EM) is the start of higher likelihood, which a learner "
        "without labels could choose (the two starts' mean log-likelihoods differ by at most "
        f"{gap:.1e} per row, below EM's tolerance: both reach the same maximum, and the "
        "choice only reflects where each run stopped). KL: to the labelled fit, components "
        "matched as in the grid. "
        "kl-certified sees the labels (replace-one, 10 draws); dp-em and EM do not.", "",
        f"Non-private EM itself misses the target (within {LABELLED_FACTOR:g}x labelled "
        f"kl-certified's E[KL]) on {len(missed)} of {len(compared)} cells: a learner that "
        "converges to the maximum-likelihood fit of the rows misses it there however large its "
        f"budget. dp-em is within {LABELLED_FACTOR:g}x on {len(dp_within(compared))} of "
        f"{len(compared)}: on {len(dp_within(missed))} of the {len(missed)} that EM misses "
        "(where its KL is below EM's: the maximum-likelihood fit is not a bound for every "
        "learner) and on "
        f"{len(dp_within([r for r in compared if not r['em_misses']]))} of the other "
        f"{len(compared) - len(missed)}.", "",
        "| k | d | eps | N | kl-certified (labelled) | dp-em | EM from truth | "
        "EM from labelled fit | EM / kl-certified | dp-em / EM |",
        "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        kc, dp, em = r["kl_certified_kl"], r["dp_em_kl"], r["em_kl"]
        lines.append(
            f"| {r['k']} | {r['d']} | {r['epsilon']:g} | {r['n']:.0e} | {_fmt(kc)} | "
            f"{_fmt(dp)} | {_fmt(r['em_from_truth_kl'])} | {_fmt(r['em_from_labelled_fit_kl'])}"
            f" | {_fmt(None if kc is None else em / kc)} | "
            f"{_fmt(None if dp is None else dp / em)} |")
    return "\n".join(lines) + "\n"
