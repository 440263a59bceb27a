"""verl 0.9.1: the plans its synchronous PPO trainer and its one-step-off entry point can run,
read from their configuration and written as one.

What verl can express (source files of the verl 0.9.1 wheel, `verl/...`):

* **One pool of GPUs for every role.** The V1 trainer maps actor, rollout, reference and critic
  to `global_pool = [trainer.n_gpus_per_node] * trainer.nnodes`
  (trainer/ppo/v1/trainer_base.py:805-820); in realbench terms every call's mesh is the whole
  cluster. A reward model may get its own pool instead (`reward.reward_model.enable_resource_pool`,
  `nnodes` x `n_gpus_per_node`, :822-834): GPUs beside the trainer's, in realbench terms the nodes
  after the trainer's (whole nodes of the trainer's width, or part of one node), the reward call's
  mesh. Its replicas score each response as it ends, beside generation (the reward loop's handles,
  experimental/reward_loop/reward_loop.py:314-322), while a colocated one scores the batch after it.
* **One training engine for actor, reference and critic**, chosen by `model_engine`
  (trainer/config/ppo_trainer.yaml defaults list): `dp` (FSDP: `strategy: fsdp | fsdp2`, priced
  alike and carried as set: STRATEGY) or `megatron`. FSDP has no tensor or pipeline parallelism (workers/config/engine.py:239-306): all
  GPUs are data parallel, the weights, gradients and optimizer states fully sharded
  (`fsdp_size: -1`, FULL_SHARD, workers/engine/fsdp/utils.py:35-53) = zero 3, or with
  `reshard_after_forward: false` the weights kept whole between forward and backward
  (SHARD_GRAD_OP) = zero 2; `fsdp_size` below the GPUs, each role's engine its own (FSDP_SIZE):
  hybrid sharding within groups of that many GPUs (HYBRID_SHARD, a (GPUs / fsdp_size, fsdp_size)
  mesh, utils.py:56-86) = Strategy.shard_group. Megatron: `tensor_model_parallel_size`,
  `pipeline_model_parallel_size`, `virtual_pipeline_model_parallel_size`, `context_parallel_size`,
  `use_distributed_optimizer` (zero 1), one process-global layout for all three roles
  (workers/engine/megatron/transformer_impl.py:239-256: the first engine built wins). Context
  parallelism (Strategy.sp with ring p2p): rings of cp GPUs, tp apart (Megatron's tp-cp-dp-pp
  order), each a data-parallel rank's rows (dp = GPUs / (tp pp cp)), every sequence split in 2 cp
  chunks, two a GPU (models/mcore/util.py:62-70), attended by Transformer Engine's p2p ring
  (Megatron's default cp_comm_type; verl sets none), the distributed optimizer over dp x cp, its
  dynamic batching's budget cp times a GPU's (megatron/transformer_impl.py:836, engine/utils.py:
  104-111); `dynamic_context_parallel` (a ring size per micro-batch) refused.
  Activation recomputation: FSDP `model.enable_gradient_checkpointing`; Megatron
  `override_transformer_config.recompute_granularity: full` with `recompute_method: uniform`,
  `recompute_num_layers: 1` (every layer's input kept, the layer recomputed).
  Ulysses sequence parallelism under FSDP (SEQUENCE_PARALLEL, per role: Strategy.sp): data-parallel
  groups of `ulysses_sequence_parallel_size` GPUs (a (dp, sp) device mesh,
  workers/engine/fsdp/transformer_impl.py:242-252; FSDP still shards over every GPU), each group
  a data-parallel rank's rows, its dynamic batching's budget the group's size times a GPU's
  (workers/engine/utils.py:104-111); packed rows only (:148-152).
* **The rollout is a serving engine on the same GPUs** (vLLM or SGLang, hybrid replicas carved
  from the actor's workers, workers/rollout/llm_server.py:434-460): `tensor_model_parallel_size`
  per replica, GPUs / tp replicas, no pipeline parallelism (workers/config/rollout.py:319-323); a
  replica's GPUs fit a node or span whole nodes (workers/rollout/replica.py:107-117).
  `max_num_seqs` sequences decode together per replica, or as many as the server's paged KV cache
  holds in its `gpu_memory_utilization` share of each GPU (MEMORY: the generation call's
  memory_fraction, realbench.cost.calls.serving_slots). A vLLM server starts where that cache
  holds one request of `max_model_len` (MAX_MODEL_LEN: unset, the checkpoint's positions).
* **A mixture of experts** (a model whose config.json has routed experts: realbench.models.spec.MoESpec).
  Megatron: each engine block's `expert_model_parallel_size` and `expert_tensor_parallel_size`
  (null: tp's), the plan's ep and etp on the Megatron calls of each model with experts (Megatron's
  parallel folding out of a stage's dp x cp x tp GPUs, realbench.plan.options.expert_problem),
  process-global as tp (the reference's block and a critic's with experts take the actor's); FSDP
  has none (experts sharded as any weight: ep 1). The rollout: replicas of tp x `data_parallel_size`
  GPUs, the experts over `expert_parallel_size` = tp x dp of them (verl asserts it,
  workers/config/rollout.py:294-297), each whole: a generation of tp, ep, etp 1 (EXPERT_KEYS,
  ROLLOUT_EP). Refused by name: what verl refuses (ep other than tp x dp, a model without experts
  given expert parallelism, a replica astride nodes), what realbench does not price
  (data_parallel_size without expert parallelism, SGLang's data-parallel attention), layouts the
  experts do not split into, a reference or critic block with the actor's other.
* **Scorers**: a reward model (`reward.reward_model.enable`, served like the rollout), a reward
  function (`reward.custom_reward_function.path`), or with neither verl's own rule-based scorers
  by each row's data_source (trainer/ppo/reward.py:124-149, utils/reward_score/__init__.py:
  BUILTIN_REWARD, realbench.engines.verl_reward, written back as no function).
* **Calls one after another** (trainer/ppo/v1/trainer_base.py:562-612: generate, reward,
  old log-probs, reference, values, advantages, critic update, actor update, weight sync), which
  is what realbench's simulator does with calls that share every GPU.
* **Batches**: `data.train_batch_size` prompts, `rollout.n` samples each, optimizer steps of
  `ppo_mini_batch_size` prompts (times n trajectories), `ppo_epochs` passes
  (workers/engine_workers.py:261-314); a replica's rows split into micro-batches of
  `*_micro_batch_size_per_gpu` rows that must divide them (workers/engine/utils.py:122-128), or
  with `use_dynamic_bsz` packed up to `*_max_token_len_per_gpu` tokens, counted by the rows' real
  lengths (the attention mask's sum, utils/seqlen_balancing.py:378-382; a budget holds at least a
  whole row, :384-386), as many micro-batches as verl's dynamic batching forms (the largest count
  over the data-parallel ranks, raised until its workload-balanced partition keeps each within the
  budget, :395-455: realbench.engines.verl_packer, on steps drawn from the response lengths),
  priced as the fewest equal micro-batches at least as many (`_formed`: realbench's plans split a
  GPU's rows evenly). The V1 critic always packs,
  both its calls to `critic.ppo_infer_max_token_len_per_gpu` (dataclass default 32768) tokens
  (trainer/ppo/v1/trainer_base.py:266-268). verl adds micro-batches until each holds at most the
  budget (utils/seqlen_balancing.py:443-460): where rows are packed, a packed call carries its budget
  in the plan (`max_tokens`), memory is planned for a micro-batch that full, and `export` writes it
  back as the call's dynamic batching (refused where it packs a GPU's rows into another count).

* **Asynchronous modes.** `verl.trainer.main_ppo` runs the V1 trainer `trainer.v1.trainer_mode`:
  realbench reads `sync`. The V1 trainer's `colocate_async` (trainer/ppo/v1/trainer_colocate_async.py)
  keeps the rollout on the training GPUs and prefetches `num_warmup_batches` batches; a step's
  unfinished requests are aborted, the replicas put to sleep for training and resumed (partial
  rollout) after the weight update. `separate_async` (trainer_separate_async.py) serves the rollout
  from a standalone pool (`actor_rollout_ref.rollout.nnodes` x `n_gpus_per_node`, beside the
  trainer's; with `hybrid_engine` the trainer's GPUs serve too, and `hybrid_rollout.enable_switch`
  hands them between training and rollout by measured waits), requires a reward model on its own
  pool, and updates the actor `parameter_sync_step` times a step (`train_batch_size =
  parameter_sync_step x ppo_mini_batch_size`) with the old log-probabilities of the weights saved
  at the step's start (in host memory). Both bound a sample's staleness by
  `trainer.v1.sampler.max_off_policy_threshold` model versions (8; `drop` or `wait` past it,
  trainer/ppo/v1/replay_buffer.py:95-180): partial rollouts and sample-level staleness, which
  realbench does not price; refused by name. `verl/experimental/fully_async_policy` (a rollouter and a
  trainer apart, `async_training.staleness_threshold`, `partial_rollout`) is not read.
* **The one-step-off entry point** (`python3 -m verl.experimental.one_step_off_policy.main_ppo`,
  its config `one_step_off_ppo_trainer.yaml` = ppo_trainer with a top-level `rollout` block and
  the settings ONE_STEP_OFF_SETTINGS, bypass_mode on) is read and written: the rollout on a pool of
  its own, `rollout.nnodes` x `rollout.n_gpus_per_node` GPUs (main_ppo.py copies them into the
  rollout's config), the trainer's pool for actor and reference (experimental/separation/utils.py:
  create_resource_pool_manager), `actor_rollout_ref.hybrid_engine: false` (its trainer asserts it,
  ray_trainer.py:72). Each step waits for the batch generated during the last, sends the weights
  (its NCCL checkpoint engine: gathered, broadcast from the actor's first rank,
  verl/checkpoint_engine/nccl_checkpoint_engine.py; priced as realbench.cost.realloc.broadcast_times),
  starts generating the next batch with them, and trains on this one (ray_trainer.py:385-405): in
  realbench terms generation one step ahead (`max_staleness: 1`) on its own mesh, the old
  log-probabilities the rollout's where bypass_mode is on. Placement: Ray puts the pools on the
  machines it has; verl's examples split each node (shell/*_2_6.sh), so the two one-node pools are
  read on one node of their sum, the trainer's GPUs first, unless `import --gpus-per-node` gives
  the node (then on whole nodes, the rollout's after the trainer's). Not read there yet, refused by
  name: a critic (the legacy trainer packs its update to `critic.ppo_max_token_len_per_gpu`,
  trainer/ppo/ray_trainer.py:808-811), a reward model (served by the reward loop beside the
  rollout), a LoRA actor, the V1 trainer's settings (it does not run them).

How realbench prices what verl runs (its cost model, realbench.cost): FSDP as zero 3 (or 2),
Megatron's distributed optimizer as zero 1, the weight sync to the rollout as the FSDP
all-gather of the model (realbench.cost.realloc; its buffer checked to fit in the KV cache the sync
runs without: BUCKET, sync_buffer_problem), the rollout by continuous batching in at most
max_num_seqs slots a replica, fewer where its KV cache holds fewer (realbench.runtime.rollout
prices what vLLM does; the server holds its memory share while it generates), the reference's
parameters under FSDP in host memory (verl's FSDP always offloads a forward-only model,
workers/engine/fsdp/transformer_impl.py:429-463: `offload_params` on its call) and under Megatron
where its `param_offload` says so (loaded whole for its call and sent back after it), the actor's or
critic's `optimizer_offload` as its optimizer's states in host memory between updates and
`param_offload` as its parameters there between calls, under FSDP or Megatron (`offload_optimizer`,
`offload_params` on its train call: OFFLOAD_BLOCK), the logits of FSDP's fused kernels
(`use_fused_kernels`) a 512-token chunk at a time, as measured in verl's own kernel (`training.logits`:
logits_paths, which also says which entropy settings verl reads to no effect). What is not priced
is said wherever a verl plan is read or written (`PRICING_GAPS`). The actor's
old log-probabilities: a forward of the actor over the whole batch, or the rollout's with
`algorithm.rollout_correction.bypass_mode` (`training.old_logprobs` whole_batch or rollout).

Read: `read_config` takes a Hydra primary config (`defaults: [ppo_trainer, _self_]`, as
`python -m verl.trainer.main_ppo --config-path --config-name` takes it) or a composed config (a
run's `.hydra/config.yaml`), then Hydra-style overrides, over verl's own defaults
(`verl-0.9.1.json`, made from verl's composition by `verl_check.py defaults`, which a test
compares with the installed verl). A key verl does not have is refused with the closest one; a
setting realbench neither maps nor knows to leave time and memory alone, changed from verl's
default, is refused by name.
"""

from __future__ import annotations

import difflib
import json
import math
import shlex
from dataclasses import replace
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

from realbench.cost.calls import served_share_beyond_weights, serving_cache_problem
from realbench.dataflow import CallKind
from realbench.dataflow.core import LogitsPath
from realbench.dataflow.lengths import LengthDistribution
from realbench.engines.areal_packer import StepRows
from realbench.engines.documents import (budget_row, expert_layout_problem, job_documents, lora_problem,
                                         model_of_path, packs, served_context, serving_gap, whole_alpha,
                                         whole_row_budget)
