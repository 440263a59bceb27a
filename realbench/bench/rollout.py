"""`realbench bench rollout`: a scenario's generation call, tokens per second, by the loops that
can run it on this machine's device (`grpo-500m-1gpu` on a GPU when there is one; the CPU runs
`grpo-tiny-cpu`'s):

  * `micro_batched`: the loop the runtime decoded with before the rollout engine, and still does
    for pipelines (`engine.generate`: each step launches every kernel from Python);
  * `continuous`: the rollout engine stepping eagerly, reading the device every step;
  * `continuous_sync`: the same reading it every `sync_every` steps;
  * `graphs`: the same with each decode step a CUDA graph (GPU only; `rollout.DecodeGraphs`);
  * `graphs_compiled`: the same with the step compiled by torch.compile (inductor) before its
    capture: a layer's element-wise kernels fused (GPU only; the compilation in `first_call_s`);
  * `transformers_static`: transformers' `generate` with its static cache, eager;
  * `transformers_compiled`: the same compiled, as transformers compiles a static cache's
    forward on a GPU by itself (GPU only; the first call's compilation reported apart).

The workload is the call's own: its rows of prompts (random tokens, the prompt length), the
generation length sampled at temperature 1 with no end-of-sequence token, so that every loop
makes the same number of tokens, on random weights of the call's model in the run's dtype (bf16
on a GPU), every engine in the call's slots (all rows at once). The loops run in alternation
(A B C ... A B C), each number the median over `rounds`; each loop's first call (CUDA's lazy
start, the graphs' capture, compilation) is timed apart as `first_call_s`. `same_rows` says how
many rows each loop made as the micro-batched loop did (eager and graph steps compute the same
kernels: on the CPU all of them; a GPU's bf16 kernels at other batch shapes round apart, and a
near-uniform random model's draws follow the rounding: `fp32_same_rows` checks a few rows in fp32).
Target on a GPU (issue: at least ten times what the runtime generated at before): the faster of
`graphs` and `graphs_compiled` against `micro_batched`.
"""

from __future__ import annotations

import statistics
import tempfile
import time

SCENARIOS = {"cuda": "grpo-500m-1gpu", "cpu": "grpo-tiny-cpu"}  # by device: the 500M model would take the CPU hours
TARGET = 10.0  # graphs over micro_batched, on a GPU
QUICK = {"scenario": "grpo-tiny-cpu", "rounds": 1}
CHECK_ROWS, CHECK_TOKENS = 16, 64  # the fp32 check of the rows on a GPU


