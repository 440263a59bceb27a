"""Experiment trackers for `realbench run --report-to ...`, through Accelerate's tracking API
(`accelerate.tracking`): TensorBoard, Weights & Biases, MLflow and Trackio, as TRL users watch
their runs.

Offline by default, nothing contacts a server unless the user's environment says so: TensorBoard
event files and MLflow's file store go under the run's `--out` folder (`runs/`, `mlruns/`),
Weights & Biases runs in offline mode (`WANDB_MODE=offline` unless set) and Trackio keeps its
local database (under `--out/trackio` unless `TRACKIO_DIR` is set). The run's configuration
(the scenario, the plan, the settings) is the tracker's config; every step's metrics (reward,
loss, each call's metrics, the step's timings) are logged at that step as the steps finish.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

from realbench.errors import ConfigError

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}


def check_report_to(names: list[str], out: str) -> tuple[str, ...]:
    """The trackers asked for, checked: known, installed, and a folder to write into."""
    names = list(dict.fromkeys(names or ["none"]))
    if "none" in names:
        if len(names) > 1:
            raise ConfigError("none cannot be combined with a tracker", "--report-to")
        return ()
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"unknown tracker {name!r} (known: {', '.join(TRACKERS)}, none)", "--report-to")
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise ConfigError(f"the {PACKAGES[name]} package is not installed (pip install {PACKAGES[name]})",
                              "--report-to")
    if not out:
        raise ConfigError("trackers write under the run's folder: give --out DIR", "--report-to")
    return tuple(names)


def flat_config(value, prefix: str = "") -> dict:
    """A nested document as one level of `a/b/c` keys with numbers, booleans and text (what every
    tracker's config takes; lists become text)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(flat_config(v, f"{prefix}{k}/"))
        return out
    key = prefix.rstrip("/")
    if value is None or isinstance(value, (bool, int, float, str)):
        return {key: value if value is not None else "none"}
    return {key: str(value)}


class Trackers:
    """The trackers of one run: `log(summary)` logs the steps of a run summary that it has not
    logged yet (the summaries `runtime.launch.run_plan` gives as steps finish); `finish()`."""

    def __init__(self, names: tuple[str, ...], out: str, run_name: str, config: dict):
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS

        out = Path(out).resolve()
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_DIR", str(out))
        os.environ.setdefault("MLFLOW_TRACKING_URI", (out / "mlruns").as_uri())
        os.environ.setdefault("TRACKIO_DIR", str(out / "trackio"))
        self.trackers, self.logged = [], 0
        name = f"{run_name}-{time.strftime('%Y%m%d-%H%M%S')}"
        for kind in names:
            cls = LOGGER_TYPE_TO_CLASS[kind]
            tracker = cls(name, logging_dir=str(out / "runs")) if kind == "tensorboard" else \
                cls(run_name) if kind in ("mlflow", "trackio") else cls(name)
            tracker.start()
            tracker.store_init_configuration(flat_config(config))
            self.trackers.append(tracker)

    def log(self, summary: dict) -> None:
        timings = {t["step"]: t for t in summary["timings"]}
        for m in summary["metrics"][self.logged:]:
            step = m["step"]
            values = {k: v for k, v in {**m, **timings.get(step, {})}.items()
                      if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
            for tracker in self.trackers:
                tracker.log(values, step=step)
        self.logged = len(summary["metrics"])

    def finish(self) -> None:
        for tracker in self.trackers:
            tracker.finish()