from realbench.engines.listing import served_shares, the_jobs_share
from realbench.engines.verl_packer import mean_count
from realbench.errors import ConfigError
from realbench.models import FunctionSpec
from realbench.plan.mesh import Mesh, Option, Strategy, is_pow2
from realbench.plan.options import divisors, expert_layouts, served_call, straddles_nodes
from realbench.plan.plan import plan_from_document, resolve_plan
from realbench.plan.scenario import Scenario
from realbench.schema import load_yaml, read_document

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
               "critic": "critic.model.path", "reward": "reward.reward_model.model_path"}
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
# READ settings carried where their value is one of these (engines.carried_settings)
CARRIED_VALUES = {ESTIMATOR: tuple(SAME_CALLS)}
ENGINES = {"dp": "FSDP", "megatron": "Megatron"}
# a job that names no reward function and no reward model: verl's built-in rule-based scorers
# (verl/utils/reward_score/__init__.py, default_compute_score, by each row's data_source), named in
# the scenario by realbench's stand-in (realbench.engines.verl_reward) and written back as no custom function
BUILTIN_REWARD = f"{Path(__file__).with_name('verl_reward.py')}:default_compute_score"


def unread(engine: str, settings: dict[str, Any], given: set[str]) -> list[str]:
    """The given settings verl does not read, or reads to no effect on what it runs (IGNORED_BY_VERL,
    and the entropy's settings where nothing computes the entropy they shape: _entropy_unread),
    each with what verl runs instead."""
    ignored = {**IGNORED_BY_VERL, **_entropy_unread(engine, settings)}
    if ROLLOUT_POOL[0] in settings:  # (the one-step-off entry reads the critic's budgets: a critic is refused there)
        ignored = {k: why for k, why in ignored.items() if not k.startswith("critic.")}
    budget = repr(settings.get(CRITIC_BUDGET))
    return [f"{k}={settings[k]!r}: {ignored[k].replace('{budget}', budget)}" for k in sorted(given) if k in ignored]


def _builtin_reward(function: str) -> bool:
    """Whether a scenario's reward function is the stand-in for verl's own scorers (wherever
    realbench was installed when the scenario was written)."""
    file, _, name = function.rpartition(":")
    return name == "default_compute_score" and Path(file).parts[-3:] == Path(BUILTIN_REWARD.rpartition(":")[0]).parts[-3:]
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
IGNORED_BY_VERL = {"critic.ppo_max_token_len_per_gpu": _CRITIC_BUDGETS,
                   "critic.forward_max_token_len_per_gpu": _CRITIC_BUDGETS,
                   f"{A}.use_torch_compile": _COMPILE.format(version=VERSION, block=f"{A}.fsdp_config"),
                   "actor_rollout_ref.ref.use_torch_compile": _COMPILE.format(
                       version=VERSION, block="actor_rollout_ref.ref.fsdp_config")}
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
#   20 without), measured running verl's own kernel (verl_check.py fused); and the element-wise
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
FUSED = "actor_rollout_ref.model.use_fused_kernels"
FUSED_BACKEND = "actor_rollout_ref.model.fused_kernel_options.impl_backend"
FUSED_CHUNK = 512  # FusedLinearForPPO's chunk_size (utils/experimental/torch_functional.py)
FUSED_FORWARD_BYTES, FUSED_TRAIN_BYTES, FUSED_TRAIN_BYTES_NO_ENTROPY, FUSED_MOVED_BYTES = 12.0, 28.0, 20.0, 62.0
ENTROPY_SETTINGS = ("entropy_from_logits_with_chunking", "entropy_checkpointing", "entropy_from_logits_chunk_size")
ENGINE_BLOCK = {"dp": {"actor": f"{A}.fsdp_config", "ref": "actor_rollout_ref.ref.fsdp_config"},
                "megatron": {"actor": f"{A}.megatron", "ref": "actor_rollout_ref.ref.megatron"}}
ROLE_BLOCK = {"actor": A, "ref": "actor_rollout_ref.ref"}


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


# sections of verl's config whose keys are the user's own (Hydra's `+key=value` adds them): the
# chat template's keyword arguments (data.apply_chat_template_kwargs, handed to the tokenizer's
# apply_chat_template: enable_thinking, say), which shape the prompts' text; realbench prices
# prompts and responses at their configured lengths, so they are carried as given (NEUTRAL); and
# the reward manager's keyword arguments (reward.reward_kwargs, and the legacy reward_model's, which
# verl moves there: experimental/reward_loop/reward_loop.py:69-72), DAPO's overlong penalty among
# them (workers/reward_manager/dapo.py: a function of each response's length, on the scorer's CPU).
# FSDP's mixed precision, an open dict of each FSDP engine block (FSDPEngineConfig.mixed_precision,
# default None), of which verl reads three dtypes and defaults each as realbench prices it
# (workers/engine/fsdp/transformer_impl.py:391-401): given equal to those, carried; otherwise refused
# (read_config checks them)
MIXED_PRECISION = {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
MIXED_PRECISION_BLOCKS = tuple(f"{block}.mixed_precision." for block in
                               (f"{A}.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp"))
OPEN_SECTIONS = ("data.apply_chat_template_kwargs.", "reward.reward_kwargs.", "reward_model.reward_kwargs.",
                 *MIXED_PRECISION_BLOCKS)
DTYPE_NAMES = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32", "fp16": "fp16",
               "float16": "fp16"}
# sections realbench prices no part of, whose keys a job may add (verl's teachers, by name, with `+`)
UNPRICED_SECTIONS = {"distillation.": "verl's on-policy distillation (a teacher's forward over every batch, and its "
                                      "loss)"}
# keys verl reads that its composed config does not hold (Hydra's `+key=value`)
ADDED_KEYS = {"critic.ppo_infer_max_token_len_per_gpu": CRITIC_TOKENS}
PRICING_GAPS = ("with use_dynamic_bsz the micro-batches verl forms (realbench.engines.verl_packer, its mean count "
                "over steps drawn from the response lengths) are priced as that many equal ones, each holding a "
                "GPU's rows evenly; verl's are unequal (its workload-balanced partition), and memory is planned for "
                "one as full as the budget",
                "a reward model on its own pool scores each response as its generation ends (verl's reward "
                "loop); realbench scores the batch after generation, beside the reference's and critic's "
                "forwards on the trainer's GPUs: a step at most the reward call's time too long",
                serving_gap("max_num_seqs", "gpu_memory_utilization"),
                "an actor whose parameters are offloaded (param_offload) brings them in for the weight sync, priced "
                "in time over the host link, not in memory: the sync holds them beside the rollout's weights, with "
                "its KV cache released")
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
BYPASS = "algorithm.rollout_correction.bypass_mode"
SERVERS = ("vllm", "sglang")  # the rollouts realbench writes (rollout.name; one for the reward model too)
# the share of each GPU's memory the rollout's server takes, vLLM's gpu_memory_utilization or SGLang's
# mem_fraction_static (workers/rollout/vllm_rollout/vllm_async_server.py:340,
# sglang_rollout/async_sglang_server.py:317): the generation call's memory_fraction, verl's default
# where a scenario gives none
MEMORY = "actor_rollout_ref.rollout.gpu_memory_utilization"
MEMORY_FRACTION = 0.5
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
# a PEFT adapter folder the actor's adapters start from (verl/workers/engine/fsdp/transformer_impl.py:342-356:
# PeftModel.from_pretrained, its own r, alpha and modules; read only with lora_rank > 0, :162, 598-599, which
# also sizes vLLM's LoRA slots): realbench's checkpoint entry `adapter:`
ADAPTER_PATH = "actor_rollout_ref.model.lora_adapter_path"
# the NEUTRAL settings realbench reads into the scenario and writes from it (engines.carried_problem)
CAPTURED = (*sorted(set(MODEL_PATHS.values())), "reward.custom_reward_function.", ADAPTER_PATH)
# carried settings the plan may need otherwise (engines.with_carried)
REQUIRED = {f"{R}.calculate_log_probs": f"{BYPASS} reads generation's log-probabilities"}
# rows packed without padding (the models' flash-attention varlen path), verl's default for both
# (trainer/config/model/hf_model.yaml, critic/dp_critic.yaml: use_remove_padding true);
# realbench's training.padding_free, with the block set apart in training.padded_models (the
# actor's block holds the actor and its reference, the critic's the critic)
PADDING_FREE = True
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
# (workers/config/critic.py: FSDPCriticConfig copies nothing): refused above 1 (CRITIC_SP_UNREAD)
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
           # (verl's FSDP offloads a forward-only model whatever this says: FORWARD_OFFLOAD)
           "actor_rollout_ref.ref.fsdp_config.param_offload",
           "actor_rollout_ref.model.trust_remote_code", "critic.model.trust_remote_code", "data.trust_remote_code",
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
           f"{R}.enable_chunked_prefill", f"{R}.enable_prefix_caching", f"{R}.max_num_batched_tokens",
           f"{R}.dtype", f"{R}.load_format", f"{R}.calculate_log_probs", f"{R}.log_prob_micro_batch_size_per_gpu",
           f"{R}.log_prob_use_dynamic_bsz", f"{R}.log_prob_max_token_len_per_gpu",
           "reward.custom_reward_function.", "reward.reward_manager", "reward.num_workers",
           f"{RM}.rollout.gpu_memory_utilization", f"{RM}.rollout.enforce_eager", f"{RM}.rollout.free_cache_engine",
           f"{RM}.rollout.dtype", f"{RM}.rollout.max_num_batched_tokens",
           f"{A}.checkpoint.", "critic.checkpoint.", "ray_kwargs.", "global_profiler.", f"{A}.profiler.",
           "critic.profiler.", f"{R}.profiler.", "actor_rollout_ref.ref.profiler.")


@lru_cache(maxsize=1)
def _table() -> dict:
    return json.loads(TABLE.read_text())


def known_keys(engine: str, one_step_off: bool = False) -> set[str]:
    """The settings verl's config for model_engine `engine` holds (the one-step-off entry's)."""
    return set(defaults(engine, one_step_off)) | set(ADDED_KEYS)


def defaults(engine: str, one_step_off: bool = False) -> dict[str, Any]:
    """verl's composed ppo_trainer config for model_engine `engine` (dp | megatron), flat:
    dotted key -> default (interpolations unresolved); with `one_step_off` the one-step-off entry
    point's (one_step_off_ppo_trainer: its rollout pool, and the rollout's settings it changes)."""
    table = _table()
    return {**table["keys"][engine], **table["one_step_off"][engine]} if one_step_off else table["keys"][engine]


# -- reading a configuration ------------------------------------------------------------------------
def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def _nest(flat: dict[str, Any]) -> dict:
    out: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


# sections whose keys verl hands on as given, and what realbench says of a key it does not read there
PASSED_THROUGH = {
    ".override_transformer_config.": "a Megatron TransformerConfig field verl passes through, which realbench does not "
                                     "price (it reads the recompute_* fields)",
    ".override_optimizer_config.": "a Megatron OptimizerConfig field verl passes through (its optimizer offload "
                                   "among them), which realbench does not price",
    ".engine_kwargs.": "an argument verl passes to the rollout's serving engine (rollout.engine_kwargs), which "
                       "realbench does not price",
    ".override_config.": "a field of the model's HF config verl overrides; realbench reads the model from its "
                         "checkpoint's config.json and does not price an override"}


def _unpriced_section(key: str) -> Optional[str]:
    """What realbench does not price of the UNPRICED_SECTIONS `key` lies in, or None."""
    return next((what for section, what in UNPRICED_SECTIONS.items() if key.startswith(section)), None)


def _unknown(key: str, engine: str, source: str, one_step_off: bool = False) -> ConfigError:
    for section, what in PASSED_THROUGH.items():
        if section in key:
            return ConfigError(what, key, source)
    unpriced = _unpriced_section(key)
    if unpriced:
        return ConfigError(f"{unpriced}, which realbench does not price", key, source)
    close = difflib.get_close_matches(key, list(defaults(engine, one_step_off)) + list(ADDED_KEYS), n=1, cutoff=0.8)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"verl {VERSION} has no such setting{hint}", key, source)


def _engine_of(doc: dict, overrides: list[str], source: str) -> tuple[str, bool]:
    """(model_engine, whether the config is the one-step-off entry point's). model_engine: from the
    primary config's defaults list (`override model_engine: X`, or the config it extends:
    ppo_megatron_trainer is ppo_trainer with megatron), a composed config's own key, or an
    override `model_engine=X`. One-step-off: a config that extends one_step_off_ppo_trainer, or
    one that gives the rollout's own pool (its top-level `rollout` block, as that config and a
    composed run of it do; an override `rollout.nnodes=...`)."""
    engine = doc.get("model_engine", "dp")
    one_step_off = isinstance(doc.get("rollout"), dict) or any(o.lstrip("+").startswith("rollout.") for o in overrides)
    extends = "realbench reads configs that extend ppo_trainer (or the one-step-off entry's one_step_off_ppo_trainer)"
    for entry in doc.get("defaults", []) or []:
        if isinstance(entry, dict):
            for k, v in entry.items():
                if k.replace("override ", "").strip("/ ") == "model_engine":
                    engine = v
                else:
                    raise ConfigError(f"{extends}; {k!r} is not read", "defaults", source)
        elif entry in BASE_CONFIGS or entry in ONE_STEP_OFF_CONFIGS:
            engine = {**BASE_CONFIGS, **ONE_STEP_OFF_CONFIGS}[entry]
            one_step_off = one_step_off or entry in ONE_STEP_OFF_CONFIGS
        elif entry != "_self_":
            raise ConfigError(f"{extends}; {entry!r} is not read", "defaults", source)
    for o in overrides:
        if o.split("=", 1)[0] == "model_engine":
            engine = o.split("=", 1)[1]
    if engine not in ENGINES:
        raise ConfigError(f"model_engine {engine!r}: realbench prices {', '.join(ENGINES)} (FSDP and Megatron)",
                          "model_engine", source)
    return engine, one_step_off


