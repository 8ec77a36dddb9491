"""The registered unlabelled-data learners ``ppe-gmm`` and ``ppe-gaussian-oneshot``.

Both are (eps, delta)-DP under replacement of one record (``PPE.md``, section "Guarantee"),
the FAIL outcomes included: a configuration FAIL depends only on public numbers (N, d, K, the
budget and options); a popularity-test FAIL is the output of the private test.
"""

from __future__ import annotations

import numpy as np

from ...gmm import GMM
from ...mechanisms.base import Guarantee
from ..result import LearnResult
from .params import configure_params, em_block, fail_reason, gaussian_block, run_params_ppe

__all__ = ["ppe_gmm", "ppe_gaussian", "ppe_guarantee", "NEIGHBOURING"]

#: The neighbouring relation of every PPE/PPME learner.
NEIGHBOURING = "replace-one"


def ppe_guarantee(epsilon: float, delta: float, what: str, accounting: str) -> Guarantee:
    """The guarantee of a PPE-family learner (it covers FAIL)."""
    return Guarantee(
        epsilon=epsilon, delta=delta, neighbouring=NEIGHBOURING, certified=True,
        statement=(f"({epsilon:g}, {delta:g})-differentially private under replacement of one "
                   f"record (datasets of the same size N differing in one row), FAIL included: "
                   f"{what}"),
        reasons=("Proof in klrelease/learners/ppe/PPE.md (Arbas, Ashtiani & Liaw 2023, Thm 2.3 "
                 "with r = gamma; masking radius solved exactly). Rows are permuted uniformly "
                 "at random, independently of the data, before the disjoint split. Idealised "
                 "real arithmetic (floating-point samplers).",),
        accounting=accounting,
    )


def _finish(name: str, cfg, outcome, guarantee, progress_note: str = "") -> LearnResult:
    diag = cfg.public()
    if not outcome.passed:
        return LearnResult(name, None, guarantee, failed=True, stage="popularity test",
                           reason=fail_reason(outcome), diagnostics=diag)
    Y = outcome.output
    return LearnResult(name, GMM(Y.weights, Y.means, Y.covariances), guarantee,
                       diagnostics=diag)


def _config_fail(name: str, cfg, guarantee) -> LearnResult:
    return LearnResult(name, None, guarantee, failed=True, stage="configuration",
                       reason=cfg.reason, diagnostics=cfg.public())


def ppe_gmm(X: np.ndarray, n_components: int, *, epsilon: float, delta: float,
            rng: np.random.Generator, blocks: int | None = None, alpha: float = 0.5,
            beta: float = 0.1, min_block_size: int | None = None, n_init: int = 2,
            max_iter: int = 200, progress=None) -> LearnResult:
    """Private GMM by PPE with scikit-learn EM per block (Arbas, Ashtiani & Liaw 2023)."""
    N, d = X.shape
    K = n_components
    cfg = configure_params(N, d, K, epsilon, delta, t=blocks, alpha=alpha, beta=beta,
                           min_block=min_block_size)
    g = ppe_guarantee(epsilon, delta, f"PPE over {K}-component GMM parameters with EM per block",
                      f"one PPE call: TLap test ({cfg.epsilon:.4g}, {cfg.delta:.3g}) and B_GMM "
                      f"masking ({cfg.epsilon:.4g}, {cfg.delta:.3g}) at radius "
                      f"{cfg.gamma:.3g} ({cfg.calibration.composition} composition over "
                      f"components) -> (2 eps, 4 e^eps delta)")
    if not cfg.feasible:
        return _config_fail("ppe-gmm", cfg, g)
    learner = em_block(K, n_init=n_init, max_iter=max_iter)
    out = run_params_ppe(X, learner, cfg, rng, progress=progress)
    return _finish("ppe-gmm", cfg, out, g)


def ppe_gaussian(X: np.ndarray, n_components: int, *, epsilon: float, delta: float,
                 rng: np.random.Generator, blocks: int | None = None, alpha: float = 0.5,
                 beta: float = 0.1, min_block_size: int | None = None,
                 progress=None) -> LearnResult:
    """One unbounded Gaussian by one PPE call (K = 1; block mean and covariance)."""
    N, d = X.shape
    if n_components != 1:
        raise ValueError("ppe-gaussian-oneshot learns one Gaussian: n_components must be 1")
    cfg = configure_params(N, d, 1, epsilon, delta, t=blocks, alpha=alpha, beta=beta,
                           min_block=min_block_size if min_block_size is not None else d + 1)
    g = ppe_guarantee(epsilon, delta, "PPE over (mean, covariance) of one Gaussian",
                      f"one PPE call: TLap test ({cfg.epsilon:.4g}, {cfg.delta:.3g}) and "
                      f"(R_MEAN, R_COV) masking at radius {cfg.gamma:.3g}")
    if not cfg.feasible:
        return _config_fail("ppe-gaussian-oneshot", cfg, g)
    out = run_params_ppe(X, gaussian_block, cfg, rng, progress=progress)
    return _finish("ppe-gaussian-oneshot", cfg, out, g)
