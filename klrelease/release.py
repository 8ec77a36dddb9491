"""The entry points: design a mechanism on a dataset, and release a GMM."""

from __future__ import annotations

import logging
import pickle
import platform
import warnings

import numpy as np

from ._version import __version__
from .artifact import (
    SCHEMA_VERSION,
    FailDocument,
    PrivacyBlock,
    RandomnessBlock,
    Release,
    SolverBlock,
)
from .data import as_labelled_data, check_privacy_parameters
from .domain import Domain
from .kl import KLEstimate, monte_carlo_kl
from .learners.result import MechanismFailed
from .mechanisms import Plan, get_mechanism
from .neighbours import Adjacency
from .privacy.guarantee import BudgetAccountant
from .rng import make_rng
from .stream import Source, as_source, is_dask_collection
from .warnings_ import UnusedBoundWarning, warn_privacy

__all__ = ["plan", "release", "expected_kl"]

log = logging.getLogger("klrelease")


def _bounds_option(bounds, options: dict):
    """A named way of choosing bounds (e.g. ``"features"``) is a mechanism option."""
    if isinstance(bounds, str):
        if "bounds" in options:
            raise ValueError("bounds is given twice (as an argument and as an option)")
        options["bounds"] = bounds
        return None
    return bounds


def _streaming_names() -> str:
    from .mechanisms import mechanisms

    return ", ".join(n for n in mechanisms() if getattr(get_mechanism(n), "streams", False))


def _design(X, y, epsilon, delta, mechanism, classes, bounds, norm_bound, options,
            client=None):
    """Validate everything, then design the mechanism: (validated data, plan, options).

    The order is fixed: privacy parameters, mechanism and options (public inputs) first, then
    the data, then the design. The plan's certified flag must agree with the mechanism's
    declaration (:meth:`~klrelease.mechanisms.Mechanism.certifies`).
    """
    eps, dlt = check_privacy_parameters(epsilon, delta)
    mech = get_mechanism(mechanism)
    options = dict(options)
    bounds = Domain.from_public(_bounds_option(bounds, options), norm_bound)
    opts = mech.validate_options(options)
    if bounds is not None and bounds.kind == "box" and not mech.uses_box:
        raise ValueError(mech.box_refusal())
    unused = opts.adjacency == Adjacency.LABEL_FLIP and not mech.bound_under_label_flip
    data = None
    if client is not None or isinstance(X, Source) or is_dask_collection(X):
        if getattr(mech, "streams", False):
            data = as_source(X, y, classes=classes, bounds=bounds, client=client)
            if data is None:
                raise ValueError("client= goes with a Dask collection or a data source as X")
        elif isinstance(X, Source):
            raise ValueError(f"{mech.name} needs the data in memory; {_streaming_names()} "
                             "read a streamed source")
    if data is None:  # in memory (a Dask collection is materialised for other mechanisms)
        data = as_labelled_data(X, y, classes=classes, bounds=bounds,
                                min_class_size=mech.min_class_size)
    # a bound passed here, not one a dataset carries for other relations (the bundled sets)
    if unused and bounds is not None:
        record = ("give adjacency='replace-one' for a guarantee at the record level"
                  if Adjacency.REPLACE_ONE in mech.relations else
                  "it has no relation at the record level")
        warnings.warn(f"{mech.name} does not use the public bound under label flip (the "
                      f"features are public); {record}", UnusedBoundWarning, stacklevel=3)
    p = mech.plan(data, epsilon=eps, delta=dlt, **opts.as_dict())
    declared = mech.certifies(opts, p.public_options)
    if bool(p.guarantee.certified) != bool(declared):
        raise RuntimeError(
            f"{mech.name}: the plan's certified flag disagrees with the mechanism's declaration"
        )
    return data, p, opts


def plan(
    X,
    y,
    *,
    epsilon: float,
    delta: float,
    mechanism: str = "kl-certified",
    classes=None,
    bounds=None,
    norm_bound: float | None = None,
    client=None,
    **options,
) -> Plan:
    """Validate the inputs and design ``mechanism`` on ``(X, y)`` without drawing noise.

    The returned :class:`~klrelease.mechanisms.Plan` holds private statistics: use it for
    experiments (:func:`expected_kl`) and audits, never publish it.
    """
    return _design(X, y, epsilon, delta, mechanism, classes, bounds, norm_bound, options,
                   client)[1]


