"""A worst-path privacy budget ledger, fixed from public inputs before any data is read.

A learner lists every mechanism it may run, with its budget and how many times it can run on
inputs that differ between two neighbouring datasets on the worst path (``multiplicity``).
Three accountants (the proofs are in ``toolbox.md`` beside this module, paragraph "Ledger"):

* ``basic``: each piece is (epsilon_i, delta_i)-DP and the worst-path guarantee is the sum of
  ``multiplicity * (epsilon_i, delta_i)`` (adaptive basic composition). A group of mechanisms
  already composed with the advanced composition theorem is entered once with its total.
* ``zcdp``: each piece has a zCDP parameter rho_i (Bun & Steinke 2016): a Gaussian piece
  ``rho_i = Delta^2 / (2 sigma^2)``, a pure epsilon-DP piece ``rho_i = eps^2 / 2``, a stable
  piece (StableHist, StableSelect) ``eps^2 / 2`` for its idealised pure part plus a total
  variation term ``delta_TV``. The worst-path sum of rho is converted to
  ``(eps_tot, delta_z)`` by ``dp_accounting``'s RDP accountant (a ``ZCDpEvent``), and the
  guarantee is ``(eps_tot, delta_z + (1 + e^{eps_tot}) sum delta_TV)``.
* ``gdp``: every piece is a Gaussian mechanism (``kind="gaussian"``, with its rho =
  ``s^2 / 2`` for whitened sensitivity ``s``); the worst path is ``mu``-GDP with
  ``mu^2 = 2 sum rho`` (Dong, Roth & Su 2022, Cor. 3.3), and the guarantee is
  ``(eps, delta(eps))`` on the Gaussian curve (:class:`~.guarantee.GaussianCurve`), exact for
  a composition of Gaussian mechanisms. Learners whose pieces are all Gaussian use it.

:func:`zcdp_rho` is the largest total rho that the RDP conversion turns into at most
``(epsilon, delta_z)``; learners split it over their pieces by the same shares as the basic
split. :func:`gdp_mu` is the largest ``mu`` whose curve gives at most ``delta`` at
``epsilon``. :func:`choose_accountant` picks ``basic`` or ``zcdp`` for ``auto`` from public inputs
only. :meth:`Ledger.check` compares the total with the request and raises before the data is
touched; the ledger never sees the data, so running it with the data replaced by zeros gives
the same ledger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .guarantee import BudgetExceeded

__all__ = ["LedgerEntry", "Ledger", "BudgetExceeded", "Spend", "ACCOUNTANTS", "zcdp_rho",
           "zcdp_epsilon", "choose_accountant", "check_accountant", "ZCDP_DELTA_SHARE", "gdp_mu"]

#: The accountants a learner accepts (``auto`` resolves to one of the first two).
ACCOUNTANTS = ("basic", "zcdp", "auto")

#: Under ``zcdp``, the share of delta given to the conversion (delta_z); the rest pays for the
#: total-variation terms of the stable pieces.
ZCDP_DELTA_SHARE = 0.5

#: Relative slack for floating-point sums of budget shares.
_TOL = 1e-9


def check_accountant(accountant: str) -> str:
    """Validate an accountant name (a public input)."""
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {', '.join(ACCOUNTANTS)}, "
                         f"got {accountant!r}")
    return accountant


def zcdp_epsilon(rho: float, delta_z: float) -> float:
    """epsilon of a rho-zCDP mechanism at ``delta_z`` (``dp_accounting`` RDP conversion)."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    if rho <= 0:
        return 0.0
    acct = RdpAccountant()
    acct.compose(dp_accounting.ZCDpEvent(float(rho)))
    return float(acct.get_epsilon(delta_z))


def zcdp_rho(epsilon: float, delta_z: float) -> float:
    """Largest rho whose conversion at ``delta_z`` gives at most ``epsilon`` (bisection).

    The closed form ``eps = rho + 2 sqrt(rho ln(1/delta_z))`` (Bun & Steinke 2016, Prop. 1.3)
    gives a lower bracket; ``dp_accounting``'s conversion is at least as tight.
    """
    L = math.log(1.0 / delta_z)
    lo = (math.sqrt(L + epsilon) - math.sqrt(L)) ** 2  # closed form, always valid
    hi = max(lo, epsilon) * 4.0 + 1.0
    if zcdp_epsilon(lo, delta_z) > epsilon:  # the RDP conversion is never looser
        lo = 0.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if zcdp_epsilon(mid, delta_z) <= epsilon:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return lo * (1.0 - 1e-9)


