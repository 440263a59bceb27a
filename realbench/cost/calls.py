"""Time and memory of one call under one option (REAL.md section 5). Pure functions.

Notation: L layers, hidden h, stage layers l = ceil(L / pp), a micro-batch of b sequences of
length S (tokens t = b * S) on one device of a (dp, tp, pp) layout with m micro-batches.

Compute of one layer on t tokens of sequences of length S (attending to c = S/2 positions on
average under a causal mask with flash attention; to all S with materialized scores, which
compute the full square):
    flops  = 2 t P_layer / tp + 4 t c h / tp          (projections; attention scores and sum)
    time   = max(flops / (F * eff(t)), weight bytes / BW) + element-wise bytes / BW + overhead
    eff(t) = E * t / (t + t_half)                      (small matmuls underuse the device)
plus two tensor-parallel all-reduces of t*h bf16 values per layer forward (two more backward).
Ulysses sequence parallelism over sp devices (an FSDP layout's, `Strategy.sp`): a device runs
t / sp of a micro-batch's t tokens through the layer with its whole weights, and attention over
the whole sequences for 1/sp of the heads: the flops and element-wise bytes of t / sp tokens, the
weights read whole, plus two all-to-alls a layer forward (queries, keys and values to head shards,
q + 2 kv bf16 values a token, the output back, q; a backward as many again), the sharded state
over dp x sp devices. Ring attention over the sp devices (`Strategy.ring`): the same share of the
tokens, a device's (tp share of the) heads kept, the exchanges an all-gather of the group's keys
and values a layer forward (allgather, OpenRLHF's: 2 kv values a token of the whole group's), or
sp - 1 sends of a device's chunk of them around the ring (p2p, Megatron's context parallelism,
beside tp and pp: 2 kv / tp values a token of its own), a backward twice that (the keys and values
again and their gradients).

Element-wise work (`elementwise_bytes`): every kernel that is not a matmul reads its inputs and
writes its outputs once (fused kernels, as torch.compile or Megatron's fused kernels make them).
Per token and layer, forward, in bf16 (2 bytes a value), with kvd = kv_heads x head_dim:
    two RMSNorms        2 x (read h + write h)                  =  8 h   (replicated over tp)
    two residual adds   2 x (read 2h + write h)                 = 12 h   (replicated over tp)
    rotary on q and k   read and write h + kvd                  =  4 (h + kvd) / tp
    SiLU(gate) * up     read 2 ffn + write ffn                  =  6 ffn / tp
    attention scores    materialized only: 13 bytes per score   = 13 (heads / tp) S
                        (QK^T written 2, softmax read and written 4, dropout read, written and its
                        mask 5, read by the second matmul 2)
LLaMA-2 7B: 44 h bytes; measured on an H100, torch.compile's fused block moves 50 h, eager
PyTorch 176 h (README "On a GPU: measured"). The loss (or log-probabilities) over the vocabulary
casts each logit to fp32 and takes a log-softmax: LOGIT_BYTES per logit (read 2, write 4, read
and write 8), V / tp logits a token. A backward pass moves twice a forward's bytes (it reads
the output gradient and the inputs, writes the input gradients), as it does twice the flops.

  * inference: one forward pipelined over m micro-batches: (m + pp - 1) stage slots. On
    generated sequences with response lengths (`call.lengths`), a micro-batch of b rows is as
    wide as the prompt plus the longest of its b responses (E[max], `CallDef.width`): the
    runtime trims the padding after it; memory takes the longest of the device's rows of a step
    (at the distribution's `memory_at`). Rows packed without padding (an engine's) are as wide as
    the mean row in time; memory takes the heaviest micro-batch's rows (the sums' `memory_at`), or
    one as full as the engine's token budget (`max_tokens`) lets it be (`CallDef.peak_tokens`).
  * train: per optimizer step, (m + pp - 1) slots of forward + backward (backward = 2x the
    forward flops), activations and gradients sent between stages, then the data-parallel
    all-reduce of the bf16 gradients over the dp group (hierarchical across nodes, see
    realbench.cost.comm), then Adam; `iterations` passes over the batch. A policy trained in several optimizer steps first runs a
    forward over the later steps' rows for their behaviour log-probabilities (`behaviour_forwards`).
    Activation checkpointing adds a forward per slot (and its all-reduces) and keeps only each
    layer's input (t h bf16 values) plus one layer's activations. The interleaved 1F1B
    schedule (v virtual stages per rank) takes m + (pp - 1) / v slots and m v + pp - 1 pairs of
    point-to-point messages, and holds pp + (pp - 1) / v stage-loads of activations once
    m >= 2 pp (realbench.plan.pipeline.activations_in_flight).
  * function (reward functions): `seconds_per_sample` per response and function, split over dp
    processes.
  * generate without pipeline parallelism: continuous batching (realbench.runtime.rollout), a
    replica's rows through ceil(rows / m) decode slots; the decode steps are the expected
    makespan of the rows' lengths over the slots (realbench.dataflow.lengths.continuous_makespan),
    each step computing every slot; the KV cache holds every slot at the full width. An engine's
    serving engine (`memory_fraction`: the plan's, Strategy.memory_fraction, over the scenario's)
    decodes in at most as many slots as its paged cache holds at the mean resident length
    (`serving_slots`), and holds its fraction of the device whole.
  * generate on a pipeline: prefill of the prompt like inference, then gen_len decode steps. A decode step
    reads the stage's weights and the KV cache of its micro-batch for every micro-batch, so at
    small batch it is bound by memory bandwidth. With m micro-batches and pp stages a token
    costs max(m, pp) stage slots: when m < pp the pipeline has bubbles on every decode step.

Memory per device (bytes): weights 2 per parameter of the shard (tp x pp); a trained model's
master copy 16 per parameter (bf16 weights and grads, fp32 master weights and two Adam
moments), less where a strategy shards them over data parallelism (`zero`, ZeRO / FSDP:
realbench.cost.sharding, which also prices their collectives); activations of the micro-batches in flight on the first stage (min(m, pp) in 1F1B, see above), taken as
t h (10 + 24 / tp) per layer (Korthikanti et al. without sequence parallelism, with flash
attention); fp32 logits of a micro-batch (their gradient too in training), or as an engine holds
them (`CallDef.logits`: verl's fused kernels hold a chunk's only and compute them again in the
backward); and for generation the KV cache, 2 x kv_heads x
head_dim bf16 values per token per layer: the decode slots at the full width (continuous
batching), or the rows alive of the whole per-device batch (a pipeline's micro-batched loop).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from realbench.cost import comm, sharding
from realbench.dataflow import CallDef, CallKind
from realbench.hardware import ClusterSpec
from realbench.models import FunctionSpec, ModelSpec
from realbench.plan.mesh import Mesh, Option, Strategy
from realbench.plan.options import decode_slots, served_call
from realbench.plan.pipeline import activations_in_flight

BF16 = 2
FP32 = 4
ADAM_BYTES_MOVED_PER_PARAM = 36  # read grads, master, m, v; write master, m, v, bf16 weights
SCORE_BYTES = 13  # a materialized attention score's round trips (see the module doc)
LOGIT_BYTES = 14  # a logit's, in the fp32 log-softmax over the vocabulary
# the tokens of the forward a serving engine profiles for its activations: its chunked prefill's
# budget (vLLM's max_num_batched_tokens, verl's default 8192; SGLang's chunked_prefill_size)
SERVED_TOKENS = 8192


@dataclass(frozen=True, slots=True)
class CallCost:
    """Cost of one call under one option. Times in seconds, memory in bytes per device."""

    time_s: float
    compute_s: float  # pipelined compute including bubbles (no communication)
    tp_comm_s: float
    pp_comm_s: float
    dp_comm_s: float
    optimizer_s: float
    weights_bytes: int  # bf16 weights of the shard this option holds
    master_bytes: int  # what the model keeps on this layout when it is its master copy
    working_bytes: int  # activations / KV cache / logits during the call
    # of time_s, what may run as soon as generation's rows are there, before the call's other
    # inputs (`early_old_logprobs`: the policy's old-log-probability forward)
    early_s: float = 0.0


# -- the device ---------------------------------------------------------------------------------
def matmul_time(cluster: ClusterSpec, flops: float, rows: float) -> float:
    d = cluster.device
    eff = d.matmul_efficiency * rows / (rows + d.half_efficiency_rows)
    return flops / (d.flops * eff)


def memory_time(cluster: ClusterSpec, nbytes: float) -> float:
    d = cluster.device
    return nbytes / (d.mem_bw * d.mem_bw_efficiency)


# -- the layout -----------------------------------------------------------------------------------
def shard_params(model: ModelSpec, tp: int, pp: int, ep: int = 1, etp: int = 0) -> float:
    """Parameters on the most loaded device: the heaviest stage's layers (ceil(L/pp) of them in a
    uniform model), the embedding on the first stage and the head on the last (both on the one
    stage when pp == 1), over tp; a mixture of experts' routed experts over ep x etp (etp 0: tp)."""
    return model.stage_params(pp, tp, ep, etp)


