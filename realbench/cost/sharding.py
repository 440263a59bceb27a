"""Data-parallel sharding: ZeRO stages 1 to 3 and FSDP, as the engines that train RLHF at scale
run them (DeepSpeed in OpenRLHF, FSDP in verl and AReaL, Megatron's distributed optimizer).
Pure functions; realbench.cost.calls prices a call with them.

Notation: P parameters on a device's tensor- and pipeline-parallel shard, d data-parallel
replicas sharing them, m micro-batches per optimizer step; V = 2 P bytes of bf16 values.

Memory per parameter of the shard (bf16 weights and gradients, fp32 master weights and the two
Adam moments: 2 + 2 + 12 bytes), Rajbhandari et al. 2020, Figure 1:
    zero 0   none sharded                                   16
    zero 1   optimizer states (Megatron's distributed optimizer)   4 + 12 / d
    zero 2   and gradients                                   2 + 14 / d
    zero 3   and weights (FSDP's full shard)                 16 / d,  plus the gathered bf16
             weights (and in a backward, gradients) of the layers in flight: the one computing and
             the one prefetched
A forward-only call under zero 3 holds 2 / d bytes a parameter and gathers each layer as it runs;
with its parameters offloaded (FSDP's CPU offload, `offload_params`: verl's reference) it holds
none between calls: the shard lives in host memory in full precision (4 / d bytes, verl's fp32
model_dtype) and each layer's share crosses the host link (PCIe) before its gather, in every
micro-batch's forward (FSDP unshards per forward), beside one layer's fp32 share in flight.
Unsharded (zero 0: verl's Megatron reference with `param_offload`), a forward-only model's bf16
shard waits in host memory between calls and is loaded whole onto the device before each call and
sent back after it (the engine's eval context, verl/workers/engine/base.py:314-333, moves the model
only: workers/engine/megatron/transformer_impl.py:722-744, utils/megatron_utils.py): 2 bytes a
parameter of the tp x pp shard each way, on the device during the call only.
A trained model with its parameters offloaded (verl's `param_offload`, `offload_params` on its train
call) keeps them in host memory between calls: every call on its layout brings them in and sends
them back (verl's engine contexts, workers/engine/base.py:314-333: the old log-probabilities'
forward and the update of a policy are two such calls, a critic's values and update two more), and
so does the weight sync to another layout (FSDP1, verl's default `strategy: fsdp`, unshards the
module on the device, workers/engine/fsdp/transformer_impl.py:977-1022; Megatron loads the model
for it, workers/engine/megatron/transformer_impl.py:1090; realbench.cost.simulate). What moves:
    zero 3 (FSDP)       the fp32 shard, 4 / d bytes a parameter (which realbench counts as the bf16
                        weights and gradients of the 16), on the device during each call
    zero 0 or 1         Megatron's bf16 parameter buffer, 2 bytes a parameter of the tp x pp shard;
    (Megatron)          its gradient buffer is freed and allocated again, not moved
                        (verl/utils/megatron_utils.py:713-847): 4 bytes a parameter off the device
                        between calls, back for the update, 2 for a forward-only call
A train call with its optimizer offloaded (verl's `optimizer_offload`, `offload_optimizer`) keeps
its states in host memory between updates: they cross the host link in before the call's first
update and out after its last, on the device only while the call runs. FSDP moves Adam's two fp32
moments (8 / d bytes a parameter; the fp32 weights are FSDP's parameters, verl/utils/fsdp_utils.py:
241-261); Megatron its optimizer's fp32 main weights and moments (12 / d with the distributed
optimizer, 12 without; verl/utils/megatron_utils.py:849-960). DeepSpeed's ZeRO optimizers keep the
fp32 master weights beside bf16 parameters, and its `offload_states` (OpenRLHF's --ds.enable_sleep,
openrlhf/utils/deepspeed/deepspeed_utils.py:150-190) moves them with the moments, 12 / d, and under
ZeRO-3 also its bf16 gradient partition, 14 / d (deepspeed 0.19.6 runtime/zero/stage3.py:3571-3655,
stage_1_and_2.py:2921-3030: stage 1 and 2 free their partitioned gradients after each step; the
gradient bucket is freed, not moved).

A train call whose Adam runs on the host (`host_adam`: DeepSpeed's ZeRO-Offload, offload_optimizer
device cpu, OpenRLHF's --ds.adam_offload) keeps the fp32 master weights and moments in host memory
for good: the device holds the bf16 weights and gradients of its stage, none of the 12 / d. Each
optimizer step (deepspeed 0.19.6, bf16):
    the rank's gradient partition crosses to the host in fp32 after the last micro-batch's
    backward (stage_1_and_2.py:1585-1615, stage3.py:1397-1411)                         4 / d
    DeepSpeedCPUAdam updates the P / d fp32 partition on the host (ops/adam/cpu_adam.py; its
    OpenMP threads: under Ray, OMP_NUM_THREADS = the actor's num_cpus, 1 in OpenRLHF,
    ray/_private/utils.py:230-267, openrlhf/trainer/ray/launcher.py:255): P / d / rate seconds
    the updated partition comes back in bf16 (stage_1_and_2.py:2350-2351, stage3.py:2594)  2 / d
    stage 2 also moves each micro-batch's bf16 gradient partition out, and from the second one
    on the running sum in and out again, on the compute stream (overlap_comm is off by default
    for stages 1 and 2, runtime/zero/config.py:383-386; stage_1_and_2.py:1526-1570): 4 (m - 1) / d;
    stage 3's per-micro-batch copies run on its reduction stream beside the backward (overlap_comm
    on), hidden. Nothing overlaps the CPU step with the GPU (no ZenFlow, no super_offload).

Communication in the data-parallel group per optimizer step (ring collectives over d devices,
realbench.cost.comm; a reduce-scatter moves what an all-gather does):
    zero 0   all-reduce of the gradients once (DDP; realbench's runtime)        2 (d-1)/d V
    zero 1   reduce-scatter of the accumulated gradients, then all-gather of the updated weights:
             the all-reduce's bytes
    zero 2   a reduce-scatter of each micro-batch's gradients as the backward makes them (DeepSpeed
             reduces into the owner's partition), then the all-gather:  (m + 1) (d-1)/d V
    zero 3   per micro-batch: the weights gathered for the forward and again for the backward (freed
             after each layer: FSDP's reshard_after_forward), the gradients reduce-scattered:
             3 (d-1)/d V per micro-batch, prefetched layer by layer while the previous layer computes
Hybrid sharding (FSDP's HYBRID_SHARD and HSDP, verl's fsdp_size f): the d devices split into d / f
groups of f consecutive ones; each group shards the state as above with f for d (memory 16 / f
under zero 3, Adam over P / f), and its collectives run over f devices; after each micro-batch's
reduce-scatter, each gradient shard is all-reduced across the r = d / f groups (the devices holding
the same shard, f apart: FSDP1's post-backward hook, torch/distributed/fsdp/_runtime_utils.py
_reduce_grad; FSDP2's, _fully_shard/_fsdp_collectives.py foreach_reduce, on a stream of its own,
beside the backward like the reduce-scatter): 2 (r-1)/r V / f a micro-batch. With f the devices
of a node, the gathers stay on NVLink and only the all-reduce of a 1/f shard crosses the network:
2 (r-1)/r V / f over each device's NIC, against full sharding's 3 (N-1)/N V / f over them for its
three passes on N nodes. The two then run on different links, layer after layer, so a
micro-batch's collectives take the slower of the two (as NCCL's two-level collectives take the
slower of their phases, realbench.cost.comm); groups that span nodes share the NICs with the
all-reduce, which adds to them.

Overlap: zero 3's gathers and reductions run beside the compute (the next layer's weights are
fetched while this one computes), so a micro-batch takes max(compute, its collectives) plus one
layer's gather that nothing hides; the other stages' collectives follow the backward, as the
cost model prices DDP's all-reduce. Adam updates P / d parameters with zero >= 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from realbench.cost import comm
from realbench.hardware import ClusterSpec

BF16 = 2
FP32 = 4
STATE_BYTES = 12  # fp32 master weights and Adam's two moments
MOMENT_BYTES = 8  # Adam's two moments alone (an offloaded optimizer's)


def trained_bytes_per_param(zero: int, dp: int) -> float:
    """What a trained model keeps per parameter of its tp x pp shard (module doc)."""
    if zero == 0:
        return 2 * BF16 + STATE_BYTES
    if zero == 1:
        return 2 * BF16 + STATE_BYTES / dp
    if zero == 2:
        return BF16 + (BF16 + STATE_BYTES) / dp
    return (2 * BF16 + STATE_BYTES) / dp


def weight_bytes_per_param(zero: int, dp: int, offloaded: bool = False) -> float:
    """The bf16 weights a device holds per parameter of its shard between calls (offloaded: none)."""
    if offloaded:
        return 0.0
    return BF16 / dp if zero == 3 else BF16


def host_copy(cluster: ClusterSpec, dp: int, params: float) -> float:
    """Seconds to bring a device's share of `params` offloaded parameters from host memory: their
    fp32 shard over the host link (module doc)."""
    return params / dp * FP32 / cluster.host_bw


def offloaded_state_bytes(zero: int, trained: float, dp: int, master_in_optimizer: bool = False) -> float:
    """The optimizer states of a device's share of `trained` parameters that an offloaded
    optimizer keeps in host memory between updates (module doc): FSDP's moments (zero 2 or 3);
    Megatron's fp32 main weights and moments (0 or 1); `master_in_optimizer`, DeepSpeed's fp32
    master weights and moments, under ZeRO-3 with its bf16 gradient partition."""
    if zero >= 2 and not master_in_optimizer:
        return trained / dp * MOMENT_BYTES
    if zero == 3:
        return trained / dp * (STATE_BYTES + BF16)
    return trained / (dp if zero else 1) * STATE_BYTES


def host_adam_seconds(params: float, rate: float, threads: int = 1) -> float:
    """Seconds of DeepSpeed's CPU Adam over `params` fp32 parameters on `threads` host threads of
    `rate` parameters a second each (module doc)."""
    return params / (rate * threads)


def host_adam_step(cluster: ClusterSpec, zero: int, trained: float, dp: int, micro_batches: int) -> float:
    """Seconds one optimizer step of ZeRO-Offload adds on a device (module doc): its gradient
    partition to the host in fp32, CPU Adam on one thread, the bf16 partition back; under stage 2
    the running gradient sum's trips of the micro-batches before the last."""
    shard = trained / dp
    moved = shard * (FP32 + BF16) + (shard * 2 * BF16 * (micro_batches - 1) if zero == 2 else 0.0)
    return moved / cluster.host_bw + host_adam_seconds(shard, cluster.host_adam_rate)


