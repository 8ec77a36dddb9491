"""The release artifact: a versioned, validated JSON document (pydantic).

It holds the released GMM, the privacy claim in words a data owner can act on, the public
options, which solver ran, the library version and how the randomness was seeded. It holds no
exact statistic of the private data: no true counts, means or covariances, no design values
computed from them (noise covariances, Wishart scales, objective values).

An artifact is validated when it is built or loaded: unknown fields are rejected; the weights
lie on the simplex and every covariance is symmetric positive definite; epsilon > 0 and
0 <= delta < 1 (0 for a pure-DP claim); the feature names match the dimension; the mechanism is
registered and its settings (the validated options) are valid. The ``certified`` flag is not
trusted: it is recomputed from the mechanism, its settings and how the noise was drawn (a
seeded release is never certified), and an artifact whose flag disagrees is refused as a
tampered claim. The ``statement`` and ``reasons`` are explanatory text written at release
time; they are shown as stored and not checked: the flag is what decides.

An artifact issued by the release service carries a ``signature`` (Ed25519 over the rest of
the document, :mod:`klrelease.service.signing`). ``Release.from_json(text, public_key=...)``
checks it against a trusted public key before anything else, so that any edit, however
consistent, is caught; artifacts without a signature load as before when no key is given.
"""

from __future__ import annotations

import platform
from typing import Annotated, Any

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    model_validator,
)

from ._io import read_failure
from ._version import SCHEMA_VERSION, __version__
from .gmm import GMM, check_gmm
from .neighbours import Adjacency

__all__ = ["Release", "FailDocument", "LearnerRelease", "PrivacyBlock", "LearnerPrivacyBlock",
           "SolverBlock", "RandomnessBlock", "SignatureBlock", "SCHEMA_VERSION", "read_document",
           "load_model", "learner_document"]


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


#: the checks an artifact makes of its model (kept in :mod:`klrelease.gmm`)
_check_gmm = check_gmm


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
    AfterValidator(_check_gmm),
    PlainSerializer(_gmm_to_dict, return_type=dict),
    WithJsonSchema(_GMM_SCHEMA),
]


class PrivacyBlock(BaseModel):
    """The privacy claim of a release."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epsilon: float = Field(gt=0, allow_inf_nan=False)
    delta: float = Field(ge=0, lt=1, description="0 for a pure-DP claim")
    neighbouring: Adjacency = Field(description="the neighbouring relation the claim is about")
    certified: bool = Field(description="true only if the guarantee is proven and audited")
    statement: str
    reasons: list[str] = Field(default_factory=list)
    accounting: str = ""


class LearnerPrivacyBlock(PrivacyBlock):
    """The privacy claim of an unlabelled-data learner: with the accountant of its ledger."""

    accountant: str | None = None


class SolverBlock(BaseModel):
    """Which SDP backend designed the noise, and how it ended."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    solver: str
    status: str
    time_s: float
    n_solves: int


class RandomnessBlock(BaseModel):
    """How the noise was drawn."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    secure: bool = Field(description="true when drawn from a CSPRNG (unseeded release)")
    seed: int | None = None
    note: str = ""


class SignatureBlock(BaseModel):
    """The issuer's signature of the rest of the document (checked against a trusted key by
    ``from_json(text, public_key=...)``, not on its own)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    algorithm: str
    key_id: str
    value: str


