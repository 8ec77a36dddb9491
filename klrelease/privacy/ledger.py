"""A worst-path privacy budget ledger, fixed from public inputs before any data is read.

A learner lists every mechanism it may run, with its (epsilon, delta) and how many times it
can run on inputs that differ between two neighbouring datasets on the worst path
(``multiplicity``). Under basic (adaptive) composition the worst-path guarantee is the sum of
``multiplicity * (epsilon_i, delta_i)``. A group of mechanisms already composed with the
advanced composition theorem is entered once with its composed total. :meth:`Ledger.check`
compares the total with the request and raises before the data is touched; the ledger never
sees the data, so running it with the data replaced by zeros gives the same ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LedgerEntry", "Ledger", "BudgetExceeded"]

#: Relative slack for floating-point sums of budget shares.
_TOL = 1e-9


class BudgetExceeded(ValueError):
    """The worst-path total of a ledger exceeds the requested budget (a public fact)."""


@dataclass(frozen=True)
class LedgerEntry:
    name: str
    epsilon: float
    delta: float
    multiplicity: int = 1
    sensitivity: str = ""
    note: str = ""

    @property
    def total_epsilon(self) -> float:
        return self.multiplicity * self.epsilon

    @property
    def total_delta(self) -> float:
        return self.multiplicity * self.delta


@dataclass
class Ledger:
    """Worst-path budget of one run, against the requested ``(epsilon, delta)``."""

    epsilon: float
    delta: float
    entries: list[LedgerEntry] = field(default_factory=list)

    def add(self, name: str, epsilon: float, delta: float = 0.0, *, multiplicity: int = 1,
            sensitivity: str = "", note: str = "") -> LedgerEntry:
        if epsilon < 0 or delta < 0 or multiplicity < 0:
            raise ValueError("ledger entries need non-negative budgets and multiplicity")
        entry = LedgerEntry(name, float(epsilon), float(delta), int(multiplicity),
                            sensitivity, note)
        self.entries.append(entry)
        return entry

    def total(self) -> tuple[float, float]:
        """Worst-path (epsilon, delta) under basic composition of the entries."""
        eps = sum(e.total_epsilon for e in self.entries)
        dlt = sum(e.total_delta for e in self.entries)
        return eps, dlt

    def within_budget(self) -> bool:
        eps, dlt = self.total()
        return (eps <= self.epsilon * (1 + _TOL)) and (dlt <= self.delta * (1 + _TOL))

    def check(self) -> Ledger:
        """Raise :class:`BudgetExceeded` if the worst-path total exceeds the request."""
        if not self.within_budget():
            eps, dlt = self.total()
            raise BudgetExceeded(
                f"worst-path budget ({eps:.6g}, {dlt:.3g}) exceeds the request "
                f"({self.epsilon:.6g}, {self.delta:.3g})"
            )
        return self

    def to_dict(self) -> dict:
        eps, dlt = self.total()
        return {
            "requested": {"epsilon": self.epsilon, "delta": self.delta},
            "worst_path_total": {"epsilon": eps, "delta": dlt},
            "composition": "basic (adaptive) over the worst path",
            "entries": [
                {"name": e.name, "epsilon": e.epsilon, "delta": e.delta,
                 "multiplicity": e.multiplicity, "sensitivity": e.sensitivity, "note": e.note}
                for e in self.entries
            ],
        }
