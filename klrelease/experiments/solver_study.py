"""Solver comparison study for the mean-noise SDP (``klrelease experiment solver-study``).

    klrelease experiment solver-study [--quick] [--time-limit SECONDS] [--out DIR]

For every number of neighbour vectors n and dimension d of the grid, one class problem is drawn
like the paper's synthetic data (Dirichlet(1) class weights, means U[-10, 10]^d, covariances
Wishart(d + 1, I); vectors (x - mu_k) / (N_k - 1) inside the class and (x - mu_k) / (N_k + 1)
outside; A = Sigma_k^{-1}). Every backend ("native", "clarabel", "scs", "mosek") solves it

* on the reduced problem (``reduce="auto"``: symmetric hull or active set), and
* on the unreduced problem (``reduce="none"``: every non-zero row handed to the backend),

each solve in its own forked process with a wall-clock limit (status "time limit" when it is
hit; the construction of the cvxpy model counts). Once a backend reaches the limit for a
problem kind and d, its larger n are not run (status "skipped", saying where the limit was
reached). The worst constraint violation of every
returned matrix is recomputed here over all n rows, and its objective is compared with the
best certified one of the same problem. A backend that cannot run says why (MOSEK absent or
without a licence: "not licensed", with the probe's reason); no row is dropped. The full
``kl-paper`` release time (``solver="auto"``) of the data set behind each problem is measured
once per (n, d).

Outputs in ``OUT/solver_study/``: ``results.csv``, ``results.md`` and ``results.png``.
"""

from __future__ import annotations

import csv
import multiprocessing as mp
import platform
import resource
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

from .. import solvers
from .._threads import single_threaded_blas
from ..solvers import max_violation, mean_noise_sdp
from ..solvers.backends import mosek as mosek_backend
from ..solvers.synthetic import class_problems, gmm_data

__all__ = ["run_solver_study", "FOLDER"]

#: The results folder under ``--out``.
FOLDER = "solver_study"

FULL_N = [100, 1_000, 10_000, 100_000]
FULL_D = [1, 2, 3, 5, 10, 20]
QUICK_N = [100, 1_000]
QUICK_D = [1, 3, 10]
BACKEND_ORDER = ["native", "clarabel", "scs", "mosek"]
MEMORY_LIMIT = 8 * 1024**3  # per forked solve

COLUMNS = [
    "n",
    "d",
    "K",
    "N_k",
    "backend",
    "problem",
    "status",
    "time_s",
    "objective",
    "rel_objective_diff",
    "max_violation",
    "certified_gap",
    "n_constraints",
    "reduction",
    "rounds",
    "release_time_s",
    "note",
]


