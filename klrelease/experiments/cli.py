"""``klrelease experiment NAME [--quick] [--trials T] [--out DIR] [--jobs J]``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..cli import app, err_console

__all__ = ["experiment_command"]


@app.command("experiment")
def experiment_command(
    name: Annotated[str, typer.Argument(help="fig1, fig2, fig3, fig4, fig5, fig13 or ppe-regimes")],
    quick: Annotated[bool, typer.Option("--quick", help="a reduced run for CI (seconds)")] = False,
    trials: Annotated[int | None, typer.Option("--trials", help="number of datasets")] = None,
    out: Annotated[Path, typer.Option("--out", help="parent folder of the results")] = Path(
        "experiments"),
    jobs: Annotated[int, typer.Option("--jobs", help="worker processes over trials")] = 1,
):
    """Reproduce one of the paper's synthetic figures: CSV of every trial, PNG and JSON."""
    if name == "ppe-regimes":  # the PPE utility simulation (its own runner)
        from .ppe_regimes import run_ppe_regimes

        rec = run_ppe_regimes(quick=quick, out=out, reps=trials)
        err_console.print(f"ppe-regimes: {rec['wall_seconds']:.1f} s, all within tolerance: "
                          f"{rec['all_within_tolerance']} -> {', '.join(rec['paths'])}")
        return
    from .run import run_experiment

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
