"""Asynchronous against synchronous RL on this machine (`realbench bench async --json`).

A tiny GRPO job of the kind a user brings (realbench.examples.tiny_grpo_job: a checkpoint, a
file of prompts, a reward function) on 4 local processes, costed with this machine's cached
profile for its models. MCMC (`search_s` seconds, seed 0) finds the best synchronous plan and
the best plan with generation up to `staleness` iteration(s) ahead; each runs `steps` steps with
every seed of `seeds`, the two alternating (sync, async, sync, ...) so that the machine's drift
touches both:

    samples_per_s   the batch's sequences / the median step seconds after the first, measured,
                    and predicted (the estimate's time per iteration)
    speedup         asynchronous / synchronous samples per second, measured (medians over the
                    seeds) and predicted                               target >= TARGET_SPEEDUP
    reward          per seed, the reward of every step (the same number of samples either way)
                    and the final reward (mean of the last quarter of the steps); the
                    asynchronous seeds' mean should lie within the synchronous seeds' spread
    staleness       the largest of any trained batch (at most `staleness`)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

TARGET_SPEEDUP = 1.3
# quick: the searches stop after a number of plans, not a time, so that a busy machine finds the
# same plans (in 500 evaluations MCMC has not yet moved the generator off the trainer's GPUs)
QUICK = {"steps": 2, "seeds": (0,), "search_s": 60.0, "evaluations": 5000, "profiled": False}


def run(steps: int = 40, seeds=(0, 1, 2), search_s: float = 5.0, staleness: int = 1, processes: int = 4,
        profiled: bool = True, evaluations: int | None = None) -> dict:
    """See the module's docstring. `profiled` false: the analytic cost model (a smoke test);
    `evaluations`: the searches stop after as many plans (or `search_s`)."""
    from realbench.cost import Estimator
    from realbench.examples import tiny_grpo_job
    from realbench.plan import load_scenario
    from realbench.runtime.launch import run_plan
    from realbench.runtime.profile_cache import scenario_profile
    from realbench.search import run_search

    with tempfile.TemporaryDirectory(prefix="realbench-async-") as folder:
        path = tiny_grpo_job(Path(folder), devices=processes)
        base = load_scenario(str(path))
        profile = scenario_profile(base, note=lambda line: print(line, file=sys.stderr)) if profiled else None
        plans = {}
        for key, scenario in (("synchronous", base), ("asynchronous", base.with_staleness(staleness))):
            est = Estimator(scenario, profile=profile)
            choice = run_search(est, "mcmc", search_s, seed=0, max_evaluations=evaluations).best_choice
            options = est.options_of(choice)
            plans[key] = (scenario, options, est.estimate(choice))
        rows = {key: [] for key in plans}
        for seed in seeds:
            for key, (scenario, options, _) in plans.items():
                rows[key].append(run_plan(scenario, options, nproc=processes, steps=steps, seed=seed,
                                          profile=profile))
    samples = base.dataflow.call("actor_train").seqs  # the sequences a step trains on
    out = {"benchmark": "async", "scenario": base.name, "processes": processes, "steps": steps,
           "seeds": list(seeds), "max_staleness": staleness, "profiled": profiled}
    for key, (scenario, options, estimate) in plans.items():
        G = scenario.cluster.gpus_per_node
        measured = [samples / r["measured_iter_s"] for r in rows[key]]
        rewards = [[m["reward"] for m in r["metrics"]] for r in rows[key]]
        tail = max(1, steps // 4)
        out[key] = {
            "plan": {n: o.label(G) for n, o in options.items()},
            "samples_per_s": {"measured": statistics.median(measured), "per_seed": measured,
                              "predicted": samples / estimate.time_per_iter_s},
            "reward": rewards, "final_reward": [statistics.fmean(r[-tail:]) for r in rewards],
            "staleness": max(m.get("staleness", 0) for r in rows[key] for m in r["metrics"]),
        }
    sync, ahead = out["synchronous"], out["asynchronous"]
    out["speedup"] = {k: ahead["samples_per_s"][k] / sync["samples_per_s"][k] for k in ("measured", "predicted")}
    out["meets_speedup_target"] = out["speedup"]["measured"] >= TARGET_SPEEDUP
    finals = sync["final_reward"]
    out["reward_within_sync_spread"] = min(finals) <= statistics.fmean(ahead["final_reward"]) <= max(finals)
    return out
