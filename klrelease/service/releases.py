"""One release request, from validation to the signed artifact.

The order is the point:

1. **Validate** the request from public inputs only: the mechanism, its typed options (the
   dataset's relation, classes and bound are fixed by its registration and cannot be set),
   epsilon and delta, the per-request maximum. Only certified claims are served, only
   unseeded releases, and only mechanisms that read the data in chunks; a mechanism that
   does not state its claim before planning is served for datasets registered with a public
   bound (every such mechanism here needs one). Nothing is charged for a request refused
   here.
2. **Claim.** The claim is known before the data is read: the mechanism's
   :meth:`~klrelease.mechanisms.Mechanism.public_guarantee` (with its privacy curve), or the
   claimed (epsilon, delta), composed by basic composition.
3. **Charge** it in the ledger: checked against the budget and committed in one transaction
   (:meth:`~klrelease.service.ledger.Ledger.charge`). A request id seen before returns what
   it got then and is not charged again.
4. **Release**: only now is the data opened and read, by :func:`klrelease.release`, which
   refuses (before drawing noise) a plan whose claim is not the one charged. Whatever happens
   from here on, the charge stands: a failure is recorded as ``failed_after_charge`` and the
   analyst is told so, without the error (it may name a path); the owner sees its type.
5. **Sign** the artifact (Ed25519) and settle the charge with it.
"""

from __future__ import annotations

import json
import logging
import math
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..data import check_privacy_parameters
from ..mechanisms import get_mechanism
from ..privacy.guarantee import BudgetExceeded, Guarantee
from .ledger import BudgetState, DatasetRecord, Instance, Ledger, Principal

__all__ = ["Outcome", "RELEASE_FIELDS", "RESERVED_OPTIONS", "handle_release", "public_claim",
           "served_mechanisms", "validate_request"]

log = logging.getLogger("klrelease.service")

#: Options fixed by a dataset's registration (an analyst may repeat the dataset's adjacency).
RESERVED_OPTIONS = ("adjacency", "norm_bound", "bounds", "bounds_from_data", "classes")
#: The fields of a release request.
RELEASE_FIELDS = ("mechanism", "epsilon", "delta", "options", "request_id")
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass
class Outcome:
    """An HTTP answer: status, JSON body (or the artifact's text) and headers."""

    status: int
    body: dict[str, Any] | None = None
    text: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _error(status: int, code: str, detail: str, **extra) -> Outcome:
    return Outcome(status, {"detail": detail, "code": code, **extra})


class RequestInvalid(ValueError):
    """A release request refused before any charge (422)."""


def public_claim(mech, epsilon: float, delta: float, options, ds: DatasetRecord) -> Guarantee:
    """The claim of a release known before its data is read (see the module's notes)."""
    g = _stated_claim(mech, epsilon, delta, options, ds)
    if g is not None:
        return g
    certified = mech.certifies(options, {})
    return Guarantee(
        epsilon=epsilon, delta=delta, neighbouring=options.adjacency.value, certified=certified,
        statement=f"({epsilon:g}, {delta:g}) claimed by {mech.name} under "
                  f"{options.adjacency.value} adjacency",
        accounting="the claimed (epsilon, delta), composed by basic composition")


def _stated_claim(mech, epsilon, delta, options, ds: DatasetRecord) -> Guarantee | None:
    return mech.public_guarantee(epsilon=epsilon, delta=delta, options=options,
                                 n_samples=ds.n_samples, n_classes=ds.n_classes,
                                 n_features=ds.n_features)


