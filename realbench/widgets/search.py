"""Search dashboard: MCMC and Optuna samplers side by side on one scenario, with live curves of
best time per iteration against seconds (one line per method, the baselines as reference
lines), a stop button, and the best plan handed to whoever listens (the plan viewer).

Each method runs `realbench.search.run_search` in its own thread with its own Estimator (the
estimator caches are not shared between threads), so the kernel stays responsive; progress
arrives through the search event stream and is drawn at once (see `dispatcher`).
"""

from __future__ import annotations

import html
import math
import threading
from typing import Callable, Optional

import ipywidgets as w
from bokeh.models import ColumnDataSource
from jupyter_bokeh import BokehModel

from realbench.errors import ConfigError
from realbench.report.figures import curves_figure
from realbench.search import METHODS, SamplerSettings, SearchEvent, SearchResult, run_search

SIDE_BY_SIDE = tuple(m for m in METHODS if m != "exhaustive")


def dispatcher() -> Callable:
    """send(fn, *args) from any thread: runs fn at once under this sender's lock. Widget and bokeh updates
    from background threads reach the browser through ipykernel's iopub thread, so the plots move
    even while the kernel runs a cell (one that waits for the search, say); the lock keeps two
    searches (threads of one widget) from changing its bokeh document at the same time."""

    lock = threading.RLock()

    def send(fn, *args) -> None:
        with lock:
            fn(*args)
    return send


