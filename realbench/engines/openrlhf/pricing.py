"""How realbench prices what OpenRLHF runs: the flags it reads (READ), carries unpriced (NEUTRAL,
CAPTURED) and refuses by name where changed from their defaults (`refuse_unpriced`), what of a
scenario OpenRLHF cannot run (`space_problem_of_scenario`), and what is not priced (EXPERTS,
PRICING_GAPS).
"""

from __future__ import annotations

from typing import Any, Optional

from realbench.engines.documents import lora_problem, serving_gap
from realbench.engines.openrlhf.settings import (ADAM_OFFLOAD, ESTIMATORS, LORA_FLAGS, MEMORY, PACKING, RING, SLEEP,
                                                 defaults)
from realbench.errors import ConfigError
from realbench.plan.scenario import Scenario

# A mixture of experts: OpenRLHF 0.11.2 has no expert parallelism. DeepSpeed's ZeRO shards the experts as
# any weight (under AutoTP priced split as tp splits a dense MLP; --ds.experts_implementation only picks
# transformers' kernel for them, passed to from_pretrained: trainer/ray/ppo_actor.py:516), and the vLLM
# engines it starts get no enable_expert_parallel (trainer/ray/vllm_engine.py:264-280): a plan's ep 1,
# its etp tp's. Its search offers no
# other layout, and a plan with one is refused by name on export. (--actor.aux_loss_coef, the
# load-balancing loss through output_router_logits, is refused by name on import: not priced.)
EXPERTS = ("OpenRLHF 0.11.2 has no expert parallelism: DeepSpeed shards a mixture of experts' experts as any weight "
           "and its vLLM engines run without enable_expert_parallel (trainer/ray/vllm_engine.py:264-280): ep 1, "
           "etp tp's")

MEMORY_FRACTION = 0.5
# (the actor's old-log-probability forward runs beside the reference's and critic's: priced so,
# realbench.cost.simulate.EARLY_OLD_LOGPROBS_ENGINES)
PRICING_GAPS = ("the weights reach vLLM tensor by tensor (a Ray call each); realbench prices the bytes, not the calls",
                serving_gap("vLLM's max_num_seqs", "--vllm.gpu_memory_utilization"))

# the old log-probabilities (realbench.dataflow.core.OldLogprobs): always a forward of the actor's
# DeepSpeed engine over the whole batch, dispatched with the reference's and critic's
# (trainer/ppo_utils/experience_maker.py:153-158); the rollout's serve importance-sampling corrections only
OLD_LOGPROBS = ("whole_batch",)
OLD_LOGPROBS_HOW = ("from a forward of the actor over the whole batch, always "
                    "(openrlhf/trainer/ppo_utils/experience_maker.py:153-158)")

# flags that change neither time nor memory of a step (names, paths, logging, checkpoints, the
# learning and sampling settings), by prefix: carried as they are, never priced
NEUTRAL = ("actor.model_name_or_path", "critic.model_name_or_path", "reward.model_name_or_path", "data.prompt_dataset",
           "data.input_key", "data.label_key", "data.apply_chat_template", "data.prompt_split", "data.prompt_probs",
           "data.input_template", "data.eval_", "data.max_samples", "data.tokenizer_chat_template", "ckpt.", "logger.",
           "eval.", "train.seed", "train.num_episodes", "train.full_determinism_enable", "actor.adam.", "critic.adam.",
           "actor.optim", "critic.optim", "actor.lr_", "critic.lr_", "actor.max_norm", "critic.max_norm",
           "actor.l2", "critic.l2", "actor.eps_clip", "critic.value_clip", "actor.entropy", "actor.policy_loss",
           "actor.muon.", "critic.muon.", "algo.kl.", "algo.advantage.gamma", "algo.advantage.lambd",
           "algo.advantage.no_std_norm", "algo.advantage.is_correction", "reward.clip_range", "reward.normalize",
           "reward.overlong", "reward.stop_properly_penalty", "rollout.temperature", "rollout.top_p",
           "vllm.enforce_eager", "vllm.enable_prefix_caching", "vllm.sync_backend",
           "vllm.enable_sleep", "ds.param_dtype", "ds.attn_implementation",
           "ds.overlap_comm", "ds.grad_accum_dtype", "ds.disable_fast_tokenizer", "ds.zpg", "critic.save_value_network",
           "critic.freezing_steps", "actor.value_head_prefix", "critic.value_head_prefix", "reward.value_head_prefix",
           "ds.local_rank", "train.use_wandb")
