"""Calibration in the workbench: a run's log against its plan (as `realbench calibrate` reads
them), measured and estimated seconds per phase as bars, and the calibrated device handed to
the search that follows (as `search --device FILE`). Errors are shown inline, in the CLI's words."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Callable, Optional

import ipywidgets as w
from jupyter_bokeh import BokehModel

from realbench.errors import ConfigError
from realbench.report.figures import calibration_figure


class CalibrationPanel:
    """`CalibrationPanel().widget` in a notebook; `calibrate()`, `apply()` from Python."""

    def __init__(self, plan: str = "", log: str = "", engine: str = "verl"):
        from realbench.calibrate.logs import ENGINES

        self.engine_box = w.Dropdown(options=list(ENGINES), value=engine, description="engine")
        self.log_box = w.Text(value=log, description="log",
                              placeholder="verl's console log or JSON lines, a TensorBoard folder, metrics.jsonl")
        self.plan_box = w.Text(value=plan, description="plan", placeholder="the plan the log ran (its scenario named in it)")
        self.skip_box = w.IntText(value=1, description="warm-up", tooltip="steps left out at the start")
        self.out_box = w.Text(description="write to", placeholder="my-h100.yaml (optional: the device file)")
        self.overwrite_box = w.Checkbox(description="overwrite", value=False)
        self.calibrate_button = w.Button(description="Calibrate", button_style="primary", icon="sliders")
        self.apply_button = w.Button(description="Use for the search", icon="check", disabled=True,
                                     tooltip="the searches that follow plan on the calibrated device")
        self.status = w.HTML()
        self.table = w.HTML()
        self.plot = BokehModel(calibration_figure([]))
        self.result = None       # the last Calibration
        self.scenario = None     # its scenario
        # applied: called with the calibrated (DeviceSpec, links) (the workbench's search takes it)
        self.listeners: list[Callable] = []
        self.calibrate_button.on_click(lambda _: self.calibrate())
        self.apply_button.on_click(lambda _: self.apply())
        self.widget = w.VBox([w.HBox([self.engine_box, self.log_box]), w.HBox([self.plan_box, self.skip_box]),
                              w.HBox([self.out_box, self.overwrite_box]),
                              w.HBox([self.calibrate_button, self.apply_button]), self.status, self.plot, self.table])

    def _error(self, e: ConfigError) -> bool:
        self.status.value = f"<span style='color:#c00'>{html.escape(str(e))}</span>"
        return False

    def calibrate(self) -> bool:
        """Fit the device to the log; the bars and the table show the phases."""
        from realbench.calibrate import calibrate, read_log
        from realbench.cli.calibrate import device_document
        from realbench.plan import load_plan
        from realbench.schema import refuse_existing, write_document

        try:
            log, plan = self.log_box.value.strip(), self.plan_box.value.strip()
            if not log:
                raise ConfigError("give the run's log", "log")
            if not plan:
                raise ConfigError("give the plan the log ran", "plan")
            skip = self.skip_box.value
            if skip < 0:
                raise ConfigError("must not be negative", "warm-up")
            out = self.out_box.value.strip()
            if out:
                refuse_existing([out], self.overwrite_box.value)
            _, scenario, options = load_plan(plan)
            result = calibrate(self.engine_box.value, read_log(self.engine_box.value, log), scenario, options, skip)
            if out:
                write_document(device_document(result, scenario), out, overwrite=self.overwrite_box.value)
        except ConfigError as e:
            return self._error(e)
        self.result, self.scenario = result, scenario
        self.plot.update_from_model(calibration_figure(result.phases))
        self.table.value = phases_table(result)
        fitted = [f"{n} {f['before']:.4g} &rarr; {f['after']:.4g}" for n, f in result.factors.items() if f["fitted"]]
        fitted += [f"{n} not fitted: {html.escape(f['why'])}" for n, f in result.factors.items() if "why" in f]
        self.status.value = (f"{html.escape(Path(log).name)}: steps {result.steps_used[0]}..{result.steps_used[-1]}; "
                             + "; ".join(fitted) + (f"; wrote {html.escape(out)}" if out else ""))
        self.apply_button.disabled = False
        return True

    def device(self) -> Optional[tuple]:
        """The calibrated (DeviceSpec, links), or None before a calibration."""
        from realbench.hardware import DeviceSpec

        return None if self.result is None else (DeviceSpec(**self.result.device), dict(self.result.links))

    def apply(self) -> bool:
        if self.result is None:
            return self._error(ConfigError("calibrate first", "log"))
        for listener in self.listeners:
            listener(self.device())
        self.status.value += "<br>the searches that follow plan on this device"
        return True


def phases_table(result) -> str:
    from realbench.calibrate.fit import error

    rows = "".join(f"<tr><td>{html.escape(r['phase'])}{'' if r['fitted'] else ' (check)'}</td>"
                   f"<td>{html.escape(' + '.join(r['timers']))}</td><td>{r['measured_s']:.3f}</td>"
                   f"<td>{r['before_s']:.3f}</td><td>{error(r, 'before_s'):+.1%}</td>"
                   f"<td>{r['after_s']:.3f}</td><td>{error(r, 'after_s'):+.1%}</td></tr>" for r in result.phases)
    return ("<table><tr><th>phase</th><th>timers</th><th>measured s</th><th>before s</th><th>error</th>"
            f"<th>after s</th><th>error</th></tr>{rows}</table>")
