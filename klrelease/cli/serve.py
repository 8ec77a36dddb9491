"""``klrelease serve``: run the release service on a data directory."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from .app import _fail, app, err_console

__all__ = ["serve", "DEMO_BUDGET"]

#: The budget ``--demo`` gives a bundled dataset.
DEMO_BUDGET = (10.0, 1e-5)


def _log_config() -> dict:
    """uvicorn's logging, with the service's own logger beside it (stderr)."""
    from uvicorn.config import LOGGING_CONFIG

    config = {**LOGGING_CONFIG, "loggers": dict(LOGGING_CONFIG["loggers"])}
    config["loggers"]["klrelease.service"] = {"handlers": ["default"], "level": "INFO",
                                              "propagate": False}
    return config


@app.command()
def serve(
    data_dir: Annotated[Path, typer.Option(
        help="the service's data directory (signing key; SQLite ledger unless --database)")],
    database: Annotated[str | None, typer.Option(
        envvar="KLRELEASE_DATABASE",
        help="a postgresql://USER@HOST:PORT/DB ledger shared by several service processes or "
             "hosts (remembered in the data directory)")] = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
    demo: Annotated[str | None, typer.Option(
        help="register this bundled dataset (iris) with budget epsilon=10, delta=1e-5 if it is "
             "not registered, and print a new analyst token for it")] = None,
):
    """Run the release service (HTTP, FastAPI and uvicorn); the page is at /."""
    try:
        import uvicorn

        from ..service.app import Service, ServiceConfig, create_app
    except ImportError:
        _fail("the service needs its extra: pip install 'klrelease[service]'")
    if not 0 < port < 65536:
        _fail(f"--port must lie in 1..65535, got {port}")
    from sqlalchemy.exc import SQLAlchemyError

    service = Service(ServiceConfig(data_dir, database))
    try:
        created = service.prepare()  # a ledger signed with another key is refused here
    except SQLAlchemyError as exc:
        _fail(f"cannot use the ledger {service.ledger.shown} ({type(exc).__name__})")
    if created:
        err_console.print(f"made the signing key {service.signer.key_id} in "
                          f"{Path(data_dir) / 'signing-key.pem'}", highlight=False)
    if demo is not None:
        _demo(service, demo)
    if host not in ("127.0.0.1", "localhost", "::1"):
        err_console.print("[bold red]warning:[/] serving plain HTTP beyond this machine: put a "
                          "TLS proxy in front (tokens travel in every request)", highlight=False)
    shown = f"[{host}]" if ":" in host else host
    err_console.print(f"klrelease service on http://{shown}:{port} (the page is at /)",
                      highlight=False)
    logging.getLogger("klrelease.service").setLevel(logging.INFO)
    uvicorn.run(create_app(service=service), host=host, port=port, log_config=_log_config(),
                timeout_graceful_shutdown=30)


def _demo(service, name: str) -> None:
    from ..service.datasets import registration

    ledger = service.ledger
    ledger.create_schema()
    if ledger.dataset(name) is None:
        values = registration(name, bundled=name, budget_epsilon=DEMO_BUDGET[0],
                              budget_delta=DEMO_BUDGET[1])
        ledger.add_dataset(values)
        err_console.print(f"registered the bundled dataset {name}: budget epsilon="
                          f"{DEMO_BUDGET[0]:g}, delta={DEMO_BUDGET[1]:g}", highlight=False)
    tid, token = ledger.create_token("analyst", f"{name}-analyst", [name])
    err_console.print(f"analyst token {tid} for {name} (shown once):", highlight=False)
    print(token, flush=True)
