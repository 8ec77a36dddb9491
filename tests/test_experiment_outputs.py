"""What an experiment reports: a mechanism's FAIL outcomes are outcomes, not failures, and the
figure's legend covers no curve."""

import numpy as np

from klrelease.cli import main
from klrelease.experiments.figures import plot_experiment
from klrelease.experiments.settings import get_experiment


def test_fig2_quick_reports_fail_outcomes_not_failed_results(tmp_path, capsys):
    assert main(["experiment", "fig2", "--quick", "--out", str(tmp_path)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "results are FAIL outcomes of the mechanism (ppe-gaussian" in err
    assert "failed" not in err


def test_the_legend_is_outside_both_panels(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    exp = get_experiment("fig2").configured(quick=True)
    mechs = ["kl-paper", "kl-certified", "gaussian-iid", "ppe-gaussian"]
    summary = []
    for i, m in enumerate(mechs):
        for x in exp.values:
            rec = {"mechanism": m, "x": x, "n_trials": 2, "n_ok": 2, "n_failed": 0, "n_fail": 0}
            if m == "ppe-gaussian":
                rec.update(n_ok=0, n_failed=2, n_fail=2)
            else:
                kl = 10.0 ** (i - np.log10(float(x)))
                rec.update(kl_mean=kl, kl_ci_low=kl / 2, kl_ci_high=kl * 2, kl_median=kl,
                           kl_q25=kl / 2, kl_q75=kl * 2)
            summary.append(rec)
    captured = {}
    real_savefig = plt.Figure.savefig

    def keep(fig, *args, **kw):
        captured["fig"] = fig
        return real_savefig(fig, *args, **kw)

    plt.Figure.savefig = keep
    try:
        plot_experiment(exp, summary, {m: m for m in mechs}, tmp_path / "f.png")
    finally:
        plt.Figure.savefig = real_savefig
    fig = captured["fig"]
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent(renderer))
    texts = [t.get_text() for t in fig.texts]
    assert any("ppe-gaussian: FAIL (the mechanism's output) in" in t for t in texts)
