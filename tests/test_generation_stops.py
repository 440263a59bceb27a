"""Generation that stops: finished rows leave the decode batch, their KV-cache rows go, and a
micro-batch whose rows all ended stops, on every layout; the samples and log-probabilities are
the full-length loop's, and the pipeline's message order stays safe on NCCL however differently
the micro-batches end."""

import random

import pytest
import torch

from nccl_order import Recorder, replay
from test_runtime_core import _on_each_layout
from realbench.models import get_model
from realbench.runtime.layout import Groups, Layout
from realbench.runtime.local import spawn
from realbench.runtime.model import init_full_weights

SPEC = get_model("llama-tiny")
ROWS, WIDTH, GEN = 8, 6, 10
# a twelfth of the vocabulary ends a row: with the random model's nearly uniform next-token
# distribution, these prompts' responses have 1 to 10 tokens (8, 10, 7, 1, 5, 1, 10, 3)
EOS = tuple(range(0, SPEC.vocab, 12))
KEY = 11

# pipelines of 2 and 4 stages with fewer micro-batches than stages, as many, and more
PIPELINES = [(2, 1), (2, 2), (2, 4), (4, 2), (4, 4), (4, 8)]


def _prompts():
    torch.manual_seed(5)
    prompts = torch.full((ROWS, WIDTH), -1)
    for i, n in enumerate([6, 2, 4, 3, 5, 6, 1, 4]):
        prompts[i, WIDTH - n:] = torch.randint(0, SPEC.vocab, (n,))
    return prompts


