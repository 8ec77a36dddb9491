"""The baseline mechanisms: noise on weights, means and covariances, then a projection.

* :mod:`.common`            what they share (public domain, options, block noise, the plan);
* :mod:`.gaussian_iid`      ``gaussian-iid``: i.i.d. Gaussian noise (certified);
* :mod:`.laplace_iid`       ``laplace-iid``: i.i.d. Laplace noise (certified under label flip);
* :mod:`.colored_gaussian`  ``colored-gaussian``: the paper's SDP-shaped mean noise;
* :mod:`.r1smg`             ``r1smg``: rank-one singular multivariate Gaussian noise;
* :mod:`.randomized_response` ``randomized-response``: randomized response on the labels,
  debiased class moments (certified under label flip; pure DP);
* :mod:`.rr_with_prior`     ``rr-with-prior``: randomized response with a prior learned from a
  first stage of reports (certified under label flip; pure DP);
* :mod:`.public_total`      ``public-total``: every class the public features' mean and
  covariance, weights by randomized response (certified under label flip; pure DP).

Each module states its own privacy map.
"""

from .colored_gaussian import ColoredGaussian
from .gaussian_iid import GaussianIID
from .laplace_iid import LaplaceIID
from .public_total import PublicTotal
from .r1smg import R1SMG
from .randomized_response import RandomizedResponse
from .rr_with_prior import RRWithPrior

__all__ = ["ColoredGaussian", "GaussianIID", "LaplaceIID", "PublicTotal", "R1SMG",
           "RandomizedResponse", "RRWithPrior"]
