"""Cost of moving a model's weights between two layouts, and of moving call outputs.

Reallocation (REAL.md section 7): every destination device must hold the bf16 weights of its
shard in the new layout (its pp stage's layers, its tp slice). Any dp replica of the source can
serve it, and the transfers of different destinations proceed in parallel, so the slowest
destination decides:

    time = max over destination stages j of  shard_bytes(j) / bandwidth(j) + latency

bandwidth(j) is the intra-node bandwidth when every node that holds devices of destination
stage j also holds (in the source layout) all the layers stage j needs, and the inter-node
bandwidth otherwise. A destination that already holds its shard costs nothing: equal layouts,
and pp = 1 layouts where the destination mesh lies inside the source mesh and the source is
either unsharded or sharded the same way (tp innermost puts the same slice on the same device).
Other partial reuse of local data is not credited, so the cost is an upper bound.

Data transfer: a consumer on another mesh receives the bytes of the keys it reads from the
producer (4 bytes per token per key) over the slowest link between the two meshes.
"""

from __future__ import annotations

from realbench.hardware import ClusterSpec
from realbench.models import ModelSpec
from realbench.models import stage_layers
from realbench.plan.mesh import Option

BF16 = 2
BYTES_PER_TOKEN_PER_KEY = 4


def holds_same_shards(src: Option, dst: Option, gpus_per_node: int) -> bool:
    s, d = src.strategy, dst.strategy
    if src.mesh == dst.mesh and (s.tp, s.pp) == (d.tp, d.pp):
        return True
    if s.pp == 1 and d.pp == 1 and s.tp in (1, d.tp):
        a, b = src.mesh.devices(gpus_per_node), dst.mesh.devices(gpus_per_node)
        return a.start <= b.start and b.stop <= a.stop
    return False


def source_coverage(model: ModelSpec, cluster: ClusterSpec, src: Option) -> dict[int, tuple[int, int]]:
    """Layers [lo, hi) that the source layout holds complete copies of, per node (a contiguous
    range, as pipeline stages are contiguous and every node of a stage holds whole tp groups)."""
    G, s = cluster.gpus_per_node, src.strategy
    start, width = src.mesh.start(G), s.dp * s.tp  # width: devices per source stage
    out = {}
    for node in range(src.mesh.node, src.mesh.node + src.mesh.nodes):
        first = max(node * G, start) - start
        last = min((node + 1) * G, start + src.mesh.size) - 1 - start
        out[node] = (stage_layers(model.n_layers, s.pp, first // width)[0],
                     stage_layers(model.n_layers, s.pp, last // width)[1])
    return out


def destination_stages(model: ModelSpec, cluster: ClusterSpec, dst: Option) -> list[tuple[float, int, int, range]]:
    """Per destination stage: (bytes per device, first layer, end layer, nodes it occupies)."""
    G, d = cluster.gpus_per_node, dst.strategy
    start, width = dst.mesh.start(G), d.dp * d.tp
    out = []
    for j in range(d.pp):
        lo, hi = stage_layers(model.n_layers, d.pp, j)
        nbytes = (hi - lo) * model.layer_params
        if d.pp == 1:
            nbytes += model.ends_params(1)
        elif j == 0:
            nbytes += model.embedding_params
        elif j == d.pp - 1:
            nbytes += model.head_params
        first = start + j * width
        out.append((nbytes * BF16 / d.tp, lo, hi, range(first // G, (first + width - 1) // G + 1)))
    return out


def realloc_time(model: ModelSpec, cluster: ClusterSpec, src: Option, dst: Option,
                 coverage: dict | None = None, stages: list | None = None) -> float:
    """Seconds to move the weights from layout `src` to layout `dst` (see the module doc).
    `coverage` and `stages` may be passed in precomputed (the simulator caches them)."""
    if holds_same_shards(src, dst, cluster.gpus_per_node):
        return 0.0
    coverage = source_coverage(model, cluster, src) if coverage is None else coverage
    stages = destination_stages(model, cluster, dst) if stages is None else stages
    worst = 0.0
    for nbytes, lo, hi, nodes in stages:
        local = True
        for node in nodes:
            held = coverage.get(node)
            if held is None or lo < held[0] or held[1] < hi:
                local = False
                break
        t = nbytes / cluster.intra_bw + cluster.intra_latency_s if local else \
            nbytes / cluster.inter_bw + cluster.inter_latency_s
        if t > worst:
            worst = t
    return worst


def transfer_time(cluster: ClusterSpec, nbytes: float, src: Option, dst: Option) -> float:
    if src.mesh == dst.mesh or nbytes <= 0:
        return 0.0
    one_node = src.mesh.nodes == 1 and dst.mesh.nodes == 1 and src.mesh.node == dst.mesh.node
    if one_node:
        return nbytes / cluster.intra_bw + cluster.intra_latency_s
    return nbytes / cluster.inter_bw + cluster.inter_latency_s


def transfer_bytes(seqs: int, seq_len: int, n_keys: int) -> float:
    return float(seqs * seq_len * n_keys * BYTES_PER_TOKEN_PER_KEY)


def layout_key(option: Option) -> tuple:
    """What a reallocation depends on: the mesh, tp and pp (not dp or micro-batches)."""
    return (option.mesh, option.strategy.tp, option.strategy.pp)

