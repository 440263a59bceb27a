"""Execution plans (`realbench.plan/1`): for every call of a scenario, its mesh and strategy.

    schema: realbench.plan/1
    scenario: ppo-7b-7b-16gpu          # a built-in name or a scenario file (relative to the plan)
    calls:
      actor_gen:   {mesh: n0-1, dp: 8, tp: 2, pp: 1, micro_batches: 1}
      actor_train: {mesh: n0-1, dp: 2, tp: 4, pp: 2, micro_batches: 8}
      # optional on train calls: activation_checkpointing: true, virtual_stages: 2 (interleaved 1F1B);
      # on train and inference calls: zero: 1-3 (ZeRO / FSDP, the engines' sharding; priced, not run here)
      # on a LoRA model's generation and inference: merge_lora: true (merged weights every step)
      # on inference and train calls under zero 3: offload_params: true (FSDP's CPU offload of a
      #   forward-only model, verl's param_offload of a trained one; priced, not run here)
      # on train calls under zero 2 or 3: offload_optimizer: true (verl's; priced, not run here)
      # on train calls under zero 1 to 3 (or dp 1): host_adam: true (DeepSpeed's ZeRO-Offload; priced, not run here)
      # on inference and train calls of rows packed without padding: max_tokens: 8192 (an engine's
      #   micro-batches formed by tokens, each within so many a device; priced, not run here)
      # on inference and train calls under FSDP (zero 2 or 3): sp: 4 (Ulysses sequence parallelism,
      #   dp x sp devices; verl's; priced, not run here); with ring: allgather, under any zero, ring
      #   attention over the sp devices instead (OpenRLHF's), with ring: p2p, beside tp and pp under
      #   zero 0 or 1, Megatron's context parallelism (verl's and AReaL's; priced, not run here)
      # on a generation by an engine's serving engine: memory_fraction: 0.7 (the share of each GPU's
      #   memory the server takes, over the scenario's dataflow.memory_fraction; priced, not run here),
      #   keeps_memory: true (the server holds that share through the whole step, beside the calls on
      #   its GPUs: verl's free_cache_engine false; priced, not run here)
      # on inference and train calls under zero 2 or 3: shard_group: 8 (the state sharded within
      #   groups of 8 devices, replicated across them: FSDP's hybrid sharding, verl's fsdp_size;
      #   priced, not run here)
      # on a mixture of experts' calls: ep: 4 (its routed experts split over 4 devices: expert
      #   parallelism, folded out of dp x sp x tp in training and inference, over dp x tp in
      #   generation), etp: 1 (each expert split over so many devices; absent: tp's)
      ...
    origin: {method: mcmc, seed: 0, ...}   # optional: how the plan was found
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import ConfigDict, Field

from realbench.errors import ConfigError
from realbench.models import ModelSpec
from realbench.plan.mesh import Option, Strategy, parse_mesh
from realbench.dataflow import CallKind
from realbench.plan.options import decode_slots, option_problem
from realbench.plan.scenario import Scenario, load_scenario
from realbench.schema import PLAN_SCHEMA, FileModel, read_document, validate_model, write_document


class Placement(FileModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    mesh: str = Field(min_length=1)
    dp: int = Field(ge=1)
    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    micro_batches: int = Field(default=1, ge=1)
    activation_checkpointing: Optional[bool] = None  # train calls; absent: off
    virtual_stages: Optional[int] = Field(default=None, ge=1)  # train calls on a pipeline; absent: 1
    zero: Optional[int] = Field(default=None, ge=0)  # ZeRO / FSDP sharding over dp (the engines'); absent: 0
    # a LoRA model's generation or inference: the adapters arrive merged into the base every
    # step, and no base copy is kept (absent: a kept base copy receives the adapters alone)
    merge_lora: Optional[bool] = None
    # an inference or train call under zero 3: its parameters in host memory, copied in for every
    # forward (FSDP's CPU offload) or for every call on the layout (verl's param_offload of a
    # trained model), the engines'; absent: on the devices
    offload_params: Optional[bool] = None
    # a train call under zero 2 or 3: Adam's moments in host memory between updates (verl's FSDP
    # optimizer_offload); absent: on the devices
    offload_optimizer: Optional[bool] = None
    # a train call under zero 1 to 3 (or dp 1): the optimizer's states in host memory for good and
    # Adam run there (DeepSpeed's ZeRO-Offload, OpenRLHF's --ds.adam_offload); absent: on the devices
    host_adam: Optional[bool] = None
    # generation without a pipeline: each replica's decode slots (continuous batching), its rows
    # over the micro-batches; either may be given, and the other follows
    slots: Optional[int] = Field(default=None, ge=1)
    # an inference or train call whose rows the engine packs without padding: its micro-batches
    # formed by tokens, each within this many a device (AReaL's max_tokens_per_mb, verl's and
    # OpenRLHF's dynamic batch size); absent: so many rows each
    max_tokens: Optional[int] = Field(default=None, ge=1)
    # an inference or train call under FSDP: Ulysses sequence parallelism over this many devices of
    # each data-parallel group (dp x sp x tp x pp devices; verl's ulysses_sequence_parallel_size);
    # absent: 1
    sp: Optional[int] = Field(default=None, ge=1)
    # with sp: the group attends by ring attention, not Ulysses' all-to-alls: allgather (each device
    # gathers the group's keys and values layer by layer; OpenRLHF's --ds.ring_attn_size; true, as
    # realbench wrote it before p2p, reads as allgather) or p2p (the keys and values passed around
    # the ring chunk by chunk; Megatron's context_parallel_size); absent: Ulysses
    ring: Optional[Union[Literal["allgather", "p2p"], bool]] = None
    # an inference or train call under zero 2 or 3: its state sharded within groups of this many
    # consecutive devices of its dp x sp, each group a replica, the gradient shards all-reduced
    # across them (FSDP's hybrid sharding; verl's fsdp_size); absent: over all dp x sp devices
    shard_group: Optional[int] = Field(default=None, ge=1)
    # generation by an engine's serving engine (a scenario with dataflow.memory_fraction, or an
    # engine's plan): the share of each GPU's memory the server takes, over the scenario's
    # (vLLM's gpu_memory_utilization, SGLang's mem_fraction_static); absent: the scenario's
    memory_fraction: Optional[float] = Field(default=None, gt=0, le=1)
    # a mixture of experts: its routed experts split over this many devices (expert parallelism,
    # Megatron's expert_model_parallel_size, vLLM's and SGLang's expert parallelism); absent: 1
    ep: Optional[int] = Field(default=None, ge=1)
    # each routed expert split over this many devices (Megatron's expert_tensor_parallel_size);
    # absent: tp's
    etp: Optional[int] = Field(default=None, ge=1)
    # generation by an engine's serving engine: true, the server keeps its share of each GPU through
    # the whole step, beside the calls after it (verl's rollout.free_cache_engine false); absent:
    # released after generating, as the engines default
    keeps_memory: Optional[bool] = None


class Origin(FileModel):
    """How a plan was made: the search method and what it measured along the way."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    seed: Optional[int] = None
    evaluations: int = 0
    seconds: float = 0.0
    time_per_iter_s: Optional[float] = None
    curve: tuple[tuple[float, float], ...] = ()
    baselines: dict[str, float] = {}


