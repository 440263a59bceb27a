"""The engines that run RLHF at scale, as realbench plans them: one module per engine, each with
its space (the plans the engine can run, `space_problem`), a reader of its configuration into a
scenario and a plan (`read_config`, `to_plan`) and a writer of a plan as its configuration
(`to_config`). The strategies they train with (FSDP, ZeRO, Megatron's distributed optimizer) are
priced in realbench.cost. Each module names the source file of the engine's every rule; each
engine's own code checks what realbench writes (`make engines`, the tests)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from realbench.engines import areal, openrlhf, verl
from realbench.errors import ConfigError
from realbench.plan.mesh import Option
from realbench.plan.plan import plan_from_document, resolve_plan
from realbench.plan.scenario import Scenario, scenario_from_document
from realbench.schema import refuse_existing, write_document, write_text

ENGINES = {"verl": verl, "openrlhf": openrlhf, "areal": areal}


# where an engine's configuration gives the node size (OpenRLHF's command line does not)
NODE_SIZE_KEYS = {"verl": "trainer.n_gpus_per_node", "areal": "cluster.n_gpus_per_node"}


def engine_module(name: str):
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})") from None


def import_config(engine: str, path: str, overrides: list[str], out: str, device: str = "h100",
                  name: Optional[str] = None, overwrite: bool = False, gpus_per_node: Optional[int] = None
                  ) -> tuple[Path, Path]:
    """Read an engine's configuration (and overrides) into `out`/<name>.yaml (the scenario) and
    `out`/<name>-plan.yaml (the plan the engine would run); returns their paths. Paths in the
    configuration (checkpoints, the reward function) are taken, as the engine takes them,
    relative to the folder it is launched from: this one."""
    module = engine_module(engine)
    name = name or Path(path).stem
    settings_engine, settings, given = module.read_config(path, overrides)
    if gpus_per_node and engine in NODE_SIZE_KEYS:
        raise ConfigError(f"{engine}'s configuration gives the node size ({NODE_SIZE_KEYS[engine]})", "--gpus-per-node")
    node_size = {"gpus_per_node": gpus_per_node} if gpus_per_node else {}
    scenario, plan = module.to_plan(settings_engine, settings, given, name, device, source=str(path), **node_size)
    # (a critic's path may default to the reward model's: the reward model's flag is named first)
    for role, entry in sorted(scenario["models"].items(), key=lambda item: item[0] == "critic"):
        if isinstance(entry.get("path"), str):
            given_path = entry["path"]
            entry["path"] = os.path.abspath(os.path.expanduser(given_path))
            if not Path(entry["path"]).is_dir():  # a hub name, say: realbench downloads nothing
                raise ConfigError(f"{given_path!r} is not a checkpoint folder here: realbench reads the {role}'s "
                                  "config.json and tensors from a local folder (override the path with one)",
                                  module.MODEL_PATHS[role], str(path))
        if isinstance(entry.get("adapter"), str):  # (verl's lora_adapter_path)
            given_path = entry["adapter"]
            entry["adapter"] = os.path.abspath(os.path.expanduser(given_path))
            if not Path(entry["adapter"]).is_dir():
                raise ConfigError(f"{given_path!r} is not an adapter folder here: realbench reads the {role}'s "
                                  "adapter_config.json and tensors from a local folder", module.ADAPTER_PATH, str(path))
        if isinstance(entry.get("function"), str):
            file, _, function = entry["function"].rpartition(":")
            entry["function"] = f"{os.path.abspath(os.path.expanduser(file))}:{function}"
    # both checked as realbench reads them before either is written (a source names what is wrong)
    try:
        resolve_plan(plan_from_document(plan), scenario_from_document(scenario))
    except ConfigError as e:
        raise ConfigError(f"the plan {engine} would run is not one realbench can price: {e.message}", e.field,
                          str(path)) from None
    folder = Path(out)
    targets = (folder / f"{name}.yaml", folder / f"{name}-plan.yaml")
    refuse_existing(targets, overwrite)
    folder.mkdir(parents=True, exist_ok=True)
    return write_document(scenario, targets[0], overwrite), write_document(plan, targets[1], overwrite)


def export_config(engine: str, scenario: Scenario, options: dict[str, Option], out: str,
                  model_paths: dict[str, str], overwrite: bool = False) -> list[Path]:
    """Write a plan as the engine's configuration and launch script (verl and AReaL: `out` and
    <out stem>-launch.sh beside it; OpenRLHF: the launch script `out`, its command line).
    `model_paths`: checkpoint folders by role, over the scenario's own."""
    module = engine_module(engine)
    paths = {role: m.path for role, m in scenario.models.items() if getattr(m, "path", None)}
    paths.update({role: os.path.abspath(os.path.expanduser(p)) for role, p in model_paths.items()})
    settings_engine, settings = module.to_config(scenario, options, paths)
    files = module.config_files(Path(out), settings_engine, settings)
    refuse_existing([f[0] for f in files], overwrite)
    return [write_text(text, path, overwrite, mode=mode) for path, text, mode in files]


def priced_as(scenario: Scenario, engine: str) -> Scenario:
    """The scenario as `engine` runs it: the cost model prices what the engine does differently
    (OpenRLHF's and AReaL's weight broadcast to their servers) where the scenario names the engine,
    and the old log-probabilities as the engine takes them (`old_logprobs`)."""
    scenario = scenario if scenario.engine == engine else scenario.model_copy(update={"engine": engine})
    mode = old_logprobs(scenario, engine)
    return scenario if mode == scenario.training.old_logprobs else scenario.with_old_logprobs(mode)


def old_logprobs(scenario: Scenario, engine: str) -> str:
    """How `engine` takes the old log-probabilities of the scenario's policy: the scenario's
    `training.old_logprobs` where the engine has that mode (the module's OLD_LOGPROBS); realbench's
    later_steps as the engines' forward over the whole batch, the same numbers (the first step's
    recomputed rather than its own); generation's (rollout) refused by name where the engine always
    recomputes them."""
    module, mode = engine_module(engine), scenario.training.old_logprobs
    if mode in module.OLD_LOGPROBS:
        return mode
    if mode == "later_steps":
        return "whole_batch"
    raise ConfigError(f"{mode}: {engine} takes the old log-probabilities {module.OLD_LOGPROBS_HOW}",
                      "training.old_logprobs")
