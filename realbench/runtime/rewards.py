"""Reward functions: a Python function in a file, `f(prompts, completions, **columns)`, with TRL's
convention (the dataset's other columns arrive as keyword arguments, one value per response).

A scenario names one as `models.reward: {function: rewards.py:name}` (the file relative to the
scenario); `validate` imports it and checks the name, and the worker calls it on the responses
of its share of the batch. What it returns is checked: one finite number per response. Any
failure becomes one line naming the function and the step.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any, Callable

from realbench.errors import ConfigError
from realbench.models import FunctionSpec


def load_function(file: str, name: str) -> Callable:
    """Import `file` (a module of its own) and return its `name`, or say precisely what is wrong."""
    path = Path(file)
    if not path.is_file():
        raise ConfigError("no such file", "function", str(path))
    # a module per version of the file: an edited file is imported again, not served stale
    stat = path.stat()
    module_name = f"realbench_reward_{abs(hash((str(path.resolve()), stat.st_mtime_ns, stat.st_size)))}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # the user's code: any error is theirs to see, in one line
            raise ConfigError(f"importing it raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                              "function", str(path)) from None
        sys.modules[module_name] = module
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"defines no function {name!r}", "function", str(path))
    return fn


def function_spec(entry: dict, base: Path, role: str) -> FunctionSpec:
    """`{function: FILE:NAME[, seconds_per_sample: S]}` of a scenario, checked."""
    unknown = sorted(set(entry) - {"function", "seconds_per_sample"})
    if unknown:
        raise ConfigError("unknown field beside function (known: function, seconds_per_sample)", unknown[0])
    text = entry["function"]
    if not isinstance(text, str) or ":" not in text or not text.rsplit(":", 1)[1].isidentifier():
        raise ConfigError(f"{text!r} is not FILE.py:FUNCTION", "function")
    file, name = text.rsplit(":", 1)
    path = (base / Path(file).expanduser()).resolve()
    load_function(str(path), name)
    extra = {"seconds_per_sample": entry["seconds_per_sample"]} if "seconds_per_sample" in entry else {}
    return FunctionSpec(name=f"{Path(file).name}:{name}", function=f"{path}:{name}", **extra)


def call_reward_function(fn: Callable, spec: FunctionSpec, prompts: list, completions: list[str],
                         columns: dict[str, list[Any]], step: int) -> list[float]:
    """Call it and check what it gives back; a failure names the function and the step."""
    where = f"reward function {spec.name} at step {step}"
    try:
        out = fn(prompts=prompts, completions=completions, **columns)
    except Exception as e:
        raise RuntimeError(f"{where} raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    try:
        values = [float(x) for x in out]
    except (TypeError, ValueError):
        raise RuntimeError(f"{where} returned {type(out).__name__}, not a list of numbers") from None
    if len(values) != len(completions):
        raise RuntimeError(f"{where} returned {len(values)} values for {len(completions)} completions")
    bad = [i for i, x in enumerate(values) if not math.isfinite(x)]
    if bad:
        raise RuntimeError(f"{where} returned {values[bad[0]]} for completion {bad[0]}")
    return values
