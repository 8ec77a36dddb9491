"""Releases at any size: per-class statistics accumulated over chunks.

* :class:`ClassMoments`: per-class count, mean and centred scatter, merged exactly and stably
  (Chan et al.'s parallel update); :func:`chunk_moments` reduces one chunk after a per-row map
  ``f(rows, codes) -> rows``; :func:`bounded_class_moments` the plain sums and second moments
  of a per-class map whose rows are bounded (clipped).
* Sources read a labelled dataset in chunks: :class:`ArraySource` (arrays, memmaps),
  :class:`ParquetSource` and :class:`CSVSource` (pyarrow), :class:`DaskSource` (Dask arrays
  and dataframes, on a ``distributed`` cluster). Each runs passes ``Source.moments(f)``.
* :func:`sample_rows` / :class:`RowSample`: a fixed-size sample of rows chosen by their
  index, the same however the rows are read (for public features).

``klrelease.release`` accepts a source (or a Dask collection) as ``X`` for the mechanisms that
stream: those that need only these statistics (``kl-certified``, ``gaussian-iid``,
``laplace-iid``, ``colored-gaussian``, ``r1smg``; each chunk clipped before accumulation) and
``kl-paper``, whose neighbour constraints are then scored in passes over the chunks
(:mod:`klrelease.solvers.passes`).
"""

from __future__ import annotations

from .moments import (
    ClassMoments,
    RowMap,
    bounded_class_moments,
    chunk_moments,
    class_sums,
    pooled_moments,
)
from .sample import RowSample, sample_rows
from .sources import (
    DEFAULT_CHUNK_ROWS,
    ArraySource,
    CSVSource,
    DaskSource,
    ParquetSource,
    Source,
    SourceReadError,
    add_tuples,
    as_source,
    is_dask_collection,
)

__all__ = [
    "ClassMoments",
    "RowMap",
    "chunk_moments",
    "class_sums",
    "bounded_class_moments",
    "pooled_moments",
    "RowSample",
    "sample_rows",
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
