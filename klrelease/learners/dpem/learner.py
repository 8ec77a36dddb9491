"""``dp-em``: a certified EM learner of Gaussian mixtures from unlabelled rows (``DPEM.md``).

The run is fixed before the data is read (:func:`.design.make_design`): a private initial
histogram, then a fixed number of EM iterations, each one Gaussian mechanism. Per iteration the
E-step is local (every row's responsibilities under the released mixture) and the M-step
releases, for every component, its weight (the sum of the responsibilities), the sum and the
second moment of its rows clipped to a region around the released mean, with noise designed
from public values and released ones only. Everything is composed in Gaussian differential
privacy: one ``mu``-GDP mechanism with ``mu`` the largest value whose Gaussian curve gives at
most delta at epsilon, under replacement of one record with N public.

Nothing can FAIL on private grounds: the histogram may release fewer cells than components
(public points then start the rest), and every post-processing step is a total function of
released values. Without ``seed`` the noise comes from the CSPRNG (``klrelease.rng``); a seeded
run is an experiment and is not certified.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm, truncnorm

from ...privacy.tape import released
from ...privacy.toolbox import symmetric_gaussian
from ...statistics import clip_to_norm
from ...stream.sources import CHANGED, ArraySource, Source, SourceReadError, add_tuples
from ..kamath.common import guarantee, progress_bar, structure_rng, structure_seed, success
from ..result import LearnResult, register_learner
from .design import (
    Design,
    Model,
    Regions,
    cell_centres,
    estimate,
    extrapolate,
    init_model,
    iteration_noise,
    make_design,
    merge,
    regions,
    update,
)

__all__ = ["NAME", "learn_dpem", "noisy_grid_histogram", "noisy_cell_histogram",
           "em_statistics", "private_pca", "Frame"]

NAME = "dp-em"
DOC = "klrelease/learners/dpem/DPEM.md"

#: Rows per block of the E-step (memory: a few block x k x d arrays).
BLOCK = 1 << 15


def noisy_grid_histogram(keys: np.ndarray, n_cells: int, sd: float, threshold: float,
                         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The cells whose noisy count reaches ``threshold`` in the Gaussian mechanism on the
    counts of *all* ``n_cells`` cells of a public grid (noise ``N(0, sd^2)`` on every cell).

    Drawn exactly without visiting the empty cells: non-empty cells get their noise; the
    number of empty cells above the threshold is ``Binomial(#empty, P[N(0, sd^2) >= threshold])``
    and, given that number, they are a uniform subset of the empty cells with values from the
    normal tail above the threshold (``DPEM.md`` section 3).
    """
    cells, counts = np.unique(np.asarray(keys, dtype=np.int64), return_counts=True)
    return noisy_cell_histogram(cells, counts, n_cells, sd, threshold, rng)


