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

Grid (reduced to keep the committed run near 15 min of CPU on a shared machine): N = 1e3 for
every k in {2, 3, 5}, d in {2, 5, 10}, eps in {1, 4} and both settings; N = 1e4 for the same
(k, d, eps) on separated data and for k = 2, d in {2, 10}, eps = 4 on overlapping data; N = 1e5
for (k, d) in {(2, 2), (3, 2), (3, 5)}, eps = 4 on separated data only (a k = 3 cell at 1e5
takes about 4 min, mostly PGME's radius queries). The O(N^2 d) radius queries of PGME and the
per-block EM fits of the two sample-and-aggregate learners put the full grid at 1e5-1e6 far
beyond that budget; N = 1e6 is not run. The warm-up PEGME is left out (its model, means
within ``2 k sqrt(d) kappa sigma_min`` of the origin, does not match these mixtures).
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


def _grid(quick: bool) -> list[Cell]:
    if quick:
        return [Cell("separated", 2, 2, 4.0, 2000), Cell("overlapping", 2, 2, 4.0, 2000)]
    cells = [Cell(s, k, d, e, 1000) for s in ("separated", "overlapping")
             for k in (2, 3, 5) for d in (2, 5, 10) for e in (1.0, 4.0)]
    cells += [Cell("separated", k, d, e, 10000) for k in (2, 3, 5) for d in (2, 5, 10)
              for e in (1.0, 4.0)]
    cells += [Cell("overlapping", 2, d, 4.0, 10000) for d in (2, 10)]
    cells += [Cell("separated", 2, 2, 4.0, 100000)]
    cells += [Cell("separated", 3, d, 4.0, 100000) for d in (2, 5)]
    return cells


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
    return base[learner]


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
                p = make_plan(X, z, epsilon=cell.eps, delta=1e-6, mechanism=mech,
                              norm_bound=bound)
                kls = [kl_divergence(p.draw(rng), reference) for _ in range(10)]
            out[mech] = {"status": "ok", "kl": float(np.mean(kls)),
                         "seconds": time.perf_counter() - t0}
        except Exception as exc:  # recorded, never dropped
            out[mech] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:200],
                         "seconds": time.perf_counter() - t0}
    return out


def run_learners_regimes(out: Path = Path("experiments"), *, quick: bool = False,
                         trials: int | None = None, progress: bool = True) -> dict:
    """Run the grid; write CSV, PNG and JSON to ``out/learners_regimes``; return the summary."""
    from ..gmm import fit_gmm
    from ..learners import learn

    trials = trials or 1
    folder = Path(out) / "learners_regimes"
    folder.mkdir(parents=True, exist_ok=True)
    cells = _grid(quick)
    rows: list[dict] = []
    t_start = time.perf_counter()
    cpu_start = time.process_time()
    for ci, cell in enumerate(cells):
        for trial in range(trials):
            rng = np.random.default_rng([20261122, ci, trial])
            means = _means(cell.setting, cell.k, cell.d)
            weights = np.full(cell.k, 1.0 / cell.k)
            z = rng.integers(0, cell.k, cell.n)
            z[: cell.k * (cell.d + 2)] = np.repeat(np.arange(cell.k), cell.d + 2)
            X = means[z] + rng.normal(size=(cell.n, cell.d))
            R = 1.2 * float(np.linalg.norm(means, axis=1).max())
            reference = fit_gmm(X, z)
            common = {"setting": cell.setting, "k": cell.k, "d": cell.d, "epsilon": cell.eps,
                      "delta": 1e-6, "n": cell.n, "trial": trial}
            for name in GRID_LEARNERS:
                t0 = time.perf_counter()
                res = learn(X, cell.k, epsilon=cell.eps, delta=1e-6, learner=name,
                            seed=int(rng.integers(2**31)), **_options(name, R, quick))
                row = {**common, "learner": name, "kind": "unlabelled learner",
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
                if progress:
                    print(f"[{ci + 1}/{len(cells)}] {cell} {name}: {row['status']} "
                          f"{row['stage']} {row['seconds']:.1f}s", file=sys.stderr, flush=True)
            if any(r["status"] == "ok" for r in rows[-len(GRID_LEARNERS):]):
                for mech, rec in _compare(X, z, cell, reference, R, rng).items():
                    rows.append({**common, "learner": mech, "kind": "labelled mechanism",
                                 "status": rec["status"], "stage": rec.get("error", ""),
                                 "seconds": round(rec["seconds"], 3), "expected_start_n": None,
                                 "mean_error_sigma": None, "weight_error": None,
                                 "kl": rec.get("kl")})
    wall = time.perf_counter() - t_start
    cpu = time.process_time() - cpu_start
    summary = _summarise(rows)
    _write(folder, rows, summary, cells, trials, quick, wall, cpu)
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
    fig.text(0.5, 0.005, "N = 1e4 overlapping: k = 2, d in {2, 10}, eps = 4 only; N = 1e5: "
             "(k, d) in {(2, 2), (3, 2), (3, 5)}, eps = 4, separated only", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write(folder, rows, summary, cells, trials, quick, wall, cpu):
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
