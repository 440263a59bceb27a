"""Prediction from a calibration on this machine (`realbench bench prediction --json`).

The loop a user runs: a run of one plan of a job writes its log (`realbench run --out`: metrics.jsonl
and lengths.jsonl), `realbench calibrate --engine realbench` fits the device to it, and the estimates
of other plans of the same job on the calibrated device are compared with those plans' measured runs:

    plan A       data parallel: every call on every process, dp = processes (tp = pp = 1), the
                 fewest micro-batches
    plan B       the same meshes with tensor parallelism where the calls allow it (A's elsewhere)
    plan C       B's training calls, A's others: the plan whose run calibrates (it has both kinds
                 of call, data parallel and tensor parallel, so its log pins the per-layer
                 overhead and the collectives' latency apart: realbench.calibrate.fit)
    measured     each plan's time per iteration, the median over its steps after the first, run
                 in ROUNDS rounds (A, B, C, A, B, C): the median of its rounds, and their spread
                 (max / min - 1), this machine's own noise between two runs of one plan
    estimates    of A and B: on the device calibrated on C's log (the analytic model with the
                 fitted factors), on the uncalibrated CPU preset, and with this machine's cached
                 profile (realbench's default for CPU scenarios); each one's estimate / measured - 1

Target: the calibrated estimates of A and B each within TARGET (10%) of their measured runs (C's
first round calibrates).

Beside it, what a log cannot teach: A's own log calibrates too (no tensor-parallel collective in
it, so `calibrate` leaves the links' latency at the preset's and says why), and B and C are
estimated on that device.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

SCENARIO = "ppo-tiny-2cpu"
TARGET = 0.10
SKIP = 5  # warm-up steps calibrate leaves out (the runtime's first steps run slower)
ROUNDS = 2
QUICK = {"steps": 4, "skip": 1, "rounds": 1}


def data_parallel_plan(est) -> dict:
    """Plan A: each call on the whole cluster's mesh, data parallel only, with its fewest micro-batches
    (not the symmetric baseline, which takes whichever one strategy the estimate likes best for every
    call: a pipeline on some machines' profiles)."""
    n = est.scenario.cluster.n_devices
    out = {}
    for i, name in enumerate(est.call_names):
        wide = [o for o in est.options[i] if o.mesh.size == n and o.strategy.dp == n]
        out[name] = min(wide, key=lambda o: o.strategy.micro_batches)
    return out


def other_plan(est, options: dict) -> dict:
    """Plan B: each call on its mesh in A with tp as wide as the mesh allows (dp 1), where an option
    of that shape exists; A's option elsewhere."""
    out = {}
    for i, name in enumerate(est.call_names):
        a = options[name]
        wider = [o for o in est.options[i] if o.mesh == a.mesh and o.strategy.tp == a.mesh.size
                 and o.strategy.pp == 1 and o.strategy.micro_batches == a.strategy.micro_batches]
        out[name] = wider[0] if wider and est.calls[i].kind.value != "generate" else a
    return out


def _log_files(summary: dict, folder: Path) -> Path:
    """metrics.jsonl and lengths.jsonl as `realbench run --out` writes them."""
    timings = {t["step"]: t for t in summary["timings"]}
    (folder / "metrics.jsonl").write_text("".join(json.dumps({**m, **timings.get(m["step"], {})}) + "\n"
                                                  for m in summary["metrics"]))
    (folder / "lengths.jsonl").write_text("".join(json.dumps(x) + "\n" for x in summary["lengths"]))
    return folder / "metrics.jsonl"


def run(steps: int = 40, scenario: str = SCENARIO, seed: int = 0, skip: int = SKIP, rounds: int = ROUNDS) -> dict:
    from realbench.calibrate import calibrate, read_log
    from realbench.cost import Estimator
    from realbench.dataflow import CallKind
    from realbench.hardware import DeviceSpec
    from realbench.plan import load_scenario
    from realbench.runtime.launch import run_plan
    from realbench.runtime.profile_cache import scenario_profile

    s = load_scenario(scenario)
    profile = scenario_profile(s, note=lambda line: print(line, file=sys.stderr))
    est = Estimator(s, profile=profile)
    plans = {"A": data_parallel_plan(est)}
    plans["B"] = other_plan(est, plans["A"])
    plans["C"] = {c.name: plans["B" if c.kind == CallKind.TRAIN else "A"][c.name] for c in s.dataflow.calls}
    runs, calibrations = {label: [] for label in plans}, {}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(rounds):
            for label, options in plans.items():
                print(f"{scenario}: round {round_ + 1}, {steps} steps of plan {label}...", file=sys.stderr)
                summary = run_plan(s, options, s.cluster.n_devices, steps, seed=seed, profile=profile, device="cpu")
                runs[label].append(summary["measured_iter_s"])
                if label in ("A", "C") and round_ == 0:
                    run_folder = Path(folder) / f"run-{label.lower()}"
                    run_folder.mkdir()
                    log = read_log("realbench", str(_log_files(summary, run_folder)))
                    calibrations[label] = calibrate("realbench", log, s, options, skip=skip)
    measured = {label: statistics.median(v) for label, v in runs.items()}

    def estimate(scenario_, profile_, plan: str) -> float:
        e = Estimator(scenario_, profile=profile_)
        return e.estimate(e.choice_of(plans[plan])).time_per_iter_s

    def on(calibration):
        return s.with_device(DeviceSpec(**calibration.device), calibration.links)

    estimates = {p: {"calibrated": estimate(on(calibrations["C"]), None, p), "preset": estimate(s, None, p),
                     "profile": estimate(s, profile, p)} for p in ("A", "B")}
    errors = {p: {k: v / measured[p] - 1 for k, v in e.items()} for p, e in estimates.items()}
    from_a = {p: estimate(on(calibrations["A"]), None, p) for p in ("B", "C")}

    def described(calibration) -> dict:
        return {**calibration.to_json(), "log": "the plan's metrics.jsonl"}  # (not a temporary path)

    return {"scenario": scenario, "steps": steps, "skip": skip, "rounds": rounds,
            "plans": {k: {n: o.label(s.cluster.gpus_per_node) for n, o in v.items()} for k, v in plans.items()},
            "measured_iter_s": measured, "rounds_iter_s": runs,
            "spread_between_rounds": {label: max(v) / min(v) - 1 for label, v in runs.items()},
            "calibration": described(calibrations["C"]),
            "estimated_iter_s": estimates, "errors": errors, "target": TARGET,
            "meets_target": all(abs(errors[p]["calibrated"]) <= TARGET for p in ("A", "B")),
            "median_phase_error_after": statistics.median(abs(r["after_s"] / r["measured_s"] - 1)
                                                          for r in calibrations["C"].phases),
            "from_a": {"calibration": described(calibrations["A"]), "estimated_iter_s": from_a,
                       "errors": {p: v / measured[p] - 1 for p, v in from_a.items()}}}
