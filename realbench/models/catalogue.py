"""The built-in catalogue: the config.json of the models people RL-train, so that a scenario can
name one (`models: {actor: qwen3-8b}`) with no files at all, and an engine's configuration that
names a hub id (`Qwen/Qwen3-8B`) can be planned where the hub's files are not at hand.

Each entry is a copy of a hub config (`catalogue/<name>.json`), listed in `catalogue/index.yaml`
with the hub id it copies and where its values were checked. Read by the same family readers as
a checkpoint's config (realbench.models.hf); planned and exported, not run (no weights).
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Optional

from realbench.errors import ConfigError
from realbench.schema import load_yaml

FOLDER = "catalogue"


@lru_cache(maxsize=1)
def index() -> dict[str, dict]:
    """{name: {hub, source, complete}} of every entry."""
    text = resources.files("realbench.models").joinpath(FOLDER, "index.yaml").read_text(encoding="utf-8")
    return dict(load_yaml(text) or {})


def names() -> tuple[str, ...]:
    return tuple(index())


def find(name_or_hub: str) -> Optional[str]:
    """The entry a name or a hub id names (case aside), or None."""
    key = name_or_hub.strip().lower()
    for name, entry in index().items():
        if key in (name.lower(), str(entry.get("hub", "")).lower()):
            return name
    return None


@lru_cache(maxsize=64)
def _config_text(name: str) -> str:
    return resources.files("realbench.models").joinpath(FOLDER, f"{name}.json").read_text(encoding="utf-8")


def config(name: str) -> dict:
    """The hub config.json an entry copies (a fresh dict each time)."""
    if name not in index():
        raise ConfigError(f"no catalogue entry {name!r} (entries: {', '.join(names())})")
    return json.loads(_config_text(name))


def hub_id(name: str) -> str:
    return str(index()[name]["hub"])
