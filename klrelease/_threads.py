"""Threads: single-threaded BLAS for code that works on many small matrices, and two
threads for passes over rows in memory.

The certified design works on d x d matrices and per-class blocks: threaded BLAS only adds
synchronisation there, which costs an order of magnitude when the cores are busy with other
work (measured: 0.25 s against 0.02 s per release at d = 30 on a loaded 2-core machine).
From :data:`THREADED_FROM` features on the d x d products and decompositions are large enough
for threads to pay, and BLAS is left as it is (measured on 2 cores, kl-certified at N = 1e4:
d = 250 0.35 s on one thread, 0.39 s threaded; d = 500 1.38 / 1.11 s; d = 1000 6.8 / 4.5 s).
Threaded BLAS may round differently with a different number of cores, so from that width a
seeded release is reproducible to rounding, not bit for bit, across machines.

Passes over rows in memory (:func:`row_threads`, :func:`beside`, :func:`in_two_halves`) share
their work between two threads only in ways that give the one-thread result bit for bit
(whole classes, or halves whose partial results are combined in order), never fail for want
of a thread, and set numpy's error state in each thread.
"""

from __future__ import annotations

import contextlib
import functools
import os

__all__ = ["single_threaded_blas", "blas_single_thread", "blas_threads_for", "THREADED_FROM",
           "row_threads", "row_threads_setting", "beside", "in_two_halves"]

_CONTROLLER = None

#: From this many features on, BLAS keeps its own threads (see the module's docstring).
THREADED_FROM = 400


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


def blas_threads_for(d: int | None):
    """:func:`single_threaded_blas` below :data:`THREADED_FROM` features (or ``d`` None), a
    context that changes nothing from there."""
    if d is not None and d >= THREADED_FROM:
        return contextlib.nullcontext()
    return single_threaded_blas()


def blas_single_thread(fn=None, *, width=None):
    """Decorator: run ``fn`` under :func:`single_threaded_blas`; with ``width`` (a function of
    ``fn``'s arguments giving its number of features), under :func:`blas_threads_for`."""
    if fn is None:
        return functools.partial(blas_single_thread, width=width)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with blas_threads_for(None if width is None else width(*args, **kwargs)):
            return fn(*args, **kwargs)

    return wrapper


def row_threads_setting() -> int | None:
    """``KLRELEASE_ROW_THREADS`` as 1 or 2, ``None`` when unset.

    Raises
    ------
    ValueError
        Any other value. Checked when a mechanism is planned, before any noise is drawn
        (:meth:`klrelease.mechanisms.base.Mechanism.plan`); during a release an invalid value
        counts as unset (:func:`row_threads`), so that it cannot fail a release after noise."""
    asked = os.environ.get("KLRELEASE_ROW_THREADS", "").strip()
    if not asked:
        return None
    if asked not in ("1", "2"):
        raise ValueError(f"KLRELEASE_ROW_THREADS must be 1 or 2, not {asked!r}")
    return int(asked)


def row_threads() -> int:
    """Threads for a pass over rows in memory: two where the process may run on two cores or
    more, else one; ``KLRELEASE_ROW_THREADS=1`` in the environment keeps every pass on one
    (for many releases run side by side in processes of their own). A pass over rows on a
    worker of a cluster (a streamed chunk) runs on one: the cluster schedules its own
    threads. The sums are the same, bit for bit, on one thread or two. Never raises."""
    try:
        if row_threads_setting() == 1:
            return 1
    except ValueError:  # (checked at planning: here it counts as unset)
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (no affinity on this platform, or not readable)
        cores = os.cpu_count() or 1
    return 2 if cores >= 2 else 1


def beside(fn, *args):
    """Start ``fn(*args)`` on a thread of its own; return a function that waits for and
    returns its result (or raises its exception). Where no thread can be started (a process
    at its limit of threads), ``fn`` runs on the caller's thread when its result is asked
    for: a pass over rows never fails for want of a thread. ``fn`` must set its own numpy
    error state where it could warn: a new thread starts with numpy's default, which warns."""
    from concurrent.futures import ThreadPoolExecutor

    try:
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="klrelease-rows")
        future = pool.submit(fn, *args)
    except (RuntimeError, MemoryError):  # can't start new thread
        return lambda: fn(*args)
    pool.shutdown(wait=False)  # (its thread ends with the task)
    return future.result


def in_two_halves(fn, n: int, least: int = 1 << 17):
    """``[fn(0, h), fn(h, n)]`` with ``h = n // 2``, the second half on a second thread when
    :func:`row_threads` allows two and ``n`` is at least ``least``; else ``[fn(0, n)]``. For
    passes over rows whose numpy work releases the interpreter's lock; the caller combines
    the halves' results in their order (``fn`` must set its own numpy error state where it
    could warn: see :func:`beside`)."""
    if n < least or row_threads() < 2:
        return [fn(0, n)]
    h = n // 2
    later = beside(fn, h, n)
    first = fn(0, h)
    return [first, later()]
