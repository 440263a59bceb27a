"""`realbench bench runtime`: realbench's model against transformers' on the same weights, batch
and lengths, in one process (fp32 on the CPU; on a GPU its dtype):

  * generation: tokens per second of realbench's `generate` (KV cache, greedy) against
    transformers' `generate` (KV cache, greedy, every sequence made to run its `new_tokens`);
  * generation that stops: the same, with end-of-sequence tokens chosen (`early_ending_eos`) so
    that most greedy responses end early and some run to the cap: tokens per second of the
    responses' own tokens, realbench (finished rows leave the batch) against transformers
    (which stops when every row has ended) and against realbench's full-length loop (every row
    to the cap, `drop_finished=False`);
  * training: tokens per second of a realbench train step (forward, backward, Adam on the
    flat master weights) against a plain transformers forward, backward and AdamW step;
  * continuous batching (`continuous`, see `long_tail`): a long-tailed batch through the rollout
    engine's slots, against the micro-batched loop at the same slots and transformers' static
    batches, with the cost model's estimate beside. Targets: at least 1.5 times the
    micro-batched loop's tokens per second, the estimate within 20% of the measured seconds.

The two are timed in alternation (A B A B ...), and each ratio is the median of the per-round
ratios, so a machine whose speed drifts affects both sides of a round alike. Targets: generation
>= 1.0 (both keep a KV cache: realbench has no reason to be slower), training >= 0.9.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import torch

EARLY = 0.25  # a response "ends early" within this share of the cap


def early_ending_eos(full: "torch.Tensor", at_most: int = 8) -> tuple[list[int], list[int]]:
    """Up to `at_most` token ids that, as end-of-sequence tokens, end most of the greedy
    responses `full` (batch, new_tokens; every row run to the cap) early and leave at least one
    to run to the cap: added greedily, each the one that ends the most rows early of those that
    keep a row at the cap. Returns (ids, each row's length under them)."""
    cap = full.shape[1]
    rows = full.tolist()

    def lengths(ids):
        return [next((t + 1 for t, tok in enumerate(r) if tok in ids), cap) for r in rows]

    chosen: list[int] = []
    for _ in range(at_most):
        best = None
        for tok in sorted({t for r in rows for t in r} - set(chosen)):
            ls = lengths(set(chosen) | {tok})
            if cap not in ls:  # a long tail: one row at least runs to the cap
                continue
            early = sum(n <= EARLY * cap for n in ls)
            if best is None or early > best[0]:
                best = (early, tok)
        if best is None:
            break
        chosen.append(best[1])
        if best[0] * 4 >= len(rows) * 3:  # three in four end early
            break
    return chosen, lengths(set(chosen))


QUICK = {"rounds": 2, "hidden": 256, "layers": 2, "new_tokens": 16, "train_batch": 4, "train_len": 64,
         "tail": {"rows": 64, "slots": 8, "mean": 8, "rounds": 1}}

TARGETS = {"generate_ratio": 1.0, "train_ratio": 0.9}
# the long-tailed workload: continuous batching against the micro-batched loop at the same slots,
# and the estimate of its seconds against the measured
TAIL_TARGETS = {"gain": 1.5, "rel_err": 0.2}
# a replica's share of a GRPO step (32 prompts x 8), 16 slots, log-normal lengths (mean 32, cv 1.25:
# about 1.1 once capped at 8 x the mean), on the shape of the tiny model (where a decode step is
# bound by its per-step work, as a GPU's is by kernel launches), after a 32-token prompt
TAIL = {"rows": 256, "slots": 16, "mean": 32, "cv": 1.25, "prompt": 32, "rounds": 5, "model": "llama-tiny",
        "sync_every": 4}


def tail_lengths(rows: int, mean: float, cv: float, cap: int, seed: int = 0) -> list[int]:
    """`rows` response lengths that follow lognormal(mean, cv) capped at `cap`: the distribution's
    quantiles (i + 1/2) / rows (so a small batch has the tail too), in a seeded order."""
    import numpy as np

    from realbench.dataflow.lengths import LengthDistribution

    cdf = LengthDistribution(dist="lognormal", mean=mean, cv=cv, max=cap).cdf()
    lengths = [max(1, int(np.searchsorted(cdf, (i + 0.5) / rows))) for i in range(rows)]
    np.random.default_rng(seed).shuffle(lengths)
    return lengths


def long_tail(rows: int = TAIL["rows"], slots: int = TAIL["slots"], mean: float = TAIL["mean"], cv: float = TAIL["cv"],
              prompt: int = TAIL["prompt"], rounds: int = TAIL["rounds"], model: str = TAIL["model"],
              sync_every: int = TAIL["sync_every"], device: str = "cpu") -> dict:
    """Generation of a long-tailed batch, each row stopped at its own length (a serving engine's
    per-request max_tokens): realbench's continuous batching in `slots` slots, its micro-batched
    loop in rows / slots micro-batches of that many rows, and transformers' `generate` on batches
    of `slots` rows one after another (each until its longest row), greedy; tokens per second of
    the responses' tokens, timed in alternation, medians. Beside them the cost model's seconds for
    both realbench loops (this machine's profile, one process, the lengths as a distribution)."""
    import numpy as np
    import torch
    import transformers

    from realbench.cost.profiled import profiled_call_times
    from realbench.dataflow import CallDef, CallKind
    from realbench.dataflow.lengths import LengthDistribution
    from realbench.models import get_model
    from realbench.plan.mesh import Mesh, Option, Strategy
    from realbench.runtime.checkpoint import load_hf_checkpoint
    from realbench.runtime.engine import PlacedModel, generate
    from realbench.runtime.layout import Groups, Layout
    from realbench.runtime.profile_cache import machine_profile
    from realbench.runtime.rollout import RolloutEngine

    if rows % slots:
        raise ValueError(f"{rows} rows do not split into micro-batches of {slots}")
    shape = get_model(model)
    cap = int(8 * mean)
    lengths = tail_lengths(rows, mean, cv, cap)
    with tempfile.TemporaryDirectory() as folder:
        hf = _model(folder, shape.hidden, shape.n_layers, shape.vocab, heads=shape.n_heads, kv_heads=shape.n_kv_heads,
                    ffn=shape.ffn)
        spec, weights = load_hf_checkpoint(folder)
    ours = PlacedModel(spec, Layout.on([0], 1, 1, 1), 0, Groups(), device)
    ours.stage.load_full(weights)
    prompts = torch.randint(0, spec.vocab, (rows, prompt), generator=torch.Generator().manual_seed(0))
    limits = torch.tensor(lengths)
    m = rows // slots

    class RowLimits(transformers.StoppingCriteria):
        def __init__(self, own):
            self.own = own

        def __call__(self, input_ids, scores, **kwargs):
            return input_ids.shape[1] - prompt >= self.own

    def continuous():
        return RolloutEngine(ours, prompts, cap, slots, greedy=True, limits=lengths, sync_every=sync_every).run()[0]

    def micro_batched():
        return generate(ours, prompts, cap, greedy=True, limits=limits, micro_batches=m)[0]

    def hf_static():
        out = []
        for part, own in zip(prompts.split(slots), limits.split(slots)):
            out.append(hf.generate(part, attention_mask=torch.ones_like(part), max_new_tokens=cap, do_sample=False,
                                   use_cache=True, pad_token_id=0,
                                   stopping_criteria=transformers.StoppingCriteriaList([RowLimits(own)])))
        return out

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    with torch.no_grad():
        same = torch.equal(continuous(), micro_batched())  # warm-up, and the same tokens
        hf_static()
        times = {"continuous": [], "micro_batched": [], "transformers": []}
        for _ in range(rounds):
            for name, fn in (("continuous", continuous), ("micro_batched", micro_batched), ("transformers", hf_static)):
                times[name].append(timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = sum(lengths)
    profile = machine_profile(2, [spec])
    dist = LengthDistribution.of(lengths, cap)
    call = CallDef(name="generate", model="actor", kind=CallKind.GENERATE, seqs=rows, seq_len=prompt + cap, gen_len=cap,
                   lengths=dist, sync_every=sync_every)
    # one process of a two-process profile: its calls measured alone (the other core idle, as here)
    estimate = profiled_call_times(call, spec, [Option(Mesh(0, 1, 0, 1), Strategy(1, 1, 1, m))], profile, alone=True)[0]
    rel_err = abs(estimate - med["continuous"]) / med["continuous"]
    gain = med["micro_batched"] / med["continuous"]
    return {
        "rows": rows, "slots": slots, "micro_batches": m, "sync_every": sync_every, "prompt_len": prompt, "max_new_tokens": cap,
        "lengths": {"mean": float(np.mean(lengths)), "cv": float(np.std(lengths) / np.mean(lengths)),
                    "max": max(lengths), "tokens": tokens},
        "same_tokens": same,
        "tokens_per_s": {k: tokens / v for k, v in med.items()},
        "seconds": med, "estimated_s": estimate, "rel_err": rel_err,
        "gain": gain, "over_transformers": med["transformers"] / med["continuous"],
        "targets": TAIL_TARGETS, "meets_target": gain >= TAIL_TARGETS["gain"] and rel_err <= TAIL_TARGETS["rel_err"],
    }


def _model(folder: str, hidden: int, layers: int, vocab: int, heads: int = 0, kv_heads: int = 0, ffn: int = 0):
    import torch
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn or hidden * 8 // 3 // 8 * 8,
                                   num_hidden_layers=layers, num_attention_heads=heads or hidden // 64,
                                   num_key_value_heads=kv_heads or max(1, hidden // 128), max_position_embeddings=2048,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


def run(rounds: int = 7, hidden: int = 512, layers: int = 4, vocab: int = 4096, batch: int = 8, prompt: int = 64,
        new_tokens: int = 64, train_batch: int = 8, train_len: int = 256, device: str = "cpu",
        tail: Optional[dict] = None) -> dict:
    import torch

    from realbench.runtime.checkpoint import load_hf_checkpoint
    from realbench.runtime.engine import PlacedModel, generate
    from realbench.runtime.layout import Groups, Layout
    from realbench.runtime.optim import MixedPrecisionAdam

    torch.set_num_threads(1)  # as each worker process runs
    with tempfile.TemporaryDirectory() as folder:
        hf = _model(folder, hidden, layers, vocab)
        spec, weights = load_hf_checkpoint(folder)
    ours = PlacedModel(spec, Layout.on([0], 1, 1, 1), 0, Groups(), device)
    ours.stage.load_full(weights)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, vocab, (batch, prompt), generator=g)
    ids = torch.randint(0, vocab, (train_batch, train_len), generator=g)

    def ours_generate():
        with torch.no_grad():
            generate(ours, prompts, new_tokens, greedy=True)

    def hf_generate():
        with torch.no_grad():
            hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                        min_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=0)

    # the early-ending workload: greedy responses with end-of-sequence ids that end most early
    with torch.no_grad():
        full, _ = generate(ours, prompts, new_tokens, greedy=True)
    eos, lengths = early_ending_eos(full[:, prompt:])
    own_tokens = sum(lengths)  # the tokens both decode for the responses (the rest is padding)

    def ours_stopping():
        with torch.no_grad():
            return generate(ours, prompts, new_tokens, greedy=True, eos=eos)[0]

    def ours_full_length():
        with torch.no_grad():
            generate(ours, prompts, new_tokens, greedy=True, eos=eos, drop_finished=False)

    def hf_stopping():
        with torch.no_grad():
            return hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                               do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=eos)

    opt = MixedPrecisionAdam(ours, lr=1e-5)
    hf.train()
    hf_opt = torch.optim.AdamW(hf.parameters(), lr=1e-5, weight_decay=0.0)

    def ours_train():
        opt.zero_grad()
        ours.forward_backward([ids], lambda i, y: torch.nn.functional.cross_entropy(
            y[:, :-1].reshape(-1, vocab).float(), ids[:, 1:].reshape(-1)))
        opt.step()

    def hf_train():
        hf_opt.zero_grad(set_to_none=True)
        hf(ids, labels=ids).loss.backward()
        hf_opt.step()

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    for fn in (ours_generate, hf_generate, ours_train, hf_train, ours_full_length):  # warm-up
        fn()
    # both stop where the lengths say (the same greedy tokens; transformers pads a finished row)
    ours_lengths = (ours_stopping()[:, prompt:] >= 0).sum(1).tolist()
    theirs = hf_stopping()[:, prompt:]
    hf_lengths = [next((t + 1 for t, tok in enumerate(r) if tok in eos), len(r)) for r in theirs.tolist()]
    gen_ratios, train_ratios, stop_ratios, stop_gains = [], [], [], []
    times = {k: [] for k in ("ours_generate", "hf_generate", "ours_train", "hf_train", "ours_stopping",
                             "hf_stopping", "ours_full_length")}
    for _ in range(rounds):
        a, b = timed(ours_generate), timed(hf_generate)
        c, d = timed(ours_train), timed(hf_train)
        e, f, g_ = timed(ours_stopping), timed(hf_stopping), timed(ours_full_length)
        for k, v in zip(times, (a, b, c, d, e, f, g_)):
            times[k].append(v)
        gen_ratios.append(b / a)  # tokens/s ours over theirs = their seconds over ours
        train_ratios.append(d / c)
        stop_ratios.append(f / e)
        stop_gains.append(g_ / e)
    gen_tokens, train_tokens = batch * new_tokens, train_batch * train_len
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "benchmark": "runtime", "device": device, "dtype": "fp32", "rounds": rounds,
        "model": {"hidden": hidden, "layers": layers, "vocab": vocab, "params": spec.n_params},
        "generate": {"batch": batch, "prompt_len": prompt, "new_tokens": new_tokens,
                     "realbench_tokens_per_s": gen_tokens / med["ours_generate"],
                     "transformers_tokens_per_s": gen_tokens / med["hf_generate"]},
        "generate_stopping": {
            "batch": batch, "prompt_len": prompt, "max_new_tokens": new_tokens, "eos_ids": eos,
            "lengths": ours_lengths, "transformers_lengths": hf_lengths, "own_tokens": own_tokens,
            "ended_early": sum(n <= EARLY * new_tokens for n in ours_lengths),
            "realbench_tokens_per_s": own_tokens / med["ours_stopping"],
            "transformers_tokens_per_s": own_tokens / med["hf_stopping"],
            "realbench_full_length_tokens_per_s": own_tokens / med["ours_full_length"],
            "ratio": statistics.median(stop_ratios),
            "gain_over_full_length": statistics.median(stop_gains)},
        "train": {"batch": batch, "seq_len": train_len,
                  "realbench_tokens_per_s": train_tokens / med["ours_train"],
                  "transformers_tokens_per_s": train_tokens / med["hf_train"]},
        "generate_ratio": statistics.median(gen_ratios),
        "train_ratio": statistics.median(train_ratios),
        "targets": TARGETS,
    }
    result["continuous"] = long_tail(**{**TAIL, **(tail or {})}, device=device)
    result["meets_target"] = all(result[k] >= v for k, v in TARGETS.items()) and result["continuous"]["meets_target"]
    return result
