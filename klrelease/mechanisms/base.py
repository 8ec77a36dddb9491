"""What every release mechanism provides.

A mechanism turns a dataset into a :class:`Plan`: everything that is fixed before noise is drawn
(the design). A plan then

* draws a raw noisy output, a dict ``{"weights", "means", "covariances"}`` of arrays
  (:meth:`Plan.sample`);
* gives the exact log-density of such an output under this dataset, per component
  (:meth:`Plan.log_density`), which is what a privacy audit compares between neighbours;
* post-processes the raw output into a valid :class:`~klrelease.gmm.GMM`
  (:meth:`Plan.finalize`; projections cost no privacy).

Splitting design from sampling lets experiments estimate E[KL] by Monte Carlo without
re-solving, and lets the audit recompute the design on a neighbouring dataset exactly as the
mechanism would.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..data import LabelledData
from ..gmm import GMM

__all__ = ["Mechanism", "Plan", "Guarantee", "check_options", "COMPONENTS"]

COMPONENTS = ("weights", "means", "covariances")


@dataclass(frozen=True)
class Guarantee:
    """The privacy claim of a plan, in the words the artifact carries."""

    epsilon: float
    delta: float
    neighbouring: str  # an Adjacency value
    certified: bool
    statement: str  # plain words for a data owner
    reasons: tuple[str, ...] = ()  # why it is not certified, or what the proof assumes
    accounting: str = ""


@dataclass
class Plan(ABC):
    """A mechanism's output law on one dataset."""

    mechanism: str
    guarantee: Guarantee
    classes: tuple
    public_options: dict[str, Any] = field(default_factory=dict)
    solver: Any = None  # a SolverReport or None

    @abstractmethod
    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Draw one raw noisy output."""

    @abstractmethod
    def log_density(self, output: dict[str, np.ndarray]) -> dict[str, float]:
        """Exact log-density (or log-PMF) of each component of ``output`` under this plan."""

    @abstractmethod
    def finalize(self, output: dict[str, np.ndarray]) -> GMM:
        """Post-process a raw output into the released GMM."""

    def draw(self, rng: np.random.Generator) -> GMM:
        """Sample and finalise one release."""
        return self.finalize(self.sample(rng))


class Mechanism(ABC):
    """A registered release mechanism."""

    #: Registry name, e.g. ``"kl-paper"``.
    name: ClassVar[str]
    #: One line for listings.
    summary: ClassVar[str]
    #: Options accepted by :meth:`plan` besides epsilon and delta, with their defaults.
    options: ClassVar[dict[str, Any]] = {}
    #: Rows every class must hold before the mechanism runs; ``None`` means d + 1 (an
    #: invertible class covariance). A refusal depends on the private class sizes, so a
    #: certified mechanism whose proof covers all datasets sets 0.
    min_class_size: ClassVar[int | None] = None

    @abstractmethod
    def plan(self, data: LabelledData, *, epsilon: float, delta: float, **options) -> Plan:
        """Design the mechanism on ``data``."""


def check_options(mechanism: Mechanism, options: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and reject unknown option names with a clear message."""
    unknown = sorted(set(options) - set(mechanism.options))
    if unknown:
        allowed = ", ".join(sorted(mechanism.options)) or "none"
        raise ValueError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for mechanism "
            f"{mechanism.name!r}; allowed: {allowed}"
        )
    merged = dict(mechanism.options)
    merged.update(options)
    return merged
