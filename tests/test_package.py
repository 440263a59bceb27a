"""The package people install: `python -m build` makes a wheel and an sdist from the tracked files,
the wheel holds every data file the code reads, and installed into a fresh virtual environment
outside the checkout it lists, estimates and searches a built-in scenario."""

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import realbench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The wheel and the sdist, built from a copy of the tracked files (what a clean clone holds)."""
    tmp = tmp_path_factory.mktemp("package")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    source = tmp / "source"
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():  # (a tracked file deleted in the working tree is not built)
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp / "dist"), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [wheel] = (tmp / "dist").glob("realbench-*.whl")
    [sdist] = (tmp / "dist").glob("realbench-*.tar.gz")
    return tmp, wheel, sdist


def test_the_wheel_holds_every_data_file_and_the_version_of_one_place(built):
    _, wheel, sdist = built
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "realbench"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    data = {name for name in tracked if not name.endswith(".py") and (ROOT / name).is_file()}
    # the engines' version files, the published measurements, the catalogue: every one the code reads
    assert {"realbench/engines/verl/verl-0.9.1.json", "realbench/hardware/published.yaml",
            "realbench/models/catalogue/index.yaml"} <= data
    assert data <= names, sorted(data - names)
    assert {name for name in tracked if name.endswith(".py")} <= names
    info = f"realbench-{realbench.__version__}.dist-info"
    metadata = Parser().parsestr(zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode())
    assert metadata["Version"] == realbench.__version__ and wheel.name.startswith(f"realbench-{realbench.__version__}-")
    assert metadata["License-Expression"] == "Apache-2.0" and f"{info}/licenses/LICENSE" in names
    assert "lab" in metadata.get_all("Provides-Extra")
    lab = [r for r in metadata.get_all("Requires-Dist") if "extra == \"lab\"" in r]
    assert {r.split(">")[0].split(";")[0].strip() for r in lab} == {"ipywidgets", "jupyter_bokeh", "jupyterlab",
                                                                     "ipykernel"}, lab
    assert sdist.name == f"realbench-{realbench.__version__}.tar.gz"


def test_the_installed_wheel_lists_estimates_and_searches_outside_the_checkout(built):
    tmp, wheel, _ = built
    venv = tmp / "fresh venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    # (the dependencies from this environment, not downloaded again: its site-packages on the path,
    # whose .pth files, this checkout's editable install among them, are not read from there)
    (purelib / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                           "--quiet", str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    work = tmp / "somewhere else"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def realbench_cli(*args):
        done = subprocess.run([str(venv / "bin" / "realbench"), *args], cwd=work, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, (args, done.stderr[-2000:])
        return done.stdout

    where = subprocess.run([str(python), "-c", "import realbench; print(realbench.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(purelib) and not Path(where).is_relative_to(ROOT), where
    assert "ppo-7b-7b-16gpu" in realbench_cli("scenarios")
    assert "qwen3-30b-a3b" in realbench_cli("models")  # (the catalogue's files)
    realbench_cli("estimate", "--scenario", "ppo-7b-7b-16gpu", "--baseline", "symmetric", "--out", "symmetric.yaml")
    realbench_cli("search", "--scenario", "ppo-7b-7b-16gpu", "--method", "mcmc", "--time-budget", "3", "--seed", "0",
                  "--out", "searched.yaml")
    assert (work / "symmetric.yaml").is_file() and (work / "searched.yaml").is_file()
    # the engines' settings tables, read where the package is installed
    out = subprocess.run([str(python), "-c", "from realbench.engines import verl; print(len(verl.defaults('dp')))"],
                         cwd=work, env=env, capture_output=True, text=True, check=True).stdout
    assert int(out) > 500


def test_the_workbench_without_its_extra_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    for name in [m for m in sys.modules if m == "realbench.widgets" or m.startswith("realbench.widgets.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=r"needs ipywidgets: pip install 'realbench\[lab\]'"):
        importlib.import_module("realbench.widgets")
