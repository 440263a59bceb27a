"""The engines that run RLHF at scale, as realbench plans them: one package per engine (verl,
openrlhf, areal), each with the same parts (its version's settings, the pricing rules, a reader of
its configuration into a scenario and a plan, a writer of a plan as its configuration, its space of
plans, a check run by its own code) and one `Engine` (realbench.engines.interface) that the
commands, the search and the benchmarks use, whichever engine it is: ENGINES, engine_module.
Adding an engine is adding a package and naming it here. The strategies they train with (FSDP,
ZeRO, Megatron's distributed optimizer) are priced in realbench.cost. Each package names the
source file of the engine's every rule; each engine's own code checks what realbench writes
(`make engines`, the tests)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from realbench.engines import areal, openrlhf, verl
from realbench.cost.calls import serving_cache_problem
from realbench.dataflow import CallKind
from realbench.engines.documents import packs
from realbench.engines.interface import Engine
from realbench.errors import ConfigError
from realbench.plan.mesh import Option
from realbench.plan.plan import plan_from_document, resolve_plan
from realbench.plan.scenario import Scenario, scenario_from_document
from realbench.schema import refuse_existing, write_document, write_text

ENGINES: dict[str, Engine] = {engine.name: engine for engine in (verl.ENGINE, openrlhf.ENGINE, areal.ENGINE)}


def engine_module(name: str) -> Engine:
    """The engine named (its `Engine`), or a ConfigError naming the known ones."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})") from None


def unread_settings(engine: str, path: str, overrides: list[str]) -> list[str]:
    """The settings a configuration gives that its engine itself does not read, each said with
    what the engine reads instead (verl's `IGNORED_BY_VERL`): realbench prices what the engine
    runs, and says so where the user set something else."""
    spec = engine_module(engine)
    if spec.unread is None:
        return []
    settings_engine, settings, given = spec.read_config(path, overrides)
    return spec.unread(settings_engine, settings, given)


def job_models(engine: str, path: str, overrides: list[str]) -> list:
    """The specs of the models an engine's configuration names where realbench reads them (its
    model paths' settings; documents.model_of_path), before anything is imported."""
    from realbench.engines.documents import model_of_path

    spec = engine_module(engine)
    _, settings, _ = spec.read_config(path, overrides)
    paths = (settings.get(key.lstrip("-"), settings.get(key)) for key in dict.fromkeys(spec.model_paths.values()))
    return [m for m in map(model_of_path, paths) if m is not None]


def _give_image_tokens(models: dict, image_tokens: Optional[int], model_paths: dict, source: str) -> None:
    """Each vision-language model's entry takes the image tokens a prompt holds (--image-tokens),
    which an engine's configuration does not say (its data does): refused without them, and
    refused for a job without a vision-language model."""
    from realbench.engines.documents import model_of_path

    vlms = [role for role, entry in models.items() if getattr(model_of_path(entry.get("path")), "vision", None)]
    if vlms and image_tokens is None:
        raise ConfigError(f"{models[vlms[0]]['path']!r} is a vision-language model: give the image tokens a prompt "
                          "holds (--image-tokens N, the data's: its configuration does not say them)",
                          model_paths.get(vlms[0], vlms[0]), source)
    if image_tokens is not None and not vlms:
        raise ConfigError(f"{image_tokens}: no model of this job is a vision-language model", "--image-tokens")
    for role in vlms:
        models[role]["image_tokens"] = image_tokens


