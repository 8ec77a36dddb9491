import numpy as np
import pytest


def synthetic_gmm_data(N=1000, K=5, d=3, seed=42):
    """The paper's synthetic setting: Dirichlet(1) weights, means U[-10, 10]^d,
    covariances Wishart(d + 1, I); classes with fewer than d + 2 points are topped up."""
    from scipy.stats import wishart

    rng = np.random.default_rng(seed)
    w = rng.dirichlet(np.ones(K))
    means = rng.uniform(-10, 10, size=(K, d))
    covs = [np.atleast_2d(wishart(df=d + 1, scale=np.eye(d)).rvs(random_state=rng))
            for _ in range(K)]
    y = rng.choice(K, size=N, p=w)
    y[: K * (d + 2)] = np.repeat(np.arange(K), d + 2)
    X = np.stack([rng.multivariate_normal(means[k], covs[k]) for k in y])
    return X, y


@pytest.fixture
def synthetic():
    return synthetic_gmm_data()


@pytest.fixture
def iris():
    from klrelease import load_dataset

    return load_dataset("iris")
