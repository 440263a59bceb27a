"""The rollout engine: continuous batching over a preallocated KV cache (generation layouts
without pipeline parallelism; a pipeline decodes micro-batch by micro-batch, `engine.generate`).

A replica queues every sequence of its share and decodes them in a fixed number of slots:

    while sequences are queued or a slot holds one:
        every sync_every-th step (or when every slot is free): read back which slots ended, and
        the free slots take the next queued prompts: one batched prefill writes their keys and
        values and samples their first tokens
        one decode step of every slot (fixed shape: slots x 1 token)

so a step's generation takes about (the replica's tokens / slots) decode steps plus one tail,
where micro-batched decoding keeps every micro-batch until its longest row ends
(realbench.cost.calls prices both; `continuous_makespan` is the formula).

The cache: fixed slots, `slots x (prompt width + gen_len)` positions per layer, allocated once
and written in place (a row's keys go to its slot at its position; a new prompt overwrites the
slot from position 0). Chosen over paged blocks because RLHF knows each call's widest row in
advance (the prompt width and max_new_tokens), so a slot never outgrows its block and there is
nothing to page, no block table to gather through in attention, and the shapes stay fixed for a
CUDA graph; the price is memory for every slot at the cap, which is what the cost model charges
(a paged cache must hold the same when every slot runs long, or preempt).

The device runs ahead of the host: a decode step's inputs and outputs stay on the device (the
last token, each slot's position, row and token count, the output row it writes to), a row that
ends (an end-of-sequence token, or its own limit) switches its slot's writes to a scratch row
on the device, and the host reads the slots' `ended` flags back once every `sync_every` steps
(`host_reads` counts the reads of the loop). Limits the host knows (gen_len, per-row limits) it
tracks itself, without a read. Freed slots are refilled at those steps too, together: one
prefill for the rows that ended since the last (a prefill costs a decode step's overheads and
more, so batching them pays for a slot's wait of sync_every / 2 steps on average). Sampling draws each
row's token t from `row_uniforms(key, row, t)`, so slots, plans and refill order do not change
the samples: the rows come out as `engine.generate` makes them.

On a GPU the decode step is a CUDA graph (`DecodeGraphs`): with graphs, attention reads every
slot's whole width (masked past its position) rather than a window that grows with the rows, so
a step's shapes depend on the number of slots computed alone, and each such number is captured
once and replayed: one launch per decode step instead of one per kernel (hundreds per step for
a 16-layer model, which left the GPU waiting on Python). Graphs need one device per replica
(tensor parallelism's collectives inside a capture are not run here): other layouts decode eagerly.
With `compiled` (`realbench run --compile-decode`), the model's forward in the steps of every slot
goes through torch.compile before its capture: inductor fuses each layer's element-wise kernels
(norms, rotary, SiLU and products, residual adds, cache writes), which inside a graph still cost
a few microseconds each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from realbench.runtime.engine import PlacedModel, generate, sample_tokens

WINDOW = 32  # attention reads the cache up to the furthest slot's position, rounded up to this
# shapes one module's forward may compile in a process (torch's default, 8, fails a fullgraph
# compile past it: a run that re-plans, or a profile's grid, meets more slot counts than that)
COMPILED_SHAPES = 64


def compile_static(module, backend: str = "inductor"):
    """`module` through torch.compile, whole (fullgraph) and specialised to each shape it meets,
    allowed COMPILED_SHAPES of them (the limit raised for these calls only)."""
    import torch._dynamo

    fn = torch.compile(module, fullgraph=True, dynamic=False, backend=backend)

    def call(*args, **kwargs):
        with torch._dynamo.config.patch(recompile_limit=COMPILED_SHAPES):
            return fn(*args, **kwargs)
    return call


def warm_up(step) -> None:
    """Run `step` once on a side stream: lazy initialisation (cuBLAS's workspace, say) must not
    happen inside a capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)


