"""The paper's real-data experiments (figures 6-12), one command each.

``klrelease experiment fig6`` (or :func:`run_real_experiment`) prepares the data
(:mod:`.realdata`), designs every mechanism of the figure on it, draws releases, and writes a
results folder with a CSV (one row per release or per dataset), a PNG and a JSON of settings,
versions, guarantees and wall time, like the synthetic figures (:mod:`.run`).

* ``fig6``  Iris (standardised): E[KL(release || non-private)] against epsilon, every mechanism.
* ``fig7``  Iris at epsilon = 2: per class, the released density of the first feature against
  the data's histogram and the non-private GMM, for kl-paper, kl-certified and the baseline
  with the smallest E[KL] at epsilon = 2 (chosen in the same run, recorded).
* ``fig8``  load profiles: E[KL] against epsilon on the ItalyPowerDemand stand-in and on
  synthetic datasets with the paper's Table I class sizes (two panels, labelled).
* ``fig9``  load profiles at epsilon = 2: every dimension's density per class.
* ``fig10`` MNIST (PCA, d = 5): E[KL] against epsilon.
* ``fig11`` MNIST: test accuracy of the released GMM used as a maximum-likelihood classifier
  (:meth:`klrelease.GMM.predict`) against epsilon, with the non-private GMM's accuracy.
* ``fig12`` MNIST: test accuracy of an MLP trained on 5,000 rows sampled from a release
  (class histogram fixed by the released weights) against the training iteration.

Randomness. On a fixed dataset the mechanism is designed once per (epsilon, mechanism) and
release ``t`` is drawn from the stream ``(seed, t, 1, i, crc32(mechanism id))`` (``i`` the
index of epsilon), so a release does not depend on how many others are drawn. The Table I
synthetic datasets are drawn from ``(seed, t, 0)``. Every run is seeded: an experiment, not a
secure release.

A mechanism that raises (bad input, solver failure, or a refusal by design) gives a row with
``status = "error"`` and the one-line message; nothing is silently dropped.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import time
import warnings
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from ..gmm import GMM, fit_gmm
from ..kl import kl_divergence
from ..learners.result import MechanismFailed
from ..mechanisms import get_mechanism
from ..mechanisms import mechanisms as registered_mechanisms
from ..release import plan as make_plan
from .realdata import _labels, iris_standardised, italy_power, mnist_split, table1_synthetic
from .run import _clean, _git_revision, _versions, progress_bar
from .runner import _guarantee_record, _one_line
from .settings import (
    BASELINES,
    EPSILON_GRID,
    KL_CERTIFIED,
    KL_PAPER,
    LAPLACE_LF,
    PPE_GAUSSIAN,
    R1SMG,
    MechanismSpec,
)
from .summary import mean_ci, summarise

__all__ = [
    "KL_CERTIFIED",
    "REAL_EXPERIMENTS",
    "RealExperiment",
    "RealResult",
    "run_real_experiment",
]

#: Every mechanism of the real-data figures; ``ppe-gaussian`` returns FAIL at these sizes,
#: recorded as FAIL rows.
ALL_MECHANISMS = (KL_PAPER, KL_CERTIFIED, *BASELINES, LAPLACE_LF, R1SMG, PPE_GAUSSIAN)

DATASET_TITLES = {
    "iris": "Iris, standardised (N=150, K=3, d=4)",
    "italy-power": "ItalyPowerDemand days 08-19 h, K-means K=6 (N=1096, d=12)",
    "table1-synthetic": "SYNTHETIC: Table I class sizes (N=1409, K=6, d=12)",
    "mnist": "MNIST 5,000 training images, PCA d=5 (K=10)",
}


@dataclass(frozen=True)
class RealExperiment:
    """One real-data figure.

    Attributes
    ----------
    name, title : str
    kind : {"kl", "accuracy", "marginals", "mlp"}
        What the figure measures.
    datasets : tuple of str
        Keys of :data:`DATASET_TITLES`.
    values : tuple of float
        The epsilons (for ``marginals``: the one epsilon drawn).
    mechanisms : tuple of MechanismSpec
    trials : int
        Releases per (epsilon, mechanism) on a fixed dataset; datasets for the synthetic
        Table I set (each with ``n_draws`` releases); MLP repetitions for ``mlp``.
    n_draws : int
        Releases per synthetic dataset.
    delta, lam : float
        delta, and kl-paper's lambda.
    seed : int
        Root seed of data splits, synthetic data and noise.
    paper_claim : str
    quick_values, quick_trials, quick_draws
        The reduced run of ``--quick``.
    """

    name: str
    title: str
    kind: str
    datasets: tuple[str, ...]
    values: tuple[float, ...]
    mechanisms: tuple[MechanismSpec, ...]
    trials: int = 50
    n_draws: int = 5
    delta: float = 1e-5
    lam: float = 1e-3
    seed: int = 42
    paper_claim: str = ""
    quick_values: tuple[float, ...] = ()
    quick_trials: int = 3
    quick_draws: int = 2
    notes: str = ""

    def configured(self, *, quick: bool = False, trials: int | None = None) -> RealExperiment:
        exp = self
        if quick:
            exp = replace(exp, values=self.quick_values or self.values[:3],
                          trials=self.quick_trials, n_draws=self.quick_draws)
        if trials is not None:
            if int(trials) < 1:
                raise ValueError(f"--trials must be >= 1, got {trials}")
            exp = replace(exp, trials=int(trials))
        return exp

    def to_dict(self) -> dict:
        out = asdict(self)
        out["mechanisms"] = [
            {"id": m.id, "name": m.name, "label": m.label, "options": m.option_dict()}
            for m in self.mechanisms
        ]
        return out


MNIST_EPS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)

REAL_EXPERIMENTS: dict[str, RealExperiment] = {
    e.name: e for e in (
        RealExperiment(
            "fig6", "Iris: KL divergence vs privacy level", "kl", ("iris",), EPSILON_GRID,
            ALL_MECHANISMS, trials=100, quick_values=(0.5, 2.0, 10.0),
            paper_claim=("Figure 6: the proposed method has a smaller KL than the baselines "
                         "at every epsilon (Iris, features standardised)."),
        ),
        RealExperiment(
            "fig7", "Iris, epsilon = 2: density of the first feature per class", "marginals",
            ("iris",), (2.0,), ALL_MECHANISMS, trials=50, quick_trials=3,
            paper_claim=("Figure 7: at epsilon = 2 the proposed method's class densities of "
                         "the first feature align with the histograms and the non-private "
                         "GMM more closely than the baseline's."),
        ),
        RealExperiment(
            "fig8", "Load profiles: KL divergence vs privacy level", "kl",
            ("italy-power", "table1-synthetic"), (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
            ALL_MECHANISMS, trials=20, n_draws=3, quick_values=(0.5, 10.0),
            quick_trials=2, quick_draws=1,
            paper_claim=("Figure 8: on the AMI load profiles (N = 1409, d = 12, K = 6) the "
                         "proposed method has a much smaller KL than the baselines."),
            notes=("trials = releases per (epsilon, mechanism) on the load profiles, and "
                   "synthetic datasets (n_draws releases each) on the Table I set."),
        ),
        RealExperiment(
            "fig9", "Load profiles, epsilon = 2: every dimension's density per class",
            "marginals", ("italy-power",), (2.0,), (KL_PAPER, KL_CERTIFIED), trials=1,
            quick_trials=1,
            paper_claim=("Figure 9: at epsilon = 2 the released densities of classes 1-4 "
                         "match the non-private GMM and the histograms; the small classes 5 "
                         "and 6 (14 and 31 houses) diverge in some dimensions."),
        ),
        RealExperiment(
            "fig10", "MNIST (PCA, d = 5): KL divergence vs privacy level", "kl", ("mnist",),
            MNIST_EPS, ALL_MECHANISMS, trials=50, quick_values=(0.5, 2.0, 10.0),
            quick_trials=2,
            paper_claim="Figure 10: the proposed method has a much smaller KL (MNIST, d = 5).",
        ),
        RealExperiment(
            "fig11", "MNIST: test accuracy of the released GMM classifier vs privacy level",
            "accuracy", ("mnist",), MNIST_EPS, ALL_MECHANISMS, trials=50,
            quick_values=(0.5, 2.0, 10.0), quick_trials=2,
            paper_claim=("Figure 11: the proposed method's accuracy is close to the "
                         "non-private GMM's; the baselines suffer from high distortion."),
        ),
        RealExperiment(
            "fig12", "MNIST: MLP trained on 5,000 rows sampled from a release", "mlp",
            ("mnist",), (0.2, 0.5, 1.0, 2.0, 10.0), (KL_PAPER, KL_CERTIFIED), trials=5,
            quick_values=(0.5, 5.0), quick_trials=1,
            paper_claim=("Figure 12: smaller epsilon gives lower accuracy, consistently "
                         "ordered; the MLP trained on non-private GMM samples is close to the "
                         "one trained on the real images."),
            notes=("MLP d -> 256 -> 128 -> 10, ReLU, softmax loss, plain SGD (momentum 0, no "
                   "L2 penalty), learning rate 0.01, mini-batches of 128, one epoch over "
                   "5,000 rows (40 iterations), scikit-learn MLPClassifier.partial_fit per "
                   "mini-batch; accuracy on the 5,000 test images after every iteration; "
                   "curves averaged over `trials` repetitions (release, sample, "
                   "initialisation)."),
        ),
    )
}


def get_real_experiment(name: str) -> RealExperiment:
    try:
        return REAL_EXPERIMENTS[name]
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; allowed: "
                         f"{', '.join(REAL_EXPERIMENTS)}") from None


# --------------------------------------------------------------------------- helpers

FIELDS = (
    "figure", "dataset", "trial", "x", "mechanism", "epsilon", "delta", "n_samples",
    "n_classes", "n_features", "n_draws", "kl_mean", "kl_std", "accuracy", "iteration",
    "certified", "plan_seconds", "status", "error",
)


def _stream(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


class _Ctx:
    """Per-run state: cached data, warnings, guarantees."""

    def __init__(self, exp: RealExperiment):
        self.exp = exp
        self.cache: dict = {}
        self.warnings: dict[str, Counter] = {}
        self.guarantees: dict[str, dict] = {}
        self.data_notes: dict[str, object] = {}

    def data(self, name: str, trial: int = 0):
        if name == "table1-synthetic":
            return table1_synthetic(_stream(self.exp.seed, trial, 0))
        if name not in self.cache:
            if name == "iris":
                self.cache[name] = iris_standardised()
            elif name == "italy-power":
                self.cache[name] = italy_power()
            elif name == "mnist":
                split = mnist_split(seed=self.exp.seed)
                self.cache["mnist-split"] = split
                self.data_notes["mnist_pca_explained_variance_ratio"] = [
                    float(v) for v in split.explained_variance_ratio]
                self.cache[name] = split.train
            else:
                raise ValueError(f"unknown dataset {name!r}")
        return self.cache[name]

    def plan(self, data, spec: MechanismSpec, eps: float):
        """Design ``spec`` on ``data`` (classes declared); warnings recorded, not shown."""
        options = spec.option_dict()
        if "lam" in get_mechanism(spec.name).options:
            options.setdefault("lam", self.exp.lam)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                p = make_plan(data.X, _labels(data), epsilon=eps, delta=self.exp.delta,
                              mechanism=spec.name, classes=data.classes, **options)
            finally:
                counter = self.warnings.setdefault(spec.id, Counter())
                for w in caught:
                    counter[f"{w.category.__name__}: {_one_line(w.message)}"] += 1
        if spec.id not in self.guarantees:
            self.guarantees[spec.id] = {**_guarantee_record(p), "recorded_at_epsilon": eps}
        return p

    def draw(self, p, spec: MechanismSpec, rng) -> GMM:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return p.draw(rng)
            finally:
                counter = self.warnings.setdefault(spec.id, Counter())
                for w in caught:
                    counter[f"{w.category.__name__}: {_one_line(w.message)}"] += 1


def _base_row(exp, dataset, data, trial, i, spec, n_draws) -> dict:
    return {
        "figure": exp.name, "dataset": dataset, "trial": trial, "x": exp.values[i],
        "mechanism": spec.id, "epsilon": exp.values[i], "delta": exp.delta,
        "n_samples": data.n_samples, "n_classes": data.n_classes,
        "n_features": data.n_features, "n_draws": n_draws,
    }


def _error(row, exc, t0) -> dict:
    """A failed result: ``FAIL`` for a mechanism's FAIL output, ``error`` otherwise."""
    status = "FAIL" if isinstance(exc, MechanismFailed) else "error"
    row.update(status=status, error=f"{type(exc).__name__}: {_one_line(exc)}",
               plan_seconds=time.perf_counter() - t0)
    return row


