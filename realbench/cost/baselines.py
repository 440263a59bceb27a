"""Baseline plans the search must beat (REAL.md section 6).

* symmetric: one (dp, tp, pp) for every call on the whole cluster, as Megatron-style systems
  run RLHF. Every strategy that all calls accept is tried, with each call's micro-batch count
  searched too; the fastest plan that fits in memory wins.
* heuristic: a ReaL-style hand-written plan. Generation and training use the whole cluster;
  inference calls that do not depend on each other run concurrently on disjoint, equal parts of
  it. Each call takes its fastest option on its mesh that keeps the plan within memory, train
  calls first (their master copies stay resident).
"""

from __future__ import annotations

import itertools
import math

import networkx as nx
import numpy as np

from realbench.cost.simulate import Estimator
from realbench.dataflow import CallKind
from realbench.plan.mesh import Mesh, mesh_problem

MAX_SYMMETRIC_COMBOS = 4096


def _whole_cluster(est: Estimator) -> Mesh:
    c = est.cluster
    return Mesh(0, c.nodes, 0, c.gpus_per_node)


def symmetric_plan(est: Estimator) -> tuple[int, ...]:
    mesh = _whole_cluster(est)
    by_strategy: list[dict[tuple, list[int]]] = []
    for i in range(est.n):
        groups: dict[tuple, list[int]] = {}
        for k in _fitting(est, i, est.options[i].on_mesh(mesh)):
            o = est.options[i][k]
            groups.setdefault((o.strategy.dp, o.strategy.tp, o.strategy.pp), []).append(int(k))
        by_strategy.append(groups)
    common = set(by_strategy[0]).intersection(*by_strategy[1:])
    rows = []
    for key in sorted(common):
        variants = [g[key] for g in by_strategy]
        if math.prod(len(v) for v in variants) <= MAX_SYMMETRIC_COMBOS:
            rows.extend(itertools.product(*variants))
        else:  # each call's fastest and its leanest micro-batch count
            rows.append(tuple(min(v, key=lambda k, i=i: est.dur[i][k]) for i, v in enumerate(variants)))
            rows.append(tuple(min(v, key=lambda k, i=i: est.working[i][k]) for i, v in enumerate(variants)))
    if not rows:
        raise ValueError("no 3D strategy fits every call on the whole cluster")
    return _best(est, np.array(rows, dtype=np.int64))


def _fitting(est: Estimator, i: int, indices) -> list[int]:
    """The options among `indices` that fit in memory alone (costing only their blocks)."""
    k = np.asarray(list(indices), dtype=np.int64)
    if not len(k):
        return []
    own = (est.master_bytes if est.master_of[i] == i else est.weights)[i][k]
    return k[own + est.working[i][k] <= est.capacity].tolist()


def _best(est: Estimator, rows: np.ndarray) -> tuple[int, ...]:
    """The fastest row that fits in memory (the least memory-hungry one if none fits)."""
    best_k, best = -1, (True, math.inf)
    for start in range(0, len(rows), 2048):
        t, mem = est.evaluate_batch(rows[start:start + 2048])
        oom = mem > est.capacity
        scores = np.where(oom, np.inf, t)
        k = int(np.argmin(scores))
        if not oom[k] and (False, t[k]) < best:
            best, best_k = (False, float(t[k])), start + k
        if best_k < 0:
            k = int(np.argmin(mem))
            if (True, float(mem[k])) < best:
                best, best_k = (True, float(mem[k])), start + k
    return tuple(int(x) for x in rows[best_k])


