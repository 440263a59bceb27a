"""An AReaL experiment YAML read into a scenario and a plan: `read_config` checks every key
against AReaL's PPOConfig and takes Hydra-style overrides (`key=value`, `+key=value`),
interpolations resolved by OmegaConf as AReaL's loader resolves them; `to_plan` makes the scenario
and plan documents of the settings read (the trainer's and the rollout's allocations placed on the
cluster's nodes: realbench.engines.placement).
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any, Optional

from realbench.dataflow import CallKind
from realbench.dataflow.lengths import LengthDistribution
from realbench.engines.areal.packer import StepRows
from realbench.engines.areal.pricing import GROUP_OF_ONE, PADDING_FREE, _micro_batches, refuse_unpriced
from realbench.engines.areal.settings import (LORA_KEYS, MODEL_PATHS, PROX_INTERPOLATED, PROX_LOGP, REWARD,
                                              SERVER_CONTEXT, SERVER_MEMORY, SERVER_SLOTS, VERSION, _flatten,
                                              _interpolation, _sections, allocation, defaults, resolve, world)
from realbench.engines.batches import ceil_at_least_one, even_share, rounds
from realbench.engines.documents import (expert_layout_problem, job_documents, model_of_path, served_context,
                                         whole_row_budget)
from realbench.engines.placement import place
from realbench.errors import ConfigError
from realbench.plan.mesh import Strategy
from realbench.schema import load_yaml, read_document


def _unknown(key: str, source: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(defaults()), n=1, cutoff=0.8)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"AReaL {VERSION}'s PPOConfig has no such setting{hint}", key, source)


def read_config(path: str | Path, overrides: list[str] = ()) -> tuple[str, dict[str, Any], set[str]]:
    """(the actor's backend, every setting resolved as AReaL's loader resolves it, the keys given
    and changed from AReaL's default) of an experiment YAML and Hydra-style overrides
    (`key=value`, `+key=value`)."""
    source = str(path)
    doc = read_document(path, schema=False)
    if "defaults" in doc:
        raise ConfigError("realbench reads a whole experiment YAML; a Hydra defaults list is not read", "defaults",
                          source)
    given = _flatten(doc)
    for o in overrides:
        key, eq, raw = o.partition("=")
        key = key.removeprefix("++").removeprefix("+")
        if not eq or not key or key.startswith("~"):
            raise ConfigError("an override is key=value (or +key=value)", o, "overrides")
        value = load_yaml(raw) if raw else None
        given.update(_flatten(value, f"{key}.") if isinstance(value, dict) else {key: value})
    table, sections = defaults(), _sections()
    for key in given:  # (a section is given whole as None or an interpolation: critic.optimizer: ${actor.optimizer})
        if key not in table and not (key in sections and (given[key] is None or _interpolation(given[key]))):
            raise _unknown(key, source)
    return str(given.get("actor.backend", "")).split(":")[0], resolve(given), \
        {k for k, v in given.items() if v != table.get(k)}


# A mixture of experts (an allocation's e, or its attention/FFN form): Megatron's parallel folding,
# mpu.initialize_model_parallel with the allocation's expert_parallel_size and
# expert_tensor_parallel_size (engine/megatron_engine.py:230-242), in realbench terms a train or
# inference call's ep and etp (0: tp's); the flat form's etp is 1 (each expert whole), so a flat
# Megatron allocation with t > 1 holds a mixture of experts' experts whole on every GPU of a tp group.
# AReaL's FSDP has no expert parallelism (api/alloc_mode.py:274-283) and splits only the attention by
# tensor parallelism in a mixture of experts (apply_non_moe_tp, engine/fsdp_utils/parallel.py:
# 219-300): each expert whole on every tp rank, which realbench does not price under FSDP's
# sharding (refused: t1, or Megatron). The servers split a mixture of experts' experts as tp splits
# them (SGLang's and vLLM's default; sglang.ep_size is not read).
def _experts(role: str, a: dict[str, Any], model, call: dict[str, Any], trained: bool, text: Any, source: str
             ) -> dict[str, int]:
    """A role's (ep, etp) as the plan's call carries them (`call`: its dp, tp, pp, zero, sp, ring), from
    its allocation `a` and its `model` (None where not known here); refused by name where the model
    has no experts to lay out, or AReaL runs them otherwise than realbench prices."""
    key, megatron = f"{role}.backend", a["backend"] == "megatron"
    moe = None if model is None else model.moe is not None
    if moe is False and (a["e"] > 1 or a["hybrid"]):
        raise ConfigError(f"{text!r}: the MoE allocation (e, or the attention/FFN form) lays out a mixture of experts' "
                          f"routed experts; the {role}'s model ({model.name}) has none", key, source)
    if moe and not megatron and a["t"] > 1:
        raise ConfigError(f"{text!r}: AReaL's FSDP splits only the attention of a mixture of experts by tensor "
                          "parallelism, each expert whole on every tp rank (apply_non_moe_tp, engine/fsdp_utils/"
                          "parallel.py:219-300), which realbench does not price under FSDP's sharding: t1, or Megatron",
                          key, source)
    if not megatron or moe is False or (moe is None and a["e"] == 1 and not a["hybrid"]):
        return {}
    ep, etp = a["e"], 0 if a["etp"] == a["t"] else a["etp"]
    problem = expert_layout_problem(model, CallKind.TRAIN if trained else CallKind.INFERENCE, Strategy(
        call["dp"], a["t"], a["p"], zero=call.get("zero", 0), sp=call.get("sp", 1), ring=call.get("ring", ""), ep=ep,
        etp=etp))
    if problem:
        raise ConfigError(f"{text!r}: {problem[1]}", key, source)
    return {**({"ep": ep} if ep > 1 else {}), **({"etp": etp} if etp else {})}


def to_plan(engine: str, s: dict[str, Any], given: set[str], name: str, device: str, source: str = "",
            gpus_per_node: Optional[int] = None, lengths: Optional[LengthDistribution] = None,
            models: Optional[dict[str, Any]] = None) -> tuple[dict, dict]:
    """(scenario document, plan document) of AReaL's resolved settings `s` and the keys changed.
    `lengths`: the responses' lengths AReaL's packer sees (default: every response at its cap).
    `models`: the specs of the roles' models where known (else read from the checkpoints named:
    documents.model_of_path), for their experts' layouts (_experts)."""
    refuse_unpriced(s, given, source)
    known = dict(models or {})

    def model(role: str):  # (a model's spec, read once; None where there is none to read here)
        if role not in known:
            known[role] = model_of_path(s.get(MODEL_PATHS[role]))
        return known[role]

    for key in ("actor.backend", "rollout.backend"):
        if s.get(key) in (None, "???"):
            raise ConfigError("is not set: AReaL needs each engine's allocation (api/cli_args.py:1203-1209)", key,
                              source)
    G = int(s["cluster.n_gpus_per_node"])
    actor = allocation(s["actor.backend"], "actor.backend", source, servers=False)
    server = allocation(s["rollout.backend"], "rollout.backend", source, servers=True)
    spec = s["actor.scheduling_spec"]
    if not (isinstance(spec, list) and spec and isinstance(spec[0], dict) and spec[0].get("gpu") == 1):
        raise ConfigError("realbench prices one GPU a worker process: scheduling_spec's first entry gpu: 1 (as AReaL's "
                          "examples; the default 0 asks for none)", "actor.scheduling_spec", source)
    critic = "critic.backend" in s
    with_ref = "ref.backend" in s and float(s["actor.kl_ctl"]) > 0  # rl_trainer.py:179-181
    roles = ["actor"] + (["critic"] if critic else []) + (["ref"] if with_ref else [])
    strategies = {"actor": actor}
    for role in roles[1:]:
        if s[f"{role}.scheduling_strategy.type"] != "colocation" or s[f"{role}.scheduling_strategy.target"] != "actor":
            raise ConfigError(f"the {role} on GPUs of its own: AReaL runs the trainer's calls one after another "
                              "(rl_trainer.py:622-751), which realbench prices as concurrent on separate GPUs; "
                              "colocate it with the actor (scheduling_strategy: {type: colocation, target: actor})",
                              f"{role}.scheduling_strategy.type", source)
        strategies[role] = allocation(s[f"{role}.backend"], f"{role}.backend", source, servers=False)
        if world(strategies[role]) != world(actor):
            raise ConfigError(f"{s[f'{role}.backend']!r}: a role colocated with the actor has its world size "
                              f"({world(actor)}; infra/scheduler/local.py:680-699)", f"{role}.backend", source)
    if critic and int(s["critic.ppo_n_minibatches"]) != int(s["actor.ppo_n_minibatches"]):
        raise ConfigError(f"{s['critic.ppo_n_minibatches']}: realbench's critic takes the actor's optimizer steps "
                          f"(actor.ppo_n_minibatches {s['actor.ppo_n_minibatches']})", "critic.ppo_n_minibatches",
                          source)
    W_a = world(actor)
    if server["p"] > 1:
        raise ConfigError(f"{s['rollout.backend']!r}: realbench prices a server's continuous batching without a "
                          "pipeline (p1)", "rollout.backend", source)
    instance = server["t"] * server["p"]
    if instance > G:
        raise ConfigError(f"{s['rollout.backend']!r}: a server of {instance} GPUs spans nodes of {G}; AReaL's single "
                          "controller starts each on one node (cli_args.py:1949)", "rollout.backend", source)
    meshes, nodes = place([("actor", W_a), ("rollout", server["d"] * instance)], G)
    if "cluster.n_nodes" in given and nodes > int(s["cluster.n_nodes"]):
        raise ConfigError(f"{s['cluster.n_nodes']}: the actor's {W_a} and the rollout's {server['d'] * instance} GPUs "
                          f"need {nodes} nodes of {G}", "cluster.n_nodes", source)

    n = int(s["gconfig.n_samples"])
    critic_alg = "ppo" if critic else ("rloo" if s.get("actor.reward_norm.mean_leave1out") else "grpo")
    if n < 1 or (critic_alg == "grpo" and n < 2):
        raise ConfigError(f"{n}: {GROUP_OF_ONE}" if n == 1 else f"{n}: samples a prompt, 1 or more",
                          "gconfig.n_samples", source)
    max_new, max_tokens = int(s["gconfig.max_new_tokens"]), int(s["gconfig.max_tokens"])
    if not s["train_dataset.max_length"] and max_tokens - max_new < 1:
        raise ConfigError(f"is not set and gconfig.max_tokens ({max_tokens}) leaves no room for prompts beside "
                          f"max_new_tokens ({max_new}): realbench prices prompts at their cap; set it",
                          "train_dataset.max_length", source)
    prompt_len = int(s["train_dataset.max_length"] or max_tokens - max_new)
    gen_len = min(max_new, max_tokens - prompt_len)  # remote_inf_engine.py:810-821
    if gen_len < 1:
        raise ConfigError(f"{max_tokens} leaves no room for responses after prompts of train_dataset.max_length "
                          f"{prompt_len}", "gconfig.max_tokens", source)
    L = prompt_len + gen_len
    if not s["train_dataset.max_length"]:
        for role in strategies:
            budget = s.get(f"{role}.mb_spec.max_tokens_per_mb")
            if budget is not None and int(budget) < L:
                raise ConfigError(f"is not set: realbench prices prompts at their cap, gconfig.max_tokens less "
                                  f"max_new_tokens ({prompt_len} tokens), whose rows of {L} {role}.mb_spec."
                                  f"max_tokens_per_mb {budget} cannot hold (AReaL's packer refuses a longer "
                                  "sequence); set it to the data's longest prompt", "train_dataset.max_length", source)
    step = StepRows(prompt_len, gen_len, lengths)
    prompts = int(s["train_dataset.batch_size"])
    rows = prompts * n
    steps = int(s["actor.ppo_n_minibatches"])
    even_share(rows, steps, "samples a step", "actor.ppo_n_minibatches", source)

    def strategy(role: str, rows_per_call: int, trained: bool, budget: Optional[int] = None) -> dict:
        a = strategies[role]
        dp = a["d"]
        if prompts % dp:
            raise ConfigError(f"{prompts} prompt groups do not split evenly over {dp} data-parallel ranks "
                              "(utils/seqpack.py:558-562)", "train_dataset.batch_size", source)
        per_rank = even_share(rows_per_call, dp, "samples", f"{role}.backend", source)  # (a GPU's, or a group's)
        megatron = a["backend"] == "megatron"
        out = {"mesh": meshes["actor"], "dp": dp, "tp": a["t"], "pp": a["p"],
               "micro_batches": _micro_batches(step, per_rank, dp, s.get(f"{role}.mb_spec.n_mbs"),
                                               whole_row_budget(s.get(f"{role}.mb_spec.max_tokens_per_mb"), L,
                                                                f"{role}.mb_spec.max_tokens_per_mb", source,
                                                                "AReaL's packer refuses a longer sequence "
                                                                "(utils/seqpack.py:234-242)"), a["p"]),
               # (a forward keeps no activations for a backward: nothing to checkpoint)
               "activation_checkpointing": trained and bool(s.get(f"{role}.gradient_checkpointing")),
               "virtual_stages": int(s.get(f"{role}.megatron.virtual_pipeline_parallel_size") or 1) if megatron else 1}
        if megatron and out["virtual_stages"] > 1 and a["p"] == 1:
            raise ConfigError("needs a pipeline (p > 1 in the backend; api/alloc_mode.py:231-239)",
                              f"{role}.megatron.virtual_pipeline_parallel_size", source)
        if megatron:
            out["zero"] = int(bool(s.get(f"{role}.megatron.ddp.use_distributed_optimizer", True))) if trained else 0
        else:
            out["zero"] = 3
        if a["c"] > 1:  # each of the d ranks' micro-batches split over c GPUs: FSDP's Ulysses groups,
            # Megatron's context-parallel rings (Transformer Engine's p2p ring, Megatron's default)
            out["sp"] = a["c"]
            if megatron:
                out["ring"] = "p2p"
        # memory: the largest micro-batch of the plan's count, the budget realbench writes (_engine_settings),
        # or another call's (`budget`: the critic's values pack under its training's); a GPU's share
        # of a group's (fsdp_engine.py:1915-1948 pads the packed micro-batch to a multiple of c and
        # slices it; megatron_engine.py:2060-2064, "max_tokens_per_mb / cp_size" a GPU)
        out["max_tokens"] = budget or ceil_at_least_one(step.budget(per_rank, dp, out["micro_batches"]), a["c"])
        out.update(_experts(role, a, model(role), out, trained, s[f"{role}.backend"], source))
        return out

    calls: dict[str, dict] = {"actor_train": strategy("actor", rows // steps, True)}
    if with_ref:
        calls["ref_inf"] = strategy("ref", rows, False)
    if critic:
        calls["critic_train"] = strategy("critic", rows // steps, True)
        calls["critic_inf"] = strategy("critic", rows, False, budget=calls["critic_train"]["max_tokens"])
    # each server decodes the sequences in flight on it at once, up to its own limit
    per_server = even_share(rows, server["d"], "samples", "rollout.backend", source)
    in_flight = int(s["rollout.max_concurrent_rollouts"] or prompts) * n
    limit = s[SERVER_SLOTS[server["backend"]]]
    slots = min(math.ceil(in_flight / server["d"]), int(limit) if limit else per_server)
    calls["actor_gen"] = {"mesh": meshes["rollout"], "dp": server["d"], "tp": server["t"], "pp": server["p"],
                          "micro_batches": rounds(per_server, slots)}
    calls["reward_inf"] = {"mesh": meshes["rollout"], "dp": meshes["rollout"].size, "tp": 1, "pp": 1,
                           "micro_batches": 1}
    for c in calls.values():
        c["mesh"] = c["mesh"].label(G)
    actor_path = s["actor.path"]
    models: dict[str, Any] = {"actor": {"path": actor_path}}
    if with_ref:
        models["ref"] = {"path": s["ref.path"]}
    if critic:
        models["critic"] = {"path": s["critic.path"], "value_head": True}
    models["reward"] = {"function": REWARD}
    if s["actor.use_lora"]:
        if s["actor.peft_type"] != "lora":
            raise ConfigError(f"{s['actor.peft_type']!r}: realbench trains LoRA adapters", "actor.peft_type", source)
        targets = list(s[LORA_KEYS["target_modules"]] or [])
        models["actor"]["lora"] = {"r": s[LORA_KEYS["r"]], "lora_alpha": s[LORA_KEYS["lora_alpha"]],
                                   "target_modules": "all-linear" if targets in ([], ["all-linear"]) else targets}
    context = _server_context(s, server["backend"], L, source)  # (SGLang's refused too where too long or short)
    scenario, plan = job_documents(
        "areal", name, f"read from the AReaL {VERSION} experiment {Path(source).name}",
        f"AReaL {VERSION} experiment", algorithm=critic_alg, models=models, prompts=prompts, prompt_len=prompt_len,
        gen_len=gen_len, steps=steps, group_size=n, cluster={"nodes": nodes, "gpus_per_node": G, "device": device},
        epochs=1, calls=calls, max_staleness=int(s["rollout.max_head_offpolicyness"]), with_ref=with_ref,
        old_logprobs=_old_logprobs(s, source), rollout_server=server["backend"], padding_free=PADDING_FREE,
        memory_fraction=_memory_fraction(s, server["backend"], source),
        max_model_len=context if server["backend"] == "vllm" else None)
    return scenario, plan


def _server_context(s: dict[str, Any], server: str, length: int, source: str) -> Optional[int]:
    """The context the rollout's servers take (SERVER_CONTEXT: documents.served_context)."""
    key = SERVER_CONTEXT[server]
    return served_context(s[key], s["actor.path"], length, key, source,
                          beyond=f"{'vLLM' if server == 'vllm' else 'SGLang'} refuses before it starts",
                          cut="AReaL's requests of a prompt and its response would outrun the server's context "
                              "(remote_inf_engine.py:810-821 asks for the full response)")


def _memory_fraction(s: dict[str, Any], server: str, source: str) -> float:
    """The share of each GPU's memory the rollout's servers take (SERVER_MEMORY)."""
    key = SERVER_MEMORY[server]
    if s[key] is None:  # (SGLang then picks its own by the GPU's memory)
        raise ConfigError("is not set: SGLang then chooses its own share of the GPU's memory, which realbench needs to "
                          "price the servers' KV cache (give a number)", key, source)
    return float(s[key])


def _old_logprobs(s: dict[str, Any], source: str) -> str:
    """Where AReaL's actor takes the old (or, decoupled, proximal) log-probabilities from: a forward
    over the whole batch (recompute_logprob, or the decoupled loss recomputing), or the rollout's
    (the decoupled loss's interpolated from them: PROX_INTERPOLATED)."""
    if not s["actor.use_decoupled_loss"]:
        return "whole_batch" if s["actor.recompute_logprob"] else "rollout"
    return "rollout" if s[PROX_LOGP] == PROX_INTERPOLATED else "whole_batch"
