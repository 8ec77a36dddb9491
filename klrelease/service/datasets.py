"""Registering a dataset with the service, and reading it at release time.

Registration is the data owner's act. It fixes the public inputs of every release of the
dataset: where it is read (a CSV file, Parquet files, read locally or by the workers of a Dask
cluster, or a bundled dataset), the label column,
the declared classes, the public bound on the features (a box or a ball; required by the
record-level relation ``replace-one``), the neighbouring relation, and the budget. It reads the
data once, through the same chunked sources as ``klrelease release``, to validate every row
and record N (a public input of the proofs, computed by the owner) and d. An analyst can
override none of these; the dataset's N and path are never shown to an analyst.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

from ..data import DATASETS, load_dataset, typed_classes
from ..domain import Domain
from ..neighbours import Adjacency
from ..privacy.guarantee import BudgetAccountant
from .ledger import DatasetRecord

__all__ = ["registration", "open_source", "NAME_RULE", "parse_bounds"]

NAME_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def parse_bounds(text: str | None):
    """``--bounds LOWER:UPPER``: numbers or comma lists (one per feature), e.g. ``0:10`` or
    ``4,2,1,0:8,4.5,7,2.6``; ``(lower, upper)`` or ``None``."""
    if text is None:
        return None
    lo, sep, hi = str(text).partition(":")
    if not sep:
        raise ValueError("--bounds takes LOWER:UPPER (numbers or comma lists), e.g. 0:10")
    try:
        lower = [float(v) for v in lo.split(",")]
        upper = [float(v) for v in hi.split(",")]
    except ValueError:
        raise ValueError("--bounds takes LOWER:UPPER (numbers or comma lists), e.g. 0:10"
                         ) from None
    return (lower[0] if len(lower) == 1 else lower, upper[0] if len(upper) == 1 else upper)


def registration(name: str, *, csv: str | None = None, parquet: str | None = None,
                 bundled: str | None = None, label_column: str | None = None,
                 classes=None, bounds=None, norm_bound: float | None = None,
                 adjacency: str = "label-flip", budget_epsilon: float,
                 budget_delta: float, max_epsilon_per_request: float | None = None,
                 dask: str | None = None) -> dict[str, Any]:
    """Validate a registration and read the data once; the ledger row of the dataset.

    Raises
    ------
    ValueError
        One line naming the input and the rule it breaks (never a data value).
    """
    if not NAME_RULE.match(name or ""):
        raise ValueError("a dataset name is 1-64 letters, digits, '.', '_' or '-', starting "
                         "with a letter or digit")
    BudgetAccountant(budget_epsilon, budget_delta)  # validates the total
    if max_epsilon_per_request is not None and not 0 < max_epsilon_per_request <= budget_epsilon:
        raise ValueError("--max-epsilon-per-request must lie in (0, budget epsilon]")
    try:
        relation = Adjacency(adjacency)
    except ValueError:
        raise ValueError(f"unknown adjacency {adjacency!r}; accepted: label-flip, "
                         "replace-one") from None
    if relation not in (Adjacency.LABEL_FLIP, Adjacency.REPLACE_ONE):
        raise ValueError("a served dataset's adjacency is label-flip or replace-one")
    if sum(x is not None for x in (csv, parquet, bundled)) != 1:
        raise ValueError("give exactly one of --csv PATH, --parquet GLOB or --bundled NAME")
    domain = Domain.from_public(bounds, norm_bound)
    if bundled is not None:
        if dask is not None:
            raise ValueError("--dask goes with --parquet")
        if bundled not in DATASETS:
            raise ValueError(f"unknown bundled dataset {bundled!r}; available: "
                             f"{', '.join(sorted(DATASETS))}")
        if classes is not None or domain is not None or label_column is not None:
            raise ValueError("a bundled dataset declares its own classes, bounds and labels")
        data = load_dataset(bundled)
        source = {"kind": "bundled", "name": bundled}
        n, d, names, declared = (data.n_samples, data.n_features, data.feature_names,
                                 data.classes)
        domain = data.domain
    else:
        if label_column is None:
            raise ValueError("--label-column is required with --csv or --parquet")
        if classes is None:
            raise ValueError("--classes a,b,c is required: the declared classes are a public "
                             "input of every release (read from the labels they are not)")
        declared = typed_classes(classes)
        if len(declared) < 2:
            raise ValueError("declare at least two classes")
        raw = str(csv if csv is not None else parquet)
        source = {"kind": "csv" if csv is not None else "parquet",
                  "path": os.path.abspath(os.path.expanduser(raw)), "label_column": label_column}
        if dask is not None:
            if parquet is None:
                raise ValueError("--dask goes with --parquet (the workers read the files)")
            source["dask"] = str(dask)
        src = _file_source(source, declared, domain)
        counts = src.moments().counts  # one pass: validates every row and label
        n, d, names = int(round(float(counts.sum()))), src.n_features, src.feature_names
        if n == 0:
            raise ValueError("the data has no rows")
    if relation != Adjacency.LABEL_FLIP and domain is None:
        raise ValueError(f"{relation.value} protects the features too: give a public bound "
                         "(--bounds LOWER:UPPER or --norm-bound B); rows are clipped to it")
    if domain is not None:
        domain = domain.for_features(d)
    return {
        "name": name, "source": source, "classes": list(declared),
        "feature_names": list(names), "bound": None if domain is None else domain.to_json(),
        "adjacency": relation.value, "n_samples": n, "n_features": d,
        "budget_epsilon": float(budget_epsilon), "budget_delta": float(budget_delta),
        "max_epsilon_per_request": (None if max_epsilon_per_request is None
                                    else float(max_epsilon_per_request)),
    }


def _file_source(source: dict, classes, domain):
    from ..stream import CSVSource, ParquetSource

    kind = CSVSource if source["kind"] == "csv" else ParquetSource
    src = kind(source["path"], source["label_column"], classes=classes, bounds=domain)
    if source.get("dask"):
        return src.on_dask(_dask_client(source["dask"]))
    return src


_CLIENTS: dict[str, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _dask_client(address: str):
    """One ``distributed.Client`` per scheduler address in this process."""
    try:
        import distributed
    except ImportError:
        raise ValueError("a dataset read on a Dask cluster needs the dask extra: pip install "
                         "'klrelease[dask]'") from None
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(address)
        if client is None or client.status not in ("running", "connecting"):
            client = distributed.Client(address, set_as_default=False, timeout=30)
            _CLIENTS[address] = client
        return client


def open_source(ds: DatasetRecord):
    """The data of ``ds`` for one release, to pass to :func:`klrelease.release`: a chunked
    source (with the declared classes and the public bound) for files, the arrays of a bundled
    dataset.

    Called only after the release was charged: reading the data is part of the release.
    """
    if ds.source["kind"] == "bundled":
        return load_dataset(ds.source["name"])
    domain = None if ds.bound is None else Domain.from_json(ds.bound)
    return _file_source(ds.source, ds.classes, domain)
