"""The release service in process (FastAPI's test client), on SQLite and on PostgreSQL:
every status code, idempotent retries, the budget, the ledger's invariants, the audit log,
tokens stored as hashes, and what an analyst can and cannot see."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("sqlalchemy")

from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import text  # noqa: E402

import klrelease as kr  # noqa: E402
from klrelease.mechanisms import get_mechanism  # noqa: E402
from klrelease.privacy.guarantee import GaussianCurve  # noqa: E402
from klrelease.service.app import ServiceConfig, create_app  # noqa: E402
from klrelease.service.datasets import registration  # noqa: E402


class Svc:
    def __init__(self, client, app, data_dir):
        self.client, self.app, self.data_dir = client, app, data_dir
        self.ledger = app.state.service.ledger
        self.key = client.get("/v1/key").json()["public_key_pem"]

    def token(self, role="analyst", datasets=("iris",), name="alice"):
        return self.ledger.create_token(role, name, list(datasets))[1]

    def post(self, token, dataset="iris", **body):
        return self.client.post(f"/v1/datasets/{dataset}/releases", json=body,
                                headers={"Authorization": f"Bearer {token}"})

    def get(self, token, path):
        return self.client.get(path, headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def svc(tmp_path, ledger_database):
    app = create_app(ServiceConfig(tmp_path / "data", ledger_database))
    with TestClient(app) as client:
        s = Svc(client, app, tmp_path / "data")
        s.ledger.add_dataset(registration("iris", bundled="iris", budget_epsilon=3.0,
                                          budget_delta=1e-5, max_epsilon_per_request=2.0))
        yield s


def _csv(path, n=120, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2)) + np.repeat([[0, 0], [3, 3]], n // 2, axis=0)
    y = np.repeat(["a", "b"], n // 2)
    lines = ["f1,f2,label"] + [f"{a:.6f},{b:.6f},{c}" for (a, b), c in zip(X, y, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


# ----------------------------------------------------------------------------- status codes


def test_release_is_201_signed_and_a_retry_returns_it_uncharged(svc):
    tok = svc.token()
    r = svc.post(tok, epsilon=1.0, delta=1e-6, request_id="r-1")
    assert r.status_code == 201, r.text
    assert r.headers["location"] == "/v1/datasets/iris/releases/r-1"
    rel = kr.Release.from_json(r.text, public_key=svc.key)
    assert rel.privacy.certified and rel.privacy.epsilon == 1.0 and rel.randomness.secure
    assert rel.mechanism == "kl-certified" and rel.gmm.classes == ("setosa", "versicolor",
                                                                   "virginica")
    again = svc.post(tok, epsilon=1.0, delta=1e-6, request_id="r-1")
    assert again.status_code == 200 and again.text == r.text
    assert svc.get(tok, "/v1/datasets/iris/budget").json()["releases"] == 1
    assert len(svc.ledger.charge_rows(svc.ledger.dataset("iris"))) == 1
    fetched = svc.get(tok, "/v1/datasets/iris/releases/r-1")
    assert fetched.status_code == 200 and fetched.text == r.text
    # the same id for another request is refused, and charges nothing
    other = svc.post(tok, epsilon=0.5, delta=1e-6, request_id="r-1")
    assert other.status_code == 422 and other.json()["code"] == "request_id_reused"
    assert svc.get(tok, "/v1/datasets/iris/budget").json()["releases"] == 1


def test_401_without_a_valid_token(svc):
    for headers in ({}, {"Authorization": "Bearer klr_" + "x" * 43},
                    {"Authorization": "Basic abc"}, {"Authorization": "Bearer nonsense"}):
        r = svc.client.post("/v1/datasets/iris/releases", json={"epsilon": 1, "delta": 1e-6},
                            headers=headers)
        assert r.status_code == 401 and r.json()["code"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
        assert "Bearer TOKEN" in r.json()["detail"]
    tid, tok = svc.ledger.create_token("analyst", "bob", ["iris"])
    assert svc.get(tok, "/v1/datasets/iris/budget").status_code == 200
    svc.ledger.revoke_token(tid)
    assert svc.get(tok, "/v1/datasets/iris/budget").status_code == 401
    assert svc.ledger.budget(svc.ledger.dataset("iris")).spent == ()


def test_403_for_a_dataset_the_token_is_not_granted(svc, tmp_path):
    svc.ledger.add_dataset(registration("other", csv=str(_csv(tmp_path / "o.csv")),
                                        label_column="label", classes=["a", "b"],
                                        budget_epsilon=5, budget_delta=1e-5))
    tok = svc.token(datasets=("iris",))
    for path in ("/v1/datasets/other", "/v1/datasets/other/budget",
                 "/v1/datasets/other/releases", "/v1/datasets/nowhere/budget"):
        r = svc.get(tok, path)
        assert r.status_code == 403 and "not granted" in r.json()["detail"], path
    assert svc.post(tok, "other", epsilon=1, delta=1e-6).status_code == 403
    assert [d["name"] for d in svc.get(tok, "/v1/datasets").json()["datasets"]] == ["iris"]
    # owner endpoints need an owner token
    assert svc.get(tok, "/v1/audit").status_code == 403
    r = svc.client.post("/v1/tokens", json={"role": "analyst", "datasets": ["iris"]},
                        headers={"Authorization": f"Bearer {tok}"})
    assert r.status_code == 403
    owner = svc.token("owner", ())
    assert svc.get(owner, "/v1/datasets/nowhere").status_code == 404
    assert svc.get(owner, "/v1/datasets/other/budget").status_code == 200


def test_409_budget_exceeded_says_what_remains(svc):
    tok = svc.token()
    ok = 0
    while True:
        r = svc.post(tok, epsilon=2.0, delta=1e-6)
        if r.status_code != 201:
            break
        ok += 1
    assert ok >= 1 and r.status_code == 409
    body = r.json()
    assert body["code"] == "budget_exceeded" and "remaining" in body["detail"]
    assert body["budget"]["releases"] == ok and 0 <= body["budget"]["remaining"]["fraction"] < 1
    best = body["largest_epsilon"]
    assert best is not None and 0 < best < 2.0 and f"epsilon={best:.4g}" in body["detail"]
    # the largest epsilon it names fits, and a little more does not
    assert svc.post(tok, epsilon=best * 1.01, delta=1e-6).status_code == 409
    assert svc.post(tok, epsilon=best, delta=1e-6).status_code == 201
    # refusals are audited and charge nothing
    actions = [a["action"] for a in svc.ledger.audit("iris")]
    assert actions.count("refused") == 2 and actions.count("charged") == ok + 1


@pytest.mark.parametrize(("body", "match"), [
    ({"epsilon": -1, "delta": 1e-6}, "epsilon must be a finite number > 0"),
    ({"epsilon": 1, "delta": 1.5}, "delta must lie strictly between 0 and 1"),
    ({"epsilon": "1", "delta": 1e-6}, "epsilon must be a number"),
    ({"delta": 1e-6}, "needs epsilon and delta"),
    ({"epsilon": 2.5, "delta": 1e-6}, "maximum per request"),
    ({"epsilon": 1, "delta": 1e-6, "mechanism": "nope"}, "unknown mechanism"),
    ({"epsilon": 1, "delta": 1e-6, "mechanism": "kl-paper"}, "not certified"),
    ({"epsilon": 1, "delta": 1e-6, "mechanism": "laplace-iid"}, "not certified"),
    ({"epsilon": 1, "delta": 1e-6, "options": {"norm_bound": 3.0}}, "fixed by the registration"),
    ({"epsilon": 1, "delta": 1e-6, "options": {"adjacency": "replace-one"}},
     "fixed by the registration"),
    ({"epsilon": 1, "delta": 1e-6, "options": {"bounds_from_data": True}},
     "fixed by the registration"),
    ({"epsilon": 1, "delta": 1e-6, "options": {"frobnicate": 1}}, "unknown option"),
    ({"epsilon": 1, "delta": 1e-6, "seed": 3}, "unknown field"),
    ({"epsilon": 1, "delta": 1e-6, "request_id": "has space"}, "request_id"),
])
def test_422_for_a_bad_request_charges_nothing(svc, body, match):
    tok = svc.token()
    r = svc.post(tok, **body)
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "invalid_request" and match in r.json()["detail"]
    assert "\n" not in r.json()["detail"]
    assert svc.ledger.charge_rows(svc.ledger.dataset("iris")) == []


def test_422_for_a_body_that_is_not_a_json_object(svc):
    tok = svc.token()
    r = svc.client.post("/v1/datasets/iris/releases", content=b"{not json",
                        headers={"Authorization": f"Bearer {tok}",
                                 "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["code"] == "invalid_request"


def test_500_after_the_charge_keeps_the_charge_and_hides_the_error(svc, tmp_path):
    (tmp_path / "secret-place").mkdir()
    data = _csv(tmp_path / "secret-place" / "data.csv")
    svc.ledger.add_dataset(registration("gone", csv=str(data), label_column="label",
                                        classes=["a", "b"], budget_epsilon=5,
                                        budget_delta=1e-5))
    tok = svc.token(datasets=("gone",))
    data.unlink()  # the file disappears after registration: reading it fails after the charge
    r = svc.post(tok, "gone", epsilon=1.0, delta=1e-6, request_id="lost-file")
    assert r.status_code == 500 and r.json()["code"] == "failed_after_charge"
    assert "secret-place" not in r.text and "Traceback" not in r.text
    ds = svc.ledger.dataset("gone")
    (row,) = svc.ledger.charge_rows(ds)
    assert row["state"] == "failed_after_charge" and row["epsilon"] == 1.0
    assert "ValueError" in row["error"]  # the owner can see why
    # a retry is not run again and not charged again; the analyst never sees the error
    again = svc.post(tok, "gone", epsilon=1.0, delta=1e-6, request_id="lost-file")
    assert again.status_code == 409 and again.json()["state"] == "failed_after_charge"
    assert len(svc.ledger.charge_rows(ds)) == 1
    listed = svc.get(tok, "/v1/datasets/gone/releases").json()["releases"]
    assert "error" not in listed[0] and listed[0]["state"] == "failed_after_charge"
    assert svc.get(tok, "/v1/datasets/gone/releases/lost-file").json()["code"] == "no_artifact"
    owner = svc.token("owner", ())
    assert "ValueError" in svc.get(owner, "/v1/datasets/gone/releases").json()[
        "releases"][0]["error"]


# ----------------------------------------------------------------------------------- budget


def test_budget_composes_gaussian_curves_and_an_11th_does_not_fit(svc):
    """A budget that admits exactly 10 kl-certified releases of (1, 1e-6) by the composed
    curve: the ledger holds 10 charges, the 11th is refused."""
    mech = get_mechanism("kl-certified")
    mu = mech.public_guarantee(epsilon=1.0, delta=1e-6, options=mech.validate_options({}),
                               n_samples=150, n_classes=3, n_features=4).curve.mu
    E = 3.0
    D = GaussianCurve(mu * math.sqrt(10.5)).delta_at(E)
    svc.ledger.add_dataset(registration("ten", bundled="iris", budget_epsilon=E,
                                        budget_delta=D))
    tok = svc.token(datasets=("ten",))
    codes = [svc.post(tok, "ten", epsilon=1.0, delta=1e-6).status_code for _ in range(12)]
    assert codes == [201] * 10 + [409, 409]
    b = svc.get(tok, "/v1/datasets/ten/budget").json()
    assert b["releases"] == 10 and b["spent"]["accounting"] == "composed Gaussian curve"
    assert b["spent"]["fraction"] == pytest.approx(10 / 10.5, rel=1e-9)
    assert b["spent"]["sum_epsilon"] == pytest.approx(10.0)  # far above E: basic would refuse
    assert b["spent"]["delta_at_total_epsilon"] <= D


def test_dataset_description_lists_served_mechanisms_and_hides_n_and_paths(svc, tmp_path):
    svc.ledger.add_dataset(registration("csvdata", csv=str(_csv(tmp_path / "d.csv", n=126)),
                                        label_column="label", classes=["a", "b"],
                                        budget_epsilon=5, budget_delta=1e-5))
    tok = svc.token(datasets=("iris", "csvdata"))
    for name in ("iris", "csvdata"):
        d = svc.get(tok, f"/v1/datasets/{name}").json()
        names = [m["name"] for m in d["mechanisms"]]
        assert "kl-certified" in names and "kl-paper" not in names
        flat = json.dumps(d)
        assert "n_samples" not in flat and "source" not in flat and str(tmp_path) not in flat
        assert not _has_number(d, svc.ledger.dataset(name).n_samples)
    listing = svc.get(tok, "/v1/datasets").json()
    assert str(tmp_path) not in json.dumps(listing)


def _has_number(obj, value) -> bool:
    if isinstance(obj, dict):
        return any(_has_number(v, value) for v in obj.values())
    if isinstance(obj, list):
        return any(_has_number(v, value) for v in obj)
    return isinstance(obj, (int, float)) and not isinstance(obj, bool) and obj == value


def test_csv_dataset_releases_through_the_chunked_source(svc, tmp_path):
    svc.ledger.add_dataset(registration("csvdata", csv=str(_csv(tmp_path / "d.csv")),
                                        label_column="label", classes=["a", "b"],
                                        budget_epsilon=5, budget_delta=1e-5))
    tok = svc.token(datasets=("csvdata",))
    r = svc.post(tok, "csvdata", epsilon=2.0, delta=1e-6)
    assert r.status_code == 201, r.text
    rel = kr.Release.from_json(r.text, public_key=svc.key)
    assert rel.feature_names == ["f1", "f2"] and rel.privacy.certified
    assert rel.options.get("data") == "streamed in chunks"
    # refused before any charge: a mechanism that needs the data in memory, and one that
    # needs a public bound the dataset was registered without
    r = svc.post(tok, "csvdata", epsilon=1.0, delta=1e-6, mechanism="ppe-gaussian")
    assert r.status_code == 422 and "ppe-gaussian" in r.json()["detail"]
    r = svc.post(tok, "csvdata", epsilon=1.0, delta=1e-6, mechanism="gaussian-iid")
    assert r.status_code == 422 and "public bound" in r.json()["detail"]
    assert len(svc.ledger.charge_rows(svc.ledger.dataset("csvdata"))) == 1
    served = [m["name"] for m in svc.get(tok, "/v1/datasets/csvdata").json()["mechanisms"]]
    assert served == ["kl-certified", "randomized-response", "public-total"]


def test_a_mechanism_that_needs_the_data_in_memory_is_refused_before_any_charge(svc):
    """The service reads every dataset in chunks; rr-with-prior needs its rows in memory, so it
    is not listed and a request for it is a 422 that charges nothing."""
    tok = svc.token()
    served = [m["name"] for m in svc.get(tok, "/v1/datasets/iris").json()["mechanisms"]]
    assert "rr-with-prior" not in served and "randomized-response" in served
    r = svc.post(tok, epsilon=1.0, delta=1e-6, mechanism="rr-with-prior")
    assert r.status_code == 422 and "rr-with-prior" in r.json()["detail"]
    assert len(svc.ledger.charge_rows(svc.ledger.dataset("iris"))) == 0


def test_basic_composition_for_a_mechanism_without_a_public_curve(svc):
    """gaussian-iid gives no public_guarantee: it is charged its (epsilon, delta) and
    composed by basic composition, so the ledger's sums equal the budget exactly."""
    svc.ledger.add_dataset(registration("basic", bundled="iris", budget_epsilon=10.0,
                                        budget_delta=1e-5))
    tok = svc.token(datasets=("basic",))
    codes = [svc.post(tok, "basic", epsilon=1.0, delta=1e-6,
                      mechanism="gaussian-iid").status_code for _ in range(11)]
    assert codes == [201] * 10 + [409]
    b = svc.get(tok, "/v1/datasets/basic/budget").json()
    assert b["spent"]["accounting"] == "basic composition"
    assert b["spent"]["sum_epsilon"] == pytest.approx(10.0, rel=1e-12)
    assert b["spent"]["sum_delta"] == pytest.approx(1e-5, rel=1e-9)


