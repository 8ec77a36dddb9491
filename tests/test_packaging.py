"""The built wheel: documents shipped, solvers inside klrelease, installable and runnable."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # build from a copy without build artefacts: setuptools would reuse a stale build/lib
    src = tmp_path_factory.mktemp("src") / "klrelease"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", ".*_cache", ".hypothesis")

    def ignore(folder, names):
        top = {".git", "build", "dist", "experiments", "benchmarks"} if Path(folder) == ROOT \
            else set()
        return top.intersection(names) | set(skip(folder, names))

    shutil.copytree(ROOT, src, symlinks=True, ignore=ignore)
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
         "--disable-pip-version-check", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    (whl,) = out.glob("klrelease-*.whl")
    return whl


def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"klrelease", wheel.name.split("-py3")[0] + ".dist-info"}, tops
    for doc in ("klrelease/mechanisms/kl_certified/kl_certified.md", "klrelease/audit/AUDIT.md",
                "klrelease/learners/dpem/DPEM.md"):
        assert doc in names
    mds = list((ROOT / "klrelease" / "mechanisms").rglob("*.md"))
    mds += list((ROOT / "klrelease" / "learners").rglob("*.md"))  # the learners' proofs
    assert len(mds) >= 2  # each mechanism's proof beside its code
    for md in mds:
        assert md.relative_to(ROOT).as_posix() in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE")
               for n in names)
    assert "klrelease/solvers/__init__.py" in names
    assert "klrelease/solvers/backends/native.py" in names
    assert "klrelease/_data/iris.csv" in names
    for page in ("index.html", "app.js", "style.css"):  # the service's page
        assert f"klrelease/service/page/{page}" in names
    # every package of the source tree is in the wheel
    for init in (ROOT / "klrelease").rglob("__init__.py"):
        rel = init.relative_to(ROOT).as_posix()
        if "/solvers/" not in rel:
            assert rel in names, rel


def _dependency_dirs() -> list[str]:
    """The site directories of the interpreter running the tests, where the wheel's
    dependencies are installed: a virtual environment's own (``venv --system-site-packages``
    would give the base interpreter's instead), or the system's, and the user's."""
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
            *site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir()]


def test_wheel_installs_and_runs_in_a_fresh_venv(wheel, tmp_path):
    # the installed wheel only: no source tree on the path
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    inner = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                            "['purelib'])"], capture_output=True, text=True, check=True,
                           timeout=60).stdout.strip()
    # the dependencies from where the tests found them, after the venv's own site directory
    # (so the installed wheel comes first; no .pth file of theirs is run, the source tree's
    # editable install included)
    (Path(inner) / "test-dependencies.pth").write_text("\n".join(_dependency_dirs()) + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--ignore-installed", "--disable-pip-version-check", str(wheel)],
                   check=True, timeout=120, env=env)
    code = (
        "import importlib.metadata as md, klrelease, klrelease.solvers, warnings;"
        "files = [str(f) for f in md.distribution('klrelease').files];"
        "assert not any(f.startswith('solvers/') for f in files), files;"
        "assert 'klrelease/mechanisms/kl_certified/kl_certified.md' in files;"
        "print(klrelease.__file__); print(klrelease.solvers.__file__);"
        "rel = klrelease.release(klrelease.load_dataset('iris'), None, epsilon=1, delta=1e-5,"
        " mechanism='gaussian-iid'); print(rel.privacy.certified)"
    )
    res = subprocess.run([str(py), "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    first, second, certified = res.stdout.split()
    assert first.startswith(str(venv)) and second.startswith(str(venv))
    assert certified == "True"
    res = subprocess.run([str(venv / "bin" / "klrelease"), "--version"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0 and res.stdout.startswith("klrelease ")
