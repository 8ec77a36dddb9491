"""The registered unlabelled-data learners ``ppe-gmm`` and ``ppe-gaussian-oneshot``.

Both are (eps, delta)-DP under replacement of one record (``PPE.md``, section "Guarantee"),
the FAIL outcomes included: a configuration or preflight FAIL depends only on public numbers
(N, d, K, the budget and options); a popularity-test FAIL is the output of the private test.
Every popularity-test FAIL says from which N an oracle block learner passes
(:func:`.params.predicted_sample_size`, checked against simulation in
``experiments/ppe_regimes``); below a tenth of that N the run is refused before any block is
fitted (stage ``preflight``): in simulation the pass rate is 0 already a factor 3 below it.
"""

from __future__ import annotations

import numpy as np

from ...gmm import GMM
from ...mechanisms.base import Guarantee
from ..result import LearnResult
from .params import (
    configure_params,
    em_block,
    fail_reason,
    gaussian_block,
    predicted_sample_size,
    run_params_ppe,
)

__all__ = ["ppe_gmm", "ppe_gaussian", "ppe_guarantee", "NEIGHBOURING"]

#: The neighbouring relation of every PPE/PPME learner.
NEIGHBOURING = "replace-one"

#: A run whose N is below the predicted passing N divided by this is refused before any block
#: is fitted (public numbers only).
PREFLIGHT_FACTOR = 10.0


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
    pred = predicted_sample_size(cfg)
    diag = {**cfg.public(), "predicted_pass_n": pred}
    if not outcome.passed:
        return LearnResult(name, None, guarantee, failed=True, stage="popularity test",
                           reason=fail_reason(outcome, pred), diagnostics=diag)
    Y = outcome.output
    return LearnResult(name, GMM(Y.weights, Y.means, Y.covariances), guarantee,
                       diagnostics=diag)


def _config_fail(name: str, cfg, guarantee) -> LearnResult | None:
    """FAIL from public numbers: the configuration is infeasible, or N is far below where the
    popularity test can pass (then no block is fitted); ``None`` to run."""
    if not cfg.feasible:
        return LearnResult(name, None, guarantee, failed=True, stage="configuration",
                           reason=cfg.reason, diagnostics=cfg.public())
    pred = predicted_sample_size(cfg)
    if cfg.n_samples * PREFLIGHT_FACTOR < pred:
        return LearnResult(
            name, None, guarantee, failed=True, stage="preflight",
            reason=(f"N={cfg.n_samples} is below a tenth of N={pred:.3g}, from which an oracle "
                    f"block learner passes the popularity test (t={cfg.t} blocks, closeness "
                    f"threshold tau={cfg.tau:.3g}, d={cfg.d}, K={cfg.K}, "
                    f"eps={cfg.epsilon_total:g}); no block was fitted; decided from public "
                    "numbers only"),
            diagnostics={**cfg.public(), "predicted_pass_n": pred})
    return None


def ppe_gmm(X: np.ndarray, n_components: int, *, epsilon: float, delta: float,
            rng: np.random.Generator, blocks: int | None = None, alpha: float = 0.5,
            beta: float = 0.1, min_block_size: int | None = None, n_init: int = 2,
            max_iter: int = 200, progress=None) -> LearnResult:
    """Private GMM by PPE with scikit-learn EM per block (Arbas, Ashtiani & Liaw 2023).

    Parameters (all public)
    -----------------------
    blocks : number of blocks t (default ``t_min(eps, delta)``).
    alpha, beta : accuracy and failure probability of the noise scales.
    min_block_size : rows per block below which the run is refused (default ``K (d + 1)``).
    n_init : EM restarts per block.
    max_iter : EM iterations per block.
    progress : when callable, called with 1 after each block.
    """
    N, d = X.shape
    K = n_components
    cfg = configure_params(N, d, K, epsilon, delta, t=blocks, alpha=alpha, beta=beta,
                           min_block=min_block_size)
    g = ppe_guarantee(epsilon, delta, f"PPE over {K}-component GMM parameters with EM per block",
                      f"one PPE call: TLap test ({cfg.epsilon:.4g}, {cfg.delta:.3g}) and B_GMM "
                      f"masking ({cfg.epsilon:.4g}, {cfg.delta:.3g}) at radius "
                      f"{cfg.gamma:.3g} ({cfg.calibration.composition} composition over "
                      f"components) -> (2 eps, 4 e^eps delta)")
    refused = _config_fail("ppe-gmm", cfg, g)
    if refused is not None:
        return refused
    learner = em_block(K, n_init=n_init, max_iter=max_iter)
    out = run_params_ppe(X, learner, cfg, rng, progress=progress)
    return _finish("ppe-gmm", cfg, out, g)


def ppe_gaussian(X: np.ndarray, n_components: int, *, epsilon: float, delta: float,
                 rng: np.random.Generator, blocks: int | None = None, alpha: float = 0.5,
                 beta: float = 0.1, min_block_size: int | None = None,
                 progress=None) -> LearnResult:
    """One unbounded Gaussian by one PPE call (K = 1; block mean and covariance).

    Parameters (all public)
    -----------------------
    blocks : number of blocks t (default ``t_min(eps, delta)``).
    alpha, beta : accuracy and failure probability of the noise scales.
    min_block_size : rows per block below which the run is refused (default ``d + 1``).
    progress : when callable, called with 1 after each block.
    """
    N, d = X.shape
    if n_components != 1:
        raise ValueError("ppe-gaussian-oneshot learns one Gaussian: n_components must be 1")
    cfg = configure_params(N, d, 1, epsilon, delta, t=blocks, alpha=alpha, beta=beta,
                           min_block=min_block_size if min_block_size is not None else d + 1)
    g = ppe_guarantee(epsilon, delta, "PPE over (mean, covariance) of one Gaussian",
                      f"one PPE call: TLap test ({cfg.epsilon:.4g}, {cfg.delta:.3g}) and "
                      f"(R_MEAN, R_COV) masking at radius {cfg.gamma:.3g}")
    refused = _config_fail("ppe-gaussian-oneshot", cfg, g)
    if refused is not None:
        return refused
    out = run_params_ppe(X, gaussian_block, cfg, rng, progress=progress)
    return _finish("ppe-gaussian-oneshot", cfg, out, g)
