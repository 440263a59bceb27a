"""Calibration: the device factors that make a plan's estimate agree with the run's own log.

An engine's timers cover phases of realbench's dataflow (`engine_phases`): verl's
`timing_s/gen` is the actor's generate call, `timing_s/old_log_prob` + `timing_s/update_actor`
its train call (realbench prices the old log-probabilities' forward in it),
`timing_s/update_weights` the weight sync before the next generation (the reallocation of
the actor's weights into the generate call's layout), `timing_s/step` the whole step. The
measured seconds of a phase are the median over the logged steps after the warm-up ones.

The factors of the device preset, each fitted only where a logged phase depends on it:

    matmul_efficiency    the fraction of the dense bf16 peak that large matmuls reach (training
                         MFU; the forwards of inference calls and of generation's prefill too:
                         realbench's cost model has one matmul efficiency)   <- train, inference
    mem_bw_efficiency    the fraction of the HBM bandwidth that decoding reaches  <- generation
    link_scale           a factor on the links' bandwidths (NVLink and the NIC) <- weight sync
    link_latency_scale   a factor on the links' latencies (each collective's fixed cost: the tp
                         and pp exchanges of a small model)  <- calls with such collectives

and, on a device without a datasheet (the CPU processes of realbench's own runs, whose tiny
models' calls are bound by per-layer overheads more than by arithmetic or memory),

    kernel_overhead_s    a fixed cost per layer of each forward and decode step  <- every call

by least squares on log(estimated / measured) over the phases other than the whole step
(scipy's bounded trust region, in log space), each call priced by realbench.cost with the
factors set. "Depends on it": doubling the factor from the preset moves a phase's price by 5%
or more (SENSITIVITY); a factor without a physical limit that the fit runs to a bound of its
search is one the log cannot tell apart from the others (on CPU processes, decoding's memory
bandwidth beside the per-layer overhead): both keep the preset's value, and say why. So a log
of a plan without tp's collectives fits no latency, and estimates of plans with them stay at
the preset's: calibrate from a run whose plan has the exchanges of the plans to be estimated.

Then, where the log times the whole step,

    step_overhead_s      the engine's own seconds a step outside its calls (moving batches
                         between them, its controller): the median of the step's seconds beyond
                         its logged phases, less what the priced step holds beyond the same
                         phases (reallocations, calls the log does not time); never below zero

The whole step is the check: estimated before and after, beside the measured.

A factor the log drives past its physical range (an efficiency above 1; a link above the
datasheet's peak, or above the scenario's own bandwidth where that is higher: NVLink SHARP as
the presets fit it) is refused by name rather than written: such a log is not of this plan on
this device, or the phase is not what realbench prices.

Before fitting, the response lengths are set to the log's (verl's `response_length/mean`:
every response at that mean when the scenario has no distribution, its distribution rescaled to
that mean when it has one; realbench's own run: the lengths it generated), so that a length
unlike the scenario's is not mistaken for a faster or slower device.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from realbench.calibrate.logs import StepLog
from realbench.dataflow import CallKind
from realbench.errors import ConfigError
from realbench.hardware import DATASHEETS, LINK_FIELDS

FACTORS = ("matmul_efficiency", "mem_bw_efficiency", "link_scale", "link_latency_scale", "kernel_overhead_s",
           "step_overhead_s")
MEANING = {"matmul_efficiency": "training MFU: matmuls at this fraction of the bf16 peak",
           "mem_bw_efficiency": "decoding at this fraction of the HBM bandwidth",
           "link_scale": "the links' bandwidths times this",
           "link_latency_scale": "the links' latencies times this (each collective's fixed cost)",
           "kernel_overhead_s": "a fixed cost per layer of each forward and decode step",
           "step_overhead_s": "the engine's own seconds a step outside its calls"}
# a batch measured from the log's tokens may differ from the plan's by rounding of the means only
BATCH_TOLERANCE = 0.02


@dataclass(frozen=True)
class Phase:
    """A part of the step an engine times: the sum of its `timers`, against `part` ("time":
    the calls alone, "realloc": the weights moved into the call's layout, "step": the whole
    step's time) of realbench calls `calls` (summed)."""
    name: str
    timers: tuple[str, ...]
    calls: tuple[str, ...] = ()
    part: str = "time"


def _phase(name: str, timers, calls="", part: str = "time") -> Phase:
    return Phase(name, tuple(timers.split()), tuple(calls.split()), part)


# each engine's timers (the names its loggers write, TensorBoard's `train/` prefix of OpenRLHF
# taken off) against realbench's calls; the module doc says what each covers
ENGINE_PHASES = {
    "verl": [_phase("generation", "timing_s/gen", "actor_gen"),
             _phase("weight sync", "timing_s/update_weights", "actor_gen", "realloc"),
             _phase("reference", "timing_s/ref", "ref_inf"),
             _phase("values", "timing_s/values", "critic_inf"),
             _phase("actor update", "timing_s/old_log_prob timing_s/update_actor", "actor_train"),
             _phase("critic update", "timing_s/update_critic", "critic_train"),
             _phase("step", "timing_s/step", part="step")],
    # OpenRLHF times the experience (the reference's, the critic's and the reward model's
    # forwards, and the actor's old log-probabilities, which realbench prices in its train call)
    # and the training of actor and critic as one each
    "openrlhf": [_phase("generation", "timing/generation", "actor_gen"),
                 _phase("experience", "timing/make_experience", "ref_inf critic_inf reward_inf"),
                 _phase("training", "timing/ppo_train", "actor_train critic_train"),
                 _phase("weight sync", "timing/broadcast", "actor_gen", "realloc"),
                 _phase("step", "timing/step_total", part="step")],
    # AReaL times no whole step
    "areal": [_phase("generation", "timeperf/rollout", "actor_gen"),
              _phase("weight sync", "timeperf/update_weights", "actor_gen", "realloc"),
              _phase("reference", "timeperf/ref_logp", "ref_inf"),
              _phase("values", "timeperf/critic_values", "critic_inf"),
              _phase("actor update", "timeperf/recompute_logp timeperf/train_step", "actor_train"),
              _phase("critic update", "timeperf/critic_train_step", "critic_train")],
}


def engine_phases(engine: str, scenario) -> list[Phase]:
    """The phases of `engine`'s timers that the scenario's calls price."""
    names = scenario.dataflow.call_names
    if engine == "realbench":
        return [Phase(c, (f"timing_s/{c}",), (c,)) for c in scenario.dataflow.order] + \
            [Phase("step", ("seconds",), (), "step")]
    out = []
    for p in ENGINE_PHASES[engine]:
        calls = tuple(c for c in p.calls if c in names)
        if p.part == "step" or calls:
            out.append(Phase(p.name, p.timers, calls, p.part))
    return out


def factor_of(scenario, phase: Phase) -> Optional[str]:
    """The factor a phase identifies (None: the whole step, the check)."""
    if phase.part == "step":
        return None
    if phase.part == "realloc":
        return "link_scale"
    kinds = {scenario.dataflow.call(c).kind for c in phase.calls}
    return "mem_bw_efficiency" if kinds == {CallKind.GENERATE} else "matmul_efficiency"


# -- the device as factors ---------------------------------------------------------------------------------
def factors_of(scenario) -> dict[str, float]:
    d = scenario.cluster.device
    return {"matmul_efficiency": d.matmul_efficiency, "mem_bw_efficiency": d.mem_bw_efficiency, "link_scale": 1.0,
            "link_latency_scale": 1.0, "kernel_overhead_s": d.kernel_overhead_s, "step_overhead_s": d.step_overhead_s}


def limits_of(scenario) -> dict[str, Optional[float]]:
    """Each factor's physical upper bound (None: no datasheet to bound it: a device without one
    has nominal peaks, and an efficiency above 1 of them is folded into the peak, `folded`)."""
    c = scenario.cluster
    sheet = DATASHEETS.get(c.device.name)
    if sheet is None:
        return dict.fromkeys(FACTORS)
    peak = max(sheet["nvlink"], c.intra_bw) if c.nodes == 1 else max(sheet["nic"], c.inter_bw)
    return {"matmul_efficiency": 1.0, "mem_bw_efficiency": 1.0,
            "link_scale": peak / (c.intra_bw if c.nodes == 1 else c.inter_bw), "link_latency_scale": None,
            "kernel_overhead_s": None, "step_overhead_s": None}


def folded(scenario):
    """The scenario's device with an efficiency above 1 (of a device without a datasheet) moved
    into its peak: the same prices, a device DeviceSpec accepts."""
    d = scenario.cluster.device
    update = {}
    for eff, peak in (("matmul_efficiency", "flops"), ("mem_bw_efficiency", "mem_bw")):
        if getattr(d, eff) > 1:
            update.update({peak: getattr(d, peak) * getattr(d, eff), eff: 1.0})
    if not update:
        return scenario
    return scenario.model_copy(update={"cluster": scenario.cluster.model_copy(update={"device": d.model_copy(update=update)})})


def with_factors(scenario, values: dict[str, float]):
    """The scenario on its device with these factors."""
    c = scenario.cluster
    device = c.device.model_copy(update={k: values[k] for k in ("matmul_efficiency", "mem_bw_efficiency",
                                                                "kernel_overhead_s", "step_overhead_s")})
    k, a = values["link_scale"], values["link_latency_scale"]
    cluster = c.model_copy(update={"device": device, "intra_bw": c.intra_bw * k, "inter_bw": c.inter_bw * k,
                                   "intra_latency_s": c.intra_latency_s * a, "inter_latency_s": c.inter_latency_s * a})
    return scenario.model_copy(update={"cluster": cluster})


def priced(scenario, options: dict, phases: list[Phase]) -> dict[str, float]:
    """Each phase's estimated seconds under the analytic model (no profile: the device's factors)."""
    from realbench.cost import Estimator

    est = Estimator(scenario, profile=None, only={n: [o] for n, o in options.items()})
    result = est.estimate([0] * est.n)
    out = {}
    for p in phases:
        if p.part == "step":
            out[p.name] = result.time_per_iter_s
        else:
            out[p.name] = sum(getattr(result.calls[c], "realloc_s" if p.part == "realloc" else "time_s") for c in p.calls)
    return out


NOT_DEPENDED = "no logged phase depends on it: plans that do are estimated at the preset's value"
NOT_APART = "the log does not tell it apart from the other factors: it keeps the preset's value"
# a factor is fitted only where doubling it from the preset moves a fitted phase's price by this share or more
SENSITIVITY = 0.05


def _sensitivity(scenario, options: dict, phases: list[Phase], values: dict[str, float], name: str,
                 at: dict[str, float]) -> float:
    """The largest relative change of a phase's price when factor `name` doubles from `values`, the
    phases priced at `values` being `at`."""
    doubled = priced(with_factors(scenario, {**values, name: 2 * values[name]}), options, phases)
    return max(abs(doubled[p.name] / at[p.name] - 1) for p in phases)


def _least_squares(scenario, options: dict, phases: list[Phase], measured: dict, start: dict, limits: dict,
                   names: list[str]) -> tuple[dict[str, float], list[str]]:
    """The factors `names` that fit the phases' measured seconds (least squares in log space; the
    rest at `start`), and those of them the fit determined (below)."""
    from scipy.optimize import least_squares

    target = np.log([measured[p.name] for p in phases])
    # a fitted overhead starts off zero (the fit moves in log space); wide bounds, so that a log asking
    # for more than physics allows is seen (and refused by the caller)
    first = {n: max(start[n], 1e-7) if n == "kernel_overhead_s" else start[n] for n in names}
    lo = np.log([1e-3 * first[n] for n in names])
    hi = np.log([4.0 * (limits[n] or 1e3 * first[n]) for n in names])
    x0 = np.clip(np.log([first[n] for n in names]), lo + 1e-9, hi - 1e-9)

    def values(x) -> dict[str, float]:
        return {**start, **{n: float(v) for n, v in zip(names, np.exp(x))}}

    def residuals(x):
        at = priced(with_factors(scenario, values(x)), options, phases)
        return np.log([max(at[p.name], 1e-12) for p in phases]) - target

    result = least_squares(residuals, x0, bounds=(lo, hi), x_scale=1.0, xtol=1e-10, ftol=1e-10, max_nfev=200)
    # a factor without a physical limit that ends at a bound is one the phases cannot pin down (its
    # effect taken over by another): the caller fits the others without it
    free = [n for n, x, low, high in zip(names, result.x, lo, hi)
            if limits[n] is not None or low + 1e-6 < x < high - 1e-6]
    return values(result.x), free


# -- the log against the plan --------------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    engine: str
    log: str
    steps_used: tuple[int, ...]
    phases: list[dict]          # phase, timers, measured_s, before_s, after_s
    factors: dict[str, dict]    # name: before, after, fitted, limit, meaning
    checks: list[str]           # what was checked of the log against the plan
    device: dict = field(default_factory=dict)   # the calibrated DeviceSpec's fields
    links: dict = field(default_factory=dict)    # the calibrated cluster's links

    def to_json(self) -> dict:
        return {"engine": self.engine, "log": self.log, "steps_used": list(self.steps_used), "phases": self.phases,
                "factors": self.factors, "checks": self.checks, "device": self.device, "links": self.links}


def _median(steps: list[dict], timers: tuple[str, ...]) -> Optional[float]:
    rows = [sum(s[t] for t in timers if t in s) for s in steps if any(t in s for t in timers)]
    return statistics.median(rows) if rows else None


def _check_steps(log: StepLog, phases: list[Phase], steps: list[dict]) -> None:
    """A phase longer than the whole step contradicts the log's own timers."""
    step = next((p for p in phases if p.part == "step"), None)
    if step is None:
        return
    for s in steps:
        total = sum(s.get(t, 0.0) for t in step.timers)
        for p in phases:
            if p.part == "step" or not total:
                continue
            t = sum(s.get(x, 0.0) for x in p.timers)
            if t > total * 1.001:
                raise ConfigError(f"step {s['step']}: {' + '.join(x for x in p.timers if x in s)} = {t:.3f} s is "
                                  f"longer than the whole step ({step.timers[0]} = {total:.3f} s)", source=log.source)


def _name(text: str) -> str:
    return Path(text.rstrip("/")).name.lower()


def job_of(engine: str, step: dict) -> dict[str, float]:
    """What a logged step says of its job, where the engine logs it: `gpus`, `sequences` (a
    step's generated sequences) and `response_mean` (their mean length in tokens)."""
    out = {}
    if engine == "realbench" and "processes" in step:
        out["gpus"] = step["processes"]
    if engine == "verl":
        if all(k in step for k in ("perf/total_num_tokens", "perf/throughput", "perf/time_per_step")):
            # verl's throughput: tokens / (time * GPUs)
            out["gpus"] = step["perf/total_num_tokens"] / (step["perf/throughput"] * step["perf/time_per_step"])
        if all(k in step for k in ("perf/total_num_tokens", "prompt_length/mean", "response_length/mean")):
            out["sequences"] = step["perf/total_num_tokens"] / (step["prompt_length/mean"] + step["response_length/mean"])
        if "response_length/mean" in step:
            out["response_mean"] = step["response_length/mean"]
    if engine == "openrlhf":
        if "rollout/num_samples" in step:
            out["sequences"] = step["rollout/num_samples"]
        if "rollout/response_length_mean" in step:
            out["response_mean"] = step["rollout/response_length_mean"]
    if engine == "areal" and "ppo_actor/n_seqs" in step:
        out["sequences"] = step["ppo_actor/n_seqs"]
        if "ppo_actor/n_valid_tokens" in step:  # the loss mask: the response tokens
            out["response_mean"] = step["ppo_actor/n_valid_tokens"] / step["ppo_actor/n_seqs"]
    return out


WHERE = {"gpus": {"verl": "perf/total_num_tokens / perf/throughput / perf/time_per_step", "realbench": "processes"},
         "sequences": {"verl": "perf/total_num_tokens over the mean prompt and response lengths",
                       "openrlhf": "rollout/num_samples", "areal": "ppo_actor/n_seqs"}}


def _logged(engine: str, steps: list[dict], what: str) -> Optional[float]:
    values = [v[what] for v in (job_of(engine, s) for s in steps) if what in v]
    return statistics.median(values) if values else None


def check_log(engine: str, log: StepLog, scenario, options: dict, steps: list[dict]) -> list[str]:
    """Refuse a log of another job (GPU count, batch, model), naming what differs; what was
    checked, as lines."""
    from realbench.plan.mesh import devices_spanned

    checks = []
    gpus = devices_spanned(options, scenario.cluster.gpus_per_node) if engine == "realbench" else scenario.cluster.n_devices
    logged = _logged(engine, steps, "gpus")
    if logged is not None:
        if round(logged) != gpus:
            raise ConfigError(f"the log's run had {round(logged)} GPUs ({WHERE['gpus'][engine]}), the plan {gpus}: "
                              "not this plan's log", source=log.source)
        checks.append(f"GPUs: {round(logged)} ({WHERE['gpus'][engine]}), as the plan")
    gen = next((c for c in scenario.dataflow.calls if c.kind == CallKind.GENERATE), None)
    logged = _logged(engine, steps, "sequences")
    if gen is not None and logged is not None:
        if abs(logged / gen.seqs - 1) > BATCH_TOLERANCE:
            raise ConfigError(f"the log's steps generate {logged:.0f} sequences ({WHERE['sequences'][engine]}), "
                              f"the scenario's {gen.name} {gen.seqs}: not this job's log", source=log.source)
        checks.append(f"sequences a step: {logged:.0f} ({WHERE['sequences'][engine]}), as the scenario's {gen.seqs}")
    if log.model is not None and gen is not None:
        model = scenario.models[gen.model]
        if _name(log.model) != _name(model.name):
            raise ConfigError(f"the log's run trains {log.model!r}, the scenario's actor is {model.name!r}: "
                              "not this job's log", source=log.source)
        checks.append(f"model: {log.model}, as the scenario's {model.name}")
    return checks


def measured_lengths(engine: str, log: StepLog, scenario, steps: list[dict]):
    """The scenario with the log's response lengths (see the module doc), and a line saying so."""
    import json

    from realbench.dataflow.lengths import LengthDistribution

    gens = [c for c in scenario.dataflow.calls if c.kind == CallKind.GENERATE]
    if engine == "realbench":
        file = Path(log.source).parent / "lengths.jsonl"
        if not file.is_file():
            return scenario, None
        used = {s["step"] for s in steps}
        rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
        measured = {}
        for c in gens:
            lengths = [n for r in rows if r.get("step") in used for n in r.get(c.name, [])]
            if lengths:
                measured[c.name] = LengthDistribution.of(np.maximum(lengths, 1), c.gen_len)
        line = ", ".join(f"{n}: mean {d.expected:.1f} tokens" for n, d in measured.items())
        return scenario.with_lengths(measured), (f"response lengths from lengths.jsonl ({line})" if measured else None)
    mean = _logged(engine, steps, "response_mean")
    if mean is None or len(gens) != 1:
        return scenario, None
    c = gens[0]
    if mean > c.gen_len:
        raise ConfigError(f"the log's responses average {mean:.0f} tokens, above the scenario's cap of {c.gen_len}: "
                          "not this job's log", source=log.source)
    d = c.lengths
    if d is None or d.dist == "fixed":
        dist = LengthDistribution(dist="empirical", max=c.gen_len, lengths=(max(1, round(mean)),), counts=(1,))
    elif d.dist == "lognormal":
        dist = d.model_copy(update={"mean": mean})
    else:  # empirical: its lengths scaled to the mean, within the cap
        k = mean / d.expected
        dist = LengthDistribution(dist="empirical", max=d.max, lengths=tuple(min(d.max, max(1, round(x * k))) for x in d.lengths),
                                  counts=d.counts, memory_at=d.memory_at)
    return scenario.with_lengths({c.name: dist}), f"response lengths: mean {mean:.1f} tokens, as logged"


def calibrate(engine: str, log: StepLog, scenario, options: dict, skip: int = 1) -> Calibration:
    """Fit the device factors to the log (see the module doc)."""
    phases = engine_phases(engine, scenario)
    timers = {t for p in phases for t in p.timers}
    steps = sorted((s for s in log.steps if timers & set(s)), key=lambda s: s["step"])
    if not steps:
        raise ConfigError(f"no timing lines of {engine} ({', '.join(sorted(timers))})", source=log.source)
    if skip >= len(steps):
        raise ConfigError(f"the log has {len(steps)} timed step(s): skipping {skip} as warm-up leaves none", "--skip")
    steps = steps[skip:]
    _check_steps(log, phases, steps)
    checks = check_log(engine, log, scenario, options, steps)
    scenario, lengths = measured_lengths(engine, log, scenario, steps)
    if lengths:
        checks.append(lengths)
    measured = {p.name: _median(steps, p.timers) for p in phases}
    logged = [p for p in phases if measured[p.name] is not None]
    start = factors_of(scenario)
    before = priced(scenario, options, logged)
    fitted_phases = [p for p in logged if p.part != "step" and before[p.name] > 0 and measured[p.name] > 0]
    names = sorted({factor_of(scenario, p) for p in fitted_phases}, key=FACTORS.index)
    if scenario.cluster.device.name not in DATASHEETS and len(fitted_phases) > len(names):
        names.append("kernel_overhead_s")
    if len(fitted_phases) > len(names):
        names.append("link_latency_scale")
    # a factor the phases hardly depend on is not what the log measured (a plan without tp's collectives
    # says nothing of the links' latency): it keeps its preset value
    why = {n: NOT_DEPENDED for n in names
           if _sensitivity(scenario, options, fitted_phases, start, n, before) < SENSITIVITY}
    names = [n for n in names if n not in why]
    if not names:
        raise ConfigError(f"no phase realbench prices in the log (timers: {', '.join(sorted(timers))})",
                          source=log.source)
    limits = limits_of(scenario)
    fit, free = _least_squares(scenario, options, fitted_phases, measured, start, limits, names)
    if free != names and free:  # one ran to a bound of the search: the others fitted again without it
        why.update({n: NOT_APART for n in names if n not in free})
        names = free
        fit, _ = _least_squares(scenario, options, fitted_phases, measured, start, limits, names)
    for n in names:
        if limits[n] is not None and fit[n] > limits[n] * (1 + 1e-6):
            drivers = [p.name for p in fitted_phases if factor_of(scenario, p) == n]
            raise ConfigError(f"the log's {', '.join(drivers)} need {n} = {fit[n]:.3g}, above its physical "
                              f"{limits[n]:.3g} ({MEANING[n]}): not a log of this plan on this device", source=log.source)
    step = next((p for p in logged if p.part == "step"), None)
    if step is not None:
        # the step's seconds beyond its logged phases, measured against priced: the engine's own work
        # (module doc); of the phases as measured, so that the phases' misfit is not counted in it
        at = priced(with_factors(scenario, {**fit, "step_overhead_s": 0.0}), options, logged)
        others = [p for p in logged if p.part != "step"]
        beyond = statistics.median(s[step.timers[0]] - sum(s.get(t, 0.0) for p in others for t in p.timers)
                                   for s in steps if step.timers[0] in s)
        fit["step_overhead_s"] = max(0.0, beyond - (at[step.name] - sum(at[p.name] for p in others)))
        names.append("step_overhead_s")
    calibrated = folded(with_factors(scenario, fit))
    after = priced(calibrated, options, logged)
    rows = [{"phase": p.name, "timers": [t for t in p.timers if any(t in s for s in steps)],
             "measured_s": measured[p.name], "before_s": before[p.name], "after_s": after[p.name],
             "fitted": p in fitted_phases} for p in logged]
    factors = {n: {"before": start[n], "after": fit[n], "fitted": n in names, "limit": limits[n], "meaning": MEANING[n],
                   **({"why": why[n]} if n in why else {})} for n in FACTORS}
    c = calibrated.cluster
    return Calibration(engine, log.source, tuple(int(s["step"]) for s in steps), rows, factors, checks,
                       device=c.device.model_dump(),
                       links={k: getattr(c, k) for k in LINK_FIELDS})


def error(row: dict, key: str) -> float:
    return row[key] / row["measured_s"] - 1

