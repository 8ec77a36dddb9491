"""The output law of randomized response on labels (label flip), shared by the mechanisms that
release it: ``randomized-response`` (the plain baseline) and ``kl-certified`` (one of its
designs). They differ only in how the released labels become a GMM (post-processing).

The released value is the vector of reported labels (:mod:`klrelease.privacy.response`, pure
eps-DP under label flip). In memory it is kept whole (its exact log-probability is what the
audit compares); from a chunked source each chunk's labels are drawn and reduced at once to the
reported class moments (:class:`~klrelease.privacy.response.ReportedMoments`), a function of
the labels and the public features only, and never stored. Each chunk's randomness is a
ChaCha20 stream keyed by the release's generator and placed by the chunk's first row, so
chunks read on different workers never share noise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._threads import blas_single_thread
from ..gmm import GMM
from ..neighbours import ADJACENCY_DESCRIPTIONS, Adjacency
from ..privacy.guarantee import PureCurve
from ..privacy.response import ReportedMoments, respond, response_dp_event, response_logpmf
from ..warnings_ import warn_privacy
from .base import Guarantee, Plan

__all__ = ["ResponsePlan", "MOMENT_KEYS", "response_guarantee", "response_plan", "quiet"]

#: The raw output of a streamed release: the reported moments, one array each.
MOMENT_KEYS = tuple(f"reported_{a}" for a in ReportedMoments.__slots__)


@dataclass(frozen=True)
class _ChunkResponse:
    """One chunk: reported labels from a keyed stream, reduced to reported moments."""

    key: int
    n_classes: int
    epsilon: float
    frame: object  # maps raw rows to the public frame (``to_frame``)

    def __call__(self, X: np.ndarray, codes: np.ndarray, offset: int) -> ReportedMoments:
        import randomgen

        gen = np.random.Generator(randomgen.ChaCha(key=self.key, counter=int(offset) << 64,
                                                   rounds=20))
        z = respond(codes, self.n_classes, self.epsilon, gen)
        return ReportedMoments.of(self.frame.to_frame(X), z, self.n_classes)


def _add(a, b):
    return b if a is None else a + b


def _source_errors() -> tuple[type[BaseException], ...]:
    """What a chunked source raises when it cannot be read (I/O, a changed file, a lost Dask
    worker); nothing else is caught."""
    import sys

    from ..stream.sources import SourceReadError

    errors: list[type[BaseException]] = [SourceReadError]
    if "distributed" in sys.modules:
        errors.append(sys.modules["distributed"].KilledWorker)
    return tuple(errors)


def quiet(fn):
    """Run ``fn`` with numpy's floating-point warnings off: whether a computation on private
    values overflows must not show as a warning (a side channel outside the release); the
    results are checked for finiteness where it matters."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return wrapper


@dataclass
class ResponsePlan(Plan):
    """Randomized response on one dataset's labels (holds private values: never publish).

    ``rows`` are the public features in a public frame (in memory) or ``source`` a chunked
    source read through ``frame``; ``codes`` the private labels (in memory);
    ``estimate(moments)`` turns the reported moments into the released GMM.
    """

    epsilon: float = 0.0
    n_classes: int = 0
    n_features: int = 0
    rows: np.ndarray | None = None
    codes: np.ndarray | None = None
    source: object = None
    frame: object = None
    estimate: Callable[[ReportedMoments], GMM] | None = None
    #: the model of public values alone, released if a chunked source fails mid-pass
    fallback: Callable[[], GMM] | None = None
    fallbacks: int = 0

    @property
    def notes(self) -> dict[str, str]:
        return ({"fallback": "the source failed while the labels were drawn: the model of "
                             "the public features alone was released"} if self.fallbacks
                else {})

    @quiet
    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        if self.source is None:
            return {"reported": respond(self.codes, self.n_classes, self.epsilon, rng)}
        key = int.from_bytes(rng.bytes(32), "little")
        try:
            m = self.source.scan(_ChunkResponse(key, self.n_classes, self.epsilon,
                                                self.frame), _add, None, indexed=True)
        except _source_errors():
            # labels were already drawn: never fail, release the public model (finalize)
            return {}
        return {k: getattr(m, a) for k, a in zip(MOMENT_KEYS, ReportedMoments.__slots__,
                                                  strict=True)}

    @quiet
    def moments(self, output: dict[str, np.ndarray]) -> ReportedMoments:
        """The reported moments of a raw output (post-processing)."""
        if "reported" in output:
            return ReportedMoments.of(self.rows, output["reported"], self.n_classes)
        return ReportedMoments(*(np.asarray(output[k], dtype=float) for k in MOMENT_KEYS))

    def log_density(self, output: dict[str, np.ndarray]) -> dict[str, float]:
        if "reported" not in output:
            raise ValueError("the exact density of a streamed release is not kept (only its "
                             "reported moments); audit the data in memory")
        return {"weights": response_logpmf(output["reported"], self.codes, self.n_classes,
                                           self.epsilon),
                "means": 0.0, "covariances": 0.0}

    @blas_single_thread(width=lambda self, output: self.n_features)  # d x d work
    @quiet
    def finalize(self, output: dict[str, np.ndarray]) -> GMM:
        if not output:  # the source failed during the pass (see sample)
            self.fallbacks += 1
            return self.fallback()
        return self.estimate(self.moments(output))


