"""The dataflow simulator: time per iteration and peak memory of plans, many at once.

A plan is a choice of option per call. The simulator unrolls `iterations` iterations of the
dataflow and list-schedules its tasks in a fixed order (iteration, then topological order):
  * a task starts when its dependencies are done and every device of its mesh is free
    (tasks on overlapping meshes serialize, tasks on disjoint meshes run at the same time);
  * a call depends on its data producers (plus the transfer of their outputs when the meshes
    differ), on the model's other calls of the iteration if it is a train call, and on the
    model's train call of the previous iteration (the parameter version);
  * where a call runs its model in a layout other than the model's master layout (the train
    call's, or the first call's for a frozen model), a reallocation task moves the weights first;
    it occupies the source and the destination meshes and can start as soon as the new version
    of the weights exists;
  * asynchronous RL (`dataflow.max_staleness` S > 0): a generation of a trained model runs
    ahead: it generates with the weights it has, then its reallocation task moves the weights
    for its next batch, carrying the version the train call wrote S iterations before.
With a profile of the scenario's kind of device that measured the runtime's exchange (its
all-to-all of a call's inputs), a call's inputs move in a transfer task before it, as the runtime
moves them: one exchange among the producers' dp heads and the consumer's processes (on one
mesh too), which occupies their processes (so on a shared mesh the transfers of consecutive
calls queue behind each other, as the runtime's do); a reallocation costs one round more. Where the profile's processes outnumber its cores
(a CPU), a call's time lies between its time alone and its time with every process busy (both
measured), by how many processes the tasks overlapping it keep busy in a first schedule of the
calls alone (Estimator._crowded); the plan is then scheduled again with those times.
The objective is the steady-state time per iteration: the ends of the last iterations' apart,
over a window of steady_window(S) iterations. Synchronous, the list schedule is periodic from
the second iteration on, so two iterations give the steady state exactly; running ahead, it
repeats after a start-up every k <= S + 1 iterations (steady_iterations; tests check both
against longer unrolls).

Peak memory per device = the master copies it holds (a trained model's 16 bytes/param, a
frozen model's weights) + the largest working set (activations, KV cache, reallocated weights)
of the calls it runs.

Everything is vectorized over a batch of plans (numpy, one row per plan): per-option costs are
computed once per Estimator and gathered by index, reallocation costs are cached per layout pair,
so evaluating a plan is mostly scheduling arithmetic on arrays. A single plan is a batch of one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import numpy as np

from realbench.cost.calls import call_cost
from realbench.cost.profiled import profiled_call_times, profiled_exchange, profiled_links
from realbench.cost.realloc import Layouts, broadcast_times, holds_same_shards, realloc_times, transfer_bytes
from realbench.cost.sharding import offloaded_param_bytes
from realbench.dataflow import CallKind
from realbench.hardware.profile import shares_cores
from realbench.plan.mesh import Option
from realbench.plan.options import OptionSet
from realbench.plan.scenario import Scenario

COLUMNS = ("dur", "alone", "early", "lo", "hi", "tp", "pp", "micro_batches", "zero", "shard", "merge_lora", "offload_params",
           "node", "mesh_id", "layout_id", "ep", "etp", "expert_layout", "keeps_memory", "working", "weights",
           "master_bytes")
COST_COLUMNS = ("dur", "alone", "early", "working", "weights", "master_bytes")  # per option (the others: per placement)

# engines whose trainer sends generation the whole weights from its first GPU (OpenRLHF to its vLLM
# engines, AReaL's xccl update to its servers), not a reshard between layouts as verl's and realbench's
BROADCAST_ENGINES = ("openrlhf", "areal")
# engines that do so where generation runs ahead on GPUs of its own: verl's one-step-off entry point
# (its NCCL checkpoint engine broadcasts buckets of the gathered weights from the actor's first rank
# to the rollout's workers, verl/checkpoint_engine/nccl_checkpoint_engine.py)
BROADCAST_AHEAD_ENGINES = ("verl",)
# of the broadcasting ones, those that send a LoRA model's adapters alone (AReaL; OpenRLHF sends every parameter)
ADAPTER_BROADCAST_ENGINES = ("areal",)
# engines whose ZeRO optimizer keeps fp32 master weights beside bf16 parameters (DeepSpeed's, in
# OpenRLHF), not FSDP's fp32 parameters: what their optimizer offload moves (realbench.cost.sharding)
MASTER_IN_OPTIMIZER_ENGINES = ("openrlhf",)

# the setting that names a trained model's FSDP version, carried in a scenario's engine_settings as the
# user set it (verl's `strategy`: realbench.engines.verl.STRATEGY, which a test holds these to)
FSDP_VERSION_KEYS = {"verl": {"actor": "actor_rollout_ref.actor.strategy", "critic": "critic.strategy"}}


def sync_stages_one_way(scenario: Scenario, model: str) -> bool:
    """Whether a trained model's offloaded parameters (param_offload, under FSDP's full shard) cross
    the host link one way for a weight sync to another layout: verl's FSDP2 stages each shard onto
    the device as the sync reads it and keeps the host copy (`.to(device).full_tensor()` per tensor;
    no load of the module before nor offload after, verl/workers/engine/fsdp/transformer_impl.py:
    977-1022), where FSDP1 unshards the module on the device and sends it back (two crossings). Not
    a LoRA model's (its adapters merge on the device: the whole shard comes in and goes back)."""
    keys = FSDP_VERSION_KEYS.get(scenario.engine, {})
    if model not in keys or scenario.models[model].lora is not None:
        return False
    return scenario.engine_settings.get(keys[model]) == "fsdp2"


