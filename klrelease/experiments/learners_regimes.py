"""``klrelease experiment learners-regimes``: where the unlabelled-data learners start to work.

For the Kamath et al. learners (PGME, SA-lite) and the Afzali-style sample-and-aggregate
learner, on synthetic mixtures of k spherical unit Gaussians with equal weights:

* **separated**: means on a circle (first two coordinates) with minimum pairwise distance
  ``25 (1 + sqrt(d))`` standard deviations (the terrific-ball tests of PGME need tens of sigma
  in low dimension);
* **overlapping**: the same layout with minimum distance 3 standard deviations;

it records FAIL (with its stage), the parameter error of a returned model (components matched
to the true ones by the Hungarian algorithm on mean distances; largest mean error in units of
sigma, largest weight error) and the KL divergence of the returned model to the non-private
labelled fit: learned components are matched to classes by the Hungarian algorithm on the
matrix of component KL divergences ``KL(N_learned_j || N_class_i)``, then the labelled
``KL(learned || reference)`` of :func:`klrelease.kl.kl_divergence` is computed. Beside it,
``E[KL]`` of labelled mechanisms (which see the labels; 10 draws) on the same data. The
expected start of each learner (design tables of section 2.8 and 3.8 at eps = 1, scaled by
1/eps) is a column of the CSV. The public a-priori bounds given to the learners are those the
design prescribes for synthetic benchmarks: ``R = 1.2 max ||mu||``, ``sigma_min = 0.5``,
``sigma_max = 2``. Runs are seeded: experiments, not certified releases.

The learners run with ``accountant="auto"`` (basic or zCDP, whichever gives the larger
per-piece budgets; the choice is a column of the CSV). The labelled mechanisms run under the
learners' neighbouring relation, replace-one (``adjacency="replace-one"`` with the public norm
bound ``R + 2 (sqrt(d) + 3)``); their default, label flip, treats the features as public and
is not comparable. Seeds are functions of the cell (setting, k, d, eps, N), so a cell gives the
same data and the same result whatever else the grid holds.

Grid (``_grid``), in the order it runs: N = 1e3 and 1e4 for every k in {2, 3, 5}, d in
{2, 5, 10}, eps in {1, 4}, separated and overlapping; N = 1e5 for the same 36 cells with
SA-lite and the Afzali-style learner; N = 1e6 for the 18 separated cells and one overlapping
cell (k = d = 2, eps = 4) with SA-lite and the Afzali-style learner; then PGME at N = 1e5 on the
cells of ``PGME_1E5``. PGME's radius queries are O(N^2) (a KD-tree in d <= 2 does not change the
order): a k = 3 cell at 1e5 takes 4-6 min, so PGME runs at 1e5 only where it answers the
question of where it starts to work, and not at 1e6 (``PGME_1E6_REASON``, measured). A wall
budget stops the run between cells; every cell or learner not run is listed with its reason in
the JSON (``not_run``). The warm-up PEGME is left out (its model, means within
``2 k sqrt(d) kappa sigma_min`` of the origin, does not match these mixtures).
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

__all__ = ["run_learners_regimes", "expected_start", "GRID_LEARNERS"]

GRID_LEARNERS = ("kamath-pgme", "kamath-sa-lite", "afzali-style-sample-aggregate")
COMPARE_MECHANISMS = ("gaussian-iid", "kl-certified")
BLOCK_LEARNERS = GRID_LEARNERS[1:]

#: PGME cells at N = 1e5 (setting, k, d, eps): every separated cell in d = 2 (exact KD-tree
#: counts, about a minute each) and one overlapping; in d = 5, 10 (chunked pairs, 3-6 min
#: each) the cells where the design table puts its start near 1e5 at eps = 1.
PGME_1E5 = (("separated", 5, 2, 4.0), ("separated", 3, 2, 1.0), ("separated", 2, 10, 1.0),
            ("separated", 5, 2, 1.0), ("separated", 2, 2, 1.0), ("separated", 2, 2, 4.0),
            ("separated", 3, 2, 4.0), ("overlapping", 2, 2, 4.0), ("separated", 3, 5, 1.0))

#: Why PGME is not run at N = 1e6 (measured on this machine, shared, nice 10).
PGME_1E6_REASON = (
    "PGME's radius queries count, for every point, the points within each grid radius: "
    "O(N^2) pairs. Measured at N = 1e5 (k = 3, separated): one terrific-radius query over all "
    "radii by the chunked pairs 188-339 s (d = 10 / 5), extrapolated x100 to 5-9 h at 1e6; "
    "by the KD-tree (d = 2, one count per radius) the same query extrapolated from 5000 of "
    "1e6 candidates takes 1494 s at 1e6, x2 for the exact two-sided check, and a k = 3 run "
    "makes at least three such queries: hours, not minutes. Not run at 1e6."
)

#: Default wall budget of the full grid (seconds): cells after it are not run (listed).
WALL_BUDGET = 3300.0

# Design tables (eps = 1, delta = 1e-6): smallest N where the learner can start to work.
_PGME = {(2, 2): 1.1e4, (2, 5): 2.1e4, (2, 10): 2.1e4, (3, 2): 4.9e4, (3, 5): 9.4e4,
         (3, 10): 9.4e4, (5, 2): 1.9e5, (5, 5): 1.9e5, (5, 10): 3.6e5}
_SA = {(2, 2): 1.3e5, (2, 5): 2.7e5, (2, 10): 4.9e5, (3, 2): 3.0e5, (3, 5): 6e5,
       (3, 10): 1.1e6, (5, 2): 8e5, (5, 5): 1.7e6, (5, 10): 3e6}
_AAL = {(2, 2): 2e4, (3, 2): 3e4, (5, 2): 5e4, (2, 5): 8e4, (3, 5): 1.1e5, (2, 10): 2.4e5}


def expected_start(learner: str, k: int, d: int, eps: float) -> float | None:
    """Design-table N at which ``learner`` can start to work (None: not tabulated)."""
    table = {"kamath-pgme": _PGME, "kamath-sa-lite": _SA,
             "afzali-style-sample-aggregate": _AAL}[learner]
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
    cells += [Cell(s, k, d, e, 100000, ("kamath-pgme",)) for s, k, d, e in PGME_1E5]
    return cells


def _not_run(cells: list[Cell]) -> list[dict]:
    """The learners the grid does not run on its cells, with the reason (public)."""
    out = []
    pgme_cells = {c.key for c in cells if "kamath-pgme" in c.learners}
    for c in cells:
        if c.n == 1_000_000 and "kamath-pgme" not in c.learners:
            out.append({"cell": list(c.key), "learner": "kamath-pgme",
                        "reason": PGME_1E6_REASON})
        elif c.n == 100000 and c.key not in pgme_cells:
            out.append({"cell": list(c.key), "learner": "kamath-pgme",
                        "reason": "wall budget: PGME runs at 1e5 only on the cells of "
                                  "PGME_1E5 (3-6 min each in d = 5, 10)"})
    return out


def _means(setting: str, k: int, d: int) -> np.ndarray:
    sep = 25.0 * (1.0 + math.sqrt(d)) if setting == "separated" else 3.0
    radius = sep / (2.0 * math.sin(math.pi / k))
    ang = 2.0 * math.pi * np.arange(k) / k
    M = np.zeros((k, d))
    M[:, 0], M[:, 1] = radius * np.cos(ang), radius * np.sin(ang)
    return M


def _options(learner: str, R: float, quick: bool) -> dict:
    base = {"kamath-pgme": {"R": R, "sigma_min": 0.5, "sigma_max": 2.0},
            "kamath-sa-lite": {"R": R, "sigma_min": 0.5, "sigma_max": 2.0, "n_init": 1},
            "afzali-style-sample-aggregate": {"sigma_max": 2.0, "r_init": 3}}
    return {**base[learner], "accountant": "auto"}


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
            rng = np.random.default_rng(cell.seed(trial))
            means = _means(cell.setting, cell.k, cell.d)
            weights = np.full(cell.k, 1.0 / cell.k)
            z = rng.integers(0, cell.k, cell.n)
            z[: cell.k * (cell.d + 2)] = np.repeat(np.arange(cell.k), cell.d + 2)
            X = means[z] + rng.normal(size=(cell.n, cell.d))
            R = 1.2 * float(np.linalg.norm(means, axis=1).max())
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
    wall = time.perf_counter() - t_start
    cpu = time.process_time() - cpu_start
    summary = _summarise(rows)
    _write(folder, rows, summary, cells, trials, quick, wall, cpu, not_run, budget)
    return summary


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

    colours = dict(zip(GRID_LEARNERS, ("tab:blue", "tab:orange", "tab:green"), strict=True))
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
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
        for ax in axes[:, j]:
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    fig.text(0.5, 0.005, "PGME at N = 1e5 on the cells of PGME_1E5 only, not at 1e6; N = 1e6: "
             "all separated cells and one overlapping cell (k = d = 2, eps = 4)",
             ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write(folder, rows, summary, cells, trials, quick, wall, cpu, not_run=(), budget=None):
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
        "summary": summary,
    }
    (folder / "learners_regimes.json").write_text(json.dumps(info, indent=2))


def run_speed_check(out: Path = Path("experiments"), *, n: int = 100_000, d: int = 10,
                    k: int = 2, eps: float = 4.0) -> dict:
    """Time PGME at ``n`` rows in ``d`` dimensions (progress bar on); peak memory from rusage.

    Writes ``speed.json`` beside the regimes results (``klrelease experiment learners-speed``).
    """
    import resource

    from ..learners import learn

    rng = np.random.default_rng([20261122, n, d])
    means = _means("separated", k, d)
    X = means[rng.integers(0, k, n)] + rng.normal(size=(n, d))
    R = 1.2 * float(np.linalg.norm(means, axis=1).max())
    t0 = time.perf_counter()
    c0 = time.process_time()
    res = learn(X, k, epsilon=eps, delta=1e-6, learner="kamath-pgme", seed=1, R=R,
                sigma_min=0.5, sigma_max=2.0, progress=True)
    info = {
        "learner": "kamath-pgme", "n": n, "d": d, "k": k, "epsilon": eps,
        "status": "FAIL" if res.failed else "ok", "stage": res.stage,
        "wall_seconds": round(time.perf_counter() - t0, 1),
        "cpu_seconds": round(time.process_time() - c0, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "nodes": res.diagnostics.get("nodes"),
        "mean_error_sigma": _match_error(res.gmm, means, np.full(k, 1 / k))[0] if res.ok
        else None,
    }
    folder = Path(out) / "learners_regimes"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "speed.json").write_text(json.dumps(info, indent=2))
    return info
