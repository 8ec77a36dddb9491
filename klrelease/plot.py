"""Plots of a release: the per-class marginal density of every feature.

``marginals(release)`` draws a grid with one column per class and one row per feature; each
panel shows the density of that feature under the class's Gaussian, N(mu_kj, Sigma_kjj). Given
several releases (a mapping from legend label to release) they are overlaid. Given the data
(``data=``), each panel also shows the histogram of the class's rows (grey bars), and given a
``reference`` GMM (e.g. the non-private fit) its density is drawn as a black dashed line.

A release is public, so a plot of it alone is too. A plot with the data's histogram or the
non-private GMM shows private statistics: it is for the data owner, not for publication.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .data import LabelledData, as_labelled_data
from .gmm import GMM

__all__ = ["marginals", "resolve_features"]


def _as_gmm(obj) -> GMM:
    if isinstance(obj, GMM):
        return obj
    gmm = getattr(obj, "gmm", None)  # a Release
    if isinstance(gmm, GMM):
        return gmm
    raise ValueError("expected a GMM or a Release")


def resolve_features(features, n_features: int, names: Sequence[str] = ()) -> list[int]:
    """Feature indices from indices or names (``None``: every feature)."""
    if features is None:
        return list(range(n_features))
    if isinstance(features, (str, int, np.integer)):
        features = [features]
    out = []
    for f in features:
        if isinstance(f, str) and f in names:
            out.append(list(names).index(f))
            continue
        try:
            j = int(f)
        except (TypeError, ValueError):
            raise ValueError(f"unknown feature {f!r}; give a name or an index") from None
        if not 0 <= j < n_features:
            raise ValueError(f"feature index {j} is out of range (0..{n_features - 1})")
        out.append(j)
    if not out:
        raise ValueError("features must name at least one feature")
    return out


def _density(g: GMM, k: int, j: int, grid: np.ndarray) -> np.ndarray:
    var = float(g.covariances[k, j, j])
    if not np.isfinite(var) or var <= 0:
        return np.full_like(grid, np.nan)
    return np.exp(-0.5 * (grid - g.means[k, j]) ** 2 / var) / np.sqrt(2 * np.pi * var)


def marginals(
    release,
    data=None,
    *,
    reference: GMM | None = None,
    features=None,
    classes=None,
    bins: int = 20,
    out: str | Path | None = None,
    title: str | None = None,
    reference_label: str = "non-private GMM",
    feature_names: Sequence[str] | None = None,
):
    """Per-class marginal densities of a release (one column per class, one row per feature).

    Parameters
    ----------
    release : GMM, Release, or mapping of label -> GMM/Release
        What to draw; several releases are overlaid in the legend's order.
    data : LabelledData or (X, y), optional
        The data; its per-class histogram is drawn in grey (the labels must be classes of the
        release).
    reference : GMM, optional
        Drawn as a black dashed line (e.g. the non-private GMM).
    features : sequence of int or str, optional
        Features to draw (indices or names); default all.
    classes : sequence, optional
        Class labels to draw; default all classes of the (first) release.
    bins : int
        Histogram bins.
    out : path, optional
        Where to save the PNG.
    title : str, optional
        Figure title.
    feature_names : sequence of str, optional
        Names of the features (default: those of the first release or the data, else x0..).

    Returns
    -------
    matplotlib.figure.Figure
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = dict(release) if isinstance(release, Mapping) else {"release": release}
    if not items:
        raise ValueError("nothing to plot: no release given")
    gmms = {label: _as_gmm(r) for label, r in items.items()}
    first_obj = next(iter(items.values()))
    first = next(iter(gmms.values()))
    K, d = first.n_components, first.n_features
    for label, g in gmms.items():
        if g.n_features != d or list(g.classes) != list(first.classes):
            raise ValueError(f"release {label!r} does not have the same classes and features")
    if reference is not None and (reference.n_features != d
                                  or list(reference.classes) != list(first.classes)):
        raise ValueError("reference must have the same classes and features as the release")
    lab = None
    if data is not None:
        data_names = None
        if isinstance(data, LabelledData):
            y = np.asarray(data.classes, dtype=object)[data.codes]
            X, data_names = data.X, data.feature_names
        else:
            try:
                X, y = data
            except (TypeError, ValueError):
                raise ValueError("data must be a LabelledData or a pair (X, y)") from None
        lab = as_labelled_data(X, y, classes=first.classes, min_class_size=1,
                               feature_names=data_names)
        if lab.n_features != d:
            raise ValueError(f"data has {lab.n_features} features; the release has {d}")
    default = [f"x{j}" for j in range(d)]
    own = list(getattr(first_obj, "feature_names", None) or ())
    if lab is not None and own in ([], default):  # the data's names beat generic ones
        own = list(lab.feature_names)
    names = list(feature_names or own or default)
    if len(names) != d:
        names = [f"x{j}" for j in range(d)]
    feats = resolve_features(features, d, names)
    if classes is None:
        ks = list(range(K))
    else:
        index = {c: i for i, c in enumerate(first.classes)}
        try:
            ks = [index[c] for c in classes]
        except KeyError as exc:
            raise ValueError(f"{exc.args[0]!r} is not a class of the release") from None

    nr, nc = len(feats), len(ks)
    fig, axes = plt.subplots(nr, nc, figsize=(2.6 * nc + 0.6, 1.9 * nr + 0.9), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for r, j in enumerate(feats):
        for c, k in enumerate(ks):
            ax = axes[r, c]
            if lab is not None and np.any(lab.codes == k):
                v = lab.X[lab.codes == k, j]
                lo, hi = float(v.min()), float(v.max())
            else:
                mu, sd = first.means[k, j], np.sqrt(max(first.covariances[k, j, j], 1e-12))
                lo, hi = mu - 3 * sd, mu + 3 * sd
            if reference is not None:
                mu = reference.means[k, j]
                sd = np.sqrt(max(reference.covariances[k, j, j], 1e-12))
                lo, hi = min(lo, mu - 3 * sd), max(hi, mu + 3 * sd)
            pad = 0.15 * (hi - lo) if hi > lo else 1.0
            grid = np.linspace(lo - pad, hi + pad, 400)
            if lab is not None and np.any(lab.codes == k):
                ax.hist(lab.X[lab.codes == k, j], bins=bins, density=True, color="0.75",
                        edgecolor="0.6", linewidth=0.4, label="data (histogram)")
            if reference is not None:
                ax.plot(grid, _density(reference, k, j, grid), "k--", linewidth=1.3,
                        label=reference_label)
            for i, (label, g) in enumerate(gmms.items()):
                ax.plot(grid, _density(g, k, j, grid), color=colours[i % len(colours)],
                        linewidth=1.3, label=label)
            ax.set_xlim(grid[0], grid[-1])
            ax.tick_params(labelsize=7)
            if r == 0:
                ax.set_title(f"class {first.classes[k]}", fontsize=9)
            if c == 0:
                ax.set_ylabel(names[j], fontsize=8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    width, height = fig.get_size_inches()
    ncol = max(1, min(len(labels), int(width // 3.2)))
    legend_rows = -(-len(labels) // ncol)
    fig.legend(handles, labels, loc="upper center", ncol=ncol, fontsize=8,
               bbox_to_anchor=(0.5, 1.0), frameon=False)
    if title:
        fig.suptitle(title, fontsize=9, y=0.005, va="bottom")
    height += 0.2 * legend_rows - 0.5
    fig.set_size_inches(width, height)
    fig.tight_layout(rect=(0, 0.3 / height if title else 0, 1,
                           1 - (0.19 * legend_rows + 0.05) / height))
    if out is not None:
        fig.savefig(Path(out), dpi=110)
    return fig
