"""Start-up time of the command line against ``python -c "import numpy"``.

Runs, round-robin (so that a change of load on the machine touches every command alike), each
command ``--runs`` times in a fresh process and reports the median wall time and its ratio to
the median of ``python -c "import numpy"`` measured in the same run. ``klrelease`` is the
console script installed beside this interpreter, run on this checkout (``PYTHONPATH``);
``--before DIR`` adds a column for another checkout (e.g. the commit before a change) run the
same way, in the same rounds.

    python benchmarks/bench_startup.py [--runs 7] [--before /path/to/other/checkout]

Prints a markdown table and writes it to ``benchmarks/startup.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

COMMANDS = (["--version"], ["--help"], ["release", "--help"], ["sample", "--help"],
            ["release", "--no-such-option"])


def klrelease_command() -> list[str]:
    """The console script beside this interpreter, else ``python -m klrelease``."""
    script = Path(sysconfig.get_path("scripts")) / "klrelease"
    if script.is_file():
        return [sys.executable, str(script)]
    return [sys.executable, "-m", "klrelease"]


def _time(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       cwd=ROOT)
    elapsed = time.perf_counter() - t0
    if r.returncode not in (0, 2):
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.decode()[-500:]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--before", type=Path, default=None,
                    help="another checkout, timed the same way in the same rounds")
    ap.add_argument("--out", type=Path, default=HERE / "startup.md")
    args = ap.parse_args()

    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    envs = {"this": {**base_env, "PYTHONPATH": str(ROOT)}}
    if args.before is not None:
        envs["before"] = {**base_env, "PYTHONPATH": str(args.before.resolve())}
    kl = klrelease_command()
    runs: list[tuple[str, str, list[str]]] = [("numpy", "this",
                                               [sys.executable, "-c", "import numpy"])]
    for c in COMMANDS:
        for which in envs:
            runs.append((" ".join(c), which, kl + c))
    times: dict[tuple[str, str], list[float]] = {(k, w): [] for k, w, _ in runs}
    for _key, which, cmd in runs:  # warm the file cache and the bytecode caches
        _time(cmd, envs[which])
    for _ in range(args.runs):
        for cmd_key, which, cmd in runs:
            times[(cmd_key, which)].append(_time(cmd, envs[which]))
    med = {k: statistics.median(v) for k, v in times.items()}
    ref = med[("numpy", "this")]

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    before = ""
    if args.before:
        rev = subprocess.run(["git", "-C", str(args.before), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        before = f" (commit {rev})" if rev else f" ({args.before.name})"
    lines = ["# Start-up of the command line", "",
             f"Produced by `python benchmarks/bench_startup.py --runs {args.runs}"
             + (" --before OTHER_CHECKOUT" if args.before else "") + "` on a shared "
             f"{os.cpu_count()}-core machine (Python {platform.python_version()}, load "
             f"average {load:.1f} at the end). Median wall time of {args.runs} runs, each in "
             "a fresh process, the commands taken in turn in every round; x numpy = the "
             "median over that of `python -c \"import numpy\"` in the same run. `klrelease` is "
             "the installed console script run on this checkout"
             + (f"; before = the same script run on the other checkout{before}, in the same "
               "rounds."
                if args.before else "."), ""]
    head = "| command | median (s) | x numpy |"
    rule = "|---|---|---|"
    if args.before:
        head += " before (s) | before x numpy | speed-up |"
        rule += "---|---|---|"
    lines += [head, rule, f"| `python -c \"import numpy\"` | {ref:.3f} | 1.00 |"
              + (" | | |" if args.before else "")]
    for c in COMMANDS:
        key = " ".join(c)
        t = med[(key, "this")]
        row = f"| `klrelease {key}` | {t:.3f} | {t / ref:.2f} |"
        if args.before:
            b = med[(key, "before")]
            row += f" {b:.3f} | {b / ref:.2f} | {b / t:.1f}x |"
        lines.append(row)
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
