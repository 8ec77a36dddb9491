"""The command-line application shared by every command module, and its entry point.

Bad input or a failing environment (an unwritable output, a missing file) exits with status 2
and a single ``error: ...`` line on stderr, writes nothing, and never shows a traceback. Output
paths are checked before any computation. A mechanism's FAIL output (``MechanismFailed``)
exits with status 3 and one ``FAIL at stage ...`` line with its public reason.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from typer.core import TyperGroup


class Group(TyperGroup):
    """A group of commands whose ``--help`` flag is False when not given (None in typer): typer
    coerces a parameter's value through pydantic unless it is a bool, and building that
    coercion imported pydantic on every command (a third of a second for ``klrelease sample
    --help``)."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None and option.default is None:
            option.default = False
        return option


app = typer.Typer(
    name="klrelease",
    cls=Group,
    help="Differentially private release of labelled Gaussian mixture models.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from .._version import __version__

        print(f"klrelease {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          metavar="", help="print the version and exit")
                       ] = False,
):
    """Differentially private release of labelled Gaussian mixture models."""

out_console = Console()
err_console = Console(stderr=True)


class BadInput(Exception):
    """An input problem reported as one line with exit status 2."""


def _fail(message: str) -> None:
    raise BadInput(message)


#: The output path that means standard output.
STDOUT = "-"


def is_stdout(path) -> bool:
    """Whether ``path`` is ``-``, standard output."""
    return str(path) == STDOUT


