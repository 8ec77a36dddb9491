"""``klrelease learn``: a private GMM from unlabelled rows of a CSV file; ``klrelease learners``.

Exit status: 0 when a GMM was released, 3 when the learner returned FAIL (the stage and reason
are printed and the FAIL result is written, since it is the mechanism's output), 2 for bad
input (one line, nothing written).
"""

from __future__ import annotations

import inspect
import typing
import warnings
from pathlib import Path
from typing import Annotated

import typer

from .app import BadInput, Force, _write_atomic, app, check_output, err_console, out_console

__all__ = ["learn_command", "list_learners", "parse_params", "unlabelled_csv"]


def unlabelled_csv(path: Path, columns: str | None):
    """The numeric columns of a CSV file with a header row (all of them, or the named ones)
    as a :class:`~klrelease.stream.CSVSource` of rows without labels: read in blocks by
    pyarrow, only the selected columns converted (to float64). A learner that streams reads
    it in passes; the others get one float64 array of its rows."""
    from ..stream import CSVSource

    names = None if columns is None else [c.strip() for c in columns.split(",") if c.strip()]
    if names is not None and not names:
        raise BadInput("--columns names no column")
    try:
        return CSVSource(path, None, feature_columns=names, block_bytes=CSV_BLOCK_BYTES)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


#: Bytes of CSV text parsed per block: small blocks keep pyarrow's read-ahead small (a few
#: tens of MB at this size, over 100 MB at 16 MB blocks), at no cost in speed.
CSV_BLOCK_BYTES = 1 << 20

#: Options with a flag of their own, or that the command sets.
_NOT_PARAMS = ("accountant", "progress")


def parse_params(name: str, fn, items: list[str]) -> dict:
    """``NAME=VALUE`` strings as the learner's options, typed by its signature (a bound in the
    units of the data or another number as a float, counts as integers, true/false)."""
    from ..learners.result import learner_options

    known = {k: p for k, p in learner_options(fn).items() if k not in _NOT_PARAMS}
    hints = typing.get_type_hints(fn)
    out: dict = {}
    for item in items:
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key:
            raise BadInput(f"--param takes NAME=VALUE, got {item!r}")
        if key not in known:
            raise BadInput(f"learner {name!r} has no option {key!r}; its options: "
                           f"{', '.join(known)}")
        # the option's type: its annotation without None (``int | None`` is int)
        kinds = [t for t in typing.get_args(hints.get(key)) or (hints.get(key),)
                 if t is not type(None)]
        kind = kinds[0] if len(kinds) == 1 else float
        try:
            if kind is bool:
                if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                value = text.lower() in ("true", "1", "yes")
            elif kind in (int, str):
                value = kind(text)
            else:
                value = float(text)
        except ValueError:
            raise BadInput(f"--param {key}: {text!r} is not a valid "
                           f"{getattr(kind, '__name__', kind)}") from None
        out[key] = value
    return out