class Plan(FileModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    scenario: str = Field(min_length=1)
    calls: dict[str, Placement]
    # asynchronous RL: how many iterations generation runs ahead of training (absent: 0, synchronous)
    max_staleness: Optional[int] = Field(default=None, ge=0)
    origin: Optional[Origin] = None

    def to_document(self) -> dict:
        return {"schema": PLAN_SCHEMA, **self.model_dump(mode="json", exclude_none=True)}

    def save(self, path, overwrite: bool = False) -> Path:
        return write_document(self.to_document(), path, overwrite)


def plan_from_options(scenario: Scenario, options: dict[str, Option], origin: Optional[Origin] = None,
                      scenario_ref: Optional[str] = None) -> Plan:
    G = scenario.cluster.gpus_per_node
    calls = {}
    for name, o in options.items():
        call = scenario.dataflow.call(name)
        continuous = call.kind == CallKind.GENERATE and o.strategy.pp == 1
        calls[name] = Placement(mesh=o.mesh.label(G), dp=o.strategy.dp, tp=o.strategy.tp, pp=o.strategy.pp,
                                micro_batches=o.strategy.micro_batches,
                                activation_checkpointing=True if o.strategy.checkpointing else None,
                                virtual_stages=o.strategy.virtual_stages if o.strategy.virtual_stages > 1 else None,
                                zero=o.strategy.zero or None, merge_lora=True if o.strategy.merge_lora else None,
                                offload_params=True if o.strategy.offload_params else None,
                                offload_optimizer=True if o.strategy.offload_optimizer else None,
                                host_adam=True if o.strategy.host_adam else None,
                                max_tokens=o.strategy.max_tokens, sp=o.strategy.sp if o.strategy.sp > 1 else None,
                                ring=o.strategy.ring or None, shard_group=o.strategy.shard_group or None,
                                slots=decode_slots(call, o) if continuous else None,
                                memory_fraction=o.strategy.memory_fraction,
                                ep=o.strategy.ep if o.strategy.ep > 1 else None, etp=o.strategy.etp or None,
                                keeps_memory=True if o.strategy.keeps_memory else None)
    staleness = scenario.dataflow.max_staleness
    return Plan(scenario=scenario_ref or scenario.name, calls=calls, max_staleness=staleness or None, origin=origin)


def resolve_plan(plan: Plan, scenario: Scenario) -> dict[str, Option]:
    """The option of every call, checked against the scenario; errors name the field."""
    names = scenario.dataflow.call_names
    for name in plan.calls:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"unknown call {name!r} ({hint}the scenario has: {', '.join(names)})", f"calls.{name}")
    for name in names:
        if name not in plan.calls:
            raise ConfigError(f"call {name!r} of the scenario has no placement", "calls")
    planned, allowed = plan.max_staleness or 0, scenario.dataflow.max_staleness
    if planned != allowed:
        raise ConfigError(f"the plan was made for max_staleness {planned}, the scenario has {allowed} "
                          "(dataflow.max_staleness, or --max-staleness)", "max_staleness")
    out = {}
    for name in names:
        p = plan.calls[name]
        call = scenario.dataflow.call(name)
        try:
            mesh = parse_mesh(p.mesh, scenario.cluster)
        except ConfigError as e:
            raise ConfigError(e.message, f"calls.{name}.mesh") from None
        micro_batches = _micro_batches_of(p, call, name)
        option = Option(mesh, Strategy(p.dp, p.tp, p.pp, micro_batches, bool(p.activation_checkpointing),
                                        p.virtual_stages or 1, p.zero or 0, bool(p.merge_lora),
                                        bool(p.offload_params), bool(p.offload_optimizer), bool(p.host_adam),
                                        p.max_tokens, p.sp or 1, _ring_of(p), p.shard_group or 0,
                                        p.memory_fraction, p.ep or 1,
                                        0 if p.etp in (None, p.tp) else p.etp,  # (etp tp's: one strategy)
                                        bool(p.keeps_memory)))
        problem = option_problem(call, scenario.models[call.model], scenario.cluster, option)
        if problem:
            raise ConfigError(problem[1], f"calls.{name}.{problem[0]}")
        out[name] = option
    return out


