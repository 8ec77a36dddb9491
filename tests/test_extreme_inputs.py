"""Inputs at the ends of the floating-point range: a release, or a clear ValueError before any
noise is drawn, and no numpy warning whose presence depends on the rows."""

import pickle
import warnings

import numpy as np
import pytest

import klrelease as kr
from klrelease.stream.moments import bounded_class_moments, chunk_moments, pooled_moments
from klrelease.warnings_ import PrivacyLeakWarning


def _data(scale=1.0, N=30, d=2, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N, d)) * scale, np.repeat([0, 1, 2], N // 3)


def _refused_before_noise(X, y, match, **kw):
    gen = np.random.default_rng(1)
    before = pickle.dumps(gen.bit_generator.state)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        with pytest.raises(ValueError, match=match):
            kr.release(X, y, seed=gen, **kw)
    assert pickle.dumps(gen.bit_generator.state) == before


def test_private_accumulations_raise_no_floating_point_warning():
    X, y = _data(1e200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = chunk_moments(X, y, 3)
        pooled_moments(X)
        bounded_class_moments(X, y, 3, lambda U, k: U)
        m.merge(m)
    assert not np.all(np.isfinite(m.scatters))  # the overflow is in the result, not a warning