def offloaded_param_bytes(zero, weight_bytes):
    """What crosses the host link each way when a trained model's offloaded parameters come to
    the device for a call (module doc), from the bf16 weights its layout holds
    (`weight_bytes_per_param`): FSDP's fp32 shard is twice them (zero 3), Megatron's bf16 buffer
    is them (0 or 1). Elementwise over arrays (the simulator's options)."""
    return weight_bytes * np.where(np.asarray(zero) == 3, FP32 / BF16, 1.0)


def offloaded_train_bytes(weight_bytes: float) -> float:
    """What an offloaded trained model keeps off the device between calls, back for its update
    (module doc): its weights and gradients as realbench counts them, twice the bf16 weights its
    layout holds (FSDP's fp32 shard is as large; Megatron frees its gradients)."""
    return 2 * weight_bytes


def gathered_bytes(zero: int, layer_params: float, backward: bool, offloaded: bool = False, dp: int = 1) -> float:
    """Zero 3's unsharded layers in flight (the computing one and the prefetched one): their bf16
    weights, and in a backward their gradients before the reduce-scatter; offloaded, also one
    layer's fp32 share copied in from the host."""
    if zero != 3:
        return 0.0
    return 2 * layer_params * BF16 * (2 if backward else 1) + (layer_params / dp * FP32 if offloaded else 0.0)


