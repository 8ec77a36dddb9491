"""The trial runner: datasets, plans, Monte Carlo over the mechanisms, one row per result.

A trial ``t`` draws a dataset from the stream ``(seed, t, 0, i)`` (``i`` the index of the swept
value when the value changes the data, N, K or d; otherwise 0, so every epsilon or clipping
bound of a trial sees the same dataset), and the noise of a mechanism at value ``i`` from the
stream ``(seed, t, 1, i, crc32(mechanism id))``. Results are therefore reproducible per trial
whatever the number of trials, worker processes or mechanisms.

Options: kl-paper gets the experiment's lambda; a mechanism that takes a public lower bound on
the class sizes (``min_class_size``) gets the floor every synthetic class has by construction
(:class:`~klrelease.experiments.settings.SyntheticSetting`), unless the figure sets it.

For each (trial, value, mechanism) the runner designs the mechanism once
(:func:`klrelease.plan`) and draws ``n_draws`` releases; the row holds the exact KL of each
release against the non-private GMM of the same data (:func:`klrelease.fit_gmm`) averaged over
the draws, and for ``kl-paper`` the design objective (12). Under record-level adjacency the
non-private model is the GMM of the clipped rows (the paper fits after clipping); the KL
against the GMM of the raw rows, which adds the clipping bias, is reported beside it.

A mechanism that fails on a dataset (bad input, solver failure) gives a row with
``status = "error"`` and the one-line message; a mechanism that returns FAIL (raises
:class:`~klrelease.learners.result.MechanismFailed`) in every draw gives ``status = "FAIL"``
with its stage and reason, and FAILs in some draws are counted in ``error``; nothing is
silently dropped. Warnings raised by a
mechanism (for instance that its guarantee fails) are recorded once per distinct message with a
count, together with the guarantee each mechanism states, before being kept off the console.
"""

from __future__ import annotations

import os
import time
import warnings
import zlib
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

import numpy as np

from ..gmm import fit_gmm
from ..kl import kl_divergence
from ..learners.result import MechanismFailed
from ..mechanisms import get_mechanism
from ..mechanisms import mechanisms as registered_mechanisms
from ..release import plan as make_plan
from ..statistics import clip_to_norm
from .settings import Experiment, MechanismSpec
from .synthetic import draw_synthetic

__all__ = ["FIELDS", "TrialOutcome", "run_trial", "run_trials", "available_mechanisms"]

#: The columns of the per-trial CSV.
FIELDS = (
    "figure", "trial", "sweep", "x", "mechanism", "epsilon", "delta", "n_samples",
    "n_classes", "n_features", "norm_bound", "min_class_size", "n_draws", "kl_mean",
    "kl_median", "kl_std", "kl_min", "kl_max", "objective", "kl_vs_raw_mean", "certified",
    "plan_seconds", "status", "error",
)


@dataclass
class TrialOutcome:
    """Everything one trial produced."""

    trial: int
    rows: list[dict] = field(default_factory=list)
    warnings: dict[str, Counter] = field(default_factory=dict)
    guarantees: dict[str, dict] = field(default_factory=dict)
    solvers: Counter = field(default_factory=Counter)


def available_mechanisms(exp: Experiment) -> tuple[list[MechanismSpec], list[str]]:
    """The experiment's mechanisms that are registered, and the names that are not."""
    names = set(registered_mechanisms())
    present = [m for m in exp.mechanisms if m.name in names]
    missing = [m.id for m in exp.mechanisms if m.name not in names]
    return present, missing


def _stream(exp: Experiment, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(exp.seed, spawn_key=key))


def _one_line(message) -> str:
    return " ".join(str(message).split())


def _guarantee_record(plan) -> dict:
    g = plan.guarantee
    return {
        "neighbouring": g.neighbouring,
        "certified": bool(g.certified),
        "statement": g.statement,
        "reasons": list(g.reasons),
        "accounting": g.accounting,
    }


