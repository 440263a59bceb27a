"""Calibration (`realbench bench calibration --json`): estimates against measured runs.

Profiles this machine (or takes a profile file), then for each tiny CPU scenario picks plans
spread over the estimated range (random valid plans at evenly spaced quantiles of their
profiled estimate, and the best symmetric plan), runs each for a few steps on local processes
with the runtime, and compares, per call, the measured seconds (slowest rank, mean over the
steps after the first) with the estimate, and, per plan, the measured time per iteration with
the estimated one:

    rel_err           |estimated - measured| / measured, per call, grouped by call kind
    median_rel_err    and p90_rel_err of those, per kind and over all calls
    kendall_tau       rank agreement of estimated and measured time per iteration over plans

Targets on this machine: median_rel_err <= 0.20 (every kind) and kendall_tau >= 0.6.
"""

from __future__ import annotations

import sys
import time
from typing import Optional

import numpy as np

TARGET_MEDIAN_ERR = 0.20
TARGET_TAU = 0.6
SCENARIOS = ("ppo-tiny-2cpu",)
QUICK = {"plans": 2, "steps": 2, "quick": True}


def pick_plans(est, n: int, seed: int = 0, samples: int = 4000) -> list[tuple[str, tuple[int, ...]]]:
    """The best symmetric plan, and n - 1 random plans that fit, at evenly spaced quantiles of
    their estimated time (so that the plans differ enough to rank)."""
    from realbench.cost.baselines import BASELINES

    rng = np.random.default_rng(seed)
    fits = [[k for k in range(len(opts)) if est.fits_alone(i, k)] for i, opts in enumerate(est.options)]
    choices = np.array([[rng.choice(f) for f in fits] for _ in range(samples)], dtype=np.int64)
    times, mem = est.evaluate_batch(choices)
    ok = np.flatnonzero(mem <= est.capacity)
    order = ok[np.argsort(times[ok])]
    picked = [("symmetric", tuple(int(k) for k in BASELINES["symmetric"](est)))]
    for q in np.linspace(0.02, 0.98, max(n - 1, 1)):
        row = tuple(int(k) for k in choices[order[int(q * (len(order) - 1))]])
        if all(row != c for _, c in picked):
            picked.append((f"random q{q:.2f}", row))
    return picked[:n]


def _stats(errors: list[float]) -> dict:
    return {"median_rel_err": float(np.median(errors)), "p90_rel_err": float(np.quantile(errors, 0.9)),
            "calls": len(errors)}


def run(plans: int = 8, steps: int = 5, scenarios=SCENARIOS, profile_path: Optional[str] = None,
        seed: int = 0, quick: bool = False) -> dict:
    from scipy.stats import kendalltau

    from realbench.cost import Estimator
    from realbench.hardware.profile import load_profile
    from realbench.runtime.profiler import ProfileRequest, profile_machine
    from realbench.plan import load_scenario
    from realbench.runtime.device import resolve_device
    from realbench.runtime.launch import run_plan

    t0 = time.perf_counter()
    loaded = [load_scenario(s) for s in scenarios]
    nproc = max(s.cluster.n_devices for s in loaded)
    device = resolve_device("auto", nproc)  # profiled and run on the same device
    if profile_path:
        profile = load_profile(profile_path)
    else:
        req = ProfileRequest(nproc=nproc, repeats=5 if quick else ProfileRequest().repeats, passes=1 if quick else 3,
                             batches=(1, 2, 4, 8) if quick else ProfileRequest().batches, device=device)
        print(f"profiling {nproc} processes...", file=sys.stderr)
        profile = profile_machine(req)
    profile_s = time.perf_counter() - t0
    by_kind: dict[str, list[float]] = {}
    rows = []
    for scenario in loaded:
        est = Estimator(scenario, profile=profile)
        for label, choice in pick_plans(est, plans, seed):
            options = est.options_of(choice)
            print(f"{scenario.name}: running {label}...", file=sys.stderr)
            result = run_plan(scenario, options, scenario.cluster.n_devices, steps, seed=seed, profile=profile,
                              device=device)
            calls = {}
            for name, c in result["calls"].items():
                kind = scenario.dataflow.call(name).kind.value
                err = abs(c["estimated_s"] - c["measured_s"]) / c["measured_s"]
                by_kind.setdefault(kind, []).append(err)
                calls[name] = {"kind": kind, **c, "rel_err": err}
            G = scenario.cluster.gpus_per_node
            rows.append({"scenario": scenario.name, "plan": label,
                         "placements": {n: o.label(G) for n, o in options.items()},
                         "estimated_iter_s": result["estimated_iter_s"], "measured_iter_s": result["measured_iter_s"],
                         "calls": calls})
    est_t = [r["estimated_iter_s"] for r in rows]
    meas_t = [r["measured_iter_s"] for r in rows]
    tau = float(kendalltau(est_t, meas_t).statistic) if len(rows) > 1 else float("nan")
    per_kind = {k: _stats(v) for k, v in sorted(by_kind.items())}
    overall = _stats([e for v in by_kind.values() for e in v])
    iter_err = [abs(e - m) / m for e, m in zip(est_t, meas_t)]
    return {
        "benchmark": "calibration", "scenarios": list(scenarios), "steps": steps, "plans": len(rows),
        "profile": {"device": profile.device.name, "date": profile.date, "seconds": profile_s,
                    "source": profile_path or "measured in this run"},
        "per_kind": per_kind, "median_rel_err": overall["median_rel_err"], "p90_rel_err": overall["p90_rel_err"],
        "iter_median_rel_err": float(np.median(iter_err)), "kendall_tau": tau,
        "targets": {"median_rel_err": TARGET_MEDIAN_ERR, "kendall_tau": TARGET_TAU},
        "meets_targets": bool(all(s["median_rel_err"] <= TARGET_MEDIAN_ERR for s in per_kind.values())
                              and tau >= TARGET_TAU),
        "runs": rows, "seconds": time.perf_counter() - t0,
    }
