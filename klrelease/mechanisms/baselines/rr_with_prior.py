"""``"rr-with-prior"``: randomized response with a prior learned from a first released stage,
then class moments debiased within each row's reporting set (certified, label flip only).

Mechanism. The rows are split at random, independently of the data: each row joins the first
stage with probability ``stage_share``. Every first-stage label is reported by K-ary randomized
response at eps (:func:`klrelease.privacy.response.respond`). From those reports and the
public features a prior over the classes is built for every second-stage row: the debiased
first-stage class moments give a GMM, whose posterior at the row is mixed with the uniform
distribution so that its average confidence matches an estimate of the accuracy of its top
class. That estimate scores the models of two halves of the first stage (split by position)
on the other half's reports, debiased (unbiased for those half-sample models, which are a
little less accurate than the model of the whole stage; the prior therefore errs toward
doubt). A row whose posterior is not finite gets the uniform prior. Every second-stage label
is then reported by randomized response with that prior at eps (Ghazi et al. 2021,
RRWithPrior; :func:`klrelease.privacy.response.respond_with_prior`): within the set of its k
most likely classes, k chosen to maximise the chance the report is right. A confident prior
shrinks the set and with it the noise; a label outside its set is reported as a class of the
set chosen uniformly at random, which carries no information about it.

Estimate. Every row's class indicators are debiased within its set
(:func:`~klrelease.privacy.response.prior_response_weights`; K-ary randomized response's
for the first stage) and the weighted class counts, sums and scatters of the standardised
features become a GMM as in ``randomized-response``
(:func:`~klrelease.mechanisms.baselines.randomized_response.moments_model`). The estimate is
unbiased but for the rows whose label fell outside their set, which count toward the set's
classes: a row whose set is one class counts as the prior's top class whatever its label
(at small eps most second-stage rows can be such rows, and the estimate then leans on the
first stage's model). As eps grows every set holds all K classes (the uniform part of the
prior is at least ``MIN_UNIFORM``), the reports become the labels and the release the
non-private fit.

Privacy map (proof). Neighbouring datasets differ in the label of one record; the features,
N and the declared set of K classes are public. The output is the split ``s`` and the
reported labels ``z``. Its probability factorises as ``P(s) prod_{i in stage 1} R(z_i | y_i)
prod_{i in stage 2} R_{prior_i}(z_i | y_i)``, where ``prior_i`` is a function of ``s``, the
first stage's reports and the public features only. ``P(s)`` does not depend on the labels.
The changed record appears in exactly one factor, with every other factor (including the
priors, which do not read any second-stage label) the same under both datasets. That factor
is K-ary randomized response (ratio at most ``p / q = e^eps``) or randomized response with a
prior, whose output probabilities under any label are ``a_k``, ``b_k`` or ``1 / k`` and
never differ by more than a factor ``e^eps`` (:mod:`klrelease.privacy.response`). Hence the
release is (eps, 0)-DP, and (eps, delta)-DP for every delta >= 0, under label flip. The
estimate is post-processing. Each label is randomised once at eps, so the two stages compose
in parallel, not by adding their budgets. The ``dp_accounting`` event is binary randomized
response at eps (``response_dp_event(eps, 2)``), whose privacy-loss distribution dominates
every pure eps-DP mechanism's. Both samplers round the chance of changing a label up and run
at ``EPS_MAX`` above it (more private). In memory only (the prior needs the first stage's
reports before the second stage is drawn). ``tests/test_rr_with_prior.py`` checks the exact
likelihood ratio over every single-label change and runs the project's audit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from ...data import LabelledData
from ...gmm import GMM
from ...neighbours import ADJACENCY_DESCRIPTIONS, Adjacency
from ...privacy.guarantee import PureCurve
from ...privacy.response import (
    prior_response_logpmf,
    prior_response_weights,
    prior_sets,
    respond,
    respond_with_prior,
    response_dp_event,
    response_logpmf,
    response_probabilities,
)
from ..base import Guarantee, MechanismOptions, Plan, last_resort
from ..registry import register
from ..response import quiet, response_guarantee
from .randomized_response import (
    LabelResponse,
    Standardised,
    moments_model,
    standardised_frame,
)

__all__ = ["RRWithPrior", "RRWithPriorOptions", "MIN_UNIFORM"]

#: The prior's smallest uniform part: every class keeps prior mass at least this over K, so
#: every set holds all K classes once e^eps exceeds about K / MIN_UNIFORM.
MIN_UNIFORM = 1e-3


class RRWithPriorOptions(MechanismOptions):
    """Options of ``rr-with-prior``."""

    stage_share: float = Field(0.3, gt=0.0, lt=1.0, strict=False,
                               description="the chance that a row joins the first stage, "
                               "whose reports build the second stage's prior")


def _weights(reported: np.ndarray, K: int, epsilon: float) -> np.ndarray:
    """K-ary randomized response's debiased class indicators (N, K)."""
    N = reported.shape[0]
    return prior_response_weights(reported, np.broadcast_to(np.arange(K), (N, K)),
                                  np.full(N, K), epsilon, K)


