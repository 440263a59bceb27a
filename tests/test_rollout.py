"""The rollout engine: continuous batching over a preallocated KV cache (realbench.runtime.rollout),
its schedule's formulas (realbench.dataflow.lengths) and its price (realbench.cost.calls)."""

import json
import random

import numpy as np
import pytest
import torch

from test_generation_stops import EOS, GEN, KEY, ROWS, SPEC, _prompts
from test_lengths import curve_in_bar, symmetric_of
from test_runtime_core import _on_each_layout
from realbench.dataflow import CallDef, CallKind
from realbench.dataflow.lengths import (LengthDistribution, continuous_busy, continuous_makespan, continuous_schedule,
                                        slot_occupancy)
from realbench.runtime.layout import Groups, Layout
from realbench.runtime.local import spawn
from realbench.runtime.model import init_full_weights

LIMITS = [3, 10, 1, 5, 2, 7, 4, 6]


def _single(seed: int = 3):
    from realbench.runtime.engine import PlacedModel

    model = PlacedModel(SPEC, Layout.on([0], 1, 1, 1), 0, Groups())
    model.stage.load_full(init_full_weights(SPEC, seed=seed))
    return model


@pytest.fixture(scope="module")
def model():
    return _single()


def _reference(model, **kw):
    from realbench.runtime.engine import generate

    return generate(model, _prompts(), GEN, key=KEY, drop_finished=False, **kw)


@pytest.mark.parametrize("slots,sync_every", [(1, 1), (2, 3), (3, 1), (3, 4), (8, 2), (20, 1)])
@pytest.mark.parametrize("sampling", [dict(temperature=0.7, eos=EOS), dict(greedy=True, eos=EOS),
                                      dict(temperature=1.3, top_k=5, top_p=0.9, eos=EOS),
                                      dict(temperature=0.7, limits=LIMITS)])
def test_every_slot_count_gives_the_full_length_loops_rows(model, slots, sync_every, sampling):
    """Rows end at different steps (end-of-sequence tokens or their own limits), slots refill
    with the next prompts (left padding removed), the tail moves its rows down: each row's
    tokens are the full-length loop's and its log-probabilities equal to 1e-5."""
    from realbench.runtime.rollout import RolloutEngine

    limits = sampling.get("limits")
    ref_seqs, ref_lps = _reference(model, **{**sampling, "limits": None if limits is None else torch.tensor(limits)})
    engine = RolloutEngine(model, _prompts(), GEN, slots, key=KEY, sync_every=sync_every, **sampling)
    seqs, lps = engine.run()
    assert torch.equal(seqs, ref_seqs)
    assert torch.allclose(lps, ref_lps, atol=1e-5)
    lengths = (ref_seqs[:, -GEN:] >= 0).sum(1)
    assert len(set(lengths.tolist())) >= 3 and max(lengths) == GEN  # rows end at several steps, some at the cap
    # every row went through a slot: the prefills took all of them, and no step held more than the slots
    assert sum(n for _, n in engine.timeline.prefills) == ROWS
    assert max(engine.timeline.busy) <= min(slots, ROWS) and engine.finished


def test_the_cache_is_allocated_once_and_refills_move_nothing(model):
    """The keys and values stay in the tensors allocated at the start (written in place); rows
    move only in the tail, to free slots below the power of two that holds the rest, and at most
    log2(slots) times each."""
    from realbench.runtime.rollout import RolloutEngine

    engine = RolloutEngine(model, _prompts(), GEN, 4, key=KEY, temperature=0.7, eos=EOS)
    cache = engine.cache
    pointers = {name: (k.data_ptr(), v.data_ptr()) for (name, k), v in zip(cache.keys.items(), cache.values.values())}
    shape = next(iter(cache.keys.values())).shape
    assert shape == (4, SPEC.n_kv_heads, _prompts().shape[1] + GEN, SPEC.head_dim)
    assert cache.bytes() == 2 * SPEC.n_layers * 4 * shape[1] * shape[2] * shape[3] * 4  # fp32
    moves = []
    while not engine.finished:
        before = engine.timeline.moves
        queued = len(engine.queue)
        engine.step()
        if engine.timeline.moves > before:
            moves.append(queued)
    assert pointers == {name: (k.data_ptr(), v.data_ptr()) for (name, k), v in zip(cache.keys.items(),
                                                                                   cache.values.values())}
    assert all(q == 0 for q in moves)  # only once nothing is queued
    assert engine.timeline.moves <= ROWS * 2  # log2(4) moves a row at most
    # the steps compute the power of two that holds the busy slots
    assert all(c >= b and c in (1, 2, 4) and (c == 1 or c < 2 * b) for b, c in
               zip(engine.timeline.busy, engine.timeline.computed) if b)


