"""``"randomized-response"``: randomized response on the labels, then unbiased class moments
(certified, label flip only; the simplest valid design a reviewer would write).

Mechanism. Every label is kept with probability ``p = e^eps / (e^eps + K - 1)`` and otherwise
replaced by one of the other ``K - 1`` declared classes uniformly at random, independently per
row (:mod:`klrelease.privacy.response`). The features are public under label flip, so the
class counts, sums and scatters of the reported labels are debiased with the known transition
matrix, ``S_k = (C_k - q sum_j C_j) / (p - q)``, and turned into a GMM: weights projected onto
the simplex (every weight at least ``1 / (2 max(N, K))``), means ``S1_k / n_k`` with
``n_k >= 2``, covariances ``(S2_k - n_k m_k m_k^T) / (n_k - 1)`` with their eigenvalues floored
at ``1e-6`` in the standardised features (each feature divided by its public standard
deviation). No clipping, no bound.

Privacy map (proof). Neighbouring datasets differ in the label of one record; the features
and N are public, and so is the declared set of K classes. The reported labels of all other
records have the same distribution under both datasets; the changed record's reported label
has probability ``p`` or ``q`` for each class under either, so every output's probability
changes by a factor at most ``p / q = e^eps``. The release is (eps, 0)-DP, hence
(eps, delta)-DP for every delta >= 0, under label flip. Everything after the reported labels
(the debiasing, the projections, the standardisation from the public features) is
post-processing. Its ``dp_accounting`` event is ``RandomizedResponseDpEvent(K q, K)``
(:func:`~klrelease.privacy.response.response_dp_event`); ``BudgetAccountant`` composes it
exactly with other releases (``dp_accounting``'s PLD under REPLACE_ONE gives the same). The
sampler rounds the chance of changing a label up, never down, and runs at eps = 30 above that
(more private): see ``klrelease/privacy/response.py``. Not available on Dask sources (the
workers would hold the noise key); a chunked source's labels are validated before any noise. The
test ``tests/test_response.py`` checks the output law against the claim (exact likelihood
ratio over neighbours and the project's audit). With classes read from the labels instead of
declared, which classes occur is not protected: such a release warns and is not certified.
"""

from __future__ import annotations

import numpy as np

from ...data import LabelledData
from ...domain import check_scales
from ...gmm import GMM
from ...neighbours import ADJACENCY_DESCRIPTIONS, Adjacency
from ...privacy.guarantee import PureCurve
from ...privacy.projections import project_simplex
from ...privacy.response import ReportedMoments, debiased_moments, response_dp_event
from ..base import Guarantee, Mechanism, MechanismOptions, last_resort
from ..registry import register
from ..response import ResponsePlan, response_guarantee, response_plan

__all__ = ["LabelResponse", "PlainResponse", "RandomizedResponse", "Standardised",
           "moments_model", "plain_estimate"]

#: Covariance eigenvalues are at least this, in the standardised features.
EIGEN_FLOOR = 1e-6


class Standardised:
    """The public standardising frame of the features: ``t = (x - mean) / sd`` per feature
    (label flip: the features are public)."""

    def __init__(self, mean: np.ndarray, sd: np.ndarray):
        sd = np.asarray(sd, dtype=float)
        top = float(np.max(sd)) if sd.size and np.isfinite(np.max(sd)) else 0.0
        self.mean = np.asarray(mean, dtype=float)
        # each feature's own scale, whatever the others' (equivariance: a feature in units
        # 1e-9 beside one in 1e9 keeps its scale); a constant feature takes 1e-12 of the
        # largest scale, or 1 when every feature is constant
        self.sd = np.where((sd > 0) & np.isfinite(sd), sd, max(1e-12 * top, 1e-300)) \
            if top > 0 else np.ones_like(sd)

    def to_frame(self, X: np.ndarray) -> np.ndarray:
        return (np.asarray(X, dtype=float) - self.mean) / self.sd


def plain_estimate(m: ReportedMoments, *, epsilon: float, n_classes: int, n_samples: int,
                   frame: Standardised, classes: tuple) -> GMM:
    """The baseline's GMM from the reported moments (post-processing, see the module)."""
    n, S1, S2, _ = debiased_moments(m, int(n_classes), epsilon)
    return moments_model(n, S1, S2, n_samples=n_samples, frame=frame, classes=classes)


def moments_model(n: np.ndarray, S1: np.ndarray, S2: np.ndarray, *, n_samples: int,
                  frame: Standardised, classes: tuple) -> GMM:
    """A GMM from estimated class counts ``(K,)``, sums ``(K, d)`` and scatters ``(K, d, d)``
    of the rows in the standardised frame: weights projected onto the simplex (each at least
    ``1 / (2 max(N, K))``), means ``S1_k / n_k`` with ``n_k >= 2``, covariances
    ``(S2_k - n_k m_k m_k^T) / (n_k - 1)`` with their eigenvalues floored at
    :data:`EIGEN_FLOOR`, mapped back to raw units (post-processing)."""
    K = n.shape[0]
    w = project_simplex(np.nan_to_num(n) / n_samples, floor=0.5 / max(n_samples, K))
    nn = np.maximum(n, 2.0)
    mu = S1 / nn[:, None]
    C = (S2 - nn[:, None, None] * np.einsum("ki,kj->kij", mu, mu)) / (nn - 1.0)[:, None, None]
    C = 0.5 * (C + np.swapaxes(C, -1, -2))
    vals, vecs = np.linalg.eigh(C)
    C = (vecs * np.maximum(vals, EIGEN_FLOOR)[:, None, :]) @ np.swapaxes(vecs, -1, -2)
    sd = frame.sd
    covs = C * np.outer(sd, sd)[None]
    return GMM(w, frame.mean + mu * sd, 0.5 * (covs + np.swapaxes(covs, -1, -2)), classes)


