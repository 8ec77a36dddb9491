"""The privacy claim of a release as an object, and a budget accountant across releases.

A :class:`Guarantee` states the neighbouring relation (an
:class:`~klrelease.neighbours.Adjacency`), the (epsilon, delta) claimed, whether the claim is
certified (proven beside the mechanism's code and checked by tests) and why. Where the
mechanism's privacy curve is known (:class:`GaussianCurve`: one Gaussian mechanism of whitened
sensitivity mu; :class:`PureCurve`: pure epsilon-DP) it gives delta at another epsilon, and it
yields a ``dp_accounting`` event so that several releases of the same data compose.

:class:`BudgetAccountant` holds a data owner's total budget, in the spirit of diffprivlib's
``BudgetAccountant``: it refuses a release whose claim is not certified or whose composition
with the releases already made would exceed the total.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..neighbours import Adjacency
from .calibration import gaussian_delta

if TYPE_CHECKING:  # loaded when a release is accounted (importing it takes about a second)
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

__all__ = [
    "Guarantee",
    "GaussianCurve",
    "PureCurve",
    "BudgetAccountant",
    "BudgetExceeded",
    "SEEDED_REASON",
]

#: Why a seeded release is never certified.
SEEDED_REASON = (
    "Seeded noise: anyone who knows the seed can regenerate and subtract the noise, so a "
    "seeded release is an experiment and carries no guarantee."
)


@dataclass(frozen=True)
class GaussianCurve:
    """One Gaussian mechanism of whitened L2 sensitivity ``mu`` (noise multiplier ``1/mu``).

    Its exact privacy curve is Balle & Wang's (2018, Theorem 8),
    ``delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)``.
    """

    mu: float

    def delta_at(self, epsilon: float) -> float:
        """The smallest delta for which the mechanism is (epsilon, delta)-DP."""
        return gaussian_delta(1.0, float(epsilon), float(self.mu))

    def dp_event(self) -> dp_accounting.DpEvent:
        import dp_accounting

        return dp_accounting.GaussianDpEvent(noise_multiplier=1.0 / float(self.mu))


@dataclass(frozen=True)
class PureCurve:
    """A pure epsilon-DP mechanism, with its ``dp_accounting`` event when known."""

    epsilon: float
    event: Any = None

    def delta_at(self, epsilon: float) -> float:
        """0 at or above the mechanism's epsilon; below it the curve is not known."""
        if epsilon >= self.epsilon:
            return 0.0
        raise ValueError(f"the curve below epsilon={self.epsilon:g} is not known for this "
                         "mechanism")

    def dp_event(self) -> dp_accounting.DpEvent:
        import dp_accounting

        return self.event if self.event is not None else dp_accounting.UnsupportedDpEvent()


@dataclass(frozen=True)
class Guarantee:
    """The privacy claim of a plan or release.

    Attributes
    ----------
    epsilon, delta : float
        The claim.
    neighbouring : str
        The neighbouring relation (an :class:`~klrelease.neighbours.Adjacency` value).
    certified : bool
        True only when the claim is proven in a document beside the mechanism and the noise
        came from the library's CSPRNG (a seeded release is never certified).
    statement : str
        The claim in plain words for a data owner.
    reasons : tuple of str
        Why it is not certified, or what the proof assumes.
    accounting : str
        How (epsilon, delta) was accounted.
    curve : GaussianCurve, PureCurve or None
        The mechanism's privacy curve where it is known.
    """

    epsilon: float
    delta: float
    neighbouring: str
    certified: bool
    statement: str
    reasons: tuple[str, ...] = ()
    accounting: str = ""
    curve: GaussianCurve | PureCurve | None = field(default=None, compare=False)

    @property
    def relation(self) -> Adjacency:
        """The neighbouring relation as an enum."""
        return Adjacency(self.neighbouring)

    def delta_at(self, epsilon: float) -> float:
        """Delta at another epsilon, from the mechanism's privacy curve.

        Raises
        ------
        ValueError
            If the claim is not certified or the curve is not known.
        """
        if not self.certified:
            raise ValueError("an uncertified release has no privacy curve")
        if self.curve is None:
            raise ValueError("the privacy curve of this mechanism is not known; only "
                             f"({self.epsilon:g}, {self.delta:g}) is claimed")
        return self.curve.delta_at(epsilon)

    def dp_event(self) -> dp_accounting.DpEvent:
        """The release as a ``dp_accounting`` event (for composing several releases).

        An uncertified release is ``NonPrivateDpEvent``; a certified one without a known curve
        is ``UnsupportedDpEvent`` (compose it by its (epsilon, delta) instead).
        """
        import dp_accounting

        if not self.certified:
            return dp_accounting.NonPrivateDpEvent()
        if self.curve is None:
            return dp_accounting.UnsupportedDpEvent()
        return self.curve.dp_event()

    def seeded(self) -> Guarantee:
        """The same claim for a seeded run: never certified."""
        if SEEDED_REASON in self.reasons and not self.certified:
            return self
        statement = ("NOT certified: seeded noise (an experiment, reproducible by anyone who "
                     "knows the seed). With secure noise the mechanism's claim would be: "
                     + self.statement)
        return dataclasses.replace(self, certified=False, statement=statement,
                                   reasons=(SEEDED_REASON, *self.reasons))


