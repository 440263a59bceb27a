"""Run monitor: run a plan on local processes (Accelerate's launcher, started from a background
thread) with live reward and loss curves, measured beside estimated time per call, seconds per
step with a marker at each plan switch (re-planning, `replan_box`), for asynchronous plans the
staleness of each step's trained batch (train steps behind the weights that generated it), the latest
decoded samples, a stop button (the processes end; checkpoints already written stay) and,
optionally, the trained models saved as Hugging Face folders at the end, and generation's decode
steps compiled (`compile_box`, `realbench run --compile-decode`)."""

from __future__ import annotations

import html
import threading
from typing import Mapping, Optional

import ipywidgets as w
from bokeh.layouts import row
from bokeh.models import ColumnDataSource
from bokeh.plotting import figure
from jupyter_bokeh import BokehModel

from realbench.errors import ConfigError
from realbench.plan.mesh import Option
from realbench.plan.scenario import Scenario
from realbench.widgets.search import dispatcher, ensure_bokehjs
from realbench.widgets.training import TrainingForm


class RunMonitor:
    def __init__(self, nproc: int = 2, steps: int = 5, seed: int = 0, profile="cached"):
        """`profile`: what the estimates beside the measured times come from: "cached" (this
        machine's cached profile for CPU runs, measured once when there is none; see
        realbench.runtime.profile_cache), a Profile, or None (the analytic model)."""
        ensure_bokehjs()
        self.profile = profile
        self.nproc_box = w.BoundedIntText(value=nproc, min=1, max=64, description="processes")
        self.steps_box = w.BoundedIntText(value=steps, min=1, max=10_000, description="steps")
        self.seed_box = w.BoundedIntText(value=seed, min=0, max=2**31 - 1, description="seed")
        self.run_button = w.Button(description="Run", button_style="primary", icon="play", disabled=True)
        self.stop_button = w.Button(description="Stop", icon="stop", disabled=True)
        self.save_box = w.Text(value="", placeholder="folder (optional)", description="save HF to")
        # re-planning (realbench.runtime.replan): 0 steps = keep the plan
        self.replan_box = w.BoundedIntText(value=0, min=0, max=10_000, description="re-plan every")
        self.replan_budget_box = w.BoundedFloatText(value=5.0, min=0.1, max=600, description="search s")
        # realbench run --compile-decode: generation's decode steps through torch.compile
        self.compile_box = w.Checkbox(value=False, description="compile decode steps", indent=False)
        self.training = TrainingForm()
        self.status = w.HTML("<i>no plan yet</i>")
        self.samples = w.HTML()
        self.scenario: Optional[Scenario] = None
        self._new_sources()
        self.plot = BokehModel(self._figures([]))
        self.widget = w.VBox([w.HBox([self.nproc_box, self.steps_box, self.seed_box, self.run_button,
                                      self.stop_button]), w.HBox([self.save_box, self.replan_box, self.replan_budget_box,
                                                           self.compile_box]),
                              self.training.widget, self.status, self.plot, self.samples])
        self.run_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop())
        self._stop = threading.Event()
        self.options: Optional[dict[str, Option]] = None
        self.result: Optional[dict] = None
        self.error: Optional[str] = None
        self._thread: Optional[threading.Thread] = None

    def _new_sources(self) -> None:
        # new sources for each run: a bokeh model belongs to one document, and an old plot's holds these
        self.metrics = ColumnDataSource(dict(step=[], reward=[], loss=[]))
        self.calls = ColumnDataSource(dict(call=[], measured=[], estimated=[]))
        self.step_times = ColumnDataSource(dict(step=[], seconds=[]))
        self.switch_marks = ColumnDataSource(dict(step=[], seconds=[]))  # the first step under each new plan
        self.staleness = ColumnDataSource(dict(step=[], staleness=[]))  # asynchronous plans: per step

    def _figures(self, names: list[str]):
        curves = figure(width=420, height=260, title="reward and loss per step", x_axis_label="step", tools="save")
        curves.line("step", "reward", source=self.metrics, color="#2ca02c", legend_label="mean reward", line_width=2)
        curves.line("step", "loss", source=self.metrics, color="#d62728", legend_label="loss", line_width=2)
        curves.legend.location = "top_left"
        bars = figure(width=460, height=260, title="seconds per call: measured (bars) vs estimated (dots)",
                      y_range=list(reversed(names)) or ["-"], tools="save")
        bars.hbar(y="call", right="measured", height=0.6, source=self.calls, fill_color="#1f77b4")
        bars.scatter(x="estimated", y="call", source=self.calls, size=9, color="#ff7f0e")
        times = figure(width=380, height=260, title="seconds per step (triangles: plan switches)", x_axis_label="step",
                       tools="save")
        times.line("step", "seconds", source=self.step_times, color="#555555", line_width=2)
        times.scatter("step", "seconds", source=self.switch_marks, marker="triangle", size=14, color="#9467bd")
        if self.scenario is None or not self.scenario.dataflow.max_staleness:
            return row(curves, bars, times)
        bound = self.scenario.dataflow.max_staleness
        stale = figure(width=300, height=260, title=f"staleness of the trained batch (at most {bound})",
                       x_axis_label="step", y_axis_label="train steps behind", tools="save")
        stale.step("step", "staleness", source=self.staleness, mode="center", color="#8c564b", line_width=2)
        return row(curves, bars, times, stale)

    def set_plan(self, scenario: Scenario, options: Mapping[str, Option], method: str = "") -> None:
        from realbench.runtime.launch import needed_processes

        self.scenario, self.options = scenario, dict(options)
        self.training.show(scenario.training, scenario.algorithm)
        self.nproc_box.value = needed_processes(scenario, self.options)
        self.run_button.disabled = False
        self.status.value = f"ready: {html.escape(scenario.name)}" + (f" ({html.escape(method)})" if method else "")

    def start(self) -> bool:
        from realbench.runtime.launch import check_run

        if self.options is None or self.running:
            return False
        try:
            self.scenario = self._with_training(self.scenario)
            check_run(self.scenario, self.options, self.nproc_box.value, self.steps_box.value, 0, "", False,
                      flag="processes", save_hf=self.save_box.value.strip(), replan=self._replan())
        except ConfigError as e:
            self.status.value = f"<span style='color:#c00'>{html.escape(str(e))}</span>"
            return False
        self._new_sources()
        self.plot = BokehModel(self._figures(list(self.scenario.dataflow.call_names)))
        self.widget.children = self.widget.children[:4] + (self.plot, self.samples)
        self.samples.value = ""
        self.result, self.error = None, None
        self._stop.clear()
        self.run_button.disabled, self.stop_button.disabled = True, False
        self.status.value = f"running {self.steps_box.value} steps on {self.nproc_box.value} processes ..."
        send = dispatcher()
        self._thread = threading.Thread(target=self._run, args=(send,), daemon=True, name="realbench-run")
        self._thread.start()
        return True

    def _with_training(self, scenario: Scenario) -> Scenario:
        """The scenario with the training form's settings (checked like a file's)."""
        from realbench.plan.scenario import scenario_from_document

        changes = self.training.changes(scenario.training, scenario.algorithm)
        if changes == scenario.training.model_dump(exclude_unset=True):
            return scenario
        return scenario_from_document({**scenario.to_document(), "training": changes})

    def stop(self) -> None:
        """End the run: its processes stop; the steps done so far stay on the curves."""
        self._stop.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: Optional[float] = None) -> Optional[dict]:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.result

    def _run(self, send) -> None:
        from realbench.runtime.launch import run_plan

        try:
            nproc, running = self.nproc_box.value, self.status.value
            from realbench.runtime.profile_cache import resolve_profile
            from realbench.runtime.device import resolve_device

            def say(text):
                send(setattr, self.status, "value", html.escape(text))

            profile = resolve_profile(self.profile, self.scenario, nproc, note=say,
                                      on_progress=lambda done, total: say(f"profiling this machine: {done}/{total}"),
                                      device_type=resolve_device("auto", nproc))
            send(setattr, self.status, "value", running)
            result = run_plan(self.scenario, self.options, nproc, self.steps_box.value,
                              self.seed_box.value, on_step=lambda summary: send(self._show, summary),
                              stop=self._stop.is_set, save_hf=self.save_box.value.strip(), profile=profile,
                              replan=self._replan(), compile_decode=self.compile_box.value)
            self.result = result  # at once: wait() returns it even while the kernel's loop is busy
            send(self._finish, result, None)
        except Exception as e:
            self.error = str(e).splitlines()[0] if str(e) else type(e).__name__
            send(self._finish, None, self.error)

    def _replan(self):
        from realbench.runtime.launch import ReplanSettings

        return ReplanSettings(int(self.replan_box.value), float(self.replan_budget_box.value))

    def _show(self, summary: dict) -> None:
        m = summary["metrics"]
        nan = float("nan")
        self.metrics.data = dict(step=[x["step"] for x in m], reward=[nan if x["reward"] is None else x["reward"] for x in m],
                                 loss=[nan if x["loss"] is None else x["loss"] for x in m])
        timings = summary["timings"]
        self.step_times.data = dict(step=[t["step"] for t in timings], seconds=[t["seconds"] for t in timings])
        switched = [t for a, t in zip(timings, timings[1:]) if t.get("plan_version", 0) > a.get("plan_version", 0)]
        self.staleness.data = dict(step=[x["step"] for x in m], staleness=[x.get("staleness", 0.0) for x in m])
        self.switch_marks.data = dict(step=[t["step"] for t in switched], seconds=[t["seconds"] for t in switched])
        calls = summary["calls"]
        self.calls.data = dict(call=list(calls), measured=[c["measured_s"] for c in calls.values()],
                               estimated=[c["estimated_s"] for c in calls.values()])
        if summary.get("samples"):
            latest = summary["samples"][-1]
            rows = "".join(f"<tr><td>{html.escape(str(x['prompt']))}</td><td>{html.escape(str(x['completion']))}</td></tr>"
                           for x in latest["samples"])
            self.samples.value = (f"<b>samples at step {latest['step']}</b><table><tr><th>prompt</th>"
                                  f"<th>completion</th></tr>{rows}</table>")

    def _finish(self, result: Optional[dict], error: Optional[str]) -> None:
        self.run_button.disabled, self.stop_button.disabled = False, True
        if error:
            self.status.value = f"<span style='color:#c00'>run failed: {html.escape(error)}</span>"
            return
        self._show(result)
        self.status.value = (f"done: {result['steps']} steps, measured {result['measured_iter_s']:.3f} s per iteration "
                             f"(estimated {result['estimated_iter_s']:.3f} s)")
