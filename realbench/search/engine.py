"""Search inside an engine's space (`realbench search --engine verl|openrlhf|areal`).

verl's plans are groups of per-call options that share what the engine makes its calls share
(one training engine and layout, a token budget): thousands at 128 GPUs. A group's bound
(`group_bound`) is a time per iteration none of its plans beats. The groups are searched best
bound first, each on an equal share of the budget (time, or evaluations) left among the groups
whose bound is below the best plan found so far, and on at least 1/64 of it, so that the most
promising ones get a real search; a group whose bound is not below the best plan found cannot
hold a better one and is not searched. The groups' estimators share their options' costs
(groups repeat most options).

OpenRLHF's settings are global (one DeepSpeed strategy, one micro-batch size, groups of GPUs):
nearly every plan is its own group, so its plans are listed whole (`plan_table`) and evaluated
in batches, in an order shuffled by the seed, until they are all evaluated or the budget ends;
so are AReaL's (a rollout and a trainer layout per plan, a few thousand on the built-in
scenarios). One event stream for the whole search: the groups' evaluations and seconds add up.
Each plan is priced as the engine runs it (realbench.engines.priced_as)."""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np

from realbench.cost import Estimator
from realbench.cost.calls import serving_cache_problem
from realbench.engines import engine_module, priced_as, refuse_uncarried
from realbench.engines.interface import Engine
from realbench.errors import ConfigError
from realbench.plan.mesh import Option
from realbench.plan.scenario import Scenario
from realbench.search import run_search
from realbench.search.events import EventSink, SearchEvent, Tracker


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


def widest_share(scenario: Scenario, options: dict[str, Option], time_s: float, profile=None) -> dict[str, Option]:
    """The plan with its rollout server's share of each GPU's memory raised to the largest the
    search offers (listing.SEARCHED_MEMORY_FRACTIONS) that still fits and takes no longer than
    `time_s`: the search offers each count of slots at its least share (listing.served_shares),
    but a server given more memory holds more of its sequences' cache (fewer preemptions, which
    are not priced) at no cost the plan can see."""
    from realbench.engines.listing import SEARCHED_MEMORY_FRACTIONS, with_share

    gen = options.get("actor_gen")
    if gen is None or gen.strategy.memory_fraction is None:
        return options
    for share in sorted((f for f in SEARCHED_MEMORY_FRACTIONS if f > gen.strategy.memory_fraction), reverse=True):
        wider = {**options, "actor_gen": with_share(gen, share)}
        est = Estimator(scenario, profile=profile, only={n: [o] for n, o in wider.items()})
        if plan_time(est, wider) <= time_s:
            return wider
    return options


FOCUS = 64  # a group's search gets at least 1/FOCUS of the budget


@dataclass(frozen=True)
class EngineSearchResult:
    engine: str
    method: str
    best: dict[str, Option]
    best_time_s: float
    groups: int
    evaluations: int
    seconds: float
    searched: Optional[int] = None  # groups searched
    ruled_out: Optional[int] = None  # groups not searched, none of whose plans beats the best (its bound)


def group_bound(est: Estimator) -> float:
    """A time per iteration that no plan of `est`'s options beats (inf: a call has no option that
    fits alone). A device runs one call at a time, so an iteration takes at least, on each
    device, the sum over the calls that run there of their fastest options (calls whose options
    are all on one mesh: the others are left out, which keeps it a bound); reallocation and data
    transfers only add to it."""
    meshes: list[tuple[int, int, float]] = []
    for i in range(est.n):
        k = est.candidates(i)
        if not len(k):
            return math.inf
        lo, hi = est.lo[i][k], est.hi[i][k]
        if (lo == lo[0]).all() and (hi == hi[0]).all():
            meshes.append((int(lo[0]), int(hi[0]), float(np.minimum(est.dur[i][k], est.alone[i][k]).min())))
    return max((sum(t for lo, hi, t in meshes if lo <= d < hi) for d, _, _ in meshes), default=0.0)