def _pld_accountant(guarantees: list[Guarantee]) -> PLDAccountant:
    """A PLD accountant whose grid does not grow with the privacy loss.

    The privacy loss of a Gaussian of whitened sensitivity mu spans about mu^2; a fixed
    discretisation would give a grid (time and memory) growing with epsilon. The interval is
    scaled so that the grid stays of bounded size; a coarser grid gives a pessimistic delta,
    so the accounting stays valid.
    """
    from dp_accounting.pld import PLDAccountant

    spread = sum((g.curve.mu ** 2 if isinstance(g.curve, GaussianCurve) else g.epsilon)
                 for g in guarantees)
    return PLDAccountant(value_discretization_interval=1e-4 * max(1.0, spread))


def _response_losses(g: Guarantee) -> dict[float, float] | None:
    """The privacy-loss distribution of a randomized-response claim (under the first of two
    neighbours that differ in one label: loss +eps with probability p, -eps with q, 0
    otherwise), or ``None`` for any other curve."""
    import dp_accounting

    event = getattr(g.curve, "event", None)
    if not isinstance(g.curve, PureCurve) or not isinstance(
            event, dp_accounting.RandomizedResponseDpEvent):
        return None
    K = int(event.num_buckets)
    q = float(event.noise_parameter) / K
    p = 1.0 - float(event.noise_parameter) + q
    eps = float(np.log(p / q)) if q > 0 else float("inf")
    return {eps: p, -eps: q, 0.0: max(1.0 - p - q, 0.0)}


def _composed_delta(guarantees: list[Guarantee], epsilon: float) -> float | None:
    """delta(epsilon) of the composition of ``guarantees``, or ``None`` when a curve is not
    known.

    Gaussian mechanisms compose exactly: their privacy-loss distributions are Gaussian, and
    the composition of Gaussian mechanisms of whitened sensitivities ``mu_i`` is the Gaussian
    mechanism of sensitivity ``mu = sqrt(sum mu_i^2)`` (Dong, Roth & Su 2022), whose curve is
    Balle & Wang's closed form. Randomized response on labels has a discrete privacy loss
    (``_response_losses``); with them the composition's delta is exactly
    ``sum_l P(l) delta_mu(epsilon - l)`` over the convolution of those discrete losses (the
    hockey-stick divergence of a product, integrated over its discrete part). Any other mix
    goes through ``dp_accounting``'s PLD accountant (pessimistic discretisation).
    """
    if not guarantees:
        return 0.0
    if all(g.certified for g in guarantees):
        gauss = [g for g in guarantees if isinstance(g.curve, GaussianCurve)]
        pure = [_response_losses(g) for g in guarantees if g not in gauss]
        if all(x is not None for x in pure):
            mu = sum(float(g.curve.mu) ** 2 for g in gauss) ** 0.5
            losses = {0.0: 1.0}
            for dist in pure:
                nxt: dict[float, float] = {}
                for a, pa in losses.items():
                    for b, pb in dist.items():
                        key = round(a + b, 12)
                        nxt[key] = nxt.get(key, 0.0) + pa * pb
                losses = nxt
            if mu > 0:
                return float(min(1.0, sum(pl * GaussianCurve(mu).delta_at(epsilon - loss)
                                          for loss, pl in losses.items() if pl > 0)))
            return float(sum(pl * max(0.0, 1.0 - np.exp(min(epsilon - loss, 700.0)))
                             for loss, pl in losses.items() if pl > 0))
    events = [g.dp_event() for g in guarantees]
    accountant = _pld_accountant(guarantees)
    if not all(accountant.supports(e) for e in events):
        return None
    for e in events:
        accountant.compose(e)
    return float(accountant.get_delta(epsilon))