@dataclass(frozen=True)
class Replicas:
    """Hybrid sharding's groups holding the same shard (module doc): how many, whether they span
    nodes, and how many of them a node holds where they do. One (the default): full sharding."""

    count: int = 1
    spans_nodes: bool = False
    per_node: int = 1
    # the shard groups inside a node and the replicas across nodes: the groups' collectives on
    # NVLink, the all-reduce on the NICs, beside each other (module doc)
    own_links: bool = False

    def with_groups(self, group_seconds: float, shard_bytes: float, all_reduces: int, cluster: ClusterSpec) -> float:
        """Seconds of a group's collectives (`group_seconds`) with `all_reduces` all-reduces of a
        `shard_bytes` gradient shard across the replicas: the slower where they run on links of
        their own, else one after the other."""
        across = all_reduces * self.all_reduce(cluster, shard_bytes)
        return max(group_seconds, across) if self.own_links else group_seconds + across

    def all_reduce(self, cluster: ClusterSpec, shard_bytes: float) -> float:
        """Seconds to all-reduce one gradient shard of `shard_bytes` across the replicas."""
        return comm.all_reduce(cluster, self.count, shard_bytes, self.spans_nodes, self.per_node)


FULL_SHARD = Replicas()


def step_communication(cluster: ClusterSpec, zero: int, dp: int, params: float, micro_batches: int,
                       spans_nodes: bool, per_node: int, replicas: Replicas = FULL_SHARD) -> float:
    """Seconds of the data-parallel collectives of one optimizer step that follow the backward
    (zero 0 to 2; module doc), `dp` the devices the state is sharded over (a hybrid group's, with
    the `replicas` of it). Zero 3's run beside the compute: `overlapped_step`."""
    if dp * replicas.count <= 1:
        return 0.0
    nbytes = params * BF16
    gather = comm.all_gather(cluster, dp, nbytes, spans_nodes, per_node)
    if zero == 0:
        return comm.all_reduce(cluster, dp, nbytes, spans_nodes, per_node)
    if zero == 1:
        return 2 * gather  # reduce-scatter, then all-gather
    if zero == 2:
        return replicas.with_groups((micro_batches + 1) * gather, nbytes / dp, micro_batches, cluster)
    return 0.0


