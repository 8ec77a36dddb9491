"""``"public-total"``: every class the public features' own mean and covariance, only the class
weights from the labels (certified, label flip only; the simplest valid design at small
budgets).

Mechanism. Under label flip the features are public, so their mean and covariance are known
exactly; only the labels are private. Every label is reported by randomized response (kept
with probability ``p = e^eps / (e^eps + K - 1)``, otherwise one of the other ``K - 1``
declared classes uniformly at random; :mod:`klrelease.privacy.response`), the reported class
counts are debiased with the known transition matrix, and the released GMM gives every class
the same Gaussian, the features' mean and covariance (eigenvalues floored at ``1e-6`` in the
standardised features), with weights the debiased counts projected onto the simplex (each at
least ``1 / (2 max(N, K))``): :func:`~.randomized_response.moments_model` of the debiased
counts, zero sums and the features' scatter.

It ignores what the labels say about the features, so it does not converge to the labelled fit
as epsilon grows: it is the comparison point a release should beat where its class statistics
are mostly noise (small epsilon, small classes, classes that overlap), and a floor on what a
release of class-conditional Gaussians can lose there.

Privacy map (proof). The released value is the vector of reported labels, exactly that of
``randomized-response`` (:mod:`.randomized_response`, whose proof applies word for word):
(eps, 0)-DP, hence (eps, delta)-DP for every delta >= 0, under label flip, with the
``dp_accounting`` event ``RandomizedResponseDpEvent(K q, K)``. Everything after the reported
labels (the debiased counts, the features' mean and covariance, the projection and the floor)
is post-processing of the reports and the public features. Not available on Dask sources (the
workers would hold the noise key); with classes read from the labels instead of declared,
which classes occur is not protected: such a release warns and is not certified. The
reports' exact likelihood ratio over neighbouring labels is checked in
``tests/test_response.py`` (for the sampler every response release calls), the release by
the project's audit there too; ``tests/test_public_total.py`` checks the output against
this description.
"""

from __future__ import annotations

import numpy as np

from ...data import LabelledData
from ...gmm import GMM
from ...privacy.response import ReportedMoments, debiased_moments
from ..base import last_resort
from ..registry import register
from ..response import ResponsePlan, response_plan
from .randomized_response import PlainResponse, moments_model, standardised_frame

__all__ = ["PublicTotal"]


@register
class PublicTotal(PlainResponse):
    """Every class the public features' mean and covariance, weights by randomized response
    on the labels; certified (label flip)."""

    name = "public-total"
    summary = ("every class the public features' mean and covariance, weights from "
               "randomized response on the labels (label flip; pure eps-DP); certified "
               "baseline")
    proof = "klrelease/mechanisms/baselines/public_total.py"

    def plan(self, data: LabelledData, *, epsilon: float, delta: float,
             **options) -> ResponsePlan:
        guarantee, public = self.response_inputs(data, epsilon, delta)
        K, d = len(data.classes), data.n_features
        frame, N, C = standardised_frame(data, self.name, covariance=True)
        classes = data.classes

        def model(n: np.ndarray) -> GMM:
            """The GMM of (debiased) class counts ``n``: every class the features' own."""
            dof = np.maximum(n, 2.0) - 1.0  # moments_model divides the scatter by this
            return moments_model(n, np.zeros((K, d)), dof[:, None, None] * C[None],
                                 n_samples=N, frame=frame, classes=classes)

        def estimate(m: ReportedMoments) -> GMM:
            return last_resort(lambda: model(debiased_moments(m, K, epsilon)[0]), K, d,
                               classes)

        def public_model() -> GMM:
            return last_resort(lambda: model(np.full(K, N / K)), K, d, classes)

        return response_plan(data, name=self.name, epsilon=epsilon, frame=frame,
                             estimate=estimate, guarantee=guarantee, public=public,
                             fallback=public_model)