def read_config(path: str | Path, overrides: list[str] = ()) -> tuple[str, dict[str, Any], set[str]]:
    """(model_engine, every setting resolved as verl resolves them, the keys given) of a verl
    config file and Hydra-style overrides (`key=value`; `+key=value` only for keys verl reads
    beyond its YAML and Megatron's override_transformer_config fields, as Hydra adds them;
    `++key=value` either way). A composed config gives every key: those equal to verl's default
    are not counted as given."""
    source = str(path)
    doc = read_document(path, schema=False)
    overrides = list(overrides)
    engine, one_step_off = _engine_of(doc, overrides, source)
    table = defaults(engine, one_step_off)
    settings = {k: v for k, v in doc.items() if k not in ("defaults", "hydra", "model_engine")}
    given = _flatten(settings) if settings else {}  # (a config of defaults alone, the overrides giving the rest)
    for o in overrides:
        key, eq, raw = o.partition("=")
        if not eq or not key or key.startswith("~"):
            raise ConfigError("an override is key=value (or +key=value)", o, "overrides")
        if key == "model_engine":
            continue
        value = load_yaml(raw) if raw else None
        if key.startswith("++"):  # (Hydra's add or override)
            key = key[2:]
        elif key.startswith("+"):
            key = key[1:]
            # (Hydra: "Could not append to config. An item is already at ..."; Megatron's
            # override_transformer_config fields are not there yet when Hydra applies overrides: tested)
            if key in table and ".override_transformer_config." not in key:
                raise ConfigError(f"+ adds a key verl's config does not hold, and it holds this one: give {key}=... "
                                  "without + (Hydra refuses to add a key that is there)", o, "overrides")
            if key not in ADDED_KEYS and key not in table and not key.startswith(OPEN_SECTIONS):
                raise _unknown(key, engine, "overrides", one_step_off)
        given.update(_flatten(value, f"{key}.") if isinstance(value, dict) else {key: value})
    known = {**table, **ADDED_KEYS}
    for key in given:
        if key.startswith(MIXED_PRECISION_BLOCKS):
            _check_mixed_precision(key, given[key], source)
        elif key not in known and not key.startswith(OPEN_SECTIONS):
            raise _unknown(key, engine, source, one_step_off)
    changed = {k for k, v in given.items() if v != known.get(k)}
    return engine, resolve(engine, given, one_step_off), changed


def _check_mixed_precision(key: str, value: Any, source: str) -> None:
    """Refuse by name an FSDP mixed precision other than verl's own (MIXED_PRECISION), which
    realbench prices, and a dtype verl does not read."""
    name = key.rsplit(".", 1)[1]
    if name not in MIXED_PRECISION:
        raise ConfigError(f"verl's FSDP engine reads {', '.join(MIXED_PRECISION)} of mixed_precision "
                          "(workers/engine/fsdp/transformer_impl.py:391-401), not this", key, source)
    if DTYPE_NAMES.get(str(value).lower()) != MIXED_PRECISION[name]:
        raise ConfigError(f"{value!r}: realbench prices FSDP's mixed precision as verl defaults it (bf16 parameters, "
                          "fp32 gradient reduction and buffers, workers/engine/fsdp/transformer_impl.py:391-401)",
                          key, source)


def resolve(engine: str, given: dict[str, Any], one_step_off: bool = False) -> dict[str, Any]:
    """verl's settings with `given` (flat) over its defaults (the one-step-off entry's),
    interpolations resolved (OmegaConf, as verl resolves them)."""
    from omegaconf import OmegaConf

    merged = OmegaConf.create(_nest({**defaults(engine, one_step_off), **ADDED_KEYS, **given}))
    return _flatten(OmegaConf.to_container(merged, resolve=True))


def refuse_unpriced(engine: str, settings: dict[str, Any], given: set[str], source: str) -> None:
    """Refuse by name the first setting given (and changed from what verl would give it) that
    realbench neither reads (READ) nor knows to leave a step's time and memory alone (NEUTRAL).
    (Settings that follow others by interpolation are checked through those.)"""
    one_step_off = ROLLOUT_POOL[0] in settings
    for key in sorted(given):
        if one_step_off and key in V1_KEYS:
            raise ConfigError(f"{settings[key]!r}: the one-step-off entry point runs its own trainer "
                              f"({ONE_STEP_OFF}/ray_trainer.py), not the V1 trainer this setting chooses", key, source)
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
                           "decode step's launches as CUDA graphs run them"),
    f"{R}.free_cache_engine": ("the rollout's server then keeps its share of every GPU through training (its sleep "
                               "and wake-up skipped, vllm_async_server.py:853-862), where realbench prices a "
                               "colocated rollout's memory released while the trainer runs")}


# -- a configuration as a scenario and a plan ---------------------------------------------------------
def _ceil(a: float, b: float) -> int:
    return max(1, math.ceil(a / b))


def _rounds(rows: int, at_most: int) -> int:
    """The micro-batches realbench prices for a GPU's `rows` taken at most `at_most` at a time (a
    serving replica's max_num_seqs, a trainer's rows a micro-batch): ceil(rows / at_most), counted
    as the fewest equal splits of the rows at least as many (realbench's plans split a GPU's rows
    evenly)."""
    return _splits(rows, _ceil(rows, at_most))


def _formed(step: StepRows, rows: int, ranks: int, budget: int, divided_by: Optional[int] = None,
            sp: int = 1) -> Optional[int]:
    """The micro-batches realbench prices for a GPU's `rows` that verl's dynamic batching packs
    within `budget` tokens on `ranks` data-parallel ranks (verl_packer.mean_count, on the steps
    `step` draws): the mean count, to the nearest whole one, as the fewest equal splits of the rows
    at least as many (a multiple of `divided_by`, Megatron's with virtual stages: realbench's plans
    split a GPU's rows evenly); None where verl refuses it (a multiple beyond the rows). Under
    Ulysses (`sp` GPUs a rank) a rank's rows are its group's and its budget `budget` x sp
    (verl/workers/engine/utils.py:104-111)."""
    mean = mean_count(step, rows, ranks, budget * sp, divided_by)
    return None if mean is None else _splits(rows, max(1, round(mean)), divided_by or 1)


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


def _splits(rows: int, count: int, multiple: int = 1) -> Optional[int]:
    """The fewest equal splits of a GPU's `rows` at least `count` and a multiple of `multiple`
    (realbench's plans split a GPU's rows evenly); None where no count of splits is one (never
    with `multiple` 1: the rows themselves)."""
    return next((m for m in range(min(count, rows), rows + 1) if rows % m == 0 and m % multiple == 0), None)


def _divide(rows: int, per_gpu: Optional[int], key: str, source: str) -> int:
    """Micro-batches of a replica's `rows` in micro-batches of `per_gpu` rows (verl refuses a
    remainder, verl/workers/engine/utils.py:122-128)."""
    if not per_gpu:
        raise ConfigError("is not set: verl needs it without use_dynamic_bsz", key, source)
    if rows % per_gpu:
        raise ConfigError(f"{per_gpu} does not divide a GPU's {rows} rows (verl splits them evenly)", key, source)
    return rows // per_gpu


def _function_mesh(rows: int, pool: Mesh) -> Mesh:
    """Where the plan puts a reward function (verl calls it on CPU workers beside generation; its
    cost is per response, wherever it runs): the generating `pool` where its responses split
    evenly over every GPU, else the first GPUs of the pool's first node that split them."""
    if rows % pool.size == 0:
        return pool
    size = pool.gpus
    while rows % size:
        size //= 2
    return Mesh(pool.node, 1, pool.gpu, size)


def _one_step_off_pools(s: dict[str, Any], gpus_per_node: Optional[int], source: str) -> tuple[int, Mesh, Mesh]:
    """(GPUs a node, the trainer's pool, the rollout's) of the one-step-off entry point: the
    trainer's `trainer.nnodes` x `trainer.n_gpus_per_node` GPUs and the rollout's `rollout.nnodes` x
    `rollout.n_gpus_per_node` (ROLLOUT_POOL), which Ray places on the machines it has. verl's
    examples split each node (one_step_off_policy/shell/*_2_6.sh: a node's GPUs less the rollout's
    train): one node each, both on one node of their sum, the trainer's GPUs first; or a node size
    given (`gpus_per_node`): the two on one node where they fit it, else the trainer's whole nodes
    and the rollout's whole nodes (or part of one) after them. realbench places a call on an
    aligned power-of-two block of a node's GPUs, or on whole nodes."""
    T, t = int(s["trainer.nnodes"]), int(s["trainer.n_gpus_per_node"])
    R, r = (int(s[k]) for k in ROLLOUT_POOL)
    for key, value in (("trainer.nnodes", T), ("trainer.n_gpus_per_node", t), *zip(ROLLOUT_POOL, (R, r))):
        if value <= 0:  # (verl's own check, experimental/separation/utils.py:38-47)
            raise ConfigError(f"{value}: verl needs it above 0 ({ONE_STEP_OFF} pools)", key, source)
    G = gpus_per_node or (t + r if T == R == 1 else t)
    if T == R == 1 and t + r <= G:
        if not (is_pow2(t) and is_pow2(r) and t % r == 0):
            raise ConfigError(f"{r} after the trainer's {t} on one node: realbench places each on an aligned "
                              "power-of-two block of a node's GPUs (the trainer's first)", ROLLOUT_POOL[1], source)
        return G, Mesh(0, 1, 0, t), Mesh(0, 1, t, r)
    across = (f"realbench places a pool across nodes on whole nodes (of {G} GPUs: give the node size, "
              "--gpus-per-node, where it differs), the rollout's after the trainer's, or on an aligned power-of-two "
              "block of the next node")
    if t != G:
        raise ConfigError(f"{t} on {T} node(s) beside the rollout's {r} on {R}: {across}", "trainer.n_gpus_per_node",
                          source)
    if r != G and (R > 1 or not is_pow2(r) or r > G):
        raise ConfigError(f"{r} on {R} node(s) beside the trainer's {t} on {T}: {across}", ROLLOUT_POOL[1], source)
    return G, Mesh(0, T, 0, G), Mesh(T, R, 0, r)


def _replica_tp(tp: int, gpus: int, per_node: int, key: str, source: str) -> int:
    """A serving replica's tensor parallel size: it fits a node or spans whole nodes
    (verl/workers/rollout/replica.py:107-117) and its replicas share the GPUs evenly."""
    if gpus % tp or (per_node % tp and tp % per_node):
        raise ConfigError(f"{tp}: a replica fits a node or spans whole nodes of {per_node} GPUs "
                          "(verl/workers/rollout/replica.py:107-117)", key, source)
    return tp


def _checkpointing(engine: str, s: dict, role: str) -> bool:
    """Whether a trained role recomputes every layer (FSDP: gradient checkpointing; Megatron:
    full uniform recomputation of one layer at a time)."""
    if engine == "dp":
        return bool(s[f"{'actor_rollout_ref' if role == 'actor' else 'critic'}.model.enable_gradient_checkpointing"])
    block = f"{A}.megatron" if role == "actor" else "critic.megatron"
    o = f"{block}.override_transformer_config"
    got = (s.get(f"{o}.recompute_granularity"), s.get(f"{o}.recompute_method"), s.get(f"{o}.recompute_num_layers"))
    if got == (None, None, None):
        return False
    if got == ("full", "uniform", 1):
        return True
    raise ConfigError(f"{got}: realbench prices no recomputation or Megatron's full uniform recomputation of each "
                      "layer (full, uniform, 1)", f"{o}.recompute_granularity")


def _sequence_parallel(s: dict, gpus: int, per_node: int, roles: dict[str, bool], source: str) -> dict[str, int]:
    """Each role's Ulysses sequence parallel size (SEQUENCE_PARALLEL; the reference's follows the
    actor's unless set): verl's FSDP engine splits its GPUs into data-parallel groups of that many
    (a (dp, sp) device mesh, workers/engine/fsdp/transformer_impl.py:242-252), which need its rows
    packed (use_remove_padding, :148-152). A role the job does not have (`roles` false) is left at
    1, and so is every role under Megatron, whose blocks have no such key (verl's Megatron config
    refuses one as unknown)."""
    def size(key: str) -> int:  # (a Megatron block has none of these keys)
        return 1 if s.get(key) is None else int(s[key])

    if roles["critic"] and size(CRITIC_SP_UNREAD) != 1:
        raise ConfigError(f"{s[CRITIC_SP_UNREAD]}: verl {VERSION}'s critic engine does not read it (FSDPCriticConfig "
                          f"copies nothing to its engine, verl/workers/config/critic.py): set "
                          f"{SEQUENCE_PARALLEL['critic'][1]}", CRITIC_SP_UNREAD, source)
    out = {}
    for role, (deprecated, engine_key) in SEQUENCE_PARALLEL.items():
        key = deprecated if deprecated and size(deprecated) > 1 else engine_key
        sp = size(key)
        out[role] = sp if roles[role] else 1
        if sp == 1 or not roles[role]:
            continue
        if sp < 1 or gpus % sp:
            raise ConfigError(f"{sp} does not divide the trainer's {gpus} GPUs (verl's (dp, sp) device mesh, "
                              "verl/workers/engine/fsdp/transformer_impl.py:246-249)", key, source)
        if per_node % sp:
            raise ConfigError(f"{sp}: realbench prices a sequence-parallel group inside a node of {per_node} GPUs",
                              key, source)
        padding = REMOVE_PADDING[1] if role == "critic" else REMOVE_PADDING[0]
        if not s[padding]:
            raise ConfigError(f"{sp} with {padding} false: verl runs Ulysses on packed rows only "
                              "(verl/workers/engine/fsdp/transformer_impl.py:148-152)", key, source)
    return out


