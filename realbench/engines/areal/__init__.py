"""AReaL 1.0.4: the plans its single-controller PPO trainer (`PPOTrainer`, areal/trainer/rl_trainer.py)
can run, read from an experiment YAML and written as one.

What AReaL can express (source files of the areal 1.0.4 wheel, `areal/...`):

* **One allocation string per engine** (`actor.backend`, `rollout.backend`, `ref.backend`,
  `critic.backend`; api/cli_args.py:1203-1209, 2171-2177), parsed by `ModelAllocation.from_str`
  (api/alloc_mode.py:314-350; the grammar at :594-638): `fsdp:d4t2`, `megatron:d2p2t1`,
  `sglang:d4t2`. Letters in any order, a letter left out is 1, the last repeat wins (:797-804);
  d data, t tensor, p pipeline, c context, e expert parallel. FSDP has no pipeline and no experts
  (:274-283). A rollout string is `d` servers of `t x p` GPUs each (docs/en/reference/alloc_mode.md).
  A mixture of experts under Megatron (`_experts`): the flat form's e (folded into the world, each
  expert whole: etp 1, `megatron:d4t2e2`) or the attention/FFN form `megatron:(attn:d4p4t2|ffn:d2p4e4)`
  (:943-1040: the FFN's e, t and d the experts' parallelism, tensor parallelism and data
  parallelism), the plan's ep and etp; written back in the flat form where each expert is whole,
  else in the attention/FFN form (ModelAllocation.__str__ drops the FFN's t: realbench writes its
  own strings, allocation_string).
* **GPUs**: each separated role its own (`scheduling_strategy.type: separation`, the default,
  cli_args.py:955-976): actor, critic, reference, then the rollout, in that order
  (rl_trainer.py:288-321), one worker process a GPU (`scheduling_spec[0].gpu: 1`;
  infra/controller/train_controller.py:274-281, rollout_controller.py:170-221). The reference and
  critic are colocated with the actor (`scheduling_strategy: {type: colocation, target: actor}`,
  every example's pattern): the actor's GPUs, the same world size (infra/scheduler/local.py:680-699),
  their own strategy. A server spans one node at most (`nnodes` 1, cli_args.py:1949).
* **Strategies**: FSDP2 shards parameters, gradients and optimizer states over the data-parallel
  group (realbench's zero 3) with tensor parallelism inside (engine/fsdp_utils/parallel.py:42-78),
  or with context parallelism `c`, which under FSDP is Ulysses sequence parallelism (realbench's
  `sp`): a (d, c, t) device mesh, the data split over the d ranks, each rank's packed micro-batch
  padded to a multiple of c and sliced over its c GPUs (engine/fsdp_engine.py:1915-1948), the
  heads split as verl splits them (models/transformers/ulyssess_patch.py:165-176), the model
  sharded over d x c (the `dp_sp` mesh, fsdp_utils/parallel.py:391), and `mb_spec.max_tokens_per_mb`
  the rank's, a group's budget (c GPUs share it); priced without tensor parallelism (t1, else
  refused);
  Megatron tp x pp with its distributed optimizer (`megatron.ddp.use_distributed_optimizer`,
  default on: zero 1) and `megatron.virtual_pipeline_parallel_size` (engine/megatron_engine.py:216-245,
  1276-1283), and with `c` Megatron's context parallelism (realbench's `sp` with ring p2p): rings of
  c GPUs (Megatron's tp-cp-ep-dp-pp order, :236), the data split over Megatron's d ranks, each
  rank's packed micro-batches aligned to 2 x tp x c tokens a sequence and split over its ring
  (:2060-2084: `max_tokens_per_mb` the rank's, "max_tokens_per_mb / cp_size" a GPU), attended by
  Transformer Engine's p2p ring (Megatron's default cp_comm_type; AReaL sets none), the
  gradients reduced over d x c (:952-958); `gradient_checkpointing` per engine.
* **Batches**: `train_dataset.batch_size` prompts x `gconfig.n_samples` samples a step, split over
  the data-parallel ranks (utils/seqpack.py:558-562: the prompt groups divide evenly), in
  `actor.ppo_n_minibatches` optimizer steps (trainer/ppo/actor.py:336-366); each call's micro-batches
  from its engine's `mb_spec` (at least `n_mbs`, packed to `max_tokens_per_mb` tokens by the rows'
  real lengths, first fit decreasing: utils/data.py:696-760, utils/seqpack.py:234-260, priced as
  realbench.engines.areal.packer forms them; a Megatron
  pipeline at least 2 x pp, a multiple of pp: megatron_engine.py:2054-2070); prompts of
  `train_dataset.max_length` tokens at most and responses of `gconfig.max_new_tokens`, both inside
  `gconfig.max_tokens` (infra/remote_inf_engine.py:810-821).
* **Generation**: SGLang or vLLM servers, each decoding up to `sglang.max_running_requests`
  (`vllm.max_num_seqs`) sequences, of the `rollout.max_concurrent_rollouts` prompt groups in
  flight (default the consumer batch; infra/workflow_executor.py:761-765) spread over the servers
  round robin (rollout_controller.py:778-802); fewer where a server's paged KV cache, in its
  `sglang.mem_fraction_static` (`vllm.gpu_memory_utilization`) share of each GPU, holds fewer
  (SERVER_MEMORY); a vLLM server starts where that cache holds one request of `vllm.max_model_len`
  (SERVER_CONTEXT). Servers with a pipeline (`p` > 1) are refused: realbench prices a server's
  continuous batching without one.
* **Calls**: the rollout runs on its own GPUs, up to `rollout.max_head_offpolicyness` (η) versions
  ahead of training (infra/staleness_manager.py:69-113: realbench's `max_staleness`; η 0 waits
  for each step); rewards are a Python function in the rollout workers (workflow/rlvr.py:95-108);
  the trainer's calls run one after another on the actor's GPUs (values, reference, the actor's
  proximal log-probabilities, the updates: rl_trainer.py:622-751); then the weights go to every
  server: gathered and broadcast over NCCL from the trainer's first GPU (`weight_update_mode:
  xccl`, engine/fsdp_engine.py:1566-1663), priced as OpenRLHF's broadcast (realbench.cost.realloc).
  A reference is built only with `actor.kl_ctl > 0` (rl_trainer.py:179-181).

Not priced, and said so wherever an AReaL plan is read or written (`PRICING_GAPS`). Refused by name
(a setting changed from its default that realbench neither prices nor knows to leave time and memory
alone): the rollout colocated with the actor (disk weight updates and offloading), offloading,
LoRA on a critic, FSDP's context parallelism beside tensor parallelism, FSDP's tensor parallelism
of a mixture of experts (each expert whole on every tp rank), the servers' expert parallelism
(sglang.ep_size), the archon engine, a teacher, the experimental v2 gateway,
a reference or critic on GPUs of its own (AReaL runs the trainer's calls one after another, which
realbench prices as concurrent on separate GPUs).

Read: `read_config` takes an experiment YAML (every key checked against AReaL's PPOConfig,
`areal-1.0.4.json`, written by `check.py defaults`, which a test compares with the installed
AReaL) and Hydra-style overrides (`key=value`, `+key=value`), interpolations resolved by OmegaConf
as AReaL's loader resolves them.

The package, part by part (each engine's has the same: realbench.engines.interface): `settings`
(the version, its settings table `areal-1.0.4.json`, the keys and AReaL's allocation strings),
`pricing` (what realbench reads, carries, refuses and does not price of AReaL's settings), `reader`
(an experiment YAML as a scenario and a plan), `writer` (a plan as AReaL's experiment YAML),
`space` (the plans AReaL runs, listed for a search, and those of its default and example
configurations), `packer` (AReaL's micro-batches), `reward` (the stand-in for its workflow's reward
function) and `check.py` (AReaL's own code run on what realbench reads and writes, with AReaL's
Python). `ENGINE` is what realbench's commands use of it.
"""

