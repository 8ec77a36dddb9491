"""Synthetic rows from a released GMM: the law of the draw, its independence from the block
size, and what ``klrelease sample`` writes (CSV and Parquet)."""

import csv
import io
import subprocess
import sys
from statistics import NormalDist

import numpy as np
import pyarrow.parquet as pq
import pytest

import klrelease as kr
from klrelease.cli import main
from klrelease.gmm import GMM, normal_cuts


def _gmm(K=4, d=3, seed=0, weights=None):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(K, d, d))
    cov = A @ np.swapaxes(A, 1, 2) + 0.5 * np.eye(d)
    w = rng.dirichlet(np.ones(K)) if weights is None else np.asarray(weights)
    return GMM(w, rng.normal(scale=4.0, size=(K, d)), cov, tuple(f"c{k}" for k in range(K)))


def test_the_rows_follow_the_model():
    g = _gmm(weights=[0.5, 0.3, 0.15, 0.05])
    n = 200_000
    X = np.empty((n, g.n_features))
    comp = np.empty(n, dtype=np.intp)
    a = 0
    for Xb, cb in g.sample_blocks(n, 11, block=30_000):
        X[a:a + len(Xb)], comp[a:a + len(Xb)] = Xb, cb
        a += len(Xb)
    assert a == n
    counts = np.bincount(comp, minlength=g.n_components)
    # proportions within 6 standard errors of the weights
    se = np.sqrt(g.weights * (1 - g.weights) / n)
    assert np.all(np.abs(counts / n - g.weights) < 6 * se), (counts / n, g.weights)
    for k in range(g.n_components):
        rows = X[comp == k]
        S = g.covariances[k]
        nk = len(rows)
        assert np.all(np.abs(rows.mean(0) - g.means[k]) < 6 * np.sqrt(np.diag(S) / nk))
        # each entry of the sample covariance within 6 standard errors (Gaussian rows)
        se_cov = np.sqrt((np.outer(np.diag(S), np.diag(S)) + S**2) / nk)
        assert np.all(np.abs(np.cov(rows.T) - S) < 6 * se_cov)


def test_the_rows_are_the_same_whatever_the_block_size():
    g = _gmm(K=10, d=10, seed=3)
    n = 5000
    ref = list(g.sample_blocks(n, 7, block=n))
    X_ref, c_ref = ref[0]
    for block in (1, 2, 3, 7, 100, 4096, 4999, 10**6):
        blocks = list(g.sample_blocks(n, np.random.default_rng(7), block=block))
        assert max(len(X) for X, _ in blocks) == min(block, n)
        X = np.concatenate([X for X, _ in blocks])
        c = np.concatenate([c for _, c in blocks])
        assert np.array_equal(X, X_ref) and np.array_equal(c, c_ref), block  # bit for bit
    X, y = g.sample(n, 7)  # the one-block draw
    assert np.array_equal(X, X_ref) and list(y) == [g.classes[k] for k in c_ref]


def test_the_cut_points_give_the_weights():
    w = np.array([0.1, 0.0, 0.3, 0.6 - 1e-12, 1e-12])
    cuts = normal_cuts(w)
    assert np.all(np.diff(cuts) >= 0)
    below = [NormalDist().cdf(t) for t in cuts]
    np.testing.assert_allclose(below, np.cumsum(w)[:-1], rtol=1e-14, atol=0)
    # the mass above the last cut keeps its relative accuracy
    assert NormalDist().cdf(-cuts[-1]) == pytest.approx(1e-12, rel=1e-9)
    g = _gmm(K=5, weights=w)
    comp = np.concatenate([c for _, c in g.sample_blocks(100_000, 0)])
    assert not np.any(comp == 1)  # a weight of 0 is never drawn
    assert np.array_equal(normal_cuts(np.array([0.0, 1.0, 0.0])), [-np.inf, np.inf])
    assert normal_cuts(np.array([1.0])).shape == (0,)


def test_bad_sizes_are_refused():
    g = _gmm()
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="n must be"):
            next(g.sample_blocks(bad))
    with pytest.raises(ValueError, match="block must be"):
        next(g.sample_blocks(10, block=0))
    assert list(g.sample_blocks(0)) == []


@pytest.fixture
def artifacts(tmp_path, iris):
    """An iris release (text classes) and one with integer classes."""
    text = kr.release(iris, None, epsilon=1.0, delta=1e-5, mechanism="gaussian-iid", seed=0)
    (tmp_path / "iris.json").write_text(text.to_json())
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], 200)
    X = rng.normal(size=(600, 2)) + np.array([[0, 0], [5, 0], [0, 5]])[y]
    ints = kr.release(X, y, epsilon=2.0, delta=1e-5, seed=3, mechanism="kl-paper")
    (tmp_path / "ints.json").write_text(ints.to_json())
    return tmp_path


def _run(args, cwd):
    return subprocess.run([sys.executable, "-m", "klrelease", *args], cwd=cwd,
                          capture_output=True, timeout=300)


