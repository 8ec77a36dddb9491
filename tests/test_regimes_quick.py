"""The quick modes of the learner studies, through the CLI: files, rows and their statuses."""

from __future__ import annotations

import csv
import json

from klrelease.cli import main


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_learners_regimes_quick(tmp_path):
    assert main(["experiment", "learners-regimes", "--quick", "--out", str(tmp_path)]) == 0
    folder = tmp_path / "learners_regimes"
    rows = _rows(folder / "learners_regimes.csv")
    info = json.loads((folder / "learners_regimes.json").read_text())
    assert (folder / "learners_regimes.png").stat().st_size > 0
    learners = {"dp-em", "park-dp-em", "kamath-pgme-lite", "kamath-sa-lite",
                "afzali-style-sample-aggregate"}
    unlabelled = [r for r in rows if r["kind"] == "unlabelled learner"]
    assert {r["learner"] for r in unlabelled} == learners
    assert len(unlabelled) == 5 * info["cells"]
    # dp-em never FAILs; the non-private k-means++ start is a row of the overlapping cell
    assert all(r["status"] == "ok" for r in unlabelled if r["learner"] == "dp-em")
    start = [r for r in rows if r["kind"] == "non-private"]
    assert len(start) == 1 and start[0]["setting"] == "overlapping" and start[0]["kl"]
    assert "Targets" in (folder / "learners_regimes_tables.md").read_text()
    for r in unlabelled:
        assert r["status"] in ("ok", "FAIL")
        assert (r["stage"] != "") == (r["status"] == "FAIL")  # a FAIL names its stage
        assert (r["mean_error_sigma"] != "") == (r["status"] == "ok")
    # a model released on the separated mixture is compared with the labelled mechanisms
    if any(r["status"] == "ok" for r in unlabelled):
        assert any(r["kind"] == "labelled mechanism" for r in rows)
    assert info["command"] == "klrelease experiment learners-regimes --quick"
    assert info["seeded"] is True and info["certified"] is False
    assert {s["learner"] for s in info["summary"]} == learners


def test_ppe_regimes_quick(tmp_path):
    assert main(["experiment", "ppe-regimes", "--quick", "--out", str(tmp_path)]) == 0
    folder = tmp_path / "ppe_regimes"
    info = json.loads((folder / "ppe_regimes.json").read_text())
    assert (folder / "ppe_regimes.png").stat().st_size > 0
    assert info["quick"] is True and "UTILITY SIMULATION" in info["label"]
    assert info["all_within_tolerance"] is True
    for s in info["summary"]:
        rates = s["pass_rate"]
        assert rates[0] == 0.0 and rates[-1] == 1.0  # FAIL at 1e5, PASS at 1e12
        ratio = s["observed_over_predicted"]
        assert 0.1 <= ratio <= 10.0
    sim = _rows(folder / "ppe_regimes.csv")
    assert all(r["status"] == "PASS" or r["status"].startswith("FAIL") for r in sim)
    real = _rows(folder / "ppe_regimes_real.csv")
    assert [r["status"] for r in real] == ["FAIL"] * len(real)
    assert {r["stage"] for r in real} <= {"configuration", "preflight", "popularity test"}
    assert all(r["reason"] for r in real)


def test_information_limit_quick(tmp_path):
    """The cost of the missing labels: non-private EM on the grid's own data, from two starts,
    beside the grid's figures read from its JSON (one written here, with known figures)."""
    import math

    import pytest

    from klrelease.experiments.learners_regimes import LABELLED_FACTOR, run_information_limit

    with pytest.raises(FileNotFoundError, match="learners-regimes"):
        run_information_limit(tmp_path, quick=True, progress=False)
    folder = tmp_path / "learners_regimes"
    folder.mkdir()
    # eps 1: kl-certified far above EM (EM within the factor), dp-em within it; eps 4: EM
    # misses it, dp-em too; a later trial of the same cells is not read
    detail = [{"setting": "overlapping", "k": 2, "d": 2, "epsilon": 1.0, "n": 100000,
               "dp_em_kl": 2.0, "kl_certified_kl": 1.0},
              {"setting": "overlapping", "k": 2, "d": 2, "epsilon": 4.0, "n": 100000,
               "dp_em_kl": 2e-3, "kl_certified_kl": 1e-5},
              {"setting": "overlapping", "k": 2, "d": 2, "epsilon": 4.0, "n": 100000,
               "trial": 1, "dp_em_kl": 9.0, "kl_certified_kl": 9.0}]
    (folder / "learners_regimes.json").write_text(json.dumps(
        {"targets": {"within_3x_of_kl_certified_n_ge_1e5": {"detail": detail}}}))
    assert main(["experiment", "information-limit", "--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((folder / "information_limit.json").read_text())["rows"]
    assert [(r["k"], r["d"], r["epsilon"], r["n"]) for r in rows] == [
        (2, 2, 1.0, 100000), (2, 2, 4.0, 100000)]
    assert [(r["kl_certified_kl"], r["dp_em_kl"]) for r in rows] == [(1.0, 2.0), (1e-5, 2e-3)]
    assert [r["em_misses"] for r in rows] == [False, True]
    for r in rows:
        assert r["em_from_truth_converged"] and r["em_from_labelled_fit_converged"]
        # both starts reach the same maximum of the likelihood, a positive distance from
        # the labelled fit; the column keeps the start of higher likelihood
        a, b = r["em_from_truth_kl"], r["em_from_labelled_fit_kl"]
        assert 0 < a < 0.1 and math.isclose(a, b, rel_tol=0.05)
        assert r["loglik_gap"] < 1e-6
        lt, lf = r["em_from_truth_loglik"], r["em_from_labelled_fit_loglik"]
        assert r["em_kl"] == (a if lt >= lf else b)
        assert math.isclose(r["em_over_kl_certified"], r["em_kl"] / r["kl_certified_kl"])
        assert r["em_misses"] == (r["em_kl"] > LABELLED_FACTOR * r["kl_certified_kl"])
    text = (folder / "information_limit.md").read_text()
    assert "on 1 of 2 cells" in text and "| EM from truth |" in text
    assert "dp-em is within 3x on 1 of 2: on 0 of the 1 that EM misses" in text
    assert "and on 1 of the other 1." in text