def _shard_group(s: dict, role: str, gpus: int, per_node: int, source: str) -> dict[str, int]:
    """A role's FSDP hybrid sharding group as the plan's `shard_group` ({} for full sharding):
    FSDP_SIZE, refused where verl's device mesh cannot be built or realbench does not price it."""
    key = FSDP_SIZE[role]
    size = int(s[key])
    if size < 0 or size >= gpus:
        return {}
    if size == 0 or gpus % size:
        raise ConfigError(f"{size} does not divide the trainer's {gpus} GPUs (verl's (GPUs / fsdp_size, fsdp_size) "
                          "device mesh, verl/workers/engine/fsdp/utils.py:35-53)", key, source)
    if straddles_nodes(size, per_node):
        raise ConfigError(f"{size}: realbench prices a shard group that divides a node of {per_node} GPUs or spans "
                          "whole ones", key, source)
    return {"shard_group": size}


V1_KEYS = ("trainer.use_v1", "trainer.v1.trainer_mode")  # the trainer verl.trainer.main_ppo runs
READ = {BYPASS, MAX_MODEL_LEN, *(k for keys in SEQUENCE_PARALLEL.values() for k in keys if k), CRITIC_SP_UNREAD,
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
        *LORA_KEYS.values(), LORA_MERGE, ADAPTER_PATH, FUSED, FUSED_BACKEND, *FSDP_SIZE.values(), ROLLOUT_DP,
        ROLLOUT_EP} | {
        f"{block}.{k}" for block in MEGATRON_BLOCKS.values()
        for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
                  "context_parallel_size", "dynamic_context_parallel", *EXPERT_KEYS,
                  "use_distributed_optimizer", "override_transformer_config.recompute_granularity",
                  "override_transformer_config.recompute_method", "override_transformer_config.recompute_num_layers")}


def _size(s: dict[str, Any], key: str, source: str) -> Optional[int]:
    """A parallel size setting: a whole number of GPUs, 1 or more, or None (unset)."""
    value = s[key]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{value!r}: a parallel size is a whole number of GPUs, 1 or more", key, source)
    return value


def _megatron_experts(s: dict[str, Any], specs, critic: bool, with_ref: bool, tp: int,
                      source: str) -> dict[str, tuple[int, int]]:
    """Each Megatron role's (ep, etp) as verl's engines build it (EXPERT_KEYS; etp None is tp's),
    for the roles whose model has experts (or is not known here: `specs(role)` None): the actor's,
    process-global (the reference's block and a critic's with experts must be the actor's, as its
    tp); a model without experts takes none (its block at verl's defaults, 1 and null)."""
    def layout(role: str) -> tuple[int, int]:
        ep, etp = (_size(s, f"{MEGATRON_BLOCKS[role]}.{k}", source) for k in EXPERT_KEYS)
        return ep or 1, etp or tp

    actor = layout("actor")
    out = {}
    for role in ("actor", *(("ref",) if with_ref else ()), *(("critic",) if critic else ())):
        got, model = layout(role), specs("critic" if role == "critic" else "actor")
        keys = [f"{MEGATRON_BLOCKS[role]}.{k}" for k in EXPERT_KEYS]
        if model is not None and model.moe is None:
            if got != (1, tp):
                key = keys[0] if got[0] != 1 else keys[1]
                raise ConfigError(f"{s[key]}: expert parallelism splits a mixture of experts' routed experts; the "
                                  f"{role}'s model ({model.name}) has none", key, source)
            continue
        for key, value, want in zip(keys, got, actor):
            if value != want:
                raise ConfigError(f"{s[key]}: verl's Megatron state is process-global, the actor's ({want}) wins "
                                  "(verl/workers/engine/megatron/transformer_impl.py:239-256)", key, source)
        out[role] = got
    return out


