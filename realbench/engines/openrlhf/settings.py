"""OpenRLHF 0.11.2's command line as realbench names it: the version and its entry point, the
flags table made from OpenRLHF's own argument parser (`openrlhf-0.11.2.json`, by `check.py
defaults`, which a test compares with the installed OpenRLHF: `defaults`, `known_keys`), and the
flags realbench reads and writes, each with where OpenRLHF reads it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

VERSION = "0.11.2"
MODULE = "openrlhf.cli.train_ppo_ray"
ENTRY = f"python3 -m {MODULE}"
TABLE = Path(__file__).with_name(f"openrlhf-{VERSION}.json")
# where each model's checkpoint folder is set (the critic's defaults to the reward model's, then the actor's)
MODEL_PATHS = {"actor": "--actor.model_name_or_path", "ref": "--actor.model_name_or_path",
               "critic": "--critic.model_name_or_path", "reward": "--reward.model_name_or_path"}
# --algo.advantage.estimator (cli/train_ppo_ray.py:514-522) <-> realbench's algorithm
ESTIMATORS = {"gae": "ppo", "group_norm": "grpo", "rloo": "rloo"}

VLLM_MAX_NUM_SEQS = 128  # vllm SchedulerConfig.DEFAULT_MAX_NUM_SEQS (OpenRLHF sets none, vllm_engine.py:264-298)
# the share of each GPU's memory a vLLM engine takes (cli/train_ppo_ray.py:76, 251-255, default 0.95;
# trainer/ray/vllm_engine.py:276): the generation call's memory_fraction, read as the command line gives
# it; where a scenario gives none, the 0.5 of the hybrid engine's quick-start (examples/scripts/
# train_ppo_ray_hybrid_engine.sh), realbench's default configuration of OpenRLHF (default_plan)
MEMORY = "vllm.gpu_memory_utilization"
MEMORY_FLAG = f"--{MEMORY}"  # (as a refusal names it)

# --vllm.enable_sleep (the hybrid engine's, refused without it): vLLM's weights to host memory after
# generation and back before the weight sync, each step (sleep level 1, trainer/ray/vllm_engine.py:136-150),
# and its cache released: priced by the simulator (realbench.cost.simulate.ROLLOUT_SLEEP_ENGINES)
# --ds.enable_sleep: the actor's and critic's DeepSpeed states (fp32 master weights, Adam's moments,
# under ZeRO-3 the gradient partition) in host memory between updates, reloaded before each fit and
# offloaded after it (trainer/ppo_trainer.py:274-286, trainer/ray/ppo_actor.py:654-659,
# ppo_critic.py:319-324; utils/deepspeed/deepspeed_utils.py:150-190): realbench's offload_optimizer
# on both train calls, priced as DeepSpeed moves them (realbench.cost.sharding). DeepSpeed's
# offload_states belongs to its ZeRO optimizers (runtime/zero/stage3.py:3571,
# stage_1_and_2.py:2921): stage 0 has none
SLEEP = "ds.enable_sleep"
# --ds.adam_offload: DeepSpeed's ZeRO-Offload, offload_optimizer device cpu (utils/deepspeed/
# deepspeed_utils.py:21-28, deepspeed.py:437-439) with DeepSpeedCPUAdam (deepspeed 0.19.6
# runtime/engine.py:2178-2194): realbench's host_adam on both train calls (realbench.cost.sharding).
# Its OpenMP threads: Ray sets OMP_NUM_THREADS to an actor's num_cpus, at least 1 (ray 2.55.0
# ray/_private/utils.py:230-267), and OpenRLHF asks one CPU (0.2 colocated) a GPU worker
# (trainer/ray/launcher.py:255-286, cli/train_ppo_ray.py:89-138): one thread a rank. Beside it
# --ds.enable_sleep moves nothing (the optimizer already on the host, deepspeed_utils.py:153-157,
# 194-198); under ZeRO stage 0 DeepSpeed's bf16 wrapper keeps fp32 copies on the GPU that CPU Adam
# refuses (runtime/fp16/unfused_optimizer.py:77, ops/adam/cpu_adam.py:138)
ADAM_OFFLOAD = "ds.adam_offload"

PACKING = "ds.packing_samples"
# ring attention: every DeepSpeed model's ranks in groups of this many consecutive GPUs (a (dp, sp,
# tp) device mesh, utils/deepspeed/deepspeed.py:103-107), each group one data-parallel rank whose
# packed micro-batches are split by sequence over its GPUs (models/ring_attn_utils.py:72-100) and
# attended with ring-flash-attention's llama3 kernels (substitute_hf_flash_attn, deepspeed.py:117-134):
# realbench's `sp` with `ring`; it turns packing on (cli/train_ppo_ray.py:686-689). The head stride
# (--ds.ring_attn_head_stride) stays at its default 1, as realbench prices the kernels' buffers
RING = "ds.ring_attn_size"
# LoRA (models/actor.py:177-188: PEFT's LoraConfig of these; rank 0 is none), PEFT's name -> the
# flag's dest. OpenRLHF wraps its critic in the same adapters (trainer/ray/ppo_critic.py:201-204),
# loads its reference as a model of its own (cli/train_ppo_ray.py:93-103) and broadcasts every
# parameter, base and adapters, to vLLM each step (trainer/ray/ppo_actor.py:476-486)
LORA_FLAGS = {"r": "ds.lora.rank", "lora_alpha": "ds.lora.alpha", "target_modules": "ds.lora.target_modules"}


@lru_cache(maxsize=1)
def _table() -> dict:
    return json.loads(TABLE.read_text())


def known_keys(engine: str = "deepspeed") -> set[str]:
    """The dests of OpenRLHF's flags."""
    return {f["dest"] for f in _table()["flags"]}


def defaults() -> dict[str, Any]:
    """dest -> default of every flag of OpenRLHF's train_ppo_ray."""
    return {f["dest"]: f["default"] for f in _table()["flags"]}
