"""Dataflow editor: start from an algorithm of the library (or a scenario file), add and remove
calls, set how the models train (`training:`), see the graph drawn, with invalid input shown
inline, and save or load the scenario file.

The edited scenario is kept as a document (the scenario file's content); every change is
validated with the same code as `realbench validate`, and the last valid scenario stays
available as `.scenario` while the inline message says what is wrong with the new one."""

from __future__ import annotations

import copy
import html
from typing import Callable, Optional

import ipywidgets as w
from jupyter_bokeh import BokehModel

from realbench.errors import ConfigError
from realbench.plan.scenario import Scenario
from realbench.report.figures import dataflow_figure
from realbench.widgets.search import ensure_bokehjs
from realbench.widgets.training import TrainingForm

KINDS = ("generate", "inference", "train")


def _keys(text: str) -> list[str]:
    return [k.strip() for k in text.replace(";", ",").split(",") if k.strip()]


class DataflowEditor:
    def __init__(self, scenario: str = "ppo-tiny-cpu"):
        ensure_bokehjs()
        from realbench.plan.builtin import BUILTIN

        self.start_box = w.Dropdown(options=list(BUILTIN), value=scenario, description="start from")
        self.name_box = w.Text(description="call")
        self.model_box = w.Text(description="model", placeholder="a role of the scenario, e.g. actor")
        self.kind_box = w.Dropdown(options=KINDS, value="inference", description="kind")
        self.inputs_box = w.Text(description="inputs", placeholder="keys, comma separated")
        self.outputs_box = w.Text(description="outputs", placeholder="keys, comma separated")
        self.seqs_box = w.IntText(value=8, description="sequences")
        self.len_box = w.IntText(value=16, description="seq length")
        self.gen_box = w.IntText(value=0, description="gen length")
        self.add_button = w.Button(description="Add call", icon="plus")
        self.remove_box = w.Dropdown(description="remove")
        self.remove_button = w.Button(description="Remove call", icon="minus")
        self.path_box = w.Text(description="file", placeholder="my-scenario.yaml")
        self.overwrite_box = w.Checkbox(description="overwrite", value=False)
        self.save_button = w.Button(description="Save", icon="save")
        self.load_button = w.Button(description="Load", icon="folder-open")
        self.training = TrainingForm()
        self.apply_button = w.Button(description="Apply settings", icon="check")
        self.status = w.HTML()
        self.graph = w.VBox([])
        self.listeners: list[Callable[[Scenario], None]] = []
        self.document: dict = {}
        self.scenario: Optional[Scenario] = None
        self.start_box.observe(lambda ch: self.load_builtin(ch["new"]), names="value")
        self.add_button.on_click(lambda _: self.add_call())
        self.remove_button.on_click(lambda _: self.remove_call(self.remove_box.value))
        self.save_button.on_click(lambda _: self.save())
        self.load_button.on_click(lambda _: self.load())
        self.apply_button.on_click(lambda _: self.apply_training())
        form = w.VBox([self.name_box, self.model_box, self.kind_box, self.inputs_box, self.outputs_box,
                       self.seqs_box, self.len_box, self.gen_box, self.add_button])
        self.widget = w.VBox([self.start_box, w.HBox([form, w.VBox([self.remove_box, self.remove_button,
                                                                    self.path_box, self.overwrite_box,
                                                                    w.HBox([self.save_button, self.load_button])])]),
                              self.training.widget, self.apply_button, self.status, self.graph])
        self.load_builtin(scenario)

    # -- the document ----------------------------------------------------------------------------------------
    def load_builtin(self, name: str) -> None:
        from realbench.plan.builtin import get_builtin

        self._apply(get_builtin(name).to_document(), f"loaded {name}")

    def _apply(self, document: dict, message: str) -> bool:
        """Validate a new document; keep it only if valid. The message (or the error) goes inline."""
        from realbench.plan.scenario import scenario_from_document

        try:
            scenario = scenario_from_document(document)
        except ConfigError as e:
            self.status.value = f"<span style='color:#c00'>{html.escape(str(e))}</span>"
            return False
        self.document, self.scenario = document, scenario
        self.training.show(scenario.training, scenario.algorithm)
        self.remove_box.options = list(scenario.dataflow.call_names)
        self.graph.children = [BokehModel(dataflow_figure(scenario))]
        self.status.value = (f"{html.escape(message)}: {len(scenario.dataflow.calls)} calls, "
                             f"plan space 10^{scenario.summary()['plan_space_log10']}")
        for listener in self.listeners:
            listener(scenario)
        return True

    def _explicit(self) -> dict:
        """The document with the dataflow as an explicit list of calls (editable)."""
        doc = copy.deepcopy(self.document)
        doc["dataflow"] = {"calls": [c.model_dump(mode="json") for c in self.scenario.dataflow.calls]}
        doc["algorithm"] = "custom"
        return doc

    def add_call(self) -> bool:
        call = {"name": self.name_box.value.strip(), "model": self.model_box.value.strip(),
                "kind": self.kind_box.value, "inputs": _keys(self.inputs_box.value),
                "outputs": _keys(self.outputs_box.value), "seqs": self.seqs_box.value,
                "seq_len": self.len_box.value}
        if self.gen_box.value:
            call["gen_len"] = self.gen_box.value
        doc = self._explicit()
        doc["dataflow"]["calls"].append(call)
        return self._apply(doc, f"added {call['name'] or 'a call'}")

    def apply_training(self) -> bool:
        """The settings of the training form into the scenario (checked like a file's)."""
        doc = copy.deepcopy(self.document)
        doc["training"] = self.training.changes(self.scenario.training, self.scenario.algorithm)
        return self._apply(doc, "training settings applied")

    def remove_call(self, name: str) -> bool:
        doc = self._explicit()
        doc["dataflow"]["calls"] = [c for c in doc["dataflow"]["calls"] if c["name"] != name]
        used = {c["model"] for c in doc["dataflow"]["calls"]}
        doc["models"] = {k: v for k, v in doc["models"].items() if k in used}  # a model no call runs is an error
        return self._apply(doc, f"removed {name}")

    def save(self) -> bool:
        from realbench.schema import write_document

        try:
            if not self.path_box.value.strip():
                raise ConfigError("give a file name (.yaml or .json)", "file")
            write_document(self.document, self.path_box.value.strip(), overwrite=self.overwrite_box.value)
        except ConfigError as e:
            self.status.value = f"<span style='color:#c00'>{html.escape(str(e))}</span>"
            return False
        self.status.value = f"saved {html.escape(self.path_box.value.strip())}"
        return True

    def load(self) -> bool:
        from realbench.schema import read_document

        try:
            doc = read_document(self.path_box.value.strip())
        except ConfigError as e:
            self.status.value = f"<span style='color:#c00'>{html.escape(str(e))}</span>"
            return False
        return self._apply(doc, f"loaded {self.path_box.value.strip()}")
