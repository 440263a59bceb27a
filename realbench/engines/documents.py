"""The scenario and plan documents of an engine's configuration, as `realbench import` writes
them (one writer for every engine's reader)."""

from __future__ import annotations

from typing import Any, Optional

from realbench.errors import ConfigError


def serving_gap(slots: str, memory: str) -> str:
    """The pricing gap every engine's rollout shares: a replica decodes up to `slots` sequences
    together (continuous batching), or as many as its paged KV cache, sized by `memory` (the
    fraction of the GPU the serving engine takes), holds at their mean length
    (realbench.cost.calls.serving_slots); what the server does when the growing sequences outrun
    the cache is not priced."""
    return (f"a rollout replica is priced decoding up to {slots} sequences together, or as many as its KV cache at "
            f"{memory} holds at their mean length; where the growing sequences outrun it, the server preempts some "
            "and recomputes them from their prompts and tokens so far, which realbench does not price")


def job_documents(engine: str, name: str, description: str, origin: str, *, algorithm: str, models: dict,
                  prompts: int, prompt_len: int, gen_len: int, steps: int, group_size: int, cluster: dict,
                  epochs: int, calls: dict[str, dict[str, Any]], old_logprobs: str, rollout_server: str,
                  padding_free: bool, max_staleness: int = 0, with_ref: bool = True, with_teacher: bool = False,
                  padded_models: tuple[str, ...] = (), memory_fraction: Optional[float] = None,
                  max_model_len: Optional[int] = None, logits: Optional[dict[str, dict]] = None) -> tuple[dict, dict]:
    """(scenario document, plan document). `old_logprobs`: where the engine takes the policy's
    old log-probabilities from (realbench.dataflow.core.OldLogprobs); `padding_free` whether it packs
    the rows of its scoring and training calls without padding (but `padded_models`' calls, which keep
    theirs); `logits` how it computes calls' log-probabilities where not as realbench prices by default
(training.logits, by call); `memory_fraction` the share of each GPU's memory its rollout's serving engine takes, `max_model_len` the
context its vLLM server must hold one request of to start (None: a sequence's), written to the scenario and, the
    plan's choice, to the plan's generation; `rollout_server` its rollout's
    serving engine (vllm, sglang), written back as read. `calls`: each call's mesh label and strategy, the
    strategy's defaults (no checkpointing, one virtual stage, no sharding, no offload) left out as a plan file
    leaves them out, and no sharding over a single replica."""
    for c in calls.values():
        if c["dp"] * c.get("sp", 1) == 1:  # one replica: nothing to shard over (nor to offload a shard of the parameters)
            c.pop("zero", None)
            c.pop("offload_params", None)
            # (its optimizer is still offloaded, whole: priced as an unsharded optimizer's states, 12
            # bytes a parameter, which FSDP's moments alone (8) and DeepSpeed ZeRO-3's with its
            # gradients (14) are not exactly)
        for key, off in (("activation_checkpointing", False), ("virtual_stages", 1), ("zero", 0), ("merge_lora", False),
                         ("offload_params", False), ("offload_optimizer", False), ("host_adam", False), ("ep", 1)):
            if c.get(key, off) == off:
                c.pop(key, None)
    dataflow = {"algorithm": algorithm, "prompts": prompts, "prompt_len": prompt_len, "gen_len": gen_len,
                "minibatches": steps}
    if algorithm != "ppo" or group_size != 1:
        dataflow["group_size"] = group_size
    if not with_ref:  # no KL term: the engine loads no reference
        dataflow["with_ref"] = False
    if with_teacher:  # on-policy distillation: a teacher's forward over every sequence
        dataflow["with_teacher"] = True
    if max_staleness:
        dataflow["max_staleness"] = max_staleness
    if memory_fraction is not None:
        dataflow["memory_fraction"] = memory_fraction
        calls["actor_gen"]["memory_fraction"] = memory_fraction  # (the plan's choice: Strategy.memory_fraction)
    if max_model_len is not None and max_model_len != prompt_len + gen_len:  # (a sequence's: the default)
        dataflow["max_model_len"] = max_model_len
    scenario = {"schema": "realbench.scenario/1", "name": name, "algorithm": algorithm, "engine": engine,
                "rollout_server": rollout_server,
                "description": description, "cluster": cluster, "models": models, "dataflow": dataflow,
                "training": {"num_iterations": epochs, "old_logprobs": old_logprobs, "padding_free": padding_free,
                             **({"padded_models": list(padded_models)} if padded_models else {}),
                             **({"logits": logits} if logits else {})}}
    plan = {"schema": "realbench.plan/1", "scenario": f"{name}.yaml", "calls": calls, "origin": {"method": origin}}
    if max_staleness:
        plan["max_staleness"] = max_staleness
    return scenario, plan


