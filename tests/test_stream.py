"""Streaming statistics, chunked sources and streamed kl-certified releases."""

from __future__ import annotations

import contextlib
import functools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import klrelease
from klrelease.mechanisms.base import Plan
from klrelease.statistics import class_statistics
from klrelease.stream import (
    ArraySource,
    ClassMoments,
    CSVSource,
    ParquetSource,
    bounded_class_moments,
    chunk_moments,
)
from klrelease.stream.sample import FarRows, RowSample, far_rows, public_strata, sample_rows

CLASSES = [0, 1, 2]


def _data(n=3000, d=3, K=3, seed=0, offset=0.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, K, n)
    X = rng.normal(size=(n, d)) * (1 + y[:, None]) + y[:, None] * 2.0 + offset
    return X, y


def _merge_chunks(X, codes, K, cuts, f=None):
    parts = [chunk_moments(X[a:b], codes[a:b], K, f) for a, b in zip(cuts[:-1], cuts[1:],
                                                                     strict=True)]
    return functools.reduce(ClassMoments.merge, parts)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), K=st.integers(1, 4), d=st.integers(1, 4),
       seed=st.integers(0, 10_000), n_cuts=st.integers(0, 12), sort=st.booleans())
def test_streamed_moments_equal_in_memory(n, K, d, seed, n_cuts, sort):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, K, n)
    if sort:  # chunks that hold one class only, and none of the others
        codes = np.sort(codes)
    X = rng.normal(size=(n, d)) * 3.0 + rng.normal(size=d) * 10
    cuts = np.unique(np.concatenate([[0, n], rng.integers(0, n + 1, n_cuts)]))
    m = _merge_chunks(X, codes, K, cuts)
    for k in range(K):
        rows = X[codes == k]
        assert m.counts[k] == rows.shape[0]
        if rows.shape[0]:
            np.testing.assert_allclose(m.means[k], rows.mean(axis=0), rtol=1e-10, atol=1e-10)
            C = rows - rows.mean(axis=0)
            np.testing.assert_allclose(m.scatters[k], C.T @ C, rtol=1e-9, atol=1e-9)
            second = m.scatters[k] + m.counts[k] * np.outer(m.means[k], m.means[k])
            np.testing.assert_allclose(second, rows.T @ rows, rtol=1e-9,
                                       atol=1e-9)
        else:
            assert np.all(m.means[k] == 0) and np.all(m.scatters[k] == 0)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 200), seed=st.integers(0, 10_000), n_cuts=st.integers(0, 8),
       sort=st.booleans())
def test_bounded_moments_apply_the_map_per_class(n, seed, n_cuts, sort):
    rng = np.random.default_rng(seed)
    K, d = 3, 3
    codes = rng.integers(0, K, n)
    if sort:  # chunks holding one class only
        codes = np.sort(codes)
    X = rng.normal(size=(n, d)) * 4.0
    shift = rng.normal(size=(K, d)) * 3.0
    seen = []

    def fn(T, k):
        seen.append(k)
        return np.minimum(np.abs(T - shift[k]), 2.0)  # bounded rows

    cuts = np.unique(np.concatenate([[0, n], rng.integers(0, n + 1, n_cuts)]))
    parts = [bounded_class_moments(X[a:b], codes[a:b], K, fn)
             for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    counts, sums, second = (sum(p[i] for p in parts) for i in range(3))
    for k in range(K):
        U = np.minimum(np.abs(X[codes == k] - shift[k]), 2.0)
        assert counts[k] == U.shape[0]
        np.testing.assert_allclose(sums[k], U.sum(axis=0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(second[k], U.T @ U, rtol=1e-12, atol=1e-12)
    assert set(seen) <= set(range(K))


def test_class_statistics_agree():
    X, y = _data(n=5000)
    m = ArraySource(X, y, classes=CLASSES, chunk_rows=333).moments()
    ref = class_statistics(X, y, 3)
    np.testing.assert_array_equal(m.counts, ref.counts)
    np.testing.assert_allclose(m.means, ref.means, rtol=1e-12)
    np.testing.assert_allclose(m.scatters / (m.counts[:, None, None] - 1), ref.covariances,
                               rtol=1e-10)


def test_accuracy_at_large_n_with_a_common_offset():
    """1e8 rows at offset 1e6 (simulated by merging 1000 partials of 1e5 rows): the variance
    keeps its accuracy; the raw second moment in float64 would keep none of it."""
    rng = np.random.default_rng(1)
    offset, d, K = 1e6, 2, 2
    block = rng.normal(size=(100_000, d))
    codes = rng.integers(0, K, 100_000)
    base = chunk_moments(block + offset, codes, K)
    acc = ClassMoments(np.zeros(K), np.zeros((K, d)), np.zeros((K, d, d)))
    for i in range(1000):  # each partial shifted by a small known amount
        part = ClassMoments(base.counts.copy(), base.means + 1e-3 * (i % 7), base.scatters)
        acc = acc.merge(part)
    shifts = 1e-3 * (np.arange(1000) % 7)
    for k in range(K):
        rows = block[codes == k]
        n_k = rows.shape[0]
        C = rows - rows.mean(axis=0)
        exact = 1000 * (C.T @ C) + n_k * np.sum((shifts - shifts.mean()) ** 2) * np.ones((d, d))
        np.testing.assert_allclose(acc.scatters[k], exact, rtol=1e-8)
        np.testing.assert_allclose(acc.means[k], rows.mean(axis=0) + offset + shifts.mean(),
                                   rtol=1e-14)
    assert acc.counts.sum() == 1e8


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 400), size=st.integers(1, 120), n_cuts=st.integers(0, 6),
       seed=st.integers(0, 10_000))
def test_row_sample_is_the_same_however_the_rows_are_read(n, size, n_cuts, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    want = sample_rows(X, size)
    assert want.shape[0] == min(n, size)
    cuts = np.unique(np.concatenate([[0, n], rng.integers(0, n + 1, n_cuts)]))
    parts = [RowSample.of(X[a:b], int(a), size) for a, b in zip(cuts[:-1], cuts[1:],
                                                                 strict=True)]
    rng.shuffle(parts)
    acc = parts[0]
    for p in parts[1:]:
        acc = acc.merge(p)
    np.testing.assert_array_equal(acc.values(), want)
    if n <= size:  # every row
        np.testing.assert_array_equal(np.sort(want, axis=0), np.sort(X, axis=0))


def _merge_randomly(parts, rng):
    """Partial states merged in a random tree, either order, some trimmed first (as Dask
    merges them)."""
    parts = list(parts)
    while len(parts) > 1:
        i = int(rng.integers(0, len(parts) - 1))
        a, b = parts[i], parts[i + 1]
        if rng.random() < 0.5:
            a, b = b, a
        if rng.random() < 0.3:
            a.trim()
        parts[i:i + 2] = [a.merge(b)]
    return parts[0]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 600), size=st.integers(1, 60), n_cuts=st.integers(0, 40),
       seed=st.integers(0, 10_000))
