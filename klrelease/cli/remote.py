"""``klrelease remote datasets|budget|releases|release|artifact|key``: an analyst's side of a
release service (through :class:`klrelease.client.Client`)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated

import typer

from .app import (
    Force,
    Group,
    _fail,
    app,
    atomic_output,
    check_output,
    err_console,
    out_console,
    parse_options,
)

__all__ = ["remote_app"]

remote_app = typer.Typer(help="Use a release service as an analyst (token from --token or "
                         "KLRELEASE_TOKEN).", no_args_is_help=True, cls=Group)
app.add_typer(remote_app, name="remote")

Url = Annotated[str, typer.Option(envvar="KLRELEASE_URL", help="the service's address")]
Token = Annotated[str | None, typer.Option(
    envvar="KLRELEASE_TOKEN", help="your token (better in the KLRELEASE_TOKEN environment "
    "variable: a command line is visible to other users)", show_default=False)]
Key = Annotated[str | None, typer.Option(
    help="the service's public key to check artifacts with: a PEM file or a URL (default: "
         "the key the service announces at /v1/key)")]
DEFAULT = "http://127.0.0.1:8000"


def _key(key: str | None):
    if key is None:
        return None
    from ..client import public_key_from

    return public_key_from(key)


@contextlib.contextmanager
def _client(url: str, token: str | None, key: str | None = None):
    try:
        from ..client import Client, ServiceError
    except ImportError:
        _fail("the client needs the service extra: pip install 'klrelease[service]'")
    if not token:
        _fail("give your token: --token TOKEN or the KLRELEASE_TOKEN environment variable")
    client = Client(url, token, public_key=_key(key))
    try:
        yield client
    except ServiceError as exc:
        err_console.print(f"error: {exc.detail}", highlight=False)
        raise typer.Exit(1 if exc.status >= 500 or exc.status == 0 else 2) from None
    finally:
        client.close()


def _frac(budget: dict) -> str:
    s = budget["spent"]
    return f"{s['fraction']:.1%} spent ({s['accounting']})"


@remote_app.command("datasets")
def datasets(url: Url = DEFAULT, token: Token = None):
    """The datasets your token may use, with their budgets."""
    from rich.table import Table

    with _client(url, token) as c:
        rows = c.datasets()
    table = Table(title=f"datasets at {url}")
    for col in ("name", "adjacency", "classes", "features", "budget", "spent"):
        table.add_column(col, overflow="fold")
    for d in rows:
        b = d["budget"]
        table.add_row(d["name"], d["adjacency"], ", ".join(map(str, d["classes"])),
                      ", ".join(d["feature_names"]),
                      f"epsilon={b['total']['epsilon']:g}, delta={b['total']['delta']:g}",
                      _frac(b))
    out_console.print(table)


@remote_app.command("budget")
def budget(name: Annotated[str, typer.Argument(help="a dataset")], url: Url = DEFAULT,
           token: Token = None):
    """A dataset's total, spent and remaining budget (JSON)."""
    with _client(url, token) as c:
        out_console.print_json(json.dumps(c.budget(name)))


@remote_app.command("releases")
def releases(name: Annotated[str, typer.Argument(help="a dataset")], url: Url = DEFAULT,
             token: Token = None):
    """Every request charged on a dataset, newest first."""
    from datetime import UTC, datetime

    from rich.table import Table

    with _client(url, token) as c:
        rows = c.releases(name)
    table = Table(title=f"releases of {name}")
    for col in ("time", "who", "request_id", "mechanism", "guarantee", "state"):
        table.add_column(col, overflow="fold")
    for r in rows:
        when = datetime.fromtimestamp(r["created_at"], tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(when, r["who"] or "", r["request_id"], r["mechanism"],
                      f"({r['epsilon']:g}, {r['delta']:g}) {r['adjacency']}", r["state"])
    out_console.print(table)


@remote_app.command("release")
def release(
    name: Annotated[str, typer.Argument(help="a dataset")],
    epsilon: Annotated[float, typer.Option(help="privacy parameter epsilon (> 0)")],
    delta: Annotated[float, typer.Option(help="privacy parameter delta, in (0, 1)")],
    mechanism: Annotated[str, typer.Option(help="see 'klrelease remote datasets'")] = (
        "kl-certified"),
    option: Annotated[list[str] | None, typer.Option(
        help="mechanism option KEY=VALUE (repeatable)")] = None,
    request_id: Annotated[str | None, typer.Option(
        help="your id for this request: sending it again returns the same artifact, never "
             "charged twice (default: a new one)")] = None,
    out: Annotated[Path, typer.Option(help="where to write the artifact")] = Path(
        "release.json"),
    force: Force = False,
    url: Url = DEFAULT,
    token: Token = None,
    key: Key = None,
):
    """Ask the service for a release; writes the signed artifact after checking its
    signature."""
    from ..data import check_privacy_parameters
    from ..mechanisms import get_mechanism

    check_privacy_parameters(epsilon, delta)
    opts, public = parse_options(get_mechanism(mechanism), option)
    if public:
        _fail(f"{', '.join(public)} is fixed by the dataset's registration")
    check_output(out, force)
    with _client(url, token, key) as c:
        rel = c.release(name, epsilon=epsilon, delta=delta, mechanism=mechanism, options=opts,
                        request_id=request_id)
        with atomic_output(out, force=force) as fh:
            fh.write(rel.to_json())
    what = rel.summary() if hasattr(rel, "summary") else f"FAIL at stage {rel.stage}"
    err_console.print(f"wrote {out}: {what}", highlight=False)
    err_console.print(f"signature checked: key {rel.signature.key_id}", highlight=False)


@remote_app.command("artifact")
def artifact(name: Annotated[str, typer.Argument(help="a dataset")],
             request_id: Annotated[str, typer.Argument(help="the request's id")],
             out: Annotated[Path, typer.Option(help="where to write it")] = Path("release.json"),
             force: Force = False, url: Url = DEFAULT, token: Token = None,
             key: Key = None):
    """Fetch the artifact of a released request (signature checked)."""
    check_output(out, force)
    with _client(url, token, key) as c:
        rel = c.artifact(name, request_id)
        with atomic_output(out, force=force) as fh:
            fh.write(rel.to_json())
    err_console.print(f"wrote {out} (signature checked: key {rel.signature.key_id})",
                      highlight=False)


@remote_app.command("key")
def key(url: Url = DEFAULT, out: Annotated[Path | None, typer.Option(
        help="write the PEM here (default: print it)")] = None):
    """The service's public key (PEM), to pin it: 'klrelease inspect --verify --key FILE'."""
    from ..client import ServiceError, fetch_public_key

    try:
        pem = fetch_public_key(url)
    except ServiceError as exc:
        _fail(exc.detail)
    if out is None:
        print(pem, end="")
        return
    with atomic_output(out) as fh:
        fh.write(pem)
    err_console.print(f"wrote {out}", highlight=False)
