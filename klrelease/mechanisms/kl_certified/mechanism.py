"""``"kl-certified"``: the KL-minimising release with a proven (eps, delta) guarantee.

The release is one Gaussian mechanism applied in three adaptive stages (design in
:mod:`.design`, proof in ``kl_certified.md`` next to this file):

A. the class counts, and the class sums of the rows in a public frame clipped to a ball of
   public radius (rough class centres);
B. replace-one only: the pooled scatter of the rows about the released centres (under label
   flip the total scatter of the public features is used instead);
C. per class, the sums and second moments of the rows in a class region (an ellipsoid around
   the released centre, shaped by the released pooled covariance), with the class's share of
   the budget split between means and covariances to minimise a KL surrogate.

Every stage's whitened sensitivity is a public constant whatever was released before, so the
release is ``mu``-GDP with ``mu^2`` the sum of the squares, i.e. (eps, delta)-DP on the exact
Gaussian curve. The design of each stage is a function of public inputs and released values
only; the GMM is formed from the released values by post-processing.

Neighbouring relations: ``label-flip`` (default: the datasets differ in the label of one
record; the features are public) and ``replace-one`` (one record, features and label, is
replaced; needs a public bound: a box ``bounds=`` or a ball ``norm_bound=``). The set of
classes is public only when the caller declares it (``classes=``); read from the labels it
would reveal which classes occur, so such a release warns and is not certified.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import Field

from ..._threads import blas_single_thread
from ...data import LabelledData
from ...domain import Domain
from ...gmm import GMM
from ...neighbours import ADJACENCY_DESCRIPTIONS, Adjacency
from ...privacy.guarantee import GaussianCurve
from ...statistics import affine_rows, clip_to_norm
from ...warnings_ import warn_privacy
from ..base import Float, Guarantee, Mechanism, MechanismOptions, Plan
from ..registry import register
from .design import (
    SETTINGS,
    Budget,
    Frame,
    PublicInputs,
    centres,
    estimate,
    gaussian_logpdf,
    region_radius,
    released_weights,
    stage_c_design,
    symmetric_gaussian,
    symmetric_gaussian_logpdf,
)

__all__ = ["KLCertified", "KLCertifiedPlan", "public_frame"]

ADJACENCIES = (Adjacency.LABEL_FLIP, Adjacency.REPLACE_ONE)


class KLCertifiedOptions(MechanismOptions):
    """Options of ``kl-certified``."""

    norm_bound: Annotated[Float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None, description="replace-one: public bound on ||x||_2 (a ball; rows clipped to it)")
    bounds_from_data: bool = Field(
        False, description="replace-one without a public bound: read the box from the data "
        "(voids the guarantee); unused under label flip, where the features are public")


ASSUMPTIONS = (
    "N, d and the declared set of classes are public (both relations keep N fixed).",
    "Noise is sampled in floating point; the proof treats the samplers as exact (real "
    "arithmetic), like every floating-point implementation of these mechanisms.",
)


def whitening_frame(centre: np.ndarray, C: np.ndarray) -> Frame:
    """The label-flip frame of features with mean ``centre`` and covariance ``C``.

    Standardise each feature, then whiten the correlations (eigenvalues floored at 1e-12 of
    the largest): a change of units of a feature leaves the frame's rows unchanged, any affine
    map rotates them. A constant feature has no spread to standardise by: its scale is 1e-12
    of the largest spread, or, when every feature is constant, its own magnitude (1 at 0).
    """
    sd = np.sqrt(np.maximum(np.diag(C), 0.0))
    if np.isfinite(sd.max()) and sd.max() > 0:
        sd = np.maximum(sd, 1e-12 * sd.max())
    else:  # every feature constant (public under label flip)
        mag = np.abs(np.asarray(centre, dtype=float))
        sd = np.where(np.isfinite(mag) & (mag > 0), mag, 1.0)
    Rc = C / np.outer(sd, sd)
    w, V = np.linalg.eigh(0.5 * (Rc + Rc.T))
    w = np.maximum(w, 1e-12 * max(w.max(), 1e-300))
    W = (V / np.sqrt(w)) @ V.T / sd[:, None]
    W_inv = sd[None, :] * ((V * np.sqrt(w)) @ V.T)
    return Frame(centre, W, W_inv)


def bound_frame(domain: Domain):
    """The replace-one frame of a public box or ball, and the map clipping frame rows into it.
    """
    if domain.kind == "box":
        h = domain.half_widths
        return Frame(domain.centre, np.diag(1.0 / h), np.diag(h)), _clip_box
    d = domain.d
    s = np.sqrt(d) / domain.radius
    return Frame(np.zeros(d), s * np.eye(d), np.eye(d) / s), _ClipBall(float(np.sqrt(d)))


def _clip_box(T: np.ndarray) -> np.ndarray:
    return np.clip(T, -1.0, 1.0)


@dataclass(frozen=True)
class _ClipBall:
    radius: float

    def __call__(self, T: np.ndarray) -> np.ndarray:
        return clip_to_norm(T, self.radius)


def public_frame(data: LabelledData, relation: Adjacency, bounds_from_data: bool,
                 norm_bound) -> tuple[Frame, np.ndarray, bool, str]:
    """The public frame of a release, the rows in it, whether it keeps the guarantee, and
    a description of where it comes from.

    Label flip: the features are public, so the frame whitens them (centre their mean, scale
    the inverse square root of their covariance, eigenvalues floored at 1e-12 of the largest).
    Replace-one: the frame comes from the public bound (box to ``[-1, 1]^d``, ball of radius
    ``B`` to radius ``sqrt(d)``) and rows are clipped into it; ``bounds_from_data=True`` reads
    the box from the data instead, which voids the guarantee (warned).
    """
    X = data.X
    d = data.n_features
    if relation == Adjacency.LABEL_FLIP:
        centre = X.mean(axis=0)
        C = np.atleast_2d(np.cov(X, rowvar=False)) if X.shape[0] > 1 else np.zeros((d, d))
        frame = whitening_frame(centre, C)
        return frame, frame.to_frame(X), True, "the public features (whitened)"
    domain = _public_bound(data.domain, norm_bound, bounds_from_data, d)
    certified, where = True, "the public bound"
    if domain is None:
        _warn_bounds_from_data()
        lo, hi = X.min(axis=0), X.max(axis=0)
        span = np.maximum(hi - lo, 1e-12 * np.maximum(1.0, np.abs(lo) + np.abs(hi)))
        domain = Domain("box", d, lo, lo + span, source="features")
        certified, where = False, "the private data (bounds_from_data=True)"
    frame, clip = bound_frame(domain)
    return frame, clip(frame.to_frame(X)), certified, where


def _public_bound(domain, norm_bound, bounds_from_data, d):
    """The public domain of a replace-one release: the data's, or the ball of the option
    ``norm_bound``; ``None`` when the box is to be read from the data."""
    if norm_bound is not None:
        if domain is not None and domain.kind == "box":
            raise ValueError("give either bounds= (a box) or norm_bound= (a ball), not both")
        domain = Domain.ball(norm_bound, d)
    if domain is None and not bounds_from_data:
        raise ValueError(
            "kl-certified under replace-one needs a public bound on the features: pass "
            "bounds=(lower, upper) or norm_bound=B (rows are clipped to it); "
            "bounds_from_data=True reads them from the data and voids the guarantee"
        )
    return domain


def _warn_bounds_from_data():
    warn_privacy(
        "kl-certified: the feature bounds are read from the private data "
        "(bounds_from_data=True); under replace-one this leaks information and the release "
        "is NOT differentially private")


class _MemoryRows:
    """The rows in the frame, grouped by class, in memory (the fast path)."""

    def __init__(self, rows: list):
        self.rows = rows

    def stats(self, fn, d: int) -> tuple[np.ndarray, np.ndarray]:
        """Per class k: the sum and second moment of ``fn(T_k, k)``."""
        K = len(self.rows)
        S1, S2 = np.zeros((K, d)), np.zeros((K, d, d))
        for k, T in enumerate(self.rows):
            if T.shape[0]:
                U = fn(T, k)
                S1[k], S2[k] = U.sum(axis=0), U.T @ U
        return S1, S2


@dataclass(frozen=True)
class _InFrame:
    """``fn(to_frame(X), k)``: a per-class map of raw rows (plain data, shipped to workers)."""

    fn: object
    frame: Frame
    clip: object = None

    def __call__(self, X: np.ndarray, k: int) -> np.ndarray:
        T = self.frame.to_frame(X)
        return self.fn(T if self.clip is None else self.clip(T), k)


class _StreamRows:
    """The rows of a chunked source, mapped into the frame chunk by chunk (one pass per call).
    """

    def __init__(self, source, frame: Frame, clip=None):
        self.source, self.frame, self.clip = source, frame, clip

    def stats(self, fn, d: int) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(fn, _RegionClip) and self.clip is None:
            f = self.frame
            fn = _FusedRegionClip(f.centre + fn.centres @ f.W_inv, f.W @ fn.W, fn.radius)
        else:
            fn = _InFrame(fn, self.frame, self.clip)
        return self.source.bounded_moments(fn)[1:]


@dataclass(frozen=True)
class _FrameClip:
    """Stage A's map of raw rows: ``clip_R(to_frame(x))`` (the bound's clip first, if any)."""

    frame: Frame
    clip: object
    radius: float

    def __call__(self, X: np.ndarray) -> np.ndarray:
        T = self.frame.to_frame(X)
        return clip_to_norm(T if self.clip is None else self.clip(T), self.radius)


@dataclass(frozen=True)
class _FusedRegionClip:
    """Stage C's map of raw rows without a bound's clip: ``clip_r((x - a_k) V_k)`` with
    ``a_k = centre + c_k W^-1`` and ``V_k = W W_k``, i.e. ``clip_r((to_frame(x) - c_k) W_k)``
    in one matrix product."""

    offsets: np.ndarray
    V: np.ndarray
    radius: float

    def __call__(self, X: np.ndarray, k: int) -> np.ndarray:
        return clip_to_norm(affine_rows(X, self.offsets[k], self.V[k]), self.radius)


@dataclass(frozen=True)
class _CentredClip:
    """Stage B's map: ``clip_R(t - m[k])``."""

    centres: np.ndarray
    radius: float

    def __call__(self, T: np.ndarray, k: int) -> np.ndarray:
        return clip_to_norm(T - self.centres[k], self.radius)


