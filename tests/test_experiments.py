"""The synthetic experiments: data generation, settings, every figure's quick mode, the CLI."""

import csv
import json
import math

import numpy as np
import pytest

import klrelease
from klrelease.cli import main
from klrelease.experiments import (
    EXPERIMENTS,
    SyntheticSetting,
    draw_synthetic,
    get_experiment,
    run_experiment,
)
from klrelease.experiments.runner import available_mechanisms, run_trial
from klrelease.experiments.summary import mean_ci

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- synthetic data


def test_synthetic_data_shapes_floor_and_reproducibility():
    s = SyntheticSetting(n_samples=300, n_classes=4, n_features=2)
    a = draw_synthetic(s, np.random.default_rng(7))
    b = draw_synthetic(s, np.random.default_rng(7))
    assert a.X.shape == (300, 2) and a.y.shape == (300,)
    assert np.array_equal(a.X, b.X) and np.array_equal(a.y, b.y)
    assert np.all(np.abs(a.means) <= 10)
    assert np.all(np.linalg.eigvalsh(a.covariances) > 0)
    assert abs(a.weights.sum() - 1) < 1e-12
    c = draw_synthetic(s, np.random.default_rng(8))
    assert not np.array_equal(a.X, c.X)


def test_every_class_gets_the_floor_even_with_tiny_weights():
    # K = 20 classes with Dirichlet(1) weights on N = 200 points: without the floor some
    # class would routinely get fewer than d + 2 points.
    s = SyntheticSetting(n_samples=200, n_classes=20, n_features=3)
    for seed in range(20):
        data = draw_synthetic(s, np.random.default_rng(seed))
        counts = np.bincount(data.y, minlength=20)
        assert counts.min() >= 5 and counts.sum() == 200


def test_synthetic_points_follow_their_component():
    s = SyntheticSetting(n_samples=20000, n_classes=2, n_features=2)
    data = draw_synthetic(s, np.random.default_rng(1))
    for k in range(2):
        Xk = data.X[data.y == k]
        se = np.sqrt(np.diag(data.covariances[k]) / len(Xk))
        assert np.all(np.abs(Xk.mean(axis=0) - data.means[k]) < 5 * se)


def test_setting_rejects_too_few_points():
    with pytest.raises(ValueError, match="n_samples"):
        SyntheticSetting(n_samples=20, n_classes=5, n_features=3)


# --------------------------------------------------------------------------- settings


def test_settings_are_the_papers():
    assert set(EXPERIMENTS) == {"fig1", "fig2", "fig3", "fig4", "fig5", "fig13"}
    for exp in EXPERIMENTS.values():
        s = exp.setting
        assert (s.n_samples, s.n_classes, s.n_features) == (1000, 5, 3)
        assert exp.delta == 1e-5 and exp.lam == 1e-3 and exp.seed == 42
        assert exp.trials == (200 if exp.name == "fig1" else 100)
    fig2 = get_experiment("fig2")
    assert len(fig2.values) == 10 and 1.0 in fig2.values
    assert {m.name for m in fig2.mechanisms} >= {
        "kl-paper", "laplace-iid", "gaussian-iid", "colored-gaussian", "r1smg"}
    assert get_experiment("fig13").record_level
    with pytest.raises(ValueError, match="unknown experiment"):
        get_experiment("fig99")


def test_quick_mode_is_small():
    for exp in EXPERIMENTS.values():
        q = exp.configured(quick=True)
        assert q.trials <= 3 and len(q.values) <= 3 and q.n_draws <= 3
        assert exp.configured(trials=7).trials == 7
    with pytest.raises(ValueError):
        get_experiment("fig1").configured(trials=0)


def test_mean_ci():
    m, lo, hi = mean_ci([1.0, 2.0, 3.0, 10.0])
    assert m == 4.0 and lo < m < hi
    m, lo, hi = mean_ci([5.0])
    assert m == 5.0 and math.isnan(lo) and math.isnan(hi)


# --------------------------------------------------------------------------- runs