# ----------------------------------------------------------------------- ledger invariants


def _raw(svc, sql, **params):
    with svc.ledger.engine.connect() as conn, conn.begin():
        return conn.execute(text(sql), params)


def test_audit_log_is_append_only_and_charges_cannot_be_undone(svc):
    tok = svc.token()
    assert svc.post(tok, epsilon=1.0, delta=1e-6, request_id="a").status_code == 201
    audit = svc.ledger.audit("iris")
    assert [a["action"] for a in audit if a["request_id"] == "a"] == ["charged", "released"]
    charged = next(a for a in audit if a["action"] == "charged")
    assert charged["actor"] == "alice" and charged["mechanism"] == "kl-certified"
    assert charged["epsilon"] == 1.0 and "statement" in json.loads(charged["guarantee"])
    for sql in ("UPDATE audit_log SET outcome = 'x'", "DELETE FROM audit_log",
                "DELETE FROM charges", "UPDATE charges SET epsilon = 0.001",
                "UPDATE charges SET state = 'charged'",
                "UPDATE charges SET state = 'lost'"):
        with pytest.raises(Exception, match="append-only|never deleted|settled once"):
            _raw(svc, sql)
    if svc.ledger.dialect == "postgresql":
        with pytest.raises(Exception, match="append-only"):
            _raw(svc, "TRUNCATE audit_log")
    assert len(svc.ledger.audit("iris")) == len(audit)
    (row,) = svc.ledger.charge_rows(svc.ledger.dataset("iris"))
    assert row["state"] == "released" and row["epsilon"] == 1.0
    assert not svc.ledger.settle(row["id"], "failed_after_charge")  # settled once


