"""Launch a plan on local processes through Accelerate, and the body of every process.

`run_plan` (the CLI's `realbench run`, and notebooks) starts `accelerate launch -m realbench
worker ...` as a child process: Accelerate's launcher starts one fresh Python process per rank.
Fresh, not forked from the caller: Accelerate's notebook launcher forks the calling process,
and a fork of a multi-threaded process (every Jupyter kernel; a test runner) can deadlock the
child on a lock another thread held, or fail outright once the caller has touched CUDA. The
launcher's own output goes to a log in the run folder, so a failure reads as one line here.

Each worker (`worker_process`, also what `realbench worker` runs under torchrun or srun) reads
its rank from the environment the launcher sets, joins the process group with a timeout (so
that a dead peer makes the others fail instead of hang), runs the steps, appends each step's
record to `steps.<rank>.jsonl` (what live monitors read), and rank 0 writes all records as
JSON. A failing worker writes one line naming its rank and the call it was in.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
import threading
import traceback
from pathlib import Path

from realbench.errors import ConfigError

COLLECTIVE_TIMEOUT_S = 60


class RunError(RuntimeError):
    """A run that started but failed (not bad input): one line naming the rank and the call."""


@dataclasses.dataclass(frozen=True)
class ReplanSettings:
    """`realbench run --replan-every K --replan-budget S --replan-min-gain G` (runtime.replan)."""
    every: int = 0  # 0: never
    budget_s: float = 5.0
    min_gain: float = 0.05
    profile: str = ""  # the profile file the estimates use ("" : the analytic model)

    def __post_init__(self):
        if self.every < 0:
            raise ConfigError("must be 1 or more", "--replan-every")
        if not self.budget_s > 0 or self.budget_s != self.budget_s:
            raise ConfigError("must be a positive number of seconds", "--replan-budget")
        if not 0 <= self.min_gain < 1:
            raise ConfigError("must be a fraction in [0, 1)", "--replan-min-gain")


def worker_process(scenario_doc: dict, plan_doc: dict, steps: int, seed: int, out_dir: str,
                   save_every: int = 0, checkpoint_dir: str = "", resume_step: int = 0,
                   device_type: str = "cpu", dtype: str = "fp32", save_hf: str = "", eval_every: int = 0,
                   replan: ReplanSettings = ReplanSettings(), compile_decode: bool = False) -> None:
    import torch
    import torch.distributed as dist

    from realbench.plan.plan import plan_from_document, resolve_plan
    from realbench.plan.scenario import scenario_from_document
    from realbench.runtime.checkpoint import load_resharded, write_manifest
    from realbench.runtime.device import init_process_group, torch_dtype
    from realbench.runtime.worker import Worker

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    worker = replanner = None
    try:
        device = init_process_group(device_type, COLLECTIVE_TIMEOUT_S)
        scenario = scenario_from_document(scenario_doc)
        options = resolve_plan(plan_from_document(plan_doc), scenario)
        # a resumed run's weights come from the checkpoint, under whatever plan it was written
        worker = Worker(rank, scenario, options, seed, total_steps=steps, device=device, dtype=torch_dtype(dtype),
                        compile_decode=compile_decode,
                        weights=not resume_step)
        if resume_step:
            load_resharded(worker, os.path.join(checkpoint_dir, f"step{resume_step}"))
        records = []
        replanner = _replanner(scenario, options, replan, seed) if replan.every and rank == 0 else None
        version = 0  # how many times the plan has changed: each step record carries it
        for s in range(resume_step, steps):
            worker.current = f"step {s}"
            if replanner is not None:
                replanner.running_step = s
            rec = worker.step(s)
            if eval_every and (s + 1) % eval_every == 0:
                worker.current = f"evaluating after step {s}"
                rec.metrics.update(worker.evaluate(s))
            records.append({**dataclasses.asdict(rec), "plan_version": version})
            with open(os.path.join(out_dir, f"steps.{rank}.jsonl"), "a") as f:  # for live monitors
                f.write(json.dumps(records[-1]) + "\n")
            if save_every and (s + 1) % save_every == 0:
                worker.current = f"saving step {s + 1}"
                folder = os.path.join(checkpoint_dir, f"step{s + 1}")
                os.makedirs(folder, exist_ok=True)
                worker.save(folder, s + 1)
                if save_hf:  # the same checkpoint as Hugging Face folders too
                    export_hf(worker, os.path.join(folder, "hf"))
                dist.barrier()  # every rank's file is on disk: the checkpoint is complete
                if rank == 0:
                    write_manifest(folder, s + 1, scenario.name, plan_doc["calls"], world, scenario_doc)
            if replan.every and s + 1 < steps:
                worker.current = f"re-planning after step {s}"
                new_doc = _replan_boundary(worker, replanner, s, rec, world)
                if new_doc is not None:
                    from realbench.runtime.replan import switch_plan

                    worker.current = f"switching plans after step {s}"
                    worker = switch_plan(worker, resolve_plan(plan_from_document(new_doc), scenario))
                    plan_doc, version = new_doc, version + 1
        if replanner is not None:
            replanner.close()
        if save_hf:
            worker.current = "saving the trained models"
            export_hf(worker, save_hf)
        if worker is not None:
            worker.current = "gathering results"
        everyone = [None] * world
        dist.all_gather_object(everyone, records)
        if rank == 0:
            Path(out_dir, "records.json").write_text(json.dumps(everyone))
            if replanner is not None:
                Path(out_dir, "switches.json").write_text(json.dumps([x.to_json() for x in replanner.switches]))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:
        if replanner is not None:
            replanner.close()
        where = worker.current if worker is not None else "start-up"
        Path(out_dir, f"error.{rank}").write_text(
            f"rank {rank} failed in {where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}\n"
            + traceback.format_exc())
        raise


def _replanner(scenario, options: dict, replan: ReplanSettings, seed: int):
    from realbench.runtime.replan import Replanner

    profile = None
    if replan.profile:
        from realbench.hardware.profile import load_profile

        profile = load_profile(replan.profile)
    return Replanner(scenario, options, replan.every, replan.budget_s, replan.min_gain, profile, seed)


def _replan_boundary(worker, replanner, step: int, rec, world: int) -> dict | None:
    """At the boundary after `step`: every rank's call and step seconds and response lengths go
    to rank 0, which feeds its replanner and says whether to switch; returns the new plan's document, or None.
    Every rank calls it."""
    import torch.distributed as dist

    from realbench.plan.plan import plan_from_options

    timings = [None] * world
    dist.all_gather_object(timings, (rec.call_s, rec.step_s, rec.lengths))
    decision = [None]
    if replanner is not None:
        slowest = {}
        for call_s, _, _ in timings:
            for name, t in call_s.items():
                slowest[name] = max(slowest.get(name, 0.0), t)
        replanner.observe(step, slowest, max(t for _, t, _ in timings),
                          responses_by_call([lengths for _, _, lengths in timings]))
        options = replanner.poll()
        if options is not None:
            decision = [plan_from_options(worker.scenario, options).to_document()]
    dist.broadcast_object_list(decision, src=0)
    return decision[0]


def export_hf(worker, folder: str) -> None:
    """Every trained model (the actor, and the critic if there is one) as a Hugging Face folder
    `<folder>/<role>`: its shards gathered on rank 0, which writes them. Every rank calls it."""
    from realbench.dataflow import CallKind
    from realbench.runtime.checkpoint import save_hf

    scenario = worker.scenario
    for i, c in enumerate(worker.calls):
        if c.kind != CallKind.TRAIN:
            continue
        full = worker.gather_full(i)
        if full is not None:
            spec = scenario.models[c.model]
            tokenizer = scenario.data.tokenizer if scenario.data is not None else None
            save_hf(os.path.join(folder, c.model), spec, full, tokenizer)


def responses_by_call(per_rank: list[dict]) -> dict[str, list[int]]:
    """Each generation call's response lengths in the order of its rows, from the ranks' step
    records ({call: [[row, length], ...]}: every data-parallel replica its own rows)."""
    rows: dict[str, dict[int, int]] = {}
    for lengths in per_rank:
        for name, pairs in lengths.items():
            rows.setdefault(name, {}).update(dict(map(tuple, pairs)))
    return {name: [n for _, n in sorted(by_row.items())] for name, by_row in rows.items()}


def summarize(records: list[list[dict]], estimated: dict[str, float], estimated_realloc: float) -> dict:
    """Per call: measured seconds (from the last of its ranks starting it to the last finishing,
    so that waiting for a rank still busy elsewhere is not counted, as the estimate of the call
    alone does not; median over the steps after the first: robust to a step slowed by the
    machine; with plan switches, the steps of the first plan) beside the estimate, and
    generated tokens per second, and how generation decoded (`decode`: rollout.SlotTimeline's, each
    way some rank ran it);
    reallocated bytes per step; per step: reward, loss and the calls' metrics ("<call>/<name>",
    averaged over the ranks that report them; token counts summed), which a seeded run
    reproduces; its timings (seconds, each call's "timing_s/<call>" measured as the per-call table's,
    "<call>/tokens_per_s" over the call's slowest rank, the processes), which it does not; every
    generation call's response lengths (per step, in the order of the batch's rows); under
    continuous batching, each replica's busy slots at each decode step (`slots`, per step:
    "<call>/dp<k>": counts); and a few decoded samples."""
    steps = len(records[0])
    # the per-call table compares the first plan's measured times with its estimates: steps after
    # a plan switch (re-planning) ran another plan
    first_plan = [s for s in range(steps) if records[0][s].get("plan_version", 0) == 0]
    warm = first_plan[1:] if len(first_plan) > 1 else first_plan

    def slowest(name: str, s: int) -> float:
        return max((r[s]["call_s"].get(name, 0.0) for r in records), default=0.0)

    def own(name: str, s: int) -> float:
        spans = [r[s]["call_span"][name] for r in records if name in r[s].get("call_span", {})]
        return max(end for _, end in spans) - max(start for start, _ in spans) if spans else slowest(name, s)

    calls = {}
    for name, est in estimated.items():
        calls[name] = {"measured_s": statistics.median([own(name, s) for s in warm]), "estimated_s": est}
    metrics, timings, samples, lengths, slots = [], [], [], [], []
    for s in range(steps):
        rewards = [r[s]["reward"] for r in records if r[s]["reward"] is not None]
        losses_ = [r[s]["loss"] for r in records if r[s]["loss"] is not None]
        named: dict[str, list[float]] = {}
        for r in records:  # a call's metric from each rank that reports it (its dp ranks' shares)
            for k, v in r[s].get("metrics", {}).items():
                named.setdefault(k, []).append(v)
        row = {k: sum(v) if k.endswith("/tokens") else sum(v) / len(v) for k, v in sorted(named.items())}
        metrics.append({"step": s, "reward": sum(rewards) / len(rewards) if rewards else None,
                        "loss": sum(losses_) / len(losses_) if losses_ else None, **row})
        timing = {"step": s, "seconds": max(r[s]["step_s"] for r in records),
                  "plan_version": max(r[s].get("plan_version", 0) for r in records),  # +1 at each plan switch
                  "processes": len(records),
                  # each call's seconds this step, as the per-call table measures them (`realbench calibrate`)
                  **{f"timing_s/{name}": own(name, s) for name in estimated
                     if any(name in r[s].get("call_span", {}) or name in r[s]["call_s"] for r in records)}}
        for k in [k for k in row if k.endswith("/tokens")]:  # counts add up over ranks
            seconds = slowest(k[:-len("/tokens")], s)
            if seconds:
                timing[k + "_per_s"] = row[k] / seconds
        timings.append(timing)
        rows = responses_by_call([r[s].get("lengths", {}) for r in records])
        if rows:
            lengths.append({"step": s, **rows})
        busy = {k: v for r in records for k, v in r[s].get("slots", {}).items()}
        if busy:
            slots.append({"step": s, **dict(sorted(busy.items()))})
        shown = next((r[s]["samples"] for r in records if r[s].get("samples")), [])
        if shown:
            samples.append({"step": s, "samples": shown})
    for name in estimated:
        rates = [timings[s][f"{name}/tokens_per_s"] for s in warm if f"{name}/tokens_per_s" in timings[s]]
        if rates:
            calls[name]["tokens_per_s"] = statistics.median(rates)
        ways = {r[s]["decode"][name] for r in records for s in range(steps) if name in r[s].get("decode", {})}
        if ways:
            calls[name]["decode"] = ", ".join(sorted(ways))
    realloc = [sum(r[s]["realloc_bytes"] for r in records) for s in range(steps)]
    # per step: the last step's (a LoRA run's first step also fills the frozen base of each layout),
    # and every step's
    return {"steps": steps, "calls": calls, "realloc_bytes": realloc[-1] if realloc else 0,
            "realloc_bytes_by_step": realloc,
            "estimated_realloc_s": estimated_realloc,
            "measured_iter_s": statistics.median([timings[s]["seconds"] for s in warm]),
            "metrics": metrics, "timings": timings, "samples": samples, "lengths": lengths, "slots": slots}


def latest_checkpoint(checkpoint_dir: str) -> int:
    """The highest step of the complete checkpoints (`step<N>` folders with a manifest)."""
    from realbench.runtime.checkpoint import MANIFEST

    steps = [int(p.name[4:]) for p in Path(checkpoint_dir).glob("step*")
             if p.name[4:].isdigit() and (p / MANIFEST).is_file()]
    if not steps:
        raise ConfigError("holds no complete checkpoint (step<N> folders with checkpoint.json)", "--resume",
                          checkpoint_dir)
    return max(steps)


def needed_processes(scenario, options: dict) -> int:
    """Processes a plan needs: device i of the plan is global rank i, up to its last used device."""
    from realbench.plan.mesh import devices_spanned

    return devices_spanned(options, scenario.cluster.gpus_per_node)


def check_run(scenario, options: dict, nproc: int, steps: int, save_every: int, checkpoint_dir: str,
              resume: bool, flag: str = "--nproc", save_hf: str = "", eval_every: int = 0,
              replan: "ReplanSettings" = None) -> int:
    """Check the run's arguments against the plan; returns the step to resume from. A checkpoint
    resumes under any plan of its scenario and any number of processes (resharded on load)."""
    from realbench.runtime.checkpoint import check_scenario, read_manifest, written_options

    if scenario.cluster.attention != "flash":
        raise ConfigError(f"{scenario.cluster.attention} attention prices another engine (scores written to memory, "
                          "softmax and dropout apart); realbench's runtime computes attention in one fused kernel: "
                          "leave the field out to run", "cluster.attention")
    needed = needed_processes(scenario, options)
    if nproc != needed and nproc != scenario.cluster.n_devices:
        raise ConfigError(f"the plan uses {needed} device(s); run it with {needed} processes, not {nproc}", flag)
    if steps < 1:
        raise ConfigError("must be at least 1", "--steps")
    if replan is not None and replan.every and nproc != scenario.cluster.n_devices:
        raise ConfigError(f"re-planning searches plans over all {scenario.cluster.n_devices} devices of the scenario; "
                          f"run with {scenario.cluster.n_devices} processes", flag)
    resume_step = latest_checkpoint(checkpoint_dir) if resume else 0
    if resume:
        folder = Path(checkpoint_dir, f"step{resume_step}")
        manifest = read_manifest(folder)
        check_scenario(manifest, scenario, "--resume", folder)
        try:
            written_options(scenario, manifest)
        except (ConfigError, KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"its manifest's plan does not fit scenario {scenario.name!r}: {e}", "--resume",
                              str(folder)) from None
    if resume_step >= steps:
        raise ConfigError(f"the checkpoint is at step {resume_step}; ask for more --steps", "--steps")
    if save_every and not resume and Path(checkpoint_dir).exists() and any(Path(checkpoint_dir).iterdir()):
        raise ConfigError("exists and is not empty; use --resume to continue, or another folder",
                          "--checkpoint-dir", checkpoint_dir)
    if save_hf and Path(save_hf).exists() and (not Path(save_hf).is_dir() or any(Path(save_hf).iterdir())):
        raise ConfigError("exists and is not empty: name a new folder", "--save-hf", save_hf)
    if eval_every and (scenario.data is None or not (scenario.data.eval or scenario.data.eval_size)):
        raise ConfigError("evaluates on held-out rows: give the scenario data.eval or data.eval_size", "--eval-every")
    return resume_step


class RunSummary:
    """The summary of a run's records so far (`summarize`, with the plan's estimates from
    `profile` when given, computed once), its steps counted from `resume_step`."""

    def __init__(self, scenario, options: dict, resume_step: int, profile=None):
        self.args, self.resume_step, self._estimate = (scenario, options, profile), resume_step, None

    def __call__(self, records: list[list[dict]]) -> dict:
        if self._estimate is None:
            from realbench.cost import Estimator

            scenario, options, profile = self.args
            est = Estimator(scenario, profile=profile)
            estimate = est.estimate(est.choice_of(options))
            self._estimate = estimate, estimate.cost_source
        return summarize_run(records, self.resume_step, *self._estimate)


def summarize_run(records: list[list[dict]], resume_step: int, estimate, sources: dict) -> dict:
    """The summary of a run: measured beside estimated times, metrics per step."""
    result = summarize(records, {n: c.time_s for n, c in estimate.calls.items()}, estimate.realloc_s)
    result["estimated_iter_s"] = estimate.time_per_iter_s
    result["estimate_source"] = sources
    for m in result["metrics"]:
        m["step"] += resume_step
    for m in result["timings"] + result["samples"]:
        m["step"] += resume_step
    result["first_step"] = resume_step
    return result


def _watch_steps(out_dir: str, nproc: int, done: threading.Event, on_step, summarize_partial) -> None:
    """Call on_step(summary of the steps every rank has finished) as the run goes."""
    seen = 0
    while True:
        finished = done.wait(0.3)
        records = []
        for r in range(nproc):
            path = Path(out_dir, f"steps.{r}.jsonl")
            lines = path.read_text().splitlines() if path.exists() else []
            records.append([json.loads(x) for x in lines if x.strip()])
        complete = min(len(r) for r in records)
        if complete > seen:
            seen = complete
            on_step(summarize_partial([r[:complete] for r in records]))
        if finished:
            return


def launch_command(nproc: int, port: int, worker_args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The `accelerate launch` command line (and the environment) that starts `realbench worker`
    with `worker_args` on `nproc` local processes, rendezvous on 127.0.0.1:`port`."""
    import sys

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(nproc),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    env = dict(os.environ)
    if nproc > 1:
        cmd += ["--multi_gpu", "--machine_rank", "0", "--main_process_ip", "127.0.0.1",
                "--main_process_port", str(port), "--rdzv_backend", "static"]
    else:  # Accelerate runs one process as it is: give it the rendezvous a process group needs
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
    return cmd + ["-m", "realbench", "worker", *worker_args], env


