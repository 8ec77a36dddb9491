"""The blocked per-class reductions of the in-memory and streamed paths against straightforward
reference implementations (one mask per class, whole-array numpy), on classes of awkward
sizes: an empty class, a one-row class, and a class spanning several row blocks."""

import numpy as np
import pytest

from klrelease.mechanisms.kl_certified.design import tail_corrections
from klrelease.mechanisms.kl_certified.locate import Located, Window, histograms
from klrelease.mechanisms.kl_certified.mechanism import (
    _CentredClip,
    _clip_box,
    _MemoryRows,
    _public_moments,
    _RegionClip,
)
from klrelease.rows import ROW_BLOCK, class_blocks, clip_to_bounds, clip_to_norm
from klrelease.statistics import class_statistics
from klrelease.stream.moments import (
    bounded_class_moments,
    chunk_moments,
    pooled_moments,
    sorted_bounded_moments,
    sorted_moments,
)

K, D = 5, 4
RTOL = 1e-12


def _awkward(seed=0):
    """Class 0 spans more than two row blocks, class 1 is empty, class 3 has one row; rows in
    random order, a large common offset."""
    rng = np.random.default_rng(seed)
    sizes = [2 * ROW_BLOCK + 37, 0, 513, 1, ROW_BLOCK]
    y = np.repeat(np.arange(K), sizes)
    rng.shuffle(y)
    X = 1e3 + rng.normal(size=(y.size, D)) * rng.uniform(0.5, 4.0, D) + 3.0 * y[:, None]
    return X, y, sizes


def _reference_moments(X, y):
    counts = np.array([np.sum(y == k) for k in range(K)], dtype=float)
    means = np.zeros((K, D))
    scat = np.zeros((K, D, D))
    for k in range(K):
        Xk = X[y == k]
        if Xk.shape[0]:
            means[k] = Xk.mean(axis=0)
            C = Xk - means[k]
            scat[k] = C.T @ C
    return counts, means, scat


def test_chunk_and_sorted_moments_match_reference():
    X, y, sizes = _awkward()
    counts, means, scat = _reference_moments(X, y)
    m = chunk_moments(X, y, K)
    np.testing.assert_array_equal(m.counts, sizes)
    np.testing.assert_allclose(m.means, means, rtol=RTOL)
    np.testing.assert_allclose(m.scatters, scat, rtol=1e-10, atol=1e-9)
    order, bounds = class_blocks(y, K)
    s = sorted_moments(X[order], bounds)
    np.testing.assert_array_equal(s.counts, m.counts)
    np.testing.assert_allclose(s.means, m.means, rtol=RTOL)
    np.testing.assert_allclose(s.scatters, m.scatters, rtol=RTOL, atol=1e-9)
    assert np.all(m.means[1] == 0) and np.all(m.scatters[1] == 0)  # the empty class
    assert np.all(m.scatters[3] == 0)  # one row: no spread
    p = pooled_moments(X)
    np.testing.assert_allclose(p.means[0], X.mean(axis=0), rtol=RTOL)
    C = X - X.mean(axis=0)
    np.testing.assert_allclose(p.scatters[0], C.T @ C, rtol=1e-10)


def test_class_statistics_match_numpy_cov():
    X, y, _ = _awkward(1)
    keep = np.isin(y, [0, 2, 4])  # classes of >= 2 rows
    codes = np.searchsorted([0, 2, 4], y[keep])
    st = class_statistics(X[keep], codes, 3)
    for k, c in enumerate([0, 2, 4]):
        np.testing.assert_allclose(st.covariances[k], np.cov(X[y == c].T), rtol=1e-10)


