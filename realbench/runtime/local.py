"""Start N local worker processes joined in one torch.distributed group, run a function on
each, and collect what each returns. Used by the tests and benchmarks;
`realbench run` launches through Accelerate instead.

A worker that raises makes the others stop: every collective has a timeout, and the parent
reports the first failure with its rank.

The processes are forked from a server that imported torch and the runtime once (Python's
"forkserver" start method): a fresh interpreter per process imports them again, about 3 s of CPU
each, more than most of the work a test or a profile gives it. The server is single-threaded, so
its forks are safe where a fork of the caller (a Jupyter kernel, a threaded program) is not; it
started with the caller's environment of then, so each process takes the caller's of now."""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from realbench.runtime.device import init_process_group


PRELOADED = ["realbench.runtime.worker"]  # torch with it


def context():
    """The multiprocessing context local processes start from: the fork server where the system
    has one (not Windows), else fresh interpreters."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOADED)
    return ctx


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn: Callable, args: tuple, results, timeout_s: float,
           device: str, environ: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(environ)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        init_process_group(device, timeout_s, local_rank=rank, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                           world_size=world)
        results.put((rank, True, fn(rank, world, *args)))
    except BaseException as e:  # report, then let the parent decide
        results.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class WorkerError(RuntimeError):
    pass


def spawn(fn: Callable, world: int, *args: Any, timeout_s: float = 120.0, device: str = "cpu") -> list[Any]:
    """Run fn(rank, world, *args) on `world` processes (on the CPU over gloo, or one GPU each over
    NCCL); returns the results by rank."""
    ctx = context()
    results = ctx.Queue()
    port = free_port()
    environ = dict(os.environ)
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, results, timeout_s, device, environ),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s + 30
    try:
        while len(out) < world:
            try:
                rank, ok, value = results.get(timeout=1.0)
            except queue.Empty:
                # a process that died before reporting (killed, crashed in start-up) says nothing
                dead = [r for r, p in enumerate(procs) if r not in out and p.exitcode is not None]
                if dead and results.empty():
                    r = dead[0]
                    raise WorkerError(f"rank {r} exited with status {procs[r].exitcode} without a result")
                if time.monotonic() > deadline:
                    raise WorkerError(f"no result from ranks {sorted(set(range(world)) - set(out))} "
                                      f"after {timeout_s + 30:.0f} s")
                continue
            if not ok:
                raise WorkerError(f"rank {rank} failed: {value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(world)]
