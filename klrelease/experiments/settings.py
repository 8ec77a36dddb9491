"""The settings of the paper's synthetic experiments (section V-A and V-E), one per figure.

Every figure sweeps one quantity (``epsilon``, ``n_samples``, ``n_classes``, ``n_features`` or
the clipping bound ``norm_bound``) over a fixed list of values, with every other quantity at the
paper's default: a ground-truth GMM with Dirichlet(1) weights, means uniform in
[-10, 10]^d and Wishart(d + 1, I) covariances, N = 1000 points, K = 5 classes, d = 3 features,
delta = 1e-5, lambda = 1e-3, seed 42, 100 trials (200 for figure 1).

The paper does not print the grids of its sweeps; the grids below are chosen to cover the
ranges its figures show and always contain the default value (eps = 1, N = 1000, K = 5,
d = 3), so that every figure can be read at the common operating point.

References
----------
Liu, Scaglione & Peisert, "Differentially Private Distribution Release of Gaussian Mixture
Models via KL-Divergence Minimization", section V.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

__all__ = [
    "EPSILON_GRID",
    "EXPERIMENTS",
    "Experiment",
    "MechanismSpec",
    "SWEEPS",
    "SyntheticSetting",
    "get_experiment",
]

#: The ten privacy levels of figures 1 and 2 (the paper plots roughly 0.1 .. 10).
EPSILON_GRID = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 2.0, 3.0, 5.0, 10.0)

#: The quantities a figure can sweep, with their axis labels.
SWEEPS = {
    "epsilon": "privacy level $\\epsilon$",
    "n_samples": "number of data points $N$",
    "n_classes": "number of classes $K$",
    "n_features": "dimension $d$",
    "norm_bound": "clipping bound $B$",
}


@dataclass(frozen=True)
class SyntheticSetting:
    """How one trial's dataset is drawn (the paper's synthetic setting).

    Attributes
    ----------
    n_samples, n_classes, n_features : int
        N, K and d.
    mean_range : float
        Component means are uniform in ``[-mean_range, mean_range]^d``.
    min_class_size : int or None
        Every class receives at least this many points. ``None`` means ``d + 2``: the smallest
        size for which a class keeps an invertible covariance after one of its points is
        flipped to another class. The class sizes are ``m + Multinomial(N - K m, weights)``,
        i.e. the labels of ``N - K m`` points are drawn from the mixture weights and every
        class is topped up with ``m`` points of its own component. The same datasets are used
        for every mechanism.
    """

    n_samples: int = 1000
    n_classes: int = 5
    n_features: int = 3
    mean_range: float = 10.0
    min_class_size: int | None = None

    def __post_init__(self):
        if self.n_classes < 2 or self.n_features < 1:
            raise ValueError("the synthetic setting needs n_classes >= 2 and n_features >= 1")
        if self.n_samples < self.n_classes * self.class_floor:
            raise ValueError(
                f"n_samples must be at least n_classes * min_class_size = "
                f"{self.n_classes * self.class_floor}, got {self.n_samples}"
            )
        if self.mean_range <= 0:
            raise ValueError(f"mean_range must be > 0, got {self.mean_range}")

    @property
    def class_floor(self) -> int:
        """The minimum number of points per class actually used."""
        return self.n_features + 2 if self.min_class_size is None else int(self.min_class_size)


@dataclass(frozen=True)
class MechanismSpec:
    """A mechanism as run in an experiment.

    Attributes
    ----------
    name : str
        The registry name (:func:`klrelease.mechanisms`).
    label : str
        The legend label.
    options : tuple of (name, value)
        Mechanism options.
    key : str
        The identifier in results (defaults to ``name``; differs when one mechanism runs
        with two sets of options).
    """

    name: str
    label: str
    options: tuple[tuple[str, Any], ...] = ()
    key: str = ""

    @property
    def id(self) -> str:
        return self.key or self.name

    def option_dict(self) -> dict[str, Any]:
        return dict(self.options)


#: The proposed mechanism with its default (label-flip) adjacency.
KL_PAPER = MechanismSpec("kl-paper", "KL-minimising (kl-paper)")

#: The four baselines of the paper. Under label flip the features are public, so the
#: baselines take their data bounds from the features (``bounds="features"``). Baselines whose
#: noise depends on a public lower bound on the class sizes (option ``min_class_size``) are
#: given the floor every synthetic class is guaranteed by construction (``d + 2``): a public
#: fact of the experiment, not a statistic of the data.
LAPLACE = MechanismSpec("laplace-iid", "i.i.d. Laplace (paper constants)",
                        (("variant", "paper"), ("bounds", "features")))
LAPLACE_LF = MechanismSpec("laplace-iid", "i.i.d. Laplace (label-flip sensitivities)",
                           (("variant", "label-flip"), ("bounds", "features")),
                           key="laplace-iid/label-flip")
GAUSSIAN = MechanismSpec("gaussian-iid", "i.i.d. Gaussian", (("bounds", "features"),))
COLORED = MechanismSpec("colored-gaussian", "colored Gaussian (designed on data)",
                        (("design", "data"), ("bounds", "features")))
R1SMG = MechanismSpec("r1smg", "R1SMG (as published; not certified)", (("bounds", "features"),))

BASELINES = (LAPLACE, GAUSSIAN, COLORED)

#: The private populous estimator (one Gaussian per class); replace-one adjacency. It returns
#: FAIL at these sample sizes, which the CSV and the figure report.
#: The certified KL-minimising release (label flip; the classes of a synthetic set are public).
KL_CERTIFIED = MechanismSpec("kl-certified", "KL-minimising, certified (kl-certified)")
PPE_GAUSSIAN = MechanismSpec("ppe-gaussian", "PPE per-class Gaussians (replace-one)")


@dataclass(frozen=True)
class Experiment:
    """One figure: a sweep of one quantity, the mechanisms compared, and the run sizes.

    Attributes
    ----------
    name : str
        ``fig1`` .. ``fig5``, ``fig13``.
    title : str
        The figure title.
    sweep : str
        The swept quantity, a key of :data:`SWEEPS`.
    values : tuple
        The values of the swept quantity.
    mechanisms : tuple of MechanismSpec
    setting : SyntheticSetting
        The defaults for the quantities that are not swept.
    epsilon, delta, lam : float
        Privacy parameters and the smoothing parameter lambda of kl-paper.
    seed : int
        The root seed; trial ``t`` draws its data and noise from streams derived from
        ``(seed, t)`` only, so a trial gives the same numbers however many trials run.
    trials : int
        Datasets drawn (Monte Carlo over the data).
    n_draws : int
        Releases drawn per dataset, mechanism and value (Monte Carlo over the mechanism).
    record_level : bool
        Record-level adjacency (change one record) with rows clipped to ``norm_bound``.
    paper_claim : str
        What the paper says about this figure.
    quick_values, quick_trials, quick_draws
        The reduced run of ``--quick``.
    """

    name: str
    title: str
    sweep: str
    values: tuple
    mechanisms: tuple[MechanismSpec, ...]
    setting: SyntheticSetting = field(default_factory=SyntheticSetting)
    epsilon: float = 1.0
    delta: float = 1e-5
    lam: float = 1e-3
    seed: int = 42
    trials: int = 100
    n_draws: int = 10
    record_level: bool = False
    paper_claim: str = ""
    quick_values: tuple = ()
    quick_trials: int = 2
    quick_draws: int = 3

    def __post_init__(self):
        if self.sweep not in SWEEPS:
            raise ValueError(f"unknown sweep {self.sweep!r}; allowed: {', '.join(SWEEPS)}")
        if not self.values:
            raise ValueError("an experiment needs at least one value to sweep")
        if self.trials < 1 or self.n_draws < 1:
            raise ValueError("trials and n_draws must be >= 1")

    @property
    def data_per_value(self) -> bool:
        """Whether the swept quantity changes the dataset (N, K, d) or only the mechanism."""
        return self.sweep in ("n_samples", "n_classes", "n_features")

    def configured(self, *, quick: bool = False, trials: int | None = None) -> Experiment:
        """The experiment as it will run: quick mode and an explicit trial count applied."""
        exp = self
        if quick:
            exp = replace(
                exp, values=self.quick_values or self.values[:3], trials=self.quick_trials,
                n_draws=self.quick_draws,
            )
        if trials is not None:
            if int(trials) < 1:
                raise ValueError(f"--trials must be >= 1, got {trials}")
            exp = replace(exp, trials=int(trials))
        return exp

    def point(self, value) -> tuple[SyntheticSetting, float, float | None]:
        """The data setting, epsilon and clipping bound at one value of the sweep."""
        setting, eps, bound = self.setting, self.epsilon, None
        if self.sweep == "epsilon":
            eps = float(value)
        elif self.sweep == "norm_bound":
            bound = float(value)
        else:
            setting = replace(setting, **{self.sweep: int(value)})
        return setting, eps, bound

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["mechanisms"] = [
            {"id": m.id, "name": m.name, "label": m.label, "options": m.option_dict()}
            for m in self.mechanisms
        ]
        out["setting"]["class_floor"] = self.setting.class_floor
        return out


EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment(
            name="fig1",
            title="kl-paper: KL divergence vs privacy level",
            sweep="epsilon",
            values=EPSILON_GRID,
            mechanisms=(KL_PAPER,),
            trials=200,
            quick_values=(0.3, 1.0, 5.0),
            quick_trials=3,
            paper_claim=(
                "Figure 1: mean KL of the proposed method and its 95% confidence interval over "
                "200 trials, decreasing as epsilon grows."
            ),
        ),
        Experiment(
            name="fig2",
            title="KL divergence vs privacy level, all mechanisms",
            sweep="epsilon",
            values=EPSILON_GRID,
            mechanisms=(KL_PAPER, KL_CERTIFIED, *BASELINES, LAPLACE_LF, R1SMG, PPE_GAUSSIAN),
            quick_values=(0.3, 1.0, 5.0),
            paper_claim=(
                "Figure 2: the proposed method has a significantly smaller KL than every "
                "baseline at every epsilon; R1SMG is far worse for small d. The text says KL "
                "grows with epsilon."
            ),
        ),
        Experiment(
            name="fig3",
            title="KL divergence vs data size N ($\\epsilon$ = 1)",
            sweep="n_samples",
            values=(100, 200, 500, 1000, 2000, 5000, 10000),
            mechanisms=(KL_PAPER, KL_CERTIFIED, *BASELINES, PPE_GAUSSIAN),
            quick_values=(200, 1000, 5000),
            paper_claim="Figure 3: KL decreases as N grows, for every mechanism (epsilon = 1).",
        ),
        Experiment(
            name="fig4",
            title="KL divergence vs number of classes K (N = 1000, $\\epsilon$ = 1)",
            sweep="n_classes",
            values=(2, 3, 4, 5, 6, 8, 10, 15, 20),
            mechanisms=(KL_PAPER, KL_CERTIFIED, *BASELINES, PPE_GAUSSIAN),
            quick_values=(2, 5, 10),
            paper_claim=(
                "Figure 4: KL grows with K; the proposed method is much less sensitive to K "
                "than the baselines."
            ),
        ),
        Experiment(
            name="fig5",
            title="KL divergence vs dimension d (K = 5, N = 1000, $\\epsilon$ = 1)",
            sweep="n_features",
            values=(1, 2, 3, 4, 5, 6, 8, 10),
            mechanisms=(KL_PAPER, KL_CERTIFIED, *BASELINES, PPE_GAUSSIAN),
            quick_values=(2, 3, 5),
            paper_claim="Figure 5: every mechanism deteriorates significantly as d grows.",
        ),
        Experiment(
            name="fig13",
            title="kl-paper, record-level adjacency: KL vs clipping bound B ($\\epsilon$ = 1)",
            sweep="norm_bound",
            values=(1.0, 2.0, 3.0, 5.0, 7.0, 10.0, 15.0, 20.0, 30.0, 50.0),
            mechanisms=(
                MechanismSpec(
                    "kl-paper", "KL-minimising (kl-paper), change-one-record",
                    (("adjacency", "change-one-record"),),
                ),
            ),
            record_level=True,
            quick_values=(2.0, 10.0, 50.0),
            paper_claim=(
                "Figure 13: under record-level adjacency with rows clipped to norm B, a "
                "smaller B requires larger noise and gives a larger KL (epsilon = 1)."
            ),
        ),
    )
}


def get_experiment(name: str) -> Experiment:
    """The experiment called ``name`` (``fig1`` .. ``fig5``, ``fig13``)."""
    try:
        return EXPERIMENTS[name]
    except KeyError:
        raise ValueError(
            f"unknown experiment {name!r}; allowed: {', '.join(EXPERIMENTS)}"
        ) from None