# --------------------------------------------------------------------------- KL / accuracy


def _run_sweep(ctx: _Ctx, mechs, advance) -> list[dict]:
    """E[KL] (and for ``accuracy`` the test accuracy) per release, every epsilon and mechanism."""
    exp, rows = ctx.exp, []
    for dataset in exp.datasets:
        synthetic = dataset == "table1-synthetic"
        n_sets = exp.trials if synthetic else 1
        n_rel = exp.n_draws if synthetic else exp.trials
        for s in range(n_sets):
            data = ctx.data(dataset, s)
            y = _labels(data)
            reference = fit_gmm(data.X, y, classes=data.classes)
            split = ctx.cache.get("mnist-split") if exp.kind == "accuracy" else None
            for i, eps in enumerate(exp.values):
                for spec in mechs:
                    crc = zlib.crc32(spec.id.encode())
                    t0 = time.perf_counter()
                    try:
                        p = ctx.plan(data, spec, eps)
                    except Exception as exc:  # recorded, never dropped
                        for t in [s] if synthetic else range(n_rel):
                            rows.append(_error(_base_row(exp, dataset, data, t, i, spec, 1),
                                               exc, t0))
                        advance()
                        continue
                    plan_s = time.perf_counter() - t0
                    per_set = []
                    for t in range(n_rel):
                        key = (s, t) if synthetic else (t,)
                        row = _base_row(exp, dataset, data, s if synthetic else t, i, spec, 1)
                        t1 = time.perf_counter()
                        try:
                            g = ctx.draw(p, spec, _stream(exp.seed, *key, 1, i, crc))
                            kl = float(kl_divergence(g, reference))
                            acc = None
                            if split is not None:
                                acc = float(np.mean(g.predict(split.X_test) == split.y_test))
                        except Exception as exc:  # a failed release: an error row
                            if synthetic:
                                per_set.append(f"{type(exc).__name__}: {_one_line(exc)}")
                            else:
                                rows.append(_error(row, exc, t1))
                            continue
                        row.update(kl_mean=kl, kl_std=0.0, accuracy=acc,
                                   certified=bool(p.guarantee.certified),
                                   plan_seconds=plan_s if t == 0 else 0.0,
                                   status="ok" if np.isfinite(kl) else "non-finite", error="")
                        if synthetic:
                            per_set.append(kl)
                        else:
                            rows.append(row)
                    if synthetic:
                        row = _base_row(exp, dataset, data, s, i, spec, n_rel)
                        failed = [v for v in per_set if isinstance(v, str)]
                        ok = np.array([v for v in per_set if not isinstance(v, str)], dtype=float)
                        if not ok.size:  # every draw failed
                            status = "FAIL" if failed[0].startswith("MechanismFailed") else "error"
                            row.update(status=status, error=failed[0], plan_seconds=plan_s)
                        else:  # as the synthetic figures: the draws that returned a model
                            # count, and n_draws says how many they are (the mean is over them)
                            row.update(n_draws=int(ok.size), kl_mean=float(ok.mean()),
                                       kl_std=float(ok.std(ddof=1)) if ok.size > 1 else 0.0,
                                       certified=bool(p.guarantee.certified),
                                       plan_seconds=plan_s,
                                       status="ok" if np.all(np.isfinite(ok)) else "non-finite",
                                       error=(f"FAIL in {len(failed)} of {len(per_set)} draws: "
                                              f"{failed[-1]}") if failed else "")
                        rows.append(row)
                    advance()
    return rows


