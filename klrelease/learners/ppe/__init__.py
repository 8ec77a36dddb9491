"""The PPE family: private populous estimators for unbounded Gaussians and Gaussian mixtures.

Registers the unlabelled-data learners

* ``ppe-gmm``       -- K-component GMM by PPE with scikit-learn EM per block (Arbas, Ashtiani &
  Liaw 2023);
* ``ppe-gaussian-oneshot`` -- one Gaussian by a single PPE call (K = 1; the labelled
  mechanism ``ppe-gaussian`` is a different object, in :mod:`klrelease.mechanisms`);
* ``ppme-gaussian`` -- one Gaussian by the staged pipeline of Ashtiani & Liaw (2022): rank,
  PPME covariance preconditioner, fine covariance, mean.

Privacy statements and proofs: ``PPE.md`` in this folder. Modules: :mod:`.tlap` (truncated
Laplace), :mod:`.distances`, :mod:`.masking` (masks and the exact radius), :mod:`.framework`
(``ppe`` and ``ppme``), :mod:`.params`, :mod:`.learners`, :mod:`.gaussian`, :mod:`.simulator`.
"""

from __future__ import annotations

from ..result import register_learner
from .gaussian import ppme_gaussian
from .learners import ppe_gaussian, ppe_gmm

__all__ = ["ppe_gmm", "ppe_gaussian", "ppme_gaussian"]

register_learner("ppe-gmm", ppe_gmm)
register_learner("ppe-gaussian-oneshot", ppe_gaussian)
register_learner("ppme-gaussian", ppme_gaussian)
