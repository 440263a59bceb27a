"""Hardware profiles (`realbench.profile/1`): measured costs of the runtime's own layers and of
collectives on one machine, and their interpolation.

A profile holds, per profiled model architecture and tensor-parallel degree, the median seconds
of each layer operation over a grid of (batch, length):

    embed.fwd, block.fwd, head.fwd, value_head.fwd      forward on batch x length tokens
    embed.fwd_bwd, block.fwd_bwd, head.fwd_bwd, ...     forward + backward
    block.decode                                        one token against a KV cache of `length`
    loss.fwd_bwd, logprobs.fwd                          log-softmax + gather over the vocabulary
    sample                                              log-softmax + multinomial, per batch (length 1)

plus an Adam fit (seconds = c0 + c_tensor * tensors + c_param * parameters) and, per group
size, the collectives all_reduce, all_gather, broadcast, p2p and exchange (the runtime's
all-to-all of a call's inputs) over message sizes.

Whole calls, too (`calls`): the runtime's own generate, inference forward and train update
(forward, backward, gradient norm, the flat fused Adam) at one reference shape (CALL_REFERENCE)
split into each micro-batch count of CALL_MICRO_BATCHES, on every (tp, pp) layout that the
processes allow, with as many copies of the layout running at once as the processes hold, so
that they share the cores as a run's calls do, and, where the processes outnumber the cores,
one copy alone as well. The cost model composes a call from the operations and scales it by
measured / composed at the reference (realbench.cost.profiled.call_factor): what the operations
miss (the runtime's per-slot Python work, which grows with the micro-batches, waits between
stages, processes that outnumber the cores) is measured rather than assumed.

Interpolation is piecewise linear in log(batch), log(length) and log(seconds) (bilinear inside
the grid, so exact at grid points and monotone between monotone neighbours); outside the grid
it extrapolates along the last segment's power law (below it, holds the first value). Measured
grids are made monotone (a cumulative minimum from the large end along each axis) when loaded:
a larger batch never costs less.
"""

from __future__ import annotations

import bisect
import math
import platform
from functools import cached_property
from typing import Optional

from pydantic import ConfigDict, Field, model_validator

from realbench.errors import ConfigError
from realbench.schema import PROFILE_SCHEMA, FileModel, read_document, unknown_key, validate_model, write_text

LAYER_OPS = ("embed.fwd", "embed.fwd_bwd", "block.fwd", "block.fwd_bwd", "block.decode", "head.fwd",
             "head.fwd_bwd", "value_head.fwd", "value_head.fwd_bwd", "logprobs.fwd", "loss.fwd_bwd", "sample")
# exchange: every process of the group sends a message to every other, all posted at once (how
# the runtime moves a call's inputs: realbench.runtime.worker._exchange)
COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "p2p", "exchange")


