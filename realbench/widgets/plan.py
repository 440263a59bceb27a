"""Plan viewer: the mesh map, the simulated Gantt timeline with reallocations, memory per device
against capacity, and the plan beside the baselines (the HTML report's figures, live in a
notebook), plus a side-by-side comparison of two plans."""

from __future__ import annotations

import html
from typing import Mapping, Optional

import ipywidgets as w
from bokeh.layouts import column, row
from jupyter_bokeh import BokehModel

from realbench.plan.mesh import Option
from realbench.plan.scenario import Scenario
from realbench.widgets.search import ensure_bokehjs


class PlanViewer:
    def __init__(self, profile="cached"):
        """`profile`: what the shown plans are costed with ("cached", a Profile or None; see
        realbench.runtime.profile_cache.resolve_profile): the same as the search that found them."""
        ensure_bokehjs()
        self.profile = profile
        self._profile = None  # what the shown plan was costed with
        self.title = w.HTML("<i>no plan yet: run a search, or call show(scenario, options)</i>")
        self.body = w.VBox([])
        self.widget = w.VBox([self.title, self.body])
        self.scenario: Optional[Scenario] = None
        self.options: Optional[dict[str, Option]] = None
        self.estimate = None

    def show(self, scenario: Scenario, options: Mapping[str, Option], name: str = "plan") -> None:
        from realbench.cost import Estimator
        from realbench.export.html import report_layout
        from realbench.runtime.profile_cache import resolve_profile

        self._profile = resolve_profile(self.profile, scenario)
        est = Estimator(scenario, profile=self._profile)
        self.scenario, self.options = scenario, dict(options)
        self.estimate = est.estimate(est.choice_of(self.options))
        self.title.value = (f"<b>{html.escape(name)}</b> for {html.escape(scenario.name)}: "
                            f"{self.estimate.time_per_iter_s:.4g} s per iteration"
                            + (" <span style='color:#c00'>OUT OF MEMORY</span>" if self.estimate.oom else ""))
        self.body.children = [BokehModel(report_layout(scenario, self.options, plan_name=name, profile=self._profile))]

    def listen(self, scenario: Scenario, options: Mapping[str, Option], method: str) -> None:
        """A SearchDashboard listener: show the best plan the search found."""
        self.show(scenario, options, name=f"best plan of {method}")

    def compare(self, other: Mapping[str, Option], names=("this plan", "other plan")) -> None:
        """Both plans' mesh maps and timelines side by side, and their times."""
        from realbench.cost import Estimator
        from realbench.report import figures

        if self.scenario is None:
            raise ValueError("show a plan first")
        est = Estimator(self.scenario, profile=self._profile)
        plans = [self.options, dict(other)]
        estimates = [est.estimate(est.choice_of(p)) for p in plans]
        columns = [column(figures.mesh_map_figure(self.scenario, p, width=460),
                          figures.timeline_figure(self.scenario, e, width=460)) for p, e in zip(plans, estimates)]
        times = figures.comparison_figure({n: e.time_per_iter_s for n, e in zip(names, estimates)}, width=920)
        self.body.children = [BokehModel(column(row(*columns), times))]