def max_positions(folder: str) -> Optional[int]:
    """The positions a checkpoint folder's config.json was made for (max_position_embeddings, or its
    text_config's, where the engines look: verl/workers/rollout/utils.py, get_max_position_embeddings),
    which the serving engines take for a request's context where none is given; None where no config
    is found for it (a folder, a config file, a cached hub id or a catalogue entry: import_config then
    refuses it)."""
    from realbench.models.hf import find_config

    if not folder:
        return None
    try:
        found = find_config(folder)
    except ConfigError:
        return None
    cfg, path = found.config, found.source
    positions = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get("max_position_embeddings")
    if not isinstance(positions, int) or isinstance(positions, bool) or positions < 1:
        raise ConfigError(f"{positions!r}: the serving engines take the context of a request from it: a whole number",
                          "max_position_embeddings", path)
    return positions


def refuse_beyond_positions(context: Optional[int], folder: str, key: str, source: str, beyond: str) -> Optional[int]:
    """The checkpoint's positions (max_positions), refusing a server's `context` beyond them (the
    server refuses it before it starts: `beyond`, where) under the engine's `key`."""
    positions = max_positions(folder)
    if positions is not None and context is not None and context > positions:
        raise ConfigError(f"{context}: beyond the checkpoint's max_position_embeddings {positions}, which {beyond}",
                          key, source)
    return positions


def served_context(given: Optional[int], folder: str, length: int, key: str, source: str, *, beyond: str,
                   cut: str) -> Optional[int]:
    """The context an engine's rollout server takes: `given` (the engine's `key`), or, unset, the
    checkpoint's positions (max_positions), None where neither is known. Refused: a context beyond the
    checkpoint's positions (refuse_beyond_positions) or short of a prompt and its response of `length`
    tokens (the response would be cut: `cut`, how)."""
    positions = refuse_beyond_positions(None if given is None else int(given), folder, key, source, beyond)
    context = positions if given is None else int(given)
    if context is None:
        return None
    if context < length:
        what = f"{context}" if given is not None else f"unset: the checkpoint's max_position_embeddings {context}"
        raise ConfigError(f"{what}, short of a prompt and its response ({length} tokens): {cut}, where realbench "
                          "prices whole responses", key, source)
    return context


def lora_problem(scenario, engine: str, adapter_folders: bool = False) -> Optional[tuple[str, str]]:
    """(scenario key, why) when the scenario's LoRA settings are more than `engine`'s names carry
    (an actor's r, alpha and target modules; with `adapter_folders`, a PEFT folder to start from),
    or None."""
    for role, model in scenario.models.items():
        lora = getattr(model, "lora", None)
        if lora is None:
            continue
        if role != "actor":
            return f"models.{role}.lora", f"realbench writes {engine}'s LoRA settings for the actor only"
        if lora.use_rslora:
            return "models.actor.lora.use_rslora", f"{engine} has no rsLoRA setting (its scaling is lora_alpha / r)"
        if lora.path is not None and not adapter_folders:
            return "models.actor.adapter", f"an adapter folder to start from is not written in {engine}'s settings yet"
    return None


