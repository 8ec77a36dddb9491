"""Labelled datasets: validation, public metadata and loading.

Every check here raises a :class:`ValueError` with one clear sentence. Messages name the
argument and the rule that failed; they never quote data values, class counts or other
statistics of the (private) dataset.
"""

from __future__ import annotations

import csv
import numbers
import warnings
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

import numpy as np

from ._io import read_failure
from .domain import Domain

__all__ = [
    "LabelledData",
    "as_labelled_data",
    "check_privacy_parameters",
    "load_dataset",
    "load_csv",
    "load_npz",
    "kmeans_classes",
    "load_italy_power",
    "read_ts",
    "DATASETS",
]


@dataclass(frozen=True)
class LabelledData:
    """A validated labelled dataset.

    Attributes
    ----------
    X : ndarray of shape (N, d), float64
        Features.
    codes : ndarray of shape (N,), int64
        Class index of every row, in ``0..K-1``.
    classes : tuple
        The class labels; ``classes[k]`` is the label of class index ``k``. The set of classes
        is public (it fixes K); which rows carry which label is private.
    domain : Domain or None
        The public bound on the rows, known independently of the data, if any: a box
        ``lower <= x <= upper`` or a ball ``||x||_2 <= B`` (:class:`~klrelease.domain.Domain`).
    feature_names : tuple of str
    classes_declared : bool
        True when the caller declared the set of classes; False when it was read from the
        labels (then which classes occur is itself a statistic of the private labels).
    """

    X: np.ndarray
    codes: np.ndarray
    classes: tuple
    domain: Domain | None = None
    feature_names: tuple[str, ...] = field(default=())
    classes_declared: bool = False

    @property
    def bounds(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(lower, upper)`` of a public box, if the domain is one."""
        return None if self.domain is None else self.domain.bounds

    @property
    def norm_bound(self) -> float | None:
        """The radius of a public ball, if the domain is one."""
        return None if self.domain is None else self.domain.norm_bound

    @property
    def n_samples(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    def with_labels(self, codes: np.ndarray) -> LabelledData:
        """The same features with other class indices (a neighbouring dataset, for audits)."""
        return replace(self, codes=np.asarray(codes, dtype=np.int64))

    def with_features(self, X: np.ndarray) -> LabelledData:
        """Other features with the same labels (clipped data, or a neighbouring record)."""
        return replace(self, X=np.asarray(X, dtype=np.float64))


def _real_number(value, name: str) -> float:
    """``value`` as a float when it is a real number (a bool or a string is not one)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.number)) \
            or isinstance(value, np.complexfloating):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def check_privacy_parameters(epsilon: float, delta: float) -> tuple[float, float]:
    """Validate (epsilon, delta): real numbers (not booleans or strings), epsilon > 0 and
    finite, 0 < delta < 1."""
    eps = _real_number(epsilon, "epsilon")
    dlt = _real_number(delta, "delta")
    if not np.isfinite(eps) or eps <= 0:
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not np.isfinite(dlt) or not 0 < dlt < 1:
        raise ValueError(f"delta must lie strictly between 0 and 1, got {delta!r}")
    return eps, dlt


def _text_labels(y: np.ndarray, classes) -> np.ndarray:
    """Text labels read against declared classes, each label on its own: surrounding spaces
    dropped, and read as an integer when every declared class is one (``"01"`` and ``" 1"``
    are class 1). The declaration alone decides how labels are read, never the other labels.
    """
    y = np.char.strip(y.astype(str))
    if not all(isinstance(c, (int, np.integer)) and not isinstance(c, (bool, np.bool_))
               for c in classes):
        return y
    try:
        return y.astype(np.int64)
    except ValueError:  # some label is not an integer: it matches no declared class
        raise ValueError("y contains a label that is not one of the declared classes") from None


#: Integer classes spanning at most this many values are encoded by a lookup table.
_LOOKUP_SPAN = 1 << 16


