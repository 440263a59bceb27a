"""Which parameters exist, which pipeline stage holds them, and how tensor parallelism splits them.

Parameter names follow the full (unsharded) model, so a shard is always "a slice of a named
full tensor". A stage keeps its shards in one flat buffer, in `param_specs` order
(`flat_offsets`): reallocation can then send a run of neighbouring shards as one message, read
and written in place. Column-parallel weights (q, k, v, gate, up, the LM head) split their output
dimension; row-parallel weights (attention output, down projection) their input dimension; norms
and the value head are replicated. nn.Linear stores weights as (out, in), so column-parallel
means dim 0 and row-parallel dim 1. The embedding (vocab, hidden) is vocabulary-parallel
(Megatron): it splits dim 0, like the LM head, so that a head tied to the embedding holds the
same slice of the same matrix on every tp rank.

Under the interleaved schedule (`v` virtual stages, train layouts only) the layers split into
pp x v equal chunks and stage j holds chunks j, j + pp, ..., j + (v - 1) pp (Megatron's virtual
pipeline): the embedding stays with chunk 0 on stage 0, the head with the last chunk on stage
pp - 1. Every function here that takes (pp, stage) takes v too (default 1: contiguous stages).

LoRA adapters (`ModelSpec.lora`) are parameters `layers.<i>.<module>.lora_A` (r x in) and
`.lora_B` (out x r), held by their layer's stage and split as their projection is: a
column-parallel projection's B splits its rows (A is replicated), a row-parallel one's A splits
its columns (B is replicated). They come after every weight of the base in `param_specs`, so
a stage's adapters are one run at the end of its flat buffer (`trainable_start`): the optimizer
keeps master weights and moments for that run only, and reallocation can move it alone.

A tied head (`ModelSpec.tie_embeddings`) is stored once when the embedding and the head sit on
one stage (pp == 1): `head.weight` is then an alias of `embed.weight` (`tied_aliases`), in the
flat buffer and in the shards. With pp > 1 the last stage holds a copy, kept equal to the
embedding by summing the two gradients (engine.PlacedModel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from realbench.models import ModelSpec, stage_layers  # noqa: F401 (re-exported for the runtime)


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    split: Optional[int]  # tensor-parallel dimension, None when replicated
    layer: int  # transformer layer index; -1 for the embedding, n_layers for the final norm/head
    expert: int = -1  # the routed expert it belongs to (-1: none): expert parallelism places it


def is_adapter(name: str) -> bool:
    return name.endswith((".lora_A", ".lora_B"))


def adapter_specs(model: ModelSpec) -> list[ParamSpec]:
    """The LoRA adapters of `model` (none without `model.lora`), layer by layer."""
    if model.lora is None:
        return []
    r, specs = model.lora.r, []
    for i in range(model.n_layers):
        for module, style in model.lora.modules.items():
            n_in, n_out = model.in_out(module)
            specs += [ParamSpec(f"layers.{i}.{module}.lora_A", (r, n_in), None if style == "column" else 1, i),
                      ParamSpec(f"layers.{i}.{module}.lora_B", (n_out, r), 0 if style == "column" else None, i)]
    return specs


def param_specs(model: ModelSpec, adapters: bool = True) -> list[ParamSpec]:
    """Every parameter of `model`: the base's (a mixture of experts' routed experts last), then its
    LoRA adapters' (unless `adapters` is false). Worked out once per model."""
    return list(_param_specs(model, adapters))


@lru_cache(maxsize=256)
def _param_specs(model: ModelSpec, adapters: bool) -> tuple[ParamSpec, ...]:
    h, hd, L = model.hidden, model.head_dim, model.n_layers
    q, kv = model.n_heads * hd, model.n_kv_heads * hd
    specs = [ParamSpec("embed.weight", (model.vocab, h), 0, -1)]
    for i in range(L):
        p = f"layers.{i}."
        specs += [ParamSpec(p + "attn_norm.weight", (h,), None, i)]
        for name, rows in (("wq", q), ("wk", kv), ("wv", kv)):
            specs.append(ParamSpec(p + f"{name}.weight", (rows, h), 0, i))
            if model.qkv_bias:  # column-parallel: the bias splits with its rows
                specs.append(ParamSpec(p + f"{name}.bias", (rows,), 0, i))
        if model.qk_norm:  # one head's width: every head (and every tp rank) shares it
            specs += [ParamSpec(p + "q_norm.weight", (hd,), None, i), ParamSpec(p + "k_norm.weight", (hd,), None, i)]
        specs += [ParamSpec(p + "wo.weight", (h, q), 1, i), ParamSpec(p + "ffn_norm.weight", (h,), None, i)]
        if model.is_moe_layer(i):  # the router, replicated (its experts: expert_specs)
            specs.append(ParamSpec(p + "moe.router.weight", (model.moe.experts, h), None, i))
        else:
            specs += [
                ParamSpec(p + "w_gate.weight", (model.ffn, h), 0, i),
                ParamSpec(p + "w_up.weight", (model.ffn, h), 0, i),
                ParamSpec(p + "w_down.weight", (h, model.ffn), 1, i),
            ]
    specs.append(ParamSpec("norm.weight", (h,), None, L))
    if model.value_head:
        specs.append(ParamSpec("head.weight", (1, h), None, L))
    else:
        specs.append(ParamSpec("head.weight", (model.vocab, h), 0, L))
    return tuple(specs + expert_specs(model) + (adapter_specs(model) if adapters else []))


