"""`realbench run`: execute a plan on local processes (launched through Accelerate)."""

from __future__ import annotations

import sys

from realbench.cli import add_device_args, add_profile_args, emit_json, non_negative_int, profile_for
from realbench.plan import load_plan, load_scenario


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a plan on local processes")
    p.add_argument("--scenario", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--nproc", type=non_negative_int, required=True)
    p.add_argument("--steps", type=non_negative_int, required=True)
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--save-every", type=non_negative_int, default=0, metavar="N",
                   help="write safetensors checkpoints every N steps into --checkpoint-dir")
    p.add_argument("--checkpoint-dir", default="checkpoints", help="where checkpoints go (default: checkpoints)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    add_device_args(p, "one GPU per process")
    add_profile_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def run(args) -> int:
    from realbench.runtime.launch import RunError, run_plan

    scenario = load_scenario(args.scenario)
    _, _, options = load_plan(args.plan, scenario)
    try:
        result = run_plan(scenario, options, args.nproc, args.steps, args.seed, args.save_every,
                          args.checkpoint_dir, args.resume, profile=profile_for(args, scenario), device=args.device,
                          dtype=args.dtype)
    except RunError as e:
        print(f"realbench: run failed: {e}", file=sys.stderr)
        return 1
    if args.json:
        emit_json(result)
        return 0
    print_summary(result, scenario.name, args.nproc)
    return 0


def print_summary(result: dict, scenario_name: str, nproc: int) -> None:
    print(f"{result['steps']} steps of {scenario_name} on {nproc} processes ({result['device']}, "
          f"{result.get('dtype', 'fp32')}); "
          f"reallocated {result['realloc_bytes']} bytes per step")
    print(f"{'call':14s} {'measured s':>11s} {'estimated s':>12s}")
    for name, c in result["calls"].items():
        print(f"{name:14s} {c['measured_s']:11.4f} {c['estimated_s']:12.4f}")
    for m in result["metrics"]:
        reward = "" if m["reward"] is None else f" reward {m['reward']:+.4f}"
        loss = "" if m["loss"] is None else f" loss {m['loss']:.4f}"
        print(f"step {m['step']}:{reward}{loss}")