def test_the_decode_loop_reads_the_device_once_every_sync_every_steps(model, monkeypatch):
    """With end-of-sequence tokens the host reads which slots ended every k-th step only (one
    read each time); with limits it knows alone (no read). Every device-to-host transfer of the
    loop is counted: `.tolist()`, `.item()`, `.cpu()` and bool() of a tensor."""
    from realbench.runtime import rollout

    reads = []

    def counted(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *a, **kw):
            reads.append(name)
            return original(self, *a, **kw)
        return wrapper

    for k in (1, 4):
        engine = rollout.RolloutEngine(model, _prompts(), GEN, 3, key=KEY, temperature=0.7, eos=EOS, sync_every=k)
        reads.clear()
        with monkeypatch.context() as patch:
            for name in ("tolist", "item", "cpu", "__bool__"):
                patch.setattr(torch.Tensor, name, counted(name))
            steps = 0
            while not engine.finished:
                engine.step()
                steps += 1
        assert engine.host_reads == len(reads) > 0, (k, reads)
        assert engine.host_reads <= -(-steps // k)  # one read at most every k steps
    engine = rollout.RolloutEngine(model, _prompts(), GEN, 3, key=KEY, temperature=0.7, limits=LIMITS, sync_every=2)
    reads.clear()
    with monkeypatch.context() as patch:
        for name in ("tolist", "item", "cpu", "__bool__"):
            patch.setattr(torch.Tensor, name, counted(name))
        engine.run()
    assert reads == [] and engine.host_reads == 0


@pytest.mark.parametrize("sampling", [dict(temperature=0.7, eos=EOS), dict(greedy=True, limits=LIMITS)])
def test_graph_steps_have_one_shape_per_slot_count_and_the_same_rows(model, sampling, monkeypatch):
    """The steps a CUDA graph replays (`DecodeGraphs`; `EagerSteps` runs them on the CPU): every
    decode forward of the same key (the slots computed, a power of two) sees tensors of the same
    shapes (tokens, positions, the attention mask over the whole width), so one capture per key
    replays them all; the rows are the full-length loop's, as without graphs."""
    from realbench.runtime import rollout

    monkeypatch.setattr(rollout, "WINDOW", 4)  # below the width (16): an eager step's window grows
    limits = sampling.get("limits")
    ref_seqs, ref_lps = _reference(model, **{**sampling, "limits": None if limits is None else torch.tensor(limits)})

    def decode_shapes(graphs):
        engine = rollout.RolloutEngine(model, _prompts(), GEN, 4, key=KEY, graphs=graphs, **sampling)
        shapes = []

        def record(stage, args, kwargs):
            cache = args[2]
            if cache.prefill is None:  # a decode step (prefills run eagerly, outside any graph)
                shapes.append((args[0].shape, args[1].shape, cache.mask.shape))
        hook = model.stage.register_forward_pre_hook(record, with_kwargs=True)
        try:
            seqs, lps = engine.run()
        finally:
            hook.remove()
        assert torch.equal(seqs, ref_seqs) and torch.allclose(lps, ref_lps, atol=1e-5)
        assert len(shapes) == engine.steps
        return engine, shapes

    steps = rollout.EagerSteps()
    engine, shapes = decode_shapes(steps)
    assert len(steps.keys) == len(shapes)
    by_key = {}
    for key, shape in zip(steps.keys, shapes):
        by_key.setdefault(key, set()).add(shape)
    width = _prompts().shape[1] + GEN
    assert set(by_key) <= {1, 2, 4} and len(by_key) >= 2  # the tail computes fewer slots
    assert all(len(v) == 1 for v in by_key.values()), by_key
    assert all(shape[2][-1] == width for v in by_key.values() for shape in v)
    # without graphs the window grows with the rows: more shapes than slot counts
    eager, shapes = decode_shapes(False)
    assert eager.graphs is None and len(set(shapes)) > len(set(eager.timeline.computed))
    assert rollout.RolloutEngine(model, _prompts(), GEN, 4, key=KEY, **sampling).graphs is None  # on the CPU


def test_compiled_decode_steps_make_the_same_rows_and_compile_once(model):
    """`compiled`: the model's forward in the steps of every slot through torch.compile (inductor,
    as on a GPU), the tail's fewer slots and the prefills eager. The rows are the full-length
    loop's; a second engine with another sampling key (every step of a run has its own) reuses
    the compiled code (sampling stays outside it)."""
    from torch._dynamo.utils import counters

    from realbench.runtime import rollout

    before = counters["stats"]["unique_graphs"]
    for key in (KEY, KEY + 1):
        ref_seqs, ref_lps = _reference_key(model, key)
        engine = rollout.RolloutEngine(model, _prompts(), GEN, 4, key=key, sync_every=2, temperature=0.7, eos=EOS,
                                       compiled=True)
        seqs, lps = engine.run()
        assert torch.equal(seqs, ref_seqs), key
        assert torch.allclose(lps, ref_lps, atol=1e-5)
        assert isinstance(engine.graphs, rollout.EagerSteps)  # fixed shapes without a GPU
        assert 4 in engine.timeline.computed and min(engine.timeline.computed) < 4  # compiled steps, then the tail
    assert counters["stats"]["unique_graphs"] - before == 1


def test_a_compiled_forward_takes_more_shapes_than_torchs_default_limit():
    """torch.compile's fullgraph compile fails past 8 shapes of one function in a process (a run
    that re-plans meets new slot counts, a profile's grid many): compile_static allows
    COMPILED_SHAPES."""
    from realbench.runtime.rollout import COMPILED_SHAPES, compile_static

    layer = torch.nn.Linear(3, 2)
    forward = compile_static(layer, "eager")
    for rows in range(1, 13):
        assert torch.allclose(forward(torch.ones(rows, 3)), layer(torch.ones(rows, 3)))
    assert COMPILED_SHAPES >= 12


def _reference_key(model, key):
    from realbench.runtime.engine import generate

    return generate(model, _prompts(), GEN, key=key, drop_finished=False, temperature=0.7, eos=EOS)


def test_a_run_with_compiled_decode_steps_samples_what_the_eager_one_does(cli, tmp_path):
    """`realbench run --compile-decode` reaches every worker (launch, the worker command, the
    engine): the same samples as the run without it, the same rewards and losses to float rounding
    (the compiled kernels sum the behaviour log-probabilities in another order, which moves the
    loss in its last bits on some CPUs), and the summary says how generation decoded (on the CPU:
    eager steps with a growing window, compiled fixed-shape steps)."""
    from realbench.cost import Estimator
    from realbench.cost.baselines import symmetric_plan
    from realbench.plan import load_scenario, plan_from_options

    est = Estimator(load_scenario("ppo-tiny-2cpu"))
    plan_from_options(est.scenario, est.options_of(symmetric_plan(est))).save(tmp_path / "plan.yaml")
    runs = []
    for extra in ((), ("--compile-decode",)):
        code, out, err = cli("run", "--scenario", "ppo-tiny-2cpu", "--plan", tmp_path / "plan.yaml", "--nproc", 2,
                             "--steps", 2, "--json", *extra)
        assert code == 0, err
        runs.append(json.loads(out))
    plain, compiled = runs
    assert (plain["compile_decode"], compiled["compile_decode"]) == (False, True)
    assert compiled["samples"] == plain["samples"] and len(compiled["metrics"]) == len(plain["metrics"])
    for got, want in zip(compiled["metrics"], plain["metrics"]):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-9)
    assert plain["calls"]["actor_gen"]["decode"] == "eager"
    assert compiled["calls"]["actor_gen"]["decode"] == "compiled fixed-shape"


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (6, 1)])
def test_decode_attention_is_sdpas_grouped_query_attention(heads, kv_heads):
    """A decode step's grouped attention (query head h reads key head h // (heads / kv_heads))
    equals SDPA's with enable_gqa and the same mask, per row (rows see different positions)."""
    import torch.nn.functional as F

    from realbench.runtime.model import decode_attention

    g = torch.Generator().manual_seed(0)
    B, T, D = 3, 7, 16
    q = torch.randn(B, heads, 1, D, generator=g)
    k, v = (torch.randn(B, kv_heads, T, D, generator=g) for _ in range(2))
    seen = torch.tensor([2, 7, 4])  # each row's keys so far
    mask = (torch.arange(T)[None, :] < seen[:, None])[:, None, None, :]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=heads != kv_heads)
    assert torch.allclose(decode_attention(q, k, v, mask), want, atol=1e-6)
    # the window of a longer cache (a slice, as the slots' cache passes it) reads the same
    wide = torch.randn(B, kv_heads, T + 5, D, generator=g)
    wide[:, :, :T] = k
    assert torch.allclose(decode_attention(q, wide[:, :, :T], v, mask), want, atol=1e-6)


