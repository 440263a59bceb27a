"""OpenRLHF 0.11.2: the plans its Ray PPO trainer (`python -m openrlhf.cli.train_ppo_ray`) can run,
read from its command line and written as one.

What OpenRLHF can express (source files of the openrlhf 0.11.2 wheel, `openrlhf/...`):

* **A group of GPUs per role**: `--{actor,ref,critic,reward}.num_nodes x .num_gpus_per_node`
  DeepSpeed workers and `--vllm.num_engines` vLLM engines of `--vllm.tensor_parallel_size` GPUs
  (cli/train_ppo_ray.py:200-239), each group its own Ray placement group unless colocated:
  `--train.colocate_actor_ref` (the reference on the actor's GPUs; equal shapes, :41-50),
  `--train.colocate_critic_reward` (the reward model on the critic's, :109-117),
  `--train.colocate_all` (the hybrid engine: every model and the vLLM engines on the actor's
  GPUs, engines x tp = actor GPUs, :56-64; a critic or reward model of fewer GPUs takes the first
  bundles, trainer/ray/launcher.py:254-283). Only a group's GPU count matters (Ray packs the
  bundles); realbench places each group on a mesh of the cluster, largest first.
* **One DeepSpeed strategy for every model** (utils/utils.py:25-37): `--ds.zero_stage` for the
  trained actor and critic (utils/deepspeed/deepspeed_utils.py:7-75), the forward-only reference
  and reward model replicated unless the stage is 3 (:78-118); `--ds.tensor_parallel_size`
  (DeepSpeed AutoTP, every group's mesh dp x tp, utils/deepspeed/deepspeed.py:103-107; AutoTP
  trains under ZeRO 0 to 2, deepspeed.ai/tutorials/autotp-training); no pipeline parallelism;
  gradient checkpointing for actor and critic together (`--actor.gradient_checkpointing_enable`);
  `--ds.ring_attn_size` (RING), ring attention: each model's GPUs in groups of that many, a group
  one data-parallel rank whose packed micro-batches are split by sequence over its GPUs (priced
  as realbench's `sp` with `ring: allgather`; packing forced on), beside DeepSpeed's tp in the
  (dp, sp, tp) mesh: a group's GPUs tp apart, each attending over its tp share of the heads;
  `--ds.enable_sleep`, both trained models' DeepSpeed states in host memory between updates
  (SLEEP: `offload_optimizer` on their train calls); `--ds.adam_offload`, DeepSpeed's ZeRO-Offload:
  both trained models' states in host memory for good and Adam run there on one thread a rank
  (ADAM_OFFLOAD: `host_adam` on their train calls; `--ds.enable_sleep` beside it moves nothing).
* **No expert parallelism** (EXPERTS): a mixture of experts' experts sharded by DeepSpeed as any
  weight and split as tp splits them in vLLM's engines (the plan's ep 1, etp tp's); a plan with
  another layout is refused by name on export, and the search lists none.
* **Batches**: `--rollout.batch_size` prompts x `--rollout.n_samples_per_prompt` samples; each
  forward of the experience maker a chunk of `--rollout.micro_batch_size` samples
  (trainer/ppo_utils/experience_maker.py:70-76), handed to the data-parallel ranks in equal
  blocks; optimizer steps of `--train.batch_size` samples in micro-batches of
  `--train.micro_batch_size` a GPU (DeepSpeed's train_batch_size = micro x accumulation x dp,
  deepspeed.py:455-456), `--train.max_epochs` passes; `--train.dynamic_batch_enable` counts them
  by first fit in arrival order (utils/seqlen_balancing.py:234-246): a GPU's rows of an optimizer
  step within `--train.max_tokens_per_gpu`, the ranks taking the largest count (ppo_utils/
  replay_buffer.py:116-127); the step's rows within `--rollout.max_tokens_per_gpu` for the
  experience maker, counted down to a multiple of the actor's ranks (at least one each) and
  dispatched over each role's (experience_maker.py:44-66); priced as the fewest equal
  micro-batches at least as many (realbench's plans split a GPU's rows evenly).
* **The rollout is vLLM** (no other generation, trainer/ppo_utils/samples_generator.py:195-241),
  max_num_seqs not set: vLLM's default for an engine built from AsyncEngineArgs
  (SchedulerConfig.DEFAULT_MAX_NUM_SEQS, 128) sequences decode together per engine, or as many as
  its paged KV cache holds in its `--vllm.gpu_memory_utilization` share of each GPU (MEMORY).
* **Calls**: generation, then the experience maker's forwards (reward, the actor's old
  log-probabilities, values, reference) each on its group, concurrently where the groups are
  disjoint and one after another where colocated (experience_maker.py:113-233); then the critic's
  and the actor's training together (trainer/ppo_trainer.py:266-298); then the weights to vLLM:
  gathered (ZeRO-3) and broadcast whole, tensor by tensor, from the actor's rank 0 to every vLLM
  GPU over NCCL (trainer/ray/ppo_actor.py:409-490), or under the hybrid engine handed over in
  place (CUDA IPC). realbench's simulator runs calls on disjoint meshes at the same time and
  calls sharing GPUs one after another, which is this order, the actor's old-log-probability
  forward (in its train call) starting with the rollout's rows alone
  (realbench.cost.simulate.EARLY_OLD_LOGPROBS_ENGINES); the broadcast is priced as OpenRLHF
  sends it (scenario `engine: openrlhf`, realbench.cost.realloc).
* **Asynchronous** (`--train.async_enable`, trainer/ppo_trainer_async.py): generation runs up to
  `--train.async_queue_size` batches ahead of training (a Ray queue of that size between the
  generator and the trainer), on vLLM's own GPUs (under `--train.colocate_all` only the DeepSpeed
  models share the actor's, cli/train_ppo_ray.py:75, 711-712): realbench's `max_staleness`.

Not priced, and said so wherever an OpenRLHF plan is read or written (`PRICING_GAPS`). Refused by
name (a flag changed from its default that realbench neither prices nor knows to leave time and
memory alone): ring attention with another head stride, partial
rollouts, agents and remote reward servers, LoRA on a critic. A hybrid engine whose vLLM keeps its
memory while DeepSpeed trains (without `--vllm.enable_sleep`) is read as `keeps_memory` on its
generation.

Read: `read_config` takes a launch script (the words after `openrlhf.cli.train_ppo_ray`, up to
the shell's next command) or a file of flags, and overrides `flag=value`, through an argument
parser built from OpenRLHF's own (`openrlhf-0.11.2.json`, written by `check.py
defaults`, which a test compares with the installed OpenRLHF): the same flags, types, choices
and defaults, abbreviations included.

The package, part by part (each engine's has the same: realbench.engines.interface): `settings`
(the version, its flags table `openrlhf-0.11.2.json`, the flags), `pricing` (what realbench reads,
carries, refuses and does not price of OpenRLHF's flags), `reader` (a command line as a scenario and
a plan), `writer` (a plan as OpenRLHF's command line), `space` (the plans OpenRLHF runs, listed for
a search, and those of its default and example configurations) and `check.py` (OpenRLHF's own code
run on what realbench reads and writes, with OpenRLHF's Python). `ENGINE` is what realbench's
commands use of it.
"""