def overlapped_step(cluster: ClusterSpec, dp: int, params: float, layer_params: float, micro_batches: int,
                    compute_per_micro_batch: float, passes: int, spans_nodes: bool, per_node: int,
                    offloaded: bool = False, replicas: Replicas = FULL_SHARD) -> float:
    """Zero 3: the seconds its collectives add to one optimizer step of `micro_batches`
    micro-batches, each `compute_per_micro_batch` seconds of compute, with `passes` collectives
    of the whole shard per micro-batch (3 for a train step: gather, gather, reduce-scatter; 1 for
    a forward) over the `dp` devices the state is sharded over, and in a train step the gradient
    shard's all-reduce across hybrid sharding's `replicas`: m max(0, collectives - compute) plus
    the first layer's gather, which nothing hides. Offloaded (a forward), each layer's share comes
    in from the host before its gather, in the same stream: per micro-batch the shard's host copy
    plus the gather."""
    if dp <= 1 and replicas.count <= 1:
        return 0.0
    per_micro_batch = passes * comm.all_gather(cluster, dp, params * BF16, spans_nodes, per_node)
    if passes > 1:  # (a backward's reduce-scatter: its shard then crosses the replicas)
        per_micro_batch = replicas.with_groups(per_micro_batch, params * BF16 / dp, 1, cluster)
    first = comm.all_gather(cluster, dp, layer_params * BF16, spans_nodes, per_node)
    if offloaded:
        per_micro_batch += host_copy(cluster, dp, params)
        first += host_copy(cluster, dp, layer_params)
    return micro_batches * max(0.0, per_micro_batch - compute_per_micro_batch) + first