def test_bounded_moments_match_reference():
    X, y, sizes = _awkward(2)
    shift = np.random.default_rng(3).normal(size=(K, D)) * 2.0 + 1e3

    def fn(T, k):
        return clip_to_norm(T - shift[k], 2.5)

    counts, sums, second = bounded_class_moments(X, y, K, fn)
    np.testing.assert_array_equal(counts, sizes)
    order, bounds = class_blocks(y, K)
    s1, s2 = sorted_bounded_moments(X[order], bounds, fn)
    s1b, none = sorted_bounded_moments(X[order], bounds, fn, second=False, block=1000)
    assert none is None
    for k in range(K):
        U = fn(X[y == k], k)
        for got in (sums[k], s1[k], s1b[k]):
            np.testing.assert_allclose(got, U.sum(axis=0), rtol=RTOL, atol=1e-10)
        for got in (second[k], s2[k]):
            np.testing.assert_allclose(got, U.T @ U, rtol=RTOL, atol=1e-10)
    # no rows at all: the map's width, zeros
    e1, e2 = sorted_bounded_moments(X[:0], np.zeros(K + 1, dtype=int), fn)
    assert e1.shape == (K, D) and e2.shape == (K, D, D) and not e1.any() and not e2.any()


def test_memory_rows_match_reference():
    """The kl-certified stage maps over rows grouped by class once, against masks."""
    X, y, _ = _awkward(4)
    T = (X - X.mean(axis=0)) / X.std(axis=0)
    order, bounds = class_blocks(y, K)
    rows = _MemoryRows(np.take(T, order, axis=0), bounds)
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(K, D))
    W = rng.normal(size=(K, D, D)) * 0.5
    radii = rng.uniform(0.5, 3.0, K)
    for fn in (_CentredClip(centres, 1.5), _RegionClip(centres, W, radii)):
        S1, S2 = rows.stats(fn, D)
        for k in range(K):
            U = fn(T[y == k], k)
            np.testing.assert_allclose(S1[k], U.sum(axis=0), rtol=RTOL, atol=1e-10)
            np.testing.assert_allclose(S2[k], U.T @ U, rtol=RTOL, atol=1e-10)
    window = Window(np.full(D, -2.0), np.full(D, 1.5))
    H = rows.histograms(window, 16)
    P = np.clip(T, -2.0, 1.5)
    ref = np.stack([np.histogram(P[:, j], bins=16, range=(-2.0, 1.5))[0] for j in range(D)])
    np.testing.assert_array_equal(H, ref)
    assert H.sum() == T.shape[0] * D


def test_histograms_and_clips_equal_numpy():
    rng = np.random.default_rng(6)
    T = rng.normal(size=(3000, D)) * 3
    T[0, 1] = np.nan
    lo, hi = np.full(D, -1.0), np.array([1.0, 2.0, 0.5, 1.0])
    np.testing.assert_array_equal(clip_to_bounds(T, lo, hi), np.clip(T, lo, hi))
    # fewer rows than a tile of 64, exactly one, a strided view, scalar bounds
    for V in (T[:5], T[:64], T[::3], T[1:]):
        np.testing.assert_array_equal(clip_to_bounds(V, lo, hi), np.clip(V, lo, hi))
    np.testing.assert_array_equal(clip_to_bounds(T, -0.5, 0.5), np.clip(T, -0.5, 0.5))
    # bounds broadcast from one value, no feature, float32 rows: as numpy does
    one = (np.array([-0.5]), np.array([0.5]))
    np.testing.assert_array_equal(clip_to_bounds(T, *one), np.clip(T, *one))
    assert clip_to_bounds(np.zeros((128, 0)), -1.0, 1.0).shape == (128, 0)
    T32 = T.astype(np.float32)
    assert clip_to_bounds(T32, -0.5, 0.5).dtype == np.clip(T32, -0.5, 0.5).dtype
    U = T.copy()
    assert clip_to_bounds(U, lo, hi, out=U) is U
    np.testing.assert_array_equal(U, np.clip(T, lo, hi))
    np.testing.assert_array_equal(_clip_box(T.copy()), np.clip(T, -1.0, 1.0))
    loc = Located(rng.normal(size=D), rng.uniform(0.5, 2, D), np.full(D, -1.5), np.full(D, 2.0))
    np.testing.assert_array_equal(loc(T), np.clip((T - loc.centre) / loc.scale, -1.5, 2.0))
    # histograms: the original formula (clip, scale, floor, NaN to bin 0)
    win = Window(lo, hi)
    span = hi - lo
    pos = (np.clip(T, lo, hi) - lo) / span * 8
    idx = np.clip(np.floor(np.nan_to_num(pos)), 0, 7).astype(np.int64)
    ref = np.stack([np.bincount(idx[:, j], minlength=8) for j in range(D)]).astype(float)
    np.testing.assert_array_equal(histograms(T, win, 8), ref)


