"""Search inside an engine's space (`realbench search --engine verl|openrlhf|areal`). verl's plans are
groups of per-call options that share what the engine makes its calls share (one training engine
and layout, a token budget); each group is searched with the chosen method on a share of the
time budget, and the best plan of all groups is kept. OpenRLHF's settings are global (one
DeepSpeed strategy, one micro-batch size, groups of GPUs): nearly every plan is its own group, so
its plans are listed whole (`plan_table`) and evaluated in batches, in an order shuffled by
the seed, until they are all evaluated or the budget ends; so are AReaL's (a rollout and a
trainer layout per plan, a few thousand on the built-in scenarios). One event stream for the whole
search: the groups' evaluations and seconds add up. Each plan is priced as the engine runs it
(realbench.engines.priced_as)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np

from realbench.cost import Estimator
from realbench.cost.calls import serving_cache_problem
from realbench.engines import engine_module, priced_as, refuse_uncarried
from realbench.errors import ConfigError
from realbench.plan.mesh import Option
from realbench.plan.scenario import Scenario
from realbench.search import run_search
from realbench.search.events import EventSink, SearchEvent, Tracker


@dataclass(frozen=True)
class EngineSearchResult:
    engine: str
    method: str
    best: dict[str, Option]
    best_time_s: float
    groups: int
    evaluations: int
    seconds: float


def plan_time(est: Estimator, options: dict[str, Option]) -> float:
    """A plan's time per iteration, inf when it does not fit in memory (a configuration an engine
    would run, compared with the engine's best), its rollout server's cache included (one whose
    share of the GPU holds no whole sequence does not start: calls.serving_cache_problem)."""
    for name, option in options.items():
        call = est.scenario.dataflow.call(name)
        if serving_cache_problem(call, est.scenario.model_of(call), est.scenario.cluster, option.strategy):
            return math.inf
    result = est.estimate(est.choice_of(options))
    return math.inf if result.oom else result.time_per_iter_s


def engine_search(scenario: Scenario, engine: str, method: str, time_budget: float, seed: int = 0,
                  profile=None, on_event: Optional[EventSink] = None, stop: Optional[Callable[[], bool]] = None,
                  max_evaluations: Optional[int] = None) -> EngineSearchResult:
    module = engine_module(engine)
    refuse_uncarried(scenario)  # (settings that would change the run are not searched past)
    scenario = priced_as(scenario, engine)
    if hasattr(module, "plan_table"):
        return _listed(scenario, engine, module, method, time_budget, seed, profile, on_event, stop, max_evaluations)
    groups = list(module.plan_groups(scenario))
    if not groups:
        raise ConfigError(f"{engine} can run no plan of this scenario on its cluster")
    start = time.perf_counter()
    best: tuple[float, Optional[dict[str, Option]]] = (math.inf, None)
    evaluations, share = 0, time_budget / len(groups)
    for i, only in enumerate(groups):
        done = evaluations

        def forward(e: SearchEvent) -> None:  # the groups' counts and seconds add up
            if on_event is not None:
                on_event(replace(e, method=f"{method} in {engine}", seconds=time.perf_counter() - start,
                                 evaluations=done + e.evaluations, budget_s=time_budget,
                                 best_time_s=min(best[0], e.best_time_s), done=e.done and i == len(groups) - 1))

        est = Estimator(scenario, profile=profile, only=only)
        left = None if max_evaluations is None else max(1, (max_evaluations - evaluations) // (len(groups) - i))
        try:
            result = run_search(est, method, share, seed=seed, on_event=forward, stop=stop, max_evaluations=left)
        except ConfigError:  # (exhaustive over too large a group: the others are still searched)
            continue
        evaluations += result.evaluations
        if result.best_choice is not None and result.best_time_s < best[0]:
            best = (result.best_time_s, est.options_of(result.best_choice))
        if stop is not None and stop():
            break
    if best[1] is None:
        raise ConfigError(f"no plan {engine} can run fits in memory", "--engine")
    return EngineSearchResult(engine, method, best[1], best[0], len(groups), evaluations, time.perf_counter() - start)


CHUNK = 2048


def _listed(scenario: Scenario, engine: str, module, method: str, time_budget: float, seed: int, profile,
            on_event: Optional[EventSink], stop: Optional[Callable[[], bool]], max_evaluations: Optional[int]
            ) -> EngineSearchResult:
    """Every plan the engine can run (module.plan_table), evaluated in batches in an order
    shuffled by `seed` until all are evaluated or the budget ends (`method` is not used: the list
    is the search)."""
    start = time.perf_counter()
    only, table = module.plan_table(scenario)
    if not table:
        raise ConfigError(f"{engine} can run no plan of this scenario on its cluster")
    est = Estimator(scenario, profile=profile, only=only)
    rows = np.array(table, dtype=np.int64)[:, [list(only).index(n) for n in est.call_names]]
    rows = rows[np.random.default_rng(seed).permutation(len(rows))]
    tracker = Tracker(f"all plans in {engine}", time_budget, max_evaluations, on_event, stop, start=start)
    for s in range(0, len(rows), CHUNK):
        t, mem = est.evaluate_batch(rows[s:s + CHUNK])
        tracker.observe(rows[s:s + CHUNK], t, mem, mem <= est.capacity)
        if tracker.should_stop():
            break
    tracker.emit(done=True)
    if tracker.best_choice is None:
        raise ConfigError(f"no plan {engine} can run fits in memory", "--engine")
    return EngineSearchResult(engine, "all plans", est.options_of(tracker.best_choice), tracker.best_time, len(table),
                              tracker.evaluations, time.perf_counter() - start)
