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

import numpy as np
import optuna

from realbench.errors import ConfigError
from realbench.search.events import EventSink, SearchEvent


def storage_of(storage: str):
    """Optuna's storage for `--storage`: a database URL (`sqlite:///plans.db`, `mysql://...`), or
    the path of a journal file (Optuna's JournalFileBackend: the storage Optuna recommends for
    processes sharing a study over a network file system)."""
    if "://" in storage:
        return storage
    if ":" in storage.split("/")[0] and not storage.startswith("."):  # "sqlite:plans.db" is a typo, not a file name
        raise ConfigError(f"{storage!r} is neither a database URL (sqlite:///plans.db) nor a journal file path",
                          "--storage")
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(storage))


def open_study(storage: str, study_name: str, scenario_name: str, sampler=None, directions=("minimize",)):
    """The study `study_name` in `storage` (see storage_of), created if it does not exist (one
    line, exit 2, when the storage cannot be opened or the study belongs to another scenario)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        study = optuna.create_study(storage=storage_of(storage), study_name=study_name, sampler=sampler,
                                    directions=list(directions), load_if_exists=True)
    except ConfigError:
        raise
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

    def __init__(self, study, space, method: str, then: Optional[EventSink] = None, every_s: float = 1.0,
                 seed: int = 0, worker: int = 0):
        self.study, self.space, self.method, self.then, self.every_s = study, space, method, then, every_s
        self.seed, self.worker = seed, worker
        self.best, self.last_sample = math.inf, -math.inf
        self.recorded = 0

    def _add(self, kind: str, event: SearchEvent, choice, value: float) -> None:
        self.study.add_trial(optuna.trial.create_trial(
            value=value, params={}, distributions={},
            user_attrs={"method": self.method, "seed": self.seed, "worker": self.worker, "kind": kind, "seconds": event.seconds,
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


def best_in_study(study, space, method: str) -> Optional[tuple[tuple[int, ...], float, float]]:
    """The fastest plan that fits among the trials `method` wrote to `study`, in any process:
    (choice, time, peak memory), or None. Other methods' trials are left out, so that each runner
    of a race in one study reports its own best. Plans are re-estimated here, not trusted from the trials, and a trial
    whose placement labels differ from what its option indices mean here (written under another
    profile or cluster) is skipped."""
    rows = {}
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if trial.user_attrs.get("method") != method:
            continue
        choice, plan = trial.user_attrs.get("choice"), trial.user_attrs.get("plan")
        if not isinstance(choice, list) or len(choice) != space.n or tuple(choice) in rows:
            continue
        if not all(isinstance(k, int) and 0 <= k < len(opts) for k, opts in zip(choice, space.est.options)):
            continue
        if plan != plan_labels(space, choice):
            continue
        rows[tuple(choice)] = None
    if not rows:
        return None
    choices = np.array(list(rows), dtype=np.int64)
    times, mems, ok = space.objective(choices)
    if not ok.any():
        return None
    k = int(np.argmin(np.where(ok, times, np.inf)))
    return tuple(int(x) for x in choices[k]), float(times[k]), float(mems[k])