def test_tokens_are_stored_as_hashes_only(svc):
    import hashlib

    tok = svc.token()
    owner_tok = svc.token("owner", (), name="owner")
    assert svc.post(tok, epsilon=1.0, delta=1e-6).status_code == 201
    dump = []
    for table in ("tokens", "grants", "charges", "audit_log", "instances", "datasets"):
        dump += [json.dumps([str(v) for v in r]) for r in _raw(svc, f"SELECT * FROM {table}")]
    blob = "\n".join(dump)
    for t in (tok, owner_tok):
        assert t not in blob and t[4:] not in blob
        assert hashlib.sha256(t.encode()).hexdigest() in blob  # what is kept instead
    if svc.ledger.dialect == "sqlite":
        raw = b"".join(p.read_bytes() for p in svc.data_dir.glob("ledger.sqlite3*"))
        assert tok.encode() not in raw and owner_tok.encode() not in raw
    listed = svc.get(owner_tok, "/v1/tokens").json()["tokens"]
    assert {t["name"] for t in listed} == {"alice", "owner"} and tok not in json.dumps(listed)


def test_owner_endpoints_register_datasets_and_tokens(svc, tmp_path):
    owner = svc.token("owner", (), name="owner")
    h = {"Authorization": f"Bearer {owner}"}
    body = {"name": "api", "csv": str(_csv(tmp_path / "api.csv")), "label_column": "label",
            "classes": ["a", "b"], "budget_epsilon": 4.0, "budget_delta": 1e-5}
    r = svc.client.post("/v1/datasets", json=body, headers=h)
    assert r.status_code == 201 and r.json()["budget"]["total"]["epsilon"] == 4.0
    assert svc.client.post("/v1/datasets", json=body, headers=h).status_code == 422
    bad = {**body, "name": "api2", "classes": ["a"]}
    assert svc.client.post("/v1/datasets", json=bad, headers=h).status_code == 422
    r = svc.client.post("/v1/tokens", json={"role": "analyst", "name": "carol",
                                            "datasets": ["api"]}, headers=h)
    assert r.status_code == 201
    new = r.json()["token"]
    assert svc.post(new, "api", epsilon=1.0, delta=1e-6).status_code == 201
    assert svc.post(new, "iris", epsilon=1.0, delta=1e-6).status_code == 403
    audit = svc.get(owner, "/v1/audit?dataset=api").json()["audit"]
    assert [a["action"] for a in audit] == ["dataset_added", "charged", "released"]
    r = svc.client.post(f"/v1/tokens/{r.json()['id']}/revoke", headers=h)
    assert r.status_code == 200 and svc.get(new, "/v1/datasets").status_code == 401


