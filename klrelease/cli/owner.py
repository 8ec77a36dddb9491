"""``klrelease service dataset|token|audit|releases``: the data owner's side of a service.

These commands work on the service's data directory (its ledger) directly, with or without a
service running: a dataset registered here is served at once by every running process.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from .app import DATASET_HELP, Group, _fail, app, err_console, out_console, parse_classes

__all__ = ["service_app"]

service_app = typer.Typer(help="The data owner's side of a release service (on its data "
                          "directory).", no_args_is_help=True, cls=Group)
dataset_app = typer.Typer(help="Register and list datasets.", no_args_is_help=True, cls=Group)
token_app = typer.Typer(help="Create, list and revoke tokens.", no_args_is_help=True, cls=Group)
service_app.add_typer(dataset_app, name="dataset")
service_app.add_typer(token_app, name="token")
app.add_typer(service_app, name="service")

DataDir = Annotated[Path, typer.Option(help="the service's data directory")]
Database = Annotated[str | None, typer.Option(
    envvar="KLRELEASE_DATABASE", help="its PostgreSQL ledger (remembered in the data directory "
    "after first use)")]


def _ledger(data_dir: Path, database: str | None, *, create: bool = False):
    try:
        from ..service.datadir import ledger_url
        from ..service.ledger import Ledger
    except ImportError:
        _fail("the service needs its extra: pip install 'klrelease[service]'")
    from sqlalchemy.exc import SQLAlchemyError

    ledger = Ledger(ledger_url(data_dir, database, create=create))
    try:
        ledger.create_schema()
    except SQLAlchemyError as exc:
        _fail(f"cannot use the ledger {ledger.shown} ({type(exc).__name__})")
    return ledger


def _when(t: float | None) -> str:
    if t is None:
        return ""
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataset_app.command("add")
def dataset_add(
    name: Annotated[str, typer.Argument(help="the dataset's name in the service")],
    data_dir: DataDir,
    budget_epsilon: Annotated[float, typer.Option(help="total epsilon of every release")],
    budget_delta: Annotated[float, typer.Option(help="total delta of every release")],
    csv: Annotated[str | None, typer.Option(help="a CSV file with a header row")] = None,
    parquet: Annotated[str | None, typer.Option(
        help="Parquet file(s): a path, a directory or a glob")] = None,
    bundled: Annotated[str | None, typer.Option(help=DATASET_HELP)] = None,
    label_column: Annotated[str | None, typer.Option(help="the label column")] = None,
    classes: Annotated[str | None, typer.Option(
        help="the declared classes a,b,c (public; every label must be one of them)")] = None,
    bounds: Annotated[str | None, typer.Option(
        help="public box LOWER:UPPER (numbers or comma lists per feature), e.g. 0:10")] = None,
    norm_bound: Annotated[float | None, typer.Option(help="public bound on ||x||_2")] = None,
    adjacency: Annotated[str, typer.Option(
        help="neighbouring relation of every release: label-flip (the features are public) or "
             "replace-one (needs --bounds or --norm-bound)")] = "label-flip",
    max_epsilon_per_request: Annotated[float | None, typer.Option(
        help="largest epsilon one request may ask for")] = None,
    dask: Annotated[str | None, typer.Option(
        help="with --parquet: a Dask scheduler (tcp://HOST:PORT) whose workers read the "
             "files")] = None,
    database: Database = None,
):
    """Register a dataset: its public inputs and budget (reads the data once to validate every
    row and record N and d)."""
    from ..service.datasets import parse_bounds, registration

    ledger = _ledger(data_dir, database, create=True)
    values = registration(
        name, csv=csv, parquet=parquet, bundled=bundled, label_column=label_column,
        classes=parse_classes(classes), bounds=parse_bounds(bounds), norm_bound=norm_bound,
        adjacency=adjacency, budget_epsilon=budget_epsilon, budget_delta=budget_delta,
        max_epsilon_per_request=max_epsilon_per_request, dask=dask)
    ds = ledger.add_dataset(values)
    err_console.print(
        f"registered {ds.name}: N={ds.n_samples} rows, {ds.n_classes} classes, d={ds.n_features}"
        f" features, {ds.adjacency} adjacency, budget epsilon={ds.budget_epsilon:g}, "
        f"delta={ds.budget_delta:g}", highlight=False)


@dataset_app.command("list")
def dataset_list(data_dir: DataDir, database: Database = None):
    """The registered datasets with their budgets."""
    from rich.table import Table

    ledger = _ledger(data_dir, database)
    table = Table(title="datasets")
    for col in ("name", "adjacency", "N", "d", "classes", "budget", "releases", "spent"):
        table.add_column(col)
    for ds in ledger.datasets():
        state = ledger.budget(ds)
        frac, _ = state.fraction()
        table.add_row(ds.name, ds.adjacency, str(ds.n_samples), str(ds.n_features),
                      ",".join(map(str, ds.classes)),
                      f"({ds.budget_epsilon:g}, {ds.budget_delta:g})", str(state.releases),
                      f"{frac:.1%}")
    out_console.print(table)


@token_app.command("create")
def token_create(
    data_dir: DataDir,
    role: Annotated[str, typer.Option(help="analyst or owner")],
    dataset: Annotated[list[str] | None, typer.Option(
        help="a dataset the analyst may use (repeatable)")] = None,
    name: Annotated[str | None, typer.Option(
        help="who holds it (shown beside their releases)")] = None,
    database: Database = None,
):
    """Create a token and print it once on stdout (only its hash is kept)."""
    ledger = _ledger(data_dir, database)
    label = name or role
    if len(label) > 64:
        _fail("--name takes at most 64 characters")
    tid, token = ledger.create_token(role, label, dataset or [])
    print(token, flush=True)
    scope = f"datasets {', '.join(dataset)}" if dataset else "every dataset"
    err_console.print(f"token {tid} ({label}, {role} of {scope}): shown once, keep it safe",
                      highlight=False)


@token_app.command("list")
def token_list(data_dir: DataDir, database: Database = None):
    """Every token's id, holder, role and datasets (never the token)."""
    from rich.table import Table

    ledger = _ledger(data_dir, database)
    table = Table(title="tokens")
    for col in ("id", "name", "role", "datasets", "created", "revoked"):
        table.add_column(col)
    for t in ledger.tokens():
        table.add_row(str(t["id"]), t["name"], t["role"], ", ".join(t["datasets"]) or "all",
                      _when(t["created_at"]), _when(t["revoked_at"]))
    out_console.print(table)


