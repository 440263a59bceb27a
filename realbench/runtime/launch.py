"""Launch a plan on local processes through Accelerate (`accelerate.notebook_launcher`, which
starts the workers with torch's elastic launcher: gloo on CPU, NCCL when GPUs are present).

The same call serves the CLI (`realbench run`) and notebooks. Each worker reads its rank from
the environment the launcher sets, joins the process group with a timeout (so that a dead peer
makes the others fail instead of hang), runs the steps, and rank 0 writes the summary as JSON.
A failing worker writes one line naming its rank and the call it was in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import sys
import tempfile
import traceback
from pathlib import Path

from realbench.errors import ConfigError

COLLECTIVE_TIMEOUT_S = 60


class RunError(RuntimeError):
    """A run that started but failed (not bad input): one line naming the rank and the call."""


def _worker_main(scenario_doc: dict, plan_doc: dict, steps: int, seed: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from realbench.plan.plan import plan_from_document, resolve_plan
    from realbench.plan.scenario import scenario_from_document
    from realbench.runtime.local import backend
    from realbench.runtime.worker import Worker

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    where = "start-up"
    try:
        dist.init_process_group(backend(), timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        scenario = scenario_from_document(scenario_doc)
        options = resolve_plan(plan_from_document(plan_doc), scenario)
        worker = Worker(rank, scenario, options, seed)
        records = []
        for s in range(steps):
            where = f"step {s}"
            records.append(dataclasses.asdict(worker.step(s)))
        where = "gathering results"
        everyone = [None] * world
        dist.all_gather_object(everyone, records)
        if rank == 0:
            Path(out_dir, "records.json").write_text(json.dumps(everyone))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:
        Path(out_dir, f"error.{rank}").write_text(
            f"rank {rank} failed during {where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}\n"
            + traceback.format_exc())
        raise


def summarize(records: list[list[dict]], estimated: dict[str, float], estimated_realloc: float) -> dict:
    """Per call: measured seconds (slowest rank, mean over steps after the first) beside the
    estimate; reallocated bytes per step; reward and loss per step."""
    steps = len(records[0])
    warm = range(1, steps) if steps > 1 else range(steps)
    calls = {}
    for name, est in estimated.items():
        per_step = [max((r[s]["call_s"].get(name, 0.0) for r in records), default=0.0) for s in warm]
        calls[name] = {"measured_s": sum(per_step) / len(per_step), "estimated_s": est}
    metrics = []
    for s in range(steps):
        rewards = [r[s]["reward"] for r in records if r[s]["reward"] is not None]
        losses_ = [r[s]["loss"] for r in records if r[s]["loss"] is not None]
        metrics.append({"step": s, "reward": sum(rewards) / len(rewards) if rewards else None,
                        "loss": sum(losses_) / len(losses_) if losses_ else None})
    realloc = [sum(r[s]["realloc_bytes"] for r in records) for s in range(steps)]
    return {"steps": steps, "calls": calls, "realloc_bytes": realloc[0] if realloc else 0,
            "estimated_realloc_s": estimated_realloc, "metrics": metrics}


def run_plan(scenario, options: dict, nproc: int, steps: int, seed: int = 0) -> dict:
    """Run `steps` RLHF steps of a plan on `nproc` local processes; returns the summary."""
    import accelerate

    from realbench.cost import Estimator
    from realbench.plan.plan import plan_from_options
    from realbench.runtime.local import free_port

    needed = max(o.mesh.start(scenario.cluster.gpus_per_node) + o.mesh.size for o in options.values())
    if nproc != needed and nproc != scenario.cluster.n_devices:
        raise ConfigError(f"the plan uses {needed} device(s); run it with --nproc {needed}", "--nproc")
    if steps < 1:
        raise ConfigError("must be at least 1", "--steps")
    est = Estimator(scenario)
    choice = est.choice_of(options)
    estimate = est.estimate(choice)
    estimated = {n: c.time_s for n, c in estimate.calls.items()}
    plan_doc = plan_from_options(scenario, options).to_document()
    with tempfile.TemporaryDirectory(prefix="realbench-run-") as out_dir:
        elastic_log = logging.getLogger("torch.distributed.elastic")
        level = elastic_log.level
        elastic_log.setLevel(logging.CRITICAL)  # we report the failing rank ourselves, in one line
        try:
            with contextlib.redirect_stdout(sys.stderr):  # the launcher's banner must not spoil --json
                accelerate.notebook_launcher(_worker_main, (scenario.to_document(), plan_doc, steps, seed, out_dir),
                                             num_processes=nproc, use_port=str(free_port()))
        except Exception as e:
            # the first error written is the cause; the others are peers losing their connection
            errors = sorted(Path(out_dir).glob("error.*"), key=lambda p: p.stat().st_mtime_ns)
            first = errors[0].read_text().splitlines()[0] if errors else f"{type(e).__name__}: {e}".splitlines()[0]
            raise RunError(first) from None
        finally:
            elastic_log.setLevel(level)
        records = json.loads(Path(out_dir, "records.json").read_text())
    return summarize(records, estimated, estimate.realloc_s)
