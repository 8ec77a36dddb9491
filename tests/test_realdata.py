"""Real data and using a release: loaders, the GMM classifier and sampler, plots, figures 6-12."""

import csv
import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import klrelease as kr
from klrelease.cli import main
from klrelease.data import load_italy_power, read_ts
from klrelease.experiments import real
from klrelease.experiments.realdata import (
    MNIST_ENV,
    TABLE1_SIZES,
    DataUnavailable,
    iris_standardised,
    load_mnist_test,
    mnist_folder,
    mnist_split,
    table1_synthetic,
)
from klrelease.experiments.settings import MechanismSpec
from klrelease.plot import marginals

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parents[1]
HAVE_MNIST = all((mnist_folder() / f).is_file() for f in (
    "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"))
needs_mnist = pytest.mark.skipif(not HAVE_MNIST, reason=f"MNIST files absent ({mnist_folder()})")


def md5(path) -> str:
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


# --------------------------------------------------------------------------- loaders


def test_italy_power_files_and_loader():
    assert md5(ROOT / "data" / "ItalyPowerDemand_TRAIN.ts") == "5b8ff57b23e07dfa4913ac19e402db52"
    assert md5(ROOT / "data" / "ItalyPowerDemand_TEST.ts") == "5b922219fc85af1fa441fde521f7a25d"
    s_tr, l_tr = read_ts(ROOT / "data" / "ItalyPowerDemand_TRAIN.ts")
    s_te, l_te = read_ts(ROOT / "data" / "ItalyPowerDemand_TEST.ts")
    assert s_tr.shape == (67, 24) and s_te.shape == (1029, 24)
    # z-normalised per day, as the archive states
    assert np.allclose(s_te.mean(axis=1), 0, atol=1e-6)
    d = kr.load_dataset("italy-power")
    assert isinstance(d, kr.LabelledData)
    assert d.X.shape == (1096, 12) and d.classes == (1, 2, 3, 4, 5, 6)
    assert d.feature_names[0] == "h08" and d.feature_names[-1] == "h19"
    assert np.array_equal(d.X[:67], s_tr[:, 8:20])
    counts = np.bincount(d.codes, minlength=6)
    assert counts.sum() == 1096 and np.all(np.diff(counts) <= 0)  # numbered by size
    season = load_italy_power(labels="season")
    assert season.classes == (1, 2) and np.bincount(season.codes).sum() == 1096
    assert load_italy_power(window=(0, 12)).n_features == 12


def test_italy_power_bad_arguments_and_bad_ts(tmp_path):
    with pytest.raises(ValueError, match="window"):
        load_italy_power(window=(20, 8))
    with pytest.raises(ValueError, match="labels"):
        load_italy_power(labels="month")
    bad = tmp_path / "bad.ts"
    bad.write_text("@data\n1,2,3\n")
    with pytest.raises(ValueError, match="label"):
        read_ts(bad)


def test_bundled_datasets_declare_their_classes():
    assert kr.load_dataset("iris").classes == ("setosa", "versicolor", "virginica")
    iris = iris_standardised()
    assert np.allclose(iris.X.mean(axis=0), 0) and np.allclose(iris.X.std(axis=0), 1)


def test_table1_synthetic_has_the_paper_class_sizes():
    d = table1_synthetic(np.random.default_rng(3))
    assert d.X.shape == (1409, 12)
    assert tuple(np.bincount(d.codes)) == TABLE1_SIZES


@needs_mnist
def test_mnist_files_counts_and_split():
    folder = mnist_folder()
    assert md5(folder / "t10k-images-idx3-ubyte.gz") == "9fb629c4189551a2d022fa330f9573f3"
    assert md5(folder / "t10k-labels-idx1-ubyte.gz") == "ec29112dd5afa0611ce80d1b7f02629c"
    images, labels = load_mnist_test()
    assert images.shape == (10000, 784) and images.dtype == np.uint8
    assert tuple(np.bincount(labels)) == (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974,
                                          1009)
    sp = mnist_split(seed=42)  # the split of figures 10-12 (cached for them)
    assert sp.train.X.shape == (5000, 5) and sp.X_test.shape == (5000, 5)
    assert mnist_split(seed=42) is sp
    assert np.bincount(sp.train.codes).sum() + np.bincount(sp.y_test).sum() == 10000