from __future__ import annotations

from pathlib import Path

from realbench.engines.interface import Engine

# every part's names as the package's own (realbench.engines.areal.X, as before it was a package)
from realbench.engines.areal.settings import *  # noqa: F401,F403
from realbench.engines.areal.pricing import *  # noqa: F401,F403
from realbench.engines.areal.reader import *  # noqa: F401,F403
from realbench.engines.areal.writer import *  # noqa: F401,F403
from realbench.engines.areal.space import *  # noqa: F401,F403
# (and the private names the tests use: the writer's settings, the micro-batches AReaL's packer
# forms as a plan counts them; its nested settings flattened for ENGINE)
from realbench.engines.areal.pricing import _micro_batches  # noqa: F401
from realbench.engines.areal.settings import _flatten
from realbench.engines.areal.writer import _settings  # noqa: F401

ENGINE = Engine(
    name="areal", title="AReaL", version=VERSION, check=Path(__file__).with_name("check.py"),
    read_config=read_config, to_plan=to_plan, model_paths=MODEL_PATHS, role_sections=ROLE_SECTIONS,
    node_size_key="cluster.n_gpus_per_node", server_context=SERVER_CONTEXT, server_memory=SERVER_MEMORY,
    to_config=to_config, config_files=config_files, known_keys=known_keys, flatten=_flatten,
    space_problem=space_problem, space_problem_of_scenario=space_problem_of_scenario, default_plan=default_plan,
    example_of=example_of, job_of=job_of, plan_table=plan_table,
    memory_fraction=MEMORY_FRACTION, padding_free=PADDING_FREE, padding_settable=PADDING_SETTABLE,
    old_logprobs=OLD_LOGPROBS, old_logprobs_how=OLD_LOGPROBS_HOW, read=READ, neutral=NEUTRAL, captured=CAPTURED,
    carried_values=CARRIED_VALUES, required=REQUIRED, pricing_gaps=PRICING_GAPS)
