"""The worker: one process per device, walking the plan (REAL.md section 8).

Every rank builds the same list of events from the scenario and the plan (`step_order`):
  * `realloc`  before a call whose layout differs from its model's master layout (the train
               call's, or a frozen model's first call's): the master's ranks send, the call's
               ranks receive (realbench.runtime.realloc);
  * `transfer` before a call that reads other calls' outputs: each producer's data-parallel
               heads (last stage, tp rank 0) send their shards of the keys to every rank of the
               consumer's mesh, all producers in one exchange (on a busy machine a round of
               messages costs far more than its bytes);
  * `call`     the call itself on its layout: generate, inference or a train step.
A rank runs only the events it takes part in. All communication happens inside events and every
rank meets the events in the same order, so the earliest unfinished event can always complete:
no deadlock, and calls on disjoint meshes run at the same time without any threads.

The toy task: prompts are random tokens; the reward model is a real model forward whose weights
are set by hand so that its score is the mean over the sequence of +1 for tokens in the upper
half of the vocabulary and -1 for the others (one uniform-attention layer averages the per-token
score into a spare hidden dimension that the value head reads). RLHF makes the policy emit more
upper-half tokens, so the mean reward rises.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist

from realbench.dataflow import CallDef, CallKind
from realbench.models import FunctionSpec, ModelSpec
from realbench.plan.mesh import Option
from realbench.plan.plan import refuse_unrunnable
from realbench.plan.scenario import Scenario
from realbench.runtime.algorithms import make_algorithm
from realbench.runtime.checkpoint import load_adapters, load_hf_shards
from realbench.errors import ConfigError
from realbench.plan.datafiles import Dataset, Encoder, is_messages, load_tokenizer, stop_token_ids
from realbench.runtime.optim import MixedPrecisionAdam
from realbench.models.rewards import TrainerState, call_reward_function, load_function
from realbench.runtime.device import synchronize
from realbench.runtime.engine import PlacedModel
from realbench.runtime.rollout import SlotTimeline, rollout
from realbench.runtime.layout import Coord, Groups, Layout
from realbench.runtime.model import init_adapters, init_full_weights
from realbench.runtime.realloc import BoundReallocation, bytes_received, plan_transfers, rank_plan
from realbench.models.shards import is_adapter, param_specs, tied_aliases

FAULT_ENV = "REALBENCH_FAULT"


# -- the toy task -------------------------------------------------------------------------------------
def token_scores(vocab: int) -> torch.Tensor:
    return torch.where(torch.arange(vocab) >= vocab // 2, 1.0, -1.0)


def toy_reward_weights(spec: ModelSpec) -> dict[str, torch.Tensor]:
    """Full weights of a value-head model whose output increases with the sequence's mean score."""
    w = {s.name: torch.zeros(s.shape) for s in param_specs(spec)}
    h = spec.hidden
    for name in w:
        if name.endswith("norm.weight"):
            w[name] = torch.ones(h)
    emb = torch.zeros(spec.vocab, h)
    emb[:, 0] = 1.0  # a constant dimension keeps the norms stable
    emb[:, 1] = token_scores(spec.vocab)
    w["embed.weight"] = emb
    hd = spec.head_dim
    # layer 0: q = k = 0 gives uniform causal attention; v copies dim 1 into head 0's first
    # value channel, o writes the average into dim 2
    w["layers.0.wv.weight"][0, 1] = 1.0
    w["layers.0.wo.weight"][2, 0] = 1.0
    assert hd >= 1
    w["head.weight"][0, 2] = 1.0
    return w


