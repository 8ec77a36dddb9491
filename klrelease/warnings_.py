"""Warning classes of the library.

:class:`PrivacyLeakWarning` is raised by mechanisms that exist only to reproduce published
results and whose privacy claim does not hold. It is always shown (never deduplicated), so
every use of such a mechanism is visible.
"""

from __future__ import annotations

import warnings

__all__ = ["PrivacyLeakWarning"]


class PrivacyLeakWarning(RuntimeWarning):
    """A release whose stated privacy guarantee is known not to hold."""


warnings.simplefilter("always", PrivacyLeakWarning)
