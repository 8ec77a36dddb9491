"""``klrelease release | sample | inspect | mechanisms``."""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from typing import Annotated

import typer

from .app import (
    DATASET_HELP,
    ONE_INPUT_WITH_PARQUET,
    Force,
    _fail,
    _load_input,
    app,
    atomic_output,
    check_output,
    cli_message,
    describe_output,
    err_console,
    mechanism_inputs,
    option_help,
    out_console,
)

__all__ = ["release", "sample", "inspect", "list_mechanisms"]

#: Rows drawn and written per block by ``sample`` (memory does not grow with ``-n``).
SAMPLE_CHUNK = 65536


def warn_uncertified(caught, statement: str | None) -> None:
    """One visible ``warning:`` line per distinct privacy or unused-bound warning (and the
    statement)."""
    from rich.markup import escape

    from ..warnings_ import PrivacyLeakWarning, UnusedBoundWarning

    lines = []
    for w in caught:
        if (issubclass(w.category, (PrivacyLeakWarning, UnusedBoundWarning))
                and str(w.message) not in lines):
            lines.append(str(w.message))
    if statement is not None and not any(statement in x for x in lines):
        lines.append(statement)
    for line in lines:
        err_console.print(f"[bold red]warning:[/] {escape(cli_message(line))}",
                          highlight=False)


@app.command()
def release(
    epsilon: Annotated[float, typer.Option(help="privacy parameter epsilon (> 0)")],
    delta: Annotated[float, typer.Option(help="privacy parameter delta, in (0, 1)")],
    dataset: Annotated[str | None, typer.Option(help=DATASET_HELP)] = None,
    csv: Annotated[Path | None, typer.Option(
        help="CSV file with a header row (read in blocks by the mechanisms that stream)")] = None,
    label_column: Annotated[str | None, typer.Option(help="label column of --csv")] = None,
    npz: Annotated[Path | None, typer.Option(help=".npz file with arrays X and y")] = None,
    parquet: Annotated[str | None, typer.Option(
        help="Parquet file(s): a path, a directory or a glob, read in chunks (bounded memory; "
             "the mechanisms that stream)")] = None,
    dask: Annotated[str | None, typer.Option(
        help="with --parquet: compute the statistics on a Dask cluster: --dask alone or "
             "--dask local (a local cluster of 2 workers) or --dask tcp://HOST:PORT (an "
             "existing scheduler)")] = None,
    mechanism: Annotated[str, typer.Option(help="see 'klrelease mechanisms'")] = "kl-certified",
    out: Annotated[Path, typer.Option(
        help="where to write the artifact ('-': standard output)")] = Path("release.json"),
    seed: Annotated[
        int | None, typer.Option(help="reproducible noise, for experiments only (not certified)")
    ] = None,
    classes: Annotated[
        str | None, typer.Option(help="the public set of classes, a,b,c (default: the labels "
                                      "present, which the claim then does not protect)")
    ] = None,
    lower: Annotated[str | None, typer.Option(help="public lower bound(s), comma list")] = None,
    upper: Annotated[str | None, typer.Option(help="public upper bound(s), comma list")] = None,
    norm_bound: Annotated[float | None, typer.Option(help="public bound on ||x||_2")] = None,
    option: Annotated[list[str] | None, typer.Option(help=option_help())] = None,
    force: Force = False,
):
    """Release a differentially private GMM of a labelled dataset."""
    from .. import release as do_release
    from ..data import check_privacy_parameters
    from ..learners.result import MechanismFailed
    from ..mechanisms import get_mechanism

    eps, dlt = check_privacy_parameters(epsilon, delta)
    mech = get_mechanism(mechanism)
    opts, bounds, classes = mechanism_inputs(mech, option, lower, upper, norm_bound, classes)
    if seed is not None and seed < 0:
        _fail(f"--seed must be a non-negative integer, got {seed}")
    check_output(out, force, stdout=True)
    if dask is not None and parquet is None:
        _fail("--dask goes with --parquet")
    if parquet is not None:
        if any(x is not None for x in (dataset, csv, npz)):
            _fail(ONE_INPUT_WITH_PARQUET)
        if label_column is None:
            _fail("--parquet needs --label-column NAME")
        if not getattr(mech, "streams", False):
            _fail(f"--parquet streams the data; {mech.name} needs it in memory (use a "
                  "mechanism that streams, e.g. kl-certified)")
        from ..stream import ParquetSource

        data = ParquetSource(parquet, label_column, classes=classes)
    elif csv is not None and getattr(mech, "streams", False) and dataset is None and npz is None:
        if label_column is None:
            _fail("--csv needs --label-column NAME")
        from ..stream import CSVSource

        data = CSVSource(csv, label_column, classes=classes)  # read in blocks by the release
    else:
        data = _load_input(dataset, csv, label_column, npz, classes, parquet=True)
    with warnings.catch_warnings(record=True) as caught, _dask_client(dask) as client:
        warnings.simplefilter("always")
        if client is not None:
            data = data.on_dask(client)
        with err_console.status(f"designing {mech.name} ..."):
            try:
                rel = do_release(data, None, epsilon=eps, delta=dlt, mechanism=mech.name,
                                 seed=seed, bounds=bounds, **opts)
            except MechanismFailed as exc:  # a FAIL output of the mechanism: its artifact
                with atomic_output(out, force=force, stdout=True) as fh:
                    fh.write(exc.to_json())
                err_console.print(f"wrote the FAIL artifact to {describe_output(out)}",
                                  highlight=False)
                raise
    with atomic_output(out, force=force, stdout=True) as fh:
        fh.write(rel.to_json())
    err_console.print(f"wrote {describe_output(out)}: {rel.summary()}", highlight=False)
    warn_uncertified(caught, None if rel.privacy.certified else rel.privacy.statement)