def test_registration_refuses_what_the_proofs_need(tmp_path):
    path = str(_csv(tmp_path / "d.csv"))
    with pytest.raises(ValueError, match="--classes"):
        registration("x", csv=path, label_column="label", budget_epsilon=1, budget_delta=1e-5)
    with pytest.raises(ValueError, match="public bound"):
        registration("x", csv=path, label_column="label", classes=["a", "b"],
                     adjacency="replace-one", budget_epsilon=1, budget_delta=1e-5)
    with pytest.raises(ValueError, match="declared classes"):
        registration("x", csv=path, label_column="label", classes=["a", "c"],
                     budget_epsilon=1, budget_delta=1e-5)
    with pytest.raises(ValueError, match="name"):
        registration("bad name", bundled="iris", budget_epsilon=1, budget_delta=1e-5)
    with pytest.raises(ValueError, match="epsilon"):
        registration("x", bundled="iris", budget_epsilon=0, budget_delta=1e-5)
    reg = registration("x", csv=path, label_column="label", classes=["a", "b"],
                       adjacency="replace-one", bounds=(-10.0, 10.0), budget_epsilon=1,
                       budget_delta=1e-5)
    assert reg["n_samples"] == 120 and reg["n_features"] == 2
    assert reg["bound"]["lower"] == [-10.0, -10.0]


