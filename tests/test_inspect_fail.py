"""``klrelease inspect`` reads a FAIL document: privacy block, stage and public reason."""

from __future__ import annotations

import json

import numpy as np

from klrelease.cli import main


def test_inspect_a_release_fail_document(tmp_path, capsys):
    out = tmp_path / "fail.json"
    code = main(["release", "--dataset", "iris", "--epsilon", "1", "--delta", "1e-5",
                 "--mechanism", "ppe-gaussian", "--option", "adjacency=replace-one",
                 "--out", str(out)])
    assert code == 3
    doc = json.loads(out.read_text())
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "FAIL from mechanism ppe-gaussian" in shown
    assert f"stage: {doc['stage']}" in shown and doc["reason"][:40] in shown
    assert "epsilon=1, delta=1e-05, neighbours: replace-one, certified" in shown
    assert doc["privacy"]["statement"][:40] in shown
    # the claim is recomputed, not trusted: a seeded document claiming a guarantee is refused
    doc["randomness"] = {"secure": False, "seed": 3, "note": ""}
    (tmp_path / "edited.json").write_text(json.dumps(doc))
    assert main(["inspect", str(tmp_path / "edited.json")]) == 2
    assert "tampered" in capsys.readouterr().err
    doc["randomness"] = {"secure": True, "seed": None, "note": ""}
    doc["extra"] = 1
    (tmp_path / "extra.json").write_text(json.dumps(doc))
    assert main(["inspect", str(tmp_path / "extra.json")]) == 2


def test_inspect_a_learn_fail_document(tmp_path, capsys):
    rng = np.random.default_rng(15)
    path = tmp_path / "u.csv"
    np.savetxt(path, rng.normal(size=(3000, 2)), delimiter=",", header="a,b", comments="")
    out = tmp_path / "r.json"
    assert main(["learn", "--csv", str(path), "--components", "1", "--epsilon", "1",
                 "--delta", "1e-6", "--out", str(out), "--seed", "0",
                 "--learner", "ppe-gaussian-oneshot"]) == 3
    doc = json.loads(out.read_text())
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "FAIL from learner ppe-gaussian-oneshot" in shown
    assert "stage: preflight" in shown and doc["reason"][:40] in shown
    assert "NOT certified" in shown and "randomness: seeded" in shown
    doc["privacy"]["certified"] = True  # a seeded run never carries a guarantee
    out.write_text(json.dumps(doc))
    assert main(["inspect", str(out)]) == 2
    assert "tampered" in capsys.readouterr().err
