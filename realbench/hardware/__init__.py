"""Hardware: device specs and cluster specs.

A cluster is `nodes` x `gpus_per_node` identical devices. Devices are numbered node-major:
device id = node * gpus_per_node + local index. Links: every device has `intra_bw` bytes/s to
the devices of its node (NVLink) and `inter_bw` bytes/s to other nodes (its NIC).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from realbench.errors import ConfigError

GiB = 1024**3


class DeviceSpec(BaseModel):
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


class ClusterSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    nodes: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    device: DeviceSpec
    intra_bw: float = Field(gt=0)  # bytes/s per device inside a node
    inter_bw: float = Field(gt=0)  # bytes/s per device across nodes
    intra_latency_s: float = Field(default=8e-6, ge=0)
    inter_latency_s: float = Field(default=20e-6, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "ClusterSpec":
        g = self.gpus_per_node
        if g & (g - 1):
            raise ValueError(f"gpus_per_node {g} is not a power of two")
        return self

    @property
    def n_devices(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, device: int) -> int:
        return device // self.gpus_per_node


DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in [
        DeviceSpec(name="h100", memory_bytes=80 * GiB, flops=989e12, mem_bw=3.35e12),
        DeviceSpec(name="a100", memory_bytes=80 * GiB, flops=312e12, mem_bw=2.0e12),
        # A CPU "device" as used by the tiny scenarios: one process per core, gloo links.
        DeviceSpec(name="cpu", memory_bytes=4 * GiB, flops=5e10, mem_bw=1e10,
                   matmul_efficiency=0.5, half_efficiency_rows=16, kernel_overhead_s=3e-5),
    ]
}

# Link bandwidths per device: NVLink 4 (H100) / 3 (A100) inside a node; one 400/200 Gb/s NIC
# per GPU across nodes; loopback TCP between CPU processes.
LINKS: dict[str, dict[str, float]] = {
    "h100": {"intra_bw": 450e9, "inter_bw": 50e9},
    "a100": {"intra_bw": 300e9, "inter_bw": 25e9},
    "cpu": {"intra_bw": 2e9, "inter_bw": 1e9, "intra_latency_s": 5e-5, "inter_latency_s": 1e-4},
}


def get_device(name: str) -> DeviceSpec:
    try:
        return DEVICES[name]
    except KeyError:
        raise ConfigError(f"unknown device {name!r} (known: {', '.join(DEVICES)})") from None


def cluster(nodes: int, gpus_per_node: int, device: str = "h100") -> ClusterSpec:
    """A cluster of a preset device type with that device's preset links."""
    return ClusterSpec(nodes=nodes, gpus_per_node=gpus_per_node, device=get_device(device),
                       **LINKS[device])
