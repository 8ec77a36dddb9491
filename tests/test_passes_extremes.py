"""kl-paper's SDP passes on each class's extreme rows: same optimum, exact certificate."""

import math
import warnings

import numpy as np
import pytest
from conftest import mean_noise_problems

import klrelease
from klrelease import solvers
from klrelease.mechanisms.kl_paper.objective import log_num_compositions, uniform_xlogx
from klrelease.neighbours import class_neighbour_vectors
from klrelease.solvers import passes
from klrelease.solvers.passes import (
    ClassFrames,
    MemoryRows,
    extreme_rows,
    solve_affine,
)
from klrelease.statistics import class_statistics, grouped_class_statistics
from klrelease.stream import ArraySource


def _data(n, d=5, K=4, seed=0, offset=0.0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(K, d)) + offset
    y = rng.integers(0, K, n)
    shapes = rng.normal(size=(K, d, d)) / np.sqrt(d) + np.eye(d)
    X = centres[y] + np.einsum("ni,nij->nj", rng.normal(size=(n, d)), shapes[y])
    return X, y


def _problems(X, y, K):
    st, A, rows, gram = mean_noise_problems(X, y, K)
    frames = ClassFrames.whitening(st.counts.astype(float), st.means, st.covariances)
    return st, A, rows, gram, frames


def _counted(source):
    reads = []
    scan = source.scan
    source.scan = lambda *a, **k: reads.append(1) or scan(*a, **k)
    return reads


@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_extreme_rows_reach_the_optimum_of_passes_over_every_row(offset):
    K = 4
    X, y = _data(30_000, K=K, offset=offset)
    st, A, rows, gram, frames = _problems(X, y, K)
    origin = X.mean(0)
    every = solve_affine(A, rows, gram, MemoryRows(X, y, block_rows=3001), origin=origin)
    source = ArraySource(X, y, classes=list(range(K)), chunk_rows=4099)
    reads = _counted(source)
    # about 1/16 of each class kept: the balls of the rows left out prove every problem
    ext = solve_affine(A, rows, gram, source, origin=origin, frames=frames, extremes_from=0)
    assert len(reads) == 1  # the pass keeping the extreme rows; no pass over every row
    for k in range(K):
        V = class_neighbour_vectors(X, y, k, st.means[k], int(st.counts[k]))
        ref = solvers.mean_noise_sdp(A[k], V, solver="native")
        # the certificate is the exact maximum over every row, not only the rows kept
        assert abs(solvers.max_violation(ext[k].G, V) - ext[k].max_violation) <= 1e-12
        assert ext[k].max_violation <= 1e-9
        assert ext[k].objective == pytest.approx(ref.objective, rel=1e-6)
        assert ext[k].objective == pytest.approx(every[k].objective, rel=1e-6)
        np.testing.assert_allclose(ext[k].G, every[k].G, rtol=0,
                                   atol=1e-4 * np.abs(every[k].G).max())


@pytest.mark.parametrize("unproven", ["balls", "too few rows"])
def test_unproven_extremes_fall_back_to_passes_over_every_row(monkeypatch, unproven):
    K = 3
    X, y = _data(12_000, K=K, seed=3)
    st, A, rows, gram, frames = _problems(X, y, K)
    source = ArraySource(X, y, classes=list(range(K)), chunk_rows=2500)
    reads = _counted(source)
    extremes = None
    if unproven == "balls":
        monkeypatch.setattr(passes._Problem, "ball_bound", lambda *a: np.inf)
    else:  # 4 d rows per class, whose balls hold nearly all of the class
        extremes = 1
    res = solve_affine(A, rows, gram, source, origin=X.mean(0), frames=frames,
                       extremes=extremes, extremes_from=0)
    assert len(reads) >= 2  # the extreme rows, then passes over every row
    for k in range(K):
        V = class_neighbour_vectors(X, y, k, st.means[k], int(st.counts[k]))
        assert abs(solvers.max_violation(res[k].G, V) - res[k].max_violation) <= 1e-12
        ref = solvers.mean_noise_sdp(A[k], V, solver="native")
        assert res[k].objective == pytest.approx(ref.objective, rel=1e-6)


