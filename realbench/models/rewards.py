"""Reward functions: a Python function in a file, called as TRL's GRPOTrainer calls one:
`f(prompts, completions, completion_ids, trainer_state, **columns)`.

  * `prompts`: as the data gives them (text, or a list of {role, content} messages);
  * `completions`: the responses decoded (special tokens skipped); when the prompts are chat
    messages (or `data.chat` is set), each is a list with one message,
    `[{"role": "assistant", "content": text}]`;
  * `completion_ids`: each response's token ids, its end-of-sequence token included;
  * `trainer_state`: `global_step` and `epoch` (the attributes of TRL's TrainerState that a
    reward can use to change with training);
  * the dataset's other columns as keyword arguments, one value per response.

A function that does not take `**kwargs` gets only the arguments it names (one that names an
argument nobody gives is refused by `validate`). A scenario names one as
`models.reward: {function: rewards.py:name}` (the file relative to the scenario); the worker
calls it on the responses of its share of the batch. What it returns is checked: one finite
number or None per response; None means no reward from this function for that sample (TRL
turns it into NaN, which its weighted sum over functions leaves out). Any failure becomes one
line naming the function and the step.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from realbench.errors import ConfigError
from realbench.models import FunctionSpec
from realbench.schema import refuse_unknown_keys

FUNCTION_KEYS = ("function", "seconds_per_sample")  # of a scenario's function entry
# realbench's stand-ins for an engine's own scorers, which `realbench import` names in a scenario
# (realbench.engines.verl.reward, areal.reward), by the file they were before the engines were
# packages: a scenario written then names that file, read as the stand-in's file now
MOVED_STAND_INS = {("realbench", "engines", "verl_reward.py"): ("engines", "verl", "reward.py"),
                   ("realbench", "engines", "areal_reward.py"): ("engines", "areal", "reward.py")}


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


def function_spec(entry: dict, base: Path, role: str, model_score: bool = False) -> FunctionSpec:
    """`{function: FILE:NAME or [FILE:NAME, ...][, seconds_per_sample: S]}` of a scenario,
    checked (each file imported, each function found)."""
    refuse_unknown_keys(FUNCTION_KEYS, entry)
    texts = entry["function"] if isinstance(entry["function"], list) else [entry["function"]]
    functions = []
    for text in texts:
        if not isinstance(text, str) or ":" not in text or not text.rsplit(":", 1)[1].isidentifier():
            raise ConfigError(f"{text!r} is not FILE.py:FUNCTION", "function")
        file, name = text.rsplit(":", 1)
        path = (base / Path(file).expanduser()).resolve()
        if not path.is_file() and path.parts[-3:] in MOVED_STAND_INS:
            path = Path(__file__).resolve().parents[1].joinpath(*MOVED_STAND_INS[path.parts[-3:]])
        load_function(str(path), name)
        functions.append(f"{path}:{name}")
    if not functions:
        raise ConfigError("names no function", "function")
    extra = {"seconds_per_sample": entry["seconds_per_sample"]} if "seconds_per_sample" in entry else {}
    name = ", ".join(FunctionSpec.short(f) for f in functions)
    return FunctionSpec(name=name, functions=tuple(functions), model_score=model_score, **extra)


GIVEN = ("prompts", "completions", "completion_ids", "trainer_state")  # besides the data's columns


def missing_arguments(fn: Callable, columns: list[str]) -> list[str]:
    """Parameters `fn` needs (no default) that no call gives: neither TRL's arguments nor a column."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty
            and p.name not in GIVEN and p.name not in columns]


@dataclass(frozen=True)
class TrainerState:
    """What TRL's `trainer_state` argument offers a reward function that changes with training."""

    global_step: int
    epoch: float


def accepted_arguments(fn: Callable, given: dict[str, Any]) -> dict[str, Any]:
    """The arguments of `given` that `fn` takes: all of them with `**kwargs`, else those it names."""
    params = inspect.signature(fn).parameters
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return given
    return {k: v for k, v in given.items() if k in params}


def call_reward_function(fn: Callable, name: str, prompts: list, completions: list,
                         columns: dict[str, Any], step: int) -> list[float]:
    """Call it and check what it gives back (None becomes NaN); a failure names the function
    (`name`) and the step."""
    where = f"reward function {name} at step {step}"
    try:
        args = accepted_arguments(fn, {"prompts": prompts, "completions": completions, **columns})
    except (TypeError, ValueError):  # a builtin or a callable without a signature: give everything
        args = {"prompts": prompts, "completions": completions, **columns}
    try:
        out = fn(**args)
    except Exception as e:
        raise RuntimeError(f"{where} raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    try:
        out = list(out)
        values = [math.nan if x is None else float(x) for x in out]
    except (TypeError, ValueError):
        raise RuntimeError(f"{where} returned {type(out).__name__}, not a list of numbers") from None
    if len(values) != len(completions):
        raise RuntimeError(f"{where} returned {len(values)} values for {len(completions)} completions")
    bad = [i for i, x in enumerate(values) if math.isinf(x) or (math.isnan(x) and out[i] is not None)]
    if bad:
        raise RuntimeError(f"{where} returned {values[bad[0]]} for completion {bad[0]}")
    return values