def test_missing_mnist_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(MNIST_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(DataUnavailable, match="nowhere"):
        load_mnist_test()
    rc = main(["experiment", "fig10", "--quick", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("error: MNIST data not found") and "nowhere" in err
    assert "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- classifier


def test_predict_matches_sklearn_on_the_exported_model():
    iris = kr.load_dataset("iris")
    y = np.asarray(iris.classes)[iris.codes]
    rel = kr.release(iris.X, y, epsilon=5.0, delta=1e-5, mechanism="kl-paper", seed=3,
                     classes=iris.classes)
    rng = np.random.default_rng(0)
    X = np.vstack([iris.X, rng.uniform(iris.X.min(0) - 1, iris.X.max(0) + 1, (500, 4))])
    for g in (kr.fit_gmm(iris.X, y), rel.gmm):
        sk = g.to_sklearn()
        assert np.array_equal(g.predict(X), np.asarray(g.classes)[sk.predict(X)])
        assert np.allclose(g.predict_proba(X), sk.predict_proba(X), atol=1e-10)
        assert np.allclose(g.predict_proba(X).sum(axis=1), 1)
    assert np.mean(kr.fit_gmm(iris.X, y).predict(iris.X) == y) > 0.95
    with pytest.raises(ValueError, match="shape"):
        rel.gmm.predict(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="NaN"):
        rel.gmm.predict(np.full((1, 4), np.nan))


@needs_mnist
def test_non_private_mnist_accuracy_matches_an_independent_qda():
    from sklearn.discriminant_analysis import QuadraticDiscriminantAnalysis

    sp = mnist_split(seed=42)  # the split of figures 10-12
    g = kr.fit_gmm(sp.train.X, sp.train.codes, classes=tuple(range(10)))
    qda = QuadraticDiscriminantAnalysis(store_covariance=True).fit(sp.train.X, sp.train.codes)
    ours, theirs = g.predict(sp.X_test), qda.predict(sp.X_test)
    assert np.mean(ours == theirs) > 0.999
    assert 0.6 < np.mean(ours == sp.y_test) < 0.9


# --------------------------------------------------------------------------- sampler


def test_class_conditional_sampler_keeps_the_histogram_exactly():
    g = kr.GMM(np.array([0.5, 0.3, 0.2]), np.zeros((3, 2)), np.stack([np.eye(2)] * 3),
               ("a", "b", "c"))
    X, y = g.sample(10, 1, per_class=[7, 0, 3])
    assert X.shape == (10, 2)
    assert [int(np.sum(y == c)) for c in "abc"] == [7, 0, 3]
    X, y = g.sample(4, 1, per_class={"c": 4})
    assert set(y) == {"c"}
    for n in (0, 1, 7, 1001):
        _, y = g.sample(n, 2, per_class="weights")
        counts = np.array([np.sum(y == c) for c in "abc"])
        assert counts.sum() == n and np.all(np.abs(counts - n * g.weights) < 1)
    assert list(g.class_counts(7)) == [4, 2, 1]
    _, y1 = g.sample(50, 5, per_class="weights")
    _, y2 = g.sample(50, 6, per_class="weights")
    assert not np.array_equal(y1, y2)  # rows come in random order
    for bad, msg in (([1, 2], "one count"), ([5, 5, 1], "sum"), ([-1, 5, 6], "non-negative"),
                     ({"z": 10}, "not a class"), ("uniform", "per_class")):
        with pytest.raises(ValueError, match=msg):
            g.sample(10, per_class=bad)


# --------------------------------------------------------------------------- plots


@pytest.fixture
def artifact(tmp_path):
    iris = kr.load_dataset("iris")
    y = np.asarray(iris.classes)[iris.codes]
    rel = kr.release(iris, None, epsilon=2.0, delta=1e-5, mechanism="kl-paper", seed=1,
                     classes=iris.classes)
    assert rel.feature_names == list(iris.feature_names)
    path = tmp_path / "release.json"
    path.write_text(rel.to_json())
    data = tmp_path / "iris.csv"
    with data.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*iris.feature_names, "species"])
        for x, lab in zip(iris.X, y, strict=True):
            w.writerow([*x, lab])
    return path, data, rel, iris


def test_marginals_from_python(artifact, tmp_path):
    path, _, rel, iris = artifact
    out = tmp_path / "m.png"
    ref = kr.fit_gmm(iris.X, np.asarray(iris.classes)[iris.codes])
    fig = marginals({"a": rel, "b": rel.gmm}, iris, reference=ref,
                    features=["petal_length", 0], out=out)
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert len(fig.axes) == 2 * 3
    with pytest.raises(ValueError, match="feature"):
        marginals(rel, features=["nope"])
    with pytest.raises(ValueError, match="not a class"):
        marginals(rel, classes=["rose"])


def test_plot_command_writes_a_png(artifact, tmp_path):
    path, data, _, _ = artifact
    out = tmp_path / "fig.png"
    assert main(["plot", str(path), "--data", str(data), "--label-column", "species",
                 "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    generic = tmp_path / "generic.json"  # a release of bare arrays: features x0..x3
    text = path.read_text()
    for j, name in enumerate(("sepal_length", "sepal_width", "petal_length", "petal_width")):
        text = text.replace(f'"{name}"', f'"x{j}"')
    generic.write_text(text)
    assert main(["plot", str(generic), "--data", str(data), "--label-column", "species",
                 "--out", str(tmp_path / "generic.png")]) == 0
    out2 = tmp_path / "alone.png"
    assert main(["plot", str(path), "--features", "sepal_width", "--out", str(out2)]) == 0
    assert out2.read_bytes()[:8] == PNG_MAGIC


def test_plot_command_refuses_bad_input(artifact, tmp_path, capsys):
    path, data, _, _ = artifact
    other = tmp_path / "other.csv"
    other.write_text("a,b,species\n1,2,setosa\n")
    unknown = tmp_path / "unknown.csv"
    text = data.read_text().splitlines()
    unknown.write_text("\n".join([*text[:3], text[3].rsplit(",", 1)[0] + ",rose"]) + "\n")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{")
    cases = [
        [str(path), "--out", str(tmp_path / "f.jpg")],
        [str(tmp_path / "missing.json"), "--out", str(tmp_path / "f.png")],
        [str(bad_json), "--out", str(tmp_path / "f.png")],
        [str(path), "--data", str(data), "--out", str(tmp_path / "f.png")],
        [str(path), "--data", str(other), "--label-column", "species", "--out",
         str(tmp_path / "f.png")],
        [str(path), "--data", str(unknown), "--label-column", "species", "--out",
         str(tmp_path / "f.png")],
        [str(path), "--features", "x9", "--out", str(tmp_path / "f.png")],
        [str(path), "--out", str(tmp_path / "no" / "f.png")],
    ]
    for args in cases:
        rc = main(["plot", *args])
        err = capsys.readouterr().err.strip()
        assert rc == 2, args
        assert err.startswith("error: ") and "\n" not in err, (args, err)
    assert not (tmp_path / "f.png").exists()


# --------------------------------------------------------------------------- experiments


def _check_outputs(res, name):
    assert res.png_path.read_bytes()[:8] == PNG_MAGIC
    meta = json.loads(res.json_path.read_text())
    assert meta["command"].startswith(f"klrelease experiment {name} --quick")
    assert meta["versions"]["klrelease"] == kr.__version__ and meta["wall_seconds"] > 0
    with res.csv_path.open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(res.rows) > 0
    return meta, rows


@pytest.mark.parametrize("name", ["fig6", "fig8"])
def test_quick_kl_figures(name, tmp_path):
    res = real.run_real_experiment(name, quick=True, out=tmp_path, progress=False)
    meta, rows = _check_outputs(res, name)
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["mechanism"] for r in rows} >= {"kl-paper", "kl-certified", "gaussian-iid"}
    assert all(float(r["kl_mean"]) >= 0 for r in ok)
    assert all(r["certified"] == "True" for r in ok if r["mechanism"] == "kl-certified")
    assert all(r["certified"] == "False" for r in ok if r["mechanism"] == "kl-paper")
    for d in res.experiment.datasets:
        summary = meta["summary"]["kl"][d]
        paper = [s for s in summary if s["mechanism"] == "kl-paper"]
        assert paper[0]["kl_mean"] > paper[-1]["kl_mean"]  # eps 0.5 vs eps 10
    assert meta["guarantees"]["kl-certified"]["certified"] is True


def test_quick_marginal_figures(tmp_path):
    res = real.run_real_experiment("fig7", quick=True, out=tmp_path, progress=False)
    meta, _ = _check_outputs(res, "fig7")
    best = meta["summary"]["best_baseline"]
    exp_kl = meta["summary"]["expected_kl_at_epsilon"]
    assert best not in ("kl-paper", "kl-certified")
    assert exp_kl[best] == min(v for k, v in exp_kl.items()
                               if k not in ("kl-paper", "kl-certified"))
    assert set(meta["summary"]["plotted_releases"]) == {"kl-paper", "kl-certified", best}
    res = real.run_real_experiment("fig9", quick=True, out=tmp_path, progress=False)
    _check_outputs(res, "fig9")


@needs_mnist
def test_quick_mnist_figures(tmp_path):
    res = real.run_real_experiment("fig11", quick=True, out=tmp_path, progress=False)
    meta, rows = _check_outputs(res, "fig11")
    acc = [float(r["accuracy"]) for r in rows if r["status"] == "ok"]
    assert acc and all(0 <= a <= 1 for a in acc)
    assert 0.6 < meta["summary"]["non_private_gmm_classifier_accuracy"] < 0.9
    res = real.run_real_experiment("fig12", quick=True, out=tmp_path, progress=False)
    meta, rows = _check_outputs(res, "fig12")
    curves = meta["summary"]["curves"]
    assert {"real", "non-private"} <= set(curves)
    assert all(len(c["mean"]) == 40 for c in curves.values())  # 5000 rows / 128 per step
    res = real.run_real_experiment("fig10", quick=True, out=tmp_path, progress=False)
    _check_outputs(res, "fig10")


def test_a_failing_mechanism_gives_error_rows(tmp_path, monkeypatch):
    exp = real.REAL_EXPERIMENTS["fig6"]
    failing = MechanismSpec("gaussian-iid", "refuses", (("bounds", "features"),
                                                        ("min_class_size", 10**6)),
                            key="refuses")
    monkeypatch.setitem(real.REAL_EXPERIMENTS, "fig6",
                        replace(exp, mechanisms=(exp.mechanisms[0], failing)))
    res = real.run_real_experiment("fig6", quick=True, out=tmp_path, progress=False)
    bad = [r for r in res.rows if r["mechanism"] == "refuses"]
    assert bad and all(r["status"] == "error" and "min_class_size" in r["error"] for r in bad)
    assert all(r["status"] == "ok" for r in res.rows if r["mechanism"] == "kl-paper")
    assert json.loads(res.json_path.read_text())["failed_rows"] == len(bad)


def test_unknown_real_experiment():
    with pytest.raises(ValueError, match="unknown experiment"):
        real.run_real_experiment("fig99", quick=True, progress=False)