def _ring_of(p: Placement) -> str:
    """The placement's ring kind (Strategy.ring): `true` is what realbench wrote for ring attention
    before Megatron's p2p ring was priced beside it (allgather); false or absent, Ulysses."""
    return "allgather" if p.ring is True else (p.ring or "")


def _micro_batches_of(p: Placement, call, name: str) -> int:
    """A placement's micro-batches; for generation without a pipeline, from its decode slots where
    they are given (a replica's rows over the slots, whole), which must agree with micro_batches
    where both are."""
    if p.slots is None:
        return p.micro_batches
    if call.kind != CallKind.GENERATE or p.pp != 1:
        raise ConfigError("decode slots are a setting of generation without a pipeline (continuous batching)",
                          f"calls.{name}.slots")
    rows = call.seqs // p.dp
    if call.seqs % p.dp or rows % p.slots:
        raise ConfigError(f"a replica's {call.seqs / p.dp:g} rows do not split into decode slots of {p.slots} "
                          "(slots = rows / micro_batches)", f"calls.{name}.slots")
    m = rows // p.slots
    if "micro_batches" in p.model_fields_set and p.micro_batches != m:
        raise ConfigError(f"{p.slots} slots are {m} micro-batches of a replica's {rows} rows, and micro_batches "
                          f"says {p.micro_batches}: give one of them", f"calls.{name}.slots")
    return m


