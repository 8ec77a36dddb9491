"""Declared class lists that declare nothing are refused with a message that says so."""

import subprocess
import sys

import numpy as np
import pytest

CLI = [sys.executable, "-m", "klrelease"]


def run(args, cwd):
    return subprocess.run(CLI + args, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_an_empty_class_list_says_what_is_wrong(tmp_path):
    import klrelease as kr
    from klrelease.stream import ArraySource

    X, y = np.random.default_rng(0).normal(size=(30, 2)), np.repeat([0, 1, 2], 10)
    for call in (lambda: kr.release(X, y, classes=[], epsilon=1, delta=1e-5),
                 lambda: kr.release(ArraySource(X, y, classes=[]), None, epsilon=1,
                                    delta=1e-5)):
        with pytest.raises(ValueError, match="classes must be a non-empty list of labels"):
            call()
    with pytest.raises(ValueError, match="not one string"):
        kr.release(X, y, classes="012", epsilon=1, delta=1e-5)
    r = run(["release", "--npz", "d.npz", "--classes", "", "--epsilon", "1", "--delta",
             "1e-5"], tmp_path)
    assert r.returncode == 2 and "--classes takes a comma-separated list" in r.stderr