def run(scenario: str = "", rounds: int = 3, sync_every: int = 8, device: str = "auto",
        compiled: bool = True, only: tuple[str, ...] = ()) -> dict:
    """`only`: the loops to time beside `micro_batched` (empty: every loop the device runs)."""
    import torch

    from realbench.bench.runtime import _model
    from realbench.dataflow import CallKind
    from realbench.hardware.profile import this_machine
    from realbench.plan.scenario import load_scenario
    from realbench.runtime.checkpoint import load_hf_checkpoint
    from realbench.runtime.engine import PlacedModel, generate
    from realbench.runtime.layout import Groups, Layout
    from realbench.runtime.rollout import RolloutEngine

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = device == "cuda"
    scenario = scenario or SCENARIOS[device]
    dtype = torch.bfloat16 if gpu else torch.float32
    sc = load_scenario(scenario)
    call = next(c for c in sc.dataflow.calls if c.kind == CallKind.GENERATE)
    shape = sc.model_of(call.name)
    rows, new, prompt = call.seqs, call.gen_len, call.seq_len - call.gen_len
    with tempfile.TemporaryDirectory() as folder:
        hf = _model(folder, shape.hidden, shape.n_layers, shape.vocab, heads=shape.n_heads,
                    kv_heads=shape.n_kv_heads, ffn=shape.ffn)
        spec, weights = load_hf_checkpoint(folder)
    hf = hf.to(device=device, dtype=dtype)
    ours = PlacedModel(spec, Layout.on([0], 1, 1, 1), 0, Groups(), device, dtype)
    ours.stage.load_full(weights)
    prompts = torch.randint(0, spec.vocab, (rows, prompt), generator=torch.Generator().manual_seed(0))
    on_device = prompts.to(device)
    key = 7

    def engine(sync: int, graphs: bool, compile_step: bool = False):
        return lambda: RolloutEngine(ours, prompts, new, rows, key=key, sync_every=sync, graphs=graphs,
                                     compiled=compile_step).run()[0]

    def hf_generate(**kw):
        return lambda: hf.generate(on_device, attention_mask=torch.ones_like(on_device), max_new_tokens=new,
                                   min_new_tokens=new, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                   use_cache=True, pad_token_id=0, cache_implementation="static", **kw)

    loops = {"micro_batched": lambda: generate(ours, prompts, new, key=key)[0],
             "continuous": engine(1, False), "continuous_sync": engine(sync_every, False)}
    if gpu:
        loops["graphs"] = engine(sync_every, True)
        if compiled:
            loops["graphs_compiled"] = engine(sync_every, True, True)
    loops["transformers_static"] = hf_generate(disable_compile=True)
    if gpu and compiled:
        loops["transformers_compiled"] = hf_generate()
    if only:
        loops = {k: fn for k, fn in loops.items() if k == "micro_batched" or k in only}

    def timed(fn):
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if gpu:
            torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    first, outputs, errors = {}, {}, {}
    with torch.no_grad():
        for name, fn in list(loops.items()):
            try:
                first[name], outputs[name] = timed(fn)
            except Exception as e:  # noqa: BLE001 - reported by name, the other loops still measured
                errors[name] = f"{type(e).__name__}: {e}"
                del loops[name]
        times = {name: [] for name in loops}
        for _ in range(rounds):
            for name, fn in loops.items():
                times[name].append(timed(fn)[0])
    tokens = rows * new
    med = {k: statistics.median(v) for k, v in times.items()}
    reference = outputs["micro_batched"].cpu()
    same = {k: int((v.cpu() == reference).all(1).sum()) for k, v in outputs.items()
            if not k.startswith("transformers")}
    result = {
        "scenario": scenario, "call": call.name, "model": shape.name, "device": this_machine(device, 1, 1).name,
        "torch": torch.__version__, "dtype": str(dtype).removeprefix("torch."),
        "rows": rows, "prompt_len": prompt, "new_tokens": new, "tokens": tokens, "slots": rows,
        "sync_every": sync_every, "rounds": rounds,
        "tokens_per_s": {k: tokens / v for k, v in med.items()}, "seconds": med, "first_call_s": first,
        "same_rows": same, "errors": errors,
    }
    if gpu:  # the rows in fp32, where the loops' kernels round alike: graphs against the micro-batched loop
        exact = PlacedModel(spec, Layout.on([0], 1, 1, 1), 0, Groups(), device, torch.float32)
        exact.stage.load_full(weights)
        few = prompts[:CHECK_ROWS]
        with torch.no_grad():
            want = generate(exact, few, CHECK_TOKENS, key=key)[0]
            checked = {name: RolloutEngine(exact, few, CHECK_TOKENS, CHECK_ROWS, key=key, sync_every=sync_every,
                                           graphs=True, compiled=name == "graphs_compiled").run()[0]
                       for name in ("graphs", "graphs_compiled") if name in med}
        result["fp32_same_rows"] = {"rows": CHECK_ROWS, "new_tokens": CHECK_TOKENS,
                                    **{name: int((got == want).all(1).sum()) for name, got in checked.items()}}
    for name in ("graphs", "graphs_compiled"):
        if name in med:
            result[f"{name}_over_micro_batched"] = med["micro_batched"] / med[name]
            for hf_name in ("transformers_static", "transformers_compiled"):
                if hf_name in med:
                    result[f"{name}_over_{hf_name}"] = med[hf_name] / med[name]
    if "graphs" in med:
        best = min((n for n in ("graphs", "graphs_compiled") if n in med), key=med.get)
        result["best_loop"] = best
        result["meets_target"] = result[f"{best}_over_micro_batched"] >= TARGET
        result["target"] = TARGET
    return result
