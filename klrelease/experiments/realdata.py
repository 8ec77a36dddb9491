"""The real datasets of the paper's section V-B to V-D, prepared as its experiments prepare them.

* Iris (:func:`iris_standardised`): the bundled 150 flowers, every feature standardised to
  zero mean and unit variance over the 150 rows, as the paper does.
* Load profiles (:func:`italy_power`): the bundled ItalyPowerDemand days, a 12-hour window,
  K = 6 classes by K-means (:func:`klrelease.data.load_italy_power`); and a synthetic stand-in
  with the class sizes of the paper's Table I (:func:`table1_synthetic`).
* MNIST (:func:`mnist_split`): only the 10,000-image test split is available; it is split at
  random into 5,000 training and 5,000 test images, and the pixels (scaled to [0, 1]) are
  projected on the first five principal components of the training images.

Under label-flip adjacency (the relation of these figures) the features are public and only
the labels are private, so every map computed from the features alone (standardisation, the
PCA basis, the data box of the baselines) is public preprocessing. The K-means classes of the
load profiles are a function of the features too; see ``data/README.md`` for what releasing
them assumes.

The MNIST files stay outside the repository. They are looked up in the folder named by the
environment variable ``KLRELEASE_MNIST_DIR`` or else in ``../shared/data/mnist`` relative to
the repository root; when they are absent, :class:`DataUnavailable` (a :class:`ValueError`)
names the folder.
"""

from __future__ import annotations

import functools
import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data import LabelledData, as_labelled_data, load_dataset

__all__ = [
    "MNIST_ENV",
    "TABLE1_SIZES",
    "DataUnavailable",
    "MnistSplit",
    "iris_standardised",
    "italy_power",
    "load_mnist_test",
    "mnist_folder",
    "mnist_split",
    "table1_synthetic",
]

#: Environment variable naming the folder of the MNIST files.
MNIST_ENV = "KLRELEASE_MNIST_DIR"
_MNIST_FILES = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")

#: Class sizes of the paper's AMI load-profile data (Table I), N = 1409.
TABLE1_SIZES = (687, 428, 102, 147, 14, 31)


class DataUnavailable(ValueError):
    """A data folder outside the repository is missing (a one-line message naming it)."""


def _labels(data: LabelledData) -> np.ndarray:
    return np.asarray(data.classes, dtype=object)[data.codes].astype(type(data.classes[0]))


def iris_standardised() -> LabelledData:
    """Iris with every feature standardised over the 150 rows (N = 150, K = 3, d = 4)."""
    raw = load_dataset("iris")
    X = (raw.X - raw.X.mean(axis=0)) / raw.X.std(axis=0)
    return as_labelled_data(X, _labels(raw), classes=raw.classes,
                            feature_names=raw.feature_names)


def italy_power() -> LabelledData:
    """The load profiles: 1096 days, hours 08-19 (d = 12), K = 6 K-means classes."""
    return load_dataset("italy-power")


def table1_synthetic(rng: np.random.Generator, *, n_features: int = 12,
                     mean_range: float = 10.0) -> LabelledData:
    """A synthetic dataset with the class sizes of Table I (N = 1409, K = 6, d = 12).

    The ground truth is drawn as in the paper's synthetic setting (section V-A): means
    uniform in ``[-mean_range, mean_range]^d``, covariances Wishart(d + 1, I); class ``k``
    then holds exactly ``TABLE1_SIZES[k]`` points of its component.
    """
    from .synthetic import draw_rows, draw_truth

    sizes = np.asarray(TABLE1_SIZES)
    K = sizes.size
    means, covs = draw_truth(K, n_features, mean_range, rng)
    X, y = draw_rows(means, covs, sizes, rng)
    return as_labelled_data(X, y + 1, classes=tuple(range(1, K + 1)))


# --------------------------------------------------------------------------- MNIST


