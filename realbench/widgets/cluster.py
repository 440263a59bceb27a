"""Cluster and profiler panel: nodes x devices and a device preset (or a profile file) for the
scenario being planned, and hardware profiling in the background with a progress bar and the
measured curves."""

from __future__ import annotations

import html
import threading
from typing import Callable, Optional

import ipywidgets as w
from bokeh.layouts import row
from bokeh.palettes import Category10_10
from bokeh.plotting import figure
from jupyter_bokeh import BokehModel

from realbench.errors import ConfigError
from realbench.widgets.search import dispatcher, ensure_bokehjs


def profile_figures(profile):
    """Measured layer times against tokens (per operation and tp) and collective bandwidths."""
    ops = figure(width=440, height=280, title="measured layer time", x_axis_type="log", y_axis_type="log",
                 x_axis_label="tokens (batch x length)", y_axis_label="seconds", tools="pan,wheel_zoom,reset,save")
    i = 0
    for name, m in profile.models.items():
        for tp, table in m.ops.items():
            for op in ("block.fwd", "block.fwd_bwd", "block.decode"):
                pts = sorted(table.get(op, []), key=lambda p: p.batch * p.length)
                if pts:
                    ops.scatter([p.batch * p.length for p in pts], [p.median_s for p in pts],
                                color=Category10_10[i % 10], legend_label=f"{name} tp{tp} {op}")
                    i += 1
    ops.legend.label_text_font_size = "7pt"
    ops.legend.location = "top_left"
    links = figure(width=440, height=280, title="measured collectives", x_axis_type="log", y_axis_type="log",
                   x_axis_label="bytes", y_axis_label="GB/s", tools="pan,wheel_zoom,reset,save")
    for j, (kind, groups) in enumerate(profile.collectives.items()):
        for n, pts in groups.items():
            pts = sorted(pts, key=lambda p: p.nbytes)
            links.line([p.nbytes for p in pts], [p.nbytes / p.median_s / 1e9 for p in pts],
                       color=Category10_10[j % 10], legend_label=f"{kind} over {n}", line_width=2)
    links.legend.label_text_font_size = "7pt"
    links.legend.location = "top_left"
    return row(ops, links)


class ClusterPanel:
    def __init__(self, nodes: int = 1, gpus_per_node: int = 4, device: str = "cpu"):
        ensure_bokehjs()
        from realbench.hardware import DEVICES

        self.nodes_box = w.BoundedIntText(value=nodes, min=1, max=1024, description="nodes")
        self.gpus_box = w.Dropdown(options=[1, 2, 4, 8, 16], value=gpus_per_node, description="per node")
        self.device_box = w.Dropdown(options=list(DEVICES), value=device, description="device")
        self.profile_path = w.Text(description="profile", placeholder="optional: a profile file")
        self.nproc_box = w.BoundedIntText(value=2, min=1, max=64, description="processes")
        self.profile_button = w.Button(description="Profile this machine", icon="tachometer")
        self.out_box = w.Text(value="profile.json", description="save to")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="profiling")
        self.status = w.HTML()
        self.curves = w.VBox([])
        self.profile = None
        self.listeners: list[Callable] = []  # called with the profile when one is loaded or measured
        self._thread: Optional[threading.Thread] = None
        self.profile_button.on_click(lambda _: self.start_profile())
        self.profile_path.observe(lambda ch: self.load_profile(ch["new"]) if ch["new"].strip() else None,
                                  names="value")
        self.widget = w.VBox([w.HBox([self.nodes_box, self.gpus_box, self.device_box]), self.profile_path,
                              w.HBox([self.nproc_box, self.out_box, self.profile_button]), self.progress,
                              self.status, self.curves])

    def cluster(self):
        from realbench.hardware import cluster

        return cluster(self.nodes_box.value, self.gpus_box.value, self.device_box.value)

    def apply(self, scenario):
        """The scenario on this panel's cluster."""
        from realbench.plan.scenario import scenario_from_document

        doc = scenario.to_document()
        doc["cluster"] = {"nodes": self.nodes_box.value, "gpus_per_node": self.gpus_box.value,
                          "device": self.device_box.value}
        return scenario_from_document(doc)

    def load_profile(self, path: str) -> bool:
        from realbench.hardware.profile import load_profile

        try:
            self.profile = load_profile(path.strip())
        except ConfigError as e:
            self.status.value = f"<span style='color:#c00'>{html.escape(str(e))}</span>"
            return False
        self._show_profile(f"loaded {path.strip()}")
        return True

    def _show_profile(self, message: str) -> None:
        p = self.profile
        self.status.value = f"{html.escape(message)}: {html.escape(p.device.name)}, {html.escape(p.date)}"
        self.curves.children = [BokehModel(profile_figures(p))]
        for listener in self.listeners:
            listener(p)

    def start_profile(self, request=None) -> bool:
        from pathlib import Path

        from realbench.runtime.profiler import ProfileRequest, check_request

        if self._thread is not None and self._thread.is_alive():
            return False
        req = request or ProfileRequest(nproc=self.nproc_box.value)
        try:
            check_request(req)
            out = Path(self.out_box.value.strip())
            if out.exists():
                raise ConfigError("exists; choose another file name", source=str(out))
        except ConfigError as e:
            self.status.value = f"<span style='color:#c00'>{html.escape(str(e))}</span>"
            return False
        send = dispatcher()
        self.profile_button.disabled = True
        self.status.value = "profiling ..."

        def progress(done: int, total: int) -> None:
            send(self._progress, done, total)

        def work():
            from realbench.runtime.profiler import profile_machine

            try:
                prof = profile_machine(req, progress)
                prof.save(out)
                send(self._profiled, prof, str(out), None)
            except Exception as e:
                send(self._profiled, None, str(out), str(e).splitlines()[0] if str(e) else type(e).__name__)

        self._thread = threading.Thread(target=work, daemon=True, name="realbench-profile")
        self._thread.start()
        return True

    def wait(self, timeout: Optional[float] = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _progress(self, done: int, total: int) -> None:
        self.progress.max, self.progress.value = total, done

    def _profiled(self, profile, path: str, error: Optional[str]) -> None:
        self.profile_button.disabled = False
        if error:
            self.status.value = f"<span style='color:#c00'>profiling failed: {html.escape(error)}</span>"
            return
        self.profile = profile
        self.progress.value = self.progress.max
        self._show_profile(f"measured and saved {path}")
