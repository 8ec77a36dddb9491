"""The registry of release mechanisms.

``mechanisms()`` lists the registered names; ``get_mechanism(name)`` returns the mechanism.
A new mechanism is one module of this package defining a concrete subclass of
:class:`~klrelease.mechanisms.base.Mechanism` (its name, typed ``Options``, relations and
certification): every module here is discovered and its mechanisms registered. Other
distributions register theirs through the ``klrelease.mechanisms`` entry-point group (a
mechanism class, instance or module), or at run time with :func:`register`.
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
    "register_module",
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


#: Built-in mechanism modules, in listing order; any other module or package here is
#: discovered after them, so a new mechanism is one module here and nothing else.
BUILTIN_MODULES = ("kl_paper.mechanism", "baselines.gaussian_iid", "baselines.laplace_iid",
                   "baselines.colored_gaussian", "kl_certified.mechanism", "baselines.r1smg",
                   "ppe_gaussian.mechanism")

#: Entry-point group through which other distributions register mechanisms.
ENTRY_POINT_GROUP = "klrelease.mechanisms"


def register_module(module) -> list[Mechanism]:
    """Register every concrete :class:`Mechanism` subclass defined in ``module``.

    ``module`` is a module object or an importable name. Returns the registered instances.
    """
    import inspect
    from importlib import import_module

    if isinstance(module, str):
        module = import_module(module)
    found = []
    for obj in vars(module).values():
        if (isinstance(obj, type) and issubclass(obj, Mechanism)
                and obj.__module__ == module.__name__ and not inspect.isabstract(obj)
                and isinstance(getattr(obj, "name", None), str)):
            found.append(register(obj()))
    return found


def _discover() -> None:
    import pkgutil
    from importlib.metadata import entry_points

    names = {m.name.removeprefix(f"{__name__}.")
             for m in pkgutil.walk_packages(__path__, prefix=f"{__name__}.")
             if not m.ispkg and not m.name.rsplit(".", 1)[-1].startswith("_")
             and m.name != f"{__name__}.base"}
    order = [n for n in BUILTIN_MODULES if n in names] + sorted(names - set(BUILTIN_MODULES))
    for name in order:
        register_module(f"{__name__}.{name}")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        if isinstance(obj, Mechanism):
            register(obj)
        elif isinstance(obj, type) and issubclass(obj, Mechanism):
            register(obj())
        else:
            register_module(obj)


_discover()
