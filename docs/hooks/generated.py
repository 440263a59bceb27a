"""What the manual does not type by hand (an MkDocs hook, mkdocs.yml `hooks:`):

* `<!-- generated: cli -->` becomes the command line's reference, from its argument parser
  (realbench.cli.reference);
* `<!-- generated: table NAME -->` becomes a benchmark's table (realbench.bench.tables): `fidelity`
  (and its `engine_steps` and `engine_predictions`) is computed at build time (`bench fidelity`, a few seconds), `engines` and `coverage` come from the
  JSON their measured runs wrote (docs/measurements/data/bench-NAME.json: they search for minutes, and
  coverage needs the engines' example folders);
* the notebooks and tutorials become pages with their outputs: each is executed top to bottom in a
  folder of its own (nothing is written beside the sources), kept under .cache/docs-notebooks/ by the
  hash of the notebook and of realbench's sources, and rendered by mkdocs-jupyter.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import tempfile
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "measurements" / "data"
CACHE = ROOT / ".cache" / "docs-notebooks"
FOLDERS = {"notebooks": "Notebooks", "tutorials": "Tutorials"}
MARKER = re.compile(r"^<!-- generated: (cli|table (\w+)) -->$", re.M)
log = logging.getLogger("mkdocs.hooks.generated")


def notebooks() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).glob("*.ipynb"))]


def _sources_digest() -> str:
    h = hashlib.sha256()
    for p in sorted((ROOT / "realbench").rglob("*")):
        if p.is_file() and p.suffix in {".py", ".yaml", ".json"}:
            h.update(p.relative_to(ROOT).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def executed(path: Path, digest: str) -> Path:
    """The notebook with its outputs, run in a temporary folder (as a user runs it from a fresh one)."""
    import nbformat
    from nbclient import NotebookClient

    key = hashlib.sha256(path.read_bytes() + digest.encode()).hexdigest()[:20]
    out = CACHE / f"{path.stem}-{key}.ipynb"
    if not out.exists():
        log.info("executing %s", path.relative_to(ROOT))
        nb = nbformat.read(path, as_version=4)
        with tempfile.TemporaryDirectory() as folder:
            NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=False,
                           resources={"metadata": {"path": folder}}).execute()
        CACHE.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)
    return out


def on_config(config):
    """The notebooks' pages in the navigation, in the order of their file names."""
    for entry in config["nav"]:
        if isinstance(entry, dict):
            (title, value), = entry.items()
            folder = next((f for f, t in FOLDERS.items() if t == title), None)
            if folder:
                entry[title] = [f"{folder}/{p.name}" for p in notebooks() if p.parent.name == folder]
    return config


@event_priority(100)  # before mkdocs-jupyter takes the .ipynb files as its pages
def on_files(files, config):
    digest = _sources_digest()
    for path in notebooks():
        files.append(File.generated(config, f"{path.parent.name}/{path.name}", abs_src_path=str(executed(path, digest))))
    return files


# the tables of `bench fidelity`, computed at build time (once: a few seconds)
FIDELITY_TABLES = ("fidelity", "engine_steps", "engine_predictions", "engine_fit")


@functools.lru_cache(maxsize=None)
def _fidelity() -> dict:
    from realbench.bench import fidelity

    return fidelity.run()


def table(name: str) -> str:
    from realbench.bench import tables

    if name not in tables.TABLES:
        raise ValueError(f"no benchmark table {name!r} (known: {', '.join(tables.TABLES)})")
    if name in FIDELITY_TABLES:
        result = _fidelity()
    else:
        result = json.loads((DATA / f"bench-{tables.TABLE_SOURCES.get(name, name)}.json").read_text())
    return tables.TABLES[name](result)


def on_page_markdown(markdown, page, config, files):
    def replace(m):
        if m.group(1) == "cli":
            from realbench.cli.reference import markdown_reference

            return markdown_reference()
        return table(m.group(2))

    return MARKER.sub(replace, markdown)
