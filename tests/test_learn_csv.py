"""Learners read rows without labels from files: dp-em in passes over fixed blocks (the same
release as in memory, memory independent of N), the others from one float64 array."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from klrelease.cli import main
from klrelease.learners import learn
from klrelease.learners.dpem import design as dpem_design
from klrelease.learners.dpem import learner as dpem_learner
from klrelease.learners.result import streams
from klrelease.stream import ArraySource, CSVSource, ParquetSource, SourceReadError

DPEM = dict(epsilon=1.0, delta=1e-6, learner="dp-em", seed=3, R=10.0, sigma_max=2.0)


def _rows(n, d, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X[: n // 3, 0] += 8.0
    return X


def _csv(path, X, names=None):
    names = names or [f"c{i}" for i in range(X.shape[1])]
    np.savetxt(path, X, delimiter=",", header=",".join(names), comments="", fmt="%.17g")
    return path


def _doc(res):
    doc = json.loads(res.to_json())
    doc.pop("feature_names")
    return doc


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 1000 rows and early iterations on 1500 rows: small data takes every path
    (several blocks, a public subset, passes over the source for the last iterations)."""
    monkeypatch.setattr(dpem_learner, "BLOCK", 1000)
    monkeypatch.setitem(dpem_design.SETTINGS, "subsample", 1500)


@pytest.mark.parametrize("d", [2, 3])  # d = 3: the private PCA pass too
def test_dpem_release_is_the_same_from_a_file_however_it_is_chunked(tmp_path, small_blocks, d):
    X = _rows(4321, d)  # neither the blocks nor the chunks divide N
    path = _csv(tmp_path / "u.csv", X)
    ref = _doc(learn(X, 2, **DPEM))
    assert ref["status"] == "ok"
    its = ref["diagnostics"]["iterations"]
    assert its[0]["rows"] == 1500 and its[-1]["rows"] == 4321  # subset, then every row
    for block_bytes in (1 << 12, 5003, 1 << 22):
        src = CSVSource(path, None, block_bytes=block_bytes)
        assert _doc(learn(src, 2, **DPEM)) == ref
    for chunk in (1, 999, 1000, 1001, 4321, 10_000):
        assert _doc(learn(ArraySource(X, None, chunk_rows=chunk), 2, **DPEM)) == ref


def test_dpem_without_a_subset_is_the_same_from_a_file(tmp_path, monkeypatch):
    monkeypatch.setattr(dpem_learner, "BLOCK", 700)
    X = _rows(3000, 2, seed=5)
    path = _csv(tmp_path / "u.csv", X)
    ref = _doc(learn(X, 2, **DPEM))
    assert {it["rows"] for it in ref["diagnostics"]["iterations"]} == {3000}
    assert _doc(learn(CSVSource(path, None, block_bytes=3001), 2, **DPEM)) == ref


def _peak_bytes(X) -> int:
    src = ArraySource(X, None, chunk_rows=3000)
    tracemalloc.start()
    try:
        learn(src, 2, **DPEM)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_dpem_memory_does_not_grow_with_n(small_blocks):
    """Peak memory of the learner (rows already in memory as a source, read in chunks) is the
    same at 40 000 and 320 000 rows: no array of N rows is formed (at 320 000 x 2 one would
    be 5 MB)."""
    small, large = _rows(40_000, 2), _rows(320_000, 2)
    _peak_bytes(small)  # the first run's imports and caches are not the learner's
    p_small, p_large = _peak_bytes(small), _peak_bytes(large)
    assert p_large < p_small + (1 << 20), (p_small, p_large)
    assert p_large < large.nbytes


def test_a_learner_that_does_not_stream_gets_the_same_rows_as_one_array(tmp_path):
    assert streams("dp-em") and not streams("kamath-pgme-lite")
    X = _rows(3000, 2, seed=7)
    X[:, 0] *= 3.0
    path = _csv(tmp_path / "u.csv", X, ["a", "b"])
    src = CSVSource(path, None, block_bytes=1 << 12)
    assert np.array_equal(src.to_array(), X)
    opts = dict(epsilon=2.0, delta=1e-6, learner="kamath-pgme-lite", seed=0, R=30.0,
                sigma_min=0.5, sigma_max=3.0)
    a, b = learn(X, 2, **opts), learn(src, 2, **opts)
    assert b.feature_names == ("a", "b")
    assert _doc(a) == _doc(b)


def test_unlabelled_sources_select_columns_and_validate(tmp_path):
    X = _rows(500, 3, seed=2)
    path = _csv(tmp_path / "u.csv", X, ["a", "b", "c"])
    src = CSVSource(path, None, feature_columns=["c", "a"], block_bytes=1 << 10)
    assert src.feature_names == ("c", "a") and src.n_rows() == 500
    assert np.array_equal(src.to_array(), X[:, [2, 0]])
    with pytest.raises(ValueError, match="no column"):
        CSVSource(path, None, feature_columns=["a", "zz"])
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2]}), tmp_path / "u.parquet")
    pqs = ParquetSource(tmp_path / "u.parquet", None, feature_columns=["b"], chunk_rows=77)
    assert np.array_equal(pqs.to_array(), X[:, [1]])
    # a bad value anywhere fails the first pass, worded without the value
    text = path.read_text().splitlines()
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([*text[:400], "1,nan,2", *text[400:]]) + "\n")
    with pytest.raises(SourceReadError, match="NaN or infinite") as err:
        CSVSource(bad, None, block_bytes=1 << 10).n_rows()
    assert "nan" not in str(err.value).replace("NaN", "")
    bad.write_text("\n".join([*text[:400], "1,x7,2", *text[400:]]) + "\n")
    with pytest.raises(SourceReadError, match="must be numeric") as err:
        CSVSource(bad, None).n_rows()
    assert "x7" not in str(err.value)
    # only the selected columns are converted: text in another column is not read as a number
    bad.write_text("\n".join([*text[:400], "1,x7,2", *text[400:]]) + "\n")
    assert CSVSource(bad, None, feature_columns=["a", "c"]).n_rows() == 501


def test_blocks_have_exactly_the_requested_rows():
    X = np.arange(23.0).reshape(-1, 1)
    src = ArraySource(X, None, chunk_rows=4)
    sizes = src.scan_rows(lambda B, off: [(off, len(B), float(B[0, 0]))], list.__add__, [],
                          indexed=True, block_rows=5)
    assert sizes == [(0, 5, 0.0), (5, 5, 5.0), (10, 5, 10.0), (15, 5, 15.0), (20, 3, 20.0)]


def test_learn_command_streams_the_selected_columns(tmp_path, small_blocks):
    X = _rows(2500, 2, seed=9)
    extra = np.random.default_rng(0).normal(size=(2500, 1))
    path = _csv(tmp_path / "u.csv", np.hstack([extra, X]), ["z", "height", "weight"])
    out = tmp_path / "r.json"
    args = ["learn", "--csv", str(path), "--components", "2", "--epsilon", "1", "--delta",
            "1e-6", "--learner", "dp-em", "--param", "R=10", "--param", "sigma_max=2",
            "--seed", "3", "--out", str(out), "--columns", "height, weight"]
    assert main(args) == 0
    doc = json.loads(out.read_text())
    assert doc["feature_names"] == ["height", "weight"]
    ref = learn(X, 2, **DPEM, feature_names=["height", "weight"])
    assert doc["gmm"] == json.loads(ref.to_json())["gmm"]
    assert main([*args[:-1], "height,nope"]) == 2
