"""A plan in OpenRLHF's space written as its command line: `_settings` (the flags a plan needs, or a
ConfigError naming the first part of it OpenRLHF cannot run), `to_config` (those and the
checkpoints' folders) and the launch script (`config_files`).
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any, Optional

from realbench.engines.batches import rounds
from realbench.engines.documents import packs, refuse_offload, whole_alpha
from realbench.engines.openrlhf.pricing import EXPERTS, MEMORY_FRACTION, PADDING_FREE, space_problem_of_scenario
from realbench.engines.openrlhf.settings import (ADAM_OFFLOAD, ENTRY, ESTIMATORS, LORA_FLAGS, MEMORY, PACKING, RING,
                                                 SLEEP, VERSION, VLLM_MAX_NUM_SEQS, _table, defaults)
from realbench.engines.placement import disjoint
from realbench.errors import ConfigError
from realbench.models import FunctionSpec
from realbench.plan.mesh import Mesh, Option
from realbench.plan.options import served_call
from realbench.plan.scenario import Scenario


def _inside(a: Mesh, b: Mesh, G: int) -> bool:
    return b.start(G) <= a.start(G) and a.start(G) + a.size <= b.start(G) + b.size


def _together(options: dict[str, Option], trained: list[str], switch: str, how: str) -> bool:
    """The one value of a strategy switch that OpenRLHF sets for both trained models with one flag,
    or ConfigError where the plan sets it for one only (`how`: what OpenRLHF does together)."""
    values = {getattr(options[n].strategy, switch) for n in trained}
    if len(values) > 1:
        raise ConfigError(f"OpenRLHF {how}", f"calls.critic_train.{switch}")
    return values.pop()


def _ring_size(options: dict[str, Option], ds_calls: list[str]) -> int:
    """The one ring attention group size (RING) of every DeepSpeed model's calls, or ConfigError:
    OpenRLHF splits sequences by ring attention only, one size for every model."""
    for name, o in options.items():
        if o.strategy.sp > 1 and o.strategy.ring != "allgather":
            raise ConfigError(f"{o.strategy.sp}: OpenRLHF splits sequences by ring attention (--{RING}: ring: "
                              "allgather), not by " + ("Megatron's p2p ring" if o.strategy.ring else
                                                       "Ulysses' head exchanges"), f"calls.{name}.sp")
    ring = options["actor_train"].strategy.sp
    for name in ds_calls:
        if options[name].strategy.sp != ring:
            raise ConfigError(f"OpenRLHF's ring attention group is one size for every model (--{RING} {ring})",
                              f"calls.{name}.sp")
    return ring


def _settings(scenario: Scenario, options: dict[str, Option]) -> dict[str, Any]:
    """OpenRLHF's flags (dest -> value) for a plan, or ConfigError naming the first part of it
    OpenRLHF cannot run."""
    problem = space_problem_of_scenario(scenario)
    if problem:
        raise ConfigError(problem[1], problem[0])
    c, df = scenario.cluster, scenario.dataflow
    G = c.gpus_per_node
    fn_reward = isinstance(scenario.models["reward"], FunctionSpec)
    critic = "critic_train" in options
    reference = "ref_inf" in options
    ds_calls = ["actor_train"] + (["ref_inf"] if reference else []) + \
        (["critic_train", "critic_inf"] if critic else []) + ([] if fn_reward else ["reward_inf"])
    trained = ["actor_train"] + (["critic_train"] if critic else [])
    # (an optimizer offloaded: --ds.enable_sleep, for actor and critic together; OpenRLHF's
    # parameter offloads keep other copies)
    refuse_offload({n: o for n, o in options.items() if n not in trained}, "OpenRLHF", "--ref.offload")
    for name, o in options.items():
        if o.strategy.shard_group:
            raise ConfigError(f"{o.strategy.shard_group}: OpenRLHF's DeepSpeed shards a model over all its data-parallel "
                              "GPUs (its --ds.zpg, ZeRO++'s second copy of the weights in a node, is not hybrid "
                              "sharding, and realbench does not price it)", f"calls.{name}.shard_group")
    for name, o in options.items():  # (EXPERTS)
        if o.strategy.ep > 1 or o.strategy.etp:
            field = "ep" if o.strategy.ep > 1 else "etp"
            raise ConfigError(f"{field} {getattr(o.strategy, field)}: {EXPERTS}", f"calls.{name}.{field}")
    ring = _ring_size(options, ds_calls)
    for name in trained:
        if options[name].strategy.offload_params:
            raise ConfigError("realbench does not write OpenRLHF's parameter offload of a trained model (DeepSpeed's "
                              "offload_param), which keeps and moves them otherwise than priced here",
                              f"calls.{name}.offload_params")
    sleep = _together(options, trained, "offload_optimizer", f"offloads the actor's and the critic's optimizer "
                      f"together (--{SLEEP})")
    host_adam = _together(options, trained, "host_adam", f"runs the actor's and the critic's Adam on the host "
                          f"together (--{ADAM_OFFLOAD})")
    for name, o in options.items():
        if o.strategy.pp > 1:
            raise ConfigError("OpenRLHF runs no pipeline parallelism (utils/deepspeed/deepspeed.py:103-107: dp, sp, tp)",
                              f"calls.{name}.pp")
    actor = options["actor_train"].strategy
    T = actor.tp
    zero = next((options[nm].strategy.zero for nm in trained if options[nm].strategy.shards > 1), 0)
    for name in ds_calls:
        s = options[name].strategy
        if s.tp != T:
            raise ConfigError("OpenRLHF's DeepSpeed tensor parallel size is one for every model (--ds.tensor_parallel_size)",
                              f"calls.{name}.tp")
        want = zero if name in trained else (3 if zero == 3 else 0)
        if s.shards > 1 and s.zero != want:
            raise ConfigError(f"zero {s.zero}: OpenRLHF has one ZeRO stage (--ds.zero_stage {zero}) for the trained "
                              "models; forward-only, stage 3 under it or none (deepspeed_utils.py:78-118)",
                              f"calls.{name}.zero")
    if T > 1 and zero == 3:
        raise ConfigError("DeepSpeed's AutoTP trains under ZeRO 0 to 2", "calls.actor_train.zero")
    if zero == 3 and int(scenario.engine_settings.get("ds.zpg", 1)) > 1:
        raise ConfigError(f"{scenario.engine_settings['ds.zpg']}: under this plan's ZeRO-3 DeepSpeed would keep ZeRO++'s "
                          "hierarchical copy of the weights (zero_hpz_partition_size), which realbench does not price; "
                          "remove it from the scenario's engine_settings", "engine_settings.ds.zpg")
    if ring > 1 and not packs(scenario, "openrlhf", PADDING_FREE):  # (a scenario not OpenRLHF's: padded, priced_as)
        raise ConfigError("OpenRLHF's ring attention packs the rows (cli/train_ppo_ray.py:686-689), and this scenario "
                          "prices them padded (training.padding_free)", "calls.actor_train.ring")
    if sleep and zero == 0:
        raise ConfigError("OpenRLHF offloads an optimizer's states with --ds.enable_sleep, which DeepSpeed runs for "
                          "its ZeRO optimizers only (runtime/zero/stage3.py:3571, stage_1_and_2.py:2921): shard it "
                          "(zero 1 to 3)", "calls.actor_train.offload_optimizer")
    if host_adam and zero == 0:
        raise ConfigError("OpenRLHF runs Adam on the host with --ds.adam_offload, DeepSpeed's ZeRO-Offload, which "
                          "needs a ZeRO optimizer (stage 0's keeps fp32 copies on the GPU): shard it (zero 1 to 3)",
                          "calls.actor_train.host_adam")
    if critic and options["critic_train"].strategy.checkpointing != actor.checkpointing:
        raise ConfigError("OpenRLHF checkpoints actor and critic together (--actor.gradient_checkpointing_enable)",
                          "calls.critic_train.activation_checkpointing")
    A = options["actor_train"].mesh
    V = options["actor_gen"].mesh
    R = options["ref_inf"].mesh if reference else A  # (no reference: nothing beside the actor to place)
    gen = options["actor_gen"].strategy
    hybrid = V == A
    out: dict[str, Any] = {}
    staleness = scenario.dataflow.max_staleness
    if staleness:  # generation up to S batches ahead: a queue of S (trainer/ppo_trainer_async.py)
        if hybrid:
            raise ConfigError("OpenRLHF's asynchronous trainer runs vLLM on its own GPUs (cli/train_ppo_ray.py:75)",
                              "calls.actor_gen.mesh")
        out.update({"train.async_enable": True, "train.async_queue_size": staleness})
    if critic and options["critic_inf"].mesh != options["critic_train"].mesh:
        raise ConfigError("OpenRLHF's critic computes values on its training GPUs", "calls.critic_inf.mesh")
    C = options["critic_train"].mesh if critic else None
    RM = None if fn_reward else options["reward_inf"].mesh
    # --train.colocate_all: the reference on the actor's GPUs, a critic or reward model on its first
    # ones (launcher.py:254-283), or both on their own (--train.colocate_critic_reward)
    beside_actor = lambda m: m is not None and m.start(G) == A.start(G) and _inside(m, A, G)  # noqa: E731
    own = [m for m in (C, RM) if m is not None and not beside_actor(m)]
    all_on_actor = R == A and (not own or (critic and C == RM and disjoint([A, C], G)))
    if hybrid:
        if R != A:
            raise ConfigError("under the hybrid engine (vLLM on the actor's GPUs) the reference is there too",
                              "calls.ref_inf.mesh")
        if gen.size != A.size:
            raise ConfigError("the hybrid engine puts a vLLM worker on every actor GPU", "calls.actor_gen.dp")
        if not all_on_actor:
            raise ConfigError("under the hybrid engine a critic or reward model takes the actor's first GPUs, or both "
                              "share their own (--train.colocate_critic_reward)", "calls.critic_train.mesh")
        out.update({"train.colocate_all": True, "vllm.enable_sleep": not gen.keeps_memory,
                    "train.colocate_critic_reward": bool(own)})
    elif staleness and all_on_actor and any(beside_actor(m) for m in (C, RM)):
        # asynchronous under colocate_all: the DeepSpeed models on the actor's GPUs, vLLM apart
        if not disjoint([A, V] + own[:1], G):
            raise ConfigError("vLLM's GPUs are its own under the asynchronous trainer", "calls.actor_gen.mesh")
        out.update({"train.colocate_all": True, "train.colocate_critic_reward": bool(own)})
    else:
        with_ref = R == A
        with_reward = critic and RM is not None and RM == C
        groups = [A, V] + ([] if with_ref else [R]) + ([C] if critic else []) + \
            ([RM] if RM is not None and not with_reward else [])
        if not disjoint(groups, G):
            raise ConfigError("OpenRLHF's groups share GPUs only as it colocates them (actor and reference, critic and "
                              "reward model, or everything on the actor's)", "calls.actor_gen.mesh")
        out.update({"train.colocate_actor_ref": with_ref, "train.colocate_critic_reward": with_reward})
    shape = lambda m: (m.nodes, m.gpus)  # noqa: E731  (num_nodes, num_gpus_per_node)
    out.update({"actor.num_nodes": shape(A)[0], "actor.num_gpus_per_node": shape(A)[1],
                "ref.num_nodes": shape(R)[0], "ref.num_gpus_per_node": shape(R)[1],
                **({} if reference else {"algo.kl.init_coef": 0.0}),
                "vllm.num_engines": gen.dp, "vllm.tensor_parallel_size": gen.tp,
                MEMORY: served_call(df.call("actor_gen"), gen).memory_fraction or MEMORY_FRACTION,
                "ds.zero_stage": zero,
                "ds.tensor_parallel_size": T, RING: ring, SLEEP: sleep,
                ADAM_OFFLOAD: host_adam,
                "actor.gradient_checkpointing_enable": actor.checkpointing})
    if critic:
        out.update({"critic.num_nodes": shape(C)[0], "critic.num_gpus_per_node": shape(C)[1]})
    if RM is not None:
        out.update({"reward.num_nodes": shape(RM)[0], "reward.num_gpus_per_node": shape(RM)[1]})
    g = df.call("actor_gen")
    rows, n = g.seqs, g.group_size
    if rows % gen.dp or rounds(rows // gen.dp, VLLM_MAX_NUM_SEQS) != gen.micro_batches:
        raise ConfigError(f"OpenRLHF leaves vLLM's max_num_seqs at its default ({VLLM_MAX_NUM_SEQS}): "
                          f"{rounds(rows // gen.dp, VLLM_MAX_NUM_SEQS) if rows % gen.dp == 0 else '?'} batches a "
                          "vLLM engine", "calls.actor_gen.micro_batches")
    steps = df.call("actor_train").optimizer_steps
    batch = rows // steps
    per_micro = set()
    for name in trained:
        s = options[name].strategy
        per_gpu = batch // s.dp
        if batch % s.dp or per_gpu % s.micro_batches:
            raise ConfigError(f"{s.micro_batches} micro-batches do not split a GPU's {per_gpu} samples of an optimizer "
                              "step evenly (DeepSpeed's train_batch_size = micro x accumulation x dp)",
                              f"calls.{name}.micro_batches")
        per_micro.add(per_gpu // s.micro_batches)
    if len(per_micro) > 1:
        raise ConfigError("OpenRLHF trains actor and critic in micro-batches of one size (--train.micro_batch_size)",
                          "calls.critic_train.micro_batches")
    micro = per_micro.pop()
    forwards = [nm for nm in ds_calls if nm not in trained]
    # (no forward-only call: the chunk size stays OpenRLHF's default, which prices nothing here)
    infer = max((math.ceil(rows / options[nm].strategy.dp / options[nm].strategy.micro_batches) for nm in forwards),
                default=defaults()["rollout.micro_batch_size"])
    for name in ds_calls:  # ref, critic, reward: one chunk size; every DeepSpeed group: the batch rules
        s = options[name].strategy
        if name in forwards and (rows % s.dp or rounds(rows // s.dp, infer) != s.micro_batches):
            raise ConfigError(f"OpenRLHF's forwards run in chunks of one size (--rollout.micro_batch_size): no size "
                              f"gives {s.micro_batches} of a GPU's {rows // s.dp if rows % s.dp == 0 else rows / s.dp} "
                              "samples here and the other calls' counts", f"calls.{name}.micro_batches")
        if batch % (micro * s.dp):
            raise ConfigError(f"DeepSpeed's batch rule: train batch {batch} is not a multiple of micro-batch {micro} x "
                              f"dp {s.dp} (its eval config carries the same sizes, deepspeed.py:489-500)",
                              f"calls.{name}.dp")
        if math.ceil(rows / infer) < s.dp:
            raise ConfigError(f"{math.ceil(rows / infer)} chunks of samples for {s.dp} data-parallel ranks "
                              "(trainer/ray/launcher.py:346-353)", f"calls.{name}.dp")
    out.update({"rollout.batch_size": rows // n, "rollout.n_samples_per_prompt": n, "train.batch_size": batch,
                "train.micro_batch_size": micro, "rollout.micro_batch_size": infer,
                "train.max_epochs": scenario.training.num_iterations, "data.max_len": g.prompt_len + g.gen_len,
                "rollout.max_new_tokens": g.gen_len,
                "algo.advantage.estimator": {v: k for k, v in ESTIMATORS.items()}[scenario.algorithm]})
    lora = scenario.models["actor"].lora
    if lora is not None:
        out.update({LORA_FLAGS["r"]: lora.r, LORA_FLAGS["lora_alpha"]: whole_alpha(lora, "OpenRLHF"),
                    LORA_FLAGS["target_modules"]: list(lora.target_modules)})
    return out


def to_config(scenario: Scenario, options: dict[str, Option], model_paths: dict[str, str]) -> tuple[str, dict]:
    """("deepspeed", OpenRLHF's flags for the plan: dest -> value)."""
    out = _settings(scenario, options)
    out[PACKING] = packs(scenario, "openrlhf", PADDING_FREE)
    for role in ("actor", "critic"):
        if role in scenario.models and role not in model_paths:
            raise ConfigError(f"OpenRLHF loads a checkpoint folder: give the {role}'s (--model-path {role}=DIR)",
                              f"models.{role}")
    if model_paths.get("ref", model_paths["actor"]) != model_paths["actor"]:
        raise ConfigError("OpenRLHF's reference is the actor's checkpoint (--actor.model_name_or_path)", "models.ref")
    out["actor.model_name_or_path"] = model_paths["actor"]
    if "critic" in scenario.models:
        out["critic.model_name_or_path"] = model_paths["critic"]
    reward = scenario.models["reward"]
    if isinstance(reward, FunctionSpec):
        if len(reward.functions) > 1 or reward.model_score or not reward.functions[0].endswith(":reward_func"):
            raise ConfigError("OpenRLHF scores with one reward function, reward_func in a .py file "
                              "(--reward.remote_url FILE.py)", "models.reward")
        out["reward.remote_url"] = reward.functions[0].rpartition(":")[0]
    else:
        if "reward" not in model_paths:
            raise ConfigError("OpenRLHF loads a checkpoint folder: give the reward model's (--model-path reward=DIR)",
                              "models.reward")
        out["reward.model_name_or_path"] = model_paths["reward"]
    return "deepspeed", out


def command_line(settings: dict[str, Any]) -> list[list[str]]:
    """The flags of OpenRLHF's settings (dest -> value), each with its values; switches only when on."""
    kinds = {f["dest"]: (f["flags"][0], f["kind"]) for f in _table()["flags"]}
    flags: list[list[str]] = []
    for dest, value in settings.items():
        flag, kind = kinds[dest]
        if kind != "value":
            if value:
                flags.append([flag])
        elif value is not None:
            flags.append([flag, *(map(str, value) if isinstance(value, (list, tuple)) else [str(value)])])
    return flags


def config_files(config: Path, engine: str, settings: dict[str, Any],
                 node_size: Optional[int] = None) -> list[tuple[Path, str, int]]:
    """The launch script (at `config`): OpenRLHF's command line, one flag a line, submitted to the
    Ray cluster at $RAY_ADDRESS (default the local one). `node_size`: the GPUs of a node the plan
    was made for (its command line gives only each group's count), named for reading it back."""
    lines = ["  " + " ".join(shlex.quote(w) for w in flag) for flag in command_line(settings)]
    note = "" if node_size is None else (f"# (planned on nodes of {node_size} GPUs: realbench import openrlhf "
                                         f"{shlex.quote(config.name)} --gpus-per-node {node_size})\n")
    text = ("#!/usr/bin/env bash\n"
            f"# OpenRLHF {VERSION}: the plan realbench wrote (pip install openrlhf[vllm]=={VERSION})\n" + note +
            'ray job submit --address="${RAY_ADDRESS:-http://127.0.0.1:8265}" -- \\\n'
            f"  {ENTRY} \\\n" + " \\\n".join(lines) + ' "$@"\n')
    return [(config, text, 0o755)]