def test_extreme_rows_do_not_depend_on_chunking_or_order():
    K = 4
    X, y = _data(20_000, K=K, seed=1)
    st, _, _, _, frames = _problems(X, y, K)
    perm = np.random.default_rng(2).permutation(X.shape[0])
    got = [extreme_rows(ArraySource(Xp, yp, classes=list(range(K)), chunk_rows=c), frames,
                        rows=4000)
           for Xp, yp, c in ((X, y, 777), (X, y, 20_000), (X[perm], y[perm], 3001))]
    key = [np.lexsort(np.column_stack([g.X, g.codes]).T) for g in got]
    for g, o in zip(got[1:], key[1:], strict=True):
        np.testing.assert_array_equal(g.X[o], got[0].X[key[0]])
        np.testing.assert_array_equal(g.codes[o], got[0].codes[key[0]])
        np.testing.assert_array_equal(g.radii2, got[0].radii2)
    g = got[0]
    for k in range(K):  # every row left out lies in its class's ball, every row kept outside
        Z = (X[y == k] - frames.centres[k]) @ frames.frames[k]
        r2 = np.einsum("ij,ij->i", Z, Z)
        kept = g.codes == k
        assert 0 < kept.sum() <= np.ceil(st.counts[k] * 4000 / X.shape[0])
        assert np.sum(r2 > g.radii2[k]) == kept.sum()
    # rows in memory, grouped by class: a floor from a strided sample, fewer rows copied;
    # the rows left out still lie in the balls
    _, Xg, yg = grouped_class_statistics(X, y, K)
    mem = extreme_rows(MemoryRows(Xg, yg, block_rows=4096), frames, rows=4000)
    for k in range(K):
        Z = (X[y == k] - frames.centres[k]) @ frames.frames[k]
        r2 = np.einsum("ij,ij->i", Z, Z)
        assert np.sum(r2 > mem.radii2[k]) == np.sum(mem.codes == k) > 0


def test_ball_bound_is_the_maximum_over_the_ball():
    rng = np.random.default_rng(4)
    for d in (1, 2, 3):
        for _ in range(20):
            a, M, r2 = rng.normal(size=d), rng.normal(size=(d, d)), float(rng.exponential())
            bound = passes._ball_bound(a, M, r2)
            if d == 1:
                best = max((a[0] + s * np.sqrt(r2) * M[0, 0]) ** 2 for s in (-1, 1))
            else:  # the maximum lies on the sphere: dense directions
                E = rng.normal(size=(200_000 if d == 3 else 20_000, d))
                E *= np.sqrt(r2) / np.linalg.norm(E, axis=1)[:, None]
                best = float(np.max(np.sum((a + E @ M) ** 2, axis=1)))
            assert bound >= best * (1 - 1e-12)
            assert bound <= best * (1 + (1e-3 if d == 3 else 1e-6))
    assert passes._ball_bound(np.ones(3), np.eye(3), 0.0) == 3.0


def test_grouped_statistics_are_the_statistics_bit_for_bit():
    X, y = _data(5000, K=3, seed=5)
    st = class_statistics(X, y, 3)
    gst, Xg, yg = grouped_class_statistics(X, y, 3)
    for name in ("counts", "means", "covariances"):
        np.testing.assert_array_equal(getattr(gst, name), getattr(st, name))
    assert np.all(np.diff(yg) >= 0)
    order = np.argsort(y, kind="stable")
    np.testing.assert_array_equal(Xg, X[order])
    np.testing.assert_array_equal(yg, y[order])


@pytest.mark.parametrize("N,K", [(50, 3), (2000, 4), (30_000, 10)])
def test_uniform_xlogx_matches_the_exact_sum(N, K):
    D = math.comb(N - 1, K - 1)
    exact = math.fsum(math.comb(N - m - 1, K - 2) / D * (m / N) * math.log(m / N)
                      for m in range(1, N - K + 2))
    assert uniform_xlogx(N, K) == pytest.approx(exact, rel=1e-13)
    assert log_num_compositions(N, K) == pytest.approx(math.log(D), rel=1e-12)


def test_kl_paper_release_with_extreme_rows_is_the_release_without(monkeypatch):
    X, y = _data(20_000, d=4, K=3, seed=6)
    kw = dict(epsilon=1.0, delta=1e-6, mechanism="kl-paper", seed=11)

    def release():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # seeded
            return klrelease.release(X, y, **kw)

    monkeypatch.setattr(passes, "EXTREMES_FROM", 10**12)  # passes over every row
    before = release()
    monkeypatch.setattr(passes, "EXTREMES_FROM", 0)  # the extreme rows first
    calls = []
    original = passes.extreme_rows
    monkeypatch.setattr(passes, "extreme_rows", lambda *a, **k: calls.append(1) or original(
        *a, **k))
    after = release()
    assert calls
    for name in ("weights", "means", "covariances"):
        a, b = getattr(before.gmm, name), getattr(after.gmm, name)
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6 * np.abs(a).max())


@pytest.mark.parametrize("extra", [{}, {"adjacency": "remove-one", "norm_bound": 12.0}])
def test_kl_paper_streams_on_extreme_rows_to_the_in_memory_release(extra):
    X, y = _data(80_000, d=4, K=3, seed=8)  # above EXTREMES_FROM: the extreme rows first
    kw = dict(epsilon=1.0, delta=1e-6, mechanism="kl-paper", seed=3, classes=[0, 1, 2],
              **extra)
    source = ArraySource(X, y, classes=[0, 1, 2], chunk_rows=9000)
    reads = _counted(source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seeded
        mem = klrelease.release(X, y, **kw)
        streamed = klrelease.release(source, None, **kw)
    assert len(reads) == 2  # the statistics, the extreme rows (rows clipped in both)
    for name in ("weights", "means", "covariances"):
        a, b = getattr(mem.gmm, name), getattr(streamed.gmm, name)
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6 * np.abs(a).max())