def test_labelled_row_sample_is_the_same_for_any_merge_tree(n, size, n_cuts, seed):
    """Partial samples merged in any tree and either order (as Dask merges them), some
    trimmed first, empty parts included: the same rows and class codes as in memory."""
    from klrelease.stream.sample import sample_indices

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    codes = rng.integers(0, 4, n)
    cuts = np.concatenate([[0, n], rng.integers(0, n + 1, n_cuts)])
    cuts.sort()  # repeated cuts: empty parts
    parts = [RowSample.of(X[a:b], int(a), size, codes[a:b])
             for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    got_X, got_codes = _merge_randomly(parts, rng).labelled()
    idx = sample_indices(n, size)
    np.testing.assert_array_equal(got_X, X[idx])
    np.testing.assert_array_equal(got_codes, codes[idx])


def _far_brute_force(X, m):
    """The far stratum by its definition: per feature, the rows strictly above its m-th
    largest value or below its m-th smallest (every row when there are fewer than m), by
    their priorities."""
    from klrelease.stream.sample import row_priorities

    n = X.shape[0]
    pri = row_priorities(0, n)
    if n < m:
        return set(pri.tolist())
    want = set()
    for j in range(X.shape[1]):
        x = np.sort(X[:, j])
        want |= set(pri[(X[:, j] > x[n - m]) | (X[:, j] < x[m - 1])].tolist())
    return want


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000), m=st.integers(1, 40), d=st.integers(1, 4),
       n_cuts=st.integers(0, 12), seed=st.integers(0, 10_000))
