"""The result of a privacy audit, as a versioned pydantic model.

An :class:`AuditReport` is meant for the data owner who ran the audit. It names neighbouring
datasets by row index and class labels (never by feature values or statistics), but row indices
and labels are still facts about the data: do not publish a report of private data.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .._version import __version__

__all__ = [
    "AUDIT_SCHEMA_VERSION",
    "Bound",
    "DirectionResult",
    "PairResult",
    "AuditReport",
    "AUDIT_LIMITS",
]

AUDIT_SCHEMA_VERSION = "1"

#: What an audit cannot establish; copied into every report.
AUDIT_LIMITS = (
    "An audit can refute a privacy claim, not prove it: a violation is declared only when the "
    "lower confidence bound of delta(eps) exceeds the claimed delta, while a Monte Carlo upper "
    "bound from n draws cannot go below about 1/n, far above a typical claimed delta such as "
    "1e-5.",
    "Only the neighbouring datasets listed as examined were checked; a worse neighbour, or a "
    "worse dataset, may exist.",
    "Densities are evaluated in floating point on idealised real-valued noise: attacks on the "
    "floating-point representation of the released values (Mironov 2012) and timing or other "
    "side channels are not covered.",
    "The figures are for the output densities the mechanism reports; a bug that makes a "
    "mechanism's sampler disagree with its own density is only detected where it produces "
    "outputs the density calls impossible.",
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Bound(_Model):
    """delta(eps) for one component (or the joint output) and one direction."""

    estimate: float = Field(description="Monte Carlo mean, or the exact value")
    lower: float = Field(description="one-sided lower confidence bound (= estimate if exact)")
    upper: float = Field(description="one-sided upper confidence bound (= estimate if exact)")
    exact: bool = False
    n_samples: int = 0
    support_mismatch: float = Field(
        0.0, description="probability of outputs impossible under the other dataset"
    )


class DirectionResult(_Model):
    """Estimates for outputs drawn from one dataset and compared with the other."""

    direction: str = Field(description="'D vs D\\'' (draws from D) or 'D\\' vs D'")
    joint: Bound
    components: dict[str, Bound]
    exact_components: dict[str, Bound] = Field(
        default_factory=dict,
        description="components whose delta was computed exactly by enumeration",
    )
    inconsistent_draws: int = Field(
        0, description="draws that the sampling plan's own density calls impossible"
    )
    loss_q99: float | None = Field(
        None, description="99th percentile of the joint privacy loss L over the draws "
        "(null: +inf, a support mismatch); compare with epsilon"
    )
    loss_max: float | None = Field(
        None, description="largest joint privacy loss over the draws (null: +inf)"
    )


class PairResult(_Model):
    """One neighbouring pair (D, D')."""

    description: str
    row: int | None = None
    stage: str = Field(description="'screen' (few draws, ranking only) or 'confirm'")
    directions: list[DirectionResult]
    worst_lower: float = Field(description="largest lower bound over directions (joint/exact)")
    worst_estimate: float = Field(description="largest estimate over directions (joint/exact)")
    leaking_components: list[str] = Field(
        default_factory=list,
        description="components whose lower bound exceeds the claimed delta",
    )


class AuditReport(_Model):
    """What an audit of one mechanism on one dataset found."""

    schema_version: str = AUDIT_SCHEMA_VERSION
    library_version: str = __version__
    mechanism: str
    certified_claim: bool = Field(description="whether the mechanism calls its release certified")
    epsilon: float
    delta: float
    neighbouring: str
    n_rows: int
    n_features: int
    n_classes: int
    neighbours_total: int | None = Field(
        description="number of neighbours of the dataset under the relation (None: infinite)"
    )
    pairs_examined: int
    pairs_refused: int = Field(
        0, description="neighbours on which the mechanism refused to run (not audited)"
    )
    refusal_reasons: list[str] = Field(default_factory=list)
    search: str = Field(description="how the examined neighbours were chosen")
    n_samples: int = Field(description="draws per direction for confirmed pairs")
    n_screen: int = Field(description="draws per direction for screening every pair")
    confidence: float
    confidence_note: str
    seed: int | None
    violation: bool
    verdict: str
    worst_pair: PairResult | None
    leaking_components: list[str]
    confirmed_pairs: list[PairResult]
    screen_summary: dict[str, float] = Field(
        default_factory=dict, description="max / median of screening estimates over pairs"
    )
    time_s: float
    time_limit: float | None = None
    stopped_by_time_limit: bool = Field(
        False, description="whether the time limit cut screening or confirmation draws short"
    )
    limits: list[str] = Field(default_factory=lambda: list(AUDIT_LIMITS))
    note: str = (
        "Audit report of a private dataset: it names rows by index and label; do not publish."
    )

    def to_json(self, indent: int = 2) -> str:
        """Serialise to JSON."""
        return self.model_dump_json(indent=indent)

    @classmethod
    def from_json(cls, text: str) -> AuditReport:
        """Read a report back from :meth:`to_json` output."""
        return cls.model_validate_json(text)
