"""``klrelease sample`` against the floor of drawing and writing the same amount of data.

A release of a 10-class mixture in 10 dimensions (kl-certified, seeded: a benchmark) is made
once. For every N and format (CSV, Parquet), each in a fresh process so that its peak memory
is its own, and in the same run:

* ``sample``: ``klrelease sample r.json -n N --seed 1 --out FILE`` (the command's function
  run in the child, numpy, pyarrow, the artifact's module and the mechanisms, which
  reading an artifact uses to recompute its claim, imported first; its wall and CPU time);
* ``floor``: ``numpy``'s ``standard_normal`` of the same size and integer labels, in the same
  blocks, written by pyarrow in one thread (``CSVWriter`` / ``ParquetWriter``) to the same
  kind of file. Its arrays are made from the numpy buffers (``pyarrow.Array.from_buffers``),
  as ``sample`` makes them: ``pyarrow.array`` of a numpy array imports pandas on first use
  (0.3 to 0.6 s here), which would be counted in the floor's time.

``sample`` uses two threads (CSV: the draw and orjson's text of the numbers in one, pyarrow's
assembly of the lines and the write in the other; Parquet: the draw in one, pyarrow's encoding
and the write in the other); its CPU time is summed over both.

rows/s = N / wall time; x floor = sample time / floor time; peak = the child's peak resident
memory. Output files go to a temporary folder and are removed after each row.

    python benchmarks/bench_sample.py [--n 1e6 1e7]

Prints a markdown table and writes it to ``benchmarks/sample.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
D, K = 10, 10


def _child(kind: str, fmt: str, n: int, artifact: str, out: str) -> None:
    """Run one measurement in this process and print it as JSON (the libraries both use are
    imported first: the times are of drawing and writing)."""
    import numpy as np
    import pyarrow.csv  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    import klrelease.artifact  # noqa: F401
    import klrelease.cli  # noqa: F401
    import klrelease.mechanisms  # noqa: F401  (reading an artifact recomputes its claim)

    t0, c0 = time.perf_counter(), time.process_time()
    if kind == "sample":
        from klrelease.cli import main

        fmt_flag = ["--format", fmt] if fmt != "csv" else []  # (--format is newer than csv)
        code = main(["sample", artifact, "-n", str(n), "--seed", "1", "--out", out, *fmt_flag])
        assert code == 0
    else:
        import pyarrow as pa

        from klrelease.cli.release import SAMPLE_CHUNK

        rng = np.random.default_rng(1)
        schema = pa.schema([*(pa.field(f"x{j}", pa.float64()) for j in range(D)),
                            pa.field("label", pa.int64())])
        with open(out, "wb") as fh:
            if fmt == "csv":
                import pyarrow.csv as pcsv

                fh.write((",".join(schema.names) + "\n").encode())
                writer = pcsv.CSVWriter(fh, schema, write_options=pcsv.WriteOptions(
                    include_header=False, quoting_style="none"))
            else:
                import pyarrow.parquet as pq

                writer = pq.ParquetWriter(fh, schema, use_dictionary=["label"])
            for a in range(0, n, SAMPLE_CHUNK):
                m = min(SAMPLE_CHUNK, n - a)
                X = rng.standard_normal((m, D))
                y = rng.integers(0, K, m, dtype=np.int64)
                writer.write_batch(pa.RecordBatch.from_arrays(
                    [pa.Array.from_buffers(pa.float64(), m, [None, pa.py_buffer(col)])
                     for col in np.ascontiguousarray(X.T)]
                    + [pa.Array.from_buffers(pa.int64(), m, [None, pa.py_buffer(y)])],
                    schema=schema))
            writer.close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    print(json.dumps({"wall": wall, "cpu": cpu, "peak_mb": peak,
                      "bytes": os.path.getsize(out)}))


def _measure(kind: str, fmt: str, n: int, artifact: Path, folder: Path,
             code: Path = ROOT) -> dict:
    out = folder / f"{kind}.{fmt}"
    env = {**os.environ, "PYTHONPATH": str(code)}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, __file__, "--child", kind, fmt, str(n), str(artifact),
                        str(out)], env=env, capture_output=True, text=True)
    total = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"{kind} {fmt} {n} failed: {r.stderr[-2000:]}")
    res = json.loads(r.stdout.splitlines()[-1])
    res["process"] = total
    out.unlink()
    return res


def _flags(args) -> str:
    return "" if args.repeat == 3 else f" --repeat {args.repeat}"


def _median_run(runs: list[dict]) -> dict:
    """The run of median wall time (the lower middle one of an even number)."""
    return sorted(runs, key=lambda r: r["wall"])[(len(runs) - 1) // 2]


def _versions() -> str:
    from importlib.metadata import version

    return ", ".join(f"{name} {version(name)}" for name in ("numpy", "pyarrow", "orjson"))


def _artifact(folder: Path) -> Path:
    import numpy as np

    rng = np.random.default_rng(0)
    centres = rng.normal(scale=3.0, size=(K, D))
    y = rng.integers(0, K, 20_000)
    X = centres[y] + rng.normal(size=(len(y), D))
    np.savez(folder / "d.npz", X=X, y=y)
    art = folder / "r.json"
    r = subprocess.run([sys.executable, "-m", "klrelease", "release", "--npz", "d.npz",
                        "--epsilon", "1", "--delta", "1e-5", "--seed", "0", "--classes",
                        ",".join(map(str, range(K))), "--out", str(art)], cwd=folder,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                       text=True)
    if r.returncode:
        raise SystemExit(r.stderr)
    return art


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, fmt, n, artifact, out = sys.argv[2:7]
        _child(kind, fmt, int(n), artifact, out)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=float, nargs="+", default=[1e6, 1e7])
    ap.add_argument("--out", type=Path, default=HERE / "sample.md")
    ap.add_argument("--before", type=Path, default=None,
                    help="another checkout: its sample command to CSV at the first N, in the "
                         "same run")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each measurement, sample and floor alternating; the run of "
                         "median wall time is reported")
    args = ap.parse_args()

    load0 = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-sample-") as tmp:
        folder = Path(tmp)
        artifact = _artifact(folder)
        for n in (int(v) for v in args.n):
            for fmt in ("csv", "parquet"):
                runs: dict[str, list] = {"sample": [], "floor": []}
                for _ in range(args.repeat):
                    for kind, kept in runs.items():
                        kept.append(_measure(kind, fmt, n, artifact, folder))
                s, f = _median_run(runs["sample"]), _median_run(runs["floor"])
                rows.append((n, fmt, s, f))
                walls = {kind: " ".join(f"{r['wall']:.2f}" for r in kept)
                         for kind, kept in runs.items()}
                print(f"{n:.0e} {fmt}: sample {walls['sample']} s, floor {walls['floor']} s",
                      file=sys.stderr)
        before = None
        if args.before is not None:
            n = int(args.n[0])
            before = (n, _median_run([
                _measure("sample", "csv", n, artifact, folder, args.before.resolve())
                for _ in range(args.repeat)]))
    load1 = os.getloadavg()[0]

    lines = ["# Synthetic rows: `klrelease sample` (d = 10, K = 10)", "",
             f"Produced by `python benchmarks/bench_sample.py --n "
             f"{' '.join(f'{v:.0e}' for v in args.n)}{_flags(args)}` on a shared "
             f"{os.cpu_count()}-core "
             f"machine (Python {platform.python_version()}, {_versions()}; load average "
             f"{load0:.1f} at the start, {load1:.1f} at the end). sample = the command in a "
             "fresh process (`--seed 1`; wall and CPU time of the command once numpy, "
             "pyarrow, the artifact's module and the mechanisms (which reading an artifact "
             "uses to recompute its claim) are imported, CPU summed over its two threads: CSV "
             "draws and makes the numbers' text (orjson) in one, assembles the lines (pyarrow) "
             "and writes in the other; Parquet draws in one, encodes and writes in the other; "
             "process = the whole process, start-up included); floor = numpy's "
             "`standard_normal` of the same size and integer labels, in the same blocks, "
             "written by pyarrow in one thread (its CSV or Parquet writer, arrays made from "
             "the numpy buffers, so pandas is not imported), in its own process; rows/s = N / "
             "wall time; x floor = sample / floor wall time; peak = peak resident memory of "
             f"the process. Each is the run of median wall time of {args.repeat}, sample and "
             "floor alternating.", "",
             "| N | format | sample (s) | rows/s | CPU (s) | process (s) | peak (MB) | "
             "file (MB) | floor (s) | floor rows/s | floor CPU (s) | floor peak (MB) | "
             "x floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, fmt, s, f in rows:
        lines.append(
            f"| {n:.0e} | {fmt} | {s['wall']:.2f} | {n / s['wall']:.3g} | {s['cpu']:.2f} | "
            f"{s['process']:.2f} | {s['peak_mb']:.0f} | {s['bytes'] / 1e6:.0f} | "
            f"{f['wall']:.2f} | {n / f['wall']:.3g} | {f['cpu']:.2f} | {f['peak_mb']:.0f} | "
            f"{s['wall'] / f['wall']:.2f} |")
    if before is not None:
        n, b = before
        rev = subprocess.run(["git", "-C", str(args.before), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        (csv_row,) = [s for m, fmt, s, _ in rows if m == n and fmt == "csv"]
        lines += ["", f"Before (the same command on commit {rev or args.before.name}, CSV, N = "
                  f"{n:.0e}, same run): {b['wall']:.1f} s, {n / b['wall']:.3g} rows/s, CPU "
                  f"{b['cpu']:.1f} s, peak {b['peak_mb']:.0f} MB, file "
                  f"{b['bytes'] / 1e6:.0f} MB; now "
                  f"{b['wall'] / csv_row['wall']:.1f}x faster."]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
