"""The release service as real processes (``klrelease serve``) on SQLite and PostgreSQL:
concurrent requests against a small budget shared by two processes, a SIGKILL in the middle of
a release, a restart that never touches another live process's work, and logs that carry no
token, path, data value or stack trace."""

from __future__ import annotations

import json
import math
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

import klrelease as kr  # noqa: E402
from klrelease.mechanisms import get_mechanism  # noqa: E402
from klrelease.privacy.guarantee import GaussianCurve  # noqa: E402
from klrelease.service.datadir import ledger_url  # noqa: E402
from klrelease.service.datasets import registration  # noqa: E402
from klrelease.service.ledger import Ledger  # noqa: E402

#: A mechanism outside the library, registered through the entry-point group: kl-certified
#: that waits after its plan (the data has been read, nothing drawn yet), says so in a flag
#: file, and goes on when a "go" file appears (or after SLOW_MECHANISM_SECONDS).
SLOW_MODULE = '''
import os
import time
from pathlib import Path

from klrelease.mechanisms.kl_certified.mechanism import KLCertified


class SlowKLCertified(KLCertified):
    name = "kl-certified-slow"
    summary = "kl-certified that waits after planning (a test mechanism)"

    def plan(self, data, *, epsilon, delta, **options):
        p = KLCertified.plan(self, data, epsilon=epsilon, delta=delta, **options)
        flag = os.environ.get("SLOW_MECHANISM_FLAG")
        if flag:
            Path(flag).write_text(str(os.getpid()))
        go = os.environ.get("SLOW_MECHANISM_GO")
        deadline = time.monotonic() + float(os.environ.get("SLOW_MECHANISM_SECONDS", "60"))
        while time.monotonic() < deadline and not (go and Path(go).exists()):
            time.sleep(0.05)
        return p
'''


@pytest.fixture
def slow_plugin(tmp_path):
    """A directory holding the slow mechanism as an installed distribution (its entry point
    in ``klrelease.mechanisms``), to put on a service process's PYTHONPATH."""
    site = tmp_path / "plugin"
    (site / "slow_mechanism-0.1.dist-info").mkdir(parents=True)
    (site / "slow_mechanism.py").write_text(SLOW_MODULE)
    (site / "slow_mechanism-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: slow-mechanism\nVersion: 0.1\n")
    (site / "slow_mechanism-0.1.dist-info" / "entry_points.txt").write_text(
        "[klrelease.mechanisms]\nkl-certified-slow = slow_mechanism:SlowKLCertified\n")
    return site


def _setup(data_dir, database, **budget):
    led = Ledger(ledger_url(data_dir, database))
    led.create_schema()
    led.add_dataset(registration("iris", bundled="iris", **budget))
    token = led.create_token("analyst", "alice", ["iris"])[1]
    return led, token


def _post(url, token, timeout=120.0, **body):
    return httpx.post(f"{url}/v1/datasets/iris/releases", json=body, timeout=timeout,
                      headers={"Authorization": f"Bearer {token}"})