@pytest.mark.filterwarnings("ignore::klrelease.warnings_.PrivacyLeakWarning")
def test_csv_holds_the_drawn_rows_exactly(artifacts, monkeypatch):
    import klrelease.cli.release as cli_release

    monkeypatch.chdir(artifacts)
    assert main(["sample", "iris.json", "-n", "1000", "--seed", "5", "--out", "a.csv"]) == 0
    monkeypatch.setattr(cli_release, "SAMPLE_CHUNK", 7)
    assert main(["sample", "iris.json", "-n", "1000", "--seed", "5", "--out", "b.csv"]) == 0
    text = (artifacts / "a.csv").read_text()
    assert text == (artifacts / "b.csv").read_text()  # the block size changes nothing
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["sepal_length", "sepal_width", "petal_length", "petal_width", "label"]
    assert len(rows) == 1001 and text.endswith("\n") and '"' not in text
    rel = kr.artifact.load_model(artifacts / "iris.json")
    ((X, comp),) = rel.gmm.sample_blocks(1000, np.random.default_rng(5), block=1000)
    # the shortest text of each double reads back as the same double
    assert np.array_equal(np.array([[float(v) for v in r[:4]] for r in rows[1:]]), X)
    assert [r[4] for r in rows[1:]] == [str(rel.gmm.classes[k]) for k in comp]


@pytest.mark.filterwarnings("ignore::klrelease.warnings_.PrivacyLeakWarning")
@pytest.mark.parametrize(("name", "label_type"), [("iris", "string"), ("ints", "int64")])
def test_parquet_has_the_columns_and_rows_of_the_csv(artifacts, monkeypatch, name,
                                                      label_type):
    monkeypatch.chdir(artifacts)
    args = ["sample", f"{name}.json", "-n", "3000", "--seed", "2"]
    assert main([*args, "--out", "s.csv"]) == 0
    assert main([*args, "--out", "s.parquet"]) == 0
    assert main([*args, "--out", "s.data", "--format", "parquet"]) == 0
    assert main([*args, "--out", "s.pq"]) == 0
    table = pq.read_table("s.parquet")
    rows = list(csv.reader(open("s.csv")))
    assert table.column_names == rows[0]
    assert [str(t) for t in table.schema.types] == ["double"] * (len(rows[0]) - 1) + [label_type]
    assert table.num_rows == 3000 and pq.ParquetFile("s.parquet").metadata.num_row_groups == 1
    cols = table.to_pydict()
    for j, col in enumerate(rows[0]):
        got = [str(v) for v in cols[col]]
        want = [r[j] for r in rows[1:]]
        if j < len(rows[0]) - 1:
            assert [float(v) for v in got] == [float(v) for v in want]
        else:
            assert got == want
    for other in ("s.data", "s.pq"):
        assert pq.read_table(other).equals(table)


@pytest.mark.filterwarnings("ignore::klrelease.warnings_.PrivacyLeakWarning")
def test_dash_writes_csv_or_parquet_to_standard_output(artifacts):
    r = _run(["sample", "ints.json", "-n", "4", "--seed", "1", "--out", "-"], artifacts)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert lines[0] == "x0,x1,label" and len(lines) == 5
    assert {line.rsplit(",", 1)[1] for line in lines[1:]} <= {"0", "1", "2"}
    r = _run(["sample", "ints.json", "-n", "4", "--seed", "1", "--out", "-", "--format",
              "parquet"], artifacts)
    assert r.returncode == 0, r.stderr
    table = pq.read_table(io.BytesIO(r.stdout))
    assert table.num_rows == 4 and table.column_names == ["x0", "x1", "label"]
    assert b"standard output" in r.stderr
    assert sorted(p.name for p in artifacts.iterdir()) == ["ints.json", "iris.json"]


@pytest.mark.filterwarnings("ignore::klrelease.warnings_.PrivacyLeakWarning")
def test_a_bad_format_is_refused_before_anything_is_written(artifacts, monkeypatch, capsys):
    monkeypatch.chdir(artifacts)
    assert main(["sample", "iris.json", "--out", "s.csv", "--format", "xlsx"]) == 2
    assert "--format must be csv or parquet" in capsys.readouterr().err
    assert not (artifacts / "s.csv").exists()


