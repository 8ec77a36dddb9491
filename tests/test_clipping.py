"""Clipping maps every finite row into the public bound, without overflow and without warnings.

A record far outside the bound must land on the bound's sphere (or box face), never become NaN
or the origin: otherwise one record decides whether a class's statistics are NaN (and so
whether the release falls back), an unbounded privacy loss. Whether numpy warns must not
depend on the rows either.
"""

import warnings

import numpy as np
import pytest

import klrelease as kr
from klrelease.domain import Domain
from klrelease.rows import affine_clip_rows, affine_rows, clip_to_norm
from klrelease.stream import ArraySource
from klrelease.warnings_ import PrivacyLeakWarning

BIG = np.finfo(float).max


def _direction(x):
    """x / ||x|| computed by scaling first (a reference without overflow)."""
    s = np.max(np.abs(x))
    return (x / s) / np.linalg.norm(x / s)


@pytest.mark.parametrize("bound", [1.0, 1e-300, 3e150, 1e300])
def test_far_rows_land_on_the_sphere(bound):
    X = np.array([[1.5e308, 0.0, 0.0], [1.3e154, 0.0, 0.0], [1e200, -2e199, 5.0],
                  [BIG, BIG, -BIG], [1e-170, 1e-171, 0.0], [3.0, -4.0, 12.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Y = clip_to_norm(X, bound)
    assert np.all(np.isfinite(Y))
    for x, y in zip(X, Y, strict=True):
        s = np.max(np.abs(x))
        with np.errstate(over="ignore"):
            inside = np.linalg.norm(x / s) <= bound / s
        if inside:
            np.testing.assert_array_equal(y, x)
        else:
            s = np.max(np.abs(y))
            np.testing.assert_allclose(s * np.linalg.norm(y / s), bound, rtol=1e-13)
            np.testing.assert_allclose(_direction(y), _direction(x), rtol=1e-13, atol=1e-15)


def test_rows_in_the_ball_are_unchanged_and_zero_stays_zero():
    X = np.array([[0.0, 0.0], [1e-310, 0.0], [0.3, 0.4], [1e-160, 1e-160]])
    np.testing.assert_array_equal(clip_to_norm(X, 1.0), X)


def test_infinite_entries_go_to_the_limit_direction():
    Y = clip_to_norm(np.array([[np.inf, 3.0], [-np.inf, np.inf]]), 2.0)
    np.testing.assert_allclose(Y, [[2.0, 0.0], [-np.sqrt(2.0), np.sqrt(2.0)]])


def test_affine_rows_never_makes_nan_and_keeps_exact_values():
    X = np.array([[1.5e308, 0.5], [1.0, 2.0], [-1.7e308, 1e308]])
    centre = np.array([-1e308, 0.0])
    W = np.array([[2.0, 0.0], [0.0, 3.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        T = affine_rows(X, centre, W)
    assert not np.any(np.isnan(T))
    np.testing.assert_allclose(T, [[np.inf, 1.5], [np.inf, 6.0], [-1.4e308, np.inf]], rtol=1e-15)
    small = np.array([[1.0, 2.0], [-3.0, 0.5]])
    np.testing.assert_array_equal(affine_rows(small, centre / 1e300, W),
                                  (small - centre / 1e300) @ W)


@pytest.mark.parametrize("scale", [1.0, 1e-200, 1e200, 1e300])
def test_fused_affine_clip_and_stage_c_map_equal_the_maps_they_fuse(scale):
    """``affine_clip_rows`` is ``clip_to_norm(affine_rows(...))`` bit for bit, on ordinary
    rows and on blocks that need the special paths (rows beyond the float range, rows at the
    centre); stage C's ``into`` (box clip in place or skipped, then the fused sweep) gives the
    values of the map itself, box inside or outside the rows, without a warning."""
    from klrelease.mechanisms.kl_certified.mechanism import _FusedRegionClip

    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 3)) * scale
    X[5] = 0.0
    X[7] = [BIG, -BIG, 1.0]
    centre, W = np.array([0.1, -0.2, 0.0]) * scale, rng.normal(size=(3, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for rows in (X[:4], X[8:], X):  # a block in the safe range, and blocks that are not
            want = clip_to_norm(affine_rows(rows, centre, W), 2.0 * scale)
            got = affine_clip_rows(rows, centre, W, 2.0 * scale, np.empty((len(rows), 3)),
                                   np.empty_like(rows))
            np.testing.assert_array_equal(got, want)
        for half in (1e300, 3.0 * scale):  # every row inside the box, and rows clipped
            fn = _FusedRegionClip(centre[None, :], W[None], np.array([2.0 * scale]),
                                  np.full(3, -half), np.full(3, half))
            for rows in (X[8:], X):
                block = rows.copy()
                got = fn.into(block, 0, np.empty((len(rows), 3)), np.empty_like(rows))
                np.testing.assert_array_equal(got, fn(rows, 0))
            empty = fn.into(X[:0].copy(), 0, np.empty((0, 3)), np.empty((0, 3)))
            assert empty.shape == fn(X[:0], 0).shape == (0, 3)


def test_the_fused_pass_gives_the_sums_of_the_plain_one_and_refuses_bad_indices():
    """``sorted_bounded_moments`` with stage C's map (gathered blocks, the fused sweep, buffers
    reused across blocks and classes) gives the same sums and second moments, bit for bit, as
    the same map applied through the plain path; an index outside the rows raises (the fused
    gather clips indices, which would count a row twice)."""
    from klrelease.mechanisms.kl_certified.mechanism import _FusedRegionClip
    from klrelease.rows import class_blocks
    from klrelease.stream.moments import sorted_bounded_moments

    rng = np.random.default_rng(2)
    X = rng.standard_t(3, size=(5000, 4))
    X[17] = 0.0
    codes = rng.integers(0, 3, 5000)
    codes[:2] = 2  # class 1 may be small; none is empty here
    order, bounds = class_blocks(codes, 3)
    fn = _FusedRegionClip(rng.normal(size=(3, 4)) * 0.1, rng.normal(size=(3, 4, 4)),
                          np.array([1.5, 2.0, 3.0]), np.full(4, -4.0), np.full(4, 4.0))
    for block in (7, 64, None):
        fused = sorted_bounded_moments(X, bounds, fn, block=block, index=order)
        plain = sorted_bounded_moments(X, bounds, lambda rows, k: fn(rows, k), block=block,
                                       index=order)
        for a, b in zip(fused, plain, strict=True):
            np.testing.assert_array_equal(a, b)
    for bad in (np.r_[order[:-1], 5000], np.r_[order[:-1], -1]):
        with pytest.raises(IndexError):
            sorted_bounded_moments(X, bounds, fn, index=bad)


def _data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(90, 2))
    y = np.repeat([0, 1, 2], 30)
    return X, y


@pytest.mark.parametrize("far", [(1.5e308, 0.0), (1e200, 0.0), (-1.7e308, 1.7e308)])
def test_replace_one_ball_stage_a_sums_are_finite_and_the_row_is_on_the_sphere(far):
    """The far row's clipped image is a point of the ball (on its sphere): stage A's sums
    differ from the in-ball neighbour's by at most the ball's diameter, and nothing falls
    back (on main, 1.5e308 became NaN: every release fell back)."""
    X, y = _data()
    Xf = X.copy()
    Xf[0] = far
    kw = dict(epsilon=1.0, delta=1e-5, classes=[0, 1, 2], norm_bound=1.0,
              adjacency="replace-one")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        p_far, p_in = kr.plan(Xf, y, **kw), kr.plan(X, y, **kw)
        streamed = kr.plan(ArraySource(Xf, y, classes=[0, 1, 2], norm_bound=1.0,
                                       chunk_rows=16), None, epsilon=1.0, delta=1e-5,
                           adjacency="replace-one")
    # stage A's sums in the working frame that one released output gives (the rows clipped
    # into the ball, then into the located box, then to the stage-A radius)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out = p_far.sample(np.random.default_rng(0))
        work = p_far.working(out)
        far_sums, in_sums = p_far._stage_a(work), p_in._stage_a(work)
        streamed_sums = streamed._stage_a(streamed.working(out))
    assert np.all(np.isfinite(far_sums))
    np.testing.assert_allclose(streamed_sums, far_sums, rtol=1e-12, atol=1e-12)
    moved = np.linalg.norm(far_sums[0] - in_sums[0])
    assert moved <= 2 * work.radius + 1e-9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        for seed in range(5):
            rel = kr.release(Xf, y, seed=seed, **kw)
            assert "fallback" not in rel.options


def test_a_box_near_the_float_range_is_refused_before_noise():
    """A box whose half-widths square beyond the float range (its covariances could not be
    released) is refused with one clear message before any noise, without a numpy warning;
    the frame map itself never makes a NaN (``affine_rows``, tested above)."""
    X, y = _data()
    X = X * 1e306 - 1.65e308
    X[0] = (1.5e308, -1.65e308)
    box = Domain.box([-1.7e308, -1.7e308], [-1.6e308, -1.6e308])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ValueError, match="half-widths must lie between"):
            kr.plan(X, y, epsilon=1.0, delta=1e-5, classes=[0, 1, 2], bounds=box,
                    adjacency="replace-one")


def test_domain_clip_ball_is_exact_for_every_finite_row():
    dom = Domain.ball(2.0, 2)
    Y = dom.clip(np.array([[1.5e308, 1.5e308], [1.0, 0.0]]))
    np.testing.assert_allclose(Y, [[np.sqrt(2.0), np.sqrt(2.0)], [1.0, 0.0]])
