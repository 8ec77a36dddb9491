"""Learner outputs are artifacts like releases: ``klrelease inspect``, ``sample`` and ``plot``
read them; ``klrelease learners NAME`` describes a learner; a former name warns."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from klrelease.artifact import (
    FailDocument,
    LearnerRelease,
    learner_document,
    load_model,
    read_document,
)
from klrelease.cli import main
from klrelease.learners import learn, learners


def _rows(tmp_path, n=4000):
    rng = np.random.default_rng(60)
    X = np.concatenate([rng.normal(size=(n // 2, 2)), rng.normal(size=(n // 2, 2)) + [20, 5]])
    path = tmp_path / "rows.csv"
    np.savetxt(path, X, delimiter=",", header="height,weight", comments="")
    return X, path


def test_a_learned_model_is_an_artifact_with_schema_names_options_seed(tmp_path):
    X, _ = _rows(tmp_path)
    res = learn(X, 2, epsilon=1.0, delta=1e-6, learner="dp-em", seed=4, R=25.0,
                sigma_max=2.0, feature_names=["height", "weight"])
    doc = json.loads(res.to_json())
    for key in ("schema_version", "library_version", "python_version", "learner", "gmm",
                "feature_names", "privacy", "options", "diagnostics", "randomness"):
        assert key in doc
    assert doc["feature_names"] == ["height", "weight"]
    assert doc["options"] == {"R": 25.0, "sigma_max": 2.0, "sigma_min": None,
                              "iterations": None}
    assert doc["randomness"]["seed"] == 4 and doc["randomness"]["secure"] is False
    path = tmp_path / "a.json"
    path.write_text(res.to_json())
    back = load_model(path)
    assert isinstance(back, LearnerRelease) and back.learner == "dp-em"
    # validated when written, the same when read
    assert learner_document(res).model_dump_json() == back.model_dump_json()
    np.testing.assert_allclose(back.gmm.means, res.gmm.means)
    # pandas columns are the feature names when none are given
    pd = pytest.importorskip("pandas")
    res2 = learn(pd.DataFrame(X, columns=["a", "b"]), 2, epsilon=1.0, delta=1e-6,
                 learner="dp-em", seed=4, R=25.0, sigma_max=2.0)
    assert res2.feature_names == ("a", "b")
    with pytest.raises(ValueError, match="feature_names has 3 names"):
        learn(X, 2, epsilon=1.0, delta=1e-6, learner="dp-em", R=25.0, sigma_max=2.0,
              feature_names=["a", "b", "c"])


def test_inspect_sample_and_plot_read_a_learned_model(tmp_path, capsys):
    _, path = _rows(tmp_path)
    out = tmp_path / "l.json"
    assert main(["learn", "--csv", str(path), "--components", "2", "--epsilon", "1",
                 "--delta", "1e-6", "--learner", "dp-em", "--param", "R=25",
                 "--param", "sigma_max=2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "dp-em learner artifact" in shown and "schema 2.0" in shown
    assert "replace-one, certified" in shown and "features: height, weight" in shown
    assert main(["sample", str(out), "-n", "7", "--out", str(tmp_path / "s.csv")]) == 0
    lines = (tmp_path / "s.csv").read_text().splitlines()
    assert lines[0] == "height,weight,label" and len(lines) == 8
    assert main(["plot", str(out), "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 0
    # a FAIL document has no model to sample
    fail = tmp_path / "f.json"
    assert main(["learn", "--csv", str(path), "--components", "1", "--epsilon", "1",
                 "--delta", "1e-6", "--learner", "ppe-gaussian-oneshot", "--out",
                 str(fail)]) == 3
    assert isinstance(read_document(fail), FailDocument)
    capsys.readouterr()
    assert main(["sample", str(fail), "--out", str(tmp_path / "x.csv")]) == 2
    assert "FAIL document" in capsys.readouterr().err


def test_a_learner_claim_is_recomputed_not_trusted(tmp_path):
    X, _ = _rows(tmp_path)
    doc = json.loads(learn(X, 2, epsilon=1.0, delta=1e-6, learner="dp-em", R=25.0,
                           sigma_max=2.0).to_json())
    LearnerRelease.model_validate(doc)  # as written: certified, unseeded
    edits = [("privacy", "epsilon", 0.1), ("privacy", "delta", 1e-12),
             ("privacy", "neighbouring", "label-flip"),
             ("randomness", "secure", False), ("learner", None, "no-such-learner")]
    for block, key, value in edits:
        bad = json.loads(json.dumps(doc))
        if key is None:
            bad[block] = value
        else:
            bad[block][key] = value
        with pytest.raises(ValueError):
            LearnerRelease.model_validate(bad)
    seeded = json.loads(learn(X, 2, epsilon=1.0, delta=1e-6, learner="dp-em", seed=1,
                              R=25.0, sigma_max=2.0).to_json())
    seeded["privacy"]["certified"] = True
    with pytest.raises(ValueError, match="tampered"):
        LearnerRelease.model_validate(seeded)


def test_documents_written_before_the_schema_still_load(tmp_path):
    """A learner output of the former format (no schema, library version or names)."""
    legacy = {
        "learner": "kamath-pgme", "status": "ok", "stage": None, "reason": "",
        "privacy": {"epsilon": 1.0, "delta": 1e-6, "neighbouring": "replace-one",
                    "certified": True, "statement": "s", "reasons": [], "accounting": "a",
                    "accountant": "basic"},
        "diagnostics": {"ledger": {"requested": {"epsilon": 1.0, "delta": 1e-6},
                                   "worst_path_total": {"epsilon": 1.0, "delta": 1e-6}}},
        "randomness": {"secure": True},
        "gmm": {"weights": [0.5, 0.5], "means": [[0.0], [5.0]],
                "covariances": [[[1.0]], [[1.0]]]},
    }
    path = tmp_path / "old.json"
    path.write_text(json.dumps(legacy))
    doc = load_model(path)
    assert doc.schema_version is None and doc.gmm.n_components == 2
    fail = {**{k: v for k, v in legacy.items() if k != "gmm"}, "status": "FAIL",
            "stage": "partition", "reason": "r"}
    path.write_text(json.dumps(fail))
    assert isinstance(read_document(path), FailDocument)


def test_learners_name_describes_the_options(capsys):
    assert main(["learners", "dp-em"]) == 0
    shown = capsys.readouterr().out
    for word in ("R", "sigma_max", "sigma_min", "iterations", "required", "replace-one",
                 "DPEM.md"):
        assert word in shown
    assert main(["learners"]) == 0
    listed = capsys.readouterr().out
    assert "dp-em" in listed and "kamath-pgme-lite" in listed
    assert main(["learners", "nope"]) == 2


def test_every_option_of_every_learner_has_a_meaning():
    from klrelease.learners.result import describe_learner

    for name in learners():
        rows = describe_learner(name)["options"]
        assert all(meaning for _, _, _, meaning in rows), name


def test_the_former_pgme_name_warns_and_runs_the_renamed_learner():
    X = np.zeros((100, 2))
    with pytest.warns(FutureWarning, match="'kamath-pgme' is now 'kamath-pgme-lite'"):
        res = learn(X, 2, epsilon=1.0, delta=1e-6, learner="kamath-pgme", seed=0, R=10.0,
                    sigma_min=0.1, sigma_max=3.0)
    assert res.learner == "kamath-pgme-lite"
    assert "kamath-pgme" not in learners()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        learn(X, 2, epsilon=1.0, delta=1e-6, learner="kamath-pgme-lite", seed=0, R=10.0,
              sigma_min=0.1, sigma_max=3.0)
