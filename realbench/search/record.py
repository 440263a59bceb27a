"""Searches recorded in an Optuna study, so that one study holds a whole race.

Optuna's samplers write their own trials. MCMC and exhaustive search are not Optuna samplers:
`StudyRecorder` listens to their event stream (realbench.search.events) and adds a completed
trial for every improvement and, at most every `every_s` seconds, for a sample of the plan
being evaluated. Every trial, whatever wrote it, carries the user attributes `method`, `kind`
(trial, improvement, sample), `seconds`, `time_per_iter_s` and `plan` (placement labels per
call), so optuna-dashboard shows the race and `realbench` can read the plans back.

`open_study` opens a study, or creates it: several searches (methods of a race, or processes
sharing a journal file) then write to one study. A study made for another scenario is refused.
"""

from __future__ import annotations

import math
from typing import Optional

import optuna

from realbench.errors import ConfigError
from realbench.search.events import EventSink, SearchEvent


def open_study(storage: str, study_name: str, scenario_name: str, sampler=None, directions=("minimize",)):
    """The study `study_name` in `storage`, created if it does not exist (one line, exit 2, when
    the storage cannot be opened or the study belongs to another scenario)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        study = optuna.create_study(storage=storage, study_name=study_name, sampler=sampler,
                                    directions=list(directions), load_if_exists=True)
    except Exception as e:  # a bad URL, a missing driver, a locked or foreign file: one line, not a traceback
        raise ConfigError(f"cannot open the study storage: {e}".splitlines()[0], "--storage") from None
    other = study.user_attrs.get("scenario")
    if other is not None and other != scenario_name:
        raise ConfigError(f"study {study_name!r} holds plans of scenario {other!r}, not {scenario_name!r}; "
                          "pick another --study-name", "--study-name")
    if other is None:
        study.set_user_attr("scenario", scenario_name)
    return study


def plan_labels(space, choice) -> dict[str, str]:
    G = space.est.cluster.gpus_per_node
    return {n: o.label(G) for n, o in space.est.options_of(tuple(int(k) for k in choice)).items()}


class StudyRecorder:
    """An event sink that writes a search's improvements and periodic samples as trials."""

    def __init__(self, study, space, method: str, then: Optional[EventSink] = None, every_s: float = 1.0):
        self.study, self.space, self.method, self.then, self.every_s = study, space, method, then, every_s
        self.best, self.last_sample = math.inf, -math.inf
        self.recorded = 0

    def _add(self, kind: str, event: SearchEvent, choice, value: float) -> None:
        self.study.add_trial(optuna.trial.create_trial(
            value=value, params={}, distributions={},
            user_attrs={"method": self.method, "kind": kind, "seconds": event.seconds,
                        "evaluations": event.evaluations, "time_per_iter_s": value,
                        "choice": [int(k) for k in choice], "plan": plan_labels(self.space, choice)}))
        self.recorded += 1

    def __call__(self, event: SearchEvent) -> None:
        if event.best_choice is not None and event.best_time_s < self.best:
            self.best = event.best_time_s
            self._add("improvement", event, event.best_choice, event.best_time_s)
        elif (event.current_choice is not None and math.isfinite(event.current_time_s)
              and event.seconds - self.last_sample >= self.every_s):
            self.last_sample = event.seconds
            self._add("sample", event, event.current_choice, event.current_time_s)
        if self.then is not None:
            self.then(event)