def expert_specs(model: ModelSpec) -> list[ParamSpec]:
    """A mixture of experts' routed experts, layer by layer, each split over tp as a dense MLP is
    (gate and up by rows, down by columns). They come after the rest of the base's weights, so a
    stage's experts are one run of its flat buffer (expert parallelism keeps its own of them)."""
    if model.moe is None:
        return []
    h, f, specs = model.hidden, model.moe.expert_ffn, []
    for i in range(model.n_layers):
        if model.is_moe_layer(i):
            for j in range(model.moe.experts):
                e = f"layers.{i}.moe.experts.{j}."
                specs += [ParamSpec(e + "w_gate.weight", (f, h), 0, i, j), ParamSpec(e + "w_up.weight", (f, h), 0, i, j),
                          ParamSpec(e + "w_down.weight", (h, f), 1, i, j)]
    return specs


def expert_rank(spec: ParamSpec, model: ModelSpec, ep: int) -> int:
    """The expert-parallel rank of `ep` that holds a parameter (-1: every rank, not an expert's)."""
    return -1 if spec.expert < 0 else spec.expert // (model.moe.experts // ep)


def tied_aliases(model: ModelSpec, pp: int) -> dict[str, str]:
    """Names that share another tensor's storage in a layout of `pp` stages: {alias: target}."""
    return {"head.weight": "embed.weight"} if model.tie_embeddings and pp == 1 else {}


def chunk_of(layer: int, n_layers: int, pp: int, v: int) -> int:
    """The virtual stage (chunk 0 .. pp v - 1) of a layer under v virtual stages per rank."""
    return layer // (n_layers // (pp * v))


def in_stage(spec: ParamSpec, n_layers: int, pp: int, stage: int, v: int = 1) -> bool:
    if spec.layer < 0:
        return stage == 0
    if spec.layer >= n_layers:
        return stage == pp - 1
    if v > 1:
        return chunk_of(spec.layer, n_layers, pp, v) % pp == stage
    lo, hi = stage_layers(n_layers, pp, stage)
    return lo <= spec.layer < hi


def tp_range(spec: ParamSpec, tp: int, tp_rank: int) -> tuple[int, int]:
    """[start, stop) along spec.split held by tp rank `tp_rank` (the whole dim if replicated)."""
    if spec.split is None:
        return 0, spec.shape[0]
    n = spec.shape[spec.split]
    if n % tp:
        raise ValueError(f"{spec.name}: dimension {n} does not split over tp={tp}")
    return tp_rank * n // tp, (tp_rank + 1) * n // tp


def shard_shape(spec: ParamSpec, tp: int) -> tuple[int, ...]:
    if spec.split is None:
        return spec.shape
    shape = list(spec.shape)
    shape[spec.split] //= tp
    return tuple(shape)


def flat_offsets(model: ModelSpec, tp: int, pp: int, stage: int, v: int = 1, ep: int = 1, ep_rank: int = 0
                 ) -> tuple[dict[str, int], int]:
    """Where each shard of pipeline stage `stage` starts in the stage's flat buffer (in values),
    and the buffer's length. Every rank can compute any rank's layout from the model alone.
    An alias (`tied_aliases`) starts where its target does and takes no space. Of a mixture of
    experts' routed experts, the stage holds those of expert-parallel rank `ep_rank` of `ep`."""
    offsets, total = {}, 0
    aliases = tied_aliases(model, pp)
    for p in param_specs(model):
        if not in_stage(p, model.n_layers, pp, stage, v) or expert_rank(p, model, ep) not in (-1, ep_rank):
            continue
        if p.name in aliases:
            offsets[p.name] = offsets[aliases[p.name]]
            continue
        offsets[p.name] = total
        total += math.prod(shard_shape(p, tp))
    return offsets, total


def trainable_start(model: ModelSpec, tp: int, pp: int, stage: int, v: int = 1, ep: int = 1, ep_rank: int = 0) -> int:
    """Where the trained parameters of a stage start in its flat buffer: 0 (all of them), or
    with LoRA, where its adapters start (they run to the end)."""
    if model.lora is None:
        return 0
    offsets, total = flat_offsets(model, tp, pp, stage, v, ep, ep_rank)
    return min((at for name, at in offsets.items() if is_adapter(name)), default=total)


def flat_views(flat, model: ModelSpec, tp: int, pp: int, stage: int, v: int = 1, ep: int = 1, ep_rank: int = 0,
               start: int = 0) -> dict:
    """The shards of stage `stage` as views of its flat buffer `flat` (a tensor of
    `flat_offsets(...)[1]` values), by name; with `start`, `flat` holds the buffer from there
    on (the trained run, `trainable_start`) and the views are of the shards it holds."""
    offsets, _ = flat_offsets(model, tp, pp, stage, v, ep, ep_rank)
    specs = {p.name: p for p in param_specs(model)}
    views = {}
    for name, at in offsets.items():
        if at < start:
            continue
        shape = shard_shape(specs[name], tp)
        views[name] = flat[at - start:at - start + math.prod(shape)].view(shape)
    return views
