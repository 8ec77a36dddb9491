"""Streamed releases of the iid baselines and kl-paper; kl-paper's constraints in passes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import mean_noise_problems

import klrelease
from klrelease import solvers
from klrelease.neighbours import class_neighbour_vectors
from klrelease.solvers.passes import MemoryRows, solve_affine
from klrelease.stream import ArraySource, CSVSource

CLASSES = [0, 1, 2]


def _data(n=3000, d=4, K=3, seed=0, offset=10.0, sort=True):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, K, n)
    if sort:  # chunks that hold one class only and none of the others
        y = np.sort(y)
    X = rng.normal(size=(n, d)) * (1 + 0.5 * y[:, None]) + 2.0 * y[:, None] + offset
    return X, y


def _same(a, b, rtol=1e-10):
    for name in ("weights", "means", "covariances"):
        A, B = getattr(a.gmm, name), getattr(b.gmm, name)
        np.testing.assert_allclose(B, A, rtol=rtol, atol=rtol * np.max(np.abs(A)))


def _release(X, y, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return klrelease.release(X, y, epsilon=1.0, delta=1e-6, seed=7, classes=CLASSES, **kw)


BASELINES = [
    ("gaussian-iid", {"bounds": ([4.0] * 4, [20.0] * 4)}),
    ("gaussian-iid", {"norm_bound": 30.0, "adjacency": "replace-one"}),
    ("laplace-iid", {"norm_bound": 30.0}),
    ("colored-gaussian", {"bounds": "features", "design": "public"}),
    ("colored-gaussian", {"bounds": ([4.0] * 4, [20.0] * 4), "design": "data"}),
    ("r1smg", {"bounds": "features"}),
]


@pytest.mark.parametrize("mechanism,extra", BASELINES)
def test_baselines_stream_to_the_in_memory_release(mechanism, extra):
    X, y = _data()
    a = _release(X, y, mechanism=mechanism, **extra)
    b = _release(ArraySource(X, y, chunk_rows=401), None, mechanism=mechanism, **extra)
    _same(a, b)
    assert a.options == b.options  # nothing about the chunking in the artifact


def test_streamed_baseline_clips_every_chunk_and_refuses_small_classes_alike():
    X, y = _data(n=600)
    X[::50] *= 100.0  # rows far outside the public box: clipped per chunk
    box = {"bounds": ([4.0] * 4, [20.0] * 4)}
    _same(_release(X, y, mechanism="gaussian-iid", **box),
          _release(ArraySource(X, y, chunk_rows=64), None, mechanism="gaussian-iid", **box))
    y_small = y.copy()
    y_small[y_small == 2] = 1
    y_small[-3:] = 2  # a class of 3 rows: fewer than d + 1
    with pytest.raises(ValueError) as mem:
        _release(X, y_small, mechanism="gaussian-iid", **box)
    with pytest.raises(ValueError) as streamed:
        _release(ArraySource(X, y_small, chunk_rows=64), None, mechanism="gaussian-iid", **box)
    assert str(streamed.value) == str(mem.value)


@pytest.mark.parametrize("extra", [{}, {"adjacency": "remove-one", "norm_bound": 25.0}])
def test_kl_paper_streams_to_the_in_memory_release(extra):
    X, y = _data(n=5000)
    a = _release(X, y, mechanism="kl-paper", **extra)
    b = _release(ArraySource(X, y, chunk_rows=777), None, mechanism="kl-paper", **extra)
    _same(a, b, rtol=1e-9)
    assert b.options["data"] == "streamed in chunks"
    assert b.solver.status == "optimal"


def test_active_set_on_chunked_rows_reaches_the_in_memory_design():
    X, y = _data(n=20_000, d=5, offset=1e3, sort=False)
    st, A, rows, gram = mean_noise_problems(X, y, 3)
    small_pool = 60  # several passes: the pools miss rows that only later violate
    source = ArraySource(X, y, classes=CLASSES, chunk_rows=4099)
    passes = []
    scan = source.scan
    source.scan = lambda *a: passes.append(1) or scan(*a)
    mem = solve_affine(A, rows, gram, MemoryRows(X, y, block_rows=3001), pool=small_pool,
                       origin=X.mean(0))
    src = solve_affine(A, rows, gram, source, pool=small_pool, origin=X.mean(0))
    assert len(passes) >= 3
    for k in range(3):
        V = class_neighbour_vectors(X, y, k, st.means[k], int(st.counts[k]))
        np.testing.assert_allclose(gram[k], V.T @ V, rtol=1e-9)
        ref = solvers.mean_noise_sdp(A[k], V, solver="native")
        for res in (mem[k], src[k]):
            assert solvers.max_violation(res.G, V) <= 1e-9  # feasible for every row
            assert res.objective <= ref.objective * (1 + 1e-6)  # and optimal
            assert res.objective >= ref.objective * (1 - 1e-6)
            assert 0 <= res.gap <= 1e-6
        np.testing.assert_allclose(src[k].G, mem[k].G, rtol=1e-9, atol=1e-9 * np.abs(
            mem[k].G).max())
        assert src[k].n_constraints == mem[k].n_constraints


def test_kl_paper_through_dask_on_a_local_cluster():
    da = pytest.importorskip("dask.array")
    distributed = pytest.importorskip("distributed")
    X, y = _data(n=4000)
    ref = _release(X, y, mechanism="kl-paper")
    box = {"bounds": ([4.0] * 4, [20.0] * 4)}
    ref_iid = _release(X, y, mechanism="gaussian-iid", **box)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        Xd, yd = da.from_array(X, chunks=(900, 4)), da.from_array(y, chunks=900)
        on_cluster = _release(Xd, yd, mechanism="kl-paper", client=client)
        iid = _release(Xd, yd, mechanism="gaussian-iid", client=client, **box)
    _same(ref, on_cluster, rtol=1e-9)
    _same(ref_iid, iid)


def _write_csv(path, X, y):
    with path.open("w") as fh:
        fh.write("a,b,label,c,e\n")
        for row, lab in zip(X, y, strict=True):
            a, b, c, e = (float(v) for v in row[:4])
            fh.write(f"{a!r},{b!r},c{lab},{c!r},{e!r}\n")


def test_cli_release_csv_streams_in_blocks(tmp_path, monkeypatch):
    from klrelease.artifact import Release
    from klrelease.cli import main

    X, y = _data(n=2000)
    _write_csv(tmp_path / "d.csv", X, y)
    monkeypatch.chdir(tmp_path)
    blocks = []
    chunks = CSVSource.chunks

    def counted(self):
        for part in chunks(self):
            blocks.append(part[0].shape[0])
            yield part

    monkeypatch.setattr(CSVSource, "chunks", counted)
    monkeypatch.setattr("klrelease.data.load_csv", lambda *a, **k: pytest.fail("loaded"))
    base = ["release", "--epsilon", "1", "--delta", "1e-6", "--seed", "7", "--csv", "d.csv",
            "--label-column", "label", "--classes", "c0,c1,c2"]
    assert main([*base, "--out", "a.json"]) == 0
    assert blocks  # read by the release, block by block
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = klrelease.release(X, np.array([f"c{v}" for v in y]), epsilon=1.0, delta=1e-6,
                                seed=7, classes=["c0", "c1", "c2"])
    a = Release.load(tmp_path / "a.json")
    for name in ("weights", "means", "covariances"):
        np.testing.assert_allclose(getattr(a.gmm, name), getattr(ref.gmm, name), rtol=1e-6,
                                   atol=1e-9)
    assert a.feature_names == ["a", "b", "c", "e"]


@pytest.mark.parametrize("body,message", [
    ("1.5,2,c0,3,4\n7.25,secret42,c1,3,4\n", "every column except 'label' must be numeric"),
    ("1.5,2,c0,3,4\n7.25,3,c1\n", "has rows with a different number of fields"),
])
def test_cli_release_csv_errors_as_in_memory_without_values(tmp_path, monkeypatch, capsys,
                                                             body, message):
    from klrelease.cli import main
    from klrelease.data import load_csv

    (tmp_path / "bad.csv").write_text("a,b,label,c,e\n" + body)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as mem:
        load_csv("bad.csv", "label")
    code = main(["release", "--epsilon", "1", "--delta", "1e-6", "--csv", "bad.csv",
                 "--label-column", "label", "--classes", "c0,c1", "--out", "r.json"])
    err = capsys.readouterr().err
    assert code == 2 and message in str(mem.value)
    assert str(mem.value) in " ".join(err.split())
    assert "secret42" not in err and "7.25" not in err
    assert not (tmp_path / "r.json").exists()


def test_csv_with_a_byte_order_mark_and_repeated_names_in_memory_and_streamed(
        tmp_path, monkeypatch, capsys):
    # spreadsheets write a UTF-8 byte-order mark before the header: the streamed reader
    # raised KeyError('Field "\ufeffa" ...') with a traceback, and load_csv named the first
    # feature "\ufeffa"; a repeated column name raised KeyError too
    from klrelease.artifact import Release
    from klrelease.cli import main
    from klrelease.data import load_csv

    rows = "".join(f"{i % 7},{(3 * i) % 5},{'xy'[i % 2]}\n" for i in range(40))
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + ("a,b,label\n" + rows).encode())
    (tmp_path / "twice.csv").write_text("a,a,label\n" + rows)
    monkeypatch.chdir(tmp_path)
    X, y, names = load_csv("bom.csv", "label")
    assert names == ["a", "b"] and X.shape == (40, 2)
    code = main(["release", "--epsilon", "1", "--delta", "1e-6", "--csv", "bom.csv",
                 "--label-column", "label", "--classes", "x,y", "--out", "r.json"])
    assert code == 0 and Release.load(tmp_path / "r.json").feature_names == ["a", "b"]
    with pytest.raises(ValueError, match="more than one column named 'a'"):
        load_csv("twice.csv", "label")
    capsys.readouterr()
    code = main(["release", "--epsilon", "1", "--delta", "1e-6", "--csv", "twice.csv",
                 "--label-column", "label", "--classes", "x,y", "--out", "t.json"])
    err = capsys.readouterr().err
    assert code == 2 and "more than one column named 'a'" in " ".join(err.split())
    assert "Traceback" not in err and not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("pool,n_passes", [(40, None), (400, 1), (3000, 1)])
def test_a_pool_that_bounds_the_other_rows_certifies_without_another_pass(pool, n_passes):
    # the first pass ranks the rows; when its pool's smallest score bounds every row left out
    # (after the change of quadratic form), the solution on the pool is proven feasible for
    # all rows without a pass that scores them against it. A small pool needs more passes,
    # and the certificate stays the largest score over every row.
    X, y = _data(n=30_000, d=5, offset=1e3, sort=False)
    st, A, rows, gram = mean_noise_problems(X, y, 3)
    for data in (MemoryRows(X, y, block_rows=3001),
                 ArraySource(X, y, classes=CLASSES, chunk_rows=4099)):
        passes = []
        scan = data.scan
        data.scan = lambda *a, scan=scan, passes=passes: passes.append(1) or scan(*a)
        res = solve_affine(A, rows, gram, data, pool=pool, origin=X.mean(0))
        if n_passes is None:
            assert len(passes) >= 3
        else:
            assert len(passes) == n_passes
        for k in range(3):
            V = class_neighbour_vectors(X, y, k, st.means[k], int(st.counts[k]))
            ref = solvers.mean_noise_sdp(A[k], V, solver="native")
            # the certificate is the largest score over every row, not only the pooled ones
            assert res[k].backend_violation == pytest.approx(
                solvers.max_violation(res[k].G, V), abs=1e-12)
            assert solvers.max_violation(res[k].G, V) <= 1e-9
            np.testing.assert_allclose(res[k].objective, ref.objective, rtol=1e-6)


def test_kl_paper_streams_classes_far_apart_relative_to_their_spread(monkeypatch):
    """Classes 1e5 within-class standard deviations apart: the neighbour rows are flat but
    span the space; passes solve them (as the rows in memory do) instead of refusing."""
    from klrelease.solvers import reduction

    monkeypatch.setattr(reduction, "HULL_MAX_ROWS", 1000)  # no reading into memory
    monkeypatch.setattr(reduction, "DIRECT_MAX_ROWS", 1000)  # passes, not the rows at once
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 3000)
    X = rng.normal(size=(3000, 4)) + 1e5 * y[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mem = klrelease.release(X, y, classes=[0, 1, 2], mechanism="kl-paper", epsilon=1.0,
                                delta=1e-6, seed=1)
        streamed = klrelease.release(ArraySource(X, y, classes=[0, 1, 2]), None,
                                     mechanism="kl-paper", epsilon=1.0, delta=1e-6, seed=1)
    true = np.stack([X[y == k].mean(axis=0) for k in range(3)])
    err = np.abs(mem.gmm.means - true)
    assert np.max(np.abs(streamed.gmm.means - mem.gmm.means) / err) < 1e-3


@pytest.mark.parametrize("located", [False, True])
def test_stage_c_map_of_raw_rows_in_a_box_is_the_chain_of_its_maps(located):
    """Replace-one with a box: the fused map of raw rows (one clip into a box, one product)
    gives the values of the bound's frame and clip, the located frame and the region clip
    applied one after the other, rows far outside the box included."""
    from klrelease.domain import Domain
    from klrelease.mechanisms.kl_certified.locate import Located
    from klrelease.mechanisms.kl_certified.mechanism import (
        _fused_in_box,
        _InFrame,
        _Located,
        _raw_map,
        _RegionClip,
        bound_frame,
    )

    rng = np.random.default_rng(7)
    d, K = 4, 2
    lo, hi = np.array([-3.0, 0.0, 10.0, -1e3]), np.array([5.0, 2.0, 50.0, 1e3])
    frame, clip = bound_frame(Domain("box", d, lo, hi))
    A = rng.normal(size=(K, d, d))
    W = A @ np.swapaxes(A, 1, 2) + np.eye(d)
    fn = _RegionClip(rng.normal(scale=0.3, size=(K, d)), W, np.array([1.5, 4.0]))
    if located:
        fn = _Located(fn, Located(np.array([0.1, -0.2, 0.0, 0.3]), np.array([0.2, 0.5, 1.0, 0.01]),
                                  np.array([-3.0, -np.inf, -1.0, -5.0]),
                                  np.array([2.0, 1.0, np.inf, 5.0])))
    X = (lo + hi) / 2 + (hi - lo) * rng.normal(scale=0.8, size=(500, d))
    fused = _fused_in_box(fn, frame, clip)
    assert fused is not None and isinstance(_raw_map(fn, frame, clip), type(fused))
    chain = _InFrame(fn, frame, clip)
    for k in range(K):
        np.testing.assert_allclose(fused(X, k), chain(X, k), rtol=1e-12, atol=1e-12)
    # a ball is not a box: its clip is not per feature, and the chain stays
    ball_frame, ball_clip = bound_frame(Domain.ball(3.0, d))
    assert _fused_in_box(fn, ball_frame, ball_clip) is None
    assert isinstance(_raw_map(fn, ball_frame, ball_clip), _InFrame)
    # a located box that leaves a feature no interval falls back to the chain
    if located:
        empty = _Located(fn.fn, Located(fn.located.centre, fn.located.scale,
                                        np.full(d, 20.0), np.full(d, 30.0)))
        assert _fused_in_box(empty, frame, clip) is None


def test_pooled_moments_in_one_pass_match_two_passes():
    from klrelease.stream.moments import pooled_moments

    rng = np.random.default_rng(3)
    # rows in an order whose first block is far from the mean (the shift), at large offsets
    X = np.sort(rng.standard_t(3, size=(30000, 3)) * [1.0, 1e3, 1e-3] + [1e9, -5.0, -1e9],
                axis=0)
    m, lo, hi = pooled_moments(X, extremes=True)
    # the reference: differences from the first row (exact in float64 here), then long double
    D = (X - X[0]).astype(np.longdouble)
    dm = D.mean(axis=0)
    scatter = (D.T @ D - X.shape[0] * np.outer(dm, dm)).astype(float)
    ref_mean = (X[0] + dm).astype(float)  # to the rounding of values of this size
    assert np.all(np.abs(m.means[0] - ref_mean) <= 2 * np.spacing(np.abs(X).max(axis=0)))
    np.testing.assert_allclose(m.scatters[0], scatter, rtol=1e-12)
    np.testing.assert_array_equal(lo, X.min(axis=0))
    np.testing.assert_array_equal(hi, X.max(axis=0))
    assert m.counts[0] == X.shape[0]
