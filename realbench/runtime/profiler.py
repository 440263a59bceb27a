"""The profiler: measures the runtime's own layers and collectives on this machine.

`profile_machine` starts N local processes (one thread each, like the runtime's workers) and
measures, with warm-up runs and repeats in several passes, for every requested model architecture and every
tensor-parallel degree that N processes allow, the layer operations listed in
realbench.hardware.profile over a grid of batch sizes and lengths (tp > 1 runs on the first tp
processes and includes their all-reduces), an Adam fit, the runtime's whole calls (see
`_whole_calls`), and the collectives over message sizes and group sizes (with the runtime's own
exchange of a call's inputs). A repeat's time is the slowest rank's. Rank 0 reports progress
through a queue so that the caller can draw a bar; interrupting the caller stops the processes.
"""

from __future__ import annotations

import datetime
import math
import platform
import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional, Union

import numpy as np

from realbench.errors import ConfigError
from realbench.hardware.profile import (CALL_MICRO_BATCHES, COLLECTIVES, Profile, shape_key, shares_cores, this_machine,
                                       variant_of)
from realbench.models import ModelSpec

DEFAULT_BATCHES = (1, 2, 4, 8, 16)
DEFAULT_LENGTHS = (4, 8, 16, 32)
DEFAULT_SIZES = tuple(4**k for k in range(5, 12))  # 1 KiB .. 4 MiB
# Whole calls of tiny models take milliseconds and vary from run to run where processes share
# cores: each is repeated for about CALL_BUDGET_S seconds, at most CALL_REPEATS times, in
# CALL_PASSES passes over them all by default (the median: a stretch of time when the machine was
# slower, which moved every call measured in it by a third, counts once)
CALL_REPEATS = 20
CALL_BUDGET_S = 0.1
CALL_PASSES = 3
EXCHANGE_REPEATS, EXCHANGE_BUDGET_S = 200, 0.3  # an exchange takes about a millisecond


@dataclass(frozen=True)
class ProfileRequest:
    # architectures to measure: preset names or ModelSpecs (a scenario's own shapes, say)
    models: tuple[Union[str, ModelSpec], ...] = ("llama-tiny",)
    batches: tuple[int, ...] = DEFAULT_BATCHES
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    sizes: tuple[int, ...] = DEFAULT_SIZES
    repeats: int = 10
    warmup: int = 3
    passes: int = 3  # the grid is measured this many times, spread over the run
    call_passes: int = CALL_PASSES  # and the whole calls this many times (the runtime's drift)
    nproc: int = 2
    device: str = "cpu"
    # what the layers compute in: "auto" is what a run on `device` uses (bf16 on CUDA, fp32 on
    # the CPU), since a GPU's bf16 matmuls run an order of magnitude faster than its fp32 ones
    dtype: str = "auto"
    collectives: bool = True  # False: layers only (adding a model to a profile that has them)
    # decode steps as `realbench run --compile-decode` runs them: the block's step and the whole
    # generation calls through torch.compile (each shape of the grid compiles once)
    compile_decode: bool = False

    def specs(self) -> list[tuple[str, ModelSpec]]:
        """(name in the profile, spec) of each requested architecture, once per shape (what a
        profile is matched on: critics and actors of one shape share their measurements)."""
        from realbench.models import get_model

        out, seen = [], set()
        for m in self.models:
            name, spec = (m, get_model(m)) if isinstance(m, str) else (m.name, m)
            shape = shape_key(spec)
            if shape not in seen:
                seen.add(shape)
                out.append((name, spec))
        return out

    def tp_degrees(self, spec) -> list[int]:
        out, tp = [], 1
        while tp <= self.nproc:
            width = spec.moe.expert_ffn if spec.moe is not None else spec.ffn
            if spec.n_kv_heads % tp == 0 and spec.ffn % tp == 0 and width % tp == 0 and spec.vocab % tp == 0:
                out.append(tp)
            tp *= 2
        return out

    def group_sizes(self) -> list[int]:
        out, n = [], 2
        while n <= self.nproc:
            out.append(n)
            n *= 2
        return out


def profile_dtype(req: ProfileRequest) -> str:
    """"bf16" or "fp32": what the profiled layers compute in."""
    from realbench.runtime.device import resolve_dtype

    return resolve_dtype(req.dtype, req.device)