def run_trial(exp: Experiment, trial: int, mechs: list[MechanismSpec]) -> TrialOutcome:
    """Run one trial of ``exp`` over every value of its sweep and every mechanism."""
    out = TrialOutcome(trial=trial)
    data = None
    for i, value in enumerate(exp.values):
        setting, eps, bound = exp.point(value)
        if data is None or exp.data_per_value:
            data = draw_synthetic(setting, _stream(exp, trial, 0, i if exp.data_per_value else 0))
        X, y = data.X, data.y
        reference = fit_gmm(X, y)
        raw_reference = None
        if exp.record_level:
            raw_reference = reference
            reference = fit_gmm(clip_to_norm(X, bound), y)
        for spec in mechs:
            row = {
                "figure": exp.name, "trial": trial, "sweep": exp.sweep, "x": value,
                "mechanism": spec.id, "epsilon": eps, "delta": exp.delta,
                "n_samples": setting.n_samples, "n_classes": setting.n_classes,
                "n_features": setting.n_features, "norm_bound": bound,
                "min_class_size": setting.class_floor, "n_draws": exp.n_draws,
            }
            options = spec.option_dict()
            accepted = get_mechanism(spec.name).options
            if "lam" in accepted:
                options.setdefault("lam", exp.lam)
            if "min_class_size" in accepted:
                options.setdefault("min_class_size", setting.class_floor)
            if bound is not None:
                options["norm_bound"] = bound
            rng = _stream(exp, trial, 1, i, zlib.crc32(spec.id.encode()))
            t0 = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    p = make_plan(X, y, epsilon=eps, delta=exp.delta, mechanism=spec.name,
                                  classes=list(range(setting.n_classes)), **options)
                    plan_s = time.perf_counter() - t0
                    draws, fails = [], []
                    for _ in range(exp.n_draws):
                        try:
                            draws.append(p.draw(rng))
                        except MechanismFailed as exc:  # a FAIL output: recorded, not dropped
                            fails.append(exc)
                    if not draws:
                        raise fails[-1]
                    kls = np.array([kl_divergence(g, reference) for g in draws])
                    raw = None
                    if raw_reference is not None:
                        raw = np.array([kl_divergence(g, raw_reference) for g in draws])
                except MechanismFailed as exc:  # the mechanism's FAIL output
                    row.update(status="FAIL", error=_one_line(exc),
                               plan_seconds=time.perf_counter() - t0)
                    if spec.id not in out.guarantees:  # raised by a draw of this plan
                        out.guarantees[spec.id] = {**_guarantee_record(p), "recorded_at_x": value}
                    p = None
                except Exception as exc:  # recorded in the row, never dropped
                    row.update(status="error", error=f"{type(exc).__name__}: {_one_line(exc)}",
                               plan_seconds=time.perf_counter() - t0)
                    p = None
            counter = out.warnings.setdefault(spec.id, Counter())
            for w in caught:
                counter[f"{w.category.__name__}: {_one_line(w.message)}"] += 1
            if p is None:
                out.rows.append(row)
                continue
            if spec.id not in out.guarantees:
                out.guarantees[spec.id] = {**_guarantee_record(p), "recorded_at_x": value}
            if p.solver is not None:
                out.solvers[p.solver.solver] += 1
            design = getattr(p, "design", None)
            row.update(
                kl_mean=float(kls.mean()), kl_median=float(np.median(kls)),
                kl_std=float(kls.std(ddof=1)) if kls.size > 1 else 0.0,
                kl_min=float(kls.min()), kl_max=float(kls.max()),
                objective=float(design.objective) if design is not None else None,
                kl_vs_raw_mean=float(raw.mean()) if raw is not None else None,
                certified=bool(p.guarantee.certified), plan_seconds=plan_s,
                status="ok" if np.all(np.isfinite(kls)) else "non-finite",
                error=(f"FAIL in {len(fails)} of {exp.n_draws} draws: {_one_line(fails[-1])}"
                       if fails else ""),
            )
            out.rows.append(row)
    return out


def _one_row_thread() -> None:
    """A worker process's passes over rows on one thread (:func:`klrelease._threads.
    row_threads`): ``jobs`` processes already share the cores."""
    os.environ["KLRELEASE_ROW_THREADS"] = "1"


def _run_trial_job(args) -> TrialOutcome:
    exp, trial, mechs = args
    return run_trial(exp, trial, mechs)


def run_trials(exp: Experiment, mechs: list[MechanismSpec], *, jobs: int = 1,
               on_done=None) -> list[TrialOutcome]:
    """Run every trial of ``exp``, in ``jobs`` worker processes; results in trial order.

    ``on_done(outcome)`` is called as each trial finishes (for a progress bar).
    """
    outcomes: list[TrialOutcome] = []
    if jobs <= 1:
        for t in range(exp.trials):
            o = run_trial(exp, t, mechs)
            outcomes.append(o)
            if on_done is not None:
                on_done(o)
    else:
        # the worker processes share the cores: each keeps its passes over rows on one thread
        with ProcessPoolExecutor(max_workers=jobs, initializer=_one_row_thread) as pool:
            futures = [pool.submit(_run_trial_job, (exp, t, mechs)) for t in range(exp.trials)]
            for fut in as_completed(futures):
                o = fut.result()
                outcomes.append(o)
                if on_done is not None:
                    on_done(o)
    outcomes.sort(key=lambda o: o.trial)
    return outcomes
