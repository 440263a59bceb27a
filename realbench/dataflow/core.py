"""Call definitions and the dataflow graph (see the package docstring for the semantics)."""

from __future__ import annotations

import math
from enum import Enum
from functools import cached_property
from typing import Literal, Optional

import networkx as nx
from pydantic import ConfigDict, Field, model_validator

from realbench.dataflow.lengths import LengthDistribution
from realbench.errors import ConfigError
from realbench.schema import DerivedValues, FileModel


class CallKind(str, Enum):
    GENERATE = "generate"
    INFERENCE = "inference"
    TRAIN = "train"
    FUNCTION = "function"  # a Python function (a reward function) rather than a model


SYNC_EVERY = 4  # a generation call's default sync_every

# Where a policy's train call takes the old (behaviour) log-probabilities of its ratio from, and
# what each costs (realbench.cost.calls.behaviour_forwards):
#   later_steps  a forward of the train call's own layout over the rows of every optimizer step but
#                the first, before the first update; the first takes its own forward's, detached
#                (the same numbers; with num_iterations > 1 every step's rows). realbench's default.
#   whole_batch  that forward over every row (verl, OpenRLHF, AReaL's recompute_logprob, TRL's GRPO
#                with more than one update a batch)
#   rollout      generation's own log-probabilities, no forward (AReaL's default, verl's
#                algorithm.rollout_correction.bypass_mode); they may round otherwise than the
#                training forward's in bf16
OldLogprobs = Literal["later_steps", "whole_batch", "rollout"]