def validate_request(ds: DatasetRecord, body: dict[str, Any]):
    """``(mechanism, options, claim, request_id)`` of a release request, or
    :class:`RequestInvalid` with one line."""
    unknown = sorted(set(body) - set(RELEASE_FIELDS))
    if unknown:
        raise RequestInvalid(f"unknown field(s) {', '.join(unknown)}; a release request has "
                             f"{', '.join(RELEASE_FIELDS)}")
    if "epsilon" not in body or "delta" not in body:
        raise RequestInvalid("a release request needs epsilon and delta")
    for name in ("epsilon", "delta"):
        if isinstance(body[name], bool) or not isinstance(body[name], (int, float)):
            raise RequestInvalid(f"{name} must be a number")
    eps, dlt = check_privacy_parameters(body["epsilon"], body["delta"])
    cap = ds.max_epsilon_per_request
    if cap is not None and eps > cap:
        raise RequestInvalid(f"epsilon {eps:g} is above this dataset's maximum per request "
                             f"({cap:g})")
    request_id = body.get("request_id")
    if request_id is None:
        request_id = uuid.uuid4().hex
    if not isinstance(request_id, str) or not REQUEST_ID.match(request_id):
        raise RequestInvalid("request_id must be 1-128 letters, digits, '.', '_', ':' or '-'")
    name = body.get("mechanism", "kl-certified")
    if not isinstance(name, str):
        raise RequestInvalid("mechanism must be a name (see GET /v1/datasets/NAME)")
    mech = get_mechanism(name)
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise RequestInvalid("options must be an object of mechanism options")
    for key in RESERVED_OPTIONS:
        if key in options and not (key == "adjacency" and options[key] == ds.adjacency):
            raise RequestInvalid(f"option {key} is fixed by the registration of dataset "
                                 f"{ds.name!r} and cannot be set by a request")
    opts = mech.validate_options({**options, "adjacency": ds.adjacency})
    if (ds.source or {}).get("dask"):  # the plan's options there (and so its claim)
        opts = mech.options_on_cluster(opts)
    if not getattr(mech, "streams", False):
        raise RequestInvalid(f"{mech.name} needs the data in memory; the service serves "
                             "mechanisms that read the data in chunks (e.g. kl-certified)")
    if ds.bound is None and _stated_claim(mech, eps, dlt, opts, ds) is None:
        raise RequestInvalid(f"{mech.name} needs a public bound on the features and dataset "
                             f"{ds.name!r} was registered without one (--bounds or "
                             "--norm-bound); kl-certified needs none under label-flip")
    claim = public_claim(mech, eps, dlt, opts, ds)
    if not claim.certified or claim.neighbouring != ds.adjacency:
        raise RequestInvalid(f"{mech.name} with these options is not certified under "
                             f"{ds.adjacency} adjacency; the service serves certified "
                             "releases only")
    return mech, opts, claim, request_id


def served_mechanisms(ds: DatasetRecord) -> list[dict[str, Any]]:
    """The mechanisms whose default options give a certified release of ``ds``."""
    from ..mechanisms import mechanisms
    from ..mechanisms.base import describe_options

    out = []
    for name in mechanisms():
        mech = get_mechanism(name)
        try:
            _, opts, claim, _ = validate_request(ds, {"mechanism": name, "epsilon": 1.0,
                                                      "delta": 1e-6})
        except (RequestInvalid, ValueError):
            continue
        out.append({"name": name, "summary": mech.summary,
                    "options": [{"name": n, "type": k, "default": d, "meaning": m}
                                for n, k, d, m in describe_options(mech)
                                if n not in RESERVED_OPTIONS],
                    "curve": claim.curve is not None})
    return out


def largest_epsilon(state: BudgetState, mech, opts, delta: float,
                    ds: DatasetRecord, above: float) -> float | None:
    """The largest epsilon (below ``above``) of a release with these options and ``delta``
    that the budget still admits, ``None`` if none does (bisection on public claims)."""
    acc = state.accountant()

    def fits(eps: float) -> bool:
        try:
            acc.check(public_claim(mech, eps, delta, opts, ds))
        except (BudgetExceeded, ValueError):
            return False
        return True

    lo, hi = above * 1e-6, above
    if not fits(lo):
        return None
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        if hi / lo < 1.0 + 1e-4:
            break
    return lo


class _Charged:
    """Stands in for a :class:`~klrelease.privacy.guarantee.BudgetAccountant` in
    :func:`klrelease.release`: the ledger charged the budget already, so ``check`` only
    refuses (before any noise is drawn) a plan whose claim is not the claim charged."""

    def __init__(self, claim: Guarantee):
        self.claim = claim

    def check(self, g: Guarantee) -> None:
        c = self.claim
        same = (g.certified and g.epsilon == c.epsilon and g.delta == c.delta
                and g.neighbouring == c.neighbouring
                and (c.curve is None or g.curve == c.curve))
        if not same:
            raise BudgetExceeded("the plan's privacy claim is not the claim charged; nothing "
                                 "was drawn")

    def spend(self, g: Guarantee) -> None:
        """Spent already, by the ledger's charge: only checked (:func:`klrelease.release`
        calls this before any noise is drawn)."""
        self.check(g)


def run_release(ds: DatasetRecord, mech, opts, claim: Guarantee) -> dict[str, Any]:
    """Read the data and release (after the charge); the artifact document, unsigned."""
    from ..learners.result import MechanismFailed
    from ..release import release
    from .datasets import open_source

    data = open_source(ds)
    try:
        rel = release(data, None, epsilon=claim.epsilon, delta=claim.delta,
                      mechanism=mech.name, accountant=_Charged(claim), **opts.as_dict())
    except MechanismFailed as exc:  # FAIL is an output of the mechanism: it is the artifact
        if getattr(exc, "result", None) is None:
            raise
        return dict(exc.result)
    return rel.model_dump(mode="json", exclude={"signature"})


