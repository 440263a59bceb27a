"""Which (mesh, strategy) options a call may use, and the size of the plan space.

Rules (REAL.md section 4), for a call of `seqs` sequences on a model with `n_heads` heads:
  * dp * tp * pp == mesh size;
  * tp divides the devices per node (a tensor-parallel group stays inside a node) and divides
    both the attention heads and the KV heads (a generation's tp may also be a multiple of the KV
    heads, each replicated on tp / n_kv_heads devices, as vLLM and SGLang do);
  * 1 <= pp <= number of layers;
  * the batch splits evenly into dp x micro_batches (per optimizer step for train calls), each
    piece of whole examples (`rows_together` rows: DPO's pairs stay on one rank and in one
    micro-batch, since the loss compares a pair's two responses);
  * micro_batches is any count that divides a replica's batch (Megatron's SC21 runs used
    hundreds); the search offers the powers of two up to SEARCHED_MICRO_BATCHES and, with a
    pipeline (pp > 1, where a depth of p idles (p - 1) / (m + p - 1) of a pass), pp, 2pp, 4pp
    and the largest count, one row (or example) per micro-batch (`micro_batch_counts`);
  * train calls may checkpoint activations (recompute each layer in the backward pass), others not;
  * a train call on a pipeline may run the interleaved 1F1B schedule (Megatron's virtual pipeline
    stages): each rank holds `virtual_stages` chunks of layers, round robin, which needs the
    layers to split evenly into pp x virtual_stages chunks and, as in Megatron, the micro-batches
    into groups of pp. The search offers 2, 3 and 4 where they are valid (SEARCHED_VIRTUAL_STAGES).
"""

from __future__ import annotations

import bisect
import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator, Optional

from realbench.dataflow import CallDef, CallKind
from realbench.hardware import ClusterSpec
from realbench.models import FunctionSpec, ModelSpec
from realbench.plan.mesh import RING_KINDS, Mesh, Option, Strategy, mesh_problem

SEARCHED_MICRO_BATCHES = 16  # powers of two up to this, for every layout
SEARCHED_VIRTUAL_STAGES = (2, 3, 4)  # interleaved schedules offered to train calls on pipelines


def virtual_stage_counts(n_layers: int, pp: int, micro_batches: int) -> tuple[int, ...]:
    """The virtual stage counts the search offers a train call: 1, and where the layers split into
    pp x v chunks and the micro-batches into groups of pp, each of SEARCHED_VIRTUAL_STAGES."""
    if pp == 1 or micro_batches % pp:
        return (1,)
    return (1,) + tuple(v for v in SEARCHED_VIRTUAL_STAGES if n_layers % (pp * v) == 0)


def decode_slots(call: CallDef, option: Option) -> int:
    """A replica's decode slots under continuous batching (generation without a pipeline): its
    rows over the micro-batches (the rows one micro-batch of the micro-batched loop decodes)."""
    s = option.strategy
    return max(1, math.ceil(call.seqs / s.dp / s.micro_batches))


@lru_cache(maxsize=1024)
def served_call(call: CallDef, s: Strategy) -> CallDef:
    """The call as the strategy serves it: a plan's share of each GPU's memory for its serving
    engine (Strategy.memory_fraction) over the scenario's (CallDef.memory_fraction); on a scenario
    that names none, the plan's share makes the generation a serving engine's."""
    if s.memory_fraction is None or call.kind != CallKind.GENERATE or s.memory_fraction == call.memory_fraction:
        return call
    return call.model_copy(update={"memory_fraction": s.memory_fraction})


def memory_fraction_problem(call: CallDef, s: Strategy) -> Optional[str]:
    """Why this call cannot take the strategy's share of each GPU's memory, or None."""
    if call.kind != CallKind.GENERATE:
        return "a share of each GPU's memory is a serving engine's: a generation's"
    if not 0 < s.memory_fraction <= 1:
        return f"memory_fraction {s.memory_fraction:g} is not a share of a GPU's memory in (0, 1]"
    return None


def micro_batch_counts(per_replica: int, pp: int) -> list[int]:
    """The micro-batch counts the search offers a replica of `per_replica` rows (or examples) on
    a pipeline of depth pp: the powers of two up to SEARCHED_MICRO_BATCHES (what the memory of
    a layout without a pipeline needs), and with a pipeline pp, 2pp, 4pp and per_replica (the
    bubble shrinks as m grows); each one that divides per_replica."""
    counts = {1 << e for e in range(SEARCHED_MICRO_BATCHES.bit_length())}
    if pp > 1:
        counts |= {pp, 2 * pp, 4 * pp, per_replica}
    return sorted(m for m in counts if m <= per_replica and per_replica % m == 0)