@contextlib.contextmanager
def _dask_client(address: str | None):
    """A ``distributed.Client``: a local cluster for ``local``, else the scheduler at
    ``address``; ``None`` without ``--dask``."""
    if address is None:
        yield None
        return
    try:
        import distributed
    except ImportError:
        _fail("--dask needs the dask extra: pip install 'klrelease[dask]'")
    if address in ("", "local"):
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                      dashboard_address=None) as cluster, \
                distributed.Client(cluster) as client:
            yield client
    else:
        with distributed.Client(address) as client:
            yield client


#: ``sample``'s output formats, and the suffixes of --out that choose Parquet.
SAMPLE_FORMATS = ("csv", "parquet")
PARQUET_SUFFIXES = (".parquet", ".pq")


@app.command()
def sample(
    artifact: Annotated[Path, typer.Argument(
        help="a release artifact or a learner's (JSON)")],
    n: Annotated[int, typer.Option("-n", "--n", help="number of rows")] = 1000,
    out: Annotated[Path, typer.Option(
        help="CSV or Parquet file to write ('-': standard output)")] = Path("synthetic.csv"),
    seed: Annotated[int | None, typer.Option(
        help="seed for the synthetic draw: reproducible, for experiments (default: the "
             "operating system's CSPRNG)")] = None,
    fmt: Annotated[str | None, typer.Option(
        "--format", help="csv or parquet (default: parquet when --out ends in .parquet or "
                         ".pq, else csv)")] = None,
    force: Force = False,
):
    """Draw synthetic labelled rows from a released GMM (post-processing: no privacy cost).

    Reads a release or a learner's artifact; the label of a learner's row is its component.
    Rows are drawn and written in blocks, so memory does not grow with -n; a seed gives the
    same rows whatever the block size.
    """
    from ..artifact import load_model
    from ..rng import make_rng

    if n < 1:
        _fail(f"-n must be >= 1, got {n}")
    if fmt is None:
        fmt = "parquet" if out.suffix.lower() in PARQUET_SUFFIXES else "csv"
    elif fmt not in SAMPLE_FORMATS:
        _fail(f"--format must be csv or parquet, got {fmt!r}")
    check_output(out, force, stdout=True)
    rel = load_model(artifact)
    rng = make_rng(seed).generator
    names = rel.feature_names or [f"x{i}" for i in range(rel.gmm.n_features)]
    blocks = rel.gmm.sample_blocks(n, rng, block=SAMPLE_CHUNK)
    with atomic_output(out, "wb", force=force, stdout=True) as fh:
        write_rows(fh, blocks, names, rel.gmm.classes, fmt)
    err_console.print(f"wrote {n} rows to {describe_output(out)}", highlight=False)