def _lookup_codes(y: np.ndarray, classes: np.ndarray) -> np.ndarray | None:
    """Class codes of integer labels by a lookup table over the classes' span (``None`` when
    the span is too wide). The same codes and the same error as the sorted search."""
    if classes.size == 0:
        return None
    lo, hi = int(classes.min()), int(classes.max())
    if hi - lo >= _LOOKUP_SPAN or lo < -(2**63) or hi >= 2**63:  # int64 arithmetic below
        return None
    if y.size and (int(y.min()) < lo or int(y.max()) > hi):
        raise ValueError("y contains a label that is not one of the declared classes")
    table = np.full(hi - lo + 1, -1, dtype=np.int64)
    table[classes.astype(np.int64) - lo] = np.arange(classes.size)
    y = y.astype(np.int64, copy=False)  # within [lo, hi]: fits
    codes = table[y - lo] if lo else table[y]
    if y.size and codes.min() < 0:
        raise ValueError("y contains a label that is not one of the declared classes")
    return codes


def typed_classes(classes) -> tuple:
    """The declared classes, typed by the declaration alone, the same way for arrays, chunked
    sources and the CLI: integers when every one reads as an integer (``3``, ``3.0``, ``"3"``,
    ``" 03"``); numbers when every one is a number (``0.5``); else text.

    Raises
    ------
    ValueError
        If ``classes`` is a single string or declares no class.
    """
    if isinstance(classes, (str, bytes)):
        raise ValueError("classes must be a list of labels, not one string")
    classes = list(np.asarray(classes, dtype=object).ravel()) if isinstance(
        classes, np.ndarray) else list(classes)
    if not classes:
        raise ValueError("classes must be a non-empty list of labels: the public set of "
                         "classes, at least two")
    numbers = all(isinstance(c, (int, float, np.integer, np.floating))
                  and not isinstance(c, (bool, np.bool_)) for c in classes)
    if numbers:
        if all(float(c).is_integer() for c in classes):
            return tuple(int(c) for c in classes)
        return tuple(float(c) for c in classes)
    try:
        return tuple(int(str(c).strip()) for c in classes)
    except ValueError:
        return tuple(str(c).strip() for c in classes)


def _as_declared(y: np.ndarray, classes: tuple) -> np.ndarray:
    """Numeric labels read as text when the declared classes are text (a whole number as its
    integer, ``1.0`` as ``"1"``), each label on its own."""
    if len(classes) and isinstance(classes[0], str) and y.dtype.kind in "iufb":
        if y.dtype.kind == "f":
            if not np.all(np.isfinite(y)):
                raise ValueError("y contains NaN or infinite labels; labels must be class "
                                 "identifiers")
            whole = (y == np.round(y)) & (np.abs(y) < 2.0**63)  # int64 holds them
            return np.where(whole, np.where(whole, y, 0).astype(np.int64).astype(str),
                            y.astype(str))
        return y.astype(str)
    return y


def _label_kinds(y) -> set[str]:
    """The kinds of the labels of a list or an object array: number, text, bool, other."""
    kinds = set()
    for v in y:
        if isinstance(v, (bool, np.bool_)):
            kinds.add("bool")
        elif isinstance(v, (numbers.Real, np.number)):
            kinds.add("number")
        elif isinstance(v, (str, bytes, np.str_, np.bytes_)):
            kinds.add("text")
        else:
            kinds.add("other")
    return kinds


def _check_one_label_type(y) -> None:
    """Refuse undeclared labels that mix numbers, text and booleans (``[1, "a"]``): numpy
    would turn them all into text, so that the class ``1`` became ``"1"`` silently."""
    if getattr(getattr(y, "dtype", None), "kind", "O") != "O":
        return  # a typed array or series holds one type
    kinds = _label_kinds(np.asarray(y, dtype=object).ravel())
    if "other" in kinds:
        raise ValueError("y must hold integer or string class labels")
    if len(kinds) > 1:
        raise ValueError(
            "y mixes labels of different types (" + " and ".join(sorted(kinds)) + "); give "
            "labels of one type, or declare classes= (labels are then read as the declared "
            "classes)")


