"""Search quality and speed (`realbench bench search --json`).

1. Paper-like scenarios: the best symmetric plan, the heuristic, and every method (MCMC and the
   Optuna samplers TPE, CMA-ES, GP, random) with a fixed budget over several seeds: best time per
   iteration, speedup over both baselines, the seeds in which the method beats the best
   baseline, evaluations per second, and the seconds each run took to come within 1% of its own
   final best.
2. TPE with a longer budget (`long_budget_s`) on `long_scenarios` against MCMC's median result of
   part 1 (target: within 3%).
3. Scenarios small enough for exhaustive search: the true optimum, and the share of seeds in
   which MCMC and TPE come within 1% of it in at most `exact_budget_s` seconds (target 0.9).
4. Ablations on `ablation_scenario`: the Optuna samplers without the descent each trial makes
   (the plan as sampled), and TPE modelling each parameter alone (not multivariate).
5. Scale: MCMC for `scale_budget_s` on a PPO job of 1,024 GPUs (`scale_scenario`) against both
   baselines (target: faster than the symmetric baseline within 60 s).
6. Long tails: on `tail_scenarios`, MCMC plans the length distribution and the mean length
   (`realbench.search.tail`: the mean twin with later calls at the mean width, and at the padded
   width) with the same budget, and the plans are judged on the same seeded sampled lengths.
7. Asynchronous RL: on `async_scenarios`, MCMC with generation allowed `async_staleness`
   iterations ahead against MCMC synchronous, the same budget and seed: both bests, the speedup,
   and the devices each best gives generation alone.
8. LoRA: on `lora_scenarios`, MCMC's plan for the job as given (adapters trained, the reference
   the base) against MCMC's plan for its full fine-tuning twin (`full_fine_tuning`), the same
   budget and seed: both bests, their plans, the calls that keep their own copy of the trained
   model (under LoRA of its frozen base, to which only the adapters move), reallocation seconds
   and peak memory.
"""

from __future__ import annotations

import math
import statistics

from realbench.cost import Estimator
from realbench.dataflow import CallKind
from realbench.plan import PAPER_LIKE, get_builtin
from realbench.search import SamplerSettings, run_search

EXACT = ("ppo-tiny-2cpu", "grpo-tiny-cpu", "dpo-7b-8gpu")
RACED = ("mcmc", "tpe", "cmaes", "gp", "random")
TARGET_SHARE = 0.9
TPE_TARGET = 0.03  # TPE's long run within 3% of MCMC's result
TAIL_SCENARIOS = ("grpo-8b-32gpu-longtail", "ppo-8b-16gpu-longtail")
LORA_SCENARIOS = ("grpo-7b-lora-8gpu",)
ASYNC_SCENARIOS = ("grpo-7b-16gpu", "ppo-7b-7b-16gpu", "ppo-70b-7b-128gpu", "grpo-8b-32gpu-longtail",
                   "ppo-8b-16gpu-longtail")


def _time_to_within(curve, final: float, tol: float = 0.01) -> float:
    for seconds, best in curve:
        if best <= final * (1 + tol):
            return seconds
    return math.inf


def _runs(est: Estimator, method: str, budget_s: float, seeds, **kwargs) -> tuple[dict, dict]:
    """A method's runs over the seeds, summarized, and the baselines they were measured against."""
    runs = [run_search(est, method, budget_s, seed=s, **kwargs) for s in seeds]
    base = runs[0].baselines
    best_baseline = min(base.values())
    median = statistics.median(r.best_time_s for r in runs)
    return {
        "best_time_s": [r.best_time_s for r in runs], "median_best_time_s": median,
        "speedup_vs_symmetric": base["symmetric"] / median,
        "speedup_vs_heuristic": base["heuristic"] / median if math.isfinite(base["heuristic"]) else None,
        "seeds_beating_best_baseline": sum(r.best_time_s < best_baseline * (1 - 1e-9) for r in runs),
        "seconds_to_1pct": [_time_to_within(r.curve, r.best_time_s) for r in runs],
        "evaluations": [r.evaluations for r in runs],
        "evaluations_per_s": statistics.median(r.evaluations / r.seconds for r in runs),
    }, base


