"""Chunked data sources: in-memory arrays and memmaps, Parquet and CSV files, Dask collections.

A source yields ``(X, y)`` chunks in a fixed order (features as float64, raw labels) and runs
*passes*: a function of one chunk returning a partial result, partial results merged in chunk
order. Chunk sizes and partition counts are public choices of the caller; they change the
rounding of the merged statistics (merges are exact in real arithmetic), never which rows are
read or what is released.

Every chunk is validated as it is read (finite features, labels among the classes); a failure
raises one :class:`SourceReadError` (a :class:`ValueError`) whose message names the rule,
never a value, a row, a chunk or a partition, so the release fails the same way wherever the
bad row sits.
"""

from __future__ import annotations

import glob
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..data import _check_one_label_type, _encode_labels, read_csv_header, typed_classes
from ..rows import column_sums
from .moments import (
    ClassMoments,
    RowMap,
    bounded_class_moments,
    chunk_moments,
    class_sums,
    pooled_moments,
)
from .sample import FarRows, RowSample

__all__ = [
    "Source",
    "SourceReadError",
    "ArraySource",
    "ParquetSource",
    "CSVSource",
    "DaskSource",
    "as_source",
    "is_dask_collection",
    "DEFAULT_CHUNK_ROWS",
    "add_tuples",
]

#: Rows per chunk of in-memory, memmap and file sources (about 20 MB at d = 10).
DEFAULT_CHUNK_ROWS = 1 << 18

NONFINITE = "X contains NaN or infinite values"


class SourceReadError(ValueError):
    """A chunk could not be read or does not validate (I/O, a file that changed, a bad value:
    the message names the rule, never a value). The only error a release treats as the source
    failing: any other error in a pass is a defect and raises."""


def _read_error(exc: BaseException) -> SourceReadError:
    return exc if isinstance(exc, SourceReadError) else SourceReadError(str(exc))


def _features(X) -> np.ndarray:
    try:
        X = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError):  # numpy's message quotes the value
        raise ValueError("every feature must be numeric") from None
    if X.ndim != 2:
        raise ValueError("every chunk of X must be two-dimensional (rows, features)")
    if not np.all(np.isfinite(X)):
        raise ValueError(NONFINITE)
    return X


def _labels(y, classes: tuple) -> np.ndarray:
    """Class codes of raw labels ``y`` against the declared classes (as arrays are read)."""
    return _encode_labels(y, classes)[0]


