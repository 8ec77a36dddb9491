"""Private GMM learners of Kamath, Sheffet, Singhal & Ullman (NeurIPS 2019).

Importing this package registers ``kamath-pgme-lite`` (main algorithm; the former name
``kamath-pgme`` resolves to it with a FutureWarning), ``kamath-pegme``
(warm-up) and ``kamath-sa-lite`` (sample-and-aggregate) with :func:`klrelease.learners.learn`.
Privacy proofs and the practical replacements of cited black boxes: ``KAMATH.md``.
"""

from __future__ import annotations

from . import pegme, pgme, salite  # noqa: F401
