"""``klrelease audit``.

Exit status: 0 when no violation is found, 1 when one is, 2 on bad input (one ``error:`` line).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .app import (
    DATASET_HELP,
    Force,
    _fail,
    _load_input,
    _write_atomic,
    app,
    check_output,
    err_console,
    mechanism_inputs,
    option_help,
    out_console,
)

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["audit_command", "summary_table"]


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def summary_table(report) -> Table:
    """A readable table of the worst pair: delta(eps) per component and direction."""
    from rich.table import Table

    w = report.worst_pair
    title = f"worst pair: {w.description}" if w is not None else "no pair examined"
    table = Table(title=title)
    for col in ("direction", "component", "estimate", "lower", "upper", "mismatch", "kind"):
        table.add_column(col, justify="left" if col in ("direction", "component") else "right")
    if w is None:
        return table
    for d in w.directions:
        rows = [(c, b, "exact") for c, b in d.exact_components.items()]
        rows += [(c, b, "MC") for c, b in d.components.items()]
        rows.append(("joint", d.joint, "MC"))
        for c, b, kind in rows:
            style = "bold red" if b.lower > report.delta * (1 + 1e-6) + 1e-12 else None
            table.add_row(d.direction, c, _fmt(b.estimate), _fmt(b.lower), _fmt(b.upper),
                          _fmt(b.support_mismatch), kind, style=style)
    return table


@app.command("audit")
def audit_command(
    mechanism: Annotated[str, typer.Option(help="see 'klrelease mechanisms'")],
    epsilon: Annotated[float, typer.Option(help="claimed epsilon (> 0)")],
    delta: Annotated[float, typer.Option(help="claimed delta, in (0, 1)")],
    dataset: Annotated[str | None, typer.Option(help=DATASET_HELP)] = None,
    csv: Annotated[Path | None, typer.Option(help="CSV file with a header row")] = None,
    label_column: Annotated[str | None, typer.Option(help="label column of --csv")] = None,
    npz: Annotated[Path | None, typer.Option(help=".npz file with arrays X and y")] = None,
    out: Annotated[Path | None, typer.Option(help="write the JSON report here")] = None,
    samples: Annotated[int, typer.Option(help="draws per direction for confirmed pairs")] = 2000,
    max_pairs: Annotated[int, typer.Option(help="most neighbouring datasets examined")] = 300,
    screen_samples: Annotated[
        int | None, typer.Option(help="draws per direction when screening (default 200)")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="seed of the audit's randomness")] = None,
    time_limit: Annotated[
        float, typer.Option(help="seconds the audit may take (0: no limit)")
    ] = 600.0,
    neighbouring: Annotated[
        str | None, typer.Option(help="relation to audit (default: the mechanism's own)")
    ] = None,
    lower: Annotated[str | None, typer.Option(help="public lower bound(s), comma list")] = None,
    upper: Annotated[str | None, typer.Option(help="public upper bound(s), comma list")] = None,
    norm_bound: Annotated[float | None, typer.Option(help="public bound on ||x||_2")] = None,
    classes: Annotated[str | None, typer.Option(help="the public set of classes, a,b,c")] = None,
    option: Annotated[list[str] | None, typer.Option(help=option_help())] = None,
    force: Force = False,
):
    """Audit a mechanism's (epsilon, delta) claim on a dataset (exit 1 on a violation)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from ..audit.runner import audit
    from ..data import check_privacy_parameters
    from ..mechanisms import get_mechanism

    eps, dlt = check_privacy_parameters(epsilon, delta)
    mech = get_mechanism(mechanism)
    if samples < 10:
        _fail(f"--samples must be >= 10, got {samples}")
    if max_pairs < 1:
        _fail(f"--max-pairs must be >= 1, got {max_pairs}")
    if time_limit < 0:
        _fail(f"--time-limit must be >= 0, got {time_limit}")
    opts, bounds, classes = mechanism_inputs(mech, option, lower, upper, norm_bound, classes)
    if out is not None:
        check_output(out, force)
    data = _load_input(dataset, csv, label_column, npz, classes)

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(f"{stage} pairs", total=total)
            bar.update(tasks[stage], completed=done)

        report = audit(mech.name, data, epsilon=eps, delta=dlt, bounds=bounds,
                       neighbouring=neighbouring, n_samples=samples,
                       max_pairs=max_pairs, seed=seed, progress=progress, n_screen=screen_samples,
                       time_limit=time_limit if time_limit > 0 else None, **opts)

    out_console.print(
        f"[bold]{report.mechanism}[/] audited at epsilon={report.epsilon:g}, "
        f"delta={report.delta:g}, neighbours: {report.neighbouring} "
        f"({report.pairs_examined} pair(s) examined, {report.search}"
        + (f", {report.pairs_refused} refused by the mechanism" if report.pairs_refused else "")
        + (", cut short by the time limit" if report.stopped_by_time_limit else "")
        + f"; {report.time_s:.1f} s)"
    )
    out_console.print(summary_table(report))
    if report.worst_pair is not None:
        def show(x):
            return "+inf" if x is None else f"{x:.3g}"

        losses = "; ".join(f"{d.direction}: 99th percentile {show(d.loss_q99)}, max "
                           f"{show(d.loss_max)}" for d in report.worst_pair.directions)
        out_console.print(f"privacy loss L of the worst pair ({losses}); epsilon = "
                          f"{report.epsilon:g}")
    colour = "red" if report.violation else "green"
    out_console.print(f"[bold {colour}]{report.verdict}[/]")
    out_console.print("An audit can refute a privacy claim, not prove it; see 'limits' in the "
                      "JSON report.")
    if out is not None:
        _write_atomic(out, report.to_json(), force)
        err_console.print(f"wrote {out}")
    if report.violation:
        raise typer.Exit(code=1)
