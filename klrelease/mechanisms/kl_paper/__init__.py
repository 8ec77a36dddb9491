"""``kl-paper``: the paper's mechanism and its KL-minimising design (Algorithm 1).

* :mod:`.mechanism`       the mechanism (its privacy claim is not certified; see there);
* :mod:`.objective`       the design objective (12), the expected KL the paper minimises;
* :mod:`.wishart_scale`   the closed-form Wishart scale (22);
* :mod:`klrelease.mean_noise` the mean-noise SDP (23), solved once per class (shared with
  colored-gaussian);
* :mod:`.weight_mapping`  the weight-mapping PMF of Proposition 2 (25)-(27), column normalised;
* :mod:`.alternating`     the alternating loop that ties them together.
"""

from .alternating import PaperDesign, design_kl_paper
from .mechanism import KLPaper, KLPaperPlan

__all__ = ["KLPaper", "KLPaperPlan", "PaperDesign", "design_kl_paper"]