class Source:
    """A labelled dataset read in chunks (base class).

    Subclasses implement :meth:`chunks`; :meth:`reduce` runs a pass locally (the Dask source
    runs it on the cluster).
    """

    n_features: int
    feature_names: tuple[str, ...]
    #: Read the next chunk on a second thread while this one is reduced (file sources, whose
    #: decoding releases the GIL; chunks of arrays in memory are views and need no reading).
    prefetch: bool = False

    def __init__(self, classes=None, bounds=None, norm_bound=None):
        self.classes_declared = classes is not None
        self.classes = typed_classes(classes) if classes is not None else None
        self.bounds = bounds
        self.norm_bound = norm_bound

    @property
    def domain(self):
        """The public bound given with the source (:class:`~klrelease.domain.Domain`), if any.
        """
        from ..domain import Domain

        return Domain.from_public(self.bounds, self.norm_bound, self.n_features)

    # --------------------------------------------------------------------------- reading
    def chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:  # pragma: no cover
        raise NotImplementedError

    def reduce(self, fn: Callable, merge: Callable, initial, *, indexed: bool = False,
               block_rows: int | None = None):
        """Apply ``fn(X, y)`` to every chunk and merge the results in chunk order
        (``indexed=True``: ``fn(X, y, offset)``, ``offset`` the index of the chunk's first row).

        ``block_rows``: the chunks are first cut and joined into blocks of exactly that many
        rows (the last one shorter), so that the pass, rounding included, does not depend on
        how the source is chunked.
        """
        from .._threads import single_threaded_blas

        acc, offset = initial, 0
        chunks = _prefetched(self.chunks()) if self.prefetch else iter(self.chunks())
        if block_rows is not None:
            chunks = _reblocked(chunks, int(block_rows))
        try:
            with single_threaded_blas():  # small products per chunk: threads only synchronise
                while True:
                    try:
                        X, y = next(chunks)
                    except StopIteration:
                        break
                    except (OSError, EOFError, ValueError) as exc:  # reading, not computing
                        raise _read_error(exc) from exc
                    acc = merge(acc, fn(X, y, offset) if indexed else fn(X, y))
                    offset += len(X)
        finally:  # a pass that stops early stops the reader (and its thread) now
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        return acc

    # ---------------------------------------------------------------------------- passes
    def resolve_classes(self) -> tuple:
        """The classes: the declared ones, or (one pass) the sorted labels present."""
        if self.classes is None:
            found = self.reduce(lambda X, y: _present_labels(y), _union, np.array([]))
            if found.size == 0:
                raise ValueError("the data has no rows")
            self.classes = typed_classes(found.tolist()) if found.dtype.kind in "US" else \
                tuple(v.item() for v in found)
        if len(self.classes) < 2:
            raise ValueError("at least two classes are needed to release a mixture")
        return self.classes

    def scan(self, fn: Callable, merge: Callable, initial, *, indexed: bool = False):
        """One pass: ``fn(X, codes)`` on every chunk (validated, labels as class codes), the
        results merged in chunk order (``indexed=True``: ``fn(X, codes, offset)``). The
        interface of :class:`klrelease.solvers.passes.MemoryRows`."""
        return self.reduce(_Validated(fn, self.n_features, self.resolve_classes()), merge,
                           initial, indexed=indexed)

    @property
    def n_classes(self) -> int:
        """The number of classes (after :meth:`resolve_classes`)."""
        return len(self.resolve_classes())

    def feature_range(self) -> tuple[np.ndarray, np.ndarray]:
        """One pass: the per-feature minimum and maximum of the rows (their bounding box).

        Every chunk is validated as in :meth:`moments`.
        """
        out = self.scan(_chunk_range, _merge_range, None)
        if out is None:
            raise ValueError("the data has no rows")
        return out

    def moments(self, f: RowMap | None = None) -> ClassMoments:
        """One pass: per-class count, mean and centred scatter of ``f(X, codes)`` (or of X).

        Every chunk is validated (finite features, declared labels) before ``f`` sees it.
        """
        return self.scan(_ChunkMoments(len(self.resolve_classes()), f), _merge_moments, None)

    def pooled_and_sample(self, size: int | None = None, *, check_labels: bool = False,
                          labelled: int | None = None, far: int | None = None):
        """One pass over the features: the count, mean and centred scatter of all rows (as
        one class), and the :mod:`~klrelease.stream.sample` of ``size`` rows (default
        :data:`~klrelease.stream.sample.SAMPLE_ROWS`) chosen by their index. For public
        features only (label flip). The labels are not used; with ``check_labels`` every one
        is validated (among the declared classes) in the same pass, before any noise. With
        ``labelled``, the labels are validated too and two more values are returned (private):
        the class counts (K,) and the sample of ``labelled`` rows with their class codes,
        ``(rows, codes)`` in priority order. With ``far`` (``m``), the sample is returned as
        ``(priorities, rows)`` and the far stratum of the features
        (:class:`~klrelease.stream.sample.FarRows`: the rows beyond each feature's ``m``-th
        largest and smallest values), ``(priorities, rows)``, is appended (public, like the
        sample)."""
        classes = self.resolve_classes() if check_labels or labelled else None
        self.resolve_classes()
        # (each chunk keeps its rows beyond the floors in `hint`, which every merge updates:
        # floors of any rows of the data are valid for every row; a chunk read where the
        # hint is not seen, e.g. on a Dask worker, finds floors of its own: the same set)
        hint = {} if far else None
        out = self.reduce(_PooledSample(self.n_features, size, classes, labelled, far, hint),
                          _NotingCut(hint), None, indexed=True)
        sample = out[1].values() if far is None else out[1].with_priorities()
        extra = () if far is None else (out[-1].rows(),)
        if labelled is None:
            return (out[0], sample, *extra)
        return (out[0], sample, out[2], out[3].labelled(), *extra)

    def counts_and_sample(self, size: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """One pass: the class counts (K,) and the sample of ``size`` rows chosen by their
        index, with their class codes ``(rows, codes)`` in priority order (private). Validates
        every chunk like :meth:`moments`."""
        K = self.resolve_classes()
        counts, sample = self.reduce(_CountsSample(self.n_features, K, int(size)), _merge_pairs,
                                     None, indexed=True)
        return counts, sample.labelled()

    def bounded_moments(self, fn: Callable[[np.ndarray, int], np.ndarray]
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One pass: per-class counts (K,), sums (K, d') and raw second moments (K, d', d') of
        ``fn(rows of class k, k)``, a per-class map whose rows are bounded (clipped; see
        :func:`~klrelease.stream.moments.bounded_class_moments`). Validates every chunk like
        :meth:`moments`."""
        return self.scan(_ChunkBounded(len(self.resolve_classes()), fn), add_tuples, None)

    def sums(self, g: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, ...]:
        """One pass: per-class counts (K,) and sums (K, d') of ``g(X)``, a map of each row
        that does not depend on its class, and the sum over all rows (d',) taken in row order,
        so that it reads no label. Validates every chunk like :meth:`moments`."""
        return self.scan(_ChunkSums(len(self.resolve_classes()), g), add_tuples, None)

    # ------------------------------------------------------- row groups (read without a pass)
    def row_groups(self) -> list[int] | None:
        """The number of rows of each of the source's row groups, in order, known without
        reading a row (file metadata), or ``None`` when only a pass can tell (CSV, Dask). A
        row group is the unit :meth:`block_sample` reads."""
        return None

    def read_group(self, g: int) -> tuple[np.ndarray, np.ndarray | None]:  # pragma: no cover
        """The raw rows ``(X, y)`` of row group ``g`` (see :meth:`row_groups`)."""
        raise NotImplementedError

    def block_sample(self, size: int, sizes=None
                     ) -> tuple[int, tuple[np.ndarray, np.ndarray], int]:
        """The labelled sample of a one-pass release, read without a pass over the data.

        N is the sum of the row groups' sizes (metadata); the sample is the rows of
        :func:`~klrelease.stream.sample.sample_blocks` (a function of N alone), read from the
        row groups that hold them and validated like any pass (the other rows of those groups
        are not). ``sizes``: :meth:`row_groups`, if read already. Returns ``(N, (rows,
        codes), rows read)``, the sample in row-priority order (private)."""
        from .sample import priorities_of, sample_blocks

        sizes = self.row_groups() if sizes is None else sizes
        if sizes is None:
            raise ValueError("a one-pass release reads its sample by row groups and needs "
                             "their sizes without reading the data: a Parquet source or "
                             "arrays (CSV and Dask sources must be counted by a pass)")
        sizes = np.asarray(sizes, dtype=np.int64)
        N = int(sizes.sum())
        if N == 0:
            raise ValueError("the data has no rows")
        starts = np.concatenate([[0], np.cumsum(sizes)])
        blocks = sample_blocks(N, size)
        # the row groups that hold a block's rows (empty groups hold none)
        need = sorted({int(g) for a, b in blocks
                       for g in range(int(np.searchsorted(starts, a, side="right")) - 1,
                                      int(np.searchsorted(starts, b, side="left")))
                       if sizes[g] > 0})
        classes = self.resolve_classes()
        X_parts, c_parts, idx_parts, read = [], [], [], 0
        try:
            read_span = self._span_reader()
            for g in need:
                lo, hi = int(starts[g]), int(starts[g + 1])
                # the rows of the group that the blocks hold, converted alone
                first = min(max(a, lo) for a, b in blocks if a < hi and b > lo)
                last = max(min(b, hi) for a, b in blocks if a < hi and b > lo)
                n_group, X, y = read_span(g, first - lo, last - lo)
                if n_group != sizes[g]:
                    raise SourceReadError(CHANGED)
                read += n_group
                for a, b in blocks:  # the block's rows only, validated (copied below)
                    a2, b2 = max(a, first), min(b, last)
                    if a2 < b2:
                        Xb, codes = _chunk(X[a2 - first:b2 - first], y[a2 - first:b2 - first],
                                           self.n_features, classes)
                        X_parts.append(Xb)
                        c_parts.append(codes)
                        idx_parts.append(np.arange(a2, b2))
                del X, y
        except (OSError, EOFError, ValueError) as exc:  # reading, not computing
            raise _read_error(exc) from exc
        # the priorities of distinct rows are distinct (odd multipliers and xor-shifts: a
        # bijection of the index), so any sort gives the stable sort's order; the gathers
        # copy the rows out of the groups' arrays
        order = np.argsort(priorities_of(np.concatenate(idx_parts)))
        X = X_parts[0] if len(X_parts) == 1 else np.concatenate(X_parts)
        codes = c_parts[0] if len(c_parts) == 1 else np.concatenate(c_parts)
        return N, (np.take(X, order, axis=0), np.take(codes, order)), read

    def _span_reader(self) -> Callable[[int, int, int],
                                       tuple[int, np.ndarray, np.ndarray | None]]:
        """``read(g, start, stop)``: rows ``start:stop`` of row group ``g`` (raw, as
        :meth:`read_group` gives them) and the number of rows the group holds (checked against
        its metadata): here the whole group read by :meth:`read_group`, then sliced; a source
        that converts rows can convert those alone, and read its metadata once for every
        group of one sample."""
        def read(g: int, start: int, stop: int):
            X, y = self.read_group(g)
            return len(X), X[start:stop], None if y is None else y[start:stop]

        return read

    # ------------------------------------------------------------- features only (no labels)
    def scan_rows(self, fn: Callable, merge: Callable, initial, *, indexed: bool = False,
                  block_rows: int | None = None):
        """One pass over the features alone (labels, if any, are not read): ``fn(X)`` on every
        validated chunk (``indexed=True``: ``fn(X, offset)``), merged in order; with
        ``block_rows``, on blocks of exactly that many rows (see :meth:`reduce`)."""
        return self.reduce(_Rows(fn, self.n_features), merge, initial, indexed=indexed,
                           block_rows=block_rows)

    def n_rows(self) -> int:
        """One pass: the number of rows, every chunk validated (finite numeric features)."""
        n = self.scan_rows(len, operator.add, 0)
        if n == 0:
            raise SourceReadError("the data has no rows")
        return n

    def to_array(self) -> np.ndarray:
        """Every row's features in one float64 array of shape (N, d): a counting pass, then a
        pass that fills the array allocated for N rows (memory 8 N d bytes and a chunk)."""
        n = self.n_rows()
        out = np.empty((n, self.n_features))

        def fill(X, offset):
            if offset + len(X) > n:
                raise SourceReadError(CHANGED)
            out[offset:offset + len(X)] = X
            return len(X)

        if self.scan_rows(fill, operator.add, 0, indexed=True) != n:
            raise SourceReadError(CHANGED)
        return out


CHANGED = "the data changed between two passes over it"

_DONE = object()


def _reblocked(chunks: Iterator, rows: int) -> Iterator:
    """The rows of ``(X, y)`` chunks as blocks of exactly ``rows`` rows (the last shorter):
    views of a chunk where a block lies within it, copies where a block joins chunks."""
    if rows < 1:
        raise ValueError("block_rows must be >= 1")
    held: list = []  # parts of the next block, fewer than ``rows`` rows in all
    count = 0
    for X, y in chunks:
        a, n = 0, len(X)
        while a < n:
            take = min(rows - count, n - a)
            held.append((X[a:a + take], None if y is None else y[a:a + take]))
            count += take
            a += take
            if count == rows:
                yield _joined(held)
                held, count = [], 0
    if held:
        yield _joined(held)


def _joined(parts: list) -> tuple:
    if len(parts) == 1:
        return parts[0]
    X = np.concatenate([np.asarray(p[0], dtype=np.float64) for p in parts])
    y = None if parts[0][1] is None else np.concatenate([p[1] for p in parts])
    return X, y


def _prefetched(chunks: Iterator, depth: int = 2) -> Iterator:
    """The items of ``chunks``, produced on a second thread up to ``depth`` items ahead (in
    the same order). An exception of the producer is raised here, where the item would have
    been; when the consumer stops early, the producer stops and closes ``chunks``. Where no
    thread can be started, the items are read on the caller's thread."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce():
        try:
            for item in chunks:
                while not stop.is_set():
                    try:
                        q.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put((_DONE, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            q.put((_DONE, exc))
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="klrelease-prefetch", daemon=True)
    try:
        thread.start()
    except (RuntimeError, MemoryError):  # no thread to be had: read on this one (a pass after
        # noise must not fail for want of a thread)
        yield from chunks
        return
    try:
        while True:
            item, exc = q.get()
            if item is _DONE:
                if exc is not None:
                    raise exc
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # let a blocked put finish
            try:
                q.get_nowait()
            except queue.Empty:
                thread.join(0.05)


# ------------------------------------------------------------ per-chunk work (shipped to
# workers: plain data, no source object)


def _chunk(X, y, d: int, classes: tuple | None) -> tuple[np.ndarray, np.ndarray | None]:
    """A validated chunk: float64 features of width ``d`` and (unless ``classes`` is None)
    labels as class codes. Messages name the rule, never a value; a chunk that does not
    validate raises :class:`SourceReadError`."""
    try:
        X = _features(X)
        if X.shape[1] != d:
            raise ValueError("every chunk must have the same number of feature columns")
        if classes is None:
            return X, None
        if len(y) != X.shape[0]:
            raise ValueError("X and y must have the same number of rows")
        return X, _labels(y, classes)
    except ValueError as exc:
        raise _read_error(exc) from None


@dataclass(frozen=True)
class _Rows:
    """``fn(X)`` of a chunk's validated features (``fn(X, offset)`` when indexed)."""

    fn: Callable
    d: int

    def __call__(self, X, y, *offset):
        return self.fn(_chunk(X, None, self.d, None)[0], *offset)


@dataclass(frozen=True)
class _Validated:
    """``fn(X, codes)`` of a validated chunk."""

    fn: Callable
    d: int
    classes: tuple

    def __call__(self, X, y, *offset):
        return self.fn(*_chunk(X, y, self.d, self.classes), *offset)


def _chunk_range(X, codes):
    return None if X.shape[0] == 0 else (X.min(axis=0), X.max(axis=0))


@dataclass(frozen=True)
class _ChunkMoments:
    n_classes: int
    f: RowMap | None

    def __call__(self, X, codes):
        return chunk_moments(X, codes, self.n_classes, self.f)


@dataclass(frozen=True)
class _ChunkBounded:
    n_classes: int
    fn: Callable

    def __call__(self, X, codes):
        return bounded_class_moments(X, codes, self.n_classes, self.fn)


@dataclass(frozen=True)
class _ChunkSums:
    n_classes: int
    g: Callable

    def __call__(self, X, codes):
        U = np.asarray(self.g(X), dtype=np.float64)
        return (*class_sums(U, codes, self.n_classes), column_sums(U))


@dataclass(frozen=True)
class _PooledSample:
    d: int
    size: int | None
    classes: tuple | None = None  # validate the labels too
    labelled: int | None = None  # and keep a sample of this many rows with their labels
    far: int | None = None  # and the far stratum of the features (m per side of each)
    hint: dict | None = field(default=None, compare=False)  # {"cut": the merged rows' cuts}

    def __call__(self, X, y, offset):
        X, codes = _chunk(X, y, self.d, self.classes)
        m, lo, hi = pooled_moments(X, extremes=True)  # (the extremes: the frame's winsorising)
        out = (ClassMoments(m.counts, m.means, m.scatters, lo, hi),
               RowSample.of(X, offset, self.size))
        if self.labelled is not None:
            out = (*out, np.bincount(codes, minlength=len(self.classes)).astype(float),
                   RowSample.of(X, offset, self.labelled, codes))
        if self.far is None:
            return out
        cut = None if self.hint is None else self.hint.get("cut")
        return (*out, FarRows.of(X, offset, self.far, cut) if self.far > 0
                else FarRows(0, np.empty(0, np.uint64), np.empty((0, X.shape[1]))))


@dataclass(frozen=True)
class _CountsSample:
    d: int
    classes: tuple
    size: int

    def __call__(self, X, y, offset):
        X, codes = _chunk(X, y, self.d, self.classes)
        return (np.bincount(codes, minlength=len(self.classes)).astype(float),
                RowSample.of(X, offset, self.size, codes))


def _merge_moments(a, b):
    return b if a is None else a.merge(b)


def _merge_pairs(a, b):
    """Merge tuples of :class:`~klrelease.stream.moments.ClassMoments`, row samples and
    arrays (added)."""
    if a is None:
        return b
    return tuple(u.merge(v) if hasattr(u, "merge") else u + v
                 for u, v in zip(a, b, strict=True))


@dataclass(frozen=True)
class _NotingCut:
    """:func:`_merge_pairs`, noting the far stratum's cuts (the last item) in ``hint``."""

    hint: dict | None

    def __call__(self, a, b):
        out = _merge_pairs(a, b)
        if self.hint is not None:
            self.hint["cut"] = out[-1].cut
        return out


def _merge_range(a, b):
    if a is None or b is None:
        return b if a is None else a
    return np.minimum(a[0], b[0]), np.maximum(a[1], b[1])


def add_tuples(a, b):
    """Merge of tuples of partial sums (``None``: nothing yet)."""
    return b if a is None else tuple(u + v for u, v in zip(a, b, strict=True))


def _present_labels(y) -> np.ndarray:
    _check_one_label_type(y)
    y = np.asarray(y)
    if y.dtype.kind == "O":
        y = y.astype(str)
    if y.dtype.kind == "f":
        if not np.all(np.isfinite(y)):
            raise ValueError("y contains NaN or infinite labels; labels must be class identifiers")
        if np.any(y != np.round(y)):
            raise ValueError("y contains non-integer numbers; labels must be class identifiers "
                             "(integers or strings)")
        y = y.astype(np.int64)
    return np.unique(y)


def _union(a, b):
    if a.size == 0:
        return b
    if a.dtype.kind != b.dtype.kind:
        raise ValueError("the labels mix text and numbers")
    return np.union1d(a, b)


# ---------------------------------------------------------------------------- in memory


class ArraySource(Source):
    """Arrays in memory or memory-mapped (``np.load(path, mmap_mode="r")``), read in chunks.

    ``y=None``: rows without labels (for the passes over the features alone,
    :meth:`Source.scan_rows`)."""

    def __init__(self, X, y, *, classes=None, bounds=None, norm_bound=None,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS, feature_names=None):
        super().__init__(classes, bounds, norm_bound)
        if getattr(X, "ndim", None) != 2:
            X = np.asarray(X)
        if X.ndim != 2:
            raise ValueError("X must be two-dimensional (n_samples, n_features)")
        if np.iscomplexobj(X):
            raise ValueError("X must hold real numbers; complex values are not supported")
        if y is not None:
            if classes is None:
                _check_one_label_type(y)
            y = np.asarray(y) if not isinstance(y, np.ndarray) else y
            if y.ndim == 2 and 1 in y.shape:
                y = y.reshape(-1)
            if y.ndim != 1 or y.shape[0] != X.shape[0]:
                raise ValueError("X and y must have the same number of rows")
        if X.shape[0] == 0 or X.shape[1] == 0:
            raise ValueError("X must have at least one row and one column")
        if int(chunk_rows) < 1:
            raise ValueError("chunk_rows must be >= 1")
        self.X, self.y, self.chunk_rows = X, y, int(chunk_rows)
        self.n_features = X.shape[1]
        self.feature_names = tuple(feature_names) if feature_names is not None else tuple(
            f"x{i}" for i in range(self.n_features))

    def chunks(self):
        n, c = self.X.shape[0], self.chunk_rows
        for a in range(0, n, c):
            yield self.X[a:a + c], None if self.y is None else self.y[a:a + c]

    def row_groups(self) -> list[int]:
        """Blocks of ``chunk_rows`` rows (the last shorter)."""
        n, c = self.X.shape[0], self.chunk_rows
        return [min(c, n - a) for a in range(0, n, c)]

    def read_group(self, g: int):
        a, c = g * self.chunk_rows, self.chunk_rows
        return self.X[a:a + c], None if self.y is None else self.y[a:a + c]


# -------------------------------------------------------------------------------- files


def _paths(path_or_glob, suffix: str) -> list[Path]:
    items = [path_or_glob] if isinstance(path_or_glob, (str, Path)) else list(path_or_glob)
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            out.extend(sorted(p.glob(f"*{suffix}")))
        elif any(ch in str(item) for ch in "*?["):
            out.extend(Path(q) for q in sorted(glob.glob(str(item))))
        else:
            out.append(p)
    if not out:
        raise ValueError(f"no {suffix} file matches {path_or_glob}")
    for p in out:
        if not p.is_file():
            raise ValueError(f"cannot read {p}: no such file")
    return out


class ParquetSource(Source):
    """Parquet files (a path, a directory, a glob or a list), read in record batches (the
    next batch is decoded while this one is reduced).

    Every column except ``label_column`` is a feature (or only ``feature_columns``); the
    files are read in sorted path order. ``label_column=None``: rows without labels (every
    column, or ``feature_columns``, a feature).
    """

    def __init__(self, path, label_column: str | None, *,
                 feature_columns: Sequence[str] | None = None, classes=None, bounds=None,
                 norm_bound=None, chunk_rows: int = DEFAULT_CHUNK_ROWS):
        import pyarrow.parquet as pq

        super().__init__(classes, bounds, norm_bound)
        self.paths = _paths(path, ".parquet")
        self.label_column = label_column
        self.chunk_rows = int(chunk_rows)
        names = None
        for p in self.paths:
            try:
                schema = pq.read_schema(p)
            except Exception as exc:  # pyarrow raises several types
                raise ValueError(f"cannot read {p}: {exc.__class__.__name__}") from None
            if names is None:
                names = list(schema.names)
            elif list(schema.names) != names:
                raise ValueError("the Parquet files do not all have the same columns")
        if label_column is not None and label_column not in names:
            raise ValueError(f"the Parquet data has no column named {label_column!r}")
        feats = [c for c in names if c != label_column] if feature_columns is None else list(
            feature_columns)
        missing = [c for c in feats if c not in names]
        if missing or not feats:
            raise ValueError("feature_columns must name columns of the Parquet data")
        self.feature_names = tuple(feats)
        self.n_features = len(feats)

    prefetch = True

    def on_dask(self, client=None) -> DaskSource:
        """The same files as a Dask dataframe read by the workers of ``client`` (same files,
        same order, same columns, classes and bound)."""
        import dask.dataframe as dd

        if self.label_column is None:
            raise ValueError("on_dask needs a label column")
        cols = [*self.feature_names, self.label_column]
        ddf = dd.read_parquet([str(p) for p in self.paths], columns=cols)
        return DaskSource(ddf, label_column=self.label_column,
                          classes=self.classes if self.classes_declared else None,
                          bounds=self.bounds, norm_bound=self.norm_bound, client=client)

    @property
    def _columns(self) -> list[str]:
        return [*self.feature_names, *([] if self.label_column is None else
                                       [self.label_column])]

    def chunks(self):
        import pyarrow.parquet as pq

        cols = self._columns
        for p in self.paths:
            with pq.ParquetFile(p) as fh:
                for batch in fh.iter_batches(batch_size=self.chunk_rows, columns=cols):
                    yield _batch_xy(batch, self.feature_names, self.label_column)

    def _groups(self) -> list[tuple[Path, int, int]]:
        """``(path, row group, rows)`` of every row group, in reading order (the files'
        footers only, read again at every call: files may change between releases)."""
        import pyarrow.parquet as pq

        out = []
        for p in self.paths:
            try:
                meta = pq.read_metadata(p)
            except Exception as exc:  # pyarrow raises several types
                raise SourceReadError(f"cannot read {p}: {exc.__class__.__name__}") from None
            out.extend((p, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups))
        return out

    def row_groups(self) -> list[int]:
        """The files' row groups (from their footers), in reading order."""
        return [n for _, _, n in self._groups()]

    def read_group(self, g: int):
        return _batch_xy(self._group_table(self._groups()[g]), self.feature_names,
                         self.label_column)

    def _group_table(self, where):
        import pyarrow.parquet as pq

        p, i, _ = where
        with pq.ParquetFile(p) as fh:
            return fh.read_row_group(i, columns=self._columns)

    def _span_reader(self):
        """The files' footers read once; each group read whole (its columns' pages), its
        rows ``start:stop`` alone converted to arrays (a slice of the table: no copy)."""
        where = self._groups()

        def read(g: int, start: int, stop: int):
            table = self._group_table(where[g])
            X, y = _batch_xy(table.slice(start, max(stop - start, 0)), self.feature_names,
                             self.label_column)
            return table.num_rows, X, y

        return read


def _batch_xy(batch, features, label_column):
    X = np.empty((batch.num_rows, len(features)))
    for j, name in enumerate(features):
        col = batch.column(name)
        try:
            X[:, j] = col.to_numpy(zero_copy_only=False)
        except (TypeError, ValueError):
            raise ValueError("every feature column must be numeric") from None
    if label_column is None:
        return X, None
    return X, batch.column(label_column).to_numpy(zero_copy_only=False)


class CSVSource(Source):
    """A CSV file with a header row, read in blocks with pyarrow's streaming reader (the next
    block is parsed while this one is reduced).

    Features are read as float64 and labels as text (matched to the classes by value, so a
    label never changes how the others are typed). Every column except ``label_column`` is a
    feature, or only ``feature_columns`` (the other columns are not converted);
    ``label_column=None``: rows without labels. Errors are worded as
    :func:`klrelease.data.load_csv` words them (a file name and a rule, never a value).
    """

    def __init__(self, path, label_column: str | None, *,
                 feature_columns: Sequence[str] | None = None, classes=None, bounds=None,
                 norm_bound=None, block_bytes: int = 1 << 24, delimiter: str = ","):
        super().__init__(classes, bounds, norm_bound)
        self.paths = _paths(path, ".csv")
        self.label_column, self.block_bytes, self.delimiter = label_column, block_bytes, delimiter
        header = None
        for p in self.paths:
            first = read_csv_header(p, delimiter)
            if first is None:
                raise ValueError(f"{p} is empty")
            if label_column is not None and label_column not in first:
                raise ValueError(f"{p} has no column named {label_column!r}")
            if header is None:
                header = first
            elif first != header:
                raise ValueError("the CSV files do not all have the same header")
        if feature_columns is None:
            feats = [h for h in header if h != label_column]
        else:
            feats = list(feature_columns)
            missing = [c for c in feats if c not in header]
            if missing:
                raise ValueError(f"{self.paths[0]} has no column(s) "
                                 f"{', '.join(map(repr, missing))}")
        if not feats:
            raise ValueError(f"{self.paths[0]} has no feature columns")
        self.feature_names = tuple(feats)
        self.n_features = len(self.feature_names)
        self._read_all = feature_columns is None

    prefetch = True

    def chunks(self):
        import pyarrow as pa
        import pyarrow.csv as pcsv

        types = {n: pa.float64() for n in self.feature_names}
        cols = list(self.feature_names)
        if self.label_column is not None:
            types[self.label_column] = pa.string()
            cols.append(self.label_column)
        convert = pcsv.ConvertOptions(column_types=types) if self._read_all else \
            pcsv.ConvertOptions(column_types=types, include_columns=cols)
        what = (f"every column except {self.label_column!r}" if self.label_column is not None
                else "every column") if self._read_all else "the feature columns"
        for p in self.paths:
            rows = 0
            try:
                reader = pcsv.open_csv(
                    p, read_options=pcsv.ReadOptions(block_size=self.block_bytes),
                    parse_options=pcsv.ParseOptions(delimiter=self.delimiter),
                    convert_options=convert)
                for batch in reader:
                    rows += batch.num_rows
                    yield _batch_xy(batch, self.feature_names, self.label_column)
            except pa.ArrowInvalid as exc:
                # pyarrow's message quotes the offending row: only its kind is used
                if "columns, got" in str(exc):
                    raise ValueError(f"{p} has rows with a different number of fields than "
                                     "its header") from None
                raise ValueError(f"{p}: {what} must be numeric") from None
            if rows == 0:
                raise ValueError(f"{p} has no data rows")


# -------------------------------------------------------------------------------- dask


def is_dask_collection(obj) -> bool:
    """Whether ``obj`` is a Dask collection (without importing dask when it is not loaded)."""
    import sys

    if "dask" not in sys.modules:
        return False
    from dask import is_dask_collection as isd

    return bool(isd(obj))


def _run_part(fn, X, y, offset=None):
    return fn(X, y) if offset is None else fn(X, y, offset)


def _frame_part(fn, df, features, label_column, offset=None):
    try:
        X = df[list(features)].to_numpy(dtype=np.float64)
    except (TypeError, ValueError):  # pandas' message quotes the value
        raise SourceReadError("every feature must be numeric") from None
    y = df[label_column].to_numpy()
    return fn(X, y) if offset is None else fn(X, y, offset)


class DaskSource(Source):
    """A Dask array ``X`` with labels ``y`` (a Dask array or array), or a Dask dataframe with
    a label column. A pass runs ``fn`` on every partition on the cluster and merges the small
    partial results (K x d x d numbers each) pairwise on the cluster, in a tree over the
    partitions in order; the driver receives one result per pass. The design and the noise
    never leave the driver.

    ``client`` is a :class:`distributed.Client` (default: Dask's current scheduler).
    """

    def __init__(self, X, y=None, *, label_column: str | None = None, classes=None,
                 bounds=None, norm_bound=None, client=None):
        import dask.array as da

        super().__init__(classes, bounds, norm_bound)
        self.client = client
        if hasattr(X, "columns") and hasattr(X, "to_delayed"):  # a dask dataframe
            if label_column is None or label_column not in X.columns:
                raise ValueError("a Dask dataframe needs label_column= naming its label column")
            self.kind, self.label_column = "frame", label_column
            self.feature_names = tuple(str(c) for c in X.columns if c != label_column)
            self.n_features = len(self.feature_names)
            self.X = X
            return
        X = X if isinstance(X, da.Array) else da.asarray(X)
        if X.ndim != 2:
            raise ValueError("X must be two-dimensional (n_samples, n_features)")
        if y is None:
            raise ValueError("a Dask array X needs labels y")
        y = y if isinstance(y, da.Array) else da.from_array(np.asarray(y), chunks=X.chunks[0])
        if y.ndim == 2 and 1 in y.shape:
            y = y.reshape(-1)
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise ValueError("X and y must have the same number of rows")
        self.kind = "array"
        self.X = X.rechunk({1: -1})
        self.y = y.rechunk((self.X.chunks[0],))
        self.n_features = X.shape[1]
        self.feature_names = tuple(f"x{i}" for i in range(self.n_features))

    def _offsets(self) -> list[int]:
        """The index of every partition's first row (a dataframe's partition lengths are
        computed once)."""
        if self.kind == "frame":
            if getattr(self, "_lengths", None) is None:
                lens = self.X.map_partitions(len)
                self._lengths = [int(v) for v in (
                    self.client.compute(lens).result() if self.client is not None
                    else lens.compute())]
            lengths = self._lengths
        else:
            lengths = list(self.X.chunks[0])
        return [int(v) for v in np.concatenate([[0], np.cumsum(lengths)[:-1]])]

    def _parts(self, fn, indexed: bool = False):
        import dask

        offsets = self._offsets() if indexed else None
        if self.kind == "frame":
            task = dask.delayed(_frame_part, pure=True)
            parts = list(self.X.to_delayed())
            return [task(fn, p, self.feature_names, self.label_column,
                         None if offsets is None else offsets[i])
                    for i, p in enumerate(parts)]
        task = dask.delayed(_run_part, pure=True)
        xs = self.X.to_delayed().ravel()
        ys = self.y.to_delayed().ravel()
        return [task(fn, a, b, None if offsets is None else offsets[i])
                for i, (a, b) in enumerate(zip(xs, ys, strict=True))]

    def chunks(self):  # local fallback (one partition at a time on the driver)
        for part in self._parts(lambda X, y: (np.asarray(X), np.asarray(y))):
            yield part.compute(scheduler="sync")

    def reduce(self, fn, merge, initial, *, indexed: bool = False):
        import dask

        parts = self._parts(fn, indexed)
        if not parts:
            return initial
        # merge pairwise on the workers (a tree): the driver receives one result per pass
        task = dask.delayed(merge, pure=True)
        while len(parts) > 1:
            parts = [task(parts[i], parts[i + 1]) if i + 1 < len(parts) else parts[i]
                     for i in range(0, len(parts), 2)]
        try:
            if self.client is not None:
                result = self.client.compute(parts[0]).result()
            else:
                (result,) = dask.compute(parts[0])
        except (OSError, EOFError) as exc:  # a partition that cannot be read
            raise _read_error(exc) from exc
        return merge(initial, result)


def as_source(X, y=None, *, classes=None, bounds=None, norm_bound=None, client=None,
              label_column: str | None = None):
    """``X`` as a :class:`Source` when it is one or a Dask collection, else ``None``. A given
    source is copied before ``classes``, ``bounds``, ``norm_bound`` or ``client`` apply (the
    caller's object, and what a later release of it assumes, are left as they were)."""
    if isinstance(X, Source):
        if y is not None:
            raise ValueError("y goes with arrays; a data source carries its own labels")
        import copy

        X = copy.copy(X)
        if classes is not None:
            X.classes, X.classes_declared = typed_classes(classes), True
        if bounds is not None:
            X.bounds = bounds
        if norm_bound is not None:
            X.norm_bound = norm_bound
        if client is not None and isinstance(X, DaskSource):
            X.client = client
        return X
    if is_dask_collection(X) or is_dask_collection(y):
        return DaskSource(X, y, label_column=label_column, classes=classes, bounds=bounds,
                          norm_bound=norm_bound, client=client)
    return None
