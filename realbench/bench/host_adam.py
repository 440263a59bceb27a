"""`realbench bench host-adam --json`: how fast one host thread runs Adam (the optimizer step of
DeepSpeed's ZeRO-Offload, OpenRLHF's `--ds.adam_offload`; realbench.cost.sharding).

Each row is one AdamW step (fp32 parameters, gradients and moments, as ZeRO-Offload keeps them on
the host) over `params` parameters on `threads` threads of this machine, the fastest of `repeats`
steps after a first one that allocates the moments. The kernel is DeepSpeed's own DeepSpeedCPUAdam
(vectorized C++, OpenMP) where DeepSpeed is installed, else PyTorch's fused CPU AdamW (also one
vectorized pass over the four tensors); `implementation` says which. A row's rate is params /
seconds / threads: the parameters one thread updates a second, the preset's `host_adam_rate`
(fitted by `bench fidelity` to rows measured this way, realbench/hardware/published.yaml).

One thread a rank is what OpenRLHF's workers run (Ray sets OMP_NUM_THREADS to an actor's CPUs, 1).
Every core of a host at once is another regime: the host's memory bandwidth bounds it (the
ZeRO-Offload paper's 48 cores reach 85 million parameters a second a core, a ninth of what one
core runs alone), so rows with more threads than this machine has cores are not measured.
"""

from __future__ import annotations

import os
import time

FULL = {"sizes": (25_000_000, 50_000_000, 100_000_000, 200_000_000, 400_000_000), "repeats": 5}
QUICK = {"sizes": (1_000_000, 4_000_000), "repeats": 3}


def _optimizer(param):
    """DeepSpeed's CPU Adam where installed (its kernel), else PyTorch's fused CPU AdamW."""
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except ImportError:
        import torch

        return torch.optim.AdamW([param], lr=1e-3, fused=True), f"torch {torch.__version__} AdamW(fused=True)"
    import deepspeed

    return (DeepSpeedCPUAdam([param], lr=1e-3, adamw_mode=True, fp32_optimizer_states=True),
            f"deepspeed {deepspeed.__version__} DeepSpeedCPUAdam")


def step_seconds(params: int, threads: int, repeats: int) -> tuple[float, str]:
    """The fastest of `repeats` AdamW steps over `params` fp32 parameters on `threads` threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        param = torch.nn.Parameter(torch.randn(params))
        param.grad = torch.randn(params)
        opt, implementation = _optimizer(param)
        opt.step()  # (the first step allocates the moments)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - start)
        return min(times), implementation
    finally:
        torch.set_num_threads(before)


def run(sizes=FULL["sizes"], repeats: int = FULL["repeats"]) -> dict:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    rows = []
    for threads in sorted({1, min(2, cores)}):
        for n in sizes:
            seconds, implementation = step_seconds(n, threads, repeats)
            rows.append({"threads": threads, "params": n, "seconds": seconds, "implementation": implementation,
                         "params_per_s_per_thread": n / seconds / threads})
    rates = sorted(r["params_per_s_per_thread"] for r in rows)
    return {"cores": cores, "repeats": repeats, "rows": rows, "median_params_per_s_per_thread": rates[len(rates) // 2]}
