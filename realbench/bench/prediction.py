"""Prediction from a calibration on this machine (`realbench bench prediction --json`).

The loop a user runs: a run of one plan of a job writes its log (`realbench run --out`: metrics.jsonl
and lengths.jsonl), `realbench calibrate --engine realbench` fits the device to it, and the estimate
of another plan of the same job on the calibrated device is compared with that plan's measured run:

    plan A       the symmetric baseline (every call on every process, data parallel)
    plan B       the same meshes with tensor parallelism where the calls allow it (A's elsewhere)
    measured     each plan's time per iteration, the median over its steps after the first
    estimates    of B: on the calibrated device (the analytic model with the fitted factors), on
                 the uncalibrated CPU preset, and with this machine's cached profile (realbench's
                 default for CPU scenarios); each one's |estimate / measured - 1|

Target: the calibrated estimate of B within TARGET (10%) of its measured run.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

SCENARIO = "ppo-tiny-2cpu"
TARGET = 0.10
QUICK = {"steps": 4}


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


def run(steps: int = 10, scenario: str = SCENARIO, seed: int = 0) -> dict:
    from realbench.calibrate import calibrate, read_log
    from realbench.cost import Estimator
    from realbench.cost.baselines import BASELINES
    from realbench.hardware import DeviceSpec
    from realbench.plan import load_scenario
    from realbench.runtime.launch import run_plan
    from realbench.runtime.profile_cache import scenario_profile

    s = load_scenario(scenario)
    profile = scenario_profile(s, note=lambda line: print(line, file=sys.stderr))
    est = Estimator(s, profile=profile)
    plans = {"A": est.options_of(BASELINES["symmetric"](est))}
    plans["B"] = other_plan(est, plans["A"])
    measured = {}
    with tempfile.TemporaryDirectory() as folder:
        for label, options in plans.items():
            print(f"{scenario}: {steps} steps of plan {label}...", file=sys.stderr)
            summary = run_plan(s, options, s.cluster.n_devices, steps, seed=seed, profile=profile, device="cpu")
            measured[label] = summary["measured_iter_s"]
            if label == "A":
                run_folder = Path(folder) / "run-a"
                run_folder.mkdir()
                calibration = calibrate("realbench", read_log("realbench", str(_log_files(summary, run_folder))), s,
                                        options, skip=1)
    calibrated = s.with_device(DeviceSpec(**calibration.device), calibration.links)

    def estimate(scenario_, profile_) -> float:
        e = Estimator(scenario_, profile=profile_)
        return e.estimate(e.choice_of(plans["B"])).time_per_iter_s

    estimates = {"calibrated": estimate(calibrated, None), "preset": estimate(s, None), "profile": estimate(s, profile)}
    errors = {k: v / measured["B"] - 1 for k, v in estimates.items()}
    return {"scenario": scenario, "steps": steps,
            "plans": {k: {n: o.label(s.cluster.gpus_per_node) for n, o in v.items()} for k, v in plans.items()},
            "measured_iter_s": measured,
            "calibration": {**calibration.to_json(), "log": "plan A's metrics.jsonl"},  # (not a temporary path)
            "estimated_b_iter_s": estimates,
            "errors": errors, "target": TARGET, "meets_target": abs(errors["calibrated"]) <= TARGET,
            "median_phase_error_after": statistics.median(abs(r["after_s"] / r["measured_s"] - 1)
                                                          for r in calibration.phases)}
