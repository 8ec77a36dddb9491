"""The owner's commands (klrelease service ...), the analyst's (klrelease remote ...), the
Python client, klrelease serve --demo, and klrelease inspect --verify against a running
service; and importing klrelease imports none of the service's dependencies."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

import klrelease as kr  # noqa: E402
from klrelease.cli import main  # noqa: E402


def _csv(path):
    import numpy as np

    rng = np.random.default_rng(3)
    X = rng.normal(size=(90, 2)) + np.repeat([[0, 0], [4, 1]], 45, axis=0)
    y = np.repeat(["a", "b"], 45)
    path.write_text("u,v,label\n" + "\n".join(f"{a:.6f},{b:.6f},{c}" for (a, b), c in
                                              zip(X, y, strict=True)) + "\n")
    return path


def test_importing_klrelease_imports_no_service_dependency():
    code = ("import sys, klrelease, klrelease.cli, klrelease.client, klrelease.service;"
            "heavy = [m for m in ('fastapi', 'starlette', 'uvicorn', 'sqlalchemy', 'psycopg',"
            " 'httpx', 'cryptography') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_owner_commands_register_list_and_issue_tokens(tmp_path, capsys):
    data = tmp_path / "svc"
    csv = _csv(tmp_path / "d.csv")
    args = ["service", "dataset", "add", "toy", "--data-dir", str(data), "--csv", str(csv),
            "--label-column", "label", "--budget-epsilon", "4", "--budget-delta", "1e-5"]
    assert main(args) == 2 and "--classes" in capsys.readouterr().err
    assert main([*args, "--classes", "a,c"]) == 2
    assert "declared classes" in capsys.readouterr().err
    assert main([*args, "--classes", "a,b", "--adjacency", "replace-one"]) == 2
    assert "public bound" in capsys.readouterr().err
    assert main([*args, "--classes", "a,b", "--adjacency", "replace-one", "--bounds",
                 "-5:9", "--max-epsilon-per-request", "2"]) == 0
    err = capsys.readouterr().err
    assert "registered toy: N=90 rows, 2 classes, d=2 features, replace-one" in err
    assert main([*args, "--classes", "a,b", "--bounds", "-5:9"]) == 2  # the name is taken
    assert "already registered" in capsys.readouterr().err
    assert main(["service", "token", "create", "--data-dir", str(data), "--role", "analyst",
                 "--dataset", "toy", "--name", "dana"]) == 0
    captured = capsys.readouterr()
    token = captured.out.strip()
    assert token.startswith("klr_") and len(token) == 47 and "\n" not in token
    assert "shown once" in captured.err and token not in captured.err
    assert main(["service", "token", "create", "--data-dir", str(data), "--role",
                 "analyst"]) == 2
    assert "at least one dataset" in capsys.readouterr().err
    assert main(["service", "token", "list", "--data-dir", str(data)]) == 0
    listing = capsys.readouterr().out
    assert "dana" in listing and token not in listing
    assert main(["service", "dataset", "list", "--data-dir", str(data)]) == 0
    assert "toy" in capsys.readouterr().out
    assert main(["service", "audit", "--data-dir", str(data), "--json"]) == 0
    actions = [json.loads(line)["action"] for line in capsys.readouterr().out.splitlines()]
    assert actions == ["dataset_added", "token_created"]
    assert main(["service", "token", "revoke", "1", "--data-dir", str(data)]) == 0
    assert main(["service", "token", "revoke", "1", "--data-dir", str(data)]) == 2
    assert main(["service", "dataset", "list", "--data-dir", str(tmp_path / "nowhere")]) == 2


def test_remote_commands_and_inspect_verify(tmp_path, capsys, monkeypatch, service_process):
    data = tmp_path / "svc"
    assert main(["service", "dataset", "add", "iris", "--data-dir", str(data), "--bundled",
                 "iris", "--budget-epsilon", "3", "--budget-delta", "1e-5"]) == 0
    assert main(["service", "token", "create", "--data-dir", str(data), "--role", "analyst",
                 "--dataset", "iris"]) == 0
    token = capsys.readouterr().out.strip()
    server = service_process(data)
    url = ["--url", server.url]
    out = tmp_path / "r.json"
    assert main(["remote", "release", "iris", "--epsilon", "1", "--delta", "1e-6", "--out",
                 str(out), *url]) == 2
    assert "KLRELEASE_TOKEN" in capsys.readouterr().err
    monkeypatch.setenv("KLRELEASE_TOKEN", token)
    assert main(["remote", "datasets", *url]) == 0
    assert "iris" in capsys.readouterr().out
    rel_args = ["remote", "release", "iris", "--epsilon", "1", "--delta", "1e-6",
                "--request-id", "cli-1", "--out", str(out), "--force", *url]
    assert main(rel_args) == 0
    err = capsys.readouterr().err
    assert "certified" in err and "signature checked" in err
    first = out.read_text()
    assert main(rel_args) == 0  # the same request id: the same artifact, not charged again
    capsys.readouterr()
    assert out.read_text() == first
    assert main(["remote", "budget", "iris", *url]) == 0
    assert json.loads(capsys.readouterr().out)["releases"] == 1
    assert main(["remote", "releases", "iris", *url]) == 0
    assert "cli-1" in capsys.readouterr().out
    # the budget refuses what it cannot pay, saying what fits
    assert main(["remote", "release", "iris", "--epsilon", "50", "--delta", "1e-6", "--out",
                 str(tmp_path / "big.json"), *url]) == 2
    assert "budget exceeded" in capsys.readouterr().err
    assert not (tmp_path / "big.json").exists()
    assert main(["remote", "release", "iris", "--epsilon", "1", "--delta", "1e-6",
                 "--option", "norm_bound=3", "--out", str(tmp_path / "x.json"), *url]) == 2
    assert "fixed by the dataset's registration" in capsys.readouterr().err

    # inspect --verify: with the service's URL, or a pinned key file
    assert main(["inspect", str(out), "--verify", "--key", server.url]) == 0
    shown = capsys.readouterr().out
    assert "signature: valid" in shown and "certified" in shown
    key = tmp_path / "service.pub"
    assert main(["remote", "key", "--out", str(key), *url[:0], "--url", server.url]) == 0
    assert key.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert main(["inspect", str(out), "--verify", "--key", str(key)]) == 0
    capsys.readouterr()
    doc = json.loads(first)
    doc["privacy"]["epsilon"] = 0.25
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    assert main(["inspect", str(edited), "--verify", "--key", str(key)]) == 2
    assert "modified after it was signed" in capsys.readouterr().err
    assert main(["inspect", str(out), "--verify"]) == 2
    assert "--key" in capsys.readouterr().err
    assert main(["remote", "artifact", "iris", "cli-1", "--out", str(tmp_path / "again.json"),
                 "--key", str(key), *url]) == 0
    assert json.loads((tmp_path / "again.json").read_text()) == json.loads(first)


def test_serve_demo_and_the_python_client(tmp_path, service_process):
    from klrelease.client import BudgetExceededError, Client, NotReleasedError, ServiceError

    server = service_process(tmp_path / "demo", args=["--demo", "iris"])
    token = server.out_path.read_text().splitlines()[0].strip()
    assert token.startswith("klr_")
    assert "registered the bundled dataset iris" in server.log()
    assert "made the signing key" in server.log()
    with Client(server.url, token) as c:
        assert token not in repr(c)
        assert [d["name"] for d in c.datasets()] == ["iris"]
        rel = c.release("iris", epsilon=1.0, delta=1e-6, request_id="py-1")
        assert isinstance(rel, kr.Release) and rel.privacy.certified
        assert rel.signature.key_id == httpx.get(server.url + "/v1/key").json()["key_id"]
        again = c.release("iris", epsilon=1.0, delta=1e-6, request_id="py-1")
        assert again.gmm.means.tolist() == rel.gmm.means.tolist()
        assert c.budget("iris")["releases"] == 1
        assert c.budget("iris")["total"] == {"epsilon": 10.0, "delta": 1e-5}
        assert c.releases("iris")[0]["who"] == "iris-analyst"
        assert c.artifact("iris", "py-1").to_json() == rel.to_json()
        with pytest.raises(BudgetExceededError) as info:
            c.release("iris", epsilon=50.0, delta=1e-6)
        assert info.value.status == 409 and info.value.body["largest_epsilon"] > 0
        with pytest.raises(ServiceError) as info:
            c.budget("nowhere")
        assert info.value.status == 403 and token not in str(info.value)

        # an answer lost in transit: the client sends the same request id again
        real = c._http
        sent = []

        def flaky(request):
            sent.append(json.loads(request.content)["request_id"])
            if len(sent) == 1:
                raise httpx.ConnectError("lost", request=request)
            return real.send(request)

        c._http = httpx.Client(base_url=c.url, headers=real.headers,
                               transport=httpx.MockTransport(flaky))
        c.release("iris", epsilon=0.5, delta=1e-6)
        assert len(sent) == 2 and sent[0] == sent[1]
        c._http = real
    # a pinned key that is not the service's refuses its artifacts
    from klrelease.service.signing import Signer

    other, _ = Signer.load_or_create(tmp_path)
    with Client(server.url, token, public_key=other.public_pem) as c, \
            pytest.raises(ValueError, match="signed by key"):
        c.artifact("iris", "py-1")
    # a charged request that did not release
    with Client(server.url, "klr_" + "B" * 43) as c, pytest.raises(ServiceError) as info:
        c.datasets()
    assert info.value.status == 401
    assert NotReleasedError.__mro__[1] is ServiceError
