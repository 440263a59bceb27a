"""Device meshes and 3D strategies.

A mesh is a contiguous range of devices of the cluster in one of two shapes (REAL.md section 4):
  * inside one node: an aligned power-of-two block, `gpus` devices at local offset `gpu`,
    with `gpu % gpus == 0`;
  * across nodes: `nodes` whole consecutive nodes starting at `node`.
Both shapes are contiguous in device ids (node-major numbering), so a mesh is also the range
[start, end) and two meshes overlap iff their ranges do.

A strategy (dp, tp, pp, micro_batches) places mesh rank r as
    tp_rank = r % tp,  dp_rank = (r // tp) % dp,  pp_rank = r // (tp * dp)
(tp innermost, on consecutive devices, then dp, then pp). Since tp divides the node size and
meshes are aligned, a tensor-parallel group never leaves a node.

Labels: "n3:4-7" (node 3, devices 4..7), "n3:5" (one device), "n3" (all of node 3),
"n2-5" (whole nodes 2..5).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Optional

from realbench.errors import ConfigError
from realbench.hardware import ClusterSpec


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass(frozen=True, slots=True)
class Mesh:
    node: int
    nodes: int
    gpu: int
    gpus: int  # devices used per node (all of them when nodes > 1)

    @property
    def size(self) -> int:
        return self.nodes * self.gpus

    def start(self, gpus_per_node: int) -> int:
        return self.node * gpus_per_node + self.gpu

    def devices(self, gpus_per_node: int) -> range:
        s = self.start(gpus_per_node)
        return range(s, s + self.size)

    def label(self, gpus_per_node: int) -> str:
        if self.nodes > 1:
            return f"n{self.node}-{self.node + self.nodes - 1}"
        if self.gpus == gpus_per_node:
            return f"n{self.node}"
        if self.gpus == 1:
            return f"n{self.node}:{self.gpu}"
        return f"n{self.node}:{self.gpu}-{self.gpu + self.gpus - 1}"


_LABEL = re.compile(r"^n(\d+)(?:-(\d+)|:(\d+)(?:-(\d+))?)?$")


def parse_mesh(label: str, cluster: ClusterSpec) -> Mesh:
    """Mesh from its label; raises ConfigError when malformed or invalid on `cluster`."""
    m = _LABEL.match(label.strip()) if isinstance(label, str) else None
    if not m:
        raise ConfigError(f"{label!r} is not a mesh label (forms: n0, n0-3, n0:2, n0:4-7)")
    node = int(m.group(1))
    G = cluster.gpus_per_node
    if m.group(2) is not None:
        last = int(m.group(2))
        if last < node:
            raise ConfigError(f"mesh {label!r} ends before it starts")
        mesh = Mesh(node, last - node + 1, 0, G)
    elif m.group(3) is not None:
        first = int(m.group(3))
        last = int(m.group(4)) if m.group(4) is not None else first
        if last < first:
            raise ConfigError(f"mesh {label!r} ends before it starts")
        mesh = Mesh(node, 1, first, last - first + 1)
    else:
        mesh = Mesh(node, 1, 0, G)
    problem = mesh_problem(mesh, cluster)
    if problem:
        raise ConfigError(f"mesh {label!r}: {problem}")
    return mesh


def mesh_problem(mesh: Mesh, cluster: ClusterSpec) -> Optional[str]:
    """Why `mesh` is not a valid mesh of `cluster`, or None."""
    G, N = cluster.gpus_per_node, cluster.nodes
    if mesh.node < 0 or mesh.nodes < 1 or mesh.node + mesh.nodes > N:
        return f"nodes {mesh.node}..{mesh.node + mesh.nodes - 1} are outside the cluster's {N} node(s)"
    if mesh.nodes > 1:
        if (mesh.gpu, mesh.gpus) != (0, G):
            return "a mesh over several nodes must use whole nodes"
        return None
    if mesh.gpu < 0 or mesh.gpus < 1 or mesh.gpu + mesh.gpus > G:
        return f"devices {mesh.gpu}..{mesh.gpu + mesh.gpus - 1} are outside the node's {G} device(s)"
    if not is_pow2(mesh.gpus):
        return f"{mesh.gpus} devices is not a power of two"
    if mesh.gpu % mesh.gpus:
        return f"a block of {mesh.gpus} devices must start at a multiple of {mesh.gpus} (starts at {mesh.gpu})"
    return None


def all_meshes(cluster: ClusterSpec) -> Iterator[Mesh]:
    """Every valid mesh, smallest first, then by position."""
    G, N = cluster.gpus_per_node, cluster.nodes
    size = 1
    while size <= G:
        for node in range(N):
            for gpu in range(0, G, size):
                yield Mesh(node, 1, gpu, size)
        size *= 2
    for nodes in range(2, N + 1):
        for node in range(N - nodes + 1):
            yield Mesh(node, nodes, 0, G)


# how a ring-attention group exchanges keys and values (Strategy.ring; realbench.cost.calls prices both)
RING_KINDS = {"allgather": "ring attention (ring-flash-attention's all-gathers, OpenRLHF's ring_attn_size)",
              "p2p": "context parallelism (Transformer Engine's ring of point-to-point sends, Megatron's)"}


@dataclass(frozen=True, slots=True)
class Strategy:
    dp: int
    tp: int
    pp: int
    micro_batches: int = 1
    # train calls: keep only each layer's input and recompute the layer in the backward pass
    # (one more forward, far fewer activations in memory)
    checkpointing: bool = False
    # train calls on a pipeline: each rank holds this many chunks of layers, round robin
    # (Megatron's interleaved 1F1B schedule: the bubble shrinks by this factor)
    virtual_stages: int = 1
    # data-parallel sharding (realbench.cost.sharding): 0 none (each replica holds everything),
    # 1 the optimizer states (ZeRO-1, Megatron's distributed optimizer), 2 also the gradients
    # (ZeRO-2), 3 also the weights (ZeRO-3, FSDP's full shard); the engines' strategies, which
    # realbench's runtime does not run
    zero: int = 0
    # calls of a LoRA model other than its training (generation, inference with the adapters on):
    # the layout receives W + s B A, the adapters merged into the base, every step and keeps no
    # copy between steps; off, it keeps its own copy of the frozen base and receives only the
    # adapters (realbench.cost.realloc)
    merge_lora: bool = False
    # the parameters kept in host memory: a forward-only call under zero 3 copies its fp32 shards
    # to the device for every micro-batch's forward (FSDP's CPU offload, which verl forces on its
    # reference); a train call's model (under zero 3, FSDP; or 0 and 1, Megatron) brings them in
    # for each call on its layout and sends them back after it, as its weight sync does (verl's
    # param_offload); an engine's, which realbench's runtime does not run
    offload_params: bool = False
    # train calls: the optimizer's states kept in host memory between updates, brought in before
    # the call's first update and sent back after its last (verl's optimizer_offload: FSDP's
    # moments, Megatron's main weights and moments); an engine's, which realbench's runtime does
    # not run
    offload_optimizer: bool = False
    # train calls: the optimizer's states in host memory for good and Adam run there, each step's
    # gradients sent to the host and the updated weights back (DeepSpeed's ZeRO-Offload, OpenRLHF's
    # --ds.adam_offload); an engine's, which realbench's runtime does not run
    host_adam: bool = False
    # inference and train calls whose rows an engine packs without padding: the engine forms the
    # micro-batches by tokens, each within this many a device (AReaL's max_tokens_per_mb, verl's and
    # OpenRLHF's dynamic batch size), and memory is planned for one that full (CallDef.peak_tokens);
    # None: so many rows each. An engine's, which realbench's runtime does not run
    max_tokens: Optional[int] = None
    # inference and train calls under FSDP (zero 2 or 3, tp 1, pp 1): Ulysses sequence parallelism,
    # each data-parallel group's micro-batches split by sequence over `sp` consecutive devices, which
    # exchange heads for sequence around attention (all-to-alls) and shard the weights with every
    # other device (the sharding group is dp x sp); verl's ulysses_sequence_parallel_size. An
    # engine's, which realbench's runtime does not run
    sp: int = 1
    # with sp > 1: the group attends by ring attention instead of Ulysses' head exchanges, each
    # device keeping its heads of its 1/sp of the tokens (RING_KINDS): "allgather", the whole group's
    # keys and values gathered layer by layer (OpenRLHF's --ds.ring_attn_size, ring-flash-attention's
    # llama3 kernels, under any DeepSpeed ZeRO stage, beside its tp, without pp); "p2p", the keys and values
    # passed around the ring chunk by chunk (Megatron's context parallelism, Transformer Engine's
    # default cp_comm_type, beside tp and pp); "": Ulysses. An engine's, which realbench's runtime
    # does not run
    ring: str = ""
    # under zero 2 or 3: the state sharded within groups of this many consecutive devices of the
    # dp x sp, each group a whole replica, and each backward's gradient shards all-reduced across the
    # groups (FSDP's hybrid sharding, HYBRID_SHARD or HSDP; verl's fsdp_size); 0: over all dp x sp
    # devices. An engine's, which realbench's runtime does not run
    shard_group: int = 0
    # generation by an engine's serving engine: the share of each GPU's memory it takes (vLLM's
    # gpu_memory_utilization, SGLang's mem_fraction_static), which bounds its KV cache and so its
    # decode slots (realbench.cost.calls.serving_slots); None: the scenario's
    # (dataflow.memory_fraction). A plan's choice, searched inside the engines
    memory_fraction: Optional[float] = None
    # a mixture of experts' routed experts split over `ep` devices (expert parallelism), each expert
    # over `etp` of them (expert tensor parallelism; 0: tp's, as Megatron defaults it); the rest of
    # the model laid out by dp, sp, tp and pp. Train and inference calls fold ep x etp out of the
    # dp x sp x tp devices of a pipeline stage (Megatron's parallel folding: tokens go from their
    # attention rank to their experts' and back, an all-to-all each way a layer); generation splits
    # the experts over whole tp replicas (vLLM's and SGLang's expert parallelism, etp 1) or over none
    # (ep 1: each replica holds every expert, split as tp splits it)
    ep: int = 1
    etp: int = 0
    # generation by an engine's serving engine colocated with other calls: the server keeps its
    # share of each GPU (its weights and KV cache) through the whole step instead of releasing it
    # after generating (verl's rollout.free_cache_engine false, OpenRLHF's hybrid engine without
    # --vllm.enable_sleep): the other calls on its devices run beside it. An engine's, which
    # realbench's runtime does not run
    keeps_memory: bool = False

    @property
    def size(self) -> int:
        return self.dp * self.sp * self.tp * self.pp

    @property
    def expert_tp(self) -> int:
        """The devices one expert is split over: etp, or tp where it is 0."""
        return self.etp or self.tp

    @property
    def shards(self) -> int:
        """The devices a model's gradients are reduced over: dp x sp."""
        return self.dp * self.sp

    @property
    def state_shards(self) -> int:
        """The devices a model's sharded state (zero) is split over: its shard group, or dp x sp."""
        return self.shard_group or self.shards

    def label(self) -> str:
        return (f"dp{self.dp}tp{self.tp}pp{self.pp}m{self.micro_batches}" + ("ac" if self.checkpointing else "")
                + (f"v{self.virtual_stages}" if self.virtual_stages > 1 else "")
                + (f"z{self.zero}" if self.zero else "") + ("merged" if self.merge_lora else "")
                + ("off" if self.offload_params else "") + ("optoff" if self.offload_optimizer else "")
                + ("cpuadam" if self.host_adam else "") + (f"t{self.max_tokens}" if self.max_tokens else "")
                + (f"sp{self.sp}" if self.sp > 1 else "") + ({"allgather": "ring", "p2p": "cp"}.get(self.ring, ""))
                + (f"h{self.shard_group}" if self.shard_group else "")
                + (f"f{self.memory_fraction:g}" if self.memory_fraction is not None else "")
                + (f"ep{self.ep}" if self.ep > 1 else "") + (f"etp{self.etp}" if self.etp else "")
                + ("kept" if self.keeps_memory else ""))


@dataclass(frozen=True, slots=True)
class Option:
    """One placement of a call: where (mesh) and how (strategy)."""

    mesh: Mesh
    strategy: Strategy

    def label(self, gpus_per_node: int) -> str:
        return f"{self.mesh.label(gpus_per_node)}/{self.strategy.label()}"


def devices_spanned(options: dict, gpus_per_node: int) -> int:
    """Devices 0..n-1 a plan's options span, up to its last used device (the processes a run of it
    needs: device i is global rank i)."""
    return max(o.mesh.start(gpus_per_node) + o.mesh.size for o in options.values())