@dataclass(frozen=True)
class _RegionClip:
    """Stage C's map: ``clip_r((t - c_k) W_k)``."""

    centres: np.ndarray
    W: np.ndarray
    radius: float

    def __call__(self, T: np.ndarray, k: int) -> np.ndarray:
        return clip_to_norm((T - self.centres[k]) @ self.W[k], self.radius)



def sample_radius(frame: Frame, sample: np.ndarray) -> float:
    """Label flip: the stage-A radius, the ``radius_quantile`` of the frame norms of the row
    sample (:mod:`klrelease.stream.sample`: every row when N <= 65536)."""
    T = frame.to_frame(sample)
    R = float(np.sqrt(np.quantile(np.einsum("ij,ij->i", T, T), SETTINGS["radius_quantile"])))
    return R if np.isfinite(R) and R > 0 else 1.0  # every row at the centre: any radius will do


def stream_inputs(source, relation: Adjacency, bounds_from_data: bool, norm_bound):
    """Passes over a chunked source for everything the plan needs before noise is drawn.

    Returns ``(frame, rows, N, R, total_scatter, sums, counts, total_sums, where)``. Label
    flip: pass 1 reads the features only: their count, mean and covariance (the frame) and
    the row sample that gives the radius R; pass 2 is stage A, which validates every row and
    label before any noise is drawn. Replace-one: stage A only.
    """
    d = source.n_features
    source.resolve_classes()
    if relation == Adjacency.LABEL_FLIP:
        m0, sample = source.pooled_and_sample()
        N, mean, M2 = int(round(m0.counts[0])), m0.means[0], m0.scatters[0]
        C = M2 / (N - 1) if N > 1 else np.zeros((d, d))
        frame = whitening_frame(mean, C)
        clip, where = None, "the public features (whitened)"
        R = sample_radius(frame, sample)
        total_scatter = frame.W.T @ M2 @ frame.W
    else:
        if bounds_from_data:
            raise ValueError("bounds_from_data=True needs the data in memory; give a public "
                             "bound (bounds= or norm_bound=) for streamed data")
        domain = _public_bound(source.domain, norm_bound, False, d)
        frame, clip = bound_frame(domain)
        where, total_scatter = "the public bound", None
        R = float(SETTINGS["box_radius"] * np.sqrt(d))
    counts, sums, total = source.sums(_FrameClip(frame, clip, R))
    return (frame, _StreamRows(source, frame, clip), int(round(counts.sum())), R,
            total_scatter, sums, counts, total, where)


