"""A plan in verl's space written as verl's configuration: `to_config` (the settings, flat),
a Hydra primary config that extends ppo_trainer with them and its launch script (`config_files`),
the critic's one token budget (`critic_budget`) and the actor's fused kernels (`_fused_of`).
"""

from __future__ import annotations

import math
import shlex
from functools import partial
from pathlib import Path
from typing import Any, Optional

import yaml

from realbench.engines.documents import budget_row, whole_alpha
from realbench.engines.dotted import nest
from realbench.engines.verl.pricing import (MEMORY_FRACTION, _critic_counts, _divided_by, _formed, _mean_budget,
                                            _remove_padding, _step_rows, logits_paths)
from realbench.engines.verl.settings import (A, ADAPTER_PATH, BUILTIN_REWARD, BYPASS, ENTRY, ESTIMATORS, FSDP_SIZE,
                                             FREE_CACHE, FUSED, HYBRID, LORA_EXCLUDE, LORA_KEYS, LORA_MERGE,
                                             MAX_MODEL_LEN, MEMORY, OFFLOAD_BLOCK, ONE_STEP_OFF_ENTRY,
                                             ONE_STEP_OFF_SETTINGS, R,
                                             REF_MEGATRON_OFFLOAD, REMOVE_PADDING, RM, ROLLOUT_DP, ROLLOUT_EP,
                                             ROLLOUT_POOL, SEQUENCE_PARALLEL, TEACHER, TEACHER_SERVER, DISTILL, VERSION,
                                             VISION_EXCLUDED, known_keys,
                                             resolve)
from realbench.engines.verl.space import pools, space_problem
from realbench.errors import ConfigError
from realbench.models import FunctionSpec
from realbench.plan.mesh import Option
from realbench.plan.options import served_call
from realbench.plan.scenario import Scenario


# the stand-in's file as scenarios written before the engines were packages name it
FORMER_BUILTIN_REWARD = ("realbench", "engines", "verl_reward.py")


def _builtin_reward(function: str) -> bool:
    """Whether a scenario's reward function is the stand-in for verl's own scorers (wherever
    realbench was installed when the scenario was written, and where the stand-in was then)."""
    file, _, name = function.rpartition(":")
    return name == "default_compute_score" and Path(file).parts[-3:] in (
        Path(BUILTIN_REWARD.rpartition(":")[0]).parts[-3:], FORMER_BUILTIN_REWARD)


def _rows_per_step(scenario: Scenario, name: str, o: Option) -> int:
    call = scenario.dataflow.call(name)
    return call.seqs // call.optimizer_steps // o.strategy.dp


def _per_micro_batch(scenario: Scenario, name: str, o: Option) -> int:
    rows, m = _rows_per_step(scenario, name, o), o.strategy.micro_batches
    if rows % m:
        raise ConfigError(f"{m} does not divide a GPU's {rows} rows: verl splits them into equal micro-batches "
                          "(verl/workers/engine/utils.py:122-128)", f"calls.{name}.micro_batches")
    return rows // m


