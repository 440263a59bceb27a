"""Plan search: MCMC, Optuna samplers (TPE, CMA-ES, GP, random, multi-objective), exhaustive
search for small spaces, and the baselines, behind one entry point with one event stream."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

from realbench.cost import Estimator
from realbench.cost.baselines import BASELINES
from realbench.errors import ConfigError
from realbench.search.events import EventSink, SearchEvent, Tracker
from realbench.search.space import SearchSpace

METHODS = ("mcmc", "tpe", "cmaes", "gp", "random", "exhaustive")


@dataclass(frozen=True)
class SearchResult:
    method: str
    seed: int
    best_choice: Optional[tuple[int, ...]]
    best_time_s: float
    best_mem_bytes: float
    evaluations: int
    seconds: float
    curve: tuple[tuple[float, float], ...]
    baselines: dict[str, float]  # name -> time per iteration (inf if it does not fit)
    complete: Optional[bool] = None  # exhaustive: whether every plan was evaluated
    pareto: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"method": self.method, "seed": self.seed, "best_time_s": self.best_time_s,
                "best_mem_bytes": self.best_mem_bytes, "evaluations": self.evaluations, "seconds": self.seconds,
                "baselines": self.baselines, "curve": [list(p) for p in self.curve],
                **({"complete": self.complete} if self.complete is not None else {}),
                **({"pareto": self.pareto} if self.pareto else {})}


def baseline_plans(est: Estimator) -> dict[str, tuple[tuple[int, ...], float]]:
    """name -> (plan, time per iteration or inf when it does not fit)."""
    out = {}
    for name, make in BASELINES.items():
        try:
            choice = make(est)
        except ValueError:
            continue
        t, mem = est.evaluate(choice)
        out[name] = (choice, t if mem <= est.capacity else math.inf)
    return out


def run_search(est: Estimator, method: str, time_budget: float, seed: int = 0,
               on_event: Optional[EventSink] = None, stop: Optional[Callable[[], bool]] = None,
               max_evaluations: Optional[int] = None, storage: Optional[str] = None,
               study_name: Optional[str] = None, multi_objective: bool = False,
               chains: int = 16) -> SearchResult:
    """Search a plan for `est`'s scenario. Stops at the time budget, after `max_evaluations`,
    when `stop()` is true, or on Ctrl-C, and returns the best plan that fits in memory."""
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r} (known: {', '.join(METHODS)})", "--method")
    if not time_budget > 0:
        raise ConfigError("must be positive", "--time-budget")
    try:
        space = SearchSpace(est)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    baselines = baseline_plans(est)
    study_name = study_name or f"{est.scenario.name}-{method}"
    if storage and method in ("mcmc", "exhaustive"):  # their improvements and samples become trials
        from realbench.search.record import StudyRecorder, open_study

        study = open_study(storage, study_name, est.scenario.name)
        on_event = StudyRecorder(study, space, method, then=on_event)
    tracker = Tracker(method, time_budget, max_evaluations, on_event, stop)
    feasible = [(t, c) for c, t in baselines.values() if math.isfinite(t)]
    start = space.start_plan(min(feasible)[1] if feasible else [int(c[0]) for c in space.candidates])
    complete, pareto = None, []
    try:
        if method == "mcmc":
            from realbench.search.mcmc import mcmc

            mcmc(space, start, tracker, seed=seed, chains=chains)
        elif method == "exhaustive":
            from realbench.search.exhaustive import exhaustive

            try:
                complete = exhaustive(space, tracker)
            except ValueError as e:
                raise ConfigError(str(e), "--method") from None
        else:
            from realbench.search.optuna_search import optuna_search

            pareto = optuna_search(space, method, start, tracker, seed=seed, storage=storage,
                                   study_name=study_name, multi_objective=multi_objective)
    except KeyboardInterrupt:
        pass  # return the best plan so far
    tracker.emit(done=True)
    if multi_objective and method in ("mcmc", "exhaustive"):
        raise ConfigError("--multi-objective needs an Optuna method (tpe, random, gp)")
    return SearchResult(method, seed, tracker.best_choice, tracker.best_time, tracker.best_mem,
                        tracker.evaluations, tracker.elapsed, tuple(tracker.curve),
                        {k: t for k, (_, t) in baselines.items()}, complete, pareto)


__all__ = ["METHODS", "SearchEvent", "SearchResult", "SearchSpace", "run_search", "baseline_plans"]
