"""Reading and writing the versioned files: scenarios (`realbench.scenario/1`), plans
(`realbench.plan/1`) and profiles (`realbench.profile/1`), as YAML or JSON. Every problem becomes
one ConfigError naming the file and the field; an unknown key is refused by its full path with
the closest valid one (`refuse_unknown_keys`, `FileModel`):

    cluster.gpus_per_nod: unknown setting (did you mean 'gpus_per_node'? valid: nodes, gpus_per_node, ...)
"""

from __future__ import annotations

import difflib
import json
import os
import re
from functools import cached_property
import tempfile
from pathlib import Path
from typing import Any, Iterable, TypeVar, Union

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from realbench.errors import ConfigError

SCENARIO_SCHEMA = "realbench.scenario/1"
PLAN_SCHEMA = "realbench.plan/1"
PROFILE_SCHEMA = "realbench.profile/1"
DEVICE_SCHEMA = "realbench.device/1"
SCHEMAS = (SCENARIO_SCHEMA, PLAN_SCHEMA, PROFILE_SCHEMA, DEVICE_SCHEMA)

M = TypeVar("M", bound=BaseModel)


def unknown_key(key: Any, known: Iterable[str], where: str = "", also: Iterable[str] = ()) -> ConfigError:
    """The error for a key that is not one of `known`: its path (`where` is the prefix, with its
    dot: "cluster."), the closest of `known` (or of `also`, names that are valid in another form
    of the section) when one is close, and the valid keys."""
    known = list(known)
    close = difflib.get_close_matches(str(key), known + [a for a in also if a not in known], n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(f"unknown setting ({hint}valid: {', '.join(known)})", f"{where}{key}")


def refuse_unknown_keys(known: Union[type[BaseModel], Iterable[str]], value: Any, where: str = "",
                        also: Iterable[str] = ()) -> None:
    """Refuse the first key of mapping `value` that is not a field of model class `known` (or one
    of the names `known`), with `unknown_key`'s one line. Anything but a mapping passes."""
    if not isinstance(value, dict):
        return
    names = list(known.model_fields) if isinstance(known, type) and issubclass(known, BaseModel) else list(known)
    for key in value:
        if key not in names:
            raise unknown_key(key, names, where, also)


class FileModel(BaseModel):
    """A section of a file (or an object nested in one): frozen, and a key that is not a field is
    refused by name with the closest field (`refuse_unknown_keys`) before anything else is
    checked, so that a misspelt key is not reported as the field it was meant to be, missing.
    A subclass's own before-validators run first: one that reads other sections calls
    `refuse_unknown_keys(cls, v)` itself, first."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, v: Any) -> Any:
        refuse_unknown_keys(cls, v)
        return v


class DerivedValues(FileModel):
    """A frozen model whose `functools.cached_property` values (a scenario's options, a
    dataflow's graph) are worked out again on a copy: pydantic's `model_copy` copies the
    instance's __dict__, where they are kept, so a copy with other models or calls would
    otherwise answer with its original's."""

    def model_copy(self, *, update=None, deep: bool = False):
        copy = super().model_copy(update=update, deep=deep)
        for name in [k for k in copy.__dict__ if isinstance(getattr(type(copy), k, None), cached_property)]:
            del copy.__dict__[name]
        return copy


def _first_error(e: ValidationError) -> ConfigError:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError):
        return cause.within(loc) if loc else cause
    msg = str(cause) if isinstance(cause, Exception) else err["msg"]
    if err["type"] not in ("missing", "value_error") and "input" in err:
        shown = repr(err["input"])
        msg += f" (got {shown[:60] + '...' if len(shown) > 60 else shown})"
    if err["type"] == "extra_forbidden":  # a model that is not a FileModel (its fields unknown here)
        msg = "unknown setting"
    return ConfigError(msg, loc)


def validate_model(cls: type[M], data: Any, context: Any = None) -> M:
    """`cls` validated from plain data; a ValidationError becomes a ConfigError with the field."""
    try:
        return cls.model_validate(data, context=context)
    except ValidationError as e:
        raise _first_error(e) from None


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: `3e-6` is a number, as OmegaConf (verl's and
    AReaL's loader) and JSON read it, not the string PyYAML's YAML 1.1 makes of it."""


_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+][0-9]+)?
                   |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def load_yaml(text: str) -> Any:
    """YAML text as OmegaConf reads it (floats of YAML 1.2), safely."""
    return yaml.load(text, Loader=_Loader)


def read_document(path: str | os.PathLike, schema: bool = True) -> dict:
    """Parse a YAML or JSON file into a mapping; clear errors for missing/empty/garbled files.
    `schema`: the file is one of realbench's, with its `schema` field (false: an engine's)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("no such file" if not p.exists() else "not a regular file", source=str(p))
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read: {e.__class__.__name__}", source=str(p)) from None
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            data = load_yaml(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else (f" at line {e.lineno}" if hasattr(e, "lineno") else "")
        raise ConfigError(f"not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'}{where}",
                          source=str(p)) from None
    except RecursionError:
        raise ConfigError("document nested too deeply", source=str(p)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping at the top level, got {type(data).__name__}", source=str(p))
    if schema and data.get("schema") not in SCHEMAS:
        raise ConfigError(f"unknown schema {data.get('schema')!r} (expected one of {', '.join(SCHEMAS)})", "schema", str(p))
    return data


def write_document(data: dict, path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write YAML (or JSON by suffix) atomically; refuse to replace an existing file unless asked."""
    text = (json.dumps(data, indent=2) + "\n" if Path(path).suffix.lower() == ".json"
            else yaml.safe_dump(data, sort_keys=False, width=100))
    return write_text(text, path, overwrite)


def refuse_existing(paths, overwrite: bool = False) -> None:
    """Refuse, before any of them is written, files written together of which one exists (unless
    overwriting): nothing the user had is replaced, and no half of a pair is left behind."""
    for p in map(Path, paths):
        if p.exists() and not overwrite:
            raise ConfigError("exists; pass --force to overwrite it", source=str(p))


def write_text(text: str, path: str | os.PathLike, overwrite: bool = False, mode: int = 0o644) -> Path:
    """Write a file atomically (a temporary file renamed over it); refuse to replace an existing
    file unless asked, so that nothing the user had is lost silently."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise ConfigError("exists; pass --force to overwrite it", source=str(p))
    if not p.parent.exists():
        raise ConfigError("its folder does not exist", source=str(p))
    if p.is_dir():
        raise ConfigError("is a folder, not a file", source=str(p))
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, p)
    return p
