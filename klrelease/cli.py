"""Command-line interface: ``klrelease release | sample | inspect | mechanisms``.

Bad input exits with status 2 and a single ``error: ...`` line on stderr, writes nothing, and
never shows a traceback.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="klrelease",
    help="Differentially private release of labelled Gaussian mixture models.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

out_console = Console()
err_console = Console(stderr=True)


class BadInput(Exception):
    """An input problem reported as one line with exit status 2."""


def _fail(message: str) -> None:
    raise BadInput(message)


def _write_atomic(path: Path, text: str) -> None:
    path = Path(path)
    if path.parent and not path.parent.exists():
        _fail(f"cannot write {path}: directory {path.parent} does not exist")
    fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=".klrelease-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _parse_floats(text: str | None, name: str):
    if text is None:
        return None
    try:
        vals = [float(v) for v in text.split(",")]
    except ValueError:
        _fail(f"{name} must be a number or a comma-separated list of numbers")
    return vals[0] if len(vals) == 1 else np.array(vals)


def _parse_option(item: str) -> tuple[str, object]:
    if "=" not in item:
        _fail(f"--option takes KEY=VALUE, got {item!r}")
    key, raw = item.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip().replace("-", "_"), value


def mechanism_inputs(option, lower, upper) -> tuple[dict, tuple | None]:
    """The ``--option KEY=VALUE`` pairs and the public box of ``--lower``/``--upper``."""
    opts = dict(_parse_option(o) for o in (option or []))
    if (lower is None) != (upper is None):
        _fail("give both --lower and --upper, or neither")
    bounds = None
    if lower is not None:
        bounds = (_parse_floats(lower, "--lower"), _parse_floats(upper, "--upper"))
    return opts, bounds


def _load_input(dataset, csv_path, label_column, npz_path):
    from .data import as_labelled_data, load_csv, load_dataset, load_npz

    given = [x is not None for x in (dataset, csv_path, npz_path)]
    if sum(given) != 1:
        _fail("give exactly one input: --dataset NAME, --csv FILE or --npz FILE")
    if dataset is not None:
        return load_dataset(dataset)
    if csv_path is not None:
        if label_column is None:
            _fail("--csv needs --label-column NAME")
        X, y, names = load_csv(csv_path, label_column)
        return as_labelled_data(X, y, feature_names=names)
    X, y = load_npz(npz_path)
    return as_labelled_data(X, y)


@app.command()
def release(
    epsilon: Annotated[float, typer.Option(help="privacy parameter epsilon (> 0)")],
    delta: Annotated[float, typer.Option(help="privacy parameter delta, in (0, 1)")],
    dataset: Annotated[str | None, typer.Option(help="a bundled dataset: iris")] = None,
    csv: Annotated[Path | None, typer.Option(help="CSV file with a header row")] = None,
    label_column: Annotated[str | None, typer.Option(help="label column of --csv")] = None,
    npz: Annotated[Path | None, typer.Option(help=".npz file with arrays X and y")] = None,
    mechanism: Annotated[str, typer.Option(help="see 'klrelease mechanisms'")] = "kl-certified",
    out: Annotated[Path, typer.Option(help="where to write the artifact")] = Path(
        "release.json"
    ),
    seed: Annotated[
        int | None, typer.Option(help="reproducible noise, for experiments only (not secure)")
    ] = None,
    lower: Annotated[str | None, typer.Option(help="public lower bound(s), comma list")] = None,
    upper: Annotated[str | None, typer.Option(help="public upper bound(s), comma list")] = None,
    norm_bound: Annotated[float | None, typer.Option(help="public bound on ||x||_2")] = None,
    option: Annotated[
        list[str] | None, typer.Option(help="mechanism option KEY=VALUE (repeatable)")
    ] = None,
):
    """Release a differentially private GMM of a labelled dataset."""
    from . import release as do_release
    from .data import check_privacy_parameters
    from .mechanisms import get_mechanism

    eps, dlt = check_privacy_parameters(epsilon, delta)
    mech = get_mechanism(mechanism)
    opts, bounds = mechanism_inputs(option, lower, upper)
    data = _load_input(dataset, csv, label_column, npz)
    with err_console.status(f"designing {mech.name} ..."):
        rel = do_release(data, None, epsilon=eps, delta=dlt, mechanism=mech.name, seed=seed,
                         bounds=bounds, norm_bound=norm_bound, **opts)
    _write_atomic(out, rel.to_json())
    err_console.print(f"wrote {out}: {rel.summary()}")
    if not rel.privacy.certified:
        err_console.print(f"[bold red]warning:[/] {rel.privacy.statement}")


@app.command()
def sample(
    artifact: Annotated[Path, typer.Argument(help="a release artifact (JSON)")],
    n: Annotated[int, typer.Option("-n", "--n", help="number of rows")] = 1000,
    out: Annotated[Path, typer.Option(help="CSV file to write")] = Path("synthetic.csv"),
    seed: Annotated[int | None, typer.Option(help="seed for the synthetic draw")] = None,
):
    """Draw synthetic labelled rows from a released GMM (post-processing: no privacy cost)."""
    from .artifact import Release

    if n < 1:
        _fail(f"-n must be >= 1, got {n}")
    rel = Release.load(artifact)
    X, y = rel.gmm.sample(n, seed=seed)
    names = rel.feature_names or [f"x{i}" for i in range(rel.gmm.n_features)]
    lines = [",".join([*names, "label"])]
    lines += [
        ",".join([*(f"{v:.6g}" for v in row), str(lab)]) for row, lab in zip(X, y, strict=True)
    ]
    _write_atomic(out, "\n".join(lines) + "\n")
    err_console.print(f"wrote {n} rows to {out}")


@app.command()
def inspect(artifact: Annotated[Path, typer.Argument(help="a release artifact (JSON)")]):
    """Show a readable summary of a release artifact."""
    from .artifact import Release

    rel = Release.load(artifact)
    p = rel.privacy
    out_console.print(f"[bold]{rel.mechanism}[/] release  (klrelease {rel.library_version}, "
                      f"schema {rel.schema_version})")
    colour = "green" if p.certified else "red"
    out_console.print(
        f"privacy: epsilon={p.epsilon:g}, delta={p.delta:g}, neighbours: {p.neighbouring}, "
        f"[{colour}]{'certified' if p.certified else 'NOT certified'}[/]"
    )
    out_console.print(f"  {p.statement}")
    for r in p.reasons:
        out_console.print(f"  - {r}")
    g = rel.gmm
    table = Table(title=f"released GMM: {g.n_components} classes, {g.n_features} features")
    table.add_column("class")
    table.add_column("weight", justify="right")
    table.add_column("mean")
    table.add_column("covariance eigenvalues")
    for k in range(g.n_components):
        eig = np.linalg.eigvalsh(g.covariances[k])
        table.add_row(
            str(g.classes[k]), f"{g.weights[k]:.4f}",
            "[" + ", ".join(f"{v:.3g}" for v in g.means[k]) + "]",
            "[" + ", ".join(f"{v:.3g}" for v in eig) + "]",
        )
    out_console.print(table)
    if rel.feature_names:
        out_console.print("features: " + ", ".join(rel.feature_names))
    if rel.solver is not None:
        s = rel.solver
        out_console.print(f"solver: {s.solver} ({s.status}), {s.n_solves} solve(s), "
                          f"{s.time_s:.3g} s")
    r = rel.randomness
    out_console.print(f"randomness: {'secure' if r.secure else 'seeded'}; {r.note}")
    if rel.options:
        out_console.print("options: " + json.dumps(rel.options))


@app.command("mechanisms")
def list_mechanisms():
    """List the registered mechanisms."""
    from .mechanisms import get_mechanism, mechanisms

    for name in mechanisms():
        out_console.print(f"{name:20s} {get_mechanism(name).summary}")


def _one_line(message) -> str:
    return " ".join(str(message).split())


def main(argv: list[str] | None = None) -> int:
    """Console entry point: runs the app and maps input errors to exit status 2."""
    import solvers

    try:
        # a command ending with typer.Exit(code) returns that code in non-standalone mode
        rc = app(args=argv, standalone_mode=False, prog_name="klrelease")
    except solvers.SolverFailed as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except (BadInput, ValueError, solvers.SolverUnavailable) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # the CLI framework's own usage errors
        kind = type(exc).__name__
        if kind == "NoArgsIsHelpError":
            return 0
        if kind == "Exit":
            return int(getattr(exc, "exit_code", 0) or 0)
        if kind == "Abort":
            print("error: aborted", file=sys.stderr)
            return 1
        if hasattr(exc, "format_message"):
            print(f"error: {_one_line(exc.format_message())}", file=sys.stderr)
            return 2
        raise
    return rc if isinstance(rc, int) and not isinstance(rc, bool) else 0


def run() -> None:
    sys.exit(main())


from .audit.cli import audit_command  # noqa: E402,F401  (registers the command)
from .experiments.cli import experiment_command  # noqa: E402,F401  (registers the command)
from .plot_cli import plot_command  # noqa: E402,F401  (registers the command)
