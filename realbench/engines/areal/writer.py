"""A plan in AReaL's space written as its experiment YAML: `_settings` (flat keys, or a ConfigError
naming the first part of the plan AReaL cannot run), `to_config` (the nested document, with the
names, paths and scheduling AReaL's launcher needs) and its launch script (`config_files`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import yaml

from realbench.engines.areal.packer import StepRows
from realbench.engines.areal.pricing import MEMORY_FRACTION, _micro_batches, space_problem_of_scenario
from realbench.engines.areal.settings import (ENTRY, LORA_KEYS, PROX_INTERPOLATED, PROX_LOGP, SERVER_CONTEXT,
                                              SERVER_MEMORY, SERVER_MODEL, SERVER_SLOTS, VERSION, allocation_string,
                                              defaults)
from realbench.engines.batches import ceil_at_least_one
from realbench.engines.documents import refuse_offload, whole_alpha
from realbench.engines.dotted import nest
from realbench.engines.placement import disjoint
from realbench.errors import ConfigError
from realbench.plan.mesh import Option, Strategy
from realbench.plan.options import served_call
from realbench.plan.scenario import Scenario


def _server(scenario: Scenario) -> str:
    """The scenario's rollout server as AReaL writes it: as read, else SGLang (AReaL's examples')."""
    return scenario.rollout_server or "sglang"


def _backend(name: str, s: Strategy, trained: bool) -> str:
    """FSDP (every shard: zero 3, or one replica) or Megatron (a pipeline, or the optimizer states
    sharded at most: zero 0 or 1) for a call's strategy."""
    if s.ring != "p2p" and s.pp == 1 and s.ep == 1 and not s.etp and (s.zero == 3 or s.shards == 1):
        return "fsdp"
    if s.zero in (0, 1) and (trained or s.zero == 0):
        return "megatron"
    raise ConfigError(f"zero {s.zero}: AReaL's FSDP shards everything (zero 3) and Megatron's distributed optimizer the "
                      "optimizer states (zero 1); its forward-only Megatron models shard nothing", f"calls.{name}.zero")


def _same_budget(name: str, s: Strategy, budget: int) -> None:
    """A plan's token budget for a call (a GPU's) is the one realbench writes for its count (a
    data-parallel rank's: a Ulysses group's, sp GPUs, to_plan), or unset."""
    if s.max_tokens not in (None, ceil_at_least_one(budget, s.sp)):
        group = f", {ceil_at_least_one(budget, s.sp)} a GPU of a group of {s.sp} splitting sequences" if s.sp > 1 else ""
        raise ConfigError(f"{s.max_tokens}: AReaL runs the plan's {s.micro_batches} micro-batches on every step drawn "
                          f"under the budget realbench writes, the largest group its packer forms ({budget} tokens"
                          f"{group}; realbench.engines.areal.packer)", f"calls.{name}.max_tokens")