def make_problem(n: int, d: int, seed: int):
    """One class problem with n neighbour vectors in dimension d, and its data set."""
    k = max(2, min(5, n // (2 * (d + 2))))
    X, y = gmm_data(n, d, k, seed=seed)
    A, V = class_problems(X, y)[0]
    return X, y, A, V, k, int(np.sum(y == 0))


def _child(conn, A, V, backend, reduce, time_limit):
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    try:
        with warnings.catch_warnings(), single_threaded_blas():  # forked: no BLAS pools
            warnings.simplefilter("ignore")
            res = mean_noise_sdp(A, V, solver=backend, reduce=reduce, time_limit=time_limit)
        conn.send(
            {
                "status": res.status,
                "G": np.array(res.G),
                "objective": res.objective,
                "gap": res.gap,
                "n_constraints": res.n_constraints,
                "reduction": res.reduction,
                "rounds": res.rounds,
                "solver": res.solver,
                "time": res.time,
            }
        )
    except solvers.SolverFailed as exc:
        conn.send({"status": exc.status, "note": exc.message[:160]})
    except solvers.SolverUnavailable as exc:
        conn.send({"status": "unavailable", "note": str(exc)[:160]})
    except MemoryError:
        conn.send({"status": "out of memory", "note": f"above {MEMORY_LIMIT // 1024**3} GB"})
    except Exception as exc:  # noqa: BLE001 - recorded, never dropped
        conn.send({"status": "error", "note": f"{type(exc).__name__}: {exc}"[:160]})
        traceback.print_exc()
    finally:
        conn.close()


def run_solve(A, V, backend, reduce, limit):
    """Solve in a forked process; kill it at ``limit`` seconds (+ a grace for start-up)."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    start = time.perf_counter()
    proc = ctx.Process(target=_child, args=(child, A, V, backend, reduce, limit))
    proc.start()
    child.close()
    out = None
    if parent.poll(limit + 5.0):
        try:
            out = parent.recv()
        except EOFError:
            out = None
    wall = time.perf_counter() - start
    if proc.is_alive():
        proc.kill()
    proc.join()
    if out is None:
        if wall >= limit:
            return {"status": "time limit", "note": f"killed after {limit:g} s", "time": wall}
        return {"status": "crashed", "note": f"exit code {proc.exitcode}", "time": wall}
    out.setdefault("time", wall)
    if out["status"] == "time limit":
        out["time"] = wall
    return out


def mosek_state() -> str | None:
    """``None`` if MOSEK is usable, else the status to record."""
    usable, _ = mosek_backend.probe()
    return None if usable else "not licensed"


def release_time(X, y) -> float | str:
    import klrelease

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            klrelease.release(X, y, epsilon=1.0, delta=1e-5, mechanism="kl-paper", seed=0)
            return time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - recorded
        return f"error: {type(exc).__name__}"


def warm_up(mosek_usable: bool) -> None:
    """Import and exercise every backend once, so forked solves do not pay first-call costs."""
    rng = np.random.default_rng(0)
    A, V = np.eye(3), rng.standard_normal((30, 3))
    for backend in BACKEND_ORDER:
        if backend != "mosek" or mosek_usable:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mean_noise_sdp(A, V, solver=backend, reduce="none")


def study(ns, ds, limit, seed, log):
    rows = []
    mosek = mosek_state()
    warm_up(mosek is None)
    limit_hit = {}  # (backend, problem, d) -> smallest n that reached the time limit
    for d in ds:
        for n in ns:
            X, y, A, V, k, nk = make_problem(n, d, seed + 7 * d + n)
            rel_t = release_time(X, y)
            block = []
            for backend in BACKEND_ORDER:
                for problem, reduce in (("reduced", "auto"), ("unreduced", "none")):
                    row = dict(n=n, d=d, K=k, N_k=nk, backend=backend, problem=problem)
                    row["release_time_s"] = rel_t
                    hit = limit_hit.get((backend, problem, d))
                    if backend == "mosek" and mosek is not None:
                        row.update(status=mosek, note=mosek_backend.probe()[1][:160])
                    elif hit is not None:
                        row.update(status="skipped", note=f"time limit already reached at n={hit}")
                    else:
                        out = run_solve(A, V, backend, reduce, limit)
                        row.update(
                            status=out["status"],
                            time_s=out.get("time"),
                            note=out.get("note", ""),
                        )
                        if out["status"] == "time limit":
                            limit_hit[(backend, problem, d)] = n
                        if "G" in out:
                            row.update(
                                objective=out["objective"],
                                max_violation=max_violation(out["G"], V),
                                certified_gap=out["gap"],
                                n_constraints=out["n_constraints"],
                                reduction=out["reduction"],
                                rounds=out["rounds"],
                            )
                    block.append(row)
                    log(row)
            certified = [
                r["objective"]
                for r in block
                if r["status"] == "optimal" and np.isfinite(r.get("certified_gap", np.nan))
            ]
            best = min(certified) if certified else None
            for r in block:
                if best and r.get("objective") is not None:
                    r["rel_objective_diff"] = r["objective"] / best - 1.0
            rows.extend(block)
    return rows


def fmt(value, kind="g"):
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        return value
    if kind == "t":
        return f"{value:.3g}"
    return f"{value:.3e}" if kind == "e" else f"{value:.10g}"


def write_csv(rows, path):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in COLUMNS})


def write_markdown(rows, path, command, limit, seconds):
    lines = [
        "# Mean-noise SDP: solver comparison",
        "",
        f"Command: `{command}`  ",
        f"Per-solve wall-clock limit: {limit:g} s (model construction included). "
        f"Total run time: {seconds:.0f} s. Python {platform.python_version()}, "
        f"numpy {np.__version__}, {_versions()}.",
        "",
        "`rel. obj.` is the objective relative to the best certified objective of the same "
        "problem (native, or a cvxpy backend whose duals certify a gap); `viol.` is "
        "max_n v^T G^+ v - 1 over all n rows, recomputed from the returned G; `release` is the "
        "full kl-paper release time with solver='auto' on the data set behind the problem.",
        "",
        "| n | d | backend | problem | status | time (s) | objective | rel. obj. | viol. "
        "| rows solved | release (s) |",
        "|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['n']} | {r['d']} | {r['backend']} | {r['problem']} | {r['status']} | "
            f"{fmt(r.get('time_s'), 't')} | {fmt(r.get('objective'))} | "
            f"{fmt(r.get('rel_objective_diff'), 'e')} | {fmt(r.get('max_violation'), 'e')} | "
            f"{fmt(r.get('n_constraints'))} | {fmt(r.get('release_time_s'), 't')} |"
        )
    Path(path).write_text("\n".join(lines) + "\n")


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for mod in ("cvxpy", "clarabel", "scs", "mosek"):
        try:
            out.append(f"{mod} {version(mod)}")
        except PackageNotFoundError:
            out.append(f"{mod} absent")
    return ", ".join(out)


def plot(rows, path, limit):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ds = sorted({r["d"] for r in rows})
    cols = min(3, len(ds))
    nrows = (len(ds) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    colors = {"native": "C0", "clarabel": "C1", "scs": "C2", "mosek": "C3"}
    for ax, d in zip(axes.flat, ds, strict=False):
        for backend in BACKEND_ORDER:
            for problem, style in (("reduced", "-o"), ("unreduced", "--s")):
                pts = [
                    r
                    for r in rows
                    if r["d"] == d and r["backend"] == backend and r["problem"] == problem
                ]
                ok = [(r["n"], r["time_s"]) for r in pts if r["status"] == "optimal"]
                cut = [(r["n"], limit) for r in pts if r["status"] == "time limit"]
                if ok:
                    ax.plot(
                        *zip(*ok, strict=True),
                        style,
                        color=colors[backend],
                        ms=4,
                        label=f"{backend} ({problem})",
                    )
                if cut:
                    ax.plot(*zip(*cut, strict=True), "x", color=colors[backend], ms=8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"d = {d}")
        ax.set_xlabel("n (neighbour vectors)")
        ax.set_ylabel("wall time per solve (s)")
        ax.axhline(limit, color="grey", lw=0.6, ls=":")
        ax.grid(True, which="both", lw=0.3)
    for ax in list(axes.flat)[len(ds) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle("mean-noise SDP: x = time limit reached; only optimal, feasible solves drawn")
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    fig.savefig(path, dpi=130)
    plt.close(fig)


def run_solver_study(out="experiments", *, quick: bool = False, time_limit: float | None = None,
                     seed: int = 0, grid: tuple[list[int], list[int]] | None = None,
                     log=print) -> Path:
    """Run the study and write ``results.csv``, ``results.md`` and ``results.png`` under
    ``out/solver_study/``; returns that folder.

    ``quick``: n in {1e2, 1e3}, d in {1, 3, 10} and 10 s per solve (else 60 s); ``grid``
    ``(ns, ds)`` overrides the grid; ``log(line)`` reports every solve.
    """
    ns, ds = (QUICK_N, QUICK_D) if quick else (FULL_N, FULL_D)
    if grid is not None:
        ns, ds = grid
    limit = time_limit or (10.0 if quick else 60.0)
    if not limit > 0:
        raise ValueError(f"--time-limit must be > 0, got {time_limit}")
    folder = Path(out) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    command = "klrelease experiment solver-study" + (" --quick" if quick else "") + (
        f" --time-limit {time_limit:g}" if time_limit else "")

    def row_line(row):
        log(
            f"n={row['n']:>6} d={row['d']:>2} {row['backend']:>8} {row['problem']:>9}: "
            f"{row['status']:<14} {fmt(row.get('time_s'), 't'):>8} s  "
            f"viol={fmt(row.get('max_violation'), 'e')}"
        )

    start = time.perf_counter()
    rows = study(ns, ds, limit, seed, row_line)
    seconds = time.perf_counter() - start
    write_csv(rows, folder / "results.csv")
    write_markdown(rows, folder / "results.md", command, limit, seconds)
    plot(rows, folder / "results.png", limit)
    log(f"wrote {folder / 'results.csv'}, results.md, results.png in {seconds:.0f} s")
    return folder
