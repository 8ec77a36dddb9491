"""The registry of release mechanisms: a mechanism registers itself in its own module.

::

    from klrelease.mechanisms import Mechanism, register

    @register
    class MyMechanism(Mechanism):
        name = "my-mechanism"
        ...

Defining the class (importing its module) is the whole registration: ``release()``,
``klrelease mechanisms``, the CLI's ``--option`` parsing and artifact validation then find it
by name. The built-in mechanisms are the modules of :mod:`klrelease.mechanisms`, all imported
when the package is; other distributions list theirs under the entry-point group
:data:`ENTRY_POINT_GROUP` (a mechanism class, an instance, or a module whose mechanisms
register themselves).
"""

from __future__ import annotations

import inspect
from importlib import import_module
from types import ModuleType

from .base import Mechanism

__all__ = ["ENTRY_POINT_GROUP", "get_mechanism", "mechanisms", "register", "register_module",
           "unregister"]

#: Entry-point group through which other distributions register mechanisms.
ENTRY_POINT_GROUP = "klrelease.mechanisms"

_REGISTRY: dict[str, Mechanism] = {}


def register(mechanism):
    """Register a mechanism (a concrete :class:`Mechanism` subclass or an instance).

    Usable as a class decorator: returns its argument. Registering the same class again is a
    no-op; another mechanism under a registered name is an error.

    Raises
    ------
    TypeError
        If ``mechanism`` is not a concrete mechanism with a ``name``.
    ValueError
        If another mechanism already has its name.
    """
    instance = mechanism() if isinstance(mechanism, type) and issubclass(
        mechanism, Mechanism) and not inspect.isabstract(mechanism) else mechanism
    if not isinstance(instance, Mechanism) or not isinstance(getattr(instance, "name", None),
                                                             str):
        raise TypeError(f"{mechanism!r} is not a concrete Mechanism with a name")
    held = _REGISTRY.get(instance.name)
    if held is not None:
        if type(held) is type(instance):
            return mechanism
        raise ValueError(f"a mechanism named {instance.name!r} is already registered")
    _REGISTRY[instance.name] = instance
    return mechanism


def unregister(name: str) -> None:
    """Remove the mechanism called ``name`` (unknown names are ignored)."""
    _REGISTRY.pop(name, None)


def mechanisms() -> list[str]:
    """Names of the registered mechanisms, in registration order."""
    return list(_REGISTRY)


def get_mechanism(name: str) -> Mechanism:
    """The registered mechanism called ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown mechanism {name!r}; registered: {', '.join(_REGISTRY)}"
        ) from None


def register_module(module: ModuleType | str) -> list[Mechanism]:
    """Import ``module`` and return the mechanisms defined in it, registering any concrete
    :class:`Mechanism` subclass there that did not register itself.

    ``module`` is a module object or an importable name (for third-party modules written
    without :func:`register`).
    """
    if isinstance(module, str):
        module = import_module(module)
    found = []
    for obj in vars(module).values():
        if (isinstance(obj, type) and issubclass(obj, Mechanism)
                and obj.__module__ == module.__name__ and not inspect.isabstract(obj)
                and isinstance(getattr(obj, "name", None), str)):
            register(obj)
            found.append(_REGISTRY[obj.name])
    return found


def load_entry_points() -> None:
    """Register the mechanisms other distributions list under :data:`ENTRY_POINT_GROUP`."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        if isinstance(obj, ModuleType):
            register_module(obj)
        else:
            register(obj)