def test_public_moments_match_numpy():
    X, _, _ = _awkward(7)
    centre, C, M2 = _public_moments(X)
    np.testing.assert_allclose(centre, X.mean(axis=0), rtol=RTOL)
    np.testing.assert_allclose(C, np.cov(X, rowvar=False), rtol=1e-10)
    np.testing.assert_allclose(M2, (X.shape[0] - 1) * np.cov(X, rowvar=False), rtol=1e-10)


def test_frame_scatter_is_the_scatter_of_the_frame_rows():
    """Label flip's total scatter ``W^T M2 W`` equals ``sum t t^T`` over the rows in the
    whitening frame (whose centre is the features' mean)."""
    from klrelease.mechanisms.kl_certified.mechanism import frame_scatter, whitening_frame

    X, _, _ = _awkward(9)
    centre, C, M2 = _public_moments(X)
    frame = whitening_frame(centre, C)
    T = frame.to_frame(X)
    np.testing.assert_allclose(frame_scatter(frame, M2), T.T @ T, rtol=1e-9,
                               atol=1e-9 * X.shape[0])


@pytest.mark.parametrize("single", [True, False])
@pytest.mark.parametrize("radius, before", [(0.0, None), (0.8, None), (2.0, None),
                                            (np.inf, None), (2.0, 1.0)])
def test_tail_corrections_match_reference(radius, before, single, monkeypatch):
    """Only rows the clip moves add to the tail corrections: the same as summing all rows
    (to float32's rounding where the products run in single precision, exactly in double),
    each row counted at most ``tail_reach g^2 r`` from the centre (here g = 1 at radius 0.8:
    the t(3) rows beyond 2.4 count at 2.4; g = 2 at radius 2.0, the reach 24; a zero radius
    reaches nowhere). A radius that stage T's tail fit grew (2.0 from ``before`` = 1.0) keeps
    the reach of the radius before it (3), at least the radius."""
    from types import SimpleNamespace

    from klrelease.mechanisms.kl_certified import design

    if not single:
        monkeypatch.setattr(design, "SINGLE_REACH", 0.0)
    rtol = 1e-5 if single else 1e-10

    rng = np.random.default_rng(8)
    T = rng.standard_t(3, size=(4000, D))
    resp = rng.dirichlet(np.ones(K), size=T.shape[0])
    reg = SimpleNamespace(centres=rng.normal(size=(K, D)) * 0.3,
                          W=np.stack([np.eye(D) * rng.uniform(0.5, 2) for _ in range(K)]),
                          radius=np.full(K, radius),
                          reach_radius=None if before is None else np.full(K, before))
    pub = SimpleNamespace(public_rows=T, n_classes=K, n_features=D, n_samples=10 * T.shape[0],
                          _cache={}, settings=dict(design.SETTINGS), region_radius=1.0)
    E1, E2 = tail_corrections(pub, reg, resp)
    r0 = radius if before is None else before
    reach = max(design.SETTINGS["tail_reach"] * max(r0, 1.0) ** 2 * r0, radius)
    capped = 0
    for k in range(K):
        U = (T - reg.centres[k]) @ reg.W[k]
        norms = np.linalg.norm(U, axis=1)
        capped += int(np.sum(norms > reach))
        U = clip_to_norm(U, reach) if reach > 0 else np.zeros_like(U)
        V = clip_to_norm(U, radius)
        w = resp[:, k:k + 1] * 10.0
        ref1, ref2 = np.sum(w * (U - V), axis=0), (U * w).T @ U - (V * w).T @ V
        np.testing.assert_allclose(E1[k], ref1, rtol=0,
                                   atol=rtol * max(np.abs(ref1).max(), 1e-8))
        np.testing.assert_allclose(E2[k], ref2, rtol=0,
                                   atol=rtol * max(np.abs(ref2).max(), 1e-7))
    if radius == 0.8:
        assert capped > 0  # the reach bound some rows


