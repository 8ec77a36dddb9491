"""klrelease: differentially private release of labelled Gaussian mixture models.

The pipeline, one module per step:

1. :mod:`klrelease.statistics`  sufficient statistics (class counts, means, covariances);
2. :mod:`klrelease.neighbours`  neighbouring datasets as constraints on the design;
3. :mod:`klrelease.mechanisms.kl_paper`  the paper's KL-minimising design (Wishart scale,
   mean-noise SDP, weight-mapping PMF, alternating loop);
4. :mod:`klrelease.sampling`    the noise laws that draw the released GMM.

Mechanisms (:mod:`klrelease.mechanisms`) combine these; :func:`release` runs one and returns a
versioned :class:`Release` artifact. Only a release whose ``privacy.certified`` is true carries a
proven guarantee; every other release warns with
:class:`~klrelease.warnings_.PrivacyLeakWarning`, and a seeded release is never certified.
:class:`BudgetAccountant` keeps a data owner's total budget across releases, and
:class:`GMMReleaser` is the scikit-learn estimator around :func:`release`.
"""

# audit is a callable module: klrelease.audit(mechanism, X, y, ...);
# plot holds klrelease.plot.marginals(release, ...)
from . import audit, plot
from ._version import __version__
from .artifact import Release
from .audit import AuditReport
from .data import LabelledData, as_labelled_data, load_dataset
from .estimator import GMMReleaser
from .gmm import GMM, fit_gmm
from .kl import KLEstimate, gaussian_kl, kl_divergence
from .mechanisms import get_mechanism
from .mechanisms import mechanisms as list_mechanisms
from .privacy.guarantee import BudgetAccountant, BudgetExceeded, Guarantee
from .release import expected_kl, plan, release

__all__ = [
    "__version__",
    "AuditReport",
    "BudgetAccountant",
    "BudgetExceeded",
    "GMMReleaser",
    "Guarantee",
    "audit",
    "GMM",
    "KLEstimate",
    "LabelledData",
    "Release",
    "as_labelled_data",
    "expected_kl",
    "fit_gmm",
    "gaussian_kl",
    "get_mechanism",
    "kl_divergence",
    "load_dataset",
    "list_mechanisms",
    "plan",
    "plot",
    "release",
]
