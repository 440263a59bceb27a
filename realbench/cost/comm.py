"""Collective communication costs over the cluster's links (alpha-beta model).

For a group of n devices whose slowest link has bandwidth B and latency a:
  * ring all-reduce of S bytes:   2 (n-1)/n * S / B + 2 (n-1) a
  * all-gather of S bytes total:  (n-1)/n * S / B + (n-1) a
  * broadcast of S bytes (pipelined ring): S / B + (n-1) a
  * point-to-point of S bytes:    S / B + a
A group is intra-node when all its devices sit on one node, otherwise its slowest link is a NIC.
"""

from __future__ import annotations

from realbench.hardware import ClusterSpec


def link(cluster: ClusterSpec, spans_nodes: bool) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) of the slowest link in a group."""
    if spans_nodes:
        return cluster.inter_bw, cluster.inter_latency_s
    return cluster.intra_bw, cluster.intra_latency_s


def all_reduce(cluster: ClusterSpec, n: int, nbytes: float, spans_nodes: bool) -> float:
    if n <= 1:
        return 0.0
    bw, lat = link(cluster, spans_nodes)
    return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * lat


def all_gather(cluster: ClusterSpec, n: int, nbytes: float, spans_nodes: bool) -> float:
    if n <= 1:
        return 0.0
    bw, lat = link(cluster, spans_nodes)
    return (n - 1) / n * nbytes / bw + (n - 1) * lat


def broadcast(cluster: ClusterSpec, n: int, nbytes: float, spans_nodes: bool) -> float:
    if n <= 1:
        return 0.0
    bw, lat = link(cluster, spans_nodes)
    return nbytes / bw + (n - 1) * lat


def p2p(cluster: ClusterSpec, nbytes: float, spans_nodes: bool) -> float:
    bw, lat = link(cluster, spans_nodes)
    return nbytes / bw + lat