class Release(BaseModel):
    """A differentially private (or, where stated, uncertified) GMM release."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, extra="forbid")

    schema_version: str = SCHEMA_VERSION
    library_version: str = __version__
    python_version: str = Field(default_factory=platform.python_version)
    mechanism: str
    gmm: GMMField
    feature_names: list[str] = Field(default_factory=list)
    privacy: PrivacyBlock
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="the mechanism's public description")
    settings: dict[str, Any] = Field(description="the validated mechanism options")
    solver: SolverBlock | None = None
    randomness: RandomnessBlock
    signature: SignatureBlock | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Release:
        _check_names_and_seed(self)
        _check_claim(self, "artifact")
        return self

    def to_json(self, *, indent: int | None = 2) -> str:
        """The artifact as a JSON string."""
        return self.model_dump_json(indent=indent, exclude=_unsigned(self))

    @classmethod
    def from_json(cls, text: str | bytes, *, public_key=None) -> Release:
        """Read an artifact written by :meth:`to_json` (checks the schema version).

        With ``public_key`` (PEM text, a key object, or the JSON of a service's
        ``GET /v1/key``) the artifact must carry a signature by that key over exactly this
        content: an unsigned, re-signed or edited artifact raises ``ValueError``.
        """
        from pydantic import ValidationError

        doc = _parse(text, public_key)
        version = doc.get("schema_version") if isinstance(doc, dict) else None
        if isinstance(doc, dict) and "pairs_examined" in doc:
            raise ValueError("not a klrelease artifact: an audit report (plain JSON)")
        if version is None:
            raise ValueError("not a klrelease artifact (JSON without a schema_version)")
        if not isinstance(version, str) or version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise ValueError(
                f"artifact schema {version!r} is not readable by this version "
                f"(schema {SCHEMA_VERSION})"
            )
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise ValueError(_invalid("klrelease artifact", exc)) from None

    def save(self, path) -> None:
        """Write the artifact to ``path``."""
        from pathlib import Path

        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path, *, public_key=None) -> Release:
        """Read an artifact from ``path`` (its signature checked with ``public_key``, if
        given)."""
        from pathlib import Path

        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(read_failure(path, exc)) from None
        return cls.from_json(text, public_key=public_key)

    def summary(self) -> str:
        """A short human-readable description."""
        p = self.privacy
        cert = "certified" if p.certified else "NOT certified"
        g = self.gmm
        return (
            f"{self.mechanism}: K={g.n_components} classes, d={g.n_features} features, "
            f"epsilon={p.epsilon:g}, delta={p.delta:g}, {p.neighbouring.value} adjacency, {cert}"
        )


class FailDocument(BaseModel):
    """A FAIL outcome, validated like a release artifact (there is no GMM).

    Written by :func:`klrelease.release` (``klrelease release`` exit 3) when a mechanism
    returns FAIL, or by :func:`klrelease.learn` (``klrelease learn``). It holds the privacy
    block, the stage that failed and the public reason. For a mechanism's FAIL the certified
    flag is recomputed as for a release; for a learner's, a seeded run claiming a guarantee is
    refused.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: str | None = None
    library_version: str | None = None
    python_version: str | None = None
    mechanism: str | None = None
    learner: str | None = None
    status: str = Field(pattern="^FAIL$")
    stage: str | None = None
    reason: str = ""
    feature_names: list[str] = Field(default_factory=list)
    privacy: PrivacyBlock | LearnerPrivacyBlock
    options: dict[str, Any] = Field(default_factory=dict)
    settings: dict[str, Any] = Field(default_factory=dict)
    diagnostics: dict[str, Any] = Field(default_factory=dict)
    randomness: RandomnessBlock
    signature: SignatureBlock | None = None

    @model_validator(mode="after")
    def _consistent(self) -> FailDocument:
        if (self.mechanism is None) == (self.learner is None):
            raise ValueError("a FAIL document names either a mechanism or a learner")
        if self.randomness.secure and self.randomness.seed is not None:
            raise ValueError("randomness: a secure run has no seed")
        if self.learner is not None:
            _check_learner_claim(self, "document")
            return self

        if self.schema_version is None or (self.schema_version.split(".")[0]
                                           != SCHEMA_VERSION.split(".")[0]):
            raise ValueError(f"artifact schema {self.schema_version!r} is not readable by "
                             f"this version (schema {SCHEMA_VERSION})")
        _check_claim(self, "document")
        return self

    @property
    def source(self) -> str:
        """``"mechanism NAME"`` or ``"learner NAME"``."""
        return (f"mechanism {self.mechanism}" if self.mechanism is not None
                else f"learner {self.learner}")