def test_tail_corrections_count_rows_beyond_the_float_range_at_the_reach():
    """A row whose squared norm overflows (1e200 along (1, 1)), or that is infinite in the
    region's coordinates (1e308 times 2), counts at the reach in its own direction: finite
    corrections, the same as a row just beyond the reach in that direction."""
    from types import SimpleNamespace

    from klrelease.mechanisms.kl_certified import design

    def corrections(row):
        T = np.array([row, [0.1, 0.0]])
        reg = SimpleNamespace(centres=np.zeros((1, 2)), W=np.eye(2)[None] * 2.0,
                              radius=np.array([1.0]), reach_radius=None)
        pub = SimpleNamespace(public_rows=T, n_classes=1, n_features=2, n_samples=2,
                              _cache={}, settings=dict(design.SETTINGS), region_radius=1.0)
        return tail_corrections(pub, reg, np.ones((2, 1)))

    reach = design.SETTINGS["tail_reach"]
    near = corrections([reach, reach])  # 2 reach sqrt(2) out: beyond the reach
    for row in ([1e200, 1e200], [1e308, 1e308]):
        E1, E2 = corrections(row)
        assert np.all(np.isfinite(E1)) and np.all(np.isfinite(E2))
        np.testing.assert_allclose(E1, near[0], rtol=1e-6)  # float32 products
        np.testing.assert_allclose(E2, near[1], rtol=1e-6)
    u = np.full(2, reach / np.sqrt(2.0))  # at the reach along (1, 1)
    np.testing.assert_allclose(near[1][0], np.outer(u, u) * (1.0 - 1.0 / reach**2),
                               rtol=1e-6)


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 1000, 4097])
def test_column_extremes(n):
    from klrelease.rows import column_extremes

    X = np.random.default_rng(n).standard_t(2, size=(n, D)) * 10.0 ** np.arange(D)
    lo, hi = column_extremes(X)
    if n:
        np.testing.assert_array_equal(lo, X.min(axis=0))
        np.testing.assert_array_equal(hi, X.max(axis=0))
        for got, want in zip(column_extremes(np.asfortranarray(X)), (lo, hi), strict=True):
            np.testing.assert_array_equal(got, want)
    else:
        assert np.all(lo == np.inf) and np.all(hi == -np.inf)


@pytest.mark.parametrize("bounded", [False, True])
def test_gathered_rows_match_grouped_rows(bounded):
    """Every row of a sampled in-memory release is gathered by class as it is read: the same
    stage-C statistics and histograms as the rows grouped in the frame once (the region clip
    fused with the whitening frame under label flip: equal to rounding)."""
    from klrelease.domain import Domain
    from klrelease.mechanisms.kl_certified.mechanism import (
        _GatheredRows,
        _grouped_rows,
        bound_frame,
        whitening_frame,
    )

    X, y, _ = _awkward(11)
    if bounded:
        frame, clip = bound_frame(Domain("box", D, np.full(D, 995.0), np.full(D, 1020.0)))
    else:
        frame, clip = whitening_frame(*_public_moments(X)[:2]), None
    grouped = _grouped_rows(X, y, K, frame, clip)[0]
    gathered = _GatheredRows(X, y, K, frame, clip)
    rng = np.random.default_rng(3)
    fn = _RegionClip(rng.normal(size=(K, D)) * 0.2,
                     np.stack([np.diag(rng.uniform(0.5, 2.0, D)) for _ in range(K)]),
                     np.full(K, 1.5))
    for a, b in zip(grouped.stats(fn, D), gathered.stats(fn, D), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-10 * X.shape[0])
    win = Window(np.full(D, -1.0), np.full(D, 1.0))
    np.testing.assert_array_equal(gathered.histograms(win, 8), grouped.histograms(win, 8))