def test_far_stratum_is_each_features_extremes_for_any_merge_tree(n, m, d, n_cuts, seed):
    """The far stratum: the rows beyond each feature's m-th largest and m-th smallest values
    (rows tied with them left out, whatever their number), the same set from any chunking
    and any merge tree, in order with cuts (as in memory) or in any order (as Dask merges),
    and from a sample's thresholds in one pass."""
    rng = np.random.default_rng(seed)
    X = rng.standard_t(2.0, size=(n, d))
    X[:, 0] = np.round(X[:, 0])  # many ties
    if d > 1:
        X[:, 1] = rng.random(n) < 0.05  # a rare binary feature: all its extremes tie
    want = _far_brute_force(X, m)
    got, rows = far_rows(X, m, block=int(rng.integers(1, 700)))
    assert set(got.tolist()) == want and rows.shape == (len(want), d)
    if n >= m:  # at most m - 1 rows a side of each feature
        assert len(want) <= 2 * d * (m - 1)
    from klrelease.stream.sample import sample_indices

    # one pass from a sample's thresholds (too few candidates on a side: its exact value)
    for size in (5, 200):
        by_sample = far_rows(X, m, sample=X[sample_indices(n, size)])
        np.testing.assert_array_equal(by_sample[0], got)
        np.testing.assert_array_equal(by_sample[1], rows)
    cuts = np.concatenate([[0, n], rng.integers(0, n + 1, n_cuts)])
    cuts.sort()
    parts = [FarRows.of(X[a:b], int(a), m) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    pri, R = _merge_randomly(parts, rng).rows()
    assert set(pri.tolist()) == want
    from klrelease.stream.sample import row_priorities

    index = {int(p): i for i, p in enumerate(row_priorities(0, n))}
    np.testing.assert_array_equal(R, X[[index[int(p)] for p in pri]])


def test_far_stratum_keeps_its_rows_when_units_change_and_counts_every_row_once():
    """Large chunks (each reduced to its candidates by a subsample threshold) give the exact
    set; a feature's units (scale, sign, shift) do not change it; the public row set weighs
    the far rows one each and the others' sample so that the weights sum to N."""
    from klrelease.stream.sample import sample_indices

    rng = np.random.default_rng(3)
    n, m = 300_000, 50
    X = rng.standard_t(2.5, size=(n, 3))
    got = far_rows(X, m)[0]
    assert set(got.tolist()) == _far_brute_force(X, m)
    np.testing.assert_array_equal(far_rows(X, m, sample=X[sample_indices(n, 4000)])[0], got)
    Z = X * np.array([1e4, -1e-3, 1.0]) + np.array([5.0, 0.0, -7.0])
    np.testing.assert_array_equal(far_rows(Z, m)[0], got)
    from klrelease.stream.sample import priorities_of

    idx = sample_indices(n, 4000)
    rows, w, k = public_strata(n, (priorities_of(idx), X[idx]), far_rows(X, m))
    assert k == 4000 and rows.shape[0] == w.shape[0] > 4000
    assert abs(w.sum() - n) < 1e-6 * n
    far = w == 1.0
    assert far.sum() == got.size  # every far row once (in the sample or after it)
    # a tail sum: the far rows counted themselves, the rest by the sample, N rows in all
    q = np.sum(X**2, axis=1)
    top = np.sort(q)[-20:].sum()
    assert abs(w[far] @ np.sum(rows[far] ** 2, axis=1) - np.sum(q[np.isin(
        priorities_of(np.arange(n)), got)])) < 1e-9 * top
    # at most the sample's size: every row, no weights
    assert public_strata(3000, (priorities_of(np.arange(3000)), X[:3000]),
                         far_rows(X[:3000], m))[1] is None
    # every sampled row in the stratum: none stands for the others, the sample alone
    top = got[:2]
    one = public_strata(n, (top, X[[int(np.flatnonzero(priorities_of(np.arange(n)) == t)[0])
                                    for t in top]]), far_rows(X, m))
    assert one[1] is None and one[0].shape[0] == 2


def test_far_stratum_leaves_tied_values_to_the_sample():
    """A rare binary feature beside a heavy-tailed one: its extremes all tie, so none of its
    rows is in the far stratum, and the public row set still counts its ones without bias
    (a tie broken by the sample's own hash would put the sampled ones in the stratum and
    leave the others unweighted). The stratum holds at most m - 1 rows a side."""
    from klrelease.stream.sample import priorities_of, sample_indices

    rng = np.random.default_rng(5)
    n, m = 1_000_000, 60
    X = np.column_stack([rng.random(n) < 0.02, rng.standard_t(2.5, n)]).astype(float)
    far = far_rows(X, m, sample=X[sample_indices(n)])
    assert far[0].size <= 2 * (m - 1)
    idx = sample_indices(n)
    rows, w, _ = public_strata(n, (priorities_of(idx), X[idx]), far)
    ones = X[:, 0].sum()
    assert abs(w @ rows[:, 0] - ones) < 0.05 * ones, (w @ rows[:, 0], ones)
    # the heavy tail's squares: the far rows counted themselves, the rest sampled
    sq = np.sum(X[:, 1] ** 2)
    assert abs(w @ rows[:, 1] ** 2 - sq) < 0.1 * sq


@pytest.mark.parametrize("n", [100_000, 3_000_000, 100_000_000])
@pytest.mark.parametrize("d", [2, 10, 40])
def test_far_stratum_is_called_for_by_tails_heavier_than_gaussian(n, d):
    """Read where the sample shows a tail heavier than a Gaussian's (one t(5) feature among
    Gaussian ones; a log-normal one), not for separated Gaussian classes (the benchmark's
    data), whatever their units, nor when the sample is every row."""
    from klrelease.stream.sample import far_called_for, far_per_feature

    rng = np.random.default_rng(d)
    k, m = 65536, far_per_feature(d)
    centres = rng.normal(scale=3.0, size=(10, d))
    G = (centres[rng.integers(0, 10, k)] + rng.normal(size=(k, d))) * np.logspace(-3, 3, d)
    G += 7.0
    assert not far_called_for(G, n, m)
    assert not far_called_for(G, k, m)
    H = G.copy()
    H[:, -1] = rng.standard_t(5.0, k)
    assert far_called_for(H, n, m)
    H[:, -1] = np.exp(0.5 * rng.normal(size=k)) * 1e-4
    assert far_called_for(H, n, m)


def test_row_sample_ignores_values_units_and_repeats():
    """The sample is a set of row indices: repeated values are sampled in proportion, and
    changing the units of a feature keeps the same rows (so the stage-A radius is
    equivariant)."""
    from klrelease.mechanisms.kl_certified.design import SETTINGS, Budget
    from klrelease.mechanisms.kl_certified.mechanism import sample_radius, whitening_frame
    from klrelease.stream.sample import sample_indices

    rng = np.random.default_rng(7)
    n = 200_000
    X = rng.normal(size=(n, 3))
    X[rng.random(n) < 0.6] = [0.5, -1.0, 2.0]  # 60 % identical rows
    idx = sample_indices(n, 4000)
    assert abs(np.mean(np.all(X[idx] == [0.5, -1.0, 2.0], axis=1)) - 0.6) < 0.03
    assert np.all(np.diff(np.sort(idx)) > 0)  # distinct rows
    radius = []
    for scale in (1.0, 1e3, 0.3048):
        Z = X * np.array([scale, 1.0, 1.0])
        f = whitening_frame(Z.mean(axis=0), np.cov(Z, rowvar=False))
        budget = Budget.split(1.0, 1e-5, SETTINGS["label-flip"])
        radius.append(sample_radius(f, sample_rows(Z, 4000), budget, n, 3))
    np.testing.assert_allclose(radius, radius[0], rtol=1e-9)
    # at least the 0.9-quantile of the norms (more where a larger radius lowers the error)
    exact = np.quantile(np.einsum("ij,ij->i", *(2 * [whitening_frame(
        X.mean(0), np.cov(X, rowvar=False)).to_frame(X)])), 0.9) ** 0.5
    assert radius[0] / exact > 0.95


def _assert_same_release(a, b, rtol=1e-8):
    for name in ("weights", "means", "covariances"):
        A, B = getattr(a.gmm, name), getattr(b.gmm, name)
        np.testing.assert_allclose(B, A, rtol=rtol, atol=rtol * np.max(np.abs(A)))


@pytest.mark.parametrize("adjacency,extra,sample,stage", [
    ("label-flip", {}, None, None), ("label-flip", {}, 300, None),
    ("label-flip", {"design": "gaussian"}, 500, "far"),
    ("replace-one", {"norm_bound": 40.0}, None, None),
    ("label-flip", {}, None, 1000), ("replace-one", {"norm_bound": 40.0}, None, 1000)])
def test_streamed_release_equals_in_memory(adjacency, extra, sample, stage, monkeypatch):
    """Same seed, same release; with ``sample=300`` the stage-A radius comes from a sample of
    300 of the 4000 rows, which the streamed pass must pick exactly as in memory; with
    ``stage=1000`` the early stages read a labelled sample of 1000 rows, the same rows in
    memory and streamed; with ``stage="far"`` the public row set is a sample of 500 rows and
    the far stratum (each feature's 10 largest and smallest values' rows), the same rows and
    weights in memory and streamed."""
    if sample is not None:
        monkeypatch.setattr("klrelease.stream.sample.SAMPLE_ROWS", sample)
    if stage == "far":  # a far stratum of 10 rows per side of each feature
        monkeypatch.setattr("klrelease.stream.sample.FAR_ROWS", 60)
    elif stage is not None:
        monkeypatch.setattr("klrelease.stream.sample.STAGE_ROWS", stage)
    X, y = _data(n=4000, d=3, offset=20.0)
    if stage == "far":  # a heavy-tailed feature: the far stratum is called for
        X[:, 2] += np.random.default_rng(4).standard_t(2.0, X.shape[0])
        p = klrelease.plan(X, y, epsilon=1.0, delta=1e-6, classes=CLASSES, design="gaussian")
        assert p.public.public_weights is not None and p.public.public_rows.shape[0] > 500
    kw = dict(epsilon=1.0, delta=1e-6, seed=11, classes=CLASSES, adjacency=adjacency, **extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = klrelease.release(X, y, **kw)
        b = klrelease.release(ArraySource(X, y, chunk_rows=517), None, **kw)
    _assert_same_release(a, b)
    assert b.options["data"] == "streamed in chunks"


def test_streamed_release_with_a_forced_locating_share_equals_in_memory():
    """Replace-one, 300 rows in a box 100 times their range at eps = 0.5: no rung of the
    locating ladder finds them with its margin, so the largest share is forced and the
    located scale is widened by the rows the threshold left unplaced. The streamed release
    reads the same histograms and is the in-memory one."""
    from klrelease.mechanisms.kl_certified.design import SETTINGS, locate_sd
    from klrelease.mechanisms.kl_certified.locate import LOCATE, can_locate

    X, y = _data(n=300, d=3, offset=20.0)
    c, h = (X.min(0) + X.max(0)) / 2, (X.max(0) - X.min(0)) / 2
    kw = dict(epsilon=0.5, delta=1e-6, seed=5, classes=CLASSES, adjacency="replace-one",
              bounds=(c - 100 * h, c + 100 * h))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = klrelease.plan(X, y, **{k: v for k, v in kw.items() if k != "seed"}).public.budget
        assert (b.locate / b.mu) ** 2 == pytest.approx(SETTINGS["locate_max"])
        assert not can_locate(300, 3, locate_sd(b, 3), LOCATE["raised_margin"])  # forced
        a = klrelease.release(X, y, **kw)
        s = klrelease.release(ArraySource(X, y, chunk_rows=71), None, **kw)
    _assert_same_release(a, s)
    assert s.options["data"] == "streamed in chunks"


def test_label_flip_frame_reads_every_row_beyond_the_early_stages_sample(monkeypatch):
    """Label flip with more rows than the early stages' sample: the frame is the whitening of
    every row's features, in memory and streamed alike, so a feature that varies only in rows
    outside the sample (a rare category) keeps a scale of its own and a variance of the
    order of its data's (a frame from the sample gave it 1e-12 of the largest scale, and a
    released variance 40 orders of magnitude too small)."""
    from klrelease.stream.sample import sample_indices

    monkeypatch.setattr("klrelease.stream.sample.STAGE_ROWS", 1000)
    X, y = _data(n=4000, d=3, offset=20.0)
    outside = np.setdiff1d(np.arange(X.shape[0]), sample_indices(X.shape[0], 1000))
    rare = outside[np.flatnonzero(y[outside] == 0)[:20]]
    X[:, 2] = 0.0
    X[rare, 2] = 1.0
    kw = dict(epsilon=1.0, delta=1e-6, classes=CLASSES, design="gaussian")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mem = klrelease.release(X, y, seed=3, **kw)
        streamed = klrelease.release(ArraySource(X, y, chunk_rows=517), None, seed=3, **kw)
        frame = klrelease.plan(X, y, **kw).public.frame
    _assert_same_release(mem, streamed)
    np.testing.assert_allclose(frame.centre, X.mean(axis=0), rtol=1e-12, atol=1e-15)
    var = np.var(X[y == 0, 2], ddof=1)
    assert np.asarray(mem.gmm.covariances)[0, 2, 2] > 1e-6 * var


def test_memmap_source(tmp_path):
    X, y = _data(n=2000)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    src = ArraySource(np.load(tmp_path / "X.npy", mmap_mode="r"),
                      np.load(tmp_path / "y.npy", mmap_mode="r"), classes=CLASSES,
                      chunk_rows=300)
    m = src.moments()
    sums = np.stack([X[y == k].sum(0) for k in range(3)])
    np.testing.assert_allclose(m.sums, sums, rtol=1e-12)


def _write_parquet(path, X, y, parts=3):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir()
    for i, idx in enumerate(np.array_split(np.arange(len(y)), parts)):
        cols = {f"f{j}": X[idx, j] for j in range(X.shape[1])}
        cols["label"] = np.array([f"c{v}" for v in y[idx]])
        pq.write_table(pa.table(cols), path / f"part-{i}.parquet", row_group_size=257)


def test_parquet_and_csv_sources(tmp_path):
    X, y = _data(n=3000)
    _write_parquet(tmp_path / "pq", X, y)
    csv = tmp_path / "data.csv"
    with csv.open("w") as fh:
        fh.write("a,label,b,c\n")
        for row, lab in zip(X, y, strict=True):
            fh.write(f"{float(row[0])!r},{lab},{float(row[1])!r},{float(row[2])!r}\n")
    ref = np.stack([X[y == k].sum(0) for k in range(3)])
    pq_src = ParquetSource(str(tmp_path / "pq" / "*.parquet"), "label",
                           classes=["c0", "c1", "c2"], chunk_rows=400)
    assert pq_src.feature_names == ("f0", "f1", "f2")
    np.testing.assert_allclose(pq_src.moments().sums, ref, rtol=1e-12)
    csv_src = CSVSource(csv, "label", classes=["0", "1", "2"], block_bytes=1 << 14)
    assert csv_src.classes == (0, 1, 2) and csv_src.feature_names == ("a", "b", "c")
    np.testing.assert_allclose(csv_src.moments().sums, ref, rtol=1e-12)
    undeclared = CSVSource(csv, "label", block_bytes=1 << 14)
    assert undeclared.resolve_classes() == (0, 1, 2) and not undeclared.classes_declared


class _NoNoise(np.random.Generator):
    pass


@pytest.mark.parametrize("bad", ["nan", "label"])
def test_bad_value_in_last_chunk_fails_before_noise(tmp_path, bad, monkeypatch):
    X, y = _data(n=3000)
    y = y.astype(object)
    if bad == "nan":
        X[-1, 1] = np.nan
        message = "X contains NaN or infinite values"
    else:
        y[-1] = 7
        message = "y contains a label that is not one of the declared classes"
    _write_parquet(tmp_path / "pq", X, np.array([str(v) for v in y]))
    drawn = []
    monkeypatch.setattr(Plan, "draw", lambda self, rng: drawn.append(1))
    src = ParquetSource(tmp_path / "pq", "label", classes=["c0", "c1", "c2"], chunk_rows=512)
    with pytest.raises(ValueError) as exc:
        klrelease.release(src, None, epsilon=1.0, delta=1e-6)
    assert str(exc.value) == message and not drawn
    arr = ArraySource(X, y, classes=CLASSES, chunk_rows=512)
    with pytest.raises(ValueError, match="NaN or infinite|not one of the declared"):
        klrelease.release(arr, None, epsilon=1.0, delta=1e-6)
    assert not drawn


def test_source_refused_by_in_memory_mechanisms():
    X, y = _data(n=500)
    with pytest.raises(ValueError, match="needs the data in memory"):
        klrelease.release(ArraySource(X, y, classes=CLASSES), None, epsilon=1.0, delta=1e-6,
                          mechanism="ppe-gaussian")


@contextlib.contextmanager
def _local_client(processes: bool):
    """A client of a two-worker, one-thread-each Dask LocalCluster on this machine."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=processes,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        yield client


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_dask_local_cluster_release_equals_in_memory(processes):
    """Also with worker processes: every per-row map and merge crosses a process boundary."""
    da = pytest.importorskip("dask.array")
    dd = pytest.importorskip("dask.dataframe")
    pytest.importorskip("distributed")
    import pandas as pd

    X, y = _data(n=6000, d=3, offset=5.0)
    kw = dict(epsilon=1.0, delta=1e-6, seed=5, classes=CLASSES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = klrelease.release(X, y, **kw)
        with _local_client(processes) as client:
            Xd = da.from_array(X, chunks=(1100, 3))
            yd = da.from_array(y, chunks=1100)
            on_cluster = klrelease.release(Xd, yd, client=client, **kw)
            frame = pd.DataFrame({"u": X[:, 0], "v": X[:, 1], "w": X[:, 2], "label": y})
            ddf = dd.from_pandas(frame, npartitions=4)
            from klrelease.stream import DaskSource

            from_frame = klrelease.release(DaskSource(ddf, label_column="label",
                                                      client=client), None, **kw)
            Xbad = X.copy()
            Xbad[-1, 0] = np.inf
            with pytest.raises(ValueError, match="^X contains NaN or infinite values$"):
                klrelease.release(da.from_array(Xbad, chunks=(1100, 3)), yd, client=client,
                                  **kw)
    _assert_same_release(ref, on_cluster)
    _assert_same_release(ref, from_frame)
    assert from_frame.feature_names == ["u", "v", "w"]


def test_dask_release_with_stage_t_equals_in_memory():
    """At a budget where kl-certified releases stage T (the histogram of the rows' norms in the
    last stage-C round's regions), its map runs on the workers like every other stage."""
    X, y = _data(n=20000, d=2, offset=5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert klrelease.plan(X, y, epsilon=50.0, delta=1e-6, classes=CLASSES,
                              design="gaussian").public.budget.tails > 0
    _assert_dask_release_equals_in_memory(X, y, 3000, epsilon=50.0, design="gaussian")


def _assert_dask_release_equals_in_memory(X, y, chunk, **options):
    """The seeded release of ``X, y`` in memory and on a threaded Dask ``LocalCluster``
    (chunks of ``chunk`` rows) are the same."""
    da = pytest.importorskip("dask.array")
    pytest.importorskip("distributed")
    kw = dict(delta=1e-6, seed=5, classes=CLASSES, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = klrelease.release(X, y, **kw)
        with _local_client(processes=False) as client:
            on_cluster = klrelease.release(da.from_array(X, chunks=(chunk, X.shape[1])),
                                           da.from_array(y, chunks=chunk), client=client, **kw)
    _assert_same_release(ref, on_cluster)


def test_dask_release_with_a_far_stratum_equals_in_memory(monkeypatch):
    """Label flip with more rows than the public sample: the far stratum's partial sets are
    merged on the workers like the sample's, and the release is the in-memory one."""
    monkeypatch.setattr("klrelease.stream.sample.SAMPLE_ROWS", 700)
    monkeypatch.setattr("klrelease.stream.sample.FAR_ROWS", 90)
    X, y = _data(n=6000, d=3, offset=5.0)
    X[:, 1] = np.random.default_rng(2).standard_t(2.0, 6000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert klrelease.plan(X, y, epsilon=2.0, delta=1e-6, classes=CLASSES,
                              design="gaussian").public.public_weights is not None
    _assert_dask_release_equals_in_memory(X, y, 1100, epsilon=2.0, design="gaussian")


@pytest.mark.parametrize("design,reads", [("auto", False), ("response", False),
                                          ("gaussian", True)])
def test_the_far_stratum_is_kept_only_for_the_gaussian_design(design, reads, monkeypatch):
    """A streamed label-flip release keeps the far stratum's state in its first pass only
    where the Gaussian design may read it: not when the response design is asked for, nor
    when ``auto`` picks it from N known without a pass (the arrays' chunks here)."""
    from klrelease.mechanisms.kl_certified.mechanism import choose_design
    from klrelease.stream import sample

    calls = []
    of = sample.FarRows.of
    monkeypatch.setattr(sample.FarRows, "of",
                        classmethod(lambda cls, *a, **k: calls.append(1) or of(*a, **k)))
    X, y = _data(n=5000, d=3)
    assert choose_design(20.0, 1e-6, 5000, 3, 3) == "response"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = klrelease.plan(ArraySource(X, y, chunk_rows=1000), None, epsilon=20.0,
                           delta=1e-6, classes=CLASSES, design=design)
    assert p.public_options["design"] == ("gaussian" if reads else "response")
    assert bool(calls) == reads


def test_cli_release_from_parquet_streams_and_on_dask(tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    from klrelease.artifact import Release
    from klrelease.cli import main

    X, y = _data(n=3000)
    _write_parquet(tmp_path / "pq", X, y)
    monkeypatch.chdir(tmp_path)
    base = ["release", "--epsilon", "1", "--delta", "1e-6", "--seed", "3",
            "--label-column", "label", "--classes", "c0,c1,c2"]
    assert main([*base, "--parquet", "pq/*.parquet", "--out", "a.json"]) == 0
    assert main([*base, "--parquet", "pq", "--dask", "--out", "b.json"]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = klrelease.release(X, np.array([f"c{v}" for v in y]), epsilon=1.0, delta=1e-6,
                                seed=3, classes=["c0", "c1", "c2"])
    a, b = Release.load(tmp_path / "a.json"), Release.load(tmp_path / "b.json")
    _assert_same_release(ref, a, rtol=1e-6)
    _assert_same_release(ref, b, rtol=1e-6)
    assert a.feature_names == ["f0", "f1", "f2"]
    assert main([*base, "--parquet", "pq", "--mechanism", "ppe-gaussian",
                 "--out", "c.json"]) == 2


def test_streamed_labels_read_one_by_one_against_declared_text_classes():
    """Whether one label is a whole number must not change how the others are read."""
    from klrelease.stream.sources import _labels

    classes = ("1", "0.5", "2")
    np.testing.assert_array_equal(_labels(np.array([1.0, 2.0, 1.0]), classes), [0, 2, 0])
    np.testing.assert_array_equal(_labels(np.array([1.0, 2.0, 0.5]), classes), [0, 2, 1])


def test_non_numeric_features_fail_without_printing_a_value():
    X = np.array([["1.0", "2.0"], ["secret-12", "3.0"], ["0.5", "1.5"]], dtype=object)
    src = ArraySource(X, np.array([0, 1, 0]), classes=[0, 1])
    with pytest.raises(ValueError) as err:
        src.moments()
    assert "secret" not in str(err.value) and str(err.value) == "every feature must be numeric"


def test_a_source_failing_after_noise_gives_the_stage_a_release():
    """A chunked source that fails in a pass after stage A's noise: the release does not fail
    (it would spend the budget again); it is the post-processing of stage A."""
    X, y = _data(n=3000)

    class Flaky(ArraySource):
        passes = 0

        def chunks(self):
            type(self).passes += 1
            if type(self).passes > 2:  # features with the sample, stage A; then stage C
                raise OSError("disk gone")
            yield from super().chunks()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = klrelease.release(Flaky(X, y, classes=CLASSES, chunk_rows=700), None,
                              epsilon=1.0, delta=1e-6, seed=2)
    assert Flaky.passes == 3
    assert r.gmm.weights.shape == (3,) and np.all(np.isfinite(r.gmm.means))
    assert "stage-A" in r.options["fallback"]


def test_text_labels_read_the_same_in_memory_and_streamed(tmp_path):
    """Labels ``01`` and `` 2`` against declared integer classes: each label is read on its
    own, the same way in memory, from a streamed CSV and from arrays; a label that is no
    declared class is refused with the same message everywhere."""
    from klrelease.data import load_csv

    X, y = _data(n=600, K=2)
    text = np.where(y == 0, "01", " 2")
    path = tmp_path / "d.csv"
    with path.open("w") as fh:
        fh.write("a,b,c,label\n")
        for row, lab in zip(X, text, strict=True):
            fh.write(",".join(f"{v:.17g}" for v in row) + f",{lab}\n")
    # the Gaussian design: its seeded draws are the same in memory and streamed (a streamed
    # response design draws each chunk's labels from its own keyed stream)
    kw = dict(epsilon=1.0, delta=1e-6, seed=4, classes=[1, 2], design="gaussian")
    Xm, ym, _ = load_csv(path, "label")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = klrelease.release(X, y + 1, **kw)
        mem = klrelease.release(Xm, ym, **kw)
        arr = klrelease.release(X, text, **kw)
        streamed = klrelease.release(CSVSource(path, "label"), None, **kw)
    for r in (mem, arr, streamed):
        _assert_same_release(ref, r)
    bad = text.copy()
    bad[-1] = "x"
    msg = "y contains a label that is not one of the declared classes"
    with pytest.raises(ValueError, match=msg):
        klrelease.release(X, bad, **kw)
    with pytest.raises(ValueError, match=msg):
        klrelease.release(ArraySource(X, bad, chunk_rows=100), None, **kw)


@pytest.mark.parametrize("defect", [TypeError, np.linalg.LinAlgError])
def test_a_defect_after_noise_is_not_hidden_by_the_stage_a_fallback(monkeypatch, defect):
    """Only a source that cannot be read falls back (the test above); a defect after noise,
    here a TypeError or a numerical error (a ValueError), raises instead of hiding behind a
    cruder model."""
    from klrelease.mechanisms.kl_certified import mechanism as m

    X, y = _data(n=2000)

    def broken(self, fn, d, second=True):
        raise defect("a defect")

    monkeypatch.setattr(m._StreamRows, "stats", broken)
    with warnings.catch_warnings(), pytest.raises(defect):
        warnings.simplefilter("ignore")
        klrelease.release(ArraySource(X, y, classes=CLASSES), None, epsilon=1.0, delta=1e-6,
                          seed=2)


def test_prefetched_chunks_keep_order_errors_and_stop_the_reader():
    import threading

    from klrelease.stream.sources import _prefetched

    assert list(_prefetched(iter(range(50)))) == list(range(50))
    closed = []

    def failing():
        try:
            yield 1
            yield 2
            raise OSError("disk gone")
        finally:
            closed.append("failing")

    got = []
    with pytest.raises(OSError, match="disk gone"):
        for item in _prefetched(failing()):
            got.append(item)
    assert got == [1, 2] and closed == ["failing"]

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.append("endless")

    gen = _prefetched(endless())
    assert [next(gen) for _ in range(5)] == [0, 1, 2, 3, 4]
    gen.close()  # the consumer stops early: the producer stops and closes its generator
    assert closed[-1] == "endless"
    assert not any(t.name == "klrelease-prefetch" for t in threading.enumerate())


def test_a_bad_value_read_ahead_fails_the_pass_like_a_sequential_read(tmp_path):
    """The chunk after a bad one may already be read; the pass still fails with the rule's
    message at the bad chunk, and no reader thread is left behind."""
    import threading

    import pyarrow as pa
    import pyarrow.parquet as pq

    X, y = _data(n=4000)
    X[3500, 1] = np.nan
    pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "y": y}),
                   tmp_path / "d.parquet")
    src = ParquetSource(tmp_path / "d.parquet", "y", classes=CLASSES, chunk_rows=500)
    assert src.prefetch
    with pytest.raises(ValueError, match="NaN or infinite"):
        src.moments()
    assert not any(t.name == "klrelease-prefetch" for t in threading.enumerate())


@pytest.mark.parametrize("classes", [["0", "1"], [0.0, 1.0], [0, 1], ["1", "01"], ["a", "b"],
                                     [1.0, 0.0, 0.5]])
@pytest.mark.parametrize("y", [np.array([0, 1] * 20), np.array([0.0, 1.0] * 20),
                               np.array(["0", "1"] * 20)])
def test_declared_classes_read_the_same_in_memory_and_streamed(classes, y):
    """One reading of declared classes for arrays and sources: the same codes or the same
    refusal."""
    from klrelease.data import as_labelled_data

    X = np.random.default_rng(0).normal(size=(40, 2))
    try:
        mem = as_labelled_data(X, y, classes=classes, min_class_size=0).codes
    except ValueError as exc:
        with pytest.raises(ValueError, match=str(exc)):
            ArraySource(X, y, classes=classes).moments()
        return
    m = ArraySource(X, y, classes=classes).moments()
    np.testing.assert_array_equal(m.counts, np.bincount(mem, minlength=len(classes)))


def test_the_fused_stage_c_map_equals_the_framed_one():
    """Streamed stage C maps raw rows in one product; it is the in-memory map of framed rows
    (the one the neighbour tests check), up to rounding."""
    from klrelease.mechanisms.kl_certified.mechanism import (
        _FusedRegionClip,
        _RegionClip,
        whitening_frame,
    )

    rng = np.random.default_rng(3)
    X = rng.standard_t(3, size=(500, 4)) * [1e3, 1.0, 1e-3, 5.0] + [1e4, 0.0, 2.0, -7.0]
    f = whitening_frame(X.mean(axis=0), np.cov(X.T))
    c, W = rng.normal(size=(2, 4)), rng.normal(size=(2, 4, 4))
    radii = np.array([2.5, 3.1])
    framed = _RegionClip(c, W, radii)
    fused = _FusedRegionClip(f.centre + c @ f.W_inv, f.W @ W, radii)
    for k in range(2):
        np.testing.assert_allclose(fused(X, k), framed(f.to_frame(X), k), rtol=1e-8,
                                   atol=1e-8)


def test_a_release_leaves_the_callers_source_as_it_was():
    """classes= and bounds= given to one release apply to that release only."""
    from klrelease.stream import as_source

    X, y = _data(n=300)
    src = ArraySource(X, y)
    t = as_source(src, classes=CLASSES, bounds=(-50.0, 50.0))
    assert t is not src and t.classes_declared and t.bounds == (-50.0, 50.0)
    assert not src.classes_declared and src.classes is None and src.bounds is None


def _counted(source_cls):
    class Counted(source_cls):
        passes = 0

        def chunks(self):
            type(self).passes += 1
            yield from super().chunks()

    return Counted


@pytest.mark.parametrize("adjacency", ["label-flip", "replace-one"])
def test_early_stages_read_a_labelled_sample_and_every_row_is_read_twice(adjacency,
                                                                          monkeypatch):
    """More rows than the early stages' sample: two passes over the rows (the first validates
    every row and keeps the sample; the last stage-C round), and the release stays close to
    the one whose every stage reads every row."""
    from klrelease.kl import kl_divergence

    X, y = _data(n=60_000, d=3, offset=20.0)
    extra = {"bounds": (X.min(0) - 5.0, X.max(0) + 5.0)} if adjacency == "replace-one" else {}
    fit = klrelease.fit_gmm(X, y)
    ref = klrelease.GMM(fit.weights, fit.means, fit.covariances, tuple(CLASSES))
    kw = dict(epsilon=1.0, delta=1e-6, classes=CLASSES, adjacency=adjacency, design="gaussian",
              **extra)
    kls = {}
    for rows in (1 << 18, 20_000):
        monkeypatch.setattr("klrelease.stream.sample.STAGE_ROWS", rows)
        Counted = _counted(ArraySource)
        out = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for seed in range(4):
                Counted.passes = 0
                r = klrelease.release(Counted(X, y, chunk_rows=4500), None, seed=seed, **kw)
                out.append(kl_divergence(ref, r.gmm))
                if rows == 20_000:
                    assert Counted.passes == 2
                else:  # stage A (and, under replace-one, more) pass over every row too
                    assert Counted.passes >= 3
        kls[rows] = float(np.mean(out))
        if rows == 20_000:
            assert r.options["early_stages"] == ("a sample of 20000 of the 60000 rows, chosen "
                                                 "by their index")
    assert kls[20_000] < 3 * kls[1 << 18] + 1e-4, kls


class _CountedGroups(ArraySource):
    """An array source that counts its passes and the row groups read outside them."""

    passes, groups = 0, []

    def chunks(self):
        type(self).passes += 1
        yield from super().chunks()

    def read_group(self, g):
        type(self).groups.append(g)
        return super().read_group(g)


@pytest.mark.parametrize("adjacency", ["label-flip", "replace-one"])
def test_one_pass_reads_its_sample_then_every_row_once(adjacency, monkeypatch):
    """``one_pass``: the sample's rows (blocks chosen by N alone) are read from their row
    groups before any noise, then one pass over every row (stage C's last round, which counts
    the rows too); the release stays close to the two-pass one, its weights come from every
    row's counts, its budget still sums to mu."""
    from klrelease.kl import kl_divergence
    from klrelease.stream.sample import sample_blocks

    X, y = _data(n=60_000, d=3, offset=20.0)
    extra = {"bounds": (X.min(0) - 5.0, X.max(0) + 5.0)} if adjacency == "replace-one" else {}
    fit = klrelease.fit_gmm(X, y)
    ref = klrelease.GMM(fit.weights, fit.means, fit.covariances, tuple(CLASSES))
    kw = dict(epsilon=1.0, delta=1e-6, classes=CLASSES, adjacency=adjacency, design="gaussian",
              **extra)
    monkeypatch.setattr("klrelease.stream.sample.STAGE_ROWS", 20_000)
    kls = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for one_pass in (False, True):
            out = []
            for seed in range(4):
                _CountedGroups.passes, _CountedGroups.groups = 0, []
                r = klrelease.release(_CountedGroups(X, y, chunk_rows=4500), None, seed=seed,
                                      one_pass=one_pass, **kw)
                out.append(kl_divergence(ref, r.gmm))
                assert _CountedGroups.passes == (1 if one_pass else 2)
                if one_pass:  # the groups that hold the blocks' rows, each read once
                    held = sorted({g for a, b in sample_blocks(60_000, 20_000)
                                   for g in range(a // 4500, (b - 1) // 4500 + 1)})
                    assert _CountedGroups.groups == held
            kls[one_pass] = float(np.mean(out))
    assert r.options["early_stages"].startswith("a sample of 20000 of the 60000 rows")
    assert "one pass over every row" in r.options["early_stages"]
    b = r.options["budget"]
    assert b["counts_all"] == pytest.approx(b["counts"])
    p = klrelease.plan(_CountedGroups(X, y, chunk_rows=4500), None, one_pass=True,
                       **{k: v for k, v in kw.items() if k != "classes"}, classes=CLASSES)
    assert p.public.budget.total == pytest.approx(p.public.budget.mu, rel=1e-12)
    assert kls[True] < 3 * kls[False] + 1e-4, kls
    # the weights are every row's counts (noise sd sqrt(2) / counts_all: a few rows)
    assert np.max(np.abs(r.gmm.weights - fit.weights)) < 1e-3


def test_one_pass_sample_blocks_are_a_function_of_n_alone():
    """The sample's rows depend on N only: the same however the rows are grouped, spread
    over strata of the rows, exactly ``size`` of them."""
    from klrelease.stream.sample import sample_blocks

    rng = np.random.default_rng(4)
    X = rng.normal(size=(50_000, 2))
    y = rng.integers(0, 3, 50_000)
    rows = {}
    for chunk in (1000, 4096, 50_000):
        N, (R, codes), read = ArraySource(X, y, classes=CLASSES,
                                          chunk_rows=chunk).block_sample(3000)
        assert N == 50_000 and R.shape == (3000, 2)
        rows[chunk] = (R, codes)
        assert read >= 3000
    for chunk in (4096, 50_000):
        np.testing.assert_array_equal(rows[chunk][0], rows[1000][0])
        np.testing.assert_array_equal(rows[chunk][1], rows[1000][1])
    for n in (10**6, 10**8, 10**9):
        blocks = sample_blocks(n, 1 << 18)
        assert sum(b - a for a, b in blocks) == 1 << 18
        assert all(j * n // len(blocks) <= a < b <= (j + 1) * n // len(blocks)
                   for j, (a, b) in enumerate(blocks))
    assert len(sample_blocks(10**8, 1 << 18)) > 1


@pytest.mark.parametrize("adjacency", ["label-flip", "replace-one"])
def test_one_pass_of_at_most_the_sample_is_the_two_pass_release(adjacency):
    """No more rows than the early stages' sample: ``one_pass`` changes nothing (same seed,
    same release, same budget)."""
    X, y = _data(n=4000, d=3, offset=20.0)
    extra = {"norm_bound": 40.0} if adjacency == "replace-one" else {}
    kw = dict(epsilon=1.0, delta=1e-6, seed=5, classes=CLASSES, adjacency=adjacency,
              design="gaussian", **extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = klrelease.release(ArraySource(X, y, chunk_rows=517), None, **kw)
        b = klrelease.release(ArraySource(X, y, chunk_rows=517), None, one_pass=True, **kw)
    _assert_same_release(a, b, rtol=0)
    assert a.options["budget"] == b.options["budget"]


def test_one_pass_validates_the_rest_after_noise_and_falls_back(tmp_path, monkeypatch):
    """``one_pass`` on Parquet: a row that does not validate inside the sample is refused
    before any noise; outside the sample's row groups the one pass finds it after noise was
    drawn, and the release is the post-processing of what was released before (never an
    error then)."""
    from klrelease.stream.sample import sample_blocks

    monkeypatch.setattr("klrelease.stream.sample.STAGE_ROWS", 600)
    X, y = _data(n=3000)
    _write_parquet(tmp_path / "ok", X, y)  # row groups of 257 rows
    kw = dict(epsilon=1.0, delta=1e-6, seed=1, design="gaussian", one_pass=True)
    classes = ["c0", "c1", "c2"]
    src = ParquetSource(tmp_path / "ok", "label", classes=classes)
    sizes = src.row_groups()
    starts = np.concatenate([[0], np.cumsum(sizes)])
    (a, b), = sample_blocks(3000, 600)
    held = {g for g in range(len(sizes)) if starts[g] < b and starts[g + 1] > a}
    outside = next(g for g in range(len(sizes)) if g not in held)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row, refused in ((a + 3, True), (starts[outside] + 3, False)):
            X2 = X.copy()
            X2[row, 1] = np.nan
            _write_parquet(tmp_path / f"bad{row}", X2, y)
            src = ParquetSource(tmp_path / f"bad{row}", "label", classes=classes)
            if refused:
                with pytest.raises(ValueError, match="NaN or infinite"):
                    klrelease.release(src, None, **kw)
                continue
            r = klrelease.release(src, None, **kw)
            assert r.options.get("fallback")
            assert np.all(np.isfinite(r.gmm.means))


def test_one_pass_falls_back_when_the_rows_change_after_the_sample(monkeypatch):
    """The one pass must read as many rows as the metadata said (else the data changed
    since): never an error after noise, the fallback instead."""
    monkeypatch.setattr("klrelease.stream.sample.STAGE_ROWS", 600)
    X, y = _data(n=3000)

    class Growing(ArraySource):
        def chunks(self):  # one more block of rows than row_groups() announced
            yield from super().chunks()
            yield self.X[:100], self.y[:100]

    class Emptied(ArraySource):
        def chunks(self):  # no rows left when the one pass reads
            return iter(())

    for source in (Growing, Emptied):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = klrelease.release(source(X, y, classes=CLASSES, chunk_rows=300), None,
                                  epsilon=1.0, delta=1e-6, seed=2, design="gaussian",
                                  one_pass=True)
        assert r.options.get("fallback")
        fit = klrelease.fit_gmm(X, y)  # the weights: every row's counts when they exist
        assert np.max(np.abs(r.gmm.weights - fit.weights)) < 0.1


def test_one_pass_with_the_response_design_reads_once(monkeypatch):
    """Label flip, ``auto`` choosing randomized response: the frame from the sample, then the
    one pass that reports the labels."""
    monkeypatch.setattr("klrelease.stream.sample.STAGE_ROWS", 2000)
    X, y = _data(n=6000, d=3)
    _CountedGroups.passes, _CountedGroups.groups = 0, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = klrelease.release(_CountedGroups(X, y, classes=CLASSES, chunk_rows=700), None,
                              epsilon=8.0, delta=1e-6, seed=3, design="response",
                              one_pass=True)
    assert _CountedGroups.passes == 1 and _CountedGroups.groups
    assert r.options["design"] == "response"
    assert "one pass over every row" in r.options["early_stages"]
    fit = klrelease.fit_gmm(X, y)
    np.testing.assert_allclose(r.gmm.means, fit.means, atol=0.3)
    # the frame and the debiasing read N = 6000 (the metadata's), not the sample's 2000
    # (seeded: 5e-4 and 4.4e-5 here; 3.8e-3 and 8.1e-5 with N = 2000)
    np.testing.assert_allclose(r.gmm.weights, fit.weights, atol=0.002)
    from klrelease.kl import kl_divergence

    ref = klrelease.GMM(fit.weights, fit.means, fit.covariances, tuple(CLASSES))
    assert kl_divergence(ref, r.gmm) < 6e-5


def test_one_pass_refuses_before_reading_a_row(tmp_path):
    """CSV (no row groups), undeclared classes, data in memory, bounds read from the data:
    refused before any pass."""
    X, y = _data(n=300)
    path = tmp_path / "d.csv"
    np.savetxt(path, np.column_stack([X, y]), delimiter=",", header="a,b,c,label",
               comments="")

    class NoPass(CSVSource):
        def chunks(self):
            raise AssertionError("read")

    class NoPassArrays(ArraySource):
        def chunks(self):
            raise AssertionError("read")

    kw = dict(epsilon=1.0, delta=1e-6, one_pass=True)
    with pytest.raises(ValueError, match="Parquet files or arrays"):
        klrelease.release(NoPass(path, "label", classes=CLASSES), None, **kw)
    with pytest.raises(ValueError, match="classes declared"):
        klrelease.release(NoPassArrays(X, y), None, **kw)
    with pytest.raises(ValueError, match="bounds_from_data"):
        klrelease.release(NoPassArrays(X, y, classes=CLASSES), None, adjacency="replace-one",
                          bounds_from_data=True, **kw)
    with pytest.raises(ValueError, match="data read in chunks"):
        klrelease.release(X, y, classes=CLASSES, **kw)


def test_labelled_row_sample_keeps_each_rows_label():
    X, y = _data(n=5000, d=2)
    codes = np.asarray(y) % 3
    parts = [RowSample.of(X[a:a + 700], a, 600, codes[a:a + 700]) for a in range(0, 5000, 700)]
    acc = parts[-1]
    for p in parts[:-1]:
        acc = acc.merge(p)
    rows, got = acc.labelled()
    from klrelease.stream.sample import sample_indices

    idx = sample_indices(5000, 600)
    np.testing.assert_array_equal(rows, X[idx])
    np.testing.assert_array_equal(got, codes[idx])


def test_a_streamed_release_reads_on_its_own_thread_when_no_thread_can_be_started(
        monkeypatch, tmp_path):
    """The read-ahead thread of a chunked source, started by each pass, may be refused
    (a process at its limit of threads): the pass then reads on the caller's thread, so a
    release whose later passes come after noise does not fail, and releases the same values."""
    import threading

    import klrelease as kr
    from klrelease.stream import CSVSource
    from klrelease.stream.sources import _prefetched

    rng = np.random.default_rng(5)
    X = rng.normal(size=(3000, 3))
    y = rng.integers(0, 2, 3000)
    path = tmp_path / "rows.csv"
    np.savetxt(path, np.column_stack([X, y]), delimiter=",", header="a,b,c,label",
               comments="", fmt=["%.17g"] * 3 + ["%d"])
    source = CSVSource(path, label_column="label", classes=[0, 1])
    bounds = (np.full(3, -6.0), np.full(3, 6.0))
    plan = kr.plan(source, None, epsilon=1.0, delta=1e-5, adjacency="replace-one",
                   bounds=bounds)
    want = plan.draw(np.random.default_rng(1))

    def refuse(self):
        if self.name == "klrelease-prefetch":
            raise RuntimeError("can't start new thread")
        return start(self)

    start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", refuse)
    assert list(_prefetched(iter(range(7)))) == list(range(7))
    got = plan.draw(np.random.default_rng(1))
    for a, b in ((want.weights, got.weights), (want.means, got.means),
                 (want.covariances, got.covariances)):
        np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("design", ["gaussian", "response"])
@pytest.mark.parametrize("sample", [None, 500, "outside"])
def test_streamed_release_with_one_gross_value_equals_in_memory(design, sample, monkeypatch):
    """Label flip with one value 1e6 among 4000 rows: the frame's moments winsorise it, from
    the public row sample (every row, or 500 of them holding that row, or 500 without it:
    then the pass's extremes call for the sample's moments), which the streamed pass keeps
    as in memory. The Gaussian design: same seed, same release. The response design (whose
    streamed labels come from keyed per-chunk streams): the same rows in its frame, the gross
    row drawn in to its reach."""
    from klrelease.mechanisms.kl_certified.mechanism import response_reach, winsor_limits
    from klrelease.stream.sample import sample_indices, sample_rows

    if sample is not None:
        monkeypatch.setattr("klrelease.stream.sample.SAMPLE_ROWS", 500)
    X, y = _data(n=4000, d=3, offset=20.0)
    far = int(sample_indices(4000, 4000)[-1 if sample == "outside" else 0])
    assert (far in sample_indices(4000, 500)) == (sample != "outside")
    X[far, 1] = 1e6
    extremes = (X.min(axis=0), X.max(axis=0))
    assert winsor_limits(sample_rows(X), X.shape[0], extremes) is not None
    assert (winsor_limits(sample_rows(X), X.shape[0]) is None) == (sample == "outside")
    kw = dict(epsilon=2.0, delta=1e-6, classes=CLASSES, design=design)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if design == "response":
            a = klrelease.plan(X, y, **kw)
            b = klrelease.plan(ArraySource(X, y, chunk_rows=517), None, **kw)
            np.testing.assert_allclose(b.frame.to_frame(X), a.rows, rtol=1e-9, atol=1e-9)
            reach = response_reach(2.0, 4000, 3, 3)
            assert np.linalg.norm(b.frame.robust.to_frame(X[far:far + 1])) > reach
            rel = a.draw(np.random.default_rng(3))
        else:
            a = klrelease.release(X, y, seed=3, **kw)
            b = klrelease.release(ArraySource(X, y, chunk_rows=517), None, seed=3, **kw)
            _assert_same_release(a, b)
            rel = a.gmm
    if sample != 500:  # the clean classes' variance of that feature is theirs, not the row's
        assert np.sort(rel.covariances[:, 1, 1])[1] < 100.0


def test_one_pass_release_winsorises_a_gross_value_in_its_block_sample(monkeypatch):
    """``one_pass``: the frame comes from the block sample, whose extremes reach the frame's
    winsorising: a 1e6 in a row of the block sample beyond its first SAMPLE_ROWS rows (which
    the winsorising reads) does not set the frame's scale (the clean classes' variance of
    that feature stays theirs: about 1 and 4, not 1e5 or more)."""
    monkeypatch.setattr("klrelease.stream.sample.STAGE_ROWS", 2000)
    monkeypatch.setattr("klrelease.stream.sample.SAMPLE_ROWS", 500)
    X, y = _data(n=4000, d=3, offset=20.0)
    source = ArraySource(X, y, classes=CLASSES, chunk_rows=500)
    _, (rows, _), _ = source.block_sample(2000)
    row = int(np.flatnonzero((X == rows[1500]).all(axis=1))[0])
    X[row, 1] = 1e6
    kw = dict(epsilon=2.0, delta=1e-6, classes=CLASSES, design="gaussian", seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = klrelease.release(ArraySource(X, y, chunk_rows=500), None, one_pass=True, **kw)
    assert "one pass over every row" in r.options["early_stages"]
    assert np.sort(r.gmm.covariances[:, 1, 1])[1] < 100.0


def test_dask_release_with_one_gross_value_equals_in_memory():
    """Label flip on a Dask cluster (the Gaussian design there): the partitions' extremes and
    row sample reach the frame's winsorising as in memory; same seed, same release."""
    X, y = _data(n=3000, d=3, offset=20.0)
    X[11, 2] = -1e6
    _assert_dask_release_equals_in_memory(X, y, 700, epsilon=2.0, design="gaussian")
    p = klrelease.plan(X, y, epsilon=2.0, delta=1e-6, classes=CLASSES, design="gaussian")
    assert "winsorised" in p.public_options["frame"]
