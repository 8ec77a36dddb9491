"""Privacy building blocks shared by the mechanisms: noise calibration and projections."""

from .calibration import (
    analytic_gaussian_sigma,
    classic_gaussian_sigma,
    gaussian_delta,
    gaussian_max_sensitivity,
)
from .projections import project_psd, project_simplex, round_to_grid

__all__ = [
    "analytic_gaussian_sigma",
    "classic_gaussian_sigma",
    "gaussian_delta",
    "gaussian_max_sensitivity",
    "project_psd",
    "project_simplex",
    "round_to_grid",
]
