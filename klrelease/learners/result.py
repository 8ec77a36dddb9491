"""The common contract of the unlabelled-data learners: registry, entry point and result."""

from __future__ import annotations

import inspect
import json
import math
import platform
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .._version import SCHEMA_VERSION, __version__
from ..gmm import GMM
from ..privacy.guarantee import Guarantee
from ..privacy.tape import plain
from ..rng import make_rng

__all__ = [
    "LearnResult", "Learner", "MechanismFailed", "get_learner", "learn", "learners",
    "register_alias", "register_learner", "resolve_name", "describe_learner", "streams",
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
    options : dict
        The learner's public options as run (defaults included).
    seed : int or None
        The seed of a seeded run (an experiment); ``None`` when unseeded.
    feature_names : tuple of str
        Names of the columns of ``X`` (``x0, x1, ...`` unless given).
    """

    learner: str
    gmm: GMM | None
    guarantee: Guarantee
    failed: bool = False
    stage: str | None = None
    reason: str = ""
    diagnostics: dict[str, Any] = field(default_factory=dict)
    secure: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    feature_names: tuple = ()

    def __post_init__(self):
        if self.failed == (self.gmm is not None):
            raise ValueError("a LearnResult holds a GMM exactly when it did not fail")

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        """The result as an artifact (JSON-ready): the fields of a
        :class:`~klrelease.artifact.LearnerRelease`, or of a
        :class:`~klrelease.artifact.FailDocument` for FAIL."""
        g = self.guarantee
        d = None if self.gmm is None else self.gmm.n_features
        names = list(self.feature_names) or ([f"x{i}" for i in range(d)] if d else [])
        out: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "library_version": __version__,
            "python_version": platform.python_version(),
            "learner": self.learner,
            "status": "FAIL" if self.failed else "ok",
            "stage": self.stage,
            "reason": self.reason,
            "feature_names": names,
            "privacy": {
                "epsilon": g.epsilon, "delta": g.delta, "neighbouring": g.neighbouring,
                "certified": g.certified, "statement": g.statement,
                "reasons": list(g.reasons), "accounting": g.accounting,
                **({"accountant": self.diagnostics["ledger"]["accountant"]}
                   if "accountant" in self.diagnostics.get("ledger", {}) else {}),
            },
            "options": plain(self.options),
            "diagnostics": plain(self.diagnostics),
            "randomness": {"secure": self.secure, "seed": None if self.secure else self.seed,
                           "note": ("ChaCha20 CSPRNG keyed from the operating system"
                                    if self.secure else
                                    "seeded: an experiment, not a certified release")},
        }
        if self.gmm is not None:
            out["gmm"] = {
                "classes": list(self.gmm.classes),
                "weights": self.gmm.weights.tolist(),
                "means": self.gmm.means.tolist(),
                "covariances": self.gmm.covariances.tolist(),
            }
        return out

    def to_json(self, *, indent: int | None = 2) -> str:
        """The artifact as JSON (``klrelease.artifact.learner_document`` validates it;
        ``klrelease inspect``, ``sample`` and ``plot`` read it)."""
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
#: Former names: ``old -> new`` (``get_learner`` resolves them with a FutureWarning).
_ALIASES: dict[str, str] = {}
#: Learners that read a :class:`~klrelease.stream.Source` in passes themselves.
_STREAMING: set[str] = set()


def register_learner(name: str, fn: Learner, *, streams: bool = False) -> Learner:
    """Add a learner under ``name`` (which must be new). ``streams``: the learner takes a
    :class:`~klrelease.stream.Source` of rows without labels as ``X`` and reads it in passes
    (the others get every row in one float64 array)."""
    if name in _LEARNERS:
        raise ValueError(f"a learner named {name!r} is already registered")
    _LEARNERS[name] = fn
    if streams:
        _STREAMING.add(name)
    return fn


def streams(name: str) -> bool:
    """Whether the learner ``name`` reads a source in passes (memory independent of N)."""
    return resolve_name(name) in _STREAMING


def resolve_name(name: str) -> str:
    """The current name of a learner (a former name resolves to its successor)."""
    return _ALIASES.get(name, name)


def register_alias(old: str, new: str) -> None:
    """Keep a former learner name working: it resolves to ``new`` with a FutureWarning."""
    if old in _LEARNERS or old in _ALIASES or new not in _LEARNERS:
        raise ValueError(f"cannot alias {old!r} to {new!r}")
    _ALIASES[old] = new


def learners() -> list[str]:
    """Names of the registered learners."""
    return list(_LEARNERS)


def get_learner(name: str) -> Learner:
    if name in _ALIASES:
        import warnings

        warnings.warn(f"learner {name!r} is now {_ALIASES[name]!r}; the old name will be "
                      "removed", FutureWarning, stacklevel=3)
        name = _ALIASES[name]
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


def _option_words(fn: Learner) -> dict[str, str]:
    """Meanings of a learner's options from its docstring: numpy-style entries
    ``name : text`` or ``name, other : text`` (continuation lines indented deeper)."""
    import re

    lines = (inspect.getdoc(fn) or "").splitlines()
    out: dict[str, str] = {}
    names: list[str] = []
    indent = 0
    entry = re.compile(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*(?:,\s*[A-Za-z_][A-Za-z0-9_]*)*)\s+:\s+(.*)$")
    for line in lines:
        m = entry.match(line)
        if m and all(n.strip() in learner_options(fn) for n in m.group(2).split(",")):
            names = [n.strip() for n in m.group(2).split(",")]
            indent = len(m.group(1))
            for n in names:
                out[n] = m.group(3).strip()
        elif names and line.strip() and len(line) - len(line.lstrip()) > indent:
            for n in names:
                out[n] += " " + line.strip()
        else:
            names = []
    return out


def describe_learner(name: str) -> dict[str, Any]:
    """A learner's summary, relation, proof and options ``(name, type, default, meaning)``
    (for ``klrelease learners NAME``)."""
    import sys
    import typing

    fn = get_learner(name)
    hints = typing.get_type_hints(fn)
    words = _option_words(fn)
    rows = []
    for opt, p in learner_options(fn).items():
        kind = hints.get(opt)
        kind = ("any (a callable)" if kind is None else
                getattr(kind, "__name__", None) or str(kind).replace("typing.", ""))
        default = "required" if p.default is p.empty else (
            "none" if p.default is None else str(p.default).lower()
            if isinstance(p.default, bool) else str(p.default))
        rows.append((opt, kind, default, words.get(opt, "")))
    doc = (inspect.getdoc(fn) or "").splitlines()
    return {"name": resolve_name(name), "summary": doc[0] if doc else "",
            "relation": "replace-one (one record replaced; N public)",
            "proof": getattr(sys.modules.get(fn.__module__), "DOC", "beside the code"),
            "options": rows}


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
          seed: int | None = None, feature_names=None, **options) -> LearnResult:
    """Run a registered private learner on unlabelled rows ``X``.

    ``X`` is an array (or DataFrame) of rows, or a :class:`~klrelease.stream.Source` of rows
    without labels (``CSVSource(path, None)``, ``ParquetSource(path, None)``,
    ``ArraySource(X, None)``): a learner that streams (:func:`streams`, e.g. ``dp-em``) reads
    it in passes with memory independent of N; the others get its rows in one float64 array
    (8 N d bytes). Inputs are validated here from public facts only (shape, finiteness,
    epsilon, delta); everything data-dependent happens inside the learner and ends in a
    result, FAIL included. Without ``seed`` the noise comes from the CSPRNG; a seeded run is
    an experiment and its result is not certified. ``feature_names`` (default: the columns
    of a DataFrame or a source, else ``x0, x1, ...``) go into the artifact, with the public
    options and the seed.
    """
    from ..data import check_privacy_parameters
    from ..stream.sources import Source

    eps, dlt = check_privacy_parameters(epsilon, delta)
    fn = get_learner(learner)
    options = check_options(learner, fn, options)
    if int(n_components) != n_components or n_components < 1:
        raise ValueError(f"n_components must be a positive integer, got {n_components!r}")
    if feature_names is None and hasattr(X, "columns"):
        feature_names = [str(c) for c in X.columns]
    if isinstance(X, Source):
        if feature_names is None:
            feature_names = X.feature_names
        d = X.n_features
    else:
        try:
            X = np.asarray(X, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError("X must be a numeric array of shape (n_samples, n_features)"
                             ) from None
        if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
            raise ValueError("X must be a non-empty two-dimensional array "
                             "(n_samples, n_features)")
        if not np.all(np.isfinite(X)):
            raise ValueError("X contains NaN or infinite values")
        d = X.shape[1]
    names = (tuple(str(f) for f in feature_names) if feature_names is not None
             else tuple(f"x{i}" for i in range(d)))
    if len(names) != d:
        raise ValueError(f"feature_names has {len(names)} names for {d} features")
    if isinstance(X, Source) and not streams(learner):
        X = X.to_array()  # a counting pass, then one float64 array (every row validated)
    src = make_rng(seed)
    res = fn(X, int(n_components), epsilon=eps, delta=dlt, rng=src.generator, **options)
    public = {name: options.get(name, p.default) for name, p in learner_options(fn).items()
              if name != "progress"}
    res = replace(res, options=public, seed=src.seed, feature_names=names)
    if not src.secure:
        res = replace(res, secure=False, guarantee=res.guarantee.seeded())
    return res
