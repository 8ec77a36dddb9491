"""``klrelease plot RELEASE [--data FILE --label-column C] [--features F] --out FIG.png``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import BadInput, Force, app, atomic_output, check_output, err_console

__all__ = ["plot_command"]


#: The most histogram bins a plot draws (a figure has a few hundred pixels per panel).
MAX_BINS = 10_000


@app.command("plot")
def plot_command(
    artifact: Annotated[Path, typer.Argument(help="a release artifact or a learner's (JSON)")],
    out: Annotated[Path, typer.Option(help="PNG file to write")] = Path("release.png"),
    data: Annotated[Path | None, typer.Option(
        help="CSV of the data (header row): its per-class histograms are drawn too")] = None,
    label_column: Annotated[str | None, typer.Option(help="label column of --data")] = None,
    features: Annotated[str | None, typer.Option(
        help="comma-separated feature names or indices (default: all)")] = None,
    bins: Annotated[int, typer.Option(help="histogram bins")] = 20,
    force: Force = False,
):
    """Plot the per-class marginal density of every feature of a release."""
    import matplotlib.pyplot as plt

    from ..artifact import load_model
    from ..data import load_csv
    from ..plot import marginals

    if out.suffix.lower() != ".png":
        raise BadInput(f"--out must name a .png file, got {out}")
    check_output(out, force)
    if not 1 <= bins <= MAX_BINS:
        raise BadInput(f"--bins must be between 1 and {MAX_BINS}, got {bins}")
    if (data is None) != (label_column is None):
        raise BadInput("give --data and --label-column together")
    rel = load_model(artifact)
    pair = None
    if data is not None:
        X, y, names = load_csv(data, label_column)
        generic = [f"x{j}" for j in range(rel.gmm.n_features)]
        if rel.feature_names not in ([], generic) and list(names) != list(rel.feature_names):
            raise BadInput(f"the columns of {data} are not the features of the release "
                           f"({', '.join(rel.feature_names)})")
        pair = (X, y)
    feats = None if features is None else [f.strip() for f in features.split(",")]
    fig = marginals(rel, pair, features=feats, bins=bins,
                    title=f"{getattr(rel, 'learner', None) or rel.mechanism} release, "
                          f"epsilon={rel.privacy.epsilon:g}, "
                          f"{'certified' if rel.privacy.certified else 'NOT certified'}")
    with atomic_output(out, "wb", force=force) as fh:
        fig.savefig(fh, format="png", dpi=110)
    plt.close(fig)
    err_console.print(f"wrote {out}")