class SearchDashboard:
    """`SearchDashboard().widget` in a notebook; `start()`, `stop()`, `wait()` from Python."""

    def __init__(self, scenario: str = "ppo-7b-7b-16gpu", methods=("mcmc", "tpe"), budget_s: float = 10.0,
                 seed: int = 0, profile="cached"):
        """`profile`: what the searches cost plans with: "cached" (for a CPU scenario, this
        machine's cached profile, measured once when there is none: realbench.runtime.profile_cache; the
        presets for a GPU one), a Profile, or None (the analytic model)."""
        from realbench.plan.builtin import BUILTIN

        self.profile = profile
        self._profile = None  # what the running searches use
        ensure_bokehjs()
        self.scenario_box = w.Combobox(value=scenario, options=list(BUILTIN), description="scenario",
                                       placeholder="built-in name or scenario file", ensure_option=False)
        self.methods_box = w.SelectMultiple(options=SIDE_BY_SIDE, value=tuple(methods), description="methods", rows=5)
        self.budget_box = w.FloatText(value=budget_s, description="budget s")
        self.seed_box = w.IntText(value=seed, description="seed")
        # the Optuna samplers' key settings (realbench.search.SamplerSettings)
        self.startup_box = w.IntText(value=10, description="start-up trials",
                                     tooltip="TPE and GP: random trials before the sampler models the results")
        self.multivariate_box = w.Checkbox(value=True, description="TPE multivariate", indent=False)
        # `search --zero`: the engines' data-parallel sharding too (plans to price, not to run here)
        self.zero_box = w.Checkbox(value=False, description="offer zero (engines' sharding)", indent=False)
        self.rates = w.HTML()  # evaluations/s per method, beside the curves
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.stop_button = w.Button(description="Stop", icon="stop", disabled=True)
        self.status = w.HTML()
        self.table = w.HTML()
        self.run_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop())
        self.sources: dict[str, ColumnDataSource] = {}
        self.results: dict[str, SearchResult] = {}
        self.baselines: dict[str, float] = {}
        self.latest: dict[str, SearchEvent] = {}
        self._estimators: dict = {}
        self.settings = SamplerSettings()
        self.listeners: list[Callable] = []  # called with (scenario, options, method) of the best plan
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._send = dispatcher()
        self.scenario = None
        self.scenario_override = None  # a Scenario value (the dataflow editor's) instead of the box
        # a device (DeviceSpec, links) to plan on instead of the scenario's, costed by its factors
        # (`search --device FILE`: the calibration panel's)
        self.device = None
        self.plot = BokehModel(curves_figure({}, {}))
        self.widget = w.VBox([
            w.HBox([w.VBox([self.scenario_box, self.budget_box, self.seed_box]), self.methods_box,
                    w.VBox([self.startup_box, self.multivariate_box, self.zero_box])]),
            w.HBox([self.run_button, self.stop_button]), self.status, w.HBox([self.plot, self.rates]), self.table])

    # -- control ------------------------------------------------------------------------------------------
    def _inputs(self):
        from realbench.plan import load_scenario

        budget = self.budget_box.value
        if not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget > 0):
            raise ConfigError(f"must be a positive number of seconds, not {budget!r}", "budget")
        methods = tuple(self.methods_box.value)
        if not methods:
            raise ConfigError("pick at least one search method", "methods")
        if self.seed_box.value < 0:
            raise ConfigError("must not be negative", "seed")
        if self.startup_box.value < 0:
            raise ConfigError("must not be negative", "start-up trials")
        settings = SamplerSettings(int(self.startup_box.value), bool(self.multivariate_box.value))
        scenario = self.scenario_override or load_scenario(self.scenario_box.value.strip())
        if self.device is not None:
            scenario = scenario.with_device(*self.device)
        if self.zero_box.value:
            scenario = scenario.with_zero()
        return scenario, methods, float(budget), int(self.seed_box.value), settings

    def start(self) -> bool:
        """Start the searches; False (with the reason shown inline) when an input is wrong."""
        if self.running:
            return False
        try:
            scenario, methods, budget, seed, settings = self._inputs()
        except ConfigError as e:
            self.status.value = f"<span style='color:#c00'>{html.escape(str(e))}</span>"
            return False
        from realbench.cost import Estimator
        from realbench.search import baseline_plans

        from realbench.runtime.profile_cache import resolve_profile

        def say(text):
            self.status.value = html.escape(text)
        try:
            self._profile = None if self.device is not None else resolve_profile(
                self.profile, scenario, note=say, on_progress=lambda done, total: say(f"profiling this machine: {done}/{total}"))
        except Exception as e:  # shown inline, never a traceback in the notebook
            self.status.value = f"<span style='color:#c00'>profiling failed: {html.escape(str(e))}</span>"
            return False
        self.scenario, self.settings = scenario, settings  # what the running searches use
        self._send = dispatcher()
        self._stop.clear()
        self.results, self.latest, self._estimators = {}, {}, {}
        self._finished = False
        est = Estimator(scenario, profile=self._profile)
        self.baselines = {k: t for k, (_, t) in baseline_plans(est).items() if math.isfinite(t)}
        self.sources = {m: ColumnDataSource(dict(seconds=[], best=[])) for m in methods}
        self.plot = BokehModel(curves_figure(self.sources, self.baselines))
        self.rates.value = ""
        self.widget.children = self.widget.children[:3] + (w.HBox([self.plot, self.rates]), self.table)
        self.run_button.disabled, self.stop_button.disabled = True, False
        self.status.value = f"searching {html.escape(scenario.name)} with {', '.join(methods)} for {budget:g} s ..."
        self._threads = [threading.Thread(target=self._search, args=(m, budget, seed), daemon=True,
                                          name=f"realbench-search-{m}") for m in methods]
        for t in self._threads:
            t.start()
        return True

    def stop(self) -> None:
        self._stop.set()

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def wait(self, timeout: Optional[float] = None) -> dict[str, SearchResult]:
        for t in self._threads:
            t.join(timeout)
        return self.results

    # -- the searches (threads) ------------------------------------------------------------------------------
    def _search(self, method: str, budget: float, seed: int) -> None:
        from realbench.cost import Estimator

        try:
            est = Estimator(self.scenario, profile=self._profile)
            result = run_search(est, method, budget, seed, on_event=lambda e: self._dispatch(self._on_event, e),
                                stop=self._stop.is_set, settings=self.settings)
            # the results are kept here, at once, so that wait() returns them even while the
            # kernel's loop (which draws) is busy running the cell that waits
            self.results[method], self._estimators[method] = result, est
            self._dispatch(self._on_result)
        except Exception as e:  # shown inline, never a traceback in the notebook
            self._dispatch(self._on_error, method, e)

    def _dispatch(self, fn, *args) -> None:
        self._send(fn, *args)

    def _on_event(self, e: SearchEvent) -> None:
        self.latest[e.method] = e
        if math.isfinite(e.best_time_s):
            self.sources[e.method].stream(dict(seconds=[e.seconds], best=[e.best_time_s]))
        self.rates.value = self.rates_table()

    def rates_table(self) -> str:
        """Evaluations per second of each method so far (from its latest event): MCMC's chains and
        the samplers' descents evaluate plans in batches, a sampler alone one trial at a time."""
        rows = "".join(f"<tr><td>{html.escape(m)}</td><td>{e.evaluations:,}</td>"
                       f"<td>{e.evaluations / e.seconds if e.seconds > 0 else 0:,.0f}</td></tr>"
                       for m, e in sorted(self.latest.items()))
        return "<table><tr><th>method</th><th>plans</th><th>plans/s</th></tr>" + rows + "</table>"

    def _on_result(self) -> None:
        if len(self.results) == len(self.sources) and not self._finished:
            self._finished = True
            self._finish()

    def _on_error(self, method: str, e: Exception) -> None:
        self.status.value = f"<span style='color:#c00'>{method}: {html.escape(str(e))}</span>"
        self.run_button.disabled, self.stop_button.disabled = False, True

    def _finish(self) -> None:
        self.run_button.disabled, self.stop_button.disabled = False, True
        rows = []
        for m, r in sorted(self.results.items(), key=lambda kv: kv[1].best_time_s):
            speed = {k: f"{v / r.best_time_s:.3f}x" for k, v in self.baselines.items()} if math.isfinite(r.best_time_s) else {}
            rows.append(f"<tr><td>{m}</td><td>{r.best_time_s:.4g}</td><td>{r.evaluations}</td><td>{r.seconds:.1f}</td>"
                        f"<td>{html.escape(', '.join(f'{k} {v}' for k, v in speed.items()))}</td></tr>")
        self.table.value = ("<table><tr><th>method</th><th>best s/iter</th><th>plans evaluated</th><th>seconds</th>"
                            "<th>speed-up over</th></tr>" + "".join(rows) + "</table>")
        best = self.best()
        self.status.value = "done" + (f": best {best[2]} at {self.results[best[2]].best_time_s:.4g} s/iter" if best else "")
        if best:
            for listener in self.listeners:
                listener(*best)

    def best(self):
        """(scenario, options, method) of the best plan found, or None."""
        found = [(r.best_time_s, m, r) for m, r in self.results.items() if r.best_choice is not None]
        if not found:
            return None
        _, method, r = min(found, key=lambda x: x[0])
        return self.scenario, self._estimators[method].options_of(r.best_choice), method


def ensure_bokehjs() -> None:
    """Load BokehJS into the notebook page once (jupyter_bokeh's views need it): bokeh's
    output_notebook with inline resources (the default fetches BokehJS from a CDN, which an
    offline machine cannot reach), unless bokeh already did it in this kernel. Outside a kernel,
    nothing."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return
    from bokeh.io import output_notebook
    from bokeh.io.state import curstate
    from bokeh.resources import INLINE

    if not curstate().notebook:
        output_notebook(resources=INLINE, hide_banner=True)