class LearnerRelease(BaseModel):
    """A GMM released by a learner for unlabelled data (:func:`klrelease.learners.learn`).

    The counterpart of :class:`Release` for learners: schema and library versions, the learner,
    the released GMM (components labelled ``0..k-1``), feature names, the privacy claim, the
    learner's public options, its public diagnostics (the worst-path ledger, released noisy
    values) and how the noise was drawn. The certified flag is recomputed from the learner and
    the randomness, and (epsilon, delta) must be the budget its ledger records. Documents
    written before the schema was added (no ``schema_version``) still load.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True, extra="forbid")

    schema_version: str | None = None  # None: written before the schema (still read)
    library_version: str | None = None
    python_version: str | None = None
    learner: str
    status: str = Field(default="ok", pattern="^ok$")
    stage: None = None
    reason: str = ""
    gmm: GMMField
    feature_names: list[str] = Field(default_factory=list)
    privacy: LearnerPrivacyBlock
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="the learner's public options")
    diagnostics: dict[str, Any] = Field(default_factory=dict)
    randomness: RandomnessBlock

    @model_validator(mode="after")
    def _consistent(self) -> LearnerRelease:
        if self.schema_version is not None and (self.schema_version.split(".")[0]
                                                != SCHEMA_VERSION.split(".")[0]):
            raise ValueError(f"artifact schema {self.schema_version!r} is not readable by "
                             f"this version (schema {SCHEMA_VERSION})")
        _check_names_and_seed(self)
        _check_learner_claim(self, "artifact")
        return self

    @property
    def source(self) -> str:
        return f"learner {self.learner}"

    def to_json(self, *, indent: int | None = 2) -> str:
        return self.model_dump_json(indent=indent)

    def summary(self) -> str:
        p = self.privacy
        g = self.gmm
        return (f"{self.learner}: K={g.n_components} components, d={g.n_features} features, "
                f"epsilon={p.epsilon:g}, delta={p.delta:g}, {p.neighbouring.value} adjacency, "
                f"{'certified' if p.certified else 'NOT certified'}")


def _check_names_and_seed(doc) -> None:
    """One feature name per feature; a secure document has no seed."""
    d = doc.gmm.n_features
    if doc.feature_names and len(doc.feature_names) != d:
        raise ValueError(f"feature_names has {len(doc.feature_names)} names for {d} features")
    if doc.randomness.secure and doc.randomness.seed is not None:
        raise ValueError("randomness: a secure release has no seed")


def _recorded_budget(diagnostics: dict) -> tuple[float, float] | None:
    """The (epsilon, delta) a learner's public diagnostics record as its request."""
    req = (diagnostics.get("ledger") or {}).get("requested")
    if isinstance(req, dict) and {"epsilon", "delta"} <= set(req):
        return float(req["epsilon"]), float(req["delta"])
    if {"epsilon_total", "delta_total"} <= set(diagnostics):  # the PPE learners
        return float(diagnostics["epsilon_total"]), float(diagnostics["delta_total"])
    return None


def _check_learner_claim(doc, kind: str) -> None:
    """A learner document's certified flag is that of a registered learner with secure noise;
    its (epsilon, delta) is the budget its ledger records, and the ledger's worst-path total
    stays within it."""
    from .learners import learners as registered
    from .learners.result import resolve_name

    name = resolve_name(doc.learner)
    expected = doc.randomness.secure and name in registered()
    if doc.privacy.certified != expected:
        raise ValueError(
            f"tampered privacy claim: the {kind} says certified={doc.privacy.certified}, but "
            f"learner {doc.learner} with {'secure' if doc.randomness.secure else 'seeded'} "
            f"noise is {'certified' if expected else 'NOT certified'}")
    if doc.privacy.neighbouring != Adjacency.REPLACE_ONE:
        raise ValueError("privacy: the learners' neighbouring relation is replace-one")
    rec = _recorded_budget(doc.diagnostics)
    if rec is not None and not (np.isclose(rec[0], doc.privacy.epsilon, rtol=1e-12, atol=0)
                                and np.isclose(rec[1], doc.privacy.delta, rtol=1e-12, atol=0)):
        raise ValueError(f"tampered privacy claim: the {kind} claims ({doc.privacy.epsilon:g}, "
                         f"{doc.privacy.delta:g}) but its ledger records ({rec[0]:g}, "
                         f"{rec[1]:g})")
    tot = (doc.diagnostics.get("ledger") or {}).get("worst_path_total")
    if isinstance(tot, dict) and rec is not None and (
            tot.get("epsilon", 0.0) > rec[0] * (1 + 1e-9)
            or tot.get("delta", 0.0) > rec[1] * (1 + 1e-9)):
        raise ValueError(f"tampered privacy claim: the {kind}'s ledger total exceeds its "
                         "budget")