def _engine_settings(role: str, name: str, s: Strategy, trained: bool, rows: int, step: StepRows,
                     experts: bool = False) -> dict[str, Any]:
    """An engine's settings for a call of `rows` samples a GPU (an optimizer step's, or the whole
    batch's) as AReaL's packer sees them (`step`): its allocation and its micro-batches,
    the plan's count (n_mbs) within a budget under which AReaL's packer forms that many on every
    step drawn (packer.budget_for), at least a whole row (AReaL's packer refuses a longer
    sequence, utils/seqpack.py:234-242)."""
    backend = _backend(name, s, trained)
    if s.shard_group:
        raise ConfigError(f"{s.shard_group}: AReaL's FSDP shards a model over its allocation's data-parallel GPUs "
                          "(an allocation names no hybrid shard group)", f"calls.{name}.shard_group")
    if s.ring == "allgather" or (s.sp > 1 and (s.ring == "p2p") != (backend == "megatron")):
        raise ConfigError("AReaL's context parallelism (an allocation's c) is Ulysses' head exchanges under FSDP and "
                          "Megatron's p2p ring under Megatron (ring: p2p), not ring attention's all-gathers (OpenRLHF's)",
                          f"calls.{name}.ring")
    if s.sp > 1 and backend == "fsdp" and s.tp > 1:
        raise ConfigError(f"{s.sp}: AReaL splits sequences (an allocation's c) under FSDP without tensor parallelism "
                          "as realbench prices it", f"calls.{name}.sp")
    if backend == "megatron" and s.pp > 1 and (s.micro_batches < 2 * s.pp or s.micro_batches % s.pp):
        raise ConfigError(f"{s.micro_batches}: AReaL's Megatron pipeline runs at least 2 x pp micro-batches, a multiple "
                          "of pp (megatron_engine.py:2054-2070)", f"calls.{name}.micro_batches")
    if s.virtual_stages > 1 and backend != "megatron":
        raise ConfigError("virtual stages are Megatron's (megatron.virtual_pipeline_parallel_size)",
                          f"calls.{name}.virtual_stages")
    if backend == "fsdp" and experts and s.tp > 1:  # (_experts)
        raise ConfigError("AReaL's FSDP splits only the attention of a mixture of experts by tensor parallelism, each "
                          "expert whole on every tp rank (apply_non_moe_tp, engine/fsdp_utils/parallel.py:219-300), "
                          "which realbench does not price under FSDP's sharding: tp 1, or Megatron", f"calls.{name}.tp")
    budget = step.budget(rows, s.dp, s.micro_batches)
    _same_budget(name, s, budget)
    out = {f"{role}.backend": allocation_string(backend, s.dp, s.tp, s.pp, s.sp, s.ep, s.etp, experts),
           f"{role}.mb_spec.n_mbs": s.micro_batches,
           f"{role}.mb_spec.max_tokens_per_mb": budget, f"{role}.gradient_checkpointing": s.checkpointing}
    if backend == "megatron":
        out[f"{role}.megatron.virtual_pipeline_parallel_size"] = s.virtual_stages
        if trained:
            out[f"{role}.megatron.ddp.use_distributed_optimizer"] = s.zero == 1 or s.shards == 1
    return out


