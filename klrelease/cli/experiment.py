"""``klrelease experiment NAME [--quick] [--trials T] [--out DIR] [--jobs J]``.

Every study of the project runs from here, its library code in :mod:`klrelease.experiments`,
its results under ``OUT/NAME/`` (``experiments/`` by default): the paper's figures and the
studies listed by :func:`_extra_experiments`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from pathlib import Path
from typing import Annotated

import typer

from .app import _fail, app, err_console

__all__ = ["experiment_command"]


def _learners_regimes(*, out: Path, quick: bool, trials: int | None, **_) -> str:
    from ..experiments.learners_regimes import run_learners_regimes

    run_learners_regimes(out, quick=quick, trials=trials)
    return f"learners-regimes -> {out / 'learners_regimes'}"


def _learners_speed(*, out: Path, quick: bool, trials: int | None, **_) -> str:
    from ..experiments.learners_regimes import run_speed_check

    return str(run_speed_check(out))


def _information_limit(*, out: Path, quick: bool, trials: int | None, **_) -> str:
    from ..experiments.learners_regimes import run_information_limit

    return f"information-limit -> {run_information_limit(out, quick=quick)}"


def _ppe_regimes(*, out: Path, quick: bool, trials: int | None, **_) -> str:
    from ..experiments.ppe_regimes import run_ppe_regimes

    rec = run_ppe_regimes(quick=quick, out=out, reps=trials)
    return (f"ppe-regimes: {rec['wall_seconds']:.1f} s, all within tolerance: "
            f"{rec['all_within_tolerance']} -> {', '.join(rec['paths'])}")


def _solver_study(*, out: Path, quick: bool, trials: int | None,
                  time_limit: float | None = None, **_) -> str:
    from ..experiments.solver_study import run_solver_study

    folder = run_solver_study(out, quick=quick, time_limit=time_limit,
                              log=lambda line: err_console.print(line, highlight=False))
    return f"solver-study -> {folder}"


def _certified_study(name: str, runner: str, result: str, module: str = "certified"):
    """A study of kl-certified (in ``klrelease.experiments.<module>``): ``runner`` writes
    ``result`` under ``out/certified``; ``--draws`` (or ``--trials``) sets its Monte Carlo
    draws."""

    def run(*, out: Path, quick: bool, trials: int | None, draws: int | None = None,
            **_) -> str:
        studies = importlib.import_module(f"klrelease.experiments.{module}")

        folder = getattr(studies, runner)(
            out, quick=quick, trials=draws or trials,
            log=lambda line: err_console.print(line, highlight=False))
        return f"{name} -> {folder / result}"

    return run


def _extra_experiments() -> dict:
    """Studies beyond the paper's synthetic sweeps: name -> runner returning a summary line."""
    return {"ppe-regimes": _ppe_regimes, "learners-regimes": _learners_regimes,
            "learners-speed": _learners_speed, "information-limit": _information_limit,
            "solver-study": _solver_study,
            "certified": _certified_study("certified", "run_certified", "results.md"),
            "loose-bounds": _certified_study("loose-bounds", "run_loose_bounds",
                                             "loose_bounds.md"),
            "oracle-bound": _certified_study("oracle-bound", "run_oracle_bound",
                                             "oracle_bound.md"),
            "rate-in-n": _certified_study("rate-in-n", "run_rate_in_n", "rate_in_n.md"),
            "heldout": _certified_study("heldout", "run_heldout", "heldout.md"),
            "heldout-sweep": _certified_study("heldout-sweep", "run_heldout_sweep",
                                              "heldout_sweep.md"),
            "heldout-loose": _certified_study("heldout-loose", "run_heldout_loose",
                                              "heldout_loose.md"),
            "bias-floor": _certified_study("bias-floor", "run_bias_floor", "bias_floor.md"),
            "fresh-sets": _certified_study("fresh-sets", "run_fresh_sets", "fresh_sets.md",
                                           module="fresh")}


#: Options that only some studies take: option -> the studies that take it.
STUDY_OPTIONS = {"--time-limit": ("solver-study",),
                 "--draws": ("certified", "loose-bounds", "oracle-bound", "rate-in-n", "heldout",
                             "heldout-sweep", "heldout-loose", "bias-floor", "fresh-sets")}


