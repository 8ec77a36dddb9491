"""``kl-certified``: the KL-minimising release with a proven (eps, delta) guarantee.

* :mod:`.mechanism`       the mechanism (stages A-C, the plan, the certified statement);
* :mod:`.design`          its design: frame, clipping, budget split, Gaussian calibration;
* ``kl_certified.md``     the proof, shipped with the package and cited by every release.
"""

from .mechanism import KLCertified, KLCertifiedPlan, public_frame

__all__ = ["KLCertified", "KLCertifiedPlan", "public_frame"]
