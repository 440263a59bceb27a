"""The JupyterLab workbench: ipywidgets controls and bokeh plots (through jupyter_bokeh) over the
same API the command line uses. Each widget works alone (`.widget` to display it); `Workbench`
puts them together: DataflowEditor -> ClusterPanel -> SearchDashboard -> PlanViewer / RunMonitor."""

from realbench.widgets.cluster import ClusterPanel
from realbench.widgets.dataflow import DataflowEditor
from realbench.widgets.plan import PlanViewer
from realbench.widgets.run import RunMonitor
from realbench.widgets.search import SearchDashboard
from realbench.widgets.workbench import Workbench

__all__ = ["ClusterPanel", "DataflowEditor", "PlanViewer", "RunMonitor", "SearchDashboard", "Workbench"]
