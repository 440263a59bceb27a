"""The real thing: `realbench lab` serves the notebooks, headless Chromium opens the search
dashboard notebook in JupyterLab, runs it, and the widgets render (no widget error text) and the
live curves gain points while the search runs."""

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from realbench.runtime.local import free_port

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "04-search-side-by-side.ipynb"

CURVE_POINTS = """() => {
  let n = 0;
  for (const doc of (window.Bokeh ? window.Bokeh.documents : []))
    for (const m of doc.all_models)
      if (m.data && m.data.best !== undefined) n += m.data.best.length;
  return n;
}"""


@pytest.fixture
def lab(tmp_path):
    (tmp_path / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, tmp_path / "notebooks" / NOTEBOOK)  # runs write outputs
    port, token = free_port(), "realbench-test"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt")}
    proc = subprocess.Popen([sys.executable, "-m", "realbench", "lab", "--dir", str(tmp_path), "--port", str(port),
                             "--no-browser", "--token", token], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
            break
        except Exception:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail("JupyterLab did not start: " + (proc.stdout.read() or "")[-2000:])
            time.sleep(0.5)
    yield f"{base}/lab/tree/notebooks/{NOTEBOOK}?token={token}"
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_search_dashboard_notebook_in_jupyterlab(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    from browser import launch

    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(lab)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
        page.wait_for_selector("#jp-main-statusbar >> text=Idle", timeout=90_000)  # the kernel is up
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        page.wait_for_selector(".widget-button >> text=Stop", timeout=90_000)  # the dashboard rendered
        counts = []
        deadline = time.time() + 60
        while time.time() < deadline and len(set(counts)) < 3:
            counts.append(page.evaluate(CURVE_POINTS))
            time.sleep(1.0)
        # the cell that waits for the searches printed their results
        page.wait_for_selector(".jp-OutputArea-output:has-text('plans evaluated')", timeout=90_000)
        page.screenshot(path=str(tmp_path / "lab.png"))
        body = page.inner_text("body")
        browser.close()
    for bad in ("Error displaying widget", "javascript error", "Failed to create view", "Traceback"):
        assert bad not in body, bad
    assert len(set(counts)) >= 3 and counts == sorted(counts), counts  # the curves gained points, live
