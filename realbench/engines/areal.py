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
  realbench.engines.areal_packer forms them; a Megatron
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
`areal-1.0.4.json`, written by `areal_check.py defaults`, which a test compares with the installed
AReaL) and Hydra-style overrides (`key=value`, `+key=value`), interpolations resolved by OmegaConf
as AReaL's loader resolves them.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

from realbench.dataflow import CallKind
from realbench.dataflow.lengths import LengthDistribution
from realbench.engines import listing
from realbench.engines.areal_packer import StepRows
from realbench.engines.documents import (expert_layout_problem, job_documents, lora_problem, model_of_path,
                                         refuse_offload, served_context, serving_gap, whole_alpha, whole_row_budget)
from realbench.engines.listing import PlanTable, group_sizes, served_shares, the_jobs_share
from realbench.engines.openrlhf import _disjoint, _even, place
from realbench.engines.verl import _ceil, _nest, _rounds, _splits
from realbench.errors import ConfigError
from realbench.models import FunctionSpec
from realbench.plan.mesh import Option, Strategy
from realbench.plan.options import divisors, expert_layouts, sequence_parallel_problem, served_call
from realbench.plan.plan import plan_from_document, resolve_plan
from realbench.plan.scenario import Scenario
from realbench.schema import load_yaml, read_document

VERSION = "1.0.4"
TABLE = Path(__file__).with_name(f"areal-{VERSION}.json")
# the user's train script (AReaL's examples/math/gsm8k_rl.py, say) reads the YAML: single controller
ENTRY = 'python3 "${AREAL_TRAIN_SCRIPT:-train.py}" --config'
REWARD = f"{Path(__file__).with_name('areal_reward.py')}:workflow_reward"
MODEL_PATHS = {"actor": "actor.path", "ref": "ref.path", "critic": "critic.path"}
TRAINERS = ("fsdp", "megatron")
SERVERS = ("sglang", "vllm")
SERVER_SLOTS = {"sglang": "sglang.max_running_requests", "vllm": "vllm.max_num_seqs"}
SERVER_MODEL = {"sglang": "sglang.model_path", "vllm": "vllm.model"}  # the weights each server loads first
# the share of each GPU's memory a server takes (api/cli_args.py: SGLangConfig.mem_fraction_static,
# vLLMConfig.gpu_memory_utilization, both 0.9): the generation call's memory_fraction, AReaL's default
# where a scenario gives none
SERVER_MEMORY = {"sglang": "sglang.mem_fraction_static", "vllm": "vllm.gpu_memory_utilization"}
# the context a request to the servers may take (api/cli_args.py: SGLangConfig.context_length,
# vLLMConfig.max_model_len, both 32768; None: the checkpoint's positions), on each server's command
# line: both servers refuse one beyond the checkpoint's positions, and vLLM starts only where its KV
# cache holds one request of it (the generation call's max_model_len); SGLang starts with less
SERVER_CONTEXT = {"sglang": "sglang.context_length", "vllm": "vllm.max_model_len"}
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
OLD_LOGPROBS_KEYS = ("actor.recompute_logprob", "actor.use_decoupled_loss", "actor.prox_logp_method")

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
            # the servers' side of the actor's LoRA (what the adapters need there, not a cost of their own)
            "rollout.use_lora", "sglang.enable_lora", "sglang.max_lora_rank", "vllm.enable_lora", "vllm.max_lora_rank",
            "gconfig.lora_name")
           + tuple(f"{role}.{k}" for role in ("actor", "ref", "critic") for k in _ENGINE_NEUTRAL))
# the NEUTRAL settings realbench reads into the scenario and writes from it (engines.carried_problem)
CAPTURED = tuple(MODEL_PATHS.values())
REQUIRED: dict[str, str] = {}  # (carried settings no plan needs otherwise)
# the sections of roles AReaL builds only where the job runs them (the reference: with a KL term)
ROLE_SECTIONS = {"ref": "ref_inf", "critic": "critic_train"}
# the actor's LoRA (api/cli_args.py:1167-1182, engine/fsdp_engine.py:1089-1100: no target modules is
# all-linear), PEFT's name -> AReaL's; its update sends the servers the adapters alone
# (engine/fsdp_engine.py:1598-1604), its reference is an engine of its own (trainer/rl_trainer.py:179-181)
LORA_KEYS = {"r": "actor.lora_rank", "lora_alpha": "actor.lora_alpha", "target_modules": "actor.target_modules"}
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


@lru_cache(maxsize=1)
def _table() -> dict:
    return json.loads(TABLE.read_text())


def known_keys(engine: str = "fsdp") -> set[str]:
    """The settings of AReaL's experiment config (PPOConfig)."""
    return set(defaults())


def defaults() -> dict[str, Any]:
    """AReaL's PPOConfig, flat: dotted key -> default (interpolations unresolved, MISSING "???")."""
    return _table()["keys"]


def _sections() -> list[str]:
    """The settings that are None unless given (ref, critic, actor.reward_norm, ...)."""
    return _table()["sections"]


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node and not (prefix and set(node) <= {"_target_"}):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def _unknown(key: str, source: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(defaults()), n=1, cutoff=0.8)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"AReaL {VERSION}'s PPOConfig has no such setting{hint}", key, source)