def shard_adapter_params(model: ModelSpec, tp: int, pp: int) -> float:
    """LoRA adapter parameters on a device: ceil(L/pp) layers' over tp (the replicated halves,
    A of a column-parallel projection and B of a row-parallel one, are a few percent of the
    adapters, under tp: left out)."""
    return math.ceil(model.n_layers / pp) * model.layer_adapter_params / tp


def adapter_flops_share(model: ModelSpec) -> float:
    """The adapters' FLOPs per token as a share of the base's matmuls: r (in + out) per
    targeted projection against in x out (0 without LoRA)."""
    return model.layer_adapter_params / model.layer_matmul_params


def dp_group_spans_nodes(cluster: ClusterSpec, option: Option) -> bool:
    """Ranks of one dp group are tp apart and cover dp*tp consecutive devices (a sharding group,
    dp*sp*tp: Ulysses' groups are inside it; a hybrid shard group, its shard_group*tp)."""
    return option.mesh.nodes > 1 and option.strategy.state_shards * option.strategy.tp > cluster.gpus_per_node


def hybrid_replicas(cluster: ClusterSpec, option: Option) -> sharding.Replicas:
    """Hybrid sharding's groups that hold the same shard (realbench.cost.sharding): one device of
    each, shard_group*tp apart, so they span nodes with the mesh, a node holding
    gpus_per_node / (shard_group*tp) of them; on links of their own where the groups fit a node
    and the replicas cross nodes."""
    s = option.strategy
    if not s.shard_group:
        return sharding.FULL_SHARD
    apart, across = s.shard_group * s.tp, option.mesh.nodes > 1
    return sharding.Replicas(s.shards // s.shard_group, across, max(1, cluster.gpus_per_node // apart),
                             own_links=across and apart <= cluster.gpus_per_node)


def stage_boundary_spans_nodes(cluster: ClusterSpec, option: Option) -> bool:
    """Consecutive stages are dp*tp devices apart; they cross a node once dp*tp >= node size."""
    return option.mesh.nodes > 1 and option.strategy.dp * option.strategy.tp >= cluster.gpus_per_node


# -- one stage ------------------------------------------------------------------------------------
def elementwise_bytes(model: ModelSpec, tp: int, scores: float = 0.0) -> float:
    """Bytes the element-wise kernels of one layer move per token in a forward pass (module doc),
    `scores` being the attention scores per head the token has in memory (0 with flash attention).
    A mixture of experts' SwiGLU runs on each of the token's top_k experts (and its shared ones)."""
    h, q, kvd = model.hidden, model.q_width, model.kv_width
    replicated = 2 * 2 * h * BF16 + 2 * 3 * h * BF16  # norms, residual adds: every tp rank does them
    split = 2 * q * BF16 + 3 * _mlp_width(model) * BF16 + SCORE_BYTES * model.n_heads * scores
    return replicated + split / tp + 2 * kvd * BF16 / model.kv_shards(tp)


def _mlp_width(model: ModelSpec) -> float:
    """The intermediate width of a token's MLP, on average over the layers: ffn, or a mixture of
    experts' top_k expert widths and its shared ones."""
    if model.moe is None:
        return float(model.ffn)
    share = _moe_share(model)
    m = model.moe
    return share * (m.top_k * m.expert_ffn + m.shared_ffn) + (1 - share) * model.ffn


def _moe_share(model: ModelSpec) -> float:
    """The share of the layers whose MLP is a mixture of experts."""
    if model.moe is None:
        return 0.0
    return 1.0 - len(set(model.moe.dense_layers)) / model.n_layers


def _scores_in_memory(cluster: ClusterSpec, context):
    """Attention scores per head a token writes to memory when it attends to `context`
    positions: all of them with materialized attention, none with flash attention."""
    return context if cluster.attention == "materialized" else 0.0


# -- a mixture of experts -------------------------------------------------------------------------
# Per layer and device, on average over the layers (a share `_moe_share` of them are MoE layers),
# for t tokens a device runs through the layer (a tp group shares them; Megatron's sequence
# parallelism, which expert parallelism needs beside tp, gives each tp rank t / tp of them to route):
#   expert FLOPs     2 (t / tp) k 3 h f_e x imbalance       (k experts a token, each a SwiGLU of f_e;
#                                                            the busiest device sets the pace: ep > 1)
#   rows per expert  (t / tp) ep etp k / E                  (an expert group of ep x etp devices holds
#                                                            every expert once: its tokens over E)
#   weights read     touched x 3 h f_e / etp bf16           (the device's E / ep experts, those its
#                                                            group's tokens reach: E/ep (1 - (1 - k/E)^n),
#                                                            n = (t / tp) ep etp)
#   all-to-alls      dispatch and combine forward (and as many backward), (t / tp) k h bf16 a device
#                    over the ep devices (ep x etp consecutive ones: across nodes past a node's)
# The matmuls run at the device's efficiency for the rows per expert (grouped GEMMs of that many).
def _expert_compute(cluster: ClusterSpec, model: ModelSpec, tp: int, tokens, ep: int, etp: int):
    """(matmul seconds, weight bytes read) of the routed experts of one layer on a device (above)."""
    share = _moe_share(model)
    if not share:
        return 0.0, 0.0
    m, etp = model.moe, etp or tp
    routed = tokens / tp
    flops = 2 * routed * m.top_k * 3 * model.hidden * m.expert_ffn * (m.imbalance if ep > 1 else 1.0)
    rows = np.maximum(routed * ep * etp * m.top_k / m.experts, 1e-9)
    touched = m.experts / ep * (1.0 - (1.0 - m.top_k / m.experts) ** (routed * ep * etp))
    return share * matmul_time(cluster, flops, rows), share * touched * model.expert_params / etp * BF16


