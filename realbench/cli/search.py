"""`realbench search`: find a plan; progress bar on stderr, plan file out."""

from __future__ import annotations

import argparse
import math
import sys

from realbench.cli import (add_device_file_arg, add_profile_args, add_staleness_arg, emit_json, log, non_negative_int,
                           positive_float, positive_int, profile_for, with_device_file, with_staleness)
from realbench.cost import Estimator
from realbench.errors import ConfigError
from realbench.plan import Origin, load_scenario, plan_from_options, scenario_ref
from realbench.schema import write_document
from realbench.engines import ENGINES
from realbench.search import METHODS, SamplerSettings, SearchEvent, run_search

ENGINE_NAMES = tuple(ENGINES)


def add_parser(sub) -> None:
    p = sub.add_parser("search", help="search an execution plan")
    p.add_argument("--scenario", required=True, help="built-in name or scenario file")
    p.add_argument("--method", required=True, choices=METHODS, help="the search method (Optuna's samplers: tpe, cmaes, gp, random)")
    p.add_argument("--time-budget", type=positive_float, required=True, metavar="SEC", help="wall-clock seconds to search")
    p.add_argument("--seed", type=non_negative_int, default=0, help="the search's random seed")
    p.add_argument("--max-evals", type=non_negative_int, default=None,
                   help="also stop after this many plan evaluations (makes seeded runs reproducible)")
    p.add_argument("--out", help="write the best plan here (.yaml or .json)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--storage", help="Optuna storage URL, e.g. sqlite:///plans.db: every method writes its trials "
                                     "there (MCMC and exhaustive: improvements and periodic samples)")
    p.add_argument("--study-name", help="the study in --storage, joined when it exists (one study for a race); "
                                        "default SCENARIO-METHOD-seedN")
    p.add_argument("--workers", type=positive_int, default=1, metavar="N",
                   help="search in N processes sharing one study (--storage, or a temporary journal file); "
                        "seeds SEED..SEED+N-1; the best plan of all is reported")
    p.add_argument("--startup-trials", type=non_negative_int, default=None, metavar="N",
                   help="TPE, GP: random trials before the sampler models results (default: Optuna's, 10)")
    p.add_argument("--multivariate", action=argparse.BooleanOptionalAction, default=True,
                   help="TPE: model the parameters jointly (default) or one by one")
    p.add_argument("--no-descent", dest="descent", action="store_false",
                   help="Optuna methods: report sampled plans as they are, without descending to a local optimum")
    p.add_argument("--multi-objective", action="store_true",
                   help="Optuna methods: minimize time and peak memory, report the Pareto front")
    p.add_argument("--engine", choices=ENGINE_NAMES,
                   help="search only the plans this engine runs (its space: realbench.engines) and report the best "
                        "beside the engine's default configuration, or beside --plan")
    p.add_argument("--plan", help="with --engine: the plan to compare with (e.g. an imported configuration's)")
    p.add_argument("--zero", action="store_true",
                   help="also offer data-parallel sharding (zero 1-3), as the engines train: plans to price and to "
                        "compare with theirs, which realbench's own runtime does not run")
    add_staleness_arg(p)
    add_profile_args(p)
    add_device_file_arg(p)
    p.add_argument("--json", action="store_true", help="print the best plan and its estimate as JSON")
    p.set_defaults(handler=run)
    p.epilog = ("With max_staleness S > 0 (asynchronous RL), a synchronous search of the same method and budget "
                "follows, and both bests are reported.")