def gdp_mu(epsilon: float, delta: float) -> float:
    """The largest ``mu`` such that a ``mu``-GDP mechanism is (epsilon, delta)-DP.

    ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)`` (Dong, Roth & Su 2022,
    Cor. 2.13) is the curve of the Gaussian mechanism with sensitivity mu and unit noise
    (Balle & Wang 2018), solved by :func:`~.calibration.gaussian_max_sensitivity`; shrunk by a
    relative 1e-9 so that the solver's tolerance keeps ``delta(eps) <= delta``.
    """
    from .calibration import gaussian_max_sensitivity

    return gaussian_max_sensitivity(epsilon, delta) * (1.0 - 1e-9)


@dataclass(frozen=True)
class Spend:
    """The budget handed to one mechanism call.

    ``epsilon`` is the pure epsilon (or, for a Gaussian piece under ``basic``, the epsilon of
    its (epsilon, delta) calibration), ``delta`` the delta of the calibration (StableHist: its
    release parameter; StableSelect: its ``delta_TV``), ``zcdp`` the rho of a Gaussian piece
    under ``zcdp`` (then ``sigma = Delta / sqrt(2 rho)``; ``None`` under ``basic``).
    Unpacks as ``(epsilon, delta)``.
    """

    epsilon: float
    delta: float = 0.0
    zcdp: float | None = None

    def __iter__(self):
        return iter((self.epsilon, self.delta))

    def __getitem__(self, i):
        return (self.epsilon, self.delta)[i]


@dataclass(frozen=True)
class LedgerEntry:
    """One mechanism of the worst path.

    ``kind`` is ``"approx"`` (an (epsilon, delta)-DP piece; basic accountant only),
    ``"pure"``, ``"gaussian"`` (with ``zcdp`` = rho under the zCDP accountant) or ``"stable"``
    (pure part ``epsilon`` and total-variation term ``delta_tv``).
    """

    name: str
    epsilon: float
    delta: float
    multiplicity: int = 1
    sensitivity: str = ""
    note: str = ""
    kind: str = "approx"
    zcdp: float | None = None
    delta_tv: float = 0.0

    @property
    def rho(self) -> float:
        """zCDP parameter of one invocation (``eps^2/2`` for a pure or stable piece)."""
        if self.kind == "gaussian" and self.zcdp is not None:
            return self.zcdp
        if self.kind in ("pure", "stable"):
            return 0.5 * self.epsilon**2
        raise ValueError(f"ledger entry {self.name!r} ({self.kind}) has no zCDP parameter")

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
    accountant: str = "basic"
    delta_z: float | None = None  # zcdp: the delta of the conversion

    def __post_init__(self):
        if self.accountant not in ("basic", "zcdp", "gdp"):
            raise ValueError("a ledger's accountant is 'basic', 'zcdp' or 'gdp' (resolve "
                             "'auto' first)")
        if self.accountant == "zcdp" and self.delta_z is None:
            self.delta_z = ZCDP_DELTA_SHARE * self.delta

    def add(self, name: str, epsilon: float, delta: float = 0.0, *, multiplicity: int = 1,
            sensitivity: str = "", note: str = "", kind: str = "approx",
            zcdp: float | None = None, delta_tv: float = 0.0) -> LedgerEntry:
        if epsilon < 0 or delta < 0 or multiplicity < 0 or delta_tv < 0 or (
                zcdp is not None and zcdp < 0):
            raise ValueError("ledger entries need non-negative budgets and multiplicity")
        if kind not in ("approx", "pure", "gaussian", "stable"):
            raise ValueError(f"unknown ledger entry kind {kind!r}")
        if self.accountant == "gdp" and (kind != "gaussian" or zcdp is None):
            raise ValueError("a gdp ledger holds Gaussian pieces with their rho only")
        entry = LedgerEntry(name, float(epsilon), float(delta), int(multiplicity),
                            sensitivity, note, kind, None if zcdp is None else float(zcdp),
                            float(delta_tv))
        self.entries.append(entry)
        return entry

    def total_rho(self) -> float:
        """Worst-path sum of the zCDP parameters (zcdp accountant)."""
        return sum(e.multiplicity * e.rho for e in self.entries if e.multiplicity)

    def gdp_mu(self) -> float:
        """Worst-path GDP parameter ``mu = sqrt(2 sum rho)`` (gdp accountant)."""
        return math.sqrt(2.0 * self.total_rho())

    def total(self) -> tuple[float, float]:
        """Worst-path (epsilon, delta) of the entries under the ledger's accountant (gdp: delta
        on the Gaussian curve at the requested epsilon)."""
        if self.accountant == "gdp":
            from .calibration import gaussian_delta

            mu = self.gdp_mu()
            return self.epsilon, (gaussian_delta(1.0, self.epsilon, mu) if mu > 0 else 0.0)
        if self.accountant == "zcdp":
            eps = zcdp_epsilon(self.total_rho(), self.delta_z)
            tv = sum(e.multiplicity * e.delta_tv for e in self.entries)
            return eps, self.delta_z + (1.0 + math.exp(eps)) * tv
        eps = sum(e.total_epsilon for e in self.entries)
        dlt = sum(e.total_delta for e in self.entries)
        return eps, dlt

    def noise_score(self) -> float:
        """Sum over the worst path of ``log(noise scale)`` per unit sensitivity (public).

        A pure or stable piece scales as ``1/epsilon``, a Gaussian piece as ``sigma/Delta``
        (analytic calibration under ``basic``, ``1/sqrt(2 rho)`` under ``zcdp``). Smaller is
        better: it is how ``auto`` compares the per-piece budgets of the two accountants.
        """
        return sum(e.multiplicity * log_noise_scale(
            Spend(e.epsilon, e.delta, e.zcdp), e.kind == "gaussian")
            for e in self.entries if e.multiplicity)

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
            "accountant": self.accountant,
            "composition": _COMPOSITION[self.accountant],
            **({"delta_z": self.delta_z, "total_rho": self.total_rho()}
               if self.accountant == "zcdp" else {}),
            **({"mu": self.gdp_mu()} if self.accountant == "gdp" else {}),
            "entries": [
                {"name": e.name, "kind": e.kind, "epsilon": e.epsilon, "delta": e.delta,
                 **({"rho": e.zcdp} if e.zcdp is not None else {}),
                 **({"delta_tv": e.delta_tv} if e.delta_tv else {}),
                 "multiplicity": e.multiplicity, "sensitivity": e.sensitivity, "note": e.note}
                for e in self.entries
            ],
        }


