"""Hardware: device specs and cluster specs.

A cluster is `nodes` x `gpus_per_node` identical devices. Devices are numbered node-major:
device id = node * gpus_per_node + local index. Links: every device has `intra_bw` bytes/s to
the devices of its node (NVLink) and `inter_bw` bytes/s to other nodes (its NIC).

Plans use `memory_fraction` of each device's memory (default 0.9): a caching allocator
fragments, and the CUDA context and communicator buffers take their share, so a plan packed to
the last byte runs out of memory. 0.9 is what serving engines leave by default (vLLM's
`gpu_memory_utilization`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from realbench.errors import ConfigError
from realbench.schema import FileModel

GiB = 1024**3


class DeviceSpec(FileModel):
    """One accelerator. `flops` is dense bf16 peak; `matmul_efficiency` the best fraction of it
    that large matmuls reach; `half_efficiency_rows` the number of rows (tokens) at which a
    matmul reaches half of that (small matmuls underuse the device)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    memory_bytes: int = Field(gt=0)
    flops: float = Field(gt=0)
    mem_bw: float = Field(gt=0)
    matmul_efficiency: float = Field(default=0.6, gt=0, le=1)
    half_efficiency_rows: float = Field(default=96.0, ge=0)
    mem_bw_efficiency: float = Field(default=0.85, gt=0, le=1)
    kernel_overhead_s: float = Field(default=6e-6, ge=0)  # fixed cost per layer per step (launches)
    # the engine's own work in a step outside its calls (moving batches between them, its
    # controller): none in the presets; `realbench calibrate` fits it from a log's whole step
    step_overhead_s: float = Field(default=0.0, ge=0)


