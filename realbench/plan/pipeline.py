"""The pipeline schedule of a call: Megatron's 1F1B, plain and interleaved. The runtime walks it
(realbench.runtime.engine) and the cost model charges the activations it holds
(realbench.cost.calls); both read it from here, so a plan holds what it was priced for.

Plain 1F1B (Narayanan et al. 2021; Megatron's forward_backward_pipelining_without_interleaving),
stage s of pp with m micro-batches:
    warm-up    w = min(pp - s - 1, m) forwards
    steady     m - w pairs: the next forward, then the oldest backward
    cool-down  the w backwards left
Stage s holds the activations of at most w + 1 = min(pp - s, m) micro-batches at once (the
first stage min(pp, m)), where GPipe (every forward, then every backward) holds all m.

Interleaved 1F1B (v virtual stages: the rank holds v chunks of layers, chunk k being virtual
stage s + k pp; Megatron's forward_backward_pipelining_with_interleaving): the m v
(micro-batch, chunk) items run in groups of pp micro-batches, chunk by chunk (forward chunks
0..v-1, backward v-1..0), with
    warm-up    w = min(2 (pp - s - 1) + (v - 1) pp, m v) forwards (all m v when m = pp)
then steady pairs and cool-down as above. A chunk holds 1 / v of the stage's layers, so the
first stage holds min(2 (pp - 1) + (v - 1) pp + 1, m v) / v stage-loads of activations:
pp + (pp - 1) / v once m >= 2 pp, which is pp (1 + (pp - 1) / (pp v)) (Korthikanti et al. 2022,
section 4.2.3), and m at m = pp. Megatron needs m to be a multiple of pp (so do plans:
realbench.plan.options).

Messages (`stage_program`): a stage's program interleaves its passes with exchanges, each one
batch of point-to-point operations with its neighbours, placed and filled as Megatron places its
send/receive calls (send_forward_recv_backward, send_backward_recv_forward, and in the
interleaved schedule one send_forward_backward_recv_forward_backward per steady pair, receiving
ahead what the next passes need). Each stage receives its inputs in the order its neighbour
sends them, so every receive knows which (micro-batch, chunk) it is for (and so its shape).
Sends in a batch with receives are how NCCL runs them without a deadlock; the tests replay every
program under NCCL's rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

FORWARD, BACKWARD, EXCHANGE = "forward", "backward", "exchange"
ACTIVATION, GRADIENT = "activation", "gradient"

Item = tuple[int, int]  # (micro-batch, chunk)


@dataclass(frozen=True)
class Step:
    """A pass (FORWARD / BACKWARD of `item`) or an EXCHANGE: `sends` and `recvs` of
    (ACTIVATION or GRADIENT, item). An activation goes from item's chunk to the next virtual
    stage (forward), a gradient from its input to the previous one (backward); a receive names
    the item that will use what arrives: its input (ACTIVATION) or its output's gradient."""

    kind: str
    item: Item = (-1, -1)
    sends: tuple[tuple[str, Item], ...] = ()
    recvs: tuple[tuple[str, Item], ...] = ()


def forward_order(micro_batches: int, pp: int, v: int = 1) -> list[Item]:
    """The (micro-batch, chunk) items in the order every stage runs their forwards: with v
    virtual stages, groups of pp micro-batches chunk by chunk."""
    if v == 1:
        return [(i, 0) for i in range(micro_batches)]
    _check_groups(micro_batches, pp)
    return [(g + i, k) for g in range(0, micro_batches, pp) for k in range(v) for i in range(pp)]


def backward_order(micro_batches: int, pp: int, v: int = 1) -> list[Item]:
    """The items in the order every stage runs their backwards: the forward order with each
    group's chunks reversed (a micro-batch's last chunk comes back first)."""
    if v == 1:
        return [(i, 0) for i in range(micro_batches)]
    _check_groups(micro_batches, pp)
    return [(g + i, v - 1 - k) for g in range(0, micro_batches, pp) for k in range(v) for i in range(pp)]