_COMPOSITION = {
    "basic": "basic (adaptive) over the worst path",
    "zcdp": "zCDP over the worst path, converted by dp_accounting's RDP accountant at delta_z, "
            "plus (1 + e^eps) times the total-variation terms of the stable pieces",
    "gdp": "Gaussian DP over the worst path: mu^2 = sum of the pieces' squared whitened "
           "sensitivities, delta(eps) from the Gaussian curve",
}


def log_noise_scale(spend: Spend, gaussian: bool) -> float:
    """``log`` of the noise scale per unit sensitivity of one piece (see ``noise_score``)."""
    from .calibration import analytic_gaussian_sigma

    if gaussian:
        return math.log(1.0 / math.sqrt(2.0 * spend.zcdp) if spend.zcdp is not None
                        else analytic_gaussian_sigma(spend.epsilon, spend.delta, 1.0))
    return -math.log(spend.epsilon)


def choose_accountant(accountant: str, build, score=None) -> tuple[str, object]:
    """Resolve ``accountant`` and return ``(name, build(name))`` (public inputs only).

    ``build(name)`` returns a ledger (or a tuple whose first item is one) for ``basic`` or
    ``zcdp``. For ``auto`` both are built and the one with the smaller
    :meth:`Ledger.noise_score` (the larger per-piece budgets) is kept; ties go to ``basic``.
    ``score(built)`` replaces that score when a ledger groups pieces (e.g. a block composed
    by the advanced composition theorem).
    """
    check_accountant(accountant)
    if accountant != "auto":
        return accountant, build(accountant)
    built = {a: build(a) for a in ("basic", "zcdp")}
    if score is None:
        def score(b):
            return (b[0] if isinstance(b, tuple) else b).noise_score()

    name = "zcdp" if score(built["zcdp"]) < score(built["basic"]) else "basic"
    return name, built[name]
