"""The per-step timings an RL engine logged, read from the files it writes.

    verl       its console lines (`step:3 - timing_s/gen:25.9 - ...`, verl.utils.logger.
               aggregate_logger.concat_dict_to_str) and its file logger's JSON lines
               (`{"step": 3, "data": {...}}`, verl.utils.tracking.FileLogger)
    openrlhf   its TensorBoard event files (`train/timing/...` scalars, the `train/` prefix taken
               off) and its console lines (`Global step 3: {'timing/generation': 45.6, ...}`,
               openrlhf/trainer/ppo_trainer.py)
    areal      its TensorBoard event files (`timeperf/...` scalars) and its console's stats
               tables (`Train step 3/100 done.`, then `│ key │ value │` rows, areal/utils/
               stats_logger.py and printing.py)
    realbench  `realbench run --out DIR`'s metrics.jsonl (a line per step, `timing_s/<call>`)

Every reader gives a `StepLog`: one mapping of metric names to numbers per logged step, the
format it was read as, and the model the log names where it names one (verl's console prints its
configuration first). A file that is none of these, or holds no step, is refused by name.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from realbench.errors import ConfigError

ENGINES = ("verl", "openrlhf", "areal", "realbench")
CONSOLE = {"verl": "verl's console: 'step:N - key:value - ...'", "openrlhf": "OpenRLHF's console: 'Global step N: {...}'",
           "areal": "AReaL's console: 'Train step N/M done.' and its stats table",
           "realbench": "realbench run's metrics.jsonl"}

# verl's console: "step:12 - key:value - key:value" (a Ray actor's prefix before it, colour codes
# around it); numbers as pprint writes them, NumPy 2's scalars as np.float64(1.5)
_CONSOLE_STEP = re.compile(r"step:(\d+) - (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUMPY_SCALAR = re.compile(r"^np\.\w+\((.*)\)$")
# a Ray actor's prefix on each line it prints: "(TaskRunner pid=123, ip=10.0.0.1) "
_RAY_PREFIX = re.compile(r"^\(\w+ pid=\d+(?:, ip=[\d.]+)?\)\s?")
# the model a verl run trains, as the configuration it prints first names it (pprint of
# actor_rollout_ref.model.path: the first `'model': {... 'path': ...}` after 'actor_rollout_ref')
_MODEL_PATH = re.compile(r"'model':\s*\{(?:[^{}]|\{[^{}]*\})*?'path':\s*'([^']+)'")


@dataclass(frozen=True)
class StepLog:
    """An engine's per-step metrics: `steps[i]` maps metric names to numbers (with "step")."""
    source: str
    format: str
    steps: tuple[dict, ...]
    model: Optional[str] = None  # the model path the log names, if it names one

    def keys(self) -> set[str]:
        return {k for s in self.steps for k in s}


def _number(text: str) -> Optional[float]:
    text = text.strip()
    m = _NUMPY_SCALAR.match(text)
    if m:
        text = m.group(1)
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _numbers(values: dict) -> dict[str, float]:
    """The finite numbers of a mapping (booleans, text and nested values left out)."""
    return {k: float(v) for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def _console_steps(text: str) -> list[dict]:
    steps = []
    for line in text.splitlines():
        m = _CONSOLE_STEP.search(_ANSI.sub("", line))
        if not m:
            continue
        row = {"step": int(m.group(1))}
        for pair in m.group(2).split(" - "):
            key, sep, value = pair.rpartition(":")
            v = _number(value) if sep else None
            if key and v is not None:
                row[key.strip()] = v
        if len(row) > 1:
            steps.append(row)
    return steps


# OpenRLHF's console: "... Global step 3: {python dict}"
_OPENRLHF_STEP = re.compile(r"Global step (\d+): (\{.*\})\s*$")
# AReaL's console: a header per step, then a table of `key │ value` cells
_AREAL_STEP = re.compile(r"Train step (\d+)/\d+ done")
_AREAL_CELL = re.compile(r"([\w./@-]+)\s*│\s*([-+0-9.eE]+|nan|inf)\s*(?=│)")
# OpenRLHF prints its arguments first (a namespace: actor=namespace(..., model_name_or_path='...'))
_OPENRLHF_MODEL = re.compile(r"model_name_or_path='([^']+)'")


def _openrlhf_steps(text: str) -> list[dict]:
    import ast

    steps = []
    for line in text.splitlines():
        m = _OPENRLHF_STEP.search(_ANSI.sub("", line))
        if not m:
            continue
        try:
            values = ast.literal_eval(m.group(2))
        except (ValueError, SyntaxError):
            continue
        if isinstance(values, dict):
            steps.append({"step": int(m.group(1)), **_numbers(values)})
    return steps


def _areal_steps(text: str) -> list[dict]:
    steps, row = [], None
    for line in text.splitlines():
        line = _ANSI.sub("", line)
        m = _AREAL_STEP.search(line)
        if m:
            row = {"step": int(m.group(1))}
            steps.append(row)
            continue
        if row is not None and "│" in line:
            for key, value in _AREAL_CELL.findall(line):
                v = _number(value)
                if v is not None:
                    row[key] = v
    return [r for r in steps if len(r) > 1]


def _json_lines(text: str, source: str) -> list[dict]:
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            raise ConfigError(f"line {i} is not JSON (a JSON-lines log has one object a line)", source=source) from None
        if not isinstance(doc, dict) or "step" not in doc:
            raise ConfigError(f"line {i} has no step", source=source)
        # verl's file logger nests the metrics under "data"; realbench's are flat
        data = doc["data"] if isinstance(doc.get("data"), dict) else doc
        rows.append({**_numbers(data), "step": int(doc["step"])})
    return rows


def _event_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and "tfevents" in p.name)


