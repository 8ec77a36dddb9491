"""Private learners of Gaussian mixtures from *unlabelled* data.

A learner takes rows ``X`` (no labels), a number of components and a privacy budget, and
returns a :class:`LearnResult`: either a released GMM or an explicit FAIL that names the stage
that failed and the public numbers behind it. A FAIL is an output of the mechanism (it is
covered by the same privacy proof), never an exception and never a silent fallback.

``learn(X, n_components, epsilon=, delta=, learner=NAME)`` runs a registered learner;
``learners()`` lists them. A learner registers itself with :func:`register_learner`.
"""

from __future__ import annotations

from .result import Learner, LearnResult, get_learner, learn, learners, register_learner

__all__ = ["LearnResult", "Learner", "get_learner", "learn", "learners", "register_learner"]
from . import afzali  # noqa: E402, F401, I001  (registers the Afzali-style learner)
from . import dpem  # noqa: E402, F401  (registers dp-em and the published DP-EM recipe)
from . import kamath  # noqa: E402, F401  (registers the Kamath et al. learners)
from . import ppe  # noqa: E402, F401  (registers the PPE-family learners)