class Timing(FileModel):
    """Seconds of `repeats` runs after `warmup` unmeasured ones."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    median_s: float = Field(gt=0)
    p10_s: float = Field(gt=0)
    p90_s: float = Field(gt=0)
    repeats: int = Field(ge=1)


class LayerPoint(Timing):
    batch: int = Field(ge=1)
    length: int = Field(ge=1)


class CollectivePoint(Timing):
    nbytes: int = Field(ge=1)


# The shape at which whole calls are measured: `rows` sequences of a `prompt_len`-token prompt
# and `gen_len` generated tokens (inference and train read rows of prompt_len + gen_len), one
# micro-batch, one optimizer update.
CALL_REFERENCE = {"rows": 8, "prompt_len": 8, "gen_len": 8}
CALL_MICRO_BATCHES = (1, 2, 4)  # each whole call is measured split into these
CALL_KINDS = ("generate", "inference", "train")
# how the runtime ran the whole calls a profile measured: a cached profile measured another way
# is measured again (generation without a pipeline runs by continuous batching since 2)
CALLS_VERSION = "2"


class CallPoint(Timing):
    """Seconds of one whole call of the runtime at CALL_REFERENCE on a (tp, pp) layout of a
    model with `layers` layers, `copies` copies of the layout running at once."""

    kind: str
    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    micro_batches: int = Field(1, ge=1)
    layers: int = Field(ge=1)
    copies: int = Field(ge=1)
    rows: int = Field(ge=1)
    prompt_len: int = Field(ge=1)
    gen_len: int = Field(ge=1)

    @model_validator(mode="after")
    def _check(self) -> "CallPoint":
        if self.kind not in CALL_KINDS:
            raise ValueError(f"unknown call kind {self.kind!r} (known: {', '.join(CALL_KINDS)})")
        return self


class OptimizerFit(FileModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    fixed_s: float = Field(ge=0)
    per_tensor_s: float = Field(ge=0)
    per_param_s: float = Field(ge=0)

    def time(self, tensors: int, params: float) -> float:
        return self.fixed_s + self.per_tensor_s * tensors + self.per_param_s * params


class ModelProfile(FileModel):
    """Measurements of one model architecture (its shape: hidden, heads, ffn, vocab)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hidden: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_kv_heads: int = Field(gt=0)
    ffn: int = Field(gt=0)
    vocab: int = Field(gt=0)
    # what else the layers compute that changes their time (`variant_of`: a head width of their
    # own, q/k norms, a mixture of experts); "" for a LLaMA layer, as every profile before them
    variant: str = ""
    ops: dict[str, dict[str, list[LayerPoint]]]  # tp (as a string key) -> op -> points
    optimizer: dict[str, OptimizerFit] = {}  # tp -> Adam fit
    calls: list[CallPoint] = []  # whole calls of the runtime (empty in profiles from before them)

    @model_validator(mode="after")
    def _check(self) -> "ModelProfile":
        for tp, ops in self.ops.items():
            if not tp.isdigit() or int(tp) < 1:
                raise ValueError(f"tp key {tp!r} is not a positive whole number")
            for op in ops:
                if op not in LAYER_OPS:
                    raise unknown_key(op, LAYER_OPS, f"ops.{tp}.")
        return self

    def has_whole_calls(self, contended: bool = False) -> bool:
        """Whole calls measured at every micro-batch count of CALL_MICRO_BATCHES (profiles from
        before they were measured have none, from before they were split one count), and, on a
        machine whose processes outnumber its cores (`contended`), every layout alone too."""
        layouts = {(c.tp, c.pp) for c in self.calls}
        alone = {(c.tp, c.pp) for c in self.calls if c.copies == 1}
        return set(CALL_MICRO_BATCHES) <= {c.micro_batches for c in self.calls} and (not contended or alone == layouts)

    def matches(self, spec) -> bool:
        return shape_key(self) == shape_key(spec)


def shape_key(m) -> tuple:
    """What a profile's measurements depend on (a ModelSpec or a ModelProfile): two models of one
    shape share them, whatever their names or depths."""
    variant = m.variant if isinstance(m, ModelProfile) else variant_of(m)
    return (m.hidden, m.n_heads, m.n_kv_heads, m.ffn, m.vocab, variant)


def variant_of(spec) -> str:
    """A spec's layers beyond a LLaMA layer's shape, as a profile records them: "d<head_dim>" where
    a head's width is its own (Qwen3), "qk" with q/k norms, "e<experts>k<top_k>f<expert_ffn>" for a
    mixture of experts (with "m<layers>" naming its dense layers); "" for a LLaMA layer."""
    parts = []
    if spec.head_dim * spec.n_heads != spec.hidden:
        parts.append(f"d{spec.head_dim}")
    if spec.qk_norm:
        parts.append("qk")
    if spec.moe is not None:
        m = spec.moe
        parts.append(f"e{m.experts}k{m.top_k}f{m.expert_ffn}" + "".join(f"m{i}" for i in m.dense_layers))
    return "-".join(parts)


