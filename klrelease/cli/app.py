"""The command-line application shared by every command module, and its entry point.

Bad input or a failing environment (an unwritable output, a missing file) exits with status 2
and a single ``error: ...`` line on stderr, writes nothing, and never shows a traceback. Output
paths are checked before any computation. A mechanism's FAIL output (``MechanismFailed``)
exits with status 3 and one ``FAIL at stage ...`` line with its public reason.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console

app = typer.Typer(
    name="klrelease",
    help="Differentially private release of labelled Gaussian mixture models.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from .._version import __version__

        print(f"klrelease {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False,
):
    """Differentially private release of labelled Gaussian mixture models."""

out_console = Console()
err_console = Console(stderr=True)


class BadInput(Exception):
    """An input problem reported as one line with exit status 2."""


def _fail(message: str) -> None:
    raise BadInput(message)


def check_output(path: Path) -> Path:
    """Fail (before any computation) unless ``path`` can be written as a file."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir() or str(path).endswith(os.sep):
        _fail(f"cannot write {path}: it is a directory")
    if not parent.is_dir():
        _fail(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        _fail(f"cannot write {path}: directory {parent} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        _fail(f"cannot write {path}: permission denied")
    return path


@contextmanager
def atomic_output(path: Path, mode: str = "w"):
    """A file handle whose content replaces ``path`` only if the block completes."""
    path = check_output(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".klrelease-", suffix=".tmp")
    except OSError as exc:
        _fail(f"cannot write {path}: {exc.strerror or exc.__class__.__name__}")
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_atomic(path: Path, text: str) -> None:
    with atomic_output(path) as fh:
        fh.write(text)


def _parse_floats(text: str | None, name: str):
    if text is None:
        return None
    try:
        vals = [float(v) for v in text.split(",")]
    except ValueError:
        _fail(f"{name} must be a number or a comma-separated list of numbers")
    return vals[0] if len(vals) == 1 else np.array(vals)


def option_help() -> str:
    """Help of ``--option``, built from the registered mechanisms' declarations."""
    from ..mechanisms import get_mechanism, mechanisms

    names = "; ".join(f"{n}: {', '.join(get_mechanism(n).options)}" for n in mechanisms())
    return ("mechanism option KEY=VALUE (repeatable; types and defaults: 'klrelease mechanisms "
            f"NAME'). {names}")


#: ``--option`` keys that are public inputs of every release rather than mechanism options.
DATA_KEYS = ("norm_bound", "classes")


def _convert(mechanism, key: str, raw: str):
    """``raw`` as the type the mechanism declares for option ``key`` (booleans: true/false)."""
    from ..mechanisms.base import describe_options

    kinds = {n: k for n, k, _, _ in describe_options(mechanism)}
    if key not in kinds:
        return raw  # reported as unknown by the mechanism's validation, with what it accepts
    kind = kinds[key]
    text = raw.strip()
    if text.lower() in ("none", "null") and "none" in kind:
        return None
    if kind.startswith("true|false"):
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        _fail(f"option {key} of {mechanism.name} takes true or false, got {raw!r}")
    if "numbers" in kind:
        try:
            return [float(v) for v in text.strip("[]()").split(",")]
        except ValueError:
            _fail(f"option {key} of {mechanism.name} takes {kind}, got {raw!r}")
    if kind.startswith(("number", "integer")):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            _fail(f"option {key} of {mechanism.name} takes {kind}, got {raw!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        _fail(f"option {key} of {mechanism.name} takes {kind}, got {raw!r}")
    return text


def parse_options(mechanism, items) -> tuple[dict, dict]:
    """``--option KEY=VALUE`` pairs as (mechanism options, public inputs ``DATA_KEYS``)."""
    opts: dict = {}
    public: dict = {}
    for item in items or []:
        if "=" not in item:
            _fail(f"--option takes KEY=VALUE, got {item!r}")
        key, raw = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if key in opts or key in public:
            _fail(f"--option {key} is given twice")
        if key == "norm_bound":
            public[key] = _parse_floats(raw, "--option norm_bound")
        elif key == "classes":
            public[key] = parse_classes(raw)
        else:
            opts[key] = _convert(mechanism, key, raw)
    return opts, public


def parse_classes(text: str | None):
    """``--classes a,b,c``: the public set of classes (integers stay integers); None if absent."""
    if text is None:
        return None
    items = [c.strip() for c in text.split(",")]
    if not all(items):
        _fail("--classes takes a comma-separated list of class labels, e.g. --classes a,b,c")
    from ..data import typed_classes

    return list(typed_classes(items))


def mechanism_inputs(mechanism, option, lower, upper, norm_bound=None, classes=None):
    """Mechanism options and public inputs from the command line, validated before any data.

    Returns ``(options, bounds, classes)``: ``bounds`` is the public
    :class:`~klrelease.domain.Domain` (a box from ``--lower/--upper``, a ball from
    ``--norm-bound``), a mechanism's named way of choosing it (``--option bounds=features``),
    or ``None``.
    """
    from ..domain import Domain

    opts, public = parse_options(mechanism, option)
    if (lower is None) != (upper is None):
        _fail("give both --lower and --upper, or neither")
    box = None
    if lower is not None:
        box = (_parse_floats(lower, "--lower"), _parse_floats(upper, "--upper"))
    if "norm_bound" in public:
        if norm_bound is not None:
            _fail("give the norm bound once: --norm-bound or --option norm_bound")
        norm_bound = public["norm_bound"]
    classes = parse_classes(classes)
    if "classes" in public:
        if classes is not None:
            _fail("give the classes once: --classes or --option classes")
        classes = public["classes"]
    if box is not None and not mechanism.uses_box:
        _fail(f"{mechanism.name} does not use --lower/--upper (a public box); give "
              "--norm-bound for its record-level relations")
    if box is not None and norm_bound is not None:
        _fail("give --lower/--upper (a box) or --norm-bound (a ball), not both")
    try:
        bounds = Domain.from_public(box, norm_bound)
    except ValueError as exc:
        _fail(str(exc))
    mechanism.validate_options(opts)
    if "bounds" in opts:  # a named way of choosing the box (e.g. "features")
        if box is not None:
            _fail("give --lower/--upper or --option bounds=..., not both")
        if bounds is not None:
            _fail("give --norm-bound or --option bounds=..., not both")
        bounds = opts.pop("bounds")
    return opts, bounds, classes


def _load_input(dataset, csv_path, label_column, npz_path, classes=None):
    """The labelled data of one input; ``classes`` is the declared set of classes."""
    from ..data import as_labelled_data, load_csv, load_dataset, load_npz

    given = [x is not None for x in (dataset, csv_path, npz_path)]
    if sum(given) != 1:
        _fail("give exactly one input: --dataset NAME, --csv FILE or --npz FILE")
    if dataset is not None:
        if classes is not None:
            _fail("--classes goes with --csv or --npz; a bundled dataset declares its classes")
        return load_dataset(dataset)
    if csv_path is not None:
        if label_column is None:
            _fail("--csv needs --label-column NAME")
        X, y, names = load_csv(csv_path, label_column)
        classes, y = _classes_for(y, classes)
        return as_labelled_data(X, y, feature_names=names, classes=classes, min_class_size=0)
    X, y = load_npz(npz_path)
    # class sizes are checked by the release against the mechanism's own floor (none for a
    # certified mechanism: a refusal on a private class size would reveal labels)
    classes, y = _classes_for(y, classes)
    return as_labelled_data(X, y, classes=classes, min_class_size=0)


def _classes_for(y, classes):
    """Declared classes and the labels ``y`` in one type, decided by the declaration alone.

    When every declared class is an integer, labels are read as integers; otherwise labels and
    classes are compared as text. Guessing the type from the labels would make a flip between
    two declared classes (say ``1`` and ``x``) decide whether the input is accepted.
    """
    if classes is None:
        return None, y
    declared = [str(c).strip() for c in classes]
    try:
        ints = [int(c) for c in declared]
    except ValueError:
        ints = None
    labels = np.asarray(y)
    if ints is not None:
        if labels.dtype.kind in "iub":
            return ints, labels
        if labels.dtype.kind == "f":
            if not np.all(np.isfinite(labels) & (labels == np.round(labels))):
                _fail("the labels must be among the declared --classes")
            return ints, labels.astype(np.int64)
        try:
            return ints, np.array([int(str(v).strip()) for v in labels], dtype=np.int64)
        except ValueError:
            _fail("the labels must be among the declared --classes")
    return declared, np.array([str(v).strip() for v in labels], dtype=object)


def _one_line(message) -> str:
    return " ".join(str(message).split())


#: Options whose value may be left out, and the value they then take.
OPTIONAL_VALUES = {"--dask": "local"}


def _optional_values(argv: list[str]) -> list[str]:
    """``--dask`` with no value (last, or followed by another option) means ``--dask local``.
    """
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        if arg in OPTIONAL_VALUES and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out.append(OPTIONAL_VALUES[arg])
    return out


def main(argv: list[str] | None = None) -> int:
    """Console entry point: runs the app and maps input errors to exit status 2."""
    from .. import solvers
    from ..learners.result import MechanismFailed

    argv = _optional_values(list(sys.argv[1:] if argv is None else argv))
    try:
        # a command ending with typer.Exit(code) returns that code in non-standalone mode
        rc = app(args=argv, standalone_mode=False, prog_name="klrelease")
    except MechanismFailed as exc:  # the mechanism's FAIL output (public stage and reason)
        print(f"FAIL at stage {exc.stage}: {_one_line(exc.reason)}", file=sys.stderr)
        return 3
    except solvers.SolverFailed as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except (BadInput, ValueError, OSError, solvers.SolverUnavailable) as exc:
        if isinstance(exc, OSError):
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"error: {where}{exc.strerror or exc.__class__.__name__}", file=sys.stderr)
        else:
            print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # the CLI framework's own usage errors
        kind = type(exc).__name__
        if kind == "NoArgsIsHelpError":
            return 0
        if kind == "Exit":
            return int(getattr(exc, "exit_code", 0) or 0)
        if kind == "Abort":
            print("error: aborted", file=sys.stderr)
            return 1
        if hasattr(exc, "format_message"):
            print(f"error: {_one_line(exc.format_message())}", file=sys.stderr)
            return 2
        raise
    return rc if isinstance(rc, int) and not isinstance(rc, bool) else 0


def run() -> None:
    sys.exit(main())