def test_bench_rollout_measures_every_loop_on_the_same_rows(cli):
    """`bench rollout` on the CPU: each loop's tokens per second of the
    generation call's rows x new tokens, the continuous loops' rows equal to the micro-batched
    loop's (the CPU computes the same kernels), no graphs without a GPU."""
    code, out, _ = cli("bench", "rollout", "--json")  # without a GPU: the tiny scenario, not the 500M model
    assert code == 0
    result = json.loads(out)
    assert result["scenario"] == "grpo-tiny-cpu" and result["dtype"] == "float32" and result["rounds"] == 3
    assert set(result["tokens_per_s"]) == {"micro_batched", "continuous", "continuous_sync", "transformers_static"}
    assert result["tokens"] == result["rows"] * result["new_tokens"] > 0
    for name, seconds in result["seconds"].items():
        assert result["tokens_per_s"][name] == pytest.approx(result["tokens"] / seconds)
    assert result["same_rows"] == {k: result["rows"] for k in ("micro_batched", "continuous", "continuous_sync")}
    assert result["errors"] == {} and "graphs_over_micro_batched" not in result
    from realbench.bench.rollout import run

    chosen = run("grpo-tiny-cpu", rounds=1, only=("continuous",))  # the reference loop and the ones named
    assert set(chosen["tokens_per_s"]) == {"micro_batched", "continuous"}
    assert chosen["same_rows"] == {"micro_batched": chosen["rows"], "continuous": chosen["rows"]}


def test_a_pipeline_is_refused_by_the_engine_and_runs_the_micro_batched_loop():
    from realbench.runtime.rollout import RolloutEngine

    class Piped:
        layout = Layout.on([0, 1], 1, 1, 2)

    with pytest.raises(ValueError, match="without pipeline parallelism"):
        RolloutEngine(Piped(), _prompts(), GEN, 2)


def _rollout_worker(rank, world, cases, prompts):
    from realbench.runtime.rollout import rollout

    def sampled(c, model, m, mine):
        rows = torch.arange(ROWS).chunk(model.layout.dims.dp)[c.dp]
        seqs, lps = rollout(model, mine, GEN, m, sync_every=2, key=KEY, temperature=0.7, eos=EOS, rows=rows)
        return c.dp, seqs.tolist(), lps.tolist()

    return _on_each_layout(rank, cases, prompts, sampled)


def test_random_layouts_give_the_single_process_rows():
    """tp and dp layouts (continuous batching in ceil(rows / m) slots per replica) and pipelines
    (the micro-batched loop) sample each global row as one process does."""
    rng = random.Random(4)
    cases = []
    while len(cases) < 6:
        dp, tp, pp = rng.choice([1, 2, 4]), rng.choice([1, 2]), rng.choice([1, 1, 2])
        if dp * tp * pp > 4 or dp * tp * pp == 1:
            continue
        cases.append((Layout.on(range(dp * tp * pp), dp, tp, pp), rng.choice([1, 2, 3])))
    assert any(lay.dims.tp > 1 and lay.dims.pp == 1 for lay, _ in cases)
    ref_seqs, ref_lps = _reference(_single(), temperature=0.7, eos=EOS)
    got = spawn(_rollout_worker, 4, cases, _prompts())
    for k, (lay, m) in enumerate(cases):
        shares = {}
        for rank in range(4):
            if got[rank][k] is not None:
                dp, seqs, lps = got[rank][k]
                shares.setdefault(dp, []).append((seqs, lps))
        seqs = torch.cat([torch.tensor(shares[d][0][0]) for d in sorted(shares)])
        lps = torch.cat([torch.tensor(shares[d][0][1]) for d in sorted(shares)])
        assert torch.equal(seqs, ref_seqs), (lay, m)
        assert torch.allclose(lps, ref_lps, atol=1e-5), (lay, m)
        for d in shares:  # every rank of a replica has the same rows
            assert all(s == shares[d][0] for s in shares[d])


