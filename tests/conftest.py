import pytest


def synthetic_gmm_data(N=1000, K=5, d=3, seed=42):
    """The paper's synthetic setting (:func:`klrelease.experiments.synthetic_data`)."""
    from klrelease.experiments import synthetic_data

    return synthetic_data(N, K, d, seed)


@pytest.fixture
def synthetic():
    return synthetic_gmm_data()


@pytest.fixture
def iris():
    from klrelease import load_dataset

    return load_dataset("iris")


def mean_noise_problems(X, y, K):
    """kl-paper's per-class mean-noise SDPs of ``(X, y)`` as the passes over rows take them:
    the class statistics, the constraint matrices ``A`` (the inverse class covariances,
    symmetrised), the rows' affine map to their neighbour vectors and the Gram of those
    vectors."""
    import numpy as np

    from klrelease.solvers.passes import AffineRows, affine_gram
    from klrelease.statistics import class_statistics

    st = class_statistics(X, y, K)
    A = np.linalg.inv(st.covariances)
    A = 0.5 * (A + A.transpose(0, 2, 1))
    counts = st.counts.astype(float)
    scales = np.diag(1.0 / (counts - 1)) + (1 - np.eye(K)) / (counts + 1)[:, None]
    rows = AffineRows(st.means, scales)
    gram = affine_gram(rows, counts, st.means, st.covariances * (counts - 1)[:, None, None])
    return st, A, rows, gram


#: Public bounds in the data's units for the learners that need them (required options), at
#: values that suit the unit-scale test mixtures.
LEARNER_SCALES = {
    "kamath-pgme-lite": {"R": 10.0, "sigma_min": 0.1, "sigma_max": 3.0},
    "kamath-sa-lite": {"R": 10.0, "sigma_min": 0.1, "sigma_max": 3.0},
    "kamath-pegme": {"sigma_min": 0.5},
    "afzali-style-sample-aggregate": {"sigma_max": 3.0},
    "dp-em": {"R": 10.0, "sigma_max": 3.0},
    "park-dp-em": {"R": 10.0, "sigma_max": 3.0},
}


def learner_options(name, **options):
    """``options`` that learner ``name`` accepts, with its required bounds
    (:data:`LEARNER_SCALES`) unless given: one option set for a loop over learners."""
    from klrelease.learners import get_learner
    from klrelease.learners.result import learner_options as accepted

    known = accepted(get_learner(name))
    out = {k: v for k, v in LEARNER_SCALES.get(name, {}).items() if k not in options}
    out.update({k: v for k, v in options.items() if k in known})
    return out


# ----------------------------------------------------------------- the release service

import os  # noqa: E402

#: Set by .ci/run: tests that need PostgreSQL or Chromium fail instead of skipping.
REQUIRE_SERVICES = os.environ.get("KLRELEASE_REQUIRE_SERVICES") == "1"


def need(reason: str):
    """Skip a test that needs a real component that is absent (fail in CI)."""
    if REQUIRE_SERVICES:
        pytest.fail(f"{reason} (KLRELEASE_REQUIRE_SERVICES=1: it must run here)")
    pytest.skip(reason)


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_database(request):
    """The ``--database`` of a service under test: ``None`` (SQLite in its data directory) or
    a fresh database on the PostgreSQL server named by ``KLRELEASE_TEST_POSTGRES`` (started by
    .ci/run), dropped afterwards."""
    if request.param == "sqlite":
        yield None
        return
    admin = os.environ.get("KLRELEASE_TEST_POSTGRES")
    if not admin:
        need("no PostgreSQL server: KLRELEASE_TEST_POSTGRES is not set (.ci/run starts one)")
    import uuid

    psycopg = pytest.importorskip("psycopg")
    name = f"klrelease_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = admin.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class ServiceProcess:
    """``klrelease serve`` in a subprocess on 127.0.0.1 and a free port (stdout and stderr
    kept in files), stopped by the fixture that made it."""

    def __init__(self, data_dir, database=None, env=None, log_dir=None, args=()):
        import socket
        import sys
        from pathlib import Path

        self.data_dir, self.database = Path(data_dir), database
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        root = str(Path(__file__).resolve().parents[1])
        extra = dict(env or {})
        path = [p for p in (extra.pop("PYTHONPATH", None), root,
                            os.environ.get("PYTHONPATH")) if p]
        self.env = {**os.environ, **extra, "PYTHONPATH": os.pathsep.join(path)}
        self.cmd = [sys.executable, "-m", "klrelease", "serve", "--data-dir", str(data_dir),
                    "--port", str(self.port)]
        if database is not None:
            self.cmd += ["--database", database]
        self.cmd += list(args)
        log_dir = Path(log_dir or Path(data_dir).parent)
        self.out_path = log_dir / f"serve-{self.port}.out"
        self.err_path = log_dir / f"serve-{self.port}.err"
        self.proc = None
        self.logs = []

    def launch(self) -> "ServiceProcess":
        """Start the process (without waiting for it to listen)."""
        import subprocess

        out = open(self.out_path, "ab")  # noqa: SIM115 - closed in stop()
        err = open(self.err_path, "ab")  # noqa: SIM115
        self.logs += [out, err]
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=out, stderr=err,
                                     stdin=subprocess.DEVNULL)
        return self

    def start(self, timeout: float = 90.0) -> "ServiceProcess":
        """Start the process and wait until it answers."""
        return self.launch().ready(timeout)

    def ready(self, timeout: float = 90.0) -> "ServiceProcess":
        """Wait until the launched process answers ``/v1/health``."""
        import time

        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited: {self.log()[-2000:]}")
            try:
                if httpx.get(self.url + "/v1/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the service did not start in time")

    def kill(self, sig) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        import subprocess

        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        for fh in self.logs:
            fh.close()
        self.logs = []

    def log(self) -> str:
        for fh in self.logs:
            fh.flush()
        return "".join(p.read_text(errors="replace") for p in (self.out_path, self.err_path)
                       if p.exists())


@pytest.fixture
def service_process():
    """A factory of started :class:`ServiceProcess` (each stopped when the test ends);
    ``count=n`` starts n processes at once and returns them in a list."""
    made = []

    def start(data_dir, database=None, env=None, *, count=None, **kw):
        envs = env if isinstance(env, list) else [env] * (count or 1)
        procs = [ServiceProcess(data_dir, database, e, **kw) for e in envs]
        made.extend(procs)
        for proc in procs:
            proc.launch()
        for proc in procs:
            proc.ready()
        return procs if count is not None or isinstance(env, list) else procs[0]

    yield start
    for proc in made:
        proc.stop()


@pytest.fixture
def need_component():
    """:func:`need` for test modules: skip without a real component (fail in CI)."""
    return need
