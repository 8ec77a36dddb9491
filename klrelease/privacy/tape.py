"""A release tape: record every value a mechanism releases, and replay them on another dataset.

Every elementary mechanism of the DP toolbox (and every noisy release written inline in the
learners) passes its output through :func:`released` with a label and the public quantities
that shaped its noise (epsilon, delta, sensitivity, thresholds, centres, radii, the number of
queries). Outside a tape, :func:`released` returns its value unchanged and costs nothing, so
behaviour is the same with and without it.

Inside :func:`recording` the calls are recorded in order. With ``replay=`` a previous tape,
each call instead *returns the value the previous run released* (after checking that the label
matches), and records the public quantities of the current run. Running a learner on ``D``
with a tape, then on a neighbour ``D'`` replaying that tape, checks the hygiene rule of the
learners: control flow and every public quantity that shapes later noise are functions of the
released values (and public inputs) only. If anything else leaked in, the sequence of labels,
the public quantities or the final result differ between the two runs.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Tape", "TapeDiverged", "plain", "released", "recording"]


class TapeDiverged(AssertionError):
    """A replayed run asked for a release the recorded run did not make at that position."""


def plain(value: Any) -> Any:
    """A comparable, exact, JSON-ready copy of a public quantity (arrays as nested lists,
    numpy scalars as Python numbers, dict keys as text)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


@dataclass
class Tape:
    """The ordered releases of one run: ``(label, public quantities, released value)``."""

    replay: list | None = None
    entries: list = field(default_factory=list)

    def release(self, label: str, value: Any, public: dict) -> Any:
        i = len(self.entries)
        if self.replay is not None:
            if i >= len(self.replay):
                raise TapeDiverged(f"release {i} ({label}) was not made by the recorded run")
            rec_label = self.replay[i][0]
            if rec_label != label:
                raise TapeDiverged(f"release {i}: recorded {rec_label!r}, replayed {label!r}")
            value = copy.deepcopy(self.replay[i][2])
        self.entries.append((label, plain(public), copy.deepcopy(value)))
        return value

    def trace(self) -> list:
        """Labels and public quantities in order (what must agree between neighbours)."""
        return [(label, public) for label, public, _ in self.entries]


_ACTIVE: ContextVar[Tape | None] = ContextVar("klrelease_release_tape", default=None)


def released(label: str, value: Any, **public: Any) -> Any:
    """Pass a released value through the active tape (identity when there is none)."""
    tape = _ACTIVE.get()
    if tape is None:
        return value
    return tape.release(label, value, public)


@contextmanager
def recording(replay: Tape | None = None) -> Iterator[Tape]:
    """Record the releases of the enclosed run; with ``replay``, return its values instead."""
    tape = Tape(replay=None if replay is None else list(replay.entries))
    token = _ACTIVE.set(tape)
    try:
        yield tape
    finally:
        _ACTIVE.reset(token)