def capture(step, pool=None) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of `step` (capturing runs nothing), after `warm_up`. Only this thread's work
    is held to the capture's rules: another thread's (an asynchronous plan's) goes on."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        step()
    return graph


class DecodeGraphs:
    """Runs a decode step by its shape `key`: the first step of a shape eagerly (`warm_up`), the
    second captured into a CUDA graph and replayed, every later one replayed. The step reads and
    writes only tensors that live as long as the engine (the cache, the slots' state, the
    outputs), so a replay does what the captured step did, on the current values. The graphs
    share one memory pool: they run one after another on one stream."""

    def __init__(self):
        self.graphs: dict = {}
        self.warm: set = set()
        self.pool = None

    def run(self, key, step) -> None:
        graph = self.graphs.get(key)
        if graph is None and key not in self.warm:
            self.warm.add(key)
            warm_up(step)
            return
        if graph is None:
            graph = self.graphs[key] = capture(step, self.pool)
            self.pool = graph.pool()
        graph.replay()


class EagerSteps:
    """`DecodeGraphs`' interface without a GPU: runs each step as it comes (fixed shapes: compiled
    steps use it there), and records each step's shape key (what the tests check: a key fixes
    every shape a step computes)."""

    def __init__(self):
        self.keys: list = []

    def run(self, key, step) -> None:
        self.keys.append(key)
        step()


class SlotCache:
    """Every layer's keys and values for `slots` sequences of up to `width` positions."""

    def __init__(self, stage, slots: int, width: int):
        """`stage`: the replica's LlamaStage (its layers, shard and device)."""
        spec = stage.spec
        shape = (slots, spec.n_kv_heads // stage.tp, width, spec.head_dim)
        dev, dtype = stage.flat.device, stage.flat.dtype
        self.keys = {name: torch.zeros(shape, device=dev, dtype=dtype) for name in stage.layers}
        self.values = {name: torch.zeros(shape, device=dev, dtype=dtype) for name in stage.layers}
        self.slots, self.width = slots, width
        self.every = torch.arange(slots, device=dev)
        self.positions = torch.zeros(slots, dtype=torch.long, device=dev)  # where each slot writes next
        self.prefill: Optional[torch.Tensor] = None  # the slots a prefill writes (from position 0)
        self.window, self.mask = width, None

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in (self.keys, self.values) for t in d.values())

    def layer(self, name: str) -> "_LayerCache":
        return _LayerCache(self, name)

    def decoding(self, window: int, active: int) -> None:
        """The next forward is a decode step of the first `active` slots attending to the first
        `window` positions."""
        self.prefill, self.window, self.active = None, window, active
        keys = torch.arange(window, device=self.positions.device)
        self.mask = (keys[None, :] <= self.positions[:active, None])[:, None, None, :]  # (active, 1, 1, window)


@dataclass
class _LayerCache:
    cache: SlotCache
    name: str

    def attend(self, k: torch.Tensor, v: torch.Tensor):
        """Write this forward's keys and values; return what the queries attend to and the mask."""
        c, keys, values = self.cache, self.cache.keys[self.name], self.cache.values[self.name]
        if c.prefill is not None:  # right-padded prompts from position 0: causal over themselves
            keys[c.prefill, :, :k.shape[2]] = k
            values[c.prefill, :, :k.shape[2]] = v
            return k, v, None
        n = c.active
        keys[c.every[:n], :, c.positions[:n]] = k[:, :, 0]
        values[c.every[:n], :, c.positions[:n]] = v[:, :, 0]
        return keys[:n, :, :c.window], values[:n, :, :c.window], c.mask


@dataclass
class SlotTimeline:
    """What the slots held, step by step: for the timeline and the tests."""
    busy: list[int] = field(default_factory=list)  # slots holding a row at each decode step
    computed: list[int] = field(default_factory=list)  # slots the step computed (a power of two)
    moves: int = 0  # rows moved to lower slots in the tail
    prefills: list[tuple[int, int]] = field(default_factory=list)  # (decode step, rows prefilled)
    # how the decode steps ran: "eager" (the window grows), "fixed-shape" or "cuda graphs", each
    # possibly "compiled ..." (the steps of every slot)
    decode: str = ""


class RolloutEngine:
    """Continuous batching for one replica (every tensor-parallel rank runs the same schedule:
    the tokens, gathered, are the same on each). Interface: `queue` the rows, `step` until
    `finished`, read `sequences` and `logprobs` (the layout of `engine.generate`'s result)."""

    def __init__(self, model: PlacedModel, prompts: torch.Tensor, gen_len: int, slots: int, key: int = 0,
                 rows: Optional[torch.Tensor] = None, greedy: bool = False, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, eos: Optional[int | Sequence[int]] = None,
                 limits: Optional[Sequence[int]] = None, sync_every: int = 1,
                 graphs: Optional[DecodeGraphs | EagerSteps | bool] = None, compiled: bool | str = False):
        """`graphs`: how decode steps run: None picks CUDA graphs on a GPU replica of one device
        and plain eager steps elsewhere; False eager steps with the growing window; a
        `DecodeGraphs` or `EagerSteps` (the tests') runs fixed-shape steps through it.
        `compiled`: the model's forward in the step of every slot (the steps before the tail)
        through torch.compile (True: inductor; a string names another backend), which fuses a
        layer's element-wise kernels; fixed-shape steps then (`EagerSteps` where there are no
        graphs). Sampling stays eager (inductor's scan of the float64 cumulative sum fails on a GPU)."""
        if model.layout.dims.pp != 1:
            raise ValueError("continuous batching runs generation layouts without pipeline parallelism")
        if slots < 1 or sync_every < 1:
            raise ValueError(f"slots {slots} and sync_every {sync_every} must be at least 1")
        B, P = prompts.shape
        dev = self.device = model.device
        self.model, self.gen_len, self.key, self.P = model, gen_len, key, P
        self.sampling = (greedy, temperature, top_k, top_p)
        self.sync_every = sync_every
        if graphs is None:
            graphs = model.device.type == "cuda" and model.layout.dims.tp == 1
        self.graphs = DecodeGraphs() if graphs is True else graphs or None
        if compiled and self.graphs is None:
            self.graphs = EagerSteps()
        self.slots = min(slots, B) if B else 1
        self.cache = SlotCache(model.stage, self.slots, P + gen_len)
        self.stops = None if eos is None else torch.tensor([eos] if isinstance(eos, int) else list(eos), device=dev)
        self.global_rows = (torch.arange(B) if rows is None else rows.cpu()).to(dev)
        # outputs, plus a scratch row (index B) that the slots of ended rows write to
        self.seqs = torch.full((B + 1, P + gen_len), -1, dtype=torch.long, device=dev)
        self.seqs[:B, :P] = prompts
        self.lps = torch.zeros(B + 1, gen_len, device=dev)
        # the host's own knowledge: prompts' lengths (read once, before the loop) and limits
        prompts_host = prompts.cpu()
        self.prompt_lens = (prompts_host >= 0).sum(1).tolist()
        self.prompts_host = prompts_host
        self.limits = [gen_len] * B if limits is None else [min(int(n), gen_len) for n in limits]
        self.queue = list(range(B))[::-1]  # popped from the end: row 0 first
        # per slot, on the device: the row it writes (B: none), its token count, limit, last token, ended
        S = self.slots
        self.dest = torch.full((S,), B, dtype=torch.long, device=dev)
        self.count = torch.zeros(S, dtype=torch.long, device=dev)
        self.limit = torch.ones(S, dtype=torch.long, device=dev)
        self.last = torch.zeros(S, dtype=torch.long, device=dev)
        self.ended = torch.ones(S, dtype=torch.bool, device=dev)
        self.slot_rows = torch.zeros(S, dtype=torch.long, device=dev)  # global row ids, for the draws
        # per slot, on the host: the local row (None: free), tokens so far, next position
        self.holds: list[Optional[int]] = [None] * S
        self.count_host, self.pos_host = [0] * S, [0] * S
        self.steps, self.host_reads = 0, 0
        self.timeline = SlotTimeline()
        # one shape compiled: the tail's fewer slots would each compile again, for a few steps
        self.full_forward = model.stage if not compiled else compile_static(
            model.stage, "inductor" if compiled is True else compiled)
        how = "cuda graphs" if isinstance(self.graphs, DecodeGraphs) else "fixed-shape" if self.graphs else "eager"
        self.timeline.decode = f"compiled {how}" if compiled else how

    # -- host <-> device ------------------------------------------------------------------------------
    def _read(self, t: torch.Tensor) -> list:
        """The one way the loop reads a device value (counted: a read makes the host wait)."""
        self.host_reads += 1
        return t.tolist()

    @property
    def finished(self) -> bool:
        return not self.queue and all(h is None for h in self.holds)

    def run(self) -> tuple[torch.Tensor, torch.Tensor]:
        while not self.finished:
            self.step()
        return self.sequences, self.logprobs

    @property
    def sequences(self) -> torch.Tensor:
        return self.seqs[:-1]

    @property
    def logprobs(self) -> torch.Tensor:
        return self.lps[:-1]

    # -- the loop -------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        """Every sync_every-th step: free the slots known to have ended and refill them from the
        queue (the slots freed since the last such step in one prefill); then one decode step."""
        held = [s for s, h in enumerate(self.holds) if h is not None]
        sync = self.steps % self.sync_every == 0
        if self.stops is not None and held and sync:
            ended = self._read(self.ended)
            for s in held:
                if ended[s]:
                    self.holds[s] = None
        free = [s for s, h in enumerate(self.holds) if h is None]
        if free and self.queue and (sync or len(free) == self.slots):
            self._prefill(free[:len(self.queue)])
        if all(h is None for h in self.holds):
            return
        if not self.queue:
            self._compact()
        self._decode()

    def _compact(self) -> None:
        """The tail (nothing queued): move the rows held above the power of two that fits them
        into free slots below it, so the steps compute that many slots. Each row moves at most
        log2(slots) times a call, and only in the tail; refills never move anything."""
        held = [s for s, h in enumerate(self.holds) if h is not None]
        fits = 1 << (len(held) - 1).bit_length()
        movers = [s for s in held if s >= fits]
        if not movers:
            return
        free = [s for s in range(fits) if self.holds[s] is None]
        src = torch.tensor(movers, device=self.device)
        dst = torch.tensor(free[:len(movers)], device=self.device)
        window = min(self.cache.width, max(self.pos_host[s] for s in movers) + 1)
        for table in (self.cache.keys, self.cache.values):
            for t in table.values():
                t[dst, :, :window] = t[src, :, :window]
        for t in (self.cache.positions, self.count, self.limit, self.last, self.ended, self.dest, self.slot_rows):
            t[dst] = t[src]
        for a, b in zip(movers, free):
            self.holds[b], self.count_host[b], self.pos_host[b] = self.holds[a], self.count_host[a], self.pos_host[a]
            self.holds[a] = None
        self.timeline.moves += len(movers)

    def _prefill(self, slots: list[int]) -> None:
        """Put the next queued rows in `slots`: their prompts (left padding removed, right-padded
        to the longest) through the model in one batch, keys and values written at positions
        0.. of the slots, and token 0 sampled from each prompt's last position."""
        rows = [self.queue.pop() for _ in slots]
        lens = [self.prompt_lens[r] for r in rows]
        width = max(lens)
        tokens = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            tokens[i, :lens[i]] = self.prompts_host[r, self.P - lens[i]:]
        dev = self.device
        index = torch.tensor(slots, device=dev)
        rows_dev = torch.tensor(rows, device=dev)
        lens_dev = torch.tensor(lens, device=dev)
        self.cache.prefill = index
        logits = self.model.stage(tokens.to(dev), torch.arange(width, device=dev), self.cache, last_only=lens_dev - 1)
        self.cache.prefill = None
        global_rows = self.global_rows[rows_dev]
        token, chosen = sample_tokens(logits[:, -1], global_rows, 0, self.key, *self.sampling)
        self.seqs[rows_dev, self.P] = token
        self.lps[rows_dev, 0] = chosen
        limits = torch.tensor([self.limits[r] for r in rows], device=dev)
        ended = limits <= 1
        if self.stops is not None:
            ended |= (token[:, None] == self.stops).any(-1)
        self.cache.positions[index] = lens_dev
        self.slot_rows[index], self.last[index], self.limit[index] = global_rows, token, limits
        self.count[index] = 1
        self.ended[index] = ended
        self.dest[index] = torch.where(ended, len(self.seqs) - 1, rows_dev)
        for s, r, n in zip(slots, rows, lens):
            self.holds[s], self.count_host[s], self.pos_host[s] = r, 1, n
            if self.limits[r] <= 1:
                self.holds[s] = None
        self.timeline.prefills.append((self.steps, len(rows)))

    def _decode(self) -> None:
        """One token for every slot; only device work, and the host's bookkeeping of what it knows."""
        c = self.cache
        held = [s for s, h in enumerate(self.holds) if h is not None]
        # the slots up to the last one held, in a power of two (a few shapes, each a CUDA graph's):
        # once the queue is empty, the tail computes fewer and fewer (_compact)
        n = min(self.slots, 1 << held[-1].bit_length())
        if self.graphs is None:
            self._decode_step(n, min(c.width, math.ceil((max(self.pos_host[s] for s in held) + 1) / WINDOW) * WINDOW))
        else:
            self.graphs.run(n, lambda: self._decode_step(n, c.width))
        self.timeline.busy.append(len(held))
        self.timeline.computed.append(n)
        self.steps += 1
        for s in range(n):
            r = self.holds[s]
            self.count_host[s] += 1
            self.pos_host[s] = min(self.pos_host[s] + 1, c.width - 1)
            if r is not None and self.count_host[s] >= self.limits[r]:
                self.holds[s] = None  # its limit: the host knows without a read

    def _decode_step(self, n: int, window: int) -> None:
        """The device's part of a decode step of the first `n` slots attending to `window`
        positions: reads and writes the engine's own tensors only (a CUDA graph replays it)."""
        c = self.cache
        c.decoding(window, n)
        last, count, dest, ended = self.last[:n], self.count[:n], self.dest[:n], self.ended[:n]
        forward = self.full_forward if n == self.slots else self.model.stage
        logits = forward(last[:, None], c.positions[:n, None], c, last_only=True)
        token, chosen = sample_tokens(logits[:, -1], self.slot_rows[:n], count, self.key, *self.sampling)
        column = count.clamp(max=self.gen_len - 1)  # the scratch row takes any count
        self.seqs[dest, self.P + column] = token
        self.lps[dest, column] = chosen
        count += 1
        now = ended | (count >= self.limit[:n])
        if self.stops is not None:
            now |= (token[:, None] == self.stops).any(-1)  # not isin: its sorting path syncs (no graph)
        ended.copy_(now)
        dest.copy_(torch.where(now, len(self.seqs) - 1, dest))
        last.copy_(token)
        c.positions[:n] = (c.positions[:n] + 1).clamp(max=c.width - 1)


def generate_continuous(model: PlacedModel, prompts: torch.Tensor, gen_len: int, slots: int, **kwargs
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """`engine.generate`'s result (sequences, log-probabilities) by continuous batching."""
    return RolloutEngine(model, prompts, gen_len, slots, **kwargs).run()


def rollout(model: PlacedModel, prompts: torch.Tensor, gen_len: int, micro_batches: int = 1, sync_every: int = 1,
            timeline: Optional[SlotTimeline] = None, compiled: bool = False, **sampling
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """A generation call's rows as the runtime makes them: continuous batching in
    ceil(rows / micro_batches) slots without pipeline parallelism, the micro-batched pipeline
    loop (`engine.generate`) with it. `sampling`: key, rows, greedy, temperature, top_k, top_p,
    eos. `timeline`, where given, receives the slots' (continuous batching); `compiled`: the
    engine's decode steps through torch.compile (pipelines decode eagerly whatever it says)."""
    if model.layout.dims.pp > 1:
        return generate(model, prompts, gen_len, micro_batches=micro_batches, **sampling)
    engine = RolloutEngine(model, prompts, gen_len, max(1, math.ceil(len(prompts) / micro_batches)),
                           sync_every=sync_every, compiled=compiled, **sampling)
    out = engine.run()
    if timeline is not None:
        timeline.busy, timeline.prefills, timeline.decode = (engine.timeline.busy, engine.timeline.prefills,
                                                             engine.timeline.decode)
    return out
