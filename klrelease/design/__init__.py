"""Step 3 of the pipeline: the KL-minimising design of the paper's mechanism (Algorithm 1).

* :mod:`.objective`       the design objective (12), the expected KL the paper minimises;
* :mod:`.wishart_scale`   the closed-form Wishart scale (22);
* :mod:`.mean_noise`      the mean-noise SDP (23), solved once per class (homogeneity);
* :mod:`.weight_mapping`  the weight-mapping PMF of Proposition 2 (25)-(27), column normalised;
* :mod:`.alternating`     the alternating loop that ties them together.
"""

from .alternating import PaperDesign, design_kl_paper

__all__ = ["PaperDesign", "design_kl_paper"]
