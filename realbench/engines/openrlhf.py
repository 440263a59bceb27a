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
rollouts, agents and remote reward servers, LoRA on a critic, a hybrid
engine whose vLLM keeps its memory while DeepSpeed trains (without `--vllm.enable_sleep`).

Read: `read_config` takes a launch script (the words after `openrlhf.cli.train_ppo_ray`, up to
the shell's next command) or a file of flags, and overrides `flag=value`, through an argument
parser built from OpenRLHF's own (`openrlhf-0.11.2.json`, written by `openrlhf_check.py
defaults`, which a test compares with the installed OpenRLHF): the same flags, types, choices
and defaults, abbreviations included.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import re
import shlex
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Optional

from realbench.engines import listing
from realbench.engines.documents import (job_documents, lora_problem, packs, refuse_beyond_positions, refuse_offload,
                                         serving_gap, whole_alpha)
from realbench.engines.listing import PlanTable, group_sizes, served_shares, the_jobs_share
from realbench.engines.verl import _rounds, _splits
from realbench.errors import ConfigError
from realbench.models import FunctionSpec
from realbench.plan.mesh import Mesh, Option, Strategy, is_pow2
from realbench.plan.options import divisors, served_call
from realbench.plan.plan import plan_from_document, resolve_plan
from realbench.plan.scenario import Scenario

VERSION = "0.11.2"
MODULE = "openrlhf.cli.train_ppo_ray"
ENTRY = f"python3 -m {MODULE}"
TABLE = Path(__file__).with_name(f"openrlhf-{VERSION}.json")
# where each model's checkpoint folder is set (the critic's defaults to the reward model's, then the actor's)
MODEL_PATHS = {"actor": "--actor.model_name_or_path", "ref": "--actor.model_name_or_path",
               "critic": "--critic.model_name_or_path", "reward": "--reward.model_name_or_path"}
# --algo.advantage.estimator (cli/train_ppo_ray.py:514-522) <-> realbench's algorithm
ESTIMATORS = {"gae": "ppo", "group_norm": "grpo", "rloo": "rloo"}
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
VLLM_MAX_NUM_SEQS = 128  # vllm SchedulerConfig.DEFAULT_MAX_NUM_SEQS (OpenRLHF sets none, vllm_engine.py:264-298)
# the share of each GPU's memory a vLLM engine takes (cli/train_ppo_ray.py:76, 251-255, default 0.95;
# trainer/ray/vllm_engine.py:276): the generation call's memory_fraction, read as the command line gives
# it; where a scenario gives none, the 0.5 of the hybrid engine's quick-start (examples/scripts/
# train_ppo_ray_hybrid_engine.sh), realbench's default configuration of OpenRLHF (default_plan)
MEMORY = "vllm.gpu_memory_utilization"
MEMORY_FLAG = f"--{MEMORY}"  # (as a refusal names it)
MEMORY_FRACTION = 0.5
# (the actor's old-log-probability forward runs beside the reference's and critic's: priced so,
# realbench.cost.simulate.EARLY_OLD_LOGPROBS_ENGINES)
PRICING_GAPS = ("the weights reach vLLM tensor by tensor (a Ray call each); realbench prices the bytes, not the calls",
                serving_gap("vLLM's max_num_seqs", "--vllm.gpu_memory_utilization"))
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
READ = {"ref.num_nodes", "ref.num_gpus_per_node", "reward.num_nodes", "reward.num_gpus_per_node", "critic.num_nodes",
        "critic.num_gpus_per_node", "actor.num_nodes", "actor.num_gpus_per_node", "train.colocate_actor_ref",
        "train.colocate_critic_reward", "train.colocate_all", "vllm.num_engines", "vllm.tensor_parallel_size",
        "ds.zero_stage", "ds.tensor_parallel_size", "actor.gradient_checkpointing_enable",
        "train.dynamic_batch_enable", "rollout.max_tokens_per_gpu", "train.max_tokens_per_gpu", "rollout.batch_size",
        "rollout.micro_batch_size", "train.max_epochs", "data.max_len", "rollout.max_new_tokens",
        "train.micro_batch_size", "train.batch_size", "rollout.n_samples_per_prompt", "algo.advantage.estimator",
        "reward.remote_url", "train.async_enable", "train.async_queue_size", *LORA_FLAGS.values(), "ds.lora.dropout",
        PACKING, SLEEP, ADAM_OFFLOAD, MEMORY, RING}


@lru_cache(maxsize=1)
def _table() -> dict:
    return json.loads(TABLE.read_text())


def known_keys(engine: str = "deepspeed") -> set[str]:
    """The dests of OpenRLHF's flags."""
    return {f["dest"] for f in _table()["flags"]}


def defaults() -> dict[str, Any]:
    """dest -> default of every flag of OpenRLHF's train_ppo_ray."""
    return {f["dest"]: f["default"] for f in _table()["flags"]}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's refusal, as realbench's one line
        raise ConfigError(message, source=self.source)


def _parser(source: str) -> _Parser:
    """An argument parser with OpenRLHF's flags, types, choices and defaults (abbreviations
    accepted, as OpenRLHF's own parser accepts them)."""
    p = _Parser(prog=MODULE, add_help=False)
    p.source = source
    types = {"int": int, "float": float, "str": str, None: None}
    for f in _table()["flags"]:
        if f["kind"] == "true":
            p.add_argument(*f["flags"], dest=f["dest"], action="store_true")
        elif f["kind"] == "false":
            p.add_argument(*f["flags"], dest=f["dest"], action="store_false")
        else:
            p.add_argument(*f["flags"], dest=f["dest"], type=types[f["type"]], nargs=f["nargs"], choices=f["choices"],
                           default=f["default"])
    return p


# a shell assignment, NAME=value or an array NAME=( ... ), and a use of a variable: ${NAME[@]}
# (quoted or not), ${NAME} or $NAME
_ASSIGNMENT = re.compile(r"^\s*(?:export\s+|local\s+|readonly\s+)?([A-Za-z_]\w*)=(.*)$")
_USE = re.compile(r'"\$\{(\w+)\[@\]\}"|\$\{(\w+)\[@\]\}|\$\{(\w+)\}|\$(\w+)')


def _uncommented(line: str) -> str:
    return line.split("#")[0].rstrip()  # (a flag's words hold no '#')


def _expanded(text: str, scalars: dict[str, str], arrays: dict[str, list[str]]) -> str:
    """`text` with the script's own variables put in as bash puts them: an array's words (each
    quoted, so that "${ARGS[@]}" stays its words), a value; any other `$...` (the environment's, a
    command's output) as written."""
    def one(m: re.Match) -> str:
        array = m.group(1) or m.group(2)
        if array is not None:
            return " ".join(shlex.quote(w) for w in arrays[array]) if array in arrays else m.group(0)
        name = m.group(3) or m.group(4)
        return scalars.get(name, m.group(0))
    return _USE.sub(one, text)


def flags_of(text: str) -> list[str]:
    """The words of the train_ppo_ray call in a launch script (everything in a file of flags), with
    the variables the script sets before it expanded as bash expands them: `NAME=value`, arrays
    `NAME=( ... )` over one line or several (comments inside), used as $NAME, ${NAME} or
    ${NAME[@]} (OpenRLHF's examples gather their flags in such arrays). A value bash computes (a
    command's output, the environment's) stays as written."""
    lines = text.replace("\\\n", " ").splitlines()
    scalars: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    i = 0
    try:
        while i < len(lines):
            line, i = lines[i], i + 1
            if MODULE in _uncommented(line):
                words = shlex.split(_expanded(line, scalars, arrays), comments=True)
                if MODULE not in words:  # (a command run by `bash -c "..."`, srun's say: its string's words)
                    inner = next((w for w in words if MODULE in w), None)
                    words = words if inner is None else shlex.split(inner, comments=True)
                words = words[words.index(MODULE) + 1:] if MODULE in words else words
                break
            m = _ASSIGNMENT.match(line)
            if not m:
                continue
            name, value = m.groups()
            if value.startswith("("):  # (an array: to the line that closes it)
                body = [value[1:]]
                while not _uncommented(body[-1]).endswith(")") and i < len(lines):
                    body, i = body + [lines[i]], i + 1
                inner = "\n".join(map(_uncommented, body)).removesuffix(")")
                arrays[name] = shlex.split(_expanded(inner, scalars, arrays))
            elif "$(" not in value and "`" not in value:  # (a command's output: not run here)
                scalars[name] = " ".join(shlex.split(_expanded(value, scalars, arrays), comments=True))
        else:  # a file of flags
            words = shlex.split(_expanded(text.replace("\\\n", " "), scalars, arrays), comments=True)
    except ValueError as e:
        raise ConfigError(f"not a command line: {e}") from None
    words = [w for w in words if w != "$@"]  # (a launch script passes its own arguments on)
    for i, w in enumerate(words):
        if w in ("&&", "||", ";", "|", "&"):
            return words[:i]
    return words


def _unknown(flag: str, source: str) -> ConfigError:
    names = [n for f in _table()["flags"] for n in f["flags"]]
    close = difflib.get_close_matches(flag.split("=")[0], names, n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"OpenRLHF {VERSION}'s train_ppo_ray has no such flag{hint}", flag, source)


def read_config(path: str | Path, overrides: list[str] = ()) -> tuple[str, dict[str, Any], set[str]]:
    """("deepspeed", every flag's value as OpenRLHF parses it (dest -> value), the dests changed
    from OpenRLHF's defaults) of a launch script or file of flags, and overrides `flag=value`
    (`--` optional; a store_true flag =true or =false)."""
    source = str(path)
    p = Path(path)
    if not p.is_file():
        raise ConfigError("no such file" if not p.exists() else "not a regular file", source=source)
    try:
        argv = flags_of(p.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"unreadable: {e}", source=source) from None
    except ConfigError as e:
        raise ConfigError(e.message, e.field, source) from None
    table = {n: f for f in _table()["flags"] for n in f["flags"]}
    for o in overrides:
        key, eq, value = o.partition("=")
        flag = "--" + key.lstrip("-")
        if not eq or flag not in table:
            raise (ConfigError("an override is flag=value", o, "overrides") if not eq else _unknown(flag, "overrides"))
        if table[flag]["kind"] != "value":
            if value.lower() not in ("true", "false"):
                raise ConfigError("a switch is =true or =false", o, "overrides")
            argv = [w for w in argv if w != flag] + ([flag] if value.lower() == "true" else [])
        else:  # (a value with spaces, a folder's name say, is one word unless the flag takes several)
            argv += [flag, *(value.split() if table[flag]["nargs"] not in (None, "?") else [value])]
    parser = _parser(source)
    ns, extra = parser.parse_known_args(argv)
    if extra:
        raise _unknown(extra[0], source)
    settings = vars(ns)
    return "deepspeed", settings, _changed(settings)


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


# -- placement --------------------------------------------------------------------------------------
def place(groups: list[tuple[str, int]], per_node: int) -> tuple[dict[str, Mesh], int]:
    """Meshes for GPU groups (name, size), largest first (whole nodes, then aligned power-of-two
    blocks inside a node, first fit: how Ray's PACK strategy fills nodes), and the nodes used."""
    for name, size in groups:
        if not ((size < per_node and is_pow2(size)) or size % per_node == 0):
            raise ConfigError(f"{size} GPUs: realbench places a group on a power-of-two block of a node of {per_node} "
                              "or on whole nodes", name)
    meshes: dict[str, Mesh] = {}
    node, free = 0, []  # free: (node, first gpu, size) blocks left inside nodes
    for name, size in sorted(groups, key=lambda g: -g[1]):
        if size >= per_node:
            meshes[name] = Mesh(node, size // per_node, 0, per_node)
            node += size // per_node
            continue
        for i, (n, g, s) in enumerate(free):
            if s >= size:
                meshes[name] = Mesh(n, 1, g, size)
                free[i] = (n, g + size, s - size)
                break
        else:
            meshes[name] = Mesh(node, 1, 0, size)
            free.append((node, size, per_node - size))
            node += 1
    return meshes, node


def _even(total: int, parts: int, what: str, flag: str, source: str) -> int:
    if total % parts:
        raise ConfigError(f"{total} {what} do not split evenly over {parts} (realbench's plans split a call's rows "
                          "evenly)", flag, source)
    return total // parts


def _rows_within(L: int, budget: int) -> int:
    """Rows a micro-batch of OpenRLHF's dynamic batching holds: first fit in arrival order
    (get_minimum_num_micro_batch_size, utils/seqlen_balancing.py:234-246) of rows of L tokens
    each (realbench reads an OpenRLHF job's rows at their cap) within `budget` tokens (already
    times ring attention and DeepSpeed's tp, :237): floor(budget / L), one where a row alone is
    longer (first fit opens a micro-batch for it all the same)."""
    return max(1, budget // L)


def to_plan(engine: str, s: dict[str, Any], given: set[str], name: str, device: str, source: str = "",
            gpus_per_node: int = 8) -> tuple[dict, dict]:
    """(scenario document, plan document) of OpenRLHF's parsed flags `s` and the dests changed,
    on nodes of `gpus_per_node` GPUs (the command line does not say: only a group's GPU count
    matters to Ray's placement)."""
    refuse_unpriced(s, given, source)
    estimator = s["algo.advantage.estimator"]
    if estimator not in ESTIMATORS:
        raise ConfigError(f"{estimator!r}: realbench plans {', '.join(ESTIMATORS)} (PPO, GRPO, RLOO)",
                          "--algo.advantage.estimator", source)
    algorithm = ESTIMATORS[estimator]
    # OpenRLHF builds a reference only for a KL coefficient above 0 (cli/train_ppo_ray.py:93-103)
    reference = s["algo.kl.init_coef"] > 0
    n = int(s["rollout.n_samples_per_prompt"])
    if algorithm != "ppo" and n < 2:
        raise ConfigError(f"{n}: {algorithm.upper()} compares a prompt's samples: 2 or more",
                          "--rollout.n_samples_per_prompt", source)
    engines, rollout_tp = s["vllm.num_engines"], int(s["vllm.tensor_parallel_size"])
    if not engines:
        raise ConfigError("is not set: OpenRLHF generates with vLLM engines only (samples_generator.py:195-241)",
                          "--vllm.num_engines", source)
    if s["rollout.max_new_tokens"] is None:
        raise ConfigError("is not set: realbench prices a fixed response budget (OpenRLHF's default fills each "
                          "prompt to --data.max_len)", "--rollout.max_new_tokens", source)
    gen_len = int(s["rollout.max_new_tokens"])
    prompt_len = int(s["data.max_len"]) - gen_len
    if prompt_len < 1:
        raise ConfigError(f"{s['data.max_len']} leaves no room for prompts of --rollout.max_new_tokens {gen_len}",
                          "--data.max_len", source)
    L = prompt_len + gen_len
    # (vLLM's max_model_len: cli/train_ppo_ray.py:53-74; vLLM refuses one beyond the checkpoint's positions)
    refuse_beyond_positions(L, s["actor.model_name_or_path"], "--data.max_len", source,
                            "vLLM refuses before it starts (OpenRLHF gives it as max_model_len, train_ppo_ray.py:53-74)")
    T, zero = int(s["ds.tensor_parallel_size"]), int(s["ds.zero_stage"])
    if T > 1 and zero == 3:
        raise ConfigError("3 with --ds.tensor_parallel_size > 1: DeepSpeed's AutoTP trains under ZeRO 0 to 2 "
                          "(deepspeed.ai/tutorials/autotp-training)", "--ds.zero_stage", source)
    forward_zero = 3 if zero == 3 else 0  # the eval config (deepspeed_utils.py:78-118)
    if zero == 3 and int(s["ds.zpg"]) > 1:  # (read under stage 3 only: deepspeed runtime/zero/stage3.py:261-267)
        raise ConfigError(f"{s['ds.zpg']} with --ds.zero_stage 3: ZeRO++'s hierarchical partitioning keeps a second "
                          "copy of the weights' shards in groups of this many GPUs and gathers the backward's from it "
                          "(zero_hpz_partition_size); realbench does not price it", "--ds.zpg", source)
    ring = int(s[RING])
    if ring < 1:
        raise ConfigError(f"{ring}: a ring attention group is 1 GPU or more", f"--{RING}", source)
    host_adam = bool(s[ADAM_OFFLOAD])
    sleep = bool(s[SLEEP]) and not host_adam  # (beside CPU Adam the sleep moves nothing)
    if sleep and zero == 0:
        raise ConfigError("with --ds.zero_stage 0: DeepSpeed offloads the states of its ZeRO optimizers only "
                          "(runtime/zero/stage3.py:3571, stage_1_and_2.py:2921)", f"--{SLEEP}", source)
    if host_adam and zero == 0:
        raise ConfigError("with --ds.zero_stage 0: DeepSpeed's CPU Adam runs under its ZeRO optimizers (stage 0's "
                          "bf16 wrapper keeps fp32 copies on the GPU, runtime/fp16/unfused_optimizer.py:77)",
                          f"--{ADAM_OFFLOAD}", source)
    critic = algorithm == "ppo"
    reward_fn = s["reward.remote_url"]
    if reward_fn and not str(reward_fn).endswith(".py"):
        raise ConfigError(f"{reward_fn!r}: a remote reward server's time is not on the plan's GPUs; realbench reads a "
                          "reward model or a reward function file (.py)", "--reward.remote_url", source)
    if not reward_fn and not s["reward.model_name_or_path"]:
        raise ConfigError("OpenRLHF needs a scorer: a reward model (--reward.model_name_or_path) or a reward function "
                          "(--reward.remote_url FILE.py)", "--reward.model_name_or_path", source)
    width = lambda role: int(s[f"{role}.num_nodes"]) * int(s[f"{role}.num_gpus_per_node"])  # noqa: E731
    per_node = gpus_per_node
    # the asynchronous trainer (trainer/ppo_trainer_async.py): generation runs up to async_queue_size
    # batches ahead of training (a Ray queue of that size), on vLLM's own GPUs: under colocate_all only
    # the DeepSpeed models share the actor's (cli/train_ppo_ray.py:711-712, 75)
    staleness = int(s["train.async_queue_size"]) if s["train.async_enable"] else 0
    colocated = bool(s["train.colocate_all"])  # the DeepSpeed models on the actor's placement group
    hybrid = colocated and not staleness  # and vLLM there too
    with_ref, with_reward = bool(s["train.colocate_actor_ref"]), bool(s["train.colocate_critic_reward"]) and critic
    if staleness and s["vllm.enable_sleep"]:
        raise ConfigError("OpenRLHF's asynchronous trainer keeps vLLM awake (cli/train_ppo_ray.py:714-715)",
                          "--vllm.enable_sleep", source)
    W_a = width("actor")
    if reference and (colocated or with_ref) and (s["ref.num_nodes"], s["ref.num_gpus_per_node"]) != (s["actor.num_nodes"],
                                                                                        s["actor.num_gpus_per_node"]):
        raise ConfigError("a reference colocated with the actor has the actor's nodes and GPUs per node "
                          "(cli/train_ppo_ray.py:41-46)", "--ref.num_gpus_per_node", source)
    if with_reward and not reward_fn and (s["reward.num_nodes"], s["reward.num_gpus_per_node"]) != (
            s["critic.num_nodes"], s["critic.num_gpus_per_node"]):
        raise ConfigError("a reward model colocated with the critic has the critic's nodes and GPUs per node "
                          "(cli/train_ppo_ray.py:109-117)", "--reward.num_gpus_per_node", source)
    if hybrid and engines * rollout_tp != W_a:
        raise ConfigError(f"{engines} engines x tp {rollout_tp} != the actor's {W_a} GPUs: the hybrid engine puts a "
                          "vLLM worker on every actor GPU (cli/train_ppo_ray.py:56-64)", "--vllm.num_engines", source)
    if hybrid and not s["vllm.enable_sleep"]:
        raise ConfigError("is off under --train.colocate_all: vLLM keeps its share of every GPU while DeepSpeed "
                          "trains, which realbench does not price (it prices generation's memory released after it)",
                          "--vllm.enable_sleep", source)
    groups = [("actor", W_a)]
    if reference and not (colocated or with_ref):
        groups.append(("ref", width("ref")))
    if critic and not (colocated and not with_reward):
        groups.append(("critic", width("critic")))
    if not reward_fn and not with_reward and not colocated:
        groups.append(("reward", width("reward")))
    if not hybrid:
        groups.append(("vllm", engines * rollout_tp))
    meshes, nodes = place(groups, per_node)
    A = meshes["actor"]
    at_actor = lambda size: Mesh(A.node, max(1, size // per_node), A.gpu, min(size, per_node))  # noqa: E731
    meshes.setdefault("ref", A)
    meshes.setdefault("vllm", A)
    if critic:
        meshes.setdefault("critic", at_actor(width("critic")))  # hybrid: the first bundles (launcher.py:254-283)
    if not reward_fn:
        meshes.setdefault("reward", meshes["critic"] if with_reward else at_actor(width("reward")))
    for role in ("critic", "reward"):
        if role in meshes and colocated and not with_reward and width(role) > W_a:
            raise ConfigError(f"{width(role)} GPUs: under --train.colocate_all it shares the actor's {W_a}",
                              f"--{role}.num_gpus_per_node", source)

    prompts = int(s["rollout.batch_size"])
    rows = prompts * n
    batch = int(s["train.batch_size"])
    steps = _even(rows, batch, "samples a step", "--train.batch_size", source)
    epochs = int(s["train.max_epochs"])
    dynamic = bool(s["train.dynamic_batch_enable"])
    infer_tokens = int(s["rollout.max_tokens_per_gpu"] or s["train.max_tokens_per_gpu"])  # :691-697
    micro, infer_micro = int(s["train.micro_batch_size"]), int(s["rollout.micro_batch_size"])

    def dp_of(role: str) -> int:  # (the data-parallel ranks: groups of ring x tp GPUs)
        size = meshes[role].size
        if size % T:
            raise ConfigError(f"{T} does not divide the {role}'s {size} GPUs (utils/deepspeed/deepspeed.py:103-107)",
                              "--ds.tensor_parallel_size", source)
        if size % (T * ring):
            times = f" x --ds.tensor_parallel_size {T} = {T * ring}" if T > 1 else ""
            raise ConfigError(f"{ring}{times} does not divide the {role}'s {size} GPUs "
                              "(utils/deepspeed/deepspeed.py:103-107)", f"--{RING}", source)
        return size // (T * ring)

    groups = {"sp": ring, "ring": "allgather"} if ring > 1 else {}

    def trained(role: str) -> dict:
        dp = dp_of(role)
        per_gpu = _even(batch, dp, "samples of an optimizer step", "--train.batch_size", source)
        if dynamic:  # first fit of a rank's rows, the largest count over the ranks (replay_buffer.py:116-127)
            m = _rounds(per_gpu, _rows_within(L, int(s["train.max_tokens_per_gpu"]) * T * ring))
        else:
            if per_gpu % micro:
                raise ConfigError(f"{micro} does not divide a GPU's {per_gpu} samples of an optimizer step: DeepSpeed "
                                  "needs train_batch_size = micro x accumulation x dp (deepspeed.py:455-456)",
                                  "--train.micro_batch_size", source)
            m = per_gpu // micro
        return {"mesh": meshes[role], "dp": dp, "tp": T, "pp": 1, "micro_batches": m,
                "activation_checkpointing": bool(s["actor.gradient_checkpointing_enable"]), "zero": zero,
                "offload_optimizer": sleep, "host_adam": host_adam, **groups}

    def forward(role: str, z: int) -> dict:
        dp = dp_of(role)
        per_gpu = _even(rows, dp, "samples", "--rollout.batch_size", source)
        if dynamic:  # the step's rows by first fit, in whole multiples of the actor's ranks, dispatched over the role's
            actor_dp = dp_of("actor")
            chunks = max(actor_dp, -(-rows // _rows_within(L, infer_tokens * T * ring)) // actor_dp * actor_dp)
            m = _splits(per_gpu, -(-chunks // dp))
        else:
            m = _rounds(per_gpu, infer_micro)
        return {"mesh": meshes[role], "dp": dp, "tp": T, "pp": 1, "micro_batches": m, "zero": z, **groups}

    calls: dict[str, dict] = {
        "actor_gen": {"mesh": meshes["vllm"], "dp": engines, "tp": rollout_tp, "pp": 1,
                      "micro_batches": _rounds(_even(rows, engines, "samples", "--vllm.num_engines", source),
                                               VLLM_MAX_NUM_SEQS)},
        "actor_train": trained("actor")}
    if reference:
        calls["ref_inf"] = forward("ref", forward_zero)
    if critic:
        calls["critic_train"], calls["critic_inf"] = trained("critic"), forward("critic", forward_zero)
    if reward_fn:  # run in the vLLM engines' actors beside generation (utils/agent.py:285-306)
        calls["reward_inf"] = {"mesh": meshes["vllm"], "dp": meshes["vllm"].size, "tp": 1, "pp": 1, "micro_batches": 1}
    else:
        calls["reward_inf"] = forward("reward", forward_zero)
    for c in calls.values():
        c["mesh"] = c["mesh"].label(per_node)
    actor_path = s["actor.model_name_or_path"]
    models: dict[str, Any] = {"actor": {"path": actor_path}, **({"ref": {"path": actor_path}} if reference else {})}
    if critic:  # the critic defaults to the reward model (cli/train_ppo_ray.py:644-650)
        models["critic"] = {"path": s["critic.model_name_or_path"] or s["reward.model_name_or_path"] or actor_path,
                            "value_head": True}
    models["reward"] = ({"function": f"{reward_fn}:reward_func"} if reward_fn
                        else {"path": s["reward.model_name_or_path"], "value_head": True})
    for entry in models.values():
        if entry.get("path") is None:
            entry.pop("path", None)
    if int(s["ds.lora.rank"]) > 0:
        if critic:
            raise ConfigError(f"{s['ds.lora.rank']} with a critic: OpenRLHF wraps the critic in the same adapters "
                              "(trainer/ray/ppo_critic.py:201-204); realbench reads LoRA on the actor of GRPO and RLOO",
                              "--ds.lora.rank", source)
        if float(s["ds.lora.dropout"]):
            raise ConfigError(f"{s['ds.lora.dropout']}: realbench trains adapters without dropout (0)", "--ds.lora.dropout",
                              source)
        targets = s["ds.lora.target_modules"]
        models["actor"]["lora"] = {"r": int(s["ds.lora.rank"]), "lora_alpha": s["ds.lora.alpha"],
                                   "target_modules": "all-linear" if targets in ("all-linear", ["all-linear"]) else targets}
    return job_documents("openrlhf", name, f"read from the OpenRLHF {VERSION} command line {Path(source).name}",
                         f"OpenRLHF {VERSION} command line", algorithm=algorithm, models=models, prompts=prompts,
                         prompt_len=prompt_len, gen_len=gen_len, steps=steps, group_size=n,
                         cluster={"nodes": nodes, "gpus_per_node": per_node, "device": device}, epochs=epochs,
                         calls=calls, max_staleness=staleness, with_ref=reference, old_logprobs="whole_batch",
                         # (dynamic batching and ring attention turn packing on: cli/train_ppo_ray.py:686-694)
                         rollout_server="vllm", padding_free=bool(s[PACKING]) or dynamic or ring > 1,
                         memory_fraction=s[MEMORY])


# -- a plan as a command line -------------------------------------------------------------------------
def space_problem_of_scenario(scenario: Scenario) -> Optional[tuple[str, str]]:
    if scenario.algorithm not in ESTIMATORS.values():
        return "scenario.algorithm", f"realbench writes OpenRLHF's PPO, GRPO and RLOO, not {scenario.algorithm}"
    if scenario.models["actor"].lora is not None and "critic" in scenario.models:
        return "models.actor.lora", ("OpenRLHF wraps the critic in the actor's adapters (--ds.lora.*, "
                                     "trainer/ray/ppo_critic.py:201-204): realbench writes its LoRA for GRPO and RLOO")
    if scenario.rollout_server not in (None, "vllm"):
        return "rollout_server", "OpenRLHF generates with vLLM only (trainer/ppo_utils/samples_generator.py:195-241)"
    if scenario.training.old_logprobs not in OLD_LOGPROBS + ("later_steps",):
        return "training.old_logprobs", f"OpenRLHF takes the old log-probabilities {OLD_LOGPROBS_HOW}"
    return lora_problem(scenario, "OpenRLHF")


def _inside(a: Mesh, b: Mesh, G: int) -> bool:
    return b.start(G) <= a.start(G) and a.start(G) + a.size <= b.start(G) + b.size


def _disjoint(meshes: list[Mesh], G: int) -> bool:
    spans = sorted((m.start(G), m.start(G) + m.size) for m in meshes)
    return all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))


def _together(options: dict[str, Option], trained: list[str], switch: str, how: str) -> bool:
    """The one value of a strategy switch that OpenRLHF sets for both trained models with one flag,
    or ConfigError where the plan sets it for one only (`how`: what OpenRLHF does together)."""
    values = {getattr(options[n].strategy, switch) for n in trained}
    if len(values) > 1:
        raise ConfigError(f"OpenRLHF {how}", f"calls.critic_train.{switch}")
    return values.pop()


def _ring_size(options: dict[str, Option], ds_calls: list[str]) -> int:
    """The one ring attention group size (RING) of every DeepSpeed model's calls, or ConfigError:
    OpenRLHF splits sequences by ring attention only, one size for every model."""
    for name, o in options.items():
        if o.strategy.sp > 1 and o.strategy.ring != "allgather":
            raise ConfigError(f"{o.strategy.sp}: OpenRLHF splits sequences by ring attention (--{RING}: ring: "
                              "allgather), not by " + ("Megatron's p2p ring" if o.strategy.ring else
                                                       "Ulysses' head exchanges"), f"calls.{name}.sp")
    ring = options["actor_train"].strategy.sp
    for name in ds_calls:
        if options[name].strategy.sp != ring:
            raise ConfigError(f"OpenRLHF's ring attention group is one size for every model (--{RING} {ring})",
                              f"calls.{name}.sp")
    return ring


def _settings(scenario: Scenario, options: dict[str, Option]) -> dict[str, Any]:
    """OpenRLHF's flags (dest -> value) for a plan, or ConfigError naming the first part of it
    OpenRLHF cannot run."""
    problem = space_problem_of_scenario(scenario)
    if problem:
        raise ConfigError(problem[1], problem[0])
    c, df = scenario.cluster, scenario.dataflow
    G = c.gpus_per_node
    fn_reward = isinstance(scenario.models["reward"], FunctionSpec)
    critic = "critic_train" in options
    reference = "ref_inf" in options
    ds_calls = ["actor_train"] + (["ref_inf"] if reference else []) + \
        (["critic_train", "critic_inf"] if critic else []) + ([] if fn_reward else ["reward_inf"])
    trained = ["actor_train"] + (["critic_train"] if critic else [])
    # (an optimizer offloaded: --ds.enable_sleep, for actor and critic together; OpenRLHF's
    # parameter offloads keep other copies)
    refuse_offload({n: o for n, o in options.items() if n not in trained}, "OpenRLHF", "--ref.offload")
    for name, o in options.items():
        if o.strategy.shard_group:
            raise ConfigError(f"{o.strategy.shard_group}: OpenRLHF's DeepSpeed shards a model over all its data-parallel "
                              "GPUs (its --ds.zpg, ZeRO++'s second copy of the weights in a node, is not hybrid "
                              "sharding, and realbench does not price it)", f"calls.{name}.shard_group")
    for name, o in options.items():  # (EXPERTS)
        if o.strategy.ep > 1 or o.strategy.etp:
            field = "ep" if o.strategy.ep > 1 else "etp"
            raise ConfigError(f"{field} {getattr(o.strategy, field)}: {EXPERTS}", f"calls.{name}.{field}")
    ring = _ring_size(options, ds_calls)
    for name in trained:
        if options[name].strategy.offload_params:
            raise ConfigError("realbench does not write OpenRLHF's parameter offload of a trained model (DeepSpeed's "
                              "offload_param), which keeps and moves them otherwise than priced here",
                              f"calls.{name}.offload_params")
    sleep = _together(options, trained, "offload_optimizer", f"offloads the actor's and the critic's optimizer "
                      f"together (--{SLEEP})")
    host_adam = _together(options, trained, "host_adam", f"runs the actor's and the critic's Adam on the host "
                          f"together (--{ADAM_OFFLOAD})")
    for name, o in options.items():
        if o.strategy.pp > 1:
            raise ConfigError("OpenRLHF runs no pipeline parallelism (utils/deepspeed/deepspeed.py:103-107: dp, sp, tp)",
                              f"calls.{name}.pp")
    actor = options["actor_train"].strategy
    T = actor.tp
    zero = next((options[nm].strategy.zero for nm in trained if options[nm].strategy.shards > 1), 0)
    for name in ds_calls:
        s = options[name].strategy
        if s.tp != T:
            raise ConfigError("OpenRLHF's DeepSpeed tensor parallel size is one for every model (--ds.tensor_parallel_size)",
                              f"calls.{name}.tp")
        want = zero if name in trained else (3 if zero == 3 else 0)
        if s.shards > 1 and s.zero != want:
            raise ConfigError(f"zero {s.zero}: OpenRLHF has one ZeRO stage (--ds.zero_stage {zero}) for the trained "
                              "models; forward-only, stage 3 under it or none (deepspeed_utils.py:78-118)",
                              f"calls.{name}.zero")
    if T > 1 and zero == 3:
        raise ConfigError("DeepSpeed's AutoTP trains under ZeRO 0 to 2", "calls.actor_train.zero")
    if zero == 3 and int(scenario.engine_settings.get("ds.zpg", 1)) > 1:
        raise ConfigError(f"{scenario.engine_settings['ds.zpg']}: under this plan's ZeRO-3 DeepSpeed would keep ZeRO++'s "
                          "hierarchical copy of the weights (zero_hpz_partition_size), which realbench does not price; "
                          "remove it from the scenario's engine_settings", "engine_settings.ds.zpg")
    if ring > 1 and not packs(scenario, "openrlhf", PADDING_FREE):  # (a scenario not OpenRLHF's: padded, priced_as)
        raise ConfigError("OpenRLHF's ring attention packs the rows (cli/train_ppo_ray.py:686-689), and this scenario "
                          "prices them padded (training.padding_free)", "calls.actor_train.ring")
    if sleep and zero == 0:
        raise ConfigError("OpenRLHF offloads an optimizer's states with --ds.enable_sleep, which DeepSpeed runs for "
                          "its ZeRO optimizers only (runtime/zero/stage3.py:3571, stage_1_and_2.py:2921): shard it "
                          "(zero 1 to 3)", "calls.actor_train.offload_optimizer")
    if host_adam and zero == 0:
        raise ConfigError("OpenRLHF runs Adam on the host with --ds.adam_offload, DeepSpeed's ZeRO-Offload, which "
                          "needs a ZeRO optimizer (stage 0's keeps fp32 copies on the GPU): shard it (zero 1 to 3)",
                          "calls.actor_train.host_adam")
    if critic and options["critic_train"].strategy.checkpointing != actor.checkpointing:
        raise ConfigError("OpenRLHF checkpoints actor and critic together (--actor.gradient_checkpointing_enable)",
                          "calls.critic_train.activation_checkpointing")
    A = options["actor_train"].mesh
    V = options["actor_gen"].mesh
    R = options["ref_inf"].mesh if reference else A  # (no reference: nothing beside the actor to place)
    gen = options["actor_gen"].strategy
    hybrid = V == A
    out: dict[str, Any] = {}
    staleness = scenario.dataflow.max_staleness
    if staleness:  # generation up to S batches ahead: a queue of S (trainer/ppo_trainer_async.py)
        if hybrid:
            raise ConfigError("OpenRLHF's asynchronous trainer runs vLLM on its own GPUs (cli/train_ppo_ray.py:75)",
                              "calls.actor_gen.mesh")
        out.update({"train.async_enable": True, "train.async_queue_size": staleness})
    if critic and options["critic_inf"].mesh != options["critic_train"].mesh:
        raise ConfigError("OpenRLHF's critic computes values on its training GPUs", "calls.critic_inf.mesh")
    C = options["critic_train"].mesh if critic else None
    RM = None if fn_reward else options["reward_inf"].mesh
    # --train.colocate_all: the reference on the actor's GPUs, a critic or reward model on its first
    # ones (launcher.py:254-283), or both on their own (--train.colocate_critic_reward)
    beside_actor = lambda m: m is not None and m.start(G) == A.start(G) and _inside(m, A, G)  # noqa: E731
    own = [m for m in (C, RM) if m is not None and not beside_actor(m)]
    all_on_actor = R == A and (not own or (critic and C == RM and _disjoint([A, C], G)))
    if hybrid:
        if R != A:
            raise ConfigError("under the hybrid engine (vLLM on the actor's GPUs) the reference is there too",
                              "calls.ref_inf.mesh")
        if gen.size != A.size:
            raise ConfigError("the hybrid engine puts a vLLM worker on every actor GPU", "calls.actor_gen.dp")
        if not all_on_actor:
            raise ConfigError("under the hybrid engine a critic or reward model takes the actor's first GPUs, or both "
                              "share their own (--train.colocate_critic_reward)", "calls.critic_train.mesh")
        out.update({"train.colocate_all": True, "vllm.enable_sleep": True,
                    "train.colocate_critic_reward": bool(own)})
    elif staleness and all_on_actor and any(beside_actor(m) for m in (C, RM)):
        # asynchronous under colocate_all: the DeepSpeed models on the actor's GPUs, vLLM apart
        if not _disjoint([A, V] + own[:1], G):
            raise ConfigError("vLLM's GPUs are its own under the asynchronous trainer", "calls.actor_gen.mesh")
        out.update({"train.colocate_all": True, "train.colocate_critic_reward": bool(own)})
    else:
        with_ref = R == A
        with_reward = critic and RM is not None and RM == C
        groups = [A, V] + ([] if with_ref else [R]) + ([C] if critic else []) + \
            ([RM] if RM is not None and not with_reward else [])
        if not _disjoint(groups, G):
            raise ConfigError("OpenRLHF's groups share GPUs only as it colocates them (actor and reference, critic and "
                              "reward model, or everything on the actor's)", "calls.actor_gen.mesh")
        out.update({"train.colocate_actor_ref": with_ref, "train.colocate_critic_reward": with_reward})
    shape = lambda m: (m.nodes, m.gpus)  # noqa: E731  (num_nodes, num_gpus_per_node)
    out.update({"actor.num_nodes": shape(A)[0], "actor.num_gpus_per_node": shape(A)[1],
                "ref.num_nodes": shape(R)[0], "ref.num_gpus_per_node": shape(R)[1],
                **({} if reference else {"algo.kl.init_coef": 0.0}),
                "vllm.num_engines": gen.dp, "vllm.tensor_parallel_size": gen.tp,
                MEMORY: served_call(df.call("actor_gen"), gen).memory_fraction or MEMORY_FRACTION,
                "ds.zero_stage": zero,
                "ds.tensor_parallel_size": T, RING: ring, SLEEP: sleep,
                ADAM_OFFLOAD: host_adam,
                "actor.gradient_checkpointing_enable": actor.checkpointing})
    if critic:
        out.update({"critic.num_nodes": shape(C)[0], "critic.num_gpus_per_node": shape(C)[1]})
    if RM is not None:
        out.update({"reward.num_nodes": shape(RM)[0], "reward.num_gpus_per_node": shape(RM)[1]})
    g = df.call("actor_gen")
    rows, n = g.seqs, g.group_size
    if rows % gen.dp or _rounds(rows // gen.dp, VLLM_MAX_NUM_SEQS) != gen.micro_batches:
        raise ConfigError(f"OpenRLHF leaves vLLM's max_num_seqs at its default ({VLLM_MAX_NUM_SEQS}): "
                          f"{_rounds(rows // gen.dp, VLLM_MAX_NUM_SEQS) if rows % gen.dp == 0 else '?'} batches a "
                          "vLLM engine", "calls.actor_gen.micro_batches")
    steps = df.call("actor_train").optimizer_steps
    batch = rows // steps
    per_micro = set()
    for name in trained:
        s = options[name].strategy
        per_gpu = batch // s.dp
        if batch % s.dp or per_gpu % s.micro_batches:
            raise ConfigError(f"{s.micro_batches} micro-batches do not split a GPU's {per_gpu} samples of an optimizer "
                              "step evenly (DeepSpeed's train_batch_size = micro x accumulation x dp)",
                              f"calls.{name}.micro_batches")
        per_micro.add(per_gpu // s.micro_batches)
    if len(per_micro) > 1:
        raise ConfigError("OpenRLHF trains actor and critic in micro-batches of one size (--train.micro_batch_size)",
                          "calls.critic_train.micro_batches")
    micro = per_micro.pop()
    forwards = [nm for nm in ds_calls if nm not in trained]
    # (no forward-only call: the chunk size stays OpenRLHF's default, which prices nothing here)
    infer = max((math.ceil(rows / options[nm].strategy.dp / options[nm].strategy.micro_batches) for nm in forwards),
                default=defaults()["rollout.micro_batch_size"])
    for name in ds_calls:  # ref, critic, reward: one chunk size; every DeepSpeed group: the batch rules
        s = options[name].strategy
        if name in forwards and (rows % s.dp or _rounds(rows // s.dp, infer) != s.micro_batches):
            raise ConfigError(f"OpenRLHF's forwards run in chunks of one size (--rollout.micro_batch_size): no size "
                              f"gives {s.micro_batches} of a GPU's {rows // s.dp if rows % s.dp == 0 else rows / s.dp} "
                              "samples here and the other calls' counts", f"calls.{name}.micro_batches")
        if batch % (micro * s.dp):
            raise ConfigError(f"DeepSpeed's batch rule: train batch {batch} is not a multiple of micro-batch {micro} x "
                              f"dp {s.dp} (its eval config carries the same sizes, deepspeed.py:489-500)",
                              f"calls.{name}.dp")
        if math.ceil(rows / infer) < s.dp:
            raise ConfigError(f"{math.ceil(rows / infer)} chunks of samples for {s.dp} data-parallel ranks "
                              "(trainer/ray/launcher.py:346-353)", f"calls.{name}.dp")
    out.update({"rollout.batch_size": rows // n, "rollout.n_samples_per_prompt": n, "train.batch_size": batch,
                "train.micro_batch_size": micro, "rollout.micro_batch_size": infer,
                "train.max_epochs": scenario.training.num_iterations, "data.max_len": g.prompt_len + g.gen_len,
                "rollout.max_new_tokens": g.gen_len,
                "algo.advantage.estimator": {v: k for k, v in ESTIMATORS.items()}[scenario.algorithm]})
    lora = scenario.models["actor"].lora
    if lora is not None:
        out.update({LORA_FLAGS["r"]: lora.r, LORA_FLAGS["lora_alpha"]: whole_alpha(lora, "OpenRLHF"),
                    LORA_FLAGS["target_modules"]: list(lora.target_modules)})
    return out



def space_problem(scenario: Scenario, options: dict[str, Option]) -> Optional[tuple[str, str]]:
    """(plan key, what OpenRLHF cannot do) for the first part of a plan outside its space, or None."""
    return listing.problem_of(_settings, scenario, options)


def to_config(scenario: Scenario, options: dict[str, Option], model_paths: dict[str, str]) -> tuple[str, dict]:
    """("deepspeed", OpenRLHF's flags for the plan: dest -> value)."""
    out = _settings(scenario, options)
    out[PACKING] = packs(scenario, "openrlhf", PADDING_FREE)
    for role in ("actor", "critic"):
        if role in scenario.models and role not in model_paths:
            raise ConfigError(f"OpenRLHF loads a checkpoint folder: give the {role}'s (--model-path {role}=DIR)",
                              f"models.{role}")
    if model_paths.get("ref", model_paths["actor"]) != model_paths["actor"]:
        raise ConfigError("OpenRLHF's reference is the actor's checkpoint (--actor.model_name_or_path)", "models.ref")
    out["actor.model_name_or_path"] = model_paths["actor"]
    if "critic" in scenario.models:
        out["critic.model_name_or_path"] = model_paths["critic"]
    reward = scenario.models["reward"]
    if isinstance(reward, FunctionSpec):
        if len(reward.functions) > 1 or reward.model_score or not reward.functions[0].endswith(":reward_func"):
            raise ConfigError("OpenRLHF scores with one reward function, reward_func in a .py file "
                              "(--reward.remote_url FILE.py)", "models.reward")
        out["reward.remote_url"] = reward.functions[0].rpartition(":")[0]
    else:
        if "reward" not in model_paths:
            raise ConfigError("OpenRLHF loads a checkpoint folder: give the reward model's (--model-path reward=DIR)",
                              "models.reward")
        out["reward.model_name_or_path"] = model_paths["reward"]
    return "deepspeed", out


def command_line(settings: dict[str, Any]) -> list[list[str]]:
    """The flags of OpenRLHF's settings (dest -> value), each with its values; switches only when on."""
    kinds = {f["dest"]: (f["flags"][0], f["kind"]) for f in _table()["flags"]}
    flags: list[list[str]] = []
    for dest, value in settings.items():
        flag, kind = kinds[dest]
        if kind != "value":
            if value:
                flags.append([flag])
        elif value is not None:
            flags.append([flag, *(map(str, value) if isinstance(value, (list, tuple)) else [str(value)])])
    return flags


def config_files(config: Path, engine: str, settings: dict[str, Any],
                 node_size: Optional[int] = None) -> list[tuple[Path, str, int]]:
    """The launch script (at `config`): OpenRLHF's command line, one flag a line, submitted to the
    Ray cluster at $RAY_ADDRESS (default the local one). `node_size`: the GPUs of a node the plan
    was made for (its command line gives only each group's count), named for reading it back."""
    lines = ["  " + " ".join(shlex.quote(w) for w in flag) for flag in command_line(settings)]
    note = "" if node_size is None else (f"# (planned on nodes of {node_size} GPUs: realbench import openrlhf "
                                         f"{shlex.quote(config.name)} --gpus-per-node {node_size})\n")
    text = ("#!/usr/bin/env bash\n"
            f"# OpenRLHF {VERSION}: the plan realbench wrote (pip install openrlhf[vllm]=={VERSION})\n" + note +
            'ray job submit --address="${RAY_ADDRESS:-http://127.0.0.1:8265}" -- \\\n'
            f"  {ENTRY} \\\n" + " \\\n".join(lines) + ' "$@"\n')
    return [(config, text, 0o755)]


# -- OpenRLHF's space, for a search ---------------------------------------------------------------------
def _placements(scenario: Scenario) -> Iterator[dict[str, Mesh]]:
    """Where OpenRLHF's groups can be, using every GPU of the cluster: the hybrid engine on all of
    them (the critic and reward model beside it, or on their own group), or separate groups for
    the actor (the reference with it or apart), vLLM, the critic (the reward model with it or
    apart) and a reward model."""
    c = scenario.cluster
    N, G = c.n_devices, c.gpus_per_node
    critic = "critic" in scenario.models
    rm = not isinstance(scenario.models["reward"], FunctionSpec)
    sizes = group_sizes(c)

    def fits(groups: dict[str, int]) -> Optional[dict[str, Mesh]]:
        if sum(groups.values()) != N:
            return None
        try:
            meshes, nodes = place(list(groups.items()), G)
        except ConfigError:
            return None
        return meshes if nodes <= c.nodes else None

    whole = Mesh(0, c.nodes, 0, G)
    hybrid = not scenario.dataflow.max_staleness  # (the asynchronous trainer runs vLLM on its own GPUs)
    if hybrid:
        yield {role: whole for role in ("actor", "vllm", "ref", "critic", "reward")}  # all beside the actor
    for a in sizes:  # hybrid, critic and reward model on their own GPUs
        if hybrid and critic and a < N:
            meshes = fits({"actor": a, "critic": N - a})
            if meshes:
                yield {**meshes, "vllm": meshes["actor"], "ref": meshes["actor"], "reward": meshes["critic"]}
    roles = ["actor", "vllm"] + (["critic"] if critic else [])
    for counts in _products(sizes, len(roles), N):
        base = dict(zip(roles, counts))
        left = N - sum(counts)
        reference = "ref_inf" in scenario.dataflow.call_names
        for ref in (0,) + tuple(x for x in sizes if x <= left and reference):  # 0: with the actor (or none)
            for reward in ((0,) + tuple(sizes) if rm and critic else tuple(sizes) if rm else (None,)):
                if (ref or 0) + (reward or 0) != left:
                    continue
                groups = {**base, **({"ref": ref} if ref else {}), **({"reward": reward} if reward else {})}
                meshes = fits(groups)
                if meshes:
                    meshes.setdefault("ref", meshes["actor"])
                    if rm:
                        meshes.setdefault("reward", meshes.get("critic"))
                    yield meshes


def _products(sizes: list[int], k: int, budget: int) -> Iterator[tuple[int, ...]]:
    """k-tuples of sizes whose sum is at most `budget`."""
    if k == 0:
        yield ()
        return
    for s in sizes:
        if s <= budget:
            for rest in _products(sizes, k - 1, budget - s):
                yield (s,) + rest


def plan_table(scenario: Scenario) -> tuple[dict[str, list[Option]], list[tuple[int, ...]]]:
    """Every plan OpenRLHF can run of a scenario on its whole cluster (placements x DeepSpeed's
    tensor parallel size, ZeRO stage, checkpointing and the optimizer's states (on the GPUs, asleep
    between updates, or on the host with CPU Adam) x micro-batch and chunk sizes x vLLM's
    tensor parallel size and share of each GPU's memory, listing.served_shares), as per call the
    options used and per plan a row of their indices (in the order of the dict). Each block of
    plans that share a placement, tp and batch sizes is checked by the rules that write it
    (`_settings`); the stages and switches varied inside a block change none of those rules."""
    problem = space_problem_of_scenario(scenario)
    if problem:
        raise ConfigError(problem[1], problem[0])
    c, df = scenario.cluster, scenario.dataflow
    G = c.gpus_per_node
    rows = df.call("actor_gen").seqs
    batch = rows // df.call("actor_train").optimizer_steps
    critic = "critic_train" in df.call_names
    fn_reward = isinstance(scenario.models["reward"], FunctionSpec)
    heads = lambda role, t: scenario.models[role].n_heads % t == 0 and scenario.models[role].n_kv_heads % t == 0  # noqa
    ds_roles = ["actor"] + (["critic"] if critic else []) + ([] if fn_reward else ["reward"])
    # DeepSpeed's tensor parallel size, and (where the rows are packed) ring attention groups of 2, 4,
    # ... beside it, tp x ring GPUs of a node: (tp, ring)
    layouts = [(t, r) for t in divisors(G) if all(heads(role, t) for role in ds_roles)
               for r in divisors(G // t) if r == 1 or scenario.training.padding_free]
    rollout_tps = [t for t in divisors(G) if heads("actor", t)]
    names = list(df.call_names)
    listed = PlanTable(names)
    intern = listed.intern

    for meshes in _placements(scenario):
        A, V = meshes["actor"], meshes["vllm"]
        for T, ring in layouts:
            groups = {"actor_train": A, **({"ref_inf": meshes["ref"]} if "ref_inf" in names else {})}
            if critic:
                groups.update({"critic_train": meshes["critic"], "critic_inf": meshes["critic"]})
            if not fn_reward:
                groups["reward_inf"] = meshes["reward"]
            if any(m.size % (T * ring) for m in groups.values()):
                continue
            dps = {n: m.size // (T * ring) for n, m in groups.items()}
            split = {"sp": ring, "ring": "allgather" if ring > 1 else ""}
            widest = max(dps.values())
            if batch % widest or rows % widest:
                continue
            micros = [m for m in divisors(batch // widest) if is_pow2(m) or m == batch // widest]
            chunks = [k for k in divisors(rows // widest) if is_pow2(k) or k == rows // widest]
            # (each vLLM engine at the least share of each GPU's memory that gives it each count of slots:
            # listing.served_shares)
            gens = [shared for t in rollout_tps if V.size % t == 0 and rows % (V.size // t) == 0
                    for shared in served_shares(scenario, Option(V, Strategy(
                        V.size // t, t, 1, _rounds(rows // (V.size // t), VLLM_MAX_NUM_SEQS))))]
            if not gens:
                continue
            trained = [n for n in ("actor_train", "critic_train") if n in groups]
            sharded = any(dps[n] * ring > 1 for n in trained)
            # (under a ZeRO stage the trained models' optimizers on the device, offloaded between updates
            # by --ds.enable_sleep, or on the host with Adam run there by --ds.adam_offload)
            # (not stage 3 where the scenario carries ZeRO++'s hierarchical partition, which it would turn on)
            stages = (0, 1, 2, 3) if T == 1 and int(scenario.engine_settings.get("ds.zpg", 1)) <= 1 else (0, 1, 2)
            variants = [(z, ckpt, states) for z in (stages if sharded else (0,))
                        for ckpt in (False, True) for states in (("device", "sleep", "host") if z else ("device",))]
            scorer = Option(V, Strategy(V.size, 1, 1)) if fn_reward else None
            for micro in micros:
                for chunk in chunks:
                    def option(name: str, zero: int, ckpt: bool, states: str = "device") -> Option:
                        dp = dps[name]
                        shards = dp * ring > 1
                        if name in trained:
                            return Option(groups[name], Strategy(dp, T, 1, batch // dp // micro, ckpt, 1,
                                                                 zero if shards else 0,
                                                                 offload_optimizer=states == "sleep",
                                                                 host_adam=states == "host", **split))
                        return Option(groups[name], Strategy(dp, T, 1, _rounds(rows // dp, chunk),
                                                             zero=(3 if zero == 3 else 0) if shards else 0, **split))

                    first = {n: option(n, 0, False) for n in groups}
                    first["actor_gen"] = gens[0]
                    if scorer:
                        first["reward_inf"] = scorer
                    # the batch and chunk rules hold for all the stages and switches below alike, or for none
                    if space_problem(scenario, first) is not None:
                        continue
                    gen_k = [intern("actor_gen", g) for g in gens]
                    fixed = {"reward_inf": intern("reward_inf", scorer)} if scorer else {}
                    for zero, ckpt, states in variants:
                        ks = {**fixed, **{n: intern(n, option(n, zero, ckpt, states)) for n in groups}}
                        for g in gen_k:
                            ks["actor_gen"] = g
                            listed.add(ks)
    return listed.result()


def configurations(scenario: Scenario) -> Iterator[dict[str, Option]]:
    """The plans of `plan_table`, one dict of options each."""
    return listing.configurations(plan_table, scenario)


def _fit(value: int, total: int) -> int:
    """The largest divisor of `total` not above `value` (an example's micro-batch size on another job)."""
    return max(d for d in divisors(total) if d <= max(1, value))


# OpenRLHF's examples for a comparable job (OpenRLHF/OpenRLHF examples/scripts, v0.11.0): the README's
# quick-start hybrid engine (train_ppo_ray_hybrid_engine.sh) as the default, and the separate groups of
# train_ppo_ray_slurm.sh (actor+ref a quarter of the GPUs, critic+reward a quarter, vLLM tp 2 the half;
# without a critic, actor+ref the half) as the example; ZeRO-3, gradient checkpointing, micro-batches of 8
# samples to train and 16 to infer (lowered to divide the job's where they do not); the slurm script's
# --ds.adam_offload (CPU Adam) with it
EXAMPLE = {"source": "OpenRLHF examples/scripts/train_ppo_ray_slurm.sh (v0.11.0)", "settings": {"layout": "split"},
           "memory_fraction": 0.95}  # (the script sets none: the flag's default)


def default_plan(scenario: Scenario, settings: Optional[dict[str, Any]] = None) -> dict[str, Option]:
    """The plan of OpenRLHF's README quick-start (the hybrid engine) for the scenario's job, or with
    `settings` {"layout": "split"} (or an asynchronous job: `max_staleness` batches queued) of its
    multi-node example (EXAMPLE)."""
    c, df = scenario.cluster, scenario.dataflow
    N, G = c.n_devices, c.gpus_per_node
    gen, train = df.call("actor_gen"), df.call("actor_train")
    rows, n = gen.seqs, gen.group_size
    batch = rows // train.optimizer_steps
    critic = "critic" in scenario.models
    staleness = df.max_staleness  # (the asynchronous trainer has no hybrid engine: its example's groups)
    split = (settings or {}).get("layout") == "split" or bool(staleness)
    quarter = lambda k: (k * N // 4 // G, G) if k * N // 4 >= G else (1, k * N // 4)  # noqa: E731 (nodes, per node)
    rm = not isinstance(scenario.models["reward"], FunctionSpec)
    actor = quarter(1 if critic or rm else 2) if split else (c.nodes, G)
    dp_a = actor[0] * actor[1]
    argv = ["--actor.num_nodes", actor[0], "--actor.num_gpus_per_node", actor[1], "--ref.num_nodes", actor[0],
            "--ref.num_gpus_per_node", actor[1], "--vllm.tensor_parallel_size", 2,
            "--vllm.num_engines", (N // 2 if split else N) // 2, "--ds.zero_stage", 3,
            "--actor.gradient_checkpointing_enable", "--train.micro_batch_size", _fit(8, batch // dp_a),
            "--rollout.micro_batch_size", _fit(16, rows // dp_a), "--rollout.batch_size", rows // n,
            "--rollout.n_samples_per_prompt", n, "--train.batch_size", batch,
            "--train.max_epochs", scenario.training.num_iterations, "--data.max_len", gen.prompt_len + gen.gen_len,
            "--rollout.max_new_tokens", gen.gen_len,
            "--algo.advantage.estimator", {v: k for k, v in ESTIMATORS.items()}[scenario.algorithm],
            "--actor.model_name_or_path", "actor"]
    argv += ["--train.colocate_actor_ref", "--ds.adam_offload"] if split else [
        "--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep", "--vllm.gpu_memory_utilization", MEMORY_FRACTION]
    argv += [] if "ref_inf" in df.call_names else ["--algo.kl.init_coef", 0]  # no KL term: no reference
    argv += ["--train.async_enable", "--train.async_queue_size", staleness] if staleness else []
    if critic:
        argv += ["--critic.model_name_or_path", "critic", "--critic.num_nodes", actor[0],
                 "--critic.num_gpus_per_node", actor[1], "--reward.num_nodes", actor[0],
                 "--reward.num_gpus_per_node", actor[1]]
        argv += ["--train.colocate_critic_reward"] if split else []
    if not rm:
        argv += ["--reward.remote_url", "reward.py"]
    else:
        argv += ["--reward.model_name_or_path", "reward"]
        if not critic:
            argv += ["--reward.num_nodes", actor[0], "--reward.num_gpus_per_node", actor[1]]
    ns, _ = _parser("default").parse_known_args([str(w) for w in argv])
    settings_ = vars(ns)
    _, plan = to_plan("deepspeed", settings_, _changed(settings_), scenario.name,
                      "h100", gpus_per_node=G)
    return the_jobs_share(resolve_plan(plan_from_document({**plan, "scenario": scenario.name}), scenario))