def check_request(req: ProfileRequest) -> None:
    if req.device not in ("cpu", "cuda"):
        raise ConfigError(f"unknown device {req.device!r} (cpu or cuda)", "--device")
    if req.nproc < 1:
        raise ConfigError("must be at least 1", "--nproc")
    if req.device == "cuda":  # a GPU for each process (NCCL), or a one-line error
        from realbench.runtime.device import resolve_device

        resolve_device("cuda", req.nproc)
    profile_dtype(req)  # an unknown dtype fails here
    if req.repeats < 3:
        raise ConfigError("must be at least 3 (the statistics need a few runs)", "--repeats")
    if req.passes < 1:
        raise ConfigError("must be at least 1", "--passes")
    if req.call_passes < 1:
        raise ConfigError("must be at least 1", "--call-passes")
    req.specs()  # unknown preset names fail here


# -- measurement inside one process -------------------------------------------------------------------------
class _Clock:
    """Times fn: warm-up runs, then `repeats` back-to-back runs (as the runtime runs them) after
    a barrier over `start_group` (None: all processes, for layer operations, so that every
    process computes at once as the runtime's do; on a machine whose cores share caches, memory
    bandwidth or a hypervisor, a process alone runs faster than the runtime's). A repeat's time
    is the slowest of `max_group`'s processes. With `budget_s`, the repeats are as many as fill
    that many seconds (the slowest process's last warm-up run decides, so every process runs the
    same number), at least 3 and at most `repeats`."""

    def __init__(self, req: ProfileRequest, max_group, start_group, device, block: bool = False,
                 budget_s: Optional[float] = None):
        self.req, self.max_group, self.start_group, self.device = req, max_group, start_group, device
        # block: the median is the repeats' mean wall time (the slowest process's), for work
        # that runs at once on more processes than cores: the scheduler hands out the cores in
        # slices, so one repeat's time says little, the block's says how the cores were shared
        self.block, self.budget_s = block, budget_s

    def __call__(self, fn: Callable[[], object]) -> dict:
        import torch
        import torch.distributed as dist

        from realbench.runtime.device import synchronize

        warm = 0.0
        for _ in range(self.req.warmup):
            t0 = time.perf_counter()
            fn()
            synchronize(self.device)
            warm = time.perf_counter() - t0
        repeats = self.req.repeats
        if self.budget_s is not None:
            slowest = torch.tensor([warm], dtype=torch.float64, device=self.device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=self.start_group)
            repeats = int(min(repeats, max(3, math.ceil(self.budget_s / max(float(slowest[0]), 1e-9)))))
        synchronize(self.device)
        dist.barrier(group=self.start_group)
        times = []
        start = time.perf_counter()
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            synchronize(self.device)
            times.append(time.perf_counter() - t0)
        mean = (time.perf_counter() - start) / len(times)
        t = torch.tensor(times + [mean], dtype=torch.float64, device=self.device)  # NCCL reduces only on the GPU
        if self.max_group is not None:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.max_group)
        t = t.cpu().numpy()
        q = np.quantile(t[:-1], [0.1, 0.5, 0.9])
        middle = float(t[-1]) if self.block else float(q[1])
        return {"median_s": middle, "p10_s": min(float(q[0]), middle), "p90_s": max(float(q[2]), middle),
                "repeats": len(times)}


def _as_the_engine_decodes(step, dev, tp: int):
    """A decode step's operation as the rollout engine runs it: on a GPU replica of one device a
    CUDA graph's replay (realbench.runtime.rollout.DecodeGraphs: one launch for the step's
    kernels), elsewhere the step itself."""
    import torch

    from realbench.runtime.rollout import capture, warm_up

    if torch.device(dev).type != "cuda" or tp != 1:
        return step
    warm_up(step)
    return capture(step).replay


