"""The command line starts without the numerical stack, and ``import klrelease`` loads its
public names on first use (PEP 562). Each check runs in a fresh interpreter: the test process
has imported everything already."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Never imported by ``klrelease --version``, ``--help``, a command's help or a usage error.
HEAVY = ("numpy", "scipy", "sklearn", "pandas", "pyarrow", "dp_accounting", "cvxpy",
         "matplotlib", "pydantic", "randomgen", "klrelease.audit", "klrelease.mechanisms",
         "klrelease.learners", "klrelease.solvers", "klrelease.artifact", "klrelease.release",
         "klrelease.sampling", "klrelease.stream")

CLI_SCRIPT = """
import contextlib, io, json, sys
from klrelease.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = main(json.loads(sys.argv[1]))
print(json.dumps({"code": code, "out": out.getvalue(), "err": err.getvalue(),
                  "modules": sorted(sys.modules)}))
"""


def _fresh(script: str, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def _heavy(modules, allowed=()) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY
                                            if h not in allowed))


#: typer checks the values given to a command through pydantic: a usage error found there (a
#: missing argument) loads it, and nothing heavier.
CHECKED = ("pydantic",)


@pytest.mark.parametrize(("args", "code", "shown", "allowed"), [
    (["--version"], 0, "klrelease ", ()),
    (["--help"], 0, "sample", ()),
    ([], 0, "release", ()),
    (["sample", "--help"], 0, "--seed", ()),
    (["release", "--help"], 0, "--epsilon", ()),
    (["audit", "--help"], 0, "--option", ()),
    (["inspect", "--help"], 0, "--verify", ()),
    (["learn", "--help"], 0, "--components", ()),
    (["remote", "release", "--help"], 0, "--request-id", ()),
    (["service", "dataset", "add", "--help"], 0, "--budget-epsilon", ()),
    (["release", "--no-such-option"], 2, "No such option", ()),
    (["no-such-command"], 2, "No such command", ()),
    (["sample"], 2, "Missing argument", CHECKED),
])
def test_the_command_line_starts_without_the_numerical_stack(args, code, shown, allowed):
    res = _fresh(CLI_SCRIPT, json.dumps(args))
    assert res["code"] == code, res["err"]
    assert shown in res["out"] + res["err"]
    assert _heavy(res["modules"], allowed) == []


def test_the_help_of_release_lists_every_mechanisms_options_without_importing_them():
    res = _fresh(CLI_SCRIPT, json.dumps(["release", "--help"]))
    assert res["code"] == 0
    text = " ".join(res["out"].split())
    assert "mechanism option KEY=VALUE" in text
    for name in ("kl-certified: adjacency", "kl-paper: adjacency", "ppe-gaussian: adjacency"):
        assert name in text
    assert "klrelease.mechanisms" not in res["modules"]


def test_the_option_index_matches_the_mechanisms_declarations():
    from klrelease.cli.app import OPTION_INDEX, option_index

    stored = json.loads(OPTION_INDEX.read_text(encoding="utf-8"))
    assert list(stored.items()) == list(option_index().items()), (
        "klrelease/cli/mechanism_options.json is out of date: python -c 'from "
        "klrelease.cli.app import write_option_index; write_option_index()'")


API_SCRIPT = """
import json, sys
import klrelease
first = sorted(sys.modules)
names = {}
for name in klrelease.__all__:
    names[name] = getattr(klrelease, name) is not None
import klrelease.release as rel_module_attr
from klrelease import release
from klrelease.release import release as defined
from klrelease.mechanisms import mechanisms
print(json.dumps({"first": first, "names": names, "dir": dir(klrelease),
                  "release_is_function": release is defined and klrelease.release is defined
                  and rel_module_attr is defined,
                  "list_mechanisms": klrelease.list_mechanisms is mechanisms,
                  "audit_callable": callable(klrelease.audit)}))
"""


def test_import_klrelease_loads_its_names_on_first_use():
    res = _fresh(API_SCRIPT)
    assert _heavy(res["first"]) == []
    assert all(res["names"].values()) and len(res["names"]) == 22
    assert set(res["names"]) <= set(res["dir"])
    assert res["release_is_function"] and res["list_mechanisms"] and res["audit_callable"]


def test_an_unknown_name_is_an_attribute_error():
    import klrelease

    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        klrelease.no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        exec("from klrelease import no_such_name")


def test_the_command_line_runs_without_the_option_index(monkeypatch, tmp_path, capsys):
    """The index is read whenever the command line is built: without it the help of
    ``--option`` lists no mechanism, and every command still runs."""
    import importlib

    from klrelease.cli import main

    app = importlib.import_module("klrelease.cli.app")  # the module, not its Typer object
    monkeypatch.setattr(app, "OPTION_INDEX", tmp_path / "missing.json")
    text = app.option_help()
    assert "mechanism option KEY=VALUE" in text and "kl-certified:" not in text
    assert main(["--version"]) == 0
    assert "klrelease" in capsys.readouterr().out


def test_the_help_names_every_bundled_dataset():
    from klrelease.cli.app import BUNDLED
    from klrelease.data import DATASETS

    assert BUNDLED == tuple(sorted(DATASETS))