def run(args) -> int:
    scenario = with_device_file(args, with_staleness(args, load_scenario(args.scenario)))
    if args.zero:
        if args.engine:
            raise ConfigError("an engine's space has its own sharding (--engine searches what the engine runs)",
                              "--zero")
        scenario = scenario.with_zero()
    if args.out and not args.force:
        from pathlib import Path

        if Path(args.out).exists():  # refuse before spending the budget, not after
            raise ConfigError("exists; pass --force to overwrite it", source=args.out)
    study_name = args.study_name or f"{scenario.name}-{args.method}-seed{args.seed}"
    if args.storage:  # a bad storage or another scenario's study is refused before this machine is profiled
        from realbench.search.record import open_study

        open_study(args.storage, study_name, scenario.name)
    if args.plan and not args.engine:
        raise ConfigError("compares an engine's best plan with this one: give --engine", "--plan")
    if args.engine:
        return _engine_search(args, scenario)
    profile = profile_for(args, scenario)
    est = Estimator(scenario, profile=profile)
    result = _search(args, est, args.storage, study_name)
    out = result.to_json()
    out["scenario"] = scenario.name
    out["speedup"] = {k: (v / result.best_time_s if math.isfinite(v) else None) for k, v in result.baselines.items()}
    G = scenario.cluster.gpus_per_node
    out["plan"] = {n: o.label(G) for n, o in est.options_of(result.best_choice).items()}
    out["max_staleness"] = est.staleness
    if est.staleness:  # the synchronous best, searched the same way, for comparison
        sync_est = Estimator(scenario.with_staleness(0), profile=profile)
        sync = _search(args, sync_est, None, "", label=f"{args.method} (synchronous)")
        out["synchronous"] = {"best_time_s": sync.best_time_s, "evaluations": sync.evaluations,
                              "seconds": sync.seconds,
                              "plan": {n: o.label(G) for n, o in sync_est.options_of(sync.best_choice).items()}}
        out["async_speedup"] = sync.best_time_s / result.best_time_s
    for p in out.get("pareto", []):
        p["plan"] = {n: o.label(G) for n, o in est.options_of(p.pop("choice")).items()}
    if args.out:
        origin = Origin(method=args.method, seed=args.seed, evaluations=result.evaluations, seconds=result.seconds,
                        time_per_iter_s=result.best_time_s, curve=result.curve,
                        baselines={k: v for k, v in result.baselines.items() if math.isfinite(v)})
        doc = plan_from_options(scenario, est.options_of(result.best_choice), origin,
                                scenario_ref=scenario_ref(args.scenario, args.out)).to_document()
        write_document(doc, args.out, overwrite=args.force)
        log(f"wrote {args.out}")
    if args.json:
        emit_json(out)
    else:
        base = ", ".join(f"{k} {v:.3f} s ({out['speedup'][k]:.2f}x)" for k, v in result.baselines.items()
                         if math.isfinite(v))
        print(f"{args.method}: best {result.best_time_s:.4f} s per iteration after {result.evaluations} plans "
              f"in {result.seconds:.1f} s; baselines: {base}")
        for name, label in out["plan"].items():
            print(f"  {name:14s} {label}")
        if est.staleness:
            print(f"synchronous best {out['synchronous']['best_time_s']:.4f} s per iteration: running generation up "
                  f"to {est.staleness} iteration(s) ahead is {out['async_speedup']:.2f}x as fast")
    return 0