# -- the schedule's formulas -----------------------------------------------------------------------
TWO = LengthDistribution(dist="empirical", max=4, lengths=(2, 4), counts=(1, 1))


def test_slot_occupancy_by_hand():
    """Lengths 2 or 4 (one half each): 1 or 3 decode steps, then 0..k-1 steps' wait for the refill."""
    assert slot_occupancy(TWO.cdf(), 1).tolist() == pytest.approx([0, 0.5, 0, 0.5, 0])
    assert slot_occupancy(TWO.cdf(), 2).tolist() == pytest.approx([0, 0.25, 0.25, 0.25, 0.25, 0])


def test_the_makespan_by_hand():
    """No more rows than slots: the longest occupancy, E[max of 2] = 1 + 2 P(some of 2 is 3) =
    1 + 2 x 3/4. Four rows in two slots (occupancy 1 or 3, mean 2; the residual R, P(R = r) =
    P(occ > r) / 2: 1/2, 1/4, 1/4): 4 x 2 / 2 + E[max(occ, R)] - (2 + E[R]) / 2 with E[R] = 3/4,
    E[max(occ, R)] = sum_x P(max > x) = 1 + (1 - 1/2 x 3/4) + (1 - 1/2 x 1) = 2.125."""
    assert continuous_makespan(TWO.cdf(), 2, 2) == pytest.approx(1 + 2 * 0.75)
    assert continuous_makespan(TWO.cdf(), 4, 2) == pytest.approx(4 + 2.125 - (2 + 0.75) / 2)


@pytest.mark.parametrize("mean,cv,rows,slots,k", [(32, 1.0, 64, 16, 1), (32, 1.0, 128, 16, 4), (32, 1.5, 256, 16, 1),
                                                  (100, 0.5, 128, 32, 2), (20, 1.0, 48, 16, 8)])
