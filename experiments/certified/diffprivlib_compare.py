"""kl-certified against diffprivlib's GaussianNB at the same guarantee.

diffprivlib's ``GaussianNB`` (0.6.6) releases class counts, means and per-feature variances
with epsilon-DP for one record added or removed. A label flip or a replaced record is one
removal plus one addition, so at a budget ``eps`` for our relations the comparable diffprivlib
model is fitted at ``eps / 2`` (delta 0). Its released model is read as a labelled GMM with
diagonal covariances and compared by E[KL(release || non-private GMM)] with kl-certified's
label-flip release at ``(eps, 1e-5)``.

diffprivlib 0.6.6 does not import with scikit-learn >= 1.7, which this library needs, so this
script creates a separate virtual environment (``--venv``, default
``experiments/certified/.diffprivlib-venv``, not committed) with ``diffprivlib==0.6.6`` and
``scikit-learn<1.7`` and fits GaussianNB there in a subprocess.

    python experiments/certified/diffprivlib_compare.py --draws 100

Writes ``diffprivlib.md`` next to this file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np

import klrelease as kr
from klrelease.experiments.settings import SyntheticSetting
from klrelease.experiments.synthetic import draw_synthetic

HERE = Path(__file__).resolve().parent
EPSILONS = (0.5, 1.0, 2.0, 5.0)

WORKER = r"""
import json, sys, warnings
import numpy as np
from diffprivlib.models import GaussianNB
warnings.simplefilter("ignore")
job = json.load(sys.stdin)
X, y = np.asarray(job["X"]), np.asarray(job["y"])
out = []
for i in range(job["draws"]):
    m = GaussianNB(epsilon=job["epsilon"], bounds=(job["lower"], job["upper"]),
                   priors=None, random_state=job["seed"] + i)
    m.fit(X, y)
    out.append({"counts": m.class_count_.tolist(), "means": m.theta_.tolist(),
                "vars": m.var_.tolist()})
json.dump(out, sys.stdout)
"""


def ensure_venv(path: Path) -> Path:
    py = path / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "diffprivlib==0.6.6",
                        "scikit-learn<1.7", "numpy<2.3"], check=True)
    return py


def diffprivlib_kl(py, data, ref, eps, draws, lower, upper):
    job = {"X": data.X.tolist(), "y": data.codes.tolist(), "epsilon": eps, "draws": draws,
           "lower": list(map(float, lower)), "upper": list(map(float, upper)),
           "K": data.n_classes, "seed": 1000}
    res = subprocess.run([str(py), "-c", WORKER], input=json.dumps(job), capture_output=True,
                         text=True, check=True)
    kls = []
    for r in json.loads(res.stdout):
        counts = np.maximum(np.asarray(r["counts"]), 0.5)
        var = np.maximum(np.asarray(r["vars"]), 1e-12)
        g = kr.GMM(counts / counts.sum(), np.asarray(r["means"]),
                   np.stack([np.diag(v) for v in var]), data.classes)
        kls.append(kr.kl_divergence(g, ref))
    return float(np.mean(kls))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--venv", type=Path, default=HERE / ".diffprivlib-venv")
    args = ap.parse_args(argv)
    py = ensure_venv(args.venv)
    s = draw_synthetic(SyntheticSetting(), np.random.default_rng(42))
    sets = [("iris", kr.load_dataset("iris")),
            ("synthetic", kr.as_labelled_data(s.X, s.y, classes=range(5), min_class_size=0,
                                              bounds=(np.full(3, -15.0), np.full(3, 15.0))))]
    lines = ["# kl-certified against diffprivlib's GaussianNB", "",
             f"`python experiments/certified/diffprivlib_compare.py --draws {args.draws}`: "
             "E[KL] of kl-certified (label flip, delta = 1e-5) at eps against diffprivlib 0.6.6 "
             "`GaussianNB` at eps/2 (a flip or replacement is a removal plus an addition), "
             "fitted with the dataset's public box in a separate environment "
             "(scikit-learn < 1.7).", "",
             "| dataset | eps | kl-certified | diffprivlib GaussianNB (eps/2) | ratio |",
             "|---|---|---|---|---|"]
    for name, data in sets:
        fit = kr.fit_gmm(data.X, data.codes)
        ref = kr.GMM(fit.weights, fit.means, fit.covariances, data.classes)
        lower, upper = data.bounds
        for eps in EPSILONS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                p = kr.plan(data, None, epsilon=eps, delta=1e-5)
                ours = kr.expected_kl(p, ref, n_draws=args.draws, seed=7).mean
            theirs = diffprivlib_kl(py, data, ref, eps / 2, args.draws, lower, upper)
            lines.append(f"| {name} | {eps:g} | {ours:.4g} | {theirs:.4g} | "
                         f"{theirs / ours:.1f}x |")
            print(lines[-1], flush=True)
    (HERE / "diffprivlib.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
