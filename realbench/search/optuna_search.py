"""Optuna samplers over the plan space.

Encodings:
  * TPE and random sample categories natively: per call, the mesh, then the strategy among
    those valid on a mesh of that size (a conditional, define-by-run parameter).
  * CMA-ES and GP do not model categorical parameters (Optuna's CMA-ES silently samples them at
    random), so they get five numbers in [0, 1] per call (SearchSpace.features) and the plan
    takes the nearest feasible option.
Each trial descends from its sampled plan by one-call moves to a local optimum (realbench.search.
descent) and reports the optimum's time: the sampler chooses where descents start and learns
from where they end. The baseline plans are enqueued as the first trials (warm starts).
Plans that do not fit in memory get a penalty value (twice the start plan's time, growing with
the overflow) so that every sampler sees an ordering; they are marked infeasible and never
returned as the best plan. With `multi_objective`, the study minimizes (time, peak memory)
with infeasible plans as constraint violations (Optuna's constraints_func), no descent (it
would pull every trial to the fastest plan), and the Pareto front is reported.
"""

from __future__ import annotations

import warnings
from typing import Optional

import numpy as np
import optuna

from realbench.errors import ConfigError
from realbench.search.record import open_study, plan_labels
from realbench.search.descent import descend, penalized
from realbench.search.events import Tracker
from realbench.search.settings import SamplerSettings
from realbench.search.space import FEATURES, SearchSpace

CATEGORICAL = ("tpe", "random")
NUMERIC = ("cmaes", "gp")
METHODS = CATEGORICAL + NUMERIC


def make_sampler(method: str, seed: int, multi_objective: bool, x0: Optional[dict] = None,
                 settings: SamplerSettings = SamplerSettings()) -> optuna.samplers.BaseSampler:
    startup = {} if settings.startup_trials is None else {"n_startup_trials": settings.startup_trials}
    if method == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=settings.multivariate and not multi_objective,
                                          **startup)
    if method == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if method == "cmaes":
        # start the search distribution at the start plan, not at the centre of the box
        return optuna.samplers.CmaEsSampler(seed=seed, x0=x0, sigma0=0.1 if x0 else None,
                                            warn_independent_sampling=False)
    if method == "gp":
        return optuna.samplers.GPSampler(seed=seed, **startup)
    raise ConfigError(f"unknown Optuna method {method!r} (known: {', '.join(METHODS)})")


class _Encoder:
    """Maps trials to plans (choices) and plans to enqueued parameters."""

    def __init__(self, space: SearchSpace, numeric: bool):
        self.space, self.numeric = space, numeric
        est = space.est
        G = est.cluster.gpus_per_node
        self.mesh_labels, self.by_mesh = [], []
        for i, cands in enumerate(space.pruned):
            groups: dict[str, dict[str, int]] = {}
            for k in cands:
                o = est.options[i][k]
                groups.setdefault(o.mesh.label(G), {})[o.strategy.label()] = int(k)
            self.mesh_labels.append(sorted(groups, key=lambda m: (len(groups[m]), m)))
            self.by_mesh.append(groups)

    def _name(self, i: int) -> str:
        return self.space.est.call_names[i]

    def suggest(self, trial: optuna.Trial) -> tuple[int, ...]:
        choice = []
        for i in range(self.space.n):
            name = self._name(i)
            if self.numeric:
                point = np.array([trial.suggest_float(f"{name}.{f}", 0.0, 1.0) for f in FEATURES])
                choice.append(self.space.nearest(i, point))
            else:
                mesh = trial.suggest_categorical(f"{name}.mesh", self.mesh_labels[i])
                strategies = self.by_mesh[i][mesh]
                size = self.space.est.options[i][next(iter(strategies.values()))].mesh.size
                # the strategy parameter is shared by all meshes of one size: same choices
                strategy = trial.suggest_categorical(f"{name}.strategy@{size}", sorted(strategies))
                choice.append(strategies[strategy])
        return tuple(choice)

    def params(self, choice) -> dict:
        est, G = self.space.est, self.space.est.cluster.gpus_per_node
        out = {}
        for i, k in enumerate(choice):
            name, o = self._name(i), est.options[i][int(k)]
            if self.numeric:
                pos = int(np.flatnonzero(self.space.pruned[i] == k)[0])
                out.update({f"{name}.{f}": float(v) for f, v in zip(FEATURES, self.space.features[i][pos])})
            else:
                out[f"{name}.mesh"] = o.mesh.label(G)
                out[f"{name}.strategy@{o.mesh.size}"] = o.strategy.label()
        return out


