"""What searching inside an engine gains, and what reallocation across calls adds beyond it
(`realbench bench engines --json`). A row per engine and built-in GPU scenario: the estimate of
the engine's example configuration for the scenario's job (named), of its default
configuration, the best plan inside the engine (`search --engine`), and realbench's own best
(`search`, its whole space: every call its own placement, each replica whole, as realbench's
runtime runs it) and realbench's best as an engine with reallocation would run it: the
engines' data-parallel sharding offered too (`search --zero`) and the rows packed without
padding as verl and AReaL pack them (`training.padding_free`; a plan to price, not one
realbench's runtime runs), each searched with MCMC for the same budget and seed; the presets'
analytic model prices them all. A configuration that does not fit in memory has no time (null).
An engine that cannot run the scenario's job as it is (AReaL runs no reward model: its rollout
workflow scores with a function) gets the job as it runs it (`job_of`, `reward: function` in its
rows), and realbench's own best of that job beside it. A job of a mixture of experts
(grpo-qwen3-30b-a3b-16gpu) is priced as each engine's own example for such a model where it has one
(`engines.example_of`: verl's Megatron recipe, AReaL's tau2 example; OpenRLHF's, which has no expert
parallelism, is its usual example), and searched with the expert layouts each engine has."""

from __future__ import annotations

import math
from typing import Callable, Optional

from realbench.cost import Estimator
from realbench.engines import ENGINES, as_example, example_of, priced_as
from realbench.plan import get_builtin
from realbench.search import run_search
from realbench.search.engine import engine_search, plan_time

SCENARIOS = ("grpo-7b-16gpu", "ppo-7b-7b-16gpu", "ppo-13b-7b-32gpu", "ppo-70b-7b-128gpu", "grpo-8b-32gpu-longtail",
             "ppo-8b-16gpu-longtail", "grpo-7b-lora-8gpu",
             # a mixture of experts (Qwen3-30B-A3B, 128 experts, 8 a token, on 16 H100): each engine's own example
             # for such a model where it has one (verl's Megatron recipe, AReaL's tau2 example; example_of),
             # expert parallelism searched where the engine has it (verl's Megatron and rollout, AReaL's Megatron)
             "grpo-qwen3-30b-a3b-16gpu")
# quick: the engines whose plans are listed (OpenRLHF, AReaL) price them all whatever the machine's
# speed (74,474 OpenRLHF plans take 2 s here), so that their best is the best of every plan
QUICK = {"scenarios": ("grpo-7b-16gpu",), "budget_s": 2.0, "listed_budget_s": math.inf}


def run(scenarios=SCENARIOS, budget_s: float = 30.0, seed: int = 0,
        on_progress: Optional[Callable[[int, int], None]] = None, listed_budget_s: Optional[float] = None) -> dict:
    """The rows; `on_progress(done, total)` after each (the CLI's bar: a row takes a few searches).
    `listed_budget_s`: the budget of the engines whose plans are listed whole (None: `budget_s`)."""
    rows = []
    for name in scenarios:
        scenario = get_builtin(name)
        est = Estimator(scenario)
        G = scenario.cluster.gpus_per_node
        own = run_search(est, "mcmc", budget_s, seed=seed)
        zero = {}  # realbench's own best with zero offered, of each job (the scenario's: True; AReaL's)
        for engine, spec in ENGINES.items():
            # the job as the engine can run it (AReaL scores with its workflow's reward function, not
            # a reward model), beside realbench's own best of that same job
            job = spec.job_of(scenario)
            est_job, own_job = (est, own) if job is scenario else (Estimator(job), None)
            if own_job is None:
                own_job = run_search(est_job, "mcmc", budget_s, seed=seed)
            if (job is scenario) not in zero:
                est_zero = Estimator(job.with_zero().with_padding_free(True))
                zero[job is scenario] = (est_zero, run_search(est_zero, "mcmc", budget_s, seed=seed))
            est_zero, own_zero = zero[job is scenario]
            listed = spec.plan_table is not None and listed_budget_s is not None
            best = engine_search(job, engine, "mcmc", listed_budget_s if listed else budget_s, seed=seed)
            as_run = Estimator(priced_as(job, engine))  # what the engine runs, priced as it runs it
            shown = example_of(scenario, engine)  # (the engine's example for the job: verl's and AReaL's for experts)
            example, default = plan_time(Estimator(as_example(job, engine)),
                                         spec.default_plan(scenario, shown["settings"])), \
                plan_time(as_run, spec.default_plan(scenario))
            finite = lambda t: t if math.isfinite(t) else None  # noqa: E731 (null: does not fit in memory)
            rows.append({
                "engine": engine, "version": spec.version, "scenario": name, "example": shown["source"],
                "method": best.method, "evaluations": best.evaluations, "plans": best.groups,
                "example_s": finite(example), "default_s": finite(default), "best_s": best.best_time_s,
                "best_plan": {n: o.label(G) for n, o in best.best.items()},
                "reward": "function" if job is not scenario else "as the scenario",
                "realbench_s": own_job.best_time_s,
                "realbench_plan": {n: o.label(G) for n, o in est_job.options_of(own_job.best_choice).items()},
                # what a user of the engine gains by searching (null: neither configuration fits)
                "search_gain": finite(min(example, default) / best.best_time_s),
                "realbench_gain": best.best_time_s / own_job.best_time_s,  # > 1: realbench's own space is faster
                "realbench_zero_s": own_zero.best_time_s,
                "realbench_zero_plan": {n: o.label(G) for n, o in est_zero.options_of(own_zero.best_choice).items()},
                # > 1: reallocation across calls beats the engine's best, both with the engines' sharding
                "reallocation_gain": best.best_time_s / own_zero.best_time_s,
                "not_priced": list(spec.pricing_gaps)})
            if on_progress:
                on_progress(len(rows), len(scenarios) * len(ENGINES))
    return {"budget_s": budget_s, "seed": seed, "method": "mcmc", "rows": rows}
