"""The one public-bound type: a box or a ball, validated once, used by every layer."""

from __future__ import annotations

import numpy as np
import pytest

import klrelease as kr
from klrelease.cli import main
from klrelease.domain import Domain


def test_box_is_validated_once_with_one_message_per_defect():
    with pytest.raises(ValueError, match="lower < upper"):
        Domain.box([0.0, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="finite"):
        Domain.box([0.0, -np.inf], [1.0, 1.0])
    with pytest.raises(ValueError, match="one value per feature"):
        Domain.box([0.0, 0.0, 0.0], [1.0, 1.0], d=2)
    with pytest.raises(ValueError, match="pair"):
        Domain.from_public(bounds=[0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="not both"):
        Domain.from_public(bounds=(0, 1), norm_bound=2.0)
    for bad in (0.0, -1.0, np.nan, np.inf, "abc", True):
        with pytest.raises(ValueError, match="norm_bound"):
            Domain.ball(bad, 2)
    assert Domain.from_public() is None


def test_box_and_ball_geometry():
    box = Domain.box([0.0, -1.0], [2.0, 3.0])
    assert box.d == 2 and box.kind == "box"
    np.testing.assert_array_equal(box.centre, [1.0, 1.0])
    np.testing.assert_array_equal(box.half_widths, [1.0, 2.0])
    assert box.diameter("l2") == pytest.approx(np.hypot(2.0, 4.0))
    assert box.diameter("l1") == pytest.approx(6.0)
    X = np.array([[5.0, -5.0], [1.0, 1.0]])
    np.testing.assert_array_equal(box.clip(X), [[2.0, -1.0], [1.0, 1.0]])

    ball = Domain.ball(2.0, 3)
    np.testing.assert_array_equal(ball.centre, np.zeros(3))
    assert ball.diameter("l2") == 4.0 and ball.diameter("l1") == pytest.approx(4 * np.sqrt(3))
    Y = ball.clip(np.array([[3.0, 4.0, 0.0], [0.1, 0.0, 0.0]]))
    np.testing.assert_allclose(np.linalg.norm(Y, axis=1), [2.0, 0.1])
    with pytest.raises(ValueError, match="l1"):
        ball.diameter("linf")


def test_scalar_box_broadcasts_when_the_dimension_is_known():
    box = Domain.box(0.0, 1.0)
    assert box.d is None
    fixed = box.for_features(3)
    assert fixed.d == 3 and fixed.bounds[1].tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="features"):
        Domain.box([0.0, 0.0], [1.0, 1.0]).for_features(3)


def test_json_round_trip():
    for dom in (Domain.box([0.0, -1.0], [2.0, 3.0]), Domain.ball(1.5, 4)):
        back = Domain.from_json(dom.to_json())
        assert back == dom and back.to_json() == dom.to_json()
    with pytest.raises(ValueError, match="kind"):
        Domain.from_json({"kind": "cube"})


def test_data_layer_and_mechanisms_share_the_domain(iris):
    assert isinstance(iris.domain, Domain) and iris.domain.kind == "box"
    lo, hi = iris.bounds
    np.testing.assert_array_equal(lo, iris.domain.lower)
    ball = kr.as_labelled_data(iris.X, iris.codes, classes=range(3), norm_bound=10.0)
    assert ball.domain == Domain.ball(10.0, 4) and ball.bounds is None and ball.norm_bound == 10
    with pytest.raises(ValueError, match="not both"):
        kr.as_labelled_data(iris.X, iris.codes, bounds=(lo, hi), norm_bound=10.0)
    # a Domain given as bounds= releases exactly what the (lower, upper) pair releases
    a = kr.release(iris, None, epsilon=1.0, delta=1e-5, mechanism="gaussian-iid", seed=4,
                   bounds=Domain.box(lo, hi))
    b = kr.release(iris.X, iris.codes, epsilon=1.0, delta=1e-5, mechanism="gaussian-iid",
                   seed=4, classes=range(3), bounds=(lo, hi))
    np.testing.assert_array_equal(a.gmm.means, b.gmm.means)
    # kl-certified under replace-one: box and ball frames from the same type
    for bound in ({"bounds": Domain.box(lo, hi)}, {"norm_bound": 10.0}):
        rel = kr.release(iris, None, epsilon=1.0, delta=1e-5, adjacency="replace-one",
                         **bound)
        assert rel.privacy.certified


def test_cli_validates_the_domain_before_reading_data(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(["release", "--csv", str(tmp_path / "missing.csv"), "--epsilon", "1",
                 "--delta", "1e-5", "--lower", "1,2", "--upper", "0,3", "--out", str(out)])
    assert code == 2 and "lower < upper" in capsys.readouterr().err and not out.exists()
    code = main(["release", "--dataset", "iris", "--epsilon", "1", "--delta", "1e-5",
                 "--lower", "0", "--upper", "10", "--norm-bound", "3", "--out", str(out)])
    assert code == 2 and "not both" in capsys.readouterr().err and not out.exists()