def import_config(engine: str, path: str, overrides: list[str], out: str, device: str = "h100",
                  name: Optional[str] = None, overwrite: bool = False, gpus_per_node: Optional[int] = None,
                  image_tokens: Optional[int] = None) -> tuple[Path, Path]:
    """Read an engine's configuration (and overrides) into `out`/<name>.yaml (the scenario) and
    `out`/<name>-plan.yaml (the plan the engine would run); returns their paths. Paths in the
    configuration (checkpoints, the reward function) are taken, as the engine takes them,
    relative to the folder it is launched from: this one. `image_tokens`: the image tokens a
    prompt holds, for a vision-language model (the data's, which no configuration says)."""
    spec = engine_module(engine)
    name = name or Path(path).stem
    settings_engine, settings, given = spec.read_config(path, overrides)
    # (verl's synchronous config gives the node size; its one-step-off entry's two pools may share a
    # node: its reader says which it takes; OpenRLHF's command line gives none)
    if gpus_per_node and spec.node_size_key:
        raise ConfigError(f"{engine}'s configuration gives the node size ({spec.node_size_key})", "--gpus-per-node")
    node_size = {"gpus_per_node": gpus_per_node} if gpus_per_node else {}
    scenario, plan = spec.to_plan(settings_engine, settings, given, name, device, source=str(path), **node_size)
    carried = carried_settings(engine, settings, given)
    # (AReaL: a role's section of a role the job does not run, the reference without a KL term, is
    # not written, nor carried)
    absent = {section for section, call in spec.role_sections.items() if call not in plan["calls"]}
    carried = {k: v for k, v in carried.items() if k.split(".", 1)[0] not in absent}
    if carried:
        scenario["engine_settings"] = carried
    # (a critic's path may default to the reward model's: the reward model's flag is named first)
    for role, entry in sorted(scenario["models"].items(), key=lambda item: item[0] == "critic"):
        if isinstance(entry.get("path"), str):
            given_path = entry["path"]
            local = os.path.abspath(os.path.expanduser(given_path))
            if Path(local).exists():
                entry["path"] = local
            else:  # a hub id: planned from the local cache's or the catalogue's config.json
                from realbench.models.hf import find_config

                try:
                    find_config(given_path)
                except ConfigError as e:
                    raise ConfigError(f"{given_path!r}: {e.message}", spec.model_paths[role], str(path)) from None
        if isinstance(entry.get("adapter"), str):  # (verl's lora_adapter_path)
            given_path = entry["adapter"]
            entry["adapter"] = os.path.abspath(os.path.expanduser(given_path))
            if not Path(entry["adapter"]).is_dir():
                raise ConfigError(f"{given_path!r} is not an adapter folder here: realbench reads the {role}'s "
                                  "adapter_config.json and tensors from a local folder", spec.adapter_path, str(path))
        if isinstance(entry.get("function"), str):
            file, _, function = entry["function"].rpartition(":")
            entry["function"] = f"{os.path.abspath(os.path.expanduser(file))}:{function}"
    _give_image_tokens(scenario["models"], image_tokens, spec.model_paths, str(path))
    # both checked as realbench reads them before either is written (a source names what is wrong)
    try:
        read = scenario_from_document(scenario)
        options = resolve_plan(plan_from_document(plan), read)
    except ConfigError as e:
        raise ConfigError(f"the plan {engine} would run is not one realbench can price: {e.message}", e.field,
                          str(path)) from None
    _refuse_unstartable_rollout(spec, read, options["actor_gen"], str(path))
    problem = spec.read_problem(read, options) if spec.read_problem is not None else None
    if problem is not None:
        raise ConfigError(problem[1], problem[0], str(path))
    folder = Path(out)
    targets = (folder / f"{name}.yaml", folder / f"{name}-plan.yaml")
    refuse_existing(targets, overwrite)
    folder.mkdir(parents=True, exist_ok=True)
    return write_document(scenario, targets[0], overwrite), write_document(plan, targets[1], overwrite)


def _refuse_unstartable_rollout(spec: Engine, scenario: Scenario, generation: Option, source: str) -> None:
    """Refuse, naming the engine's own key, a rollout server whose share of each GPU leaves its KV
    cache no whole sequence, or no request of its max_model_len: the server would not start
    (cost.calls.serving_cache_problem). The key named is the context where a sequence fits, else
    the memory share."""
    call = scenario.dataflow.call("actor_gen")
    model, server = scenario.model_of(call), scenario.rollout_server or "sglang"
    problem = serving_cache_problem(call, model, scenario.cluster, generation.strategy)
    if problem is None:
        return
    fits_a_sequence = call.max_model_len is not None and serving_cache_problem(
        call.model_copy(update={"max_model_len": None}), model, scenario.cluster, generation.strategy) is None
    if fits_a_sequence:
        contexts = spec.server_context  # (AReaL's: by the rollout's backend)
        key, value = contexts[server] if contexts else spec.max_model_len, call.max_model_len
    else:
        servers = spec.server_memory
        key = servers[server] if servers else spec.memory_key
        value = call.memory_fraction
    raise ConfigError(f"{value:g}: {problem}", key, source)


