"""Outputs, signals and messages of the command line: what a user typing commands meets."""

import json
import os
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from klrelease.cli import main

CLI = [sys.executable, "-m", "klrelease"]


def run(args, cwd, **kw):
    return subprocess.run(CLI + args, cwd=cwd, capture_output=True, text=True, timeout=300, **kw)


RELEASE = ["release", "--dataset", "iris", "--epsilon", "1", "--delta", "1e-5", "--seed", "0"]


@pytest.fixture
def artifact(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*RELEASE, "--out", "r.json"]) == 0
    return tmp_path / "r.json"


def test_existing_outputs_are_kept_unless_forced(artifact, capsys):
    before = artifact.read_text()
    assert main([*RELEASE, "--out", "r.json"]) == 2
    assert "r.json exists; give --force to overwrite it" in capsys.readouterr().err
    assert artifact.read_text() == before
    assert main([*RELEASE[:-1], "1", "--out", "r.json", "--force"]) == 0
    assert artifact.read_text() != before
    assert main(["sample", "r.json", "-n", "3", "--out", "s.csv"]) == 0
    assert main(["sample", "r.json", "-n", "3", "--out", "s.csv"]) == 2
    assert main(["sample", "r.json", "-n", "3", "--out", "s.csv", "--force"]) == 0


def test_a_new_output_gets_the_permissions_of_a_new_file(artifact):
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(artifact.stat().st_mode) == 0o666 & ~mask


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_pipes_symlinks_and_devices_are_never_replaced(artifact, capsys, force):
    fifo = artifact.parent / "fifo"
    os.mkfifo(fifo)
    link = artifact.parent / "link.json"
    link.symlink_to(artifact)
    before = artifact.read_text()
    for target, why in ((fifo, "not a regular file"), (link, "symbolic link")):
        assert main([*RELEASE, "--out", str(target), *force]) == 2
        assert why in capsys.readouterr().err
        assert main(["sample", "r.json", "-n", "2", "--out", str(target), *force]) == 2
        assert why in capsys.readouterr().err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink()
    assert artifact.read_text() == before
    if os.geteuid() == 0:  # the reported case: a character device (root may create one)
        dev = artifact.parent / "null"
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        assert main([*RELEASE, "--out", str(dev), *force]) == 2
        assert stat.S_ISCHR(os.lstat(dev).st_mode)


def test_dash_is_standard_output(artifact):
    r = run(["sample", "r.json", "-n", "4", "--seed", "1", "--out", "-"], artifact.parent)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("sepal_length") and len(lines) == 5
    assert "standard output" in r.stderr
    r = run([*RELEASE, "--out", "-"], artifact.parent)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["mechanism"] == "kl-certified" and r.stdout.endswith("}\n")
    assert not (artifact.parent / "-").exists()
    r = run(["plot", "r.json", "--out", "-"], artifact.parent)
    assert r.returncode == 2 and not (artifact.parent / "-").exists()


def _start(args, cwd):
    return subprocess.Popen(CLI + args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True,
                            # Ctrl-C reaches the command as in a terminal (a background job
                            # of a shell ignores it)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for(predicate, proc, timeout=120.0):
    t0 = time.monotonic()
    while not predicate():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < timeout
        time.sleep(0.05)


@pytest.mark.parametrize("name", ["big.csv", "big.parquet"])
@pytest.mark.parametrize(("sig", "code", "line"), [(signal.SIGTERM, 143, "terminated"),
                                                   (signal.SIGINT, 130, "interrupted")])
def test_a_signal_during_a_write_removes_the_temporary_file(artifact, sig, code, line, name):
    folder = artifact.parent
    proc = _start(["sample", "r.json", "-n", "50000000", "--out", name], folder)
    _wait_for(lambda: any(p.name.startswith(".klrelease-") and p.stat().st_size > 0
                          for p in folder.iterdir()), proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code
    assert err == line + "\n"  # one line, no traceback
    assert sorted(p.name for p in folder.iterdir()) == ["r.json"]


def test_an_interrupted_experiment_leaves_no_empty_folder(tmp_path):
    out = tmp_path / "results"
    proc = _start(["experiment", "fig2", "--out", str(out)], tmp_path)
    _wait_for(lambda: (out / "fig2").is_dir(), proc)
    time.sleep(0.5)  # well inside the run
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.splitlines()[-1] == "interrupted", err
    assert "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(("args", "flag", "api"), [
    (["--norm-bound", "-1"], "--norm-bound must", "norm_bound"),
    (["--lower", "0", "--upper", "0"], "--lower/--upper must", "bounds must"),
    (["--option", "adjacency=replace-one"], "pass --lower/--upper or --norm-bound B",
     "bounds=("),
    (["--classes", "0,1"], "the labels contain a label", "y contains"),
    (["--mechanism", "gaussian-iid"], "adjacency, --option bounds=features", "bounds='"),
    (["--mechanism", "colored-gaussian", "--option", "adjacency=replace-one", "--lower", "-9",
      "--upper", "9"], "give --option design=public for replace-one", "design='public'"),
])
def test_errors_name_the_flags(tmp_path, monkeypatch, capsys, args, flag, api):
    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "d.npz", X=np.random.default_rng(0).normal(size=(30, 2)),
             y=np.repeat([0, 1, 2], 10))
    assert main(["release", "--npz", "d.npz", "--epsilon", "1", "--delta", "1e-5", *args,
                 "--out", "x.json"]) == 2
    err = capsys.readouterr().err
    assert flag in err and api not in err
    assert len(err.splitlines()) == 1