@app.command("learn")
def learn_command(
    csv_path: Annotated[Path, typer.Option("--csv", help="CSV file with a header row")],
    components: Annotated[int, typer.Option("--components", help="number of components K")],
    epsilon: Annotated[float, typer.Option(help="privacy parameter epsilon (> 0)")],
    delta: Annotated[float, typer.Option(help="privacy parameter delta, in (0, 1)")],
    learner: Annotated[str, typer.Option(help="a registered learner (klrelease learners)")],
    out: Annotated[Path, typer.Option("--out", help="where to write the result (JSON)")],
    columns: Annotated[str | None, typer.Option(help="comma-separated columns (default all)")]
    = None,
    seed: Annotated[int | None, typer.Option(help="seed: reproducible, not secure")] = None,
    accountant: Annotated[str | None, typer.Option(
        help="privacy accountant of the worst-path ledger: basic, zcdp or auto (the larger "
             "per-piece budgets, chosen from public inputs); for the Kamath and Afzali-style "
             "learners only")] = None,
    param: Annotated[list[str] | None, typer.Option(
        "--param", help="a public option of the learner, NAME=VALUE (repeatable), e.g. "
                        "--param R=10 --param sigma_min=0.1 --param sigma_max=3 in the units "
                        "of the data")] = None,
    force: Force = False,
):
    """Learn a GMM privately from unlabelled rows; FAIL exits with status 3."""
    from ..learners import get_learner, learn, learners
    from ..learners.result import check_options, resolve_name
    from ..privacy.ledger import ACCOUNTANTS

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FutureWarning)
        fn = get_learner(learner)  # unknown names list the registered learners (exit 2)
    for w in caught:  # a former name: one line, then the current name
        err_console.print(f"[bold yellow]warning:[/] {w.message}", highlight=False)
    learner = resolve_name(learner)
    options = parse_params(learner, fn, param or [])
    if accountant is not None:
        if "accountant" not in inspect.signature(fn).parameters:
            takers = [n for n in learners()
                      if "accountant" in inspect.signature(get_learner(n)).parameters]
            raise BadInput(f"learner {learner!r} has no --accountant (only the Kamath and "
                           f"Afzali-style learners take one: {', '.join(takers)}); leave the "
                           "option out")
        if accountant not in ACCOUNTANTS:
            raise BadInput(f"--accountant must be one of {', '.join(ACCOUNTANTS)}")
        options["accountant"] = accountant
    try:
        options = check_options(learner, fn, options)  # public, before the data is read
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    check_output(out, force)  # before the data is read: a result that cannot be written is not run
    X = unlabelled_csv(csv_path, columns)
    names = list(X.feature_names)
    progress = inspect.signature(fn).parameters.get("progress")
    if progress is not None and typing.get_type_hints(fn).get("progress") is bool:
        # the learner draws its own bar over its long steps
        res = learn(X, components, epsilon=epsilon, delta=delta, learner=learner, seed=seed,
                    feature_names=names, progress=True, **options)
    elif progress is not None:  # the learner calls back once per step
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        bar = Progress(SpinnerColumn(), TextColumn(f"[bold]{learner}[/] {{task.completed}} "
                                                   "block steps"), TimeElapsedColumn(),
                       console=err_console, transient=True)
        task = bar.add_task(learner, total=None)
        options["progress"] = lambda k=1: bar.advance(task, k)
        with bar:
            res = learn(X, components, epsilon=epsilon, delta=delta, learner=learner,
                        seed=seed, feature_names=names, **options)
    else:
        res = learn(X, components, epsilon=epsilon, delta=delta, learner=learner, seed=seed,
                    feature_names=names, **options)
    from ..artifact import learner_document

    _write_atomic(out, learner_document(res).model_dump_json(indent=2) + "\n", force)
    if res.failed:
        err_console.print(f"FAIL at stage {res.stage}: {res.reason}")
        err_console.print(f"result written to {out}")
        raise typer.Exit(3)
    out_console.print(f"{learner}: released a {res.gmm.n_components}-component GMM "
                      f"({res.guarantee.epsilon:g}, {res.guarantee.delta:g}) under "
                      f"{res.guarantee.neighbouring} -> {out}", highlight=False, soft_wrap=True)


@app.command("learners")
def list_learners(
    name: Annotated[str | None, typer.Argument(help="show this learner's options")] = None,
):
    """List the learners for unlabelled data, or one learner's options with types and
    defaults."""
    from rich.table import Table

    from ..learners import get_learner, learners
    from ..learners.result import describe_learner

    if name is None:
        for n in learners():
            doc = (inspect.getdoc(get_learner(n)) or "").split("\n\n")[0]
            first = " ".join(doc.split()).replace("``", "").replace(
                " (see the module docstring)", "")
            out_console.print(f"{n:30s} {first}", highlight=False)
        return
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FutureWarning)
            info = describe_learner(name)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    for w in caught:  # a former name: one line
        err_console.print(f"[bold yellow]warning:[/] {w.message}", highlight=False)
    out_console.print(f"[bold]{info['name']}[/]: {info['summary']}", highlight=False)
    out_console.print(f"relation: {info['relation']} (certified with secure noise; a seeded "
                      "run is an experiment); proof: " + info["proof"], highlight=False)
    table = Table(title=f"options of {info['name']} (--param NAME=VALUE)")
    for col in ("option", "type", "default", "meaning"):
        table.add_column(col, overflow="fold")
    for opt, kind, default, words in info["options"]:
        table.add_row(opt, kind, default, words)
    out_console.print(table)