def write_rows(fh, blocks, names: list[str], classes, fmt: str) -> None:
    """Write blocks ``(X, comp)`` of labelled rows to the binary file ``fh`` as CSV (a header
    row ``names..., label``, then the rows; numbers as the shortest text that reads back as
    the same double: see :func:`csv_lines`) or Parquet (a float64 column per feature, then
    ``label``: integers when every class is an integer, else text; one row group per block).

    Two threads, with at most two blocks in flight, so memory stays bounded by the block
    size. Parquet: a block is encoded and written in the second thread while the next one is
    drawn. CSV: the numbers' text is made by orjson, which holds the GIL, in this thread
    after the draw; the second thread cuts it into lines, appends the labels (pyarrow's
    kernels, which release the GIL) and writes them. pyarrow's arrays are made from the
    blocks' buffers (``pyarrow.array`` of a list or of a numpy array imports pandas, when it
    is installed, on first use: 0.3 to 0.6 s).
    """
    import numpy as np
    import pyarrow as pa

    integer = fmt == "parquet" and all(
        isinstance(c, int | np.integer) and not isinstance(c, bool | np.bool_) for c in classes)
    text = [str(c) for c in classes]

    if fmt == "parquet":
        import pyarrow.parquet as pq

        if integer:
            labels = _arrow(pa.int64(), np.array([int(c) for c in classes], dtype=np.int64))
        else:
            labels = _binary_array([t.encode() for t in text], pa.string())
        schema = pa.schema([*(pa.field(name, pa.float64()) for name in names),
                            pa.field("label", labels.type)])

        def write(X, comp):
            XT = np.ascontiguousarray(X.T)
            columns = [_arrow(pa.float64(), col) for col in XT]
            label = labels.take(_arrow(pa.int64(), np.ascontiguousarray(comp, np.int64)))
            writer.write_batch(pa.RecordBatch.from_arrays([*columns, label], schema=schema))

        with pq.ParquetWriter(fh, schema, use_dictionary=["label"]) as writer:
            for _ in _in_order(blocks, write, 1):
                pass
        return

    # labels as they are (as the header is), unless one holds a separator, a quote or a line
    # break: then every label is quoted, a quote doubled
    plain = not any(ch in t for t in text for ch in ',"\r\n')
    ends = _binary_array([(t if plain else '"' + t.replace('"', '""') + '"').encode() + b"\n"
                          for t in text])
    fh.write((",".join([*names, "label"]) + "\n").encode())
    texts = ((_numbers_text(X), comp) for X, comp in blocks)
    for _ in _in_order(texts, lambda text, comp: fh.write(_csv_join(text, comp, ends)), 1):
        pass


def _arrow(type_, values):
    """A pyarrow array of fixed-width ``type_`` on the buffer of the contiguous ``values``."""
    import pyarrow as pa

    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(values)])


def _binary_array(items: list[bytes], type_=None):
    """A pyarrow array of the byte strings ``items``: ``large_binary``, or ``type_`` (a
    binary or string type, with 32- or 64-bit offsets)."""
    import numpy as np
    import pyarrow as pa

    type_ = type_ or pa.large_binary()
    large = type_ in (pa.large_binary(), pa.large_string())
    offsets = np.zeros(len(items) + 1, dtype=np.int64 if large else np.int32)
    np.cumsum([len(b) for b in items], out=offsets[1:])
    return pa.Array.from_buffers(type_, len(items),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(items))])


def csv_lines(X, comp, ends):
    """The CSV lines of the rows of ``X`` (float64, shape (m, d)), row ``i`` ending with
    ``ends[comp[i]]`` (a pyarrow binary array: a label's text and a line break), as one
    buffer.

    Every number is written as the shortest text that reads back as the same double (orjson's
    formatting of a float64 array, e.g. ``0.1``, ``100.0``, ``-0.0``, ``1e-7``, ``1e+16``),
    ``inf``, ``-inf`` or ``nan`` if it is not finite; the text of a row depends on that row
    alone. orjson writes the block as a JSON array of arrays (:func:`_numbers_text`), which
    pyarrow cuts into rows and joins with their labels (:func:`_csv_join`), without a loop in
    Python.
    """
    return _csv_join(_numbers_text(X), comp, ends)