def _read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("experiments")
    return out, {n: run_experiment(n, quick=True, out=out, progress=False) for n in EXPERIMENTS}


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_quick_run_writes_sane_outputs(quick_runs, name):
    out, runs = quick_runs
    res = runs[name]
    exp = res.experiment
    folder = out / name
    assert res.directory == folder
    rows = _read_csv(folder / f"{name}.csv")
    mechs, missing = available_mechanisms(exp)
    assert len(rows) == exp.trials * len(exp.values) * len(mechs)
    # only the PPE mechanism may return FAIL (its outcome at these sizes); nothing else fails
    assert all(r["status"] == "ok" or (r["status"] == "FAIL" and r["mechanism"] == "ppe-gaussian")
               for r in rows), [r["error"] for r in rows if r["error"]]
    kl = np.array([float(r["kl_mean"]) for r in rows if r["status"] == "ok"])
    assert np.all(np.isfinite(kl)) and np.all(kl > 0)
    assert (folder / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    meta = json.loads((folder / f"{name}.json").read_text())
    assert meta["command"].startswith(f"klrelease experiment {name} --quick")
    assert meta["wall_seconds"] > 0 and meta["versions"]["klrelease"] == klrelease.__version__
    assert meta["missing_mechanisms"] == missing
    assert meta["experiment"]["trials"] == exp.trials
    assert len(meta["summary"]) == len(exp.values) * len(mechs)
    # kl-paper reports its design objective (12) beside the exact KL
    paper = [r for r in rows if r["mechanism"].startswith("kl-paper")]
    assert paper and all(float(r["objective"]) > 0 for r in paper)
    # every mechanism's stated guarantee is recorded; kl-paper is not certified
    assert meta["guarantees"]["kl-paper"]["certified"] is False


def _mean_kl(rows, mechanism, x):
    return np.mean([float(r["kl_mean"]) for r in rows
                    if r["mechanism"] == mechanism and float(r["x"]) == x])


@pytest.mark.parametrize("name", ["fig1", "fig2"])
def test_kl_paper_kl_decreases_with_epsilon(quick_runs, name):
    out, runs = quick_runs
    rows = _read_csv(out / name / f"{name}.csv")
    xs = sorted({float(r["x"]) for r in rows})
    kl = [_mean_kl(rows, "kl-paper", x) for x in xs]
    assert kl[0] > kl[-1]


def test_record_level_run_uses_the_clipping_bound(quick_runs):
    out, _ = quick_runs
    rows = _read_csv(out / "fig13" / "fig13.csv")
    assert all(float(r["norm_bound"]) == float(r["x"]) for r in rows)
    assert all(float(r["kl_vs_raw_mean"]) > 0 for r in rows)
    meta = json.loads((out / "fig13" / "fig13.json").read_text())
    assert meta["guarantees"]["kl-paper"]["neighbouring"] == "change-one-record"


def test_broken_baseline_warning_is_recorded(quick_runs):
    if "r1smg" not in klrelease.list_mechanisms():
        pytest.skip("r1smg is not registered")
    out, _ = quick_runs
    meta = json.loads((out / "fig2" / "fig2.json").read_text())
    assert meta["guarantees"]["r1smg"]["certified"] is False
    assert sum(meta["warnings_recorded"]["r1smg"].values()) >= 1


def test_trials_are_reproducible_and_independent_of_workers(tmp_path):
    exp = get_experiment("fig2").configured(quick=True, trials=2)
    mechs, _ = available_mechanisms(exp)
    a = run_trial(exp, 1, mechs).rows
    b = run_trial(exp, 1, mechs).rows
    key = ("x", "kl_mean", "objective")
    assert [[r.get(k) for k in key] for r in a] == [[r.get(k) for k in key] for r in b]
    one = run_experiment("fig13", quick=True, trials=2, out=tmp_path / "a", progress=False)
    two = run_experiment("fig13", quick=True, trials=2, out=tmp_path / "b", jobs=2,
                         progress=False)
    assert [r["kl_mean"] for r in one.rows] == [r["kl_mean"] for r in two.rows]


def test_a_failing_mechanism_gives_error_rows_not_a_crash():
    from klrelease.experiments import MechanismSpec

    exp = get_experiment("fig2").configured(quick=True)
    bad = MechanismSpec("kl-paper", "bad", (("solver", "no-such-solver"),), key="bad")
    rows = run_trial(exp, 0, [bad]).rows
    assert len(rows) == len(exp.values)
    assert all(r["status"] == "error" and "no-such-solver" in r["error"] for r in rows)
    assert all("kl_mean" not in r for r in rows)


# --------------------------------------------------------------------------- CLI


def test_cli_experiment(tmp_path, capsys):
    assert main(["experiment", "fig1", "--quick", "--trials", "1", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "fig1" / "fig1.csv").exists()
    assert main(["experiment", "fig99", "--quick", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "error: unknown experiment 'fig99'" in err
    assert main(["experiment", "fig1", "--quick", "--trials", "0", "--out", str(tmp_path)]) == 2
    assert not (tmp_path / "fig99").exists()