# engines whose rollout, colocated with its trainer, sleeps at vLLM's level 1 between generations
# (OpenRLHF's --vllm.enable_sleep under its hybrid engine: sleep() after generation, wake_up of the
# weights before the weight sync, openrlhf/trainer/ppo_utils/samples_generator.py:104-120,
# trainer/ppo_trainer.py:300-322): its weights cross the host link to host memory and back each
# step. (verl sleeps at level 2 with vLLM >= 0.18, dropping weights it receives again anyway,
# verl/third_party/vllm/__init__.py:45-48)
ROLLOUT_SLEEP_ENGINES = ("openrlhf",)
# engines that run a policy's old-log-probability forward as soon as the rollout is there, beside
# the other scorers' forwards (OpenRLHF's experience maker dispatches the actor's with the
# reference's, critic's and reward model's, openrlhf/trainer/ppo_utils/experience_maker.py:153-158),
# not after them: the train call's `early` seconds start with generation's rows alone, its rest
# once every input is there (Estimator._list_schedule). verl and AReaL run their calls one after
# another on the trainer's GPUs.
EARLY_OLD_LOGPROBS_ENGINES = ("openrlhf",)


def broadcasts_weights(scenario) -> bool:
    """Whether the scenario's engine sends its generation the whole weights by a broadcast
    (BROADCAST_ENGINES; BROADCAST_AHEAD_ENGINES with generation running ahead)."""
    return scenario.engine in BROADCAST_ENGINES or (scenario.engine in BROADCAST_AHEAD_ENGINES
                                                    and scenario.dataflow.max_staleness > 0)


class _Column:
    """One call's column of per-option numbers, computed on demand (see Estimator._gather):
    `column[k]` for option indices k, `np.asarray(column)` for all of them."""

    __slots__ = ("est", "i", "key")

    def __init__(self, est: "Estimator", i: int, key: str):
        self.est, self.i, self.key = est, i, key

    def __getitem__(self, k):
        if isinstance(k, (int, np.integer)):
            return self.est._gather(self.i, self.key, np.array([k]))[0]
        return self.est._gather(self.i, self.key, np.asarray(k))

    def __array__(self, dtype=None, copy=None):
        a = self.est._table(self.i)[self.key]
        return a if dtype is None else a.astype(dtype)

    def __len__(self) -> int:
        return len(self.est.options[self.i])

Choice = Sequence[int]  # an option index per call, in Estimator.call_names order


@dataclass(frozen=True)
class Task:
    name: str  # the call, or "realloc:<call>", "transfer:<call>" (its inputs moving to it)
    call: str
    kind: str  # "call" | "realloc" | "transfer"
    iteration: int
    start_s: float
    end_s: float
    devices: tuple[tuple[int, int], ...]  # [start, stop) device ranges it occupies


@dataclass(frozen=True)
class CallTiming:
    start_s: float
    end_s: float
    mem_bytes: int  # peak bytes per device on this call's mesh
    time_s: float  # the call alone (no waiting, no reallocation)
    realloc_s: float  # the reallocation before it (0 when its layout is the master's)


@dataclass(frozen=True)
class PlanEstimate:
    time_per_iter_s: float
    peak_mem_bytes: int
    oom: bool
    realloc_s: float  # reallocation time per iteration, summed over calls
    calls: dict[str, CallTiming]
    device_peak_bytes: tuple[int, ...]
    device_memory_bytes: int  # the device's capacity
    usable_memory_bytes: int  # what plans may use of it (ClusterSpec.memory_fraction); oom beyond
    tasks: tuple[Task, ...] = field(repr=False)
    # per call: where its time came from (profile, or analytic where the profile is silent)
    cost_source: dict[str, str] = field(default_factory=dict)
    # asynchronous RL: generation runs up to this many iterations ahead (0: synchronous)
    max_staleness: int = 0
    # one iteration from its first task's start to its last task's end (the steady state's); with
    # iterations overlapping it exceeds time_per_iter_s, the time between iterations' ends
    iteration_s: float = 0.0

    def to_json(self) -> dict:
        return {
            "time_per_iter_s": self.time_per_iter_s,
            "iteration_s": self.iteration_s,
            "max_staleness": self.max_staleness,
            "peak_mem_bytes": self.peak_mem_bytes,
            "oom": self.oom,
            "realloc_s": self.realloc_s,
            "calls": {n: {"start_s": c.start_s, "end_s": c.end_s, "mem_bytes": c.mem_bytes,
                          "time_s": c.time_s, "realloc_s": c.realloc_s} for n, c in self.calls.items()},
            "device_peak_bytes": list(self.device_peak_bytes),
            "device_memory_bytes": self.device_memory_bytes,
            "usable_memory_bytes": self.usable_memory_bytes,
        }


def steady_window(staleness: int) -> int:
    """Iterations the steady state is averaged over. With generation running up to S iterations
    ahead, S + 1 iterations are in flight and the schedule may repeat every k <= S + 1 of them
    rather than every one (k = 2 at S = 2 happens): lcm(1, ..., S + 1) covers every such k."""
    return math.lcm(*range(1, staleness + 2))


def steady_iterations(staleness: int) -> int:
    """Iterations to unroll: 2 for synchronous RL (the schedule repeats from the second
    iteration on); with generation running ahead, a start-up of 2 (S + 1), then the window (a
    test checks these against unrolls of 60 and 61 iterations)."""
    return 2 if staleness == 0 else 2 * (staleness + 1) + steady_window(staleness)


@dataclass
class _Schedule:
    time: np.ndarray  # (B,) steady-state seconds per iteration
    realloc: np.ndarray  # (B,) realloc seconds per iteration
    start: Optional[np.ndarray] = None  # (K, B, T) when recorded
    end: Optional[np.ndarray] = None


