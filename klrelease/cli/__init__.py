"""Command-line interface: ``klrelease COMMAND``.

The application and its entry point live in :mod:`klrelease.cli.app`; each command group is one
module that imports ``app`` from there and registers its commands. Adding a command is one
module plus one line in ``COMMAND_MODULES``; command modules never import each other.
"""

from __future__ import annotations

from importlib import import_module

from .app import BadInput, app, main, run

__all__ = ["app", "main", "run", "BadInput", "COMMAND_MODULES"]

#: Command modules, registered in this order (their commands are listed in this order).
COMMAND_MODULES = ("release", "audit", "experiment", "learn", "plot", "serve", "owner",
                   "remote")

for _name in COMMAND_MODULES:
    import_module(f"{__name__}.{_name}")
