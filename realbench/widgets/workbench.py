"""All the widgets in one dashboard: the dataflow editor feeds the cluster panel and the search,
the search hands its best plan to the viewer and the run monitor; an engine's configuration
(verl, OpenRLHF) opens into the editor and the viewer, and the plan shown or searched is written
back as one; a run's log calibrates the device the searches that follow plan on."""

from __future__ import annotations

import ipywidgets as w

from realbench.widgets.calibrate import CalibrationPanel
from realbench.widgets.cluster import ClusterPanel
from realbench.widgets.dataflow import DataflowEditor
from realbench.widgets.engine import EngineConfig
from realbench.widgets.plan import PlanViewer
from realbench.widgets.run import RunMonitor
from realbench.widgets.search import SearchDashboard


class Workbench:
    def __init__(self, scenario: str = "ppo-tiny-cpu", budget_s: float = 5.0):
        self.editor = DataflowEditor(scenario)
        self.cluster = ClusterPanel()
        self.search = SearchDashboard(scenario=scenario, budget_s=budget_s)
        self.viewer = PlanViewer()
        self.monitor = RunMonitor()
        self.engine = EngineConfig()
        self.calibration = CalibrationPanel()
        self.calibration.listeners.append(self._device_calibrated)
        self.engine.listeners.append(self._engine_opened)
        self.editor.listeners.append(self._scenario_changed)
        self.cluster.listeners.append(self._profile_changed)
        self.search.listeners += [self.viewer.listen, self.monitor.set_plan, self.engine.show]
        self.use_cluster = w.Button(description="Use this cluster", icon="check",
                                    tooltip="put the edited scenario on this cluster")
        self.use_cluster.on_click(lambda _: self.apply_cluster())
        self.tabs = w.Tab(children=[self.editor.widget, self.engine.widget, w.VBox([self.cluster.widget, self.use_cluster]),
                                    self.calibration.widget, self.search.widget, self.viewer.widget,
                                    self.monitor.widget])
        for i, title in enumerate(("Dataflow", "Engine", "Cluster", "Calibrate", "Search", "Plan", "Run")):
            self.tabs.set_title(i, title)
        self.widget = self.tabs

    def _scenario_changed(self, scenario) -> None:
        self.search.scenario_override = scenario
        self.search.scenario_box.value = scenario.name  # shown; the editor's scenario is what runs

    def _engine_opened(self, scenario, options, name: str) -> None:
        """An engine's configuration: its scenario into the editor (and so the search), the plan it
        runs into the viewer."""
        if self.editor._apply(scenario.to_document(), f"opened the {name}"):
            self.viewer.show(self.editor.scenario, options, name=name)

    def _device_calibrated(self, device) -> None:  # (DeviceSpec, links): the searches plan on it
        self.search.device = device

    def _profile_changed(self, profile) -> None:  # a loaded or measured profile costs searches and runs
        self.search.profile = profile
        self.monitor.profile = profile

    def apply_cluster(self) -> bool:
        """Put the edited scenario on the cluster panel's cluster (errors shown in the editor)."""
        from realbench.errors import ConfigError

        try:
            moved = self.cluster.apply(self.editor.scenario)
        except ConfigError as e:
            self.cluster.status.value = f"<span style='color:#c00'>{e}</span>"
            return False
        return self.editor._apply(moved.to_document(), "moved to the cluster")
