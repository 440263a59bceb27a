"""A verl configuration read into a scenario and a plan: `read_config` takes a Hydra primary
config (`defaults: [ppo_trainer, _self_]`, as `python -m verl.trainer.main_ppo --config-path
--config-name` takes it) or a composed config (a run's `.hydra/config.yaml`), then Hydra-style
overrides, over verl's own defaults; a key verl does not have is refused with the closest one.
`to_plan` makes the scenario and plan documents of the settings read, each rule with the source
file of verl's that it follows.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, Optional

from realbench.dataflow import CallKind
from realbench.dataflow.lengths import LengthDistribution
from realbench.engines.batches import StepRows, fewest_splits, rounds
from realbench.engines.documents import (expert_layout_problem, job_documents, model_of_path, served_context,
                                         whole_row_budget)
from realbench.engines.dotted import flatten
from realbench.engines.verl.pricing import (TRANSFORMER_REFUSED, _check_mixed_precision, _divided_by, _formed,
                                            _unpriced_section, logits_paths, refuse_unpriced, rollout_problem,
                                            transformer_field, transformer_parts)
from realbench.engines.verl.settings import (A, ADAPTER_PATH, ADDED_KEYS, BASE_CONFIGS, BUILTIN_REWARD, BYPASS,
                                             CRITIC_BUDGET, ENGINES, ESTIMATOR, ESTIMATORS, EXPERT_KEYS, FSDP_SIZE,
                                             FSDP_VERSIONS, HYBRID, LORA_EXCLUDE, LORA_KEYS, LORA_MERGE, MAX_MODEL_LEN,
                                             FREE_CACHE, MEGATRON_BLOCKS, MEMORY, MIXED_PRECISION_BLOCKS, OFFLOAD_BLOCK,
                                             ONE_STEP_OFF, ONE_STEP_OFF_CONFIGS, OPEN_SECTIONS, PARAM_OFFLOAD, POOL, R,
                                             READ_ENGINE_KWARGS, REF_MEGATRON_OFFLOAD, REMOVE_PADDING, RM, ROLLOUT_DP,
                                             ROLLOUT_EP, ROLLOUT_POOL, SAME_CALLS, SEQUENCE_PARALLEL, SERVERS, STRATEGY,
                                             TEACHER, TEACHER_POOL, TEACHER_SERVER, DISTILL, VERSION, defaults, resolve)
from realbench.errors import ConfigError
from realbench.plan.mesh import Mesh, Option, Strategy, is_pow2
from realbench.plan.options import straddles_nodes
from realbench.plan.scenario import Scenario
from realbench.schema import load_yaml, read_document

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


def _passed_through(key: str) -> Optional[str]:
    """What realbench says of a key verl hands on as given (PASSED_THROUGH, TRANSFORMER_REFUSED) or
    of an unpriced section's key, or None: a key verl does not have."""
    parts = transformer_parts(key)
    if parts and parts[1] in TRANSFORMER_REFUSED:
        return f"{TRANSFORMER_REFUSED[parts[1]]} (a Megatron TransformerConfig field verl passes through)"
    for section, what in PASSED_THROUGH.items():
        if section in key:
            return what
    unpriced = _unpriced_section(key)
    return f"{unpriced}, which realbench does not price" if unpriced else None


def _unknown(key: str, engine: str, source: str, one_step_off: bool = False) -> ConfigError:
    what = _passed_through(key)
    if what:
        return ConfigError(what, key, source)
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