def _layer_ops(spec, tp: int, rank: int, group, req: ProfileRequest, clock: _Clock, tick, dev) -> dict:
    import torch

    from realbench.runtime import losses
    from realbench.runtime.engine import sample_tokens
    from realbench.runtime.rollout import SlotCache, compile_static
    from realbench.runtime.device import torch_dtype
    from realbench.runtime.model import LlamaStage

    dtype = torch_dtype(profile_dtype(req))
    one = spec.with_layers(1).model_copy(update={"value_head": False})
    stage = LlamaStage(one, tp, rank, 1, 0, group, dev, dtype)
    valued = LlamaStage(one.with_value_head(), tp, rank, 1, 0, group, dev, dtype)
    block = stage.layers["0"]
    g = torch.Generator(device="cpu").manual_seed(0)
    ops: dict[str, list] = {}

    def record(op, b, s, fn):
        ops.setdefault(op, []).append({"batch": b, "length": s, **clock(fn)})
        tick()

    def backward(fn_out):
        def run():
            y = fn_out()
            y.backward(torch.ones_like(y))
        return run

    for b in req.batches:
        for s in req.lengths:
            tokens = torch.randint(0, spec.vocab, (b, s), generator=g).to(dev)
            x = torch.randn(b, s, spec.hidden, generator=g).to(dev, dtype)
            xg = x.clone().requires_grad_(True)
            pos = torch.arange(s, device=dev)
            with torch.no_grad():
                record("embed.fwd", b, s, lambda: stage.embed_tokens(tokens))
                record("block.fwd", b, s, lambda: block(x, pos))
                record("head.fwd", b, s, lambda: stage.output(x))
                record("value_head.fwd", b, s, lambda: valued.output(x))
                logits = stage.output(x)
                record("logprobs.fwd", b, s, lambda: losses.token_logprobs(logits, tokens, max(s // 2, 1)))
                # a decode step at context s as the rollout engine takes it: b slots of a
                # preallocated cache, the new keys written at position s, attention over s + 1
                slots = SlotCache(stage, b, s + 1)
                slots.positions.fill_(s)
                slots.decoding(s + 1, b)
                x1, pos1, layer = x[:, :1].contiguous(), slots.positions[:, None], slots.layer(next(iter(stage.layers)))
                stepper = compile_static(block) if req.compile_decode else block
                record("block.decode", b, s, _as_the_engine_decodes(lambda: stepper(x1, pos1, layer), dev, tp))
            record("embed.fwd_bwd", b, s, backward(lambda: stage.embed_tokens(tokens)))
            record("block.fwd_bwd", b, s, backward(lambda: block(xg, pos)))
            record("head.fwd_bwd", b, s, backward(lambda: stage.output(xg)))
            record("value_head.fwd_bwd", b, s, backward(lambda: valued.output(xg)))
            lg = logits.clone().requires_grad_(True)
            record("loss.fwd_bwd", b, s,
                   backward(lambda: losses.token_logprobs(lg, tokens, max(s // 2, 1)).mean()))
        with torch.no_grad():
            last = torch.randn(b, spec.vocab, generator=g).to(dev).float()  # the sampler works in fp32
            rows = torch.arange(b, device=dev)
            record("sample", b, 1, _as_the_engine_decodes(lambda: sample_tokens(last, rows, 0, 0, False, 1.0, 0, 1.0),
                                                          dev, tp))
    return ops


def _optimizer_fit(spec, tp: int, rank: int, group, clock: _Clock, tick, dev) -> dict:
    """Adam on stages of 1, 2 and 4 layers with and without the embedding and head: a least-squares
    fit of seconds = fixed + per_tensor * tensors + per_param * parameters."""
    import torch

    from realbench.runtime.model import LlamaStage

    rows, ys = [], []
    for layers in (1, 2, 4):
        for ends in (True, False):
            if ends:  # embedding + layers + head on one stage
                stage = LlamaStage(spec.with_layers(layers), tp, rank, 1, 0, group, dev)
            else:  # the middle stage of three holds just the layers
                stage = LlamaStage(spec.with_layers(3 * layers), tp, rank, 3, 1, group, dev)
            params = list(stage.parameters())
            for p in params:
                p.grad = torch.randn_like(p)
            opt = torch.optim.Adam(params, lr=1e-4)
            t = clock(opt.step)["median_s"]
            rows.append([1.0, len(params), sum(p.numel() for p in params)])
            ys.append(t)
            tick()
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)
    coef = np.maximum(coef, 0.0)
    return {"fixed_s": float(coef[0]), "per_tensor_s": float(coef[1]), "per_param_s": float(coef[2])}


def call_layouts(spec, req: ProfileRequest) -> list[tuple[int, int]]:
    """The (tp, pp) layouts whose whole calls are measured: every tp the processes allow, times
    every power-of-two pipeline depth that fits beside it and that the layers fill."""
    out = []
    for tp in req.tp_degrees(spec):
        pp = 1
        while tp * pp <= req.nproc and pp <= spec.n_layers:
            out.append((tp, pp))
            pp *= 2
    return out


def _whole_calls(spec, rank: int, world: int, req: ProfileRequest, tick, dev) -> list[dict]:
    """The runtime's own calls at CALL_REFERENCE on each layout of `call_layouts`, split into each
    of CALL_MICRO_BATCHES, with world // (tp pp) copies of the layout running at once (the
    processes left over wait): generate (sampling, KV cache, the pipeline's token loop), an
    inference forward, and a train update (forward and backward with the log-probability loss,
    the gradient norm, the flat Adam). The runtime's work per micro-batch slot (Python, a stage
    waking for its input) is what the composed operations miss most, and it grows with the
    micro-batches: hence a measurement per count."""
    import torch

    from realbench.hardware.profile import CALL_MICRO_BATCHES, CALL_REFERENCE
    from realbench.runtime import losses
    from realbench.runtime.device import torch_dtype
    from realbench.runtime.engine import PlacedModel
    from realbench.runtime.layout import Groups, Layout
    from realbench.runtime.optim import MixedPrecisionAdam
    from realbench.runtime.rollout import rollout

    R, P, G = CALL_REFERENCE["rows"], CALL_REFERENCE["prompt_len"], CALL_REFERENCE["gen_len"]
    dtype = torch_dtype(profile_dtype(req))
    shapes = call_layouts(spec, req)
    # where the processes outnumber the cores, a layout's calls are measured alone too (one copy,
    # the other processes idle): a call runs between the two, as the calls beside it keep busy
    contended = shares_cores(req.device, world)
    copies = {(tp, pp): [Layout.on(range(k * tp * pp, (k + 1) * tp * pp), 1, tp, pp) for k in range(world // (tp * pp))]
              for tp, pp in shapes}
    groups = Groups()
    groups.prepare([lay for lays in copies.values() for lay in lays])  # every rank, one order
    g = torch.Generator(device="cpu").manual_seed(0)
    prompts = torch.randint(0, spec.vocab, (R, P), generator=g).to(dev)
    seqs = torch.randint(0, spec.vocab, (R, P + G), generator=g).to(dev)
    # all processes start together; the slowest's mean over the block
    clock = _Clock(replace(req, repeats=max(req.repeats, CALL_REPEATS), warmup=1), None, None, dev,
                   block=True, budget_s=CALL_BUDGET_S)
    out = []
    for (tp, pp), running in [(shape, n) for shape in shapes
                              for n in sorted({len(copies[shape]), 1 if contended else len(copies[shape])}, reverse=True)]:
        lays = copies[(tp, pp)][:running]
        mine = lays[rank // (tp * pp)] if rank < len(lays) * tp * pp else None
        model = PlacedModel(spec, mine, rank, groups, dev, dtype) if mine is not None else None
        opt = MixedPrecisionAdam(model) if model is not None else None
        for m in CALL_MICRO_BATCHES:
            parts = list(seqs.chunk(m))

            def train(parts=parts):
                opt.zero_grad()
                model.forward_backward(parts, lambda j, y: losses.token_logprobs(y, parts[j], G).sum())
                model.grad_norm()
                opt.step()

            def inference(parts=parts):
                outs = model.forward(parts)
                if outs is not None:  # the last stage's log-probabilities, as a reference model's call
                    for y, part in zip(outs, parts):
                        losses.token_logprobs(y, part, G)

            calls = {"generate": lambda m=m: rollout(model, prompts, G, m, key=0, compiled=req.compile_decode),
                     "inference": inference, "train": train}
            for kind, fn in calls.items():
                timing = clock(fn if model is not None else (lambda: None))
                out.append({"kind": kind, "tp": tp, "pp": pp, "micro_batches": m, "layers": spec.n_layers,
                            "copies": len(lays), "rows": R, "prompt_len": P, "gen_len": G, **timing})
                tick()
    return out


def _collectives(rank: int, world: int, req: ProfileRequest, tick, dev) -> dict:
    import torch
    import torch.distributed as dist

    from realbench.runtime.worker import _exchange

    # where processes share cores, those outside a measured group compute meanwhile (_keep_busy)
    contended = shares_cores(req.device, world)
    out: dict = {}
    for n in req.group_sizes():
        group = dist.new_group(list(range(n)))
        for kind in COLLECTIVES:
            if kind == "p2p" and n != 2:
                continue
            for nbytes in req.sizes:
                if rank < n:
                    count = max(nbytes // 4, n)
                    buf = torch.zeros(count, device=dev)
                    if kind == "all_reduce":
                        fn = lambda: dist.all_reduce(buf, group=group)  # noqa: E731
                    elif kind == "broadcast":
                        fn = lambda: dist.broadcast(buf, 0, group=group)  # noqa: E731
                    elif kind == "all_gather":
                        part = torch.zeros(count // n, device=dev)
                        parts = [torch.empty_like(part) for _ in range(n)]
                        fn = lambda: dist.all_gather(parts, part, group=group)  # noqa: E731
                    elif kind == "exchange":  # every process to every other, all posted at once
                        peers = [r for r in range(n) if r != rank]
                        inbox = [(r, torch.empty_like(buf)) for r in peers]
                        fn = lambda: _exchange([(r, buf) for r in peers], inbox)  # noqa: E731
                    else:  # ping-pong, half the round trip: in the runtime a hop waits for the last
                        def fn(buf=buf):
                            if rank == 0:
                                dist.send(buf, 1)
                                dist.recv(buf, 1)
                            else:
                                dist.recv(buf, 0)
                                dist.send(buf, 0)
                    if kind == "exchange":  # its messages wait on each other's processes: a block's mean
                        timing = _Clock(replace(req, repeats=max(req.repeats, EXCHANGE_REPEATS)), group, group, dev,
                                        block=True, budget_s=EXCHANGE_BUDGET_S)(fn)
                    else:
                        timing = _Clock(req, group, group, dev)(fn)
                    if rank == 0 and contended:  # the processes outside the group may stop computing
                        for r in range(n, world):
                            dist.send(torch.ones(1, device=dev), r)
                    if kind == "p2p":
                        timing = {k: v / 2 if k.endswith("_s") else v for k, v in timing.items()}
                    out.setdefault(kind, {}).setdefault(str(n), []).append({"nbytes": count * 4, **timing})
                    tick()
                elif contended:
                    _keep_busy(rank, dev)
        dist.barrier()
    return out


def _keep_busy(rank: int, dev) -> int:
    """Compute until rank 0 says stop: the processes outside a collective's group, while it is
    measured (in a run other calls keep them busy, and a process woken by a message then waits
    for a core; measured with them idle, an exchange among 2 of 4 processes on 2 cores took a
    fraction of what it takes in a run). The computing runs in a thread (torch releases the interpreter
    lock in its kernels) while this one waits in a blocking receive: gloo marks a receive
    complete only once it is waited for, so it cannot be polled. Returns the rounds computed."""
    import torch
    import torch.distributed as dist

    stop = threading.Event()
    rounds = [0]

    def compute():
        x = torch.randn(64, 64, device=dev)
        while not stop.is_set():
            x = torch.tanh(x @ x)
            rounds[0] += 1

    worker = threading.Thread(target=compute, daemon=True)
    worker.start()
    try:
        dist.recv(torch.zeros(1, device=dev), 0)
    finally:
        stop.set()
        worker.join()
    return rounds[0]


def _merge_passes(passes: list[dict]) -> dict:
    """One point per (operation, batch, length), or per whole call: the point's own fields (as
    the first pass has them), the median of the passes' medians (robust to a pass that ran while
    the machine was busy), the widest p10..p90, the repeats summed."""
    out: dict = {}
    for op in passes[0]:
        for i, first in enumerate(passes[0][op]):
            same = [run[op][i] for run in passes]
            out.setdefault(op, []).append({
                **first, "median_s": float(np.median([p["median_s"] for p in same])),
                "p10_s": min(p["p10_s"] for p in same), "p90_s": max(p["p90_s"] for p in same),
                "repeats": sum(p["repeats"] for p in same)})
    return out


def _profile_rank(rank: int, world: int, req: ProfileRequest, progress) -> Optional[dict]:
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", torch.cuda.current_device()) if req.device == "cuda" else torch.device("cpu")
    done = [0]

    def tick():
        done[0] += 1
        if rank == 0 and progress is not None:
            progress.put(done[0])

    models: dict = {}
    for name, spec in req.specs():
        entry = {"hidden": spec.hidden, "n_heads": spec.n_heads, "n_kv_heads": spec.n_kv_heads,
                 "ffn": spec.ffn, "vocab": spec.vocab, "variant": variant_of(spec), "ops": {}, "optimizer": {}}
        for tp in req.tp_degrees(spec):
            # world // tp groups of tp processes measure at once; rank 0's group is recorded
            groups = [dist.new_group(list(range(k * tp, (k + 1) * tp))) for k in range(world // tp)] \
                if tp > 1 else [None] * world
            group = groups[rank // tp]
            clock = _Clock(req, group, None, dev)
            runs = [(_layer_ops(spec, tp, rank % tp, group, req, clock, tick, dev),
                     _optimizer_fit(spec, tp, rank % tp, group, clock, tick, dev)) for _ in range(req.passes)]
            if rank == 0:
                entry["ops"][str(tp)] = _merge_passes([ops for ops, _ in runs])
                entry["optimizer"][str(tp)] = {k: float(np.median([fit[k] for _, fit in runs])) for k in runs[0][1]}
            dist.barrier()
        runs = [{"calls": _whole_calls(spec, rank, world, req, tick, dev)} for _ in range(req.call_passes)]
        entry["calls"] = _merge_passes(runs)["calls"]
        dist.barrier()
        models[name] = entry
    collectives = _collectives(rank, world, req, tick, dev) if req.collectives else {}
    return {"models": models, "collectives": collectives} if rank == 0 else None


def planned_measurements(req: ProfileRequest) -> int:
    per_tp = (len(req.batches) * (len(req.lengths) * 11 + 1) + 6) * req.passes
    contended = shares_cores(req.device, req.nproc)
    layouts = sum(len(call_layouts(spec, req)) + (sum(req.nproc // (tp * pp) > 1 for tp, pp in call_layouts(spec, req))
                                                  if contended else 0) for _, spec in req.specs())
    layers = sum(per_tp * len(req.tp_degrees(spec)) for _, spec in req.specs()) \
        + 3 * len(CALL_MICRO_BATCHES) * layouts * req.call_passes
    colls = sum(len(req.sizes) * (len(COLLECTIVES) if n == 2 else len(COLLECTIVES) - 1) for n in req.group_sizes())
    return layers + (colls if req.collectives else 0)


def profile_machine(req: ProfileRequest, on_progress: Optional[Callable[[int, int], None]] = None) -> Profile:
    """Measure this machine; on_progress(done, total) is called as measurements finish."""
    import torch

    from realbench.runtime.local import context, spawn

    check_request(req)
    total = planned_measurements(req)
    progress = context().Queue()
    result: dict = {}

    def work():
        try:
            result["ranks"] = spawn(_profile_rank, req.nproc, req, progress, timeout_s=1800.0, device=req.device)
        except BaseException as e:  # handed to the caller's thread
            result["error"] = e

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    done = 0
    while thread.is_alive():
        try:
            done = progress.get(timeout=0.2)
        except queue.Empty:
            continue
        if on_progress:
            on_progress(done, total)
    if "error" in result:
        raise result["error"]
    data = result["ranks"][0]
    from realbench.hardware.profile import CALLS_VERSION

    versions = {"python": platform.python_version(), "torch": torch.__version__, "calls": CALLS_VERSION}
    try:
        from importlib.metadata import version

        versions["realbench"] = version("realbench")
    except Exception:
        pass
    from realbench.runtime.device import DTYPE_BYTES, DTYPE_NAMES

    dtype = profile_dtype(req)
    return Profile.model_validate({
        "device": this_machine(req.device, req.nproc, 1).model_dump(),
        "versions": versions, "dtype": DTYPE_NAMES[dtype], "compile_decode": req.compile_decode,
        "bytes_per_value": DTYPE_BYTES[dtype],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "models": data["models"], "collectives": data["collectives"]})


def profile_summary(profile: Profile) -> list[str]:
    """A few measured numbers to print after profiling."""
    lines = []
    for name, m in profile.models.items():
        for tp, ops in m.ops.items():
            for op in ("block.fwd", "block.fwd_bwd", "block.decode"):
                pts = ops.get(op, [])
                if pts:
                    big = max(pts, key=lambda p: (p.batch * p.length))
                    small = min(pts, key=lambda p: (p.batch * p.length))
                    lines.append(f"{name} tp{tp} {op}: {small.median_s * 1e3:.3f} ms at {small.batch}x{small.length}, "
                                 f"{big.median_s * 1e3:.3f} ms at {big.batch}x{big.length}")
    for kind, groups in profile.collectives.items():
        for n, pts in groups.items():
            big = max(pts, key=lambda p: p.nbytes)
            small = min(pts, key=lambda p: p.nbytes)
            lines.append(f"{kind} over {n}: {small.median_s * 1e6:.0f} us at {small.nbytes} B, "
                         f"{big.nbytes / big.median_s / 1e9:.2f} GB/s at {big.nbytes} B")
    return lines
