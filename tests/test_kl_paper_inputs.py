"""kl-paper inverts every class covariance: a singular one is refused with a message that says
why and what to do, before any noise (it was a bare 'Singular matrix')."""

import numpy as np
import pytest

import klrelease as kr
from klrelease.cli import main
from klrelease.stream import ArraySource


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(60, 3)), np.repeat([0, 1, 2], 20)


def _constant_column(X):
    X = X.copy()
    X[:, 1] = 0.5
    return X


def _duplicated_rows(X):
    return np.repeat(X[:6], 10, axis=0)


@pytest.mark.parametrize("make", [_constant_column, _duplicated_rows])
@pytest.mark.parametrize("streamed", [False, True])
def test_singular_class_covariances_are_explained(make, streamed):
    X, y = _data()
    X = make(X)
    args = ((ArraySource(X, y, classes=[0, 1, 2]), None) if streamed else (X, y))
    kw = {} if streamed else {"classes": [0, 1, 2]}
    with pytest.raises(ValueError, match="kl-paper needs every class covariance to be "
                                         "invertible.*use kl-certified"):
        kr.plan(*args, epsilon=1.0, delta=1e-5, mechanism="kl-paper", **kw)


def test_the_command_line_says_it_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    X, y = _data()
    np.savez("d.npz", X=_constant_column(X), y=y)
    assert main(["release", "--npz", "d.npz", "--epsilon", "1", "--delta", "1e-5",
                 "--mechanism", "kl-paper", "--classes", "0,1,2", "--out", "x.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: kl-paper needs every class covariance") and err.count("\n") == 1
    assert not (tmp_path / "x.json").exists()


def test_a_well_conditioned_dataset_still_plans():
    X, y = _data()
    p = kr.plan(X, y, epsilon=1.0, delta=1e-5, mechanism="kl-paper", classes=[0, 1, 2])
    assert np.isfinite(p.design.objective)
