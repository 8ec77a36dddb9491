"""``ppe-gaussian``: one Gaussian per class by private parameter estimation (certified).

* :mod:`.mechanism`       the mechanism and its plan;
* ``ppe_gaussian.md``     the proof, shipped with the package and cited by every release.
"""

from .mechanism import PPEGaussian, PPEGaussianPlan

__all__ = ["PPEGaussian", "PPEGaussianPlan"]