def warmup_forwards(micro_batches: int, pp: int, stage: int, v: int = 1) -> int:
    """Forwards stage `stage` runs before its first backward (module doc)."""
    if v == 1:
        return min(pp - stage - 1, micro_batches)
    if micro_batches == pp:  # Megatron: every forward, then every backward
        return micro_batches * v
    return min(2 * (pp - stage - 1) + (v - 1) * pp, micro_batches * v)


def activations_in_flight(micro_batches: int, pp: int, v: int = 1, stage: int = 0) -> float:
    """The most micro-batches whose activations stage `stage` holds at once under 1F1B, in
    loads of the whole stage's layers (an item of one chunk is 1 / v of one): min(pp - s, m)
    plain, min(w + 1, m v) / v interleaved (module doc). The cost model charges the first
    stage's."""
    return min(warmup_forwards(micro_batches, pp, stage, v) + 1, micro_batches * v) / v


@lru_cache(maxsize=1024)
def one_f_one_b(micro_batches: int, pp: int, stage: int, v: int = 1) -> tuple[tuple[str, int, int], ...]:
    """Stage `stage`'s passes in order: (FORWARD or BACKWARD, micro-batch, chunk)."""
    return tuple((s.kind, *s.item) for s in stage_program(micro_batches, pp, stage, v) if s.kind != EXCHANGE)


@lru_cache(maxsize=1024)
def stage_program(micro_batches: int, pp: int, stage: int, v: int = 1, forward_only: bool = False) -> tuple[Step, ...]:
    """Stage `stage`'s passes and exchanges in order (module doc); `forward_only`: the forwards
    alone (an inference call), each followed by its send."""
    if not 0 <= stage < pp or micro_batches < 1 or v < 1:
        raise ValueError(f"stage {stage} of pp {pp}, {micro_batches} micro-batches, v {v}")
    return tuple(_Program(micro_batches, pp, stage, v).build(forward_only))