@pytest.mark.parametrize("fused", [False, True])
def test_two_threads_give_the_same_sums_bit_for_bit(fused, monkeypatch):
    """In memory the class blocks and the pooled pass are reduced on two threads: each class
    by one thread, block after block, and the pooled blocks added in their order, so every
    sum is the one thread's, bit for bit (here from 64 rows on, so that the awkward classes,
    an empty and a one-row one among them, take the threaded path)."""
    import klrelease.stream.moments as moments
    from klrelease.mechanisms.kl_certified.mechanism import _FusedRegionClip

    monkeypatch.setattr(moments, "THREADED_ROWS", 64)
    X, y, _ = _awkward(5)
    order, bounds = class_blocks(y, K)
    rng = np.random.default_rng(8)
    if fused:
        fn = _FusedRegionClip(rng.normal(size=(K, D)) + 1e3,
                              np.stack([np.diag(rng.uniform(0.5, 2.0, D)) for _ in range(K)]),
                              np.full(K, 1.5), np.full(D, 999.0), np.full(D, 1010.0))
    else:
        fn = _RegionClip(rng.normal(size=(K, D)) + 1e3,
                         np.stack([np.diag(rng.uniform(0.5, 2.0, D)) for _ in range(K)]),
                         np.full(K, 1.5))
    one = sorted_bounded_moments(X, bounds, fn, index=order, block=100)
    two = sorted_bounded_moments(X, bounds, fn, index=order, block=100, threads=2)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_array_equal(b, a)
    assert np.any(one[1] != 0)
    m1, lo1, hi1 = pooled_moments(X, extremes=True)
    m2, lo2, hi2 = pooled_moments(X, extremes=True, threads=2)
    for a, b in zip((m1.counts, m1.means, m1.scatters, lo1, hi1),
                    (m2.counts, m2.means, m2.scatters, lo2, hi2), strict=True):
        np.testing.assert_array_equal(b, a)
    # a map that fails on one thread fails the reduction
    def failing(T, k):
        if k == 4 and T.shape[0]:
            raise ZeroDivisionError("class 4")
        return T

    with pytest.raises(ZeroDivisionError):
        sorted_bounded_moments(X, bounds, failing, index=order, threads=2)


def test_threaded_histograms_and_class_order_are_the_one_thread_ones(monkeypatch):
    """The early stages' histograms counted on two threads and the class order sorted on a
    second thread (while the sample is read) give what one thread gives."""
    import klrelease.stream.moments as moments
    from klrelease.mechanisms.kl_certified import mechanism
    from klrelease.mechanisms.kl_certified.mechanism import _GatheredRows, whitening_frame

    X, y, _ = _awkward(9)
    order, bounds = class_blocks(y, K)
    win = Window(np.full(D, 995.0), np.full(D, 1015.0))
    rows = _MemoryRows(X, bounds, order)
    one = rows.histograms(win, 16)
    monkeypatch.setattr(moments, "THREADED_ROWS", 64)
    if mechanism.row_threads() < 2:
        pytest.skip("one core, or KLRELEASE_ROW_THREADS=1: no second thread")
    np.testing.assert_array_equal(rows.histograms(win, 16), one)
    assert one.sum() == X.shape[0] * D
    frame = whitening_frame(*_public_moments(X)[:2])
    gathered = _GatheredRows(X, y, K, frame)
    np.testing.assert_array_equal(gathered.bounds, bounds)
    np.testing.assert_array_equal(gathered.order, order)


def test_row_threads_follow_the_environment(monkeypatch):
    """``KLRELEASE_ROW_THREADS=1`` keeps one thread; any value but 1 or 2 is refused when a
    mechanism is planned, before any noise, and counts as unset during a release (where it
    must not fail it, even with warnings as errors)."""
    import warnings

    import klrelease as kr
    from klrelease._threads import row_threads

    monkeypatch.setenv("KLRELEASE_ROW_THREADS", "1")
    assert row_threads() == 1
    X, y, _ = _awkward(2)
    monkeypatch.setenv("KLRELEASE_ROW_THREADS", "two")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert row_threads() in (1, 2)
    with pytest.raises(ValueError, match="KLRELEASE_ROW_THREADS must be 1 or 2"):
        kr.plan(kr.as_labelled_data(X, y, classes=range(K), min_class_size=0), None,
                epsilon=1.0, delta=1e-5)
    monkeypatch.delenv("KLRELEASE_ROW_THREADS")
    assert row_threads() in (1, 2)