def host_adam_problem(call: CallDef, s: Strategy) -> Optional[str]:
    """Why Adam cannot run on the host for this call (DeepSpeed's ZeRO-Offload), or None."""
    if call.kind != CallKind.TRAIN:
        return "Adam on the host (DeepSpeed's ZeRO-Offload) is a train call's optimizer"
    if s.zero == 0 and s.dp > 1:
        # (stage 0 wraps bf16 in an optimizer whose fp32 copies stay on the device: CPU Adam's
        # step refuses them, deepspeed 0.19.6 runtime/fp16/unfused_optimizer.py:77, ops/adam/cpu_adam.py:138)
        return "Adam on the host is DeepSpeed's ZeRO-Offload: it needs a ZeRO optimizer (zero 1 to 3)"
    if s.offload_optimizer or s.offload_params:
        return "Adam on the host keeps its states there for good: no offload_optimizer or offload_params beside it"
    return None


def max_tokens_problem(call: CallDef, s: Strategy) -> Optional[str]:
    """Why this call's micro-batches cannot be formed by tokens within s.max_tokens, or None."""
    if call.kind == CallKind.GENERATE or not call.padding_free:
        return ("micro-batches formed by tokens are an engine's packing of an inference or train call's rows "
                "without padding (training.padding_free)")
    if s.max_tokens * s.sp < call.seq_len:  # (a Ulysses group's budget: each device's)
        held = f"{s.max_tokens} tokens" + (f" a device of a sequence-parallel group of {s.sp}" if s.sp > 1 else "")
        return (f"{held} do not hold a whole row of {call.seq_len} (the engines refuse a budget below the longest "
                "row)")
    return None


def served_by_an_engine(call: CallDef) -> bool:
    """Whether a serving engine (vLLM, SGLang) computes the call: a generation, or a forward marked
    served (CallDef.served). Its KV heads may be replicated over tp beyond them (heads_split), and a
    mixture of experts' experts spread over its replicas."""
    return call.kind == CallKind.GENERATE or call.served


def heads_split(model: ModelSpec, tp: int, generating: bool = False) -> bool:
    """Whether tp devices split the model's heads: tp divides the attention heads and the KV heads;
    `generating` (a generation, or a forward a serving engine computes: CallDef.served), the KV heads
    may instead divide tp (each replicated on tp / n_kv_heads devices, as vLLM and SGLang do;
    Megatron and realbench's runtime split them)."""
    return model.n_heads % tp == 0 and (model.n_kv_heads % tp == 0 or (generating and tp % model.n_kv_heads == 0))