class _Program:
    """Megatron's send/receive calls, transcribed (module doc); a receive takes the next item
    whose input (or output gradient) comes from that neighbour, in the order the neighbour
    sends them."""

    def __init__(self, m: int, pp: int, stage: int, v: int):
        self.m, self.pp, self.stage, self.v = m, pp, stage, v
        self.first, self.last = stage == 0, stage == pp - 1
        self.forwards, self.backwards = forward_order(m, pp, v), backward_order(m, pp, v)
        self.inputs = iter([it for it in self.forwards if self.has_source(it)])
        self.grads = iter([it for it in self.backwards if self.has_target(it)])
        self.steps: list[Step] = []

    def has_source(self, item: Item) -> bool:
        return not (self.first and item[1] == 0)

    def has_target(self, item: Item) -> bool:
        return not (self.last and item[1] == self.v - 1)

    def chunk(self, index: int, forward: bool) -> int:
        """Megatron's get_model_chunk_id: the chunk of the index-th forward (or backward),
        indices taken modulo a group (negative ones too)."""
        k = (index % (self.pp * self.v)) // self.pp
        return k if forward else self.v - 1 - k

    def exchange(self, activation: Item | None = None, gradient: Item | None = None,
                 recv_activation: bool = False, recv_gradient: bool = False) -> None:
        sends = []
        if activation is not None and self.has_target(activation):
            sends.append((ACTIVATION, activation))
        if gradient is not None and self.has_source(gradient):
            sends.append((GRADIENT, gradient))
        recvs = []
        if recv_activation:
            recvs.append((ACTIVATION, next(self.inputs)))
        if recv_gradient:
            recvs.append((GRADIENT, next(self.grads)))
        if sends or recvs:
            self.steps.append(Step(EXCHANGE, sends=tuple(sends), recvs=tuple(recvs)))

    def run(self, kind: str, item: Item) -> None:
        self.steps.append(Step(kind, item))

    def build(self, forward_only: bool) -> list[Step]:
        if forward_only:
            self.grads = iter(())  # no backward: no gradient comes back
        if forward_only and self.v == 1:  # recv_forward, forward, send_forward
            for item in self.forwards:
                self.exchange(recv_activation=not self.first)
                self.run(FORWARD, item)
                self.exchange(activation=item)
        elif self.v == 1:
            self._plain()
        else:
            self._interleaved(forward_only)
        assert next(self.inputs, None) is None and next(self.grads, None) is None, "a message nobody receives"
        return self.steps

    def _plain(self) -> None:
        """forward_backward_pipelining_without_interleaving."""
        fwd, bwd, first, last = self.forwards, self.backwards, self.first, self.last
        w = warmup_forwards(self.m, self.pp, self.stage)
        r = self.m - w
        for i in range(w):
            self.exchange(recv_activation=not first)  # recv_forward
            self.run(FORWARD, fwd[i])
            self.exchange(activation=fwd[i])  # send_forward
        if r:
            self.exchange(recv_activation=not first)
        for j in range(r):
            self.run(FORWARD, fwd[w + j])
            self.exchange(activation=fwd[w + j], recv_gradient=not last)  # send_forward_recv_backward
            self.run(BACKWARD, bwd[j])
            # send_backward (last iteration) or send_backward_recv_forward
            self.exchange(gradient=bwd[j], recv_activation=j < r - 1 and not first)
        for j in range(r, self.m):
            self.exchange(recv_gradient=not last)  # recv_backward
            self.run(BACKWARD, bwd[j])
            self.exchange(gradient=bwd[j])  # send_backward

    def _interleaved(self, forward_only: bool) -> None:
        """forward_backward_pipelining_with_interleaving (without overlapped communication);
        forward only, every forward is a warm-up one (a send batched with the next receive: the
        wrap from the last stage to the first closes a ring)."""
        fwd, bwd, first, last, pp, v = self.forwards, self.backwards, self.first, self.last, self.pp, self.v
        total = len(fwd)
        all_warmup = self.m == pp or forward_only
        w = total if forward_only else warmup_forwards(self.m, pp, self.stage, v)
        r = total - w
        self.exchange(recv_activation=not first)  # recv_forward of chunk 0
        for k in range(w):
            self.run(FORWARD, fwd[k])
            recv_prev = not (first and self.chunk(k + 1, True) == 0) and k != total - 1
            if k == w - 1 and not all_warmup:
                self.exchange(activation=fwd[k], recv_activation=recv_prev, recv_gradient=not last)
            else:
                self.exchange(activation=fwd[k], recv_activation=recv_prev)
        if forward_only:
            return
        for k in range(r):
            f = k + w
            self.run(FORWARD, fwd[f])
            self.run(BACKWARD, bwd[k])
            # the first stage is ahead of the last by pp - 1 forwards: what wraps round to it now
            # is the output of the last stage's forward f - (pp - 1), unless that was a last chunk
            recv_prev = self.chunk(f - (pp - 1), True) != v - 1 if first else True
            recv_next = self.chunk(k - (pp - 1), False) != 0 if last else True
            if k == r - 1:
                recv_prev = False
            self.exchange(activation=fwd[f], gradient=bwd[k], recv_activation=recv_prev, recv_gradient=recv_next)
        if all_warmup:
            self.exchange(recv_gradient=not last)  # recv_backward of the last chunk
        for k in range(r, total):
            self.run(BACKWARD, bwd[k])
            recv_next = not (last and self.chunk(k + 1, False) == v - 1) and k != total - 1
            self.exchange(gradient=bwd[k], recv_gradient=recv_next)


def _check_groups(micro_batches: int, pp: int) -> None:
    if micro_batches % pp:
        raise ValueError(f"the interleaved schedule runs micro-batches in groups of pp = {pp}: "
                         f"{micro_batches} micro-batches is not a multiple of it")