def test_replace_one_dataset_releases_with_its_registered_bound(svc, tmp_path):
    svc.ledger.add_dataset(registration(
        "boxed", csv=str(_csv(tmp_path / "d.csv")), label_column="label", classes=["a", "b"],
        adjacency="replace-one", bounds=(-6.0, 9.0), budget_epsilon=5, budget_delta=1e-5))
    tok = svc.token(datasets=("boxed",))
    r = svc.post(tok, "boxed", epsilon=2.0, delta=1e-6)
    assert r.status_code == 201, r.text
    rel = kr.Release.from_json(r.text, public_key=svc.key)
    assert rel.privacy.neighbouring.value == "replace-one" and rel.privacy.certified
    assert rel.options["frame"].startswith("the public bound")
    r = svc.post(tok, "boxed", epsilon=2.0, delta=1e-6, mechanism="ppe-gaussian")
    assert r.status_code == 422 and "in memory" in r.json()["detail"]
    svc.ledger.add_dataset(registration(
        "ball", csv=str(_csv(tmp_path / "e.csv")), label_column="label", classes=["a", "b"],
        adjacency="replace-one", norm_bound=10.0, budget_epsilon=5, budget_delta=1e-5))
    assert svc.ledger.dataset("ball").bound["kind"] == "ball"
    tok = svc.token(datasets=("ball",))
    r = svc.post(tok, "ball", epsilon=2.0, delta=1e-6)
    assert r.status_code == 201, r.text
    assert kr.Release.from_json(r.text, public_key=svc.key).privacy.certified