def test_the_makespan_against_a_simulation_over_sampled_lengths(mean, cv, rows, slots, k):
    """List scheduling of sampled lengths as the engine runs them (a freed slot refilled at the
    next multiple of k), averaged over 300 draws: the formula within 3%."""
    import heapq

    d = LengthDistribution(dist="lognormal", mean=mean, cv=cv, max=8 * mean)
    pmf = np.diff(d.cdf(), prepend=0.0)
    rng = np.random.default_rng(0)
    spans = []
    for _ in range(300):
        free = [0] * slots
        for length in rng.choice(len(pmf), size=rows, p=pmf):
            start = heapq.heappop(free)
            heapq.heappush(free, -(-(start + max(length - 1, 1)) // k) * k)
        last = max(free)
        spans.append(last)
    # the last row's slot does not wait for a refill: at most k - 1 steps too many in the simulation
    assert continuous_makespan(d.cdf(), rows, slots, k) == pytest.approx(np.mean(spans), rel=0.03, abs=k)


def test_fixed_lengths_run_in_waves(model):
    """Ten rows of 9 tokens in four slots: three waves of 8 decode steps (a wave's slots all end
    together, so the next starts at once), the last computing two slots; the engine does that."""
    from realbench.runtime.rollout import RolloutEngine

    plan = continuous_schedule(None, 10, 4, 3, gen_len=9)
    assert plan.steps == 3 * 8 and plan.prefills == 3 and plan.prefill_rows == 4
    assert plan.rows == pytest.approx((2 * 8 * 4 + 8 * 2) / 24)
    prompts = torch.randint(0, SPEC.vocab, (10, 3), generator=torch.Generator().manual_seed(0))
    engine = RolloutEngine(model, prompts, 9, 4, sync_every=3)
    engine.run()
    assert engine.steps == plan.steps and len(engine.timeline.prefills) == plan.prefills
    assert sum(engine.timeline.computed) == pytest.approx(plan.rows * plan.steps)


def test_the_slots_drain_after_the_last_row_starts():
    d = LengthDistribution(dist="lognormal", mean=32, cv=1.0, max=256)
    xs, busy = continuous_busy(d.cdf(), 64, 16, 1)
    assert xs[0] == 0 and busy[0] == 1 and all(a <= b for a, b in zip(xs, xs[1:]))
    assert all(a >= b - 1e-12 for a, b in zip(busy, busy[1:])) and busy[-1] < 0.01
    # the drain starts at rows E[occ] / slots - E[mean rest]: beyond half of the makespan here
    assert 0.4 < xs[1] < 0.6


# -- its price --------------------------------------------------------------------------------------
def _gen(lengths=None, seqs=64, prompt=16, gen=256, k=4):
    return CallDef(name="gen", model="actor", kind=CallKind.GENERATE, inputs=("prompts",), outputs=("seqs",),
                   seqs=seqs, seq_len=prompt + gen, gen_len=gen, lengths=lengths, sync_every=k)


def test_continuous_batching_is_priced_by_hand():
    """One replica of 64 rows in 64 / 4 = 16 slots, fixed lengths: 4 waves of 255 decode steps of
    16 rows attending to the prompt and half the response, 4 prefills of 16 prompts; the KV cache
    of 16 slots at the full width."""
    from realbench.cost.calls import _decode_step, _head_forward, _layer_forward, call_cost
    from realbench.plan.options import decode_slots
    from realbench.plan import load_scenario
    from realbench.plan.mesh import Mesh, Option, Strategy

    s = load_scenario("ppo-7b-7b-16gpu")
    model, cluster = s.models["actor"], s.cluster
    option = Option(Mesh(0, 1, 0, 1), Strategy(1, 1, 1, 4))
    call = _gen(k=1)
    assert decode_slots(call, option) == 16
    cost = call_cost(call, model, cluster, option)
    layer, head = _decode_step(cluster, model, 1, 16, 16 + 128)
    prefill = model.n_layers * _layer_forward(cluster, model, 1, 16 * 16, 16) + _head_forward(cluster, model, 1, 16)
    assert cost.compute_s == pytest.approx(4 * prefill + 4 * 255 * (model.n_layers * layer + head), rel=1e-12)
    assert cost.working_bytes >= 16 * 272 * model.kv_bytes_per_token_layer() * model.n_layers
    twice = call_cost(call, model, cluster, Option(Mesh(0, 1, 0, 1), Strategy(1, 1, 1, 2)))
    kv = model.kv_bytes_per_token_layer() * model.n_layers * 272
    # twice the slots: their cache
    assert twice.working_bytes - cost.working_bytes == pytest.approx(16 * kv, rel=0.05)


def test_a_long_tail_costs_its_tokens_over_the_slots_and_one_tail():
    """512 rows of mean 32 tokens (cap 256) in 64 slots: about total / slots decode steps plus
    one tail, a quarter of every row at the cap (8 waves of 255 steps) and less."""
    from realbench.cost.calls import call_cost
    from realbench.plan import load_scenario
    from realbench.plan.mesh import Mesh, Option, Strategy

    s = load_scenario("ppo-7b-7b-16gpu")
    model, cluster = s.models["actor"], s.cluster
    tail = _gen(LengthDistribution(dist="lognormal", mean=32, cv=1.0, max=256), seqs=512)
    plan = continuous_schedule(tail.lengths.cdf(), 512, 64, 4)
    assert 512 * tail.lengths.expected / 64 < plan.steps < 512 * tail.lengths.expected / 64 + 256
    continuous = call_cost(tail, model, cluster, Option(Mesh(0, 1, 0, 1), Strategy(1, 1, 1, 8))).time_s
    fixed = call_cost(_gen(None, seqs=512), model, cluster, Option(Mesh(0, 1, 0, 1), Strategy(1, 1, 1, 8))).time_s
    assert continuous < fixed / 3


def test_a_serving_engines_cache_at_its_memory_fraction_bounds_its_slots_by_hand():
    """LLaMA 7B on an H100 (80 GiB) in tp 2, 512 rows of 1024 + 1024 tokens: a server taking 0.485
    of the GPU keeps 0.485 x 85,899,345,920 = 41,661,182,771 bytes, less its weights (6,738,415,616
    parameters over 2 GPUs in bf16: 6,738,415,616 bytes) and the activations it profiles (8192
    tokens x 4096 x (10 + 24 / 2) x 2 / 8 = 184,549,376, and the logits of its 512 sequences,
    512 x 32000 x 4 / 2 = 32,768,000): 34,705,449,779 bytes of cache at 2 x 32 x 128 x 2 x 32 / 2
    = 262,144 bytes a token, 132,390 tokens, 64 sequences of 2048 (all growing to the full width
    together): priced as 64 slots exactly, and holding its 0.485 of the GPU."""
    from realbench.cost.calls import (call_cost, serving_cache_problem, serving_cache_tokens, serving_slots,
                                      shard_params)
    from realbench.plan import load_scenario
    from realbench.plan.mesh import Mesh, Option, Strategy
    from realbench.plan.options import strategy_problem

    s = load_scenario("ppo-7b-7b-16gpu")
    model, cluster = s.models["actor"], s.cluster
    assert cluster.device.memory_bytes == 85_899_345_920 and shard_params(model, 2, 1) * 2 == 6_738_415_616
    mesh = Mesh(0, 1, 0, 2)
    call = _gen(seqs=512, prompt=1024, gen=1024).model_copy(update={"memory_fraction": 0.485})
    whole = Option(mesh, Strategy(1, 2, 1, 1))
    cache = 0.485 * 85_899_345_920 - 6_738_415_616 - 184_549_376 - 32_768_000
    assert serving_cache_tokens(call, model, cluster, 2, 512) == pytest.approx(cache / 262_144, rel=1e-12)
    assert int(cache / 262_144) == 132_390 and serving_slots(call, model, cluster, whole) == 64
    plain = call.model_copy(update={"memory_fraction": None})
    assert serving_slots(plain, model, cluster, whole) == 512
    served = call_cost(call, model, cluster, whole)
    assert served.compute_s == call_cost(plain, model, cluster, Option(mesh, Strategy(1, 2, 1, 8))).compute_s
    assert served.compute_s > 1.1 * call_cost(plain, model, cluster, whole).compute_s  # 512 slots: one wave
    assert served.weights_bytes + served.working_bytes == pytest.approx(0.485 * 85_899_345_920, abs=1)
    # a larger share holds more (0.9: 268,377 tokens, 131 sequences) and is capped at the plan's usable memory
    more = call.model_copy(update={"memory_fraction": 0.9})
    assert serving_slots(more, model, cluster, whole) == 131
    big = call_cost(more, model, cluster, whole)
    assert big.weights_bytes + big.working_bytes == pytest.approx(cluster.usable_memory_bytes, abs=1)
    # responses of many lengths: the cache holds sequences of the prompt and a decoding row's mean age
    tail = _gen(LengthDistribution(dist="lognormal", mean=256, cv=1.0, max=1024), seqs=512, prompt=1024,
                gen=1024).model_copy(update={"memory_fraction": 0.485})
    age = continuous_schedule(tail.lengths.cdf(), 512, 512, 4).age
    assert 128 < age < 1024
    assert serving_slots(tail, model, cluster, whole) == int(cache / 262_144 // (1024 + age)) > 64
    # 0.085 of the GPU leaves (7,301,444,403 - 6,955,732,992) / 262,144 = 1,318 tokens: not one
    # sequence, so the server does not start; in tp 4 it does
    small = call.model_copy(update={"memory_fraction": 0.085})
    why = serving_cache_problem(small, model, cluster, Strategy(1, 2, 1, 1))
    assert "holds 1318 tokens a replica of tp 2, fewer than one sequence of 2048" in why, why
    assert call_cost(small, model, cluster, whole).working_bytes == float("inf")  # no plan holds it
    assert serving_cache_problem(small, model, cluster, Strategy(1, 4, 1, 1)) is None
    # a vLLM server must hold one request of its max_model_len (verl's, where unset, is the
    # checkpoint's positions): 132,390 tokens start, 132,391 do not, where a sequence of 2048 fits
    assert serving_cache_problem(call.model_copy(update={"max_model_len": 132_390}), model, cluster,
                                 Strategy(1, 2, 1, 1)) is None
    longer = call.model_copy(update={"max_model_len": 132_391})
    why = serving_cache_problem(longer, model, cluster, Strategy(1, 2, 1, 1))
    assert "holds 132390 tokens a replica of tp 2, fewer than one request of max_model_len 132391" in why, why
    assert call_cost(longer, model, cluster, whole).working_bytes == float("inf")
    # (a context is a serving engine's, and at least a sequence: shorter, the server cuts responses)
    with pytest.raises(ValueError, match="shorter than the call's sequences of 2048"):
        call.model_validate({**call.model_dump(), "max_model_len": 2047})
    with pytest.raises(ValueError, match="max_model_len is a serving engine's"):
        call.model_validate({**call.model_dump(), "memory_fraction": None, "max_model_len": 4096})
    # (and realbench prices an engine's rollout server without a pipeline)
    assert strategy_problem(call, model, cluster, Mesh(0, 1, 0, 4), Strategy(1, 2, 2, 1))[0] == "pp"


def test_a_plans_memory_share_is_its_servers_over_the_scenarios_by_hand():
    """The share a plan gives its generation's server (Strategy.memory_fraction, the plan key
    memory_fraction) replaces the scenario's: the job of the test above, whose scenario says 0.485
    (64 slots), planned at 0.9 holds 131 sequences and the plan's usable memory; on a scenario that
    names no share the plan's 0.485 makes it the served call of 64 slots. A share is a generation's,
    served without a pipeline, and realbench's runtime does not run it."""
    from realbench.cost.calls import call_cost, serving_cache_problem, serving_slots
    from realbench.errors import ConfigError
    from realbench.plan import load_scenario
    from realbench.plan.mesh import Mesh, Option, Strategy
    from realbench.plan.options import strategy_problem
    from realbench.plan.plan import plan_from_options, refuse_unrunnable, resolve_plan

    s = load_scenario("ppo-7b-7b-16gpu")
    model, cluster = s.models["actor"], s.cluster
    mesh = Mesh(0, 1, 0, 2)
    call = _gen(seqs=512, prompt=1024, gen=1024).model_copy(update={"memory_fraction": 0.485})
    wide = Option(mesh, Strategy(1, 2, 1, 1, memory_fraction=0.9))
    assert serving_slots(call, model, cluster, wide) == 131
    assert call_cost(call, model, cluster, wide) == call_cost(call.model_copy(update={"memory_fraction": 0.9}), model,
                                                              cluster, Option(mesh, Strategy(1, 2, 1, 1)))
    cost = call_cost(call, model, cluster, wide)
    assert cost.weights_bytes + cost.working_bytes == pytest.approx(cluster.usable_memory_bytes, abs=1)
    plain = call.model_copy(update={"memory_fraction": None})
    served = Option(mesh, Strategy(1, 2, 1, 1, memory_fraction=0.485))
    assert serving_slots(plain, model, cluster, served) == 64
    assert serving_slots(plain, model, cluster, Option(mesh, Strategy(1, 2, 1, 1))) == 512
    assert call_cost(plain, model, cluster, served).compute_s == call_cost(call, model, cluster,
                                                                           Option(mesh, Strategy(1, 2, 1, 1))).compute_s
    # 0.085 of the GPU holds no sequence (the test above), whatever the scenario's share
    assert "fewer than one sequence" in serving_cache_problem(call, model, cluster,
                                                              Strategy(1, 2, 1, 1, memory_fraction=0.085))
    assert strategy_problem(call, model, cluster, mesh, Strategy(1, 2, 1, 1, memory_fraction=0.9)) is None
    assert strategy_problem(plain, model, cluster, Mesh(0, 1, 0, 4), Strategy(1, 2, 2, 1, memory_fraction=0.9))[0] == "pp"
    scoring = s.dataflow.call("ref_inf")
    why = strategy_problem(scoring, s.model_of(scoring), cluster, Mesh(0, 1, 0, 8), Strategy(8, 1, 1, 1, memory_fraction=0.5))
    assert why == ("memory_fraction", "a share of each GPU's memory is a serving engine's: a generation's")
    assert wide.label(8) == "n0:0-1/dp1tp2pp1m1f0.9"
    # the plan file keeps it (calls.<generation>.memory_fraction), and realbench's runtime refuses it by name
    options = {n: Option(Mesh(0, 2, 0, 8), Strategy(16, 1, 1, 1)) for n in s.dataflow.call_names}
    gen = s.dataflow.call("actor_gen")
    options["actor_gen"] = Option(Mesh(0, 2, 0, 8), Strategy(8, 2, 1, 1, memory_fraction=0.7))
    plan = plan_from_options(s, options)
    assert plan.calls["actor_gen"].memory_fraction == 0.7 and plan.calls["actor_train"].memory_fraction is None
    assert resolve_plan(plan, s)["actor_gen"].strategy.memory_fraction == 0.7 and gen.memory_fraction is None
    with pytest.raises(ConfigError) as e:
        refuse_unrunnable(s, resolve_plan(plan, s))
    assert e.value.field == "calls.actor_gen.memory_fraction"


def test_a_profiled_rollout_decodes_in_the_slots_its_servers_cache_holds():
    """Priced from a profile, a server whose cache holds half its 8 slots' sequences (the share
    that leaves exactly 4 x 16 tokens, and a half) decodes as 2 batches of 4 do; without the
    cluster's memory its slots are refused, not guessed."""
    from test_profile import synthetic_profile

    from realbench.cost.calls import serving_cache_tokens, serving_slots
    from realbench.cost.profiled import profiled_call_times
    from realbench.plan import load_scenario
    from realbench.plan.mesh import Mesh, Option, Strategy

    prof = synthetic_profile()
    s = load_scenario("ppo-tiny-2cpu")
    call, model, cluster = s.dataflow.call("actor_gen"), s.models["actor"], s.cluster
    whole, halves = Option(Mesh(0, 1, 0, 1), Strategy(1, 1, 1, 1)), Option(Mesh(0, 1, 0, 1), Strategy(1, 1, 1, 2))
    tokens = {f: serving_cache_tokens(call.model_copy(update={"memory_fraction": f}), model, cluster, 1, 8)
              for f in (0.5, 1.0)}
    per_share = (tokens[1.0] - tokens[0.5]) / 0.5  # (the cache grows linearly with the share)
    share = 1.0 - (tokens[1.0] - 4.5 * call.seq_len) / per_share
    served = call.model_copy(update={"memory_fraction": share})
    assert serving_slots(served, model, cluster, whole) == 4
    assert profiled_call_times(served, model, [whole], prof, cluster=cluster) == \
        pytest.approx(profiled_call_times(call, model, [halves], prof, cluster=cluster), rel=1e-12)
    assert profiled_call_times(served, model, [whole], prof, cluster=cluster)[0] > \
        profiled_call_times(call, model, [whole], prof, cluster=cluster)[0]
    with pytest.raises(ValueError, match="need the cluster's memory"):
        profiled_call_times(served, model, [whole], prof)


def test_a_memory_fraction_is_an_engines_and_each_engine_prices_its_own_default(cli, tmp_path):
    """realbench's runtime keeps a cache for every slot: a scenario without an engine that gives
    its rollout a memory fraction is refused in one line; priced as an engine, a scenario that
    gives none takes the engine's default configuration's (verl 0.5, OpenRLHF's quick-start 0.5,
    AReaL 0.9), one that gives its own keeps it."""
    from realbench.engines import as_example, priced_as
    from realbench.plan import load_scenario

    path = tmp_path / "my tail.yaml"
    path.write_text(TAIL_SCENARIO.replace("sync_every: 8", "sync_every: 8, memory_fraction: 0.6"))
    code, out, err = cli("validate", path)
    assert code == 2 and "dataflow.memory_fraction" in err and "realbench's runtime keeps a cache" in err, err
    assert len(err.strip().splitlines()) == 1
    path.write_text(TAIL_SCENARIO.replace("sync_every: 8", "sync_every: 8, memory_fraction: 1.5"))
    code, out, err = cli("validate", path)
    assert code == 2 and "memory_fraction: 1.5" in err and "(0, 1]" in err, err
    # a vLLM server's context: a whole number, and at least a sequence (512 + 16,384 tokens)
    engine = TAIL_SCENARIO.replace("name: grpo-tail", "name: grpo-tail\nengine: verl")
    for context, says in (("long", "'long': the context a request to the rollout's vLLM server may take"),
                          ("16895", "max_model_len 16895 is shorter than the call's sequences of 16896 tokens")):
        path.write_text(engine.replace("sync_every: 8", f"sync_every: 8, memory_fraction: 0.6, max_model_len: {context}"))
        code, out, err = cli("validate", path)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    path.write_text(engine.replace("sync_every: 8", "sync_every: 8, memory_fraction: 0.6, max_model_len: 16896"))
    assert load_scenario(str(path)).dataflow.call("actor_gen").max_model_len == 16896
    s = load_scenario("grpo-7b-16gpu")
    assert s.dataflow.call("actor_gen").memory_fraction is None
    for engine, default in (("verl", 0.5), ("openrlhf", 0.5), ("areal", 0.9)):
        as_run = priced_as(s, engine)
        assert as_run.dataflow.call("actor_gen").memory_fraction == default
        # the engine's example, at its own share (verl's run_qwen3_8b_fsdp.sh 0.6, OpenRLHF's slurm script
        # none: 0.95, AReaL's gsm8k_grpo.yaml 0.8)
        example = as_example(s, engine)
        assert example.dataflow.call("actor_gen").memory_fraction == {"verl": 0.6, "openrlhf": 0.95, "areal": 0.8}[engine]
        assert example.engine == engine
        mine = priced_as(as_run.with_memory_fraction(0.7), engine)
        assert mine.dataflow.call("actor_gen").memory_fraction == 0.7
        assert all(c.memory_fraction is None for c in mine.dataflow.calls if c.name != "actor_gen")


# -- the scenario, the timeline, the run ------------------------------------------------------------
TAIL_SCENARIO = """
schema: realbench.scenario/1
name: grpo-tail
cluster: {device: h100, nodes: 4, gpus_per_node: 8}
models: {actor: llama3-8b, ref: llama3-8b, reward: llama3-8b}
dataflow: {algorithm: grpo, prompts: 64, prompt_len: 512, group_size: 8, sync_every: 8,
           gen_len: {dist: lognormal, mean: 2000, cv: 1.0, max: 16384}}
"""


def test_sync_every_is_a_generation_setting_and_bad_values_are_refused(cli, tmp_path):
    from realbench.plan import load_scenario

    path = tmp_path / "my tail.yaml"
    path.write_text(TAIL_SCENARIO)
    s = load_scenario(str(path))
    assert [c.sync_every for c in s.dataflow.calls if c.kind == CallKind.GENERATE] == [8]
    assert CallDef(name="g", model="a", kind=CallKind.GENERATE, seqs=1, seq_len=4, gen_len=2).sync_steps == 4
    path.write_text(TAIL_SCENARIO.replace("sync_every: 8", "sync_every: 0"))
    code, out, err = cli("validate", path)
    assert code == 2 and "dataflow.sync_every: 0: the decode steps" in err and "at least 1" in err, err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="sync_every is only for generate calls"):
        CallDef(name="i", model="a", kind=CallKind.INFERENCE, seqs=1, seq_len=4, sync_every=2)


def test_the_timeline_draws_the_slots_filling_and_draining(tmp_path):
    from realbench.plan.mesh import Option, Strategy
    from realbench.report.figures import timeline_figure

    s, est, choice = symmetric_of(tmp_path, TAIL_SCENARIO)
    options = est.options_of(choice)
    gen = options["actor_gen"]
    flat = {**options, "actor_gen": Option(gen.mesh, Strategy(gen.strategy.dp * gen.strategy.pp, gen.strategy.tp, 1,
                                                                  gen.strategy.micro_batches))}
    p = timeline_figure(s, est.estimate(est.choice_of(flat)), options=flat)
    assert not p.select(name="live batch actor_gen")
    xs, offsets, start, end = curve_in_bar(p, "slots busy")
    assert xs[0] == pytest.approx(start) and start <= xs[-1] <= end + 1e-9
    assert offsets[0] == pytest.approx(0.3) and offsets[1] > 0.2  # every slot busy until the last row starts
    assert all(a >= b - 1e-12 for a, b in zip(offsets, offsets[1:])) and offsets[-1] < -0.29  # then they drain
    # without the plan's options, or on a pipeline: the live batch as before
    assert p.select(name="slots busy actor_gen") and timeline_figure(s, est.estimate(choice)).select(
        name="live batch actor_gen")


def test_the_slots_are_a_searched_setting_whose_cache_must_fit(tmp_path):
    """A replica's slots are its rows over the plan's micro-batches: on the long-tailed GRPO job
    (512 responses of up to 16,384 tokens) on one node in tp 8, one slot per row would hold a
    cache of 512 full-width rows, which no H100 holds; the options the search offers go down to
    slots that fit, and the symmetric baseline's plan takes such."""
    from realbench.cost import Estimator
    from realbench.cost.baselines import symmetric_plan
    from realbench.cost.calls import call_cost
    from realbench.plan.options import decode_slots
    from realbench.plan import load_scenario

    path = tmp_path / "tail.yaml"
    path.write_text(TAIL_SCENARIO)
    s = load_scenario(str(path))
    call, model = s.dataflow.call("actor_gen"), s.models["actor"]
    est = Estimator(s)
    options = est.options_of(symmetric_plan(est))
    same_layout = sorted((o for o in s.options["actor_gen"] if o.mesh.size == 8 and o.mesh.start(8) == 0
                          and (o.strategy.dp, o.strategy.tp, o.strategy.pp) == (1, 8, 1)),
                         key=lambda o: o.strategy.micro_batches)
    assert len(same_layout) >= 4
    slots = [decode_slots(call, o) for o in same_layout]
    memory = [call_cost(call, model, s.cluster, o).working_bytes for o in same_layout]
    assert slots == sorted(slots, reverse=True) and memory == sorted(memory, reverse=True)
    usable = s.cluster.usable_memory_bytes
    assert slots[0] == 512 and memory[0] > usable and min(memory) < usable / 4
    chosen = est.estimate(est.choice_of(options))
    assert not chosen.oom


def test_a_plan_file_gives_generations_decode_slots(cli, tmp_path):
    """Written plans carry each continuous-batching call's slots; a plan may give the slots
    instead of the micro-batches; slots that do not split a replica's rows, that disagree with
    micro_batches, or on a call that does not decode are refused naming the field."""
    import yaml

    from realbench.plan import load_scenario
    from realbench.plan.plan import plan_from_document, resolve_plan

    out = tmp_path / "my plan.yaml"
    code, _, err = cli("estimate", "--scenario", "grpo-tiny-cpu", "--baseline", "symmetric", "--profile", "none",
                       "--out", out)
    assert code == 0, err
    doc = yaml.safe_load(out.read_text())
    gen = doc["calls"]["actor_gen"]
    s = load_scenario("grpo-tiny-cpu")
    rows = s.dataflow.call("actor_gen").seqs // gen["dp"]
    assert gen["pp"] == 1 and gen["slots"] == rows // gen["micro_batches"]
    assert all("slots" not in p for name, p in doc["calls"].items() if name != "actor_gen")
    given = {k: v for k, v in gen.items() if k != "micro_batches"}
    for slots in (rows, 1):
        d = {**doc, "calls": {**doc["calls"], "actor_gen": {**given, "slots": slots}}}
        assert resolve_plan(plan_from_document(d), s)["actor_gen"].strategy.micro_batches == rows // slots
    bad = [({**given, "slots": rows + 1}, "do not split into decode slots"),
           ({**gen, "slots": 1, "micro_batches": 1}, "give one of them")]
    if rows > 1:
        for placement, said in bad:
            path = tmp_path / "bad plan.yaml"
            path.write_text(yaml.safe_dump({**doc, "calls": {**doc["calls"], "actor_gen": placement}}))
            code, _, err = cli("estimate", "--scenario", "grpo-tiny-cpu", "--plan", path, "--profile", "none")
            assert code == 2 and "calls.actor_gen.slots" in err and said in err, err
    path = tmp_path / "bad plan.yaml"
    path.write_text(yaml.safe_dump({**doc, "calls": {**doc["calls"], "actor_train": {**doc["calls"]["actor_train"],
                                                                                    "slots": 1}}}))
    code, _, err = cli("estimate", "--scenario", "grpo-tiny-cpu", "--plan", path, "--profile", "none")
    assert code == 2 and "calls.actor_train.slots: decode slots are a setting of generation" in err, err
