"""The JupyterLab workbench: ipywidgets controls and bokeh plots (through jupyter_bokeh) over the
same API the command line uses. Each widget works alone (`.widget` to display it); `Workbench`
puts them together: DataflowEditor -> ClusterPanel -> (CalibrationPanel) -> SearchDashboard -> PlanViewer /
RunMonitor."""

import importlib.util

# (the workbench's packages are an extra: a clear line where they are missing, not a traceback deep in a widget)
_MISSING = [name for name in ("ipywidgets", "jupyter_bokeh") if importlib.util.find_spec(name) is None]
if _MISSING:
    raise ImportError(f"realbench's workbench needs {', '.join(_MISSING)}: pip install 'realbench[lab]'")

from realbench.widgets.calibrate import CalibrationPanel
from realbench.widgets.cluster import ClusterPanel
from realbench.widgets.dataflow import DataflowEditor
from realbench.widgets.plan import PlanViewer
from realbench.widgets.run import RunMonitor
from realbench.widgets.search import SearchDashboard
from realbench.widgets.workbench import Workbench

__all__ = ["CalibrationPanel", "ClusterPanel", "DataflowEditor", "PlanViewer", "RunMonitor", "SearchDashboard", "Workbench"]