def _cases(seed: int = 0):
    """(layout, micro-batches): every pipeline of PIPELINES, then random tp/pp/dp layouts on up
    to 4 processes."""
    rng = random.Random(seed)
    cases = [(Layout.on(range(pp), 1, 1, pp), m) for pp, m in PIPELINES]
    while len(cases) < len(PIPELINES) + 5:
        dp, tp, pp = rng.choice([1, 2, 4]), rng.choice([1, 2]), rng.choice([1, 2, 4])
        if dp * tp * pp > 4 or dp * tp * pp == 1:
            continue
        m = rng.choice([d for d in (1, 2, 4) if ROWS // dp % d == 0])
        cases.append((Layout.on(range(dp * tp * pp), dp, tp, pp), m))
    return cases


def _stopping_worker(rank, world, cases, prompts):
    """Each case's samples on this rank, and the distributed calls it issued (for the replay)."""
    from realbench.runtime.engine import generate

    def sampled(c, model, m, mine):
        rows = torch.arange(ROWS).chunk(model.layout.dims.dp)[c.dp]
        seqs, lps = generate(model, mine, GEN, key=KEY, temperature=0.7, micro_batches=m, eos=EOS, rows=rows)
        return c.dp, seqs.tolist(), lps.tolist()

    recorder = Recorder().install()
    try:
        return (_on_each_layout(rank, cases, prompts, sampled), _on_each_layout(rank, cases, _responses(), _trained),
                recorder.entries)
    finally:
        recorder.uninstall()


def _responses() -> torch.Tensor:
    """Left-padded prompts, then responses of 8, 10, 7, 1, 5, 1, 10 and 3 tokens right-padded to GEN."""
    torch.manual_seed(6)
    seqs = torch.cat([_prompts(), torch.randint(0, SPEC.vocab, (ROWS, GEN))], 1)
    for i, n in enumerate([8, 10, 7, 1, 5, 1, 10, 3]):
        seqs[i, WIDTH + n:] = -1
    return seqs


def _masked_loss(y, tokens, rows):
    """The mean square of the outputs at the tokens (not the padding), over `rows` rows."""
    return (y.float().pow(2).sum(-1) * (tokens >= 0)).sum() / rows


def _trained(c, model, m, mine):
    """Forward and backward of this replica's share of _responses() in m micro-batches: the
    positions each micro-batch computed, and the largest relative error of its loss and
    gradients against one process on the whole untrimmed batch."""
    from realbench.runtime.model import LlamaStage
    from realbench.models.shards import param_specs, tp_range

    batch, dp = _responses(), model.layout.dims.dp
    ref = LlamaStage(SPEC)
    ref.load_full(init_full_weights(SPEC, seed=3))
    valid = batch >= 0
    ref_loss = _masked_loss(ref(batch, valid=valid), batch, ROWS)
    ref_loss.backward()
    widths = []
    hook = model.stage.register_forward_pre_hook(lambda module, args: widths.append(args[0].shape[1]))
    mbs = list(mine.chunk(m))
    loss = model.forward_backward(mbs, lambda i, y: _masked_loss(y, mbs[i], ROWS) * dp)
    hook.remove()
    specs = {p.name: p for p in param_specs(SPEC)}
    err = 0.0
    for name, p in model.stage.named_parameters():
        g = dict(ref.named_parameters())[name].grad
        if specs[name].split is not None:
            lo, hi = tp_range(specs[name], model.layout.dims.tp, c.tp)
            g = g.narrow(specs[name].split, lo, hi - lo)
        err = max(err, float((p.grad - g).abs().max() / (g.abs().max() + 1e-12)))
    return c.dp, widths, loss, float(ref_loss), err


def _single_process(prompts, drop_finished, temperature=0.7):
    from realbench.runtime.engine import PlacedModel, generate

    lay = Layout.on([0], 1, 1, 1)
    model = PlacedModel(SPEC, lay, 0, Groups())
    model.stage.load_full(init_full_weights(SPEC, seed=3))
    return generate(model, prompts, GEN, key=KEY, temperature=temperature, eos=EOS, drop_finished=drop_finished)


@pytest.fixture(scope="module")
def stopped_runs():
    return spawn(_stopping_worker, 4, _cases(), _prompts())


def test_a_single_process_that_drops_finished_rows_equals_the_full_length_loop():
    prompts = _prompts()
    full_seqs, full_lps = _single_process(prompts, drop_finished=False)
    seqs, lps = _single_process(prompts, drop_finished=True)
    response = full_seqs[:, WIDTH:]
    lengths = (response >= 0).sum(1).tolist()
    # the rows end at different steps: some early, some at the cap
    assert len(set(lengths)) >= 4 and min(lengths) <= 3 and max(lengths) == GEN, lengths
    for i, n in enumerate(lengths):  # each row ends with an end-of-sequence token, or at the cap
        assert n == GEN or int(response[i, n - 1]) in EOS
        assert not any(int(t) in EOS for t in response[i, :n - 1])
    assert torch.equal(seqs, full_seqs)
    own = response >= 0
    assert torch.allclose(lps[own], full_lps[own], atol=1e-6, rtol=0)
    assert bool((lps[~own] == 0).all()) and bool((seqs[:, WIDTH:][~own] == -1).all())


def test_every_layout_gives_the_full_length_loops_samples_and_log_probabilities(stopped_runs):
    """Random tp/pp/dp layouts with micro-batches below, at and above pp: the same tokens and,
    on the rows' own tokens, the same log-probabilities (to 1e-6) as one process running every
    row to the last step."""
    prompts = _prompts()
    want_seqs, want_lps = _single_process(prompts, drop_finished=False)
    cases = _cases()
    for k, (lay, m) in enumerate(cases):
        parts = {}
        for rank_out, _, _ in stopped_runs:
            if rank_out[k] is not None:
                dp, seqs, lps = rank_out[k]
                parts.setdefault(dp, (torch.tensor(seqs), torch.tensor(lps)))
        seqs = torch.cat([parts[d][0] for d in sorted(parts)])
        lps = torch.cat([parts[d][1] for d in sorted(parts)])
        assert torch.equal(seqs, want_seqs), (lay.dims, m)
        own = want_seqs[:, WIDTH:] >= 0
        assert float((lps[own] - want_lps[own]).abs().max()) < 1e-6, (lay.dims, m)
        assert bool((lps[~own] == 0).all())


def test_pipelines_whose_micro_batches_end_at_different_steps_replay_on_nccl(stopped_runs):
    traces = [entries for _, _, entries in stopped_runs]
    assert replay(traces) == sum(map(len, traces)) > 0
    # rows left their micro-batches at different steps, and with 4 and 8 micro-batches the
    # micro-batches themselves ended at different steps
    seqs, _ = _single_process(_prompts(), drop_finished=False)
    lengths = (seqs[:, WIDTH:] >= 0).sum(1)
    assert len(set(lengths.tolist())) > 4
    for m in (4, 8):
        assert len({int(chunk.max()) for chunk in lengths.chunk(m)}) > 1


def test_later_calls_process_each_micro_batch_as_wide_as_its_longest_row_with_the_same_losses_and_gradients(
        stopped_runs):
    """Inference and training on generated sequences leave out the columns after a micro-batch's
    longest row (the cost model prices E[max] of its rows, `CallDef.width`): on every layout the
    forward computes exactly those, and the loss and gradients are the untrimmed batch's."""
    lengths = [8, 10, 7, 1, 5, 1, 10, 3]
    narrowest = WIDTH + GEN
    for k, (lay, m) in enumerate(_cases()):
        dp = lay.dims.dp
        losses = {}
        for _, rank_out, _ in stopped_runs:
            if rank_out[k] is None:
                continue
            d, widths, loss, ref_loss, err = rank_out[k]
            rows = [lengths[r] for r in torch.arange(ROWS).chunk(dp)[d].tolist()]
            want = [WIDTH + int(chunk.max()) for chunk in torch.tensor(rows).chunk(m)]
            assert widths == want, (lay.dims, m, widths, want)
            narrowest = min([narrowest, *widths])
            assert err < 1e-5, (lay.dims, m, err)
            if loss is not None:
                losses[d] = loss
        assert sum(losses.values()) / dp == pytest.approx(ref_loss, rel=1e-6), (lay.dims, m)  # each scaled by dp
    assert narrowest <= WIDTH + 3  # micro-batches of short responses were trimmed


def _counting_worker(rank, world, prompts):
    """How many rows each decode step of one process computes, dropping finished rows or not."""
    from realbench.runtime.engine import PlacedModel, generate

    lay = Layout.on([0], 1, 1, 1)
    model = PlacedModel(SPEC, lay, 0, Groups())
    model.stage.load_full(init_full_weights(SPEC, seed=3))
    counts = {}
    for drop in (False, True):
        rows = []
        original = model.stage.forward

        def counting(x, *a, **k):
            rows.append(x.shape[0])
            return original(x, *a, **k)

        model.stage.forward = counting
        generate(model, prompts, GEN, key=KEY, temperature=0.7, eos=EOS, micro_batches=2, drop_finished=drop)
        model.stage.forward = original
        counts[drop] = rows
    return counts


def test_each_decode_step_computes_the_live_rows_only():
    prompts = _prompts()
    (counts,) = spawn(_counting_worker, 1, prompts)
    seqs, _ = _single_process(prompts, drop_finished=False)
    lengths = (seqs[:, WIDTH:] >= 0).sum(1)
    # step t of micro-batch j computes the rows of j whose response is longer than t tokens
    # (step 0 is the prefill of every row); a micro-batch stops after its longest row
    want = [int((chunk > t).sum()) for t in range(GEN) for chunk in lengths.chunk(2) if int((chunk > t).sum())]
    assert counts[True] == want
    assert counts[False] == [ROWS // 2] * (2 * GEN)
    assert sum(counts[True]) < sum(counts[False])
