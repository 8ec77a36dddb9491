"""The figure of an experiment: KL per mechanism on a log scale, in two panels.

Left: the mean KL over trials, with error bars and a shaded band for the bootstrap 95%
confidence interval of that mean (what the paper plots). Right: the median over trials with
the interquartile range, because the KL of a dataset with a very small class is orders of
magnitude above the typical one and the mean follows those few datasets. For ``kl-paper`` the
design objective (12) is drawn dashed in the same colour, because it is not the KL it is meant
to approximate. Under record-level adjacency the KL against the GMM of the unclipped rows is
dotted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .settings import SWEEPS, Experiment

__all__ = ["plot_experiment", "failure_lines"]

_LOG_X = {"epsilon", "n_samples", "norm_bound"}


def _series(summary, mech, key, centre="mean"):
    recs = [r for r in summary if r["mechanism"] == mech]
    x = np.array([float(r["x"]) for r in recs])
    if centre == "mean":
        names = (f"{key}_mean", f"{key}_ci_low", f"{key}_ci_high")
    else:
        names = (f"{key}_median", f"{key}_q25", f"{key}_q75")
    mid, lo, hi = (np.array([r.get(n, np.nan) for r in recs], dtype=float) for n in names)
    return x, mid, lo, hi


def _draw(ax, x, mean, lo, hi, colour, label, style="-", marker="o"):
    ok = np.isfinite(mean) & (mean > 0)
    if not np.any(ok):
        return
    x, mean, lo, hi = x[ok], mean[ok], lo[ok], hi[ok]
    has_ci = np.isfinite(lo) & np.isfinite(hi)
    lo = np.where(has_ci, np.maximum(lo, mean * 1e-3), mean)
    hi = np.where(has_ci, hi, mean)
    ax.errorbar(x, mean, yerr=[mean - lo, hi - mean], color=colour, linestyle=style,
                marker=marker, markersize=4, capsize=3, linewidth=1.4, label=label)
    ax.fill_between(x, lo, hi, color=colour, alpha=0.15, linewidth=0)


def failure_lines(summary: list[dict], labels: dict[str, str]) -> list[str]:
    """One line per mechanism with results that are not a KL: how many were its own FAIL
    output (a result of the mechanism, which its proof covers) and how many errors."""
    lines = []
    failed = [r for r in summary if r.get("n_failed")]
    for m in dict.fromkeys(r["mechanism"] for r in failed):
        recs = [r for r in summary if r["mechanism"] == m]
        xs = [f"{r['x']:g}" for r in recs if r.get("n_failed")]
        n_fail = sum(r.get("n_fail", 0) for r in recs)
        n_error = sum(r["n_failed"] for r in recs) - n_fail
        what = " and ".join(part for part in (
            f"FAIL (the mechanism's output) in {n_fail}" if n_fail else "",
            f"error in {n_error}" if n_error else "") if part)
        lines.append(f"{labels.get(m, m)}: {what} of {sum(r['n_trials'] for r in recs)} "
                     f"results (x = {', '.join(xs)}; see the CSV)")
    return lines


def plot_experiment(exp: Experiment, summary: list[dict], labels: dict[str, str],
                    path: Path) -> Path:
    """Draw the figure of ``exp`` from its summary records and save it as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, 2, figsize=(12.0, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    mechs = list(dict.fromkeys(r["mechanism"] for r in summary))
    extra = (("objective", "design objective (12)", "--", "s"),
             ("kl_vs_raw", "KL vs unclipped GMM", ":", "^"))
    for ax, centre in zip(axes, ("mean", "median"), strict=True):
        for i, m in enumerate(mechs):
            c = colours[i % len(colours)]
            _draw(ax, *_series(summary, m, "kl", centre), c, f"{labels.get(m, m)}: exact KL")
            recs = [r for r in summary if r["mechanism"] == m]
            for key, what, style, marker in extra:
                if any(f"{key}_{centre}" in r for r in recs):
                    _draw(ax, *_series(summary, m, key, centre), c,
                          f"{labels.get(m, m)}: {what}", style=style, marker=marker)
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())
        if exp.sweep in _LOG_X:
            ax.set_xscale("log")
        ax.set_xticks([float(v) for v in exp.values], [f"{v:g}" for v in exp.values])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(SWEEPS[exp.sweep])
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("KL(released || non-private)")
    axes[0].set_title("mean over datasets, 95% bootstrap CI", fontsize=9)
    axes[1].set_title("median over datasets, interquartile range", fontsize=9)
    lines = failure_lines(summary, labels)
    if lines:  # results that failed are stated on the figure, not dropped silently
        fig.text(0.01, 0.01, "\n".join(lines), fontsize=7, color="crimson", va="bottom")
    bottom = 0.02 * len(lines) + (0.01 if lines else 0.0)
    # one legend below both panels: inside a panel it covered curves (fig2's kl-certified)
    handles, names = axes[0].get_legend_handles_labels()
    ncol = 3
    rows = -(-len(names) // ncol)
    legend_h = 0.035 * rows + 0.01
    if handles:
        fig.legend(handles, names, loc="lower center", ncol=ncol, fontsize=7, frameon=False,
                   bbox_to_anchor=(0.5, bottom))
    fig.set_size_inches(12.0, 4.8 + 4.8 * (legend_h + bottom))
    fig.suptitle(f"{exp.name}: {exp.title}  ({exp.trials} datasets x {exp.n_draws} releases)",
                 fontsize=10)
    fig.tight_layout(rect=(0.0, bottom + legend_h, 1.0, 1.0))
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
