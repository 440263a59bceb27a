"""How realbench prices what AReaL runs: the settings it reads (READ), carries unpriced (NEUTRAL,
CAPTURED) and refuses by name (`refuse_unpriced`), the micro-batches AReaL's packer forms as a plan
counts them (`_micro_batches`, over realbench.engines.areal.packer), what of a scenario AReaL cannot
run (`space_problem_of_scenario`), and what is not priced (PRICING_GAPS).
"""

from __future__ import annotations

from typing import Any, Optional

from realbench.engines.areal.packer import StepRows
from realbench.engines.areal.settings import (LORA_KEYS, MODEL_PATHS, OLD_LOGPROBS_KEYS, PROX_INTERPOLATED, PROX_LOGP,
                                              SERVER_CONTEXT, SERVER_MEMORY, defaults)
from realbench.engines.batches import fewest_splits
from realbench.engines.documents import lora_problem, serving_gap
from realbench.errors import ConfigError
from realbench.models import FunctionSpec
from realbench.plan.scenario import Scenario

MEMORY_FRACTION = 0.9
PRICING_GAPS = ("generation pauses while the weights are sent (requests aborted, resumed, re-prefilled); realbench "
                "prices the transfer, not the re-prefill",
                serving_gap("max_running_requests (SGLang) or max_num_seqs (vLLM)",
                            "sglang.mem_fraction_static or vllm.gpu_memory_utilization"))
# rows packed end to end by their real lengths, always (utils/data.py:696-760, pack_tensor_dict):
# realbench's training.padding_free
PADDING_FREE = True
PADDING_SETTABLE = False
# the old log-probabilities (realbench.dataflow.core.OldLogprobs): the rollout's unless the actor
# recomputes them (actor.recompute_logprob), or, under the decoupled loss, its proximal ones
# (actor.use_decoupled_loss), with a forward over the whole batch (api/cli_args.py:1599-1609,
# trainer/rl_trainer.py:680; trainer/ppo/actor.py:178-192 takes the rollout's otherwise)
OLD_LOGPROBS = ("whole_batch", "rollout")
OLD_LOGPROBS_HOW = "from a forward of the actor over the whole batch, or the rollout's"

# settings that change neither time nor memory of a step (names, paths, logging, checkpoints, the
# learning and sampling settings), by prefix: carried as they are, never priced
_ENGINE_NEUTRAL = ("experiment_name", "trial_name", "path", "init_from_scratch", "disable_dropout", "dtype",
                   "optimizer", "eps_clip", "eps_clip_higher", "c_clip", "temperature", "reward_scaling",
                   "reward_bias", "reward_clip", "kl_estimator", "rejection_sampling", "reward_norm", "adv_norm",
                   "discount", "gae_lambda",
                   "mask_no_eos_with_zero", "overlong_reward_penalty", "overlong_tokens", "overlong_penalty_factor",
                   "max_new_tokens", "group_size",
                   "attn_impl", "value_eps_clip", "ppo_n_minibatches", "scheduling_spec", "tokenizer_path",
                   "weight_update_mode", "behave_imp_weight", "dynamic_sampling", "log_agent_stats", "m2_threshold",
                   "importance_sampling_level", "use_sapo_loss", "sapo_", "pad_to_maximum", "is_critic",
                   "fsdp.wrap_policy", "fsdp.memory_efficient_load", "megatron.bridge_type")
NEUTRAL = (("seed", "tokenizer_path", "cluster.fileroot", "cluster.name_resolve.", "cluster.cluster_name",
            "scheduler.", "saver.", "recover.", "evaluator.", "stats_logger.", "perf_tracer.", "memory_profiler.",
            "valid_dataset.", "eval_gconfig.", "total_train_epochs", "total_train_steps", "total_train_n_seqs",
            "experiment_name", "trial_name", "gconfig.temperature", "gconfig.greedy", "gconfig.min_new_tokens",
            "gconfig.top_p", "gconfig.top_k", "gconfig.stop", "gconfig.frequency_penalty", "train_dataset.path",
            "train_dataset.type", "train_dataset.shuffle", "train_dataset.pin_memory", "train_dataset.num_workers",
            "train_dataset.drop_last", "rollout.experiment_name", "rollout.trial_name", "rollout.fileroot",
            "rollout.tokenizer_path", "rollout.dump_to_file", "rollout.enable_rollout_tracing", "rollout.agent.",
            "rollout.scheduling_spec", "rollout.request_timeout", "rollout.request_retries", "rollout.setup_timeout",
            "rollout.pause_grace_period", "rollout.queue_size", "rollout.consumer_batch_size",
            "sglang.model_path", "sglang.random_seed", "sglang.skip_tokenizer_init", "sglang.dtype",
            "sglang.log_level", "sglang.disable_radix_cache",
            "vllm.model", "vllm.seed", "vllm.skip_tokenizer_init", "vllm.dtype",
            "vllm.enforce_eager", "vllm.no_enable_prefix_caching",
            # the server taking images: a vision-language model's, priced by its image tokens (import's
            # --image-tokens), which a language model's prompts do not have
            "sglang.enable_multimodal",
            # vLLM keeping the model's sliding windows (AReaL's default disables them): as realbench
            # prices a model, its windows where its config has them
            "vllm.disable_sliding_window",
            # the servers' side of the actor's LoRA (what the adapters need there, not a cost of their own)
            "rollout.use_lora", "sglang.enable_lora", "sglang.max_lora_rank", "vllm.enable_lora", "vllm.max_lora_rank",
            "gconfig.lora_name")
           + tuple(f"{role}.{k}" for role in ("actor", "ref", "critic") for k in _ENGINE_NEUTRAL))