def plan_from_document(data: dict, source: str = "") -> Plan:
    if data.get("schema", PLAN_SCHEMA) != PLAN_SCHEMA:
        raise ConfigError(f"expected schema {PLAN_SCHEMA}, got {data.get('schema')!r}", "schema", source)
    try:
        return validate_model(Plan, {k: v for k, v in data.items() if k != "schema"})
    except ConfigError as e:
        raise e.in_file(source) from None


def scenario_ref(scenario_arg: str, plan_path) -> str:
    """How a plan written to `plan_path` names the scenario the user gave as `scenario_arg`: a
    built-in name as it is, a scenario file by its path relative to the plan's folder (so that
    the plan finds it from anywhere, whatever the file is called)."""
    from realbench.plan.builtin import BUILTIN

    if scenario_arg in BUILTIN or not Path(scenario_arg).is_file():
        return scenario_arg
    return os.path.relpath(Path(scenario_arg).resolve(), Path(plan_path).resolve().parent)


def _named_file(ref: str, plan_path: str) -> Optional[Path]:
    """The scenario file a plan's `scenario` names: relative to the plan's folder, else to the
    working folder; None for a built-in name."""
    for candidate in (Path(plan_path).parent / ref, Path(ref)):
        if candidate.suffix.lower() in (".yaml", ".yml", ".json") and candidate.is_file():
            return candidate
    return None


def _names(plan: Plan, scenario: Scenario, plan_path: str) -> bool:
    """Whether the plan is for `scenario`: it names it, or names a file that holds it."""
    if plan.scenario == scenario.name:
        return True
    file = _named_file(plan.scenario, plan_path)
    if file is None:
        return False
    try:
        return read_document(file).get("name") == scenario.name
    except ConfigError:
        return False


def load_plan(path: str, scenario: Optional[Scenario] = None) -> tuple[Plan, Scenario, dict[str, Option]]:
    """Read and check a plan file. Without `scenario`, the one the plan names is loaded
    (a built-in name, or a file path relative to the plan's folder), with the plan's
    max_staleness (a plan searched with --max-staleness)."""
    plan = plan_from_document(read_document(path), path)
    try:
        if scenario is None:
            file = _named_file(plan.scenario, path)
            scenario = load_scenario(str(file) if file is not None else plan.scenario)
            if (plan.max_staleness or 0) != scenario.dataflow.max_staleness:  # the plan says how it runs
                scenario = scenario.with_staleness(plan.max_staleness or 0)
        elif not _names(plan, scenario, path):
            raise ConfigError(f"the plan is for scenario {plan.scenario!r}, not {scenario.name!r}", "scenario")
        return plan, scenario, resolve_plan(plan, scenario)
    except ConfigError as e:
        raise (e if e.source else e.in_file(path)) from None


