"""Launch a plan on local processes through Accelerate (`accelerate.notebook_launcher`, which
starts the workers with torch's elastic launcher), or serve as the body of every process that
an outside launcher starts (`realbench worker`, under torchrun, `accelerate launch` or srun).

The same call serves the CLI (`realbench run`) and notebooks. Each worker reads its rank from
the environment the launcher sets, joins the process group with a timeout (so that a dead peer
makes the others fail instead of hang), runs the steps, and rank 0 writes the records as JSON.
A failing worker writes one line naming its rank and the call it was in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
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


def worker_process(scenario_doc: dict, plan_doc: dict, steps: int, seed: int, out_dir: str,
                   save_every: int = 0, checkpoint_dir: str = "", resume_step: int = 0,
                   device_type: str = "cpu") -> None:
    import torch
    import torch.distributed as dist

    from realbench.plan.plan import plan_from_document, resolve_plan
    from realbench.plan.scenario import scenario_from_document
    from realbench.runtime.device import init_process_group
    from realbench.runtime.worker import Worker

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    worker = None
    try:
        device = init_process_group(device_type, COLLECTIVE_TIMEOUT_S)
        scenario = scenario_from_document(scenario_doc)
        options = resolve_plan(plan_from_document(plan_doc), scenario)
        worker = Worker(rank, scenario, options, seed, device=device)
        if resume_step:
            worker.load(os.path.join(checkpoint_dir, f"step{resume_step}"))
        records = []
        for s in range(resume_step, steps):
            worker.current = f"step {s}"
            records.append(dataclasses.asdict(worker.step(s)))
            with open(os.path.join(out_dir, f"steps.{rank}.jsonl"), "a") as f:  # for live monitors
                f.write(json.dumps(records[-1]) + "\n")
            if save_every and (s + 1) % save_every == 0:
                folder = os.path.join(checkpoint_dir, f"step{s + 1}")
                os.makedirs(folder, exist_ok=True)
                worker.save(folder, s + 1)
        if worker is not None:
            worker.current = "gathering results"
        everyone = [None] * world
        dist.all_gather_object(everyone, records)
        if rank == 0:
            Path(out_dir, "records.json").write_text(json.dumps(everyone))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:
        where = worker.current if worker is not None else "start-up"
        Path(out_dir, f"error.{rank}").write_text(
            f"rank {rank} failed in {where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}\n"
            + traceback.format_exc())
        raise


def summarize(records: list[list[dict]], estimated: dict[str, float], estimated_realloc: float) -> dict:
    """Per call: measured seconds (slowest rank, median over the steps after the first: robust
    to a step slowed by the machine) beside the estimate; reallocated bytes per step; reward and
    loss per step."""
    steps = len(records[0])
    warm = range(1, steps) if steps > 1 else range(steps)
    calls = {}
    for name, est in estimated.items():
        per_step = [max((r[s]["call_s"].get(name, 0.0) for r in records), default=0.0) for s in warm]
        calls[name] = {"measured_s": statistics.median(per_step), "estimated_s": est}
    metrics = []
    for s in range(steps):
        rewards = [r[s]["reward"] for r in records if r[s]["reward"] is not None]
        losses_ = [r[s]["loss"] for r in records if r[s]["loss"] is not None]
        metrics.append({"step": s, "reward": sum(rewards) / len(rewards) if rewards else None,
                        "loss": sum(losses_) / len(losses_) if losses_ else None})
    realloc = [sum(r[s]["realloc_bytes"] for r in records) for s in range(steps)]
    step_s = [max(r[s]["step_s"] for r in records) for s in warm]
    return {"steps": steps, "calls": calls, "realloc_bytes": realloc[0] if realloc else 0,
            "estimated_realloc_s": estimated_realloc, "measured_iter_s": statistics.median(step_s),
            "metrics": metrics}


def latest_checkpoint(checkpoint_dir: str) -> int:
    steps = [int(p.name[4:]) for p in Path(checkpoint_dir).glob("step*") if p.name[4:].isdigit()]
    if not steps:
        raise ConfigError("holds no checkpoint (step<N> folders)", "--resume", checkpoint_dir)
    return max(steps)


def needed_processes(scenario, options: dict) -> int:
    """Processes a plan needs: device i of the plan is global rank i, up to its last used device."""
    return max(o.mesh.start(scenario.cluster.gpus_per_node) + o.mesh.size for o in options.values())


def check_run(scenario, options: dict, nproc: int, steps: int, save_every: int, checkpoint_dir: str,
              resume: bool, flag: str = "--nproc") -> int:
    """Check the run's arguments against the plan; returns the step to resume from."""
    needed = needed_processes(scenario, options)
    if nproc != needed and nproc != scenario.cluster.n_devices:
        raise ConfigError(f"the plan uses {needed} device(s); run it with {needed} processes, not {nproc}", flag)
    if steps < 1:
        raise ConfigError("must be at least 1", "--steps")
    resume_step = latest_checkpoint(checkpoint_dir) if resume else 0
    if resume_step >= steps:
        raise ConfigError(f"the checkpoint is at step {resume_step}; ask for more --steps", "--steps")
    if save_every and not resume and Path(checkpoint_dir).exists() and any(Path(checkpoint_dir).iterdir()):
        raise ConfigError("exists and is not empty; use --resume to continue, or another folder",
                          "--checkpoint-dir", checkpoint_dir)
    return resume_step


