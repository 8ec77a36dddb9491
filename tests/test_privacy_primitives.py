import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from klrelease.privacy import (
    analytic_gaussian_sigma,
    classic_gaussian_sigma,
    gaussian_delta,
    project_psd,
    project_simplex,
    round_to_grid,
)

# Reference values (sensitivity 1) of the analytic Gaussian mechanism.
VECTORS = [(0.5, 1e-5, 7.031827), (1, 1e-5, 3.730632), (2, 1e-5, 1.993812),
           (8, 1e-5, 0.600229), (1, 1e-6, 4.224679), (1, 1e-2, 1.877876),
           (0.1, 1e-5, 30.74957)]


@pytest.mark.parametrize("eps, delta, sigma", VECTORS)
def test_analytic_gaussian_reference_values(eps, delta, sigma):
    assert analytic_gaussian_sigma(eps, delta) == pytest.approx(sigma, rel=2e-7, abs=1e-6)
    assert gaussian_delta(sigma * (1 + 1e-6), eps) <= delta
    assert gaussian_delta(sigma * (1 - 1e-4), eps) > delta


def test_analytic_matches_dp_accounting():
    from dp_accounting import gaussian_mechanism

    for eps, delta, _ in VECTORS:
        ref = gaussian_mechanism.get_sigma_gaussian(eps, delta)
        assert analytic_gaussian_sigma(eps, delta) == pytest.approx(ref, rel=1e-4)


def test_classic_refuses_large_epsilon_and_overnoises():
    with pytest.raises(ValueError, match="epsilon < 1"):
        classic_gaussian_sigma(2.0, 1e-5)
    assert classic_gaussian_sigma(0.5, 1e-5) > analytic_gaussian_sigma(0.5, 1e-5)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=8))
def test_simplex_projection(u):
    u = np.array(u)
    floor = 0.1 / len(u)
    w = project_simplex(u, floor)
    assert w.sum() == pytest.approx(1.0)
    assert np.all(w >= floor - 1e-12)
    # optimality: no other feasible point is closer (check against random feasible points)
    rng = np.random.default_rng(0)
    for _ in range(20):
        z = rng.dirichlet(np.ones(len(u))) * (1 - len(u) * floor) + floor
        assert np.linalg.norm(w - u) <= np.linalg.norm(z - u) + 1e-9


def test_grid_rounding():
    n = round_to_grid(np.array([0.0, 0.2, 0.8]), 10)
    assert n.sum() == 10 and n.min() >= 1
    assert list(round_to_grid(np.array([0.5, 0.25, 0.25]), 8)) == [4, 2, 2]


def test_psd_projection():
    S = np.array([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues 3, -1
    P = project_psd(S, 1e-3)
    np.testing.assert_allclose(np.linalg.eigvalsh(P), [1e-3, 3.0], atol=1e-12)