def runtime_expert_problem(scenario: Scenario, name: str, option: Option) -> Optional[tuple[str, str]]:
    """(field, reason) where realbench's runtime does not lay a mixture of experts out as the option
    says, or None: it splits the experts over data-parallel replicas (ep dividing dp), each expert
    as tp splits a dense MLP (etp tp's), and generates with every expert on every replica (ep 1);
    the load-balancing loss it computes with the whole model on one stage."""
    s, call = option.strategy, scenario.dataflow.call(name)
    model = scenario.models[call.model]
    if s.etp not in (0, s.tp):
        return "etp", (f"realbench's runtime splits each expert as tp splits a dense MLP (etp {s.tp}); etp {s.etp} "
                       "is priced for Megatron")
    if s.ep > 1 and call.kind == CallKind.GENERATE:
        return "ep", ("realbench's runtime generates with every expert on every replica (ep 1); expert-parallel "
                      "generation is priced for vLLM and SGLang")
    if s.dp % s.ep:
        return "ep", f"realbench's runtime splits the experts over data-parallel replicas: ep {s.ep} must divide dp {s.dp}"
    moe = getattr(model, "moe", None)
    if moe is not None and moe.aux_loss_coef and call.kind == CallKind.TRAIN and s.pp > 1:
        return "pp", ("the load-balancing loss (output_router_logits) is computed over every layer of a forward: "
                      "realbench's runtime computes it with the whole model on one stage (pp 1)")
    return None


def refuse_unrunnable(scenario: Scenario, options: dict[str, Option]) -> None:
    """Refuse by name what realbench's runtime does not run: a scenario an engine runs (`engine`),
    data-parallel sharding (ZeRO / FSDP) and the engines' host-memory modes (offloaded parameters or
    optimizer states, Adam on the host), which the cost model prices for the engines; a model the
    runtime does not compute (an architecture, or a part of one: `ModelSpec.runtime_problem`), or
    whose weights are not there to load (read from its config alone, a missing safetensors file)."""
    from realbench.models.hf import check_weights

    if scenario.engine:
        raise ConfigError(f"the scenario is {scenario.engine}'s: realbench plans it, {scenario.engine} runs it "
                          f"(realbench export --format {scenario.engine})", "engine")
    if "teacher_inf" in scenario.dataflow.call_names:
        raise ConfigError("on-policy distillation (a teacher's log-probabilities in the actor's loss) is priced, "
                          "searched and exported for verl; realbench's runtime does not compute it",
                          "dataflow.with_teacher")
    for role, model in scenario.models.items():
        if isinstance(model, ModelSpec):
            problem = model.runtime_problem()
            if problem:
                raise ConfigError(f"{model.name}: {problem}", f"models.{role}")
            check_weights(model, role)
    for name, o in options.items():
        if o.strategy.zero:
            raise ConfigError(f"zero {o.strategy.zero}: realbench's runtime keeps every replica's weights, "
                              "gradients and optimizer states whole; ZeRO / FSDP layouts are priced for the engines "
                              "that run them (verl, OpenRLHF, AReaL)", f"calls.{name}.zero")
        if o.strategy.keeps_memory:
            raise ConfigError("realbench's runtime frees its rollout's KV cache after generating; a serving engine "
                              "that keeps its memory through the step is priced for the engines that run one (verl, "
                              "OpenRLHF)", f"calls.{name}.keeps_memory")
        if o.strategy.memory_fraction is not None:
            raise ConfigError("realbench's runtime preallocates its rollout's KV cache for its decode slots; a serving "
                              "engine's share of each GPU's memory is priced for the engines that run one (verl, "
                              "OpenRLHF, AReaL)", f"calls.{name}.memory_fraction")
        problem = runtime_expert_problem(scenario, name, o)
        if problem:
            raise ConfigError(problem[1], f"calls.{name}.{problem[0]}")
        model = scenario.models[scenario.dataflow.call(name).model]
        if isinstance(model, ModelSpec) and model.n_kv_heads % o.strategy.tp:
            raise ConfigError(f"tp {o.strategy.tp} beyond the {model.n_kv_heads} KV heads of {model.name}: realbench's "
                              "runtime splits the KV heads over tp; their replicas are priced for vLLM and SGLang",
                              f"calls.{name}.tp")
        for field in ("offload_params", "offload_optimizer", "host_adam"):
            if getattr(o.strategy, field):
                raise ConfigError("realbench's runtime keeps a model's weights and optimizer states on its devices and "
                                  "runs Adam there; host memory is priced for the engines that use it (verl, OpenRLHF)",
                                  f"calls.{name}.{field}")