def _interpolation(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("${") and value.endswith("}")


def read_config(path: str | Path, overrides: list[str] = ()) -> tuple[str, dict[str, Any], set[str]]:
    """(the actor's backend, every setting resolved as AReaL's loader resolves it, the keys given
    and changed from AReaL's default) of an experiment YAML and Hydra-style overrides
    (`key=value`, `+key=value`)."""
    source = str(path)
    doc = read_document(path, schema=False)
    if "defaults" in doc:
        raise ConfigError("realbench reads a whole experiment YAML; a Hydra defaults list is not read", "defaults",
                          source)
    given = _flatten(doc)
    for o in overrides:
        key, eq, raw = o.partition("=")
        key = key.removeprefix("++").removeprefix("+")
        if not eq or not key or key.startswith("~"):
            raise ConfigError("an override is key=value (or +key=value)", o, "overrides")
        value = load_yaml(raw) if raw else None
        given.update(_flatten(value, f"{key}.") if isinstance(value, dict) else {key: value})
    table, sections = defaults(), _sections()
    for key in given:  # (a section is given whole as None or an interpolation: critic.optimizer: ${actor.optimizer})
        if key not in table and not (key in sections and (given[key] is None or _interpolation(given[key]))):
            raise _unknown(key, source)
    return str(given.get("actor.backend", "")).split(":")[0], resolve(given), \
        {k for k, v in given.items() if v != table.get(k)}


def resolve(given: dict[str, Any]) -> dict[str, Any]:
    """AReaL's settings with `given` (flat) over its defaults, interpolations resolved (OmegaConf,
    as AReaL resolves them): a section that is None by default (ref, critic, ...) only where a key
    under it is given."""
    from omegaconf import OmegaConf

    sections = _sections()
    named = {s for s in sections if any(k.startswith(s + ".") for k in given)}
    absent = [s for s in sections if s not in named]
    base = {k: v for k, v in defaults().items() if not any(k.startswith(s + ".") for s in absent)}
    given = {k: v for k, v in given.items() if k not in sections or _interpolation(v)}
    merged = OmegaConf.create(_nest({**base, **given}))
    flat = _flatten(OmegaConf.to_container(merged, resolve=True))
    return flat


def refuse_unpriced(settings: dict[str, Any], given: set[str], source: str) -> None:
    for key in sorted(given):
        if key in READ or key.startswith(NEUTRAL):
            continue
        raise ConfigError(f"{settings.get(key)!r} (AReaL's default {defaults().get(key)!r}) changes what AReaL runs, "
                          "and realbench does not price it", key, source)


# -- allocations ----------------------------------------------------------------------------------
_ALLOCATION = re.compile(r"(?P<backend>[a-z]+)(\[[A-Za-z_][A-Za-z0-9_]*\])?:(?P<dims>(?:[a-z][1-9][0-9]*)+)")
# the attention/FFN form of a mixture of experts (api/alloc_mode.py:594-637: hybrid_moe_syntax, its
# parentheses each optional): attention c, d, t, p; FFN d (the experts' data parallelism), e, t (the
# experts' tensor parallelism), p (the attention's, or the same)
_HYBRID = re.compile(r"(?P<backend>[a-z]+):\(?attn:(?P<attn>(?:[a-z][1-9][0-9]*)+)"
                     r"\|ffn:(?P<ffn>(?:[a-z][1-9][0-9]*)+)\)?")


def _dims(text: Any, dims: str, letters: str, what: str, key: str, source: str) -> dict[str, int]:
    """A section's dimensions (a letter left out is absent, the last repeat wins: api/alloc_mode.py:797-804)."""
    out: dict[str, int] = {}
    for letter, number in re.findall(r"([a-z])([0-9]+)", dims):
        if letter not in letters:
            raise ConfigError(f"{text!r}: {letter!r} is not a dimension of {what} ({', '.join(letters)}; "
                              "api/alloc_mode.py:594-638)", key, source)
        out[letter] = int(number)
    return out


def allocation(text: Any, key: str, source: str, servers: bool) -> dict[str, Any]:
    """A `backend` string as AReaL's grammar reads it (api/alloc_mode.py:594-638, 797-804):
    {"backend", "d", "t", "p", "c", "e", "etp", "hybrid"}: e the experts' parallelism and etp their
    tensor parallelism (a mixture of experts' routed experts: Megatron's expert_model_parallel_size
    and expert_tensor_parallel_size), in the flat form (`megatron:d4t2e2`) e folded into the world
    (d x c x t x p) and etp 1 (ParallelStrategy's default: each expert whole), in the attention/FFN
    form (`megatron:(attn:d4p4t2|ffn:d2p4e4)`) the FFN's e and t, its d the experts' data parallelism
    (derived where left out), its world the attention's (:940-1040); what realbench does not
    price refused by name."""
    s = re.sub(r"\s+", "", str(text or ""))
    hybrid = _HYBRID.fullmatch(s) if not servers else None
    if hybrid:
        backend = hybrid["backend"]
        if backend != "megatron":
            raise ConfigError(f"{text!r}: realbench reads the attention/FFN (MoE) form for Megatron, whose parallel "
                              "folding lays the experts out so (api/alloc_mode.py:943-1040)", key, source)
        attn = {"d": 1, "t": 1, "p": 1, "c": 1, **_dims(text, hybrid["attn"], "cdtp", "an attention section", key,
                                                         source)}
        ffn = _dims(text, hybrid["ffn"], "detp", "an FFN section", key, source)
        if ffn.get("p", attn["p"]) != attn["p"]:
            raise ConfigError(f"{text!r}: the FFN's pipeline must be the attention's (p{attn['p']}; "
                              "api/alloc_mode.py:982-990)", key, source)
        world_ = attn["d"] * attn["t"] * attn["p"] * attn["c"]
        e, etp = ffn.get("e", 1), ffn.get("t", 1)
        if "d" not in ffn and world_ % (e * etp * attn["p"]):
            raise ConfigError(f"{text!r}: the experts' data parallelism is derived from the attention's world "
                              f"({world_}), which e x t x p = {e * etp * attn['p']} does not divide "
                              "(api/alloc_mode.py:1002-1014)", key, source)
        if ffn.get("d", world_ // (e * etp * attn["p"])) * e * etp * attn["p"] != world_:
            raise ConfigError(f"{text!r}: the FFN's world (d x p x t x e) must be the attention's ({world_}; "
                              "api/alloc_mode.py:1016-1031)", key, source)
        return {"backend": backend, **attn, "e": e, "etp": etp, "hybrid": True}
    if "(" in s or "attn:" in s or "ffn:" in s:
        raise ConfigError(f"{text!r} is not an allocation AReaL parses (a training backend's attention/FFN form: "
                          "megatron:(attn:d4p4t2|ffn:d2p4e4); api/alloc_mode.py:594-638)", key, source)
    m = _ALLOCATION.fullmatch(s)
    if not m:
        raise ConfigError(f"{text!r} is not an allocation AReaL parses (BACKEND:d..t..p.., e.g. "
                          f"{'sglang:d4t2' if servers else 'fsdp:d8'}; api/alloc_mode.py:594-638)", key, source)
    backend = m["backend"]
    kinds = SERVERS if servers else TRAINERS
    if backend not in kinds:
        extra = " (archon: AReaL's experimental torchtitan engine is not priced)" if backend == "archon" else ""
        raise ConfigError(f"{backend!r}: realbench prices {' and '.join(kinds)} here{extra}", key, source)
    dims = {"d": 1, "t": 1, "p": 1, "c": 1, "e": 1,
            **_dims(text, m["dims"], "dtp" if servers else "dtpce", f"a {backend} allocation", key, source)}
    if backend == "fsdp" and (dims["p"] > 1 or dims["e"] > 1):
        raise ConfigError(f"{text!r}: FSDP has no pipeline or expert parallelism (api/alloc_mode.py:274-283)", key,
                          source)
    if dims["c"] > 1 and dims["t"] > 1 and backend == "fsdp":
        raise ConfigError(f"{text!r}: realbench prices FSDP's context parallelism (Ulysses groups) without tensor "
                          "parallelism (t1)", key, source)
    world_ = dims["d"] * dims["c"] * dims["t"] * dims["p"]
    if dims["e"] > 1 and world_ % (dims["p"] * dims["e"]):  # (ParallelStrategy.__post_init__, etp 1)
        raise ConfigError(f"{text!r}: expert model parallel size p x e = {dims['p'] * dims['e']} does not divide the "
                          f"world {world_} (api/alloc_mode.py:93-108)", key, source)
    return {"backend": backend, **dims, "etp": 1, "hybrid": False}


def allocation_string(backend: str, dp: int, tp: int, pp: int, cp: int = 1, ep: int = 1, etp: int = 0,
                      experts: bool = False) -> str:
    """An allocation AReaL parses back to the layout (allocation): a model `experts` Megatron lays
    out with each expert whole (etp 1) in the flat form (its e the experts' parallelism), other
    expert layouts (etp tp's, 0, or another) in the attention/FFN form."""
    attn = f"d{dp}" + (f"p{pp}" if pp > 1 else "") + (f"t{tp}" if tp > 1 else "") + (f"c{cp}" if cp > 1 else "")
    width = etp or tp
    if not experts or width == 1:
        return f"{backend}:{attn}" + (f"e{ep}" if ep > 1 else "")
    ffn = f"d{dp * cp * tp // (ep * width)}" + (f"p{pp}" if pp > 1 else "") + f"t{width}" + (f"e{ep}" if ep > 1 else "")
    return f"{backend}:(attn:{attn}|ffn:{ffn})"


def world(a: dict[str, Any]) -> int:
    """The GPUs of an allocation: d x c x t x p (api/alloc_mode.py:150-158)."""
    return a["d"] * a["c"] * a["t"] * a["p"]


# -- a configuration as a scenario and a plan ---------------------------------------------------------
def _micro_batches(step: StepRows, rows: int, ranks: int, n_mbs: Optional[int], budget: Optional[int],
                   pp: int) -> int:
    """A GPU's micro-batches of a call of `rows` a GPU on `ranks` data-parallel ranks as AReaL's
    packer forms them (realbench.engines.areal_packer) under an mb_spec: at least n_mbs, within
    max_tokens_per_mb (unset: no budget, utils/data.py:711-714), a Megatron pipeline at least 2 pp
    and a multiple of pp; on average over the steps drawn, the nearest whole count, as the fewest
    even splits of the rows at least as many (realbench's plans split a GPU's rows evenly)."""
    m = max(1, round(step.micro_batches(rows, ranks, int(n_mbs or 1), None if budget is None else int(budget), pp)))
    return _splits(rows, m, pp) or rows


# A mixture of experts (an allocation's e, or its attention/FFN form): Megatron's parallel folding,
# mpu.initialize_model_parallel with the allocation's expert_parallel_size and
# expert_tensor_parallel_size (engine/megatron_engine.py:230-242), in realbench terms a train or
# inference call's ep and etp (0: tp's); the flat form's etp is 1 (each expert whole), so a flat
# Megatron allocation with t > 1 holds a mixture of experts' experts whole on every GPU of a tp group.
# AReaL's FSDP has no expert parallelism (api/alloc_mode.py:274-283) and splits only the attention by
# tensor parallelism in a mixture of experts (apply_non_moe_tp, engine/fsdp_utils/parallel.py:
# 219-300): each expert whole on every tp rank, which realbench does not price under FSDP's
# sharding (refused: t1, or Megatron). The servers split a mixture of experts' experts as tp splits
# them (SGLang's and vLLM's default; sglang.ep_size is not read).
def _experts(role: str, a: dict[str, Any], model, call: dict[str, Any], trained: bool, text: Any, source: str
             ) -> dict[str, int]:
    """A role's (ep, etp) as the plan's call carries them (`call`: its dp, tp, pp, zero, sp, ring), from
    its allocation `a` and its `model` (None where not known here); refused by name where the model
    has no experts to lay out, or AReaL runs them otherwise than realbench prices."""
    key, megatron = f"{role}.backend", a["backend"] == "megatron"
    moe = None if model is None else model.moe is not None
    if moe is False and (a["e"] > 1 or a["hybrid"]):
        raise ConfigError(f"{text!r}: the MoE allocation (e, or the attention/FFN form) lays out a mixture of experts' "
                          f"routed experts; the {role}'s model ({model.name}) has none", key, source)
    if moe and not megatron and a["t"] > 1:
        raise ConfigError(f"{text!r}: AReaL's FSDP splits only the attention of a mixture of experts by tensor "
                          "parallelism, each expert whole on every tp rank (apply_non_moe_tp, engine/fsdp_utils/"
                          "parallel.py:219-300), which realbench does not price under FSDP's sharding: t1, or Megatron",
                          key, source)
    if not megatron or moe is False or (moe is None and a["e"] == 1 and not a["hybrid"]):
        return {}
    ep, etp = a["e"], 0 if a["etp"] == a["t"] else a["etp"]
    problem = expert_layout_problem(model, CallKind.TRAIN if trained else CallKind.INFERENCE, Strategy(
        call["dp"], a["t"], a["p"], zero=call.get("zero", 0), sp=call.get("sp", 1), ring=call.get("ring", ""), ep=ep,
        etp=etp))
    if problem:
        raise ConfigError(f"{text!r}: {problem[1]}", key, source)
    return {**({"ep": ep} if ep > 1 else {}), **({"etp": etp} if etp else {})}


def to_plan(engine: str, s: dict[str, Any], given: set[str], name: str, device: str, source: str = "",
            gpus_per_node: Optional[int] = None, lengths: Optional[LengthDistribution] = None,
            models: Optional[dict[str, Any]] = None) -> tuple[dict, dict]:
    """(scenario document, plan document) of AReaL's resolved settings `s` and the keys changed.
    `lengths`: the responses' lengths AReaL's packer sees (default: every response at its cap).
    `models`: the specs of the roles' models where known (else read from the checkpoints named:
    documents.model_of_path), for their experts' layouts (_experts)."""
    refuse_unpriced(s, given, source)
    known = dict(models or {})

    def model(role: str):  # (a model's spec, read once; None where there is none to read here)
        if role not in known:
            known[role] = model_of_path(s.get(MODEL_PATHS[role]))
        return known[role]

    for key in ("actor.backend", "rollout.backend"):
        if s.get(key) in (None, "???"):
            raise ConfigError("is not set: AReaL needs each engine's allocation (api/cli_args.py:1203-1209)", key,
                              source)
    G = int(s["cluster.n_gpus_per_node"])
    actor = allocation(s["actor.backend"], "actor.backend", source, servers=False)
    server = allocation(s["rollout.backend"], "rollout.backend", source, servers=True)
    spec = s["actor.scheduling_spec"]
    if not (isinstance(spec, list) and spec and isinstance(spec[0], dict) and spec[0].get("gpu") == 1):
        raise ConfigError("realbench prices one GPU a worker process: scheduling_spec's first entry gpu: 1 (as AReaL's "
                          "examples; the default 0 asks for none)", "actor.scheduling_spec", source)
    critic = "critic.backend" in s
    with_ref = "ref.backend" in s and float(s["actor.kl_ctl"]) > 0  # rl_trainer.py:179-181
    roles = ["actor"] + (["critic"] if critic else []) + (["ref"] if with_ref else [])
    strategies = {"actor": actor}
    for role in roles[1:]:
        if s[f"{role}.scheduling_strategy.type"] != "colocation" or s[f"{role}.scheduling_strategy.target"] != "actor":
            raise ConfigError(f"the {role} on GPUs of its own: AReaL runs the trainer's calls one after another "
                              "(rl_trainer.py:622-751), which realbench prices as concurrent on separate GPUs; "
                              "colocate it with the actor (scheduling_strategy: {type: colocation, target: actor})",
                              f"{role}.scheduling_strategy.type", source)
        strategies[role] = allocation(s[f"{role}.backend"], f"{role}.backend", source, servers=False)
        if world(strategies[role]) != world(actor):
            raise ConfigError(f"{s[f'{role}.backend']!r}: a role colocated with the actor has its world size "
                              f"({world(actor)}; infra/scheduler/local.py:680-699)", f"{role}.backend", source)
    if critic and int(s["critic.ppo_n_minibatches"]) != int(s["actor.ppo_n_minibatches"]):
        raise ConfigError(f"{s['critic.ppo_n_minibatches']}: realbench's critic takes the actor's optimizer steps "
                          f"(actor.ppo_n_minibatches {s['actor.ppo_n_minibatches']})", "critic.ppo_n_minibatches",
                          source)
    W_a = world(actor)
    if server["p"] > 1:
        raise ConfigError(f"{s['rollout.backend']!r}: realbench prices a server's continuous batching without a "
                          "pipeline (p1)", "rollout.backend", source)
    instance = server["t"] * server["p"]
    if instance > G:
        raise ConfigError(f"{s['rollout.backend']!r}: a server of {instance} GPUs spans nodes of {G}; AReaL's single "
                          "controller starts each on one node (cli_args.py:1949)", "rollout.backend", source)
    meshes, nodes = place([("actor", W_a), ("rollout", server["d"] * instance)], G)
    if "cluster.n_nodes" in given and nodes > int(s["cluster.n_nodes"]):
        raise ConfigError(f"{s['cluster.n_nodes']}: the actor's {W_a} and the rollout's {server['d'] * instance} GPUs "
                          f"need {nodes} nodes of {G}", "cluster.n_nodes", source)

    n = int(s["gconfig.n_samples"])
    critic_alg = "ppo" if critic else ("rloo" if s.get("actor.reward_norm.mean_leave1out") else "grpo")
    if critic_alg != "ppo" and n < 2:
        raise ConfigError(f"{n}: {critic_alg.upper()} compares a prompt's samples: 2 or more", "gconfig.n_samples",
                          source)
    max_new, max_tokens = int(s["gconfig.max_new_tokens"]), int(s["gconfig.max_tokens"])
    if not s["train_dataset.max_length"] and max_tokens - max_new < 1:
        raise ConfigError(f"is not set and gconfig.max_tokens ({max_tokens}) leaves no room for prompts beside "
                          f"max_new_tokens ({max_new}): realbench prices prompts at their cap; set it",
                          "train_dataset.max_length", source)
    prompt_len = int(s["train_dataset.max_length"] or max_tokens - max_new)
    gen_len = min(max_new, max_tokens - prompt_len)  # remote_inf_engine.py:810-821
    if gen_len < 1:
        raise ConfigError(f"{max_tokens} leaves no room for responses after prompts of train_dataset.max_length "
                          f"{prompt_len}", "gconfig.max_tokens", source)
    L = prompt_len + gen_len
    step = StepRows(prompt_len, gen_len, lengths)
    prompts = int(s["train_dataset.batch_size"])
    rows = prompts * n
    steps = int(s["actor.ppo_n_minibatches"])
    _even(rows, steps, "samples a step", "actor.ppo_n_minibatches", source)

    def strategy(role: str, rows_per_call: int, trained: bool, budget: Optional[int] = None) -> dict:
        a = strategies[role]
        dp = a["d"]
        if prompts % dp:
            raise ConfigError(f"{prompts} prompt groups do not split evenly over {dp} data-parallel ranks "
                              "(utils/seqpack.py:558-562)", "train_dataset.batch_size", source)
        per_rank = _even(rows_per_call, dp, "samples", f"{role}.backend", source)  # (a GPU's, or a group's)
        megatron = a["backend"] == "megatron"
        out = {"mesh": meshes["actor"], "dp": dp, "tp": a["t"], "pp": a["p"],
               "micro_batches": _micro_batches(step, per_rank, dp, s.get(f"{role}.mb_spec.n_mbs"),
                                               whole_row_budget(s.get(f"{role}.mb_spec.max_tokens_per_mb"), L,
                                                                f"{role}.mb_spec.max_tokens_per_mb", source,
                                                                "AReaL's packer refuses a longer sequence "
                                                                "(utils/seqpack.py:234-242)"), a["p"]),
               # (a forward keeps no activations for a backward: nothing to checkpoint)
               "activation_checkpointing": trained and bool(s.get(f"{role}.gradient_checkpointing")),
               "virtual_stages": int(s.get(f"{role}.megatron.virtual_pipeline_parallel_size") or 1) if megatron else 1}
        if megatron and out["virtual_stages"] > 1 and a["p"] == 1:
            raise ConfigError("needs a pipeline (p > 1 in the backend; api/alloc_mode.py:231-239)",
                              f"{role}.megatron.virtual_pipeline_parallel_size", source)
        if megatron:
            out["zero"] = int(bool(s.get(f"{role}.megatron.ddp.use_distributed_optimizer", True))) if trained else 0
        else:
            out["zero"] = 3
        if a["c"] > 1:  # each of the d ranks' micro-batches split over c GPUs: FSDP's Ulysses groups,
            # Megatron's context-parallel rings (Transformer Engine's p2p ring, Megatron's default)
            out["sp"] = a["c"]
            if megatron:
                out["ring"] = "p2p"
        # memory: the largest micro-batch of the plan's count, the budget realbench writes (_engine_settings),
        # or another call's (`budget`: the critic's values pack under its training's); a GPU's share
        # of a group's (fsdp_engine.py:1915-1948 pads the packed micro-batch to a multiple of c and
        # slices it; megatron_engine.py:2060-2064, "max_tokens_per_mb / cp_size" a GPU)
        out["max_tokens"] = budget or _ceil(step.budget(per_rank, dp, out["micro_batches"]), a["c"])
        out.update(_experts(role, a, model(role), out, trained, s[f"{role}.backend"], source))
        return out

    calls: dict[str, dict] = {"actor_train": strategy("actor", rows // steps, True)}
    if with_ref:
        calls["ref_inf"] = strategy("ref", rows, False)
    if critic:
        calls["critic_train"] = strategy("critic", rows // steps, True)
        calls["critic_inf"] = strategy("critic", rows, False, budget=calls["critic_train"]["max_tokens"])
    # each server decodes the sequences in flight on it at once, up to its own limit
    per_server = _even(rows, server["d"], "samples", "rollout.backend", source)
    in_flight = int(s["rollout.max_concurrent_rollouts"] or prompts) * n
    limit = s[SERVER_SLOTS[server["backend"]]]
    slots = min(math.ceil(in_flight / server["d"]), int(limit) if limit else per_server)
    calls["actor_gen"] = {"mesh": meshes["rollout"], "dp": server["d"], "tp": server["t"], "pp": server["p"],
                          "micro_batches": _rounds(per_server, slots)}
    calls["reward_inf"] = {"mesh": meshes["rollout"], "dp": meshes["rollout"].size, "tp": 1, "pp": 1,
                           "micro_batches": 1}
    for c in calls.values():
        c["mesh"] = c["mesh"].label(G)
    actor_path = s["actor.path"]
    models: dict[str, Any] = {"actor": {"path": actor_path}}
    if with_ref:
        models["ref"] = {"path": s["ref.path"]}
    if critic:
        models["critic"] = {"path": s["critic.path"], "value_head": True}
    models["reward"] = {"function": REWARD}
    if s["actor.use_lora"]:
        if s["actor.peft_type"] != "lora":
            raise ConfigError(f"{s['actor.peft_type']!r}: realbench trains LoRA adapters", "actor.peft_type", source)
        targets = list(s[LORA_KEYS["target_modules"]] or [])
        models["actor"]["lora"] = {"r": s[LORA_KEYS["r"]], "lora_alpha": s[LORA_KEYS["lora_alpha"]],
                                   "target_modules": "all-linear" if targets in ([], ["all-linear"]) else targets}
    context = _server_context(s, server["backend"], L, source)  # (SGLang's refused too where too long or short)
    scenario, plan = job_documents(
        "areal", name, f"read from the AReaL {VERSION} experiment {Path(source).name}",
        f"AReaL {VERSION} experiment", algorithm=critic_alg, models=models, prompts=prompts, prompt_len=prompt_len,
        gen_len=gen_len, steps=steps, group_size=n, cluster={"nodes": nodes, "gpus_per_node": G, "device": device},
        epochs=1, calls=calls, max_staleness=int(s["rollout.max_head_offpolicyness"]), with_ref=with_ref,
        old_logprobs=_old_logprobs(s, source), rollout_server=server["backend"], padding_free=PADDING_FREE,
        memory_fraction=_memory_fraction(s, server["backend"], source),
        max_model_len=context if server["backend"] == "vllm" else None)
    return scenario, plan


def _server_context(s: dict[str, Any], server: str, length: int, source: str) -> Optional[int]:
    """The context the rollout's servers take (SERVER_CONTEXT: documents.served_context)."""
    key = SERVER_CONTEXT[server]
    return served_context(s[key], s["actor.path"], length, key, source,
                          beyond=f"{'vLLM' if server == 'vllm' else 'SGLang'} refuses before it starts",
                          cut="AReaL's requests of a prompt and its response would outrun the server's context "
                              "(remote_inf_engine.py:810-821 asks for the full response)")


def _memory_fraction(s: dict[str, Any], server: str, source: str) -> float:
    """The share of each GPU's memory the rollout's servers take (SERVER_MEMORY)."""
    key = SERVER_MEMORY[server]
    if s[key] is None:  # (SGLang then picks its own by the GPU's memory)
        raise ConfigError("is not set: SGLang then chooses its own share of the GPU's memory, which realbench needs to "
                          "price the servers' KV cache (give a number)", key, source)
    return float(s[key])


def _old_logprobs(s: dict[str, Any], source: str) -> str:
    """Where AReaL's actor takes the old (or, decoupled, proximal) log-probabilities from: a forward
    over the whole batch (recompute_logprob, or the decoupled loss recomputing), or the rollout's."""
    if not s["actor.use_decoupled_loss"]:
        return "whole_batch" if s["actor.recompute_logprob"] else "rollout"
    if s["actor.prox_logp_method"] == "loglinear":
        raise ConfigError("'loglinear': AReaL interpolates the proximal log-probabilities instead of a forward; "
                          "realbench runs no such approximation (recompute)", "actor.prox_logp_method", source)
    return "whole_batch"


# -- a plan as an experiment YAML ---------------------------------------------------------------------
def _server(scenario: Scenario) -> str:
    """The scenario's rollout server as AReaL writes it: as read, else SGLang (AReaL's examples')."""
    return scenario.rollout_server or "sglang"


def space_problem_of_scenario(scenario: Scenario) -> Optional[tuple[str, str]]:
    if scenario.algorithm not in ("ppo", "grpo", "rloo"):
        return "scenario.algorithm", f"realbench writes AReaL's PPO, GRPO and RLOO, not {scenario.algorithm}"
    if not isinstance(scenario.models.get("reward"), FunctionSpec):
        return "models.reward", ("AReaL scores with a Python function in its rollout workflow (workflow/rlvr.py:95-108); "
                                 "its trainer runs no reward model")
    if scenario.training.num_iterations != 1:
        return "training.num_iterations", "AReaL passes over a batch once (actor.ppo_n_minibatches optimizer steps)"
    problem = lora_problem(scenario, "AReaL")
    given = "padding_free" in scenario.training.model_fields_set  # (a job made for AReaL packs: priced_as)
    if problem is None and scenario.engine == "areal" and given and not scenario.training.padding_free:
        return "training.padding_free", "AReaL packs the rows by their real lengths, always (utils/data.py:696-760)"
    return problem


def _backend(name: str, s: Strategy, trained: bool) -> str:
    """FSDP (every shard: zero 3, or one replica) or Megatron (a pipeline, or the optimizer states
    sharded at most: zero 0 or 1) for a call's strategy."""
    if s.ring != "p2p" and s.pp == 1 and s.ep == 1 and not s.etp and (s.zero == 3 or s.shards == 1):
        return "fsdp"
    if s.zero in (0, 1) and (trained or s.zero == 0):
        return "megatron"
    raise ConfigError(f"zero {s.zero}: AReaL's FSDP shards everything (zero 3) and Megatron's distributed optimizer the "
                      "optimizer states (zero 1); its forward-only Megatron models shard nothing", f"calls.{name}.zero")


def _same_budget(name: str, s: Strategy, budget: int) -> None:
    """A plan's token budget for a call (a GPU's) is the one realbench writes for its count (a
    data-parallel rank's: a Ulysses group's, sp GPUs, to_plan), or unset."""
    if s.max_tokens not in (None, _ceil(budget, s.sp)):
        group = f", {_ceil(budget, s.sp)} a GPU of a group of {s.sp} splitting sequences" if s.sp > 1 else ""
        raise ConfigError(f"{s.max_tokens}: AReaL runs the plan's {s.micro_batches} micro-batches on every step drawn "
                          f"under the budget realbench writes, the largest group its packer forms ({budget} tokens"
                          f"{group}; realbench.engines.areal_packer)", f"calls.{name}.max_tokens")


def _engine_settings(role: str, name: str, s: Strategy, trained: bool, rows: int, step: StepRows,
                     experts: bool = False) -> dict[str, Any]:
    """An engine's settings for a call of `rows` samples a GPU (an optimizer step's, or the whole
    batch's) as AReaL's packer sees them (`step`): its allocation and its micro-batches,
    the plan's count (n_mbs) within a budget under which AReaL's packer forms that many on every
    step drawn (areal_packer.budget_for), at least a whole row (AReaL's packer refuses a longer
    sequence, utils/seqpack.py:234-242)."""
    backend = _backend(name, s, trained)
    if s.shard_group:
        raise ConfigError(f"{s.shard_group}: AReaL's FSDP shards a model over its allocation's data-parallel GPUs "
                          "(an allocation names no hybrid shard group)", f"calls.{name}.shard_group")
    if s.ring == "allgather" or (s.sp > 1 and (s.ring == "p2p") != (backend == "megatron")):
        raise ConfigError("AReaL's context parallelism (an allocation's c) is Ulysses' head exchanges under FSDP and "
                          "Megatron's p2p ring under Megatron (ring: p2p), not ring attention's all-gathers (OpenRLHF's)",
                          f"calls.{name}.ring")
    if s.sp > 1 and backend == "fsdp" and s.tp > 1:
        raise ConfigError(f"{s.sp}: AReaL splits sequences (an allocation's c) under FSDP without tensor parallelism "
                          "as realbench prices it", f"calls.{name}.sp")
    if backend == "megatron" and s.pp > 1 and (s.micro_batches < 2 * s.pp or s.micro_batches % s.pp):
        raise ConfigError(f"{s.micro_batches}: AReaL's Megatron pipeline runs at least 2 x pp micro-batches, a multiple "
                          "of pp (megatron_engine.py:2054-2070)", f"calls.{name}.micro_batches")
    if s.virtual_stages > 1 and backend != "megatron":
        raise ConfigError("virtual stages are Megatron's (megatron.virtual_pipeline_parallel_size)",
                          f"calls.{name}.virtual_stages")
    if backend == "fsdp" and experts and s.tp > 1:  # (_experts)
        raise ConfigError("AReaL's FSDP splits only the attention of a mixture of experts by tensor parallelism, each "
                          "expert whole on every tp rank (apply_non_moe_tp, engine/fsdp_utils/parallel.py:219-300), "
                          "which realbench does not price under FSDP's sharding: tp 1, or Megatron", f"calls.{name}.tp")
    budget = step.budget(rows, s.dp, s.micro_batches)
    _same_budget(name, s, budget)
    out = {f"{role}.backend": allocation_string(backend, s.dp, s.tp, s.pp, s.sp, s.ep, s.etp, experts),
           f"{role}.mb_spec.n_mbs": s.micro_batches,
           f"{role}.mb_spec.max_tokens_per_mb": budget, f"{role}.gradient_checkpointing": s.checkpointing}
    if backend == "megatron":
        out[f"{role}.megatron.virtual_pipeline_parallel_size"] = s.virtual_stages
        if trained:
            out[f"{role}.megatron.ddp.use_distributed_optimizer"] = s.zero == 1 or s.shards == 1
    return out


def _settings(scenario: Scenario, options: dict[str, Option]) -> dict[str, Any]:
    """AReaL's settings (flat key -> value) for a plan, or ConfigError naming the first part of
    it AReaL cannot run."""
    problem = space_problem_of_scenario(scenario)
    if problem:
        raise ConfigError(problem[1], problem[0])
    c, df = scenario.cluster, scenario.dataflow
    G = c.gpus_per_node
    A, V = options["actor_train"].mesh, options["actor_gen"].mesh
    gen, server = options["actor_gen"].strategy, _server(scenario)
    if not _disjoint([A, V], G):
        raise ConfigError("AReaL's rollout runs on GPUs of its own (colocated with the actor it needs disk weight "
                          "updates and offloading, which realbench does not price)", "calls.actor_gen.mesh")
    if gen.tp * gen.pp > G:
        raise ConfigError(f"a server of {gen.tp * gen.pp} GPUs spans nodes of {G}; AReaL's single controller starts "
                          "each on one node (cli_args.py:1949)", "calls.actor_gen.tp")
    if gen.ep > 1 or gen.etp:
        raise ConfigError("AReaL's servers split a mixture of experts' experts as tp splits them: an inference "
                          "allocation has no e (api/alloc_mode.py:594-638), and realbench does not write "
                          "sglang.ep_size",
                          "calls.actor_gen.ep")
    refuse_offload(options, "AReaL", "ref.fsdp.offload_params")
    reward = options["reward_inf"]
    if reward.mesh != V or reward.strategy != Strategy(V.size, 1, 1):
        raise ConfigError("AReaL scores in its rollout workers, on the rollout's GPUs' hosts", "calls.reward_inf.mesh")
    for name, o in options.items():
        if name not in ("actor_gen", "reward_inf") and o.mesh != A:
            raise ConfigError("AReaL's reference and critic are colocated with the actor (realbench prices its trainer's "
                              "calls, which run one after another, on the actor's GPUs)", f"calls.{name}.mesh")
        if name not in ("actor_gen", "reward_inf") and o.strategy.size != A.size:
            raise ConfigError(f"a role colocated with the actor has its world size ({A.size}; "
                              "infra/scheduler/local.py:680-699)", f"calls.{name}.dp")
    g = df.call("actor_gen")
    rows, n = g.seqs, g.group_size
    prompts = rows // n
    steps = df.call("actor_train").optimizer_steps
    out: dict[str, Any] = {"cluster.n_nodes": c.nodes, "cluster.n_gpus_per_node": G,
                           "train_dataset.batch_size": prompts, "train_dataset.max_length": g.prompt_len,
                           "gconfig.n_samples": n, "gconfig.max_new_tokens": g.gen_len,
                           "gconfig.max_tokens": g.prompt_len + g.gen_len, "actor.ppo_n_minibatches": steps,
                           "rollout.max_head_offpolicyness": df.max_staleness,
                           "rollout.backend": allocation_string(server, gen.dp, gen.tp, gen.pp),
                           # (the least AReaL runs the plan with: a sequence, where its default, 32768, could
                           # outrun the checkpoint's positions, or ask more of vLLM's cache than was priced)
                           SERVER_CONTEXT[server]: g.max_model_len or g.seq_len}
    step = StepRows(g.prompt_len, g.gen_len, df.call("actor_train").lengths)
    for name, role, trained in (("actor_train", "actor", True), ("ref_inf", "ref", False),
                                ("critic_train", "critic", True)):
        if name in options:
            s = options[name].strategy
            if prompts % s.dp:
                raise ConfigError(f"{prompts} prompt groups do not split evenly over {s.dp} data-parallel ranks "
                                  "(utils/seqpack.py:558-562)", f"calls.{name}.dp")
            out.update(_engine_settings(role, name, s, trained, (rows // steps if trained else rows) // s.dp, step,
                                        scenario.model_of(df.call(name)).moe is not None))
    if "critic_train" in options:
        out["critic.ppo_n_minibatches"] = steps
    if "critic_inf" in options:  # the critic's values: its training engine, micro-batches of its budget
        t, i = options["critic_train"].strategy, options["critic_inf"].strategy
        budget = out["critic.mb_spec.max_tokens_per_mb"]
        _same_budget("critic_inf", i, budget)
        want = Strategy(t.dp, t.tp, t.pp, _micro_batches(step, rows // t.dp, t.dp, out["critic.mb_spec.n_mbs"],
                                                         budget, t.pp),
                        False, t.virtual_stages,
                        3 if _backend("critic_train", t, True) == "fsdp" and t.shards > 1 else 0,
                        max_tokens=i.max_tokens, sp=t.sp, ring=t.ring, ep=t.ep, etp=t.etp)
        if i != want:  # (a forward checkpoints nothing: want's False is every forward's)
            raise ConfigError("AReaL's critic computes values with its training engine and micro-batch budget "
                              f"(critic.backend, critic.mb_spec): {want.label()}", "calls.critic_inf")
    if rows % gen.dp or (rows // gen.dp) % gen.micro_batches:
        raise ConfigError(f"{gen.micro_batches} batches do not split a server's share of {rows} samples evenly",
                          "calls.actor_gen.micro_batches")
    out[SERVER_SLOTS[server]] = rows // gen.dp // gen.micro_batches
    out[SERVER_MEMORY[server]] = served_call(g, gen).memory_fraction or MEMORY_FRACTION
    out["rollout.max_concurrent_rollouts"] = prompts
    if "ref_inf" in options:
        beta = scenario.training.beta_for(scenario.algorithm)
        out["actor.kl_ctl"] = beta if beta > 0 else defaults()["actor.kl_ctl"]  # (0 would build no reference)
    else:
        out["actor.kl_ctl"] = 0.0
    if scenario.algorithm != "ppo":
        out.update({"actor.reward_norm.mean_level": "group", "actor.reward_norm.group_size": n,
                    "actor.reward_norm.std_level": "group" if scenario.algorithm == "grpo" else None,
                    "actor.reward_norm.mean_leave1out": scenario.algorithm == "rloo"})
    lora = scenario.models["actor"].lora
    if lora is not None:  # the trainer's adapters, and the servers that load them
        out.update({"actor.use_lora": True, LORA_KEYS["r"]: lora.r, LORA_KEYS["lora_alpha"]: whole_alpha(lora, "AReaL"),
                    LORA_KEYS["target_modules"]: list(lora.target_modules), "rollout.use_lora": True,
                    f"{server}.enable_lora": True, f"{server}.max_lora_rank": lora.r})
        if out["actor.backend"].startswith("megatron"):  # its LoRA runs on Megatron Bridge (engine/megatron_engine.py:327-331)
            out["actor.megatron.bridge_type"] = "megatron-bridge"
    # the proximal log-probabilities of the decoupled objective of asynchronous RL, recomputed as
    # AReaL's examples do; or the rollout's, for which AReaL's plain objective is realbench's
    # decoupled one (proximal = behaviour: weight 1)
    recompute = scenario.training.old_logprobs != "rollout"  # (later_steps: the same numbers)
    out.update({"actor.use_decoupled_loss": bool(df.max_staleness) and recompute, "actor.recompute_logprob": recompute})
    return out


def space_problem(scenario: Scenario, options: dict[str, Option]) -> Optional[tuple[str, str]]:
    """(plan key, what AReaL cannot do) for the first part of a plan outside its space, or None."""
    return listing.problem_of(_settings, scenario, options)


_SCHEDULING_SPEC = [{"task_type": "worker", "port_count": 2, "gpu": 1, "mem": 32,
                     "cmd": "python3 -m areal.infra.rpc.rpc_server", "env_vars": {}}]
_NAMES = {"experiment_name": "${experiment_name}", "trial_name": "${trial_name}"}


def to_config(scenario: Scenario, options: dict[str, Option], model_paths: dict[str, str]) -> tuple[str, dict]:
    """(the actor's backend, AReaL's experiment as a nested document)."""
    flat = _settings(scenario, options)
    for role in ("actor", "critic"):
        if role in scenario.models and role not in model_paths:
            raise ConfigError(f"AReaL loads a checkpoint folder: give the {role}'s (--model-path {role}=DIR)",
                              f"models.{role}")
    doc = _nest(flat)
    logged = {**_NAMES, "fileroot": "${cluster.fileroot}"}
    doc.update({"experiment_name": scenario.name, "trial_name": "trial0", "tokenizer_path": "${actor.path}",
                "enable_offload": False, "scheduler": {"type": None},
                "saver": dict(logged), "recover": dict(logged), "evaluator": dict(logged),
                "stats_logger": dict(logged)})
    # the data set is the user's: AReaL's mandatory value (???) until the launch gives it
    doc["train_dataset"].update({"path": "???", "type": "rl"})
    doc["rollout"].update({**_NAMES, "consumer_batch_size": "${train_dataset.batch_size}",
                           "scheduling_spec": "${actor.scheduling_spec}", "fileroot": "${cluster.fileroot}",
                           "tokenizer_path": "${tokenizer_path}"})
    section, model = SERVER_MODEL[_server(scenario)].split(".")
    doc.setdefault(section, {}).update({model: "${actor.path}", "dtype": "${actor.dtype}"})
    doc["actor"].update({**_NAMES, "path": model_paths["actor"], "dtype": "bfloat16",
                         "scheduling_spec": _SCHEDULING_SPEC, "weight_update_mode": "xccl"})
    doc["actor"].setdefault("optimizer", {"type": "adam", "lr": 1.0e-6})
    colocated = {"scheduling_strategy": {"type": "colocation", "target": "actor"},
                 "scheduling_spec": "${actor.scheduling_spec}", **_NAMES}
    if "ref" in doc:
        doc["ref"].update({**colocated, "path": model_paths.get("ref", model_paths["actor"]), "optimizer": None,
                           "dtype": "${actor.dtype}"})
    if "critic" in doc:
        doc["critic"].update({**colocated, "path": model_paths["critic"], "dtype": "${actor.dtype}",
                              "optimizer": {"type": "adam", "lr": 1.0e-6}})
    return doc["actor"]["backend"].split(":")[0], doc


def launch_script(config: Path, nodes: int) -> str:
    scheduler = "local" if nodes == 1 else "ray"
    return ("#!/usr/bin/env bash\n"
            f"# AReaL {VERSION}: the plan realbench wrote (pip install areal=={VERSION}). Run it with your train script\n"
            "# (AREAL_TRAIN_SCRIPT, e.g. AReaL's examples/math/gsm8k_rl.py) and your data set:\n"
            f"#   AREAL_TRAIN_SCRIPT=gsm8k_rl.py bash {config.stem}-launch.sh train_dataset.path=openai/gsm8k\n"
            f'{ENTRY} "$(dirname "$0")/{config.name}" scheduler.type="${{AREAL_SCHEDULER:-{scheduler}}}" "$@"\n')


def config_files(config: Path, engine: str, settings: dict[str, Any],
                 node_size: Optional[int] = None) -> list[tuple[Path, str, int]]:
    """The experiment YAML (at `config`) and its launch script beside it (<stem>-launch.sh). (Its
    cluster section gives the node size: `node_size` is not written twice.)"""
    text = (f"# AReaL {VERSION} experiment: the plan realbench wrote (realbench export --format areal)\n"
            + yaml.safe_dump(settings, sort_keys=False))
    return [(config, text, 0o644),
            (config.with_name(f"{config.stem}-launch.sh"), launch_script(config, settings["cluster"]["n_nodes"]), 0o755)]


# -- AReaL's space, for a search ------------------------------------------------------------------------
def _trainer_strategies(scenario: Scenario, size: int, calls: list[str]
                        ) -> Iterator[tuple[str, int, int, int, int, int, int]]:
    """(backend, dp, tp, pp, cp, ep, etp) of the actor (and the roles colocated with it, as AReaL's
    examples write them: `${actor.backend}`) running `calls` on `size` GPUs: FSDP dp x tp, or dp x cp
    (Ulysses groups inside a node, the heads split as sequence_parallel_problem checks them), Megatron
    dp x cp x tp x pp (its context-parallel rings of any size whose tp x cp GPUs divide a node or
    span whole ones, as sequence_parallel_problem checks them). A mixture of experts: FSDP without
    tensor parallelism (_experts), Megatron without a pipeline or rings too, each with the expert
    layouts Megatron's folding offers (options.expert_layouts: ep and etp, tp's or 1; (1, 0) for the
    rest)."""
    c, df = scenario.cluster, scenario.dataflow
    models = [scenario.model_of(df.call(n)) for n in calls]
    heads = lambda t: all(m.n_heads % t == 0 and m.n_kv_heads % t == 0 for m in models)  # noqa: E731
    splits = lambda groups: all(sequence_parallel_problem(df.call(n), m, c, groups) is None  # noqa: E731
                                for n, m in zip(calls, models))
    moe = next((m for m in models if m.moe is not None), None)

    def experts(dp: int, cp: int, tp: int) -> tuple[tuple[int, int], ...]:
        if moe is None:
            return ((1, 0),)
        return tuple((ep, 0 if etp == tp else etp)
                     for ep, etp in expert_layouts(df.call(calls[0]), moe, dp, cp, tp, True))

    for t in (t for t in divisors(c.gpus_per_node) if size % t == 0 and heads(t)):
        if moe is None or t == 1:
            yield "fsdp", size // t, t, 1, 1, 1, 0
        # Megatron with a pipeline or context-parallel rings (of any size its layout leaves; without
        # either, FSDP's layout, but for a mixture of experts, whose experts only Megatron folds)
        for p in (p for p in divisors(size // t) if all(m.n_layers % p == 0 for m in models)):
            for cp in (cp for cp in divisors(size // t // p) if p > 1 or cp > 1 or moe is not None):
                if cp == 1 or splits(Strategy(size // t // p // cp, t, p, zero=1, sp=cp, ring="p2p")):
                    for ep, etp in experts(size // t // p // cp, cp, t):
                        yield "megatron", size // t // p // cp, t, p, cp, ep, etp
    for cp in divisors(math.gcd(size, c.gpus_per_node))[1:]:
        if splits(Strategy(size // cp, 1, 1, zero=3, sp=cp)):
            yield "fsdp", size // cp, 1, 1, cp, 1, 0


def plan_table(scenario: Scenario) -> tuple[dict[str, list[Option]], list[tuple[int, ...]]]:
    """Every plan AReaL can run of a scenario on its whole cluster: the rollout's GPUs (the rest
    the actor's, the reference and critic colocated with it) x the trainer's backend and layout
    (`${actor.backend}` for the colocated roles, as AReaL's examples) x checkpointing x micro-batch
    counts x the servers' tensor parallel size, concurrent sequences and share of each GPU's memory
    (listing.served_shares); as per call the options
    used and per plan a row of their indices (in the order of the dict)."""
    problem = space_problem_of_scenario(scenario)
    if problem:
        raise ConfigError(problem[1], problem[0])
    c, df = scenario.cluster, scenario.dataflow
    N, G = c.n_devices, c.gpus_per_node
    gen = df.call("actor_gen")
    rows, prompts = gen.seqs, gen.seqs // gen.group_size
    steps = df.call("actor_train").optimizer_steps
    names = list(df.call_names)
    trainer_calls = [n for n in names if n not in ("actor_gen", "reward_inf")]
    listed = PlanTable(names)
    intern, options = listed.intern, listed.options

    actor_model = scenario.models["actor"]
    step = StepRows(gen.prompt_len, gen.gen_len, df.call("actor_train").lengths)
    for R in group_sizes(c):
        if R >= N:
            continue
        try:
            meshes, nodes = place([("actor", N - R), ("rollout", R)], G)
        except ConfigError:
            continue
        if nodes > c.nodes:
            continue
        A, V = meshes["actor"], meshes["rollout"]
        gens = []
        for t in (t for t in divisors(min(R, G)) if R % t == 0 and actor_model.n_heads % t == 0
                  and actor_model.n_kv_heads % t == 0):
            d = R // t
            if rows % d:
                continue
            share = rows // d
            # (each server at the least share of each GPU's memory that gives it each count of slots:
            # listing.served_shares)
            gens += [shared for m in divisors(share) if m == 1 or m & (m - 1) == 0
                     for shared in served_shares(scenario, Option(V, Strategy(d, t, 1, m)))]
        if not gens:
            continue
        scorer = intern("reward_inf", Option(V, Strategy(V.size, 1, 1)))
        gen_k = [intern("actor_gen", g) for g in gens]
        for backend, dp, tp, pp, cp, ep, etp in _trainer_strategies(scenario, A.size, trainer_calls):
            if prompts % dp or (rows // steps) % dp:
                continue
            per_step = rows // steps // dp
            micros = [m for m in divisors(per_step) if (m & (m - 1) == 0 or m == per_step)
                      and (pp == 1 or (m >= 2 * pp and m % pp == 0))]
            zero = 3 if backend == "fsdp" and dp * cp > 1 else 0
            ring = "p2p" if backend == "megatron" and cp > 1 else ""
            # (the layout's experts, for the calls of a model with experts)
            moe_layout = {name: {"ep": ep, "etp": etp} if scenario.model_of(df.call(name)).moe is not None else {}
                          for name in trainer_calls}
            trained_zero = 1 if backend == "megatron" and dp * cp > 1 else zero
            # a forward-only call: micro-batches of the training's size over the whole batch; the
            # critic's values, what AReaL's packer forms under the critic's training budget
            counts = {m: {name: m if df.call(name).kind.value == "train" else m * steps for name in trainer_calls}
                      for m in micros}
            # each call's budget, as _settings writes it: the training's for the critic's values (below)
            budgets = {m: {name: step.budget(per_step if df.call(name).kind.value == "train" else rows // dp, dp,
                                             counts[m][name]) for name in trainer_calls if name != "critic_inf"}
                       for m in micros}
            if "critic_inf" in trainer_calls:
                for m in micros:
                    budgets[m]["critic_inf"] = budgets[m]["critic_train"]
                    counts[m]["critic_inf"] = _micro_batches(step, rows // dp, dp, m, budgets[m]["critic_inf"], pp)
            # (a rank's budget is its Ulysses group's: a GPU's share, to_plan)
            budgets = {m: {name: _ceil(b, cp) for name, b in per_call.items()} for m, per_call in budgets.items()}
            for ckpt in (False, True):
                for m in micros:
                    row = {"reward_inf": scorer}
                    for name in trainer_calls:
                        trained = df.call(name).kind.value == "train"
                        count = counts[m][name]
                        row[name] = intern(name, Option(A, Strategy(dp, tp, pp, count, ckpt and trained, 1,
                                                                    trained_zero if trained else zero,
                                                                    max_tokens=budgets[m][name], sp=cp,
                                                                    ring=ring, **moe_layout[name])))
                    first = {n: options[n][row[n]] for n in row}
                    first["actor_gen"] = gens[0]
                    if space_problem(scenario, first) is not None:
                        continue
                    for g in gen_k:
                        row["actor_gen"] = g
                        listed.add(row)
    return listed.result()


def configurations(scenario: Scenario) -> Iterator[dict[str, Option]]:
    """The plans of `plan_table`, one dict of options each."""
    return listing.configurations(plan_table, scenario)


# AReaL's example for a comparable job: examples/math/gsm8k_grpo.yaml (commit a0f3dca2, the 1.0.4 wheel's
# code): half the GPUs SGLang servers of one GPU, half the actor under FSDP, the reference and critic
# colocated with it (`${actor.backend}`), micro-batches packed to 10,240 tokens, gradient checkpointing
# (a model larger than the example's 1.5B: servers of the fewest GPUs that hold it, see default_plan), at
# the scenario's staleness (the example generates two versions ahead); the default: the same on the paper's split
# (arXiv 2505.24298 §5: three quarters of the GPUs generate)
EXAMPLE = {"source": "AReaL examples/math/gsm8k_grpo.yaml (v1.0.4)", "settings": {"rollout_share": 0.5},
           "memory_fraction": 0.8}  # (its sglang.mem_fraction_static)


# AReaL's example for a mixture of experts: examples/tau2/config_30b_moe_airline.yaml (Qwen3-30B-A3B,
# main@497e5e2): half the GPUs SGLang servers of 4 GPUs (sglang:d8t4 of 64), half the actor under
# Megatron `(attn:d4p4t2|ffn:d2p4e4)` (pp 4, the attention's tp 2, the experts over ep 4 GPUs of a
# stage, each whole), the distributed optimizer, every layer recomputed, micro-batches packed to
# 32,768 tokens, its servers at 0.8 of each GPU; on another cluster the same shape on the actor's
# GPUs (the experts over up to 4 GPUs of a stage, tau2_backend)
MOE_EXAMPLE = {"source": "AReaL examples/tau2/config_30b_moe_airline.yaml (main@497e5e2)",
               "settings": {"rollout_share": 0.5, "layout": "tau2"}, "memory_fraction": 0.8}
TAU2 = {"pp": 4, "tp": 2, "ep": 4, "server_tp": 4, "max_tokens_per_mb": 32768}


def tau2_backend(gpus: int) -> str:
    """The tau2 MoE example's actor allocation on `gpus` GPUs: pp 4 and attention tp 2 (d the rest),
    the experts over min(4, a stage's GPUs) GPUs, each whole (the FFN's d the rest): on 32 GPUs its own
    `(attn:d4p4t2|ffn:d2p4e4)`, written in AReaL's flat form (etp 1: allocation_string)."""
    pp, tp = TAU2["pp"], TAU2["tp"]
    if gpus % (pp * tp):
        raise ConfigError(f"AReaL's tau2 MoE example lays its actor out in pipelines of {pp} stages of {tp} GPUs: "
                          f"{gpus} GPUs do not hold whole ones")
    ep = min(TAU2["ep"], gpus // pp)
    return allocation_string("megatron", gpus // (pp * tp), tp, pp, 1, ep, 1, experts=True)


def example_of(scenario: Scenario) -> dict[str, Any]:
    """AReaL's example configuration for the scenario's job: EXAMPLE, or MOE_EXAMPLE for an actor with
    experts."""
    return MOE_EXAMPLE if getattr(scenario.models["actor"], "moe", None) is not None else EXAMPLE


def default_plan(scenario: Scenario, settings: Optional[dict[str, Any]] = None) -> dict[str, Option]:
    """The plan of AReaL's GSM8K example layout for the scenario's job on its whole cluster: the
    rollout's share of the GPUs (`settings` {"rollout_share": x}; default three quarters, the
    paper's split), at the scenario's own staleness. Its micro-batches of 10,240 tokens hold at least a
    whole row (AReaL's packer refuses a longer one: a job of longer rows raises the budget to one).
    With {"layout": "tau2"} (MOE_EXAMPLE) the tau2 MoE example's: servers of 4 GPUs, the actor's
    Megatron layout (tau2_backend), micro-batches of 32,768 tokens."""
    c, df = scenario.cluster, scenario.dataflow
    N, G = c.n_devices, c.gpus_per_node
    gen, train = df.call("actor_gen"), df.call("actor_train")
    share = (settings or {}).get("rollout_share", 0.75)

    def placeable(r: int) -> bool:
        try:
            return place([("actor", N - r), ("rollout", r)], G)[1] <= c.nodes
        except ConfigError:
            return False

    # servers of one GPU, as the example's 1.5B model; a larger model on the fewest GPUs that hold
    # its bf16 weights in half their memory (the rest for the KV cache)
    weights = 2 * scenario.models["actor"].n_params
    t_min = next((t for t in divisors(G) if weights / t <= c.usable_memory_bytes / 2), G)
    tau2 = (settings or {}).get("layout") == "tau2"
    if tau2:  # (the example's servers of 4 GPUs)
        t_min = TAU2["server_tp"]
    # the share, or the largest rollout under it that realbench places (whole nodes, power-of-two
    # blocks) and whose servers split the batch evenly
    fits = [(r, t) for r in sorted(group_sizes(c), reverse=True) if r <= N * share and r < N and placeable(r)
            for t in divisors(G) if t >= t_min and r % t == 0 and gen.seqs % (r // t) == 0]
    if not fits:
        raise ConfigError(f"no rollout of AReaL's example layout splits this job's {gen.seqs} samples evenly")
    R, t = fits[0]
    critic, ref = "critic" in scenario.models, "ref_inf" in df.call_names
    budget = max(TAU2["max_tokens_per_mb"] if tau2 else 10240, gen.prompt_len + gen.gen_len)
    backend = tau2_backend(N - R) if tau2 else f"fsdp:d{N - R}"
    given: dict[str, Any] = {
        "cluster.n_nodes": c.nodes, "cluster.n_gpus_per_node": G, "actor.backend": backend,
        "rollout.backend": f"sglang:d{R // t}t{t}", "actor.scheduling_spec": _SCHEDULING_SPEC, "actor.path": "actor",
        "actor.gradient_checkpointing": True, "actor.mb_spec.max_tokens_per_mb": budget,
        "train_dataset.batch_size": gen.seqs // gen.group_size, "train_dataset.max_length": gen.prompt_len,
        "gconfig.n_samples": gen.group_size, "gconfig.max_new_tokens": gen.gen_len,
        "gconfig.max_tokens": gen.prompt_len + gen.gen_len, "actor.ppo_n_minibatches": train.optimizer_steps,
        "rollout.max_head_offpolicyness": df.max_staleness, "actor.kl_ctl": 0.1 if ref else 0.0,
        "actor.reward_norm.mean_leave1out": scenario.algorithm == "rloo"}
    for role, present in (("ref", ref), ("critic", critic)):
        if present:
            given.update({f"{role}.backend": backend, f"{role}.path": role,
                          f"{role}.scheduling_strategy.type": "colocation", f"{role}.scheduling_strategy.target": "actor",
                          f"{role}.mb_spec.max_tokens_per_mb": budget, f"{role}.gradient_checkpointing": True})
    settings_ = resolve(given)
    _, plan = to_plan(backend.split(":")[0], settings_, set(), scenario.name, "h100", lengths=train.lengths,
                      models=dict(scenario.models))
    # (checked as AReaL runs the job, its rows packed: the plan's token budgets are its packer's)
    return the_jobs_share(resolve_plan(plan_from_document({**plan, "scenario": scenario.name}),
                                       scenario.with_padding_free(True)))


def job_of(scenario: Scenario) -> Scenario:
    """The scenario's job as AReaL runs it: a reward model's score comes from the rollout workflow's
    reward function instead (AReaL's trainer runs no reward model); otherwise the scenario."""
    if isinstance(scenario.models.get("reward"), FunctionSpec):
        return scenario
    models = {**scenario.models, "reward": FunctionSpec(name="workflow_reward", functions=(REWARD,))}
    calls = [c.model_copy(update={"kind": CallKind.FUNCTION, "lengths": None})
             if c.model == "reward" and c.kind == CallKind.INFERENCE else c for c in scenario.dataflow.calls]
    fields = {k: getattr(scenario, k) for k in Scenario.model_fields}
    return Scenario.model_validate({**fields, "models": models, "dataflow": scenario.dataflow.with_calls(calls),
                                    "engine": "areal"})
