"""What every release mechanism provides.

A mechanism turns a dataset into a :class:`Plan`: everything that is fixed before noise is drawn
(the design). A plan then

* draws a raw noisy output, a dict ``{"weights", "means", "covariances"}`` of arrays
  (:meth:`Plan.sample`);
* gives the exact log-density of such an output under this dataset, per component
  (:meth:`Plan.log_density`), which is what a privacy audit compares between neighbours;
* post-processes the raw output into a valid :class:`~klrelease.gmm.GMM`
  (:meth:`Plan.finalize`; projections cost no privacy).

Splitting design from sampling lets experiments estimate E[KL] by Monte Carlo without
re-solving, and lets the audit recompute the design on a neighbouring dataset exactly as the
mechanism would.

The contract of a mechanism is declared, not written as prose: its options are a typed
:class:`MechanismOptions` model (validated once, strictly, by the base class before
:meth:`Mechanism.plan` runs), it lists the neighbouring relations it implements and under
which the release is certified, and :meth:`Mechanism.certifies` recomputes the certified flag
from the options and the plan's public description, so that an artifact's claim is never
taken on trust. The claim itself is a :class:`~klrelease.privacy.guarantee.Guarantee`.
"""

from __future__ import annotations

import functools
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model

from ..data import LabelledData
from ..gmm import GMM, check_gmm
from ..neighbours import Adjacency
from ..privacy.guarantee import Guarantee

__all__ = [
    "Mechanism",
    "MechanismOptions",
    "Plan",
    "Guarantee",
    "check_options",
    "describe_options",
    "COMPONENTS",
    "Int",
    "Float",
    "last_resort",
]

COMPONENTS = ("weights", "means", "covariances")


def _plain_number(value: Any) -> Any:
    """numpy scalars as Python numbers (numpy booleans stay booleans)."""
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


#: An option that is an integer (numpy integers accepted; floats and strings are not).
Int = Annotated[int, BeforeValidator(_plain_number)]
#: An option that is a real number (integers accepted; booleans and strings are not).
Float = Annotated[float, BeforeValidator(_plain_number)]


class MechanismOptions(BaseModel):
    """The options of a mechanism, typed and validated once (strict: no guessing).

    A mechanism subclasses this model and declares each option with its type, default and
    constraints. Validation is strict: a boolean is ``True`` or ``False`` (never ``"no"``), a
    number is not a string, and an unknown name is an error. ``adjacency`` is the
    neighbouring relation the claim is about; each mechanism lists the relations it supports
    in :attr:`Mechanism.relations`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    adjacency: Adjacency = Field(Adjacency.LABEL_FLIP, strict=False,
                                 description="the neighbouring relation of the claim")

    def as_dict(self) -> dict[str, Any]:
        """The option values (enums as their string values, tuples as tuples)."""
        return {k: (v.value if isinstance(v, Adjacency) else v) for k, v in self}


def _type_words(annotation: Any) -> str:
    """A short description of an option type for help texts and errors."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        base, *meta = typing.get_args(annotation)
        words = _type_words(base)
        bounds = []
        for m in meta:
            for c in (m, *getattr(m, "metadata", ())):  # a constraint, or a Field's constraints
                for attr, sym in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
                    v = getattr(c, attr, None)
                    if v is not None:
                        bounds.append(f"{sym} {v:g}" if isinstance(v, float) else f"{sym} {v}")
        return f"{words} {' and '.join(bounds)}" if bounds else words
    if origin is Literal:
        return "|".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        parts = [a for a in typing.get_args(annotation) if a is not type(None)]
        words = " or ".join(_type_words(a) for a in parts)
        return words + " or none" if len(parts) < len(typing.get_args(annotation)) else words
    if origin is tuple:
        args = typing.get_args(annotation)
        return f"{len(args)} numbers" if args else "numbers"
    if annotation is bool:
        return "true|false"
    if annotation is int:
        return "integer"
    if annotation is float:
        return "number"
    if annotation is str:
        return "text"
    if isinstance(annotation, type) and issubclass(annotation, Adjacency):
        return "|".join(a.value for a in annotation)
    return getattr(annotation, "__name__", str(annotation))


def describe_options(mechanism: Mechanism) -> list[tuple[str, str, Any, str]]:
    """``(name, type, default, description)`` of every option of ``mechanism``."""
    rows = []
    for name, f in mechanism.Options.model_fields.items():
        if name == "adjacency":
            kind = "|".join(a.value for a in mechanism.relations)
        else:
            ann = f.annotation
            if f.metadata:
                ann = Annotated[(ann, *f.metadata)]
            kind = _type_words(ann)
        default = f.default.value if isinstance(f.default, Adjacency) else f.default
        rows.append((name, kind, default, f.description or ""))
    return rows