def _check_search_path(key: str, value: Any) -> None:
    """Refuse by name a Hydra search path beyond verl's own configs (another package's configs,
    which the config may extend: realbench reads ppo_trainer's). Hydra's other settings (its run
    folder, its logging) change nothing verl runs."""
    if key != "hydra.searchpath":
        return
    paths = value if isinstance(value, list) else [value]
    other = [str(p) for p in paths if str(p).rstrip("/") != "pkg://verl.trainer.config"]
    if other:
        raise ConfigError(f"{', '.join(other)}: configs from beyond verl's own (pkg://verl.trainer.config) are not read",
                          key, "overrides")


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
    added: set[str] = set()  # (keys a `+` override adds)
    settings = {k: v for k, v in doc.items() if k not in ("defaults", "hydra", "model_engine")}
    given = flatten(settings) if settings else {}  # (a config of defaults alone, the overrides giving the rest)
    for o in overrides:
        key, eq, raw = o.partition("=")
        if not eq or not key or key.startswith("~"):
            raise ConfigError("an override is key=value (or +key=value)", o, "overrides")
        if key == "model_engine":
            continue
        value = load_yaml(raw) if raw else None
        if key.lstrip("+").startswith("hydra."):  # (Hydra's own settings: its run folder, logging, search path)
            _check_search_path(key.lstrip("+"), value)
            continue
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
                added.add(key)  # (refused below with the others verl does not hold, unless realbench reads it)
        given.update(flatten(value, f"{key}.") if isinstance(value, dict) else {key: value})
    known = {**table, **ADDED_KEYS}
    unknown = [k for k in given if k not in known and not k.startswith((*OPEN_SECTIONS, *MIXED_PRECISION_BLOCKS))
               and not transformer_field(k) and k not in READ_ENGINE_KWARGS]
    if unknown:
        # (a key verl has nowhere is named before one it passes on unpriced: it tells a configuration
        # written for another release, whatever else it sets)
        key = min(unknown, key=lambda k: _passed_through(k) is not None)
        raise _unknown(key, engine, "overrides" if key in added else source, one_step_off)
    for key in given:
        if key.startswith(MIXED_PRECISION_BLOCKS):
            _check_mixed_precision(key, given[key], source)
    changed = {k for k, v in given.items() if v != known.get(k)}
    return engine, resolve(engine, given, one_step_off), changed


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
    refuses one as unknown). The critic's role-level size reaches no engine (IGNORED_BY_VERL says so
    on import)."""
    def size(key: str) -> int:  # (a Megatron block has none of these keys)
        return 1 if s.get(key) is None else int(s[key])

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


def _rollout_experts(s: dict[str, Any], tp: int, pool: Mesh, server: str, model, source: str,
                     block: str = R, kind: CallKind = CallKind.GENERATE) -> dict[str, int]:
    """A serving engine's expert parallelism as the plan's call carries it (the rollout's, ROLLOUT_DP,
    ROLLOUT_EP; or another server `block`'s, a distillation teacher's, of a call of `kind`: ep =
    expert_parallel_size over replicas of tp x data_parallel_size GPUs, each expert whole), {}
    without it; refused by name where verl refuses it or realbench does not price it."""
    dp_key, ep_key = (key.replace(R, block, 1) for key in (ROLLOUT_DP, ROLLOUT_EP))
    D, E = (_size(s, key, source) or 1 for key in (dp_key, ep_key))
    if E > 1 and E != tp * D:
        raise ConfigError(f"{E}: verl asserts expert_parallel_size == tensor_model_parallel_size x data_parallel_size "
                          f"({tp} x {D} = {tp * D}) where above 1 (verl/workers/config/rollout.py:294-297)",
                          ep_key, source)
    if D > 1 and E == 1:
        raise ConfigError(f"{D} without expert parallelism (expert_parallel_size 1): the serving engine then splits a "
                          f"mixture of experts' experts by tensor parallelism over tp x dp = {tp * D} GPUs, which "
                          "realbench does not price (expert_parallel_size = tp x dp is)", dp_key, source)
    if D > 1 and server == "sglang":
        raise ConfigError(f"{D} with SGLang: verl hands SGLang tp_size = tp x dp and dp_size dp "
                          "(async_sglang_server.py:313-324), whose data-parallel attention is an engine argument "
                          "(enable_dp_attention) realbench does not read; realbench prices SGLang's expert "
                          "parallelism over a replica's tp GPUs (data_parallel_size 1, expert_parallel_size = tp)",
                          dp_key, source)
    G = pool.gpus
    if D > 1 and (pool.size % (tp * D) or (G % (tp * D) and (tp * D) % G)):
        raise ConfigError(f"{D}: a replica of tp x dp = {tp * D} GPUs fits a node or spans whole nodes of {G} "
                          "(verl/workers/rollout/replica.py:107-117) and the replicas share the GPUs evenly",
                          dp_key, source)
    if E == 1:
        return {}
    problem = expert_layout_problem(model, kind, Strategy(pool.size // tp, tp, 1, ep=E, etp=1))
    if problem:
        raise ConfigError(f"{E}: {problem[1]}", ep_key, source)
    return {"ep": E, **({"etp": 1} if tp > 1 else {})}


def to_plan(engine: str, s: dict[str, Any], given: set[str], name: str, device: str, source: str = "",
            lengths: Optional[LengthDistribution] = None, gpus_per_node: Optional[int] = None,
            models: Optional[dict[str, Any]] = None) -> tuple[dict, dict]:
    """(scenario document, plan document) of resolved verl settings `s` and the keys given (read_config).
    `lengths`: the responses' lengths verl's dynamic batching sees (default: every response at its
    cap; realbench.engines.verl.packer counts its micro-batches). `gpus_per_node`: the
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
    if n < 1:
        raise ConfigError(f"{n}: samples a prompt, 1 or more", f"{R}.n", source)
    if estimator in SAME_CALLS and n < 2:  # (verl's group of one, which realbench runs, is GRPO's and RLOO's own rule)
        raise ConfigError(f"{n}: realbench prices {estimator} with {algorithm.upper()}'s calls, which compare a "
                          "prompt's samples: 2 or more", f"{R}.n", source)
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

    def packed_count(rows_per_gpu: int, key: str, role: str = "actor") -> int:  # verl's dynamic batching (packer)
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
                      "micro_batches": rounds(rows // replicas, int(s[f"{R}.max_num_seqs"])),
                      **_rollout_experts(s, rollout_tp, rollout_pool, server, specs("actor"), source),
                      **({"keeps_memory": True} if not one_step_off and not s[FREE_CACHE] else {})},
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
                               "micro_batches": rounds(rows // rm_replicas, int(s[f"{RM}.rollout.max_num_seqs"]))}
    else:
        scorer = _function_mesh(rows, rollout_pool)
        calls["reward_inf"] = {"mesh": scorer.label(per_node), "dp": scorer.size, "tp": 1, "pp": 1, "micro_batches": 1}
    teacher = _teacher_pool(s, algorithm, one_step_off, pool, nodes, per_node, server, L, source)
    if teacher is not None:  # vLLM / SGLang replicas of the teacher on its own pool, prefilling whole rows
        t_tp = _replica_tp(int(s[f"{TEACHER_SERVER}.tensor_model_parallel_size"]), teacher.size, per_node,
                           f"{TEACHER_SERVER}.tensor_model_parallel_size", source)
        calls["teacher_inf"] = {"mesh": teacher.label(per_node), "dp": teacher.size // t_tp, "tp": t_tp, "pp": 1,
                                "micro_batches": teacher_micro_batches(rows // (teacher.size // t_tp), L, s),
                                **_rollout_experts(s, t_tp, teacher, server, model_of_path(s[f"{TEACHER}.model_path"]),
                                                   source, TEACHER_SERVER, CallKind.INFERENCE)}
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
        _lora_off_vision(s, specs("actor"), source)
        # the reference of a LoRA actor is the actor with its adapters off (ref_in_actor,
        # verl/trainer/ppo/v1/trainer_base.py:234-237): no reference model
        models.pop("ref", None)
        if s[LORA_MERGE]:
            calls["actor_gen"]["merge_lora"] = True
        if s[PARAM_OFFLOAD["actor"]]:
            raise ConfigError("True with lora_rank: a LoRA model's parameter offload is not priced",
                              PARAM_OFFLOAD["actor"], source)
    elif s.get(LORA_EXCLUDE) is not None:
        raise ConfigError(f"{s[LORA_EXCLUDE]!r} with lora_rank 0: modules kept off LoRA, without LoRA", LORA_EXCLUDE,
                          source)
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
    if teacher is not None:
        models["teacher"] = {"path": s[f"{TEACHER}.model_path"]}
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
                         cluster={"nodes": max(m.node + m.nodes for m in (trainer_pool, rollout_pool, pool, teacher)
                                               if m),
                                  "gpus_per_node": per_node, "device": device}, epochs=epochs,
                         max_staleness=1 if one_step_off else 0,
                         calls=calls, with_ref=with_ref, with_teacher=teacher is not None,
                         old_logprobs="rollout" if s[BYPASS] else "whole_batch",
                         rollout_server=server, padding_free=padding_free, padded_models=padded,
                         memory_fraction=s[MEMORY], max_model_len=context if server == "vllm" else None,
                         logits={k: v.model_dump(exclude_defaults=True)
                                                            for k, v in logits.items() if k in calls})


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
    return _pool_beside_trainer(s, RM, "a reward pool", "a reward pool's", POOL, nodes, per_node, source)


def _pool_beside_trainer(s: dict[str, Any], block: str, pool: str, pools: str, where: str, nodes: int, per_node: int,
                         source: str) -> Mesh:
    """A pool of GPUs verl gives a role beside the trainer's (`block`.nnodes x `block`.n_gpus_per_node:
    a reward model's, a distillation teacher's; verl's own code at `where`) as a mesh on the nodes
    after the trainer's `nodes`. realbench's nodes all have the trainer's width: the pool is whole
    such nodes, or part of one. `pool`, `pools`: its name in the messages ("a reward pool", "a
    reward pool's")."""
    for k in ("n_gpus_per_node", "nnodes"):  # (verl's own check, in this order)
        if int(s[f"{block}.{k}"]) <= 0:
            raise ConfigError(f"{s[f'{block}.{k}']}: verl needs {pools} {k} above 0 ({where})", f"{block}.{k}", source)
    pool_nodes, gpus = int(s[f"{block}.nnodes"]), int(s[f"{block}.n_gpus_per_node"])
    if gpus > per_node or (pool_nodes > 1 and gpus != per_node):
        raise ConfigError(f"{gpus} on {pool_nodes} node(s): realbench's nodes have the trainer's {per_node} GPUs "
                          f"(trainer.n_gpus_per_node): {pool} of whole such nodes, or part of one",
                          f"{block}.n_gpus_per_node", source)
    return Mesh(nodes, pool_nodes, 0, gpus)


def _teacher_pool(s: dict[str, Any], algorithm: str, one_step_off: bool, reward_pool: Optional[Mesh], nodes: int,
                  per_node: int, server: str, length: int, source: str) -> Optional[Mesh]:
    """The teacher's own pool of GPUs under on-policy distillation (distillation.enabled: nnodes x
    n_gpus_per_node beside the trainer's, TEACHER_POOL) as a mesh on the nodes after the trainer's,
    as a reward pool is read (_reward_pool); None without distillation. One teacher, served by the
    rollout's engine as replicas of tp GPUs (a second teacher's keys are not verl's composed config's:
    refused by name as unknown, UNPRICED_SECTIONS); what else verl's distillation may be is refused
    by name."""
    if not s[f"{DISTILL}.enabled"]:
        return None
    key = f"{DISTILL}.enabled"
    if algorithm == "ppo" or one_step_off:
        raise ConfigError("True: realbench prices on-policy distillation in verl's synchronous trainer with GRPO's or "
                          "RLOO's calls (no critic)", key, source)
    if reward_pool is not None:
        raise ConfigError("True with distillation: realbench reads one pool beside the trainer's, the teacher's "
                          f"({TEACHER_POOL}); score on the trainer's GPUs", f"{RM}.enable_resource_pool", source)
    if s[f"{TEACHER}.model_path"] is None:
        raise ConfigError("is not set: verl needs the teacher's checkpoint", f"{TEACHER}.model_path", source)
    teacher = _pool_beside_trainer(s, DISTILL, "a teacher pool", "the teacher pool's", TEACHER_POOL, nodes, per_node,
                                   source)
    name = s[f"{TEACHER_SERVER}.name"]
    if name != server:
        raise ConfigError(f"{name!r}: realbench carries one serving engine a job, the rollout's ({server!r})",
                          f"{TEACHER_SERVER}.name", source)
    context = s[f"{TEACHER_SERVER}.max_model_len"]
    if context is not None and int(context) < length + 1:  # (verl's own check, DistillationTeacherModelConfig)
        raise ConfigError(f"{context}: the teacher takes a prompt and its whole response and generates one token: "
                          f"{length + 1} at least (verl refuses it, workers/config/distillation.py)",
                          f"{TEACHER_SERVER}.max_model_len", source)
    if s.get(f"{DISTILL}.distillation_loss.use_chunked_topk"):
        raise ConfigError("True: the top-k log-probabilities computed chunk by chunk in the actor's loss (about 6x "
                          "its time at long context, verl's note) are not priced",
                          f"{DISTILL}.distillation_loss.use_chunked_topk", source)
    return teacher


def teacher_micro_batches(rows: int, length: int, s: dict[str, Any]) -> int:
    """The forwards a teacher replica runs over its `rows` of `length` tokens: its server prefills at
    most max_num_seqs rows and max_num_batched_tokens tokens a step (chunked prefill: at least one
    row a step, as realbench splits rows whole), as the fewest equal splits of the rows."""
    seqs = int(s[f"{TEACHER_SERVER}.max_num_seqs"])
    tokens = int(s[f"{TEACHER_SERVER}.max_num_batched_tokens"])
    return fewest_splits(rows, max(rounds(rows, seqs), -(-rows * length // tokens)))


def _same_rank(adapter: str, rank: int, source: str) -> None:
    """Refuse a lora_rank other than the adapter folder's r, where the folder is there to read (verl
    trains the folder's adapters and sizes vLLM's LoRA slots by lora_rank)."""
    config = Path(adapter).expanduser() / "adapter_config.json"
    if config.is_file():
        r = json.loads(config.read_text()).get("r")
        if r != rank:
            raise ConfigError(f"{rank}: the adapter folder's r is {r} (verl trains the folder's adapters and sizes "
                              "vLLM's LoRA slots by lora_rank): give the same", LORA_KEYS["r"], source)


def read_problem(scenario: Scenario, options: dict[str, Option]) -> Optional[tuple[str, str]]:
    """What of a configuration read realbench cannot price as verl runs it, beyond its keys."""
    return rollout_problem(scenario, options)


def _lora_off_vision(s: dict[str, Any], actor, source: str) -> None:
    """A LoRA actor's exclude_modules keeps PEFT's adapters off exactly a vision-language model's
    vision tower (realbench adapts the decoder only; target_modules alone would adapt the tower's
    like-named projections too); refused elsewhere, and where a VLM's tower is not kept off."""
    from realbench.models.spec import vision_exclusion_problem

    exclude = s.get(LORA_EXCLUDE)
    if getattr(actor, "vision", None) is None:
        if exclude is not None:
            raise ConfigError(f"{exclude!r}: modules kept off LoRA where the actor has no vision tower: realbench "
                              "reads the exclusion of a vision-language model's tower only", LORA_EXCLUDE, source)
        return
    problem = ("None: PEFT then adapts the vision tower's projections too, which realbench does not price (keep "
               "them off: exclude_modules='.*visual.*')") if exclude is None else vision_exclusion_problem(exclude)
    if problem:
        raise ConfigError(problem, LORA_EXCLUDE, source)