def run(scenarios=PAPER_LIKE, methods=RACED, budget_s: float = 20.0, seeds=(0, 1, 2),
        long_scenarios=("ppo-7b-7b-16gpu", "ppo-70b-7b-128gpu"), long_budget_s: float = 60.0,
        exact=EXACT, exact_methods=("mcmc", "tpe"), exact_budget_s: float = 10.0, exact_seeds=tuple(range(10)),
        ablation_scenario: str = "ppo-70b-7b-128gpu", ablation_methods=("tpe", "random"),
        scale_scenario: str = "ppo-70b-8b-1024gpu", scale_budget_s: float = 60.0, scale_seed: int = 0,
        tail_scenarios=TAIL_SCENARIOS, tail_steps: int = 8, async_scenarios=ASYNC_SCENARIOS,
        async_staleness: int = 1, lora_scenarios=LORA_SCENARIOS) -> dict:
    out = {"benchmark": "search", "budget_s": budget_s, "seeds": list(seeds), "scenarios": {}, "long": {},
           "exact": {}, "ablations": {}}
    estimators = {}

    def estimator(name: str) -> Estimator:
        if name not in estimators:
            estimators[name] = Estimator(get_builtin(name))
        return estimators[name]

    for name in scenarios:
        row = {}
        for m in methods:
            row[m], row["baselines"] = _runs(estimator(name), m, budget_s, seeds)
        out["scenarios"][name] = row
    for name in long_scenarios:
        r, _ = _runs(estimator(name), "tpe", long_budget_s, seeds)
        mcmc = out["scenarios"].get(name, {}).get("mcmc")
        reference = mcmc["median_best_time_s"] if mcmc else None
        out["long"][name] = {"method": "tpe", "budget_s": long_budget_s, "median_best_time_s": r["median_best_time_s"],
                             "best_time_s": r["best_time_s"], "mcmc_median_best_time_s": reference,
                             "ratio_to_mcmc": r["median_best_time_s"] / reference if reference else None,
                             "within_target": bool(reference) and r["median_best_time_s"] <= reference * (1 + TPE_TARGET)}
    for name in exact:
        est = estimator(name)
        truth = run_search(est, "exhaustive", 3600.0)
        row = {"optimum_s": truth.best_time_s, "plans_enumerated": truth.evaluations,
               "exhaustive_seconds": truth.seconds, "complete": truth.complete}
        target = truth.best_time_s * 1.01
        for method in exact_methods:
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
    if ablation_scenario:
        est = estimator(ablation_scenario)
        variants = {f"{m}-no-descent": (m, dict(descent=False)) for m in ablation_methods}
        if "tpe" in ablation_methods:
            variants["tpe-univariate"] = ("tpe", dict(settings=SamplerSettings(multivariate=False)))
        out["ablations"] = {"scenario": ablation_scenario}
        for label, (method, kwargs) in variants.items():
            r, _ = _runs(est, method, budget_s, seeds, **kwargs)
            out["ablations"][label] = {k: r[k] for k in ("median_best_time_s", "seeds_beating_best_baseline",
                                                         "evaluations_per_s")}
    if scale_scenario:
        scenario = get_builtin(scale_scenario)
        r = run_search(Estimator(scenario), "mcmc", scale_budget_s, seed=scale_seed)
        out["scale"] = {"scenario": scale_scenario, "gpus": scenario.cluster.n_devices, "budget_s": scale_budget_s,
                        "seed": scale_seed, "best_time_s": r.best_time_s, "baselines": r.baselines,
                        "speedup_vs_symmetric": r.baselines["symmetric"] / r.best_time_s,
                        "evaluations": r.evaluations, "beats_symmetric": r.best_time_s < r.baselines["symmetric"]}
    if tail_scenarios:
        from realbench.search.tail import compare

        out["tail"] = {name: compare(get_builtin(name), "mcmc", budget_s, seed=seeds[0], steps=tail_steps)
                       for name in tail_scenarios}
    if async_scenarios:
        out["async"] = {name: compare_async(get_builtin(name), async_staleness, budget_s, seeds[0])
                        for name in async_scenarios}
    if lora_scenarios:
        out["lora"] = {name: compare_lora(get_builtin(name), budget_s, seeds[0]) for name in lora_scenarios}
    shares = [v for row in out["exact"].values() for k, v in row.items() if k.endswith("_share_within_1pct")]
    out["meets_exact_target"] = bool(shares) and min(shares) >= TARGET_SHARE
    majority = len(seeds) // 2 + 1
    out["every_method_beats_baselines"] = all(row[m]["seeds_beating_best_baseline"] >= majority
                                              for row in out["scenarios"].values() for m in methods)
    out["tpe_within_target"] = bool(out["long"]) and all(r["within_target"] for r in out["long"].values())
    return out