def test_lost_requests_of_dead_instances_only(svc):
    """The sweep marks lost the open charges of an instance whose lease expired or whose
    process is gone on this machine, never those of a live instance on another host."""
    led = svc.ledger
    ds = led.dataset("iris")
    principal = led.authenticate(svc.token())
    mech = get_mechanism("kl-certified")
    claim = mech.public_guarantee(epsilon=0.5, delta=1e-7, options=mech.validate_options({}),
                                  n_samples=150, n_classes=3, n_features=4)
    now = led.now()
    rows = {"remote-live": ("other-host", now), "remote-silent": ("other-host", now - 3600),
            "local-gone": (None, now)}
    from sqlalchemy import insert

    from klrelease.service.ledger import Instance, _boot_id, instances

    with led.engine.connect() as conn, conn.begin():
        for iid, (host, beat) in rows.items():
            import socket

            conn.execute(insert(instances).values(
                id=iid, host=host or socket.gethostname(), boot_id=_boot_id() or "b",
                pid=2 ** 22 + 17, pid_start="1", started_at=beat, heartbeat_at=beat))
    for iid in rows:
        out = led.charge(ds, principal, request_id=f"req-{iid}", mechanism="kl-certified",
                         options={}, claim=claim, instance=Instance(iid, "", "", 0, ""))
        assert out.kind == "charged"
    # charging renewed the three leases; age the silent one again
    with led.engine.connect() as conn, conn.begin():
        conn.execute(text("UPDATE instances SET heartbeat_at = :t WHERE id = 'remote-silent'"),
                     {"t": now - 3600})
    led.sweep(svc.app.state.service.instance)
    states = {r["request_id"]: r["state"] for r in led.charge_rows(ds)}
    assert states["req-remote-live"] == "charged"
    assert states["req-remote-silent"] == "lost"
    assert states["req-local-gone"] == ("lost" if _boot_id() else "charged")
    lost = [a for a in led.audit("iris") if a["action"] == "lost"]
    assert {a["request_id"] for a in lost} >= {"req-remote-silent"}
    # the budget still holds every charge (nothing is refunded)
    assert led.budget(ds).releases == 3


