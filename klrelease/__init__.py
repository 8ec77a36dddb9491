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

The names below load on first use (PEP 562): ``import klrelease`` and the command line's
start-up (``klrelease --help``) import none of scikit-learn, scipy, cvxpy or the mechanisms.
"""

from __future__ import annotations

import sys
import types
from importlib import import_module
from typing import TYPE_CHECKING

from ._version import __version__

#: Public name -> the module that defines it (loaded on first use); ``audit`` and ``plot`` are
#: modules: ``klrelease.audit(mechanism, X, y, ...)`` (a callable module) and
#: ``klrelease.plot.marginals(release, ...)``.
_LAZY = {
    "AuditReport": "audit",
    "BudgetAccountant": "privacy.guarantee",
    "BudgetExceeded": "privacy.guarantee",
    "GMM": "gmm",
    "GMMReleaser": "estimator",
    "Guarantee": "privacy.guarantee",
    "KLEstimate": "kl",
    "LabelledData": "data",
    "Release": "artifact",
    "as_labelled_data": "data",
    "expected_kl": "release",
    "fit_gmm": "gmm",
    "gaussian_kl": "kl",
    "get_mechanism": "mechanisms",
    "kl_divergence": "kl",
    "list_mechanisms": "mechanisms",
    "load_dataset": "data",
    "plan": "release",
    "release": "release",
}
_MODULES = ("audit", "plot")
#: Names exported under another name in their module.
_RENAMED = {"list_mechanisms": "mechanisms"}

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


def __getattr__(name: str):
    if name in _MODULES:
        return import_module(f"{__name__}.{name}")
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_LAZY[name]}"), _RENAMED.get(name, name))
    globals()[name] = value  # later look-ups find it directly
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """This package: ``klrelease.release`` stays the function :func:`release` once its module
    ``klrelease.release`` is loaded (the import system binds a loaded submodule to its name in
    the package; the eager imports this package had used to rebind the function after it)."""

    def __setattr__(self, name: str, value) -> None:
        if (name == "release" and isinstance(value, types.ModuleType)
                and value.__name__ == f"{__name__}.release"):
            value = value.release
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

if TYPE_CHECKING:  # what static tools see: the names as the eager imports gave them
    from . import audit, plot
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
