"""Inputs that are not what they look like are refused with a clear error before any noise is
drawn: booleans or text as privacy parameters, complex features, labels of mixed types."""

import warnings

import numpy as np
import pytest

import klrelease as kr
from klrelease.stream import ArraySource
from klrelease.warnings_ import PrivacyLeakWarning


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(60, 2)), np.repeat([0, 1, 2], 20)


@pytest.mark.parametrize("name", ["epsilon", "delta"])
@pytest.mark.parametrize("value", [True, False, "1", "0.5", None, 1 + 0j, [1.0]])
def test_privacy_parameters_must_be_real_numbers(name, value):
    X, y = _data()
    kw = {"epsilon": 1.0, "delta": 1e-5, name: value}
    with pytest.raises(ValueError, match=f"^{name} must be a number"):
        kr.release(X, y, classes=[0, 1, 2], **kw)


def test_numpy_numbers_are_privacy_parameters():
    X, y = _data()
    rel = kr.release(X, y, classes=[0, 1, 2], epsilon=np.float32(1.0), delta=np.float64(1e-5))
    assert rel.privacy.epsilon == 1.0


@pytest.mark.parametrize("make", [lambda X: X + 1e-3j, lambda X: X.astype(complex),
                                  lambda X: X.astype(object) + 0j])
def test_complex_features_are_refused(make):
    X, y = _data()
    with pytest.raises(ValueError, match="complex"):
        kr.release(make(X), y, classes=[0, 1, 2], epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="complex|numeric"):
        kr.release(ArraySource(make(X), y, classes=[0, 1, 2]), None, epsilon=1.0, delta=1e-5)


@pytest.mark.parametrize("labels", [lambda y: [1 if v else "a" for v in y % 2],
                                    lambda y: np.array([1 if v else "a" for v in y % 2],
                                                       dtype=object),
                                    lambda y: [True if v else 2 for v in y % 2]])
def test_labels_of_mixed_types_are_refused_unless_the_classes_are_declared(labels):
    X, y = _data()
    mixed = labels(y)
    with pytest.raises(ValueError, match="mixes labels of different types"):
        kr.release(X, mixed, epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="mixes labels of different types"):
        kr.release(ArraySource(X, mixed), None, epsilon=1.0, delta=1e-5)


def test_declared_classes_decide_how_mixed_labels_are_read():
    X, y = _data()
    mixed = [1 if v else "a" for v in y % 2]
    rel = kr.release(X, mixed, classes=[1, "a"], epsilon=1.0, delta=1e-5)
    assert rel.gmm.classes == ("1", "a")  # the declaration is text: labels read as text


@pytest.mark.parametrize("state", [np.random.RandomState(0), 0, np.random.default_rng(0)])
def test_gmm_releaser_takes_scikit_learn_random_states(state):
    X, y = _data()
    with pytest.warns(PrivacyLeakWarning, match="seeded"):
        est = kr.GMMReleaser(1.0, 1e-5, classes=[0, 1, 2], random_state=state).fit(X, y)
    assert not est.release_.privacy.certified
    assert est.release_.randomness.secure is False


def test_a_random_state_instance_reproduces_and_advances():
    X, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        a = kr.GMMReleaser(classes=[0, 1, 2], random_state=np.random.RandomState(3)).fit(X, y)
        b = kr.GMMReleaser(classes=[0, 1, 2], random_state=np.random.RandomState(3)).fit(X, y)
        rs = np.random.RandomState(3)
        c = kr.GMMReleaser(classes=[0, 1, 2], random_state=rs).fit(X, y)
        d = kr.GMMReleaser(classes=[0, 1, 2], random_state=rs).fit(X, y)
    np.testing.assert_array_equal(a.means_, b.means_)
    np.testing.assert_array_equal(a.means_, c.means_)
    assert not np.array_equal(c.means_, d.means_)


@pytest.mark.parametrize("where", ["first", "last", "middle"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_entry_anywhere_in_many_rows_is_refused(where, value):
    """The finiteness check of a large array runs over its two halves on two threads, in
    blocks: a non-finite entry in either half, at a block's edge or not, is found."""
    from klrelease import as_labelled_data

    n = (1 << 17) + 3
    X = np.zeros((n, 3))
    y = np.arange(n) % 2
    row = {"first": 0, "last": n - 1, "middle": n // 2}[where]
    as_labelled_data(X, y)  # finite: accepted
    X[row, 2] = value
    with pytest.raises(ValueError, match="^X contains NaN or infinite values$"):
        as_labelled_data(X, y)


def test_a_bound_that_label_flip_does_not_use_warns_and_changes_nothing():
    """kl-certified under label flip reads the public features themselves: a box or ball given
    with that relation is not used, and the caller is told so (replace-one uses it, silently);
    randomized response refuses a box, naming its one relation."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    X = rng.standard_normal((200, 3)) + y[:, None]
    box = (X.min(0) - 1, X.max(0) + 1)
    with pytest.warns(UserWarning, match="does not use the public bound under label flip"):
        a = kr.release(X, y, epsilon=1, delta=1e-5, classes=[0, 1], bounds=box, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        b = kr.release(X, y, epsilon=1, delta=1e-5, classes=[0, 1], seed=3)
        kr.release(X, y, epsilon=1, delta=1e-5, classes=[0, 1], bounds=box, seed=3,
                   adjacency="replace-one")
    np.testing.assert_array_equal(a.gmm.means, b.gmm.means)
    with pytest.warns(UserWarning, match="label flip"):
        kr.release(X, y, epsilon=1, delta=1e-5, classes=[0, 1], norm_bound=10.0, seed=3,
                   mechanism="randomized-response")
    with pytest.raises(ValueError, match="its one relation is label flip"):
        kr.release(X, y, epsilon=1, delta=1e-5, classes=[0, 1], bounds=box, seed=3,
                   mechanism="randomized-response")
    with pytest.warns(UserWarning, match="no relation at the record level"):
        kr.plan(X, y, epsilon=1, delta=1e-5, classes=[0, 1], norm_bound=10.0,
                mechanism="public-total")
    # mechanisms that clip to their bound under label flip too say nothing, nor does a
    # dataset that carries a box for other relations (the bundled sets: the quick start)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        kr.plan(kr.as_labelled_data(X, y, classes=[0, 1], bounds=box), None, epsilon=1,
                delta=1e-5)
        kr.plan(X, y, epsilon=1, delta=1e-5, classes=[0, 1], norm_bound=10.0,
                mechanism="kl-paper")
        kr.plan(X, y, epsilon=1, delta=1e-5, classes=[0, 1], bounds=box,
                mechanism="gaussian-iid")


def test_the_command_line_shows_that_a_bound_is_not_used(tmp_path, capsys):
    """Only where one was given: the README's first command prints no warning."""
    from klrelease.cli import main

    args = ["release", "--dataset", "iris", "--epsilon", "1", "--delta", "1e-5"]
    assert main([*args, "--out", str(tmp_path / "plain.json")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main([*args, "--lower", "0,0,0,0", "--upper", "10,10,10,10", "--out",
                 str(tmp_path / "r.json")]) == 0
    assert "does not use the public bound under label flip" in capsys.readouterr().err