def handle_release(ledger: Ledger, signer, instance: Instance, principal: Principal,
                   ds: DatasetRecord, body: dict[str, Any]) -> Outcome:
    """Validate, charge, release, sign and settle one request (see the module's notes)."""
    try:
        mech, opts, claim, request_id = validate_request(ds, body)
    except ValueError as exc:
        return _error(422, "invalid_request", " ".join(str(exc).split()))
    try:
        result = ledger.charge(ds, principal, request_id=request_id, mechanism=mech.name,
                               options=opts.as_dict(), claim=claim, instance=instance)
    except Exception:
        _abandon(ledger, ds, request_id, instance)
        raise
    where = {"Location": f"/v1/datasets/{ds.name}/releases/{request_id}",
             "X-Request-Id": request_id}
    if result.kind == "conflict":
        return _error(422, "request_id_reused", f"request_id {request_id!r} was used for "
                      "another request; give a new request_id")
    if result.kind == "existing":
        return _existing(result.record, where)
    if result.kind == "refused":
        best = largest_epsilon(result.state, mech, opts, claim.delta, ds, claim.epsilon)
        state = result.state.as_dict()
        left = state["remaining"]
        words = (f"the largest {mech.name} request at delta={claim.delta:g} that fits is "
                 f"epsilon={best:.4g}" if best is not None else
                 f"no {mech.name} request at delta={claim.delta:g} fits")
        log.info("release %s on %s by token %d (%s): refused, budget exceeded", request_id,
                 ds.name, principal.id, principal.name)
        return _error(409, "budget_exceeded",
                      f"budget exceeded: {result.message}; remaining "
                      f"{left['fraction']:.1%} of the budget; {words}",
                      request_id=request_id, budget=state, largest_epsilon=best)
    log.info("release %s on %s by token %d (%s): charged %s (epsilon=%g, delta=%g)",
             request_id, ds.name, principal.id, principal.name, mech.name, claim.epsilon,
             claim.delta)
    try:
        text = json.dumps(signer.sign(run_release(ds, mech, opts, claim)), indent=2)
    except Exception as exc:  # noqa: BLE001 - any failure after the charge keeps the charge
        ledger.settle(result.charge_id, "failed_after_charge",
                      error=f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:2000])
        log.warning("release %s on %s: failed after the charge (%s); the charge stands",
                    request_id, ds.name, type(exc).__name__)
        return _error(500, "failed_after_charge",
                      "the release failed after its budget was charged; the charge stands and "
                      "this request_id will not run again (the data owner can see why)",
                      request_id=request_id)
    if not ledger.settle(result.charge_id, "released", artifact=text):
        log.warning("release %s on %s: marked lost before it finished; not released",
                    request_id, ds.name)
        return _error(409, "request_lost", "this request was marked lost (its service "
                      "process was declared stopped) before it finished; the charge stands "
                      "and nothing was released", request_id=request_id, state="lost")
    log.info("release %s on %s: released", request_id, ds.name)
    return Outcome(201, text=text, headers=where)


def _abandon(ledger: Ledger, ds: DatasetRecord, request_id: str, instance: Instance) -> None:
    """The charge transaction raised, possibly after it committed (a lost answer from the
    database): a charge this process holds open for the request is settled as failed, so
    that it is not left ``charged`` while this process lives. Best effort."""
    try:
        cid = ledger.open_charge(ds, request_id, instance)
        if cid is not None:
            ledger.settle(cid, "failed_after_charge", error="the charge's transaction raised "
                          "after it committed; the release did not run")
    except Exception as exc:  # noqa: BLE001 - the ledger is unreachable: lost at restart
        log.warning("request %s on %s: could not settle an interrupted charge (%s)",
                    request_id, ds.name, type(exc).__name__)


def _existing(record: dict, where: dict[str, str]) -> Outcome:
    state, rid = record["state"], record["request_id"]
    if state == "released":
        return Outcome(200, text=record["artifact"], headers=where)
    words = {
        "charged": ("request_in_progress", "this request is being released (or its service "
                    "process stopped; then it is marked lost within the lease)"),
        "failed_after_charge": ("request_failed", "this request failed after its budget was "
                                "charged; the charge stands and it will not run again"),
        "lost": ("request_lost", "this request was lost: its service process stopped during the "
                 "release; the charge stands and it will not run again"),
    }[state]
    return _error(409, words[0], words[1], request_id=rid, state=state)
