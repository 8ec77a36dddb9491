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


@pytest.mark.parametrize("mechanism", ["gaussian-iid", "laplace-iid", "colored-gaussian",
                                       "r1smg"])
@pytest.mark.parametrize("width", [1e-200, 1e200])
def test_baselines_refuse_a_public_box_beyond_the_float_range_of_their_noise(mechanism, width):
    X, y = _data(width, d=3)
    _refused_before_noise(X, y, "the public bound's widths must lie between",
                          mechanism=mechanism, epsilon=1.0, delta=1e-5, classes=[0, 1, 2],
                          bounds=(-width, width))


def test_gaussian_calibration_out_of_reach_is_a_value_error():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(29, 2)), np.repeat([0, 1], [14, 15])
    _refused_before_noise(X, y, "cannot calibrate its noise", mechanism="gaussian-iid",
                          epsilon=2.43e-6, delta=3.45e-171, classes=[0, 1],
                          bounds=(-0.0746, 0.0746))


def test_r1smg_variance_out_of_reach_is_a_value_error():
    X, y = _data(d=3)
    _refused_before_noise(X, y, "r1smg's noise variance leaves the floating-point range",
                          mechanism="r1smg", epsilon=0.044, delta=1.5e-216, classes=[0, 1, 2],
                          bounds=(-5.0, 5.0))


@pytest.mark.parametrize("scale", [1e89, 1e105, 1e200, 1e-100])
def test_kl_paper_refuses_statistics_it_cannot_carry_through_the_draw(scale):
    X, y = _data(scale, N=36, d=3)
    _refused_before_noise(X, y, "kl-paper (needs the class covariances' eigenvalues|cannot use)",
                          mechanism="kl-paper", epsilon=1.0, delta=1e-5, classes=[0, 1, 2])


def test_kl_paper_refuses_a_design_without_usable_noise():
    X, y = _data(1e14, N=36, d=3)
    _refused_before_noise(X + 3e14, y, "finds no usable noise", mechanism="kl-paper",
                          epsilon=0.023, delta=3.1e-215, classes=[0, 1, 2])


@pytest.mark.parametrize("mechanism", ["kl-paper", "gaussian-iid", "colored-gaussian"])
def test_ordinary_inputs_still_release(mechanism):
    X, y = _data(d=3)
    kw = {} if mechanism == "kl-paper" else {"bounds": (-5.0, 5.0)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        rel = kr.release(X, y, seed=0, mechanism=mechanism, epsilon=1.0, delta=1e-5,
                         classes=[0, 1, 2], **kw)
    assert np.all(np.isfinite(rel.gmm.means))
