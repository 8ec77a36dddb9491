"""Run one figure end to end and write its results folder.

``run_experiment("fig2", out="experiments")`` writes ``experiments/fig2/``:

* ``fig2.csv``  one row per (trial, value of the sweep, mechanism) (:data:`runner.FIELDS`);
* ``fig2.png``  the figure (:func:`figures.plot_experiment`);
* ``fig2.json`` the settings, the per-point summary, the guarantee each mechanism states, the
  warnings it raised, solver usage, library versions, wall time and the command that
  reproduces the folder.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from .._version import __version__
from .figures import plot_experiment
from .runner import FIELDS, TrialOutcome, available_mechanisms, run_trials
from .settings import Experiment, get_experiment
from .summary import summarise

__all__ = ["ExperimentResult", "run_experiment", "command_line"]

_PACKAGES = ("numpy", "scipy", "cvxpy", "clarabel", "scs", "matplotlib", "scikit-learn",
             "randomgen", "mosek")


@dataclass(frozen=True)
class ExperimentResult:
    """Where a run wrote its outputs, and what it measured."""

    experiment: Experiment
    directory: Path
    csv_path: Path
    png_path: Path
    json_path: Path
    rows: list[dict]
    summary: list[dict]
    wall_seconds: float
    missing_mechanisms: list[str]


def command_line(name: str, *, quick: bool, trials: int | None, out, jobs: int) -> str:
    """The ``klrelease experiment`` command equivalent to these arguments."""
    parts = ["klrelease", "experiment", name]
    if quick:
        parts.append("--quick")
    if trials is not None:
        parts += ["--trials", str(int(trials))]
    parts += ["--out", str(out)]
    if jobs != 1:
        parts += ["--jobs", str(int(jobs))]
    return " ".join(parts)


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"klrelease": __version__, "python": platform.python_version()}
    for pkg in _PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def _git_revision() -> dict[str, object] | None:
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--",
                                "klrelease", "solvers"], capture_output=True, text=True,
                               timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": rev, "library_sources_modified": bool(dirty)}


def _clean(value):
    """JSON-safe: NaN and infinities become None, numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _cell(value) -> str:
    """A CSV cell: empty for None, floats to 8 significant digits."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.8g}"
    return str(value)


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(FIELDS), extrasaction="raise")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: _cell(r.get(k)) for k in FIELDS})


def _merge(outcomes: list[TrialOutcome]):
    rows, warns, guarantees, solvers = [], {}, {}, {}
    for o in outcomes:
        rows.extend(o.rows)
        for m, counter in o.warnings.items():
            agg = warns.setdefault(m, {})
            for msg, n in counter.items():
                agg[msg] = agg.get(msg, 0) + n
        for m, g in o.guarantees.items():
            guarantees.setdefault(m, g)
        for s, n in o.solvers.items():
            solvers[s] = solvers.get(s, 0) + n
    return rows, warns, guarantees, solvers


@contextlib.contextmanager
def progress_bar(title: str, total: int, enabled: bool = True):
    """A rich progress bar over ``total`` units (or none); yields the function advancing it."""
    if not enabled:
        yield lambda *_: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn(f"[bold]{title}[/]"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn()) as bar:
        task = bar.add_task(title, total=total)
        yield lambda *_: bar.advance(task)


def run_experiment(
    name: str,
    *,
    quick: bool = False,
    trials: int | None = None,
    out: str | os.PathLike = "experiments",
    jobs: int = 1,
    progress: bool = True,
) -> ExperimentResult:
    """Run the figure ``name`` and write its CSV, PNG and JSON under ``out/name/``.

    Parameters
    ----------
    name : str
        ``fig1``, ``fig2``, ``fig3``, ``fig4``, ``fig5`` or ``fig13``.
    quick : bool
        A reduced run (three values, a few trials and draws) that finishes in seconds.
    trials : int, optional
        Override the number of trials (datasets).
    out : path
        The parent directory of the results folder (created if missing).
    jobs : int
        Worker processes over trials (1 runs in this process).
    progress : bool
        Show a progress bar on the console.
    """
    exp = get_experiment(name).configured(quick=quick, trials=trials)
    if int(jobs) < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    mechs, missing = available_mechanisms(exp)
    if not mechs:
        raise ValueError(f"none of the mechanisms of {name} is registered")
    directory = Path(out) / exp.name
    directory.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    with progress_bar(f"{exp.name} trials", exp.trials, progress) as advance:
        outcomes = run_trials(exp, mechs, jobs=int(jobs), on_done=advance)
    rows, warns, guarantees, solvers = _merge(outcomes)
    mech_names = [m.id for m in mechs]
    summary = summarise(rows, mech_names, exp.values)
    wall_trials = time.perf_counter() - t0

    csv_path = directory / f"{exp.name}.csv"
    png_path = directory / f"{exp.name}.png"
    json_path = directory / f"{exp.name}.json"
    _write_csv(csv_path, rows)
    labels = {m.id: m.label for m in mechs}
    plot_experiment(exp, summary, labels, png_path)
    wall = time.perf_counter() - t0
    plan_time: dict[str, float] = {}
    for r in rows:
        plan_time[r["mechanism"]] = plan_time.get(r["mechanism"], 0.0) + float(
            r.get("plan_seconds") or 0.0)
    meta = {
        "experiment": exp.to_dict(),
        "quick": bool(quick),
        "command": command_line(name, quick=quick, trials=trials, out=out, jobs=int(jobs)),
        "started_utc": started.isoformat(timespec="seconds"),
        "wall_seconds": round(wall, 2),
        "wall_seconds_trials": round(wall_trials, 2),
        "plan_seconds_by_mechanism": {k: round(v, 2) for k, v in plan_time.items()},
        "jobs": int(jobs),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "versions": _versions(),
        "git": _git_revision(),
        "missing_mechanisms": missing,
        "guarantees": guarantees,
        "warnings_recorded": warns,
        "solvers_used": solvers,
        "failed_rows": sum(1 for r in rows if r.get("status") != "ok"),
        "summary": summary,
        "files": {"csv": csv_path.name, "png": png_path.name},
    }
    json_path.write_text(json.dumps(_clean(meta), indent=2) + "\n")
    return ExperimentResult(exp, directory, csv_path, png_path, json_path, rows, summary, wall,
                            missing)