class ClusterSpec(FileModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    nodes: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    device: DeviceSpec
    intra_bw: float = Field(gt=0)  # bytes/s per device inside a node
    inter_bw: float = Field(gt=0)  # bytes/s per device across nodes
    intra_latency_s: float = Field(default=8e-6, ge=0)
    inter_latency_s: float = Field(default=20e-6, ge=0)
    # bytes/s per device to its host's memory (PCIe, per direction): parameters kept in host memory
    # (an engine's CPU offload) cross it for every forward (realbench.cost.calls)
    host_bw: float = Field(default=32e9, gt=0)
    # parameters a second that one host CPU thread's Adam updates (DeepSpeed's vectorized CPU Adam:
    # the optimizer step of ZeRO-Offload, OpenRLHF's --ds.adam_offload, realbench.cost.sharding),
    # fitted by `realbench bench fidelity` to CPU Adam times measured with `bench host-adam` (FITTED below)
    host_adam_rate: float = Field(default_factory=lambda: FITTED["host_adam_rate"], gt=0)
    memory_fraction: float = Field(default=0.9, gt=0, le=1)  # of each device's memory, for plans
    # how the engine that runs the plan computes attention: "flash" (one fused kernel, the scores
    # never in memory: FlashAttention, PyTorch's SDPA, realbench's runtime) or "materialized" (the
    # scores written to memory and passed over by separate softmax and dropout kernels, as
    # Megatron-LM did before flash attention; the cost model charges them, realbench.cost.calls)
    attention: Literal["flash", "materialized"] = "flash"

    @model_validator(mode="after")
    def _check(self) -> "ClusterSpec":
        g = self.gpus_per_node
        if g & (g - 1):
            raise ValueError(f"gpus_per_node {g} is not a power of two")
        return self

    @property
    def n_devices(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def usable_memory_bytes(self) -> int:
        """What a plan may use per device (see the module doc)."""
        return int(self.device.memory_bytes * self.memory_fraction)

    def node_of(self, device: int) -> int:
        return device // self.gpus_per_node


# Datasheet numbers of the GPU presets: dense bf16 peak FLOP/s, HBM bytes/s, NVLink bytes/s per
# direction per GPU, and each GPU's NIC (one per GPU: NDR 400 Gb/s on H100 and H200 systems, HDR
# 200 Gb/s on A100 ones), and its PCIe link to the host per direction (Gen5 x16 on H100 and H200,
# 128 GB/s both ways; Gen4 x16 on A100, 64 GB/s; taken at the datasheet's rate: no published
# measurement here fits it). NVIDIA H100 SXM5, H200 SXM and A100 SXM4 80GB datasheets: the H200 is the
# H100's GH100 die with 141 GB of HBM3e at 4.8 TB/s on the same NVLink 4 fabric. The H20 (NVIDIA HGX H20,
# the Hopper part for China that verl's asynchronous-training tables ran on) keeps NVLink 4 (900 GB/s
# both ways) and Gen5 PCIe with 96 GB of HBM3 at 4.0 TB/s, its tensor cores cut to 148 TFLOP/s dense
# bf16; its nodes' NICs taken as the H100's (400 Gb/s a GPU).
DATASHEETS: dict[str, dict[str, float]] = {
    "h100": {"memory_bytes": 80 * GiB, "flops": 989e12, "mem_bw": 3.35e12, "nvlink": 450e9, "nic": 50e9, "pcie": 64e9},
    "h200": {"memory_bytes": 141e9, "flops": 989e12, "mem_bw": 4.8e12, "nvlink": 450e9, "nic": 50e9, "pcie": 64e9},
    "h20": {"memory_bytes": 96 * GiB, "flops": 148e12, "mem_bw": 4.0e12, "nvlink": 450e9, "nic": 50e9, "pcie": 64e9},
    "a100": {"memory_bytes": 80 * GiB, "flops": 312e12, "mem_bw": 2.039e12, "nvlink": 300e9, "nic": 25e9, "pcie": 32e9},
}

# The presets' free parameters, fitted by `realbench bench fidelity` (realbench.bench.fidelity) to
# the fit rows of realbench/hardware/published.yaml: training throughput (torchtitan, Llama 3),
# generation throughput and latency (TensorRT-LLM) and nccl-tests bus bandwidths (AWS, GCP, 8 x
# H200). The test suite refits them and checks these values; the held-out rows' errors are in the
# README. H100 generation has no published bf16 rows here: it shares A100's memory efficiency.
FITTED: dict[str, float] = {
    # one for both GPUs: the H100 rows alone (Llama 3's interleaved pipeline, whose virtual stage
    # count is not published) would fit more, an MFU no published dense bf16 run reaches
    "matmul_efficiency": 0.7908,
    "mem_bw_efficiency": 0.7720,
    "half_efficiency_rows": 28.35,
    "kernel_overhead_s": 1e-9,  # at its bound: fused kernels and CUDA graphs (TensorRT-LLM) hide launches
    "a100.nvlink_efficiency": 0.6340,
    "h100.nvlink_efficiency": 1.012,  # NVLink SHARP reduces inside the switch (see realbench.cost.comm)
    "nic_efficiency": 0.7317,
    "intra_latency_s": 2.957e-6,
    "inter_latency_s": 1.091e-4,
    # one host thread's CPU Adam, parameters a second (DeepSpeed's kernel measured on a core of a
    # Sapphire-Rapids-class Xeon, the DGX H100's host; A100 nodes' EPYC hosts get the same rate)
    "host_adam_rate": 7.655e8,
}


def gpu_device(name: str, fit: dict[str, float] = FITTED) -> DeviceSpec:
    """A GPU preset: its datasheet with the fitted efficiencies."""
    d = DATASHEETS[name]
    return DeviceSpec(name=name, memory_bytes=int(d["memory_bytes"]), flops=d["flops"], mem_bw=d["mem_bw"],
                      matmul_efficiency=fit["matmul_efficiency"], half_efficiency_rows=fit["half_efficiency_rows"],
                      mem_bw_efficiency=fit["mem_bw_efficiency"], kernel_overhead_s=fit["kernel_overhead_s"])


# presets whose NVLink is another's fabric: the H200 and the H20 sit on the H100's NVSwitch (NVLink 4), and
# the fitted NVLink rows are measured on 8 x H200 (realbench/hardware/published.yaml, bekman)
SAME_NVLINK = {"h200": "h100", "h20": "h100"}


def gpu_links(name: str, fit: dict[str, float] = FITTED, nic: float = 0.0) -> dict[str, float]:
    """A GPU preset's links (ClusterSpec fields): NVLink and the NIC (`nic` bytes/s per GPU, else
    the datasheet's) at their fitted efficiencies."""
    d = DATASHEETS[name]
    return {"intra_bw": d["nvlink"] * fit[f"{SAME_NVLINK.get(name, name)}.nvlink_efficiency"], "inter_bw": (nic or d["nic"]) * fit["nic_efficiency"],
            "intra_latency_s": fit["intra_latency_s"], "inter_latency_s": fit["inter_latency_s"], "host_bw": d["pcie"],
            "host_adam_rate": fit["host_adam_rate"]}


# The RL engines' own speed against the presets: the matmul and HBM efficiencies times these, fitted by
# `realbench bench fidelity` (realbench.bench.fidelity.engine_fit) to the calls that verl's published runs
# time one by one and checked on every published whole step (the README's table); the test suite
# refits them and checks these values. The `h100-rl` preset is the H100 with them.
ENGINE_FACTORS: dict[str, float] = {"k_matmul": 0.6365, "k_decode": 0.2545}


def engine_device(name: str, factors: dict[str, float] = ENGINE_FACTORS) -> DeviceSpec:
    """A GPU preset as the RL engines' published runs use it (ENGINE_FACTORS): its name stays the
    datasheet's, since the chip is the same."""
    d = gpu_device(name)
    return d.model_copy(update={"matmul_efficiency": d.matmul_efficiency * factors["k_matmul"],
                                "mem_bw_efficiency": d.mem_bw_efficiency * factors["k_decode"]})


DEVICES: dict[str, DeviceSpec] = {
    **{name: gpu_device(name) for name in DATASHEETS},
    "h100-rl": engine_device("h100"),
    # A CPU "device" as used by the tiny scenarios: one process per core, gloo links. Local plans
    # are costed with a profile of the machine (realbench.runtime.profile_cache); these numbers are the
    # fallback with `--profile none`.
    "cpu": DeviceSpec(name="cpu", memory_bytes=4 * GiB, flops=5e10, mem_bw=1e10,
                      matmul_efficiency=0.5, half_efficiency_rows=16, kernel_overhead_s=3e-5),
}

LINKS: dict[str, dict[str, float]] = {
    **{name: gpu_links(name) for name in DATASHEETS},
    "h100-rl": gpu_links("h100"),
    "cpu": {"intra_bw": 2e9, "inter_bw": 1e9, "intra_latency_s": 5e-5, "inter_latency_s": 1e-4,  # loopback TCP
            "host_bw": 1e10},  # (its memory: the device's own bandwidth)
}


def get_device(name: str) -> DeviceSpec:
    try:
        return DEVICES[name]
    except KeyError:
        raise ConfigError(f"unknown device {name!r} (known: {', '.join(DEVICES)})") from None


LINK_FIELDS = ("intra_bw", "inter_bw", "intra_latency_s", "inter_latency_s", "host_bw", "host_adam_rate")


class DeviceFile(FileModel):
    """A device preset as a file (`realbench.device/1`): the device, its links (ClusterSpec's
    fields), and where it came from (`realbench calibrate` writes its fit and the log's phases
    there). `estimate --device FILE` and `search --device FILE` plan on it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: DeviceSpec
    links: dict[str, float]
    calibration: dict = {}

    @model_validator(mode="after")
    def _check(self) -> "DeviceFile":
        unknown = sorted(set(self.links) - set(LINK_FIELDS))
        if unknown:
            raise ConfigError(f"unknown link {unknown[0]!r} (known: {', '.join(LINK_FIELDS)})", "links")
        bad = [k for k, v in self.links.items() if not v > 0 and not (k.endswith("latency_s") and v == 0)]
        if bad:
            raise ConfigError(f"{self.links[bad[0]]!r} must be above 0", f"links.{bad[0]}")
        return self


def load_device(name_or_path: str) -> tuple[DeviceSpec, dict[str, float]]:
    """A preset by name, or a device file (`realbench.device/1`): the device and its links."""
    from pathlib import Path

    from realbench.schema import DEVICE_SCHEMA, read_document, validate_model

    if name_or_path in DEVICES:
        return DEVICES[name_or_path], dict(LINKS[name_or_path])
    if Path(name_or_path).suffix.lower() not in (".yaml", ".yml", ".json"):
        raise ConfigError(f"unknown device {name_or_path!r}: not a preset ({', '.join(DEVICES)}) nor a .yaml/.json "
                          "device file", "--device")
    data = read_document(name_or_path)
    if data.get("schema") != DEVICE_SCHEMA:
        raise ConfigError(f"expected schema {DEVICE_SCHEMA}, got {data.get('schema')!r}", "schema", name_or_path)
    try:
        doc = validate_model(DeviceFile, {k: v for k, v in data.items() if k != "schema"})
    except ConfigError as e:
        raise e.in_file(name_or_path) from None
    return doc.device, dict(doc.links)


def cluster(nodes: int, gpus_per_node: int, device: str = "h100") -> ClusterSpec:
    """A cluster of a preset device type with that device's preset links."""
    return ClusterSpec(nodes=nodes, gpus_per_node=gpus_per_node, device=get_device(device),
                       **LINKS[device])