def test_parquet_dataset_read_by_the_workers_of_a_dask_cluster(tmp_path):
    """A dataset registered with --dask is counted and released by the cluster's workers."""
    distributed = pytest.importorskip("distributed")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rng = np.random.default_rng(5)
    folder = tmp_path / "parts"
    folder.mkdir()
    for i in range(3):
        X = rng.normal(size=(40, 2)) + 3 * (i % 2)
        pq.write_table(pa.table({"u": X[:, 0], "v": X[:, 1],
                                 "label": np.where(np.arange(40) % 2 == 0, "a", "b")}),
                       folder / f"part-{i}.parquet")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        app = create_app(ServiceConfig(tmp_path / "data"))
        with TestClient(app) as client:
            s = Svc(client, app, tmp_path / "data")
            reg = registration("dist", parquet=str(folder / "*.parquet"), label_column="label",
                               classes=["a", "b"], budget_epsilon=5, budget_delta=1e-5,
                               dask=cluster.scheduler_address)
            assert reg["n_samples"] == 120 and reg["source"]["dask"]
            s.ledger.add_dataset(reg)
            tok = s.token(datasets=("dist",))
            # at these (eps, N, K, d) the design rule picks randomized response; read by the
            # cluster's workers the plan takes the Gaussian design, and so does the claim
            # charged before the data is read (they differed: the release was refused)
            from klrelease.mechanisms.kl_certified.mechanism import choose_design

            assert choose_design(1.0, 1e-6, 120, 2, 2) == "response"
            r = s.post(tok, "dist", epsilon=1.0, delta=1e-6)
            assert r.status_code == 201, r.text
            rel = kr.Release.from_json(r.text, public_key=s.key)
            assert rel.feature_names == ["u", "v"] and rel.privacy.certified
            assert rel.options["design"] == "gaussian"
    with pytest.raises(ValueError, match="--parquet"):
        registration("x", bundled="iris", budget_epsilon=1, budget_delta=1e-5,
                     dask="tcp://127.0.0.1:1")


def test_token_checked_before_the_body_and_bodies_are_bounded(svc):
    r = svc.client.post("/v1/datasets/iris/releases", content=b"{not json",
                        headers={"Content-Type": "application/json"})
    assert r.status_code == 401  # not 422: nothing of the body is read without a token
    tok = svc.token()
    big = {"epsilon": 1, "delta": 1e-6, "options": {"x": "y" * (1 << 21)}}
    r = svc.post(tok, **big)
    assert r.status_code == 413 and r.json()["code"] == "too_large"
    assert svc.ledger.charge_rows(svc.ledger.dataset("iris")) == []


def test_an_unexpected_error_is_a_500_without_details(svc, monkeypatch, caplog):
    tok = svc.token()

    def broken(*a, **k):
        raise RuntimeError("secret detail /very/private/path")

    monkeypatch.setattr(svc.ledger, "releases", broken)
    with caplog.at_level("INFO", logger="klrelease.service"):
        r = svc.get(tok, "/v1/datasets/iris/releases")
    assert r.status_code == 500 and r.json() == {"detail": "internal error",
                                                 "code": "internal"}
    assert "RuntimeError" in caplog.text and "private" not in caplog.text
    assert "Traceback" not in caplog.text
    assert r.headers["content-security-policy"].startswith("default-src 'self'")


def test_one_signing_key_per_ledger(tmp_path):
    """A second data directory on the same ledger needs the first one's key."""
    import shutil

    from klrelease.service.app import Service
    from klrelease.service.signing import KEY_FILE

    first = Service(ServiceConfig(tmp_path / "a"))
    first.prepare()
    shared = f"sqlite:///{tmp_path / 'a' / 'ledger.sqlite3'}"
    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match=f"signed with key {first.signer.key_id}"):
        Service(ServiceConfig(tmp_path / "b", shared)).prepare()
    (tmp_path / "c").mkdir()
    shutil.copy(tmp_path / "a" / KEY_FILE, tmp_path / "c" / KEY_FILE)
    other = Service(ServiceConfig(tmp_path / "c", shared))
    other.prepare()
    assert other.signer.key_id == first.signer.key_id
    assert first.ledger.key_ids() == [first.signer.key_id]


