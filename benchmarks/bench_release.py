"""Release benchmark: the fast pipeline against the naive one, side by side in one run.

    python benchmarks/bench_release.py [--repeats 5] [--skip-big]

1. The paper's synthetic setting (N = 1000, K = 5, d = 3, eps = 1, delta = 1e-5, seed 42):
   a full ``kl-paper`` release with ``solver="auto"`` (exact reduction + native solver) against
   the naive pipeline, cvxpy + Clarabel over all N neighbour LMIs of each class with no
   reduction (``solver="clarabel", reduce="none"``), one solve per class. Same design inputs,
   so the design objectives must agree; the ratio of median wall times is printed.
2. N = 1e6, d = 10, K = 10: wall time of one ``kl-paper`` release (statistics, neighbour
   vectors, ten SDPs, sampling) and the peak resident memory of the process, measured in a
   fresh subprocess so earlier work does not count.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import numpy as np


def paper_synthetic(seed=42):
    """The paper's synthetic setting (N = 1000, K = 5, d = 3), as the experiments draw it."""
    from klrelease.experiments.settings import SyntheticSetting
    from klrelease.experiments.synthetic import draw_synthetic

    data = draw_synthetic(SyntheticSetting(), np.random.default_rng(seed))
    return data.X, data.y


def timed_release(X, y, repeats, **options):
    import klrelease as kr

    times, rel = [], None
    for r in range(repeats):
        t0 = time.perf_counter()
        rel = kr.release(X, y, epsilon=1.0, delta=1e-5, mechanism="kl-paper", seed=r, **options)
        times.append(time.perf_counter() - t0)
    plan = kr.plan(X, y, epsilon=1.0, delta=1e-5, mechanism="kl-paper", **options)
    return times, rel, plan.design.objective


def big_release() -> dict:
    """Run in a fresh process: one release at N = 1e6, d = 10, K = 10."""
    import klrelease as kr

    rng = np.random.default_rng(0)
    N, K, d = 10**6, 10, 10
    y = rng.integers(0, K, N)
    X = rng.normal(size=(N, d)) + rng.uniform(-10, 10, (K, d))[y]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    rel = kr.release(X, y, epsilon=1.0, delta=1e-5, mechanism="kl-paper", seed=0)
    elapsed = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": elapsed, "peak_mb": peak, "data_mb": base,
            "solver": rel.solver.solver, "status": rel.solver.status,
            "sdp_seconds": rel.solver.time_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="fast releases timed (median)")
    ap.add_argument("--naive-repeats", type=int, default=2, help="naive releases timed")
    ap.add_argument("--skip-big", action="store_true", help="skip the N = 1e6 release")
    ap.add_argument("--big-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.big_child:
        print(json.dumps(big_release()))
        return

    from rich.console import Console
    from rich.table import Table

    import klrelease as kr

    X, y = paper_synthetic()
    kr.release(X, y, epsilon=1.0, delta=1e-5, mechanism="kl-paper", seed=0)  # warm imports
    fast_t, fast_rel, fast_obj = timed_release(X, y, args.repeats)
    naive_t, naive_rel, naive_obj = timed_release(
        X, y, args.naive_repeats, solver="clarabel", reduce="none"
    )
    fast, naive = statistics.median(fast_t), statistics.median(naive_t)

    table = Table(title="kl-paper release, paper synthetic setting (N=1000, K=5, d=3, eps=1)")
    for col in ("pipeline", "solver", "median time (s)", "design objective (12)"):
        table.add_column(col)
    table.add_row("fast: reduction + auto", fast_rel.solver.solver, f"{fast:.4f}",
                  f"{fast_obj:.8g}")
    table.add_row("naive: all N LMIs, Clarabel", naive_rel.solver.solver, f"{naive:.3f}",
                  f"{naive_obj:.8g}")
    console = Console()
    console.print(table)
    rel_diff = abs(fast_obj - naive_obj) / abs(naive_obj)
    console.print(f"speed-up (naive / fast): [bold]{naive / fast:.0f}x[/]; "
                  f"relative difference of the design objectives: {rel_diff:.1e}")

    if not args.skip_big:
        out = subprocess.run([sys.executable, __file__, "--big-child"], capture_output=True,
                             text=True, check=True)
        big = json.loads(out.stdout.strip().splitlines()[-1])
        t2 = Table(title="kl-paper release, N = 1e6, d = 10, K = 10")
        for col in ("wall time (s)", "of which SDP (s)", "solver", "peak memory (MB)",
                    "of which data (MB)"):
            t2.add_column(col)
        t2.add_row(f"{big['seconds']:.2f}", f"{big['sdp_seconds']:.2f}",
                   f"{big['solver']} ({big['status']})", f"{big['peak_mb']:.0f}",
                   f"{big['data_mb']:.0f}")
        console.print(t2)


if __name__ == "__main__":
    main()