def _accepted(mechanism: Mechanism) -> str:
    def shown(d):
        return "none" if d is None else (str(d).lower() if isinstance(d, bool) else d)

    return "; ".join(f"{n} ({k}, default {shown(d)})" for n, k, d, _ in describe_options(mechanism))


@dataclass
class Plan(ABC):
    """A mechanism's output law on one dataset."""

    mechanism: str
    guarantee: Guarantee
    classes: tuple
    public_options: dict[str, Any] = field(default_factory=dict)
    solver: Any = None  # a SolverReport or None

    @abstractmethod
    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Draw one raw noisy output."""

    @abstractmethod
    def log_density(self, output: dict[str, np.ndarray]) -> dict[str, float]:
        """Exact log-density (or log-PMF) of each component of ``output`` under this plan."""

    @abstractmethod
    def finalize(self, output: dict[str, np.ndarray]) -> GMM:
        """Post-process a raw output into the released GMM."""

    def draw(self, rng: np.random.Generator) -> GMM:
        """Sample and finalise one release."""
        return self.finalize(self.sample(rng))

    @property
    def notes(self) -> dict[str, str]:
        """Public notes on how the draws were post-processed (functions of released values
        only), added to the artifact's options. None by default."""
        return {}


class Mechanism(ABC):
    """A registered release mechanism.

    A mechanism declares

    * :attr:`Options`, a :class:`MechanismOptions` model of its options (types, defaults,
      constraints); the base class validates the options before :meth:`plan` runs, so
      ``plan`` receives only valid values (as keyword arguments);
    * :attr:`relations`, the neighbouring relations it supports;
    * :meth:`certifies`, whether a release with given options is certified (a proven
      guarantee); the artifact's flag is recomputed from it, never trusted;
    * :attr:`uses_box`, whether it uses a public box of feature bounds (``bounds=``), and
      :attr:`bound_under_label_flip`, whether it uses a public bound under label flip.
    """

    #: Registry name, e.g. ``"kl-paper"``.
    name: ClassVar[str]
    #: One line for listings.
    summary: ClassVar[str]
    #: The typed options accepted by :meth:`plan` besides epsilon and delta.
    Options: ClassVar[type[MechanismOptions]] = MechanismOptions
    #: Neighbouring relations the mechanism implements (the first is the default).
    relations: ClassVar[tuple[Adjacency, ...]] = (Adjacency.LABEL_FLIP,)
    #: Relations under which a release is certified (see :meth:`certifies`).
    certified_relations: ClassVar[tuple[Adjacency, ...]] = ()
    #: Whether a public box ``bounds=(lower, upper)`` is used (else giving one is an error).
    uses_box: ClassVar[bool] = True
    #: Whether a public bound (box or ball) is used under label flip; where not, giving one
    #: with that relation warns that it is not used (the features are public).
    bound_under_label_flip: ClassVar[bool] = True
    #: Rows every class must hold before the mechanism runs; ``None`` means d + 1 (an
    #: invertible class covariance). A refusal depends on the private class sizes, so a
    #: certified mechanism whose proof covers all datasets sets 0.
    min_class_size: ClassVar[int | None] = None
    #: Whether :meth:`plan` also reads a chunked source (:mod:`klrelease.stream`) in passes.
    streams: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        legacy = cls.__dict__.get("options")
        if isinstance(legacy, dict):  # options declared as {name: default}: typed from defaults
            cls.Options = _model_from_defaults(cls.__name__, legacy)
            del cls.options
        inner = cls.__dict__.get("plan")
        if inner is None or getattr(inner, "__isabstractmethod__", False):
            return

        @functools.wraps(inner)
        def plan(self, data, *, epsilon, delta, **options):
            opts = self.validate_options(options)
            # the environment's thread setting, checked before any noise (a release reads it
            # again later, where an invalid value must not fail it)
            from .._threads import row_threads_setting

            row_threads_setting()
            return inner(self, data, epsilon=epsilon, delta=delta, **opts.as_dict())

        plan._validates_options = True
        cls.plan = plan

    @property
    def options(self) -> dict[str, Any]:
        """Option names with their defaults."""
        return self.Options().as_dict()

    def validate_options(self, options: Mapping[str, Any] | MechanismOptions) -> MechanismOptions:
        """The options as a validated :attr:`Options` model.

        Raises
        ------
        ValueError
            One line naming the offending option and listing what is accepted.
        """
        if isinstance(options, self.Options):
            opts = options
        else:
            options = dict(options)
            unknown = sorted(set(options) - set(self.Options.model_fields))
            if unknown:
                raise ValueError(
                    f"unknown option(s) {', '.join(map(repr, unknown))} for mechanism "
                    f"{self.name!r}; accepted: {_accepted(self)}"
                )
            try:
                opts = self.Options(**options)
            except ValidationError as exc:
                raise ValueError(_option_error(self, exc)) from None
        if opts.adjacency not in self.relations:
            raise ValueError(
                f"unsupported adjacency {opts.adjacency.value!r} for mechanism {self.name!r}; "
                f"accepted: {', '.join(a.value for a in self.relations)}"
            )
        return opts

    @classmethod
    def box_refusal(cls) -> str:
        """Why a public box is refused, for a mechanism that does not use one
        (:attr:`uses_box` false): the API's and the command line's message."""
        if any(r != Adjacency.LABEL_FLIP for r in cls.relations):
            return (f"{cls.name} does not use a public box of feature bounds (bounds=, "
                    "--lower/--upper); give a norm bound (norm_bound=, --norm-bound) for its "
                    "record-level relations instead")
        return (f"{cls.name} does not use a public box of feature bounds (bounds=, "
                "--lower/--upper): its one relation is label flip, under which the features "
                "are public")

    def certifies(self, options: MechanismOptions, public: Mapping[str, Any]) -> bool:
        """Whether a release with these options is certified (before seeding is considered).

        ``public`` is the plan's public description (the artifact's ``options`` block), for
        mechanisms whose claim depends on where the public bound came from.
        """
        return options.adjacency in self.certified_relations

    def public_guarantee(self, *, epsilon: float, delta: float, options: MechanismOptions,
                         n_samples: int, n_classes: int, n_features: int) -> Guarantee | None:
        """The claim of a release from public inputs alone, before any data is read.

        A budget ledger charges this claim before the data is touched, so it must be the
        claim :meth:`plan` makes (same epsilon, delta, relation, certified flag and privacy
        curve) for a dataset of ``n_samples`` rows, ``n_classes`` declared classes and
        ``n_features`` features with its public bound given. ``None`` (the default) means the
        mechanism does not know its claim before planning; a ledger then charges the claimed
        (epsilon, delta) and composes it by basic composition.
        """
        return None

    def options_on_cluster(self, options: MechanismOptions) -> MechanismOptions:
        """The options a plan of data read by the workers of a Dask cluster uses in place of
        ``options`` (the same by default), so that a claim stated before the data is read
        (:meth:`public_guarantee`) is the plan's claim there too."""
        return options

    def check_claim(self, *, epsilon: float, delta: float, public: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` if a certified artifact's (epsilon, delta) is not what the
        public design values recorded beside it give (an edited claim). Nothing recorded,
        nothing to check (the default)."""
        return None

    @abstractmethod
    def plan(self, data: LabelledData, *, epsilon: float, delta: float, **options) -> Plan:
        """Design the mechanism on ``data`` (options arrive validated)."""


def _model_from_defaults(name: str, defaults: dict[str, Any]) -> type[MechanismOptions]:
    """An options model whose types are those of the defaults (``None``: any value)."""
    fields: dict[str, Any] = {}
    for key, default in defaults.items():
        if isinstance(default, bool):
            kind: Any = bool
        elif isinstance(default, int):
            kind = Int
        elif isinstance(default, float):
            kind = Float
        elif isinstance(default, str):
            kind = str
        else:
            kind = Any
        fields[key] = (kind, Field(default, strict=False) if kind is Any else default)
    return create_model(f"{name}Options", __base__=MechanismOptions, **fields)


def _option_error(mechanism: Mechanism, exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = [str(x) for x in err.get("loc", ())]
    name = loc[0] if loc else "options"
    rows = {n: k for n, k, _, _ in describe_options(mechanism)}
    got = err.get("input")
    expected = f"accepted: {rows[name]}" if name in rows else f"accepted: {_accepted(mechanism)}"
    if err.get("type") in ("literal_error", "enum"):
        return f"unknown {name} {got!r} for mechanism {mechanism.name!r}; {expected}"
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    got_words = f" {got!r}" if not isinstance(got, dict) else ""
    return (f"invalid {name}{got_words} for mechanism {mechanism.name!r} ({msg}); "
            f"{expected}")


def check_options(mechanism: Mechanism, options: Mapping[str, Any]) -> dict[str, Any]:
    """Validate ``options`` against the mechanism's :attr:`~Mechanism.Options` (defaults filled)."""
    return mechanism.validate_options(options).as_dict()


def last_resort(model, K: int, d: int, classes) -> GMM:
    """``model()`` checked as the artifact will check it, or, if even that fails, the model of
    no data at all (equal weights, means 0, unit covariances): a release never fails after
    noise was drawn."""
    try:
        with np.errstate(all="ignore"):
            return check_gmm(model())
    except (ValueError, np.linalg.LinAlgError, FloatingPointError):
        return GMM(np.full(K, 1.0 / K), np.zeros((K, d)), np.broadcast_to(np.eye(d), (K, d, d)
                                                                            ).copy(), classes)