def release(
    X,
    y,
    *,
    epsilon: float,
    delta: float,
    mechanism: str = "kl-certified",
    seed: int | None = None,
    classes=None,
    bounds=None,
    norm_bound: float | None = None,
    accountant: BudgetAccountant | None = None,
    client=None,
    **options,
) -> Release:
    """Release a labelled GMM of ``(X, y)`` with the named mechanism.

    Parameters
    ----------
    X : array-like of shape (N, d), a :class:`klrelease.stream.Source` or a Dask collection
        Features (finite). A source (arrays or memmaps in chunks, Parquet or CSV files) or a
        Dask array/dataframe is read in chunks, in bounded memory, by the mechanisms that
        stream (``kl-certified``, ``kl-paper`` and the baselines ``gaussian-iid``,
        ``laplace-iid``, ``colored-gaussian``, ``r1smg``); other mechanisms materialise a Dask
        collection in memory and refuse a source.
    y : array-like of shape (N,), a Dask array, or None
        Class labels (None when ``X`` is a source, which carries its labels). Mechanisms
        that use the exact class covariances (``kl-paper`` and the baselines) need more than
        d rows in every class; ``kl-certified`` accepts any class size, so its answer never
        depends on whether a private class is small.
    epsilon, delta : float
        The privacy parameters (epsilon > 0, 0 < delta < 1).
    mechanism : str
        A name from :func:`klrelease.mechanisms`.
    seed : int, numpy Generator or RandomState, optional
        Reproducible noise for experiments. Without it (the default) the noise comes from a
        cryptographically secure generator; a seeded release is marked ``secure=False``.
    classes : sequence, optional
        The public list of classes (default: the labels present in ``y``).
    bounds, norm_bound : optional
        The public bound on the features, validated once as a :class:`~klrelease.domain.Domain`:
        a box ``bounds=(lower, upper)``, a ball ``norm_bound=B`` (on ``||x||_2``), or a
        ``Domain`` given as ``bounds``; not both. ``bounds`` may also name a mechanism's own
        way of choosing them, passed on as its option ``bounds``
        (``"features"``: under label-flip adjacency, the box spanned by the public features).
    client : distributed.Client, optional
        Run the passes over a Dask collection on this cluster (default: Dask's current
        scheduler). Workers see only the data and the per-row maps, never noise.
    accountant : BudgetAccountant, optional
        The data owner's budget across releases: the release is refused (before any noise is
        drawn) if its claim is not certified or would exceed the total, and spent otherwise,
        before any noise is drawn. An attempt that fails before the generator draws anything
        released nothing and is not charged; once noise is drawn the budget stays spent
        whatever happens (a FAIL output included).
    **options
        Mechanism options, validated against ``get_mechanism(name).Options`` (list them with
        ``klrelease mechanisms NAME``).

    Returns
    -------
    Release
        The artifact; ``release.gmm`` is the released :class:`~klrelease.gmm.GMM` and
        ``release.privacy`` states the claim and whether it is certified. A seeded release is
        never certified.

    Warns
    -----
    PrivacyLeakWarning
        Whenever the release is not certified (an uncertified mechanism or options, or a seed).
    """
    src = make_rng(seed)  # a bad seed is an input error: before anything is computed
    data, p, opts = _design(X, y, epsilon, delta, mechanism, classes, bounds, norm_bound,
                            options, client)
    g = p.guarantee if src.secure else p.guarantee.seeded()
    privacy, randomness = _blocks(g, src)
    if accountant is not None:
        accountant.spend(g)  # charged before any noise, in the call that checks it
    untouched = _generator_state(src.generator)
    try:
        gmm = p.draw(src.generator)
    except MechanismFailed as exc:
        # FAIL is an output of the mechanism (its proof covers it): it spends the budget and
        # comes back as an artifact of public content, attached to the exception
        exc.result = FailDocument(
            schema_version=SCHEMA_VERSION, library_version=__version__,
            python_version=platform.python_version(), mechanism=p.mechanism, status="FAIL",
            stage=exc.stage, reason=exc.reason,
            feature_names=list(data.feature_names), privacy=privacy,
            options=p.public_options, settings=opts.as_dict(), randomness=randomness,
        ).model_dump(mode="json", exclude={"learner", "diagnostics", "signature"})
        raise
    except BaseException:
        # an attempt that failed before drawing any noise released nothing: not charged
        # (once the generator has moved, noise was drawn and the budget stays spent)
        if accountant is not None and _generator_state(src.generator) == untouched:
            accountant.cancel(g)
        raise
    finally:
        if not g.certified:
            warn_privacy(f"{p.mechanism}: {g.statement}")
    solver = None
    if p.solver is not None:
        solver = SolverBlock(solver=p.solver.solver, status=p.solver.status,
                             time_s=round(p.solver.time, 4), n_solves=p.solver.n_solves)
    options = {**p.public_options, **p.notes}
    out = Release(
        mechanism=p.mechanism, gmm=gmm, feature_names=list(data.feature_names),
        privacy=privacy, options=options, settings=opts.as_dict(), solver=solver,
        randomness=randomness,
    )
    log.info("released %s", out.summary())
    return out


def _generator_state(gen: np.random.Generator) -> bytes:
    """The generator's state, comparable: it changes with every number drawn."""
    return pickle.dumps(gen.bit_generator.state)


def _blocks(g, src) -> tuple[PrivacyBlock, RandomnessBlock]:
    """The privacy and randomness blocks of a release or FAIL document."""
    privacy = PrivacyBlock(epsilon=g.epsilon, delta=g.delta, neighbouring=g.neighbouring,
                           certified=g.certified, statement=g.statement,
                           reasons=list(g.reasons), accounting=g.accounting)
    note = ("noise from a ChaCha20 CSPRNG keyed by the operating system" if src.secure else
            "seeded generator: reproducible, for experiments only; not a secure release")
    return privacy, RandomnessBlock(secure=src.secure, seed=src.seed, note=note)


def expected_kl(p: Plan, reference, *, n_draws: int = 100, seed=None) -> KLEstimate:
    """Monte Carlo estimate of E[KL(release || reference)] over the mechanism's randomness.

    ``reference`` is the non-private GMM (:func:`klrelease.fit_gmm`).
    """
    rng = make_rng(seed).generator if not isinstance(seed, np.random.Generator) else seed
    return monte_carlo_kl(lambda: p.draw(rng), reference, n_draws)