def critic_budget(scenario: Scenario, options: dict[str, Option]) -> int:
    """The V1 critic's token budget a GPU (critic.ppo_infer_max_token_len_per_gpu) under which
    verl packs the critic's train and inference calls into the plan's micro-batch counts (module
    doc; the counts its dynamic batching forms, packer), at least a whole row (verl asserts it,
    verl/utils/seqlen_balancing.py:384-386): the budget the plan's critic calls carry (max_tokens:
    one for both), or else the first of the budgets from the mean tokens' up (by 5%) under which
    verl forms no more micro-batches of either call than the plan's, where it forms both counts."""
    ct, ci = options["critic_train"].strategy, options["critic_inf"].strategy
    train_rows = _rows_per_step(scenario, "critic_train", options["critic_train"])
    inf_rows = _rows_per_step(scenario, "critic_inf", options["critic_inf"])
    if ct.max_tokens != ci.max_tokens:
        raise ConfigError(f"{ci.max_tokens} beside critic_train's {ct.max_tokens}: verl's V1 critic packs both its "
                          "calls to one token budget (verl/trainer/ppo/v1/trainer_base.py:266-268)",
                          "calls.critic_inf.max_tokens")
    sp = ct.sp
    counts = partial(_critic_counts, scenario, train_rows, inf_rows, ct.dp, _divided_by(ct.pp, ct.virtual_stages),
                     sp=sp)
    wanted = (ct.micro_batches, ci.micro_batches)
    budget = ct.max_tokens or max(_mean_budget(scenario, train_rows, wanted[0], sp),
                                  _mean_budget(scenario, inf_rows, wanted[1], sp))
    if ct.max_tokens is None:
        ceiling = max(_mean_budget(scenario, train_rows, 1, sp), _mean_budget(scenario, inf_rows, 1, sp))
        while any((c or math.inf) > w for c, w in zip(counts(budget), wanted)) and budget < ceiling:
            budget = min(ceiling, math.ceil(budget * 1.05))
    if counts(budget) != (ct.micro_batches, ci.micro_batches):
        row = budget_row(scenario, "critic_train")
        train_tokens, inf_tokens = train_rows * row, inf_rows * row
        raise ConfigError(f"verl's V1 critic packs both its calls to one token budget a GPU of at least a row "
                          f"(verl/trainer/ppo/v1/trainer_base.py:266-268): "
                          f"{f'{budget} tokens do not give' if ct.max_tokens else 'no budget gives'} {ct.micro_batches} "
                          f"micro-batches of {train_tokens:.0f} tokens and {ci.micro_batches} of {inf_tokens:.0f}",
                          "calls.critic_inf.max_tokens" if ct.max_tokens else "calls.critic_inf.micro_batches")
    return budget


def _dynamic(scenario: Scenario, options: dict[str, Option], name: str, flag: str, key: str,
             out: dict[str, Any]) -> bool:
    """Write a call whose plan carries a token budget (max_tokens) as verl's dynamic batching under
    it (its `flag` on, the budget as `key`) into `out`; False where it carries none. Refused by name
    where verl would pack a GPU's rows into another count of micro-batches under it."""
    o = options[name]
    budget = o.strategy.max_tokens
    if budget is None:
        return False
    rows = _rows_per_step(scenario, name, o)
    formed = _formed(_step_rows(scenario), rows, o.strategy.dp, budget,
                     _divided_by(o.strategy.pp, o.strategy.virtual_stages), o.strategy.sp)
    if formed != o.strategy.micro_batches:
        raise ConfigError(f"{budget}: verl's dynamic batching packs a GPU's {rows} rows into {formed} micro-batches "
                          f"under it, not {o.strategy.micro_batches}", f"calls.{name}.max_tokens")
    out.update({flag: True, key: budget})
    return True