def strategy_problem(call: CallDef, model: ModelSpec | FunctionSpec, cluster: ClusterSpec, mesh: Mesh,
                     s: Strategy) -> Optional[tuple[str, str]]:
    """(field, reason) why `s` cannot run `call` on `mesh`, or None. Fields name plan keys.
    A reward function has no model to split: its processes share the responses (dp only)."""
    if min(s.dp, s.tp, s.pp, s.micro_batches, s.virtual_stages, s.sp) < 1:
        return "dp", "dp, tp, pp, sp, micro_batches and virtual_stages must be at least 1"
    if s.size != mesh.size:
        named = f"dp*sp*tp*pp = {s.dp}*{s.sp}*{s.tp}*{s.pp}" if s.sp > 1 else f"dp*tp*pp = {s.dp}*{s.tp}*{s.pp}"
        return "dp", f"{named} = {s.size} but the mesh has {mesh.size} device(s)"
    if isinstance(model, FunctionSpec):
        if (s.tp, s.pp, s.micro_batches, s.virtual_stages, s.zero, s.merge_lora, s.offload_params,
                s.offload_optimizer, s.host_adam, s.max_tokens, s.sp, s.ring, s.shard_group, s.memory_fraction,
                s.ep, s.etp, s.keeps_memory) != (1, 1, 1, 1, 0, False, False, False, False, None, 1, "", 0, None, 1, 0,
                                                 False):
            return "dp", f"a reward function ({model.name}) splits its responses over dp only: tp, pp and micro_batches are 1"
        if call.seqs % s.dp:
            return "dp", f"the batch of {call.seqs} responses does not split into dp = {s.dp}"
        return None
    served = served_by_an_engine(call)
    if cluster.gpus_per_node % s.tp and not (served and s.tp % cluster.gpus_per_node == 0):
        beyond = " (a serving engine's tp may span whole nodes)" if served else ""
        return "tp", f"tp {s.tp} does not divide the {cluster.gpus_per_node} devices of a node{beyond}"
    if not heads_split(model, s.tp, generating=served):
        beyond = " (or, generating, a multiple of the KV heads)" if call.kind == CallKind.GENERATE else ""
        return "tp", (f"tp {s.tp} does not divide the {model.n_heads} attention heads and "
                      f"{model.n_kv_heads} KV heads of {model.name}{beyond}")
    if s.pp > model.n_layers:
        return "pp", f"pp {s.pp} exceeds the {model.n_layers} layers of {model.name}"
    if s.ep != 1 or s.etp:
        problem = expert_problem(call.kind, model, s)
        if problem:
            return problem
    if s.zero:
        problem = zero_problem(call, s)
        if problem:
            return "zero", problem
    if s.shard_group:
        problem = shard_group_problem(cluster, s)
        if problem:
            return "shard_group", problem
    if s.ring and s.ring not in RING_KINDS:
        return "ring", f"{s.ring!r} is not a ring kind ({', '.join(RING_KINDS)})"
    if s.ring and s.sp == 1:
        return "ring", "ring attention splits a sequence over a group: sp 2 or more"
    if s.sp > 1:
        problem = sequence_parallel_problem(call, model, cluster, s)
        if problem:
            return "sp", problem
    if s.offload_params and (call.kind == CallKind.GENERATE or s.zero == 2 or (call.kind == CallKind.INFERENCE
                                                                              and s.zero not in (0, 3))):
        return "offload_params", ("parameters in host memory are a forward-only model's (an inference call's: FSDP's "
                                  "CPU offload under zero 3, verl's Megatron param_offload under zero 0) or verl's "
                                  "param_offload of a trained one (a train call's, under zero 3, or Megatron's 0 or 1)")
    if s.offload_params and call.kind == CallKind.TRAIN and model.lora is not None:
        return "offload_params", "a LoRA model's parameters in host memory between calls are not priced"
    if s.offload_optimizer and call.kind != CallKind.TRAIN:
        return "offload_optimizer", ("optimizer states in host memory between updates are verl's "
                                     "optimizer_offload: a train call's")
    if s.host_adam:
        problem = host_adam_problem(call, s)
        if problem:
            return "host_adam", problem
    if s.max_tokens is not None:
        problem = max_tokens_problem(call, s)
        if problem:
            return "max_tokens", problem
    if s.keeps_memory and (call.kind != CallKind.GENERATE or served_call(call, s).memory_fraction is None):
        return "keeps_memory", ("a server keeping its memory through the step is a serving engine's: a generation's "
                                "with a share of each GPU's memory (memory_fraction)")
    if s.memory_fraction is not None:
        problem = memory_fraction_problem(call, s)
        if problem:
            return "memory_fraction", problem
    if s.merge_lora:
        problem = merge_problem(call, model)
        if problem:
            return "merge_lora", problem
    if s.checkpointing and call.kind != CallKind.TRAIN:
        return "activation_checkpointing", "activation checkpointing is for train calls (it saves backward memory)"
    if s.virtual_stages > 1:
        v = s.virtual_stages
        if call.kind != CallKind.TRAIN:
            return "virtual_stages", "virtual pipeline stages are a schedule of train calls (interleaved 1F1B)"
        if s.pp == 1:
            return "virtual_stages", "virtual pipeline stages need a pipeline (pp > 1)"
        if model.n_layers % (s.pp * v):
            return "virtual_stages", (f"the {model.n_layers} layers of {model.name} do not split into "
                                      f"pp*virtual_stages = {s.pp}*{v} chunks")
        if s.micro_batches % s.pp:
            return "virtual_stages", (f"the interleaved schedule runs micro-batches in groups of pp = {s.pp}: "
                                      f"micro_batches {s.micro_batches} is not a multiple of it")
    batch = call.seqs // call.optimizer_steps
    unit, whole = call.rows_together, f" of whole {call.rows_together}-row examples" if call.rows_together > 1 else ""
    if batch % (s.dp * unit):
        return "dp", f"the batch of {batch} sequences does not split into dp = {s.dp} shards{whole}"
    if batch % (s.dp * s.micro_batches * unit):
        return "micro_batches", (f"the batch of {batch} sequences does not split into "
                                 f"dp*micro_batches = {s.dp}*{s.micro_batches} pieces{whole}")
    # an engine's serving engine (whether its share of the GPU holds a whole sequence is the cost
    # model's: realbench.cost.calls.serving_cache_problem)
    if call.kind == CallKind.GENERATE and served_call(call, s).memory_fraction is not None and s.pp > 1:
        return "pp", "realbench prices an engine's rollout server without pipeline parallelism (pp 1)"
    return None