def _rollout_experts(s: dict[str, Any], tp: int, pool: Mesh, server: str, model, source: str) -> dict[str, int]:
    """The rollout's expert parallelism as the plan's generation carries it (ROLLOUT_DP,
    ROLLOUT_EP: ep = expert_parallel_size over replicas of tp x data_parallel_size GPUs, each expert
    whole), {} without it; refused by name where verl refuses it or realbench does not price it."""
    D, E = (_size(s, key, source) or 1 for key in (ROLLOUT_DP, ROLLOUT_EP))
    if E > 1 and E != tp * D:
        raise ConfigError(f"{E}: verl asserts expert_parallel_size == tensor_model_parallel_size x data_parallel_size "
                          f"({tp} x {D} = {tp * D}) where above 1 (verl/workers/config/rollout.py:294-297)",
                          ROLLOUT_EP, source)
    if D > 1 and E == 1:
        raise ConfigError(f"{D} without expert parallelism (expert_parallel_size 1): the serving engine then splits a "
                          f"mixture of experts' experts by tensor parallelism over tp x dp = {tp * D} GPUs, which "
                          "realbench does not price (expert_parallel_size = tp x dp is)", ROLLOUT_DP, source)
    if D > 1 and server == "sglang":
        raise ConfigError(f"{D} with SGLang: verl hands SGLang tp_size = tp x dp and dp_size dp "
                          "(async_sglang_server.py:313-324), whose data-parallel attention is an engine argument "
                          "(enable_dp_attention) realbench does not read; realbench prices SGLang's expert "
                          "parallelism over a replica's tp GPUs (data_parallel_size 1, expert_parallel_size = tp)",
                          ROLLOUT_DP, source)
    G = pool.gpus
    if D > 1 and (pool.size % (tp * D) or (G % (tp * D) and (tp * D) % G)):
        raise ConfigError(f"{D}: a replica of tp x dp = {tp * D} GPUs fits a node or spans whole nodes of {G} "
                          "(verl/workers/rollout/replica.py:107-117) and the replicas share the GPUs evenly",
                          ROLLOUT_DP, source)
    if E == 1:
        return {}
    problem = expert_layout_problem(model, CallKind.GENERATE, Strategy(pool.size // tp, tp, 1, ep=E, etp=1))
    if problem:
        raise ConfigError(f"{E}: {problem[1]}", ROLLOUT_EP, source)
    return {"ep": E, **({"etp": 1} if tp > 1 else {})}


def to_plan(engine: str, s: dict[str, Any], given: set[str], name: str, device: str, source: str = "",
            lengths: Optional[LengthDistribution] = None, gpus_per_node: Optional[int] = None,
            models: Optional[dict[str, Any]] = None) -> tuple[dict, dict]:
    """(scenario document, plan document) of resolved verl settings `s` and the keys given (read_config).
    `lengths`: the responses' lengths verl's dynamic batching sees (default: every response at its
    cap; realbench.engines.verl_packer counts its micro-batches). `gpus_per_node`: the
    node size, for the one-step-off entry's two pools (the synchronous trainer's config gives it).
    `models`: the specs of the roles' models where known (else read from the checkpoints named:
    documents.model_of_path), for their experts' layouts."""
    refuse_unpriced(engine, s, given, source)
    known = dict(models or {})

    def specs(role: str):  # (a model's spec, read once; None where there is none to read here)
        if role not in known:
            known[role] = model_of_path(s["critic.model.path" if role == "critic" else "actor_rollout_ref.model.path"])
        return known[role]

    logits = logits_paths(engine, s, source)
    one_step_off = ROLLOUT_POOL[0] in s
    if one_step_off:
        if s[HYBRID]:
            raise ConfigError(f"True: the one-step-off trainer serves the rollout from its own pool, not the actor's "
                              f"hybrid engine (verl asserts it, {ONE_STEP_OFF}/ray_trainer.py:72)", HYBRID, source)
        per_node, trainer_pool, rollout_pool = _one_step_off_pools(s, gpus_per_node, source)
    else:
        if gpus_per_node:
            raise ConfigError("verl's configuration gives the node size (trainer.n_gpus_per_node)", "--gpus-per-node")
        if not s["trainer.use_v1"] or s["trainer.v1.trainer_mode"] != "sync":
            raise ConfigError(f"{s['trainer.v1.trainer_mode']!r}: realbench reads verl's synchronous V1 trainer (sync) "
                              "and its one-step-off entry point; verl's other asynchronous modes (partial rollouts, "
                              "sample-level staleness) are described in realbench.engines.verl, not priced",
                              "trainer.v1.trainer_mode", source)
        if not s[HYBRID]:
            raise ConfigError("False: verl's synchronous trainer serves the rollout from the actor's GPUs (its hybrid "
                              "engine); a rollout on GPUs of its own is the one-step-off entry point's (its config's "
                              "rollout.nnodes and rollout.n_gpus_per_node)", HYBRID, source)
        per_node = int(s["trainer.n_gpus_per_node"])
        trainer_pool = rollout_pool = Mesh(0, int(s["trainer.nnodes"]), 0, per_node)
    estimator = s[ESTIMATOR]
    if estimator not in ESTIMATORS and estimator not in SAME_CALLS:
        raise ConfigError(f"{estimator!r}: realbench plans {', '.join(ESTIMATORS)} (PPO, GRPO, RLOO) and, with "
                          f"GRPO's or RLOO's calls, {', '.join(SAME_CALLS)}", ESTIMATOR, source)
    algorithm = ESTIMATORS.get(estimator) or SAME_CALLS[estimator]
    critic = bool(s["critic.enable"]) if s["critic.enable"] is not None else estimator == "gae"
    if critic != (algorithm == "ppo"):
        raise ConfigError(f"{critic}: realbench's {algorithm.upper()} {'has' if algorithm == 'ppo' else 'has no'} "
                          "critic", "critic.enable", source)
    if one_step_off:
        if critic:  # (the V1 critic packs both calls to one budget; the legacy trainer its update to another)
            raise ConfigError(f"{estimator!r}: realbench reads verl's one-step-off trainer without a critic (GRPO, "
                              "RLOO): it packs the critic's update to critic.ppo_max_token_len_per_gpu "
                              "(verl/trainer/ppo/ray_trainer.py:808-811), which realbench does not read yet",
                              "algorithm.adv_estimator", source)
        if s[f"{RM}.enable"]:
            raise ConfigError("True: realbench reads verl's one-step-off trainer with a reward function; its reward "
                              "model is served by the reward loop beside the rollout "
                              "(experimental/separation/ray_trainer.py:263-275), not priced", f"{RM}.enable", source)
        if int(s[LORA_KEYS["r"]]) > 0:
            raise ConfigError(f"{s[LORA_KEYS['r']]}: realbench reads verl's one-step-off trainer for a whole actor; "
                              "the sync of a LoRA actor's weights to its own rollout pool is not priced",
                              LORA_KEYS["r"], source)
    # verl builds a reference only for a KL term (need_reference_policy, verl/trainer/ppo/utils.py:75-79)
    with_ref = bool(s["algorithm.use_kl_in_reward"] or s[f"{A}.use_kl_loss"])
    nodes, N = trainer_pool.nodes, trainer_pool.size
    prompts, n = int(s["data.train_batch_size"]), int(s[f"{R}.n"])
    if algorithm != "ppo" and n < 2:
        priced_as = f"realbench prices {estimator} with {algorithm.upper()}'s calls, which compare" \
            if estimator in SAME_CALLS else f"{algorithm.upper()} compares"
        raise ConfigError(f"{n}: {priced_as} a prompt's samples: 2 or more", f"{R}.n", source)
    mini = int(s[f"{A}.ppo_mini_batch_size"])
    if prompts % mini:
        raise ConfigError(f"{mini} does not divide data.train_batch_size {prompts}", f"{A}.ppo_mini_batch_size", source)
    if critic and int(s["critic.ppo_mini_batch_size"]) != mini:
        raise ConfigError("realbench trains actor and critic in the same optimizer steps: set it to the actor's",
                          "critic.ppo_mini_batch_size", source)
    steps = prompts // mini
    if s[BYPASS] and not s[f"{R}.calculate_log_probs"]:
        raise ConfigError("False: bypass_mode takes the rollout's log-probabilities, which the rollout returns only "
                          "with calculate_log_probs (verl/trainer/ppo/v1/trainer_base.py:1642-1646, agent_loop_tq.py:69)",
                          f"{R}.calculate_log_probs", source)
    epochs = int(s[f"{A}.ppo_epochs"])
    if critic and int(s["critic.ppo_epochs"]) != epochs:
        raise ConfigError("realbench trains actor and critic for the same passes: set it to the actor's",
                          "critic.ppo_epochs", source)
    server = s[f"{R}.name"]
    if server not in SERVERS:  # (verl/workers/rollout/replica.py: vllm, sglang, trtllm; ??? is verl's mandatory)
        raise ConfigError("is not set: verl needs it (vllm or sglang)" if server == "???" else
                          f"{server!r}: realbench prices and writes verl's vllm and sglang rollouts", f"{R}.name", source)
    if s[f"{RM}.enable"] and s[f"{RM}.rollout.name"] != server:
        raise ConfigError(f"is not set: verl needs it (the rollout's, {server!r})" if s[f"{RM}.rollout.name"] == "???"
                          else f"{s[f'{RM}.rollout.name']!r}: realbench carries one serving engine a job, the "
                          f"rollout's ({server!r})", f"{RM}.rollout.name", source)
    prompt_len, gen_len = int(s[f"{R}.prompt_length"]), int(s[f"{R}.response_length"])
    L = prompt_len + gen_len
    context = _max_model_len(s, L, source)
    step = StepRows(prompt_len, gen_len, lengths)
    rows = prompts * n

    if engine == "dp":  # (no expert parallelism: a mixture of experts sharded as any weight)
        tp = pp = v = 1
        zeros, experts = {}, {}
        for role, key in (("actor", f"{A}.fsdp_config.reshard_after_forward"),
                          ("critic", "critic.fsdp.reshard_after_forward")):
            zeros[role] = 3 if s[key] else 2
            if s[PARAM_OFFLOAD[role]] and not s[key]:
                raise ConfigError(f"True with {key} false: realbench prices a trained model's parameter offload "
                                  "fully sharded (zero 3)", PARAM_OFFLOAD[role], source)
            if s[STRATEGY[role]] not in FSDP_VERSIONS:
                raise ConfigError(f"{s[STRATEGY[role]]!r}: realbench prices verl's FSDP1 and FSDP2 (fsdp, fsdp2)",
                                  STRATEGY[role], source)
        if not s["actor_rollout_ref.ref.fsdp_config.reshard_after_forward"]:
            raise ConfigError("False: a forward-only FSDP model is priced fully sharded (zero 3)",
                              "actor_rollout_ref.ref.fsdp_config.reshard_after_forward", source)
        ref_zero = 3
    else:
        for key in STRATEGY.values():
            if s[key] != "megatron":
                raise ConfigError(f"{s[key]!r} with model_engine megatron: verl's Megatron engine is strategy megatron",
                                  key, source)
        meg = f"{A}.megatron"
        tp, pp = int(s[f"{meg}.tensor_model_parallel_size"]), int(s[f"{meg}.pipeline_model_parallel_size"])
        v = int(s[f"{meg}.virtual_pipeline_model_parallel_size"] or 1)
        cp = 1 if s[f"{meg}.context_parallel_size"] is None else int(s[f"{meg}.context_parallel_size"])
        if cp < 1:
            raise ConfigError(f"{cp}: a context-parallel ring is 1 GPU or more", f"{meg}.context_parallel_size", source)
        blocks = (meg, "critic.megatron", "actor_rollout_ref.ref.megatron") if critic else \
            (meg, "actor_rollout_ref.ref.megatron")
        for block in blocks[1:]:
            for k, want in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp),
                            ("virtual_pipeline_model_parallel_size", v), ("context_parallel_size", cp)):
                if int(s[f"{block}.{k}"] or 1) != want:
                    raise ConfigError(f"{s[f'{block}.{k}']}: verl's Megatron state is process-global, the actor's "
                                      f"({want}) wins (verl/workers/engine/megatron/transformer_impl.py:239-256)",
                                      f"{block}.{k}", source)
        for block in blocks:
            if s[f"{block}.dynamic_context_parallel"]:
                raise ConfigError("True: Megatron's dynamic context parallelism (a ring size chosen per micro-batch "
                                  "by its scheduler) is not priced; context_parallel_size is",
                                  f"{block}.dynamic_context_parallel", source)
        if N % (tp * pp * cp):
            raise ConfigError(f"tp x pp x cp = {tp * pp * cp} does not divide the {N} GPUs",
                              f"{meg}.context_parallel_size" if cp > 1 else f"{meg}.tensor_model_parallel_size", source)
        zeros = {"actor": int(bool(s[f"{meg}.use_distributed_optimizer"])),
                 "critic": int(bool(s["critic.megatron.use_distributed_optimizer"]))}
        ref_zero = 0
        experts = _megatron_experts(s, specs, critic, with_ref, tp, source)
    dp = N // (tp * pp)
    # each role's data-parallel groups of sp GPUs: FSDP's Ulysses groups, or Megatron's context
    # parallel rings (one size, process-global; sequence_parallel)
    roles = {"actor": True, "ref": with_ref, "critic": critic}
    # each FSDP role's hybrid shard group (read first: a group verl cannot form is named before the batch rules)
    hybrid = {role: _shard_group(s, role, N, per_node, source) if there and engine == "dp" else {}
              for role, there in roles.items()}
    sps = _sequence_parallel(s, N, per_node, roles, source) if engine == "dp" else \
        {role: cp if there else 1 for role, there in roles.items()}
    groups = {role: dp // sp for role, sp in sps.items()}
    split = "ulysses_sequence_parallel_size" if engine == "dp" else "context_parallel_size"

    def budget(key: str, role: str = "actor") -> Optional[int]:
        # (verl packs a Ulysses group's or a context-parallel ring's rows to a GPU's budget times its
        # size: its engines pass sp_size, workers/engine/utils.py:104-111, megatron/transformer_impl.py:836)
        sp, per_gpu = sps[role], s[key]
        group = f" for a {split} {sp} group, {sp} x this" if sp > 1 else ""
        whole_row_budget(None if per_gpu is None else int(per_gpu) * sp, L, key, source,
                         f"verl asserts a budget at least that{group} (verl/utils/seqlen_balancing.py:384-386)")
        return None if per_gpu is None else int(per_gpu)

    def packed_count(rows_per_gpu: int, key: str, role: str = "actor") -> int:  # verl's dynamic batching (verl_packer)
        formed = _formed(step, rows_per_gpu, groups[role], budget(key, role), _divided_by(pp, v), sps[role])
        if formed is None:
            raise ConfigError(f"{budget(key, role)}: verl's Megatron engine would form a multiple of {pp} "
                              f"micro-batches (its virtual stages) beyond a GPU's {rows_per_gpu} rows", key, source)
        return formed

    def train_micro_batches(role: str) -> int:
        per_gpu = rows // steps // groups[role]  # (a data-parallel group's: a GPU's, or a Ulysses group's)
        if role == "critic":  # the V1 critic packs to one token budget (module doc)
            return packed_count(per_gpu, CRITIC_BUDGET, "critic")
        if s[f"{A}.use_dynamic_bsz"]:
            return packed_count(per_gpu, f"{A}.ppo_max_token_len_per_gpu")
        return _divide(per_gpu, s[f"{A}.ppo_micro_batch_size_per_gpu"], f"{A}.ppo_micro_batch_size_per_gpu", source)

    def sequence_parallel(role: str) -> dict[str, Any]:
        # (Megatron's context parallelism: Transformer Engine's p2p ring, Megatron's default cp_comm_type)
        return {} if sps[role] == 1 else {"sp": sps[role]} if engine == "dp" else {"sp": sps[role], "ring": "p2p"}

    def offloads(role: str) -> dict[str, bool]:
        block = OFFLOAD_BLOCK[engine][role]
        return {"offload_params": bool(s[f"{block}.param_offload"]),
                "offload_optimizer": bool(s[f"{block}.optimizer_offload"])}

    if s[f"{A}.use_dynamic_bsz"]:  # the actor's budget first: the reference's follows it unless set
        budget(f"{A}.ppo_max_token_len_per_gpu")
    ref = "actor_rollout_ref.ref"
    ref_m = (0 if not with_ref else
             packed_count(rows // groups["ref"], f"{ref}.log_prob_max_token_len_per_gpu", "ref")
             if s[f"{ref}.log_prob_use_dynamic_bsz"]
             else _divide(rows // groups["ref"], s[f"{ref}.log_prob_micro_batch_size_per_gpu"],
                          f"{ref}.log_prob_micro_batch_size_per_gpu", source))
    rollout_tp = _replica_tp(int(s[f"{R}.tensor_model_parallel_size"]), rollout_pool.size, rollout_pool.gpus,
                             f"{R}.tensor_model_parallel_size", source)
    replicas = rollout_pool.size // rollout_tp
    whole = trainer_pool.label(per_node)
    calls = {
        "actor_gen": {"mesh": rollout_pool.label(per_node), "dp": replicas, "tp": rollout_tp, "pp": 1,
                      "micro_batches": _rounds(rows // replicas, int(s[f"{R}.max_num_seqs"])),
                      **_rollout_experts(s, rollout_tp, rollout_pool, server, specs("actor"), source)},
        "actor_train": {"dp": groups["actor"], "tp": tp, "pp": pp, "micro_batches": train_micro_batches("actor"),
                        "activation_checkpointing": _checkpointing(engine, s, "actor"), "virtual_stages": v,
                        "zero": zeros["actor"], **offloads("actor"), **sequence_parallel("actor"),
                        **hybrid["actor"]},
    }
    if with_ref:  # (verl's FSDP offloads a forward-only model's parameters: FORWARD_OFFLOAD; Megatron as set)
        calls["ref_inf"] = {"dp": groups["ref"], "tp": tp, "pp": pp, "micro_batches": ref_m, "zero": ref_zero,
                            "offload_params": engine == "dp" or bool(s[REF_MEGATRON_OFFLOAD]),
                            **sequence_parallel("ref"), **hybrid["ref"]}
    reward_model = bool(s[f"{RM}.enable"])
    pool = _reward_pool(s, reward_model, nodes, per_node, source)
    if reward_model:  # vLLM / SGLang replicas of the reward model: on the same GPUs after generation, or its pool's
        scorer = pool or Mesh(0, nodes, 0, per_node)
        rm_tp = _replica_tp(int(s[f"{RM}.rollout.tensor_model_parallel_size"]), scorer.size, per_node,
                            f"{RM}.rollout.tensor_model_parallel_size", source)
        rm_replicas = scorer.size // rm_tp
        calls["reward_inf"] = {"mesh": scorer.label(per_node), "dp": rm_replicas, "tp": rm_tp, "pp": 1,
                               "micro_batches": _rounds(rows // rm_replicas, int(s[f"{RM}.rollout.max_num_seqs"]))}
    else:
        scorer = _function_mesh(rows, rollout_pool)
        calls["reward_inf"] = {"mesh": scorer.label(per_node), "dp": scorer.size, "tp": 1, "pp": 1, "micro_batches": 1}
    if critic:
        train_m = train_micro_batches("critic")
        calls["critic_train"] = {"dp": groups["critic"], "tp": tp, "pp": pp, "micro_batches": train_m,
                                 "activation_checkpointing": _checkpointing(engine, s, "critic"), "virtual_stages": v,
                                 "zero": zeros["critic"], **offloads("critic"), **sequence_parallel("critic"),
                                 **hybrid["critic"]}
        calls["critic_inf"] = {"dp": groups["critic"], "tp": tp, "pp": pp,
                               "micro_batches": packed_count(rows // groups["critic"], CRITIC_BUDGET, "critic"),
                               "zero": 3 if engine == "dp" else 0, **sequence_parallel("critic"),
                               **hybrid["critic"]}
    for c in calls.values():
        c.setdefault("mesh", whole)
    # each Megatron call's experts: its role's layout, checked against its model where known here
    for call, role in (("actor_train", "actor"), ("ref_inf", "ref"), ("critic_train", "critic"),
                       ("critic_inf", "critic")):
        if call not in calls or role not in experts:
            continue
        c, (ep, etp) = calls[call], experts[role]
        c.update({**({"ep": ep} if ep > 1 else {}), **({"etp": etp} if etp != tp else {})})
        kind = CallKind.TRAIN if call.endswith("_train") else CallKind.INFERENCE
        problem = expert_layout_problem(specs("critic" if role == "critic" else "actor"), kind, Strategy(
            c["dp"], tp, pp, zero=c.get("zero", 0), sp=c.get("sp", 1), ring=c.get("ring", ""), ep=ep,
            etp=0 if etp == tp else etp))
        if problem:
            key = f"{MEGATRON_BLOCKS['critic' if role == 'critic' else 'actor']}.{EXPERT_KEYS[problem[0] == 'etp']}"
            raise ConfigError(f"{s[key]}: {problem[1]}", key, source)
    actor_path = s["actor_rollout_ref.model.path"]
    models: dict[str, Any] = {"actor": {"path": actor_path}, **({"ref": {"path": actor_path}} if with_ref else {})}
    if int(s[LORA_KEYS["r"]]) > 0:
        if engine != "dp":
            raise ConfigError(f"{s[LORA_KEYS['r']]} with model_engine megatron: realbench reads verl's FSDP LoRA; its "
                              "Megatron LoRA is model.lora.*", LORA_KEYS["r"], source)
        adapter = s[ADAPTER_PATH]
        if adapter is None:
            models["actor"]["lora"] = {k: s[key] for k, key in LORA_KEYS.items()}
        else:  # the folder's own settings (its adapter_config.json), which verl trains with
            _same_rank(adapter, int(s[LORA_KEYS["r"]]), source)
            models["actor"]["adapter"] = adapter
        # the reference of a LoRA actor is the actor with its adapters off (ref_in_actor,
        # verl/trainer/ppo/v1/trainer_base.py:234-237): no reference model
        models.pop("ref", None)
        if s[LORA_MERGE]:
            calls["actor_gen"]["merge_lora"] = True
        if s[PARAM_OFFLOAD["actor"]]:
            raise ConfigError("True with lora_rank: a LoRA model's parameter offload is not priced",
                              PARAM_OFFLOAD["actor"], source)
    elif s[ADAPTER_PATH] is not None:
        raise ConfigError(f"{s[ADAPTER_PATH]!r} with lora_rank 0: verl loads an adapter folder only for a LoRA actor "
                          "(verl/workers/engine/fsdp/transformer_impl.py:162, 598-599)", ADAPTER_PATH, source)
    # each model block packs its rows or not (use_remove_padding): the actor's block holds the
    # actor's, the reference's and the old log-probabilities' calls, the critic's its own
    packed = {"actor": bool(s[REMOVE_PADDING[0]]), "critic": critic and bool(s[REMOVE_PADDING[1]])}
    # dynamic batching keeps every micro-batch within its budget (verl/utils/seqlen_balancing.py:395-455)
    for call, key, role in (("actor_train", s[f"{A}.use_dynamic_bsz"] and f"{A}.ppo_max_token_len_per_gpu", "actor"),
                            ("ref_inf", s[f"{ref}.log_prob_use_dynamic_bsz"] and f"{ref}.log_prob_max_token_len_per_gpu",
                             "actor"),
                            ("critic_train", CRITIC_BUDGET, "critic"), ("critic_inf", CRITIC_BUDGET, "critic")):
        if key and call in calls and packed[role]:
            calls[call]["max_tokens"] = budget(key, "ref" if call == "ref_inf" else role)
    padding_free = any(packed.values())
    if critic:
        models["critic"] = {"path": s["critic.model.path"], "value_head": True}
    reward_fn = s["reward.custom_reward_function.path"]
    if reward_model and reward_fn:
        raise ConfigError("realbench plans one scorer: a reward model or a reward function", f"{RM}.enable", source)
    if reward_model:
        models["reward"] = {"path": s[f"{RM}.model_path"], "value_head": True}
    elif reward_fn:
        models["reward"] = {"function": f"{reward_fn}:{s['reward.custom_reward_function.name']}"}
    else:  # (verl's own rule-based scorers, by each row's data_source)
        models["reward"] = {"function": BUILTIN_REWARD}
    padded = tuple(m for m, role in (("actor", "actor"), ("ref", "actor"), ("critic", "critic"))
                   if m in models and padding_free and not packed[role])
    return job_documents("verl", name, f"read from the verl {VERSION} configuration {Path(source).name} "
                         f"({ENGINES[engine]})", f"verl {VERSION} configuration", algorithm=algorithm, models=models,
                         prompts=prompts, prompt_len=prompt_len, gen_len=gen_len, steps=steps, group_size=n,
                         cluster={"nodes": max(m.node + m.nodes for m in (trainer_pool, rollout_pool, pool) if m),
                                  "gpus_per_node": per_node, "device": device}, epochs=epochs,
                         max_staleness=1 if one_step_off else 0,
                         calls=calls, with_ref=with_ref, old_logprobs="rollout" if s[BYPASS] else "whole_batch",
                         rollout_server=server, padding_free=padding_free, padded_models=padded,
                         memory_fraction=s[MEMORY], max_model_len=context if server == "vllm" else None,
                         logits={k: v.model_dump(exclude_defaults=True)
                                                            for k, v in logits.items() if k in calls})


POOL = "verl/trainer/ppo/v1/trainer_base.py:822-834"


def _max_model_len(s: dict[str, Any], length: int, source: str) -> Optional[int]:
    """The context verl's rollout server takes (MAX_MODEL_LEN: documents.served_context)."""
    return served_context(s[MAX_MODEL_LEN], s["actor_rollout_ref.model.path"], length, MAX_MODEL_LEN, source,
                          beyond="verl refuses (vllm_async_server.py:1106-1110)",
                          cut="verl's rollout would cut responses at max_model_len less the prompt "
                              "(vllm_async_server.py:589-599)")


def _reward_pool(s: dict[str, Any], reward_model: bool, nodes: int, per_node: int, source: str) -> Optional[Mesh]:
    """The reward model's own pool of GPUs (reward.reward_model.enable_resource_pool: nnodes x
    n_gpus_per_node beside the trainer's pool) as a mesh on the nodes after the trainer's `nodes`,
    or None (the reward model on the trainer's GPUs). realbench's nodes all have the trainer's
    width: the pool is whole such nodes, or part of one."""
    key = f"{RM}.enable_resource_pool"
    if not s[key]:
        return None
    if not reward_model:
        raise ConfigError(f"True without {RM}.enable: verl would hold a pool of GPUs for no reward model ({POOL})",
                          key, source)
    for k in ("n_gpus_per_node", "nnodes"):  # (verl's own check, in this order)
        if int(s[f"{RM}.{k}"]) <= 0:
            raise ConfigError(f"{s[f'{RM}.{k}']}: verl needs a reward pool's {k} above 0 ({POOL})", f"{RM}.{k}", source)
    pool_nodes, gpus = int(s[f"{RM}.nnodes"]), int(s[f"{RM}.n_gpus_per_node"])
    if gpus > per_node or (pool_nodes > 1 and gpus != per_node):
        raise ConfigError(f"{gpus} on {pool_nodes} node(s): realbench's nodes have the trainer's {per_node} GPUs "
                          "(trainer.n_gpus_per_node): a reward pool of whole such nodes, or part of one",
                          f"{RM}.n_gpus_per_node", source)
    return Mesh(nodes, pool_nodes, 0, gpus)


def _same_rank(adapter: str, rank: int, source: str) -> None:
    """Refuse a lora_rank other than the adapter folder's r, where the folder is there to read (verl
    trains the folder's adapters and sizes vLLM's LoRA slots by lora_rank)."""
    config = Path(adapter).expanduser() / "adapter_config.json"
    if config.is_file():
        r = json.loads(config.read_text()).get("r")
        if r != rank:
            raise ConfigError(f"{rank}: the adapter folder's r is {r} (verl trains the folder's adapters and sizes "
                              "vLLM's LoRA slots by lora_rank): give the same", LORA_KEYS["r"], source)


# -- a plan as a configuration ------------------------------------------------------------------------
def sync_buffer_problem(scenario: Scenario, options: dict[str, Option]) -> Optional[tuple[str, str]]:
    """(setting, why) where verl's weight sync to its colocated rollout could hold more of a GPU
    than the generation realbench prices there (BUCKET), or None: the sync's buffer (the scenario's
    carried BUCKET, or verl's default) and the largest tensor gathered (6 bytes a parameter) must
    fit in the KV cache's part of the rollout's share of each GPU, which the sync runs without."""
    gen = served_call(scenario.dataflow.call("actor_gen"), options["actor_gen"].strategy)
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
    if need <= cache:
        return None
    gib = 2 ** 30
    return BUCKET, (f"{bucket_mb} MB: verl's weight sync holds its buffer and the largest tensor gathered "
                    f"({need / gib:.1f} GiB a GPU) beside the rollout's weights, more than the KV cache it runs without "
                    f"({max(cache, 0) / gib:.1f} GiB at gpu_memory_utilization {gen.memory_fraction:g}, tp {tp}): the "
                    "sync would set the peak, which realbench does not price (a smaller buffer, or a larger memory "
                    "share)")


def read_problem(scenario: Scenario, options: dict[str, Option]) -> Optional[tuple[str, str]]:
    """What of a configuration read realbench cannot price as verl runs it, beyond its keys."""
    return sync_buffer_problem(scenario, options)


def space_problem(scenario: Scenario, options: dict[str, Option]) -> Optional[tuple[str, str]]:
    """(plan key, what verl cannot do) for the first part of a plan outside verl's space, or None."""
    c = scenario.cluster
    problem = space_problem_of_scenario(scenario) or sync_buffer_problem(scenario, options)
    if problem:
        return problem
    trainer, pool = pools(scenario, options)
    if scenario.dataflow.max_staleness:
        problem = _one_step_off_problem(scenario, trainer, options["actor_gen"].mesh)
        if problem:
            return problem
    elif pool is None and trainer != Mesh(0, c.nodes, 0, c.gpus_per_node):
        return "calls.actor_train.mesh", ("verl places every role on one pool of all the GPUs "
                                          "(verl/trainer/ppo/v1/trainer_base.py:805-820)")
    if pool is not None and (trainer != Mesh(0, trainer.nodes, 0, c.gpus_per_node) or pool.gpu
                             or (pool.node, pool.node + pool.nodes) != (trainer.nodes, c.nodes)):
        return "calls.reward_inf.mesh", ("verl runs a reward model on the trainer's pool or on its own "
                                         f"(reward.reward_model.enable_resource_pool, {POOL}): realbench writes the "
                                         "trainer's whole nodes from node 0 and the reward model's after them, to the "
                                         "cluster's last node")
    for name, o in options.items():  # (a reward function runs on verl's CPU workers: placed anywhere)
        if (o.mesh != trainer and scenario.dataflow.call(name).kind != CallKind.FUNCTION
                and not (name == "reward_inf" and pool is not None)
                and not (name == "actor_gen" and scenario.dataflow.max_staleness)):
            return f"calls.{name}.mesh", ("verl places every role on one pool of all the GPUs" if pool is None else
                                          "verl places every role but a reward model on the trainer's pool") + \
                " (verl/trainer/ppo/v1/trainer_base.py:805-820)"
    actor = options["actor_train"].strategy
    fsdp = actor.zero >= 2
    if scenario.models["actor"].lora is not None and not fsdp:
        return "calls.actor_train.zero", ("realbench writes verl's FSDP LoRA (lora_rank): train the LoRA actor with "
                                          "FSDP (zero 2 or 3)")
    if scenario.training.logits and not fsdp:
        return "calls.actor_train.zero", (f"realbench writes verl's fused kernels ({FUSED}) for its FSDP engine, as it "
                                          "prices them: train the actor with FSDP (zero 2 or 3)")
    for role, call in (("actor", "actor_train"), ("critic", "critic_train")):
        version = fsdp_version(scenario, role)
        if version is None or call not in options:
            continue
        key = f"engine_settings.{STRATEGY[role]}"
        if version not in FSDP_VERSIONS:
            return key, f"{version!r}: realbench writes verl's FSDP1 and FSDP2 (fsdp, fsdp2)"
        if not fsdp:
            return key, (f"{version!r}, the FSDP version of the configuration read: this plan trains with Megatron; "
                         "remove it from the scenario's engine_settings to write it")
    trained = [n for n in ("actor_train", "ref_inf", "critic_train", "critic_inf") if n in options]
    for name in trained:
        s = options[name].strategy
        if s.host_adam:
            return f"calls.{name}.host_adam", ("verl runs Adam on the GPUs (its optimizer_offload brings the states in "
                                               "for each update): Adam on the host is DeepSpeed's ZeRO-Offload")
        if fsdp and (s.tp, s.pp) != (1, 1):
            return f"calls.{name}.tp", "verl's FSDP engine has no tensor or pipeline parallelism (verl/workers/config/engine.py)"
        if fsdp and s.zero != 3 and not (s.zero == 2 and "train" in name):
            return f"calls.{name}.zero", ("verl trains actor, reference and critic with one engine (model_engine): "
                                          "FSDP shards every model (zero 3; zero 2 for training)")
        if not fsdp and ((s.tp, s.pp, s.virtual_stages if "train" in name else actor.virtual_stages)
                         != (actor.tp, actor.pp, actor.virtual_stages)):
            return f"calls.{name}.tp", ("verl's Megatron layout is process-global: actor, reference and critic share "
                                        "tp, pp and virtual stages (verl/workers/engine/megatron/transformer_impl.py)")
        if not fsdp and s.sp != actor.sp:
            return f"calls.{name}.sp", (f"verl's Megatron layout is process-global: actor, reference and critic share "
                                        f"one context_parallel_size (the actor's, {actor.sp})")
        if fsdp and (s.ep > 1 or s.etp):
            return f"calls.{name}.ep", ("verl's FSDP engine has no expert parallelism (a mixture of experts is sharded "
                                        "as any weight: ep 1, etp tp's); Megatron's is its engine's "
                                        "expert_model_parallel_size")
        if (not fsdp and getattr(scenario.model_of(scenario.dataflow.call(name)), "moe", None) is not None
                and (s.ep, s.expert_tp) != (actor.ep, actor.expert_tp)):
            return f"calls.{name}.ep", ("verl's Megatron layout is process-global: the models with experts share the "
                                        f"actor's expert_model_parallel_size and expert_tensor_parallel_size (ep "
                                        f"{actor.ep}, etp {actor.expert_tp})")
        if not fsdp and s.zero > (1 if "train" in name else 0):
            return f"calls.{name}.zero", "verl's Megatron engine shards optimizer states only (the distributed optimizer)"
        if (name == "critic_inf" and s.offload_params) or (name == "ref_inf" and fsdp
                                                           and s.offload_params != (s.shards > 1)):
            return f"calls.{name}.offload_params", FORWARD_OFFLOAD
        if s.ring == "allgather" or (s.ring == "p2p" and fsdp):
            return f"calls.{name}.ring", ("verl splits sequences by Ulysses' head exchanges under FSDP (ulysses_"
                                          "sequence_parallel_size) and by Megatron's p2p ring (context_parallel_size, "
                                          "ring: p2p), not by ring attention's all-gathers (OpenRLHF's)")
        if s.sp > 1 and not s.ring and not _remove_padding(scenario)["critic" in name]:
            return f"calls.{name}.sp", ("verl runs Ulysses sequence parallelism on packed rows only "
                                        "(use_remove_padding, verl/workers/engine/fsdp/transformer_impl.py:148-152): "
                                        "the scenario pads this model's rows (training.padding_free, padded_models)")
    if "critic_inf" in options and options["critic_inf"].strategy.shard_group != options["critic_train"].strategy.shard_group:
        return "calls.critic_inf.shard_group", ("verl's critic runs both its calls on one engine: one hybrid shard "
                                                f"group ({FSDP_SIZE['critic']})")
    if "critic_inf" in options and options["critic_inf"].strategy.sp != options["critic_train"].strategy.sp:
        return "calls.critic_inf.sp", ("verl's critic runs both its calls on one engine: one Ulysses sequence parallel "
                                       f"size ({SEQUENCE_PARALLEL['critic'][1]})")
    gen = options["actor_gen"].strategy
    if gen.pp > 1:
        return "calls.actor_gen.pp", "verl's rollout engines run no pipeline parallelism (verl/workers/config/rollout.py)"
    if c.gpus_per_node % gen.tp and gen.tp % c.gpus_per_node:
        return "calls.actor_gen.tp", "a verl rollout replica fits a node or spans whole nodes"
    # (expert parallelism: replicas of tp x data_parallel_size GPUs, ep = tp x dp: ROLLOUT_EP)
    if gen.ep > 1 and (gen.ep % gen.tp or gen.expert_tp != 1):
        return "calls.actor_gen.ep", ("verl's rollout splits the experts over whole replicas, each expert whole: "
                                      "expert_parallel_size = tensor_model_parallel_size x data_parallel_size, etp 1 "
                                      "(verl/workers/config/rollout.py:294-297)")
    if gen.ep > 1 and (c.gpus_per_node % gen.ep and gen.ep % c.gpus_per_node):
        return "calls.actor_gen.ep", (f"a verl rollout replica (tp x data_parallel_size = ep {gen.ep} GPUs) fits a "
                                      "node or spans whole nodes (verl/workers/rollout/replica.py:107-117)")
    if gen.ep > gen.tp and (scenario.rollout_server or "vllm") == "sglang":
        return "calls.actor_gen.ep", ("realbench writes SGLang's expert parallelism over a replica's tp GPUs (ep = tp, "
                                      "data_parallel_size 1): verl hands SGLang tp_size = tp x dp, whose data-parallel "
                                      "attention is an engine argument it does not read")
    reward = options["reward_inf"].strategy
    if not isinstance(scenario.models.get("reward"), FunctionSpec):
        if reward.ep > 1:
            return "calls.reward_inf.ep", ("realbench writes verl's reward model served without expert parallelism "
                                           "(reward.reward_model.rollout.expert_parallel_size 1)")
        if (reward.pp, reward.zero) != (1, 0):
            return "calls.reward_inf.pp", "verl serves a reward model with vLLM or SGLang replicas: no pipeline, no sharding"
        if c.gpus_per_node % reward.tp and reward.tp % c.gpus_per_node:
            return "calls.reward_inf.tp", "a verl reward model replica fits a node or spans whole nodes"
    return None


def _one_step_off_problem(scenario: Scenario, trainer: Mesh, rollout: Mesh) -> Optional[tuple[str, str]]:
    """What verl's one-step-off entry point cannot run of a plan's two pools (the trainer's, every
    training call's mesh; the rollout's, generation's), as its config writes them and reads back
    (_one_step_off_pools): the trainer's GPUs from the first, the rollout's after them on the same
    node, or on whole nodes (or part of one) after the trainer's whole nodes."""
    G = scenario.cluster.gpus_per_node
    same_node = trainer.nodes == 1 and rollout == Mesh(0, 1, trainer.gpus, rollout.gpus) and trainer.gpu == 0
    after = trainer == Mesh(0, trainer.nodes, 0, G) and rollout.node == trainer.nodes and rollout.gpu == 0
    if trainer.node or trainer.gpu or not (same_node or after):
        return "calls.actor_gen.mesh", ("verl's one-step-off trainer runs generation on a pool of its own "
                                        f"({ONE_STEP_OFF}): realbench writes the trainer's GPUs from the first and "
                                        "the rollout's after them, on the same node or on the nodes after the "
                                        "trainer's whole nodes")
    return None


def pools(scenario: Scenario, options: dict[str, Option]) -> tuple[Mesh, Optional[Mesh]]:
    """(the trainer's pool, the reward model's own pool or None) of a plan: the actor's mesh, and
    the reward model's where it differs (a reward function runs on CPU workers: no pool)."""
    trainer = options["actor_train"].mesh
    if isinstance(scenario.models.get("reward"), FunctionSpec) or options["reward_inf"].mesh == trainer:
        return trainer, None
    return trainer, options["reward_inf"].mesh


def fsdp_version(scenario: Scenario, role: str) -> Optional[str]:
    """The FSDP version (STRATEGY) the configuration a scenario was read from set for a trained
    role, carried in its engine_settings; None where it set none (verl's default, FSDP1)."""
    return scenario.engine_settings.get(STRATEGY[role]) if scenario.engine == "verl" else None


def _rows_per_step(scenario: Scenario, name: str, o: Option) -> int:
    call = scenario.dataflow.call(name)
    return call.seqs // call.optimizer_steps // o.strategy.dp


def _per_micro_batch(scenario: Scenario, name: str, o: Option) -> int:
    rows, m = _rows_per_step(scenario, name, o), o.strategy.micro_batches
    if rows % m:
        raise ConfigError(f"{m} does not divide a GPU's {rows} rows: verl splits them into equal micro-batches "
                          "(verl/workers/engine/utils.py:122-128)", f"calls.{name}.micro_batches")
    return rows // m


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
               _ceil(scenario.dataflow.call("critic_train").seq_len, sp))


def critic_budget(scenario: Scenario, options: dict[str, Option]) -> int:
    """The V1 critic's token budget a GPU (critic.ppo_infer_max_token_len_per_gpu) under which
    verl packs the critic's train and inference calls into the plan's micro-batch counts (module
    doc; the counts its dynamic batching forms, verl_packer), at least a whole row (verl asserts it,
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


def _remove_padding(scenario: Scenario) -> tuple[bool, bool]:
    """verl's use_remove_padding of the actor's model block (the actor's, the reference's and the
    old log-probabilities' calls) and of the critic's: the scenario's padding_free, but for its
    padded_models (a scenario priced as verl without them: verl's default, both packed)."""
    packed = packs(scenario, "verl", PADDING_FREE)
    padded = scenario.training.padded_models if scenario.engine == "verl" else ()
    return packed and "actor" not in padded, packed and "critic" not in padded


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
                    LORA_KEYS["target_modules"]: list(lora.target_modules), LORA_MERGE: gen.merge_lora})
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
    return {"hydra": {"searchpath": ["pkg://verl.trainer.config"]}, "defaults": defaults_list, **_nest(settings)}


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


# -- verl's space, for a search ----------------------------------------------------------------------
def _replica_tps(scenario: Scenario, role: str, mesh: Mesh) -> list[int]:
    c, model = scenario.cluster, scenario.models[role]
    return [t for t in divisors(mesh.size) if (c.gpus_per_node % t == 0 or t % c.gpus_per_node == 0)
            and model.n_heads % t == 0 and model.n_kv_heads % t == 0]


def _rollout_expert_layouts(scenario: Scenario, role: str, dp: int, tp: int) -> list[tuple[int, int]]:
    """The (ep, etp) a search offers a serving call of `dp` replicas of `tp` GPUs (ROLLOUT_EP): none,
    and for the actor's rollout of a mixture of experts its experts over replicas of tp x
    data_parallel_size GPUs that fit a node or span whole ones (SGLang's over a replica's tp GPUs
    alone), each expert whole (etp 1: 0 where tp is 1, the same). realbench.plan.options checks the
    rest (expert_problem)."""
    model, G = scenario.models[role], scenario.cluster.gpus_per_node
    if role != "actor" or getattr(model, "moe", None) is None:
        return [(1, 0)]
    sglang = (scenario.rollout_server or "vllm") == "sglang"
    return [(ep, 0 if tp == 1 else etp)
            for ep, etp in expert_layouts(scenario.dataflow.call("actor_gen"), model, dp, 1, tp, True)
            if ep == 1 or ((G % ep == 0 or ep % G == 0) and not (sglang and ep != tp))]


def reward_pools(scenario: Scenario) -> list[tuple[Mesh, Optional[Mesh]]]:
    """The pools a search offers: (the trainer's, the reward model's own or None). Every role on
    all the GPUs; and with a reward model on a cluster of several nodes, the reward model on the
    last 1, 2, 4, ... nodes (up to half of them), the trainer on the rest. (Any whole-node pool,
    or part of a node, is read and written; the search keeps to these.)"""
    c = scenario.cluster
    G = c.gpus_per_node
    out: list[tuple[Mesh, Optional[Mesh]]] = [(Mesh(0, c.nodes, 0, G), None)]
    if not isinstance(scenario.models["reward"], FunctionSpec):
        r = 1
        while r <= c.nodes // 2:
            out.append((Mesh(0, c.nodes - r, 0, G), Mesh(c.nodes - r, r, 0, G)))
            r *= 2
    return out


def plan_groups(scenario: Scenario) -> Iterator[dict[str, list[Option]]]:
    """verl's plans of a scenario, by what its calls must share (the pools of GPUs, the training
    engine and its layout, the critic's token budget): per group, the options of each call, any
    combination of which verl runs (the rules of `space_problem`, `to_config` and `critic_budget`).
    Options realbench cannot price on the cluster (strategy_problem) are left to the estimator's
    own checks."""
    problem = space_problem_of_scenario(scenario)
    if problem:
        raise ConfigError(problem[1], problem[0])
    problems: dict[tuple[str, Option], bool] = {}  # (the pools' groups repeat options: each checked once)
    if scenario.dataflow.max_staleness:
        for trainer, rollout in one_step_off_pools(scenario):
            yield from _groups_on(scenario, trainer, None, rollout, problems=problems)
        return
    for trainer, pool in reward_pools(scenario):
        yield from _groups_on(scenario, trainer, pool, problems=problems)


def one_step_off_pools(scenario: Scenario) -> list[tuple[Mesh, Mesh]]:
    """The (trainer's, rollout's) pools a search offers the one-step-off entry point, every GPU
    used: on one node, half each; on several, the trainer's first 1, 2, ... nodes and the
    rollout's the rest. (Any split _one_step_off_problem allows is read and written.)"""
    c = scenario.cluster
    G = c.gpus_per_node
    if c.nodes == 1:
        return [(Mesh(0, 1, 0, G // 2), Mesh(0, 1, G // 2, G // 2))] if G > 1 else []
    return [(Mesh(0, t, 0, G), Mesh(t, c.nodes - t, 0, G)) for t in range(1, c.nodes)]


def _groups_on(scenario: Scenario, W: Mesh, pool: Optional[Mesh], rollout: Optional[Mesh] = None,
               problems: Optional[dict[tuple[str, Option], bool]] = None) -> Iterator[dict[str, list[Option]]]:
    """plan_groups with every role on the trainer's pool `W` but a reward model on `pool`, if any,
    and generation on `rollout` (the one-step-off entry's; default `W`). `problems`: whether each
    (call, option) checked so far is refused, kept across calls (groups repeat most options)."""
    from realbench.plan.options import option_problem

    c, df = scenario.cluster, scenario.dataflow
    N = W.size
    gen = df.call("actor_gen")
    rows, steps = gen.seqs, df.call("actor_train").optimizer_steps
    critic = "critic_train" in df.call_names
    problems = {} if problems is None else problems

    def refused(name: str, option: Option) -> bool:
        known = problems.get((name, option))
        if known is None:
            call = df.call(name)
            known = problems[(name, option)] = option_problem(call, scenario.models[call.model], c, option) is not None
        return known

    def valid(name: str, options: list[Option]) -> list[Option]:
        return [o for o in options if not refused(name, o)]

    def served(role: str, mesh: Mesh) -> list[Option]:  # replicas of tp GPUs, max_num_seqs rows decoding together
        # (a LoRA actor's: the adapters alone or merged into the base, lora.merge; `valid` keeps
        # the merged ones for LoRA models only)
        # (a mixture of experts' rollout also over replicas of tp x data_parallel_size GPUs, its experts
        # split over them: _rollout_expert_layouts)
        size = mesh.size
        return [Option(mesh, Strategy(size // t, t, 1, m, merge_lora=merge, ep=ep, etp=etp))
                for t in _replica_tps(scenario, role, mesh) if rows % (size // t) == 0
                for ep, etp in _rollout_expert_layouts(scenario, role, size // t, t)
                for m in divisors(rows // (size // t)) for merge in (False, True)]

    # (each rollout at the least share of each GPU's memory that gives it each count of slots, where
    # its sync's buffer fits: listing.served_shares)
    common = {"actor_gen": [shared for o in valid("actor_gen", served("actor", rollout or W))
                            for shared in served_shares(scenario, o, lambda o: sync_buffer_problem(
                                scenario, {"actor_gen": o}) is None)]}
    if isinstance(scenario.models["reward"], FunctionSpec):
        scorer = _function_mesh(rows, rollout or W)
        common["reward_inf"] = [Option(scorer, Strategy(scorer.size, 1, 1))]
    else:
        common["reward_inf"] = valid("reward_inf", served("reward", pool or W))
    # tp, pp, v, train zeros, forward zero, and the sequence splits and shard groups each role takes:
    # FSDP's Ulysses groups and hybrid shard groups are the engine's settings of each role (verl sets
    # them per role: SEQUENCE_PARALLEL, FSDP_SIZE), Megatron's context-parallel ring (ring p2p) is
    # process-global, one for all. FSDP's state sharded over every GPU or, across nodes, hybrid
    # within groups of 1, 2, 4, ... nodes
    # (and each layout's one (ep, etp) for the models with experts, process-global under Megatron; FSDP
    # has none: (1, 0))
    layouts: list[tuple[int, int, int, tuple[int, ...], int, tuple[int, ...], tuple[int, ...], tuple[int, int]]] = []
    actor = scenario.models["actor"]
    if N > 1:  # FSDP, and Ulysses groups of 2, 4, ... GPUs of a node (for a model whose rows are packed:
        # `valid` drops the others, and the groups the model's heads do not split)
        G = c.gpus_per_node  # (hybrid groups of whole nodes, doubling: 1, 2, 4, ... nodes)
        hybrid = (0, *(G << k for k in range((N // G).bit_length()) if (G << k) < N and N % (G << k) == 0))
        layouts.append((1, 1, 1, (3, 2), 3, tuple(divisors(math.gcd(N, c.gpus_per_node))), hybrid, (1, 0)))
    # (a LoRA actor: verl's FSDP LoRA only; its fused kernels: FSDP's only; see space_problem)
    for tp in (t for t in divisors(c.gpus_per_node) if actor.n_heads % t == 0 and actor.n_kv_heads % t == 0
               and actor.lora is None and not scenario.training.logits):
        for pp in (p for p in divisors(N // tp) if p <= actor.n_layers):
            for v in (1, 2, 4) if pp > 1 else (1,):
                for cp in divisors(N // (tp * pp)):  # (its rings inside a node or across whole nodes)
                    for experts in expert_layouts(df.call("actor_train"), actor, N // (tp * pp * cp), cp, tp, True):
                        layouts.append((tp, pp, v, (0, 1) if N // (tp * pp) > 1 else (0,), 0, (cp,), (0,),
                                        (experts[0], 0 if experts[1] == tp else experts[1])))  # Megatron
    for tp, pp, v, zeros, forward_zero, splits, shard_groups, (ep, etp) in layouts:
        ring = "p2p" if forward_zero == 0 and splits != (1,) else ""

        def experts_of(name: str) -> dict[str, int]:  # (the layout's, for a model with experts)
            return {"ep": ep, "etp": etp} if scenario.models[df.call(name).model].moe is not None else {}

        def data_parallel(sp: int) -> int:
            return N // (tp * pp * sp)

        def trained(name: str, sp: int, f: int, zero_options=zeros) -> list[Option]:
            dp = data_parallel(sp)
            per_gpu = rows // steps // dp
            lora = scenario.models[df.call(name).model].lora is not None  # (its parameter offload: not priced)
            offloads = [(False, False), (False, True)] + ([] if lora else [(True, False), (True, True)])
            return valid(name, [Option(W, Strategy(dp, tp, pp, m, ckpt, v, z, offload_params=params,
                                                   offload_optimizer=moments, sp=sp, ring=ring, shard_group=f,
                                                   **experts_of(name)))
                                for m in divisors(per_gpu) for ckpt in (False, True) for z in zero_options
                                for params, moments in offloads if not params or z != 2])

        # each role's sequence splits and shard groups whose data-parallel ranks share the rows evenly
        roles = [(sp, f) for sp in splits for f in shard_groups if rows % (steps * data_parallel(sp)) == 0]
        if not roles:
            continue
        group = {**common, "actor_train": [o for sp, f in roles for o in trained("actor_train", sp, f)]}
        if "ref_inf" in df.call_names:
            # (FSDP offloads its reference always; a Megatron one as its param_offload says)
            group["ref_inf"] = valid("ref_inf", [
                Option(W, Strategy(data_parallel(sp), tp, pp, m, zero=forward_zero, offload_params=off, sp=sp,
                                   ring=ring, shard_group=f, **experts_of("ref_inf")))
                for sp, f in roles
                for off in ((forward_zero == 3 and N // (tp * pp) > 1,) if forward_zero == 3 else (False, True))
                for m in divisors(rows // data_parallel(sp))])
        if not critic:
            if all(group.values()):
                yield group
            continue
        # the critic's two calls run on one engine: one sequence split and one shard group for both
        # (its groups apart), and one token budget (each from the mean tokens of m micro-batches; the
        # counts verl forms under it)
        for sp, f in roles:
            dp = data_parallel(sp)
            critic_options = trained("critic_train", sp, f)
            formed = set()
            for m in divisors(rows // steps // dp):
                budget = _mean_budget(scenario, rows // steps // dp, m, sp)
                counts = _critic_counts(scenario, rows // steps // dp, rows // dp, dp, _divided_by(pp, v), budget, sp)
                if None in counts or counts in formed:
                    continue
                formed.add(counts)
                train_m, inf_m = counts
                # (rows packed: each micro-batch within the budget, which memory is planned for)
                tokens = budget if df.call("critic_train").padding_free else None
                with_critic = {**group, "critic_train": [replace(o, strategy=replace(o.strategy, max_tokens=tokens))
                                                         for o in critic_options
                                                         if o.strategy.micro_batches == train_m],
                               "critic_inf": valid("critic_inf", [Option(W, Strategy(dp, tp, pp, inf_m,
                                                                                     zero=forward_zero,
                                                                                     max_tokens=tokens, sp=sp,
                                                                                     ring=ring, shard_group=f,
                                                                                     **experts_of("critic_inf")))])}
                if all(with_critic.values()):
                    yield with_critic


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


# verl's example for a comparable job (verl-project/verl examples/grpo_trainer/run_qwen3_8b_fsdp.sh and
# examples/ppo_trainer/run_qwen3_8b_fsdp.sh, main@1dda039): its engine settings, on the scenario's job
# (batch, lengths, models); its reference's param_offload=True is what verl's FSDP does to a reference anyway
EXAMPLE = {"source": "verl examples/{grpo,ppo}_trainer/run_qwen3_8b_fsdp.sh (main@1dda039)",
           "settings": {f"{R}.tensor_model_parallel_size": 2, f"{R}.gpu_memory_utilization": 0.6,
                        f"{A}.use_dynamic_bsz": True, f"{A}.ppo_max_token_len_per_gpu": 24576,
                        "critic.use_dynamic_bsz": True}, "memory_fraction": 0.6}


# verl's example for a job of a mixture of experts (verl-project/verl examples/grpo_trainer/
# run_qwen3_30b_a3b_megatron.sh, main@b3ea220, the Qwen3-30B-A3B GRPO recipe): Megatron tp 4 x pp 2, the
# experts over ep 4, every layer recomputed (full, uniform, 1), the actor's parameters and optimizer
# and the reference's parameters in host memory between calls (ALL_OFFLOAD; its grad_offload is not
# a key of verl 0.9.1), dynamic batching at a whole row a GPU (prompt + response, the reference's
# too), a vLLM rollout of tp 4 at 0.6 of each GPU. Its expert_tensor_parallel_size is left null
# (tp's, 4), which Megatron's parallel state refuses on its 8 GPUs as on 16 (etp x ep x pp = 32 GPUs
# a group: world % 32 != 0); the example is priced with each expert whole (etp 1), the layout verl's
# other Qwen3-30B-A3B recipes give (ETP=1)
MOE_EXAMPLE = {"source": "verl examples/grpo_trainer/run_qwen3_30b_a3b_megatron.sh (main@b3ea220; etp 1)",
               "settings": {f"{A}.megatron.tensor_model_parallel_size": 4,
                            f"{A}.megatron.pipeline_model_parallel_size": 2,
                            f"{A}.megatron.expert_model_parallel_size": 4,
                            f"{A}.megatron.expert_tensor_parallel_size": 1,
                            f"{A}.megatron.param_offload": True, f"{A}.megatron.optimizer_offload": True,
                            REF_MEGATRON_OFFLOAD: True,
                            **{f"{A}.megatron.override_transformer_config.{k}": v for k, v in
                               (("recompute_granularity", "full"), ("recompute_method", "uniform"),
                                ("recompute_num_layers", 1))},
                            f"{R}.tensor_model_parallel_size": 4, f"{R}.gpu_memory_utilization": 0.6,
                            f"{A}.use_dynamic_bsz": True, f"{A}.ppo_max_token_len_per_gpu": "row",
                            "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": True,
                            "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "row"},
               "memory_fraction": 0.6}


def example_of(scenario: Scenario) -> dict[str, Any]:
    """verl's example configuration for the scenario's job (EXAMPLE; MOE_EXAMPLE for an actor with
    experts), its settings on the job: "row" a whole row's tokens (prompt and response)."""
    example = MOE_EXAMPLE if getattr(scenario.models["actor"], "moe", None) is not None else EXAMPLE
    gen = scenario.dataflow.call("actor_gen")
    row = gen.prompt_len + gen.gen_len
    return {**example, "settings": {k: row if v == "row" else v for k, v in example["settings"].items()}}


def default_plan(scenario: Scenario, settings: Optional[dict[str, Any]] = None) -> dict[str, Option]:
    """The plan of verl's default configuration for the scenario's job: its YAML's settings
    (FSDP fully sharded, gradient checkpointing, rollout tp 2 with max_num_seqs 256, a reward
    model's tp 2), with dynamic batching at its default token budgets, since its per-GPU
    micro-batch sizes have no default (the actor's raised to a whole row where the job's rows are
    longer: verl asserts a budget holds one, verl/utils/seqlen_balancing.py:384-386); `settings`
    over those (EXAMPLE's, say). Generation running ahead: the one-step-off entry's config with the
    first pools a search offers it (one_step_off_pools). Settings of Megatron's engine blocks
    (MOE_EXAMPLE's) make it Megatron's."""
    df, c = scenario.dataflow, scenario.cluster
    engine = "megatron" if any(k.startswith((f"{A}.megatron.", "critic.megatron.")) for k in settings or {}) else "dp"
    gen, train = df.call("actor_gen"), df.call("actor_train")
    n = gen.group_size
    ref = "ref_inf" in df.call_names
    given = {"trainer.nnodes": c.nodes, "trainer.n_gpus_per_node": c.gpus_per_node,
             "data.train_batch_size": gen.seqs // n, "data.max_prompt_length": gen.prompt_len,
             "data.max_response_length": gen.gen_len, f"{R}.n": n, f"{R}.name": scenario.rollout_server or "vllm",
             "algorithm.adv_estimator": {v: k for k, v in ESTIMATORS.items()}[scenario.algorithm],
             f"{A}.ppo_mini_batch_size": gen.seqs // n // train.optimizer_steps, f"{A}.use_dynamic_bsz": True,
             f"{A}.ppo_epochs": scenario.training.num_iterations,
             "algorithm.use_kl_in_reward": ref and scenario.algorithm == "ppo",
             f"{A}.use_kl_loss": ref and scenario.algorithm != "ppo",
             **(settings or {})}
    if engine == "megatron" and "critic_train" in df.call_names:  # (Megatron's layout is process-global)
        moe = scenario.models["critic"].moe is not None
        given.update({key.replace(f"{A}.megatron.", "critic.megatron.", 1): value for key, value in given.items()
                      if key.startswith(f"{A}.megatron.") and not key.endswith(("_offload",))
                      and (moe or not key.endswith(EXPERT_KEYS))})
    packed = packs(scenario, "verl", PADDING_FREE)  # (as the scenario is priced: engines.priced_as)
    for key, flag in zip(REMOVE_PADDING, _remove_padding(scenario)):
        given.setdefault(key, flag)
    budget = f"{A}.ppo_max_token_len_per_gpu"  # the reference's and rollout's follow it (interpolation)
    given.setdefault(budget, max(int(defaults(engine)[budget]), gen.prompt_len + gen.gen_len))
    if isinstance(scenario.models["reward"], FunctionSpec):
        given["reward.custom_reward_function.path"] = "reward.py"
    else:
        given.update({f"{RM}.enable": True, f"{RM}.rollout.name": given[f"{R}.name"]})
    one_step_off = bool(df.max_staleness)
    if one_step_off:
        if not one_step_off_pools(scenario):
            raise ConfigError("verl's one-step-off trainer needs two pools of GPUs: the cluster has one GPU", "cluster")
        trainer, rollout = one_step_off_pools(scenario)[0]
        given.update({"trainer.nnodes": trainer.nodes, "trainer.n_gpus_per_node": trainer.gpus,
                      ROLLOUT_POOL[0]: rollout.nodes, ROLLOUT_POOL[1]: rollout.gpus, HYBRID: False})
    _, plan = to_plan(engine, resolve(engine, given, one_step_off), set(), scenario.name, "h100",
                      lengths=train.lengths, gpus_per_node=c.gpus_per_node if one_step_off else None,
                      models=dict(scenario.models))
    priced = scenario if packed == scenario.training.padding_free else scenario.with_padding_free(packed)
    return the_jobs_share(resolve_plan(plan_from_document({**plan, "scenario": scenario.name}), priced))