def response_guarantee(name: str, epsilon: float, delta: float, n_classes: int,
                       declared: bool, proof: str, *, what: str = "randomized response on the "
                       "labels", buckets: int | None = None) -> Guarantee:
    """The claim of a randomized-response release (pure eps-DP under label flip). Its curve is
    ``buckets``-ary randomized response's (default K): ``buckets=2``, binary randomized
    response, dominates every pure eps-DP mechanism."""
    rel = ADJACENCY_DESCRIPTIONS[Adjacency.LABEL_FLIP]
    if declared:
        statement = (f"({epsilon:g}, 0)-differentially private (pure DP, hence "
                     f"({epsilon:g}, {delta:g})) for neighbouring datasets that "
                     f"{rel.split(';')[0].replace('datasets ', '')}: {what}, the features "
                     f"public. Proven in {proof}.")
        reasons = ("N, d, the features and the declared set of classes are public.",)
    else:
        warn_privacy(f"{name}: the set of classes was read from the labels (pass classes= to "
                     "declare it); which classes occur is then not protected and the release "
                     "is NOT certified")
        statement = ("NOT differentially private as released: the set of classes was read "
                     "from the private labels, not declared.")
        reasons = ("The set of classes was read from the private labels, not declared: a "
                   "class with one record can reveal that record's label.",)
    return Guarantee(epsilon=epsilon, delta=delta, neighbouring=Adjacency.LABEL_FLIP.value,
                     certified=declared, statement=statement, reasons=reasons,
                     accounting=f"{what}, each label randomised once: pure epsilon-DP",
                     curve=PureCurve(epsilon, response_dp_event(
                         epsilon, n_classes if buckets is None else buckets)))


def response_plan(data, *, name: str, epsilon: float, frame, estimate,
                  guarantee: Guarantee, public: dict, fallback=None,
                  rows: np.ndarray | None = None) -> ResponsePlan:
    """A :class:`~klrelease.mechanisms.response.ResponsePlan` on in-memory or streamed data
    (``rows``: in memory, ``frame.to_frame(data.X)`` when the caller has it already)."""
    from ..stream import Source

    K = len(data.classes)
    if isinstance(data, Source):
        return ResponsePlan(mechanism=name, guarantee=guarantee, classes=data.classes,
                            public_options={**public, "data": "streamed in chunks"},
                            epsilon=epsilon, n_classes=K, n_features=data.n_features,
                            source=data, frame=frame, estimate=estimate, fallback=fallback)
    return ResponsePlan(mechanism=name, guarantee=guarantee, classes=data.classes,
                        public_options=public, epsilon=epsilon, n_classes=K,
                        n_features=data.n_features,
                        rows=frame.to_frame(data.X) if rows is None else rows,
                        codes=data.codes, estimate=estimate)