@token_app.command("revoke")
def token_revoke(token_id: Annotated[int, typer.Argument(help="the token's id")],
                 data_dir: DataDir, database: Database = None):
    """Revoke a token (at once, in every service process)."""
    _ledger(data_dir, database).revoke_token(token_id)
    err_console.print(f"token {token_id} revoked", highlight=False)


@service_app.command("releases")
def releases(name: Annotated[str, typer.Argument(help="a dataset")], data_dir: DataDir,
             database: Database = None):
    """Every request charged on a dataset, with why a failed one failed (owner only)."""
    from rich.table import Table

    ledger = _ledger(data_dir, database)
    ds = ledger.dataset(name)
    if ds is None:
        _fail(f"no dataset named {name!r}")
    table = Table(title=f"requests on {name}")
    for col in ("time", "who", "request_id", "mechanism", "epsilon", "delta", "state", "note"):
        table.add_column(col, overflow="fold")
    for r in ledger.releases(ds, owner=True):
        table.add_row(_when(r["created_at"]), r["who"] or "", r["request_id"], r["mechanism"],
                      f"{r['epsilon']:g}", f"{r['delta']:g}", r["state"], r["error"] or "")
    out_console.print(table)


@service_app.command("audit")
def audit(data_dir: DataDir, dataset: Annotated[str | None, typer.Option(
        help="only this dataset")] = None, as_json: Annotated[bool, typer.Option(
        "--json", help="one JSON object per line")] = False, database: Database = None):
    """The append-only audit log: every charge, refusal, outcome and owner action."""
    rows = _ledger(data_dir, database).audit(dataset)
    if as_json:
        for r in rows:
            sys.stdout.write(json.dumps(r) + "\n")
        return
    from rich.table import Table

    table = Table(title="audit log")
    for col in ("time", "action", "dataset", "who", "request_id", "mechanism", "epsilon",
                "delta", "outcome"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(_when(r["at"]), r["action"], r["dataset"] or "", r["actor"] or "",
                      r["request_id"] or "", r["mechanism"] or "",
                      "" if r["epsilon"] is None else f"{r['epsilon']:g}",
                      "" if r["delta"] is None else f"{r['delta']:g}", r["outcome"] or "")
    out_console.print(table)

