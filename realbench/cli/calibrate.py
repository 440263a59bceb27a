"""`realbench calibrate`: fit the device's efficiency factors to a run's own log.

    realbench calibrate --engine verl run.log --scenario job.yaml --plan job-plan.yaml --out h100-ours.yaml
    realbench estimate --scenario job.yaml --plan other-plan.yaml --device h100-ours.yaml

Prints, per phase the engine timed, the measured seconds (median over the steps after the
warm-up), the estimate before and after, and the factors (realbench.calibrate.fit)."""

from __future__ import annotations

from realbench.cli import emit_json, log, non_negative_int


def add_parser(sub) -> None:
    from realbench.calibrate.logs import ENGINES

    p = sub.add_parser("calibrate", help="fit the device's efficiency factors to a run's log of a plan")
    p.add_argument("log", metavar="LOG", help="the engine's log: verl's console output or file-logger JSON lines, "
                                              "OpenRLHF's or AReaL's console output or TensorBoard folder, "
                                              "realbench run's metrics.jsonl")
    p.add_argument("--engine", required=True, choices=ENGINES, help="the engine that wrote LOG")
    p.add_argument("--scenario", required=True, help="the job the log ran (built-in name or scenario file)")
    p.add_argument("--plan", required=True, help="the plan the log ran (e.g. what `realbench import` wrote)")
    p.add_argument("--skip", type=non_negative_int, default=1, metavar="N",
                   help="warm-up steps left out (default 1: the first step compiles, allocates and fills caches)")
    p.add_argument("--out", help="write the calibrated device file here (.yaml or .json), for --device of "
                                 "estimate and search")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    p.set_defaults(handler=run)


def device_document(calibration, scenario) -> dict:
    from pathlib import Path

    from realbench.schema import DEVICE_SCHEMA

    return {"schema": DEVICE_SCHEMA, "device": calibration.device, "links": calibration.links,
            "calibration": {"engine": calibration.engine, "log": Path(calibration.log).name,
                            "scenario": scenario.name, "steps_used": list(calibration.steps_used),
                            "factors": {n: {k: v for k, v in f.items() if k != "meaning"}
                                        for n, f in calibration.factors.items()},
                            "phases": calibration.phases}}


def run(args) -> int:
    from realbench.calibrate import calibrate_files
    from realbench.schema import refuse_existing, write_document

    if args.out:
        refuse_existing([args.out], args.force)
    scenario, calibration = calibrate_files(args.engine, args.log, args.scenario, args.plan, args.skip)
    if args.out:
        write_document(device_document(calibration, scenario), args.out, overwrite=args.force)
        log(f"wrote {args.out}")
    if args.json:
        emit_json(calibration.to_json())
        return 0
    print_calibration(calibration)
    return 0


def print_calibration(c) -> None:
    from rich.console import Console
    from rich.table import Table

    from realbench.calibrate.fit import error

    table = Table(title=f"{c.engine} log, steps {c.steps_used[0]}..{c.steps_used[-1]} ({len(c.steps_used)})")
    for col in ("phase", "timers", "measured s", "before s", "error", "after s", "error"):
        table.add_column(col, justify="left" if col in ("phase", "timers") else "right")
    for r in c.phases:
        table.add_row(r["phase"] + ("" if r["fitted"] else " (check)"), " + ".join(r["timers"]),
                      f"{r['measured_s']:.3f}", f"{r['before_s']:.3f}", f"{error(r, 'before_s'):+.1%}",
                      f"{r['after_s']:.3f}", f"{error(r, 'after_s'):+.1%}")
    console = Console(width=140)
    console.print(table)
    for name, f in c.factors.items():
        if f["fitted"]:
            console.print(f"{name}: {f['before']:.4g} -> {f['after']:.4g} ({f['meaning']})")
        elif "why" in f:
            console.print(f"{name}: not fitted, {f['why']}")
    for line in c.checks:
        console.print(f"checked: {line}")
