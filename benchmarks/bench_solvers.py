"""Benchmark of the mean-noise SDP alone, per class.

    python benchmarks/bench_solvers.py [--repeats 5] [--skip-big]

1. The paper's synthetic setting (N = 1000, K = 5, d = 3; the neighbour vectors of one class
   are the N rows): ``solver="auto"`` against the naive solve, cvxpy + Clarabel over all N
   LMIs with no reduction, for every class; median wall time per class, objectives compared.
2. N = 1e6 rows, d = 10 (one class of a K = 10 mixture): ``solver="auto"`` wall time per class,
   the peak of the solver's own allocations (tracemalloc, which numpy reports to) and the peak
   resident memory of the fresh process that generated the data and ran the solves.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
import warnings

import numpy as np

from klrelease.solvers import mean_noise_sdp
from klrelease.solvers.synthetic import class_problems, gmm_data


def timed(A, V, repeats, **kw):
    times, res = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        res = mean_noise_sdp(A, V, **kw)
        times.append(time.perf_counter() - start)
    return statistics.median(times), res


def big_child() -> dict:
    X, y = gmm_data(10**6, 10, 10, seed=0)
    A, V = class_problems(X, y)[0]
    del X
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    seconds, res = timed(A, V, 3)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    import tracemalloc

    tracemalloc.start()
    mean_noise_sdp(A, V)
    allocated = tracemalloc.get_traced_memory()[1] / 1024**2
    tracemalloc.stop()
    return {
        "solve_alloc_mb": allocated,
        "input_mb": V.nbytes / 1024**2,
        "seconds": seconds,
        "solver": res.solver,
        "reduction": res.reduction,
        "rows_solved": res.n_constraints,
        "rounds": res.rounds,
        "gap": res.gap,
        "violation": res.max_violation,
        "peak_mb": peak,
        "before_solve_mb": base,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--big-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.big_child:
        print(json.dumps(big_child()))
        return
    from rich.console import Console
    from rich.table import Table

    X, y = gmm_data(1000, 3, 5, seed=42)
    problems = class_problems(X, y)
    mean_noise_sdp(*problems[0])  # warm up imports
    mean_noise_sdp(*problems[0], solver="clarabel")
    table = Table(title="mean-noise SDP per class, paper synthetic setting (N=1000, K=5, d=3)")
    for col in (
        "class",
        "N_k",
        "auto (ms)",
        "solver",
        "rows",
        "naive Clarabel (s)",
        "ratio",
        "rel. objective diff.",
        "violation (auto)",
    ):
        table.add_column(col)
    fast_total = naive_total = 0.0
    for k, (A, V) in enumerate(problems):
        fast_t, fast = timed(A, V, args.repeats)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            naive_t, naive = timed(A, V, 1, solver="clarabel", reduce="none")
        fast_total += fast_t
        naive_total += naive_t
        table.add_row(
            str(k),
            str(int(np.sum(y == k))),
            f"{1e3 * fast_t:.2f}",
            fast.solver,
            str(fast.n_constraints),
            f"{naive_t:.2f}",
            f"{naive_t / fast_t:.0f}x",
            f"{abs(fast.objective / naive.objective - 1):.1e}",
            f"{fast.max_violation:.1e}",
        )
    console = Console(width=160)
    console.print(table)
    console.print(
        f"all {len(problems)} classes: auto {1e3 * fast_total:.1f} ms, naive {naive_total:.1f} s "
        f"([bold]{naive_total / fast_total:.0f}x[/])"
    )
    if not args.skip_big:
        out = subprocess.run(
            [sys.executable, __file__, "--big-child"], capture_output=True, text=True, check=True
        )
        big = json.loads(out.stdout.strip().splitlines()[-1])
        t2 = Table(title="mean-noise SDP, one class, N = 1e6 rows, d = 10 (solver='auto')")
        for col in (
            "median time (s)",
            "solver",
            "reduction",
            "rows solved",
            "rounds",
            "certified gap",
            "violation",
            "solver allocations (MB)",
            "V itself (MB)",
            "process peak RSS (MB)",
        ):
            t2.add_column(col)
        t2.add_row(
            f"{big['seconds']:.3f}",
            big["solver"],
            big["reduction"],
            str(big["rows_solved"]),
            str(big["rounds"]),
            f"{big['gap']:.1e}",
            f"{big['violation']:.1e}",
            f"{big['solve_alloc_mb']:.0f}",
            f"{big['input_mb']:.0f}",
            f"{big['peak_mb']:.0f}",
        )
        console.print(t2)


if __name__ == "__main__":
    main()
