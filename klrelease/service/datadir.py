"""A service's data directory: where its ledger is, and its signing key.

The directory holds the signing key (``signing-key.pem``), the SQLite ledger
(``ledger.sqlite3``) unless the service uses PostgreSQL, and then ``service.json`` naming
that database, so that every command given the directory (``klrelease serve``,
``klrelease service ...``) reads and writes the same ledger. A directory keeps one ledger:
naming another database for it later is an error. Files are readable by their owner only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .ledger import LEDGER_FILE, database_url

__all__ = ["CONFIG_FILE", "ledger_url"]

CONFIG_FILE = "service.json"


def _shown(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(database_url(".", url)).render_as_string(hide_password=True)


def ledger_url(data_dir, database: str | None = None, *, create: bool = True) -> str:
    """The SQLAlchemy URL of the ledger of ``data_dir`` (made, owner-only, if ``create``).

    Raises
    ------
    ValueError
        If the directory is missing (and not to be made), or ``database`` is not the
        directory's ledger.
    """
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        if path.exists() or not create:
            raise ValueError(f"{path} is not a service data directory")
        path.mkdir(mode=0o700, parents=True)
    config = path / CONFIG_FILE
    stored = None
    if config.exists():
        try:
            stored = json.loads(config.read_text()).get("database")
        except (OSError, ValueError):
            raise ValueError(f"cannot read {config}") from None
    if database is None:
        return database_url(path, stored)
    url = database_url(path, database)  # validates the URL
    if stored is not None:
        if database_url(path, stored) != url:
            raise ValueError(f"{path} keeps its ledger in {_shown(stored)}; a data directory "
                             "has one ledger")
        return url
    if (path / LEDGER_FILE).exists():
        raise ValueError(f"{path} keeps its ledger in {LEDGER_FILE}; a data directory has one "
                         "ledger (use a new directory for a PostgreSQL ledger)")
    fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"database": str(database)}, fh)
    return url