def test_a_restricted_postgres_role_serves_and_cannot_rewrite_the_ledger(tmp_path,
                                                                         need_component):
    """After the first start (schema and triggers, by an owner role), the service runs as a
    role with SELECT, INSERT and UPDATE only, which cannot drop or disable the triggers,
    delete or truncate the audit log."""
    import os
    import uuid

    admin = os.environ.get("KLRELEASE_TEST_POSTGRES")
    if not admin:
        need_component("no PostgreSQL server: KLRELEASE_TEST_POSTGRES is not set")
    psycopg = pytest.importorskip("psycopg")
    from klrelease.service.ledger import Ledger, database_url

    tag = uuid.uuid4().hex[:10]
    db, role = f"klrelease_role_{tag}", f"klrelease_svc_{tag}"
    base = admin.rpartition("/")[0]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
    owner_url = f"{base}/{db}"
    try:
        first = Ledger(database_url(".", owner_url))
        first.create_schema()
        first.close()
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute(f'GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO "{role}"')
            conn.execute(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
        user = owner_url.partition("://")[2].partition("@")[0]
        svc_url = owner_url.replace(f"//{user}@", f"//{role}@")
        app = create_app(ServiceConfig(tmp_path / "data", svc_url))
        with TestClient(app) as client:
            s = Svc(client, app, tmp_path / "data")
            s.ledger.add_dataset(registration("iris", bundled="iris", budget_epsilon=3.0,
                                              budget_delta=1e-5))
            assert s.post(s.token(), epsilon=1.0, delta=1e-6).status_code == 201
        with psycopg.connect(svc_url, autocommit=True) as conn:
            for sql in ("DROP TRIGGER audit_log_append_only ON audit_log",
                        "ALTER TABLE audit_log DISABLE TRIGGER ALL", "DELETE FROM audit_log",
                        "TRUNCATE audit_log", "UPDATE audit_log SET outcome = NULL",
                        "ALTER TABLE charges DISABLE TRIGGER ALL", "DELETE FROM charges"):
                with pytest.raises(psycopg.Error):
                    conn.execute(sql)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_a_charge_whose_commit_answer_is_lost_is_not_left_open(svc, monkeypatch):
    """The charge committed but the database's answer was lost: the request answers 500, the
    charge is settled failed (not left open while the process lives), a retry is refused."""
    tok = svc.token()
    real = svc.ledger.charge

    def committed_then_lost(*a, **k):
        real(*a, **k)
        raise ConnectionError("the answer was lost")

    monkeypatch.setattr(svc.ledger, "charge", committed_then_lost)
    r = svc.post(tok, epsilon=1.0, delta=1e-6, request_id="ambiguous")
    assert r.status_code == 500 and r.json()["code"] == "internal"
    monkeypatch.setattr(svc.ledger, "charge", real)
    (row,) = svc.ledger.charge_rows(svc.ledger.dataset("iris"))
    assert row["state"] == "failed_after_charge"
    again = svc.post(tok, epsilon=1.0, delta=1e-6, request_id="ambiguous")
    assert again.status_code == 409 and again.json()["code"] == "request_failed"


def test_charges_read_as_sums_decide_like_the_accountant_on_every_charge():
    """The ledger reads a dataset's charges as sums (count, sum of eps, delta and mu^2): the
    accountant then accepts exactly what it accepts given every charge."""
    from klrelease.service.ledger import BudgetState

    rng = np.random.default_rng(7)
    agree = 0
    for trial in range(300):
        n = int(rng.integers(0, 12))
        gaussian = trial % 4 != 0
        eps = rng.uniform(0.05, 2.0, n + 1)
        dlt = 10 ** rng.uniform(-9, -5, n + 1)
        mus = rng.uniform(0.05, 0.6, n + 1)
        gs = [kr.Guarantee(float(e), float(d), "label-flip", True, "",
                           curve=GaussianCurve(float(m)) if gaussian else None)
              for e, d, m in zip(eps, dlt, mus, strict=True)]
        E, D = float(rng.uniform(0.5, 8.0)), float(10 ** rng.uniform(-7, -3))
        full = kr.BudgetAccountant(E, D)
        full.spent = gs[:n]
        state = BudgetState(E, D, "label-flip", n, float(eps[:n].sum()), float(dlt[:n].sum()),
                            float((mus[:n] ** 2).sum()) if gaussian else None)

        def verdict(acc, g=gs[n]):
            try:
                acc.check(g)
            except kr.BudgetExceeded:
                return False
            return True

        assert verdict(full) == verdict(state.accountant()), trial
        agree += verdict(full)
    assert 30 < agree < 270  # both verdicts occur


def test_a_plan_whose_claim_is_not_the_charged_one_is_refused_before_noise():
    """The release checks the plan's claim against the claim charged when it would spend
    (before any noise): a pure-DP charge does not cover a Gaussian plan, nor the reverse."""
    from klrelease.privacy.guarantee import BudgetExceeded
    from klrelease.service.releases import _Charged

    mech = get_mechanism("kl-certified")
    claims = {}
    for design in ("gaussian", "response"):
        opts = mech.validate_options({"adjacency": "label-flip", "design": design})
        claims[design] = mech.public_guarantee(epsilon=1.0, delta=1e-6, options=opts,
                                               n_samples=120, n_classes=2, n_features=2)
    assert type(claims["gaussian"].curve) is not type(claims["response"].curve)
    for charged, planned in (("gaussian", "response"), ("response", "gaussian")):
        with pytest.raises(BudgetExceeded, match="not the claim charged"):
            _Charged(claims[charged]).spend(claims[planned])
    _Charged(claims["gaussian"]).spend(claims["gaussian"])  # the same claim passes
