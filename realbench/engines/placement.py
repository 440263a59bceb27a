"""Groups of GPUs placed on the cluster's nodes, as engines that give each role a group of its own
(OpenRLHF's Ray placement groups, AReaL's allocations) have Ray place them: `place`, and whether
meshes share no GPU (`disjoint`)."""

from __future__ import annotations

from realbench.errors import ConfigError
from realbench.plan.mesh import Mesh, is_pow2


def place(groups: list[tuple[str, int]], per_node: int) -> tuple[dict[str, Mesh], int]:
    """Meshes for GPU groups (name, size), largest first (whole nodes, then aligned power-of-two
    blocks inside a node, first fit: how Ray's PACK strategy fills nodes), and the nodes used."""
    for name, size in groups:
        if not ((size < per_node and is_pow2(size)) or size % per_node == 0):
            raise ConfigError(f"{size} GPUs: realbench places a group on a power-of-two block of a node of {per_node} "
                              "or on whole nodes", name)
    meshes: dict[str, Mesh] = {}
    node, free = 0, []  # free: (node, first gpu, size) blocks left inside nodes
    for name, size in sorted(groups, key=lambda g: -g[1]):
        if size >= per_node:
            meshes[name] = Mesh(node, size // per_node, 0, per_node)
            node += size // per_node
            continue
        for i, (n, g, s) in enumerate(free):
            if s >= size:
                meshes[name] = Mesh(n, 1, g, size)
                free[i] = (n, g + size, s - size)
                break
        else:
            meshes[name] = Mesh(node, 1, 0, size)
            free.append((node, size, per_node - size))
            node += 1
    return meshes, node


def disjoint(meshes: list[Mesh], G: int) -> bool:
    spans = sorted((m.start(G), m.start(G) + m.size) for m in meshes)
    return all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
