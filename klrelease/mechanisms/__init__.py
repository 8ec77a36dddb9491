"""The registry of release mechanisms.

``mechanisms()`` lists the registered names; ``get_mechanism(name)`` returns the mechanism.
A new mechanism subclasses :class:`~klrelease.mechanisms.base.Mechanism` and is registered with
:func:`register`.
"""

from __future__ import annotations

from .base import COMPONENTS, Guarantee, Mechanism, Plan, check_options

__all__ = [
    "COMPONENTS",
    "Guarantee",
    "Mechanism",
    "Plan",
    "check_options",
    "get_mechanism",
    "mechanisms",
    "register",
]

_REGISTRY: dict[str, Mechanism] = {}


def register(mechanism: Mechanism) -> Mechanism:
    """Add a mechanism instance to the registry (its ``name`` must be new)."""
    if mechanism.name in _REGISTRY:
        raise ValueError(f"a mechanism named {mechanism.name!r} is already registered")
    _REGISTRY[mechanism.name] = mechanism
    return mechanism


def mechanisms() -> list[str]:
    """Names of the registered mechanisms."""
    return list(_REGISTRY)


def get_mechanism(name: str) -> Mechanism:
    """The registered mechanism called ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown mechanism {name!r}; registered: {', '.join(_REGISTRY)}"
        ) from None


from . import kl_paper as _kl_paper  # noqa: E402  (registers itself)

register(_kl_paper.KLPaper())

from . import gaussian_iid as _gaussian_iid  # noqa: E402

register(_gaussian_iid.GaussianIID())

from . import laplace_iid as _laplace_iid  # noqa: E402

register(_laplace_iid.LaplaceIID())

from . import colored_gaussian as _colored_gaussian  # noqa: E402

register(_colored_gaussian.ColoredGaussian())

from . import kl_certified as _kl_certified  # noqa: E402

register(_kl_certified.KLCertified())

from . import r1smg as _r1smg  # noqa: E402

register(_r1smg.R1SMG())

from . import ppe_gaussian as _ppe_gaussian  # noqa: E402

register(_ppe_gaussian.PPEGaussian())
