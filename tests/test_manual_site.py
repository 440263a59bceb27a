"""The manual's site (`make docs`): what it generates from the code (the command line's reference, the
benchmarks' tables) and its strictness (a broken cross-reference fails the build, naming the page and
the reference). The whole site is built by `make docs` in CI; here, its parts."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from realbench.bench import tables
from realbench.cli import build_parser
from realbench.cli.reference import markdown_reference, subcommands

ROOT = Path(__file__).resolve().parent.parent


def _hook():
    spec = importlib.util.spec_from_file_location("generated", ROOT / "docs" / "hooks" / "generated.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_names_every_command_and_every_flag_with_its_help():
    text = markdown_reference()
    for name, child in subcommands(build_parser()).items():
        assert f"## `realbench {name}`" in text, name
        for action in child._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in text, (name, flag)
    # every argument says what it is: no empty meaning cell
    assert not [line for line in text.splitlines() if line.endswith("|  |")]
    assert "\n## `realbench checkpoint convert`" not in text and "\n### `realbench checkpoint convert`" in text


def test_the_tables_format_hand_worked_rows():
    fidelity = {"summary": {"train": {"fit": {"rows": 3, "median_error": 0.08396, "worst_error": 0.15196}}}}
    assert tables.fidelity_summary(fidelity).splitlines()[2] == "| train | fit | 3 | 8.4% | 15.2% |"
    row = {"scenario": "s", "engine": "areal", "reward": "function", "example_s": None, "default_s": 12.345,
           "best_s": 10.0, "search_gain": 1.2345, "realbench_s": 9.0, "realbench_zero_s": 8.0, "reallocation_gain": 1.25}
    assert tables.engines_table({"rows": [row]}).splitlines()[2] == \
        "| s | AReaL (reward function) | out of memory | 12.35 | 10.00 | 1.23x | 9.00 | 8.00 | 1.25x |"
    engine = {"examples": 10, "rl_jobs": 8, "stale": 2, "priced": 3, "share_priced": 3 / 8,
              "share_priced_of_running": 0.5, "refused": {"a.b": 4, "c": 1}}
    result = {"engines": {"verl": engine, "areal": engine}, "share_priced": 6 / 16, "share_priced_of_running": 0.5}
    lines = tables.coverage_table(result, refusals=1).splitlines()
    assert lines[2] == "| verl | 10 | 8 | 2 | 3 | 38% (50%) | `a.b` (4) |"
    assert lines[4] == "| all | 20 | 16 | 4 | 6 | 38% (50%) |  |"


def test_the_hook_fills_each_marker_and_refuses_an_unknown_table():
    hook = _hook()
    page = "# P\n\n<!-- generated: table coverage -->\n\ninline `<!-- generated: cli -->` stays\n"
    out = hook.on_page_markdown(page, None, None, None)
    measured = json.loads((ROOT / "docs" / "measurements" / "data" / "bench-coverage.json").read_text())
    assert tables.coverage_table(measured) in out and "inline `<!-- generated: cli -->` stays" in out
    with pytest.raises(ValueError, match="no benchmark table 'nope'"):
        hook.on_page_markdown("<!-- generated: table nope -->\n", None, None, None)
    # every marker of the manual names a table there is
    for page in (ROOT / "docs").rglob("*.md"):
        for name in hook.MARKER.findall(page.read_text()):
            assert name[0] == "cli" or name[1] in tables.TABLES, (page, name)


def test_the_stored_measurements_hold_no_path_of_the_machine_that_measured():
    for path in (ROOT / "docs" / "measurements" / "data").glob("*.json"):
        text = path.read_text()
        json.loads(text)
        assert "/tmp/" not in text and "/home/" not in text and "/work/" not in text, path


def test_a_broken_cross_reference_fails_the_strict_build_naming_page_and_reference(tmp_path):
    """The manual's own settings (mkdocs.yml: strict, the link validation) on two pages, one linking
    to a page that does not exist: the build fails, naming both."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    (docs / "guides").mkdir(parents=True)
    (docs / "index.md").write_text("# Home\n\nSee [the guide](guides/run.md).\n")
    (docs / "guides" / "run.md").write_text("# Run\n\nSee [the cost model](../concepts/cost-model.md).\n")
    keep = {k: config[k] for k in ("site_name", "strict", "validation", "markdown_extensions")}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump({**keep, "docs_dir": "docs", "site_dir": "site"}))
    mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict"]  # (--quiet would hide the warnings strict counts)
    done = subprocess.run(mkdocs, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode != 0
    assert "guides/run.md" in done.stderr and "../concepts/cost-model.md" in done.stderr, done.stderr
    (docs / "concepts").mkdir()
    (docs / "concepts" / "cost-model.md").write_text("# The cost model\n")
    done = subprocess.run(mkdocs, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(entry):
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, list):
            for e in entry:
                yield from pages(e)
        elif isinstance(entry, dict):
            for v in entry.values():
                yield from pages(v)

    listed = set(pages(config["nav"]))
    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts}
    assert on_disk <= listed, on_disk - listed


def test_the_engines_pages_ranges_are_its_tables():
    """The prose of docs/measurements/engines.md quotes the reallocation gains of its table's run (the
    dense jobs; the mixture of experts is discussed apart) and the long-tailed PPO job's two plans."""
    import re

    page = " ".join((ROOT / "docs" / "measurements" / "engines.md").read_text().split())
    rows = json.loads((ROOT / "docs" / "measurements" / "data" / "bench-engines.json").read_text())["rows"]
    dense = [r for r in rows if r["scenario"] != "grpo-qwen3-30b-a3b-16gpu"]
    said = re.search(r"([\d.]+)x to ([\d.]+)x over verl's searched plans and ([\d.]+)x to ([\d.]+)x over OpenRLHF's "
                     r".*?([\d.]+)x to ([\d.]+)x over AReaL's", page)
    for i, engine in enumerate(("verl", "openrlhf", "areal")):
        gains = [r["reallocation_gain"] for r in dense if r["engine"] == engine]
        assert (float(said.group(2 * i + 1)), float(said.group(2 * i + 2))) == (round(min(gains), 2), round(max(gains), 2))
    tail = {r["engine"]: r["best_s"] for r in rows if r["scenario"] == "ppo-8b-16gpu-longtail"}
    packed = re.search(r"verl's packed rows \(([\d.]+) s\) beat OpenRLHF's padded ones \(([\d.]+) s", page)
    assert (float(packed.group(1)), float(packed.group(2))) == (round(tail["verl"], 2), round(tail["openrlhf"], 2))
