"""Backends of the mean-noise SDP, one module each, behind one interface.

Each backend has ``name`` (the value of ``solver=``), ``REQUIRED_MODULES``,
``is_available()``, ``options(tol, max_iters, time_limit)`` translating the canonical option
vocabulary into the backend's own, and ``solve(U, ...)`` on canonical rows.
"""

from __future__ import annotations

from .clarabel import ClarabelBackend
from .mosek import MosekBackend
from .native import NativeBackend
from .scs import SCSBackend

__all__ = ["BACKENDS", "ClarabelBackend", "MosekBackend", "NativeBackend", "SCSBackend"]

#: Backends by name, in the order ``solver="auto"`` tries them.
BACKENDS = {
    "native": NativeBackend(),
    "mosek": MosekBackend(),
    "clarabel": ClarabelBackend(),
    "scs": SCSBackend(),
}