def _encode_labels(y, classes) -> tuple[np.ndarray, tuple]:
    if classes is None:
        _check_one_label_type(y)
    y = np.asarray(y)
    if y.ndim == 2 and 1 in y.shape:
        y = y.ravel()
    if y.ndim != 1:
        raise ValueError(f"y must be one-dimensional (one label per row), got shape {y.shape}")
    if y.dtype.kind == "O":
        y = y.astype(str)
    if classes is not None:
        classes = typed_classes(classes)
        y = _as_declared(y, classes)
    if y.dtype.kind == "f":
        if not np.all(np.isfinite(y)):
            raise ValueError("y contains NaN or infinite labels; labels must be class identifiers")
        if classes is None:
            if np.any(y != np.round(y)):
                raise ValueError(
                    "y contains non-integer numbers; labels must be class identifiers "
                    "(integers or strings)"
                )
            y = y.astype(np.int64)
        # with declared classes, labels are matched to them by value: whether a label is a
        # whole number must not decide acceptance (a flip between declared classes could)
    elif y.dtype.kind not in "iuUSOb":
        raise ValueError(f"y must hold integer or string class labels, got dtype {y.dtype}")
    if y.dtype.kind == "O":
        y = y.astype(str)
    if classes is not None and y.dtype.kind in "US":
        y = _text_labels(y, classes)
    if classes is None:
        classes_arr = np.unique(y)
    else:
        classes_arr = np.asarray(list(classes))
        if classes_arr.ndim != 1 or len(classes_arr) == 0:
            raise ValueError("classes must be a non-empty sequence of labels")
        if len(np.unique(classes_arr)) != len(classes_arr):
            raise ValueError("classes must not repeat a label")
        if y.dtype.kind in "US" and classes_arr.dtype.kind not in "US":
            classes_arr = classes_arr.astype(str)
    if y.dtype.kind in "iu" and classes_arr.dtype.kind in "iu":
        codes = _lookup_codes(y, classes_arr)
        if codes is not None:
            return codes, tuple(c.item() for c in classes_arr)
    order = np.argsort(classes_arr, kind="stable")
    sorted_classes = classes_arr[order]
    pos = np.searchsorted(sorted_classes, y)
    pos = np.clip(pos, 0, len(sorted_classes) - 1)
    if not np.all(sorted_classes[pos] == y):
        raise ValueError("y contains a label that is not one of the declared classes")
    codes = order[pos].astype(np.int64)
    return codes, tuple(c.item() if hasattr(c, "item") else c for c in classes_arr)


def as_real_features(X) -> np.ndarray:
    """``X`` as a float64 array of real numbers: complex values are refused (their imaginary
    part would be dropped), and so is anything that is not numeric."""
    if np.iscomplexobj(X) or (isinstance(X, np.ndarray) and X.dtype.kind == "O" and any(
            isinstance(v, (complex, np.complexfloating)) for v in X.ravel())):
        raise ValueError("X must hold real numbers; complex values are not supported")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", np.exceptions.ComplexWarning)
            return np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError, np.exceptions.ComplexWarning):
        raise ValueError("X must be a numeric array of shape (n_samples, n_features)") from None


