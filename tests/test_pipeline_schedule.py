"""The pipeline schedule (realbench.plan.pipeline): Megatron's 1F1B order, plain and interleaved;
every stage program's messages replayed under NCCL's rules; and, on 4 processes, the bytes of
activations each stage holds at once, counted by saved-tensor hooks, against the micro-batches
the cost model charges."""

import random

import pytest
import torch

from nccl_order import Entry, Op, replay
from realbench.plan.pipeline import (ACTIVATION, BACKWARD, EXCHANGE, FORWARD, GRADIENT, activations_in_flight,
                                     one_f_one_b, stage_program)


def passes(program) -> str:
    return " ".join(f"{kind[0].upper()}{i}" + (f".{k}" if k else "") for kind, i, k in program)


def test_the_passes_run_in_megatrons_1f1b_order():
    # plain, 4 stages, 6 micro-batches: stage 0 warms up with 3 forwards, stage 3 with none
    assert passes(one_f_one_b(6, 4, 0)) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"
    assert passes(one_f_one_b(6, 4, 3)) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"
    assert passes(one_f_one_b(2, 4, 0)) == "F0 F1 B0 B1"  # fewer micro-batches than stages
    # interleaved, 2 stages of 2 chunks, 4 micro-batches: groups of pp = 2 micro-batches chunk by
    # chunk; stage 0 warms up with 2 (pp - 1) + (v - 1) pp = 4 forwards, stage 1 with 2
    assert passes(one_f_one_b(4, 2, 0, 2)) == "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3"
    assert passes(one_f_one_b(4, 2, 1, 2)) == "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3"
    # m = pp: every forward, then every backward (Megatron)
    assert passes(one_f_one_b(2, 2, 1, 2)) == "F0 F1 F0.1 F1.1 B0.1 B1.1 B0 B1"
    with pytest.raises(ValueError, match="groups of pp = 2: 3 micro-batches"):
        one_f_one_b(3, 2, 0, 2)


def test_the_activations_in_flight_are_the_programs_peak():
    """The cost model's count (stage 0: min(m, pp); pp + (pp - 1) / v interleaved once m >= 2 pp)
    is the most items a program holds between their forward and backward, over v."""
    assert activations_in_flight(8, 4) == 4 and activations_in_flight(2, 4) == 2 and activations_in_flight(8, 4, 1, 3) == 1
    assert activations_in_flight(8, 4, 2) == 4 + 3 / 2 and activations_in_flight(4, 4, 2) == 4
    for pp in range(1, 7):
        for v in range(1, 4) if pp > 1 else (1,):
            for m in range(1, 4 * pp + 1):
                if v > 1 and m % pp:
                    continue
                for stage in range(pp):
                    held = peak = 0
                    for kind, _, _ in one_f_one_b(m, pp, stage, v):
                        held += 1 if kind == FORWARD else -1
                        peak = max(peak, held)
                    assert held == 0 and peak / v == activations_in_flight(m, pp, v, stage), (m, pp, v, stage)


def _traces(m: int, pp: int, v: int, forward_only: bool) -> list[list[Entry]]:
    """Each stage's exchanges as the recorder would see them (one batch on the world group, waited
    before the next), every message sized by the item that uses it, so that a message received
    as another item's mismatches; and a check that each pass has what it uses."""
    def size(kind, item):
        return 1 + item[0] * 16 + item[1] * 4 + (kind == GRADIENT)

    traces = []
    for stage in range(pp):
        entries, have = [], set()
        for step in stage_program(m, pp, stage, v, forward_only):
            if step.kind != EXCHANGE:
                i, k = step.item
                if step.kind == FORWARD and not (stage == 0 and k == 0):
                    assert (ACTIVATION, step.item) in have, (m, pp, v, stage, step)
                if step.kind == BACKWARD and not (stage == pp - 1 and k == v - 1):
                    assert (GRADIENT, step.item) in have, (m, pp, v, stage, step)
                continue
            ops = []
            for kind, (i, k) in step.sends:  # named by the producing item: the consumer's name
                if kind == ACTIVATION:
                    peer, used = (stage + 1) % pp, (i, k + 1) if stage == pp - 1 else (i, k)
                else:
                    peer, used = (stage - 1) % pp, (i, k - 1) if stage == 0 else (i, k)
                ops.append(Op("send", peer, size(kind, used), "f32"))
            for kind, item in step.recvs:
                peer = (stage - 1) % pp if kind == ACTIVATION else (stage + 1) % pp
                ops.append(Op("recv", peer, size(kind, item), "f32"))
                have.add((kind, item))
            n = len(entries)
            entries.append(Entry(n, ("world", "all"), tuple(range(pp)), tuple(ops), tuple(range(n))))
        traces.append(entries)
    return traces


def test_every_stage_programs_messages_replay_without_a_hang_on_nccl():
    """pp 2 to 6, v 1 to 4, every micro-batch count up to 3 pp (multiples of pp interleaved), train
    and forward only: the messages match in order and size, and replay under NCCL's rules."""
    replayed = 0
    for pp in range(2, 7):
        for v in range(1, 5):
            for m in range(1, 3 * pp + 1):
                if v > 1 and m % pp:
                    continue
                for forward_only in (False, True):
                    traces = _traces(m, pp, v, forward_only)
                    assert replay(traces) == sum(map(len, traces)) > 0, (m, pp, v, forward_only)
                    replayed += 1
    assert replayed > 200