def _given_checkpoint(where: str) -> str:
    """A checkpoint as the engines take it: a folder here, made absolute (the engine's job may run
    elsewhere), or a hub id kept as given (`Qwen/Qwen3-8B`: the engine's loader fetches it)."""
    from realbench.models.hf import looks_like_hub_id

    local = os.path.abspath(os.path.expanduser(where))
    return where.strip() if looks_like_hub_id(where) and not os.path.exists(local) else local


def export_config(engine: str, scenario: Scenario, options: dict[str, Option], out: str,
                  model_paths: dict[str, str], overwrite: bool = False) -> list[Path]:
    """Write a plan as the engine's configuration and launch script (verl and AReaL: `out` and
    <out stem>-launch.sh beside it; OpenRLHF: the launch script `out`, its command line).
    `model_paths`: checkpoint folders by role, over the scenario's own."""
    spec = engine_module(engine)
    if scenario.engine_settings and scenario.engine != engine:
        raise ConfigError(f"they are {scenario.engine}'s settings, which {engine} does not read: remove "
                          f"engine_settings from the scenario to write {engine}'s configuration without them",
                          "engine_settings")
    refuse_uncarried(scenario)
    paths = {role: m.path for role, m in scenario.models.items() if getattr(m, "path", None)}
    paths.update({role: _given_checkpoint(p) for role, p in model_paths.items()})
    settings_engine, settings = spec.to_config(scenario, options, paths)
    settings = with_carried(scenario, engine, settings_engine, settings)
    # (the node size the plan was made for: verl's one-step-off launcher names it, for reading it back)
    files = spec.config_files(Path(out), settings_engine, settings, node_size=scenario.cluster.gpus_per_node)
    refuse_existing([f[0] for f in files], overwrite)
    return [write_text(text, path, overwrite, mode=mode) for path, text, mode in files]


def priced_as(scenario: Scenario, engine: str) -> Scenario:
    """The scenario as `engine` runs it: the cost model prices what the engine does differently
    (OpenRLHF's and AReaL's weight broadcast to their servers) where the scenario names the engine,
    the log-probabilities as realbench prices them by default where it names another (`logits`),
    the old log-probabilities as the engine takes them (`old_logprobs`), rows packed as it
    packs them (`padding_free`), and its rollout's serving engine taking the scenario's share of
    each GPU's memory, or the engine's default share (its memory_fraction)."""
    fraction = {c.memory_fraction for c in scenario.dataflow.calls if c.kind == CallKind.GENERATE}
    if None in fraction:
        scenario = scenario.with_memory_fraction(engine_module(engine).memory_fraction)
    packed = padding_free(scenario, engine)
    # (models kept padded apart from the others: the engine's own setting, verl's; another engine has one)
    padded_apart = bool(scenario.training.padded_models) and scenario.engine != engine
    # (how an engine computes the log-probabilities is its own: verl's fused kernels are not another's)
    scenario = scenario if scenario.engine == engine else scenario.without_logits().model_copy(update={"engine": engine})
    mode = old_logprobs(scenario, engine)
    scenario = scenario if mode == scenario.training.old_logprobs else scenario.with_old_logprobs(mode)
    if packed == scenario.training.padding_free and not padded_apart:
        return scenario
    return scenario.with_padding_free(packed)


def example_of(scenario: Scenario, engine: str) -> dict[str, Any]:
    """The engine's example configuration for the scenario's job: {source, settings (its
    `default_plan`'s), memory_fraction}: its `example_of` (verl's and AReaL's examples for a
    mixture of experts)."""
    return engine_module(engine).example_of(scenario)


def as_example(scenario: Scenario, engine: str) -> Scenario:
    """The scenario as the engine's example configuration runs it (example_of, whose plan is the
    engine's `default_plan` with the example's settings): priced_as, its rollout server taking the
    example's share of each GPU's memory."""
    return priced_as(scenario.with_memory_fraction(example_of(scenario, engine)["memory_fraction"]), engine)


def padding_free(scenario: Scenario, engine: str) -> bool:
    """documents.packs with the engine's default (its padding_free)."""
    spec = engine_module(engine)
    return packs(scenario, engine, spec.padding_free, spec.padding_settable)