def make_dataset(call: CallDef, key: str, vocab: int, seed: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 7919 + sum(map(ord, key)))
    good = torch.randint(vocab // 2, vocab, (call.seqs, call.seq_len), generator=g)
    if key == "prompts":
        n = call.seqs // call.group_size
        return torch.randint(0, vocab, (n, call.prompt_len), generator=g).repeat_interleave(call.group_size, 0)
    if key == "pairs":  # rows 2i (chosen: upper-half tokens) and 2i+1 (rejected: lower half)
        bad = torch.randint(0, vocab // 2, (call.seqs, call.seq_len), generator=g)
        pairs = good.clone()
        pairs[1::2] = bad[1::2]
        prefix = torch.randint(0, vocab, (call.seqs // 2, call.seq_len // 2), generator=g)
        pairs[:, : call.seq_len // 2] = prefix.repeat_interleave(2, 0)
        return pairs
    return good  # "sequences" for SFT


def micro_batch_rows(rows: torch.Tensor, dp: int, dp_rank: int, micro_batches: int) -> list[torch.Tensor]:
    """Data-parallel rank `dp_rank`'s micro-batches of `rows`: the rows cut into dp equal
    contiguous shards, its shard into `micro_batches` equal pieces. Plans split a batch only
    where it divides into whole examples (`CallDef.rows_together`), so no piece cuts one."""
    return list(rows.chunk(dp)[dp_rank].chunk(micro_batches))


class NonFiniteError(RuntimeError):
    """A NaN or an infinity in a train call: the run stops before it reaches the weights."""


TARGET_NAMES = {"adv": "advantages", "ret": "returns", "old_values": "values", "kl_ref": "reference log-probabilities",
                "ref_logp": "reference log-probabilities", "ref": "reference log-probabilities"}


def _first_bad(v: torch.Tensor) -> str:
    bad = v[~torch.isfinite(v)]
    return f"{float(bad[0])} ({bad.numel()} of {v.numel()} values)"


# -- events ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Event:
    kind: str  # realloc | transfer | call
    call: int
    ranks: frozenset
    sources: tuple[tuple[int, tuple[str, ...]], ...] = ()  # transfer: (producer call, its keys)


EVENT_UNITS = {"call": 1.0, "realloc": 1.0, "transfer": 0.0}


def step_order(events: list[Event], calls: list[CallDef], ahead: frozenset = frozenset()) -> list[Event]:
    """The order in which every rank walks a step's events (each taking those it is part of): a
    list schedule, each event as early as its inputs and its ranks allow (calls and weight moves
    a unit long, data transfers none; ties to the shorter, then to the dataflow's order). So data
    moves as soon as it exists and its ranks are free, as the cost model's simulator assumes: in
    the dataflow's order, a rank that produced a later call's input would first run its own next
    call, and the later call would wait for it.
    Dependencies: a transfer on its producers' calls; a call on the transfer and the weight move
    into it; a model's train call on the model's events before it (they read the weights it
    updates), and the model's events after it on it. Every rank following one order that keeps
    them cannot deadlock: the earliest unfinished event finds all its ranks done with the events
    before it.
    A call in `ahead` (asynchronous RL: a generation running ahead of training) generates with
    the weights it has, then receives the new ones for its next batch: its weight move depends
    on it instead (and, reading the master copy, comes before the model's train call)."""
    model = [calls[e.call].model for e in events]
    deps: list[set[int]] = [set() for _ in events]
    call_event = {e.call: k for k, e in enumerate(events) if e.kind == "call"}
    for k, e in enumerate(events):
        if e.kind == "transfer":
            deps[k] |= {call_event[p] for p, _ in e.sources}
        if e.kind == "call":
            deps[k] |= {j for j, d in enumerate(events) if d.kind != "call" and d.call == e.call
                        and not (d.kind == "realloc" and e.call in ahead)}
        if e.kind == "realloc" and e.call in ahead:
            deps[k].add(call_event[e.call])
        for j in range(k):
            trains_j = events[j].kind == "call" and calls[events[j].call].kind == CallKind.TRAIN
            trains_k = e.kind == "call" and calls[e.call].kind == CallKind.TRAIN
            if model[j] == model[k] and (trains_j or trains_k) and events[j].kind != "transfer" and e.kind != "transfer":
                deps[k].add(j)
    end: dict[int, float] = {}
    free: dict[int, float] = {}
    order: list[int] = []
    while len(order) < len(events):
        ready = [k for k in range(len(events)) if k not in end and deps[k] <= end.keys()]

        def start(k: int) -> float:
            return max([end[j] for j in deps[k]] + [free.get(r, 0.0) for r in events[k].ranks])

        k = min(ready, key=lambda k: (start(k), EVENT_UNITS[events[k].kind], k))
        end[k] = start(k) + EVENT_UNITS[events[k].kind]
        for r in events[k].ranks:
            free[r] = end[k]
        order.append(k)
    return [events[k] for k in order]


def layout_of(option: Option, gpus_per_node: int) -> Layout:
    s = option.strategy
    return Layout.on(option.mesh.devices(gpus_per_node), s.dp, s.tp, s.pp, s.virtual_stages, s.ep)


def dp_heads(layout: Layout) -> list[int]:
    return [layout.rank_of(Coord(d, 0, layout.dims.pp - 1)) for d in range(layout.dims.dp)]


@dataclass
class StepRecord:
    call_s: dict[str, float] = field(default_factory=dict)
    # per call: [start, end] on the wall clock (seconds since the epoch; one clock for the local
    # processes), so that a call's own time is from the last of its ranks arriving to the last
    # leaving: a rank that arrives early waits for the others inside call_s
    call_span: dict[str, list[float]] = field(default_factory=dict)
    realloc_s: dict[str, float] = field(default_factory=dict)
    realloc_bytes: int = 0
    step_s: float = 0.0  # the whole step on this rank
    reward: Optional[float] = None
    loss: Optional[float] = None
    # per call that reports them: "<call>/<name>" -> value (kl, value_error, margin, ...)
    metrics: dict[str, float] = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)  # a few decoded prompts and completions
    # per generation call: [global row, response length] of the rows this rank sampled
    lengths: dict[str, list[list[int]]] = field(default_factory=dict)
    # per generation call and replica under continuous batching: the slots busy at each decode step
    slots: dict[str, list[int]] = field(default_factory=dict)
    # per generation call: how its decode steps ran on this rank (rollout.SlotTimeline.decode; a
    # pipeline's "micro-batched")
    decode: dict[str, str] = field(default_factory=dict)


class Worker:
    def __init__(self, rank: int, scenario: Scenario, options: dict[str, Option], seed: int = 0,
                 total_steps: Optional[int] = None, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, groups: Optional[Groups] = None,
                 dataset: Optional[Dataset] = None, weights: bool = True, compile_decode: bool = False):
        """`groups`, `dataset`: an earlier worker's of the same run (a plan switch keeps the
        process groups it can and the tokenized data); `weights`: fill the models with their
        initial weights (false when they are about to be moved in, see runtime.replan);
        `compile_decode`: generation's decode steps through torch.compile (rollout.RolloutEngine)."""
        self.compile_decode = compile_decode
        self.rank, self.scenario, self.seed = rank, scenario, seed
        # the run's length: the learning-rate schedules decay over it
        self.total_steps = total_steps
        self.dtype = dtype  # what the models compute in; trained models keep fp32 master weights
        self.evaluating = False  # a pass over the held-out rows (no training) is under way
        self.algorithm = make_algorithm(scenario.algorithm, scenario)
        # the data files, tokenized (every rank reads the same rows for a step); None: the toy task
        self.dataset = dataset if dataset is not None or scenario.data is None else \
            Dataset(scenario.data, scenario.algorithm, scenario.data.tokenizer, seed)
        # the ids that end a response: the tokenizer's end-of-sequence token and those of the
        # actor checkpoint's generation config
        self.eos = stop_token_ids(self.dataset.tokenizer, getattr(scenario.models.get("actor"), "path", None)) \
            if self.dataset is not None else None
        # reward models with a tokenizer of their own score the decoded texts re-tokenized
        self.rescoring = {role: Encoder(load_tokenizer(folder), scenario.data.chat, folder)
                          for role, folder in scenario.data.tokenizers.items()} if scenario.data is not None else {}
        self.device = torch.device(device)  # where this rank's models and messages live
        self.current = "start-up"
        df = scenario.dataflow
        G = scenario.cluster.gpus_per_node
        refuse_unrunnable(scenario, options)
        self.calls = [df.call(n) for n in df.order]
        self.layouts = [layout_of(options[c.name], G) for c in self.calls]
        self.micro_batches = [options[c.name].strategy.micro_batches for c in self.calls]
        self.checkpointing = [options[c.name].strategy.checkpointing for c in self.calls]
        # LoRA: the calls whose layouts receive the adapters merged into the base every step
        self.merge_lora = [options[c.name].strategy.merge_lora for c in self.calls]
        for c, lay, m in zip(self.calls, self.layouts, self.micro_batches):
            unit = self.algorithm.rows_together
            if c.kind == CallKind.TRAIN and (c.seqs // c.optimizer_steps) % (lay.dims.dp * m * unit):
                raise ConfigError(f"{c.name}: the batch of {c.seqs // c.optimizer_steps} sequences does not split into "
                                  f"dp*micro_batches = {lay.dims.dp}*{m} pieces of whole {unit}-row examples "
                                  f"({self.algorithm.name} compares the rows of an example)", "micro_batches")
        index = {c.name: i for i, c in enumerate(self.calls)}
        trains = {c.model: i for i, c in enumerate(self.calls) if c.kind == CallKind.TRAIN}
        # the call whose loss is the step's `loss`: the actor's train call (every built-in algorithm
        # trains an actor), else the first train call
        self.policy_train = trains.get("actor", min(trains.values(), default=-1))
        self.master_of = []
        for i, c in enumerate(self.calls):
            self.master_of.append(trains.get(c.model, next(j for j, d in enumerate(self.calls) if d.model == c.model)))
        self.groups = groups if groups is not None else Groups()
        self.groups.prepare(self.layouts)
        self.realloc_plans = {}  # this rank's messages for each call's reallocation
        self.realloc_bytes = {}  # and the bytes it receives in them
        self.reallocations: dict[int, BoundReallocation] = {}  # bound to the tensors, at first use
        # LoRA: what moves once a layout holds the frozen base, (plan, bytes), until it takes over
        self.realloc_after: dict[int, tuple] = {}
        self.events: list[Event] = []
        producer = {k: index[c.name] for c in self.calls for k in c.outputs}
        for i, c in enumerate(self.calls):
            m = self.master_of[i]
            if m != i and self.layouts[m] != self.layouts[i]:
                spec = scenario.models[c.model]
                transfers = plan_transfers(spec, self.layouts[m], self.layouts[i])
                if self.merge_lora[i]:  # W + s B A every step, in the base's tensors: no adapters move
                    transfers = [t for t in transfers if not is_adapter(t.name)]
                self.realloc_plans[i] = rank_plan(spec, self.layouts[m], self.layouts[i], rank, transfers)
                self.realloc_bytes[i] = bytes_received(transfers, spec, dtype.itemsize).get(rank, 0)
                if spec.lora is not None and not self.merge_lora[i]:
                    # LoRA: the base is frozen, so once a layout holds it only the adapters change
                    # (and a call on the base alone needs nothing more)
                    moved = [t for t in transfers if is_adapter(t.name)] if c.adapters else []
                    self.realloc_after[i] = (rank_plan(spec, self.layouts[m], self.layouts[i], rank, moved),
                                             bytes_received(moved, spec, dtype.itemsize).get(rank, 0))
                self.events.append(Event("realloc", i, frozenset(self.layouts[m].ranks) | frozenset(self.layouts[i].ranks)))
            by_producer: dict[int, list[str]] = {}
            for k in c.inputs:
                if k in producer:
                    by_producer.setdefault(producer[k], []).append(k)
            if by_producer:
                ranks = frozenset(self.layouts[i].ranks).union(*(dp_heads(self.layouts[p]) for p in by_producer))
                self.events.append(Event("transfer", i, ranks, tuple((p, tuple(keys)) for p, keys in by_producer.items())))
            self.events.append(Event("call", i, frozenset(self.layouts[i].ranks)))
        # asynchronous RL: the generation calls that run ahead of training with weights up to
        # max_staleness versions old (they receive the new weights after generating; see step_order)
        self.ahead = frozenset(index[n] for n in df.ahead_calls)
        # per such call: the weights' version (train steps applied) its layout holds, set when
        # they move to it; none yet: they move before its first generation (`_walk`)
        self.weights_version: dict[int, int] = {}
        self.events = step_order(self.events, self.calls, self.ahead)
        # master copies (and optimizers) of the models whose master layout holds this rank
        self.masters: dict[int, PlacedModel] = {}
        # copies of models on other calls' layouts, filled by reallocation and kept from step to
        # step so that a reallocation writes into tensors that already exist
        self.placed: dict[int, PlacedModel] = {}
        self.optimizers: dict[int, MixedPrecisionAdam] = {}
        self.functions = {i: [(FunctionSpec.short(f), load_function(*FunctionSpec.parts(f)))
                              for f in scenario.models[c.model].functions]
                          for i, c in enumerate(self.calls) if c.kind == CallKind.FUNCTION}
        for m in sorted(set(self.master_of)):
            lay = self.layouts[m]
            if lay.coord(rank) is None or m in self.functions:
                continue
            c = self.calls[m]
            spec = scenario.models[c.model]
            model = PlacedModel(spec, lay, rank, self.groups, self.device, self.dtype)
            if weights and spec.path:  # a checkpoint folder: this rank reads its own slices only
                model.load_shards(load_hf_shards(spec, lay.dims.tp, model.coord.tp, lay.dims.pp, model.coord.pp,
                                                 seed=self.seed, v=lay.dims.v, ep=lay.dims.ep,
                                                 ep_rank=lay.ep_rank(model.coord)))
                if spec.lora is not None:  # the adapters of a PEFT folder, or fresh ones, on the checkpoint's weights
                    adapters = load_adapters(spec) if spec.lora.path else init_adapters(spec, self.weights_seed(spec))
                    model.stage.load_full(adapters, only=set(adapters))
            elif weights:
                model.stage.load_full(self.initial_weights(c.model, spec))
            self.masters[m] = model
            if c.kind == CallKind.TRAIN:  # the model's optimizer settings (training:), over the run's updates
                settings = scenario.training.optimizer(c.model)
                if total_steps is None and settings.needs_total_updates:
                    raise ConfigError(f"a {settings.lr_scheduler_type} learning-rate schedule depends on the run's "
                                      "length: give the worker total_steps", "training.lr_scheduler_type")
                updates = (total_steps or 1) * c.optimizer_steps * c.iterations
                self.optimizers[m] = MixedPrecisionAdam(model, settings=settings, total_updates=updates)

    def initial_weights(self, role: str, spec: ModelSpec) -> dict[str, torch.Tensor]:
        if role == "reward":
            return toy_reward_weights(spec)
        return init_full_weights(spec, seed=self.weights_seed(spec))

    def weights_seed(self, spec: ModelSpec) -> int:
        """The seed of a model's random weights: the reference starts as the actor; the critic
        from its own seed."""
        return self.seed * 31 + (1 if spec.value_head else 0)

    # -- one RLHF step ----------------------------------------------------------------------------------
    def step(self, step: int) -> StepRecord:
        rec = StepRecord()
        start = time.perf_counter()
        self._walk(step, rec, set(range(len(self.calls))))
        rec.step_s = time.perf_counter() - start
        if self.dataset is not None:  # how far through the data: epochs, fractional
            rec.metrics["data/epoch"] = self._epoch(step + 1)
        return rec

    def _epoch(self, step: int) -> float:
        """Epochs of the training data read before step `step` (fractional)."""
        reader = next(c for c in self.calls for k in c.inputs if k in self.scenario.dataflow.input_keys)
        count, _ = self._rows_per_step(reader, next(k for k in reader.inputs if k in self.scenario.dataflow.input_keys))
        return self.dataset.epoch(step, count)

    def evaluate(self, step: int) -> dict[str, float]:
        """A pass over the held-out rows with the current weights, training nothing: generation
        algorithms generate greedily and score the responses (`eval/reward`, `eval/response_len`);
        DPO and SFT compute their loss and metrics without a step (`eval/loss`, ...). Every rank
        calls it at the same step."""
        if self.dataset is None or not self.dataset.held_out:
            return {}
        gen = [i for i, c in enumerate(self.calls) if c.kind == CallKind.GENERATE]
        if gen:  # the (first) generation and the call that scores it
            scorer = next(i for i, c in enumerate(self.calls) if "rewards" in c.outputs)
            calls = {gen[0], scorer}
        else:
            calls = set(range(len(self.calls)))
        rec = StepRecord()
        self.evaluating = True
        try:
            self._walk(step, rec, calls)
        finally:
            self.evaluating = False
        out = {"eval/reward": rec.reward, "eval/loss": rec.loss}
        for k, v in rec.metrics.items():
            if k.endswith(("/response_len", "/margin", "/accuracy", "/reward_std")):
                out["eval/" + k.split("/", 1)[1]] = v
        return {k: v for k, v in out.items() if v is not None}

    def _walk(self, step: int, rec: StepRecord, calls: set[int]) -> None:
        """The events of `calls` that this rank takes part in, in the plan's order."""
        fault = os.environ.get(FAULT_ENV, "")  # "rank:call": fail there, to test failure handling
        self.data: dict[int, dict[str, torch.Tensor]] = {}  # call -> full-batch inputs it received
        self.outputs: dict[int, dict[str, torch.Tensor]] = {}  # call -> this rank's dp shard of outputs
        for e in self.events:
            if e.kind == "realloc" and e.call in self.ahead and e.call not in self.weights_version:
                # a generation that runs ahead starts from the weights as they are (the run's
                # first step, a resume, a plan switch): moved before it, once
                if self.rank in e.ranks:
                    self._realloc(e.call, rec)
                self.weights_version[e.call] = step
        for e in self.events:
            if self.rank not in e.ranks or e.call not in calls:
                continue
            if e.kind == "realloc" and e.call in self.ahead and self.evaluating:
                continue  # an evaluation generates with the generator's weights and moves none
            self.current = f"{e.kind} {self.calls[e.call].name}"
            if fault == f"{self.rank}:{self.calls[e.call].name}" and e.kind == "call":
                raise RuntimeError(f"injected fault ({FAULT_ENV})")
            t0 = time.perf_counter()
            if e.kind == "realloc":
                self._realloc(e.call, rec)
                synchronize(self.device)  # a GPU's queued work is part of the event's time
                rec.realloc_s[self.calls[e.call].name] = time.perf_counter() - t0
                if e.call in self.ahead:  # the master copy has had `step` train steps (its train call comes after)
                    self.weights_version[e.call] = step
            elif e.kind == "transfer":
                self._transfer(e.call, [(p, keys) for p, keys in e.sources if p in calls])
                synchronize(self.device)
            else:
                started = time.time()
                self._call(e.call, step, rec)
                synchronize(self.device)
                rec.call_s[self.calls[e.call].name] = time.perf_counter() - t0
                rec.call_span[self.calls[e.call].name] = [started, time.time()]

    def _model(self, i: int) -> PlacedModel:
        m = self.master_of[i]
        return self.masters[m] if self.layouts[m] == self.layouts[i] else self.placed[i]

    def _realloc(self, i: int, rec: StepRecord) -> None:
        c, m = self.calls[i], self.master_of[i]
        spec = self.scenario.models[c.model]
        first = i not in self.reallocations
        if first and self.layouts[i].coord(self.rank) is not None:
            self.placed[i] = PlacedModel(spec, self.layouts[i], self.rank, self.groups, self.device, self.dtype)
        if first or i in self.realloc_after:
            if not first:  # the frozen base is there: from now on, the adapters alone
                self.realloc_plans[i], self.realloc_bytes[i] = self.realloc_after.pop(i)
            self.reallocations[i] = BoundReallocation(  # the compute weights move, in their dtype
                self.realloc_plans[i], self.masters[m].shards() if m in self.masters else {},
                self.placed[i].shards() if i in self.placed else {}, dtype=self.dtype, device=self.device)
        if self.merge_lora[i] and m in self.masters:  # the trainer's shards send W + s B A, then are W again
            with self.masters[m].stage.merged():
                self.reallocations[i]()
        else:
            self.reallocations[i]()
        rec.realloc_bytes += self.realloc_bytes[i]

    def _adapters_on(self, i: int) -> bool:
        """Whether call i runs its model's LoRA adapters: not on the base alone (a LoRA policy's
        reference), nor where they arrived merged into the base weights."""
        return self.calls[i].adapters and not (self.merge_lora[i] and i in self.placed)

    def _transfer(self, i: int, sources: list[tuple[int, tuple[str, ...]]]) -> None:
        """The keys of each producer in `sources` to every rank of call i's mesh: the producers'
        dp heads send their shards; one round of shapes, then one of data, for all of them."""
        dst_layout = self.layouts[i]
        received: dict[str, list] = {}
        outgoing, incoming = [], []  # (peer, tensor); (peer, key, dp index of the head)
        for p, keys in sources:
            heads = dp_heads(self.layouts[p])
            for key in keys:
                received[key] = [None] * len(heads)
                for d, head in enumerate(heads):
                    for r in dst_layout.ranks:
                        if head == r == self.rank:
                            received[key][d] = self.outputs[p][key]
                        elif head == self.rank:
                            outgoing.append((r, self.outputs[p][key].contiguous()))
                        elif r == self.rank:
                            incoming.append((head, key, d))
        # two rounds, each posted at once (peers may send to each other; on NCCL, sends issued
        # one by one would wait for each other's receives): the shapes, then the data
        headers = [(head, torch.empty(8, dtype=torch.long, device=self.device)) for head, _, _ in incoming]
        _exchange([(r, _header(t, self.device)) for r, t in outgoing], headers)
        buffers = []
        for head, header in headers:
            ndim, is_long = int(header[0]), bool(header[1])
            buffers.append((head, torch.empty(*header[2:2 + ndim].tolist(), device=self.device,
                                              dtype=torch.long if is_long else torch.float32)))
        _exchange(outgoing, buffers)
        for (_, key, d), (_, buf) in zip(incoming, buffers):
            received[key][d] = buf
        if dst_layout.coord(self.rank) is not None:
            store = self.data.setdefault(i, {})
            for key, parts in received.items():
                store[key] = torch.cat(parts)

    def _inputs(self, i: int, step: int) -> dict[str, torch.Tensor]:
        c = self.calls[i]
        data = dict(self.data.get(i, {}))
        for k in c.inputs:
            if k in data:
                continue
            if self.dataset is None:  # the toy task's random tokens
                data[k] = make_dataset(c, k, self.scenario.models[c.model].vocab, self.seed, step).to(self.device)
                continue
            spec = self.scenario.data
            count, group = self._rows_per_step(c, k)
            idx = self._row_indices(step, count)
            width = c.prompt_len if k == "prompts" else spec.prompt_len
            data[k] = self.dataset.batch(k, idx, width, spec.completion_len, group,
                                         held_out=self.evaluating).to(self.device)
        return data

    def _row_indices(self, step: int, count: int) -> list[int]:
        """The dataset rows of a step, or, in an evaluation, the held-out rows (repeated to fill
        the call's batch, whose shape the plan fixes)."""
        if self.evaluating:
            return [k % len(self.dataset.held_out) for k in range(count)]
        return self.dataset.indices(step, count)

    def _rows_per_step(self, c: CallDef, key: str) -> tuple[int, int]:
        """How many dataset rows a step reads, and how many times each is repeated: a generate
        call's prompts (`group_size` samples each), DPO's pairs (two sequences a row), SFT's
        sequences."""
        if key == "prompts":
            return c.seqs // c.group_size, c.group_size
        return (c.seqs // 2, 1) if key == "pairs" else (c.seqs, 1)

    def _step_columns(self, step: int) -> tuple[list, dict[str, list]]:
        """The prompts (as the data gives them) and the other columns of the step's rows, one
        entry per response, for reward functions."""
        gen = next(c for c in self.calls if c.kind == CallKind.GENERATE)
        count, group = self._rows_per_step(gen, "prompts")
        columns = self.dataset.columns(self._row_indices(step, count), group, held_out=self.evaluating)
        prompts = columns.pop(self.scenario.data.column("prompt"))
        return prompts, columns

    def _call(self, i: int, step: int, rec: StepRecord) -> None:
        c = self.calls[i]
        model = self._model(i) if i not in self.functions else None
        data = self._inputs(i, step)
        lay = self.layouts[i]
        coord = lay.coord(self.rank)
        dp, m = lay.dims.dp, self.micro_batches[i]
        if c.kind == CallKind.GENERATE:
            prompts = data["prompts"].chunk(dp)[coord.dp]
            rows = torch.arange(len(data["prompts"])).chunk(dp)[coord.dp]  # global row indices: plan-independent draws
            greedy = "greedy" in c.name or self.evaluating
            slots = SlotTimeline()
            with model.stage.adapters(self._adapters_on(i)):
                seqs, lps = rollout(model, prompts, c.gen_len, m, c.sync_steps, slots, self.compile_decode,
                                    key=self.seed * 1_000_003 + step * 131 + i * 17, greedy=greedy,
                                    temperature=self.algorithm.temperature, top_k=self.scenario.training.top_k,
                                    top_p=self.scenario.training.top_p, eos=self.eos, rows=rows)
            rec.decode[c.name] = slots.decode or "micro-batched"
            if slots.busy and coord.tp == 0:  # the replica's slots filling and draining
                rec.slots[f"{c.name}/dp{coord.dp}"] = slots.busy
            if model.is_last:
                names = list(c.outputs)
                self.outputs[i] = {names[0]: seqs, **({names[1]: lps} if len(names) > 1 else {})}
                # how many train steps behind the weights that generated this batch are when it trains
                rec.metrics["staleness"] = float(step - self.weights_version.get(i, step))
                response = seqs[:, -c.gen_len:] >= 0
                rec.metrics[f"{c.name}/response_len"] = float(response.sum(1).float().mean())
                if coord.tp == 0:  # once per data-parallel replica: summed over ranks into tokens/s
                    rec.metrics[f"{c.name}/tokens"] = float(response.sum())
                    rec.lengths[c.name] = [[int(r), int(n)] for r, n in zip(rows, response.sum(1))]
                    if coord.dp == 0 and not rec.samples:
                        rec.samples = self._samples(seqs, c.gen_len)
        elif c.kind == CallKind.FUNCTION:
            self._reward_function(i, data, coord, step, rec)
        elif c.kind == CallKind.INFERENCE:
            full = data[next(k for k in c.inputs)]
            batch = full.chunk(dp)[coord.dp]
            if c.model in self.rescoring:  # a reward model with its own tokenizer: the texts, re-tokenized
                batch = self._rescored(c, batch, torch.arange(len(full)).chunk(dp)[coord.dp].tolist(), step)
            with model.stage.adapters(self._adapters_on(i)):
                outs = model.forward(list(batch.chunk(m)))
            if outs is not None:
                y = torch.cat(outs)
                self.outputs[i] = {k: self._inference_output(c, k, y, batch) for k in c.outputs}
                if "rewards" in c.outputs:
                    self._record_rewards(c, self.outputs[i]["rewards"], rec)
        elif self.evaluating:  # a train call's loss on held-out rows, without a step
            loss = self._evaluate_train(i, model, data, coord, rec)
            if loss is not None:
                rec.loss = loss
        else:
            loss = self._train(i, model, data, coord, rec, step)
            if loss is not None:
                rec.metrics[f"{c.name}/loss"] = loss
                if i == self.policy_train:
                    rec.loss = loss  # the step's headline loss is the policy's

    def _samples(self, seqs: torch.Tensor, gen_len: int, count: int = 2) -> list[dict]:
        """The first responses of the batch, decoded (token ids for the toy task)."""
        out = []
        for row in seqs[:count].tolist():
            prompt, completion = [t for t in row[:-gen_len] if t >= 0], [t for t in row[-gen_len:] if t >= 0]
            if self.dataset is not None:
                tok = self.dataset.tokenizer
                out.append({"prompt": tok.decode(prompt), "completion": tok.decode(completion)})
            else:
                out.append({"prompt": prompt, "completion": completion})
        return out

    def _record_rewards(self, c: CallDef, rewards: torch.Tensor, rec: StepRecord) -> None:
        """The step's reward: the mean over the responses that got one (this rank's share)."""
        scored = rewards[~rewards.isnan()]
        rec.reward = float(scored.mean()) if len(scored) else None
        rec.metrics[f"{c.name}/reward_std"] = float(scored.std()) if len(scored) > 1 else 0.0

    def _completions(self, seqs: torch.Tensor, gen: int) -> tuple[list[str], list[list[int]]]:
        """The responses of `seqs` (their last `gen` positions) decoded without special tokens,
        and their token ids (the end-of-sequence token included, padding not), as TRL gives them."""
        ids = [[t for t in row if t >= 0] for row in seqs[:, -gen:].tolist()]
        return [self.dataset.tokenizer.decode(x, skip_special_tokens=True) for x in ids], ids

    def _conversational(self, prompts: list) -> bool:
        return self.scenario.data.chat or any(is_messages(p) for p in prompts)

    def _reward_function(self, i: int, data: dict, coord: Coord, step: int, rec: StepRecord) -> None:
        """Score this rank's share of the responses with the reward functions, each called as TRL
        calls one: `prompts` as the data gives them, `completions` (for chat prompts, each a list
        with the assistant's message), `completion_ids`, `trainer_state` and the other columns.
        A response's reward is the weighted sum (`training.reward_weights`) of its scores: a
        reward model's (the call's second input, when it has one) and each function's; a None
        is no score from that function and is left out of the sum (TRL's nansum), and a response
        that no scorer scored gets NaN, which the advantages leave out (`<call>/no_reward` is
        their fraction). With several scorers, each one's mean is `<call>/<scorer>`."""
        c, dp = self.calls[i], self.layouts[i].dims.dp
        spec = self.scenario.models[c.model]
        seqs = data[c.inputs[0]].chunk(dp)[coord.dp]
        prompts, columns = self._step_columns(step)
        mine = torch.arange(len(prompts)).chunk(dp)[coord.dp].tolist()
        texts, ids = self._completions(seqs, self._gen_len(c))
        chat = self._conversational(prompts)
        prompts = [prompts[r] for r in mine]
        completions = [[{"role": "assistant", "content": t}] for t in texts] if chat else texts
        if chat:  # plain prompts under `chat: true` are the user's messages, as the template saw them
            prompts = [p if is_messages(p) else [{"role": "user", "content": p}] for p in prompts]
        state = TrainerState(global_step=step, epoch=self._epoch(step))
        kwargs = {**{k: [v[r] for r in mine] for k, v in columns.items()}, "completion_ids": ids, "trainer_state": state}
        scores = [data[c.inputs[1]].chunk(dp)[coord.dp].float()] if spec.model_score else []
        names = ["model"] if spec.model_score else []
        for name, fn in self.functions[i]:
            values = call_reward_function(fn, name, prompts, completions, kwargs, step)
            scores.append(torch.tensor(values, dtype=torch.float32, device=self.device))
            names.append(name.rsplit(":", 1)[-1])
        weights = self.scenario.training.reward_weights or spec.weight_list()
        stacked = torch.stack(scores, 1)
        none = stacked.isnan().all(1)
        rewards = (stacked * torch.tensor(weights, device=self.device)).nansum(1).masked_fill(none, math.nan)
        rec.metrics[f"{c.name}/no_reward"] = float(none.float().mean())
        if len(scores) > 1:
            for name, col in zip(names, stacked.unbind(1)):
                if not bool(col.isnan().all()):
                    rec.metrics[f"{c.name}/{name}"] = float(col.nanmean())
        self.outputs[i] = {c.outputs[0]: rewards}
        if c.outputs[0] == "rewards":
            self._record_rewards(c, rewards, rec)

    def _rescored(self, c: CallDef, seqs: torch.Tensor, rows: list[int], step: int) -> torch.Tensor:
        """The ids a reward model with its own tokenizer scores for these responses (global rows
        `rows` of the step): each prompt as the data gives it and its completion decoded by the
        policy's tokenizer, tokenized by the reward model's (`Encoder.scored`, TRL's recipe),
        right-padded with -1."""
        prompts, _ = self._step_columns(step)
        texts, _ = self._completions(seqs, self._gen_len(c))
        enc = self.rescoring[c.model]
        ids = [enc.scored(prompts[r], t) for r, t in zip(rows, texts)]
        width = max(1, max(len(x) for x in ids))
        return torch.tensor([x + [-1] * (width - len(x)) for x in ids], dtype=torch.long, device=self.device)

    def _inference_output(self, c: CallDef, key: str, y: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        gen = self._gen_len(c)
        if key.endswith("rewards"):  # the score at each sequence's last token (before any padding)
            last = (batch >= 0).long().cumsum(1).argmax(1)
            score = y[torch.arange(len(y), device=y.device), last].float()
            weights = self.scenario.training.reward_weights  # a reward model alone: its one weight
            return score * weights[0] if weights and not key.startswith("model_") else score
        if key == "values":
            return y[:, -gen - 1:-1].float()
        return self.algorithm.reference_logprobs(y, batch, gen)

    def _gen_len(self, c: CallDef) -> int:
        gens = [d.gen_len for d in self.calls if d.kind == CallKind.GENERATE]
        return gens[0] if gens else c.seq_len // 2

    def _train(self, i: int, model: PlacedModel, data: dict, coord: Coord, rec: StepRecord,
               step: int) -> Optional[float]:
        """The call's optimizer updates: `iterations` passes over its batch, one update per
        minibatch. Each update's loss is the sum over its tokens (or pairs), weighted for the
        loss type, divided by their count in the whole minibatch, times dp (the gradient
        all-reduce averages), so the gradient is the same for every layout and micro-batch split;
        its global norm (over every shard, `PlacedModel.grad_norm`) is clipped to the model's
        `max_grad_norm`. The policy's behaviour log-probabilities come from this layout's forward
        (see Algorithm), by the call's `old_logprobs`: later_steps, the first update's own, the
        others' computed before the first update; whole_batch, every step's computed before it;
        rollout, generation's. A
        non-finite advantage, loss or gradient stops the run before it reaches the weights
        (`NonFiniteError`)."""
        c, algo = self.calls[i], self.algorithm
        dp, m = self.layouts[i].dims.dp, self.micro_batches[i]
        value_model = self.scenario.models[c.model].value_head
        group = next((d.group_size for d in self.calls if d.kind == CallKind.GENERATE), 1)
        targets = algo.targets(data, value_model, group)
        for k, v in targets.items():
            if v.is_floating_point() and not bool(torch.isfinite(v).all()):
                raise NonFiniteError(f"{c.name} at step {step}: the {TARGET_NAMES.get(k, k)} hold "
                                     f"{_first_bad(v)}; nothing was applied to the weights")
        for k, v in algo.metrics(targets, value_model).items():
            rec.metrics[f"{c.name}/{k}"] = v
        per_step = len(targets["seqs"]) // c.optimizer_steps
        steps = [torch.arange(s * per_step, (s + 1) * per_step, device=self.device) for s in range(c.optimizer_steps)]
        splits = [micro_batch_rows(rows, dp, coord.dp, m) for rows in steps]
        behaviour, policy = None, algo.recomputes_behaviour and not value_model
        if policy and c.old_logprobs == "rollout":  # generation's, for every update
            targets = {**targets, "old_logp": data["logprobs"]}
        elif policy and c.old_logprobs == "whole_batch":
            behaviour = self._behaviour_logprobs(model, targets, splits)
        elif policy and (len(splits) > 1 or c.iterations > 1):
            behaviour = self._behaviour_logprobs(model, targets, splits if c.iterations > 1 else [None] + splits[1:])
        own_first = c.old_logprobs == "later_steps"  # the first update's ratio takes its forward's own
        opt = self.optimizers[i]
        settings = opt.settings
        updates = c.optimizer_steps * c.iterations
        rec.metrics[f"{c.model}/learning_rate"] = opt.learning_rate()
        total, sums, norms = 0.0, {}, []
        for k in range(updates):
            s, mbs, rows = k % c.optimizer_steps, splits[k % c.optimizer_steps], steps[k % c.optimizer_steps]
            scale = dp / algo.normalizer(targets, rows)
            weights = algo.step_weights(targets, rows, value_model)

            def loss_fn(j, y, mbs=mbs, scale=scale, s=s, k=k, weights=weights, first=rows[0]):
                t = {key: v[mbs[j]] for key, v in targets.items()}
                if behaviour is not None and (k > 0 or not own_first):
                    t["old_logp"] = behaviour[s][j]
                if weights is not None:
                    t["weight"] = weights[mbs[j] - first]
                loss, parts = algo.loss(y, t, value_model)
                for key, v in parts.items():  # per update, as the loss: summed here, scaled like it
                    sums[key] = sums.get(key, 0.0) + float(v.detach()) * scale / updates
                return loss * scale

            opt.zero_grad()
            loss = model.forward_backward([targets["seqs"][idx] for idx in mbs], loss_fn, self.checkpointing[i])
            if loss is not None and not math.isfinite(loss):
                raise NonFiniteError(f"{c.name} at step {step}: the loss is {loss}; nothing was applied to the weights")
            norm = model.grad_norm()
            if not math.isfinite(norm):
                bad = opt.nonfinite_gradient() or "another rank's shard"
                raise NonFiniteError(f"{c.name} at step {step}: the gradient of {bad} (norm {norm}); nothing was "
                                     "applied to the weights")
            norms.append(norm)
            clip = settings.max_grad_norm
            opt.step(min(1.0, clip / (norm + 1e-6)) if clip else 1.0)  # torch's clip_grad_norm_ coefficient
            if loss is not None:
                total += loss / updates
        rec.metrics[f"{c.name}/grad_norm"] = sum(norms) / len(norms)  # before clipping, as TRL logs it
        if not model.is_last:
            return None
        for k, v in sums.items():  # this rank's share; the summary averages over the dp ranks
            rec.metrics[f"{c.name}/{k}"] = v
        return total

    @torch.no_grad()
    def _behaviour_logprobs(self, model: PlacedModel, targets: dict, splits: list[list[torch.Tensor]]):
        """For each optimizer step (None: not needed), per micro-batch, the policy's
        log-probabilities of its rows under the current weights (before any update), from a
        forward of this layout with the step's own micro-batches; on the last stage (None
        elsewhere)."""
        gen = targets["adv"].shape[1]
        out = []
        for mbs in splits:
            if mbs is None:  # the first step's: its own forward, detached
                out.append(None)
                continue
            ys = model.forward([targets["seqs"][idx] for idx in mbs])
            out.append(None if ys is None else [self.algorithm.token_logprobs(y, targets["seqs"][idx], gen)
                                               for y, idx in zip(ys, mbs)])
        return out if model.is_last else None

    @torch.no_grad()
    def _evaluate_train(self, i: int, model: PlacedModel, data: dict, coord: Coord, rec: StepRecord) -> Optional[float]:
        """The train call's loss and forward metrics on the (held-out) batch, as one step would
        see them, but nothing learnt."""
        c, algo = self.calls[i], self.algorithm
        dp, m = self.layouts[i].dims.dp, self.micro_batches[i]
        value_model = self.scenario.models[c.model].value_head
        targets = algo.targets(data, value_model, 1)
        rows = torch.arange(len(targets["seqs"]), device=self.device)
        scale = dp / algo.normalizer(targets, rows)
        mbs = micro_batch_rows(rows, dp, coord.dp, m)
        outs = model.forward([targets["seqs"][idx] for idx in mbs])
        if outs is None:
            return None
        total, sums = 0.0, {}
        for idx, y in zip(mbs, outs):
            loss, parts = algo.loss(y, {k: v[idx] for k, v in targets.items()}, value_model)
            total += float(loss) * scale
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + float(v) * scale
        for k, v in sums.items():
            rec.metrics[f"{c.name}/{k}"] = v
        return total

    def gather_full(self, call: int) -> Optional[dict[str, torch.Tensor]]:
        """The full weights of a call's model (as its master holds them now) on rank 0: every rank
        of the master's layout sends its slices through the reallocation engine. Every rank calls
        it; the others get None."""
        from realbench.runtime.realloc import empty_shards

        m = self.master_of[call]
        spec, src = self.scenario.models[self.calls[m].model], self.layouts[m]
        dst = Layout.on([0], 1, 1, 1)
        plan = rank_plan(spec, src, dst, self.rank)
        out = empty_shards(spec, dst, self.rank, self.dtype, self.device)
        BoundReallocation(plan, self.masters[m].shards() if m in self.masters else {}, out, self.dtype,
                          self.device)()
        return {k: v for k, v in out.items() if k not in tied_aliases(spec, 1)} if self.rank == 0 else None

    def master_state(self, m: int) -> dict[str, dict[str, torch.Tensor]]:
        """What this rank holds of master m's state, by kind, as shard views (aliases included,
        as the reallocation engine reads them): a trained model's fp32 master weights and Adam
        moments, a frozen model's weights; empty when the rank is not on its layout."""
        if m not in self.masters:
            return {}
        if m in self.optimizers:
            state = self.optimizers[m].state_views()
            if self.masters[m].spec.lora is not None:  # the frozen base, beside the adapters' state
                state["weights"] = {k: v for k, v in self.masters[m].shards().items() if k not in state["master"]}
            return state
        return {"weights": self.masters[m].shards()}

    # -- checkpoints ------------------------------------------------------------------------------------
    def save(self, folder: str, step: int) -> None:
        """This rank's master shards after `step` steps, as safetensors: a trained model's fp32
        master weights and Adam moments (`model/<role>/<name>`, `adam/<role>/<name>/exp_avg`,
        `.../exp_avg_sq`), a frozen model's weights as it holds them."""
        from realbench.runtime.checkpoint import save_weights

        tensors, meta = {}, {"step": step, "dtype": str(self.dtype).removeprefix("torch.")}
        for m, model in self.masters.items():
            role = self.calls[m].model
            if m in self.optimizers:
                state, adam_step = self.optimizers[m].tensors()
                for k, v in state.items():
                    tensors[f"adam/{role}/{k}" if "/" in k else f"model/{role}/{k}"] = v
                meta[f"adam_step/{role}"] = adam_step
            if m not in self.optimizers or model.spec.lora is not None:  # weights not in an optimizer: as held
                for k, v in model.shards(aliases=False).items():  # safetensors refuses shared storage
                    tensors.setdefault(f"model/{role}/{k}", v)
        save_weights(os.path.join(folder, f"rank{self.rank}.safetensors"), tensors, meta)


def _header(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """What a receiver needs to allocate `t`: its number of dimensions, whether it holds token
    ids, and its shape (up to 6 dimensions)."""
    return torch.tensor([t.dim(), int(t.dtype == torch.long), *t.shape] + [0] * (6 - t.dim()), device=device)


def _exchange(sends: list[tuple[int, torch.Tensor]], receives: list[tuple[int, torch.Tensor]]) -> None:
    """Send and receive (peer, tensor) messages, all posted at once; messages between two ranks
    arrive in the order they are listed."""
    ops = [dist.P2POp(dist.isend, t, peer) for peer, t in sends]
    ops += [dist.P2POp(dist.irecv, t, peer) for peer, t in receives]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def run_steps(rank: int, scenario: Scenario, options: dict[str, Option], steps: int, seed: int = 0,
              device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> list[StepRecord]:
    worker = Worker(rank, scenario, options, seed, total_steps=steps, device=device, dtype=dtype)
    return [worker.step(s) for s in range(steps)]