def test_a_second_thread_sets_its_own_error_state_and_is_not_needed(monkeypatch):
    """Work on a second thread starts at numpy's default error state (warn): the threaded
    reductions set their own, so an overflow in private sums shows no warning from either
    thread; and where no thread can be started the work runs on the caller's."""
    import concurrent.futures
    import warnings

    import klrelease.stream.moments as moments

    monkeypatch.setattr(moments, "THREADED_ROWS", 64)
    X, y, _ = _awkward(4)
    X[::97] = 1e300  # squares overflow in every class
    order, bounds = class_blocks(y, K)

    def square(T, k):
        return T * T

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = sorted_bounded_moments(X, bounds, square, index=order, threads=2)
        m = pooled_moments(X, extremes=True, threads=2)
    assert np.isinf(got[1]).any() and not np.isfinite(m[0].scatters).any()
    want = sorted_bounded_moments(X, bounds, square, index=order)

    def refuse(self, *args, **kwargs):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(concurrent.futures.ThreadPoolExecutor, "submit", refuse)
    again = sorted_bounded_moments(X, bounds, square, index=order, threads=2)
    for a, b in zip(want, again, strict=True):
        np.testing.assert_array_equal(b, a)


def test_a_failed_sort_of_the_labels_fails_the_plan_not_the_release(monkeypatch):
    """The sort of every label by class runs beside the rest of the plan and is settled
    before the plan is returned: a failure there is raised by ``plan``, before any noise."""
    import klrelease as kr
    from klrelease.mechanisms.kl_certified import mechanism

    n = 300_000
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(n, 2)), rng.integers(0, 2, n)
    data = kr.as_labelled_data(X, y, classes=[0, 1])
    real = mechanism.class_order

    def failing(codes, n_classes):
        if codes.shape[0] == n:
            raise MemoryError("sorting every label")
        return real(codes, n_classes)

    monkeypatch.setattr(mechanism, "class_order", failing)
    with pytest.raises(MemoryError, match="sorting every label"):
        kr.plan(data, None, epsilon=1.0, delta=1e-5, adjacency="replace-one",
                bounds=(np.full(2, -6.0), np.full(2, 6.0)))


def test_class_posteriors_on_two_threads_are_the_one_thread_ones(monkeypatch):
    """Label flip: the public rows' posteriors with each class's own covariance, the classes
    shared by two threads, equal the one-thread posteriors bit for bit; a covariance without
    a Cholesky factor still gives the fallback."""
    import klrelease as kr
    from klrelease.mechanisms.kl_certified import design

    rng = np.random.default_rng(6)
    n, d, K_ = 5000, 4, 5
    X = rng.normal(size=(n, d)) * [1.0, 3.0, 0.5, 10.0]
    y = rng.integers(0, K_, n)
    p = kr.plan(kr.as_labelled_data(X, y, classes=range(K_)), None, epsilon=1.0, delta=1e-5,
                adjacency="label-flip", design="gaussian")
    pub = p.public
    counts = np.bincount(y, minlength=K_).astype(float)
    means = rng.normal(size=(K_, d))
    covs = np.stack([np.diag(rng.uniform(0.5, 2.0, d)) for _ in range(K_)])
    monkeypatch.setattr(design, "POSTERIOR_THREADED_ROWS", 10**12)
    one = design.class_responsibilities(pub, counts, means, covs, None)
    monkeypatch.setattr(design, "POSTERIOR_THREADED_ROWS", 16)
    if design.row_threads() < 2:
        pytest.skip("one core, or KLRELEASE_ROW_THREADS=1: no second thread")
    calls = []
    real_beside = design.beside
    monkeypatch.setattr(design, "beside", lambda *a: calls.append(a) or real_beside(*a))
    two = design.class_responsibilities(pub, counts, means, covs, None)
    assert calls  # the second thread was used
    np.testing.assert_array_equal(two, one)
    fallback = np.full_like(one, 0.5)
    import warnings

    for k in (0, 3):  # a class of the caller's thread, and one of the second thread
        for value in (-np.eye(d), np.full((d, d), 1e308)):
            bad = covs.copy()
            bad[k] = value
            with warnings.catch_warnings():  # no warning from either thread's error state
                warnings.simplefilter("error")
                assert design.class_responsibilities(pub, counts, means, bad,
                                                     fallback) is fallback