def report_outcomes(rows: list[dict]) -> None:
    """Say how many results are a mechanism's FAIL output (an outcome its proof covers, e.g.
    ppe-gaussian below the sizes it needs) and how many failed (an error)."""
    fail = [r for r in rows if r.get("status") == "FAIL"]
    errors = sum(1 for r in rows if r.get("status") not in ("ok", "FAIL"))
    if fail:
        names = ", ".join(dict.fromkeys(r["mechanism"] for r in fail))
        err_console.print(f"{len(fail)} results are FAIL outcomes of the mechanism ({names}; "
                          "recorded as FAIL rows in the CSV)", highlight=False)
    if errors:
        err_console.print(f"{errors} results failed with an error; see the CSV",
                          highlight=False)


@contextlib.contextmanager
def no_empty_folders(out: Path):
    """Folders under ``out`` (and ``out`` itself) that the block creates are removed if it
    fails or is interrupted while they are still empty: an interrupted experiment leaves no
    empty results folder. Files are never removed."""
    out = Path(out)
    before = {p for p in out.rglob("*") if p.is_dir()} if out.is_dir() else None
    try:
        yield
    except BaseException:
        if before is not None or out.is_dir():
            new = [p for p in out.rglob("*") if p.is_dir() and p not in (before or set())]
            if before is None:
                new.append(out)
            for p in sorted(new, key=lambda q: len(q.parts), reverse=True):  # deepest first
                with contextlib.suppress(OSError):
                    os.rmdir(p)  # only if empty
        raise


@app.command("experiment")
def experiment_command(
    name: Annotated[str, typer.Argument(
        help="fig1..fig13, or a study: ppe-regimes, learners-regimes, learners-speed, "
             "information-limit, "
             "solver-study, certified, loose-bounds, oracle-bound, rate-in-n, heldout, "
             "heldout-sweep, heldout-loose, bias-floor, fresh-sets")],
    quick: Annotated[bool, typer.Option("--quick", metavar="",
                                        help="a reduced run for CI (seconds)")] = False,
    trials: Annotated[int | None, typer.Option(
        "--trials", help="number of datasets (the certified studies: draws per cell)")] = None,
    out: Annotated[Path, typer.Option("--out", help="parent folder of the results")] = Path(
        "experiments"),
    jobs: Annotated[int, typer.Option("--jobs", help="worker processes over trials")] = 1,
    time_limit: Annotated[float | None, typer.Option(
        "--time-limit", help="solver-study: seconds per solve (default 60, 10 with --quick)")
    ] = None,
    draws: Annotated[int | None, typer.Option(
        "--draws", help="certified, loose-bounds, oracle-bound, rate-in-n, heldout, "
                        "heldout-sweep, heldout-loose, bias-floor, fresh-sets: Monte Carlo draws "
                        "per cell (defaults 100, 40, 20, 10, 8, 8, 8, 8 and 8; with --quick 10, "
                        "4, 3, 2, 2, 2, 2, 2 and 2)")
    ] = None,
):
    """Reproduce one of the paper's figures, or a study: CSV of every trial, PNG and JSON."""
    given = {"--time-limit": time_limit, "--draws": draws}
    for option, value in given.items():
        if value is not None and name not in STUDY_OPTIONS[option]:
            _fail(f"{option} goes with {', '.join(STUDY_OPTIONS[option])}, not {name}")
    with no_empty_folders(out):
        _run(name, quick, trials, out, jobs, time_limit=time_limit, draws=draws)


def _run(name: str, quick: bool, trials: int | None, out: Path, jobs: int, **study) -> None:
    extra = _extra_experiments()
    if name in extra:
        err_console.print(extra[name](out=out, quick=quick, trials=trials, **study))
        return
    from ..experiments.real import REAL_EXPERIMENTS, run_real_experiment
    from ..experiments.run import run_experiment

    if name in REAL_EXPERIMENTS:
        if jobs != 1:
            err_console.print("--jobs is ignored by the real-data figures (one process)")
        res = run_real_experiment(name, quick=quick, trials=trials, out=out)
        report_outcomes(res.rows)
        err_console.print(f"{name}: {len(res.rows)} rows in {res.wall_seconds:.1f} s -> "
                          f"{res.csv_path}, {res.png_path}, {res.json_path}")
        return

    res = run_experiment(name, quick=quick, trials=trials, out=out, jobs=jobs)
    if res.missing_mechanisms:
        err_console.print("not registered, left out: " + ", ".join(res.missing_mechanisms))
    report_outcomes(res.rows)
    err_console.print(
        f"{res.experiment.name}: {len(res.rows)} rows in {res.wall_seconds:.1f} s -> "
        f"{res.csv_path}, {res.png_path}, {res.json_path}"
    )
