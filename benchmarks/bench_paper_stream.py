"""kl-paper (d = 10, K = 10, label flip): its release against one read-and-accumulate pass.

For every N, one process per checkout of the library measures, on the same data (a 10-class
mixture, the files of ``bench_stream.py``; seeded releases: a benchmark, not a certified
release):

* ``floor``: one pass accumulating the per-class counts, means and centred scatters
  (:meth:`klrelease.stream.Source.moments`): in memory (``ArraySource``, chunks of 2^18 rows)
  and from Parquet files (``ParquetSource``, read in record batches);
* the kl-paper release from the arrays in memory (``release(X, y)``) and from the Parquet
  files (``release(ParquetSource(...))``), with the number of passes it read the files.

``--before TREE`` runs the same measurements with another checkout of the library (its path
put first on ``PYTHONPATH``, e.g. the main branch) in a process of its own just before this
tree's, and reports both side by side with the largest relative difference between the
parameters the two released (same seed: the same noise).

    nice -n 10 python benchmarks/bench_paper_stream.py --n 1e6 1e7 --before /path/to/main

Prints a markdown table and writes it to ``benchmarks/paper_stream.md`` (the text below the
table is kept).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
D, K = 10, 10
KW = dict(epsilon=1.0, delta=1e-6, mechanism="kl-paper", seed=0, classes=list(range(K)))
MARK = "<!-- table above: generated; text below: kept -->"


def generate(n: int, cache: Path) -> Path:
    """Parquet files of n rows (once), the same generator as ``bench_stream.py``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_stream", HERE / "bench_stream.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.generate(n, cache)


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _read_all(src):
    X, y = [], []
    for a, b in src.chunks():
        X.append(a)
        y.append(b)
    return np.concatenate(X), np.concatenate(y)


def child(folder: str) -> dict:
    """One process: floors and releases, in memory and from Parquet (JSON on stdout)."""
    import klrelease
    from klrelease.stream import ArraySource, ParquetSource

    warnings.simplefilter("ignore")  # seeded releases: a benchmark
    pq_src = ParquetSource(folder, "label", classes=list(range(K)))
    X, y = _read_all(pq_src)
    mem_src = ArraySource(X, y, classes=list(range(K)))
    klrelease.release(X[:50_000], y[:50_000], **KW)  # imports and caches: not timed
    klrelease.release(ArraySource(X[:50_000], y[:50_000]), None, **KW)
    passes = [0]
    reduce = type(pq_src).reduce

    def counted(self, *args, **kwargs):
        passes[0] += 1
        return reduce(self, *args, **kwargs)

    out = {}
    for path in ("memory", "parquet"):
        src = mem_src if path == "memory" else pq_src
        floor = _timed(src.moments)[0]
        type(pq_src).reduce = counted
        passes[0] = 0
        try:
            if path == "memory":
                t, rel = _timed(lambda: klrelease.release(X, y, **KW))
            else:
                t, rel = _timed(lambda: klrelease.release(pq_src, None, **KW))
        finally:
            type(pq_src).reduce = reduce
        g = rel.gmm
        out[path] = {"floor": floor, "release": t, "passes": passes[0],
                     "gmm": [np.asarray(getattr(g, k)).tolist()
                             for k in ("weights", "means", "covariances")]}
    return out


def run(tree: str, folder: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": tree + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, __file__, "--child", str(folder)],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def rel_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))
                     / max(float(np.max(np.abs(np.asarray(y)))), 1e-300))
               for x, y in zip(a, b, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=float, nargs="+", default=[1e6])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/klrelease-bench-stream"))
    ap.add_argument("--before", help="another checkout of the library, run on the same data")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    load = os.getloadavg()[0]
    trees = ([("before", args.before)] if args.before else []) + [("after", str(HERE.parent))]
    rows = []
    for n in args.n:
        folder = generate(int(n), args.cache)
        got = {label: run(tree, folder) for label, tree in trees}
        for path in ("memory", "parquet"):
            cells = []
            for label, _ in trees:
                r = got[label][path]
                cells.append(f"{r['floor']:.2f} | {r['release']:.2f} | "
                             f"{r['release'] / r['floor']:.1f}"
                             + (f" | {r['passes']}" if path == "parquet" else " | "))
            diff = (f"{rel_diff(got['after'][path]['gmm'], got['before'][path]['gmm']):.1e}"
                    if args.before else "")
            rows.append(f"| {n:.0e} | {path} | " + " | ".join(cells) + f" | {diff} |")
            print(rows[-1], flush=True)
    head = " | ".join(f"{label}: floor (s) | {label}: kl-paper (s) | {label}: x | "
                      f"{label}: passes" for label, _ in trees)
    argv = " ".join(sys.argv[1:])
    lines = [
        "# kl-paper releases against the floor (d = 10, K = 10, label flip)",
        "",
        f"Produced by `nice -n 10 python benchmarks/bench_paper_stream.py {argv}` on a "
        f"shared 2-core machine (load average {load:.1f} when it started: other work shared "
        "the cores). Each checkout ran in its own process, one after the other, on the same "
        "data: floor = one pass accumulating the per-class moments (in memory: an "
        "ArraySource over the arrays; Parquet: the files); kl-paper = the seeded release "
        "from the arrays in memory or from the Parquet files (one run); x = kl-paper / "
        "floor of the same process; passes = reads of the Parquet files by the release; "
        "diff = largest relative difference between the weights, means and covariances "
        "released by the two checkouts (same seed; the SDP optimum agrees to the solver "
        "tolerance).",
        "",
        f"| N | data | {head} | diff |",
        "|---|---|" + "---|---|---|---|" * len(trees) + "---|",
        *rows,
        "",
    ]
    target = HERE / "paper_stream.md"
    kept = ""
    if target.exists() and MARK in target.read_text():
        kept = target.read_text().split(MARK, 1)[1]
    target.write_text("\n".join(lines) + MARK + kept)


if __name__ == "__main__":
    main()