# the NEUTRAL settings realbench reads into the scenario and writes from it (engines.carried_problem)
CAPTURED = tuple(MODEL_PATHS.values())
# read settings carried at these values (engines.carried_settings): the interpolated proximal
# log-probabilities, which the writer writes back beside the rollout's (PROX_LOGP)
CARRIED_VALUES = {PROX_LOGP: (PROX_INTERPOLATED,)}
REQUIRED: dict[str, str] = {}  # (carried settings no plan needs otherwise)

READ = {"cluster.n_nodes", "cluster.n_gpus_per_node", "actor.backend", "rollout.backend", "ref.backend",
        "critic.backend", "ref.scheduling_strategy.type", "ref.scheduling_strategy.target",
        "critic.scheduling_strategy.type", "critic.scheduling_strategy.target", "actor.scheduling_spec",
        "actor.kl_ctl", "actor.gradient_checkpointing", "ref.gradient_checkpointing", "critic.gradient_checkpointing",
        "actor.mb_spec.n_mbs", "actor.mb_spec.max_tokens_per_mb", "ref.mb_spec.n_mbs", "ref.mb_spec.max_tokens_per_mb",
        "critic.mb_spec.n_mbs", "critic.mb_spec.max_tokens_per_mb", "actor.megatron.virtual_pipeline_parallel_size",
        "actor.megatron.ddp.use_distributed_optimizer", "ref.megatron.virtual_pipeline_parallel_size",
        "critic.megatron.virtual_pipeline_parallel_size", "critic.megatron.ddp.use_distributed_optimizer",
        "rollout.max_head_offpolicyness", "rollout.max_concurrent_rollouts", "sglang.max_running_requests",
        "vllm.max_num_seqs", "gconfig.n_samples", "gconfig.max_new_tokens", "gconfig.max_tokens",
        "train_dataset.batch_size", "train_dataset.max_length", "actor.ppo_n_minibatches",
        "actor.reward_norm.mean_leave1out", "actor.use_lora", "actor.peft_type", *LORA_KEYS.values(),
        *OLD_LOGPROBS_KEYS, *SERVER_MEMORY.values(), *SERVER_CONTEXT.values()}


def refuse_unpriced(settings: dict[str, Any], given: set[str], source: str) -> None:
    for key in sorted(given):
        if key in READ or key.startswith(NEUTRAL):
            continue
        raise ConfigError(f"{settings.get(key)!r} (AReaL's default {defaults().get(key)!r}) changes what AReaL runs, "
                          "and realbench does not price it", key, source)


def _micro_batches(step: StepRows, rows: int, ranks: int, n_mbs: Optional[int], budget: Optional[int],
                   pp: int) -> int:
    """A GPU's micro-batches of a call of `rows` a GPU on `ranks` data-parallel ranks as AReaL's
    packer forms them (realbench.engines.areal.packer) under an mb_spec: at least n_mbs, within
    max_tokens_per_mb (unset: no budget, utils/data.py:711-714), a Megatron pipeline at least 2 pp
    and a multiple of pp; on average over the steps drawn, the nearest whole count, as the fewest
    even splits of the rows at least as many (realbench's plans split a GPU's rows evenly)."""
    m = max(1, round(step.micro_batches(rows, ranks, int(n_mbs or 1), None if budget is None else int(budget), pp)))
    return fewest_splits(rows, m, pp) or rows


# AReaL's group normalization of GRPO (reward_norm mean_level group, utils/data.py:1378-1500, Normalization)
# centres a group of one on itself: advantage 0, where realbench (and verl) take its reward as its
# advantage; its RLOO (mean_leave1out) takes mean 0 for a group of one, as realbench does
GROUP_OF_ONE = ("GRPO's group of one: AReaL centres it on itself (advantage 0, utils/data.py:1422-1448), where "
                "realbench takes its reward as its advantage: 2 or more")


def space_problem_of_scenario(scenario: Scenario) -> Optional[tuple[str, str]]:
    """What of a scenario (not of a plan) AReaL cannot run: the algorithm, a reward model, passes
    over a batch, LoRA, rows padded."""
    if scenario.algorithm not in ("ppo", "grpo", "rloo"):
        return "scenario.algorithm", f"realbench writes AReaL's PPO, GRPO and RLOO, not {scenario.algorithm}"
    if "teacher_inf" in scenario.dataflow.call_names:
        return "dataflow.with_teacher", ("on-policy distillation (a teacher's log-probabilities in the actor's loss): "
                                         "realbench reads and writes verl's, not AReaL's")
    if not isinstance(scenario.models.get("reward"), FunctionSpec):
        return "models.reward", ("AReaL scores with a Python function in its rollout workflow (workflow/rlvr.py:95-108); "
                                 "its trainer runs no reward model")
    if scenario.training.num_iterations != 1:
        return "training.num_iterations", "AReaL passes over a batch once (actor.ppo_n_minibatches optimizer steps)"
    if scenario.algorithm == "grpo" and scenario.dataflow.call("actor_gen").group_size == 1:
        return "group_size", f"1: {GROUP_OF_ONE}"
    if scenario.engine_settings.get(PROX_LOGP) == PROX_INTERPOLATED and scenario.training.old_logprobs != "rollout":
        return f"engine_settings.{PROX_LOGP}", (f"{PROX_INTERPOLATED!r} with old_logprobs "
                                                f"{scenario.training.old_logprobs}: AReaL then runs no forward for the "
                                                "proximal log-probabilities (priced with old_logprobs rollout)")
    problem = lora_problem(scenario, "AReaL")
    given = "padding_free" in scenario.training.model_fields_set  # (a job made for AReaL packs: priced_as)
    if problem is None and scenario.engine == "areal" and given and not scenario.training.padding_free:
        return "training.padding_free", "AReaL packs the rows by their real lengths, always (utils/data.py:696-760)"
    return problem
