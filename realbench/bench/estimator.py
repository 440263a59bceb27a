"""Estimator speed, and how it grows with the cluster (`realbench bench estimator --json`).

1. Throughput on `scenario` (a PPO job on 1,024 GPUs by default; target 20,000 plans/s):
   `plans` random plans drawn from the options that fit alone, evaluated in batches of `batch`
   by a fresh Estimator, a second time (the same times: `deterministic`), and one plan at a
   time. `setup_s` is the one-off cost of the option tables the draw needs (every option of
   every call, costed once per mesh shape and strategy).
2. Growth: the job of `growth_scenario` on clusters of `growth_gpus` (nodes of 8). Per size: the
   number of options, `estimate_s` (what `realbench estimate` of one plan does after start-up:
   validate the scenario, enumerate the options, look the plan up, estimate it; median of 3, the
   plan being the symmetric baseline), `setup_s` and `plans_per_s` as in 1.
3. `cli_estimate_s`: the wall time of the command `realbench estimate --plan` (a new Python
   process, imports included) on the built-in scenarios of 1,024 and 4,096 GPUs.
4. `moe`: throughput on a mixture of experts of the same size (`moe_scenario`: Qwen3-235B-A22B on
   1,024 GPUs, whose calls also choose their expert layouts), as a ratio to 1.'s in the same run
   (target: at least TARGET_MOE_RATIO).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from realbench.cost import Estimator
from realbench.cost.baselines import BASELINES
from realbench.plan import Origin, plan_from_options
from realbench.plan.builtin import BUILTIN
from realbench.plan.scenario import Scenario

TARGET_PLANS_PER_S = 20_000
TARGET_ESTIMATE_S = 1.0
TARGET_MOE_RATIO = 0.5  # a mixture of experts' plans per second over a dense job's: at most 2x slower


def throughput(scenario: Scenario, plans: int, batch: int, seed: int = 0, single: int = 0) -> dict:
    t0 = time.perf_counter()
    est = Estimator(scenario)
    candidates = [est.candidates(i) for i in range(est.n)]
    setup_s = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    C = np.stack([rng.choice(c, size=plans) for c in candidates], axis=1)

    def timed_pass() -> tuple[float, np.ndarray]:
        t = time.perf_counter()
        times = np.concatenate([est.evaluate_batch(C[s:s + batch])[0] for s in range(0, plans, batch)])
        return time.perf_counter() - t, times

    cold_s, times = timed_pass()
    warm_s, times_again = timed_pass()
    out = {"setup_s": setup_s, "options": sum(len(o) for o in est.options), "plans_per_s": plans / cold_s,
           "warm_plans_per_s": plans / warm_s, "deterministic": bool(np.array_equal(times, times_again)),
           "median_time_per_iter_s": float(np.median(times))}
    if single:
        t = time.perf_counter()
        for row in C[:single]:
            est.evaluate(row)
        out["single_plans_per_s"] = single / (time.perf_counter() - t)
    return out


def resized(name: str, nodes: int) -> Scenario:
    spec = BUILTIN[name]
    return Scenario.model_validate({**spec, "name": f"{name}@{nodes}x{spec['cluster']['gpus_per_node']}",
                                    "cluster": {**spec["cluster"], "nodes": nodes}})


def estimate_seconds(name: str, nodes: int, repeats: int = 3) -> tuple[float, int]:
    """Median seconds of validate + options + plan lookup + estimate of the symmetric baseline."""
    est = Estimator(resized(name, nodes))
    options = est.options_of(BASELINES["symmetric"](est))
    seconds = []
    for _ in range(repeats):
        t = time.perf_counter()
        fresh = Estimator(resized(name, nodes))
        fresh.estimate(fresh.choice_of(options))
        seconds.append(time.perf_counter() - t)
    return statistics.median(seconds), sum(len(o) for o in est.options)


def cli_estimate_seconds(name: str) -> float:
    from realbench.plan import get_builtin

    scenario = get_builtin(name)
    est = Estimator(scenario)
    choice = BASELINES["symmetric"](est)
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.yaml"
        plan_from_options(scenario, est.options_of(choice), Origin(method="symmetric")).save(plan)
        t = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "realbench", "estimate", "--scenario", name, "--plan", str(plan),
                               "--json"], capture_output=True, text=True)
        seconds = time.perf_counter() - t
    if done.returncode:
        raise RuntimeError(f"realbench estimate failed: {done.stderr.strip()}")
    return seconds


def run(scenario: str = "ppo-70b-8b-1024gpu", plans: int = 50_000, batch: int = 1024, seed: int = 0,
        single: int = 200, growth_scenario: str = "ppo-7b-7b-16gpu",
        growth_gpus: tuple[int, ...] = (16, 64, 256, 1024, 4096), growth_plans: int = 20_000,
        cli_scenarios: tuple[str, ...] = ("ppo-70b-8b-1024gpu", "ppo-405b-70b-4096gpu"),
        moe_scenario: str = "ppo-qwen3-235b-a22b-1024gpu") -> dict:
    from realbench.plan import get_builtin

    sc = get_builtin(scenario)
    out = {"benchmark": "estimator", "scenario": scenario, "gpus": sc.cluster.n_devices, "plans": plans,
           "batch": batch, **throughput(sc, plans, batch, seed, single),
           "target_plans_per_s": TARGET_PLANS_PER_S}
    out["meets_target"] = out["plans_per_s"] >= TARGET_PLANS_PER_S
    moe = get_builtin(moe_scenario)
    moe_row = {"scenario": moe_scenario, "gpus": moe.cluster.n_devices,
               **{k: v for k, v in throughput(moe, plans, batch, seed).items() if k in ("setup_s", "options", "plans_per_s")}}
    moe_row["ratio_to_dense"] = moe_row["plans_per_s"] / out["plans_per_s"]
    out["moe"] = {**moe_row, "target_ratio": TARGET_MOE_RATIO, "meets_target": moe_row["ratio_to_dense"] >= TARGET_MOE_RATIO}
    G = BUILTIN[growth_scenario]["cluster"]["gpus_per_node"]
    growth = []
    for gpus in growth_gpus:
        nodes = max(1, gpus // G)
        est_s, options = estimate_seconds(growth_scenario, nodes)
        row = {"gpus": nodes * G, "nodes": nodes, "options": options, "estimate_s": est_s}
        row.update({k: v for k, v in throughput(resized(growth_scenario, nodes), growth_plans, batch, seed).items()
                    if k in ("setup_s", "plans_per_s")})
        growth.append(row)
    out["growth"] = {"scenario": growth_scenario, "sizes": growth}
    out["cli_estimate_s"] = {name: cli_estimate_seconds(name) for name in cli_scenarios}
    out["target_estimate_s"] = TARGET_ESTIMATE_S
    out["meets_estimate_target"] = all(s < TARGET_ESTIMATE_S for s in out["cli_estimate_s"].values())
    return out


QUICK = {"scenario": "ppo-7b-7b-16gpu", "plans": 4096, "single": 20, "growth_gpus": (16, 64), "growth_plans": 2048,
         "cli_scenarios": ("sft-7b-8gpu",), "moe_scenario": "grpo-qwen3-30b-a3b-16gpu"}
