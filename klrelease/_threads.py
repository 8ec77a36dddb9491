"""Single-threaded BLAS for code that works on many small matrices.

The certified design works on d x d matrices and per-class blocks: threaded BLAS only adds
synchronisation there, which costs an order of magnitude when the cores are busy with other
work (measured: 0.25 s against 0.02 s per release at d = 30 on a loaded 2-core machine).
"""

from __future__ import annotations

import contextlib
import functools

__all__ = ["single_threaded_blas", "blas_single_thread"]

_CONTROLLER = None


def single_threaded_blas():
    """A context manager limiting BLAS to one thread (a no-op without threadpoolctl)."""
    global _CONTROLLER
    try:
        if _CONTROLLER is None:
            from threadpoolctl import ThreadpoolController

            _CONTROLLER = ThreadpoolController()
        return _CONTROLLER.limit(limits=1, user_api="blas")
    except Exception:  # noqa: BLE001 - threadpoolctl missing or unsupported: run as is
        return contextlib.nullcontext()


def blas_single_thread(fn):
    """Decorator: run ``fn`` under :func:`single_threaded_blas`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with single_threaded_blas():
            return fn(*args, **kwargs)

    return wrapper