def noisy_cell_histogram(cells: np.ndarray, counts: np.ndarray, n_cells: int, sd: float,
                         threshold: float, rng: np.random.Generator
                         ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`noisy_grid_histogram` of the non-empty cells ``cells`` (sorted, distinct) and
    their counts."""
    noisy = counts + rng.normal(0.0, sd, size=len(cells))
    keep = noisy >= threshold
    out_cells, out_vals = list(cells[keep]), list(noisy[keep])
    n_empty = int(n_cells) - len(cells)
    extra = int(rng.binomial(n_empty, float(norm.sf(threshold / sd)))) if n_empty > 0 else 0
    if extra:
        taken = set(cells.tolist())
        new: list[int] = []
        while len(new) < extra:
            c = int(rng.integers(n_cells))
            if c not in taken:
                taken.add(c)
                new.append(c)
        vals = sd * truncnorm.rvs(threshold / sd, np.inf, size=extra, random_state=rng)
        out_cells += new
        out_vals += list(vals)
    return np.asarray(out_cells, dtype=np.int64), np.asarray(out_vals, dtype=np.float64)


def private_pca(rows: Source, frame: Frame, design: Design, rng: np.random.Generator
                ) -> np.ndarray:
    """The principal directions (all ``d``, by decreasing variance) of the rows in the frame
    (clipped to the ball) from their noisy sum and scatter (one Gaussian mechanism, one pass;
    the eigenvectors are post-processing)."""
    d = rows.n_features
    sd_s, sd_m = design.pca_sd
    total, sums, scatter = rows.scan_rows(_Scatter(frame), add_tuples, None, block_rows=BLOCK)
    _check_rows(total, design.n)
    S, M = released("dp-em private PCA",
                    (sums + rng.normal(0.0, sd_s, size=d),
                     scatter + symmetric_gaussian(d, sd_m, rng, isometric=True)),
                    ball=design.ball, sum_sd=sd_s, scatter_sd=sd_m)
    m = S / design.n
    C = M / design.n - np.outer(m, m)
    _, vecs = np.linalg.eigh(0.5 * (C + C.T))
    return vecs[:, ::-1]


def e_step_blocks(T: np.ndarray, weights: np.ndarray, centres: np.ndarray, W: np.ndarray,
                  logdet: np.ndarray):
    """The E-step in blocks of rows: yields ``(start, Z, sq, R)`` with ``Z[b, j] =
    (t_b - centre_j) W_j`` (one matrix product for every component), ``sq`` its squared
    norms and ``R`` the responsibilities of components ``N(centre_j, (W_j W_j)^-1)``
    (``logdet`` the log-determinants of those covariances) with weights ``weights``."""
    k, d = centres.shape
    logc = np.log(weights) - 0.5 * logdet
    Wcat = np.concatenate(list(W), axis=1)  # (d, k d)
    offset = np.einsum("ki,kij->kj", centres, W).reshape(-1)
    for s in range(0, T.shape[0], BLOCK):
        Z = T[s:s + BLOCK] @ Wcat
        Z -= offset
        Z = Z.reshape(-1, k, d)
        sq = np.einsum("bki,bki->bk", Z, Z)
        lg = logc - 0.5 * sq
        lg -= lg.max(axis=1, keepdims=True)
        R = np.exp(lg)
        R /= R.sum(axis=1, keepdims=True)
        yield s, Z, sq, R


def em_statistics(T: np.ndarray, weights: np.ndarray, reg: Regions, r: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One E-step and the M-step statistics.

    With ``z = (t - centre) W`` per component, the responsibilities are proportional to
    ``w exp(-||z||^2 / 2) / sqrt(det shape)`` and ``u = z min(1, r / ||z||)``; returns per
    component the sum of the responsibilities and their weighted sum and second moment of
    ``u``.
    """
    k, d = reg.centres.shape
    n = np.zeros(k)
    A = np.zeros((k, d))
    B = np.zeros((k, d, d))
    for _, Z, sq, Rb in e_step_blocks(T, weights, reg.centres, reg.W, reg.logdet):
        clip = np.minimum(1.0, r / np.sqrt(np.maximum(sq, 1e-300)))
        Z *= clip[:, :, None]  # u = clip_r(z)
        n += Rb.sum(axis=0)
        A += np.einsum("bk,bki->ki", Rb, Z)
        for j in range(k):
            B[j] += (Z[:, j] * Rb[:, j, None]).T @ Z[:, j]
    return n, A, B


def learn_dpem(X, n_components: int, *, epsilon: float, delta: float,
               rng: np.random.Generator, R: float, sigma_max: float,
               sigma_min: float | None = None, iterations: int | None = None,
               progress: bool = False) -> LearnResult:
    """Certified DP-EM: a private PCA and histogram start, then EM with noisy M-steps (GDP).

    Returns a released GMM always (never FAIL): ``(epsilon, delta)``-DP under replacement of
    one record, N public (``DPEM.md``).

    ``X`` is an array of rows or a :class:`~klrelease.stream.Source` of rows without labels
    (e.g. ``CSVSource(path, None)``), read in passes over blocks of :data:`BLOCK` rows: one
    to count the rows, one for the private PCA (when ``d > 2``), one for the histogram (which
    also keeps the public subset of rows of the early iterations, at most
    ``SETTINGS["subsample"]``), and one for each of the last iterations when N exceeds that
    subset. Memory does not grow with N, and the release is the same, bit for bit, however
    the rows are chunked.

    Parameters (all public)
    -----------------------
    R : bound on the norm of every component mean, in the units of the data (required).
    sigma_max : bound on the standard deviation of every component along any direction, in
        the units of the data (required). Rows are clipped to the ball of radius
        ``R + sigma_max sqrt(chi2_d quantile 1 - 1e-4)``; the histogram cells, the clipping
        regions and the covariance caps are measured in ``sigma_max``.
    sigma_min : smallest component standard deviation (data units; default
        ``sigma_max / 1000``): the floor of the released covariances' eigenvalues.
    iterations : the fixed number of EM iterations (default: chosen from public inputs, 6 to
        40: the most for which the first iteration's noise stays small).
    progress : a progress bar over the iterations.
    """
    rows = X if isinstance(X, Source) else ArraySource(np.asarray(X, dtype=np.float64), None,
                                                       chunk_rows=BLOCK)
    n, d = rows.n_rows(), rows.n_features  # N is public (DPEM.md section 1)
    k = int(n_components)
    sigma_min = sigma_max / 1000.0 if sigma_min is None else sigma_min
    design = make_design(n, d, k, epsilon, delta, R=R, sigma_max=sigma_max,
                         sigma_min=sigma_min, iterations=iterations)
    ledger = design.ledger()
    g = guarantee(ledger, "dp-em (EM with a KL-shaped Gaussian M-step)", DOC)
    master = structure_seed(rng)
    struct = structure_rng(master, "init")
    Q, Rm = np.linalg.qr(struct.normal(size=(d, d)))
    V = Q * np.sign(np.diag(Rm))  # a random rotation when the histogram is in R^d
    shift = struct.uniform(0.0, design.cell, size=design.p)
    m = min(n, int(design.settings["subsample"]))
    # the early iterations' rows: a public subset of indices (all rows when N <= m)
    subset = None if m >= n else np.sort(structure_rng(master, "subsample").choice(
        n, size=m, replace=False))
    diag: dict = {"ledger": ledger.to_dict(), "design": design.public(), "iterations": []}
    bar = progress_bar(progress, "dp-em iterations", design.iterations + 1)
    frame = Frame(design.ball * sigma_max, sigma_max)
    with np.errstate(all="ignore"):  # no floating-point warning may depend on the data
        if design.pca_s > 0:
            V = private_pca(rows, frame, design, rng)
        V = V[:, : design.p]
        hist, kept = rows.scan_rows(
            _HistogramPass(frame, V, design.ball, shift, design.cell, design.grid, subset),
            _merge_histogram, None, indexed=True, block_rows=BLOCK)
        cells, counts = hist.join()
        _check_rows(int(counts.sum()), n)
        early = kept[0] if len(kept) == 1 else np.concatenate(kept)
        _check_rows(len(early), m)
        cells, counts = released(
            "dp-em initial histogram",
            noisy_cell_histogram(cells, counts, design.n_cells, design.hist_sd,
                                 design.threshold, rng),
            n_cells=design.n_cells, sd=design.hist_sd, threshold=design.threshold)
        diag["released_cells"] = len(cells)
        model = init_model(design, cell_centres(design, cells, shift), counts, V,
                           structure_rng(master, "kmeans"))
        if bar is not None:
            bar[0].update(bar[1], advance=1)
        history: list = []
        path = [model]  # the models since the last extrapolation
        h = int(design.settings["extrapolate_window"])
        last_jump = design.iterations - design.settings["full_iterations"] - 1
        diag["extrapolations"] = []
        try:
            for i, s in enumerate(design.iteration_s):
                late = i >= design.iterations - design.settings["full_iterations"]
                model = _iterate(rows if late and subset is not None else early, frame,
                                 design, model, s, rng, diag, i,
                                 final=i == design.iterations - 1, history=history)
                path.append(model)
                if h > 0 and len(path) == 2 * h + 1 and i < last_jump:
                    # EM's slow drift, extrapolated from released models (post-processing)
                    jumped = extrapolate(design, path[0], path[h], path[2 * h])
                    if jumped is None:
                        path = path[h:]  # the next test: h iterations on
                    else:
                        model, rho = jumped
                        path = [model]
                        diag["extrapolations"].append({"iteration": i + 1, "rho": rho})
                if bar is not None:
                    bar[0].update(bar[1], advance=1)
        finally:
            if bar is not None:
                bar[0].stop()
    # the last iterations, where they agree to within their noise, combined (post-processing)
    merged, used = merge([h[3] for h in history])
    prev, reg, noise, _ = history[-1]
    last = model  # the last iteration's own model
    model = update(design, prev, reg, noise, merged)
    diag["combined_iterations"] = used
    if not _valid(model):
        # never fail after noise was drawn: the last valid model of the run, the iterations'
        # own from the last back, then their starts (post-processing of released values; a
        # defect if it happens, recorded as such)
        runs = [last, *(h[0] for h in reversed(history))]
        model = next((m for m in runs if _valid(m)), None) or _uniform(design)
        diag["fallback"] = "the last valid model of the run was released"
    sc = design.scale
    return success(NAME, g, model.weights, model.means * sc, model.covs * sc**2, diag)


def _valid(model) -> bool:
    """Whether a model's parameters are finite and its covariances have Cholesky factors."""
    if not all(np.all(np.isfinite(a)) for a in (model.weights, model.means, model.covs)):
        return False
    try:
        np.linalg.cholesky(model.covs)
    except np.linalg.LinAlgError:
        return False
    return True


def _uniform(design):
    """The model of no data in the frame: equal weights, means at the origin, unit
    covariances (public)."""
    k, d = design.k, design.d
    eye = np.broadcast_to(np.eye(d), (k, d, d)).copy()
    return Model(np.full(k, 1.0 / k), np.zeros((k, d)), eye, eye.copy())


@dataclass(frozen=True)
class Frame:
    """The public frame of the rows: ``T = clip_to_norm(X, radius) / scale`` (per row)."""

    radius: float
    scale: float

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return clip_to_norm(X, self.radius) / self.scale


def _check_rows(seen: int, n: int) -> None:
    if seen != n:  # a file rewritten while it is read: no release
        raise SourceReadError(CHANGED)


@dataclass(frozen=True)
class _Scatter:
    """Per block: rows, sum and scatter of the rows in the frame."""

    frame: Frame

    def __call__(self, X):
        T = self.frame(X)
        return len(T), T.sum(axis=0), T.T @ T


@dataclass(frozen=True)
class _HistogramPass:
    """Per block: the non-empty histogram cells with their counts, and the rows in the frame
    whose indices are in ``subset`` (all rows when it is None)."""

    frame: Frame
    V: np.ndarray
    ball: float
    shift: np.ndarray
    cell: float
    grid: int
    subset: np.ndarray | None

    def __call__(self, X, offset):
        T = self.frame(X)
        keys = np.floor((T @ self.V + self.ball + self.shift) / self.cell).astype(np.int64)
        keys = np.clip(keys, 0, self.grid - 1)
        flat = np.ravel_multi_index(tuple(keys.T), (self.grid,) * keys.shape[1])
        cells, counts = np.unique(flat, return_counts=True)
        if self.subset is None:
            kept = T
        else:
            a, b = np.searchsorted(self.subset, [offset, offset + len(T)])
            kept = T[self.subset[a:b] - offset]
        return _Cells(cells, counts), [kept] if len(kept) else []


class _Cells:
    """Counts of histogram cells, merged lazily: parts are joined (``np.unique`` of their
    cells, counts added) once they hold more entries than the joined part, so the work is
    linear in the number of entries and memory is at most a few times the distinct cells."""

    __slots__ = ("cells", "counts", "pending", "size")

    def __init__(self, cells: np.ndarray, counts: np.ndarray):
        self.cells, self.counts, self.pending, self.size = cells, counts, [], 0

    def merge(self, other: _Cells) -> _Cells:
        self.pending.append((other.cells, other.counts))
        self.size += len(other.cells)
        if self.size > max(len(self.cells), 1 << 12):
            self.join()
        return self

    def join(self) -> tuple[np.ndarray, np.ndarray]:
        if self.pending:
            cells = np.concatenate([self.cells, *(p[0] for p in self.pending)])
            counts = np.concatenate([self.counts, *(p[1] for p in self.pending)])
            self.cells, inverse = np.unique(cells, return_inverse=True)
            self.counts = np.bincount(inverse.reshape(-1), weights=counts,
                                      minlength=len(self.cells)).astype(np.int64)
            self.pending, self.size = [], 0
        return self.cells, self.counts


def _merge_histogram(a, b):
    if a is None:
        return b
    a[0].merge(b[0])
    a[1].extend(b[1])
    return a


@dataclass(frozen=True)
class _EMPass:
    """Per block: rows and :func:`em_statistics` of the rows in the frame."""

    frame: Frame
    weights: np.ndarray
    reg: Regions
    r: float

    def __call__(self, X):
        return len(X), *em_statistics(self.frame(X), self.weights, self.reg, self.r)


def _iterate(rows: np.ndarray | Source, frame: Frame, design: Design, model: Model, s: float,
             rng: np.random.Generator, diag: dict, i: int, final: bool,
             history: list) -> Model:
    """One iteration: regions and noise from released values, the statistics (of rows in the
    frame in memory, or one pass over a source, in the same blocks), their noisy release,
    the next mixture."""
    reg = regions(design, model)
    noise = iteration_noise(design, s, final)
    r = design.region_radius
    if isinstance(rows, Source):
        n_rows, n, A, B = rows.scan_rows(_EMPass(frame, model.weights, reg, r), add_tuples,
                                         None, block_rows=BLOCK)
        _check_rows(n_rows, design.n)
    else:
        n_rows = len(rows)
        n, A, B = em_statistics(rows, model.weights, reg, r)
    k, d = A.shape
    release = released(
        f"dp-em iteration {i + 1}",
        (n + rng.normal(0.0, noise.count_sd, size=k),
         A + rng.normal(0.0, noise.mean_sd, size=(k, d)),
         (np.stack([B[j] + symmetric_gaussian(d, noise.cov_sd, rng, isometric=True)
                    for j in range(k)]) if np.isfinite(noise.cov_sd) else None)),
        rows=n_rows, centres=reg.centres, shapes=reg.shape, radius=r, count_sd=noise.count_sd,
        mean_sd=noise.mean_sd, cov_sd=noise.cov_sd)
    diag["iterations"].append({"sensitivity": s, "rows": n_rows, "mean_share": noise.mean_share,
                               "count_sd": noise.count_sd, "mean_sd": noise.mean_sd,
                               "cov_sd": noise.cov_sd})
    est = estimate(design, reg, noise, *release, n_rows=n_rows)
    history.append((model, reg, noise, est))
    return update(design, model, reg, noise, est)


register_learner(NAME, learn_dpem, streams=True)
