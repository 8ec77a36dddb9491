"""Release mechanisms, one package (or module) per mechanism, and their registry.

* :mod:`.base`          the contract every mechanism implements (typed options, relations,
  certification, the plan);
* :mod:`.registry`      :func:`register` (a class decorator), :func:`mechanisms`,
  :func:`get_mechanism`, and the ``klrelease.mechanisms`` entry-point group;
* :mod:`.kl_certified`  ``kl-certified``: mechanism, design and its proof;
* :mod:`.ppe_gaussian`  ``ppe-gaussian``: mechanism and its proof;
* :mod:`.kl_paper`      ``kl-paper``: the paper's mechanism and its Algorithm 1 design;
* :mod:`.baselines`     ``gaussian-iid``, ``laplace-iid``, ``colored-gaussian``, ``r1smg``.

A mechanism registers itself where it is defined (``@register`` on its class). Every module
of this package is imported here, so a new built-in mechanism is one module and nothing else;
mechanisms of other distributions arrive through the entry-point group.
"""

from __future__ import annotations

from .base import COMPONENTS, Guarantee, Mechanism, Plan, check_options
from .registry import (
    ENTRY_POINT_GROUP,
    get_mechanism,
    load_entry_points,
    mechanisms,
    register,
    register_module,
    unregister,
)

__all__ = [
    "COMPONENTS",
    "ENTRY_POINT_GROUP",
    "Guarantee",
    "Mechanism",
    "Plan",
    "check_options",
    "get_mechanism",
    "mechanisms",
    "register",
    "register_module",
    "unregister",
]

#: Built-in mechanism packages in listing order (the certified ones first); every other
#: module of this package is imported after them, which registers what it defines.
BUILTIN_PACKAGES = ("kl_certified", "ppe_gaussian", "kl_paper", "baselines")


def _import_builtins() -> None:
    import pkgutil
    from importlib import import_module

    for name in BUILTIN_PACKAGES:
        import_module(f"{__name__}.{name}")
    for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
        if not info.name.rsplit(".", 1)[-1].startswith("_"):
            import_module(info.name)


_import_builtins()
load_entry_points()