def engine_search(scenario: Scenario, engine: str, method: str, time_budget: float, seed: int = 0,
                  profile=None, on_event: Optional[EventSink] = None, stop: Optional[Callable[[], bool]] = None,
                  max_evaluations: Optional[int] = None) -> EngineSearchResult:
    spec = engine_module(engine)
    refuse_uncarried(scenario)  # (settings that would change the run are not searched past)
    scenario = priced_as(scenario, engine)
    if spec.plan_table is not None:
        return _listed(scenario, engine, spec, method, time_budget, seed, profile, on_event, stop, max_evaluations)
    start = time.perf_counter()
    costs: dict = {}
    # the groups and their bounds (at 128 GPUs most of a 30 s search): the bar moves meanwhile
    bounding = Tracker(f"{method} in {engine}", time_budget, on_event=on_event, start=start)
    groups, estimators, bounds = [], [], []
    for only in spec.plan_groups(scenario):
        groups.append(only)
        estimators.append(Estimator(scenario, profile=profile, only=only, shared_costs=costs))
        bounds.append(group_bound(estimators[-1]))
        bounding.emit()
        if stop is not None and stop():
            break
    if not groups:
        raise ConfigError(f"{engine} can run no plan of this scenario on its cluster")
    # the searches get what is left of the budget, and at least half of it (listing the groups of a
    # long-tailed job runs verl's packer on every budget, which can take longer than the budget)
    searching = time.perf_counter()
    order = sorted((g for g in range(len(groups)) if math.isfinite(bounds[g])), key=lambda g: (bounds[g], g))
    ordered = [bounds[g] for g in order]
    best: tuple[float, Optional[dict[str, Option]]] = (math.inf, None)
    evaluations, searched = 0, set()
    last_event: Optional[SearchEvent] = None
    for k, g in enumerate(order):
        if bounds[g] >= best[0] or (stop is not None and stop()):
            break  # (the groups after it are bound no lower)
        now = time.perf_counter()
        left_s = max(time_budget - (now - start), time_budget / 2 - (now - searching))
        if searched and (left_s <= 0 or (max_evaluations is not None and evaluations >= max_evaluations)):
            break
        rest = bisect.bisect_left(ordered, best[0]) - k  # groups that may hold a better plan
        share = max(left_s / rest, time_budget / FOCUS)
        cap = None if max_evaluations is None else max(1, (max_evaluations - evaluations) // rest,
                                                       max_evaluations // FOCUS)
        done = evaluations

        def forward(e: SearchEvent) -> None:  # the groups' counts and seconds add up
            nonlocal last_event
            last_event = replace(e, method=f"{method} in {engine}", seconds=time.perf_counter() - start,
                                 evaluations=done + e.evaluations, budget_s=time_budget,
                                 best_time_s=min(best[0], e.best_time_s), done=False)
            if on_event is not None:
                on_event(last_event)

        try:
            result = run_search(estimators[g], method, share, seed=seed, on_event=forward, stop=stop,
                                max_evaluations=cap)
        except ConfigError:  # (exhaustive over too large a group: the others are still searched)
            continue
        searched.add(g)
        evaluations += result.evaluations
        if result.best_choice is not None and result.best_time_s < best[0]:
            best = (result.best_time_s, estimators[g].options_of(result.best_choice))
    if best[1] is None:
        raise ConfigError(f"no plan {engine} can run fits in memory", "--engine")
    seconds = time.perf_counter() - start
    if on_event is not None and last_event is not None:
        on_event(replace(last_event, seconds=seconds, evaluations=evaluations, best_time_s=best[0], done=True))
    ruled_out = sum(1 for g in range(len(groups)) if g not in searched and bounds[g] >= best[0])
    return EngineSearchResult(engine, method, widest_share(scenario, best[1], best[0], profile), best[0], len(groups),
                              evaluations, seconds, len(searched), ruled_out)


CHUNK = 2048


def _listed(scenario: Scenario, engine: str, spec: Engine, method: str, time_budget: float, seed: int, profile,
            on_event: Optional[EventSink], stop: Optional[Callable[[], bool]], max_evaluations: Optional[int]
            ) -> EngineSearchResult:
    """Every plan the engine can run (its plan_table), evaluated in batches in an order
    shuffled by `seed` until all are evaluated or the budget ends (`method` is not used: the list
    is the search)."""
    start = time.perf_counter()
    only, table = spec.plan_table(scenario)
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
    best = widest_share(scenario, est.options_of(tracker.best_choice), tracker.best_time, profile)
    return EngineSearchResult(engine, "all plans", best, tracker.best_time, len(table), tracker.evaluations,
                              time.perf_counter() - start)
