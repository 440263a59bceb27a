"""How far to trust the GPU presets (`realbench bench fidelity --json`).

The rows of realbench/hardware/published.yaml are published measurements, each with its source
and a configuration realbench can express: training throughput under (tp, pp, dp, micro-batch)
on A100 and H100, generation throughput and first-token latency per batch and tp, and
nccl-tests bus bandwidths over message sizes inside a node and across nodes. Each row is
predicted with the cost model's own functions (realbench.cost.calls.call_cost for a train or
generate call on the row's mesh, realbench.cost.comm for a collective) on the presets built from
the datasheets and a set of free parameters (realbench.hardware.FITTED):

    matmul efficiency (one for both GPUs) and the rows at which a matmul reaches half of it,
    HBM efficiency, a kernel overhead per layer, NVLink efficiency (per GPU), NIC efficiency,
    and the NVLink and NIC latencies; and one host thread's CPU Adam rate (parameters a second:
    DeepSpeed's ZeRO-Offload step, realbench.cost.sharding).

`fit` finds them by least squares on log(predicted / published) over the fit rows (rows 0, 2,
4, ... of each kind, never a `reserved` source's); the errors reported are predicted / published
- 1 per row, with the median and the worst of |error| per kind on the held-out rows (rows 1, 3,
5, ...), on the fit rows, on the reserved rows (Megatron-LM SC21 Table 1, the independent
check), and on the rows of sources marked `excluded` (a network the presets do not describe,
with the reason in the data file). Target: a held-out median of at most 20% per kind.

`engine_steps`: published per-call times of an RLHF engine's step (its own timers) beside
`realbench estimate` of the run's job and plan as realbench writes them (`engine_step_documents`):
per realbench call, the engine's timers it covers, published and predicted; calls realbench
cannot price as the run ran them are listed with the reason, not compared. Never fitted.
"""

from __future__ import annotations

import math
import statistics
from functools import lru_cache
from pathlib import Path
from typing import Literal, Optional, Union

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from realbench.hardware import FITTED, ClusterSpec, gpu_device, gpu_links

DATA = Path(__file__).resolve().parent.parent / "hardware" / "published.yaml"
KINDS = ("train", "decode", "collective", "host_adam")
TARGET_MEDIAN_ERROR = 0.20
GPUS_PER_NODE = 8
# issue 71's goal for engines' published whole steps: each within 15%, their median within 8%
ENGINE_STEP_TARGET = 0.15
ENGINE_STEP_MEDIAN_TARGET = 0.08

# (name, lower bound, upper bound) of each free parameter. NVLink efficiency may pass 1: NVLink
# SHARP (NVLS) reduces inside the switch, so fewer bytes cross a link than the ring formula counts.
PARAMETERS = (
    ("matmul_efficiency", 0.2, 1.0),
    ("mem_bw_efficiency", 0.3, 1.0),
    ("half_efficiency_rows", 1.0, 4096.0),
    ("kernel_overhead_s", 1e-9, 2e-4),
    ("a100.nvlink_efficiency", 0.3, 1.5),
    ("h100.nvlink_efficiency", 0.3, 1.5),
    ("nic_efficiency", 0.3, 1.5),
    ("intra_latency_s", 1e-7, 2e-4),
    ("inter_latency_s", 1e-7, 5e-4),
    ("host_adam_rate", 1e6, 1e10),
)


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    source: str

    def _one_of(self, *names: str) -> None:
        """A row publishes exactly one of these numbers."""
        if sum(getattr(self, n) is not None for n in names) != 1:
            raise ValueError(f"give one of {' and '.join(names)}")


class TrainRow(_Row):
    device: Literal["a100", "h100"]
    model: str
    gpus: int = Field(gt=0)
    tp: int = Field(gt=0)
    pp: int = Field(gt=0)
    micro_batch: int = Field(gt=0)
    global_batch: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    checkpointing: bool
    virtual_stages: int = Field(default=1, gt=0)  # the interleaved schedule's, where the source used it
    tokens_per_s_per_gpu: Optional[float] = Field(default=None, gt=0)
    tflops_per_gpu: Optional[float] = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> "TrainRow":
        self._one_of("tokens_per_s_per_gpu", "tflops_per_gpu")
        if self.gpus % (self.tp * self.pp) or (self.global_batch % (self.dp * self.micro_batch)):
            raise ValueError("gpus must be a multiple of tp*pp and global_batch of dp*micro_batch")
        return self

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)


