"""Calibration from a run's own log: `realbench calibrate`.

realbench.calibrate.logs reads the per-step timings that verl, OpenRLHF, AReaL or realbench's
runtime logged; realbench.calibrate.fit checks the log against the job and plan it should be of
and fits the device's efficiency factors to it, so that `estimate --device FILE` and `search
--device FILE` plan with the run's own speeds.
"""

from __future__ import annotations

from realbench.calibrate.fit import Calibration, calibrate
from realbench.calibrate.logs import StepLog, read_log

__all__ = ["Calibration", "StepLog", "calibrate", "calibrate_files", "read_log"]


def calibrate_files(engine: str, log: str, scenario: str, plan: str, skip: int = 1):
    """(scenario, Calibration) of a log file against a scenario and a plan named as the CLI takes them."""
    from realbench.plan import load_plan, load_scenario

    s = load_scenario(scenario)
    options = load_plan(plan, s)[2]
    return s, calibrate(engine, read_log(engine, log), s, options, skip)