def _moments(W: np.ndarray, T: np.ndarray):
    """Weighted class counts, sums and scatters of the rows ``T`` (one product per class)."""
    S2 = np.empty((W.shape[1], T.shape[1], T.shape[1]))
    for k in range(W.shape[1]):
        np.matmul((T * W[:, k:k + 1]).T, T, out=S2[k])
    return W.sum(axis=0), W.T @ T, S2


@dataclass
class RRWithPriorPlan(Plan):
    """Randomized response with a prior on one dataset's labels (holds private values: never
    publish)."""

    epsilon: float = 0.0
    n_classes: int = 0
    share: float = 0.0  # the first stage's share (the mechanism's option)
    rows: np.ndarray | None = None  # the public features, standardised
    codes: np.ndarray | None = None  # the private labels
    frame: Standardised | None = None
    #: priors already built, by the released values they were built from (``sample``,
    #: ``finalize`` and ``log_density`` of one output build it once, and identically)
    _priors: dict = field(default_factory=dict, repr=False)

    def _unit(self) -> Standardised:
        d = self.rows.shape[1]
        return Standardised(np.zeros(d), np.ones(d))

    def _model(self, W: np.ndarray, T: np.ndarray) -> GMM:
        n, S1, S2 = _moments(W, T)
        return moments_model(n, S1, S2, n_samples=T.shape[0], frame=self._unit(),
                             classes=tuple(range(self.n_classes)))

    def prior(self, first: np.ndarray, reported: np.ndarray) -> np.ndarray:
        """The second stage's prior (rows not in ``first``), from the first stage's reports
        and the public features only (post-processing); uniform if it cannot be built."""
        first = np.asarray(first, dtype=bool)
        key = hashlib.sha256(np.packbits(first).tobytes()
                             + np.ascontiguousarray(reported[first], dtype=np.int64).tobytes()
                             ).hexdigest()
        if key not in self._priors:
            if len(self._priors) >= 4:
                self._priors.pop(next(iter(self._priors)))
            self._priors[key] = self._build_prior(first, reported)
        return self._priors[key]

    @quiet
    def _build_prior(self, first: np.ndarray, reported: np.ndarray) -> np.ndarray:
        K, T = self.n_classes, self.rows
        later = T[~first]
        uniform = np.full((later.shape[0], K), 1.0 / K)
        idx = np.flatnonzero(first)
        if idx.size < 4 or later.shape[0] == 0:
            return uniform
        try:
            z, Tf = reported[idx], T[idx]
            W = _weights(z, K, self.epsilon)
            P = self._model(W, Tf).predict_proba(later)
            p, q = response_probabilities(self.epsilon, K)
            halves = np.arange(idx.size) % 2 == 0  # by position: no data read
            right = []
            for h in (halves, ~halves):
                top = self._model(W[h], Tf[h]).predict_proba(Tf[~h]).argmax(axis=1)
                right.append(((z[~h] == top) - q) / (p - q))
            accuracy = float(np.clip(np.mean(np.concatenate(right)), 1.0 / K, 1.0))
            confidence = float(P.max(axis=1).mean())
            gap = confidence - 1.0 / K
            mix = (confidence - accuracy) / gap if gap > 0 else 1.0
            mix = float(np.clip(mix, MIN_UNIFORM, 1.0)) if np.isfinite(mix) else 1.0
            P = (1.0 - mix) * P + mix / K
            bad = ~np.all(np.isfinite(P), axis=1)
            P[bad] = uniform[bad]  # only the rows whose posterior is not finite
            return P
        except Exception:  # a function of released values only: any failure is public
            return uniform

    def _sets(self, output) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        first = np.asarray(output["stage"]).astype(bool)
        order, k = prior_sets(self.prior(first, np.asarray(output["reported"])), self.epsilon)
        return first, order, k

    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        N, K, eps = self.codes.shape[0], self.n_classes, self.epsilon
        first = rng.random(N) < self.share
        z = np.empty(N, dtype=np.int64)
        z[first] = respond(self.codes[first], K, eps, rng)
        order, k = prior_sets(self.prior(first, z), eps)
        z[~first] = respond_with_prior(self.codes[~first], order, k, eps, rng)
        return {"stage": first.astype(np.int8), "reported": z}

    def log_density(self, output: dict[str, np.ndarray]) -> dict[str, float]:
        first, order, k = self._sets(output)
        z = np.asarray(output["reported"], dtype=np.int64)
        split = (np.count_nonzero(first) * np.log(self.share)
                 + np.count_nonzero(~first) * np.log1p(-self.share))
        return {"weights": float(split + response_logpmf(z[first], self.codes[first],
                                                         self.n_classes, self.epsilon)
                                 + prior_response_logpmf(z[~first], self.codes[~first],
                                                         order, k, self.epsilon)),
                "means": 0.0, "covariances": 0.0}

    def set_sizes(self, output: dict[str, np.ndarray]) -> np.ndarray:
        """The second stage's set sizes of an output (post-processing)."""
        return self._sets(output)[2]

    @quiet
    def finalize(self, output: dict[str, np.ndarray]) -> GMM:
        K, d = self.n_classes, self.rows.shape[1]

        def model() -> GMM:
            first, order, k = self._sets(output)
            z = np.asarray(output["reported"], dtype=np.int64)
            W = np.empty((z.shape[0], K))
            W[first] = _weights(z[first], K, self.epsilon)
            W[~first] = prior_response_weights(z[~first], order, k, self.epsilon, K)
            n, S1, S2 = _moments(W, self.rows)
            return moments_model(n, S1, S2, n_samples=z.shape[0], frame=self.frame,
                                 classes=self.classes)

        return last_resort(model, K, d, self.classes)