def _settings(scenario: Scenario, options: dict[str, Option]) -> dict[str, Any]:
    """AReaL's settings (flat key -> value) for a plan, or ConfigError naming the first part of
    it AReaL cannot run."""
    problem = space_problem_of_scenario(scenario)
    if problem:
        raise ConfigError(problem[1], problem[0])
    c, df = scenario.cluster, scenario.dataflow
    G = c.gpus_per_node
    A, V = options["actor_train"].mesh, options["actor_gen"].mesh
    gen, server = options["actor_gen"].strategy, _server(scenario)
    if not disjoint([A, V], G):
        raise ConfigError("AReaL's rollout runs on GPUs of its own (colocated with the actor it needs disk weight "
                          "updates and offloading, which realbench does not price)", "calls.actor_gen.mesh")
    if gen.tp * gen.pp > G:
        raise ConfigError(f"a server of {gen.tp * gen.pp} GPUs spans nodes of {G}; AReaL's single controller starts "
                          "each on one node (cli_args.py:1949)", "calls.actor_gen.tp")
    if gen.ep > 1 or gen.etp:
        raise ConfigError("AReaL's servers split a mixture of experts' experts as tp splits them: an inference "
                          "allocation has no e (api/alloc_mode.py:594-638), and realbench does not write "
                          "sglang.ep_size",
                          "calls.actor_gen.ep")
    refuse_offload(options, "AReaL", "ref.fsdp.offload_params")
    reward = options["reward_inf"]
    if reward.mesh != V or reward.strategy != Strategy(V.size, 1, 1):
        raise ConfigError("AReaL scores in its rollout workers, on the rollout's GPUs' hosts", "calls.reward_inf.mesh")
    for name, o in options.items():
        if name not in ("actor_gen", "reward_inf") and o.mesh != A:
            raise ConfigError("AReaL's reference and critic are colocated with the actor (realbench prices its trainer's "
                              "calls, which run one after another, on the actor's GPUs)", f"calls.{name}.mesh")
        if name not in ("actor_gen", "reward_inf") and o.strategy.size != A.size:
            raise ConfigError(f"a role colocated with the actor has its world size ({A.size}; "
                              "infra/scheduler/local.py:680-699)", f"calls.{name}.dp")
    g = df.call("actor_gen")
    rows, n = g.seqs, g.group_size
    prompts = rows // n
    steps = df.call("actor_train").optimizer_steps
    out: dict[str, Any] = {"cluster.n_nodes": c.nodes, "cluster.n_gpus_per_node": G,
                           "train_dataset.batch_size": prompts, "train_dataset.max_length": g.prompt_len,
                           "gconfig.n_samples": n, "gconfig.max_new_tokens": g.gen_len,
                           "gconfig.max_tokens": g.prompt_len + g.gen_len, "actor.ppo_n_minibatches": steps,
                           "rollout.max_head_offpolicyness": df.max_staleness,
                           "rollout.backend": allocation_string(server, gen.dp, gen.tp, gen.pp),
                           # (the least AReaL runs the plan with: a sequence, where its default, 32768, could
                           # outrun the checkpoint's positions, or ask more of vLLM's cache than was priced)
                           SERVER_CONTEXT[server]: g.max_model_len or g.seq_len}
    step = StepRows(g.prompt_len, g.gen_len, df.call("actor_train").lengths)
    for name, role, trained in (("actor_train", "actor", True), ("ref_inf", "ref", False),
                                ("critic_train", "critic", True)):
        if name in options:
            s = options[name].strategy
            if prompts % s.dp:
                raise ConfigError(f"{prompts} prompt groups do not split evenly over {s.dp} data-parallel ranks "
                                  "(utils/seqpack.py:558-562)", f"calls.{name}.dp")
            out.update(_engine_settings(role, name, s, trained, (rows // steps if trained else rows) // s.dp, step,
                                        scenario.model_of(df.call(name)).moe is not None))
    if "critic_train" in options:
        out["critic.ppo_n_minibatches"] = steps
    if "critic_inf" in options:  # the critic's values: its training engine, micro-batches of its budget
        t, i = options["critic_train"].strategy, options["critic_inf"].strategy
        budget = out["critic.mb_spec.max_tokens_per_mb"]
        _same_budget("critic_inf", i, budget)
        want = Strategy(t.dp, t.tp, t.pp, _micro_batches(step, rows // t.dp, t.dp, out["critic.mb_spec.n_mbs"],
                                                         budget, t.pp),
                        False, t.virtual_stages,
                        3 if _backend("critic_train", t, True) == "fsdp" and t.shards > 1 else 0,
                        max_tokens=i.max_tokens, sp=t.sp, ring=t.ring, ep=t.ep, etp=t.etp)
        if i != want:  # (a forward checkpoints nothing: want's False is every forward's)
            raise ConfigError("AReaL's critic computes values with its training engine and micro-batch budget "
                              f"(critic.backend, critic.mb_spec): {want.label()}", "calls.critic_inf")
    if rows % gen.dp or (rows // gen.dp) % gen.micro_batches:
        raise ConfigError(f"{gen.micro_batches} batches do not split a server's share of {rows} samples evenly",
                          "calls.actor_gen.micro_batches")
    out[SERVER_SLOTS[server]] = rows // gen.dp // gen.micro_batches
    out[SERVER_MEMORY[server]] = served_call(g, gen).memory_fraction or MEMORY_FRACTION
    out["rollout.max_concurrent_rollouts"] = prompts
    if "ref_inf" in options:
        beta = scenario.training.beta_for(scenario.algorithm)
        out["actor.kl_ctl"] = beta if beta > 0 else defaults()["actor.kl_ctl"]  # (0 would build no reference)
    else:
        out["actor.kl_ctl"] = 0.0
    if scenario.algorithm != "ppo":
        out.update({"actor.reward_norm.mean_level": "group", "actor.reward_norm.group_size": n,
                    "actor.reward_norm.std_level": "group" if scenario.algorithm == "grpo" else None,
                    "actor.reward_norm.mean_leave1out": scenario.algorithm == "rloo"})
    lora = scenario.models["actor"].lora
    if lora is not None:  # the trainer's adapters, and the servers that load them
        out.update({"actor.use_lora": True, LORA_KEYS["r"]: lora.r, LORA_KEYS["lora_alpha"]: whole_alpha(lora, "AReaL"),
                    LORA_KEYS["target_modules"]: list(lora.target_modules), "rollout.use_lora": True,
                    f"{server}.enable_lora": True, f"{server}.max_lora_rank": lora.r})
        if out["actor.backend"].startswith("megatron"):  # its LoRA runs on Megatron Bridge (engine/megatron_engine.py:327-331)
            out["actor.megatron.bridge_type"] = "megatron-bridge"
    # the proximal log-probabilities of the decoupled objective of asynchronous RL, recomputed as
    # AReaL's examples do; or the rollout's, for which AReaL's plain objective is realbench's
    # decoupled one (proximal = behaviour: weight 1), or, carried, AReaL's interpolated proximal ones
    recompute = scenario.training.old_logprobs != "rollout"  # (later_steps: the same numbers)
    interpolated = scenario.engine_settings.get(PROX_LOGP) == PROX_INTERPOLATED and not recompute
    out.update({"actor.use_decoupled_loss": bool(df.max_staleness) and (recompute or interpolated),
                "actor.recompute_logprob": recompute})
    return out


_SCHEDULING_SPEC = [{"task_type": "worker", "port_count": 2, "gpu": 1, "mem": 32,
                     "cmd": "python3 -m areal.infra.rpc.rpc_server", "env_vars": {}}]
_NAMES = {"experiment_name": "${experiment_name}", "trial_name": "${trial_name}"}


def to_config(scenario: Scenario, options: dict[str, Option], model_paths: dict[str, str]) -> tuple[str, dict]:
    """(the actor's backend, AReaL's experiment as a nested document)."""
    flat = _settings(scenario, options)
    for role in ("actor", "critic"):
        if role in scenario.models and role not in model_paths:
            raise ConfigError(f"AReaL loads a checkpoint folder: give the {role}'s (--model-path {role}=DIR)",
                              f"models.{role}")
    doc = nest(flat)
    logged = {**_NAMES, "fileroot": "${cluster.fileroot}"}
    doc.update({"experiment_name": scenario.name, "trial_name": "trial0", "tokenizer_path": "${actor.path}",
                "enable_offload": False, "scheduler": {"type": None},
                "saver": dict(logged), "recover": dict(logged), "evaluator": dict(logged),
                "stats_logger": dict(logged)})
    # the data set is the user's: AReaL's mandatory value (???) until the launch gives it
    doc["train_dataset"].update({"path": "???", "type": "rl"})
    doc["rollout"].update({**_NAMES, "consumer_batch_size": "${train_dataset.batch_size}",
                           "scheduling_spec": "${actor.scheduling_spec}", "fileroot": "${cluster.fileroot}",
                           "tokenizer_path": "${tokenizer_path}"})
    section, model = SERVER_MODEL[_server(scenario)].split(".")
    doc.setdefault(section, {}).update({model: "${actor.path}", "dtype": "${actor.dtype}"})
    doc["actor"].update({**_NAMES, "path": model_paths["actor"], "dtype": "bfloat16",
                         "scheduling_spec": _SCHEDULING_SPEC, "weight_update_mode": "xccl"})
    doc["actor"].setdefault("optimizer", {"type": "adam", "lr": 1.0e-6})
    colocated = {"scheduling_strategy": {"type": "colocation", "target": "actor"},
                 "scheduling_spec": "${actor.scheduling_spec}", **_NAMES}
    if "ref" in doc:
        doc["ref"].update({**colocated, "path": model_paths.get("ref", model_paths["actor"]), "optimizer": None,
                           "dtype": "${actor.dtype}"})
    if "critic" in doc:
        doc["critic"].update({**colocated, "path": model_paths["critic"], "dtype": "${actor.dtype}",
                              "optimizer": {"type": "adam", "lr": 1.0e-6}})
    return doc["actor"]["backend"].split(":")[0], doc


def launch_script(config: Path, nodes: int) -> str:
    scheduler = "local" if nodes == 1 else "ray"
    return ("#!/usr/bin/env bash\n"
            f"# AReaL {VERSION}: the plan realbench wrote (pip install areal=={VERSION}). Run it with your train script\n"
            "# (AREAL_TRAIN_SCRIPT, e.g. AReaL's examples/math/gsm8k_rl.py) and your data set:\n"
            f"#   AREAL_TRAIN_SCRIPT=gsm8k_rl.py bash {config.stem}-launch.sh train_dataset.path=openai/gsm8k\n"
            f'{ENTRY} "$(dirname "$0")/{config.name}" scheduler.type="${{AREAL_SCHEDULER:-{scheduler}}}" "$@"\n')


def config_files(config: Path, engine: str, settings: dict[str, Any],
                 node_size: Optional[int] = None) -> list[tuple[Path, str, int]]:
    """The experiment YAML (at `config`) and its launch script beside it (<stem>-launch.sh). (Its
    cluster section gives the node size: `node_size` is not written twice.)"""
    text = (f"# AReaL {VERSION} experiment: the plan realbench wrote (realbench export --format areal)\n"
            + yaml.safe_dump(settings, sort_keys=False))
    return [(config, text, 0o644),
            (config.with_name(f"{config.stem}-launch.sh"), launch_script(config, settings["cluster"]["n_nodes"]), 0o755)]