def _tensorboard_steps(path: Path) -> list[dict]:
    """Scalars of TensorBoard event files (a file, or every one under a folder), by step."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise ConfigError("reading TensorBoard event files needs the tensorboard package "
                          "(pip install tensorboard)", source=str(path)) from None
    by_step: dict[int, dict] = {}
    for file in _event_files(path):
        acc = EventAccumulator(str(file), size_guidance={"scalars": 0})
        try:
            acc.Reload()
        except Exception as e:  # a truncated or foreign file: the reader's own error, named
            raise ConfigError(f"not a TensorBoard event file ({e.__class__.__name__})", source=str(file)) from None
        for tag in acc.Tags().get("scalars", []):
            for event in acc.Scalars(tag):
                by_step.setdefault(int(event.step), {"step": int(event.step)})[tag] = float(event.value)
    return [by_step[s] for s in sorted(by_step)]


def read_log(engine: str, path: str) -> StepLog:
    """The per-step metrics of `engine`'s log at `path` (see the module doc for the formats)."""
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})", "--engine")
    p = Path(path)
    if not p.exists():
        raise ConfigError("no such file or folder", source=str(p))
    if p.is_dir() or "tfevents" in p.name:
        if engine in ("verl", "realbench") and p.is_dir():
            raise ConfigError(f"is a folder: give {engine}'s log file", source=str(p))
        if not _event_files(p):
            raise ConfigError("holds no TensorBoard event file (*tfevents*)", source=str(p))
        steps = _tensorboard_steps(p)
        if engine == "openrlhf":  # its tags: train/<metric>
            steps = [{k[len("train/"):] if k.startswith("train/") else k: v for k, v in s.items()} for s in steps]
        return StepLog(str(p), f"{engine} TensorBoard", tuple(steps))
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ConfigError(f"cannot read: {e.__class__.__name__}", source=str(p)) from None
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not first:
        raise ConfigError("is empty", source=str(p))
    if _is_json_object(first):
        steps = _json_lines(text, str(p))
        return StepLog(str(p), f"{engine} JSON lines", tuple(steps))
    if engine == "openrlhf":
        model = _OPENRLHF_MODEL.search(text)
        steps = _openrlhf_steps(text)
        model = model.group(1) if model else None
    elif engine == "areal":
        steps, model = _areal_steps(text), None
    else:
        steps = _console_steps(text)
        model = _model_path(text) if steps else None
    if not steps:
        raise ConfigError(f"no line of a known logger format ({CONSOLE[engine]}; JSON lines; TensorBoard event "
                          "files)", source=str(p))
    return StepLog(str(p), f"{engine} console", tuple(steps), model)


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


def _model_path(text: str) -> Optional[str]:
    """actor_rollout_ref.model.path as verl's printed configuration names it, if it is there."""
    head = " ".join(_RAY_PREFIX.sub("", _ANSI.sub("", line)).strip() for line in text.splitlines()
                    if not _CONSOLE_STEP.search(line))
    start = head.find("'actor_rollout_ref'")
    m = _MODEL_PATH.search(head, start) if start >= 0 else None
    return m.group(1) if m else None
