"""``dp-em``: EM for Gaussian mixtures with a certified, KL-shaped Gaussian M-step.

Importing this package registers ``dp-em`` (and the published DP-EM recipe of Park et al.
2017, ``park-dp-em``, the comparison point) with :func:`klrelease.learners.learn`. Proof:
``DPEM.md``.
"""

from __future__ import annotations

from . import learner, park  # noqa: F401
