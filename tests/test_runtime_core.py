"""Runtime core on 2 and 4 CPU processes: layouts, layout parity with the unsharded model
(logits and gradients), and reallocation round trips between many random layout pairs."""

import random
import time

import pytest
import torch

from realbench.models import get_model
from realbench.runtime.layout import Coord, Groups, Layout
from realbench.runtime.local import spawn
from realbench.runtime.model import LlamaStage, init_full_weights
from realbench.runtime.realloc import bytes_received, plan_transfers
from realbench.models.shards import param_specs, tp_range

SPEC = get_model("llama-tiny")
# a head tied to the embedding, with another rotary base and norm epsilon than the defaults
TIED = SPEC.model_copy(update={"name": "llama-tiny-tied", "tie_embeddings": True, "rope_theta": 5e5,
                               "norm_eps": 1e-6})


def test_layout_coordinates():
    lay = Layout.on([4, 5, 6, 7, 8, 9, 10, 11], dp=2, tp=2, pp=2)
    assert lay.coord(4) == Coord(0, 0, 0) and lay.coord(5) == Coord(0, 1, 0)
    assert lay.coord(6) == Coord(1, 0, 0) and lay.coord(8) == Coord(0, 0, 1)
    assert lay.coord(3) is None
    assert lay.tp_group(Coord(1, 0, 1)) == (10, 11)
    assert lay.dp_group(Coord(0, 1, 0)) == (5, 7)
    assert lay.pp_group(Coord(1, 1, 0)) == (7, 11)
    assert all(lay.rank_of(lay.coord(r)) == r for r in lay.ranks)
    with pytest.raises(ValueError):
        Layout.on([0, 1, 2], 2, 1, 1)


def test_transfers_cover_each_destination_exactly_once():
    """For every destination rank and every tensor its stage stores, the transfers (local copies
    included) tile its tp range exactly, each from a rank that holds that range in the source."""
    from realbench.models.shards import in_stage, tied_aliases

    rng = random.Random(0)
    pairs = [(spec, random_layout(rng, 4), random_layout(rng, 4)) for _ in range(40) for spec in (SPEC, TIED)]
    for spec, src, dst in pairs:
        by_dest = {}
        for t in plan_transfers(spec, src, dst):
            by_dest.setdefault((t.dst, t.name), []).append(t)
        specs = {p.name: p for p in param_specs(spec)}
        expected = set()
        for c in dst.coords():
            r = dst.rank_of(c)
            for p in param_specs(spec):
                if not in_stage(p, spec.n_layers, dst.dims.pp, c.pp, dst.dims.v) or p.name in tied_aliases(spec, dst.dims.pp):
                    continue
                expected.add((r, p.name))
                ts = sorted(by_dest.get((r, p.name), []), key=lambda t: t.lo)
                assert ts, (src, dst, r, p.name)  # nothing a destination stores is left unfilled
                lo, hi = tp_range(p, dst.dims.tp, c.tp)
                assert ts[0].lo == lo and ts[-1].hi == hi and all(a.hi == b.lo for a, b in zip(ts, ts[1:]))
                for t in ts:  # the sender holds what it sends, where the transfer says
                    sc = src.coord(t.src)
                    assert sc is not None and in_stage(specs[t.name], spec.n_layers, src.dims.pp, sc.pp, src.dims.v)
                    have_lo, have_hi = tp_range(p, src.dims.tp, sc.tp)
                    assert have_lo <= t.lo < t.hi <= have_hi and t.src_lo == t.lo - have_lo and t.dst_lo == t.lo - lo
        assert set(by_dest) == expected, (src, dst)  # and nothing else is sent
    # identical layouts move nothing
    a = Layout.on(range(4), 1, 2, 2)
    assert bytes_received(plan_transfers(SPEC, a, a), SPEC) == {}