def standardised_frame(data, name: str = "randomized-response", covariance: bool = False):
    """The public standardising frame and N (one pass over the features of a source, which
    also validates every label before any noise), its scales checked (:func:`check_scales`);
    with ``covariance``, also the features' covariance in the frame (``(frame, N, C)``)."""
    from ...stream import Source

    C = None
    if isinstance(data, Source):
        m0, _ = data.pooled_and_sample(size=1, check_labels=True)
    elif covariance:  # the streamed path's one pass over the rows, in memory
        from ..._threads import row_threads
        from ...stream.moments import pooled_moments

        with np.errstate(all="ignore"):
            m0, lo, hi = pooled_moments(data.X, extremes=True, threads=row_threads())
            check_scales(np.maximum(hi, -lo) if data.n_samples else np.zeros(data.n_features),
                         f"{name}: the features' magnitudes")
    if isinstance(data, Source) or covariance:
        N = int(round(m0.counts[0]))
        C = m0.scatters[0] / max(N - 1, 1)
        mean, sd = m0.means[0], np.sqrt(np.maximum(np.diag(C), 0.0))
    else:
        X = data.X
        N = data.n_samples
        with np.errstate(all="ignore"):
            check_scales(np.max(np.abs(X), axis=0) if N else np.zeros(X.shape[1]),
                         f"{name}: the features' magnitudes")
            mean = X.mean(axis=0)
            sd = X.std(axis=0, ddof=1) if N > 1 else np.zeros(X.shape[1])
    check_scales(sd, f"{name}: the features' standard deviations")
    frame = Standardised(mean, sd)
    if not covariance:
        return frame, N
    with np.errstate(all="ignore"):
        C = np.nan_to_num(C / np.outer(frame.sd, frame.sd))
    return frame, N, 0.5 * (C + C.T)


class LabelResponse(Mechanism):
    """What the mechanisms that randomise labels share: label flip only (the features are
    public, so no box), nothing refused on class sizes, certified when the classes are
    declared."""

    relations = (Adjacency.LABEL_FLIP,)
    certified_relations = (Adjacency.LABEL_FLIP,)
    uses_box = False
    bound_under_label_flip = False
    min_class_size = 0

    def certifies(self, options, public) -> bool:
        return bool(public.get("classes_declared"))


class PlainResponse(LabelResponse):
    """What the one-stage randomized-response releases share (every label reported once, from
    a source in chunks too): their claim and the inputs of their plan. ``proof``: the module
    whose docstring proves the claim."""

    Options = MechanismOptions
    streams = True
    proof = ""

    def public_guarantee(self, *, epsilon, delta, options, n_samples, n_classes, n_features):
        """The claim from public inputs alone (before any data is read)."""
        return Guarantee(epsilon=epsilon, delta=delta,
                         neighbouring=Adjacency.LABEL_FLIP.value, certified=True,
                         statement="randomized response on the labels (pure epsilon-DP)",
                         curve=PureCurve(epsilon, response_dp_event(epsilon, n_classes)))

    def response_inputs(self, data, epsilon: float, delta: float):
        """``(guarantee, public options)`` of a plan, the classes of a source resolved (a Dask
        source refused: its workers would hold the noise key)."""
        from ...stream import Source

        if isinstance(data, Source):
            from ...stream.sources import DaskSource

            if isinstance(data, DaskSource):
                raise ValueError(f"{self.name} draws every label's noise where the rows are "
                                 "read, and on a Dask cluster the workers would hold its key: "
                                 "read the data with another source")
            data.resolve_classes()
        declared = bool(getattr(data, "classes_declared", False))
        guarantee = response_guarantee(self.name, epsilon, delta, len(data.classes), declared,
                                       self.proof)
        public = {"adjacency": Adjacency.LABEL_FLIP.value,
                  "adjacency_meaning": ADJACENCY_DESCRIPTIONS[Adjacency.LABEL_FLIP],
                  "classes_declared": declared}
        return guarantee, public


@register
class RandomizedResponse(PlainResponse):
    """Randomized response on the labels, debiased class moments; certified (label flip)."""

    name = "randomized-response"
    summary = ("randomized response on the labels, debiased class moments (label flip; pure "
               "eps-DP); certified baseline")
    proof = "klrelease/mechanisms/baselines/randomized_response.py"

    def plan(self, data: LabelledData, *, epsilon: float, delta: float,
             **options) -> ResponsePlan:
        guarantee, public = self.response_inputs(data, epsilon, delta)
        K, d = len(data.classes), data.n_features
        frame, N = standardised_frame(data)
        classes = data.classes

        def estimate(m: ReportedMoments) -> GMM:
            return last_resort(lambda: plain_estimate(m, epsilon=epsilon, n_classes=K,
                                                      n_samples=N, frame=frame,
                                                      classes=classes), K, d, classes)

        def public_model() -> GMM:
            covs = np.broadcast_to(np.diag(frame.sd**2), (K, d, d)).copy()
            return last_resort(lambda: GMM(np.full(K, 1.0 / K), np.broadcast_to(
                frame.mean, (K, d)).copy(), covs, classes), K, d, classes)

        return response_plan(data, name=self.name, epsilon=epsilon, frame=frame,
                             estimate=estimate, guarantee=guarantee, public=public,
                             fallback=public_model)

