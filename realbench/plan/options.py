"""Which (mesh, strategy) options a call may use, and the size of the plan space.

Rules (REAL.md section 4), for a call of `seqs` sequences on a model with `n_heads` heads:
  * dp * tp * pp == mesh size;
  * tp divides the devices per node (a tensor-parallel group stays inside a node) and divides
    both the attention heads and the KV heads;
  * 1 <= pp <= number of layers;
  * the batch splits evenly into dp x micro_batches (per optimizer step for train calls);
  * micro_batches is a power of two up to MAX_MICRO_BATCHES;
  * train calls may checkpoint activations (recompute each layer in the backward pass), others not.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional

from realbench.dataflow import CallDef, CallKind
from realbench.hardware import ClusterSpec
from realbench.models import FunctionSpec, ModelSpec
from realbench.plan.mesh import Mesh, Option, Strategy, all_meshes, is_pow2, mesh_problem

MAX_MICRO_BATCHES = 16


def strategy_problem(call: CallDef, model: ModelSpec | FunctionSpec, cluster: ClusterSpec, mesh: Mesh,
                     s: Strategy) -> Optional[tuple[str, str]]:
    """(field, reason) why `s` cannot run `call` on `mesh`, or None. Fields name plan keys.
    A reward function has no model to split: its processes share the responses (dp only)."""
    if min(s.dp, s.tp, s.pp, s.micro_batches) < 1:
        return "dp", "dp, tp, pp and micro_batches must be at least 1"
    if s.size != mesh.size:
        return "dp", f"dp*tp*pp = {s.dp}*{s.tp}*{s.pp} = {s.size} but the mesh has {mesh.size} device(s)"
    if isinstance(model, FunctionSpec):
        if (s.tp, s.pp, s.micro_batches) != (1, 1, 1):
            return "dp", f"a reward function ({model.name}) splits its responses over dp only: tp, pp and micro_batches are 1"
        if call.seqs % s.dp:
            return "dp", f"the batch of {call.seqs} responses does not split into dp = {s.dp}"
        return None
    if cluster.gpus_per_node % s.tp:
        return "tp", f"tp {s.tp} does not divide the {cluster.gpus_per_node} devices of a node"
    if model.n_heads % s.tp or model.n_kv_heads % s.tp:
        return "tp", (f"tp {s.tp} does not divide the {model.n_heads} attention heads and "
                      f"{model.n_kv_heads} KV heads of {model.name}")
    if s.pp > model.n_layers:
        return "pp", f"pp {s.pp} exceeds the {model.n_layers} layers of {model.name}"
    if s.checkpointing and call.kind != CallKind.TRAIN:
        return "activation_checkpointing", "activation checkpointing is for train calls (it saves backward memory)"
    if not is_pow2(s.micro_batches) or s.micro_batches > MAX_MICRO_BATCHES:
        return "micro_batches", f"micro_batches {s.micro_batches} is not a power of two up to {MAX_MICRO_BATCHES}"
    batch = call.seqs // call.optimizer_steps
    if batch % (s.dp * s.micro_batches):
        return "micro_batches", (f"the batch of {batch} sequences does not split into "
                                 f"dp*micro_batches = {s.dp}*{s.micro_batches}")
    return None


def option_problem(call: CallDef, model: ModelSpec, cluster: ClusterSpec, option: Option
                   ) -> Optional[tuple[str, str]]:
    problem = mesh_problem(option.mesh, cluster)
    if problem:
        return "mesh", problem
    return strategy_problem(call, model, cluster, option.mesh, option.strategy)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def strategies_for(call: CallDef, model: ModelSpec, cluster: ClusterSpec, mesh: Mesh) -> list[Strategy]:
    """All strategies valid for `call` on `mesh` (they do not depend on the mesh's position)."""
    return list(_strategies(call, model, cluster, mesh.size))


@lru_cache(maxsize=4096)
def _strategies(call: CallDef, model: ModelSpec, cluster: ClusterSpec, size: int) -> tuple[Strategy, ...]:
    out = []
    probe = Mesh(0, 1, 0, size)  # only the size matters to strategy_problem
    for tp in _divisors(math.gcd(size, cluster.gpus_per_node)):
        for pp in _divisors(size // tp):
            dp = size // tp // pp
            m = 1
            while m <= MAX_MICRO_BATCHES:
                for checkpointing in ((False, True) if call.kind == CallKind.TRAIN else (False,)):
                    s = Strategy(dp, tp, pp, m, checkpointing)
                    if strategy_problem(call, model, cluster, probe, s) is None:
                        out.append(s)
                m *= 2
    return tuple(out)


def enumerate_options(call: CallDef, model: ModelSpec, cluster: ClusterSpec) -> list[Option]:
    """Every feasible option of a call, ordered by mesh (small first) then strategy."""
    return [Option(mesh, s) for mesh in all_meshes(cluster) for s in _strategies(call, model, cluster, mesh.size)]