def _parity_worker(rank, world, spec, layouts, rows=4, micro_batches=2):
    full = init_full_weights(spec, seed=1)
    torch.manual_seed(0)
    tokens = torch.randint(0, spec.vocab, (rows, 12))
    ref = LlamaStage(spec)
    ref.load_full(full)
    ref_logits = ref(tokens)
    ref_logits.float().pow(2).mean().backward()
    ref_grads = {k: p.grad for k, p in ref.named_parameters()}
    groups = Groups()
    groups.prepare(layouts)
    from realbench.runtime.engine import PlacedModel

    report = []
    for lay in layouts:
        if lay.coord(rank) is None:
            report.append(None)
            continue
        m = PlacedModel(spec, lay, rank, groups)
        m.stage.load_full(full)
        c = m.coord
        dp = lay.dims.dp
        mine = tokens.chunk(dp)[c.dp]
        mbs = list(mine.chunk(micro_batches))
        assert len(mbs) == min(micro_batches, len(mine))  # a replica of fewer rows runs one per row
        outs = m.forward(mbs)
        err = None
        if outs is not None:
            err = float((torch.cat(outs) - ref_logits.detach().chunk(dp)[c.dp]).abs().max())
        # gradients: the same mean-squared loss over the whole batch
        n_total = ref_logits.numel()
        m.forward_backward(mbs, lambda i, y: y.float().pow(2).sum() / n_total * dp)
        gerr = 0.0
        specs = {p.name: p for p in param_specs(spec)}
        for name, p in m.stage.named_parameters():
            # a tied head on its own stage carries the summed gradient of the one matrix
            g = ref_grads["embed.weight" if name == "head.weight" and spec.tie_embeddings else name]
            s = specs[name]
            if s.split is not None:
                a, b = tp_range(s, lay.dims.tp, c.tp)
                g = g.narrow(s.split, a, b - a)
            gerr = max(gerr, float((p.grad - g).abs().max() / (g.abs().max() + 1e-12)))
        # activation checkpointing recomputes the same forward: the same gradients
        plain = {k: p.grad.clone() for k, p in m.stage.named_parameters()}
        for p in m.stage.parameters():
            p.grad = None
        m.forward_backward(mbs, lambda i, y: y.float().pow(2).sum() / n_total * dp, checkpointing=True)
        ckpt_err = max(float((p.grad - plain[k]).abs().max()) for k, p in m.stage.named_parameters())
        report.append((err, gerr, sorted(k for k, _ in m.stage.named_parameters()), ckpt_err))
    return report


def _on_each_layout(rank, cases, prompts, fn, spec=SPEC, seed=3):
    """fn(coordinates, model, micro-batches, this rank's share of `prompts`) on every (layout,
    micro-batches) case with the model placed on this rank (weights from `seed`); None where the
    rank is not in the layout."""
    from realbench.runtime.engine import PlacedModel

    full = init_full_weights(spec, seed=seed)
    groups = Groups()
    groups.prepare([lay for lay, _ in cases])
    out = []
    for lay, m in cases:
        c = lay.coord(rank)
        if c is None:
            out.append(None)
            continue
        model = PlacedModel(spec, lay, rank, groups)
        model.stage.load_full(full)
        out.append(fn(c, model, m, prompts.chunk(lay.dims.dp)[c.dp]))
    return out


def _generation_worker(rank, world, cases):
    from realbench.runtime.engine import generate

    torch.manual_seed(1)

    def both(c, model, m, mine):
        greedy = generate(model, mine, 6, greedy=True, micro_batches=m)
        rows = torch.arange(4).chunk(model.layout.dims.dp)[c.dp]  # the global rows this replica samples
        sampled = generate(model, mine, 6, key=7, micro_batches=m, rows=rows)
        # plain lists: tensors would go through shared memory that ends with this process
        return c.dp, [t.tolist() for t in greedy], [t.tolist() for t in sampled]

    return _on_each_layout(rank, cases, torch.randint(0, SPEC.vocab, (4, 5)), both)


