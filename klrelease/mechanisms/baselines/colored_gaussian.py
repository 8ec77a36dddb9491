"""``"colored-gaussian"``: colored Gaussian noise on the means (Ravi et al. 2022), i.i.d.
Gaussian noise on weights and covariances.

Mechanism. Rows clipped to a public domain; class statistics (pi, mu_k, Sigma_k);

    mu~_k = mu_k + w_k,  w_k ~ N(0, C_k),

with C_k the minimum-trace (minimum mean squared error) covariance whose Mahalanobis
sensitivity ``sup_v v^T C_k^{-1} v`` over the considered mean changes v of class k is at most
a level c (Ravi, Scaglione, Kadam, Gentz, Peisert, Lunghino, Levijarvi, Shumavon, IEEE Trans.
Smart Grid 2022, Eq. (12) and Thm 3, in the exact form s*(eps, delta)^2 instead of
eps^2 / (2 ln(2/delta))). Weights and covariances get i.i.d. Gaussian noise as in
``"gaussian-iid"``; the output is projected onto the feasible set (post-processing).

Calibration. All three blocks form one Gaussian mechanism (see ``"gaussian-iid"``): whitened,
a neighbouring pair moves the output by at most
``s^2 = (Delta_pi/sigma_pi)^2 + S_mu + (Delta_S/sigma_S)^2``, where S_mu bounds
``v_k^T C_k^{-1} v_k + v_k'^T C_k'^{-1} v_k'`` over the changes of the two classes a flip
touches. With budget shares rho the mean block gets ``S_mu = rho_mu s*^2``, so ``s = s*``.

Option ``design``:

``"data"`` (the paper's; reproduction, NOT certified)
    The changes v are the actual neighbour vectors of the dataset (for class k: every member
    leaving, ``(x_n - mu_k)/(N_k - 1)``, and every other row joining, ``(mu_k - x_n)/(N_k + 1)``),
    each class constrained at ``c = rho_mu s*^2 / 2``; C_k is the solution of the SDP
    ``min tr(C) s.t. v^T C^{-1} v <= c`` (:func:`solvers.mean_noise_sdp`). C_k then depends
    on the private labels (through mu_k, N_k and which rows belong to class k): on a
    neighbour the noise covariance itself changes, a case the theorem (which fixes C) does not
    cover; calibrating noise to the sensitivity of the dataset at hand is known not to be
    differentially private (Nissim, Raskhodnikova, Smith 2007).

``"public"`` (certified)
    The changes are every change any dataset can produce: with a public lower bound n on the
    class sizes and rows in the public domain, a removal moves a class mean by
    ``(x - mean of the others)/n`` and an addition by ``(mean - x)/(n+1)``, so every change of
    one class lies in the box ``|v_i| <= r_i / n`` (r: ranges of the public box; for a ball of
    radius B, the ball of radius 2B/n). One C for all classes, constrained so that a removal
    and an addition together cost ``rho_mu s*^2``: ``c = rho_mu s*^2 / (1 + (n/(n+1))^2)``.
    The optimum is in closed form: for the box, averaging any feasible C over the sign flips
    of the coordinates keeps it feasible with the same trace, so a diagonal C is optimal, and
    ``min sum c_i s.t. sum a_i^2 / c_i <= c`` (a_i = r_i/n, the vertex maximum) gives
    ``c_i = a_i (sum_j a_j) / c``; for the ball, ``C = (2B/n)^2 / c I``. (The tests compare it
    with the SDP over the box vertices.) C depends on public quantities only, so the whole
    release is one Gaussian mechanism with whitened sensitivity at most s* and is
    (eps, delta)-DP by Balle & Wang (2018, Thm 8), under the assumptions of ``"gaussian-iid"``
    (rows in the public domain, enforced by clipping; every class of at least
    ``min_class_size`` rows, checked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import Field

from ...data import LabelledData
from ...neighbours import Adjacency
from ...privacy.calibration import gaussian_max_sensitivity
from ...privacy.guarantee import GaussianCurve
from ...sampling import GaussianNoise
from ..base import Guarantee, Mechanism
from ..registry import register
from .common import (
    SUPPORTED_ADJACENCIES,
    BaselineOptions,
    BlockNoise,
    Common,
    IIDPlan,
    public_common,
    resolve_common,
)
from .gaussian_iid import block_sensitivities, certified_statement

__all__ = ["ColoredGaussian", "ColoredMeanNoise", "public_mean_noise_cov", "DESIGNS"]

DESIGNS = ("data", "public")
SOLVER_NAMES = ("auto", "native", "clarabel", "scs", "mosek")


class ColoredGaussianOptions(BaselineOptions):
    """Options of ``colored-gaussian``."""

    design: Literal["data", "public"] = Field(
        "data", description="'data': mean noise designed on the private data (paper; not "
        "certified, label flip only); 'public': designed on the public bounds (certified)")
    solver: Literal["auto", "native", "clarabel", "scs", "mosek"] = Field(
        "auto", description="SDP backend of design 'data'")

DATA_DESIGN_REASONS = (
    "The shape and size of the mean noise are optimised on the private data (the actual "
    "neighbouring datasets); the amount of noise can itself reveal information, and the "
    "privacy theorem used assumes a noise law fixed in advance.",
)


@dataclass(frozen=True)
class ColoredMeanNoise:
    """Independent ``N(0, C_k)`` noise on each class mean (C_k may be singular)."""

    covs: tuple[np.ndarray, ...]
    _laws: tuple = field(default=(), repr=False)

    def __post_init__(self):
        object.__setattr__(self, "_laws", tuple(GaussianNoise(np.asarray(C)) for C in self.covs))

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        return np.stack([law.sample(rng) for law in self._laws])

    def logpdf(self, z: np.ndarray) -> float:
        return float(sum(law.logpdf(z[k]) for k, law in enumerate(self._laws)))


def public_mean_noise_cov(common: Common, level: float) -> np.ndarray:
    """Minimum-trace C with ``v^T C^{-1} v <= level`` for every change v of one class mean.

    The changes are those of any dataset with rows in the public domain and classes of at
    least ``n = common.n_min`` rows: the box ``|v_i| <= r_i/n`` or the ball ``||v|| <= 2B/n``.
    """
    dom, n = common.domain, common.n_min
    if dom.kind == "box":
        a = dom.ranges / n
        return np.diag(a * a.sum() / level)
    return (dom.diameter("l2") / n) ** 2 / level * np.eye(dom.d)


def _data_mean_noise(common: Common, data, level: float, solver: str):
    """Per class, the minimum-trace ``C`` with ``v^T C^{-1} v <= 1`` for every label-flip change
    ``v`` of its mean on this dataset, divided by ``level``.

    The SDPs of all classes are solved together by
    :func:`klrelease.mean_noise.unit_mean_noise` (weight ``I``): in passes over the clipped
    rows, in memory or from a chunked source (each chunk clipped to the public domain); every
    result is checked against every row.
    """
    from ...mean_noise import unit_mean_noise

    stats = common.stats
    K, d = stats.n_classes, stats.n_features
    eye = np.broadcast_to(np.eye(d), (K, d, d))
    if common.X is None:  # a source: its chunks are clipped as they are read
        unit = unit_mean_noise(data, None, stats, eye, Adjacency.LABEL_FLIP, solver=solver,
                               transform=common.domain.clip)
    else:
        unit = unit_mean_noise(common.X, data.codes, stats, eye, Adjacency.LABEL_FLIP,
                               solver=solver)
    with np.errstate(over="ignore"):
        covs = [np.array(G) / level for G in unit.G1]
    if not all(np.all(np.isfinite(C)) for C in covs):  # before any noise is drawn
        raise ValueError("colored-gaussian's mean noise leaves the floating-point range at "
                         "this epsilon and delta; use a larger epsilon or delta")
    return covs, unit.solver


@register
class ColoredGaussian(Mechanism):
    """Colored Gaussian mean noise (Ravi et al.), designed on the data or on public bounds."""

    name = "colored-gaussian"
    #: The one refusal on class sizes is :func:`.common.resolve_common`'s, on the public
    #: ``min_class_size`` that the guarantee assumes.
    min_class_size = 0
    summary = ("colored Gaussian mean noise (Ravi et al. 2022): design 'data' (paper; not "
               "certified) or 'public' (certified)")
    Options = ColoredGaussianOptions
    #: Reads a chunked source (:mod:`klrelease.stream`): it needs only per-class statistics of
    #: the clipped rows.
    streams = True
    relations = SUPPORTED_ADJACENCIES
    certified_relations = SUPPORTED_ADJACENCIES

    def certifies(self, options, public) -> bool:
        return options.design == "public" and options.adjacency in self.certified_relations

    def plan(self, data: LabelledData, *, epsilon: float, delta: float, **options) -> IIDPlan:
        opts = options
        design = opts["design"]
        adjacencies = (Adjacency.LABEL_FLIP,) if design == "data" else \
            (Adjacency.LABEL_FLIP, Adjacency.REPLACE_ONE)
        if design == "data" and opts["adjacency"] == Adjacency.REPLACE_ONE.value:
            raise ValueError(f"{self.name}'s design 'data' is label flip only; give "
                             "design='public' for replace-one")
        common = resolve_common(data, opts, self.name, adjacencies=adjacencies)
        K, d = data.n_classes, data.n_features
        d_pi, _, d_S = block_sensitivities(common, "l2")
        rho_pi, rho_mu, rho_S = common.shares
        # one Gaussian mechanism: (Delta_b / sigma_b)^2 = rho_b s*^2 for weights and
        # covariances, and the mean block's whitened sensitivity^2 is at most rho_mu s*^2
        s_star = gaussian_max_sensitivity(epsilon, delta)
        sig_pi = d_pi / (s_star * np.sqrt(rho_pi))
        sig_S = d_S / (s_star * np.sqrt(rho_S))
        budget_mu = rho_mu * s_star**2
        solver_report = None
        if design == "public":
            n = common.n_min
            C = public_mean_noise_cov(common, budget_mu / (1.0 + (n / (n + 1)) ** 2))
            covs = [C] * K
            guarantee = Guarantee(
                epsilon=epsilon, delta=delta, neighbouring=common.adjacency.value,
                certified=True, statement=certified_statement(common, epsilon, delta),
                reasons=(
                    "Assumes every row lies in the public domain (enforced by clipping) and "
                    "every class holds at least min_class_size rows (checked).",
                ),
                accounting="one Gaussian mechanism (colored on the means, designed on public "
                           "bounds): joint whitened sensitivity calibrated exactly "
                           "(Balle & Wang 2018, Thm 8)",
                curve=GaussianCurve(float(s_star)),
            )
        else:
            covs, solver_report = _data_mean_noise(common, data, budget_mu / 2.0,
                                                   opts["solver"])
            guarantee = Guarantee(
                epsilon=epsilon, delta=delta, neighbouring=common.adjacency.value,
                certified=False,
                statement=(
                    "Paper reproduction, NOT certified: the mean noise is designed on the "
                    "private data, so the stated (epsilon, delta) is not established. Do not "
                    "rely on this release to protect the people in the data."
                ),
                reasons=DATA_DESIGN_REASONS,
                accounting="Gaussian mechanism with data-dependent mean-noise covariance "
                           "(calibration as if the covariance were fixed)",
            )
        public = {"design": design, **public_common(common, opts)}
        if design == "data":
            public["solver"] = opts["solver"]
        return IIDPlan(
            mechanism=self.name, guarantee=guarantee, classes=data.classes,
            public_options=public, solver=solver_report, stats=common.stats,
            domain=common.domain,
            weight_noise=BlockNoise("gaussian", sig_pi, (K,)),
            mean_noise=ColoredMeanNoise(tuple(covs)),
            cov_noise=BlockNoise("gaussian", sig_S, (K, d * (d + 1) // 2)),
            grid_weights=common.grid_weights, cov_floor=common.cov_floor,
            project=common.project,
        )
