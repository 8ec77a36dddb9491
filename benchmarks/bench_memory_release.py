"""In-memory releases against the floor, side by side in one run.

    python benchmarks/bench_memory_release.py [--n 1e6 3e6] [--repeats 3] [--before /path/to/tree]

Data in memory: N rows, d = 10 features, K = 10 classes (class centres N(0, 3^2 I), unit
within-class noise, as ``bench_stream.py`` draws them), classes declared, epsilon = 1,
delta = 1e-5, seed 0.

floor = one pass computing per-class counts, means and centred scatters in memory, done fast
with numpy alone: one stable radix sort of the labels, one ``np.take`` of the rows, then per
class block one column sum and one ``X_k^T X_k`` (BLAS, one thread), centred by
``- n_k m_k m_k^T``. Then, in the same process on the same arrays, the median of
``--repeats`` wall (and CPU) times of each release: kl-certified under label flip (the default),
kl-certified under replace-one with a public box ``bounds=``, and kl-paper (label flip).

Each (tree, N) runs in its own process. ``--before TREE`` also runs the releases of another
checkout of the library (its path put first on ``PYTHONPATH``, e.g. the main branch) on the
same data, one process after the other, and reports the largest relative difference between
the parameters released by the two trees (same seed: the same noise).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

import numpy as np

K, D = 10, 10
EPS, DELTA = 1.0, 1e-5
RELEASES = {
    "kl-certified LF": dict(mechanism="kl-certified"),
    "kl-certified RO box": dict(mechanism="kl-certified", adjacency="replace-one",
                                bounds=(np.full(D, -25.0), np.full(D, 25.0))),
    "kl-paper": dict(mechanism="kl-paper"),
}


def draw(n: int):
    rng = np.random.default_rng(2024)
    centres = rng.normal(scale=3.0, size=(K, D))
    y = rng.integers(0, K, n)
    X = centres[y] + rng.normal(size=(n, D))
    return X, y


def floor(X: np.ndarray, y: np.ndarray):
    """Per-class counts, means and centred scatters: sort once, one product per class."""
    order = np.argsort(y.astype(np.uint8), kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(y, minlength=K))])
    Xs = np.take(X, order, axis=0)
    means, scat = np.zeros((K, D)), np.zeros((K, D, D))
    for k in range(K):
        U = Xs[bounds[k]:bounds[k + 1]]
        n = U.shape[0]
        if n:
            means[k] = np.ones(n) @ U / n
            scat[k] = U.T @ U - n * np.outer(means[k], means[k])
    return np.diff(bounds), means, scat


def median_time(fn, repeats: int) -> tuple[float, float, object]:
    """Median wall time, median CPU time of the process (all its threads) and the output."""
    wall, cpu, out = [], [], None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu), out


def child(n: int, repeats: int) -> dict:
    """One process: the floor and every release at N = n (JSON on stdout)."""
    from threadpoolctl import threadpool_limits

    import klrelease as kr

    warnings.simplefilter("ignore")  # seeded releases warn that they are not secure
    X, y = draw(n)
    classes = list(range(K))
    for opts in RELEASES.values():  # warm imports and caches on a small slice
        kr.release(X[:20000], y[:20000], epsilon=EPS, delta=DELTA, seed=0, classes=classes,
                   **opts)
    with threadpool_limits(1, user_api="blas"):
        floor(X, y)
        t, c, _ = median_time(lambda: floor(X, y), repeats)
        out = {"floor": t, "floor cpu": c}
    for name, opts in RELEASES.items():
        t, c, rel = median_time(lambda o=opts: kr.release(
            X, y, epsilon=EPS, delta=DELTA, seed=0, classes=classes, **o), repeats)
        g = rel.gmm
        out[name], out[name + " cpu"] = t, c
        out[name + " gmm"] = [np.asarray(g.weights).tolist(), np.asarray(g.means).tolist(),
                              np.asarray(g.covariances).tolist()]
    return out


def run(tree: str | None, n: int, repeats: int) -> dict:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, __file__, "--child", str(n), "--repeats",
                          str(repeats)], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def rel_diff(a, b) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        worst = max(worst, float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-300)))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=float, nargs="+", default=[1e6, 3e6])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", help="another checkout of the library, run on the same data")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.repeats)))
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = ([("before", args.before)] if args.before else []) + [("this tree", here)]
    names = list(RELEASES)
    load = os.getloadavg()[0]
    argv = " ".join(sys.argv[1:])
    print("# In-memory releases against the floor\n")
    print(f"`python benchmarks/bench_memory_release.py {argv}`\n")
    print(f"In-memory releases, d = {D}, K = {K}, eps = {EPS:g}, delta = {DELTA:g}, seed 0; "
          f"median of {args.repeats}; load average {load:.1f} at the start.\n")
    head = ("| N | code | floor (s) | floor cpu (s) | "
            + " | ".join(f"{m} (s) | x | x cpu" for m in names) + " |")
    print(head)
    print("|" + "---|" * (4 + 3 * len(names)))
    diffs = []
    for n in args.n:
        got = {}
        for label, tree in trees:
            r = run(tree, int(n), args.repeats)
            got[label] = r
            cells = " | ".join(f"{r[m]:.2f} | {r[m] / r['floor']:.1f} | "
                               f"{r[m + ' cpu'] / r['floor cpu']:.1f}" for m in names)
            print(f"| {n:.0e} | {label} | {r['floor']:.3f} | {r['floor cpu']:.3f} | {cells} |",
                  flush=True)
        if "before" in got:
            diffs.append((n, {m: rel_diff(got["this tree"][m + " gmm"],
                                          got["before"][m + " gmm"]) for m in names}))
    print("\nx = release / floor in wall time, x cpu = the same in CPU time of the process "
          "(less sensitive to other load on the machine; kl-paper scores rows on two threads, "
          "whose CPU times add up). Floor and releases are measured in the same process on "
          "the same arrays.")
    for n, d in diffs:
        print(f"N = {n:.0e}: largest relative difference of the released weights, means and "
              "covariances, this tree against before: "
              + ", ".join(f"{m} {v:.1e}" for m, v in d.items()))


if __name__ == "__main__":
    main()
