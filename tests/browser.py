"""Headless Chromium for the browser tests: Debian's chromium driven by Playwright (Playwright
cannot download its own browser here). Without a browser the tests skip with the reason, unless
REALBENCH_REQUIRE_BROWSER=1 (set by CI), where they fail."""

from __future__ import annotations

import os
import shutil

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def chromium_path() -> str:
    path = os.environ.get("REALBENCH_CHROMIUM") or next(filter(None, map(shutil.which, CANDIDATES)), None)
    if not path:
        message = ("no Chromium found (install Debian's `chromium`, or set REALBENCH_CHROMIUM to a "
                   "Chromium executable)")
        if os.environ.get("REALBENCH_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def launch(playwright):
    return playwright.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
