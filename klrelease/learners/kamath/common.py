"""Helpers shared by the learners (Kamath et al., Afzali et al., dp-em): guarantee, FAIL,
seeds, a progress bar."""

from __future__ import annotations

import zlib

import numpy as np

from ...gmm import GMM
from ...mechanisms.base import Guarantee
from ...neighbours import Adjacency
from ...privacy.ledger import Ledger
from ..result import LearnResult

__all__ = ["guarantee", "fail", "success", "structure_rng", "structure_seed", "progress_bar"]


def guarantee(ledger: Ledger, name: str, doc: str) -> Guarantee:
    """The claim of a learner: the requested (eps, delta) under substitution, n public (with
    the Gaussian curve when the ledger is GDP)."""
    curve = None
    if ledger.accountant == "gdp":
        from ...privacy.guarantee import GaussianCurve

        curve = GaussianCurve(ledger.gdp_mu())
        acct = (f"Gaussian DP over the worst path (accountant gdp): mu = {curve.mu:.6g}, "
                "delta(eps) on the Gaussian curve")
    elif ledger.accountant == "zcdp":
        acct = ("zCDP over the worst path (accountant zcdp, chosen from public inputs before "
                "the data is read): rho converted to (eps, delta_z) by dp_accounting's RDP "
                "accountant, plus (1 + e^eps) times the stable pieces' total-variation terms")
    else:
        acct = ("basic composition over the worst path (accountant basic), fixed before the "
                "data is read")
    return Guarantee(
        epsilon=ledger.epsilon,
        delta=ledger.delta,
        neighbouring=Adjacency.REPLACE_ONE.value,
        certified=True,
        statement=(
            f"{name}: ({ledger.epsilon:g}, {ledger.delta:g})-differentially private for "
            "datasets that differ in one record (substitution; the number of records is "
            "public). FAIL is an output covered by the same guarantee."
        ),
        reasons=(f"proof: {doc}",
                 f"worst-path ledger (accountant {ledger.accountant}) in diagnostics"),
        accounting=acct,
        curve=curve,
    )


def fail(learner: str, g: Guarantee, stage: str, reason: str, diagnostics: dict) -> LearnResult:
    return LearnResult(learner=learner, gmm=None, guarantee=g, failed=True, stage=stage,
                       reason=reason, diagnostics=diagnostics)


def success(learner: str, g: Guarantee, weights, means, covariances,
            diagnostics: dict) -> LearnResult:
    w = np.clip(np.asarray(weights, dtype=np.float64), 0.0, None)
    w = w / w.sum() if w.sum() > 0 else np.full(len(w), 1.0 / len(w))
    gmm = GMM(w, np.asarray(means, dtype=np.float64), np.asarray(covariances, dtype=np.float64))
    return LearnResult(learner=learner, gmm=gmm, guarantee=g, diagnostics=diagnostics)


def structure_seed(rng: np.random.Generator) -> int:
    """Master seed of the structural randomness: drawn from the run's generator before any
    data is read."""
    return int(rng.integers(0, 2**63 - 1))


def structure_rng(master: int, path: str) -> np.random.Generator:
    """Generator for one node of a recursion, a function of the public seed and path only."""
    return np.random.default_rng([master, zlib.crc32(path.encode())])


def progress_bar(progress: bool, label: str, total: int):
    """``(bar, task)`` of a started transient progress bar on standard error (standard output
    holds results), or ``None`` without ``progress``; the caller advances and stops it."""
    if not progress:
        return None
    from rich.console import Console
    from rich.progress import Progress

    bar = Progress(transient=True, console=Console(stderr=True))
    bar.start()
    return bar, bar.add_task(label, total=total)