from __future__ import annotations

from pathlib import Path

from realbench.engines.interface import Engine

# every part's names as the package's own (realbench.engines.openrlhf.X, as before it was a package)
from realbench.engines.openrlhf.settings import *  # noqa: F401,F403
from realbench.engines.openrlhf.pricing import *  # noqa: F401,F403
from realbench.engines.openrlhf.reader import *  # noqa: F401,F403
from realbench.engines.openrlhf.writer import *  # noqa: F401,F403
from realbench.engines.openrlhf.space import *  # noqa: F401,F403

ENGINE = Engine(
    name="openrlhf", title="OpenRLHF", version=VERSION, check=Path(__file__).with_name("check.py"),
    read_config=read_config, to_plan=to_plan, model_paths=MODEL_PATHS, takes_node_size=True, memory_key=MEMORY_FLAG,
    to_config=to_config, config_files=config_files, known_keys=known_keys,
    space_problem=space_problem, space_problem_of_scenario=space_problem_of_scenario, default_plan=default_plan,
    example_of=example_of, plan_table=plan_table,
    memory_fraction=MEMORY_FRACTION, padding_free=PADDING_FREE, old_logprobs=OLD_LOGPROBS,
    old_logprobs_how=OLD_LOGPROBS_HOW, read=READ, neutral=NEUTRAL, captured=CAPTURED, required=REQUIRED,
    pricing_gaps=PRICING_GAPS)
