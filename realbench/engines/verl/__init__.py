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
  BUILTIN_REWARD, realbench.engines.verl.reward, written back as no function).
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
  budget, :395-455: realbench.engines.verl.packer, on steps drawn from the response lengths),
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
is said wherever a verl plan is read (`PRICING_GAPS`, those the plan meets: `gaps_of`). The actor's
old log-probabilities: a forward of the actor over the whole batch, or the rollout's with
`algorithm.rollout_correction.bypass_mode` (`training.old_logprobs` whole_batch or rollout).

Read: `read_config` takes a Hydra primary config (`defaults: [ppo_trainer, _self_]`, as
`python -m verl.trainer.main_ppo --config-path --config-name` takes it) or a composed config (a
run's `.hydra/config.yaml`), then Hydra-style overrides, over verl's own defaults
(`verl-0.9.1.json`, made from verl's composition by `check.py defaults`, which a test
compares with the installed verl). A key verl does not have is refused with the closest one; a
setting realbench neither maps nor knows to leave time and memory alone, changed from verl's
default, is refused by name.

The package, part by part (each engine's has the same: realbench.engines.interface): `settings`
(the version, its settings table `verl-0.9.1.json`, the keys), `pricing` (what realbench reads,
carries, refuses and does not price of verl's settings), `reader` (a configuration as a scenario and
a plan), `space` (the plans verl runs, listed for a search, and those of its default and example
configurations), `writer` (a plan as verl's configuration), `packer` (verl's dynamic batching),
`reward` (the stand-in for its built-in scorers) and `check.py` (verl's own code run on what
realbench reads and writes, with verl's Python). `ENGINE` is what realbench's commands use of it.
"""

from __future__ import annotations

from pathlib import Path

from realbench.engines.interface import Engine

# every part's names as the package's own (realbench.engines.verl.X, as before it was a package)
from realbench.engines.verl.settings import *  # noqa: F401,F403
from realbench.engines.verl.pricing import *  # noqa: F401,F403
from realbench.engines.verl.reader import *  # noqa: F401,F403
from realbench.engines.verl.space import *  # noqa: F401,F403
from realbench.engines.verl.writer import *  # noqa: F401,F403
# (and the private name the tests count verl's micro-batches with)
from realbench.engines.verl.pricing import _step_rows  # noqa: F401

ENGINE = Engine(
    name="verl", title="verl", version=VERSION, check=Path(__file__).with_name("check.py"),
    read_config=read_config, to_plan=to_plan, model_paths=MODEL_PATHS, read_problem=read_problem, unread=unread,
    adapter_path=ADAPTER_PATH, max_model_len=MAX_MODEL_LEN, memory_key=MEMORY,
    to_config=to_config, config_files=config_files, known_keys=known_keys,
    space_problem=space_problem, space_problem_of_scenario=space_problem_of_scenario, default_plan=default_plan,
    example_of=example_of, plan_groups=plan_groups,
    memory_fraction=MEMORY_FRACTION, padding_free=PADDING_FREE, old_logprobs=OLD_LOGPROBS,
    old_logprobs_how=OLD_LOGPROBS_HOW, read=READ, neutral=NEUTRAL, captured=CAPTURED, carried_values=CARRIED_VALUES,
    open_sections=OPEN_SECTIONS, required=REQUIRED, pricing_gaps=PRICING_GAPS, gaps_of=gaps_of)
