"""Peak memory and time of ``klrelease learn`` on CSV files of unlabelled rows.

For every N (d = 2: a mixture of two unit Gaussians at (+-5, 0)), a CSV file is generated
once under ``--cache`` (not part of the repository). Each case runs ``klrelease learn`` in a
fresh process (``klrelease.cli.main`` on the file, seeded) and reports that process's peak
resident memory (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, which includes the
interpreter and the imported libraries), its wall time, the file size and the floor of a
whole-array reader, ``8 N d`` bytes (the rows as float64). ``dp-em`` streams the file in
chunked passes; the other learners need every row in memory and read the selected columns as
float64 into one array.

``--baseline PATH`` runs every case a second time, in the same run, with the package at
``PATH`` (e.g. a checkout of an earlier version) first on ``sys.path``: its columns are the
"before" of a change.

    nice -n 10 python benchmarks/bench_learn_csv.py --n 1e6 1e7

Prints a markdown table and writes it to ``benchmarks/learn_csv.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
D = 2

#: The learners measured: components and public options that suit the generated mixture.
LEARNERS = {
    "dp-em": (2, ["R=10", "sigma_max=2"]),
    "park-dp-em": (2, ["R=10", "sigma_max=2"]),
    "kamath-pgme-lite": (2, ["R=10", "sigma_min=0.5", "sigma_max=2"]),
    "kamath-pegme": (2, ["sigma_min=1", "kappa=2", "inflate=1.5"]),
    "kamath-sa-lite": (2, ["R=10", "sigma_min=0.5", "sigma_max=2"]),
    "afzali-style-sample-aggregate": (2, ["sigma_max=3", "w_mu=2", "r_init=1"]),
    "ppe-gmm": (2, []),
    "ppe-gaussian-oneshot": (1, []),
    "ppme-gaussian": (1, []),
}
DEFAULT_LEARNERS = ("dp-em", "park-dp-em")


def generate(n: int, cache: Path) -> Path:
    """A CSV file of n rows (columns a, b), written once with pyarrow."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    path = cache / f"learn-{n}x{D}.csv"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    rng = np.random.default_rng(0)
    with pcsv.CSVWriter(tmp, pa.schema([("a", pa.float64()), ("b", pa.float64())])) as w:
        for s in range(0, n, 1_000_000):
            m = min(1_000_000, n - s)
            X = rng.normal(size=(m, D))
            X[:, 0] += np.where(rng.random(m) < 0.4, -5.0, 5.0)
            w.write_table(pa.table({"a": X[:, 0], "b": X[:, 1]}))
    tmp.rename(path)
    return path


_CHILD = """
import json, resource, sys, time
sys.argv = ["klrelease"]
from klrelease.cli import main
t0 = time.perf_counter()
code = main({args!r})
t = time.perf_counter() - t0
print(json.dumps({{"code": code, "seconds": t,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}}))
"""


def run_case(csv: Path, learner: str, code_root: str, out: Path, timeout: float) -> dict:
    """One ``klrelease learn`` in a fresh process with ``code_root`` first on the path (a
    case that takes longer than ``timeout`` seconds is stopped and reported as such)."""
    k, params = LEARNERS[learner]
    args = ["learn", "--csv", str(csv), "--components", str(k), "--epsilon", "1", "--delta",
            "1e-6", "--learner", learner, "--seed", "0", "--out", str(out), "--force"]
    for p in params:
        args += ["--param", p]
    env = dict(os.environ, PYTHONPATH=code_root, MPLBACKEND="Agg")
    try:
        r = subprocess.run([sys.executable, "-c", _CHILD.format(args=args)], env=env,
                           capture_output=True, text=True, cwd=code_root, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"outcome": f"over {timeout:g} s", "peak_mb": float("nan"),
                "seconds": float("nan")}
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(f"{learner} failed:\n{r.stderr[-2000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    if res["code"] not in (0, 3):
        raise RuntimeError(f"{learner} exited {res['code']}:\n{r.stderr[-2000:]}")
    res["outcome"] = "model" if res["code"] == 0 else "FAIL"
    return res


def _commit(path: str) -> str:
    r = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True,
                       text=True)
    return r.stdout.strip() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", nargs="+", type=float, default=[1e6, 1e7])
    ap.add_argument("--learners", nargs="+", default=list(DEFAULT_LEARNERS),
                    choices=list(LEARNERS))
    ap.add_argument("--baseline", help="a checkout of the package to compare against")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per case")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "klrelease-bench")
    ap.add_argument("--out", type=Path, default=HERE / "learn_csv.md")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    here = str(HERE.parent)
    header = ["N", "d", "CSV MB", "8Nd MB", "learner", "outcome", "peak RSS MB", "seconds"]
    if a.baseline:
        header += ["baseline peak RSS MB", "baseline seconds", "peak ratio"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    print(lines[0], lines[1], sep="\n", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(v) for v in a.n):
            csv = generate(n, a.cache)
            size = csv.stat().st_size / 2**20
            floor = 8 * n * D / 2**20
            for learner in a.learners:
                r = run_case(csv, learner, here, Path(tmp) / "out.json", a.timeout)
                row = [f"{n:.0e}", str(D), f"{size:.0f}", f"{floor:.1f}", learner, r["outcome"],
                       f"{r['peak_mb']:.0f}", f"{r['seconds']:.1f}"]
                if a.baseline:
                    b = run_case(csv, learner, str(Path(a.baseline).resolve()),
                                 Path(tmp) / "base.json", a.timeout)
                    row += [f"{b['peak_mb']:.0f}", f"{b['seconds']:.1f}",
                            f"{r['peak_mb'] / b['peak_mb']:.2f}"]
                lines.append("| " + " | ".join(row) + " |")
                print(lines[-1], flush=True)
    text = (f"`python benchmarks/bench_learn_csv.py --n {' '.join(f'{v:g}' for v in a.n)} "
            f"--learners {' '.join(a.learners)}"
            + (" --baseline BEFORE" if a.baseline else "") + "`\n\n"
            + (f"BEFORE: the package at commit {_commit(a.baseline)}.\n\n" if a.baseline
               else "")
            + "Peak RSS of the whole `klrelease learn` process (interpreter and libraries "
            "included), one fresh process per case; 8Nd: the rows as float64.\n\n"
            + "\n".join(lines) + "\n")
    if not a.no_write:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
