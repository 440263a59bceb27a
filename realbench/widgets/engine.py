"""Engine configurations in the workbench: open a verl config, an OpenRLHF launch script or an
AReaL experiment YAML (as
`realbench import` reads it: the scenario and the plan the engine runs), and write the plan
shown back as the engine's configuration (as `realbench export --format ENGINE` writes it).
Errors are shown inline, in the CLI's words."""

from __future__ import annotations

import html
import shlex
from pathlib import Path
from typing import Callable, Optional

import ipywidgets as w

from realbench.errors import ConfigError
from realbench.plan.mesh import Option
from realbench.plan.scenario import Scenario


class EngineConfig:
    def __init__(self):
        from realbench.engines import ENGINES

        self.engine_box = w.Dropdown(options=list(ENGINES), value="verl", description="engine")
        self.file_box = w.Text(description="config", placeholder="my_job.yaml (verl, areal), or train_ppo.sh (openrlhf)")
        self.overrides_box = w.Text(description="overrides", placeholder="key=value ... (as on `realbench import`)")
        self.gpus_box = w.IntText(value=8, description="GPUs/node", tooltip="openrlhf: GPUs per node")
        self.images_box = w.Text(description="image tokens", placeholder="a vision-language job's, a prompt",
                                 tooltip="the tokens a prompt's images take (import's --image-tokens)")
        self.out_box = w.Text(value="plans", description="folder", tooltip="where the scenario and plan are written")
        self.overwrite_box = w.Checkbox(description="overwrite", value=False)
        self.open_button = w.Button(description="Open", icon="folder-open",
                                    tooltip="read the configuration into the dataflow editor and the plan viewer")
        self.export_box = w.Text(description="write to", placeholder="verl/my_job.yaml, openrlhf/run.sh or areal/my_job.yaml")
        self.export_button = w.Button(description="Write config", icon="save",
                                      tooltip="the plan shown, as the engine's configuration")
        self.status = w.HTML()
        # opened (scenario, options, name): the workbench puts them in the editor and the viewer
        self.listeners: list[Callable[[Scenario, dict[str, Option], str], None]] = []
        self.shown: Optional[tuple[Scenario, dict[str, Option]]] = None  # what `Write config` writes
        self.open_button.on_click(lambda _: self.open())
        self.export_button.on_click(lambda _: self.write())
        self.widget = w.VBox([w.HBox([self.engine_box, self.file_box]), self.overrides_box,
                              w.HBox([self.gpus_box, self.images_box]), w.HBox([self.out_box, self.overwrite_box]),
                              self.open_button,
                              w.HBox([self.export_box, self.export_button]), self.status])

    def _error(self, e: ConfigError) -> bool:
        self.status.value = f"<span style='color:#c00'>{html.escape(str(e))}</span>"
        return False

    def open(self) -> bool:
        """Import the configuration (writing <folder>/<name>.yaml and -plan.yaml) and hand the
        scenario and plan to the listeners."""
        from realbench.engines import engine_module, import_config, unread_settings
        from realbench.plan import load_plan

        engine, path = self.engine_box.value, self.file_box.value.strip()
        try:
            if not path:
                raise ConfigError("give the engine's configuration file", "config")
            overrides = shlex.split(self.overrides_box.value)
            gpus = self.gpus_box.value if engine_module(engine).takes_node_size else None
            if gpus is not None and gpus < 1:
                raise ConfigError(f"{gpus}: a node has at least one GPU", "GPUs/node")
            images = self.images_box.value.strip()
            if images and (not images.isdigit()):
                raise ConfigError(f"{images!r}: a whole number of tokens (empty: a language model's job)", "image tokens")
            _, plan_path = import_config(engine, path, overrides, self.out_box.value.strip() or ".",
                                         overwrite=self.overwrite_box.value, gpus_per_node=gpus,
                                         image_tokens=int(images) if images else None)
            _, scenario, options = load_plan(str(plan_path))
            unread = unread_settings(engine, path, overrides)
        except ConfigError as e:
            return self._error(e)
        self.shown = (scenario, options)
        name = f"{engine} configuration {Path(path).name}"
        for listener in self.listeners:
            listener(scenario, options, name)
        self.status.value = f"opened {html.escape(path)}: wrote {html.escape(str(plan_path))}" + "".join(
            f"<br>not read by {engine}: {html.escape(u)}" for u in unread)
        return True

    def show(self, scenario: Scenario, options, method: str = "") -> None:
        """A SearchDashboard listener: the best plan found is what `Write config` writes."""
        self.shown = (scenario, dict(options))

    def write(self) -> bool:
        from realbench.engines import export_config

        try:
            if self.shown is None:
                raise ConfigError("open a configuration or search a plan first", "write to")
            if not self.export_box.value.strip():
                raise ConfigError("give the file to write", "write to")
            written = export_config(self.engine_box.value, *self.shown, self.export_box.value.strip(), {},
                                    overwrite=self.overwrite_box.value)
        except ConfigError as e:
            return self._error(e)
        self.status.value = "wrote " + ", ".join(html.escape(str(p)) for p in written)
        return True