def as_labelled_data(
    X,
    y,
    *,
    classes=None,
    bounds=None,
    norm_bound: float | None = None,
    feature_names=None,
    min_class_size: int | None = None,
) -> LabelledData:
    """Validate ``(X, y)`` and return a :class:`LabelledData`.

    Parameters
    ----------
    X : array-like of shape (N, d)
        Finite real features.
    y : array-like of shape (N,)
        Class labels (integers or strings).
    classes : sequence, optional
        The public set of classes. Defaults to the labels present in ``y``.
    bounds : (lower, upper) or Domain, optional
        Public per-feature box (scalars or arrays of shape (d,)), or a
        :class:`~klrelease.domain.Domain`.
    norm_bound : float, optional
        Public bound B on ``||x||_2`` (a ball; give a box or a ball, not both).
    min_class_size : int, optional
        Every class must hold at least this many rows. Defaults to ``max(2, d + 1)`` (the
        class covariance (2c) must be invertible).

    Raises
    ------
    ValueError
        On NaN or infinite values, a shape mismatch, labels outside ``classes``, or a class
        that is too small.
    """
    if isinstance(X, LabelledData):
        check_class_sizes(np.bincount(X.codes, minlength=X.n_classes), X.n_features,
                          min_class_size)
        if bounds is None and norm_bound is None:
            return X
        return replace(X, domain=Domain.from_public(bounds, norm_bound, X.n_features))
    X = as_real_features(X)
    if X.ndim != 2:
        raise ValueError(f"X must be two-dimensional (n_samples, n_features), got {X.ndim} dims")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError("X must have at least one row and one column")
    if not _all_finite(X):
        raise ValueError("X contains NaN or infinite values")
    if classes is None:
        _check_one_label_type(y)
    y_arr = np.asarray(y)
    if y_arr.ndim == 2 and 1 in y_arr.shape:
        y_arr = y_arr.ravel()
    if y_arr.ndim != 1 or y_arr.shape[0] != X.shape[0]:
        raise ValueError("X and y must have the same number of rows")
    codes, classes_t = _encode_labels(y_arr, classes)
    d = X.shape[1]
    K = len(classes_t)
    if K < 2:
        raise ValueError("at least two classes are needed to release a mixture")
    check_class_sizes(np.bincount(codes, minlength=K), d, min_class_size)
    domain = Domain.from_public(bounds, norm_bound, d)
    names = tuple(feature_names) if feature_names is not None else tuple(
        f"x{i}" for i in range(d)
    )
    if len(names) != d:
        raise ValueError("feature_names must have one name per column of X")
    return LabelledData(X, codes, classes_t, domain, names, classes is not None)