def _accuracy_summary(rows, mechs, values) -> list[dict]:
    out = []
    for m in mechs:
        for x in values:
            acc = [r["accuracy"] for r in rows if r["mechanism"] == m and r["x"] == x
                   and r.get("status") == "ok" and r.get("accuracy") is not None]
            mean, lo, hi = mean_ci(acc)
            out.append({"mechanism": m, "x": x, "n_ok": len(acc), "accuracy_mean": mean,
                        "accuracy_ci_low": lo, "accuracy_ci_high": hi,
                        "accuracy_min": float(np.min(acc)) if acc else float("nan"),
                        "accuracy_max": float(np.max(acc)) if acc else float("nan")})
    return out


# --------------------------------------------------------------------------- marginals


def _run_marginals(ctx: _Ctx, mechs, advance, png: Path) -> tuple[list[dict], dict]:
    """Figures 7 and 9: one release per shown mechanism at the figure's epsilon, plotted."""
    from ..plot import marginals

    exp = ctx.exp
    dataset = exp.datasets[0]
    data = ctx.data(dataset)
    y = _labels(data)
    reference = fit_gmm(data.X, y, classes=data.classes)
    eps, i = exp.values[0], 0
    rows, extra = [], {}
    expected: dict[str, float] = {}
    plans: dict[str, object] = {}
    for spec in mechs:
        t0 = time.perf_counter()
        crc = zlib.crc32(spec.id.encode())
        try:
            p = ctx.plan(data, spec, eps)
        except Exception as exc:
            rows.append(_error(_base_row(exp, dataset, data, 0, i, spec, 1), exc, t0))
            advance()
            continue
        plans[spec.id] = p
        kls = []
        for t in range(exp.trials):
            row = _base_row(exp, dataset, data, t, i, spec, 1)
            t1 = time.perf_counter()
            try:
                kl = float(kl_divergence(ctx.draw(p, spec, _stream(exp.seed, t, 1, i, crc)),
                                         reference))
            except Exception as exc:
                rows.append(_error(row, exc, t1))
                continue
            kls.append(kl)
            row.update(kl_mean=kl, kl_std=0.0, certified=bool(p.guarantee.certified),
                       plan_seconds=time.perf_counter() - t1, status="ok", error="")
            rows.append(row)
        if kls:
            expected[spec.id] = float(np.mean(kls))
        advance()
    shown = [m for m in mechs if m.name in ("kl-paper", "kl-certified")]
    baselines = [m for m in mechs if m not in shown and m.id in expected]
    if baselines:
        best = min(baselines, key=lambda m: expected[m.id])
        shown.append(best)
        extra["best_baseline"] = best.id
    extra["expected_kl_at_epsilon"] = expected
    releases, drawn = {}, {}
    for spec in shown:
        if spec.id not in plans:
            continue
        crc = zlib.crc32(spec.id.encode())
        g = ctx.draw(plans[spec.id], spec, _stream(exp.seed, 0, 1, i, crc))  # release t = 0
        cert = "certified" if plans[spec.id].guarantee.certified else "not certified"
        releases[f"{spec.label} [{cert}]"] = g
        drawn[spec.id] = {"kl_of_drawn_release": float(kl_divergence(g, reference)),
                          "trial": 0}
    extra["plotted_releases"] = drawn
    features = [0] if exp.name == "fig7" else None
    fig = marginals(releases, data, reference=reference, features=features,
                    title=f"{exp.name}: {DATASET_TITLES[dataset]}, epsilon = {eps:g}, "
                          f"delta = {exp.delta:g}; one release each (seeded)",
                    reference_label="non-private GMM (2)")
    import matplotlib.pyplot as plt

    fig.savefig(png, dpi=110 if exp.name == "fig7" else 75)
    plt.close(fig)
    return rows, extra