def expert_problem(kind: CallKind, model: ModelSpec, s: Strategy) -> Optional[tuple[str, str]]:
    """(field, reason) why a call of `kind` cannot split its model's experts so (Strategy.ep, etp), or None.
    Train and inference calls (Megatron's parallel folding, as verl's and AReaL's Megatron
    engines run it): ep x etp devices hold a whole set of experts, folded out of a pipeline stage's
    dp x sp x tp devices, under Megatron's sharding (zero 0, or 1: its distributed optimizer; FSDP
    and DeepSpeed shard experts as any weight). Generation (vLLM's and SGLang's expert parallelism,
    verl's rollout expert_parallel_size): each expert whole (etp 1) on one of ep devices, ep a
    multiple of tp (a deployment of ep / tp data-parallel attention replicas, verl's
    data_parallel_size) dividing the call's dp x tp devices, without a pipeline."""
    if model.moe is None:
        return ("ep" if s.ep != 1 else "etp"), f"expert parallelism splits a mixture of experts: {model.name} has none"
    if s.ep < 1 or s.etp < 0:
        return "ep", "ep and etp are at least 1"
    E, f = model.moe.experts, model.moe.expert_ffn
    if E % s.ep:
        return "ep", f"the {E} experts of {model.name} do not split over ep {s.ep}"
    if f % s.expert_tp:
        return "etp", f"an expert's width {f} does not split over etp {s.expert_tp}"
    if kind == CallKind.GENERATE:
        if s.ep == 1:
            if s.etp:
                return "etp", "generation without expert parallelism splits each expert as tp splits it: leave etp out"
            return None
        if s.expert_tp != 1:
            return "etp", "generation's expert parallelism holds each expert whole on one device: etp 1"
        if s.ep % s.tp or (s.dp * s.tp) % s.ep:
            return "ep", (f"generation's expert parallelism spans whole replicas of tp {s.tp} (ep a multiple of tp) "
                          f"within the call's dp x tp = {s.dp * s.tp} devices")
        if s.pp > 1:
            return "ep", "generation's expert parallelism runs without a pipeline (pp 1)"
        return None
    group = s.dp * s.sp * s.tp
    if group % (s.ep * s.expert_tp):
        return "ep", (f"ep x etp = {s.ep} x {s.expert_tp} does not divide a pipeline stage's dp x sp x tp = {group} "
                      "devices (Megatron folds the experts out of them)")
    if s.zero > 1:
        return "zero", f"zero {s.zero} shards experts as any weight (FSDP, DeepSpeed): expert parallelism is Megatron's " \
                       "(zero 0, or 1: its distributed optimizer)"
    if s.sp > 1 and s.ring != "p2p":
        return "ep", "expert parallelism beside sequence parallelism is Megatron's, with context parallelism (ring: p2p)"
    return None


def merge_problem(call: CallDef, model: ModelSpec) -> Optional[str]:
    """Why a call cannot receive its model's LoRA adapters merged into the base weights, or None."""
    if model.lora is None:
        return f"{model.name} has no LoRA adapters to merge (models.<role>.lora)"
    if call.kind == CallKind.TRAIN:
        return "a train call holds the frozen base and trains the adapters: merging is for the calls it feeds"
    if not call.adapters:
        return "the call runs the base alone (adapters: false): nothing to merge"
    return None