def _all_finite(X: np.ndarray) -> bool:
    """Whether every entry of ``X`` is finite (the rows in two halves, on two threads where
    :func:`klrelease._threads.row_threads` allows; a half's rows a block at a time)."""
    from ._threads import in_two_halves

    step = max(1, (1 << 20) // max(X.shape[1], 1))

    def finite(a: int, b: int) -> bool:
        return all(bool(np.isfinite(X[i:min(i + step, b)]).all()) for i in range(a, b, step))

    return all(in_two_halves(finite, X.shape[0]))


def check_class_sizes(counts: np.ndarray, d: int, min_class_size: int | None) -> None:
    """Refuse a class with fewer rows than a mechanism's ``min_class_size`` (``None``: d + 1,
    so that class covariances are invertible; 0: never). The refusal depends on private class
    sizes: only mechanisms that are not certified (kl-paper) keep the default."""
    need = max(2, d + 1) if min_class_size is None else int(min_class_size)
    if need <= 0:
        return
    if np.any(np.asarray(counts) < need):
        raise ValueError(
            f"every class needs at least {need} rows (more than the {d} features, so that its "
            "covariance is invertible); at least one class is smaller"
        )


# --------------------------------------------------------------------------- loading


#: Bundled datasets, with the public bounds documented in ``data/README.md``.
DATASETS = {
    "iris": {
        "file": "iris.csv",
        "label_column": "species",
        "bounds": ([4.0, 2.0, 1.0, 0.0], [8.0, 4.5, 7.0, 2.6]),
        "classes": ("setosa", "versicolor", "virginica"),
    },
    "italy-power": {
        "files": ("ItalyPowerDemand_TRAIN.ts", "ItalyPowerDemand_TEST.ts"),
        "window": (8, 20),
        "n_clusters": 6,
        "kmeans_seed": 0,
        "classes": (1, 2, 3, 4, 5, 6),
    },
}


def _open_csv(path: Path):
    """A CSV file opened as text, a UTF-8 byte-order mark dropped (spreadsheets write one)."""
    return path.open(newline="", encoding="utf-8-sig")


def check_csv_header(path, header: list[str]) -> list[str]:
    """``header`` if its column names are distinct; ``ValueError`` naming the first repeated
    one otherwise (column names are public: they label the artifact's features)."""
    seen = set()
    for name in header:
        if name in seen:
            raise ValueError(f"{path} has more than one column named {name!r}")
        seen.add(name)
    return header


def read_csv_header(path, delimiter: str = ",") -> list[str] | None:
    """The header row of a CSV file (``None`` when the file is empty), its names distinct."""
    path = Path(path)
    try:
        with _open_csv(path) as fh:
            first = next(csv.reader(fh, delimiter=delimiter), None)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(read_failure(path, exc)) from None
    return None if first is None else check_csv_header(path, first)


def load_csv(path, label_column: str, *, delimiter: str = ","):
    """Read a CSV file with a header row; returns ``(X, y, feature_names)``.

    Every column except ``label_column`` must be numeric; column names must be distinct.
    """
    path = Path(path)
    try:
        with _open_csv(path) as fh:
            rows = list(csv.reader(fh, delimiter=delimiter))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(read_failure(path, exc)) from None
    if not rows:
        raise ValueError(f"{path} is empty")
    header, body = check_csv_header(path, rows[0]), [r for r in rows[1:] if r]
    if label_column not in header:
        raise ValueError(f"{path} has no column named {label_column!r}")
    j = header.index(label_column)
    if any(len(r) != len(header) for r in body):
        raise ValueError(f"{path} has rows with a different number of fields than its header")
    if not body:
        raise ValueError(f"{path} has no data rows")
    names = [h for i, h in enumerate(header) if i != j]
    try:
        X = np.array([[float(v) for i, v in enumerate(r) if i != j] for r in body])
    except ValueError:
        raise ValueError(f"{path}: every column except {label_column!r} must be numeric") from None
    y = np.array([r[j] for r in body])
    try:  # integer-coded labels stay integers
        y = y.astype(np.int64)
    except ValueError:
        pass
    return X, y, names


def load_npz(path):
    """Read an ``.npz`` archive holding arrays ``X`` and ``y``; returns ``(X, y)``. Messages
    name the file and what is wrong, never numpy's own text (which can quote the file)."""
    path = Path(path)
    try:
        z = np.load(path, allow_pickle=False)
    except ValueError:  # numpy's words for a file that is not an array file (a CSV, text)
        raise ValueError(f"{path} is not an .npz archive") from None
    except Exception as exc:  # zipfile / OSError variants
        raise ValueError(read_failure(path, exc)) from None
    if not isinstance(z, np.lib.npyio.NpzFile):  # one array (.npy)
        raise ValueError(f"{path} is not an .npz archive (one array; np.savez(path, X=X, "
                         "y=y) writes one)")
    with z:
        if "X" not in z or "y" not in z:
            raise ValueError(f"{path} must hold arrays named 'X' and 'y'")
        try:
            return z["X"], z["y"]
        except ValueError:  # an object array (refused) or a damaged header
            raise ValueError(f"{path}: X or y cannot be read as a numeric or text array "
                             "(object arrays are refused)") from None
        except Exception as exc:  # a damaged member
            raise ValueError(read_failure(path, exc)) from None


def _bundled_file(filename: str) -> Path:
    """Path of a file of the top-level ``data/`` folder, installed as ``klrelease._data``."""
    try:
        ref = resources.files("klrelease._data").joinpath(filename)
        if ref.is_file():
            return Path(str(ref))
    except ModuleNotFoundError:  # editable install: the folder sits beside the package
        pass
    path = Path(__file__).resolve().parent.parent / "data" / filename
    if not path.is_file():
        raise ValueError(f"bundled data file {filename!r} is missing from this installation")
    return path


def load_dataset(name: str) -> LabelledData:
    """Load a bundled dataset (raw features, public bounds and classes attached)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; available: {', '.join(sorted(DATASETS))}")
    meta = DATASETS[name]
    if name == "italy-power":
        return load_italy_power()
    X, y, names = load_csv(_bundled_file(meta["file"]), meta["label_column"])
    return as_labelled_data(X, y, classes=meta["classes"], bounds=meta["bounds"],
                            feature_names=names, min_class_size=0)


def read_ts(path) -> tuple[np.ndarray, np.ndarray]:
    """Read a univariate, equal-length ``.ts`` file (sktime format): ``(series, labels)``.

    Header lines start with ``#`` or ``@``; each data line holds comma-separated values, a
    colon and the class label.
    """
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(read_failure(path, exc)) from None
    series, labels = [], []
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#@":
            continue
        values, sep, label = line.rpartition(":")
        if not sep:
            raise ValueError(f"{path}: a data line has no ':label' suffix")
        try:
            series.append([float(v) for v in values.split(",")])
        except ValueError:
            raise ValueError(f"{path}: a data line holds a non-numeric value") from None
        labels.append(label.strip())
    if not series or len({len(s) for s in series}) != 1:
        raise ValueError(f"{path}: expected equal-length series")
    return np.array(series), np.array(labels)


def kmeans_classes(X: np.ndarray, n_clusters: int, seed: int) -> np.ndarray:
    """Classes ``1..K`` from K-means (10 restarts, fixed seed), numbered by decreasing size.

    Ties in size keep scikit-learn's cluster order. A preprocessing step run on the data
    itself: see ``data/README.md`` for what a release of such classes assumes.
    """
    from sklearn.cluster import KMeans

    if int(n_clusters) < 2:
        raise ValueError(f"n_clusters must be >= 2, got {n_clusters!r}")
    km = KMeans(n_clusters=int(n_clusters), n_init=10, random_state=int(seed)).fit(X)
    sizes = np.bincount(km.labels_, minlength=int(n_clusters))
    order = np.argsort(-sizes, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank[km.labels_].astype(np.int64) + 1


def load_italy_power(
    *, window: tuple[int, int] | None = None, n_clusters: int | None = None,
    seed: int | None = None, labels: str = "kmeans",
) -> LabelledData:
    """The bundled ItalyPowerDemand daily load profiles as a labelled dataset.

    The 67 + 1029 days of the two files are concatenated (TRAIN first). The features are the
    hourly values ``window[0] .. window[1] - 1`` (default 08:00-19:00, d = 12) of the
    z-normalised daily profile.

    Parameters
    ----------
    window : (start, stop), optional
        Hours kept (``0 <= start < stop <= 24``). Default ``(8, 20)``.
    n_clusters : int, optional
        With ``labels="kmeans"``: K, default 6.
    seed : int, optional
        With ``labels="kmeans"``: the K-means seed, default 0.
    labels : {"kmeans", "season"}
        ``"kmeans"`` (the paper's preprocessing): classes 1..K from K-means (scikit-learn,
        10 restarts) on the windowed profiles, numbered by decreasing cluster size.
        ``"season"``: the archive's label (1 = October-March, 2 = April-September).
    """
    meta = DATASETS["italy-power"]
    start, stop = meta["window"] if window is None else window
    if not (0 <= int(start) < int(stop) <= 24):
        raise ValueError(f"window must satisfy 0 <= start < stop <= 24, got {window!r}")
    parts = [read_ts(_bundled_file(f)) for f in meta["files"]]
    series = np.concatenate([p[0] for p in parts])
    season = np.concatenate([p[1] for p in parts]).astype(np.int64)
    X = series[:, int(start):int(stop)]
    names = [f"h{h:02d}" for h in range(int(start), int(stop))]
    if labels == "season":
        return as_labelled_data(X, season, classes=(1, 2), feature_names=names, min_class_size=0)
    if labels != "kmeans":
        raise ValueError(f"labels must be 'kmeans' or 'season', got {labels!r}")
    K = meta["n_clusters"] if n_clusters is None else int(n_clusters)
    y = kmeans_classes(X, K, meta["kmeans_seed"] if seed is None else int(seed))
    return as_labelled_data(X, y, classes=tuple(range(1, K + 1)), feature_names=names,
                            min_class_size=1)