def _split(est: Estimator, parts: int) -> list[Mesh]:
    """The cluster cut into `parts` (a power of two) equal contiguous valid meshes."""
    c = est.cluster
    size = c.n_devices // parts
    meshes = []
    for p in range(parts):
        start = p * size
        if size >= c.gpus_per_node:
            mesh = Mesh(start // c.gpus_per_node, size // c.gpus_per_node, 0, c.gpus_per_node)
        else:
            mesh = Mesh(start // c.gpus_per_node, 1, start % c.gpus_per_node, size)
        if mesh_problem(mesh, c):
            return []
        meshes.append(mesh)
    return meshes


LOOKAHEAD_TRIES = 64  # options of a call tried, fastest first, before settling for the fastest that fits
LOOKAHEAD_POOL = 256  # a later call's leanest options (alone) that the look-ahead places beside a plan


def _leanest(est: Estimator, i: int, indices) -> list[int]:
    """The LOOKAHEAD_POOL options among `indices` that need the least memory alone (master copy
    or weights plus working set): a 4,096-GPU cluster offers a call millions, and pricing every
    one beside a partial plan took the heuristic 40 s, while the leanest alone are the leanest
    beside it but for their reallocation buffers."""
    k = np.asarray(indices, dtype=np.int64)
    own = (est.master_bytes if est.master_of[i] == i else est.weights)[i][k] + est.working[i][k]
    if len(k) > LOOKAHEAD_POOL:
        k = k[np.argpartition(own, LOOKAHEAD_POOL)[:LOOKAHEAD_POOL]]
    return k.tolist()


def _completes(est: Estimator, partial: np.ndarray, later: list[tuple[int, Mesh]]) -> bool:
    """Whether the later calls can still be placed beside the partial plan: each takes, in
    turn, its least memory-hungry option (on its mesh, else anywhere; among its leanest alone),
    and every step fits."""
    row = partial.copy()
    for j, mesh in later:
        best = None
        for pool in (_leanest(est, j, _fitting(est, j, est.options[j].on_mesh(mesh))),
                     _leanest(est, j, est.candidates(j))):
            if pool:
                rows = np.tile(row, (len(pool), 1))
                rows[:, j] = pool
                mem = est.peak_memory_batch(rows)
                if mem.min() <= est.capacity:
                    best = pool[int(np.argmin(mem))]
                    break
        if best is None:
            return False
        row[j] = best
    return True


def heuristic_plan(est: Estimator) -> tuple[int, ...]:
    whole = _whole_cluster(est)
    df = est.scenario.dataflow
    dag = nx.DiGraph((u, v) for u, v, d in df.graph.edges(data=True) if d["lag"] == 0)
    dag.add_nodes_from(df.call_names)
    closure = nx.transitive_closure_dag(dag)
    # inference calls grouped by depth; within a depth none depends on another
    depth = {n: 0 for n in df.call_names}
    for n in nx.topological_sort(dag):
        for v in dag.successors(n):
            depth[v] = max(depth[v], depth[n] + 1)
    target: dict[int, Mesh] = {}
    for d in set(depth.values()):
        group = [est.call_names.index(n) for n in df.call_names
                 if depth[n] == d and df.call(n).kind == CallKind.INFERENCE]
        group = [i for i in group if not any(closure.has_edge(est.call_names[i], est.call_names[j]) for j in group)]
        parts = 1 << (len(group).bit_length() - 1) if group else 1
        while parts > 1 and not _split(est, parts):
            parts //= 2
        meshes = _split(est, parts) if parts > 1 else [whole]
        for r, i in enumerate(group):
            target[i] = meshes[r % len(meshes)]
    order = sorted(range(est.n), key=lambda i: (est.calls[i].kind != CallKind.TRAIN, i))
    choice = [-1] * est.n
    for i in order:
        mesh = target.get(i, whole)
        later = [(j, target.get(j, whole)) for j in order if choice[j] < 0 and j != i]
        for pool in (_fitting(est, i, est.options[i].on_mesh(mesh)), None):
            if pool is None:  # nothing on its mesh fits alone: any option (the whole table)
                pool = [int(k) for k in est.candidates(i)]
            if not pool:
                continue
            pool.sort(key=lambda k: est.dur[i][k])
            rows = np.tile(np.array(choice, dtype=np.int64), (len(pool), 1))
            rows[:, i] = pool
            fitting = np.flatnonzero(est.peak_memory_batch(rows) <= est.capacity)
            if not len(fitting):
                continue
            # the fastest option after which every later call still has one that fits (a greedy
            # that packs the first trained model tightly can leave generation no room at all)
            choice[i] = next((pool[r] for r in fitting[:LOOKAHEAD_TRIES]
                              if _completes(est, rows[r], later)), pool[fitting[0]])
            break
        if choice[i] < 0:  # nothing fits: keep the fastest, the plan will report oom
            cands = est.candidates(i)
            choice[i] = int(min(cands if len(cands) else range(len(est.options[i])), key=lambda k: est.dur[i][k]))
    return tuple(choice)


BASELINES = {"symmetric": symmetric_plan, "heuristic": heuristic_plan}