# the NEUTRAL flags realbench reads into the scenario and writes from it (engines.carried_problem)
CAPTURED = ("actor.model_name_or_path", "critic.model_name_or_path", "reward.model_name_or_path")
REQUIRED: dict[str, str] = {}  # (carried flags no plan needs otherwise)
# rows packed without padding (--ds.packing_samples, off by default: cli/train_ppo_ray.py; the
# experience maker packs each micro-batch's sequences end to end); realbench's training.padding_free
PADDING_FREE = False

READ = {"ref.num_nodes", "ref.num_gpus_per_node", "reward.num_nodes", "reward.num_gpus_per_node", "critic.num_nodes",
        "critic.num_gpus_per_node", "actor.num_nodes", "actor.num_gpus_per_node", "train.colocate_actor_ref",
        "train.colocate_critic_reward", "train.colocate_all", "vllm.num_engines", "vllm.tensor_parallel_size",
        "ds.zero_stage", "ds.tensor_parallel_size", "actor.gradient_checkpointing_enable",
        "train.dynamic_batch_enable", "rollout.max_tokens_per_gpu", "train.max_tokens_per_gpu", "rollout.batch_size",
        "rollout.micro_batch_size", "train.max_epochs", "data.max_len", "rollout.max_new_tokens",
        "train.micro_batch_size", "train.batch_size", "rollout.n_samples_per_prompt", "algo.advantage.estimator",
        "reward.remote_url", "train.async_enable", "train.async_queue_size", *LORA_FLAGS.values(), "ds.lora.dropout",
        PACKING, SLEEP, ADAM_OFFLOAD, MEMORY, RING}


def _changed(settings: dict[str, Any]) -> set[str]:
    """The dests whose value differs from OpenRLHF's default (a tuple equal to a listed default is not)."""
    base = defaults()
    return {k for k, v in settings.items() if v != base.get(k) and not (isinstance(v, tuple) and list(v) == base[k])}


def refuse_unpriced(settings: dict[str, Any], given: set[str], source: str) -> None:
    for key in sorted(given):
        if key in READ or key.startswith(NEUTRAL):
            continue
        raise ConfigError(f"{settings[key]!r} (OpenRLHF's default {defaults().get(key)!r}) changes what OpenRLHF runs, "
                          "and realbench does not price it", f"--{key}", source)


# OpenRLHF's group_norm and rloo divide by a group of one's spread and by n - 1: NaN advantages
# (trainer/ppo_utils/experience_maker.py:268-274), where realbench takes its reward as its advantage
GROUP_OF_ONE = ("GRPO and RLOO compare a prompt's samples in OpenRLHF (a group of one divides by its std, or by n - 1: "
                "NaN), where realbench takes a group of one's reward as its advantage: 2 or more")


def space_problem_of_scenario(scenario: Scenario) -> Optional[tuple[str, str]]:
    """What of a scenario (not of a plan) OpenRLHF cannot run: the algorithm, a LoRA critic, the
    rollout's server, the old log-probabilities."""
    if scenario.algorithm not in ESTIMATORS.values():
        return "scenario.algorithm", f"realbench writes OpenRLHF's PPO, GRPO and RLOO, not {scenario.algorithm}"
    if "teacher_inf" in scenario.dataflow.call_names:
        return "dataflow.with_teacher", ("on-policy distillation (a teacher's log-probabilities in the actor's loss): "
                                         "realbench reads and writes verl's, not OpenRLHF's")
    if scenario.algorithm != "ppo" and scenario.dataflow.call("actor_gen").group_size == 1:
        return "group_size", f"1: {GROUP_OF_ONE}"
    if scenario.models["actor"].lora is not None and "critic" in scenario.models:
        return "models.actor.lora", ("OpenRLHF wraps the critic in the actor's adapters (--ds.lora.*, "
                                     "trainer/ray/ppo_critic.py:201-204): realbench writes its LoRA for GRPO and RLOO")
    if scenario.rollout_server not in (None, "vllm"):
        return "rollout_server", "OpenRLHF generates with vLLM only (trainer/ppo_utils/samples_generator.py:195-241)"
    if scenario.training.old_logprobs not in OLD_LOGPROBS + ("later_steps",):
        return "training.old_logprobs", f"OpenRLHF takes the old log-probabilities {OLD_LOGPROBS_HOW}"
    return lora_problem(scenario, "OpenRLHF")
