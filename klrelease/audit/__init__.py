"""Privacy audit: test a mechanism's (epsilon, delta) claim on neighbouring datasets.

* :mod:`.hockey_stick`  delta(eps) from exact log densities, with confidence bounds;
* :mod:`.exact`         exact values for finite-support components (weight-mapping PMF);
* :mod:`.neighbours`    which neighbouring datasets to examine (all, or an extreme-point search);
* :mod:`.report`        the :class:`AuditReport`;
* :mod:`.runner`        :func:`audit`, which ties them together;
* :mod:`klrelease.cli.audit` the ``klrelease audit`` command.

The module itself is callable: ``klrelease.audit(mechanism, X, y, epsilon=..., delta=...)`` is
:func:`klrelease.audit.runner.audit`.

An audit can refute a privacy claim (a lower confidence bound of delta(eps) above the claimed
delta), never prove one; see :data:`~klrelease.audit.report.AUDIT_LIMITS`.
"""

import sys
import types

from .hockey_stick import DeltaEstimate, discrete_delta, estimate_delta, hockey_stick_terms
from .neighbours import Neighbour, select_neighbours
from .report import AUDIT_LIMITS, AuditReport
from .runner import audit

__all__ = [
    "AUDIT_LIMITS",
    "AuditReport",
    "DeltaEstimate",
    "Neighbour",
    "audit",
    "discrete_delta",
    "estimate_delta",
    "hockey_stick_terms",
    "select_neighbours",
]


class _CallableModule(types.ModuleType):
    """This package, callable as :func:`audit` (keeps ``klrelease.audit.<submodule>`` usable)."""

    __call__ = staticmethod(audit)


sys.modules[__name__].__class__ = _CallableModule
