import pytest


def synthetic_gmm_data(N=1000, K=5, d=3, seed=42):
    """The paper's synthetic setting (:func:`klrelease.experiments.synthetic_data`)."""
    from klrelease.experiments import synthetic_data

    return synthetic_data(N, K, d, seed)


@pytest.fixture
def synthetic():
    return synthetic_gmm_data()


@pytest.fixture
def iris():
    from klrelease import load_dataset

    return load_dataset("iris")


#: Public bounds in the data's units for the learners that need them (required options), at
#: values that suit the unit-scale test mixtures.
LEARNER_SCALES = {
    "kamath-pgme-lite": {"R": 10.0, "sigma_min": 0.1, "sigma_max": 3.0},
    "kamath-sa-lite": {"R": 10.0, "sigma_min": 0.1, "sigma_max": 3.0},
    "kamath-pegme": {"sigma_min": 0.5},
    "afzali-style-sample-aggregate": {"sigma_max": 3.0},
    "dp-em": {"R": 10.0, "sigma_max": 3.0},
    "park-dp-em": {"R": 10.0, "sigma_max": 3.0},
}


def learner_options(name, **options):
    """``options`` that learner ``name`` accepts, with its required bounds
    (:data:`LEARNER_SCALES`) unless given: one option set for a loop over learners."""
    from klrelease.learners import get_learner
    from klrelease.learners.result import learner_options as accepted

    known = accepted(get_learner(name))
    out = {k: v for k, v in LEARNER_SCALES.get(name, {}).items() if k not in options}
    out.update({k: v for k, v in options.items() if k in known})
    return out