@register
class RRWithPrior(LabelResponse):
    """Randomized response with a prior from a first released stage; certified (label flip)."""

    name = "rr-with-prior"
    summary = ("randomized response with a prior learned from a first stage of reports, "
               "class moments debiased per row (label flip; pure eps-DP); certified baseline")
    Options = RRWithPriorOptions

    def public_guarantee(self, *, epsilon, delta, options, n_samples, n_classes, n_features):
        """The claim from public inputs alone (before any data is read)."""
        return Guarantee(epsilon=epsilon, delta=delta,
                         neighbouring=Adjacency.LABEL_FLIP.value, certified=True,
                         statement="randomized response with a prior on the labels (pure "
                                   "epsilon-DP)",
                         curve=PureCurve(epsilon, response_dp_event(epsilon, 2)))

    def plan(self, data: LabelledData, *, epsilon: float, delta: float, stage_share: float,
             **options) -> RRWithPriorPlan:
        from ...stream import Source

        if isinstance(data, Source):
            raise ValueError(f"{self.name} needs the data in memory: its second stage's prior "
                             "is built from the first stage's reports before the second "
                             "stage is drawn")
        declared = bool(getattr(data, "classes_declared", False))
        K = len(data.classes)
        if K < 2:
            raise ValueError(f"{self.name} needs at least two declared classes")
        guarantee = response_guarantee(
            self.name, epsilon, delta, K, declared,
            "klrelease/mechanisms/baselines/rr_with_prior.py",
            what="randomized response with a prior from a first stage of reports on the "
                 "labels", buckets=2)
        frame, _ = standardised_frame(data, self.name)
        public = {"adjacency": Adjacency.LABEL_FLIP.value,
                  "adjacency_meaning": ADJACENCY_DESCRIPTIONS[Adjacency.LABEL_FLIP],
                  "classes_declared": declared, "stage_share": stage_share}
        return RRWithPriorPlan(mechanism=self.name, guarantee=guarantee, classes=data.classes,
                               public_options=public, epsilon=float(epsilon), n_classes=K,
                               share=float(stage_share), rows=frame.to_frame(data.X),
                               codes=np.asarray(data.codes, dtype=np.int64), frame=frame)
