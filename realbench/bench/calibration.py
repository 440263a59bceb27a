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

Then the race on RACE_SCENARIO (more processes than this machine has cores: calls that run at
once share them), costed with this machine's cached profile for its process count: the searched
plan (MCMC, RACE_SEARCH_S seconds, seed 0) against the best symmetric plan, `rounds` alternating
runs of `race_steps` steps each (A B A B ..., so that the machine's drift touches both):

    per plan: median over calls of |estimated - measured| / measured, each call's measured
              seconds the median over the rounds           target <= RACE_TARGET_CALL_ERR
    speedup:  symmetric / searched time per iteration, measured (medians over the rounds)
              and predicted; |predicted / measured - 1|   target <= RACE_TARGET_SPEEDUP_ERR
"""

from __future__ import annotations

import sys
import time
from typing import Optional

import numpy as np

TARGET_MEDIAN_ERR = 0.20
TARGET_TAU = 0.6
SCENARIOS = ("ppo-tiny-2cpu",)
QUICK = {"plans": 2, "steps": 2, "quick": True, "rounds": 1, "race_steps": 3}
RACE_SCENARIO = "ppo-tiny-cpu"
RACE_SEARCH_S = 5.0
RACE_TARGET_CALL_ERR = 0.25
RACE_TARGET_SPEEDUP_ERR = 0.20


def race(rounds: int = 3, steps: int = 16, scenario: str = RACE_SCENARIO, seed: int = 0) -> dict:
    """The searched plan against the symmetric one, in alternating runs (see the docstring)."""
    import statistics

    from realbench.cost import Estimator
    from realbench.cost.baselines import BASELINES
    from realbench.plan import load_scenario
    from realbench.runtime.launch import run_plan
    from realbench.runtime.profile_cache import scenario_profile
    from realbench.search import run_search

    s = load_scenario(scenario)
    profile = scenario_profile(s, note=lambda line: print(line, file=sys.stderr))
    est = Estimator(s, profile=profile)
    plans = {"searched": tuple(run_search(est, "mcmc", RACE_SEARCH_S, seed=seed).best_choice),
             "symmetric": tuple(BASELINES["symmetric"](est))}
    runs: dict[str, list[dict]] = {k: [] for k in plans}
    for r in range(rounds):
        for label, choice in plans.items():
            print(f"{scenario}: round {r + 1} of {rounds}, the {label} plan...", file=sys.stderr)
            runs[label].append(run_plan(s, est.options_of(choice), s.cluster.n_devices, steps, seed=seed,
                                        profile=profile, device="cpu"))
    out: dict = {"scenario": scenario, "rounds": rounds, "steps": steps, "plans": {}}
    for label, results in runs.items():
        calls = {}
        for name, first in results[0]["calls"].items():
            measured = statistics.median(x["calls"][name]["measured_s"] for x in results)
            calls[name] = {"measured_s": measured, "estimated_s": first["estimated_s"],
                           "rel_err": abs(first["estimated_s"] - measured) / measured}
        out["plans"][label] = {
            "placements": {n: o.label(s.cluster.gpus_per_node) for n, o in est.options_of(plans[label]).items()},
            "measured_iter_s": statistics.median(x["measured_iter_s"] for x in results),
            "estimated_iter_s": results[0]["estimated_iter_s"], "calls": calls,
            "median_call_rel_err": statistics.median(c["rel_err"] for c in calls.values())}
    p = out["plans"]
    measured = p["symmetric"]["measured_iter_s"] / p["searched"]["measured_iter_s"]
    predicted = p["symmetric"]["estimated_iter_s"] / p["searched"]["estimated_iter_s"]
    out.update(measured_speedup=measured, predicted_speedup=predicted,
               speedup_rel_err=abs(predicted / measured - 1),
               targets={"median_call_rel_err": RACE_TARGET_CALL_ERR, "speedup_rel_err": RACE_TARGET_SPEEDUP_ERR})
    out["meets_targets"] = bool(all(x["median_call_rel_err"] <= RACE_TARGET_CALL_ERR for x in p.values())
                                and out["speedup_rel_err"] <= RACE_TARGET_SPEEDUP_ERR)
    return out


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
        seed: int = 0, quick: bool = False, rounds: int = 3, race_steps: int = 16) -> dict:
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
        full = ProfileRequest()
        req = ProfileRequest(nproc=nproc, repeats=5 if quick else full.repeats, passes=1 if quick else full.passes,
                             call_passes=1 if quick else full.call_passes,
                             batches=(1, 2, 4, 8) if quick else full.batches, device=device)
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
        "runs": rows, "race": race(rounds, race_steps, seed=seed), "seconds": time.perf_counter() - t0,
    }
