"""verl 0.9.1's configuration as realbench names it: the version and its entry points, the
settings table made from verl's own composition (`verl-0.9.1.json`, by `check.py defaults`, which a
test compares with the installed verl: `defaults`, `known_keys`, `resolve`), and the keys realbench
reads and writes, each with where verl reads it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from realbench.engines.dotted import flatten, nest

VERSION = "0.9.1"
A, R, RM = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "reward.reward_model"
ENTRY = "python3 -m verl.trainer.main_ppo"
# verl's one-step-off entry point (verl/experimental/one_step_off_policy: main_ppo.py, ray_trainer.py,
# config/one_step_off_ppo_trainer.yaml): the rollout on its own pool of GPUs, `rollout.nnodes` x
# `rollout.n_gpus_per_node` (ROLLOUT_POOL, a top-level block only its config has), generating the next
# batch while the trainer trains on this one (realbench's max_staleness 1)
ONE_STEP_OFF_ENTRY = "python3 -m verl.experimental.one_step_off_policy.main_ppo"
ONE_STEP_OFF = "verl/experimental/one_step_off_policy"
ROLLOUT_POOL = ("rollout.nnodes", "rollout.n_gpus_per_node")
# verl's configs a primary config (or the one-step-off entry's own YAML) may extend, by model_engine
BASE_CONFIGS = {"ppo_trainer": "dp", "ppo_megatron_trainer": "megatron"}
ONE_STEP_OFF_CONFIGS = {"one_step_off_ppo_trainer": "dp", "one_step_off_ppo_megatron_trainer": "megatron"}
HYBRID = "actor_rollout_ref.hybrid_engine"
# what one_step_off_ppo_trainer.yaml sets beside its pool (its rollout keeps its cache, for the weights'
# sync over NCCL), written into a config that extends ppo_trainer: the same composition
ONE_STEP_OFF_SETTINGS = {"actor_rollout_ref.rollout.free_cache_engine": False,
                         "actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl"}
TABLE = Path(__file__).with_name(f"verl-{VERSION}.json")
# where each model's checkpoint folder is set
MODEL_PATHS = {"actor": "actor_rollout_ref.model.path", "ref": "actor_rollout_ref.model.path",
               "critic": "critic.model.path", "reward": "reward.reward_model.model_path",
               "teacher": "distillation.teacher_models.teacher_model.model_path"}
# algorithm.adv_estimator (verl/trainer/ppo/core_algos.py, AdvantageEstimator) <-> realbench's algorithm
ESTIMATORS = {"gae": "ppo", "grpo": "grpo", "rloo": "rloo"}
# verl's estimators that the driver computes from the calls of GRPO's dataflow (a prompt's group of
# samples, their rewards, the reference's log-probabilities; no critic, no other forward:
# trainer/ppo/core_algos.py, compute_advantage on the driver): priced as that algorithm, the
# estimator carried as set (engine_settings) and written back. Not these: remax (a greedy
# generation beside the sampled ones), optimal_token_baseline (the actor's sum of squared
# probabilities, calculate_sum_pi_squared), gdpo (rewards by key)
SAME_CALLS = {"reinforce_plus_plus": "grpo", "reinforce_plus_plus_baseline": "grpo", "gpg": "grpo",
              "grpo_passk": "grpo", "opo": "grpo", "grpo_vectorized": "grpo", "rloo_vectorized": "rloo"}
ESTIMATOR = "algorithm.adv_estimator"

ENGINES = {"dp": "FSDP", "megatron": "Megatron"}
# a job that names no reward function and no reward model: verl's built-in rule-based scorers
# (verl/utils/reward_score/__init__.py, default_compute_score, by each row's data_source), named in
# the scenario by realbench's stand-in (realbench.engines.verl.reward) and written back as no custom function
BUILTIN_REWARD = f"{Path(__file__).with_name('reward.py')}:default_compute_score"

CRITIC_TOKENS = 32768  # CriticConfig.ppo_infer_max_token_len_per_gpu (verl/workers/config/critic.py)
CRITIC_BUDGET = "critic.ppo_infer_max_token_len_per_gpu"
# The weight sync's buffer. verl sends the trainer's weights to its colocated rollout through one
# GPU buffer of this many MB (workers/rollout/vllm_rollout/vllm_rollout.py:235-241,
# bucketed_weight_transfer.py:179-199; a tensor larger than it goes alone, :140-146), each tensor
# gathered whole in bf16 (workers/engine/fsdp/transformer_impl.py:940-945), with the rollout's
# weights resumed and its KV cache still released (workers/engine_workers.py:768-823: resume
# weights, update_weights, offload the model, resume kv_cache). realbench prices a rollout's memory
# as its whole share of each GPU while it generates; the sync never sets the peak where the buffer
# and the largest tensor (its fp32 shard gathered and its bf16 copy: 6 bytes a parameter) fit in
# the KV cache's part of that share (sync_buffer_problem: checked on every plan read, searched or
# written, refused by name otherwise). An offloaded actor's parameters brought in for the sync are
# priced in time, not in memory (PRICING_GAPS). The setting is carried as the user gave it.
BUCKET = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"
BUCKET_MB = 2048  # RolloutConfig's CheckpointEngineConfig default (workers/config/rollout.py:135)

# the log-probabilities' settings (verl's fused kernels and the entropy's: realbench.engines.verl.pricing
# says what each changes, logits_paths)
FUSED = "actor_rollout_ref.model.use_fused_kernels"
FUSED_BACKEND = "actor_rollout_ref.model.fused_kernel_options.impl_backend"

ENTROPY_SETTINGS = ("entropy_from_logits_with_chunking", "entropy_checkpointing", "entropy_from_logits_chunk_size")
ENGINE_BLOCK = {"dp": {"actor": f"{A}.fsdp_config", "ref": "actor_rollout_ref.ref.fsdp_config"},
                "megatron": {"actor": f"{A}.megatron", "ref": "actor_rollout_ref.ref.megatron"}}
ROLE_BLOCK = {"actor": A, "ref": "actor_rollout_ref.ref"}

# sections of verl's config whose keys are the user's own (Hydra's `+key=value` adds them): the
# chat template's keyword arguments (data.apply_chat_template_kwargs, handed to the tokenizer's
# apply_chat_template: enable_thinking, say), which shape the prompts' text; realbench prices
# prompts and responses at their configured lengths, so they are carried as given (NEUTRAL); and
# the reward manager's keyword arguments (reward.reward_kwargs, and the legacy reward_model's, which
# verl moves there: experimental/reward_loop/reward_loop.py:69-72), DAPO's overlong penalty among
# them (workers/reward_manager/dapo.py: a function of each response's length, on the scorer's CPU).
# FSDP's mixed precision, an open dict of each FSDP engine block (FSDPEngineConfig.mixed_precision,
# default None), of which verl reads three dtypes (workers/engine/fsdp/transformer_impl.py:391-401,
# its defaults first): given as realbench prices them, carried; otherwise refused (read_config checks
# them). The gradients' reduction realbench prices in bf16 bytes (realbench.cost.sharding): a bf16
# reduce_dtype exactly, verl's fp32 default at half its bytes (docs/limits.md)
MIXED_PRECISION = {"param_dtype": ("bf16",), "reduce_dtype": ("fp32", "bf16"), "buffer_dtype": ("fp32",)}
MIXED_PRECISION_BLOCKS = tuple(f"{block}.mixed_precision." for block in
                               (f"{A}.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp"))
OPEN_SECTIONS = ("data.apply_chat_template_kwargs.", "reward.reward_kwargs.", "reward_model.reward_kwargs.",
                 *MIXED_PRECISION_BLOCKS)
DTYPE_NAMES = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32", "fp16": "fp16",
               "float16": "fp16"}

# keys verl reads that its composed config does not hold (Hydra's `+key=value`)
ADDED_KEYS = {"critic.ppo_infer_max_token_len_per_gpu": CRITIC_TOKENS,
              # (DistillationLossConfig's fields its YAML leaves out, workers/config/distillation.py)
              "distillation.distillation_loss.use_chunked_topk": False,
              "distillation.distillation_loss.chunked_topk_chunk_size": 4096}

BYPASS = "algorithm.rollout_correction.bypass_mode"
SERVERS = ("vllm", "sglang")  # the rollouts realbench writes (rollout.name; one for the reward model too)
# the share of each GPU's memory the rollout's server takes, vLLM's gpu_memory_utilization or SGLang's
# mem_fraction_static (workers/rollout/vllm_rollout/vllm_async_server.py:340,
# sglang_rollout/async_sglang_server.py:317): the generation call's memory_fraction, verl's default
# where a scenario gives none
MEMORY = "actor_rollout_ref.rollout.gpu_memory_utilization"
# whether the colocated rollout's server releases its share of each GPU after generating (True, verl's
# default: its sleep and wake-up, workers/rollout/vllm_rollout/vllm_async_server.py:853-862) or keeps it
# through the step (False: realbench's Strategy.keeps_memory); the one-step-off entry's rollout, on GPUs
# of its own, keeps it (ONE_STEP_OFF_SETTINGS), which changes nothing there
FREE_CACHE = "actor_rollout_ref.rollout.free_cache_engine"

# the context a request to the rollout's server may take; unset, the actor checkpoint's
# max_position_embeddings (workers/rollout/vllm_rollout/vllm_async_server.py:1102-1111,
# sglang_rollout/async_sglang_server.py:167-172). vLLM starts only where its KV cache holds one
# request of it (the generation call's max_model_len); SGLang starts with less
MAX_MODEL_LEN = f"{R}.max_model_len"

# the actor's LoRA under FSDP (verl/workers/config/model.py:122-135: lora_rank 0 is none), PEFT's
# name -> verl's; and whether the rollout receives the adapters merged into the base
# (verl/workers/engine/fsdp/transformer_impl.py:995-1014: else the adapters alone once the base is there)
LORA_KEYS = {"r": "actor_rollout_ref.model.lora_rank", "lora_alpha": "actor_rollout_ref.model.lora_alpha",
             "target_modules": "actor_rollout_ref.model.target_modules"}
LORA_MERGE = "actor_rollout_ref.model.lora.merge"
# the modules PEFT keeps LoRA off (a pattern): a vision-language actor's vision tower, which
# all-linear would adapt too (realbench.models.spec.vision_exclusion_problem)
LORA_EXCLUDE = "actor_rollout_ref.model.exclude_modules"
VISION_EXCLUDED = ".*visual.*"
# How a LoRA actor's adapters are gathered for the sync where they go alone (lora.merge false):
# layered_summon gathers one FSDP unit at a time (verl/utils/fsdp_utils.py:645-712), at most one
# layer's full parameters a GPU, within the largest tensor realbench's sync already holds
# (sync_buffer_problem); without it FSDP1 (`strategy: fsdp`) summons the whole model's full
# parameters at once (fsdp_utils.py:742-751, in its fp32 model_dtype), FSDP2 gathers the adapters'
# DTensors alone. Beyond the adapters, vLLM's rollout reads it for its sleep level (1: the weights
# kept in host memory through training and copied back, vllm_rollout/vllm_rollout.py:125-129), which
# verl sets for a LoRA actor without merged adapters anyway (engine_workers.py:788-791): read there,
# refused elsewhere (a whole model's or merged adapters' sleep level 1 is not priced)
LAYERED_SUMMON = "actor_rollout_ref.rollout.layered_summon"
# vLLM's CUDA graph modes (vllm/config/compilation.py, CUDAGraphMode: a uniform decode batch's mode and
# a mixed or prefill batch's), which verl hands to the rollout's server through engine_kwargs.vllm
# (workers/rollout/vllm_rollout/vllm_async_server.py:307-310, FULL_AND_PIECEWISE unless set). realbench
# prices a decode step's launches as a captured graph runs them and a prefill's as compute: the modes
# that capture the decode step whole (FULL; FULL_DECODE_ONLY, its mixed batches eager;
# FULL_AND_PIECEWISE) are priced alike and carried; NONE and PIECEWISE (the decode step's attention
# launched kernel by kernel) are refused by name, as enforce_eager is
CUDAGRAPH_MODE = "actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config.cudagraph_mode"
DECODE_CAPTURED = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
# the decode batches vLLM captures graphs of: the rollout's own list, which replaces the one given in
# engine_kwargs (vllm_async_server.py:321-322). A decode batch above the largest runs without a graph;
# realbench prices the plan where a replica's decoding slots (cost.calls.serving_slots) are all
# captured, and refuses the list by name where they are not (pricing.graph_capture_problem). Carried
CAPTURE_SIZES = (f"{R}.cudagraph_capture_sizes", f"{R}.engine_kwargs.vllm.compilation_config.cudagraph_capture_sizes")
# the serving engine's arguments realbench reads (an open section of verl's config, which its table
# does not hold): known where a configuration is read and where one is written
READ_ENGINE_KWARGS = (CUDAGRAPH_MODE, CAPTURE_SIZES[1])
# a PEFT adapter folder the actor's adapters start from (verl/workers/engine/fsdp/transformer_impl.py:342-356:
# PeftModel.from_pretrained, its own r, alpha and modules; read only with lora_rank > 0, :162, 598-599, which
# also sizes vLLM's LoRA slots): realbench's checkpoint entry `adapter:`
ADAPTER_PATH = "actor_rollout_ref.model.lora_adapter_path"

REMOVE_PADDING = ("actor_rollout_ref.model.use_remove_padding", "critic.model.use_remove_padding")
# The offloads of each trained role's engine (workers/engine/base.py:314-333, priced by
# realbench.cost.sharding): optimizer_offload, the optimizer's states in host memory between updates
# (realbench's offload_optimizer); param_offload, the parameters in host memory between calls,
# brought in for each (the old log-probabilities, the values, the update, and the weight sync:
# FSDP1, `strategy: fsdp`, unshards on the device, workers/engine/fsdp/transformer_impl.py:977-1022;
# Megatron loads the model, workers/engine/megatron/transformer_impl.py:1090) and sent back after it
# (realbench's offload_params on the train call). FSDP2 stages the sync's shards one way, in
# (realbench.cost.simulate.sync_stages_one_way). A Megatron reference's offload (its param_offload follows
# the actor's by interpolation): its bf16 shard loaded for each forward and sent back after it
# (the eval context moves the model only, workers/engine/base.py:314-333, megatron/transformer_impl.py:
# 722-744): offload_params on ref_inf under zero 0, priced by realbench.cost.sharding
OFFLOAD_BLOCK = {"dp": {"actor": f"{A}.fsdp_config", "critic": "critic.fsdp"},
                 "megatron": {"actor": f"{A}.megatron", "critic": "critic.megatron"}}
PARAM_OFFLOAD = {role: f"{block}.param_offload" for role, block in OFFLOAD_BLOCK["dp"].items()}
REF_MEGATRON_OFFLOAD = "actor_rollout_ref.ref.megatron.param_offload"
# The FSDP version a trained role runs (`strategy`: fsdp, verl's default, is FSDP1; fsdp2 is
# fully_shard, workers/engine/fsdp/transformer_impl.py:450-472; the engine config's strategy follows
# the role's, workers/config/actor.py:322-325, critic.py:216-219, and the reference's the actor's by
# interpolation). Priced alike: the same layer-by-layer gathers and reduce-scatters, the same shards
# and states, the same host copies of a forward-only model, one gather of the weights for the sync.
# So the user's choice is carried as they set it (engine_settings, written back) rather than read
# into the plan; what differs, the sync of an offloaded model's parameters (above), is refused by
# name where a plan is read, searched and written. fsdp_turbo (another package's engine) is refused
STRATEGY = {"actor": f"{A}.strategy", "critic": "critic.strategy"}
# each FSDP engine's hybrid sharding group (Strategy.shard_group): -1, or the trainer's GPUs or more,
# shards over all of them (verl/workers/engine/fsdp/utils.py:35-53 builds a one-dimensional mesh);
# fewer, a (GPUs / fsdp_size, fsdp_size) mesh and HYBRID_SHARD (utils.py:56-86), FSDP2's HSDP
FSDP_SIZE = {"actor": f"{A}.fsdp_config.fsdp_size", "ref": "actor_rollout_ref.ref.fsdp_config.fsdp_size",
             "critic": "critic.fsdp.fsdp_size"}
# Ulysses sequence parallelism of each FSDP role (Strategy.sp), as its engine reads it: the engine
# config's (fsdp_config / fsdp) ulysses_sequence_parallel_size, which the actor's and the reference's
# deprecated role-level one replaces where above 1 (FSDPActorConfig.__post_init__,
# workers/config/actor.py:327-329; the reference's role-level one follows the actor's unless set,
# trainer/config/ref/dp_ref.yaml:39). The critic's role-level one reaches no engine in verl 0.9.1
# (workers/config/critic.py: FSDPCriticConfig copies nothing): said on import, priced as verl runs it
# (CRITIC_SP_UNREAD, pricing.IGNORED_BY_VERL)
SEQUENCE_PARALLEL = {"actor": (f"{A}.ulysses_sequence_parallel_size",
                               f"{A}.fsdp_config.ulysses_sequence_parallel_size"),
                     "ref": ("actor_rollout_ref.ref.ulysses_sequence_parallel_size",
                             "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size"),
                     "critic": (None, "critic.fsdp.ulysses_sequence_parallel_size")}
CRITIC_SP_UNREAD = "critic.ulysses_sequence_parallel_size"
FSDP_VERSIONS = ("fsdp", "fsdp2")
# A mixture of experts' layout. Each Megatron engine block's expert_model_parallel_size (the plan's
# ep) and expert_tensor_parallel_size (etp; null: tp's, as Megatron defaults it) (trainer/config/
# engine/megatron.yaml:14-17, McoreEngineConfig, which checks neither; the reference's block copies
# the actor's, ref/megatron_ref.yaml:29-38), handed to Megatron-Bridge's provider with
# moe_token_dispatcher_type alltoall (workers/engine/megatron/transformer_impl.py:354-370): ep x etp
# GPUs of a stage's dp x cp x tp hold every expert once (Megatron's parallel folding, which needs
# world % (etp ep pp) == 0), tokens dispatched to their experts and back by all-to-alls. The
# parallel state is process-global (the actor's, as tp's: EXPERT_KEYS of the reference and of a
# critic with experts must be the actor's); a model without experts takes none (Megatron's
# TransformerConfig needs num_moe_experts for expert parallelism). FSDP has no expert parallelism: a
# mixture of experts under FSDP is sharded as any weight (ep 1). verl's Megatron-Bridge path turns
# the load-balancing loss off (moe_router_load_balancing_type none, :354-370).
EXPERT_KEYS = ("expert_model_parallel_size", "expert_tensor_parallel_size")
# The rollout's expert parallelism: a replica of tensor_model_parallel_size x data_parallel_size GPUs
# (workers/rollout/replica.py:107-116; its attention in data_parallel_size groups of tp GPUs), the
# experts over expert_parallel_size of them, which verl asserts is tp x dp where above 1
# (workers/config/rollout.py:294-297): vLLM's enable_expert_parallel (vllm_async_server.py:384-402),
# SGLang's ep_size (async_sglang_server.py:313-324). In realbench terms a generation of tp T over
# the pool's tp groups (dp), ep T x D, each expert whole (etp 1). data_parallel_size above 1 without
# expert parallelism (vLLM then splits each expert by tensor parallelism over tp x dp GPUs) and
# SGLang's (verl hands it tp_size tp x dp and dp_size dp, whose data-parallel attention is an engine
# argument) are not priced: refused by name
ROLLOUT_DP, ROLLOUT_EP = f"{R}.data_parallel_size", f"{R}.expert_parallel_size"
MEGATRON_BLOCKS = {"actor": f"{A}.megatron", "ref": "actor_rollout_ref.ref.megatron", "critic": "critic.megatron"}

# Megatron TransformerConfig fields a job sets through a Megatron engine block's
# override_transformer_config, which verl hands to Megatron-Bridge's provider last, over its own
# (workers/engine/megatron/transformer_impl.py:352-373). Three kinds are read (the rest refused by
# name, PASSED_THROUGH; the recompute_* fields are verl's own keys, READ):
# - fused kernels, the same FLOPs and bytes in fewer launches. realbench prices a layer's work at the
#   preset's fitted efficiency, which assumes the fused kernels verl's own converters turn on for the
#   models of 2026 (verl/models/mcore/config_converter.py: apply_rope_fusion, bias_activation_fusion,
#   masked_softmax_fusion, moe_grouped_gemm on): accepted set on, refused set off
FUSED_KERNELS = ("apply_rope_fusion", "gradient_accumulation_fusion", "masked_softmax_fusion", "bias_activation_fusion",
                 "bias_dropout_fusion", "moe_permute_fusion", "moe_grouped_gemm", "cross_entropy_loss_fusion",
                 "persist_layer_norm")
# - the router's losses: the load-balancing and z losses, sums over the router's probabilities
#   (verl's provider turns the load-balancing loss off unless the job sets it); and the dispatcher
#   realbench prices, which verl's provider sets (alltoall)
ROUTER_SETTINGS = {"moe_aux_loss_coeff": None, "moe_z_loss_coeff": None,
                   "moe_router_load_balancing_type": ("aux_loss", "seq_aux_loss", "global_aux_loss", "none"),
                   "moe_token_dispatcher_type": ("alltoall",)}
# - the engine block's own layout, set again: verl gives the provider these from the block
#   (transformer_impl.py:354-362); set equal, nothing changes; set otherwise, the block is not what runs
MIRRORED = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
            "expert_model_parallel_size", "expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size",
            "sequence_parallel")
TRANSFORMER = ".override_transformer_config."
# the fields of the first two kinds, carried as the user set them to the configurations realbench
# writes (the third is written from the plan's layout, into the block)
TRANSFORMER_CARRIED = tuple(f"{block}{TRANSFORMER}{field}" for block in MEGATRON_BLOCKS.values()
                            for field in (*FUSED_KERNELS, *ROUTER_SETTINGS))


@lru_cache(maxsize=1)
def _table() -> dict:
    return json.loads(TABLE.read_text())


def known_keys(engine: str, one_step_off: bool = False) -> set[str]:
    """The settings verl's config for model_engine `engine` holds (the one-step-off entry's), and
    under Megatron the TransformerConfig fields realbench carries (TRANSFORMER_CARRIED), which a
    written config holds in override_transformer_config as Hydra adds them; and vLLM's CUDA graph
    mode and capture sizes, which it holds in the rollout's engine_kwargs.vllm (an open section)
    the same way."""
    carried = set(TRANSFORMER_CARRIED) if engine == "megatron" else set()
    return set(defaults(engine, one_step_off)) | set(ADDED_KEYS) | carried | set(READ_ENGINE_KWARGS)


def defaults(engine: str, one_step_off: bool = False) -> dict[str, Any]:
    """verl's composed ppo_trainer config for model_engine `engine` (dp | megatron), flat:
    dotted key -> default (interpolations unresolved); with `one_step_off` the one-step-off entry
    point's (one_step_off_ppo_trainer: its rollout pool, and the rollout's settings it changes)."""
    table = _table()
    return {**table["keys"][engine], **table["one_step_off"][engine]} if one_step_off else table["keys"][engine]


def resolve(engine: str, given: dict[str, Any], one_step_off: bool = False) -> dict[str, Any]:
    """verl's settings with `given` (flat) over its defaults (the one-step-off entry's),
    interpolations resolved (OmegaConf, as verl resolves them)."""
    from omegaconf import OmegaConf

    merged = OmegaConf.create(nest({**defaults(engine, one_step_off), **ADDED_KEYS, **given}))
    return flatten(OmegaConf.to_container(merged, resolve=True))


V1_KEYS = ("trainer.use_v1", "trainer.v1.trainer_mode")  # the trainer verl.trainer.main_ppo runs

POOL = "verl/trainer/ppo/v1/trainer_base.py:822-834"

# on-policy distillation (trainer/config/distillation/distillation.yaml, workers/config/distillation.py):
# one teacher, served by vLLM or SGLang replicas of tp GPUs on a pool of its own (nnodes x
# n_gpus_per_node beside the trainer's, trainer_base.py:837-846), scores every sequence the rollout
# ends, prompt and response, with its log-probabilities (prompt_logprobs, its top-k), streamed beside
# generation (experimental/agent_loop/agent_loop.py:1031-1056); the actor's loss takes them
DISTILL = "distillation"
TEACHER = f"{DISTILL}.teacher_models.teacher_model"
TEACHER_SERVER = f"{TEACHER}.inference"
TEACHER_POOL = "verl/trainer/ppo/v1/trainer_base.py:837-846"