def test_generation_on_any_layout_matches_the_unsharded_model():
    """Greedy decoding with KV caches, pipelined over micro-batches, on tp/pp/dp layouts gives the
    tokens and log-probabilities of the unsharded model recomputed without a cache; sampling with
    the same key gives the same sequences whatever the dp, tp, pp and micro-batches."""
    world = 4
    cases = [(Layout.on(range(4), 1, 1, 4), 1), (Layout.on(range(4), 1, 1, 4), 2), (Layout.on(range(4), 1, 1, 4), 4),
             (Layout.on(range(4), 1, 2, 2), 2), (Layout.on(range(4), 2, 1, 2), 2), (Layout.on([1, 3], 1, 1, 2), 2),
             (Layout.on([0], 1, 1, 1), 2), (Layout.on(range(4), 2, 2, 1), 1)]
    results = spawn(_generation_worker, world, cases)
    full = init_full_weights(SPEC, seed=3)
    ref = LlamaStage(SPEC)
    ref.load_full(full)
    torch.manual_seed(1)
    seqs = torch.randint(0, SPEC.vocab, (4, 5))
    ref_lps = []
    with torch.no_grad():
        for _ in range(6):
            logp = torch.log_softmax(ref(seqs)[:, -1].float(), -1)
            token = logp.argmax(-1)
            ref_lps.append(logp.gather(-1, token[:, None]))
            seqs = torch.cat([seqs, token[:, None]], 1)
    ref_lps = torch.cat(ref_lps, 1)
    sampled_by = {}
    for ci, (lay, m) in enumerate(cases):
        for rank in lay.ranks:  # every rank of the pipeline returns the whole result
            dp, (g_seqs, g_lps), sampled = results[rank][ci]
            g_seqs, g_lps, sampled = torch.tensor(g_seqs), torch.tensor(g_lps), [torch.tensor(t) for t in sampled]
            rows = slice(dp * 4 // lay.dims.dp, (dp + 1) * 4 // lay.dims.dp)
            assert torch.equal(g_seqs, seqs[rows]), (lay, m, rank)
            assert torch.allclose(g_lps, ref_lps[rows], atol=1e-5), (lay, m, rank)
            sampled_by.setdefault((lay, m), {})[rows.start] = sampled[0]
    # sampling draws per global row: every layout and micro-batch split samples the same rows
    whole = [torch.cat([parts[k] for k in sorted(parts)]) for parts in sampled_by.values()]
    assert len(whole) == len(cases) and all(w.shape == (4, 11) for w in whole)
    assert all(torch.equal(w, whole[0]) for w in whole), [w[:, 5:].tolist() for w in whole]
    assert not torch.equal(whole[0], seqs)  # sampled, not greedy


@pytest.mark.parametrize("world,spec", [(2, SPEC), (4, SPEC), (4, TIED)])
def test_layout_parity_with_unsharded_model(world, spec):
    """Logits and gradients of every shard equal the unsharded model's (a tied head's copy on
    the last stage gets the gradient of the one matrix: embedding and head uses summed), with
    and without activation checkpointing."""
    # llama-tiny has 2 KV heads, so tp is at most 2
    dims = [(1, 1, world), (world, 1, 1), (1, 2, world // 2), (world // 2, 1, 2), (world // 2, 2, 1)]
    layouts = list(dict.fromkeys(Layout.on(range(world), *d) for d in dims))
    if world == 4:
        layouts.append(Layout.on([2, 3], 1, 2, 1))  # a mesh that is a part of the world
        # a mesh listing its ranks out of order: the last stage's tp ranks 0 and 1 are global ranks
        # 3 and 1, which torch's group numbers the other way round (the gathered logits follow tp order)
        layouts.append(Layout.on([0, 2, 3, 1], 1, 2, 2))
    results = spawn(_parity_worker, world, spec, layouts)
    checked = 0
    for li, lay in enumerate(layouts):
        for rank in lay.ranks:
            err, gerr, names, ckpt_err = results[rank][li]
            assert ckpt_err < 1e-6, (lay, rank, ckpt_err)
            if err is not None:
                assert err < 1e-5, (lay, rank, err)
                checked += 1
            assert gerr < 1e-4, (lay, rank, gerr)
            if spec.tie_embeddings and lay.dims.pp == 1:
                assert "head.weight" not in names  # one tensor for both uses
            elif lay.coord(rank).pp == lay.dims.pp - 1:
                assert "head.weight" in names
    assert checked >= len(layouts)  # the last stage of every layout compared its logits


def test_a_pipeline_runs_more_micro_batches_than_sixteen():
    """pp 2 with 24 micro-batches of one row (any count that divides the batch is a plan's to
    choose): logits and gradients equal the unsharded model's."""
    lay = Layout.on(range(2), 1, 1, 2)
    for rank, (err, gerr, _, ckpt_err) in enumerate(r[0] for r in spawn(_parity_worker, 2, SPEC, [lay], 24, 24)):
        assert gerr < 1e-4 and ckpt_err < 1e-6, (rank, gerr, ckpt_err)
        assert (err is not None) == (rank == 1) and (err is None or err < 1e-5)


def _schedule_worker(rank, world, spec, cases):
    """For each (plain layout, interleaved layout, micro-batches, checkpointing), on 16 rows: the
    loss and the gradients of the first replica's shards, by (name, tp rank), under the plain
    schedule and under the interleaved one (None where the rank holds nothing)."""
    torch.manual_seed(2)
    tokens = torch.randint(0, spec.vocab, (16, 10))
    tokens[1, 7:] = -1  # a row that ended early: its padding is trimmed as in a run

    def train(c, model, how, mine):
        m, checkpointing = how
        loss = model.forward_backward(list(mine.chunk(m)), lambda i, y: y.float().pow(2).mean() * (i + 1), checkpointing)
        if c.dp:
            return None, {}
        return loss, {(name, c.tp): p.grad.tolist() for name, p in model.stage.named_parameters()}

    runs = [(lay, (m, checkpointing)) for plain, interleaved, m, checkpointing in cases
            for lay in (plain, interleaved, Layout.on(range(plain.dims.dp * plain.dims.tp), plain.dims.dp,
                                                      plain.dims.tp, 1))]
    return _on_each_layout(rank, runs, tokens, train, spec, seed=5)


def test_the_interleaved_schedule_trains_as_the_plain_one_on_random_layouts():
    """Virtual pipeline stages (each rank holds v chunks of layers, round robin; a micro-batch goes
    round the pipeline v times) give the plain pipeline's loss and gradients to 1e-6, and the
    plain pipeline (1F1B) gives the ones of the same dp x tp without a pipeline (whose order of
    passes 1F1B does not change), on random (dp, tp, pp, v, micro-batches, checkpointing) layouts
    of 4 processes and an 8-layer model, each chunk holding the layers the shard layout says."""
    from realbench.models.shards import in_stage

    spec = SPEC.model_copy(update={"name": "llama-tiny-8", "n_layers": 8})
    rng = random.Random(4)
    cases = []
    for pp, v in rng.sample([(2, 2), (2, 4), (4, 2), (2, 2)], 3):
        tp = rng.choice([t for t in (1, 2) if (4 // pp) % t == 0])
        dp = 4 // pp // tp
        m = pp * rng.choice([1, 2])
        cases.append((Layout.on(range(4), dp, tp, pp), Layout.on(range(4), dp, tp, pp, v), m, rng.random() < 0.5))
    results = spawn(_schedule_worker, 4, spec, cases)
    for ci, (plain, interleaved, m, _) in enumerate(cases):
        losses, grads = [None, None, None], [{}, {}, {}]
        for rank in range(4):
            for side in (0, 1, 2):
                got = results[rank][3 * ci + side]
                if got is not None:
                    losses[side] = got[0] if got[0] is not None else losses[side]
                    grads[side].update(got[1])
        for side in (1, 2):  # interleaved, and no pipeline, against the plain pipeline
            assert losses[0] is not None and losses[side] == pytest.approx(losses[0], rel=1e-6, abs=1e-9), (plain, side)
            assert grads[0].keys() == grads[side].keys()  # every shard of the first replica, under both
            for key, g in grads[0].items():
                a, b = torch.tensor(g), torch.tensor(grads[side][key])
                assert float((a - b).abs().max()) <= 1e-6 * max(1.0, float(a.abs().max())), (plain, side, key)
        assert {name for name, _ in grads[0]} == {p.name for p in param_specs(spec)}
        # stage j holds chunks j, j + pp, ...: layer 0 on stage 0 and layer 8 / (pp v) on stage 1
        d = interleaved.dims
        layer = {p.layer: p for p in param_specs(spec) if p.layer >= 0}
        assert in_stage(layer[0], 8, d.pp, 0, d.v) and in_stage(layer[8 // (d.pp * d.v)], 8, d.pp, 1, d.v)
        assert in_stage(layer[8 // d.v], 8, d.pp, 0, d.v)  # the second round starts on the first stage


def _realloc_worker(rank, world, pairs):
    from nccl_order import Recorder
    from realbench.runtime.realloc import BoundReallocation, empty_shards, rank_plan, reallocate
    from realbench.models.shards import tied_aliases

    groups = Groups()
    out = []
    for spec, a, b, dtype in pairs:
        full = init_full_weights(spec, seed=2)

        def shards_of(lay, flat):
            c = lay.coord(rank)
            if c is None:
                return {}
            st = LlamaStage(spec, lay.dims.tp, c.tp, lay.dims.pp, c.pp, dtype=dtype, v=lay.dims.v)
            st.load_full(full)
            # a stage's own tensors are views of its flat buffer (messages in place); clones are not
            return dict(st.state_dict()) if flat else {k: v.clone() for k, v in st.state_dict().items()}

        start = shards_of(a, flat=True)
        recorder = Recorder().install()  # what is actually posted, message by message
        try:
            moved = reallocate(spec, a, b, start, rank, dtype=dtype)  # into fresh flat tensors
        finally:
            recorder.uninstall()
        sent = {}
        for e in recorder.entries:
            for op in e.ops:
                if op.kind == "send":
                    sent[op.peer] = sent.get(op.peer, 0) + op.numel
        expect = shards_of(b, flat=False)
        ok_b = moved.keys() == expect.keys() and all(torch.equal(moved[k], expect[k]) for k in expect)
        # back into tensors that already exist (as a worker's placed model), filled with garbage:
        # once into separate tensors (every message staged), once into a flat buffer
        ok_round = True
        separate = {k: torch.full_like(v, float("nan")) for k, v in start.items()}
        if a.coord(rank) is not None:
            for alias, target in tied_aliases(spec, a.dims.pp).items():  # one tensor, two names
                separate[alias] = separate[target]
        for into in (separate, empty_shards(spec, a, rank, dtype)):
            for v in into.values():
                v.fill_(float("nan"))
            back = reallocate(spec, b, a, moved, rank, out=into, dtype=dtype)
            ok_round = ok_round and back.keys() == start.keys() and all(torch.equal(back[k], start[k]) for k in start)
            ok_round = ok_round and all(back[k] is into[k] for k in into)
        # between flat buffers, a message that lies in order on both sides is copied by nobody
        staged = BoundReallocation(rank_plan(spec, a, b, rank), start, empty_shards(spec, b, rank, dtype),
                                   dtype).staged_values
        out.append((ok_b and ok_round, staged, sent))
    del groups
    return out


def random_layout(rng, world):
    size = rng.choice([s for s in (1, 2, 4) if s <= world])
    start = rng.randrange(0, world - size + 1)
    ranks = list(range(start, start + size))
    if rng.random() < 0.3:
        rng.shuffle(ranks)  # meshes need not be in rank order at this level
    options = [(dp, tp, size // dp // tp) for dp in (1, 2, 4) for tp in (1, 2)
               if size % (dp * tp) == 0 and size // dp // tp <= SPEC.n_layers]
    dp, tp, pp = rng.choice(options)
    v = 2 if pp == 2 and rng.random() < 0.3 else 1  # a train layout of the interleaved schedule
    return Layout.on(ranks, dp, tp, pp, v)


# A sender may read a message straight from its flat buffer with gaps of at most 1/8 of the
# span (realloc.MAX_GAP_FRACTION): at most 8/7 of the values needed travel.
MAX_SENT_PER_NEEDED = 8 / 7


@pytest.mark.parametrize("world", [2, 4])
def test_realloc_round_trip_is_bit_identical_and_sends_only_what_is_needed(world):
    """A -> B -> A is bit-identical on random layout pairs (tied and untied heads, fp32 and bf16), and the
    messages actually posted carry, between every pair of ranks, the values the destination
    needs from that sender (plus at most the gap allowance), and nothing between other pairs."""
    from realbench.runtime.realloc import _numel

    rng = random.Random(world)
    pairs = [(spec, random_layout(rng, world), random_layout(rng, world), torch.float32)
             for _ in range(20) for spec in (SPEC, TIED)]
    pairs += [(SPEC, random_layout(rng, world), random_layout(rng, world), torch.bfloat16) for _ in range(6)]
    results = spawn(_realloc_worker, world, pairs)
    for rank in range(world):
        assert all(r[0] for r in results[rank]), [p for p, r in zip(pairs, results[rank]) if not r[0]]
    compared = 0
    for i, (spec, a, b, _) in enumerate(pairs):
        if a.dims == b.dims and set(a.ranks).isdisjoint(b.ranks):  # same layout, another mesh
            assert all(results[r][i][1] == 0 for r in range(world)), (a, b)
        # values each destination needs from each sender: its shard of layout B, less what it
        # holds itself, split by the sender the transfer list names
        specs = {p.name: p for p in param_specs(spec)}
        needed = {}
        for t in plan_transfers(spec, a, b):
            if t.src != t.dst:
                n = _numel(shard_shape_of(specs[t.name]), t.split, t.hi - t.lo)
                needed[(t.src, t.dst)] = needed.get((t.src, t.dst), 0) + n
        posted = {(r, peer): n for r in range(world) for peer, n in results[r][i][2].items()}
        assert set(posted) == set(needed), (a, b, sorted(posted), sorted(needed))
        for pair, n in needed.items():
            assert n <= posted[pair] <= MAX_SENT_PER_NEEDED * n, (spec.name, a, b, pair, posted[pair], n)
            compared += 1
        # and no destination receives more than its shard of layout B (a check that does not
        # rely on the transfer list)
        for r in b.ranks:
            c = b.coord(r)
            shard = sum(n for k, n in _stage_numel(spec, b, c).items())
            assert sum(n for (s, d), n in posted.items() if d == r) <= MAX_SENT_PER_NEEDED * shard
    assert compared >= len(pairs) // 2  # the pairs moved data between many pairs of ranks


def shard_shape_of(p):
    """The full tensor's shape: transfer ranges index the full tensor along `split`."""
    return p.shape


def _stage_numel(spec, layout, coord):
    from realbench.models.shards import flat_offsets, in_stage, shard_shape, tied_aliases

    out = {}
    for p in param_specs(spec):
        if in_stage(p, spec.n_layers, layout.dims.pp, coord.pp, layout.dims.v) and p.name not in tied_aliases(spec, layout.dims.pp):
            n = 1
            for d in shard_shape(p, layout.dims.tp):
                n *= d
            out[p.name] = n
    assert sum(out.values()) == flat_offsets(spec, layout.dims.tp, layout.dims.pp, coord.pp, layout.dims.v)[1]
    return out


def test_each_pair_of_ranks_exchanges_one_message_read_and_written_in_place_where_it_lies_in_order():
    from realbench.runtime.realloc import rank_plan

    # tp2 -> tp1 on the same two ranks: each rank sends its half of every matrix in one message,
    # straight from its flat buffer (the shards lie there in order, with gaps for the norms it
    # does not send); the receiver's halves interleave with its own, so it copies them out
    a, b = Layout.on([0, 1], 1, 2, 1), Layout.on([0, 1], 2, 1, 1)
    for rank in (0, 1):
        plan = rank_plan(SPEC, a, b, rank)
        assert [m.peer for m in plan.sends] == [1 - rank] and [m.peer for m in plan.recvs] == [1 - rank]
        assert plan.sends[0].in_place_at is not None and plan.recvs[0].in_place_at is None
        assert len(plan.sends[0].slices) > 10
    # pp2 -> pp2 on another mesh: whole stages, in place on both sides
    plan = rank_plan(SPEC, Layout.on([0, 1], 1, 1, 2), Layout.on([2, 3], 1, 1, 2), 0)
    assert [m.peer for m in plan.sends] == [2] and plan.sends[0].in_place_at == 0
    plan = rank_plan(SPEC, Layout.on([0, 1], 1, 1, 2), Layout.on([2, 3], 1, 1, 2), 3)
    assert [m.peer for m in plan.recvs] == [1] and plan.recvs[0].in_place_at == 0


def test_bench_realloc_quick(cli):
    import json

    code, out, err = cli("bench", "realloc", "--quick", "--json")
    assert code == 0, err
    r = json.loads(out)
    moving = [p for p in r["pairs"] if p["bytes"] > 0]
    assert len(moving) >= 3 and all(p["seconds"] > 0 and p["broadcast_seconds"] > 0 for p in moving)
    assert r["median_ratio"] > 0 and "meets_target" in r
    n = r["nproc"]
    assert all(0 < p["messages"] <= n * (n - 1) for p in moving)  # at most one per ordered pair of ranks
    assert all(0 <= p["bytes"] - p["broadcast_bytes"] < 4 * n for p in moving)  # the same bytes, to a value
    disjoint = next(p for p in moving if "disjoint" in p["pair"])
    assert disjoint["staged_bytes"] == 0  # whole stages, flat buffer to flat buffer
    assert all(p["staged_bytes"] <= p["bytes"] * 1.01 for p in moving)  # at most one copy per byte moved


def _exit_on_rank_1(rank, world):
    import os
    import time

    if rank == 1:
        os._exit(3)  # dies without reporting, as a killed process does
    time.sleep(120)


def test_spawn_reports_a_process_that_died_without_a_result_at_once():
    import time

    from realbench.runtime.local import WorkerError

    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="rank 1 exited with status 3"):
        spawn(_exit_on_rank_1, 2, timeout_s=120)
    assert time.monotonic() - t0 < 60  # not after the 150 s the parent would wait for a result


def _environment_variable(rank, world, name):
    import os

    return os.environ.get(name)


def test_spawned_processes_take_the_callers_environment_of_now(monkeypatch):
    """The fork server started with the caller's environment of its first use; a variable set
    after that still reaches the processes (a test's cache folder, a user's CUDA_VISIBLE_DEVICES
    set in a notebook)."""
    spawn(_environment_variable, 1, "REALBENCH_TEST_VARIABLE")  # the server runs from here on
    monkeypatch.setenv("REALBENCH_TEST_VARIABLE", "set after the server started")
    assert spawn(_environment_variable, 2, "REALBENCH_TEST_VARIABLE") == ["set after the server started"] * 2
    monkeypatch.delenv("REALBENCH_TEST_VARIABLE")
    assert spawn(_environment_variable, 1, "REALBENCH_TEST_VARIABLE") == [None]


def _padded_generation_worker(rank, world, layouts, prompts, eos):
    from realbench.runtime.engine import generate

    def greedy(c, model, m, mine):
        seqs, lps = generate(model, mine, 7, greedy=True, micro_batches=m, eos=eos)
        return c.dp, seqs.tolist(), lps.tolist()

    return _on_each_layout(rank, layouts, prompts, greedy)


def test_generation_of_left_padded_prompts_stops_at_eos_on_any_layout():
    """Prompts of 2 to 6 tokens, left-padded to 6: greedy generation on tp/pp/dp layouts,
    pipelined over micro-batches, gives each row what the unsharded model gives its prompt
    alone, up to and including the end-of-sequence token, and -1 after it."""
    ref = LlamaStage(SPEC)
    ref.load_full(init_full_weights(SPEC, seed=3))
    torch.manual_seed(5)
    lengths = [6, 2, 4, 3]
    rows = [torch.randint(0, SPEC.vocab, (n,)) for n in lengths]
    alone = []
    with torch.no_grad():
        for r in rows:
            seq = r[None]
            for _ in range(7):
                seq = torch.cat([seq, ref(seq)[:, -1].argmax(-1, keepdim=True)], 1)
            alone.append(seq[0, len(r):].tolist())
    eos = alone[1][2]  # a token row 1 emits third: rows stop at different steps
    prompts = torch.full((4, 6), -1)
    for i, r in enumerate(rows):
        prompts[i, 6 - len(r):] = r
    layouts = [(Layout.on(range(4), 1, 1, 4), 2), (Layout.on(range(4), 1, 2, 2), 4), (Layout.on(range(4), 2, 1, 2), 1),
               (Layout.on([0, 1], 2, 1, 1), 1)]
    results = spawn(_padded_generation_worker, 4, layouts, prompts, eos)
    expected = []
    for a in alone:
        stop = a.index(eos) + 1 if eos in a else len(a)
        expected.append(a[:stop] + [-1] * (len(a) - stop))
    assert any(-1 in e for e in expected) and any(-1 not in e for e in expected)  # some stop, some do not
    for li, (lay, _) in enumerate(layouts):
        for rank in lay.ranks:
            dp, seqs, lps = results[rank][li]
            part = 4 // lay.dims.dp
            for k, seq in enumerate(seqs):
                i = dp * part + k
                assert seq[:6] == prompts[i].tolist() and seq[6:] == expected[i], (lay, rank, i, seq, expected[i])
                assert all(lp == 0.0 for lp, t in zip(lps[k], seq[6:]) if t == -1)


def test_row_draws_are_pcg_hashes_and_sampling_inverts_the_cdf():
    import numpy as np

    from realbench.runtime.engine import _pcg, row_uniforms, sample_rows

    def pcg32(v):  # the reference, in uint32 arithmetic (Jarzynski and Olano 2020, "pcg_hash")
        v = np.uint32(v)
        with np.errstate(over="ignore"):
            state = v * np.uint32(747796405) + np.uint32(2891336453)
            word = ((state >> ((state >> np.uint32(28)) + np.uint32(4))) ^ state) * np.uint32(277803737)
        return int((word >> np.uint32(22)) ^ word)

    values = [0, 1, 2, 12345, 2**31, 2**32 - 1]
    assert _pcg(torch.tensor(values)).tolist() == [pcg32(v) for v in values]
    u = row_uniforms(5, torch.tensor([0, 1, 2]), 3)
    expected = [(pcg32(pcg32(pcg32(5) ^ r) ^ 3) + 0.5) / 2**32 for r in (0, 1, 2)]
    assert u.tolist() == pytest.approx(expected, abs=0, rel=1e-15)
    probs = torch.tensor([[0.2, 0.5, 0.3]] * 4)
    # cumulative 0.2, 0.7, 1.0: u below 0.2 -> 0, up to 0.7 -> 1, above -> 2
    assert sample_rows(probs, torch.tensor([0.1, 0.25, 0.69, 0.71], dtype=torch.float64)).tolist() == [0, 1, 1, 2]


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_a_resumed_or_moved_optimizer_keeps_its_step_count_where_torch_keeps_it(device):
    """After a resume or a plan switch writes the moments (`moved_in`), Adam's step count lies
    where torch.optim.Adam puts it: on the GPU for the fused CUDA kernel, which refused a count
    on the CPU (every CUDA resume failed so, seen on an H100); the update then equals the
    uninterrupted one's, and both equal torch.optim.Adam's, bit for bit."""
    from types import SimpleNamespace

    from realbench.runtime.optim import MixedPrecisionAdam

    spec = get_model("llama-tiny")

    def placed(seed):
        torch.manual_seed(seed)
        stage = LlamaStage(spec, device=device, dtype=torch.bfloat16)
        return SimpleNamespace(stage=stage, spec=spec)

    def one_step(opt):
        for p in opt.model.stage.parameters():
            p.grad = torch.ones_like(p)
        opt.step()

    straight, moved = MixedPrecisionAdam(placed(0)), MixedPrecisionAdam(placed(0))
    # torch.optim.Adam itself (its fused kernel) on the same fp32 weights and gradients
    weights = torch.nn.Parameter(straight.master.detach().clone())
    torch_adam = torch.optim.Adam([weights], lr=straight.lr, fused=True)
    weights.grad = torch.ones_like(weights)
    one_step(straight)
    torch_adam.step()
    with torch.no_grad():  # what a resume writes: straight's state after step 1
        for kind, views in moved.state_views().items():
            for name, view in views.items():
                view.copy_(straight.state_views()[kind][name])
    moved.moved_in(1)
    reference = torch_adam.state[weights]["step"]
    step = moved.state["step"]
    assert (step.device, step.dtype, float(step)) == (reference.device, reference.dtype, 1.0)
    one_step(straight)
    one_step(moved)
    torch_adam.step()
    assert torch.equal(straight.master, moved.master) and moved.steps_taken == 2
    assert torch.equal(straight.master, weights) and torch.equal(moved.state["exp_avg_sq"],
                                                                 torch_adam.state[weights]["exp_avg_sq"])


def test_a_calls_measured_time_runs_from_its_last_rank_arriving_to_its_last_leaving():
    """Rank 0 arrives at 10.0 and waits for rank 1 (busy with another call until 10.5) inside
    its call time; the call's own time is 10.5 -> 11.25, what the estimate of a call alone
    prices. Records without spans (older runs) keep the slowest rank's time."""
    from realbench.runtime.launch import summarize

    def step(call_s, span):
        return {"call_s": call_s, "call_span": span, "step_s": 2.0, "reward": None, "loss": None,
                "realloc_bytes": 0}

    records = [[step({"gen": 1.25}, {"gen": [10.0, 11.25]})], [step({"gen": 0.7}, {"gen": [10.5, 11.2]})]]
    assert summarize(records, {"gen": 0.5}, 0.0)["calls"]["gen"]["measured_s"] == pytest.approx(0.75)
    for r in records:
        del r[0]["call_span"]
    assert summarize(records, {"gen": 0.5}, 0.0)["calls"]["gen"]["measured_s"] == pytest.approx(1.25)


def test_the_step_order_moves_data_as_soon_as_it_exists_and_keeps_every_dependency():
    """A plan with the trains side by side (actor on ranks 2-3, critic on 0-1) and the
    inferences on single processes: in the dataflow's order ranks 2-3 would run the actor's
    train before sending the critic's train its inputs (the critic then waits for the actor's
    whole train); the step order sends first. Every event keeps its dependencies."""
    from realbench.plan import load_scenario
    from realbench.runtime.worker import Event, step_order

    df = load_scenario("ppo-tiny-cpu").dataflow
    calls = [df.call(n) for n in df.order]
    gen, reward, ref, critic, actor_train, critic_train = range(6)
    every, inputs = frozenset(range(4)), tuple((p, ("x",)) for p in (gen, reward, ref, critic))
    events = [Event("realloc", gen, every), Event("call", gen, every),
              Event("transfer", reward, every, ((gen, ("seqs",)),)), Event("call", reward, frozenset({3})),
              Event("transfer", ref, every, ((gen, ("seqs",)),)), Event("call", ref, frozenset({2})),
              Event("realloc", critic, frozenset({0, 1})), Event("transfer", critic, every, ((gen, ("seqs",)),)),
              Event("call", critic, frozenset({0, 1})),
              Event("transfer", actor_train, every, inputs), Event("call", actor_train, frozenset({2, 3})),
              Event("transfer", critic_train, every, inputs), Event("call", critic_train, frozenset({0, 1}))]
    order = step_order(events, calls)
    assert sorted(map(id, order)) == sorted(map(id, events))
    at = {(e.kind, e.call): k for k, e in enumerate(order)}
    assert at[("transfer", critic_train)] < at[("call", actor_train)]  # was after it
    for e in order:
        k = at[(e.kind, e.call)]
        if e.kind == "transfer":
            assert all(at[("call", p)] < k for p, _ in e.sources)
        if e.kind == "call":
            assert all(at[(kind, e.call)] < k for kind in ("transfer", "realloc") if (kind, e.call) in at)
    # the actor's weights: moved to the generation layout and read there before its train updates them
    assert at[("realloc", gen)] < at[("call", gen)] < at[("call", actor_train)]
    assert at[("realloc", critic)] < at[("call", critic)] < at[("call", critic_train)]


def _busy_worker(rank, world):
    import torch.distributed as dist

    from realbench.runtime.profiler import _keep_busy

    if rank == 0:  # measures something for a while, then lets the other stop
        time.sleep(0.3)
        dist.send(torch.ones(1), 1)
        return None
    start = time.perf_counter()
    rounds = _keep_busy(rank, "cpu")
    return rounds, time.perf_counter() - start


def test_a_process_outside_a_measured_group_computes_until_told_to_stop():
    """While the profiler times an exchange among some processes, the others compute (as a run's
    other calls keep them busy) and stop when rank 0 says so: not before, and not never (gloo's
    receive cannot be polled, which once left them computing forever)."""
    _, (rounds, waited) = spawn(_busy_worker, 2, timeout_s=60)
    assert rounds > 0 and waited >= 0.25