def _wait(predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# ------------------------------------------------------------------------------ concurrency


def test_fifty_concurrent_requests_against_a_budget_for_ten(tmp_path, ledger_database,
                                                            service_process):
    """50 requests at once, spread over two service processes sharing one ledger, against a
    budget that admits exactly 10: exactly 10 artifacts, 40 answers of 409, and the ledger
    holds 10 charges that fill the budget. Two datasets at once: kl-certified, accounted by
    the composed Gaussian curve; gaussian-iid, which has no public curve, by basic composition
    (the ledger's sums equal the total)."""
    eps, dlt = 1.0, 1e-6
    mech = get_mechanism("kl-certified")
    mu = mech.public_guarantee(epsilon=eps, delta=dlt, options=mech.validate_options({}),
                               n_samples=150, n_classes=3, n_features=4).curve.mu
    budgets = {"kl-certified": (3.0, GaussianCurve(mu * math.sqrt(10.5)).delta_at(3.0)),
               "gaussian-iid": (10 * eps, 10 * dlt)}
    data = tmp_path / "data"
    led = Ledger(ledger_url(data, ledger_database))
    led.create_schema()
    for name, (E, D) in budgets.items():
        led.add_dataset(registration(name, bundled="iris", budget_epsilon=E, budget_delta=D))
    token = led.create_token("analyst", "alice", list(budgets))[1]
    servers = service_process(data, ledger_database, count=2)
    jobs = [(name, i) for i in range(50) for name in budgets]
    barrier = threading.Barrier(len(jobs))

    def one(job):
        name, i = job
        barrier.wait(timeout=60)
        return name, httpx.post(f"{servers[i % 2].url}/v1/datasets/{name}/releases",
                                headers={"Authorization": f"Bearer {token}"}, timeout=120,
                                json={"mechanism": name, "epsilon": eps, "delta": dlt,
                                      "request_id": f"c-{i}"})

    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(one, jobs))
    key = httpx.get(servers[0].url + "/v1/key").json()["public_key_pem"]
    for name, (E, D) in budgets.items():
        mine = [r for n, r in answers if n == name]
        codes = sorted(r.status_code for r in mine)
        assert codes == [201] * 10 + [409] * 40, (name, codes)
        assert all(r.json()["code"] == "budget_exceeded" for r in mine if r.status_code == 409)
        released = [kr.Release.from_json(r.text, public_key=key) for r in mine
                    if r.status_code == 201]
        assert len({json.dumps(r.gmm.means.tolist()) for r in released}) == 10
        ds = led.dataset(name)
        rows = led.charge_rows(ds)
        assert len(rows) == 10 and {r["state"] for r in rows} == {"released"}
        state = led.budget(ds)
        one = GaussianCurve(mu) if name == "kl-certified" else None
        claim = kr.Guarantee(eps, dlt, "label-flip", True, "", curve=one)
        with pytest.raises(kr.BudgetExceeded):
            state.accountant().check(claim)  # the total admits no 11th
        assert state.releases == 10
        if name == "gaussian-iid":
            assert state.sum_mu2 is None  # no public curve: basic composition
            assert sum(r["epsilon"] for r in rows) == pytest.approx(E, rel=1e-12)
            assert sum(r["delta"] for r in rows) == pytest.approx(D, rel=1e-9)
        else:
            assert state.fraction() == (pytest.approx(10 / 10.5, rel=1e-9),
                                        "composed Gaussian curve")
        assert len([a for a in led.audit(name) if a["action"] == "refused"]) == 40
    led.close()


# ------------------------------------------------------------------------------ SIGKILL


def test_sigkill_mid_release_marks_it_lost_and_spares_the_live_process(
        tmp_path, ledger_database, service_process, slow_plugin):
    """Two processes on one ledger, each in the middle of a release (charged, data read,
    no noise drawn). One is killed with SIGKILL and restarted on the same data directory:
    its request is lost (charged, not released, not refunded; a retry is refused and not
    charged again), while the other process's release completes."""
    data = tmp_path / "data"
    led, token = _setup(data, ledger_database, budget_epsilon=10.0, budget_delta=1e-5)
    flags = [tmp_path / "live", tmp_path / "doomed"]
    go = tmp_path / "go"
    live, doomed = service_process(data, ledger_database, env=[{
        "PYTHONPATH": str(slow_plugin), "SLOW_MECHANISM_FLAG": str(f),
        "SLOW_MECHANISM_GO": str(go), "SLOW_MECHANISM_SECONDS": "120"} for f in flags])
    h = {"Authorization": f"Bearer {token}"}
    info = httpx.get(f"{doomed.url}/v1/datasets/iris", headers=h).json()
    assert "kl-certified-slow" in [m["name"] for m in info["mechanisms"]]
    answers = {}

    def ask(server, rid):
        try:
            answers[rid] = _post(server.url, token, mechanism="kl-certified-slow",
                                 epsilon=1.0, delta=1e-6, request_id=rid)
        except httpx.HTTPError as exc:
            answers[rid] = exc

    threads = [threading.Thread(target=ask, args=(s, rid))
               for s, rid in ((live, "survivor"), (doomed, "doomed"))]
    for t in threads:
        t.start()
    _wait(lambda: all(f.exists() for f in flags), what="both releases to be planned")
    ds = led.dataset("iris")
    assert {r["request_id"]: r["state"] for r in led.charge_rows(ds)} == {
        "survivor": "charged", "doomed": "charged"}  # committed before the data was read
    doomed.kill(signal.SIGKILL)
    threads[1].join(timeout=60)
    assert isinstance(answers["doomed"], httpx.HTTPError)  # the analyst got no artifact

    doomed.start()  # a restart on the same data directory, while the other still works
    states = {r["request_id"]: r for r in led.charge_rows(ds)}
    assert states["doomed"]["state"] == "lost" and states["doomed"]["artifact"] is None
    assert states["survivor"]["state"] == "charged"  # alive: never marked lost
    go.touch()  # the survivor goes on
    threads[0].join(timeout=120)
    assert answers["survivor"].status_code == 201, answers["survivor"]
    lost = [a for a in led.audit("iris") if a["action"] == "lost"]
    assert [a["request_id"] for a in lost] == ["doomed"]
    # whichever process swept first (the live one's heartbeat, or the restart) logged it
    assert "marked lost" in live.log() + doomed.log()

    # the retry is told, is not run again and not charged again; nothing was refunded
    flags[1].unlink()
    retry = _post(doomed.url, token, mechanism="kl-certified-slow", epsilon=1.0, delta=1e-6,
                  request_id="doomed")
    assert retry.status_code == 409 and retry.json()["code"] == "request_lost"
    assert not flags[1].exists()
    budget = httpx.get(f"{doomed.url}/v1/datasets/iris/budget", headers=h).json()
    assert budget["releases"] == 2 and budget["spent"]["sum_epsilon"] == 2.0
    assert {r["request_id"]: r["state"] for r in led.charge_rows(ds)} == {
        "survivor": "released", "doomed": "lost"}
    assert httpx.get(f"{doomed.url}/v1/datasets/iris/releases/doomed",
                     headers=h).status_code == 404
    led.close()