def _source_errors() -> tuple[type[BaseException], ...]:
    """What a chunked source raises when it cannot be read: :class:`SourceReadError` (I/O, a
    chunk that no longer validates) and, on a Dask cluster that lost its workers,
    KilledWorker. Nothing else: a numerical error in a pass is a defect and raises."""
    import sys

    from ...stream.sources import SourceReadError

    errors: list[type[BaseException]] = [SourceReadError]
    if "distributed" in sys.modules:
        errors.append(sys.modules["distributed"].KilledWorker)
    return tuple(errors)


@dataclass
class KLCertifiedPlan(Plan):
    """The output law of ``kl-certified`` on one dataset (holds private values: never publish).

    Raw outputs are dicts of released arrays: ``counts`` (K,), ``sums`` (K, d), ``scatter``
    (d, d; replace-one), ``class_sums`` (K, d) and ``class_scatter`` (K, d, d) in the class
    regions' coordinates (zero, and not noised, for a class whose second moments the design
    does not release).
    """

    public: PublicInputs = None
    rows: object = None  # private: the rows in the public frame (_MemoryRows, _StreamRows)
    counts: np.ndarray = None  # private
    sums: np.ndarray = None  # private stage-A sums
    fallbacks: int = 0  # draws post-processed by the stage-A fallback

    @property
    def notes(self) -> dict[str, str]:
        # a function of released values (or of a failed read, see _read)
        return {"fallback": "the cruder stage-A estimate was released"} if self.fallbacks else {}

    # ----------------------------------------------------------------- private statistics
    def _stage_b(self, m1: np.ndarray) -> np.ndarray:
        d = self.public.n_features
        S2 = self.rows.stats(_CentredClip(np.asarray(m1, dtype=float), self.public.radius),
                             d)[1]
        return S2.sum(axis=0)

    def _stage_c(self, design: dict) -> tuple[np.ndarray, np.ndarray]:
        pub, reg = self.public, design["regions"]
        return self.rows.stats(_RegionClip(np.asarray(reg.centres), np.asarray(reg.W),
                                           pub.region_radius), pub.n_features)

    def _read(self, stage, arg):
        """A pass over the rows after noise was drawn. A chunked source that fails to read
        then (an I/O error, a lost worker, a file changed during the release: a row that no
        longer validates) must not fail the release: ``None`` makes it the post-processing of
        stage A alone (see :meth:`finalize`). Any other exception is a defect and raises."""
        try:
            return stage(arg)
        except _source_errors():
            if isinstance(self.rows, _MemoryRows):
                raise
            return None

    # --------------------------------------------------------------------------- the law
    @blas_single_thread
    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        pub = self.public
        K, d = pub.n_classes, pub.n_features
        out = {
            "counts": self.counts + rng.standard_normal(K) * pub.count_sd,
            "sums": self.sums + rng.standard_normal((K, d)) * pub.sums_sd,
        }
        stage_a = {"counts": out["counts"], "sums": out["sums"]}
        if not pub.label_flip:
            m1 = centres(pub, out["counts"], out["sums"])[1]
            S_B = self._read(self._stage_b, m1)
            if S_B is None:
                return stage_a
            out["scatter"] = S_B + symmetric_gaussian(rng, np.asarray(pub.scatter_sd), d)
        design = stage_c_design(pub, out)
        stats = self._read(self._stage_c, design)
        if stats is None:
            return stage_a
        S1, S2 = stats
        noise = design["noise"]
        out["class_sums"] = S1 + rng.standard_normal((K, d)) * noise.mean_sd[:, None]
        released = np.isfinite(noise.cov_sd)
        E = symmetric_gaussian(rng, np.where(released, noise.cov_sd, 1.0), d)
        out["class_scatter"] = np.where(released[:, None, None], S2 + E, 0.0)
        return out

    @blas_single_thread
    def log_density(self, output: dict[str, np.ndarray]) -> dict[str, float]:
        pub = self.public
        counts = np.asarray(output["counts"], dtype=float)
        sums = np.asarray(output["sums"], dtype=float)
        lw = gaussian_logpdf(counts - self.counts, pub.count_sd)
        lm = gaussian_logpdf(sums - self.sums, pub.sums_sd)
        lc = 0.0
        if not pub.label_flip:
            m1 = centres(pub, counts, sums)[1]
            E = np.asarray(output["scatter"], dtype=float) - self._stage_b(m1)
            lc += float(symmetric_gaussian_logpdf(E, pub.scatter_sd))
        design = stage_c_design(pub, output)
        S1, S2 = self._stage_c(design)
        noise = design["noise"]
        dev = np.asarray(output["class_sums"], dtype=float) - S1
        lm += gaussian_logpdf(dev, noise.mean_sd[:, None])
        cs = np.asarray(output["class_scatter"], dtype=float)
        for k in range(pub.n_classes):
            if np.isfinite(noise.cov_sd[k]):
                lc += float(symmetric_gaussian_logpdf(cs[k] - S2[k], noise.cov_sd[k]))
            elif np.any(cs[k] != 0):
                lc = -np.inf
        return {"weights": lw, "means": lm, "covariances": lc}

    @blas_single_thread
    def finalize(self, output: dict[str, np.ndarray]) -> GMM:
        if "class_sums" not in output:  # the source failed after stage A (see sample)
            self.fallbacks += 1
            return _fallback_gmm(self.public, output, self.classes)
        from ...artifact import _check_gmm

        try:
            w, m, c = estimate(self.public, output)
            return _check_gmm(GMM(w, m, c, self.classes))  # what the artifact will require
        except (ValueError, np.linalg.LinAlgError, FloatingPointError):
            # Never fail after noise was drawn: a cruder post-processing of the same released
            # values (stage-A centres, the frame's unit covariance) keeps the release valid.
            self.fallbacks += 1
            return _fallback_gmm(self.public, output, self.classes)


