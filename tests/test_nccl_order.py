"""The runtime's message order is safe on NCCL: runs on gloo are recorded and replayed under
NCCL's rules (tests/nccl_order.py), for the deepest pipelines and random plans that mix
pipeline, tensor and data parallelism, reallocations and calls on disjoint meshes. And the
replay itself catches what gloo lets pass."""

import random

import pytest

from nccl_order import Entry, NcclOrderError, Op, recorded_steps, replay
from realbench.cost import Estimator
from realbench.plan import get_builtin
from realbench.runtime.local import spawn


def _entry(index, comm, members, ops, waited=()):
    return Entry(index, comm, members, tuple(ops), tuple(waited))


def _pair(a, b):
    return ("world", "pair", min(a, b), max(a, b)), (min(a, b), max(a, b))


def _send(peer, n=4):
    return Op("send", peer, n, "torch.float32")


def _recv(peer, n=4):
    return Op("recv", peer, n, "torch.float32")


def test_replay_catches_head_to_head_sends_that_gloo_lets_pass():
    # each rank sends (and waits), then receives: gloo buffers the sends, NCCL's wait for a receive
    comm, members = _pair(0, 1)
    traces = [[_entry(0, comm, members, [_send(1)]), _entry(1, comm, members, [_recv(1)], waited=(0,))],
              [_entry(0, comm, members, [_send(0)]), _entry(1, comm, members, [_recv(0)], waited=(0,))]]
    with pytest.raises(NcclOrderError, match="would hang"):
        replay(traces)
    # without the wait they still hang: one stream per communicator runs them in order
    unwaited = [[_entry(0, comm, members, [_send(1)]), _entry(1, comm, members, [_recv(1)])],
                [_entry(0, comm, members, [_send(0)]), _entry(1, comm, members, [_recv(0)])]]
    with pytest.raises(NcclOrderError, match="would hang"):
        replay(unwaited)
    # the same messages posted as one batch on each rank complete
    world = ("world", "all")
    batched = [[_entry(0, world, (0, 1), [_send(1), _recv(1)])], [_entry(0, world, (0, 1), [_send(0), _recv(0)])]]
    assert replay(batched) == 2


def test_replay_lets_separate_communicators_proceed_and_checks_sizes_and_collectives():
    # two micro-batches through a 2-stage generation loop: stage 0 sends hidden states on without
    # waiting and needs micro-batch 0's token before it sends micro-batch 0's next slot
    fwd, loop = _pair(0, 1)[0], ("loop", "pair", 0, 1)

    def pipeline(token_comm):
        first = [_entry(0, fwd, (0, 1), [_send(1)]), _entry(1, fwd, (0, 1), [_send(1)]),
                 _entry(2, token_comm, (0, 1), [_recv(1, 1)]), _entry(3, fwd, (0, 1), [_send(1)], waited=(2,))]
        last = [_entry(0, fwd, (0, 1), [_recv(0)]), _entry(1, token_comm, (0, 1), [_send(0, 1)], waited=(0,)),
                _entry(2, fwd, (0, 1), [_recv(0)], waited=(0,)), _entry(3, fwd, (0, 1), [_recv(0)], waited=(0, 2))]
        return [first, last]

    assert replay(pipeline(loop)) == 8
    with pytest.raises(NcclOrderError, match="would hang"):  # tokens behind the hidden states
        replay(pipeline(fwd))
    # a pair's communicator is created by both ranks at their first message: rank 0 waits there
    # for rank 1, which first waits for rank 0 on another group
    crossed = [[_entry(0, fwd, (0, 1), [_send(1)]), _entry(1, loop, (0, 1), [_recv(1)])],
               [_entry(0, loop, (0, 1), [_send(0)]), _entry(1, fwd, (0, 1), [_recv(0)], waited=(0,))]]
    with pytest.raises(NcclOrderError, match="never issued"):
        replay(crossed)
    sizes = [[_entry(0, fwd, (0, 1), [_send(1, 4)])], [_entry(0, fwd, (0, 1), [_recv(0, 8)])]]
    with pytest.raises(NcclOrderError, match="sends 4"):
        replay(sizes)
    tp = ("tp", "all")
    swapped = [[_entry(0, tp, (0, 1), [Op("all_reduce", -1, 4, "f")]), _entry(1, tp, (0, 1), [Op("all_gather", -1, 4, "f")])],
               [_entry(0, tp, (0, 1), [Op("all_gather", -1, 4, "f")]), _entry(1, tp, (0, 1), [Op("all_reduce", -1, 4, "f")])]]
    with pytest.raises(NcclOrderError, match="collective 0"):
        replay(swapped)
    missing = [[_entry(0, fwd, (0, 1), [_send(1)])], []]
    with pytest.raises(NcclOrderError, match="1 sends from rank 0 to 1"):
        replay(missing)