# ---------------------------------------------------------------------------------- logs


def test_logs_and_answers_carry_no_token_path_value_or_trace(tmp_path, ledger_database,
                                                             service_process):
    """Every kind of request, including one that fails after its charge: no token, no path,
    no data value and no stack trace in any answer or log line."""
    import numpy as np

    secret_dir = tmp_path / "owner-only-directory"
    secret_dir.mkdir()
    csv = secret_dir / "patients.csv"
    rng = np.random.default_rng(1)
    X = rng.normal(size=(1913, 2))
    X[7] = [123.456789, -98.7654321]  # distinctive values
    y = np.where(np.arange(1913) % 3 == 0, "sick", "well")
    csv.write_text("f1,f2,label\n" + "\n".join(f"{a:.9g},{b:.9g},{c}" for (a, b), c in
                                                 zip(X, y, strict=True)) + "\n")
    data = tmp_path / "data"
    led = Ledger(ledger_url(data, ledger_database))
    led.create_schema()
    led.add_dataset(registration("patients", csv=str(csv), label_column="label",
                                 classes=["sick", "well"], budget_epsilon=4.0,
                                 budget_delta=1e-5))
    token = led.create_token("analyst", "alice", ["patients"])[1]
    owner = led.create_token("owner", "olivia")[1]
    server = service_process(data, ledger_database, log_dir=tmp_path)
    h = {"Authorization": f"Bearer {token}"}
    answers = [
        httpx.get(f"{server.url}/v1/datasets", headers=h),
        httpx.get(f"{server.url}/v1/datasets/patients", headers=h),
        httpx.post(f"{server.url}/v1/datasets/patients/releases", headers=h,
                   json={"epsilon": 1.0, "delta": 1e-6, "request_id": "first"}),
        httpx.post(f"{server.url}/v1/datasets/patients/releases", headers=h,
                   json={"epsilon": 9.0, "delta": 1e-6}),
        httpx.post(f"{server.url}/v1/datasets/patients/releases", headers=h,
                   json={"epsilon": -1, "delta": 1e-6}),
        httpx.post(f"{server.url}/v1/datasets/patients/releases",
                   headers={"Authorization": f"Bearer {token}x"}, json={}),
        httpx.get(f"{server.url}/v1/datasets/patients/budget", headers=h),
        httpx.get(f"{server.url}/v1/datasets/patients/releases", headers=h),
        httpx.get(f"{server.url}/v1/datasets/nowhere/budget", headers=h),
    ]
    assert [r.status_code for r in answers] == [200, 200, 201, 409, 422, 401, 200, 200, 403]
    csv.rename(secret_dir / "moved.csv")  # the data goes away: the next release fails late
    failed = httpx.post(f"{server.url}/v1/datasets/patients/releases", headers=h,
                        json={"epsilon": 1.0, "delta": 1e-6, "request_id": "late"})
    assert failed.status_code == 500 and failed.json()["code"] == "failed_after_charge"
    answers.append(failed)
    owner_view = httpx.get(f"{server.url}/v1/audit",
                           headers={"Authorization": f"Bearer {owner}"})
    assert owner_view.status_code == 200
    server.stop()
    log = server.log()
    assert "POST /v1/datasets/patients/releases" in log and "failed after the charge" in log
    forbidden = [token, token[4:], owner, str(secret_dir), "owner-only-directory",
                 "patients.csv", "123.456", "98.765", "Traceback", 'File "']
    for text in [log] + [r.text for r in answers]:
        for word in forbidden:
            assert word not in text, word
        assert not re.search(r"\b1913\b", text)  # N is the owner's
    assert not re.search(r"\b1913\b", failed.text + answers[1].text)
    # the owner's ledger keeps why the late one failed
    rows = {r["request_id"]: r for r in led.charge_rows(led.dataset("patients"))}
    assert rows["late"]["state"] == "failed_after_charge" and rows["late"]["error"]
    led.close()
