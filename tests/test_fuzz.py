"""Property-based fuzzing of the public API and the command line.

Over shapes, dtypes, feature scales from 1e-300 to 1e300, labels and options, every call ends
in one of: a release (a finite GMM whose artifact loads back), a mechanism's FAIL output, or a
ValueError raised before any noise is drawn (the generator untouched). Nothing else: no other
exception type, no NaN in an artifact, no warning other than the privacy warnings that options
decide. Deterministic (derandomized, no example database) and bounded in time.

Known defects owned elsewhere are reproduced by the xfail tests at the end and kept out of the
fuzzed domain: kl-certified at feature scales beyond 1e150 and at extreme (eps, delta), and
ppe-gaussian's configuration at epsilon above 100.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import klrelease as kr
from klrelease.artifact import Release
from klrelease.cli import main
from klrelease.learners.result import MechanismFailed
from klrelease.stream import ArraySource
from klrelease.warnings_ import PrivacyLeakWarning, UnusedBoundWarning


def fuzz(max_examples: int) -> settings:
    """Deterministic in CI: derandomized, no example database, no per-example deadline."""
    return settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                    print_blob=True, suppress_health_check=[HealthCheck.too_slow])

MECHANISMS = ("kl-paper", "gaussian-iid", "colored-gaussian", "laplace-iid", "r1smg",
              "ppe-gaussian")


def _exponent(lo: int, hi: int):
    """Powers of ten: ordinary ones as often as the extreme range."""
    return st.one_of(st.integers(-3, 3), st.integers(lo, hi))


@st.composite
def cases(draw, mechanisms=MECHANISMS, scales=(-300, 300), log_eps=(-9.0, 3.0),
          log_delta=(-250.0, -0.5)):
    scale = 10.0 ** draw(_exponent(*scales))
    case = {
        "seed": draw(st.integers(0, 2**16)),
        "N": draw(st.integers(2, 40)),
        "d": draw(st.integers(1, 4)),
        "K": draw(st.integers(2, 3)),
        "scale": scale,
        "offset": draw(st.sampled_from([0.0, 3.0, 1e3])),
        "dtype": draw(st.sampled_from(["float64", "float32", "int64"])),
        "labels": draw(st.sampled_from(["int", "str"])),
        "declare": draw(st.sampled_from([True, True, False])),
        "bound": draw(st.sampled_from(["none", "ball", "box", "features"])),
        # a bound in the data's units, or anywhere
        "bound_scale": draw(st.one_of(st.sampled_from([3.0, 10.0, 1e3]).map(lambda f: f * scale),
                                      st.integers(*scales).map(lambda e: 10.0 ** e))),
        "adjacency": draw(st.sampled_from([None, None, "label-flip", "replace-one"])),
        "epsilon": 10.0 ** draw(st.one_of(st.floats(-1.0, 1.0), st.floats(*log_eps))),
        "delta": 10.0 ** draw(st.one_of(st.floats(-8.0, -3.0), st.floats(*log_delta))),
        "mechanism": draw(st.sampled_from(mechanisms)),
        "streamed": draw(st.booleans()),
    }
    if case["mechanism"] == "ppe-gaussian":  # beyond: a defect reproduced at the end
        case["epsilon"] = min(case["epsilon"], 100.0)
    return case


def build(case):
    """``(X, y, keyword arguments of release)`` of a case (X may be a chunked source)."""
    rng = np.random.default_rng(case["seed"])
    N, d, K = case["N"], case["d"], case["K"]
    with np.errstate(all="ignore"):  # the test's own casts (float32 overflows to inf: refused)
        X = (rng.normal(size=(N, d)) + case["offset"]) * case["scale"]
        X = X.astype(case["dtype"])
    codes = rng.integers(0, K, N)
    classes = list(range(K)) if case["labels"] == "int" else [f"c{k}" for k in range(K)]
    y = codes if case["labels"] == "int" else np.asarray(classes, dtype=object)[codes]
    kw = {"epsilon": case["epsilon"], "delta": case["delta"], "mechanism": case["mechanism"]}
    public = {}
    if case["declare"]:
        public["classes"] = classes
    b = case["bound_scale"]
    if case["bound"] == "ball":
        public["norm_bound"] = b
    elif case["bound"] == "box":
        public["bounds"] = (-b, b)
    elif case["bound"] == "features":
        kw["bounds"] = "features"
    if case["adjacency"]:
        kw["adjacency"] = case["adjacency"]
    if case["streamed"]:
        return ArraySource(X, y, chunk_rows=7, **public), None, kw
    return X, y, {**kw, **public}


def check(case) -> str:
    """Run one case and assert the contract; returns the outcome."""
    X, y, kw = build(case)
    gen = np.random.default_rng(1)
    untouched = pickle.dumps(gen.bit_generator.state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            rel = kr.release(X, y, seed=gen, **kw)
        except MechanismFailed:
            return "FAIL"
        except ValueError as exc:
            assert pickle.dumps(gen.bit_generator.state) == untouched, \
                f"ValueError after noise was drawn: {exc}"
            assert str(exc)
            return "refused"
        finally:
            others = [f"{w.category.__name__}: {w.message}" for w in caught
                      if not issubclass(w.category, (PrivacyLeakWarning, UnusedBoundWarning))]
            assert not others, others
    g = rel.gmm
    for values in (g.weights, g.means, g.covariances):
        assert np.all(np.isfinite(values))
    back = Release.from_json(rel.to_json())
    np.testing.assert_array_equal(back.gmm.means, g.means)
    return "release"


@fuzz(250)
@given(case=cases())
def test_the_api_releases_or_refuses_before_noise(case):
    event(f"{case['mechanism']}: {check(case)}")


@fuzz(80)
@given(case=cases(mechanisms=("kl-certified",), scales=(-150, 150), log_eps=(-3.0, 3.0),
                  log_delta=(-12.0, -0.5)))
def test_kl_certified_releases_or_refuses_before_noise(case):
    event(check(case))


def test_the_fuzzed_domain_reaches_every_outcome():
    """The strategy is not vacuous: releases, refusals and FAIL outputs all occur."""
    seen = set()
    for seed in range(60):
        seen.add(check(_fixed_case(seed)))
    assert seen == {"release", "refused", "FAIL"}


def _fixed_case(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"seed": seed, "N": int(rng.integers(6, 30)), "d": int(rng.integers(1, 4)), "K": 2,
            "scale": 10.0 ** int(rng.integers(-5, 5)), "offset": 0.0, "dtype": "float64",
            "labels": "int", "declare": True, "bound": str(rng.choice(["none", "box"])),
            "bound_scale": 10.0, "adjacency": None, "epsilon": 1.0, "delta": 1e-5,
            "mechanism": str(rng.choice(["kl-paper", "gaussian-iid", "ppe-gaussian"])),
            "streamed": False}


# ---------------------------------------------------------------------------- command line


@st.composite
def command_lines(draw):
    good = st.floats(1e-6, 1e2).map(repr)
    bad = st.sampled_from(["0", "-1", "abc", "inf", "nan", "1e-300", "1e300", "true", ""])
    number = st.one_of(good, good, good, good, good, bad)
    delta = st.one_of(*[st.floats(1e-9, 0.1).map(repr)] * 5, bad)
    args = ["--epsilon", draw(number), "--delta", draw(delta)]
    args += ["--mechanism", draw(st.sampled_from(["kl-certified", "kl-certified", "kl-paper",
                                                   "gaussian-iid", "ppe-gaussian", "nope"]))]
    extra = draw(st.lists(st.sampled_from([
        ["--classes", "0,1,2"], ["--norm-bound", "10"], ["--lower", "-5", "--upper", "5"],
        ["--option", "adjacency=replace-one"], ["--seed", "3"], ["--force"],
    ]), max_size=3, unique_by=lambda item: item[0]))
    if draw(st.integers(0, 2)) == 0:  # one thing wrong, a third of the time
        extra.append(draw(st.sampled_from([
            ["--classes", ""], ["--classes", "0,1"], ["--classes", "a,b"],
            ["--norm-bound", "-1"], ["--norm-bound", "1e-300"], ["--lower", "5", "--upper", "-5"],
            ["--option", "adjacency=bogus"], ["--option", "nope=1"], ["--seed", "-2"],
        ])))
    for item in extra:
        args += item
    return {"args": args, "scale": 10.0 ** draw(_exponent(-300, 300)),
            "seed": draw(st.integers(0, 1000))}


def run_cli(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        rc = main(args)
    return rc, err.getvalue()


@fuzz(60)
@given(cl=command_lines())
def test_the_command_line_exits_cleanly(cl):
    rng = np.random.default_rng(cl["seed"])
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "d.npz"
        np.savez(data, X=rng.normal(size=(30, 3)) * cl["scale"], y=np.repeat([0, 1, 2], 10))
        out = Path(tmp) / "r.json"
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            rc, err = run_cli(["release", "--npz", str(data), *cl["args"], "--out", str(out)])
        assert "Traceback" not in err
        assert rc in (0, 2, 3), err
        event(f"exit {rc}")
        lines = err.strip().splitlines()
        if rc == 2:
            assert len(lines) == 1 and lines[0].startswith("error: "), err
            assert not out.exists()
        elif rc == 3:
            assert lines[-1].startswith("FAIL at stage ")
            assert json.loads(out.read_text())["status"] == "FAIL"
        else:
            rel = Release.load(out)
            assert np.all(np.isfinite(rel.gmm.means))


# ------------------------------------------------------------------ known defects, elsewhere

@pytest.mark.parametrize("scale", [1e160, 1e200, 1e250])
def test_kl_certified_at_feature_scales_beyond_1e154(scale):
    check({**_fixed_case(0), "mechanism": "kl-certified", "scale": scale, "N": 30, "d": 3})


def test_kl_certified_at_epsilon_1e_9_delta_1e_300():
    X, y = np.random.default_rng(0).normal(size=(60, 2)), np.repeat([0, 1, 2], 20)
    gen = np.random.default_rng(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        kr.release(X, y, epsilon=1e-9, delta=1e-300, classes=[0, 1, 2], seed=gen)


def test_kl_certified_frame_raises_no_numpy_warning():
    X, y = np.random.default_rng(0).normal(size=(30, 2)) * 1e200, np.repeat([0, 1, 2], 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        warnings.simplefilter("ignore", PrivacyLeakWarning)
        with contextlib.suppress(ValueError):
            kr.plan(X, y, epsilon=1.0, delta=1e-5, classes=[0, 1, 2])


@pytest.mark.xfail(strict=False, reason="ppe-gaussian's configuration raises OverflowError "
                   "and warns (klrelease/learners/ppe/tlap.py t_min) at epsilon of 300 and more")
@pytest.mark.parametrize(("epsilon", "delta"), [(1000.0, 1e-91), (610.0, 5.2e-259)])
def test_ppe_gaussian_at_large_epsilon(epsilon, delta):
    check({**_fixed_case(0), "mechanism": "ppe-gaussian", "epsilon": epsilon, "delta": delta,
           "N": 17, "d": 2})