# --------------------------------------------------------------------------- MLP


def _mlp_curve(X, y, X_test, y_test, seed: int) -> np.ndarray:
    """Test accuracy after every mini-batch of one SGD epoch (see figure 12's notes)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    # each partial_fit call is one SGD step on one mini-batch of 128 rows ("auto" = the whole
    # batch passed, at most 200), the last one holding the remaining rows
    mlp = MLPClassifier(hidden_layer_sizes=(256, 128), activation="relu", solver="sgd",
                        learning_rate_init=0.01, momentum=0.0, nesterovs_momentum=False,
                        alpha=0.0, batch_size="auto", random_state=int(rng.integers(2**31)))
    classes = np.arange(10)
    acc = []
    for start in range(0, len(y), 128):
        b = perm[start:start + 128]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            mlp.partial_fit(X[b], y[b], classes=classes)
        acc.append(float(np.mean(mlp.predict(X_test) == y_test)))
    return np.array(acc)


def _run_mlp(ctx: _Ctx, mechs, advance) -> tuple[list[dict], dict]:
    exp = ctx.exp
    data = ctx.data("mnist")
    split = ctx.cache["mnist-split"]
    y = _labels(data).astype(np.int64)
    reference = fit_gmm(data.X, y, classes=data.classes)
    n = data.n_samples
    rows: list[dict] = []
    curves: dict[str, list[np.ndarray]] = {}

    def add(key, label_x, spec_id, trial, curve, eps=None, cert=None):
        curves.setdefault(key, []).append(curve)
        for it, a in enumerate(curve, start=1):
            rows.append({"figure": exp.name, "dataset": "mnist", "trial": trial, "x": label_x,
                         "mechanism": spec_id, "epsilon": eps, "delta": exp.delta,
                         "n_samples": n, "n_classes": 10, "n_features": data.n_features,
                         "n_draws": 1, "accuracy": a, "iteration": it, "certified": cert,
                         "status": "ok", "error": ""})

    for t in range(exp.trials):
        add("real", "real", "real training images", t,
            _mlp_curve(data.X, y, split.X_test, split.y_test, exp.seed * 1000 + t))
        Xs, ys = reference.sample(n, _stream(exp.seed, t, 2), per_class="weights")
        add("non-private", "non-private", "non-private GMM samples", t,
            _mlp_curve(Xs, ys.astype(np.int64), split.X_test, split.y_test,
                       exp.seed * 1000 + t))
        advance()
    for i, eps in enumerate(exp.values):
        for spec in mechs:
            crc = zlib.crc32(spec.id.encode())
            t0 = time.perf_counter()
            try:
                p = ctx.plan(data, spec, eps)
            except Exception as exc:
                rows.append(_error(_base_row(exp, "mnist", data, 0, i, spec, 1), exc, t0))
                advance()
                continue
            for t in range(exp.trials):
                t1 = time.perf_counter()
                try:
                    g = ctx.draw(p, spec, _stream(exp.seed, t, 1, i, crc))
                    Xs, ys = g.sample(n, _stream(exp.seed, t, 3, i, crc), per_class="weights")
                    curve = _mlp_curve(Xs, ys.astype(np.int64), split.X_test, split.y_test,
                                       exp.seed * 1000 + t)
                except Exception as exc:
                    rows.append(_error(_base_row(exp, "mnist", data, t, i, spec, 1), exc, t1))
                    continue
                add(f"{spec.id}@{eps:g}", eps, spec.id, t, curve, eps,
                    bool(p.guarantee.certified))
            advance()
    summary = {k: {"mean": np.mean(v, axis=0).tolist(), "n": len(v),
                   "final_mean": float(np.mean([c[-1] for c in v])),
                   "final_min": float(np.min([c[-1] for c in v])),
                   "final_max": float(np.max([c[-1] for c in v]))}
               for k, v in curves.items()}
    gmm_acc = float(np.mean(reference.predict(split.X_test) == split.y_test))
    return rows, {"curves": summary, "non_private_gmm_classifier_accuracy": gmm_acc}


# --------------------------------------------------------------------------- figures


def _plot_kl(exp, summaries, labels, path, accuracy=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    from .figures import _draw, _series

    panels = [(d, "kl") for d in exp.datasets] if accuracy is None else [
        (exp.datasets[0], "kl"), (exp.datasets[0], "accuracy")]
    width = 6.4 * len(panels) + (2.6 if accuracy is not None else 0.0)
    fig, axes = plt.subplots(1, len(panels), figsize=(width, 4.8), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (dataset, what) in zip(axes[0], panels, strict=True):
        summary = summaries[dataset] if what == "kl" else accuracy["summary"]
        mechs = list(dict.fromkeys(r["mechanism"] for r in summary))
        # over datasets the KL is heavily skewed: the synthetic panel shows medians
        centre = "median" if dataset == "table1-synthetic" else "mean"
        failed = [labels.get(m, m) for m in mechs
                  if all(r.get("n_ok", 1) == 0 for r in summary if r["mechanism"] == m)]
        if failed:
            ax.text(0.0, -0.21, "no result (every run returned FAIL; see the CSV): "
                    + ", ".join(failed), transform=ax.transAxes, fontsize=7, va="top",
                    color="firebrick", zorder=5,
                    bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none"})
        for j, m in enumerate(mechs):
            c = colours[j % len(colours)]
            if what == "kl":
                _draw(ax, *_series(summary, m, "kl", centre), c, labels.get(m, m))
            else:
                recs = [r for r in summary if r["mechanism"] == m]
                x = np.array([r["x"] for r in recs], dtype=float)
                mid = np.array([r["accuracy_mean"] for r in recs], dtype=float)
                lo = np.array([r["accuracy_ci_low"] for r in recs], dtype=float)
                hi = np.array([r["accuracy_ci_high"] for r in recs], dtype=float)
                ok = np.isfinite(mid)
                ax.plot(x[ok], mid[ok], "o-", color=c, markersize=4, label=labels.get(m, m))
                band = ok & np.isfinite(lo) & np.isfinite(hi)
                ax.fill_between(x[band], lo[band], hi[band], color=c, alpha=0.15, linewidth=0)
        if what == "kl":
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_ylabel("E[KL(released || non-private)]")
            ax.set_title(DATASET_TITLES[dataset] + (
                "\nmedian over datasets, interquartile range" if centre == "median" else
                "\nmean over releases, 95% bootstrap CI"), fontsize=9)
        else:
            ax.axhline(accuracy["non_private"], color="k", linestyle="--",
                       label=f"non-private GMM ({accuracy['non_private']:.3f})")
            ax.axhline(0.1, color="0.5", linestyle=":", label="chance (0.1)")
            ax.set_ylim(0, 1)
            ax.set_ylabel("test accuracy (5,000 held-out images)")
            ax.set_title("released GMM as a maximum-likelihood classifier", fontsize=9)
        ax.set_xscale("log")
        ax.set_xticks([float(v) for v in exp.values], [f"{v:g}" for v in exp.values])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("privacy level $\\epsilon$")
        ax.grid(True, which="both", alpha=0.3)
        if what == "kl":
            ax.legend(fontsize=7, loc="best")
        else:  # outside: the accuracy curves fill the panel
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if "table1-synthetic" in exp.datasets:
        unit = f"releases per point; synthetic: datasets x {exp.n_draws} releases"
    else:
        unit = "releases per point"
    fig.suptitle(f"{exp.name}: {exp.title}\n(delta = {exp.delta:g}, {exp.trials} {unit})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_mlp(exp, extra, labels, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mechs = [m for m in exp.mechanisms]
    fig, axes = plt.subplots(1, len(mechs), figsize=(6.4 * len(mechs), 4.8), squeeze=False)
    cmap = plt.get_cmap("viridis")
    curves = extra["curves"]
    for ax, spec in zip(axes[0], mechs, strict=True):
        for j, eps in enumerate(exp.values):
            key = f"{spec.id}@{eps:g}"
            if key in curves:
                m = np.array(curves[key]["mean"])
                ax.plot(np.arange(1, m.size + 1), m, color=cmap(j / max(1, len(exp.values) - 1)),
                        label=f"$\\epsilon$ = {eps:g}")
        for key, colour, label in (("real", "k", "real training images"),
                                   ("non-private", "tab:red", "non-private GMM samples")):
            m = np.array(curves[key]["mean"])
            ax.plot(np.arange(1, m.size + 1), m, color=colour, linewidth=2, label=label)
        ax.set_xlabel("training iteration (mini-batch of 128)")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1)
        ax.grid(True, alpha=0.3)
        ax.set_title(f"MLP trained on samples of {labels.get(spec.id, spec.id)}", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{exp.name}: {exp.title}\n(mean of {exp.trials} runs per curve; "
                 "5,000 held-out test images)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- entry point


@dataclass(frozen=True)
class RealResult:
    """Where a run wrote its outputs, and what it measured."""

    experiment: RealExperiment
    directory: Path
    csv_path: Path
    png_path: Path
    json_path: Path
    rows: list[dict]
    summary: dict
    wall_seconds: float
    missing_mechanisms: list[str] = field(default_factory=list)


def _command(name, quick, trials, out) -> str:
    parts = ["klrelease", "experiment", name]
    if quick:
        parts.append("--quick")
    if trials is not None:
        parts += ["--trials", str(int(trials))]
    return " ".join([*parts, "--out", str(out)])


def _units(exp: RealExperiment, n_mechs: int) -> int:
    if exp.kind == "mlp":
        return exp.trials + len(exp.values) * n_mechs
    if exp.kind == "marginals":
        return n_mechs
    total = 0
    for d in exp.datasets:
        total += len(exp.values) * n_mechs * (exp.trials if d == "table1-synthetic" else 1)
    return total


def run_real_experiment(name: str, *, quick: bool = False, trials: int | None = None,
                        out: str | os.PathLike = "experiments",
                        progress: bool = True) -> RealResult:
    """Run the real-data figure ``name`` (``fig6`` .. ``fig12``); write CSV, PNG and JSON.

    Parameters
    ----------
    name : str
        ``fig6`` .. ``fig12``.
    quick : bool
        A reduced run (fewer epsilons, releases and repetitions), well under a minute.
    trials : int, optional
        Override the number of releases per point (datasets for the synthetic Table I set,
        repetitions for figure 12).
    out : path
        Parent folder of the results folder ``out/name/``.
    progress : bool
        Show a progress bar.

    Raises
    ------
    ValueError
        Unknown name or bad ``trials``; :class:`~.realdata.DataUnavailable` when the MNIST
        files are missing (figures 10-12), before anything is written.
    """
    exp = get_real_experiment(name).configured(quick=quick, trials=trials)
    names = set(registered_mechanisms())
    mechs = [m for m in exp.mechanisms if m.name in names]
    missing = [m.id for m in exp.mechanisms if m.name not in names]
    if not mechs:
        raise ValueError(f"none of the mechanisms of {name} is registered")
    ctx = _Ctx(exp)
    for d in exp.datasets:  # fail early (data absent) before creating the folder
        ctx.data(d, 0)
    directory = Path(out) / exp.name
    directory.mkdir(parents=True, exist_ok=True)
    csv_path, png_path, json_path = (directory / f"{exp.name}.{ext}"
                                     for ext in ("csv", "png", "json"))
    labels = {m.id: m.label for m in mechs}
    started = datetime.now(UTC)
    t0 = time.perf_counter()

    def body(advance):
        if exp.kind in ("kl", "accuracy"):
            return _run_sweep(ctx, mechs, advance), {}
        if exp.kind == "marginals":
            return _run_marginals(ctx, mechs, advance, png_path)
        return _run_mlp(ctx, mechs, advance)

    with progress_bar(exp.name, _units(exp, len(mechs)), progress) as advance:
        rows, extra = body(advance)

    ids = [m.id for m in mechs]
    summary: dict = {}
    if exp.kind in ("kl", "accuracy", "marginals"):
        summaries = {d: summarise([r for r in rows if r["dataset"] == d], ids,
                                  exp.values) for d in exp.datasets}
        summary["kl"] = summaries
    if exp.kind == "kl":
        _plot_kl(exp, summaries, labels, png_path)
    elif exp.kind == "accuracy":
        split = ctx.cache["mnist-split"]
        data = ctx.cache["mnist"]
        ref = fit_gmm(data.X, _labels(data), classes=data.classes)
        non_private = float(np.mean(ref.predict(split.X_test) == split.y_test))
        acc = {"summary": _accuracy_summary(rows, ids, exp.values),
               "non_private": non_private}
        summary["accuracy"] = acc["summary"]
        summary["non_private_gmm_classifier_accuracy"] = non_private
        _plot_kl(exp, summaries, labels, png_path, accuracy=acc)
    elif exp.kind == "mlp":
        _plot_mlp(exp, extra, labels, png_path)
    summary.update(extra)
    with open(csv_path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(FIELDS), extrasaction="raise")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if r.get(k) is None else
                                 f"{r[k]:.8g}" if isinstance(r.get(k), float) else str(r[k]))
                             for k in FIELDS})
    wall = time.perf_counter() - t0
    meta = {
        "experiment": exp.to_dict(),
        "datasets": {d: DATASET_TITLES[d] for d in exp.datasets},
        "quick": bool(quick),
        "command": _command(name, quick, trials, out),
        "seeded": "every draw is seeded (an experiment, not a secure release)",
        "started_utc": started.isoformat(timespec="seconds"),
        "wall_seconds": round(wall, 2),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "versions": _versions(),
        "git": _git_revision(),
        "missing_mechanisms": missing,
        "guarantees": ctx.guarantees,
        "warnings_recorded": {k: dict(v) for k, v in ctx.warnings.items() if v},
        "data_notes": ctx.data_notes,
        "failed_rows": sum(1 for r in rows if r.get("status") != "ok"),
        "errors": dict(Counter(f"{r['mechanism']}: {r['error']}" for r in rows
                               if r.get("status") != "ok")),
        "summary": summary,
        "files": {"csv": csv_path.name, "png": png_path.name},
    }
    json_path.write_text(json.dumps(_clean(meta), indent=2) + "\n")
    return RealResult(exp, directory, csv_path, png_path, json_path, rows, summary, wall,
                      missing)
