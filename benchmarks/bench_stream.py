"""Streamed kl-certified releases against the cost of reading the data once.

For every N (d = 10, K = 10), Parquet files are generated once under ``--cache`` (not part of
the repository). Each row of the table runs in a fresh process (so that its peak memory is its
own) and measures, in the same run: the floor (one pass reading every file and accumulating
the per-class counts, means and centred scatters), the kl-certified release (label flip,
seeded: a benchmark) from the same files, their ratio, and the peak resident memory. Paths:
``embedded`` (``ParquetSource``, chunks of 2^18 rows, on the driver) and ``dask`` (the same
files as a Dask dataframe on a ``distributed.LocalCluster`` of 2 workers, one thread each).

    nice -n 10 python benchmarks/bench_stream.py --n 1e6 1e7

Prints a markdown table and writes it to ``benchmarks/stream.md``.
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
D, K = 10, 10
ROWS_PER_FILE = 1_000_000


def generate(n: int, cache: Path) -> Path:
    """Parquet files of n rows of a 10-class mixture in 10 dimensions (once)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = cache / f"n{n}"
    done = folder / "_done"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=3.0, size=(K, D))
    for i, a in enumerate(range(0, n, ROWS_PER_FILE)):
        m = min(ROWS_PER_FILE, n - a)
        y = rng.integers(0, K, m)
        X = centres[y] + rng.normal(size=(m, D))
        cols = {f"x{j}": X[:, j] for j in range(D)}
        cols["label"] = y
        pq.write_table(pa.table(cols), folder / f"part-{i:05d}.parquet")
    done.touch()
    return folder


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure(folder: str, path: str) -> dict:
    """One row: floor pass, release, peak memory (run in its own process)."""
    import klrelease
    from klrelease.stream import DaskSource, ParquetSource

    src = ParquetSource(folder, "label", classes=list(range(K)))
    client = cluster = None
    if path == "dask":
        import dask.dataframe as dd
        import distributed

        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                           dashboard_address=None)
        client = distributed.Client(cluster)
        ddf = dd.read_parquet([str(p) for p in src.paths])
        src = DaskSource(ddf, label_column="label", classes=list(range(K)), client=client)
    t0 = time.perf_counter()
    m = src.moments()
    floor = time.perf_counter() - t0
    assert int(m.counts.sum()) > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        klrelease.release(src, None, epsilon=1.0, delta=1e-6, seed=0)
        rel = time.perf_counter() - t0
    if client is not None:
        client.close()
        cluster.close()
    return {"floor": floor, "release": rel, "peak_mb": _peak_mb()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", nargs="+", type=float, default=[1e6, 1e7])
    ap.add_argument("--paths", nargs="+", default=["embedded", "dask"])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/klrelease-bench-stream"))
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(measure(*args.worker)))
        return
    lines = [
        "# Streamed kl-certified releases (d = 10, K = 10, label flip, Parquet)",
        "",
        "Produced by `nice -n 10 python benchmarks/bench_stream.py "
        + " ".join(f"--n {n:g}" for n in args.n).replace(" --n", "", len(args.n) - 1)
        + "` on a shared 2-core machine. floor = one pass reading every file and accumulating"
        " per-class counts, means and centred scatters; release = the whole kl-certified"
        " release from the same files (passes: moments, norm histogram, norm collection,"
        " stage A, stage C); peak = peak resident memory of the process (files, interpreter"
        " and, for dask, the in-process cluster).",
        "",
        "| N | path | floor (s) | release (s) | release / floor | peak memory (MB) |",
        "|---|---|---|---|---|---|",
    ]
    for n in args.n:
        folder = generate(int(n), args.cache)
        for path in args.paths:
            env = {**os.environ, "PYTHONPATH": str(HERE.parent)}  # this checkout's package
            out = subprocess.run([sys.executable, __file__, "--worker", str(folder), path],
                                 capture_output=True, text=True, check=True, env=env)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            line = (f"| {n:.0e} | {path} | {r['floor']:.2f} | {r['release']:.2f} | "
                    f"{r['release'] / r['floor']:.1f} | {r['peak_mb']:.0f} |")
            print(line, flush=True)
            lines.append(line)
    lines += ["", MODEL]
    (HERE / "stream.md").write_text("\n".join(lines) + "\n")


MODEL = """## N = 1e10 on n workers (a model on paper)

A release reads the data 5 times under label flip (moments, norm histogram, the values of one
histogram bin, stage A, stage C; 4 with `quantile_rule = "histogram"`) and 3 times under
replace-one (stage A, B, C). Each pass is embarrassingly parallel: a worker reads its
partitions and returns, per partition, K x d x d + K x d + K numbers (1110 float64 at
d = K = 10, about 9 kB; the histogram pass 8194 counts, the collection pass the values of one
bin, at most 2^22 after refinement). With p partitions of 1e6 rows (p = 1e4), the driver
receives about 90 MB per moments pass and merges them in O(p K d^2) = 1e7 flops: negligible.
The driver sends each worker only the per-row map (frame, released centres and shapes: K d^2
numbers), never noise. Per worker, one pass costs (1e10 / n) rows x (read + accumulate);
from the floor column above (about T_1 seconds per 1e7 rows on one core), a pass takes
1e3 T_1 / n seconds, the release about 5e3 T_1 / n plus the driver's design (under a
second). With T_1 = 2.4 s (measured above) and n = 100 workers: about 120 s per release,
bounded by reading.
"""


if __name__ == "__main__":
    main()