class Estimator:
    """Costs of a scenario's options and the simulation of plans. Caches; not thread-safe."""

    def __init__(self, scenario: Scenario, iterations: Optional[int] = None, profile=None,
                 only: Optional[dict[str, Sequence[Option]]] = None, call_scale: Optional[dict[str, float]] = None,
                 shared_costs: Optional[dict] = None):
        """`profile` (a realbench.hardware.profile.Profile) replaces the analytic call times
        where it has measurements (see `cost_source`) and the links by its measured ones.
        `only`: the options to consider per call instead of all of them. `call_scale`: per call,
        a factor on its time under every option (a run's measured time over the estimate of
        the plan it ran: re-planning recalibrates the estimator this way). `shared_costs`: a dict
        the costs of `only`'s options are kept in, given to every estimator of the same scenario
        and profile that should share them (an engine search's groups, which repeat options)."""
        self.call_scale = dict(call_scale or {})
        self.shared_costs = {} if shared_costs is None else shared_costs
        # asynchronous RL: generation may run `staleness` iterations ahead of training
        self.staleness = scenario.dataflow.max_staleness
        if iterations is None:
            iterations = steady_iterations(self.staleness)
        if iterations < 1 + steady_window(self.staleness):
            raise ValueError(f"the steady state needs at least {1 + steady_window(self.staleness)} iterations")
        self.scenario = scenario
        self.profile = profile
        same_device = profile is not None and profile.device.preset == scenario.cluster.device.name
        # measured links stand for the scenario's only when measured on its kind of device
        self.cluster = profiled_links(scenario.cluster, profile) if same_device else scenario.cluster
        # the runtime's measured exchange among a call's processes, which moves its inputs (two
        # rounds: shapes, then data) and reallocated weights; None: links only (see _schedule)
        self.exchange = profiled_exchange(profile) if same_device else None
        # a CPU whose processes outnumber its cores: a call's time depends on how many processes
        # are busy beside it (see _crowded)
        device = profile.device if profile is not None else None
        self.contended = bool(same_device and shares_cores(device.kind, device.processes, device.cores))
        self.iterations = iterations
        df = scenario.dataflow
        self.call_names: tuple[str, ...] = df.order
        self.calls = [df.call(n) for n in self.call_names]
        self.n = len(self.calls)
        idx = {n: i for i, n in enumerate(self.call_names)}
        # every option of each call (lazy OptionSets), or given ones (one plan's, see `estimate`)
        self.options: list[Sequence[Option]] = [scenario.options[n] if only is None else list(only[n])
                                                for n in self.call_names]
        self.capacity = self.cluster.usable_memory_bytes  # plans must fit in this (the headroom)

        # dependency structure, by call index
        self.data_preds: list[list[tuple[int, float]]] = []
        self.param_preds: list[list[int]] = []
        for c in self.calls:
            data, param = [], []
            for u, kind in df.predecessors(c.name, lag=0):
                if kind == "data":
                    n_keys = len(df.graph.edges[u, c.name]["keys"])
                    data.append((idx[u], transfer_bytes(c.seqs, c.seq_len, n_keys)))
                else:
                    param.append(idx[u])
            self.data_preds.append(data)
            self.param_preds.append(param)
        trains = {c.model: i for i, c in enumerate(self.calls) if c.kind == CallKind.TRAIN}
        firsts: dict[str, int] = {}
        for i, c in enumerate(self.calls):
            firsts.setdefault(c.model, i)
        self.master_of = [trains.get(c.model, firsts[c.model]) for c in self.calls]
        self.train_of = [trains.get(c.model, -1) for c in self.calls]
        self.masters = sorted(set(self.master_of))
        self.stages_one_way = [sync_stages_one_way(scenario, c.model) for c in self.calls]
        # the calls that run ahead of training (max_staleness > 0): each generates, then receives
        # the weights its next batch will use (its reallocation task comes after it)
        self.ahead = {idx[n] for n in df.ahead_calls}
        # the tasks of one iteration, per call: with the runtime's exchange, the transfer of its
        # inputs (the runtime moves every producer's outputs in one exchange, which keeps the
        # processes taking part in it busy); a reallocation slot where the call is not its
        # model's master (it costs nothing when the layouts agree); then the call
        self.task_call: list[int] = []
        self.task_kind: list[str] = []  # "transfer" | "realloc" | "call"
        for i in range(self.n):
            moves = ["realloc"] if self.master_of[i] != i else []
            kinds = (["transfer"] if self.exchange is not None and self.data_preds[i] else []) \
                + (["call"] + moves if i in self.ahead else moves + ["call"])
            self.task_call += [i] * len(kinds)
            self.task_kind += kinds
        self.task_of = {(i, kind): u for u, (i, kind) in enumerate(zip(self.task_call, self.task_kind))}
        # per task: (task, lag) it waits for in an earlier iteration, the weights' versions. A
        # call and its reallocation read the version its model's train call wrote last
        # iteration; a call that runs ahead generates with the weights its reallocation of the
        # previous iteration brought, which carried the version written S iterations before that
        self.lagged: list[list[tuple[int, int]]] = []
        for i, kind in zip(self.task_call, self.task_kind):
            tr = self.train_of[i]
            if tr < 0 or kind == "transfer":
                self.lagged.append([])
            elif i in self.ahead:
                self.lagged.append([(self.task_of[(i, "realloc")], 1)] if kind == "call" else
                                   [(self.task_of[(tr, "call")], self.staleness)])
            else:
                self.lagged.append([(self.task_of[(tr, "call")], 1)])

        # per-option columns (numpy, gathered by option index), computed lazily: a column indexed
        # with option indices costs only the blocks (mesh shapes) those options belong to; the
        # whole column (what a search needs) is built per block and spread over positions
        self._tables: list[Optional[dict[str, np.ndarray]]] = [None] * self.n
        self._block_cache: dict[tuple[int, int], tuple[dict[str, np.ndarray], int]] = {}
        for key in COLUMNS:
            setattr(self, key, [_Column(self, i, key) for i in range(self.n)])

    # -- the option tables ---------------------------------------------------------------------------
    def _costs(self, i: int, options: Sequence[Option]) -> tuple[dict[str, np.ndarray], int]:
        """The cost columns of some options of call i, and how many came from the profile."""
        c = self.calls[i]
        rows = self._cost_rows(i, options)
        scale = self.call_scale.get(c.name, 1.0)
        columns = np.array(rows, dtype=np.float64).reshape(-1, 7)  # (see _cost_rows)
        return {"dur": columns[:, 0] * scale, "alone": columns[:, 1] * scale, "early": columns[:, 2] * scale,
                "working": columns[:, 3], "weights": columns[:, 4], "master_bytes": columns[:, 5]}, \
            int(columns[:, 6].sum())

    def _cost_rows(self, i: int, options: Sequence[Option]) -> list[tuple[float, ...]]:
        """Per option of call i: (seconds, seconds with no other call busy, seconds before its
        outputs are ready, working bytes, weight bytes, the bytes its model's master holds,
        whether the time is measured), from `shared_costs` where there."""
        c = self.calls[i]
        missing = [o for o in dict.fromkeys(options) if (c.name, o) not in self.shared_costs]
        if missing:
            model = self.scenario.models[c.model]
            master = self.scenario.engine in MASTER_IN_OPTIMIZER_ENGINES
            early = self.scenario.engine in EARLY_OLD_LOGPROBS_ENGINES
            costs = [call_cost(c, model, self.cluster, o, master_in_optimizer=master, early_old_logprobs=early)
                     for o in missing]
            measured = [False] * len(costs)
            alone = [x.time_s for x in costs]
            if self.profile is not None:
                times = profiled_call_times(c, model, missing, self.profile, cluster=self.cluster)
                costs = [x if t is None else replace(x, time_s=t) for x, t in zip(costs, times)]
                measured = [t is not None for t in times]
                alone = (profiled_call_times(c, model, missing, self.profile, alone=True, cluster=self.cluster)
                         if self.contended else times)
                alone = [x.time_s if t is None else t for x, t in zip(costs, alone)]
            for o, x, a, m in zip(missing, costs, alone, measured):
                own = x.master_bytes if c.kind == CallKind.TRAIN else x.weights_bytes
                self.shared_costs[(c.name, o)] = (x.time_s, a, x.early_s, x.working_bytes, x.weights_bytes, own, m)
        return [self.shared_costs[(c.name, o)] for o in options]

    def _block(self, i: int, j: int) -> tuple[dict[str, np.ndarray], int]:
        """Costs of block j's strategies (every position of the block costs the same)."""
        hit = self._block_cache.get((i, j))
        if hit is None:
            b = self.options[i].blocks[j]
            mesh = b.mesh(0, self.cluster.gpus_per_node)
            hit = self._block_cache[(i, j)] = self._costs(i, [Option(mesh, st) for st in b.strategies])
        return hit

    def _placement(self, lo: np.ndarray, size: np.ndarray, strategy: np.ndarray) -> dict[str, np.ndarray]:
        """Where options run: first and end device, the node (-1 across nodes), an id that is
        equal exactly when two options share a mesh (across calls), and one equal exactly when two
        options on one mesh share a layout. `strategy`: (tp, pp, micro-batches, zero, merge_lora,
        offload_params, offload_optimizer, host_adam, the devices the state is sharded over, ep, the
        devices an expert is split over, keeps_memory) per option, see `_strategy_fields`. A mixture of experts'
        expert layout (ep, etp) is its own id beside the layout's, `expert_layout`, which two options
        of one layout share exactly when they split the experts alike."""
        G, D = self.cluster.gpus_per_node, self.cluster.n_devices
        mesh_id = lo * (D + 1) + size
        node = np.where(size <= G, lo // G, -1)
        # options of one layout (on one mesh: tp, pp, zero and its shard group, merged LoRA or not,
        # offloaded or not, Adam on the host or not, a serving engine keeping its memory or not) hold
        # the same weights and states between calls: they differ in time and working memory only (the
        # search's dominance pruning, SearchSpace.pruned). Digits of radix D + 1 for the counts (each
        # at most D), 2 and 4 for the flags and zero: 3 log2(D + 1) + 7 bits, exact in int64 up to
        # 2^18 devices
        R = D + 1
        layout_id = ((((((((strategy[:, 0] * R + strategy[:, 1]) * 4 + strategy[:, 3]) * 2 + strategy[:, 4]) * 2
                         + strategy[:, 5]) * 2 + strategy[:, 6]) * 2 + strategy[:, 7]) * R + strategy[:, 8]) * 2
                     + strategy[:, 11])
        return {"lo": lo, "hi": lo + size, "tp": strategy[:, 0], "pp": strategy[:, 1],
                "micro_batches": strategy[:, 2], "zero": strategy[:, 3], "shard": strategy[:, 8],
                "merge_lora": strategy[:, 4],
                "offload_params": strategy[:, 5], "node": node,
                "mesh_id": mesh_id,
                "layout_id": layout_id, "ep": strategy[:, 9], "etp": strategy[:, 10],
                "expert_layout": strategy[:, 9] * R + strategy[:, 10], "keeps_memory": strategy[:, 11]}

    @staticmethod
    def _strategy_fields(strategies) -> np.ndarray:
        return np.array([(s.tp, s.pp, s.micro_batches, s.zero, s.merge_lora, s.offload_params, s.offload_optimizer,
                          s.host_adam, s.state_shards, s.ep, s.expert_tp, s.keeps_memory) for s in strategies],
                        dtype=np.int64).reshape(-1, 12)

    def _table(self, i: int) -> dict[str, np.ndarray]:
        """Every column of call i (built once)."""
        if self._tables[i] is not None:
            return self._tables[i]
        opts = self.options[i]
        G = self.cluster.gpus_per_node
        if isinstance(opts, OptionSet):
            parts: dict[str, list[np.ndarray]] = {k: [] for k in COST_COLUMNS}
            lo, size, strategies, measured = [], [], [], 0
            for j, b in enumerate(opts.blocks):
                costs, m = self._block(i, j)
                for k in parts:
                    parts[k].append(np.tile(costs[k], b.positions))
                measured += m * b.positions
                n_s = len(b.strategies)
                lo.append(np.repeat(b.starts(G), n_s))
                size.append(np.full(len(b), b.size, dtype=np.int64))
                strategies.append(np.tile(self._strategy_fields(b.strategies), (b.positions, 1)))
            table = {k: np.concatenate(v) if v else np.zeros(0) for k, v in parts.items()}
            cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64)  # noqa: E731
            table.update(self._placement(cat(lo), cat(size), np.concatenate(strategies) if strategies
                                         else self._strategy_fields([])))
        else:  # a plain list of options (one plan's, see `estimate`)
            table, measured = self._costs(i, opts)
            table.update(self._placement(np.array([o.mesh.start(G) for o in opts], dtype=np.int64),
                                         np.array([o.mesh.size for o in opts], dtype=np.int64),
                                         self._strategy_fields(o.strategy for o in opts)))
        total = len(opts)
        table["source"] = "profile" if total and measured == total else \
            "analytic" if measured == 0 else "profile+analytic"
        self._tables[i] = table
        return table

    def _gather(self, i: int, key: str, k: np.ndarray) -> np.ndarray:
        """Column `key` of call i at option indices `k`, from the blocks of those options only."""
        if self._tables[i] is not None or not isinstance(self.options[i], OptionSet):
            return self._table(i)[key][k]
        opts = self.options[i]
        flat = np.asarray(k, dtype=np.int64).ravel()
        bases = np.array([b.base for b in opts.blocks], dtype=np.int64)
        which = np.searchsorted(bases, flat, side="right") - 1
        out = np.empty(flat.shape, dtype=np.float64 if key in COST_COLUMNS
                       else np.int64)
        G = self.cluster.gpus_per_node
        for j in np.unique(which):
            b = opts.blocks[int(j)]
            sel = which == j
            p, st = np.divmod(flat[sel] - b.base, len(b.strategies))
            if key in COST_COLUMNS:
                out[sel] = self._block(i, int(j))[0][key][st]
            else:
                place = self._placement(b.starts(G)[p], np.full(p.shape, b.size, dtype=np.int64),
                                        self._strategy_fields(b.strategies)[st])
                out[sel] = place[key]
        return out.reshape(np.shape(k))

    @property
    def cost_source(self) -> list[str]:
        """Per call: where its times come from (profile, analytic, or profile+analytic)."""
        return [self._table(i)["source"] for i in range(self.n)]

    # -- options ----------------------------------------------------------------------------------
    def index_of(self, call: int, option: Option) -> int:
        """The index of `option` among call's options; a valid option the search does not offer
        (a plan's own micro-batch count) is added after the others (their indices stay)."""
        opts = self.options[call]
        if isinstance(opts, OptionSet) and option not in opts:
            self.options[call] = opts = opts.with_option(option)  # ValueError: not valid at all
            self._tables[call] = None  # rebuilt with the new block; the other blocks' costs stay cached
        return opts.index(option)

    def choice_of(self, options: dict[str, Option]) -> tuple[int, ...]:
        return tuple(self.index_of(i, options[n]) for i, n in enumerate(self.call_names))

    def options_of(self, choice: Choice) -> dict[str, Option]:
        return {n: self.options[i][int(choice[i])] for i, n in enumerate(self.call_names)}

    def fits_alone(self, call: int, k: int) -> bool:
        """Whether option k of a call fits in device memory with nothing else on the device
        (its master copy or weights plus its working set). Others can never be in a valid plan."""
        own = (self.master_bytes if self.master_of[call] == call else self.weights)[call][k]
        return bool(own + self.working[call][k] <= self.capacity)

    def candidates(self, call: int) -> np.ndarray:
        """Indices of the options of a call that fit alone (the search space)."""
        t = self._table(call)
        own = t["master_bytes"] if self.master_of[call] == call else t["weights"]
        return np.flatnonzero(own + t["working"] <= self.capacity)

    # -- reallocation -------------------------------------------------------------------------------
    def _layouts(self, i: int, k: np.ndarray) -> Layouts:
        lo = self.lo[i][k]
        return Layouts(lo, self.hi[i][k] - lo, self.tp[i][k], self.pp[i][k], self.zero[i][k], self.shard[i][k],
                       self.ep[i][k], self.etp[i][k])

    def _realloc_columns(self, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, n) realloc seconds from the master's layout to each call's, and (B, n) whether
        the call needs its own copy of the weights; zero/False for master calls."""
        B = C.shape[0]
        R = np.zeros((B, self.n))
        copy = np.zeros((B, self.n), dtype=bool)
        for i in range(self.n):
            m = self.master_of[i]
            if m == i:
                continue
            src, dst = self._layouts(m, C[:, m]), self._layouts(i, C[:, i])
            # OpenRLHF, AReaL and verl's one-step-off broadcast whole tensors to their servers (realloc.broadcast_times)
            moved = broadcast_times if (broadcasts_weights(self.scenario)
                                        and self.calls[i].kind == CallKind.GENERATE) else realloc_times
            model, call = self.scenario.models[self.calls[i].model], self.calls[i]
            if model.lora is not None and not call.adapters:  # the frozen base, held since the first step
                R[:, i] = 0.0
            elif model.lora is not None and moved is realloc_times:
                # the adapters alone, once the layout holds the base; or, merged, W + s B A (the
                # base's shapes: what realloc_times moves of a model) every step
                R[:, i] = realloc_times(model, self.cluster, src, dst, adapters_only=True)
                merged = self.merge_lora[i][C[:, i]].astype(bool)
                if merged.any():
                    R[merged, i] = realloc_times(model, self.cluster, src.rows(merged), dst.rows(merged))
            else:
                R[:, i] = moved(model, self.cluster, src, dst, adapters_only=model.lora is not None
                                and self.scenario.engine in ADAPTER_BROADCAST_ENGINES)
            if self.exchange is not None:  # its messages wait on each other's processes, as an exchange's
                union = np.maximum(src.start + src.size, dst.start + dst.size) - np.minimum(src.start, dst.start)
                R[:, i] += np.where(R[:, i] > 0, self.exchange(union, 0.0, rounds=1), 0.0)
            copy[:, i] = ~holds_same_shards(src, dst)
            if self.scenario.engine in ROLLOUT_SLEEP_ENGINES and self.calls[i].kind == CallKind.GENERATE:
                asleep = (src.start == dst.start) & (src.size == dst.size)  # on its trainer's GPUs
                R[:, i] += np.where(asleep, 2.0 * self.weights[i][C[:, i]] / self.cluster.host_bw, 0.0)
            if self.calls[m].kind == CallKind.TRAIN:
                # a trained model's parameters in host memory between calls (verl's param_offload,
                # realbench.cost.sharding): a call on its layout brings them in and sends them back,
                # and so does the weight sync to another layout (FSDP1 unshards on the device), but
                # where verl's FSDP2 stages them in one way (sync_stages_one_way)
                off = self.offload_params[m][C[:, m]].astype(bool)
                if off.any():
                    zero = self.zero[m][C[:, m]]
                    moved = offloaded_param_bytes(zero, self.weights[m][C[:, m]])
                    crossings = np.where((zero == 3) & self.stages_one_way[m], 1.0, 2.0)
                    R[:, i] += np.where(off, crossings * moved / self.cluster.host_bw, 0.0)
        return R, copy

    # -- memory -----------------------------------------------------------------------------------
    def _memory(self, C: np.ndarray, copy: np.ndarray, per_device: bool = False):
        """Peak bytes per plan (B,), or per device (B, devices). Calls whose column is negative
        (not chosen yet) are left out, which makes the result a lower bound for any completion.

        A device holds the master copies of the meshes it lies in, plus the working set of the
        call it runs. The master bytes are a step function of the device that rises only where a
        master mesh starts, so their maximum over a call's mesh is taken at the mesh's first
        device or at a master mesh's first device inside it: (1 + masters) points per call
        instead of every device."""
        chosen = C[0] >= 0
        masters = [m for m in self.masters if chosen[m]]
        # a LoRA model's copy on another call's layout stays between steps (it keeps the frozen
        # base, and receives only the adapters): held like a master copy, where it is a copy
        # (unless the adapters arrive merged into the base every step: then the copy is held
        # during its call only, as a fully trained model's copy is)
        kept = [i for i in np.flatnonzero(chosen) if self.master_of[i] != i and chosen[self.master_of[i]]
                and getattr(self.scenario.models[self.calls[i].model], "lora", None) is not None]
        merged = {i: self.merge_lora[i][C[:, i]].astype(bool) for i in kept}
        held_lo = [self.lo[m][C[:, m]] for m in masters] + [self.lo[i][C[:, i]] for i in kept]
        held_hi = [self.hi[m][C[:, m]] for m in masters] + [self.hi[i][C[:, i]] for i in kept]
        held_bytes = [self.master_bytes[m][C[:, m]] for m in masters] + \
            [np.where(copy[:, i] & ~merged[i], self.weights[i][C[:, i]], 0.0) for i in kept]
        # a serving engine that keeps its memory through the step (Strategy.keeps_memory): its share
        # of each GPU held on its mesh as a master copy is, beside every call there (only generations
        # some plan of the batch keeps awake: a search, which offers none, adds no column)
        awake = {i: flags for i in np.flatnonzero(chosen) if self.calls[i].kind == CallKind.GENERATE
                 if (flags := self.keeps_memory[i][C[:, i]].astype(bool)).any()}
        servers = list(awake)
        held_lo += [self.lo[i][C[:, i]] for i in servers]
        held_hi += [self.hi[i][C[:, i]] for i in servers]
        held_bytes += [np.where(awake[i], self.working[i][C[:, i]]
                                + np.where(copy[:, i], self.weights[i][C[:, i]], 0.0), 0.0) for i in servers]
        m_lo = np.stack(held_lo, axis=1) if held_lo else np.zeros((len(C), 0))
        m_hi = np.stack(held_hi, axis=1) if held_hi else m_lo
        m_bytes = np.stack(held_bytes, axis=1) if held_bytes else np.zeros(m_lo.shape)
        if per_device:
            devices = np.arange(self.cluster.n_devices)[None, :, None]
            persist = (m_bytes[:, None, :] * ((m_lo[:, None, :] <= devices) & (devices < m_hi[:, None, :]))).sum(2)
            working = np.zeros_like(persist)
        peak = np.zeros(C.shape[0])
        for i in np.flatnonzero(chosen):
            k = C[:, i]
            lo, hi = self.lo[i][k], self.hi[i][k]
            own_copy = copy[:, i] & chosen[self.master_of[i]]
            if i in kept:  # held between steps (above) unless merged
                own_copy = own_copy & merged[i]
            t = self.working[i][k] + np.where(own_copy, self.weights[i][k], 0.0)
            if i in awake:  # (held through the step, above)
                t = np.where(awake[i], 0.0, t)
            m = self.master_of[i]
            if m != i and chosen[m] and self.calls[m].kind == CallKind.TRAIN:  # brought in from the host
                off = self.offload_params[m][C[:, m]].astype(bool) & ~copy[:, i]
                t = t + np.where(off, offloaded_param_bytes(self.zero[m][C[:, m]], self.weights[m][C[:, m]]), 0.0)
            if per_device:
                inside = (devices[:, :, 0] >= lo[:, None]) & (devices[:, :, 0] < hi[:, None])
                np.maximum(working, inside * t[:, None], out=working)
                continue
            points = np.concatenate([lo[:, None], np.clip(m_lo, lo[:, None], hi[:, None] - 1)], axis=1)
            held = (m_bytes[:, None, :] * ((m_lo[:, None, :] <= points[:, :, None])
                                           & (points[:, :, None] < m_hi[:, None, :]))).sum(axis=2)
            np.maximum(peak, t + held.max(axis=1), out=peak)
        return persist + working if per_device else peak

    # -- time ---------------------------------------------------------------------------------------
    def _schedule(self, C: np.ndarray, R: np.ndarray, record: bool = False) -> _Schedule:
        B, n = C.shape
        T = len(self.task_call)
        dur = np.empty((B, T))
        lo1, hi1 = np.zeros((B, T), dtype=np.int64), np.zeros((B, T), dtype=np.int64)
        lo2, hi2 = np.zeros((B, T), dtype=np.int64), np.zeros((B, T), dtype=np.int64)
        intra, inter = self.cluster.intra_bw, self.cluster.inter_bw
        lat_in, lat_out = self.cluster.intra_latency_s, self.cluster.inter_latency_s
        # per task: the tasks of its iteration it waits for, each with a delay after their end
        deps: list[list[tuple[int, np.ndarray | float]]] = [[] for _ in range(T)]
        # a train call's early seconds and the generation it waits for alone before them (its
        # producers of kind generate; EARLY_OLD_LOGPROBS_ENGINES)
        early = np.zeros((B, T))
        early_deps: list[list[tuple[int, np.ndarray | float]]] = [[] for _ in range(T)]
        for u, (i, kind) in enumerate(zip(self.task_call, self.task_kind)):
            k = C[:, i]
            if kind == "realloc":
                m = self.master_of[i]
                busy = R[:, i] > 0  # a free reallocation occupies no device
                dur[:, u] = R[:, i]
                lo1[:, u] = np.where(busy, self.lo[m][C[:, m]], 0)
                hi1[:, u] = np.where(busy, self.hi[m][C[:, m]], 0)
                lo2[:, u] = np.where(busy, self.lo[i][k], 0)
                hi2[:, u] = np.where(busy, self.hi[i][k], 0)
            elif kind == "transfer":  # the runtime's exchange, among the producers' dp heads and the mesh
                producers = [j for j, _ in self.data_preds[i]]
                lo = np.minimum.reduce([self.lo[i][k]] + [self.lo[j][C[:, j]] for j in producers])
                hi = np.maximum.reduce([self.hi[i][k]] + [self.hi[j][C[:, j]] for j in producers])
                heads = sum((self.hi[j][C[:, j]] - self.lo[j][C[:, j]]) // (self.tp[j][C[:, j]] * self.pp[j][C[:, j]])
                            for j in producers)
                dur[:, u] = self.exchange(np.minimum(self.hi[i][k] - self.lo[i][k] + heads, hi - lo),
                                          sum(nbytes for _, nbytes in self.data_preds[i]))
                busy = dur[:, u] > 0  # all on one process: nothing moves
                lo1[:, u], hi1[:, u] = np.where(busy, lo, 0), np.where(busy, hi, 0)
                deps[u] = [(self.task_of[(j, "call")], 0.0) for j in producers]
            else:
                dur[:, u] = self.dur[i][k]
                lo1[:, u], hi1[:, u] = self.lo[i][k], self.hi[i][k]
                row: list[tuple[int, np.ndarray | float]] = [(self.task_of[(j, "call")], 0.0) for j in self.param_preds[i]]
                if (i, "transfer") in self.task_of:
                    row.append((self.task_of[(i, "transfer")], 0.0))
                else:  # the links: a delay after each producer, nothing where the meshes agree
                    for j, nbytes in self.data_preds[i]:
                        kj = C[:, j]
                        same_node = (self.node[i][k] >= 0) & (self.node[i][k] == self.node[j][kj])
                        dt = np.where(self.mesh_id[i][k] == self.mesh_id[j][kj], 0.0,
                                      np.where(same_node, nbytes / intra + lat_in, nbytes / inter + lat_out))
                        row.append((self.task_of[(j, "call")], dt))
                        if self.calls[j].kind == CallKind.GENERATE and self.calls[i].kind == CallKind.TRAIN:
                            early_deps[u].append((self.task_of[(j, "call")], dt))
                    if early_deps[u]:
                        early[:, u] = np.minimum(self.early[i][k], dur[:, u])
                if (i, "realloc") in self.task_of and i not in self.ahead:
                    row.append((self.task_of[(i, "realloc")], 0.0))
                deps[u] = row

        def cross(a_lo, a_hi, b_lo, b_hi):
            return (a_lo[:, :, None] < b_hi[:, None, :]) & (b_lo[:, None, :] < a_hi[:, :, None])

        overlap = cross(lo1, hi1, lo1, hi1) | cross(lo1, hi1, lo2, hi2) | cross(lo2, hi2, lo1, hi1) \
            | cross(lo2, hi2, lo2, hi2)
        if not self.contended:
            return self._list_schedule(dur, overlap, deps, early, early_deps, R, record)
        # processes a task keeps computing (a move: its two meshes; a transfer waits on messages)
        size = np.where(dur > 0, np.maximum(hi1, np.where(hi2 > lo2, hi2, hi1)) - np.minimum(lo1, np.where(
            hi2 > lo2, lo2, lo1)), 0)
        size[:, [u for u, kind in enumerate(self.task_kind) if kind == "transfer"]] = 0
        calls = [u for u, kind in enumerate(self.task_kind) if kind == "call"]
        crowded = dur[:, calls].copy()
        for u in calls:  # first, each call as if alone
            dur[:, u] = self.alone[self.task_call[u]][C[:, self.task_call[u]]]
        first = self._list_schedule(dur, overlap, deps, early, early_deps, R, record=True)
        dur[:, calls] = self._crowded(first, size, dur[:, calls], crowded, calls)
        return self._list_schedule(dur, overlap, deps, early, early_deps, R, record)

    def _crowded(self, first: _Schedule, size: np.ndarray, alone: np.ndarray, crowded: np.ndarray,
                 calls: list[int]) -> np.ndarray:
        """Call durations between alone and crowded (B, len(calls)), by the processes busy while
        each call runs in a first schedule of the calls alone: its own, plus those of every task
        overlapping it, weighted by the share of its time they overlap. Up to the cores nothing
        slows; from there to every process busy (where `crowded` was measured) the time moves
        linearly from alone to crowded:
            busy_u = sum_v size_v |u & v| / |u|,   f = clip((busy_u - max(size_u, cores)) / (P - max(size_u, cores)), 0, 1)
            t_u = alone_u + f (crowded_u - alone_u)."""
        K, B, T = first.start.shape
        P, cores = self.profile.device.processes, self.profile.device.cores
        S, E = first.start.transpose(1, 0, 2).reshape(B, K * T), first.end.transpose(1, 0, 2).reshape(B, K * T)
        sizes = np.tile(size, (1, K))
        out = np.empty_like(alone)
        for c, u in enumerate(calls):
            su, eu = first.start[K - 1, :, u], first.end[K - 1, :, u]
            shared = np.clip(np.minimum(E, eu[:, None]) - np.maximum(S, su[:, None]), 0.0, None)
            busy = (shared * sizes).sum(axis=1) / np.maximum(eu - su, 1e-12)
            floor = np.maximum(size[:, u], cores)
            f = np.where(P > floor, np.clip((busy - floor) / np.maximum(P - floor, 1), 0.0, 1.0), 1.0)
            out[:, c] = alone[:, c] + f * (crowded[:, c] - alone[:, c])
        return out

    def _list_schedule(self, dur: np.ndarray, overlap: np.ndarray, deps, early: np.ndarray, early_deps,
                       R: np.ndarray, record: bool) -> _Schedule:
        """The list schedule of `iterations` iterations (see the module's docstring). `early`: per
        task, the seconds (B, T) it may start with once its mesh is free and the tasks of
        `early_deps[u]` are done, before its other dependencies: it then ends at
        max(start + early, ready) + (dur - early), that is start + dur + max(0, ready - start - early)."""
        B, T = dur.shape
        K = self.iterations
        starts = np.zeros((K, B, T)) if record else None
        stops = np.zeros((K, B, T)) if record else None
        last_end = np.zeros((B, T))
        ends: list[np.ndarray] = []  # per iteration so far, (B, T) task ends
        iter_end = np.zeros((K, B))
        zeros = np.zeros(B)
        for it in range(K):
            cur_end = np.zeros((B, T))
            ends.append(cur_end)
            for u in range(T):
                ready = zeros
                for v, lag in self.lagged[u]:  # the weights' version, from an earlier iteration
                    if it >= lag:
                        ready = np.maximum(ready, ends[it - lag][:, v])
                for v, dt in deps[u]:
                    ready = np.maximum(ready, cur_end[:, v] + dt)
                free = (last_end * overlap[:, u, :]).max(axis=1)
                start = np.maximum(ready, free)
                end = start + dur[:, u]
                if early_deps[u]:
                    e = early[:, u]
                    ready_early = zeros
                    for v, dt in early_deps[u]:
                        ready_early = np.maximum(ready_early, cur_end[:, v] + dt)
                    start_early = np.maximum(ready_early, free)
                    has = e > 0
                    start = np.where(has, start_early, start)
                    # (written so that a call whose inputs are all there when its mesh frees ends at
                    # start + dur exactly, as without a head)
                    end = np.where(has, start_early + dur[:, u] + np.maximum(0.0, ready - (start_early + e)), end)
                last_end[:, u] = cur_end[:, u] = end
                np.maximum(iter_end[it], end, out=iter_end[it])
                if record:
                    starts[it, :, u], stops[it, :, u] = start, end
        window = steady_window(self.staleness)
        time = (iter_end[-1] - iter_end[-1 - window]) / window + self.cluster.device.step_overhead_s
        return _Schedule(time, R.sum(axis=1), starts, stops)

    # -- the public API -------------------------------------------------------------------------------
    def evaluate_batch(self, choices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(time per iteration (B,), peak memory bytes (B,)) of B plans, one per row."""
        C = np.asarray(choices, dtype=np.int64).reshape(-1, self.n)
        R, copy = self._realloc_columns(C)
        return self._schedule(C, R).time, self._memory(C, copy)

    def evaluate(self, choice: Choice) -> tuple[float, int]:
        """(time per iteration in seconds, peak memory in bytes) of one plan."""
        t, m = self.evaluate_batch(np.asarray([choice]))
        return float(t[0]), int(m[0])

    def peak_memory_batch(self, choices: np.ndarray) -> np.ndarray:
        """Peak bytes of B plans (B,). A column of -1 means that call is not chosen yet (the
        same calls in every row): the result is then a lower bound for every completion."""
        C = np.asarray(choices, dtype=np.int64).reshape(-1, self.n)
        _, copy = self._realloc_columns(np.where(C < 0, 0, C))
        return self._memory(C, copy)

    def peak_memory(self, choice: Sequence[Optional[int]]) -> int:
        """Peak bytes of one plan; entries may be None (not chosen yet) for a lower bound."""
        return int(self.peak_memory_batch(np.array([[-1 if k is None else k for k in choice]]))[0])

    def estimate(self, choice: Choice) -> PlanEstimate:
        """The full estimate of one plan: timeline, per-call timings, memory per device. It costs
        the plan's own options only (on a cluster of thousands of devices, building every
        option's costs would take longer than the estimate)."""
        if any(isinstance(o, OptionSet) for o in self.options):
            one = Estimator(self.scenario, self.iterations, self.profile,
                            only={n: [o] for n, o in self.options_of(choice).items()}, call_scale=self.call_scale)
            return one.estimate([0] * self.n)
        C = np.asarray([choice], dtype=np.int64)
        R, copy = self._realloc_columns(C)
        s = self._schedule(C, R, record=True)
        peaks = [int(x) for x in self._memory(C, copy, per_device=True)[0]]
        steady = self.iterations - 1  # report the last iteration (in the steady state), relative to its first start
        base = float(s.start[steady, 0].min())
        calls, tasks = {}, []
        for it in range(self.iterations):
            for u, (i, kind) in enumerate(zip(self.task_call, self.task_kind)):
                start, end = float(s.start[it, 0, u]), float(s.end[it, 0, u])
                k, name = int(C[0, i]), self.call_names[i]
                if kind != "call" and end == start:
                    continue
                ranges = [(int(self.lo[i][k]), int(self.hi[i][k]))]
                if kind == "realloc":
                    m = self.master_of[i]
                    ranges.insert(0, (int(self.lo[m][C[0, m]]), int(self.hi[m][C[0, m]])))
                elif kind == "transfer":  # from the producers' meshes
                    ranges = sorted({(int(self.lo[j][C[0, j]]), int(self.hi[j][C[0, j]])) for j, _ in self.data_preds[i]}
                                    | set(ranges))
                tasks.append(Task(("" if kind == "call" else kind + ":") + name, name, kind, it, start, end, tuple(ranges)))
                if it == steady and kind == "call":
                    a, b = ranges[0]
                    calls[name] = CallTiming(start - base, end - base, max(peaks[a:b]),
                                             end - start, float(R[0, i]))
        peak = max(peaks)
        ran = [u for u in range(len(self.task_call)) if s.end[steady, 0, u] > s.start[steady, 0, u]]
        iteration = float(s.end[steady, 0, ran].max() - s.start[steady, 0, ran].min()) if ran else 0.0
        return PlanEstimate(float(s.time[0]), peak, peak > self.capacity, float(s.realloc[0]),
                            {n: calls[n] for n in self.call_names}, tuple(peaks),
                            self.cluster.device.memory_bytes, self.capacity, tuple(tasks),
                            dict(zip(self.call_names, self.cost_source)), self.staleness, iteration)
