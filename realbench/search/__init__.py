"""Plan search: MCMC, Optuna samplers (TPE, CMA-ES, GP, random, multi-objective), exhaustive
search for small spaces, and the baselines, behind one entry point with one event stream."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from realbench.cost import Estimator
from realbench.cost.baselines import BASELINES
from realbench.errors import ConfigError
from realbench.search.events import EventSink, SearchEvent, Tracker
from realbench.search.settings import SamplerSettings
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
    """name -> (plan, time per iteration or inf when it does not fit). None for an estimator
    restricted to given options (an engine's space): the baselines are plans of the whole space."""
    from realbench.plan.options import OptionSet

    out = {}
    if not all(isinstance(o, OptionSet) for o in est.options):
        return out
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
               chains: int = 16, descent: bool = True, settings: Optional[SamplerSettings] = None,
               workers: int = 1, worker: int = 0) -> SearchResult:
    """Search a plan for `est`'s scenario. Stops at the time budget, after `max_evaluations`,
    when `stop()` is true, or on Ctrl-C, and returns the best plan that fits in memory.

    With a `storage`, the study may hold trials of other processes (searches sharing a study): the
    result is the best plan this method wrote to the study, re-estimated here. `workers` > 1 starts
    workers - 1 more processes on the same study (seeds seed+1, ...; a temporary journal file
    when no storage is given), as Optuna users parallelize on clusters; `stop()` and the events
    are this process's own."""
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r} (known: {', '.join(METHODS)})", "--method")
    if not time_budget > 0:
        raise ConfigError("must be positive", "--time-budget")
    if workers < 1:
        raise ConfigError("must be 1 or more", "--workers")
    if workers > 1:
        return _with_workers(est, method, time_budget, seed, workers, on_event=on_event, stop=stop,
                             max_evaluations=max_evaluations, storage=storage, study_name=study_name,
                             chains=chains, descent=descent, settings=settings)
    try:
        space = SearchSpace(est)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    baselines = baseline_plans(est)
    study_name = study_name or f"{est.scenario.name}-{method}"
    if storage and method in ("mcmc", "exhaustive"):  # their improvements and samples become trials
        from realbench.search.record import StudyRecorder, open_study

        study = open_study(storage, study_name, est.scenario.name)
        on_event = StudyRecorder(study, space, method, then=on_event, seed=seed, worker=worker)
    tracker = Tracker(method, time_budget, max_evaluations, on_event, stop)
    starts = [space.start_plan(c) for t, c in sorted((t, c) for c, t in baselines.values())]
    starts = starts or space.plain_starts()
    start = starts[0]
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

            pareto = optuna_search(space, method, starts, tracker, seed=seed, storage=storage,
                                   study_name=study_name, multi_objective=multi_objective, descent=descent,
                                   settings=settings or SamplerSettings(), worker=worker)
    except KeyboardInterrupt:
        pass  # return the best plan so far
    tracker.emit(done=True)
    if multi_objective and method in ("mcmc", "exhaustive"):
        raise ConfigError("--multi-objective needs an Optuna method (tpe, random, gp)")
    best = (tracker.best_choice, tracker.best_time, tracker.best_mem)
    if storage and not multi_objective:  # other processes may have written better plans to the study
        from realbench.search.record import best_in_study, open_study

        shared = best_in_study(open_study(storage, study_name, est.scenario.name), space, method)
        if shared is not None and shared[1] < best[1]:
            best = shared
    return SearchResult(method, seed, best[0], best[1], best[2], tracker.evaluations, tracker.elapsed,
                        tuple(tracker.curve), {k: t for k, (_, t) in baselines.items()}, complete, pareto)


def _with_workers(est: Estimator, method: str, time_budget: float, seed: int, workers: int,
                  storage: Optional[str], study_name: Optional[str], **kwargs) -> SearchResult:
    """run_search in `workers` processes on one study; the result is this process's run with the
    best plan of the study and the evaluations of all processes."""
    import concurrent.futures
    import multiprocessing
    import tempfile
    from dataclasses import replace

    study_name = study_name or f"{est.scenario.name}-{method}"
    with tempfile.TemporaryDirectory(prefix="realbench-study-") as tmp:
        storage = storage or str(Path(tmp) / "study.journal")
        common = dict(storage=storage, study_name=study_name, max_evaluations=kwargs["max_evaluations"],
                      chains=kwargs["chains"], descent=kwargs["descent"], settings=kwargs["settings"])
        # spawn, not fork: a fork of a Jupyter kernel or of a threaded caller can deadlock
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers - 1, mp_context=context) as pool:
            others = [pool.submit(run_search, est, method, time_budget, seed + w, worker=w, **common)
                      for w in range(1, workers)]
            mine = run_search(est, method, time_budget, seed, on_event=kwargs["on_event"], stop=kwargs["stop"],
                              worker=0, **common)
            results = [f.result() for f in others]
    # each process took the study's best when it ended; the last to end saw every trial
    best = min([mine, *results], key=lambda r: r.best_time_s)
    return replace(mine, best_choice=best.best_choice, best_time_s=best.best_time_s,
                   best_mem_bytes=best.best_mem_bytes,
                   evaluations=mine.evaluations + sum(r.evaluations for r in results))


__all__ = ["METHODS", "SamplerSettings", "SearchEvent", "SearchResult", "SearchSpace", "run_search", "baseline_plans"]
