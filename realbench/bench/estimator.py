"""Estimator throughput: random valid plans of a scenario, evaluated from a cold start.

Reports `plans_per_s` over `plans` random plans drawn from the options that fit in memory,
evaluated in batches by a fresh Estimator (so the reallocation caches start empty and the rate
includes filling them), the same plans again with warm caches, one-at-a-time evaluation, and
the one-off setup (costing every option of every call)."""

from __future__ import annotations

import time

import numpy as np

from realbench.cost import Estimator
from realbench.plan import get_builtin

TARGET_PLANS_PER_S = 20_000


def run(scenario: str = "ppo-70b-7b-128gpu", plans: int = 50_000, batch: int = 1024, seed: int = 0,
        single: int = 200) -> dict:
    sc = get_builtin(scenario)
    t0 = time.perf_counter()
    est = Estimator(sc)
    setup_s = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    C = np.stack([rng.choice(est.candidates(i), size=plans) for i in range(est.n)], axis=1)

    def timed_pass() -> tuple[float, np.ndarray]:
        t = time.perf_counter()
        times = np.concatenate([est.evaluate_batch(C[s:s + batch])[0] for s in range(0, plans, batch)])
        return time.perf_counter() - t, times

    cold_s, times = timed_pass()
    warm_s, times_again = timed_pass()
    t = time.perf_counter()
    for row in C[:single]:
        est.evaluate(row)
    single_s = time.perf_counter() - t
    return {
        "benchmark": "estimator", "scenario": scenario, "plans": plans, "batch": batch,
        "setup_s": setup_s, "options": sum(len(o) for o in est.options),
        "plans_per_s": plans / cold_s, "warm_plans_per_s": plans / warm_s, "single_plans_per_s": single / single_s,
        "target_plans_per_s": TARGET_PLANS_PER_S, "meets_target": plans / cold_s >= TARGET_PLANS_PER_S,
        "deterministic": bool(np.array_equal(times, times_again)),
        "median_time_per_iter_s": float(np.median(times)),
    }
QUICK = {"scenario": "ppo-7b-7b-16gpu", "plans": 4096, "single": 20}
