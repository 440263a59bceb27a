"""How realbench prices what verl runs: the settings it reads (READ), carries unpriced
(NEUTRAL, CAPTURED, CARRIED_VALUES) and refuses by name (`refuse_unpriced`), those verl reads to no
effect (`unread`), the log-probabilities' ways (`logits_paths`), the micro-batches verl's dynamic
batching forms as a plan counts them (`_formed`, over realbench.engines.verl.packer), the weight
sync's buffer (`sync_buffer_problem`), what of a scenario verl cannot run
(`space_problem_of_scenario`), and what is not priced (PRICING_GAPS).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from realbench.cost.calls import served_share_beyond_weights, serving_cache_problem, serving_slots
from realbench.dataflow.core import LogitsPath
from realbench.engines.batches import StepRows, ceil_at_least_one, fewest_splits
from realbench.engines.documents import budget_row, lora_problem, packs, serving_gap
from realbench.engines.verl.packer import mean_count
from realbench.engines.verl.settings import (A, ADAPTER_PATH, BUCKET, BUCKET_MB, BYPASS, CAPTURE_SIZES, CRITIC_BUDGET,
                                             CRITIC_SP_UNREAD, CUDAGRAPH_MODE, DECODE_CAPTURED, DTYPE_NAMES,
                                             ENGINE_BLOCK, ENTROPY_SETTINGS, ESTIMATOR, ESTIMATORS, EXPERT_KEYS,
                                             FREE_CACHE, FSDP_SIZE, FUSED, FUSED_BACKEND, FUSED_KERNELS, HYBRID,
                                             LAYERED_SUMMON, LORA_EXCLUDE, LORA_KEYS, LORA_MERGE, MAX_MODEL_LEN,
                                             MEGATRON_BLOCKS, MEMORY,
                                             MIRRORED, MIXED_PRECISION, MIXED_PRECISION_BLOCKS, MODEL_PATHS, OFFLOAD_BLOCK,
                                             ONE_STEP_OFF, OPEN_SECTIONS, R, REF_MEGATRON_OFFLOAD, REMOVE_PADDING, RM,
                                             ROLE_BLOCK, ROLLOUT_DP, ROLLOUT_EP, ROLLOUT_POOL, ROUTER_SETTINGS,
                                             SAME_CALLS, SEQUENCE_PARALLEL, STRATEGY, TEACHER, TEACHER_SERVER,
                                             TRANSFORMER, TRANSFORMER_CARRIED, DISTILL,
                                             V1_KEYS, VERSION, defaults, resolve)
from realbench.errors import ConfigError
from realbench.models import FunctionSpec
from realbench.plan.mesh import Option
from realbench.plan.options import served_call
from realbench.plan.scenario import Scenario

# READ settings carried where their value is one of these (engines.carried_settings)
CARRIED_VALUES = {ESTIMATOR: tuple(SAME_CALLS), LAYERED_SUMMON: (True,), CUDAGRAPH_MODE: DECODE_CAPTURED}


def unread(engine: str, settings: dict[str, Any], given: set[str]) -> list[str]:
    """The given settings verl does not read, or reads to no effect on what it runs (IGNORED_BY_VERL,
    and the entropy's settings where nothing computes the entropy they shape: _entropy_unread),
    each with what verl runs instead."""
    ignored = {**IGNORED_BY_VERL, **_entropy_unread(engine, settings)}
    if ROLLOUT_POOL[0] in settings:  # (the one-step-off entry reads the critic's budgets: a critic is refused there)
        ignored = {k: why for k, why in ignored.items() if not k.startswith("critic.")}
    budget = repr(settings.get(CRITIC_BUDGET))
    return [f"{k}={settings[k]!r}: {ignored[k].replace('{budget}', budget)}" for k in sorted(given) if k in ignored]


# settings verl's config holds and its synchronous V1 trainer does not read: the critic's budgets
# (it packs both critic calls to CRITIC_BUDGET, trainer/ppo/v1/trainer_base.py:266-268; the
# one-step-off entry's legacy trainer reads the first, and a critic is refused there)
_CRITIC_BUDGETS = (f"verl {VERSION}'s trainer does not read it; it packs both critic calls to {CRITIC_BUDGET}="
                   "{budget} (trainer/ppo/v1/trainer_base.py:266-268), as realbench prices them")
# and the role-level use_torch_compile: verl's FSDP engine compiles the entropy by its engine config's
# (fsdp_config.use_torch_compile, trainer/config/engine/fsdp.yaml:54, which does not follow it;
# workers/engine/fsdp/transformer_impl.py:182-186), its Megatron engine not at all (vocab_parallel_entropy)
_COMPILE = ("verl {version}'s engines do not read it: the FSDP engine compiles the entropy by {block}.use_torch_compile "
            "(trainer/config/engine/fsdp.yaml:54), the Megatron engine computes it uncompiled")
# and the critic's role-level Ulysses size: verl 0.9.1 builds the critic's engine from critic.fsdp
# alone (FSDPCriticConfig copies nothing from the role, workers/config/critic.py), so its critic runs
# without sequence parallelism unless the engine's own key is set
_CRITIC_SP = (f"verl {VERSION}'s critic engine does not read it (FSDPCriticConfig copies nothing to its engine, "
              f"verl/workers/config/critic.py): the critic runs with {SEQUENCE_PARALLEL['critic'][1]}, as realbench "
              "prices it")
IGNORED_BY_VERL = {"critic.ppo_max_token_len_per_gpu": _CRITIC_BUDGETS,
                   CRITIC_SP_UNREAD: _CRITIC_SP,
                   "critic.forward_max_token_len_per_gpu": _CRITIC_BUDGETS,
                   f"{A}.use_torch_compile": _COMPILE.format(version=VERSION, block=f"{A}.fsdp_config"),
                   "actor_rollout_ref.ref.use_torch_compile": _COMPILE.format(
                       version=VERSION, block="actor_rollout_ref.ref.fsdp_config"),
                   # (RolloutConfig holds it, workers/config/rollout.py:216; nothing in verl reads it: the
                   # rollout wakes its weights and KV cache as it would without it)
                   f"{R}.multi_stage_wake_up": f"verl {VERSION} holds it and reads it nowhere: the rollout wakes "
                                               "up as without it"}

# -- the log-probabilities over the vocabulary (CallDef.logits) --------------------------------------
# verl's FSDP engine computes a micro-batch's log-probabilities from the model's bf16 logits, divided
# by the temperature (workers/engine/fsdp/transformer_impl.py:1345-1395); the actor's forward for the
# old log-probabilities computes the entropy too (trainer/ppo/v1/trainer_base.py:1545-1552), the
# reference's never (:1591-1598), the actor's update only with entropy_coeff != 0 or calculate_entropy
# (:1726-1728). realbench prices the logits as its runtime holds them (realbench.cost.calls: 4 bytes
# a logit in a forward, 8 in training), and reads the settings that change that path:
#   use_fused_kernels (actor_rollout_ref.model's, the actor's and the reference's engines,
#   workers/engine_workers.py:114): the output layer, the log-probabilities and the entropy of
#   FUSED_CHUNK tokens at a time in fp32, never the micro-batch's logits, and each chunk's logits
#   computed again in the backward (models/transformers/dense_common.py:71-136,
#   utils/experimental/torch_functional.py: FusedLinearForPPO, its torch backend, verl's default
#   fused_kernel_options.impl_backend). FUSED_*_BYTES: the bytes a chunk's logit holds at a forward's
#   peak (its fp32 logits, softmax and one temporary: 12) and at a backward's (the recomputed logits,
#   softmax, one-hot, their difference and the gradient's terms: 28 with the entropy's gradient,
#   20 without), measured running verl's own kernel (check.py fused); and the element-wise
#   bytes a logit moves in its forward, counted op by op in _fused_linear_for_ppo_fwd as run eagerly
#   (divide 4, fp32 cast 6, softmax 8, logsumexp 24, probabilities x logits 12 and their sum 4, the
#   cross-entropy 4: 62; its backward is priced at twice that plus the recomputed forward, 186 where
#   the op count of _fused_linear_for_ppo_bwd is 148). The Triton backend and Megatron's fused forward
#   (models/mcore/model_forward_fused.py) are other kernels, refused by name.
#   entropy_from_logits_with_chunking / entropy_checkpointing (the engine config's, which follows the
#   role's): they shape the entropy's computation. The actor's forward-only pass holds no more
#   chunked than whole (never its train call's peak, which its update sets), so they are priced as
#   they run where the update computes no entropy; with an entropy in the update (each chunk's fp32
#   copy and softmax kept for the backward, or recomputed there) they are refused by name. The
#   reference computes no entropy, and under the fused kernels nothing reads them: said on import
#   (`unread`), carried as given.
FUSED_CHUNK = 512  # FusedLinearForPPO's chunk_size (utils/experimental/torch_functional.py)
FUSED_FORWARD_BYTES, FUSED_TRAIN_BYTES, FUSED_TRAIN_BYTES_NO_ENTROPY, FUSED_MOVED_BYTES = 12.0, 28.0, 20.0, 62.0


def _entropy_in_update(s: dict[str, Any]) -> bool:
    """Whether the actor's update computes the entropy (trainer/ppo/v1/trainer_base.py:1726-1728)."""
    return bool(s[f"{A}.calculate_entropy"]) or float(s[f"{A}.entropy_coeff"]) != 0.0


def _entropy_keys(engine: str, role: str) -> list[str]:
    return [f"{block}.{k}" for block in (ROLE_BLOCK[role], ENGINE_BLOCK[engine][role]) for k in ENTROPY_SETTINGS]


def _entropy_unread(engine: str, s: dict[str, Any]) -> dict[str, str]:
    """The entropy's settings verl reads to no effect, with why: the reference's (it computes no
    entropy) and, under the fused kernels, the actor's (the kernels compute it)."""
    out = {k: "the reference computes no entropy (verl/trainer/ppo/v1/trainer_base.py:1591-1598)"
           for k in _entropy_keys(engine, "ref")}
    if s.get(FUSED):
        out.update({k: f"{FUSED} computes the entropy in its own kernels, which nothing else reads "
                       "(workers/engine/fsdp/transformer_impl.py:1333-1343)" for k in _entropy_keys(engine, "actor")})
    return out


def logits_paths(engine: str, s: dict[str, Any], source: str) -> dict[str, LogitsPath]:
    """How verl computes the actor's and the reference's log-probabilities, by call
    (training.logits: only where it holds them otherwise than realbench prices by default), or a
    ConfigError naming a setting whose way realbench does not price."""
    actor_block = ENGINE_BLOCK[engine]["actor"]
    if s[FUSED]:
        if engine == "megatron":
            raise ConfigError("True with model_engine megatron: Megatron's fused forward (verl/models/mcore/"
                              "model_forward_fused.py, Triton kernels) is not priced; FSDP's torch backend is",
                              FUSED, source)
        if s[FUSED_BACKEND] != "torch":
            raise ConfigError(f"{s[FUSED_BACKEND]!r}: the Triton kernels (verl/utils/kernel/linear_cross_entropy.py) "
                              "are not priced; their torch backend is", FUSED_BACKEND, source)
        train = FUSED_TRAIN_BYTES if _entropy_in_update(s) else FUSED_TRAIN_BYTES_NO_ENTROPY
        path = dict(forward_bytes=FUSED_FORWARD_BYTES, moved_bytes=FUSED_MOVED_BYTES, chunk_tokens=FUSED_CHUNK,
                    recomputed=True)
        return {"actor_train": LogitsPath(**path, train_bytes=train), "ref_inf": LogitsPath(**path)}
    if _entropy_in_update(s):
        for k in ("entropy_from_logits_with_chunking", "entropy_checkpointing"):
            if s[f"{actor_block}.{k}"]:
                raise ConfigError(f"True with an entropy in the actor's update ({A}.entropy_coeff "
                                  f"{s[f'{A}.entropy_coeff']!r}): what it keeps for the backward is not priced",
                                  f"{actor_block}.{k}", source)
    return {}


# sections realbench prices no part of, whose keys a job may add (verl's teachers, by name, with `+`)
UNPRICED_SECTIONS = {f"{DISTILL}.teacher_models.": (f"a teacher beside {TEACHER}: several teachers, each scoring the "
                                                     f"rows of its own data sources ({DISTILL}.teacher_key), whose "
                                                     "shares of a batch realbench does not know")}

PRICING_GAPS = ("with use_dynamic_bsz the micro-batches verl forms (realbench.engines.verl.packer, its mean count "
                "over steps drawn from the response lengths) are priced as that many equal ones, each holding a "
                "GPU's rows evenly; verl's are unequal (its workload-balanced partition), and memory is planned for "
                "one as full as the budget",
                "a reward model on its own pool scores each response as its generation ends (verl's reward "
                "loop); realbench scores the batch after generation, beside the reference's and critic's "
                "forwards on the trainer's GPUs: a step at most the reward call's time too long",
                "a distillation teacher scores each sequence as its generation ends (verl's agent loop); realbench "
                "scores the batch after generation: a step at most the teacher call's time too long",
                serving_gap("max_num_seqs", "gpu_memory_utilization"),
                "an actor whose parameters are offloaded (param_offload) brings them in for the weight sync, priced "
                "in time over the host link, not in memory: the sync holds them beside the rollout's weights, with "
                "its KV cache released")
DYNAMIC_GAP, POOL_GAP, TEACHER_GAP, SERVING_GAP, OFFLOAD_SYNC_GAP = PRICING_GAPS


def gaps_of(scenario: Scenario, options: dict[str, Option]) -> tuple[str, ...]:
    """The PRICING_GAPS a plan meets: a reward model's own pool, a distillation teacher and an
    actor's parameter offload only where the plan has them (dynamic batching is not told apart in a
    plan: always said)."""
    pool = (not isinstance(scenario.models.get("reward"), FunctionSpec) and "reward_inf" in options
            and options["reward_inf"].mesh != options["actor_train"].mesh)
    meets = {POOL_GAP: pool, TEACHER_GAP: "teacher_inf" in options,
             OFFLOAD_SYNC_GAP: options["actor_train"].strategy.offload_params}
    return tuple(gap for gap in PRICING_GAPS if meets.get(gap, True))


# verl's FSDP engine keeps a forward-only model's (the reference's) parameters in host memory, in its
# fp32 model_dtype, and brings each unit's shard in for every forward (CPUOffload(offload_params=True),
# workers/engine/fsdp/transformer_impl.py:429-435, 258-264; FSDP2: CPUOffloadPolicy, :455-463):
# Strategy.offload_params, priced by realbench.cost.sharding; the critic's values use its training engine
FORWARD_OFFLOAD = ("verl's FSDP engine offloads the reference's parameters, and only the reference's, to the CPU "
                   "(verl/workers/engine/fsdp/transformer_impl.py:429-435): offload_params on ref_inf exactly")
# the old log-probabilities (realbench.dataflow.core.OldLogprobs): a forward of the actor over the
# whole batch (trainer/ppo/v1/trainer_base.py:1650-1670), or with algorithm.rollout_correction.bypass_mode
# the rollout's (:1640-1648; the rollout returns them with rollout.calculate_log_probs)
OLD_LOGPROBS = ("whole_batch", "rollout")
OLD_LOGPROBS_HOW = "from a forward of the actor over the whole batch, or the rollout's (bypass_mode)"

MEMORY_FRACTION = 0.5

# the NEUTRAL settings realbench reads into the scenario and writes from it (engines.carried_problem)
CAPTURED = (*sorted(set(MODEL_PATHS.values())), "reward.custom_reward_function.", ADAPTER_PATH)
# carried settings the plan may need otherwise (engines.with_carried)
REQUIRED = {f"{R}.calculate_log_probs": f"{BYPASS} reads generation's log-probabilities"}
# rows packed without padding (the models' flash-attention varlen path), verl's default for both
# (trainer/config/model/hf_model.yaml, critic/dp_critic.yaml: use_remove_padding true);
# realbench's training.padding_free, with the block set apart in training.padded_models (the
# actor's block holds the actor and its reference, the critic's the critic)
PADDING_FREE = True

# settings that change neither time nor memory of a step (names, paths, logging, checkpoints,
# the learning and sampling settings), by prefix: carried as they are, never priced (the serving
# engines' memory fractions too, which bound a replica's sequences only where its KV cache is
# short of them: a PRICING_GAPS entry)
NEUTRAL = ("trainer.project_name", "trainer.experiment_name", "trainer.logger", "trainer.default_local_dir",
           "trainer.save_freq", "trainer.test_freq", "trainer.total_epochs", "trainer.total_training_steps",
           "trainer.val_before_train", "trainer.resume_mode", "trainer.resume_from_path", "trainer.log_val_generations",
           "trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep", "trainer.default_hdfs_dir",
           "trainer.seed", *STRATEGY.values(), "data.train_files", "data.val_files", "data.prompt_key", "data.reward_fn_key",
           "data.shuffle", "data.seed", "data.filter_overlong_prompts", "data.truncation", "data.return_raw_chat",
           "data.tokenizer", "data.dataloader_num_workers", "data.val_batch_size",
           "actor_rollout_ref.model.path", "critic.model.path", "critic.model.tokenizer_path",
           # (verl's V1 trainer packs both critic calls to critic.ppo_infer_max_token_len_per_gpu and reads
           # neither of these, trainer/ppo/v1/trainer_base.py:266-268: IGNORED_BY_VERL says so on import)
           *IGNORED_BY_VERL,
           BUCKET,  # (read by sync_buffer_problem, carried as given)
           *OPEN_SECTIONS,
           # (the entropy's: what they may change is checked where a plan is read and written, logits_paths)
           *(k for engine in ENGINE_BLOCK for role in ROLE_BLOCK for k in _entropy_keys(engine, role)),
           # (verl's FSDP offloads a forward-only model whatever these say, and it has no optimizer:
           # FORWARD_OFFLOAD; transformer_impl.py:431-435, 459-463)
           *(f"actor_rollout_ref.ref.fsdp_config.{k}"
             for k in ("param_offload", "optimizer_offload", "offload_policy")),
           # (FSDP1's constructor arguments that change neither bytes nor FLOPs, transformer_impl.py:437-448,
           # unread by FSDP2: forward_prefetch issues the next layer's forward all-gather before the
           # current layer computes, which helps a CPU-bound loop only; realbench prices the gathers
           # prefetched behind compute already (realbench.cost.sharding). use_orig_params exposes the
           # original parameters as views of the same flat shards)
           *(f"{block}.{k}" for block in (f"{A}.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp")
             for k in ("forward_prefetch", "use_orig_params")),
           "actor_rollout_ref.model.trust_remote_code", "critic.model.trust_remote_code", "data.trust_remote_code",
           # (the checkpoint copied to /dev/shm before it is loaded, once at start-up: verl/workers/config/
           # model.py:156-179, copy_to_local; no step reads it)
           "actor_rollout_ref.model.use_shm", "critic.model.use_shm",
           # (how long a collective may wait before the job fails: a bound, not a cost)
           "actor_rollout_ref.nccl_timeout", "critic.nccl_timeout",
           # (where a Megatron engine loads its first weights from, and the format its checkpoints
           # are saved in: Megatron's distributed checkpoints, workers/engine/megatron/transformer_impl.py:
           # 499-502, 643; before the first step and at save_freq, neither priced)
           *(f"{block}.{k}" for block in MEGATRON_BLOCKS.values()
             for k in ("use_dist_checkpointing", "dist_checkpointing_path")),
           f"{A}.optim.", "critic.optim.", f"{A}.clip_ratio", f"{A}.entropy_coeff", f"{A}.loss_agg_mode",
           f"{A}.grad_clip", "critic.grad_clip", "critic.cliprange_value", f"{A}.kl_loss_coef", f"{A}.kl_loss_type",
           "algorithm.kl_ctrl.", "algorithm.kl_penalty", "algorithm.gamma", "algorithm.lam",
           "algorithm.norm_adv_by_std_in_grpo", f"{R}.temperature", f"{R}.top_p", f"{R}.top_k",
           f"{R}.val_kwargs.",
           # (the policy loss's mode and coefficients: another function of the same tensors, the old
           # log-probabilities computed whatever it is: workers/utils/losses.py:86-111,
           # trainer/ppo/v1/trainer_base.py:584-586)
           f"{A}.policy_loss.",
           # (rollout correction: importance weights of the rollout's log-probabilities against the old
           # ones, and rejection masks, computed element-wise over the response tokens on the driver
           # beside the advantages (trainer/ppo/v1/trainer_base.py:1765-1772, rollout_corr_helper.py),
           # from log-probabilities the calls already return (rollout.calculate_log_probs, carried);
           # its bypass_mode is READ: it takes the old log-probabilities from the rollout instead)
           "algorithm.rollout_correction.",
           # (vLLM's captured decode batches: checked against every plan's slots, graph_capture_problem)
           *CAPTURE_SIZES,
           f"{R}.enable_chunked_prefill", f"{R}.enable_prefix_caching", f"{R}.max_num_batched_tokens",
           f"{R}.dtype", f"{R}.load_format", f"{R}.calculate_log_probs", f"{R}.log_prob_micro_batch_size_per_gpu",
           f"{R}.log_prob_use_dynamic_bsz", f"{R}.log_prob_max_token_len_per_gpu",
           "reward.custom_reward_function.", "reward.reward_manager", "reward.num_workers",
           f"{RM}.rollout.gpu_memory_utilization", f"{RM}.rollout.enforce_eager", f"{RM}.rollout.free_cache_engine",
           f"{RM}.rollout.dtype", f"{RM}.rollout.max_num_batched_tokens",
           # (on-policy distillation: the loss's settings, another function of the same log-probabilities,
           # the teacher's top-k of them computed by its server whatever it is, but use_chunked_topk, which
           # the reader refuses; the teacher's server as the reward model's; its num_replicas, which verl
           # sets from the pool for a single teacher, workers/config/distillation.py:_resolve_teacher_models)
           f"{DISTILL}.distillation_loss.", f"{DISTILL}.teacher_key", f"{TEACHER}.key", f"{TEACHER}.num_replicas",
           *(f"{TEACHER_SERVER}.{k}" for k in ("gpu_memory_utilization", "enforce_eager", "free_cache_engine", "dtype",
                                               "enable_chunked_prefill", "enable_prefix_caching", "load_format",
                                               "temperature", "disable_log_stats", "skip_tokenizer_init",
                                               "cudagraph_capture_sizes", "max_model_len", "prompt_length",
                                               "response_length", "limit_images")),
           f"{A}.checkpoint.", "critic.checkpoint.", "ray_kwargs.", "global_profiler.", f"{A}.profiler.",
           "critic.profiler.", f"{R}.profiler.", "actor_rollout_ref.ref.profiler.",
           # (Megatron's fused kernels and router settings, once their values are checked: refuse_unpriced)
           *TRANSFORMER_CARRIED)


# fields refused with their reason (the rest of TransformerConfig: PASSED_THROUGH's)
TRANSFORMER_REFUSED = {
    **{f: "stages of unequal layer counts: realbench divides a model's layers evenly over its pipeline's stages"
       for f in ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                 "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                 "pipeline_model_parallel_layout")},
    "moe_enable_deepep": "DeepEP's dispatch kernels: realbench prices the all-to-all dispatch of Megatron's alltoall "
                         "dispatcher (moe_token_dispatcher_type alltoall)",
    "moe_shared_expert_overlap": "the shared experts computed beside the dispatch: realbench prices them after it",
    # (in fp32 the router's GEMM leaves the tensor cores: an H100 runs it at 67 of bf16's 989 TFLOP/s, and it
    # is 0.46% of a Qwen3-30B-A3B token's matmuls, 1.5% of a Qwen3-Next one's: 7% to 22% of their time)
    "moe_router_dtype": "the router's scores in fp32 or fp64, off the tensor cores: not priced (realbench prices the "
                        "router's GEMM in bf16 with the layer's)"}


def transformer_parts(key: str) -> Optional[tuple[str, str]]:
    """(the Megatron engine block, the TransformerConfig field) of an override_transformer_config key,
    or None for another key."""
    block, found, field = key.partition(TRANSFORMER)
    return (block, field) if found else None


def transformer_field(key: str) -> Optional[str]:
    """The TransformerConfig field a Megatron engine block's override_transformer_config key sets,
    where realbench reads it (FUSED_KERNELS, ROUTER_SETTINGS, MIRRORED), or None."""
    parts = transformer_parts(key)
    field = parts[1] if parts else None
    return field if field in FUSED_KERNELS or field in ROUTER_SETTINGS or field in MIRRORED else None


def _check_transformer_field(key: str, settings: dict[str, Any], source: str) -> None:
    """Refuse by name a read TransformerConfig field (transformer_field) set to what realbench does
    not price: a fused kernel off, a router dtype or dispatcher it does not price, the block's
    layout set otherwise."""
    (block, field), value = transformer_parts(key), settings[key]
    if field in FUSED_KERNELS and value is not True:
        raise ConfigError(f"{value!r}: the unfused kernels are not priced; realbench prices a layer at the preset's "
                          "efficiency, fitted with the fused ones (set true, as verl's converters do)", key, source)
    allowed = ROUTER_SETTINGS.get(field)
    if field in ROUTER_SETTINGS and allowed is not None and value not in allowed:
        raise ConfigError(f"{value!r}: realbench prices {', '.join(allowed)}", key, source)
    if field in MIRRORED:
        if value != settings.get(f"{block}.{field}"):
            raise ConfigError(f"{value!r} overrides the engine block's {field} ({settings.get(f'{block}.{field}')!r}), "
                              "which realbench reads: set it there", key, source)


def _unpriced_section(key: str) -> Optional[str]:
    """What realbench does not price of the UNPRICED_SECTIONS `key` lies in, or None."""
    return next((what for section, what in UNPRICED_SECTIONS.items() if key.startswith(section)), None)


def _check_mixed_precision(key: str, value: Any, source: str) -> None:
    """Refuse by name an FSDP mixed precision other than verl's own (MIXED_PRECISION), which
    realbench prices, and a dtype verl does not read."""
    name = key.rsplit(".", 1)[1]
    if name not in MIXED_PRECISION:
        raise ConfigError(f"verl's FSDP engine reads {', '.join(MIXED_PRECISION)} of mixed_precision "
                          "(workers/engine/fsdp/transformer_impl.py:391-401), not this", key, source)
    if DTYPE_NAMES.get(str(value).lower()) not in MIXED_PRECISION[name]:
        raise ConfigError(f"{value!r}: realbench prices FSDP's mixed precision as verl defaults it (bf16 parameters, "
                          "fp32 buffers, the gradients reduced in fp32 or bf16; workers/engine/fsdp/"
                          "transformer_impl.py:391-401)", key, source)


def refuse_unpriced(engine: str, settings: dict[str, Any], given: set[str], source: str) -> None:
    """Refuse by name the first setting given (and changed from what verl would give it) that
    realbench neither reads (READ) nor knows to leave a step's time and memory alone (NEUTRAL).
    (Settings that follow others by interpolation are checked through those.)"""
    one_step_off = ROLLOUT_POOL[0] in settings
    for key in sorted(given):
        if one_step_off and key in V1_KEYS:
            raise ConfigError(f"{settings[key]!r}: the one-step-off entry point runs its own trainer "
                              f"({ONE_STEP_OFF}/ray_trainer.py), not the V1 trainer this setting chooses", key, source)
        if transformer_field(key):
            _check_transformer_field(key, settings, source)
            continue
        if key == CUDAGRAPH_MODE and settings[key] not in DECODE_CAPTURED:
            raise ConfigError(f"{settings[key]!r}: vLLM then launches the decode step's attention kernel by kernel, "
                              f"where realbench prices it as a captured graph runs it ({', '.join(DECODE_CAPTURED)})",
                              key, source)
        if key in READ or key.startswith(NEUTRAL):
            continue
        # (a value verl would give it anyway: the reference's strategy written out as the actor's,
        # which it follows by interpolation, as verl's own examples write it)
        if resolve(engine, {k: settings[k] for k in given if k != key}, one_step_off).get(key) == settings[key]:
            continue
        because = UNPRICED_BECAUSE.get(key) or _unpriced_section(key)
        why = f": {because}" if because else ""
        raise ConfigError(f"{settings[key]!r} (verl's default {defaults(engine, one_step_off).get(key)!r}) changes what "
                          f"verl runs, and realbench does not price it{why}", key, source)


# what the settings most often refused would change (refuse_unpriced)
UNPRICED_BECAUSE = {
    f"{R}.enforce_eager": ("the rollout's server then decodes without CUDA graphs, launching every kernel of every "
                           "step (workers/rollout/vllm_rollout/vllm_async_server.py:339), where realbench prices a "
                           "decode step's launches as CUDA graphs run them")}


def _formed(step: StepRows, rows: int, ranks: int, budget: int, divided_by: Optional[int] = None,
            sp: int = 1) -> Optional[int]:
    """The micro-batches realbench prices for a GPU's `rows` that verl's dynamic batching packs
    within `budget` tokens on `ranks` data-parallel ranks (packer.mean_count, on the steps
    `step` draws): the mean count, to the nearest whole one, as the fewest equal splits of the rows
    at least as many (a multiple of `divided_by`, Megatron's with virtual stages: realbench's plans
    split a GPU's rows evenly); None where verl refuses it (a multiple beyond the rows). Under
    Ulysses (`sp` GPUs a rank) a rank's rows are its group's and its budget `budget` x sp
    (verl/workers/engine/utils.py:104-111)."""
    mean = mean_count(step, rows, ranks, budget * sp, divided_by)
    return None if mean is None else fewest_splits(rows, max(1, round(mean)), divided_by or 1)


def _step_rows(scenario: Scenario) -> StepRows:
    """A verl job's rows as its dynamic batching counts them: the prompt and the response as long as
    it ran, drawn from the scenario's response lengths (the trained calls'), or every one at its cap."""
    gen = scenario.dataflow.call("actor_gen")
    return StepRows(gen.prompt_len, gen.gen_len, scenario.dataflow.call("actor_train").lengths)


def _divided_by(pp: int, virtual_stages: int) -> Optional[int]:
    """The multiple of micro-batches verl's Megatron engine forms with virtual stages (its
    microbatch_group_size_per_vp_stage, the pipeline's size: workers/engine/megatron/
    transformer_impl.py:873-877), or None."""
    return pp if virtual_stages > 1 else None


READ = {BYPASS, MAX_MODEL_LEN, LAYERED_SUMMON, CUDAGRAPH_MODE, FREE_CACHE,
        *(k for keys in SEQUENCE_PARALLEL.values() for k in keys if k),
        "trainer.nnodes", "trainer.n_gpus_per_node", *V1_KEYS, HYBRID, *ROLLOUT_POOL,
        "data.train_batch_size", "data.max_prompt_length", "data.max_response_length", "algorithm.adv_estimator",
        "algorithm.use_kl_in_reward", f"{A}.use_kl_loss", f"{A}.ppo_mini_batch_size",
        f"{A}.ppo_micro_batch_size_per_gpu", f"{A}.use_dynamic_bsz", f"{A}.ppo_max_token_len_per_gpu",
        f"{A}.ppo_epochs", "critic.ppo_epochs", "critic.enable", "critic.ppo_mini_batch_size",
        "critic.ppo_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu",
        "critic.ppo_infer_max_token_len_per_gpu", "critic.use_dynamic_bsz",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", f"{R}.n", f"{R}.tensor_model_parallel_size",
        f"{R}.max_num_seqs", MEMORY, f"{R}.prompt_length", f"{R}.response_length",
        "actor_rollout_ref.model.enable_gradient_checkpointing", "critic.model.enable_gradient_checkpointing",
        *REMOVE_PADDING, f"{A}.fsdp_config.reshard_after_forward", "critic.fsdp.reshard_after_forward",
        "actor_rollout_ref.ref.fsdp_config.reshard_after_forward", REF_MEGATRON_OFFLOAD, *(
            f"{block}.{k}" for blocks in OFFLOAD_BLOCK.values() for block in blocks.values()
            for k in ("param_offload", "optimizer_offload")), f"{RM}.enable", f"{RM}.model_path",
        f"{R}.name", f"{RM}.rollout.name", f"{RM}.rollout.tensor_model_parallel_size", f"{RM}.rollout.max_num_seqs",
        f"{RM}.enable_resource_pool", f"{RM}.nnodes", f"{RM}.n_gpus_per_node",
        f"{DISTILL}.enabled", f"{DISTILL}.nnodes", f"{DISTILL}.n_gpus_per_node", f"{TEACHER}.model_path",
        *(f"{TEACHER_SERVER}.{k}" for k in ("name", "tensor_model_parallel_size", "data_parallel_size",
                                            "expert_parallel_size", "max_num_seqs", "max_num_batched_tokens")),
        *LORA_KEYS.values(), LORA_MERGE, LORA_EXCLUDE, ADAPTER_PATH, FUSED, FUSED_BACKEND, *FSDP_SIZE.values(),
        ROLLOUT_DP, ROLLOUT_EP} | {
        f"{block}.{k}" for block in MEGATRON_BLOCKS.values()
        for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
                  "context_parallel_size", "dynamic_context_parallel", *EXPERT_KEYS,
                  "use_distributed_optimizer", "override_transformer_config.recompute_granularity",
                  "override_transformer_config.recompute_method", "override_transformer_config.recompute_num_layers")}


def sync_buffer_problem(scenario: Scenario, options: dict[str, Option]) -> Optional[tuple[str, str]]:
    """(setting, why) where verl's weight sync to its colocated rollout could hold more of a GPU
    than the generation realbench prices there (BUCKET), or None: the sync's buffer (the scenario's
    carried BUCKET, or verl's default) and the largest tensor gathered (6 bytes a parameter) must
    fit in the KV cache's part of the rollout's share of each GPU, which the sync runs without; so
    must a LoRA actor's whole model where FSDP1 summons it to gather the adapters (LAYERED_SUMMON,
    which is read only for adapters sent alone)."""
    gen = served_call(scenario.dataflow.call("actor_gen"), options["actor_gen"].strategy)
    layered = bool(scenario.engine_settings.get(LAYERED_SUMMON, False))
    adapters_alone = scenario.models["actor"].lora is not None and not options["actor_gen"].strategy.merge_lora
    if layered and not adapters_alone:
        return LAYERED_SUMMON, ("True with the adapters merged into the base (or no LoRA): vLLM's rollout then sleeps at "
                                "level 1, its weights kept in host memory and copied back every step, which realbench "
                                "does not price; verl reads it for a LoRA actor's adapters sent alone")
    if scenario.dataflow.max_staleness or gen.memory_fraction is None:
        return None  # (the one-step-off entry sends over NCCL to a pool of its own)
    model, c = scenario.model_of(gen), scenario.cluster
    tp = options["actor_gen"].strategy.tp
    if serving_cache_problem(gen, model, c, options["actor_gen"].strategy) is not None:
        return None  # (its server does not start: refused, and priced, as such)
    cache = served_share_beyond_weights(gen, model, c, tp, options["actor_gen"].strategy.ep)
    bucket_mb = int(scenario.engine_settings.get(BUCKET, BUCKET_MB))
    largest = max(model.vocab * model.hidden, model.ffn * model.hidden, model.hidden * model.hidden)
    need = bucket_mb * 2 ** 20 + 6 * largest
    gib = 2 ** 30
    fsdp1 = scenario.engine_settings.get(STRATEGY["actor"], "fsdp") == "fsdp"
    if adapters_alone and fsdp1 and not layered:  # (FSDP1 summons the whole model: LAYERED_SUMMON)
        whole = 4 * (model.n_params + model.adapter_params)
        if whole > cache:
            return LAYERED_SUMMON, (f"False: verl gathers a LoRA actor's adapters by summoning the whole model's fp32 "
                                    f"parameters on every GPU ({whole / gib:.1f} GiB) beside the rollout's weights, more "
                                    f"than the KV cache it runs without ({max(cache, 0) / gib:.1f} GiB at "
                                    f"gpu_memory_utilization {gen.memory_fraction:g}, tp {tp}): the sync would set the "
                                    "peak, which realbench does not price (layered_summon=True gathers a layer at a time)")
    if need <= cache:
        return None
    return BUCKET, (f"{bucket_mb} MB: verl's weight sync holds its buffer and the largest tensor gathered "
                    f"({need / gib:.1f} GiB a GPU) beside the rollout's weights, more than the KV cache it runs without "
                    f"({max(cache, 0) / gib:.1f} GiB at gpu_memory_utilization {gen.memory_fraction:g}, tp {tp}): the "
                    "sync would set the peak, which realbench does not price (a smaller buffer, or a larger memory "
                    "share)")


def graph_capture_problem(scenario: Scenario, options: dict[str, Option]) -> Optional[tuple[str, str]]:
    """(setting, why) where a vLLM rollout's replica decodes more sequences together than the largest
    batch its CUDA graphs capture (CAPTURE_SIZES, carried): those decode steps run without a graph,
    which realbench does not price; else None."""
    key = next((k for k in CAPTURE_SIZES if scenario.engine_settings.get(k)), None)
    if key is None or scenario.rollout_server == "sglang":
        return None
    largest = max(int(size) for size in scenario.engine_settings[key])
    gen, option = scenario.dataflow.call("actor_gen"), options["actor_gen"]
    slots = serving_slots(gen, scenario.model_of(gen), scenario.cluster, option)
    if slots <= largest:
        return None
    return key, (f"{largest} at most: a replica decodes up to {slots} sequences together (max_num_seqs, as its KV cache "
                 "holds them), and vLLM runs a decode batch above the largest captured one without a CUDA graph, which "
                 f"realbench does not price (capture {slots}, or decode fewer a replica)")


def rollout_problem(scenario: Scenario, options: dict[str, Option]) -> Optional[tuple[str, str]]:
    """What of a plan's rollout verl would run otherwise than realbench prices it: its weight sync's
    peak (sync_buffer_problem), or decode batches its CUDA graphs do not capture."""
    return sync_buffer_problem(scenario, options) or graph_capture_problem(scenario, options)


def _critic_counts(scenario: Scenario, train_rows: int, inf_rows: int, dp: int, divided_by: Optional[int],
                   budget: int, sp: int = 1) -> tuple[Optional[int], Optional[int]]:
    """The micro-batches verl's V1 critic forms of its train and inference rows a GPU (a Ulysses
    group's, of `sp` GPUs) under one budget a GPU."""
    step = _step_rows(scenario)
    return _formed(step, train_rows, dp, budget, divided_by, sp), _formed(step, inf_rows, dp, budget, divided_by, sp)


def _mean_budget(scenario: Scenario, rows: int, m: int, sp: int = 1) -> int:
    """The budget a GPU whose mean tokens make `m` micro-batches of a GPU's `rows` (a Ulysses
    group's of `sp` GPUs; a row's tokens on average, documents.budget_row), at least a whole row
    (a group's budget): where verl's count starts."""
    return max(math.ceil(rows * budget_row(scenario, "critic_train") / m / sp),
               ceil_at_least_one(scenario.dataflow.call("critic_train").seq_len, sp))


def _remove_padding(scenario: Scenario) -> tuple[bool, bool]:
    """verl's use_remove_padding of the actor's model block (the actor's, the reference's and the
    old log-probabilities' calls) and of the critic's: the scenario's padding_free, but for its
    padded_models (a scenario priced as verl without them: verl's default, both packed)."""
    packed = packs(scenario, "verl", PADDING_FREE)
    padded = scenario.training.padded_models if scenario.engine == "verl" else ()
    return packed and "actor" not in padded, packed and "critic" not in padded


def space_problem_of_scenario(scenario: Scenario) -> Optional[tuple[str, str]]:
    """What of a scenario (not of a plan) verl cannot run: the algorithm, asynchrony."""
    if scenario.algorithm not in ESTIMATORS.values():
        return "scenario.algorithm", f"realbench writes verl's PPO, GRPO and RLOO, not {scenario.algorithm}"
    for key, value in scenario.engine_settings.items():  # (as read_config checks them)
        if key.startswith(MIXED_PRECISION_BLOCKS):
            try:
                _check_mixed_precision(key, value, "engine_settings")
            except ConfigError as e:
                return f"engine_settings.{key}", e.message
    carried = scenario.engine_settings.get(ESTIMATOR)
    if carried is not None and SAME_CALLS.get(carried) != scenario.algorithm:
        return f"engine_settings.{ESTIMATOR}", (f"{carried!r}: realbench carries {', '.join(SAME_CALLS)} (priced with "
                                                f"GRPO's or RLOO's calls), each with its algorithm, not "
                                                f"{scenario.algorithm}")
    if scenario.dataflow.max_staleness > 1:
        return "max_staleness", (f"{scenario.dataflow.max_staleness}: realbench writes verl's synchronous trainer and "
                                 "its one-step-off entry point (generation one step ahead: max_staleness 1)")
    if scenario.dataflow.max_staleness:
        if "critic_train" in scenario.dataflow.call_names:
            return "scenario.algorithm", ("realbench writes verl's one-step-off trainer without a critic (GRPO, RLOO): "
                                          "its critic's token budgets are not read yet")
        if not isinstance(scenario.models.get("reward"), FunctionSpec):
            return "models.reward", ("realbench writes verl's one-step-off trainer with a reward function: its reward "
                                     "model is served by the reward loop beside the rollout, not priced")
        if scenario.models["actor"].lora is not None:
            return "models.actor.lora", ("realbench writes verl's one-step-off trainer for a whole actor: the sync of a "
                                         "LoRA actor's weights to its own rollout pool is not priced")
    padded = set(scenario.training.padded_models) if scenario.engine == "verl" else set()
    if padded - {"actor", "ref", "critic"} or len(padded & {"actor", "ref"} & set(scenario.models)) == 1:
        return "training.padded_models", ("verl packs rows or not per model block (use_remove_padding): the actor's "
                                          "block for the actor and its reference alike, the critic's")
    if scenario.models["actor"].lora is not None and "ref" in scenario.models:
        return "models.ref", ("verl's reference of a LoRA actor is the actor with its adapters off "
                              "(verl/trainer/ppo/v1/trainer_base.py:234-237): leave the reference model out")
    return lora_problem(scenario, "verl", adapter_folders=True)
