"""The `training:` settings practitioners set most, as a form: the dataflow editor and the run
monitor show it. Its values are checked by the same schema as a scenario file's (an error is
shown inline by the widget that applies them, the last valid settings stay)."""

from __future__ import annotations

import ipywidgets as w

from realbench.plan.training import TrainingSpec


class TrainingForm:
    def __init__(self):
        self.boxes = {
            "learning_rate": w.FloatText(description="learning rate"),
            "lr_scheduler_type": w.Dropdown(options=TrainingSpec.choices("lr_scheduler_type"), description="schedule"),
            "warmup_steps": w.BoundedIntText(min=0, max=10**9, description="warm-up"),
            "max_grad_norm": w.FloatText(description="clip norm"),
            "weight_decay": w.FloatText(description="weight decay"),
            "beta": w.FloatText(description="beta (KL)"),
            "epsilon": w.FloatText(description="epsilon"),
            "num_iterations": w.BoundedIntText(min=1, max=1000, description="iterations"),
            "old_logprobs": w.Dropdown(options=TrainingSpec.choices("old_logprobs"), description="old log-probs"),
            "loss_type": w.Dropdown(options=TrainingSpec.choices("loss_type"), description="loss type"),
            "temperature": w.FloatText(description="temperature"),
            "top_p": w.FloatText(description="top p"),
            "top_k": w.BoundedIntText(min=0, max=10**6, description="top k"),
        }
        keys = list(self.boxes)
        self.widget = w.VBox([w.HTML("<b>training</b>"),
                              w.HBox([w.VBox([self.boxes[k] for k in keys[:7]]),
                                      w.VBox([self.boxes[k] for k in keys[7:]])])])

    def show(self, spec: TrainingSpec, algorithm: str) -> None:
        """The boxes from a scenario's settings (beta and the loss type: the algorithm's when not set)."""
        for key, box in self.boxes.items():
            box.value = _value(spec, key, algorithm)

    def changes(self, spec: TrainingSpec, algorithm: str) -> dict:
        """The settings the boxes change, merged into the document's `training:` section."""
        out = spec.model_dump(exclude_unset=True)
        for key, box in self.boxes.items():
            if box.value != _value(spec, key, algorithm):
                out[key] = box.value
        return out


def _value(spec: TrainingSpec, key: str, algorithm: str):
    """A setting as the algorithm uses it (the ones whose default depends on the algorithm)."""
    if key == "beta":
        return spec.beta_for(algorithm)
    if key == "loss_type":
        return spec.loss_type_for(algorithm)
    return getattr(spec, key)
