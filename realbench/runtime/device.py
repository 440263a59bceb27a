"""Which device a run's processes use, and the process group that goes with it.

CPU processes talk over gloo; CUDA processes, one GPU each (the launcher's LOCAL_RANK), over
NCCL, which carries only tensors on the GPU, so everything a worker sends lives on its device.
NCCL also differs from gloo in one way that the runtime's message order respects: point-to-point
operations on one communicator run in the order they were issued, and a send waits for the
matching receive; so two ranks must issue their messages to each other in the same order, or
post them together (`batch_isend_irecv`, one NCCL group), or use different communicators (the
generation loop's tokens travel on a group of their own, see `layout.Groups.loop`).
"""

from __future__ import annotations

import datetime
import os
from typing import Optional

import torch
import torch.distributed as dist

from realbench.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(requested: str, local_processes: int) -> str:
    """"cpu" or "cuda" for `local_processes` processes on this machine: auto takes CUDA when
    there is a GPU for every process (NCCL needs one GPU per rank), else the CPU.
    The GPUs are counted through NVML, not the CUDA runtime (`torch.cuda.is_available`), so the
    calling process (a notebook kernel, say) gets no CUDA context of its own: it would hold GPU
    memory, and a process forked from it could no longer use CUDA."""
    if requested not in DEVICES:
        raise ConfigError(f"unknown device {requested!r} ({', '.join(DEVICES)})", "--device")
    gpus = torch.cuda.device_count()  # 0 without a CUDA build; NVML when it can
    if requested == "auto":
        return "cuda" if gpus >= local_processes else "cpu"
    if requested == "cuda" and gpus < local_processes:
        raise ConfigError(f"{local_processes} process(es) need as many GPUs; this machine has {gpus}", "--device")
    return requested


DTYPES = ("auto", "bf16", "fp32")


def resolve_dtype(requested: str, device_type: str) -> str:
    """"bf16" or "fp32": auto takes bf16 on CUDA (what its tensor cores run fast) and fp32 on the
    CPU (where bf16 matmuls are slower than fp32 ones)."""
    if requested not in DTYPES:
        raise ConfigError(f"unknown dtype {requested!r} ({', '.join(DTYPES)})", "--dtype")
    if requested == "auto":
        return "bf16" if device_type == "cuda" else "fp32"
    return requested


# a dtype's name in files (profiles, Hugging Face configs) and its bytes per value
DTYPE_NAMES = {"bf16": "bfloat16", "fp32": "float32"}
DTYPE_BYTES = {"bf16": 2, "fp32": 4}


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, DTYPE_NAMES[name])


def backend(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def init_process_group(device_type: str, timeout_s: float, local_rank: Optional[int] = None,
                       **kwargs) -> torch.device:
    """Join the process group (rendezvous from `kwargs` or the launcher's environment) and
    return this process's device. On CUDA the communicator is built at once (`device_id`) and a
    first barrier involves every rank, because NCCL requires the first operation on a group to
    be collective (a reallocation between some ranks may come first otherwise)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if device_type != "cuda":
        dist.init_process_group(backend(device_type), timeout=timeout, **kwargs)
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", 0)) if local_rank is None else local_rank
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    dist.init_process_group(backend(device_type), timeout=timeout, device_id=device, **kwargs)
    dist.barrier()
    return device


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a wall-clock time measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