class DecodeRow(_Row):
    device: Literal["a100", "h100"]
    model: str
    tp: int = Field(gt=0)
    batch: int = Field(gt=0)
    input: int = Field(gt=0)
    output: int = Field(default=1, gt=0)
    out_tokens_per_s: Optional[float] = Field(default=None, gt=0)
    first_token_ms: Optional[float] = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> "DecodeRow":
        self._one_of("out_tokens_per_s", "first_token_ms")
        return self


class CollectiveRow(_Row):
    op: Literal["all_reduce", "all_gather", "p2p"]
    link: Literal["a100", "h100"]
    gpus: int = Field(gt=1)
    gpus_per_node: int = Field(gt=0)
    nic_gbps: float = Field(default=0.0, ge=0)
    bytes: int = Field(gt=0)
    busbw_GBps: float = Field(gt=0)


class HostAdamRow(_Row):
    """One step of DeepSpeed's CPU Adam over `params` fp32 parameters on `threads` host threads, in
    seconds."""
    threads: int = Field(gt=0)
    params: float = Field(gt=0)
    seconds: float = Field(gt=0)


class Source(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    cite: str
    reserved: bool = False  # the independent check: predicted and reported, never fitted
    excluded: str = ""  # why the cost model does not describe these rows: reported apart, never fitted
    attention: Literal["flash", "materialized"] = "flash"  # how the source's engine computes attention


class GptShape(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    layers: int
    hidden: int
    heads: int
    gelu_ffn: int
    vocab: int


class EngineStep(_Row):
    """One engine's published step: the run's job and plan as realbench documents (its reward
    function named by file, written as a stub: the engine's, not called), the engine's timers
    (seconds), which timers each realbench call covers, the timer of the whole step (`step`, where
    published), and the calls not compared (why). Rows of one `group` (a published table of one
    job's settings) predict each other (`engine_step_predictions`)."""
    engine: Literal["verl", "openrlhf", "areal", "nemo-rl"]
    label: str = ""
    group: str = ""
    scenario: dict
    plan: dict
    published_s: dict[str, float]
    compared: dict[str, list[str]]
    step: str = ""
    not_compared: dict[str, str] = {}

    @model_validator(mode="after")
    def _check(self) -> "EngineStep":
        for call, timers in self.compared.items():
            missing = [t for t in timers if t not in self.published_s]
            if missing:
                raise ValueError(f"compared.{call}: no published timer {missing[0]!r}")
        if self.step and self.step not in self.published_s:
            raise ValueError(f"step: no published timer {self.step!r}")
        if not self.compared and not self.step:
            raise ValueError("compare some calls or the whole step")
        return self

    def published_call_s(self, call: str) -> float:
        """The seconds published for a compared call: the sum of the timers it covers."""
        return sum(self.published_s[t] for t in self.compared[call])


class Published(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    sources: dict[str, Source]
    models: dict[str, GptShape]
    train: list[TrainRow]
    decode: list[DecodeRow]
    collective: list[CollectiveRow]
    host_adam: list[HostAdamRow] = []
    engine_steps: list[EngineStep] = []

    @model_validator(mode="after")
    def _check(self) -> "Published":
        for kind in (*KINDS, "engine_steps"):
            for i, row in enumerate(getattr(self, kind)):
                if row.source not in self.sources:
                    raise ValueError(f"{kind}[{i}]: unknown source {row.source!r}")
        return self

    def rows(self) -> list[tuple[str, int, Union[TrainRow, DecodeRow, CollectiveRow]]]:
        return [(kind, i, row) for kind in KINDS for i, row in enumerate(getattr(self, kind))]

    def role(self, kind: str, row) -> str:
        """fit, held-out, reserved or excluded (see the module doc)."""
        source = self.sources[row.source]
        if source.reserved or source.excluded:
            return "reserved" if source.reserved else "excluded"
        free = [r for r in getattr(self, kind) if not (self.sources[r.source].reserved or self.sources[r.source].excluded)]
        return "fit" if free.index(row) % 2 == 0 else "held-out"


def load_published(path: Union[str, Path] = DATA) -> Published:
    from realbench.schema import validate_model

    with open(path) as f:
        return validate_model(Published, yaml.safe_load(f))


# -- predictions ----------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _spec(name: str, shape: Optional[GptShape]):
    from realbench.models import ModelSpec, get_model

    if shape is None:
        return get_model(name)
    # GeLU MLP of two h x f matrices = a gated MLP of three h x (2f/3) ones, in parameters and FLOPs
    return ModelSpec(name=name, n_layers=shape.layers, hidden=shape.hidden, n_heads=shape.heads,
                     n_kv_heads=shape.heads, ffn=round(2 * shape.gelu_ffn / 3), vocab=shape.vocab)


def _cluster(device: str, gpus: int, fit: dict, gpus_per_node: int = GPUS_PER_NODE, nic_gbps: float = 0.0,
             attention: str = "flash"):
    nodes = max(1, math.ceil(gpus / gpus_per_node))
    return ClusterSpec(nodes=nodes, gpus_per_node=gpus_per_node, device=gpu_device(device, fit),
                       attention=attention, **gpu_links(device, fit, nic=nic_gbps * 1e9 / 8))


def _option(gpus: int, dp: int, tp: int, pp: int, micro_batches: int, checkpointing: bool = False,
            virtual_stages: int = 1):
    from realbench.plan.mesh import Mesh, Option, Strategy

    nodes = max(1, gpus // GPUS_PER_NODE)
    mesh = Mesh(node=0, nodes=nodes, gpu=0, gpus=GPUS_PER_NODE if nodes > 1 else gpus)
    return Option(mesh, Strategy(dp=dp, tp=tp, pp=pp, micro_batches=micro_batches, checkpointing=checkpointing,
                                 virtual_stages=virtual_stages))


def published_value(data: Published, kind: str, row) -> float:
    """The row's published number in the unit predict() returns (tokens/s per GPU for training)."""
    if kind == "train":
        if row.tokens_per_s_per_gpu is not None:
            return row.tokens_per_s_per_gpu
        spec = _spec(row.model, data.models.get(row.model))
        s, l, h, v = row.seq_len, spec.n_layers, spec.hidden, spec.vocab
        if row.source == "megatron-sc21":  # Megatron's count, recomputation included (SC21 eq. 3)
            per_token = 96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
        else:  # 6 N + 12 l h s per token (PaLM's model FLOPs)
            per_token = 6 * spec.n_params + 12 * l * h * s
        return row.tflops_per_gpu * 1e12 / per_token
    if kind == "decode":
        return row.out_tokens_per_s if row.out_tokens_per_s is not None else row.first_token_ms
    if kind == "host_adam":
        return row.seconds
    return row.busbw_GBps


def predict(data: Published, kind: str, row, fit: dict = FITTED) -> float:
    """The cost model's prediction of a row, in the unit of published_value()."""
    from realbench.cost import comm, sharding
    from realbench.cost.calls import call_cost
    from realbench.dataflow import CallDef, CallKind

    if kind == "train":
        spec = _spec(row.model, data.models.get(row.model))
        cluster = _cluster(row.device, row.gpus, fit, attention=data.sources[row.source].attention)
        m = row.global_batch // (row.dp * row.micro_batch)
        call = CallDef(name="train", model="m", kind=CallKind.TRAIN, seqs=row.global_batch, seq_len=row.seq_len)
        option = _option(row.gpus, row.dp, row.tp, row.pp, m, row.checkpointing, row.virtual_stages)
        t = call_cost(call, spec, cluster, option).time_s
        return row.global_batch * row.seq_len / (t * row.gpus)
    if kind == "decode":
        spec = _spec(row.model, data.models.get(row.model))
        cluster = _cluster(row.device, row.tp, fit, attention=data.sources[row.source].attention)
        out = row.output if row.out_tokens_per_s is not None else 1
        call = CallDef(name="generate", model="m", kind=CallKind.GENERATE, seqs=row.batch,
                       seq_len=row.input + out, gen_len=out)
        t = call_cost(call, spec, cluster, _option(row.tp, 1, row.tp, 1, 1)).time_s
        return row.batch * out / t if row.out_tokens_per_s is not None else t * 1e3
    if kind == "host_adam":  # each thread at the fitted rate
        return sharding.host_adam_seconds(row.params, fit["host_adam_rate"], threads=row.threads)
    cluster = _cluster(row.link, row.gpus, fit, row.gpus_per_node, row.nic_gbps)
    n, size, spans = row.gpus, row.bytes, row.gpus > row.gpus_per_node
    if row.op == "all_reduce":  # nccl-tests' bus bandwidth: algbw * 2 (n-1)/n
        return size / comm.all_reduce(cluster, n, size, spans, row.gpus_per_node) * 2 * (n - 1) / n / 1e9
    if row.op == "all_gather":  # algbw * (n-1)/n
        return size / comm.all_gather(cluster, n, size, spans, row.gpus_per_node) * (n - 1) / n / 1e9
    return size / comm.p2p(cluster, size, spans) / 1e9


# -- the fit ----------------------------------------------------------------------------------------------
def fit(data: Published, start: dict = FITTED) -> dict[str, float]:
    """The free parameters that minimize the squared log errors of the fit rows."""
    from scipy.optimize import least_squares

    rows = [(kind, row) for kind, _, row in data.rows() if data.role(kind, row) == "fit"]
    targets = np.log([published_value(data, kind, row) for kind, row in rows])
    names = [name for name, _, _ in PARAMETERS]
    lo = np.array([lo for _, lo, _ in PARAMETERS])
    hi = np.array([hi for _, _, hi in PARAMETERS])
    # optimize in log space (the parameters span decades: latencies, row counts)
    x0 = np.log(np.clip([start[n] for n in names], lo * 1.0001, hi * 0.9999))

    def residuals(x):
        params = {**start, **dict(zip(names, np.exp(x)))}
        return np.log([predict(data, kind, row, params) for kind, row in rows]) - targets

    result = least_squares(residuals, x0, bounds=(np.log(lo), np.log(hi)), x_scale=1.0, xtol=1e-12, ftol=1e-12,
                           gtol=1e-12, max_nfev=2000)
    return {**start, **{n: float(v) for n, v in zip(names, np.exp(result.x))}}


def report(data: Published, params: dict) -> dict:
    rows, summary = [], {}
    for kind, i, row in data.rows():
        published = published_value(data, kind, row)
        predicted = predict(data, kind, row, params)
        rows.append({"kind": kind, "index": i, "role": data.role(kind, row), "source": row.source,
                     "config": row.model_dump(exclude={"source"}), "published": published,
                     "predicted": predicted, "error": predicted / published - 1})
    for kind in KINDS:
        summary[kind] = {}
        for role in ("held-out", "fit", "reserved", "excluded"):
            errors = [abs(r["error"]) for r in rows if r["kind"] == kind and r["role"] == role]
            if errors:
                summary[kind][role] = {"rows": len(errors), "median_error": statistics.median(errors),
                                       "worst_error": max(errors)}
    return {"rows": rows, "summary": summary}


def sc21_documents(data: Published, row) -> tuple[dict, dict]:
    """A reserved SC21 row as what a user writes: a scenario (SFT of the row's GPT shape on its
    A100 nodes, whose engine materializes the attention scores, the global batch per step) and
    a plan (the row's tp and pp, dp over the rest, the published micro-batch size as
    micro-batches per replica, full recomputation, the row's virtual pipeline stages)."""
    spec = _spec(row.model, data.models.get(row.model))
    nodes = max(1, math.ceil(row.gpus / GPUS_PER_NODE))
    scenario = {"schema": "realbench.scenario/1", "name": f"sc21-{row.model}", "algorithm": "sft",
                "cluster": {"nodes": nodes, "gpus_per_node": min(row.gpus, GPUS_PER_NODE), "device": row.device,
                            "attention": data.sources[row.source].attention},
                "models": {"actor": spec.model_dump(include={"name", "n_layers", "hidden", "n_heads", "n_kv_heads",
                                                             "ffn", "vocab"})},
                "dataflow": {"algorithm": "sft", "seqs": row.global_batch, "seq_len": row.seq_len}}
    mesh = f"n0-{nodes - 1}" if nodes > 1 else "n0"
    plan = {"schema": "realbench.plan/1", "scenario": scenario["name"],
            "calls": {"actor_train": {"mesh": mesh, "dp": row.dp, "tp": row.tp, "pp": row.pp,
                                      "micro_batches": row.global_batch // (row.dp * row.micro_batch),
                                      "activation_checkpointing": row.checkpointing,
                                      **({"virtual_stages": row.virtual_stages} if row.virtual_stages > 1 else {})}}}
    return scenario, plan


def sc21_through_estimate(data: Published) -> dict:
    """Every SC21 row written as scenario and plan files and estimated by `realbench estimate
    --json` (the command a user runs), against the published throughput."""
    import contextlib
    import io
    import json
    import tempfile

    from realbench.cli import main

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for row in data.train:
            if row.source != "megatron-sc21":
                continue
            scenario, plan = sc21_documents(data, row)
            paths = [Path(folder) / f"{row.model}-{what}.yaml" for what in ("scenario", "plan")]
            for path, doc in zip(paths, (scenario, plan)):
                path.write_text(yaml.safe_dump(doc, sort_keys=False))
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = main(["estimate", "--scenario", str(paths[0]), "--plan", str(paths[1]), "--json"])
            if code != 0:
                raise RuntimeError(f"realbench estimate refused the SC21 row of {row.model} (exit {code})")
            estimate = json.loads(out.getvalue())
            predicted = row.global_batch * row.seq_len / (estimate["time_per_iter_s"] * row.gpus)
            published = published_value(data, "train", row)
            rows.append({"model": row.model, "gpus": row.gpus, "tp": row.tp, "pp": row.pp,
                         "micro_batches": plan["calls"]["actor_train"]["micro_batches"],
                         "virtual_stages": row.virtual_stages,
                         "time_per_iter_s": estimate["time_per_iter_s"], "fits": not estimate["oom"],
                         "published_tflops_per_gpu": row.tflops_per_gpu,
                         "predicted_tflops_per_gpu": row.tflops_per_gpu * predicted / published,
                         "error": predicted / published - 1})
    errors = [abs(r["error"]) for r in rows]
    return {"rows": rows, "median_error": statistics.median(errors), "worst_error": max(errors)}


def _step_files(row: EngineStep, folder: Path) -> tuple[Path, Path]:
    """The row's job and plan as files in `folder` (and a stub of its reward function)."""
    for model in row.scenario["models"].values():
        if not isinstance(model, dict):
            continue
        for f in model.get("functions", [model["function"]] if "function" in model else []):
            (folder / f.rpartition(":")[0]).write_text(f"def {f.rpartition(':')[2]}(*args, **kwargs):\n"
                                                        "    return 0.0\n")
    scenario_path, plan_path = folder / "job.yaml", folder / "job-plan.yaml"
    scenario_path.write_text(yaml.safe_dump({"schema": "realbench.scenario/1", **row.scenario}))
    plan_path.write_text(yaml.safe_dump({"schema": "realbench.plan/1", "scenario": "job.yaml", **row.plan}))
    return scenario_path, plan_path


def engine_steps_through_estimate(data: Published) -> list[dict]:
    """Every published engine step: its job and plan written as files (and a stub of its reward
    function) and estimated by `realbench estimate --json`, per call against the engine's timers
    and, where the whole step is published, the step."""
    import contextlib
    import io
    import json
    import tempfile

    from realbench.cli import main

    out = []
    for row in data.engine_steps:
        with tempfile.TemporaryDirectory() as folder:
            scenario_path, plan_path = _step_files(row, Path(folder))
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                code = main(["estimate", "--scenario", str(scenario_path), "--plan", str(plan_path), "--json"])
            if code != 0:
                raise RuntimeError(f"realbench estimate refused the {row.source} step (exit {code})")
            estimate = json.loads(text.getvalue())
        calls = []
        for call, timers in row.compared.items():
            published = row.published_call_s(call)
            predicted = estimate["calls"][call]["time_s"]
            calls.append({"call": call, "timers": timers, "published_s": published, "predicted_s": predicted,
                          "error": predicted / published - 1})
        step = row.published_s[row.step] if row.step else None
        out.append({"source": row.source, "engine": row.engine, "label": row.label, "group": row.group,
                    "calls": calls, "not_compared": row.not_compared,
                    "predicted_step_s": estimate["time_per_iter_s"], "published_step_s": step,
                    "step_error": estimate["time_per_iter_s"] / step - 1 if step else None,
                    "fits": not estimate["oom"],
                    "median_error": statistics.median(abs(c["error"]) for c in calls) if calls else None})
    return out


# one factor k on both the matmul and the HBM efficiency (the engine's speed against the presets'), fitted
# to one published whole step; its physical range keeps both efficiencies at most 1
SCALE_LOW = 0.02


def _jobs(data: Published) -> dict[int, tuple]:
    """Each published engine step's (row, scenario, plan's options), read from the files a user
    would write (`_step_files`)."""
    import tempfile

    from realbench.plan import load_plan, load_scenario

    jobs = {}
    with tempfile.TemporaryDirectory() as root:
        for i, row in enumerate(data.engine_steps):
            folder = Path(root) / str(i)
            folder.mkdir()
            scenario_path, plan_path = _step_files(row, folder)
            scenario = load_scenario(str(scenario_path))
            jobs[i] = (row, scenario, load_plan(str(plan_path), scenario)[2])
    return jobs


def _priced_at(job: tuple, k_matmul: float, k_decode: float) -> dict[str, float]:
    """A job's compared calls and whole step (`step`) priced with the device's matmul efficiency
    times k_matmul and its HBM efficiency times k_decode."""
    from realbench.calibrate.fit import Phase, factors_of, priced, with_factors

    row, scenario, options = job
    f = factors_of(scenario)
    scaled = {**f, "matmul_efficiency": f["matmul_efficiency"] * k_matmul,
              "mem_bw_efficiency": f["mem_bw_efficiency"] * k_decode}
    phases = [Phase(c, (), (c,)) for c in row.compared] + [Phase("step", (), (), "step")]
    return priced(with_factors(scenario, scaled), options, phases)


def engine_fit(data: Published) -> dict:
    """The RL engines' speed against the presets, as two factors: k_matmul on the matmul efficiency
    and k_decode on the HBM efficiency, fitted (least squares on log(estimated / published)) to the
    calls the engines publish one by one (verl's timers: play-verl's and RLinf's runs), and checked
    on every published whole step, none of which is fitted. What the factors stand for: the engines'
    own work beside the presets' kernels (fitted to Megatron's pre-training and TensorRT-LLM's
    serving): eager decoding, the rollout's sampling and scheduling, Hugging Face modelling code."""
    import numpy as np
    from scipy.optimize import least_squares

    jobs = _jobs(data)
    fitted = [i for i, (row, _, _) in jobs.items() if row.compared]
    checked = [i for i, (row, _, _) in jobs.items() if row.step]

    def residuals(x):
        k = np.exp(x)
        out = []
        for i in fitted:
            at = _priced_at(jobs[i], *k)
            out += [np.log(at[c] / jobs[i][0].published_call_s(c)) for c in jobs[i][0].compared]
        return out

    k_matmul, k_decode = np.exp(least_squares(residuals, [0.0, 0.0], xtol=1e-10, ftol=1e-10).x)
    calls, steps = [], []
    for i in fitted:
        row = jobs[i][0]
        at = _priced_at(jobs[i], k_matmul, k_decode)
        calls += [{"row": row.label, "source": row.source, "call": c, "published_s": row.published_call_s(c),
                   "estimated_s": at[c], "error": at[c] / row.published_call_s(c) - 1} for c in row.compared]
    for i in checked:
        row = jobs[i][0]
        at = _priced_at(jobs[i], k_matmul, k_decode)["step"]
        steps.append({"row": row.label, "source": row.source, "published_s": row.published_s[row.step],
                      "estimated_s": at, "error": at / row.published_s[row.step] - 1})
    errors = [abs(s["error"]) for s in steps]
    return {"k_matmul": float(k_matmul), "k_decode": float(k_decode), "fitted_calls": calls, "checked_steps": steps,
            "checked_median_error": statistics.median(errors), "checked_worst_error": max(errors)}


def engine_step_predictions(data: Published) -> dict:
    """Prediction, not only fit: per group of published whole steps (one job's table: other GPU
    counts, layouts, synchronous against asynchronous), each row in turn calibrates one factor k
    (both device efficiencies times k, so that its estimated step is the published one), and the
    other rows of the group are predicted with it; the errors, and per group their median and worst."""
    from scipy.optimize import brentq

    jobs = _jobs(data)
    groups = {}
    for i, (row, _, _) in jobs.items():
        if row.group and row.step:
            groups.setdefault(row.group, []).append(i)

    def at(i: int, k: float) -> float:
        return _priced_at(jobs[i], k, k)["step"]

    out = {}
    for group, members in groups.items():
        rows = []
        for ref in members:
            row, scenario, _ = jobs[ref]
            d = scenario.cluster.device
            high = 1.0 / max(d.matmul_efficiency, d.mem_bw_efficiency)
            published = row.published_s[row.step]
            if not (at(ref, SCALE_LOW) >= published >= at(ref, high)):
                rows.append({"fit_on": row.label, "k": None, "predicted": []})
                continue
            k = brentq(lambda x: at(ref, x) - published, SCALE_LOW, high, xtol=1e-6)
            predicted = []
            for other in members:
                if other == ref:
                    continue
                o = jobs[other][0]
                p = at(other, k)
                predicted.append({"row": o.label, "published_s": o.published_s[o.step], "predicted_s": p,
                                  "error": p / o.published_s[o.step] - 1})
            rows.append({"fit_on": row.label, "k": k, "predicted": predicted})
        errors = [abs(p["error"]) for r in rows for p in r["predicted"]]
        out[group] = {"rows": rows, "median_error": statistics.median(errors) if errors else None,
                      "worst_error": max(errors) if errors else None}
    return out


def run(path: Optional[str] = None, refit: bool = True) -> dict:
    data = load_published(path or DATA)
    params = fit(data) if refit else dict(FITTED)
    result = report(data, params)
    held = {k: v["held-out"]["median_error"] for k, v in result["summary"].items() if "held-out" in v}
    return {
        "data": str(path or DATA.name),
        "rows": len(result["rows"]), "sources": {k: s.cite for k, s in data.sources.items()},
        "reserved_sources": sorted(k for k, s in data.sources.items() if s.reserved),
        "fitted": params, "presets": dict(FITTED),
        "presets_match_fit": all(math.isclose(params[k], FITTED[k], rel_tol=1e-3) for k in FITTED),
        "summary": result["summary"],
        "target_median_error": TARGET_MEDIAN_ERROR,
        "meets_target": all(v <= TARGET_MEDIAN_ERROR for v in held.values()),
        "predictions": result["rows"],
        "sc21_through_estimate": sc21_through_estimate(data),
        "engine_steps": engine_steps_through_estimate(data),
        "engine_step_predictions": engine_step_predictions(data),
        "engine_fit": engine_fit(data),
        "engine_step_target": {"whole_step_error": ENGINE_STEP_TARGET, "median_error": ENGINE_STEP_MEDIAN_TARGET},
    }