def to_config(scenario: Scenario, options: dict[str, Option], model_paths: dict[str, str]) -> tuple[str, dict]:
    """(model_engine, the settings verl needs to run the plan, flat) of a plan in verl's space."""
    problem = space_problem(scenario, options)
    if problem:
        raise ConfigError(problem[1], problem[0])
    c, df = scenario.cluster, scenario.dataflow
    gen, actor = options["actor_gen"].strategy, options["actor_train"].strategy
    engine = "dp" if actor.zero >= 2 else "megatron"
    g = df.call("actor_gen")
    n = g.group_size
    prompts, steps = g.seqs // n, df.call("actor_train").optimizer_steps
    trainer, pool = pools(scenario, options)
    out: dict[str, Any] = {
        "trainer.nnodes": trainer.nodes, "trainer.n_gpus_per_node": c.gpus_per_node,
        "data.train_batch_size": prompts, "data.max_prompt_length": g.prompt_len, "data.max_response_length": g.gen_len,
        "algorithm.adv_estimator": {v: k for k, v in ESTIMATORS.items()}[scenario.algorithm],
        f"{R}.name": scenario.rollout_server or "vllm", f"{R}.n": n, f"{R}.tensor_model_parallel_size": gen.tp,
        # (expert parallelism over replicas of tp x data_parallel_size GPUs: ROLLOUT_EP)
        **({ROLLOUT_DP: gen.ep // gen.tp, ROLLOUT_EP: gen.ep} if gen.ep > 1 else {}),
        f"{R}.max_num_seqs": math.ceil(g.seqs / gen.dp / gen.micro_batches),
        MEMORY: served_call(g, gen).memory_fraction or MEMORY_FRACTION,
        **({FREE_CACHE: False} if gen.keeps_memory else {}),
        # (the least verl runs the plan with: a sequence, where the checkpoint's positions could ask
        # more of the KV cache than the plan was priced with)
        MAX_MODEL_LEN: g.max_model_len or g.seq_len,
        f"{A}.ppo_mini_batch_size": prompts // steps, f"{A}.ppo_epochs": scenario.training.num_iterations,
    }
    ref = "actor_rollout_ref.ref"
    if not _dynamic(scenario, options, "actor_train", f"{A}.use_dynamic_bsz", f"{A}.ppo_max_token_len_per_gpu",
                    out):
        out.update({f"{A}.use_dynamic_bsz": False,
                    f"{A}.ppo_micro_batch_size_per_gpu": _per_micro_batch(scenario, "actor_train",
                                                                          options["actor_train"])})
        # (the actor's old log-probabilities: its training's micro-batches; with dynamic batching its budget,
        # by verl's interpolation)
        out[f"{R}.log_prob_micro_batch_size_per_gpu"] = out[f"{A}.ppo_micro_batch_size_per_gpu"]
    if "ref_inf" in options and not _dynamic(scenario, options, "ref_inf", f"{ref}.log_prob_use_dynamic_bsz",
                                                f"{ref}.log_prob_max_token_len_per_gpu", out):
        out.update({f"{ref}.log_prob_use_dynamic_bsz": False,
                    f"{ref}.log_prob_micro_batch_size_per_gpu": _per_micro_batch(scenario, "ref_inf", options["ref_inf"])})
    reward = scenario.models["reward"]
    if isinstance(reward, FunctionSpec):
        if len(reward.functions) > 1 or reward.model_score:
            raise ConfigError("verl scores with one reward function (reward.custom_reward_function)", "models.reward")
        if not _builtin_reward(reward.functions[0]):  # (verl's own scorers: no custom function)
            file, _, function = reward.functions[0].rpartition(":")
            out.update({"reward.custom_reward_function.path": file, "reward.custom_reward_function.name": function})
    else:
        if "reward" not in model_paths:
            raise ConfigError("verl loads a checkpoint folder: give the reward model's (--model-path reward=DIR)",
                              "models.reward")
        rm = options["reward_inf"].strategy
        out.update({f"{RM}.enable": True, f"{RM}.model_path": model_paths["reward"], f"{RM}.rollout.name": out[f"{R}.name"],
                    f"{RM}.rollout.tensor_model_parallel_size": rm.tp,
                    f"{RM}.rollout.max_num_seqs": math.ceil(g.seqs / rm.dp / rm.micro_batches)})
        if pool is not None:
            out.update({f"{RM}.enable_resource_pool": True, f"{RM}.nnodes": pool.nodes,
                        f"{RM}.n_gpus_per_node": pool.gpus})
    if "teacher_inf" in options:  # on-policy distillation: the teacher's replicas on its own pool
        if "teacher" not in model_paths:
            raise ConfigError("verl loads a checkpoint folder: give the teacher's (--model-path teacher=DIR)",
                              "models.teacher")
        teacher = options["teacher_inf"]
        rows = math.ceil(g.seqs / teacher.strategy.dp / teacher.strategy.micro_batches)  # (a forward's)
        out.update({f"{DISTILL}.enabled": True, f"{DISTILL}.nnodes": teacher.mesh.nodes,
                    f"{DISTILL}.n_gpus_per_node": teacher.mesh.gpus, f"{TEACHER}.model_path": model_paths["teacher"],
                    f"{TEACHER_SERVER}.name": out[f"{R}.name"],
                    f"{TEACHER_SERVER}.tensor_model_parallel_size": teacher.strategy.tp,
                    # (its experts over replicas of tp x data_parallel_size GPUs, as the rollout's: ROLLOUT_EP)
                    **({f"{TEACHER_SERVER}.data_parallel_size": teacher.strategy.ep // teacher.strategy.tp,
                        f"{TEACHER_SERVER}.expert_parallel_size": teacher.strategy.ep}
                       if teacher.strategy.ep > 1 else {}),
                    # (its server's steps: at most this many rows and their tokens, reader.teacher_micro_batches)
                    f"{TEACHER_SERVER}.max_num_seqs": rows,
                    f"{TEACHER_SERVER}.max_num_batched_tokens": rows * g.seq_len})
    out[REMOVE_PADDING[0]], critic_packed = _remove_padding(scenario)
    if scenario.training.old_logprobs == "rollout":  # (else a forward over the whole batch, verl's default)
        out.update({BYPASS: True, f"{R}.calculate_log_probs": True})
    if df.max_staleness:  # the one-step-off entry's config: its pools, and what its own YAML sets
        rollout = options["actor_gen"].mesh
        out.update({"trainer.n_gpus_per_node": trainer.gpus, ROLLOUT_POOL[0]: rollout.nodes,
                    ROLLOUT_POOL[1]: rollout.gpus, HYBRID: False, **ONE_STEP_OFF_SETTINGS,
                    BYPASS: scenario.training.old_logprobs == "rollout", f"{R}.calculate_log_probs": True})
    if "ref_inf" not in options:  # no KL term: verl then builds no reference
        out.update({"algorithm.use_kl_in_reward": False, f"{A}.use_kl_loss": False})
    elif scenario.algorithm == "ppo":
        out["algorithm.use_kl_in_reward"] = True
    else:
        out[f"{A}.use_kl_loss"] = True
    for role in ("actor", "ref", "critic"):  # (the reward model's: above)
        if role in scenario.models:
            if role not in model_paths:
                raise ConfigError(f"verl loads a checkpoint folder: give the {role}'s (--model-path {role}=DIR)",
                                  f"models.{role}")
    if model_paths.get("ref", model_paths["actor"]) != model_paths["actor"]:
        raise ConfigError("verl's reference is the actor's checkpoint (actor_rollout_ref.model.path)", "models.ref")
    out["actor_rollout_ref.model.path"] = model_paths["actor"]
    if engine == "dp" and "ref_inf" in options:
        out[SEQUENCE_PARALLEL["ref"][1]] = options["ref_inf"].strategy.sp
        out[FSDP_SIZE["ref"]] = options["ref_inf"].strategy.shard_group or -1
    lora = scenario.models["actor"].lora
    if lora is not None:
        out.update({LORA_KEYS["r"]: lora.r, LORA_KEYS["lora_alpha"]: whole_alpha(lora, "verl"),
                    LORA_KEYS["target_modules"]: list(lora.target_modules), LORA_MERGE: gen.merge_lora,
                    **({LORA_EXCLUDE: VISION_EXCLUDED} if scenario.models["actor"].vision else {})})
        if lora.path is not None:  # (its r, alpha and modules are the folder's: written the same)
            out[ADAPTER_PATH] = lora.path
    roles = [("actor", "actor_train", A, "actor_rollout_ref.model")]
    if "critic_train" in options:
        per_gpu = _per_micro_batch(scenario, "critic_train", options["critic_train"])
        out.update({"critic.enable": True, "critic.model.path": model_paths["critic"],
                    REMOVE_PADDING[1]: critic_packed,
                    "critic.ppo_micro_batch_size_per_gpu": per_gpu,
                    "critic.ppo_infer_max_token_len_per_gpu": critic_budget(scenario, options)})
        roles.append(("critic", "critic_train", "critic", "critic.model"))
    for role, call, block, model_block in roles:
        s = options[call].strategy
        out.update({f"{OFFLOAD_BLOCK[engine][role]}.param_offload": s.offload_params,
                    f"{OFFLOAD_BLOCK[engine][role]}.optimizer_offload": s.offload_optimizer})
        if engine == "dp":
            fsdp = f"{block}.fsdp_config" if role == "actor" else f"{block}.fsdp"
            out[f"{fsdp}.reshard_after_forward"] = s.zero == 3
            out[SEQUENCE_PARALLEL[role][1]] = s.sp
            out[FSDP_SIZE[role]] = s.shard_group or -1
            out[f"{model_block}.enable_gradient_checkpointing"] = s.checkpointing
        else:
            meg = f"{block}.megatron"
            out.update({f"{meg}.tensor_model_parallel_size": s.tp, f"{meg}.pipeline_model_parallel_size": s.pp,
                        f"{meg}.virtual_pipeline_model_parallel_size": s.virtual_stages if s.virtual_stages > 1 else None,
                        f"{meg}.context_parallel_size": s.sp, f"{meg}.use_distributed_optimizer": s.zero == 1})
            if scenario.models[role].moe is not None:  # (the reference's block follows the actor's: ref_megatron.yaml)
                out.update({f"{meg}.expert_model_parallel_size": s.ep,
                            f"{meg}.expert_tensor_parallel_size": s.etp or None})
            if role == "actor" and "ref_inf" in options:  # (it would follow the actor's: written as planned)
                out[REF_MEGATRON_OFFLOAD] = options["ref_inf"].strategy.offload_params
            o = f"{meg}.override_transformer_config"
            out.update({f"{o}.recompute_granularity": "full" if s.checkpointing else None,
                        f"{o}.recompute_method": "uniform" if s.checkpointing else None,
                        f"{o}.recompute_num_layers": 1 if s.checkpointing else None})
    if _fused_of(scenario, engine):
        out[FUSED] = True
    return engine, out


def _fused_of(scenario: Scenario, engine: str) -> bool:
    """use_fused_kernels for the scenario's training.logits: verl's fused kernels where it gives
    theirs (logits_paths, with the scenario's carried settings: the entropy in the update), none where
    it gives none; another way of computing the log-probabilities is refused by name."""
    given = scenario.training.logits
    if not given:
        return False
    settings = resolve(engine, {**{k: v for k, v in scenario.engine_settings.items() if k in known_keys(engine)},
                                FUSED: True})
    try:
        fused = logits_paths(engine, settings, "engine_settings")
    except ConfigError as e:
        raise ConfigError(f"{e.message} ({e.field}, for verl's fused kernels)", "training.logits") from None
    calls = {c.name for c in scenario.dataflow.calls}
    for name in sorted((set(fused) & calls) | set(given)):
        if fused.get(name) != given.get(name):
            raise ConfigError("verl computes the log-probabilities as realbench prices by default, or with its fused "
                              f"kernels ({FUSED}), priced as {fused.get(name)}: not otherwise",
                              f"training.logits.{name}")
    return True


def config_document(engine: str, settings: dict[str, Any]) -> dict:
    """A Hydra primary config that extends verl's ppo_trainer with `settings`."""
    defaults_list: list = ["ppo_trainer"] + ([{"override model_engine": engine}] if engine != "dp" else []) + ["_self_"]
    return {"hydra": {"searchpath": ["pkg://verl.trainer.config"]}, "defaults": defaults_list, **nest(settings)}


def launch_script(config: Path, node_size: Optional[int] = None) -> str:
    """The launch script of a written config: verl's synchronous trainer, or with `node_size` (the
    GPUs of a node its two pools were planned on) the one-step-off entry point."""
    entry = ENTRY if node_size is None else ONE_STEP_OFF_ENTRY
    # (file names as the user gave them, spaces and all: quoted for the shell)
    note = "" if node_size is None else (f"# (its two pools were planned on nodes of {node_size} GPUs: "
                                         f"realbench import verl {shlex.quote(config.name)} --gpus-per-node "
                                         f"{node_size})\n")
    return ("#!/usr/bin/env bash\n"
            f"# verl {VERSION}: the plan realbench wrote as {config.name} (pip install verl=={VERSION})\n" + note +
            'here="$(cd "$(dirname "$0")" && pwd)"\n'
            f'exec {entry} --config-path "$here" --config-name {shlex.quote(config.stem)} "$@"\n')


def config_files(config: Path, engine: str, settings: dict[str, Any],
                 node_size: Optional[int] = None) -> list[tuple[Path, str, int]]:
    """The Hydra config (at `config`) and its launch script (<stem>-launch.sh beside it)."""
    node_size = node_size if ROLLOUT_POOL[0] in settings else None
    return [(config, yaml.safe_dump(config_document(engine, settings), sort_keys=False, width=100), 0o644),
            (config.with_name(config.stem + "-launch.sh"), launch_script(config, node_size), 0o755)]