def _numbers_text(X):
    """``(data, m, nonfinite)``: orjson's JSON text of the rows of ``X`` (``b"[[x,..,x],..]"``),
    their number, and, if some value is not finite (written as 0.0 in ``data``), ``(X, its
    isfinite mask)``, else None."""
    import numpy as np
    import orjson

    X = np.ascontiguousarray(X, dtype=np.float64)
    finite = np.isfinite(X)
    if finite.all():
        return orjson.dumps(X, option=orjson.OPT_SERIALIZE_NUMPY), X.shape[0], None
    return (orjson.dumps(np.where(finite, X, 0.0), option=orjson.OPT_SERIALIZE_NUMPY),
            X.shape[0], (X, finite))


def _csv_join(text, comp, ends):
    """The CSV lines of :func:`csv_lines` from :func:`_numbers_text`'s ``text``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    data, m, nonfinite = text
    if m == 0:  # b"[]": no rows, no lines
        return b""
    # data = b"[[x,..,x],[x,..,x],..,[x,..,x]]": the rows are the pieces between "],[" once
    # the first two and last two characters are cut
    whole = pa.Array.from_buffers(pa.large_binary(), 1, [
        None, pa.py_buffer(np.array([0, len(data) - 4], dtype=np.int64)),
        pa.py_buffer(data).slice(2)])
    rows = pc.split_pattern(whole, pattern=b"],[").values
    if nonfinite is not None:
        rows = _nonfinite_rows(rows, *nonfinite)
    lines = pc.binary_join_element_wise(
        rows, ends.take(_arrow(pa.int64(), np.ascontiguousarray(comp, np.int64))), _comma())
    bounds = np.frombuffer(lines.buffers()[1], dtype=np.int64)[[lines.offset, lines.offset + m]]
    return lines.buffers()[2][int(bounds[0]):int(bounds[1])]


def _comma():
    """The separator of :func:`csv_lines`, a pyarrow binary scalar."""
    return _binary_array([b","])[0]


def _nonfinite_rows(rows, X, finite):
    """``rows`` (the text of every row, with 0.0 in place of a value that is not finite) with
    ``inf``, ``-inf`` or ``nan`` written where it belongs."""
    import numpy as np

    texts = rows.to_pylist()
    for i in np.flatnonzero(~finite.all(axis=1)):
        values = texts[i].split(b",")
        for j in np.flatnonzero(~finite[i]):
            v = X[i, j]
            values[j] = b"nan" if np.isnan(v) else b"inf" if v > 0 else b"-inf"
        texts[i] = b",".join(values)
    return _binary_array(texts)


def _in_order(blocks, work, threads: int):
    """``work(*block)`` of every block, computed in ``threads`` threads and yielded in the
    blocks' order; at most ``threads + 1`` blocks are in flight. Once one block's work fails,
    no later block's work runs (a write after a failed one would leave a hole in a stream
    that cannot be removed, such as standard output)."""
    import threading
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    failed = threading.Event()

    def guarded(*block):
        if failed.is_set():
            raise RuntimeError("an earlier block failed")
        try:
            return work(*block)
        except BaseException:
            failed.set()
            raise

    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="klrelease-write")
    pending: deque = deque()
    try:
        for block in blocks:
            pending.append(pool.submit(guarded, *block))
            if len(pending) > threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@app.command()
def inspect(
    artifact: Annotated[Path, typer.Argument(
        help="a release artifact, a learner's artifact or a FAIL document (JSON)")],
    verify: Annotated[bool, typer.Option(
        help="check the artifact's signature (with --key); any edit fails")] = False,
    key: Annotated[str | None, typer.Option(
        help="the issuing service's public key: a PEM file, or the service's URL")] = None,
):
    """Show a readable summary of a release artifact, a learner's artifact or a FAIL document
    (validated; the claim is recomputed; with --verify --key, the signature checked first)."""
    import numpy as np
    from rich.table import Table

    from ..artifact import FailDocument, read_document

    public_key = None
    if verify or key is not None:
        if key is None:
            _fail("--verify needs --key: the service's public key (a PEM file, or the "
                  "service's URL)")
        try:
            from ..client import ServiceError, public_key_from
        except ImportError:
            _fail("--verify needs the service extra: pip install 'klrelease[service]'")
        try:
            public_key = public_key_from(key)
        except ServiceError as exc:
            _fail(exc.detail)
    rel = read_document(artifact, public_key=public_key)
    if public_key is not None:
        out_console.print(f"signature: [green]valid[/], Ed25519 key {rel.signature.key_id}",
                          highlight=False)
    if isinstance(rel, FailDocument):
        out_console.print(f"[bold]FAIL[/] from {rel.source}  (no model released)",
                          highlight=False)
        _print_privacy(rel.privacy)
        out_console.print(f"stage: {rel.stage or 'not given'}", highlight=False)
        out_console.print(f"reason: {rel.reason}", highlight=False)
        r = rel.randomness
        out_console.print(f"randomness: {'secure' if r.secure else 'seeded'}"
                          + (f"; {r.note}" if r.note else ""))
        if rel.settings:
            out_console.print("settings: " + json.dumps(rel.settings))
        return
    learner = getattr(rel, "learner", None)
    what = "components" if learner else "classes"
    out_console.print(f"[bold]{learner or rel.mechanism}[/] "
                      f"{'learner artifact' if learner else 'release'}  (klrelease "
                      f"{rel.library_version or 'version not recorded'}, schema "
                      f"{rel.schema_version or 'not recorded'})", highlight=False)
    _print_privacy(rel.privacy)
    g = rel.gmm
    table = Table(title=f"released GMM: {g.n_components} {what}, {g.n_features} features")
    table.add_column("component" if learner else "class")
    table.add_column("weight", justify="right")
    table.add_column("mean")
    table.add_column("covariance eigenvalues")
    for k in range(g.n_components):
        eig = np.linalg.eigvalsh(g.covariances[k])
        table.add_row(
            str(g.classes[k]), f"{g.weights[k]:.4f}",
            "[" + ", ".join(f"{v:.3g}" for v in g.means[k]) + "]",
            "[" + ", ".join(f"{v:.3g}" for v in eig) + "]",
        )
    out_console.print(table)
    if rel.feature_names:
        out_console.print("features: " + ", ".join(rel.feature_names))
    if getattr(rel, "solver", None) is not None:
        s = rel.solver
        out_console.print(f"solver: {s.solver} ({s.status}), {s.n_solves} solve(s), "
                          f"{s.time_s:.3g} s")
    r = rel.randomness
    out_console.print(f"randomness: {'secure' if r.secure else 'seeded'}; {r.note}")
    if not learner:
        out_console.print("settings: " + json.dumps(rel.settings))
    if rel.options:
        out_console.print("options: " + json.dumps(rel.options))


def _print_privacy(p) -> None:
    colour = "green" if p.certified else "red"
    out_console.print(
        f"privacy: epsilon={p.epsilon:g}, delta={p.delta:g}, neighbours: {p.neighbouring.value}"
        f", [{colour}]{'certified' if p.certified else 'NOT certified'}[/]"
    )
    out_console.print(f"  {p.statement}")
    for r in p.reasons:
        out_console.print(f"  - {r}")


@app.command("mechanisms")
def list_mechanisms(
    name: Annotated[str | None, typer.Argument(help="show this mechanism's options")] = None,
):
    """List the registered mechanisms, or one mechanism's options with types and defaults."""
    from rich.table import Table

    from ..mechanisms import get_mechanism, mechanisms
    from ..mechanisms.base import describe_options
    from ..neighbours import Adjacency

    if name is None:
        for n in mechanisms():
            out_console.print(f"{n:20s} {get_mechanism(n).summary}", highlight=False)
        return
    mech = get_mechanism(name)
    out_console.print(f"[bold]{mech.name}[/]: {mech.summary}", highlight=False)
    cert = ", ".join(a.value for a in mech.certified_relations)
    cert = (f"certified under {cert} with secure noise, unless an option below voids it"
            if cert else "never certified")
    out_console.print(f"relations: {', '.join(a.value for a in mech.relations)} ({cert})",
                      highlight=False)
    table = Table(title=f"options of {mech.name} (--option KEY=VALUE)")
    for col in ("option", "type", "default", "meaning"):
        table.add_column(col, overflow="fold")
    for opt, kind, default, words in describe_options(mech):
        shown = "none" if default is None else (
            str(default).lower() if isinstance(default, bool) else str(default))
        table.add_row(opt, kind, shown, words)
    out_console.print(table)
    if mech.uses_box:
        out_console.print("public bounds: --lower/--upper (a box) or --norm-bound (a ball)")
    elif any(a != Adjacency.LABEL_FLIP for a in mech.relations):
        out_console.print("public bounds: --norm-bound (record-level relations)")
    else:
        out_console.print("public bounds: none (label flip only: the features are public)")