def check_output(path: Path, force: bool = False, stdout: bool = False) -> Path:
    """Fail (before any computation) unless ``path`` can be written as a new regular file,
    or replaces an existing regular file with ``force``; ``-`` is standard output for the
    commands that allow it (``stdout``).

    A symbolic link, a device, a pipe or a socket is never replaced (as root, replacing
    ``/dev/null`` would break it), nor a directory.
    """
    path = Path(path)
    if is_stdout(path):
        if not stdout:
            _fail("--out - (standard output) is not available for this command, which "
                  "prints its summary there; give a file name")
        return path
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir() or str(path).endswith(os.sep):
        _fail(f"cannot write {path}: it is a directory")
    if not parent.is_dir():
        _fail(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        _fail(f"cannot write {path}: directory {parent} is not writable")
    _check_existing(path, force)
    return path


def _check_existing(path: Path, force: bool) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        _fail(f"cannot write {path}: {exc.strerror or exc.__class__.__name__}")
    if stat.S_ISLNK(st.st_mode):
        _fail(f"cannot write {path}: it is a symbolic link (give the path of a regular file)")
    if not stat.S_ISREG(st.st_mode):
        _fail(f"cannot write {path}: it exists and is not a regular file")
    if not force:
        _fail(f"{path} exists; give --force to overwrite it")
    if not os.access(path, os.W_OK):
        _fail(f"cannot write {path}: permission denied")


class Terminated(BaseException):
    """A termination signal (SIGTERM, SIGHUP) received while the command ran: raised in the
    main thread so that ``finally`` blocks remove temporary files and empty folders."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_terminated(signum, frame):
    if os.getpid() != _MAIN_PID:  # a worker process forked from the command: die as usual
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _SIGNALLED.append(signum)
    raise Terminated(signum)


#: Termination signals received during the command (an exception raised by a signal handler
#: inside some C code that calls back into Python can be lost: writes check this list too).
_SIGNALLED: list[int] = []


def _check_signals() -> None:
    """Raise again a Ctrl-C or termination that was received but whose exception was lost."""
    if _SIGNALLED:
        raise Terminated(_SIGNALLED[-1])
    if _INTERRUPTED.is_set():
        raise KeyboardInterrupt


class _CheckedFile:
    """A file whose every write first checks for a received signal (see :data:`_SIGNALLED`)."""

    def __init__(self, fh):
        self._fh = fh

    def write(self, data):
        _check_signals()
        return self._fh.write(data)

    def __getattr__(self, name):
        return getattr(self._fh, name)


_MAIN_PID = os.getpid()

#: Set when Ctrl-C arrived during the command (the CLI framework turns the KeyboardInterrupt
#: into an exit status of 130 without a word).
_INTERRUPTED = threading.Event()


def _raise_interrupt(signum, frame):
    _INTERRUPTED.set()
    raise KeyboardInterrupt


@contextmanager
def signals_raise():
    """For the duration of the block, SIGTERM and SIGHUP raise :class:`Terminated` and SIGINT
    raises KeyboardInterrupt (noted in ``_INTERRUPTED``) in the main thread, so that cleanup
    runs; the previous handlers come back afterwards. A signal the process ignores stays
    ignored."""
    global _MAIN_PID
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _MAIN_PID = os.getpid()
    previous = {}
    for sig, handler in ((signal.SIGTERM, _raise_terminated),
                         (getattr(signal, "SIGHUP", None), _raise_terminated),
                         (signal.SIGINT, _raise_interrupt)):
        if sig is None:
            continue
        current = signal.getsignal(sig)
        if current in (signal.SIG_IGN, handler) or current is None:
            continue
        previous[sig] = current
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def atomic_output(path: Path, mode: str = "w", force: bool = False, stdout: bool = False):
    """A file handle whose content replaces ``path`` only if the block completes; ``-`` is
    standard output. The temporary file is removed on any exception, Ctrl-C and SIGTERM
    (handlers installed for the duration of the write); the file gets the permissions a new
    file would (the umask's), not the temporary file's 0600."""
    path = check_output(path, force, stdout)
    if is_stdout(path):
        stream = sys.stdout.buffer if "b" in mode else sys.stdout
        yield stream
        if "b" not in mode:  # text (an artifact's JSON) ends its last line on a terminal
            stream.write("\n")
        stream.flush()
        return
    with signals_raise():
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".klrelease-", suffix=".tmp")
        except OSError as exc:
            _fail(f"cannot write {path}: {exc.strerror or exc.__class__.__name__}")
        try:
            with os.fdopen(fd, mode) as fh:
                yield _CheckedFile(fh)
            _check_signals()
            os.chmod(tmp, 0o666 & ~_umask())
            _check_existing(path, force)  # again: the path may have changed meanwhile
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_atomic(path: Path, text: str, force: bool = False) -> None:
    with atomic_output(path, force=force) as fh:
        fh.write(text)


def describe_output(path) -> str:
    """How a message names an output path (``-``: standard output)."""
    return "standard output" if is_stdout(path) else str(path)


#: ``--force``, shared by every command that writes a file.
Force = Annotated[bool, typer.Option("--force", metavar="",
                                     help="overwrite an existing output file")]


def _parse_floats(text: str | None, name: str):
    if text is None:
        return None
    try:
        vals = [float(v) for v in text.split(",")]
    except ValueError:
        _fail(f"{name} must be a number or a comma-separated list of numbers")
    if len(vals) == 1:
        return vals[0]
    import numpy as np

    return np.array(vals)


#: The built-in mechanisms' option names, as their declarations give them
#: (:func:`option_index`), kept beside this module so that a command's help reads them
#: without importing the mechanisms (and the numerical stack they need);
#: ``tests/test_startup.py`` checks the file against the declarations.
OPTION_INDEX = Path(__file__).with_name("mechanism_options.json")


def option_index() -> dict[str, list[str]]:
    """The built-in mechanisms' option names, from their declarations (imports them all);
    :func:`write_option_index` rewrites :data:`OPTION_INDEX` after one changes."""
    from ..mechanisms import get_mechanism, mechanisms

    built_in = [n for n in mechanisms()
                if type(get_mechanism(n)).__module__.startswith("klrelease.")]
    return {n: list(get_mechanism(n).options) for n in built_in}


def write_option_index() -> None:
    """Rewrite :data:`OPTION_INDEX` from the declarations (:func:`option_index`)."""
    OPTION_INDEX.write_text(json.dumps(option_index(), indent=1) + "\n", encoding="utf-8")


def option_help() -> str:
    """Help of ``--option``: the built-in mechanisms' options from :data:`OPTION_INDEX`
    (read whenever the command line is built: without a readable index the help lists none,
    and every command still runs)."""
    text = ("mechanism option KEY=VALUE (repeatable; types and defaults, and the options of "
            "any other mechanism: 'klrelease mechanisms NAME')")
    try:
        index = json.loads(OPTION_INDEX.read_text(encoding="utf-8"))
        names = "; ".join(f"{n}: {', '.join(opts)}" for n, opts in index.items())
    except (OSError, ValueError, AttributeError, TypeError):
        return text
    return f"{text}. {names}"


#: The bundled datasets (``klrelease.data.DATASETS``, named here so that a command's help does
#: not import the data module; ``tests/test_startup.py`` checks the two agree).
BUNDLED = ("iris", "italy-power")
DATASET_HELP = f"a bundled dataset: {', '.join(BUNDLED)}"


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
    """``--classes a,b,c``: the public set of classes (integers stay integers); None if absent.
    Read as one CSV record, so a label holding a comma is quoted: ``--classes 'a,"b, c"'``."""
    if text is None:
        return None
    import csv

    try:
        items = [c.strip() for c in next(csv.reader([text], skipinitialspace=True,
                                                    strict=True))]
    except (csv.Error, StopIteration):
        items = [""]
    if not items or not all(items):
        _fail("--classes takes a comma-separated list of class labels (quote a label that "
              "holds a comma), e.g. --classes a,b,c")
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
        _fail(mechanism.box_refusal())
    if box is not None and norm_bound is not None:
        _fail("give --lower/--upper (a box) or --norm-bound (a ball), not both")
    try:
        bounds = Domain.from_public(box, norm_bound)
    except ValueError as exc:
        _fail(cli_message(exc))
    mechanism.validate_options(opts)
    if "bounds" in opts:  # a named way of choosing the box (e.g. "features")
        if box is not None:
            _fail("give --lower/--upper or --option bounds=..., not both")
        if bounds is not None:
            _fail("give --norm-bound or --option bounds=..., not both")
        bounds = opts.pop("bounds")
    return opts, bounds, classes


#: What ``release`` says when it is given more or fewer inputs than one.
ONE_INPUT_WITH_PARQUET = ("give exactly one input: --dataset NAME, --csv FILE, --npz FILE or "
                          "--parquet PATH")


def _load_input(dataset, csv_path, label_column, npz_path, classes=None, parquet=False):
    """The labelled data of one input; ``classes`` is the declared set of classes;
    ``parquet``: the command also reads ``--parquet`` (named in the message)."""
    from ..data import as_labelled_data, load_csv, load_dataset, load_npz

    given = [x is not None for x in (dataset, csv_path, npz_path)]
    if sum(given) != 1:
        _fail(ONE_INPUT_WITH_PARQUET if parquet
              else "give exactly one input: --dataset NAME, --csv FILE or --npz FILE")
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
    import numpy as np

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


#: How the library's messages name its arguments, and the flags the command line has for them
#: (applied in this order; a name already written as a flag is left alone).
FLAG_NAMES = (
    (r"bounds=\(lower, upper\)", "--lower/--upper"),
    (r"bounds='features'", "--option bounds=features"),
    (r"bounds_from_data=True", "--option bounds_from_data=true"),
    (r"adjacency=['\"]([\w-]+)['\"]", r"--option adjacency=\1"),
    (r"design=['\"]([\w-]+)['\"]", r"--option design=\1"),
    (r"norm_bound=B", "--norm-bound B"),
    (r"norm_bound=", "--norm-bound"),
    (r"bounds=", "--lower/--upper"),
    (r"classes=", "--classes"),
    (r"^(bounds) must", "--lower/--upper must"),
    (r"^(norm_bound|classes|epsilon|delta|seed) must", None),
    (r"^X and y ", "the features and labels "),
    (r"^X contains", "the features contain"),
    (r"^y contains", "the labels contain"),
    (r"^y mixes", "the labels mix"),
    (r"^X ", "the features "),
    (r"^y ", "the labels "),
    (r"\bcolumn of X\b", "feature"),
)


def cli_message(message: str) -> str:
    """A library error message with the command line's flags in place of API arguments
    (``bounds=(lower, upper)`` becomes ``--lower/--upper``)."""
    text = _one_line(message).replace("\x00", "\ufffd")  # NUL marks the held replacements
    made: list[str] = []  # each replacement is held out of the later patterns' reach

    def hold(replacement: str) -> str:
        made.append(replacement)
        return f"\x00{len(made) - 1}\x00"

    for pattern, flag in FLAG_NAMES:
        if flag is None:  # the argument's own flag: --norm-bound, --classes, --epsilon...
            text = re.sub(r"(?<![-\w])" + pattern, lambda m: hold("--" + m.group(1).replace(
                "_", "-") + " must"), text)
        else:
            text = re.sub(r"(?<![-\w])" + pattern, lambda m, f=flag: hold(m.expand(f)), text)
    return re.sub("\x00(\\d+)\x00", lambda m: made[int(m.group(1))], text)


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
    """Console entry point: runs the app and maps input errors to exit status 2, Ctrl-C to
    one ``interrupted`` line and status 130, SIGTERM to ``terminated`` and 143 (temporary
    files and empty result folders removed first)."""
    argv = _optional_values(list(sys.argv[1:] if argv is None else argv))
    _INTERRUPTED.clear()
    _SIGNALLED.clear()
    try:
        with signals_raise():
            rc = _main(argv)
        if _SIGNALLED:
            raise Terminated(_SIGNALLED[-1])
        if rc == 130 or _INTERRUPTED.is_set():  # the framework returns Ctrl-C as 130, silently
            return _interrupted()
        return rc
    except KeyboardInterrupt:
        return _interrupted()
    except Terminated as exc:
        print("terminated", file=sys.stderr)
        return 128 + exc.signum


def _interrupted() -> int:
    print("interrupted", file=sys.stderr)
    return 130


def _loaded(module: str, name: str) -> tuple[type, ...]:
    """The exception class ``module.name`` if ``module`` is loaded, else none: an exception of
    a module that was never loaded cannot have been raised, and the start-up of the command
    line (``--help``, a usage error) loads neither the solvers nor the learners."""
    mod = sys.modules.get(module)
    return (getattr(mod, name),) if mod is not None else ()


def _main(argv: list[str]) -> int:
    try:
        # a command ending with typer.Exit(code) returns that code in non-standalone mode
        rc = app(args=argv, standalone_mode=False, prog_name="klrelease")
    except Exception as exc:
        mechanism_failed = _loaded("klrelease.learners.result", "MechanismFailed")
        solver_failed = _loaded("klrelease.solvers", "SolverFailed")
        solver_unavailable = _loaded("klrelease.solvers", "SolverUnavailable")
        if isinstance(exc, mechanism_failed):  # the FAIL output (public stage and reason)
            print(f"FAIL at stage {exc.stage}: {_one_line(exc.reason)}", file=sys.stderr)
            return 3
        if isinstance(exc, solver_failed):
            print(f"error: {_one_line(exc)}", file=sys.stderr)
            return 1
        if isinstance(exc, (BadInput, ValueError, OSError, *solver_unavailable)):
            if isinstance(exc, OSError):
                where = f"{exc.filename}: " if exc.filename else ""
                print(f"error: {where}{exc.strerror or exc.__class__.__name__}",
                      file=sys.stderr)
            elif isinstance(exc, BadInput):
                print(f"error: {_one_line(exc)}", file=sys.stderr)
            else:
                print(f"error: {cli_message(exc)}", file=sys.stderr)
            return 2
        # the CLI framework's own usage errors
        kind = type(exc).__name__
        if isinstance(exc.__cause__, KeyboardInterrupt):  # Ctrl-C, as the framework reports it
            return 130  # reported once, by main
        if isinstance(exc.__cause__, Terminated):
            raise exc.__cause__ from None
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