def _fallback_gmm(pub: PublicInputs, output: dict, classes) -> GMM:
    N, K, d = pub.n_samples, pub.n_classes, pub.n_features
    counts = np.nan_to_num(np.asarray(output["counts"], dtype=float))
    sums = np.nan_to_num(np.asarray(output["sums"], dtype=float))
    _, m1, _ = centres(pub, counts, sums)
    m1 = clip_to_norm(np.nan_to_num(m1), pub.radius)
    w = released_weights(counts, N, K)
    covs = np.broadcast_to(pub.frame.cov_to_raw(np.eye(d)), (K, d, d)).copy()
    return GMM(w, pub.frame.mean_to_raw(m1), covs, classes)


@register
class KLCertified(Mechanism):
    """KL-minimising design on public inputs and released statistics (certified)."""

    name = "kl-certified"
    min_class_size = 0  # never refuse on private class sizes
    summary = ("KL-minimising design from public inputs and released statistics; certified "
               "(eps, delta)-DP (recommended)")
    Options = KLCertifiedOptions
    relations = ADJACENCIES
    certified_relations = ADJACENCIES
    #: Reads a chunked source (:mod:`klrelease.stream`): it needs only per-class statistics.
    streams = True

    def certifies(self, options, public) -> bool:
        """Certified when the classes were declared and the frame is public (not read from
        the private rows under replace-one)."""
        return bool(public.get("classes_declared")) and not public.get("frame_from_data")

    def public_guarantee(self, *, epsilon, delta, options, n_samples, n_classes, n_features):
        """The claim of a release with declared classes (and, under replace-one, a public
        bound): one Gaussian mechanism whose ``mu`` depends on epsilon, delta and the relation
        only (``Budget.split``), so it is known before the data is read."""
        relation = Adjacency(options.adjacency)
        budget = Budget.split(epsilon, delta, SETTINGS[relation.value])
        return Guarantee(
            epsilon=epsilon, delta=delta, neighbouring=relation.value, certified=True,
            statement=(f"({epsilon:g}, {delta:g})-differentially private under {relation.value}"
                       " adjacency with declared classes. Proven in "
                       "klrelease/mechanisms/kl_certified/kl_certified.md."),
            reasons=ASSUMPTIONS, accounting=budget.describe(), curve=GaussianCurve(budget.mu),
        )

    @blas_single_thread
    def plan(self, data: LabelledData, *, epsilon: float, delta: float,
             **options) -> KLCertifiedPlan:
        # options: validated by Mechanism.plan (names, types, relation)
        relation = Adjacency(options["adjacency"])
        from ...stream import Source

        lf = relation == Adjacency.LABEL_FLIP
        shares = SETTINGS[relation.value]
        extra = {}
        if isinstance(data, Source):  # streamed: passes over chunks, bounded memory
            frame, rows, N, R, total_scatter, sums, counts, total, where = stream_inputs(
                data, relation, bool(options["bounds_from_data"]), options["norm_bound"])
            K, d, bound_ok, classes = len(data.classes), data.n_features, True, data.classes
            total_sums = total if lf else None
            extra = {"data": "streamed in chunks"}
        else:
            frame, T, bound_ok, where = public_frame(
                data, relation, bool(options["bounds_from_data"]), options["norm_bound"])
            N, K, d, classes = data.n_samples, data.n_classes, data.n_features, data.classes
            if lf:
                from ...stream.sample import sample_rows

                R = sample_radius(frame, sample_rows(data.X))
            else:
                R = float(SETTINGS["box_radius"] * np.sqrt(d))
            from ...statistics import class_blocks

            # public totals from the rows in their own order: bit for bit the same function
            # of the features whatever the labels (sorted rows would round by label)
            A = clip_to_norm(T, R)
            total_scatter = T.T @ T if lf else None
            total_sums = A.sum(axis=0) if lf else None
            order, bounds = class_blocks(data.codes, K)
            blocks = [slice(bounds[k], bounds[k + 1]) for k in range(K)]
            T, A = np.take(T, order, axis=0), np.take(A, order, axis=0)
            rows = _MemoryRows([T[b] for b in blocks])
            counts = np.diff(bounds).astype(float)
            sums = np.stack([A[b].sum(axis=0) for b in blocks])
        pub = PublicInputs(
            relation=relation.value, n_samples=N, n_classes=K, n_features=d, frame=frame,
            budget=Budget.split(epsilon, delta, shares), radius=R,
            region_radius=region_radius(d, SETTINGS["region_level"]),
            total_scatter=total_scatter, total_sums=total_sums,
        )

        rel = ADJACENCY_DESCRIPTIONS[relation]
        declared = bool(getattr(data, "classes_declared", False))
        reasons = list(ASSUMPTIONS)
        certified = bound_ok and declared
        if not declared:
            warn_privacy(
                "kl-certified: the set of classes was read from the labels (pass classes= to "
                "declare it); which classes occur is then not protected and the release is NOT "
                "certified")
            reasons.insert(0, "The set of classes was read from the private labels, not "
                              "declared: a class with one record can reveal that record's "
                              "label.")
        if not bound_ok:
            reasons.insert(0, "The clipping bound is computed from the private rows; a "
                              "changed record can change the bound and so every released "
                              "value.")
        if certified:
            statement = (
                f"({epsilon:g}, {delta:g})-differentially private for neighbouring datasets "
                f"that {rel.split(';')[0].replace('datasets ', '')}; frame and clipping from "
                f"{where}. Proven in klrelease/mechanisms/kl_certified/kl_certified.md."
            )
        else:
            statement = ("NOT differentially private as released: "
                         + " ".join(reasons[: 2 - int(declared) - int(bound_ok)]))
        guarantee = Guarantee(
            epsilon=epsilon, delta=delta, neighbouring=relation.value, certified=certified,
            statement=statement, reasons=tuple(reasons), accounting=pub.budget.describe(),
            curve=GaussianCurve(pub.budget.mu),
        )
        public = {
            "adjacency": relation.value,
            "adjacency_meaning": rel,
            "frame": where,
            "budget": {"mu": pub.budget.mu, "counts": pub.budget.counts,
                       "sums": pub.budget.sums, "scatter": pub.budget.scatter,
                       "classes": pub.budget.classes},
            "classes_declared": declared,
            "frame_from_data": not bound_ok,
            **extra,
        }
        return KLCertifiedPlan(
            mechanism=self.name, guarantee=guarantee, classes=classes,
            public_options=public, solver=None, public=pub, rows=rows, counts=counts,
            sums=sums,
        )
