"""The budget ledger: datasets, tokens, charges and the append-only audit log (SQLAlchemy).

One database holds everything a service shares: SQLite in the data directory by default,
PostgreSQL (psycopg 3) when several service processes or hosts share one budget.

**The charge.** :meth:`Ledger.charge` checks a request's claim against the dataset's budget and
writes the charge in one transaction, committed before the caller reads any data or draws any
noise. Two requests never share the last of a budget: on SQLite the transaction starts with
``BEGIN IMMEDIATE`` (one writer at a time, WAL journal, a busy timeout for the others); on
PostgreSQL it first locks the dataset's row (``SELECT ... FOR UPDATE``), so every charge of a
dataset is checked against every charge committed before it. The budget is composed by
:class:`~klrelease.privacy.guarantee.BudgetAccountant` (basic composition, or the composed
privacy curve where every release's curve is known).

**States.** A charge is ``charged`` until its release ends ``released`` (with the signed
artifact), ``failed_after_charge`` (it failed after the charge: the charge stands, since noise
may have been drawn) or ``lost`` (the process running it stopped). A settled charge never
changes again and no charge is ever deleted or its amount changed: database triggers refuse
it. There is no refund.

**Lost requests.** Every service process registers an *instance* (host, boot id, process id
and start time) and renews its lease every :attr:`Ledger.heartbeat` seconds. An instance is
dead when it stopped, when its lease is older than :attr:`Ledger.lease` seconds (by the
database's clock, the same for every host), or, on the same machine, when its process no longer
exists. The charges a dead instance left ``charged`` are marked ``lost`` by whichever process
sweeps first; a live process's work is never touched, and a process that finds itself declared
dead (a pause longer than the lease) takes a new instance and cannot settle the old charges.

**Audit log.** Every charge, refusal, outcome and owner action is a row of ``audit_log``,
which triggers make append-only (no UPDATE, DELETE or TRUNCATE).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    CheckConstraint,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine, make_url

from ..privacy.guarantee import BudgetAccountant, BudgetExceeded, GaussianCurve, Guarantee

__all__ = ["Ledger", "DatasetRecord", "Principal", "Instance", "ChargeResult", "BudgetState",
           "STATES", "database_url", "LEDGER_FILE"]

SCHEMA_VERSION = "1"
#: The SQLite ledger's file name in a data directory.
LEDGER_FILE = "ledger.sqlite3"
#: Charge states: ``charged`` until settled once as one of the other three.
STATES = ("charged", "released", "failed_after_charge", "lost")

metadata = MetaData()

meta = Table("meta", metadata,
             Column("key", String(64), primary_key=True),
             Column("value", Text, nullable=False))

datasets = Table(
    "datasets", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("source", Text, nullable=False),  # JSON: kind, path, label_column (owner only)
    Column("classes", Text, nullable=False),  # JSON list: the declared classes
    Column("feature_names", Text, nullable=False),
    Column("bound", Text),  # JSON of the public Domain, or null
    Column("adjacency", String(32), nullable=False),
    Column("n_samples", Integer, nullable=False),
    Column("n_features", Integer, nullable=False),
    Column("budget_epsilon", Double, nullable=False),
    Column("budget_delta", Double, nullable=False),
    Column("max_epsilon_per_request", Double),
    Column("created_at", Double, nullable=False),
)

tokens = Table(
    "tokens", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("name", String(64), nullable=False),
    Column("role", String(16), nullable=False),
    Column("created_at", Double, nullable=False),
    Column("revoked_at", Double),
    CheckConstraint("role IN ('owner', 'analyst')", name="token_role"),
)

grants = Table(
    "grants", metadata,
    Column("token_id", Integer, ForeignKey("tokens.id"), primary_key=True),
    Column("dataset_id", Integer, ForeignKey("datasets.id"), primary_key=True),
)

instances = Table(
    "instances", metadata,
    Column("id", String(32), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("boot_id", String(64), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("pid_start", String(32), nullable=False),
    Column("started_at", Double, nullable=False),
    Column("heartbeat_at", Double, nullable=False),
    Column("stopped_at", Double),
    Column("dead_at", Double),
)

charges = Table(
    "charges", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("dataset_id", Integer, ForeignKey("datasets.id"), nullable=False),
    Column("request_id", String(128), nullable=False),
    Column("request_hash", String(64), nullable=False),
    Column("token_id", Integer, ForeignKey("tokens.id"), nullable=False),
    Column("instance_id", String(32), nullable=False),
    Column("mechanism", String(64), nullable=False),
    Column("options", Text, nullable=False),
    Column("epsilon", Double, nullable=False),
    Column("delta", Double, nullable=False),
    Column("adjacency", String(32), nullable=False),
    Column("mu", Double),  # a Gaussian curve's whitened sensitivity; null: basic composition
    Column("statement", Text, nullable=False),
    Column("state", String(24), nullable=False),
    Column("created_at", Double, nullable=False),
    Column("finished_at", Double),
    Column("artifact", Text),  # the signed artifact (released)
    Column("error", Text),  # the owner's note on a failure (never shown to an analyst)
    UniqueConstraint("dataset_id", "request_id", name="one_charge_per_request"),
    CheckConstraint("state IN ('charged', 'released', 'failed_after_charge', 'lost')",
                    name="charge_state"),
    CheckConstraint("epsilon > 0 AND delta >= 0", name="charge_amount"),
)
Index("charges_open", charges.c.state, charges.c.instance_id)

audit_log = Table(
    "audit_log", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Double, nullable=False),
    Column("action", String(32), nullable=False),
    Column("dataset", String(64)),
    Column("request_id", String(128)),
    Column("actor_id", Integer),
    Column("actor", String(64)),
    Column("mechanism", String(64)),
    Column("epsilon", Double),
    Column("delta", Double),
    Column("adjacency", String(32)),
    Column("guarantee", Text),
    Column("outcome", String(32)),
    Column("detail", Text),
)

signing_keys = Table(
    "signing_keys", metadata,
    Column("key_id", String(32), primary_key=True),
    Column("public_pem", Text, nullable=False),
    Column("created_at", Double, nullable=False),
)

_SQLITE_TRIGGERS = (
    """CREATE TRIGGER IF NOT EXISTS audit_log_no_update BEFORE UPDATE ON audit_log
       BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS audit_log_no_delete BEFORE DELETE ON audit_log
       BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS charges_no_delete BEFORE DELETE ON charges
       BEGIN SELECT RAISE(ABORT, 'a charge is never deleted'); END""",
    """CREATE TRIGGER IF NOT EXISTS charges_settled_once BEFORE UPDATE ON charges
       WHEN OLD.state != 'charged' OR NEW.epsilon IS NOT OLD.epsilon
         OR NEW.delta IS NOT OLD.delta OR NEW.mu IS NOT OLD.mu
         OR NEW.adjacency IS NOT OLD.adjacency OR NEW.dataset_id IS NOT OLD.dataset_id
         OR NEW.request_id IS NOT OLD.request_id
       BEGIN SELECT RAISE(ABORT, 'a charge is settled once and its amount never changes'); END""",
)

_POSTGRES_TRIGGERS = (
    """CREATE OR REPLACE FUNCTION klrelease_append_only() RETURNS trigger AS $$
       BEGIN RAISE EXCEPTION 'the audit log is append-only'; END; $$ LANGUAGE plpgsql""",
    """CREATE OR REPLACE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
       FOR EACH ROW EXECUTE FUNCTION klrelease_append_only()""",
    """CREATE OR REPLACE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
       FOR EACH STATEMENT EXECUTE FUNCTION klrelease_append_only()""",
    """CREATE OR REPLACE FUNCTION klrelease_charge_settled_once() RETURNS trigger AS $$
       BEGIN
         IF TG_OP = 'DELETE' THEN RAISE EXCEPTION 'a charge is never deleted'; END IF;
         IF OLD.state <> 'charged' OR NEW.epsilon IS DISTINCT FROM OLD.epsilon
            OR NEW.delta IS DISTINCT FROM OLD.delta OR NEW.mu IS DISTINCT FROM OLD.mu
            OR NEW.adjacency IS DISTINCT FROM OLD.adjacency
            OR NEW.dataset_id IS DISTINCT FROM OLD.dataset_id
            OR NEW.request_id IS DISTINCT FROM OLD.request_id THEN
           RAISE EXCEPTION 'a charge is settled once and its amount never changes';
         END IF;
         RETURN NEW;
       END; $$ LANGUAGE plpgsql""",
    """CREATE OR REPLACE TRIGGER charges_settled_once BEFORE UPDATE OR DELETE ON charges
       FOR EACH ROW EXECUTE FUNCTION klrelease_charge_settled_once()""",
    """CREATE OR REPLACE TRIGGER charges_no_truncate BEFORE TRUNCATE ON charges
       FOR EACH STATEMENT EXECUTE FUNCTION klrelease_append_only()""",
)

#: Key of the PostgreSQL advisory lock held while the schema is created.
_SCHEMA_LOCK = 0x6B6C72656C


def database_url(data_dir, database: str | None = None) -> str:
    """The SQLAlchemy URL of a ledger: ``database`` (a ``postgresql://`` or ``sqlite:///`` URL)
    or the SQLite file in ``data_dir``. ``postgresql://`` is driven by psycopg 3."""
    if database is None:
        return f"sqlite:///{Path(data_dir).resolve() / LEDGER_FILE}"
    url = str(database)
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    if url.startswith(("postgresql+psycopg://", "sqlite:///")):
        return url
    raise ValueError("--database takes a postgresql://USER@HOST:PORT/DB URL (or sqlite:///PATH)")


def _now_sql(dialect: str):
    """The database's clock in seconds since the epoch (the same clock for every host)."""
    if dialect == "postgresql":
        return literal_column("CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)")
    return literal_column("((julianday('now') - 2440587.5) * 86400.0)")


# ------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class DatasetRecord:
    """A registered dataset: its public inputs, budget and (owner only) where it is read."""

    id: int
    name: str
    source: dict
    classes: tuple
    feature_names: tuple[str, ...]
    bound: dict | None
    adjacency: str
    n_samples: int
    n_features: int
    budget_epsilon: float
    budget_delta: float
    max_epsilon_per_request: float | None
    created_at: float

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    def public(self) -> dict[str, Any]:
        """What an analyst may see: no path, no count."""
        return {"name": self.name, "classes": list(self.classes),
                "feature_names": list(self.feature_names), "adjacency": self.adjacency,
                "n_features": self.n_features,
                "bound": None if self.bound is None else {
                    k: v for k, v in self.bound.items() if k != "source"},
                "budget": {"epsilon": self.budget_epsilon, "delta": self.budget_delta},
                "max_epsilon_per_request": self.max_epsilon_per_request}


def _dataset(row) -> DatasetRecord:
    return DatasetRecord(
        id=row.id, name=row.name, source=json.loads(row.source),
        classes=tuple(json.loads(row.classes)), feature_names=tuple(json.loads(row.feature_names)),
        bound=json.loads(row.bound) if row.bound else None, adjacency=row.adjacency,
        n_samples=row.n_samples, n_features=row.n_features, budget_epsilon=row.budget_epsilon,
        budget_delta=row.budget_delta, max_epsilon_per_request=row.max_epsilon_per_request,
        created_at=row.created_at)


@dataclass(frozen=True)
class Principal:
    """The holder of a valid token: its id, name, role and granted datasets (ids)."""

    id: int
    name: str
    role: str
    dataset_ids: frozenset[int] = frozenset()

    @property
    def owner(self) -> bool:
        return self.role == "owner"

    def may_see(self, dataset: DatasetRecord) -> bool:
        return self.owner or dataset.id in self.dataset_ids


@dataclass
class Instance:
    """This process as the ledger knows it (its id changes if it is ever declared dead)."""

    id: str
    host: str
    boot_id: str
    pid: int
    pid_start: str


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> str:
    """The start time of process ``pid`` (clock ticks since boot), "" if unknown."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = text[text.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else ""


def _process_gone(pid: int, start: str) -> bool:
    """Whether process ``pid`` (started at ``start``) surely no longer runs on this machine."""
    if start and Path("/proc/self/stat").exists():
        return _process_start(pid) != start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@dataclass(frozen=True)
class ChargeResult:
    """What :meth:`Ledger.charge` did.

    ``kind`` is ``"charged"`` (a new charge, ``charge_id``), ``"refused"`` (the budget would be
    exceeded: ``message``, ``state``), ``"existing"`` (the request was seen before: ``record``)
    or ``"conflict"`` (its request id belongs to another request).
    """

    kind: str
    charge_id: int | None = None
    message: str = ""
    state: BudgetState | None = None
    record: dict | None = None


@dataclass(frozen=True)
class BudgetState:
    """A dataset's budget: its total and the composition of its charges.

    The ledger reads the charges as sums (one row, whatever their number): their count, the
    sums of their epsilons and deltas, and, when every charge is a Gaussian mechanism, the
    sum of their ``mu^2``. That is exact: basic composition needs only the sums, and Gaussian
    mechanisms compose into the Gaussian mechanism of sensitivity ``sqrt(sum mu^2)``; so the
    charges are one claim for :class:`~klrelease.privacy.guarantee.BudgetAccountant`.
    """

    total_epsilon: float
    total_delta: float
    adjacency: str
    releases: int = 0
    sum_epsilon: float = 0.0
    sum_delta: float = 0.0
    sum_mu2: float | None = 0.0  # None: some charge has no Gaussian curve

    @property
    def spent(self) -> tuple[Guarantee, ...]:
        """The charges composed into one claim (none if nothing was charged)."""
        if not self.releases:
            return ()
        curve = None if self.sum_mu2 is None else GaussianCurve(math.sqrt(self.sum_mu2))
        return (Guarantee(epsilon=self.sum_epsilon, delta=self.sum_delta,
                          neighbouring=self.adjacency, certified=True,
                          statement=f"the composition of {self.releases} charge(s)",
                          curve=curve),)

    def accountant(self) -> BudgetAccountant:
        acc = BudgetAccountant(self.total_epsilon, self.total_delta)
        acc.spent = list(self.spent)
        return acc

    def composed_delta(self) -> float | None:
        """delta at the total epsilon of the composed curve, ``None`` without one."""
        if not self.releases:
            return 0.0
        if self.sum_mu2 is None:
            return None
        return self.accountant().total_delta_at()

    def fraction(self) -> tuple[float, str]:
        """The share of the budget spent and the accounting it comes from: the accounting
        that admits the most (the one the accountant accepts a release by).

        Under basic composition the share is ``max(sum eps / E, sum delta / D)``. When every
        charge is a Gaussian mechanism, composition adds their ``mu^2``, and the budget
        ``(E, D)`` admits ``mu^2`` up to ``mu_max(E, D)^2``: the share ``sum mu^2 / mu_max^2``
        then counts releases linearly (a release of the same claim always costs the same).
        """
        if not self.releases:
            return 0.0, "nothing spent"
        D = self.total_delta
        best = max(self.sum_epsilon / self.total_epsilon,
                   self.sum_delta / D if D > 0 else (0.0 if self.sum_delta == 0
                                                     else float("inf")))
        how = "basic composition"
        if D > 0 and self.sum_mu2 is not None:
            from ..privacy.calibration import gaussian_max_sensitivity

            share = self.sum_mu2 / gaussian_max_sensitivity(self.total_epsilon, D) ** 2
            if share < best:
                best, how = share, "composed Gaussian curve"
        return best, how

    def as_dict(self) -> dict[str, Any]:
        frac, how = self.fraction()
        return {
            "total": {"epsilon": self.total_epsilon, "delta": self.total_delta},
            "releases": self.releases,
            "spent": {"fraction": frac, "accounting": how, "sum_epsilon": self.sum_epsilon,
                      "sum_delta": self.sum_delta,
                      "delta_at_total_epsilon": self.composed_delta()},
            "remaining": {"fraction": max(1.0 - frac, 0.0),
                          "basic": {"epsilon": max(self.total_epsilon - self.sum_epsilon, 0.0),
                                    "delta": max(self.total_delta - self.sum_delta, 0.0)}},
        }


def _mu(g: Guarantee) -> float | None:
    """The mu of a Gaussian claim; None for any other (charged by basic composition)."""
    return float(g.curve.mu) if isinstance(g.curve, GaussianCurve) else None


def _budget_sql(dataset_id: int):
    """One row: count, sum of epsilons, of deltas, of mu^2, and the number with a curve."""
    from sqlalchemy import func

    return select(func.count(charges.c.id), func.coalesce(func.sum(charges.c.epsilon), 0.0),
                  func.coalesce(func.sum(charges.c.delta), 0.0),
                  func.coalesce(func.sum(charges.c.mu * charges.c.mu), 0.0),
                  func.count(charges.c.mu)).where(charges.c.dataset_id == dataset_id)


def _budget_state(dataset: DatasetRecord, row) -> BudgetState:
    n, eps, dlt, mu2, with_curve = row
    return BudgetState(dataset.budget_epsilon, dataset.budget_delta, dataset.adjacency,
                       int(n), float(eps), float(dlt),
                       float(mu2) if int(with_curve) == int(n) else None)


def request_hash(mechanism: str, epsilon: float, delta: float, options: dict) -> str:
    """A fingerprint of a release request (to tell a retry from a reused request id)."""
    text = json.dumps({"mechanism": mechanism, "epsilon": float(epsilon), "delta": float(delta),
                       "options": options}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# ------------------------------------------------------------------------------ the ledger


class Ledger:
    """The ledger in one database.

    Parameters
    ----------
    url : str
        A SQLAlchemy URL (see :func:`database_url`).
    lease, heartbeat : float
        Seconds after which a silent instance is dead, and between its renewals.
    """

    def __init__(self, url: str, *, lease: float = 30.0, heartbeat: float = 5.0):
        self.url = make_url(url)
        self.dialect = self.url.get_backend_name()
        if self.dialect not in ("sqlite", "postgresql"):
            raise ValueError("the ledger runs on SQLite or PostgreSQL")
        self.lease, self.heartbeat = float(lease), float(heartbeat)
        if self.dialect == "sqlite" and self.url.database and not Path(self.url.database).exists():
            # readable by the owner only (SQLite gives its journal files the same mode)
            os.close(os.open(self.url.database, os.O_WRONLY | os.O_CREAT, 0o600))
        self.engine = _engine(self.url)
        self._now = _now_sql(self.dialect)
        # SQLite has one writer at a time: this process's writers queue here, in order, rather
        # than in SQLite's busy handler, which polls with growing sleeps (other processes
        # still wait in the busy handler)
        self._writer = threading.Lock() if self.dialect == "sqlite" else contextlib.nullcontext()

    def __repr__(self) -> str:
        return f"Ledger({self.shown!r})"

    @property
    def shown(self) -> str:
        """The ledger's URL without its password."""
        return self.url.render_as_string(hide_password=True)

    def close(self) -> None:
        self.engine.dispose()

    # ----------------------------------------------------------------- transactions
    @contextlib.contextmanager
    def _write(self) -> Iterator[Connection]:
        """A write transaction (SQLite: BEGIN IMMEDIATE, the database's single writer)."""
        with self._writer, self.engine.connect() as conn:
            conn.execution_options(klrelease_immediate=True)
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def _read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn, conn.begin():
            yield conn

    def now(self) -> float:
        with self._read() as conn:
            return float(conn.scalar(select(self._now)))

    def _audit(self, conn: Connection, action: str, *, dataset: str | None = None,
               principal: Principal | None = None, **values) -> None:
        conn.execute(insert(audit_log).values(
            at=self._now, action=action, dataset=dataset,
            actor_id=None if principal is None else principal.id,
            actor=None if principal is None else principal.name, **values))

    # ----------------------------------------------------------------------- schema
    def create_schema(self) -> None:
        """Create the tables and triggers if they do not exist (safe to run concurrently)."""
        from sqlalchemy import inspect

        with self._write() as conn:
            if self.dialect == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})")
            if inspect(conn).has_table("meta"):
                version = conn.scalar(select(meta.c.value).where(
                    meta.c.key == "schema_version"))
                if version == SCHEMA_VERSION:
                    return  # made before: no DDL (the service's role may have no DDL right)
                if version is not None:
                    raise ValueError(f"the ledger has schema version {version}; this "
                                     f"klrelease reads version {SCHEMA_VERSION}")
            metadata.create_all(conn)
            for ddl in (_POSTGRES_TRIGGERS if self.dialect == "postgresql"
                        else _SQLITE_TRIGGERS):
                conn.exec_driver_sql(ddl)
            conn.execute(insert(meta).values(key="schema_version", value=SCHEMA_VERSION))

    # --------------------------------------------------------------------- datasets
    def add_dataset(self, values: dict, *, by: Principal | None = None) -> DatasetRecord:
        """Register a dataset (``values``: the columns of :data:`datasets` but id/created_at).

        Raises
        ------
        ValueError
            If a dataset of that name exists.
        """
        row = {k: (json.dumps(v) if k in ("source", "classes", "feature_names", "bound")
                   and v is not None else v) for k, v in values.items()}
        with self._write() as conn:
            if conn.scalar(select(datasets.c.id).where(datasets.c.name == values["name"])):
                raise ValueError(f"a dataset named {values['name']!r} is already registered")
            conn.execute(insert(datasets).values(created_at=self._now, **row))
            self._audit(conn, "dataset_added", dataset=values["name"], principal=by,
                        epsilon=values["budget_epsilon"], delta=values["budget_delta"],
                        adjacency=values["adjacency"],
                        detail=json.dumps({"max_epsilon_per_request":
                                           values.get("max_epsilon_per_request")}))
        return self.dataset(values["name"])

    def dataset(self, name: str) -> DatasetRecord | None:
        with self._read() as conn:
            row = conn.execute(select(datasets).where(datasets.c.name == name)).first()
        return None if row is None else _dataset(row)

    def datasets(self, principal: Principal | None = None) -> list[DatasetRecord]:
        """Every dataset, or those ``principal`` may see, by name."""
        with self._read() as conn:
            rows = conn.execute(select(datasets).order_by(datasets.c.name)).all()
        out = [_dataset(r) for r in rows]
        return out if principal is None else [d for d in out if principal.may_see(d)]

    # ----------------------------------------------------------------------- tokens
    def create_token(self, role: str, name: str, dataset_names=(), *,
                     by: Principal | None = None) -> tuple[int, str]:
        """A new token (returned once, stored only as its hash): ``(token id, token)``."""
        from .tokens import hash_token, new_token

        if role not in ("owner", "analyst"):
            raise ValueError("a token's role is owner or analyst")
        names = list(dict.fromkeys(dataset_names))
        if role == "analyst" and not names:
            raise ValueError("an analyst token is granted at least one dataset (--dataset NAME)")
        if role == "owner" and names:
            raise ValueError("an owner token sees every dataset; --dataset goes with analysts")
        token = new_token()
        with self._write() as conn:
            ids = []
            for n in names:
                ds = conn.scalar(select(datasets.c.id).where(datasets.c.name == n))
                if ds is None:
                    raise ValueError(f"no dataset named {n!r} is registered")
                ids.append(ds)
            tid = conn.execute(insert(tokens).values(
                token_hash=hash_token(token), name=name, role=role,
                created_at=self._now).returning(tokens.c.id)).scalar_one()
            for ds in ids:
                conn.execute(insert(grants).values(token_id=tid, dataset_id=ds))
            self._audit(conn, "token_created", principal=by,
                        detail=json.dumps({"token_id": tid, "name": name, "role": role,
                                           "datasets": names}))
        return tid, token

    def tokens(self) -> list[dict]:
        """Every token's id, name, role, datasets and dates (never the token)."""
        with self._read() as conn:
            rows = conn.execute(select(tokens).order_by(tokens.c.id)).all()
            granted = conn.execute(
                select(grants.c.token_id, datasets.c.name).join(
                    datasets, datasets.c.id == grants.c.dataset_id)).all()
        names: dict[int, list[str]] = {}
        for tid, n in granted:
            names.setdefault(tid, []).append(n)
        return [{"id": r.id, "name": r.name, "role": r.role,
                 "datasets": sorted(names.get(r.id, [])), "created_at": r.created_at,
                 "revoked_at": r.revoked_at} for r in rows]

    def revoke_token(self, token_id: int, *, by: Principal | None = None) -> None:
        with self._write() as conn:
            done = conn.execute(update(tokens).where(
                tokens.c.id == token_id, tokens.c.revoked_at.is_(None)).values(
                revoked_at=self._now)).rowcount
            if not done:
                raise ValueError(f"no active token with id {token_id}")
            self._audit(conn, "token_revoked", principal=by,
                        detail=json.dumps({"token_id": token_id}))

    def authenticate(self, token: str | None) -> Principal | None:
        """The principal of a valid, unrevoked token, else ``None``."""
        from .tokens import hash_token, well_formed

        if not token or not well_formed(token):
            return None
        with self._read() as conn:
            row = conn.execute(select(tokens).where(
                tokens.c.token_hash == hash_token(token), tokens.c.revoked_at.is_(None))).first()
            if row is None:
                return None
            ids = conn.scalars(select(grants.c.dataset_id).where(
                grants.c.token_id == row.id)).all()
        return Principal(row.id, row.name, row.role, frozenset(ids))

    # ------------------------------------------------------------------ signing key
    def register_key(self, key_id: str, public_pem: str) -> None:
        """Record the service's public key; every process sharing the ledger must use one
        key (the artifacts of a ledger verify with one public key).

        Raises
        ------
        ValueError
            If the ledger already holds another key.
        """
        with self._write() as conn:
            if self.dialect == "postgresql":  # processes starting at once: one at a time
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})")
            held = conn.execute(select(signing_keys)).all()
            if any(r.key_id == key_id for r in held):
                return
            if held:
                raise ValueError(
                    f"this ledger's artifacts are signed with key {held[0].key_id}; copy "
                    "signing-key.pem from the data directory of a host that serves it into this "
                    "data directory (one signing key per ledger)")
            conn.execute(insert(signing_keys).values(key_id=key_id, public_pem=public_pem,
                                                     created_at=self._now))

    def key_ids(self) -> list[str]:
        with self._read() as conn:
            return list(conn.scalars(select(signing_keys.c.key_id)))

    # -------------------------------------------------------------------- instances
    def register_instance(self) -> Instance:
        """Register this process as a new instance (with a fresh lease)."""
        inst = Instance(uuid.uuid4().hex, socket.gethostname()[:255], _boot_id(), os.getpid(),
                        _process_start(os.getpid()))
        with self._write() as conn:
            self._insert_instance(conn, inst)
        return inst

    def _insert_instance(self, conn: Connection, inst: Instance) -> None:
        conn.execute(insert(instances).values(
            id=inst.id, host=inst.host, boot_id=inst.boot_id, pid=inst.pid,
            pid_start=inst.pid_start, started_at=self._now, heartbeat_at=self._now))

    def renew(self, inst: Instance) -> bool:
        """Renew the lease of ``inst``; if it was declared dead, take a new id (its charges
        stay lost) and return False."""
        with self._write() as conn:
            done = conn.execute(update(instances).where(
                instances.c.id == inst.id, instances.c.dead_at.is_(None),
                instances.c.stopped_at.is_(None)).values(heartbeat_at=self._now)).rowcount
            if not done:
                inst.id = uuid.uuid4().hex
                self._insert_instance(conn, inst)
        return bool(done)

    def stop_instance(self, inst: Instance) -> int:
        """Mark ``inst`` stopped and its open charges lost; returns how many."""
        with self._write() as conn:
            conn.execute(update(instances).where(instances.c.id == inst.id).values(
                stopped_at=self._now))
        return self.sweep(inst)

    def sweep(self, me: Instance | None = None) -> int:
        """Declare dead the instances whose lease expired or (same machine) whose process is
        gone, and mark their open charges lost; returns how many charges were marked."""
        boot, host = _boot_id(), socket.gethostname()[:255]
        lost = 0
        with self._write() as conn:
            now = float(conn.scalar(select(self._now)))
            live = conn.execute(select(instances).where(
                instances.c.stopped_at.is_(None), instances.c.dead_at.is_(None))).all()
            for inst in live:
                if me is not None and inst.id == me.id:
                    continue
                expired = now - inst.heartbeat_at > self.lease
                gone = (bool(boot) and inst.boot_id == boot and inst.host == host
                        and _process_gone(inst.pid, inst.pid_start))
                if expired or gone:
                    conn.execute(update(instances).where(
                        instances.c.id == inst.id, instances.c.dead_at.is_(None)).values(
                        dead_at=now))
            ended = select(instances.c.id).where(
                (instances.c.dead_at.is_not(None)) | (instances.c.stopped_at.is_not(None)))
            rows = conn.execute(
                select(charges, datasets.c.name.label("dataset"), tokens.c.name.label("actor"))
                .join(datasets, datasets.c.id == charges.c.dataset_id)
                .join(tokens, tokens.c.id == charges.c.token_id)
                .where(charges.c.state == "charged", charges.c.instance_id.in_(ended))).all()
            for r in rows:
                done = conn.execute(update(charges).where(
                    charges.c.id == r.id, charges.c.state == "charged").values(
                    state="lost", finished_at=now)).rowcount
                if done:
                    lost += 1
                    conn.execute(insert(audit_log).values(
                        at=now, action="lost", dataset=r.dataset, request_id=r.request_id,
                        actor_id=r.token_id, actor=r.actor, mechanism=r.mechanism,
                        epsilon=r.epsilon, delta=r.delta, adjacency=r.adjacency,
                        outcome="lost", detail="the process running the release stopped; "
                        "the charge stands"))
        return lost

    # ---------------------------------------------------------------------- charges
    def charge(self, dataset: DatasetRecord, principal: Principal, *, request_id: str,
               mechanism: str, options: dict, claim: Guarantee,
               instance: Instance) -> ChargeResult:
        """Check ``claim`` against the dataset's budget and, if it fits, commit the charge.

        The check and the charge are one transaction (see the module's notes); nothing is
        read of the data. A request id seen before returns its record instead (never a
        second charge).
        """
        fingerprint = request_hash(mechanism, claim.epsilon, claim.delta, options)
        with self._write() as conn:
            if self.dialect == "postgresql":
                conn.execute(select(datasets.c.id).where(datasets.c.id == dataset.id)
                             .with_for_update())
            seen = conn.execute(select(charges).where(
                charges.c.dataset_id == dataset.id,
                charges.c.request_id == request_id)).first()
            if seen is not None:
                if seen.token_id != principal.id or seen.request_hash != fingerprint:
                    return ChargeResult("conflict")
                return ChargeResult("existing", record=self._record(conn, seen))
            state = _budget_state(dataset, conn.execute(_budget_sql(dataset.id)).one())
            values = dict(dataset=dataset.name, principal=principal, request_id=request_id,
                          mechanism=mechanism, epsilon=claim.epsilon, delta=claim.delta,
                          adjacency=claim.neighbouring,
                          guarantee=json.dumps({"statement": claim.statement,
                                                "accounting": claim.accounting,
                                                "mu": _mu(claim)}))
            try:
                state.accountant().check(claim)
            except BudgetExceeded as exc:
                self._audit(conn, "refused", outcome="budget_exceeded", **values)
                return ChargeResult("refused", message=str(exc), state=state)
            alive = conn.execute(update(instances).where(
                instances.c.id == instance.id, instances.c.dead_at.is_(None),
                instances.c.stopped_at.is_(None)).values(heartbeat_at=self._now)).rowcount
            if not alive:  # declared dead (a pause longer than the lease): a new instance
                instance.id = uuid.uuid4().hex
                self._insert_instance(conn, instance)
            cid = conn.execute(insert(charges).values(
                dataset_id=dataset.id, request_id=request_id, request_hash=fingerprint,
                token_id=principal.id, instance_id=instance.id, mechanism=mechanism,
                options=json.dumps(options, sort_keys=True), epsilon=claim.epsilon,
                delta=claim.delta, adjacency=claim.neighbouring, mu=_mu(claim),
                statement=claim.statement, state="charged",
                created_at=self._now).returning(charges.c.id)).scalar_one()
            self._audit(conn, "charged", outcome="charged", **values)
        return ChargeResult("charged", charge_id=cid)

    def settle(self, charge_id: int, state: str, *, artifact: str | None = None,
               error: str | None = None) -> bool:
        """Settle a charge once (``released`` with its artifact, or ``failed_after_charge``);
        False if it was settled before (e.g. marked lost while this process was paused)."""
        if state not in ("released", "failed_after_charge"):
            raise ValueError(f"a release settles as released or failed_after_charge, not {state}")
        with self._write() as conn:
            done = conn.execute(update(charges).where(
                charges.c.id == charge_id, charges.c.state == "charged").values(
                state=state, finished_at=self._now, artifact=artifact, error=error)).rowcount
            if done:
                r = conn.execute(
                    select(charges, datasets.c.name.label("dataset"),
                           tokens.c.name.label("actor"))
                    .join(datasets, datasets.c.id == charges.c.dataset_id)
                    .join(tokens, tokens.c.id == charges.c.token_id)
                    .where(charges.c.id == charge_id)).one()
                conn.execute(insert(audit_log).values(
                    at=self._now, action=state, dataset=r.dataset, request_id=r.request_id,
                    actor_id=r.token_id, actor=r.actor, mechanism=r.mechanism,
                    epsilon=r.epsilon, delta=r.delta, adjacency=r.adjacency, outcome=state))
        return bool(done)

    def open_charge(self, dataset: DatasetRecord, request_id: str,
                    instance: Instance) -> int | None:
        """The id of the open (``charged``) charge of ``request_id`` taken by ``instance``."""
        with self._read() as conn:
            return conn.scalar(select(charges.c.id).where(
                charges.c.dataset_id == dataset.id, charges.c.request_id == request_id,
                charges.c.instance_id == instance.id, charges.c.state == "charged"))

    def _record(self, conn: Connection, row, *, with_artifact: bool = True) -> dict:
        actor = conn.scalar(select(tokens.c.name).where(tokens.c.id == row.token_id))
        return _record(row, actor, with_artifact)

    def budget(self, dataset: DatasetRecord) -> BudgetState:
        with self._read() as conn:
            return _budget_state(dataset, conn.execute(_budget_sql(dataset.id)).one())

    def releases(self, dataset: DatasetRecord, *, owner: bool = False) -> list[dict]:
        """Every charge of ``dataset``, newest first, without artifacts (``owner``: with the
        failure notes)."""
        with self._read() as conn:
            rows = conn.execute(
                select(charges, tokens.c.name.label("actor"))
                .join(tokens, tokens.c.id == charges.c.token_id)
                .where(charges.c.dataset_id == dataset.id)
                .order_by(charges.c.id.desc())).all()
        return [_record(r, r.actor, False, owner=owner) for r in rows]

    def release(self, dataset: DatasetRecord, request_id: str) -> dict | None:
        """One charge of ``dataset`` by request id, with its artifact."""
        with self._read() as conn:
            row = conn.execute(select(charges).where(
                charges.c.dataset_id == dataset.id, charges.c.request_id == request_id)).first()
            return None if row is None else self._record(conn, row)

    def charge_rows(self, dataset: DatasetRecord) -> list[dict]:
        """The raw charges of ``dataset`` (for the owner's checks)."""
        with self._read() as conn:
            rows = conn.execute(select(charges).where(charges.c.dataset_id == dataset.id)
                                .order_by(charges.c.id)).all()
        return [dict(r._mapping) for r in rows]

    def audit(self, dataset: str | None = None) -> list[dict]:
        """The audit log (oldest first), for one dataset or all."""
        q = select(audit_log).order_by(audit_log.c.id)
        if dataset is not None:
            q = q.where(audit_log.c.dataset == dataset)
        with self._read() as conn:
            return [dict(r._mapping) for r in conn.execute(q).all()]


def _record(row, actor: str | None, with_artifact: bool, *, owner: bool = False) -> dict:
    out = {
        "request_id": row.request_id, "mechanism": row.mechanism,
        "options": json.loads(row.options), "epsilon": row.epsilon, "delta": row.delta,
        "adjacency": row.adjacency, "statement": row.statement, "state": row.state,
        "created_at": row.created_at, "finished_at": row.finished_at, "who": actor,
    }
    if with_artifact:
        out["artifact"] = row.artifact
    if owner:
        out["error"] = row.error
    return out


# ------------------------------------------------------------------------------ engines

def _engine(url) -> Engine:
    if url.get_backend_name() == "sqlite":
        engine = create_engine(url, connect_args={"timeout": 60.0, "check_same_thread": False},
                               pool_size=8, max_overflow=56, pool_timeout=120)

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn, record):  # pragma: no cover - exercised by every test
            dbapi_conn.isolation_level = None  # transactions are begun below, explicitly
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn):  # pragma: no cover - exercised by every test
            immediate = conn.get_execution_options().get("klrelease_immediate")
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine
    return create_engine(url, pool_size=8, max_overflow=56, pool_timeout=120,
                         pool_pre_ping=True)
