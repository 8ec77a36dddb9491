"""The common contract of the unlabelled-data learners: registry, entry point and result."""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..gmm import GMM
from ..mechanisms.base import Guarantee
from ..privacy.tape import plain
from ..rng import make_rng

__all__ = [
    "LearnResult", "Learner", "MechanismFailed", "get_learner", "learn", "learners",
    "register_learner",
]


@dataclass(frozen=True)
class LearnResult:
    """What a private learner releases: a GMM, or FAIL with its reason.

    Attributes
    ----------
    learner : str
        Registry name of the learner.
    gmm : GMM or None
        The released mixture (components labelled ``0..k-1``); ``None`` when the run failed.
    guarantee : Guarantee
        The privacy claim; it covers the FAIL outcome too.
    failed : bool
    stage : str or None
        The stage that returned FAIL (e.g. ``"popularity test"``).
    reason : str
        One sentence saying why, with public numbers only (thresholds, noisy counts that the
        mechanism releases anyway, N, d, k, epsilon): never a statistic of the data.
    diagnostics : dict
        Public numbers of the run (budget ledger, released noisy values, sizes).
    secure : bool
        True when the noise came from the CSPRNG (unseeded run); seeded runs are experiments.
    """

    learner: str
    gmm: GMM | None
    guarantee: Guarantee
    failed: bool = False
    stage: str | None = None
    reason: str = ""
    diagnostics: dict[str, Any] = field(default_factory=dict)
    secure: bool = True

    def __post_init__(self):
        if self.failed == (self.gmm is not None):
            raise ValueError("a LearnResult holds a GMM exactly when it did not fail")

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        g = self.guarantee
        out: dict[str, Any] = {
            "learner": self.learner,
            "status": "FAIL" if self.failed else "ok",
            "stage": self.stage,
            "reason": self.reason,
            "privacy": {
                "epsilon": g.epsilon, "delta": g.delta, "neighbouring": g.neighbouring,
                "certified": g.certified, "statement": g.statement,
                "reasons": list(g.reasons), "accounting": g.accounting,
                **({"accountant": self.diagnostics["ledger"]["accountant"]}
                   if "accountant" in self.diagnostics.get("ledger", {}) else {}),
            },
            "diagnostics": plain(self.diagnostics),
            "randomness": {"secure": self.secure},
        }
        if self.gmm is not None:
            out["gmm"] = {
                "weights": self.gmm.weights.tolist(),
                "means": self.gmm.means.tolist(),
                "covariances": self.gmm.covariances.tolist(),
            }
        return out

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


class MechanismFailed(Exception):
    """A labelled release mechanism returned FAIL (raised by ``Plan.sample``).

    The FAIL is an output of the mechanism, covered by its privacy proof: ``stage`` names the
    step that failed and ``reason`` states it with public numbers only. When it comes through
    :func:`klrelease.release`, ``result`` holds the FAIL artifact (a JSON-ready dict: the
    privacy block, ``status: "FAIL"``, the stage and the reason, the public options and the
    randomness block; no statistic of the data); raised by a bare ``Plan.sample`` it is
    ``None``.
    """

    def __init__(self, stage: str, reason: str, result: dict[str, Any] | None = None):
        super().__init__(f"FAIL at stage {stage}: {reason}")
        self.stage = stage
        self.reason = reason
        self.result = result

    def to_json(self, *, indent: int | None = 2) -> str:
        """The FAIL artifact as JSON (only when it came through ``release()``)."""
        if self.result is None:
            raise ValueError("this FAIL did not come through release(): no artifact")
        return json.dumps(self.result, indent=indent)


#: A learner: ``fn(X, n_components, *, epsilon, delta, rng, **options) -> LearnResult``.
Learner = Callable[..., LearnResult]

_LEARNERS: dict[str, Learner] = {}


def register_learner(name: str, fn: Learner) -> Learner:
    """Add a learner under ``name`` (which must be new)."""
    if name in _LEARNERS:
        raise ValueError(f"a learner named {name!r} is already registered")
    _LEARNERS[name] = fn
    return fn


def learners() -> list[str]:
    """Names of the registered learners."""
    return list(_LEARNERS)


def get_learner(name: str) -> Learner:
    try:
        return _LEARNERS[name]
    except KeyError:
        raise ValueError(
            f"unknown learner {name!r}; registered: {', '.join(_LEARNERS) or 'none'}"
        ) from None


#: Public parameters in the units of the data: positive and finite when given.
SCALE_PARAMETERS = ("R", "sigma_min", "sigma_max", "w_mu")
#: Arguments that ``learn`` passes itself.
_RUN_ARGUMENTS = ("epsilon", "delta", "rng")


def learner_options(fn: Learner) -> dict[str, inspect.Parameter]:
    """The public options of a learner (its keyword-only parameters except the budget and
    the generator)."""
    return {name: p for name, p in inspect.signature(fn).parameters.items()
            if p.kind == p.KEYWORD_ONLY and name not in _RUN_ARGUMENTS}


def check_options(name: str, fn: Learner, options: dict) -> dict:
    """Options are public inputs: checked before the data is read. An unknown option, a
    required one missing (the bounds in the units of the data have no default) or a scale
    that is not a positive number raises :class:`ValueError`. Returns the options with the
    scales as floats."""
    known = learner_options(fn)
    unknown = [k for k in options if k not in known]
    if unknown:
        raise ValueError(f"learner {name!r} has no option {unknown[0]!r}; its options: "
                         f"{', '.join(known)}")
    missing = [k for k, p in known.items() if p.default is p.empty and k not in options]
    if missing:
        raise ValueError(
            f"learner {name!r} needs the public parameter{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)}, in the units of the data (public knowledge about the "
            "population, never read from the data; CLI: --param NAME=VALUE)")
    out = dict(options)
    for key in SCALE_PARAMETERS:
        if key not in options or (options[key] is None and known[key].default is None):
            continue  # absent, or None where None is the default (derived from the others)
        value = options[key]
        ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, (bool, np.bool_)) and math.isfinite(float(value)) and float(value) > 0
        if not ok:
            raise ValueError(f"{key} must be a positive number, got {value!r}")
        out[key] = float(value)
    lo, hi = out.get("sigma_min"), out.get("sigma_max")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError("sigma_min must not exceed sigma_max")
    return out


def learn(X, n_components: int, *, epsilon: float, delta: float, learner: str,
          seed: int | None = None, **options) -> LearnResult:
    """Run a registered private learner on unlabelled rows ``X``.

    Inputs are validated here from public facts only (shape, finiteness, epsilon, delta);
    everything data-dependent happens inside the learner and ends in a result, FAIL included.
    Without ``seed`` the noise comes from the CSPRNG; a seeded run is an experiment and its
    result is not certified.
    """
    from ..data import check_privacy_parameters

    eps, dlt = check_privacy_parameters(epsilon, delta)
    fn = get_learner(learner)
    options = check_options(learner, fn, options)
    try:
        X = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("X must be a numeric array of shape (n_samples, n_features)") from None
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError("X must be a non-empty two-dimensional array (n_samples, n_features)")
    if not np.all(np.isfinite(X)):
        raise ValueError("X contains NaN or infinite values")
    if int(n_components) != n_components or n_components < 1:
        raise ValueError(f"n_components must be a positive integer, got {n_components!r}")
    src = make_rng(seed)
    res = fn(X, int(n_components), epsilon=eps, delta=dlt, rng=src.generator, **options)
    if not src.secure:
        from dataclasses import replace

        res = replace(res, secure=False, guarantee=res.guarantee.seeded())
    return res
