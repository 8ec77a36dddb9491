"""``public-total``: every class the public features' mean and covariance, weights from
randomized response on the labels (label flip). Its audit, and the sampler's likelihood ratio,
are checked with the other randomized-response releases (``tests/test_response.py``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import klrelease as kr
from klrelease.warnings_ import PrivacyLeakWarning


def _data(seed=0):
    rng = np.random.default_rng(seed)
    y = rng.choice(3, size=600, p=[0.2, 0.3, 0.5])
    X = rng.normal(size=(600, 4)) @ rng.normal(size=(4, 4)) + 3.0 * y[:, None]
    X[:, 0] *= 1e4  # units: the features' own covariance, whatever their scales
    return X, y


def test_every_class_is_the_public_features_own_gaussian():
    X, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        g = kr.release(X, y, classes=[0, 1, 2], mechanism="public-total", epsilon=30,
                       delta=1e-5, seed=1).gmm
    C = np.cov(X, rowvar=False)
    for k in range(3):
        np.testing.assert_allclose(g.means[k], X.mean(axis=0), rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(g.covariances[k], C, rtol=1e-9, atol=1e-9 * np.abs(C).max())
    # at eps = 30 nearly every label is reported as it is: the weights are the classes' shares
    np.testing.assert_allclose(g.weights, np.bincount(y) / y.size, atol=0.01)


def test_weights_are_debiased_and_noisier_at_small_epsilon():
    """The reported counts are debiased: the mean weight over draws is the classes' share at
    any epsilon (within its standard error), and the spread falls as epsilon grows."""
    X, y = _data(1)
    share = np.bincount(y) / y.size
    spread = []
    for eps in (0.5, 4.0):
        p = kr.plan(X, y, classes=[0, 1, 2], mechanism="public-total", epsilon=eps,
                    delta=1e-5)
        rng = np.random.default_rng(2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PrivacyLeakWarning)
            w = np.array([p.draw(rng).weights for _ in range(200)])
        assert np.all(np.abs(w.mean(axis=0) - share) < 4 * w.std(axis=0) / np.sqrt(200) + 0.01)
        spread.append(w.std(axis=0).mean())
    assert spread[1] < 0.5 * spread[0], spread


def test_public_total_is_certified_under_label_flip_only():
    X, y = _data(2)
    rel = kr.release(X, y, classes=[0, 1, 2], mechanism="public-total", epsilon=1.0,
                     delta=1e-5)
    assert rel.privacy.certified and rel.privacy.neighbouring.value == "label-flip"
    assert "public_total.py" in rel.privacy.statement
    with pytest.raises(ValueError, match="label-flip"):
        kr.plan(X, y, classes=[0, 1, 2], mechanism="public-total", epsilon=1.0, delta=1e-5,
                adjacency="replace-one", bounds=(-1e6, 1e6))


def test_streamed_public_total_equals_its_model_of_the_streamed_reports():
    """From a chunked source: the same public mean and covariance as in memory, a valid
    model."""
    from klrelease.stream import ArraySource

    X, y = _data(3)
    src = ArraySource(X, y, classes=[0, 1, 2], chunk_rows=97)
    p = kr.plan(src, None, epsilon=2.0, delta=1e-5, mechanism="public-total")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        g = p.draw(np.random.default_rng(0))
    C = np.cov(X, rowvar=False)
    np.testing.assert_allclose(g.means, np.broadcast_to(X.mean(axis=0), (3, 4)), rtol=1e-9,
                               atol=1e-6)
    np.testing.assert_allclose(g.covariances[1], C, rtol=1e-8, atol=1e-8 * np.abs(C).max())
    assert np.isclose(g.weights.sum(), 1.0)


def test_undeclared_classes_warn_and_are_not_certified():
    X, y = _data(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rel = kr.release(X, y, epsilon=1.0, delta=1e-5, mechanism="public-total")
    assert not rel.privacy.certified
    assert any(issubclass(w.category, PrivacyLeakWarning) for w in caught)


def test_units_of_a_feature_change_nothing_but_its_units():
    """The same seed on the features in other units (scaled and shifted): the same weights,
    the means and covariances in the new units."""
    X, y = _data(5)
    a = np.array([1e-3, 7.0, 1.0, 250.0])
    b = np.array([5.0, -3.0, 0.0, 1e4])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        g = kr.release(X, y, classes=[0, 1, 2], mechanism="public-total", epsilon=1.0,
                       delta=1e-5, seed=7).gmm
        h = kr.release(X * a + b, y, classes=[0, 1, 2], mechanism="public-total",
                       epsilon=1.0, delta=1e-5, seed=7).gmm
    np.testing.assert_array_equal(g.weights, h.weights)
    np.testing.assert_allclose(h.means, g.means * a + b, rtol=1e-9)
    np.testing.assert_allclose(h.covariances, g.covariances * np.outer(a, a), rtol=1e-8)


def test_every_one_stage_response_release_names_an_existing_proof():
    """A claim says where it is proven: every registered one-stage response release names a
    file of the repository."""
    from pathlib import Path

    from klrelease.mechanisms import get_mechanism, mechanisms
    from klrelease.mechanisms.baselines.randomized_response import PlainResponse

    root = Path(__file__).resolve().parent.parent
    plain = [get_mechanism(n) for n in mechanisms()
             if isinstance(get_mechanism(n), PlainResponse)]
    assert {m.name for m in plain} >= {"randomized-response", "public-total"}
    for m in plain:
        assert m.proof and (root / m.proof).is_file(), m.name


@pytest.mark.parametrize("mechanism", ["randomized-response", "public-total"])
def test_a_dask_source_is_refused_before_its_rows_are_read(mechanism):
    """The labels' noise is drawn where the rows are read: on a Dask cluster the workers would
    hold its key, so a Dask source is refused when the plan is made."""
    da = pytest.importorskip("dask.array")
    from klrelease.stream import DaskSource

    X, y = _data(6)
    src = DaskSource(da.from_array(X, chunks=(100, 4)), da.from_array(y, chunks=100),
                     classes=[0, 1, 2])
    with pytest.raises(ValueError, match="Dask cluster"):
        kr.plan(src, None, mechanism=mechanism, epsilon=1.0, delta=1e-5)
