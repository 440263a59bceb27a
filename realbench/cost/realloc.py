"""Cost of moving a model's weights between two layouts, and of moving call outputs.

Reallocation (REAL.md section 7): every destination device must hold the bf16 weights of its
shard in the new layout (its pp stage's layers, its tp slice; of a mixture of experts' routed
experts, its ep share of them split over etp). Any dp replica of the source can
serve it, and the transfers of different destinations proceed in parallel, so the slowest
destination decides:

    time = max over destination stages j of  shard_bytes(j) / bandwidth(j) + latency

bandwidth(j) is the intra-node bandwidth when every node that holds devices of destination
stage j also holds (in the source layout) all the layers stage j needs, and the inter-node
bandwidth otherwise. A destination that already holds its shard costs nothing: equal layouts,
and pp = 1 layouts where the destination mesh lies inside the source mesh and the source is
either unsharded or sharded the same way (tp innermost puts the same slice on the same device).
Other partial reuse of local data is not credited, so the cost is an upper bound.

A source that shards its weights over data parallelism (zero 3: FSDP, ZeRO-3) holds no whole
tp shard anywhere: first its data-parallel group all-gathers them (each device ends with the
shard's V / tp bytes: (d-1)/d V / tp over the group's links, realbench.cost.comm; verl's hybrid
engine gathers each tensor with FSDP's full_tensor before handing it to the co-located rollout,
verl/workers/engine_workers.py in 0.9.1), then the transfer above runs from that unsharded
layout. A zero-3 destination is charged its whole tp shard where it must receive (it keeps a
1/d slice of it): an upper bound, like the rest.

LoRA (`model.lora`): the base is frozen, so a layout that holds it once (the run's first
step) receives only the adapters from then on, and a call on the base alone (a LoRA policy's
reference) nothing: the steady state priced per iteration (`adapters_only`). Or, a plan's
choice per call (`Strategy.merge_lora`, verl's `lora.merge`), the layout receives the adapters
merged into the base, W + s B A (the base's shapes and bytes), every step, and holds that copy
during its call only: more bytes moved, less memory held. The merge itself (2 r in out FLOPs per
projection on the trainer's shards: what a forward of r tokens costs, against the step's many
thousand) is not priced.

Data transfer: a consumer on another mesh receives the bytes of the keys it reads from the
producer (4 bytes per token per key) over the slowest link between the two meshes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from realbench.cost import comm
from realbench.hardware import ClusterSpec
from realbench.models import ModelSpec, layer_param_prefix, stage_start
from realbench.plan.mesh import Option

BF16 = 2
BYTES_PER_TOKEN_PER_KEY = 4


@dataclass(frozen=True)
class Layouts:
    """Many layouts as arrays, one entry each: first device, device count, tp, pp, the zero
    stage (only 3 matters: the weights sharded over dp) and the devices a zero-3 layout shards
    them over (dp x sp, or hybrid sharding's group: Strategy.state_shards; left out, all of its
    data-parallel devices); a mixture of experts' ep and the devices an expert is split over
    (Strategy.expert_tp; left out, 1 and tp). (dp and micro-batches do not matter otherwise:
    every dp replica holds the same shards.)"""

    start: np.ndarray
    size: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    zero: np.ndarray
    shard: Optional[np.ndarray] = None
    ep: Optional[np.ndarray] = None
    etp: Optional[np.ndarray] = None

    def __post_init__(self):
        if self.shard is None:
            object.__setattr__(self, "shard", self.size // (self.tp * self.pp))
        if self.ep is None:
            object.__setattr__(self, "ep", np.ones_like(self.tp))
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)

    @classmethod
    def of(cls, options: list[Option], gpus_per_node: int) -> "Layouts":
        col = lambda f: np.array([f(o) for o in options], dtype=np.int64)  # noqa: E731
        return cls(col(lambda o: o.mesh.start(gpus_per_node)), col(lambda o: o.mesh.size),
                   col(lambda o: o.strategy.tp), col(lambda o: o.strategy.pp), col(lambda o: o.strategy.zero),
                   col(lambda o: o.strategy.state_shards), col(lambda o: o.strategy.ep),
                   col(lambda o: o.strategy.expert_tp))

    def rows(self, which: np.ndarray) -> "Layouts":
        """The entries `which` selects (a boolean mask or indices)."""
        return Layouts(*(a[which] for a in self.arrays()))

    def arrays(self) -> tuple[np.ndarray, ...]:
        return self.start, self.size, self.tp, self.pp, self.zero, self.shard, self.ep, self.etp


def holds_same_shards(src: Layouts, dst: Layouts) -> np.ndarray:
    """Per pair: whether every destination device already holds its shard (no transfer)."""
    src_whole = src.zero != 3
    same_experts = (src.ep == dst.ep) & (src.etp == dst.etp)
    same_layout = (src.start == dst.start) & (src.size == dst.size) & (src.tp == dst.tp) & (src.pp == dst.pp) \
        & (src_whole == (dst.zero != 3)) & (src_whole | (src.shard == dst.shard)) & same_experts
    inside = src_whole & (src.pp == 1) & (dst.pp == 1) & ((src.tp == 1) | (src.tp == dst.tp)) \
        & (src.start <= dst.start) & (dst.start + dst.size <= src.start + src.size) \
        & (src.ep == 1) & (dst.ep == 1) & (src.etp == src.tp) & (dst.etp == dst.tp)
    return same_layout | inside


def gather_times(model: ModelSpec, cluster: ClusterSpec, src: Layouts, adapters_only: bool = False) -> np.ndarray:
    """Seconds for each zero-3 source's sharding group to all-gather its tp shard of the weights
    (module doc), or of the LoRA adapters alone; 0 for the others. Zero 3 runs without pipelines
    (pp 1): the group is every tp-th device of the mesh (of a hybrid shard group's consecutive
    devices, which every replica gathers at once), G / tp of them on each node when it spans nodes."""
    G = cluster.gpus_per_node
    nbytes = float(model.adapter_params if adapters_only else model.n_params) * BF16 / src.tp
    t = comm.all_gather(cluster, src.shard, nbytes, src.shard * src.tp > G, np.maximum(1, G // src.tp))
    return np.where(src.zero == 3, t, 0.0)


def realloc_times(model: ModelSpec, cluster: ClusterSpec, src: Layouts, dst: Layouts, adapters_only: bool = False
                  ) -> np.ndarray:
    """Seconds to move the weights from each layout of `src` to the same entry of `dst` (see the
    module doc), for all pairs at once: one column per destination stage, padded to the largest pp.

    A destination stage is local when every node it occupies lies in the source mesh and holds
    complete copies of the stage's layers. The layers a source node holds run from the first
    layer of the stage of its first device to the end of the stage of its last device, and both
    grow with the node (stages follow device order), so over a stage's nodes f..l it is enough
    that node l's first layer and node f's end layer enclose the stage's layers."""
    G, L = cluster.gpus_per_node, model.n_layers
    if len(dst.pp) == 0:
        return np.zeros(0)
    # int32 halves the memory traffic of these (pairs x stages) grids (device and layer numbers are small)
    gather = gather_times(model, cluster, src, adapters_only)
    src, dst = (Layouts(*(a.astype(np.int32) for a in x.arrays())) for x in (src, dst))
    j = np.arange(int(dst.pp.max()), dtype=np.int32)[None, :]  # destination stage
    pp = dst.pp[:, None]
    lo, hi = stage_start(L, pp, j), stage_start(L, pp, j + 1)
    ends = np.where(pp == 1, model.ends_params(1),
                    np.where(j == 0, model.embedding_params, np.where(j == pp - 1, model.head_params, 0)))
    if adapters_only:  # LoRA, once the destination holds the frozen base: each stage's adapters
        nbytes = (hi - lo) * float(model.layer_adapter_params) * BF16 / dst.tp[:, None]
    else:  # the stage's layers (a mixture of experts' routed experts over ep x etp, the rest over tp)
        dense, routed = layer_param_prefix(model, "dense"), layer_param_prefix(model, "routed")
        a, b = np.clip(lo, 0, L), np.clip(hi, 0, L)  # (stages past a layout's pp: masked below)
        nbytes = ((dense[b] - dense[a] + ends) / dst.tp[:, None]
                  + (routed[b] - routed[a]) / (dst.ep * dst.etp)[:, None]) * BF16
    width = dst.size[:, None] // pp  # devices per destination stage (dp * tp)
    first = dst.start[:, None] + j * width
    first_node, last_node = first // G, (first + width - 1) // G
    s_start, s_size, s_pp = src.start[:, None], src.size[:, None], src.pp[:, None]
    s_width = s_size // s_pp
    local = (s_start // G <= first_node) & (last_node <= (s_start + s_size - 1) // G)
    # node `last`'s first device and node `first`'s last device, as stages of the source mesh
    # (clipped where the stage is not local anyway)
    a = np.clip((np.maximum(last_node * G, s_start) - s_start) // s_width, 0, s_pp - 1)
    b = np.clip((np.minimum((first_node + 1) * G, s_start + s_size) - 1 - s_start) // s_width, 0, s_pp - 1)
    local &= (stage_start(L, s_pp, a) <= lo) & (stage_start(L, s_pp, b + 1) >= hi)
    t = np.where(local, nbytes / cluster.intra_bw + cluster.intra_latency_s,
                 nbytes / cluster.inter_bw + cluster.inter_latency_s)
    worst = np.where(j < pp, t, 0.0).max(axis=1)
    return _after_gather(src, dst, gather, worst)


def _after_gather(src: Layouts, dst: Layouts, gather: np.ndarray, transfer: np.ndarray) -> np.ndarray:
    """Nothing where the destination already holds its shards; else the zero-3 source's gather,
    then `transfer` unless the gathered (unsharded) source holds them."""
    whole = Layouts(src.start, src.size, src.tp, src.pp, np.zeros_like(src.zero), src.shard, src.ep, src.etp)
    return np.where(holds_same_shards(src, dst), 0.0, gather + np.where(holds_same_shards(whole, dst), 0.0, transfer))


def broadcast_times(model: ModelSpec, cluster: ClusterSpec, src: Layouts, dst: Layouts, adapters_only: bool = False
                    ) -> np.ndarray:
    """Seconds for OpenRLHF's weight sync to vLLM (trainer/ray/ppo_actor.py:409-490 in 0.11.2): each
    tensor gathered whole (zero 3: the data-parallel all-gather, `gather_times`), then broadcast
    from the trainer's first device to every GPU of the engines, each receiving the whole tensor
    (vLLM reshards it itself): the model's bf16 bytes over the slowest link of the broadcast (a
    pipelined broadcast moves them once over each), inside the first device's node or across
    nodes. On the same GPUs (the hybrid engine's CUDA IPC handles) nothing moves after the gather.
    `adapters_only`: a LoRA model's adapters alone (AReaL's LoRA update sends the trainable
    parameters, areal/engine/fsdp_engine.py:1598-1604 in 1.0.4; OpenRLHF 0.11.2 sends every one)."""
    G = cluster.gpus_per_node
    nbytes = float(model.adapter_params if adapters_only else model.n_params) * BF16
    same_node = (dst.start // G == src.start // G) & ((dst.start + dst.size - 1) // G == src.start // G)
    t = np.where(same_node, nbytes / cluster.intra_bw + cluster.intra_latency_s,
                 nbytes / cluster.inter_bw + cluster.inter_latency_s)
    return _after_gather(src, dst, gather_times(model, cluster, src, adapters_only), t)


def realloc_time(model: ModelSpec, cluster: ClusterSpec, src: Option, dst: Option) -> float:
    """Seconds to move the weights from layout `src` to layout `dst`."""
    G = cluster.gpus_per_node
    return float(realloc_times(model, cluster, Layouts.of([src], G), Layouts.of([dst], G))[0])


def transfer_time(cluster: ClusterSpec, nbytes: float, src: Option, dst: Option) -> float:
    if src.mesh == dst.mesh or nbytes <= 0:
        return 0.0
    one_node = src.mesh.nodes == 1 and dst.mesh.nodes == 1 and src.mesh.node == dst.mesh.node
    if one_node:
        return nbytes / cluster.intra_bw + cluster.intra_latency_s
    return nbytes / cluster.inter_bw + cluster.inter_latency_s


def transfer_bytes(seqs: int, seq_len: int, n_keys: int) -> float:
    return float(seqs * seq_len * n_keys * BYTES_PER_TOKEN_PER_KEY)