# -- what a stage holds, measured ---------------------------------------------------------------------
def _held_worker(rank, world, spec, cases):
    """For each (layout, micro-batches) case: on this rank, the most bytes of the blocks' saved
    activations alive at once during forward_backward (saved-tensor hooks; a storage counted once
    while any saved tensor uses it; the weights, views of the flat buffer, left out), the bytes one
    pass of one micro-batch saves, and what is left after the call (0)."""
    import weakref

    from realbench.runtime import model as model_module
    from test_runtime_core import _on_each_layout

    state = {"alive": 0, "peak": 0, "weights": 0}
    users: dict[int, int] = {}

    class Saved:
        __slots__ = ("tensor", "__weakref__")

    def release(ptr, nbytes):
        users[ptr] -= 1
        if not users[ptr]:
            del users[ptr]
            state["alive"] -= nbytes

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() == state["weights"]:
            return t
        box = Saved()
        box.tensor = t.detach()  # the tensor itself would hold its own node, and the node the box: a cycle
        ptr = storage.data_ptr()
        users[ptr] = users.get(ptr, 0) + 1
        if users[ptr] == 1:
            state["alive"] += storage.nbytes()
            state["peak"] = max(state["peak"], state["alive"])
        weakref.finalize(box, release, ptr, storage.nbytes())
        return box

    def unpack(box):
        return box if isinstance(box, torch.Tensor) else box.tensor

    block_forward = model_module.Block.forward

    def counted(self, *args, **kwargs):
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return block_forward(self, *args, **kwargs)

    model_module.Block.forward = counted
    torch.manual_seed(0)

    def measure(c, model, m, _):
        state["weights"] = model.stage.flat.untyped_storage().data_ptr()
        tokens = torch.randint(0, spec.vocab, (2 * m, 6))  # equal micro-batches of 2 rows, no padding
        # one pass of one micro-batch through one chunk of this stage, alone
        x = None if c.pp == 0 else torch.randn(2, 6, spec.hidden, requires_grad=True)
        y = model._stage_forward(tokens[:2], x, grad=True, chunk=model.layout.dims.v - 1 if c.pp else 0)
        one = state["alive"]
        del x, y
        state["peak"] = 0
        model.forward_backward(list(tokens.chunk(m)), lambda i, y: y.float().pow(2).mean())
        return c.pp, state["peak"], one, state["alive"]

    return _on_each_layout(rank, cases, torch.zeros(4, 1), measure, spec, seed=1)


def test_each_stage_holds_exactly_the_micro_batches_the_cost_model_charges():
    """Random (tp, pp, v, micro-batches) layouts of 4 processes and an 8-layer model: the peak of
    a stage's saved activations, in passes of one micro-batch through one chunk, over v, is
    activations_in_flight for that stage, and the first stage's is the count call_cost charges
    (its activation term over the bytes of one micro-batch's layers). GPipe would hold all m."""
    from realbench.cost.calls import _activation_bytes, _logits_bytes, call_cost
    from realbench.plan.builtin import get_builtin
    from realbench.plan.mesh import Mesh, Option, Strategy
    from realbench.runtime.layout import Layout
    from realbench.runtime.local import spawn
    from test_runtime_core import SPEC

    spec = SPEC.model_copy(update={"name": "llama-tiny-8", "n_layers": 8})
    rng = random.Random(7)
    cases = []
    for pp, v in [(2, 1), (4, 1), (2, 2), (4, 2), (2, 4)]:
        tp = rng.choice([t for t in (1, 2) if (4 // pp) % t == 0])
        m = rng.choice([pp + 1, 2 * pp + 1, 3 * pp]) if v == 1 else pp * rng.choice([2, 3])
        cases.append((Layout.on(range(4), 4 // pp // tp, tp, pp, v), m))
    cases.append((Layout.on(range(4), 1, 1, 4, 2), 4))  # m = pp: every forward first
    results = spawn(_held_worker, 4, spec, cases)
    sft = get_builtin("sft-tiny-cpu")  # a train call of fixed-width rows, on 4 processes
    call, cluster = sft.dataflow.call("actor_train"), sft.cluster
    for n, (lay, m) in enumerate(cases):
        d = lay.dims
        for rank in range(4):
            stage, peak, one, left = results[rank][n]
            assert left == 0 and one > 0, (lay, m, rank)
            assert peak % one == 0 and peak // one / d.v == activations_in_flight(m, d.pp, d.v, stage), \
                (lay, m, stage, peak / one)
        cost = call_cost(call, spec, cluster, Option(Mesh(0, 1, 0, 4), Strategy(d.dp, d.tp, d.pp, m, False, d.v)))
        tokens = call.seqs / call.optimizer_steps / d.dp / m * call.seq_len  # a micro-batch's
        per_micro_batch = 8 // d.pp * _activation_bytes(spec, d.tp, tokens)  # the stage's layers
        priced = (cost.working_bytes - 2 * _logits_bytes(spec, d.tp, tokens)) / per_micro_batch
        # (working_bytes is whole bytes: within a byte)
        assert priced == pytest.approx(activations_in_flight(m, d.pp, d.v, 0), abs=1 / per_micro_batch), (lay, m)
        assert m > d.pp and activations_in_flight(m, d.pp, d.v, 0) < m or m == d.pp