def learner_document(result) -> LearnerRelease | FailDocument:
    """A learner's result (:class:`klrelease.learners.LearnResult`) as its validated
    document."""
    doc = result.to_dict()
    return (FailDocument if result.failed else LearnerRelease).model_validate(doc)


def load_model(path, *, public_key=None) -> Release | LearnerRelease:
    """A document that holds a released GMM (a release or a learner's), validated; a FAIL
    document raises ``ValueError`` (it has no model)."""
    doc = read_document(path, public_key=public_key)
    if isinstance(doc, FailDocument):
        raise ValueError(f"{path} is a FAIL document from {doc.source}: it holds no model")
    return doc


def read_document(path, *, public_key=None) -> Release | LearnerRelease | FailDocument:
    """Read a release artifact, a learner's artifact or a FAIL document from ``path``
    (validated; its signature checked with ``public_key``, if given).

    Raises
    ------
    ValueError
        One line: unreadable, not JSON, not a valid document, or (with ``public_key``) not
        signed by that key over exactly this content.
    """
    from pathlib import Path

    from pydantic import ValidationError

    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(read_failure(path, exc)) from None
    doc = _parse(text, public_key)
    if not (isinstance(doc, dict) and doc.get("status") == "FAIL"):
        if isinstance(doc, dict) and "learner" in doc:
            try:
                return LearnerRelease.model_validate(doc)
            except ValidationError as exc:
                raise ValueError(_invalid("learner artifact", exc)) from None
        return Release.from_json(text)
    try:
        return FailDocument.model_validate(doc)
    except ValidationError as exc:
        raise ValueError(_invalid("FAIL document", exc)) from None


def _check_claim(doc, kind: str) -> None:
    """Recompute a release's or FAIL document's certified flag from its mechanism, settings
    and randomness; a claim that differs was tampered with."""
    from .mechanisms import get_mechanism

    mech = get_mechanism(doc.mechanism)
    opts = mech.validate_options(doc.settings)
    if opts.adjacency != doc.privacy.neighbouring:
        raise ValueError("privacy: the neighbouring relation does not match the settings")
    expected = doc.randomness.secure and mech.certifies(opts, doc.options)
    if expected:
        # the claimed (epsilon, delta) must be what the recorded public design gives
        mech.check_claim(epsilon=doc.privacy.epsilon, delta=doc.privacy.delta,
                         public=doc.options)
    if doc.privacy.certified != expected:
        raise ValueError(
            f"tampered privacy claim: the {kind} says certified={doc.privacy.certified}"
            f", but {doc.mechanism} with these settings and "
            f"{'secure' if doc.randomness.secure else 'seeded'} noise is "
            f"{'certified' if expected else 'NOT certified'}"
        )


def _invalid(kind: str, exc) -> str:
    """One line naming the first problem of a pydantic validation error."""
    first = exc.errors()[0]
    where = ".".join(str(x) for x in first.get("loc", ())) or "document"
    msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    return f"not a valid {kind} ({where}: {msg})"


def _parse(text, public_key) -> Any:
    """The JSON of an artifact, its signature checked first when ``public_key`` is given."""
    import json

    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("not a valid klrelease artifact (not JSON)") from None
    if public_key is not None:
        from .service.signing import verify_document

        verify_document(doc, public_key)
    return doc


def _unsigned(doc) -> set[str] | None:
    """Fields left out of an unsigned document's JSON (it reads as before signatures)."""
    return {"signature"} if doc.signature is None else None
