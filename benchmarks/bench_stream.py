"""Streamed releases against the cost of reading the data once.

For every N (d = 10, K = 10), Parquet files are generated once under ``--cache`` (not part of
the repository). Each row of the table runs in a fresh process (so that its peak memory is its
own) and measures, in the same run: the floor (one pass reading every file and accumulating
the per-class counts, means and centred scatters), the kl-certified release and the kl-paper
release (label flip, seeded: a benchmark) from the same files, their ratios to the floor, and
the peak resident memory. Paths: ``embedded`` (``ParquetSource``, chunks of 2^18 rows, on the
driver) and ``dask`` (the same files as a Dask dataframe on a ``distributed.LocalCluster`` of
2 workers, one thread each).

    nice -n 10 python benchmarks/bench_stream.py --n 1e6 1e7 1e8

Prints a markdown table and writes it to ``benchmarks/stream.md``.
"""

from __future__ import annotations

import argparse
import functools
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
BOX = ([-20.0] * D, [20.0] * D)


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


def measure(folder: str, path: str, mechanisms=("kl-certified", "kl-paper")) -> dict:
    """One row: floor pass, releases, peak memory (run in its own process)."""
    import klrelease
    from klrelease.stream import ArraySource, DaskSource, ParquetSource

    src = ParquetSource(folder, "label", classes=list(range(K)))
    # replace-one needs a public bound: a box about 1.3 times the generated rows' range
    boxed = ParquetSource(folder, "label", classes=list(range(K)), bounds=BOX)
    client = cluster = None
    if path == "dask":
        import dask.dataframe as dd
        import distributed

        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                           dashboard_address=None)
        client = distributed.Client(cluster)
        ddf = dd.read_parquet([str(p) for p in src.paths])
        src = DaskSource(ddf, label_column="label", classes=list(range(K)), client=client)
        boxed = DaskSource(ddf, label_column="label", classes=list(range(K)), client=client,
                           bounds=BOX)
    # every mechanism once on a small source first (imports, first calls), untimed
    small = ArraySource(np.random.default_rng(0).normal(size=(3000, D)) * 3.0,
                        np.arange(3000) % K, classes=list(range(K)), bounds=BOX)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in mechanisms:
            mech, _, relation = name.partition("+")[0].partition("/")
            klrelease.release(small, None, mechanism=mech, epsilon=1.0, delta=1e-6, seed=0,
                              **({"adjacency": relation} if relation else {}))
    read = np.inf
    for rep in range(2):  # the first pass also warms up the reader: the faster of two
        t0 = time.perf_counter()
        # read and validate every chunk, accumulate nothing (a new function each time, so
        # that a cluster computes the pass again rather than reusing results it still holds)
        src.scan(functools.partial(_nothing, rep), _nothing, None)
        read = min(read, time.perf_counter() - t0)
    t0 = time.perf_counter()
    m = src.moments()
    floor = time.perf_counter() - t0
    assert int(m.counts.sum()) > 0
    out = {"floor": floor, "read": read}
    passes = [0]
    reduce = type(src).reduce

    def counted(self, *args, **kwargs):
        passes[0] += 1
        return reduce(self, *args, **kwargs)

    type(src).reduce = counted
    for name in mechanisms:
        spec, _, variant = name.partition("+")
        mech, _, relation = spec.partition("/")
        kw = {"adjacency": relation} if relation else {}
        if variant == "one-pass":
            if path == "dask":  # a Dask source's row groups are not known without a pass
                continue
            kw["one_pass"] = True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            passes[0] = 0
            t0 = time.perf_counter()
            klrelease.release(boxed if relation == "replace-one" else src, None,
                              mechanism=mech, epsilon=1.0, delta=1e-6, seed=0, **kw)
            out[name] = time.perf_counter() - t0
            out[name + " passes"] = passes[0]
    type(src).reduce = reduce
    if client is not None:
        client.close()
        cluster.close()
    out["peak_mb"] = _peak_mb()
    return out


