"""`realbench worker`: the body of one process of a run started by an outside launcher.

torchrun, `accelerate launch` and srun + torchrun (the forms `realbench export` writes) start
this command on every process of every node; it reads its rank and the rendezvous from the
environment they set (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), runs the plan's steps, and
rank 0 writes `summary.json` (the contract of `realbench run --json`) into `--out`. Device i of
the plan is global rank i, so node k of the plan must be node rank k of the launcher.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from realbench.cli import (add_device_args, add_output_args, add_replan_args, add_staleness_arg, emit_json,
                           non_negative_int, replan_settings, with_staleness)
from realbench.errors import ConfigError
from realbench.plan import load_plan, load_scenario

LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def add_parser(sub) -> None:
    p = sub.add_parser("worker", help="one process of a run started by torchrun, accelerate launch or srun")
    p.add_argument("--scenario", required=True, help="built-in name or scenario file")
    p.add_argument("--plan", required=True, help="plan file")
    p.add_argument("--steps", type=non_negative_int, required=True, help="training steps to run")
    p.add_argument("--seed", type=non_negative_int, default=0, help="the run's seed (the same on every process)")
    p.add_argument("--out", required=True, help="folder for summary.json (written by rank 0) and error reports")
    p.add_argument("--save-every", type=non_negative_int, default=0, metavar="N", help="write a checkpoint every N steps")
    p.add_argument("--checkpoint-dir", default="checkpoints", help="where checkpoints go")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    add_output_args(p)
    add_replan_args(p)
    add_staleness_arg(p)
    p.add_argument("--replan-profile", default="", metavar="FILE", help="the profile re-planning estimates with")
    add_device_args(p, "the GPU LOCAL_RANK")
    p.add_argument("--json", action="store_true", help="rank 0 also prints the summary as JSON")
    p.set_defaults(handler=run)


def run(args) -> int:
    """Run this process's part of the plan, then end the process at once with its exit status.
    The process groups were destroyed and every file written before; what would run after is the
    interpreter's teardown, where torch can abort ("terminate called without an active exception":
    gloo's threads freeing tensors that need the GIL): a finished run would be reported as failed.
    Bad input raises before anything runs, as in every command."""
    code = _work(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _work(args) -> int:
    from realbench.plan.plan import plan_from_options
    from realbench.runtime.device import resolve_device, resolve_dtype
    from realbench.runtime.launch import RunSummary, check_run, read_switches, worker_process

    missing = [k for k in LAUNCHER_ENV if k not in os.environ]
    if missing:
        raise ConfigError("is not set: start `realbench worker` with torchrun, accelerate launch or srun "
                          "(or use `realbench run`)", ", ".join(missing))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device_type = resolve_device(args.device, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    dtype = resolve_dtype(args.dtype, device_type)
    scenario = with_staleness(args, load_scenario(args.scenario))
    _, _, options = load_plan(args.plan, scenario)
    replan = replan_settings(args, args.replan_profile)
    resume_step = check_run(scenario, options, world, args.steps, args.save_every, args.checkpoint_dir,
                            args.resume, flag="WORLD_SIZE", save_hf=args.save_hf if rank == 0 else "",
                            eval_every=args.eval_every, replan=replan)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        worker_process(scenario.to_document(), plan_from_options(scenario, options).to_document(), args.steps,
                       args.seed, str(out), args.save_every, args.checkpoint_dir, resume_step, device_type, dtype,
                       args.save_hf, args.eval_every, replan, args.compile_decode)
    except BaseException:
        first = (out / f"error.{rank}").read_text().splitlines()[0] if (out / f"error.{rank}").exists() else ""
        print(f"realbench: run failed: {first or f'rank {rank} failed'}", file=sys.stderr)
        return 1
    if rank != 0:
        return 0
    result = {**RunSummary(scenario, options, resume_step)(json.loads((out / "records.json").read_text())),
              "device": device_type, "dtype": dtype,
              "compile_decode": args.compile_decode, **read_switches(out)}
    (out / "summary.json").write_text(json.dumps(result, indent=2))
    if args.json:
        emit_json(result)
    else:
        from realbench.cli.run import print_summary

        print_summary(result, scenario.name, world)
    return 0