def mnist_folder() -> Path:
    """The MNIST folder: ``$KLRELEASE_MNIST_DIR``, else ``../shared/data/mnist`` from the root."""
    env = os.environ.get(MNIST_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mnist"


def _read_idx(path: Path, magic: int, ndim: int) -> np.ndarray:
    with gzip.open(path, "rb") as fh:
        raw = fh.read()
    head = np.frombuffer(raw[:4 + 4 * ndim], dtype=">u4")
    if int(head[0]) != magic:
        raise ValueError(f"{path} is not an IDX file of the expected kind")
    shape = tuple(int(v) for v in head[1:])
    body = np.frombuffer(raw[4 + 4 * ndim:], dtype=np.uint8)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"{path} is truncated")
    return body.reshape(shape)


def _check_mnist(folder) -> Path:
    folder = mnist_folder() if folder is None else Path(folder)
    if not all((folder / f).is_file() for f in _MNIST_FILES):
        raise DataUnavailable(
            f"MNIST data not found: {folder} must hold {' and '.join(_MNIST_FILES)} (set "
            f"{MNIST_ENV} to the folder that holds them)"
        )
    return folder


def load_mnist_test(folder: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The 10,000 MNIST test images (uint8, 10000 x 784) and their labels (0-9).

    Raises
    ------
    DataUnavailable
        If the folder or one of its two files is missing.
    """
    folder = _check_mnist(folder)
    try:
        images = _read_idx(folder / _MNIST_FILES[0], 2051, 3)
        labels = _read_idx(folder / _MNIST_FILES[1], 2049, 1)
    except (OSError, EOFError) as exc:
        raise DataUnavailable(f"cannot read the MNIST files in {folder}: "
                              f"{exc.__class__.__name__}") from None
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"the MNIST files in {folder} disagree on the number of images")
    return images.reshape(images.shape[0], -1), labels.astype(np.int64)


@dataclass(frozen=True)
class MnistSplit:
    """The MNIST experiment's data: 5,000 training rows (private) and 5,000 test rows.

    ``train`` holds the PCA scores of the training images with their digits (classes 0-9);
    ``X_test``/``y_test`` the scores and digits of the other images; ``X_train_pixels`` the
    training images themselves (pixels in [0, 1]) are not kept: every model here works on the
    PCA scores.
    """

    train: LabelledData
    X_test: np.ndarray
    y_test: np.ndarray
    explained_variance_ratio: np.ndarray
    seed: int


def mnist_split(*, n_train: int = 5000, n_components: int = 5, seed: int = 0,
                folder=None) -> MnistSplit:
    """Split the test images at random into training and test halves; PCA fitted on training.

    Pixels are scaled to [0, 1]; the PCA (scikit-learn, exact SVD) is fitted on the training
    images only and applied to both halves. The result is cached per process (its arrays are
    read-only).
    """
    folder = _check_mnist(folder)  # a clear error when the files are absent
    return _mnist_split(int(n_train), int(n_components), int(seed), str(folder.resolve()))


@functools.lru_cache(maxsize=4)
def _mnist_split(n_train: int, n_components: int, seed: int, folder: str) -> MnistSplit:
    from sklearn.decomposition import PCA

    images, digits = load_mnist_test(folder)
    n = images.shape[0]
    if not 0 < int(n_train) < n:
        raise ValueError(f"n_train must lie strictly between 0 and {n}, got {n_train!r}")
    perm = np.random.default_rng(seed).permutation(n)
    tr, te = perm[:n_train], perm[n_train:]
    pixels = images.astype(np.float64) / 255.0
    pca = PCA(n_components=int(n_components), svd_solver="full").fit(pixels[tr])
    Z_tr, Z_te = pca.transform(pixels[tr]), pca.transform(pixels[te])
    names = [f"pc{i + 1}" for i in range(int(n_components))]
    train = as_labelled_data(Z_tr, digits[tr], classes=tuple(range(10)), feature_names=names)
    y_te = digits[te]
    for arr in (train.X, train.codes, Z_te, y_te):
        arr.setflags(write=False)
    return MnistSplit(train, Z_te, y_te, pca.explained_variance_ratio_, int(seed))