def refuse_offload(options, engine: str, flag: str) -> None:
    """Refuse a call with its parameters in host memory (`offload_params`, verl's FSDP reference as
    realbench prices it: the fp32 shard copied in every forward; or verl's param_offload of a trained
    model) or its optimizer's (`offload_optimizer`, `host_adam`), which realbench does not write in `engine`'s
    settings (`flag`: the engine's own offload, refused on import, offloads otherwise)."""
    for name, o in options.items():
        if o.strategy.offload_params:
            raise ConfigError(f"realbench does not write {engine}'s parameter offload ({flag}), which keeps and "
                              "moves them otherwise than the fp32 shards priced here", f"calls.{name}.offload_params")
        if o.strategy.offload_optimizer:  # (verl's FSDP optimizer_offload: Adam's moments moved around each update)
            raise ConfigError(f"realbench does not write {engine}'s optimizer offload, which keeps and updates the "
                              "states otherwise than verl's priced here", f"calls.{name}.offload_optimizer")
        if o.strategy.host_adam:
            raise ConfigError(f"{engine} runs Adam on the GPUs: Adam on the host is DeepSpeed's ZeRO-Offload "
                              "(OpenRLHF's --ds.adam_offload)", f"calls.{name}.host_adam")


def whole_alpha(lora, engine: str) -> int:
    """The adapters' lora_alpha as the engines take it: an int setting."""
    if not float(lora.lora_alpha).is_integer():
        raise ConfigError(f"{lora.lora_alpha}: {engine} takes a whole number", "models.actor.lora.lora_alpha")
    return int(lora.lora_alpha)


def budget_row(scenario, call_name: str) -> float:
    """The tokens a row of a call counts toward an engine's token budget per micro-batch (verl's
    dynamic batching, AReaL's max_tokens_per_mb): its prompt and its response as long as it ran,
    on average (both count the attention mask's sum, verl/utils/seqlen_balancing.py:378-382,
    areal/utils/data.py:723-731, padded rows or not). Without response lengths: the whole row."""
    call = scenario.dataflow.call(call_name)
    if call.lengths is None:
        return float(call.seq_len)
    return call.seq_len - call.lengths.max + call.lengths.expected


def whole_row_budget(budget, L: int, key: str, source: str, refused_by: str) -> Optional[int]:
    """A token budget a micro-batch (None: unset), or ConfigError where it holds no whole row of L
    tokens, which the engine refuses (`refused_by`: how, and where in its source)."""
    if budget is not None and int(budget) < L:
        raise ConfigError(f"{budget} tokens hold no whole row of {L} (prompt and response): {refused_by}", key, source)
    return None if budget is None else int(budget)


def packs(scenario, engine: str, default: bool, settable: bool = True) -> bool:
    """Whether `engine` packs the rows of the scenario's scoring and training calls without padding:
    as its configuration says where the scenario was read from one (training.padding_free), else
    (or where the engine has no such setting) the engine's `default`."""
    return scenario.training.padding_free if scenario.engine == engine and settable else default


# -- a mixture of experts' layout, as the engines name it ----------------------------------------------
def model_of_path(path: Any):
    """The spec of the model an engine's configuration names (a checkpoint folder, a config.json
    file, a hub id in the local cache or the catalogue: realbench.models.hf.find_config), read
    from its config alone; None where there is none to read here (the import refuses the path by
    name after reading the configuration)."""
    from realbench.models.hf import spec_from_source

    if not isinstance(path, str) or not path.strip():
        return None
    try:
        return spec_from_source(path)
    except (ConfigError, ValueError, OSError):
        return None


def has_experts(model) -> Optional[bool]:
    """Whether a model (a spec, or None where it is not known) is a mixture of experts."""
    return None if model is None else getattr(model, "moe", None) is not None


def expert_layout_problem(model, kind, strategy) -> Optional[tuple[str, str]]:
    """(field: ep or etp, why) a call of `kind` (realbench.dataflow.CallKind) cannot lay out
    `model`'s experts as `strategy` says (realbench.plan.options.expert_problem: Megatron's parallel
    folding in training and inference, the serving engines' expert parallelism in generation), or
    None; None also where the model is not known (None: realbench checks the plan against the
    scenario's model when it reads it)."""
    from realbench.plan.options import expert_problem

    if model is None or (strategy.ep == 1 and not strategy.etp):
        return None
    return expert_problem(kind, model, strategy)