def zero_problem(call: CallDef, s: Strategy) -> Optional[str]:
    """Why a call cannot shard its model over data parallelism this way (realbench.cost.sharding),
    or None: stages 1 and 2 shard what training holds (optimizer states, gradients); stage 3 the
    weights too, also for a forward-only call (FSDP's and ZeRO-3's inference: each layer gathered
    when it runs); generation holds whole tensor-parallel shards, as the rollout engines do; stages
    2 and 3 do not run under pipeline parallelism (DeepSpeed refuses them with its pipeline engine;
    FSDP has none), stage 1 does (Megatron's distributed optimizer)."""
    if s.zero not in (1, 2, 3):
        return f"zero is 0, 1, 2 or 3, not {s.zero}"
    if call.kind == CallKind.GENERATE:
        return "generation holds whole tensor-parallel shards of the weights: zero is for train and inference calls"
    if s.zero < 3 and call.kind != CallKind.TRAIN:
        return f"zero {s.zero} shards optimizer states (and gradients): a train call's; forward-only calls shard with zero 3"
    if s.zero >= 2 and s.pp > 1:
        return f"zero {s.zero} does not run with pipeline parallelism (pp {s.pp}): only zero 1 does"
    if s.shards == 1:
        return "zero shards over data parallelism: dp is 1"
    return None


def straddles_nodes(span: int, per_node: int) -> bool:
    """Whether a group of `span` consecutive devices, laid from a node's start, can sit astride two
    nodes: it neither divides a node nor spans whole ones."""
    return bool(per_node % span if span <= per_node else span % per_node)


def shard_group_problem(cluster: ClusterSpec, s: Strategy) -> Optional[str]:
    """Why the state cannot be sharded within groups of s.shard_group devices (hybrid sharding:
    realbench.cost.sharding), or None. FSDP's (zero 2 or 3: HYBRID_SHARD and its zero-2 form); the
    groups split dp x sp evenly (verl's device mesh, workers/engine/fsdp/utils.py:35-53, is
    (dp x sp / fsdp_size, fsdp_size)) into more than one; a group of shard_group x tp consecutive
    devices divides a node or spans whole ones, as the cost model prices its collectives."""
    f, d = s.shard_group, s.shards
    if s.zero not in (2, 3):
        return "hybrid sharding is FSDP's: zero 2 or 3"
    if f < 1 or f >= d or d % f:
        return (f"shard_group {f} does not split the {d} devices of dp x sp into equal groups of fewer (all of "
                "them is full sharding: leave shard_group out)")
    span, G = f * s.tp, cluster.gpus_per_node
    if straddles_nodes(span, G):
        return (f"a shard group of {span} consecutive devices neither divides a node of {G} nor spans whole ones")
    return None


def sequence_parallel_problem(call: CallDef, model: ModelSpec, cluster: ClusterSpec, s: Strategy) -> Optional[str]:
    """Why a call cannot split its sequences over s.sp devices (Ulysses, or ring attention by
    s.ring's kind: realbench.cost.calls), or None: a forward or training.
    * Ulysses: an FSDP layout's (zero 2 or 3, no tensor or pipeline parallelism, as verl runs it:
      workers/engine/fsdp/transformer_impl.py:242-252), the group inside a node (its all-to-alls
      priced over NVLink), the heads split over the group: every query head's group whole, the KV
      heads split too or repeated up to the group (verl asserts both, models/transformers/
      monkey_patch.py:343-350).
    * allgather (OpenRLHF's DeepSpeed, a (dp, sp, tp) mesh): beside DeepSpeed's tp, without
      pipeline parallelism, under any sharding.
    * p2p (Megatron's context parallelism): beside any tp and pp, under Megatron's sharding (zero
      0, or 1: its distributed optimizer).
    Both order ranks tp innermost, so a ring is tp x sp consecutive devices, which must divide a
    node or span whole ones (its exchanges then cross them; a layout of whole nodes, such as 3,
    could otherwise put a ring astride two). Every device keeps its tp share of the heads."""
    how = {"allgather": "ring attention", "p2p": "context parallelism (a p2p ring)"}.get(
        s.ring, "Ulysses sequence parallelism")
    if call.kind == CallKind.GENERATE:
        return f"{how} splits a forward's sequences: an inference or train call's, not generation's"
    G = cluster.gpus_per_node
    if s.ring:
        if s.ring == "p2p" and s.zero > 1:
            return f"{how} runs under Megatron's sharding: zero 0 or 1 (its distributed optimizer)"
        if s.ring == "allgather" and s.pp > 1:
            return f"{how} runs under DeepSpeed, which has no pipeline parallelism: pp 1"
        span = s.tp * s.sp
        if straddles_nodes(span, G):
            return (f"a ring of tp x sp = {span} devices neither divides a node of {G} nor spans whole ones "
                    "(tp innermost, as Megatron and OpenRLHF order ranks, makes it consecutive devices)")
        return None  # (every device keeps its tp share of the heads: nothing more to split)
    if s.zero not in (2, 3) or (s.tp, s.pp) != (1, 1):
        return "Ulysses sequence parallelism runs under FSDP: zero 2 or 3, tp 1 and pp 1"
    if G % s.sp:
        return f"sp {s.sp} does not divide the {G} devices of a node (its group stays inside one)"
    if model.n_heads % s.sp or (model.n_kv_heads % s.sp and s.sp % model.n_kv_heads):
        return (f"sp {s.sp} does not split the {model.n_heads} attention heads and {model.n_kv_heads} KV heads of "
                f"{model.name} (each divisible by it, or the KV heads dividing it)")
    return None