class BudgetExceeded(ValueError):
    """A privacy budget would be exceeded: a release refused by a :class:`BudgetAccountant`,
    or a learner's worst-path ledger above the request (public facts, raised before any data
    is read)."""


class BudgetAccountant:
    """A data owner's privacy budget across releases of the same data.

    Parameters
    ----------
    epsilon, delta : float
        The total budget (epsilon > 0, 0 <= delta < 1).

    Notes
    -----
    Releases compose under one neighbouring relation. The composition is accepted when it is
    within the total by basic composition (sums of epsilons and deltas) or, when every release
    has a known privacy curve, by the composed curve at the total epsilon: exactly for
    Gaussian mechanisms (one Gaussian mechanism of sensitivity ``sqrt(sum mu_i^2)``), by
    ``dp_accounting``'s PLD accountant otherwise.
    Only certified releases can be accounted for.
    """

    def __init__(self, epsilon: float, delta: float = 0.0):
        epsilon, delta = float(epsilon), float(delta)
        if not epsilon > 0 or epsilon != epsilon or epsilon == float("inf"):
            raise ValueError(f"the total epsilon must be a finite number > 0, got {epsilon!r}")
        if not 0 <= delta < 1:
            raise ValueError(f"the total delta must lie in [0, 1), got {delta!r}")
        self.epsilon = epsilon
        self.delta = delta
        self.spent: list[Guarantee] = []

    def __repr__(self) -> str:
        return (f"BudgetAccountant(epsilon={self.epsilon:g}, delta={self.delta:g}, "
                f"releases={len(self.spent)})")

    @property
    def relation(self) -> Adjacency | None:
        return self.spent[0].relation if self.spent else None

    def _within(self, guarantees: list[Guarantee]) -> bool:
        eps = sum(g.epsilon for g in guarantees)
        dlt = sum(g.delta for g in guarantees)
        tol = 1e-12
        if eps <= self.epsilon * (1 + tol) and dlt <= self.delta * (1 + tol) + tol:
            return True
        composed = _composed_delta(guarantees, self.epsilon)
        return composed is not None and composed <= self.delta

    def check(self, guarantee: Guarantee) -> None:
        """Raise :class:`BudgetExceeded` if ``guarantee`` cannot be spent."""
        if not guarantee.certified:
            raise BudgetExceeded("the budget accountant refuses a release whose privacy claim "
                                 "is not certified")
        if self.relation is not None and guarantee.relation != self.relation:
            raise BudgetExceeded(
                f"the budget is accounted under {self.relation.value} adjacency; a release "
                f"under {guarantee.relation.value} does not compose with it"
            )
        if not self._within([*self.spent, guarantee]):
            raise BudgetExceeded(
                f"a release at (epsilon={guarantee.epsilon:g}, delta={guarantee.delta:g}) "
                f"would exceed the total budget (epsilon={self.epsilon:g}, "
                f"delta={self.delta:g}) given the {len(self.spent)} release(s) already made"
            )

    def spend(self, guarantee: Guarantee) -> None:
        """Record a release (checked first)."""
        self.check(guarantee)
        self.spent.append(guarantee)

    def cancel(self, guarantee: Guarantee) -> None:
        """Remove the charge :meth:`spend` made for ``guarantee`` (the same object): only for
        an attempt that failed before any noise was drawn, which released nothing. Never
        after noise: whatever happens then, the budget is spent."""
        for i in range(len(self.spent) - 1, -1, -1):
            if self.spent[i] is guarantee:
                del self.spent[i]
                return
        raise ValueError("cancel: this guarantee was not spent")

    def total_delta_at(self, epsilon: float | None = None) -> float:
        """Delta of everything spent at ``epsilon`` (default: the total epsilon), from the
        composed privacy curve (exact for Gaussian mechanisms, else by PLD).

        Raises
        ------
        ValueError
            If a release's privacy curve is not known (it composes by its (epsilon, delta)).
        """
        composed = _composed_delta(self.spent, self.epsilon if epsilon is None else epsilon)
        if composed is None:
            raise ValueError("the privacy curve of a release is not known; releases compose "
                             "by basic composition only")
        return composed
