"""The release service under load: budget checks and Iris releases per second, SQLite against
PostgreSQL, with 1, 8 and 32 concurrent clients.

For each ledger a ``klrelease serve`` process (one uvicorn worker) is started on 127.0.0.1
with two datasets (the bundled Iris data): ``open`` with a budget no run exhausts, and ``spent``
whose budget one release used up. Each client is a thread with its own keep-alive HTTP
connection that sends requests for ``--seconds`` seconds:

* **budget check**: a kl-certified request on ``spent``: authenticated, validated, its claim
  checked against every charge in the ledger's locked transaction and refused (409), the
  refusal written to the audit log;
* **release**: a kl-certified release of Iris on ``open`` (epsilon = 1, delta = 1e-6): charged,
  data read, noise drawn, artifact signed, charge settled (201).

Throughput is requests answered per second of wall time; latency is per request, seen by the
client. Clients and server share the machine's cores. PostgreSQL is the server named by
``KLRELEASE_TEST_POSTGRES`` or, without it, a throw-away server started by
``.ci/postgres.sh`` (default settings: fsync and synchronous commit on, like SQLite's
``synchronous=FULL``).

    python benchmarks/bench_service.py [--seconds 8]

Prints a markdown table and writes it to ``benchmarks/service.md`` (and ``service.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CLIENTS = (1, 8, 32)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``klrelease serve`` in a subprocess."""

    def __init__(self, data_dir: Path, database: str | None):
        import httpx

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "klrelease", "serve", "--data-dir", str(data_dir),
               "--port", str(self.port)]
        if database:
            cmd += ["--database", database]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        self.log = open(data_dir.parent / f"serve-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=self.log,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("the service did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def _setup(data_dir: Path, database: str | None) -> str:
    """Register the two datasets and spend ``spent``; returns an analyst token."""
    from klrelease.service.datadir import ledger_url
    from klrelease.service.datasets import registration
    from klrelease.service.ledger import Ledger

    led = Ledger(ledger_url(data_dir, database))
    led.create_schema()
    led.add_dataset(registration("open", bundled="iris", budget_epsilon=1e9,
                                 budget_delta=0.5))
    led.add_dataset(registration("spent", bundled="iris", budget_epsilon=1.0,
                                 budget_delta=1e-6))
    token = led.create_token("analyst", "bench", ["open", "spent"])[1]
    led.close()
    return token


def load(url: str, token: str, dataset: str, expect: int, clients: int,
         seconds: float) -> dict:
    """``clients`` threads sending release requests for ``seconds``; throughput and latency."""
    import httpx

    lat: list[list[float]] = [[] for _ in range(clients)]
    wrong = [0] * clients
    start = threading.Barrier(clients + 1)
    body = {"mechanism": "kl-certified", "epsilon": 1.0, "delta": 1e-6}

    def worker(i: int) -> None:
        with httpx.Client(base_url=url, timeout=120,
                          headers={"Authorization": f"Bearer {token}"}) as c:
            c.get("/v1/health")  # open the connection before the clock starts
            start.wait()
            end = time.monotonic() + seconds
            while True:
                t0 = time.perf_counter()
                r = c.post(f"/v1/datasets/{dataset}/releases",
                           json={**body, "request_id": uuid.uuid4().hex})
                lat[i].append(time.perf_counter() - t0)
                wrong[i] += r.status_code != expect
                if time.monotonic() >= end:
                    break

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    flat = np.array([x for xs in lat for x in xs])
    return {"clients": clients, "requests": int(flat.size), "wall_s": wall,
            "per_s": flat.size / wall, "p50_ms": 1e3 * float(np.percentile(flat, 50)),
            "p99_ms": 1e3 * float(np.percentile(flat, 99)), "unexpected": int(sum(wrong))}


def _postgres():
    """(admin URL, stop function): the server of KLRELEASE_TEST_POSTGRES or a new one."""
    url = os.environ.get("KLRELEASE_TEST_POSTGRES")
    if url:
        return url, lambda: None
    out = subprocess.run([str(ROOT / ".ci" / "postgres.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout
    env = dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines())
    return env["KLRELEASE_TEST_POSTGRES"], lambda: subprocess.run(
        [str(ROOT / ".ci" / "postgres.sh"), "stop", env["PG_TEST_DIR"]], check=False)


def _new_database(admin: str) -> str:
    import psycopg

    name = f"klrelease_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        version = conn.execute("SHOW server_version").fetchone()[0]
    return admin.rpartition("/")[0] + f"/{name}", version


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="per workload and concurrency")
    ap.add_argument("--out", type=Path, default=HERE / "service.md")
    args = ap.parse_args()

    import sqlalchemy
    import uvicorn

    load_avg = os.getloadavg()[0]
    admin, stop_pg = _postgres()
    rows, versions = [], {}
    try:
        for backend in ("SQLite", "PostgreSQL"):
            work = Path(tempfile.mkdtemp(prefix="klrelease-bench-"))
            database = None
            if backend == "PostgreSQL":
                database, versions["PostgreSQL"] = _new_database(admin)
            token = _setup(work / "data", database)
            server = Server(work / "data", database)
            try:
                load(server.url, token, "open", 201, 1, 1.0)  # warm up
                spend = load(server.url, token, "spent", 409, 1, 0.0)  # one request: 201
                assert spend["requests"] == 1 and spend["unexpected"] == 1
                for kind, dataset, expect in (("budget check", "spent", 409),
                                              ("release", "open", 201)):
                    for n in CLIENTS:
                        r = load(server.url, token, dataset, expect, n, args.seconds)
                        r.update(backend=backend, workload=kind)
                        rows.append(r)
                        print(f"{backend:10s} {kind:12s} {n:2d} clients: {r['per_s']:7.1f}/s"
                              f"  p50 {r['p50_ms']:6.1f} ms  p99 {r['p99_ms']:7.1f} ms"
                              f"  ({r['requests']} requests, {r['unexpected']} unexpected)",
                              flush=True)
            finally:
                server.stop()
                shutil.rmtree(work, ignore_errors=True)
    finally:
        stop_pg()

    load_end = os.getloadavg()[0]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    table = ["| ledger | workload | clients | requests | per second | p50 (ms) | p99 (ms) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['backend']} | {r['workload']} | {r['clients']} | {r['requests']} | "
                     f"{r['per_s']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    bad = sum(r["unexpected"] for r in rows)
    text = "\n".join([
        "# The release service under load",
        "",
        f"Produced by `python benchmarks/bench_service.py --seconds {args.seconds:g}` on "
        f"{stamp}, on a shared {os.cpu_count()}-core machine (load average {load_avg:.1f} at "
        f"the start, {load_end:.1f} at the end: other work shared the cores): one "
        f"`klrelease serve` process (one uvicorn worker) per ledger, the "
        f"clients threads of one process on the same machine. Python "
        f"{platform.python_version()}, SQLAlchemy {sqlalchemy.__version__}, uvicorn "
        f"{uvicorn.__version__}, SQLite {_sqlite_version()} (WAL, synchronous=FULL), "
        f"PostgreSQL {versions.get('PostgreSQL', '?')} (default settings).",
        "",
        "*budget check*: a kl-certified request on a dataset whose budget is spent: "
        "authenticated, validated, checked against every charge of the dataset in the "
        "ledger's locked transaction, refused (409) and audited. *release*: a kl-certified "
        "release of Iris (epsilon = 1, delta = 1e-6): charged and committed, data read, "
        "noise drawn, artifact signed (Ed25519), charge settled (201).",
        "",
        *table,
        "",
        f"Every answer had the expected status ({bad} unexpected).",
        "",
    ])
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print()
    print(text)


def _sqlite_version() -> str:
    import sqlite3

    return sqlite3.sqlite_version


if __name__ == "__main__":
    main()
