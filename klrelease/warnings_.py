"""Warning classes of the library.

:class:`PrivacyLeakWarning` is raised by mechanisms that exist only to reproduce published
results and whose privacy claim does not hold. It is always shown (never deduplicated), so
every use of such a mechanism is visible. :class:`UnusedBoundWarning` says that a public bound
was given where it is not used.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

__all__ = ["PrivacyLeakWarning", "UnusedBoundWarning", "warn_privacy"]

_PACKAGE = Path(__file__).resolve().parent


class PrivacyLeakWarning(RuntimeWarning):
    """A release whose stated privacy guarantee is known not to hold."""


class UnusedBoundWarning(UserWarning):
    """A public bound given to a mechanism that does not use it under the relation asked for
    (label flip: the features are public), so the caller may have meant another relation."""


def warn_privacy(message: str) -> None:
    """Warn with :class:`PrivacyLeakWarning`, attributed to the first caller outside the
    library (wherever in the library the warning is raised)."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and Path(frame.f_code.co_filename).resolve().is_relative_to(
            _PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, PrivacyLeakWarning, stacklevel=level + 1)


warnings.simplefilter("always", PrivacyLeakWarning)
