"""Every study has one home (klrelease/experiments/) and one command (klrelease experiment
NAME); experiments/ holds results."""

from pathlib import Path

from klrelease.cli import main
from klrelease.experiments.solver_study import run_solver_study

ROOT = Path(__file__).resolve().parents[1]

#: Scripts that stay beside their results, and why.
SCRIPTS_ELSEWHERE = {
    # needs diffprivlib and scikit-learn < 1.7 in an environment of its own
    "experiments/certified/diffprivlib_compare.py",
}


def test_experiments_holds_results_not_code():
    scripts = {str(p.relative_to(ROOT)) for p in (ROOT / "experiments").rglob("*.py")}
    assert scripts <= SCRIPTS_ELSEWHERE


def test_the_solver_study_runs_from_the_command_line_module(tmp_path):
    lines = []
    folder = run_solver_study(tmp_path, grid=([100], [2]), time_limit=20.0, log=lines.append)
    assert folder == tmp_path / "solver_study"
    assert {p.name for p in folder.iterdir()} == {"results.csv", "results.md", "results.png"}
    md = (folder / "results.md").read_text()
    assert "klrelease experiment solver-study --time-limit 20" in md
    native = [ln for ln in lines if " native " in ln]
    assert len(native) == 2 and all("optimal" in ln for ln in native)


def test_study_options_go_with_their_study(tmp_path, capsys):
    assert main(["experiment", "fig2", "--time-limit", "3", "--out", str(tmp_path)]) == 2
    assert "--time-limit goes with solver-study" in capsys.readouterr().err
    assert not (tmp_path / "fig2").exists()


def test_the_certified_study_runs_from_its_command(tmp_path, capsys):
    assert main(["experiment", "certified", "--quick", "--draws", "2", "--out",
                 str(tmp_path)]) == 0
    folder = tmp_path / "certified"
    assert {p.name for p in folder.iterdir()} == {"results.csv", "results.md"}
    rows = (folder / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 2 * 4  # two datasets, two eps, four mechanisms
    text = (folder / "results.md").read_text()
    assert f"klrelease experiment certified --quick --draws 2 --out {tmp_path}" in text
    assert "## Checks" in text
