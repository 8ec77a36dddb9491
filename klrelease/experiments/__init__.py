"""The paper's synthetic experiments (figures 1-5 and 13), reproducible from one command.

``klrelease experiment fig2`` (or :func:`run_experiment`) draws the paper's synthetic datasets
(:mod:`.synthetic`), runs every mechanism of the figure on them (:mod:`.runner`), summarises
the exact KL over trials (:mod:`.summary`), draws the figure (:mod:`.figures`) and writes a
results folder with the CSV of every trial, the PNG and a JSON of settings, versions and wall
time (:mod:`.run`). The settings of each figure are in :mod:`.settings`.

The real-data figures 6-12 (Iris, load profiles, MNIST) are in :mod:`.real`
(:func:`run_real_experiment`), their data preparation in :mod:`.realdata`.
"""

from .real import REAL_EXPERIMENTS, RealExperiment, run_real_experiment
from .run import ExperimentResult, run_experiment
from .settings import EXPERIMENTS, Experiment, MechanismSpec, SyntheticSetting, get_experiment
from .synthetic import SyntheticData, draw_synthetic, synthetic_data

__all__ = [
    "EXPERIMENTS",
    "REAL_EXPERIMENTS",
    "RealExperiment",
    "Experiment",
    "ExperimentResult",
    "MechanismSpec",
    "SyntheticData",
    "SyntheticSetting",
    "draw_synthetic",
    "synthetic_data",
    "get_experiment",
    "run_experiment",
    "run_real_experiment",
]
