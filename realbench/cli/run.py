"""`realbench run`: execute a plan on local processes (launched through Accelerate).

While it runs, one line per finished step goes to stderr (reward, loss, KL, response length,
seconds) with a decoded sample; `--out DIR` also writes `metrics.jsonl` (a line per step: the
metrics and the step's timings), `samples.jsonl`, `lengths.jsonl` (a line per step: each
generation call's response lengths, in the order of its rows) and, at the end, `summary.json`."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from realbench.cli import (add_device_args, add_output_args, add_profile_args, add_replan_args, add_staleness_arg,
                           emit_json, log, non_negative_int, profile_for, replan_settings, with_staleness)
from realbench.errors import ConfigError
from realbench.plan import load_plan, load_scenario, plan_from_options


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run a plan on local processes")
    p.add_argument("--scenario", required=True, help="built-in name or scenario file")
    p.add_argument("--plan", required=True, help="plan file")
    p.add_argument("--nproc", type=non_negative_int, required=True, help="local processes to start (the plan's devices)")
    p.add_argument("--steps", type=non_negative_int, required=True, help="training steps (iterations of the dataflow) to run")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the models' initialisation, the data order and sampling")
    p.add_argument("--save-every", type=non_negative_int, default=0, metavar="N",
                   help="write safetensors checkpoints every N steps into --checkpoint-dir")
    p.add_argument("--checkpoint-dir", default="checkpoints", help="where checkpoints go (default: checkpoints)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoint-dir")
    p.add_argument("--out", default="", metavar="DIR",
                   help="write metrics.jsonl, samples.jsonl, lengths.jsonl and summary.json into DIR (new or empty)")
    p.add_argument("--report-to", nargs="+", default=["none"], metavar="TRACKER",
                   help="log every step's metrics to tensorboard, wandb, mlflow and/or trackio (offline, under "
                        "--out), or none (default)")
    add_output_args(p)
    add_replan_args(p)
    add_staleness_arg(p)
    add_device_args(p, "one GPU per process")
    add_profile_args(p)
    p.add_argument("--json", action="store_true", help="print the run's summary as JSON")
    p.set_defaults(handler=run)


def shown(value, limit: int = 160) -> str:
    """A sample's prompt or completion (text, or token ids on the toy task) for the terminal line,
    cut at `limit` characters with what was left out counted (samples.jsonl keeps it whole)."""
    text = json.dumps(value)
    if len(text) <= limit:
        return text
    unit = "token ids" if isinstance(value, list) else "characters"
    return f"{text[:limit]}... ({len(value)} {unit})"


class Progress:
    """Prints the steps as they finish (stderr), and appends them to the --out files."""

    def __init__(self, total: int, out: str):
        self.total, self.out, self.shown = total, Path(out) if out else None, 0
        self.lock = threading.Lock()

    def __call__(self, summary: dict) -> None:
        with self.lock:
            timings = {t["step"]: t for t in summary["timings"]}
            samples = {x["step"]: x["samples"] for x in summary["samples"]}
            lengths = {x["step"]: x for x in summary.get("lengths", [])}
            for m in summary["metrics"][self.shown:]:
                step = m["step"]
                log(step_line(m, timings.get(step, {}), self.total))
                for sample in samples.get(step, [])[:1]:
                    log(f"  {shown(sample['prompt'])} -> {shown(sample['completion'])}")
                if self.out:
                    with open(self.out / "metrics.jsonl", "a") as f:
                        f.write(json.dumps({**m, **{k: v for k, v in timings.get(step, {}).items()}}) + "\n")
                    if step in samples:
                        with open(self.out / "samples.jsonl", "a") as f:
                            f.write(json.dumps({"step": step, "samples": samples[step]}) + "\n")
                    if step in lengths:
                        with open(self.out / "lengths.jsonl", "a") as f:
                            f.write(json.dumps(lengths[step]) + "\n")
            self.shown = len(summary["metrics"])


def step_line(m: dict, timing: dict, total: int) -> str:
    parts = [f"step {m['step'] + 1}/{total}:"]
    if m.get("reward") is not None:
        parts.append(f"reward {m['reward']:+.4f}")
    if m.get("loss") is not None:
        parts.append(f"loss {m['loss']:.4f}")
    for key, label in (("kl", "kl"), ("response_len", "len"), ("margin", "margin")):
        value = next((v for k, v in m.items() if k.endswith("/" + key)), None)
        if value is not None:
            parts.append(f"{label} {value:.3g}")
    if any(k.startswith("eval/") for k in m):
        parts.append("eval " + " ".join(f"{k[5:]} {v:.4g}" for k, v in m.items() if k.startswith("eval/")))
    if "seconds" in timing:
        parts.append(f"({timing['seconds']:.2f} s)")
    return " ".join(parts)


def run(args) -> int:
    from realbench.runtime.device import DTYPE_NAMES, resolve_device, resolve_dtype
    from realbench.runtime.launch import RunError, check_run, run_plan

    scenario = with_staleness(args, load_scenario(args.scenario))
    _, _, options = load_plan(args.plan, scenario)
    from realbench.plan.plan import refuse_unrunnable

    refuse_unrunnable(scenario, options)
    if args.out:
        out = Path(args.out)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise ConfigError("exists and is not empty: name a new folder", "--out", args.out)
    from realbench.runtime.trackers import Trackers, check_report_to

    report_to = check_report_to(args.report_to, args.out)
    replan = replan_settings(args)
    # bad flags are refused before this machine is profiled (which may take a minute the first time)
    check_run(scenario, options, args.nproc, args.steps, args.save_every, args.checkpoint_dir, args.resume,
              save_hf=args.save_hf, eval_every=args.eval_every, replan=replan)
    device_type = resolve_device(args.device, args.nproc)
    profile = profile_for(args, scenario, args.nproc, device_type)
    dtype = resolve_dtype(args.dtype, device_type)
    if profile is not None and profile.dtype != DTYPE_NAMES[dtype]:
        log(f"note: the profile was measured in {profile.dtype} and the run computes in {dtype}: "
            "its estimates price the other dtype (realbench profile --dtype)")
    if profile is not None and profile.compile_decode != args.compile_decode:
        log("note: the profile measured decode steps " + ("compiled" if profile.compile_decode else "uncompiled")
            + " and the run's are " + ("compiled" if args.compile_decode else "not") + ": its generation estimates "
            "price the other (realbench profile --compile-decode)")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    progress = Progress(args.steps, args.out)
    trackers = Trackers(report_to, args.out, scenario.name, {
        "scenario": scenario.to_document(), "plan": plan_from_options(scenario, options).to_document()["calls"],
        "settings": {"nproc": args.nproc, "steps": args.steps, "seed": args.seed, "dtype": args.dtype,
                     "device": args.device, "compile_decode": args.compile_decode}}) if report_to else None

    def on_step(summary: dict) -> None:
        progress(summary)
        if trackers is not None:
            trackers.log(summary)
    try:
        result = run_plan(scenario, options, args.nproc, args.steps, args.seed, args.save_every,
                          args.checkpoint_dir, args.resume, profile=profile, device=args.device,
                          dtype=args.dtype, compile_decode=args.compile_decode, save_hf=args.save_hf, eval_every=args.eval_every, on_step=on_step,
                          replan=replan)
        on_step(result)  # the steps the watcher had not shown (or logged) yet
    except RunError as e:
        print(f"realbench: run failed: {e}", file=sys.stderr)
        return 1
    finally:
        if trackers is not None:
            trackers.finish()
    if args.out:
        (Path(args.out) / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        emit_json(result)
        return 0
    print_summary(result, scenario.name, args.nproc)
    return 0


def print_summary(result: dict, scenario_name: str, nproc: int) -> None:
    processes = f"{nproc} process" + ("es" if nproc > 1 else "")
    print(f"{result['steps']} steps of {scenario_name} on {processes} ({result['device']}, "
          f"{result.get('dtype', 'fp32')}); reallocated {result['realloc_bytes']} bytes per step"
          + (f" ({by_step[0]} in the first, filling the frozen base)"
             if (by_step := result.get("realloc_bytes_by_step") or [0])[0] != result["realloc_bytes"] else ""))
    print(f"{'call':14s} {'measured s':>11s} {'estimated s':>12s}")
    for name, c in result["calls"].items():
        print(f"{name:14s} {c['measured_s']:11.4f} {c['estimated_s']:12.4f}")
    print(f"per iteration: measured {result['measured_iter_s']:.4f} s, estimated {result['estimated_iter_s']:.4f} s "
          "(the steps' rewards and losses are above, on stderr)")
