"""Collective communication costs over the cluster's links (alpha-beta model).

For a group of n devices inside one node (NVLink bandwidth B per device, latency a):
  * ring all-reduce of S bytes:   2 (n-1)/n * S / B + 2 (n-1) a
  * all-gather of S bytes total:  (n-1)/n * S / B + (n-1) a
  * broadcast of S bytes (pipelined ring): S / B + (n-1) a
  * point-to-point of S bytes:    S / B + a
  * all-to-all of S bytes a device (each keeps 1/n and sends 1/n to every other):
                                  (n-1)/n * S / B + a
    (NCCL runs the n-1 exchanges at once, grouped sends and receives: one latency); across nodes
    with k devices on each, max((k-1)/n S / B + a, (n-k)/n S / B_out + a_out)

A group that spans N nodes with k devices on each is reduced hierarchically, as NCCL does with
one NIC per GPU: the k devices of a node split the data over NVLink, each device exchanges its
S/k share with its peers on the other nodes over its own NIC (bandwidth B_out, latency a_out),
and the shares come back together over NVLink. The two phases are pipelined, so the slower sets
the pace:

    all-reduce: 2 (k-1) a + 2 (N-1) a_out + max(2 (k-1)/k * S / B,  2 (N-1)/N * (S/k) / B_out)
    all-gather:   (k-1) a +   (N-1) a_out + max(  (k-1)/k * S / B,    (N-1)/N * (S/k) / B_out)

With k = 1 (one device per node, as in a data-parallel group of tp = 8 replicas) this is the
plain ring over the NICs. `realbench bench fidelity` checks these formulas against published
nccl-tests bus bandwidths inside a node and across nodes (AWS p4de/p5, GCP A3 Mega, 8 x H200).
"""

from __future__ import annotations

import numpy as np

from realbench.hardware import ClusterSpec


def link(cluster: ClusterSpec, spans_nodes: bool) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) of the slowest link in a group."""
    if spans_nodes:
        return cluster.inter_bw, cluster.inter_latency_s
    return cluster.intra_bw, cluster.intra_latency_s


def _hierarchical(cluster: ClusterSpec, n, nbytes, per_node, factor: float):
    """factor 2: all-reduce; 1: all-gather (see the module doc). Elementwise over arrays."""
    k = np.maximum(1, np.minimum(per_node, n))
    nodes = np.maximum(1, n // k)
    t_in = factor * (k - 1) / k * nbytes / cluster.intra_bw
    t_out = factor * (nodes - 1) / nodes * (nbytes / k) / cluster.inter_bw
    return factor * ((k - 1) * cluster.intra_latency_s + (nodes - 1) * cluster.inter_latency_s) \
        + np.maximum(t_in, t_out)


def all_reduce(cluster: ClusterSpec, n: int, nbytes: float, spans_nodes: bool, per_node: int = 1) -> float:
    """`per_node`: the group's devices on each node when it spans nodes."""
    if n <= 1:
        return 0.0
    if spans_nodes:
        return _hierarchical(cluster, n, nbytes, per_node, 2.0)
    bw, lat = link(cluster, False)
    return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * lat


def all_gather(cluster: ClusterSpec, n, nbytes, spans_nodes, per_node=1):
    """Seconds for each of `n` devices to end with all `nbytes` (a reduce-scatter moves as much).
    Scalars give a float; arrays (one group per entry) an array."""
    n, nbytes, spans, per_node = (np.asarray(x) for x in (n, nbytes, spans_nodes, per_node))
    flat = (n - 1) / np.maximum(n, 1) * nbytes / cluster.intra_bw + (n - 1) * cluster.intra_latency_s
    out = np.where(n > 1, np.where(spans, _hierarchical(cluster, n, nbytes, per_node, 1.0), flat), 0.0)
    return float(out) if out.ndim == 0 else out


def all_to_all(cluster: ClusterSpec, n: int, nbytes: float, per_node: int = 0) -> float:
    """Seconds for `n` devices, each holding `nbytes`, to exchange all but their own 1/n of them
    (Ulysses' head and sequence exchanges, a mixture of experts' dispatch and combine). Inside one
    node (`per_node` 0 or at least n): over NVLink. A group of `per_node` devices on each of several
    nodes sends the (n - per_node) / n bound for other nodes over each device's NIC while the rest
    goes over NVLink: the slower sets the pace."""
    if n <= 1:
        return 0.0
    if not per_node or per_node >= n:
        return (n - 1) / n * nbytes / cluster.intra_bw + cluster.intra_latency_s
    inside = (per_node - 1) / n * nbytes / cluster.intra_bw + cluster.intra_latency_s
    across = (n - per_node) / n * nbytes / cluster.inter_bw + cluster.inter_latency_s
    return max(inside, across)


def broadcast(cluster: ClusterSpec, n: int, nbytes: float, spans_nodes: bool) -> float:
    if n <= 1:
        return 0.0
    bw, lat = link(cluster, spans_nodes)
    return nbytes / bw + (n - 1) * lat


def p2p(cluster: ClusterSpec, nbytes: float, spans_nodes: bool) -> float:
    bw, lat = link(cluster, spans_nodes)
    return nbytes / bw + lat