def optuna_search(space: SearchSpace, method: str, starts: list, tracker: Tracker, seed: int = 0,
                  storage: Optional[str] = None, study_name: Optional[str] = None,
                  multi_objective: bool = False, descent: bool = True,
                  settings: SamplerSettings = SamplerSettings(), worker: int = 0) -> list[dict]:
    """Runs the study until the tracker says stop; returns the Pareto front when multi-objective.
    `starts` (the baselines, best first) are the first trials; with `descent` (single objective)
    every trial descends from its sampled plan (realbench.search.descent)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if method not in METHODS:
        raise ConfigError(f"unknown Optuna method {method!r} (known: {', '.join(METHODS)})")
    if multi_objective and method == "cmaes":
        raise ConfigError("CMA-ES is single-objective; use tpe, random or gp for --multi-objective")
    encoder = _Encoder(space, numeric=method in NUMERIC)
    start = starts[0]
    start_t, _, start_ok = space.objective(np.asarray([start]))
    penalty_base = 2.0 * float(start_t[0]) if start_ok[0] else 1e6
    capacity = space.est.capacity

    polish = descent and not multi_objective

    def objective(trial: optuna.Trial):
        sampled = encoder.suggest(trial)
        if polish:
            choice = tuple(int(k) for k in descend(space, sampled, tracker, penalty_base)[0])
            trial.set_user_attr("sampled", list(sampled))
        else:
            choice = sampled
        t, mem, ok = space.objective(np.asarray([choice]))
        t, mem, ok = float(t[0]), float(mem[0]), bool(ok[0])
        if not polish:
            tracker.observe(np.asarray([choice]), np.array([t]), np.array([mem]), np.array([ok]))
        overflow = max(0.0, mem / capacity - 1.0)
        trial.set_user_attr("choice", list(choice))
        trial.set_user_attr("feasible", ok)
        trial.set_user_attr("time_per_iter_s", t)
        trial.set_user_attr("peak_mem_bytes", mem)
        trial.set_user_attr("overflow", overflow)
        trial.set_user_attr("method", method)
        trial.set_user_attr("seed", seed)
        trial.set_user_attr("worker", worker)
        trial.set_user_attr("kind", "trial")
        trial.set_user_attr("seconds", tracker.elapsed)
        trial.set_user_attr("plan", plan_labels(space, choice))
        if multi_objective:
            trial.set_constraint("memory_overflow", overflow)  # > 0: infeasible; samplers steer away
            return t, mem
        return float(penalized(space, np.array([t]), np.array([mem]), np.array([ok]), penalty_base)[0])

    def callback(study, trial):
        if tracker.should_stop():
            study.stop()

    try:
        with warnings.catch_warnings():  # CmaEsSampler's x0/sigma0 are deprecated but still the way to warm-start
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = make_sampler(method, seed, multi_objective, encoder.params(start) if method == "cmaes" else None,
                                   settings)
        directions = ["minimize", "minimize"] if multi_objective else ["minimize"]
        if storage:  # joined when it exists: a race, or processes sharing one study (realbench.search.record)
            study = open_study(storage, study_name, space.est.scenario.name, sampler, directions)
        else:
            study = optuna.create_study(sampler=sampler, directions=directions)
            study.set_user_attr("scenario", space.est.scenario.name)
    except (ValueError, ImportError, optuna.exceptions.OptunaError) as e:
        raise ConfigError(f"cannot open the study storage: {e}".splitlines()[0], "--storage") from None
    for plan in starts:  # warm starts: the baselines, each descending to its local optimum
        study.enqueue_trial(encoder.params(plan), skip_if_exists=True)
    remaining = max(1e-3, tracker.budget_s - tracker.elapsed)
    study.optimize(objective, timeout=remaining, callbacks=[callback], gc_after_trial=False,
                   catch=())
    if not multi_objective:
        return []
    front = []
    for t in study.best_trials:
        if t.user_attrs.get("feasible"):
            front.append({"time_per_iter_s": t.values[0], "peak_mem_bytes": t.values[1],
                          "choice": t.user_attrs["choice"]})
    return sorted(front, key=lambda r: r["time_per_iter_s"])


__all__ = ["optuna_search", "METHODS", "SamplerSettings"]