class DeviceInfo(FileModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str  # cpu | cuda
    name: str  # the processor or GPU model
    preset: str  # the hardware preset it stands for (cpu, h100, a100, ...)
    processes: int = Field(ge=1)
    threads_per_process: int = Field(ge=1)
    cores: int = Field(default=0, ge=0)  # CPU cores this process may use (0: not recorded)


class Profile(FileModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    device: DeviceInfo
    versions: dict[str, str]
    date: str
    dtype: str = "float32"
    bytes_per_value: int = Field(default=4, ge=1)
    # generation's decode steps measured compiled (realbench profile --compile-decode): the runs
    # this prices are `realbench run --compile-decode`'s
    compile_decode: bool = False
    models: dict[str, ModelProfile]
    collectives: dict[str, dict[str, list[CollectivePoint]]] = {}  # kind -> group size -> points

    @model_validator(mode="after")
    def _check(self) -> "Profile":
        for kind, groups in self.collectives.items():
            if kind not in COLLECTIVES:
                raise unknown_key(kind, COLLECTIVES, "collectives.")
            for n in groups:
                if not n.isdigit() or int(n) < 2:
                    raise ValueError(f"group size {n!r} must be a whole number >= 2")
        return self

    def to_document(self) -> dict:
        return {"schema": PROFILE_SCHEMA, **self.model_dump(mode="json")}

    def save(self, path, overwrite: bool = False):
        import json

        return write_text(json.dumps(self.to_document(), indent=1) + "\n", path, overwrite)

    # -- lookups --------------------------------------------------------------------------------------
    def model_for(self, spec) -> Optional[tuple[str, ModelProfile]]:
        for name, m in self.models.items():
            if m.matches(spec):
                return name, m
        return None

    @cached_property
    def _grids(self) -> dict:
        out = {}
        for name, m in self.models.items():
            for tp, ops in m.ops.items():
                for op, points in ops.items():
                    if points:
                        out[(name, int(tp), op)] = Grid2D.from_points(
                            [(p.batch, p.length, p.median_s) for p in points])
        return out

    @cached_property
    def _curves(self) -> dict:
        return {(kind, int(n)): Curve1D.from_points([(p.nbytes, p.median_s) for p in points])
                for kind, groups in self.collectives.items() for n, points in groups.items() if points}

    def call_points(self, model_name: str, kind: str, tp: int, pp: int, alone: bool = False) -> list[CallPoint]:
        """The whole-call measurements of a kind on a (tp, pp) layout by micro-batch count: with
        as many copies running as the processes held, or (`alone`) one copy; [] where none."""
        points = [c for c in self.models[model_name].calls if (c.kind, c.tp, c.pp) == (kind, tp, pp)]
        if not points:
            return []
        copies = 1 if alone else max(c.copies for c in points)
        return sorted((c for c in points if c.copies == copies), key=lambda c: c.micro_batches)

    def op_time(self, model_name: str, tp: int, op: str, batch: float, length: float) -> Optional[float]:
        grid = self._grids.get((model_name, tp, op))
        return None if grid is None else grid(batch, length)

    def collective_time(self, kind: str, n: int, nbytes: float) -> Optional[float]:
        """Seconds of one collective over n processes; p2p is measured between 2."""
        if n <= 1 and kind != "p2p":
            return 0.0
        curve = self._curves.get((kind, 2 if kind == "p2p" else n))
        if curve is None:  # the nearest measured group size, scaled by the ring's (n-1)/n
            sizes = sorted(k for (c, k) in self._curves if c == kind)
            if not sizes:
                return None
            near = min(sizes, key=lambda k: abs(math.log(k / n)))
            ring = (n - 1) / n / ((near - 1) / near)
            return self._curves[(kind, near)](nbytes) * ring
        return curve(nbytes)


# -- interpolation ---------------------------------------------------------------------------------------
def _segment(xs: list[float], x: float) -> int:
    """Index i of the segment [xs[i], xs[i+1]] used for x (the end segments extrapolate)."""
    return min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)


class Curve1D:
    """log-log piecewise-linear y(x) through measured points (y made non-decreasing)."""

    def __init__(self, xs: list[float], ys: list[float]):
        self.lx = [math.log(x) for x in xs]
        self.ly = [math.log(y) for y in ys]

    @classmethod
    def from_points(cls, points: list[tuple[float, float]]) -> "Curve1D":
        by_x: dict[float, list[float]] = {}
        for x, y in points:
            by_x.setdefault(float(x), []).append(y)
        xs = sorted(by_x)
        ys, low = [], math.inf
        for x in reversed(xs):  # cumulative minimum from the large end (see Grid2D)
            low = min(low, sorted(by_x[x])[len(by_x[x]) // 2])
            ys.append(low)
        return cls(xs, ys[::-1])

    def __call__(self, x: float) -> float:
        lx = math.log(max(x, 1e-12))
        if lx <= self.lx[0]:  # below the grid: hold the first value (fixed costs dominate)
            return math.exp(self.ly[0])
        if len(self.lx) == 1:  # one point: proportional above it
            return math.exp(self.ly[0] + lx - self.lx[0])
        i = _segment(self.lx, lx)
        x0, x1, y0, y1 = self.lx[i], self.lx[i + 1], self.ly[i], self.ly[i + 1]
        return math.exp(y0 + (y1 - y0) * (lx - x0) / (x1 - x0))


class Grid2D:
    """Bilinear interpolation in (log batch, log length) of log seconds on a full grid."""

    def __init__(self, batches: list[float], lengths: list[float], table: list[list[float]]):
        self.lb = [math.log(b) for b in batches]
        self.ll = [math.log(s) for s in lengths]
        self.lt = [[math.log(t) for t in row] for row in table]

    @classmethod
    def from_points(cls, points: list[tuple[float, float, float]]) -> "Grid2D":
        batches = sorted({float(b) for b, _, _ in points})
        lengths = sorted({float(s) for _, s, _ in points})
        cell = {(float(b), float(s)): t for b, s, t in points}
        missing = [(b, s) for b in batches for s in lengths if (b, s) not in cell]
        if missing:
            raise ConfigError(f"the grid is not complete: no point at batch {missing[0][0]:g}, "
                              f"length {missing[0][1]:g}")
        table = [[cell[(b, s)] for s in lengths] for b in batches]
        # monotone: cumulative minima from the large end along both axes. Timing noise on a
        # busy machine is mostly upward spikes, and a spike at a small size must not raise
        # every larger one (as a cumulative maximum from the small end would).
        nb, nl = len(batches), len(lengths)
        for i in reversed(range(nb)):
            for j in reversed(range(nl)):
                table[i][j] = min(table[i][j], table[i + 1][j] if i + 1 < nb else math.inf,
                                  table[i][j + 1] if j + 1 < nl else math.inf)
        return cls(batches, lengths, table)

    def _axis(self, axis: list[float], v: float) -> tuple[int, float]:
        if len(axis) == 1:
            return 0, 0.0
        i = _segment(axis, v)
        w = (v - axis[i]) / (axis[i + 1] - axis[i])
        return i, max(w, 0.0)  # below the grid: hold the first value (fixed costs dominate)

    def __call__(self, batch: float, length: float) -> float:
        i, u = self._axis(self.lb, math.log(max(batch, 1e-12)))
        j, v = self._axis(self.ll, math.log(max(length, 1e-12)))
        t = self.lt
        i1 = min(i + 1, len(self.lb) - 1)
        j1 = min(j + 1, len(self.ll) - 1)
        a = t[i][j] + (t[i][j1] - t[i][j]) * v
        b = t[i1][j] + (t[i1][j1] - t[i1][j]) * v
        return math.exp(a + (b - a) * u)


# -- files ------------------------------------------------------------------------------------------------
def profile_from_document(data: dict, source: str = "") -> Profile:
    if data.get("schema") != PROFILE_SCHEMA:
        raise ConfigError(f"expected schema {PROFILE_SCHEMA}, got {data.get('schema')!r}", "schema", source)
    try:
        return validate_model(Profile, {k: v for k, v in data.items() if k != "schema"})
    except ConfigError as e:
        raise e.in_file(source) from None


def load_profile(path: str) -> Profile:
    return profile_from_document(read_document(path), path)


def check_profile_device(profile: Profile, cluster, source: str = "", force: bool = False) -> None:
    """Refuse a profile measured on another kind of device than the scenario's, unless forced."""
    if force or profile.device.preset == cluster.device.name:
        return
    raise ConfigError(f"was measured on {profile.device.preset} ({profile.device.name}), but the scenario's "
                      f"devices are {cluster.device.name}; pass --force-profile to use it anyway",
                      "--profile", source)


def this_machine(device: str, processes: int, threads: int) -> DeviceInfo:
    """The identity of the device a profile is being made on."""
    if device == "cuda":
        import torch

        from realbench.hardware import DATASHEETS

        name = torch.cuda.get_device_name(0)  # "NVIDIA H100 80GB HBM3": the preset whose name it holds
        preset = next((p for p in DATASHEETS if p.upper() in name), name.lower().replace(" ", "-"))
        return DeviceInfo(kind="cuda", name=name, preset=preset, processes=processes, threads_per_process=threads,
                          cores=usable_cores())
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return DeviceInfo(kind="cpu", name=name, preset="cpu", processes=processes, threads_per_process=threads,
                      cores=usable_cores())


def shares_cores(kind: str, processes: int, cores: int | None = None) -> bool:
    """Whether `processes` processes of a device of `kind` outnumber the cores (`cores`, or this
    machine's usable ones): a CPU whose processes then compete for cores, so a call's time
    depends on how many are busy beside it (measured alone and crowded; see the simulator)."""
    cores = usable_cores() if cores is None else cores
    return kind == "cpu" and 0 < cores < processes


def usable_cores() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))  # what this process may use (containers limit it)
    except AttributeError:
        return os.cpu_count() or 1