def summarize_run(scenario, options: dict, records: list[list[dict]], resume_step: int, profile=None) -> dict:
    """The summary of a finished run: measured beside estimated times (from `profile` when
    given), metrics per step."""
    from realbench.cost import Estimator

    est = Estimator(scenario, profile=profile)
    estimate = est.estimate(est.choice_of(options))
    result = summarize(records, {n: c.time_s for n, c in estimate.calls.items()}, estimate.realloc_s)
    result["estimated_iter_s"] = estimate.time_per_iter_s
    result["estimate_source"] = dict(zip(est.call_names, est.cost_source))
    for m in result["metrics"]:
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


def run_plan(scenario, options: dict, nproc: int, steps: int, seed: int = 0, save_every: int = 0,
             checkpoint_dir: str = "", resume: bool = False, profile=None, on_step=None,
             device: str = "auto") -> dict:
    """Run RLHF steps of a plan on `nproc` local processes (up to step `steps`, from the latest
    checkpoint when `resume`) on `device` (auto: a GPU per process when there are enough, else
    the CPU); returns the summary. `on_step(summary so far)` is called from a watcher thread as
    steps finish (the run monitor's live curves)."""
    import accelerate

    from realbench.plan.plan import plan_from_options
    from realbench.runtime.device import resolve_device
    from realbench.runtime.local import free_port

    device_type = resolve_device(device, nproc)
    resume_step = check_run(scenario, options, nproc, steps, save_every, checkpoint_dir, resume)
    plan_doc = plan_from_options(scenario, options).to_document()
    with tempfile.TemporaryDirectory(prefix="realbench-run-") as out_dir:
        elastic_log = logging.getLogger("torch.distributed.elastic")
        level = elastic_log.level
        elastic_log.setLevel(logging.CRITICAL)  # we report the failing rank ourselves, in one line
        done = threading.Event()
        watcher = None
        if on_step is not None:
            watcher = threading.Thread(target=_watch_steps, daemon=True, args=(
                out_dir, nproc, done, on_step,
                lambda recs: summarize_run(scenario, options, recs, resume_step, profile)))
            watcher.start()
        try:
            # the launcher's banner ("Launching training on N CUDAs", even on the CPU) must neither
            # spoil --json nor name a device we do not use: the summary says which one ran
            with contextlib.redirect_stdout(io.StringIO()):
                accelerate.notebook_launcher(worker_process, (scenario.to_document(), plan_doc, steps, seed, out_dir,
                                                            save_every, checkpoint_dir, resume_step, device_type),
                                             num_processes=nproc, use_port=str(free_port()))
        except Exception as e:
            # the first error written is the cause; the others are peers losing their connection
            errors = sorted(Path(out_dir).glob("error.*"), key=lambda p: p.stat().st_mtime_ns)
            first = errors[0].read_text().splitlines()[0] if errors else f"{type(e).__name__}: {e}".splitlines()[0]
            raise RunError(first) from None
        finally:
            elastic_log.setLevel(level)
            done.set()
            if watcher is not None:
                watcher.join()
        records = json.loads(Path(out_dir, "records.json").read_text())
    return {**summarize_run(scenario, options, records, resume_step, profile), "device": device_type}
