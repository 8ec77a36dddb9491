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
