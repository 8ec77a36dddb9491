"""The release artifact: a versioned, validated JSON document (pydantic).

It holds the released GMM, the privacy claim in words a data owner can act on, the public
options, which solver ran, the library version and how the randomness was seeded. It holds no
exact statistic of the private data: no true counts, means or covariances, no design values
computed from them (noise covariances, Wishart scales, objective values).
"""

from __future__ import annotations

import platform
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, WithJsonSchema

from ._version import __version__
from .gmm import GMM

__all__ = ["Release", "PrivacyBlock", "SolverBlock", "RandomnessBlock", "SCHEMA_VERSION"]

SCHEMA_VERSION = "1.0"


def _gmm_from_any(value: Any) -> GMM:
    if isinstance(value, GMM):
        return value
    if isinstance(value, dict):
        try:
            return GMM(
                np.asarray(value["weights"], dtype=float),
                np.asarray(value["means"], dtype=float),
                np.asarray(value["covariances"], dtype=float),
                tuple(value.get("classes") or ()),
            )
        except KeyError as exc:
            raise ValueError(f"gmm is missing {exc.args[0]!r}") from None
    raise ValueError("gmm must be a GMM or a mapping with weights, means, covariances")


def _gmm_to_dict(g: GMM) -> dict:
    return {
        "classes": list(g.classes),
        "weights": g.weights.tolist(),
        "means": g.means.tolist(),
        "covariances": g.covariances.tolist(),
    }


_GMM_SCHEMA = {
    "type": "object",
    "properties": {
        "classes": {"type": "array"},
        "weights": {"type": "array", "items": {"type": "number"}},
        "means": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        "covariances": {
            "type": "array",
            "items": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
        },
    },
    "required": ["weights", "means", "covariances"],
}

GMMField = Annotated[
    GMM,
    BeforeValidator(_gmm_from_any),
    PlainSerializer(_gmm_to_dict, return_type=dict),
    WithJsonSchema(_GMM_SCHEMA),
]


class PrivacyBlock(BaseModel):
    """The privacy claim of a release."""

    model_config = ConfigDict(frozen=True)

    epsilon: float
    delta: float
    neighbouring: str = Field(description="the neighbouring relation the claim is about")
    certified: bool = Field(description="true only if the guarantee is proven and audited")
    statement: str
    reasons: list[str] = Field(default_factory=list)
    accounting: str = ""


class SolverBlock(BaseModel):
    """Which SDP backend designed the noise, and how it ended."""

    model_config = ConfigDict(frozen=True)

    solver: str
    status: str
    time_s: float
    n_solves: int


class RandomnessBlock(BaseModel):
    """How the noise was drawn."""

    model_config = ConfigDict(frozen=True)

    secure: bool = Field(description="true when drawn from a CSPRNG (unseeded release)")
    seed: int | None = None
    note: str = ""


class Release(BaseModel):
    """A differentially private (or, where stated, uncertified) GMM release."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    schema_version: str = SCHEMA_VERSION
    library_version: str = __version__
    python_version: str = Field(default_factory=platform.python_version)
    mechanism: str
    gmm: GMMField
    feature_names: list[str] = Field(default_factory=list)
    privacy: PrivacyBlock
    options: dict[str, Any] = Field(default_factory=dict)
    solver: SolverBlock | None = None
    randomness: RandomnessBlock

    def to_json(self, *, indent: int | None = 2) -> str:
        """The artifact as a JSON string."""
        return self.model_dump_json(indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> Release:
        """Read an artifact written by :meth:`to_json` (checks the schema version)."""
        from pydantic import ValidationError

        try:
            obj = cls.model_validate_json(text)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ())) or "document"
            raise ValueError(
                f"not a valid klrelease artifact ({where}: {first.get('msg', 'invalid')})"
            ) from None
        if obj.schema_version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise ValueError(
                f"artifact schema {obj.schema_version} is not readable by this version "
                f"(schema {SCHEMA_VERSION})"
            )
        return obj

    def save(self, path) -> None:
        """Write the artifact to ``path``."""
        from pathlib import Path

        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path) -> Release:
        """Read an artifact from ``path``."""
        from pathlib import Path

        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {path}: {exc.__class__.__name__}") from None
        return cls.from_json(text)

    def summary(self) -> str:
        """A short human-readable description."""
        p = self.privacy
        cert = "certified" if p.certified else "NOT certified"
        g = self.gmm
        return (
            f"{self.mechanism}: K={g.n_components} classes, d={g.n_features} features, "
            f"epsilon={p.epsilon:g}, delta={p.delta:g}, {p.neighbouring} adjacency, {cert}"
        )
