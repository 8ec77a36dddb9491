"""``klrelease experiment NAME [--quick] [--trials T] [--out DIR] [--jobs J]``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..cli import app, err_console

__all__ = ["experiment_command"]


@app.command("experiment")
def experiment_command(
    name: Annotated[str, typer.Argument(help="fig1 .. fig13")],
    quick: Annotated[bool, typer.Option("--quick", help="a reduced run for CI (seconds)")] = False,
    trials: Annotated[int | None, typer.Option("--trials", help="number of datasets")] = None,
    out: Annotated[Path, typer.Option("--out", help="parent folder of the results")] = Path(
        "experiments"),
    jobs: Annotated[int, typer.Option("--jobs", help="worker processes over trials")] = 1,
):
    """Reproduce one of the paper's figures: CSV of every trial, PNG and JSON."""
    from .real import REAL_EXPERIMENTS, run_real_experiment
    from .run import run_experiment

    if name in REAL_EXPERIMENTS:
        if jobs != 1:
            err_console.print("--jobs is ignored by the real-data figures (one process)")
        res = run_real_experiment(name, quick=quick, trials=trials, out=out)
        failed = sum(1 for r in res.rows if r.get("status") != "ok")
        if failed:
            err_console.print(f"{failed} results failed; see the CSV and the JSON's errors")
        err_console.print(f"{name}: {len(res.rows)} rows in {res.wall_seconds:.1f} s -> "
                          f"{res.csv_path}, {res.png_path}, {res.json_path}")
        return

    res = run_experiment(name, quick=quick, trials=trials, out=out, jobs=jobs)
    if res.missing_mechanisms:
        err_console.print("not registered, left out: " + ", ".join(res.missing_mechanisms))
    failed = sum(1 for r in res.rows if r.get("status") != "ok")
    if failed:
        err_console.print(f"{failed} (trial, value, mechanism) results failed; see the CSV")
    err_console.print(
        f"{res.experiment.name}: {len(res.rows)} rows in {res.wall_seconds:.1f} s -> "
        f"{res.csv_path}, {res.png_path}, {res.json_path}"
    )