def old_logprobs(scenario: Scenario, engine: str) -> str:
    """How `engine` takes the old log-probabilities of the scenario's policy: the scenario's
    `training.old_logprobs` where the engine has that mode (its old_logprobs); realbench's
    later_steps as the engines' forward over the whole batch, the same numbers (the first step's
    recomputed rather than its own); generation's (rollout) refused by name where the engine always
    recomputes them."""
    spec, mode = engine_module(engine), scenario.training.old_logprobs
    if mode in spec.old_logprobs:
        return mode
    if mode == "later_steps":
        return "whole_batch"
    raise ConfigError(f"{mode}: {engine} takes the old log-probabilities {spec.old_logprobs_how}",
                      "training.old_logprobs")


# -- the user's own settings, carried from an imported configuration to the exported one -----------------
def carried_problem(engine: str, key: str) -> Optional[str]:
    """Why `key` cannot be carried in a scenario's `engine_settings` for `engine`, or None: only
    what the engine knows leaves a step's time and memory alone (its neutral: names,
    paths, logging, the learning and sampling settings) and what realbench does not itself read
    into the scenario (its captured: checkpoint folders, the reward function), which the writer
    writes from the scenario."""
    spec = engine_module(engine)
    if key in spec.carried_values:  # (a read setting carried at some values: the writer checks them)
        return None
    if key in spec.read or not key.startswith(spec.neutral):
        return (f"{engine} runs differently with it: realbench reads such settings into the scenario and plan and "
                "writes them from there (only settings that change neither time nor memory are carried)")
    if key.startswith(spec.captured):
        return "realbench reads it into the scenario's models and writes it from there"
    return None


def refuse_uncarried(scenario: Scenario) -> None:
    """Refuse by name a key of the scenario's `engine_settings` that realbench does not carry
    (carried_problem): one that would change the run, or one read into the scenario."""
    for key in scenario.engine_settings:
        problem = carried_problem(scenario.engine, key)
        if problem:
            raise ConfigError(problem, f"engine_settings.{key}")


def carried_settings(engine: str, settings: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """The settings of an engine's configuration that the user set and that realbench carries
    unpriced to the configurations it writes (carried_problem): the learning rate, the data files,
    the logger, where checkpoints are saved. Flat dotted keys (OpenRLHF: the flags' dests), as the
    engine resolves them; a section given whole (AReaL's `critic.optimizer: ${actor.optimizer}`)
    is carried key by key."""
    out: dict[str, Any] = {}
    carried_values = engine_module(engine).carried_values
    for key in sorted(given):
        if carried_problem(engine, key) is not None:
            continue
        if key in carried_values and settings.get(key) not in carried_values[key]:
            continue
        keys = [key] if key in settings else sorted(k for k in settings if k.startswith(key + "."))
        for k in keys:
            value = settings[k]
            out[k] = list(value) if isinstance(value, tuple) else value
    return out


def with_carried(scenario: Scenario, engine: str, settings_engine: str, settings: dict) -> dict:
    """The settings a writer made of a plan (flat, or AReaL's nested document) with the scenario's
    `engine_settings` over them: the user's names, paths and learning settings replace the
    writer's placeholders. Refused by name: a setting the written configuration does not have
    (verl's FSDP keys in a Megatron plan, a critic's where the plan has none) and one the plan
    needs otherwise (its REQUIRED); another engine's settings are refused by export_config."""
    carried = scenario.engine_settings
    if not carried:
        return settings
    spec = engine_module(engine)
    nested = spec.flatten is not None
    flat = spec.flatten(settings) if nested else settings
    known = spec.known_keys(settings_engine)
    known |= {key.rsplit(".", i)[0] for key in list(known) for i in range(1, key.count(".") + 1)}  # (sections)
    out = settings if nested else dict(settings)
    for key, value in carried.items():
        field = f"engine_settings.{key}"
        if key not in known and not key.startswith(spec.open_sections):
            raise ConfigError(f"not a setting of the configuration realbench writes for this plan "
                              f"({spec.name} {settings_engine})", field)
        if key in spec.required and flat.get(key, value) != value:
            raise ConfigError(f"{value!r}: the plan needs {flat[key]!r} ({spec.required[key]})", field)
        if nested:
            section = key.split(".", 1)[0]
            if section in spec.role_sections and section not in settings:
                raise ConfigError(f"the plan has no {section} (the scenario's models)", field)
            node = out
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):  # (the reference's optimizer: None)
                    raise ConfigError(f"the plan writes {part} as {node!r}, not a section", field)
            node[leaf] = value
        else:
            out[key] = value
    return out