class LogitsPath(FileModel):
    """How an engine computes a scoring or training call's log-probabilities over the vocabulary,
    where it does so otherwise than realbench prices by default (realbench.cost.calls: the logits of
    a micro-batch held whole, FP32 bytes a logit in a forward and twice that in training, LOGIT_BYTES
    moved a logit): bytes held a logit at the peak of a forward (a train call's forwards for its old
    log-probabilities too) and of a train pass, over every token of the micro-batch or, where the
    engine computes them chunk by chunk and never whole, over `chunk_tokens` tokens; the element-wise
    bytes a logit moves in a forward (a backward moves twice as many); and whether the backward
    computes a chunk's logits again (one more output-layer matmul a pass). Read from an engine's
    settings (realbench.engines.verl.logits_paths: its fused kernels)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    forward_bytes: float = Field(ge=0)
    train_bytes: Optional[float] = Field(default=None, ge=0)
    moved_bytes: float = Field(gt=0)
    chunk_tokens: Optional[int] = Field(default=None, gt=0)
    recomputed: bool = False

    @model_validator(mode="after")
    def _check(self) -> "LogitsPath":
        if self.recomputed and self.chunk_tokens is None:
            raise ValueError("recomputed is for logits computed chunk by chunk (give chunk_tokens)")
        return self


class CallDef(FileModel):
    """One model function call.

    `seqs` sequences of `seq_len` tokens each; a generate call produces the last `gen_len`
    of them from a prompt of `seq_len - gen_len`. A train call makes `optimizer_steps`
    updates (PPO mini-batches) over its batch, `iterations` times. `rows_together` consecutive rows form one
    example that no split may cut (DPO's chosen and rejected responses: 2): every data-parallel
    shard and micro-batch holds whole examples.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    model: str = Field(min_length=1)
    kind: CallKind
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    seqs: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    gen_len: int = Field(default=0, ge=0)
    optimizer_steps: int = Field(default=1, gt=0)
    group_size: int = Field(default=1, gt=0)  # generate: samples per prompt (GRPO, RLOO)
    rows_together: int = Field(default=1, gt=0)  # rows of one example (DPO pairs: 2)
    iterations: int = Field(default=1, gt=0)  # train: passes over the batch (TRL's num_iterations)
    # train of a policy: where the ratio's old log-probabilities come from (the scenario's
    # training.old_logprobs)
    old_logprobs: OldLogprobs = "later_steps"
    # generate: the responses' lengths (None: every response gen_len tokens); gen_len is its cap.
    # inference or train on generated sequences: the lengths of their responses, whose last
    # `lengths.max` positions each row pads to the cap (the runtime trims a micro-batch to its
    # longest row; see `width`)
    lengths: Optional[LengthDistribution] = None
    # inference or train on generated sequences: rows packed end to end without padding (the
    # scenario's training.padding_free: the engines' remove-padding), each as long as its own
    # response; else a micro-batch is as wide as its longest row (`width`)
    padding_free: bool = False
    # generate, continuous batching (realbench.runtime.rollout): decode steps between the host's
    # reads of which rows ended, and between refills of the freed slots (each waits for the next);
    # None: SYNC_EVERY (`sync_steps`)
    sync_every: Optional[int] = Field(default=None, ge=1)
    # generate by an engine's serving engine (a scenario's engine): the fraction of each GPU's
    # memory it takes (vLLM's gpu_memory_utilization, SGLang's mem_fraction_static), its weights
    # and a paged KV cache in the rest, which bounds the sequences that decode together
    # (realbench.cost.calls.serving_slots); None: realbench's rollout, a cache for every slot
    memory_fraction: Optional[float] = Field(default=None, gt=0, le=1)
    # generate by an engine's vLLM server: its max_model_len, the context one request may take, for
    # which vLLM's KV cache must hold one whole sequence before the server starts (where verl leaves it
    # unset, the checkpoint's max_position_embeddings); None: seq_len (SGLang starts with less)
    max_model_len: Optional[int] = Field(default=None, gt=0)
    # inference or train of a language model, an engine's: how it computes the log-probabilities
    # over the vocabulary (None: as realbench prices its own runtime's)
    logits: Optional[LogitsPath] = None
    # inference with the model's LoRA adapters switched off: its frozen base (the reference of a
    # policy trained with LoRA, as TRL and verl compute it), which never needs new weights
    adapters: bool = True
    # inference by a serving engine (vLLM, SGLang: a distillation teacher's prompt log-probabilities),
    # which replicates the KV heads over tp beyond them as a generation does (plan.options.heads_split)
    served: bool = False

    @property
    def sync_steps(self) -> int:
        return self.sync_every or SYNC_EVERY

    @model_validator(mode="after")
    def _check(self) -> "CallDef":
        if self.sync_every is not None and self.kind != CallKind.GENERATE:
            raise ValueError(f"sync_every is only for generate calls (this is a {self.kind.value} call)")
        if self.served and self.kind != CallKind.INFERENCE:
            raise ValueError(f"served is for inference calls a serving engine computes (this is a {self.kind.value} "
                             "call)")
        if self.memory_fraction is not None and self.kind != CallKind.GENERATE:
            raise ValueError(f"memory_fraction is only for generate calls (this is a {self.kind.value} call)")
        if self.max_model_len is not None and self.memory_fraction is None:
            raise ValueError("max_model_len is a serving engine's (give memory_fraction, the share it takes)")
        if self.max_model_len is not None and self.max_model_len < self.seq_len:
            raise ValueError(f"max_model_len {self.max_model_len} is shorter than the call's sequences of "
                             f"{self.seq_len} tokens: the server would cut their responses")
        if self.kind == CallKind.GENERATE:
            if not 0 < self.gen_len < self.seq_len:
                raise ValueError(f"gen_len must be in 1..seq_len-1 for a generate call "
                                 f"(got gen_len={self.gen_len}, seq_len={self.seq_len})")
            if self.lengths is not None and self.lengths.max != self.gen_len:
                raise ValueError(f"the length distribution's max ({self.lengths.max}) is not gen_len ({self.gen_len})")
        elif self.gen_len:
            raise ValueError(f"gen_len is only for generate calls (this is a {self.kind.value} call)")
        elif self.lengths is not None and (self.kind == CallKind.FUNCTION or self.lengths.max >= self.seq_len):
            raise ValueError(f"response lengths up to {self.lengths.max} do not fit in sequences of {self.seq_len} "
                             f"tokens of a {self.kind.value} call")
        if self.logits is not None and self.kind not in (CallKind.INFERENCE, CallKind.TRAIN):
            raise ValueError(f"logits is for inference and train calls (this is a {self.kind.value} call)")
        if self.logits is not None and (self.kind == CallKind.TRAIN) != (self.logits.train_bytes is not None):
            raise ValueError("logits: train_bytes is given for a train call's passes, and only for them")
        if not self.adapters and self.kind != CallKind.INFERENCE:
            raise ValueError(f"adapters: false is for inference calls (this is a {self.kind.value} call)")
        if (self.optimizer_steps != 1 or self.iterations != 1 or self.old_logprobs != "later_steps") \
                and self.kind != CallKind.TRAIN:
            raise ValueError("optimizer_steps, iterations and old_logprobs are only for train calls")
        if self.old_logprobs == "rollout" and "logprobs" not in self.inputs:
            raise ValueError("old_logprobs: rollout takes generation's log-probabilities: the call reads no "
                             "'logprobs'")
        if self.group_size != 1 and (self.kind != CallKind.GENERATE or self.seqs % self.group_size):
            raise ValueError("group_size is for generate calls and must divide seqs")
        if self.kind == CallKind.TRAIN and self.seqs % self.optimizer_steps:
            raise ValueError(f"seqs {self.seqs} do not split into {self.optimizer_steps} optimizer steps")
        if (self.seqs // self.optimizer_steps) % self.rows_together:
            raise ValueError(f"the {self.seqs // self.optimizer_steps} sequences of a step are not whole examples of "
                             f"rows_together = {self.rows_together} rows")
        if len(set(self.inputs)) != len(self.inputs) or len(set(self.outputs)) != len(self.outputs):
            raise ValueError("a key is listed twice")
        own = set(self.inputs) & set(self.outputs)
        if own:
            raise ValueError(f"call consumes its own output {sorted(own)[0]!r}")
        return self

    @property
    def prompt_len(self) -> int:
        return self.seq_len - self.gen_len

    @property
    def tokens(self) -> int:
        return self.seqs * self.seq_len

    def width(self, rows: float, memory: bool = False) -> float:
        """The positions per row that a micro-batch of `rows` sequences of an inference or train
        call processes: `seq_len`, or, for generated sequences with response lengths, the prompt
        and the longest of the `rows` responses (trailing padding is trimmed): on average, or
        (`memory`) as memory is planned for it, at the distribution's `memory_at`."""
        if self.lengths is None or self.kind == CallKind.GENERATE:
            return float(self.seq_len)
        if self.padding_free:  # packed rows: the mean row (attention per row at the mean length too)
            return self.seq_len - self.lengths.max + self.lengths.expected
        longest = self.lengths.memory_longest(rows) if memory else self.lengths.expected_max(rows)
        return self.seq_len - self.lengths.max + longest

    def peak_tokens(self, rows: float, micro_batches: int, max_tokens: Optional[int] = None) -> float:
        """The tokens of the largest of a device's `micro_batches` micro-batches of `rows` rows each
        (an inference call's, or a train call's optimizer step's), that memory is planned for.
        Padded rows: `rows` rows as wide as the longest of all of them (`width`). Rows packed without
        padding (`padding_free`): the prompts and the heaviest of the micro-batches' response sums
        (LengthDistribution.memory_heaviest: fixed rows in arrival order, verl's and OpenRLHF's
        micro-batches of so many rows); or, where the engine packs by tokens within a budget
        (`max_tokens`: AReaL's max_tokens_per_mb, verl's and OpenRLHF's dynamic batch size), a
        micro-batch as full as the budget lets it be: min(budget, all the device's rows). Rows all
        as long (no `lengths`): `rows` of them, whatever the packing."""
        if not self.padding_free or self.lengths is None or self.kind == CallKind.GENERATE:
            return rows * self.width(rows * micro_batches, memory=True)
        prompts = self.seq_len - self.lengths.max
        if max_tokens:
            everything = rows * micro_batches
            return min(max_tokens, everything * prompts + self.lengths.memory_heaviest(math.ceil(everything)))
        return rows * prompts + self.lengths.memory_heaviest(math.ceil(rows), micro_batches)


class Dataflow(DerivedValues):
    """A list of calls and the graph they form. Validated on construction:
    unique names, one producer per key, no cycles, and (when `dataset_keys` is given) every
    consumed key is produced by a call or provided by the dataset.

    `max_staleness` S (asynchronous RL, as AReaL's `max_head_offpolicyness`): the samples
    trained in iteration i may come from the weights of version i - S, so generation runs up to
    S iterations ahead of training; 0 is synchronous RL. Only a dataflow whose trained model
    generates can run ahead (DPO and SFT train on fixed data)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "custom"
    calls: tuple[CallDef, ...] = Field(min_length=1)
    dataset_keys: Optional[tuple[str, ...]] = None
    max_staleness: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "Dataflow":
        if self.max_staleness and not self._generates_trained_model:
            raise ConfigError(f"max_staleness {self.max_staleness} needs a generation call of a trained model to run "
                              f"ahead of training; the {self.name} dataflow has none (it trains on fixed data): "
                              "leave it 0", "max_staleness")
        names = [c.name for c in self.calls]
        for i, n in enumerate(names):
            if n in names[:i]:
                raise ConfigError(f"duplicate call name {n!r}", f"calls.{i}.name")
        producers: dict[str, str] = {}
        for i, c in enumerate(self.calls):
            for k in c.outputs:
                if k in producers:
                    raise ConfigError(f"key {k!r} is produced by both {producers[k]!r} and {c.name!r}",
                                      f"calls.{i}.outputs")
                if self.dataset_keys is not None and k in self.dataset_keys:
                    raise ConfigError(f"key {k!r} is a dataset key and cannot be produced", f"calls.{i}.outputs")
                producers[k] = c.name
        if self.dataset_keys is not None:
            for i, c in enumerate(self.calls):
                for k in c.inputs:
                    if k not in producers and k not in self.dataset_keys:
                        raise ConfigError(f"key {k!r} is produced by no call and is not a dataset key "
                                          f"(dataset keys: {', '.join(self.dataset_keys) or 'none'})",
                                          f"calls.{i}.inputs")
        g = self.graph
        dag = nx.DiGraph((u, v) for u, v, d in g.edges(data=True) if d["lag"] == 0)
        dag.add_nodes_from(g.nodes)
        try:
            cycle = nx.find_cycle(dag)
        except nx.NetworkXNoCycle:
            return self
        raise ConfigError("the calls form a cycle: " + " -> ".join([u for u, _ in cycle] + [cycle[0][0]]),
                          "calls")

    # -- the graph ---------------------------------------------------------------------------
    @property
    def _generates_trained_model(self) -> tuple[str, ...]:
        """The generation calls of trained models: those that can run ahead of training."""
        trained = self.trained_models
        return tuple(c.name for c in self.calls if c.kind == CallKind.GENERATE and c.model in trained)

    @property
    def ahead_calls(self) -> tuple[str, ...]:
        """The calls that run ahead of training with weights up to `max_staleness` versions old
        (none when synchronous)."""
        return self._generates_trained_model if self.max_staleness else ()

    @cached_property
    def graph(self) -> nx.DiGraph:
        """Nodes: call names (attribute `call`). Edges: `kind` = "data" (attribute `keys`) or
        "param"; `lag` = 0 (same iteration), 1 (next iteration), or 1 + max_staleness on the edge
        from a train call to a generation call of its model (the generator may run ahead)."""
        g = nx.DiGraph()
        for c in self.calls:
            g.add_node(c.name, call=c)
        producer = {k: c.name for c in self.calls for k in c.outputs}
        for c in self.calls:
            for k in c.inputs:
                if k in producer:
                    src = producer[k]
                    if g.has_edge(src, c.name):
                        g.edges[src, c.name]["keys"].append(k)
                    else:
                        g.add_edge(src, c.name, kind="data", keys=[k], lag=0)
        for t in self.calls:
            if t.kind != CallKind.TRAIN:
                continue
            for c in self.calls:
                if c.model != t.model:
                    continue
                if c.name != t.name and not g.has_edge(c.name, t.name):
                    # write-after-read: train overwrites the version c reads
                    g.add_edge(c.name, t.name, kind="param", keys=[], lag=0)
                if not g.has_edge(t.name, c.name):
                    # read-after-write across iterations (a self-loop for the train call itself)
                    ahead = self.max_staleness if c.kind == CallKind.GENERATE else 0
                    g.add_edge(t.name, c.name, kind="param", keys=[], lag=1 + ahead)
        return g

    @cached_property
    def order(self) -> tuple[str, ...]:
        """A deterministic topological order of the calls (lag-0 edges), ties by listing order."""
        index = {c.name: i for i, c in enumerate(self.calls)}
        dag = nx.DiGraph((u, v) for u, v, d in self.graph.edges(data=True) if d["lag"] == 0)
        dag.add_nodes_from(index)
        return tuple(nx.lexicographical_topological_sort(dag, key=index.__getitem__))

    def with_lengths(self, generate: str, lengths: Optional[LengthDistribution]) -> "Dataflow":
        """The dataflow with the response lengths of generation call `generate` set to `lengths`
        (None: every response at the cap), on it and on the calls that process its sequences (its
        first output) at its width."""
        gen = self.call(generate)
        seqs = gen.outputs[0] if gen.outputs else None
        calls = tuple(c.model_copy(update={"lengths": lengths})
                      if c.name == generate or (seqs in c.inputs and c.kind in (CallKind.INFERENCE, CallKind.TRAIN)
                                                and c.seq_len == gen.seq_len) else c for c in self.calls)
        return self.with_calls(calls)

    def with_calls(self, calls) -> "Dataflow":
        """The same dataflow (name, dataset keys, staleness) with other calls, validated."""
        return Dataflow(name=self.name, calls=tuple(calls), dataset_keys=self.dataset_keys,
                        max_staleness=self.max_staleness)

    def call(self, name: str) -> CallDef:
        for c in self.calls:
            if c.name == name:
                return c
        raise ConfigError(f"unknown call {name!r} (calls: {', '.join(self.call_names)})")

    @property
    def call_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.calls)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.model for c in self.calls))

    @property
    def trained_models(self) -> frozenset[str]:
        return frozenset(c.model for c in self.calls if c.kind == CallKind.TRAIN)

    @property
    def input_keys(self) -> tuple[str, ...]:
        """Keys consumed but produced by no call: they come from the dataset."""
        produced = {k for c in self.calls for k in c.outputs}
        return tuple(dict.fromkeys(k for c in self.calls for k in c.inputs if k not in produced))

    def predecessors(self, name: str, lag: int = 0) -> list[tuple[str, str]]:
        """(predecessor call, edge kind) pairs of `name` at the given lag."""
        return [(u, d["kind"]) for u, _, d in self.graph.in_edges(name, data=True) if d["lag"] == lag]


def load_dataflow(data: dict) -> Dataflow:
    """A Dataflow from parsed YAML/JSON; errors name the field."""
    from realbench.schema import validate_model

    return validate_model(Dataflow, data)