def _wait(proc, stop) -> None:
    """Wait for the launcher; on `stop()` or Ctrl-C, end it and its workers (their own process
    group) and raise."""
    import signal
    import subprocess

    try:
        while proc.poll() is None:
            try:
                proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
            if stop is not None and stop():
                raise RunError("stopped before the last step")
    except BaseException:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the launcher passes it on to the workers
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        raise


def run_plan(scenario, options: dict, nproc: int, steps: int, seed: int = 0, save_every: int = 0,
             checkpoint_dir: str = "", resume: bool = False, profile=None, on_step=None,
             device: str = "auto", stop=None, dtype: str = "auto", save_hf: str = "", eval_every: int = 0,
             replan: ReplanSettings = ReplanSettings(), compile_decode: bool = False) -> dict:
    """Run RLHF steps of a plan on `nproc` local processes (up to step `steps`, from the latest
    checkpoint when `resume`) on `device` (auto: a GPU per process when there are enough, else
    the CPU); returns the summary. `on_step(summary so far)` is called from a watcher thread as
    steps finish (the run monitor's live curves); `stop()`, polled while the run goes, ends it
    (a RunError, as Ctrl-C does with KeyboardInterrupt). Checkpoints already written stay."""
    import subprocess

    from realbench.plan.plan import plan_from_options
    from realbench.runtime.device import resolve_device, resolve_dtype
    from realbench.runtime.local import free_port

    device_type = resolve_device(device, nproc)
    dtype = resolve_dtype(dtype, device_type)
    resume_step = check_run(scenario, options, nproc, steps, save_every, checkpoint_dir, resume, save_hf=save_hf,
                            eval_every=eval_every, replan=replan)
    summary = RunSummary(scenario, options, resume_step, profile)
    with tempfile.TemporaryDirectory(prefix="realbench-run-") as out_dir:
        scenario_file, plan_file = Path(out_dir, "scenario.json"), Path(out_dir, "plan.json")
        scenario_file.write_text(json.dumps(scenario.to_document()))
        plan_file.write_text(json.dumps(plan_from_options(scenario, options).to_document()))
        args = ["--scenario", str(scenario_file), "--plan", str(plan_file), "--steps", str(steps), "--seed", str(seed),
                "--out", out_dir, "--device", device_type, "--dtype", dtype]
        if compile_decode:
            args.append("--compile-decode")
        if save_every:
            args += ["--save-every", str(save_every)]
        if save_every or resume:
            args += ["--checkpoint-dir", checkpoint_dir]
        if resume:
            args.append("--resume")
        if save_hf:
            args += ["--save-hf", str(Path(save_hf).resolve())]
        if eval_every:
            args += ["--eval-every", str(eval_every)]
        if replan.every:
            args += ["--replan-every", str(replan.every), "--replan-budget", str(replan.budget_s),
                     "--replan-min-gain", str(replan.min_gain)]
            if profile is not None:  # re-planning estimates with the profile the run's estimates use
                profile.save(Path(out_dir, "profile.json"))
                args += ["--replan-profile", str(Path(out_dir, "profile.json"))]
        cmd, env = launch_command(nproc, free_port(), args)
        done = threading.Event()
        watcher = None
        if on_step is not None:
            watcher = threading.Thread(target=_watch_steps, daemon=True, args=(out_dir, nproc, done, on_step, summary))
            watcher.start()
        log_path = Path(out_dir, "launcher.log")
        try:
            with open(log_path, "w") as log:
                proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
                _wait(proc, stop)
        finally:
            done.set()
            if watcher is not None:
                watcher.join()
        if proc.returncode != 0:
            # the first error written is the cause; the others are peers losing their connection
            errors = sorted(Path(out_dir).glob("error.*"), key=lambda p: p.stat().st_mtime_ns)
            if errors:
                raise RunError(errors[0].read_text().splitlines()[0])
            raise RunError(f"the launcher exited with status {proc.returncode}: "
                           + launcher_cause(log_path.read_text(errors="replace")))
        records = json.loads(Path(out_dir, "records.json").read_text())
        switches = read_switches(out_dir)
    return {**summary(records), "device": device_type, "dtype": dtype, "compile_decode": compile_decode, **switches}


def launcher_cause(log: str) -> str:
    """What a launcher's log says ended the run when no worker wrote an error (a process killed
    by a signal, or aborted in native code): its root-cause rank and exit code, and a native
    message such as "terminate called ...", else the log's last line."""
    import re

    lines = [x.strip() for x in log.splitlines() if x.strip()]
    native = next((x for x in lines if x.startswith(("terminate called", "Segmentation fault", "Fatal Python"))), "")
    root = log.split("Root Cause", 1)[-1] if "Root Cause" in log else ""
    rank, code = re.search(r"rank\s*:\s*(\d+)", root), re.search(r"exitcode\s*:\s*(-?\d+)[^\n]*", root)
    if rank and code:
        return f"rank {rank.group(1)} ended with exit code {code.group(0).split(':', 1)[1].strip()}" + \
            (f" ({native})" if native else "")
    return native or (lines[-1] if lines else "no output")


def read_switches(out_dir) -> dict:
    """{"switches": [...]} of a re-planning run (rank 0 wrote them), else {}."""
    path = Path(out_dir, "switches.json")
    return {"switches": json.loads(path.read_text())} if path.exists() else {}