def random_plans(name, count, seed):
    """`count` plans of the scenario, each call's option drawn at random."""
    est = Estimator(get_builtin(name))
    rng = random.Random(seed)
    return [(est.scenario, {est.scenario.dataflow.order[i]: rng.choice(est.options[i]) for i in range(est.n)})
            for _ in range(count)]


# generation pipelines of 2 and 4 stages with fewer micro-batches than stages, as many, and more:
# the generation loop sends each micro-batch's token back while the others are in flight
GENERATION_PIPELINES = [(2, 1), (2, 2), (2, 4), (4, 2), (4, 4), (4, 8)]


def generation_pipeline_plans(seed):
    """ReMax plans whose two generation calls (sampled and greedy) take the pipelines of
    GENERATION_PIPELINES, two per plan, on all 4 devices; the other calls at random."""
    est = Estimator(get_builtin("remax-tiny-cpu"))
    rng = random.Random(seed)
    order = est.scenario.dataflow.order
    plans = []
    for k in range(0, len(GENERATION_PIPELINES), 2):
        plan = {order[i]: rng.choice(est.options[i]) for i in range(est.n)}
        for call, (pp, m) in zip(("sample_gen", "greedy_gen"), GENERATION_PIPELINES[k:k + 2]):
            i = order.index(call)
            plan[call] = next(o for o in est.options[i] if o.mesh.size == 4 and o.strategy.tp == 1
                              and (o.strategy.pp, o.strategy.micro_batches) == (pp, m))
        plans.append((est.scenario, plan))
    return plans


def interleaved_plans(seed):
    """PPO plans whose actor and critic train on 2 or 4 stages of 2 or 4 virtual stages each (the
    tiny scenario's models with 8 layers), the other calls at random: the wrap from the last
    stage to the first carries activations forward and gradients back."""
    from realbench.models import get_model

    base = get_builtin("ppo-tiny-cpu")
    small = get_model("llama-small")  # 8 layers
    models = {role: small.with_value_head(spec.value_head) for role, spec in base.models.items()}
    est = Estimator(base.model_copy(update={"models": models}))
    rng = random.Random(seed)
    order = est.scenario.dataflow.order
    plans = []
    for pp, v in ((2, 4), (4, 2)):
        plan = {order[i]: rng.choice(est.options[i]) for i in range(est.n)}
        for call in ("actor_train", "critic_train"):
            i = order.index(call)
            plan[call] = rng.choice([o for o in est.options[i] if o.mesh.size == 4
                                     and (o.strategy.pp, o.strategy.virtual_stages) == (pp, v)])
        plans.append((est.scenario, plan))
    return plans


def test_runs_of_random_plans_replay_without_a_hang_on_nccl():
    # (test_runtime_run replays every algorithm's runs under two plans too)
    runs = generation_pipeline_plans(seed=3) + random_plans("ppo-tiny-cpu", 2, seed=3) + interleaved_plans(seed=3)
    covered = {(o.strategy.pp, o.strategy.micro_batches) for s, p in runs for n, o in p.items() if "gen" in n}
    assert set(GENERATION_PIPELINES) <= covered
    assert {s.cluster.n_devices for s, _ in runs} == {4}
    per_rank = spawn(recorded_steps, 4, runs, 2)
    kinds = set()
    for run in range(len(runs)):
        traces = [per_rank[r][run][1] for r in range(4)]
        assert replay(traces) == sum(map(len, traces)) > 0
        kinds |= {(e.comm[1], op.kind) for t in traces for e in t for op in e.ops}
    # the plans exercised every kind of message the runtime sends
    assert {("pair", "send"), ("all", "send"), ("all", "all_reduce"), ("all", "all_gather")} <= kinds
