"""Wide data: kl-certified releases against the cost of the class covariances' spectra.

For every case (d features, N rows, K = 3 classes: Gaussian classes whose covariances are a
random diagonal plus a random rank-20 part), a fresh process measures the floor (numpy's
per-class covariance, ``np.cov``, and ``np.linalg.eigh`` of each: what any full-covariance
release of K classes computes), and another fresh process runs the release alone (seeded, a
benchmark), so that its peak resident memory is its own. Both are timed after their imports:
the release process first releases 60 rows of 2 features with the same options (what a first
release imports, about 1 s, is not timed), then times the release as many times as the floor
takes each of its timings (twice below d = 2000, once from there), the fastest counted.
Designs: ``auto`` (the default:
under label flip it picks randomized response or the Gaussian stages from public inputs; at
these sizes it picks randomized response), ``gaussian`` (the Gaussian stages under label flip)
and ``replace-one`` (the Gaussian stages under replace-one with a public box).

    nice -n 10 python benchmarks/bench_width.py

Prints a markdown table and writes it to ``benchmarks/width.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
K = 3
EPSILON, DELTA = 1.0, 1e-5
#: (d, N, designs) of the default run
CASES = [
    (250, 10_000, ("auto", "gaussian")),
    (500, 10_000, ("auto", "gaussian")),
    (1000, 10_000, ("auto", "gaussian", "replace-one")),
    (1000, 30, ("auto", "gaussian")),
    (2000, 10_000, ("auto", "gaussian")),
    (5000, 10_000, ("auto",)),
]


def data(d: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """N rows of K Gaussian classes in d dimensions with random covariances
    (diagonal ``s_k^2`` plus ``B_k^T B_k``, ``B_k`` 20 x d), row-major float64."""
    rng = np.random.default_rng(d * 7919 + n)
    y = rng.integers(0, K, n)
    X = np.empty((n, d))
    for k in range(K):
        idx = np.flatnonzero(y == k)
        m = idx.size
        scale = np.exp(rng.normal(scale=0.5, size=d))
        B = rng.normal(scale=0.3, size=(20, d))
        X[idx] = (rng.normal(size=(m, d)) * scale + rng.normal(size=(m, 20)) @ B
                  + rng.normal(scale=1.0, size=d))
    return X, y


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _spectra(X: np.ndarray, y: np.ndarray) -> float:
    t = time.perf_counter()
    for k in range(K):
        C = np.atleast_2d(np.cov(X[y == k], rowvar=False))
        np.linalg.eigh(C)
    return time.perf_counter() - t


def run_floor(d: int, n: int) -> dict:
    """The faster of numpy's default BLAS threads and one thread (on a loaded machine
    threaded BLAS can be the slower), twice each below d = 2000, once each from there."""
    from threadpoolctl import threadpool_limits

    X, y = data(d, n)
    runs = 2 if d < 2000 else 1
    times = [_spectra(X, y) for _ in range(runs)]
    with threadpool_limits(1, user_api="blas"):
        times += [_spectra(X, y) for _ in range(runs)]
    return {"floor": min(times)}


def _options(X: np.ndarray, design: str) -> dict:
    if design == "replace-one":
        lo, hi = X.min(axis=0), X.max(axis=0)
        pad = 0.5 * (hi - lo)
        return {"adjacency": "replace-one", "bounds": (lo - pad, hi + pad)}
    return {"design": design}


def run_release(d: int, n: int, design: str) -> dict:
    """The fastest of as many seeded releases as the floor's timings (twice below d = 2000,
    once from there), after a release of 60 rows of 2 features with the same options (the
    imports a first release makes are not timed)."""
    import klrelease

    def release(X, y):
        return klrelease.release(X, y, epsilon=EPSILON, delta=DELTA, seed=0,
                                 classes=list(range(K)), **_options(X, design))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        release(*data(2, 60))
        X, y = data(d, n)
        before = _rss_mb()
        times = []
        for _ in range(2 if d < 2000 else 1):
            t = time.perf_counter()
            r = release(X, y)
            times.append(time.perf_counter() - t)
    chosen = r.options.get("design", "")
    return {"release": min(times), "before": before, "peak": _peak_mb(), "chosen": chosen}


def _child(args: list[str], timeout: float) -> dict | None:
    cmd = [sys.executable, __file__, "--child", *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return None
    except subprocess.CalledProcessError as exc:
        sys.stderr.write(exc.stderr)
        raise
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--d", type=int, nargs="*", help="only these d (default: all cases)")
    p.add_argument("--timeout", type=float, default=3600.0, help="per process, seconds")
    p.add_argument("--out", default=str(HERE / "width.md"))
    a = p.parse_args()
    if a.child:
        kind, d, n, *rest = a.child
        res = (run_floor(int(d), int(n)) if kind == "floor"
               else run_release(int(d), int(n), rest[0]))
        print(json.dumps(res))
        return
    cases = [c for c in CASES if not a.d or c[0] in a.d]
    load = os.getloadavg()[0]
    header = ("| d | N | K | design | floor (s) | release (s) | ratio | RSS before (MB) "
              "| peak RSS (MB) |\n|---|---|---|---|---|---|---|---|---|")
    print(header, flush=True)
    lines = []
    for d, n, designs in cases:
        floor = _child(["floor", str(d), str(n)], a.timeout)["floor"]
        for design in designs:
            r = _child(["release", str(d), str(n), design], a.timeout)
            name = design if design != "auto" else f"auto ({r['chosen'] if r else '?'})"
            if r is None:
                line = (f"| {d} | {n} | {K} | {name} | {floor:.2f} | > {a.timeout:.0f} | | | |")
            else:
                line = (f"| {d} | {n} | {K} | {name} | {floor:.2f} | {r['release']:.2f} | "
                        f"{r['release'] / floor:.1f} | {r['before']:.0f} | {r['peak']:.0f} |")
            print(line, flush=True)
            lines.append(line)
            if not a.d:  # the table so far (a long run keeps what it measured)
                Path(a.out).write_text(_document(load, header, lines))


def _document(load: float, header: str, lines: list[str]) -> str:
    return (
        "# Wide data: kl-certified against the class covariances' spectra\n\n"
        f"Produced by `python benchmarks/bench_width.py` on a shared 2-core machine (load "
        f"average {load:.1f} at the start). epsilon = {EPSILON:g}, delta = {DELTA:g}, "
        "seeded, data in memory. floor = numpy's per-class covariance and `np.linalg.eigh` "
        "of each of the K classes, in a fresh process (the fastest of numpy's default BLAS "
        "threads and one thread, twice each below d = 2000 and once each from there); "
        "release = `klrelease.release` with declared classes, in another fresh process of "
        "its own, after a release of 60 rows of 2 features with the same options (the "
        "imports a first release makes, about 1 s, are not timed), the fastest of two runs "
        "below d = 2000 and one run from there (the release runs BLAS on one thread below "
        "d = 400 and on numpy's default threads from there, `klrelease._threads`); "
        "ratio = release / floor; "
        "RSS before = resident memory with the data generated, before the release; peak "
        "RSS = the release process's peak resident memory (interpreter, data and release). "
        "Designs: auto is the default (the design it chose in brackets), gaussian the "
        "Gaussian stages under label flip, replace-one the Gaussian stages under replace-one "
        "with a public box. d = 5000 runs the default design only (each d x d "
        "decomposition takes 20 s or more on one core there).\n\n" + header + "\n"
        + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