def option_problem(call: CallDef, model: ModelSpec, cluster: ClusterSpec, option: Option
                   ) -> Optional[tuple[str, str]]:
    problem = mesh_problem(option.mesh, cluster)
    if problem:
        return "mesh", problem
    return strategy_problem(call, model, cluster, option.mesh, option.strategy)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def strategies_for(call: CallDef, model: ModelSpec, cluster: ClusterSpec, mesh: Mesh, zero: bool = False
                   ) -> list[Strategy]:
    """All strategies valid for `call` on `mesh` (they do not depend on the mesh's position);
    with `zero`, the data-parallel sharding stages too (enumerate_options)."""
    return list(_strategies(call, model, cluster, mesh.size, zero))


@lru_cache(maxsize=4096)
def _strategies(call: CallDef, model: ModelSpec, cluster: ClusterSpec, size: int, zero: bool = False
                ) -> tuple[Strategy, ...]:
    out = []
    probe = Mesh(0, 1, 0, size)  # only the size matters to strategy_problem
    layers = getattr(model, "n_layers", 1)
    batch = call.seqs // call.optimizer_steps
    # a LoRA model's generation and inference: the adapters alone to a kept base copy, or merged
    merges = (False, True) if isinstance(model, ModelSpec) and merge_problem(call, model) is None else (False,)
    # the sharding stages a call may take (zero_problem keeps those its dp and pp allow)
    stages = (0,) if not zero else (0, 1, 2, 3) if call.kind == CallKind.TRAIN else \
        (0, 3) if call.kind == CallKind.INFERENCE else (0,)
    # with the engines' sharding, FSDP's Ulysses groups too (sequence_parallel_problem keeps those
    # its heads and zero allow)
    node = math.gcd(size, cluster.gpus_per_node)
    ulysses = tuple(sp for sp in divisors(node) if sp > 1) if zero and call.kind != CallKind.GENERATE else ()
    for tp in divisors(node):
        # (KV heads replicated beyond tp = n_kv_heads: the serving engines' generation, offered with the
        # engines' sharding; realbench's runtime splits them)
        if isinstance(model, ModelSpec) and model.n_kv_heads % tp and not zero:
            continue
        for pp in divisors(size // tp):
            for sp in (1, *ulysses) if (tp, pp) == (1, 1) else (1,):
                dp = size // tp // pp // sp
                if pp > layers or batch % (dp * call.rows_together):  # what strategy_problem refuses, skipped cheaply
                    continue
                for m in micro_batch_counts(batch // (dp * call.rows_together), pp):
                    train = call.kind == CallKind.TRAIN
                    for checkpointing in ((False, True) if train else (False,)):
                        for v in virtual_stage_counts(layers, pp, m) if train else (1,):
                            for merge in merges:
                                for stage in stages if dp * sp > 1 else (0,):
                                    for ep, etp in expert_layouts(call, model, dp, sp, tp, zero):
                                        s = Strategy(dp, tp, pp, m, checkpointing, v, zero=stage, merge_lora=merge,
                                                     sp=sp, ep=ep, etp=etp)
                                        if strategy_problem(call, model, cluster, probe, s) is None:
                                            out.append(s)
    return tuple(out)


def expert_layouts(call: CallDef, model, dp: int, sp: int, tp: int, engines: bool) -> tuple[tuple[int, int], ...]:
    """The (ep, etp) a search offers a call of a mixture of experts on dp x sp x tp devices a stage
    (expert_problem keeps the valid ones; (1, 0) for any other model): realbench's runtime splits
    the experts over data-parallel replicas (ep dividing dp, each expert split as tp splits it);
    with the engines' strategies, Megatron's folding (ep x etp dividing dp x sp x tp, etp tp's or 1)
    and the serving engines' expert parallelism over whole tp replicas (etp 1)."""
    moe = getattr(model, "moe", None)
    if moe is None:
        return ((1, 0),)
    E = moe.experts
    if call.kind == CallKind.GENERATE:
        return ((1, 0),) + (tuple((k * tp, 1) for k in divisors(dp) if k * tp > 1 and E % (k * tp) == 0)
                            if engines else ())
    if not engines:
        return tuple((ep, 0) for ep in divisors(math.gcd(dp, E)))
    out = []
    for etp in ((0, 1) if tp > 1 else (0,)):
        width = etp or tp
        out += [(ep, etp) for ep in divisors(math.gcd(dp * sp * tp // width, E))]
    return tuple(out)


@dataclass(frozen=True)
class Block:
    """The options of one mesh shape: `gpus` devices on each of `nodes` nodes (an aligned block
    inside a node when nodes == 1, whole consecutive nodes otherwise), at every position the
    cluster has for it, each with every strategy the shape accepts. Position-major: option
    `base + p * len(strategies) + s` is strategy s on the mesh at position p. What a call costs
    depends on the shape and the strategy, not on the position, so a cost model computes it once
    per block and strategy."""

    nodes: int
    gpus: int
    positions: int
    strategies: tuple[Strategy, ...]
    base: int

    @property
    def size(self) -> int:
        return self.nodes * self.gpus

    def __len__(self) -> int:
        return self.positions * len(self.strategies)

    def mesh(self, position: int, gpus_per_node: int) -> Mesh:
        if self.nodes > 1:
            return Mesh(position, self.nodes, 0, gpus_per_node)
        node, slot = divmod(position, gpus_per_node // self.gpus)
        return Mesh(node, 1, slot * self.gpus, self.gpus)

    def position(self, mesh: Mesh, gpus_per_node: int) -> int:
        return mesh.node if self.nodes > 1 else mesh.node * (gpus_per_node // self.gpus) + mesh.gpu // self.gpus

    def starts(self, gpus_per_node: int):
        """First device of the mesh at every position (numpy, int64)."""
        import numpy as np

        if self.nodes > 1:
            return np.arange(self.positions, dtype=np.int64) * gpus_per_node
        return np.arange(self.positions, dtype=np.int64) * self.gpus


def _positions(cluster: ClusterSpec, nodes: int, gpus: int) -> int:
    """How many meshes of `nodes` nodes of `gpus` devices the cluster has: runs of whole
    consecutive nodes, or aligned blocks inside each node."""
    return cluster.nodes - nodes + 1 if nodes > 1 else cluster.nodes * (cluster.gpus_per_node // gpus)


class OptionSet(Sequence):
    """Every feasible option of a call, in the order of `all_meshes` (smallest meshes first, then
    by position), each mesh with its strategies, without making them: a cluster of 512 nodes
    offers millions. Options are computed from their index (`[k]`) and indices from options
    (`index`); the numbers a cost model needs are computed per `Block` and spread over
    positions with numpy."""

    def __init__(self, call: CallDef, model: ModelSpec | FunctionSpec, cluster: ClusterSpec, zero: bool = False):
        self.cluster = cluster
        G, N = cluster.gpus_per_node, cluster.nodes
        shapes = [(1, g) for g in (1 << e for e in range(G.bit_length())) if g <= G]
        shapes += [(k, G) for k in range(2, N + 1)]
        blocks, base = [], 0
        for nodes, gpus in shapes:
            strategies = _strategies(call, model, cluster, nodes * gpus, zero)
            positions = _positions(cluster, nodes, gpus)
            if strategies:
                blocks.append(Block(nodes, gpus, positions, strategies, base))
                base += positions * len(strategies)
        self.call, self.model = call, model
        self.blocks = blocks
        self._length = base
        self._bases = [b.base for b in blocks]
        self._by_shape = {(b.nodes, b.gpus): j for j, b in enumerate(blocks)}
        self._strategy_index = [{s: i for i, s in enumerate(b.strategies)} for b in blocks]
        self._added: dict[tuple[int, int, Strategy], int] = {}  # (nodes, gpus, strategy) -> its block

    def with_option(self, option: Option) -> "OptionSet":
        """These options and every placement of `option`'s strategy on meshes of its shape: a
        valid plan may use a strategy the search does not offer (a micro-batch count of its own),
        and its estimate needs an index. The new strategy's block comes after the others, so the
        indices of the options already here do not change."""
        problem = option_problem(self.call, self.model, self.cluster, option)
        if problem:
            raise ValueError(f"{option} is not valid for this call: {problem[1]}")
        if option in self:
            return self
        out = copy.copy(self)
        nodes, gpus = option.mesh.nodes, option.mesh.gpus
        block = Block(nodes, gpus, _positions(self.cluster, nodes, gpus), (option.strategy,), self._length)
        out.blocks = self.blocks + [block]
        out._length = self._length + len(block)
        out._bases = self._bases + [block.base]
        out._strategy_index = self._strategy_index + [{option.strategy: 0}]
        out._added = {**self._added, (nodes, gpus, option.strategy): len(self.blocks)}
        return out

    def __len__(self) -> int:
        return self._length

    def locate(self, k: int) -> tuple[int, int, int]:
        """(block, position, strategy index) of option k."""
        if not -self._length <= k < self._length:
            raise IndexError(f"option {k} of {self._length}")
        k %= self._length
        j = bisect.bisect_right(self._bases, k) - 1
        b = self.blocks[j]
        p, s = divmod(k - b.base, len(b.strategies))
        return j, p, s

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self._length))]
        j, p, s = self.locate(int(k))
        b = self.blocks[j]
        return Option(b.mesh(p, self.cluster.gpus_per_node), b.strategies[s])

    def __iter__(self) -> Iterator[Option]:
        G = self.cluster.gpus_per_node
        for b in self.blocks:
            for p in range(b.positions):
                mesh = b.mesh(p, G)
                for s in b.strategies:
                    yield Option(mesh, s)

    def strategy_ids(self, k):
        """Per option index (numpy): a number that two options share exactly when they have the
        same strategy (blocks differ in device count, so a strategy belongs to one block)."""
        import numpy as np

        k = np.asarray(k, dtype=np.int64)
        j = np.searchsorted(self._bases, k, side="right") - 1
        n_s = np.array([len(b.strategies) for b in self.blocks], dtype=np.int64)
        return j * int(n_s.max()) + (k - np.asarray(self._bases, dtype=np.int64)[j]) % n_s[j]

    def block_of(self, mesh: Mesh) -> Optional[int]:
        return self._by_shape.get((mesh.nodes, mesh.gpus))

    def index(self, option: Option, start: int = 0, stop: Optional[int] = None) -> int:
        j = self.block_of(option.mesh)
        s = self._strategy_index[j].get(option.strategy) if j is not None else None
        if s is None:  # a strategy added by `with_option`
            j = self._added.get((option.mesh.nodes, option.mesh.gpus, option.strategy))
            s = None if j is None else 0
        if s is None or mesh_problem(option.mesh, self.cluster):
            raise ValueError(f"{option} is not an option of this call")
        b = self.blocks[j]
        return b.base + b.position(option.mesh, self.cluster.gpus_per_node) * len(b.strategies) + s

    def __contains__(self, option) -> bool:
        try:
            self.index(option)
        except (ValueError, AttributeError):
            return False
        return True

    def on_mesh(self, mesh: Mesh) -> range:
        """The indices of the options on `mesh` (empty when the call has none there)."""
        j = self.block_of(mesh)
        if j is None or mesh_problem(mesh, self.cluster):
            return range(0)
        b = self.blocks[j]
        first = b.base + b.position(mesh, self.cluster.gpus_per_node) * len(b.strategies)
        return range(first, first + len(b.strategies))


def enumerate_options(call: CallDef, model: ModelSpec | FunctionSpec, cluster: ClusterSpec, zero: bool = False
                      ) -> OptionSet:
    """Every feasible option of a call, ordered by mesh (small first) then strategy. With `zero`,
    also the data-parallel sharding the engines train with (a train call's zero 1, 2 and 3, a
    forward-only call's zero 3: realbench.cost.sharding), which realbench's runtime does not run."""
    return OptionSet(call, model, cluster, zero)