def _nothing(*args):
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", nargs="+", type=float, default=[1e6, 1e7])
    ap.add_argument("--paths", nargs="+", default=["embedded", "dask"])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/klrelease-bench-stream"))
    ap.add_argument("--mechanisms", nargs="+",
                    default=["kl-certified", "kl-certified+one-pass",
                             "kl-certified/replace-one", "kl-certified/replace-one+one-pass",
                             "kl-paper"],
                    help="NAME or NAME/ADJACENCY, then +one-pass for kl-certified's one_pass "
                         "option (replace-one reads the files with a public box of +-20 per "
                         "feature)")
    ap.add_argument("--dask-max-n", type=float, default=1e7,
                    help="largest N run on the Dask LocalCluster too")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        folder, path, mechs = args.worker
        print(json.dumps(measure(folder, path, mechs.split(","))))
        return
    mechs = [m for m in args.mechanisms
             if klrelease_streams(m.partition("+")[0].partition("/")[0])]
    lines = [
        "# Streamed releases (d = 10, K = 10, Parquet, epsilon = 1, delta = 1e-6)",
        "",
        "Produced by `python benchmarks/bench_stream.py --n "
        + " ".join(f"{n:g}" for n in args.n)
        + f"` on a shared 2-core machine (load average {os.getloadavg()[0]:.1f} at the start;"
        f" the Dask path up to N = {args.dask_max_n:g}). read = one pass reading and"
        " validating every chunk, accumulating nothing; floor = one pass reading every file"
        " and accumulating per-class counts, means and centred scatters; then each release"
        " from the same files in the same process (label flip unless the column says"
        " replace-one, then with the public box +-20 per feature); passes = how many times the"
        " release read the data (kl-certified: the first pass, which validates every row and"
        " keeps a labelled sample of 2^18 rows chosen by their index, then the last stage-C"
        " round; the earlier stages read the sample in memory; +one-pass: the option"
        " `one_pass`, which reads its sample's blocks of rows from the row groups that hold"
        " them (each file here is one group of 1e6 rows; one block up to N = 3.7e7, 5 at"
        " 1e8; not counted as passes) and then passes over every row once, validating it"
        " after noise is drawn; kl-paper: the class statistics, then one pass keeping each"
        " class's rows farthest from its mean, on which the SDP is solved in memory (the"
        " balls about the class means certify every row left out; a problem they do not"
        " certify takes further passes scoring every row));"
        " x = release / floor; x read = release / read (a release of p passes takes at least"
        " p reads); peak = peak resident memory of the process (files, interpreter and, for"
        " dask, the in-process cluster); dask / embedded = the dask release time over the"
        " embedded one at the same N.",
        "",
        "| N | path | read (s) | floor (s) | "
        + " | ".join(f"{m} (s) | passes | x | x read" for m in mechs)
        + " | peak memory (MB) | dask / embedded |",
        "|---|---|---|---|" + "---|---|---|---|" * len(mechs) + "---|---|",
    ]
    floors = {}
    for n in args.n:
        folder = generate(int(n), args.cache)
        embedded = {}
        for path in args.paths:
            if path == "dask" and n > args.dask_max_n:
                continue
            env = {**os.environ, "PYTHONPATH": str(HERE.parent)}  # this checkout's package
            out = subprocess.run([sys.executable, __file__, "--worker", str(folder), path,
                                  ",".join(mechs)],
                                 capture_output=True, text=True, check=True, env=env)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            if path == "embedded":
                embedded = r
                if "kl-certified" in r:
                    floors[n] = (r["floor"], r["kl-certified"] / r["floor"],
                                 r.get("kl-certified+one-pass", np.nan) / r["floor"])
            cells = " | ".join(f"{r[m]:.2f} | {r[m + ' passes']} | {r[m] / r['floor']:.1f} | "
                               f"{r[m] / r['read']:.1f}" if m in r else "n/a | | |"
                               for m in mechs)
            vs = " / ".join(f"{r[m] / embedded[m]:.2f}" for m in mechs if m in r) \
                if path != "embedded" and embedded else ""
            line = (f"| {n:.0e} | {path} | {r['read']:.2f} | {r['floor']:.2f} | {cells} | "
                    f"{r['peak_mb']:.0f} | "
                    f"{vs} |")
            print(line, flush=True)
            lines.append(line)
    lines += ["", MODEL]
    if 1e8 in args.n and 1e8 in floors:
        f, x, x1 = floors[1e8]
        lines += [f"With this run's N = 1e8 row (F = {f:.1f} s, x = {x:.1f} for kl-certified): "
                  f"about {f * x:.0f} s per release of 1e10 rows on 100 workers; with one "
                  f"pass (x = {x1:.1f}, the files read where they are) about {f * x1:.0f} s.",
                  ""]
    (HERE / "stream.md").write_text("\n".join(lines) + "\n")


def klrelease_streams(name: str) -> bool:
    from klrelease.mechanisms import get_mechanism

    return bool(getattr(get_mechanism(name), "streams", False))


MODEL = """## N = 1e10 on n workers (a model on paper)

A kl-certified release of more than 2^18 rows reads the data twice, under both relations: the
first pass validates every row and label and keeps the labelled sample of 2^18 rows chosen by
their index (under label flip it also reads the features' count, mean and scatter); the
locating rounds, stages A and B and the first of two stage-C rounds read that sample in
memory on the driver; the last stage-C round passes over every row. Each pass is
embarrassingly parallel: a worker reads its partitions and reduces each to K x d x d + K x d
+ K numbers (1110 float64 at d = K = 10, about 9 kB); in the first pass, the partition's
sample of at most 2^18 rows with their labels (about 23 MB at d = 10) and, under label flip,
its d x d + d + 1 pooled numbers and its 2^16-row feature sample. Partial results are merged
pairwise on the workers (a tree of depth log2 p for p partitions), so the driver receives one
merged result per pass, whatever p. The driver sends the workers only the per-row map (frame,
released centres and shapes: K d^2 numbers), never noise. Per worker, a pass costs (1e10 / n)
rows x (read + accumulate) plus log2 p merges (9 kB; the samples: 23 MB each). So with a
floor of F seconds per 1e8 rows on one core and a release / floor ratio x (both measured
above, embedded), a release of 1e10 rows on n = 100 workers takes about x F seconds plus the
driver's design on the sample (about a second at d = 10), bounded by reading.

With the option `one_pass` the first pass is gone: the driver reads the sample's blocks of
rows (at most 16, placed by N alone; each in one or two row groups, here of 1e6 rows) and the
workers pass over every row once, counting the classes in the same pass; the ratio x is then
that of the `+one-pass` columns. It needs the row groups' sizes before reading: Parquet files
or arrays read where they are (a `ParquetSource` on each worker's files); a Dask dataframe's
partition lengths are not known without a pass, so on a Dask cluster the release keeps its
two passes.
"""


if __name__ == "__main__":
    main()