@pytest.mark.filterwarnings("ignore::klrelease.warnings_.PrivacyLeakWarning")
def test_labels_with_a_separator_are_quoted(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    y = np.repeat(["a,b", 'say "c"'], 100)
    X = rng.normal(size=(200, 2)) + np.where(y[:, None] == "a,b", 0.0, 4.0)
    rel = kr.release(X, y, epsilon=2.0, delta=1e-5, seed=3, mechanism="kl-paper")
    (tmp_path / "r.json").write_text(rel.to_json())
    monkeypatch.chdir(tmp_path)
    assert main(["sample", "r.json", "-n", "50", "--seed", "0", "--out", "s.csv"]) == 0
    rows = list(csv.reader(open("s.csv")))
    assert rows[0] == ["x0", "x1", "label"]
    assert {r[2] for r in rows[1:]} <= {"a,b", 'say "c"'} and all(len(r) == 3 for r in rows)


def test_blocks_in_flight_are_bounded():
    from klrelease.cli.release import _in_order

    drawn, written, most = [0], [0], [0]

    def blocks():
        for i in range(50):
            drawn[0] += 1
            most[0] = max(most[0], drawn[0] - written[0])
            yield (i,)

    out = []
    for value in _in_order(blocks(), lambda i: i * i, 3):
        written[0] += 1
        out.append(value)
    assert out == [i * i for i in range(50)]  # in order
    assert most[0] <= 3 + 1


def test_no_block_is_written_after_a_failed_one():
    """A write that fails in the writing thread stops every later block's write: on standard
    output a later block would land after a hole that cannot be removed."""
    import time

    from klrelease.cli.release import _in_order

    wrote = []

    def write(i):
        if i == 2:
            time.sleep(0.2)  # the next block is queued before this failure is seen
            raise OSError(5, "Input/output error")
        wrote.append(i)

    with pytest.raises(OSError):
        for _ in _in_order(((i,) for i in range(6)), write, 1):
            pass
    assert wrote == [0, 1]


def _float_bits(values):
    return np.asarray(values, dtype=np.float64).view(np.int64)


def test_csv_numbers_are_the_shortest_text_that_reads_back_exactly():
    from klrelease.cli.release import _binary_array, csv_lines

    rng = np.random.default_rng(4)
    bits = rng.integers(-2**63, 2**63 - 1, size=60_000, dtype=np.int64, endpoint=True)
    specials = [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308,
                -1.7976931348623157e308, 1e16, 1e-7, 0.1, 1 / 3, 100.0, 2.0**53 + 2, 1e23,
                123456.0, 1e-5, 9.999999999999999e22]
    x = np.concatenate([specials, [np.inf, -np.inf, np.nan], bits.view(np.float64),
                        rng.standard_normal(20_000) * 10.0 ** rng.integers(-30, 30, 20_000)])
    x = x[: x.size // 6 * 6]
    assert np.isposinf(x).any() and np.isneginf(x).any()
    X = x.reshape(-1, 6)
    comp = rng.integers(0, 2, X.shape[0])
    ends = _binary_array([b"a\n", b'"b,c"\n'])
    lines = bytes(csv_lines(X, comp, ends)).decode().splitlines()
    assert len(lines) == X.shape[0]
    cells = [line.split(",", 6) for line in lines]
    assert [c[6] for c in cells] == [["a", '"b,c"'][k] for k in comp]
    texts = [t for c in cells for t in c[:6]]
    back = np.array([float(t) for t in texts])
    nan = np.isnan(x)
    assert np.array_equal(np.isnan(back), nan)
    assert np.array_equal(_float_bits(back)[~nan], _float_bits(x)[~nan])  # -0.0 included
    for t, v in zip(texts, x, strict=True):  # as few digits as Python's repr (the shortest)
        if np.isfinite(v):
            digits = t.lstrip("-").split("e")[0].replace(".", "").strip("0")
            assert digits == repr(float(v)).lstrip("-").split("e")[0].replace(".", "").strip("0")
        else:
            assert t == {"nan": "nan", "inf": "inf", "-inf": "-inf"}[repr(float(v))]


def test_the_threaded_csv_writer_writes_the_bytes_of_one_block_in_one_thread():
    import io

    from klrelease.cli.release import _binary_array, csv_lines, write_rows

    g = _gmm(K=5, d=4, seed=2)
    ends = _binary_array([f"{c}\n".encode() for c in g.classes])
    ((X, comp),) = g.sample_blocks(20_000, 9, block=20_000)
    X[[3, 4000, 19_999], [0, 2, 3]] = [np.inf, -np.inf, np.nan]  # rows that are not finite
    one = b"x0,x1,x2,x3,label\n" + bytes(csv_lines(X, comp, ends))
    for block in (1, 999, 4096, 20_000):
        blocks = ((X[a:a + block], comp[a:a + block]) for a in range(0, len(X), block))
        out = io.BytesIO()
        write_rows(out, blocks, ["x0", "x1", "x2", "x3"], g.classes, "csv")
        assert out.getvalue() == one, block
    # an empty block writes nothing (orjson's text of no rows is b"[]")
    out = io.BytesIO()
    write_rows(out, [(X[:0], comp[:0]), (X[:5], comp[:5]), (X[5:5], comp[5:5])],
               ["x0", "x1", "x2", "x3"], g.classes, "csv")
    assert out.getvalue() == b"x0,x1,x2,x3,label\n" + bytes(csv_lines(X[:5], comp[:5], ends))
    # and the drawn rows, in blocks, give the text of the one-block draw
    ((X, comp),) = g.sample_blocks(5000, 3, block=5000)
    out = io.BytesIO()
    write_rows(out, g.sample_blocks(5000, 3, block=512), ["x0", "x1", "x2", "x3"], g.classes,
               "csv")
    assert out.getvalue() == b"x0,x1,x2,x3,label\n" + bytes(csv_lines(X, comp, ends))
