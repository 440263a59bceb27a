"""Every notebook and tutorial runs top to bottom on this CPU (headless, nbclient), again in the same
folder where its first run left files, and shows no error output."""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from workers import unlocked

from realbench.cache import CACHE_ENV

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "tutorials").glob("*.ipynb"))


def test_there_are_notebooks_and_tutorials():
    names = [p.name for p in NOTEBOOKS]
    assert len([n for n in names if n in {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}]) == 7
    assert len(names) == 18 and "10-lora.ipynb" in names and "11-mixture-of-experts.ipynb" in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_runs_top_to_bottom_twice_in_one_folder(path, tmp_path):
    """As a user runs it again from the top: the second run finds the first one's files. A notebook
    whose first run leaves no file in its folder and none in the profile cache (the session's:
    tests/conftest.py) would run the second time on the same inputs, so it runs once."""
    cache = Path(os.environ[CACHE_ENV])
    cached = set(cache.rglob("*"))
    for run in (1, 2):
        if run == 2 and not any(tmp_path.rglob("*")) and set(cache.rglob("*")) == cached:
            break
        nb = nbformat.read(path, as_version=4)
        with unlocked():  # (the kernel mostly waits; the runs it starts share the machine: tests/workers.py)
            NotebookClient(nb, timeout=300, kernel_name="python3",
                           resources={"metadata": {"path": str(tmp_path)}}).execute()
        for cell in nb.cells:
            for out in cell.get("outputs", []):
                assert out.get("output_type") != "error", (run, "".join(out.get("traceback", []))[-2000:])
                text = out.get("text", "") if out.get("output_type") == "stream" else ""
                assert "Traceback" not in text, run
