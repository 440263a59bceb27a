"""Search quality and speed (`realbench bench search --json`).

1. Paper-like scenarios: the best symmetric plan, the heuristic, and MCMC and TPE with a fixed
   budget over several seeds: best time per iteration, speedup over both baselines, and the
   seconds each run took to come within 1% of its own final best.
2. Scenarios small enough for exhaustive search: the true optimum, and the share of seeds in
   which MCMC and TPE come within 1% of it in at most `exact_budget_s` seconds (target 0.9).
3. Samplers without categorical support on a paper-like scenario: CMA-ES and GP (numeric
   encoding) against random sampling, same budget and seeds.
4. Scale: MCMC for `scale_budget_s` on a PPO job of 1,024 GPUs (`scale_scenario`) against both
   baselines (target: faster than the symmetric baseline within 60 s).
"""

from __future__ import annotations

import math
import statistics

from realbench.cost import Estimator
from realbench.plan import PAPER_LIKE, get_builtin
from realbench.search import run_search

EXACT = ("ppo-tiny-2cpu", "grpo-tiny-cpu", "dpo-7b-8gpu")
TARGET_SHARE = 0.9


def _time_to_within(curve, final: float, tol: float = 0.01) -> float:
    for seconds, best in curve:
        if best <= final * (1 + tol):
            return seconds
    return math.inf


def run(scenarios=PAPER_LIKE, methods=("mcmc", "tpe"), budget_s: float = 20.0, seeds=(0, 1, 2),
        exact=EXACT, exact_budget_s: float = 10.0, exact_seeds=tuple(range(10)),
        encoding_scenario: str = "ppo-7b-7b-16gpu", encoding_methods=("cmaes", "gp", "random"),
        encoding_budget_s: float = 20.0, encoding_seeds=(0, 1, 2), scale_scenario: str = "ppo-70b-8b-1024gpu",
        scale_budget_s: float = 60.0, scale_seed: int = 0) -> dict:
    out = {"benchmark": "search", "budget_s": budget_s, "seeds": list(seeds), "scenarios": {}, "exact": {},
           "encodings": {}}
    for name in scenarios:
        est = Estimator(get_builtin(name))
        row = {}
        for method in methods:
            runs = [run_search(est, method, budget_s, seed=s) for s in seeds]
            bests = [r.best_time_s for r in runs]
            base = runs[0].baselines
            row[method] = {
                "best_time_s": min(bests), "median_best_time_s": statistics.median(bests),
                "speedup_vs_symmetric": base["symmetric"] / statistics.median(bests),
                "speedup_vs_heuristic": base["heuristic"] / statistics.median(bests)
                if math.isfinite(base["heuristic"]) else None,
                "seconds_to_1pct": [_time_to_within(r.curve, r.best_time_s) for r in runs],
                "evaluations": [r.evaluations for r in runs],
            }
            row["baselines"] = base
        out["scenarios"][name] = row
    for name in exact:
        est = Estimator(get_builtin(name))
        truth = run_search(est, "exhaustive", 3600.0)
        row = {"optimum_s": truth.best_time_s, "plans_enumerated": truth.evaluations,
               "exhaustive_seconds": truth.seconds, "complete": truth.complete}
        target = truth.best_time_s * 1.01
        for method in methods:
            hits, seconds = [], []
            for s in exact_seeds:
                best = [math.inf]  # a run stops once it is within 1% of the optimum: that is what we time
                r = run_search(est, method, exact_budget_s, seed=s,
                               on_event=lambda e, best=best: best.__setitem__(0, e.best_time_s),
                               stop=lambda best=best: best[0] <= target)
                reached = _time_to_within(r.curve, truth.best_time_s)
                hits.append(r.best_time_s <= target and reached <= exact_budget_s)
                seconds.append(reached)
            row[f"{method}_share_within_1pct"] = sum(hits) / len(hits)
            row[f"{method}_seconds_to_1pct"] = seconds
        out["exact"][name] = row
    if encoding_scenario:
        est = Estimator(get_builtin(encoding_scenario))
        for method in encoding_methods:
            runs = [run_search(est, method, encoding_budget_s, seed=s) for s in encoding_seeds]
            out["encodings"][method] = {"median_best_time_s": statistics.median(r.best_time_s for r in runs),
                                        "evaluations": [r.evaluations for r in runs]}
        out["encodings"]["scenario"] = encoding_scenario
    if scale_scenario:
        scenario = get_builtin(scale_scenario)
        r = run_search(Estimator(scenario), "mcmc", scale_budget_s, seed=scale_seed)
        out["scale"] = {"scenario": scale_scenario, "gpus": scenario.cluster.n_devices, "budget_s": scale_budget_s,
                        "seed": scale_seed, "best_time_s": r.best_time_s, "baselines": r.baselines,
                        "speedup_vs_symmetric": r.baselines["symmetric"] / r.best_time_s,
                        "evaluations": r.evaluations, "beats_symmetric": r.best_time_s < r.baselines["symmetric"]}
    shares = [v for row in out["exact"].values() for k, v in row.items() if k.endswith("_share_within_1pct")]
    out["meets_exact_target"] = bool(shares) and min(shares) >= TARGET_SHARE
    out["beats_baselines"] = all(
        row[m]["median_best_time_s"] < row["baselines"]["symmetric"]
        and (not math.isfinite(row["baselines"]["heuristic"]) or row[m]["median_best_time_s"] < row["baselines"]["heuristic"])
        for row in out["scenarios"].values() for m in methods)
    return out


QUICK = dict(scenarios=("ppo-7b-7b-16gpu",), budget_s=2.0, seeds=(0,), exact=("dpo-7b-8gpu",), exact_budget_s=2.0,
             exact_seeds=(0, 1), encoding_scenario="ppo-tiny-2cpu", encoding_methods=("cmaes", "random"),
             encoding_budget_s=2.0, encoding_seeds=(0,), scale_budget_s=3.0)