def test_help_shows_no_boolean_metavar_for_flags():
    r = run(["--help"], None, env={**os.environ, "COLUMNS": "100"})
    version = [line for line in r.stdout.splitlines() if "--version" in line]
    assert version and "<bool>" not in version[0]
    r = run(["experiment", "--help"], None, env={**os.environ, "COLUMNS": "100"})
    quick = [line for line in r.stdout.splitlines() if "--quick" in line]
    assert quick and "<bool>" not in quick[0]


def test_the_readme_csv_example_declares_its_classes_and_is_certified(tmp_path, monkeypatch):
    from pathlib import Path

    from klrelease.artifact import Release

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    lines = text.replace("\\\n", " ").splitlines()
    csv = [ln for ln in lines if ln.startswith("klrelease release --csv data.csv")]
    assert csv and all("--classes a,b,c" in ln for ln in csv)
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    with open("data.csv", "w") as fh:
        fh.write("f0,f1,class\n")
        for i in range(60):
            fh.write(f"{rng.normal()},{rng.normal()},{'abc'[i % 3]}\n")
    args = csv[0].split("#")[0].split()[1:]
    assert main(args) == 0
    assert Release.load(tmp_path / "r.json").privacy.certified


def test_ctrl_c_in_a_command_is_reported_once(tmp_path, monkeypatch, capsys):
    import klrelease

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(klrelease, "release", interrupted)
    assert main([*RELEASE, "--out", "r.json"]) == 130
    assert capsys.readouterr().err == "interrupted\n"
    assert list(tmp_path.iterdir()) == []


def test_a_declared_class_label_may_hold_a_comma_when_quoted(tmp_path, monkeypatch):
    """``--classes`` is read as one CSV record: a label with a comma is quoted."""
    import csv

    from klrelease.artifact import Release

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    labels = ["cat", "dog", "emu, adult"]
    with open("data.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["f0", "f1", "class"])
        for i in range(60):
            w.writerow([rng.normal(), rng.normal(), labels[i % 3]])
    assert main(["release", "--csv", "data.csv", "--label-column", "class", "--epsilon", "1",
                 "--delta", "1e-5", "--classes", 'cat,dog,"emu, adult"', "--out",
                 "r.json"]) == 0
    assert list(Release.load(tmp_path / "r.json").gmm.classes) == labels


def test_unreadable_inputs_are_named_plainly(tmp_path, monkeypatch, capsys):
    """A file that cannot be read is named with a reason that quotes none of its content."""
    monkeypatch.chdir(tmp_path)
    np.save("one.npy", np.zeros(3))
    np.savez("obj.npz", X=np.array([{"secret": 31.4}], dtype=object), y=np.zeros(1))
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")
    (tmp_path / "bin.csv").write_bytes(b"a,b\n\xff\xfe,1\n")
    for args, said in ((["--npz", "missing.npz"], "cannot read missing.npz: no such file"),
                       (["--npz", "one.npy"], "one.npy is not an .npz archive"),
                       (["--npz", "t.csv"], "t.csv is not an .npz archive"),
                       (["--npz", "."], "cannot read .: a directory, not a file"),
                       (["--npz", "obj.npz"], "object arrays are refused"),
                       (["--csv", "bin.csv", "--label-column", "b"],
                        "cannot read bin.csv: not UTF-8 text")):
        assert main(["release", *args, "--epsilon", "1", "--delta", "1e-5",
                     "--out", "x.json"]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.splitlines()) == 1, err
        assert "secret" not in err and "31.4" not in err
    (tmp_path / "rep.json").write_text(json.dumps({"schema_version": "1",
                                                   "pairs_examined": 3}))
    assert main(["inspect", "rep.json"]) == 2
    assert "not a klrelease artifact: an audit report" in capsys.readouterr().err
    assert main(["release", "--epsilon", "1", "--delta", "1e-5", "--out", "x.json"]) == 2
    assert "--npz FILE or --parquet PATH" in capsys.readouterr().err


def test_sizes_accountants_and_short_help(artifact, capsys):
    assert main(["plot", "r.json", "--bins", "100000000", "--out", "p.png"]) == 2
    assert "--bins must be between 1 and" in capsys.readouterr().err
    rows = np.random.default_rng(0).normal(size=(200, 2))
    np.savetxt(artifact.parent / "u.csv", rows, delimiter=",", header="a,b", comments="")
    assert main(["learn", "--csv", "u.csv", "--components", "2", "--epsilon", "1", "--delta",
                 "1e-6", "--learner", "dp-em", "--accountant", "zcdp", "--out", "l.json"]) == 2
    assert "has no --accountant (only the Kamath" in capsys.readouterr().err
    # the learner's progress bar goes to standard error: standard output is the result line
    assert main(["learn", "--csv", "u.csv", "--components", "2", "--epsilon", "1", "--delta",
                 "1e-6", "--learner", "dp-em", "--param", "R=10", "--param", "sigma_max=2",
                 "--out", "l.json"]) == 0
    assert capsys.readouterr().out.startswith("dp-em: released a 2-component GMM")
    assert main(["release", "-h"]) == 0
    assert "Usage: klrelease release" in capsys.readouterr().out


def test_flag_names_leave_a_message_holding_nul_alone():
    from klrelease.cli.app import cli_message

    text = cli_message("bad \x000\x00 value; pass bounds=(lower, upper)")
    assert text == "bad \ufffd0\ufffd value; pass --lower/--upper"

