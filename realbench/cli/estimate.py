"""`realbench estimate`: time, memory and the per-call timeline of one plan."""

from __future__ import annotations

from realbench.cli import (add_device_file_arg, add_profile_args, add_staleness_arg, emit_json, log, profile_for,
                           with_device_file, with_staleness)
from realbench.cost import Estimator
from realbench.cost.baselines import BASELINES
from realbench.errors import ConfigError
from realbench.plan import Origin, load_plan, load_scenario, plan_from_options, scenario_ref


def add_parser(sub) -> None:
    p = sub.add_parser("estimate", help="estimate the cost of one plan")
    p.add_argument("--scenario", required=True, help="built-in name or scenario file")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--plan", help="plan file")
    how.add_argument("--baseline", choices=sorted(BASELINES), help="estimate a baseline plan")
    p.add_argument("--out", help="also write the plan that was estimated (useful with --baseline)")
    p.add_argument("--force", action="store_true", help="with --out: overwrite an existing file")
    add_staleness_arg(p)
    add_profile_args(p)
    add_device_file_arg(p)
    p.add_argument("--json", action="store_true", help="print the estimate as JSON (per call: time, reallocation, memory)")
    p.set_defaults(handler=run)


def run(args) -> int:
    scenario = with_device_file(args, with_staleness(args, load_scenario(args.scenario)))
    options = load_plan(args.plan, scenario)[2] if args.plan else None  # a bad file is refused before profiling
    est = Estimator(scenario, profile=profile_for(args, scenario))
    if args.plan:
        choice = est.choice_of(options)
        source = args.plan
    else:
        try:
            choice = BASELINES[args.baseline](est)
        except ValueError as e:
            raise ConfigError(str(e), "--baseline") from None
        source = f"{args.baseline} baseline"
    result = est.estimate(choice)
    if args.out:
        origin = Origin(method=args.baseline or "file", time_per_iter_s=result.time_per_iter_s)
        plan_from_options(scenario, est.options_of(choice), origin,
                          scenario_ref=scenario_ref(args.scenario, args.out)).save(args.out, overwrite=args.force)
        log(f"wrote {args.out}")
    if args.json:
        emit_json({"scenario": scenario.name, "plan": source, **result.to_json(),
                   "cost_source": result.cost_source,
                   "placements": {n: o.label(scenario.cluster.gpus_per_node)
                                  for n, o in est.options_of(choice).items()}})
        return 0
    print_estimate(scenario, est, choice, result, source)
    return 0


def print_estimate(scenario, est, choice, result, source: str) -> None:
    from rich.console import Console
    from rich.table import Table

    G = scenario.cluster.gpus_per_node
    gib = 1024**3
    table = Table(title=f"{scenario.name}: {source}")
    for col in ("call", "placement", "start s", "end s", "alone s", "realloc s", "peak GiB/device"):
        table.add_column(col, justify="left" if col in ("call", "placement") else "right")
    options = est.options_of(choice)
    for name, c in result.calls.items():
        table.add_row(name, options[name].label(G), f"{c.start_s:.3f}", f"{c.end_s:.3f}", f"{c.time_s:.3f}",
                      f"{c.realloc_s:.3f}", f"{c.mem_bytes / gib:.1f}")
    console = Console(width=140)
    console.print(table)
    status = "[red]OUT OF MEMORY[/red]" if result.oom else "fits"
    sources = sorted(set(result.cost_source.values()))
    console.print(f"call times from: {', '.join(sources)}"
                  + (f" ({est.profile.device.name}, {est.profile.date})" if any("profile" in x for x in sources) else ""))
    if result.max_staleness:
        console.print(f"asynchronous: generation up to {result.max_staleness} iteration(s) ahead; an iteration "
                      f"takes {result.iteration_s:.3f} s from its first task to its last, and one ends every "
                      f"{result.time_per_iter_s:.3f} s")
    console.print(f"time per iteration {result.time_per_iter_s:.3f} s, reallocation {result.realloc_s:.3f} s, "
                  f"peak memory {result.peak_mem_bytes / gib:.1f} GiB per device of {result.usable_memory_bytes / gib:.1f} "
                  f"usable ({result.device_memory_bytes / gib:.0f} GiB device): {status}")
