"""Audit a mechanism's privacy claim on a dataset by comparing exact output densities.

For every examined neighbour D' of D (:mod:`.neighbours`) the mechanism is planned on D' exactly
as it would be on its own (:meth:`~klrelease.mechanisms.Mechanism.plan`: any data-dependent
design is recomputed), outputs are drawn from M(D) and from M(D'), and both plans' exact log
densities (:meth:`~klrelease.mechanisms.Plan.log_density`) give the privacy loss
L = ln p_D(o) - ln p_D'(o) per component (weights, means, covariances) and jointly (their sum).
:mod:`.hockey_stick` turns it into delta(eps) for both directions (D vs D' and D' vs D).

Two stages keep large datasets fast:

1. *screen*: every examined pair with ``n_screen`` draws per direction (the draws from M(D) and
   their densities under D are shared by all pairs), only to rank the pairs: by estimated
   delta, then by the 99th percentile of the privacy loss L (how close it comes to eps);
2. *confirm*: the ``n_confirm`` highest-ranked pairs with ``n_samples`` fresh draws per
   direction. Fresh draws keep the selection from biasing the figures, and each confirmed bound
   is taken at level ``1 - (1 - confidence) / (2 n_confirm)`` (Bonferroni over the confirmed
   pairs and both directions), so the verdict holds at ``confidence`` overall.

Components whose law is finite (the weight-mapping PMF of ``kl-paper``) are also computed
exactly by enumeration (:mod:`.exact`), for every examined pair. A component's marginal delta is
a lower bound on the delta of the whole output (post-processing), so an exact component above
the claimed delta is a violation too.

Verdict: a violation is declared when a confirmed joint lower confidence bound, or an exact
component value, exceeds the claimed delta by more than a float margin. Otherwise the verdict is
"no violation found", with the largest upper bound reported: with n draws that bound cannot go
below about 1/n, so an audit can refute a claim but never prove it.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..data import as_labelled_data, check_privacy_parameters
from ..mechanisms import COMPONENTS, Plan, get_mechanism
from ..neighbours import Adjacency
from ..warnings_ import PrivacyLeakWarning
from .exact import exact_weights_delta
from .hockey_stick import DeltaEstimate, estimate_delta, hockey_stick_terms
from .neighbours import Neighbour, count_neighbours, select_neighbours
from .report import AuditReport, Bound, DirectionResult, PairResult

__all__ = ["audit", "DEFAULTS"]

#: Default sizes of an audit.
DEFAULTS = {"n_samples": 2000, "max_pairs": 300, "n_screen": 200, "n_confirm": 3,
            "time_limit": 600.0}

#: draws are made in blocks of this size, so a time limit can stop between blocks
CHUNK = 25

#: a delta exceeding the claim by less than this (absolute + relative) is float noise
ABS_MARGIN = 1e-12
REL_MARGIN = 1e-6

Progress = Callable[[str, int, int], None]


def _exceeds(value: float, delta: float) -> bool:
    return value > delta + ABS_MARGIN + REL_MARGIN * delta


def _draw(plan: Plan, rng: np.random.Generator, n: int) -> list[dict]:
    many = getattr(plan, "sample_many", None)
    if callable(many):
        return list(many(rng, n))
    return [plan.sample(rng) for _ in range(n)]


def _log_densities(plan: Plan, outputs: list[dict]) -> dict[str, np.ndarray]:
    """Per-component log densities of ``outputs`` under ``plan``, as arrays."""
    many = getattr(plan, "log_density_many", None)
    if callable(many):
        res = many(outputs)
        return {c: np.asarray(res[c], dtype=float) for c in COMPONENTS}
    vals = [plan.log_density(o) for o in outputs]
    return {c: np.array([v[c] for v in vals], dtype=float) for c in COMPONENTS}


def _joint(logs: dict[str, np.ndarray]) -> np.ndarray:
    return np.sum([logs[c] for c in COMPONENTS], axis=0)


def _bound(est: DeltaEstimate) -> Bound:
    return Bound(estimate=est.estimate, lower=est.lower, upper=est.upper, exact=est.exact,
                 n_samples=est.n_samples, support_mismatch=est.support_mismatch)


def _direction(name: str, lp: dict, lq: dict, epsilon: float, alpha: float,
               exact: tuple[float, float] | None) -> DirectionResult:
    """Estimates for draws from p with densities ``lp`` (under p) and ``lq`` (under q)."""
    comps = {}
    inconsistent = 0
    for c in [*COMPONENTS, "joint"]:
        a = _joint(lp) if c == "joint" else lp[c]
        b = _joint(lq) if c == "joint" else lq[c]
        terms = hockey_stick_terms(a, b, epsilon)
        bad = np.isnan(terms)
        if c == "joint":
            inconsistent = int(bad.sum())
        terms = np.where(bad, 0.0, terms)
        est = estimate_delta(terms, alpha)
        mismatch = float(np.mean(np.isfinite(a) & np.isneginf(b)))
        comps[c] = Bound(estimate=est.estimate, lower=est.lower, upper=est.upper,
                         n_samples=est.n_samples, support_mismatch=mismatch)
    joint = comps.pop("joint")
    a, b = _joint(lp), _joint(lq)
    with np.errstate(invalid="ignore"):
        loss = np.where(np.isneginf(b) & np.isfinite(a), np.inf, a - b)
    loss = loss[~np.isnan(loss)]
    q99 = float(np.quantile(loss, 0.99, method="higher")) if loss.size else None
    lmax = float(np.max(loss)) if loss.size else None
    exact_comps = {}
    if exact is not None:
        value, mismatch = exact
        exact_comps["weights"] = Bound(estimate=value, lower=value, upper=value, exact=True,
                                       support_mismatch=mismatch)
    return DirectionResult(direction=name, joint=joint, components=comps,
                           exact_components=exact_comps, inconsistent_draws=inconsistent,
                           loss_q99=_finite_or_none(q99), loss_max=_finite_or_none(lmax))


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and np.isfinite(x) else None


def _loss_key(p: PairResult) -> float:
    """Largest 99th-percentile privacy loss of a pair over both directions (+inf if unbounded)."""
    return max((np.inf if d.loss_q99 is None else d.loss_q99) for d in p.directions)


def _pair_result(nb: Neighbour, stage: str, directions: list[DirectionResult],
                 delta: float) -> PairResult:
    lowers, ests, leaking = [], [], set()
    for d in directions:
        lowers.append(d.joint.lower)
        ests.append(d.joint.estimate)
        for c, b in d.exact_components.items():
            lowers.append(b.lower)
            ests.append(b.estimate)
            if _exceeds(b.lower, delta):
                leaking.add(c)
        for c, b in d.components.items():
            if _exceeds(b.lower, delta):
                leaking.add(c)
    return PairResult(
        description=nb.description, row=nb.row, stage=stage, directions=directions,
        worst_lower=float(max(lowers)), worst_estimate=float(max(ests)),
        leaking_components=[c for c in COMPONENTS if c in leaking],
    )


def _exact_max(p: PairResult) -> float:
    return max((b.estimate for d in p.directions for b in d.exact_components.values()),
               default=0.0)


def _exact_names(p: PairResult) -> set[str]:
    return {c for d in p.directions for c in d.exact_components}


def _evidence(p: PairResult) -> tuple[float, float]:
    """What a pair proves: confirmed lower bounds and exact values (screening MC excluded)."""
    if p.stage == "confirm":
        return p.worst_lower, p.worst_estimate
    return _exact_max(p), _exact_max(p)


def _confirm_draws(plan_d: Plan, plan_q: Plan, rng: np.random.Generator, n_max: int,
                   until: float):
    """Fresh draws from both plans in blocks until ``n_max`` each or the time ``until``.

    Returns the four log-density dicts (draws from D under D and D', draws from D' under D'
    and D), one output of each plan, and whether the time limit cut the draws short.
    """
    parts: dict[str, list[dict]] = {"dd": [], "dq": [], "qq": [], "qd": []}
    fillers = None
    n = 0
    while n < n_max:
        m = min(CHUNK, n_max - n)
        o_d, o_q = _draw(plan_d, rng, m), _draw(plan_q, rng, m)
        fillers = fillers or (o_d[0], o_q[0])
        parts["dd"].append(_log_densities(plan_d, o_d))
        parts["dq"].append(_log_densities(plan_q, o_d))
        parts["qq"].append(_log_densities(plan_q, o_q))
        parts["qd"].append(_log_densities(plan_d, o_q))
        n += m
        if n < n_max and time.perf_counter() > until:
            break
    logs = {key: {c: np.concatenate([b[c] for b in blocks]) for c in COMPONENTS}
            for key, blocks in parts.items()}
    return logs, fillers, n < n_max


@dataclass
class _Screened:
    neighbour: Neighbour
    result: PairResult


def audit(
    mechanism: str,
    X,
    y=None,
    *,
    epsilon: float,
    delta: float,
    bounds=None,
    norm_bound: float | None = None,
    neighbouring: str | None = None,
    n_samples: int = DEFAULTS["n_samples"],
    max_pairs: int = DEFAULTS["max_pairs"],
    confidence: float = 0.95,
    seed: int | None = None,
    n_screen: int | None = None,
    n_confirm: int = DEFAULTS["n_confirm"],
    time_limit: float | None = DEFAULTS["time_limit"],
    progress: Progress | None = None,
    **options,
) -> AuditReport:
    """Audit the (epsilon, delta) claim of a registered mechanism on ``(X, y)``.

    Parameters
    ----------
    mechanism : str
        A registered mechanism name (:func:`klrelease.mechanisms`).
    X : array-like of shape (N, d) or LabelledData
        Features (or a loaded dataset, with ``y=None``).
    y : array-like of shape (N,), optional
        Class labels.
    epsilon, delta : float
        The claim to audit (passed to the mechanism as its privacy parameters).
    bounds, norm_bound : optional
        Public bounds on the records, as for :func:`klrelease.release`; record-level audits
        use their extreme points as the records that are swapped in.
    neighbouring : str, optional
        The neighbouring relation to audit (an :class:`~klrelease.neighbours.Adjacency` value).
        Defaults to the relation the mechanism's guarantee names.
    n_samples : int
        Draws per direction for each confirmed pair.
    max_pairs : int
        Largest number of neighbours examined; with more neighbours than this, an extreme-point
        search chooses which (:func:`~klrelease.audit.neighbours.select_neighbours`).
    confidence : float
        Overall confidence of the verdict (each confirmed bound is Bonferroni-corrected).
    seed : int, optional
        Seed of the audit's own randomness (the audit is not a release).
    n_screen : int, optional
        Draws per direction when screening every pair (default ``min(200, n_samples)``).
    n_confirm : int
        Number of top-ranked pairs re-estimated with ``n_samples`` fresh draws.
    time_limit : float or None
        Seconds the audit may take (None: no limit). Screening stops starting new pairs after
        half of it (pairs come most extreme first); each confirmed pair then gets an equal
        share of the rest and stops drawing, in blocks of 25, when its share is used. A limit
        that depends only on elapsed time leaves the confidence bounds valid; the report says
        how many pairs and draws were made.
    progress : callable, optional
        ``progress(stage, done, total)``, called as pairs are processed.
    **options
        Mechanism options, passed to ``plan`` on D and on every D'.

    Returns
    -------
    AuditReport
        The verdict, the worst pair found, per-component and joint estimates with confidence
        bounds.

    Raises
    ------
    ValueError
        On invalid inputs, or when the mechanism refuses the dataset itself.
    """
    t0 = time.perf_counter()
    eps, dlt = check_privacy_parameters(epsilon, delta)
    mech = get_mechanism(mechanism)
    n_samples = int(n_samples)
    if n_samples < 10:
        raise ValueError(f"n_samples must be >= 10, got {n_samples!r}")
    n_screen = min(DEFAULTS["n_screen"], n_samples) if n_screen is None else int(n_screen)
    if not 10 <= n_screen <= n_samples:
        raise ValueError(f"n_screen must lie in [10, n_samples], got {n_screen!r}")
    if int(max_pairs) < 1:
        raise ValueError(f"max_pairs must be >= 1, got {max_pairs!r}")
    if int(n_confirm) < 1:
        raise ValueError(f"n_confirm must be >= 1, got {n_confirm!r}")
    if time_limit is not None and not float(time_limit) > 0:
        raise ValueError(f"time_limit must be > 0 seconds, got {time_limit!r}")
    if not 0 < float(confidence) < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")
    data = as_labelled_data(X, y, bounds=bounds, norm_bound=norm_bound, min_class_size=0)
    plan_d = mech.plan(data, epsilon=eps, delta=dlt, **options)
    relation_name = neighbouring if neighbouring is not None else plan_d.guarantee.neighbouring
    try:
        relation = Adjacency(relation_name)
    except ValueError:
        allowed = ", ".join(a.value for a in Adjacency)
        raise ValueError(
            f"unknown neighbouring relation {relation_name!r}; allowed: {allowed}"
        ) from None
    rng = np.random.default_rng(seed)
    neighbours = select_neighbours(data, relation, int(max_pairs), rng)
    total = count_neighbours(data, relation)

    def plan_on(nb: Neighbour):
        try:
            with warnings.catch_warnings():  # already shown once, for D
                warnings.simplefilter("ignore", PrivacyLeakWarning)
                return mech.plan(nb.data, epsilon=eps, delta=dlt, **options), None
        except Exception as exc:  # a refusal is reported, not audited
            if isinstance(exc, ValueError) or type(exc).__name__ in (
                "SolverFailed", "SolverUnavailable"
            ):
                return None, f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            raise

    deadline = np.inf if time_limit is None else t0 + float(time_limit)
    screen_deadline = np.inf if time_limit is None else t0 + 0.5 * float(time_limit)

    # ---- screening: draws from M(D) shared by all pairs, most extreme pairs first
    alpha_screen = 1.0 - float(confidence)
    outs_d = _draw(plan_d, rng, n_screen)
    lp_dd = _log_densities(plan_d, outs_d)
    screened: list[_Screened] = []
    refused: list[str] = []
    stopped = False
    for i, nb in enumerate(neighbours):
        if i > 0 and time.perf_counter() > screen_deadline:
            stopped = True
            break
        plan_q, why = plan_on(nb)
        if plan_q is None:
            refused.append(f"{nb.description}: {why}")
        else:
            lp_dq = _log_densities(plan_q, outs_d)
            outs_q = _draw(plan_q, rng, n_screen)
            lp_qq = _log_densities(plan_q, outs_q)
            lp_qd = _log_densities(plan_d, outs_q)
            fwd = _direction("D vs D'", lp_dd, lp_dq, eps, alpha_screen,
                             exact_weights_delta(plan_d, plan_q, eps, outs_d[0]))
            rev = _direction("D' vs D", lp_qq, lp_qd, eps, alpha_screen,
                             exact_weights_delta(plan_q, plan_d, eps, outs_q[0]))
            screened.append(_Screened(nb, _pair_result(nb, "screen", [fwd, rev], dlt)))
        if progress is not None:
            progress("screen", i + 1, len(neighbours))

    refused_screen = list(refused)

    # ---- confirmation of the top pairs with fresh draws
    # rank by estimated delta, then by how close the privacy loss comes to epsilon (this
    # separates pairs when every estimate is zero, as for a valid mechanism)
    ranked = sorted(screened, key=lambda s: (-s.result.worst_estimate, -_loss_key(s.result)))
    top = ranked[: int(n_confirm)]
    alpha = (1.0 - float(confidence)) / (2 * max(len(top), 1))
    confirmed: list[PairResult] = []
    for i, s in enumerate(top):
        share = (deadline - time.perf_counter()) / (len(top) - i)
        plan_q, why = plan_on(s.neighbour)
        if plan_q is None:  # refused now though it ran before: report, do not hide
            refused.append(f"{s.neighbour.description}: {why}")
            continue
        logs, fillers, short = _confirm_draws(plan_d, plan_q, rng, n_samples,
                                              time.perf_counter() + share)
        stopped = stopped or short
        fwd = _direction("D vs D'", logs["dd"], logs["dq"], eps, alpha,
                         exact_weights_delta(plan_d, plan_q, eps, fillers[0]))
        rev = _direction("D' vs D", logs["qq"], logs["qd"], eps, alpha,
                         exact_weights_delta(plan_q, plan_d, eps, fillers[1]))
        confirmed.append(_pair_result(s.neighbour, "confirm", [fwd, rev], dlt))
        if progress is not None:
            progress("confirm", i + 1, len(top))

    # exact components of every screened pair count too (they carry no sampling error)
    exact_hits = [s.result for s in screened if _exceeds(_exact_max(s.result), dlt)]
    violation = any(_exceeds(p.worst_lower, dlt) for p in confirmed) or bool(exact_hits)
    candidates = confirmed + exact_hits
    worst = max(candidates, key=_evidence, default=None)
    leaking = sorted({c for p in candidates for c in p.leaking_components
                      if p.stage == "confirm" or c in _exact_names(p)}, key=COMPONENTS.index)
    max_upper = max((d.joint.upper for p in confirmed for d in p.directions), default=1.0)
    if violation:
        verdict = (
            f"VIOLATION: delta({eps:g}) >= {_evidence(worst)[0]:.4g} for {worst.description}, "
            f"above the claimed delta = {dlt:g}"
            + (f"; leaking: {', '.join(leaking)}" if leaking else "")
        )
    else:
        verdict = (
            f"no violation found: every confirmed lower bound is <= delta = {dlt:g}; the "
            f"largest upper bound is {max_upper:.3g}, so delta = {dlt:g} is neither refuted "
            "nor proven by this audit"
        )
    reached = len(screened) + len(refused_screen)
    if total is not None and reached == total:
        search = "all neighbours"
    elif total is not None and len(neighbours) == total:
        search = f"all neighbours in extremeness order, {reached} of {total} reached in time"
    else:
        search = "extreme-point search"
    ests = np.array([s.result.worst_estimate for s in screened]) if screened else np.zeros(1)
    return AuditReport(
        mechanism=mech.name,
        certified_claim=bool(plan_d.guarantee.certified),
        epsilon=eps,
        delta=dlt,
        neighbouring=relation.value,
        n_rows=data.n_samples,
        n_features=data.n_features,
        n_classes=data.n_classes,
        neighbours_total=total,
        pairs_examined=len(screened),
        pairs_refused=len(refused),
        refusal_reasons=refused[:20],
        search=search,
        n_samples=n_samples,
        n_screen=n_screen,
        confidence=float(confidence),
        confidence_note=(
            f"each confirmed bound at level {1 - alpha:.4g} (Bonferroni over {len(top)} "
            f"pair(s) x 2 directions); screening bounds at level {1 - alpha_screen:.4g} are "
            "for ranking only"
        ),
        seed=seed,
        violation=violation,
        verdict=verdict,
        worst_pair=worst,
        leaking_components=leaking,
        confirmed_pairs=confirmed,
        time_limit=None if time_limit is None else float(time_limit),
        stopped_by_time_limit=stopped,
        screen_summary={"max_estimate": float(ests.max()), "median_estimate": float(
            np.median(ests))},
        time_s=round(time.perf_counter() - t0, 3),
    )
