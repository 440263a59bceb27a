"""The manual cannot drift from the code: every shell and Python code block of the README and of
docs/ runs here, page by page in a fresh folder, in the order a reader meets them (a page's Python
blocks share one namespace, its shell blocks one folder, as a reader's terminal and notebook do).

A block that must not run as written (it takes minutes, or installs packages) is preceded by a
comment saying how it is checked instead, `<!-- docs-test: HOW -->`, and HOW is one of CHECKS:
`make -n ...` runs make's dry run of each target the block names (the target exists and its recipe
resolves), `the package's extras` checks each `pip install` line against pyproject.toml (the
extras it names exist, torch is the Makefile's pin). Anything else is refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)
SHELL, PYTHON = {"sh", "bash", "shell", "console"}, {"python", "py", "pycon"}
BLOCK = re.compile(r"(?:<!-- docs-test: (?P<how>[^>]*?) -->\n)?```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^```", re.S | re.M)
CHECKS = ("make -n", "the package's extras")


def blocks(page: Path) -> list[tuple[str, str, str]]:
    """(language, code, how it is checked: '' when it runs) of each shell or Python block."""
    found = []
    for m in BLOCK.finditer(page.read_text()):
        lang = m.group("lang").lower()
        if lang in SHELL | PYTHON:
            found.append((lang, m.group("code"), (m.group("how") or "").split(" (")[0].strip()))
    return found


def _commands(code: str) -> list[str]:
    joined = code.replace("\\\n", " ")
    return [line.split("#", 1)[0].strip() for line in joined.splitlines() if line.split("#", 1)[0].strip()]


def check_make(code: str) -> None:
    for line in _commands(code):
        words = line.split()
        assert words[0] == "make", f"not a make command: {line!r}"
        done = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, (line, done.stderr)


def check_extras(code: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pin = re.search(r"torch==([\d.]+)", (ROOT / "Makefile").read_text()).group(1)
    for line in _commands(code):
        assert line.startswith("pip install "), f"not a pip install: {line!r}"
        for word in line.split()[2:]:
            word = word.strip("'\"")
            if word.startswith("torch"):
                assert word == f"torch=={pin}", word
            else:
                name, _, extras = word.partition("[")
                assert name == project["name"], word
                for extra in filter(None, extras.rstrip("]").split(",")):
                    assert extra in project["optional-dependencies"], (word, extra)


def run_page(page: Path, folder: Path) -> int:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "MPLBACKEND": "Agg"}
    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    for i, (lang, code, how) in enumerate(blocks(page)):
        where = f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name} block {i + 1}"
        if how:
            assert how in CHECKS, f"{where}: unknown docs-test check {how!r} (known: {CHECKS})"
            (check_make if how == "make -n" else check_extras)(code)
        elif lang in SHELL:
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=folder, env=env,
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"{where} exited {done.returncode}:\n{code}\n{done.stderr[-3000:]}"
        else:
            cwd = os.getcwd()
            os.chdir(folder)
            try:
                exec(compile(code, where, "exec"), namespace)
            finally:
                os.chdir(cwd)
        ran += 1
    return ran


def test_the_pages_hold_code_blocks():
    counts = {p.relative_to(ROOT).as_posix(): len(blocks(p)) for p in PAGES}
    assert sum(counts.values()) >= 15, counts
    assert counts["docs/getting-started.md"] >= 4 and counts["README.md"] >= 2, counts


def test_an_unknown_check_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- docs-test: trust me -->\n```sh\nfalse\n```\n")
    with pytest.raises(AssertionError, match="unknown docs-test check 'trust me'"):
        run_page(page, tmp_path)


def test_a_failing_block_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```sh\nrealbench estimate --scenario no-such-scenario --baseline symmetric\n```\n")
    with pytest.raises(AssertionError, match="block 1 exited 2"):
        run_page(page, tmp_path)


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_code_block_runs(page, tmp_path):
    assert run_page(page, tmp_path) == len(blocks(page))