def compare_async(scenario, staleness: int, budget_s: float, seed: int) -> dict:
    """MCMC's best plan with generation up to `staleness` iterations ahead and its synchronous
    best, the same budget and seed."""
    out = {"max_staleness": staleness}
    for key, s in (("synchronous", scenario.with_staleness(0)), ("asynchronous", scenario.with_staleness(staleness))):
        est = Estimator(s)
        r = run_search(est, "mcmc", budget_s, seed=seed)
        options, G = est.options_of(r.best_choice), s.cluster.gpus_per_node
        generates = {n: s.dataflow.call(n).kind == CallKind.GENERATE for n in options}
        generation = set().union(*(o.mesh.devices(G) for n, o in options.items() if generates[n]))
        others = set().union(*(o.mesh.devices(G) for n, o in options.items() if not generates[n]))
        out[key] = {"best_time_s": r.best_time_s, "evaluations": r.evaluations,
                    "generation_only_devices": len(generation - others), "devices": s.cluster.n_devices,
                    "plan": {n: o.label(G) for n, o in options.items()}}
    out["speedup"] = out["synchronous"]["best_time_s"] / out["asynchronous"]["best_time_s"]
    return out


def full_fine_tuning(scenario):
    """The same job training every weight: the LoRA settings dropped, and a reference model (a
    copy of the policy's base) where the base served as the reference."""
    from realbench.plan.scenario import POLICY, REFERENCE, scenario_from_document

    doc = scenario.to_document()
    doc["name"] = f"{scenario.name}-full"
    for entry in doc["models"].values():
        if isinstance(entry, dict):
            entry.pop("lora", None)
    calls = doc["dataflow"].get("calls", [])
    if any(c.get("adapters") is False for c in calls):
        doc["models"][REFERENCE] = dict(doc["models"][POLICY])
        for c in calls:
            if c.pop("adapters", True) is False:
                c["model"] = REFERENCE
    return scenario_from_document(doc, scenario.name)


def _layout(option) -> tuple:
    s = option.strategy
    return option.mesh, s.dp, s.tp, s.pp, s.virtual_stages


def compare_lora(scenario, budget_s: float, seed: int) -> dict:
    """MCMC's best plan for a LoRA job and for its full fine-tuning twin, the same budget and
    seed; `copies`: the calls that hold their own copy of a trained model (under LoRA, of its
    frozen base, to which only the adapters move); `merged`: the calls that receive the adapters
    merged into the base every step instead."""
    out = {}
    for key, s in (("lora", scenario), ("full", full_fine_tuning(scenario))):
        est = Estimator(s)
        r = run_search(est, "mcmc", budget_s, seed=seed)
        G = s.cluster.gpus_per_node
        row = {"best_time_s": r.best_time_s, "baselines": r.baselines, "evaluations": r.evaluations}
        if r.best_choice is not None:
            options, e = est.options_of(r.best_choice), est.estimate(r.best_choice)
            train = {c.model: o for c, o in ((s.dataflow.call(n), o) for n, o in options.items())
                     if c.kind == CallKind.TRAIN}
            row.update(plan={n: o.label(G) for n, o in options.items()}, realloc_s=e.realloc_s,
                       merged=sorted(n for n, o in options.items() if o.strategy.merge_lora),
                       memory_gib=e.peak_mem_bytes / 2 ** 30,
                       copies=sorted(n for n, o in options.items() if s.dataflow.call(n).model in train
                                     and s.dataflow.call(n).kind != CallKind.TRAIN
                                     and _layout(o) != _layout(train[s.dataflow.call(n).model])))
        out[key] = row
    out["speedup"] = out["full"]["best_time_s"] / out["lora"]["best_time_s"]
    return out


QUICK = dict(scenarios=("ppo-7b-7b-16gpu",), methods=("mcmc", "tpe", "random"), budget_s=2.0, seeds=(0,),
             long_scenarios=("ppo-7b-7b-16gpu",), long_budget_s=3.0, exact=("dpo-7b-8gpu",), exact_budget_s=2.0,
             exact_seeds=(0, 1), ablation_scenario="ppo-7b-7b-16gpu", ablation_methods=("tpe",), scale_budget_s=3.0,
             tail_scenarios=("ppo-8b-16gpu-longtail",), tail_steps=2, async_scenarios=("grpo-7b-16gpu",),
             lora_scenarios=LORA_SCENARIOS)