def _expert_exchanges(cluster: ClusterSpec, model: ModelSpec, s: Strategy, tokens: float) -> float:
    """Seconds of one layer's dispatch and combine all-to-alls in a forward (a backward moves as much),
    on average over the layers (above); none without expert parallelism."""
    if s.ep == 1 or model.moe is None:
        return 0.0
    G = cluster.gpus_per_node
    nbytes = tokens / s.tp * model.moe.top_k * model.hidden * BF16
    per_node = max(1, min(s.ep, G // s.expert_tp))
    return _moe_share(model) * 2 * comm.all_to_all(cluster, s.ep, nbytes, per_node)


def _dense_matmul_params(model: ModelSpec) -> float:
    """Matmul parameters a token goes through in a layer beside its routed experts (the attention's,
    the router's, the shared experts', a dense MLP's), on average over the layers."""
    if model.moe is None:
        return float(model.layer_matmul_params)
    m = model.moe
    return model.layer_matmul_params - _moe_share(model) * m.top_k * 3 * model.hidden * m.expert_ffn


def _dense_layer_params(model: ModelSpec) -> float:
    """A layer's parameters but its routed experts', on average over the layers (the largest layer's
    in a uniform model: every layer's)."""
    if model.uniform and model.moe is None:
        return float(model.layer_params)
    from realbench.models import layer_param_prefix

    return float(layer_param_prefix(model, "dense")[-1]) / model.n_layers


def _attention_flops(model: ModelSpec, tokens, context):
    """FLOPs of one layer's attention over `context` earlier positions for `tokens` tokens (scores and
    weighted sum; linear attention's state), on average over the layers: 4 t c h in a LLaMA."""
    return tokens * model.attended(context) * model.attention_flops_per_position() + tokens * model.state_flops()


def _layer_forward(cluster: ClusterSpec, model: ModelSpec, tp: int, tokens: float, seq: float, ep: int = 1,
                   etp: int = 0) -> float:
    """One layer's forward on `tokens` tokens of sequences of length `seq`: each attends to half
    of them on average under a causal mask with flash attention, to all of them with materialized
    scores (which compute the whole square); a mixture of experts' routed experts laid out over
    ep x etp devices (their matmuls and weights: `_expert_compute`)."""
    context = seq if cluster.attention == "materialized" else seq / 2
    replica = model.kv_replica_params(tp)  # (a replicated KV head's projections, tp above the KV heads)
    flops = 2 * tokens * (_dense_matmul_params(model) / tp + replica) + _attention_flops(model, tokens, context) / tp
    expert_s, expert_bytes = _expert_compute(cluster, model, tp, tokens, ep, etp)
    return (max(matmul_time(cluster, flops, tokens) + expert_s,
                memory_time(cluster, (_dense_layer_params(model) / tp + replica) * BF16 + expert_bytes))
            + memory_time(cluster, tokens * elementwise_bytes(model, tp, _scores_in_memory(cluster, context)))
            + cluster.device.kernel_overhead_s)


def _vision_forward(cluster: ClusterSpec, model: ModelSpec, tp: int, prompts):
    """A vision tower's forward over the images of `prompts` prompts (realbench.models.VisionSpec:
    P patches a prompt, its images taken as one, a bound on the attention where it holds several):
        flops  = prompts (2 P M + 4 P a h_v) / tp      (VisionSpec.forward_flops: M the matmul
                                                         parameters a patch goes through, a the
                                                         patches it attends to in a block)
    split over tp as the serving engines and Megatron split the tower, its weights read once, and
    element-wise bytes a patch and block as a decoder layer's (two norms and two residual adds,
    20 h_v, replicated; the MLP's activation, 6 f_v gated or 4 f_v, split). 0 without images."""
    v = model.vision
    if v is None or not v.patches:
        return 0.0
    patches = prompts * v.patches
    elementwise = v.depth * (20 * v.hidden + (6 if v.gated else 4) * v.ffn / tp)
    return (np.maximum(matmul_time(cluster, v.forward_flops(prompts) / tp, patches),
                       memory_time(cluster, v.params / tp * BF16))
            + memory_time(cluster, patches * elementwise) + v.depth * cluster.device.kernel_overhead_s)


def _vision_block_bytes(model: ModelSpec, tp: int, prompts: float) -> float:
    """One block of a vision tower's activations over `prompts` prompts' patches, as a decoder
    layer's (`_activation_bytes`): 10 h_v + (8 h_v + the MLP's 6 f_v gated, 4 f_v not) / tp a patch."""
    v = model.vision
    if v is None:
        return 0.0
    return prompts * v.patches * (10 * v.hidden + (8 * v.hidden + (6 if v.gated else 4) * v.ffn) / tp)


def _vision_activation_bytes(model: ModelSpec, tp: int, prompts: float, recompute: bool) -> float:
    """A vision tower's activations kept for the backward over `prompts` prompts' patches: every
    block's (`_vision_block_bytes`), or with activation checkpointing each block's input (2 h_v a
    patch) and one block's."""
    v = model.vision
    if v is None:
        return 0.0
    block = _vision_block_bytes(model, tp, prompts)
    return prompts * v.patches * v.hidden * BF16 * v.depth + block if recompute else v.depth * block


def _stage_ends(head: float, vision: float, pp: int) -> float:
    """The output layer's and the vision tower's seconds on the busiest stage: both on one stage,
    the larger where the vision tower sits on the first and the head on the last."""
    return head + vision if pp == 1 else np.maximum(head, vision)


def _head_forward(cluster: ClusterSpec, model: ModelSpec, tp: int, tokens, moved: float = LOGIT_BYTES):
    """The output layer on `tokens` tokens and the log-softmax over its logits, `moved` bytes a
    logit (a number or a numpy array of them)."""
    flops = 2 * tokens * model.hidden * model.head_out / tp
    softmax = 0.0 if model.value_head else tokens * model.head_out / tp * moved
    return (np.maximum(matmul_time(cluster, flops, tokens), memory_time(cluster, model.head_params * BF16 / tp))
            + memory_time(cluster, softmax))


def _decode_step(cluster: ClusterSpec, model: ModelSpec, tp: int, rows, ctx, ep: int = 1, etp: int = 0):
    """(one layer, the head) of a decode step of `rows` rows attending to `ctx` positions:
    bound by the matmuls or by reading the weights (of a mixture of experts, those its rows reach)
    and the KV cache, plus the element-wise work (numbers or numpy arrays of them)."""
    replica = model.kv_replica_params(tp)  # (a replicated KV head's projections, tp above the KV heads)
    flops = 2 * rows * (_dense_matmul_params(model) / tp + replica) + _attention_flops(model, rows, ctx) / tp
    kv = rows * model.sequence_cache_bytes(ctx, 1, tp)
    expert_s, expert_bytes = _expert_compute(cluster, model, tp, rows, ep, etp)
    layer = (np.maximum(matmul_time(cluster, flops, rows) + expert_s,
                        memory_time(cluster, (_dense_layer_params(model) / tp + replica) * BF16 + expert_bytes + kv))
             + memory_time(cluster, rows * elementwise_bytes(model, tp, _scores_in_memory(cluster, ctx)))
             + cluster.device.kernel_overhead_s)
    return layer, _head_forward(cluster, model, tp, rows)


def _tp_all_reduce(cluster: ClusterSpec, tp: int, nbytes) -> float:
    """One all-reduce over a tp group: on NVLink inside a node; a serving engine's group of whole
    nodes (vLLM's and SGLang's multi-node tp) reduces hierarchically over the NICs too."""
    G = cluster.gpus_per_node
    return comm.all_reduce(cluster, tp, nbytes, spans_nodes=tp > G, per_node=min(tp, G))


def _tp_all_reduces(cluster: ClusterSpec, model: ModelSpec, tp: int, tokens: float, count: int) -> float:
    return count * _tp_all_reduce(cluster, tp, tokens * model.hidden * BF16)


def _kv_chunk_bytes(model: ModelSpec, tp: int, tokens: float) -> float:
    """Keys and values of `tokens` tokens on a device: its tp share of the KV heads, bf16."""
    return tokens * 2 * model.n_kv_heads / tp * model.head_dim * BF16


def _sequence_exchanges(cluster: ClusterSpec, model: ModelSpec, s: Strategy, tokens: float) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's exchanges inside a sequence-parallel group on a
    device's `tokens` (its 1/sp of a micro-batch's).
    Ulysses: queries, keys and values from sequence shards to head shards before attention, its
    output back after it (all-to-alls); the KV heads repeated up to the group first where it has
    more devices than they (verl's repeat_kv, models/transformers/monkey_patch.py:126-128). A
    backward moves as much.
    allgather (`s.ring`, ring-flash-attention's llama3_flash_attn_varlen_func, which OpenRLHF
    substitutes for flash attention): every device gathers the group's keys and values, its tp
    share of the KV heads of sp x tokens, before attending with its own queries; the backward
    gathers them again and reduce-scatters their gradients (as much again). A group of tp x sp
    devices wider than a node gathers over the NICs too (its sp devices G / tp a node).
    p2p (Megatron's context parallelism, Transformer Engine's AttnFuncWithCPAndKVP2P,
    attention/dot_product_attention/context_parallel.py): sp steps, each attending over the chunk
    of keys and values (C bytes: the tp share of the KV heads of `tokens`) it holds while sending it
    to the next device and receiving the previous one's: sp - 1 sends of C forward; the backward
    sends C, then C and its gradient (2 C) sp - 2 times, then the gradient, C. A ring of tp x sp
    devices wider than a node sends over the NICs (its slowest link sets every step's pace).
    Priced as if the exchanges ran apart from attention: both kernels overlap them with the next
    step's attention, which realbench does not credit (an upper bound)."""
    if s.sp == 1:
        return 0.0, 0.0
    if s.ring:
        G = cluster.gpus_per_node
        chunk, spans = _kv_chunk_bytes(model, s.tp, tokens), s.tp * s.sp > G
        if s.ring == "p2p":
            forward = (s.sp - 1) * comm.p2p(cluster, chunk, spans)
            backward = 2 * comm.p2p(cluster, chunk, spans) + (s.sp - 2) * comm.p2p(cluster, 2 * chunk, spans)
            return forward, backward
        gather = comm.all_gather(cluster, s.sp, s.sp * chunk, spans, max(1, G // s.tp))
        return gather, 2 * gather
    q = model.n_heads * model.head_dim
    kv = max(model.n_kv_heads, s.sp) * model.head_dim
    exchange = comm.all_to_all(cluster, s.sp, tokens * (2 * q + 2 * kv) * BF16)
    return exchange, exchange


def _ring_buffers(model: ModelSpec, s: Strategy, tokens: float, backward: bool) -> float:
    """Ring attention's exchange buffers on a device of `tokens` (its 1/sp), for one layer at a time.
    allgather: keys and values of one KV head (OpenRLHF's default --ds.ring_attn_head_stride 1)
    for the whole group's sp x tokens, twice (the next stride gathered while the last is used), and
    in a backward their gradients once more (llama3_flash_attn_varlen.py: kv_buffer,
    kv_buffer_copy, dkv_buffer).
    p2p: the forward keeps every step's received chunk of keys and values (sp chunks C) and every
    step's output (sp x the queries' size, a device's heads of `tokens`; the upper-triangle steps'
    are half that, counted whole: an upper bound) until it combines them; the backward, two
    buffers of a chunk and its gradient (4 C: context_parallel.py's p2p_comm_buffers). A train
    call's peak is the larger."""
    if not s.ring:
        return 0.0
    if s.ring == "p2p":
        chunk = _kv_chunk_bytes(model, s.tp, tokens)
        forward = s.sp * (chunk + tokens * model.n_heads / s.tp * model.head_dim * BF16)
        return max(forward, 4 * chunk) if backward else forward
    return (3 if backward else 2) * 2 * s.sp * tokens * model.head_dim * BF16


def _activation_bytes(model: ModelSpec, tp: int, tokens: float) -> float:
    """A layer's activations kept for the backward (Korthikanti et al., flash attention, no sequence
    parallelism): t h (10 + 24 / tp) bytes, 16 h / tp of it an MLP's two intermediates. A mixture
    of experts' MLP keeps instead, a token, each of its top_k experts' copy of it (2 h bytes) and
    SwiGLU intermediates (6 f_e), and its shared experts' (6 f_shared): on average over the layers."""
    if model.moe is None:
        return tokens * model.hidden * (10 + 24 / tp)
    m, h, share = model.moe, model.hidden, _moe_share(model)
    mlp = share * (m.top_k * (2 * h + 6 * m.expert_ffn) + 6 * m.shared_ffn) / h + (1 - share) * 16
    return tokens * h * (10 + (8 + mlp) / tp)


def _cache_bytes_per_token(model: ModelSpec, tp: int, context: float) -> float:
    """A device's cache bytes a token of a sequence of `context` tokens takes over every layer, on
    average over the sequence (a sliding window's and linear attention's fixed parts spread over
    it): 2 kv_heads head_dim bf16 a layer over tp in a LLaMA."""
    return model.sequence_cache_bytes(context, model.n_layers, tp) / max(context, 1)


def _logits_bytes(model: ModelSpec, tp: int, tokens: float) -> float:
    return tokens * model.head_out * FP32 / tp


def _logits_held(call: CallDef, model: ModelSpec, tp: int, tokens: float, train: bool) -> float:
    """Bytes of logits (and what the log-probabilities' computation keeps beside them) a device
    holds at the peak of a train pass or a forward over `tokens` tokens: realbench's runtime's fp32
    logits (and their gradient in training), or the engine's way (`call.logits`, LogitsPath: over
    a chunk of tokens only where it never holds them whole)."""
    path = call.logits
    if path is None:
        return (2 if train else 1) * _logits_bytes(model, tp, tokens)
    held = min(tokens, path.chunk_tokens) if path.chunk_tokens else tokens
    return held * model.head_out / tp * (path.train_bytes if train else path.forward_bytes)


# -- calls ----------------------------------------------------------------------------------------
def behaviour_forwards(call: CallDef, model: ModelSpec) -> int:
    """Optimizer steps whose behaviour log-probabilities a policy's train call computes with a
    forward of its own layout before its first update (runtime.algorithms), by the call's
    `old_logprobs` (realbench.dataflow.core.OldLogprobs): later_steps, all but the first, which
    takes its forward's own (with several passes over the batch, the first step too); whole_batch,
    every step (verl, OpenRLHF, AReaL recomputing); rollout, none (generation's). A train call that
    reads `logprobs` trains a policy, unless its model is a value model (PPO's critic reads them
    for the KL-shaped rewards only)."""
    if call.kind != CallKind.TRAIN or "logprobs" not in call.inputs or getattr(model, "value_head", False):
        return 0
    if call.old_logprobs == "rollout":
        return 0
    if call.old_logprobs == "whole_batch":
        return call.optimizer_steps
    return call.optimizer_steps - (call.iterations == 1)  # later passes need the first step's too


def _decode_for_lengths(call: CallDef, model: ModelSpec, cluster: ClusterSpec, option: Option, b: float,
                       layers: int, p2p_cross: bool) -> tuple[float, float, float, float]:
    """The decode steps of a generation call whose response lengths follow `call.lengths`
    (see realbench.dataflow.lengths): (compute, tp and pp communication seconds, the tokens of
    the largest expected KV cache on a device).

    Step t runs each micro-batch still decoding (P_mb(t) = 1 - cdf[t]^b) on its rows alive
    (b (1 - cdf[t]) / P_mb(t) on average), attending to prompt_len + t positions; finished
    rows leave the batch. A step costs max(m P_mb(t), pp P_call(t)) stage slots, P_call(t) =
    1 - cdf[t]^seqs being the chance that some row of the whole call still decodes: the call
    ends with its slowest data-parallel replica, which runs at least one micro-batch (and, below
    m = pp micro-batches decoding, waits for each token's trip through the pipeline) as long as
    the call's longest row decodes. With every row at the cap this is the fixed-length formula
    step by step. The KV cache holds the rows alive, each with its prompt and tokens so
    far: its largest size over the steps, the rows alive taken at the distribution's memory
    quantile (`LengthDistribution.memory_alive`), with at least the longest row kept while
    some row decodes."""
    from realbench.dataflow.lengths import alive_rows, still_decoding

    s = option.strategy
    tp, pp, m = s.tp, s.pp, s.micro_batches
    cdf = call.lengths.cdf()
    running = still_decoding(cdf, b)
    call_running = still_decoding(cdf, call.seqs)
    # rows alive in a micro-batch still decoding (1 where none decodes: those steps weigh 0)
    live = np.where(running > 1e-12, alive_rows(cdf, b) / np.maximum(running, 1e-12), 1.0)
    t = np.arange(len(running), dtype=np.float64)
    ctx = call.prompt_len + t
    layer_step, head = _decode_step(cluster, model, tp, live, ctx)
    slots = np.maximum(m * running, pp * call_running)
    compute = float((slots * (layers * layer_step + head)).sum())
    tp_comm = 0.0
    if tp > 1:
        per_row = [_tp_all_reduce(cluster, tp, x * model.hidden * BF16) for x in (1.0, 2.0)]
        # an all-reduce is latency plus bytes over bandwidth: linear in the rows, read off two points
        tp_step = 2 * layers * (per_row[0] + (live - 1.0) * (per_row[1] - per_row[0]))
        tp_comm = float((slots * tp_step).sum())
    pp_comm = 0.0
    if pp > 1:
        per_row = [comm.p2p(cluster, x * model.hidden * BF16, p2p_cross) for x in (1.0, 2.0)]
        pp_comm = float((slots * (per_row[0] + (live - 1.0) * (per_row[1] - per_row[0]))).sum())
    # the device's rows (b m) alive (at the distribution's memory quantile), the longest of them
    # at least while one decodes
    kept = np.maximum(call.lengths.memory_alive(b * m), still_decoding(cdf, b * m))
    return compute, tp_comm, pp_comm, float((kept * (ctx + 1)).max())


def serving_weight_bytes(model: ModelSpec, tp: int, ep: int = 1) -> float:
    """A serving replica's bf16 weights on each of its tp GPUs (a LoRA model's adapters too); with
    expert parallelism, its routed experts whole on one of ep GPUs (etp 1)."""
    return (shard_params(model, tp, 1, ep, 1 if ep > 1 else 0) + shard_adapter_params(model, tp, 1)) * BF16


def served_share_beyond_weights(call: CallDef, model: ModelSpec, cluster: ClusterSpec, tp: int, ep: int = 1) -> float:
    """What an engine's serving engine holds of each GPU beyond its replica's weights while it
    generates: its share (`call.memory_fraction`, at most the plan's usable memory: the engine
    keeps its own headroom inside the fraction) less the weights; its KV cache and activations.
    Negative where the weights outgrow the share."""
    share = min(call.memory_fraction * cluster.device.memory_bytes, cluster.usable_memory_bytes)
    return share - serving_weight_bytes(model, tp, ep)


def serving_cache_tokens(call: CallDef, model: ModelSpec, cluster: ClusterSpec, tp: int, slots: int,
                         ep: int = 1) -> float:
    """The tokens a replica's paged KV cache holds where an engine's serving engine takes
    `call.memory_fraction` f of each GPU's memory: f x the device's memory, less the shard's
    weights and the activations of a forward of SERVED_TOKENS tokens (the chunked prefill it
    profiles) with logits for its `slots` sequences, over one token's keys and values on a GPU.
    vLLM: the requested memory (total x gpu_memory_utilization) less the profiled non-KV memory
    (vllm/v1/worker/gpu_worker.py, determine_available_memory); SGLang: the memory free after
    loading the weights less total x (1 - mem_fraction_static) (model_executor/model_runner.py,
    profile_max_num_token), its activations in that rest (counted here inside the fraction, as
    vLLM counts them: a few percent of the cache)."""
    weights = serving_weight_bytes(model, tp, ep)
    activations = _activation_bytes(model, tp, SERVED_TOKENS) * 2 / 8 + _logits_bytes(model, tp, slots)
    free = call.memory_fraction * cluster.device.memory_bytes - weights - activations
    return max(free, 0.0) / _cache_bytes_per_token(model, tp, call.seq_len)


def serving_cache_problem(call: CallDef, model: ModelSpec, cluster: ClusterSpec, s: Strategy) -> Optional[str]:
    """Why an engine's serving engine does not start on this layout, or None: its paged KV cache
    (serving_cache_tokens) must hold one whole sequence of its context, `call.max_model_len` where
    given, else the call's seq_len (vLLM: "To serve at least one request with the model's max seq
    len", vllm/v1/core/kv_cache_utils.py, check_enough_kv_cache_memory; SGLang: "Not enough memory",
    profile_max_num_token). Such a call holds more memory than any device (its working set is
    infinite): no plan fits with it. The share is the strategy's where it names one (served_call)."""
    call = served_call(call, s)
    if call.kind != CallKind.GENERATE or call.memory_fraction is None:
        return None
    tokens = serving_cache_tokens(call, model, cluster, s.tp, decode_slots(call, Option(Mesh(0, 1, 0, s.size), s)),
                                  s.ep)
    context = call.max_model_len or call.seq_len
    if tokens >= context:
        return None
    what = (f"one request of max_model_len {context}" if call.max_model_len else f"one sequence of {context}")
    return (f"the serving engine's KV cache at memory fraction {call.memory_fraction:g} holds {int(tokens)} tokens a "
            f"replica of tp {s.tp}, fewer than {what}: the engine does not start (a larger tp or memory fraction"
            + (", or a shorter max_model_len)" if call.max_model_len else ")"))


def serving_slots(call: CallDef, model: ModelSpec, cluster: ClusterSpec, option: Option) -> int:
    """The sequences a replica decodes together: its `decode_slots` (an engine's max_num_seqs),
    or, where a serving engine's paged KV cache (`call.memory_fraction`: serving_cache_tokens)
    holds fewer, as many as it holds: the server admits a sequence while its cache has room and
    preempts one when the growing sequences outrun it, so the cache runs full with sequences of
    the mean resident length, the prompt and a decoding row's mean age (length-biased, half done:
    continuous_schedule's `age`, lengths.occupancy_moments); responses of one length grow together to the full width. The
    preemptions' recomputation is not priced (documents.serving_gap)."""
    slots = decode_slots(call, option)
    call = served_call(call, option.strategy)
    if call.memory_fraction is None:
        return slots
    from realbench.dataflow.lengths import occupancy_moments, slot_occupancy

    tokens = serving_cache_tokens(call, model, cluster, option.strategy.tp, slots, option.strategy.ep)
    if call.lengths is None:
        held = float(call.seq_len)
    else:
        held = call.prompt_len + occupancy_moments(slot_occupancy(call.lengths.cdf(), call.sync_steps))[1]
    return max(1, min(slots, int(tokens // held)))


def _continuous_generate(call: CallDef, model: ModelSpec, cluster: ClusterSpec, option: Option) -> CallCost:
    """Generation by continuous batching (pp = 1, realbench.runtime.rollout): the replica's rows
    through `serving_slots` slots, `continuous_schedule`'s decode steps, each computing its slots
    (all of them until the slots drain) against the prompt plus a slot row's mean age, and its
    batched prefills; the KV cache is preallocated for every slot at the full width, or, by an
    engine's serving engine, the fraction of the device it takes is held whole (at most the
    plan's usable memory: the engine keeps its own headroom inside the fraction)."""
    from realbench.dataflow.lengths import continuous_schedule

    s = option.strategy
    call = served_call(call, s)
    tp, layers, P = s.tp, model.n_layers, call.prompt_len
    slots = serving_slots(call, model, cluster, option)
    plan = continuous_schedule(None if call.lengths is None else call.lengths.cdf(), call.seqs / s.dp, slots,
                               call.sync_steps, call.gen_len)
    g = plan.prefill_rows
    etp = 1 if s.ep > 1 else 0  # (generation's expert parallelism holds each expert whole)
    prefill = (layers * _layer_forward(cluster, model, tp, g * P, P, s.ep, etp) + _head_forward(cluster, model, tp, g)
               + _vision_forward(cluster, model, tp, g))
    layer_step, head = _decode_step(cluster, model, tp, plan.rows, P + plan.age, s.ep, etp)
    compute = plan.prefills * prefill + plan.steps * (layers * layer_step + head)
    tp_comm = (plan.prefills * layers * _tp_all_reduces(cluster, model, tp, g * P, 2)
               + plan.steps * layers * _tp_all_reduces(cluster, model, tp, plan.rows, 2)
               + plan.prefills * layers * _expert_exchanges(cluster, model, s, g * P)
               + plan.steps * layers * _expert_exchanges(cluster, model, s, plan.rows))
    weights = serving_weight_bytes(model, tp, s.ep)
    if serving_cache_problem(call, model, cluster, s):
        working = math.inf  # the server does not start: no plan holds it
    elif call.memory_fraction is not None:
        working = max(served_share_beyond_weights(call, model, cluster, tp, s.ep), 0)
    else:
        kv_cache = slots * model.sequence_cache_bytes(call.seq_len, layers, tp)
        working = kv_cache + _activation_bytes(model, tp, g * P) * 2 / 8 + _logits_bytes(model, tp, slots)
    return CallCost(compute + tp_comm, compute, tp_comm, 0.0, 0.0, 0.0, int(weights), int(weights),
                    working if math.isinf(working) else int(working))


def call_cost(call: CallDef, model: ModelSpec | FunctionSpec, cluster: ClusterSpec, option: Option,
              master_in_optimizer: bool = False, early_old_logprobs: bool = False) -> CallCost:
    """What one call costs on one option. `master_in_optimizer`: the trainer's ZeRO optimizer keeps
    the fp32 master weights beside bf16 parameters (DeepSpeed's, OpenRLHF's), not FSDP's fp32
    parameters; it decides what an offloaded optimizer moves (sharding.offloaded_state_bytes).
    `early_old_logprobs`: the engine runs a policy's old-log-probability forward as soon as the
    rollout is there, beside the other scorers (OpenRLHF's experience maker): its seconds are the
    call's `early_s`."""
    if call.kind == CallKind.FUNCTION:  # a reward function: its own CPU time per response, no weights
        t = call.seqs / option.strategy.dp * model.seconds_per_sample * len(model.functions)
        return CallCost(t, t, 0.0, 0.0, 0.0, 0.0, 0, 0, 0)
    s = option.strategy
    dp, tp, pp, m = s.dp, s.tp, s.pp, s.micro_batches
    layers = math.ceil(model.n_layers / pp)
    ep, etp = s.ep, s.etp
    # LoRA: the adapters are computed beside the base, unmerged (and held with it)
    adapters = shard_adapter_params(model, tp, pp)
    weights = (shard_params(model, tp, pp, ep, etp) + adapters) * BF16
    slots = m + pp - 1
    p2p_cross = stage_boundary_spans_nodes(cluster, option)

    if call.kind == CallKind.GENERATE and pp == 1:
        return _continuous_generate(call, model, cluster, option)
    if call.kind == CallKind.GENERATE:
        b = call.seqs / dp / m  # sequences per micro-batch
        # prefill: the prompt, pipelined like inference
        t_pre = b * call.prompt_len
        pre_stage = layers * _layer_forward(cluster, model, tp, t_pre, call.prompt_len) \
            + _stage_ends(_head_forward(cluster, model, tp, b), _vision_forward(cluster, model, tp, b), pp)
        # (only the last position's logits)
        pre_tp = layers * _tp_all_reduces(cluster, model, tp, t_pre, 2)
        pre_pp = comm.p2p(cluster, t_pre * model.hidden * BF16, p2p_cross) if pp > 1 else 0.0
        # one token's keys and values on a device (its share of a whole sequence's cache)
        kv_token = _cache_bytes_per_token(model, tp, call.seq_len) * layers / model.n_layers
        if call.lengths is not None:  # finished rows leave the batch: step by step
            decode = _decode_for_lengths(call, model, cluster, option, b, layers, p2p_cross)
            compute, tp_comm, pp_comm = (slots * pre_stage + decode[0], slots * pre_tp + decode[1],
                                         (slots * pre_pp + decode[2]) if pp > 1 else 0.0)
            kv_cache = decode[3] * kv_token
        else:  # every row decodes gen_len steps, attending to the growing context (its mean)
            layer_step, head = _decode_step(cluster, model, tp, b, call.prompt_len + call.gen_len / 2)
            dec_stage = layers * layer_step + head
            dec_tp = layers * _tp_all_reduces(cluster, model, tp, b, 2)
            dec_pp = comm.p2p(cluster, b * model.hidden * BF16, p2p_cross) if pp > 1 else 0.0
            per_token = max(m, pp)
            compute = slots * pre_stage + call.gen_len * per_token * dec_stage
            tp_comm = slots * pre_tp + call.gen_len * per_token * dec_tp
            pp_comm = (slots * pre_pp + call.gen_len * per_token * dec_pp) if pp > 1 else 0.0
            kv_cache = call.seqs / dp * call.seq_len * kv_token
        working = kv_cache + _activation_bytes(model, tp, t_pre) * 2 / 8 + _logits_bytes(model, tp, b)
        return CallCost(compute + tp_comm + pp_comm, compute, tp_comm, pp_comm, 0.0, 0.0,
                        int(weights), int(weights), int(working))

    b = call.seqs / call.optimizer_steps / dp / m
    steps = call.optimizer_steps * call.iterations  # optimizer updates
    width = call.width(b)  # a micro-batch is as wide as its longest row (the padding trimmed)
    # Ulysses (sp devices a data-parallel group): each device a 1/sp share of the micro-batch's
    # tokens through every layer, whole weights, and attention over whole sequences for 1/sp of
    # the heads: the flops, element-wise bytes and activations of tokens / sp, the weights read whole
    u = s.sp
    tokens = b * width / u
    moved = call.logits.moved_bytes if call.logits else LOGIT_BYTES
    layers_s = layers * _layer_forward(cluster, model, tp, tokens, width, ep, etp)
    # (a vision tower encodes a micro-batch's images whole on every device of a Ulysses group: verl
    # slices the sequence after it, verl/models/transformers/monkey_patch.py:158-185)
    head_s, vision_s = _head_forward(cluster, model, tp, tokens, moved), _vision_forward(cluster, model, tp, b)
    fwd = layers_s + _stage_ends(head_s, vision_s, pp)
    # the model-parallel exchanges of one forward: tp's two all-reduces a layer (a backward as many
    # again), the sequence-parallel group's (Ulysses' all-to-alls or ring attention's gathers), the
    # expert-parallel group's (a mixture of experts' dispatch and combine, as many backward)
    seq_fwd, seq_bwd = _sequence_exchanges(cluster, model, s, tokens)
    experts = layers * _expert_exchanges(cluster, model, s, tokens)
    tp_pass = layers * _tp_all_reduces(cluster, model, tp, tokens, 2)
    pass_comm, backward_comm = tp_pass + layers * seq_fwd + experts, tp_pass + layers * seq_bwd + experts
    p2p_one = comm.p2p(cluster, tokens * model.hidden * BF16, p2p_cross) if pp > 1 else 0.0
    # memory: the largest micro-batch of the device's rows of a step (padded, as wide as their
    # longest row; packed, the heaviest sum of rows, or as full as a token budget lets it be, a
    # device's budget for each of a Ulysses group's; at the distribution's memory quantile:
    # CallDef.peak_tokens), a device's 1/sp of it
    peak_tokens = call.peak_tokens(b, m, s.max_tokens * u if s.max_tokens else None) / u

    params = shard_params(model, tp, pp, ep, etp)
    # the group the sharded state and the gradients' reduction span: every device of a Ulysses group
    # holds its own share (FSDP shards over all of them) and computes gradients of its own tokens;
    # hybrid sharding splits the state within groups of shard_group devices, the replicas of each
    # shard all-reducing its gradients; a mixture of experts' routed experts, laid out over ep x etp
    # devices of a stage's dp x sp x tp, over the rest of them (Megatron's expert data parallelism)
    shards = s.state_shards
    dense, routed = model.stage_param_parts(pp, tp, ep, etp)
    expert_shards = s.shards * tp // (ep * s.expert_tp)
    apart = ep > 1 or s.expert_tp != tp  # (else the experts reduce and shard with the rest)
    dp_spans, per_node = dp_group_spans_nodes(cluster, option), max(1, cluster.gpus_per_node // tp)
    replicas = hybrid_replicas(cluster, option)
    layer = model.layer_params / tp  # one layer's parameters on a device (zero 3 gathers them)
    if call.kind == CallKind.INFERENCE:
        compute = slots * fwd
        tp_comm = slots * pass_comm
        pp_comm = slots * p2p_one
        # zero 3: the weights sharded over dp, each layer gathered as it runs (realbench.cost.sharding);
        # offloaded, each layer's share brought in from the host first (counted with the gathers)
        off = s.offload_params
        dp_comm = (sharding.overlapped_step(cluster, shards, params, layer, m, fwd, 1, dp_spans, per_node, off)
                   if s.zero == 3 else 0.0)
        weights = (params + adapters) * sharding.weight_bytes_per_param(s.zero, shards, off)
        # one layer's activations at a time (no backward), plus the logits of a micro-batch
        working = (2 * max(_activation_bytes(model, tp, peak_tokens), _vision_block_bytes(model, tp, b)) / 8
                   + _logits_held(call, model, tp, peak_tokens, False)
                   + sharding.gathered_bytes(s.zero, layer, backward=False, offloaded=off, dp=shards)
                   + _ring_buffers(model, s, peak_tokens, backward=False))
        # unsharded and offloaded (a Megatron forward-only model's param_offload): the whole bf16
        # shard loaded for the call and sent back after it (sharding's module doc); its seconds
        # are host-link time, counted where a trained model's offload counts them
        host = 0.0
        if off and s.zero != 3:
            loaded = (params + adapters) * BF16
            working += loaded
            host = 2 * loaded / cluster.host_bw
        return CallCost(compute + tp_comm + pp_comm + dp_comm + host, compute, tp_comm, pp_comm, dp_comm, host,
                        int(weights), int(weights), int(working))

    # train: forward + backward (2x forward flops; weights read again in each); with activation
    # checkpointing, the forward again during the backward (its all-reduces too), and only each
    # layer's input kept (bf16, t*h) besides the one layer being recomputed. The interleaved
    # schedule (v virtual stages) fills and drains the pipeline in chunks of 1/v of a stage, so
    # its bubble is (pp - 1) / v slots, but a micro-batch crosses v times as many boundaries.
    recompute = s.checkpointing
    v = s.virtual_stages
    train_slots = m + (pp - 1) / v
    # the backward computes the activations' gradients (one forward's FLOPs) and the weights' (one
    # more); under LoRA the frozen base has none, so the backward costs one forward (and the
    # adapters' small share of every pass)
    lora = model.lora is not None
    passes = (3 if recompute else 2) * (1 + adapter_flops_share(model)) if lora else (4 if recompute else 3)
    # (under LoRA the frozen vision tower runs forward once: nothing below its output trains)
    fwd_bwd = passes * (layers_s + _stage_ends(head_s, vision_s / passes, pp)) if lora else passes * fwd
    behaviour = behaviour_forwards(call, model)  # forwards for the old log-probabilities
    # the old-log-probability forwards, term by term (early_s where the engine runs them early)
    behaviour_compute = behaviour * slots * fwd
    behaviour_tp = behaviour * slots * pass_comm
    # logits computed chunk by chunk and again in the backward (an engine's fused kernels): one more
    # output-layer pass a slot
    recomputed = _head_forward(cluster, model, tp, tokens, moved) if call.logits and call.logits.recomputed else 0.0
    compute = steps * train_slots * (fwd_bwd + recomputed) + behaviour_compute
    tp_comm = steps * train_slots * ((2 if recompute else 1) * pass_comm + backward_comm) + behaviour_tp
    behaviour_pp = behaviour * slots * p2p_one
    pp_comm = steps * (m * v + pp - 1) * 2 * p2p_one + behaviour_pp
    # the data-parallel reduction of the gradients (a dp group that spans nodes has gpus_per_node /
    # tp members on each: ranks are tp apart), or ZeRO's collectives (realbench.cost.sharding)
    behaviour_dp = behaviour * sharding.overlapped_step(cluster, shards, params, layer, m, fwd, 1, dp_spans, per_node) \
        if s.zero == 3 else 0.0
    early = behaviour_compute + behaviour_tp + behaviour_pp + behaviour_dp if early_old_logprobs else 0.0
    if s.zero == 3:
        dp_comm = steps * sharding.overlapped_step(cluster, shards, params, layer, m, fwd_bwd, 3, dp_spans, per_node,
                                                   replicas=replicas) + behaviour_dp
    elif apart and not lora:
        expert_per_node = max(1, cluster.gpus_per_node // (ep * s.expert_tp))
        dp_comm = steps * (sharding.step_communication(cluster, s.zero, shards, dense, m, dp_spans, per_node, replicas)
                           + sharding.step_communication(cluster, s.zero, expert_shards, routed, m, dp_spans,
                                                         expert_per_node))
    else:
        dp_comm = steps * sharding.step_communication(cluster, s.zero, shards, params, m, dp_spans, per_node, replicas)
    trained = adapters if lora else params  # what has gradients and optimizer state
    if lora and s.zero != 3:
        dp_comm = steps * sharding.step_communication(cluster, s.zero, shards, trained, m, dp_spans, per_node, replicas)
    updated = trained / shards if s.zero else trained  # ZeRO: each replica updates its share
    if s.zero and apart and not lora:
        updated = dense / shards + routed / expert_shards
    optimizer = steps * memory_time(cluster, updated * ADAM_BYTES_MOVED_PER_PARAM)
    # the first stage holds the activations of min(m, pp) micro-batches under 1F1B; interleaved,
    # min(2 (pp - 1) + (v - 1) pp + 1, m v) chunks of 1 / v of its layers (realbench.plan.pipeline)
    in_flight = activations_in_flight(m, pp, v)
    kept = peak_tokens * model.hidden * BF16 if recompute else _activation_bytes(model, tp, peak_tokens)
    working = (in_flight * layers * kept + (_activation_bytes(model, tp, peak_tokens) if recompute else 0)
               + max(_logits_held(call, model, tp, peak_tokens, True),
                     _logits_held(call, model, tp, peak_tokens, False) if behaviour else 0.0)
               + sharding.gathered_bytes(s.zero, layer, backward=True)
               + _ring_buffers(model, s, peak_tokens, backward=True)
               + (0.0 if lora else in_flight * _vision_activation_bytes(model, tp, b, recompute)))
    # LoRA: the frozen base keeps its bf16 weights only (no gradients, no optimizer state)
    master = (params * sharding.weight_bytes_per_param(s.zero, shards)
              + adapters * sharding.trained_bytes_per_param(s.zero, shards)
              if lora else params * sharding.trained_bytes_per_param(s.zero, shards))
    if apart and not lora:
        master = (dense * sharding.trained_bytes_per_param(s.zero, shards)
                  + routed * sharding.trained_bytes_per_param(s.zero, expert_shards))
    weights = (params + adapters) * sharding.weight_bytes_per_param(s.zero, shards)
    if s.offload_params:  # on the device during the call only: in and out around each engine call
        held = sharding.offloaded_train_bytes(weights)  # (no adapters: realbench.plan.options)
        master, working = master - held, working + held
        optimizer += (1 + (behaviour > 0)) * 2 * float(sharding.offloaded_param_bytes(s.zero, weights)) / cluster.host_bw
    if s.host_adam:  # the states on the host for good, and Adam run there (sharding.host_adam_step)
        master -= trained / (shards if s.zero else 1) * sharding.STATE_BYTES
        optimizer = steps * sharding.host_adam_step(cluster, s.zero, trained, shards, m)
    if s.offload_optimizer:  # the states on the device during this call only, moved in and out once
        states = sharding.offloaded_state_bytes(s.zero, trained, shards, master_in_optimizer)
        master, working = master - states, working + states
        optimizer += 2 * states / cluster.host_bw
    return CallCost(compute + tp_comm + pp_comm + dp_comm + optimizer, compute, tp_comm, pp_comm, dp_comm,
                    optimizer, int(weights), int(master), int(working), early)