def _engine_search(args, scenario) -> int:
    """--engine: the best plan inside the engine's space, beside its default configuration's (or
    --plan's) and realbench's unconstrained baselines."""
    from realbench.engines import engine_module, priced_as
    from realbench.plan import load_plan
    from realbench.search.engine import engine_search, plan_time

    for flag, given in (("--storage", args.storage), ("--workers", args.workers > 1),
                        ("--multi-objective", args.multi_objective)):
        if given:
            raise ConfigError("is not used with --engine", flag)
    spec = engine_module(args.engine)
    problem = spec.space_problem_of_scenario(scenario)
    if problem:
        raise ConfigError(problem[1], problem[0])
    if args.plan:
        compared, compared_name = load_plan(args.plan, scenario)[2], args.plan
        problem = spec.space_problem(scenario, compared)
        if problem:
            raise ConfigError(f"{args.engine} cannot run it: {problem[0]}: {problem[1]}", source=args.plan)
    else:
        compared, compared_name = spec.default_plan(scenario), f"{args.engine}'s default configuration"
    profile = profile_for(args, scenario)
    with _ProgressBar(f"{args.method} in {args.engine}", args.time_budget,
                      enabled=sys.stderr.isatty() or not args.json) as bar:
        result = engine_search(scenario, args.engine, args.method, args.time_budget, seed=args.seed, profile=profile,
                               on_event=bar.update, max_evaluations=args.max_evals)
    est = Estimator(priced_as(scenario, args.engine), profile=profile)
    compared_s = plan_time(est, compared)
    G = scenario.cluster.gpus_per_node
    out = {"scenario": scenario.name, "engine": args.engine, "method": args.method, "best_time_s": result.best_time_s,
           "plan": {n: o.label(G) for n, o in result.best.items()}, "groups": result.groups,
           "groups_searched": result.searched, "groups_ruled_out": result.ruled_out,
           "evaluations": result.evaluations, "seconds": result.seconds,
           "compared": {"name": compared_name, "time_per_iter_s": compared_s if math.isfinite(compared_s) else None,
                        "fits": math.isfinite(compared_s), "plan": {n: o.label(G) for n, o in compared.items()}},
           "speedup": compared_s / result.best_time_s if math.isfinite(compared_s) else None}
    if args.out:
        origin = Origin(method=f"{args.method} in {args.engine}", seed=args.seed, evaluations=result.evaluations,
                        seconds=result.seconds, time_per_iter_s=result.best_time_s)
        doc = plan_from_options(scenario, result.best, origin, scenario_ref=scenario_ref(args.scenario, args.out))
        write_document(doc.to_document(), args.out, overwrite=args.force)
        log(f"wrote {args.out}")
    if args.json:
        emit_json(out)
        return 0
    versus = (f"{compared_s:.4f} s ({out['speedup']:.2f}x)" if math.isfinite(compared_s) else "does not fit in memory")
    what = (f"of its {result.groups} plans" if result.method == "all plans" else
            f"({result.groups} engine layouts: {result.searched} searched, {result.ruled_out} bound to take longer)")
    print(f"{result.method} in {args.engine}: best {result.best_time_s:.4f} s per iteration after {result.evaluations} "
          f"plans {what} in {result.seconds:.1f} s; {compared_name}: {versus}")
    for name, label in out["plan"].items():
        print(f"  {name:14s} {label}")
    return 0


def _search(args, est, storage, study_name, label: str = ""):
    with _ProgressBar(label or args.method, args.time_budget, enabled=sys.stderr.isatty() or not args.json) as bar:
        result = run_search(est, args.method, args.time_budget, seed=args.seed, on_event=bar.update,
                            max_evaluations=args.max_evals, storage=storage, study_name=study_name or None,
                            multi_objective=args.multi_objective, workers=args.workers, descent=args.descent,
                            settings=SamplerSettings(args.startup_trials, args.multivariate))
    if result.best_choice is None:
        raise ConfigError("no plan that fits in memory was found within the budget", "--time-budget")
    return result


class _ProgressBar:
    """A rich progress bar over the time budget, fed by the search's event stream. It appears
    with the first event, so input errors found before the search starts print one line only."""

    def __init__(self, method: str, budget: float, enabled: bool = True):
        self.method, self.budget, self.enabled = method, budget, enabled
        self.progress = None

    def __enter__(self):
        return self

    def update(self, e: SearchEvent) -> None:
        if not self.enabled:
            return
        if self.progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                                     TextColumn("{task.fields[status]}"), console=Console(stderr=True))
            self.progress.start()
            self.task = self.progress.add_task(self.method, total=self.budget, status="")
        best = f"{e.best_time_s:.4f} s" if math.isfinite(e.best_time_s) else "none yet"
        self.progress.update(self.task, completed=self.budget if e.done else min(e.seconds, self.budget),
                             status=f"{e.evaluations} plans, best {best}")

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.stop()
        return False
